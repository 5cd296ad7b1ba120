//! 2-D convolution as a candle custom op: im2col + GEMM, bias fused, and optionally a fused
//! ReLU and non-overlapping max-pool after it (see [`super::conv2d_fused`] for why).
//!
//! Forward, per sample: `out[O, P] = W[O, CKK] x col[CKK, P] + b`, then `max(out, 0)` when the
//! op carries its ReLU, then the pool (recording each window's argmax). Samples run in parallel
//! on the calling thread's rayon pool; each GEMM is single-threaded, so results do not depend
//! on the thread count.
//!
//! Backward runs over fixed chunks of [`BATCH_CHUNK`] samples, in parallel. For each chunk:
//! - the convolution's output gradient `G` is rebuilt (`[chunk, O, P]`): masked by `out > 0`
//!   for the ReLU and, with a pool, scattered from the pooled gradient to the recorded argmax;
//! - the chunk's column matrices are laid side by side in one `[CKK, chunk*P]` matrix, so its
//!   weight gradient is a single GEMM with a long inner dimension, `dW^T = col x G^T`, shaped
//!   so that `gemm` reads both operands in place (see `backward_chunk`);
//! - each chunk keeps its own weight/bias partial sum, and the partials are added as a pairwise
//!   tree (`super::batch_sum`), so the result is bit-identical whatever the number of threads,
//!   and whether the batch was split across workers or not;
//! - the input gradient (skipped when the op was built with `input_grad: false`) of each sample
//!   is a full convolution of `G` with the flipped kernel for stride-1 "same" convolutions, and
//!   `dcol = W^T x G` followed by col2im otherwise (see `Conv2dOp::dx_as_conv`).

