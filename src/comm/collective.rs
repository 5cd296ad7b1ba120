//! What every all-reduce algorithm is: the [`AllReduce`] contract. What they share besides
//! (the partition into chunks, scratch, the one addition) is [`crate::comm::partition`], which
//! knows no transport, so the shared-memory collective can use it too.

use crate::comm::{CommError, Transport};

/// A sum all-reduce algorithm: afterwards every rank's `buf` holds the
/// element-wise sum over all ranks, bit-identical on every rank.
pub trait AllReduce: Sync {
    /// Runs the collective. All ranks must call it with equally long buffers
    /// and the same `tag`; the tag must not be used by another collective
    /// running concurrently on the same transport. `scratch` is grown as
    /// needed and never shrunk, so reusing it across steps avoids allocation.
    fn all_reduce_sum(
        &self,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError>;
}
