//! Fully connected layer, `y[n, o] = x[n, i] x W^T + b` with PyTorch's `W[o, i]`.
//!
//! The weight gradient is a sum over the batch: per chunk of samples (`backend::sum_order`)
//! `dW = dY_c^T x X_c`, chunks added as the pairwise tree (see `batch_sum`).

use super::batch_sum::TreeSum;
use super::conv::column_sums;
use super::gemm::{gemm, gemm_packed, MatRef, PackedB};
use crate::backend::Act;
use rayon::prelude::*;

/// Reusable memory of a worker's linear layers.
#[derive(Default)]
pub struct LinearWorkspace {
    packed: PackedB,
    tree: TreeSum,
}

/// Rows per parallel task of the forward and input-gradient products.
const ROWS: usize = 64;

impl LinearWorkspace {
    /// Sets the samples per chunk of the weight-gradient sums.
    pub fn set_chunk(&mut self, samples: usize) {
        self.tree.set_chunk(samples);
    }

    /// `y = act(x W^T + b)` for `n` rows of `i` inputs and `o` outputs.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        n: usize,
        i: usize,
        o: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        act: Act,
        y: &mut [f32],
    ) {
        self.packed.pack(MatRef::transposed(w, i), i, o);
        let packed = &self.packed;
        y[..n * o]
            .par_chunks_mut(ROWS * o)
            .enumerate()
            .for_each(|(t, yt)| {
                let m = yt.len() / o;
                gemm_packed(
                    m,
                    o,
                    i,
                    MatRef::rows(&x[t * ROWS * i..], i),
                    packed,
                    yt,
                    o,
                    false,
                );
                for row in yt.chunks_exact_mut(o) {
                    if let Some(b) = bias {
                        for (v, &bv) in row.iter_mut().zip(b) {
                            *v += bv;
                        }
                    }
                    act.apply(row);
                }
            });
    }

    /// Gradients: `dwb = [dW (o x i) | db (o)]`, and `dx` (added when `accumulate`). `dy` is
    /// the output gradient after the fused activation's mask.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        n: usize,
        i: usize,
        o: usize,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
        has_bias: bool,
        dx: Option<(&mut [f32], bool)>,
    ) {
        self.tree.sum_chunks(n, dwb, &|r, part| {
            let (pw, pb) = part.split_at_mut(o * i);
            let rows = r.end - r.start;
            // dW[o, i] = dY_c^T [o, rows] x X_c [rows, i].
            let a = MatRef::strided(&dy[r.start * o..], 1, o);
            gemm(
                o,
                i,
                rows,
                a,
                MatRef::rows(&x[r.start * i..], i),
                pw,
                i,
                false,
            );
            if has_bias {
                column_sums(&dy[r.start * o..r.end * o], o, pb);
            }
        });
        if let Some((dx, acc)) = dx {
            self.packed.pack(MatRef::rows(w, i), o, i);
            let packed = &self.packed;
            dx[..n * i]
                .par_chunks_mut(ROWS * i)
                .enumerate()
                .for_each(|(t, dxt)| {
                    let m = dxt.len() / i;
                    let a = MatRef::rows(&dy[t * ROWS * o..], o);
                    gemm_packed(m, i, o, a, packed, dxt, i, acc);
                });
        }
    }
}
