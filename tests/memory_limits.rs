//! Issue 21's memory rows, each as a test of its class: a run whose memory estimate does not fit
//! what the process may take (MemAvailable, the cgroup, `ulimit -v`) is refused before anything
//! large is allocated and before its run directory exists, naming what to lower; more in-process
//! workers than the fabric is built for are refused with the reason; an emulated device whose
//! profile is of another run leaves no run directory.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{text, BIN};

/// Runs dptrain in `dir` under `ulimit -v KB` (the address-space limit the issue's
/// reproducers ran under, which also keeps a broken check from taking the machine down).
fn under_ulimit(kb: u64, args: &[&str], dir: &Path) -> Output {
    let mut script = format!("ulimit -v {kb} && exec \"$0\"");
    for i in 0..args.len() {
        script.push_str(&format!(" \"${{{}}}\"", i + 1));
    }
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// A clean refusal: exit 1 or 2, no panic, no abort, no backtrace.
fn assert_refused(o: &Output, what: &str) -> String {
    let t = text(o);
    let code = o.status.code();
    assert!(matches!(code, Some(1 | 2)), "{what}: exit {code:?}\n{t}");
    for bad in [
        "panicked",
        "memory allocation of",
        "backtrace",
        "capacity overflow",
    ] {
        assert!(!t.contains(bad), "{what}: {bad}\n{t}");
    }
    t
}

fn train_args<'a>(run_dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "train",
        "--run-dir",
        run_dir,
        "--epochs",
        "1",
        "--train-limit",
        "512",
        "--test-limit",
        "128",
        "--quiet",
    ];
    a.extend_from_slice(extra);
    a
}

/// Row 3: a model file that passes shape inference but whose activations and weights need far
/// more than any machine has (a conv of 100000 channels on 28x28 at batch 512: about a TB) is
/// refused by `train` naming the memory, the parts and what to lower; no run directory is left.
#[test]
fn a_model_too_large_for_memory_is_refused_before_its_run_directory_exists() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("huge.toml");
    std::fs::write(
        &model,
        r#"name = "huge"
input = [1, 28, 28]
layers = [
  { type = "conv2d", name = "c1", out = 100000, kernel = 5 },
  { type = "relu" },
  { type = "max_pool", kernel = 2 },
  { type = "flatten" },
  { type = "linear", name = "f1", out = "classes" },
]
"#,
    )
    .unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let model_s = model.to_str().unwrap();
    let o = under_ulimit(
        16_000_000,
        &train_args(run_s, &["--model", model_s, "--batch", "512"]),
        dir.path(),
    );
    let t = assert_refused(&o, "huge conv");
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("needs about") && t.contains("activations") && t.contains("lower --batch"),
        "{t}"
    );
    assert!(t.contains("512 per worker now"), "{t}");
    assert!(!run.exists(), "a refused run left {}", run.display());
    // `profile` refuses it through the same estimate.
    let o = under_ulimit(
        16_000_000,
        &[
            "profile", "--model", model_s, "--batch", "512", "--out", "p.json",
        ],
        dir.path(),
    );
    let t = assert_refused(&o, "profile of the huge conv");
    assert!(t.contains("needs about") && t.contains("lower"), "{t}");
}

/// Row 14: 1000 in-process workers (workers^2 channels) are refused by `train` and by
/// `bench allreduce`, saying why and what to do, before any thread or channel exists.
#[test]
fn a_thousand_in_process_workers_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let o = under_ulimit(
        4_000_000,
        &train_args(run_s, &["--workers", "1000", "--batch", "1000"]),
        dir.path(),
    );
    let t = assert_refused(&o, "train --workers 1000");
    assert!(
        t.contains("--workers 1000") && t.contains("256") && t.contains("channel per pair"),
        "{t}"
    );
    assert!(!run.exists(), "a refused run left {}", run.display());
    let o = under_ulimit(
        4_000_000,
        &["bench", "allreduce", "--workers", "1000", "--sizes", "4K"],
        dir.path(),
    );
    let t = assert_refused(&o, "bench allreduce --workers 1000");
    assert!(t.contains("--workers 1000") && t.contains("256"), "{t}");
}

