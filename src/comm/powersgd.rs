//! PowerSGD: each gradient matrix sent as a rank-`r` product (`--compress powersgd:R`).
//!
//! Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
//! Distributed Optimization" (NeurIPS 2019), Algorithm 1 with error feedback, as PyTorch's
//! `powerSGD_hook` runs it. For one bucket on every worker `i`, each weight matrix `G_i`
//! (`rows x cols`) that compression pays for ([`compresses`]) goes through:
//!
//! ```text
//!   M_i = G_i + E_i                  error feedback: what earlier steps left out
//!   P_i = M_i Q          all-reduce  P = sum P_i           (round 1, with the plain values)
//!   P   = orthonormal columns of P (Gram-Schmidt)
//!   Q_i = M_i^T P        all-reduce  Q = sum Q_i           (round 2)
//!   E_i = M_i - P Q_i^T              this worker's part the product leaves out
//!   G   = P Q^T                      the sum every worker applies; Q is kept (warm start)
//! ```
//!
//! `(rows + cols) r` values cross the link instead of `rows cols`. Biases, batch-norm
//! parameters and matrices too small to gain are *plain*: they travel in round 1 uncompressed.
//!
//! Why the replicas stay bit-identical: both rounds are the bucket's own all-reduce, which
//! leaves the same bits on every rank; the orthogonalisation and the product `P Q^T` are the
//! same sequential arithmetic on those same bits. Only `E_i` is each worker's own. Why the sums
//! are still the right ones: `sum_i E_i = sum_i M_i - P Q^T`, so what one step leaves out the
//! next step sends (the error feedback that keeps PowerSGD's accuracy).
//!
//! The arithmetic runs on the communication thread in a fixed order (never split over
//! threads), so the bits do not depend on the thread count. Q starts from a seeded draw, the
//! same on every rank. All buffers are allocated once, at set-up.
//!
//! The two rounds also come in pieces ([`PowerSgdBucket::reduce_first`],
//! [`PowerSgdBucket::carry_second`], [`PowerSgdBucket::finish_second`]), so that the reducer
//! can send a bucket's round 2 inside the next bucket's first collective: one message's
//! latency per bucket instead of two (`parallel::reducer`'s `InOrder` says when).

use crate::comm::CommError;
use std::ops::Range;

/// PyTorch's `min_compression_rate`: a matrix is compressed only where the product's values
/// are fewer than half the matrix's.
pub const MIN_COMPRESSION_RATE: usize = 2;

/// Added to each column's norm before dividing (PyTorch's `orthogonalization_epsilon` is 0;
/// a column of a zero gradient would then divide by zero).
const EPSILON: f32 = 1e-8;

/// Whether a `rows x cols` matrix is sent as a rank-`rank` product: PyTorch's rule, the
/// product's `(rows + cols) rank` values fewer than `rows cols / MIN_COMPRESSION_RATE`.
pub fn compresses(rows: usize, cols: usize, rank: usize) -> bool {
    // In u128: the rank comes from the command line and may be any usize; a product that
    // wrapped would call a huge rank a gain (and size its buffers past memory).
    let (rows, cols) = (rows as u128, cols as u128);
    (rows + cols) * rank as u128 * (MIN_COMPRESSION_RATE as u128) < rows * cols
}

/// One weight matrix inside a bucket's buffer, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Matrix {
    /// First element in the bucket's buffer.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

