//! End-to-end training behaviour: data-parallel equivalence, identical replicas in every mode,
//! overlap on/off, checkpoints and exact resume.

use dptrain::config::{TrainConfig, TrainOptions};
use dptrain::train::checkpoint::{Checkpoint, CheckpointError};
use dptrain::train::{train, Summary};
use std::path::Path;

fn config(dir: &Path, f: impl FnOnce(&mut TrainOptions)) -> TrainConfig {
    let mut o = TrainOptions {
        dataset: Some("synthetic".into()),
        epochs: Some(1),
        batch: Some(16),
        lr: Some(0.05),
        lr_schedule: Some("constant".into()),
        warmup_steps: Some(0),
        train_limit: Some(320), // 20 steps of 16
        test_limit: Some(64),
        threads: Some(1),
        comm_timeout: Some(30.0),
        run_dir: Some(dir.to_path_buf()),
        quiet: true,
        ..Default::default()
    };
    f(&mut o);
    o.resolve().unwrap()
}

fn run(dir: &Path, f: impl FnOnce(&mut TrainOptions)) -> Summary {
    train(config(dir, f)).unwrap_or_else(|e| panic!("training failed: {e}"))
}

/// All parameters, momentum and buffers of a checkpoint, flattened in name order.
fn weights(s: &Summary) -> Vec<(String, Vec<f32>)> {
    let ck = Checkpoint::load(s.checkpoint.as_ref().expect("a checkpoint was written")).unwrap();
    let mut names: Vec<_> = ck.tensors.keys().cloned().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let v = ck.tensors[&n].values();
            (n, v)
        })
        .collect()
}

