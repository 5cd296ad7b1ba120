//! 2-D convolution as a candle custom op: im2col + GEMM, bias fused.
//!
//! Forward, per sample: `out[O, P] = W[O, CKK] x col[CKK, P] + b`. Samples run in parallel
//! on the calling thread's rayon pool; each GEMM is single-threaded, so results do not depend on
//! the thread count.
//!
//! Backward:
//! - weight/bias gradient: `dW = sum_n dY_n x col_n^T`. Samples are grouped into fixed chunks
//!   of [`WGRAD_CHUNK`]; each chunk accumulates its own partial sum and the partials are added
//!   in chunk order, so the result is bit-identical whatever the number of threads.
//! - input gradient (skipped when the op was built with `input_grad: false`):
//!   `dcol_n = W^T x dY_n`, then col2im.

use super::im2col::{col2im_add, im2col, ConvShape};
use super::{f32_slice, out_size, with_f32, ConvGeometry};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use gemm::{gemm, Parallelism};
use rayon::prelude::*;
use std::cell::RefCell;

/// Samples per weight-gradient partial sum. Fixed (not derived from the thread count) so the
/// summation order, and with it every bit of the result, is the same on any number of threads.
const WGRAD_CHUNK: usize = 4;

thread_local! {
    /// Per-thread im2col scratch, reused across calls so steady-state steps do not allocate it.
    static COL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn with_col<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    COL.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < len {
            c.resize(len, 0.0);
        }
        f(&mut c[..len])
    })
}

/// `dst[m, n] (+)= lhs[m, k] x rhs[k, n]` on row-major slices with explicit strides.
///
/// `lhs_t`/`rhs_t` say the operand is stored transposed (as [k, m] / [n, k]).
#[allow(clippy::too_many_arguments)]
fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: &[f32],
    lhs_t: bool,
    rhs: &[f32],
    rhs_t: bool,
) {
    assert!(dst.len() >= m * n && lhs.len() >= m * k && rhs.len() >= k * n);
    let (lhs_cs, lhs_rs) = if lhs_t { (m as isize, 1) } else { (1, k as isize) };
    let (rhs_cs, rhs_rs) = if rhs_t { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: the asserts above bound every index the strides can reach.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs,
            lhs_rs,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// The convolution custom op. Build it through [`super::conv2d`].
#[derive(Debug, Clone, Copy)]
pub struct Conv2dOp {
    /// Stride and padding.
    pub geom: ConvGeometry,
    /// Whether backward produces a gradient for the input.
    pub input_grad: bool,
}

impl Conv2dOp {
    fn shape(&self, x: &[usize], w: &[usize]) -> Result<(usize, usize, ConvShape)> {
        let (&[n, c, h, wd], &[o, wc, kh, kw]) = (x, w) else {
            candle_core::bail!("conv2d: expected 4-d input and weight, got {x:?} and {w:?}");
        };
        if wc != c || kh != kw {
            candle_core::bail!("conv2d: input {x:?} does not match square weight {w:?}");
        }
        let (stride, pad) = (self.geom.stride, self.geom.padding);
        let oh = out_size(h, kh, stride, pad)?;
        let ow = out_size(wd, kw, stride, pad)?;
        Ok((n, o, ConvShape { c, h, w: wd, k: kh, stride, pad, oh, ow }))
    }
}

impl CustomOp3 for Conv2dOp {
    fn name(&self) -> &'static str {
        "dptrain-conv2d"
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
        let (n, o, s) = self.shape(l1.dims(), l2.dims())?;
        let x = f32_slice(s1, l1, "conv2d input")?;
        let w = f32_slice(s2, l2, "conv2d weight")?;
        let b = f32_slice(s3, l3, "conv2d bias")?;
        if b.len() != o {
            candle_core::bail!("conv2d: bias has {} elements, expected {o}", b.len());
        }
        let (in_len, p, ckk) = (s.c * s.h * s.w, s.col_cols(), s.col_rows());
        let mut out = vec![0f32; n * o * p];
        out.par_chunks_mut(o * p).enumerate().for_each(|(i, y)| {
            for (row, &bias) in y.chunks_mut(p).zip(b) {
                row.fill(bias);
            }
            let xi = &x[i * in_len..(i + 1) * in_len];
            if s.k == 1 && s.stride == 1 && s.pad == 0 {
                // A 1x1 convolution's column matrix is the input itself.
                matmul(o, p, ckk, y, true, w, false, xi, false);
            } else {
                with_col(ckk * p, |col| {
                    im2col(&s, xi, col);
                    matmul(o, p, ckk, y, true, w, false, col, false);
                });
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((n, o, s.oh, s.ow))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, o, s) = self.shape(x.dims(), w.dims())?;
        let (in_len, p, ckk) = (s.c * s.h * s.w, s.col_cols(), s.col_rows());
        let dev = x.device();
        let (dw, db, dx) = with_f32(x, "conv2d input", |x| {
            with_f32(w, "conv2d weight", |w| {
                with_f32(grad, "conv2d output gradient", |g| {
                    // Weight and bias gradient: fixed-size chunks, partials summed in order.
                    let partials: Vec<Vec<f32>> = (0..n.div_ceil(WGRAD_CHUNK))
                        .into_par_iter()
                        .map(|chunk| {
                            let mut part = vec![0f32; o * ckk + o];
                            let (pw, pb) = part.split_at_mut(o * ckk);
                            let end = ((chunk + 1) * WGRAD_CHUNK).min(n);
                            with_col(ckk * p, |col| {
                                for i in chunk * WGRAD_CHUNK..end {
                                    let gi = &g[i * o * p..(i + 1) * o * p];
                                    im2col(&s, &x[i * in_len..(i + 1) * in_len], col);
                                    matmul(o, ckk, p, pw, true, gi, false, col, true);
                                    for (bj, grow) in pb.iter_mut().zip(gi.chunks(p)) {
                                        *bj += grow.iter().sum::<f32>();
                                    }
                                }
                            });
                            part
                        })
                        .collect();
                    let mut total = partials[0].clone();
                    for part in &partials[1..] {
                        for (t, v) in total.iter_mut().zip(part) {
                            *t += v;
                        }
                    }
                    let db = total.split_off(o * ckk);
                    // Input gradient, per sample.
                    let dx = if self.input_grad {
                        let mut dx = vec![0f32; n * in_len];
                        dx.par_chunks_mut(in_len).enumerate().for_each(|(i, dxi)| {
                            with_col(ckk * p, |dcol| {
                                let gi = &g[i * o * p..(i + 1) * o * p];
                                matmul(ckk, p, o, dcol, false, w, true, gi, false);
                                col2im_add(&s, dcol, dxi);
                            });
                        });
                        Some(dx)
                    } else {
                        None
                    };
                    Ok((total, db, dx))
                })
            })
        })?;
        let dw = Tensor::from_vec(dw, w.shape(), dev)?;
        let db = Tensor::from_vec(db, o, dev)?;
        let dx = dx.map(|v| Tensor::from_vec(v, x.shape(), dev)).transpose()?;
        Ok((dx, Some(dw), Some(db)))
    }
}