use super::batch_sum::{pairwise_sum_in_place, BATCH_CHUNK};
use super::im2col::{col2im_add, im2col, im2col_ld, ConvShape};
use super::matmul::{matmul, Mat};
use super::{f32_slice, out_size, with_f32, ConvGeometry};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// Per-thread scratch buffers, reused across calls so steady-state steps do not allocate them.
#[derive(Default)]
struct Scratch {
    /// Column matrix (im2col output, or `dcol` for the input gradient).
    col: Vec<f32>,
    /// Backward: one chunk's output gradient and its transpose. Forward with a fused pool: one
    /// sample's full-resolution convolution output.
    grad: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch, grown to at least `col_len` / `grad_len` elements.
fn with_scratch<R>(
    col_len: usize,
    grad_len: usize,
    f: impl FnOnce(&mut [f32], &mut [f32]) -> R,
) -> R {
    SCRATCH.with(|sc| {
        let mut sc = sc.borrow_mut();
        let Scratch { col, grad } = &mut *sc;
        if col.len() < col_len {
            col.resize(col_len, 0.0);
        }
        if grad.len() < grad_len {
            grad.resize(grad_len, 0.0);
        }
        f(&mut col[..col_len], &mut grad[..grad_len])
    })
}

/// The convolution custom op. Build it through [`super::conv2d`] (or its fused variants).
#[derive(Debug, Clone)]
pub struct Conv2dOp {
    /// Stride and padding.
    pub geom: ConvGeometry,
    /// Whether backward produces a gradient for the input.
    pub input_grad: bool,
    /// Whether the output is passed through a ReLU (fused: forward clamps in place, backward
    /// masks the incoming gradient by `output > 0`).
    pub relu: bool,
    /// Window (and stride) of a fused, non-overlapping max-pool applied last, if any.
    pub pool: Option<usize>,
    /// Position of each pooled output's maximum within its window (row-major), recorded by the
    /// forward pass for the backward one. With it, backward scatters the pooled gradient
    /// straight into the convolution's output gradient: the full-resolution output is never a
    /// tensor, so candle neither stores it nor allocates, zeroes and adds its gradient.
    pub argmax: Arc<Mutex<Vec<u8>>>,
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
        if let Some(k) = self.pool {
            // `k * k <= 256`: the argmax within a window is stored in a byte.
            if k == 0 || k * k > 256 || oh < k || ow < k {
                candle_core::bail!(
                    "conv2d: cannot max-pool a {oh}x{ow} output with a {k}x{k} window"
                );
            }
        }
        Ok((
            n,
            o,
            ConvShape {
                c,
                h,
                w: wd,
                k: kh,
                stride,
                pad,
                oh,
                ow,
            },
        ))
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
        let (ph, pw) = self.pooled(&s);
        let q = ph * pw;
        let mut out = vec![0f32; n * o * q];
        let mut argmax = vec![0u8; if self.pool.is_some() { n * o * q } else { 0 }];
        // Per-sample argmax slices (empty without a pool), to hand out with the output slices.
        let arg_parts: Vec<&mut [u8]> = if self.pool.is_some() {
            argmax.chunks_mut(o * q).collect()
        } else {
            (0..n).map(|_| &mut [][..]).collect()
        };
        out.par_chunks_mut(o * q)
            .zip(arg_parts)
            .enumerate()
            .for_each(|(i, (out_i, arg_i))| {
                let xi = &x[i * in_len..(i + 1) * in_len];
                // Without a pool the convolution writes straight into the output; with one,
                // into scratch that the pool then reads while it is still in cache.
                let full_len = if self.pool.is_some() { o * p } else { 0 };
                with_scratch(ckk * p, full_len, |col, full| {
                    let conv = |y: &mut [f32], col: &mut [f32]| {
                        for (row, &bias) in y.chunks_mut(p).zip(b) {
                            row.fill(bias);
                        }
                        if s.k == 1 && s.stride == 1 && s.pad == 0 {
                            // A 1x1 convolution's column matrix is the input itself.
                            matmul(o, p, ckk, y, true, Mat::rows(w, ckk), Mat::rows(xi, p));
                        } else {
                            im2col(&s, xi, col);
                            matmul(o, p, ckk, y, true, Mat::rows(w, ckk), Mat::rows(col, p));
                        }
                    };
                    if let Some(k) = self.pool {
                        conv(full, col);
                        pool_forward(full, s.oh, s.ow, k, self.relu, out_i, arg_i);
                    } else {
                        conv(out_i, col);
                        if self.relu {
                            // While the sample's output is still in cache.
                            out_i.iter_mut().for_each(|v| *v = v.max(0.0));
                        }
                    }
                });
            });
        *self.argmax.lock().unwrap_or_else(|e| e.into_inner()) = argmax;
        Ok((CpuStorage::F32(out), Shape::from((n, o, ph, pw))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, o, s) = self.shape(x.dims(), w.dims())?;
        let (in_len, ckk) = (s.c * s.h * s.w, s.col_rows());
        let dev = x.device();
        // The output is only read when the ReLU is fused (for its mask).
        let res = if self.relu { res.clone() } else { grad.clone() };
        let chunks = n.div_ceil(BATCH_CHUNK);
        let mut dx = vec![0f32; if self.input_grad { n * in_len } else { 0 }];
        let partials: Vec<Vec<f32>> = with_f32(x, "conv2d input", |x| {
            with_f32(w, "conv2d weight", |w| {
                with_f32(grad, "conv2d output gradient", |g| {
                    with_f32(&res, "conv2d output", |y| {
                        let wdx = self.dx_weight(&s, o, w);
                        // One (possibly empty) slice of `dx` per chunk, so each chunk task
                        // writes its own samples' input gradient.
                        let dx_parts: Vec<&mut [f32]> = if self.input_grad {
                            dx.chunks_mut(BATCH_CHUNK * in_len).collect()
                        } else {
                            (0..chunks).map(|_| &mut [][..]).collect()
                        };
                        let argmax = self.argmax.lock().unwrap_or_else(|e| e.into_inner());
                        let bufs = Buffers {
                            x,
                            wdx: &wdx,
                            g,
                            y,
                            argmax: &argmax,
                        };
                        Ok(dx_parts
                            .into_par_iter()
                            .enumerate()
                            .map(|(chunk, dxc)| {
                                self.backward_chunk(&s, o, &bufs, chunk * BATCH_CHUNK, dxc)
                            })
                            .collect())
                    })
                })
            })
        })?;
        // Chunk partials added as a pairwise tree: the same sums on any number of threads, and
        // for a batch split across workers (see `batch_sum`).
        let mut partials = partials;
        pairwise_sum_in_place(&mut partials);
        let mut total = partials.swap_remove(0);
        // The partials hold dW^T ([CKK, O]) then db.
        let db = total.split_off(o * ckk);
        let mut dw = vec![0f32; o * ckk];
        for (j, row) in total.chunks(o).enumerate() {
            for (oi, &v) in row.iter().enumerate() {
                dw[oi * ckk + j] = v;
            }
        }
        let dw = Tensor::from_vec(dw, w.shape(), dev)?;
        let db = Tensor::from_vec(db, o, dev)?;
        let dx = if self.input_grad {
            Some(Tensor::from_vec(dx, x.shape(), dev)?)
        } else {
            None
        };
        Ok((dx, Some(dw), Some(db)))
    }
}

/// The whole-batch inputs of the backward pass, as flat slices.
struct Buffers<'a> {
    /// Input, [N, C, H, W].
    x: &'a [f32],
    /// Weight rearranged for the input gradient (see [`Conv2dOp::dx_weight`]).
    wdx: &'a [f32],
    /// Output gradient, [N, O, OH, OW].
    g: &'a [f32],
    /// Output (read for the ReLU mask only).
    y: &'a [f32],
    /// Where each pooled output's maximum was (fused pool only).
    argmax: &'a [u8],
}

