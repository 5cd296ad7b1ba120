//! What a resumed run takes from its checkpoint's run when the flags do not say otherwise, so
//! that `dptrain train --resume CK` alone finishes the run it interrupted, bit for bit:
//! the epochs it was started for, and its recipe (the learning rate, its schedule and
//! warm-up, the SGD settings and the augmentation), recorded in every checkpoint.
//!
//! A setting given again (on the command line or in a config file) wins: a resume may lower
//! the rate or extend the run on purpose. Where the given value differs from the run's, the
//! run warns, because from there on it is another recipe than the one it was resumed from.
//! Checkpoints from before the recipe was recorded lack it, and a resume of one takes the
//! flags' defaults, as before. (The input size, evaluation transform and normalisation are
//! followed in [`super::inputs::follow_checkpoint`]; the convolution algorithm in
//! `continue_computing_as`.)

use crate::config::{GivenSettings, TrainConfig};
use crate::optim::{LrSchedule, SgdConfig};
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

/// The metadata key a recorded recipe is recognised by: checkpoints from before the recipe
/// was recorded lack it.
const LR_KEY: &str = "lr";

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
        for (key, value) in [
            (LR_KEY, self.lr.to_string()),
            ("lr_schedule", self.lr_schedule.to_string()),
            ("warmup_steps", self.warmup_steps.to_string()),
            ("momentum", self.sgd.momentum.to_string()),
            ("weight_decay", self.sgd.weight_decay.to_string()),
            ("nesterov", self.sgd.nesterov.to_string()),
            ("augment", self.augment.to_string()),
        ] {
            meta.insert(key.into(), value);
        }
    }

    /// The recipe recorded in checkpoint metadata: `None` for a checkpoint from before it was
    /// recorded; an entry that does not read back is named (the caller says which file).
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<Option<Self>, String> {
        if !meta.contains_key(LR_KEY) {
            return Ok(None);
        }
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
        Ok(Some(Self {
            lr: value(meta, LR_KEY)?,
            lr_schedule: LrSchedule::parse(text("lr_schedule")?)
                .map_err(|e| format!("metadata 'lr_schedule': {e}"))?,
            warmup_steps: value(meta, "warmup_steps")?,
            sgd: SgdConfig {
                momentum: value(meta, "momentum")?,
                weight_decay: value(meta, "weight_decay")?,
                nesterov: value(meta, "nesterov")?,
            },
            augment: Augment::parse(text("augment")?)
                .map_err(|e| format!("metadata 'augment': {e}"))?,
        }))
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
        "resuming for the {planned} epochs the checkpoint's run was started for (--epochs \
         gives another count)"
    ))
}

/// Every recipe setting not given takes the checkpoint's run's value (`recorded`); one given
/// with another value is warned about. Refuses a mix that no run could have been given
/// (Nesterov momentum without momentum), naming both sides.
pub fn follow_recipe(cfg: &mut TrainConfig, recorded: &Recipe) -> Result<Followed, String> {
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
    let r = recorded;
    if follow("--lr", given.lr, r.lr.to_string(), cfg.lr.to_string()) {
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
    let (then, now) = (r.sgd.momentum.to_string(), cfg.sgd.momentum.to_string());
    if follow("--momentum", given.momentum, then, now) {
        cfg.sgd.momentum = r.sgd.momentum;
    }
    let (then, now) = (
        r.sgd.weight_decay.to_string(),
        cfg.sgd.weight_decay.to_string(),
    );
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
    if cfg.sgd.nesterov && cfg.sgd.momentum == 0.0 {
        return Err(format!(
            "Nesterov momentum needs --momentum > 0: the resumed run's momentum is {} and \
             --nesterov {} ({}); give both --momentum and --nesterov",
            cfg.sgd.momentum,
            cfg.sgd.nesterov,
            if given.nesterov {
                "--nesterov given, --momentum the checkpoint's run's"
            } else {
                "--momentum given, --nesterov the checkpoint's run's"
            }
        ));
    }
    let mut followed = Followed::default();
    if !taken.is_empty() {
        followed.notes.push(format!(
            "resuming with the checkpoint's run's {} (a flag given again changes one)",
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
    Ok(followed)
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
    fn a_recipe_reads_back_as_written_and_an_older_checkpoint_has_none() {
        let mut meta = HashMap::new();
        assert_eq!(Recipe::from_metadata(&meta), Ok(None));
        recipe().write_metadata(&mut meta);
        assert_eq!(Recipe::from_metadata(&meta), Ok(Some(recipe())));
        meta.insert("momentum".into(), "fast".into());
        assert_eq!(
            Recipe::from_metadata(&meta),
            Err("metadata 'momentum' missing or not valid".into())
        );
        meta.insert("momentum".into(), "0.8".into());
        meta.insert("augment".into(), "spin".into());
        let err = Recipe::from_metadata(&meta).unwrap_err();
        assert!(err.starts_with("metadata 'augment': "), "{err}");
    }

    #[test]
    fn settings_not_given_follow_the_run_and_given_ones_win_with_a_warning() {
        let mut cfg = config(|o| o.lr = Some(0.01));
        let followed = follow_recipe(&mut cfg, &recipe()).unwrap();
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
        let followed = follow_recipe(&mut same, &recipe()).unwrap();
        assert!(followed.notes.is_empty() && followed.warnings.is_empty());
    }

    #[test]
    fn nesterov_given_over_a_run_without_momentum_is_refused() {
        let plain = Recipe {
            sgd: SgdConfig {
                momentum: 0.0,
                weight_decay: 0.0,
                nesterov: false,
            },
            ..recipe()
        };
        let mut cfg = config(|o| o.nesterov = Some(true));
        let err = follow_recipe(&mut cfg, &plain).unwrap_err();
        assert!(
            err.contains("momentum is 0") && err.contains("--nesterov given"),
            "{err}"
        );
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
