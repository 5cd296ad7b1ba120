//! 2-D convolution on NHWC activations with HWIO weights: im2col + our GEMM, and a direct
//! kernel for depthwise convolutions.
//!
//! Layouts: an activation is `[n, h, w, c]` (channels innermost), a weight `[kh, kw, c/groups,
//! o]` (TensorFlow's HWIO; checkpoints convert to PyTorch's OIHW). With channels innermost,
//! the rows of a convolution are output pixels across samples, `y[rows, o] = col[rows, kkc] x
//! W[kkc, o]`: one GEMM for any tile of pixels, so a 4x4-pixel layer multiplies with as long a
//! `m` as a 32x32 one, and the weights are packed once per layer call and reused by every tile.
//! A 1x1 stride-1 convolution multiplies the activation itself (no im2col).
//!
//! Forward: tiles of output rows in parallel; im2col of the tile into thread-local scratch;
//! the GEMM; bias and the fused activation while the tile is in cache. The tiling does not
//! change a bit (each output is one GEMM dot product, see `gemm`).
//!
//! Backward (the output gradient already masked by the fused activation):
//! - weight and bias gradient: per chunk of samples (`backend::sum_order`) `dW[kkc, o] = col^T
//!   x dY` (sub-blocks of `KC` rows accumulate exactly as one GEMM would), chunk partials added
//!   as the pairwise tree (`batch_sum`): bit-identical for any thread count and batch split;
//! - input gradient: for stride-1 convolutions whose output is as large as the input, a full
//!   convolution of dY with the flipped kernel (one GEMM per tile, no scatter); otherwise
//!   `dcol = dY x W^T` and col2im, one sample per task so every addition into an input pixel
//!   happens in a fixed order.
//!
//! Depthwise (groups == channels): a direct loop over taps vectorised along channels.

use super::batch_sum::TreeSum;
use super::gemm::{
    copy_short, gathers_rows, gemm, gemm_packed, gemm_packed_gathered, row_panel, zero_short,
    GatheredRows, MatRef, PackedB, KC, MIN_SEGMENT,
};
use super::scratch::{
    with_row_offsets, with_scratch as with_col, Reservation, COL_BUDGET, MAX_GATHERED_ROWS,
};
use super::winograd::{self, WinogradWorkspace};
use crate::backend::{Act, ConvAlgo, ConvGeom};
use rayon::prelude::*;

/// Writes the column matrix of output rows `r0..r0 + rows` (row `r` is pixel `r % P` of sample
/// `r / P`) for channel group `grp` into `col` (`rows x kkc`, row-major).
fn im2col(g: &ConvGeom, x: &[f32], grp: usize, r0: usize, rows: usize, col: &mut [f32]) {
    let (p, cg, kkc) = (g.pixels(), g.cg(), g.kkc());
    let c0 = grp * cg;
    // With one group and dilation 1, the taps of a kernel row read kw*c contiguous floats.
    let whole_rows = g.groups == 1 && g.dw == 1;
    let seg = g.kw * cg;
    let mut r = r0;
    let mut out = &mut col[..rows * kkc];
    // One output line (a sample's output row) at a time: the vertical tap checks are per
    // line, the horizontal ones per pixel, and nothing is divided per row.
    while r < r0 + rows {
        let (s, q) = (r / p, r % p);
        let (oy, ox0) = (q / g.ow, q % g.ow);
        let n = (g.ow - ox0).min(r0 + rows - r);
        let (line_cols, rest) = std::mem::take(&mut out).split_at_mut(n * kkc);
        out = rest;
        let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
        for ki in 0..g.kh {
            let iy = (oy * g.sh + ki * g.dh)
                .checked_sub(g.ph)
                .filter(|&y| y < g.h);
            let Some(iy) = iy else {
                for dst in line_cols.chunks_exact_mut(kkc) {
                    zero_short(&mut dst[ki * seg..(ki + 1) * seg]);
                }
                continue;
            };
            let row = &xs[iy * g.w * g.c..(iy + 1) * g.w * g.c];
            for (i, dst) in line_cols.chunks_exact_mut(kkc).enumerate() {
                let line = &mut dst[ki * seg..(ki + 1) * seg];
                let ix0 = ((ox0 + i) * g.sw) as isize - g.pw as isize;
                if whole_rows && ix0 >= 0 && ix0 as usize + g.kw <= g.w {
                    let s0 = ix0 as usize * g.c;
                    copy_short(line, &row[s0..s0 + seg]);
                    continue;
                }
                for kj in 0..g.kw {
                    let d = &mut line[kj * cg..(kj + 1) * cg];
                    let ix = ix0 + (kj * g.dw) as isize;
                    if ix >= 0 && (ix as usize) < g.w {
                        let s0 = ix as usize * g.c + c0;
                        copy_short(d, &row[s0..s0 + cg]);
                    } else {
                        zero_short(d);
                    }
                }
            }
        }
        r += n;
    }
}

