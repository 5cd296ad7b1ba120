//! One worker: a model replica that trains on its shard of every global batch.
//!
//! `Worker::step` reads as the step's phases, one function each: data, forward, backward
//! writing gradients into the reducer's buckets (which go to the communication thread as they
//! fill), the wait for the last bucket (exposed communication), the update. Every phase is
//! timed; tracing, injected faults, the emulated device and the non-finite policy each sit in
//! their own small function beside the compute.

use super::checkpoint::{self, TrainState};
use super::error::{Phase, StepError, WorkerError};
use super::event::Event;
use super::metrics::{ms, StepTimes};
use crate::comm::{CommError, CommMode, Transport, WireFormat};
use crate::config::{CommChoice, TrainConfig};
use crate::data::Dataset;
use crate::model::Graph;
use crate::nn::{ExecDone, Mode, Net, NetConfig, StepInfo};
use crate::optim::Sgd;
use crate::parallel::{CommTimes, Reducer};
use crate::pipeline::{collate, Batch, BatchFeed, DistributedSampler, Normalize};
use crate::testbed::device::EmulatedDevice;
use crate::testbed::fault::{maybe_panic, FaultPhase};
use crate::trace::{comm_tid, worker_tid, Tracer};
use crossbeam_channel::Sender;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Weights to start a new run from (`--weights`).
    pub weights: Option<Arc<super::weights::StartWeights>>,
    /// What checkpoints record about the model (the normalisation is this worker's).
    pub description: Arc<super::description::ModelDescription>,
    /// Timeline handle ([`Tracer::off`] without `--trace`).
    pub tracer: Tracer,
    /// The restart points past the resumed step, which this worker's restart points
    /// supersede (global worker 0 of a resumed run that found some; `None` elsewhere).
    pub abandoned: Option<Arc<super::rundir::AbandonedRestartPoints>>,
    /// Set by the run when it must stop (a `metrics.jsonl` line could not be written): the
    /// worker leaves before its next step.
    pub stop: Arc<std::sync::atomic::AtomicBool>,
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

/// A worker thread's whole life: its compute threads (`threads` of them), the replica, every
/// epoch. Every failure reaches the run as [`Event::Failed`]; a step's is sent by
/// [`Worker::run`] while the worker still holds its communication thread.
pub fn run_worker_thread(setup: WorkerSetup, threads: usize) {
    let (rank, events) = (setup.rank, setup.events.clone());
    let emulated_device = setup.cfg.device.is_some();
    let schedule = setup.cfg.schedule;
    let collectives = setup.cfg.collectives_wait();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("worker-{rank}-compute-{i}"))
        .build();
    let started = pool
        .map_err(|e| WorkerError::Setup(e.to_string()))
        .and_then(|pool| {
            pool.install(|| {
                let worker = Worker::new(setup)?;
                // After Worker::new has started the communication thread, which must keep the
                // default priority (threads inherit their creator's).
                if emulated_device {
                    rayon::broadcast(|_| crate::testbed::device::lower_compute_priority());
                } else {
                    rayon::broadcast(|_| {
                        crate::parallel::yield_cpu_to_communication(schedule, collectives)
                    });
                }
                worker.run();
                Ok(())
            })
        });
    if let Err(error) = started {
        let _ = events.send(Event::Failed { rank, error });
    }
}

/// Each bucket's PowerSGD state for `--compress powersgd:R` (all `None` otherwise, and for a
/// bucket with no matrix that gains); Q drawn from the run's seed and the bucket, alike on
/// every worker. A rank at which no layer's weight gains is refused. With them, whether each
/// bucket's round 2 travels in the next bucket's collective (the plan's
/// [`crate::plan::PlanInputs::powersgd_carries`]).
fn powersgd_states(
    cfg: &TrainConfig,
    net: &Net,
    plan: &crate::parallel::BucketPlan,
    planning: &crate::plan::PlanInputs,
    ops: &[crate::parallel::BucketOp],
) -> Result<PowerSgdPlan, WorkerError> {
    let Some(rank) = cfg.compress.powersgd_rank() else {
        let none = plan.buckets.len();
        return Ok((vec![None; none], vec![false; none]));
    };
    let blocks = crate::plan::block_matrices(net);
    if let Some(why) = crate::plan::powersgd_refusal(&blocks, rank) {
        return Err(WorkerError::Setup(why));
    }
    let per_bucket = crate::plan::powersgd_matrices(plan, &blocks, rank);
    let carries = planning.powersgd_carries(plan, ops, &per_bucket, rank);
    let states = per_bucket
        .into_iter()
        .zip(&plan.buckets)
        .enumerate()
        .map(|(i, (matrices, bucket))| {
            (!matrices.is_empty()).then(|| {
                let seed = cfg.seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1));
                crate::comm::powersgd::PowerSgdBucket::new(bucket.len, matrices, rank, seed)
            })
        })
        .collect();
    Ok((states, carries))
}

/// Each bucket's PowerSGD state and whether its round 2 is carried ([`powersgd_states`]).
type PowerSgdPlan = (
    Vec<Option<crate::comm::powersgd::PowerSgdBucket>>,
    Vec<bool>,
);

