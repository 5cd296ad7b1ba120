//! Multi-process training over MPI: runs `mpirun` on the built binary.
//!
//! mpirun can refuse to start (e.g. as root without `--allow-run-as-root`) and still exit 0,
//! so every test checks the output it expects, not only exit codes.
#![cfg(feature = "mpi")]

mod common;

use common::{
    max_weight_diff, replica_hashes, run_threads, small, text, trained, weights, when_training, BIN,
};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `mpirun` with what CI needs: root allowed, more ranks than cores allowed.
fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe"])
        // Keeps mpirun from looking for other machines or slow network interfaces.
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// Trains `args` on `ranks` MPI ranks of this host; returns mpirun's output.
fn run_mpi(ranks: usize, args: &[String]) -> String {
    let o = mpirun()
        .args(["-np", &ranks.to_string(), BIN])
        .args(args)
        .args(["--transport", "mpi"])
        .output()
        .expect("mpirun runs (install openmpi-bin)");
    trained(&o)
}

#[test]
fn two_ranks_match_two_worker_threads_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    for comm in ["ring", "tree", "hd", "redundant"] {
        let (mpi_dir, thr_dir) = (tmp.path().join(comm), tmp.path().join(format!("{comm}-t")));
        run_mpi(2, &small(&mpi_dir, &["--comm", comm]));
        run_threads(&small(&thr_dir, &["--comm", comm, "--workers", "2"]));
        let (a, b) = (weights(&mpi_dir), weights(&thr_dir));
        assert!(!a.is_empty());
        assert!(
            a == b,
            "{comm}: 2 MPI ranks and 2 threads trained different weights"
        );
        let h = replica_hashes(&mpi_dir);
        assert_eq!(h.len(), 2);
        assert_eq!(h, replica_hashes(&thr_dir), "{comm}");
    }
}

#[test]
fn priority_scheduling_over_mpi_trains_overlaps_weights() {
    // Rank 0's decisions cross MPI on the broadcast tag; the partitions are the same
    // collectives whatever their order, so 2 ranks under priority train the weights of 2 ranks
    // under overlap with the same partitions, flat and with 2 workers per rank in 2-D.
    let tmp = tempfile::tempdir().unwrap();
    for (comm, workers) in [("ring", "1"), ("redundant", "1"), ("ring", "2")] {
        let name = format!("{comm}-{workers}");
        let base = [
            "--comm",
            comm,
            "--workers",
            workers,
            "--bucket-kb",
            "0",
            "--partition-kb",
            "8",
        ];
        let (prio, over) = (tmp.path().join(&name), tmp.path().join(name.clone() + "-o"));
        run_mpi(
            2,
            &small(&prio, &[&base[..], &["--schedule", "priority"]].concat()),
        );
        run_mpi(2, &small(&over, &base));
        let (a, b) = (weights(&prio), weights(&over));
        assert!(!a.is_empty());
        assert!(
            a == b,
            "{name}: priority and overlap trained different weights"
        );
        let h = replica_hashes(&prio);
        assert!(
            h.iter().all(|&x| x == h[0]),
            "{name}: replicas differ {h:x?}"
        );
    }
}

