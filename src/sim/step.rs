//! One simulated training step: the worker's timeline from the profile, buckets from the
//! trainer's [`BucketPlan`], and their collectives on each rank's communication channel.

use super::engine::{run_ranks, run_symmetric};
use super::profile::Profile;
use super::schedule::{rank_program, symmetric_program, Collective, Op};
use crate::comm::{choose_mode, CommMode, LinkModel};
use crate::parallel::BucketPlan;

/// How the simulated buckets pick their algorithm (the trainer's `--comm`, less the transports'
/// native all-reduce, which has no schedule to simulate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommChoice {
    /// Per bucket, the mode the alpha-beta cost model predicts fastest for the link.
    Auto,
    /// One mode for every bucket.
    Fixed(CommMode),
}

impl CommChoice {
    /// Parses `auto` or a mode name.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            m => m
                .parse::<CommMode>()
                .map(Self::Fixed)
                .map_err(|e| format!("{e} (or auto)")),
        }
    }
}

impl std::fmt::Display for CommChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(m) => write!(f, "{m}"),
        }
    }
}

/// What varies between simulated configurations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConfig {
    /// Workers (ranks).
    pub world: usize,
    /// Every rank's port.
    pub link: LinkModel,
    /// Communication mode, or `auto` (per bucket, [`choose_mode`] for this link).
    pub comm: CommChoice,
    /// Buckets start as soon as they are ready (on), or all after backward (off).
    pub overlap: bool,
    /// First bucket's cap, bytes (as `--first-bucket-kb`).
    pub first_cap_bytes: usize,
    /// Other buckets' cap, bytes (as `--bucket-kb`; 0: one block per bucket).
    pub cap_bytes: usize,
}

/// One simulated step (times in ms; all ranks' slowest).
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// Whole step.
    pub step_ms: f64,
    /// Forward.
    pub forward_ms: f64,
    /// Backward.
    pub backward_ms: f64,
    /// Update (the root's, in tree mode).
    pub update_ms: f64,
    /// Communication not hidden by backward (tree mode: plus the weight broadcast).
    pub exposed_ms: f64,
    /// Time the communication channel spent in collectives.
    pub comm_ms: f64,
    /// Bucket sizes in bytes, in the order they become ready.
    pub bucket_bytes: Vec<usize>,
    /// The collective of each bucket.
    pub bucket_ops: Vec<Collective>,
}

