//! Failure propagation: an injected panic or loader failure anywhere ends the whole run within
//! seconds, with an error that names the worker, the phase and the step; a process killed while
//! writing a checkpoint leaves the previous checkpoint loadable. And what a run touches: only
//! regular files at the outputs it was given (never a device node, fifo, link target or
//! directory), no directory beyond the one named, no other run's files, no temporary file left
//! on any failure; every output is checked before the first step.

use dptrain::config::TrainOptions;
use dptrain::train::checkpoint::Checkpoint;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn options(dir: &Path, fault: &str, prefetch: usize) -> TrainOptions {
    TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(1),
        batch: Some(16),
        workers: Some(2),
        threads: Some(1),
        train_limit: Some(16 * 8),
        test_limit: Some(32),
        prefetch: Some(prefetch),
        comm_timeout: Some(60.0),
        run_dir: Some(dir.to_path_buf()),
        quiet: true,
        inject_fault: Some(fault.into()),
        ..Default::default()
    }
}

/// Runs training on a thread; fails the test if it takes longer than 10 s (a hang).
fn run_with_deadline(opts: TrainOptions) -> (Result<(), String>, Duration) {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let r = opts
            .resolve()
            .and_then(|c| dptrain::train::train(c).map_err(String::from))
            .map(|_| ());
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the run did not end within 10 s: a hang");
    (r, started.elapsed())
}

#[test]
fn injected_faults_end_the_run_quickly_with_the_cause() {
    // Quiet the default panic hook for the injected panics (they are expected).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("injected fault") {
            default_hook(info);
        }
    }));
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "forward@3:1",
            2,
            &["worker 1", "forward", "step 3", "injected fault"][..],
        ),
        (
            "backward@3:0",
            2,
            &["worker 0", "backward", "step 3", "injected fault"][..],
        ),
        (
            "comm@3:1",
            2,
            &[
                "worker 1",
                "communication",
                "step 3",
                "communication thread panicked",
                // The payload, not "unknown panic".
                "injected fault: Comm while reducing bucket",
            ][..],
        ),
        (
            "data@3:1",
            2,
            &["worker 1", "data", "loader failure", "step 3"][..],
        ),
        ("data@3:1", 0, &["worker 1", "data", "loader failure"][..]),
    ];
    // Shared memory (what `auto` picks for 2 workers in one process) and messages.
    for (fault, prefetch, expected) in cases {
        for round in 0..20 {
            let comm = ["shm", "redundant"][round % 2];
            let dir = tmp.path().join(format!(
                "{}-{prefetch}-{round}",
                fault.replace([':', '@'], "_")
            ));
            let mut opts = options(&dir, fault, prefetch);
            opts.comm = Some(comm.into());
            let (r, took) = run_with_deadline(opts);
            let err = r.expect_err("an injected fault must fail the run");
            for want in expected {
                assert!(
                    err.contains(want),
                    "{fault} ({comm}, prefetch {prefetch}, round {round}): '{want}' missing from: \
                     {err}"
                );
            }
            assert!(took < Duration::from_secs(10), "{fault}: took {took:?}");
        }
    }
}

/// A run given more epochs than it will ever reach (one left to its Ctrl-C) starts at once:
/// nothing is prepared per epoch (the run directory's check once built a path for each, which
/// took gigabytes and minutes before the first step at 2^32 epochs); one whose steps in all no
/// counter holds is refused naming `--epochs`, where the count overflowed.
#[test]
fn any_epoch_count_starts_at_once_and_one_past_counting_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // 2^60 epochs of 8 steps: steps in all that fit, whose batches over the process's 2
    // workers do not (the loaders counted those: they wrapped to none, and the run waited
    // for data for ever).
    for (name, epochs) in [("long", 1usize << 32), ("wide", 1 << 60)] {
        let mut opts = options(&tmp.path().join(name), "forward@3:0", 2);
        opts.epochs = Some(epochs);
        let (r, _) = run_with_deadline(opts);
        let err = r.expect_err("the injected fault stops the run");
        assert!(
            err.contains("step 3") && err.contains("injected fault"),
            "{epochs} epochs: {err}"
        );
    }
    let mut opts = options(&tmp.path().join("past"), "forward@3:0", 2);
    opts.inject_fault = None;
    opts.epochs = Some(usize::MAX);
    let (r, _) = run_with_deadline(opts);
    let err = r.expect_err("steps past counting are refused");
    assert!(
        err.contains(&format!(
            "--epochs {} of 8 steps each is more steps",
            usize::MAX
        )),
        "{err}"
    );
    assert!(
        !tmp.path().join("past").exists(),
        "a refused run made its directory"
    );
}