impl Matrix {
    fn len(&self) -> usize {
        self.rows * self.cols
    }
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Values each round of a bucket of `len` values sends when `matrices` (disjoint, inside it)
/// go at rank `rank`: round 1 the plain values and every `P` (`rows x rank`), round 2 every
/// `Q` (`cols x rank`). The reducer's buffers and the simulator's messages are both this size.
pub fn round_lens(len: usize, matrices: &[Matrix], rank: usize) -> (usize, usize) {
    let in_matrices: usize = matrices.iter().map(Matrix::len).sum();
    let p: usize = matrices.iter().map(|m| m.rows * rank).sum();
    let q: usize = matrices.iter().map(|m| m.cols * rank).sum();
    (len - in_matrices + p, q)
}

/// What PowerSGD's arithmetic costs the communication thread, per value of the matrices it
/// compresses: `ns = fixed + per_rank x rank` in each of its three phases (before round 1:
/// `M = G + E`, `P = M Q`; between the rounds: orthogonalisation, `Q = M^T P`, the error;
/// after round 2: `G = P Q^T`). The simulator charges these to the communication thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerSgdRates {
    /// Before round 1: (fixed, per rank) ns per value.
    pub before: (f64, f64),
    /// Between the rounds: as `before`.
    pub between: (f64, f64),
    /// After round 2: as `before`.
    pub after: (f64, f64),
}

impl PowerSgdRates {
    /// Measured with `dptrain bench compress` (its per-phase columns) on this project's
    /// machine, a 2-core Intel Xeon with AVX-512, 2026-12-04, nothing else running: 1 MiB
    /// square matrices, each run the median of 9 rounds, the median of 3 runs, and the line
    /// through ranks 1 and 4. At 64 KiB the total is 0.5-1.0x these, at 16 MiB 1.5-1.9x
    /// (the matrix no longer in cache; docs/bench/compress.md). One core's arithmetic, not a
    /// model of other machines.
    pub const MEASURED: PowerSgdRates = PowerSgdRates {
        before: MEASURED_BEFORE,
        between: MEASURED_BETWEEN,
        after: MEASURED_AFTER,
    };

    /// Seconds of each phase (before, between, after) for `values` values in matrices at
    /// `rank`.
    pub fn seconds(&self, values: usize, rank: usize) -> [f64; 3] {
        let v = values as f64 * 1e-9;
        let at = |(fixed, per_rank): (f64, f64)| v * (fixed + per_rank * rank as f64);
        [at(self.before), at(self.between), at(self.after)]
    }
}

// `bench compress --sizes-kb 1024`, three runs, the median of each phase (ns per value):
// rank 1 before 0.223, between 0.253, after 0.163; rank 4 0.364, 0.511, 0.271 (rank 2, not
// used for the line: 0.262-0.285, 0.318-0.349, 0.179-0.203, on the line within 4%).
const MEASURED_BEFORE: (f64, f64) = (0.176, 0.047);
const MEASURED_BETWEEN: (f64, f64) = (0.167, 0.086);
const MEASURED_AFTER: (f64, f64) = (0.127, 0.036);

/// One bucket's PowerSGD state on one worker: its layout, the error feedback, the warm-started
/// Q, and the two rounds' buffers.
#[derive(Debug, Clone)]
pub struct PowerSgdBucket {
    rank: usize,
    matrices: Vec<Matrix>,
    /// The bucket's ranges outside every matrix, sent uncompressed.
    plain: Vec<Range<usize>>,
    plain_len: usize,
    /// `E_i` of each matrix, concatenated.
    error: Vec<f32>,
    /// Each matrix's `Q^T` (`rank x cols`, row-major), concatenated: the last summed Q.
    q: Vec<f32>,
    /// Round 1: the plain values, then each matrix's `P` (`rows x rank`, row-major).
    first: Vec<f32>,
    /// Round 2: each matrix's `Q_i^T`, then summed.
    second: Vec<f32>,
}

impl PowerSgdBucket {
    /// The state of a bucket of `len` values holding `matrices` (sorted, disjoint), sent at
    /// rank `rank`; Q drawn from `seed` (the same on every worker).
    pub fn new(len: usize, matrices: Vec<Matrix>, rank: usize, seed: u64) -> Self {
        assert!(rank > 0, "PowerSGD's rank is at least 1");
        let mut plain = Vec::new();
        let mut at = 0;
        for m in &matrices {
            assert!(
                m.offset >= at && m.range().end <= len,
                "matrices sorted, in the bucket"
            );
            if m.offset > at {
                plain.push(at..m.offset);
            }
            at = m.range().end;
        }
        if at < len {
            plain.push(at..len);
        }
        let plain_len = plain.iter().map(|r| r.len()).sum();
        let errors: usize = matrices.iter().map(Matrix::len).sum();
        let (first, q_len) = round_lens(len, &matrices, rank);
        Self {
            rank,
            plain,
            plain_len,
            error: vec![0.0; errors],
            q: seeded_values(q_len, seed),
            first: vec![0.0; first],
            second: vec![0.0; q_len],
            matrices,
        }
    }

