//! The shared-memory collective: workers of one process are threads, so each reads its peers'
//! gradient buffers in place instead of receiving copies of them (NCCL's intra-node kernels
//! read peers' buffers the same way).
//!
//! A collective over the `W` workers of one process, each holding its own buffer of the same
//! length:
//!
//! ```text
//!  1. publish      every worker puts its buffer's address in its slot        barrier A
//!  2. own slices   worker j owns a part of the buffer (chunk j of W, or, for
//!                  the leader hierarchy, worker 0 owns all of it); it adds that
//!                  part of every worker's buffer in the pairwise tree over
//!                  ranks (`backend::sum_order`), then writes the sum into that
//!                  part of every buffer (or first runs the across-process phase
//!                  on it, in a hierarchy)
//!  3. done         nobody touches another's buffer after this               barrier B
//! ```
//!
//! Nobody but worker j reads or writes part j of any buffer between the two barriers, so the
//! parts never race, and writing the finished sum into the others' buffers needs no third
//! barrier (the all-gather is the owner's push). Per worker that is `(W-1)/W` of the buffer
//! added and all of it written once: no transport copies, no message pool, two
//! synchronisations per bucket and no lock on the way (a barrier is one shared atomic word;
//! a worker that waits long sleeps on a futex, [`crate::comm::futex`]).
//!
//! **Small buffers with more workers than cores** (at most [`STAGED_MAX_TOTAL_BYTES`] over all
//! the workers) take one barrier instead of two: there a barrier is a context switch for every
//! worker without a core, and costs more than copying the bytes:
//!
//! ```text
//!  1. stage        every worker copies its buffer into a staging buffer of its own
//!                  in the group (one of two, by the barrier's generation)        barrier A
//!  2. sum          every worker adds all the staged copies, in the same pairwise
//!                  tree, into its own buffer
//! ```
//!
//! Nobody touches another worker's own buffer, so nobody waits for the others to finish. A
//! staging buffer, and the slot its address is published in, are written again only two
//! barriers later (each has two, by the barrier's parity): by then every worker has arrived
//! at the barrier in between, after it finished reading.
//!
//! **Summation order**: each element's sum is the pairwise tree over ranks of
//! [`crate::comm::redundant`]'s, so the result is bit-identical to the redundant mode (and,
//! with a power-of-two worker count, to one worker with the whole batch), computed once by
//! its owner and copied: every worker ends with the same bits.
//!
//! **Failures**: a worker that never arrives at barrier A (its thread failed and its endpoint
//! was dropped, or it stalled past the transport's timeout) makes the others leave with an
//! error: a waiter that times out *withdraws* its arrival atomically, so barrier A either
//! completes with every worker in it or not at all, and no buffer is touched by anyone unless
//! it completed. Past barrier A every worker reaches barrier B, succeeding or failing (a
//! panic arrives through a guard, after its owner stopped writing), and nobody returns (and
//! frees or reuses its buffer) before barrier B: the wait there is bounded by the others' own
//! bounded work, so it has no timeout of its own. A failure marks the group failed for good;
//! later collectives refuse at once.

use crate::backend::sum_order::pairwise_split;
use crate::comm::{add_into, chunk_range, futex, CommError};
use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// No worker has failed (the value of [`SharedGroup::failed`] until one does).
const NONE_FAILED: u64 = u64::MAX;

/// The low half of the barrier word counts arrivals; the high half is the generation.
const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Elements summed at a time: one block of every rank's part and one partial per tree level
/// stay in L1 while the block is added and written out.
const BLOCK: usize = 2048;

/// With more workers than cores, all-reduces of at most this many bytes *over all the
/// workers* (`W` times the buffer) take one barrier (see the module docs); with a core per
/// worker, none do. Measured on this project's 2-core machine, each way at 4 KB-128 KB
/// (docs/bench/in-memory-allreduce.md, "One barrier or two"): with 2 workers two barriers were
/// faster at every size but in one outlier run (a barrier costs about 1 us there, less than
/// the staging copy); with 4 workers one barrier was faster up to 16 KB (22-27 vs 29-45 us)
/// and slower from 32 KB; with 8 up to 8 KB (88-106 vs 99-120 us) and slower from 16 KB.
/// Every worker reads all `W` staged copies, so the crossing falls with `W·n`, at 64 KB both
/// times.
pub const STAGED_MAX_TOTAL_BYTES: usize = 64 << 10;