#[test]
fn kill_during_checkpoint_write_leaves_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args([
            "train",
            "--dataset",
            "synthetic",
            "--epochs",
            "3",
            "--batch",
            "16",
            "--train-limit",
            "64",
        ])
        .args([
            "--test-limit",
            "32",
            "--checkpoint-every",
            "1",
            "--quiet",
            "--inject-fault",
            "slow-checkpoint",
        ])
        .arg("--run-dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let first = dir.join("checkpoint-epoch0001.safetensors");
    let second_tmp = || temp_files(&dir, "checkpoint-epoch0002.safetensors");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Wait until the first checkpoint is complete and the second is being written.
    while !first.is_file() || second_tmp().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the run never reached its second checkpoint"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !dir.join("checkpoint-epoch0002.safetensors").exists(),
        "a half-written checkpoint took the real name"
    );
    let ck = Checkpoint::load(&first).expect("the previous checkpoint must still load");
    assert_eq!(ck.state.epoch, 1);
    assert_eq!(
        second_tmp().len(),
        1,
        "the killed write left its temporary file"
    );
    // And training resumes from it, in the same directory, which also removes the temporary
    // file the killed process could not (on a small disk it would keep the disk full).
    let resumed = TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(2),
        batch: Some(16),
        train_limit: Some(64),
        test_limit: Some(32),
        run_dir: Some(dir.clone()),
        resume: Some(first),
        quiet: true,
        ..Default::default()
    };
    let s = dptrain::train::train(resumed.resolve().unwrap()).unwrap();
    assert_eq!(s.epochs.len(), 1);
    assert!(
        second_tmp().is_empty(),
        "the stale temporary file is still there"
    );
    assert!(dir.join("checkpoint-epoch0002.safetensors").is_file());
}

/// Temporary files of an atomic write of `target` in `dir`.
fn temp_files(dir: &Path, target: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| dptrain::output::is_temp_of(n, target))
                .collect()
        })
        .unwrap_or_default()
}

/// Every temporary file (`.dptrain-tmp-*`) under `dir`, recursively.
fn any_temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(any_temp_files(&p));
        } else if p.file_name().is_some_and(|n| {
            n.to_string_lossy()
                .starts_with(dptrain::output::TEMP_PREFIX)
        }) {
            out.push(p);
        }
    }
    out
}

/// Runs the dptrain binary with `args`; fails the test after 60 s (a hang). Returns the exit
/// code, stdout and stderr.
fn dptrain(args: &[&str], dir: &Path) -> (i32, String, String) {
    dptrain_with(
        std::process::Command::new(env!("CARGO_BIN_EXE_dptrain")).args(args),
        dir,
    )
}

fn dptrain_with(cmd: &mut std::process::Command, dir: &Path) -> (i32, String, String) {
    let child = cmd
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("dptrain did not end within 60 s: a hang")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A short training run's flags (2 workers on synthetic data, a second or two).
const SHORT: &[&str] = &[
    "train",
    "--dataset",
    "synthetic",
    "--epochs",
    "1",
    "--batch",
    "16",
    "--train-limit",
    "64",
    "--test-limit",
    "32",
    "--threads",
    "1",
    "--quiet",
];

/// [`SHORT`] with `extra` flags added; a flag in `extra` replaces [`SHORT`]'s value of it.
fn short(extra: &[&str]) -> Vec<String> {
    let mut args = vec![SHORT[0].to_string()];
    let mut rest = &SHORT[1..];
    while let Some((flag, tail)) = rest.split_first() {
        let takes_value = tail.first().is_some_and(|v| !v.starts_with("--"));
        let n = if takes_value { 2 } else { 1 };
        if !extra.contains(flag) {
            args.extend(rest[..n].iter().map(|s| s.to_string()));
        }
        rest = &rest[n..];
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    // A trace of the run's few steps (the default window, 5..8, is past a 4-step run).
    if extra.contains(&"--trace") && !extra.contains(&"--trace-steps") {
        args.extend(["--trace-steps".to_string(), "1..3".to_string()]);
    }
    args
}

fn run_short(extra: &[&str], dir: &Path) -> (i32, String, String) {
    let args = short(extra);
    dptrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir)
}

/// The file type and device number of `path` (not following links).
#[cfg(unix)]
fn identity(path: &Path) -> (std::fs::FileType, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.file_type(), m.rdev(), m.ino())
}

