//! Profiles: per-block forward and backward times, gradient sizes and the update time of one
//! worker's step, measured on this machine or derived from FLOPs and a stated device speed.

use super::arch::Arch;
use crate::bench::median;
use crate::bench::replica::SyntheticReplica;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// One block of a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockProfile {
    /// Block name.
    pub name: String,
    /// Forward time of the block at the profile's batch, ms.
    pub forward_ms: f64,
    /// Backward time of the block (including copying its gradients out), ms.
    pub backward_ms: f64,
    /// Element count of each parameter (f32) of the block, in layer order.
    pub param_sizes: Vec<usize>,
    /// Forward multiply-accumulates of one sample.
    pub macs_per_sample: u64,
}

impl BlockProfile {
    /// Gradient bytes the block contributes (f32).
    pub fn grad_bytes(&self) -> usize {
        4 * self.param_sizes.iter().sum::<usize>()
    }
}

/// One worker's step, block by block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Model name.
    pub model: String,
    /// How the times were obtained (measured here, or the FLOPs assumptions).
    pub source: String,
    /// Per-worker batch the times are for.
    pub batch: usize,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Blocks in forward order.
    pub blocks: Vec<BlockProfile>,
    /// Optimizer update of all parameters, ms.
    pub update_ms: f64,
}

impl Profile {
    /// Sum of the forward times, ms.
    pub fn forward_ms(&self) -> f64 {
        self.blocks.iter().map(|b| b.forward_ms).sum()
    }

    /// Sum of the backward times, ms.
    pub fn backward_ms(&self) -> f64 {
        self.blocks.iter().map(|b| b.backward_ms).sum()
    }

    /// All gradient bytes.
    pub fn grad_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.grad_bytes()).sum()
    }

    /// Parameter sizes per block, the input of [`crate::parallel::BucketPlan::from_sizes`].
    pub fn block_sizes(&self) -> Vec<Vec<usize>> {
        self.blocks.iter().map(|b| b.param_sizes.clone()).collect()
    }

    /// The same per-block shape rescaled to these totals (ms). Used to check the communication
    /// and overlap model against a run on a shared machine, whose compute speed drifts between
    /// the profile and the run.
    pub fn rescaled(&self, forward_ms: f64, backward_ms: f64, update_ms: f64) -> Profile {
        let (f, b) = (self.forward_ms(), self.backward_ms());
        let mut p = self.clone();
        for blk in &mut p.blocks {
            blk.forward_ms *= if f > 0.0 { forward_ms / f } else { 0.0 };
            blk.backward_ms *= if b > 0.0 { backward_ms / b } else { 0.0 };
        }
        p.update_ms = update_ms;
        p.source = format!("{} (rescaled to the run's compute)", self.source);
        p
    }

    /// Writes the profile as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        crate::output::write_atomically(path, (text + "\n").as_bytes()).map_err(String::from)
    }

    /// Reads a profile written by [`Profile::save`].
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let p: Profile = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a profile: {e}", path.display()))?;
        if p.blocks.is_empty() {
            return Err(format!("{}: profile has no blocks", path.display()));
        }
        super::validate::profile(&p).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(p)
    }
}

/// The device a FLOPs-derived profile describes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// Peak throughput, TFLOPS.
    pub tflops: f64,
    /// Fraction of peak the model's kernels reach (0..1].
    pub efficiency: f64,
    /// Memory bandwidth in GB/s, for the (memory-bound) update.
    pub mem_gbs: f64,
}

/// Bytes of memory traffic per parameter in an SGD-with-momentum update: read weight, gradient
/// and momentum, write weight and momentum (f32 each).
const UPDATE_BYTES_PER_PARAM: f64 = 20.0;

/// A profile from FLOPs: forward of a block takes `2 * MACs * batch` FLOPs, backward twice that
/// (gradients with respect to inputs and to weights), at `tflops * efficiency`; the update is
/// memory-bound at `mem_gbs`.
pub fn from_flops(arch: &Arch, batch: usize, dev: DeviceSpec) -> Result<Profile, String> {
    if !(dev.tflops > 0.0 && dev.efficiency > 0.0 && dev.efficiency <= 1.0 && dev.mem_gbs > 0.0) {
        return Err("--device-tflops and --mem-gbs must be > 0, --efficiency in (0, 1]".into());
    }
    let flops_per_ms = dev.tflops * dev.efficiency * 1e12 / 1e3;
    let blocks = arch
        .blocks
        .iter()
        .map(|b| {
            let fwd = 2.0 * b.macs as f64 * batch as f64 / flops_per_ms;
            BlockProfile {
                name: b.name.clone(),
                forward_ms: fwd,
                backward_ms: 2.0 * fwd,
                param_sizes: b.param_sizes.clone(),
                macs_per_sample: b.macs,
            }
        })
        .collect();
    let update_ms = arch.params() as f64 * UPDATE_BYTES_PER_PARAM / (dev.mem_gbs * 1e9) * 1e3;
    Ok(Profile {
        model: arch.name.clone(),
        source: format!(
            "flops: {} TFLOPS x {} efficiency, {} GB/s memory",
            dev.tflops, dev.efficiency, dev.mem_gbs
        ),
        batch,
        input: arch.input,
        blocks,
        update_ms,
    })
}