/// Most workers a group holds: [`crate::comm::transport::MAX_IN_PROCESS_WORKERS`].
const MAX_WORKERS: usize = 256;

/// Which of a slot's two places a collective whose barrier A has `generation` uses.
fn parity(generation: u64) -> usize {
    (generation & 1) as usize
}

/// The largest buffer `world` workers on `cores` cores sum with one barrier.
pub fn staged_max_bytes(world: usize, cores: usize) -> usize {
    if world > cores {
        STAGED_MAX_TOTAL_BYTES / world
    } else {
        0
    }
}

/// What the workers of one process share: one slot per worker for its buffer's address, the
/// barrier, and whether one has failed. One per in-process fabric, behind an `Arc` in every
/// endpoint.
pub struct SharedGroup {
    slots: Vec<Slot>,
    /// Arrivals (low 32 bits) and generation (high 32 bits) of the current barrier.
    barrier: AtomicU64,
    /// The first worker that failed, withdrew or went away (low 32 bits) and the barrier
    /// generation current when it did (high 32 bits), or [`NONE_FAILED`].
    failed: AtomicU64,
    /// The largest buffer summed with one barrier ([`STAGED_MAX_TOTAL_BYTES`]); the same for
    /// every worker of the group, so all take the same path.
    staged_max_bytes: usize,
    /// The generation of the current barrier (as in `barrier`), the word waiters sleep on:
    /// it changes when the barrier opens.
    epoch: AtomicU32,
    /// Workers sleeping on `epoch`; the last arrival only wakes them when there are some.
    sleepers: AtomicUsize,
    /// How long a waiter yields before it sleeps: a few microseconds while every worker has a
    /// core (the others arrive that soon when they are in the collective), almost none when
    /// workers outnumber the cores (a yielding waiter takes a core from a worker that has not
    /// arrived). Bounded in time, not in tries: in training a worker's communication thread
    /// waits at barrier A while the other worker is still in backward, and a thread that
    /// yields for that long takes turns on the core backward runs on (a count of 2,000 yields
    /// cost resnet20's 2-worker step 10% this way).
    yield_for: Duration,
}

/// One worker's published buffer.
struct Slot {
    /// Its address and length, in two places by the parity of the barrier A it is published
    /// for: after a one-barrier collective a worker publishes its next buffer while others
    /// may still read the last one's.
    ptr: [AtomicPtr<f32>; 2],
    len: [AtomicUsize; 2],
    /// The barrier generation this worker last arrived at barrier A in, plus one (0: never):
    /// who has not arrived, for a timeout's message.
    arrived: AtomicU64,
    /// The two staging buffers of the one-barrier collective, by the generation's parity.
    staging: [OwnerOnly; 2],
    /// The partial sums of this worker's pairwise tree.
    scratch: OwnerOnly,
}

/// A buffer in the group that only its worker writes or resizes, and only while nobody reads
/// it: a staging buffer before its worker arrives at barrier A (the others read it through the
/// published address between that barrier and their next arrival), the scratch during its
/// worker's own collective (nobody else reads it).
struct OwnerOnly(UnsafeCell<Vec<f32>>);

// SAFETY: written only by its worker, at times (above) no other thread reads it; the
// barrier's SeqCst arrival and opening order the writes before every read.
unsafe impl Sync for OwnerOnly {}

impl OwnerOnly {
    fn new() -> Self {
        Self(UnsafeCell::new(Vec::new()))
    }

    /// The buffer, at least `len` long (grown once to the most ever asked for).
    ///
    /// # Safety
    /// Only the owning worker calls this, while no other thread reads the buffer.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, len: usize) -> &mut [f32] {
        let v = &mut *self.0.get();
        if v.len() < len {
            v.resize(len, 0.0);
        }
        &mut v[..len]
    }
}

