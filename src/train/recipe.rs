//! What a resumed run takes from its checkpoint's run when the flags do not say otherwise, so
//! that `dptrain train --resume CK` alone finishes the run it interrupted, bit for bit:
//! the epochs it was started for, and its recipe (the learning rate, its schedule and
//! warm-up, the SGD settings and the augmentation), recorded in every checkpoint.
//!
//! A setting given again (on the command line or in a config file) wins: a resume may lower
//! the rate or extend the run on purpose. Where the given value differs from the run's, the
//! run warns, because from there on it is another recipe than the one it was resumed from.
//! Checkpoints from before the recipe was recorded lack it, and a resume of one takes the
//! flags' defaults, as before. The run's routine ([`Routine`]: `--test-limit`, `--commit-every`)
//! is followed alike; the options that make the run the run it is (model, data, batch, seed,
//! training limit) are followed before the options are resolved, in [`super::follow`]. (The input size, evaluation transform and normalisation are
//! followed in [`super::inputs::follow_checkpoint`]; the convolution algorithm in
//! `continue_computing_as`.)

use super::recorded::Recorded;
use crate::config::{GivenSettings, TrainConfig};
use crate::optim::{BadSetting, LrSchedule, SgdConfig, SolverSetting};
use crate::pipeline::Augment;
use std::collections::HashMap;

/// A run's optimisation recipe, as a checkpoint records it (metadata keys `lr`,
/// `lr_schedule`, `warmup_steps`, `momentum`, `weight_decay`, `nesterov`, `augment`; each
/// written as its flag takes it, the floats in the shortest form that reads back to the same
/// `f32`).
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// `--lr`.
    pub lr: f32,
    /// `--lr-schedule`.
    pub lr_schedule: LrSchedule,
    /// `--warmup-steps`.
    pub warmup_steps: usize,
    /// `--momentum`, `--weight-decay`, `--nesterov`.
    pub sgd: SgdConfig,
    /// `--augment`.
    pub augment: Augment,
}

// The floats are flags' values, validated finite: equality is an equivalence on them.
impl Eq for Recipe {}

/// The recipe's metadata keys, in the order [`Recipe::write_metadata`] writes them.
const KEYS: [&str; 7] = [
    "lr",
    "lr_schedule",
    "warmup_steps",
    "momentum",
    "weight_decay",
    "nesterov",
    "augment",
];

/// A solver setting's metadata key (its flag's name in snake case).
fn key_of(setting: SolverSetting) -> &'static str {
    match setting {
        SolverSetting::Lr => KEYS[0],
        SolverSetting::Momentum => KEYS[3],
        SolverSetting::WeightDecay => KEYS[4],
        SolverSetting::Nesterov => KEYS[5],
    }
}

impl Recipe {
    /// The recipe of the run `cfg` describes.
    pub fn of(cfg: &TrainConfig) -> Self {
        Self {
            lr: cfg.lr,
            lr_schedule: cfg.lr_schedule.clone(),
            warmup_steps: cfg.warmup_steps,
            sgd: cfg.sgd,
            augment: cfg.augment.clone(),
        }
    }

    /// Adds the recipe's metadata entries to `meta`.
    pub fn write_metadata(&self, meta: &mut HashMap<String, String>) {
        let values = [
            self.lr.to_string(),
            self.lr_schedule.to_string(),
            self.warmup_steps.to_string(),
            self.sgd.momentum.to_string(),
            self.sgd.weight_decay.to_string(),
            self.sgd.nesterov.to_string(),
            self.augment.to_string(),
        ];
        for (key, value) in KEYS.into_iter().zip(values) {
            meta.insert(key.into(), value);
        }
    }

