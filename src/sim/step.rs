//! One simulated training step: every worker's timeline from the profile, the buckets and their
//! operations from the trainer's own rules, and the collectives on each worker's communication
//! thread through the engine.
//!
//! **The trainer's rules, not copies.** The bucket caps, the buckets and each bucket's
//! operation (flat or hierarchical, `auto`'s choice of mode per bucket from the cost model)
//! come from [`crate::plan`], asked with the [`PlanInputs`] the trainer would have on this
//! cluster ([`plan_inputs`]: hosts are processes, devices their workers) and the profile's
//! block sizes, exactly as the trainer asks with its own.
//!
//! **Stragglers.** With a compute spread `s` > 0, every worker's compute (forward, backward and
//! update alike) is scaled in each simulated step by its own draw from a log-normal with mean 1
//! and coefficient of variation `s` (seeded, so a configuration always gives the same figures),
//! and the result is the mean over `steps` such steps. A synchronous step waits for its slowest
//! worker, so this is what a measured spread costs at scale: the expected slowest of N draws
//! grows with N (about `1 + s * sqrt(2 ln N)` for small `s`). Up to
//! [`EXACT_STRAGGLER_WORKERS`] every worker is simulated with its own draw; past it a
//! symmetric schedule runs through one host with every worker at the slowest draw (close: the
//! slowest gates every collective).
//!
//! **Per-step overhead.** A step of more than one worker ends [`Topology::step_overhead`]
//! after its last collective (coordination that communication cannot hide); one worker has
//! nothing to coordinate.
//!
//! **Priority scheduling** (`--schedule priority`, [`crate::parallel::schedule`]). Each bucket
//! is cut into the trainer's partitions ([`crate::plan::partition_bytes`]); the partitions run
//! once in backward's order to time them, then in the order
//! [`crate::parallel::schedule::priority_order`] gives for those times (rank 0's rule on the
//! communication thread, in virtual time, without the jitter of a real step); and the step
//! is the steady state of the overlap with the next forward: from the end of backward, the
//! next forward runs block by block, each block once its bucket is back and its share of the
//! update is done, then backward again. Each partition is preceded, as in the trainer, by
//! rank 0's decision: the bucket's index down rank 0's tree (one value; its latency is what a
//! partition costs beyond its bytes); under a credit (`--credit-kb`) one decision, a list of
//! 64 values, names the next partitions up to the credit, which then run back to back.
//!
//! **PowerSGD** (`--compress powersgd:R`, [`crate::comm::powersgd`]). A bucket with a matrix
//! that gains runs its operation twice, with the trainer's round sizes
//! ([`crate::comm::powersgd::round_lens`]) for the matrices the trainer compresses (the
//! profile's, by [`crate::plan::powersgd_matrices`]), and its communication thread does the
//! arithmetic before, between and after the rounds at the measured
//! [`crate::comm::powersgd::PowerSgdRates`]. That arithmetic is charged to the communication
//! thread alone: on this machine it also takes a share of the workers' 2 cores, which the
//! model leaves out (docs/bench/compress.md). Under overlap a bucket's round 2 travels in the
//! next bucket's collective (its round 1, or the bucket whole; one collective of both, on the
//! same operation) where the plan says it pays (`plan::PlanInputs::powersgd_carries`), the
//! last bucket's alone, as the trainer pipelines them. Under `--schedule priority` a PowerSGD
//! bucket is one partition, as in the trainer's reducer: rank 0's decision, then its two
//! rounds.

use super::engine::{run, Segment};
use super::schedule::{compile, CompiledJob, Job, Ranks, MAX_EVENTS};
use super::topology::Topology;
use crate::comm::powersgd::{round_lens, PowerSgdRates};
use crate::comm::LinkModel;
use crate::measure::Profile;
use crate::parallel::{BucketOp, BucketPlan};
use crate::plan::{BucketFlags, CommChoice, CompressChoice, HierarchyChoice, PlanInputs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The most workers whose stragglers are simulated worker by worker, each at its own draw.
/// Past it, a symmetric schedule is simulated through one host with every worker at the
/// draw's slowest factor: the slowest worker's gradients gate every collective, so the step
/// is close to the exact one (tests/sim_defaults.rs: within 1% at 128 workers on a flat
/// ring), at the cost of one host's ranks instead of every rank's (at 1024 workers, the
/// difference between a fraction of a second and a refusal). Where workers share a NIC the
/// exact step can cost more: out of step, their messages contend for it (flat halving-doubling
/// of ResNet-50 on 8 hosts x 8 GPUs: 6% more with a 1.5% spread, where the slowest draw
/// alone costs about 3.5%).
pub const EXACT_STRAGGLER_WORKERS: usize = 64;

/// Per-worker compute variation (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stragglers {
    /// Coefficient of variation of one worker's compute per step (0: every worker alike).
    pub spread: f64,
    /// Seed of the draws.
    pub seed: u64,
    /// Steps simulated and averaged when `spread` > 0.
    pub steps: usize,
}

impl Stragglers {
    /// Every worker equally fast.
    pub const NONE: Stragglers = Stragglers {
        spread: 0.0,
        seed: 1,
        steps: 1,
    };
}

/// What varies between simulated configurations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConfig {
    /// The cluster.
    pub topology: Topology,
    /// Communication mode, or `auto` (mpi-native is refused: its messages are MPI's).
    pub comm: CommChoice,
    /// How each host's devices share a bucket's reduction (the trainer's `--hierarchical`).
    pub hierarchy: HierarchyChoice,
    /// Buckets start as soon as they are ready (on), or all after backward (off).
    pub overlap: bool,
    /// `--first-bucket-kb` and `--bucket-kb`, read by the trainer's rule
    /// ([`PlanInputs::bucket_caps`]: neither given, both caps follow the planning link and
    /// the cluster's collectives).
    pub buckets: BucketFlags,
    /// The link `--comm auto` plans for (`--link-bandwidth`/`--link-latency` of the run);
    /// `None`: the NIC's figures, or the intra-host link's on one host.
    pub planning_link: Option<LinkModel>,
    /// The link within a host the plan prices (routes and bucket caps); `None`: the
    /// topology's. A check against the trainer gives the trainer's, which plans on its
    /// assumed in-process link ([`crate::plan::IN_PROCESS_LINK`]) whatever the host measures.
    pub planning_intra: Option<LinkModel>,
    /// Per-worker compute variation.
    pub stragglers: Stragglers,
    /// How gradients travel (the trainer's `--compress`).
    pub compress: CompressChoice,
    /// When buckets are reduced (the trainer's `--schedule`).
    pub schedule: crate::parallel::Schedule,
    /// The trainer's `--partition-kb` (`None`: its default for the schedule).
    pub partition_kb: Option<usize>,
    /// The trainer's `--credit-kb` (`None`: one partition per decision).
    pub credit_kb: Option<usize>,
}

