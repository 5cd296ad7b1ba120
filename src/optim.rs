//! The solver: SGD with momentum, weight decay and Nesterov, and learning-rate schedules.
//!
//! The update reads each layer's gradient where the reducer left it (its bucket buffer) and
//! writes the network's flat parameter vector in place, on the worker's threads, allocating
//! nothing.

use crate::nn::ParamBlock;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// SGD hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdConfig {
    /// Momentum factor (0 disables momentum).
    pub momentum: f32,
    /// L2 penalty added to the gradient (`g + wd * w`).
    pub weight_decay: f32,
    /// Nesterov momentum (PyTorch's formulation).
    pub nesterov: bool,
}

/// A setting of the solver, as its flag, a config file's key and a checkpoint's metadata
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SolverSetting {
    /// `--lr`.
    Lr,
    /// `--momentum`.
    Momentum,
    /// `--weight-decay`.
    WeightDecay,
    /// `--nesterov`.
    Nesterov,
}

impl SolverSetting {
    /// The flag's name without `--` (a config file's key).
    pub fn name(self) -> &'static str {
        match self {
            Self::Lr => "lr",
            Self::Momentum => "momentum",
            Self::WeightDecay => "weight-decay",
            Self::Nesterov => "nesterov",
        }
    }
}

/// A solver setting that cannot be trained with: which one and why. The one check, for values
/// given as flags and values a resumed checkpoint recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSetting {
    /// The setting refused.
    pub setting: SolverSetting,
    /// What the value must be, and the value.
    pub why: String,
}

impl std::fmt::Display for BadSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--{} {}", self.setting.name(), self.why)
    }
}

/// Refuses a base learning rate that is not a positive finite number.
pub fn check_lr(lr: f32) -> Result<(), BadSetting> {
    if lr > 0.0 && lr.is_finite() {
        return Ok(());
    }
    Err(BadSetting {
        setting: SolverSetting::Lr,
        why: format!("must be a positive number, not {lr}"),
    })
}

impl SgdConfig {
    /// Refuses momentum outside [0, 1), a negative or infinite weight decay, and Nesterov
    /// momentum without momentum (PyTorch refuses it too: it would be plain SGD said
    /// otherwise).
    pub fn check(&self) -> Result<(), BadSetting> {
        let bad = |setting, why| Err(BadSetting { setting, why });
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(
                SolverSetting::Momentum,
                format!("must be in [0, 1), not {}", self.momentum),
            );
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(
                SolverSetting::WeightDecay,
                format!("must be >= 0, not {}", self.weight_decay),
            );
        }
        if self.nesterov && self.momentum == 0.0 {
            return bad(
                SolverSetting::Nesterov,
                "true needs a --momentum above 0 (Nesterov momentum without momentum): give \
                 --nesterov false, or a --momentum above 0"
                    .into(),
            );
        }
        Ok(())
    }
}

/// SGD with a momentum buffer laid out as the parameters.
pub struct Sgd {
    cfg: SgdConfig,
    momentum: Vec<f32>,
}

/// Elements per parallel task of the update.
const BLOCK: usize = 1 << 14;

impl Sgd {
    /// An optimiser for `len` parameters with zeroed momentum.
    pub fn new(cfg: SgdConfig, len: usize) -> Self {
        Self {
            cfg,
            momentum: vec![0.0; len],
        }
    }

    /// The momentum buffer (for checkpoints), laid out as the parameters.
    pub fn momentum(&self) -> &[f32] {
        &self.momentum
    }

    /// Replaces the momentum buffer (from a checkpoint); the length must match.
    pub fn set_momentum(&mut self, m: Vec<f32>) -> Result<(), String> {
        if m.len() != self.momentum.len() {
            return Err(format!(
                "optimizer state has {} values, the model {} parameters",
                m.len(),
                self.momentum.len()
            ));
        }
        self.momentum = m;
        Ok(())
    }

