//! The input pipeline: batches do not depend on the loader-thread count or on prefetching, the
//! queue stays bounded, bad images are reported (or skipped) by name, and shutdown joins every
//! thread. Every wait is under a timeout so a hang fails the test instead of stalling CI.

use dptrain::config::TrainOptions;
use dptrain::data::{image_export, image_folder, synthetic, Dataset, DatasetPair};
use dptrain::pipeline::{
    Augment, BatchFeed, Collator, DistributedSampler, LoadStats, Normalize, Pipeline,
    PrefetchQueue, Reserved, Source,
};
use dptrain::train::{train, Summary};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not finish within {secs} s (a hang)"))
}

fn small_pair(train: usize, test: usize, shape: (usize, usize, usize)) -> DatasetPair {
    synthetic::generate(train, test, shape, 4, 3).unwrap()
}

fn collator(ds: Dataset, augment: &str, skip_bad: bool) -> Collator {
    let source = Source::Memory(Arc::new(ds));
    Collator {
        norm: source.normalize(),
        source,
        augment: Augment::parse(augment).unwrap(),
        seed: 11,
        skip_bad,
        stats: Arc::new(LoadStats::default()),
        fault: None,
    }
}

/// Every batch of `epochs` for each worker, as (image bits, labels), worker-major per step.
fn all_batches(
    feeds: &mut [BatchFeed],
    sampler: &DistributedSampler,
    epochs: std::ops::Range<usize>,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut out = Vec::new();
    let mut order = Vec::new();
    for epoch in epochs {
        sampler.epoch_order(epoch, &mut order);
        for step in 0..sampler.steps_per_epoch() {
            for f in feeds.iter_mut() {
                let b = f.next(epoch, step, &order).unwrap().host();
                out.push((
                    b.images.iter().map(|x| x.to_bits()).collect(),
                    b.labels.clone(),
                ));
            }
        }
    }
    out
}

#[test]
fn batches_are_bitwise_identical_for_any_loader_thread_count_and_prefetch() {
    let pair = small_pair(200, 10, (3, 8, 8));
    let c = collator(pair.train, "crop:2,flip", false);
    let sampler = DistributedSampler::new(200, 24, 2, 5);
    let mut sync: Vec<BatchFeed> = (0..2)
        .map(|r| BatchFeed::synchronous(r, c.clone(), sampler.clone()))
        .collect();
    let reference = all_batches(&mut sync, &sampler, 1..4);
    assert_eq!(reference.len(), 3 * 8 * 2);
    // Augmentation is on: some batch differs from its un-augmented self.
    let plain = collator(small_pair(200, 10, (3, 8, 8)).train, "off", false);
    let mut unaug: Vec<BatchFeed> = (0..2)
        .map(|r| BatchFeed::synchronous(r, plain.clone(), sampler.clone()))
        .collect();
    assert_ne!(all_batches(&mut unaug, &sampler, 1..2), reference[..16]);
    for threads in [1, 2, 4] {
        for prefetch in [1, 3] {
            let (c, s) = (c.clone(), sampler.clone());
            let got = within(60, "a pipeline run", move || {
                let (p, mut feeds) =
                    Pipeline::start(c, s.clone(), s.global_steps(1..4), threads, prefetch).unwrap();
                let got = all_batches(&mut feeds, &s, 1..4);
                drop(feeds);
                assert_eq!(p.shutdown(), threads);
                got
            });
            assert!(
                got == reference,
                "batches differ with {threads} loader threads, prefetch {prefetch}"
            );
        }
    }
}

#[test]
fn the_queue_never_holds_more_than_k_batches_and_the_pool_is_fixed() {
    let pair = small_pair(400, 10, (1, 8, 8));
    let c = collator(pair.train, "flip", false);
    let sampler = DistributedSampler::new(400, 16, 2, 1);
    let k = 3;
    within(60, "a slow consumer", move || {
        let (p, mut feeds) =
            Pipeline::start(c, sampler.clone(), sampler.global_steps(0..2), 4, k).unwrap();
        assert_eq!(p.pool_capacity(), 2 * (k + 1));
        let mut order = Vec::new();
        for epoch in 0..2 {
            sampler.epoch_order(epoch, &mut order);
            for step in 0..sampler.steps_per_epoch() {
                for f in feeds.iter_mut() {
                    f.next(epoch, step, &order).unwrap();
                }
                // A slow step: the loaders run ahead and must stop at K.
                std::thread::sleep(Duration::from_millis(3));
                assert!(
                    p.queue_lens().iter().all(|&n| n <= k),
                    "{:?}",
                    p.queue_lens()
                );
            }
        }
        let peaks = p.queue_peaks();
        assert!(peaks.iter().all(|&n| n <= k), "peaks {peaks:?} exceed {k}");
        assert!(
            peaks.contains(&k),
            "the loaders never ran {k} ahead: {peaks:?}"
        );
        drop(feeds);
        p.shutdown();
    });

    // The queue itself: batch K must wait until batch 0 is taken.
    let q = Arc::new(PrefetchQueue::new(2));
    assert_eq!(q.reserve(0), Reserved::Go);
    q.put(0, Ok(Default::default()));
    assert_eq!(q.reserve(1), Reserved::Go);
    q.put(1, Ok(Default::default()));
    let (tx, rx) = mpsc::channel();
    let q2 = q.clone();
    std::thread::spawn(move || tx.send(q2.reserve(2)).unwrap());
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "batch 2 did not wait"
    );
    assert_eq!(q.len(), 2);
    q.take(0).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        Reserved::Go
    );
    assert_eq!(q.peak(), 2);
}

