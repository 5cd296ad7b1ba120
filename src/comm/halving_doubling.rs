//! Rabenseifner all-reduce: recursive-halving reduce-scatter followed by
//! recursive-doubling all-gather.
//!
//! With `p2` the largest power of two `<= N` and `rem = N - p2`, the first
//! `2·rem` ranks pair up first: each odd rank sends its whole buffer to its
//! even partner, which adds it, and then sits out. The remaining `p2` ranks
//! (renumbered as virtual ranks `0..p2`) run the power-of-two algorithm on
//! `p2` chunks: in the halving phase partners `vr ^ mask` (mask = p2/2 … 1)
//! swap the half of their current block the other keeps and add, so virtual
//! rank `v` ends up owning the full sum of chunk `v`; the doubling phase
//! (mask = 1 … p2/2) swaps owned blocks back verbatim. Finally each even rank
//! of the pairs hands the result to its odd partner. Every partial sum is
//! computed by exactly one rank, so all ranks finish bit-identical.

use crate::comm::{add_into, chunk_span, scratch_slice, AllReduce, CommError, Transport};

/// Latency-friendly (`2·log2 N` rounds) and bandwidth-optimal all-reduce.
#[derive(Clone, Copy, Debug, Default)]
pub struct HalvingDoublingAllReduce;

/// Largest power of two `<= n` (n >= 1).
pub(crate) fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// Into how many chunks the algorithm cuts a buffer over `world` ranks: one per rank of the
/// power-of-two core. The algorithm below and the schedule recorder
/// ([`crate::comm::record`]) both use this.
pub(crate) fn chunks(world: usize) -> usize {
    prev_power_of_two(world)
}

impl AllReduce for HalvingDoublingAllReduce {
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
        let p2 = chunks(n);
        let rem = n - p2;
        let paired = r < 2 * rem;

        // Fold the extra ranks into their even partners.
        let vr = if paired {
            if r & 1 == 1 {
                t.send(r - 1, tag, buf)?;
                None
            } else {
                let incoming = scratch_slice(scratch, len);
                t.recv(r + 1, tag, incoming)?;
                add_into(buf, incoming);
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        let real = |v: usize| if v < rem { 2 * v } else { v + rem };

        if let Some(vr) = vr {
            // Block of `size` chunks containing virtual rank v (aligned).
            let block = |v: usize, size: usize| {
                let first = v & !(size - 1);
                chunk_span(len, p2, first, first + size)
            };
            let mut mask = p2 / 2;
            while mask >= 1 {
                let partner = vr ^ mask;
                let keep = block(vr, mask);
                t.send(real(partner), tag, &buf[block(partner, mask)])?;
                let incoming = scratch_slice(scratch, keep.len());
                t.recv(real(partner), tag, incoming)?;
                add_into(&mut buf[keep], incoming);
                mask /= 2;
            }
            let mut mask = 1;
            while mask < p2 {
                let partner = vr ^ mask;
                t.send(real(partner), tag, &buf[block(vr, mask)])?;
                t.recv(real(partner), tag, &mut buf[block(partner, mask)])?;
                mask *= 2;
            }
        }

        // Hand the result to the ranks that sat out.
        if paired {
            if r & 1 == 0 {
                t.send(r + 1, tag, buf)?;
            } else {
                t.recv(r - 1, tag, buf)?;
            }
        }
        Ok(())
    }
}
