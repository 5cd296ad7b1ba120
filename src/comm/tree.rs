//! Binomial-tree reduce and broadcast.
//!
//! They are separate public functions because the trainer can use them
//! separately: reduce gradients to the root, let the root run the optimizer,
//! then broadcast the new *weights* (so only one rank does the update).
//! [`TreeAllReduce`] simply chains the two with root 0.

use crate::comm::{add_into, scratch_slice, AllReduce, CommError, Transport};

fn check_root(t: &dyn Transport, root: usize) -> Result<(), CommError> {
    if root < t.world() {
        Ok(())
    } else {
        Err(CommError::InvalidRank {
            rank: t.rank(),
            peer: root,
            world: t.world(),
        })
    }
}

/// Sums `buf` over all ranks into `root`'s `buf` along a binomial tree
/// (`⌈log2 N⌉` rounds, full buffer per message).
///
/// Only the root's buffer is meaningful afterwards; other ranks are left
/// holding partial sums of their subtree. `scratch` is grown, never shrunk.
pub fn tree_reduce(
    t: &dyn Transport,
    buf: &mut [f32],
    root: usize,
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    check_root(t, root)?;
    let n = t.world();
    if n <= 1 || buf.is_empty() {
        return Ok(());
    }
    // Work in ranks relative to the root so any root uses the same tree shape.
    let vr = (t.rank() + n - root) % n;
    let real = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            // Subtree done: pass the partial sum up and stop.
            return t.send(real(vr - mask), tag, buf);
        }
        if vr + mask < n {
            let incoming = scratch_slice(scratch, buf.len());
            t.recv(real(vr + mask), tag, incoming)?;
            add_into(buf, incoming);
        }
        mask <<= 1;
    }
    Ok(())
}

/// Copies `root`'s `buf` into every rank's `buf` along a binomial tree
/// (`⌈log2 N⌉` rounds); the data arrives verbatim, so all ranks end
/// bit-identical to the root.
pub fn tree_broadcast(
    t: &dyn Transport,
    buf: &mut [f32],
    root: usize,
    tag: u64,
) -> Result<(), CommError> {
    check_root(t, root)?;
    let n = t.world();
    if n <= 1 || buf.is_empty() {
        return Ok(());
    }
    let vr = (t.rank() + n - root) % n;
    let real = |v: usize| (v + root) % n;
    // Receive from the parent (clear the lowest set bit of vr)...
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            t.recv(real(vr - mask), tag, buf)?;
            break;
        }
        mask <<= 1;
    }
    // ...then forward to children below that bit, farthest subtree first so
    // the biggest subtree starts earliest.
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            t.send(real(vr + mask), tag, buf)?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// All-reduce as [`tree_reduce`] to rank 0 followed by [`tree_broadcast`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TreeAllReduce;

impl AllReduce for TreeAllReduce {
    fn all_reduce_sum(
        &self,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        tree_reduce(t, buf, 0, tag, scratch)?;
        tree_broadcast(t, buf, 0, tag)
    }
}