/// Implicit im2col: instead of the column matrix of output rows `r0..r0 + rows` (see
/// [`im2col`]), the input rows those outputs read, zero-padded around, so that the GEMM reads
/// each column-matrix row in place ([`GatheredRows`]). Kernel row `ki` of output row `i` is the
/// `kw * c` floats at `row_base[i] + ki * seg_stride`: the padded input row it starts on holds
/// its taps contiguously (channels innermost). Each sample's lines in the tile get their own
/// block of padded rows, `(lines - 1) * sh + kh` of them, `seg_stride` floats each.
///
/// The sums are those of [`im2col`] + GEMM, in the same order: the same bits. It copies the
/// input about once where im2col copies it `kh * kw` times over (resnet18's 3x3 layers: the
/// column matrix was 12-14% of the forward). Groups of one and no dilation only (a tap row is
/// then contiguous), and segments of at least `MIN_SEGMENT` floats.
struct Gather {
    /// Floats of padded input rows.
    len: usize,
    /// Floats per padded row (the next kernel row's taps).
    seg_stride: usize,
}

impl Gather {
    /// The padded rows of a tile, if the implicit path applies and is smaller than the column
    /// matrix (`None`: build the column matrix).
    fn plan(g: &ConvGeom, r0: usize, rows: usize) -> Option<Gather> {
        let applies = g.groups == 1
            && g.dw == 1
            && g.dh == 1
            && g.kw * g.c >= MIN_SEGMENT
            && rows > 0
            && rows <= MAX_GATHERED_ROWS
            && gathers_rows();
        if !applies {
            return None;
        }
        let seg_stride = ((g.ow - 1) * g.sw + g.kw) * g.c;
        let mut len = 0;
        for_each_sample_lines(g, r0, rows, |_, oy_a, oy_b| {
            len += ((oy_b - oy_a) * g.sh + g.kh) * seg_stride;
        });
        (len <= rows * g.kkc()).then_some(Gather { len, seg_stride })
    }

    /// Writes the padded rows into `buf` (`self.len` floats) and each output row's offset into
    /// `row_base` (`rows` of them).
    fn fill<'a>(
        &self,
        g: &ConvGeom,
        x: &[f32],
        r0: usize,
        rows: usize,
        buf: &'a mut [f32],
        row_base: &'a mut [usize],
    ) -> GatheredRows<'a> {
        let (p, c, wp) = (g.pixels(), g.c, self.seg_stride);
        let buf = &mut buf[..self.len];
        let mut block = 0;
        for_each_sample_lines(g, r0, rows, |s, oy_a, oy_b| {
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            let padded_rows = (oy_b - oy_a) * g.sh + g.kh;
            // The padded row's columns: left padding, input columns, right padding (a stride
            // may leave the input's last columns unread).
            let left = g.pw.min(wp / c);
            let cols = g.w.min(wp / c - left);
            for y in 0..padded_rows {
                let dst = &mut buf[block + y * wp..block + (y + 1) * wp];
                let iy = (oy_a * g.sh + y).checked_sub(g.ph).filter(|&iy| iy < g.h);
                match iy {
                    Some(iy) => {
                        let (pad, rest) = dst.split_at_mut(left * c);
                        let (mid, right) = rest.split_at_mut(cols * c);
                        pad.fill(0.0);
                        mid.copy_from_slice(&xs[iy * g.w * c..(iy * g.w + cols) * c]);
                        right.fill(0.0);
                    }
                    None => dst.fill(0.0),
                }
            }
            // This sample's output rows in the tile, in order.
            let q_first = r0.saturating_sub(s * p);
            let q_last = (r0 + rows - s * p).min(p);
            for q in q_first..q_last {
                let (oy, ox) = (q / g.ow, q % g.ow);
                row_base[s * p + q - r0] = block + (oy - oy_a) * g.sh * wp + ox * g.sw * c;
            }
            block += padded_rows * wp;
        });
        GatheredRows {
            data: buf,
            row_base: &row_base[..rows],
            seg_len: g.kw * c,
            seg_stride: wp,
        }
    }
}

