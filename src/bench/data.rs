//! `dptrain bench data`: the input pipeline's throughput alone (images/s per loader-thread
//! count, against collating on the consuming thread), and the data-wait fraction of a short
//! training run with prefetch off and on.

use super::ScratchDir;
use crate::config::TrainOptions;
use crate::pipeline::{DistributedSampler, LoadStats};
use crate::train::{load_sources, start_pipeline, train, Summary};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `dptrain bench data`.
#[derive(Debug, Clone, clap::Args)]
pub struct DataArgs {
    /// Dataset (e.g. imagefolder with --data-dir, after `dptrain data export-images`).
    #[arg(long, default_value = "mnist")]
    pub dataset: String,
    /// Dataset directory.
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Loader-thread counts, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub loader_threads: String,
    /// Batches prefetched per worker in the "on" runs.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Augmentation (off, or e.g. crop:4,flip).
    #[arg(long, default_value = "off")]
    pub augment: String,
    /// Model of the training runs: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
    #[arg(long, default_value = "lenet5")]
    pub model: String,
    /// Global batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Workers in the training runs.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Compute threads per worker [default: cores / workers].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Batches timed for the pipeline alone.
    #[arg(long, default_value_t = 200)]
    pub batches: usize,
    /// Timed training steps per run.
    #[arg(long, default_value_t = 60)]
    pub steps: usize,
}

/// Batches consumed, untimed, before timing starts (buffers grow, caches fill).
const WARMUP_BATCHES: usize = 5;

/// The options [`pipeline_images_per_s`] runs `base` with: one worker, fed by
/// `loader_threads` and `prefetch`.
pub fn pipeline_options(
    base: &TrainOptions,
    loader_threads: usize,
    prefetch: usize,
) -> TrainOptions {
    let mut o = base.clone();
    o.workers = Some(1);
    o.loader_threads = Some(loader_threads);
    o.prefetch = Some(prefetch);
    o
}

/// Images per second the pipeline delivers to one consumer that does nothing else, with
/// `loader_threads` and `prefetch` (0: the consumer collates itself) over `batches` batches.
pub fn pipeline_images_per_s(
    base: &TrainOptions,
    loader_threads: usize,
    prefetch: usize,
    batches: usize,
) -> Result<f64, String> {
    let mut cfg = pipeline_options(base, loader_threads, prefetch).resolve()?;
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
    crate::data::image_export::export(&pair, out, &Default::default())
        .map(|_| ())
        .map_err(|e| format!("exporting {dataset} as images to {}: {e}", out.display()))
}

/// A loading setting: loader threads and batches prefetched per worker (0: the consumer
/// collates each batch itself, in the step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loading {
    /// Loader threads.
    pub loader_threads: usize,
    /// Batches prefetched per worker.
    pub prefetch: usize,
}

impl Loading {
    /// The terminal's first column: `(in step)`, or the loader threads.
    fn terminal_name(&self) -> String {
        if self.prefetch == 0 {
            "(in step)".to_string()
        } else {
            self.loader_threads.to_string()
        }
    }

    /// The markdown's first column: `in step`, or `T loader thread(s), prefetch K`.
    fn markdown_name(&self) -> String {
        if self.prefetch == 0 {
            "in step".to_string()
        } else {
            format!(
                "{} loader thread(s), prefetch {}",
                self.loader_threads, self.prefetch
            )
        }
    }
}

/// The input pipeline alone at one loading setting.
#[derive(Debug, Clone)]
pub struct PipelineRow {
    /// The setting.
    pub loading: Loading,
    /// Images/s delivered to a consumer that does nothing else.
    pub images_per_s: f64,
}

/// A short training run at one loading setting.
#[derive(Debug, Clone)]
pub struct TrainingRow {
    /// The setting.
    pub loading: Loading,
    /// Mean step, ms.
    pub step_ms: f64,
    /// Mean data wait, ms.
    pub data_ms: f64,
    /// Data wait, % of the step.
    pub data_wait_pct: f64,
    /// The run's images/s.
    pub images_per_s: f64,
    /// The run's peak resident memory, MiB.
    pub peak_rss_mb: f64,
}

/// What `bench data` measures: the pipeline alone, and training runs, per loading setting.
#[derive(Debug, Clone)]
pub struct DataResult {
    /// The pipeline alone.
    pub pipeline: Vec<PipelineRow>,
    /// The training runs.
    pub training: Vec<TrainingRow>,
}

