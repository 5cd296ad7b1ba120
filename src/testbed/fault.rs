//! Fault injection for the reliability tests (`--inject-fault`, hidden from `--help`).
//!
//! A fault is a phase, a global step and optionally a worker: `forward@3`, `backward@3:1`,
//! `comm@2` (the communication thread panics while reducing a bucket), `data@4` (a loader
//! fails), or `slow-checkpoint` (checkpoint writes pause between chunks, so a test can kill the
//! process mid-write). Injected faults are panics or errors exactly like real ones, so the tests
//! exercise the real failure paths.

/// Where a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPhase {
    /// A panic in the worker's forward pass.
    Forward,
    /// A panic in the worker's backward pass.
    Backward,
    /// A panic on the communication thread during a bucket's reduction.
    Comm,
    /// A loader failure for the worker's batch.
    Data,
    /// Checkpoint writes slowed down (no failure by itself).
    SlowCheckpoint,
}

/// An `--inject-fault` that is not a fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--inject-fault '{0}': use forward|backward|comm|data@STEP[:WORKER] or slow-checkpoint")]
pub struct BadFault(pub String);

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Phase.
    pub phase: FaultPhase,
    /// Global step (from 0) at which it strikes.
    pub step: usize,
    /// Worker it strikes (all workers when `None`).
    pub worker: Option<usize>,
}

impl Fault {
    /// Parses `PHASE@STEP[:WORKER]` or `slow-checkpoint`.
    pub fn parse(s: &str) -> Result<Self, BadFault> {
        let bad = || BadFault(s.to_string());
        if s == "slow-checkpoint" {
            return Ok(Self {
                phase: FaultPhase::SlowCheckpoint,
                step: 0,
                worker: None,
            });
        }
        let (phase, rest) = s.split_once('@').ok_or_else(bad)?;
        let phase = match phase {
            "forward" => FaultPhase::Forward,
            "backward" => FaultPhase::Backward,
            "comm" => FaultPhase::Comm,
            "data" => FaultPhase::Data,
            _ => return Err(bad()),
        };
        let (step, worker) = match rest.split_once(':') {
            Some((st, w)) => (st, Some(w.parse().map_err(|_| bad())?)),
            None => (rest, None),
        };
        Ok(Self {
            phase,
            step: step.parse().map_err(|_| bad())?,
            worker,
        })
    }

    /// Whether this fault strikes `phase` at global `step` on `worker`.
    pub fn hits(&self, phase: FaultPhase, step: usize, worker: usize) -> bool {
        self.phase == phase && self.step == step && self.worker.is_none_or(|w| w == worker)
    }
}

/// Panics if `fault` strikes here; the message says it was injected.
pub fn maybe_panic(fault: Option<Fault>, phase: FaultPhase, step: usize, worker: usize) {
    if fault.is_some_and(|f| f.hits(phase, step, worker)) {
        panic!("injected fault: {phase:?} at step {step} on worker {worker}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let f = Fault::parse("backward@3:1").unwrap();
        assert!(f.hits(FaultPhase::Backward, 3, 1));
        assert!(!f.hits(FaultPhase::Backward, 3, 0));
        assert!(!f.hits(FaultPhase::Forward, 3, 1));
        assert!(Fault::parse("comm@2").unwrap().hits(FaultPhase::Comm, 2, 5));
        assert_eq!(
            Fault::parse("slow-checkpoint").unwrap().phase,
            FaultPhase::SlowCheckpoint
        );
        for bad in ["x@1", "forward", "forward@x", "forward@1:y"] {
            assert!(Fault::parse(bad).is_err(), "{bad}");
        }
    }
}
