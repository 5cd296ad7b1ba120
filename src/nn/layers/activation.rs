//! `relu` and `relu6` on their own (when they cannot be fused into the layer before them).

use crate::backend::Act;
use crate::nn::layer::{Backward, Forward, Layer};

/// An activation layer.
pub struct Activation(pub Act);

impl Layer for Activation {
    fn forward(&mut self, cx: Forward<'_>) {
        cx.k.act_forward(self.0, cx.inputs[0], cx.out);
    }

    fn backward(&mut self, cx: Backward<'_>) {
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.act_backward(self.0, cx.out, cx.dout, dx, *acc);
        }
    }
}
