//! The reference backend: every kernel of [`Kernels`] as the plainest loops over PyTorch's
//! definitions (sums in f64, in sample order), obviously correct and slow. It shares nothing
//! with the CPU backend but the seam's vocabulary: the layouts, [`Act`], [`DropoutMask`]'s
//! rule, the geometries.

use dptrain::backend::{Act, ConvGeom, DropoutMask, Kernels, PoolGeom};

/// The reference kernels (no state: nothing is reused between calls).
pub struct Reference;

/// The activation's value at `v`.
fn act(a: Act, v: f32) -> f32 {
    match a {
        Act::None => v,
        Act::Relu => v.max(0.0),
        Act::Relu6 => v.clamp(0.0, 6.0),
    }
}

/// The activation's derivative, from its output `y` (0 at the kinks, as PyTorch).
fn act_grad(a: Act, y: f32) -> f32 {
    let passes = match a {
        Act::None => true,
        Act::Relu => y > 0.0,
        Act::Relu6 => y > 0.0 && y < 6.0,
    };
    if passes {
        1.0
    } else {
        0.0
    }
}

/// `dst = v` or `dst += v`.
fn put(dst: &mut f32, v: f32, acc: bool) {
    *dst = if acc { *dst + v } else { v };
}

/// Writes `vals` into `dst` (or adds them).
fn put_all(dst: &mut [f32], vals: &[f32], acc: bool) {
    for (d, &v) in dst.iter_mut().zip(vals) {
        put(d, v, acc);
    }
}

/// Input row and column under tap (`ki`, `kj`) of output pixel (`oy`, `ox`), if inside.
#[allow(clippy::too_many_arguments)]
fn tap(
    oy: usize,
    ox: usize,
    ki: usize,
    kj: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    hw: [usize; 2],
) -> Option<(usize, usize)> {
    let iy = (oy * stride[0] + ki * dil[0]) as isize - pad[0] as isize;
    let ix = (ox * stride[1] + kj * dil[1]) as isize - pad[1] as isize;
    let inside = iy >= 0 && ix >= 0 && (iy as usize) < hw[0] && (ix as usize) < hw[1];
    inside.then_some((iy as usize, ix as usize))
}