#[test]
fn shutdown_mid_epoch_joins_every_thread_and_wakes_a_waiting_worker() {
    let pair = small_pair(2000, 10, (3, 16, 16));
    let c = collator(pair.train, "crop:4,flip", false);
    let sampler = DistributedSampler::new(2000, 32, 2, 1);
    within(30, "shutdown", move || {
        let (p, mut feeds) =
            Pipeline::start(c, sampler.clone(), sampler.global_steps(0..50), 4, 2).unwrap();
        let mut order = Vec::new();
        sampler.epoch_order(0, &mut order);
        for step in 0..3 {
            for f in feeds.iter_mut() {
                f.next(0, step, &order).unwrap();
            }
        }
        assert_eq!(p.running_threads(), 4);
        // Worker 1 waits for a batch that worker 0's absence will hold back; shutting down
        // must wake it with an error, not leave it waiting.
        let mut w1 = feeds.pop().unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let mut order = Vec::new();
            sampler.epoch_order(0, &mut order);
            let mut r = Ok(());
            for step in 3..sampler.steps_per_epoch() {
                if let Err(e) = w1.next(0, step, &order) {
                    r = Err(e);
                    break;
                }
            }
            tx.send(r).unwrap();
        });
        drop(feeds); // worker 0 leaves mid-epoch
        let joined = p.shutdown();
        assert_eq!(joined, 4);
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("worker 1 was left waiting");
        let e = r.expect_err("worker 1 cannot finish the epoch without the pipeline");
        assert!(
            e.is_echo() && e.to_string().contains("input pipeline"),
            "{e}"
        );
        waiter.join().unwrap();
    });
}

/// An ImageFolder of a small synthetic set, in `dir`.
fn image_folder(dir: &Path) {
    let pair = small_pair(96, 16, (1, 16, 16));
    image_export::export(&pair, dir, &Default::default()).unwrap();
}

fn folder_run(
    dir: &Path,
    run: &Path,
    f: impl FnOnce(&mut TrainOptions),
) -> Result<Summary, String> {
    let mut o = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.to_path_buf()),
        epochs: Some(2),
        batch: Some(16),
        workers: Some(2),
        threads: Some(1),
        lr_schedule: Some("constant".into()),
        warmup_steps: Some(0),
        comm_timeout: Some(20.0),
        run_dir: Some(run.to_path_buf()),
        no_checkpoints: true,
        quiet: true,
        ..Default::default()
    };
    f(&mut o);
    let cfg = o.resolve()?;
    within(120, "a training run", move || {
        train(cfg).map_err(String::from)
    })
}

