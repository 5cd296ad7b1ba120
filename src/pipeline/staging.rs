//! Staging: the last stage between the prefetch queue and the worker, where a host batch becomes
//! resident where the worker computes (the kernel backend's memory, see `crate::backend`).
//!
//! This is the single place a CUDA version drops in. There, [`Staging::stage`] would copy the
//! batch from a pinned (page-locked) host buffer into device memory with an asynchronous copy
//! on a separate copy stream and record an event; [`Staged::tensors`] would make the compute
//! stream wait on that event (no host wait at all); and the host buffer would go back to the
//! pool only once the event has completed ([`Staged::into_host`]). The pool's buffers would then
//! be allocated pinned, and the feed would stage batch s+1 as soon as it hands out batch s, so
//! the copy overlaps step s's compute.
//!
//! On the CPU there is nothing to copy ahead: staging hands the buffer over as it is, and the
//! network reads it in place.

use super::Batch;

/// Makes batches resident on one worker's device (the CPU today: nothing to do).
#[derive(Debug, Clone, Default)]
pub struct Staging {}

/// A batch on its way to (on the CPU: already at) the device.
#[derive(Debug)]
pub struct Staged {
    batch: Batch,
}

impl Staging {
    /// Staging onto the CPU backend.
    pub fn new() -> Self {
        Self {}
    }

    /// Starts making `batch` resident. On the CPU: no copy, the buffer is handed over.
    pub fn stage(&mut self, batch: Batch) -> Staged {
        Staged { batch }
    }
}

impl Staged {
    /// The batch (images NCHW, labels); on a device backend this is where the worker would
    /// wait for the copy.
    pub fn host(&self) -> &Batch {
        &self.batch
    }

    /// The host buffer back, for recycling (on CUDA, once the copy has completed).
    pub fn into_host(self) -> Batch {
        self.batch
    }
}