/// One simulated step (times in ms, means over the simulated steps).
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Whole step: until the last worker is done.
    pub step_ms: f64,
    /// Forward (mean over workers).
    pub forward_ms: f64,
    /// Backward (mean over workers).
    pub backward_ms: f64,
    /// Update (mean over the workers that update: the root only in tree mode).
    pub update_ms: f64,
    /// The last worker's step minus its own compute: communication that compute did not hide,
    /// and waiting for slower workers (tree mode: with the weight broadcast).
    pub exposed_ms: f64,
    /// Time the busiest communication thread spent in collectives.
    pub comm_ms: f64,
    /// Bucket sizes in bytes, in the order they become ready.
    pub bucket_bytes: Vec<usize>,
    /// Each bucket's operation, as the trainer chooses it.
    pub bucket_ops: Vec<BucketOp>,
    /// Ranks the engine simulated: one host's with a symmetric schedule, else all.
    pub simulated_ranks: usize,
}

/// What the plan of `cfg`'s cluster depends on, as the trainer would see it: hosts are
/// processes, devices their workers, the link planned for is the one given, else the NIC
/// between hosts (within a host when there is one), and the devices' ports are the link within
/// a process.
pub fn plan_inputs(cfg: &StepConfig) -> PlanInputs {
    let topo = &cfg.topology;
    PlanInputs {
        comm: cfg.comm,
        hierarchy: cfg.hierarchy,
        processes: topo.hosts,
        workers_per_process: topo.devices_per_host,
        link: Some(
            cfg.planning_link
                .unwrap_or(if topo.hosts > 1 { topo.nic } else { topo.intra }),
        ),
        intra_link: Some(cfg.planning_intra.unwrap_or(topo.intra)),
        buckets: cfg.buckets,
        schedule: cfg.schedule,
        partition_kb: cfg.partition_kb,
        compress: cfg.compress,
        // Devices, not threads: the link is always given, so nothing is priced as memory work.
        cores: 1,
    }
}

/// The buckets and their operations the trainer would use for `profile` under `cfg`.
pub fn plan(profile: &Profile, cfg: &StepConfig) -> Result<(BucketPlan, Vec<BucketOp>), String> {
    if cfg.comm == CommChoice::Native {
        return Err(
            "--comm mpi-native runs MPI's own all-reduce, whose messages are MPI's and not \
             ours to simulate: choose tree, ring, hd, redundant or auto"
                .into(),
        );
    }
    let order =
        crate::parallel::schedule::order_refusal(cfg.schedule, cfg.partition_kb, cfg.credit_kb);
    if let Some(why) = order {
        return Err(why);
    }
    if cfg.comm == CommChoice::Fixed(crate::comm::CommMode::Tree) {
        if let Some(why) = cfg.compress.tree_refusal() {
            return Err(why);
        }
    }
    if cfg.schedule == crate::parallel::Schedule::Priority {
        let tree = cfg.comm == CommChoice::Fixed(crate::comm::CommMode::Tree);
        if let Some(why) = crate::parallel::schedule::priority_refusal(cfg.overlap, tree, false) {
            return Err(why);
        }
    }
    if cfg.comm == CommChoice::SharedMemory {
        return Err(
            "--comm shm reads the other workers' buffers in place, and the simulator's devices \
             share no memory: choose tree, ring, hd, redundant or auto"
                .into(),
        );
    }
    let planning = plan_inputs(cfg);
    let lens: Vec<usize> = profile
        .block_sizes()
        .iter()
        .map(|s| s.iter().sum())
        .collect();
    let plan = planning.bucket_plan(&lens);
    let ops = planning.bucket_ops(&plan);
    Ok((plan, ops))
}

/// Simulates steps, keeping the compiled schedules between calls (a schedule depends on the
/// job and the cluster's shape only, not on bucket sizes or links), so sweeps over bucket caps
/// or links record each algorithm once.
#[derive(Debug, Default)]
pub struct Simulator {
    cache: Vec<(Ranks, CompiledJob)>,
    every_rank: bool,
}

impl Simulator {
    /// A simulator with nothing compiled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Never takes the symmetric shortcut: simulates every rank, to check the shortcut.
    pub fn every_rank(mut self) -> Self {
        self.every_rank = true;
        self
    }

    fn compiled(&mut self, job: Job, topo: &Topology, ranks: Ranks) -> Result<usize, String> {
        let found = self.cache.iter().position(|(r, c)| {
            // A job compiled without symmetry serves both.
            (*r == ranks || c.symmetry.is_none())
                && c.job == job
                && c.hosts == topo.hosts
                && c.devices_per_host == topo.devices_per_host
        });
        if let Some(i) = found {
            return Ok(i);
        }
        let c = compile(job, topo, ranks, MAX_EVENTS)?;
        self.cache.push((ranks, c));
        Ok(self.cache.len() - 1)
    }