/// Owned arguments from string slices.
fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn run_args(args: &[String], dir: &Path) -> (i32, String, String) {
    dptrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir)
}

#[cfg(unix)]
#[test]
fn outputs_that_are_not_regular_files_are_refused_and_left_untouched() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // A fifo, a directory, a link to a file and a dangling link, made here.
    let fifo = t.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::fs::create_dir(t.join("adir")).unwrap();
    std::fs::write(t.join("victim"), b"keep me").unwrap();
    std::os::unix::fs::symlink(t.join("victim"), t.join("link")).unwrap();
    std::os::unix::fs::symlink(t.join("nowhere"), t.join("dangling")).unwrap();
    let mut targets: Vec<(PathBuf, &str)> = vec![
        (fifo, "fifo"),
        (t.join("adir"), "directory"),
        (t.join("link"), "symbolic link"),
        (t.join("dangling"), "symbolic link"),
    ];
    // Device nodes. As root (as CI runs) the ones that were replaced, /dev/null and /dev/full,
    // are made again here with mknod: a broken check must not be able to replace the real
    // ones, which root could. Other users cannot replace anything in /dev, so the real ones
    // are safe targets for them.
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        for (name, minor) in [("null-node", 3), ("full-node", 7)] {
            let node = t.join(name);
            let c = std::ffi::CString::new(node.as_os_str().as_bytes()).unwrap();
            // SAFETY: mknod with a valid path; (1, 3) and (1, 7) are /dev/null and /dev/full.
            let made =
                unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, minor)) };
            assert_eq!(made, 0, "mknod as root");
            targets.push((node, "character device"));
        }
    } else {
        targets.push((PathBuf::from("/dev/null"), "character device"));
        targets.push((PathBuf::from("/dev/full"), "character device"));
    }
    // Two finished runs, for `report --out`.
    for run in ["ra", "rb"] {
        let (code, _, err) = run_short(&["--run-dir", run], t);
        assert_eq!(code, 0, "{err}");
    }
    for (i, (target, kind)) in targets.iter().enumerate() {
        let before = identity(target);
        let target_s = target.to_str().unwrap();
        let run_dir = t.join(format!("run{i}"));
        let run_dir_s = run_dir.to_str().unwrap();
        // Writers of one file, then writers of a directory (which take a directory).
        let files: Vec<(&str, Vec<String>)> = vec![
            (
                "--trace",
                short(&["--run-dir", run_dir_s, "--trace", target_s]),
            ),
            (
                "profile --out",
                owned(&[
                    "profile",
                    "--model",
                    "lenet5",
                    "--device-tflops",
                    "1",
                    "--out",
                    target_s,
                ]),
            ),
        ];
        let mut dirs: Vec<(&str, Vec<String>)> = vec![
            (
                "export-images --out",
                owned(&[
                    "data",
                    "export-images",
                    "--dataset",
                    "synthetic",
                    "--limit",
                    "2",
                    "--out",
                    target_s,
                ]),
            ),
            (
                "report --out",
                owned(&["report", "ra", "rb", "--out", target_s]),
            ),
            (
                "bench suite --out",
                owned(&["bench", "suite", "--quick", "--out", target_s]),
            ),
            ("--run-dir", short(&["--run-dir", target_s])),
        ];
        if *kind == "directory" {
            dirs.clear(); // an existing directory is what these take
        }
        for (what, args) in files.iter().chain(&dirs) {
            let (code, out, err) = run_args(args, t);
            assert_eq!(code, 1, "{what} {target_s}: exit {code}\n{out}\n{err}");
            assert!(err.contains(target_s), "{what} {target_s}: {err}");
            // Named as what it is (a link to a file reads as the file it points to where a
            // directory is wanted).
            let named =
                err.contains(kind) || (*kind == "symbolic link" && err.contains("not a directory"));
            assert!(named, "{what} {target_s}: {err}");
            assert!(!err.contains("panicked"), "{err}");
            assert_eq!(identity(target), before, "{what} replaced {target_s}");
        }
        assert!(
            !run_dir.join("metrics.jsonl").exists(),
            "--trace {target_s}: training ran before the output was checked"
        );
    }
    assert_eq!(std::fs::read(t.join("victim")).unwrap(), b"keep me");
    assert!(
        !t.join("nowhere").exists(),
        "a dangling link's target was created"
    );
    assert!(any_temp_files(t).is_empty(), "{:?}", any_temp_files(t));
}

