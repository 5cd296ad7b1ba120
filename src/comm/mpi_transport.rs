//! The MPI side of a multi-process run (the `mpi` feature): one [`MpiPort`] per worker thread,
//! through which it reaches the workers of the other processes (ranks are MPI ranks).
//!
//! Our collectives (tree, ring, hd, redundant) run unchanged on top of MPI point-to-point
//! messages (each worker's port is wrapped with its in-process endpoint into a
//! [`crate::comm::HybridTransport`] over every worker of the run), and `--comm mpi-native`
//! calls MPI's own `MPI_Allreduce` as the reference to beat.
//!
//! Why it is built the way it is:
//! * **Sends never wait for the receiver** (the [`crate::comm::Transport`] contract: a "send,
//!   then receive" exchange must not deadlock). Each send copies the data into an owned buffer
//!   and posts an `MPI_Isend`; the buffer stays alive in a pending list until MPI reports the
//!   send complete. A small progress thread tests that list, because over TCP a large
//!   (rendezvous) message only moves while the sender calls into MPI, and the communication
//!   threads may sit idle between buckets.
//! * **Receives have a deadline**: a dead or stopped peer must end the run with
//!   [`CommError::Timeout`] within `--comm-timeout`, never hang it. So a receive polls
//!   `MPI_Improbe` (spinning briefly, then sleeping) until the message is there or the deadline
//!   passes; once matched, `MPI_Mrecv` takes it. Probing first also gives the message's length,
//!   so a wrong-sized message is a [`CommError::SizeMismatch`] instead of MPI's fatal
//!   truncation error.
//! * **Every MPI call in the process holds one process-wide lock** (`MPI_CALLS`). MPI may
//!   grant only `MPI_THREAD_SERIALIZED` (we ask for `MULTIPLE` and accept less), which forbids
//!   two threads inside MPI at once *anywhere in the process*, not just per communicator; the
//!   callers are several communication threads, the progress threads and the main thread's
//!   control messages. A lock per endpoint would not exclude those from each other, one lock
//!   does, whatever level MPI granted. The calls made under it are short (probe, test, post,
//!   receive of an already matched message); only `mpi-native`'s `MPI_Allreduce` blocks
//!   (with several workers per process only the process leader calls it), and a watchdog
//!   ends the process if it outlasts `--comm-timeout`.
//! * **One communicator for the workers of a process**, with the sending and the receiving
//!   worker (their index within their process) encoded in the MPI tag next to the step and the
//!   bucket ([`TagLayout`], checked against the library's `MPI_TAG_UB`). MPI matches by source
//!   process and tag, so two workers' messages can never be confused, and one progress thread
//!   serves them all.
//! * Payloads travel as bytes (`MPI_BYTE`): one code path for gradients and for the start-up
//!   handshake's text; the ranks of a run share one architecture, so f32 byte order agrees.
//! * The gradient traffic and the run's control messages have their own duplicated
//!   communicators, so they can never match each other's receives.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::point_to_point::Status;
use mpi::raw::AsRaw;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use crate::comm::error::CommError;
use crate::comm::hybrid::RemotePort;

/// MPI for one process: initialised with a thread level that lets the communication threads
/// call it, finalised when dropped (unless [`MpiRuntime::abandon`]ed).
pub struct MpiRuntime {
    // Fields drop in declaration order: the control endpoint (its communicator) must be freed
    // before the universe, whose drop calls MPI_Finalize.
    control: Endpoint,
    universe: Universe,
    rank: usize,
    size: usize,
    /// The largest tag the library accepts (`MPI_TAG_UB`).
    tag_ub: u32,
}

