//! Alpha-beta cost model for the communication modes.
//!
//! A message of `m` bytes costs `α + m·β`, with `α` = [`LinkModel::latency`]
//! and `β = 1 / bandwidth`. As in [`crate::comm::InProcessFabric`]'s emulation, every rank
//! has one full-duplex port: `m·β` is time the sender's transmit side and the
//! receiver's receive side are busy, while `α` is propagation delay that does
//! not occupy the port. A mode's time is therefore
//! `latency_terms·α + serialized_bytes·β`, where `latency_terms` counts the
//! `α`s on the critical path and `serialized_bytes` the bytes pushed through
//! the busiest port along it. With `n` = buffer bytes and `N` = world:
//!
//! * **Ring**: `2(N-1)` dependent rounds of `n/N` bytes →
//!   `2(N-1)α + 2(N-1)/N·nβ`.
//! * **Halving-doubling**, `N` a power of two: `2·log2 N` dependent rounds
//!   moving `n/2, n/4, …` each way → `2·log2(N)α + 2(N-1)/N·nβ`. Otherwise,
//!   with `p2` = largest power of two `≤ N`, the fold-in and hand-back steps
//!   add a full-buffer message each: `2(log2 p2 + 1)α + (2(p2-1)/p2 + 2)·nβ`.
//! * **Tree**: reduce and broadcast are `⌈log2 N⌉` dependent rounds of full
//!   buffers each → `2⌈log2 N⌉(α + nβ)`.
//! * **Redundant**: each rank pushes `N-1` full copies through its single
//!   transmit port, and concurrently (full duplex) pulls `N-1` copies through
//!   its receive port, so the port time is `(N-1)·nβ`. The textbook bound
//!   `(N-1)(α + nβ)` also charges `α` per copy, which is right when `α` is a
//!   per-message CPU/NIC overhead that blocks the port. Here `α` is pure
//!   propagation and the `N-1` sends are independent (nothing waits for a
//!   reply), so the latencies overlap and only the last message's `α` is
//!   exposed: `α + (N-1)·nβ`. That is what the emulator measures (see the
//!   `emulated_latency_matches_model` test); using the textbook form would
//!   overstate redundant mode's cost exactly in the small-message regime where
//!   it is the best choice.
//!
//! Local additions are ignored (memory-bound and far cheaper than the network
//! for the link speeds this is meant for). A simulator can reuse the same
//! per-mode counts through [`cost_terms`].

use std::time::Duration;

use crate::comm::halving_doubling::prev_power_of_two;
use crate::comm::transport::secs_to_duration;
use crate::comm::{CommMode, LinkModel};

/// The model's per-mode counts for one all-reduce of `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostTerms {
    /// Number of `α` (latency) terms on the critical path.
    pub latency_terms: f64,
    /// Bytes serialized through the busiest port along the critical path
    /// (multiplied by `β` in the time estimate).
    pub serialized_bytes: f64,
    /// Messages sent by the busiest rank.
    pub messages_per_rank: usize,
    /// Bytes sent by the busiest rank.
    pub bytes_sent_per_rank: f64,
}

/// `⌈log2 n⌉` for n >= 1.
fn ceil_log2(n: usize) -> usize {
    n.next_power_of_two().trailing_zeros() as usize
}

/// Per-mode counts of the alpha-beta model (formulas in the module docs).
pub fn cost_terms(mode: CommMode, world: usize, bytes: usize) -> CostTerms {
    let zero = CostTerms {
        latency_terms: 0.0,
        serialized_bytes: 0.0,
        messages_per_rank: 0,
        bytes_sent_per_rank: 0.0,
    };
    // The implementations send nothing in these cases.
    if world <= 1 || bytes == 0 {
        return zero;
    }
    let n = bytes as f64;
    let nw = world as f64;
    match mode {
        CommMode::Ring => {
            let rounds = 2 * (world - 1);
            let moved = 2.0 * (nw - 1.0) / nw * n;
            CostTerms {
                latency_terms: rounds as f64,
                serialized_bytes: moved,
                messages_per_rank: rounds,
                bytes_sent_per_rank: moved,
            }
        }
        CommMode::HalvingDoubling => {
            let p2 = prev_power_of_two(world);
            let log = p2.trailing_zeros() as usize;
            let core = 2.0 * (p2 as f64 - 1.0) / p2 as f64 * n;
            if p2 == world {
                CostTerms {
                    latency_terms: (2 * log) as f64,
                    serialized_bytes: core,
                    messages_per_rank: 2 * log,
                    bytes_sent_per_rank: core,
                }
            } else {
                // Even ranks of the folded pairs: receive the partner's
                // buffer, run the core, then send it the result.
                CostTerms {
                    latency_terms: (2 * log + 2) as f64,
                    serialized_bytes: core + 2.0 * n,
                    messages_per_rank: 2 * log + 1,
                    bytes_sent_per_rank: core + n,
                }
            }
        }
        CommMode::Tree => {
            let rounds = 2 * ceil_log2(world);
            // The root sends ⌈log2 N⌉ broadcast messages; any other rank sends
            // one reduce message plus at most ⌈log2 N⌉-1 broadcast messages.
            let sent = ceil_log2(world);
            CostTerms {
                latency_terms: rounds as f64,
                serialized_bytes: rounds as f64 * n,
                messages_per_rank: sent,
                bytes_sent_per_rank: sent as f64 * n,
            }
        }
        CommMode::Redundant => {
            let copies = world - 1;
            CostTerms {
                latency_terms: 1.0,
                serialized_bytes: copies as f64 * n,
                messages_per_rank: copies,
                bytes_sent_per_rank: copies as f64 * n,
            }
        }
    }
}

