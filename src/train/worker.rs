//! One worker: a model replica that trains on its shard of every global batch.
//!
//! The whole step lives in `Worker::step`: batch, forward, backward writing gradients into
//! the reducer's buckets (which go to the communication thread as they fill), the wait for the
//! last bucket, the update. Every phase is timed.

use super::metrics::{ms, StepTimes};
use super::Event;
use crate::comm::Transport;
use crate::config::{CommChoice, TrainConfig};
use crate::data::Dataset;
use crate::model::Graph;
use crate::nn::{ExecDone, Mode, Net, NetConfig, StepInfo};
use crate::optim::Sgd;
use crate::parallel::Reducer;
use crate::pipeline::{collate, Batch, BatchFeed, DistributedSampler, Normalize};
use crate::testbed::device::EmulatedDevice;
use crate::testbed::fault::{maybe_panic, FaultPhase};
use crate::trace::{comm_tid, worker_tid, Tracer};
use crossbeam_channel::Sender;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// What a worker needs to start.
pub struct WorkerSetup {
    /// Rank of this worker.
    pub rank: usize,
    /// The run's configuration.
    pub cfg: Arc<TrainConfig>,
    /// The model, made concrete for the dataset.
    pub graph: Arc<Graph>,
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

/// The element count of each of `net`'s parameter blocks (forward order): what its bucket
/// plan is cut from ([`crate::plan::PlanInputs::bucket_plan`]).
pub fn block_lens(net: &Net) -> Vec<usize> {
    net.blocks().iter().map(|b| b.range.len()).collect()
}

/// Something told when a worker starts and ends each step (on the worker's thread): `(rank,
/// global step, started)`. For measurements around steps, e.g. the allocation test, which
/// counts what steady-state steps allocate; at most one per process ([`set_step_observer`]).
pub type StepObserver = fn(usize, usize, bool);

static STEP_OBSERVER: std::sync::OnceLock<StepObserver> = std::sync::OnceLock::new();

/// Installs the process's step observer; fails if one is installed already.
pub fn set_step_observer(f: StepObserver) -> Result<(), String> {
    STEP_OBSERVER
        .set(f)
        .map_err(|_| "a step observer is already installed".to_string())
}

fn observe(rank: usize, global: usize, started: bool) {
    if let Some(f) = STEP_OBSERVER.get() {
        f(rank, global, started);
    }
}

/// A worker's state.
pub struct Worker {
    rank: usize,
    cfg: Arc<TrainConfig>,
    net: Net,
    sgd: Sgd,
    reducer: Reducer,
    sampler: DistributedSampler,
    norm: Normalize,
    feed: BatchFeed,
    /// A copy of the weights for broadcasts (tree mode, start).
    param_flat: Vec<f32>,
    test: Arc<Dataset>,
    /// Evaluation batches are collated here.
    eval_batch: Batch,
    events: Sender<Event>,
    start_epoch: usize,
    /// The phase the step is in, for the message if it panics.
    phase: &'static str,
    /// Updates skipped for a non-finite gradient (`--on-nonfinite skip`).
    skipped_updates: usize,
    global_step: usize,
    tracer: Tracer,
    /// The bucket each block completes (the plan's, for the timeline's arrows).
    ready_at: Vec<Option<usize>>,
    /// Each exec's layer name, for the timeline.
    exec_names: Vec<String>,
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
        let local_batch = cfg.batch / cfg.world();
        let mut net = Net::new(
            s.graph.clone(),
            NetConfig {
                max_batch: local_batch,
                seed: cfg.seed,
            },
        )
        .map_err(|e| e.to_string())?;
        if let Some(d) = &cfg.device {
            d.check_fits(&cfg.model, local_batch, net.blocks().len())
                .map_err(|e| e.to_string())?;
        }
        let mut sgd = Sgd::new(cfg.sgd, net.params().len());
        let (mut start_epoch, mut global_step) = (0, 0);
        if let Some(ck) = &s.resume {
            let m = ck.restore(&mut net)?;
            sgd.set_momentum(m)?;
            start_epoch = ck.state.epoch;
            global_step = ck.state.global_step;
        }
        let planning = cfg.plan_inputs();
        let plan = planning.bucket_plan(&block_lens(&net));
        let ops = planning.bucket_ops(&plan);
        if s.rank == 0 {
            let ops = ops.iter().map(|o| o.to_string()).collect();
            let _ = s.events.send(Event::Plan {
                description: plan.describe(),
                ops,
            });
        }
        let total = net.params().len();
        let ready_at = plan.ready_at_block.clone();
        let exec_names = net.exec_names().map(String::from).collect();
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
            sgd,
            reducer,
            feed: s.feed,
            param_flat: vec![0.0; total],
            test: s.test,
            eval_batch: Batch::default(),
            events: s.events,
            start_epoch,
            phase: "start",
            skipped_updates: 0,
            global_step,
            tracer: s.tracer,
            ready_at,
            exec_names,
        };
        w.broadcast_params()
            .map_err(|e| format!("worker {}: initial weight broadcast: {e}", s.rank))?;
        Ok(w)
    }

    /// Makes every replica's weights equal to worker 0's.
    fn broadcast_params(&mut self) -> Result<(), String> {
        if self.cfg.world() == 1 {
            return Ok(());
        }
        if self.rank == 0 {
            self.param_flat.copy_from_slice(self.net.params());
        }
        let flat = std::mem::take(&mut self.param_flat);
        self.param_flat = self.reducer.broadcast(flat)?;
        if self.rank != 0 {
            self.net.params_mut().copy_from_slice(&self.param_flat);
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
                let global = epoch * spe + step;
                observe(self.rank, global, true);
                let (loss, times) = self.step(&order, epoch, step, global)?;
                observe(self.rank, global, false);
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
                self.phase = "evaluation";
                let (test_loss, test_accuracy) = self.evaluate();
                let state = super::checkpoint::TrainState::new(
                    &self.cfg,
                    self.net.graph(),
                    epoch + 1,
                    self.global_step,
                );
                let last = epoch + 1 == self.cfg.epochs;
                let every = self.cfg.checkpoint_every;
                let due = last || (every > 0 && (epoch + 1) % every == 0);
                let checkpoint = if due && !self.cfg.no_checkpoints {
                    let ck = super::checkpoint::Checkpoint::capture(
                        state,
                        &self.net,
                        self.sgd.momentum(),
                    );
                    let path = super::checkpoint::checkpoint_path(&self.cfg.run_dir, epoch + 1);
                    let slow = self
                        .cfg
                        .fault
                        .is_some_and(|f| f.phase == FaultPhase::SlowCheckpoint);
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
        let _ = self.events.send(Event::Done {
            rank: self.rank,
            weights_hash: hash_f32(self.net.params()),
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
        let batch = staged.host();
        let n = batch.len();
        let t1 = Instant::now();
        self.phase = "forward";
        let fault = self.cfg.fault;
        maybe_panic(fault, FaultPhase::Forward, gs, rank);
        let info = StepInfo {
            seed: self.cfg.seed,
            step: global as u64,
            first_sample: (rank * n) as u64,
            global_batch: self.cfg.batch,
        };
        let (tracer, mut mark, names) = (&mut self.tracer, t1, &self.exec_names);
        let net = &mut self.net;
        let report = net.forward_observed(
            &batch.images,
            &batch.labels,
            n,
            Mode::Train(info),
            &mut |e| {
                if tracer.active() {
                    let now = Instant::now();
                    tracer.span(
                        worker_tid(rank),
                        "forward",
                        format!("forward {}", names[e]),
                        mark,
                        now,
                        json!({"exec": e}),
                    );
                    mark = now;
                }
            },
        );
        if let Some(d) = &self.cfg.device {
            EmulatedDevice::hold(t1, d.forward);
        }
        let loss_value = (report.loss_sum / n as f64) as f32;
        if !loss_value.is_finite() && !self.cfg.skip_nonfinite {
            return Err(format!("worker {rank}, forward, step {gs}: the loss is {loss_value}: training diverged; lower --lr (or pass --on-nonfinite skip)"));
        }
        let t2 = Instant::now();
        self.phase = "backward";
        self.reducer.begin_step();
        if fault.is_some_and(|f| f.hits(FaultPhase::Comm, gs, rank)) {
            self.reducer.inject_panic_on_next_bucket();
        }
        let flows = self.cfg.overlap && self.cfg.world() > 1;
        let (tracer, mut mark, ready_at, names) =
            (&mut self.tracer, t2, &self.ready_at, &self.exec_names);
        let mut on_done = |done: ExecDone| {
            maybe_panic(fault, FaultPhase::Backward, gs, rank);
            if tracer.active() {
                let now = Instant::now();
                tracer.span(
                    worker_tid(rank),
                    "backward",
                    format!("backward {}", names[done.exec]),
                    mark,
                    now,
                    json!({"exec": done.exec}),
                );
                // An arrow from the hand-off to the bucket's reduction on the comm track.
                if let (true, Some(b)) = (flows, done.block.and_then(|b| ready_at[b])) {
                    tracer.flow(worker_tid(rank), flow_id(rank, global, b), now, true);
                }
                mark = now;
            }
            Ok(())
        };
        // With an emulated device, each block goes to the reducer when the device would have
        // written it, and backward ends when the device's would.
        let backward = match &self.cfg.device {
            Some(d) => {
                let mut sink = d.paced(&mut self.reducer, t2);
                let r = self.net.backward(&mut sink, &mut on_done);
                EmulatedDevice::hold(t2, d.backward());
                r
            }
            None => self.net.backward(&mut self.reducer, &mut on_done),
        };
        ctx(backward, rank, "backward", gs)?;
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
        let root_updates = matches!(
            self.cfg.comm,
            CommChoice::Fixed(crate::comm::CommMode::Tree)
        ) && self.cfg.world() > 1;
        let mut exposed = comm.exposed;
        if !root_updates || rank == 0 {
            let reducer = &self.reducer;
            // The reduced gradient is bit-identical on every worker (worker 0 alone holds it
            // in tree mode, where it alone updates), so every worker takes the same decision.
            // The loss is a mean over the global batch, so the sum over workers is the
            // gradient itself (scale 1).
            let blocks = self.net.blocks().len();
            if (0..blocks).all(|b| reducer.grad(b).iter().all(|v| v.is_finite())) {
                let (params, blocks) = self.net.params_and_blocks();
                self.sgd.step(params, blocks, |b| reducer.grad(b), lr, 1.0);
                if let Some(d) = &self.cfg.device {
                    EmulatedDevice::hold(t4, d.update);
                }
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
    fn evaluate(&mut self) -> (f64, f64) {
        evaluate(&mut self.net, &self.test, &self.norm, &mut self.eval_batch)
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

/// Test loss and top-1 accuracy of `net` on `ds`, in batches of the net's largest batch
/// (collated into `batch`, whose buffers are reused).
pub fn evaluate(net: &mut Net, ds: &Dataset, norm: &Normalize, batch: &mut Batch) -> (f64, f64) {
    let (mut loss_sum, mut correct) = (0.0f64, 0usize);
    let chunk = net.max_batch();
    let mut indices: Vec<u32> = Vec::with_capacity(chunk);
    for start in (0..ds.len()).step_by(chunk.max(1)) {
        indices.clear();
        indices.extend(start as u32..(start + chunk).min(ds.len()) as u32);
        collate(ds, &indices, norm, batch);
        let r = net.forward(&batch.images, &batch.labels, indices.len(), Mode::Eval);
        loss_sum += r.loss_sum;
        correct += r.correct;
    }
    let n = ds.len().max(1) as f64;
    (loss_sum / n, correct as f64 / n)
}
