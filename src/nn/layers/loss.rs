//! `softmax_cross_entropy`: the loss, a mean over the global batch (see
//! [`crate::nn::layer::StepInfo::global_batch`]).

use crate::nn::layer::{Backward, Forward, Layer};

/// Softmax cross-entropy over `k` classes.
pub struct SoftmaxCrossEntropy {
    /// Classes.
    pub k: usize,
    /// Label smoothing.
    pub smoothing: f32,
    /// Weight in the total loss.
    pub weight: f32,
    /// Whether this is the model's main head (its predictions are the accuracy).
    pub main: bool,
    probs: Vec<f32>,
    losses: Vec<f64>,
}

impl SoftmaxCrossEntropy {
    /// A loss for batches of up to `max_batch` samples.
    pub fn new(k: usize, smoothing: f32, weight: f32, main: bool, max_batch: usize) -> Self {
        Self {
            k,
            smoothing,
            weight,
            main,
            probs: vec![0.0; max_batch * k],
            losses: vec![0.0; max_batch],
        }
    }
}

impl Layer for SoftmaxCrossEntropy {
    fn forward(&mut self, cx: Forward<'_>) {
        let (sum, correct) = cx.k.softmax_xent_forward(
            cx.n,
            self.k,
            cx.inputs[0],
            cx.labels,
            self.smoothing,
            &mut self.probs,
            &mut self.losses,
        );
        cx.report.loss_sum += self.weight as f64 * sum;
        if self.main {
            cx.report.correct = correct;
        }
    }

    fn backward(&mut self, cx: Backward<'_>) {
        let scale = self.weight / cx.step.global_batch as f32;
        if let Some((dx, acc)) = cx.dinputs[0].as_mut() {
            cx.k.softmax_xent_backward(
                cx.n,
                self.k,
                &self.probs,
                cx.labels,
                self.smoothing,
                scale,
                dx,
                *acc,
            );
        }
    }
}
