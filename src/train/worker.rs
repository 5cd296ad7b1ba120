//! One worker: a model replica that trains on its shard of every global batch.
//!
//! The whole step lives in [`Worker::step`]: batch, forward, block-wise backward feeding the
//! reducer, the wait for the last bucket, the update. Every phase is timed.

use super::fault::{maybe_panic, FaultPhase};
use super::metrics::{ms, StepTimes};
use super::Event;
use crate::comm::{choose_mode, min_bucket_bytes, LeaderOp, LinkModel, Transport};
use crate::config::{CommChoice, TrainConfig};
use crate::data::Dataset;
use crate::models;
use crate::nn::{Net, Param};
use crate::optim::Sgd;
use crate::parallel::{read_params, write_params, BucketOp, BucketPlan, Reducer};
use crate::pipeline::{collate, Batch, BatchFeed, DistributedSampler, Normalize};
use crate::trace::{comm_tid, worker_tid, Tracer};
use candle_core::{Device, Tensor};
use crossbeam_channel::Sender;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Link parameters assumed by `--comm auto` when no link is emulated: in-process copies
/// between threads (memory bandwidth, microseconds of channel latency).
pub const IN_PROCESS_LINK: LinkModel = LinkModel {
    bandwidth_bytes_per_s: 5e9,
    latency: Duration::from_micros(20),
};

/// What a worker needs to start.
pub struct WorkerSetup {
    /// Rank of this worker.
    pub rank: usize,
    /// The run's configuration.
    pub cfg: Arc<TrainConfig>,
    /// This worker's end of the input pipeline (training set, normalisation, batches).
    pub feed: BatchFeed,
    /// Test set (evaluated by worker 0).
    pub test: Arc<Dataset>,
    /// This worker's end of the fabric (`None` with one worker).
    pub transport: Option<Box<dyn Transport>>,
    /// Where progress goes.
    pub events: Sender<Event>,
    /// State to start from: momentum buffers and the first epoch.
    pub resume: Option<Arc<super::checkpoint::Checkpoint>>,
    /// Timeline handle ([`Tracer::off`] without `--trace`).
    pub tracer: Tracer,
}

/// Link parameters assumed by `--comm auto` between processes (an MPI run's flat modes, and
/// the leaders' phase of a hierarchical all-reduce) when no `--link-bandwidth` describes the
/// link: 10 Gbit/s Ethernet between machines. With `--transport mpi`, `--link-*` only informs
/// this choice; nothing is emulated.
pub const BETWEEN_PROCESSES_LINK: LinkModel = LinkModel {
    bandwidth_bytes_per_s: 1.25e9,
    latency: Duration::from_micros(20),
};

/// The link `--comm auto` plans for: the one given with `--link-*`, else the slowest on the
/// way (between processes in a multi-process run, between threads otherwise).
pub fn auto_link(cfg: &TrainConfig) -> LinkModel {
    cfg.link.unwrap_or(if cfg.processes > 1 {
        BETWEEN_PROCESSES_LINK
    } else {
        IN_PROCESS_LINK
    })
}

/// Whether buckets reduce hierarchically: several processes of several workers each (and
/// `--hierarchical on`), or `mpi-native` with several workers per process (MPI_Allreduce runs
/// between the process leaders only).
pub fn reduces_hierarchically(cfg: &TrainConfig) -> bool {
    let several = cfg.processes > 1 && cfg.workers > 1;
    let native = cfg.comm == CommChoice::Native && cfg.workers > 1;
    (several && cfg.hierarchical) || native
}

/// The bucket caps (first, others) in bytes, as `BucketPlan` takes them.
///
/// Given caps are used as they are. Without them, `--comm tree|ring|hd|redundant` get one
/// block per bucket (0, 0), and `--comm auto` closes a bucket only once it holds what the link
/// moves in one latency (`bandwidth x latency`, see [`min_bucket_bytes`]): buckets are reduced
/// one after another on the communication thread, so a bucket smaller than that spends most of
/// its time waiting on latency, and merging it with the next one costs less overlap than the
/// latency it saves. Measured (lenet5, 2 workers x 1 thread, 10 Gbit/s, 2 ms): one bucket per
/// block, auto 11.5 ms a step; with this cap (one bucket) 4.7 ms; tree mode 6.7 ms. On slow or short links the cap is below our
/// smallest blocks (100 Mbit/s, 50 us: 625 bytes), which keeps one block per bucket.
pub fn bucket_caps(cfg: &TrainConfig) -> (usize, usize) {
    if cfg.bucket_caps_from_link && cfg.comm == CommChoice::Auto && cfg.world() > 1 {
        let cap = min_bucket_bytes(&auto_link(cfg));
        (cap, cap)
    } else {
        (cfg.first_bucket_kb * 1024, cfg.bucket_kb * 1024)
    }
}