/// Calls `f(sample, first line, last line)` for each sample whose output rows meet
/// `r0..r0 + rows`, in order.
fn for_each_sample_lines(
    g: &ConvGeom,
    r0: usize,
    rows: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let p = g.pixels();
    let (first, last) = (r0, r0 + rows - 1);
    for s in first / p..=last / p {
        let q_a = first.max(s * p) - s * p;
        let q_b = last.min(s * p + p - 1) - s * p;
        f(s, q_a / g.ow, q_b / g.ow);
    }
}

/// `out[rows x n] = column matrix of rows r0.. x B` for group 0 of a convolution with one
/// group: implicit im2col where it applies ([`Gather`]), else [`im2col`] into scratch.
#[allow(clippy::too_many_arguments)]
fn conv_rows(
    g: &ConvGeom,
    x: &[f32],
    r0: usize,
    rows: usize,
    b: &PackedB,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    let (kkc, n) = (g.kkc(), g.og());
    match Gather::plan(g, r0, rows) {
        Some(gather) => with_col(gather.len, |buf| {
            with_row_offsets(rows, |row_base| {
                let a = gather.fill(g, x, r0, rows, buf, row_base);
                gemm_packed_gathered(rows, n, kkc, a, b, out, ldo, accumulate);
            })
        }),
        None => with_col(rows * kkc, |col| {
            im2col(g, x, 0, r0, rows, col);
            gemm_packed(
                rows,
                n,
                kkc,
                MatRef::rows(col, kkc),
                b,
                out,
                ldo,
                accumulate,
            );
        }),
    }
}

/// Adds the column matrix of one sample's rows `q0..q0 + rows` (pixels) for group `grp` back
/// into that sample's input gradient `dx` (the transpose of [`im2col`]).
fn col2im_add(g: &ConvGeom, col: &[f32], grp: usize, q0: usize, rows: usize, dx: &mut [f32]) {
    let (cg, kkc) = (g.cg(), g.kkc());
    let c0 = grp * cg;
    for (ri, src) in col[..rows * kkc].chunks_exact(kkc).enumerate() {
        let q = q0 + ri;
        let (oy, ox) = (q / g.ow, q % g.ow);
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                if let Some((iy, ix)) = g.src(oy, ox, ki, kj) {
                    let s = &src[(ki * g.kw + kj) * cg..(ki * g.kw + kj + 1) * cg];
                    let d = &mut dx[(iy * g.w + ix) * g.c + c0..][..cg];
                    for (a, b) in d.iter_mut().zip(s) {
                        *a += *b;
                    }
                }
            }
        }
    }
}

/// Reusable memory of a worker's convolutions: packed weights and the weight-gradient tree.
#[derive(Default)]
pub struct ConvWorkspace {
    packed: PackedB,
    tree: TreeSum,
    reserved: Reservation,
    /// Which algorithm the 3x3 stride-1 layers use.
    algo: ConvAlgo,
    winograd: WinogradWorkspace,
}

/// Rows per forward tile: enough to reuse the packed weights, few enough for the column
/// matrix to stay in cache, at least one tile per thread, and whole micro-kernel panels (a
/// tile of 341 rows ran 25 panels of 14 for 24.4 panels' work; 85 rows, 7 for 6.1).
fn tile_rows(rows: usize, kkc: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let panel = row_panel();
    let by_cache = (COL_BUDGET / kkc.max(1)).max(16);
    let by_cache = (by_cache / panel * panel).max(panel);
    let by_threads = rows.div_ceil(threads).next_multiple_of(panel);
    by_cache.min(by_threads).max(1)
}

impl ConvWorkspace {
    /// Grows every compute thread's scratch to `len` floats before a parallel loop (see
    /// [`Reservation::reserve`]).
    fn reserve_col(&mut self, len: usize) {
        self.reserved.reserve(len);
    }

    /// Sets the algorithm of the 3x3 stride-1 convolutions.
    pub fn set_algo(&mut self, algo: ConvAlgo) {
        self.algo = algo;
    }

    /// Sets the samples per chunk of the weight-gradient sums.
    pub fn set_chunk(&mut self, samples: usize) {
        self.tree.set_chunk(samples);
    }

