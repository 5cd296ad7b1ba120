//! Committed state (`--commit-every K`): a restart point every K steps, written while training
//! goes on.
//!
//! Every K global steps, global worker 0 copies its replica's state (weights, momentum,
//! BatchNorm statistics, the position in training) into a buffer it owns, and hands the buffer
//! to a writer thread, which writes it as a checkpoint, `commit-stepNNNNNNNNN.safetensors`,
//! atomically, beside the epoch checkpoints, and deletes all but the newest `--keep-commits`
//! (`config::DEFAULT_KEEP_COMMITS`: two). A run that
//! is interrupted (a lost host, a killed process) continues from the newest complete one with
//! `--resume` at most K steps back: [`super::rundir::newest_restart_point`] is what `dptrain launch` restarts
//! from.
//!
//! Why worker 0 alone: every replica is bit-identical after each update (the reducer's
//! contract), so one copy is the state of all of them. Why a copy and a thread: the write
//! (serialising, checksumming, fsync) takes milliseconds per megabyte and the copy a memcpy;
//! the step waits only when both buffers are still being written, i.e. when K steps take less
//! than a write. Two buffers, reused: after the first two commits nothing is allocated.
//!
//! Why this continues exactly: the data order of an epoch is a function of (seed, epoch) and
//! the global batch alone, never of the worker count, so (epoch, steps done in it) is the whole
//! sampler state; dropout masks and augmentation draws are functions of the step and sample
//! index; the learning rate of the step count. A commit is never taken at an epoch's last
//! step: the epoch's end (evaluation, epoch checkpoint) belongs to the epoch, and a run
//! resumed there would report that epoch's training loss over no steps.

use super::checkpoint::{Checkpoint, CheckpointError, OptimizerState, TrainState};
use super::description::ModelDescription;
use super::event::Event;
use super::rundir::AbandonedRestartPoints;
pub use super::rundir::{commit_path, commit_step};
use crate::nn::Net;
use crossbeam_channel::Sender;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Buffers in flight between the worker and the writer.
const BUFFERS: usize = 2;

/// Whether the commit due after `global_step` completed steps should be taken: every `every`
/// steps (0: never), not at the last step of an epoch of `steps_per_epoch`.
pub fn due(every: usize, global_step: usize, steps_per_epoch: usize) -> bool {
    every > 0
        && global_step > 0
        && global_step.is_multiple_of(every)
        && !global_step.is_multiple_of(steps_per_epoch.max(1))
}

/// Deletes the commits in `dir` older than the newest `keep` up to `global_step`. (Commits of
/// later steps are an abandoned continuation's, which
/// [`super::rundir::AbandonedRestartPoints`] removes; the
/// filter keeps this function from deleting a newer run's restart points all the same.)
fn prune(dir: &Path, keep: usize, global_step: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut steps: Vec<usize> = entries
        .filter_map(|e| commit_step(&e.ok()?.file_name().to_string_lossy()))
        .filter(|&s| s <= global_step)
        .collect();
    steps.sort_unstable();
    let old = steps.len().saturating_sub(keep);
    for &s in &steps[..old] {
        let _ = std::fs::remove_file(commit_path(dir, s));
    }
}

/// Global worker 0's committer: the two buffers and the writer thread.
pub struct Committer {
    to_writer: Option<SyncSender<Checkpoint>>,
    returned: Receiver<Checkpoint>,
    made: usize,
    writer: Option<JoinHandle<Result<(), CheckpointError>>>,
}

