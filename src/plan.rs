//! The planning rules: how a run cuts its gradients into buckets and how each bucket is
//! reduced. One source of truth for the trainer (`train::worker`), the simulator (`sim::step`)
//! and the benchmarks (`bench`): each describes its run as a [`PlanInputs`] (the trainer from
//! its `TrainConfig`, the simulator from its cluster) and asks it, so a flag means the same
//! buckets and the same operations wherever it is given.
//!
//! The rules, top-down:
//! 1. **The link planned for** ([`PlanInputs::auto_link`]): the one given (`--link-*`), else
//!    the slowest on the way: [`BETWEEN_PROCESSES_LINK`] over several processes,
//!    [`IN_PROCESS_LINK`] between threads.
//! 2. **Bucket caps** ([`bucket_caps`]): the caps given (`--first-bucket-kb`, `--bucket-kb`;
//!    one given leaves the other at 0), else what that link moves in one latency.
//! 3. **The buckets** ([`PlanInputs::bucket_plan`]): [`BucketPlan::new`] over the parameter
//!    blocks at those caps.
//! 4. **Each bucket's operation** ([`PlanInputs::bucket_ops`]): tree mode reduces to worker 0;
//!    the others all-reduce, hierarchically ([`PlanInputs::reduces_hierarchically`]) when
//!    several processes hold several workers each, and `auto` asks the cost model
//!    ([`choose_mode`]) for the link its leaders' (or flat) phase crosses.

pub mod memory;

use crate::comm::{choose_mode, min_bucket_bytes, CommMode, LeaderOp, LinkModel};
use crate::parallel::{BucketOp, BucketPlan};
use std::time::Duration;

/// How buckets pick their communication algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommChoice {
    /// Per bucket, the mode the alpha-beta cost model predicts fastest for the link.
    Auto,
    /// One mode for every bucket.
    Fixed(CommMode),
    /// The transport's own all-reduce (`mpi-native`: MPI_Allreduce), the reference to beat.
    Native,
}

impl CommChoice {
    /// Parses `auto` or a mode name.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "auto" {
            Ok(Self::Auto)
        } else if s == "mpi-native" {
            Ok(Self::Native)
        } else {
            s.parse::<CommMode>()
                .map(Self::Fixed)
                .map_err(|e| format!("{e} (or auto, or mpi-native with --transport mpi)"))
        }
    }
}

impl std::fmt::Display for CommChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(m) => write!(f, "{m}"),
            Self::Native => f.write_str("mpi-native"),
        }
    }
}

/// Link parameters assumed by `--comm auto` when no link is emulated: in-process copies
/// between threads (memory bandwidth, microseconds of channel latency).
pub const IN_PROCESS_LINK: LinkModel = LinkModel {
    bandwidth_bytes_per_s: 5e9,
    latency: Duration::from_micros(20),
};

/// Link parameters assumed by `--comm auto` between processes (an MPI run's flat modes, and
/// the leaders' phase of a hierarchical all-reduce) when no `--link-bandwidth` describes the
/// link: 10 Gbit/s Ethernet between machines. With `--transport mpi`, `--link-*` only informs
/// this choice; nothing is emulated.
pub const BETWEEN_PROCESSES_LINK: LinkModel = LinkModel {
    bandwidth_bytes_per_s: 1.25e9,
    latency: Duration::from_micros(20),
};

/// `--first-bucket-kb` and `--bucket-kb` as the user gave them (KiB; 0: one block per bucket).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketFlags {
    /// `--first-bucket-kb`: the cap of the first bucket (the last layers, ready first).
    pub first_kb: Option<usize>,
    /// `--bucket-kb`: the cap of every other bucket.
    pub kb: Option<usize>,
}

impl BucketFlags {
    /// The caps (first, others) in KiB these flags fix, or `None` when neither was given and
    /// both follow the link ([`bucket_caps`]). One flag given leaves the other at 0.
    pub fn caps_kb(&self) -> Option<(usize, usize)> {
        match (self.first_kb, self.kb) {
            (None, None) => None,
            (first, rest) => Some((first.unwrap_or(0), rest.unwrap_or(0))),
        }
    }
}

