//! The reducer: gradient buckets handed to a communication thread while backward goes on.
//!
//! Each worker owns one `Reducer`. It is the backward's [`GradSink`]: each layer writes its
//! parameter gradients straight into its slot of a bucket's flat buffer (PyTorch DDP's
//! `gradient_as_bucket_view`: no copy). When backward reports a layer done
//! (`GradSink::block_written`) and that layer completes a bucket, the buffer itself (a
//! `Vec<f32>`, moved, not copied) goes down a channel to this worker's communication thread,
//! which reduces it with the bucket's mode and sends it back.
//! With overlap off, buckets are only sent once backward has finished: the baseline.
//! [`Reducer::finish`] waits for every bucket to come back; the time it waits is the *exposed*
//! communication, the part that computation did not hide.
//!
//! A bucket is reduced in one collective, or, with partitions (`--partition-kb`), in several
//! over consecutive ranges of its buffer, one after another. Under `--schedule priority` the
//! communication thread takes the buckets nearest the input first (`PriorityStep`, below),
//! and the worker waits for each bucket separately ([`Reducer::wait_bucket`]) as its next
//! forward needs it ([`super::schedule`]).
//!
//! Buffers travel by ownership, so the worker and its communication thread never share memory
//! and no step allocates: the same buffers go round and round. (In `shm` mode the workers'
//! communication threads read and write each other's buffers while a bucket is away from its
//! worker; [`crate::comm::shared_memory`] says why that is safe.)

use super::bucket::BucketPlan;
use super::schedule::{partition_count, partition_range, ForwardNeeds, StepHistory};
use crate::comm::powersgd::PowerSgdBucket;
use crate::comm::{
    all_reduce_sum, hierarchical_all_reduce_sum, shared_memory_all_reduce_sum, tree_broadcast,
    tree_reduce, AcrossOp, CommError, CommMode, Hierarchy, Transport, WireFormat, WireTransport,
};
use crate::nn::GradSink;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a bucket's gradients are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOp {
    /// All-reduce (sum on every worker) with the given algorithm.
    AllReduce(CommMode),
    /// Tree reduce to worker 0 only: worker 0 updates and broadcasts parameters (Caffe).
    ReduceToRoot,
    /// The transport's own all-reduce (MPI_Allreduce with `--comm mpi-native`).
    Native,
    /// Every worker a thread of this process: sums read the peers' buffers in place
    /// ([`crate::comm::shared_memory`]; `--comm shm`, and what `auto` picks in memory).
    SharedMemory,
    /// Within the process, `across` between processes, within the process again, as
    /// `hierarchy` does it ([`crate::comm::hierarchical`]); ranks are process-major,
    /// `workers_per_process` per process.
    Hierarchical {
        /// Through the process leaders, or in two dimensions.
        hierarchy: Hierarchy,
        /// What runs among the processes.
        across: AcrossOp,
        /// Workers per process.
        workers_per_process: usize,
    },
}

impl std::fmt::Display for BucketOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AllReduce(m) => write!(f, "{m}"),
            Self::ReduceToRoot => f.write_str("tree-reduce+root-update"),
            Self::Native => f.write_str("mpi-native"),
            Self::SharedMemory => f.write_str("shm"),
            Self::Hierarchical {
                hierarchy, across, ..
            } => write!(f, "{hierarchy}:{across}"),
        }
    }
}

impl BucketOp {
    /// Runs this operation on `buf` over `t` (see [`crate::comm::AllReduce::all_reduce_sum`]
    /// for the calling contract). After [`BucketOp::ReduceToRoot`] only rank 0's `buf` holds
    /// the sum; after the others every rank holds the same bits.
    pub fn run(
        self,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        match self {
            BucketOp::AllReduce(mode) => all_reduce_sum(mode, t, buf, tag, scratch),
            BucketOp::ReduceToRoot => tree_reduce(t, buf, 0, tag, scratch),
            BucketOp::Native => t.native_all_reduce_sum(buf, scratch),
            BucketOp::SharedMemory => shared_memory_all_reduce_sum(t, buf, tag),
            BucketOp::Hierarchical {
                hierarchy,
                across,
                workers_per_process,
            } => hierarchical_all_reduce_sum(
                t,
                hierarchy,
                workers_per_process,
                across,
                buf,
                tag,
                scratch,
            ),
        }
    }

    /// Whether this operation sends gradients as messages (what `--compress` narrows): not
    /// the shared-memory collective, which sends none, nor MPI's own all-reduce.
    pub fn sends_messages(self) -> bool {
        match self {
            BucketOp::AllReduce(_) | BucketOp::ReduceToRoot => true,
            BucketOp::Native | BucketOp::SharedMemory => false,
            BucketOp::Hierarchical { across, .. } => matches!(across, AcrossOp::AllReduce(_)),
        }
    }

    /// [`BucketOp::run`] with its messages in `wire` ([`crate::comm::wire`]), encoded through
    /// `outgoing`; then, where one rank computed a sum that the others received through the
    /// wire, every rank rounds its sum as the wire does, so the replicas stay bit-identical.
    /// Not after flat redundant mode (every rank already added the same values in the same
    /// order) nor tree mode's reduce (only worker 0 holds the sum): their sums stay in f32. An
    /// operation that sends no messages runs as it is.
    pub fn run_on_wire(
        self,
        wire: WireFormat,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
        outgoing: &Mutex<Vec<f32>>,
    ) -> Result<(), CommError> {
        if wire == WireFormat::F32 || !self.sends_messages() {
            return self.run(t, buf, tag, scratch);
        }
        let t = WireTransport::new(t, wire, outgoing);
        self.run(&t, buf, tag, scratch)?;
        match self {
            BucketOp::AllReduce(CommMode::Redundant) | BucketOp::ReduceToRoot => Ok(()),
            _ => t.round_to_wire(buf),
        }
    }
}

/// A bucket on its way through the communication thread.
struct BucketJob {
    index: usize,
    buf: Vec<f32>,
    op: BucketOp,
    wire: WireFormat,
    /// The bucket's PowerSGD state, travelling with its buffer (`--compress powersgd:R`).
    powersgd: Option<PowerSgdBucket>,
    /// Whether its round 2 waits to travel in the next bucket's first collective.
    carry: bool,
    tag: u64,
    inject_panic: bool,
    /// When backward handed it over, and the seconds of forward before this step's forward
    /// needed it (NaN: it had no gate for it, as in a step after a drain), which priority
    /// scheduling plans the next with.
    handed: Instant,
    needed: f64,
    /// The collectives it is reduced in, one per partition ([`partition_range`]).
    parts: usize,
    /// Partitions reduced so far, and each one's time, in the order they ran (capacity for
    /// every partition: the list travels with the bucket, cleared, from step to step).
    parts_done: usize,
    runs: Vec<PartitionRun>,
}