/// "The memory checks ignore `ulimit -v`": `bench allreduce --sizes 1G` (2 workers, a buffer
/// and a scratch each: 4 GB) fits this machine's memory but not a 4 GB address space; it is
/// refused naming the limit instead of aborting on the allocation.
#[test]
fn the_address_space_limit_counts_as_memory() {
    let dir = tempfile::tempdir().unwrap();
    let o = under_ulimit(
        4_000_000,
        &["bench", "allreduce", "--sizes", "1G", "--iters", "1"],
        dir.path(),
    );
    let t = assert_refused(&o, "bench allreduce --sizes 1G under ulimit -v");
    assert!(t.contains("ulimit -v") && t.contains("needs about"), "{t}");
    // A training run that fits the machine but not the limit (resnet20 at batch 4096: about
    // 9 GB) is refused naming it too.
    let run = dir.path().join("run");
    let o = under_ulimit(
        4_000_000,
        &[
            "train",
            "--run-dir",
            run.to_str().unwrap(),
            "--model",
            "resnet20",
            "--dataset",
            "synthetic:3x32x32:10",
            "--batch",
            "4096",
            "--train-limit",
            "4096",
            "--test-limit",
            "128",
            "--epochs",
            "1",
        ],
        dir.path(),
    );
    let t = assert_refused(&o, "resnet20 at batch 4096 under ulimit -v");
    assert!(
        t.contains("ulimit -v") && t.contains("lower --batch"),
        "{t}"
    );
    assert!(!run.exists(), "a refused run left {}", run.display());
}

/// An `--emulate-device` profile of another per-worker batch is refused before the run
/// directory is made (it was refused by each worker, after, leaving it empty).
#[test]
fn an_emulated_device_of_another_run_leaves_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.json");
    let blocks: Vec<String> = (0..5)
        .map(|k| {
            format!(
                r#"{{"name":"b{k}","forward_ms":0.1,"backward_ms":0.1,"param_sizes":[1],"macs_per_sample":1}}"#
            )
        })
        .collect();
    std::fs::write(
        &profile,
        format!(
            r#"{{"model":"lenet5","source":"x","batch":8,"input":[1,28,28],"update_ms":0.1,"blocks":[{}]}}"#,
            blocks.join(",")
        ),
    )
    .unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let profile_s = profile.to_str().unwrap();
    let o = under_ulimit(
        4_000_000,
        &train_args(run_s, &["--emulate-device", profile_s, "--batch", "64"]),
        dir.path(),
    );
    let t = assert_refused(&o, "emulated device of batch 8");
    assert!(t.contains("batch of 8") && t.contains("64"), "{t}");
    assert!(!run.exists(), "a refused run left {}", run.display());
}

/// A run of an ImageFolder too large for memory is refused before any image is decoded: the
/// test split (decoded whole at start) and the images the normalisation is estimated from
/// were read first, 2 GB and seconds for 40 test images at 4096 x 4096. Here each split holds
/// a damaged image, which a decode would have reported first.
#[test]
fn an_image_folder_run_too_large_for_memory_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("photos");
    for (split, class) in [("train", "a"), ("train", "b"), ("test", "a"), ("test", "b")] {
        let d = data.join(split).join(class);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..2 {
            image::RgbImage::from_pixel(40, 30, image::Rgb([i * 90, 20, 200]))
                .save(d.join(format!("{i}.png")))
                .unwrap();
        }
        std::fs::write(d.join("damaged.png"), b"not a png at all").unwrap();
    }
    let run = dir.path().join("run");
    let dataset = format!("imagefolder:{}", data.display());
    let o = under_ulimit(
        16_000_000,
        &train_args(
            run.to_str().unwrap(),
            &[
                "--dataset",
                &dataset,
                "--image-size",
                "4096",
                "--model",
                "resnet20",
                "--batch",
                "4",
            ],
        ),
        dir.path(),
    );
    let t = assert_refused(&o, "a 4096x4096 image folder");
    assert!(
        t.contains("needs about") && t.contains("lower --batch"),
        "{t}"
    );
    assert!(
        !t.contains("damaged.png") && !t.contains("unreadable"),
        "{t}"
    );
    assert!(!run.exists(), "a refused run left {}", run.display());
}