/// The largest difference between the model tensors (weights and running statistics, not the
/// optimizer's) of two checkpoints' [`weights`]; fails if there are none to compare.
fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    let model = |x: &&(String, Vec<f32>)| !x.0.starts_with("optimizer.");
    assert!(
        a.iter().filter(model).count() > 0,
        "no model tensors to compare"
    );
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .filter(|(x, _)| model(x))
        .map(|(x, y)| {
            assert_eq!(x.0, y.0);
            x.1.iter()
                .zip(&y.1)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

/// N workers x batch b train like 1 worker x batch N*b, bit for bit, exactly where the README
/// says: models without batch norm (its statistics are each worker's), N a power of two, b a
/// multiple of 4, with `--comm redundant` (any mode at N = 2). Every parameter gradient is a
/// sum over 4-sample chunks added as a pairwise tree split at the middle, rounding up
/// (`backend::sum_order`), the loss is a mean over the global batch (each sample's
/// gradient the same whatever N), and `redundant` adds the workers' sums in the same tree. The
/// grid covers every power of two up to 8 against per-worker batches 4, 8, 12, 16 and 24
/// (12 and 24: an odd number of chunks per worker); weights and momentum after 5 steps.
#[test]
fn n_workers_match_one_worker_with_the_whole_batch_over_a_grid() {
    let tmp = tempfile::tempdir().unwrap();
    let go = |name: &str, model: &str, dataset: &str, workers: usize, batch: usize, comm: &str| {
        let s = run(&tmp.path().join(name), |o| {
            o.model = Some(model.into());
            o.dataset = Some(dataset.into());
            o.workers = Some(workers);
            o.batch = Some(batch);
            o.train_limit = Some(batch * 5);
            o.test_limit = Some(8);
            o.comm = Some(comm.into());
            o.warmup_steps = Some(0);
        });
        weights(&s)
    };
    for (model, dataset, sizes) in [
        ("lenet5", "synthetic", &[4usize, 8, 12, 16, 24][..]),
        ("vgg-small", "synthetic:3x32x32", &[4, 12][..]),
    ] {
        let mut ones = std::collections::HashMap::new();
        for &b in sizes {
            for workers in [2usize, 4, 8] {
                let total = workers * b;
                let one = ones
                    .entry(total)
                    .or_insert_with(|| {
                        go(
                            &format!("{model}-1x{total}"),
                            model,
                            dataset,
                            1,
                            total,
                            "redundant",
                        )
                    })
                    .clone();
                let mut comms = vec!["redundant", "shm"];
                if workers == 2 {
                    comms.extend(["ring", "tree", "hd", "auto"]);
                }
                for comm in comms {
                    let many = go(
                        &format!("{model}-{workers}x{b}-{comm}"),
                        model,
                        dataset,
                        workers,
                        workers * b,
                        comm,
                    );
                    let d = max_diff(&one, &many);
                    assert_eq!(
                        d,
                        0.0,
                        "{model}: {workers} workers x {b} ({comm}) differ from 1 x {} by {d}",
                        workers * b
                    );
                }
            }
        }
    }
}

#[test]
fn replicas_stay_bit_identical_in_every_mode_and_overlap_does_not_change_results() {
    let tmp = tempfile::tempdir().unwrap();
    for comm in ["tree", "ring", "hd", "redundant", "shm", "auto"] {
        let mut per_overlap = Vec::new();
        for overlap in ["on", "off"] {
            let s = run(&tmp.path().join(format!("{comm}-{overlap}")), |o| {
                o.workers = Some(3);
                o.batch = Some(24);
                o.train_limit = Some(24 * 8);
                o.comm = Some(comm.into());
                o.overlap = Some(overlap.into());
                o.bucket_kb = Some(0.into());
                o.first_bucket_kb = Some(0.into());
            });
            assert_eq!(s.replica_hashes.len(), 3);
            assert!(
                s.replica_hashes.iter().all(|&h| h == s.replica_hashes[0]),
                "{comm}/{overlap}: replicas differ {:x?}",
                s.replica_hashes
            );
            per_overlap.push(weights(&s));
        }
        assert_eq!(
            max_diff(&per_overlap[0], &per_overlap[1]),
            0.0,
            "{comm}: overlap on and off give different weights"
        );
    }
}

#[test]
fn priority_scheduling_gives_overlaps_weights_bit_for_bit_in_every_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let bits = |s: &Summary| -> Vec<(String, Vec<u32>)> {
        weights(s)
            .into_iter()
            .map(|(n, v)| (n, v.into_iter().map(f32::to_bits).collect()))
            .collect()
    };
    // With an emulated link the backlog at the end of backward goes input-first; the
    // in-memory ones keep nearly backward's order. Two epochs: the update deferred past an
    // epoch's end, an evaluation and a checkpoint. Ring and halving-doubling add in an order
    // that follows the chunk an element falls in, so their runs share one partition size (8 KiB,
    // below lenet5's larger layers); redundant, shm and PowerSGD's buckets are compared with
    // each schedule's default partitions (whole buckets under overlap, 160 KB under priority).
    // PowerSGD's round 2 travels in the next bucket's collective under overlap where the plan
    // says it pays (here, with no link, where it assumes 20 us a message), not under priority,
    // so its case is redundant mode, whose sums do not depend on the message.
    // A credit (several partitions per decision) changes the order alone, not the sums.
    // (--comm, --link-bandwidth, --compress, --partition-kb of both runs, priority's --credit-kb)
    type Case = (
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
        Option<usize>,
        Option<usize>,
    );
    let cases: [Case; 8] = [
        ("ring", Some("100Mbit"), None, Some(8), None),
        ("ring", Some("100Mbit"), None, Some(8), Some(40)),
        ("hd", Some("100Mbit"), None, Some(8), None),
        ("auto", Some("100Mbit"), None, Some(8), None),
        ("redundant", Some("100Mbit"), None, None, None),
        ("redundant", None, Some("powersgd:2"), None, None),
        ("shm", None, None, None, None),
        ("auto", None, None, Some(8), None),
    ];
    for (comm, link, compress, partition_kb, credit_kb) in cases {
        let name = format!(
            "{comm}-{}-{}-{}-{}",
            link.unwrap_or("mem"),
            compress.unwrap_or("f32"),
            partition_kb.map_or("default".into(), |k| k.to_string()),
            credit_kb.map_or("one".into(), |k| k.to_string())
        );
        let base = |o: &mut TrainOptions| {
            o.workers = Some(3);
            o.batch = Some(24);
            o.train_limit = Some(24 * 6);
            o.epochs = Some(2);
            o.comm = Some(comm.into());
            o.bucket_kb = Some(0.into());
            o.first_bucket_kb = Some(0.into());
            o.link_bandwidth = link.map(String::from);
            o.compress = compress.map(String::from);
            o.partition_kb = partition_kb.map(Into::into);
        };
        let overlap = run(&tmp.path().join(format!("{name}-overlap")), base);
        let priority = run(&tmp.path().join(format!("{name}-priority")), |o| {
            base(o);
            o.schedule = Some("priority".into());
            o.credit_kb = credit_kb.map(Into::into);
        });
        assert!(
            priority
                .replica_hashes
                .iter()
                .all(|&h| h == priority.replica_hashes[0]),
            "{name}: replicas differ under priority scheduling"
        );
        assert!(
            bits(&overlap) == bits(&priority),
            "{name}: priority scheduling changed the weights or the optimizer's state"
        );
        assert!(
            overlap
                .replica_hashes
                .iter()
                .all(|&h| h == overlap.replica_hashes[0]),
            "{name}: replicas differ under overlap"
        );
    }
    // PowerSGD pipelined on a ring of 3, whose sums follow the message (no link: the plan
    // carries): the replicas agree, and on 2 threads per worker the bits are the same.
    let ring = |o: &mut TrainOptions| {
        o.workers = Some(3);
        o.batch = Some(24);
        o.train_limit = Some(24 * 6);
        o.epochs = Some(1);
        o.comm = Some("ring".into());
        o.bucket_kb = Some(0.into());
        o.first_bucket_kb = Some(0.into());
        o.compress = Some("powersgd:2".into());
    };
    let one = run(&tmp.path().join("ring-powersgd-1"), ring);
    let two = run(&tmp.path().join("ring-powersgd-2"), |o| {
        ring(o);
        o.threads = Some(2);
    });
    assert!(
        one.replica_hashes
            .iter()
            .all(|&h| h == one.replica_hashes[0]),
        "ring powersgd: replicas differ {:x?}",
        one.replica_hashes
    );
    assert!(
        bits(&one) == bits(&two),
        "ring powersgd: the thread count changed the bits"
    );
}

#[test]
fn resume_continues_bit_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    for workers in [1, 2] {
        let base = |o: &mut TrainOptions| {
            o.workers = Some(workers);
            o.lr_schedule = Some("cosine".into());
            o.epochs = Some(2);
            o.train_limit = Some(160);
        };
        let straight = run(&tmp.path().join(format!("straight{workers}")), base);
        // The straight run checkpointed after each epoch; resume from epoch 1.
        let ck1 = tmp
            .path()
            .join(format!("straight{workers}"))
            .join("checkpoint-epoch0001.safetensors");
        assert!(ck1.is_file());
        let resumed = run(&tmp.path().join(format!("resumed{workers}")), |o| {
            base(o);
            o.resume = Some(ck1.clone());
        });
        let (a, b) = (weights(&straight), weights(&resumed));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.0, y.0);
            assert!(
                x.1.iter()
                    .zip(&y.1)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{workers} workers: {} differs after resume",
                x.0
            );
        }
    }
}

