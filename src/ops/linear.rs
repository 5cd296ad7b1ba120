//! Fully connected layer as a candle custom op: `y[N, O] = x[N, I] x W^T + b`.
//!
//! candle's own `matmul` + `broadcast_add` computes the same thing, but its weight and bias
//! gradients sum over the batch as one long running sum, so N workers with batch `b` and one
//! worker with batch `N*b` end with different bits. Here every batch reduction goes through
//! fixed chunks of [`BATCH_CHUNK`] samples added as a pairwise tree (see `super::batch_sum`);
//! the chunks run in parallel on the calling rayon pool. The forward and input-gradient GEMMs
//! have no batch sum and cover the whole batch in one call: `gemm` computes each output row
//! from its own input row along the same inner loop whatever the row count (one GEMM per chunk
//! measured ~10% slower on lenet5, from packing the weight again per call). The test
//! `n_workers_match_one_worker_with_the_whole_batch` guards that bit for bit.

use super::batch_sum::{pairwise_sum_in_place, BATCH_CHUNK};
use super::matmul::{matmul, Mat};
use super::{f32_slice, with_f32};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// The linear custom op. Build it through [`super::linear`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LinearOp;

/// `(N, I, O)` from the input and weight dimensions, checked against each other.
fn dims(x: &[usize], w: &[usize]) -> Result<(usize, usize, usize)> {
    match (x, w) {
        ([n, i], [o, wi]) if i == wi => Ok((*n, *i, *o)),
        _ => {
            candle_core::bail!("linear: input {x:?} does not match weight {w:?} ([N, I] x [O, I])")
        }
    }
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "dptrain-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, i, o) = dims(l1.dims(), l2.dims())?;
        let x = f32_slice(s1, l1, "linear input")?;
        let w = f32_slice(s2, l2, "linear weight")?;
        let b = f32_slice(s3, l3, "linear bias")?;
        if b.len() != o {
            candle_core::bail!(
                "linear: bias has {} elements, the layer {o} outputs",
                b.len()
            );
        }
        let mut y = vec![0f32; n * o];
        for row in y.chunks_mut(o.max(1)) {
            row.copy_from_slice(b);
        }
        matmul(
            n,
            o,
            i,
            &mut y,
            true,
            Mat::rows(x, i),
            Mat::transposed(w, i),
        );
        Ok((CpuStorage::F32(y), Shape::from((n, o))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, i, o) = dims(x.dims(), w.dims())?;
        let dev = x.device();
        let mut dx = vec![0f32; n * i];
        let chunks = n.div_ceil(BATCH_CHUNK);
        let mut partials: Vec<Vec<f32>> = with_f32(x, "linear input", |x| {
            with_f32(w, "linear weight", |w| {
                with_f32(grad, "linear output gradient", |g| {
                    // dx[N, I] = g[N, O] x W[O, I]: row by row, no batch sum.
                    matmul(n, i, o, &mut dx, false, Mat::rows(g, o), Mat::rows(w, i));
                    Ok((0..chunks)
                        .into_par_iter()
                        .map(|c| {
                            let first = c * BATCH_CHUNK;
                            let rows = BATCH_CHUNK.min(n - first);
                            let xc = &x[first * i..(first + rows) * i];
                            let gc = &g[first * o..(first + rows) * o];
                            // This chunk's dW[O, I] = g_chunk^T x x_chunk, then db[O].
                            let mut part = vec![0f32; o * i + o];
                            let (pw, pb) = part.split_at_mut(o * i);
                            matmul(
                                o,
                                i,
                                rows,
                                pw,
                                false,
                                Mat::transposed(gc, o),
                                Mat::rows(xc, i),
                            );
                            for grow in gc.chunks(o) {
                                for (acc, v) in pb.iter_mut().zip(grow) {
                                    *acc += v;
                                }
                            }
                            part
                        })
                        .collect())
                })
            })
        })?;
        let (dw, db) = if partials.is_empty() {
            (vec![0f32; o * i], vec![0f32; o])
        } else {
            pairwise_sum_in_place(&mut partials);
            let mut total = partials.swap_remove(0);
            let db = total.split_off(o * i);
            (total, db)
        };
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), dev)?),
            Some(Tensor::from_vec(dw, w.shape(), dev)?),
            Some(Tensor::from_vec(db, o, dev)?),
        ))
    }
}
