//! `--schedule priority` on the worker's side (the idea and the order are in
//! [`crate::parallel::schedule`]): the update of a step moves into the next step's forward.
//!
//! The communication thread reduces the partitions nearest the input first (see
//! `PriorityStep` in the reducer). Backward's buckets are not waited for: [`defer`] notes the
//! step's learning rate, and the next forward, before each layer, waits for that layer's bucket
//! and applies its update ([`apply_for_block`]). Whatever the forward did not need, and
//! everything before a checkpoint, a commit or an evaluation, is applied by [`drain`], so the
//! weights anyone reads between steps are the whole step's.
//!
//! [`defer`]: PriorityUpdates::defer
//! [`apply_for_block`]: PriorityUpdates::apply_for_block
//! [`drain`]: PriorityUpdates::drain

use super::error::StepError;
use crate::nn::ParamBlock;
use crate::optim::Sgd;
use crate::parallel::Reducer;
use std::time::{Duration, Instant};

/// A step whose buckets are away, to be applied by the next forward.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    lr: f32,
    loss: f32,
}

/// The worker's priority-scheduling state (inert under `--schedule overlap`).
pub(super) struct PriorityUpdates {
    active: bool,
    deferred: Option<Deferred>,
    /// Which of the deferred step's buckets have been applied.
    applied: Vec<bool>,
    /// Time spent applying updates since [`PriorityUpdates::take_update_time`].
    update_time: Duration,
}

impl PriorityUpdates {
    /// For a reducer of `buckets` buckets; `active`: `--schedule priority`.
    pub fn new(active: bool, buckets: usize) -> Self {
        Self {
            active,
            deferred: None,
            applied: vec![false; buckets],
            update_time: Duration::ZERO,
        }
    }

    /// Whether this step runs under priority scheduling (its update deferred).
    pub fn active(&self) -> bool {
        self.active
    }

    /// Whether a step's update is still away (its buckets not all applied).
    pub fn deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// After backward under priority scheduling: the step's buckets are away; the next forward
    /// applies them at `lr` (`loss` names the step if a gradient is not finite).
    pub fn defer(&mut self, lr: f32, loss: f32) {
        self.deferred = Some(Deferred { lr, loss });
        self.applied.fill(false);
    }

    /// The forward's gate before the layer of parameter block `b`: waits for the bucket
    /// holding `b` and applies the deferred update of all its blocks, once.
    pub fn apply_for_block(
        &mut self,
        b: usize,
        reducer: &mut Reducer,
        sgd: &mut Sgd,
        params: &mut [f32],
        blocks: &[ParamBlock],
    ) -> Result<(), StepError> {
        let Some(deferred) = self.deferred else {
            return Ok(());
        };
        let bucket = reducer.plan().slots[b].bucket;
        if self.applied[bucket] {
            return Ok(());
        }
        reducer.wait_bucket(bucket)?;
        let started = Instant::now();
        let which = &reducer.plan().buckets[bucket].blocks;
        // The reduced gradient is bit-identical on every worker, so every worker stops alike.
        if !which
            .iter()
            .all(|&k| reducer.grad(k).iter().all(|v| v.is_finite()))
        {
            return Err(StepError::NonFiniteGradient {
                loss: deferred.loss,
            });
        }
        // The loss is a mean over the global batch, so the sum over workers is the gradient
        // itself (scale 1), as in the whole update.
        sgd.step_blocks(params, blocks, which, |k| reducer.grad(k), deferred.lr, 1.0);
        self.applied[bucket] = true;
        self.update_time += started.elapsed();
        Ok(())
    }

    /// Applies every deferred bucket not applied yet (before backward writes the buckets again,
    /// and before anything reads the weights between steps).
    pub fn drain(
        &mut self,
        reducer: &mut Reducer,
        sgd: &mut Sgd,
        params: &mut [f32],
        blocks: &[ParamBlock],
    ) -> Result<(), StepError> {
        if self.deferred.is_none() {
            return Ok(());
        }
        for b in 0..blocks.len() {
            self.apply_for_block(b, reducer, sgd, params, blocks)?;
        }
        self.deferred = None;
        Ok(())
    }

    /// The time spent applying updates since the last call.
    pub fn take_update_time(&mut self) -> Duration {
        std::mem::take(&mut self.update_time)
    }
}
