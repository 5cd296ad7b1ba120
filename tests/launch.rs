//! `dptrain launch` refuses what it cannot run before it starts any job, naming the cause
//! (the elastic runs themselves are in `tests/cluster.rs`, on a cluster of namespaces).

mod common;

use common::{text, BIN};
use std::process::Command;

#[test]
fn launch_refuses_bad_hostfiles_owned_flags_and_impossible_options() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "10.0.0.1 slots=1\n10.0.0.2\n").unwrap();
    let bad = tmp.path().join("bad-hosts");
    std::fs::write(&bad, "10.0.0.1 slots=two\n").unwrap();
    let run = tmp.path().join("run");
    let h = hosts.display().to_string();
    let b = bad.display().to_string();
    let cases: [(Vec<&str>, &str); 9] = [
        (vec!["--hostfile", &b], "line 1"),
        (vec!["--hostfile", "/no/such/hosts"], "/no/such/hosts"),
        (
            vec!["--hostfile", &h, "--", "train", "--resume", "x"],
            "--resume is set by dptrain launch",
        ),
        (
            vec!["--hostfile", &h, "--", "--run-dir=x"],
            "--run-dir is set by dptrain launch",
        ),
        // A heartbeat's rank names its host only under launch's own mapping.
        (
            vec![
                "--hostfile",
                &h,
                "--listen",
                "10.0.0.9",
                "--mpirun",
                "mpirun --map-by node",
            ],
            "--map-by is set by dptrain launch",
        ),
        (
            vec![
                "--hostfile",
                &h,
                "--listen",
                "10.0.0.9",
                "--mpirun",
                "mpirun --rank-by=node",
            ],
            "--rank-by is set by dptrain launch",
        ),
        (vec!["--hostfile", &h, "--min-hosts", "0"], "--min-hosts 0"),
        (
            vec!["--hostfile", &h, "--heartbeat-timeout", "0.1"],
            "--heartbeat-timeout",
        ),
        // Heartbeats from 10.0.0.1 cannot reach this machine's loopback.
        (
            vec!["--hostfile", &h],
            "--listen 127.0.0.1 is this machine's loopback",
        ),
    ];
    for (args, says) in cases {
        let o = Command::new(BIN)
            .arg("launch")
            .arg("--run-dir")
            .arg(&run)
            .args(&args)
            .output()
            .unwrap();
        let t = text(&o);
        assert!(!o.status.success() && t.contains(says), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
}

/// An mpirun that runs nothing at all (here a stand-in that refuses as OpenMPI does for root
/// without its consent) is named with its own words, not taken for every host being lost;
/// one that runs locally but reaches no host, or fails locally in other words than for the
/// hosts (this machine outside a batch allocation), still loses the hosts, each named with
/// its probe's words.
#[test]
fn an_mpirun_that_runs_nothing_is_named_not_blamed_on_the_hosts() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "localhost slots=1\n").unwrap();
    // Run as `sh FILE` (an --mpirun of two words): a script written and exec'd at once by a
    // threaded test can fail with "Text file busy".
    let script = |name: &str, body: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, format!("{body}\n")).unwrap();
        format!("sh {}", p.display())
    };
    let refuses = script(
        "refusing-mpirun",
        "echo '-----'\necho 'mpirun has detected an attempt to run as root.' >&2\nexit 1",
    );
    // The last word is the program: `true` for the check on this machine.
    let last = "for a; do last=$a; done";
    let local_only = script(
        "local-only-mpirun",
        &format!("{last}\n[ \"$last\" = true ] && exit 0\necho 'ssh: no route' >&2\nexit 1"),
    );
    let not_here = script(
        "not-here-mpirun",
        &format!(
            "{last}\n[ \"$last\" = true ] && echo 'not in the allocation' >&2 && exit 1\n\
             echo 'ssh: no route' >&2\nexit 1"
        ),
    );
    let lost = "host localhost (rank 0) lost while the job started: it does not answer (its \
                probe: ssh: no route)";
    for (i, (mpirun, says, not)) in [
        (
            &refuses,
            "cannot run a process even on this machine (exit status: 1), and says the same \
             for every host, so no host is to blame; mend what it says and launch again. It \
             says: mpirun has detected an attempt to run as root.",
            "lost",
        ),
        (&local_only, lost, "cannot run a process"),
        (&not_here, lost, "cannot run a process"),
    ]
    .into_iter()
    .enumerate()
    {
        let o = Command::new(BIN)
            .arg("launch")
            .arg("--run-dir")
            .arg(tmp.path().join(format!("run-{i}")))
            .arg("--hostfile")
            .arg(&hosts)
            .args(["--mpirun", mpirun, "--", "--dataset", "synthetic:1x8x8"])
            .output()
            .unwrap();
        let t = text(&o);
        assert!(!o.status.success() && t.contains(says), "{mpirun}: {t}");
        assert!(!t.contains(not) && !t.contains("panicked"), "{mpirun}: {t}");
    }
}

