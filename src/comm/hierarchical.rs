//! Hierarchical all-reduce: within the process, across processes, back within the process.
//!
//! With several processes (MPI ranks) of several worker threads each, the links differ by
//! orders of magnitude: threads of one process exchange gradients through shared memory,
//! processes through the network. A flat all-reduce over every worker sends `W` times as many
//! messages across the slow link as needed. The hierarchical one crosses it once per process:
//!
//! 1. **within**: every worker of a process sends its buffer to the process's leader (its
//!    local worker 0), which adds them in local rank order (0, 1, ..., W-1);
//! 2. **across**: the leaders, one per process, all-reduce the process sums among themselves
//!    with the bucket's mode (ring, hd, redundant, tree) or the transport's own all-reduce
//!    (`MPI_Allreduce`, `--comm mpi-native`);
//! 3. **back within**: each leader sends the result to its local workers.
//!
//! The leaders' phase runs the existing algorithms unchanged on a [`LeaderView`]: a
//! [`Transport`] whose rank `i` is global rank `i * W`. Every mode leaves bit-identical sums on
//! the leaders, and phase 3 copies them verbatim, so every worker of the run ends with the same
//! bits. The sum is not bit-identical to a flat all-reduce over the same workers (the additions
//! are grouped differently), only equal up to rounding.
//!
//! Ranks are laid out process-major: process `p`'s workers are global ranks `p*W .. (p+1)*W`
//! (as [`crate::comm::hybrid::HybridTransport`] numbers them). All three phases use the
//! bucket's tag: their messages go between different pairs of ranks, so they cannot be
//! confused.

use crate::comm::{add_into, all_reduce_sum, scratch_slice, CommError, CommMode, Transport};

/// What the process leaders run among themselves (phase 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaderOp {
    /// One of our all-reduce algorithms over the leaders.
    AllReduce(CommMode),
    /// The transport's own all-reduce across processes (`MPI_Allreduce`).
    Native,
}

impl std::fmt::Display for LeaderOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AllReduce(m) => write!(f, "{m}"),
            Self::Native => f.write_str("mpi-native"),
        }
    }
}

/// Sums `buf` over every rank of `t` in three phases (see the module docs); afterwards every
/// rank holds the same bits. `workers_per_process` (W) must divide `t.world()`; the calling
/// contract is [`crate::comm::AllReduce::all_reduce_sum`]'s. With one process, phase 2 does
/// nothing; with one worker per process, phases 1 and 3 do nothing.
pub fn hierarchical_all_reduce_sum(
    t: &dyn Transport,
    workers_per_process: usize,
    leader_op: LeaderOp,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let w = workers_per_process;
    if w == 0 || !t.world().is_multiple_of(w) {
        return Err(CommError::Transport {
            rank: t.rank(),
            detail: format!(
                "a hierarchical all-reduce needs the {} ranks to be whole processes of {w} \
                 workers each; this is a bug in the caller",
                t.world()
            ),
        });
    }
    let rank = t.rank();
    let local = rank % w;
    let leader = rank - local;
    if buf.is_empty() {
        return Ok(());
    }
    // Phase 1: the leader adds its workers' buffers in local rank order.
    if local != 0 {
        t.send(leader, tag, buf)?;
    } else {
        for peer in leader + 1..leader + w {
            let incoming = scratch_slice(scratch, buf.len());
            t.recv(peer, tag, incoming)?;
            add_into(buf, incoming);
        }
        // Phase 2: the leaders combine the process sums.
        let processes = t.world() / w;
        if processes > 1 {
            match leader_op {
                LeaderOp::AllReduce(mode) => {
                    let view = LeaderView {
                        parent: t,
                        stride: w,
                    };
                    all_reduce_sum(mode, &view, buf, tag, scratch)?;
                }
                LeaderOp::Native => t.native_all_reduce_sum_across_processes(buf, scratch)?,
            }
        }
        // Phase 3: the result goes back to the workers, verbatim.
        for peer in leader + 1..leader + w {
            t.send(peer, tag, buf)?;
        }
        return Ok(());
    }
    t.recv(leader, tag, buf)
}

/// The process leaders of a process-major transport, as a transport of their own: rank `i`
/// here is rank `i * stride` of the parent. Only leaders may use it.
pub struct LeaderView<'a> {
    /// The transport over every worker.
    pub parent: &'a dyn Transport,
    /// Workers per process.
    pub stride: usize,
}

impl Transport for LeaderView<'_> {
    fn rank(&self) -> usize {
        self.parent.rank() / self.stride
    }

    fn world(&self) -> usize {
        self.parent.world() / self.stride
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.parent.send(to * self.stride, tag, data)
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.parent.recv(from * self.stride, tag, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::InProcessFabric;
    use std::time::Duration;

    /// Runs the hierarchical all-reduce on `processes x workers` threads of one fabric (the
    /// processes simulated) and returns every rank's result.
    fn run(processes: usize, workers: usize, mode: CommMode, len: usize) -> Vec<Vec<f32>> {
        let world = processes * workers;
        let eps = InProcessFabric::new(world, None, Duration::from_secs(10));
        std::thread::scope(|s| {
            let handles: Vec<_> = eps
                .iter()
                .map(|t| {
                    s.spawn(move || {
                        let mut buf = input(t.rank(), len);
                        let mut scratch = Vec::new();
                        for tag in 0..2 {
                            // Twice, so a reused scratch and a second tag are exercised.
                            buf = input(t.rank(), len);
                            hierarchical_all_reduce_sum(
                                t,
                                workers,
                                LeaderOp::AllReduce(mode),
                                &mut buf,
                                tag,
                                &mut scratch,
                            )
                            .unwrap();
                        }
                        buf
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn input(rank: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 1e-3)
            .collect()
    }

    #[test]
    fn sums_match_an_f64_reference_and_are_identical_everywhere() {
        for (processes, workers) in [(2, 3), (3, 1), (1, 3), (2, 1), (3, 3), (2, 5)] {
            for mode in CommMode::ALL {
                let world = processes * workers;
                let len = 37;
                let got = run(processes, workers, mode, len);
                let reference: Vec<f64> = (0..len)
                    .map(|i| (0..world).map(|r| input(r, len)[i] as f64).sum())
                    .collect();
                for (r, g) in got.iter().enumerate() {
                    assert_eq!(
                        g.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        got[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{processes}x{workers} {mode}: rank {r} differs from rank 0"
                    );
                    for (a, b) in g.iter().zip(&reference) {
                        assert!(
                            (*a as f64 - b).abs() < 1e-4,
                            "{processes}x{workers} {mode}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_world_that_is_not_whole_processes_is_refused() {
        let eps = InProcessFabric::new(3, None, Duration::from_secs(1));
        let mut buf = vec![1.0];
        let err = hierarchical_all_reduce_sum(
            &eps[0],
            2,
            LeaderOp::AllReduce(CommMode::Ring),
            &mut buf,
            0,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("whole processes"), "{err}");
    }
}
