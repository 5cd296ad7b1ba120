//! Point-to-point message transport between worker ranks.
//!
//! The collectives in this module are written against the small [`Transport`]
//! trait so that they can run over anything that moves `f32` slices between
//! ranks. The only implementation today is [`InProcessFabric`], which connects
//! worker threads of one process through channels and can optionally emulate a
//! slow network ([`LinkModel`]) so that the communication modes can be compared
//! under realistic bandwidth/latency without a cluster.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::comm::error::CommError;
use crate::comm::shared_memory::{SharedGroup, SharedMemory};

/// Moves tagged `f32` messages between ranks `0..world`.
///
/// Ordering contract (the collectives rely on it): messages from one sender to
/// one receiver that carry the same tag are received in the order they were
/// sent. Messages with different tags are independent and may be received in
/// any order relative to each other, so two collectives that use different
/// tags can be interleaved freely.
pub trait Transport: Send + Sync {
    /// This endpoint's rank, in `0..world()`.
    fn rank(&self) -> usize;
    /// Number of ranks connected by this transport.
    fn world(&self) -> usize;
    /// Sends a copy of `data` to rank `to` under `tag`. Never waits for the
    /// receiver to post a matching `recv` (sends are buffered), so a
    /// "send then receive" exchange between two ranks cannot deadlock. It may
    /// block for the emulated transmit time when a link model is active.
    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError>;
    /// Receives the next message from rank `from` with tag `tag` into `out`.
    /// The message length must equal `out.len()` exactly, otherwise
    /// [`CommError::SizeMismatch`] is returned (and the message is consumed).
    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError>;
    /// Called once on the thread that will receive, before any collective, with the largest
    /// message (in floats) it will send: whatever a first blocking wait allocates (a
    /// channel's list of waiters, the thread's wait context) and the message buffers are
    /// allocated here instead of in a training step. The default does nothing.
    fn warm_up(&self, largest_message: usize) {
        let _ = largest_message;
    }
    /// The workers of this rank's process that share its memory, as a group for the
    /// shared-memory collective ([`crate::comm::shared_memory`]), if they do: every rank of an
    /// in-process fabric that emulates no link (an emulated link says the workers are devices
    /// apart), the workers of this process for a multi-process transport. The default: none.
    fn shared_memory(&self) -> Option<SharedMemory<'_>> {
        None
    }
    /// Rounds `buf` as this transport's messages round what they carry (nothing, unless the
    /// transport compresses: [`crate::comm::wire`]). Redundant mode rounds its own
    /// contribution with it, so every rank adds the values the others received.
    fn round_to_wire(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let _ = buf;
        Ok(())
    }
    /// Sums `buf` over all ranks with the transport's own all-reduce, if it has one (MPI's
    /// `MPI_Allreduce` for `--comm mpi-native`, the reference our modes are measured
    /// against). The default has none and says so.
    fn native_all_reduce_sum(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let _ = (buf, scratch);
        Err(CommError::Unsupported {
            what: "a native all-reduce (--comm mpi-native needs --transport mpi)",
        })
    }
    /// Sums `buf` over the *processes* of the run with the transport's own all-reduce: called
    /// by exactly one rank per process (its leader, in a hierarchical all-reduce), each with
    /// its process's sum. The default has none and says so.
    fn native_all_reduce_sum_across_processes(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let _ = (buf, scratch);
        Err(CommError::Unsupported {
            what: "a native all-reduce across processes (--comm mpi-native needs --transport \
                   mpi)",
        })
    }
}

/// Bandwidth/latency description of every rank's network port.
///
/// Each rank has one full-duplex port: a message of `S` bytes occupies the
/// sender's transmit side and the receiver's receive side for
/// `S / bandwidth_bytes_per_s` seconds, and is receivable `latency` after its
/// last byte left (latency is propagation delay, it does not keep the port
/// busy).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// Port speed in bytes per second (use [`parse_bandwidth`] for "10Gbit").
    pub bandwidth_bytes_per_s: f64,
    /// One-way propagation latency added to every message.
    pub latency: Duration,
}

impl LinkModel {
    /// Time the port is busy pushing `bytes` bytes.
    pub fn transfer_time(&self, bytes: usize) -> Duration {
        secs_to_duration(bytes as f64 / self.bandwidth_bytes_per_s)
    }

