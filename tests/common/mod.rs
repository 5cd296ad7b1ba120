//! Helpers shared by the multi-process tests (`tests/mpi.rs` on one host, `tests/cluster.rs`
//! across the hosts of `scripts/cluster.sh`): the small training run they all use, running it
//! as threads of one process, reading what a run left behind, and finding a rank's process.
// Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

use dptrain::train::checkpoint::Checkpoint;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_dptrain");

/// A small, fast run on the bundled MNIST; `extra` flags replace the defaults they name.
pub fn small(dir: &Path, extra: &[&str]) -> Vec<String> {
    let defaults = [
        ("--epochs", "2"),
        ("--train-limit", "1536"),
        ("--test-limit", "200"),
        ("--threads", "1"),
        ("--comm-timeout", "30"),
    ];
    let mut a = vec!["train".to_string(), "--quiet".into(), "--run-dir".into()];
    a.push(dir.display().to_string());
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            a.extend([flag.to_string(), value.to_string()]);
        }
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Stdout and stderr of a finished command.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The output of an mpirun that must have trained to the end: mpirun can refuse to start
/// (e.g. as root without `--allow-run-as-root`) and still exit 0, so this checks for rank 0's
/// result line too, and that only rank 0 printed one.
pub fn trained(o: &Output) -> String {
    let t = text(o);
    assert!(
        o.status.success() && t.contains("done:"),
        "mpirun failed:\n{t}"
    );
    assert_eq!(t.matches("done:").count(), 1, "only rank 0 prints: {t}");
    t
}

