//! `dptrain eval`: a checkpoint's loss, accuracy, per-class accuracy and confusion matrix on a
//! dataset split.

use crate::infer::eval::{self, EvalOptions};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(super) struct EvalArgs {
    #[command(flatten)]
    checkpoint: super::checkpoint_arg::CheckpointArg,
    /// Dataset (any name `train --dataset` takes) [default: the checkpoint's].
    #[arg(long)]
    dataset: Option<String>,
    /// Its directory (a packed dataset's file) [default: the checkpoint's, with its dataset;
    /// given alone, the checkpoint's dataset read from here].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Which split: test or train.
    #[arg(long, default_value = "test", value_parser = ["test", "train"])]
    split: String,
    /// Only the first N samples of the split (chosen as --test-limit chooses them).
    #[arg(long)]
    limit: Option<usize>,
    /// Worker threads, each with its own net; the figures are the same for any count.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Samples per forward [default: the training run's per-worker batch].
    #[arg(long)]
    batch: Option<usize>,
    /// Compute threads per worker [default: cores / workers].
    #[arg(long)]
    threads: Option<usize>,
    /// Print the results as one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also write eval.md, eval.json and confusion.png into this directory (created if
    /// absent; its parent must exist).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Evaluates and prints (and writes, with `--out`) the results.
pub(super) fn run(a: EvalArgs) -> Result<(), String> {
    if a.threads == Some(0) {
        return Err("--threads 0: a forward needs at least 1 compute thread".into());
    }
    // As many workers as a training process may run: each is a thread with its own net.
    let most = crate::comm::transport::MAX_IN_PROCESS_WORKERS;
    if a.workers > most {
        return Err(format!(
            "--workers {}: eval runs at most {most} workers (each a thread with its own copy of \
             the model's buffers); give fewer",
            a.workers
        ));
    }
    // Threads past the cores are capped, and said, as `train` says it.
    for w in crate::limits::threads_per_worker(a.threads, a.workers.max(1)).1 {
        crate::terminal::print_warning(&w);
    }
    let opts = EvalOptions {
        dataset: a.dataset,
        data_dir: a.data_dir,
        train_split: a.split == "train",
        limit: a.limit,
        workers: a.workers,
        batch: a.batch,
        threads: a.threads,
    };
    // Checked before the evaluation whose results the files would hold; a failed evaluation
    // leaves no empty directory it made.
    let mut created = crate::output::CreatedDirs::default();
    if let Some(dir) = &a.out {
        let output =
            |e: crate::output::OutputError| crate::infer::InferError::Output(e.to_string());
        created.create(dir).map_err(output)?;
    }
    let (report, written) = created.removed_if_failed(|| {
        if let Some(dir) = &a.out {
            eval::EvalReport::check_out(dir)?;
        }
        let report = eval::run(a.checkpoint.path(), &opts)?;
        let written = match &a.out {
            Some(dir) => report.write(dir)?,
            None => Vec::new(),
        };
        Ok::<_, crate::infer::InferError>((report, written))
    })?;
    if let Some(w) = report.no_prediction_warning() {
        crate::terminal::print_warning(&w);
    }
    let mut text = if a.json {
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    } else {
        format!(
            "{}\n\n{}\nconfusion matrix (rows: true class, columns: predicted)\n\n{}",
            report.headline(),
            report.class_table(),
            report.confusion_table()
        )
    };
    for f in written.iter().filter(|_| !a.json) {
        text += &format!("wrote {}\n", f.display());
    }
    text.push('\n');
    crate::out!("{text}");
    Ok(())
}