    /// Seconds from sending one message of `bytes` to its arrival on an idle link: the latency
    /// and the time the port is busy. The up-front checks of a link against a timeout judge
    /// messages by it (a receive waits for the arrival).
    pub fn arrival_s(&self, bytes: usize) -> f64 {
        self.latency.as_secs_f64() + bytes as f64 / self.bandwidth_bytes_per_s
    }
}

/// Converts seconds to a `Duration`, saturating instead of panicking on
/// infinite or absurd values (e.g. a zero bandwidth) so a bad config degrades
/// into "very slow" rather than a crash inside a worker thread.
pub(crate) fn secs_to_duration(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

const BANDWIDTH_FORMS: &str = "accepted forms: <number><prefix><unit>, prefix one of \
k/K, M, G/g, T/t (SI, powers of 1000) or none, unit one of bit, bits, bit/s, bits/s, \
bps, b, b/s (bits) or B, B/s, Bps, byte, bytes, byte/s, bytes/s (bytes); \
examples: \"10Gbit\", \"1Gbps\", \"100Mbit/s\", \"400MB/s\", \"2.5GB/s\"";

/// Parses a human bandwidth such as `"10Gbit"`, `"1Gbps"`, `"100Mbit/s"`,
/// `"400MB/s"` or `"2.5GB/s"` into bytes per second.
///
/// Lower-case `b` means bits and upper-case `B` bytes, following networking
/// convention, because link speeds are quoted in bits and file sizes in bytes
/// and confusing the two is an 8x error. Prefixes are SI (1000-based).
pub fn parse_bandwidth(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, rest) = split_number(t);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid bandwidth {s:?}: missing number; {BANDWIDTH_FORMS}"))?;
    if !value.is_finite() {
        return Err(format!(
            "invalid bandwidth {s:?}: too large a number; {BANDWIDTH_FORMS}"
        ));
    }
    if value <= 0.0 {
        return Err(format!(
            "invalid bandwidth {s:?}: must be a positive number; {BANDWIDTH_FORMS}"
        ));
    }
    let rest = rest.trim_start();
    let (scale, unit) = match rest.chars().next() {
        Some('k' | 'K') => (1e3, &rest[1..]),
        Some('M') => (1e6, &rest[1..]),
        Some('G' | 'g') => (1e9, &rest[1..]),
        Some('T' | 't') => (1e12, &rest[1..]),
        _ => (1.0, rest),
    };
    let bytes_per_unit = match unit {
        "bit" | "bits" | "bit/s" | "bits/s" | "bps" | "b" | "b/s" => 1.0 / 8.0,
        "B" | "B/s" | "Bps" | "byte" | "bytes" | "byte/s" | "bytes/s" => 1.0,
        _ => {
            return Err(format!(
                "invalid bandwidth {s:?}: unknown unit {unit:?}; {BANDWIDTH_FORMS}"
            ))
        }
    };
    // The number read, its unit applied, within what a link can be: below 1 bit/s a step's
    // times overflow what the simulator and the reports hold (1e-300 B/s gave inf), and above
    // 1 PB/s (over 1000x NVLink 4's 900 GB/s) the figure is a typo or a stand-in for "no
    // link", which is `none`, and prints as hundreds of digits.
    match value * scale * bytes_per_unit {
        b if b > MAX_BANDWIDTH_BYTES_PER_S => Err(format!(
            "invalid bandwidth {s:?}: too large a number, above 1 PB/s (1e15 B/s; \
             for no emulated link give none where the option takes it); {BANDWIDTH_FORMS}"
        )),
        b if b < MIN_BANDWIDTH_BYTES_PER_S => Err(format!(
            "invalid bandwidth {s:?}: too small a number, below 1 bit/s; {BANDWIDTH_FORMS}"
        )),
        b => Ok(b),
    }
}

/// The slowest link [`parse_bandwidth`] takes: 1 bit/s.
pub const MIN_BANDWIDTH_BYTES_PER_S: f64 = 0.125;

/// The fastest link [`parse_bandwidth`] takes: 1 PB/s.
pub const MAX_BANDWIDTH_BYTES_PER_S: f64 = 1e15;

