//! Committed state (`train --commit-every`): a run interrupted inside an epoch continues from its
//! newest commit, step for step, as if it had never stopped, on as many workers as before or
//! on fewer; what cannot continue exactly is refused.

mod common;

use common::{replica_hashes, small, text, weights, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dptrain-commit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(args: &[String]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn ok(args: &[String]) -> String {
    let o = run(args);
    assert!(o.status.success(), "{}", text(&o));
    text(&o)
}

/// A run of `extra` in `dir` that an injected error stops at global step `fail_at`; returns
/// the commits it left (global steps, sorted).
fn interrupted(dir: &Path, extra: &[&str], fail_at: usize) -> Vec<usize> {
    let fault = format!("forward@{fail_at}");
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["--inject-fault", &fault]);
    let o = run(&small(dir, &args));
    assert!(!o.status.success(), "the fault did not stop the run");
    commit_steps(dir)
}

/// The commits in `dir` (global steps, sorted).
fn commit_steps(dir: &Path) -> Vec<usize> {
    let mut steps: Vec<usize> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| dptrain::train::commit::commit_step(&e.ok()?.file_name().to_string_lossy()))
        .collect();
    steps.sort_unstable();
    steps
}

#[test]
fn a_run_stopped_inside_an_epoch_continues_from_its_commit_bit_for_bit() {
    // 1536 samples at batch 64: 24 steps per epoch; commits every 5 steps.
    let common = ["--workers", "2", "--commit-every", "5"];
    let whole = tmp("whole");
    ok(&small(&whole, &common));
    let want = replica_hashes(&whole);
    // Stopped at step 32 (epoch 2, its 9th step): the newest commits are 25 and 30.
    let cut = tmp("cut");
    assert_eq!(interrupted(&cut, &common, 32), vec![25, 30]);
    let commit = cut.join("commit-step000000030.safetensors");
    // The same command again is refused, pointing at the newest restart point (the commit,
    // past epoch 1's checkpoint), not only at --overwrite.
    let said = text(&run(&small(&cut, &common)));
    assert!(
        said.contains(&format!("continue it with --resume {}", commit.display())),
        "{said}"
    );
    // Continued with the prefetching pipeline, and with batches collated in the step.
    for (i, extra) in [&[][..], &["--prefetch", "0"][..]].into_iter().enumerate() {
        let again = tmp(&format!("again{i}"));
        std::fs::create_dir_all(&again).unwrap();
        let copy = again.join("commit-step000000030.safetensors");
        std::fs::copy(&commit, &copy).unwrap();
        let mut args: Vec<&str> = common.to_vec();
        args.extend(extra);
        let resume = copy.display().to_string();
        args.extend(["--resume", &resume]);
        ok(&small(&again, &args));
        assert_eq!(replica_hashes(&again), want, "{extra:?}");
        assert_eq!(weights(&again), weights(&whole), "{extra:?}");
        // The resumed epoch's line counts the steps trained in it.
        let lines = std::fs::read_to_string(again.join("metrics.jsonl")).unwrap();
        assert!(lines.lines().any(|l| l.contains("\"kind\":\"epoch\"")));
        std::fs::remove_dir_all(&again).unwrap();
    }
    // The newest restart point is that commit; once it is corrupt, the one before it.
    use dptrain::train::rundir::newest_restart_point;
    let newest = |d: &Path| newest_restart_point(d).map(|(p, s)| (p, s.global_step));
    assert_eq!(newest(&cut), Some((commit.clone(), 30)));
    let mut bytes = std::fs::read(&commit).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&commit, bytes).unwrap();
    assert_eq!(
        newest(&cut),
        Some((cut.join("commit-step000000025.safetensors"), 25))
    );
    // Resumed from commit 25 by a run that writes no restart points, commit 30 stays (it
    // deleted it, "which this run replaces", though the run replaced nothing); by one that
    // fails before its first restart point, too (it deleted it at its start).
    let later = cut.join("commit-step000000030.safetensors");
    let from_25 = cut
        .join("commit-step000000025.safetensors")
        .display()
        .to_string();
    ok(&small(&cut, &["--resume", &from_25, "--no-checkpoints"]));
    assert!(
        later.exists(),
        "a run writing no restart points removed commit 30"
    );
    let failing = [
        "--resume",
        &from_25,
        "--commit-every",
        "0",
        "--inject-fault",
        "forward@27",
    ];
    let o = run(&small(&cut, &failing));
    let said = text(&o);
    assert!(
        !o.status.success()
            && later.exists()
            && said.contains("is removed when this run writes its first restart point"),
        "{said}"
    );
    // A run that commits writes commit 30 itself (it was corrupt): its own stays.
    let mut commits = common.to_vec();
    commits.extend(["--resume", &from_25, "--keep-commits", "10"]);
    ok(&small(&cut, &commits));
    assert!(dptrain::train::checkpoint::Checkpoint::load(&later).is_ok());
    assert_eq!(commit_steps(&cut), vec![25, 30, 35, 40, 45]);
    // One that writes epoch checkpoints alone removes every later commit with its first.
    ok(&small(&cut, &["--resume", &from_25, "--commit-every", "0"]));
    assert_eq!(commit_steps(&cut), vec![25]);
    for d in [whole, cut] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_commit_continues_on_fewer_workers_as_a_run_started_there_from_it() {
    // Batch 48 splits over 4 workers and over 3: 32 steps per epoch.
    let four = tmp("four");
    assert_eq!(
        interrupted(
            &four,
            &["--workers", "4", "--batch", "48", "--commit-every", "10"],
            23
        ),
        vec![10, 20]
    );
    let commit = four
        .join("commit-step000000020.safetensors")
        .display()
        .to_string();
    let three = ["--workers", "3", "--batch", "48", "--commit-every", "10"];
    // From the commit on 3 workers, uninterrupted ...
    let straight = tmp("straight");
    let mut args = three.to_vec();
    args.extend(["--resume", &commit]);
    ok(&small(&straight, &args));
    // ... and the same, stopped at step 45 and continued from its own commit at 40.
    let twice = tmp("twice");
    std::fs::create_dir_all(&twice).unwrap();
    let copy = twice.join("commit-step000000020.safetensors");
    std::fs::copy(&commit, &copy).unwrap();
    let copy = copy.display().to_string();
    let mut first = three.to_vec();
    first.extend(["--resume", &copy]);
    let left = interrupted(&twice, &first, 45);
    assert_eq!(left, vec![30, 40], "commits of the resumed run");
    let forty = twice
        .join("commit-step000000040.safetensors")
        .display()
        .to_string();
    let mut second = three.to_vec();
    second.extend(["--resume", &forty]);
    ok(&small(&twice, &second));
    assert_eq!(replica_hashes(&twice), replica_hashes(&straight));
    assert_eq!(weights(&twice), weights(&straight));
    for d in [four, straight, twice] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn what_cannot_continue_exactly_is_refused_with_the_cause() {
    let dir = tmp("refused");
    assert_eq!(interrupted(&dir, &["--commit-every", "5"], 12), vec![5, 10]);
    let commit = dir
        .join("commit-step000000010.safetensors")
        .display()
        .to_string();
    let other = tmp("refused-other");
    for (extra, says) in [
        (
            vec!["--resume", &commit, "--resume-changed", "--batch", "32"],
            "continues only the run that wrote it",
        ),
        (
            vec!["--commit-every", "5", "--no-checkpoints"],
            "--no-checkpoints",
        ),
        (
            vec!["--commit-every", "5", "--keep-commits", "0"],
            "--keep-commits 0",
        ),
    ] {
        let o = run(&small(&other, &extra));
        let t = text(&o);
        assert!(!o.status.success() && t.contains(says), "{extra:?}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&other);
}

/// An IDX directory of `n` training and 100 test images of 28x28 (MNIST's layout).
fn idx_dir(dir: &Path, n: u32) {
    use dptrain::data::{idx, mnist};
    std::fs::create_dir_all(dir).unwrap();
    for (images, labels, count) in [
        (mnist::TRAIN_IMAGES_RAW, mnist::TRAIN_LABELS_RAW, n),
        (mnist::TEST_IMAGES_RAW, mnist::TEST_LABELS_RAW, 100),
    ] {
        let px: Vec<u8> = (0..count * 784).map(|i| (i % 251) as u8).collect();
        let lb: Vec<u8> = (0..count).map(|i| (i % 10) as u8).collect();
        idx::write_idx_u8(&dir.join(images), &[count, 28, 28], &px, false).unwrap();
        idx::write_idx_u8(&dir.join(labels), &[count], &lb, false).unwrap();
    }
}

#[test]
fn a_commit_past_the_end_of_a_shrunken_training_set_is_refused() {
    let data = tmp("shrunk-data");
    idx_dir(&data, 640);
    let spec = format!("idx:{}", data.display());
    let dir = tmp("shrunk");
    // 640 samples at batch 64: 10 steps per epoch; the fault at step 8 leaves commits 3 and 6.
    let common = ["--dataset", &spec, "--commit-every", "3"];
    assert_eq!(interrupted(&dir, &common, 8), vec![3, 6]);
    // The same path now holds 320 samples: 5 steps per epoch, and the commit is 6 into its.
    idx_dir(&data, 320);
    let commit = dir.join("commit-step000000006.safetensors");
    let commit = commit.display().to_string();
    let mut args = common.to_vec();
    args.extend(["--resume", &commit]);
    let o = run(&small(&dir, &args));
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("6 steps into its epoch, but an epoch here has 5"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&data).unwrap();
}

#[test]
fn powersgd_is_deterministic_and_continues_from_a_commit_or_checkpoint_bit_for_bit() {
    // PowerSGD's error feedback is each worker's own: a restart point holds every worker's,
    // so the continued run sends what the uninterrupted one would have sent.
    let common = [
        "--workers",
        "2",
        "--comm",
        "ring",
        "--compress",
        "powersgd:2",
        "--commit-every",
        "5",
    ];
    let whole = tmp("psgd-whole");
    ok(&small(&whole, &common));
    let want = replica_hashes(&whole);
    assert_eq!(want.len(), 2);
    assert_eq!(want[0], want[1], "replicas differ");
    // On 2 threads per worker: the same bits.
    let threads = tmp("psgd-threads");
    ok(&small(
        &threads,
        &[&common[..], &["--threads", "2"]].concat(),
    ));
    assert_eq!(weights(&threads), weights(&whole));
    // Compression is on: uncompressed gradients train other weights.
    let plain = tmp("psgd-none");
    ok(&small(&plain, &common[..4]));
    assert_ne!(weights(&plain), weights(&whole));
    // The checkpoint holds both workers' error feedback and Q.
    let ck = dptrain::train::checkpoint::Checkpoint::load(
        &whole.join("checkpoint-epoch0001.safetensors"),
    )
    .unwrap();
    let state = ck.powersgd().unwrap().expect("PowerSGD's state is saved");
    assert_eq!(state.error_shape[0], 2);
    assert!(state.error_of(0) != state.error_of(1));
    assert!(state.errors.iter().any(|&e| e != 0.0));
    // Stopped at step 32: continued from the commit at 30 with the options given again, and
    // from epoch 1's checkpoint given alone: its run's workers, mode, compression (and so
    // the error feedback it holds) are followed.
    let cut = tmp("psgd-cut");
    assert_eq!(interrupted(&cut, &common, 32), vec![25, 30]);
    for (i, name) in [
        "commit-step000000030.safetensors",
        "checkpoint-epoch0001.safetensors",
    ]
    .into_iter()
    .enumerate()
    {
        let again = tmp(&format!("psgd-again{i}"));
        std::fs::create_dir_all(&again).unwrap();
        let copy = again.join(name);
        std::fs::copy(cut.join(name), &copy).unwrap();
        let resume = copy.display().to_string();
        let given: &[&str] = if i == 0 { &common[..] } else { &[] };
        let mut args = small(&again, &[given, &["--resume", &resume]].concat());
        args.retain(|a| a != "--quiet"); // to see the notes
        let said = ok(&args);
        assert!(
            i == 0 || said.contains("--workers 2, --comm ring, --compress powersgd:2 (give"),
            "{said}"
        );
        assert_eq!(replica_hashes(&again), want, "from {name}");
        assert_eq!(weights(&again), weights(&whole), "from {name}");
        std::fs::remove_dir_all(&again).unwrap();
    }
    // Resumed with --compress none: the error feedback it holds is dropped, and said.
    let bare = tmp("psgd-bare");
    let resume = cut
        .join("checkpoint-epoch0001.safetensors")
        .display()
        .to_string();
    let said = ok(&small(
        &bare,
        &[&common[..4], &["--compress", "none", "--resume", &resume]].concat(),
    ));
    assert!(
        said.contains("--compress is none: the error feedback is dropped"),
        "{said}"
    );
    std::fs::remove_dir_all(&bare).unwrap();
    // Continued on 4 workers: said, with where the two workers' error feedback goes.
    let four = tmp("psgd-four");
    let mut args = common.to_vec();
    args[1] = "4";
    let mut loud = small(&four, &[&args[..], &["--resume", &resume]].concat());
    loud.retain(|a| a != "--quiet"); // notes are not shown under --quiet
    let said = ok(&loud);
    assert!(
        said.contains("continuing on 4 workers (the checkpoint's run had 2)")
            && said.contains("each of the 2 workers' own, is summed onto worker 0"),
        "{said}"
    );
    std::fs::remove_dir_all(&four).unwrap();
    for d in [whole, threads, plain, cut] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn impossible_powersgd_options_are_refused_with_the_cause() {
    let dir = tmp("psgd-bad");
    for (compress, comm, want) in [
        (
            "powersgd:0",
            "ring",
            "rank must be a whole number of at least 1",
        ),
        (
            "powersgd:x",
            "ring",
            "rank must be a whole number of at least 1",
        ),
        (
            "powersgd:2",
            "tree",
            "--compress powersgd:2 with --comm tree",
        ),
        ("powersgd:60", "ring", "at rank 60 no weight of this model"),
        // A rank whose products would wrap around usize (this one sized a buffer past memory).
        (
            "powersgd:9223372036854775808",
            "ring",
            "at rank 9223372036854775808 no weight of this model",
        ),
    ] {
        let o = run(&small(
            &dir,
            &["--workers", "2", "--comm", comm, "--compress", compress],
        ));
        assert_eq!(o.status.code(), Some(1), "{compress} {comm}: {}", text(&o));
        assert!(text(&o).contains(want), "{compress} {comm}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{}", text(&o));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `to`, a copy of the checkpoint `from` whose bytes just past the first `pattern`
/// in its header are replaced by `with` (at `offset` from the pattern's start): an edited
/// record, as a user's hand or a bad disk leaves one. Returns `to` as an argument.
fn edited_copy(from: &Path, pattern: &[u8], offset: usize, with: &[u8], to: &Path) -> String {
    let mut bytes = std::fs::read(from).unwrap();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern)
        .unwrap_or_else(|| {
            panic!(
                "{} holds no {:?}",
                from.display(),
                String::from_utf8_lossy(pattern)
            )
        });
    bytes[at + offset..at + offset + with.len()].copy_from_slice(with);
    std::fs::write(to, bytes).unwrap();
    to.display().to_string()
}

/// `dptrain train` of `args` started in `cwd`.
fn run_in(cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn a_resume_given_only_the_checkpoint_follows_its_runs_model_data_batch_and_seed() {
    let root = tmp("follow");
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    idx_dir(&root.join("data"), 320);
    // A model file of another name than the default's, relative to where the run starts.
    let lenet = include_str!("../src/model/builtin/lenet5.toml");
    let tiny = lenet.replacen("name = \"lenet5\"", "name = \"tiny\"", 1);
    assert_ne!(tiny, lenet);
    std::fs::write(root.join("tiny.toml"), tiny).unwrap();
    let run_options = [
        "--model",
        "tiny.toml",
        "--dataset",
        "idx",
        "--data-dir",
        "data",
        "--batch",
        "32",
        "--seed",
        "7",
        "--train-limit",
        "256",
        "--test-limit",
        "50",
        "--epochs",
        "2",
        "--threads",
        "1",
    ];
    let mut straight = vec!["train", "--quiet", "--run-dir", "straight"];
    straight.extend(run_options);
    let o = run_in(&root, &straight);
    assert!(o.status.success(), "{}", text(&o));
    let ck1 = "../straight/checkpoint-epoch0001.safetensors";

    // From another directory, `--resume` alone: the model file and the data directory are
    // found at the absolute paths the run resolved them to, and the run continues bit for bit.
    let elsewhere = root.join("elsewhere");
    let o = run_in(
        &elsewhere,
        &["train", "--resume", ck1, "--run-dir", "../resumed"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("resuming the checkpoint's run's --model /")
            && t.contains("tiny.toml, --dataset idx, --data-dir /")
            && t.contains("--batch 32, --seed 7, --train-limit 256 (give the option for another)"),
        "{t}"
    );
    assert_eq!(
        common::max_weight_diff(
            &weights(&root.join("straight")),
            &weights(&root.join("resumed"))
        ),
        0.0
    );
    // From where the run started alike.
    let o = run_in(
        &root,
        &[
            "train",
            "--resume",
            "straight/checkpoint-epoch0001.safetensors",
            "--run-dir",
            "alone",
        ],
    );
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("tiny.toml, --dataset idx"),
        "{t}"
    );
    assert_eq!(
        weights(&root.join("straight")),
        weights(&root.join("alone"))
    );
    // A followed value is checked as a given one, and the refusal says where it came from.
    let o = run_in(
        &root,
        &[
            "train",
            "--resume",
            "straight/checkpoint-epoch0001.safetensors",
            "--workers",
            "3",
            "--run-dir",
            "three",
        ],
    );
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("--batch 32 must be a positive multiple of --workers 3")
            && t.contains("this resume took --model /"),
        "{t}"
    );
    // The run's dataset named again without its directory takes the run's directory.
    let o = run_in(
        &elsewhere,
        &[
            "train",
            "--resume",
            ck1,
            "--dataset",
            "idx",
            "--run-dir",
            "../named",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        weights(&root.join("straight")),
        weights(&root.join("named"))
    );
    // A model file moved away is not replaced by one of the same relative name here: the
    // resume names the path its run resolved, and that it came from the checkpoint.
    std::fs::copy(root.join("tiny.toml"), elsewhere.join("tiny.toml")).unwrap();
    std::fs::rename(root.join("tiny.toml"), root.join("moved.toml")).unwrap();
    let o = run_in(
        &elsewhere,
        &["train", "--resume", ck1, "--run-dir", "../gone"],
    );
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("tiny.toml does not exist")
            && t.contains("this resume took --model /"),
        "{t}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_resume_in_one_process_keeps_the_runs_mpi_only_options_in_its_own_checkpoints() {
    // `--hierarchical` means nothing in one process, so a resume there does not follow it; it
    // keeps it in its own record, so that a resume of its checkpoints over MPI still does.
    let first = tmp("kept-first");
    ok(&small(
        &first,
        &["--workers", "2", "--hierarchical", "2d", "--epochs", "1"],
    ));
    let ck1 = first.join("checkpoint-epoch0001.safetensors");
    let header = |path: &Path| String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
    let record = br#"hierarchical\":\"2d"#;
    assert!(header(&ck1).contains(std::str::from_utf8(record).unwrap()));
    let resumed = tmp("kept-resumed");
    let mut args = small(&resumed, &["--resume", ck1.to_str().unwrap()]);
    args.retain(|a| a != "--quiet");
    let said = ok(&args);
    assert!(
        said.contains("keeping the checkpoint's run's --hierarchical 2d in this run's checkpoints"),
        "{said}"
    );
    let ck2 = resumed.join("checkpoint-epoch0002.safetensors");
    assert!(
        header(&ck2).contains(std::str::from_utf8(record).unwrap()),
        "the resumed run's checkpoint lost the hierarchy"
    );
    // Kept values are judged as followed ones are: one no run could have had is refused.
    let to = first.join("edited.safetensors");
    let edited = edited_copy(&ck1, record, record.len() - 2, b"zz", &to);
    let o = run(&small(&resumed, &["--resume", &edited, "--overwrite"]));
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("the checkpoint records --hierarchical zz, which no run could have had"),
        "{t}"
    );
    let mut args = small(
        &resumed,
        &["--resume", &edited, "--overwrite", "--resume-changed"],
    );
    args.retain(|a| a != "--quiet");
    let said = ok(&args);
    assert!(
        said.contains("not keeping the checkpoint's run's --hierarchical zz"),
        "{said}"
    );
    assert!(!header(&ck2).contains("hierarchical"));
    for d in [first, resumed] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_refused_resume_says_nothing_of_the_run_it_does_not_start() {
    let first = tmp("refused-first");
    ok(&small(&first, &["--batch", "32"]));
    let loud = |dir: &Path, extra: &[&str]| {
        let mut args = small(dir, extra);
        args.retain(|a| a != "--quiet");
        let o = run(&args);
        (o.status.success(), text(&o))
    };
    // Finished: asked for fewer epochs, refused without the stretched cosine curve's warning
    // (said before the refusal, of a run that trains no epoch).
    let ck2 = first.join("checkpoint-epoch0002.safetensors");
    let (done, t) = loud(
        &first,
        &["--resume", ck2.to_str().unwrap(), "--epochs", "1"],
    );
    assert!(
        !done && t.contains("already completed 2 epochs") && !t.contains("cosine"),
        "{t}"
    );
    // Into the directory of another run: refused by the directory, before the notes of what
    // the resume took from its checkpoint's run.
    let other = tmp("refused-other");
    ok(&small(&other, &["--seed", "7", "--epochs", "1"]));
    let ck1 = first.join("checkpoint-epoch0001.safetensors");
    let (done, t) = loud(&other, &["--resume", ck1.to_str().unwrap()]);
    assert!(
        !done && t.contains("error:") && !t.contains("resuming the checkpoint's run's"),
        "{t}"
    );
    // A taken value refused names itself as taken even where it is the option's default
    // (unsaid in the note): it named only the others.
    let other_ck = other.join("checkpoint-epoch0001.safetensors");
    let three = first.join("three");
    let args = ["--resume", other_ck.to_str().unwrap(), "--workers", "3"];
    let (done, t) = loud(&three, &args);
    assert!(
        !done
            && t.contains("--batch 64 must be a positive multiple of --workers 3")
            && t.contains("this resume took --seed 7, --batch 64 from the checkpoint's run"),
        "{t}"
    );
    for d in [first, other] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A run that left bad samples out (`--skip-bad-samples`) is resumed leaving them out:
/// `--resume CK` alone finishes it bit for bit, where it used to stop at the first bad file,
/// hours into the epoch (the resume reads the checkpoint's normalisation, so no start-up
/// read finds them first). A checkpoint whose record of it is edited is refused naming it.
#[test]
fn a_resume_follows_the_runs_skipping_of_bad_samples() {
    let tmp = tmp("skip-bad");
    let photos = tmp.join("photos");
    for (split, count) in [("train", 24u8), ("test", 4)] {
        for class in ["a", "b"] {
            let dir = photos.join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..count {
                let v = if class == "a" { 200 } else { 40 };
                let img = image::RgbImage::from_fn(20 + i as u32, 24, |x, y| {
                    image::Rgb([v, (x * 9) as u8 ^ i, (y * 7) as u8])
                });
                img.save(dir.join(format!("{i}.png"))).unwrap();
            }
        }
    }
    // One bad file in each training class, none in the test split (which is read whole).
    std::fs::write(photos.join("train/a/zero.png"), b"").unwrap();
    std::fs::write(photos.join("train/b/cut.png"), b"\x89PNG\r\n\x1a\n cut").unwrap();
    let photos = photos.display().to_string();
    let args = |dir: &Path, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--dataset",
            "imagefolder",
            "--data-dir",
            &photos,
            "--image-size",
            "16",
            "--batch",
            "8",
            "--epochs",
            "2",
            "--threads",
            "1",
            "--quiet",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        a.extend(["--run-dir".into(), dir.display().to_string()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let whole = tmp.join("whole");
    ok(&args(&whole, &["--skip-bad-samples"]));
    let ck1 = whole.join("checkpoint-epoch0001.safetensors");
    let ck1 = ck1.display().to_string();
    let resumed = tmp.join("resumed");
    let said = ok(&[
        "train".into(),
        "--resume".into(),
        ck1.clone(),
        "--run-dir".into(),
        resumed.display().to_string(),
        "--threads".into(),
        "1".into(),
    ]);
    assert!(
        said.contains("resuming the checkpoint's run's --skip-bad-samples: it left unreadable"),
        "{said}"
    );
    assert_eq!(weights(&whole), weights(&resumed));
    // Its off form: the resume stops at the first bad file, naming it, and follows nothing.
    let strict = tmp.join("strict");
    let o = run(&[
        "train".into(),
        "--resume".into(),
        ck1.clone(),
        "--run-dir".into(),
        strict.display().to_string(),
        "--threads".into(),
        "1".into(),
        "--skip-bad-samples=false".into(),
    ]);
    let t = text(&o);
    assert!(
        !o.status.success()
            && (t.contains("zero.png") || t.contains("cut.png"))
            && !t.contains("resuming the checkpoint's run's --skip-bad-samples"),
        "{t}"
    );
    let to = tmp.join("edited.safetensors");
    let edited = edited_copy(
        Path::new(&ck1),
        br#""skip_bad_samples":"true""#,
        20,
        b"tx",
        &to,
    );
    let o = run(&["train".into(), "--resume".into(), edited]);
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("metadata 'skip_bad_samples' is neither true nor false"),
        "{t}"
    );
    // A checkpoint that records no choice (an older dptrain's; the key renamed here) of a
    // folder's run: the resume says so before it starts, as for the other records.
    let to = tmp.join("older.safetensors");
    let older = edited_copy(Path::new(&ck1), br#""skip_bad_samples""#, 16, b"z", &to);
    let dir = tmp.join("older").display().to_string();
    let o = run(&[
        "train".into(),
        "--resume".into(),
        older,
        "--run-dir".into(),
        dir,
    ]);
    let t = text(&o);
    assert!(
        t.contains("the checkpoint records no --skip-bad-samples setting (an older dptrain"),
        "{t}"
    );
    // Epochs past counting are refused on a folder too (its data is loaded apart).
    let forever = tmp.join("forever");
    let mut a = args(&forever, &[]);
    let at = a.iter().position(|x| x == "--epochs").unwrap();
    a[at + 1] = usize::MAX.to_string();
    let o = run(&a);
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("is more steps than a run can count"),
        "{t}"
    );
    assert!(!forever.exists());
    std::fs::remove_dir_all(tmp).unwrap();
}

/// The checkpoints a run directory holds, by epoch.
fn checkpoint_epochs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("checkpoint-epoch"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_resume_takes_the_runs_exchange_and_keeping_where_not_given_option_groups_whole() {
    let common = [
        "--workers",
        "2",
        "--link-bandwidth",
        "1Gbit",
        "--link-latency",
        "5us",
        "--schedule",
        "priority",
        "--credit-kb",
        "64",
        "--keep-checkpoints",
        "10",
        "--epochs",
        "3",
    ];
    let straight = tmp("exchange-straight");
    ok(&small(&straight, &common));
    let ck1 = straight.join("checkpoint-epoch0001.safetensors");
    // A copy of epoch 1's checkpoint alone, resumed alone: the run's workers, link, schedule
    // and credit, and its ten checkpoints kept (the default two would prune epoch 1's).
    let alone = tmp("exchange-alone");
    std::fs::create_dir_all(&alone).unwrap();
    let copy = alone.join("checkpoint-epoch0001.safetensors");
    std::fs::copy(&ck1, &copy).unwrap();
    let resume = copy.display().to_string();
    // (`small` gives --epochs 2 where none is given.)
    let mut args = small(&alone, &["--resume", &resume, "--epochs", "3"]);
    args.retain(|a| a != "--quiet");
    let said = ok(&args);
    assert!(
        said.contains(
            "--workers 2, --schedule priority, --credit-kb 64, --link-bandwidth 1Gbit, \
             --link-latency 5us (give"
        ) && said.contains("--keep-checkpoints 10"),
        "{said}"
    );
    assert!(weights(&alone) == weights(&straight), "other weights");
    assert_eq!(checkpoint_epochs(&alone), checkpoint_epochs(&straight));
    assert_eq!(checkpoint_epochs(&alone).len(), 3);
    // One option of a group given takes none of the group: no link (its latency with it),
    // the overlap schedule (the credit with it).
    let changed = tmp("exchange-changed");
    let given = [
        "--resume",
        ck1.to_str().unwrap(),
        "--link-bandwidth",
        "none",
        "--schedule",
        "overlap",
    ];
    ok(&small(&changed, &given));
    // `auto` asks for a computed default by name: the run's credit is not taken (nor, as a
    // number given would, anything else of its group, which is given whole here).
    let auto = tmp("exchange-auto");
    let given = [
        "--resume",
        ck1.to_str().unwrap(),
        "--schedule",
        "priority",
        "--credit-kb",
        "auto",
    ];
    ok(&small(&auto, &given));
    let config = |dir: &Path| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join("summary.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["config"].clone()
    };
    assert_eq!(config(&straight)["credit_kb"], 64);
    assert_eq!(config(&auto)["credit_kb"], serde_json::Value::Null);
    assert_eq!(config(&auto)["schedule"], "priority");
    // --comm shm given: the run's link conflicts with it (shm sends no messages) and is left,
    // said; the rest is taken.
    let shm = tmp("exchange-shm");
    let args = [
        "--resume",
        ck1.to_str().unwrap(),
        "--comm",
        "shm",
        "--epochs",
        "3",
    ];
    let mut args = small(&shm, &args);
    args.retain(|a| a != "--quiet");
    let said = ok(&args);
    assert!(
        said.contains(
            "not resuming with the checkpoint's run's --link-bandwidth 1Gbit, --link-latency \
             5us: with the options given, --comm shm"
        ) && said.contains("resuming the checkpoint's run's --workers 2"),
        "{said}"
    );
    // A group that conflicts with a config file's option is such a conflict too, not an
    // edited record (it was refused as one, judged with the file's options).
    let file = shm.join("skip.toml");
    std::fs::write(&file, "on-nonfinite = \"skip\"\n").unwrap();
    let args = [
        "--resume",
        ck1.to_str().unwrap(),
        "--config",
        file.to_str().unwrap(),
    ];
    let mut args = small(&shm, &args);
    args.retain(|a| a != "--quiet");
    let said = ok(&args);
    assert!(
        said.contains("not resuming with the checkpoint's run's --schedule priority, --credit-kb 64: with the options given"),
        "{said}"
    );
    // --link-latency alone: the run's bandwidth is set aside with its group, and the
    // refusal says so.
    let latency = ["--resume", ck1.to_str().unwrap(), "--link-latency", "10us"];
    let o = run(&small(&shm, &latency));
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("did not take the run's --link-bandwidth 1Gbit, whose group"),
        "{t}"
    );
    std::fs::remove_dir_all(&shm).unwrap();
    // An exchange record edited so that it does not read: eval reads the checkpoint still; a
    // resume, which would follow it, is refused naming the entry, unless --resume-changed.
    let to = changed.join("edited.safetensors");
    let bad = edited_copy(&ck1, br#"workers\":2,"#, 10, b"x", &to);
    let o = run(&["eval".to_string(), bad.clone()]);
    assert!(o.status.success(), "{}", text(&o));
    let refused = tmp("exchange-refused");
    let o = run(&small(&refused, &["--resume", &bad]));
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("metadata 'exchange' does not read back")
            && t.contains("give --resume-changed"),
        "{t}"
    );
    let said = ok(&small(&refused, &["--resume", &bad, "--resume-changed"]));
    assert!(
        said.contains("not following the run's communication options"),
        "{said}"
    );
    // An entry that reads but holds a value no run could have had (a schedule of another
    // name): refused alike, not left with a warning as a conflict with an option given is.
    let to = changed.join("schedule.safetensors");
    let schedule = edited_copy(&ck1, br#"schedule\":\"priority\""#, 20, b"z", &to);
    let o = run(&small(&refused, &["--resume", &schedule]));
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains(
                "the checkpoint records --schedule prioritz, --credit-kb 64, which no run"
            )
            && t.contains("give --resume-changed"),
        "{t}"
    );
    let said = ok(&small(
        &refused,
        &["--resume", &schedule, "--resume-changed"],
    ));
    assert!(said.contains("which no run could have had"), "{said}");
    // A routine entry edited alike (a count to keep of 0) is judged the same way.
    let to = changed.join("kept.safetensors");
    let kept = edited_copy(&ck1, br#""keep_checkpoints":"10""#, 20, b"0", &to);
    let o = run(&["eval".to_string(), kept.clone()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&small(&refused, &["--resume", &kept, "--overwrite"]));
    let t = text(&o);
    assert!(
        !o.status.success()
            && t.contains("metadata 'keep_checkpoints' missing or not a valid count")
            && t.contains("evaluation, checkpoint and log routine cannot be followed"),
        "{t}"
    );
    for d in [straight, alone, changed, auto, refused] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
