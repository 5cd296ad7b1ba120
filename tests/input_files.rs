//! Issue 21, rows 6 and 10: every file dptrain reads is a regular file of its kind's size
//! (`/dev/zero` and fifos are refused by type, promptly, naming the path), and `report` reads
//! what a crash leaves (a torn last line of `metrics.jsonl` is skipped with a warning; a bad
//! line before it is an error naming the line).
//!
//! Each command runs under a watchdog (killed after [`HANG_GUARD`] and the test failed) and a
//! 4 GB address-space limit, so a regression that blocks on a fifo or reads `/dev/zero` until
//! memory runs out fails the test instead of taking the machine down. The watchdog is a guard
//! against hangs, not a timing assertion: a correct refusal takes milliseconds.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_dptrain");

/// How long a command may run before it counts as hung.
const HANG_GUARD: Duration = Duration::from_secs(20);

/// What a command did: its exit code and its stdout and stderr together.
struct Ran {
    code: Option<i32>,
    text: String,
}

/// Runs dptrain with `args` in `dir` under the watchdog and the memory limit.
fn run(args: &[&str], dir: &Path) -> Ran {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG_GUARD) {
        Ok(out) => {
            let out = out.unwrap();
            Ran {
                code: out.status.code(),
                text: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        }
        Err(_) => {
            // SAFETY: `pid` is our child, not yet reaped (the waiting thread holds it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("dptrain {args:?} still ran after {HANG_GUARD:?}: it blocked or read forever");
        }
    }
}

/// Makes a fifo at `path`.
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{path:?}");
}

/// The two things no reader may take for a file: `/dev/zero` (endless) and a fifo with no
/// writer (blocks forever), the latter made in `dir` under `name`.
fn hostile(dir: &Path, name: &str) -> [(PathBuf, &'static str); 2] {
    let fifo = dir.join(name);
    mkfifo(&fifo);
    [
        (PathBuf::from("/dev/zero"), "a character device"),
        (fifo, "a fifo"),
    ]
}

/// Asserts a command was refused with exit 1 by an error naming `path` as `what`, "not a
/// regular file", and no panic.
fn refused(r: &Ran, path: &Path, what: &str, args: &[&str]) {
    assert_eq!(r.code, Some(1), "{args:?}: {}", r.text);
    let path = path.display().to_string();
    assert!(
        r.text.contains(&path) && r.text.contains(what) && r.text.contains("not a regular file"),
        "{args:?}: the error should name {path} as {what}, not a regular file: {}",
        r.text
    );
    assert!(!r.text.contains("panicked"), "{args:?}: {}", r.text);
}

const SMALL: [&str; 8] = [
    "--epochs",
    "1",
    "--train-limit",
    "512",
    "--test-limit",
    "128",
    "--threads",
    "1",
];

/// One small finished run shared by the tests that need a checkpoint or a run's files.
fn trained_run() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, run) = RUN.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let mut args = vec!["train", "--run-dir", run.to_str().unwrap()];
        args.extend_from_slice(&SMALL);
        let r = run_ok(&args, tmp.path());
        assert!(run.join("metrics.jsonl").is_file(), "{}", r.text);
        (tmp, run)
    });
    run
}

fn run_ok(args: &[&str], dir: &Path) -> Ran {
    let r = run(args, dir);
    assert_eq!(r.code, Some(0), "{args:?}: {}", r.text);
    r
}

fn checkpoint() -> PathBuf {
    trained_run().join("checkpoint-epoch0001.safetensors")
}

/// Runs `args` with `{}` replaced by each hostile path and checks each is refused.
fn each_refused(args: &[&str], tmp: &Path, name: &str) {
    for (path, what) in hostile(tmp, name) {
        let p = path.to_str().unwrap();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "{}" { p } else { a })
            .collect();
        let r = run(&args, tmp);
        refused(&r, &path, what, &args);
    }
}

#[test]
fn a_model_file_that_is_a_device_or_a_fifo_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    each_refused(&["model", "show", "{}"], tmp.path(), "model.toml");
}

