//! `add` (the residual connection, with a following ReLU fused in) and `concat` (branches
//! joined along channels).

use crate::backend::Act;
use crate::nn::layer::{Backward, Forward, Layer};

/// Element-wise sum of the inputs.
pub struct Add {
    /// Fused activation.
    pub act: Act,
}

impl Layer for Add {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.add_forward(self.act, cx.inputs, cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        cx.k.act_mask(self.act, cx.out, cx.dout);
        for (dx, acc) in cx.dinputs.iter_mut().flatten() {
            cx.k.copy_grad(cx.dout, dx, *acc);
        }
    }
}

/// Concatenation along channels; `widths[i]` is input i's channel count.
pub struct Concat {
    /// Channels of each input.
    pub widths: Vec<usize>,
    /// Positions per sample.
    pub pixels: usize,
}

impl Layer for Concat {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.concat_forward(cx.n * self.pixels, cx.inputs, &self.widths, cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        let c: usize = self.widths.iter().sum();
        let mut off = 0;
        for (slot, &w) in cx.dinputs.iter_mut().zip(&self.widths) {
            if let Some((dx, acc)) = slot {
                cx.k.concat_backward(cx.n * self.pixels, c, off, w, cx.dout, dx, *acc);
            }
            off += w;
        }
    }
}
