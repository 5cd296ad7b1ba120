//! One transport over every worker of a multi-process run: threads of this process through
//! the in-process fabric, workers of other processes through a [`RemotePort`] (MPI).
//!
//! Why: the collectives are written against [`Transport`], a flat world of ranks. Giving
//! each worker thread a [`HybridTransport`] over the whole run (P processes x W workers,
//! global rank `p * W + w`) makes every existing mode work across processes unchanged, with
//! the same message schedule, so a run of P processes x W workers trains bit-identically to
//! P*W worker threads in one process. The hierarchical all-reduce
//! ([`crate::comm::hierarchical`]) is built on the same transport.
//!
//! The remote side is a trait, so the routing is tested here without MPI (simulated processes
//! over one in-process fabric); `comm::mpi_transport::MpiPort` is the real one.

use crate::comm::{CommError, InProcessTransport, Transport};

/// A worker's link to the workers of the other processes: messages are addressed by
/// (process, worker in that process). Implementations must keep the [`Transport`] contract
/// per (sender, receiver, tag): buffered sends, FIFO per tag, receives bounded by a timeout.
pub trait RemotePort: Send + Sync {
    /// This process's index, in `0..processes()`.
    fn process(&self) -> usize;
    /// Number of processes in the run.
    fn processes(&self) -> usize;
    /// Sends a copy of `data` to worker `worker` of process `process` under `tag`.
    fn send(&self, process: usize, worker: usize, tag: u64, data: &[f32]) -> Result<(), CommError>;
    /// Receives the next message from worker `worker` of process `process` with `tag`.
    fn recv(
        &self,
        process: usize,
        worker: usize,
        tag: u64,
        out: &mut [f32],
    ) -> Result<(), CommError>;
    /// Sums `buf` over the processes with the remote side's own all-reduce; one caller per
    /// process. The default has none.
    fn all_reduce_sum_across_processes(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        let _ = (buf, scratch);
        Err(CommError::Unsupported {
            what: "a native all-reduce across processes",
        })
    }
}

/// One worker's endpoint over every worker of the run (see the module docs).
pub struct HybridTransport {
    local: InProcessTransport,
    remote: Box<dyn RemotePort>,
    /// Workers per process (the local fabric's world).
    workers: usize,
    /// This worker's global rank.
    rank: usize,
}

impl HybridTransport {
    /// Combines this worker's in-process endpoint (its fabric connects the W workers of this
    /// process; its rank is the local worker index) with its port to the other processes.
    pub fn new(local: InProcessTransport, remote: Box<dyn RemotePort>) -> Self {
        let workers = local.world();
        let rank = remote.process() * workers + local.rank();
        Self {
            local,
            remote,
            workers,
            rank,
        }
    }

    /// Workers per process.
    pub fn workers_per_process(&self) -> usize {
        self.workers
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        if peer < self.world() {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank: self.rank,
                peer,
                world: self.world(),
            })
        }
    }

    /// Restates an error of the local fabric or the remote port in global ranks (they number
    /// local workers, or processes), so a message names the workers involved.
    fn global_error(&self, e: CommError, peer: usize) -> CommError {
        match e {
            CommError::Timeout { tag, waited, .. } => CommError::Timeout {
                rank: self.rank,
                from: peer,
                tag,
                waited,
            },
            CommError::PeerGone { tag, .. } => CommError::PeerGone {
                rank: self.rank,
                peer,
                tag,
            },
            CommError::SizeMismatch {
                tag, expected, got, ..
            } => CommError::SizeMismatch {
                rank: self.rank,
                from: peer,
                tag,
                expected,
                got,
            },
            CommError::Transport { detail, .. } => CommError::Transport {
                rank: self.rank,
                detail,
            },
            CommError::LinkTooSlow {
                receiving,
                tag,
                bytes,
                needed,
                timeout,
                ..
            } => CommError::LinkTooSlow {
                rank: self.rank,
                peer,
                receiving,
                tag,
                bytes,
                needed,
                timeout,
            },
            other => other,
        }
    }
}