    /// The recipe recorded in checkpoint metadata, judged as the flags are
    /// ([`crate::optim::check_lr`], [`SgdConfig::check`]): absent only when none of its
    /// keys is there (an older checkpoint); some of them missing is unreadable, naming one.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Recorded<Recipe> {
        if !KEYS.iter().any(|k| meta.contains_key(*k)) {
            return Recorded::Absent;
        }
        match Self::read(meta).and_then(|r| r.checked()) {
            Ok(r) => Recorded::Read(r),
            Err(why) => Recorded::Unreadable(why),
        }
    }

    /// Each entry read back; one that does not is named.
    fn read(meta: &HashMap<String, String>) -> Result<Self, String> {
        fn value<T: std::str::FromStr>(
            meta: &HashMap<String, String>,
            key: &str,
        ) -> Result<T, String> {
            meta.get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("metadata '{key}' missing or not valid"))
        }
        let text = |key: &str| {
            meta.get(key)
                .ok_or_else(|| format!("metadata '{key}' missing"))
        };
        let [lr, schedule, warmup, momentum, decay, nesterov, augment] = KEYS;
        Ok(Self {
            lr: value(meta, lr)?,
            lr_schedule: LrSchedule::parse(text(schedule)?)
                .map_err(|e| format!("metadata '{schedule}' {:?}: {e}", meta[schedule]))?,
            warmup_steps: value(meta, warmup)?,
            sgd: SgdConfig {
                momentum: value(meta, momentum)?,
                weight_decay: value(meta, decay)?,
                nesterov: value(meta, nesterov)?,
            },
            augment: Augment::parse(text(augment)?)
                .map_err(|e| format!("metadata '{augment}' {:?}: {e}", meta[augment]))?,
        })
    }

    /// The recipe, unless it holds a value the flags refuse (said as the metadata entry).
    fn checked(self) -> Result<Self, String> {
        crate::optim::check_lr(self.lr)
            .and_then(|()| self.sgd.check())
            .map_err(|e| format!("metadata '{}' {}", key_of(e.setting), e.why))?;
        Ok(self)
    }
}

/// What following a checkpoint's run told the user: notes (settings taken from it) and
/// warnings (settings given that differ from it).
#[derive(Debug, Default)]
pub struct Followed {
    /// Said as `note:` lines.
    pub notes: Vec<String>,
    /// Said as `warning:` lines.
    pub warnings: Vec<String>,
}

/// A resume without `--epochs` trains for the epochs the checkpoint's run was started for
/// (`planned`, when recorded), not the flag's default: `--resume CK` alone finishes the
/// interrupted run. Checkpoints from before the count was recorded keep the default. Returns
/// the note that says so.
pub fn follow_epochs(cfg: &mut TrainConfig, planned: Option<usize>) -> Option<String> {
    if cfg.given.epochs {
        return None;
    }
    let planned = planned?;
    cfg.epochs = planned;
    Some(format!(
        "resuming for the {} the checkpoint's run was started for (--epochs gives another \
         count)",
        crate::terminal::counted(planned, "epoch")
    ))
}

/// Why a resume cannot follow its checkpoint's recipe.
#[derive(Debug, thiserror::Error)]
pub enum RecipeRefusal {
    /// Nesterov momentum without momentum, each half from its own side.
    #[error(
        "{bad} (the resumed run's --momentum is {momentum}, {momentum_from}, and --nesterov \
         {nesterov}, {nesterov_from})"
    )]
    NesterovWithoutMomentum {
        /// The check's refusal.
        bad: BadSetting,
        /// The momentum the run would use, and where it came from.
        momentum: f32,
        /// See `momentum`.
        momentum_from: Origin,
        /// `--nesterov` as the run would use it, and where it came from.
        nesterov: bool,
        /// See `nesterov`.
        nesterov_from: Origin,
    },
}

/// Where a resumed run's setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A flag or a config file's key.
    Given,
    /// The checkpoint's recorded recipe.
    Recorded,
    /// The flag's default (the checkpoint records no recipe).
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Given => "given",
            Self::Recorded => "the checkpoint's run's",
            Self::Default => "the default",
        })
    }
}

/// Every recipe setting not given takes the checkpoint's run's value (`recorded`, where it
/// records one that reads back); one given with another value is warned about. Then refuses
/// Nesterov momentum without momentum (a pair only a resume can make, each half from another
/// side), naming where each came from.
pub fn follow_recipe(
    cfg: &mut TrainConfig,
    recorded: Option<&Recipe>,
) -> Result<Followed, RecipeRefusal> {
    let mut followed = Followed::default();
    let taken_from = match recorded {
        Some(r) => {
            followed = take_recorded(cfg, r);
            Origin::Recorded
        }
        None => Origin::Default,
    };
    if let Err(bad) = cfg.sgd.check() {
        let from = |given: bool| if given { Origin::Given } else { taken_from };
        return Err(RecipeRefusal::NesterovWithoutMomentum {
            bad,
            momentum: cfg.sgd.momentum,
            momentum_from: from(cfg.given.momentum),
            nesterov: cfg.sgd.nesterov,
            nesterov_from: from(cfg.given.nesterov),
        });
    }
    Ok(followed)
}