impl SharedGroup {
    /// A group of `world` workers (at most 256).
    pub fn new(world: usize) -> Self {
        assert!(
            world <= MAX_WORKERS,
            "a shared-memory group of {world} workers"
        );
        Self {
            slots: (0..world)
                .map(|_| Slot {
                    ptr: [(); 2].map(|_| AtomicPtr::new(std::ptr::null_mut())),
                    len: [(); 2].map(|_| AtomicUsize::new(0)),
                    arrived: AtomicU64::new(0),
                    staging: [OwnerOnly::new(), OwnerOnly::new()],
                    scratch: OwnerOnly::new(),
                })
                .collect(),
            barrier: AtomicU64::new(0),
            failed: AtomicU64::new(NONE_FAILED),
            epoch: AtomicU32::new(0),
            sleepers: AtomicUsize::new(0),
            staged_max_bytes: staged_max_bytes(world, crate::limits::cores()),
            yield_for: if world <= crate::limits::cores() {
                Duration::from_micros(20)
            } else {
                Duration::from_micros(2)
            },
        }
    }

    /// Workers in the group.
    pub fn world(&self) -> usize {
        self.slots.len()
    }

    /// Marks worker `rank` failed or gone (its endpoint dropped): every collective waiting at
    /// barrier A, and every later one, ends with [`CommError::PeerGone`] naming it.
    pub fn mark_gone(&self, rank: usize) {
        let generation = self.barrier.load(SeqCst) >> COUNT_BITS;
        let failure = (generation << COUNT_BITS) | rank as u64;
        let _ = self
            .failed
            .compare_exchange(NONE_FAILED, failure, SeqCst, SeqCst);
        self.wake_all();
    }

    fn failed_rank(&self) -> Option<usize> {
        self.failure().map(|(rank, _)| rank)
    }

    /// The first failure: its worker and the barrier generation current then.
    fn failure(&self) -> Option<(usize, u64)> {
        let f = self.failed.load(SeqCst);
        (f != NONE_FAILED).then_some(((f & COUNT_MASK) as usize, f >> COUNT_BITS))
    }

    fn wake_all(&self) {
        futex::wake_all(&self.epoch);
    }

    /// The generation of the barrier now being filled (it cannot open before this worker
    /// arrives).
    fn generation(&self) -> u64 {
        self.barrier.load(SeqCst) >> COUNT_BITS
    }

    /// Counts this worker in the current barrier; returns its generation. The last arrival
    /// opens it.
    fn arrive(&self) -> u64 {
        let before = self.barrier.fetch_add(1, SeqCst);
        let generation = before >> COUNT_BITS;
        if (before & COUNT_MASK) + 1 == self.world() as u64 {
            // Everyone is in: nobody can arrive for the next barrier before seeing this.
            let next = (generation + 1) & COUNT_MASK;
            self.barrier.store(next << COUNT_BITS, SeqCst);
            // After `barrier`, so a waiter that sees the new epoch sees it open; before
            // `sleepers` is read, so a waiter counted after that read sees the new epoch.
            self.epoch.store(next as u32, SeqCst);
            if self.sleepers.load(SeqCst) > 0 {
                self.wake_all();
            }
        }
        generation
    }

    fn opened(&self, generation: u64) -> bool {
        self.barrier.load(SeqCst) >> COUNT_BITS != generation
    }

