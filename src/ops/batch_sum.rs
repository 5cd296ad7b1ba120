//! Sums over the batch in an order that does not depend on how the batch was split.
//!
//! Data-parallel training promises that N workers with batch `b` each train exactly like one
//! worker with batch `N*b`. Mathematically they do; in floating point the only difference is
//! the order in which per-sample gradient contributions are added. Our kernels therefore sum a
//! batch in fixed chunks of [`BATCH_CHUNK`] samples (each chunk summed in sample order) and add
//! the chunk partials as a *pairwise tree that splits a range at its midpoint, rounding up*.
//! The sum over `2m` chunks is then `sum(first m) + sum(last m)`: exactly what two workers
//! holding `m` chunks each compute and then add in the all-reduce. Recursively, for `N` a power
//! of two, `N` workers give the same bits as one worker whenever the cross-worker sum is the same
//! pairwise tree over ranks: every mode at `N = 2`, and `redundant` (which sums in that tree,
//! see `comm::redundant`) at any power of two. Per-worker batches must be a multiple of
//! [`BATCH_CHUNK`] for the chunks to line up.
//!
//! Pairwise summation also has a smaller rounding error than a running sum (O(log n) instead of
//! O(n) additions on any path), at no extra cost.

/// Samples per batch chunk: the unit of every batch reduction in our kernels. Fixed (not
/// derived from the thread count), so results are also the same on any number of threads.
pub const BATCH_CHUNK: usize = 4;

/// Adds `parts` as a pairwise tree split at `ceil(len / 2)`, leaving the sum in `parts[0]`.
/// Every part must have the same length. Does nothing for an empty slice.
pub fn pairwise_sum_in_place(parts: &mut [Vec<f32>]) {
    if parts.len() <= 1 {
        return;
    }
    let (left, right) = parts.split_at_mut(pairwise_split(0, parts.len()));
    pairwise_sum_in_place(left);
    pairwise_sum_in_place(right);
    for (a, b) in left[0].iter_mut().zip(&right[0]) {
        *a += *b;
    }
}

/// The midpoint [`pairwise_sum_in_place`] splits `lo..hi` at: the tree every batch and rank sum
/// of the crate follows (`hi - lo >= 2`).
pub fn pairwise_split(lo: usize, hi: usize) -> usize {
    lo + (hi - lo).div_ceil(2)
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
        let exact: f64 = vals.iter().map(|&v| v as f64).sum();
        assert!((whole[0][0] as f64 - exact).abs() <= exact * 1e-6);
    }
}
