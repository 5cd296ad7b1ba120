//! What an all-reduce costs between threads of one process, where no link is emulated: memory
//! work, not a network (the alpha-beta model of [`crate::comm::cost_model`] is for links).
//!
//! Every byte a collective moves between threads is read and written by a core: the fabric
//! copies a message into a pool buffer on the sender and out of it on the receiver, and an
//! addition reads two operands and writes one. So each way of summing is priced by the bytes
//! it copies and adds per worker, at this machine's measured copy and add rates, plus its
//! synchronisations (a message hand-off, a barrier), with `n` the buffer's bytes and `W` the
//! workers:
//!
//! * **shm** ([`crate::comm::shared_memory`]): each worker reads its `1/W` part of every
//!   buffer (`n` bytes), adds in cache, and writes the sum back over what it read (`n`
//!   bytes): one in-place pass over `n` (no second buffer's lines to fetch, unlike a copy),
//!   and two barriers. (Small buffers with more workers than cores take a one-barrier path
//!   instead, only where it measured faster: [`crate::comm::shared_memory::STAGED_MAX_TOTAL_BYTES`].
//!   It is priced as the two-barrier path, which bounds it: its `W` reads of every byte
//!   are in cache, at a rate this model does not measure.)
//! * **the message modes**: each byte sent is copied twice (into and out of a message), so
//!   `2 x` [`crate::comm::CostTerms::serialized_bytes`] copied, plus the additions (ring and
//!   halving-doubling `(W-1)/W·n`, plus `n` for halving-doubling's fold when `W` is not a
//!   power of two; the tree `⌈log2 W⌉·n` along its critical path; redundant `(W-1)·n`, and a
//!   copy of its own `n`), and one hand-off per latency term.
//!
//! The workers' communication threads run at once; with more workers than cores they share
//! them, so memory work takes `max(1, W / cores)` times as long. The rates are measured, not
//! fitted to any all-reduce's time ([`MemoryRates::MEASURED`] says where each comes from);
//! `dptrain bench allreduce` prints the prediction beside every measurement.

use crate::comm::cost_model::cost_terms;
use crate::comm::CommMode;
use std::time::Duration;

/// What memory work and synchronisation cost on this machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryRates {
    /// One core copying a buffer of this many bytes per second.
    pub copy_bytes_per_s: f64,
    /// One core adding a buffer of this many bytes per second into another (`dst += src`).
    pub add_bytes_per_s: f64,
    /// One core reading and writing back a buffer of this many bytes per second, in place.
    pub in_place_bytes_per_s: f64,
    /// One message between two threads of the in-process fabric, sent to received, empty.
    pub message: Duration,
    /// One barrier of the shared-memory collective.
    pub barrier: Duration,
}

impl MemoryRates {
    /// Measured on this project's 2-core machine (AVX-512, 2026-12-02; several runs of
    /// `dptrain bench allreduce --workers 2 --sizes 4,64M --comm shm,ring,redundant`, medians
    /// rounded). The rates are the bench's own measurement beside the all-reduces, 64 MB
    /// buffers, one core of the two while the other does the same (as both workers' threads
    /// do): copy 6.1-6.9 GB/s, add 7.7-12 GB/s, in place 12.9-18.7 GB/s. The message is the
    /// redundant mode's 4-byte all-reduce of 2 workers (one message each way, 0.6 us; the
    /// ring's two took 1.0-1.4 us), the barrier half the shared-memory one (two barriers,
    /// 0.6-1.4 us). None is taken from the all-reduce times the model is then checked against
    /// at other sizes (`tests/comm.rs`, docs/bench/in-memory-allreduce.md).
    pub const MEASURED: MemoryRates = MemoryRates {
        copy_bytes_per_s: 6.5e9,
        add_bytes_per_s: 8.0e9,
        in_place_bytes_per_s: 13.5e9,
        message: Duration::from_nanos(600),
        barrier: Duration::from_nanos(400),
    };
}

/// How the workers of one process sum a bucket, as this model prices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InMemory {
    /// Reading the peers' buffers in place.
    SharedMemory,
    /// A message mode through the in-process fabric.
    Messages(CommMode),
}