    /// Takes this worker's arrival in `generation` back, if the barrier has not opened yet:
    /// then it cannot open without this worker, and nobody will touch its buffer.
    fn withdraw(&self, generation: u64) -> bool {
        let mut current = self.barrier.load(SeqCst);
        loop {
            if current >> COUNT_BITS != generation {
                return false;
            }
            match self
                .barrier
                .compare_exchange(current, current - 1, SeqCst, SeqCst)
            {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// Waits until barrier `generation` opens, or (with `give_up`) until `give_up` says to
    /// stop; spins briefly, then yields, then sleeps. Returns whether it opened.
    fn wait(&self, generation: u64, give_up: Option<&dyn Fn() -> bool>) -> bool {
        for _ in 0..64 {
            if self.opened(generation) {
                return true;
            }
            std::hint::spin_loop();
        }
        let yielding = Instant::now();
        while yielding.elapsed() < self.yield_for {
            if self.opened(generation) {
                return true;
            }
            std::thread::yield_now();
        }
        loop {
            if self.opened(generation) {
                return true;
            }
            if give_up.is_some_and(|stop| stop()) {
                return false;
            }
            self.sleepers.fetch_add(1, SeqCst);
            // Counted before the epoch is read (the last arrival does the opposite), and the
            // futex sleeps only while the epoch is still this one: no wake-up lost. The
            // timeout only bounds how late `give_up` is asked again.
            futex::wait(&self.epoch, generation as u32, Duration::from_millis(10));
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }
}

/// One worker's handle on its process's [`SharedGroup`] (what [`crate::comm::Transport::shared_memory`]
/// returns): its rank in the group and how long it waits for the others to arrive.
#[derive(Clone, Copy)]
pub struct SharedMemory<'a> {
    /// The group.
    pub group: &'a SharedGroup,
    /// This worker's rank in it.
    pub rank: usize,
    /// How long barrier A waits for every worker (the transport's timeout).
    pub timeout: Duration,
    /// The rank of the group's worker 0 in the transport's own numbering (errors name ranks
    /// as the run does).
    pub first_rank: usize,
}

/// Which part of the buffer each worker owns between the barriers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Worker j owns chunk j of `W` (`partition::chunk_range`).
    Chunks,
    /// Worker 0 owns the whole buffer (the leader hierarchy).
    Leader,
}

impl Ownership {
    fn range(self, len: usize, world: usize, rank: usize) -> Range<usize> {
        match self {
            Ownership::Chunks => chunk_range(len, world, rank),
            Ownership::Leader if rank == 0 => 0..len,
            Ownership::Leader => 0..0,
        }
    }
}

impl SharedMemory<'_> {
    /// Workers in the group.
    pub fn world(&self) -> usize {
        self.group.world()
    }

    /// Sums `buf` over the group's workers (see the module docs); every worker ends with the
    /// same bits, those of the redundant mode.
    pub fn all_reduce_sum(&self, buf: &mut [f32], tag: u64) -> Result<(), CommError> {
        if std::mem::size_of_val(buf) <= self.group.staged_max_bytes {
            self.staged_sum(buf, tag)
        } else {
            self.two_barrier_sum(buf, tag)
        }
    }

    /// The two-barrier all-reduce (module docs), whatever the buffer's size.
    pub fn two_barrier_sum(&self, buf: &mut [f32], tag: u64) -> Result<(), CommError> {
        self.collective(buf, tag, Ownership::Chunks, |part| {
            part.sum_to_all();
            Ok(())
        })
    }

    /// The one-barrier all-reduce (module docs), whatever the buffer's size: the same bits
    /// as [`Self::two_barrier_sum`]. Every worker of a collective must take the same one.
    pub fn staged_sum(&self, buf: &mut [f32], tag: u64) -> Result<(), CommError> {
        let group = self.group;
        let generation = group.generation();
        let slot = &group.slots[self.rank];
        // SAFETY: this worker's staging buffer of this parity was last read at barrier
        // `generation - 2`, and every reader has since arrived at `generation - 1`.
        let staged = unsafe { slot.staging[parity(generation)].get(buf.len()) };
        staged.copy_from_slice(buf);
        let opened = self.enter(staged.as_mut_ptr(), buf.len(), tag)?;
        debug_assert_eq!(opened, generation);
        let mut every = OwnPart {
            group,
            rank: self.rank,
            range: 0..buf.len(),
            parity: parity(generation),
        };
        every.sum_blocks(|at, sum| buf[at..at + sum.len()].copy_from_slice(sum));
        Ok(())
    }

    /// Runs one collective on `buf`: publish, barrier A, `work` on this worker's part (per
    /// `ownership`), barrier B. `work` may only touch the buffers through its [`OwnPart`].
    pub fn collective(
        &self,
        buf: &mut [f32],
        tag: u64,
        ownership: Ownership,
        work: impl FnOnce(&mut OwnPart<'_>) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let group = self.group;
        let len = buf.len();
        let generation = self.enter(buf.as_mut_ptr(), len, tag)?;
        let mut arrival = ArriveAtB {
            group,
            rank: self.rank,
            generation: None,
        };
        let mut part = OwnPart {
            group,
            rank: self.rank,
            range: ownership.range(len, self.world(), self.rank),
            parity: parity(generation),
        };
        let result = work(&mut part);
        if result.is_err() {
            group.mark_gone(self.rank);
        }
        let barrier_b = arrival.arrive_and_wait();
        result?;
        match group.failure() {
            // Another worker failed between the barriers (before B opened, so in
            // the generation of B): its part was not written. One that went away
            // after B opened (its run ended) is not this collective's failure.
            Some((peer, when)) if when == barrier_b => Err(self.gone(peer, tag)),
            _ => Ok(()),
        }
    }

    /// The error for worker `peer` of the group having failed or gone.
    fn gone(&self, peer: usize, tag: u64) -> CommError {
        CommError::PeerGone {
            rank: self.rank + self.first_rank,
            peer: self.first_rank + peer,
            tag,
        }
    }

    /// Publishes `len` elements at `ptr` as this worker's buffer and passes barrier A with
    /// every worker, each with the same length; returns the barrier's generation. On an error
    /// nobody has touched a published buffer, and the group is failed for good.
    fn enter(&self, ptr: *mut f32, len: usize, tag: u64) -> Result<u64, CommError> {
        let group = self.group;
        let (me, first) = (self.rank + self.first_rank, self.first_rank);
        if let Some(peer) = group.failed_rank() {
            return Err(self.gone(peer, tag));
        }
        let slot = &group.slots[self.rank];
        let at = parity(group.generation());
        slot.ptr[at].store(ptr, SeqCst);
        slot.len[at].store(len, SeqCst);
        let started = Instant::now();
        let generation = group.arrive();
        slot.arrived.store(generation + 1, SeqCst);
        let give_up = || group.failed_rank().is_some() || started.elapsed() >= self.timeout;
        if !group.wait(generation, Some(&give_up)) && group.withdraw(generation) {
            let cause = match group.failed_rank() {
                Some(peer) => self.gone(peer, tag),
                None => CommError::Timeout {
                    rank: me,
                    from: first + self.first_absent(generation),
                    tag,
                    waited: started.elapsed(),
                },
            };
            group.mark_gone(self.rank);
            return Err(cause);
        }
        // Every worker is in (a withdrawal that lost the race found the barrier open).
        let len_of = |r: usize| group.slots[r].len[at].load(SeqCst);
        if let Some(other) = (0..self.world()).find(|&r| len_of(r) != len) {
            // Every worker sees the same lengths, so all leave here (none waits at a later
            // barrier alone); nobody has touched a buffer.
            group.mark_gone(self.rank);
            return Err(CommError::SizeMismatch {
                rank: me,
                from: first + other,
                tag,
                expected: len,
                got: len_of(other),
            });
        }
        Ok(generation)
    }

    /// The first worker that has not arrived at barrier A of `generation`, for a timeout's
    /// message.
    fn first_absent(&self, generation: u64) -> usize {
        let arrived = |r: usize| self.group.slots[r].arrived.load(SeqCst) == generation + 1;
        (0..self.world())
            .find(|&r| r != self.rank && !arrived(r))
            .unwrap_or(self.rank)
    }
}

/// Barrier B on every way out of the part between the barriers, a panic's included: the
/// worker's buffer must outlive the others' use of it.
struct ArriveAtB<'a> {
    group: &'a SharedGroup,
    rank: usize,
    /// Barrier B's generation, once arrived.
    generation: Option<u64>,
}

impl ArriveAtB<'_> {
    /// Arrives at barrier B and waits for it to open; returns its generation.
    fn arrive_and_wait(&mut self) -> u64 {
        let generation = self.group.arrive();
        self.generation = Some(generation);
        self.group.wait(generation, None);
        generation
    }
}

