//! Seeing where the time goes: the timeline (`--trace`), the run report and its plots, the
//! comparison of runs, and `--log-format json`.

use dptrain::config::{TrainConfig, TrainOptions};
use dptrain::train::train;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// The tests here run one at a time: the overlap check measures when communication threads
/// get a core, and on a 2-core machine a second training run in parallel would take it.
static SERIAL: Mutex<()> = Mutex::new(());

fn config(dir: &Path, f: impl FnOnce(&mut TrainOptions)) -> TrainConfig {
    let mut o = TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(1),
        batch: Some(16),
        lr_schedule: Some("constant".into()),
        warmup_steps: Some(0),
        train_limit: Some(160), // 10 steps of 16
        test_limit: Some(32),
        threads: Some(1),
        comm_timeout: Some(30.0),
        run_dir: Some(dir.to_path_buf()),
        no_checkpoints: true,
        quiet: true,
        ..Default::default()
    };
    f(&mut o);
    o.resolve().unwrap()
}

/// A complete span: track, name, start and end (microseconds), arguments.
struct Span {
    tid: u64,
    name: String,
    ts: u64,
    end: u64,
    args: Value,
}

/// The spans of a trace file and the name of each track.
fn read_trace(path: &Path) -> (Vec<Span>, HashMap<u64, String>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let events = v["traceEvents"]
        .as_array()
        .expect("object form with traceEvents");
    let mut names = HashMap::new();
    let mut spans = Vec::new();
    for e in events {
        let tid = e["tid"].as_u64().unwrap();
        match e["ph"].as_str().unwrap() {
            "M" if e["name"] == "thread_name" => {
                names.insert(tid, e["args"]["name"].as_str().unwrap().to_string());
            }
            "X" => {
                let ts = e["ts"].as_u64().unwrap();
                spans.push(Span {
                    tid,
                    name: e["name"].as_str().unwrap().to_string(),
                    ts,
                    end: ts + e["dur"].as_u64().unwrap(),
                    args: e["args"].clone(),
                });
            }
            _ => {}
        }
    }
    (spans, names)
}

/// Spans on one track must nest: two spans either are disjoint or one contains the other.
fn check_nesting(spans: &[Span]) {
    let mut by_tid: HashMap<u64, Vec<&Span>> = HashMap::new();
    for s in spans {
        by_tid.entry(s.tid).or_default().push(s);
    }
    for (tid, mut list) in by_tid {
        list.sort_by_key(|s| (s.ts, std::cmp::Reverse(s.end)));
        let mut open: Vec<&Span> = Vec::new();
        for s in list {
            while open.last().is_some_and(|top| top.end <= s.ts) {
                open.pop();
            }
            if let Some(top) = open.last() {
                assert!(
                    s.end <= top.end,
                    "track {tid}: '{}' [{}, {}] partly overlaps '{}' [{}, {}]",
                    s.name,
                    s.ts,
                    s.end,
                    top.name,
                    top.ts,
                    top.end
                );
            }
            open.push(s);
        }
    }
}

/// For each reduction, how far its start lies before the end of its step's backward on the
/// same worker (positive: it started while backward was still running).
fn reduction_leads(spans: &[Span], names: &HashMap<u64, String>) -> Vec<i64> {
    let mut backward_end = HashMap::new();
    for s in spans.iter().filter(|s| s.name == "backward") {
        let rank: usize = names[&s.tid]
            .strip_prefix("worker ")
            .unwrap()
            .parse()
            .unwrap();
        backward_end.insert((rank, s.args["global_step"].as_u64().unwrap()), s.end);
    }
    spans
        .iter()
        .filter(|s| s.name.starts_with("reduce bucket"))
        .map(|s| {
            let rank: usize = names[&s.tid]
                .strip_prefix("comm ")
                .unwrap()
                .parse()
                .unwrap();
            let end = backward_end[&(rank, s.args["global_step"].as_u64().unwrap())];
            end as i64 - s.ts as i64
        })
        .collect()
}

/// A 2-worker ring run in `dir`, batch 64 (32 samples per worker: a backward of a few ms) for
/// 10 steps, set as `f` says, with steps 2..8 traced: the trace's spans (checked to nest) and
/// track names.
fn traced_two_workers(
    dir: &Path,
    f: impl FnOnce(&mut TrainOptions),
) -> (Vec<Span>, HashMap<u64, String>) {
    let trace = dir.join("trace.json");
    train(config(dir, |o| {
        o.workers = Some(2);
        o.comm = Some("ring".into());
        o.trace = Some(trace.clone());
        o.trace_steps = Some("2..8".into());
        o.batch = Some(64);
        o.train_limit = Some(640);
        f(o);
    }))
    .unwrap();
    let (spans, names) = read_trace(&trace);
    check_nesting(&spans);
    (spans, names)
}

