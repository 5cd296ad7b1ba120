//! Batch normalisation over NHWC activations (statistics per channel over all rows), with the
//! following activation fused in both directions.
//!
//! Forward (training): one pass for the per-channel sum and sum of squares, one pass for
//! `act(x * scale + shift)`. Backward: one pass that masks the incoming gradient by the
//! activation (in place) and sums `dy` and `dy * xhat`, one for the input gradient. Sums run
//! per block of [`ROW_BLOCK`] rows in parallel (f32, of values shifted by the first row so
//! that the sum of squares does not cancel) and the blocks are added in order in f64: the
//! same bits on any thread count. The statistics are this worker's (as in PyTorch DDP without
//! SyncBatchNorm).

use crate::backend::Act;
use rayon::prelude::*;

/// Rows per block of the statistics passes (fixed: the blocks' order is the sum's order).
const ROW_BLOCK: usize = 128;

/// A batch-norm layer's reusable memory (sized for its channel count on first use).
#[derive(Default)]
pub struct BnScratch {
    blocks: Vec<f32>,
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

/// Per-channel sums over `rows` rows of `c` channels: `block(r0, n, part)` adds two values
/// per channel of rows `r0..r0+n` into `part` (`[a | b]`, zeroed); blocks are combined in
/// order, in f64, into `totals`.
fn channel_sums2(
    rows: usize,
    c: usize,
    scratch: &mut Vec<f32>,
    totals: &mut Vec<f64>,
    block: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let blocks = rows.div_ceil(ROW_BLOCK);
    scratch.resize(blocks * 2 * c, 0.0);
    totals.clear();
    totals.resize(2 * c, 0.0);
    scratch
        .par_chunks_mut(2 * c)
        .enumerate()
        .for_each(|(b, part)| {
            part.fill(0.0);
            let r0 = b * ROW_BLOCK;
            block(r0, ROW_BLOCK.min(rows - r0), part);
        });
    for part in scratch.chunks_exact(2 * c) {
        for (t, &p) in totals.iter_mut().zip(part) {
            *t += p as f64;
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
    tmp.resize(tmp.len().max(3 * c), 0.0);
    let (scale_shift, rest) = tmp.split_at_mut(2 * c);
    let shift = &mut rest[..c];
    shift.copy_from_slice(&x[..c]);
    let shift = &*shift;
    channel_sums2(rows, c, blocks, totals, |r0, n, part| {
        let (s, q) = part.split_at_mut(c);
        for row in x[r0 * c..(r0 + n) * c].chunks_exact(c) {
            for (((s, q), &v), &m) in s.iter_mut().zip(q.iter_mut()).zip(row).zip(shift) {
                let d = v - m;
                *s += d;
                *q += d * d;
            }
        }
    });
    let nf = rows as f64;
    for ch in 0..c {
        let m = totals[ch] / nf;
        let var = (totals[c + ch] / nf - m * m).max(0.0);
        saved.mean[ch] = (shift[ch] as f64 + m) as f32;
        saved.invstd[ch] = (1.0 / (var + eps as f64).sqrt()) as f32;
        saved.var_unbiased[ch] = (var * nf / (nf - 1.0).max(1.0)) as f32;
    }
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
        scale_shift,
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
    let tmp = &mut scratch.tmp;
    tmp.resize(tmp.len().max(3 * c), 0.0);
    let (scale_shift, inv) = tmp.split_at_mut(2 * c);
    for (i, v) in inv[..c].iter_mut().zip(running_var) {
        *i = 1.0 / (v + eps).sqrt();
    }
    normalize(
        rows,
        c,
        x,
        gamma,
        beta,
        running_mean,
        &inv[..c],
        act,
        y,
        scale_shift,
    );
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
                    *o = v * s + t;
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
    let (x, y) = (&x[..rows * c], &y[..rows * c]);
    let per = ROW_BLOCK * c;
    let BnScratch {
        blocks,
        totals,
        tmp,
    } = scratch;
    // Pass 1, in the same blocks as the sums: mask dy in place, then sum it and dy * xhat.
    blocks.resize(rows.div_ceil(ROW_BLOCK) * 2 * c, 0.0);
    dy[..rows * c]
        .par_chunks_mut(per)
        .zip(blocks.par_chunks_mut(2 * c))
        .enumerate()
        .for_each(|(b, (db, part))| {
            let r0 = b * ROW_BLOCK;
            let (xb, yb) = (&x[r0 * c..r0 * c + db.len()], &y[r0 * c..r0 * c + db.len()]);
            act.mask_grad(yb, db);
            let (sg, sb) = part.split_at_mut(c);
            sg.fill(0.0);
            sb.fill(0.0);
            for (xr, gr) in xb.chunks_exact(c).zip(db.chunks_exact(c)) {
                for ((((sg, sb), &xv), &g), (&m, &is)) in sg
                    .iter_mut()
                    .zip(sb.iter_mut())
                    .zip(xr)
                    .zip(gr)
                    .zip(mean.iter().zip(invstd))
                {
                    *sg += g * ((xv - m) * is);
                    *sb += g;
                }
            }
        });
    totals.clear();
    totals.resize(2 * c, 0.0);
    for part in blocks.chunks_exact(2 * c) {
        for (t, &p) in totals.iter_mut().zip(part) {
            *t += p as f64;
        }
    }
    let (dgamma, dbeta) = dgb.split_at_mut(c);
    for ch in 0..c {
        dgamma[ch] = totals[ch] as f32;
        dbeta[ch] = totals[c + ch] as f32;
    }
    let Some((dx, accumulate)) = dx else {
        return;
    };
    // dx = k * (g - dbeta/N - xhat * dgamma/N) = k*g - p*x + q with k = gamma * invstd,
    // p = k * invstd * dgamma / N, q = p * mean - k * dbeta / N.
    let nf = rows as f32;
    tmp.resize(tmp.len().max(3 * c), 0.0);
    let (k, rest) = tmp[..3 * c].split_at_mut(c);
    let (p, q) = rest.split_at_mut(c);
    for ch in 0..c {
        k[ch] = gamma[ch] * invstd[ch];
        p[ch] = k[ch] * invstd[ch] * dgamma[ch] / nf;
        q[ch] = p[ch] * mean[ch] - k[ch] * dbeta[ch] / nf;
    }
    let (k, p, q) = (&*k, &*p, &*q);
    let dy = &*dy;
    dx[..rows * c]
        .par_chunks_mut(per)
        .zip(x.par_chunks(per).zip(dy[..rows * c].par_chunks(per)))
        .for_each(|(db, (xb, gb))| {
            for ((dr, xr), gr) in db
                .chunks_exact_mut(c)
                .zip(xb.chunks_exact(c))
                .zip(gb.chunks_exact(c))
            {
                for (((((d, &xv), &g), &kv), &pv), &qv) in
                    dr.iter_mut().zip(xr).zip(gr).zip(k).zip(p).zip(q)
                {
                    let v = kv * g - pv * xv + qv;
                    *d = if accumulate { *d + v } else { v };
                }
            }
        });
}
