//! A fixed set of batch buffers that circulate: loader threads take an empty one, fill it, hand
//! it through a prefetch queue to a worker, and the worker gives it back for the next batch.
//!
//! The pool is sized once (see [`crate::pipeline::Pipeline::start`]) so the pipeline's memory is
//! bounded by `capacity x batch bytes` whatever the number of loader threads, and, once every
//! buffer has been filled once, no step allocates.

use super::Batch;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a waiting [`BufferPool::take`] looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Recycled batch buffers.
#[derive(Debug)]
pub struct BufferPool {
    tx: Sender<Batch>,
    rx: Receiver<Batch>,
    capacity: usize,
}

impl BufferPool {
    /// A pool of `capacity` empty buffers (they grow to batch size on first use).
    pub fn new(capacity: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        for _ in 0..capacity {
            let _ = tx.send(Batch::default());
        }
        Self { tx, rx, capacity }
    }

    /// Buffers in circulation.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Buffers free right now.
    pub fn available(&self) -> usize {
        self.rx.len()
    }

    /// A free buffer, waiting for one if need be; `None` once `stop` is set.
    pub fn take(&self, stop: &AtomicBool) -> Option<Batch> {
        loop {
            if stop.load(Ordering::Acquire) {
                return None;
            }
            match self.rx.recv_timeout(STOP_POLL) {
                Ok(b) => return Some(b),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Returns a buffer. A buffer beyond capacity (which would be a bug) is dropped rather than
    /// blocking the caller.
    pub fn give(&self, batch: Batch) {
        let _ = self.tx.try_send(batch);
    }
}
