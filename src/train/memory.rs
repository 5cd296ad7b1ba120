//! What a run checks before its run directory exists: that it fits in memory (the one estimate,
//! [`crate::plan::memory`]) and that an emulated device's profile is of this run. Both are
//! refusals a user fixes by changing a flag, so they come before anything is created or
//! allocated: a refused run leaves no directory behind.

use super::PrepareError;
use crate::comm::CommMode;
use crate::config::TrainConfig;
use crate::model::Graph;
use crate::parallel::BucketOp;
use crate::plan::memory::{estimate, MemoryEstimate, MemoryInputs};

/// The estimate of a training run of `graph` as `cfg` configures it, in this process.
pub fn run_estimate(cfg: &TrainConfig, graph: &Graph, loaded: f64) -> MemoryEstimate {
    let per_worker = cfg.batch / cfg.world().max(1);
    let mut inputs = MemoryInputs::training(graph, per_worker, cfg.workers, cfg.threads);
    // The pool of `workers x (prefetch + 1)` batch buffers, or one batch per worker collated
    // in its step.
    inputs.data_buffers = cfg.workers * (cfg.prefetch + 1);
    inputs.other_threads = cfg.loader_threads + cfg.workers;
    inputs.loaded = loaded;
    inputs.conv_algo = cfg.conv_algo;
    if cfg.world() > 1 {
        let lens: Vec<usize> = graph
            .nodes
            .iter()
            .filter(|n| n.params > 0)
            .map(|n| n.params)
            .collect();
        // The largest message is the weights (the first broadcast), at least a bucket.
        inputs.largest_message = lens.iter().sum();
        let planning = cfg.plan_inputs();
        let redundant = planning
            .bucket_ops(&planning.bucket_plan(&lens))
            .iter()
            .any(|op| {
                matches!(
                    op,
                    BucketOp::AllReduce(CommMode::Redundant) | BucketOp::Hierarchical { .. }
                )
            });
        // The redundant mode sends every bucket to every peer at once.
        let warm = crate::comm::transport::warm_messages(cfg.workers);
        inputs.messages_per_worker = if redundant {
            warm.max(cfg.workers - 1)
        } else {
            warm
        };
        if cfg.compress.powersgd_rank().is_some() {
            // At most every parameter: each worker's error feedback, and worker 0's copy of
            // every worker's for checkpoints (counted over this process's workers).
            let p = inputs.largest_message as f64;
            let per_worker = 4.0 * p * (1.0 + cfg.world() as f64 / cfg.workers.max(1) as f64);
            inputs.extra_per_worker = Some(("PowerSGD's error feedback", per_worker));
        }
    }
    estimate(&inputs)
}

/// Refuses a run that would not fit in the memory this process may take, naming the parts
/// and what to lower.
/// `loaded`: bytes of the data sets already in memory.
pub fn check_run_memory(cfg: &TrainConfig, graph: &Graph, loaded: f64) -> Result<(), PrepareError> {
    let what = format!(
        "training {} at {} samples per worker on {} worker(s) x {} thread(s)",
        graph.name,
        cfg.batch / cfg.world().max(1),
        cfg.workers,
        cfg.threads
    );
    let estimate = run_estimate(cfg, graph, loaded);
    tracing::debug!(
        "memory estimate: {:.0} MiB to take, {:.0} MiB at the peak ({})",
        estimate.total() / 1048576.0,
        estimate.peak() / 1048576.0,
        estimate.describe()
    );
    estimate.check(&what)?;
    Ok(())
}

/// Refuses an emulated device whose profile is of another model, per-worker batch or number
/// of parameter blocks than this run's (one block per layer with parameters, as `nn::Net`
/// lays them out).
pub fn check_device(cfg: &TrainConfig, graph: &Graph) -> Result<(), PrepareError> {
    let Some(device) = &cfg.device else {
        return Ok(());
    };
    let blocks = graph.nodes.iter().filter(|n| n.params > 0).count();
    device.check_fits(&cfg.model, cfg.batch / cfg.world().max(1), blocks)?;
    Ok(())
}

/// Bytes of pixels the run holds in memory: the training split when it is held whole, and the
/// test split, decoded or to be (allocations, not lengths: a `--train-limit` keeps the whole
/// split's buffer).
pub fn loaded_bytes(train: &crate::pipeline::Source, test: &crate::pipeline::TestSplit) -> f64 {
    let train = match train {
        crate::pipeline::Source::Memory(d) => d.pixels.capacity(),
        _ => 0,
    };
    (train + test.decoded_bytes()) as f64
}
