//! The solver: SGD with momentum, weight decay and Nesterov, and learning-rate schedules.
//!
//! The update reads gradients from one flat buffer (the same memory the gradient buckets are
//! reduced in) and writes the parameters in place through a candle in-place op, so a step
//! allocates nothing.

use crate::nn::Param;
use candle_core::{CpuStorage, InplaceOp1, Layout, Result};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

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

/// SGD with momentum buffers kept per parameter, in parameter order.
pub struct Sgd {
    cfg: SgdConfig,
    momentum: Vec<Vec<f32>>,
}

/// Updates one parameter in place: PyTorch's SGD, step for step.
struct SgdUpdate<'a> {
    grad: &'a [f32],
    momentum: RefCell<&'a mut [f32]>,
    lr: f32,
    grad_scale: f32,
    cfg: SgdConfig,
}

impl InplaceOp1 for SgdUpdate<'_> {
    fn name(&self) -> &'static str {
        "dptrain-sgd-update"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("sgd: parameters must be f32");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("sgd: parameters must be contiguous");
        };
        let w = &mut data[start..end];
        if w.len() != self.grad.len() {
            candle_core::bail!(
                "sgd: parameter has {} elements, gradient {}",
                w.len(),
                self.grad.len()
            );
        }
        let mut mom = self.momentum.borrow_mut();
        let SgdConfig {
            momentum: mu,
            weight_decay: wd,
            nesterov,
        } = self.cfg;
        for ((w, &g), m) in w.iter_mut().zip(self.grad).zip(mom.iter_mut()) {
            let d = g * self.grad_scale + wd * *w;
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
            *w -= self.lr * step;
        }
        Ok(())
    }
}

impl Sgd {
    /// Makes an optimiser for `params` with zeroed momentum buffers.
    pub fn new(cfg: SgdConfig, params: &[Param]) -> Self {
        Self {
            cfg,
            momentum: params.iter().map(|p| vec![0.0; p.numel()]).collect(),
        }
    }

    /// The momentum buffers, in parameter order (for checkpoints).
    pub fn momentum(&self) -> &[Vec<f32>] {
        &self.momentum
    }

    /// Replaces the momentum buffers (from a checkpoint); lengths must match.
    pub fn set_momentum(&mut self, m: Vec<Vec<f32>>) -> std::result::Result<(), String> {
        if m.len() != self.momentum.len()
            || m.iter()
                .zip(&self.momentum)
                .any(|(a, b)| a.len() != b.len())
        {
            return Err("optimizer state does not match the model's parameters".into());
        }
        self.momentum = m;
        Ok(())
    }

    /// One step: `grad(i)` is parameter i's gradient (a lookup, so a step builds no list),
    /// multiplied by `grad_scale` first (1/N to turn a sum over N workers into a mean).
    pub fn step<'g>(
        &mut self,
        params: &[Param],
        grad: impl Fn(usize) -> &'g [f32],
        lr: f32,
        grad_scale: f32,
    ) -> Result<()> {
        for (i, (p, m)) in params.iter().zip(self.momentum.iter_mut()).enumerate() {
            let op = SgdUpdate {
                grad: grad(i),
                momentum: RefCell::new(m.as_mut_slice()),
                lr,
                grad_scale,
                cfg: self.cfg,
            };
            p.var.as_tensor().inplace_op1(&op)?;
        }
        Ok(())
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

impl LrSchedule {
    /// Parses `constant`, `cosine` or `step:E1,E2[:gamma]` (gamma defaults to 0.1).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!("bad --lr-schedule '{s}': use constant, cosine, or step:E1,E2[:GAMMA] (e.g. step:5,8:0.1)")
        };
        match s {
            "constant" => Ok(Self::Constant),
            "cosine" => Ok(Self::Cosine),
            _ => {
                let rest = s.strip_prefix("step:").ok_or_else(bad)?;
                let mut parts = rest.split(':');
                let milestones = parts
                    .next()
                    .ok_or_else(bad)?
                    .split(',')
                    .map(|e| e.trim().parse::<usize>().map_err(|_| bad()))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let gamma = parts
                    .next()
                    .map_or(Ok(0.1), |g| g.parse::<f32>().map_err(|_| bad()))?;
                if parts.next().is_some()
                    || gamma.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
                {
                    return Err(bad());
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
    use candle_core::{Device, Var};

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
        let var = Var::from_vec(vec![1.0f32, -2.0], 2, &Device::Cpu).unwrap();
        let p = Param {
            name: "w".into(),
            var: var.clone(),
        };
        let mut opt = Sgd::new(cfg, std::slice::from_ref(&p));
        let g = [1.0f32, 0.5]; // scaled by 0.5 below
        let mut w = [1.0f64, -2.0];
        let mut m = [0.0f64, 0.0];
        for _ in 0..2 {
            opt.step(std::slice::from_ref(&p), |_| &g, 0.1, 0.5)
                .unwrap();
            for i in 0..2 {
                let d = g[i] as f64 * 0.5 + 0.01 * w[i];
                m[i] = 0.9 * m[i] + d;
                w[i] -= 0.1 * (d + 0.9 * m[i]);
            }
        }
        let got = var.as_tensor().to_vec1::<f32>().unwrap();
        for i in 0..2 {
            assert!((got[i] as f64 - w[i]).abs() < 1e-6, "{got:?} vs {w:?}");
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
    }
}
