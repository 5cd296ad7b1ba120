//! The event engine: runs the simulated ranks' communication threads through a step's jobs,
//! in virtual time, under the topology's port model ([`super::topology`]).
//!
//! Each simulated rank works through the step's [`Segment`]s in order, one at a time (the
//! trainer's communication thread runs one collective after another): it starts a segment
//! once it has finished the previous one and the segment is ready for it (its bucket's
//! gradients are out of backward), after any compute the segment asks for first (tree mode's
//! root update), then runs its recorded program. A send starts when the sender and both ports
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
    /// Compute each simulated rank does before starting it, once ready, s (empty: none).
    pub before: Vec<f64>,
}

/// When each simulated rank finished, and how long its communication thread was busy.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTimes {
    /// End of each simulated rank's last segment, s.
    pub end: Vec<f64>,
    /// Time each spent inside segments (from a segment's start, waits for peers included), s.
    pub busy: Vec<f64>,
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
        });
    };
    let ranks = first.job.ranks;
    let d = topo.devices_per_host;
    if segments
        .iter()
        .any(|s| s.job.ranks != ranks || s.ready.len() != ranks)
    {
        return Err("segments simulate different ranks (a simulator bug)".into());
    }
    let hosts = ranks.div_ceil(d);
    let over = topo.overhead.as_secs_f64();
    let (i_beta, i_alpha) = (
        1.0 / topo.intra.bandwidth_bytes_per_s,
        topo.intra.latency.as_secs_f64() + over,
    );
    let (n_beta, n_alpha) = (
        1.0 / topo.nic.bandwidth_bytes_per_s,
        topo.nic.latency.as_secs_f64() + over,
    );
    let (mut dev_tx, mut dev_rx) = (vec![0.0f64; ranks], vec![0.0f64; ranks]);
    let (mut nic_tx, mut nic_rx) = (vec![0.0f64; hosts], vec![0.0f64; hosts]);
    let mut seg = vec![0usize; ranks];
    let mut started = vec![false; ranks];
    let mut pc = vec![0usize; ranks];
    let mut clock = vec![0.0f64; ranks];
    let mut seg_start = vec![0.0f64; ranks];
    let mut busy = vec![0.0f64; ranks];
    let mut mail: Vec<Option<Mail>> = segments.iter().map(|_| None).collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..ranks).map(|r| key(0.0, r)).collect();
    while let Some(Reverse((bits, r))) = heap.pop() {
        let t = f64::from_bits(bits);
        loop {
            let si = seg[r];
            let Some(sg) = segments.get(si) else {
                clock[r] = t;
                break;
            };
            if !started[r] {
                started[r] = true;
                pc[r] = sg.job.start[r];
                let before = sg.before.get(r).copied().unwrap_or(0.0);
                let begin = t.max(sg.ready[r]) + before;
                seg_start[r] = begin;
                mail[si].get_or_insert_with(|| Mail {
                    ready: vec![f64::NAN; sg.job.slots],
                    waiter: vec![NOBODY; sg.job.slots],
                    finished: 0,
                });
                if begin > t {
                    heap.push(key(begin, r));
                    break;
                }
            }
            if pc[r] == sg.job.start[r + 1] {
                busy[r] += t - seg_start[r];
                seg[r] += 1;
                started[r] = false;
                let m = mail[si].as_mut().expect("allocated on entry");
                m.finished += 1;
                if m.finished == ranks {
                    // Every rank is past it: its messages have all been received.
                    mail[si] = None;
                }
                continue;
            }
            let m = mail[si].as_mut().expect("allocated on entry");
            match sg.job.steps[pc[r]] {
                Step::Send {
                    dst,
                    nic,
                    frac,
                    slot,
                } => {
                    pc[r] += 1;
                    let dst = dst as usize;
                    let bytes = frac * sg.bytes;
                    let (tx, rx, beta, alpha) = if nic {
                        (&mut nic_tx[r / d], &mut nic_rx[dst / d], n_beta, n_alpha)
                    } else {
                        (&mut dev_tx[r], &mut dev_rx[dst], i_beta, i_alpha)
                    };
                    let begin = t.max(*tx).max(*rx);
                    let end = begin + bytes * beta;
                    *tx = end;
                    *rx = end;
                    let arrives = end + alpha;
                    let slot = slot as usize;
                    m.ready[slot] = arrives;
                    let w = m.waiter[slot];
                    if w != NOBODY {
                        // The receiver was blocked on exactly this message.
                        let w = w as usize;
                        m.waiter[slot] = NOBODY;
                        pc[w] += 1;
                        heap.push(key(clock[w].max(arrives), w));
                    }
                    if end > t {
                        heap.push(key(end, r));
                        break;
                    }
                }
                Step::Recv { slot } => {
                    let arrives = m.ready[slot as usize];
                    if arrives.is_nan() {
                        m.waiter[slot as usize] = r as u32;
                        clock[r] = t;
                        break;
                    }
                    pc[r] += 1;
                    if arrives > t {
                        heap.push(key(arrives, r));
                        break;
                    }
                }
            }
        }
    }
    if let Some(r) = (0..ranks).find(|&r| seg[r] < segments.len()) {
        let sg = &segments[seg[r]];
        return Err(format!(
            "the simulated schedule deadlocked: simulated rank {r} waits in {} at step {} of {} \
             (a recording bug)",
            sg.job.job,
            pc[r] - sg.job.start[r],
            sg.job.start[r + 1] - sg.job.start[r]
        ));
    }
    Ok(RankTimes { end: clock, busy })
}
