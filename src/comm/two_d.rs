//! The 2-D hierarchy (see [`crate::comm::hierarchical`] for the picture; NCCL's, Horovod's
//! hierarchical and BytePS's scheme): with `W` workers per process, a bucket is cut into `W`
//! shards (`partition::chunk_range`, so every worker computes the same cut) and local worker `j` owns
//! shard `j`.
//!
//! 1. **Reduce-scatter within the process**: every worker sends shard `j` of its buffer to
//!    local worker `j` (rotated order, so no worker is everyone's first target), and each
//!    owner adds the `W` copies of its shard in the pairwise tree over local ranks. Every
//!    worker sums `1/W` of the bucket: all the process's cores work, where the leader
//!    hierarchy gives one core every byte.
//! 2. **Across processes, shard by shard**: the owners of shard `j` (local worker `j` of every
//!    process, a [`ProcessView`] at offset `j`) all-reduce it with the bucket's mode. The `W`
//!    shards' collectives run at once, each on its worker's communication thread, so `W`
//!    streams of `n/W` share the NIC where the leader hierarchy sends one stream of `n` (over
//!    MPI each thread posts its own messages: the MPI port's lock is held only for the short
//!    calls, never across a wait).
//! 3. **All-gather within the process**: each owner sends its finished shard to the others.
//!
//! When the process's workers share memory ([`Transport::shared_memory`]: threads of one
//! process, no emulated link between them), phases 1 and 3 read and write the other workers'
//! buffers in place ([`crate::comm::shared_memory`], [`Ownership::Chunks`]): the owner adds
//! its shard of every buffer into its own, runs phase 2 on it, and writes the result into the
//! others' buffers; the same sums, no copies through the fabric. Otherwise they are messages:
//!
//! Per worker, phases 1 and 3 move `2(W-1)/W` of the bucket through its port (the leader:
//! `2(W-1)` whole buckets through the leader's); phase 2 moves what the mode moves over the
//! processes, on a shard. Empty shards (a bucket shorter than `W`) send nothing, on both sides.

use crate::comm::process_view::{LocalView, ProcessView};
use crate::comm::redundant::sum_in_rank_order;
use crate::comm::{all_reduce_sum, chunk_range, CommError, CommMode, Ownership, Transport};

/// Sums `buf` over every rank of `t` (process-major, `w` workers per process, `w` dividing the
/// world; `buf` not empty) in two dimensions, `mode` across processes.
pub(crate) fn reduce(
    t: &dyn Transport,
    w: usize,
    mode: CommMode,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let local = LocalView { parent: t, size: w };
    if let Some(shm) = local.shared_memory() {
        return shm.collective(buf, tag, Ownership::Chunks, |shard| {
            shard.sum_into_own();
            if t.world() > w {
                across(t, w, shm.rank, mode, shard.own_mut(), tag, scratch)?;
            }
            shard.copy_to_all();
            Ok(())
        });
    }
    let me = local.rank();
    let len = buf.len();
    let shard = |j: usize| chunk_range(len, w, j);
    let mine = shard(me);
    // Phase 1: every other worker's shard to its owner; then the copies of mine, summed.
    for k in 1..w {
        let owner = (me + k) % w;
        if !shard(owner).is_empty() {
            local.send(owner, tag, &buf[shard(owner)])?;
        }
    }
    if !mine.is_empty() {
        sum_in_rank_order(&local, tag, &mut buf[mine.clone()], scratch)?;
        // Phase 2: my shard over the processes.
        if t.world() > w {
            across(t, w, me, mode, &mut buf[mine.clone()], tag, scratch)?;
        }
        // Phase 3: my finished shard to every other worker.
        for k in 1..w {
            local.send((me + k) % w, tag, &buf[mine.clone()])?;
        }
    }
    for k in 1..w {
        let owner = (me + w - k) % w;
        if !shard(owner).is_empty() {
            local.recv(owner, tag, &mut buf[shard(owner)])?;
        }
    }
    Ok(())
}

/// Phase 2: shard `me` over the processes, among its owners (local worker `me` of each).
fn across(
    t: &dyn Transport,
    w: usize,
    me: usize,
    mode: CommMode,
    shard: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let owners = ProcessView {
        parent: t,
        stride: w,
        offset: me,
    };
    all_reduce_sum(mode, &owners, shard, tag, scratch)
}
