//! The event engine: runs the simulated ranks' communication threads through a step's jobs,
//! in virtual time, under the topology's port model ([`super::topology`]).
//!
//! Each simulated rank works through the step's [`Segment`]s in order, one at a time (the
//! trainer's communication thread runs one collective after another): it starts a segment
//! once it has finished the previous one and the segment is ready for it (its bucket's
//! gradients are out of backward), after any compute it waits for first (tree mode's root
//! update), then runs its recorded program between the arithmetic it does itself before and
//! after the messages (PowerSGD's products). A send starts when the sender and both ports
//! are free, keeps them busy for `bytes / bandwidth`, returns to the sender when the last byte
//! is out and can be received `latency + overhead` later. Ports are reserved in the order sends
//! happen in virtual time (ranks are processed from a heap by time), and a rank yields after
//! every step that moves its clock.
//!
//! With a symmetric schedule ([`super::schedule::Symmetry`]) the simulated ranks are host 0's
//! and there is one NIC, host 0's, standing for every host's; without, every rank and every
//! NIC is simulated. The engine does not care which: the compiled jobs already name the
//! simulated rank and the link of every message.

use super::schedule::{CompiledJob, Step};
use super::topology::Topology;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One job run by every simulated rank.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    /// The compiled job.
    pub job: &'a CompiledJob,
    /// The buffer, bytes (messages are fractions of it).
    pub bytes: f64,
    /// When each simulated rank may start it, s (one entry per simulated rank).
    pub ready: Vec<f64>,
    /// Compute each simulated rank waits for before starting it, once ready, on another
    /// thread (tree mode's root update), s (empty: none).
    pub before: Vec<f64>,
    /// Arithmetic each simulated rank's communication thread does itself: before the first
    /// message and after the last (PowerSGD's products), s per rank (empty: none). Counted
    /// in the thread's busy time.
    pub arithmetic: [Vec<f64>; 2],
}

/// When each simulated rank finished, and how long its communication thread was busy.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTimes {
    /// End of each simulated rank's last segment, s.
    pub end: Vec<f64>,
    /// Time each spent inside segments (from a segment's start, waits for peers included), s.
    pub busy: Vec<f64>,
    /// When each simulated rank finished each segment, s (`[segment][rank]`).
    pub segment_end: Vec<Vec<f64>>,
}

/// Heap key: time as bits (order-preserving for non-negative floats), then rank for ties.
fn key(t: f64, r: usize) -> Reverse<(u64, usize)> {
    debug_assert!(t >= 0.0 && t.is_finite(), "{t}");
    Reverse((t.to_bits(), r))
}

const NOBODY: u32 = u32::MAX;

/// Per segment: when each message can be received (NaN: not sent yet) and who waits for it.
struct Mail {
    ready: Vec<f64>,
    waiter: Vec<u32>,
    finished: usize,
}

/// Runs `segments` on every simulated rank of `topo` (all start at time 0 with free ports).
/// Fails if the programs deadlock, which would be a recording bug.
pub fn run(segments: &[Segment], topo: &Topology) -> Result<RankTimes, String> {
    let Some(first) = segments.first() else {
        return Ok(RankTimes {
            end: Vec::new(),
            busy: Vec::new(),
            segment_end: Vec::new(),
        });
    };
    let ranks = first.job.ranks;
    if segments
        .iter()
        .any(|s| s.job.ranks != ranks || s.ready.len() != ranks)
    {
        return Err("segments simulate different ranks (a simulator bug)".into());
    }
    let mut engine = Engine::new(segments, topo, ranks);
    while let Some(Reverse((bits, r))) = engine.heap.pop() {
        engine.advance(r, f64::from_bits(bits));
    }
    engine.finish()
}

/// One send of a segment: to simulated rank `dst`, over the NICs or within the host, `bytes`
/// long, into the segment's `slot`.
#[derive(Debug, Clone, Copy)]
struct Message {
    dst: usize,
    nic: bool,
    bytes: f64,
    slot: usize,
}