/// PowerSGD's state on its way into checkpoints: this worker's error feedback flattened, and
/// on worker 0 every worker's, with the warm-start Q. Buffers allocated once.
struct PowerSgdGather {
    mine: Vec<f32>,
    state: checkpoint::PowerSgdState,
}

impl PowerSgdGather {
    /// `None` without PowerSGD or with one worker (nothing is compressed).
    fn new(reducer: &Reducer, rank: usize, world: usize) -> Option<Self> {
        let states: Vec<_> = reducer.powersgd().iter().flatten().collect();
        if states.is_empty() || world < 2 {
            return None;
        }
        let errors: usize = states.iter().map(|s| s.error().len()).sum();
        let q: usize = states.iter().map(|s| s.q().len()).sum();
        Some(Self {
            mine: vec![0.0; errors],
            state: checkpoint::PowerSgdState {
                error_shape: [world, errors],
                errors: vec![0.0; if rank == 0 { world * errors } else { 0 }],
                q_shape: [q],
                q: vec![0.0; q],
            },
        })
    }

    /// Every worker's error feedback into worker 0's `state` (all workers call it at the
    /// same point), and the Q.
    fn gather(&mut self, reducer: &mut Reducer) -> Result<(), CommError> {
        let (mut e, mut q) = (0, 0);
        for s in reducer.powersgd().iter().flatten() {
            self.mine[e..e + s.error().len()].copy_from_slice(s.error());
            self.state.q[q..q + s.q().len()].copy_from_slice(s.q());
            (e, q) = (e + s.error().len(), q + s.q().len());
        }
        let mine = std::mem::take(&mut self.mine);
        let all = std::mem::take(&mut self.state.errors);
        let (mine, all) = reducer.gather(mine, all)?;
        (self.mine, self.state.errors) = (mine, all);
        Ok(())
    }
}

/// Puts a resumed checkpoint's PowerSGD state into the reducer's buckets: on as many workers
/// as wrote it, each worker its own error feedback (exact); on another count, their sum on
/// worker 0 and none elsewhere (what the run still owed, sent once). Q is everyone's. A
/// checkpoint without the state (or from another rank or model layout) starts PowerSGD afresh.
fn restore_powersgd(
    ck: &checkpoint::Checkpoint,
    reducer: &mut Reducer,
    (rank, world): (usize, usize),
    events: &crossbeam_channel::Sender<Event>,
) -> Result<(), WorkerError> {
    let Some(saved) = ck.powersgd().map_err(WorkerError::Restore)? else {
        return Ok(());
    };
    let [workers, per_worker] = saved.error_shape;
    let error_len: usize = reducer
        .powersgd()
        .iter()
        .flatten()
        .map(|s| s.error().len())
        .sum();
    let q_len: usize = reducer
        .powersgd()
        .iter()
        .flatten()
        .map(|s| s.q().len())
        .sum();
    if per_worker != error_len
        || saved.q.len() != q_len
        || saved.errors.len() != workers * per_worker
    {
        if rank == 0 && error_len > 0 {
            let _ = events.send(Event::Warning(
                "the checkpoint's PowerSGD state is for another rank or layout: error feedback \
                 starts from zero"
                    .into(),
            ));
        }
        return Ok(());
    }
    let mine: Vec<f32> = if workers == world {
        saved.error_of(rank).to_vec()
    } else if rank == 0 {
        (0..per_worker)
            .map(|i| (0..workers).map(|w| saved.error_of(w)[i]).sum())
            .collect()
    } else {
        vec![0.0; per_worker]
    };
    let (mut e, mut q) = (0, 0);
    for s in reducer.powersgd_mut().iter_mut().flatten() {
        let (el, ql) = (s.error().len(), s.q().len());
        s.restore(&mine[e..e + el], &saved.q[q..q + ql]);
        (e, q) = (e + el, q + ql);
    }
    Ok(())
}

/// What checkpoints record about the model: `base`, with the run's normalisation `norm` where
/// the model file gave none.
fn description_with(
    base: &super::description::ModelDescription,
    norm: &Normalize,
) -> super::description::ModelDescription {
    let mut description = base.clone();
    if description.mean.is_empty() {
        description.mean = norm.mean().to_vec();
        description.std = norm.std().to_vec();
    }
    description
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
    /// What checkpoints record about the model.
    description: Arc<super::description::ModelDescription>,
    events: Sender<Event>,
    /// The run's stop flag ([`WorkerSetup::stop`]).
    stop: Arc<std::sync::atomic::AtomicBool>,
    start_epoch: usize,
    /// Steps of `start_epoch` a resumed commit had done already.
    start_step_in_epoch: usize,
    /// Global worker 0's restart points every `--commit-every` steps (`None` elsewhere).
    committer: Option<super::commit::Committer>,
    /// The restart points past the resumed step, which the epoch checkpoints supersede
    /// ([`WorkerSetup::abandoned`]).
    abandoned: Option<Arc<super::rundir::AbandonedRestartPoints>>,
    /// With `--compress powersgd:R` and 2 or more workers: PowerSGD's state as checkpoints
    /// record it (every worker's error feedback on worker 0), gathered when one is due.
    powersgd_checkpoint: Option<PowerSgdGather>,
    /// `--schedule priority`: the update deferred into the next forward.
    priority: super::priority::PriorityUpdates,
    /// The phase the step is in, for the message if it panics.
    phase: Phase,
    /// Updates skipped for a non-finite gradient (`--on-nonfinite skip`).
    skipped_updates: usize,
    global_step: usize,
    tracer: Tracer,
    /// The bucket each block completes (the plan's, for the timeline's arrows).
    ready_at: Vec<Option<usize>>,
    /// Each exec's layer name, for the timeline.
    exec_names: Vec<String>,
}