    /// Simulates one step of `profile` under `cfg` (see the module docs).
    pub fn step(&mut self, profile: &Profile, cfg: &StepConfig) -> Result<StepResult, String> {
        let topo = cfg.topology;
        topo.validate()?;
        let st = cfg.stragglers;
        if !(st.spread >= 0.0 && st.spread.is_finite()) || st.steps == 0 {
            return Err(format!(
                "the compute spread must be a number >= 0 and the steps at least 1, not {} and {}",
                st.spread, st.steps
            ));
        }
        // Compiled schedules are kept for the next steps, within the budget of one step: past
        // it they are dropped here, before this step takes indices into the cache.
        let held: usize = self.cache.iter().map(|(_, c)| c.steps.len()).sum();
        if held > MAX_EVENTS {
            self.cache.clear();
        }
        let (plan, ops) = plan(profile, cfg)?;
        let wires = plan_inputs(cfg).bucket_wires(&plan, &ops);
        let bytes: Vec<usize> = plan.buckets.iter().map(|b| b.len * 4).collect();
        let root_updates = ops.contains(&BucketOp::ReduceToRoot);
        let mut jobs: Vec<Job> = ops
            .iter()
            .zip(&wires)
            .map(|(&op, &w)| Job::Bucket(op, w))
            .collect();
        let priority = cfg.schedule == crate::parallel::Schedule::Priority;
        // Tree mode's weights, or priority's decisions: both are rank 0's tree broadcast
        // (priority refuses tree mode, so a step has one or the other).
        if root_updates || priority {
            jobs.push(Job::WeightBroadcast);
        }
        let powersgd = match cfg.compress.powersgd_rank() {
            Some(rank) => powersgd_rounds(profile, (&plan, &ops), &plan_inputs(cfg), rank)?,
            None => vec![None; bytes.len()],
        };
        let idx = self.compiled_jobs(&jobs, &topo, st, bytes.len())?;
        let partition_bytes = plan_inputs(cfg).partition_bytes();
        let planned = PlannedStep {
            profile,
            topo,
            overlap: cfg.overlap,
            priority,
            partition: partition_bytes / 4,
            credit: crate::parallel::schedule::credit_values(cfg.credit_kb),
            bucket_of_block: plan.slots.iter().map(|s| s.bucket).collect(),
            sim_ranks: idx.first().map_or(1, |&i| self.cache[i].1.ranks),
            total_bytes: bytes.iter().sum::<usize>() as f64,
            ready_after: plan.buckets.iter().map(|b| b.ready_after_block()).collect(),
            written_s: profile
                .backward_written_ms()
                .iter()
                .map(|ms| ms / 1e3)
                .collect(),
            bytes,
            powersgd,
            jobs,
            idx,
            root_updates,
            forward_s: profile.forward_ms() / 1e3,
            update_s: profile.update_ms / 1e3,
        };
        // (One worker sends nothing: no jobs, nothing to partition.)
        let events = if planned.priority && !planned.idx.is_empty() {
            planned.check_priority_size(&self.cache)?
        } else {
            planned
                .idx
                .iter()
                .map(|&i| self.cache[i].1.steps.len())
                .sum()
        };
        let draws = if st.spread > 0.0 { st.steps } else { 1 };
        // Stragglers on a schedule simulated through one host (past EXACT_STRAGGLER_WORKERS):
        // every simulated worker runs at the draw's slowest factor of all the workers, each
        // drawn (counted with the messages: a million draws a step cost as much).
        let slowest = st.spread > 0.0 && planned.sim_ranks < topo.workers();
        let drawn = if slowest { topo.workers() } else { 0 };
        check_configuration_work(events.saturating_add(drawn), draws, topo.workers())?;
        let mut acc = Acc::default();
        for draw in 0..draws {
            let factors = if slowest {
                let all = compute_factors(topo.workers(), st, draw);
                vec![all.iter().cloned().fold(0.0, f64::max); planned.sim_ranks]
            } else {
                compute_factors(planned.sim_ranks, st, draw)
            };
            planned.simulate_draw(&self.cache, &factors, &mut acc)?;
        }
        let k = draws as f64;
        Ok(StepResult {
            step_ms: acc.step / k * 1e3,
            forward_ms: acc.forward / k * 1e3,
            backward_ms: acc.backward / k * 1e3,
            update_ms: acc.update / k * 1e3,
            exposed_ms: acc.exposed / k * 1e3,
            comm_ms: acc.comm / k * 1e3,
            bucket_bytes: planned.bytes,
            bucket_ops: ops,
            simulated_ranks: planned.sim_ranks,
        })
    }

    /// Each job compiled for `topo` (indices into the cache): for one host's ranks if every
    /// job is symmetric and the workers alike (or stragglers past
    /// [`EXACT_STRAGGLER_WORKERS`]), else for every rank. None on one worker.
    /// Refuses a step of more than [`MAX_EVENTS`] messages.
    fn compiled_jobs(
        &mut self,
        jobs: &[Job],
        topo: &Topology,
        st: Stragglers,
        buckets: usize,
    ) -> Result<Vec<usize>, String> {
        let world = topo.workers();
        let mut idx = Vec::with_capacity(jobs.len());
        if world == 1 {
            return Ok(idx);
        }
        let exact_stragglers = st.spread > 0.0 && world <= EXACT_STRAGGLER_WORKERS;
        if !exact_stragglers && !self.every_rank {
            for &job in jobs {
                idx.push(self.compiled(job, topo, Ranks::Symmetric)?);
            }
        }
        let r0 = idx.first().map(|&i| self.cache[i].1.ranks);
        if idx.is_empty() || idx.iter().any(|&i| Some(self.cache[i].1.ranks) != r0) {
            // A job without symmetry (or stragglers) needs every rank, so all jobs do.
            idx.clear();
            for &job in jobs {
                idx.push(self.compiled(job, topo, Ranks::All)?);
            }
        }
        let events: usize = idx.iter().map(|&i| self.cache[i].1.steps.len()).sum();
        if events > MAX_EVENTS {
            return Err(format!(
                "{world} workers ({} hosts x {}) with {buckets} buckets: one step is {events} \
                 simulated messages, over the limit of {MAX_EVENTS} (a few seconds of \
                 simulation); simulate fewer workers or fewer buckets (a larger --bucket-kb)",
                topo.hosts, topo.devices_per_host,
            ));
        }
        Ok(idx)
    }
}

/// Most partitions of one step the simulator orders under `--schedule priority` (see
/// `PlannedStep::check_priority_size`): 16 Ki partitions (a 4 GB gradient in 256 KiB ones,
/// 2 workers) took 3.2-3.6 s for `simulate`'s 20 seeded steps on this 2-core machine
/// (2026-12-07), 4x as many did not finish in 2 minutes; far more than any published
/// partitioning needs (P3's 40,000-parameter slices cut VGG-19's 143 M parameters into about
/// 3,600).
pub const MAX_PRIORITY_PARTITIONS: usize = 16_384;