/// `--resume CK` alone finishes the run it interrupted: the learning rate, its schedule and
/// warm-up, the SGD settings and the augmentation are the checkpoint's run's, not the flags'
/// defaults (which would train on at another rate). A value given again wins, and is warned
/// about.
#[test]
fn a_resume_given_only_the_checkpoint_continues_its_runs_recipe_bit_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = |o: &mut TrainOptions| {
        o.lr = Some(0.02);
        o.lr_schedule = Some("step:1:0.5".into());
        o.warmup_steps = Some(3);
        o.momentum = Some(0.8);
        o.weight_decay = Some(1e-3);
        o.nesterov = Some(false);
        o.augment = Some("flip".into());
    };
    let base = |o: &mut TrainOptions| {
        o.epochs = Some(2);
        o.train_limit = Some(96);
        o.commit_every = Some(2);
    };
    let straight = run(&tmp.path().join("straight"), |o| {
        base(o);
        recipe(o);
    });
    let ck1 = tmp.path().join("straight/checkpoint-epoch0001.safetensors");
    let said = std::cell::RefCell::new(Vec::<String>::new());
    let resume = |dir: &str, f: &dyn Fn(&mut TrainOptions)| {
        let cfg = config(&tmp.path().join(dir), |o| {
            o.train_limit = Some(96);
            (o.lr, o.lr_schedule, o.warmup_steps, o.epochs) = (None, None, None, None);
            o.test_limit = None;
            o.resume = Some(ck1.clone());
            f(o);
        });
        said.borrow_mut().clear();
        let group = dptrain::train::processes::ProcessGroup::single();
        dptrain::train::train_in(cfg, &group, &|w| said.borrow_mut().push(w.to_string()))
            .unwrap_or_else(|e| panic!("resume failed: {e}"))
    };
    let resumed = resume("resumed", &|_| {});
    assert!(said.borrow().is_empty(), "{:?}", said.borrow());
    // Evaluated on the run's 64 test images and committing every 2 steps, as the run did
    // (the figures of its epochs alike; a second interruption loses at most 2 steps).
    assert_eq!(resumed.config["test_limit"], 64);
    assert_eq!(resumed.config["commit_every"], 2, "{}", resumed.config);
    let commits = std::fs::read_dir(tmp.path().join("resumed"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            dptrain::train::commit::commit_step(&name.to_string_lossy()).is_some()
        })
        .count();
    assert!(commits > 0, "the resumed run committed nothing");
    resume("other-limit", &|o| o.test_limit = Some(32));
    let said_now = said.borrow().join("\n");
    assert!(
        said_now.contains("--test-limit 32: the checkpoint's run evaluated on 64"),
        "{said_now}"
    );
    let (a, b) = (weights(&straight), weights(&resumed));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!(
            x.1.iter()
                .zip(&y.1)
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "{} differs after a resume given only the checkpoint",
            x.0
        );
    }
    // Another rate given: it wins (other weights), and the resume says it is another recipe.
    let lowered = resume("lowered", &|o| o.lr = Some(0.01));
    let said_now = said.borrow().join("\n");
    assert!(
        said_now.contains("another recipe") && said_now.contains("--lr 0.01 (the run's was 0.02)"),
        "{said_now}"
    );
    assert_ne!(weights(&lowered), a);
    // A recipe edited to a value the flags refuse: a resume, which would follow it, refuses
    // naming the entry; what does not follow it (eval, predict, export, --weights) loads it.
    let bytes = std::fs::read(&ck1).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"\"momentum\":\"0.8\"")
        .expect("the momentum is recorded");
    let mut edited = bytes.clone();
    edited[at..at + 16].copy_from_slice(b"\"momentum\":\"1.5\"");
    let bad = tmp.path().join("edited.safetensors");
    std::fs::write(&bad, edited).unwrap();
    if let Err(e) = dptrain::train::description::TrainedModel::load(&bad) {
        panic!("{e}");
    }
    let err = train(config(&tmp.path().join("edited"), |o| {
        o.resume = Some(bad.clone());
        o.train_limit = Some(96);
    }))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(
            "metadata 'momentum' must be in [0, 1), not 1.5 (its metadata was changed, or a \
             newer dptrain wrote it), so the run's learning rate, schedule, SGD settings and \
             augmentation cannot be followed"
        ) && err.contains("give its options yourself (--lr, --lr-schedule,"),
        "{err}"
    );
    // --resume-changed resumes it on the options given and the defaults, as it does an
    // unreadable routine or exchange (it refused before the three records were judged alike).
    resume("edited-changed", &|o| {
        o.resume = Some(bad.clone());
        o.resume_changed = true;
    });
    let said_now = said.borrow().join("\n");
    assert!(
        said_now.contains(
            "not 1.5: not following the run's learning rate, schedule, SGD settings and \
             augmentation"
        ),
        "{said_now}"
    );
}

