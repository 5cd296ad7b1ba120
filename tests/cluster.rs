//! Multi-host training over TCP: each test brings up its own cluster of network namespaces
//! with `scripts/cluster.sh` (unique names, so tests never share one), runs `mpirun` across its
//! hosts (TCP only, no shared memory), and takes the cluster down again when it ends, also when
//! it fails (a guard's `Drop`).
//!
//! They need root (namespaces, veth pairs, tc). Where they cannot run they fail and say why;
//! outside CI, `DPTRAIN_SKIP_CLUSTER_TESTS=1` turns that into a loud skip instead. CI runs as
//! root, and there the skip is refused.
#![cfg(feature = "mpi")]

mod common;

use common::{
    max_weight_diff, rank_pid, replica_hashes, run_threads, small, summary, text, trained,
    two_by_two_and_four_threads, weights, when_training, BIN,
};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh");

/// Why the cluster tests cannot run on this machine, if they cannot.
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("they need root (network namespaces, veth pairs, tc)".into());
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ping", "iputils-ping"),
        ("mpirun", "openmpi-bin"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is missing (Debian package {package})"));
        }
    }
    None
}

/// A cluster brought up for one test; dropping it takes it down (`scripts/cluster.sh down`),
/// whether the test passed or panicked.
struct Cluster {
    name: String,
}

impl Cluster {
    /// `scripts/cluster.sh up HOSTS` with `extra` options, named after `tag` and this test
    /// process. `None` (after saying so on stderr) only when the tests cannot run here and
    /// `DPTRAIN_SKIP_CLUSTER_TESTS` is set outside CI; otherwise a cluster, or a panic.
    fn up(tag: &str, hosts: usize, extra: &[&str]) -> Option<Self> {
        if let Some(why) = cannot_run() {
            let skip = std::env::var_os("DPTRAIN_SKIP_CLUSTER_TESTS").is_some();
            if skip && std::env::var_os("CI").is_none() {
                // Straight to stderr: the test harness hides eprintln! of a passing test.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED cluster test ({tag}): {why} (DPTRAIN_SKIP_CLUSTER_TESTS is set)"
                );
                return None;
            }
            panic!(
                "the cluster tests cannot run: {why}. Run them as root (CI does); outside CI, \
                 DPTRAIN_SKIP_CLUSTER_TESTS=1 skips them"
            );
        }
        let name = format!("dpt{tag}{}", std::process::id());
        let o = Command::new(SCRIPT)
            .args(["up", &hosts.to_string(), "--name", &name])
            .args(extra)
            .output()
            .expect("scripts/cluster.sh runs");
        // A failed `up` has already removed what it made.
        assert!(
            o.status.success(),
            "scripts/cluster.sh up failed:\n{}",
            text(&o)
        );
        eprintln!("{}", text(&o));
        Some(Self { name })
    }

    /// `mpirun` across the hosts (`scripts/cluster.sh mpirun`): TCP only, one rank per host.
    fn mpirun(&self) -> Command {
        let mut c = Command::new(SCRIPT);
        c.args(["mpirun", "--name", &self.name]);
        c
    }

    /// Trains `args` on `ranks` hosts; returns mpirun's output.
    fn train(&self, ranks: usize, args: &[String]) -> String {
        let o = self
            .mpirun()
            .args(["-np", &ranks.to_string(), BIN])
            .args(args)
            .args(["--transport", "mpi"])
            .output()
            .unwrap();
        trained(&o)
    }

    /// Bytes each host has sent on its link so far.
    fn sent_bytes(&self) -> Vec<u64> {
        let o = Command::new(SCRIPT)
            .args(["stats", "--name", &self.name])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect()
    }

    /// The namespace (and hostname) of host `i` (from 1).
    fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.name)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let o = Command::new(SCRIPT)
            .args(["down", "--name", &self.name])
            .output();
        let ok = o.as_ref().is_ok_and(|o| o.status.success());
        let left = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let gone = !left
            .lines()
            .any(|l| l.starts_with(&format!("{}-", self.name)));
        let what = o.as_ref().map_or_else(|e| e.to_string(), text);
        if !(ok && gone) {
            // A second panic while unwinding would abort and hide the first one.
            if std::thread::panicking() {
                eprintln!("cluster {} was not taken down: {what}", self.name);
            } else {
                panic!("cluster {} was not taken down: {what}\n{left}", self.name);
            }
        }
    }
}