/// Parses a duration such as `"5us"`, `"1ms"`, `"2s"`, `"100ns"`, `"1.5ms"`
/// or a bare `"0"`.
///
/// A bare non-zero number is rejected because its unit would be a guess.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    const FORMS: &str = "accepted forms: <number><unit> with unit ns, us, µs, ms or s \
(e.g. \"100ns\", \"5us\", \"1ms\", \"2s\"), or a bare \"0\"";
    let t = s.trim();
    let (num, rest) = split_number(t);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: missing number; {FORMS}"))?;
    if !value.is_finite() {
        return Err(format!(
            "invalid duration {s:?}: too large a number; {FORMS}"
        ));
    }
    if value < 0.0 {
        return Err(format!("invalid duration {s:?}: must be >= 0; {FORMS}"));
    }
    let scale = match rest.trim_start() {
        "" if value == 0.0 => 0.0,
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        unit => {
            return Err(format!(
                "invalid duration {s:?}: unknown or missing unit {unit:?}; {FORMS}"
            ))
        }
    };
    Duration::try_from_secs_f64(value * scale)
        .map_err(|e| format!("invalid duration {s:?}: {e}; {FORMS}"))
}

/// Splits `"2.5GB/s"` into `("2.5", "GB/s")`. The number keeps a leading sign, so that
/// `"-5us"` is refused as negative rather than as a missing number, and an exponent
/// (`"1e-3s"`, `"1.5E9bit"`): no unit starts with `e`, so reading one is never ambiguous.
fn split_number(t: &str) -> (&str, &str) {
    let bytes = t.as_bytes();
    let digits_from = |start: usize| {
        start
            + bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b'.')
                .count()
    };
    let sign = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let mut end = digits_from(sign);
    if end > sign && matches!(bytes.get(end), Some(b'e' | b'E')) {
        let exp_sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        let exp_digits = bytes[end + 1 + exp_sign..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if exp_digits > 0 {
            end += 1 + exp_sign + exp_digits;
        }
    }
    t.split_at(end)
}

/// One message in flight.
struct Msg {
    tag: u64,
    data: Vec<f32>,
    /// With a link model: the instant the message becomes receivable.
    ready_at: Option<Instant>,
}

/// Per-sender receive side of one endpoint: the channel from that sender,
/// messages that arrived from it under a tag not yet asked for, and the
/// bookkeeping that lets several threads receive (different tags) from the
/// same peer at once.
///
/// At most one thread at a time pulls from the channel (the "reader") and it
/// does so *without* holding the lock; messages for other tags go into the
/// stash and the waiting threads are woken through `arrived`. Holding the lock
/// while blocked would make a receive for tag A wait behind one for tag B,
/// which can turn into a spurious timeout when B's message depends on A's
/// collective making progress.
struct Inbox {
    rx: Receiver<Msg>,
    state: Mutex<InboxState>,
    arrived: Condvar,
}

/// The lock-protected part of an [`Inbox`].
struct InboxState {
    stash: VecDeque<Msg>,
    reader_active: bool,
}

/// Recycled message buffers owned by one sending rank.
type Pool = Arc<Mutex<Vec<Vec<f32>>>>;

/// Upper bound on buffers kept per pool; only messages in flight at once need
/// one each, so this is never reached by the collectives here, it just keeps a
/// pathological caller from hoarding memory.
const MAX_POOLED: usize = 256;

/// Port reservation state shared by all endpoints when a link is emulated.
struct LinkState {
    model: LinkModel,
    ports: Mutex<Ports>,
}

/// When each rank's transmit and receive sides are next free.
struct Ports {
    tx_free: Vec<Instant>,
    rx_free: Vec<Instant>,
}

/// Builder for a set of connected in-process endpoints, one per rank.
///
/// Worker threads of one process exchange messages through per-(from, to)
/// channels; there is no shared fabric object to keep alive, each endpoint
/// owns its ends of the channels.
pub struct InProcessFabric {
    _no_construct: (),
}

