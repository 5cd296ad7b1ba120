//! The simulator's default overheads, each taken from a named measurement and never fitted to
//! a scaling result: the one place `dptrain simulate`, `bench sim-check --against published`
//! and anything else that builds a cluster with defaults read them from.
//!
//! An ideal network ([`Overheads::IDEAL`]: no software cost per message or per step, the NIC
//! at its line rate, every worker equally fast) is an upper bound of what a cluster delivers;
//! [`MEASURED`] is what real stacks and devices were measured to cost. `simulate` prints both
//! (its `ideal eff%` column), so a prediction is read as a range, not a point.
//!
//! Every number below says where it comes from, when, and under which conditions. Where a
//! figure had to be read from a published one (the spread of GPUs' speed), the reading is
//! stated with it.

use super::topology::Topology;
use std::time::Duration;

/// One default and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cited<T> {
    /// The value the simulator uses.
    pub value: T,
    /// The measurement it is taken from: who, what, when, under which conditions.
    pub source: &'static str,
}

/// The overheads a simulated cluster adds to its links and devices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overheads {
    /// Software cost of every message (thread hand-off, MPI and TCP stacks), added to its
    /// link's latency.
    pub message_overhead: Duration,
    /// Fraction of a NIC's line rate a real stack delivers as payload, (0, 1].
    pub nic_efficiency: f64,
    /// Coefficient of variation of each worker's compute per step (stragglers: a synchronous
    /// step waits for the slowest of N draws).
    pub compute_spread: f64,
    /// Fixed cost of every step of more than one worker that communication cannot hide
    /// (coordination of the last gradients), added once per step.
    pub step_overhead: Duration,
}

impl Overheads {
    /// No overheads at all: the network as specified, every worker alike.
    pub const IDEAL: Overheads = Overheads {
        message_overhead: Duration::ZERO,
        nic_efficiency: 1.0,
        compute_spread: 0.0,
        step_overhead: Duration::ZERO,
    };

    /// `topology` with these overheads: its NIC's bandwidth (a line rate) times the NIC
    /// efficiency, and the per-message and per-step costs set.
    pub fn apply(&self, topology: Topology) -> Topology {
        let mut t = topology;
        t.nic.bandwidth_bytes_per_s *= self.nic_efficiency;
        t.overhead = self.message_overhead;
        t.step_overhead = self.step_overhead;
        t
    }

    /// Checks the figures: durations finite, efficiency in (0, 1], spread >= 0.
    pub fn validate(&self) -> Result<(), String> {
        let e = self.nic_efficiency;
        if !(e > 0.0 && e <= 1.0) {
            return Err(format!(
                "the NIC efficiency is a fraction of the line rate in (0, 1], not {e}"
            ));
        }
        let s = self.compute_spread;
        if !(s >= 0.0 && s.is_finite()) {
            return Err(format!("the compute spread must be a number >= 0, not {s}"));
        }
        Ok(())
    }
}

/// The measured defaults, each with its source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// See [`Overheads::message_overhead`].
    pub message_overhead: Cited<Duration>,
    /// See [`Overheads::nic_efficiency`].
    pub nic_efficiency: Cited<f64>,
    /// See [`Overheads::compute_spread`].
    pub compute_spread: Cited<f64>,
    /// See [`Overheads::step_overhead`].
    pub step_overhead: Cited<Duration>,
}

impl Defaults {
    /// The values alone.
    pub const fn overheads(&self) -> Overheads {
        Overheads {
            message_overhead: self.message_overhead.value,
            nic_efficiency: self.nic_efficiency.value,
            compute_spread: self.compute_spread.value,
            step_overhead: self.step_overhead.value,
        }
    }

    /// `(name, value as printed, source)` of each default, in a fixed order: for the tables
    /// and docs that list them.
    pub fn rows(&self) -> [(&'static str, String, &'static str); 4] {
        [
            (
                "per-message overhead",
                format!("{:.0} us", self.message_overhead.value.as_secs_f64() * 1e6),
                self.message_overhead.source,
            ),
            (
                "NIC efficiency",
                format!("{:.0}% of the line rate", self.nic_efficiency.value * 100.0),
                self.nic_efficiency.source,
            ),
            (
                "compute spread",
                format!(
                    "{:.1}% per worker and step",
                    self.compute_spread.value * 100.0
                ),
                self.compute_spread.source,
            ),
            (
                "per-step overhead",
                format!("{:.1} ms", self.step_overhead.value.as_secs_f64() * 1e3),
                self.step_overhead.source,
            ),
        ]
    }
}

