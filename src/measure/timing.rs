//! Measuring a profile on this machine: one replica of a model in the training engine, timed
//! block by block through the same callbacks where the trainer's reducer takes the gradients.

use super::profile::{graph_blocks, BlockProfile, Profile};
use super::{median, SyntheticReplica};
use crate::backend::ConvAlgo;
use crate::model::{reference_graph, Graph};
use std::time::Instant;

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

/// What [`measure`] measures: a model at a per-worker batch, on `threads` compute threads,
/// `steps` timed steps, `concurrent` replicas at once, its 3x3 convolutions by `conv_algo`.
#[derive(Debug, Clone, Copy)]
pub struct MeasureSpec<'a> {
    /// A built-in model's name or a model file.
    pub model: &'a str,
    /// Per-worker batch.
    pub batch: usize,
    /// Compute threads of each replica.
    pub threads: usize,
    /// Timed steps (after 3 warm-up steps).
    pub steps: usize,
    /// Replicas at once.
    pub concurrent: usize,
    /// How the 3x3 stride-1 convolutions are computed.
    pub conv_algo: ConvAlgo,
    /// The options of the command that set these counts, for its refusals.
    pub flags: MeasureFlags,
}

/// The options that set a [`MeasureSpec`]'s counts, named in what [`MeasureSpec::check`]
/// refuses: `dptrain profile`'s by default.
#[derive(Debug, Clone, Copy)]
pub struct MeasureFlags {
    /// Sets the compute threads of each replica.
    pub threads: &'static str,
    /// Sets the replicas at once (the workers, for a command that measures for N workers);
    /// `None` where the command has no such option (one replica).
    pub concurrent: Option<&'static str>,
    /// Whether the threads are the option's value capped at the cores (as a training run's
    /// worker runs them: [`crate::limits::threads_per_worker`]), said where it is refused.
    pub threads_capped: bool,
}

impl Default for MeasureFlags {
    /// `dptrain profile`'s.
    fn default() -> Self {
        Self {
            threads: "--threads",
            concurrent: Some("--concurrent"),
            threads_capped: false,
        }
    }
}

impl MeasureFlags {
    /// A command measuring one replica on `--threads`: `bench step`, `bench infer`.
    pub const THREADS_ONLY: Self = Self {
        threads: "--threads",
        concurrent: None,
        threads_capped: false,
    };

    /// A command measuring its workers at once, each on the threads a training run's worker
    /// runs: `bench ablation`, `bench sim-check` (`workers`: the option that sets them).
    pub const fn workers(workers: &'static str) -> Self {
        Self {
            threads: "--threads",
            concurrent: Some(workers),
            threads_capped: true,
        }
    }
}

/// Compute threads per core a measurement runs at most, over all its replicas. Far past the
/// cores it measures the scheduler's time-slicing, each thread holds buffers of its own
/// (`bench infer` of lenet5 took about 3 MB a thread: 2.8 GB at 1000 threads), and the
/// process can start only so many (`bench step --threads 100000` failed to start them and
/// aborted).
pub const MAX_THREADS_PER_CORE: usize = 16;

impl<'a> MeasureSpec<'a> {
    /// `model` at `batch` on `threads` threads for `steps` steps, one replica, direct
    /// convolutions.
    pub fn new(model: &'a str, batch: usize, threads: usize, steps: usize) -> Self {
        Self {
            model,
            batch,
            threads,
            steps,
            concurrent: 1,
            conv_algo: ConvAlgo::default(),
            flags: MeasureFlags::default(),
        }
    }

    /// Refuses what [`measure`] cannot measure, naming the option to change: a count of 0,
    /// more compute threads in all than [`MAX_THREADS_PER_CORE`] per core, or a step whose
    /// replicas would not fit in this machine's memory (the one estimate of
    /// [`crate::plan::memory`], each replica a worker on its threads). [`measure`] checks it
    /// first; a command measuring several specs checks them all before the first.
    pub fn check(&self) -> Result<(), String> {
        let flags = self.flags;
        let zero = [
            ("--batch", self.batch),
            (flags.threads, self.threads),
            ("--steps", self.steps),
            (flags.concurrent.unwrap_or("replicas"), self.concurrent),
        ]
        .into_iter()
        .find(|&(_, n)| n == 0);
        if let Some((flag, _)) = zero {
            return Err(format!("{flag} 0: give at least 1"));
        }
        let cores = crate::limits::cores();
        let most = MAX_THREADS_PER_CORE * cores;
        let all = self.threads.saturating_mul(self.concurrent);
        if all > most {
            let (threads, concurrent) = (self.threads, self.concurrent);
            let count = if concurrent > 1 {
                let given = flags
                    .concurrent
                    .map_or(String::new(), |f| format!(" ({f})"));
                let capped = if flags.threads_capped {
                    " capped at the cores"
                } else {
                    ""
                };
                format!(
                    "{threads} compute threads ({}{capped}) x {concurrent} replicas{given}",
                    flags.threads
                )
            } else {
                format!("{} {threads}", flags.threads)
            };
            return Err(format!(
                "{count}: at most {most} compute threads in all ({MAX_THREADS_PER_CORE} per \
                 core of the {cores} this process may use): far past the cores a measurement \
                 times the scheduler's time-slicing, and each thread holds buffers of its own"
            ));
        }
        let g = reference_graph(self.model)?;
        let mut inputs = crate::plan::memory::MemoryInputs::training(
            &g,
            self.batch,
            self.concurrent,
            self.threads,
        );
        inputs.conv_algo = self.conv_algo;
        inputs.workers_flag = flags.concurrent;
        let replicas = if self.concurrent > 1 {
            format!(" on {} replicas", self.concurrent)
        } else {
            String::new()
        };
        crate::plan::memory::estimate(&inputs)
            .check(&format!(
                "a {} step at batch {}{replicas}",
                self.model, self.batch
            ))
            .map_err(|e| e.to_string())
    }
}

