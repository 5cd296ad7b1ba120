//! `dptrain bench step`: the median time of one training step (forward, block-wise backward,
//! SGD update) of a model on one worker, on synthetic data.

use super::median;
use crate::models;
use crate::nn::Param;
use crate::optim::{Sgd, SgdConfig};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// Per-phase medians of one step, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct StepBench {
    /// Whole step.
    pub step_ms: f64,
    /// Forward and loss.
    pub forward_ms: f64,
    /// Backward.
    pub backward_ms: f64,
    /// Update.
    pub update_ms: f64,
}

/// Times `steps` steps (after 3 warm-up steps) of `model` at `batch` on `threads` threads.
pub fn bench_step(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
) -> Result<StepBench, String> {
    let input = if model == "lenet5" {
        [1, 28, 28]
    } else {
        [3, 32, 32]
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> candle_core::Result<StepBench> {
        let dev = Device::Cpu;
        let net = models::build(model, input, 10, 1, &dev)?;
        let params: Vec<Param> = net.params();
        let mut sgd = Sgd::new(
            SgdConfig {
                momentum: 0.9,
                weight_decay: 5e-4,
                nesterov: false,
            },
            &params,
        );
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let n = batch * input.iter().product::<usize>();
        let x = Tensor::from_vec(
            (0..n)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect::<Vec<_>>(),
            (batch, input[0], input[1], input[2]),
            &dev,
        )?;
        let y = Tensor::from_vec(
            (0..batch)
                .map(|_| rng.gen_range(0..10u32))
                .collect::<Vec<_>>(),
            batch,
            &dev,
        )?;
        let block_params = crate::parallel::BucketPlan::new(&net, 0, 0).block_params;
        let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.numel()]).collect();
        let (mut step, mut fwd, mut bwd, mut upd) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..steps + 3 {
            let t0 = Instant::now();
            let fp = net.forward(&x, true)?;
            let loss = candle_nn::loss::cross_entropy(fp.logits(), &y)?;
            let t1 = Instant::now();
            net.backward(&fp, &loss, |k, g| {
                for &p in &block_params[k] {
                    if let Some(t) = g.get(params[p].var.as_tensor()) {
                        crate::ops::with_f32(t, "gradient", |v| {
                            grads[p].copy_from_slice(v);
                            Ok(())
                        })?;
                    }
                }
                Ok(())
            })?;
            let t2 = Instant::now();
            let refs: Vec<&[f32]> = grads.iter().map(|g| g.as_slice()).collect();
            sgd.step(&params, &refs, 0.01, 1.0)?;
            let t3 = Instant::now();
            if i >= 3 {
                step.push((t3 - t0).as_secs_f64() * 1e3);
                fwd.push((t1 - t0).as_secs_f64() * 1e3);
                bwd.push((t2 - t1).as_secs_f64() * 1e3);
                upd.push((t3 - t2).as_secs_f64() * 1e3);
            }
        }
        Ok(StepBench {
            step_ms: median(&mut step),
            forward_ms: median(&mut fwd),
            backward_ms: median(&mut bwd),
            update_ms: median(&mut upd),
        })
    })
    .map_err(|e| e.to_string())
}