#[test]
fn a_config_or_device_profile_that_is_a_device_or_a_fifo_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run = run.to_str().unwrap();
    let mut config = vec!["train", "--run-dir", run, "--config", "{}"];
    config.extend_from_slice(&SMALL);
    each_refused(&config, tmp.path(), "run.toml");
    let mut device = vec!["train", "--run-dir", run, "--emulate-device", "{}"];
    device.extend_from_slice(&SMALL);
    each_refused(&device, tmp.path(), "device.json");
    each_refused(&["simulate", "--profile", "{}"], tmp.path(), "profile.json");
    assert!(
        !Path::new(run).exists(),
        "a refused run left its run directory"
    );
}

#[test]
fn dataset_files_that_are_devices_or_fifos_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (target, what) in hostile(tmp.path(), "fifo") {
        // An IDX directory whose files are links to the hostile file: the reader follows the
        // link and must refuse what it finds by its type.
        let dir = tmp.path().join(format!("idx-{}", what.replace(' ', "-")));
        std::fs::create_dir(&dir).unwrap();
        for f in [
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        ] {
            std::os::unix::fs::symlink(&target, dir.join(f)).unwrap();
        }
        let spec = format!("idx:{}", dir.display());
        let run_dir = tmp.path().join("run");
        let mut args = vec![
            "train",
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--dataset",
            &spec,
        ];
        args.extend_from_slice(&SMALL);
        let r = run(&args, tmp.path());
        refused(&r, &dir.join("train-images-idx3-ubyte"), what, &args);
    }
}

#[test]
fn checkpoints_that_are_devices_or_fifos_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run = run.to_str().unwrap();
    for flag in ["--resume", "--weights"] {
        let mut args = vec!["train", "--run-dir", run, flag, "{}"];
        args.extend_from_slice(&SMALL);
        each_refused(&args, tmp.path(), &format!("ck{flag}.safetensors"));
    }
    each_refused(
        &["eval", "--checkpoint", "{}"],
        tmp.path(),
        "eval.safetensors",
    );
    assert!(
        !Path::new(run).exists(),
        "a refused run left its run directory"
    );
}

#[test]
fn an_image_to_predict_that_is_a_device_or_a_fifo_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = checkpoint();
    each_refused(
        &["predict", "--checkpoint", ck.to_str().unwrap(), "{}"],
        tmp.path(),
        "digit.png",
    );
}

#[test]
fn a_walked_image_directory_skips_fifos_and_link_loops_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("images");
    std::fs::create_dir(&images).unwrap();
    mkfifo(&images.join("a.png"));
    // A link back to the directory itself: walking through it would never end.
    std::os::unix::fs::symlink(&images, images.join("loop")).unwrap();
    let ck = checkpoint();
    let args = [
        "predict",
        "--checkpoint",
        ck.to_str().unwrap(),
        images.to_str().unwrap(),
    ];
    let r = run(&args, tmp.path());
    // Nothing left to predict once the fifo is skipped: refused, after warnings naming both.
    assert_eq!(r.code, Some(1), "{}", r.text);
    assert!(
        r.text.contains("warning:") && r.text.contains("a.png: skipped"),
        "{}",
        r.text
    );
    assert!(r.text.contains("loop: skipped"), "{}", r.text);
    assert!(
        r.text.contains("no .png, .jpg or .jpeg files"),
        "{}",
        r.text
    );
}

#[test]
fn a_run_summary_that_is_a_device_or_a_fifo_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (target, what)) in hostile(tmp.path(), "fifo").into_iter().enumerate() {
        let dir = tmp.path().join(format!("run{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(
            trained_run().join("metrics.jsonl"),
            dir.join("metrics.jsonl"),
        )
        .unwrap();
        std::os::unix::fs::symlink(&target, dir.join("summary.json")).unwrap();
        let args = ["report", dir.to_str().unwrap()];
        let r = run(&args, tmp.path());
        refused(&r, &dir.join("summary.json"), what, &args);
    }
}