impl MpiRuntime {
    /// Initialises MPI. Fails if it was initialised before or cannot grant
    /// `MPI_THREAD_SERIALIZED` (calls come from communication threads, not the main thread).
    /// `timeout` bounds every wait of the control messages (handshake, final checks).
    pub fn init(timeout: Duration) -> Result<Self, String> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or("MPI was already initialised in this process")?;
        if !matches!(threading, Threading::Multiple | Threading::Serialized) {
            return Err(format!(
                "the MPI library grants thread level {threading:?}; dptrain's communication \
                 threads need at least Serialized (rebuild OpenMPI with thread support)"
            ));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let tag_ub = tag_upper_bound(&world);
        let control = Endpoint::new(&world, timeout, TagLayout::new(tag_ub, 1)?);
        Ok(Self {
            universe,
            rank,
            size,
            control,
            tag_ub,
        })
    }

    /// This process's MPI rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of MPI ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The ports of this process's `workers` worker threads, element `w` for local worker `w`,
    /// on one new communicator for gradient traffic. Collective: every rank must call it, with
    /// the same `workers`, in the same order. Drop them before this runtime. Fails when the
    /// library's tag range cannot address that many workers per process.
    pub fn ports(&self, workers: usize, timeout: Duration) -> Result<Vec<MpiPort>, String> {
        let layout = TagLayout::new(self.tag_ub, workers)?;
        let ep = Arc::new(Endpoint::new(&self.universe.world(), timeout, layout));
        Ok((0..workers)
            .map(|worker| MpiPort {
                ep: ep.clone(),
                worker,
                watchdog: Watchdog::new(ep.rank, ep.size),
            })
            .collect())
    }

    /// Every rank's `mine`, in rank order (each rank sends its bytes to every other rank).
    /// Waits at most `timeout` for each peer.
    pub fn all_gather_bytes(
        &self,
        mine: &[u8],
        tag: u64,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, CommError> {
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            self.control
                .post_send(peer, self.control.layout.tag(tag, 0, 0)?, mine);
        }
        (0..self.size)
            .map(|peer| {
                if peer == self.rank {
                    Ok(mine.to_vec())
                } else {
                    let mpi_tag = self.control.layout.tag(tag, 0, 0)?;
                    let got =
                        self.control
                            .recv_owned(peer, tag, mpi_tag, Instant::now() + timeout)?;
                    Ok(got.into_vec())
                }
            })
            .collect()
    }

    /// Sends `mine` to the next rank (`rank + 1`, wrapping) and receives the previous rank's
    /// message of the same tag; returns how long after the call that message had arrived,
    /// waiting at most `timeout`. Every rank calls it at once, so each link carries one message
    /// up and one down: the per-rank report's probe of the path from the previous rank.
    pub fn shift_exchange(
        &self,
        mine: &[u8],
        tag: u64,
        timeout: Duration,
    ) -> Result<Duration, CommError> {
        let started = Instant::now();
        let (next, prev) = (
            (self.rank + 1) % self.size,
            (self.rank + self.size - 1) % self.size,
        );
        let mpi_tag = self.control.layout.tag(tag, 0, 0)?;
        self.control.post_send(next, mpi_tag, mine);
        let got = self
            .control
            .recv_owned(prev, tag, mpi_tag, started + timeout)?;
        let took = started.elapsed();
        self.control.give_back(got);
        Ok(took)
    }

    /// Exits without `MPI_Finalize`: after a peer died or stalled, finalising could wait for
    /// it forever. The process should exit right after; mpirun then reports it.
    pub fn abandon(self) {
        // The control endpoint is leaked too: dropping it would wait for sends to dead peers.
        std::mem::forget(self);
    }
}

/// One worker thread's port to the workers of the other processes (a [`RemotePort`]): all the
/// ports of a process share one communicator, one progress thread and the pending sends.
pub struct MpiPort {
    ep: Arc<Endpoint>,
    /// This worker's index within its process.
    worker: usize,
    /// Bounds `mpi-native`'s blocking `MPI_Allreduce` by `--comm-timeout`.
    watchdog: Watchdog,
}

/// Ends the process with a clear error if an armed wait outlasts its timeout: for the one MPI
/// call that cannot be abandoned (`MPI_Allreduce`). One thread per port, started when first
/// armed; arming and disarming take a lock and signal a condition variable, no allocation.
struct Watchdog {
    rank: usize,
    size: usize,
    state: Arc<WatchState>,
    thread: std::sync::OnceLock<JoinHandle<()>>,
}

