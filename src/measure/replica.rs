//! One model replica training on a fixed synthetic batch: the harness that `bench step` and
//! `dptrain profile` time. It runs the trainer's step (forward, backward into gradient
//! buffers, in-place SGD) without data loading or communication.

use crate::model;
use crate::nn::{ExecDone, FlatGrads, Mode, Net, NetConfig, StepInfo};
use crate::optim::{Sgd, SgdConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Instant;

/// A replica with its optimizer, a random batch and gradient buffers.
pub struct SyntheticReplica {
    /// The network.
    pub net: Net,
    sgd: Sgd,
    grads: FlatGrads,
    x: Vec<f32>,
    y: Vec<u32>,
    batch: usize,
    step: u64,
}

/// When each phase of a step ended.
#[derive(Debug, Clone, Copy)]
pub struct StepMarks {
    /// Start of the step.
    pub start: Instant,
    /// Forward and loss done.
    pub forward: Instant,
    /// Backward done.
    pub backward: Instant,
    /// Update done.
    pub update: Instant,
}

impl SyntheticReplica {
    /// Builds `model` on its reference input with a random batch of `batch`. Runs on the
    /// rayon pool it is called in (that pool's threads are the worker's compute threads).
    pub fn new(model: &str, batch: usize) -> Result<Self, String> {
        let g = Arc::new(model::reference_graph(model)?);
        let input = g.input();
        let classes = g.classes as u32;
        let net = Net::new(
            g,
            NetConfig {
                max_batch: batch,
                seed: 1,
            },
        )
        .map_err(|e| e.to_string())?;
        let sgd = Sgd::new(
            SgdConfig {
                momentum: 0.9,
                weight_decay: 5e-4,
                nesterov: false,
            },
            net.params().len(),
        );
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let x = (0..batch * input.numel())
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let y = (0..batch).map(|_| rng.gen_range(0..classes)).collect();
        let grads = FlatGrads::for_net(&net);
        Ok(Self {
            net,
            sgd,
            grads,
            x,
            y,
            batch,
            step: 0,
        })
    }

    /// One training step; `on_forward(e)` runs as exec e's forward ends, `on_backward(e)` as
    /// its backward ends.
    pub fn step(
        &mut self,
        mut on_forward: impl FnMut(usize),
        mut on_backward: impl FnMut(ExecDone),
    ) -> StepMarks {
        let start = Instant::now();
        let info = StepInfo {
            seed: 1,
            step: self.step,
            first_sample: 0,
            global_batch: self.batch,
        };
        self.step += 1;
        self.net.forward_observed(
            &self.x,
            &self.y,
            self.batch,
            Mode::Train(info),
            &mut on_forward,
        );
        let forward = Instant::now();
        self.net
            .backward(&mut self.grads, &mut |d| {
                on_backward(d);
                Ok(())
            })
            .expect("a backward without a reducer cannot fail");
        let backward = Instant::now();
        let grads = &self.grads;
        let (params, blocks) = self.net.params_and_blocks();
        self.sgd.step(params, blocks, |b| grads.block(b), 0.01, 1.0);
        StepMarks {
            start,
            forward,
            backward,
            update: Instant::now(),
        }
    }
}