impl InProcessFabric {
    /// Creates `world` connected endpoints; element `i` is rank `i` and can
    /// be moved to its own thread.
    ///
    /// `link`: emulate a network with this bandwidth/latency by sleeping
    /// (`None` = no delays at all). `timeout`: the longest any `recv` waits
    /// before returning [`CommError::Timeout`], so a dead peer surfaces as an
    /// error instead of a hung training job.
    // The name `new` returning the endpoints rather than `Self` is the API the
    // trainer was designed against; the fabric itself holds no state.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        world: usize,
        link: Option<LinkModel>,
        timeout: Duration,
    ) -> Vec<InProcessTransport> {
        let now = Instant::now();
        let link = link.map(|model| {
            Arc::new(LinkState {
                model,
                ports: Mutex::new(Ports {
                    tx_free: vec![now; world],
                    rx_free: vec![now; world],
                }),
            })
        });
        let pools: Vec<Pool> = (0..world).map(|_| Arc::default()).collect();
        let shared = Arc::new(SharedGroup::new(world));
        // senders[from][to] / receivers[to][from]
        let mut senders: Vec<Vec<Sender<Msg>>> = (0..world).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Option<Receiver<Msg>>>> = (0..world)
            .map(|_| (0..world).map(|_| None).collect())
            .collect();
        for (from, row) in senders.iter_mut().enumerate() {
            for inbox_row in receivers.iter_mut() {
                // Bounded (a ring allocated once): an unbounded channel allocates a block every
                // 31 messages, on the hot path of every collective. No collective has nearly
                // this many messages in flight between two workers.
                let (tx, rx) = crossbeam_channel::bounded(IN_FLIGHT);
                row.push(tx);
                inbox_row[from] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (senders, rxs))| InProcessTransport {
                rank,
                world,
                senders,
                inboxes: rxs
                    .into_iter()
                    .map(|rx| Inbox {
                        rx: rx.expect("every channel was created"),
                        state: Mutex::new(InboxState {
                            // Sized once: stashing a message never allocates in a step.
                            stash: VecDeque::with_capacity(IN_FLIGHT),
                            reader_active: false,
                        }),
                        arrived: Condvar::new(),
                    })
                    .collect(),
                pools: pools.clone(),
                link: link.clone(),
                shared: shared.clone(),
                timeout,
            })
            .collect()
    }
}

/// One rank's endpoint of an [`InProcessFabric`].
///
/// Dropping it disconnects the rank: peers waiting on it get
/// [`CommError::PeerGone`] (after draining what it already sent).
pub struct InProcessTransport {
    rank: usize,
    world: usize,
    senders: Vec<Sender<Msg>>,
    inboxes: Vec<Inbox>,
    pools: Vec<Pool>,
    link: Option<Arc<LinkState>>,
    shared: Arc<SharedGroup>,
    timeout: Duration,
}

impl Drop for InProcessTransport {
    /// A dropped endpoint is gone for the shared-memory collective too: the others stop
    /// waiting for it at once (the channels tell message receivers by disconnecting).
    fn drop(&mut self) {
        self.shared.mark_gone(self.rank);
    }
}

/// Locks a mutex, ignoring poisoning: the protected data (buffers, queues,
/// timestamps) stays consistent even if a holder panicked, and a panic in one
/// worker should surface as PeerGone elsewhere, not as cascading panics.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sleeps until `t` (no-op if it already passed). Sleeping, not spinning,
/// keeps emulated waits from stealing the CPU the compute threads need.
///
/// Linux lets a sleep end up to the thread's *timer slack* late (50 µs by
/// default) to batch wake-ups. Every emulated message sleeps twice (the
/// sender's transmit time, the receiver's latency): with the default slack a
/// 4-byte ring all-reduce of 2 workers over a 50 µs link took 236 µs, with
/// 1 ns slack 151 µs (the model says 100), and the simulator, which models the
/// link as specified, under-predicted small-bucket steps. The first sleep on
/// each thread therefore sets its slack to 1 ns. (The emulated device,
/// [`crate::testbed::device`], sleeps with it too.)
pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        precise_sleeps_on_this_thread();
        std::thread::sleep(t - now);
    }
}

/// Sets this thread's timer slack to 1 ns, once (Linux; elsewhere a no-op).
fn precise_sleeps_on_this_thread() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    DONE.with(|done| {
        if !done.replace(true) {
            #[cfg(target_os = "linux")]
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack; it takes
            // the slack in ns as an unsigned long and no pointers.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
            }
        }
    });
}