impl Watchdog {
    fn new(rank: usize, size: usize) -> Self {
        Self {
            rank,
            size,
            state: Arc::new((Mutex::new(None), Condvar::new())),
            thread: std::sync::OnceLock::new(),
        }
    }

    /// Starts watching: `timeout` from now, unless disarmed first.
    fn arm(&self, timeout: Duration) {
        self.thread.get_or_init(|| {
            let (state, rank, size) = (self.state.clone(), self.rank, self.size);
            std::thread::Builder::new()
                .name("mpi-watchdog".into())
                .spawn(move || watch(&state, rank, size))
                .expect("spawning the MPI watchdog thread")
        });
        let (armed, wake) = &*self.state;
        *armed.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), timeout));
        wake.notify_one();
    }

    /// Stops watching.
    fn disarm(&self) {
        *self.state.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The armed wait (its start and timeout), if any, and the signal that it changed.
type WatchState = (Mutex<Option<(Instant, Duration)>>, Condvar);

/// The watchdog thread: sleeps until the armed deadline (or forever while disarmed); if the
/// deadline passes while still armed, prints the run's error line and exits the process.
fn watch(state: &WatchState, rank: usize, size: usize) {
    let (armed, wake) = state;
    let mut guard = armed.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        guard = match *guard {
            None => wake.wait(guard).unwrap_or_else(|e| e.into_inner()),
            Some((since, timeout)) if since.elapsed() >= timeout => {
                eprintln!(
                    "error: rank {rank} of {size}: MPI_Allreduce (--comm mpi-native) did not \
                     complete within {timeout:?} (--comm-timeout): a process may have died or \
                     stalled; raise --comm-timeout if steps are legitimately this slow"
                );
                // A commit being written by another thread is not left half-made beside it.
                crate::interrupt::exit_cleaning_up(1);
            }
            Some((since, timeout)) => {
                let left = timeout.saturating_sub(since.elapsed());
                wake.wait_timeout(guard, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
}

impl RemotePort for MpiPort {
    fn process(&self) -> usize {
        self.ep.rank
    }

    fn processes(&self) -> usize {
        self.ep.size
    }

    fn send(&self, process: usize, worker: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.ep.check_peer(process)?;
        let mpi_tag = self.ep.layout.tag(tag, self.worker, worker)?;
        self.ep.post_send(process, mpi_tag, f32_bytes(data));
        Ok(())
    }

    fn recv(
        &self,
        process: usize,
        worker: usize,
        tag: u64,
        out: &mut [f32],
    ) -> Result<(), CommError> {
        self.ep.check_peer(process)?;
        let mpi_tag = self.ep.layout.tag(tag, worker, self.worker)?;
        let deadline = Instant::now() + self.ep.timeout;
        let got = self.ep.recv_owned(process, tag, mpi_tag, deadline)?;
        let n = got.len();
        if n == std::mem::size_of_val(out) {
            for (x, b) in out.iter_mut().zip(got.chunks_exact(4)) {
                *x = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        self.ep.give_back(got);
        if n != std::mem::size_of_val(out) {
            return Err(CommError::SizeMismatch {
                rank: self.ep.rank,
                from: process,
                tag,
                expected: out.len(),
                got: n / 4,
            });
        }
        Ok(())
    }

    fn all_reduce_sum_across_processes(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        scratch.clear();
        scratch.extend_from_slice(buf);
        // Blocking MPI_Allreduce: the reference should be MPI's best, and OpenMPI's
        // non-blocking MPI_Iallreduce measured up to 4x slower here (256 KB: 498 vs 119 us).
        // A blocking call cannot be abandoned, so a watchdog bounds it instead: past
        // --comm-timeout it reports and ends this process, and mpirun then ends the others.
        self.watchdog.arm(self.ep.timeout);
        {
            let _mpi = mpi_calls();
            self.ep
                .comm()
                .all_reduce_into(&scratch[..], buf, SystemOperation::sum());
        }
        self.watchdog.disarm();
        Ok(())
    }
}

/// The largest tag `comm`'s library accepts (`MPI_TAG_UB`; the standard promises at least
/// 32767, OpenMPI's TCP/shared-memory transports allow 2^31 - 1).
fn tag_upper_bound(comm: &SimpleCommunicator) -> u32 {
    let mut value: *mut std::ffi::c_int = std::ptr::null_mut();
    let mut flag: std::ffi::c_int = 0;
    // SAFETY: MPI_TAG_UB is a predefined attribute whose value is a pointer to an int owned
    // by the library; we only read it, and only when MPI says it is set.
    unsafe {
        mpi::ffi::MPI_Comm_get_attr(
            comm.as_raw(),
            mpi::ffi::MPI_TAG_UB as std::ffi::c_int,
            (&mut value as *mut *mut std::ffi::c_int).cast(),
            &mut flag,
        );
        if flag != 0 && !value.is_null() && *value > 0 {
            *value as u32
        } else {
            32767
        }
    }
}

/// How our 64-bit tags, and the sending and receiving worker, fold into one MPI tag.
///
/// Our tags are `step << 16 | bucket` (bucket 0xffff: a weight broadcast). From the low bits
/// up, the MPI tag holds the bucket (up to 12 bits, fewer when the library's tags are short;
/// the field's largest value stands for the broadcast), the receiving worker, the sending
/// worker (enough bits for `workers - 1` each), then the step modulo what is left. At most two
/// consecutive steps are ever in flight, so any step field of at least 3 bits keeps the tags in
/// flight distinct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagLayout {
    bucket_bits: u32,
    worker_bits: u32,
    step_bits: u32,
}

/// Most bits of the bucket field (4094 buckets and the broadcast).
const MAX_BUCKET_BITS: u32 = 12;
/// Fewest bits of the bucket field (62 buckets and the broadcast).
const MIN_BUCKET_BITS: u32 = 6;
/// The fewest step bits that keep the tags of two consecutive steps apart (with margin).
const MIN_STEP_BITS: u32 = 3;

impl TagLayout {
    /// The layout for `workers` workers per process under the library's `tag_ub`.
    pub fn new(tag_ub: u32, workers: usize) -> Result<Self, String> {
        let tag_bits = (32 - tag_ub.saturating_add(1).leading_zeros() - 1).min(31);
        let worker_bits = usize::BITS - workers.saturating_sub(1).leading_zeros();
        let left = tag_bits.checked_sub(2 * worker_bits + MIN_STEP_BITS);
        match left {
            Some(left) if left >= MIN_BUCKET_BITS => {
                let bucket_bits = left.min(MAX_BUCKET_BITS);
                Ok(Self {
                    bucket_bits,
                    worker_bits,
                    step_bits: tag_bits - bucket_bits - 2 * worker_bits,
                })
            }
            _ => Err(format!(
                "this MPI library's tags go up to {tag_ub} (MPI_TAG_UB), too few to address \
                 {workers} workers per process; start more MPI ranks with fewer --workers each"
            )),
        }
    }

    /// The MPI tag of our `tag` from local worker `src` to local worker `dst`.
    pub fn tag(&self, tag: u64, src: usize, dst: usize) -> Result<i32, CommError> {
        let broadcast = (1u64 << self.bucket_bits) - 1;
        let bucket = match tag & 0xffff {
            0xffff => broadcast,
            b if b < broadcast => b,
            b => {
                return Err(CommError::Transport {
                    rank: src,
                    detail: format!(
                        "bucket {b} does not fit in this MPI library's tags (at most {broadcast} \
                         buckets); use larger buckets (--bucket-kb)"
                    ),
                })
            }
        };
        let step = (tag >> 16) & ((1 << self.step_bits) - 1);
        let folded = (((step << self.worker_bits | src as u64) << self.worker_bits | dst as u64)
            << self.bucket_bits)
            | bucket;
        Ok(folded as i32)
    }
}

/// A posted send and the leaked buffer MPI reads until it completes.
type PendingSend = (Request<'static, [u8], StaticScope>, *mut [u8]);

/// Sends posted but not yet completed, with the buffers MPI is still reading, and message
/// buffers free for reuse (bucket sizes repeat every step, so steps allocate none).
struct Pending {
    sends: Vec<PendingSend>,
    free: Vec<Box<[u8]>>,
    closed: bool,
}

/// Most free message buffers kept per endpoint.
const MAX_FREE_BUFFERS: usize = 64;

// SAFETY: the requests and buffers are only touched with the endpoint's mutex and the
// process-wide MPI lock held (see MPI_CALLS), so which thread calls does not matter.
unsafe impl Send for Pending {}

impl Pending {
    /// A free buffer of exactly `n` bytes, or a new one.
    fn buffer(&mut self, n: usize) -> Box<[u8]> {
        match self.free.iter().position(|b| b.len() == n) {
            Some(i) => self.free.swap_remove(i),
            None => vec![0u8; n].into_boxed_slice(),
        }
    }

    /// Keeps `b` for reuse (up to [`MAX_FREE_BUFFERS`]).
    fn give_back(&mut self, b: Box<[u8]>) {
        if self.free.len() < MAX_FREE_BUFFERS {
            self.free.push(b);
        }
    }

    /// Tests every pending send; frees the buffers of those that completed. Call with
    /// [`MPI_CALLS`] held.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.sends.len() {
            let (req, buf) = self.sends.swap_remove(i);
            match req.test() {
                Ok(_) => {
                    // SAFETY: `buf` came from Box::leak in post_send, and MPI is done with it.
                    self.give_back(unsafe { Box::from_raw(buf) });
                }
                Err(req) => {
                    self.sends.push((req, buf));
                    let last = self.sends.len() - 1;
                    self.sends.swap(i, last);
                    i += 1;
                }
            }
        }
    }
}

/// Held around every MPI call of the process (see the module docs: MPI may grant only
/// `MPI_THREAD_SERIALIZED`, under which no two threads may be inside MPI at once, whatever
/// communicator they use). Lock order: this first, then an endpoint's `pending`; never the
/// other way round.
static MPI_CALLS: Mutex<()> = Mutex::new(());

/// Takes [`MPI_CALLS`] (ignoring poisoning: it guards no data).
fn mpi_calls() -> MutexGuard<'static, ()> {
    MPI_CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// One communicator and the machinery around it (shared with the progress thread).
struct Shared {
    comm: SimpleCommunicator,
    pending: Mutex<Pending>,
    wake: Condvar,
}

// SAFETY: the communicator is only used with MPI_CALLS held (see Pending).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A communicator with its pending sends and progress thread.
struct Endpoint {
    /// Dropped by hand in `Drop`, with [`MPI_CALLS`] held (freeing the communicator is an MPI
    /// call too).
    shared: ManuallyDrop<Arc<Shared>>,
    rank: usize,
    size: usize,
    timeout: Duration,
    layout: TagLayout,
    progress: Option<JoinHandle<()>>,
}

/// [`MPI_CALLS`] and an endpoint's pending sends, locked in that order.
struct MpiGuard<'a> {
    pending: MutexGuard<'a, Pending>,
    _calls: MutexGuard<'static, ()>,
}

impl std::ops::Deref for MpiGuard<'_> {
    type Target = Pending;
    fn deref(&self) -> &Pending {
        &self.pending
    }
}

impl std::ops::DerefMut for MpiGuard<'_> {
    fn deref_mut(&mut self) -> &mut Pending {
        &mut self.pending
    }
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the MPI lock, then `s`'s pending sends.
fn lock_for_mpi(s: &Shared) -> MpiGuard<'_> {
    let calls = mpi_calls();
    MpiGuard {
        pending: lock(&s.pending),
        _calls: calls,
    }
}

impl Endpoint {
    /// Duplicates `parent` (collective) and starts the progress thread.
    fn new(parent: &SimpleCommunicator, timeout: Duration, layout: TagLayout) -> Self {
        let (comm, rank, size) = {
            let _mpi = mpi_calls();
            let comm = parent.duplicate();
            let (rank, size) = (comm.rank() as usize, comm.size() as usize);
            (comm, rank, size)
        };
        let shared = Arc::new(Shared {
            comm,
            pending: Mutex::new(Pending {
                sends: Vec::new(),
                free: Vec::new(),
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let progress = std::thread::Builder::new()
            .name(format!("mpi-progress-{rank}"))
            .spawn(move || progress_thread(&s))
            .ok();
        Self {
            shared: ManuallyDrop::new(shared),
            rank,
            size,
            timeout,
            layout,
            progress,
        }
    }

    fn comm(&self) -> &SimpleCommunicator {
        &self.shared.comm
    }

    /// Locks for an MPI call on this endpoint.
    fn lock(&self) -> MpiGuard<'_> {
        lock_for_mpi(&self.shared)
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        if peer < self.size {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank: self.rank,
                peer,
                world: self.size,
            })
        }
    }

    /// Posts a non-blocking send of a copy of `bytes` under MPI tag `mpi_tag`; the copy (a
    /// reused buffer) stays alive until MPI completes the send.
    fn post_send(&self, to: usize, mpi_tag: i32, bytes: &[u8]) {
        let mut p = self.lock();
        p.reap();
        let mut owned = p.buffer(bytes.len());
        owned.copy_from_slice(bytes);
        let buf: &'static [u8] = Box::leak(owned);
        let req = self
            .comm()
            .process_at_rank(to as i32)
            .immediate_send_with_tag(StaticScope, buf, mpi_tag);
        p.sends.push((req, buf as *const [u8] as *mut [u8]));
        drop(p);
        self.shared.wake.notify_one();
    }

    /// Receives the next message from `from` with MPI tag `mpi_tag` into a reused buffer
    /// (hand it back with [`Endpoint::give_back`]), or fails with [`CommError::Timeout`] once
    /// `deadline` passes. `tag` is our tag, for the error.
    ///
    /// Both waits are bounded: for the message to match (`MPI_Improbe`), and for its data to
    /// arrive (`MPI_Imrecv`, then tests). A blocking `MPI_Mrecv` would hang forever on a large
    /// message whose sender died after its first fragment. A receive abandoned at the deadline
    /// leaks its buffer, which MPI may still write into.
    fn recv_owned(
        &self,
        from: usize,
        tag: u64,
        mpi_tag: i32,
        deadline: Instant,
    ) -> Result<Box<[u8]>, CommError> {
        let started = Instant::now();
        let timeout = || CommError::Timeout {
            rank: self.rank,
            from,
            tag,
            waited: started.elapsed(),
        };
        let mut polls = 0u32;
        let (mut request, buf) = loop {
            {
                let mut p = self.lock();
                p.reap();
                let probe = self
                    .comm()
                    .process_at_rank(from as i32)
                    .immediate_matched_probe_with_tag(mpi_tag);
                if let Some((msg, status)) = probe {
                    let ptr = Box::into_raw(p.buffer(byte_count(&status)));
                    // SAFETY: `ptr` is a live allocation that nothing else uses until the
                    // request completes (then Box::from_raw takes it back) or is abandoned
                    // (then it is leaked), so MPI may write it for as long as it likes.
                    let buf: &'static mut [u8] = unsafe { &mut *ptr };
                    let request = msg.immediate_matched_receive_into(StaticScope, buf);
                    break (request, ptr);
                }
            }
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            backoff(&mut polls, started);
        };
        loop {
            {
                let _mpi = self.lock();
                match request.test() {
                    // SAFETY: `buf` came from Box::into_raw above, and MPI is done with it.
                    Ok(_) => return Ok(unsafe { Box::from_raw(buf) }),
                    Err(r) => request = r,
                }
            }
            if Instant::now() >= deadline {
                // Dropping an incomplete request panics; it and its buffer are leaked.
                std::mem::forget(request);
                return Err(timeout());
            }
            backoff(&mut polls, started);
        }
    }

    /// Keeps a buffer from [`Endpoint::recv_owned`] for reuse.
    fn give_back(&self, b: Box<[u8]>) {
        lock(&self.shared.pending).give_back(b);
    }
}

/// Waits between polls: spins a little for the common fast case, then sleeps so a long wait
/// does not take a core from the compute threads, for an eighth of the time waited so far
/// (50 us to 1 ms): a message is then noticed at most 1/8 (or 50 us) later than it arrived,
/// and a long wait polls at most about 1,000 times a second instead of 20,000. Measured
/// (resnet20, 4 hosts x 1 worker at 100 Mbit/s on 2 cores, before this): each rank's
/// communication thread took 13.3% of a core against the compute thread's 15.7%, with about
/// 10,000 involuntary context switches a second, from fixed 50 us sleeps.
fn backoff(polls: &mut u32, started: Instant) {
    *polls += 1;
    if *polls < 200 {
        std::thread::yield_now();
    } else {
        let sleep =
            (started.elapsed() / 8).clamp(Duration::from_micros(50), Duration::from_millis(1));
        std::thread::sleep(sleep);
    }
}

/// The bytes of `data` (a view, no copy).
fn f32_bytes(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any alignment suits u8; the view covers exactly `data`.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn byte_count(status: &Status) -> usize {
    status.count(u8::equivalent_datatype()).max(0) as usize
}

/// Tests the pending sends every 200 us while there are any; sleeps otherwise.
fn progress_thread(s: &Shared) {
    loop {
        {
            let p = lock(&s.pending);
            if p.closed {
                return;
            }
            if p.sends.is_empty() {
                // Wait without the MPI lock (nothing to test); woken by post_send or Drop.
                let _ = s
                    .wake
                    .wait_timeout(p, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner());
                continue;
            }
        }
        lock_for_mpi(s).reap();
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        lock(&self.shared.pending).closed = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.progress.take() {
            let _ = h.join();
        }
        // Sends still in flight must finish before their buffers (and the communicator) go;
        // a peer that never takes them (dead) gets one timeout's grace, then they are leaked.
        // (Short: after a failure the run is ending anyway, and a healthy peer takes its
        // messages within its current collective.)
        let deadline = Instant::now() + self.timeout.min(Duration::from_secs(1));
        loop {
            let mut p = self.lock();
            p.reap();
            if p.sends.is_empty() || Instant::now() >= deadline {
                for (req, _buf) in p.sends.drain(..) {
                    // Dropping an incomplete request panics; the buffer stays leaked on
                    // purpose.
                    std::mem::forget(req);
                }
                break;
            }
            drop(p);
            std::thread::sleep(Duration::from_micros(200));
        }
        let _mpi = mpi_calls();
        // SAFETY: `shared` is not used after this; the progress thread, which held the only
        // other reference, has been joined. Freeing the communicator happens under MPI_CALLS.
        unsafe { ManuallyDrop::drop(&mut self.shared) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_fit_the_bound_and_keep_workers_buckets_and_steps_apart() {
        let layout = TagLayout::new(32767, 2).unwrap();
        let mut seen = std::collections::HashSet::new();
        for step in 0..8u64 {
            for bucket in [0u64, 1, 100, 0xffff] {
                for (src, dst) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let t = layout.tag(step << 16 | bucket, src, dst).unwrap();
                    assert!((0..=32767).contains(&t), "{t}");
                    assert!(seen.insert(t), "step {step} bucket {bucket} {src}->{dst}");
                }
            }
        }
        assert!(layout.tag(1023, 0, 0).is_err());
        assert!(TagLayout::new(32767, 4).is_ok());
        let err = TagLayout::new(32767, 16).unwrap_err();
        assert!(err.contains("fewer --workers"), "{err}");
        assert!(TagLayout::new(i32::MAX as u32, 64).is_ok());
    }
}
