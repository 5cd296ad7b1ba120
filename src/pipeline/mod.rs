//! The input pipeline (the paper's third idea): which samples each worker gets, and turning
//! them into batches before the step needs them.

mod batch;
mod sampler;

pub use batch::{collate, Batch, Normalize};
pub use sampler::DistributedSampler;
