//! Issue 21's reproducers, each as a test of its class: stdout that closes or fills never
//! kills a command; option lists and counts that mean nothing are refused; only files dptrain
//! named itself are deleted; names from model files cannot escape the runs folder.

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::{text, BIN};

/// Runs dptrain with stdout a pipe whose reader is gone before the first write (what
/// `| head -1` becomes once head has its line), deterministically: the read end is closed
/// before the process starts.
fn with_closed_stdout(args: &[&str], dir: &Path) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Runs dptrain with stdout `/dev/full` (every write fails with "no space left").
fn with_full_stdout(args: &[&str], dir: &Path) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn small_train<'a>(run_dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
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
        "--threads",
        "1",
    ];
    a.extend_from_slice(extra);
    a
}

fn no_panic(o: &Output) {
    let t = text(o);
    assert!(
        !t.contains("panicked") && !t.contains("RUST_BACKTRACE"),
        "{t}"
    );
}

#[test]
fn a_closed_stdout_ends_printing_quietly_and_the_run_completes_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        vec!["model", "list"],
        vec!["model", "show", "resnet50"],
        vec!["bench", "allreduce", "--sizes", "4K", "--workers", "2"],
    ] {
        let o = with_closed_stdout(&args, tmp.path());
        no_panic(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
    }
    let run = tmp.path().join("run");
    let o = with_closed_stdout(&small_train(run.to_str().unwrap(), &[]), tmp.path());
    no_panic(&o);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for f in ["metrics.jsonl", "summary.json", "report.md"] {
        let len = std::fs::metadata(run.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(
            len > 0,
            "{f} missing or empty after a run with a closed stdout"
        );
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["epochs"].as_array().map(Vec::len),
        Some(1),
        "{summary}"
    );
}

#[test]
fn a_full_stdout_is_a_clear_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [vec!["model", "show", "resnet50"], vec!["model", "list"]] {
        let o = with_full_stdout(&args, tmp.path());
        no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error: cannot print the results to stdout")
                && err.contains("No space left"),
            "{err}"
        );
    }
}

#[test]
fn a_repeated_transform_is_refused_naming_it() {
    use dptrain::pipeline::{TransformError, Transforms};
    for (list, op) in [
        ("flip,flip,crop:2,crop:4", "flip"),
        ("crop:2,flip,crop:4", "crop"),
        (
            "resize-shorter,center-crop,resize-shorter:40",
            "resize-shorter",
        ),
        (
            "random-resized-crop:0.5,1,random-resized-crop",
            "random-resized-crop",
        ),
    ] {
        match Transforms::parse(list) {
            Err(TransformError::Repeated { op: named, .. }) => assert_eq!(named, op, "{list}"),
            other => panic!("{list}: {other:?}"),
        }
    }
    assert_eq!(Transforms::parse("crop:4,flip").unwrap().ops.len(), 2);
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let args = small_train(
        run.to_str().unwrap(),
        &["--augment", "flip,flip,crop:2,crop:4"],
    );
    let o = Command::new(BIN).args(&args).output().unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("'flip' appears more than once"),
        "{}",
        text(&o)
    );
}

#[test]
fn keep_checkpoints_zero_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let args = small_train(run.to_str().unwrap(), &["--keep-checkpoints", "0"]);
    let o = Command::new(BIN).args(&args).output().unwrap();
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--keep-checkpoints 0"), "{}", text(&o));
    assert!(!run.exists(), "a refused run made its directory");
}

/// Trains a one-layer model file named `name` in `cwd` with no `--run-dir`; returns the entries
/// of `cwd/runs`.
fn train_named_model(cwd: &Path, name: &str) -> Vec<String> {
    let model = cwd.join("m.toml");
    std::fs::write(
        &model,
        format!(
            "name = {name:?}\ninput = [1, 28, 28]\nclasses = 10\nlayers = [\n  \
             {{ type = \"flatten\" }},\n  {{ type = \"linear\", out = 10 }},\n]\n"
        ),
    )
    .unwrap();
    let o = Command::new(BIN)
        .current_dir(cwd)
        .args(["train", "--quiet", "--model", "m.toml", "--epochs", "1"])
        .args([
            "--train-limit",
            "256",
            "--test-limit",
            "64",
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    no_panic(&o);
    assert!(o.status.success(), "{name}: {}", text(&o));
    let mut names: Vec<String> = std::fs::read_dir(cwd.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_model_files_name_stays_one_folder_inside_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("a").join("b");
    std::fs::create_dir_all(&cwd).unwrap();
    let runs = train_named_model(&cwd, "../../escaped");
    assert_eq!(runs, ["_.._.._escaped-mnist"]);
    assert!(cwd
        .join("runs")
        .join(&runs[0])
        .join("summary.json")
        .is_file());
    for up in [tmp.path(), &tmp.path().join("a"), &cwd] {
        let names: Vec<_> = std::fs::read_dir(up)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.to_string_lossy().contains("escaped")),
            "{}: {names:?}",
            up.display()
        );
    }
    let other = tmp.path().join("c");
    std::fs::create_dir_all(&other).unwrap();
    let runs = train_named_model(&other, "a/b");
    assert_eq!(runs, ["a_b-mnist"]);
    assert!(other.join("runs/a_b-mnist/summary.json").is_file());
}