/// Chooses each bucket's operation. Tree mode updates on worker 0 and broadcasts weights
/// (Caffe's scheme), which stays flat over every worker even when the others reduce
/// hierarchically.
pub fn bucket_ops(cfg: &TrainConfig, plan: &BucketPlan) -> Vec<BucketOp> {
    let hierarchical = reduces_hierarchically(cfg);
    let hier = |leader| BucketOp::Hierarchical {
        leader,
        workers_per_process: cfg.workers,
    };
    plan.buckets
        .iter()
        .map(|b| match cfg.comm {
            CommChoice::Fixed(crate::comm::CommMode::Tree) => BucketOp::ReduceToRoot,
            CommChoice::Fixed(m) if hierarchical => hier(LeaderOp::AllReduce(m)),
            CommChoice::Fixed(m) => BucketOp::AllReduce(m),
            CommChoice::Native if hierarchical => hier(LeaderOp::Native),
            CommChoice::Native => BucketOp::Native,
            CommChoice::Auto if hierarchical => {
                // The leaders' phase crosses the link between processes; the phases within a
                // process have no choice to make.
                let bytes = b.len * 4;
                let mode = choose_mode(cfg.processes, bytes, &auto_link(cfg));
                tracing::debug!(bytes, %mode, "auto: the cost model's choice for the leaders");
                hier(LeaderOp::AllReduce(mode))
            }
            CommChoice::Auto => {
                let bytes = b.len * 4;
                let mode = choose_mode(cfg.world(), bytes, &auto_link(cfg));
                tracing::debug!(bytes, %mode, "auto: the cost model's choice for a bucket");
                BucketOp::AllReduce(mode)
            }
        })
        .collect()
}

/// A worker's state.
pub struct Worker {
    rank: usize,
    cfg: Arc<TrainConfig>,
    net: Net,
    params: Vec<Param>,
    sgd: Sgd,
    reducer: Reducer,
    sampler: DistributedSampler,
    norm: Normalize,
    feed: BatchFeed,
    param_flat: Vec<f32>,
    device: Device,
    test: Arc<Dataset>,
    events: Sender<Event>,
    start_epoch: usize,
    /// The phase the step is in, for the message if it panics.
    phase: &'static str,
    /// Updates skipped for a non-finite gradient (`--on-nonfinite skip`).
    skipped_updates: usize,
    global_step: usize,
    tracer: Tracer,
}

/// Attaches "worker R, PHASE, step S" to an error.
fn ctx<T, E: std::fmt::Display>(
    r: Result<T, E>,
    rank: usize,
    phase: &str,
    step: usize,
) -> Result<T, String> {
    r.map_err(|e| format!("worker {rank}, {phase}, step {step}: {e}"))
}

impl Worker {
    /// Builds the replica, restores a checkpoint if given, and makes every replica equal to
    /// worker 0's (a broadcast).
    pub fn new(s: WorkerSetup) -> Result<Self, String> {
        let cfg = s.cfg.clone();
        let device = Device::Cpu;
        let input = s.feed.source().shape();
        let classes = s.feed.source().num_classes();
        let net = models::build(&cfg.model, input, classes, cfg.seed, &device)
            .map_err(|e| e.to_string())?;
        let params = net.params();
        let mut sgd = Sgd::new(cfg.sgd, &params);
        let (mut start_epoch, mut global_step) = (0, 0);
        if let Some(ck) = &s.resume {
            let m = ck.restore(&cfg.model, &params, &net.buffers())?;
            sgd.set_momentum(m)?;
            start_epoch = ck.state.epoch;
            global_step = ck.state.global_step;
        }
        let (first_cap, cap) = bucket_caps(&cfg);
        let plan = BucketPlan::new(&net, first_cap, cap);
        let ops = bucket_ops(&cfg, &plan);
        if s.rank == 0 {
            let ops = ops.iter().map(|o| o.to_string()).collect();
            let _ = s.events.send(Event::Plan {
                description: plan.describe(),
                ops,
            });
        }
        let total: usize = params.iter().map(|p| p.numel()).sum();
        let reducer = Reducer::new(plan, ops, cfg.overlap, s.transport);
        let mut w = Self {
            rank: s.rank,
            sampler: DistributedSampler::new(
                s.feed.source().len(),
                cfg.batch,
                cfg.workers,
                cfg.seed,
            ),
            norm: s.feed.normalize().clone(),
            cfg,
            net,
            params,
            sgd,
            reducer,
            feed: s.feed,
            param_flat: vec![0.0; total],
            device,
            test: s.test,
            events: s.events,
            start_epoch,
            phase: "start",
            skipped_updates: 0,
            global_step,
            tracer: s.tracer,
        };
        w.broadcast_params()
            .map_err(|e| format!("worker {}: initial weight broadcast: {e}", s.rank))?;
        Ok(w)
    }