/// The bucket caps (first, others) in bytes: given ones as they are (`caps_kb`, see
/// [`BucketFlags::caps_kb`]), otherwise what `link` moves in one latency (`bandwidth x
/// latency`, see [`min_bucket_bytes`]). Buckets are reduced one after another on the
/// communication thread, so a bucket smaller than that spends most of its time waiting on
/// latency, and merging it with the next one costs less overlap than the latency it saves.
/// Measured (lenet5, 2 workers x 1 thread, 10 Gbit/s, 2 ms, earlier engine): one bucket per
/// block, `auto` 11.5 ms a step; with this cap (one bucket) 4.7 ms.
pub fn bucket_caps(caps_kb: Option<(usize, usize)>, link: &LinkModel) -> (usize, usize) {
    match caps_kb {
        None => {
            let cap = min_bucket_bytes(link);
            (cap, cap)
        }
        // A cap past any gradient's size means one bucket: saturate rather than wrap.
        Some((first, rest)) => (first.saturating_mul(1024), rest.saturating_mul(1024)),
    }
}

/// A global batch that does not split evenly over the run's workers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct UnevenBatch {
    /// The global batch.
    pub batch: usize,
    /// Workers in each process (`--workers`).
    pub workers_per_process: usize,
    /// Processes of the run.
    pub processes: usize,
}

impl std::fmt::Display for UnevenBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (batch, workers) = (self.batch, self.workers_per_process);
        if self.processes <= 1 {
            write!(
                f,
                "--batch {batch} must be a positive multiple of --workers {workers} (each \
                 worker takes batch/workers samples)"
            )
        } else {
            write!(
                f,
                "--batch {batch} must be a multiple of the {} workers of the run ({workers} per \
                 process x {} processes)",
                workers * self.processes,
                self.processes
            )
        }
    }
}

/// Each worker's share of a global `batch` split over `processes` x `workers_per_process`
/// workers: the one check that the split is even, which the configuration, the trainer, the
/// benchmarks and the sampler's invariant make.
pub fn per_worker_batch(
    batch: usize,
    workers_per_process: usize,
    processes: usize,
) -> Result<usize, UnevenBatch> {
    let world = workers_per_process * processes;
    if batch == 0 || world == 0 || !batch.is_multiple_of(world) {
        return Err(UnevenBatch {
            batch,
            workers_per_process,
            processes,
        });
    }
    Ok(batch / world)
}

/// The element count of each of `net`'s parameter blocks (forward order): what its bucket plan
/// is cut from ([`PlanInputs::bucket_plan`]).
pub fn block_lens(net: &crate::nn::Net) -> Vec<usize> {
    net.blocks().iter().map(|b| b.range.len()).collect()
}

/// What the plan of a run depends on, and nothing else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInputs {
    /// `--comm`.
    pub comm: CommChoice,
    /// `--hierarchical on`.
    pub hierarchical: bool,
    /// Processes (MPI ranks; hosts in the simulator).
    pub processes: usize,
    /// Workers in each process (devices per host in the simulator).
    pub workers_per_process: usize,
    /// The link given (`--link-*`), if any.
    pub link: Option<LinkModel>,
    /// The bucket caps given.
    pub buckets: BucketFlags,
}

impl PlanInputs {
    /// A run of `processes` x `workers_per_process` workers on `link` (if given) with the
    /// trainer's defaults otherwise: `--comm auto`, `--hierarchical on`, no bucket flags.
    pub fn defaults(processes: usize, workers_per_process: usize, link: Option<LinkModel>) -> Self {
        Self {
            comm: CommChoice::Auto,
            hierarchical: true,
            processes,
            workers_per_process,
            link,
            buckets: BucketFlags::default(),
        }
    }

    /// Every worker of the run.
    pub fn world(&self) -> usize {
        self.processes * self.workers_per_process
    }

    /// The link `--comm auto` plans for and the caps follow: the one given with `--link-*`,
    /// else the slowest on the way (between processes in a multi-process run, between threads
    /// otherwise).
    pub fn auto_link(&self) -> LinkModel {
        self.link.unwrap_or(if self.processes > 1 {
            BETWEEN_PROCESSES_LINK
        } else {
            IN_PROCESS_LINK
        })
    }

    /// Whether buckets reduce hierarchically: several processes of several workers each (and
    /// `--hierarchical on`), or `mpi-native` with several workers per process (MPI_Allreduce
    /// runs between the process leaders only).
    pub fn reduces_hierarchically(&self) -> bool {
        let several = self.processes > 1 && self.workers_per_process > 1;
        let native = self.comm == CommChoice::Native && self.workers_per_process > 1;
        (several && self.hierarchical) || native
    }

