//! Max, average and global average pooling over NHWC activations, vectorised along channels.
//! Backward passes run one sample per task, so the additions into each input pixel (windows
//! overlap when the stride is below the kernel) happen in a fixed order.

use crate::backend::PoolGeom;
use rayon::prelude::*;

/// Max-pool forward without padding, the window wholly inside: one pass per tap over the
/// output's channels (the general version's per-tap checks cost more than the comparisons
/// for few channels).
fn max_forward_unpadded(g: &PoolGeom, xs: &[f32], ys: &mut [f32], args: &mut [u8]) {
    let c = g.c;
    for oy in 0..g.oh {
        for ox in 0..g.ow {
            let o = (oy * g.ow + ox) * c;
            let (yp, ap) = (&mut ys[o..o + c], &mut args[o..o + c]);
            let first = &xs[((oy * g.sh) * g.w + ox * g.sw) * c..][..c];
            yp.copy_from_slice(first);
            ap.fill(0);
            for ki in 0..g.kh {
                let line = ((oy * g.sh + ki) * g.w + ox * g.sw) * c;
                for kj in 0..g.kw {
                    if ki == 0 && kj == 0 {
                        continue;
                    }
                    let xp = &xs[line + kj * c..][..c];
                    let pos = (ki * g.kw + kj) as u8;
                    for ((yv, av), &v) in yp.iter_mut().zip(ap.iter_mut()).zip(xp) {
                        // NaN wins, as in PyTorch.
                        let take = v > *yv || (v.is_nan() && !yv.is_nan());
                        *yv = if take { v } else { *yv };
                        *av = if take { pos } else { *av };
                    }
                }
            }
        }
    }
}

/// Max-pool forward; `arg` records each output's window position (`ki * kw + kj`; windows are
/// at most 255 elements). Ties go to the first maximum in row-major order; NaN wins (PyTorch).
pub fn max_forward(g: &PoolGeom, n: usize, x: &[f32], y: &mut [f32], arg: &mut [u8]) {
    let c = g.c;
    y[..n * g.out_len()]
        .par_chunks_mut(g.out_len())
        .zip(arg[..n * g.out_len()].par_chunks_mut(g.out_len()))
        .enumerate()
        .for_each(|(s, (ys, args))| {
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            if g.ph == 0 && g.pw == 0 {
                return max_forward_unpadded(g, xs, ys, args);
            }
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let o = (oy * g.ow + ox) * c;
                    let (yp, ap) = (&mut ys[o..o + c], &mut args[o..o + c]);
                    let mut first = true;
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            let Some((iy, ix)) = g.src(oy, ox, ki, kj) else {
                                continue;
                            };
                            let xp = &xs[(iy * g.w + ix) * c..][..c];
                            let pos = (ki * g.kw + kj) as u8;
                            for ((yv, av), &v) in yp.iter_mut().zip(ap.iter_mut()).zip(xp) {
                                if first || v > *yv || (v.is_nan() && !yv.is_nan()) {
                                    *yv = v;
                                    *av = pos;
                                }
                            }
                            first = false;
                        }
                    }
                    if first {
                        // No tap inside the image (not possible with padding <= half the
                        // window, which the model checks).
                        yp.fill(f32::NEG_INFINITY);
                        ap.fill(0);
                    }
                }
            }
        });
}

/// Max-pool backward: each output's gradient goes to its recorded maximum.
pub fn max_backward(g: &PoolGeom, n: usize, dy: &[f32], arg: &[u8], dx: &mut [f32], acc: bool) {
    let c = g.c;
    dx[..n * g.in_len()]
        .par_chunks_mut(g.in_len())
        .enumerate()
        .for_each(|(s, dxs)| {
            if !acc {
                dxs.fill(0.0);
            }
            let ds = &dy[s * g.out_len()..(s + 1) * g.out_len()];
            let args = &arg[s * g.out_len()..(s + 1) * g.out_len()];
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let o = (oy * g.ow + ox) * c;
                    for ch in 0..c {
                        let pos = args[o + ch] as usize;
                        let (ki, kj) = (pos / g.kw, pos % g.kw);
                        if let Some((iy, ix)) = g.src(oy, ox, ki, kj) {
                            dxs[(iy * g.w + ix) * c + ch] += ds[o + ch];
                        }
                    }
                }
            }
        });
}

