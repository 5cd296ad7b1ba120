//! The input pipeline (the paper's third idea): batches are loaded ahead of the step, so no step
//! waits for data.
//!
//! Top-down, per training process (one [`Pipeline`], shared by all workers):
//!
//! ```text
//!  DistributedSampler        which samples: epoch order = f(seed, epoch), split into shards
//!        |                   (sampler.rs)
//!  loader threads x T        claim jobs (epoch, step, worker) in order from one counter,
//!        |                   across epoch boundaries; threads live for the whole run
//!        |   Source          read sample i: a slice of memory, or read + decode a PNG/JPEG
//!        |                   (source.rs; data::image_folder)
//!        |   Transforms      the list in the order given (random-resized-crop, flip, crop,
//!        |                   resize-shorter, center-crop, resize) to the image size,
//!        |                   normalise, into f32; draws = hash(seed, epoch, i) (transform.rs)
//!        |   Collator        fills a Batch taken from the BufferPool (batch.rs, pool.rs)
//!        v
//!  PrefetchQueue x workers   K slots per worker, filled out of order, taken in order; a loader
//!        |                   reserves a slot before taking a buffer (queue.rs)
//!  Staging                   the batch becomes the worker's input tensors; the CUDA seam
//!        |                   (pinned buffer, async copy on a copy stream, event) (staging.rs)
//!  BatchFeed::next           the worker's "data" phase: its wait is the data-wait time; the
//!                            previous step's buffer goes back to the pool (loader.rs)
//! ```
//!
//! Memory is bounded by the pool: `workers * (K + 1)` batch buffers whatever the number of
//! loader threads (PyTorch's DataLoader holds `num_workers * prefetch_factor` batches plus a
//! dataset copy per worker process); once each buffer has been filled once, no step allocates.
//!
//! Results do not depend on the number of loader threads or on K: a batch is filled by one
//! thread from (seed, epoch, step, worker) alone, with the same [`Collator::fill`] that the
//! synchronous baseline (`--prefetch 0`, [`BatchFeed::synchronous`]) runs inside the step.
//!
//! Errors: a sample that cannot be read fails its batch with a message naming the file, which
//! the worker needing that batch reports and which stops the run (every thread is joined);
//! with `--skip-bad-samples` the sample is left out of its batch and counted ([`LoadStats`]).

mod batch;
mod error;
mod loader;
mod normalize;
mod packed;
mod pool;
mod queue;
mod sampler;
mod source;
mod staging;
mod transform;

pub use batch::{collate, Batch, Collator, LoadStats};
pub use error::{BatchFailure, LoadError, StopReason};
pub use loader::{
    default_loader_threads, BatchFeed, EpochOrders, Pipeline, MAX_LOADER_THREADS, MAX_PREFETCH,
};
pub use normalize::{Normalization, NormalizationError, Normalize, NormalizeChoice, Unreadable};
pub use packed::{
    decode_split as decode_packed_split, estimate_normalization as estimate_packed_normalization,
};
pub use pool::BufferPool;
pub use queue::{PrefetchQueue, Reserved};
pub use sampler::DistributedSampler;
pub use source::{decode_split, estimate_normalization, SampleScratch, Source, TestSplit};
pub use staging::{Staged, Staging};
pub use transform::{
    centre_crop_offset, default_shorter, Augment, Draw, Geometry, ImageSize, RenderScratch,
    TransformError, TransformOp, TransformScratch, Transforms, MAX_CROP_PAD, MAX_IMAGE_SIDE,
};