    /// `y[n, oh, ow, o] = act(conv(x) + bias)`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        act: Act,
        y: &mut [f32],
    ) {
        let (y, x) = (&mut y[..n * g.out_len()], &x[..n * g.in_len()]);
        if g.depthwise() {
            depthwise_forward(g, n, x, w, y);
        } else if let Some(tile) = self.algo.tile_for(g) {
            self.winograd.forward(tile, g, n, x, w, y, false);
        } else {
            let (rows, kkc, og, o) = (n * g.pixels(), g.kkc(), g.og(), g.o);
            for grp in 0..g.groups {
                self.packed
                    .pack(MatRef::strided(&w[grp * og..], o, 1), kkc, og);
                let tr = tile_rows(rows, kkc);
                if !(g.pointwise() && g.groups == 1) {
                    self.reserve_col(tr * kkc);
                }
                let packed = &self.packed;
                y.par_chunks_mut(tr * o).enumerate().for_each(|(t, yt)| {
                    let r0 = t * tr;
                    let m = yt.len() / o;
                    let yt = &mut yt[grp * og..];
                    if g.pointwise() && g.groups == 1 {
                        let a = MatRef::rows(&x[r0 * g.c..], g.c);
                        gemm_packed(m, og, kkc, a, packed, yt, o, false);
                    } else if g.groups == 1 {
                        conv_rows(g, x, r0, m, packed, yt, o, false);
                    } else {
                        with_col(m * kkc, |col| {
                            im2col(g, x, grp, r0, m, col);
                            gemm_packed(m, og, kkc, MatRef::rows(col, kkc), packed, yt, o, false);
                        });
                    }
                });
            }
        }
        epilogue(y, g.o, bias, act);
    }

    /// Gradients of a convolution: `dwb` gets the weight gradient followed (if `has_bias`) by
    /// the bias gradient; `dx`, if given, gets the input gradient (added to it when
    /// `accumulate`). `dy` is the output gradient after the fused activation's mask.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
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
        let (x, dy) = (&x[..n * g.in_len()], &dy[..n * g.out_len()]);
        let wl = g.weight_len();
        debug_assert_eq!(dwb.len(), wl + if has_bias { g.o } else { 0 });
        if g.depthwise() {
            self.tree.sum_chunks(n, dwb, &|r, part| {
                depthwise_weight_grad(g, x, dy, r, part, has_bias)
            });
        } else if let Some(tile) = self.algo.weight_grad_tile(g) {
            self.winograd.reserve_weight_grad(tile, g);
            let (p, o) = (g.pixels(), g.o);
            self.tree.sum_chunks(n, dwb, &|r, part| {
                let (pw, pb) = part.split_at_mut(wl);
                winograd::weight_grad_chunk(tile, g, x, dy, r.clone(), pw);
                if has_bias {
                    column_sums(&dy[r.start * p * o..r.end * p * o], o, pb);
                }
            });
        } else {
            if !(g.pointwise() && g.groups == 1) {
                self.reserve_col(KC.min(n * g.pixels()) * g.kkc());
            }
            self.tree.sum_chunks(n, dwb, &|r, part| {
                weight_grad_chunk(g, x, dy, r, part, has_bias)
            });
        }
        if let Some((dx, acc)) = dx {
            self.input_grad(g, n, w, dy, dx, acc);
        }
    }

    /// The input gradient of a convolution alone (the same bits as [`Self::backward`]'s `dx`):
    /// into `dx`, added to it when `accumulate`.
    pub fn input_grad(
        &mut self,
        g: &ConvGeom,
        n: usize,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        accumulate: bool,
    ) {
        let (dy, dx) = (&dy[..n * g.out_len()], &mut dx[..n * g.in_len()]);
        if g.depthwise() {
            depthwise_input_grad(g, n, dy, w, dx, accumulate);
            return;
        }
        let winograd = self.algo.tile_for(g).filter(|_| g.dx_as_conv());
        if let Some(tile) = winograd {
            self.winograd.input_grad(tile, g, n, dy, w, dx, accumulate);
        } else if g.dx_as_conv() {
            self.input_grad_as_conv(g, n, dy, w, dx, accumulate);
        } else {
            self.input_grad_col2im(g, n, dy, w, dx, accumulate);
        }
    }

    /// dx as the convolution of dy with the flipped kernel (stride 1, same size).
    #[allow(clippy::too_many_arguments)]
    fn input_grad_as_conv(
        &mut self,
        g: &ConvGeom,
        n: usize,
        dy: &[f32],
        w: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        let f = g.flipped();
        let cg = g.cg();
        let fk = f.kkc(); // kh * kw * og
        for grp in 0..g.groups {
            let rows = n * f.pixels();
            let tr = tile_rows(rows, fk);
            self.reserve_col(tr * fk);
            pack_flipped(g, w, grp, &mut self.packed);
            let packed = &self.packed;
            dx.par_chunks_mut(tr * g.c)
                .enumerate()
                .for_each(|(t, dxt)| {
                    let r0 = t * tr;
                    let m = dxt.len() / g.c;
                    let dst = &mut dxt[grp * cg..];
                    if g.groups == 1 {
                        conv_rows(&f, dy, r0, m, packed, dst, g.c, acc);
                    } else {
                        with_col(m * fk, |col| {
                            im2col(&f, dy, grp, r0, m, col);
                            gemm_packed(m, cg, fk, MatRef::rows(col, fk), packed, dst, g.c, acc);
                        });
                    }
                });
        }
    }

    /// dx by `dcol = dy x W^T` and col2im, one sample per task.
    #[allow(clippy::too_many_arguments)]
    fn input_grad_col2im(
        &mut self,
        g: &ConvGeom,
        n: usize,
        dy: &[f32],
        w: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        let (og, kkc, p, o) = (g.og(), g.kkc(), g.pixels(), g.o);
        // Rows of dcol per pass: whole samples' pixels, in KC-sized blocks of the budget.
        let block = (COL_BUDGET / kkc.max(1)).clamp(1, p);
        self.reserve_col(block * kkc);
        if !acc {
            dx.par_chunks_mut(1 << 14).for_each(|d| d.fill(0.0));
        }
        for grp in 0..g.groups {
            // B = W^T for this group: element (o_local, r) = W[r, grp*og + o_local].
            self.packed
                .pack(MatRef::strided(&w[grp * og..], 1, o), og, kkc);
            let packed = &self.packed;
            dx.par_chunks_mut(g.in_len())
                .enumerate()
                .for_each(|(s, dxs)| {
                    let mut q0 = 0;
                    while q0 < p {
                        let m = block.min(p - q0);
                        with_col(m * kkc, |col| {
                            let a = MatRef::rows(&dy[(s * p + q0) * o + grp * og..], o);
                            gemm_packed(m, kkc, og, a, packed, col, kkc, false);
                            col2im_add(g, col, grp, q0, m, dxs);
                        });
                        q0 += m;
                    }
                });
        }
        let _ = n;
    }
}