#[test]
fn a_corrupt_image_is_named_or_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("folder");
    image_folder(&dir);
    // Corrupt one training image (not the first, which sets the shape).
    let class = dir.join("train/2");
    let mut files: Vec<_> = std::fs::read_dir(&class)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let bad = files[1].clone();
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\n definitely not the rest of a PNG").unwrap();
    let name = bad.file_name().unwrap().to_string_lossy().into_owned();
    for prefetch in [0, 2] {
        let e = folder_run(&dir, &tmp.path().join("r"), |o| o.prefetch = Some(prefetch))
            .expect_err("a corrupt image must stop the run");
        assert!(
            e.contains(&name),
            "prefetch {prefetch}: error does not name {name}: {e}"
        );
        assert!(e.contains("--skip-bad-samples"), "{e}");
        // Known at start (the normalisation estimate read it): refused before any step.
        assert!(e.contains("would stop at the first it reaches"), "{e}");
        assert!(!tmp.path().join("r/metrics.jsonl").exists());
        let s = folder_run(&dir, &tmp.path().join(format!("s{prefetch}")), |o| {
            o.prefetch = Some(prefetch);
            o.skip_bad_samples = Some(true);
        })
        .unwrap();
        // 96 samples, 6 steps of 16 per epoch: the bad one is drawn once per epoch.
        assert_eq!(s.skipped_samples, 2, "prefetch {prefetch}");
        assert!(
            s.skipped_examples[0].contains(&name),
            "{:?}",
            s.skipped_examples
        );
        // The flag is set: nothing suggests setting it.
        assert!(
            !s.skipped_examples[0].contains("--skip-bad-samples"),
            "{:?}",
            s.skipped_examples
        );
        assert!(s.peak_rss_mb > 0.0);
    }
    // Not an image at all, with an image extension.
    std::fs::write(&bad, b"hello").unwrap();
    let e = folder_run(&dir, &tmp.path().join("t"), |_| {}).unwrap_err();
    assert!(
        e.contains(&name) && e.contains("neither PNG nor JPEG"),
        "{e}"
    );
    // A bad test image stops the start even with --skip-bad-samples, and says why the flag
    // does not help there (the test split is decoded whole, nothing is left out of it).
    let test_class = dir.join("test/1");
    let mut test_files: Vec<_> = std::fs::read_dir(&test_class)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    test_files.sort();
    std::fs::write(&test_files[0], b"\x89PNG\r\n\x1a\n cut").unwrap();
    std::fs::write(&test_files[1], b"").unwrap();
    let test_name = |i: usize| test_files[i].to_string_lossy().into_owned();
    let e = folder_run(&dir, &tmp.path().join("u"), |o| {
        o.skip_bad_samples = Some(true)
    })
    .unwrap_err();
    assert!(
        e.contains("only leaves out training samples") && e.contains("2 images in"),
        "{e}"
    );
    // Both named, in one pass.
    assert!(
        e.contains(&test_name(0)) && e.contains(&test_name(1)),
        "{e}"
    );
}

#[test]
fn training_is_bitwise_identical_with_and_without_prefetch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("folder");
    image_folder(&dir);
    let hash = |prefetch: usize, loaders: usize, aug: &str| {
        let run = tmp.path().join(format!("run-{prefetch}-{loaders}"));
        let s = folder_run(&dir, &run, |o| {
            o.prefetch = Some(prefetch);
            o.loader_threads = Some(loaders);
            o.augment = Some(aug.into());
        })
        .unwrap();
        assert_eq!(s.epochs.len(), 2);
        assert!(s.epochs.iter().all(|e| e.peak_rss_mb > 0.0));
        s.replica_hashes[0]
    };
    let base = hash(0, 1, "crop:2,flip");
    assert_eq!(
        hash(2, 1, "crop:2,flip"),
        base,
        "prefetch 2 changed the result"
    );
    assert_eq!(
        hash(2, 3, "crop:2,flip"),
        base,
        "3 loader threads changed the result"
    );
    assert_ne!(hash(2, 2, "off"), base, "augmentation had no effect");

    // In memory too (synthetic), prefetch 0 vs 2.
    let mem = |prefetch: usize| {
        let mut o = TrainOptions {
            dataset: Some("synthetic".into()),
            train_limit: Some(320),
            test_limit: Some(32),
            batch: Some(32),
            epochs: Some(1),
            workers: Some(2),
            threads: Some(1),
            prefetch: Some(prefetch),
            augment: Some("crop:4,flip".into()),
            run_dir: Some(tmp.path().join(format!("mem-{prefetch}"))),
            no_checkpoints: true,
            quiet: true,
            ..Default::default()
        };
        o.comm_timeout = Some(20.0);
        let cfg = o.resolve().unwrap();
        within(120, "a training run", move || {
            train(cfg).map_err(String::from)
        })
        .unwrap()
        .replica_hashes[0]
    };
    assert_eq!(mem(0), mem(2));
}

#[test]
fn an_image_folder_reads_back_what_was_exported() {
    let tmp = tempfile::tempdir().unwrap();
    let pair = small_pair(20, 5, (3, 6, 7));
    image_export::export(&pair, tmp.path(), &Default::default()).unwrap();
    let (train, test) = image_folder::open_pair(tmp.path()).unwrap();
    assert_eq!((train.len(), test.len()), (20, 5));
    assert_eq!((train.channels, train.height, train.width), (3, 6, 7));
    // Files are listed class by class, so compare as (label, pixels) multisets.
    let decoded = train.decode_all("x").unwrap();
    let mut a: Vec<_> = (0..20)
        .map(|i| (pair.train.labels[i], pair.train.image(i).to_vec()))
        .collect();
    let mut b: Vec<_> = (0..20)
        .map(|i| (decoded.labels[i], decoded.image(i).to_vec()))
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    let n = Normalize::for_dataset(&decoded);
    let _ = n.channel(2);
}