    /// One step, PyTorch's SGD: for each block, `grad(b)` is its gradient (a lookup, so a
    /// step builds no list), multiplied by `grad_scale` first.
    pub fn step<'g>(
        &mut self,
        params: &mut [f32],
        blocks: &[ParamBlock],
        grad: impl Fn(usize) -> &'g [f32],
        lr: f32,
        grad_scale: f32,
    ) {
        for (bi, b) in blocks.iter().enumerate() {
            self.step_block(params, b, grad(bi), lr, grad_scale);
        }
    }

    /// [`Sgd::step`] on the blocks `which` alone (indices into `blocks`). Each value's update
    /// reads only its own weight, gradient and momentum, so updating the blocks in parts, in
    /// any order, gives the bits of one whole step (`--schedule priority` updates a bucket's
    /// blocks when the bucket comes back).
    pub fn step_blocks<'g>(
        &mut self,
        params: &mut [f32],
        blocks: &[ParamBlock],
        which: &[usize],
        grad: impl Fn(usize) -> &'g [f32],
        lr: f32,
        grad_scale: f32,
    ) {
        for &bi in which {
            self.step_block(params, &blocks[bi], grad(bi), lr, grad_scale);
        }
    }

    /// One block's update from its gradient `g`.
    fn step_block(
        &mut self,
        params: &mut [f32],
        b: &ParamBlock,
        g: &[f32],
        lr: f32,
        grad_scale: f32,
    ) {
        let SgdConfig {
            momentum: mu,
            weight_decay: wd,
            nesterov,
        } = self.cfg;
        let w = &mut params[b.range.clone()];
        let m = &mut self.momentum[b.range.clone()];
        w.par_chunks_mut(BLOCK)
            .zip(m.par_chunks_mut(BLOCK))
            .zip(g.par_chunks(BLOCK))
            .for_each(|((w, m), g)| {
                for ((w, m), &g) in w.iter_mut().zip(m.iter_mut()).zip(g) {
                    let d = g * grad_scale + wd * *w;
                    let step = if mu == 0.0 {
                        d
                    } else {
                        *m = mu * *m + d;
                        if nesterov {
                            d + mu * *m
                        } else {
                            *m
                        }
                    };
                    *w -= lr * step;
                }
            });
    }
}

/// Learning-rate schedule over training progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LrSchedule {
    /// The base rate throughout.
    Constant,
    /// Multiply by `gamma` at each listed epoch.
    Step {
        /// Epochs at which the rate drops.
        milestones: Vec<usize>,
        /// Factor applied at each milestone.
        gamma: f32,
    },
    /// Cosine decay from the base rate to 0 over the run.
    Cosine,
}

/// The schedule as `--lr-schedule` takes it (`constant`, `cosine`, `step:5,8:0.1`).
impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Constant => f.write_str("constant"),
            Self::Cosine => f.write_str("cosine"),
            Self::Step { milestones, gamma } => {
                let epochs: Vec<String> = milestones.iter().map(usize::to_string).collect();
                write!(f, "step:{}:{gamma}", epochs.join(","))
            }
        }
    }
}

