//! im2col / col2im: the layout change that turns a convolution into one matrix product.
//!
//! For one sample (C, H, W) and a K x K kernel, `col` is a (C*K*K, OH*OW) row-major matrix:
//! row `(c*K + ki)*K + kj` holds, for every output position, the input pixel under kernel tap
//! (ki, kj) of channel c (zero where the tap falls in the padding).

/// Shape of one convolution, per sample.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvShape {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub oh: usize,
    pub ow: usize,
}

impl ConvShape {
    /// Rows of the column matrix (C*K*K).
    pub fn col_rows(&self) -> usize {
        self.c * self.k * self.k
    }
    /// Columns of the column matrix (OH*OW).
    pub fn col_cols(&self) -> usize {
        self.oh * self.ow
    }

    /// For output index `o` along one axis and tap `t`, the input index, if inside the image.
    #[inline]
    fn src(&self, o: usize, t: usize, len: usize) -> Option<usize> {
        let i = (o * self.stride + t) as isize - self.pad as isize;
        (i >= 0 && (i as usize) < len).then_some(i as usize)
    }

    /// Range of output positions along an axis whose tap `t` lands inside `0..len`.
    #[inline]
    fn valid_range(&self, t: usize, len: usize, out: usize) -> (usize, usize) {
        // o*stride + t - pad in [0, len)  <=>  o in [ceil((pad - t)/stride), ceil((len + pad - t)/stride))
        let lo_num = self.pad as isize - t as isize;
        let lo = if lo_num <= 0 {
            0
        } else {
            (lo_num as usize).div_ceil(self.stride)
        };
        let hi_num = len as isize + self.pad as isize - t as isize;
        let hi = if hi_num <= 0 {
            0
        } else {
            (hi_num as usize).div_ceil(self.stride)
        };
        (lo.min(out), hi.min(out).max(lo.min(out)))
    }
}

/// Fills `col` (len C*K*K*OH*OW) from one sample `x` (len C*H*W).
pub(crate) fn im2col(s: &ConvShape, x: &[f32], col: &mut [f32]) {
    im2col_ld(s, x, col, s.col_cols());
}

/// [`im2col`] into a wider matrix whose rows are `ld` elements apart: row `r` of this sample's
/// column matrix goes to `col[r * ld..r * ld + OH*OW]`. Lets several samples' column matrices
/// sit side by side, so that one GEMM with a longer inner dimension covers all of them.
pub(crate) fn im2col_ld(s: &ConvShape, x: &[f32], col: &mut [f32], ld: usize) {
    let p = s.col_cols();
    debug_assert!(ld >= p);
    for c in 0..s.c {
        let plane = &x[c * s.h * s.w..(c + 1) * s.h * s.w];
        for ki in 0..s.k {
            for kj in 0..s.k {
                let row = (c * s.k + ki) * s.k + kj;
                let dst = &mut col[row * ld..row * ld + p];
                let (x_lo, x_hi) = s.valid_range(kj, s.w, s.ow);
                if s.stride == 1 && s.ow == s.w {
                    shifted_copy(s, plane, dst, ki, kj, (x_lo, x_hi));
                    continue;
                }
                for oy in 0..s.oh {
                    let line = &mut dst[oy * s.ow..(oy + 1) * s.ow];
                    let Some(iy) = s.src(oy, ki, s.h) else {
                        line.fill(0.0);
                        continue;
                    };
                    line[..x_lo].fill(0.0);
                    line[x_hi..].fill(0.0);
                    let src_row = &plane[iy * s.w..(iy + 1) * s.w];
                    if s.stride == 1 {
                        let ix0 = x_lo + kj - s.pad;
                        line[x_lo..x_hi].copy_from_slice(&src_row[ix0..ix0 + (x_hi - x_lo)]);
                    } else {
                        for (ox, v) in line[x_lo..x_hi].iter_mut().enumerate() {
                            *v = src_row[(ox + x_lo) * s.stride + kj - s.pad];
                        }
                    }
                }
            }
        }
    }
}

