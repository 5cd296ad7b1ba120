//! Sums over the batch in an order that does not depend on how the batch was split, nor on
//! the number of threads.
//!
//! Data-parallel training promises that N workers with batch `b` each train exactly like one
//! worker with batch `N*b`. Mathematically they do; in floating point the only difference is
//! the order in which per-sample gradient contributions are added. Every parameter gradient is
//! therefore a sum over fixed chunks of [`BATCH_CHUNK`] samples (each chunk computed the same
//! way wherever it runs), and the chunk partials are added as a *pairwise tree that splits a
//! range of chunks at its midpoint, rounding up* ([`pairwise_split`]). The sum over `2m` chunks
//! is then `sum(first m) + sum(last m)`: exactly what two workers holding `m` chunks each
//! compute and add in the all-reduce. Recursively, for `N` a power of two, N workers give the
//! same bits as one worker whenever the cross-worker sum is the same pairwise tree over ranks:
//! every mode at `N = 2` (one addition, which commutes), and `redundant` (which sums ranks in
//! this tree, see `comm::redundant`) at any power of two. The exact condition is stated (and
//! tested over a grid) in the README: N a power of two, the per-worker batch a multiple of
//! [`BATCH_CHUNK`].
//!
//! Pairwise summation also rounds less than a running sum (O(log n) additions on any path).
//! The tree runs on the calling thread's rayon pool; which thread computes which chunk does
//! not change a bit (the tree is fixed, buffers are only storage).

use rayon::prelude::*;
use std::ops::Range;
use std::sync::Mutex;

/// Samples per batch chunk: the unit of every batch reduction of a parameter gradient.
/// Fixed (not derived from the thread count), so results are the same on any thread count.
pub const BATCH_CHUNK: usize = 4;

/// The chunk of networks with batch norm, whose statistics are per worker anyway (so a split
/// batch cannot give the same bits): 4x fewer partial gradients to add. In ResNet-18's last
/// stage (2.4 M weights a layer, 4x4 pixels) adding 16 partials per layer took a third of
/// the layer's backward.
pub const BN_BATCH_CHUNK: usize = 16;

/// The midpoint the tree splits `lo..hi` at (`hi - lo >= 2`): the tree every batch and rank
/// sum of the crate follows.
pub fn pairwise_split(lo: usize, hi: usize) -> usize {
    lo + (hi - lo).div_ceil(2)
}

/// Adds `parts` as the pairwise tree, leaving the sum in `parts[0]`. Every part must have the
/// same length. Does nothing for an empty slice. (For sums over ranks; batch sums use
/// [`TreeSum::sum_chunks`].)
pub fn pairwise_sum_in_place(parts: &mut [Vec<f32>]) {
    if parts.len() <= 1 {
        return;
    }
    let (left, right) = parts.split_at_mut(pairwise_split(0, parts.len()));
    pairwise_sum_in_place(left);
    pairwise_sum_in_place(right);
    add_into(&mut left[0], &right[0]);
}

/// `dst += src`, element by element.
pub fn add_into(dst: &mut [f32], src: &[f32]) {
    for (a, b) in dst.iter_mut().zip(src) {
        *a += *b;
    }
}

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
    /// Sets the samples per chunk ([`BATCH_CHUNK`], or [`BN_BATCH_CHUNK`]).
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
    /// contribution. Chunks are [`TreeSum::set_chunk`] samples (the last may be shorter); partials are
    /// added as the pairwise tree. The top levels of the tree run in parallel.
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

    #[test]
    fn two_halves_summed_apart_equal_the_whole() {
        // 1e8 then fifteen 1s: a running f32 sum never moves off 1e8 (1 is below half an ulp),
        // the tree adds the 1s among themselves first. So the order is visible in the bits.
        let vals: Vec<f32> = (0..16).map(|i| if i == 0 { 1e8 } else { 1.0 }).collect();
        let parts = |r: std::ops::Range<usize>| -> Vec<Vec<f32>> {
            vals[r].iter().map(|&v| vec![v]).collect()
        };
        let mut whole = parts(0..16);
        pairwise_sum_in_place(&mut whole);
        for n in [2, 4, 8] {
            let w = 16 / n;
            let mut per_worker: Vec<Vec<f32>> = (0..n)
                .map(|k| {
                    let mut p = parts(k * w..(k + 1) * w);
                    pairwise_sum_in_place(&mut p);
                    p.swap_remove(0)
                })
                .collect();
            pairwise_sum_in_place(&mut per_worker);
            assert_eq!(
                per_worker[0][0].to_bits(),
                whole[0][0].to_bits(),
                "{n} workers"
            );
        }
        // A running sum would differ for this data (proves the test can fail).
        let running = vals.iter().fold(0.0f32, |a, &b| a + b);
        assert_ne!(running.to_bits(), whole[0][0].to_bits());
    }

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
