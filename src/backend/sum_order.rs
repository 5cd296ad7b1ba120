//! The summation order of the seam: batch sums (and the sums over ranks that continue them)
//! in an order that does not depend on how the batch was split, nor on the number of threads.
//! Every backend sums parameter gradients in this order, and `comm::redundant` sums ranks in
//! it: bit-identical replicas and worker-count equivalence depend on it.
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
/// same length. Does nothing for an empty slice. (The reference form of the order: the CPU
/// backend's batch sums follow the same tree over chunks of samples.)
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
}
