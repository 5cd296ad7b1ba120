//! Message schedules recorded from the real algorithms, compiled for the engine.
//!
//! A [`Job`] is what a worker's communication thread runs, exactly as the trainer's reducer
//! runs it: a bucket's [`BucketOp`] (`BucketOp::run`, the trainer's own dispatch to ring, hd,
//! redundant, tree reduce or the hierarchical all-reduce), or tree mode's weight broadcast
//! (`comm::tree_broadcast`). [`compile`] records each rank's program by running that code over
//! a [`crate::comm::record::RecordingTransport`], pairs every receive with the send it
//! receives (the k-th message from a peer is the peer's k-th send to us), and turns message
//! lengths into fractions of the buffer, so one recording serves every bucket size.
//!
//! **One recording for every size.** The recording runs on a buffer of [`Job::exact_len`]
//! elements: a multiple of the number of chunks the algorithm cuts a buffer into
//! ([`crate::comm::CommMode::chunks`], the algorithms' own partition), so every message is an
//! exact fraction of the buffer. A bucket of `b` bytes then sends `fraction x b` bytes per
//! message; the algorithms split by whole elements, so their messages differ from these by
//! less than one f32 (two for the 2-D hierarchy, which cuts shards and then the mode cuts
//! them; the cost model makes the same simplification).
//!
//! **Symmetry, for large clusters.** Simulating every rank costs one event per message: a
//! ring over N workers is 2N(N-1) messages per bucket. But when the cluster's hosts are all
//! alike and every rank starts the step in the same state, a schedule that looks the same from
//! every host (after renumbering the hosts) keeps them alike, and simulating the ranks of one
//! host is exact: what host 0 receives from host h is, by the symmetry, what host `-h` (or
//! `h`) sends to host 0's images. [`compile`] looks for such a renumbering, host rotation
//! (`rank + k x devices`: ring, redundant, hierarchical over them) or host XOR (`rank ^ k x
//! devices` with powers of two: halving-doubling), by recording host 0's ranks and a sample of
//! other hosts' and checking that theirs are host 0's programs renumbered (receives between
//! two sends compared as a set: their order does not change when the next send starts). The
//! engine then runs host 0's ranks only and maps every message to the image that lands on host
//! 0. Schedules with no such symmetry (tree's root, halving-doubling off a power of two) and
//! steps with stragglers run every rank, within [`MAX_EVENTS`].

use super::topology::Topology;
use crate::comm::record::{Event, RecordError, Recorder};
use crate::comm::{tree_broadcast, AcrossOp, CommError, Hierarchy, Transport, WireFormat};
use crate::parallel::BucketOp;
use std::collections::HashMap;

/// The most messages one simulated step may hold (summed over its buckets and simulated
/// ranks), and the most one recording may write down: about 16 bytes each, and a few seconds
/// of simulation at this size. Larger configurations are refused with this figure.
pub const MAX_EVENTS: usize = 20_000_000;

/// The longest buffer a recording may allocate (f32 elements, 64 MiB): [`Job::exact_len`]
/// grows with the workers for ring (one chunk per worker), so this bounds the workers a ring
/// can be recorded for.
pub const MAX_RECORD_LEN: usize = 1 << 24;

/// The most element operations recording every rank of one job may take (each rank's
/// messages plus a pass over the recording buffer: a few seconds).
pub const MAX_RECORD_WORK: usize = 2_000_000_000;

/// What a communication thread runs (the trainer reducer's two kinds of job).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// A gradient bucket's operation, its messages in a wire format (`--compress`).
    Bucket(BucketOp, WireFormat),
    /// Tree mode: worker 0's updated weights down the binomial tree.
    WeightBroadcast,
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bucket(op, w) if *w != WireFormat::F32 && op.sends_messages() => {
                write!(f, "{op}+{w}")
            }
            Self::Bucket(op, _) => write!(f, "{op}"),
            Self::WeightBroadcast => f.write_str("weight broadcast"),
        }
    }
}

impl Job {
    /// Runs the job as the trainer's communication thread does (one tag per collective).
    pub fn run(
        self,
        t: &dyn Transport,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        match self {
            Self::Bucket(op, wire) => {
                op.run_on_wire(wire, t, buf, 0, scratch, &std::sync::Mutex::new(Vec::new()))
            }
            Self::WeightBroadcast => tree_broadcast(t, buf, 0, 0),
        }
    }