/// The most messages one configuration may simulate over all its straggler draws: the
/// largest step ([`MAX_EVENTS`]) at `simulate`'s default 20 steps. The per-step limit alone
/// let `--steps` multiply it (100,000 workers of tree mode at `--steps 10000` ran for about
/// 40 minutes); at this machine's about 2 million messages a second (100,000 workers of tree
/// mode, 2.2 million messages a step, 20 steps: 21 s on 2026-12-07) this is about 3 minutes.
pub const MAX_CONFIGURATION_EVENTS: usize = MAX_EVENTS * 20;

/// Refuses a configuration whose `draws` steps of `events` messages (and straggler draws)
/// each pass [`MAX_CONFIGURATION_EVENTS`], naming the steps that fit.
fn check_configuration_work(events: usize, draws: usize, workers: usize) -> Result<(), String> {
    let total = events.saturating_mul(draws);
    if total <= MAX_CONFIGURATION_EVENTS {
        return Ok(());
    }
    let fit = MAX_CONFIGURATION_EVENTS / events.max(1);
    let remedy = match fit {
        0 => "give --compute-spread 0 (one step), or simulate fewer workers".to_string(),
        _ => format!(
            "give --steps {fit} or fewer (or --compute-spread 0, one step), or simulate fewer \
             workers"
        ),
    };
    Err(format!(
        "{workers} workers: one step is {events} simulated messages and straggler draws, and \
         {draws} steps (--steps) would simulate {total}, over the limit of \
         {MAX_CONFIGURATION_EVENTS} a configuration (minutes of simulation): {remedy}"
    ))
}

/// What every simulated step of one configuration shares: the profile, the buckets, their
/// jobs and compiled schedules.
struct PlannedStep<'p> {
    profile: &'p Profile,
    topo: Topology,
    overlap: bool,
    /// `--schedule priority`: partitions input-first, the next forward gated per block.
    priority: bool,
    /// Values per partition (0: whole buckets).
    partition: usize,
    /// Values one decision commits to under priority (0: one partition).
    credit: usize,
    /// The bucket of each block.
    bucket_of_block: Vec<usize>,
    /// Ranks the engine simulates.
    sim_ranks: usize,
    /// Each bucket's bytes, in the order they become ready.
    bytes: Vec<usize>,
    /// Each bucket's PowerSGD rounds (`--compress powersgd:R`; `None`: sent whole).
    powersgd: Vec<Option<PowerSgdRounds>>,
    /// Every bucket's bytes: what tree mode's weight broadcast sends.
    total_bytes: f64,
    /// The block whose writing completes each bucket (its lowest: `written_s` rises as the
    /// block index falls, since a block's input gradient is part of its own backward).
    ready_after: Vec<usize>,
    /// Per block, s from the start of backward until it is written
    /// ([`crate::measure::Profile::backward_written_ms`]).
    written_s: Vec<f64>,
    /// One job per bucket, then the weight broadcast with root updates.
    jobs: Vec<Job>,
    /// Each job's compiled schedule in the simulator's cache (empty on one worker).
    idx: Vec<usize>,
    /// Tree mode: the root updates and broadcasts the weights.
    root_updates: bool,
    forward_s: f64,
    update_s: f64,
}