/// One row of the column matrix, for stride 1 and an output as wide as the input ("same"
/// padding): the row is then the input plane shifted by (ki - pad, kj - pad), so it is one
/// contiguous copy, after which the few elements that wrapped around a line edge (and the rows
/// that fall in the padding) are zeroed. Per-line copies of 8-32 floats cost several times more.
fn shifted_copy(
    s: &ConvShape,
    plane: &[f32],
    dst: &mut [f32],
    ki: usize,
    kj: usize,
    (x_lo, x_hi): (usize, usize),
) {
    let ow = s.ow;
    let (y_lo, y_hi) = s.valid_range(ki, s.h, s.oh);
    dst[..y_lo * ow].fill(0.0);
    dst[y_hi * ow..].fill(0.0);
    if y_hi == y_lo || x_hi == x_lo {
        dst[y_lo * ow..y_hi * ow].fill(0.0);
        return;
    }
    // Output (oy, ox) reads input (oy + ki - pad, ox + kj - pad): with ow == w that is a constant
    // offset in the flat plane, from the first valid output to the last.
    let (d0, d1) = (y_lo * ow + x_lo, (y_hi - 1) * ow + x_hi);
    let s0 = (y_lo + ki - s.pad) * s.w + x_lo + kj - s.pad;
    dst[d0..d1].copy_from_slice(&plane[s0..s0 + (d1 - d0)]);
    for oy in y_lo..y_hi {
        let line = &mut dst[oy * ow..(oy + 1) * ow];
        line[..x_lo].fill(0.0);
        line[x_hi..].fill(0.0);
    }
}

/// Adds the column matrix `col` back into one sample's input gradient `dx` (len C*H*W), which
/// the caller has zeroed. The transpose of [`im2col`].
pub(crate) fn col2im_add(s: &ConvShape, col: &[f32], dx: &mut [f32]) {
    let p = s.col_cols();
    for c in 0..s.c {
        let plane = &mut dx[c * s.h * s.w..(c + 1) * s.h * s.w];
        for ki in 0..s.k {
            for kj in 0..s.k {
                let row = (c * s.k + ki) * s.k + kj;
                let src = &col[row * p..(row + 1) * p];
                let (x_lo, x_hi) = s.valid_range(kj, s.w, s.ow);
                for oy in 0..s.oh {
                    let Some(iy) = s.src(oy, ki, s.h) else {
                        continue;
                    };
                    let line = &src[oy * s.ow..(oy + 1) * s.ow];
                    let dst_row = &mut plane[iy * s.w..(iy + 1) * s.w];
                    for ox in x_lo..x_hi {
                        dst_row[ox * s.stride + kj - s.pad] += line[ox];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct definition of im2col, to check the fast one against.
    fn im2col_naive(s: &ConvShape, x: &[f32]) -> Vec<f32> {
        let p = s.col_cols();
        let mut col = vec![0.0; s.col_rows() * p];
        for c in 0..s.c {
            for ki in 0..s.k {
                for kj in 0..s.k {
                    let row = (c * s.k + ki) * s.k + kj;
                    for oy in 0..s.oh {
                        for ox in 0..s.ow {
                            let iy = (oy * s.stride + ki) as isize - s.pad as isize;
                            let ix = (ox * s.stride + kj) as isize - s.pad as isize;
                            if iy >= 0 && ix >= 0 && (iy as usize) < s.h && (ix as usize) < s.w {
                                col[row * p + oy * s.ow + ox] =
                                    x[(c * s.h + iy as usize) * s.w + ix as usize];
                            }
                        }
                    }
                }
            }
        }
        col
    }

    #[test]
    fn im2col_matches_definition_and_col2im_is_its_transpose() {
        for &(c, h, w, k, stride, pad) in &[
            (1, 5, 5, 3, 1, 0),
            (2, 7, 6, 3, 1, 1),
            (3, 8, 8, 3, 2, 1),
            (2, 9, 7, 5, 2, 2),
            (1, 4, 4, 1, 2, 0),
            (2, 3, 3, 3, 1, 2),
            // Stride 1 with an output as wide as the input: the shifted-copy path.
            (3, 6, 4, 5, 1, 2),
            (1, 1, 1, 3, 1, 1),
            (2, 2, 5, 3, 1, 1),
        ] {
            let oh = (h + 2 * pad - k) / stride + 1;
            let ow = (w + 2 * pad - k) / stride + 1;
            let s = ConvShape {
                c,
                h,
                w,
                k,
                stride,
                pad,
                oh,
                ow,
            };
            let x: Vec<f32> = (0..c * h * w).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut col = vec![f32::NAN; s.col_rows() * s.col_cols()];
            im2col(&s, &x, &mut col);
            assert_eq!(
                col,
                im2col_naive(&s, &x),
                "im2col {c}x{h}x{w} k{k} s{stride} p{pad}"
            );
            // <im2col(x), y> == <x, col2im(y)> for the adjoint.
            let y: Vec<f32> = (0..col.len()).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut dx = vec![0.0; x.len()];
            col2im_add(&s, &y, &mut dx);
            let lhs: f64 = col
                .iter()
                .zip(&y)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum();
            let rhs: f64 = x
                .iter()
                .zip(&dx)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum();
            assert!((lhs - rhs).abs() < 1e-3, "adjoint mismatch {lhs} vs {rhs}");
        }
    }
}