/// A run directory with the trained run's metrics (no summary, so the report comes from the
/// metrics alone), written as `lines` where `EPOCH` stands for an epoch line, `TORN` for a
/// line cut off mid-write, and anything else for itself.
fn run_dir_with(tmp: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let epoch = std::fs::read_to_string(trained_run().join("metrics.jsonl")).unwrap();
    let epoch = epoch
        .lines()
        .find(|l| l.contains("\"kind\":\"epoch\""))
        .unwrap()
        .to_string();
    let torn = &epoch[..epoch.len() / 2];
    let text: Vec<&str> = lines
        .iter()
        .map(|l| match *l {
            "EPOCH" => epoch.as_str(),
            "TORN" => torn,
            other => other,
        })
        .collect();
    let dir = tmp.join(name);
    std::fs::create_dir(&dir).unwrap();
    // Whole lines end in a newline; a torn last line has none, as a crash leaves it.
    let mut body = text.join("\n");
    if lines.last() == Some(&"EPOCH") {
        body.push('\n');
    }
    std::fs::write(dir.join("metrics.jsonl"), body).unwrap();
    dir
}

#[test]
fn report_skips_a_torn_last_metrics_line_with_a_warning_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir_with(tmp.path(), "torn-last", &["EPOCH", "EPOCH", "TORN"]);
    let r = run_ok(&["report", dir.to_str().unwrap()], tmp.path());
    let want = format!("warning: {} line 3:", dir.join("metrics.jsonl").display());
    assert!(
        r.text.contains(&want) && r.text.contains("torn"),
        "{}",
        r.text
    );
    assert_eq!(r.text.matches(&want).count(), 1, "said once: {}", r.text);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(!report.is_empty());
}

#[test]
fn report_skips_lines_dptrain_does_not_write_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let lines = [r#"{"epoch":"x"}"#, "EPOCH", r#"{"kind":"note"}"#, "EPOCH"];
    let dir = run_dir_with(tmp.path(), "foreign", &lines);
    let r = run_ok(&["report", dir.to_str().unwrap()], tmp.path());
    assert!(
        r.text
            .contains("skipped 2 lines that dptrain does not write")
            && r.text.contains("the first is line 1"),
        "{}",
        r.text
    );
    assert!(std::fs::read_to_string(dir.join("report.md"))
        .unwrap()
        .contains("| epochs |"));
}

#[test]
fn report_refuses_a_torn_line_before_the_last_naming_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir_with(tmp.path(), "torn-middle", &["EPOCH", "TORN", "EPOCH"]);
    let r = run(&["report", dir.to_str().unwrap()], tmp.path());
    assert_eq!(r.code, Some(1), "{}", r.text);
    let want = format!("{} line 2:", dir.join("metrics.jsonl").display());
    assert!(r.text.contains(&want), "{}", r.text);
    // serde's own position ("at line 1") would name the wrong line of the file.
    assert!(!r.text.contains("at line 1"), "{}", r.text);
    assert!(!dir.join("report.md").exists());
}

#[test]
fn report_says_when_a_directory_is_missing_or_not_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nothing-here");
    let r = run(&["report", missing.to_str().unwrap()], tmp.path());
    assert_eq!(r.code, Some(1), "{}", r.text);
    assert!(r.text.contains("does not exist"), "{}", r.text);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let r = run(&["report", empty.to_str().unwrap()], tmp.path());
    assert_eq!(r.code, Some(1), "{}", r.text);
    assert!(r.text.contains("is not a run directory"), "{}", r.text);
}

