//! The loader threads and each worker's end of the pipeline ([`BatchFeed`]).
//!
//! The run's batches form one stream of jobs, `(epoch, step, worker)` in that order, numbered
//! `g = seq * workers + worker` with `seq = (epoch - first epoch) * steps_per_epoch + step`.
//! Loader threads claim jobs from an atomic counter, so they run through epoch boundaries
//! without stopping: the next epoch's first batches are filled while the current epoch's last
//! steps (and worker 0's evaluation) run, and threads are started once per run, not per epoch.
//! The epoch's sample order is a pure function of (seed, epoch) ([`DistributedSampler`]), so
//! any thread can compute it; it is computed once and shared ([`EpochOrders`]).
//!
//! Shutdown: stopping sets a flag, wakes every queue and the pool, and joins every thread.
//! It happens when the [`Pipeline`] is dropped (the run ended or failed), when a loader fails
//! (its error goes into the failing batch's slot so the worker that needed it reports it, and
//! every other worker's next wait fails with the same message), and when a worker leaves
//! before consuming all its batches (its feed is dropped).

use super::error::{BatchFailure, LoadError, StopReason};
use super::queue::{PrefetchQueue, Reserved};
use super::{Batch, BufferPool, Collator, DistributedSampler, SampleScratch, Source, Staged};
use super::{Normalize, Staging};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Most loader threads accepted.
pub const MAX_LOADER_THREADS: usize = 64;
/// Most prefetched batches per worker accepted.
pub const MAX_PREFETCH: usize = 64;

/// Loader threads when none is asked for: a quarter of the cores, at least 1 and at most 8.
/// The workers' compute threads already take every core; on a 2-core machine one loader thread
/// outruns a LeNet step (see the note in `docs/ARCHITECTURE.md`), and more only steal cycles
/// from compute.
pub fn default_loader_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 4).clamp(1, 8)
}

/// The permutation of recent epochs, computed once and shared by every loader thread.
#[derive(Debug, Default)]
pub struct EpochOrders {
    cache: Mutex<Vec<(usize, Arc<Vec<u32>>)>>,
}

/// Epoch orders kept: the one being finished and the one being started, plus slack.
const KEPT_ORDERS: usize = 3;

impl EpochOrders {
    /// The order of `epoch` (computed by the first thread to ask).
    pub fn get(&self, epoch: usize, sampler: &DistributedSampler) -> Arc<Vec<u32>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, o)) = cache.iter().find(|(e, _)| *e == epoch) {
            return o.clone();
        }
        let mut order = Vec::new();
        sampler.epoch_order(epoch, &mut order);
        let order = Arc::new(order);
        cache.push((epoch, order.clone()));
        if cache.len() > KEPT_ORDERS {
            cache.sort_by_key(|(e, _)| *e);
            cache.remove(0);
        }
        order
    }
}

/// State shared by the loader threads and the feeds.
#[derive(Debug)]
struct Shared {
    collator: Collator,
    sampler: DistributedSampler,
    queues: Vec<PrefetchQueue>,
    pool: BufferPool,
    stop: AtomicBool,
    next_job: AtomicUsize,
    /// The global step of each worker's first batch.
    first_step: usize,
    batches_per_worker: usize,
    orders: EpochOrders,
    running: AtomicUsize,
}

impl Shared {
    fn workers(&self) -> usize {
        self.queues.len()
    }

    fn stop_all(&self, why: StopReason) {
        self.stop.store(true, Ordering::Release);
        for q in &self.queues {
            q.stop(&why);
        }
    }

    /// (epoch, step) of a worker's batch `seq`.
    fn epoch_step(&self, seq: usize) -> (usize, usize) {
        let spe = self.sampler.steps_per_epoch().max(1);
        let global = self.first_step + seq;
        (global / spe, global % spe)
    }
}