/// Parameter values in the checkpoint of `dir` (its gradient is as long).
fn parameter_count(dir: &Path) -> u64 {
    weights(dir)
        .iter()
        .filter(|(name, _)| {
            !name.starts_with("optimizer.")
                && !name.contains(".running_")
                && !name.ends_with(".num_batches_tracked")
        })
        .map(|(_, v)| v.len() as u64)
        .sum()
}

/// The hosts the ranks of the run in `dir` ran on, in rank order (its per-rank report).
fn rank_hosts(dir: &Path) -> Vec<String> {
    summary(dir)["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["host"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn two_hosts_of_one_worker_train_like_two_threads_bit_for_bit() {
    let Some(cluster) = Cluster::up("one", 2, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for comm in ["ring", "tree", "redundant"] {
        let (mpi_dir, thr_dir) = (tmp.path().join(comm), tmp.path().join(format!("{comm}-t")));
        let before = cluster.sent_bytes();
        cluster.train(2, &small(&mpi_dir, &["--comm", comm]));
        let after = cluster.sent_bytes();
        run_threads(&small(&thr_dir, &["--comm", comm, "--workers", "2"]));
        assert!(
            weights(&mpi_dir) == weights(&thr_dir),
            "{comm}: 2 hosts and 2 threads trained different weights"
        );
        let h = replica_hashes(&mpi_dir);
        assert_eq!(h.len(), 2);
        assert_eq!(h, replica_hashes(&thr_dir), "{comm}");
        assert_eq!(
            rank_hosts(&mpi_dir),
            [cluster.host(1), cluster.host(2)],
            "{comm}: one rank per host"
        );
        // The gradients went over the hosts' links: with two ranks, every mode has each rank
        // send a whole gradient's worth (or the weights, in tree mode) every step. 2 epochs
        // of 1536 samples in batches of 64.
        let steps = 2 * 1536 / 64;
        let least = steps * 4 * parameter_count(&mpi_dir);
        for (host, (a, b)) in before.iter().zip(&after).enumerate() {
            assert!(
                b - a >= least,
                "{comm}: host {} sent {} bytes, less than the {least} bytes of the \
                 gradients: the ranks did not talk over the cluster's links",
                host + 1,
                b - a
            );
        }
    }
}

#[test]
fn two_hosts_of_two_workers_stay_in_sync_flat_and_hierarchical() {
    let Some(cluster) = Cluster::up("two", 2, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let launch = |ranks: usize, args: &[String]| cluster.train(ranks, args);
    // Flat: bit for bit the same as 4 worker threads in one process.
    for comm in ["ring", "tree"] {
        let (mpi_dir, thr_dir) = two_by_two_and_four_threads(tmp.path(), comm, "off", &launch);
        assert!(
            weights(&mpi_dir) == weights(&thr_dir),
            "{comm}: 2 hosts x 2 workers and 4 threads trained different weights"
        );
        assert_eq!(replica_hashes(&mpi_dir), replica_hashes(&thr_dir), "{comm}");
    }
    // Hierarchical: every replica identical (checked by the helper); redundant (powers of two)
    // the same bits as 4 threads, ring equal up to float rounding (the additions are grouped
    // by host).
    for hierarchy in ["2d", "leader"] {
        let (mpi_dir, thr_dir) =
            two_by_two_and_four_threads(tmp.path(), "redundant", hierarchy, &launch);
        assert!(
            weights(&mpi_dir) == weights(&thr_dir),
            "redundant {hierarchy}: 2 hosts x 2 workers and 4 threads trained different weights"
        );
        let (mpi_dir, thr_dir) =
            two_by_two_and_four_threads(tmp.path(), "ring", hierarchy, &launch);
        let worst = max_weight_diff(&weights(&mpi_dir), &weights(&thr_dir));
        assert!(
            worst <= 1e-5,
            "ring {hierarchy}: hierarchical weights differ from 4 threads' by up to {worst}"
        );
    }
}

/// Trains briefly on a 3-host cluster brought up with `extra`; returns the run's
/// `summary.json`.
fn three_host_run(tag: &str, extra: &[&str]) -> Option<serde_json::Value> {
    let cluster = Cluster::up(tag, 3, extra)?;
    let tmp = tempfile::tempdir().unwrap();
    cluster.train(3, &small(tmp.path(), &["--batch", "48", "--epochs", "1"]));
    assert_eq!(
        rank_hosts(tmp.path()),
        [cluster.host(1), cluster.host(2), cluster.host(3)]
    );
    Some(summary(tmp.path()))
}

/// Each rank's measured link speed (MB/s) in a run's summary.
fn links(s: &serde_json::Value) -> Vec<f64> {
    s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["link_mb_per_s"]
                .as_f64()
                .unwrap_or_else(|| panic!("no link probed: {s:#}"))
        })
        .collect()
}

#[test]
fn a_host_on_a_ten_times_slower_link_is_named_as_the_slow_rank() {
    // The control first: three equal links, no rank singled out.
    let Some(even) = three_host_run("even", &["--bandwidth", "1gbit"]) else {
        return;
    };
    assert_eq!(even["slow_ranks"], serde_json::json!([]), "{even:#}");
    // 1 Gbit/s is 125 MB/s: the probe sees the shaping (and the shaping works).
    for l in links(&even) {
        assert!((40.0..125.0 * 1.1).contains(&l), "{:?}", links(&even));
    }
    // Host 2 (rank 1) on a link 10x slower than the others'.
    let Some(slow) = three_host_run(
        "slow",
        &["--bandwidth", "1gbit", "--host-bandwidth", "2=100mbit"],
    ) else {
        return;
    };
    let named = slow["slow_ranks"].as_array().unwrap();
    assert_eq!(named.len(), 1, "exactly one slow rank: {slow:#}");
    assert_eq!(named[0]["rank"], 1, "{slow:#}");
    assert!(
        named[0]["host"].as_str().unwrap().ends_with("-h2"),
        "{slow:#}"
    );
    let reason = named[0]["reason"].as_str().unwrap();
    assert!(reason.contains("link is slow"), "{reason}");
    let l = links(&slow);
    // 100 Mbit/s is 12.5 MB/s.
    assert!((4.0..12.5 * 1.1).contains(&l[1]), "{l:?}");
    assert!(l[1] * 4.0 < l[0].min(l[2]), "{l:?}");
    // `--comm auto` planned for the standard rate of the slowest path: 1 Gbit/s on the even
    // links, 100 Mbit/s with one host on 100 Mbit/s.
    let planned =
        |s: &serde_json::Value| s["config"]["measured_link_bandwidth_bytes_per_s"].as_f64();
    assert_eq!(planned(&even), Some(125e6), "{even:#}");
    assert_eq!(planned(&slow), Some(12.5e6), "{slow:#}");
}

/// Whether process `pid` is still running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_killed_host_ends_the_others_within_the_timeout() {
    let Some(cluster) = Cluster::up("kill", 2, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mark = format!("kill-host-{}", std::process::id());
    let args = small(
        tmp.path(),
        &[
            "--epochs",
            "50",
            "--train-limit",
            "60000",
            "--comm-timeout",
            "3",
        ],
    );
    let mut child = cluster
        .mpirun()
        .args(["-x", "DPTRAIN_TEST_MARK", "-np", "2", BIN])
        .args(&args)
        .args(["--transport", "mpi", "--log-every", "5", "--no-checkpoints"])
        .env("DPTRAIN_TEST_MARK", &mark)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Collect the output as it comes: mpirun may outlive rank 0 (it cannot reach the dead
    // host's daemon to end it), so the test cannot wait for it to exit.
    let out = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|mut r| {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                out.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    })
    .collect();
    let (mut child, _) = when_training(child, &tmp.path().join("metrics.jsonl"), &mark, 1);
    let rank0 = rank_pid(&mark, 0).expect("rank 0 runs");
    // Host 2 drops off the network and freezes, as if it lost power.
    let o = Command::new(SCRIPT)
        .args(["fail", "--name", &cluster.name, "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let killed = Instant::now();
    while alive(rank0) && killed.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    // Rank 0's last words travel through its host's daemon to mpirun.
    let want = ["error: rank 0 of 2:", "waited 3.", "from rank 1"];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !want.iter().all(|w| out.lock().unwrap().contains(w)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    // The daemons hold the output pipes too: they close when the cluster goes.
    drop(cluster);
    for r in readers {
        let _ = r.join();
    }
    let t = out.lock().unwrap().clone();
    eprintln!("rank 0 ended {took:?} after host 2 failed:\n{t}");
    assert!(
        !alive(rank0),
        "rank 0 still runs a minute after its peer's host died:\n{t}"
    );
    assert!(want.iter().all(|w| t.contains(w)), "{t}");
    // --comm-timeout 3, then up to 2 s for the survivors to meet before they exit (6 s here),
    // with room for a busy machine.
    assert!(took < Duration::from_secs(15), "took {took:?}:\n{t}");
}

#[test]
fn a_config_mismatch_across_hosts_stops_every_rank_with_what_differs() {
    let Some(cluster) = Cluster::up("hand", 2, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // One rank per host (one slot each): rank 0 on host 1, rank 1 on host 2.
    let o = common::assert_config_mismatch_stops_both_ranks(cluster.mpirun(), tmp.path());
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
}

/// `dptrain launch` across a cluster (`scripts/cluster.sh launch`), its stderr lines collected
/// as they come.
struct Launch {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    fn launch(&self, run_dir: &Path, launch: &[&str], train: &[&str]) -> Launch {
        let mut child = Command::new(SCRIPT)
            .args(["launch", "--name", &self.name, BIN, "--run-dir"])
            .arg(run_dir)
            .args(launch)
            .arg("--")
            .args(train)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (err, l) = (child.stderr.take().unwrap(), lines.clone());
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Launch {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// `scripts/cluster.sh fail I` or `restore I`.
    fn host_event(&self, what: &str, i: usize) {
        let o = Command::new(SCRIPT)
            .args([what, "--name", &self.name, &i.to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
}

impl Launch {
    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits (at most `secs`) until `ready` holds.
    fn wait_until(&self, what: &str, secs: u64, ready: impl Fn(&Launch) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "no {what} within {secs} s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (at most `secs`) for the launcher to end; its exit and its output.
    fn finish(mut self, secs: u64) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("launch still runs after {secs} s:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.log())
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `dir` holds a commit of at least `step` steps.
fn committed(dir: &Path, step: usize) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            dptrain::train::commit::commit_step(&e.file_name().to_string_lossy())
                .is_some_and(|s| s >= step)
        })
    })
}

fn elastic_report(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("elastic.json")).unwrap()).unwrap()
}

/// lenet5 on the whole of MNIST at batch 96 (625 steps per epoch; it splits over 4, 3 and 2
/// hosts), committing every 10 steps and keeping every commit (to compare against).
const ELASTIC_TRAIN: [&str; 15] = [
    "--epochs",
    "2",
    "--batch",
    "96",
    "--test-limit",
    "500",
    "--threads",
    "1",
    "--commit-every",
    "10",
    "--keep-commits",
    "1000",
    "--comm-timeout",
    "60",
    "--quiet",
];

#[test]
fn a_lost_host_costs_seconds_and_ten_steps_and_the_run_finishes_on_the_survivors() {
    let Some(cluster) = Cluster::up("elas", 4, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let launch = cluster.launch(&dir, &["--heartbeat-timeout", "3"], &ELASTIC_TRAIN);
    // Host 3 drops off the network and freezes during epoch 2.
    launch.wait_until("commit in epoch 2", 120, |_| committed(&dir, 700));
    cluster.host_event("fail", 3);
    let (status, log) = launch.finish(180);
    eprintln!("{log}");
    assert!(status.success(), "{log}");
    let r = elastic_report(&dir);
    let (jobs, failures) = (
        r["jobs"].as_array().unwrap(),
        r["failures"].as_array().unwrap(),
    );
    assert_eq!((jobs.len(), failures.len()), (2, 1), "{r:#}");
    let f = &failures[0];
    assert_eq!(f["host"], "10.77.0.3", "{r:#}");
    let s = |v: &serde_json::Value| v.as_f64().unwrap();
    // Found within the heartbeat timeout (and the monitor's 0.1 s poll), training again
    // within 15 s, no more than one commit interval redone.
    let found = s(&f["detected_s"]) - s(&f["last_beat_s"]);
    assert!(
        (3.0..3.6).contains(&found),
        "detected {found} s after the last beat"
    );
    let back = s(&f["running_again_s"]) - s(&f["detected_s"]);
    assert!(back < 15.0, "training again {back} s after detection");
    assert!(f["steps_redone"].as_u64().unwrap() <= 10, "{r:#}");
    assert_eq!(
        jobs[1]["hosts"],
        serde_json::json!(["10.77.0.1", "10.77.0.2", "10.77.0.4"])
    );
    // The report lists the lost host (and marks it on the loss and accuracy plots).
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("| 10.77.0.3 |"), "{report}");
    let hashes = replica_hashes(&dir);
    assert_eq!(hashes.len(), 3);
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
    // Bit for bit what 3 hosts started from the commit the second job resumed do.
    let step = jobs[1]["resumed_from"][1].as_u64().unwrap() as usize;
    let commit = dptrain::train::commit::commit_path(&dir, step);
    let again = tmp.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    std::fs::copy(&commit, again.join(commit.file_name().unwrap())).unwrap();
    cluster.host_event("restore", 3);
    let mut args: Vec<String> = vec![
        "train".into(),
        "--run-dir".into(),
        again.display().to_string(),
    ];
    args.extend(ELASTIC_TRAIN.iter().map(|s| s.to_string()));
    args.extend([
        "--resume".into(),
        again
            .join(commit.file_name().unwrap())
            .display()
            .to_string(),
    ]);
    cluster.train(3, &args);
    assert_eq!(replica_hashes(&again), hashes);
    assert_eq!(weights(&again), weights(&dir));
}

#[test]
fn two_losses_one_of_rank_0_while_restarting_and_a_host_that_comes_back_all_finish() {
    let Some(cluster) = Cluster::up("elat", 4, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let launch = cluster.launch(
        &dir,
        &["--heartbeat-timeout", "3", "--start-timeout", "20"],
        &ELASTIC_TRAIN,
    );
    launch.wait_until("commit", 120, |_| committed(&dir, 300));
    cluster.host_event("fail", 3);
    // As the second job starts, host 1 (rank 0's) goes too, and host 3 comes back.
    launch.wait_until("second job", 60, |l| l.log().contains("launch: job 2:"));
    cluster.host_event("fail", 1);
    cluster.host_event("restore", 3);
    let (status, log) = launch.finish(240);
    eprintln!("{log}");
    assert!(status.success(), "{log}");
    let r = elastic_report(&dir);
    let lost: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["host"].as_str().unwrap())
        .collect();
    assert_eq!(lost, ["10.77.0.3", "10.77.0.1"], "{r:#}");
    let last = r["jobs"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["hosts"],
        serde_json::json!(["10.77.0.2", "10.77.0.3", "10.77.0.4"])
    );
    assert_eq!(last["outcome"], "finished");
    assert!(log.contains("host 10.77.0.3 answers again"), "{log}");
    let hashes = replica_hashes(&dir);
    assert!(
        hashes.len() == 3 && hashes.windows(2).all(|w| w[0] == w[1]),
        "{hashes:?}"
    );
}

/// On 2 hosts with `launch_args`, host 2 fails: the run must stop saying `says` and naming
/// its newest state, which one process of two workers then continues.
fn stops_naming_its_newest_state(tag: &str, launch_args: &[&str], says: &str) {
    let Some(cluster) = Cluster::up(tag, 2, &[]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut args = vec!["--heartbeat-timeout", "3"];
    args.extend(launch_args);
    let launch = cluster.launch(&dir, &args, &ELASTIC_TRAIN);
    launch.wait_until("commit", 120, |_| committed(&dir, 100));
    cluster.host_event("fail", 2);
    let (status, log) = launch.finish(120);
    assert!(!status.success(), "{log}");
    assert!(log.contains(says), "{log}");
    let named = log
        .split("the newest state is ")
        .nth(1)
        .and_then(|t| t.split(": run dptrain launch again").next())
        .unwrap_or_else(|| panic!("no state named:\n{log}"));
    assert!(Path::new(named).is_file(), "{named}");
    let mut args: Vec<String> = vec![
        "train".into(),
        "--run-dir".into(),
        dir.display().to_string(),
    ];
    args.extend(ELASTIC_TRAIN.iter().map(|s| s.to_string()));
    args.extend(["--workers", "2", "--resume", named].map(String::from));
    let o = Command::new(BIN).args(&args).output().unwrap();
    assert!(
        o.status.success() && text(&o).contains("done:"),
        "{}",
        text(&o)
    );
}

#[test]
fn below_min_hosts_the_run_stops_naming_its_newest_state_which_resume_continues() {
    stops_naming_its_newest_state("elam", &["--min-hosts", "2"], "fewer than --min-hosts 2");
}

#[test]
fn past_max_restarts_the_run_stops_naming_its_newest_state_which_resume_continues() {
    stops_naming_its_newest_state("elar", &["--max-restarts", "0"], "after 0 restart(s)");
}