/// [`follow_recipe`] with a recorded recipe: takes each setting not given, and says what it
/// took and what given differs.
fn take_recorded(cfg: &mut TrainConfig, r: &Recipe) -> Followed {
    let given: GivenSettings = cfg.given;
    let mut taken: Vec<String> = Vec::new();
    let mut differing: Vec<String> = Vec::new();
    // Whether the recorded value replaces this run's: not given, and another value.
    let mut follow = |flag: &str, given: bool, then: String, now: String| {
        if then == now {
            return false;
        }
        if given {
            differing.push(format!("{flag} {now} (the run's was {then})"));
            return false;
        }
        taken.push(format!("{flag} {then}"));
        true
    };
    if follow("--lr", given.lr, show(r.lr), show(cfg.lr)) {
        cfg.lr = r.lr;
    }
    let (then, now) = (r.lr_schedule.to_string(), cfg.lr_schedule.to_string());
    if follow("--lr-schedule", given.lr_schedule, then, now) {
        cfg.lr_schedule = r.lr_schedule.clone();
    }
    let (then, now) = (r.warmup_steps.to_string(), cfg.warmup_steps.to_string());
    if follow("--warmup-steps", given.warmup_steps, then, now) {
        cfg.warmup_steps = r.warmup_steps;
    }
    let (then, now) = (show(r.sgd.momentum), show(cfg.sgd.momentum));
    if follow("--momentum", given.momentum, then, now) {
        cfg.sgd.momentum = r.sgd.momentum;
    }
    let (then, now) = (show(r.sgd.weight_decay), show(cfg.sgd.weight_decay));
    if follow("--weight-decay", given.weight_decay, then, now) {
        cfg.sgd.weight_decay = r.sgd.weight_decay;
    }
    let (then, now) = (r.sgd.nesterov.to_string(), cfg.sgd.nesterov.to_string());
    if follow("--nesterov", given.nesterov, then, now) {
        cfg.sgd.nesterov = r.sgd.nesterov;
    }
    let (then, now) = (r.augment.to_string(), cfg.augment.to_string());
    if follow("--augment", given.augment, then, now) {
        cfg.augment = r.augment.clone();
    }
    let mut followed = Followed::default();
    if !taken.is_empty() {
        followed.notes.push(format!(
            "resuming with the checkpoint's run's {} (a flag or config key given changes one)",
            taken.join(", ")
        ));
    }
    if !differing.is_empty() {
        followed.warnings.push(format!(
            "resuming under another recipe than the checkpoint's run's: {}; from the resumed \
             step on the run trains with the values given, so it is not the run the \
             checkpoint was part of",
            differing.join(", ")
        ));
    }
    followed
}

/// A setting's value as the messages show it ([`crate::terminal::number`]); -0 as 0, the
/// same setting.
fn show(x: f32) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        crate::terminal::number(x)
    }
}

/// A warning when the checkpoint holds PowerSGD's error feedback (its run sent gradients
/// with `--compress powersgd:R`) and this run does not compress so: what that run still owed
/// the other workers is dropped, and the run is no longer the one the checkpoint was part of.
/// (With PowerSGD again, the state is restored: `worker::restore_powersgd`.) `recorded`:
/// the run's `--compress` where its checkpoint records it.
pub fn powersgd_dropped(
    cfg: &TrainConfig,
    has_state: bool,
    recorded: Option<&str>,
) -> Option<String> {
    if !has_state {
        return None;
    }
    let this_run = match cfg.compress.powersgd_rank() {
        // One worker sends no gradients, so compresses none.
        Some(_) if cfg.world() < 2 => "this run has one worker (nothing is sent)".to_string(),
        Some(_) => return None,
        None => format!("this run's --compress is {}", cfg.compress),
    };
    let compress = recorded.unwrap_or("powersgd:R");
    Some(format!(
        "the checkpoint's run sent gradients with --compress {compress} and holds its error \
         feedback, and {this_run}: the error feedback is dropped; to continue the run exactly, \
         resume with --compress {compress} on the workers it ran with"
    ))
}

