//! Benchmarks' set-up (not their figures, which depend on the machine): the ablation's rows
//! are the intended configurations, and its flags are checked with messages that say what to do.

use clap::Parser;
use dptrain::bench::ablation::{
    single_worker_options, stage_options, stages, AblationArgs, AblationSpec,
};
use dptrain::comm::CommMode;
use dptrain::config::CommChoice;
use dptrain::parallel::BucketOp;
use std::path::Path;

/// `dptrain bench ablation` flags as the command line parses them (defaults included).
#[derive(Parser)]
struct AblationCli {
    #[command(flatten)]
    args: AblationArgs,
}

fn args(flags: &[&str]) -> AblationArgs {
    let argv = std::iter::once("ablation").chain(flags.iter().copied());
    AblationCli::try_parse_from(argv).expect("flags parse").args
}

#[test]
fn ablation_rows_add_one_optimisation_each() {
    let rows = stages(2, 1);
    assert_eq!(rows.len(), 5);
    let base = &rows[0].settings;
    assert_eq!(base.comm, "tree");
    assert!(!base.overlap);
    assert_eq!(base.prefetch, 0);
    for pair in rows.windows(2) {
        let changed = pair[1].settings.differences(&pair[0].settings);
        assert_eq!(
            changed.len(),
            1,
            "{:?} -> {:?} changes {changed:?}",
            pair[0],
            pair[1]
        );
    }
    let changed: Vec<_> = rows
        .windows(2)
        .map(|p| p[1].settings.differences(&p[0].settings)[0])
        .collect();
    assert_eq!(changed, ["overlap", "comm", "comm", "prefetch"]);
    assert_eq!(rows[2].settings.comm, "redundant");
    assert_eq!(rows[3].settings.comm, "auto");
    assert_eq!(rows[4].settings.prefetch, 2);
}

#[test]
fn ablation_baseline_trains_with_root_update_overlap_off_and_loading_in_the_step() {
    let spec = AblationSpec::from_args(&args(&[])).unwrap();
    let rows = stages(spec.prefetch, spec.loader_threads);
    let dirs = (Path::new("/tmp/images"), Path::new("/tmp/run"));
    let cfg = stage_options(&spec, &rows[0].settings, dirs.0, dirs.1)
        .resolve()
        .unwrap();
    assert_eq!(cfg.comm, CommChoice::Fixed(CommMode::Tree));
    assert!(!cfg.overlap);
    assert_eq!(cfg.prefetch, 0);
    assert_eq!(cfg.workers, 2);
    assert_eq!(cfg.dataset, "imagefolder");
    assert!(cfg.link.is_some(), "the default ablation emulates a link");
    // Tree mode is Caffe's scheme: every bucket is reduced to worker 0, which updates and
    // broadcasts the weights.
    let graph =
        std::sync::Arc::new(dptrain::train::build_graph("lenet5", [1, 28, 28], 10).unwrap());
    let net = dptrain::nn::Net::new(
        graph,
        dptrain::nn::NetConfig {
            max_batch: 1,
            seed: 1,
        },
    )
    .unwrap();
    let planning = cfg.plan_inputs();
    let plan = planning.bucket_plan(&dptrain::plan::block_lens(&net));
    let ops = planning.bucket_ops(&plan);
    assert!(!ops.is_empty());
    assert!(ops.iter().all(|op| *op == BucketOp::ReduceToRoot));

    let last = stage_options(&spec, &rows[4].settings, dirs.0, dirs.1)
        .resolve()
        .unwrap();
    assert_eq!(last.comm, CommChoice::Auto);
    assert!(last.overlap);
    assert_eq!(last.prefetch, spec.prefetch);
    assert_eq!(last.loader_threads, spec.loader_threads);

    // Weak scaling: the 1-worker reference keeps the per-worker batch.
    let single = single_worker_options(&spec, dirs.0, dirs.1)
        .resolve()
        .unwrap();
    assert_eq!(single.workers, 1);
    assert_eq!(single.batch, spec.batch / spec.workers);
    assert!(single.prefetch > 0);
}

#[test]
fn ablation_flags_are_checked_with_messages_that_say_what_to_do() {
    let err = |flags: &[&str]| AblationSpec::from_args(&args(flags)).unwrap_err();
    assert!(err(&["--model", "alexnet2"]).contains("lenet5, vgg-small, resnet20"));
    assert!(err(&["--workers", "0"]).contains("at least 2 workers"));
    assert!(err(&["--workers", "3"]).contains("multiple of --workers"));
    assert!(err(&["--link-bandwidth", "fast"]).contains("--link-bandwidth"));
    assert!(err(&["--sim-workers", "8,0"]).contains("--sim-workers"));
    assert!(err(&["--augment", "rotate"]).contains("--augment"));
    assert!(err(&["--prefetch", "0"]).contains("preloading row"));
    let none = AblationSpec::from_args(&args(&["--link-bandwidth", "none"])).unwrap();
    assert!(none.link.is_none());
}

