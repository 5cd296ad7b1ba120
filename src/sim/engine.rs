//! The event engine: runs communication programs under the link emulation's port model, in
//! virtual time.
//!
//! Port model (as `InProcessTransport::send`): every rank has one full-duplex port. A send of
//! `S` bytes issued at `t` starts at `max(t, sender's tx free, receiver's rx free)`, occupies
//! both sides for `S / bandwidth`, returns to the sender when the last byte is out, and the
//! message is receivable `latency` after that. Ports are reserved in the order sends are issued,
//! so the engine processes ranks in time order (a heap), and a rank yields after every step that
//! moves its clock.

use super::schedule::{Op, SymOp};
use crate::comm::LinkModel;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// When each rank finished its program, and how much of that it spent on communication.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTimes {
    /// End time of each rank's program (s).
    pub end: Vec<f64>,
    /// Time each rank spent in sends and receives (the end minus waits and compute), s.
    pub comm: Vec<f64>,
}

/// Heap key: time as bits (order-preserving for non-negative floats), then rank for ties.
fn key(t: f64, r: usize) -> Reverse<(u64, usize)> {
    debug_assert!(t >= 0.0 && t.is_finite());
    Reverse((t.to_bits(), r))
}

/// Runs one program per rank (all start at time 0) and returns when each finished.
/// Fails if the programs deadlock (a receive whose message is never sent), which would be a
/// schedule bug.
pub fn run_ranks(programs: &[Vec<Op>], link: &LinkModel) -> Result<RankTimes, String> {
    let n = programs.len();
    let beta = 1.0 / link.bandwidth_bytes_per_s;
    let alpha = link.latency.as_secs_f64();
    let mut tx = vec![0.0f64; n];
    let mut rx = vec![0.0f64; n];
    let mut pc = vec![0usize; n];
    let mut clock = vec![0.0f64; n];
    let mut idle = vec![0.0f64; n];
    let mut blocked: Vec<Option<(usize, u32)>> = vec![None; n];
    let mut done = vec![false; n];
    let mut mail: HashMap<(usize, usize, u32), VecDeque<f64>> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..n).map(|r| key(0.0, r)).collect();
    while let Some(Reverse((bits, r))) = heap.pop() {
        let t = f64::from_bits(bits);
        loop {
            let Some(&op) = programs[r].get(pc[r]) else {
                done[r] = true;
                clock[r] = t;
                break;
            };
            match op {
                Op::Send { to, bytes, tag } => {
                    pc[r] += 1;
                    let start = t.max(tx[r]).max(rx[to]);
                    let end = start + bytes * beta;
                    tx[r] = end;
                    rx[to] = end;
                    let ready = end + alpha;
                    if blocked[to] == Some((r, tag)) {
                        // The receiver was waiting for exactly this message.
                        blocked[to] = None;
                        pc[to] += 1;
                        heap.push(key(clock[to].max(ready), to));
                    } else {
                        mail.entry((r, to, tag)).or_default().push_back(ready);
                    }
                    if end > t {
                        heap.push(key(end, r));
                        break;
                    }
                }
                Op::Recv { from, tag } => {
                    let got = mail.get_mut(&(from, r, tag)).and_then(|q| q.pop_front());
                    match got {
                        Some(ready) => {
                            pc[r] += 1;
                            if ready > t {
                                heap.push(key(ready, r));
                                break;
                            }
                        }
                        None => {
                            blocked[r] = Some((from, tag));
                            clock[r] = t;
                            break;
                        }
                    }
                }
                Op::WaitUntil(x) => {
                    pc[r] += 1;
                    if x > t {
                        idle[r] += x - t;
                        heap.push(key(x, r));
                        break;
                    }
                }
                Op::Compute(d) => {
                    pc[r] += 1;
                    if d > 0.0 {
                        idle[r] += d;
                        heap.push(key(t + d, r));
                        break;
                    }
                }
            }
        }
    }
    if let Some(r) = done.iter().position(|d| !d) {
        return Err(format!(
            "simulated schedule deadlocked: rank {r} waits at op {} ({:?})",
            pc[r],
            programs[r].get(pc[r])
        ));
    }
    let comm = clock.iter().zip(&idle).map(|(e, i)| e - i).collect();
    Ok(RankTimes { end: clock, comm })
}

/// Runs a rank-symmetric program (see [`super::schedule::symmetric_program`]) starting at time
/// 0 with free ports and returns its duration (s). Every rank runs the same program at the same
/// times, so the representative's receive port is busy exactly when its own transmissions are
/// (its mirror sender started at the same instant), and a send starts when both are free.
pub fn run_symmetric(ops: &[SymOp], link: &LinkModel) -> f64 {
    let beta = 1.0 / link.bandwidth_bytes_per_s;
    let alpha = link.latency.as_secs_f64();
    let (mut t, mut port) = (0.0f64, 0.0f64);
    let mut sent: Vec<f64> = Vec::new();
    for op in ops {
        match *op {
            SymOp::Send(bytes) => {
                let start = t.max(port);
                let end = start + bytes * beta;
                port = end;
                t = end;
                sent.push(end + alpha);
            }
            SymOp::Recv(i) => t = t.max(sent[i]),
        }
    }
    t
}