/// Measures a profile of one of the training engine's models on this CPU: `steps` timed steps
/// after 3 warm-up steps at per-worker `batch` on `threads` compute threads; block times are
/// medians, and [`Profile::compute_spread`] is the spread of the per-step compute.
///
/// With `concurrent` > 1, that many replicas run at once (each on its own `threads` threads) and
/// each block's time is the median over replicas too: N emulated workers share this machine's
/// cores and memory, so their compute is slower than one worker's alone, and a profile that
/// should predict an N-worker emulated run has to be measured under the same contention.
pub fn measure(spec: &MeasureSpec) -> Result<Profile, String> {
    spec.check()?;
    let &MeasureSpec {
        model,
        batch,
        threads,
        steps,
        concurrent,
        conv_algo,
        ..
    } = spec;
    let runs: Vec<Result<ReplicaTimings, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..concurrent)
            .map(|_| s.spawn(|| time_replica(spec)))
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
    // The input gradient's median, for a block written before it in every step.
    let input_grad = |k: usize| {
        let mut parts: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.steps.iter())
            .map(|t| t.input_grad_ms[k])
            .collect::<Option<Vec<f64>>>()?;
        Some(median(&mut parts))
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
            matrices: b.matrices.clone(),
            input_grad_ms: input_grad(k),
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
            "measured on this machine: {threads} thread(s), {concurrent} concurrent replica(s), median of {steps} steps, {conv_algo} convolutions"
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
    Ok(time_replica(&MeasureSpec::new(model, 1, 1, 0))?
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
    /// Per block, its layer's input gradient after the block was written, if it split.
    input_grad_ms: Vec<Option<f64>>,
    update_ms: f64,
}

/// **The engine seam of measured profiles**: builds one replica of `model` in the training
/// engine and times `steps` training steps (after 3 warm-up steps) block by block, on a pool of
/// `threads` compute threads. Everything else in this module works from what it returns.
///
/// Each block's forward ends where the engine reports it; its backward includes copying its
/// gradients out, as the trainer's reducer does in the backward callback.
fn time_replica(spec: &MeasureSpec) -> Result<ReplicaTimings, String> {
    let &MeasureSpec {
        model,
        batch,
        threads,
        steps,
        ..
    } = spec;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<ReplicaTimings, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        replica.net.set_conv_algo(spec.conv_algo);
        let graph = replica.net.graph();
        let blocks = graph_blocks(graph);
        let i = graph.input();
        let input = [i.c, i.h, i.w];
        // Each exec's time goes to the block its layer belongs to.
        let node_block = node_blocks(graph);
        let exec_block: Vec<usize> = replica.net.exec_nodes().map(|n| node_block[n]).collect();
        let (nb, ne) = (blocks.len(), exec_block.len());
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let mut f_end = vec![None; ne];
        // Backward's reports in the order they came: (exec, when); an exec that splits its
        // backward reports twice, the second time after its input gradient.
        let mut b_end: Vec<(usize, Instant)> = Vec::with_capacity(ne + 1);
        let mut timed = Vec::with_capacity(steps);
        for i in 0..steps + 3 {
            f_end.fill(None);
            b_end.clear();
            let m = replica.step(
                |e| f_end[e] = Some(Instant::now()),
                |d| b_end.push((d.exec, Instant::now())),
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
            let mut input_grad_ms = vec![None; nb];
            for (k, &(e, end)) in b_end.iter().enumerate() {
                backward_ms[exec_block[e]] += ms(mark, end);
                if k > 0 && b_end[k - 1].0 == e {
                    input_grad_ms[exec_block[e]] = Some(ms(mark, end));
                }
                mark = end;
            }
            timed.push(StepTimes {
                forward_ms,
                backward_ms,
                input_grad_ms,
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
