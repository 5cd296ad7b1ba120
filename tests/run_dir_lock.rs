//! Issue 21, rows 8, 9 and 12 and the resume messages: a run directory belongs to one run at a
//! time (a second run on it is refused naming the first's pid), `metrics.jsonl` never holds a
//! torn line (a full disk stops the run at the first line that does not fit, naming
//! `metrics.jsonl`; a resumed run trims a torn last line), and only dptrain's own temporary
//! files are deleted from a run directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

mod common;
use common::{text, BIN};
use std::time::{Duration, Instant};

fn dptrain(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A short training run on synthetic data into `run_dir` (relative to the cwd), with `extra`
/// (256 training images unless `extra` gives `--train-limit`).
fn train_args<'a>(run_dir: &'a str, epochs: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "train",
        "--dataset",
        "synthetic",
        "--run-dir",
        run_dir,
        "--epochs",
        epochs,
        "--test-limit",
        "64",
        "--threads",
        "1",
    ];
    if !extra.contains(&"--train-limit") {
        a.extend(["--train-limit", "256"]);
    }
    a.extend_from_slice(extra);
    a
}

/// `dptrain` of `args` started in `cwd`, running on: its stderr piped, its stdout dropped.
fn spawn_run(args: &[&str], cwd: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn no_panic(o: &Output) {
    let all = text(o);
    assert!(
        !all.contains("panicked") && !all.contains("RUST_BACKTRACE"),
        "a panic: {all}"
    );
}

/// The output of a run refused with an error (exit 1, no panic).
fn refused(o: &Output) -> String {
    let all = text(o);
    no_panic(o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    all
}

/// The epoch lines of a run directory's `metrics.jsonl`, each line parsed (a torn line fails).
fn metrics_lines(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "metrics.jsonl ends in a partial line: {:?}",
        &text[text.len().saturating_sub(80)..]
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect()
}

fn epochs_of(lines: &[serde_json::Value]) -> Vec<u64> {
    lines
        .iter()
        .filter(|l| l["kind"] == "epoch")
        .map(|l| l["epoch"].as_u64().unwrap())
        .collect()
}

/// Sends `signal` to the child.
fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({}, {signal})", child.id());
}

/// Waits until the run directory's lock file names `pid` (the run holds the lock); fails the
/// test if the run ends first or nothing happens for 60 s (a hang).
fn wait_for_lock(child: &mut Child, lock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = std::fs::read_to_string(lock)
            .is_ok_and(|t| t.contains(&format!("pid={}\n", child.id())) && t.ends_with('\n'));
        if held {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the first run ended ({status}) before its lock was seen: give it more steps");
        }
        assert!(Instant::now() < deadline, "no lock file after 60 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Row 8: two runs on one new directory. The first holds the directory's lock for its whole
/// run; it is paused (SIGSTOP) while the second tries, so the order is certain: the second is
/// refused at once (exit 1) naming the first's pid, also with `--overwrite` (which deletes
/// nothing of the live run) and `--resume`; `report` on it warns that the run is still going.
/// The first completes with exactly its own two epoch lines and summary.
#[test]
fn a_second_run_on_a_locked_run_directory_is_refused_naming_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let same = ["--train-limit", "4096", "--seed", "1"];
    // A checkpoint of the same run, for a resumed run into X to try.
    let o = dptrain(&train_args("W", "1", &same), cwd);
    assert!(o.status.success(), "{}", text(&o));
    let first_args = train_args("X", "2", &same);
    let mut first = spawn_run(&first_args, cwd);
    let lock = cwd.join("X/.dptrain-lock");
    wait_for_lock(&mut first, &lock);
    signal(&first, libc::SIGSTOP);
    let pid = first.id();
    let in_use = format!("run directory X is in use by dptrain pid {pid} (started ");
    for extra in [
        &["--seed", "2"][..],
        &["--seed", "2", "--overwrite"][..],
        &[
            "--train-limit",
            "4096",
            "--seed",
            "1",
            "--resume",
            "W/checkpoint-epoch0001.safetensors",
        ][..],
    ] {
        let second = dptrain(&train_args("X", "2", extra), cwd);
        let all = text(&second);
        no_panic(&second);
        assert_eq!(second.status.code(), Some(1), "{extra:?}: {all}");
        assert!(all.contains(&in_use), "{extra:?}: {all}");
        assert!(
            all.contains("wait for it, or give another --run-dir"),
            "{extra:?}: {all}"
        );
    }
    let report = dptrain(&["report", "X"], cwd);
    assert!(
        text(&report).contains(&format!("X is still being written by dptrain pid {pid} ")),
        "{}",
        text(&report)
    );
    signal(&first, libc::SIGCONT);
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let dir = cwd.join("X");
    assert_eq!(epochs_of(&metrics_lines(&dir)), [1, 2]);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["config"]["seed"], 1);
    assert_eq!(summary["epochs"].as_array().unwrap().len(), 2);
    assert!(!lock.exists(), "the lock file outlived its run");
    // Released: the directory is the finished run's, refused as such (not as in use).
    let again = dptrain(&train_args("X", "2", &[]), cwd);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again).contains("holds the files of another run"),
        "{}",
        text(&again)
    );
}