    /// The buffer length (elements) at which every message of this job over `world` ranks is
    /// an exact fraction of the buffer: the chunks its algorithm cuts a buffer into (over the
    /// process leaders for a hierarchical all-reduce). MPI's native all-reduce has no schedule
    /// of ours to record.
    /// Compressed, each message of `n` values is `ceil(n / 2)` carriers: exact at twice that.
    pub fn exact_len(self, world: usize) -> Result<usize, String> {
        let values = self.exact_values(world)?;
        Ok(match self {
            Self::Bucket(op, wire) if wire != WireFormat::F32 && op.sends_messages() => 2 * values,
            _ => values,
        })
    }

    /// [`Job::exact_len`] in values, as if sent in f32.
    fn exact_values(self, world: usize) -> Result<usize, String> {
        match self {
            Self::Bucket(BucketOp::AllReduce(m), _) => Ok(m.chunks(world)),
            Self::Bucket(BucketOp::ReduceToRoot, _) | Self::WeightBroadcast => Ok(1),
            // The leaders cut the whole buffer; in two dimensions each of the W shards is cut.
            Self::Bucket(
                BucketOp::Hierarchical {
                    hierarchy,
                    across: AcrossOp::AllReduce(m),
                    workers_per_process,
                },
                _,
            ) => {
                let w = workers_per_process.max(1);
                let across = m.chunks(world / w);
                Ok(match hierarchy {
                    Hierarchy::Leader => across,
                    Hierarchy::TwoD => across * w,
                })
            }
            Self::Bucket(BucketOp::Native, _)
            | Self::Bucket(
                BucketOp::Hierarchical {
                    across: AcrossOp::Native,
                    ..
                },
                _,
            ) => Err(
                "mpi-native runs MPI's own all-reduce, whose messages are MPI's and not ours to \
                 record: simulate tree, ring, hd, redundant or auto"
                    .into(),
            ),
            Self::Bucket(BucketOp::SharedMemory, _) => Err(
                "shm reads the other workers' buffers in place: it sends no messages to record, \
                 and the simulator's devices share no memory: simulate tree, ring, hd, \
                 redundant or auto"
                    .into(),
            ),
        }
    }
}

/// A renumbering of the hosts under which a schedule looks the same (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symmetry {
    /// Host `k` of a rotation: rank `r` becomes `(r + k x devices) mod workers`.
    HostRotation,
    /// Host `k` of an XOR: rank `r` becomes `r ^ (k x devices)` (hosts and devices powers of
    /// two).
    HostXor,
}

impl Symmetry {
    /// The image of `rank` under the element that takes host 0 to host `k`.
    fn apply(self, topo: &Topology, k: usize, rank: usize) -> usize {
        let shift = k * topo.devices_per_host;
        match self {
            Self::HostRotation => (rank + shift) % topo.workers(),
            Self::HostXor => rank ^ shift,
        }
    }

    /// The rank whose image under that element is `rank`.
    fn inverse(self, topo: &Topology, k: usize, rank: usize) -> usize {
        let shift = k * topo.devices_per_host;
        match self {
            Self::HostRotation => (rank + topo.workers() - shift) % topo.workers(),
            Self::HostXor => rank ^ shift,
        }
    }

    /// The renumberings that keep `topo`'s hosts whole.
    fn candidates(topo: &Topology) -> Vec<Self> {
        let mut v = vec![Self::HostRotation];
        if topo.hosts.is_power_of_two() && topo.devices_per_host.is_power_of_two() {
            v.push(Self::HostXor);
        }
        v
    }
}

/// One step of a simulated rank's program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Send a fraction of the buffer to simulated rank `dst`, over the NIC (`nic`) or within
    /// the host; the message fills `slot`.
    Send {
        /// Simulated rank receiving it (with symmetry: host 0's image of the receiver).
        dst: u32,
        /// Between hosts (the NICs) or within one (the devices' ports).
        nic: bool,
        /// Message size as a fraction of the buffer.
        frac: f64,
        /// The message's index in the job.
        slot: u32,
    },
    /// Wait for the message in `slot`.
    Recv {
        /// The message's index in the job.
        slot: u32,
    },
}