impl Committer {
    /// Starts the writer thread, which writes commits into `dir` and keeps the newest `keep`;
    /// the first it writes supersedes the `abandoned` commits (a removal that fails is a
    /// warning on `events`).
    pub fn start(
        dir: PathBuf,
        keep: usize,
        abandoned: Option<(Arc<AbandonedRestartPoints>, Sender<Event>)>,
    ) -> Result<Self, String> {
        // One buffer may wait while the other is written: the step blocks only when both are.
        let (to_writer, jobs) = mpsc::sync_channel::<Checkpoint>(BUFFERS - 1);
        let (back, returned) = mpsc::sync_channel::<Checkpoint>(BUFFERS);
        let writer = std::thread::Builder::new()
            .name("commit-writer".into())
            .spawn(move || {
                for ck in jobs {
                    let step = ck.state.global_step;
                    if let Some((a, _)) = &abandoned {
                        a.rewriting_commit(step);
                    }
                    let saved = ck.save(&commit_path(&dir, step));
                    if let Some((a, events)) = &abandoned {
                        for failed in a.commit_written(step, saved.is_ok()) {
                            let _ = events.send(Event::Warning(failed));
                        }
                    }
                    saved?;
                    prune(&dir, keep, step);
                    let _ = back.send(ck);
                }
                Ok(())
            })
            .map_err(|e| format!("cannot start the commit writer thread: {e}"))?;
        Ok(Self {
            to_writer: Some(to_writer),
            returned,
            made: 0,
            writer: Some(writer),
        })
    }

    /// Copies `net` and `momentum` at `state` into a free buffer (waiting for one if both are
    /// being written) and hands it to the writer. Fails with the writer's error if an earlier
    /// commit could not be written.
    pub fn commit(
        &mut self,
        state: TrainState,
        net: &Net,
        optimizer: OptimizerState<'_>,
        description: impl FnOnce() -> ModelDescription,
    ) -> Result<(), CheckpointError> {
        let buffer = match self.returned.try_recv() {
            Ok(b) => Some(b),
            Err(_) if self.made < BUFFERS => None,
            // Both buffers out: wait for the writer; a closed channel is its failure.
            Err(_) => match self.returned.recv() {
                Ok(b) => Some(b),
                Err(_) => return self.writer_failure(),
            },
        };
        let ck = match buffer {
            Some(mut b) => {
                b.recapture(state, net, optimizer);
                b
            }
            None => {
                self.made += 1;
                Checkpoint::capture(state, net, optimizer).with_description(description())
            }
        };
        let sent = self
            .to_writer
            .as_ref()
            .is_some_and(|tx| tx.send(ck).is_ok());
        if sent {
            Ok(())
        } else {
            self.writer_failure()
        }
    }

    /// Waits for the last commit to be written; its error, if any.
    pub fn finish(mut self) -> Result<(), CheckpointError> {
        self.to_writer = None;
        self.join()
    }

    fn writer_failure(&mut self) -> Result<(), CheckpointError> {
        self.to_writer = None;
        self.join()?;
        Err(CheckpointError::Write(
            "the commit writer thread ended early".into(),
        ))
    }

    fn join(&mut self) -> Result<(), CheckpointError> {
        match self.writer.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(panic)) => Err(CheckpointError::Write(format!(
                "the commit writer thread panicked: {}",
                crate::parallel::panic_message(&*panic)
            ))),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.to_writer = None;
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_names_round_trip_and_reject_others() {
        let p = commit_path(Path::new("/r"), 120);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "commit-step000000120.safetensors");
        assert_eq!(commit_step(name), Some(120));
        assert_eq!(commit_step("commit-step.safetensors"), None);
        assert_eq!(commit_step("commit-step12x.safetensors"), None);
        assert_eq!(commit_step("checkpoint-epoch0001.safetensors"), None);
    }

    #[test]
    fn commits_are_due_every_k_steps_but_never_at_an_epoch_end() {
        let due_at: Vec<usize> = (0..=40).filter(|&g| due(10, g, 25)).collect();
        assert_eq!(due_at, vec![10, 20, 30, 40]);
        assert!(!due(5, 25, 25), "the epoch's end is the epoch checkpoint's");
        assert!(!due(0, 10, 25));
    }

    #[test]
    fn pruning_keeps_the_newest_and_ignores_later_steps() {
        let dir = std::env::temp_dir().join(format!("dptrain-commit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for s in [10, 20, 30, 90] {
            std::fs::write(commit_path(&dir, s), b"x").unwrap();
        }
        prune(&dir, 2, 30);
        let mut left: Vec<usize> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| commit_step(&e.unwrap().file_name().to_string_lossy()))
            .collect();
        left.sort_unstable();
        assert_eq!(left, vec![20, 30, 90]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