#[test]
fn compressed_gradients_cross_mpi_intact_and_mpi_native_refuses_compression() {
    // The 16-bit values ride in f32 carriers: MPI must move them bit for bit, so 2 ranks give
    // the weights of 2 threads with the same wire format. Which partial sums are rounded
    // depends on the buckets, so both runs fix them (the planned links differ).
    let tmp = tempfile::tempdir().unwrap();
    for (comm, compress) in [("ring", "fp16"), ("redundant", "bf16")] {
        let name = format!("{comm}-{compress}");
        let (mpi_dir, thr_dir) = (tmp.path().join(&name), tmp.path().join(name + "-t"));
        let args = ["--comm", comm, "--compress", compress, "--bucket-kb", "0"];
        run_mpi(2, &small(&mpi_dir, &args));
        run_threads(&small(&thr_dir, &[&args[..], &["--workers", "2"]].concat()));
        let (a, b) = (weights(&mpi_dir), weights(&thr_dir));
        assert!(!a.is_empty());
        assert!(a == b, "{comm}/{compress}: MPI ranks and threads differ");
    }
    // 2 ranks x 2 workers: the hierarchies' phases within a rank run in shared memory, in
    // f32, around the compressed phase between the ranks; every replica ends the same.
    for (comm, hierarchy) in [("ring", "2d"), ("redundant", "leader"), ("hd", "2d")] {
        let dir = tmp.path().join(format!("{comm}-{hierarchy}-bf16"));
        let args = [
            "--comm",
            comm,
            "--workers",
            "2",
            "--hierarchical",
            hierarchy,
            "--compress",
            "bf16",
        ];
        run_mpi(2, &small(&dir, &args));
        let h = replica_hashes(&dir);
        assert_eq!(h.len(), 4, "{comm} {hierarchy}");
        assert!(
            h.iter().all(|&x| x == h[0]),
            "{comm} {hierarchy} bf16: replicas differ {h:x?}"
        );
    }
    // PowerSGD: both rounds through MPI, the error feedback each rank's own; 2 ranks train
    // the weights of 2 threads, and 2 ranks x 2 workers keep 4 identical replicas.
    let (mpi_dir, thr_dir) = (tmp.path().join("psgd"), tmp.path().join("psgd-t"));
    let args = [
        "--comm",
        "ring",
        "--compress",
        "powersgd:2",
        "--bucket-kb",
        "0",
    ];
    run_mpi(2, &small(&mpi_dir, &args));
    run_threads(&small(&thr_dir, &[&args[..], &["--workers", "2"]].concat()));
    assert!(
        weights(&mpi_dir) == weights(&thr_dir),
        "powersgd: MPI ranks and threads differ"
    );
    let dir = tmp.path().join("psgd-2d");
    run_mpi(
        2,
        &small(
            &dir,
            &[&args[..], &["--workers", "2", "--hierarchical", "2d"]].concat(),
        ),
    );
    let h = replica_hashes(&dir);
    assert_eq!(h.len(), 4);
    assert!(
        h.iter().all(|&x| x == h[0]),
        "powersgd 2d: replicas differ {h:x?}"
    );
    let o = Command::new(BIN)
        .args(["train", "--transport", "mpi", "--comm", "mpi-native"])
        .args(["--compress", "bf16"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o);
    assert!(
        err.contains("--compress bf16 with --comm mpi-native: MPI_Allreduce sums f32"),
        "{err}"
    );
}

/// [`common::two_by_two_and_four_threads`] with 2 ranks on this host.
fn two_by_two_and_four_threads(
    tmp: &std::path::Path,
    comm: &str,
    hierarchical: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    common::two_by_two_and_four_threads(tmp, comm, hierarchical, &run_mpi)
}

#[test]
fn two_ranks_of_two_workers_flat_match_four_worker_threads_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    for comm in ["ring", "tree", "redundant"] {
        let (mpi_dir, thr_dir) = two_by_two_and_four_threads(tmp.path(), comm, "off");
        assert!(
            weights(&mpi_dir) == weights(&thr_dir),
            "{comm}: 2 ranks x 2 workers and 4 threads trained different weights"
        );
        assert_eq!(replica_hashes(&mpi_dir), replica_hashes(&thr_dir), "{comm}");
    }
}

#[test]
fn two_ranks_of_two_workers_hierarchical_stay_in_sync_and_close_to_four_threads() {
    let tmp = tempfile::tempdir().unwrap();
    // Redundant over 2 processes of 2 workers: the pairwise tree over hosts of pairwise trees
    // over workers is flat redundant's tree, in both hierarchies: the same bits.
    for hierarchy in ["2d", "leader"] {
        let (mpi_dir, thr_dir) = two_by_two_and_four_threads(tmp.path(), "redundant", hierarchy);
        assert!(
            weights(&mpi_dir) == weights(&thr_dir),
            "redundant {hierarchy}: 2 ranks x 2 workers and 4 threads trained different weights"
        );
    }
    for (comm, hierarchy) in [
        ("ring", "2d"),
        ("ring", "leader"),
        ("auto", "auto"),
        ("mpi-native", "auto"),
    ] {
        let (mpi_dir, thr_dir) = two_by_two_and_four_threads(tmp.path(), comm, hierarchy);
        let worst = max_weight_diff(&weights(&mpi_dir), &weights(&thr_dir));
        assert!(
            worst <= 1e-5,
            "{comm} {hierarchy}: hierarchical weights differ from 4 threads' by up to {worst}"
        );
    }
}