/// A 2-worker traced run of steps 2..8 with overlap `on`/`off` in `dir`; checks the trace's
/// structure and returns how many reductions started before their step's backward ended.
fn traced_run(dir: &Path, overlap: &str) -> usize {
    let (spans, names) = traced_two_workers(dir, |o| {
        o.overlap = Some(overlap.into());
        // One block per bucket, so the last blocks' gradients leave early in backward, and a
        // slow emulated link, so each reduction takes real time.
        o.bucket_kb = Some(0.into());
        o.first_bucket_kb = Some(0.into());
        o.link_bandwidth = Some("200Mbit".into());
    });

    let mut tracks: Vec<_> = names.values().cloned().collect();
    tracks.sort();
    assert_eq!(tracks, ["comm 0", "comm 1", "worker 0", "worker 1"]);
    for s in &spans {
        let track = &names[&s.tid];
        if s.name.starts_with("reduce bucket") {
            assert!(track.starts_with("comm "), "reduction on {track}");
            assert!(s.args["bytes"].as_u64().unwrap() > 0);
            assert_eq!(s.args["mode"], "ring");
            assert!(s.args["bucket"].is_u64());
            // The communication thread's CPU time in the collective: its work, never more
            // than the span's wall time (microseconds; 1 us for the trace's rounding).
            let cpu = s.args["cpu_us"].as_f64().unwrap();
            assert!(
                cpu >= 0.0 && cpu <= (s.end - s.ts) as f64 + 1.0,
                "cpu {cpu} us"
            );
        } else {
            assert!(track.starts_with("worker "), "'{}' on {track}", s.name);
        }
    }
    // Only the window's steps, every phase of each.
    for rank in 0..2 {
        let tid = *names
            .iter()
            .find(|(_, n)| **n == format!("worker {rank}"))
            .unwrap()
            .0;
        let mut steps: Vec<u64> = spans
            .iter()
            .filter(|s| s.tid == tid && s.name.starts_with("step "))
            .map(|s| s.args["global_step"].as_u64().unwrap())
            .collect();
        steps.sort();
        assert_eq!(steps, [2, 3, 4, 5, 6, 7], "worker {rank}");
        for phase in ["data wait", "forward", "backward", "exposed comm", "update"] {
            let n = spans
                .iter()
                .filter(|s| s.tid == tid && s.name == phase)
                .count();
            assert_eq!(n, 6, "worker {rank}: {phase}");
        }
        // Every layer (a fused activation with its layer) is timed forward and backward,
        // under its name: lenet5 runs 9 (c1+relu, pool, c2+relu, pool, flatten, f1+relu,
        // f2+relu, f3, the loss), all of them in backward too, where c2 has a second span
        // for its input gradient, computed after its block is handed over.
        for (pass, per_step) in [("forward ", 9), ("backward ", 10)] {
            let layers = spans
                .iter()
                .filter(|s| s.tid == tid && s.name.starts_with(pass))
                .count();
            assert_eq!(layers, 6 * per_step, "worker {rank}: {pass}layers");
            assert!(spans
                .iter()
                .any(|s| s.tid == tid && s.name == format!("{pass}c1")));
        }
        let c2_input = spans
            .iter()
            .filter(|s| s.tid == tid && s.name == "backward c2 input gradient")
            .count();
        assert_eq!(c2_input, 6, "worker {rank}");
    }
    let leads = reduction_leads(&spans, &names);
    assert_eq!(
        leads.len(),
        2 * 6 * 5,
        "one reduction per bucket, step, worker"
    );
    leads.iter().filter(|&&l| l > 0).count()
}

#[test]
fn a_two_worker_trace_nests_and_shows_overlap_only_when_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    // Without overlap, buckets leave only after backward: never early, whatever the timing.
    assert_eq!(traced_run(&tmp.path().join("off"), "off"), 0);
    // With overlap, a reduction starts as soon as its communication thread gets a core. On a
    // 2-core machine with two computing workers that may wait past a short backward, so one
    // run may by chance show none; three in a row would mean overlap is broken.
    let early: Vec<usize> = (0..3)
        .map(|i| traced_run(&tmp.path().join(format!("on-{i}")), "on"))
        .take_while(|&n| n == 0)
        .collect();
    assert!(
        early.len() < 3,
        "overlap on: no reduction started before backward ended, in 3 runs"
    );
}

fn png_size(path: &Path) -> (u32, u32) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (img.width(), img.height())
}