/// Every file under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn an_image_export_that_fails_or_was_interrupted_leaves_the_earlier_export_whole() {
    let tmp = tempfile::tempdir().unwrap();
    // One class: any number of images holds an image of every class.
    let one_class = |train, test, shape| synthetic::generate(train, test, shape, 1, 3).unwrap();
    let out = tmp.path().join("png");
    image_export::export(&one_class(12, 4, (1, 5, 5)), &out, &Default::default()).unwrap();
    let before = files_under(&out);
    assert_eq!(before.len(), 16);
    // The test split cannot be written (2 channels): the error comes after the training split
    // was written, and the earlier export stays as it was, with nothing staged left behind.
    let failing = DatasetPair {
        train: one_class(6, 2, (1, 5, 5)).train,
        test: one_class(6, 2, (2, 5, 5)).test,
    };
    let replace = image_export::ExportOptions {
        limit: None,
        overwrite: true,
    };
    let err = image_export::export(&failing, &out, &replace).unwrap_err();
    assert!(err.to_string().contains("2-channel"), "{err}");
    assert_eq!(files_under(&out), before);
    // What a killed export left (a process no longer running: a pid above any pid_max) is
    // deleted by the next one, which needs no --overwrite.
    let dead = 4_294_000_000u32;
    let fresh = tmp.path().join("fresh");
    let staged = |name: &str| fresh.join(format!("{name}.{dead}"));
    std::fs::create_dir_all(staged(".dptrain-partial-train").join("0")).unwrap();
    std::fs::write(
        staged(".dptrain-partial-train").join("0/000003.png"),
        b"half",
    )
    .unwrap();
    image_export::export(&one_class(3, 2, (1, 5, 5)), &fresh, &Default::default()).unwrap();
    assert_eq!(files_under(&fresh).len(), 5);
    assert!(!staged(".dptrain-partial-train").exists());
    // Unless it holds a user's file: refused by name, kept.
    std::fs::create_dir_all(staged(".dptrain-partial-test").join("1")).unwrap();
    std::fs::write(staged(".dptrain-partial-test").join("1/notes.txt"), b"mine").unwrap();
    let err = image_export::export(&one_class(3, 2, (1, 5, 5)), &fresh, &replace).unwrap_err();
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(
        std::fs::read(staged(".dptrain-partial-test").join("1/notes.txt")).unwrap(),
        b"mine"
    );
    std::fs::remove_dir_all(staged(".dptrain-partial-test")).unwrap();
    // A running process's staging is another export at work: refused, untouched.
    let live = fresh.join(format!(".dptrain-partial-test.{}", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    let err = image_export::export(&one_class(3, 2, (1, 5, 5)), &fresh, &replace).unwrap_err();
    assert!(err.to_string().contains("another export"), "{err}");
    assert!(live.exists());
    std::fs::remove_dir(&live).unwrap();
    // An earlier export's split moved aside by a killed export, its place empty, is the only
    // copy: refused by name, kept.
    std::fs::rename(fresh.join("test"), staged(".dptrain-replaced-test")).unwrap();
    let err = image_export::export(&one_class(3, 2, (1, 5, 5)), &fresh, &replace).unwrap_err();
    assert!(
        err.to_string().contains("only copy") && err.to_string().contains("rename it back"),
        "{err}"
    );
    assert_eq!(files_under(&fresh).len(), 5);
    // A successful --overwrite replaces the earlier export whole.
    image_export::export(&one_class(5, 1, (1, 5, 5)), &out, &replace).unwrap();
    assert_eq!(files_under(&out).len(), 6);
}

#[test]
fn without_augmentation_batches_equal_the_plain_collation() {
    let pair = small_pair(64, 4, (3, 8, 8));
    let ds = pair.train.clone();
    let c = collator(pair.train, "off", false);
    let sampler = DistributedSampler::new(64, 16, 2, 9);
    let mut feeds: Vec<BatchFeed> = (0..2)
        .map(|r| BatchFeed::synchronous(r, c.clone(), sampler.clone()))
        .collect();
    let got = all_batches(&mut feeds, &sampler, 0..1);
    let mut order = Vec::new();
    sampler.epoch_order(0, &mut order);
    let mut b = dptrain::pipeline::Batch::default();
    for step in 0..4 {
        for w in 0..2 {
            dptrain::pipeline::collate(&ds, sampler.shard(&order, step, w), &c.norm, &mut b);
            let bits: Vec<u32> = b.images.iter().map(|x| x.to_bits()).collect();
            assert!(got[step * 2 + w] == (bits, b.labels.clone()));
        }
    }
}
