//! Redundant communication: every rank sends its whole buffer to every other
//! rank and computes the sum itself.
//!
//! This trades `N-1` times the traffic of a reduction for a single round with
//! no root and no chain of dependent messages. Bit-identical results come from
//! every rank adding the `N` contributions in the same order (rank 0, 1, …,
//! N-1), one f32 add at a time.

use crate::comm::{add_into, scratch_slice, AllReduce, CommError, Transport};

/// One-round all-to-all all-reduce (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct RedundantAllReduce;

impl AllReduce for RedundantAllReduce {
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
        // Rotated destination order: when all ranks send at once, round k is a
        // permutation (r -> r+k), so no receive port is hit twice per round.
        for k in 1..n {
            t.send((r + k) % n, tag, buf)?;
        }
        let (own, incoming) = scratch_slice(scratch, 2 * len).split_at_mut(len);
        own.copy_from_slice(buf);
        // buf becomes the running sum, starting with rank 0's contribution.
        if r != 0 {
            t.recv(0, tag, buf)?;
        }
        for j in 1..n {
            if j == r {
                add_into(buf, own);
            } else {
                t.recv(j, tag, incoming)?;
                add_into(buf, incoming);
            }
        }
        Ok(())
    }
}