impl LrSchedule {
    /// Parses `constant`, `cosine` or `step:E1,E2[:gamma]` (gamma defaults to 0.1). The
    /// milestones are epochs from 1, strictly increasing (a repeated one would apply gamma
    /// twice at once, a milestone 0 before the first epoch: both are refused, as is an order
    /// that is not ascending, since it reads as a typo); gamma is in (0, 1].
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let bad = |why: &str| {
            format!("bad --lr-schedule '{s}': {why}use constant, cosine, or step:E1,E2[:GAMMA] with epochs E1 < E2 < ... from 1 and 0 < GAMMA <= 1 (e.g. step:5,8:0.1)")
        };
        match s {
            "constant" => Ok(Self::Constant),
            "cosine" => Ok(Self::Cosine),
            _ => {
                let rest = s.strip_prefix("step:").ok_or_else(|| bad(""))?;
                let mut parts = rest.split(':');
                let mut milestones: Vec<usize> = Vec::new();
                for e in parts.next().unwrap_or("").split(',').map(str::trim) {
                    let m = e
                        .parse::<usize>()
                        .map_err(|_| bad(&format!("milestone '{e}' is not a whole number; ")))?;
                    if m == 0 {
                        return Err(bad(
                            "milestone 0 would lower the rate before the first epoch; ",
                        ));
                    }
                    if let Some(&last) = milestones.last() {
                        if m <= last {
                            let why = if m == last {
                                " (a repeated milestone would apply gamma twice at once)"
                            } else {
                                " (milestones go in increasing order)"
                            };
                            return Err(bad(&format!(
                                "milestone {m} does not come after {last}{why}; "
                            )));
                        }
                    }
                    milestones.push(m);
                }
                let gamma = parts.next().map_or(Ok(0.1), |g| {
                    g.parse::<f32>()
                        .map_err(|_| bad(&format!("gamma '{g}' is not a number; ")))
                })?;
                if parts.next().is_some() {
                    return Err(bad("more than two ':'; "));
                }
                if !(gamma > 0.0 && gamma <= 1.0) {
                    return Err(bad(&format!("gamma {gamma} is outside (0, 1]; ")));
                }
                Ok(Self::Step { milestones, gamma })
            }
        }
    }

    /// Learning rate at global step `step` of `total` steps with `steps_per_epoch`, after a
    /// linear warm-up of `warmup` steps from 0.
    pub fn lr(
        &self,
        base: f32,
        step: usize,
        total: usize,
        steps_per_epoch: usize,
        warmup: usize,
    ) -> f32 {
        let scheduled = match self {
            Self::Constant => base,
            Self::Step { milestones, gamma } => {
                let epoch = step / steps_per_epoch.max(1);
                base * gamma.powi(milestones.iter().filter(|&&m| epoch >= m).count() as i32)
            }
            Self::Cosine => {
                let t = step as f32 / total.max(1) as f32;
                base * 0.5 * (1.0 + (std::f32::consts::PI * t.min(1.0)).cos())
            }
        };
        if step < warmup {
            scheduled * (step + 1) as f32 / warmup as f32
        } else {
            scheduled
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_matches_pytorch_formulas() {
        // Two steps of PyTorch's SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True) on
        // w = [1, -2] with gradients [0.5, 0.25] then [0.5, 0.25], worked out by hand:
        // d1 = g + wd*w; m1 = d1; w1 = w - lr*(d1 + mu*m1); d2 = g + wd*w1; m2 = mu*m1 + d2; ...
        let cfg = SgdConfig {
            momentum: 0.9,
            weight_decay: 0.01,
            nesterov: true,
        };
        let block = ParamBlock {
            name: "w".into(),
            node: 1,
            exec: 0,
            range: 0..2,
            state_range: 0..0,
            tensors: Vec::new(),
            state_tensors: Vec::new(),
        };
        let mut params = vec![1.0f32, -2.0];
        let mut opt = Sgd::new(cfg, 2);
        let g = [1.0f32, 0.5]; // scaled by 0.5 below
        let mut w = [1.0f64, -2.0];
        let mut m = [0.0f64, 0.0];
        for _ in 0..2 {
            opt.step(&mut params, std::slice::from_ref(&block), |_| &g, 0.1, 0.5);
            for i in 0..2 {
                let d = g[i] as f64 * 0.5 + 0.01 * w[i];
                m[i] = 0.9 * m[i] + d;
                w[i] -= 0.1 * (d + 0.9 * m[i]);
            }
        }
        for i in 0..2 {
            assert!(
                (params[i] as f64 - w[i]).abs() < 1e-6,
                "{params:?} vs {w:?}"
            );
        }
    }

    #[test]
    fn schedules() {
        let s = LrSchedule::parse("step:2,4:0.5").unwrap();
        assert_eq!(s.lr(1.0, 0, 60, 10, 0), 1.0);
        assert_eq!(s.lr(1.0, 25, 60, 10, 0), 0.5);
        assert_eq!(s.lr(1.0, 45, 60, 10, 0), 0.25);
        let c = LrSchedule::Cosine;
        assert!((c.lr(1.0, 50, 100, 10, 0) - 0.5).abs() < 1e-6);
        assert!(c.lr(1.0, 100, 100, 10, 0).abs() < 1e-6);
        assert!((LrSchedule::Constant.lr(1.0, 0, 100, 10, 4) - 0.25).abs() < 1e-6);
        assert!(LrSchedule::parse("step:x").is_err());
        assert!(LrSchedule::parse("linear").is_err());
        // Written as the flag takes it, and read back the same.
        for text in ["constant", "cosine", "step:2,4:0.5"] {
            let s = LrSchedule::parse(text).unwrap();
            assert_eq!(s.to_string(), text);
        }
    }
}
