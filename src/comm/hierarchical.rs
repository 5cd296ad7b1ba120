//! Hierarchical all-reduce: the workers of a process first, then across processes, then the
//! workers of a process again.
//!
//! With several processes (MPI ranks, one per host) of several worker threads each, the links
//! differ by orders of magnitude: threads of one process exchange gradients through shared
//! memory, processes through the network, and every worker of a host shares its NIC. A flat
//! all-reduce over every worker ignores that (halving-doubling's first rounds send half the
//! buffer from every worker of a host through the one NIC at once). A hierarchy crosses the
//! network with each byte once per process. Two are built, and `--hierarchical` picks (the
//! planning rules, [`crate::plan`], price them against flat with the cost model):
//!
//! ```text
//!  P processes (hosts) x W workers; a bucket of n bytes; g = a worker's gradient, s = a sum
//!
//!  leader (one worker per host does the host's part):
//!    host 0:  w1 --g--> w0 <--g-- w2      1. every worker sends its whole g to the leader,
//!                       |                    which adds them: (W-1) x n into one core
//!                       | mode among      2. the leaders all-reduce the host sums with the
//!    host 1:  w1 --g--> w0 <--g-- w2         bucket's mode: one stream of n through each NIC
//!                       |                 3. each leader sends s back: (W-1) x n out of one core
//!
//!  2d (every worker owns 1/W of the bucket; NCCL's, Horovod's and BytePS's scheme):
//!    host 0:  [a0|a1|a2] [b0|b1|b2] [c0|c1|c2]    1. reduce-scatter within the host: worker
//!                w0          w1         w2           j receives shard j of every local
//!              s0 ring     s1 ring    s2 ring        worker and sums it (every core sums n/W)
//!    host 1:  across hosts, shard by shard         2. shard j's owners (worker j of every
//!                                                     host) all-reduce it with the mode: W
//!                                                     collectives of n/W at once per NIC
//!             [s0|s1|s2] on every worker           3. all-gather within the host: every
//!                                                     worker copies the others' shards
//!
//!  off (flat): the mode over all P x W workers, each its own rank.
//! ```
//!
//! Both hierarchies run the existing algorithms unchanged among processes on a
//! [`crate::comm::ProcessView`] (the ranks of one local index across processes), and add the workers of a
//! process in the pairwise tree of [`crate::backend::sum_order`] over local ranks. Every worker
//! ends with the same bits (each element's sum is computed by one worker, or by every leader
//! in the same order, and then copied). Summation order: with `redundant` among processes and
//! both the process count and the workers per process powers of two, the pairwise tree over
//! hosts of pairwise trees over local workers *is* the pairwise tree over all the ranks, so
//! both hierarchies give the same bits as flat `redundant` (and, through
//! `backend::sum_order`, as one worker with the whole batch); otherwise they equal the flat sum
//! up to rounding (tests below).
//!
//! Ranks are laid out process-major: process `p`'s workers are global ranks `p*W .. (p+1)*W`
//! (as [`crate::comm::hybrid::HybridTransport`] numbers them). All three phases use the
//! bucket's tag: messages between one pair of ranks arrive in the order sent (the transport's
//! FIFO per pair and tag), and each pair exchanges phase 1's message before phase 3's.

pub use crate::comm::leader::AcrossOp;
#[cfg(test)]
use crate::comm::CommMode;
use crate::comm::{two_d, CommError, Transport};

/// How a hierarchical all-reduce uses the workers of a process (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hierarchy {
    /// Every worker's gradient to local worker 0, which alone crosses the network.
    Leader,
    /// Reduce-scatter within the process, each shard across processes by its owner,
    /// all-gather within.
    TwoD,
}

impl Hierarchy {
    /// Both, in the order used to break cost-model ties.
    pub const ALL: [Hierarchy; 2] = [Hierarchy::TwoD, Hierarchy::Leader];
}

impl std::fmt::Display for Hierarchy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Leader => "leader",
            Self::TwoD => "2d",
        })
    }
}

/// Sums `buf` over every rank of `t` with `hierarchy` (see the module docs); afterwards every
/// rank holds the same bits. `workers_per_process` (W) must divide `t.world()`; the calling
/// contract is [`crate::comm::AllReduce::all_reduce_sum`]'s. With one process, phase 2 does
/// nothing; with one worker per process, phases 1 and 3 do nothing.
pub fn hierarchical_all_reduce_sum(
    t: &dyn Transport,
    hierarchy: Hierarchy,
    workers_per_process: usize,
    across: AcrossOp,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    let w = workers_per_process;
    if w == 0 || !t.world().is_multiple_of(w) {
        return Err(bug(
            t,
            format!(
                "a hierarchical all-reduce needs the {} ranks to be whole processes of {w} \
                 workers each",
                t.world()
            ),
        ));
    }
    if buf.is_empty() {
        return Ok(());
    }
    match hierarchy {
        Hierarchy::Leader => crate::comm::leader::reduce(t, w, across, buf, tag, scratch),
        Hierarchy::TwoD => match across {
            AcrossOp::AllReduce(mode) => two_d::reduce(t, w, mode, buf, tag, scratch),
            AcrossOp::Native => Err(bug(
                t,
                "the 2-D hierarchy cannot use MPI_Allreduce (one call per process, and 2-D \
                 runs one collective per worker)"
                    .into(),
            )),
        },
    }
}

