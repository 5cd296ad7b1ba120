//! The communication modes: which algorithm forms a gradient sum, by name, and the one call
//! that runs it.

use crate::comm::{
    halving_doubling, ring, AllReduce, CommError, HalvingDoublingAllReduce, RedundantAllReduce,
    RingAllReduce, Transport, TreeAllReduce,
};
use std::fmt;
use std::str::FromStr;

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
    /// ([`crate::comm::record`]) relies on that to record a schedule once and scale it to any size.
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

/// Sums `buf` over all ranks in shared memory ([`crate::comm::shared_memory`]), when every rank
/// of `t` is a thread of this process (an in-process fabric emulating no link); otherwise
/// says why it cannot. Same bits as [`CommMode::Redundant`].
pub fn shared_memory_all_reduce_sum(
    t: &dyn Transport,
    buf: &mut [f32],
    tag: u64,
) -> Result<(), CommError> {
    match t.shared_memory() {
        Some(shm) if shm.world() == t.world() => shm.all_reduce_sum(buf, tag),
        _ => Err(CommError::Unsupported {
            what: "the shared-memory all-reduce here: it needs every worker in one process \
                   and no emulated link (--comm shm with --transport inproc, no \
                   --link-bandwidth)",
        }),
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
}
