//! Planning past this machine: profiles of one worker's step, and a discrete-event simulation of
//! a data-parallel step on a cluster of hosts.
//!
//! The question: "what will my model do on H hosts of D devices with this network, in each
//! communication mode, flat or hierarchical, with overlap on or off, with which bucket size,
//! and with workers that are not all equally fast?", answered before renting the cluster.
//! Top-down:
//!
//! 1. **A profile** ([`crate::measure::profile`] the format, [`crate::measure::timing`] its
//!    measurement, [`profile`] profiles derived from a graph) is one worker's step, block by block: forward and backward
//!    times at a per-worker batch, each block's parameter sizes (its gradient bytes), the
//!    update time, and for measured profiles the spread of the step's compute. `dptrain
//!    profile` measures it here (per-block medians, timed through the block-wise backward's
//!    callback exactly where the trainer's reducer takes the gradients), or derives it from a
//!    model's graph ([`crate::model::Graph`]: one block per layer with parameters) and a stated
//!    device: its FLOPS and efficiency, or its training images/s for the model (a published
//!    single-device figure).
//! 2. **The cluster** ([`topology`]): hosts x devices per host, a port per device within its
//!    host, one NIC per host shared by its devices, a per-message software overhead and a
//!    per-step one. Their defaults, and those of the NIC's efficiency and the workers' compute
//!    spread, are measured ones with their sources ([`defaults`]); all zero is the ideal
//!    network, an upper bound that `simulate` prints beside each prediction.
//! 3. **A step** ([`step`]) replays every worker's timeline: forward, then backward last block
//!    first; the trainer's own rules cut the gradients into buckets and choose each bucket's
//!    operation (flat or hierarchical, `auto`'s mode), and a bucket is ready when backward
//!    has written its lowest block (overlap on: before that layer's input gradient where the
//!    profile has one, `Profile::backward_written_ms`) or when backward ends (overlap off). Each worker's
//!    communication thread runs bucket collectives one at a time, in order. Weak scaling: every
//!    worker runs the same profile (scaled per worker by the straggler draws), so the 1-worker
//!    step is the reference for efficiency.
//! 4. **Schedules** ([`schedule`]) are recorded by running the real `comm/` algorithms over a
//!    recording transport ([`crate::comm::record`]), so simulator and trainer cannot drift;
//!    symmetric schedules are simulated through one host's ranks.
//! 5. **The engine** ([`engine`]) runs them in virtual time under the port model.
//!
//! On one flat network with no compute and one bucket the result equals
//! [`crate::comm::predicted_time`]'s alpha-beta formulas (tests/sim.rs), except where the
//! formula is only a bound: the tree off a power of two, where the schedule is faster than
//! `2⌈log2 N⌉(α + nβ)`, and halving-doubling off a power of two, where early ranks' sends can
//! hold a late rank's port.
//!
//! Not modelled: computation of the additions in reductions, CPU contention between the
//! communication thread and compute (on this 2-core machine it is real; measuring the profile
//! with `--concurrent N` captures the compute side of it), and data loading (assumed
//! prefetched).

pub mod defaults;
pub mod engine;
pub mod profile;
pub mod schedule;
pub mod step;
pub mod topology;

pub use crate::measure::{measure, BlockProfile, MeasureSpec, Profile};
pub use defaults::{Overheads, MEASURED};
pub use profile::{from_graph, DeviceSpec, DeviceSpeed};
pub use schedule::{Job, Symmetry, MAX_EVENTS};
pub use step::{
    plan, plan_inputs, search_buckets, search_schedule, simulate_step, ScheduleChoice, Simulator,
    StepConfig, StepResult, Stragglers, PRIORITY_TRIES, SEARCH_PARTITIONS_KB,
};
pub use topology::Topology;
