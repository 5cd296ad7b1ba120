//! `linear`: a fully connected layer (PyTorch's `[out, in]` weight), activation fused.

use super::init_uniform;
use crate::backend::Act;
use crate::nn::layer::{Backward, Forward, Layer, TensorInfo};
use rand_chacha::ChaCha8Rng;

/// A fully connected layer.
pub struct Linear {
    /// Inputs.
    pub i: usize,
    /// Outputs.
    pub o: usize,
    /// Whether it has a bias.
    pub bias: bool,
    /// Fused activation.
    pub act: Act,
}

impl Layer for Linear {
    fn param_tensors(&self) -> Vec<TensorInfo> {
        let mut t = vec![TensorInfo::plain("weight", 0, vec![self.o, self.i])];
        if self.bias {
            t.push(TensorInfo::plain("bias", self.o * self.i, vec![self.o]));
        }
        t
    }

    fn init(&self, params: &mut [f32], _state: &mut [f32], rng: &mut ChaCha8Rng) {
        init_uniform(&self.param_tensors(), params, self.i, rng);
    }

    fn forward(&mut self, cx: Forward<'_>) {
        let (w, b) = cx.params.split_at(self.o * self.i);
        let bias = self.bias.then_some(b);
        cx.k.linear_forward(
            cx.n,
            self.i,
            self.o,
            cx.inputs[0],
            w,
            bias,
            self.act,
            cx.out,
        );
    }

    fn backward(&mut self, cx: Backward<'_>) {
        cx.k.act_mask(self.act, cx.out, cx.dout);
        let w = &cx.params[..self.o * self.i];
        let dx = cx.dinputs[0].as_mut().map(|(d, acc)| (&mut **d, *acc));
        cx.k.linear_backward(
            cx.n,
            self.i,
            self.o,
            cx.inputs[0],
            w,
            cx.dout,
            cx.dparams,
            self.bias,
            dx,
        );
    }
}