/// Measures a profile of one of our models on this CPU: `steps` timed steps after 3 warm-up
/// steps at per-worker `batch` on `threads` compute threads; block times are medians.
///
/// With `concurrent` > 1, that many replicas run at once (each on its own `threads` threads) and
/// each block's time is the median over replicas too: N emulated workers share this machine's
/// cores and memory, so their compute is slower than one worker's alone, and a profile that
/// should predict an N-worker emulated run has to be measured under the same contention.
pub fn measure(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
    concurrent: usize,
) -> Result<Profile, String> {
    if batch == 0 || threads == 0 || steps == 0 || concurrent == 0 {
        return Err("batch, threads, steps and concurrent must be at least 1".into());
    }
    let arch = super::arch::describe(model)?;
    let runs: Vec<Result<Timings, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..concurrent)
            .map(|_| s.spawn(|| measure_one(model, batch, threads, steps)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("profiling thread panicked".into()))
            })
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let pick = |f: &dyn Fn(&Timings) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let blocks = arch
        .blocks
        .iter()
        .enumerate()
        .map(|(k, b)| BlockProfile {
            name: b.name.clone(),
            forward_ms: pick(&|t| t.forward_ms[k]),
            backward_ms: pick(&|t| t.backward_ms[k]),
            param_sizes: b.param_sizes.clone(),
            macs_per_sample: b.macs,
        })
        .collect();
    Ok(Profile {
        model: model.to_string(),
        source: format!(
            "measured on this machine: {threads} thread(s), {concurrent} concurrent replica(s), median of {steps} steps"
        ),
        batch,
        input: arch.input,
        blocks,
        update_ms: pick(&|t| t.update_ms),
    })
}

/// Median times of one replica.
struct Timings {
    forward_ms: Vec<f64>,
    backward_ms: Vec<f64>,
    update_ms: f64,
}

fn measure_one(model: &str, batch: usize, threads: usize, steps: usize) -> Result<Timings, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<Timings, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        // Each exec's time goes to the block (layer with parameters) its node belongs to.
        let seg = super::arch::segments(replica.net.graph());
        let nb = seg.iter().flatten().max().map_or(0, |m| m + 1);
        let exec_block: Vec<usize> = replica
            .net
            .exec_nodes()
            .map(|node| seg[node].unwrap_or(0))
            .collect();
        let ne = exec_block.len();
        let mut fwd: Vec<Vec<f64>> = vec![Vec::new(); nb];
        let mut bwd: Vec<Vec<f64>> = vec![Vec::new(); nb];
        let mut upd = Vec::new();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let (mut f_end, mut b_end) = (vec![None; ne], vec![None; ne]);
        for i in 0..steps + 3 {
            f_end.fill(None);
            b_end.fill(None);
            let m = replica.step(
                |e| f_end[e] = Some(Instant::now()),
                |e| b_end[e] = Some(Instant::now()),
            );
            if i < 3 {
                continue;
            }
            let (mut f, mut b) = (vec![0.0; nb], vec![0.0; nb]);
            let mut mark = m.start;
            for e in 0..ne {
                let end = f_end[e].unwrap_or(mark);
                f[exec_block[e]] += ms(mark, end);
                mark = end;
            }
            // The loss belongs to the last block's forward, as in the trainer's forward phase.
            f[nb - 1] += ms(mark, m.forward);
            let mut mark = m.forward;
            for e in (0..ne).rev() {
                let Some(end) = b_end[e] else { continue };
                b[exec_block[e]] += ms(mark, end);
                mark = end;
            }
            for k in 0..nb {
                fwd[k].push(f[k]);
                bwd[k].push(b[k]);
            }
            upd.push(ms(m.backward, m.update));
        }
        Ok(Timings {
            forward_ms: fwd.iter_mut().map(|v| median(v)).collect(),
            backward_ms: bwd.iter_mut().map(|v| median(v)).collect(),
            update_ms: median(&mut upd),
        })
    })
}