impl InMemory {
    /// Every way, in the order used to break ties (shared memory first: the fewest bytes).
    pub const ALL: [InMemory; 5] = [
        InMemory::SharedMemory,
        InMemory::Messages(CommMode::Tree),
        InMemory::Messages(CommMode::Ring),
        InMemory::Messages(CommMode::HalvingDoubling),
        InMemory::Messages(CommMode::Redundant),
    ];
}

impl std::fmt::Display for InMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SharedMemory => f.write_str("shm"),
            Self::Messages(m) => write!(f, "{m}"),
        }
    }
}

/// Predicted time of one all-reduce of `bytes` over `workers` threads on `cores` cores.
pub fn in_memory_time(
    way: InMemory,
    workers: usize,
    bytes: usize,
    cores: usize,
    rates: &MemoryRates,
) -> Duration {
    if workers <= 1 || bytes == 0 {
        return Duration::ZERO;
    }
    let (n, w) = (bytes as f64, workers as f64);
    let (syncs, work) = match way {
        InMemory::SharedMemory => (
            2.0 * rates.barrier.as_secs_f64(),
            n / rates.in_place_bytes_per_s,
        ),
        InMemory::Messages(mode) => {
            let terms = cost_terms(mode, workers, bytes);
            let power_of_two = workers.is_power_of_two();
            let (own_copy, added) = match mode {
                CommMode::Ring => (0.0, (w - 1.0) / w * n),
                CommMode::HalvingDoubling if power_of_two => (0.0, (w - 1.0) / w * n),
                CommMode::HalvingDoubling => (0.0, (w - 1.0) / w * n + n),
                CommMode::Tree => (0.0, workers.next_power_of_two().trailing_zeros() as f64 * n),
                CommMode::Redundant => (n, (w - 1.0) * n),
            };
            let copied = 2.0 * terms.serialized_bytes + own_copy;
            (
                terms.latency_terms * rates.message.as_secs_f64(),
                copied / rates.copy_bytes_per_s + added / rates.add_bytes_per_s,
            )
        }
    };
    let shared_cores = (w / cores.max(1) as f64).max(1.0);
    Duration::from_secs_f64(syncs + shared_cores * work)
}

/// The cheapest way for `workers` threads on `cores` cores to sum `bytes` (ties: the first of
/// [`InMemory::ALL`]).
pub fn choose_in_memory(
    workers: usize,
    bytes: usize,
    cores: usize,
    rates: &MemoryRates,
) -> InMemory {
    let time = |way| in_memory_time(way, workers, bytes, cores, rates);
    let mut best = InMemory::ALL[0];
    for way in &InMemory::ALL[1..] {
        if time(*way) < time(best) {
            best = *way;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes from 4 KB to 256 MB, doubling.
    fn sizes() -> impl Iterator<Item = usize> {
        (12..=28).map(|p| 1usize << p)
    }

    #[test]
    fn shared_memory_copies_less_than_every_message_mode_at_every_size() {
        let rates = MemoryRates::MEASURED;
        for workers in 2..=8 {
            for bytes in sizes() {
                let shm = in_memory_time(InMemory::SharedMemory, workers, bytes, 2, &rates);
                for mode in CommMode::ALL {
                    let m = in_memory_time(InMemory::Messages(mode), workers, bytes, 2, &rates);
                    assert!(
                        shm < m,
                        "{workers} workers, {bytes} B: shm {shm:?} vs {mode} {m:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn auto_in_memory_is_shared_memory_or_redundant_so_its_bits_never_depend_on_the_machine() {
        // Both sum in the same pairwise tree over ranks: whichever the rates and the cores
        // pick, a run's result is the same.
        for cores in [1, 2, 4, 16, 64] {
            for workers in 2..=8 {
                for bytes in sizes().chain([4, 1000]) {
                    let way = choose_in_memory(workers, bytes, cores, &MemoryRates::MEASURED);
                    assert!(
                        matches!(
                            way,
                            InMemory::SharedMemory | InMemory::Messages(CommMode::Redundant)
                        ),
                        "{workers} workers on {cores} cores, {bytes} B: {way}"
                    );
                }
            }
        }
    }

    #[test]
    fn more_workers_than_cores_share_the_memory_work() {
        let rates = MemoryRates::MEASURED;
        let t = |cores| in_memory_time(InMemory::SharedMemory, 8, 1 << 26, cores, &rates);
        let ratio = t(2).as_secs_f64() / t(8).as_secs_f64();
        assert!((ratio - 4.0).abs() < 0.01, "{ratio}");
    }
}