/// A link's cost per byte (`beta`, s) and per message (`alpha`: latency plus overhead, s).
#[derive(Debug, Clone, Copy)]
struct Cost {
    beta: f64,
    alpha: f64,
}

/// The engine's state: the ports, each simulated rank's place in the segments, the messages
/// of the segments in progress, and the ranks due to run, by time.
struct Engine<'s, 'a> {
    segments: &'s [Segment<'a>],
    ranks: usize,
    devices_per_host: usize,
    intra: Cost,
    nic: Cost,
    /// When each device's send and receive ports are next free, s.
    dev_tx: Vec<f64>,
    dev_rx: Vec<f64>,
    /// When each host's NIC is next free, both ways, s.
    nic_tx: Vec<f64>,
    nic_rx: Vec<f64>,
    /// Per rank: the segment it is in, whether it has entered it, its program counter, its
    /// clock, when it started its segment and its time inside segments.
    seg: Vec<usize>,
    started: Vec<bool>,
    /// Whether the rank is in its segment's compute after the messages.
    finishing: Vec<bool>,
    pc: Vec<usize>,
    clock: Vec<f64>,
    seg_start: Vec<f64>,
    busy: Vec<f64>,
    segment_end: Vec<Vec<f64>>,
    /// Per segment, while some rank is in it.
    mail: Vec<Option<Mail>>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
}