impl Conv2dOp {
    /// Whether the input gradient is computed as a plain ("full") convolution of the output
    /// gradient with the flipped kernel, rather than as `W^T x dY` followed by col2im.
    ///
    /// Chosen for stride-1 "same" convolutions (output as large as the input), where it is the
    /// same arithmetic, but the GEMM has the long inner dimension O*K*K instead of O and writes
    /// the (C, H, W) input gradient directly, where the col2im route writes and re-reads a
    /// (C*K*K, OH*OW) matrix and adds it back with scattered read-modify-writes; that route
    /// measured ~2x slower. Without padding (LeNet's 5x5 convolutions) the full convolution
    /// would multiply mostly zeros of its own padding, 2-3x more work, so col2im is kept.
    fn dx_as_conv(s: &ConvShape) -> bool {
        s.stride == 1 && 2 * s.pad + 1 == s.k
    }

    /// The weight as the input-gradient GEMM wants it: flipped and with O and C swapped,
    /// `[C, O*K*K]` with `wflip[c, (o*K + ki)*K + kj] = W[o, c, K-1-ki, K-1-kj]`, for the
    /// full-convolution route; W^T (`[CKK, O]`, so that `gemm` reads it along unit strides and
    /// need not repack it for every sample) for the col2im one.
    fn dx_weight(&self, s: &ConvShape, o: usize, w: &[f32]) -> Vec<f32> {
        let (k, c, ckk) = (s.k, s.c, s.col_rows());
        let mut out = vec![0f32; ckk * o];
        if Self::dx_as_conv(s) {
            let okk = o * k * k;
            for oi in 0..o {
                for ci in 0..c {
                    for ki in 0..k {
                        for kj in 0..k {
                            let src = ((oi * c + ci) * k + ki) * k + kj;
                            let dst = ci * okk + (oi * k + (k - 1 - ki)) * k + (k - 1 - kj);
                            out[dst] = w[src];
                        }
                    }
                }
            }
        } else {
            for (oi, row) in w.chunks(ckk).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    out[j * o + oi] = v;
                }
            }
        }
        out
    }

    /// Backward of the samples from `first` (at most [`BATCH_CHUNK`] of them): returns their
    /// weight gradient, transposed (`[CKK, O]`), then their bias gradient (`[O]`), and writes
    /// their input gradient into `dx` (empty when the op has no input gradient).
    fn backward_chunk(
        &self,
        s: &ConvShape,
        o: usize,
        b: &Buffers,
        first: usize,
        dx: &mut [f32],
    ) -> Vec<f32> {
        let (in_len, p, ckk) = (s.c * s.h * s.w, s.col_cols(), s.col_rows());
        let n = b.x.len() / in_len;
        let cs = BATCH_CHUNK.min(n - first);
        let kk = cs * p;
        let as_conv = Self::dx_as_conv(s);
        // Geometry of the input gradient as a convolution of the (O, OH, OW) output gradient
        // (used when `as_conv`; its padding K-1-pad then equals pad).
        let gs = ConvShape {
            c: o,
            h: s.oh,
            w: s.ow,
            k: s.k,
            stride: 1,
            pad: s.pad,
            oh: s.h,
            ow: s.w,
        };
        let col_len = (ckk * kk).max(if as_conv {
            gs.col_rows() * gs.col_cols()
        } else {
            0
        });
        let mut part = vec![0f32; ckk * o + o];
        with_scratch(col_len, 2 * o * kk, |col, gbuf| {
            let (gc, gct) = gbuf.split_at_mut(o * kk);
            // The chunk's output gradient, [cs, O, P], masked by the fused ReLU and, with a fused
            // pool, scattered from the pooled gradient.
            let q = self.pooled(s).0 * self.pooled(s).1;
            let pooled = first * o * q..(first + cs) * o * q;
            let y = if self.relu {
                &b.y[pooled.clone()]
            } else {
                &[][..]
            };
            let arg = if self.pool.is_some() {
                &b.argmax[pooled.clone()]
            } else {
                &[][..]
            };
            self.gather_grad(s, &b.g[pooled], y, arg, gc);
            // G^T ([kk, O]): `gemm` wants the weight-gradient GEMM's destination dimension O
            // contiguous in its first operand; the other operand, `col`, is then read along k
            // as it is. With G as it is and `col` transposed instead, `gemm` repacks the whole
            // column matrix, which measured 3x slower than the forward GEMM.
            for (si, gs_) in gc.chunks(o * p).enumerate() {
                for (oi, row) in gs_.chunks(p).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        gct[(si * p + j) * o + oi] = v;
                    }
                }
            }
            for si in 0..cs {
                let xi = &b.x[(first + si) * in_len..(first + si + 1) * in_len];
                im2col_ld(s, xi, &mut col[si * p..], kk);
            }
            let (pw, pb) = part.split_at_mut(ckk * o);
            // dW^T_chunk[CKK, O] = col[CKK, kk] x G^T[kk, O]: one GEMM for the whole chunk.
            matmul(ckk, o, kk, pw, false, Mat::rows(col, kk), Mat::rows(gct, o));
            for gs_ in gc.chunks(o * p) {
                for (bj, grow) in pb.iter_mut().zip(gs_.chunks(p)) {
                    *bj += grow.iter().sum::<f32>();
                }
            }
            for (gi, dxi) in gc.chunks(o * p).zip(dx.chunks_mut(in_len)) {
                if as_conv {
                    // dx[C, H*W] = Wflip[C, OKK] x im2col(G_si)[OKK, H*W]
                    let okk = gs.col_rows();
                    let gcol = &mut col[..okk * in_len / s.c];
                    im2col(&gs, gi, gcol);
                    matmul(
                        s.c,
                        s.h * s.w,
                        okk,
                        dxi,
                        false,
                        Mat::rows(b.wdx, okk),
                        Mat::rows(gcol, s.h * s.w),
                    );
                } else {
                    // dcol = W^T[CKK, O] x G_si[O, P], then col2im.
                    let dcol = &mut col[..ckk * p];
                    matmul(
                        ckk,
                        p,
                        o,
                        dcol,
                        false,
                        Mat::rows(b.wdx, o),
                        Mat::rows(gi, p),
                    );
                    col2im_add(s, dcol, dxi);
                }
            }
        });
        part
    }

    /// Output size after the fused pool (the convolution's output size without one).
    fn pooled(&self, s: &ConvShape) -> (usize, usize) {
        match self.pool {
            Some(k) => (s.oh / k, s.ow / k),
            None => (s.oh, s.ow),
        }
    }

    /// Builds the convolution's output gradient `gc` ([samples, O, OH*OW]) from the op's output
    /// gradient `g`: zeroed where the fused ReLU's output `y` is not positive (`y` is empty
    /// without a fused ReLU) and, with a fused pool, routed to each window's maximum (recorded
    /// in `arg`) with zeros elsewhere.
    fn gather_grad(&self, s: &ConvShape, g: &[f32], y: &[f32], arg: &[u8], gc: &mut [f32]) {
        let keep = |i: usize| !self.relu || y[i] > 0.0;
        let Some(k) = self.pool else {
            if self.relu {
                for (i, (d, &gv)) in gc.iter_mut().zip(g).enumerate() {
                    *d = if keep(i) { gv } else { 0.0 };
                }
            } else {
                gc.copy_from_slice(g);
            }
            return;
        };
        let (ph, pw) = self.pooled(s);
        let (p, q) = (s.col_cols(), ph * pw);
        gc.fill(0.0);
        for (plane, gp) in gc.chunks_mut(p).enumerate() {
            for py in 0..ph {
                for px in 0..pw {
                    let i = plane * q + py * pw + px;
                    if keep(i) {
                        let (dy, dx) = (arg[i] as usize / k, arg[i] as usize % k);
                        gp[(py * k + dy) * s.ow + px * k + dx] = g[i];
                    }
                }
            }
        }
    }
}

