//! How the input pipeline fails: the typed errors a worker gets instead of a batch, and why the
//! pipeline stopped, so a run tells a failure from its echoes by type.

/// Why a worker got no batch from its feed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// This batch could not be filled (`worker` names whose batch, with loader threads).
    #[error("loading epoch {}, step {step}{}: {cause}", epoch + 1, for_worker(*worker))]
    Batch {
        /// Epoch (from 0).
        epoch: usize,
        /// Step within the epoch.
        step: usize,
        /// The worker the batch was for (loader threads; `None` when the worker collated it).
        worker: Option<usize>,
        /// What went wrong.
        cause: BatchFailure,
    },
    /// The pipeline stopped before this batch was ready: an echo of a failure elsewhere (or
    /// of the shutdown).
    #[error("{0}")]
    Stopped(StopReason),
    /// The worker asked for another step than the pipeline prepares next (a bug).
    #[error(
        "worker {rank} asked for epoch {}, step {step}, but the pipeline prepared epoch {}, \
         step {prepared_step} next; this is a bug, please report it",
        epoch + 1,
        prepared_epoch + 1
    )]
    OutOfOrder {
        /// The worker.
        rank: usize,
        /// Epoch asked for (from 0).
        epoch: usize,
        /// Step asked for.
        step: usize,
        /// Epoch prepared next (from 0).
        prepared_epoch: usize,
        /// Step prepared next.
        prepared_step: usize,
    },
    /// The worker asked its queue for another batch than the next (a bug).
    #[error(
        "the worker asked for batch {asked} but batch {next} is next; this is a bug, please \
         report it"
    )]
    OutOfSequence {
        /// Sequence number asked for.
        asked: usize,
        /// Sequence number next in the queue.
        next: usize,
    },
}

impl LoadError {
    /// True when this failure only echoes another: the pipeline stopped because something
    /// else failed first.
    pub fn is_echo(&self) -> bool {
        matches!(self, Self::Stopped(_))
    }
}

impl From<LoadError> for String {
    fn from(e: LoadError) -> Self {
        e.to_string()
    }
}

fn for_worker(worker: Option<usize>) -> String {
    worker.map_or_else(String::new, |w| format!(" for worker {w}"))
}

/// What went wrong filling one batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchFailure {
    /// A sample could not be read or decoded, or an injected loader fault struck (the
    /// collator's message, naming the sample).
    #[error("{0}")]
    Read(String),
    /// A loader thread panicked filling the batch (whose first samples are given).
    #[error("a loader thread panicked loading samples {0:?}..; this is a bug, please report it")]
    Panicked(Vec<u32>),
}

/// Why the pipeline stopped, as told to every worker still waiting for a batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StopReason {
    /// The pipeline was dropped or shut down (the run is over).
    #[error("the input pipeline was shut down")]
    ShutDown,
    /// A loader failed to fill a batch; the worker that needed it reports the failure itself.
    #[error("the input pipeline stopped: {0}")]
    LoaderFailed(Box<LoadError>),
    /// A loader thread panicked outside a batch's fill (which catches its own panics and
    /// reports the batch): a bug, said rather than left as a batch no worker ever gets.
    #[error(
        "the input pipeline stopped: loader thread {thread} panicked outside a batch; this is \
         a bug, please report it"
    )]
    LoaderPanicked {
        /// The loader thread's index.
        thread: usize,
    },
    /// A worker left before taking all its batches (its own error is the cause).
    #[error(
        "the input pipeline stopped: worker {rank} left at its batch {at} of {of} (its error \
         is the cause)"
    )]
    WorkerLeft {
        /// The worker that left.
        rank: usize,
        /// Its next batch.
        at: usize,
        /// Its batches in the run.
        of: usize,
    },
}