#[test]
fn runs_get_a_report_with_real_plots_and_runs_compare_side_by_side() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let runs: Vec<_> = ["one", "two"]
        .iter()
        .map(|name| {
            let dir = tmp.path().join(name);
            train(config(&dir, |o| {
                o.epochs = Some(2);
                o.workers = Some(if *name == "one" { 1 } else { 2 });
            }))
            .unwrap();
            // The library leaves the report to its caller (the CLI draws it after a run).
            dptrain::report::write_run_report(&dir).unwrap();
            dir
        })
        .collect();
    for dir in &runs {
        let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
        for section in [
            "## Results",
            "## Step breakdown",
            "exposed comm",
            "## Configuration",
        ] {
            assert!(report.contains(section), "report.md lacks '{section}'");
        }
        for fig in ["loss.png", "accuracy.png", "breakdown.png"] {
            assert!(
                report.contains(&format!("]({fig})")),
                "report.md does not show {fig}"
            );
            assert_eq!(png_size(&dir.join(fig)), dptrain::report::plot::SIZE);
        }
    }
    // `dptrain report` regenerates from the files alone.
    std::fs::remove_file(runs[0].join("loss.png")).unwrap();
    let figures = dptrain::report::write_run_report(&runs[0]).unwrap();
    assert_eq!(figures.len(), 3);
    assert_eq!(
        png_size(&runs[0].join("loss.png")),
        dptrain::report::plot::SIZE
    );
    let out = tmp.path().join("comparison");
    let read = |dirs: &[std::path::PathBuf]| -> Vec<dptrain::report::RunData> {
        dirs.iter()
            .map(|d| dptrain::report::RunData::load(d).unwrap())
            .collect()
    };
    let table = dptrain::report::write_comparison(&read(&runs), &out).unwrap();
    assert!(table.contains("| one | two |"), "{table}");
    assert!(table.contains("| workers | 1 | 2 |"), "{table}");
    assert!(table.contains("| finished | yes | yes |"), "{table}");
    assert!(
        table.contains("| schedule | overlap | overlap |"),
        "{table}"
    );
    assert!(
        table.contains("| port within a host | none | none |"),
        "{table}"
    );
    let md = std::fs::read_to_string(out.join("comparison.md")).unwrap();
    assert!(md.contains("](comparison.png)"));
    assert_eq!(
        png_size(&out.join("comparison.png")),
        dptrain::report::plot::SIZE
    );
    // Written into one of the runs, the comparison keeps that run's own breakdown figure.
    let own = std::fs::read(runs[0].join("breakdown.png")).unwrap();
    dptrain::report::write_comparison(&read(&runs), &runs[0]).unwrap();
    assert!(std::fs::read(runs[0].join("breakdown.png")).unwrap() == own);
    assert!(runs[0].join("comparison.png").exists());
    // A run that has not finished (no summary.json yet) is marked, with how far it got.
    std::fs::remove_file(runs[1].join("summary.json")).unwrap();
    let table = dptrain::report::write_comparison(&read(&runs), &out).unwrap();
    assert!(
        table.contains("| finished | yes | **no** (2 epochs done) |"),
        "{table}"
    );
    assert!(dptrain::report::write_run_report(&tmp.path().join("none")).is_err());
}

