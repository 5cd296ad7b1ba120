//! [`Transport`] over MPI (the `mpi` feature): one worker per process, ranks are MPI ranks.
//!
//! Our collectives (tree, ring, hd, redundant) run unchanged on top of MPI point-to-point
//! messages, and `--comm mpi-native` calls MPI's own `MPI_Allreduce` as the reference to beat.
//!
//! Why it is built the way it is:
//! * **Sends never wait for the receiver** (the [`Transport`] contract: a "send, then receive"
//!   exchange must not deadlock). Each send copies the data into an owned buffer and posts an
//!   `MPI_Isend`; the buffer stays alive in a pending list until MPI reports the send complete.
//!   A small progress thread tests that list, because over TCP a large (rendezvous) message
//!   only moves while the sender calls into MPI, and the communication thread may sit idle
//!   between buckets.
//! * **Receives have a deadline**: a dead or stopped peer must end the run with
//!   [`CommError::Timeout`] within `--comm-timeout`, never hang it. So a receive polls
//!   `MPI_Improbe` (spinning briefly, then sleeping) until the message is there or the deadline
//!   passes; once matched, `MPI_Mrecv` takes it. Probing first also gives the message's length,
//!   so a wrong-sized message is a [`CommError::SizeMismatch`] instead of MPI's fatal
//!   truncation error.
//! * **Every MPI call goes through one mutex per endpoint**, so `MPI_THREAD_SERIALIZED` is
//!   enough (the communication thread and the progress thread both call MPI).
//! * Payloads travel as bytes (`MPI_BYTE`): one code path for gradients and for the start-up
//!   handshake's text; the ranks of a run share one architecture, so f32 byte order agrees.
//! * Each endpoint has its own duplicated communicator, so the run's control messages and the
//!   gradient traffic can never match each other's receives.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::point_to_point::{Message, Status};
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use crate::comm::error::CommError;
use crate::comm::transport::Transport;

/// MPI for one process: initialised with a thread level that lets the communication threads
/// call it, finalised when dropped (unless [`MpiRuntime::abandon`]ed).
pub struct MpiRuntime {
    // Fields drop in declaration order: the control endpoint (its communicator) must be freed
    // before the universe, whose drop calls MPI_Finalize.
    control: Endpoint,
    universe: Universe,
    rank: usize,
    size: usize,
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
        let control = Endpoint::new(&world, timeout);
        Ok(Self {
            universe,
            rank,
            size,
            control,
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

    /// A new endpoint for gradient traffic (its own communicator). Collective: every rank must
    /// call it, in the same order. Drop it before this runtime.
    pub fn transport(&self, timeout: Duration) -> MpiTransport {
        MpiTransport {
            ep: Endpoint::new(&self.universe.world(), timeout),
        }
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
                .post_send(peer, tag, mine.to_vec().into_boxed_slice());
        }
        (0..self.size)
            .map(|peer| {
                if peer == self.rank {
                    Ok(mine.to_vec())
                } else {
                    self.control
                        .recv_any_len(peer, tag, Instant::now() + timeout)
                }
            })
            .collect()
    }

    /// Exits without `MPI_Finalize`: after a peer died or stalled, finalising could wait for
    /// it forever. The process should exit right after; mpirun then reports it.
    pub fn abandon(self) {
        // The control endpoint is leaked too: dropping it would wait for sends to dead peers.
        std::mem::forget(self);
    }
}

/// A [`Transport`] whose ranks are the MPI ranks of the run (one worker per process).
pub struct MpiTransport {
    ep: Endpoint,
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.ep.rank
    }

    fn world(&self) -> usize {
        self.ep.size
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.ep.check_peer(to)?;
        let bytes: Box<[u8]> = data.iter().flat_map(|x| x.to_ne_bytes()).collect();
        self.ep.post_send(to, tag, bytes);
        Ok(())
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.ep.check_peer(from)?;
        let deadline = Instant::now() + self.ep.timeout;
        // SAFETY: any byte pattern is a valid f32, and the view covers exactly `out`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        let got = self.ep.wait_message(from, tag, deadline, |msg, n| {
            if n == bytes.len() {
                msg.matched_receive_into(&mut bytes[..]);
            } else {
                // Take it anyway, so it does not block the next message with this tag.
                let mut sink = vec![0u8; n];
                msg.matched_receive_into(&mut sink[..]);
            }
            n
        })?;
        if got != bytes.len() {
            return Err(CommError::SizeMismatch {
                rank: self.ep.rank,
                from,
                tag,
                expected: out.len(),
                got: got / 4,
            });
        }
        Ok(())
    }

    fn native_all_reduce_sum(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        scratch.clear();
        scratch.extend_from_slice(buf);
        let _mpi = self.ep.lock();
        // Blocking, so no --comm-timeout here: MPI_Allreduce cannot be abandoned halfway. It
        // is the reference mode; a failed peer is left to mpirun's own detection.
        self.ep
            .comm
            .all_reduce_into(&scratch[..], buf, SystemOperation::sum());
        Ok(())
    }
}

