//! `dropout`: zeroes elements with probability `p` in training (scaling the rest by
//! `1/(1-p)`); its mask is a pure function of (seed, step, sample position, element), so runs
//! are reproducible and independent of the worker and thread counts.

use crate::backend::DropoutMask;
use crate::nn::layer::{Backward, Forward, Layer, Mode, StepInfo};

/// A dropout layer over samples of `len` elements.
pub struct Dropout {
    /// Drop probability.
    pub p: f32,
    /// Elements per sample.
    pub len: usize,
}

impl Dropout {
    fn mask(&self, s: StepInfo) -> DropoutMask {
        DropoutMask {
            p: self.p,
            seed: s.seed,
            step: s.step,
            first_sample: s.first_sample,
        }
    }
}

impl Layer for Dropout {
    fn forward(&mut self, cx: Forward<'_>) {
        match cx.mode {
            Mode::Train(s) => {
                cx.k.dropout_forward(self.mask(s), self.len, cx.inputs[0], cx.out)
            }
            Mode::Eval => cx.k.copy_grad(cx.inputs[0], cx.out, false),
        }
    }

    fn backward(&mut self, cx: Backward<'_>) {
        let m = self.mask(cx.step);
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.dropout_backward(m, self.len, cx.dout, dx, *acc);
        }
    }
}