/// Calls `f(sample, output index, input index, weight index)` for every multiply of a
/// convolution (NHWC activations, HWIO weights, channel groups).
fn each_conv_term(g: &ConvGeom, n: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let (cg, og) = (g.c / g.groups, g.o / g.groups);
    for s in 0..n {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                for oc in 0..g.o {
                    let grp = oc / og;
                    let yi = ((s * g.oh + oy) * g.ow + ox) * g.o + oc;
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            let at = tap(
                                oy,
                                ox,
                                ki,
                                kj,
                                [g.sh, g.sw],
                                [g.ph, g.pw],
                                [g.dh, g.dw],
                                [g.h, g.w],
                            );
                            let Some((iy, ix)) = at else { continue };
                            for ci in 0..cg {
                                let xi = ((s * g.h + iy) * g.w + ix) * g.c + grp * cg + ci;
                                let wi = ((ki * g.kw + kj) * cg + ci) * g.o + oc;
                                f(s, yi, xi, wi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Elements a pooling window averages (PyTorch's rule: with `include_pad`, the window clipped
/// to the padded input; else the taps inside the input).
fn pool_count(g: &PoolGeom, oy: usize, ox: usize, include_pad: bool) -> f32 {
    if include_pad {
        let y0 = (oy * g.sh) as isize - g.ph as isize;
        let x0 = (ox * g.sw) as isize - g.pw as isize;
        let y1 = (y0 + g.kh as isize).min((g.h + g.ph) as isize);
        let x1 = (x0 + g.kw as isize).min((g.w + g.pw) as isize);
        return ((y1 - y0) * (x1 - x0)) as f32;
    }
    let inside = pool_taps(g, oy, ox).count();
    inside.max(1) as f32
}

/// The window position and input pixel of every tap of output pixel (`oy`, `ox`) inside the
/// input.
fn pool_taps(g: &PoolGeom, oy: usize, ox: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..g.kh).flat_map(move |ki| {
        (0..g.kw).filter_map(move |kj| {
            let at = tap(
                oy,
                ox,
                ki,
                kj,
                [g.sh, g.sw],
                [g.ph, g.pw],
                [1, 1],
                [g.h, g.w],
            );
            at.map(|(iy, ix)| (ki * g.kw + kj, iy * g.w + ix))
        })
    })
}

/// The smoothed target of class `j` for label `y` among `k`.
fn target(j: usize, y: u32, k: usize, smoothing: f32) -> f32 {
    let off = smoothing / k as f32;
    if j == y as usize {
        1.0 - smoothing + off
    } else {
        off
    }
}

impl Kernels for Reference {
    fn set_batch_chunk(&mut self, _samples: usize) {}
    // Plain loops, one algorithm: the reference every algorithm is checked against.
    fn set_conv_algo(&mut self, _algo: dptrain::backend::ConvAlgo) {}

    fn conv2d_forward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        a: Act,
        y: &mut [f32],
    ) {
        let mut sum = vec![0f64; n * g.oh * g.ow * g.o];
        each_conv_term(g, n, |_, yi, xi, wi| sum[yi] += x[xi] as f64 * w[wi] as f64);
        for (i, v) in sum.iter().enumerate() {
            let b = bias.map_or(0.0, |b| b[i % g.o] as f64);
            y[i] = act(a, (v + b) as f32);
        }
    }

    fn conv2d_backward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
        has_bias: bool,
        dx: Option<(&mut [f32], bool)>,
    ) {
        let wl = g.kh * g.kw * (g.c / g.groups) * g.o;
        let mut dw = vec![0f64; wl];
        let mut dxs = vec![0f64; n * g.h * g.w * g.c];
        each_conv_term(g, n, |_, yi, xi, wi| {
            dw[wi] += x[xi] as f64 * dy[yi] as f64;
            dxs[xi] += w[wi] as f64 * dy[yi] as f64;
        });
        for (d, v) in dwb.iter_mut().zip(&dw) {
            *d = *v as f32;
        }
        if has_bias {
            for oc in 0..g.o {
                let s: f64 = dy[..n * g.oh * g.ow * g.o]
                    .iter()
                    .skip(oc)
                    .step_by(g.o)
                    .map(|&v| v as f64)
                    .sum();
                dwb[wl + oc] = s as f32;
            }
        }
        if let Some((dx, acc)) = dx {
            let vals: Vec<f32> = dxs.iter().map(|&v| v as f32).collect();
            put_all(dx, &vals, acc);
        }
    }

    fn conv2d_input_grad(
        &mut self,
        g: &ConvGeom,
        n: usize,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        let mut dxs = vec![0f64; n * g.h * g.w * g.c];
        each_conv_term(g, n, |_, yi, xi, wi| {
            dxs[xi] += w[wi] as f64 * dy[yi] as f64
        });
        let vals: Vec<f32> = dxs.iter().map(|&v| v as f32).collect();
        put_all(dx, &vals, acc);
    }

    fn linear_forward(
        &mut self,
        n: usize,
        i: usize,
        o: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        a: Act,
        y: &mut [f32],
    ) {
        for s in 0..n {
            for oc in 0..o {
                let mut v = bias.map_or(0.0, |b| b[oc] as f64);
                for ic in 0..i {
                    v += x[s * i + ic] as f64 * w[oc * i + ic] as f64;
                }
                y[s * o + oc] = act(a, v as f32);
            }
        }
    }

    fn linear_backward(
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
        for oc in 0..o {
            for ic in 0..i {
                let v: f64 = (0..n)
                    .map(|s| dy[s * o + oc] as f64 * x[s * i + ic] as f64)
                    .sum();
                dwb[oc * i + ic] = v as f32;
            }
            if has_bias {
                dwb[o * i + oc] = (0..n).map(|s| dy[s * o + oc] as f64).sum::<f64>() as f32;
            }
        }
        if let Some((dx, acc)) = dx {
            for s in 0..n {
                for ic in 0..i {
                    let v: f64 = (0..o)
                        .map(|oc| dy[s * o + oc] as f64 * w[oc * i + ic] as f64)
                        .sum();
                    put(&mut dx[s * i + ic], v as f32, acc);
                }
            }
        }
    }

    fn batch_norm_forward_train(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        gamma_beta: &[f32],
        eps: f32,
        a: Act,
        y: &mut [f32],
        saved: &mut [f32],
    ) {
        let nf = rows as f64;
        for ch in 0..c {
            let col = || (0..rows).map(|r| x[r * c + ch] as f64);
            let mean = col().sum::<f64>() / nf;
            let var = col().map(|v| (v - mean) * (v - mean)).sum::<f64>() / nf;
            let invstd = 1.0 / (var + eps as f64).sqrt();
            saved[ch] = mean as f32;
            saved[c + ch] = invstd as f32;
            saved[2 * c + ch] = (var * nf / (nf - 1.0).max(1.0)) as f32;
            let (gamma, beta) = (gamma_beta[ch] as f64, gamma_beta[c + ch] as f64);
            for r in 0..rows {
                let xhat = (x[r * c + ch] as f64 - mean) * invstd;
                y[r * c + ch] = act(a, (xhat * gamma + beta) as f32);
            }
        }
    }

    fn batch_norm_forward_eval(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        gamma_beta: &[f32],
        running: &[f32],
        eps: f32,
        a: Act,
        y: &mut [f32],
    ) {
        for ch in 0..c {
            let (mean, var) = (running[ch] as f64, running[c + ch] as f64);
            let invstd = 1.0 / (var + eps as f64).sqrt();
            let (gamma, beta) = (gamma_beta[ch] as f64, gamma_beta[c + ch] as f64);
            for r in 0..rows {
                let xhat = (x[r * c + ch] as f64 - mean) * invstd;
                y[r * c + ch] = act(a, (xhat * gamma + beta) as f32);
            }
        }
    }

    fn batch_norm_backward(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        gamma_beta: &[f32],
        saved: &[f32],
        a: Act,
        dgb: &mut [f32],
        dx: Option<(&mut [f32], bool)>,
    ) {
        self.act_mask(a, &y[..rows * c], &mut dy[..rows * c]);
        let nf = rows as f64;
        let mut dx = dx;
        for ch in 0..c {
            let (mean, invstd) = (saved[ch] as f64, saved[c + ch] as f64);
            let xhat = |r: usize| (x[r * c + ch] as f64 - mean) * invstd;
            let g = |r: usize| dy[r * c + ch] as f64;
            let dgamma: f64 = (0..rows).map(|r| g(r) * xhat(r)).sum();
            let dbeta: f64 = (0..rows).map(g).sum();
            dgb[ch] = dgamma as f32;
            dgb[c + ch] = dbeta as f32;
            if let Some((dx, acc)) = dx.as_mut() {
                let k = gamma_beta[ch] as f64 * invstd / nf;
                for r in 0..rows {
                    let v = k * (nf * g(r) - dbeta - xhat(r) * dgamma);
                    put(&mut dx[r * c + ch], v as f32, *acc);
                }
            }
        }
    }

    fn max_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        arg: &mut [u8],
    ) {
        let (xl, yl) = (g.h * g.w * g.c, g.oh * g.ow * g.c);
        for s in 0..n {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    for ch in 0..g.c {
                        let o = s * yl + (oy * g.ow + ox) * g.c + ch;
                        let (mut best, mut at) = (f32::NEG_INFINITY, 0);
                        for (pos, px) in pool_taps(g, oy, ox) {
                            let v = x[s * xl + px * g.c + ch];
                            if v > best {
                                (best, at) = (v, pos);
                            }
                        }
                        y[o] = best;
                        arg[o] = at as u8;
                    }
                }
            }
        }
    }

    fn max_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        arg: &[u8],
        dx: &mut [f32],
        acc: bool,
    ) {
        let (xl, yl) = (g.h * g.w * g.c, g.oh * g.ow * g.c);
        let mut sum = vec![0f32; n * xl];
        for s in 0..n {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    for ch in 0..g.c {
                        let o = s * yl + (oy * g.ow + ox) * g.c + ch;
                        let (_, px) = pool_taps(g, oy, ox)
                            .find(|&(pos, _)| pos == arg[o] as usize)
                            .expect("the maximum is a tap inside the input");
                        sum[s * xl + px * g.c + ch] += dy[o];
                    }
                }
            }
        }
        put_all(dx, &sum, acc);
    }

    fn avg_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        include_pad: bool,
    ) {
        let (xl, yl) = (g.h * g.w * g.c, g.oh * g.ow * g.c);
        for s in 0..n {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let count = pool_count(g, oy, ox, include_pad) as f64;
                    for ch in 0..g.c {
                        let sum: f64 = pool_taps(g, oy, ox)
                            .map(|(_, px)| x[s * xl + px * g.c + ch] as f64)
                            .sum();
                        y[s * yl + (oy * g.ow + ox) * g.c + ch] = (sum / count) as f32;
                    }
                }
            }
        }
    }

    fn avg_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
        include_pad: bool,
    ) {
        let (xl, yl) = (g.h * g.w * g.c, g.oh * g.ow * g.c);
        let mut sum = vec![0f32; n * xl];
        for s in 0..n {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let count = pool_count(g, oy, ox, include_pad);
                    for ch in 0..g.c {
                        let d = dy[s * yl + (oy * g.ow + ox) * g.c + ch] / count;
                        for (_, px) in pool_taps(g, oy, ox) {
                            sum[s * xl + px * g.c + ch] += d;
                        }
                    }
                }
            }
        }
        put_all(dx, &sum, acc);
    }

    fn global_avg_pool_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
        for s in 0..n {
            for ch in 0..c {
                let sum: f64 = (0..p).map(|q| x[(s * p + q) * c + ch] as f64).sum();
                y[s * c + ch] = (sum / p as f64) as f32;
            }
        }
    }

    fn global_avg_pool_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        for s in 0..n {
            for q in 0..p {
                for ch in 0..c {
                    put(
                        &mut dx[(s * p + q) * c + ch],
                        dy[s * c + ch] / p as f32,
                        acc,
                    );
                }
            }
        }
    }

    fn act_forward(&mut self, a: Act, x: &[f32], y: &mut [f32]) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = act(a, v);
        }
    }

    fn act_backward(&mut self, a: Act, y: &[f32], dy: &[f32], dx: &mut [f32], acc: bool) {
        for ((d, &v), &g) in dx.iter_mut().zip(y).zip(dy) {
            put(d, g * act_grad(a, v), acc);
        }
    }

    fn act_mask(&mut self, a: Act, y: &[f32], dy: &mut [f32]) {
        for (d, &v) in dy.iter_mut().zip(y) {
            *d *= act_grad(a, v);
        }
    }

    fn add_forward(&mut self, a: Act, xs: &[&[f32]], y: &mut [f32]) {
        for (e, o) in y.iter_mut().enumerate() {
            *o = act(a, xs.iter().map(|x| x[e]).sum());
        }
    }

    fn copy_grad(&mut self, dy: &[f32], dx: &mut [f32], acc: bool) {
        put_all(dx, dy, acc);
    }

    fn dropout_forward(&mut self, m: DropoutMask, len: usize, x: &[f32], y: &mut [f32]) {
        self.dropout_backward(m, len, x, y, false);
    }

    fn dropout_backward(
        &mut self,
        m: DropoutMask,
        len: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        let t = m.threshold();
        for (i, (d, &v)) in dx.iter_mut().zip(dy).enumerate() {
            let (s, e) = ((i / len) as u64, (i % len) as u64);
            let kept = m.keeps(m.first_sample + s, e, t);
            put(d, if kept { v * m.scale() } else { 0.0 }, acc);
        }
    }

    fn concat_forward(&mut self, rows: usize, xs: &[&[f32]], widths: &[usize], y: &mut [f32]) {
        let c: usize = widths.iter().sum();
        for r in 0..rows {
            let mut off = 0;
            for (x, &w) in xs.iter().zip(widths) {
                for j in 0..w {
                    y[r * c + off + j] = x[r * w + j];
                }
                off += w;
            }
        }
    }

    fn concat_backward(
        &mut self,
        rows: usize,
        c: usize,
        off: usize,
        w: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        for r in 0..rows {
            for j in 0..w {
                put(&mut dx[r * w + j], dy[r * c + off + j], acc);
            }
        }
    }

    fn flatten_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
        for s in 0..n {
            for q in 0..p {
                for ch in 0..c {
                    y[s * p * c + ch * p + q] = x[s * p * c + q * c + ch];
                }
            }
        }
    }

    fn flatten_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        for s in 0..n {
            for q in 0..p {
                for ch in 0..c {
                    put(
                        &mut dx[s * p * c + q * c + ch],
                        dy[s * p * c + ch * p + q],
                        acc,
                    );
                }
            }
        }
    }

    fn nchw_to_nhwc(&mut self, n: usize, c: usize, p: usize, x: &[f32], y: &mut [f32]) {
        for s in 0..n {
            for ch in 0..c {
                for q in 0..p {
                    y[s * p * c + q * c + ch] = x[s * p * c + ch * p + q];
                }
            }
        }
    }

    fn softmax_xent_forward(
        &mut self,
        n: usize,
        k: usize,
        logits: &[f32],
        labels: &[u32],
        smoothing: f32,
        probs: &mut [f32],
        losses: &mut [f64],
    ) -> (f64, usize) {
        let mut correct = 0;
        for s in 0..n {
            let z = &logits[s * k..(s + 1) * k];
            let max = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = z.iter().map(|&v| (v as f64 - max).exp()).sum();
            let log_p = |j: usize| z[j] as f64 - max - sum.ln();
            for j in 0..k {
                probs[s * k + j] = log_p(j).exp() as f32;
            }
            losses[s] = -(0..k)
                .map(|j| target(j, labels[s], k, smoothing) as f64 * log_p(j))
                .sum::<f64>();
            let best = (0..k).fold(0, |b, j| if z[j] > z[b] { j } else { b });
            // A row holding a logit that is not a number predicts no class.
            let predicts = z[..k].iter().all(|v| v.is_finite());
            correct += (best == labels[s] as usize && predicts) as usize;
        }
        (losses[..n].iter().sum(), correct)
    }

    fn softmax_xent_backward(
        &mut self,
        n: usize,
        k: usize,
        probs: &[f32],
        labels: &[u32],
        smoothing: f32,
        scale: f32,
        dlogits: &mut [f32],
        acc: bool,
    ) {
        for s in 0..n {
            for j in 0..k {
                let g = (probs[s * k + j] - target(j, labels[s], k, smoothing)) * scale;
                put(&mut dlogits[s * k + j], g, acc);
            }
        }
    }
}