impl<'s, 'a> Engine<'s, 'a> {
    /// Every rank at time 0 before its first segment, every port free.
    fn new(segments: &'s [Segment<'a>], topo: &Topology, ranks: usize) -> Self {
        let d = topo.devices_per_host;
        let hosts = ranks.div_ceil(d);
        let over = topo.overhead.as_secs_f64();
        let cost = |l: &crate::comm::LinkModel| Cost {
            beta: 1.0 / l.bandwidth_bytes_per_s,
            alpha: l.latency.as_secs_f64() + over,
        };
        Self {
            segments,
            ranks,
            devices_per_host: d,
            intra: cost(&topo.intra),
            nic: cost(&topo.nic),
            dev_tx: vec![0.0; ranks],
            dev_rx: vec![0.0; ranks],
            nic_tx: vec![0.0; hosts],
            nic_rx: vec![0.0; hosts],
            seg: vec![0; ranks],
            started: vec![false; ranks],
            finishing: vec![false; ranks],
            pc: vec![0; ranks],
            clock: vec![0.0; ranks],
            seg_start: vec![0.0; ranks],
            busy: vec![0.0; ranks],
            segment_end: vec![vec![0.0; ranks]; segments.len()],
            mail: segments.iter().map(|_| None).collect(),
            heap: (0..ranks).map(|r| key(0.0, r)).collect(),
        }
    }

    /// Runs rank `r` from time `t` until it yields: it waits (for readiness, compute, a
    /// message or its own send), or it has finished every segment.
    fn advance(&mut self, r: usize, t: f64) {
        let segments = self.segments;
        loop {
            let si = self.seg[r];
            let Some(sg) = segments.get(si) else {
                self.clock[r] = t;
                return;
            };
            if !self.started[r] && self.enter(r, t, si) {
                return;
            }
            if self.pc[r] == sg.job.start[r + 1] {
                let after = sg.arithmetic[1].get(r).copied().unwrap_or(0.0);
                if after > 0.0 && !self.finishing[r] {
                    // Its messages are done; its compute after them ends the segment.
                    self.finishing[r] = true;
                    self.heap.push(key(t + after, r));
                    return;
                }
                self.finishing[r] = false;
                self.leave(r, t, si);
                continue;
            }
            let waits = match sg.job.steps[self.pc[r]] {
                Step::Send {
                    dst,
                    nic,
                    frac,
                    slot,
                } => {
                    let message = Message {
                        dst: dst as usize,
                        nic,
                        bytes: frac * sg.bytes,
                        slot: slot as usize,
                    };
                    self.send(r, t, si, message)
                }
                Step::Recv { slot } => self.recv(r, t, si, slot as usize),
            };
            if waits {
                return;
            }
        }
    }

    /// Rank `r` enters segment `si` at `t`: it starts once the segment is ready for it and
    /// its compute before the segment is done. Returns whether it waits for that.
    fn enter(&mut self, r: usize, t: f64, si: usize) -> bool {
        let sg = &self.segments[si];
        self.started[r] = true;
        self.pc[r] = sg.job.start[r];
        let before = sg.before.get(r).copied().unwrap_or(0.0);
        let arithmetic = sg.arithmetic[0].get(r).copied().unwrap_or(0.0);
        self.seg_start[r] = t.max(sg.ready[r]) + before;
        let begin = self.seg_start[r] + arithmetic;
        self.mail[si].get_or_insert_with(|| Mail {
            ready: vec![f64::NAN; sg.job.slots],
            waiter: vec![NOBODY; sg.job.slots],
            finished: 0,
        });
        if begin > t {
            self.heap.push(key(begin, r));
            return true;
        }
        false
    }

    /// Rank `r` is through segment `si` at `t`; the segment's messages go once every rank is.
    fn leave(&mut self, r: usize, t: f64, si: usize) {
        self.busy[r] += t - self.seg_start[r];
        self.segment_end[si][r] = t;
        self.seg[r] += 1;
        self.started[r] = false;
        let m = self.mail[si].as_mut().expect("allocated on entry");
        m.finished += 1;
        if m.finished == self.ranks {
            // Every rank is past it: its messages have all been received.
            self.mail[si] = None;
        }
    }

    /// Rank `r` sends `message` at `t` once both its ports are free; a receiver blocked on
    /// it is woken for its arrival. Returns whether the sender waits for its last byte to go
    /// out.
    fn send(&mut self, r: usize, t: f64, si: usize, message: Message) -> bool {
        let Message {
            dst,
            nic,
            bytes,
            slot,
        } = message;
        self.pc[r] += 1;
        let d = self.devices_per_host;
        let (tx, rx, cost) = if nic {
            (&mut self.nic_tx[r / d], &mut self.nic_rx[dst / d], self.nic)
        } else {
            (&mut self.dev_tx[r], &mut self.dev_rx[dst], self.intra)
        };
        let begin = t.max(*tx).max(*rx);
        let end = begin + bytes * cost.beta;
        *tx = end;
        *rx = end;
        let arrives = end + cost.alpha;
        let m = self.mail[si].as_mut().expect("allocated on entry");
        m.ready[slot] = arrives;
        let w = m.waiter[slot];
        if w != NOBODY {
            // The receiver was blocked on exactly this message.
            let w = w as usize;
            m.waiter[slot] = NOBODY;
            self.pc[w] += 1;
            self.heap.push(key(self.clock[w].max(arrives), w));
        }
        if end > t {
            self.heap.push(key(end, r));
            return true;
        }
        false
    }

    /// Rank `r` receives the message in `slot` at `t`: blocks until it is sent, or waits for
    /// its arrival. Returns whether it waits.
    fn recv(&mut self, r: usize, t: f64, si: usize, slot: usize) -> bool {
        let m = self.mail[si].as_mut().expect("allocated on entry");
        let arrives = m.ready[slot];
        if arrives.is_nan() {
            m.waiter[slot] = r as u32;
            self.clock[r] = t;
            return true;
        }
        self.pc[r] += 1;
        if arrives > t {
            self.heap.push(key(arrives, r));
            return true;
        }
        false
    }

    /// Each rank's end and busy time, or the deadlock if some rank never finished.
    fn finish(self) -> Result<RankTimes, String> {
        if let Some(r) = (0..self.ranks).find(|&r| self.seg[r] < self.segments.len()) {
            let sg = &self.segments[self.seg[r]];
            return Err(format!(
                "the simulated schedule deadlocked: simulated rank {r} waits in {} at step {} of {} \
                 (a recording bug)",
                sg.job.job,
                self.pc[r] - sg.job.start[r],
                sg.job.start[r + 1] - sg.job.start[r]
            ));
        }
        Ok(RankTimes {
            end: self.clock,
            busy: self.busy,
            segment_end: self.segment_end,
        })
    }
}