    /// Makes every replica's weights equal to worker 0's.
    fn broadcast_params(&mut self) -> candle_core::Result<()> {
        if self.cfg.world() == 1 {
            return Ok(());
        }
        if self.rank == 0 {
            read_params(&self.params, &mut self.param_flat)?;
        }
        let flat = std::mem::take(&mut self.param_flat);
        self.param_flat = self.reducer.broadcast(flat)?;
        if self.rank != 0 {
            write_params(&self.params, &self.param_flat)?;
        }
        Ok(())
    }

    /// Trains every remaining epoch; worker 0 evaluates and checkpoints after each.
    ///
    /// Any failure, an error or a panic, is reported to the run as [`Event::Failed`] while this
    /// worker still holds its communication thread: the run learns the cause before the peers,
    /// whose collectives fail once this worker is gone, report the consequences.
    pub fn run(mut self) -> Result<(), String> {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_epochs()));
        let result = result.unwrap_or_else(|panic| {
            Err(format!(
                "worker {}, {}, step {}: panicked: {}",
                self.rank,
                self.phase,
                self.global_step,
                crate::parallel::panic_message(&*panic)
            ))
        });
        if let Err(e) = &result {
            let _ = self.events.send(Event::Failed {
                rank: self.rank,
                error: e.clone(),
            });
        }
        result
    }

    fn run_epochs(&mut self) -> Result<(), String> {
        let mut order = Vec::new();
        let spe = self.sampler.steps_per_epoch();
        for epoch in self.start_epoch..self.cfg.epochs {
            self.sampler.epoch_order(epoch, &mut order);
            let started = Instant::now();
            let mut loss_sum = 0.0;
            for step in 0..spe {
                let (loss, times) = self.step(&order, epoch, step, epoch * spe + step)?;
                loss_sum += loss as f64;
                let _ = self.events.send(Event::Step {
                    rank: self.rank,
                    epoch,
                    step,
                    loss,
                    times,
                });
            }
            let train_seconds = started.elapsed().as_secs_f64();
            if self.rank == 0 {
                let (test_loss, test_accuracy) =
                    ctx(self.evaluate(), self.rank, "evaluation", self.global_step)?;
                let state =
                    super::checkpoint::TrainState::new(&self.cfg, epoch + 1, self.global_step);
                let last = epoch + 1 == self.cfg.epochs;
                let every = self.cfg.checkpoint_every;
                let due = last || (every > 0 && (epoch + 1) % every == 0);
                let checkpoint = if due && !self.cfg.no_checkpoints {
                    let ck = ctx(
                        super::checkpoint::Checkpoint::capture(
                            state,
                            &self.params,
                            self.sgd.momentum(),
                            &self.net.buffers(),
                        ),
                        0,
                        "checkpoint",
                        self.global_step,
                    )?;
                    let path = super::checkpoint::checkpoint_path(&self.cfg.run_dir, epoch + 1);
                    let slow = self
                        .cfg
                        .fault
                        .is_some_and(|f| f.phase == super::fault::FaultPhase::SlowCheckpoint);
                    ck.save_paced(&path, slow)?;
                    super::checkpoint::prune(
                        &self.cfg.run_dir,
                        self.cfg.keep_checkpoints,
                        epoch + 1,
                    );
                    Some(path)
                } else {
                    None
                };
                let _ = self.events.send(Event::Epoch {
                    epoch,
                    train_loss: loss_sum / spe.max(1) as f64,
                    test_loss,
                    test_accuracy,
                    train_seconds,
                    checkpoint,
                });
            }
        }
        ctx(
            read_params(&self.params, &mut self.param_flat),
            self.rank,
            "final weight check",
            self.global_step,
        )?;
        let _ = self.events.send(Event::Done {
            rank: self.rank,
            weights_hash: hash_f32(&self.param_flat),
            skipped_updates: self.skipped_updates,
        });
        Ok(())
    }

    /// One training step on this worker's shard of global batch `step`.
    fn step(
        &mut self,
        order: &[u32],
        epoch: usize,
        step: usize,
        global: usize,
    ) -> Result<(f32, StepTimes), String> {
        let (rank, gs) = (self.rank, self.global_step);
        self.tracer.begin_step(global);
        let t0 = Instant::now();
        // Waiting here (for the prefetch queue, or collating with --prefetch 0) is the data
        // wait of the step breakdown.
        self.phase = "data";
        let staged = ctx(self.feed.next(epoch, step, order), rank, "data", gs)?;
        let (x, y) = ctx(
            staged.tensors(self.net.input, &self.device),
            rank,
            "data",
            gs,
        )?;
        let t1 = Instant::now();
        self.phase = "forward";
        let fault = self.cfg.fault;
        maybe_panic(fault, FaultPhase::Forward, gs, rank);
        let (tracer, mut mark) = (&mut self.tracer, t1);
        let fp = self.net.forward_observed(&x, true, |k| {
            if tracer.active() {
                let now = Instant::now();
                let name = format!("forward {}", self.net.blocks[k].name);
                tracer.span(
                    worker_tid(rank),
                    "forward",
                    name,
                    mark,
                    now,
                    json!({"block": k}),
                );
                mark = now;
            }
        });
        let fp = ctx(fp, rank, "forward", gs)?;
        let loss = ctx(
            candle_nn::loss::cross_entropy(fp.logits(), &y),
            rank,
            "forward",
            gs,
        )?;
        let loss_value = ctx(loss.to_scalar::<f32>(), rank, "forward", gs)?;
        if !loss_value.is_finite() && !self.cfg.skip_nonfinite {
            return Err(format!("worker {rank}, forward, step {gs}: the loss is {loss_value}: training diverged; lower --lr (or pass --on-nonfinite skip)"));
        }
        let t2 = Instant::now();
        self.phase = "backward";
        self.reducer.begin_step();
        if fault.is_some_and(|f| f.hits(FaultPhase::Comm, gs, rank)) {
            self.reducer.inject_panic_on_next_bucket();
        }
        let (net, reducer, params) = (&self.net, &mut self.reducer, &self.params);
        let (tracer, mut mark) = (&mut self.tracer, t2);
        let flows = self.cfg.overlap && self.cfg.world() > 1;
        let backward = net.backward(&fp, &loss, |k, grads| {
            maybe_panic(fault, FaultPhase::Backward, gs, rank);
            let r = reducer.on_block(k, params, grads);
            if tracer.active() {
                let now = Instant::now();
                let name = format!("backward {}", net.blocks[k].name);
                tracer.span(
                    worker_tid(rank),
                    "backward",
                    name,
                    mark,
                    now,
                    json!({"block": k}),
                );
                // An arrow from the hand-off to the bucket's reduction on the comm track.
                match reducer.plan().ready_at_block[k] {
                    Some(b) if flows => {
                        tracer.flow(worker_tid(rank), flow_id(rank, global, b), now, true)
                    }
                    _ => {}
                }
                mark = now;
            }
            r
        });
        ctx(backward, rank, "backward", gs)?;
        drop(fp);
        let t3 = Instant::now();
        self.phase = "communication";
        let comm = ctx(self.reducer.finish(), rank, "communication", gs)?;
        self.phase = "update";
        let t4 = Instant::now();
        let lr = self.cfg.lr_schedule.lr(
            self.cfg.lr,
            global,
            self.cfg.epochs * self.sampler.steps_per_epoch(),
            self.sampler.steps_per_epoch(),
            self.cfg.warmup_steps,
        );
        let scale = 1.0 / self.cfg.world() as f32;
        let root_updates = matches!(
            self.cfg.comm,
            CommChoice::Fixed(crate::comm::CommMode::Tree)
        ) && self.cfg.world() > 1;
        let mut exposed = comm.exposed;
        if !root_updates || rank == 0 {
            let reducer = &self.reducer;
            // The reduced gradient is bit-identical on every worker (worker 0 alone holds it
            // in tree mode, where it alone updates), so every worker takes the same decision.
            let n = self.params.len();
            if (0..n).all(|p| reducer.grad(p).iter().all(|v| v.is_finite())) {
                ctx(
                    self.sgd.step(&self.params, |p| reducer.grad(p), lr, scale),
                    rank,
                    "update",
                    gs,
                )?;
            } else if self.cfg.skip_nonfinite {
                self.skipped_updates += 1;
            } else {
                return Err(format!(
                    "worker {rank}, update, step {gs}: the summed gradient holds NaN or infinity (loss {loss_value}): training diverged; lower --lr, or pass --on-nonfinite skip to skip such steps"
                ));
            }
        }
        let mut t5 = Instant::now();
        let update_end = t5;
        if root_updates {
            // Caffe's scheme: worker 0 updated; its new weights go down the tree.
            ctx(self.broadcast_params(), rank, "communication", gs)?;
            let t6 = Instant::now();
            exposed += t6 - t5;
            t5 = t6;
        }
        if self.tracer.active() {
            self.trace_step(epoch, step, global, [t0, t1, t2, t3, t4, update_end, t5]);
        }
        self.global_step += 1;
        let times = StepTimes {
            data_ms: ms(t1 - t0),
            forward_ms: ms(t2 - t1),
            backward_ms: ms(t3 - t2),
            exposed_comm_ms: ms(exposed),
            comm_total_ms: ms(comm.total) + ms(exposed - comm.exposed),
            update_ms: ms(t5 - t4) - ms(exposed - comm.exposed),
            step_ms: ms(t5 - t0),
        };
        Ok((loss_value, times))
    }

    /// Records a traced step's phases (`t`: step start, forward start, backward start,
    /// backward end, last bucket back, update end, step end) on the worker's track, and each
    /// bucket's reduction on its communication thread's track.
    fn trace_step(&mut self, epoch: usize, step: usize, global: usize, t: [Instant; 7]) {
        let (rank, tracer) = (self.rank, &mut self.tracer);
        let wt = worker_tid(rank);
        let args = json!({"epoch": epoch + 1, "step": step, "global_step": global});
        let step_args = || json!({"global_step": global});
        tracer.span(wt, "step", format!("step {global}"), t[0], t[6], args);
        tracer.span(wt, "data", "data wait", t[0], t[1], step_args());
        tracer.span(wt, "forward", "forward", t[1], t[2], step_args());
        tracer.span(wt, "backward", "backward", t[2], t[3], step_args());
        tracer.span(wt, "comm", "exposed comm", t[3], t[4], step_args());
        tracer.span(wt, "update", "update", t[4], t[5], step_args());
        if t[6] > t[5] {
            // Tree mode: worker 0's new weights go down the tree after its update.
            let name = "exposed comm (weight broadcast)";
            tracer.span(wt, "comm", name, t[5], t[6], step_args());
        }
        let overlap = self.cfg.overlap;
        for span in self.reducer.bucket_spans() {
            let b = span.index;
            let args = json!({
                "bucket": b,
                "mode": self.reducer.ops()[b].to_string(),
                "bytes": self.reducer.plan().buckets[b].len * 4,
                "global_step": global,
            });
            let name = format!("reduce bucket {b}");
            tracer.span_for(comm_tid(rank), "comm", name, span.started, span.busy, args);
            if !overlap {
                // Without overlap every bucket is handed off when backward ends.
                tracer.flow(wt, flow_id(rank, global, b), t[3], true);
            }
            tracer.flow(
                comm_tid(rank),
                flow_id(rank, global, b),
                span.started,
                false,
            );
        }
    }

    /// Test loss and top-1 accuracy.
    fn evaluate(&self) -> candle_core::Result<(f64, f64)> {
        evaluate(&self.net, &self.test, &self.norm, &self.device)
    }
}

