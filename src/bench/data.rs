//! `dptrain bench data`: the input pipeline's throughput alone (images/s per loader-thread
//! count, against collating on the consuming thread), and the data-wait fraction of a short
//! training run with prefetch off and on.

use crate::config::TrainOptions;
use crate::pipeline::{DistributedSampler, LoadStats};
use crate::train::{load_sources, start_pipeline, train, Summary};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Batches consumed, untimed, before timing starts (buffers grow, caches fill).
const WARMUP_BATCHES: usize = 5;

/// Images per second the pipeline delivers to one consumer that does nothing else, with
/// `loader_threads` and `prefetch` (0: the consumer collates itself) over `batches` batches.
pub fn pipeline_images_per_s(
    base: &TrainOptions,
    loader_threads: usize,
    prefetch: usize,
    batches: usize,
) -> Result<f64, String> {
    let mut o = base.clone();
    o.workers = Some(1);
    o.loader_threads = Some(loader_threads);
    o.prefetch = Some(prefetch);
    let mut cfg = o.resolve()?;
    let (source, _test) = load_sources(&cfg)?;
    let spe = source.len() / cfg.batch;
    let total = batches + WARMUP_BATCHES;
    cfg.epochs = total.div_ceil(spe.max(1));
    let sampler = DistributedSampler::new(source.len(), cfg.batch, 1, cfg.seed);
    let (pipeline, mut feeds) = start_pipeline(&cfg, source, 0, Arc::new(LoadStats::default()))?;
    let feed = &mut feeds[0];
    let mut order = Vec::new();
    let mut started = Instant::now();
    let mut images = 0;
    for k in 0..total {
        let (epoch, step) = (k / spe, k % spe);
        if step == 0 {
            sampler.epoch_order(epoch, &mut order);
        }
        if k == WARMUP_BATCHES {
            started = Instant::now();
            images = 0;
        }
        images += feed.next(epoch, step, &order)?.host().len();
    }
    let secs = started.elapsed().as_secs_f64();
    drop(feeds);
    drop(pipeline);
    Ok(images as f64 / secs.max(1e-9))
}

/// A short training run (`steps` timed steps after 5 untimed) with the given pipeline settings.
pub fn training_run(
    base: &TrainOptions,
    loader_threads: usize,
    prefetch: usize,
    steps: usize,
    dir: &Path,
) -> Result<Summary, String> {
    let mut o = base.clone();
    o.loader_threads = Some(loader_threads);
    o.prefetch = Some(prefetch);
    o.epochs = Some(1);
    o.train_limit = Some(o.batch.unwrap_or(64) * (steps + 5));
    o.test_limit = Some(o.test_limit.unwrap_or(100));
    o.run_dir = Some(dir.to_path_buf());
    // Run after run in one scratch run directory of the benchmark's own.
    o.overwrite = true;
    o.quiet = true;
    o.no_checkpoints = true;
    Ok(train(o.resolve()?)?)
}

/// Data wait as a percentage of step time.
pub fn data_wait_pct(s: &Summary) -> f64 {
    100.0 * s.breakdown.mean.data_ms / s.breakdown.mean.step_ms.max(1e-9)
}

/// The dataset an ImageFolder for `model` is exported from: the bundled MNIST for lenet5 (real
/// digits at its reference shape), synthetic 3x32x32 images for the CIFAR-shaped models.
pub fn image_source_for(model: &str) -> &'static str {
    if model == "lenet5" {
        "mnist"
    } else {
        "synthetic:3x32x32"
    }
}

/// Writes the first `train` and `test` samples of `dataset` as an ImageFolder (one PNG per
/// sample) under `out`, so that a training run on it decodes every image in its loaders: a
/// real per-sample loading cost, which in-memory datasets do not have (their batches collate
/// in tens of microseconds, so preloading them shows nothing).
pub fn export_image_folder(
    dataset: &str,
    train: usize,
    test: usize,
    out: &Path,
) -> Result<(), String> {
    let cfg = TrainOptions {
        dataset: Some(dataset.to_string()),
        train_limit: Some(train),
        test_limit: Some(test),
        batch: Some(1),
        ..Default::default()
    }
    .resolve()?;
    let (train, test) = crate::train::load_data(&cfg)?;
    let pair = crate::data::DatasetPair { train, test };
    crate::data::image_folder::export(&pair, out, None)
        .map(|_| ())
        .map_err(|e| format!("exporting {dataset} as images to {}: {e}", out.display()))
}