    /// Values sent in each round: the plain values and every P, then every Q.
    pub fn round_lens(&self) -> (usize, usize) {
        (self.first.len(), self.second.len())
    }

    /// The matrices compressed.
    pub fn matrices(&self) -> &[Matrix] {
        &self.matrices
    }

    /// This worker's error feedback (each matrix's, concatenated).
    pub fn error(&self) -> &[f32] {
        &self.error
    }

    /// The warm-start Q (each matrix's `Q^T`, concatenated): the same on every worker.
    pub fn q(&self) -> &[f32] {
        &self.q
    }

    /// Sets the error feedback and Q (a checkpoint's); `false`, leaving both, if a length
    /// differs.
    pub fn restore(&mut self, error: &[f32], q: &[f32]) -> bool {
        if error.len() != self.error.len() || q.len() != self.q.len() {
            return false;
        }
        self.error.copy_from_slice(error);
        self.q.copy_from_slice(q);
        true
    }

    /// Replaces `buf`, this worker's gradient of the bucket, by the sum over workers: plain
    /// values exactly, matrices as the rank-r product. `all_reduce` is the bucket's
    /// collective (the same bits on every rank); it runs twice.
    pub fn reduce(
        &mut self,
        buf: &mut [f32],
        mut all_reduce: impl FnMut(&mut [f32]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.reduce_first(buf, &mut all_reduce)?;
        self.reduce_second(buf, all_reduce)
    }

    /// Round 1 and what follows it: `P_i` computed, summed by `all_reduce`, orthogonalised,
    /// and `Q_i` and the error computed. Round 2 is then due: [`Self::reduce_second`] alone,
    /// or inside the next bucket's round 1 ([`Self::reduce_first_carrying`]).
    pub fn reduce_first(
        &mut self,
        buf: &mut [f32],
        all_reduce: impl FnOnce(&mut [f32]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.compress(buf);
        all_reduce(&mut self.first)?;
        self.orthogonalise(buf);
        Ok(())
    }

    /// Round 2 alone: every `Q_i` summed by `all_reduce`, and `buf` the product `P Q^T`.
    pub fn reduce_second(
        &mut self,
        buf: &mut [f32],
        all_reduce: impl FnOnce(&mut [f32]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        all_reduce(&mut self.second)?;
        self.decompress(buf);
        Ok(())
    }

    /// Round 1 carrying `earlier`'s round 2: the pipeline's step (`earlier` a bucket between
    /// its rounds, this one fresh): one collective instead of two ([`Self::carry_second`]).
    /// After it this bucket is between its rounds, as after [`Self::reduce_first`], and
    /// `earlier`'s round 2 is summed: [`Self::finish_second`] gives its sum.
    pub fn reduce_first_carrying(
        &mut self,
        buf: &mut [f32],
        earlier: &mut PowerSgdBucket,
        fused: &mut Vec<f32>,
        all_reduce: impl FnOnce(&mut [f32]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.compress(buf);
        earlier.carry_second(&mut self.first, fused, all_reduce)?;
        self.orthogonalise(buf);
        Ok(())
    }

    /// This bucket's round 2 (its Q values) and `with` (the next collective's values: another
    /// bucket's round 1, or a bucket sent whole) summed in one collective, on `fused` (grown
    /// once, then reused); [`Self::finish_second`] then gives this bucket's sum.
    ///
    /// The sums are those of two collectives to the bit wherever `all_reduce` adds each value
    /// in an order that does not depend on where it sits in the message (redundant, shared
    /// memory, tree); ring and halving-doubling add in an order that follows the chunk a value
    /// falls in, so there the bits differ (the same on every rank all the same).
    pub fn carry_second(
        &mut self,
        with: &mut [f32],
        fused: &mut Vec<f32>,
        all_reduce: impl FnOnce(&mut [f32]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        fused.clear();
        fused.extend_from_slice(&self.second);
        fused.extend_from_slice(with);
        all_reduce(fused)?;
        let (second, rest) = fused.split_at(self.second.len());
        self.second.copy_from_slice(second);
        with.copy_from_slice(rest);
        Ok(())
    }

    /// After a round 2 that travelled in the next collective ([`Self::carry_second`]): `buf`
    /// the product `P Q^T`, the plain values' sums.
    pub fn finish_second(&mut self, buf: &mut [f32]) {
        self.decompress(buf);
    }

    /// Before round 1: `M_i = G_i + E_i`, in place in the bucket; round 1's buffer the plain
    /// values, then each `P_i = M_i Q`.
    fn compress(&mut self, buf: &mut [f32]) {
        let r = self.rank;
        let mut at = 0;
        for range in &self.plain {
            self.first[at..at + range.len()].copy_from_slice(&buf[range.clone()]);
            at += range.len();
        }
        let (mut e, mut q, mut p) = (0, 0, self.plain_len);
        for m in &self.matrices {
            let g = &mut buf[m.range()];
            add_assign(g, &self.error[e..e + m.len()]);
            let qt = &self.q[q..q + r * m.cols];
            for (row, p_row) in g
                .chunks_exact(m.cols)
                .zip(self.first[p..p + m.rows * r].chunks_exact_mut(r))
            {
                for (pj, q_row) in p_row.iter_mut().zip(qt.chunks_exact(m.cols)) {
                    *pj = dot(row, q_row);
                }
            }
            (e, q, p) = (e + m.len(), q + r * m.cols, p + m.rows * r);
        }
    }

    /// Between the rounds: P orthonormal; round 2's buffer each `Q_i^T = P^T M_i`; the error
    /// `E_i = M_i - P Q_i^T`.
    fn orthogonalise(&mut self, buf: &[f32]) {
        let r = self.rank;
        let (mut e, mut q, mut p) = (0, 0, self.plain_len);
        for m in &self.matrices {
            let pm = &mut self.first[p..p + m.rows * r];
            orthonormalise_columns(pm, m.rows, r);
            let g = &buf[m.range()];
            let qt = &mut self.second[q..q + r * m.cols];
            qt.fill(0.0);
            for (row, p_row) in g.chunks_exact(m.cols).zip(pm.chunks_exact(r)) {
                for (q_row, &pj) in qt.chunks_exact_mut(m.cols).zip(p_row) {
                    axpy(q_row, pj, row);
                }
            }
            let err = &mut self.error[e..e + m.len()];
            err.copy_from_slice(g);
            for (err_row, p_row) in err.chunks_exact_mut(m.cols).zip(pm.chunks_exact(r)) {
                for (q_row, &pj) in qt.chunks_exact(m.cols).zip(p_row) {
                    axpy(err_row, -pj, q_row);
                }
            }
            (e, q, p) = (e + m.len(), q + r * m.cols, p + m.rows * r);
        }
    }

    /// After round 2: `G = P Q^T` into the bucket, the plain values' sums back in place; the
    /// summed Q is the next step's start.
    fn decompress(&mut self, buf: &mut [f32]) {
        let r = self.rank;
        self.q.copy_from_slice(&self.second);
        let mut at = 0;
        for range in &self.plain {
            buf[range.clone()].copy_from_slice(&self.first[at..at + range.len()]);
            at += range.len();
        }
        let (mut q, mut p) = (0, self.plain_len);
        for m in &self.matrices {
            let g = &mut buf[m.range()];
            g.fill(0.0);
            let qt = &self.q[q..q + r * m.cols];
            for (row, p_row) in g
                .chunks_exact_mut(m.cols)
                .zip(self.first[p..p + m.rows * r].chunks_exact(r))
            {
                for (q_row, &pj) in qt.chunks_exact(m.cols).zip(p_row) {
                    axpy(row, pj, q_row);
                }
            }
            (q, p) = (q + r * m.cols, p + m.rows * r);
        }
    }
}

/// Values in [-1, 1) drawn from `seed`: Q's start (any full-rank start works; PyTorch draws
/// a normal distribution from a seed shared by the ranks).
fn seeded_values(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Gram-Schmidt on the `cols` columns of the row-major `rows x cols` matrix `a`: each column
/// minus its projections on the earlier ones, then divided by its norm (+ [`EPSILON`]).
/// Dot products in f64, in row order.
fn orthonormalise_columns(a: &mut [f32], rows: usize, cols: usize) {
    for j in 0..cols {
        for k in 0..j {
            let d: f64 = (0..rows)
                .map(|i| a[i * cols + j] as f64 * a[i * cols + k] as f64)
                .sum();
            for i in 0..rows {
                a[i * cols + j] -= (d as f32) * a[i * cols + k];
            }
        }
        let norm = (0..rows)
            .map(|i| (a[i * cols + j] as f64).powi(2))
            .sum::<f64>()
            .sqrt() as f32;
        for i in 0..rows {
            a[i * cols + j] /= norm + EPSILON;
        }
    }
}

/// Lanes of [`dot`]'s partial sums: wide enough for the compiler to vectorise the loop,
/// fixed so the result does not depend on the machine.
const LANES: usize = 8;

/// `sum a[i] b[i]` in [`LANES`] interleaved partial sums, added in a fixed order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += alpha x`.
fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

fn add_assign(y: &mut [f32], x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workers' all-reduce in the tests: each hands in its buffer and gets the sum in
    /// rank order (an order that does not depend on where a value sits in the buffer).
    struct RankOrderSum {
        barrier: std::sync::Barrier,
        shared: std::sync::Mutex<Vec<Vec<f32>>>,
        /// Collectives run (counted by worker 0).
        collectives: std::sync::atomic::AtomicUsize,
    }

    impl RankOrderSum {
        fn new(n: usize) -> Self {
            Self {
                barrier: std::sync::Barrier::new(n),
                shared: std::sync::Mutex::new(vec![Vec::new(); n]),
                collectives: std::sync::atomic::AtomicUsize::new(0),
            }
        }

        fn all_reduce(&self, w: usize, buf: &mut [f32]) -> Result<(), CommError> {
            if w == 0 {
                self.collectives
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.shared.lock().unwrap()[w] = buf.to_vec();
            self.barrier.wait();
            let all = self.shared.lock().unwrap().clone();
            self.barrier.wait();
            buf.fill(0.0);
            for contribution in &all {
                add_assign(buf, contribution);
            }
            Ok(())
        }
    }

    /// Each worker's bucket reduced on a thread of its own.
    fn reduce_all(states: &mut [PowerSgdBucket], grads: &mut [Vec<f32>]) {
        let sum = RankOrderSum::new(states.len());
        std::thread::scope(|s| {
            for (w, (st, g)) in states.iter_mut().zip(grads.iter_mut()).enumerate() {
                let sum = &sum;
                s.spawn(move || st.reduce(g, |buf| sum.all_reduce(w, buf)).unwrap());
            }
        });
    }

    fn layout() -> (usize, Vec<Matrix>) {
        // plain 3, a 12 x 10 matrix, plain 2, a 9 x 16 matrix, plain 1
        let a = Matrix {
            offset: 3,
            rows: 12,
            cols: 10,
        };
        let b = Matrix {
            offset: 3 + 120 + 2,
            rows: 9,
            cols: 16,
        };
        (3 + 120 + 2 + 144 + 1, vec![a, b])
    }

    fn grads(n: usize, len: usize, seed: u64) -> Vec<Vec<f32>> {
        (0..n)
            .map(|w| seeded_values(len, seed + w as u64))
            .collect()
    }

    #[test]
    fn compression_rule_is_pytorchs() {
        assert!(compresses(64, 576, 4)); // 2560 * 2 < 36864
        assert!(!compresses(10, 10, 4)); // 80 * 2 > 100
        assert!(!compresses(1, 1000, 1));
        // Ranks whose products wrap in usize arithmetic gain nothing.
        for rank in [1 << 62, 1 << 63, usize::MAX] {
            assert!(!compresses(4096, 4096, rank), "{rank}");
        }
    }

    #[test]
    fn every_worker_gets_the_same_bits_and_plain_values_are_exact_sums() {
        let (len, mats) = layout();
        let mut states: Vec<_> = (0..3)
            .map(|_| PowerSgdBucket::new(len, mats.clone(), 2, 7))
            .collect();
        let mut g = grads(3, len, 100);
        let exact: Vec<f32> = (0..len).map(|i| g[0][i] + g[1][i] + g[2][i]).collect();
        reduce_all(&mut states, &mut g);
        assert_eq!(g[0], g[1]);
        assert_eq!(g[0], g[2]);
        for &i in &[0, 1, 2, 123, 124, len - 1] {
            assert_eq!(g[0][i], exact[i], "plain value {i}");
        }
        assert_eq!(states[0].q(), states[1].q());
        assert_ne!(
            states[0].error(),
            states[1].error(),
            "errors are each worker's"
        );
    }

    #[test]
    fn the_sum_of_errors_is_what_the_product_left_out() {
        let (len, mats) = layout();
        let mut states: Vec<_> = (0..2)
            .map(|_| PowerSgdBucket::new(len, mats.clone(), 1, 3))
            .collect();
        let mut g = grads(2, len, 50);
        let exact: Vec<f32> = (0..len).map(|i| g[0][i] + g[1][i]).collect();
        reduce_all(&mut states, &mut g);
        let mut e = 0;
        for m in &mats {
            for k in 0..m.len() {
                let left_out = states[0].error()[e + k] + states[1].error()[e + k];
                let i = m.offset + k;
                assert!(
                    (exact[i] - g[0][i] - left_out).abs() < 1e-4,
                    "element {i}: sum {} approx {} errors {left_out}",
                    exact[i],
                    g[0][i]
                );
            }
            e += m.len();
        }
    }

    #[test]
    fn a_rank_up_to_the_matrix_is_exact_and_low_rank_gradients_pass_unchanged() {
        // Full rank: P spans every column, so P P^T M = M.
        let m = Matrix {
            offset: 0,
            rows: 6,
            cols: 5,
        };
        let mut states: Vec<_> = (0..2)
            .map(|_| PowerSgdBucket::new(30, vec![m], 5, 1))
            .collect();
        let mut g = grads(2, 30, 9);
        let exact: Vec<f32> = (0..30).map(|i| g[0][i] + g[1][i]).collect();
        reduce_all(&mut states, &mut g);
        for i in 0..30 {
            assert!((g[0][i] - exact[i]).abs() < 1e-4, "{i}");
        }
        // Rank-1 gradients (u v^T on both workers) at rank 1: exact after one step.
        let m = Matrix {
            offset: 0,
            rows: 20,
            cols: 8,
        };
        let mut states: Vec<_> = (0..2)
            .map(|_| PowerSgdBucket::new(160, vec![m], 1, 1))
            .collect();
        let u = seeded_values(20, 4);
        let v = seeded_values(8, 5);
        let outer: Vec<f32> = (0..160).map(|i| u[i / 8] * v[i % 8]).collect();
        let mut g = vec![outer.clone(), outer.iter().map(|x| 2.0 * x).collect()];
        reduce_all(&mut states, &mut g);
        for i in 0..160 {
            assert!((g[0][i] - 3.0 * outer[i]).abs() < 1e-4, "{i}");
        }
    }

    #[test]
    fn pipelined_rounds_keep_the_serial_bits_in_one_collective_fewer_per_bucket() {
        // Three buckets on three workers, two steps (the second starts from the first's Q
        // and error): serially, and pipelined (each round 2 inside the next round 1).
        let (len, mats) = layout();
        let (workers, buckets) = (3, 3);
        let fresh = || -> Vec<Vec<PowerSgdBucket>> {
            (0..workers)
                .map(|_| {
                    (0..buckets)
                        .map(|b| PowerSgdBucket::new(len, mats.clone(), 2, 20 + b as u64))
                        .collect()
                })
                .collect()
        };
        let (mut serial, mut piped) = (fresh(), fresh());
        for step in 0..2u64 {
            let grads = |w: usize| -> Vec<Vec<f32>> {
                (0..buckets)
                    .map(|b| seeded_values(len, 1000 * step + 10 * w as u64 + b as u64))
                    .collect()
            };
            let mut g_serial: Vec<_> = (0..workers).map(grads).collect();
            let mut g_piped = g_serial.clone();
            let sum = RankOrderSum::new(workers);
            std::thread::scope(|s| {
                for (w, (st, g)) in serial.iter_mut().zip(&mut g_serial).enumerate() {
                    let sum = &sum;
                    s.spawn(move || {
                        for (st, g) in st.iter_mut().zip(g.iter_mut()) {
                            st.reduce(g, |buf| sum.all_reduce(w, buf)).unwrap();
                        }
                    });
                }
            });
            assert_eq!(sum.collectives.into_inner(), 2 * buckets);
            let sum = RankOrderSum::new(workers);
            std::thread::scope(|s| {
                for (w, (st, g)) in piped.iter_mut().zip(&mut g_piped).enumerate() {
                    let sum = &sum;
                    s.spawn(move || {
                        let mut fused = Vec::new();
                        let reduce = |buf: &mut [f32]| sum.all_reduce(w, buf);
                        st[0].reduce_first(&mut g[0], reduce).unwrap();
                        for b in 1..buckets {
                            let (done, rest) = st.split_at_mut(b);
                            let (g_done, g_rest) = g.split_at_mut(b);
                            rest[0]
                                .reduce_first_carrying(
                                    &mut g_rest[0],
                                    &mut done[b - 1],
                                    &mut fused,
                                    reduce,
                                )
                                .unwrap();
                            done[b - 1].finish_second(&mut g_done[b - 1]);
                        }
                        st[buckets - 1]
                            .reduce_second(&mut g[buckets - 1], reduce)
                            .unwrap();
                    });
                }
            });
            assert_eq!(sum.collectives.into_inner(), buckets + 1);
            assert_eq!(g_piped, g_serial, "step {step}: the sums");
            for (a, b) in piped.iter().flatten().zip(serial.iter().flatten()) {
                assert_eq!(a.q(), b.q(), "step {step}: Q");
                assert_eq!(a.error(), b.error(), "step {step}: the error feedback");
            }
        }
    }

    #[test]
    fn restore_continues_exactly() {
        let (len, mats) = layout();
        let run = |steps: usize| {
            let mut states: Vec<_> = (0..2)
                .map(|_| PowerSgdBucket::new(len, mats.clone(), 2, 11))
                .collect();
            let mut last = Vec::new();
            for step in 0..steps {
                let mut g = grads(2, len, 1000 + step as u64);
                reduce_all(&mut states, &mut g);
                last = g[0].clone();
            }
            let errors: Vec<Vec<f32>> = states.iter().map(|s| s.error().to_vec()).collect();
            (last, errors, states[0].q().to_vec())
        };
        let (whole, _, _) = run(3);
        // Two steps, the state restored into fresh buckets, then the third step's gradients.
        let (_, errors, q) = run(2);
        let mut states: Vec<_> = (0..2)
            .map(|_| PowerSgdBucket::new(len, mats.clone(), 2, 11))
            .collect();
        for (s, e) in states.iter_mut().zip(&errors) {
            assert!(s.restore(e, &q));
        }
        let mut g = grads(2, len, 1002);
        reduce_all(&mut states, &mut g);
        assert_eq!(g[0], whole);
        assert!(!states[0].restore(&[0.0], &q), "a wrong length is refused");
    }
}
