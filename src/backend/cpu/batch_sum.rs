//! The CPU's batch sums: the pairwise tree of [`crate::backend::sum_order`] over chunks of a
//! batch, its top levels in parallel on the calling thread's rayon pool. Which thread computes
//! which chunk does not change a bit (the tree is fixed, buffers are only storage).

use crate::backend::sum_order::{add_into, pairwise_split, BATCH_CHUNK};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// Scratch buffers for the right-hand subtrees of [`TreeSum::sum_chunks`]; they circulate
/// between steps, so a step allocates none once the first one has sized them.
pub struct TreeSum {
    spare: Mutex<Vec<Vec<f32>>>,
    chunk: usize,
}

impl Default for TreeSum {
    fn default() -> Self {
        Self {
            spare: Mutex::default(),
            chunk: BATCH_CHUNK,
        }
    }
}

impl TreeSum {
    /// Sets the samples per chunk ([`BATCH_CHUNK`], or
    /// [`crate::backend::sum_order::BN_BATCH_CHUNK`]).
    pub fn set_chunk(&mut self, samples: usize) {
        self.chunk = samples.max(1);
    }

    fn take(&self, len: usize) -> Vec<f32> {
        let mut v = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        if v.len() < len {
            v.resize(len, 0.0);
        }
        v
    }

    fn give(&self, v: Vec<f32>) {
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).push(v);
    }

    /// Writes into `out` the sum over the chunks of a batch of `n` samples of `leaf(samples,
    /// partial)`, which must overwrite all of `partial` (same length as `out`) with one chunk's
    /// contribution. Chunks are [`TreeSum::set_chunk`] samples (the last may be shorter);
    /// partials are added as the pairwise tree. The top levels of the tree run in parallel.
    pub fn sum_chunks(
        &self,
        n: usize,
        out: &mut [f32],
        leaf: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
    ) {
        let chunks = n.div_ceil(self.chunk);
        if chunks == 0 {
            out.fill(0.0);
            return;
        }
        let par = rayon::current_num_threads();
        self.node(0, chunks, n, out, leaf, par);
    }

    fn node(
        &self,
        lo: usize,
        hi: usize,
        n: usize,
        out: &mut [f32],
        leaf: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
        par: usize,
    ) {
        if hi - lo == 1 {
            leaf(lo * self.chunk..(hi * self.chunk).min(n), out);
            return;
        }
        let mid = pairwise_split(lo, hi);
        let mut right = self.take(out.len());
        let r = &mut right[..out.len()];
        if par > 1 {
            rayon::join(
                || self.node(lo, mid, n, out, leaf, par / 2),
                || self.node(mid, hi, n, r, leaf, par - par / 2),
            );
            // Large sums are added in parallel too (element-wise: no order to keep).
            out.par_chunks_mut(1 << 14)
                .zip(r.par_chunks(1 << 14))
                .for_each(|(a, b)| add_into(a, b));
        } else {
            self.node(lo, mid, n, out, leaf, 1);
            self.node(mid, hi, n, r, leaf, 1);
            add_into(out, r);
        }
        self.give(right);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sum_order::pairwise_sum_in_place;

    #[test]
    fn chunk_sums_match_the_tree_on_any_thread_count() {
        // Per-sample values whose sum depends on the order (see above), 4 per chunk.
        let n: usize = 37;
        let vals: Vec<f32> = (0..n)
            .map(|i| {
                if i % 9 == 0 {
                    1e8
                } else {
                    1.0 + i as f32 * 1e-3
                }
            })
            .collect();
        let leaf = |r: Range<usize>, out: &mut [f32]| {
            out[0] = vals[r].iter().sum();
        };
        let mut want = (0..n.div_ceil(BATCH_CHUNK))
            .map(|c| vec![vals[c * 4..(c * 4 + 4).min(n)].iter().sum::<f32>()])
            .collect::<Vec<_>>();
        pairwise_sum_in_place(&mut want);
        for threads in [1, 2, 3, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let t = TreeSum::default();
            let mut out = [0f32];
            pool.install(|| t.sum_chunks(n, &mut out, &leaf));
            assert_eq!(out[0].to_bits(), want[0][0].to_bits(), "{threads} threads");
        }
    }
}