/// Every output path is replaced only by a file of the kind its command writes (an earlier
/// output of it), never a user's other file, which stays as it was; an empty file and the
/// command's own earlier output are replaced.
#[test]
fn a_file_at_an_output_path_is_replaced_only_by_one_of_its_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (code, _, err) = run_short(&["--run-dir", "ra"], t);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_short(&["--run-dir", "rb"], t);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = dptrain(
        &[
            "data",
            "export-images",
            "--dataset",
            "synthetic",
            "--limit",
            "200",
            "--out",
            "folder",
        ],
        t,
    );
    assert_eq!(code, 0, "{err}");
    let checkpoint = "ra/checkpoint-epoch0001.safetensors";
    // The file a user keeps, under each command's output name.
    let keep = b"a user's notes: keep me\n";
    for d in ["cmp", "evals"] {
        std::fs::create_dir(t.join(d)).unwrap();
    }
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "--trace",
            short(&["--run-dir", "rc", "--trace", "notes.txt"]),
            "notes.txt",
        ),
        (
            "profile --out",
            owned(&[
                "profile",
                "--model",
                "lenet5",
                "--device-tflops",
                "1",
                "--out",
                "notes.txt",
            ]),
            "notes.txt",
        ),
        (
            "data pack --out",
            owned(&["data", "pack", "folder", "--out", "notes.txt"]),
            "notes.txt",
        ),
        (
            "export --out",
            owned(&["export", "--checkpoint", checkpoint, "--out", "notes.txt"]),
            "notes.txt",
        ),
        // A checkpoint given as another command's output.
        (
            "profile --out CHECKPOINT",
            owned(&[
                "profile",
                "--model",
                "lenet5",
                "--device-tflops",
                "1",
                "--out",
                checkpoint,
            ]),
            checkpoint,
        ),
        (
            "report --out",
            owned(&["report", "ra", "rb", "--out", "cmp"]),
            "cmp/comparison.md",
        ),
        (
            "eval --out",
            owned(&["eval", "--checkpoint", checkpoint, "--out", "evals"]),
            "evals/eval.md",
        ),
    ];
    // Reporting several runs, one of which holds a user's report.md: refused before any is
    // rewritten.
    let (code, _, err) = dptrain(&["report", "ra"], t);
    assert_eq!(code, 0, "{err}");
    let ra_report = std::fs::read(t.join("ra/report.md")).unwrap();
    std::fs::write(t.join("rb/report.md"), keep).unwrap();
    std::fs::remove_file(t.join("ra/loss.png")).unwrap();
    let (code, _, err) = dptrain(&["report", "ra", "rb"], t);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("rb/report.md") && err.contains("is not a run report"),
        "{err}"
    );
    assert_eq!(std::fs::read(t.join("rb/report.md")).unwrap(), keep);
    assert_eq!(std::fs::read(t.join("ra/report.md")).unwrap(), ra_report);
    assert!(
        !t.join("ra/loss.png").exists(),
        "ra's report was redrawn first"
    );
    std::fs::remove_file(t.join("rb/report.md")).unwrap();
    for (what, args, victim) in &cases {
        let path = t.join(victim);
        let before = if *victim == checkpoint {
            std::fs::read(&path).unwrap()
        } else {
            std::fs::write(&path, keep).unwrap();
            keep.to_vec()
        };
        let (code, out, err) = run_args(args, t);
        assert_eq!(code, 1, "{what}: exit {code}\n{out}\n{err}");
        assert!(
            err.contains(victim) && err.contains("exists and is not") && !err.contains("panicked"),
            "{what}: {err}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{what} replaced {victim}"
        );
        if *victim == checkpoint {
            continue;
        }
        // Empty (as from mktemp), it is written; run again, the command replaces its own file.
        std::fs::write(&path, b"").unwrap();
        let _ = std::fs::remove_dir_all(t.join("rc"));
        for round in ["empty", "its own"] {
            let (code, out, err) = run_args(args, t);
            assert_eq!(code, 0, "{what} over {round} {victim}: {out}\n{err}");
            assert!(std::fs::metadata(&path).unwrap().len() > 0, "{what}");
            let _ = std::fs::remove_dir_all(t.join("rc"));
        }
    }
    assert!(any_temp_files(t).is_empty(), "{:?}", any_temp_files(t));
}

