//! Ring all-reduce: reduce-scatter followed by all-gather.
//!
//! The buffer is cut into `world` chunks. In the reduce-scatter phase each
//! rank passes one chunk to its right neighbour per round and adds the chunk
//! arriving from the left, so after `N-1` rounds rank `r` holds the complete
//! sum of chunk `(r+1) % N`. The all-gather phase circulates those finished
//! chunks verbatim for another `N-1` rounds. Each element's sum is therefore
//! computed exactly once (by one rank) and then copied, which is what makes
//! the results bit-identical across ranks.

use crate::comm::{add_into, chunk_range, scratch_slice, AllReduce, CommError, Transport};

/// Bandwidth-optimal ring all-reduce (`2(N-1)` rounds of `len/N` elements).
#[derive(Clone, Copy, Debug, Default)]
pub struct RingAllReduce;

/// Into how many chunks the ring cuts a buffer over `world` ranks: one per rank. The
/// algorithm below and the schedule recorder ([`crate::comm::record`]) both use this, so the
/// recorder's message sizes follow the algorithm's partition.
pub(crate) fn chunks(world: usize) -> usize {
    world
}

impl AllReduce for RingAllReduce {
    fn all_reduce_sum(
        &self,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let n = t.world();
        let r = t.rank();
        let len = buf.len();
        if n <= 1 || len == 0 {
            return Ok(());
        }
        let parts = chunks(n);
        let right = (r + 1) % n;
        let left = (r + n - 1) % n;
        // Chunks may be empty when len < world; they are still exchanged so
        // every rank runs the same message sequence (FIFO per tag relies on it).
        for step in 0..n - 1 {
            let send_c = (r + n - step) % n;
            let recv_c = (r + 2 * n - step - 1) % n;
            t.send(right, tag, &buf[chunk_range(len, parts, send_c)])?;
            let range = chunk_range(len, parts, recv_c);
            let incoming = scratch_slice(scratch, range.len());
            t.recv(left, tag, incoming)?;
            add_into(&mut buf[range], incoming);
        }
        for step in 0..n - 1 {
            let send_c = (r + 1 + n - step) % n;
            let recv_c = (r + n - step) % n;
            t.send(right, tag, &buf[chunk_range(len, parts, send_c)])?;
            t.recv(left, tag, &mut buf[chunk_range(len, parts, recv_c)])?;
        }
        Ok(())
    }
}