/// One partition's collective on the communication thread.
#[derive(Debug, Clone, Copy)]
struct PartitionRun {
    /// The bucket's values it reduced (a PowerSGD bucket's: all of them in its first run, 0
    /// in its second; [`BucketSpan::values`]).
    values: usize,
    started: Instant,
    busy: Duration,
    cpu: Duration,
}

// A bucket's job is large beside the others, but boxing it would allocate for every bucket of
// every step; the channel holds a few jobs at most.
#[allow(clippy::large_enum_variant)]
enum Job {
    Bucket(BucketJob),
    Broadcast {
        buf: Vec<f32>,
        tag: u64,
    },
    /// Every rank's `mine` into rank 0's `all`, rank by rank.
    Gather {
        mine: Vec<f32>,
        all: Vec<f32>,
        tag: u64,
    },
}

enum Done {
    Bucket {
        index: usize,
        buf: Vec<f32>,
        powersgd: Option<PowerSgdBucket>,
        runs: Vec<PartitionRun>,
    },
    Broadcast {
        buf: Vec<f32>,
    },
    Gather {
        mine: Vec<f32>,
        all: Vec<f32>,
    },
    Failed(CommError),
}

/// Communication time of one step, as the worker saw it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommTimes {
    /// Time the communication thread spent in collectives.
    pub total: Duration,
    /// CPU time the communication thread used in them (the part of `total` it worked, not
    /// waited).
    pub cpu: Duration,
    /// Time the worker waited for communication after backward ended.
    pub exposed: Duration,
    /// When the first bucket's reduction started (to check overlap).
    pub first_start: Option<Instant>,
}

/// One collective of a bucket's reduction (a partition; the whole bucket without partitions)
/// on the communication thread, as timed there. Under priority scheduling a bucket's
/// partitions interleave with other buckets', so each is a span of its own.
#[derive(Debug, Clone, Copy)]
pub struct BucketSpan {
    /// Bucket index.
    pub index: usize,
    /// Which of the bucket's collectives, in the order they ran (0: its first).
    pub partition: usize,
    /// The bucket's values it reduced (a PowerSGD bucket's: all of them, sent as products, in
    /// its first span; reduced in arrival order it has a second, with 0: its round 2 alone,
    /// or, where that travelled in the next bucket's collective (booked to that bucket), its
    /// product only).
    pub values: usize,
    /// When the communication thread started it (waiting for peers included).
    pub started: Instant,
    /// How long the collective took.
    pub busy: Duration,
    /// CPU time the communication thread used in it.
    pub cpu: Duration,
}

