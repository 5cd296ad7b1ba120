//! The bounded prefetch queue between the loader threads and one worker.
//!
//! It holds at most K batches. Loader threads fill batches for the same worker concurrently and
//! may finish them out of order, so the queue is a ring of K slots indexed by the worker's batch
//! sequence number: batch `seq` goes to slot `seq % K`, and a loader may only start batch `seq`
//! once batch `seq - K` has been taken ([`PrefetchQueue::reserve`]). The worker takes batches in
//! sequence order. Reserving before filling is what bounds the queue (and the buffers in use)
//! to K per worker however many loader threads there are.

use super::error::{LoadError, StopReason};
use super::Batch;
use std::sync::{Condvar, Mutex, MutexGuard};

/// A filled batch, or why it could not be filled.
pub type Item = Result<Batch, LoadError>;

#[derive(Debug)]
struct State {
    slots: Vec<Option<Item>>,
    /// Sequence number the worker takes next.
    next: usize,
    /// Filled slots.
    len: usize,
    /// Most filled slots ever seen.
    peak: usize,
    /// The worker has gone: loaders skip its batches.
    closed: bool,
    /// The pipeline is stopping, and why.
    stopped: Option<StopReason>,
}

/// One worker's prefetch queue of capacity K.
#[derive(Debug)]
pub struct PrefetchQueue {
    state: Mutex<State>,
    cv: Condvar,
}

/// Whether a loader may fill a reserved batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Yes: its slot is free.
    Go,
    /// No: the worker has left; skip the batch.
    Closed,
    /// No: the pipeline is stopping.
    Stopped,
}

impl PrefetchQueue {
    /// An empty queue holding at most `capacity` (>= 1) batches.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a prefetch queue holds at least one batch");
        Self {
            state: Mutex::new(State {
                slots: (0..capacity).map(|_| None).collect(),
                next: 0,
                len: 0,
                peak: 0,
                closed: false,
                stopped: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-updated (every update is
        // a few assignments), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Capacity K.
    pub fn capacity(&self) -> usize {
        self.lock().slots.len()
    }

    /// Batches waiting now.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// True when no batch is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most batches ever waiting at once (never more than K).
    pub fn peak(&self) -> usize {
        self.lock().peak
    }

    /// Waits until batch `seq` may be filled: batch `seq - K` has been taken.
    pub fn reserve(&self, seq: usize) -> Reserved {
        let mut s = self.lock();
        loop {
            if s.stopped.is_some() {
                return Reserved::Stopped;
            }
            if s.closed {
                return Reserved::Closed;
            }
            if seq < s.next + s.slots.len() {
                return Reserved::Go;
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Delivers reserved batch `seq`. Gives the buffer back when the worker has left.
    pub fn put(&self, seq: usize, item: Item) -> Option<Batch> {
        let mut s = self.lock();
        if s.closed {
            return item.ok();
        }
        let k = s.slots.len();
        debug_assert!(
            seq >= s.next && seq < s.next + k,
            "batch {seq} was not reserved"
        );
        s.slots[seq % k] = Some(item);
        s.len += 1;
        s.peak = s.peak.max(s.len);
        drop(s);
        self.cv.notify_all();
        None
    }

    /// Batch `seq` (the next in sequence), waiting for it; the error a loader met filling it,
    /// or why the pipeline stopped.
    pub fn take(&self, seq: usize) -> Item {
        let mut s = self.lock();
        if seq != s.next {
            return Err(LoadError::OutOfSequence {
                asked: seq,
                next: s.next,
            });
        }
        let k = s.slots.len();
        loop {
            if let Some(item) = s.slots[seq % k].take() {
                s.len -= 1;
                s.next += 1;
                drop(s);
                self.cv.notify_all();
                return item;
            }
            if let Some(why) = &s.stopped {
                return Err(LoadError::Stopped(why.clone()));
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The worker leaves: later batches are dropped. Returns the batches that were waiting.
    pub fn close(&self) -> Vec<Batch> {
        let mut s = self.lock();
        s.closed = true;
        s.len = 0;
        let left = s.slots.iter_mut().filter_map(|x| x.take()?.ok()).collect();
        drop(s);
        self.cv.notify_all();
        left
    }

    /// The pipeline stops: wakes every waiter; waiting for a batch that is not there fails
    /// with `why`. The first reason given is kept.
    pub fn stop(&self, why: &StopReason) {
        let mut s = self.lock();
        s.stopped.get_or_insert_with(|| why.clone());
        drop(s);
        self.cv.notify_all();
    }

    /// Batches taken so far.
    pub fn taken(&self) -> usize {
        self.lock().next
    }
}