#[test]
fn compressed_gradients_keep_replicas_identical_resume_exactly_and_change_only_the_rounding() {
    let tmp = tempfile::tempdir().unwrap();
    let bits = |s: &Summary| -> Vec<u32> {
        weights(s)
            .into_iter()
            .flat_map(|(_, v)| v.into_iter().map(f32::to_bits))
            .collect()
    };
    for comm in ["ring", "redundant", "tree"] {
        let base = |o: &mut TrainOptions| {
            o.workers = Some(3);
            o.batch = Some(24);
            o.train_limit = Some(24 * 6);
            o.comm = Some(comm.into());
            o.bucket_kb = Some(0.into());
            o.first_bucket_kb = Some(0.into());
        };
        let plain = run(&tmp.path().join(format!("{comm}-f32")), base);
        for compress in ["fp16", "bf16"] {
            let s = run(&tmp.path().join(format!("{comm}-{compress}")), |o| {
                base(o);
                o.compress = Some(compress.into());
            });
            assert!(
                s.replica_hashes.iter().all(|&h| h == s.replica_hashes[0]),
                "{comm}/{compress}: replicas differ {:x?}",
                s.replica_hashes
            );
            // Applied (other bits than f32's), and only a rounding away after 6 steps.
            assert!(
                bits(&s) != bits(&plain),
                "{comm}/{compress}: same bits as f32"
            );
            let d = max_diff(&weights(&s), &weights(&plain));
            assert!(d < 1e-2, "{comm}/{compress}: weights {d} from f32's");
        }
    }
    // Resumed with the same flags, a compressed run continues bit-exactly.
    let base = |o: &mut TrainOptions| {
        o.workers = Some(2);
        o.comm = Some("ring".into());
        o.compress = Some("fp16".into());
        o.epochs = Some(2);
        o.train_limit = Some(160);
    };
    let straight = run(&tmp.path().join("straight"), base);
    let ck1 = tmp.path().join("straight/checkpoint-epoch0001.safetensors");
    let resumed = run(&tmp.path().join("resumed"), |o| {
        base(o);
        o.resume = Some(ck1.clone());
    });
    assert!(
        bits(&straight) == bits(&resumed),
        "fp16: resumed run differs"
    );
}

#[test]
fn a_resumed_run_computes_its_convolutions_as_its_checkpoint_did() {
    // Trained with --conv-algo direct and resumed without the flag (whose default is auto), the
    // run continues with direct: the same bits as the run never interrupted. Given the flag,
    // the resumed run computes as told (vgg-small has layers auto sends to Winograd).
    let tmp = tempfile::tempdir().unwrap();
    let base = |o: &mut TrainOptions| {
        o.model = Some("vgg-small".into());
        o.dataset = Some("synthetic:3x32x32".into());
        o.epochs = Some(2);
        o.train_limit = Some(32);
        o.test_limit = Some(16);
    };
    let straight = run(&tmp.path().join("straight"), |o| {
        base(o);
        o.conv_algo = Some("direct".into());
    });
    let ck1 = tmp.path().join("straight/checkpoint-epoch0001.safetensors");
    let resumed = run(&tmp.path().join("resumed"), |o| {
        base(o);
        o.resume = Some(ck1.clone());
    });
    let bits = |s: &Summary| -> Vec<u32> {
        weights(s)
            .into_iter()
            .flat_map(|(_, v)| v.into_iter().map(f32::to_bits))
            .collect()
    };
    assert!(
        bits(&straight) == bits(&resumed),
        "resumed without --conv-algo: not direct's bits"
    );
    let told = run(&tmp.path().join("told"), |o| {
        base(o);
        o.resume = Some(ck1.clone());
        o.conv_algo = Some("auto".into());
    });
    assert!(
        bits(&straight) != bits(&told),
        "--conv-algo auto on resume was ignored"
    );
}

#[test]
fn checkpoint_round_trip_is_exact_and_mismatches_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let s = run(&tmp.path().join("rt"), |o| o.train_limit = Some(64));
    let path = s.checkpoint.clone().unwrap();
    let ck = Checkpoint::load(&path).unwrap();
    let copy = tmp.path().join("copy.safetensors");
    ck.save(&copy).unwrap();
    assert_eq!(weights(&s), {
        let ck2 = Checkpoint::load(&copy).unwrap();
        let mut names: Vec<_> = ck2.tensors.keys().cloned().collect();
        names.sort();
        names
            .into_iter()
            .map(|n| (n.clone(), ck2.tensors[&n].values()))
            .collect::<Vec<_>>()
    });
    assert_eq!(Checkpoint::load(&copy).unwrap().state, ck.state);
    // Resuming a lenet5 checkpoint into vgg-small is refused with a reason.
    let err = train(config(&tmp.path().join("bad"), |o| {
        o.model = Some("vgg-small".into());
        o.dataset = Some("synthetic:3x32x32".into());
        o.resume = Some(path.clone());
        o.epochs = Some(3);
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("lenet5") && err.contains("--model"), "{err}");
    // A file that is not a checkpoint.
    std::fs::write(tmp.path().join("junk"), b"not a checkpoint at all").unwrap();
    let err = Checkpoint::load(&tmp.path().join("junk")).err().unwrap();
    assert!(err.to_string().contains("not a safetensors file"), "{err}");
    assert!(
        err.to_string()
            .contains("a checkpoint is what a training run writes"),
        "{err}"
    );
    // An ONNX export given for its checkpoint: said which to give.
    std::fs::rename(tmp.path().join("junk"), tmp.path().join("m.onnx")).unwrap();
    let err = Checkpoint::load(&tmp.path().join("m.onnx")).err().unwrap();
    assert!(
        err.to_string()
            .contains("give the checkpoint it was exported from"),
        "{err}"
    );
}

#[test]
fn pruning_keeps_the_last_k_of_this_run_and_never_touches_later_epochs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    run(&dir, |o| {
        o.epochs = Some(3);
        o.train_limit = Some(32);
        o.keep_checkpoints = Some(2);
    });
    let ck = |e: usize| dir.join(format!("checkpoint-epoch{e:04}.safetensors"));
    assert!(!ck(1).exists(), "epoch 1 should have been pruned (keep 2)");
    assert!(
        ck(2).is_file() && ck(3).is_file(),
        "the run's last two checkpoints must stay"
    );
    // A resumed run prunes its own older checkpoints, never later ones (a run resumed from an
    // earlier epoch of a longer run keeps that run's later checkpoints).
    std::fs::write(ck(9), b"a later epoch").unwrap();
    dptrain::train::checkpoint::prune(&dir, 1, 3);
    assert!(!ck(2).exists() && ck(3).is_file());
    assert!(ck(9).is_file(), "a later epoch's checkpoint was deleted");
}

