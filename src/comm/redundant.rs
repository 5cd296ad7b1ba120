//! Redundant communication: every rank sends its whole buffer to every other
//! rank and computes the sum itself.
//!
//! This trades `N-1` times the traffic of a reduction for a single round with
//! no root and no chain of dependent messages. Bit-identical results come from
//! every rank adding the `N` contributions in the same order: in rank order, as
//! the pairwise tree of `backend::sum_order` (split at the middle, rounding up:
//! `(g0 + g1) + (g2 + g3)` for 4 ranks). That tree is the one our kernels use
//! over a batch, so with a power-of-two worker count N workers x batch b give
//! the same bits as 1 worker x batch N*b; it also rounds less than a running sum.

use crate::backend::sum_order::pairwise_split;
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
        // Every rank adds the values the others receive, its own included (a compressing
        // transport rounds them: `comm::wire`).
        t.round_to_wire(buf)?;
        // Rotated destination order: when all ranks send at once, round k is a
        // permutation (r -> r+k), so no receive port is hit twice per round.
        for k in 1..n {
            t.send((r + k) % n, tag, buf)?;
        }
        sum_in_rank_order(t, tag, buf, scratch)
    }
}

/// Replaces `buf` (this rank's contribution) with the sum of every rank of `t`'s, the others'
/// received under `tag`, added as `sum_order`'s pairwise tree over ranks: redundant mode over
/// every rank, and the hierarchies' sums over the workers of a process. `scratch` holds this
/// rank's own contribution, then one partial sum per tree level.
pub(crate) fn sum_in_rank_order(
    t: &dyn Transport,
    tag: u64,
    buf: &mut [f32],
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let (n, len) = (t.world(), buf.len());
    let (own, partials) = scratch_slice(scratch, len + partials_len(n, len)).split_at_mut(len);
    own.copy_from_slice(buf);
    let ranks = RankSum {
        t,
        me: t.rank(),
        tag,
        own,
    };
    ranks.sum(0, n, buf, partials)
}

/// The contributions of ranks `lo..hi`, received and added as `sum_order`'s pairwise tree
/// (this rank's own from `own`).
struct RankSum<'a> {
    t: &'a dyn Transport,
    me: usize,
    tag: u64,
    own: &'a [f32],
}

/// Scratch elements [`RankSum::sum`] over `ranks` ranks needs for buffers of `len`: one
/// partial sum per tree level.
fn partials_len(ranks: usize, len: usize) -> usize {
    let depth = usize::BITS as usize - ranks.saturating_sub(1).leading_zeros() as usize;
    depth * len
}

impl RankSum<'_> {
    /// Writes the sum of ranks `lo..hi` into `out`; `partials` holds one buffer of `out.len()`
    /// per remaining tree level.
    fn sum(
        &self,
        lo: usize,
        hi: usize,
        out: &mut [f32],
        partials: &mut [f32],
    ) -> Result<(), CommError> {
        if hi - lo == 1 {
            return if lo == self.me {
                out.copy_from_slice(self.own);
                Ok(())
            } else {
                self.t.recv(lo, self.tag, out)
            };
        }
        let mid = pairwise_split(lo, hi);
        let (right, deeper) = partials.split_at_mut(out.len());
        self.sum(lo, mid, out, deeper)?;
        self.sum(mid, hi, right, deeper)?;
        add_into(out, right);
        Ok(())
    }
}