/// Non-overlapping `k x k` max-pool of one sample's convolution output `y` ([O, OH, OW]) into
/// `out` ([O, OH/k, OW/k]), then the ReLU if `relu` (max and ReLU commute), recording in `arg`
/// where each maximum was: the first one in row-major order, as in [`super::MaxPool2dOp`].
/// Unlike that op, a NaN does not win over numbers (`f32::max`), which keeps the common 2x2 case
/// branch-free and vectorisable (a branchy version measured ~3 ns per input element).
fn pool_forward(
    y: &[f32],
    oh: usize,
    ow: usize,
    k: usize,
    relu: bool,
    out: &mut [f32],
    arg: &mut [u8],
) {
    let (ph, pw) = (oh / k, ow / k);
    for (yp, (op, ap)) in y
        .chunks(oh * ow)
        .zip(out.chunks_mut(ph * pw).zip(arg.chunks_mut(ph * pw)))
    {
        for py in 0..ph {
            let rows = &yp[py * k * ow..(py + 1) * k * ow];
            let (op, ap) = (
                &mut op[py * pw..(py + 1) * pw],
                &mut ap[py * pw..(py + 1) * pw],
            );
            if k == 2 {
                let (r0, r1) = rows.split_at(ow);
                let pairs = r0.chunks_exact(2).zip(r1.chunks_exact(2));
                for ((o, a), (t, b)) in op.iter_mut().zip(ap.iter_mut()).zip(pairs) {
                    let m = t[0].max(t[1]).max(b[0].max(b[1]));
                    // First position holding the maximum, checked last to first.
                    let mut i = if b[0] == m { 2 } else { 3 };
                    i = if t[1] == m { 1 } else { i };
                    i = if t[0] == m { 0 } else { i };
                    *o = if relu { m.max(0.0) } else { m };
                    *a = i;
                }
                continue;
            }
            for (px, (o, a)) in op.iter_mut().zip(ap.iter_mut()).enumerate() {
                let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
                for dy in 0..k {
                    for dx in 0..k {
                        let v = rows[dy * ow + px * k + dx];
                        if v > best_v {
                            best = dy * k + dx;
                            best_v = v;
                        }
                    }
                }
                if best_v == f32::NEG_INFINITY {
                    // All -inf or NaN: report the first element, like `f32::max` would.
                    best_v = rows[px * k];
                }
                *o = if relu { best_v.max(0.0) } else { best_v };
                *a = best as u8;
            }
        }
    }
}
