//! Max-pooling as a candle custom op with a correct backward.
//!
//! The whole gradient of an output goes to the input element that was the maximum of its window
//! (the first one, in row-major order, on ties, as PyTorch does). Overlapping windows
//! (stride < kernel) add up. Each (sample, channel) plane is independent, so planes run in
//! parallel and the result does not depend on the thread count.

use super::{f32_slice, out_size, with_f32};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// The max-pool custom op. Build it through [`super::max_pool2d`].
#[derive(Debug, Clone, Copy)]
pub struct MaxPool2dOp {
    /// Window size (square).
    pub kernel: usize,
    /// Step between windows.
    pub stride: usize,
}

impl MaxPool2dOp {
    fn dims(&self, d: &[usize]) -> Result<(usize, usize, usize, usize, usize)> {
        let &[n, c, h, w] = d else {
            candle_core::bail!("max_pool2d: expected a 4-d input, got {d:?}");
        };
        let oh = out_size(h, self.kernel, self.stride, 0)?;
        let ow = out_size(w, self.kernel, self.stride, 0)?;
        Ok((n * c, h, w, oh, ow))
    }

    /// Index (within the plane) of the first maximum of window (oy, ox).
    #[inline]
    fn argmax(&self, plane: &[f32], w: usize, oy: usize, ox: usize) -> usize {
        let (y0, x0) = (oy * self.stride, ox * self.stride);
        let mut best = y0 * w + x0;
        let mut best_v = plane[best];
        for y in y0..y0 + self.kernel {
            for x in x0..x0 + self.kernel {
                let v = plane[y * w + x];
                // `!(v <= best_v)` also lets a NaN win, so NaNs propagate like PyTorch's.
                if v > best_v || (v.is_nan() && !best_v.is_nan()) {
                    best = y * w + x;
                    best_v = v;
                }
            }
        }
        best
    }
}

impl CustomOp1 for MaxPool2dOp {
    fn name(&self) -> &'static str {
        "dptrain-max-pool2d"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (planes, h, w, oh, ow) = self.dims(layout.dims())?;
        let x = f32_slice(storage, layout, "max_pool2d input")?;
        let mut out = vec![0f32; planes * oh * ow];
        out.par_chunks_mut(oh * ow).enumerate().for_each(|(pi, y)| {
            let plane = &x[pi * h * w..(pi + 1) * h * w];
            if self.kernel == 2 && self.stride == 2 {
                // The common case, without the generic window loop.
                for oy in 0..oh {
                    let (r0, r1) = (&plane[2 * oy * w..], &plane[(2 * oy + 1) * w..]);
                    for ox in 0..ow {
                        let i = 2 * ox;
                        y[oy * ow + ox] = r0[i].max(r0[i + 1]).max(r1[i].max(r1[i + 1]));
                    }
                }
            } else {
                for oy in 0..oh {
                    for ox in 0..ow {
                        y[oy * ow + ox] = plane[self.argmax(plane, w, oy, ox)];
                    }
                }
            }
        });
        let mut shape = layout.dims().to_vec();
        shape[2] = oh;
        shape[3] = ow;
        Ok((CpuStorage::F32(out), Shape::from(shape)))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (planes, h, w, oh, ow) = self.dims(arg.dims())?;
        let dx = with_f32(arg, "max_pool2d input", |x| {
            with_f32(grad, "max_pool2d output gradient", |g| {
                let mut dx = vec![0f32; planes * h * w];
                dx.par_chunks_mut(h * w).enumerate().for_each(|(pi, d)| {
                    let plane = &x[pi * h * w..(pi + 1) * h * w];
                    let gp = &g[pi * oh * ow..(pi + 1) * oh * ow];
                    for oy in 0..oh {
                        for ox in 0..ow {
                            d[self.argmax(plane, w, oy, ox)] += gp[oy * ow + ox];
                        }
                    }
                });
                Ok(dx)
            })
        })?;
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}