/// Elements averaged by the window at (`oy`, `ox`).
fn count(g: &PoolGeom, oy: usize, ox: usize, include_pad: bool) -> f32 {
    if include_pad {
        // PyTorch counts the padding but not the part of a window past the padded edge.
        let y0 = (oy * g.sh) as isize - g.ph as isize;
        let x0 = (ox * g.sw) as isize - g.pw as isize;
        let y1 = (y0 + g.kh as isize).min((g.h + g.ph) as isize);
        let x1 = (x0 + g.kw as isize).min((g.w + g.pw) as isize);
        ((y1 - y0) * (x1 - x0)) as f32
    } else {
        let mut n = 0;
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                n += g.src(oy, ox, ki, kj).is_some() as usize;
            }
        }
        n.max(1) as f32
    }
}

/// Average-pool forward.
pub fn avg_forward(g: &PoolGeom, n: usize, x: &[f32], y: &mut [f32], include_pad: bool) {
    let c = g.c;
    y[..n * g.out_len()]
        .par_chunks_mut(g.out_len())
        .enumerate()
        .for_each(|(s, ys)| {
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let yp = &mut ys[(oy * g.ow + ox) * c..][..c];
                    super::gemm::zero_short(yp);
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            if let Some((iy, ix)) = g.src(oy, ox, ki, kj) {
                                let xp = &xs[(iy * g.w + ix) * c..][..c];
                                for (a, &v) in yp.iter_mut().zip(xp) {
                                    *a += v;
                                }
                            }
                        }
                    }
                    let inv = 1.0 / count(g, oy, ox, include_pad);
                    yp.iter_mut().for_each(|v| *v *= inv);
                }
            }
        });
}

/// Average-pool backward.
pub fn avg_backward(
    g: &PoolGeom,
    n: usize,
    dy: &[f32],
    dx: &mut [f32],
    acc: bool,
    include_pad: bool,
) {
    let c = g.c;
    dx[..n * g.in_len()]
        .par_chunks_mut(g.in_len())
        .enumerate()
        .for_each(|(s, dxs)| {
            if !acc {
                dxs.fill(0.0);
            }
            let ds = &dy[s * g.out_len()..(s + 1) * g.out_len()];
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let d = &ds[(oy * g.ow + ox) * c..][..c];
                    let inv = 1.0 / count(g, oy, ox, include_pad);
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            if let Some((iy, ix)) = g.src(oy, ox, ki, kj) {
                                let xp = &mut dxs[(iy * g.w + ix) * c..][..c];
                                for (a, &v) in xp.iter_mut().zip(d) {
                                    *a += v * inv;
                                }
                            }
                        }
                    }
                }
            }
        });
}

/// Global average pool: `y[s, c] = mean over the `p` pixels of x[s, :, c]`.
pub fn global_avg_forward(n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
    let inv = 1.0 / p as f32;
    y[..n * c]
        .par_chunks_mut(c)
        .enumerate()
        .for_each(|(s, ys)| {
            ys.fill(0.0);
            for px in x[s * p * c..(s + 1) * p * c].chunks_exact(c) {
                for (a, &v) in ys.iter_mut().zip(px) {
                    *a += v;
                }
            }
            ys.iter_mut().for_each(|v| *v *= inv);
        });
}

/// Global average pool backward: each pixel gets `dy / p`.
pub fn global_avg_backward(n: usize, p: usize, c: usize, dy: &[f32], dx: &mut [f32], acc: bool) {
    let inv = 1.0 / p as f32;
    dx[..n * p * c]
        .par_chunks_mut(p * c)
        .enumerate()
        .for_each(|(s, dxs)| {
            let d = &dy[s * c..(s + 1) * c];
            for px in dxs.chunks_exact_mut(c) {
                for (a, &v) in px.iter_mut().zip(d) {
                    *a = if acc { *a + v * inv } else { v * inv };
                }
            }
        });
}