/// A job's recorded schedule, ready for the engine.
#[derive(Debug, Clone)]
pub struct CompiledJob {
    /// The job.
    pub job: Job,
    /// Hosts it was compiled for.
    pub hosts: usize,
    /// Devices per host it was compiled for.
    pub devices_per_host: usize,
    /// The renumbering that lets host 0's ranks stand for all (`None`: every rank simulated).
    pub symmetry: Option<Symmetry>,
    /// Simulated ranks: host 0's devices with symmetry, every worker without.
    pub ranks: usize,
    /// Simulated rank `s`'s program is `steps[start[s]..start[s + 1]]`.
    pub start: Vec<usize>,
    /// Every simulated rank's program, one after the other.
    pub steps: Vec<Step>,
    /// Messages (send slots).
    pub slots: usize,
}

impl CompiledJob {
    /// Simulated rank `s`'s program.
    pub fn program(&self, s: usize) -> &[Step] {
        &self.steps[self.start[s]..self.start[s + 1]]
    }
}

/// Whether to look for a symmetry or simulate every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranks {
    /// Host 0's ranks if a symmetry is found, else every rank.
    Symmetric,
    /// Every rank (stragglers, or a step that mixes in a job without symmetry).
    All,
}

/// Records and compiles `job` for `topo` (see the module docs); `budget` bounds the recorded
/// events. The error names the job, the cluster and the limit that was hit.
pub fn compile(
    job: Job,
    topo: &Topology,
    ranks: Ranks,
    budget: usize,
) -> Result<CompiledJob, String> {
    let rec = Recording::new(job, topo, ranks, budget)?;
    let mut programs: Vec<Vec<Event>> = Vec::new();
    let mut symmetry = None;
    if ranks == Ranks::Symmetric && topo.hosts > 1 {
        let d = topo.devices_per_host;
        programs = (0..d).map(|r| rec.one_rank(r)).collect::<Result<_, _>>()?;
        symmetry = find_symmetry(topo, &programs, &|r| rec.one_rank(r))?;
    }
    if symmetry.is_none() {
        rec.check_every_rank_fits()?;
        programs = rec.every_rank()?;
    }
    link(job, topo, symmetry, rec.len, &programs).map_err(|e| format!("{}: {e}", rec.what()))
}

/// `job` on `topo`, for messages: "ring over 8 workers (2 hosts x 4)".
fn describe(job: Job, topo: &Topology) -> String {
    format!(
        "{job} over {} workers ({} hosts x {})",
        topo.workers(),
        topo.hosts,
        topo.devices_per_host
    )
}

/// Recording one job's schedule for one cluster: rank by rank, within the step's budget of
/// events.
struct Recording<'a> {
    job: Job,
    topo: &'a Topology,
    ranks: Ranks,
    world: usize,
    /// Elements of the recorded buffer (one per chunk).
    len: usize,
    budget: usize,
    recorder: std::cell::RefCell<Recorder>,
}

impl<'a> Recording<'a> {
    /// Refuses a buffer too large to record.
    fn new(job: Job, topo: &'a Topology, ranks: Ranks, budget: usize) -> Result<Self, String> {
        let world = topo.workers();
        let len = job.exact_len(world)?;
        if len > MAX_RECORD_LEN {
            return Err(format!(
                "{}: recording it takes a buffer of {len} elements (one per chunk), more than the \
                 limit of {MAX_RECORD_LEN}; simulate fewer workers",
                describe(job, topo)
            ));
        }
        Ok(Self {
            job,
            topo,
            ranks,
            world,
            len,
            budget,
            recorder: std::cell::RefCell::new(Recorder::new(world, len)),
        })
    }

    /// The job and the cluster, for messages.
    fn what(&self) -> String {
        describe(self.job, self.topo)
    }

    /// Rank `rank`'s program, at most `limit` events.
    fn record(&self, rank: usize, limit: usize) -> Result<Vec<Event>, RecordError> {
        let job = self.job;
        self.recorder
            .borrow_mut()
            .record(rank, limit, |t, b, s| job.run(t, b, s))
    }

    /// A recording failure other than length, naming the job.
    fn failed(&self, e: RecordError) -> String {
        format!("{}: {e}", self.what())
    }

