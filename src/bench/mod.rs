//! Benchmarks: commands that print figures (never tests that fail on a slow day).

pub mod allreduce;
pub mod data;
pub mod overlap;
pub mod replica;
pub mod simcheck;
pub mod step;

/// Median of a list of values (sorted in place).
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
