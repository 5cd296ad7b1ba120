//! What workers report to the run while it goes: the plan, each step, each epoch, a failure,
//! the end.

use super::error::WorkerError;
use super::metrics::StepTimes;
use std::path::PathBuf;

/// Progress reported by workers to the run.
pub enum Event {
    /// Something the user should know, found by a worker (the run's `warn` shows it, and
    /// the JSON done line lists it).
    Warning(String),
    /// Worker 0's bucket plan, at start.
    Plan {
        /// Bucket sizes.
        description: String,
        /// Each bucket's operation.
        ops: Vec<String>,
    },
    /// A worker finished a step.
    Step {
        /// Worker.
        rank: usize,
        /// Epoch (from 0).
        epoch: usize,
        /// Step within the epoch.
        step: usize,
        /// The worker's loss on its shard.
        loss: f32,
        /// Where the time went.
        times: StepTimes,
    },
    /// Worker 0 finished an epoch and evaluated.
    Epoch {
        /// Epoch (from 0).
        epoch: usize,
        /// Mean training loss of worker 0.
        train_loss: f64,
        /// Test loss.
        test_loss: f64,
        /// Test accuracy, 0..1.
        test_accuracy: f64,
        /// Seconds of training steps in the epoch (worker 0).
        train_seconds: f64,
        /// Checkpoint written, if any.
        checkpoint: Option<PathBuf>,
    },
    /// A worker failed (error or panic); sent before its communication thread goes away, so
    /// the cause comes before the peers noticing it (whose failures are
    /// [`WorkerError::is_echo`]).
    Failed {
        /// Worker.
        rank: usize,
        /// What happened, naming the worker, the phase and the step.
        error: WorkerError,
    },
    /// A worker finished training.
    Done {
        /// Worker.
        rank: usize,
        /// Hash of its final weights (equal on every worker when replicas are in sync).
        weights_hash: u64,
        /// Updates it skipped for a non-finite gradient.
        skipped_updates: usize,
    },
}
