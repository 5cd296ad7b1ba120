//! `dptrain bench loader`: images/s of the input pipeline alone (read, decode, the training
//! transforms, normalise, collate: no model), for an ImageFolder and packed files of it, at
//! each loader-thread count; the measurements are interleaved (rep 1: every source at every
//! thread count, rep 2: again, ...) and each row is their median, so a slow moment of a shared
//! machine falls on all rows alike. torchvision's `DataLoader(ImageFolder)` runs beside it in
//! `scripts/bench_loader.sh` (`../shared/peers/pytorch_loader.py`, the same transforms).

use super::data::{pipeline_images_per_s, pipeline_options};
use super::median;
use crate::config::TrainOptions;
use std::path::PathBuf;

/// Arguments of `dptrain bench loader`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoaderArgs {
    /// An ImageFolder directory (its train/ is read).
    #[arg(long)]
    pub imagefolder: Option<PathBuf>,
    /// Packed files (`dptrain data pack`), comma-separated, e.g. a JPEG and a raw pack.
    #[arg(long, value_delimiter = ',')]
    pub packed: Vec<PathBuf>,
    /// Loader-thread counts, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub loader_threads: String,
    /// The output size of the transforms (`--image-size`).
    #[arg(long, default_value = "224")]
    pub image_size: String,
    /// The training transforms (`--augment`); torchvision's peer runs
    /// RandomResizedCrop + RandomHorizontalFlip.
    #[arg(long, default_value = "random-resized-crop,flip")]
    pub augment: String,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Batches timed per measurement (after 5 untimed).
    #[arg(long, default_value_t = 30)]
    pub batches: usize,
    /// Interleaved repetitions; each row is their median.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
}

/// One row: a source at a loader-thread count.
#[derive(Debug, Clone)]
pub struct LoaderRow {
    /// "imagefolder" or "packed:FILE_NAME".
    pub source: String,
    /// Loader threads.
    pub threads: usize,
    /// Images/s of every repetition, in order.
    pub runs: Vec<f64>,
}

impl LoaderRow {
    /// The median images/s.
    pub fn median(&self) -> f64 {
        median(&mut self.runs.clone())
    }
}

/// What `bench loader` measured.
#[derive(Debug, Clone)]
pub struct LoaderResult {
    /// The rows, source by source, thread count by thread count.
    pub rows: Vec<LoaderRow>,
    /// Conditions, for the table's caption.
    pub conditions: String,
}

/// ImageNet's normalisation, given so that no estimate runs at start (torchvision's peer uses
/// the same constants).
const IMAGENET_NORMALIZE: &str = "0.485,0.456,0.406/0.229,0.224,0.225";

/// The datasets of `a`: (row name, `--dataset` value).
fn sources(a: &LoaderArgs) -> Vec<(String, String)> {
    let mut v = Vec::new();
    if let Some(d) = &a.imagefolder {
        v.push(("imagefolder".into(), format!("imagefolder:{}", d.display())));
    }
    for p in &a.packed {
        let name = p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        v.push((format!("packed:{name}"), format!("packed:{}", p.display())));
    }
    v
}

/// The options of a row reading `dataset` (its thread count and prefetch set apart).
fn source_options(a: &LoaderArgs, dataset: &str) -> TrainOptions {
    TrainOptions {
        dataset: Some(dataset.to_string()),
        batch: Some(a.batch),
        image_size: Some(a.image_size.clone()),
        augment: Some(a.augment.clone()),
        normalize: Some(IMAGENET_NORMALIZE.into()),
        test_limit: Some(a.batch),
        quiet: true,
        ..Default::default()
    }
}

/// The batches a row of `threads` loader threads preloads: one per thread, at least two.
fn row_prefetch(threads: usize) -> usize {
    threads.max(2)
}

/// Measures every source at every thread count, `reps` times interleaved.
pub fn measure(a: &LoaderArgs) -> Result<LoaderResult, String> {
    let threads = super::args::list(
        "--loader-threads",
        &a.loader_threads,
        super::args::thread_count("--loader-threads"),
    )?;
    let sources = sources(a);
    if sources.is_empty() {
        return Err("give --imagefolder DIR and/or --packed FILE[,FILE...]".into());
    }
    // Every row's options are checked before the first is measured.
    for (_, dataset) in &sources {
        for &t in &threads {
            pipeline_options(&source_options(a, dataset), t, row_prefetch(t)).resolve()?;
        }
    }
    let mut rows: Vec<LoaderRow> = sources
        .iter()
        .flat_map(|(name, _)| {
            threads.iter().map(|&t| LoaderRow {
                source: name.clone(),
                threads: t,
                runs: Vec::new(),
            })
        })
        .collect();
    for _ in 0..a.reps.max(1) {
        for row in rows.iter_mut() {
            let dataset = &sources
                .iter()
                .find(|(n, _)| *n == row.source)
                .expect("a row's source")
                .1;
            let base = source_options(a, dataset);
            let prefetch = row_prefetch(row.threads);
            row.runs.push(pipeline_images_per_s(
                &base,
                row.threads,
                prefetch,
                a.batches,
            )?);
        }
    }
    let conditions = format!(
        "batch {}, {} to {}, normalise, {} batches timed per run after 5 untimed, median of {} \
         interleaved runs, one consumer doing nothing else",
        a.batch,
        a.augment,
        a.image_size,
        a.batches,
        a.reps.max(1)
    );
    Ok(LoaderResult { rows, conditions })
}

impl LoaderResult {
    /// The table for a terminal, with a `RESULT` line per row for scripts.
    pub fn terminal(&self) -> String {
        let mut s = format!("input pipeline alone: {}\n", self.conditions);
        s += &format!(
            "{:<28} {:>8} {:>10}   runs\n",
            "source", "threads", "images/s"
        );
        for r in &self.rows {
            let runs: Vec<String> = r.runs.iter().map(|x| format!("{x:.0}")).collect();
            s += &format!(
                "{:<28} {:>8} {:>10.0}   {}\n",
                r.source,
                r.threads,
                r.median(),
                runs.join(" ")
            );
        }
        for r in &self.rows {
            s += &format!(
                "RESULT dptrain-loader source={} threads={} images_per_s={:.1}\n",
                r.source,
                r.threads,
                r.median()
            );
        }
        s
    }

    /// The table as markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!("Input pipeline alone: {}.\n\n", self.conditions);
        s += "| source | loader threads | images/s (median) |\n|---|---|---|\n";
        for r in &self.rows {
            s += &format!("| {} | {} | {:.0} |\n", r.source, r.threads, r.median());
        }
        s
    }
}

/// `dptrain bench loader`.
pub fn run_command(a: LoaderArgs) -> Result<(), String> {
    // Checked before any file is opened.
    super::args::check_timed_counts(&[("--batches", a.batches), ("--reps", a.reps)])?;
    if a.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    for (i, p) in a.packed.iter().enumerate() {
        if p.as_os_str().is_empty() || a.packed[..i].contains(p) {
            return Err(format!(
                "--packed: {:?} is empty or given twice; give each packed file once, separated \
                 by single commas",
                p.display().to_string()
            ));
        }
    }
    let r = measure(&a)?;
    crate::out!("{}", r.terminal());
    Ok(())
}