#[test]
fn no_directory_beyond_the_one_named_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "--trace",
            short(&["--run-dir", "run", "--trace", "missing/deeper/t.json"]),
        ),
        ("--run-dir", short(&["--run-dir", "missing/deeper/run"])),
        (
            "profile --out",
            owned(&[
                "profile",
                "--model",
                "lenet5",
                "--device-tflops",
                "1",
                "--out",
                "missing/p.json",
            ]),
        ),
        (
            "export --out",
            owned(&[
                "data",
                "export-images",
                "--dataset",
                "synthetic",
                "--limit",
                "2",
                "--out",
                "missing/deeper/png",
            ]),
        ),
    ];
    for (what, args) in cases {
        let (code, _, err) = run_args(&args, t);
        assert_eq!(code, 1, "{what}: {err}");
        assert!(
            err.contains("does not exist") && err.contains("create it first"),
            "{what}: {err}"
        );
        assert!(!t.join("missing").exists(), "{what} created a directory");
    }
    // One level is fine: the run directory itself (and the trace in it).
    let (code, _, err) = run_short(&["--run-dir", "new-run", "--trace", "new-run/t.json"], t);
    assert_eq!(code, 0, "{err}");
    assert!(t.join("new-run/summary.json").is_file() && t.join("new-run/t.json").is_file());
    // The CLI draws the report once the run has returned its summary.
    assert!(t.join("new-run/report.md").is_file());
}