/// A launch whose job failed before any restart point (a mistyped train option) leaves only
/// its report, `elastic.json`: the corrected launch clears it (it was refused as another
/// run's file, and launch's jobs cannot be given --overwrite); other files are cleared only by
/// launch's own `--overwrite`, and a launch that started no job leaves nothing.
#[test]
fn a_failed_launch_does_not_lock_the_corrected_one_out_of_its_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "localhost slots=1\n").unwrap();
    // A stand-in mpirun: the checks on this machine (program `true`, and the binary's
    // version) pass; a job writes its arguments down and fails.
    let args_file = tmp.path().join("job-args");
    let mpirun = tmp.path().join("mpirun");
    std::fs::write(
        &mpirun,
        format!(
            "for a; do prev=$last; last=$a; done\n[ \"$last\" = true ] && exit 0\n\
             [ \"$last\" = --version ] && exec \"$prev\" --version\necho \"$@\" > {}\nexit 1\n",
            args_file.display()
        ),
    )
    .unwrap();
    let mpirun = format!("sh {}", mpirun.display());
    let run_dir = tmp.path().join("run");
    let launch = |extra: &[&str]| {
        let o = Command::new(BIN)
            .arg("launch")
            .arg("--run-dir")
            .arg(&run_dir)
            .arg("--hostfile")
            .arg(&hosts)
            .args(["--max-restarts", "0", "--mpirun", &mpirun])
            .args(extra)
            .args(["--", "--dataset", "synthetic:1x8x8"])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{}", text(&o));
        assert!(!text(&o).contains("panicked"), "{}", text(&o));
        std::fs::read_to_string(&args_file).unwrap_or_default()
    };
    // Below --min-hosts: no job, so no report either.
    launch(&["--min-hosts", "2"]);
    assert!(!run_dir.join("elastic.json").exists());
    let first = launch(&[]);
    assert!(!first.contains("--overwrite"), "{first}");
    assert!(run_dir.join("elastic.json").is_file());
    let again = launch(&[]);
    assert!(again.contains("--overwrite"), "{again}");
    // Another run's metrics beside it: kept, unless launch is given --overwrite.
    std::fs::write(run_dir.join("metrics.jsonl"), "").unwrap();
    assert!(!launch(&[]).contains("--overwrite"));
    assert!(launch(&["--overwrite"]).contains("--overwrite"));
}

/// A signal that ends `dptrain launch` stops its job first (here a stand-in mpirun that would
/// run for a minute) and removes the job's files: nothing is left running unsupervised. Ctrl-C
/// (SIGINT to launch's whole process group) does not reach the job directly: launch stops it
/// with SIGTERM, which a real mpirun passes on to its ranks and waits for.
#[test]
fn a_signalled_launch_stops_its_job_and_removes_its_files() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "localhost slots=1\n").unwrap();
    for (i, (signal, group)) in [(libc::SIGTERM, false), (libc::SIGINT, true)]
        .into_iter()
        .enumerate()
    {
        let scratch = tmp.path().join(format!("tmp-{i}"));
        std::fs::create_dir(&scratch).unwrap();
        let pid_file = tmp.path().join(format!("job-{i}.pid"));
        let got = tmp.path().join(format!("job-{i}.signal"));
        let job = tmp.path().join(format!("long-mpirun-{i}"));
        std::fs::write(
            &job,
            format!(
                "trap 'echo TERM > {got}; kill $s; exit 0' TERM\n\
                 trap 'echo INT > {got}; kill $s; exit 0' INT\n\
                 sleep 60 & s=$!\necho $$ > {pid}\nwait\n",
                got = got.display(),
                pid = pid_file.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("launch")
            .arg("--run-dir")
            .arg(tmp.path().join(format!("run-{i}")))
            .arg("--hostfile")
            .arg(&hosts)
            .args(["--mpirun", &format!("sh {}", job.display())])
            .args(["--", "--dataset", "synthetic:1x8x8"])
            .env("TMPDIR", &scratch)
            .stderr(std::process::Stdio::null())
            // A group of its own, as a shell gives a foreground command.
            .process_group(0);
        // SAFETY: only signal(2), async-signal-safe, between fork and exec (the harness may
        // have been started ignoring SIGINT).
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut launch = cmd.spawn().unwrap();
        let started = std::time::Instant::now();
        let job_pid: i32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break pid;
            }
            assert!(started.elapsed().as_secs() < 30, "the job never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let to = launch.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child (or its process group), not yet reaped.
        unsafe { libc::kill(if group { -to } else { to }, signal) };
        let status = launch.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "{status}");
        assert!(
            started.elapsed().as_secs() < 20,
            "launch took the job's minute"
        );
        // SAFETY: kill(2) with signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(job_pid, 0) } == 0;
        assert!(!alive, "the job (pid {job_pid}) outlived launch");
        let how = std::fs::read_to_string(&got).unwrap_or_default();
        assert_eq!(how.trim(), "TERM", "the job was not stopped by launch");
        let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().collect();
        assert!(left.is_empty(), "job files left: {left:?}");
    }
}
