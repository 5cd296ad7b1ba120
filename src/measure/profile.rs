//! Profiles: per-block forward and backward times, gradient sizes and the update time of one
//! worker's step: the one file format (`dptrain profile` writes it; the simulator and the
//! emulated device, [`crate::testbed::device`], read it), and its measurement on this machine.
//! Profiles derived from a model's graph and a stated device speed are the simulator's
//! (`crate::sim::from_graph`).
//!
//! A block is the unit whose gradients become ready together. Measured profiles have the
//! training engine's blocks; profiles from a [`Graph`] have one block per node with parameters,
//! in topological order, so backward (which runs the blocks last first) produces them in reverse
//! topological order.

use super::median;
use super::replica::SyntheticReplica;
use crate::model::Graph;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Largest per-worker batch a profile is made for: far past any real per-worker batch, and
/// small enough that step times and byte counts stay in range of the simulator's arithmetic.
pub const MAX_PROFILE_BATCH: usize = 1 << 20;

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
    /// Per-worker batch the times are for (1..=[`MAX_PROFILE_BATCH`]).
    pub batch: usize,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Blocks in forward order.
    pub blocks: Vec<BlockProfile>,
    /// Optimizer update of all parameters, ms.
    pub update_ms: f64,
    /// Coefficient of variation of one worker's step compute (forward + backward + update)
    /// across the measured steps and replicas (robust: from the median absolute deviation):
    /// the spread stragglers are drawn from. Absent in
    /// profiles from FLOPs or images/s, and in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_spread: Option<f64>,
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

    /// Parameter sizes per block, summed per block, the input of [`crate::parallel::BucketPlan::new`].
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

/// One block (with zero times) per node with parameters, in topological order. MACs of nodes
/// without parameters (none in the graphs' accounting, which counts convolutions, linear layers
/// and batch norm, all with parameters) join the block before them, or the first block, so no
/// work is lost.
pub fn graph_blocks(graph: &Graph) -> Vec<BlockProfile> {
    let mut blocks: Vec<BlockProfile> = Vec::new();
    let mut pending = 0u64;
    for n in &graph.nodes {
        match blocks.last_mut() {
            _ if n.params > 0 => blocks.push(BlockProfile {
                name: n.name.clone(),
                forward_ms: 0.0,
                backward_ms: 0.0,
                param_sizes: vec![n.params],
                macs_per_sample: n.macs + std::mem::take(&mut pending),
            }),
            Some(b) => b.macs_per_sample += n.macs,
            None => pending += n.macs,
        }
    }
    blocks
}

/// The block each graph node's time belongs to: the last node with parameters at or before it
/// (the first block for nodes before any), matching [`graph_blocks`].
fn node_blocks(graph: &Graph) -> Vec<usize> {
    let mut count = 0usize;
    graph
        .nodes
        .iter()
        .map(|n| {
            if n.params > 0 {
                count += 1;
            }
            count.saturating_sub(1)
        })
        .collect()
}