impl PlannedStep<'_> {
    /// Whether simulated rank `r` runs the update (all do, but the root alone in tree mode).
    fn updates(&self, r: usize) -> bool {
        !self.root_updates || r == 0
    }

    /// Simulated rank `r`'s update at compute factor `factors[r]`, s (0 if it does not update).
    fn update_of(&self, r: usize, factors: &[f64]) -> f64 {
        if self.updates(r) {
            self.update_s * factors[r]
        } else {
            0.0
        }
    }

    /// Each rank's end of backward, and per bucket when it is ready on each rank (when its
    /// last block is written with overlap, the end of the whole backward without), s.
    fn backward(&self, factors: &[f64]) -> (Vec<f64>, Vec<Vec<f64>>) {
        let mut bwd_end = Vec::with_capacity(self.sim_ranks);
        let mut ready: Vec<Vec<f64>> = vec![Vec::with_capacity(self.sim_ranks); self.bytes.len()];
        let whole = self.profile.backward_ms() / 1e3;
        for &f in factors {
            let start = self.forward_s * f;
            let end = start + whole * f;
            bwd_end.push(end);
            for (b, &k) in self.ready_after.iter().enumerate() {
                ready[b].push(if self.overlap {
                    start + self.written_s[k] * f
                } else {
                    end
                });
            }
        }
        (bwd_end, ready)
    }

    /// Each rank's end of communication: the jobs run through the engine from their ready
    /// times; the busiest communication thread's time is added to `acc`.
    fn communication(
        &self,
        cache: &[(Ranks, CompiledJob)],
        factors: &[f64],
        bwd_end: &[f64],
        mut ready: Vec<Vec<f64>>,
        acc: &mut Acc,
    ) -> Result<Vec<f64>, String> {
        let mut segments: Vec<Segment> = Vec::with_capacity(self.jobs.len() + 2);
        // PowerSGD's round 2 waiting to travel in the next bucket's round 1, as the trainer's
        // communication thread pipelines them (`parallel::reducer`'s `InOrder`).
        let mut pending: Option<PendingRound> = None;
        for (b, (&i, job)) in self.idx.iter().zip(&self.jobs).enumerate() {
            if let Some(rounds) = self.powersgd.get(b).copied().flatten() {
                let ready = std::mem::take(&mut ready[b]);
                segments.extend(self.powersgd_round_one(cache, i, rounds, ready.clone(), pending));
                let round = PendingRound {
                    job: i,
                    rounds,
                    ready,
                };
                pending = match rounds.carry {
                    true => Some(round),
                    false => {
                        segments.push(self.round_two_alone(cache, round));
                        None
                    }
                };
                continue;
            }
            // A waiting round 2 travels in this bucket's collective if it is of the same
            // operation (with its product after), else alone before it.
            let carried = match pending.take() {
                Some(p) if p.job == i => Some(p.rounds),
                Some(p) => {
                    let next = ready.get(b).map_or(&[][..], Vec::as_slice);
                    segments.push(self.round_two_alone(cache, p.until(next)));
                    None
                }
                None => None,
            };
            let (carried_bytes, carried_after) = carried_round_two(carried);
            segments.push({
                let is_broadcast = *job == Job::WeightBroadcast;
                Segment {
                    job: &cache[i].1,
                    bytes: if is_broadcast {
                        self.total_bytes
                    } else {
                        self.bytes[b] as f64 + carried_bytes
                    },
                    ready: if is_broadcast {
                        bwd_end.to_vec()
                    } else {
                        std::mem::take(&mut ready[b])
                    },
                    // Caffe's scheme: the root updates once every bucket is reduced,
                    // then its new weights go down the tree.
                    before: if is_broadcast {
                        (0..self.sim_ranks)
                            .map(|r| self.update_of(r, factors))
                            .collect()
                    } else {
                        Vec::new()
                    },
                    arithmetic: match carried {
                        Some(_) => [Vec::new(), vec![carried_after; self.sim_ranks]],
                        None => [Vec::new(), Vec::new()],
                    },
                }
            });
        }
        segments.extend(pending.map(|p| self.round_two_alone(cache, p)));
        // An empty bucket sends nothing (the algorithms return at once).
        segments.retain(|s| s.bytes > 0.0);
        let times = run(&segments, &self.topo)?;
        acc.comm += times.busy.iter().cloned().fold(0.0, f64::max);
        Ok(times.end)
    }

    /// A PowerSGD bucket's round 1 on job `job`, carrying `pending`'s round 2 where that is
    /// on the same job (one collective; else `pending`'s round 2 first, alone), with the
    /// arithmetic the trainer's communication thread does around each collective.
    fn powersgd_round_one<'c>(
        &self,
        cache: &'c [(Ranks, CompiledJob)],
        job: usize,
        rounds: PowerSgdRounds,
        ready: Vec<f64>,
        pending: Option<PendingRound>,
    ) -> Vec<Segment<'c>> {
        let per_rank = |s: f64| vec![s; self.sim_ranks];
        let c = rounds.compute;
        let (mut segments, carried) = match pending {
            Some(p) if p.job == job => (Vec::new(), Some(p.rounds)),
            // Sent alone when this bucket arrives, as the trainer's thread does.
            Some(p) => (vec![self.round_two_alone(cache, p.until(&ready))], None),
            None => (Vec::new(), None),
        };
        let (carried_bytes, carried_after) = carried_round_two(carried);
        segments.push(Segment {
            job: &cache[job].1,
            bytes: rounds.bytes[0] + carried_bytes,
            ready,
            before: Vec::new(),
            arithmetic: [per_rank(c[0]), per_rank(c[1] + carried_after)],
        });
        segments
    }

    /// A PowerSGD bucket's round 2 in a collective of its own, then its product.
    fn round_two_alone<'c>(
        &self,
        cache: &'c [(Ranks, CompiledJob)],
        p: PendingRound,
    ) -> Segment<'c> {
        Segment {
            job: &cache[p.job].1,
            bytes: p.rounds.bytes[1],
            ready: p.ready,
            before: Vec::new(),
            arithmetic: [Vec::new(), vec![p.rounds.compute[2]; self.sim_ranks]],
        }
    }

    /// The partitions of one step under priority scheduling: how many each bucket is cut
    /// into (a PowerSGD bucket is one, its two rounds reduce its matrices whole, as in the
    /// trainer's reducer).
    fn partition_counts(&self) -> Vec<usize> {
        use crate::parallel::schedule::partition_count;
        (0..self.bytes.len())
            .map(|b| match self.powersgd[b] {
                Some(_) => 1,
                None => partition_count(self.bytes[b] / 4, self.partition),
            })
            .collect()
    }

    /// Refuses a priority step the simulator cannot play in seconds: more than
    /// [`MAX_PRIORITY_PARTITIONS`] partitions (their order is decided in time quadratic in
    /// their count), or more than [`MAX_EVENTS`] messages once each partition's collective is
    /// counted (the check of [`Simulator::compiled_jobs`] counts each bucket's once). Either
    /// ran for minutes, and held a time per partition and simulated rank until memory ran out
    /// (a 4 GB gradient in 16 KiB partitions on 1024 workers).
    /// Returns the step's simulated messages.
    fn check_priority_size(&self, cache: &[(Ranks, CompiledJob)]) -> Result<usize, String> {
        let parts = self.partition_counts();
        let units: usize = parts.iter().sum();
        let decision = cache[*self.idx.last().expect("the decisions' broadcast")]
            .1
            .steps
            .len();
        let events: usize = parts
            .iter()
            .enumerate()
            .map(|(b, &n)| n.saturating_mul(cache[self.idx[b]].1.steps.len() + decision))
            .fold(0, usize::saturating_add);
        let total_kib = (self.total_bytes / 1024.0).ceil() as usize;
        let floor_kib = total_kib.div_ceil(MAX_PRIORITY_PARTITIONS).max(1);
        if units > MAX_PRIORITY_PARTITIONS {
            return Err(format!(
                "--schedule priority: one step is {units} partitions of a {total_kib} KiB \
                 gradient, over the simulator's limit of {MAX_PRIORITY_PARTITIONS}: give \
                 --partition-kb {floor_kib} or more"
            ));
        }
        if events > MAX_EVENTS {
            return Err(format!(
                "--schedule priority on {} workers: one step is {events} simulated messages \
                 ({units} partitions), over the limit of {MAX_EVENTS} (a few seconds of \
                 simulation); simulate fewer workers or larger partitions (--partition-kb)",
                self.topo.workers()
            ));
        }
        Ok(events)
    }

    /// Priority scheduling: when each bucket is back on each simulated rank (`[bucket][rank]`),
    /// its partitions run input-first (see the module docs); the busiest communication
    /// thread's time is added to `acc`.
    fn priority_communication(
        &self,
        cache: &[(Ranks, CompiledJob)],
        ready: &[Vec<f64>],
        acc: &mut Acc,
    ) -> Result<Vec<Vec<f64>>, String> {
        use crate::parallel::schedule::{partition_range, priority_order, StepPartitions};
        let parts = self.partition_counts();
        // Every partition that sends anything, buckets in backward's order and each bucket's
        // partitions in buffer order (the later, the nearer the input).
        let units: Vec<Unit> = (0..self.bytes.len())
            .filter(|&b| self.bytes[b] > 0)
            .flat_map(|b| {
                let parts = parts[b];
                (0..parts).map(move |p| Unit {
                    bucket: b,
                    values: partition_range(self.bytes[b] / 4, parts, p).len(),
                })
            })
            .collect();
        // Timed once in backward's order, each partition decided alone, then run in the
        // priority order of those times.
        let (first, last) = self.unit_segments(cache, ready, units.iter().map(|u| (u, true)));
        let timed = run(&first, &self.topo)?;
        let mut free = 0.0f64;
        let (mut at, mut took) = (Vec::new(), Vec::new());
        for (u, unit) in units.iter().enumerate() {
            let start = free.max(ready[unit.bucket][0]);
            free = timed.segment_end[last[u]][0];
            at.push(ready[unit.bucket][0]);
            took.push(free - start);
        }
        let sizes: Vec<usize> = units.iter().map(|u| u.values).collect();
        let buckets: Vec<usize> = units.iter().map(|u| u.bucket).collect();
        let needed = self.forward_needs();
        let partitions = StepPartitions {
            ready: &at,
            busy: &took,
            values: &sizes,
            bucket: &buckets,
            needed: &needed,
        };
        let priority = priority_order(&partitions, self.credit);
        let in_order =
            (priority.order.iter().zip(&priority.decides)).map(|(&u, &d)| (&units[u], d));
        let (ordered, last) = self.unit_segments(cache, ready, in_order);
        let times = run(&ordered, &self.topo)?;
        acc.comm += times.busy.iter().cloned().fold(0.0, f64::max);
        // A bucket is back when its last partition is; an empty one when it is ready.
        let mut back: Vec<Vec<f64>> = (0..self.bytes.len())
            .map(|b| match self.bytes[b] {
                0 => ready[b].clone(),
                _ => vec![f64::NEG_INFINITY; self.sim_ranks],
            })
            .collect();
        for (i, &u) in priority.order.iter().enumerate() {
            let b = units[u].bucket;
            for (r, &end) in times.segment_end[last[i]].iter().enumerate() {
                back[b][r] = back[b][r].max(end);
            }
        }
        Ok(back)
    }

    /// The engine's segments for `units` in order, each after rank 0's decision where it
    /// decides, and the index of each unit's last segment. A decision is rank 0's broadcast
    /// down its tree (as the trainer's `PriorityStep` announces it) of one value, or, under a
    /// credit, of a list of partitions; a PowerSGD bucket is its two rounds with the
    /// arithmetic around them, as under overlap.
    fn unit_segments<'c, 'u>(
        &self,
        cache: &'c [(Ranks, CompiledJob)],
        ready: &[Vec<f64>],
        units: impl Iterator<Item = (&'u Unit, bool)>,
    ) -> (Vec<Segment<'c>>, Vec<usize>) {
        let decision = &cache[*self.idx.last().expect("the decisions' broadcast")].1;
        let decision_bytes = 4.0 * crate::parallel::schedule::decision_len(self.credit) as f64;
        let per_rank = |s: f64| vec![s; self.sim_ranks];
        let (mut segments, mut last) = (Vec::new(), Vec::new());
        for (unit, decides) in units {
            let (b, ready) = (unit.bucket, &ready[unit.bucket]);
            let segment = |job, bytes, arithmetic| Segment {
                job,
                bytes,
                ready: ready.clone(),
                before: Vec::new(),
                arithmetic,
            };
            if decides {
                segments.push(segment(decision, decision_bytes, [Vec::new(), Vec::new()]));
            }
            let job = &cache[self.idx[b]].1;
            match self.powersgd[b] {
                Some(rounds) => {
                    let c = rounds.compute;
                    segments.push(segment(job, rounds.bytes[0], [per_rank(c[0]), Vec::new()]));
                    segments.push(segment(
                        job,
                        rounds.bytes[1],
                        [per_rank(c[1]), per_rank(c[2])],
                    ));
                }
                None => {
                    let bytes = 4.0 * unit.values as f64;
                    segments.push(segment(job, bytes, [Vec::new(), Vec::new()]));
                }
            }
            last.push(segments.len() - 1);
        }
        (segments, last)
    }

    /// When the gated forward needs each bucket, s from its first gate, with every bucket back
    /// in time (the trainer's `ForwardNeeds`; at compute factor 1).
    fn forward_needs(&self) -> Vec<f64> {
        let total: usize = self.bytes.iter().sum::<usize>().max(1);
        let mut needed = vec![f64::INFINITY; self.bytes.len()];
        let (mut t, mut first_gate) = (0.0f64, None);
        for (k, block) in self.profile.blocks.iter().enumerate() {
            let bytes = block.grad_bytes();
            if bytes > 0 {
                let origin = *first_gate.get_or_insert(t);
                let b = self.bucket_of_block[k];
                needed[b] = needed[b].min(t - origin);
                t += self.update_s * bytes as f64 / total as f64;
            }
            t += block.forward_ms / 1e3;
        }
        needed
    }

    /// Priority scheduling, rank `r` at compute factor `f`: the step in steady state, from the
    /// end of one backward to the end of the next, s: the next forward, each block once its
    /// bucket is back (`back[bucket]`, in this step's time) and its share of the update done,
    /// then backward.
    fn gated_step(&self, r: usize, f: f64, bwd_end: f64, back: &[Vec<f64>]) -> f64 {
        let total: usize = self.bytes.iter().sum::<usize>().max(1);
        let mut t = bwd_end;
        for (k, block) in self.profile.blocks.iter().enumerate() {
            let bytes = block.grad_bytes();
            if bytes > 0 {
                let update = self.update_s * bytes as f64 / total as f64 * f;
                t = t.max(back[self.bucket_of_block[k]][r]) + update;
            }
            t += block.forward_ms / 1e3 * f;
        }
        (t - bwd_end) + (bwd_end - self.forward_s * f)
    }

    /// One simulated step at compute factors `factors` (one per simulated rank), added to
    /// `acc`.
    fn simulate_draw(
        &self,
        cache: &[(Ranks, CompiledJob)],
        factors: &[f64],
        acc: &mut Acc,
    ) -> Result<(), String> {
        let world = self.topo.workers();
        let (bwd_end, ready) = self.backward(factors);
        if self.priority && world > 1 {
            return self.simulate_priority_draw(cache, factors, &bwd_end, &ready, acc);
        }
        let end: Vec<f64> = if world == 1 {
            bwd_end.clone()
        } else {
            self.communication(cache, factors, &bwd_end, ready, acc)?
        };
        // A worker is done when its last collective is back and its backward is over, and
        // the step's fixed coordination cost after it, then it updates (in tree mode the
        // root's update and the broadcast are in the segments).
        let coordination = if world > 1 {
            self.topo.step_overhead.as_secs_f64()
        } else {
            0.0
        };
        let mut step = 0.0f64;
        let mut last = 0;
        for r in 0..self.sim_ranks {
            let done = end[r].max(bwd_end[r])
                + coordination
                + if self.root_updates && world > 1 {
                    0.0
                } else {
                    self.update_of(r, factors)
                };
            if done > step {
                step = done;
                last = r;
            }
        }
        let compute_last = bwd_end[last] + self.update_of(last, factors);
        acc.step += step;
        acc.exposed += (step - compute_last).max(0.0);
        let n = self.sim_ranks as f64;
        let fwd = self.forward_s;
        acc.forward += factors.iter().map(|f| fwd * f).sum::<f64>() / n;
        acc.backward +=
            bwd_end.iter().sum::<f64>() / n - factors.iter().map(|f| fwd * f).sum::<f64>() / n;
        let updaters: Vec<f64> = (0..self.sim_ranks)
            .filter(|&r| self.updates(r))
            .map(|r| self.update_of(r, factors))
            .collect();
        acc.update += updaters.iter().sum::<f64>() / updaters.len().max(1) as f64;
        Ok(())
    }
}

