//! Planning past this machine: profiles of one worker's step, and a discrete-event simulation of
//! a data-parallel step on N workers.
//!
//! The question: "what will my model do on N devices with this network, in each communication
//! mode, with overlap on or off, and with which bucket size?", answered before renting the
//! cluster. Top-down:
//!
//! 1. **A profile** ([`profile`]) is one worker's step, block by block: forward and backward
//!    times at a per-worker batch, each block's parameter sizes (its gradient bytes), and the
//!    update time. `dptrain profile` measures it here (per-block medians, timed through the
//!    block-wise backward's callback exactly where the trainer's reducer takes the gradients),
//!    or derives it from FLOPs and a stated device (`--device-tflops`, `--efficiency`) using the
//!    architecture descriptions in [`arch`] (ours, plus AlexNet, VGG-16, ResNet-50 and
//!    Inception-v3 computed from their layer shapes).
//! 2. **A step** ([`step`]) replays the worker's timeline: forward, then backward last block
//!    first; the trainer's own [`crate::parallel::BucketPlan`] cuts the gradients into buckets,
//!    and a bucket is ready when backward finishes its lowest block (overlap on) or when backward
//!    ends (overlap off). Each rank has one communication channel (the trainer's communication
//!    thread) that runs bucket collectives one at a time, in order. Weak scaling: every worker
//!    runs the same profile, so the 1-worker step is the reference for efficiency.
//! 3. **Collectives** ([`schedule`]) are the algorithms' actual message schedules, mirroring
//!    `src/comm/*.rs` send for send; tree mode is the trainer's (reduce per bucket, root update,
//!    weight broadcast).
//! 4. **The engine** ([`engine`]) runs those schedules in virtual time under the link
//!    emulation's port model: one full-duplex port per rank, a send occupies the sender's
//!    transmit and the receiver's receive side for `bytes / bandwidth` and arrives `latency`
//!    later. Rank-symmetric schedules (ring, redundant, halving-doubling on a power of two) are
//!    simulated through one representative rank, which is exact when every rank is in the same
//!    state; the others (tree, halving-doubling off a power of two, and any step that mixes
//!    them) run every rank's program, so ranks drifting apart between buckets is modelled too.
//!
//! With no compute and one bucket the result equals [`crate::comm::predicted_time`]'s alpha-beta
//! formulas (tests/sim.rs), except where the formula is only a bound: the tree off a power of two,
//! where the emulated (and simulated) schedule is faster than `2⌈log2 N⌉(α + nβ)`.
//!
//! `--link-latency` is the latency a message sees end to end, software included: `dptrain bench
//! sim-check` measures the emulated link's own per-message cost (thread hand-off and wake-up,
//! ~20 µs here) and adds it before comparing with emulated runs.
//!
//! Not modelled: computation of the additions in reductions, CPU contention between the
//! communication thread and compute (on this 2-core machine it is real; measuring the profile
//! with `--concurrent N` captures the compute side of it), data loading (assumed prefetched),
//! and stragglers (all ranks are equally fast).

pub mod arch;
pub mod cli;
pub mod engine;
pub mod profile;
pub mod schedule;
pub mod step;
pub mod validate;

pub use arch::{describe, segments, Arch, ArchBlock};
pub use profile::{from_flops, measure, BlockProfile, DeviceSpec, Profile};
pub use schedule::Collective;
pub use step::{search_buckets, simulate_step, CommChoice, StepConfig, StepResult};