#[test]
fn suite_quick_writes_every_section_and_plot() {
    use dptrain::bench::suite::{PLOTS, REPORT_FILE, SECTIONS};
    let out = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(["bench", "suite", "--quick", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "suite failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("total wall time"), "{stdout}");
    let page = std::fs::read_to_string(out.path().join(REPORT_FILE)).unwrap();
    for title in SECTIONS {
        assert!(
            page.contains(&format!("\n## {title}\n")),
            "no section {title:?} in\n{page}"
        );
    }
    assert_eq!(
        page.matches("Re-run just this: `dptrain ").count(),
        SECTIONS.len()
    );
    assert!(!page.contains("This section failed"), "{page}");
    for plot in PLOTS {
        let bytes = std::fs::read(out.path().join(plot)).unwrap_or_default();
        assert!(bytes.starts_with(b"\x89PNG"), "{plot} is not a PNG");
        assert!(
            page.contains(&format!("]({plot})")),
            "{plot} is not shown in the page"
        );
    }
    for file in ["ablation.md", "ablation.json"] {
        assert!(out.path().join(file).is_file(), "{file} missing");
    }
}

fn dptrain(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bench_sizes_and_thread_counts_that_mean_nothing_are_refused_or_said() {
    // A step on no threads: refused, not run and printed as threads=0.
    let (code, out, err) = dptrain(&["bench", "step", "--model", "lenet5", "--threads", "0"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("--threads 0") && !out.contains("threads=0"),
        "{err}"
    );
    // Threads past the cores are measured, with a warning.
    let many = (dptrain::limits::cores() + 1).to_string();
    let (code, out, err) = dptrain(&[
        "bench",
        "step",
        "--model",
        "lenet5",
        "--batch",
        "8",
        "--steps",
        "1",
        "--threads",
        &many,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("warning: --threads {many} is more than")),
        "{err}"
    );
    assert!(out.contains(&format!("threads={many}")), "{out}");
    // An all-reduce of less than one f32: refused, not reported as bandwidth of zero floats.
    let (code, out, err) = dptrain(&["bench", "allreduce", "--sizes", "1", "--iters", "1"]);
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("1 bytes is less than one f32"), "{err}");
    // Not a whole number of f32s: rounded down, and said.
    let (code, out, err) = dptrain(&[
        "bench",
        "allreduce",
        "--sizes",
        "6",
        "--iters",
        "1",
        "--comm",
        "ring",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("measuring 4 bytes"), "{err}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("4 ")),
        "{out}"
    );
    // Sizes no machine holds: refused before allocating.
    let (code, _, err) = dptrain(&["bench", "allreduce", "--sizes", "1000000G", "--iters", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("needs about"), "{err}");
}

#[test]
fn bench_counts_past_any_measurement_are_refused_naming_the_flag() {
    let max = u64::MAX.to_string();
    for (command, flag) in [
        (&["bench", "step", "--model", "lenet5"][..], "--steps"),
        (&["bench", "infer", "--model", "lenet5"][..], "--steps"),
        (
            &["bench", "allreduce", "--sizes", "4K", "--comm", "ring"][..],
            "--iters",
        ),
        (&["bench", "data", "--batches", "5"][..], "--steps"),
        (&["bench", "data", "--steps", "5"][..], "--batches"),
        (&["bench", "overlap"][..], "--steps"),
        (&["bench", "sim-check"][..], "--steps"),
        (&["bench", "loader", "--packed", "none.pack"][..], "--reps"),
    ] {
        for value in ["0", max.as_str()] {
            let mut args = command.to_vec();
            args.extend([flag, value]);
            let (code, out, err) = dptrain(&args);
            assert_eq!(code, 1, "{args:?}: {out}{err}");
            assert!(
                err.contains(&format!("{flag} {value}: give a count from 1 to")),
                "{args:?}: {err}"
            );
            assert!(out.is_empty(), "{args:?}: printed before refusing: {out}");
        }
    }
    // The roofline's all-core figures: 1 to the cores this process may use.
    let past = (dptrain::limits::cores() + 1).to_string();
    for cores in ["0", past.as_str()] {
        let (code, out, err) = dptrain(&["bench", "roofline", "--cores", cores]);
        assert_eq!(code, 1, "{out}");
        assert!(
            err.contains(&format!("--cores {cores}: the all-core")),
            "{err}"
        );
    }
}

#[test]
fn bench_compress_prints_each_format_and_size_and_refuses_a_size_of_nothing() {
    let (code, out, err) = dptrain(&["bench", "compress", "--sizes-kb", "4,64"]);
    assert_eq!(code, 0, "{err}");
    for format in ["fp16", "bf16"] {
        for kb in [4, 64] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("RESULT compress {format} size_kb={kb} ")))
                .unwrap_or_else(|| panic!("no {format} {kb} KiB line in {out}"));
            // Every figure is a positive time per value.
            for field in ["encode_ns=", "decode_ns=", "round_ns="] {
                let v: f64 = line
                    .split(field)
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{field} in {line}"));
                assert!(v > 0.0 && v.is_finite(), "{line}");
            }
        }
    }
    // PowerSGD: a positive compute per value, and fewer values sent at rank 1 than at 4.
    let field = |rank: usize, kb: usize, name: &str| -> f64 {
        let prefix = format!("RESULT compress powersgd:{rank} size_kb={kb} ");
        let line = out
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in {out}"));
        line.split(name)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {line}"))
    };
    for rank in [1, 2, 4] {
        // The three phases are positive and make up the whole.
        let phases: f64 = ["before_ns=", "between_ns=", "after_ns="]
            .iter()
            .map(|p| {
                let v = field(rank, 64, p);
                assert!(v > 0.0 && v.is_finite(), "{p} {v}");
                v
            })
            .sum();
        let whole = field(rank, 64, "compute_ns=");
        assert!((phases - whole).abs() < 3e-3, "{phases} against {whole}");
    }
    // 64 KiB: a 128 x 128 matrix; rank r sends 256 r of its 16384 values.
    assert!((field(1, 64, "sent_fraction=") - 256.0 / 16384.0).abs() < 1e-4);
    assert!((field(4, 64, "sent_fraction=") - 1024.0 / 16384.0).abs() < 1e-4);
    let (code, _, err) = dptrain(&["bench", "compress", "--sizes-kb", "0"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--sizes-kb") && err.contains("from 1 to"),
        "{err}"
    );
}