#[test]
fn json_log_format_prints_one_json_object_per_epoch_and_no_bar() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args([
            "train",
            "--dataset",
            "synthetic",
            "--epochs",
            "2",
            "--train-limit",
            "64",
            "--test-limit",
            "32",
            "--batch",
            "16",
            "--threads",
            "100000",
            "--no-checkpoints",
            "--log-format",
            "json",
            "--run-dir",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let kinds: Vec<String> = stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["kind"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(kinds, ["epoch", "epoch", "done"]);
    // The done line lists every warning of the run: those shown as it started (threads past
    // the cores) as well as the summary's.
    let done: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let warnings: Vec<&str> = done["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("--threads 100000 is more than")),
        "{warnings:?}"
    );
}

/// A warning met while the run goes (here: metrics lines past a resumed checkpoint, cut
/// when the run writes its first) is in the JSON done line's list too, not only on stderr.
#[test]
fn warnings_met_during_the_run_are_in_the_json_done_line() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let train = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .args(["train", "--dataset", "synthetic", "--epochs", "2"])
            .args(["--train-limit", "64", "--test-limit", "32", "--batch", "16"])
            .args(["--threads", "1", "--log-format", "json", "--run-dir"])
            .arg(tmp.path())
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let done: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        (done, stderr)
    };
    train(&[]);
    let first = tmp.path().join("checkpoint-epoch0001.safetensors");
    let (done, stderr) = train(&["--resume", first.to_str().unwrap()]);
    let listed: Vec<&str> = done["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let cut = |w: &&str| w.contains("past the resumed step");
    assert!(listed.iter().any(cut), "{listed:?}");
    assert!(stderr.contains("past the resumed step"), "{stderr}");
}

/// A resume into a copy of the run's directory (`cp -r run copy; --resume run/ck --run-dir
/// copy`) supersedes the copy's metrics past the resumed step as its own directory's are:
/// each epoch once, not the abandoned lines followed by the redone ones.
#[test]
fn a_resume_into_a_copy_of_its_runs_directory_writes_each_epoch_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let (run, copy) = (tmp.path().join("run"), tmp.path().join("copy"));
    let train = |dir: &std::path::Path, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .args(["train", "--dataset", "synthetic", "--epochs", "2"])
            .args(["--train-limit", "64", "--test-limit", "32", "--batch", "16"])
            .args(["--threads", "1", "--quiet", "--run-dir"])
            .arg(dir)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    train(&run, &[]);
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&run).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let first = run.join("checkpoint-epoch0001.safetensors");
    let stderr = train(&copy, &["--resume", first.to_str().unwrap()]);
    assert!(stderr.contains("past the resumed step"), "{stderr}");
    let epochs: Vec<u64> = std::fs::read_to_string(copy.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "epoch")
        .map(|v| v["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(epochs, [1, 2]);
}

#[test]
fn a_trace_window_that_misses_the_run_is_refused_before_training() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    // 10 steps of 16 (global steps 0..10).
    let run = |window: &str, dir: &str| {
        train(config(&tmp.path().join(dir), |o| {
            o.trace = Some(tmp.path().join(format!("{dir}.json")));
            o.trace_steps = Some(window.into());
        }))
    };
    let err = run("100..110", "past").unwrap_err().to_string();
    assert!(
        err.contains("--trace-steps 100..110 misses every step")
            && err.contains("global steps 0..10"),
        "{err}"
    );
    assert!(
        !tmp.path().join("past/metrics.jsonl").exists(),
        "it trained"
    );
    assert!(!tmp.path().join("past.json").exists());
    // A window that reaches past the end traces what there is.
    run("8..20", "partly").unwrap();
    let (spans, _) = read_trace(&tmp.path().join("partly.json"));
    assert!(spans.iter().any(|s| s.args["global_step"] == 9));
}