/// Row 8 without `--run-dir`: a run whose default directory is locked by a live run goes to
/// the next numbered one instead, and says so.
#[test]
fn a_default_run_directory_in_use_moves_the_new_run_to_a_numbered_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let args = |limit: &'static str| {
        vec![
            "train",
            "--dataset",
            "synthetic",
            "--epochs",
            "1",
            "--train-limit",
            limit,
            "--test-limit",
            "64",
            "--threads",
            "1",
        ]
    };
    let mut first = Command::new(BIN)
        .args(args("4096"))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_lock(&mut first, &cwd.join("runs/lenet5-synthetic/.dptrain-lock"));
    signal(&first, libc::SIGSTOP);
    let second = dptrain(&args("256"), cwd);
    signal(&first, libc::SIGCONT);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains("this run writes to runs/lenet5-synthetic-2"),
        "{}",
        text(&second)
    );
    assert!(first.wait().unwrap().success());
    assert_eq!(
        epochs_of(&metrics_lines(&cwd.join("runs/lenet5-synthetic"))),
        [1]
    );
    assert_eq!(
        epochs_of(&metrics_lines(&cwd.join("runs/lenet5-synthetic-2"))),
        [1]
    );
}

/// A tmpfs of `size` mounted at a new directory under `parent`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(parent: &Path, size: &str) -> Self {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "this test mounts a small tmpfs to fill it (issue 21 row 9): run the suite as root"
        );
        let at = parent.join("small");
        std::fs::create_dir(&at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("cannot run mount(8)");
        assert!(status.success(), "mount -t tmpfs failed ({status})");
        Self(at)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Row 9: a run directory on a nearly full 200 KiB tmpfs with a metrics line every step. The
/// run stops at the first line that does not fit (exit 1, the error names `metrics.jsonl` and
/// the cause), every line left is whole, and no summary is written after it.
#[test]
fn a_full_disk_stops_the_run_at_the_first_metrics_line_and_leaves_no_torn_line() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(tmp.path(), "200k");
    // Leaves 12 KiB: about 45 step lines; the run would write 64 and an epoch line.
    std::fs::write(fs.0.join("filler"), vec![0u8; 188 * 1024]).unwrap();
    let run_dir = fs.0.join("run");
    let run_dir_arg = run_dir.to_str().unwrap();
    let extra = [
        "--train-limit",
        "4096",
        "--log-every",
        "1",
        "--no-checkpoints",
    ];
    let o = dptrain(&train_args(run_dir_arg, "1", &extra), tmp.path());
    let all = text(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    let error = all.lines().find(|l| l.starts_with("error: ")).unwrap_or("");
    assert!(
        error.contains("metrics.jsonl: No space left on device")
            && error.contains("the run stopped at this line"),
        "{all}"
    );
    let lines = metrics_lines(&run_dir);
    assert!(
        !lines.is_empty() && lines.len() < 64,
        "{} lines: the run did not stop at the first failed line",
        lines.len()
    );
    assert!(!run_dir.join("summary.json").exists());
    drop(fs);
}

/// A checkpoint that does not fit stops the run naming the newest restart point, which is
/// whole: the one of the epoch before.
#[test]
fn a_checkpoint_that_does_not_fit_names_the_restart_point_to_continue_from() {
    let tmp = tempfile::tempdir().unwrap();
    // A checkpoint of this run is 358 KB: one fits, a second (written beside) does not.
    let fs = Tmpfs::mount(tmp.path(), "600k");
    let run_dir = fs.0.join("run");
    let run_dir_arg = run_dir.to_str().unwrap();
    let o = dptrain(&train_args(run_dir_arg, "3", &[]), tmp.path());
    let all = text(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    let error = all.lines().find(|l| l.starts_with("error: ")).unwrap_or("");
    let first = run_dir.join("checkpoint-epoch0001.safetensors");
    assert!(
        error.contains("checkpoint-epoch0002") && error.contains("No space left"),
        "{all}"
    );
    assert!(
        error.contains(&format!("continue with --resume {}", first.display())),
        "{all}"
    );
    assert!(dptrain::train::checkpoint::Checkpoint::load(&first).is_ok());
    drop(fs);
}

/// A resume from an earlier point that stops before its first restart point names where it
/// continues from, not a restart point it abandons (the commit past the resumed step, which
/// stays until this run writes one and was named as the newest).
#[test]
fn a_resume_that_stops_early_names_its_own_restart_point_not_an_abandoned_one() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let args = ["--commit-every", "1", "--keep-commits", "1"];
    let o = dptrain(&train_args(whole.to_str().unwrap(), "2", &args), tmp.path());
    assert!(o.status.success(), "{}", text(&o));
    // Epoch 1's checkpoint and a commit of epoch 2 (4 steps an epoch): 2 of 358 KB, room for
    // no third, which the resume's epoch checkpoint needs.
    let fs = Tmpfs::mount(tmp.path(), "900k");
    let run_dir = fs.0.join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let first = run_dir.join("checkpoint-epoch0001.safetensors");
    std::fs::copy(whole.join("checkpoint-epoch0001.safetensors"), &first).unwrap();
    let commit = "commit-step000000007.safetensors";
    std::fs::copy(whole.join(commit), run_dir.join(commit)).unwrap();
    let resume = ["--resume", first.to_str().unwrap(), "--commit-every", "0"];
    let o = dptrain(
        &train_args(run_dir.to_str().unwrap(), "2", &resume),
        tmp.path(),
    );
    let all = text(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    let error = all.lines().find(|l| l.starts_with("error: ")).unwrap_or("");
    assert!(error.contains("No space left"), "{all}");
    assert!(
        error.contains(&format!("continue with --resume {}", first.display())),
        "{all}"
    );
    // Not removed either: the resume wrote no restart point to supersede it.
    assert!(run_dir.join(commit).is_file());
    drop(fs);
}

/// Row 9's other half: `--resume` in a directory whose `metrics.jsonl` ends in a torn line
/// (what a crash mid-append of an older dptrain left) cuts it off with a warning, so the
/// resumed run's lines start on lines of their own.
#[test]
fn a_resumed_run_trims_a_torn_last_metrics_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let o = dptrain(&train_args("Z", "1", &[]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    let metrics = cwd.join("Z/metrics.jsonl");
    let mut torn = std::fs::read(&metrics).unwrap();
    torn.extend_from_slice(b"{\"kind\":\"step\",\"ep");
    std::fs::write(&metrics, torn).unwrap();
    let resume = ["--resume", "Z/checkpoint-epoch0001.safetensors"];
    let o = dptrain(&train_args("Z", "2", &resume), cwd);
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(
        all.contains("warning: Z/metrics.jsonl ended in a partial line (18 bytes"),
        "{all}"
    );
    assert_eq!(epochs_of(&metrics_lines(&cwd.join("Z"))), [1, 2]);
}

/// A pid no process has now (for a temporary file "left by a killed run").
fn dead_pid() -> u32 {
    (99_999..)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
}

/// Row 12: a user's file that looks like an old-style temporary name survives a run (also
/// with `--quiet` and `--overwrite`); dptrain's own temporary file of a dead process is
/// removed, one of a live process is not.
#[test]
fn only_dptrains_own_temporary_files_are_removed_from_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("Y");
    std::fs::create_dir(&dir).unwrap();
    let dead = dead_pid();
    let users = [
        "thesis.99999.0.tmp",
        "summary.json.99999.0.tmp",
        ".dptrain-tmp-x.1",
    ];
    for name in users {
        std::fs::write(dir.join(name), "mine").unwrap();
    }
    let stale = format!(".dptrain-tmp-summary.json.{dead}.0");
    std::fs::write(dir.join(&stale), "stale").unwrap();
    // This test's own pid: a live process, whose temporary file is still being written.
    let live = format!(".dptrain-tmp-summary.json.{}.0", std::process::id());
    std::fs::write(dir.join(&live), "live").unwrap();
    for extra in [&["--quiet"][..], &["--quiet", "--overwrite"][..]] {
        let o = dptrain(&train_args("Y", "1", extra), tmp.path());
        assert!(o.status.success(), "{}", text(&o));
        for name in users.iter().chain([&live.as_str()]) {
            assert!(dir.join(name).exists(), "{name} was deleted ({extra:?})");
        }
        assert!(!dir.join(&stale).exists(), "{stale} was left");
    }
    // A user's file with the lock's name is not emptied, taken or removed: refused by name.
    std::fs::write(dir.join(".dptrain-lock"), "my notes").unwrap();
    let o = dptrain(
        &train_args("Y", "1", &["--quiet", "--overwrite"]),
        tmp.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(".dptrain-lock") && err.contains("not a run directory's lock"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(".dptrain-lock")).unwrap(),
        "my notes"
    );
    std::fs::remove_file(dir.join(".dptrain-lock")).unwrap();
    // No temporary file of the runs themselves is left, under any name.
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".dptrain-") && *n != live && n != ".dptrain-tmp-x.1")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The resume messages: `--resume CKPT` without `--run-dir` continues in the checkpoint's own
/// directory and says so; a checkpoint of another model names the `--model` its run was given
/// (the model file's path, not the `name` inside it).
#[test]
fn resume_continues_in_the_checkpoints_directory_and_names_its_model_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let model = cwd.join("mynet.toml");
    let lenet = include_str!("../src/model/builtin/lenet5.toml");
    std::fs::write(&model, lenet.replace("name = \"lenet5\"", "name = \"net\"")).unwrap();
    let o = dptrain(&train_args("Z", "1", &["--model", "mynet.toml"]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    // No --run-dir: continues in Z, not in runs/net-synthetic.
    let mut resume = train_args("Z", "2", &["--model", "mynet.toml"]);
    resume.drain(3..5);
    resume.extend(["--resume", "Z/checkpoint-epoch0001.safetensors"]);
    let o = dptrain(&resume, cwd);
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("note: --resume: continuing in Z\n"), "{all}");
    assert!(cwd.join("Z/checkpoint-epoch0002.safetensors").is_file());
    assert!(!cwd.join("runs").exists(), "{all}");
    assert_eq!(epochs_of(&metrics_lines(&cwd.join("Z"))), [1, 2]);
    // Another model: the message gives the model file the checkpoint's run was given.
    let mut other = train_args("Z", "3", &["--model", "lenet5"]);
    other.extend(["--resume", "Z/checkpoint-epoch0002.safetensors"]);
    let o = dptrain(&other, cwd);
    let all = text(&o);
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(
        all.contains(
            "the checkpoint is for model 'net', not 'lenet5': resume with --model mynet.toml"
        ),
        "{all}"
    );
}

/// `--resume` without `--run-dir` continues in the checkpoint's directory; when that cannot be
/// written (read-only, or here a directory where the lock file goes), the refusal says to give
/// one.
#[test]
fn a_resume_beside_a_checkpoint_that_cannot_be_written_says_to_give_a_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let o = dptrain(&train_args("Z", "1", &[]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::create_dir(cwd.join("Z/.dptrain-lock")).unwrap();
    let mut args = train_args(
        "Z",
        "2",
        &["--resume", "Z/checkpoint-epoch0001.safetensors"],
    );
    let at = args.iter().position(|a| *a == "--run-dir").unwrap();
    args.drain(at..at + 2);
    let all = refused(&dptrain(&args, cwd));
    assert!(
        all.contains("--resume continues in the checkpoint's directory Z")
            && all.contains("give --run-dir"),
        "{all}"
    );
}

/// `--resume A/CKPT --run-dir B`: B may hold the same run (resumed there before), never
/// another's, whose metrics and checkpoints the continued run would mix with its own (a
/// tester's vgg-small epoch 1 followed by lenet5's epoch 2 in one `metrics.jsonl`).
#[test]
fn resume_into_another_runs_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let o = dptrain(&train_args("A", "1", &[]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    let o = dptrain(&train_args("B", "1", &["--seed", "7"]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    let before = std::fs::read(cwd.join("B/metrics.jsonl")).unwrap();
    let resume = |dir: &'static str| {
        let mut a = train_args(dir, "2", &[]);
        a.extend(["--resume", "A/checkpoint-epoch0001.safetensors"]);
        dptrain(&a, cwd)
    };
    let all = refused(&resume("B"));
    assert!(
        all.contains("holds the files of another run than A/checkpoint-epoch0001")
            && all.contains("leave --run-dir out"),
        "{all}"
    );
    assert_eq!(std::fs::read(cwd.join("B/metrics.jsonl")).unwrap(), before);
    assert!(
        all.contains("pass --overwrite to delete them first"),
        "{all}"
    );
    // The same data, batch and seed at another learning rate is another run too.
    let o = dptrain(&train_args("L", "3", &["--lr", "0.01"]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    let said = refused(&resume("L"));
    assert!(said.contains("holds the files of another run"), "{said}");
    assert!(cwd.join("L/checkpoint-epoch0003.safetensors").is_file());
    // --overwrite into the checkpoint's own directory (given, or taken without --run-dir)
    // would delete the run being continued: refused, A kept.
    let ck_before = std::fs::read(cwd.join("A/checkpoint-epoch0001.safetensors")).unwrap();
    for dir in [Some("A"), Some("./A/"), None] {
        let mut a = train_args(dir.unwrap_or("X"), "2", &["--overwrite"]);
        if dir.is_none() {
            let at = a.iter().position(|x| *x == "--run-dir").unwrap();
            a.drain(at..at + 2);
        }
        a.extend(["--resume", "A/checkpoint-epoch0001.safetensors"]);
        let said = refused(&dptrain(&a, cwd));
        assert!(
            said.contains("those are the run being continued"),
            "{dir:?}: {said}"
        );
    }
    assert_eq!(
        std::fs::read(cwd.join("A/checkpoint-epoch0001.safetensors")).unwrap(),
        ck_before
    );
    // --overwrite into another run's directory replaces its files, as a new run's does.
    let mut a = train_args("B", "2", &["--overwrite"]);
    a.extend(["--resume", "A/checkpoint-epoch0001.safetensors"]);
    let o = dptrain(&a, cwd);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(epochs_of(&metrics_lines(&cwd.join("B"))), [2]);
    let b1 = dptrain::train::checkpoint::Checkpoint::load(
        &cwd.join("B/checkpoint-epoch0002.safetensors"),
    )
    .unwrap();
    assert_eq!(
        b1.state.run.unwrap().seed,
        1,
        "B now holds A's run (seed 1), not B's (7)"
    );
    assert!(!cwd.join("B/checkpoint-epoch0001.safetensors").exists());
    // Into a new directory, then again into it (it holds the same run now).
    let o = resume("C");
    assert!(o.status.success(), "{}", text(&o));
    let o = resume("C");
    assert!(o.status.success(), "{}", text(&o));
    // C holds the run now: the epoch trained again supersedes its line, as in the run's own
    // directory (it was appended after it before).
    assert_eq!(epochs_of(&metrics_lines(&cwd.join("C"))), [2]);
    // A continuation without checkpoints, run again; one with changed options
    // (--resume-changed), run again: each finds its own run there.
    for extra in [
        &["--no-checkpoints"][..],
        &["--resume-changed", "--batch", "32"],
    ] {
        for _ in 0..2 {
            let mut a = train_args("D", "2", extra);
            a.extend(["--resume", "A/checkpoint-epoch0001.safetensors"]);
            let o = dptrain(&a, cwd);
            assert!(o.status.success(), "{extra:?}: {}", text(&o));
        }
        std::fs::remove_dir_all(cwd.join("D")).unwrap();
    }
}

/// A run that a signal ends before it wrote anything leaves no run directory: the one it made
/// held only its lock file, which the signal's clean-up removes as the run's end would.
#[test]
fn a_run_signalled_before_its_first_file_leaves_no_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let run = cwd.join("new");
    let lock = run.join(".dptrain-lock");
    let mut child = Command::new(BIN)
        .args(train_args(
            "new",
            "1",
            &[
                "--train-limit",
                "4096",
                "--link-bandwidth",
                "1Mbit",
                "--workers",
                "2",
            ],
        ))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_lock(&mut child, &lock);
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    // The lock file is gone; the directory too, unless the run had written a file there.
    assert!(!lock.exists());
    if let Ok(entries) = std::fs::read_dir(&run) {
        assert!(entries.count() > 0, "an empty run directory left");
    }
}

/// `--resume` of a checkpoint kept outside a run directory, with no `--run-dir`, goes to a free
/// default directory as a new run does, never into the default one holding another run.
#[test]
fn a_resume_of_a_checkpoint_kept_elsewhere_takes_a_free_default_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut first = train_args("X", "1", &[]);
    first.drain(3..5);
    let o = dptrain(&first, cwd);
    assert!(o.status.success(), "{}", text(&o));
    let taken = cwd.join("runs/lenet5-synthetic");
    let before = std::fs::read(taken.join("metrics.jsonl")).unwrap();
    let o = dptrain(&train_args("Y", "1", &["--seed", "7"]), cwd);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::create_dir(cwd.join("odd")).unwrap();
    std::fs::copy(
        cwd.join("Y/checkpoint-epoch0001.safetensors"),
        cwd.join("odd/other.bin"),
    )
    .unwrap();
    let mut resume = train_args("X", "2", &["--seed", "7", "--resume", "odd/other.bin"]);
    resume.drain(3..5);
    let o = dptrain(&resume, cwd);
    assert!(o.status.success(), "{}", text(&o));
    assert!(cwd
        .join("runs/lenet5-synthetic-2/checkpoint-epoch0002.safetensors")
        .is_file());
    assert_eq!(std::fs::read(taken.join("metrics.jsonl")).unwrap(), before);
}

/// Ctrl-C in a run says how to continue it: the command that resumes its newest restart point,
/// which, given nothing else, continues the same run to its end.
#[test]
fn an_interrupted_run_names_the_command_that_continues_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // 64 steps of about 0.2 s each on the emulated link: running for seconds after its first
    // commit.
    let args = train_args(
        "R",
        "1",
        &[
            "--train-limit",
            "4096",
            "--commit-every",
            "2",
            "--workers",
            "2",
            "--link-bandwidth",
            "10Mbit",
        ],
    );
    let mut child = spawn_run(&args, cwd);
    let deadline = Instant::now() + Duration::from_secs(60);
    let committed = || {
        std::fs::read_dir(cwd.join("R")).is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|e| {
                dptrain::train::commit::commit_step(&e.file_name().to_string_lossy()).is_some()
            })
        })
    };
    while !committed() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before its first commit"
        );
        assert!(Instant::now() < deadline, "no commit after 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&child, libc::SIGINT);
    let o = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGINT), "{}", text(&o));
    let said = text(&o);
    let command = said
        .split_once("`dptrain train --resume ")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(path, _)| path.to_string())
        .unwrap_or_else(|| panic!("no resume command said: {said}"));
    assert!(command.starts_with("R/commit-step"), "{said}");
    let o = dptrain(&["train", "--resume", &command], cwd);
    assert!(
        o.status.success() && text(&o).contains("done:"),
        "{}",
        text(&o)
    );
    assert!(cwd.join("R/checkpoint-epoch0001.safetensors").is_file());
}
