//! Batch normalisation over NHWC activations (statistics per channel over all rows), with the
//! following activation fused in both directions.
//!
//! Forward (training): one pass for the per-channel sum and sum of squares (f64, per block of
//! [`ROW_BLOCK`] rows in parallel, blocks combined in order: the same bits on any thread
//! count), one pass for `act(x * scale + shift)`. Backward: the incoming gradient is masked by
//! the activation in place, one pass for `sum(dy)` and `sum(dy * xhat)`, one for the input
//! gradient. The statistics are this worker's (as in PyTorch DDP without SyncBatchNorm).

use super::Act;
use rayon::prelude::*;

/// Rows per block of the statistics passes (fixed: the blocks' order is the sum's order).
const ROW_BLOCK: usize = 256;

/// A batch-norm layer's reusable memory (sized for its channel count on first use).
#[derive(Default)]
pub struct BnScratch {
    blocks: Vec<f64>,
    totals: Vec<f64>,
    tmp: Vec<f32>,
}

/// What the training forward keeps for backward and for the running statistics.
pub struct BnSaved<'a> {
    /// Batch mean per channel.
    pub mean: &'a mut [f32],
    /// `1 / sqrt(var + eps)` per channel (biased variance).
    pub invstd: &'a mut [f32],
    /// Unbiased batch variance per channel (for the running variance).
    pub var_unbiased: &'a mut [f32],
}

/// Per-channel sums over `rows` rows of `c` channels of `f(row_values) -> (a, b)` pairs,
/// accumulated in f64 per block and combined in block order into `out` (`[sum_a | sum_b]`).
fn channel_sums2(
    rows: usize,
    c: usize,
    scratch: &mut Vec<f64>,
    out: &mut Vec<f64>,
    block: impl Fn(usize, usize, &mut [f64]) + Sync,
) {
    let blocks = rows.div_ceil(ROW_BLOCK);
    scratch.resize(blocks * 2 * c, 0.0);
    out.resize(2 * c, 0.0);
    scratch
        .par_chunks_mut(2 * c)
        .enumerate()
        .for_each(|(b, part)| {
            part.fill(0.0);
            let r0 = b * ROW_BLOCK;
            block(r0, ROW_BLOCK.min(rows - r0), part);
        });
    out[..2 * c].fill(0.0);
    for part in scratch.chunks_exact(2 * c) {
        for (o, p) in out.iter_mut().zip(part) {
            *o += *p;
        }
    }
}

/// Training forward: `y = act((x - mean) * invstd * gamma + beta)` with batch statistics.
#[allow(clippy::too_many_arguments)]
pub fn forward_train(
    rows: usize,
    c: usize,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    act: Act,
    y: &mut [f32],
    saved: BnSaved,
    scratch: &mut BnScratch,
) {
    let x = &x[..rows * c];
    let BnScratch {
        blocks,
        totals,
        tmp,
    } = scratch;
    channel_sums2(rows, c, blocks, totals, |r0, n, part| {
        let (s, q) = part.split_at_mut(c);
        for row in x[r0 * c..(r0 + n) * c].chunks_exact(c) {
            for ((s, q), &v) in s.iter_mut().zip(q.iter_mut()).zip(row) {
                let v = v as f64;
                *s += v;
                *q += v * v;
            }
        }
    });
    let nf = rows as f64;
    for ch in 0..c {
        let mean = totals[ch] / nf;
        let var = (totals[c + ch] / nf - mean * mean).max(0.0);
        saved.mean[ch] = mean as f32;
        saved.invstd[ch] = (1.0 / (var + eps as f64).sqrt()) as f32;
        saved.var_unbiased[ch] = (var * nf / (nf - 1.0).max(1.0)) as f32;
    }
    tmp.resize(tmp.len().max(2 * c), 0.0);
    normalize(
        rows,
        c,
        x,
        gamma,
        beta,
        saved.mean,
        saved.invstd,
        act,
        y,
        tmp,
    );
}

/// Evaluation forward with the running statistics.
#[allow(clippy::too_many_arguments)]
pub fn forward_eval(
    rows: usize,
    c: usize,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    running_mean: &[f32],
    running_var: &[f32],
    eps: f32,
    act: Act,
    y: &mut [f32],
    scratch: &mut BnScratch,
) {
    let mut invstd = std::mem::take(&mut scratch.tmp);
    invstd.resize(3 * c, 0.0);
    for (i, v) in invstd[2 * c..].iter_mut().zip(running_var) {
        *i = 1.0 / (v + eps).sqrt();
    }
    let (tmp, inv) = invstd.split_at_mut(2 * c);
    normalize(rows, c, x, gamma, beta, running_mean, inv, act, y, tmp);
    scratch.tmp = invstd;
}