#[test]
fn resume_refuses_another_run_unless_told_and_says_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let s = run(&tmp.path().join("a"), |o| o.train_limit = Some(64));
    let ck = s.checkpoint.clone().unwrap();
    let state = Checkpoint::load(&ck).unwrap().state;
    let identity = state.run.clone().expect("the run is recorded");
    assert_eq!(
        (
            identity.dataset.as_str(),
            identity.batch,
            identity.seed,
            identity.train_limit
        ),
        ("synthetic", 16, 1, Some(64))
    );
    type Change = (&'static str, Box<dyn Fn(&mut TrainOptions)>, &'static str);
    let changes: Vec<Change> = vec![
        (
            "batch",
            Box::new(|o| o.batch = Some(32)),
            "--batch 16 in the checkpoint, 32 now",
        ),
        (
            "seed",
            Box::new(|o| o.seed = Some(7)),
            "--seed 1 in the checkpoint, 7 now",
        ),
        (
            "dataset",
            Box::new(|o| o.dataset = Some("mnist".into())),
            "--dataset synthetic in the checkpoint, mnist now",
        ),
        (
            "train-limit",
            Box::new(|o| o.train_limit = Some(128)),
            "--train-limit 64 in the checkpoint, 128 now",
        ),
    ];
    for (name, change, want) in changes {
        let resume = |accept: bool, dir: &str| {
            train(config(&tmp.path().join(dir), |o| {
                o.train_limit = Some(64);
                o.epochs = Some(2);
                o.resume = Some(ck.clone());
                o.resume_changed = accept;
                change(o);
            }))
        };
        let err = resume(false, &format!("refused-{name}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(want) && err.contains("--resume-changed"),
            "{name}: {err}"
        );
        // Accepted when asked for, and the new checkpoint records the new settings.
        let s = resume(true, &format!("accepted-{name}")).unwrap();
        let now = Checkpoint::load(s.checkpoint.as_ref().unwrap())
            .unwrap()
            .state;
        assert_ne!(now.run, state.run, "{name}");
    }
    // The same settings resume silently, also with the dataset spelt out in full (the same
    // data), and the workers may change (same data, same order).
    train(config(&tmp.path().join("same"), |o| {
        o.train_limit = Some(64);
        o.epochs = Some(2);
        o.workers = Some(2);
        o.dataset = Some("synthetic:1x28x28:10".into());
        o.resume = Some(ck.clone());
    }))
    .unwrap();
    // Data of another input shape is refused before any setting (even with
    // --resume-changed), naming both shapes and (in-memory data) the size it trained at.
    let err = train(config(&tmp.path().join("other-input"), |o| {
        o.train_limit = Some(64);
        o.epochs = Some(2);
        o.dataset = Some("synthetic:1x32x32".into());
        o.resume = Some(ck.clone());
        o.resume_changed = true;
    }))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("trained on 1x28x28 inputs")
            && err.contains("gives 1x32x32")
            && err.contains("give the data the checkpoint's run trained on (28x28 images)"),
        "{err}"
    );
    // Without --resume-changed, other data of another shape names the checkpoint's data
    // (a resume that left --dataset out), and not --resume-changed, which cannot resume it.
    let err = train(config(&tmp.path().join("other-data"), |o| {
        o.train_limit = Some(64);
        o.epochs = Some(2);
        o.dataset = Some("synthetic:1x32x32".into());
        o.resume = Some(ck.clone());
    }))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--dataset synthetic in the checkpoint, synthetic:1x32x32 now")
            && err.contains("its model takes 1x28x28 inputs and this data gives 1x32x32")
            && !err.contains("pass --resume-changed"),
        "{err}"
    );
    // A resume for more epochs than the run was started for: under cosine, which spans the
    // run, said; under a constant rate, nothing to say.
    let loaded = Checkpoint::load(&ck).unwrap();
    assert_eq!(loaded.state.run.as_ref().unwrap().epochs, Some(1));
    let extend = |schedule: &str| {
        let cfg = config(&tmp.path().join("extend"), |o| {
            o.train_limit = Some(64);
            o.epochs = Some(3);
            o.lr_schedule = Some(schedule.into());
            o.resume = Some(ck.clone());
        });
        dptrain::train::check_resume(&cfg, ("lenet5", [1, 28, 28]), &loaded, &ck).unwrap()
    };
    let said = extend("cosine").expect("the stretched schedule is said");
    assert!(
        said.contains("--epochs 3: the checkpoint's run was started for 1"),
        "{said}"
    );
    assert_eq!(extend("constant"), None);
    // Without --epochs, a resume trains for the checkpoint's run's epochs (1, all done here),
    // not the flag's default of 4.
    let err = train(config(&tmp.path().join("no-epochs"), |o| {
        o.train_limit = Some(64);
        o.epochs = None;
        o.resume = Some(ck.clone());
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("already completed 1 epoch"), "{err}");
    // Channels alone: the size is not the remedy.
    let err = train(config(&tmp.path().join("other-channels"), |o| {
        o.train_limit = Some(64);
        o.epochs = Some(2);
        o.dataset = Some("synthetic:3x28x28".into());
        o.resume = Some(ck.clone());
        o.resume_changed = true;
    }))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("gives 3x28x28") && err.contains("the channel count is the data's"),
        "{err}"
    );
}