#[test]
fn a_run_directory_holding_another_run_is_refused_unless_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (code, _, err) = run_short(&["--run-dir", "X", "--epochs", "3"], t);
    assert_eq!(code, 0, "{err}");
    let old_metrics = std::fs::read_to_string(t.join("X/metrics.jsonl")).unwrap();
    // Reused without --resume: refused, naming the files and the ways out; nothing touched.
    let (code, _, err) = run_short(&["--run-dir", "X", "--seed", "7"], t);
    assert_eq!(code, 1, "{err}");
    for want in [
        "holds the files of another run",
        "checkpoint-epoch0003.safetensors",
        "metrics.jsonl",
        "--resume X/checkpoint-epoch0003.safetensors",
        "--overwrite",
    ] {
        assert!(err.contains(want), "'{want}' missing: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(t.join("X/metrics.jsonl")).unwrap(),
        old_metrics
    );
    // A file with a run file's name that dptrain did not write is the user's: refused by name
    // even with --overwrite (a damaged summary.json too), and nothing of the run deleted.
    let summary = std::fs::read(t.join("X/summary.json")).unwrap();
    std::fs::write(t.join("X/report.md"), b"my notes on this run\n").unwrap();
    std::fs::write(t.join("X/summary.json"), b"{ torn").unwrap();
    for (name, kind) in [
        ("report.md", "not a run report dptrain wrote"),
        ("summary.json", "not a run summary dptrain wrote"),
    ] {
        let (code, _, err) = run_short(&["--run-dir", "X", "--seed", "7", "--overwrite"], t);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(name) && err.contains(kind), "{err}");
        assert!(t.join("X/checkpoint-epoch0003.safetensors").exists());
        if name == "report.md" {
            assert_eq!(
                std::fs::read(t.join("X/report.md")).unwrap(),
                b"my notes on this run\n"
            );
            std::fs::remove_file(t.join("X/report.md")).unwrap();
        }
    }
    std::fs::write(t.join("X/summary.json"), summary).unwrap();
    // Without another run there, a user's file of a run's name is not "another run" either.
    std::fs::create_dir(t.join("U")).unwrap();
    std::fs::write(t.join("U/metrics.jsonl"), b"step,loss\n1,2.3\n").unwrap();
    let (code, _, err) = run_short(&["--run-dir", "U"], t);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not a run's metrics dptrain wrote") && !err.contains("another run"),
        "{err}"
    );
    // With --overwrite the old run's files go first, so the latest checkpoint is the new run's.
    let (code, _, err) = run_short(&["--run-dir", "X", "--seed", "7", "--overwrite"], t);
    assert_eq!(code, 0, "{err}");
    let mut names: Vec<String> = std::fs::read_dir(t.join("X"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint"))
        .collect();
    names.sort();
    assert_eq!(names, ["checkpoint-epoch0001.safetensors"]);
    let ck = Checkpoint::load(&t.join("X/checkpoint-epoch0001.safetensors")).unwrap();
    assert_eq!(ck.state.run.unwrap().seed, 7);
    let metrics = std::fs::read_to_string(t.join("X/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 1, "{metrics}");
}

#[test]
fn a_trace_path_that_is_one_of_the_runs_own_files_is_refused_before_the_first_step() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    for name in [
        "summary.json",
        "report.md",
        "metrics.jsonl",
        "checkpoint-epoch0001.safetensors",
    ] {
        let trace = format!("T/{name}");
        let (code, _, err) = run_short(&["--run-dir", "T", "--trace", &trace], t);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("the run's own {name}")) && err.contains("T/trace.json"),
            "{err}"
        );
        // The run directory the refused run made is not left behind empty.
        assert!(!t.join("T").exists());
    }
    // Nor the default one (runs/ included); a directory that was there is kept.
    let (code, _, err) = run_short(&["--trace", "runs/lenet5-mnist/report.md"], t);
    assert_eq!(code, 1, "{err}");
    assert!(!t.join("runs").exists(), "{err}");
    std::fs::create_dir(t.join("T")).unwrap();
    let (code, _, err) = run_short(&["--run-dir", "T", "--trace", "T/report.md"], t);
    assert_eq!(code, 1, "{err}");
    assert!(t.join("T").is_dir());
    // The same name outside the run directory is the trace's to write.
    let (code, _, err) = run_short(&["--run-dir", "T", "--trace", "summary.json"], t);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn the_default_run_directory_moves_on_to_a_numbered_one() {
    // Without --run-dir (the README's first command run twice), an earlier run is left as it
    // is and the new one gets the next free runs/<model>-<dataset>-N.
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (code, _, err) = run_short(&[], t);
    assert_eq!(code, 0, "{err}");
    let first = std::fs::read_to_string(t.join("runs/lenet5-synthetic/metrics.jsonl")).unwrap();
    for n in [2, 3] {
        let (code, out, err) = run_short(&["--seed", "9"], t);
        assert_eq!(code, 0, "{err}");
        let dir = format!("runs/lenet5-synthetic-{n}");
        assert!(err.contains(&dir) || out.contains(&dir), "{out}{err}");
        assert!(t.join(&dir).join("summary.json").is_file());
        // Every file of the run, its epoch lines too, went there.
        let lines = std::fs::read_to_string(t.join(&dir).join("metrics.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 1, "{lines}");
    }
    assert_eq!(
        std::fs::read_to_string(t.join("runs/lenet5-synthetic/metrics.jsonl")).unwrap(),
        first
    );
}

#[cfg(unix)]
#[test]
fn a_failed_checkpoint_write_leaves_no_temporary_file() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let args = short(&[
        "--run-dir",
        "run",
        "--model",
        "vgg-small",
        "--dataset",
        "synthetic:3x32x32",
    ]);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"));
    cmd.args(&args);
    // A disk that fills up: writes past 256 KiB fail (EFBIG) in the child, like ENOSPC; the
    // checkpoint of vgg-small is larger, the metrics lines are not.
    // SAFETY: setrlimit and signal only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 256 << 10,
                rlim_max: 256 << 10,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let (code, _, err) = dptrain_with(&mut cmd, tmp.path());
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot write") && err.contains("checkpoint-epoch0001.safetensors"),
        "{err}"
    );
    assert!(!err.contains("cannot read"), "{err}");
    let left = any_temp_files(tmp.path());
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn unwritable_outputs_are_found_before_the_first_step() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // A read-only directory: mode 0555, or (as root, whom modes do not stop) sysfs.
    let ro = t.join("ro");
    std::fs::create_dir(&ro).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    let ro = if std::fs::write(ro.join("probe"), b"").is_ok() {
        PathBuf::from("/sys/kernel")
    } else {
        ro
    };
    let ro_s = ro.to_str().unwrap();
    let started = Instant::now();
    let (code, _, err) = run_short(&["--run-dir", ro_s, "--epochs", "50"], t);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(ro_s) && err.contains("cannot create a file"),
        "{err}"
    );
    // 50 epochs would take far longer: refused before training.
    assert!(started.elapsed() < Duration::from_secs(20));
    let trace = format!("{ro_s}/trace.json");
    let (code, _, err) = run_short(&["--run-dir", "ok", "--trace", &trace, "--epochs", "50"], t);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--trace") && err.contains("cannot create a file"),
        "{err}"
    );
    assert!(!t.join("ok/metrics.jsonl").exists(), "training ran");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn an_emulated_link_too_slow_for_the_timeout_fails_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // Refused up front: nothing could arrive in time.
    for (bw, lat, want) in [
        ("1bit", "0", "--link-bandwidth"),
        (
            "1Gbit",
            "1000s",
            "--link-latency 1000 s is not below --comm-timeout",
        ),
    ] {
        let (code, _, err) = run_short(
            &[
                "--run-dir",
                "r",
                "--workers",
                "2",
                "--link-bandwidth",
                bw,
                "--link-latency",
                lat,
                "--comm-timeout",
                "5",
            ],
            t,
        );
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(want), "{err}");
    }
    // A link on which one float arrives in time but the gradients take hours: the emulated
    // transmit time counts against --comm-timeout, so the run ends now, not after sleeping.
    let started = Instant::now();
    let (code, _, err) = run_short(
        &[
            "--run-dir",
            "r",
            "--workers",
            "2",
            "--link-bandwidth",
            "100bit",
            "--comm-timeout",
            "100",
        ],
        t,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("the emulated link needs")
            && err.contains("longer than its timeout (100s, from --comm-timeout)"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn nonfinite_loss_stops_with_the_step_or_is_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let diverging = |dir: &str, policy: &str| TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(1),
        batch: Some(16),
        workers: Some(2),
        threads: Some(1),
        lr: Some(1e30),
        warmup_steps: Some(0),
        train_limit: Some(16 * 6),
        test_limit: Some(32),
        run_dir: Some(tmp.path().join(dir)),
        quiet: true,
        on_nonfinite: Some(policy.into()),
        ..Default::default()
    };
    let (r, _) = run_with_deadline(diverging("stop", "stop"));
    let err = r.expect_err("a NaN loss must stop the run by default");
    assert!(
        err.contains("step 1") && (err.contains("NaN") || err.contains("inf")),
        "{err}"
    );
    let s = dptrain::train::train(diverging("skip", "skip").resolve().unwrap()).unwrap();
    assert!(s.skipped_nonfinite_updates > 0, "no update was skipped");
    // Said, loudly when most were skipped (here: all).
    let w = s.warnings().join("\n");
    assert!(
        w.contains("MOST UPDATES WERE SKIPPED")
            && w.contains(&format!(
                "{} of {} updates",
                s.skipped_nonfinite_updates, s.steps
            )),
        "{w}"
    );
    // And on stdout, where a person looks.
    let (code, out, err) = run_short(
        &[
            "--run-dir",
            "cli",
            "--lr",
            "1e30",
            "--warmup-steps",
            "0",
            "--on-nonfinite",
            "skip",
        ],
        tmp.path(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("warning: MOST UPDATES WERE SKIPPED"), "{out}");
    // The summary's configuration says what the run did with them.
    let summary = std::fs::read_to_string(tmp.path().join("cli/summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["config"]["on_nonfinite"], "skip");
    assert!(
        s.replica_hashes.iter().all(|&h| h == s.replica_hashes[0]),
        "replicas differ after skipped updates"
    );
}

#[test]
fn a_refused_comparison_leaves_no_directory_it_made() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::create_dir(t.join("a")).unwrap();
    // The default runs/comparison, runs/ included.
    let (code, _, err) = run_args(&owned(&["report", "a", "a"]), t);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the same run"), "{err}");
    assert!(!t.join("runs").exists());
    let (code, _, err) = run_args(&owned(&["report", "a", "b", "--out", "cmp"]), t);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not a run directory"), "{err}");
    assert!(!t.join("cmp").exists() && t.join("a").is_dir());
}
