//! `dptrain bench step`: the median time of one training step (forward, backward, SGD
//! update) of a model on one worker, on synthetic data.

use super::median;
use crate::measure::SyntheticReplica;
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
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<StepBench, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        let (mut step, mut fwd, mut bwd, mut upd) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        for i in 0..steps + 3 {
            let m = replica.step(|_| {}, |_| {});
            if i >= 3 {
                step.push(ms(m.start, m.update));
                fwd.push(ms(m.start, m.forward));
                bwd.push(ms(m.forward, m.backward));
                upd.push(ms(m.backward, m.update));
            }
        }
        Ok(StepBench {
            step_ms: median(&mut step),
            forward_ms: median(&mut fwd),
            backward_ms: median(&mut bwd),
            update_ms: median(&mut upd),
        })
    })
}