/// Simulates one step of `profile` under `cfg`. Every rank runs the same profile, so their
/// buckets become ready at the same times; the ranks differ only in what the schedules make
/// them do.
pub fn simulate_step(profile: &Profile, cfg: &StepConfig) -> Result<StepResult, String> {
    if cfg.world == 0 {
        return Err("workers must be at least 1".into());
    }
    let lens: Vec<usize> = profile
        .block_sizes()
        .iter()
        .map(|s| s.iter().sum())
        .collect();
    let plan = BucketPlan::new(&lens, cfg.first_cap_bytes, cfg.cap_bytes);
    let forward = profile.forward_ms() / 1e3;
    let backward = profile.backward_ms() / 1e3;
    let update = profile.update_ms / 1e3;
    // Backward runs the last block first; block k ends once every block >= k has run.
    let nb = profile.blocks.len();
    let mut done_at = vec![0.0; nb];
    let mut t = forward;
    for k in (0..nb).rev() {
        t += profile.blocks[k].backward_ms / 1e3;
        done_at[k] = t;
    }
    let bwd_end = forward + backward;
    let ready: Vec<f64> = plan
        .buckets
        .iter()
        .map(|b| {
            if cfg.overlap {
                done_at[*b.blocks.last().expect("a bucket holds a block")]
            } else {
                bwd_end
            }
        })
        .collect();
    let bytes: Vec<usize> = plan.buckets.iter().map(|b| b.len * 4).collect();
    let tree = cfg.comm == CommChoice::Fixed(CommMode::Tree);
    let ops: Vec<Collective> = bytes
        .iter()
        .map(|&n| match cfg.comm {
            CommChoice::Fixed(CommMode::Tree) => Collective::Reduce,
            CommChoice::Fixed(m) => Collective::AllReduce(m),
            CommChoice::Auto => Collective::AllReduce(choose_mode(cfg.world, n, &cfg.link)),
        })
        .collect();
    let result = |comm_end: f64, step: f64, comm: f64, upd: f64| StepResult {
        step_ms: step * 1e3,
        forward_ms: forward * 1e3,
        backward_ms: backward * 1e3,
        update_ms: upd * 1e3,
        exposed_ms: (comm_end - bwd_end).max(0.0) * 1e3,
        comm_ms: comm * 1e3,
        bucket_bytes: bytes.clone(),
        bucket_ops: ops.clone(),
    };
    if cfg.world == 1 {
        return Ok(result(bwd_end, bwd_end + update, 0.0, update));
    }

    // Rank-symmetric collectives: every rank's channel is in the same state, so one channel
    // queue with the representative's durations is exact.
    let symmetric: Option<Vec<f64>> = if tree {
        None
    } else {
        ops.iter()
            .zip(&bytes)
            .map(|(&op, &n)| {
                symmetric_program(op, cfg.world, n as f64).map(|p| run_symmetric(&p, &cfg.link))
            })
            .collect()
    };
    if let Some(durations) = symmetric {
        let mut free = 0.0f64;
        for (r, d) in ready.iter().zip(&durations) {
            free = free.max(*r) + d;
        }
        let comm_end = free.max(bwd_end);
        return Ok(result(
            comm_end,
            comm_end + update,
            durations.iter().sum(),
            update,
        ));
    }

    // Otherwise every rank's program, in full.
    let world = cfg.world;
    let total_bytes: f64 = bytes.iter().sum::<usize>() as f64;
    let programs: Vec<Vec<Op>> = (0..world)
        .map(|r| {
            let mut p = Vec::new();
            for (i, (&op, &n)) in ops.iter().zip(&bytes).enumerate() {
                p.push(Op::WaitUntil(ready[i]));
                rank_program(op, world, r, n as f64, i as u32, &mut p);
            }
            if tree {
                // Caffe's scheme, as the trainer runs it: the root updates once every bucket is
                // reduced, then its new weights go down the tree.
                p.push(Op::WaitUntil(bwd_end));
                if r == 0 {
                    p.push(Op::Compute(update));
                }
                rank_program(
                    Collective::Broadcast,
                    world,
                    r,
                    total_bytes,
                    ops.len() as u32,
                    &mut p,
                );
            }
            p
        })
        .collect();
    let times = run_ranks(&programs, &cfg.link)?;
    let comm = times.comm.iter().cloned().fold(0.0, f64::max);
    if tree {
        let step = times.end.iter().cloned().fold(bwd_end, f64::max);
        let mut r = result(step - update, step, comm, update);
        r.exposed_ms = (step - bwd_end - update).max(0.0) * 1e3;
        Ok(r)
    } else {
        let comm_end = times.end.iter().cloned().fold(bwd_end, f64::max);
        Ok(result(comm_end, comm_end + update, comm, update))
    }
}

/// The bucket caps (KiB) `--search-buckets` tries; 0 is one block per bucket and the last is
/// "everything in one bucket".
pub const SEARCH_CAPS_KB: [usize; 10] = [0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 30];

/// Tries each cap of [`SEARCH_CAPS_KB`] (first cap as in `cfg`) and returns the fastest
/// `(cap_kb, result)`.
pub fn search_buckets(profile: &Profile, cfg: &StepConfig) -> Result<(usize, StepResult), String> {
    let mut best: Option<(usize, StepResult)> = None;
    for &kb in &SEARCH_CAPS_KB {
        let c = StepConfig {
            cap_bytes: kb.saturating_mul(1024),
            ..*cfg
        };
        let r = simulate_step(profile, &c)?;
        if best.as_ref().is_none_or(|(_, b)| r.step_ms < b.step_ms) {
            best = Some((kb, r));
        }
    }
    Ok(best.expect("at least one cap"))
}