impl InProcessTransport {
    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        if peer < self.world {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank: self.rank,
                peer,
                world: self.world,
            })
        }
    }

    /// Takes a buffer from this rank's pool (preferring one that is already
    /// big enough) and fills it with `data`.
    fn pooled_copy(&self, data: &[f32]) -> Vec<f32> {
        let mut pool = lock(&self.pools[self.rank]);
        let mut buf = match pool.iter().position(|b| b.capacity() >= data.len()) {
            Some(i) => pool.swap_remove(i),
            None => pool.pop().unwrap_or_default(),
        };
        drop(pool);
        buf.clear();
        buf.extend_from_slice(data);
        buf
    }

    /// Returns a consumed message's buffer to the pool of the rank that sent
    /// it, so that sender's next message reuses it.
    fn recycle(&self, from: usize, mut buf: Vec<f32>) {
        let mut pool = lock(&self.pools[from]);
        if pool.len() < MAX_POOLED {
            buf.clear();
            pool.push(buf);
        }
    }

    /// Copies a matched message out, waits for its emulated arrival, and
    /// recycles its buffer.
    fn deliver(
        &self,
        from: usize,
        msg: Msg,
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), CommError> {
        if let Some(ready) = msg.ready_at {
            // The emulated arrival counts against the receive's timeout: a message that only
            // arrives after the deadline is a timeout now, not after sleeping until then.
            if ready > deadline {
                let bytes = std::mem::size_of_val(msg.data.as_slice());
                let tag = msg.tag;
                self.recycle(from, msg.data);
                // Counted from the receive's start (its deadline less the timeout), as the
                // timeout is.
                let started = deadline.checked_sub(self.timeout).unwrap_or(deadline);
                return Err(CommError::LinkTooSlow {
                    rank: self.rank,
                    peer: from,
                    receiving: true,
                    tag,
                    bytes,
                    needed: ready.saturating_duration_since(started),
                    timeout: self.timeout,
                });
            }
            sleep_until(ready);
        }
        let result = if msg.data.len() == out.len() {
            out.copy_from_slice(&msg.data);
            Ok(())
        } else {
            Err(CommError::SizeMismatch {
                rank: self.rank,
                from,
                tag: msg.tag,
                expected: out.len(),
                got: msg.data.len(),
            })
        };
        self.recycle(from, msg.data);
        result
    }
}

/// Registers the calling thread once as a waiter on `rx`, so that crossbeam's first-wait
/// allocations (the channel's waiter list, the thread's wait context) happen now and not in a
/// training step; returns the message instead if one was ready (then nothing registered: call
/// again). A timed `recv` does not do this reliably: it spins (yielding) before it registers
/// and gives up without registering when the spin outlasts its timeout, which it does on a
/// loaded machine. A `Select` with a deadline already past tries the channel once, then always
/// registers, sees the deadline and unregisters (crossbeam-channel 0.5 `run_select`).
pub fn register_as_waiter<T>(rx: &Receiver<T>) -> Option<T> {
    let mut select = crossbeam_channel::Select::new();
    select.recv(rx);
    let op = select.select_timeout(Duration::ZERO).ok()?;
    op.recv(rx).ok()
}

/// Messages one worker may have sent to another and not yet received.
const IN_FLIGHT: usize = 256;

/// Message buffers each rank's pool holds from the start ([`Transport::warm_up`]).
const WARM_MESSAGES: usize = 4;

/// Most workers one process's fabric connects. The fabric has a channel for every ordered pair
/// of workers (a ring of `IN_FLIGHT` messages and a stash of as many, allocated up front:
/// about 27 KB a pair, 1.8 GB at 256 workers), and every worker is at least three threads
/// (its own, its communication thread, a compute thread) on this machine's cores: past a few
/// hundred, a run spends its memory and time on the emulation, not on training. Real nodes
/// hold 8 or 16 devices; more workers than this are for `simulate`.
pub const MAX_IN_PROCESS_WORKERS: usize = 256;

/// Refuses more workers in one process than [`MAX_IN_PROCESS_WORKERS`], saying why.
pub fn check_in_process_workers(workers: usize) -> Result<(), String> {
    if workers <= MAX_IN_PROCESS_WORKERS {
        return Ok(());
    }
    Err(format!(
        "--workers {workers} is more than the {MAX_IN_PROCESS_WORKERS} workers one process \
         runs: its workers talk through a channel per pair (workers^2 channels, 1.8 GB of \
         them at {MAX_IN_PROCESS_WORKERS}) and each is three or more threads on this \
         machine's {} cores; give fewer --workers (several processes with --transport mpi \
         for more), or plan a larger cluster with `dptrain simulate`",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ))
}

/// Message buffers each rank of a `world`-worker fabric holds once [`Transport::warm_up`] ran.
pub fn warm_messages(world: usize) -> usize {
    WARM_MESSAGES.min(2 * world)
}