impl PlannedStep<'_> {
    /// [`PlannedStep::simulate_draw`] under priority scheduling: the step is the slowest
    /// rank's [`PlannedStep::gated_step`] and the coordination after its collectives.
    fn simulate_priority_draw(
        &self,
        cache: &[(Ranks, CompiledJob)],
        factors: &[f64],
        bwd_end: &[f64],
        ready: &[Vec<f64>],
        acc: &mut Acc,
    ) -> Result<(), String> {
        let back = self.priority_communication(cache, ready, acc)?;
        let coordination = self.topo.step_overhead.as_secs_f64();
        let n = self.sim_ranks as f64;
        let (mut step, mut compute_last) = (0.0f64, 0.0);
        for (r, &f) in factors.iter().enumerate() {
            let s = self.gated_step(r, f, bwd_end[r], &back) + coordination;
            if s > step {
                step = s;
                compute_last = bwd_end[r] + self.update_s * f;
            }
        }
        acc.step += step;
        acc.exposed += (step - compute_last).max(0.0);
        let fwd = self.forward_s;
        acc.forward += factors.iter().map(|f| fwd * f).sum::<f64>() / n;
        acc.backward +=
            bwd_end.iter().sum::<f64>() / n - factors.iter().map(|f| fwd * f).sum::<f64>() / n;
        acc.update += factors.iter().map(|f| self.update_s * f).sum::<f64>() / n;
        Ok(())
    }
}

