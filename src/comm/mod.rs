//! Gradient communication between data-parallel workers.
//!
//! After every step each worker holds its own gradient; before the optimizer
//! runs they must all see the same sum. How that sum is formed is the
//! *communication mode*, and the right choice depends on world size, message
//! size and the network's latency/bandwidth, which is why it is a run-time
//! option instead of a hard-wired algorithm:
//!
//! * **Reduction modes** split the work into structured rounds so each rank
//!   sends little data:
//!   * [`CommMode::Tree`] — binomial tree: reduce to rank 0, then broadcast
//!     (`2·⌈log2 N⌉` rounds, full buffer each round). The trainer can also use
//!     [`tree_reduce`] / [`tree_broadcast`] separately: the root applies the
//!     update and broadcasts *weights* instead of gradients.
//!   * [`CommMode::Ring`] — reduce-scatter + all-gather around a ring:
//!     bandwidth-optimal (`2(N-1)/N` of the buffer per rank) but `2(N-1)`
//!     latency-bound rounds.
//!   * [`CommMode::HalvingDoubling`] — Rabenseifner's recursive halving /
//!     doubling: the ring's bandwidth with only `2·log2 N` rounds.
//! * **Redundant communication** ([`CommMode::Redundant`]) — every rank sends
//!   its whole buffer to every other rank and each computes the sum itself:
//!   `N-1` times more data, but a single round with no root and no
//!   dependency chain, which wins when latency dominates (small tensors, few
//!   ranks, slow links).
//!
//! Every mode leaves **bit-identical** results on all ranks (each element's sum
//! is computed once and copied, or — in redundant mode — computed by every
//! rank with the same fixed addition order). Replicas therefore never drift
//! apart, which data-parallel SGD silently relies on.
//!
//! [`cost_model`] predicts each mode's time with the alpha-beta model and picks
//! the cheapest; [`InProcessFabric`] connects worker threads and can emulate a
//! slow network ([`LinkModel`]) to check those predictions.

pub mod cost_model;
pub mod error;
pub mod halving_doubling;
pub mod hierarchical;
pub mod hybrid;
#[cfg(feature = "mpi")]
pub mod mpi_transport;
pub mod record;
pub mod redundant;
pub mod ring;
pub mod transport;
pub mod tree;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

pub use crate::comm::cost_model::{
    choose_mode, cost_terms, min_bucket_bytes, predicted_time, CostTerms,
};
pub use crate::comm::error::CommError;
pub use crate::comm::halving_doubling::HalvingDoublingAllReduce;
pub use crate::comm::hierarchical::{hierarchical_all_reduce_sum, LeaderOp, LeaderView};
pub use crate::comm::hybrid::{HybridTransport, RemotePort};
pub use crate::comm::redundant::RedundantAllReduce;
pub use crate::comm::ring::RingAllReduce;
pub use crate::comm::transport::{
    parse_bandwidth, parse_duration, InProcessFabric, InProcessTransport, LinkModel, Transport,
};
pub use crate::comm::tree::{tree_broadcast, tree_reduce, TreeAllReduce};

/// Which algorithm forms the gradient sum (see the module docs for the
/// trade-offs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommMode {
    /// Binomial-tree reduce to rank 0 followed by a binomial broadcast.
    Tree,
    /// Ring reduce-scatter followed by ring all-gather.
    Ring,
    /// Rabenseifner recursive halving + recursive doubling.
    HalvingDoubling,
    /// All-to-all exchange of whole buffers; every rank sums locally.
    Redundant,
}

impl CommMode {
    /// All modes, in the order used to break cost-model ties.
    pub const ALL: [CommMode; 4] = [
        CommMode::Tree,
        CommMode::Ring,
        CommMode::HalvingDoubling,
        CommMode::Redundant,
    ];

    /// Into how many equal chunks this mode's algorithm cuts a buffer over `world` ranks (1:
    /// it only sends whole buffers). A buffer whose length is a multiple of this is split
    /// exactly, so every message is a fixed fraction of it; the schedule recorder
    /// ([`record`]) relies on that to record a schedule once and scale it to any size.
    pub fn chunks(self, world: usize) -> usize {
        match self {
            CommMode::Ring => ring::chunks(world),
            CommMode::HalvingDoubling => halving_doubling::chunks(world),
            CommMode::Tree | CommMode::Redundant => 1,
        }
    }

