//! The 2-D hierarchy (see [`crate::comm::hierarchical`] for the picture; NCCL's, Horovod's
//! hierarchical and BytePS's scheme): with `W` workers per process, a bucket is cut into `W`
//! shards (`collective::chunk_range`, so every worker computes the same cut) and local worker `j` owns
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
//! Per worker, phases 1 and 3 move `2(W-1)/W` of the bucket through its port (the leader:
//! `2(W-1)` whole buckets through the leader's); phase 2 moves what the mode moves over the
//! processes, on a shard. Empty shards (a bucket shorter than `W`) send nothing, on both sides.

use crate::comm::process_view::{LocalView, ProcessView};
use crate::comm::redundant::sum_in_rank_order;
use crate::comm::{all_reduce_sum, chunk_range, CommError, CommMode, Transport};

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
            let owners = ProcessView {
                parent: t,
                stride: w,
                offset: me,
            };
            all_reduce_sum(mode, &owners, &mut buf[mine.clone()], tag, scratch)?;
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