/// The defaults (see the module docs). Chosen from their sources before any published
/// scaling result was simulated with them, and not moved since.
pub const MEASURED: Defaults = Defaults {
    // 14 us: the mean of 12.4 and 15.5 us.
    message_overhead: Cited {
        value: Duration::from_micros(14),
        source:
            "measured here: the namespace cluster of scripts/cluster.sh (docs/bench/sim-check.md \
                 (a), 2026-12-01), 2 hosts at 1 Gbit/s (tbf), MPI over TCP between the hosts' \
                 network namespaces (veth, no wire): a 4-byte ring all-reduce timed across the \
                 cluster and solved for the cost per message gave 15.5 us (vgg-small's link fit) \
                 and 12.4 us (lenet5's); the mean, 14 us, is the software cost of one message \
                 through the kernel's TCP stack, MPI and our transport. A GPU stack over RDMA \
                 costs less (nccl-tests: a 128-byte reduce-scatter over 2 nodes x 4 GPUs took \
                 23-32 us for its 7 ring steps, 3-5 us a step with the wire's latency: \
                 github.com/NVIDIA/nccl-tests/issues/128, 2023-02-02), so for NCCL over RDMA \
                 the default is pessimistic",
    },
    nic_efficiency: Cited {
        value: 0.94,
        source: "three measurements agree on 94%: (1) TCP over Ethernet at a 1500-byte MTU \
                 carries 1448 bytes of payload per 1538 on the wire (preamble, gap, Ethernet, \
                 IP and TCP headers with timestamps): 94.1%, the ceiling iperf reaches on 10 and \
                 25 GbE; (2) nccl-tests over InfiniBand NDR 400 Gbit/s: 'you should see \
                 46-48GB/s per NIC' of the 50 GB/s line rate, 92-96% (NVIDIA's NCCL \
                 maintainer, github.com/NVIDIA/nccl-tests/issues/290, 2025-03-03); (3) measured \
                 here: MPI over TCP across the namespace cluster at 100 Mbit/s (tbf) delivered \
                 11.9 MB/s of 12.5, 95% (docs/bench/sim-check.md (a), 2 hosts, vgg-small's \
                 buckets, 2026-12-01)",
    },
    compute_spread: Cited {
        value: 0.015,
        source: "Sinha, Guliani, Jain, Tran, Sinclair, Venkataraman: 'Not All GPUs Are Created \
                 Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems', \
                 SC22 (arXiv:2208.11035): on 5 clusters (Summit, Vortex, Frontera, Longhorn: \
                 V100; Corona: MI60), over 90% of their GPUs, 18,800 hours, '8% (max 22%) \
                 average performance variation' between GPUs of the same SKU, outliers up to \
                 1.5x slower than the median. Read as the spread from the slowest to the \
                 fastest non-outlier GPU (a box plot's whiskers, 5.4 standard deviations of a \
                 normal), 8% is a coefficient of variation of 1.5% (our reading, assumed; the \
                 outliers, which the reading leaves out, would cost more)",
    },
    step_overhead: Cited {
        value: Duration::from_micros(500),
        source: "Horovod's coordination cycle: a gradient that becomes ready waits for the \
                 next cycle of the background thread before its all-reduce is negotiated, half \
                 a cycle on average, and the last gradient's wait cannot be hidden; the default \
                 cycle is 1 ms since Horovod 0.21.0 (5 ms before: 'Changed default cycle time \
                 from 5ms to 1ms', horovod/horovod#2468; HOROVOD_CYCLE_TIME in \
                 docs/tensor-fusion.rst), so 0.5 ms a step. A documented setting rather than a \
                 measurement: assumed to stand for the per-step coordination of DDP-class \
                 frameworks too (none published)",
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LinkModel;

    #[test]
    fn applying_the_overheads_scales_the_nic_and_sets_the_costs() {
        let link = LinkModel {
            bandwidth_bytes_per_s: 1e9,
            latency: Duration::from_micros(5),
        };
        let t = MEASURED.overheads().apply(Topology::flat(4, link));
        assert_eq!(t.nic.bandwidth_bytes_per_s, 0.94e9);
        assert_eq!(t.nic.latency, link.latency);
        // The intra-host port is not a NIC: left at its rate.
        assert_eq!(t.intra.bandwidth_bytes_per_s, 1e9);
        assert_eq!(t.overhead, Duration::from_micros(14));
        assert_eq!(t.step_overhead, Duration::from_micros(500));
        let ideal = Overheads::IDEAL.apply(Topology::flat(4, link));
        assert_eq!(ideal, Topology::flat(4, link));
    }

    #[test]
    fn overheads_outside_their_ranges_are_refused() {
        assert!(MEASURED.overheads().validate().is_ok());
        assert!(Overheads::IDEAL.validate().is_ok());
        for e in [0.0, 1.5, f64::NAN] {
            let o = Overheads {
                nic_efficiency: e,
                ..Overheads::IDEAL
            };
            assert!(o.validate().unwrap_err().contains("NIC efficiency"), "{e}");
        }
        let o = Overheads {
            compute_spread: -0.1,
            ..Overheads::IDEAL
        };
        assert!(o.validate().unwrap_err().contains("spread"));
    }
}