    /// One rank's program, which may hold a quarter of a step's budget: longer is hopeless,
    /// and bounding it bounds the memory of a recording that will be refused.
    fn one_rank(&self, rank: usize) -> Result<Vec<Event>, String> {
        self.record(rank, self.budget / 4).map_err(|e| match e {
            RecordError::TooLong { .. } => format!(
                "{}: {e}, more than the simulator takes ({MAX_EVENTS} messages a step, a few \
                 seconds); simulate fewer workers",
                self.what()
            ),
            e => self.failed(e),
        })
    }

    /// Why every rank cannot be simulated: `why`, and what to do instead.
    fn too_many(&self, why: String) -> String {
        format!(
            "{}: simulating every rank ({}) {why} (a few seconds of simulation); simulate \
             fewer workers{}",
            self.what(),
            if self.ranks == Ranks::All {
                "stragglers, or a mode without symmetry in the same step, need every rank"
            } else {
                "its schedule looks different from different hosts"
            },
            if self.ranks == Ranks::All {
                ""
            } else {
                ", or a mode whose schedule is the same from every host (ring, redundant, \
                 hd on powers of two), which is simulated through one host"
            }
        )
    }

    /// Before recording every rank, an estimate from a few: every rank takes part in every
    /// collective here, and recording one costs its messages plus a pass over the buffer (the
    /// algorithm's own additions). Refuses what would pass the budget or the recording work.
    fn check_every_rank_fits(&self) -> Result<(), String> {
        let (world, budget) = (self.world, self.budget);
        let sample: Vec<usize> = [0, 1, world / 2, world - 1]
            .into_iter()
            .filter(|&r| r < world)
            .collect();
        let mut sampled = 0usize;
        for &r in &sample {
            sampled += self.one_rank(r)?.len();
        }
        let events = (sampled as f64 / sample.len() as f64) * world as f64;
        if events > budget as f64 {
            return Err(self.too_many(format!(
                "means about {events:.0} messages, over the limit of {budget}"
            )));
        }
        let work = world as f64 * (self.len as f64 + events / world as f64);
        if work > MAX_RECORD_WORK as f64 {
            return Err(self.too_many(format!(
                "takes about {work:.0} element operations to record, over the limit of \
                 {MAX_RECORD_WORK}"
            )));
        }
        Ok(())
    }

    /// Every rank's program, rank by rank, never allocating per rank up front: a cluster too
    /// large to simulate stops at the budget instead of at the memory.
    fn every_rank(&self) -> Result<Vec<Vec<Event>>, String> {
        let (world, budget) = (self.world, self.budget);
        let mut programs = Vec::new();
        let mut total = 0usize;
        for r in 0..world {
            let left = (budget - total).min(budget / 4);
            let p = self.record(r, left).map_err(|e| match e {
                RecordError::TooLong { .. } => {
                    self.too_many(format!("means more than {budget} messages, the limit"))
                }
                e => self.failed(e),
            })?;
            total += p.len();
            if total >= budget && r + 1 < world {
                return Err(self.too_many(format!("means more than {budget} messages, the limit")));
            }
            programs.push(p);
        }
        Ok(programs)
    }
}

/// A program in canonical form, for comparing two: each run of receives between two sends
/// sorted.
fn canonical(events: impl Iterator<Item = Event>) -> Vec<Event> {
    // Receives between two sends are a set for the timing (the next send waits for all of
    // them), so each run of receives is sorted.
    let mut out: Vec<Event> = Vec::new();
    let mut run_start = 0;
    for e in events {
        if let Event::Send { .. } = e {
            out[run_start..].sort_unstable();
            out.push(e);
            run_start = out.len();
        } else {
            out.push(e);
        }
    }
    out[run_start..].sort_unstable();
    out
}