/// One bucket's PowerSGD rounds: what each sends and the communication thread's arithmetic
/// before round 1, between the rounds and after round 2.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PowerSgdRounds {
    /// Bytes of round 1 (the plain values and every P) and round 2 (every Q).
    bytes: [f64; 2],
    /// Seconds of the three phases ([`PowerSgdRates::MEASURED`]).
    compute: [f64; 3],
    /// Under overlap, round 2 travels in the next bucket's collective (the plan's
    /// [`crate::plan::PlanInputs::powersgd_carries`], as the trainer's).
    carry: bool,
}

/// The bytes and the product's arithmetic (s) a round 2 adds to the collective it travels in.
fn carried_round_two(carried: Option<PowerSgdRounds>) -> (f64, f64) {
    carried.map_or((0.0, 0.0), |p| (p.bytes[1], p.compute[2]))
}

/// A PowerSGD bucket between its rounds, under overlap: its job, rounds and ready times.
struct PendingRound {
    job: usize,
    rounds: PowerSgdRounds,
    ready: Vec<f64>,
}

impl PendingRound {
    /// The round, not to start before `next` (the bucket whose arrival sends it: the
    /// trainer's communication thread takes a waiting round 2 up when the next bucket comes).
    fn until(mut self, next: &[f64]) -> Self {
        for (r, &n) in self.ready.iter_mut().zip(next) {
            *r = r.max(n);
        }
        self
    }
}

/// One collective of priority scheduling: a partition of `bucket` (a PowerSGD bucket whole).
struct Unit {
    bucket: usize,
    /// The values it reduces.
    values: usize,
}

/// Each bucket's rounds under `--compress powersgd:R`, from the trainer's rule of which
/// matrices it compresses ([`crate::plan::powersgd_matrices`]) and the profile's matrices;
/// `None` for a bucket without one that gains (sent whole, as the trainer does).
fn powersgd_rounds(
    profile: &Profile,
    (plan, ops): (&BucketPlan, &[BucketOp]),
    planning: &crate::plan::PlanInputs,
    rank: usize,
) -> Result<Vec<Option<PowerSgdRounds>>, String> {
    let blocks: Vec<_> = profile
        .blocks
        .iter()
        .map(|b| b.matrices.clone())
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!(
                "--compress powersgd:{rank}: the profile of {} does not list its weight \
                 matrices (written before they were recorded), and PowerSGD's bytes depend on \
                 them: write it again with dptrain profile",
                profile.model
            )
        })?;
    if let Some(why) = crate::plan::powersgd_refusal(&blocks, rank) {
        return Err(why);
    }
    let per_bucket = crate::plan::powersgd_matrices(plan, &blocks, rank);
    let carries = planning.powersgd_carries(plan, ops, &per_bucket, rank);
    Ok(per_bucket
        .iter()
        .zip(&plan.buckets)
        .zip(carries)
        .map(|((matrices, bucket), carry)| {
            (!matrices.is_empty()).then(|| {
                let (first, second) = round_lens(bucket.len, matrices, rank);
                let values = matrices.iter().map(|m| m.rows * m.cols).sum();
                PowerSgdRounds {
                    bytes: [4.0 * first as f64, 4.0 * second as f64],
                    compute: PowerSgdRates::MEASURED.seconds(values, rank),
                    carry,
                }
            })
        })
        .collect())
}