/// Per-worker gradient buckets and the communication thread that reduces them.
pub struct Reducer {
    plan: BucketPlan,
    ops: Vec<BucketOp>,
    wires: Vec<WireFormat>,
    overlap: bool,
    world: usize,
    buffers: Vec<Option<Vec<f32>>>,
    /// Each bucket's PowerSGD state (`None`: sent whole); home with its buffer.
    powersgd: Vec<Option<PowerSgdBucket>>,
    /// Each PowerSGD bucket's round 2 travels in the next bucket's first collective.
    carries: Vec<bool>,
    /// Values per partition (0: each bucket in one collective), and each bucket's count of
    /// partitions (a PowerSGD bucket's two rounds are one).
    partition: usize,
    parts: Vec<usize>,
    in_flight: usize,
    step_tag: u64,
    inject_panic: bool,
    times: CommTimes,
    /// When this step's forward needed each bucket (priority scheduling's gates).
    forward: ForwardNeeds,
    // Each bucket's reduction this step, for the timeline; sized once, so steps don't allocate.
    spans: Vec<BucketSpan>,
    /// Each bucket's partition times, home between steps (empty while its job is away).
    runs: Vec<Vec<PartitionRun>>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl Reducer {
    /// Starts the communication thread for `transport` (`world` > 1) or none (`world` == 1).
    /// `ops[i]` is bucket i's operation, `wires[i]` how its gradients travel; each bucket is
    /// reduced in collectives of at most `order.partition` values (0: one per bucket), in the
    /// order backward fills them or, with `order.schedule` priority, nearest the input first,
    /// `order.credit` values per decision ([`super::schedule`]).
    pub fn new(
        plan: BucketPlan,
        ops: Vec<BucketOp>,
        wires: Vec<WireFormat>,
        overlap: bool,
        order: super::ReduceOrder,
        transport: Option<Box<dyn Transport>>,
    ) -> Self {
        let partition = order.partition;
        let world = transport.as_ref().map_or(1, |t| t.world());
        let buffers = plan
            .buckets
            .iter()
            .map(|b| Some(vec![0f32; b.len]))
            .collect();
        let buckets = plan.buckets.len();
        let (job_tx, job_rx) = bounded::<Job>(buckets + 1);
        let (done_tx, done_rx) = bounded::<Done>(plan.buckets.len() + 1);
        // A channel's first blocking receive allocates its waiter list: register once on each
        // here, while nothing can be in flight (both are empty), instead of in a step.
        if transport.as_ref().is_some_and(|t| t.world() > 1) {
            let _ = crate::comm::transport::register_as_waiter(&job_rx);
            let _ = crate::comm::transport::register_as_waiter(&done_rx);
        }
        // The largest message: a whole bucket, or the weights (broadcasts).
        let largest = plan
            .buckets
            .iter()
            .map(|b| b.len)
            .max()
            .unwrap_or(0)
            .max(plan.total_len());
        let compressed = wires.iter().any(|&w| w != WireFormat::F32);
        let parts: Vec<usize> = plan
            .buckets
            .iter()
            .map(|b| partition_count(b.len, partition))
            .collect();
        let parts_total = parts.iter().sum();
        let runs = parts.iter().map(|&n| Vec::with_capacity(n)).collect();
        let thread = transport.filter(|t| t.world() > 1).map(|t| {
            std::thread::Builder::new()
                .name(format!("comm-{}", t.rank()))
                .spawn(move || {
                    let credit =
                        (order.schedule == super::Schedule::Priority).then_some(order.credit);
                    comm_thread(t, job_rx, done_tx, largest, compressed, buckets, credit)
                })
                .expect("spawning the communication thread")
        });
        Self {
            plan,
            ops,
            wires,
            overlap,
            world,
            powersgd: vec![None; buckets],
            carries: vec![false; buckets],
            partition,
            parts,
            buffers,
            in_flight: 0,
            step_tag: 0,
            inject_panic: false,
            times: CommTimes::default(),
            forward: ForwardNeeds::new(buckets),
            spans: Vec::with_capacity(parts_total),
            runs,
            jobs: Some(job_tx),
            done: done_rx,
            thread,
        }
    }

    /// Sends bucket i by PowerSGD with `states[i]` from now on (`None`: whole), its round 2
    /// in the next bucket's first collective where `carries[i]` (under overlap; `InOrder`).
    pub fn set_powersgd(&mut self, states: Vec<Option<PowerSgdBucket>>, carries: Vec<bool>) {
        assert_eq!(states.len(), self.buffers.len(), "one state per bucket");
        assert_eq!(carries.len(), self.buffers.len(), "one choice per bucket");
        self.carries = carries;
        for (i, s) in states.iter().enumerate() {
            // PowerSGD's rounds reduce the bucket's matrices whole.
            self.parts[i] = match s {
                Some(_) => 1,
                None => partition_count(self.plan.buckets[i].len, self.partition),
            };
        }
        // Under overlap a PowerSGD bucket's rounds are two runs (its round 2 may travel
        // with the next bucket's round 1): room for both, so no step allocates.
        let runs: usize = self.parts.iter().sum::<usize>() + states.iter().flatten().count();
        self.spans.reserve(runs);
        for (r, s) in self.runs.iter_mut().zip(&states) {
            r.reserve(if s.is_some() { 2 } else { 0 });
        }
        self.powersgd = states;
    }

    /// Each bucket's PowerSGD state (valid between steps: the states are home after
    /// [`Reducer::finish`]).
    pub fn powersgd(&self) -> &[Option<PowerSgdBucket>] {
        &self.powersgd
    }

    /// Each bucket's PowerSGD state, to restore a checkpoint's into.
    pub fn powersgd_mut(&mut self) -> &mut [Option<PowerSgdBucket>] {
        &mut self.powersgd
    }

    /// The bucket plan.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// Makes the communication thread panic on the next bucket (fault-injection tests).
    pub fn inject_panic_on_next_bucket(&mut self) {
        self.inject_panic = true;
    }

    /// Marks the start of a step (before its forward: under `--schedule priority` the forward
    /// waits for the last step's buckets, and that wait is this step's exposed communication).
    pub fn begin_step(&mut self) {
        self.forward.begin_step();
        self.times = CommTimes::default();
        self.spans.clear();
        self.step_tag = self.step_tag.wrapping_add(1);
    }

    /// The operation of each bucket.
    pub fn ops(&self) -> &[BucketOp] {
        &self.ops
    }

    /// How each bucket's gradients travel.
    pub fn wires(&self) -> &[WireFormat] {
        &self.wires
    }

    /// Each bucket reduced in the last step, in the order they came back (valid after
    /// [`Reducer::finish`]).
    pub fn bucket_spans(&self) -> &[BucketSpan] {
        &self.spans
    }

    /// Called when backward has written block `b`'s gradients: sends the bucket it completes,
    /// if overlap is on.
    fn block_done(&mut self, b: usize) -> Result<(), CommError> {
        if self.overlap {
            if let Some(bi) = self.plan.ready_at_block[b] {
                self.send_bucket(bi)?;
                // Let the communication thread, just woken, have this core now: when compute
                // threads fill every core the scheduler otherwise lets it wait for a time
                // slice (a lenet5 bucket waited 1.6 ms, most of backward; see
                // `super::yield_cpu_to_communication`).
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn send_bucket(&mut self, index: usize) -> Result<(), CommError> {
        self.forward.close();
        if self.world == 1 {
            return Ok(());
        }
        let buf = self.buffers[index]
            .take()
            .expect("a bucket is sent once per step");
        let tag = (self.step_tag << 16) | index as u64;
        let job = Job::Bucket(BucketJob {
            index,
            buf,
            op: self.ops[index],
            wire: self.wires[index],
            powersgd: self.powersgd[index].take(),
            carry: self.carries[index],
            tag,
            inject_panic: std::mem::take(&mut self.inject_panic),
            handed: Instant::now(),
            needed: self.forward.needed[index],
            parts: self.parts[index],
            parts_done: 0,
            runs: {
                let mut runs = std::mem::take(&mut self.runs[index]);
                runs.clear();
                runs
            },
        });
        self.jobs
            .as_ref()
            .expect("reducer is running")
            .send(job)
            .map_err(|_| CommError::ThreadStopped)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Called when backward has ended: sends what is left (everything, with overlap off) and
    /// waits until every bucket is reduced. Returns the step's communication times.
    pub fn finish(&mut self) -> Result<CommTimes, CommError> {
        let backward_end = Instant::now();
        self.send_rest()?;
        while self.in_flight > 0 {
            self.receive_one()?;
        }
        // One worker sends nothing, so it waits for nothing: the instants to here are not
        // communication (and a breakdown of zeros says so: `train::metrics`).
        self.times.exposed = if self.world > 1 {
            backward_end.elapsed()
        } else {
            Duration::ZERO
        };
        Ok(self.times)
    }

    /// Sends every bucket backward has not sent yet (all of them with overlap off), without
    /// waiting for any.
    pub fn send_rest(&mut self) -> Result<(), CommError> {
        for i in 0..self.buffers.len() {
            if self.buffers[i].is_some() && self.world > 1 {
                self.send_bucket(i)?;
            }
        }
        Ok(())
    }

    /// Waits until bucket `index` is home, reduced; the wait counts as exposed communication.
    pub fn wait_bucket(&mut self, index: usize) -> Result<(), CommError> {
        let waiting = Instant::now();
        self.forward.needs(index, waiting);
        if self.buffers[index].is_some() {
            return Ok(());
        }
        while self.buffers[index].is_none() {
            self.receive_one()?;
        }
        let waited = waiting.elapsed();
        self.forward.waited(waited);
        self.times.exposed += waited;
        Ok(())
    }

    /// When the communication thread finished reducing bucket `index` (its last collective),
    /// once it is home; `None` before.
    pub fn reduced_at(&self, index: usize) -> Option<Instant> {
        self.buffers[index].as_ref()?;
        self.runs[index].iter().map(|r| r.started + r.busy).max()
    }

    /// The communication times so far this step (exposed: the waits in
    /// [`Reducer::wait_bucket`] and [`Reducer::finish`]).
    pub fn times(&self) -> CommTimes {
        self.times
    }

    /// Receives one reduced bucket from the communication thread and puts it home.
    fn receive_one(&mut self) -> Result<(), CommError> {
        match self.done.recv().map_err(|_| CommError::ThreadStopped)? {
            Done::Bucket {
                index,
                buf,
                powersgd,
                runs,
            } => {
                self.buffers[index] = Some(buf);
                self.powersgd[index] = powersgd;
                for (partition, run) in runs.iter().enumerate() {
                    self.times.total += run.busy;
                    self.times.cpu += run.cpu;
                    let first = self
                        .times
                        .first_start
                        .map_or(run.started, |s| s.min(run.started));
                    self.times.first_start = Some(first);
                    self.spans.push(BucketSpan {
                        index,
                        partition,
                        values: run.values,
                        started: run.started,
                        busy: run.busy,
                        cpu: run.cpu,
                    });
                }
                self.runs[index] = runs;
                self.in_flight -= 1;
                Ok(())
            }
            Done::Failed(e) => Err(e),
            Done::Broadcast { .. } | Done::Gather { .. } => {
                unreachable!("no broadcast or gather is in flight during a step")
            }
        }
    }

    /// Block `b`'s reduced gradient (a sum over workers), valid after [`Reducer::finish`] (or
    /// [`Reducer::wait_bucket`] of its bucket).
    pub fn grad(&self, b: usize) -> &[f32] {
        let slot = &self.plan.slots[b];
        &self.buffers[slot.bucket]
            .as_ref()
            .expect("buckets are home after finish")[slot.range.clone()]
    }

    /// Broadcasts `buf` from worker 0 to every worker (initial weights; tree mode's updated
    /// weights). `buf` goes to the communication thread and comes back.
    pub fn broadcast(&mut self, buf: Vec<f32>) -> Result<Vec<f32>, CommError> {
        if self.world == 1 {
            return Ok(buf);
        }
        let tag = (self.step_tag << 16) | 0xffff;
        self.jobs
            .as_ref()
            .expect("reducer is running")
            .send(Job::Broadcast { buf, tag })
            .map_err(|_| CommError::ThreadStopped)?;
        match self.done.recv().map_err(|_| CommError::ThreadStopped)? {
            Done::Broadcast { buf } => Ok(buf),
            Done::Failed(e) => Err(e),
            Done::Bucket { .. } | Done::Gather { .. } => {
                unreachable!("nothing else is in flight during a broadcast")
            }
        }
    }

    /// Gathers every worker's `mine` (all of one length) into worker 0's `all`, rank after
    /// rank (`all` must hold `world` of them there; other workers' `all` comes back as it
    /// went). Both buffers go to the communication thread and come back. Between steps.
    pub fn gather(
        &mut self,
        mine: Vec<f32>,
        all: Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>), CommError> {
        if self.world == 1 {
            let mut all = all;
            all.copy_from_slice(&mine);
            return Ok((mine, all));
        }
        // The broadcast's tag (the transports reserve one tag between steps): a gather's
        // messages go to rank 0, which a broadcast never sends to, so no pair of ranks
        // carries both.
        let tag = (self.step_tag << 16) | 0xffff;
        self.jobs
            .as_ref()
            .expect("reducer is running")
            .send(Job::Gather { mine, all, tag })
            .map_err(|_| CommError::ThreadStopped)?;
        match self.done.recv().map_err(|_| CommError::ThreadStopped)? {
            Done::Gather { mine, all } => Ok((mine, all)),
            Done::Failed(e) => Err(e),
            Done::Bucket { .. } | Done::Broadcast { .. } => {
                unreachable!("nothing else is in flight during a gather")
            }
        }
    }
}

impl GradSink for Reducer {
    /// The bucket-buffer view of block `b` (home during backward until its bucket is sent).
    fn block_grads(&mut self, b: usize) -> &mut [f32] {
        let slot = &self.plan.slots[b];
        &mut self.buffers[slot.bucket]
            .as_mut()
            .expect("bucket buffers are home during backward")[slot.range.clone()]
    }

    fn block_written(&mut self, b: usize) -> Result<(), String> {
        // The backward's sink contract speaks in messages; the reducer's own calls keep the
        // typed error.
        self.block_done(b).map_err(|e| e.to_string())
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Closing the job channel ends the communication thread.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The communication thread: runs jobs one at a time on its transport, in arrival order (a
/// bucket's partitions one after another), or, with a `credit` (`--schedule priority`), each
/// step's partitions nearest the input first, `credit` values per decision (`PriorityStep`).
///
/// A failure (an error, or a panic, caught here) is reported to the worker, and the thread
/// ends: dropping the transport is what tells the peers, so nobody waits on a dead collective.
fn comm_thread(
    t: Box<dyn Transport>,
    jobs: Receiver<Job>,
    done: Sender<Done>,
    largest: usize,
    compressed: bool,
    buckets: usize,
    credit: Option<usize>,
) {
    // First blocking waits allocate (see `Transport::warm_up`); so would the first encoding.
    t.warm_up(largest);
    let mut collectives = Collectives {
        t: t.as_ref(),
        scratch: Vec::new(),
        outgoing: Mutex::new(Vec::with_capacity(if compressed {
            WireFormat::Bf16.carriers(largest)
        } else {
            0
        })),
    };
    let mut held: Vec<Option<BucketJob>> = (0..buckets).map(|_| None).collect();
    let mut history = StepHistory::new(buckets);
    let mut finished = vec![false; buckets];
    let mut in_order = InOrder {
        pending: None,
        fused: Vec::new(),
        arrived: 0,
        buckets,
    };
    let send = |d: Done| done.send(d).map_err(|_| CommError::ThreadStopped);
    for job in jobs.iter() {
        let outcome = match job {
            Job::Bucket(b) if credit.is_some() => {
                let mut step = PriorityStep {
                    t: t.as_ref(),
                    jobs: &jobs,
                    held: &mut held,
                    finished: &mut finished,
                    history: &mut history,
                    credit: credit.unwrap_or(0),
                    decided: [NO_DECISION; super::schedule::MAX_DECIDED],
                    next: super::schedule::MAX_DECIDED,
                };
                let mut reduce = |b: &mut BucketJob, part: usize| {
                    caught(|| reduce_partition(&mut collectives, b, part))
                };
                step.run(b, &mut reduce, &send)
            }
            Job::Bucket(b) => caught(|| in_order.take(b, &mut collectives, &send)),
            job => caught(|| run_job(t.as_ref(), job)).and_then(send),
        };
        if let Err(e) = outcome {
            if send(Done::Failed(e)).is_err() {
                return;
            }
            // Keep the transport (so peers do not see this rank vanish) until the worker has
            // reported the failure and dropped its reducer; refuse any further work meanwhile.
            for _ in jobs.iter() {
                let _ = done.send(Done::Failed(CommError::ThreadFailedEarlier));
            }
            return;
        }
    }
}

/// What the communication thread runs every collective with: its transport, the scratch
/// the algorithms reuse, and the buffer messages are encoded through (`--compress fp16|bf16`).
struct Collectives<'t> {
    t: &'t dyn Transport,
    scratch: Vec<f32>,
    outgoing: Mutex<Vec<f32>>,
}

impl Collectives<'_> {
    /// One collective of a bucket's operation on `buf`, in its wire format, on `tag`.
    fn run(
        &mut self,
        op: BucketOp,
        wire: WireFormat,
        buf: &mut [f32],
        tag: u64,
    ) -> Result<(), CommError> {
        op.run_on_wire(wire, self.t, buf, tag, &mut self.scratch, &self.outgoing)
    }
}

/// `work`, with a panic in it turned into the error the worker reports.
fn caught<T>(work: impl FnOnce() -> Result<T, CommError>) -> Result<T, CommError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|panic| Err(CommError::ThreadPanicked(panic_message(&panic))))
}

/// The step's buckets in the order backward hands them over (`--schedule overlap`, and with
/// overlap off), each reduced as it comes, with PowerSGD's rounds pipelined across buckets.
///
/// A PowerSGD bucket needs two collectives, the second only after the first's sum is back
/// and orthogonalised; serially, every bucket pays two messages' latency, the bound
/// PyTorch's hook hits (Vogels et al. 2019 and PyTorch's `powerSGD_hook` run a bucket's
/// rounds back to back). Here a bucket's round 2 may wait, and travel in the next bucket's
/// first collective (the next PowerSGD bucket's round 1, or the first partition of a bucket
/// sent whole): `n` PowerSGD buckets in a row in `n + 1` collectives instead of `2n`.
///
/// The cost: the carried values add their bytes to the next collective, after the next
/// bucket's gradients (after the last one's, to the step). So a bucket's round 2 waits only
/// where the plan says the latency saved exceeds that (`plan::PlanInputs::powersgd_carries`,
/// the bucket's `carry`, read by the simulator too); which collectives travel together is
/// then fixed by the plan and the order buckets arrive in, the same on every rank
/// (backward's order). The step's last bucket sends its round 2 alone, so every bucket is
/// home when the step's buckets are; a bucket of another operation or wire format first
/// sends the waiting round 2 alone. (Priority scheduling, which hands each bucket to the next
/// forward as soon as it is reduced, keeps the two rounds together.)
struct InOrder {
    /// A PowerSGD bucket between its rounds, its round 2 waiting for the next bucket.
    pending: Option<BucketJob>,
    /// The collective of a round 2 and the next round 1 (grown in the first step, reused).
    fused: Vec<f32>,
    /// Buckets arrived this step, and how many a step has (every one is sent each step).
    arrived: usize,
    buckets: usize,
}

impl InOrder {
    /// Reduces the step's next bucket `b` and sends home every bucket that is done.
    fn take(
        &mut self,
        mut b: BucketJob,
        c: &mut Collectives<'_>,
        send: &dyn Fn(Done) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.arrived += 1;
        let last = self.arrived == self.buckets;
        if last {
            self.arrived = 0;
        }
        // A waiting round 2 travels in this bucket's first collective if that runs the same
        // operation on the same wire; otherwise it goes alone, first.
        let carried = match self.pending.take() {
            Some(earlier) if (earlier.op, earlier.wire) == (b.op, b.wire) => Some(earlier),
            Some(earlier) => {
                second_alone(earlier, c, send)?;
                None
            }
            None => None,
        };
        let fused = &mut self.fused;
        let (op, wire, tag, len) = (b.op, b.wire, b.tag, b.buf.len());
        match (b.powersgd.is_some(), carried) {
            (true, Some(mut earlier)) => {
                timed(&mut b, len, |b| {
                    let state = b.powersgd.as_mut().expect("a PowerSGD bucket");
                    let earlier_state = earlier.powersgd.as_mut().expect("a PowerSGD bucket");
                    state.reduce_first_carrying(&mut b.buf, earlier_state, fused, |m| {
                        c.run(op, wire, m, tag)
                    })
                })?;
                finish_second(earlier, send)?;
            }
            (true, None) => timed(&mut b, len, |b| {
                let state = b.powersgd.as_mut().expect("a PowerSGD bucket");
                state.reduce_first(&mut b.buf, |m| c.run(op, wire, m, tag))
            })?,
            (false, Some(mut earlier)) => {
                let range = partition_range(len, b.parts, 0);
                timed(&mut b, range.len(), |b| {
                    let state = earlier.powersgd.as_mut().expect("a PowerSGD bucket");
                    state.carry_second(&mut b.buf[range], fused, |m| c.run(op, wire, m, tag))
                })?;
                b.parts_done += 1;
                finish_second(earlier, send)?;
            }
            (false, None) => {}
        }
        if b.powersgd.is_none() {
            (b.parts_done..b.parts).try_for_each(|part| reduce_partition(c, &mut b, part))?;
            return send(b.finished());
        }
        if last || !b.carry {
            return second_alone(b, c, send);
        }
        self.pending = Some(b);
        Ok(())
    }
}

/// A PowerSGD bucket whose round 2 travelled in the next collective: its product, and the
/// bucket home.
fn finish_second(
    mut b: BucketJob,
    send: &dyn Fn(Done) -> Result<(), CommError>,
) -> Result<(), CommError> {
    timed(&mut b, 0, |b| {
        let state = b.powersgd.as_mut().expect("a PowerSGD bucket");
        state.finish_second(&mut b.buf);
        Ok(())
    })?;
    b.parts_done += 1;
    send(b.finished())
}

/// A PowerSGD bucket's round 2 in a collective of its own, and the bucket home.
fn second_alone(
    mut b: BucketJob,
    c: &mut Collectives<'_>,
    send: &dyn Fn(Done) -> Result<(), CommError>,
) -> Result<(), CommError> {
    timed(&mut b, 0, |b| {
        let (op, wire, tag) = (b.op, b.wire, b.tag);
        let state = b.powersgd.as_mut().expect("a PowerSGD bucket");
        state.reduce_second(&mut b.buf, |m| c.run(op, wire, m, tag))
    })?;
    b.parts_done += 1;
    send(b.finished())
}

/// One step's partitions under priority scheduling, on the communication thread.
///
/// Every rank must run the same collectives in the same order, yet which buckets backward has
/// filled differs from rank to rank and moment to moment. So rank 0 decides, and tells the
/// others: the bucket nearest the input (the highest index) among those it holds with
/// partitions left, whose next partition (nearest the input first) every rank reduces, or,
/// when a partition of a later layer would hold up the bucket the next forward needs first,
/// nothing until that bucket is here ([`super::schedule::FirstBucketWait`]). The
/// others wait for that bucket from their own backward if it is not there yet. The step ends
/// when every bucket is back. The order changes from step to step; the sums do not: each
/// partition is the same collective on the same values whenever it runs.
///
/// A decision is broadcast from rank 0 (a tree), taken when rank 0's communication thread is
/// free: the buckets whose next partitions every rank reduces, in order, up to the credit's
/// values (`--credit-kb`; by default one partition, so a partition nearer the input waits for
/// at most the one under way, and each partition costs one more message's latency).
/// (Deciding one partition ahead, to send the decision while the current collective runs, hid
/// that latency but let the buckets that arrive meanwhile wait one partition more: vgg-small
/// at 200 Mbit/s, 50 us, ring, a step of 35.4 ms against 29.5 ms deciding when free, and
/// 35.7 ms under overlap.)
struct PriorityStep<'a> {
    t: &'a dyn Transport,
    jobs: &'a Receiver<Job>,
    held: &'a mut [Option<BucketJob>],
    /// Which buckets are back this step (kept between steps, so no step allocates).
    finished: &'a mut [bool],
    /// The last step's hand-overs and partition times, for rank 0's wait for the first bucket.
    history: &'a mut StepHistory,
    /// Values one decision commits to (at least one partition).
    credit: usize,
    /// The last decision: a bucket per partition, in order, [`NO_DECISION`] past its end
    /// (the first [`PriorityStep::decision_len`] entries are used).
    decided: [f32; super::schedule::MAX_DECIDED],
    /// Its next partition to reduce (past the decision's end: a decision is due).
    next: usize,
}

/// One partition's collective: (bucket, partition index).
type Reduce<'r> = dyn FnMut(&mut BucketJob, usize) -> Result<(), CommError> + 'r;

/// The decision buffer before rank 0's arrives (never a bucket).
const NO_DECISION: f32 = -1.0;

impl PriorityStep<'_> {
    /// Runs the step whose first bucket to arrive is `first`; `reduce` runs a partition,
    /// `send` hands a bucket back to the worker.
    fn run(
        &mut self,
        first: BucketJob,
        reduce: &mut Reduce<'_>,
        send: &dyn Fn(Done) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        // The step's broadcast tag: within a step no weight broadcast or gather runs, and
        // every rank receives all of this step's decisions before anything else on it.
        let tag = first.tag | 0xffff;
        self.history.begin_step();
        self.hold(Job::Bucket(first));
        self.finished.fill(false);
        let mut left = self.held.len();
        while left > 0 {
            if self.next >= self.decision_len() || self.decided[self.next] == NO_DECISION {
                self.decide(tag)?;
                self.next = 0;
            }
            let current = self.decided[self.next] as usize;
            self.next += 1;
            if self.finished[current] {
                // A decision naming more partitions than the bucket has (a corrupted one).
                return Err(self.protocol_error(current as f32));
            }
            while self.held[current].is_none() {
                let job = self.jobs.recv().map_err(|_| CommError::ThreadStopped)?;
                self.hold(job);
            }
            let job = self.held[current]
                .as_mut()
                .expect("the decided bucket is here");
            let part = job.parts - 1 - job.parts_done;
            reduce(job, part)?;
            if let Some(run) = job.runs.last() {
                self.history.reduced(current, run.busy);
            }
            if job.parts_done == job.parts {
                self.finished[current] = true;
                left -= 1;
                let job = self.held[current].take().expect("the bucket just reduced");
                send(job.finished())?;
            }
        }
        self.history.end_step();
        Ok(())
    }

    /// Rank 0: the next partitions, input-first among the buckets here (after taking in what
    /// has arrived), up to the credit's values and at least one, into `decided`; false if no
    /// bucket is here (a bucket here always has a partition left).
    fn choose(&mut self) -> bool {
        while let Ok(job) = self.jobs.try_recv() {
            self.hold(job);
        }
        self.decided.fill(NO_DECISION);
        let (mut n, mut values) = (0, 0);
        for i in (0..self.held.len()).rev() {
            let Some(job) = &self.held[i] else { continue };
            // Its partitions left, nearest the input first (the reducer's order).
            for done in job.parts_done..job.parts {
                if super::schedule::decision_full(n, values, self.credit) {
                    return true;
                }
                let part = job.parts - 1 - done;
                values += partition_range(job.buf.len(), job.parts, part).len();
                // Bucket indices are exact in f32 (the transports allow at most 4094).
                self.decided[n] = i as f32;
                n += 1;
            }
        }
        n > 0
    }

    /// The partitions every rank reduces next: rank 0 waits until a bucket is here and
    /// announces them; the others hear them.
    fn decide(&mut self, tag: u64) -> Result<(), CommError> {
        if self.t.rank() == 0 {
            loop {
                while !self.choose() {
                    let job = self.jobs.recv().map_err(|_| CommError::ThreadStopped)?;
                    self.hold(job);
                }
                let Some(deadline) = self.first_bucket_deadline() else {
                    break;
                };
                // Leave the link idle for the bucket the next forward needs first, then
                // decide again.
                match self.jobs.recv_deadline(deadline) {
                    Ok(job) => self.hold(job),
                    Err(RecvTimeoutError::Timeout) => self.history.timed_out(),
                    Err(RecvTimeoutError::Disconnected) => return Err(CommError::ThreadStopped),
                }
            }
            let len = self.decision_len();
            return tree_broadcast(self.t, &mut self.decided[..len], 0, tag);
        }
        self.decided.fill(NO_DECISION);
        let len = self.decision_len();
        tree_broadcast(self.t, &mut self.decided[..len], 0, tag)?;
        self.check_decided()
    }

    /// Rank 0, with `decided` chosen: until when to wait for the first bucket instead, if it
    /// should ([`StepHistory::first_bucket_deadline`]).
    fn first_bucket_deadline(&self) -> Option<Instant> {
        let named = self.named();
        let mut decided = [0usize; super::schedule::MAX_DECIDED];
        for (b, &d) in decided.iter_mut().zip(&self.decided[..named]) {
            *b = d as usize;
        }
        let left = |b: usize| match (&self.held[b], self.finished[b]) {
            (_, true) => Some(0),
            (Some(job), false) => Some(job.parts - job.parts_done),
            (None, false) => None,
        };
        self.history
            .first_bucket_deadline(Instant::now(), &decided[..named], left)
    }

    /// Partitions the current decision names.
    fn named(&self) -> usize {
        self.decided
            .iter()
            .take_while(|&&d| d != NO_DECISION)
            .count()
    }

    /// Entries a decision message carries ([`super::schedule::decision_len`]).
    fn decision_len(&self) -> usize {
        super::schedule::decision_len(self.credit)
    }

    /// Another rank checks a decision it heard: at least one partition, each of a bucket left
    /// this step, then nothing.
    fn check_decided(&self) -> Result<(), CommError> {
        let named = self.named();
        let bad = self.decided.iter().enumerate().find(|&(k, &d)| {
            let left = || (d as usize) < self.finished.len() && !self.finished[d as usize];
            (k < named && !(d >= 0.0 && d.fract() == 0.0 && left()))
                || (k >= named && d != NO_DECISION)
        });
        match (named, bad) {
            (0, _) => Err(self.protocol_error(NO_DECISION)),
            (_, Some((_, &d))) => Err(self.protocol_error(d)),
            _ => Ok(()),
        }
    }

    /// A decision that names no bucket left this step (a corrupted message).
    fn protocol_error(&self, decision: f32) -> CommError {
        CommError::Transport {
            rank: self.t.rank(),
            detail: format!(
                "priority scheduling: rank 0 decided bucket {decision}, which is not left in \
                 this step of {} buckets",
                self.finished.len()
            ),
        }
    }

    /// Keeps a bucket that arrived until its turn.
    fn hold(&mut self, job: Job) {
        match job {
            Job::Bucket(b) => {
                let index = b.index;
                self.history.handed(index, b.handed, b.parts, b.needed);
                self.held[index] = Some(b);
            }
            _ => unreachable!("a worker sends nothing but buckets while a step's are away"),
        }
    }
}

impl BucketJob {
    /// The bucket back to its worker, with the time its partitions took.
    fn finished(self) -> Done {
        Done::Bucket {
            index: self.index,
            buf: self.buf,
            powersgd: self.powersgd,
            runs: self.runs,
        }
    }
}

/// Reduces partition `part` of bucket `b` on the communication thread (a PowerSGD bucket is
/// one partition: its two rounds, back to back).
fn reduce_partition(
    c: &mut Collectives<'_>,
    b: &mut BucketJob,
    part: usize,
) -> Result<(), CommError> {
    let range = match b.powersgd {
        Some(_) => 0..b.buf.len(),
        None => partition_range(b.buf.len(), b.parts, part),
    };
    timed(b, range.len(), |b| {
        let (op, wire, tag) = (b.op, b.wire, b.tag);
        match b.powersgd.as_mut() {
            // Both rounds on the bucket's tag: each pair of ranks exchanges round 1's
            // messages before round 2's, and the transport keeps their order.
            Some(state) => state.reduce(&mut b.buf, |m| c.run(op, wire, m, tag)),
            // A bucket's partitions share its tag in the same way, one after another.
            None => c.run(op, wire, &mut b.buf[range], tag),
        }
    })?;
    b.parts_done += 1;
    Ok(())
}

/// Runs `work` on bucket `b` as one of its runs on the communication thread, timed (wall and
/// CPU) into its list of runs, `values` of its buffer the run's.
fn timed(
    b: &mut BucketJob,
    values: usize,
    work: impl FnOnce(&mut BucketJob) -> Result<(), CommError>,
) -> Result<(), CommError> {
    let started = Instant::now();
    let cpu_before = crate::trace::thread_cpu_time();
    if b.inject_panic {
        panic!("injected fault: Comm while reducing bucket {}", b.index);
    }
    work(b)?;
    b.runs.push(PartitionRun {
        values,
        started,
        busy: started.elapsed(),
        cpu: crate::trace::thread_cpu_time().saturating_sub(cpu_before),
    });
    Ok(())
}

/// Runs a broadcast or a gather on the communication thread.
fn run_job(t: &dyn Transport, job: Job) -> Result<Done, CommError> {
    match job {
        // Weights (initial, and tree mode's updates) travel in f32 always.
        Job::Broadcast { mut buf, tag } => {
            tree_broadcast(t, &mut buf, 0, tag)?;
            Ok(Done::Broadcast { buf })
        }
        Job::Bucket(_) => unreachable!("the communication thread reduces buckets itself"),
        Job::Gather { mine, mut all, tag } => {
            if t.rank() == 0 {
                let n = mine.len();
                all[..n].copy_from_slice(&mine);
                for from in 1..t.world() {
                    t.recv(from, tag, &mut all[from * n..(from + 1) * n])?;
                }
            } else {
                t.send(0, tag, &mine)?;
            }
            Ok(Done::Gather { mine, all })
        }
    }
}

use super::panic_message;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{InProcessFabric, LinkModel};
    use crate::nn::GradSink;
    use crate::parallel::Schedule;

    /// `work` on each of two workers' threads, each given its endpoint of an in-process fabric
    /// (emulating `link`, if any); the results by rank.
    fn on_two_workers<T: Send>(
        link: Option<LinkModel>,
        work: impl Fn(crate::comm::InProcessTransport) -> T + Sync,
    ) -> Vec<T> {
        let eps = InProcessFabric::new(2, link, Duration::from_secs(30));
        std::thread::scope(|s| {
            let work = &work;
            let handles: Vec<_> = eps.into_iter().map(|t| s.spawn(move || work(t))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Two workers' reducers over a slow link: bucket 0 (two partitions) leaves first, then 1
    /// and 2 while its first partition is on the wire. Returns the order buckets came back on
    /// each rank and each rank's sums.
    fn three_buckets(schedule: Schedule) -> Vec<(Vec<usize>, Vec<f32>)> {
        three_buckets_paced(schedule, 0, Duration::ZERO)
    }

    /// [`three_buckets`] with `credit` values per decision and `pause` between the blocks of
    /// backward.
    fn three_buckets_paced(
        schedule: Schedule,
        credit: usize,
        pause: Duration,
    ) -> Vec<(Vec<usize>, Vec<f32>)> {
        // Blocks of 64, 8 and 8 values, one bucket each; partitions of 32 values, 256 ms each
        // on this link: the window in which backward hands over buckets 1 and 2 while bucket
        // 0's first partition is on the wire. At 64 ms (2 KB/s) a loaded CI machine once held
        // the backward thread past it.
        let link = LinkModel {
            bandwidth_bytes_per_s: 500.0,
            latency: Duration::ZERO,
        };
        on_two_workers(Some(link), |t| {
            let rank = t.rank();
            let plan = BucketPlan::new(&[8, 8, 64], 0, 0);
            let ops = vec![BucketOp::AllReduce(CommMode::Redundant); 3];
            let wires = vec![WireFormat::F32; 3];
            let order = super::super::ReduceOrder {
                schedule,
                partition: 32,
                credit,
            };
            let mut r = Reducer::new(plan, ops, wires, true, order, Some(Box::new(t)));
            r.begin_step();
            // Backward: block 2 (bucket 0), then 1 (bucket 1), then 0 (bucket 2).
            for b in [2, 1, 0] {
                let g = r.block_grads(b);
                for (i, v) in g.iter_mut().enumerate() {
                    *v = (rank * 100 + b * 10 + i) as f32;
                }
                r.block_written(b).unwrap();
                std::thread::sleep(pause);
            }
            r.finish().unwrap();
            let order = r
                .bucket_spans()
                .iter()
                .filter(|s| s.partition == 0)
                .map(|s| s.index)
                .collect();
            let sums = (0..3).flat_map(|b| r.grad(b).to_vec()).collect();
            (order, sums)
        })
    }

    /// A transport that counts the messages its rank sends.
    struct Counting<T: Transport> {
        inner: T,
        sends: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl<T: Transport> Transport for Counting<T> {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world(&self) -> usize {
            self.inner.world()
        }
        fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
            self.sends
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.send(to, tag, data)
        }
        fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
            self.inner.recv(from, tag, out)
        }
    }

    /// How [`three_powersgd_buckets`] sets its three buckets of a 12 x 10 matrix each up.
    #[derive(Clone, Copy, Debug)]
    struct Three {
        /// Which buckets PowerSGD sends at rank 1 (the others whole).
        powersgd: [bool; 3],
        /// Which carry their round 2 (the plan's choice).
        carry: [bool; 3],
        /// Values per partition (0: a bucket sent whole in one collective).
        partition: usize,
        /// The middle bucket's mode (the others redundant).
        middle: CommMode,
    }

    /// Two workers' reducers on [`Three`]'s buckets, two steps under `schedule`. Redundant
    /// mode sends one message per collective per rank, ring two. Returns each rank's
    /// messages sent and its sums.
    fn three_powersgd_buckets(schedule: Schedule, setup: Three) -> Vec<(usize, Vec<f32>)> {
        use crate::comm::powersgd::{Matrix, PowerSgdBucket};
        on_two_workers(None, |t| {
            let rank = t.rank();
            let sends = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let t = Counting {
                inner: t,
                sends: sends.clone(),
            };
            let plan = BucketPlan::new(&[120, 120, 120], 0, 0);
            let mut ops = vec![BucketOp::AllReduce(CommMode::Redundant); 3];
            ops[1] = BucketOp::AllReduce(setup.middle);
            let wires = vec![WireFormat::F32; 3];
            let order = super::super::ReduceOrder {
                schedule,
                partition: setup.partition,
                credit: 0,
            };
            let mut r = Reducer::new(plan, ops, wires, true, order, Some(Box::new(t)));
            let m = Matrix {
                offset: 0,
                rows: 12,
                cols: 10,
            };
            r.set_powersgd(
                (0..3)
                    .map(|b| {
                        let state = PowerSgdBucket::new(120, vec![m], 1, 5 + b as u64);
                        setup.powersgd[b].then_some(state)
                    })
                    .collect(),
                setup.carry.to_vec(),
            );
            let mut sums = Vec::new();
            for step in 0..2 {
                r.begin_step();
                for b in [2, 1, 0] {
                    for (i, v) in r.block_grads(b).iter_mut().enumerate() {
                        *v = ((rank * 7 + b * 3 + i * step) % 11) as f32 - 5.0;
                    }
                    r.block_written(b).unwrap();
                }
                r.finish().unwrap();
                sums.extend((0..3).flat_map(|b| r.grad(b).to_vec()));
            }
            (sends.load(std::sync::atomic::Ordering::Relaxed), sums)
        })
    }

    #[test]
    fn powersgd_rounds_travel_in_the_next_buckets_collective_under_overlap() {
        let three = |powersgd, carry| Three {
            powersgd,
            carry,
            partition: 0,
            middle: CommMode::Redundant,
        };
        let whole_between = [true, false, true];
        // (setup, rank 1's messages a step under overlap and under priority, rank 0's
        // decisions under priority: one per partition)
        let cases = [
            // Each round 2 inside the next bucket's round 1: 4 collectives, not 6.
            (three([true; 3], [true, true, false]), 4, 6, 3),
            // Bucket 0's round 2 inside bucket 1, sent whole; bucket 2's rounds: 4, not 5.
            (three(whole_between, [true, false, false]), 4, 5, 3),
            // Only bucket 1 carries: 5.
            (three([true; 3], [false, true, false]), 5, 6, 3),
            // The step's last bucket sends its round 2 alone, whatever the plan said.
            (three([true; 3], [false, false, true]), 6, 6, 3),
            // Into the first of the whole bucket's two partitions: 5, not 6.
            (
                Three {
                    partition: 60,
                    ..three(whole_between, [true, false, false])
                },
                5,
                6,
                4,
            ),
            // The whole bucket reduced by another mode (ring: two messages): bucket 0's round
            // 2 goes alone before it.
            (
                Three {
                    middle: CommMode::Ring,
                    ..three(whole_between, [true, false, false])
                },
                6,
                6,
                3,
            ),
        ];
        for (setup, collectives, serial, decisions) in cases {
            let overlap = three_powersgd_buckets(Schedule::Overlap, setup);
            let priority = three_powersgd_buckets(Schedule::Priority, setup);
            for rank in 0..2 {
                let case = format!("{setup:?}, rank {rank}");
                assert_eq!(overlap[rank].0, 2 * collectives, "{case}: under overlap");
                // Priority keeps each bucket's rounds together, after rank 0's decision.
                let decisions = if rank == 0 { 2 * decisions } else { 0 };
                assert_eq!(priority[rank].0, 2 * serial + decisions, "{case}: priority");
                // Two ranks' sums (and redundant mode's) do not depend on the message.
                assert_eq!(overlap[rank].1, priority[rank].1, "{case}: the same sums");
            }
            assert_eq!(overlap[0].1, overlap[1].1, "the same on every rank");
        }
    }

    #[test]
    fn priority_reduces_the_buckets_nearest_the_input_first_and_sums_alike() {
        let overlap = three_buckets(Schedule::Overlap);
        // Backward pauses 30 ms after each block, so that rank 0 decides on bucket 0 alone
        // before buckets 1 and 2 arrive: handed over back to back, a loaded machine (a build
        // beside the tests) woke the communication thread only once bucket 1 was there too,
        // and it went first ([1, 2, 0]). Both arrive well inside bucket 0's first partition.
        let priority = three_buckets_paced(Schedule::Priority, 0, Duration::from_millis(30));
        for rank in 0..2 {
            assert_eq!(overlap[rank].0, vec![0, 1, 2], "overlap: backward's order");
            // Bucket 0's second partition waits for the two buckets nearer the input.
            assert_eq!(priority[rank].0, vec![2, 1, 0], "priority: input first");
            assert_eq!(overlap[rank].1, priority[rank].1, "the same sums");
        }
        assert_eq!(priority[0].1, priority[1].1, "the same on every rank");
        // Sums, not copies: block 2's first value is 0 + 100 + 20 + 0... per rank.
        assert_eq!(priority[0].1[16], (20 + 120) as f32);
    }

    #[test]
    fn a_credit_commits_every_rank_to_the_partitions_rank_0_held_when_it_decided() {
        // Bucket 0 (64 values, 2 partitions of 32 at 500 B/s: 512 ms) is alone when rank 0
        // first decides; buckets 1 and 2 follow 30 and 60 ms later (margins a loaded
        // machine's late wake-ups stay within: at 3 ms gaps bucket 1 was once held already).
        // A credit of 64 values commits to both of bucket 0's partitions, so bucket 0 is back
        // first, then the buckets nearer the input; the sums are those of one partition per
        // decision.
        let one = three_buckets(Schedule::Priority);
        let credit = three_buckets_paced(Schedule::Priority, 64, Duration::from_millis(30));
        for rank in 0..2 {
            assert_eq!(credit[rank].0, vec![0, 2, 1], "rank {rank}");
            assert_eq!(credit[rank].1, one[rank].1, "the same sums");
        }
    }
}