/// Finds a renumbering of the hosts under which the sampled hosts' programs are host 0's
/// (`reps`), recording the samples with `record`.
fn find_symmetry(
    topo: &Topology,
    reps: &[Vec<Event>],
    record: &dyn Fn(usize) -> Result<Vec<Event>, String>,
) -> Result<Option<Symmetry>, String> {
    let h = topo.hosts;
    // The second and last hosts, the middle one, and a few spread by a fixed stride.
    let mut hosts = vec![1, h - 1, h / 2, (h / 3).max(1), (h * 2 / 3).max(1)];
    hosts.retain(|&k| k > 0 && k < h);
    hosts.sort_unstable();
    hosts.dedup();
    let mut candidates = Symmetry::candidates(topo);
    for &k in &hosts {
        for (l, rep) in reps.iter().enumerate() {
            // Host k's l-th rank is k x devices + l under every candidate.
            let rank = k * topo.devices_per_host + l;
            let got = canonical(record(rank)?.into_iter());
            candidates.retain(|&sym| {
                let mapped = rep.iter().map(|e| match *e {
                    Event::Send { to, elems } => Event::Send {
                        to: sym.apply(topo, k, to),
                        elems,
                    },
                    Event::Recv { from, elems } => Event::Recv {
                        from: sym.apply(topo, k, from),
                        elems,
                    },
                });
                canonical(mapped) == got
            });
            if candidates.is_empty() {
                return Ok(None);
            }
        }
    }
    Ok(candidates.first().copied())
}

/// Pairs every receive with its send and maps ranks to simulated ranks and links.
fn link(
    job: Job,
    topo: &Topology,
    symmetry: Option<Symmetry>,
    len: usize,
    programs: &[Vec<Event>],
) -> Result<CompiledJob, String> {
    let d = topo.devices_per_host;
    let ranks = programs.len();
    // Every receive by (simulated rank, source as it sees it, k-th from that source).
    let mut recv_at: HashMap<(usize, usize, usize), (usize, usize)> = HashMap::new();
    let mut start = Vec::with_capacity(ranks + 1);
    let mut steps = Vec::with_capacity(programs.iter().map(Vec::len).sum());
    for (s, p) in programs.iter().enumerate() {
        start.push(steps.len());
        let mut from_count: HashMap<usize, usize> = HashMap::new();
        for e in p {
            match *e {
                Event::Recv { from, elems } => {
                    let k = from_count.entry(from).or_default();
                    recv_at.insert((s, from, *k), (steps.len(), elems));
                    *k += 1;
                    steps.push(Step::Recv { slot: u32::MAX });
                }
                Event::Send { .. } => steps.push(Step::Send {
                    dst: 0,
                    nic: false,
                    frac: 0.0,
                    slot: 0,
                }),
            }
        }
    }
    start.push(steps.len());
    let mut slots = 0usize;
    for (s, p) in programs.iter().enumerate() {
        let mut to_count: HashMap<usize, usize> = HashMap::new();
        for (i, e) in p.iter().enumerate() {
            let Event::Send { to, elems } = *e else {
                continue;
            };
            let k = to_count.entry(to).or_default();
            let (dst, seen_from, nic) = match symmetry {
                // The message lands on host `to / d`; its image under the element taking host 0
                // there lands on host 0, coming from the inverse image of this sender.
                Some(sym) => {
                    let host = to / d;
                    (to % d, sym.inverse(topo, host, s), host != 0)
                }
                None => (to, s, topo.host_of(to) != topo.host_of(s)),
            };
            let Some((j, want)) = recv_at.remove(&(dst, seen_from, *k)) else {
                return Err(format!(
                    "the recorded schedule is inconsistent: rank {s} sends message {} to rank \
                     {to}, which never receives it (a bug in the algorithm or the recording)",
                    *k + 1
                ));
            };
            if want != elems {
                return Err(format!(
                    "the recorded schedule is inconsistent: rank {s} sends {elems} elements to \
                     rank {to}, which expects {want}"
                ));
            }
            *k += 1;
            let slot = u32::try_from(slots).map_err(|_| "too many messages to index")?;
            steps[start[s] + i] = Step::Send {
                dst: dst as u32,
                nic,
                frac: elems as f64 / len as f64,
                slot,
            };
            steps[j] = Step::Recv { slot };
            slots += 1;
        }
    }
    if let Some(((s, from, k), _)) = recv_at.into_iter().next() {
        return Err(format!(
            "the recorded schedule is inconsistent: rank {s} waits for message {} from rank \
             {from}, which is never sent (a bug in the algorithm or the recording)",
            k + 1
        ));
    }
    Ok(CompiledJob {
        job,
        hosts: topo.hosts,
        devices_per_host: d,
        symmetry,
        ranks,
        start,
        steps,
        slots,
    })
}