/// Sums over the simulated steps.
#[derive(Default)]
struct Acc {
    step: f64,
    forward: f64,
    backward: f64,
    update: f64,
    exposed: f64,
    comm: f64,
}

/// Each simulated rank's compute factor in simulated step `draw`: 1 without spread, else a
/// log-normal draw with mean 1 and coefficient of variation `spread`.
fn compute_factors(ranks: usize, st: Stragglers, draw: usize) -> Vec<f64> {
    if st.spread == 0.0 {
        return vec![1.0; ranks];
    }
    let sigma2 = (1.0 + st.spread * st.spread).ln();
    let (sigma, mu) = (sigma2.sqrt(), -sigma2 / 2.0);
    let mut rng =
        ChaCha8Rng::seed_from_u64(st.seed ^ (draw as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..ranks)
        .map(|_| {
            // Box-Muller: one standard normal from two uniforms in (0, 1].
            let u1: f64 = 1.0 - rng.gen::<f64>();
            let u2: f64 = rng.gen::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (mu + sigma * z).exp()
        })
        .collect()
}

/// Simulates one step of `profile` under `cfg` (a [`Simulator`] for one call).
pub fn simulate_step(profile: &Profile, cfg: &StepConfig) -> Result<StepResult, String> {
    Simulator::new().step(profile, cfg)
}

/// The bucket caps (KiB) `--search-buckets` tries; 0 is one block per bucket and the last is
/// "everything in one bucket".
pub const SEARCH_CAPS_KB: [usize; 10] = [0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 30];

/// Tries each cap of [`SEARCH_CAPS_KB`] (the first bucket's cap as in `cfg`, or the same) and
/// returns the fastest `(cap_kb, result)`.
pub fn search_buckets(
    sim: &mut Simulator,
    profile: &Profile,
    cfg: &StepConfig,
) -> Result<(usize, StepResult), String> {
    let mut best: Option<(usize, StepResult)> = None;
    let mut first_refusal = None;
    for &kb in &SEARCH_CAPS_KB {
        // A given first cap stays; otherwise the first bucket is searched with the others.
        let c = StepConfig {
            buckets: BucketFlags {
                first_kb: Some(cfg.buckets.first_kb.unwrap_or(kb)),
                kb: Some(kb),
            },
            ..*cfg
        };
        // A cap the simulator refuses (small caps make the most messages) leaves the others.
        let r = match sim.step(profile, &c) {
            Ok(r) => r,
            Err(e) => {
                first_refusal.get_or_insert(e);
                continue;
            }
        };
        if best.as_ref().is_none_or(|(_, b)| r.step_ms < b.step_ms) {
            best = Some((kb, r));
        }
    }
    best.ok_or_else(|| first_refusal.expect("a cap tried"))
}

/// The partition sizes (KiB) `--search-schedule` tries under priority scheduling, besides the
/// trainer's default: from a few link latencies' bytes on slow links to P3's and
/// ByteScheduler's sizes on fast ones (160 KB and 4-32 MB).
pub const SEARCH_PARTITIONS_KB: [usize; 9] = [16, 32, 64, 128, 256, 512, 1024, 4096, 16384];

/// The best schedule found by [`search_schedule`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleChoice {
    /// The configuration that ran: its schedule and partitions (and buckets, if searched).
    pub cfg: StepConfig,
    /// The bucket cap searched (`None`: not searched).
    pub bucket_kb: Option<usize>,
    /// Its step.
    pub result: StepResult,
    /// Overlap's step (with its own buckets, searched too when `buckets` is set), ms: what the
    /// choice is measured against.
    pub overlap_ms: f64,
    /// Priority tries left out (refused by the trainer's rules, or past the simulator's
    /// limits), of [`PRIORITY_TRIES`].
    pub priority_left_out: usize,
}

/// The priority tries of [`search_schedule`]: the trainer's default partitions and each of
/// [`SEARCH_PARTITIONS_KB`].
pub const PRIORITY_TRIES: usize = SEARCH_PARTITIONS_KB.len() + 1;

/// Tries `--schedule overlap` (whole buckets) and `--schedule priority` with the trainer's
/// default partitions and each of [`SEARCH_PARTITIONS_KB`], each with the bucket caps searched
/// as [`search_buckets`] does when `buckets` is set, and returns the fastest. Priority where
/// the trainer refuses it (tree mode, overlap off, PowerSGD here) is left out, so the answer
/// is then overlap.
pub fn search_schedule(
    sim: &mut Simulator,
    profile: &Profile,
    cfg: &StepConfig,
    buckets: bool,
) -> Result<ScheduleChoice, String> {
    use crate::parallel::Schedule;
    let mut run = |c: StepConfig| -> Result<(StepConfig, Option<usize>, StepResult), String> {
        if buckets {
            let (kb, r) = search_buckets(sim, profile, &c)?;
            Ok((c, Some(kb), r))
        } else {
            Ok((c, None, sim.step(profile, &c)?))
        }
    };
    let overlap = StepConfig {
        schedule: Schedule::Overlap,
        partition_kb: None,
        credit_kb: None,
        ..*cfg
    };
    let (c, kb, r) = run(overlap)?;
    let overlap_ms = r.step_ms;
    let mut best = (c, kb, r);
    let mut priority_left_out = 0;
    let partitions = std::iter::once(None).chain(SEARCH_PARTITIONS_KB.iter().map(|&k| Some(k)));
    for partition_kb in partitions {
        let c = StepConfig {
            schedule: Schedule::Priority,
            partition_kb,
            ..*cfg
        };
        // A refused priority (or one too large to simulate) leaves overlap's answer, counted.
        match run(c) {
            Ok(found) if found.2.step_ms < best.2.step_ms => best = found,
            Ok(_) => {}
            Err(_) => priority_left_out += 1,
        }
    }
    Ok(ScheduleChoice {
        cfg: best.0,
        bucket_kb: best.1,
        result: best.2,
        overlap_ms,
        priority_left_out,
    })
}