/// Packs group `grp`'s flipped kernel, the B of the input gradient as a convolution:
/// `Wflip[(ki', kj', o), c] = W[(kh-1-ki', kw-1-kj', c), o]`, written straight into the packed
/// layout (a flipped copy packed afterwards was a second pass over the weights), rows in
/// parallel.
fn pack_flipped(g: &ConvGeom, w: &[f32], grp: usize, packed: &mut PackedB) {
    /// Values of a row gathered before each write.
    const RUN: usize = 64;
    let (cg, og) = (g.cg(), g.og());
    let rows = g.kh * g.kw * og;
    packed.shape_for_writing(rows, cg);
    let writer = packed.writer();
    (0..rows).into_par_iter().for_each(|r| {
        let (tap, oi) = (r / og, r % og);
        let src_tap = (g.kh - 1 - tap / g.kw) * g.kw + (g.kw - 1 - tap % g.kw);
        let column = &w[src_tap * cg * g.o + grp * og + oi..];
        let mut run = [0f32; RUN];
        for c0 in (0..cg).step_by(RUN) {
            let len = RUN.min(cg - c0);
            for (i, v) in run[..len].iter_mut().enumerate() {
                *v = column[(c0 + i) * g.o];
            }
            // SAFETY: row `r` is this task's alone.
            unsafe { writer.write(r, c0, &run[..len]) };
        }
    });
}

/// One chunk's weight (and bias) gradient: `part = [dW (kkc x o) | db (o)]`, overwritten.
fn weight_grad_chunk(
    g: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    samples: std::ops::Range<usize>,
    part: &mut [f32],
    has_bias: bool,
) {
    let (p, kkc, og, o) = (g.pixels(), g.kkc(), g.og(), g.o);
    let (r0, r1) = (samples.start * p, samples.end * p);
    let (pw, pb) = part.split_at_mut(g.weight_len());
    for grp in 0..g.groups {
        // Sub-blocks of KC rows: accumulating them gives the same bits as one GEMM over all
        // rows (the GEMM restarts its sums every KC values of k and adds them to C in order).
        let mut r = r0;
        while r < r1 {
            let m = KC.min(r1 - r);
            let b = MatRef::strided(&dy[r * o + grp * og..], o, 1);
            let c = &mut pw[grp * og..];
            if g.pointwise() && g.groups == 1 {
                let a = MatRef::strided(&x[r * g.c..], 1, g.c);
                gemm(kkc, og, m, a, b, c, o, r > r0);
            } else {
                with_col(m * kkc, |col| {
                    im2col(g, x, grp, r, m, col);
                    gemm(kkc, og, m, MatRef::strided(col, 1, kkc), b, c, o, r > r0);
                });
            }
            r += m;
        }
    }
    if has_bias {
        column_sums(&dy[r0 * o..r1 * o], o, pb);
    }
}