#[test]
fn a_changed_checkpoint_is_reported_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let s = run(&tmp.path().join("a"), |o| o.train_limit = Some(64));
    let path = s.checkpoint.clone().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = 8 + header;
    // One flipped bit anywhere in the tensor data, and a weight set to NaN (which used to load
    // and then read as "training diverged").
    let mut nan = bytes.clone();
    nan[data..data + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    for (what, bad) in [
        ("a flipped bit", {
            let mut b = bytes.clone();
            b[data + (bytes.len() - data) / 2] ^= 0x10;
            b
        }),
        ("a NaN weight", nan),
    ] {
        let copy = tmp.path().join("bad.safetensors");
        std::fs::write(&copy, &bad).unwrap();
        let err = Checkpoint::load(&copy).err().unwrap();
        assert!(
            matches!(err, CheckpointError::Corrupt { .. }),
            "{what}: {err}"
        );
        assert!(
            err.to_string()
                .contains("bad.safetensors is corrupt (checksum mismatch"),
            "{what}: {err}"
        );
        let err = train(config(&tmp.path().join("resumed"), |o| {
            o.train_limit = Some(64);
            o.epochs = Some(2);
            o.resume = Some(copy.clone());
        }))
        .unwrap_err()
        .to_string();
        assert!(err.contains("is corrupt"), "{what}: {err}");
    }
    // The untouched file still loads.
    Checkpoint::load(&path).unwrap();
}

#[test]
fn worker_0s_evaluation_and_checkpoint_are_not_booked_to_the_next_epochs_steps() {
    // Worker 0 evaluates and checkpoints between epochs (here a checkpoint that pauses for
    // about 2 s). The other workers wait for it between epochs, not in the next epoch's
    // collectives, where their step would book the wait as exposed communication.
    let tmp = tempfile::tempdir().unwrap();
    for schedule in ["overlap", "priority"] {
        let s = run(&tmp.path().join(schedule), |o| {
            o.workers = Some(2);
            o.epochs = Some(2);
            o.checkpoint_every = Some(1);
            o.inject_fault = Some("slow-checkpoint".into());
            o.schedule = Some(schedule.into());
        });
        // 20 steps an epoch (each counted once, whatever the workers): 2 s spread over them
        // would be 100 ms a step.
        let second = &s.epochs[1].breakdown;
        assert_eq!(second.steps, 20, "{schedule}");
        assert!(second.mean.step_ms < 20.0, "{schedule}: {:?}", second.mean);
        assert!(
            second.mean.exposed_comm_ms < 20.0,
            "{schedule}: {:?}",
            second.mean
        );
    }
}

#[test]
fn under_priority_an_epochs_steps_hold_its_time_when_restart_points_drain_every_step() {
    // Under priority a step's update waits for the next forward; before a restart point (and
    // the epoch's end) it is drained instead, and that wait and update are the step's own.
    let tmp = tempfile::tempdir().unwrap();
    let s = run(&tmp.path().join("r"), |o| {
        o.workers = Some(2);
        o.epochs = Some(2);
        o.schedule = Some("priority".into());
        o.link_bandwidth = Some("20Mbit".into());
        o.commit_every = Some(1);
    });
    let second = &s.epochs[1];
    // Worker 0's 20 steps of the second epoch (no warm-up there) against the epoch's time.
    let steps_s = 20.0 * second.breakdown.mean.step_ms / 1e3;
    assert!(
        steps_s > 0.8 * second.seconds && steps_s < 1.1 * second.seconds,
        "steps {steps_s:.3} s, epoch {:.3} s: {:?}",
        second.seconds,
        second.breakdown.mean
    );
    assert!(second.breakdown.mean.exposed_comm_ms > 0.0);
}

#[test]
fn a_run_shorter_than_the_warm_up_says_it_has_no_timed_steps() {
    let tmp = tempfile::tempdir().unwrap();
    // 3 steps: all of them untimed warm-up.
    let s = run(&tmp.path().join("short"), |o| o.train_limit = Some(48));
    assert_eq!(s.breakdown.steps, 0);
    let d = s.breakdown.describe();
    assert!(
        d.contains("no timed steps") && !d.contains("0.00 ms"),
        "{d}"
    );
    assert!(s.warnings().iter().any(|w| w.contains("no timed steps")));
    dptrain::report::write_run_report(&tmp.path().join("short")).unwrap();
    let report = std::fs::read_to_string(tmp.path().join("short/report.md")).unwrap();
    assert!(report.contains("No timed steps"), "{report}");
}

