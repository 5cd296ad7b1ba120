//! What the simulator accepts as a profile: physical numbers only.
//!
//! A profile is a JSON file anyone can edit; one with negative or absurd numbers printed
//! 300-digit step times. [`profile`] refuses it on load, naming the field and its value. (How
//! big a simulation may be is the schedule compiler's budget, [`super::MAX_EVENTS`], counted
//! on the recorded schedules themselves.)

use super::profile::Profile;

/// Longest block, update time a profile may state, ms (a day: far beyond any real step).
const MAX_MS: f64 = 86_400_000.0;

/// Most gradient bytes a profile may describe (1 TiB: 256 G parameters).
const MAX_GRAD_BYTES: f64 = (1u64 << 40) as f64;

/// Checks that every number in `p` is physical: times finite, >= 0 and at most a day, a batch
/// of 1..=[`super::limits::MAX_PROFILE_BATCH`], an input shape of positive sizes, and gradients of
/// at most 1 TiB. The message names the field and its value.
pub fn profile(p: &Profile) -> Result<(), String> {
    let time = |what: String, v: f64| -> Result<(), String> {
        if v.is_finite() && (0.0..=MAX_MS).contains(&v) {
            Ok(())
        } else {
            // Huge and tiny values in exponent form: 1e300, not 301 digits.
            let shown = if v.is_finite() && v != 0.0 && !(1e-3..1e9).contains(&v.abs()) {
                format!("{v:e}")
            } else {
                format!("{v}")
            };
            Err(format!(
                "{what} is {shown}: times must be finite, >= 0 and at most {MAX_MS} ms (a day); \
                 re-create the profile with `dptrain profile`"
            ))
        }
    };
    if p.batch == 0 || p.batch > super::limits::MAX_PROFILE_BATCH {
        return Err(format!(
            "batch is {}: a profile is for a per-worker batch of 1 to {}",
            p.batch,
            super::limits::MAX_PROFILE_BATCH
        ));
    }
    if p.input.iter().any(|&d| d == 0 || d > 1 << 16) {
        return Err(format!(
            "input is {:?}: each of (C, H, W) must be 1 to 65536",
            p.input
        ));
    }
    if p.blocks.is_empty() || p.blocks.len() > 100_000 {
        return Err(format!(
            "has {} blocks: a profile has 1 to 100000",
            p.blocks.len()
        ));
    }
    let mut grad_bytes = 0.0;
    for (i, b) in p.blocks.iter().enumerate() {
        time(format!("block {i} ('{}') forward_ms", b.name), b.forward_ms)?;
        time(
            format!("block {i} ('{}') backward_ms", b.name),
            b.backward_ms,
        )?;
        grad_bytes += 4.0 * b.param_sizes.iter().map(|&n| n as f64).sum::<f64>();
    }
    time("update_ms".into(), p.update_ms)?;
    if grad_bytes > MAX_GRAD_BYTES {
        return Err(format!(
            "the blocks' param_sizes add up to {} of gradients, more than the 1 TiB a profile \
             may describe",
            crate::limits::human_bytes(grad_bytes)
        ));
    }
    Ok(())
}
