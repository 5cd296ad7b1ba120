//! Staging: the last stage between the prefetch queue and the worker, where a host batch becomes
//! the worker's input tensors on its device.
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
//! tensors are built from it when the worker asks.

use super::Batch;
use candle_core::{Device, Tensor};

/// Makes batches resident on one worker's device.
#[derive(Debug, Clone)]
pub struct Staging {
    device: Device,
}

/// A batch on its way to (on the CPU: already at) the device.
#[derive(Debug)]
pub struct Staged {
    batch: Batch,
}

impl Staging {
    /// Staging onto `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            device: device.clone(),
        }
    }

    /// The device batches are staged onto.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Starts making `batch` resident. On the CPU: no copy, the buffer is handed over.
    pub fn stage(&mut self, batch: Batch) -> Staged {
        Staged { batch }
    }
}

impl Staged {
    /// The host side of the batch.
    pub fn host(&self) -> &Batch {
        &self.batch
    }

    /// The batch as `(images (N, C, H, W), labels (N))` on `device` (where the copy is waited
    /// for, on CUDA).
    pub fn tensors(
        &self,
        [c, h, w]: [usize; 3],
        device: &Device,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let n = self.batch.len();
        let x = Tensor::from_slice(&self.batch.images, (n, c, h, w), device)?;
        let y = Tensor::from_slice(&self.batch.labels, n, device)?;
        Ok((x, y))
    }

    /// The host buffer back, for recycling (on CUDA, once the copy has completed).
    pub fn into_host(self) -> Batch {
        self.batch
    }
}
