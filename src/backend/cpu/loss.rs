//! Softmax cross-entropy with optional label smoothing (PyTorch's `cross_entropy(...,
//! label_smoothing=eps)`): the target is `(1 - eps) * onehot + eps / K`.

use rayon::prelude::*;

/// Forward over `n` rows of `k` logits: writes the softmax into `probs` and each row's loss
/// into `losses`, and returns the sum of the losses (added in row order, so the reported loss
/// does not depend on the thread count) and how many rows' largest logit is the label (of
/// rows that predict at all: [`crate::backend::predicts`]).
pub fn softmax_xent_forward(
    n: usize,
    k: usize,
    logits: &[f32],
    labels: &[u32],
    smoothing: f32,
    probs: &mut [f32],
    losses: &mut [f64],
) -> (f64, usize) {
    let correct = probs[..n * k]
        .par_chunks_mut(k)
        .zip(logits[..n * k].par_chunks(k))
        .zip(labels[..n].par_iter().zip(losses[..n].par_iter_mut()))
        .map(|((p, z), (&y, l))| {
            let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f64;
            for (pv, &zv) in p.iter_mut().zip(z) {
                let e = ((zv - max) as f64).exp();
                *pv = e as f32;
                sum += e;
            }
            let lse = max as f64 + sum.ln();
            let inv = (1.0 / sum) as f32;
            p.iter_mut().for_each(|v| *v *= inv);
            let y = y as usize;
            let nll = lse - z[y] as f64;
            let loss = if smoothing > 0.0 {
                let mean_z = z.iter().map(|&v| v as f64).sum::<f64>() / k as f64;
                (1.0 - smoothing as f64) * nll + smoothing as f64 * (lse - mean_z)
            } else {
                nll
            };
            *l = loss;
            (crate::backend::prediction::predicted(z) == Some(y)) as usize
        })
        .sum::<usize>();
    (losses[..n].iter().sum(), correct)
}

/// Backward: `dlogits (+)= (probs - target) * scale` (`scale` = loss weight / global batch).
/// The arguments are the [`crate::backend::Kernels`] method's, one to one.
#[allow(clippy::too_many_arguments)]
pub fn softmax_xent_backward(
    n: usize,
    k: usize,
    probs: &[f32],
    labels: &[u32],
    smoothing: f32,
    scale: f32,
    dlogits: &mut [f32],
    acc: bool,
) {
    let off = smoothing / k as f32;
    let on = 1.0 - smoothing + off;
    dlogits[..n * k]
        .par_chunks_mut(k)
        .zip(probs[..n * k].par_chunks(k))
        .zip(labels[..n].par_iter())
        .for_each(|((d, p), &y)| {
            for (j, (dv, &pv)) in d.iter_mut().zip(p).enumerate() {
                let t = if j == y as usize { on } else { off };
                let g = (pv - t) * scale;
                *dv = if acc { *dv + g } else { g };
            }
        });
}
