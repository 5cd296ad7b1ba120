//! `batch_norm`: normalisation per channel with batch statistics in training and running
//! statistics in evaluation (PyTorch's `BatchNorm2d`), activation fused.

use crate::backend::Act;
use crate::nn::layer::{Backward, Forward, Layer, Mode, TensorInfo};
use rand_chacha::ChaCha8Rng;

/// A batch-norm layer over `c` channels of `pixels` positions per sample.
pub struct BatchNorm {
    /// Channels.
    pub c: usize,
    /// Positions per sample (rows per sample of the NHWC matrix).
    pub pixels: usize,
    /// Running-statistics momentum.
    pub momentum: f32,
    /// Added to the variance.
    pub eps: f32,
    /// Fused activation.
    pub act: Act,
    /// This step's `[mean | invstd | unbiased var]`, for backward.
    saved: Vec<f32>,
}

impl BatchNorm {
    /// A layer with its saved-statistics buffer.
    pub fn new(c: usize, pixels: usize, momentum: f32, eps: f32, act: Act) -> Self {
        Self {
            c,
            pixels,
            momentum,
            eps,
            act,
            saved: vec![0.0; 3 * c],
        }
    }
}

impl Layer for BatchNorm {
    fn param_tensors(&self) -> Vec<TensorInfo> {
        vec![
            TensorInfo::plain("weight", 0, vec![self.c]),
            TensorInfo::plain("bias", self.c, vec![self.c]),
        ]
    }

    fn state_tensors(&self) -> Vec<TensorInfo> {
        vec![
            TensorInfo::plain("running_mean", 0, vec![self.c]),
            TensorInfo::plain("running_var", self.c, vec![self.c]),
            // PyTorch's int64 counter, kept as a float here (exact below 2^24 steps).
            TensorInfo::plain("num_batches_tracked", 2 * self.c, vec![]),
        ]
    }

    fn init(&self, params: &mut [f32], state: &mut [f32], _rng: &mut ChaCha8Rng) {
        let c = self.c;
        params[..c].fill(1.0);
        params[c..2 * c].fill(0.0);
        state[..c].fill(0.0);
        state[c..2 * c].fill(1.0);
        state[2 * c] = 0.0;
    }

    fn forward(&mut self, cx: Forward<'_>) {
        let (c, rows) = (self.c, cx.n * self.pixels);
        match cx.mode {
            Mode::Train(_) => {
                cx.k.batch_norm_forward_train(
                    rows,
                    c,
                    cx.inputs[0],
                    cx.params,
                    self.eps,
                    self.act,
                    cx.out,
                    &mut self.saved,
                );
                let m = self.momentum;
                let (rm, rest) = cx.state.split_at_mut(c);
                let (rv, nbt) = rest.split_at_mut(c);
                for ch in 0..c {
                    rm[ch] = (1.0 - m) * rm[ch] + m * self.saved[ch];
                    rv[ch] = (1.0 - m) * rv[ch] + m * self.saved[2 * c + ch];
                }
                nbt[0] += 1.0;
            }
            Mode::Eval => {
                cx.k.batch_norm_forward_eval(
                    rows,
                    c,
                    cx.inputs[0],
                    cx.params,
                    &cx.state[..2 * c],
                    self.eps,
                    self.act,
                    cx.out,
                );
            }
        }
    }

    fn backward(&mut self, cx: Backward<'_>) {
        let rows = cx.n * self.pixels;
        let dx = cx.dinputs[0].as_mut().map(|(d, acc)| (&mut **d, *acc));
        cx.k.batch_norm_backward(
            rows,
            self.c,
            cx.inputs[0],
            cx.out,
            cx.dout,
            cx.params,
            &self.saved,
            self.act,
            cx.dparams,
            dx,
        );
    }
}