impl Drop for ArriveAtB<'_> {
    fn drop(&mut self) {
        if self.generation.is_none() {
            self.group.mark_gone(self.rank);
            self.arrive_and_wait();
        }
    }
}

/// The part of every worker's buffer this worker owns between the barriers, and the only way
/// to touch the buffers there.
pub struct OwnPart<'a> {
    group: &'a SharedGroup,
    rank: usize,
    range: Range<usize>,
    /// Where the collective's buffers are published (`Slot::ptr`).
    parity: usize,
}

impl OwnPart<'_> {
    /// The owned range (elements of the buffer).
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// This worker's own buffer over the owned range.
    pub fn own_mut(&mut self) -> &mut [f32] {
        // SAFETY: the slot holds this worker's buffer, borrowed mutably by `collective` for
        // its whole duration and used only through the published pointer meanwhile; between
        // the barriers only this worker touches `range` of any buffer (the ranges of
        // `Ownership` are disjoint), and `&mut self` keeps this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(self.rank), self.range.len()) }
    }

    /// Adds the owned range of every worker's buffer (the pairwise tree over ranks) and
    /// writes the sum into the owned range of every buffer.
    pub fn sum_to_all(&mut self) {
        self.sum(true);
    }

    /// Adds the owned range of every worker's buffer into this worker's own buffer only.
    pub fn sum_into_own(&mut self) {
        self.sum(false);
    }

    /// Copies the owned range of this worker's buffer into every other worker's.
    pub fn copy_to_all(&mut self) {
        let n = self.range.len();
        for r in (0..self.group.world()).filter(|&r| r != self.rank) {
            // SAFETY: as in `own_mut`; source and destination are different workers' buffers.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr(self.rank), self.ptr(r), n) };
        }
    }

    /// Worker `r`'s buffer at the start of the owned range.
    fn ptr(&self, r: usize) -> *mut f32 {
        // In bounds: every buffer has the published length, which the range lies within.
        self.group.slots[r].ptr[self.parity]
            .load(SeqCst)
            .wrapping_add(self.range.start)
    }

    fn sum(&mut self, to_all: bool) {
        let world = self.group.world();
        let (rank, ptrs) = (self.rank, self.ptrs());
        self.sum_blocks(|at, sum| {
            for (r, ptr) in ptrs.iter().enumerate().take(world) {
                if to_all || r == rank {
                    // SAFETY: as in `own_mut`; `sum` is this worker's scratch.
                    unsafe { std::ptr::copy_nonoverlapping(sum.as_ptr(), ptr.add(at), sum.len()) };
                }
            }
        });
    }

    /// Every worker's buffer at the start of the owned range (the first `world`).
    fn ptrs(&self) -> [*mut f32; MAX_WORKERS] {
        let mut ptrs = [std::ptr::null_mut(); MAX_WORKERS];
        for (r, p) in ptrs.iter_mut().enumerate().take(self.group.world()) {
            *p = self.ptr(r);
        }
        ptrs
    }

    /// Sums the owned range of every worker's buffer a block at a time and hands each block's
    /// sum to `each` with its offset in the range.
    fn sum_blocks(&mut self, mut each: impl FnMut(usize, &[f32])) {
        let (world, n) = (self.group.world(), self.range.len());
        // One block of output and one per level of the tree below the root.
        let depth = world.next_power_of_two().trailing_zeros() as usize;
        let block = BLOCK.min(n);
        // SAFETY: this worker's scratch, used by nobody else.
        let scratch = unsafe {
            self.group.slots[self.rank]
                .scratch
                .get(block * depth.max(1))
        };
        let (out, levels) = scratch.split_at_mut(block);
        let mut at = 0;
        while at < n {
            let len = block.min(n - at);
            self.tree(0, world, at, &mut out[..len], levels, block);
            each(at, &out[..len]);
            at += len;
        }
    }

    /// Writes the sum of ranks `lo..hi` at `at..at + out.len()` of the owned range into `out`
    /// (`redundant::sum_in_rank_order`'s tree); `levels` holds a partial of `block` elements
    /// per level below.
    fn tree(
        &self,
        lo: usize,
        hi: usize,
        at: usize,
        out: &mut [f32],
        levels: &mut [f32],
        block: usize,
    ) {
        let n = out.len();
        let part = |r: usize| {
            // SAFETY: as in `own_mut`: read-only, within the owned range.
            unsafe { std::slice::from_raw_parts(self.ptr(r).add(at), n) }
        };
        match hi - lo {
            1 => out.copy_from_slice(part(lo)),
            2 => {
                for ((o, a), b) in out.iter_mut().zip(part(lo)).zip(part(lo + 1)) {
                    *o = *a + *b;
                }
            }
            _ => {
                let mid = pairwise_split(lo, hi);
                let (right, deeper) = levels.split_at_mut(block);
                let right = &mut right[..out.len()];
                self.tree(lo, mid, at, out, deeper, block);
                self.tree(mid, hi, at, right, deeper, block);
                add_into(out, right);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_barrier_only_for_small_buffers_and_more_workers_than_cores() {
        // A core per worker: a barrier costs about a microsecond, less than staging.
        assert_eq!(staged_max_bytes(2, 2), 0);
        assert_eq!(staged_max_bytes(8, 8), 0);
        // More workers than cores: the crossing measured falls with the workers.
        assert_eq!(staged_max_bytes(4, 2), 16 << 10);
        assert_eq!(staged_max_bytes(8, 2), 8 << 10);
        assert_eq!(staged_max_bytes(3, 1), STAGED_MAX_TOTAL_BYTES / 3);
    }
}
