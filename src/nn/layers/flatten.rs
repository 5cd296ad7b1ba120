//! `flatten`: C x H x W to C*H*W in PyTorch's order (our activations are H x W x C), so the
//! weights of a following linear layer are PyTorch's.

use crate::nn::layer::{Backward, Forward, Layer};

/// Flatten of samples with `pixels` positions of `c` channels.
pub struct Flatten {
    /// Positions.
    pub pixels: usize,
    /// Channels.
    pub c: usize,
}

impl Layer for Flatten {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.flatten_forward(cx.n, self.pixels, self.c, cx.inputs[0], cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.flatten_backward(cx.n, self.pixels, self.c, cx.dout, dx, *acc);
        }
    }
}
