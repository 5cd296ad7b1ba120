//! What the simulator accepts: profiles with physical numbers, and configurations it can
//! simulate in seconds within this machine's memory.
//!
//! A profile is a JSON file anyone can edit; one with negative or absurd numbers printed
//! 300-digit step times. And the simulator's cost grows with the workers: rank-symmetric
//! schedules (ring, redundant, halving-doubling on a power of two) run one representative rank
//! (O(rounds)), the others run every rank's program (O(ranks x rounds), O(ranks^2) for ring and
//! redundant when one bucket forces the full simulation): `--workers 4000000000` was OOM-killed
//! and `--workers 1000000` with every mode ran for minutes. [`simulation_size`] counts the
//! operations a configuration will simulate before any is built and refuses what would not
//! finish in seconds or fit in memory.

use super::profile::Profile;
use super::schedule::Collective;
use super::step::{CommChoice, StepConfig, SEARCH_CAPS_KB};
use crate::comm::{choose_mode, CommMode};
use crate::parallel::BucketPlan;

/// Most workers a simulation takes.
pub const MAX_WORKERS: usize = 1 << 24;

/// Most operations (sends, receives, waits, over all ranks) the all-ranks engine may run for
/// one configuration. Measured on this project's 2-core machine (lenet5, halving-doubling on
/// 10000 workers: 3 M operations in 0.84 s and 235 MB): about 3.5 million a second and 80 bytes
/// each, so this is about 3 s and under 1 GB.
pub const MAX_SIM_OPS: f64 = 1.0e7;

/// Bytes the all-ranks engine holds per operation (programs, heap, mailboxes), measured as
/// above.
const BYTES_PER_OP: f64 = 80.0;

/// Most operations of the representative rank's programs (rank-symmetric schedules), summed
/// over buckets: a plain loop, about 30 times cheaper per operation than the all-ranks engine
/// (ring on 16.8 M workers, lenet5's 5 buckets, 3.4e8 operations: 6.6 s and 2.1 GB), so this is
/// a few seconds.
pub const MAX_SYMMETRIC_OPS: f64 = 2.0e8;

/// Bytes per operation of a representative's program (16-byte ops, the send times, the
/// allocator's slack), measured as above for the largest bucket's program.
const BYTES_PER_SYMMETRIC_OP: f64 = 32.0;

/// Longest block, update time a profile may state, ms (a day: far beyond any real step).
const MAX_MS: f64 = 86_400_000.0;

/// Most gradient bytes a profile may describe (1 TiB: 256 G parameters).
const MAX_GRAD_BYTES: f64 = (1u64 << 40) as f64;

/// Checks that every number in `p` is physical: times finite, >= 0 and at most a day, a batch
/// of 1..=[`super::cli::MAX_PROFILE_BATCH`], an input shape of positive sizes, and gradients of
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
    if p.batch == 0 || p.batch > super::cli::MAX_PROFILE_BATCH {
        return Err(format!(
            "batch is {}: a profile is for a per-worker batch of 1 to {}",
            p.batch,
            super::cli::MAX_PROFILE_BATCH
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

/// `ceil(log2(n))`, at least 1: rounds of a tree or of halving-doubling over `n` ranks.
fn rounds(n: usize) -> f64 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1) as f64
}

/// Refuses `cfg` (on profile `p`; with `search`, once per bucket cap tried) if simulating it
/// would run more than [`MAX_SIM_OPS`] operations or need more memory than this machine has,
/// naming the workers and the mode and saying what can be simulated instead.
pub fn simulation_size(p: &Profile, cfg: &StepConfig, search: bool) -> Result<(), String> {
    let n = cfg.world;
    if n <= 1 {
        return Ok(());
    }
    // The search tries every cap; one bucket per block (cap 0) has the most buckets.
    let lens: Vec<usize> = p.block_sizes().iter().map(|s| s.iter().sum()).collect();
    let (plan, repeats) = if search {
        (BucketPlan::new(&lens, 0, 0), SEARCH_CAPS_KB.len() as f64)
    } else {
        (
            BucketPlan::new(&lens, cfg.first_cap_bytes, cfg.cap_bytes),
            1.0,
        )
    };
    let nf = n as f64;
    let ops: Vec<Collective> = plan
        .buckets
        .iter()
        .map(|b| match cfg.comm {
            CommChoice::Fixed(CommMode::Tree) => Collective::Reduce,
            CommChoice::Fixed(m) => Collective::AllReduce(m),
            CommChoice::Auto => Collective::AllReduce(choose_mode(n, b.len * 4, &cfg.link)),
        })
        .collect();
    // Operations of the representative rank, where the schedule is rank-symmetric.
    let symmetric = |c: &Collective| match c {
        Collective::AllReduce(CommMode::Ring) => Some(4.0 * (nf - 1.0)),
        Collective::AllReduce(CommMode::Redundant) => Some(2.0 * (nf - 1.0)),
        Collective::AllReduce(CommMode::HalvingDoubling) if n.is_power_of_two() => {
            Some(4.0 * rounds(n))
        }
        _ => None,
    };
    // Operations of all ranks together (each send is matched by one receive).
    let all_ranks = |c: &Collective| match c {
        Collective::AllReduce(CommMode::Ring) => nf * 4.0 * (nf - 1.0),
        Collective::AllReduce(CommMode::Redundant) => nf * 2.0 * (nf - 1.0),
        Collective::AllReduce(CommMode::HalvingDoubling) => nf * (4.0 * rounds(n) + 2.0),
        Collective::AllReduce(CommMode::Tree) => 4.0 * (nf - 1.0),
        Collective::Reduce | Collective::Broadcast => 2.0 * (nf - 1.0),
    };
    let what = format!(
        "simulating {n} workers with --comm {}{}",
        cfg.comm,
        if search { " --search-buckets" } else { "" }
    );
    let todo = "simulate fewer --workers; ring and redundant (and hd at a power of two) simulate \
                one representative rank and reach the most workers";
    let refuse = |total: f64, limit: f64| {
        Err(format!(
            "{what} takes about {total:.1e} message operations, more than the {limit:.0e} it \
             runs in seconds: {todo}"
        ))
    };
    let sym: Option<Vec<f64>> = ops.iter().map(symmetric).collect();
    if let Some(sym) = sym {
        let total = sym.iter().sum::<f64>() * repeats;
        if total > MAX_SYMMETRIC_OPS {
            return refuse(total, MAX_SYMMETRIC_OPS);
        }
        let largest = sym.iter().copied().fold(0.0, f64::max);
        return crate::limits::check_memory(&what, BYTES_PER_SYMMETRIC_OP * largest, todo);
    }
    // Every rank's program for every bucket (one wait each); tree mode adds the root's update
    // and the weight broadcast.
    let tree = cfg.comm == CommChoice::Fixed(CommMode::Tree);
    let broadcast = if tree {
        all_ranks(&Collective::Broadcast) + 2.0 * nf
    } else {
        0.0
    };
    let total = (ops.iter().map(|c| all_ranks(c) + nf).sum::<f64>() + broadcast) * repeats;
    if total > MAX_SIM_OPS {
        return refuse(total, MAX_SIM_OPS);
    }
    crate::limits::check_memory(&what, BYTES_PER_OP * total / repeats, todo)
}