    /// The algorithm implementing this mode.
    pub fn algorithm(self) -> &'static dyn AllReduce {
        match self {
            CommMode::Tree => &TreeAllReduce,
            CommMode::Ring => &RingAllReduce,
            CommMode::HalvingDoubling => &HalvingDoublingAllReduce,
            CommMode::Redundant => &RedundantAllReduce,
        }
    }
}

impl fmt::Display for CommMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommMode::Tree => "tree",
            CommMode::Ring => "ring",
            CommMode::HalvingDoubling => "hd",
            CommMode::Redundant => "redundant",
        })
    }
}

impl FromStr for CommMode {
    type Err = String;

    /// Accepts the `Display` names; `halving-doubling` / `halving_doubling`
    /// are accepted as aliases of `hd` for readability in configs.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tree" => Ok(CommMode::Tree),
            "ring" => Ok(CommMode::Ring),
            "hd" | "halving-doubling" | "halving_doubling" => Ok(CommMode::HalvingDoubling),
            "redundant" => Ok(CommMode::Redundant),
            _ => Err(format!(
                "unknown communication mode {s:?}: expected one of tree, ring, hd, redundant"
            )),
        }
    }
}

/// A sum all-reduce algorithm: afterwards every rank's `buf` holds the
/// element-wise sum over all ranks, bit-identical on every rank.
pub trait AllReduce: Sync {
    /// Runs the collective. All ranks must call it with equally long buffers
    /// and the same `tag`; the tag must not be used by another collective
    /// running concurrently on the same transport. `scratch` is grown as
    /// needed and never shrunk, so reusing it across steps avoids allocation.
    fn all_reduce_sum(
        &self,
        t: &dyn Transport,
        buf: &mut [f32],
        tag: u64,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError>;
}

/// Sums `buf` over all ranks with the chosen mode; on return every rank holds
/// the identical (bit-for-bit) sum. See [`AllReduce::all_reduce_sum`] for the
/// calling contract.
pub fn all_reduce_sum(
    mode: CommMode,
    t: &dyn Transport,
    buf: &mut [f32],
    tag: u64,
    scratch: &mut Vec<f32>,
) -> Result<(), CommError> {
    mode.algorithm().all_reduce_sum(t, buf, tag, scratch)
}

/// Element range of chunk `i` when `len` elements are split into `parts`
/// nearly equal chunks (the first `len % parts` chunks get one extra), so
/// every rank computes the same partition without communicating.
pub(crate) fn chunk_range(len: usize, parts: usize, i: usize) -> Range<usize> {
    chunk_span(len, parts, i, i + 1)
}

/// Element range covering chunks `first..last` of the partition above.
pub(crate) fn chunk_span(len: usize, parts: usize, first: usize, last: usize) -> Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = |c: usize| c * base + c.min(extra);
    start(first)..start(last)
}

/// Returns `scratch[..n]`, growing (never shrinking) the buffer first.
pub(crate) fn scratch_slice(scratch: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if scratch.len() < n {
        scratch.resize(n, 0.0);
    }
    &mut scratch[..n]
}

/// `dst[i] += src[i]`, one f32 add per element so the result depends only on
/// the two operands (no reassociation), which keeps modes deterministic.
pub(crate) fn add_into(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_round_trip() {
        for m in CommMode::ALL {
            assert_eq!(m.to_string().parse::<CommMode>().unwrap(), m);
        }
        assert_eq!(
            "halving-doubling".parse::<CommMode>().unwrap(),
            CommMode::HalvingDoubling
        );
        let err = "star".parse::<CommMode>().unwrap_err();
        assert!(err.contains("tree, ring, hd, redundant"));
    }

    #[test]
    fn chunks_cover_everything() {
        for len in [0, 1, 5, 7, 100] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk_range(len, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= len / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
                assert_eq!(chunk_span(len, parts, 0, parts), 0..len);
            }
        }
    }
}
