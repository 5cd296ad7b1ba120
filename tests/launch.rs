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
/// one that runs locally but reaches no host still loses the hosts.
#[test]
fn an_mpirun_that_runs_nothing_is_named_not_blamed_on_the_hosts() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "localhost slots=1\n").unwrap();
    let script = |name: &str, body: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let refuses = script(
        "refusing-mpirun",
        "echo '-----'\necho 'mpirun has detected an attempt to run as root.' >&2\nexit 1",
    );
    // Runs `true` on this machine, fails anything else: the hosts do not answer.
    let local_only = script(
        "local-only-mpirun",
        "for a; do last=$a; done\n[ \"$last\" = true ] && exit 0\nexit 1",
    );
    for (mpirun, says, not) in [
        (
            &refuses,
            "cannot run a process even on this machine (exit status: 1), so no host is to \
             blame: mpirun has detected an attempt to run as root.",
            "lost",
        ),
        (
            &local_only,
            "host localhost (rank 0) lost while the job started",
            "cannot run a process",
        ),
    ] {
        let run = tmp.path().join(format!("run-{}", mpirun.len()));
        let o = Command::new(BIN)
            .arg("launch")
            .arg("--run-dir")
            .arg(&run)
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