/// Bytes an [`InProcessFabric`] of `world` workers takes: the channels and stashes of every
/// pair, and `messages_per_rank` message buffers of `largest_message` floats per rank (those
/// [`warm_messages`] keeps, or what a collective has in flight at once if more: `world - 1` in
/// the redundant mode).
pub fn fabric_bytes(world: usize, largest_message: usize, messages_per_rank: usize) -> f64 {
    if world <= 1 {
        return 0.0;
    }
    let w = world as f64;
    let per_pair = IN_FLIGHT as f64
        * (std::mem::size_of::<Msg>() as f64 + 8.0 + std::mem::size_of::<Msg>() as f64);
    let message = 4.0 * largest_message as f64;
    w * w * per_pair + w * messages_per_rank as f64 * message
}

impl Transport for InProcessTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn warm_up(&self, largest_message: usize) {
        // Register once as a waiter on every inbox: crossbeam allocates a channel's waiter
        // list the first time a receiver blocks on it, and this thread's wait context the first
        // time it waits at all. A timed `recv` is not enough: it spins (yielding) before it
        // registers and gives up without registering when the spin outlasts its timeout,
        // which on a loaded machine it does. A `Select` with a deadline already past tries the
        // channel once, then always registers, sees the deadline and unregisters. Messages
        // that arrive meanwhile are stashed, where `recv` looks first.
        for inbox in &self.inboxes {
            // Each ready message is one try that did not register; the bound only guards a
            // peer that sends without end.
            for _ in 0..IN_FLIGHT {
                match register_as_waiter(&inbox.rx) {
                    Some(msg) => lock(&inbox.state).stash.push_back(msg),
                    None => break,
                }
            }
        }
        // Message buffers of the largest size for the messages one rank has in flight in
        // the tree, ring and halving-doubling modes (one or two at a time, plus slack), so no
        // step allocates or grows one. A fixed number, not one per peer: `2 x world` buffers
        // of the whole weights per rank made the fabric's memory grow as workers^2 (100
        // lenet5 workers took 5.5 GB). The redundant mode, which has a message to every peer
        // in flight, adds its buffers in its first step and reuses them after.
        let mut pool = lock(&self.pools[self.rank]);
        for b in pool.iter_mut() {
            b.reserve(largest_message.saturating_sub(b.len()));
        }
        while pool.len() < WARM_MESSAGES.min(2 * self.world) {
            pool.push(Vec::with_capacity(largest_message));
        }
    }

    fn world(&self) -> usize {
        self.world
    }

    fn shared_memory(&self) -> Option<SharedMemory<'_>> {
        self.link.is_none().then_some(SharedMemory {
            group: &self.shared,
            rank: self.rank,
            timeout: self.timeout,
            first_rank: 0,
        })
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.check_peer(to)?;
        let data = self.pooled_copy(data);
        // Reserve both ports before publishing so the receiver sees the final
        // arrival time; self-sends never touch the wire.
        let (ready_at, busy_until) = match &self.link {
            Some(link) if to != self.rank => {
                let bytes = std::mem::size_of_val(data.as_slice());
                let now = Instant::now();
                let mut ports = lock(&link.ports);
                let start = now.max(ports.tx_free[self.rank]).max(ports.rx_free[to]);
                let end = start.checked_add(link.model.transfer_time(bytes));
                // The emulated transmit time counts against the timeout like any wait: a send
                // whose last byte would leave after it fails now, before taking the ports.
                let end = match end.filter(|e| *e <= now + self.timeout) {
                    Some(end) => end,
                    None => {
                        return Err(CommError::LinkTooSlow {
                            rank: self.rank,
                            peer: to,
                            receiving: false,
                            tag,
                            bytes,
                            needed: end.map_or(Duration::MAX, |e| e - now),
                            timeout: self.timeout,
                        })
                    }
                };
                ports.tx_free[self.rank] = end;
                ports.rx_free[to] = end;
                drop(ports);
                // Far past any deadline (Instant overflow): the receiver's check refuses it.
                let ready = end
                    .checked_add(link.model.latency)
                    .unwrap_or(now + self.timeout + Duration::from_secs(1));
                (Some(ready), Some(end))
            }
            _ => (None, None),
        };
        let msg = Msg {
            tag,
            data,
            ready_at,
        };
        self.senders[to]
            .send_timeout(msg, self.timeout)
            .map_err(|e| match e {
                crossbeam_channel::SendTimeoutError::Disconnected(_) => CommError::PeerGone {
                    rank: self.rank,
                    peer: to,
                    tag,
                },
                // The peer has not taken IN_FLIGHT messages within the timeout: it is stuck.
                crossbeam_channel::SendTimeoutError::Timeout(_) => CommError::Timeout {
                    rank: self.rank,
                    from: to,
                    tag,
                    waited: self.timeout,
                },
            })?;
        // The sender's port is busy until the last byte is out.
        if let Some(end) = busy_until {
            sleep_until(end);
        }
        Ok(())
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.check_peer(from)?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let inbox = &self.inboxes[from];
        let timeout_err = || CommError::Timeout {
            rank: self.rank,
            from,
            tag,
            waited: started.elapsed(),
        };
        let mut state = lock(&inbox.state);
        loop {
            // Oldest stashed message with our tag first: keeps per-tag FIFO.
            if let Some(pos) = state.stash.iter().position(|m| m.tag == tag) {
                let msg = state.stash.remove(pos).expect("position is in range");
                drop(state);
                return self.deliver(from, msg, out, deadline);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timeout_err());
            }
            if state.reader_active {
                // Another thread is pulling from the channel; it will stash
                // our message and wake us.
                state = inbox
                    .arrived
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            state.reader_active = true;
            drop(state);
            let got = inbox.rx.recv_deadline(deadline);
            state = lock(&inbox.state);
            state.reader_active = false;
            // Either a message was stashed or the reader role is free again:
            // both are news for the waiting threads.
            inbox.arrived.notify_all();
            match got {
                Ok(msg) if msg.tag == tag => {
                    drop(state);
                    return self.deliver(from, msg, out, deadline);
                }
                Ok(msg) => state.stash.push_back(msg),
                Err(RecvTimeoutError::Timeout) => return Err(timeout_err()),
                // Only after the stash has been checked once more (loop top):
                // a concurrent reader may have parked our message there.
                Err(RecvTimeoutError::Disconnected)
                    if !state.stash.iter().any(|m| m.tag == tag) =>
                {
                    return Err(CommError::PeerGone {
                        rank: self.rank,
                        peer: from,
                        tag,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_accepts_common_forms() {
        let cases = [
            ("10Gbit", 10e9 / 8.0),
            ("400MB/s", 400e6),
            ("1Gbps", 1e9 / 8.0),
            ("100Mbit/s", 100e6 / 8.0),
            ("2.5GB/s", 2.5e9),
            (" 8 kbit ", 1000.0),
            ("1000B", 1000.0),
            ("1TB/s", 1e12),
        ];
        for (s, want) in cases {
            let got = parse_bandwidth(s).unwrap();
            assert!((got - want).abs() <= want * 1e-12, "{s}: {got} != {want}");
        }
    }

    #[test]
    fn bandwidth_rejects_bad_forms_with_help() {
        for s in [
            "10Gbt", "", "Gbit", "10", "-1Gbit", "0Gbit", "10 mbit", "1.2.3GB",
        ] {
            let err = parse_bandwidth(s).unwrap_err();
            assert!(err.contains("accepted forms"), "{s}: {err}");
        }
        assert!(parse_bandwidth("10Gbt").unwrap_err().contains("10Gbit"));
        // Finite as read, past f64 or below it once the unit applies.
        assert!(parse_bandwidth("1e300TB")
            .unwrap_err()
            .contains("too large a number"));
        assert!(parse_bandwidth("1e-310bit")
            .unwrap_err()
            .contains("too small a number"));
        // A link's range: 1 bit/s to 1 PB/s, both ends taken, just past them refused.
        assert_eq!(parse_bandwidth("1bit").unwrap(), 0.125);
        assert_eq!(parse_bandwidth("1000TB").unwrap(), 1e15);
        assert!(parse_bandwidth("0.99bit")
            .unwrap_err()
            .contains("below 1 bit/s"));
        assert!(parse_bandwidth("1001TB")
            .unwrap_err()
            .contains("above 1 PB/s"));
        assert!(parse_bandwidth("1e300B").is_err());
    }

    #[test]
    fn duration_accepts_and_rejects() {
        assert_eq!(parse_duration("5us").unwrap(), Duration::from_micros(5));
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("100ns").unwrap(), Duration::from_nanos(100));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        for s in ["5", "", "ms", "-1ms", "5 minutes", "1h"] {
            let err = parse_duration(s).unwrap_err();
            assert!(err.contains("accepted forms"), "{s}: {err}");
        }
        // A sign is read as part of the number, so a negative value is named as one.
        assert!(parse_duration("-5us").unwrap_err().contains("must be >= 0"));
        assert!(parse_bandwidth("-1Gbit")
            .unwrap_err()
            .contains("must be a positive number"));
        // Exponents are numbers, not units.
        assert_eq!(parse_duration("1e-3s").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_duration("5E2us").unwrap(), Duration::from_micros(500));
        assert!((parse_bandwidth("1.25e9B/s").unwrap() - 1.25e9).abs() < 1.0);
        // An `e` without digits after it stays part of the unit, and is refused as one.
        assert!(parse_duration("5es").unwrap_err().contains("unit"));
        // Past f64: too large, not negative.
        assert!(parse_duration("1e400s").unwrap_err().contains("too large"));
        assert!(parse_bandwidth("1e400Gbit")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn stash_handles_out_of_order_tags_and_fifo() {
        let eps = InProcessFabric::new(2, None, Duration::from_secs(5));
        eps[0].send(1, 1, &[1.0]).unwrap();
        eps[0].send(1, 2, &[2.0]).unwrap();
        eps[0].send(1, 1, &[3.0]).unwrap();
        let mut out = [0.0];
        eps[1].recv(0, 2, &mut out).unwrap();
        assert_eq!(out, [2.0]);
        eps[1].recv(0, 1, &mut out).unwrap();
        assert_eq!(out, [1.0]);
        eps[1].recv(0, 1, &mut out).unwrap();
        assert_eq!(out, [3.0]);
    }

    #[test]
    fn concurrent_receivers_from_one_peer_do_not_block_each_other() {
        // Rank 0 sends tag 2 and only sends tag 1 after tag 2 was received.
        // A receiver blocked on tag 1 must not stop another thread on the
        // same endpoint from getting tag 2, or this would time out.
        let eps = InProcessFabric::new(2, None, Duration::from_secs(2));
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        std::thread::scope(|s| {
            let r1 = &eps[1];
            let a = s.spawn(move || {
                let mut out = [0.0];
                r1.recv(0, 1, &mut out).map(|_| out[0])
            });
            // Let the tag-1 receiver become the channel reader first.
            std::thread::sleep(Duration::from_millis(50));
            let b = s.spawn(move || {
                let mut out = [0.0];
                let r = r1.recv(0, 2, &mut out).map(|_| out[0]);
                done_tx.send(()).unwrap();
                r
            });
            eps[0].send(1, 2, &[2.0]).unwrap();
            done_rx.recv_timeout(Duration::from_secs(2)).unwrap();
            eps[0].send(1, 1, &[1.0]).unwrap();
            assert_eq!(b.join().unwrap().unwrap(), 2.0);
            assert_eq!(a.join().unwrap().unwrap(), 1.0);
        });
    }

    #[test]
    fn size_mismatch_and_invalid_rank() {
        let eps = InProcessFabric::new(2, None, Duration::from_secs(5));
        eps[0].send(1, 0, &[1.0, 2.0]).unwrap();
        let mut out = [0.0; 3];
        assert!(matches!(
            eps[1].recv(0, 0, &mut out),
            Err(CommError::SizeMismatch {
                expected: 3,
                got: 2,
                ..
            })
        ));
        assert!(matches!(
            eps[0].send(5, 0, &[]),
            Err(CommError::InvalidRank { peer: 5, .. })
        ));
    }

    #[test]
    fn buffers_are_recycled() {
        let eps = InProcessFabric::new(2, None, Duration::from_secs(5));
        let data = vec![1.0f32; 1000];
        let mut out = vec![0.0f32; 1000];
        eps[0].send(1, 0, &data).unwrap();
        eps[1].recv(0, 0, &mut out).unwrap();
        let ptr = lock(&eps[0].pools[0])[0].as_ptr();
        eps[0].send(1, 0, &data).unwrap();
        // The only pooled buffer was taken again instead of allocating.
        assert!(lock(&eps[0].pools[0]).is_empty());
        eps[1].recv(0, 0, &mut out).unwrap();
        assert_eq!(lock(&eps[0].pools[0])[0].as_ptr(), ptr);
    }
}