/// Identifies the flow arrow of bucket `b` of worker `rank` in global step `step`.
fn flow_id(rank: usize, step: usize, b: usize) -> u64 {
    ((step as u64) << 24) | ((rank as u64) << 12) | b as u64
}

/// FNV-1a over the bits of `v`: equal hashes mean (all but surely) bit-identical weights.
pub fn hash_f32(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Test loss and top-1 accuracy of `net` on `ds`.
pub fn evaluate(
    net: &Net,
    ds: &Dataset,
    norm: &Normalize,
    dev: &Device,
) -> candle_core::Result<(f64, f64)> {
    let mut batch = Batch::default();
    let (mut loss_sum, mut correct) = (0.0f64, 0usize);
    let [c, h, w] = net.input;
    let indices: Vec<u32> = (0..ds.len() as u32).collect();
    for chunk in indices.chunks(500) {
        collate(ds, chunk, norm, &mut batch);
        let n = chunk.len();
        let x = Tensor::from_slice(&batch.images, (n, c, h, w), dev)?;
        let y = Tensor::from_slice(&batch.labels, n, dev)?;
        let logits = net.forward_uncut(&x, false)?;
        loss_sum +=
            candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()? as f64 * n as f64;
        let pred = logits.argmax(1)?.to_vec1::<u32>()?;
        correct += pred
            .iter()
            .zip(&batch.labels)
            .filter(|(a, b)| a == b)
            .count();
    }
    let n = ds.len().max(1) as f64;
    Ok((loss_sum / n, correct as f64 / n))
}