    /// The bucket caps (first, others) in bytes of this run: [`bucket_caps`] for the link
    /// `--comm auto` plans for.
    pub fn bucket_caps(&self) -> (usize, usize) {
        bucket_caps(self.buckets.caps_kb(), &self.auto_link())
    }

    /// The buckets of parameter blocks of `block_lens` elements (forward order).
    pub fn bucket_plan(&self, block_lens: &[usize]) -> BucketPlan {
        let (first, rest) = self.bucket_caps();
        BucketPlan::new(block_lens, first, rest)
    }

    /// Chooses each bucket's operation. Tree mode updates on worker 0 and broadcasts weights
    /// (Caffe's scheme), which stays flat over every worker even when the others reduce
    /// hierarchically.
    pub fn bucket_ops(&self, plan: &BucketPlan) -> Vec<BucketOp> {
        let hierarchical = self.reduces_hierarchically();
        let hier = |leader| BucketOp::Hierarchical {
            leader,
            workers_per_process: self.workers_per_process,
        };
        plan.buckets
            .iter()
            .map(|b| match self.comm {
                CommChoice::Fixed(CommMode::Tree) => BucketOp::ReduceToRoot,
                CommChoice::Fixed(m) if hierarchical => hier(LeaderOp::AllReduce(m)),
                CommChoice::Fixed(m) => BucketOp::AllReduce(m),
                CommChoice::Native if hierarchical => hier(LeaderOp::Native),
                CommChoice::Native => BucketOp::Native,
                CommChoice::Auto if hierarchical => {
                    // The leaders' phase crosses the link between processes; the phases
                    // within a process have no choice to make.
                    let bytes = b.len * 4;
                    let mode = choose_mode(self.processes, bytes, &self.auto_link());
                    tracing::debug!(bytes, %mode, "auto: the cost model's choice for the leaders");
                    hier(LeaderOp::AllReduce(mode))
                }
                CommChoice::Auto => {
                    let bytes = b.len * 4;
                    let mode = choose_mode(self.world(), bytes, &self.auto_link());
                    tracing::debug!(bytes, %mode, "auto: the cost model's choice for a bucket");
                    BucketOp::AllReduce(mode)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_follow_the_link_unless_given_and_one_flag_leaves_the_other_at_zero() {
        let link = LinkModel {
            bandwidth_bytes_per_s: 1.25e9,
            latency: Duration::from_micros(20),
        };
        let caps = |first_kb, kb| bucket_caps(BucketFlags { first_kb, kb }.caps_kb(), &link);
        assert_eq!(caps(None, None), (25_000, 25_000));
        assert_eq!(caps(Some(64), None), (64 * 1024, 0));
        assert_eq!(caps(None, Some(128)), (0, 128 * 1024));
        assert_eq!(caps(None, Some(0)), (0, 0));
    }

    #[test]
    fn an_uneven_batch_is_refused_naming_both_numbers() {
        assert_eq!(per_worker_batch(64, 4, 1), Ok(16));
        assert_eq!(per_worker_batch(64, 2, 4), Ok(8));
        let e = per_worker_batch(30, 4, 1).unwrap_err().to_string();
        assert!(e.contains("--batch 30") && e.contains("--workers 4"), "{e}");
        let e = per_worker_batch(30, 2, 4).unwrap_err().to_string();
        assert!(
            e.contains("the 8 workers of the run (2 per process x 4"),
            "{e}"
        );
        assert!(per_worker_batch(0, 1, 1).is_err());
        assert!(per_worker_batch(8, 0, 1).is_err());
    }

    #[test]
    fn the_hierarchy_needs_several_processes_of_several_workers_or_native() {
        let inputs = |processes, workers_per_process, comm| PlanInputs {
            comm,
            hierarchical: true,
            processes,
            workers_per_process,
            link: None,
            buckets: BucketFlags::default(),
        };
        let ring = CommChoice::Fixed(CommMode::Ring);
        assert!(inputs(2, 2, ring).reduces_hierarchically());
        assert!(!inputs(2, 1, ring).reduces_hierarchically());
        assert!(!inputs(1, 4, ring).reduces_hierarchically());
        assert!(inputs(1, 2, CommChoice::Native).reduces_hierarchically());
        let flat = PlanInputs {
            hierarchical: false,
            ..inputs(2, 2, ring)
        };
        assert!(!flat.reduces_hierarchically());
        assert_eq!(inputs(2, 2, ring).auto_link(), BETWEEN_PROCESSES_LINK);
        assert_eq!(inputs(1, 2, ring).auto_link(), IN_PROCESS_LINK);
    }
}
