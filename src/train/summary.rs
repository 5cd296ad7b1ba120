//! The end result of a run, as `summary.json` holds it, and what a person should be told
//! about it besides its results.

use super::metrics::{Breakdown, EpochRecord};
use super::processes;
use crate::config::TrainConfig;
use serde::Serialize;
use std::path::PathBuf;

/// `summary.json`: an object with a [`Summary`]'s first keys.
pub const SUMMARY_FILE: crate::output::Kind = crate::output::Kind {
    what: "a run summary dptrain wrote",
    head: 64 << 20,
    is_one: |bytes| crate::output::is_json_object_with(bytes, &["config", "epochs"]),
};

/// The end result of a run (also written to `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Configuration used.
    pub config: serde_json::Value,
    /// Per-epoch results.
    pub epochs: Vec<EpochRecord>,
    /// Final test accuracy.
    pub final_test_accuracy: f64,
    /// Training throughput over the whole run (images/s, all workers, evaluation excluded).
    pub images_per_s: f64,
    /// Mean step breakdown over the run, averaged over workers, first 5 steps excluded.
    pub breakdown: Breakdown,
    /// Bucket plan.
    pub buckets: String,
    /// Operation per bucket.
    pub bucket_ops: Vec<String>,
    /// Last checkpoint written.
    #[serde(serialize_with = "crate::output::optional_path_as_text")]
    pub checkpoint: Option<PathBuf>,
    /// Wall time of the whole run.
    pub wall_seconds: f64,
    /// Hash of each worker's final weights; all equal when the replicas stayed identical.
    pub replica_hashes: Vec<u64>,
    /// Steps whose update was skipped for a NaN/infinite gradient (`--on-nonfinite skip`).
    pub skipped_nonfinite_updates: usize,
    /// Peak resident memory of the process at the end of the run, MiB.
    pub peak_rss_mb: f64,
    /// Sample reads left out with `--skip-bad-samples`.
    pub skipped_samples: usize,
    /// The first few skipped samples and why, each naming its file.
    pub skipped_examples: Vec<String>,
    /// Over several processes, each rank's step breakdown and link figures (in rank order);
    /// empty in a single-process run.
    pub ranks: Vec<processes::RankBreakdown>,
    /// The ranks whose compute or link is much slower than the others', and why.
    pub slow_ranks: Vec<processes::SlowRank>,
    /// Optimizer steps of this run (after the resumed ones, if any).
    pub steps: usize,
    /// The checkpoint this run resumed, if any: then `epochs`, `steps`, `images_per_s`,
    /// `breakdown` and `wall_seconds` cover this run's steps only (`metrics.jsonl` in the
    /// checkpoint's own run directory, and `report.md` drawn from it, cover the whole run).
    pub resumed_from: Option<ResumedFrom>,
    /// Global steps per epoch (global batches of the training set).
    pub steps_per_epoch: usize,
    /// The run directory the run wrote to (without `--run-dir`, the next free numbered one
    /// when the default held an earlier run).
    #[serde(serialize_with = "crate::output::path_as_text")]
    pub run_dir: PathBuf,
    /// The run directory's lock, held while this summary (or a clone) lives, so the caller
    /// draws the report before another run can take the directory; not part of the file.
    #[serde(skip)]
    pub run_dir_lock: Option<std::sync::Arc<super::lock::RunDirLock>>,
}

/// Where a resumed run started: the checkpoint and its position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ResumedFrom {
    /// The checkpoint (`--resume`).
    #[serde(serialize_with = "crate::output::path_as_text")]
    pub checkpoint: PathBuf,
    /// Epochs it had finished.
    pub epochs_done: usize,
    /// Steps it had done of the next epoch (a commit's; 0 for an epoch checkpoint).
    pub steps_into_epoch: usize,
}

impl ResumedFrom {
    /// What the done line says of it: `resumed after epoch 2` or `resumed at step 40 of epoch
    /// 3`.
    pub fn describe(&self) -> String {
        format!("resumed {}", self.position())
    }

    /// Where in training it resumed: `after epoch 2`, `at step 40 of epoch 3`.
    pub fn position(&self) -> String {
        match self.steps_into_epoch {
            0 => format!("after epoch {}", self.epochs_done),
            n => format!("at step {n} of epoch {}", self.epochs_done + 1),
        }
    }
}

impl Summary {
    /// The summary of a run of `cfg` before anything is known of it.
    pub(crate) fn empty(cfg: &TrainConfig) -> Self {
        Self {
            config: cfg.to_json(),
            epochs: Vec::new(),
            final_test_accuracy: 0.0,
            images_per_s: 0.0,
            breakdown: Breakdown::default(),
            buckets: String::new(),
            bucket_ops: Vec::new(),
            checkpoint: None,
            wall_seconds: 0.0,
            skipped_nonfinite_updates: 0,
            replica_hashes: vec![0; cfg.workers],
            peak_rss_mb: 0.0,
            skipped_samples: 0,
            skipped_examples: Vec::new(),
            ranks: Vec::new(),
            slow_ranks: Vec::new(),
            steps: 0,
            resumed_from: None,
            steps_per_epoch: 0,
            run_dir: cfg.run_dir.clone(),
            run_dir_lock: None,
        }
    }

    /// What a person should be told about the run besides its results: updates skipped for a
    /// non-finite gradient (loudly when most were), sample reads skipped, no timed steps.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let (skipped, steps) = (self.skipped_nonfinite_updates, self.steps);
        if skipped > 0 {
            let msg = format!(
                "{skipped} of {steps} updates were skipped for a NaN or infinite gradient \
                 (--on-nonfinite skip)"
            );
            // More than half skipped: the model barely trained, whatever the accuracy says.
            if 2 * skipped > steps {
                w.push(format!(
                    "MOST UPDATES WERE SKIPPED: {msg}; the model hardly trained: lower --lr (or \
                     raise --warmup-steps) and run again"
                ));
            } else {
                w.push(msg);
            }
        }
        if self.skipped_samples > 0 {
            let (reads, were) = match self.skipped_samples {
                1 => ("1 sample read".to_string(), "was"),
                n => (format!("{n} sample reads"), "were"),
            };
            w.push(format!(
                "{reads} {were} skipped as unreadable (--skip-bad-samples), e.g. {}",
                self.skipped_examples.first().map_or("-", String::as_str)
            ));
        }
        if self.breakdown.steps == 0 {
            w.push(self.breakdown.describe());
        }
        w
    }
}