/// How a run evaluated and checkpointed inside its epochs: not part of what it learns, but
/// a resume that drops them changes what the run reports (its later epochs' test figures on
/// another number of images than its earlier ones, in one `metrics.jsonl` and report) and how
/// much an interruption costs (no more commits). Recorded in every checkpoint and followed on
/// resume like the [`Recipe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routine {
    /// `--test-limit` (`None`: the whole test split).
    pub test_limit: Option<usize>,
    /// `--commit-every` (0: no commits).
    pub commit_every: usize,
    /// What the run kept and how often it wrote (`None` in checkpoints written before
    /// these were recorded): a resume that took the defaults instead would prune the
    /// checkpoints and commits a run of `--keep-checkpoints 10` kept.
    pub outputs: Option<OutputRoutine>,
}

/// The part of a [`Routine`] that says which files a run writes and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputRoutine {
    /// `--checkpoint-every`.
    pub checkpoint_every: usize,
    /// `--keep-checkpoints` (at least 1).
    pub keep_checkpoints: usize,
    /// `--keep-commits` (at least 1).
    pub keep_commits: usize,
    /// `--log-every`.
    pub log_every: usize,
}

impl Routine {
    /// The routine of the run `cfg` describes.
    pub fn of(cfg: &TrainConfig) -> Self {
        Self {
            test_limit: cfg.test_limit,
            commit_every: cfg.commit_every,
            outputs: Some(OutputRoutine {
                checkpoint_every: cfg.checkpoint_every,
                keep_checkpoints: cfg.keep_checkpoints,
                keep_commits: cfg.keep_commits,
                log_every: cfg.log_every,
            }),
        }
    }

    /// Adds its metadata entries (`test_limit`, empty for none; `commit_every`,
    /// `checkpoint_every`, `keep_checkpoints`, `keep_commits`, `log_every`) to `meta`.
    pub fn write_metadata(&self, meta: &mut HashMap<String, String>) {
        let limit = self.test_limit.map_or_else(String::new, |n| n.to_string());
        meta.insert("test_limit".into(), limit);
        meta.insert("commit_every".into(), self.commit_every.to_string());
        if let Some(k) = &self.outputs {
            for (key, value) in k.entries() {
                meta.insert(key.into(), value.to_string());
            }
        }
    }

    /// The routine recorded in `meta`: `None` when neither key is there (an older
    /// checkpoint); a value that does not read back is named.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<Option<Self>, String> {
        let (limit, every) = (meta.get("test_limit"), meta.get("commit_every"));
        if limit.is_none() && every.is_none() {
            return Ok(None);
        }
        let test_limit = match limit.map(String::as_str) {
            Some("") => None,
            // As the flag: at least 1 (an evaluation of no image has no figures).
            _ => Some(read_count(meta, "test_limit", 1)?),
        };
        let commit_every = read_count(meta, "commit_every", 0)?;
        Ok(Some(Self {
            test_limit,
            commit_every,
            outputs: OutputRoutine::from_metadata(meta)?,
        }))
    }
}

impl OutputRoutine {
    /// Its metadata keys, in the order of [`OutputRoutine::entries`].
    const KEYS: [&'static str; 4] = [
        "checkpoint_every",
        "keep_checkpoints",
        "keep_commits",
        "log_every",
    ];

    /// Its metadata keys and values.
    fn entries(&self) -> [(&'static str, usize); 4] {
        let values = [
            self.checkpoint_every,
            self.keep_checkpoints,
            self.keep_commits,
            self.log_every,
        ];
        std::array::from_fn(|i| (Self::KEYS[i], values[i]))
    }

    /// Read back from `meta`: `None` where none of its keys is there (a checkpoint written
    /// before they were recorded); one missing, not a number, or a count to keep of 0, named.
    fn from_metadata(meta: &HashMap<String, String>) -> Result<Option<Self>, String> {
        if Self::KEYS.iter().all(|k| !meta.contains_key(*k)) {
            return Ok(None);
        }
        Ok(Some(Self {
            checkpoint_every: read_count(meta, "checkpoint_every", 0)?,
            keep_checkpoints: read_count(meta, "keep_checkpoints", 1)?,
            keep_commits: read_count(meta, "keep_commits", 1)?,
            log_every: read_count(meta, "log_every", 0)?,
        }))
    }
}

/// The count `meta` records under `key`, at least `least`; one missing, not a number or
/// below it, named.
fn read_count(meta: &HashMap<String, String>, key: &str, least: usize) -> Result<usize, String> {
    meta.get(key)
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= least)
        .ok_or_else(|| format!("metadata '{key}' missing or not a valid count"))
}