/// A caller's mistake, as a transport error naming the rank.
fn bug(t: &dyn Transport, what: String) -> CommError {
    CommError::Transport {
        rank: t.rank(),
        detail: format!("{what}; this is a bug in the caller"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{all_reduce_sum, InProcessFabric};
    use std::time::Duration;

    /// An all-reduce as the tests call it: transport, buffer, tag, scratch.
    type Collective = dyn Fn(&dyn Transport, &mut [f32], u64, &mut Vec<f32>) + Sync;

    /// Runs `op` on `processes x workers` threads of one fabric (the processes simulated),
    /// twice (so a reused scratch and a second tag are exercised), and returns every rank's
    /// result as bits.
    fn run(processes: usize, workers: usize, len: usize, op: &Collective) -> Vec<Vec<u32>> {
        let world = processes * workers;
        let eps = InProcessFabric::new(world, None, Duration::from_secs(10));
        std::thread::scope(|s| {
            let handles: Vec<_> = eps
                .iter()
                .map(|t| {
                    s.spawn(move || {
                        let mut scratch = Vec::new();
                        let mut buf = Vec::new();
                        for tag in 0..2 {
                            buf = input(t.rank(), len);
                            op(t, &mut buf, tag, &mut scratch);
                        }
                        buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn hier(
        h: Hierarchy,
        workers: usize,
        mode: CommMode,
    ) -> impl Fn(&dyn Transport, &mut [f32], u64, &mut Vec<f32>) + Sync {
        move |t, b, tag, s| {
            hierarchical_all_reduce_sum(t, h, workers, AcrossOp::AllReduce(mode), b, tag, s)
                .unwrap()
        }
    }

    fn input(rank: usize, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + rank * 13) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 1e-3)
            .collect()
    }

    #[test]
    fn sums_match_an_f64_reference_and_are_identical_everywhere() {
        for (processes, workers) in [(2, 3), (3, 1), (1, 3), (2, 1), (3, 3), (2, 5), (4, 2)] {
            for h in Hierarchy::ALL {
                for mode in CommMode::ALL {
                    // 37 is not a multiple of any worker count; 2 leaves some shards empty.
                    for len in [37, 2, 1] {
                        let world = processes * workers;
                        let got = run(processes, workers, len, &hier(h, workers, mode));
                        let reference: Vec<f64> = (0..len)
                            .map(|i| (0..world).map(|r| input(r, len)[i] as f64).sum())
                            .collect();
                        let what = format!("{processes}x{workers} {h} {mode} len {len}");
                        for (r, g) in got.iter().enumerate() {
                            assert_eq!(*g, got[0], "{what}: rank {r} differs from rank 0");
                            for (a, b) in g.iter().zip(&reference) {
                                let a = f32::from_bits(*a) as f64;
                                assert!((a - b).abs() < 1e-4, "{what}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn with_redundant_across_powers_of_two_give_flat_redundants_bits() {
        let flat = |t: &dyn Transport, b: &mut [f32], tag, s: &mut Vec<f32>| {
            all_reduce_sum(CommMode::Redundant, t, b, tag, s).unwrap()
        };
        for (processes, workers) in [(2, 2), (2, 4), (4, 2), (1, 4), (4, 1)] {
            let want = run(processes, workers, 29, &flat);
            for h in Hierarchy::ALL {
                let got = run(
                    processes,
                    workers,
                    29,
                    &hier(h, workers, CommMode::Redundant),
                );
                assert_eq!(got, want, "{processes}x{workers} {h}");
            }
        }
        // Three processes: the flat tree splits a process, so the bits may differ, but every
        // worker still agrees (the test above).
    }

    #[test]
    fn a_world_that_is_not_whole_processes_is_refused() {
        let eps = InProcessFabric::new(3, None, Duration::from_secs(1));
        for h in Hierarchy::ALL {
            let mut buf = vec![1.0];
            let err = hierarchical_all_reduce_sum(
                &eps[0],
                h,
                2,
                AcrossOp::AllReduce(CommMode::Ring),
                &mut buf,
                0,
                &mut Vec::new(),
            )
            .unwrap_err();
            assert!(err.to_string().contains("whole processes"), "{err}");
        }
    }
}
