//! One model replica training on a fixed synthetic batch: the harness that `bench step` and
//! `dptrain profile` time. It runs the trainer's step (forward, block-wise backward with the
//! gradients copied out per block as the reducer does, in-place SGD) without data or comm.

use crate::models;
use crate::nn::{Net, Param};
use crate::optim::{Sgd, SgdConfig};
use candle_core::{Device, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// The input shape a model was defined for: 1x28x28 for lenet5, 3x32x32 otherwise.
pub fn reference_input(model: &str) -> [usize; 3] {
    if model == "lenet5" {
        [1, 28, 28]
    } else {
        [3, 32, 32]
    }
}

/// A replica with its optimizer, a random batch and gradient buffers.
pub struct SyntheticReplica {
    /// The network.
    pub net: Net,
    params: Vec<Param>,
    sgd: Sgd,
    x: Tensor,
    y: Tensor,
    block_params: Vec<Vec<usize>>,
    grads: Vec<Vec<f32>>,
}

/// When each phase of a step ended.
#[derive(Debug, Clone, Copy)]
pub struct StepMarks {
    /// Start of the step.
    pub start: Instant,
    /// Forward and loss done.
    pub forward: Instant,
    /// Backward (and gradient copies) done.
    pub backward: Instant,
    /// Update done.
    pub update: Instant,
}

impl SyntheticReplica {
    /// Builds `model` (10 classes, its reference input) with a random batch of `batch`. Call
    /// it inside the rayon pool it will run in: that pool's size is what candle is told.
    pub fn new(model: &str, batch: usize) -> Result<Self> {
        crate::ops::set_threads_per_worker(rayon::current_num_threads());
        let dev = Device::Cpu;
        let input = reference_input(model);
        let net = models::build(model, input, 10, 1, &dev)?;
        let params = net.params();
        let sgd = Sgd::new(
            SgdConfig {
                momentum: 0.9,
                weight_decay: 5e-4,
                nesterov: false,
            },
            &params,
        );
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let n = batch * input.iter().product::<usize>();
        let data: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let x = Tensor::from_vec(data, (batch, input[0], input[1], input[2]), &dev)?;
        let labels: Vec<u32> = (0..batch).map(|_| rng.gen_range(0..10u32)).collect();
        let y = Tensor::from_vec(labels, batch, &dev)?;
        let block_params = crate::parallel::BucketPlan::new(&net, 0, 0).block_params;
        let grads = params.iter().map(|p| vec![0.0; p.numel()]).collect();
        Ok(Self {
            net,
            params,
            sgd,
            x,
            y,
            block_params,
            grads,
        })
    }

    /// One training step; `on_forward(k)` runs as block k's forward ends, `on_backward(k)` as
    /// block k's backward (with its gradient copy) ends.
    pub fn step(
        &mut self,
        on_forward: impl FnMut(usize),
        mut on_backward: impl FnMut(usize),
    ) -> Result<StepMarks> {
        let start = Instant::now();
        let fp = self.net.forward_observed(&self.x, true, on_forward)?;
        let loss = candle_nn::loss::cross_entropy(fp.logits(), &self.y)?;
        loss.to_scalar::<f32>()?;
        let forward = Instant::now();
        let (params, grads, block_params) = (&self.params, &mut self.grads, &self.block_params);
        self.net.backward(&fp, &loss, |k, g| {
            for &p in &block_params[k] {
                if let Some(t) = g.get(params[p].var.as_tensor()) {
                    crate::ops::with_f32(t, "gradient", |v| {
                        grads[p].copy_from_slice(v);
                        Ok(())
                    })?;
                }
            }
            on_backward(k);
            Ok(())
        })?;
        let backward = Instant::now();
        let grads = &self.grads;
        self.sgd
            .step(&self.params, |p| grads[p].as_slice(), 0.01, 1.0)?;
        Ok(StepMarks {
            start,
            forward,
            backward,
            update: Instant::now(),
        })
    }
}