/// `out[j] = sum over rows of m[row, j]` (rows of `cols` floats), accumulated in f64.
pub(crate) fn column_sums(m: &[f32], cols: usize, out: &mut [f32]) {
    // Stack space for the common widths; wider matrices in blocks of 512 columns.
    let mut acc = [0f64; 512];
    for c0 in (0..cols).step_by(512) {
        let w = 512.min(cols - c0);
        acc[..w].fill(0.0);
        for row in m.chunks_exact(cols) {
            for (a, &v) in acc[..w].iter_mut().zip(&row[c0..c0 + w]) {
                *a += v as f64;
            }
        }
        for (o, a) in out[c0..c0 + w].iter_mut().zip(&acc[..w]) {
            *o = *a as f32;
        }
    }
}

/// Bias and activation on rows of `o` outputs, in place.
fn epilogue(y: &mut [f32], o: usize, bias: Option<&[f32]>, act: Act) {
    if bias.is_none() && act == Act::None {
        return;
    }
    let rows_per = (1 << 14) / o.max(1) + 1;
    y.par_chunks_mut(rows_per * o).for_each(|t| {
        for row in t.chunks_exact_mut(o) {
            if let Some(b) = bias {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            }
            act.apply(row);
        }
    });
}

// ---- depthwise ------------------------------------------------------------------------

/// Depthwise forward (no bias, no activation: the caller's epilogue adds them). With a channel
/// multiplier `m = o / c`, output channel `ci * m + j` reads input channel `ci`.
fn depthwise_forward(g: &ConvGeom, n: usize, x: &[f32], w: &[f32], y: &mut [f32]) {
    let (o, mult) = (g.o, g.o / g.c);
    let _ = n;
    y.par_chunks_mut(g.ow * o)
        .enumerate()
        .for_each(|(line, yl)| {
            let (s, oy) = (line / g.oh, line % g.oh);
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            yl.fill(0.0);
            for (ox, yp) in yl.chunks_exact_mut(o).enumerate() {
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        let Some((iy, ix)) = g.src(oy, ox, ki, kj) else {
                            continue;
                        };
                        let xp = &xs[(iy * g.w + ix) * g.c..][..g.c];
                        let wt = &w[(ki * g.kw + kj) * o..][..o];
                        if mult == 1 {
                            for ((yv, &xv), &wv) in yp.iter_mut().zip(xp).zip(wt) {
                                *yv += xv * wv;
                            }
                        } else {
                            for (oi, yv) in yp.iter_mut().enumerate() {
                                *yv += xp[oi / mult] * wt[oi];
                            }
                        }
                    }
                }
            }
        });
}

/// Depthwise weight (and bias) gradient of the samples in `r`, overwriting `part`.
fn depthwise_weight_grad(
    g: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    samples: std::ops::Range<usize>,
    part: &mut [f32],
    has_bias: bool,
) {
    let (o, mult) = (g.o, g.o / g.c);
    let (pw, pb) = part.split_at_mut(g.weight_len());
    pw.fill(0.0);
    for s in samples.clone() {
        let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
        let ds = &dy[s * g.out_len()..(s + 1) * g.out_len()];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                let d = &ds[(oy * g.ow + ox) * o..][..o];
                for ki in 0..g.kh {
                    for kj in 0..g.kw {
                        let Some((iy, ix)) = g.src(oy, ox, ki, kj) else {
                            continue;
                        };
                        let xp = &xs[(iy * g.w + ix) * g.c..][..g.c];
                        let wt = &mut pw[(ki * g.kw + kj) * o..][..o];
                        if mult == 1 {
                            for ((a, &xv), &dv) in wt.iter_mut().zip(xp).zip(d) {
                                *a += xv * dv;
                            }
                        } else {
                            for (oi, a) in wt.iter_mut().enumerate() {
                                *a += xp[oi / mult] * d[oi];
                            }
                        }
                    }
                }
            }
        }
    }
    if has_bias {
        let p = g.pixels();
        column_sums(&dy[samples.start * p * o..samples.end * p * o], o, pb);
    }
}