/// A posted send and the leaked buffer MPI reads until it completes.
type PendingSend = (Request<'static, [u8], StaticScope>, *mut [u8]);

/// Sends posted but not yet completed, with the buffers MPI is still reading.
struct Pending {
    sends: Vec<PendingSend>,
    closed: bool,
}

// SAFETY: the requests and buffers are only touched with the endpoint's mutex held, and MPI
// was initialised with at least MPI_THREAD_SERIALIZED, so which thread calls does not matter.
unsafe impl Send for Pending {}

impl Pending {
    /// Tests every pending send; frees the buffers of those that completed.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.sends.len() {
            let (req, buf) = self.sends.swap_remove(i);
            match req.test() {
                Ok(_) => {
                    // SAFETY: `buf` came from Box::leak in post_send, and MPI is done with it.
                    drop(unsafe { Box::from_raw(buf) });
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

/// One communicator and the machinery around it (shared with the progress thread).
struct Shared {
    comm: SimpleCommunicator,
    pending: Mutex<Pending>,
    wake: Condvar,
}

// SAFETY: the communicator is only used with `pending`'s mutex held (see Pending).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

struct Endpoint {
    shared: Arc<Shared>,
    comm: SimpleCommunicatorRef,
    rank: usize,
    size: usize,
    timeout: Duration,
    progress: Option<JoinHandle<()>>,
}

/// Access to the shared communicator through the endpoint (deref), for brevity.
struct SimpleCommunicatorRef(Arc<Shared>);

impl std::ops::Deref for SimpleCommunicatorRef {
    type Target = SimpleCommunicator;
    fn deref(&self) -> &SimpleCommunicator {
        &self.0.comm
    }
}

/// Folds our 64-bit tags into MPI's (OpenMPI allows 0..2^31): the low 16 bits (bucket) stay,
/// the step counter above them is kept modulo 2^15. Tags that collide are 32768 steps apart,
/// never in flight together.
fn mpi_tag(tag: u64) -> i32 {
    ((((tag >> 16) & 0x7fff) << 16) | (tag & 0xffff)) as i32
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    fn new(parent: &SimpleCommunicator, timeout: Duration) -> Self {
        let comm = parent.duplicate();
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        let shared = Arc::new(Shared {
            comm,
            pending: Mutex::new(Pending {
                sends: Vec::new(),
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
            comm: SimpleCommunicatorRef(shared.clone()),
            shared,
            rank,
            size,
            timeout,
            progress,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        lock(&self.shared.pending)
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

    /// Posts a non-blocking send of `bytes`, kept alive until MPI completes it.
    fn post_send(&self, to: usize, tag: u64, bytes: Box<[u8]>) {
        let buf: &'static [u8] = Box::leak(bytes);
        let mut p = self.lock();
        p.reap();
        let req = self
            .comm
            .process_at_rank(to as i32)
            .immediate_send_with_tag(StaticScope, buf, mpi_tag(tag));
        p.sends.push((req, buf as *const [u8] as *mut [u8]));
        drop(p);
        self.shared.wake.notify_one();
    }

    /// Waits until a message from `from` with `tag` is there (or `deadline` passes), then
    /// hands it and its byte length to `take`, which must receive it.
    fn wait_message<R>(
        &self,
        from: usize,
        tag: u64,
        deadline: Instant,
        take: impl FnOnce(Message, usize) -> R,
    ) -> Result<R, CommError> {
        let started = Instant::now();
        let mut polls = 0u32;
        loop {
            {
                let mut p = self.lock();
                p.reap();
                let probe = self
                    .comm
                    .process_at_rank(from as i32)
                    .immediate_matched_probe_with_tag(mpi_tag(tag));
                if let Some((msg, status)) = probe {
                    let n = byte_count(&status);
                    return Ok(take(msg, n));
                }
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    from,
                    tag,
                    waited: started.elapsed(),
                });
            }
            // Spin a little for the common fast case, then sleep so a long wait does not take
            // a core from the compute threads.
            polls += 1;
            if polls < 200 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Receives a message of any length.
    fn recv_any_len(&self, from: usize, tag: u64, deadline: Instant) -> Result<Vec<u8>, CommError> {
        self.wait_message(from, tag, deadline, |msg, n| {
            let mut v = vec![0u8; n];
            msg.matched_receive_into(&mut v[..]);
            v
        })
    }
}

fn byte_count(status: &Status) -> usize {
    status.count(u8::equivalent_datatype()).max(0) as usize
}

fn progress_thread(s: &Shared) {
    let mut p = lock(&s.pending);
    loop {
        if p.closed {
            return;
        }
        if p.sends.is_empty() {
            p = s
                .wake
                .wait_timeout(p, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            continue;
        }
        p.reap();
        drop(p);
        std::thread::sleep(Duration::from_micros(200));
        p = lock(&s.pending);
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
        let mut p = lock(&self.shared.pending);
        while !p.sends.is_empty() && Instant::now() < deadline {
            p.reap();
            drop(p);
            std::thread::sleep(Duration::from_micros(200));
            p = lock(&self.shared.pending);
        }
        for (req, _buf) in p.sends.drain(..) {
            // Dropping an incomplete request panics; the buffer stays leaked on purpose.
            std::mem::forget(req);
        }
    }
}