/// Predicted wall time of one all-reduce of `bytes` bytes over `world` ranks.
pub fn predicted_time(mode: CommMode, world: usize, bytes: usize, link: &LinkModel) -> Duration {
    let c = cost_terms(mode, world, bytes);
    secs_to_duration(
        c.latency_terms * link.latency.as_secs_f64()
            + c.serialized_bytes / link.bandwidth_bytes_per_s,
    )
}

/// The mode with the smallest [`predicted_time`] (ties go to the earlier
/// entry of [`CommMode::ALL`]).
pub fn choose_mode(world: usize, bytes: usize, link: &LinkModel) -> CommMode {
    let mut best = CommMode::ALL[0];
    let mut best_t = predicted_time(best, world, bytes, link);
    for mode in &CommMode::ALL[1..] {
        let t = predicted_time(*mode, world, bytes, link);
        if t < best_t {
            best = *mode;
            best_t = t;
        }
    }
    best
}

/// The bytes `link` moves in one latency (`bandwidth x latency`): a message smaller than this
/// spends more time waiting on latency than transferring. `--comm auto` uses it as the bucket
/// cap when none is given (see `plan::bucket_caps`).
pub fn min_bucket_bytes(link: &LinkModel) -> usize {
    let bytes = link.bandwidth_bytes_per_s * link.latency.as_secs_f64();
    if bytes.is_finite() && bytes > 0.0 {
        bytes.min(usize::MAX as f64 / 2.0) as usize
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bw: &str, lat: &str) -> LinkModel {
        LinkModel {
            bandwidth_bytes_per_s: crate::comm::parse_bandwidth(bw).unwrap(),
            latency: crate::comm::parse_duration(lat).unwrap(),
        }
    }

    #[test]
    fn choice_is_the_argmin() {
        let links = [
            link("10Gbit", "5us"),
            link("1Gbit", "1ms"),
            link("100GB/s", "0"),
        ];
        for l in &links {
            for world in 1..=33 {
                for bytes in [0usize, 4, 4096, 1 << 20, 100 << 20] {
                    let chosen = choose_mode(world, bytes, l);
                    let t = predicted_time(chosen, world, bytes, l);
                    for m in CommMode::ALL {
                        assert!(
                            t <= predicted_time(m, world, bytes, l),
                            "{world} {bytes} {m}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn regimes() {
        // Tiny message, big latency: a single round wins.
        let slow = link("10Gbit", "1ms");
        assert_eq!(choose_mode(8, 4, &slow), CommMode::Redundant);
        assert_ne!(choose_mode(8, 4, &slow), CommMode::Ring);
        // Big message, many ranks: bandwidth-optimal modes win.
        let fast = link("10Gbit", "5us");
        assert_eq!(choose_mode(8, 100 << 20, &fast), CommMode::HalvingDoubling);
        // Non-power-of-two pays hd's fold-in, so ring wins.
        assert_eq!(choose_mode(6, 100 << 20, &fast), CommMode::Ring);
    }

    #[test]
    fn formulas() {
        let l = LinkModel {
            bandwidth_bytes_per_s: 1e9,
            latency: Duration::from_micros(10),
        };
        let n = 1_000_000usize;
        let secs = |m| predicted_time(m, 4, n, &l).as_secs_f64();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(secs(CommMode::Ring), 6.0 * 1e-5 + 1.5e-3));
        assert!(close(secs(CommMode::HalvingDoubling), 4.0 * 1e-5 + 1.5e-3));
        assert!(close(secs(CommMode::Tree), 4.0 * (1e-5 + 1e-3)));
        assert!(close(secs(CommMode::Redundant), 1e-5 + 3e-3));
        // Non-power-of-two hd: 5 ranks -> p2 = 4 core plus two full messages.
        let hd5 = predicted_time(CommMode::HalvingDoubling, 5, n, &l).as_secs_f64();
        assert!(close(hd5, 6.0 * 1e-5 + 3.5e-3));
        assert_eq!(cost_terms(CommMode::Tree, 1, n).latency_terms, 0.0);
        assert_eq!(cost_terms(CommMode::Tree, 5, n).messages_per_rank, 3);
    }
}
