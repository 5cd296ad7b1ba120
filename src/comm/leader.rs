//! The leader hierarchy (see [`crate::comm::hierarchical`] for the picture): every worker of a
//! process sends its whole buffer to the process's leader (local worker 0), which adds them
//! (the pairwise tree over local ranks); the leaders all-reduce the process sums among
//! themselves with the bucket's mode, or with the transport's own all-reduce
//! (`MPI_Allreduce`, `--comm mpi-native`: one call per process, which is why that mode uses
//! this hierarchy); each leader sends the result back to its workers, verbatim.
//!
//! When the process's workers share memory ([`Transport::shared_memory`]), phases 1 and 3
//! read and write their buffers in place ([`crate::comm::shared_memory`],
//! [`Ownership::Leader`]): the same sums, without the copies through the fabric.
//!
//! One core adds every byte of the process and one stream crosses its NIC: the 2-D hierarchy
//! ([`crate::comm::two_d`]) spreads both over the workers. Kept for `mpi-native`, and as the
//! cheaper choice where the within-process copies cost nothing next to the network's latency
//! (the cost model prices both).

use crate::comm::process_view::{LocalView, ProcessView};
use crate::comm::redundant::sum_in_rank_order;
use crate::comm::{all_reduce_sum, CommError, CommMode, Ownership, Transport};

/// What runs among the processes (phase 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AcrossOp {
    /// One of our all-reduce algorithms.
    AllReduce(CommMode),
    /// The transport's own all-reduce across processes (`MPI_Allreduce`): one call per
    /// process, so only the leader hierarchy can use it.
    Native,
}

impl std::fmt::Display for AcrossOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AllReduce(m) => write!(f, "{m}"),
            Self::Native => f.write_str("mpi-native"),
        }
    }
}

/// Sums `buf` over every rank of `t` (process-major, `w` workers per process, `w` dividing the
/// world; `buf` not empty) through the process leaders.
pub(crate) fn reduce(
    t: &dyn Transport,
    w: usize,
    across: AcrossOp,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let local = LocalView { parent: t, size: w };
    if let Some(shm) = local.shared_memory() {
        // In shared memory: the leader adds every worker's buffer into its own, crosses, and
        // writes the result into theirs.
        return shm.collective(buf, tag, Ownership::Leader, |all| {
            if shm.rank == 0 {
                all.sum_into_own();
                if t.world() > w {
                    across_processes(t, w, across, all.own_mut(), tag, scratch)?;
                }
                all.copy_to_all();
            }
            Ok(())
        });
    }
    let me = local.rank();
    if me != 0 {
        // Phase 1, then 3: to the leader, and the sum back.
        local.send(0, tag, buf)?;
        return local.recv(0, tag, buf);
    }
    // Phase 1: the leader adds its workers' buffers, its own among them.
    sum_in_rank_order(&local, tag, buf, scratch)?;
    // Phase 2: the leaders combine the process sums.
    if t.world() > w {
        across_processes(t, w, across, buf, tag, scratch)?;
    }
    // Phase 3: the result goes back to the workers.
    for worker in 1..w {
        local.send(worker, tag, buf)?;
    }
    Ok(())
}

/// Phase 2: the leaders (local worker 0 of each process) combine the process sums in `buf`.
fn across_processes(
    t: &dyn Transport,
    w: usize,
    across: AcrossOp,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    match across {
        AcrossOp::AllReduce(mode) => {
            let leaders = ProcessView {
                parent: t,
                stride: w,
                offset: 0,
            };
            all_reduce_sum(mode, &leaders, buf, tag, scratch)
        }
        AcrossOp::Native => t.native_all_reduce_sum_across_processes(buf, scratch),
    }
}
