//! `max_pool`, `avg_pool` and `global_avg_pool`.

use crate::backend::PoolGeom;
use crate::nn::layer::{Backward, Forward, Layer};

/// Max pooling; remembers where each maximum was.
pub struct MaxPool {
    /// Geometry.
    pub geom: PoolGeom,
    arg: Vec<u8>,
}

impl MaxPool {
    /// A max-pool layer for batches of up to `max_batch` samples.
    pub fn new(geom: PoolGeom, max_batch: usize) -> Self {
        Self {
            arg: vec![0; max_batch * geom.oh * geom.ow * geom.c],
            geom,
        }
    }
}

impl Layer for MaxPool {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.max_pool_forward(&self.geom, cx.n, cx.inputs[0], cx.out, &mut self.arg);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.max_pool_backward(&self.geom, cx.n, cx.dout, &self.arg, dx, *acc);
        }
    }
}

/// Average pooling.
pub struct AvgPool {
    /// Geometry.
    pub geom: PoolGeom,
    /// Whether padded positions count in the average (PyTorch's default: yes).
    pub include_pad: bool,
}

impl Layer for AvgPool {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.avg_pool_forward(&self.geom, cx.n, cx.inputs[0], cx.out, self.include_pad);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.avg_pool_backward(&self.geom, cx.n, cx.dout, dx, *acc, self.include_pad);
        }
    }
}

/// Global average pooling over `pixels` positions of `c` channels.
pub struct GlobalAvgPool {
    /// Positions.
    pub pixels: usize,
    /// Channels.
    pub c: usize,
}

impl Layer for GlobalAvgPool {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.global_avg_pool_forward(cx.n, self.pixels, self.c, cx.inputs[0], cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.global_avg_pool_backward(cx.n, self.pixels, self.c, cx.dout, dx, *acc);
        }
    }
}
