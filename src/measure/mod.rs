//! Measuring the training engine on this machine: one replica's step on a synthetic batch
//! ([`replica`]), per-block profiles of it ([`timing`]) in the one profile format
//! ([`profile`], checked on load), and the statistics every measurement reports ([`median`]).
//!
//! Why a module of its own: the simulator (`crate::sim`) plans from profiles, the emulated
//! device (`crate::testbed::device`) holds a worker to one, and the benchmarks (`crate::bench`)
//! time the same replica; all three sit above this layer and none of them imports another
//! for it.

pub mod profile;
pub mod replica;
pub mod timing;

pub use profile::{BlockProfile, Profile, MAX_PROFILE_BATCH, PROFILE_FILE};
pub use replica::SyntheticReplica;
pub use timing::{blocks_of, measure, MeasureFlags, MeasureSpec, MAX_THREADS_PER_CORE};

/// Median of a list of values (sorted in place); NaN for an empty list.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}