/// Depthwise input gradient, one sample per task (a fixed order of additions per pixel).
fn depthwise_input_grad(g: &ConvGeom, n: usize, dy: &[f32], w: &[f32], dx: &mut [f32], acc: bool) {
    let (o, mult) = (g.o, g.o / g.c);
    let _ = n;
    dx.par_chunks_mut(g.in_len())
        .enumerate()
        .for_each(|(s, dxs)| {
            if !acc {
                dxs.fill(0.0);
            }
            let ds = &dy[s * g.out_len()..(s + 1) * g.out_len()];
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let d = &ds[(oy * g.ow + ox) * o..][..o];
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            let Some((iy, ix)) = g.src(oy, ox, ki, kj) else {
                                continue;
                            };
                            let xp = &mut dxs[(iy * g.w + ix) * g.c..][..g.c];
                            let wt = &w[(ki * g.kw + kj) * o..][..o];
                            if mult == 1 {
                                for ((a, &dv), &wv) in xp.iter_mut().zip(d).zip(wt) {
                                    *a += dv * wv;
                                }
                            } else {
                                for (oi, (&dv, &wv)) in d.iter().zip(wt).enumerate() {
                                    xp[oi / mult] += dv * wv;
                                }
                            }
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn geom(c: usize, h: usize, w: usize, o: usize, k: usize, s: usize, p: usize) -> ConvGeom {
        ConvGeom {
            c,
            h,
            w,
            o,
            oh: (h + 2 * p - k) / s + 1,
            ow: (w + 2 * p - k) / s + 1,
            kh: k,
            kw: k,
            sh: s,
            sw: s,
            ph: p,
            pw: p,
            dh: 1,
            dw: 1,
            groups: 1,
        }
    }

    #[test]
    fn the_flipped_kernel_is_packed_as_the_flipped_copy_was() {
        // (c, o, kh, kw, groups): square and non-square kernels, two groups, a row count past
        // one packed block (3 x 3 x 64 = 576 > KC), channels not a multiple of the gathered
        // run (64) nor of a micro-panel.
        for (c, o, kh, kw, groups) in [
            (8, 8, 3, 3, 1),
            (70, 64, 3, 3, 1),
            (12, 10, 3, 5, 2),
            (40, 6, 1, 7, 1),
        ] {
            let mut g = geom(c, 9, 9, o, kh, 1, kh / 2);
            (g.kw, g.pw, g.groups) = (kw, kw / 2, groups);
            let (cg, og) = (g.cg(), g.og());
            let w = values(kh * kw * cg * o, 7);
            let a = values(5 * kh * kw * og, 8);
            for grp in 0..groups {
                // The flipped copy, as the input gradient built it before.
                let mut flip = vec![0.0; kh * kw * og * cg];
                for ki in 0..kh {
                    for kj in 0..kw {
                        let src_tap = (kh - 1 - ki) * kw + (kw - 1 - kj);
                        for oi in 0..og {
                            for ci in 0..cg {
                                flip[((ki * kw + kj) * og + oi) * cg + ci] =
                                    w[(src_tap * cg + ci) * o + grp * og + oi];
                            }
                        }
                    }
                }
                let (mut want, mut got) = (PackedB::default(), PackedB::default());
                want.pack(MatRef::rows(&flip, cg), kh * kw * og, cg);
                // Shaped for a larger matrix first: a buffer that is longer than its shape.
                got.pack(MatRef::rows(&w, o), kh * kw * cg, o);
                pack_flipped(&g, &w, grp, &mut got);
                let product = |b: &PackedB| {
                    let mut y = vec![f32::NAN; 5 * cg];
                    let k = kh * kw * og;
                    gemm_packed(5, cg, k, MatRef::rows(&a, k), b, &mut y, cg, false);
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                };
                assert_eq!(
                    product(&got),
                    product(&want),
                    "{c}->{o} {kh}x{kw} group {grp}"
                );
            }
        }
    }

    /// Values that make every product and partial sum round differently (no exact ties).
    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2654435761).max(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The rows `r0..r0 + rows` of the output by the column matrix, as before implicit im2col.
    fn explicit(g: &ConvGeom, x: &[f32], r0: usize, rows: usize, b: &PackedB) -> Vec<f32> {
        let mut col = vec![0.0; rows * g.kkc()];
        im2col(g, x, 0, r0, rows, &mut col);
        let mut y = vec![f32::NAN; rows * g.o];
        gemm_packed(
            rows,
            g.o,
            g.kkc(),
            MatRef::rows(&col, g.kkc()),
            b,
            &mut y,
            g.o,
            false,
        );
        y
    }

    #[test]
    fn implicit_im2col_gives_the_column_matrixs_bits() {
        // Where the micro-kernels cannot gather (the portable one), conv_rows builds the
        // column matrix itself, and the comparisons check that fallback.
        // (c, h, w, o, kernel, stride, padding, samples): odd sizes, sizes below the kernel's
        // reach with padding, strides, kernels of 1 (a 1x1 strided layer), 3, 5 and 7,
        // channel counts whose kernel rows cross KC blocks (kw * c: 96, 192, 384, 768, 1536).
        let cases = [
            (32, 8, 8, 16, 3, 1, 1, 2),
            (64, 9, 7, 32, 3, 1, 1, 3),
            (64, 16, 16, 64, 3, 2, 1, 2),
            (128, 5, 5, 40, 3, 1, 1, 2),
            (256, 4, 4, 64, 3, 1, 1, 3),
            (512, 3, 3, 33, 3, 2, 1, 2),
            (40, 11, 13, 24, 5, 1, 2, 1),
            (48, 12, 12, 16, 7, 2, 3, 1),
            (64, 6, 6, 16, 1, 2, 0, 2),
            (32, 2, 2, 8, 3, 1, 1, 4),
            (96, 7, 7, 16, 3, 3, 0, 2),
        ];
        for (i, &(c, h, w, o, k, s, p, n)) in cases.iter().enumerate() {
            let g = geom(c, h, w, o, k, s, p);
            let x = values(n * g.in_len(), i as u32 + 1);
            let wt = values(g.kkc() * o, i as u32 + 100);
            let mut b = PackedB::default();
            b.pack(MatRef::rows(&wt, o), g.kkc(), o);
            let total = n * g.pixels();
            // Whole, and tiles that start and end mid-line and mid-sample.
            for (r0, rows) in [
                (0, total),
                (1, total - 1),
                (total / 3, total / 2),
                (g.ow + 1, 5),
            ] {
                let rows = rows.min(total - r0);
                if rows == 0 {
                    continue;
                }
                let want = explicit(&g, &x, r0, rows, &b);
                let mut got = vec![f32::NAN; rows * o];
                conv_rows(&g, &x, r0, rows, &b, &mut got, o, false);
                let planned = Gather::plan(&g, r0, rows).is_some();
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "case {i} rows {r0}+{rows} (implicit: {planned}): bits differ"
                );
            }
        }
        // Non-square kernels, strides and paddings: 3 high x 1 wide (a 32-float row), and
        // 1 high x 5 wide with the stride and padding of each axis different.
        let tall = ConvGeom {
            kw: 1,
            pw: 0,
            ow: 9,
            ..geom(32, 9, 9, 8, 3, 1, 1)
        };
        let wide = ConvGeom {
            kh: 1,
            ph: 0,
            sh: 1,
            oh: 7,
            kw: 5,
            pw: 2,
            sw: 2,
            ow: 4,
            ..geom(16, 7, 7, 8, 3, 1, 1)
        };
        for (i, g) in [tall, wide].into_iter().enumerate() {
            let x = values(2 * g.in_len(), 50 + i as u32);
            let wt = values(g.kkc() * g.o, 60 + i as u32);
            let mut b = PackedB::default();
            b.pack(MatRef::rows(&wt, g.o), g.kkc(), g.o);
            let rows = 2 * g.pixels();
            let planned = Gather::plan(&g, 0, rows).is_some();
            assert_eq!(
                planned,
                gathers_rows(),
                "non-square {i}: implicit where it can be"
            );
            let want = explicit(&g, &x, 0, rows, &b);
            let mut got = vec![f32::NAN; rows * g.o];
            conv_rows(&g, &x, 0, rows, &b, &mut got, g.o, false);
            let same = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "non-square {i}: bits differ");
        }
        // The cases above take the implicit path where the kernels can gather.
        let g = geom(64, 16, 16, 64, 3, 1, 1);
        assert_eq!(Gather::plan(&g, 0, 256).is_some(), gathers_rows());
        // A kernel row shorter than MIN_SEGMENT builds the column matrix.
        assert!(Gather::plan(&geom(3, 16, 16, 8, 3, 1, 1), 0, 256).is_none());
    }

    #[test]
    fn implicit_im2col_accumulates_as_the_column_matrix_does() {
        let g = geom(64, 8, 8, 32, 3, 1, 1);
        let x = values(2 * g.in_len(), 7);
        let wt = values(g.kkc() * g.o, 8);
        let mut b = PackedB::default();
        b.pack(MatRef::rows(&wt, g.o), g.kkc(), g.o);
        let start = values(128 * g.o, 9);
        let mut col = vec![0.0; 128 * g.kkc()];
        im2col(&g, &x, 0, 0, 128, &mut col);
        let mut want = start.clone();
        gemm_packed(
            128,
            g.o,
            g.kkc(),
            MatRef::rows(&col, g.kkc()),
            &b,
            &mut want,
            g.o,
            true,
        );
        let mut got = start;
        conv_rows(&g, &x, 0, 128, &b, &mut got, g.o, true);
        assert!(want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