/// Takes the run's checkpoint cadence, the checkpoints and commits it kept and its log
/// cadence where they were not given.
fn take_outputs(cfg: &mut TrainConfig, run: &OutputRoutine, taken: &mut Vec<String>) {
    // Not where this run writes no checkpoints, nor what it keeps of commits it makes none of.
    let writes = !cfg.no_checkpoints;
    let commits = writes && cfg.commit_every > 0;
    let given = cfg.given;
    let followed = [
        (writes && !given.checkpoint_every, &mut cfg.checkpoint_every),
        (writes && !given.keep_checkpoints, &mut cfg.keep_checkpoints),
        (commits && !given.keep_commits, &mut cfg.keep_commits),
        (!given.log_every, &mut cfg.log_every),
    ];
    for ((follow, now), (key, recorded)) in followed.into_iter().zip(run.entries()) {
        if follow && *now != recorded {
            *now = recorded;
            taken.push(format!("--{} {recorded}", key.replace('_', "-")));
        }
    }
}

/// Takes the checkpoint's run's `--test-limit`, `--commit-every` and what it kept ([`OutputRoutine`])
/// where they were not given (a note lists those that differ from this run's); a given test
/// limit other than the run's is warned about, since the run's epochs are then evaluated on
/// two numbers of images.
pub fn follow_routine(cfg: &mut TrainConfig, recorded: Option<&Routine>) -> Followed {
    let mut followed = Followed::default();
    let Some(run) = recorded else {
        return followed;
    };
    let limit =
        |l: Option<usize>| l.map_or_else(|| "none (the whole split)".into(), |n| n.to_string());
    let mut taken = Vec::new();
    if !cfg.given.test_limit && cfg.test_limit != run.test_limit {
        cfg.test_limit = run.test_limit;
        taken.push(format!("--test-limit {}", limit(run.test_limit)));
    } else if cfg.given.test_limit && cfg.test_limit != run.test_limit {
        followed.warnings.push(format!(
            "--test-limit {}: the checkpoint's run evaluated on {}, so its epochs' test figures \
             (metrics.jsonl, the report) are on two numbers of images from here on",
            limit(cfg.test_limit),
            limit(run.test_limit)
        ));
    }
    // Not where this run writes no checkpoints (--no-checkpoints refuses commits).
    if !cfg.given.commit_every && !cfg.no_checkpoints && cfg.commit_every != run.commit_every {
        cfg.commit_every = run.commit_every;
        taken.push(format!("--commit-every {}", run.commit_every));
    }
    if let Some(outputs) = run.outputs {
        take_outputs(cfg, &outputs, &mut taken);
    }
    if !taken.is_empty() {
        followed.notes.push(format!(
            "resuming with the checkpoint's run's {} (give the option for another)",
            taken.join(", ")
        ));
    }
    followed
}

