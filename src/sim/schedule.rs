//! Message schedules: what each rank's communication thread does in a collective, written to
//! mirror `src/comm/{ring,halving_doubling,tree,redundant}.rs` call for call (same partners,
//! same order, same message sizes).
//!
//! Two forms. [`rank_program`] gives one rank's sends and receives, for the all-ranks event
//! engine ([`super::engine::run_ranks`]). [`symmetric_program`] gives one *representative*
//! rank's program for the algorithms where every rank does the same thing at the same time
//! (ring, redundant, halving-doubling on a power of two): there, by symmetry, every port is in
//! the same state as the representative's, so simulating one rank is exact and costs O(rounds)
//! instead of O(ranks x rounds) (ring and redundant at 1024 ranks would otherwise be a million
//! messages per bucket).
//!
//! Chunk sizes are fractional (`bytes * chunks / parts`): the implementations split by whole
//! elements, so their chunks differ from these by less than one f32; the cost model makes the
//! same simplification, which keeps the two comparable to rounding error.

use crate::comm::halving_doubling::prev_power_of_two;
use crate::comm::CommMode;

/// A collective as the trainer runs it on a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// All-reduce with the given algorithm.
    AllReduce(CommMode),
    /// Binomial-tree reduce to rank 0 (tree mode's gradient buckets).
    Reduce,
    /// Binomial-tree broadcast from rank 0 (tree mode's weights after the root's update).
    Broadcast,
}

/// One operation of a rank's communication thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// Send `bytes` to `to`; returns when the last byte has left (the port model).
    Send {
        /// Destination rank.
        to: usize,
        /// Message size.
        bytes: f64,
        /// Collective instance (the transport's tag): messages match within it, FIFO per pair.
        tag: u32,
    },
    /// Wait for the next message from `from` with `tag`.
    Recv {
        /// Source rank.
        from: usize,
        /// Collective instance.
        tag: u32,
    },
    /// Idle until this time (s): a bucket is not ready before its backward block ends.
    WaitUntil(f64),
    /// Busy with something else for this long (s): tree mode's root update.
    Compute(f64),
}

/// Appends rank `rank`'s operations for `coll` over `world` ranks on a `bytes`-byte buffer.
pub fn rank_program(
    coll: Collective,
    world: usize,
    rank: usize,
    bytes: f64,
    tag: u32,
    out: &mut Vec<Op>,
) {
    // The implementations send nothing in these cases.
    if world <= 1 || bytes <= 0.0 {
        return;
    }
    let send = |to: usize, bytes: f64| Op::Send { to, bytes, tag };
    let recv = |from: usize| Op::Recv { from, tag };
    let n = world;
    let r = rank;
    match coll {
        Collective::AllReduce(CommMode::Tree) => {
            tree_reduce(n, r, bytes, tag, out);
            tree_broadcast(n, r, bytes, tag, out);
        }
        Collective::Reduce => tree_reduce(n, r, bytes, tag, out),
        Collective::Broadcast => tree_broadcast(n, r, bytes, tag, out),
        Collective::AllReduce(CommMode::Ring) => {
            let (right, left) = ((r + 1) % n, (r + n - 1) % n);
            for _ in 0..2 * (n - 1) {
                out.push(send(right, bytes / n as f64));
                out.push(recv(left));
            }
        }
        Collective::AllReduce(CommMode::Redundant) => {
            for k in 1..n {
                out.push(send((r + k) % n, bytes));
            }
            out.extend((0..n).filter(|&j| j != r).map(recv));
        }
        Collective::AllReduce(CommMode::HalvingDoubling) => {
            let p2 = prev_power_of_two(n);
            let rem = n - p2;
            let paired = r < 2 * rem;
            let vr = if paired {
                if r & 1 == 1 {
                    out.push(send(r - 1, bytes));
                    None
                } else {
                    out.push(recv(r + 1));
                    Some(r / 2)
                }
            } else {
                Some(r - rem)
            };
            let real = |v: usize| if v < rem { 2 * v } else { v + rem };
            if let Some(vr) = vr {
                // A block of `mask` chunks out of p2.
                let block = |mask: usize| bytes * mask as f64 / p2 as f64;
                let mut mask = p2 / 2;
                while mask >= 1 {
                    out.push(send(real(vr ^ mask), block(mask)));
                    out.push(recv(real(vr ^ mask)));
                    mask /= 2;
                }
                let mut mask = 1;
                while mask < p2 {
                    out.push(send(real(vr ^ mask), block(mask)));
                    out.push(recv(real(vr ^ mask)));
                    mask *= 2;
                }
            }
            if paired {
                if r & 1 == 0 {
                    out.push(send(r + 1, bytes));
                } else {
                    out.push(recv(r - 1));
                }
            }
        }
    }
}

fn tree_reduce(n: usize, vr: usize, bytes: f64, tag: u32, out: &mut Vec<Op>) {
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            out.push(Op::Send {
                to: vr - mask,
                bytes,
                tag,
            });
            return;
        }
        if vr + mask < n {
            out.push(Op::Recv {
                from: vr + mask,
                tag,
            });
        }
        mask <<= 1;
    }
}

fn tree_broadcast(n: usize, vr: usize, bytes: f64, tag: u32, out: &mut Vec<Op>) {
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            out.push(Op::Recv {
                from: vr - mask,
                tag,
            });
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            out.push(Op::Send {
                to: vr + mask,
                bytes,
                tag,
            });
        }
        mask >>= 1;
    }
}

/// One operation of a representative rank in a rank-symmetric schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SymOp {
    /// Send this many bytes (to some rank; by symmetry its receive port is in the same state as
    /// ours).
    Send(f64),
    /// Receive the message that mirrors our own send number `i` (0-based): the peer sent it at
    /// the same moment we sent ours.
    Recv(usize),
}

/// The representative rank's program if `coll` is rank-symmetric over `world` ranks, else
/// `None` (tree, and halving-doubling off a power of two, need [`rank_program`]).
pub fn symmetric_program(coll: Collective, world: usize, bytes: f64) -> Option<Vec<SymOp>> {
    if world <= 1 || bytes <= 0.0 {
        return Some(Vec::new());
    }
    let n = world;
    let mut ops = Vec::new();
    match coll {
        Collective::AllReduce(CommMode::Ring) => {
            for i in 0..2 * (n - 1) {
                ops.push(SymOp::Send(bytes / n as f64));
                ops.push(SymOp::Recv(i));
            }
        }
        Collective::AllReduce(CommMode::Redundant) => {
            // Rank r's k-th send goes to r+k; what r receives from r-k is that rank's k-th send.
            ops.extend((0..n - 1).map(|_| SymOp::Send(bytes)));
            ops.extend((0..n - 1).map(SymOp::Recv));
        }
        Collective::AllReduce(CommMode::HalvingDoubling) if n.is_power_of_two() => {
            // Halving (masks n/2 .. 1), then doubling (1 .. n/2); one exchange per mask.
            let mut masks: Vec<usize> = (0..n.trailing_zeros()).rev().map(|b| 1 << b).collect();
            masks.extend((0..n.trailing_zeros()).map(|b| 1 << b));
            for (i, mask) in masks.into_iter().enumerate() {
                ops.push(SymOp::Send(bytes * mask as f64 / n as f64));
                ops.push(SymOp::Recv(i));
            }
        }
        _ => return None,
    }
    Some(ops)
}