/// When each phase of a step began and ended (for its [`StepTimes`] and its timeline).
struct StepMarks {
    started: Instant,
    forward: Instant,
    backward: Instant,
    backward_end: Instant,
    update: Instant,
    update_end: Instant,
    /// After tree mode's weight broadcast; `update_end` otherwise.
    ended: Instant,
}

impl StepMarks {
    /// Where the step's time went. Tree mode's weight broadcast counts as exposed
    /// communication (it follows the update, so it is taken out of the update's time).
    fn times(&self, comm: &CommTimes) -> StepTimes {
        let broadcast = self.ended - self.update_end;
        let exposed = comm.exposed + broadcast;
        StepTimes {
            data_ms: ms(self.forward - self.started),
            forward_ms: ms(self.backward - self.forward),
            backward_ms: ms(self.backward_end - self.backward),
            exposed_comm_ms: ms(exposed),
            comm_total_ms: ms(comm.total) + ms(exposed - comm.exposed),
            comm_cpu_ms: ms(comm.cpu),
            update_ms: ms(self.ended - self.update) - ms(exposed - comm.exposed),
            step_ms: ms(self.ended - self.started),
        }
    }
}

/// One pass's per-layer spans on a worker's timeline track (with `--trace`; nothing
/// otherwise): each layer's span runs from the end of the one before.
struct LayerSpans<'a> {
    tracer: &'a mut Tracer,
    names: &'a [String],
    track: u32,
    pass: &'static str,
    mark: Instant,
    /// The exec of the last span: a layer that splits its backward reports twice, and its
    /// second span is its input gradient.
    last: Option<usize>,
}

impl<'a> LayerSpans<'a> {
    fn new(
        tracer: &'a mut Tracer,
        names: &'a [String],
        rank: usize,
        pass: &'static str,
        started: Instant,
    ) -> Self {
        Self {
            tracer,
            names,
            track: worker_tid(rank),
            pass,
            mark: started,
            last: None,
        }
    }

    /// Records exec `exec`'s span, ending now; returns when it ended (`None` untraced).
    fn exec_done(&mut self, exec: usize) -> Option<Instant> {
        if !self.tracer.active() {
            return None;
        }
        let now = Instant::now();
        let name = match self.last.replace(exec) == Some(exec) {
            true => format!("{} {} input gradient", self.pass, self.names[exec]),
            false => format!("{} {}", self.pass, self.names[exec]),
        };
        let args = json!({ "exec": exec });
        self.tracer
            .span(self.track, self.pass, name, self.mark, now, args);
        self.mark = now;
        Some(now)
    }

    /// An arrow from here, at `at`, to a bucket's reduction on the communication track.
    fn arrow(&mut self, id: u64, at: Instant) {
        self.tracer.flow(self.track, id, at, true);
    }
}

