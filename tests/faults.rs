//! Failure propagation: an injected panic or loader failure anywhere ends the whole run within
//! seconds, with an error that names the worker, the phase and the step; a process killed while
//! writing a checkpoint leaves the previous checkpoint loadable.

use dptrain::config::TrainOptions;
use dptrain::train::checkpoint::Checkpoint;
use std::path::Path;
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
        let r = opts.resolve().and_then(dptrain::train::train).map(|_| ());
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
            ][..],
        ),
        (
            "data@3:1",
            2,
            &["worker 1", "data", "loader failure", "step 3"][..],
        ),
        ("data@3:1", 0, &["worker 1", "data", "loader failure"][..]),
    ];
    for (fault, prefetch, expected) in cases {
        for round in 0..20 {
            let dir = tmp.path().join(format!(
                "{}-{prefetch}-{round}",
                fault.replace([':', '@'], "_")
            ));
            let (r, took) = run_with_deadline(options(&dir, fault, prefetch));
            let err = r.expect_err("an injected fault must fail the run");
            for want in expected {
                assert!(
                    err.contains(want),
                    "{fault} (prefetch {prefetch}, round {round}): '{want}' missing from: {err}"
                );
            }
            assert!(took < Duration::from_secs(10), "{fault}: took {took:?}");
        }
    }
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
    let second_tmp = dir.join("checkpoint-epoch0002.safetensors.tmp");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Wait until the first checkpoint is complete and the second is being written.
    while !(first.is_file() && second_tmp.is_file()) {
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
    // And training resumes from it.
    let resumed = TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(2),
        batch: Some(16),
        train_limit: Some(64),
        test_limit: Some(32),
        run_dir: Some(tmp.path().join("resumed")),
        resume: Some(first),
        quiet: true,
        ..Default::default()
    };
    let s = dptrain::train::train(resumed.resolve().unwrap()).unwrap();
    assert_eq!(s.epochs.len(), 1);
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
    assert!(
        s.replica_hashes.iter().all(|&h| h == s.replica_hashes[0]),
        "replicas differ after skipped updates"
    );
}