/// Writes a 28 x 28 grey PNG at `path`.
fn png(path: &Path) {
    let mut bytes = Vec::new();
    {
        let mut e = png::Encoder::new(&mut bytes, 28, 28);
        e.set_color(png::ColorType::Grayscale);
        e.set_depth(png::BitDepth::Eight);
        let mut w = e.write_header().unwrap();
        w.write_image_data(&[128u8; 28 * 28]).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

/// An ImageFolder under `dir/folder`: train and test splits of classes `a` and `b`, one
/// 28x28 PNG each (`0.png`); returns its root.
fn two_class_folder(dir: &Path) -> PathBuf {
    let root = dir.join("folder");
    for split in ["train", "test"] {
        for class in ["a", "b"] {
            let d = root.join(split).join(class);
            std::fs::create_dir_all(&d).unwrap();
            png(&d.join("0.png"));
        }
    }
    root
}

/// One epoch at batch 2 on the ImageFolder at `root`, run from `dir`, which must succeed.
fn train_on_folder(root: &Path, dir: &Path) -> Ran {
    let spec = format!("imagefolder:{}", root.display());
    let run_dir = dir.join("run");
    let args = [
        "train",
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--dataset",
        &spec,
        "--epochs",
        "1",
        "--batch",
        "2",
        "--threads",
        "1",
    ];
    run_ok(&args, dir)
}

#[test]
fn an_image_folder_skips_entries_that_are_not_regular_files_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let root = two_class_folder(tmp.path());
    let class = root.join("train").join("a");
    mkfifo(&class.join("1.png"));
    std::os::unix::fs::symlink("/dev/zero", class.join("2.png")).unwrap();
    std::os::unix::fs::symlink(class.join("3.png"), class.join("3.png")).unwrap();
    // A directory named like an image: skipped once, not also counted as an unread directory.
    std::fs::create_dir(class.join("4.png")).unwrap();
    let r = train_on_folder(&root, tmp.path());
    assert!(
        r.text
            .contains(&format!("warning: {}: skipped 4 entries", class.display())),
        "{}",
        r.text
    );
    assert!(r.text.contains("not a regular file"), "{}", r.text);
    assert!(!r.text.contains("in this class not read"), "{}", r.text);
}

#[test]
fn images_of_formats_not_read_are_counted_as_left_out_not_dropped_silently() {
    let tmp = tempfile::tempdir().unwrap();
    let root = two_class_folder(tmp.path());
    let a = root.join("train").join("a");
    for name in ["1.webp", "2.HEIC", "3.heic", "notes.txt"] {
        std::fs::write(a.join(name), b"x").unwrap();
    }
    let r = train_on_folder(&root, tmp.path());
    let said = format!(
        "warning: {}: left out 3 images in formats dptrain does not read (2 .heic, 1 .webp; \
         e.g. {}): it reads PNG and JPEG",
        root.join("train").display(),
        a.join("1.webp").display()
    );
    assert!(r.text.contains(&said), "{}", r.text);
    // predict walks a directory alike; one holding no PNG or JPEG says what it left out.
    let ck = tmp
        .path()
        .join("run")
        .join("checkpoint-epoch0001.safetensors");
    let ck = ck.to_str().unwrap();
    let r = run(
        &["predict", "--checkpoint", ck, a.to_str().unwrap()],
        tmp.path(),
    );
    assert!(
        r.code == Some(0) && r.text.contains("left out 3 images"),
        "{}",
        r.text
    );
    std::fs::remove_file(a.join("0.png")).unwrap();
    let r = run(
        &["predict", "--checkpoint", ck, a.to_str().unwrap()],
        tmp.path(),
    );
    assert!(
        r.code == Some(1)
            && r.text
                .contains("no .png, .jpg or .jpeg files in this directory or below (left out 3"),
        "{}",
        r.text
    );
}

#[test]
fn packed_and_cifar_files_that_are_devices_or_fifos_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let run_dir = run_dir.to_str().unwrap();
    let mut packed = vec!["train", "--run-dir", run_dir, "--dataset", "packed:{}"];
    packed.extend_from_slice(&SMALL);
    for (path, what) in hostile(tmp.path(), "data.packed") {
        let spec = format!("packed:{}", path.display());
        let args: Vec<&str> = packed
            .iter()
            .map(|a| if *a == "packed:{}" { spec.as_str() } else { a })
            .collect();
        let r = run(&args, tmp.path());
        refused(&r, &path, what, &args);
    }
    for (i, (target, what)) in hostile(tmp.path(), "cifar-fifo").into_iter().enumerate() {
        let dir = tmp.path().join(format!("cifar{i}"));
        std::fs::create_dir(&dir).unwrap();
        let names = (1..=5)
            .map(|k| format!("data_batch_{k}.bin"))
            .chain(["test_batch.bin".to_string()]);
        for f in names {
            std::os::unix::fs::symlink(&target, dir.join(f)).unwrap();
        }
        let spec = format!("cifar10:{}", dir.display());
        let mut args = vec!["train", "--run-dir", run_dir, "--dataset", &spec];
        args.extend_from_slice(&SMALL);
        let r = run(&args, tmp.path());
        refused(&r, &dir.join("data_batch_1.bin"), what, &args);
    }
}