/// Measures a profile of one of the training engine's models on this CPU: `steps` timed steps
/// after 3 warm-up steps at per-worker `batch` on `threads` compute threads; block times are
/// medians, and [`Profile::compute_spread`] is the spread of the per-step compute.
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
    let runs: Vec<Result<ReplicaTimings, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..concurrent)
            .map(|_| s.spawn(|| time_replica(model, batch, threads, steps)))
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
    let first = &runs[0];
    // Per block, the median over every (replica, step); per step, its compute total.
    let pool = |f: &dyn Fn(&StepTimes) -> f64| {
        median(
            &mut runs
                .iter()
                .flat_map(|r| r.steps.iter().map(f))
                .collect::<Vec<_>>(),
        )
    };
    let blocks = first
        .blocks
        .iter()
        .enumerate()
        .map(|(k, b)| BlockProfile {
            name: b.name.clone(),
            forward_ms: pool(&|t| t.forward_ms[k]),
            backward_ms: pool(&|t| t.backward_ms[k]),
            param_sizes: b.param_sizes.clone(),
            macs_per_sample: b.macs_per_sample,
        })
        .collect();
    let totals: Vec<f64> = runs
        .iter()
        .flat_map(|r| {
            r.steps.iter().map(|t| {
                t.forward_ms.iter().sum::<f64>() + t.backward_ms.iter().sum::<f64>() + t.update_ms
            })
        })
        .collect();
    // A robust coefficient of variation (1.4826 x the median absolute deviation over the
    // median: the standard deviation for a normal spread): on a shared machine a few steps
    // stall for tens of ms, and the plain standard deviation would say more about the
    // neighbours than about how workers differ.
    let mut totals = totals;
    let mid = median(&mut totals);
    let mut dev: Vec<f64> = totals.iter().map(|x| (x - mid).abs()).collect();
    let spread = if mid > 0.0 {
        1.4826 * median(&mut dev) / mid
    } else {
        0.0
    };
    Ok(Profile {
        model: model.to_string(),
        source: format!(
            "measured on this machine: {threads} thread(s), {concurrent} concurrent replica(s), median of {steps} steps"
        ),
        batch,
        input: first.input,
        blocks,
        update_ms: pool(&|t| t.update_ms),
        compute_spread: Some(spread),
    })
}

/// The parameter sizes of each block of one of the training engine's models (what a measured
/// profile's `param_sizes` will be): builds a replica at batch 1 (its 3 warm-up steps run).
pub fn blocks_of(model: &str) -> Result<Vec<Vec<usize>>, String> {
    Ok(time_replica(model, 1, 1, 0)?
        .blocks
        .into_iter()
        .map(|b| b.param_sizes)
        .collect())
}

/// One replica's measurement: its blocks (with zero times) and every timed step.
struct ReplicaTimings {
    input: [usize; 3],
    blocks: Vec<BlockProfile>,
    steps: Vec<StepTimes>,
}

/// One timed step, per block.
struct StepTimes {
    forward_ms: Vec<f64>,
    backward_ms: Vec<f64>,
    update_ms: f64,
}

/// **The engine seam of measured profiles**: builds one replica of `model` in the training
/// engine and times `steps` training steps (after 3 warm-up steps) block by block, on a pool of
/// `threads` compute threads. Everything else in this module works from what it returns.
///
/// Each block's forward ends where the engine reports it; its backward includes copying its
/// gradients out, as the trainer's reducer does in the backward callback.
fn time_replica(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
) -> Result<ReplicaTimings, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<ReplicaTimings, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        let graph = replica.net.graph();
        let blocks = graph_blocks(graph);
        let i = graph.input();
        let input = [i.c, i.h, i.w];
        // Each exec's time goes to the block its layer belongs to.
        let node_block = node_blocks(graph);
        let exec_block: Vec<usize> = replica.net.exec_nodes().map(|n| node_block[n]).collect();
        let (nb, ne) = (blocks.len(), exec_block.len());
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let (mut f_end, mut b_end) = (vec![None; ne], vec![None; ne]);
        let mut timed = Vec::with_capacity(steps);
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
            let (mut forward_ms, mut backward_ms) = (vec![0.0; nb], vec![0.0; nb]);
            let mut mark = m.start;
            for (e, end) in f_end.iter().enumerate() {
                let end = end.unwrap_or(mark);
                forward_ms[exec_block[e]] += ms(mark, end);
                mark = end;
            }
            // The loss belongs to the last block's forward, as in the trainer's forward phase.
            forward_ms[nb - 1] += ms(mark, m.forward);
            let mut mark = m.forward;
            for e in (0..ne).rev() {
                let Some(end) = b_end[e] else { continue };
                backward_ms[exec_block[e]] += ms(mark, end);
                mark = end;
            }
            timed.push(StepTimes {
                forward_ms,
                backward_ms,
                update_ms: ms(m.backward, m.update),
            });
        }
        Ok(ReplicaTimings {
            input,
            blocks,
            steps: timed,
        })
    })
}