#[test]
fn a_run_directory_named_in_bytes_that_are_not_utf8_gets_its_summary_and_report() {
    use std::os::unix::ffi::OsStrExt;
    // A Linux name may hold any bytes: summary.json (JSON is Unicode) failed after training.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(std::ffi::OsStr::from_bytes(b"r\xe9s"));
    let s = run(&dir, |o| o.train_limit = Some(48));
    assert_eq!(s.run_dir, dir);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    let written = summary["run_dir"].as_str().unwrap();
    assert!(written.ends_with("r\u{fffd}s"), "{written}");
    assert!(summary["checkpoint"]
        .as_str()
        .unwrap()
        .contains("r\u{fffd}s/checkpoint-"));
    dptrain::report::write_run_report(&dir).unwrap();
    assert!(dir.join("report.md").is_file());
}

#[test]
fn the_custom_model_example_builds_a_network_in_code_and_trains_it() {
    // `cargo test` builds the examples next to the test binaries (target/<profile>/examples).
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let example = dir.join("examples").join("custom_model");
    assert!(example.is_file(), "{} not built", example.display());
    let out = std::process::Command::new(&example).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("block.c1") && stdout.contains("conv2d"),
        "{stdout}"
    );
    let acc: f64 = stdout
        .rsplit("test accuracy ")
        .next()
        .and_then(|s| s.trim().trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no accuracy in {stdout}"));
    assert!(acc > 80.0, "one epoch on 4096 images reached only {acc}%");
}

#[test]
fn checkpoints_hold_the_pytorch_state_dict_of_the_reference_models() {
    // tests/fixtures/state_dict_*.txt: names and shapes of `net.state_dict()` of
    // ../shared/peers/models.py, written by PyTorch.
    for model in ["lenet5", "vgg-small", "resnet20", "resnet18", "mobilenetv2"] {
        let want: std::collections::BTreeMap<String, Vec<usize>> =
            std::fs::read_to_string(format!("tests/fixtures/state_dict_{model}.txt"))
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| {
                    let mut it = l.split_whitespace();
                    let name = it.next().unwrap().to_string();
                    (name, it.map(|d| d.parse().unwrap()).collect())
                })
                .collect();
        let g = std::sync::Arc::new(dptrain::model::reference_graph(model).unwrap());
        let net = dptrain::nn::Net::new(
            g.clone(),
            dptrain::nn::NetConfig {
                max_batch: 1,
                seed: 1,
            },
        )
        .unwrap();
        let state = dptrain::train::checkpoint::TrainState {
            model: g.name.clone(),
            fingerprint: g.fingerprint(),
            epoch: 0,
            global_step: 0,
            step_in_epoch: 0,
            run: None,
        };
        let momentum = vec![0.0; net.params().len()];
        let ck = Checkpoint::capture(
            state,
            &net,
            dptrain::train::checkpoint::OptimizerState::momentum(&momentum),
        );
        let got: std::collections::BTreeMap<String, Vec<usize>> = ck
            .tensors
            .iter()
            .filter(|(k, _)| !k.starts_with("optimizer."))
            .map(|(k, v)| {
                let shape = match v {
                    dptrain::train::checkpoint::Stored::F32(s, _) => s.clone(),
                    dptrain::train::checkpoint::Stored::I64(_) => Vec::new(),
                };
                (k.clone(), shape)
            })
            .collect();
        assert_eq!(got, want, "{model}");
    }
}