/// A note when a resume continues on another number of workers than the checkpoint's run
/// had (`recorded`: its world, and its workers per process where its record reads), or on
/// as many grouped into other processes: the batches and their order are the same, but the
/// workers' gradients are summed in another grouping, which may round differently (README,
/// "Determinism"), and PowerSGD's error feedback, each worker's own, goes to worker 0 as
/// their sum (`worker::restore_powersgd`).
pub fn workers_changed(
    cfg: &TrainConfig,
    recorded: (usize, Option<usize>),
    has_powersgd: bool,
) -> Option<String> {
    let (now, (recorded, per_process)) = (cfg.world(), recorded);
    if now == recorded {
        let per_process = per_process?;
        if per_process == cfg.workers {
            return None;
        }
        let processes = |n: usize, per: usize| {
            let es = if n == 1 { "" } else { "es" };
            format!(
                "{n} process{es} of {}",
                crate::terminal::counted(per, "worker")
            )
        };
        return Some(format!(
            "continuing in {} (the checkpoint's run had {}): the same batches in the same \
             order, the workers' gradients summed in another grouping, which may round \
             differently from a continuation in the run's processes",
            processes(cfg.processes, cfg.workers),
            processes(recorded / per_process, per_process)
        ));
    }
    let feedback = if has_powersgd && cfg.compress.powersgd_rank().is_some() && now > 1 {
        format!(
            "; PowerSGD's error feedback, each of the {recorded} workers' own, is summed onto \
             worker 0"
        )
    } else {
        String::new()
    };
    Some(format!(
        "continuing on {} (the checkpoint's run had {recorded}): the same batches in the same \
         order, the workers' gradients summed in another grouping, which may round differently \
         from a continuation on {recorded}{feedback}",
        crate::terminal::counted(now, "worker")
    ))
}