#[test]
fn a_run_resumed_from_an_earlier_checkpoint_reports_each_epoch_once() {
    // metrics.jsonl keeps the abandoned epochs 3 and 4 and appends the redone ones.
    let tmp = tempfile::tempdir().unwrap();
    let epoch = |e: u32, accuracy: f64| {
        serde_json::json!({"kind": "epoch", "epoch": e, "train_loss": 1.0, "test_loss": 1.0,
            "test_accuracy": accuracy, "images_per_s": 100.0})
        .to_string()
    };
    let lines = [
        epoch(1, 0.1),
        epoch(2, 0.2),
        epoch(3, 0.3),
        epoch(4, 0.4),
        epoch(3, 0.33),
        epoch(4, 0.44),
    ];
    std::fs::write(tmp.path().join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    let run = dptrain::report::RunData::load(tmp.path()).unwrap();
    let got: Vec<(usize, f64)> = run
        .epochs
        .iter()
        .map(|e| (e.epoch, e.test_accuracy))
        .collect();
    assert_eq!(got, [(1, 0.1), (2, 0.2), (3, 0.33), (4, 0.44)]);
}

#[test]
fn report_refuses_a_summary_of_the_wrong_types_naming_the_field() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    train(config(&dir, |_| {})).unwrap();
    let path = dir.join("summary.json");
    let good: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases: [(&str, Value, &str); 4] = [
        (
            "images_per_s",
            "fast".into(),
            "field 'images_per_s' is a string, not a number",
        ),
        (
            "epochs",
            3.into(),
            "field 'epochs' is a number, not an array",
        ),
        (
            "config",
            "x".into(),
            "field 'config' is a string, not an object",
        ),
        (
            "breakdown",
            serde_json::json!({"steps": 5, "mean": {"step_ms": "slow"}}),
            "field 'breakdown.mean.step_ms' is a string, not a number",
        ),
    ];
    for (key, value, want) in cases {
        let mut bad = good.clone();
        bad[key] = value;
        std::fs::write(&path, bad.to_string()).unwrap();
        let err = dptrain::report::write_run_report(&dir).unwrap_err();
        assert!(err.contains(want) && err.contains("summary.json"), "{err}");
    }
    // An object with none of a summary's fields (it would report nothing, silently).
    std::fs::write(&path, r#"{"x": 1}"#).unwrap();
    let err = dptrain::report::write_run_report(&dir).unwrap_err();
    assert!(err.contains("has no field 'config'"), "{err}");
    std::fs::write(&path, "[1, 2]").unwrap();
    let err = dptrain::report::write_run_report(&dir).unwrap_err();
    assert!(err.contains("is an array, not a JSON object"), "{err}");
    // The binary exits 1 with the message.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .arg("report")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a JSON object"));
    // Broken JSON in the pretty-printed file: its line and column.
    let array = std::fs::read(&path).unwrap();
    std::fs::write(&path, "{\n  \"config\": {},\n  \"epochs\": [,]\n}").unwrap();
    let err = dptrain::report::write_run_report(&dir).unwrap_err();
    assert!(err.contains("summary.json: line 3, column 14"), "{err}");
    std::fs::write(&path, array).unwrap();
    // A run given twice is refused before anything is written, the comparison's directory too.
    let cmp = dir.join("cmp");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .arg("report")
        .args([&dir, &dir])
        .arg("--out")
        .arg(&cmp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("are the same run"), "{err}");
    assert!(!cmp.exists());
    // A good run beside the bad one: every run is read before any report is written, so the
    // good one's report is not rewritten either.
    let good_dir = tmp.path().join("good");
    std::fs::create_dir(&good_dir).unwrap();
    std::fs::copy(dir.join("metrics.jsonl"), good_dir.join("metrics.jsonl")).unwrap();
    std::fs::write(good_dir.join("summary.json"), good.to_string()).unwrap();
    let report = |args: &[&std::path::Path]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .arg("report")
            .args(args)
            .output()
            .unwrap()
    };
    let out = report(&[&good_dir, &dir, "--out".as_ref(), &cmp]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !good_dir.join("report.md").exists(),
        "the good run's report was written"
    );
    // --out with one run (the comparison's directory) is refused, not ignored.
    let out = report(&[&good_dir, "--out".as_ref(), &cmp]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("names the comparison of two or more runs"),
        "{err}"
    );
    assert!(!good_dir.join("report.md").exists());
}

/// Per reduction, whether it ended after the next step's forward began on its worker.
fn reductions_under_the_next_forward(spans: &[Span], names: &HashMap<u64, String>) -> Vec<bool> {
    let rank_of = |tid: u64, prefix: &str| -> usize {
        names[&tid].strip_prefix(prefix).unwrap().parse().unwrap()
    };
    let mut forward_start = HashMap::new();
    for s in spans.iter().filter(|s| s.name == "forward") {
        let key = (
            rank_of(s.tid, "worker "),
            s.args["global_step"].as_u64().unwrap(),
        );
        forward_start.insert(key, s.ts);
    }
    spans
        .iter()
        .filter(|s| s.name.starts_with("reduce bucket"))
        .filter_map(|s| {
            let step = s.args["global_step"].as_u64().unwrap();
            let next = forward_start.get(&(rank_of(s.tid, "comm "), step + 1))?;
            Some(s.end > *next)
        })
        .collect()
}

#[test]
fn under_priority_the_next_forward_runs_while_the_last_steps_reductions_do() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let run = |schedule: &str| {
        let (spans, names) = traced_two_workers(&tmp.path().join(schedule), |o| {
            o.schedule = Some(schedule.into());
            o.partition_kb = Some(8.into());
            // A link slower than backward: a backlog is left when backward ends.
            o.link_bandwidth = Some("50Mbit".into());
        });
        // One span per partition of at most 8 KiB, each with its own bytes.
        let reductions: Vec<&Span> = spans
            .iter()
            .filter(|s| s.name.starts_with("reduce bucket"))
            .collect();
        assert!(reductions.iter().all(|s| {
            let bytes = s.args["bytes"].as_u64().unwrap();
            bytes > 0 && bytes <= 8 * 1024
        }));
        assert!(reductions
            .iter()
            .any(|s| s.args["partition"].as_u64() > Some(0)));
        let under = reductions_under_the_next_forward(&spans, &names);
        assert!(
            !under.is_empty(),
            "{schedule}: reductions with a next step traced"
        );
        under.iter().filter(|&&u| u).count()
    };
    // Overlap: the update waits for every bucket, so the next forward starts after them all.
    assert_eq!(run("overlap"), 0);
    // Priority: the next forward starts once the first layers' buckets are back, while the
    // later layers' are still being reduced.
    assert!(run("priority") > 0);
}