#[test]
fn a_checkpoint_streamed_from_the_net_is_the_file_safetensors_writes_and_reads_back_exactly() {
    // The training run writes its checkpoint tensor by tensor from the net's memory
    // (`save_net`); it must be the file the safetensors crate would serialise from a copy
    // (`capture`), with the same data bytes, a checksum that verifies, and every value back.
    use dptrain::train::checkpoint::{save_net, Stored, TrainState, CHECKSUM_KEY};
    let g = std::sync::Arc::new(dptrain::model::reference_graph("resnet20").unwrap());
    let mut net = dptrain::nn::Net::new(
        g.clone(),
        dptrain::nn::NetConfig {
            max_batch: 1,
            seed: 3,
        },
    )
    .unwrap();
    // Distinct running statistics and a counter, so no state tensor is a default.
    for (i, v) in net.state_mut().iter_mut().enumerate() {
        *v = (1 + i % 1000) as f32;
    }
    let momentum: Vec<f32> = (0..net.params().len())
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let state = TrainState {
        model: g.name.clone(),
        fingerprint: g.fingerprint(),
        epoch: 4,
        global_step: 77,
        step_in_epoch: 0,
        run: None,
    };
    let description = dptrain::train::description::ModelDescription {
        model_source: "builtin:resnet20".into(),
        model_path: None,
        model_text: None,
        class_names: (0..10).map(|i| format!("c{i}")).collect(),
        input: [3, 32, 32],
        mean: vec![0.5; 3],
        std: vec![0.25; 3],
        eval_transform: dptrain::train::description::NO_TRANSFORM.into(),
        conv_algo: dptrain::backend::ConvAlgo::Direct,
    };
    let dir = tempfile::tempdir().unwrap();
    let streamed = dir.path().join("streamed.safetensors");
    save_net(
        &streamed,
        &state,
        &description,
        &net,
        dptrain::train::checkpoint::OptimizerState::momentum(&momentum),
        false,
    )
    .unwrap();
    let copy = Checkpoint::capture(
        state.clone(),
        &net,
        dptrain::train::checkpoint::OptimizerState::momentum(&momentum),
    );

    // The data section is what `safetensors::serialize` writes for the same tensors.
    struct View<'a>(&'a Stored);
    impl safetensors::View for View<'_> {
        fn dtype(&self) -> safetensors::Dtype {
            match self.0 {
                Stored::F32(..) => safetensors::Dtype::F32,
                Stored::I64(_) => safetensors::Dtype::I64,
            }
        }
        fn shape(&self) -> &[usize] {
            match self.0 {
                Stored::F32(s, _) => s,
                Stored::I64(_) => &[],
            }
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            match self.0 {
                Stored::F32(_, v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Stored::I64(x) => x.to_le_bytes().to_vec().into(),
            }
        }
        fn data_len(&self) -> usize {
            self.data().len()
        }
    }
    let reference = safetensors::serialize(
        copy.tensors.iter().map(|(k, v)| (k.as_str(), View(v))),
        None,
    )
    .unwrap();
    let data = |bytes: &[u8]| {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        bytes[8 + n..].to_vec()
    };
    let bytes = std::fs::read(&streamed).unwrap();
    assert_eq!(data(&bytes), data(&reference), "data section");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let digest: String = <sha2::Sha256 as sha2::Digest>::digest(data(&bytes))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(meta.metadata().as_ref().unwrap()[CHECKSUM_KEY], digest);

    let back = Checkpoint::load(&streamed).unwrap();
    assert_eq!(back.tensors, copy.tensors);
    assert_eq!((back.state.epoch, back.state.global_step), (4, 77));
    assert_eq!(back.description.as_ref(), Some(&description));
    let mut restored = dptrain::nn::Net::new(
        g,
        dptrain::nn::NetConfig {
            max_batch: 1,
            seed: 9,
        },
    )
    .unwrap();
    assert_eq!(back.restore(&mut restored).unwrap(), momentum);
    assert_eq!(restored.params(), net.params());
    assert_eq!(restored.state(), net.state());
}

#[test]
fn an_emulated_device_holds_every_phase_to_its_profile_and_refuses_a_profile_of_another_run() {
    // A profile of lenet5 at the per-worker batch (8), measured here, its times raised so that
    // the device is much slower than the real compute.
    let dir = tempfile::tempdir().unwrap();
    let p = dptrain::sim::measure(&dptrain::sim::MeasureSpec::new("lenet5", 8, 1, 2)).unwrap();
    let file = dir.path().join("device.json");
    std::fs::write(&file, serde_json::to_string(&p).unwrap()).unwrap();
    // At least 50 ms a phase: the 30% bound below then leaves 15 ms for wake-ups delayed by
    // the suite's other tests on the same cores (20 ms a phase was sensitive to such load).
    let scale = 50.0 / p.forward_ms().min(p.backward_ms());
    let with = |workers: usize| {
        let file = file.clone();
        move |o: &mut TrainOptions| {
            o.model = Some("lenet5".into());
            o.dataset = Some("synthetic:1x28x28".into());
            o.workers = Some(workers);
            o.train_limit = Some(16 * 6);
            o.no_checkpoints = true;
            o.emulate_device = Some(file);
            o.emulate_device_scale = Some(scale);
        }
    };
    let s = run(&dir.path().join("run"), with(2));
    let m = &s.breakdown.mean;
    let (f, b) = (scale * p.forward_ms(), scale * p.backward_ms());
    // Held to the device's time, and not much longer (sleeps end on time).
    assert!(m.forward_ms >= f && m.forward_ms < 1.3 * f, "{m:?} vs {f}");
    assert!(
        m.backward_ms >= b && m.backward_ms < 1.3 * b,
        "{m:?} vs {b}"
    );
    // Batch 16 over 1 worker is 16 per worker, not the profile's 8.
    let e = train(config(&dir.path().join("other"), with(1)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("per-worker batch of 8") && e.contains("16"),
        "{e}"
    );
}

#[test]
fn resuming_an_earlier_checkpoint_writes_each_step_and_epoch_line_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let opts = |o: &mut TrainOptions| {
        o.train_limit = Some(64); // 4 steps an epoch
        o.epochs = Some(3);
        o.log_every = Some(2);
        o.keep_checkpoints = Some(3);
    };
    run(&dir, opts);
    let lines = || -> Vec<(String, u64, Option<u64>)> {
        std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let kind = v["kind"].as_str().unwrap().to_string();
                (kind, v["epoch"].as_u64().unwrap(), v["step"].as_u64())
            })
            .collect()
    };
    let first = lines();
    assert_eq!(first.iter().filter(|l| l.0 == "epoch").count(), 3);
    // Resumed from epoch 1 in its own directory: epochs 2 and 3 are trained again, and their
    // earlier lines give way to this run's, so every line is there once, in order.
    run(&dir, |o| {
        opts(o);
        o.resume = Some(dir.join("checkpoint-epoch0001.safetensors"));
    });
    assert_eq!(lines(), first);
}