impl Transport for HybridTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.workers * self.remote.processes()
    }

    fn shared_memory(&self) -> Option<crate::comm::SharedMemory<'_>> {
        self.local
            .shared_memory()
            .map(|shm| crate::comm::SharedMemory {
                first_rank: self.rank - self.local.rank(),
                ..shm
            })
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        self.check_peer(to)?;
        let (process, worker) = (to / self.workers, to % self.workers);
        let sent = if process == self.remote.process() {
            self.local.send(worker, tag, data)
        } else {
            self.remote.send(process, worker, tag, data)
        };
        sent.map_err(|e| self.global_error(e, to))
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        self.check_peer(from)?;
        let (process, worker) = (from / self.workers, from % self.workers);
        let got = if process == self.remote.process() {
            self.local.recv(worker, tag, out)
        } else {
            self.remote.recv(process, worker, tag, out)
        };
        got.map_err(|e| self.global_error(e, from))
    }

    /// With one worker per process the processes are the ranks, so the remote side's own
    /// all-reduce is the answer; with more, it needs the hierarchical scheme.
    fn native_all_reduce_sum(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        if self.workers == 1 {
            self.remote.all_reduce_sum_across_processes(buf, scratch)
        } else {
            Err(CommError::Unsupported {
                what: "a flat native all-reduce with several workers per process (it runs \
                       between the process leaders: use --hierarchical leader)",
            })
        }
    }

    fn native_all_reduce_sum_across_processes(
        &self,
        buf: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        self.remote.all_reduce_sum_across_processes(buf, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::hierarchical::{hierarchical_all_reduce_sum, AcrossOp, Hierarchy};
    use crate::comm::{all_reduce_sum, CommMode, InProcessFabric};
    use std::time::Duration;

    /// A remote port over one fabric connecting every worker of the run: processes simulated.
    struct FabricPort {
        ep: InProcessTransport,
        workers: usize,
    }

    impl RemotePort for FabricPort {
        fn process(&self) -> usize {
            self.ep.rank() / self.workers
        }
        fn processes(&self) -> usize {
            self.ep.world() / self.workers
        }
        fn send(&self, p: usize, w: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
            self.ep.send(p * self.workers + w, tag, data)
        }
        fn recv(&self, p: usize, w: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
            self.ep.recv(p * self.workers + w, tag, out)
        }
    }

    /// P x W hybrid endpoints, in global rank order.
    fn hybrid(processes: usize, workers: usize) -> Vec<HybridTransport> {
        hybrid_with(processes, workers, Duration::from_secs(10))
    }

    fn hybrid_with(processes: usize, workers: usize, timeout: Duration) -> Vec<HybridTransport> {
        let mut remote = InProcessFabric::new(processes * workers, None, timeout).into_iter();
        (0..processes)
            .flat_map(|_| InProcessFabric::new(workers, None, timeout))
            .map(|local| {
                let ep = remote.next().expect("one remote endpoint per worker");
                HybridTransport::new(local, Box::new(FabricPort { ep, workers }))
            })
            .collect()
    }

    fn input(rank: usize) -> Vec<f32> {
        (0..23)
            .map(|i| (i as f32 * 0.31 + rank as f32).sin())
            .collect()
    }

    /// Every rank's result of `op` on its transport.
    fn on_all<T: Transport>(
        eps: &[T],
        op: impl Fn(&dyn Transport, &mut Vec<f32>) + Sync,
    ) -> Vec<Vec<u32>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = eps
                .iter()
                .map(|t| {
                    let op = &op;
                    s.spawn(move || {
                        let mut buf = input(t.rank());
                        op(t, &mut buf);
                        buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn flat_modes_over_processes_match_one_fabric_bit_for_bit() {
        for mode in CommMode::ALL {
            let flat = |t: &dyn Transport, b: &mut Vec<f32>| {
                all_reduce_sum(mode, t, b, 7, &mut Vec::new()).unwrap()
            };
            let one = on_all(
                &InProcessFabric::new(6, None, Duration::from_secs(10)),
                flat,
            );
            let split = on_all(&hybrid(2, 3), flat);
            assert_eq!(one, split, "{mode}");
        }
    }

    #[test]
    fn hierarchical_over_hybrid_is_identical_everywhere() {
        let eps = hybrid(3, 2);
        for h in Hierarchy::ALL {
            let got = on_all(&eps, |t, b| {
                let ring = AcrossOp::AllReduce(CommMode::Ring);
                hierarchical_all_reduce_sum(t, h, 2, ring, b, 3, &mut Vec::new()).unwrap()
            });
            assert!(got.iter().all(|g| *g == got[0]), "{h}");
        }
    }

    #[test]
    fn hierarchies_in_shared_memory_give_the_bits_of_messages() {
        // Over hybrid endpoints a process's workers share memory, so the within-process
        // phases read each other's buffers; over one fabric of every worker they are messages.
        for (processes, workers) in [(2, 2), (3, 2), (2, 3)] {
            let hybrid = hybrid(processes, workers);
            let one = InProcessFabric::new(processes * workers, None, Duration::from_secs(10));
            let local = |t: &dyn Transport| {
                crate::comm::LocalView {
                    parent: t,
                    size: workers,
                }
                .shared_memory()
                .is_some()
            };
            assert!(local(&hybrid[1]) && !local(&one[1]));
            for h in Hierarchy::ALL {
                for mode in CommMode::ALL {
                    let op = |t: &dyn Transport, b: &mut Vec<f32>| {
                        let across = AcrossOp::AllReduce(mode);
                        hierarchical_all_reduce_sum(t, h, workers, across, b, 3, &mut Vec::new())
                            .unwrap()
                    };
                    let shared = on_all(&hybrid, op);
                    assert_eq!(shared, on_all(&one, op), "{processes}x{workers} {h}:{mode}");
                }
            }
        }
    }

    #[test]
    fn errors_name_global_ranks() {
        let eps = hybrid_with(2, 2, Duration::from_millis(20));
        let mut out = [0.0];
        // Rank 3 (process 1, worker 1) waits for rank 0 (another process) and rank 2 (its own
        // process), neither of which sends.
        for from in [0, 2] {
            let e = eps[3].recv(from, 5, &mut out).unwrap_err();
            assert!(
                matches!(e, CommError::Timeout { rank: 3, from: f, tag: 5, .. } if f == from),
                "{e}"
            );
        }
        assert!(matches!(
            eps[3].send(9, 0, &[]),
            Err(CommError::InvalidRank {
                rank: 3,
                peer: 9,
                world: 4
            })
        ));
        let e = eps[1].native_all_reduce_sum(&mut out, &mut Vec::new());
        assert!(matches!(e, Err(CommError::Unsupported { .. })));
    }
}
