//! Element-wise kernels: activations, sums (the residual add), dropout, channel concatenation
//! and the NHWC-to-PyTorch flatten. All run on the worker's threads in fixed-size blocks; none
//! has an order-dependent sum, so thread counts cannot change a bit.

use crate::backend::{Act, DropoutMask};
use rayon::prelude::*;

/// Elements per parallel task of the element-wise passes.
const BLOCK: usize = 1 << 14;

/// `y = act(x)`.
pub fn act_forward(act: Act, x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(BLOCK)
        .zip(x.par_chunks(BLOCK))
        .for_each(|(yb, xb)| {
            yb.copy_from_slice(xb);
            act.apply(yb);
        });
}

/// `dx (+)= dy * act'(y)`.
pub fn act_backward(act: Act, y: &[f32], dy: &[f32], dx: &mut [f32], acc: bool) {
    dx.par_chunks_mut(BLOCK)
        .zip(y.par_chunks(BLOCK).zip(dy.par_chunks(BLOCK)))
        .for_each(|(db, (yb, gb))| {
            for ((d, &v), &g) in db.iter_mut().zip(yb).zip(gb) {
                let keep = match act {
                    Act::None => true,
                    Act::Relu => v > 0.0,
                    Act::Relu6 => v > 0.0 && v < 6.0,
                };
                let g = if keep { g } else { 0.0 };
                *d = if acc { *d + g } else { g };
            }
        });
}

/// Masks `dy` in place by the activation whose output was `y`.
pub fn mask_in_place(act: Act, y: &[f32], dy: &mut [f32]) {
    if act == Act::None {
        return;
    }
    dy.par_chunks_mut(BLOCK)
        .zip(y.par_chunks(BLOCK))
        .for_each(|(d, yb)| act.mask_grad(yb, d));
}

/// `y = act(x[0] + x[1] + ...)`, added in input order.
pub fn add_forward(act: Act, xs: &[&[f32]], y: &mut [f32]) {
    let len = y.len();
    y.par_chunks_mut(BLOCK).enumerate().for_each(|(b, yb)| {
        let r = b * BLOCK..(b * BLOCK + yb.len()).min(len);
        yb.copy_from_slice(&xs[0][r.clone()]);
        for x in &xs[1..] {
            for (a, &v) in yb.iter_mut().zip(&x[r.clone()]) {
                *a += v;
            }
        }
        act.apply(yb);
    });
}

/// `dx = dy` (or `dx += dy`).
pub fn copy_grad(dy: &[f32], dx: &mut [f32], acc: bool) {
    dx.par_chunks_mut(BLOCK)
        .zip(dy.par_chunks(BLOCK))
        .for_each(|(d, g)| {
            if acc {
                for (a, &v) in d.iter_mut().zip(g) {
                    *a += v;
                }
            } else {
                d.copy_from_slice(g);
            }
        });
}

/// `y = x * keep / (1 - p)` over samples of `len` elements, or `y += ...` of the gradient.
fn dropout_apply(m: DropoutMask, len: usize, src: &[f32], dst: &mut [f32], acc: bool) {
    let (t, scale) = (m.threshold(), m.scale());
    dst.par_chunks_mut(len)
        .zip(src.par_chunks(len))
        .enumerate()
        .for_each(|(s, (d, x))| {
            let sample = m.first_sample + s as u64;
            for (e, (o, &v)) in d.iter_mut().zip(x).enumerate() {
                let v = if m.keeps(sample, e as u64, t) {
                    v * scale
                } else {
                    0.0
                };
                *o = if acc { *o + v } else { v };
            }
        });
}

/// Dropout forward over samples of `len` elements (training).
pub fn dropout_forward(m: DropoutMask, len: usize, x: &[f32], y: &mut [f32]) {
    dropout_apply(m, len, x, y, false);
}

/// Dropout backward: the same mask, recomputed (nothing is stored).
pub fn dropout_backward(m: DropoutMask, len: usize, dy: &[f32], dx: &mut [f32], acc: bool) {
    dropout_apply(m, len, dy, dx, acc);
}

/// Concatenates along channels: `y[row, :] = [x0[row, :], x1[row, :], ...]`, `widths[i]` the
/// channels of input i.
pub fn concat_forward(rows: usize, xs: &[&[f32]], widths: &[usize], y: &mut [f32]) {
    let c: usize = widths.iter().sum();
    let per = (BLOCK / c.max(1)).max(1);
    y[..rows * c]
        .par_chunks_mut(per * c)
        .enumerate()
        .for_each(|(b, yb)| {
            for (ri, yr) in yb.chunks_exact_mut(c).enumerate() {
                let r = b * per + ri;
                let mut off = 0;
                for (x, &w) in xs.iter().zip(widths) {
                    yr[off..off + w].copy_from_slice(&x[r * w..(r + 1) * w]);
                    off += w;
                }
            }
        });
}

/// Concat backward for input `i`: `dx = dy[:, off..off + w]` (or added).
pub fn concat_backward(
    rows: usize,
    c: usize,
    off: usize,
    w: usize,
    dy: &[f32],
    dx: &mut [f32],
    acc: bool,
) {
    let per = (BLOCK / w.max(1)).max(1);
    dx[..rows * w]
        .par_chunks_mut(per * w)
        .enumerate()
        .for_each(|(b, db)| {
            for (ri, dr) in db.chunks_exact_mut(w).enumerate() {
                let r = b * per + ri;
                let src = &dy[r * c + off..r * c + off + w];
                if acc {
                    for (a, &v) in dr.iter_mut().zip(src) {
                        *a += v;
                    }
                } else {
                    dr.copy_from_slice(src);
                }
            }
        });
}

/// Flatten in PyTorch's order: `y[s, (c, h, w)] = x[s, (h, w, c)]` for samples of `p` pixels
/// of `c` channels, so a following linear layer's weights are PyTorch's.
pub fn flatten_forward(n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
    y[..n * p * c]
        .par_chunks_mut(p * c)
        .zip(x[..n * p * c].par_chunks(p * c))
        .for_each(|(ys, xs)| {
            for (q, px) in xs.chunks_exact(c).enumerate() {
                for (ch, &v) in px.iter().enumerate() {
                    ys[ch * p + q] = v;
                }
            }
        });
}

/// Flatten backward: the inverse permutation (or added).
pub fn flatten_backward(n: usize, p: usize, c: usize, dy: &[f32], dx: &mut [f32], acc: bool) {
    dx[..n * p * c]
        .par_chunks_mut(p * c)
        .zip(dy[..n * p * c].par_chunks(p * c))
        .for_each(|(xs, ys)| {
            for (q, px) in xs.chunks_exact_mut(c).enumerate() {
                for (ch, a) in px.iter_mut().enumerate() {
                    let v = ys[ch * p + q];
                    *a = if acc { *a + v } else { v };
                }
            }
        });
}

/// NCHW (the loader's layout) to NHWC, for the network's input.
pub fn nchw_to_nhwc(n: usize, c: usize, p: usize, x: &[f32], y: &mut [f32]) {
    if c == 1 {
        y[..n * p].copy_from_slice(&x[..n * p]);
        return;
    }
    y[..n * p * c]
        .par_chunks_mut(p * c)
        .zip(x[..n * p * c].par_chunks(p * c))
        .for_each(|(ys, xs)| {
            for (q, px) in ys.chunks_exact_mut(c).enumerate() {
                for (ch, v) in px.iter_mut().enumerate() {
                    *v = xs[ch * p + q];
                }
            }
        });
}