impl Worker {
    /// Builds the replica, restores a checkpoint if given, and makes every replica equal to
    /// worker 0's (a broadcast).
    pub fn new(s: WorkerSetup) -> Result<Self, WorkerError> {
        let cfg = s.cfg.clone();
        let local_batch = cfg.batch / cfg.world();
        let mut net = Net::new(
            s.graph.clone(),
            NetConfig {
                max_batch: local_batch,
                seed: cfg.seed,
            },
        )
        .map_err(|e| WorkerError::Setup(e.to_string()))?;
        net.set_conv_algo(cfg.conv_algo);
        if let Some(d) = &cfg.device {
            d.check_fits(&cfg.model, local_batch, net.blocks().len())
                .map_err(|e| WorkerError::Setup(e.to_string()))?;
        }
        let mut sgd = Sgd::new(cfg.sgd, net.params().len());
        let (mut start_epoch, mut start_step_in_epoch, mut global_step) = (0, 0, 0);
        if let Some(ck) = &s.resume {
            let m = ck.restore(&mut net).map_err(WorkerError::Restore)?;
            sgd.set_momentum(m).map_err(WorkerError::Setup)?;
            start_epoch = ck.state.epoch;
            start_step_in_epoch = ck.state.step_in_epoch;
            global_step = ck.state.global_step;
        }
        let committer = (s.rank == 0 && cfg.commit_every > 0 && !cfg.no_checkpoints)
            .then(|| {
                let abandoned = s.abandoned.clone().map(|a| (a, s.events.clone()));
                super::commit::Committer::start(cfg.run_dir.clone(), cfg.keep_commits, abandoned)
            })
            .transpose()
            .map_err(WorkerError::Setup)?;
        if let Some(w) = &s.weights {
            w.apply(&mut net);
        }
        let planning = cfg.plan_inputs();
        let plan = planning.bucket_plan(&crate::plan::block_lens(&net));
        let ops = planning.bucket_ops(&plan);
        let wires = planning.bucket_wires(&plan, &ops);
        let (powersgd, carries) = powersgd_states(&cfg, &net, &plan, &planning, &ops)?;
        if s.rank == 0 {
            // A compressed bucket shows how: `ring+fp16`, `ring+powersgd:4`.
            let ops = ops
                .iter()
                .zip(&wires)
                .zip(&powersgd)
                .map(|((o, &w), p)| match (w, p) {
                    (_, Some(_)) => format!("{o}+{}", cfg.compress),
                    (WireFormat::F32, None) => o.to_string(),
                    (w, None) => format!("{o}+{w}"),
                })
                .collect();
            let _ = s.events.send(Event::Plan {
                description: plan.describe(),
                ops,
            });
        }
        let total = net.params().len();
        let ready_at = plan.ready_at_block.clone();
        let exec_names = net.exec_names().map(String::from).collect();
        let order = crate::parallel::ReduceOrder {
            schedule: cfg.schedule,
            partition: planning.partition_bytes() / 4,
            credit: crate::parallel::schedule::credit_values(cfg.credit_kb),
        };
        let mut reducer = Reducer::new(plan, ops, wires, cfg.overlap, order, s.transport);
        reducer.set_powersgd(powersgd, carries);
        if let Some(ck) = &s.resume {
            restore_powersgd(ck, &mut reducer, (s.rank, cfg.world()), &s.events)?;
        }
        let powersgd_checkpoint = PowerSgdGather::new(&reducer, s.rank, cfg.world());
        let priority = super::priority::PriorityUpdates::new(
            cfg.schedule == crate::parallel::Schedule::Priority,
            reducer.plan().buckets.len(),
        );
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
            description: s.description,
            events: s.events,
            stop: s.stop,
            start_epoch,
            start_step_in_epoch,
            committer,
            abandoned: s.abandoned,
            powersgd_checkpoint,
            priority,
            phase: Phase::Start,
            skipped_updates: 0,
            global_step,
            tracer: s.tracer,
            ready_at,
            exec_names,
        };
        w.broadcast_params()
            .map_err(|source| WorkerError::InitialBroadcast {
                rank: s.rank,
                source,
            })?;
        Ok(w)
    }

    /// Makes every replica's weights equal to worker 0's.
    fn broadcast_params(&mut self) -> Result<(), CommError> {
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
    pub fn run(mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_epochs()));
        let result = result.unwrap_or_else(|panic| {
            let message = crate::parallel::panic_message(&*panic);
            Err(self.failure(StepError::Panicked(message)))
        });
        if let Err(error) = result {
            let _ = self.events.send(Event::Failed {
                rank: self.rank,
                error,
            });
        }
    }

    /// The failure of this worker's current phase and step, caused by `cause`.
    fn failure(&self, cause: StepError) -> WorkerError {
        WorkerError::Step {
            rank: self.rank,
            phase: self.phase,
            step: self.global_step,
            cause,
        }
    }

    fn run_epochs(&mut self) -> Result<(), WorkerError> {
        let mut order = Vec::new();
        let spe = self.sampler.steps_per_epoch();
        for epoch in self.start_epoch..self.cfg.epochs {
            self.sampler.epoch_order(epoch, &mut order);
            let started = Instant::now();
            let mut loss_sum = 0.0;
            let first = if epoch == self.start_epoch {
                self.start_step_in_epoch
            } else {
                0
            };
            for step in first..spe {
                let global = epoch * spe + step;
                if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(self.failure(StepError::Stopped));
                }
                observe(self.rank, global, true);
                let (loss, mut times) = self.step(&order, epoch, step, global)?;
                if step + 1 == spe || self.commit_due(epoch, step + 1, spe) {
                    self.drain_into(&mut times)?;
                }
                observe(self.rank, global, false);
                loss_sum += loss as f64;
                let _ = self.events.send(Event::Step {
                    rank: self.rank,
                    epoch,
                    step,
                    loss,
                    times,
                });
                self.commit_if_due(epoch, step + 1, spe)?;
            }
            // Under priority scheduling the last step's update is still away (drained above
            // unless the epoch had no step to train).
            self.drain_updates()?;
            let train_seconds = started.elapsed().as_secs_f64();
            if self.epoch_checkpoint_due(epoch) {
                self.phase = Phase::Evaluation;
                self.gather_powersgd()?;
            }
            if self.rank == 0 {
                // A resumed epoch's loss is over the steps this run trained of it.
                let train_loss = loss_sum / (spe - first).max(1) as f64;
                self.end_epoch(epoch, train_loss, train_seconds)?;
            }
            if epoch + 1 < self.cfg.epochs {
                self.await_worker_0()?;
            }
        }
        if let Some(c) = self.committer.take() {
            c.finish().map_err(WorkerError::Checkpoint)?;
        }
        let _ = self.events.send(Event::Done {
            rank: self.rank,
            weights_hash: hash_f32(self.net.params()),
            skipped_updates: self.skipped_updates,
        });
        Ok(())
    }

    /// Worker 0 after an epoch: evaluates, checkpoints when one is due, reports the epoch.
    fn end_epoch(
        &mut self,
        epoch: usize,
        train_loss: f64,
        train_seconds: f64,
    ) -> Result<(), WorkerError> {
        self.phase = Phase::Evaluation;
        let (test_loss, test_accuracy) = self.evaluate();
        let checkpoint = if self.epoch_checkpoint_due(epoch) {
            Some(self.checkpoint(epoch)?)
        } else {
            None
        };
        let _ = self.events.send(Event::Epoch {
            epoch,
            train_loss,
            test_loss,
            test_accuracy,
            train_seconds,
            checkpoint,
        });
        Ok(())
    }

    /// Every worker, between epochs: waits here for worker 0's evaluation and checkpoint (a
    /// broadcast of one value from it). Without this wait the other workers waited in the
    /// next step's first collective, and that step booked the evaluation as exposed
    /// communication (vgg-small, 2 workers: 40 ms a step, half of each later epoch's
    /// breakdown; `tests/train.rs`).
    fn await_worker_0(&mut self) -> Result<(), WorkerError> {
        self.phase = Phase::Evaluation;
        let waited = self.reducer.broadcast(vec![0.0]);
        waited.map(drop).map_err(|e| self.failure(e.into()))
    }

    /// Whether a checkpoint is written after `epoch` (the last, and every
    /// `--checkpoint-every`), the same answer on every worker.
    fn epoch_checkpoint_due(&self, epoch: usize) -> bool {
        let last = epoch + 1 == self.cfg.epochs;
        let every = self.cfg.checkpoint_every;
        !self.cfg.no_checkpoints && (last || (every > 0 && (epoch + 1).is_multiple_of(every)))
    }

    /// Every worker, when a checkpoint or commit is due: PowerSGD's error feedback gathered
    /// on worker 0 (nothing without PowerSGD).
    fn gather_powersgd(&mut self) -> Result<(), WorkerError> {
        let Some(g) = self.powersgd_checkpoint.as_mut() else {
            return Ok(());
        };
        let gathered = g.gather(&mut self.reducer);
        gathered.map_err(|e| self.failure(e.into()))
    }

    /// After `done` steps of `epoch`: when a restart point is due (`--commit-every`), every
    /// worker gathers PowerSGD's state and global worker 0 hands the restart point to the
    /// commit writer.
    fn commit_if_due(&mut self, epoch: usize, done: usize, spe: usize) -> Result<(), WorkerError> {
        if !self.commit_due(epoch, done, spe) {
            return Ok(());
        }
        self.drain_updates()?;
        self.phase = Phase::Commit;
        self.gather_powersgd()?;
        let Some(committer) = self.committer.as_mut() else {
            return Ok(());
        };
        let state = TrainState::new(&self.cfg, self.net.graph(), epoch, self.global_step)
            .within_epoch(done);
        let optimizer = checkpoint::OptimizerState {
            momentum: self.sgd.momentum(),
            powersgd: self.powersgd_checkpoint.as_ref().map(|g| &g.state),
        };
        let (net, base, norm) = (&self.net, &self.description, &self.norm);
        committer
            .commit(state, net, optimizer, || description_with(base, norm))
            .map_err(WorkerError::Checkpoint)
    }

    /// Whether a restart point is due after `done` steps of `epoch` (the same answer on every
    /// worker).
    fn commit_due(&self, epoch: usize, done: usize, spe: usize) -> bool {
        // The data position, which `--resume-changed` may have set apart from the step count.
        self.cfg.commit_every > 0
            && !self.cfg.no_checkpoints
            && super::commit::due(self.cfg.commit_every, epoch * spe + done, spe)
    }

    /// Priority scheduling, after a step that a sync point follows (the epoch's end, a restart
    /// point): waits for the step's buckets and applies its update now, and books both to that
    /// step (exposed communication and update), where overlap has them too. Left out, an
    /// epoch's steps summed to 40% of its time with a restart point after every step
    /// (resnet20, 2 workers, 100 Mbit/s), and the update time leaked into the next step.
    fn drain_into(&mut self, times: &mut StepTimes) -> Result<(), WorkerError> {
        if !self.priority.deferred() {
            return Ok(());
        }
        let started = Instant::now();
        let before = self.reducer.times();
        self.drain_updates()?;
        self.hold_device(started, |d| d.update);
        let after = self.reducer.times();
        let waited = after.exposed.saturating_sub(before.exposed);
        // Taken so that it is not booked again to the next step's forward.
        let _ = self.priority.take_update_time();
        let total = started.elapsed();
        times.exposed_comm_ms += ms(waited);
        times.comm_total_ms += ms(after.total.saturating_sub(before.total));
        times.comm_cpu_ms += ms(after.cpu.saturating_sub(before.cpu));
        times.update_ms += ms(total.saturating_sub(waited));
        times.step_ms += ms(total);
        Ok(())
    }

    /// Writes the checkpoint after `epoch` (and prunes older ones); returns its path.
    fn checkpoint(&self, epoch: usize) -> Result<std::path::PathBuf, WorkerError> {
        let state = TrainState::new(&self.cfg, self.net.graph(), epoch + 1, self.global_step);
        let description = description_with(&self.description, &self.norm);
        let path = checkpoint::checkpoint_path(&self.cfg.run_dir, epoch + 1);
        let slow = self
            .cfg
            .fault
            .is_some_and(|f| f.phase == FaultPhase::SlowCheckpoint);
        checkpoint::save_net(
            &path,
            &state,
            &description,
            &self.net,
            checkpoint::OptimizerState {
                momentum: self.sgd.momentum(),
                powersgd: self.powersgd_checkpoint.as_ref().map(|g| &g.state),
            },
            slow,
        )
        .map_err(WorkerError::Checkpoint)?;
        if let Some(a) = &self.abandoned {
            for failed in a.epoch_written(epoch + 1) {
                let _ = self.events.send(Event::Warning(failed));
            }
        }
        checkpoint::prune(&self.cfg.run_dir, self.cfg.keep_checkpoints, epoch + 1);
        Ok(path)
    }

    /// One training step on this worker's shard of global batch `step`, in the paper's
    /// phases: data, forward, backward, exposed communication, update (and, in tree mode,
    /// the weight broadcast after it), each timed.
    fn step(
        &mut self,
        order: &[u32],
        epoch: usize,
        step: usize,
        global: usize,
    ) -> Result<(f32, StepTimes), WorkerError> {
        self.tracer.begin_step(global);
        let started = Instant::now();
        self.reducer.begin_step();
        self.data(epoch, step, order)?;
        let forward = Instant::now();
        let loss = self.forward(global, forward)?;
        // Under priority scheduling: the last step's buckets the forward did not need.
        self.drain_updates()?;
        let waited = self.reducer.times().exposed;
        let backward = Instant::now();
        self.backward(global, backward)?;
        let backward_end = Instant::now();
        let deferred = self.priority.active();
        let (comm, update, update_end, ended);
        if deferred {
            // The update waits for the next forward (see `super::priority`).
            self.defer_update(loss, global)?;
            comm = self.reducer.times();
            (update, update_end, ended) = (backward_end, backward_end, backward_end);
        } else {
            comm = self.exposed_comm()?;
            update = Instant::now();
            self.update(loss, global, update)?;
            update_end = Instant::now();
            ended = if self.root_updates() {
                self.broadcast_update()?;
                Instant::now()
            } else {
                update_end
            };
        }
        let marks = StepMarks {
            started,
            forward,
            backward,
            backward_end,
            update,
            update_end,
            ended,
        };
        if self.tracer.active() {
            self.trace_step(epoch, step, global, &marks);
        }
        self.global_step += 1;
        let mut times = marks.times(&comm);
        // The forward's waits for the last step's buckets and its updates are exposed
        // communication and update, not forward.
        let applied = ms(self.priority.take_update_time());
        times.forward_ms -= ms(waited) + applied;
        times.update_ms += applied;
        Ok((loss, times))
    }

    /// Priority scheduling, after backward: every bucket is away; its update is deferred to
    /// the next forward.
    fn defer_update(&mut self, loss: f32, global: usize) -> Result<(), WorkerError> {
        self.phase = Phase::Communication;
        let sent = self.reducer.send_rest();
        sent.map_err(|e| self.failure(e.into()))?;
        self.priority.defer(self.learning_rate(global), loss);
        Ok(())
    }

    /// Priority scheduling: applies every bucket of the last step the forward has not (a
    /// no-op otherwise).
    fn drain_updates(&mut self) -> Result<(), WorkerError> {
        if !self.priority.deferred() {
            return Ok(());
        }
        self.phase = Phase::Update;
        let (params, blocks) = self.net.params_and_blocks();
        let drained = self
            .priority
            .drain(&mut self.reducer, &mut self.sgd, params, blocks);
        drained.map_err(|e| self.failure(e))
    }

    /// Data: the step's batch, staged. Waiting here (for the prefetch queue, or collating
    /// with `--prefetch 0`) is the data wait of the step breakdown.
    fn data(&mut self, epoch: usize, step: usize, order: &[u32]) -> Result<(), WorkerError> {
        self.phase = Phase::Data;
        let staged = self.feed.next(epoch, step, order).map(|_| ());
        staged.map_err(|e| self.failure(e.into()))
    }

    /// Forward: the loss on this worker's shard. A loss that is not finite fails the step
    /// unless `--on-nonfinite skip` (the update then decides on the gradient).
    fn forward(&mut self, global: usize, started: Instant) -> Result<f32, WorkerError> {
        self.phase = Phase::Forward;
        self.inject_panic(FaultPhase::Forward);
        let batch = self
            .feed
            .current()
            .expect("the step's batch is staged")
            .host();
        let n = batch.len();
        let info = StepInfo {
            seed: self.cfg.seed,
            step: global as u64,
            first_sample: (self.rank * n) as u64,
            global_batch: self.cfg.batch,
        };
        let mut spans = LayerSpans::new(
            &mut self.tracer,
            &self.exec_names,
            self.rank,
            "forward",
            started,
        );
        // Under priority scheduling each layer first gets the last step's update, unless it
        // was drained after that step (`drain_into`). An emulated device runs its forward
        // block by block around those waits and updates.
        let (priority, reducer, sgd) = (&mut self.priority, &mut self.reducer, &mut self.sgd);
        let updates = priority.deferred();
        let mut device = (self.cfg.device.as_ref()).map(|d| d.paced_forward(started, updates));
        let report = self.net.forward_gated(
            &batch.images,
            &batch.labels,
            n,
            Mode::Train(info),
            &mut |b, params, blocks| {
                if let Some(d) = device.as_mut() {
                    d.reach(b);
                }
                priority.apply_for_block(b, reducer, sgd, params, blocks)?;
                if let Some(d) = device.as_mut() {
                    let bucket = reducer.plan().slots[b].bucket;
                    d.gated(b, updates.then(|| reducer.reduced_at(bucket)).flatten());
                }
                Ok(())
            },
            &mut |exec| {
                spans.exec_done(exec);
            },
        );
        let report = report.map_err(|e| self.failure(e))?;
        if let Some(d) = device {
            d.finish();
        }
        let loss = (report.loss_sum / n as f64) as f32;
        if !loss.is_finite() && !self.cfg.skip_nonfinite {
            return Err(self.failure(StepError::NonFiniteLoss(loss)));
        }
        Ok(loss)
    }

    /// Backward: each layer writes its gradients into the reducer's buckets, which leave for
    /// the communication thread as they fill (with overlap on).
    fn backward(&mut self, global: usize, started: Instant) -> Result<(), WorkerError> {
        self.phase = Phase::Backward;
        if self.fault_hits(FaultPhase::Comm) {
            self.reducer.inject_panic_on_next_bucket();
        }
        let (fault, rank, gs) = (self.cfg.fault, self.rank, self.global_step);
        let flows = self.cfg.overlap && self.cfg.world() > 1;
        let ready_at = &self.ready_at;
        let mut spans = LayerSpans::new(
            &mut self.tracer,
            &self.exec_names,
            rank,
            "backward",
            started,
        );
        let mut on_done = |done: ExecDone| {
            maybe_panic(fault, FaultPhase::Backward, gs, rank);
            if let Some(now) = spans.exec_done(done.exec) {
                if let (true, Some(b)) = (flows, done.block.and_then(|b| ready_at[b])) {
                    spans.arrow(flow_id(rank, global, b), now);
                }
            }
            Ok(())
        };
        let device = self.cfg.device.as_ref();
        let result = backward_into(
            &mut self.net,
            &mut self.reducer,
            device,
            started,
            &mut on_done,
        );
        result.map_err(|e| self.failure(StepError::Backward(e)))
    }

    /// Exposed communication: the wait, once backward has ended, until every bucket is back
    /// reduced.
    fn exposed_comm(&mut self) -> Result<CommTimes, WorkerError> {
        self.phase = Phase::Communication;
        let comm = self.reducer.finish();
        comm.map_err(|e| self.failure(e.into()))
    }

    /// Update: the solver step on the reduced gradient (in tree mode worker 0's alone), or,
    /// when that gradient is not finite, what `--on-nonfinite` says.
    fn update(&mut self, loss: f32, global: usize, started: Instant) -> Result<(), WorkerError> {
        self.phase = Phase::Update;
        if self.root_updates() && self.rank != 0 {
            return Ok(());
        }
        // The reduced gradient is bit-identical on every worker (worker 0 alone holds it in
        // tree mode, where it alone updates), so every worker takes the same decision.
        if !self.reduced_gradient_is_finite() {
            return self.skip_nonfinite_update(loss);
        }
        let lr = self.learning_rate(global);
        let (params, blocks) = self.net.params_and_blocks();
        let reducer = &self.reducer;
        // The loss is a mean over the global batch, so the sum over workers is the gradient
        // itself (scale 1).
        self.sgd.step(params, blocks, |b| reducer.grad(b), lr, 1.0);
        self.hold_device(started, |d| d.update);
        Ok(())
    }

    fn reduced_gradient_is_finite(&self) -> bool {
        let blocks = self.net.blocks().len();
        (0..blocks).all(|b| self.reducer.grad(b).iter().all(|v| v.is_finite()))
    }

    /// The non-finite policy: `--on-nonfinite skip` skips the update (and counts it);
    /// otherwise the step fails.
    fn skip_nonfinite_update(&mut self, loss: f32) -> Result<(), WorkerError> {
        if !self.cfg.skip_nonfinite {
            return Err(self.failure(StepError::NonFiniteGradient { loss }));
        }
        self.skipped_updates += 1;
        Ok(())
    }

    fn learning_rate(&self, global: usize) -> f32 {
        let spe = self.sampler.steps_per_epoch();
        let cfg = &self.cfg;
        let total = cfg.epochs * spe;
        cfg.lr_schedule
            .lr(cfg.lr, global, total, spe, cfg.warmup_steps)
    }

    /// Tree mode over several workers (Caffe's scheme): worker 0 alone updates, then
    /// broadcasts its new weights.
    fn root_updates(&self) -> bool {
        matches!(self.cfg.comm, CommChoice::Fixed(CommMode::Tree)) && self.cfg.world() > 1
    }

    /// Tree mode's weight broadcast after worker 0's update (exposed communication).
    fn broadcast_update(&mut self) -> Result<(), WorkerError> {
        self.phase = Phase::Communication;
        let sent = self.broadcast_params();
        sent.map_err(|e| self.failure(e.into()))
    }

    /// With an emulated device, holds a phase that began at `started` to the device's time
    /// for it (`time`).
    fn hold_device(&self, started: Instant, time: impl Fn(&EmulatedDevice) -> Duration) {
        if let Some(d) = &self.cfg.device {
            EmulatedDevice::hold(started, time(d));
        }
    }

    /// Whether an injected fault strikes this worker's current step in `phase`.
    fn fault_hits(&self, phase: FaultPhase) -> bool {
        let (step, rank) = (self.global_step, self.rank);
        self.cfg.fault.is_some_and(|f| f.hits(phase, step, rank))
    }

    /// Panics if an injected fault strikes this worker's current step in `phase`.
    fn inject_panic(&self, phase: FaultPhase) {
        maybe_panic(self.cfg.fault, phase, self.global_step, self.rank);
    }

    /// Records a traced step's phases on the worker's track, and each bucket's reduction on
    /// its communication thread's track.
    fn trace_step(&mut self, epoch: usize, step: usize, global: usize, t: &StepMarks) {
        let (rank, tracer) = (self.rank, &mut self.tracer);
        let wt = worker_tid(rank);
        let args = json!({"epoch": epoch + 1, "step": step, "global_step": global});
        let step_args = || json!({ "global_step": global });
        tracer.span(
            wt,
            "step",
            format!("step {global}"),
            t.started,
            t.ended,
            args,
        );
        tracer.span(wt, "data", "data wait", t.started, t.forward, step_args());
        tracer.span(wt, "forward", "forward", t.forward, t.backward, step_args());
        let backward_end = t.backward_end;
        tracer.span(
            wt,
            "backward",
            "backward",
            t.backward,
            backward_end,
            step_args(),
        );
        tracer.span(
            wt,
            "comm",
            "exposed comm",
            backward_end,
            t.update,
            step_args(),
        );
        tracer.span(wt, "update", "update", t.update, t.update_end, step_args());
        if t.ended > t.update_end {
            // Tree mode: worker 0's new weights go down the tree after its update.
            let name = "exposed comm (weight broadcast)";
            tracer.span(wt, "comm", name, t.update_end, t.ended, step_args());
        }
        let overlap = self.cfg.overlap;
        // Under priority scheduling the buckets that came back in this step are the last
        // step's, reduced under this step's forward.
        let reduced = match self.priority.active() {
            true => global.saturating_sub(1),
            false => global,
        };
        for span in self.reducer.bucket_spans() {
            let b = span.index;
            let args = json!({
                "bucket": b,
                "partition": span.partition,
                "mode": self.reducer.ops()[b].to_string(),
                "bytes": span.values * 4,
                "cpu_us": span.cpu.as_secs_f64() * 1e6,
                "global_step": reduced,
            });
            let name = format!("reduce bucket {b}");
            tracer.span_for(comm_tid(rank), "comm", name, span.started, span.busy, args);
            if span.partition > 0 {
                // The bucket's hand-off arrows belong to its first collective.
                continue;
            }
            if !overlap {
                // Without overlap every bucket is handed off when backward ends.
                tracer.flow(wt, flow_id(rank, global, b), backward_end, true);
            }
            tracer.flow(
                comm_tid(rank),
                flow_id(rank, reduced, b),
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

/// Runs backward into `reducer`. With an emulated device each block goes to the reducer when
/// the device would have written it, and backward ends when the device's would.
fn backward_into(
    net: &mut Net,
    reducer: &mut Reducer,
    device: Option<&EmulatedDevice>,
    started: Instant,
    on_done: &mut dyn FnMut(ExecDone) -> Result<(), String>,
) -> Result<(), String> {
    match device {
        Some(d) => {
            let mut sink = d.paced(reducer, started);
            let result = net.backward(&mut sink, on_done);
            EmulatedDevice::hold(started, d.backward());
            result
        }
        None => net.backward(reducer, on_done),
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