/// Times the pipeline alone at each of `settings` over `batches` batches, calling `on_row`
/// with each row as it is measured.
pub fn measure_pipeline(
    base: &TrainOptions,
    settings: &[Loading],
    batches: usize,
    mut on_row: impl FnMut(&PipelineRow),
) -> Result<Vec<PipelineRow>, String> {
    let mut rows = Vec::with_capacity(settings.len());
    for &loading in settings {
        let images_per_s =
            pipeline_images_per_s(base, loading.loader_threads, loading.prefetch, batches)?;
        let row = PipelineRow {
            loading,
            images_per_s,
        };
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// A short training run (`steps` timed steps, in `dir`) at each of `settings`, calling
/// `on_row` with each row as it is measured.
pub fn measure_training(
    base: &TrainOptions,
    settings: &[Loading],
    steps: usize,
    dir: &Path,
    mut on_row: impl FnMut(&TrainingRow),
) -> Result<Vec<TrainingRow>, String> {
    let mut rows = Vec::with_capacity(settings.len());
    for &loading in settings {
        let s = training_run(base, loading.loader_threads, loading.prefetch, steps, dir)?;
        let m = &s.breakdown.mean;
        let row = TrainingRow {
            loading,
            step_ms: m.step_ms,
            data_ms: m.data_ms,
            data_wait_pct: data_wait_pct(&s),
            images_per_s: s.images_per_s,
            peak_rss_mb: s.peak_rss_mb,
        };
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

impl PipelineRow {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:>14} {:>9} {:>12}",
            "loader threads", "prefetch", "images/s"
        )
    }

    /// The row on the terminal, and its `RESULT` line.
    pub fn terminal(&self) -> String {
        let k = self.loading.prefetch;
        // Collating in the step uses no loader thread: its RESULT line says 0.
        let t = if k == 0 {
            0
        } else {
            self.loading.loader_threads
        };
        format!(
            "{:>14} {:>9} {:>12.0}\n\
             RESULT dptrain data pipeline loader_threads={t} prefetch={k} images_per_s={:.0}",
            self.loading.terminal_name(),
            k,
            self.images_per_s,
            self.images_per_s
        )
    }

    /// The row in markdown.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {:.0} |\n",
            self.loading.markdown_name(),
            self.images_per_s
        )
    }
}

impl TrainingRow {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:>14} {:>9} {:>9} {:>9} {:>12} {:>10} {:>8}",
            "loader threads",
            "prefetch",
            "step ms",
            "data ms",
            "data wait %",
            "images/s",
            "RSS MiB"
        )
    }

    /// The row on the terminal, and its `RESULT` line.
    pub fn terminal(&self) -> String {
        let Loading {
            loader_threads: t,
            prefetch: k,
        } = self.loading;
        format!(
            "{:>14} {:>9} {:>9.2} {:>9.3} {:>12.2} {:>10.0} {:>8.0}\n\
             RESULT dptrain data train loader_threads={t} prefetch={k} data_wait_pct={:.2}",
            self.loading.terminal_name(),
            k,
            self.step_ms,
            self.data_ms,
            self.data_wait_pct,
            self.images_per_s,
            self.peak_rss_mb,
            self.data_wait_pct
        )
    }

    /// The row in markdown.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {:.2} | {:.3} | {:.1} | {:.0} |\n",
            self.loading.markdown_name(),
            self.step_ms,
            self.data_ms,
            self.data_wait_pct,
            self.images_per_s
        )
    }
}

impl DataResult {
    /// Both tables on the terminal, a blank line between.
    pub fn terminal(&self) -> String {
        let mut s = PipelineRow::terminal_header();
        for r in &self.pipeline {
            s += "\n";
            s += &r.terminal();
        }
        s += "\n\n";
        s += &TrainingRow::terminal_header();
        for r in &self.training {
            s += "\n";
            s += &r.terminal();
        }
        s
    }

    /// Both tables in markdown, a blank line between.
    pub fn markdown(&self) -> String {
        let mut s = String::from("| loading | pipeline images/s |\n|---|---:|\n");
        for r in &self.pipeline {
            s += &r.markdown();
        }
        s += "\n| loading | step ms | data wait ms | data wait % | images/s |\n\
              |---|---:|---:|---:|---:|\n";
        for r in &self.training {
            s += &r.markdown();
        }
        s
    }
}

/// Runs `dptrain bench data`: both tables, printed row by row as they are measured.
pub fn run_command(a: DataArgs) -> Result<(), String> {
    let counts = super::args::list(
        "--loader-threads",
        &a.loader_threads,
        super::args::thread_count("--loader-threads"),
    )?;
    super::args::check_timed_counts(&[("--batches", a.batches), ("--steps", a.steps)])?;
    if a.prefetch == 0 {
        return Err("--prefetch is the \"on\" setting; give at least 1".into());
    }
    let base = TrainOptions {
        dataset: Some(a.dataset.clone()),
        data_dir: a.data_dir.clone(),
        augment: Some(a.augment.clone()),
        model: Some(a.model.clone()),
        batch: Some(a.batch),
        workers: Some(a.workers),
        threads: a.threads,
        ..Default::default()
    };
    // In the step first, then each loader-thread count with prefetch on.
    let mut settings = vec![Loading {
        loader_threads: 1,
        prefetch: 0,
    }];
    settings.extend(counts.iter().map(|&t| Loading {
        loader_threads: t,
        prefetch: a.prefetch,
    }));
    // Every setting's options checked before the first is measured.
    for s in &settings {
        let mut o = base.clone();
        o.loader_threads = Some(s.loader_threads);
        o.prefetch = Some(s.prefetch);
        o.resolve()?;
    }
    crate::outln!(
        "input pipeline alone: {}, batch {}, augment {}, {} batches",
        a.dataset,
        a.batch,
        a.augment,
        a.batches
    );
    crate::outln!("{}", PipelineRow::terminal_header());
    measure_pipeline(&base, &settings, a.batches, |r| {
        crate::outln!("{}", r.terminal())
    })?;
    let scratch = ScratchDir::new("data");
    crate::outln!(
        "\ntraining: {}, {} worker(s), {} timed steps",
        a.model,
        a.workers,
        a.steps
    );
    crate::outln!("{}", TrainingRow::terminal_header());
    measure_training(&base, &settings, a.steps, scratch.path(), |r| {
        crate::outln!("{}", r.terminal())
    })?;
    Ok(())
}