/// The loader threads of one run, with the per-worker queues and the buffer pool.
#[derive(Debug)]
pub struct Pipeline {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// However a loader thread ends: decrements the running-thread count and, where it ends by a
/// panic (outside a batch's fill, which catches its own), stops the pipeline, so that no
/// worker waits for ever for a batch the thread had reserved.
struct LoaderExit<'a> {
    shared: &'a Shared,
    thread: usize,
}

impl Drop for LoaderExit<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.stop_all(StopReason::LoaderPanicked {
                thread: self.thread,
            });
        }
        self.shared.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pipeline {
    /// Starts `loader_threads` threads that fill every worker's batches for the global `steps`
    /// (epoch x steps per epoch + step: [`DistributedSampler::global_steps`]; a resumed run
    /// starts inside an epoch), at most
    /// `prefetch` (>= 1) ahead per worker, and returns one feed per worker (rank order).
    ///
    /// The pool holds `workers * (prefetch + 1)` buffers: up to `prefetch` reserved or waiting
    /// per worker plus the one each worker is training on. That is all the batch memory the
    /// pipeline ever uses, independent of `loader_threads`.
    pub fn start(
        collator: Collator,
        sampler: DistributedSampler,
        steps: Range<usize>,
        loader_threads: usize,
        prefetch: usize,
    ) -> Result<(Pipeline, Vec<BatchFeed>), String> {
        if !(1..=MAX_LOADER_THREADS).contains(&loader_threads) {
            return Err(format!(
                "--loader-threads must be 1..={MAX_LOADER_THREADS}, not {loader_threads}"
            ));
        }
        if !(1..=MAX_PREFETCH).contains(&prefetch) {
            return Err(format!(
                "a prefetching pipeline needs --prefetch 1..={MAX_PREFETCH} (0 loads in the step)"
            ));
        }
        let workers = sampler.workers();
        let shared = Arc::new(Shared {
            queues: (0..workers).map(|_| PrefetchQueue::new(prefetch)).collect(),
            pool: BufferPool::new(workers * (prefetch + 1)),
            stop: AtomicBool::new(false),
            next_job: AtomicUsize::new(0),
            first_step: steps.start,
            batches_per_worker: steps.len(),
            orders: EpochOrders::default(),
            running: AtomicUsize::new(loader_threads),
            collator,
            sampler,
        });
        let mut pipeline = Pipeline {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for t in 0..loader_threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("loader-{t}"))
                .spawn(move || loader_thread(&s, t));
            match h {
                Ok(h) => pipeline.threads.push(h),
                Err(e) => {
                    // Threads not started never decrement the count.
                    shared
                        .running
                        .fetch_sub(loader_threads - t, Ordering::AcqRel);
                    return Err(format!("cannot start loader thread: {e}"));
                }
            }
        }
        let feeds = (0..workers)
            .map(|rank| BatchFeed {
                rank,
                kind: Kind::Prefetch {
                    shared: shared.clone(),
                    next_seq: 0,
                },
                collator: shared.collator.clone(),
                staging: Staging::new(),
                current: None,
            })
            .collect();
        Ok((pipeline, feeds))
    }

    /// Loader threads still running.
    pub fn running_threads(&self) -> usize {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Each worker's queue: most batches ever waiting at once.
    pub fn queue_peaks(&self) -> Vec<usize> {
        self.shared.queues.iter().map(|q| q.peak()).collect()
    }

    /// Each worker's queue: batches waiting now.
    pub fn queue_lens(&self) -> Vec<usize> {
        self.shared.queues.iter().map(|q| q.len()).collect()
    }

    /// Buffers in the pool (the bound on the pipeline's batch memory).
    pub fn pool_capacity(&self) -> usize {
        self.shared.pool.capacity()
    }

    /// Stops the loader threads and joins them all; returns how many were joined.
    pub fn shutdown(mut self) -> usize {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> usize {
        self.shared.stop_all(StopReason::ShutDown);
        let mut joined = 0;
        for h in self.threads.drain(..) {
            // A loader's panics are caught per batch; a join error cannot carry news the
            // workers have not had already.
            let _ = h.join();
            joined += 1;
        }
        joined
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn loader_thread(s: &Shared, thread: usize) {
    let _exit = LoaderExit { shared: s, thread };
    let mut scratch = SampleScratch::default();
    let workers = s.workers();
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let g = s.next_job.fetch_add(1, Ordering::AcqRel);
        // Past every worker's last batch (not `g >= batches x workers`: that product can
        // pass usize where the run's steps do not).
        let (seq, w) = (g / workers, g % workers);
        if seq >= s.batches_per_worker {
            return;
        }
        let q = &s.queues[w];
        match q.reserve(seq) {
            Reserved::Go => {}
            Reserved::Closed => continue,
            Reserved::Stopped => return,
        }
        let Some(mut batch) = s.pool.take(&s.stop) else {
            return;
        };
        let (epoch, step) = s.epoch_step(seq);
        let order = s.orders.get(epoch, &s.sampler);
        let indices = s.sampler.shard(&order, step, w);
        let global_step = epoch * s.sampler.steps_per_epoch() + step;
        let filled = catch_unwind(AssertUnwindSafe(|| {
            s.collator.check_fault(global_step, w)?;
            s.collator.fill(indices, epoch, &mut scratch, &mut batch)
        }));
        let item = match filled {
            Ok(Ok(())) => Ok(batch),
            Ok(Err(e)) => Err(BatchFailure::Read(e)),
            Err(_) => {
                scratch = SampleScratch::default();
                Err(BatchFailure::Panicked(
                    indices[..indices.len().min(4)].to_vec(),
                ))
            }
        };
        let item = item.map_err(|cause| LoadError::Batch {
            epoch,
            step,
            worker: Some(w),
            cause,
        });
        let failed = item.as_ref().err().cloned();
        // (The buffer of a failed batch is dropped; the run is over anyway.)
        if let Some(b) = q.put(seq, item) {
            s.pool.give(b);
        }
        if let Some(e) = failed {
            s.stop_all(StopReason::LoaderFailed(Box::new(e)));
            return;
        }
    }
}

/// How a feed gets its batches.
#[derive(Debug)]
enum Kind {
    /// `--prefetch 0`: collate inside the step, on the worker's thread.
    Sync {
        sampler: DistributedSampler,
        scratch: Box<SampleScratch>,
        spare: Batch,
    },
    /// From the loader threads through this worker's queue.
    Prefetch {
        shared: Arc<Shared>,
        next_seq: usize,
    },
}

/// One worker's end of the input pipeline: hands out the batch of each step, staged.
#[derive(Debug)]
pub struct BatchFeed {
    rank: usize,
    kind: Kind,
    collator: Collator,
    staging: Staging,
    current: Option<Staged>,
}

impl BatchFeed {
    /// The synchronous feed (`--prefetch 0`): every batch is collated inside
    /// [`BatchFeed::next`], on the worker's thread, with the same code the loaders run.
    pub fn synchronous(rank: usize, collator: Collator, sampler: DistributedSampler) -> Self {
        Self {
            rank,
            kind: Kind::Sync {
                sampler,
                scratch: Box::default(),
                spare: Batch::default(),
            },
            collator,
            staging: Staging::new(),
            current: None,
        }
    }

    /// The training set.
    pub fn source(&self) -> &Source {
        &self.collator.source
    }

    /// The normalisation batches get (evaluation uses it too).
    pub fn normalize(&self) -> &Normalize {
        &self.collator.norm
    }

    /// The batch the last [`BatchFeed::next`] handed out (until the next call).
    pub fn current(&self) -> Option<&Staged> {
        self.current.as_ref()
    }

    /// The batch of `step` of `epoch`, whose sample order is `order` (used by the synchronous
    /// feed; the loaders compute the same order themselves). The previous batch's buffer is
    /// recycled first.
    pub fn next(&mut self, epoch: usize, step: usize, order: &[u32]) -> Result<&Staged, LoadError> {
        let previous = self.current.take().map(Staged::into_host);
        let batch = match &mut self.kind {
            Kind::Sync {
                sampler,
                scratch,
                spare,
            } => {
                let mut batch = previous.unwrap_or_else(|| std::mem::take(spare));
                let indices = sampler.shard(order, step, self.rank);
                let global_step = epoch * sampler.steps_per_epoch() + step;
                self.collator
                    .check_fault(global_step, self.rank)
                    .and_then(|_| self.collator.fill(indices, epoch, scratch, &mut batch))
                    .map_err(|e| LoadError::Batch {
                        epoch,
                        step,
                        worker: None,
                        cause: BatchFailure::Read(e),
                    })?;
                batch
            }
            Kind::Prefetch { shared, next_seq } => {
                if let Some(b) = previous {
                    shared.pool.give(b);
                }
                let (want_epoch, want_step) = shared.epoch_step(*next_seq);
                if (want_epoch, want_step) != (epoch, step) {
                    return Err(LoadError::OutOfOrder {
                        rank: self.rank,
                        epoch,
                        step,
                        prepared_epoch: want_epoch,
                        prepared_step: want_step,
                    });
                }
                let b = shared.queues[self.rank].take(*next_seq)?;
                *next_seq += 1;
                b
            }
        };
        Ok(self.current.insert(self.staging.stage(batch)))
    }
}

impl Drop for BatchFeed {
    fn drop(&mut self) {
        if let Kind::Prefetch { shared, next_seq } = &self.kind {
            let q = &shared.queues[self.rank];
            for b in q.close() {
                shared.pool.give(b);
            }
            if *next_seq < shared.batches_per_worker {
                // This worker stopped early (an error): its peers cannot finish the run, so
                // stop now rather than let them wait for batches at a barrier.
                shared.stop_all(StopReason::WorkerLeft {
                    rank: self.rank,
                    at: *next_seq,
                    of: shared.batches_per_worker,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{Augment, LoadStats};

    #[test]
    fn a_loader_thread_that_panics_outside_a_batch_stops_the_pipeline() {
        let pair = crate::data::synthetic::generate(64, 4, (1, 4, 4), 2, 1).unwrap();
        let source = Source::Memory(Arc::new(pair.train));
        let collator = Collator {
            norm: source.normalize(),
            source,
            augment: Augment::parse("off").unwrap(),
            seed: 1,
            skip_bad: false,
            stats: Arc::new(LoadStats::default()),
            fault: None,
        };
        let sampler = DistributedSampler::new(64, 4, 1, 1);
        let steps = sampler.global_steps(0..4);
        let (pipeline, mut feeds) =
            Pipeline::start(collator, sampler.clone(), steps, 1, 1).unwrap();
        // A second loader thread that panics between batches: the batch it would have filled
        // is never put, and without the stop its worker would wait for it for ever.
        let shared = pipeline.shared.clone();
        shared.running.fetch_add(1, Ordering::AcqRel);
        let panicked = std::thread::spawn(move || {
            let _exit = LoaderExit {
                shared: &shared,
                thread: 7,
            };
            panic!("a loader's bug outside a batch");
        })
        .join();
        assert!(panicked.is_err());
        let mut order = Vec::new();
        let mut failure = None;
        'run: for epoch in 0..4 {
            sampler.epoch_order(epoch, &mut order);
            for step in 0..sampler.steps_per_epoch() {
                if let Err(e) = feeds[0].next(epoch, step, &order) {
                    failure = Some(e.to_string());
                    break 'run;
                }
            }
        }
        let failure = failure.expect("the run went on as if no loader had panicked");
        assert!(
            failure.contains("loader thread 7 panicked outside a batch"),
            "{failure}"
        );
        assert_eq!(pipeline.shutdown(), 1);
    }
}