/// Trains `args` as worker threads of one process.
pub fn run_threads(args: &[String]) {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// Parameters, momentum and buffers of the last checkpoint (epoch 2) in `dir`, in name order.
pub fn weights(dir: &Path) -> Vec<(String, Vec<u32>)> {
    let ck = Checkpoint::load(&dir.join("checkpoint-epoch0002.safetensors")).unwrap();
    let mut names: Vec<_> = ck.tensors.keys().cloned().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let t = ck.tensors[&n].values();
            (n, t.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

/// The largest absolute difference between two checkpoints' weights (`weights`), checking
/// that both hold the same tensors and only finite values.
pub fn max_weight_diff(a: &[(String, Vec<u32>)], b: &[(String, Vec<u32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    for ((name, x), (other, y)) in a.iter().zip(b) {
        assert_eq!(name, other);
        for (u, v) in x.iter().zip(y) {
            let d = (f32::from_bits(*u) - f32::from_bits(*v)).abs();
            assert!(d.is_finite(), "{name} is not finite");
            worst = worst.max(d);
        }
    }
    worst
}

/// `summary.json` of the run in `dir`.
pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// The final weight hash of every worker of the run in `dir`.
pub fn replica_hashes(dir: &Path) -> Vec<u64> {
    summary(dir)["replica_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

/// Trains `comm` on 2 MPI ranks x 2 worker threads (`hierarchical`: auto, 2d, leader or off), launched by
/// `launch(ranks, args)` (which returns mpirun's output), and on 4 worker threads in one
/// process; checks that the 4 replicas of the MPI run agree and returns both run directories.
pub fn two_by_two_and_four_threads(
    tmp: &Path,
    comm: &str,
    hierarchical: &str,
    launch: &dyn Fn(usize, &[String]) -> String,
) -> (PathBuf, PathBuf) {
    let (mpi_dir, thr_dir) = (
        tmp.join(format!("{comm}-{hierarchical}")),
        tmp.join(format!("{comm}-{hierarchical}-t")),
    );
    // The same buckets for both: by default they follow the link each run plans for (between
    // processes, or in-process), and ring's chunks, so its sums, follow the buckets.
    let buckets = ["--bucket-kb", "32", "--first-bucket-kb", "32"];
    let mut args = small(&mpi_dir, &["--comm", comm, "--workers", "2"]);
    args.extend(["--hierarchical".into(), hierarchical.into()]);
    args.extend(buckets.map(String::from));
    launch(2, &args);
    // MPI_Allreduce has no in-process counterpart: its threads run redundant mode.
    let thr_comm = if comm == "mpi-native" {
        "redundant"
    } else {
        comm
    };
    let mut args = small(&thr_dir, &["--comm", thr_comm, "--workers", "4"]);
    args.extend(buckets.map(String::from));
    run_threads(&args);
    let h = replica_hashes(&mpi_dir);
    assert_eq!(h.len(), 4, "{comm}: one hash per worker of the run");
    assert!(
        h.iter().all(|&x| x == h[0]),
        "{comm}: replicas differ {h:x?}"
    );
    (mpi_dir, thr_dir)
}

/// Pid of MPI rank `rank` of the run whose environment carries `DPTRAIN_TEST_MARK=mark`
/// (pass it to the ranks with mpirun's `-x DPTRAIN_TEST_MARK`).
pub fn rank_pid(mark: &str, rank: usize) -> Option<u32> {
    let want = [
        format!("DPTRAIN_TEST_MARK={mark}"),
        format!("OMPI_COMM_WORLD_RANK={rank}"),
    ];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        want.iter()
            .all(|w| vars.contains(&w.as_bytes()))
            .then_some(pid)
    })
}

/// Waits until the run of `child` (marked `mark`) is training (its `metrics` file has a line)
/// and rank `rank` is running; returns that rank's pid. Panics with the run's output if that
/// takes over a minute.
pub fn when_training(child: Child, metrics: &Path, mark: &str, rank: usize) -> (Child, u32) {
    let started = Instant::now();
    loop {
        let going = std::fs::metadata(metrics).is_ok_and(|m| m.len() > 0);
        match rank_pid(mark, rank) {
            Some(pid) if going => return (child, pid),
            _ if started.elapsed() > Duration::from_secs(60) => {
                panic!(
                    "the run did not start: {}",
                    text(&child.wait_with_output().unwrap())
                )
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Launches rank 0 with `--batch 64` and rank 1 with `--batch 32` through `mpirun` (one
/// `-np 1` app context each) and checks that both ranks stop, naming the difference, before
/// training. Returns the output.
pub fn assert_config_mismatch_stops_both_ranks(mut mpirun: Command, dir: &Path) -> Output {
    let a = small(dir, &["--transport", "mpi", "--batch", "64"]);
    let b = small(dir, &["--transport", "mpi", "--batch", "32"]);
    let o = mpirun
        .args(["-np", "1", BIN])
        .args(&a)
        .arg(":")
        .args(["-np", "1", BIN])
        .args(&b)
        .output()
        .unwrap();
    let t = text(&o);
    for rank in 0..2 {
        let want = format!("error: rank {rank} of 2: the MPI ranks disagree");
        assert!(t.contains(&want), "no '{want}' in:\n{t}");
    }
    assert!(t.contains("global batch (rank 0: 64, rank 1: 32)"), "{t}");
    assert!(!t.contains("done:"), "{t}");
    o
}

/// Runs `cmd` (every signal at its default action, or SIGHUP ignored when `nohup`: the test
/// harness may have been started ignoring some) and sends it `signal` once `begun` holds
/// (polled every millisecond); how it ended, or `None` when it ended before the signal could
/// take effect (it was too fast for the check: give it more work). The command is stopped
/// (SIGSTOP) while `begun` is checked again and the signal sent, then continued, so the signal
/// certainly lands while `begun` holds (an ignored one too, which leaves no other trace).
pub fn signalled_when(
    mut cmd: Command,
    begun: impl Fn() -> bool,
    signal: libc::c_int,
    nohup: bool,
) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::CommandExt;
    cmd.stderr(std::process::Stdio::null());
    // SAFETY: only signal(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            if nohup {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    while !begun() {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(started.elapsed().as_secs() < 60, "it never began");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = child.id() as libc::pid_t;
    // SAFETY (each): kill(2) on our own child, not yet reaped (a zombie at worst).
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Stopped, or ended before the stop (a stopped child is not reaped by try_wait; a reaped
    // one's pid is no longer ours to signal).
    let ended = child.try_wait().unwrap().is_some();
    let still = !ended && begun();
    if still {
        unsafe { libc::kill(pid, signal) };
    }
    if !ended {
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let status = child.wait().unwrap();
    // Done before the signal could land: said nothing about it.
    still.then_some(status)
}