#[test]
fn an_emulated_port_within_each_rank_delays_the_hierarchies_without_changing_their_sums() {
    // `--intra-bandwidth` turns the within-process phases from reads of shared memory into
    // messages through emulated ports: the same adds in the same order, so the same bits,
    // and the ports' time: every worker receives a whole gradient's bytes through its own
    // (the leader's sums; or 2-D's shard in reduce-scatter and the rest in all-gather).
    let tmp = tempfile::tempdir().unwrap();
    for hierarchy in ["2d", "leader"] {
        let run = |name: &str, port: &[&str]| {
            let dir = tmp.path().join(format!("{hierarchy}-{name}"));
            let mut args = small(
                &dir,
                &[
                    "--comm",
                    "ring",
                    "--workers",
                    "2",
                    "--hierarchical",
                    hierarchy,
                ],
            );
            args.extend(["--bucket-kb", "32", "--first-bucket-kb", "32"].map(String::from));
            args.extend(port.iter().map(|s| s.to_string()));
            run_mpi(2, &args);
            dir
        };
        let shared = run("shared", &[]);
        let port = run(
            "port",
            &["--intra-bandwidth", "40MB/s", "--intra-latency", "20us"],
        );
        assert!(!weights(&port).is_empty());
        assert!(
            weights(&shared) == weights(&port),
            "{hierarchy}: the emulated port changed the weights"
        );
        let summary = common::summary(&port);
        let recorded = &summary["config"]["intra_bandwidth_bytes_per_s"];
        assert_eq!(*recorded, 4e7, "{hierarchy}: {recorded}");
        assert_eq!(summary["config"]["intra_latency_us"], 20.0, "{hierarchy}");
        let gradient_bytes: usize = weights(&port)
            .iter()
            .filter(|(name, _)| !name.starts_with("optimizer."))
            .map(|(_, values)| 4 * values.len())
            .sum();
        let port_ms = 1e3 * gradient_bytes as f64 / 4e7;
        let comm_ms = summary["breakdown"]["mean"]["comm_total_ms"]
            .as_f64()
            .unwrap();
        assert!(
            comm_ms >= 0.9 * port_ms,
            "{hierarchy}: {comm_ms} ms of communication a step, where the port alone takes \
             {port_ms:.2} ms"
        );
        assert!(common::summary(&shared)["config"]["intra_bandwidth_bytes_per_s"].is_null());
    }
    // One process has no port between processes' workers to emulate: refused, not recorded
    // and ignored.
    let dir = tmp.path().join("one-process");
    let o = mpirun()
        .args(["-np", "1", BIN])
        .args(small(
            &dir,
            &["--workers", "2", "--intra-bandwidth", "40MB/s"],
        ))
        .args(["--transport", "mpi"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("error: --intra-bandwidth emulates the port within a process of a run of several processes, and this run has one"),
        "{t}"
    );
    assert!(!t.contains("done:"), "{t}");
    // A resume in one process of a run that had a port: the port is the checkpoint's, not
    // given, so left with a warning rather than refused.
    let ck = tmp
        .path()
        .join("leader-port/checkpoint-epoch0001.safetensors");
    let dir = tmp.path().join("one-process-resume");
    let mut args = small(&dir, &["--resume", ck.to_str().unwrap()]);
    args.retain(|a| a != "--quiet");
    let o = mpirun()
        .args(["-np", "1", BIN])
        .args(args)
        .args(["--transport", "mpi"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(
            "not resuming with the checkpoint's run's --intra-bandwidth: this run has one process"
        ),
        "{t}"
    );
}

#[test]
fn bench_allreduce_over_mpi_prints_one_table_with_every_mode() {
    for workers in ["1", "2"] {
        let o = mpirun()
            .args(["-np", "2", BIN, "bench", "allreduce", "--transport", "mpi"])
            .args(["--workers", workers, "--sizes", "4K", "--iters", "2"])
            .output()
            .unwrap();
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert_eq!(t.matches("all-reduce over MPI").count(), 1, "{t}");
        for mode in ["tree", "ring", "hd", "redundant", "auto:", "mpi-native"] {
            assert!(t.contains(mode), "no {mode} in:\n{t}");
        }
        for hierarchical in ["2d:ring", "leader:ring", "leader:mpi-native"] {
            assert_eq!(t.contains(hierarchical), workers == "2", "{t}");
        }
    }
}

#[test]
fn three_ranks_and_mpi_native_train_in_sync() {
    let tmp = tempfile::tempdir().unwrap();
    for comm in ["ring", "mpi-native"] {
        let dir = tmp.path().join(comm);
        run_mpi(3, &small(&dir, &["--comm", comm, "--batch", "48"]));
        let h = replica_hashes(&dir);
        assert_eq!(h.len(), 3, "{comm}");
        assert!(
            h.iter().all(|&x| x == h[0]),
            "{comm}: replicas differ {h:x?}"
        );
    }
    // Resuming from rank 0's checkpoint on every rank continues the run.
    let dir = tmp.path().join("ring");
    let ck = dir.join("checkpoint-epoch0002.safetensors");
    let mut args = small(&dir, &["--batch", "48", "--epochs", "3"]);
    args.extend(["--resume".to_string(), ck.display().to_string()]);
    run_mpi(3, &args);
    assert!(dir.join("checkpoint-epoch0003.safetensors").is_file());
}

#[test]
fn a_config_mismatch_stops_every_rank_with_what_differs() {
    let tmp = tempfile::tempdir().unwrap();
    common::assert_config_mismatch_stops_both_ranks(mpirun(), tmp.path());
}

/// Starts a long 2-rank run, sends `signal` to rank 1 once training is under way, and returns
/// the output and how long after the signal mpirun was done.
fn lose_rank_1(signal: &str, extra_mpirun: &[&str], extra: &[&str]) -> (String, Duration) {
    let tmp = tempfile::tempdir().unwrap();
    // One mark per run: the tests of this binary run at once, and two that send the same
    // signal must not find each other's rank 1.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mark = format!("{signal}-{}-{run}", std::process::id());
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
    let child = mpirun()
        .args(extra_mpirun)
        .args(["-x", "DPTRAIN_TEST_MARK", "-np", "2", BIN])
        .args(&args)
        .args(["--transport", "mpi", "--log-every", "5", "--no-checkpoints"])
        .args(extra)
        .env("DPTRAIN_TEST_MARK", &mark)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (child, pid) = when_training(child, &tmp.path().join("metrics.jsonl"), &mark, 1);
    let sent = Instant::now();
    let ok = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let out = child.wait_with_output().unwrap();
    (text(&out), sent.elapsed())
}

#[test]
fn a_stalled_rank_ends_the_others_within_the_timeout() {
    let (t, took) = lose_rank_1("STOP", &[], &[]);
    assert!(
        t.contains("error: rank 0 of 2:") && t.contains("waited 3.") && t.contains("from rank 1"),
        "{t}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{t}");
}

#[test]
fn a_killed_rank_ends_the_others_within_the_timeout() {
    // --enable-recovery keeps mpirun from tearing the job down itself when a rank dies, so
    // this checks that our own timeout ends the survivors.
    let (t, took) = lose_rank_1("KILL", &["--enable-recovery"], &[]);
    assert!(
        t.contains("error: rank 0 of 2:") && t.contains("from rank 1"),
        "{t}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{t}");
}

#[test]
fn a_killed_rank_of_two_workers_ends_the_others_within_the_timeout() {
    // Rank 1 holds workers 2 and 3 of the run; rank 0's workers wait for them.
    let (t, took) = lose_rank_1("KILL", &["--enable-recovery"], &["--workers", "2"]);
    assert!(
        t.contains("error: rank 0 of 2:")
            && (t.contains("from rank 2") || t.contains("from rank 3")),
        "{t}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{t}");
}

#[test]
fn a_stalled_rank_ends_mpi_native_within_the_timeout() {
    // MPI_Allreduce is posted non-blocking and tested against --comm-timeout, so the reference
    // mode cannot hang on a stalled peer either.
    let (t, took) = lose_rank_1("STOP", &[], &["--comm", "mpi-native"]);
    assert!(
        t.contains("error: rank 0 of 2:")
            && t.contains("MPI_Allreduce")
            && t.contains("--comm-timeout"),
        "{t}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}:\n{t}");
}