/// A warning when a resumed run's `--epochs` differs from the checkpoint's run's (`planned`)
/// and the learning-rate schedule spans the run (cosine decays to 0 over `--epochs`): the rate
/// from the resumed epoch on follows the new total's curve, not the one the run was following.
pub fn schedule_stretched(cfg: &TrainConfig, planned: Option<usize>) -> Option<String> {
    let planned = planned.filter(|&p| p != cfg.epochs)?;
    matches!(cfg.lr_schedule, LrSchedule::Cosine).then(|| {
        format!(
            "--epochs {}: the checkpoint's run was started for {planned}, and the cosine \
             learning-rate schedule spans the run's epochs, so the rate from here on follows \
             a {}-epoch curve (not the {planned}-epoch one it was on)",
            cfg.epochs, cfg.epochs
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Recipe {
        Recipe {
            lr: 0.1,
            lr_schedule: LrSchedule::parse("step:3,7:0.3").unwrap(),
            warmup_steps: 7,
            sgd: SgdConfig {
                momentum: 0.8,
                weight_decay: 1e-4,
                nesterov: false,
            },
            augment: Augment::parse("flip,random-resized-crop:0.5,1").unwrap(),
        }
    }

    fn config(f: impl FnOnce(&mut crate::config::TrainOptions)) -> TrainConfig {
        let mut o = crate::config::TrainOptions {
            dataset: Some("synthetic".into()),
            ..Default::default()
        };
        f(&mut o);
        o.resolve().unwrap()
    }

    #[test]
    fn what_a_run_kept_reads_back_and_is_followed_unless_given() {
        let run = config(|o| {
            o.keep_checkpoints = Some(10);
            o.commit_every = Some(5);
            o.keep_commits = Some(4);
            o.log_every = Some(3);
        });
        let mut meta = HashMap::new();
        Routine::of(&run).write_metadata(&mut meta);
        let recorded = Routine::from_metadata(&meta).unwrap();
        assert_eq!(recorded, Some(Routine::of(&run)));
        let recorded = recorded.as_ref();
        // Given --keep-commits wins (the run's commits are followed, so its keep count would
        // be too); the others are the run's.
        let mut cfg = config(|o| o.keep_commits = Some(1));
        let followed = follow_routine(&mut cfg, recorded);
        let kept = (cfg.keep_checkpoints, cfg.keep_commits, cfg.log_every);
        assert_eq!((cfg.commit_every, kept), (5, (10, 1, 3)));
        let mut cfg = config(|_| {});
        follow_routine(&mut cfg, recorded);
        assert_eq!(cfg.keep_commits, 4);
        // Under --no-checkpoints, nothing of what the run wrote or kept.
        let mut cfg = config(|o| o.no_checkpoints = true);
        follow_routine(&mut cfg, recorded);
        assert_eq!(
            (cfg.keep_checkpoints, cfg.keep_commits, cfg.log_every),
            (2, 2, 3)
        );
        assert!(
            followed.notes[0].contains("--keep-checkpoints 10, --log-every 3"),
            "{:?}",
            followed.notes
        );
        // A count to keep of 0 does not read back, named; none of the keys: an older
        // checkpoint's routine, which keeps nothing recorded.
        meta.insert("keep_checkpoints".into(), "0".into());
        let err = Routine::from_metadata(&meta).unwrap_err();
        assert!(err.contains("'keep_checkpoints'"), "{err}");
        // A test limit of 0, which the flag refuses, alike (it failed later, as an empty
        // test split, naming neither the entry nor the ways out).
        let mut zero = meta.clone();
        zero.insert("keep_checkpoints".into(), "10".into());
        zero.insert("test_limit".into(), "0".into());
        let err = Routine::from_metadata(&zero).unwrap_err();
        assert!(err.contains("'test_limit'"), "{err}");
        for key in OutputRoutine::KEYS {
            meta.remove(key);
        }
        assert_eq!(
            Routine::from_metadata(&meta).unwrap().unwrap().outputs,
            None
        );
    }

    #[test]
    fn a_recipe_reads_back_as_written_and_an_older_checkpoint_has_none() {
        let mut meta = HashMap::new();
        assert_eq!(Recipe::from_metadata(&meta), Recorded::Absent);
        recipe().write_metadata(&mut meta);
        assert_eq!(Recipe::from_metadata(&meta), Recorded::Read(recipe()));
        // What does not read back, and what the flags refuse, is named; nothing panics.
        let unreadable = |key: &str, value: &str| {
            let mut m = meta.clone();
            m.insert(key.into(), value.into());
            match Recipe::from_metadata(&m) {
                Recorded::Unreadable(why) => why,
                other => panic!("{key}={value} read as {other:?}"),
            }
        };
        assert_eq!(
            unreadable("momentum", "fast"),
            "metadata 'momentum' missing or not valid"
        );
        assert!(unreadable("augment", "spin").starts_with("metadata 'augment' \"spin\": "));
        assert!(unreadable("lr_schedule", "step:0").starts_with("metadata 'lr_schedule'"));
        for (key, value, said) in [
            (
                "lr",
                "NaN",
                "metadata 'lr' must be a positive number, not NaN",
            ),
            ("lr", "0", "metadata 'lr' must be a positive number, not 0"),
            (
                "lr",
                "1e40",
                "metadata 'lr' must be a positive number, not inf",
            ),
            (
                "momentum",
                "1.5",
                "metadata 'momentum' must be in [0, 1), not 1.5",
            ),
            (
                "weight_decay",
                "-1",
                "metadata 'weight_decay' must be >= 0, not -1",
            ),
        ] {
            assert_eq!(unreadable(key, value), said);
        }
        let mut m = meta.clone();
        m.insert("momentum".into(), "0".into());
        m.insert("nesterov".into(), "true".into());
        assert!(matches!(
            Recipe::from_metadata(&m),
            Recorded::Unreadable(why) if why.starts_with("metadata 'nesterov' true needs")
        ));
    }

    #[test]
    fn settings_not_given_follow_the_run_and_given_ones_win_with_a_warning() {
        let mut cfg = config(|o| o.lr = Some(0.01));
        let followed = follow_recipe(&mut cfg, Some(&recipe())).unwrap();
        assert_eq!(
            Recipe::of(&cfg),
            Recipe {
                lr: 0.01,
                ..recipe()
            }
        );
        assert_eq!(followed.notes.len(), 1);
        let note = &followed.notes[0];
        for said in [
            "--lr-schedule step:3,7:0.3",
            "--warmup-steps 7",
            "--momentum 0.8",
            "--weight-decay 0.0001",
            "--nesterov false",
            "--augment flip,random-resized-crop:0.5,1",
        ] {
            assert!(note.contains(said), "{said} not in {note}");
        }
        assert!(!note.contains("--lr 0.1"), "{note}");
        assert_eq!(followed.warnings.len(), 1);
        assert!(
            followed.warnings[0].contains("--lr 0.01 (the run's was 0.1)"),
            "{:?}",
            followed.warnings
        );
        // The run's own values given again: nothing to say.
        let mut same = config(|o| o.lr = Some(0.1));
        same.sgd = recipe().sgd;
        same.lr_schedule = recipe().lr_schedule;
        same.warmup_steps = 7;
        same.augment = recipe().augment;
        let followed = follow_recipe(&mut same, Some(&recipe())).unwrap();
        assert!(followed.notes.is_empty() && followed.warnings.is_empty());
    }

    #[test]
    fn momentum_and_nesterov_are_judged_once_followed_naming_where_each_came_from() {
        let plain = Recipe {
            sgd: SgdConfig {
                momentum: 0.0,
                weight_decay: 0.0,
                nesterov: false,
            },
            ..recipe()
        };
        let ck = tempfile::NamedTempFile::new().unwrap();
        let resumed = |f: &dyn Fn(&mut crate::config::TrainOptions)| {
            config(|o| {
                o.resume = Some(ck.path().to_path_buf());
                f(o);
            })
        };
        // Nesterov given over a run without momentum.
        let plain = Some(&plain);
        let mut cfg = resumed(&|o| o.nesterov = Some(true));
        let err = follow_recipe(&mut cfg, plain).unwrap_err().to_string();
        assert!(
            err.contains("--momentum is 0, the checkpoint's run's, and --nesterov true, given"),
            "{err}"
        );
        // Momentum 0 given over a run without Nesterov: the options alone would refuse it
        // (Nesterov is on by default); the run's --nesterov false makes it a valid resume.
        let mut cfg = resumed(&|o| o.momentum = Some(0.0));
        let followed = follow_recipe(&mut cfg, Some(&recipe())).unwrap();
        assert_eq!((cfg.sgd.momentum, cfg.sgd.nesterov), (0.0, false));
        assert!(followed.warnings[0].contains("--momentum 0 (the run's was 0.8)"));
        // A checkpoint without a recipe: the flags' values, judged and said.
        let mut cfg = resumed(&|o| o.momentum = Some(0.0));
        let err = follow_recipe(&mut cfg, None).unwrap_err().to_string();
        assert!(
            err.contains("--momentum is 0, given, and --nesterov true, the default"),
            "{err}"
        );
    }

    #[test]
    fn a_resume_on_as_many_workers_grouped_otherwise_is_told_its_sums_may_round_differently() {
        // A run of 2 processes of 2 workers.
        let mut run = (4, Some(2));
        let note = |cfg: &TrainConfig, run| workers_changed(cfg, run, false);
        let one_process = config(|o| o.workers = Some(4));
        let said = note(&one_process, run).expect("another grouping is said");
        assert!(
            said.starts_with(
                "continuing in 1 process of 4 workers (the checkpoint's run had 2 processes of \
                 2 workers)"
            ),
            "{said}"
        );
        let mut as_it_ran = config(|o| o.workers = Some(2));
        as_it_ran.processes = 2;
        assert_eq!(note(&as_it_ran, run), None);
        // Another number of workers: said as such; a run whose grouping is not recorded
        // (an older checkpoint), nothing to compare.
        let said = note(&config(|o| o.workers = Some(8)), run).unwrap();
        assert!(said.starts_with("continuing on 8 workers (the checkpoint's run had 4)"));
        run.1 = None;
        assert_eq!(note(&one_process, run), None);
    }

    #[test]
    fn a_recipe_with_some_keys_missing_is_unreadable_naming_one_not_absent() {
        let mut meta = HashMap::new();
        recipe().write_metadata(&mut meta);
        meta.remove("lr");
        assert_eq!(
            Recipe::from_metadata(&meta),
            Recorded::Unreadable("metadata 'lr' missing or not valid".into())
        );
    }

    #[test]
    fn tiny_and_huge_values_are_shown_in_exponent_form() {
        assert_eq!(show(1e-40), "1e-40");
        assert_eq!(show(5e-4), "0.0005");
        assert_eq!(show(0.0), "0");
        assert_eq!(show(-0.0), "0");
        assert_eq!(show(2e7), "2e7");
    }

    #[test]
    fn epochs_follow_the_run_unless_given() {
        let mut cfg = config(|_| {});
        assert!(follow_epochs(&mut cfg, Some(9)).is_some());
        assert_eq!(cfg.epochs, 9);
        let mut cfg = config(|o| o.epochs = Some(2));
        assert_eq!(follow_epochs(&mut cfg, Some(9)), None);
        assert_eq!(cfg.epochs, 2);
        let mut cfg = config(|_| {});
        assert_eq!(follow_epochs(&mut cfg, None), None);
        assert_eq!(cfg.epochs, 4);
    }
}
