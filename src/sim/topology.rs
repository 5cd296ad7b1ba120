//! The simulated cluster: hosts of devices, the links inside a host and each host's NIC.
//!
//! Port model (the link emulation's, [`crate::comm::LinkModel`], applied per link): every
//! device has one full-duplex port onto its host's interconnect (`intra`), and every host one
//! full-duplex NIC (`nic`) that all its devices share. A message between two devices of one
//! host occupies the sender's transmit and the receiver's receive side of their ports for
//! `bytes / intra bandwidth`; a message between hosts occupies the sending host's NIC
//! transmit and the receiving host's NIC receive side for `bytes / nic bandwidth`. Either way
//! the sender goes on once the last byte is out (the trainer's sends return then), and the
//! message can be received `latency + overhead` after that: latency is the link's, overhead a
//! per-message software cost (thread hand-off, MPI and TCP stacks) that `bench sim-check`
//! measures. A step of more than one worker also costs a fixed `step_overhead` that
//! communication cannot hide. [`super::defaults`] holds the measured defaults of both, and of
//! the NIC's efficiency (the fraction of its line rate a real stack delivers).
//!
//! Ranks are host-major, as the trainer numbers the workers of a multi-process run (worker
//! `w` of process `p` is rank `p * workers + w`): a host is a process, its devices are the
//! process's worker threads.

use crate::comm::LinkModel;
use std::time::Duration;

/// Hosts x devices and their links (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Topology {
    /// Hosts (processes of the run).
    pub hosts: usize,
    /// Devices (workers) per host.
    pub devices_per_host: usize,
    /// Each device's port within its host.
    pub intra: LinkModel,
    /// Each host's NIC, shared by its devices.
    pub nic: LinkModel,
    /// Software cost of every message, added to its link's latency.
    pub overhead: Duration,
    /// Software cost of every step of more than one worker that communication cannot hide
    /// (coordinating the last gradients), added once at the end of the step.
    pub step_overhead: Duration,
}

impl Topology {
    /// `workers` devices, each alone on its host behind a NIC of `link`: the flat network of one
    /// port per worker that the link emulation (`--link-bandwidth` in one process) models.
    pub fn flat(workers: usize, link: LinkModel) -> Self {
        Self {
            hosts: workers,
            devices_per_host: 1,
            intra: link,
            nic: link,
            overhead: Duration::ZERO,
            step_overhead: Duration::ZERO,
        }
    }

    /// Every worker of the cluster.
    pub fn workers(&self) -> usize {
        self.hosts.saturating_mul(self.devices_per_host)
    }

    /// The host of rank `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        rank / self.devices_per_host
    }

    /// The same cluster with `workers` workers in all: as many hosts as it takes at this many
    /// devices per host. Fails if they do not divide.
    pub fn with_workers(&self, workers: usize) -> Result<Self, String> {
        let d = self.devices_per_host;
        if workers == 0 || d == 0 || !workers.is_multiple_of(d) {
            return Err(format!(
                "{workers} workers are not whole hosts of {d} devices: give a multiple of \
                 --devices-per-host"
            ));
        }
        Ok(Self {
            hosts: workers / d,
            ..*self
        })
    }

    /// Checks the figures: at least one host and device, positive finite bandwidths.
    pub fn validate(&self) -> Result<(), String> {
        if self.hosts == 0 || self.devices_per_host == 0 {
            return Err("a cluster needs at least one host of at least one device".into());
        }
        for (what, l) in [("intra-host", &self.intra), ("NIC", &self.nic)] {
            let b = l.bandwidth_bytes_per_s;
            if !(b > 0.0 && b.is_finite()) {
                return Err(format!(
                    "the {what} bandwidth must be a positive number of bytes/s, not {b}"
                ));
            }
        }
        Ok(())
    }
}