#[allow(clippy::too_many_arguments)]
fn normalize(
    rows: usize,
    c: usize,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    mean: &[f32],
    invstd: &[f32],
    act: Act,
    y: &mut [f32],
    scale_shift: &mut [f32],
) {
    let (scale, shift) = scale_shift[..2 * c].split_at_mut(c);
    for ch in 0..c {
        scale[ch] = gamma[ch] * invstd[ch];
        shift[ch] = beta[ch] - mean[ch] * scale[ch];
    }
    let (scale, shift) = (&*scale, &*shift);
    let per = ROW_BLOCK * c;
    y[..rows * c]
        .par_chunks_mut(per)
        .zip(x[..rows * c].par_chunks(per))
        .for_each(|(yb, xb)| {
            for (yr, xr) in yb.chunks_exact_mut(c).zip(xb.chunks_exact(c)) {
                for (((o, &v), &s), &t) in yr.iter_mut().zip(xr).zip(scale).zip(shift) {
                    *o = v.mul_add(s, t);
                }
                act.apply(yr);
            }
        });
}

/// Backward: masks `dy` by the activation (in place: it is dead afterwards), writes
/// `dgb = [dgamma | dbeta]` and the input gradient (added to `dx` when `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    rows: usize,
    c: usize,
    x: &[f32],
    y: &[f32],
    dy: &mut [f32],
    gamma: &[f32],
    mean: &[f32],
    invstd: &[f32],
    act: Act,
    dgb: &mut [f32],
    dx: Option<(&mut [f32], bool)>,
    scratch: &mut BnScratch,
) {
    let (x, dy) = (&x[..rows * c], &mut dy[..rows * c]);
    let per = ROW_BLOCK * c;
    if act != Act::None {
        dy.par_chunks_mut(per)
            .zip(y[..rows * c].par_chunks(per))
            .for_each(|(d, yv)| act.mask_grad(yv, d));
    }
    let dy = &*dy;
    let BnScratch {
        blocks,
        totals,
        tmp,
    } = scratch;
    channel_sums2(rows, c, blocks, totals, |r0, n, part| {
        let (sg, sb) = part.split_at_mut(c);
        let rows = x[r0 * c..(r0 + n) * c]
            .chunks_exact(c)
            .zip(dy[r0 * c..(r0 + n) * c].chunks_exact(c));
        for (xr, dr) in rows {
            for ch in 0..c {
                let xhat = (xr[ch] - mean[ch]) * invstd[ch];
                sg[ch] += (dr[ch] * xhat) as f64;
                sb[ch] += dr[ch] as f64;
            }
        }
    });
    let (dgamma, dbeta) = dgb.split_at_mut(c);
    for ch in 0..c {
        dgamma[ch] = totals[ch] as f32;
        dbeta[ch] = totals[c + ch] as f32;
    }
    let Some((dx, accumulate)) = dx else {
        return;
    };
    let nf = rows as f32;
    tmp.resize(tmp.len().max(3 * c), 0.0);
    let (k, rest) = tmp[..3 * c].split_at_mut(c);
    let (mg, mb) = rest.split_at_mut(c);
    for ch in 0..c {
        k[ch] = gamma[ch] * invstd[ch];
        mg[ch] = dgamma[ch] / nf;
        mb[ch] = dbeta[ch] / nf;
    }
    let (k, mg, mb) = (&k[..c], &mg[..c], &mb[..c]);
    dx[..rows * c]
        .par_chunks_mut(per)
        .zip(x.par_chunks(per).zip(dy.par_chunks(per)))
        .for_each(|(db, (xb, dyb))| {
            for ((dr, xr), gr) in db
                .chunks_exact_mut(c)
                .zip(xb.chunks_exact(c))
                .zip(dyb.chunks_exact(c))
            {
                for ch in 0..c {
                    let xhat = (xr[ch] - mean[ch]) * invstd[ch];
                    let v = k[ch] * (gr[ch] - mb[ch] - xhat * mg[ch]);
                    dr[ch] = if accumulate { dr[ch] + v } else { v };
                }
            }
        });
}
