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
//! * **Shared memory** (`--comm shm`, [`shared_memory`]) — for workers that are threads of one
//!   process: no messages at all; each worker sums its slice of every replica's buffer in
//!   place and writes the sum into all of them (the redundant mode's summation order). The
//!   hierarchies use it within a process too. [`memory_cost`] prices it and the message
//!   modes as the memory work they are, for `auto` between threads.
//!
//! * **Compression on the wire** (`--compress fp16|bf16`, [`wire`]) — any mode's messages
//!   as 16-bit floats, summed in f32: half the bytes, each value rounded where it crosses a
//!   link.
//!
//! Every mode leaves **bit-identical** results on all ranks (each element's sum
//! is computed once and copied, or — in redundant mode — computed by every
//! rank with the same fixed addition order). Replicas therefore never drift
//! apart, which data-parallel SGD silently relies on.
//!
//! [`cost_model`] predicts each mode's time with the alpha-beta model and picks
//! the cheapest; [`InProcessFabric`] connects worker threads and can emulate a
//! slow network ([`LinkModel`]) to check those predictions.

pub mod collective;
pub mod cost_model;
pub mod error;
pub mod futex;
pub mod halving_doubling;
pub mod hierarchical;
pub mod hybrid;
pub mod leader;
pub mod memory_cost;
pub mod mode;
#[cfg(feature = "mpi")]
pub mod mpi_transport;
pub mod partition;
pub mod powersgd;
pub mod process_view;
pub mod record;
pub mod redundant;
pub mod ring;
pub mod shared_memory;
pub mod transport;
pub mod tree;
pub mod two_d;
pub mod wire;

pub use crate::comm::collective::AllReduce;
pub use crate::comm::cost_model::{
    choose_mode, choose_route, choose_wire, cost_terms, min_bucket_bytes, predicted_time,
    route_time, wire_route_time, Cluster, CostTerms, Route,
};
pub use crate::comm::error::CommError;
pub use crate::comm::halving_doubling::HalvingDoublingAllReduce;
pub use crate::comm::hierarchical::{hierarchical_all_reduce_sum, AcrossOp, Hierarchy};
pub use crate::comm::hybrid::{HybridTransport, RemotePort};
pub use crate::comm::mode::{all_reduce_sum, shared_memory_all_reduce_sum, CommMode};
pub(crate) use crate::comm::partition::{add_into, chunk_range, chunk_span, scratch_slice};
pub use crate::comm::process_view::{LocalView, ProcessView};
pub use crate::comm::redundant::RedundantAllReduce;
pub use crate::comm::ring::RingAllReduce;
pub use crate::comm::shared_memory::{Ownership, SharedGroup, SharedMemory};
pub use crate::comm::transport::{
    parse_bandwidth, parse_duration, InProcessFabric, InProcessTransport, LinkModel, Transport,
};
pub use crate::comm::tree::{tree_broadcast, tree_reduce, TreeAllReduce};
pub use crate::comm::wire::{WireFormat, WireTransport};
