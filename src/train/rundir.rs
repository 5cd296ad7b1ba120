//! The run directory and the other outputs of a run, checked before the first step.
//!
//! A run writes `metrics.jsonl`, checkpoints, `summary.json`, `report.md` and its plots into its
//! run directory, and `--trace` wherever that points. Each of those is checked here before any
//! training (a path that cannot be written used to be found after the whole run, losing the
//! summary and report with it), and a directory that holds another run's files is refused: a
//! new run there deleted the old metrics, overwrote some checkpoints and left the later ones,
//! so "resume the latest" would have picked up the other run. `--overwrite` deletes those files
//! first instead, and says which. The directory is locked ([`super::lock`]) before any of
//! that is looked at, so a run that is still going is neither mixed with nor deleted.

use super::checkpoint::{read_state, Checkpoint, TrainState};
use super::lock::{LockError, RunDirLock};
use crate::config::TrainConfig;
use crate::output::{self, OutputError};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Why an output of the run cannot be written (found before the first step).
#[derive(Debug, thiserror::Error)]
pub enum OutputsError {
    /// The run directory cannot be made, holds another run, or a file in it cannot be written.
    #[error("--run-dir: {0}")]
    RunDir(OutputError),
    /// `--resume` without `--run-dir` continues in the checkpoint's directory, which cannot
    /// be written.
    #[error(
        "--resume continues in the checkpoint's directory {}, and {cause}: give --run-dir to \
         continue the run in another directory",
        dir.display()
    )]
    ResumeDir {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// Why it cannot be written.
        cause: OutputError,
    },
    /// Another live run holds the run directory's lock ([`super::lock`]), or a job of
    /// `dptrain launch` finds it not held by its launcher.
    #[error(transparent)]
    InUse(LockError),
    /// The default run directory and every numbered one after it hold earlier runs.
    #[error(
        "--run-dir: {} and 9998 numbered ones hold earlier runs: choose a --run-dir",
        .0.display()
    )]
    NoFreeRunDir(PathBuf),
    /// `--overwrite` with `--resume` in the checkpoint's own directory would delete the run
    /// being continued.
    #[error(
        "--overwrite deletes the run directory's files, and with --resume in the checkpoint's \
         own directory (or no --run-dir) those are the run being continued: leave out \
         --overwrite, or give --run-dir another directory"
    )]
    OverwriteWithResume,
    /// `--overwrite` would delete the checkpoint `--weights` or `--resume` starts from.
    #[error(
        "--overwrite would delete {}, the checkpoint {flag} starts from: choose another \
         --run-dir, or move the checkpoint out of {} first",
        weights.display(),
        dir.display()
    )]
    OverwriteDeletesWeights {
        /// The checkpoint.
        weights: PathBuf,
        /// `--weights` or `--resume`.
        flag: &'static str,
        /// The run directory.
        dir: PathBuf,
    },
    /// An earlier run's file could not be deleted (`--overwrite`).
    #[error(transparent)]
    Delete(OutputError),
    /// The trace file cannot be written.
    #[error("--trace: {0}")]
    Trace(OutputError),
    /// The trace file would be one of the run's own files.
    #[error(
        "--trace {}: that is the run's own {name}, which the run writes itself: give the trace \
         another name (e.g. {})",
        path.display(),
        path.with_file_name("trace.json").display()
    )]
    TraceIsRunFile {
        /// The trace path.
        path: PathBuf,
        /// The run file's name.
        name: String,
    },
    /// The `--trace-steps` window misses every step of the run.
    #[error(
        "--trace-steps {}..{} misses every step of this run: it runs global steps {}..{} \
         ({steps_per_epoch} per epoch, counted from 0 over all epochs); choose a window inside \
         them",
        window.start,
        window.end,
        steps.start,
        steps.end
    )]
    TraceMissesRun {
        /// The window asked for.
        window: Range<usize>,
        /// The run's global steps.
        steps: Range<usize>,
        /// Steps per epoch.
        steps_per_epoch: usize,
    },
}

pub use super::run_files::RUN_FILES;

/// The kind of the run's file named `name` (a checkpoint, a commit or one of [`RUN_FILES`]);
/// `None` for a name a run does not write.
pub fn kind_of(name: &str) -> Option<&'static output::Kind> {
    if is_checkpoint_name(name) || commit_step(name).is_some() {
        return Some(&super::checkpoint::CHECKPOINT_FILE);
    }
    RUN_FILES.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
}

/// Path of the commit after `global_step` steps in `dir`.
pub fn commit_path(dir: &Path, global_step: usize) -> PathBuf {
    dir.join(format!("commit-step{global_step:09}.safetensors"))
}

/// The step count of a commit file's name (`commit-stepNNNNNNNNN.safetensors`), else `None`.
pub fn commit_step(name: &str) -> Option<usize> {
    let digits = name
        .strip_prefix("commit-step")?
        .strip_suffix(".safetensors")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// True for the name of a checkpoint file (`checkpoint-epochNNNN.safetensors`).
pub fn is_checkpoint_name(name: &str) -> bool {
    name.strip_prefix("checkpoint-epoch")
        .and_then(|n| n.strip_suffix(".safetensors"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The epoch checkpoints in `dir` (`checkpoint-epochNNNN.safetensors`), each with its epoch,
/// in epoch order; none if it does not exist.
pub fn epoch_checkpoints(dir: &Path) -> Vec<(usize, PathBuf)> {
    let mut found: Vec<(usize, PathBuf)> = run_files_in(dir)
        .into_iter()
        .filter(|n| is_checkpoint_name(n))
        .filter_map(|n| {
            let digits = n
                .strip_prefix("checkpoint-epoch")?
                .strip_suffix(".safetensors")?;
            Some((digits.parse().ok()?, dir.join(&n)))
        })
        .collect();
    found.sort();
    found
}

/// The newest restart point in `dir`: of its epoch checkpoints and commits, the one with the
/// most steps done that reads back whole and checked. The positions come from the headers, so
/// only the chosen file (and any newer one that fails its check) is read in full. `None` if
/// there is none.
pub fn newest_restart_point(dir: &Path) -> Option<(PathBuf, TrainState)> {
    newest_restart_point_but(dir, None)
}

/// [`newest_restart_point`] of a run that abandons `abandoned` (a resume from an earlier
/// point): where that run continues from.
pub fn newest_restart_point_but(
    dir: &Path,
    abandoned: Option<&AbandonedRestartPoints>,
) -> Option<(PathBuf, TrainState)> {
    restart_points(dir)
        .into_iter()
        .filter(|(p, _)| !abandoned.is_some_and(|a| a.holds(p)))
        .find(|(p, _)| Checkpoint::load(p).is_ok())
}

/// The epoch checkpoints and commits in `dir` whose headers read, newest first (of equal
/// steps, the later name: a commit sorts after a checkpoint); their tensors unchecked.
fn restart_points(dir: &Path) -> Vec<(PathBuf, TrainState)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, TrainState)> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            (commit_step(&name).is_some() || is_checkpoint_name(&name)).then(|| dir.join(name))
        })
        .filter_map(|p| {
            let state = read_state(&p).ok()?;
            Some((p, state))
        })
        .collect();
    found.sort_by(|a, b| (b.1.global_step, &b.0).cmp(&(a.1.global_step, &a.0)));
    found
}

/// The restart points a resumed run found past the step it resumed from: the future of a
/// continuation it abandons, which it trains again. None is named as where the run continues
/// (the line a signal prints, a failure's message) unless this run has written it again. The
/// commits stay until this run writes its first restart point (a commit or an epoch
/// checkpoint), which supersedes them: a resume that fails before then, or writes none
/// (`--no-checkpoints`), loses none of them. An epoch checkpoint is replaced only where this
/// run writes that epoch's. Global worker 0's epoch checkpoints and its commit writer thread
/// share this (one lock): whichever writes first removes the commits, once, never the one the
/// writer is replacing (it is the abandoned file until the rename, this run's after).
#[derive(Debug)]
pub struct AbandonedRestartPoints {
    dir: PathBuf,
    listed: std::sync::Mutex<Listed>,
}

/// What [`AbandonedRestartPoints`] still holds, as found (by the names they have).
#[derive(Debug, Default)]
struct Listed {
    /// The commits still there.
    commits: Vec<PathBuf>,
    /// The epoch checkpoints this run has not written again, with their epochs.
    epochs: Vec<(usize, PathBuf)>,
    /// The commit the writer is replacing now (listed until its write is done).
    writing: Option<PathBuf>,
    /// Whether this run has written a restart point: a commit left after that goes at once.
    superseded: bool,
}

impl AbandonedRestartPoints {
    /// The commits in `dir` past `global_step` and the epoch checkpoints past `epoch`; `None`
    /// where there are none.
    pub fn find(dir: &Path, global_step: usize, epoch: usize) -> Option<Self> {
        let mut commits: Vec<(usize, PathBuf)> = run_files_in(dir)
            .into_iter()
            .filter_map(|n| Some((commit_step(&n)?, dir.join(n))))
            .filter(|&(s, _)| s > global_step)
            .collect();
        commits.sort();
        let epochs: Vec<(usize, PathBuf)> = epoch_checkpoints(dir)
            .into_iter()
            .filter(|&(e, _)| e > epoch)
            .collect();
        let listed = Listed {
            commits: commits.into_iter().map(|(_, p)| p).collect(),
            epochs,
            ..Listed::default()
        };
        (!listed.commits.is_empty() || !listed.epochs.is_empty()).then(|| Self {
            dir: dir.to_path_buf(),
            listed: std::sync::Mutex::new(listed),
        })
    }

    fn listed(&self) -> std::sync::MutexGuard<'_, Listed> {
        self.listed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The commits, oldest first.
    pub fn commit_paths(&self) -> Vec<PathBuf> {
        self.listed().commits.clone()
    }

    /// The epoch checkpoints (epoch, path), oldest first.
    pub fn epoch_paths(&self) -> Vec<(usize, PathBuf)> {
        self.listed().epochs.clone()
    }

    /// Whether `path` is one of them still.
    pub fn holds(&self, path: &Path) -> bool {
        let listed = self.listed();
        listed.commits.iter().any(|p| p == path) || listed.epochs.iter().any(|(_, p)| p == path)
    }

    /// The writer is about to replace the commit of `step` (atomically: the abandoned file
    /// until the rename): it is not to be removed meanwhile.
    pub fn rewriting_commit(&self, step: usize) {
        self.listed().writing = Some(commit_path(&self.dir, step));
    }

    /// The writer is done with the commit of `step`: written (this run's now, and a restart
    /// point that supersedes the others), or not (the abandoned file is there still, and goes
    /// where this run has written a restart point already). Returns what could not be
    /// removed, said.
    pub fn commit_written(&self, step: usize, written: bool) -> Vec<String> {
        let path = commit_path(&self.dir, step);
        let mut listed = self.listed();
        listed.writing = None;
        if written {
            listed.commits.retain(|p| *p != path);
        } else if !listed.superseded {
            return Vec::new();
        }
        Self::supersede(&mut listed)
    }

    /// This run wrote the checkpoint of `epoch`. Returns what could not be removed, said.
    pub fn epoch_written(&self, epoch: usize) -> Vec<String> {
        let path = super::checkpoint::checkpoint_path(&self.dir, epoch);
        let mut listed = self.listed();
        listed.epochs.retain(|(_, p)| *p != path);
        Self::supersede(&mut listed)
    }

    /// This run has written a restart point: removes the commits still there but the one
    /// being replaced. Each that cannot be removed stays listed (a later restart point tries
    /// again) and is returned, said.
    fn supersede(listed: &mut Listed) -> Vec<String> {
        listed.superseded = true;
        let mut failed = Vec::new();
        let writing = listed.writing.clone();
        listed.commits.retain(|path| {
            if Some(path) == writing.as_ref() {
                return true;
            }
            match std::fs::remove_file(path) {
                Ok(()) => false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    failed.push(format!(
                        "cannot remove {}, a commit past the resumed step that this run's \
                         restart points supersede: {e} (delete it: it is not this run's)",
                        path.display()
                    ));
                    true
                }
            }
        });
        failed
    }
}

/// Where a run that a signal ends can be resumed from, for the line it says then.
#[derive(Debug, Clone)]
pub struct Continuation {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The checkpoint the run resumed from, if it did.
    pub resumed: Option<PathBuf>,
    /// Whether `--run-dir` was given (a resume of a checkpoint elsewhere goes to a default
    /// directory without it).
    pub run_dir_given: bool,
    /// Whether the run writes checkpoints (not under `--no-checkpoints`).
    pub writes_checkpoints: bool,
    /// The run's MPI processes (1: one process), which a resume needs as many of to continue
    /// as the same run.
    pub processes: usize,
    /// The restart points a resumed run abandons, never named as where it continues.
    pub abandoned: Option<std::sync::Arc<AbandonedRestartPoints>>,
}

impl Continuation {
    /// What the run says as a signal ends it: the command that resumes its newest restart
    /// point (chosen by the headers alone: the process is ending, and reads no whole
    /// checkpoint), else the checkpoint it resumed from, else that nothing resumes it yet.
    pub fn line(&self) -> String {
        let train = match self.processes {
            1 => "dptrain train".to_string(),
            n => format!("mpirun -np {n} dptrain train --transport mpi"),
        };
        let abandoned = self.abandoned.as_deref();
        let newest = restart_points(&self.run_dir)
            .into_iter()
            .find(|(p, _)| !abandoned.is_some_and(|a| a.holds(p)));
        if let Some((path, state)) = newest {
            return format!(
                "interrupted; `{train} --resume {}` resumes the run from its newest restart \
                 point ({} done, {} into the next epoch)",
                crate::terminal::shell_quoted(&path),
                crate::terminal::counted(state.epoch, "epoch"),
                crate::terminal::counted(state.step_in_epoch, "step"),
            );
        }
        if let Some(resumed) = &self.resumed {
            let run_dir = match self.run_dir_given {
                true => format!(
                    " --run-dir {}",
                    crate::terminal::shell_quoted(&self.run_dir)
                ),
                false => String::new(),
            };
            return format!(
                "interrupted before its first restart point in {}: `{train} --resume \
                 {}{run_dir}` resumes the run from where this one started",
                crate::terminal::one_line(&self.run_dir),
                crate::terminal::shell_quoted(resumed),
            );
        }
        if self.writes_checkpoints {
            format!(
                "interrupted before any checkpoint or commit: nothing in {} resumes this run \
                 (--commit-every N commits a restart point every N steps)",
                crate::terminal::one_line(&self.run_dir)
            )
        } else {
            "interrupted: under --no-checkpoints nothing resumes this run".into()
        }
    }
}

/// The files of a run found in `dir` (sorted names); empty if it does not exist.
pub fn run_files_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| kind_of(n).is_some())
        .collect();
    found.sort();
    found
}

/// A run directory checked by [`prepare`]: its lock, what `--overwrite` will delete once every
/// other check has passed ([`Prepared::clear`]), and what to tell the user.
#[derive(Debug, Default)]
pub struct Prepared {
    /// The run directory's lock, held by this run; the run keeps it until its end.
    pub lock: Option<RunDirLock>,
    /// An earlier run's files, to delete (`--overwrite`).
    pub to_delete: Vec<PathBuf>,
    /// `metrics.jsonl` of the run being resumed, whose partial last line (if any) is cut off.
    pub to_trim: Option<PathBuf>,
    /// Whether the directory holds the resumed run's files (it is the checkpoint's own, or
    /// holds a checkpoint of the same run: a copy of its directory): then its
    /// `metrics.jsonl` is that run's, whose lines past the resumed step this run writes
    /// again (cut when it writes its first, `progress.rs`).
    pub holds_the_resumed_run: bool,
    /// Things done or found that the user should know about.
    pub notes: Vec<String>,
}

impl Prepared {
    /// Deletes the earlier run's files (`--overwrite`) and cuts a torn last line off the
    /// resumed run's `metrics.jsonl` (said to `warn`); returns the notes, with what was
    /// deleted. The lock stays.
    pub fn clear(&mut self, dir: &Path, warn: &dyn Fn(&str)) -> Result<Vec<String>, OutputsError> {
        let to_delete = std::mem::take(&mut self.to_delete);
        for path in &to_delete {
            // Checked again right before: a user's file may have taken its place since.
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if let Some(kind) = name.as_deref().and_then(kind_of) {
                output::check_replaceable(path, kind).map_err(OutputsError::RunDir)?;
            }
            std::fs::remove_file(path).map_err(|cause| {
                OutputsError::Delete(OutputError::Io {
                    path: path.clone(),
                    action: "delete (--overwrite)",
                    cause,
                })
            })?;
        }
        let mut notes = std::mem::take(&mut self.notes);
        if !to_delete.is_empty() {
            let names: Vec<String> = to_delete
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            notes.push(format!(
                "--overwrite: deleted the earlier run's {} in {}",
                names.join(", "),
                dir.display()
            ));
        }
        if let Some(metrics) = self.to_trim.take() {
            let cut = output::trim_partial_line(&metrics).map_err(OutputsError::RunDir)?;
            if cut > 0 {
                warn(&format!(
                    "{} ended in a partial line ({cut} bytes, left by a run that stopped while \
                     writing it): cut off before continuing",
                    metrics.display()
                ));
            }
        }
        Ok(notes)
    }
}

/// With `--resume CKPT` and no `--run-dir`: the checkpoint's own directory, when it is a run
/// directory (the checkpoint has the name a run gives it, or a run's files are beside it),
/// which the run continues in; `None` otherwise (the default `runs/<model>-<dataset>`).
fn resume_dir(cfg: &TrainConfig) -> Option<PathBuf> {
    let ck = cfg.resume.as_deref().filter(|_| !cfg.run_dir_given)?;
    let dir = output::parent_dir(ck);
    let named = ck
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .is_some_and(|n| is_checkpoint_name(&n) || commit_step(&n).is_some());
    (named || !run_files_in(dir).is_empty()).then(|| dir.to_path_buf())
}

/// Another run's files `found` in the run directory `dir`, which `--overwrite` deletes (only
/// regular files of their kind: checked before). Without `--overwrite` they are refused,
/// naming how to continue that run; with it, refused when one of them is the checkpoint this
/// run starts from (`--weights`, or `--resume` into another directory through a link), and
/// then `--overwrite` is not offered either.
fn files_to_replace(
    cfg: &TrainConfig,
    dir: &Path,
    found: Vec<String>,
) -> Result<Vec<PathBuf>, OutputsError> {
    let paths: Vec<PathBuf> = found.iter().map(|name| dir.join(name)).collect();
    let start = match (&cfg.weights, &cfg.resume) {
        (Some(w), _) => Some((w.as_path(), "--weights")),
        (None, Some(r)) => Some((r.as_path(), "--resume")),
        (None, None) => None,
    };
    let start_among_them = start.filter(|(ck, _)| {
        let ck = ck.canonicalize().ok();
        paths
            .iter()
            .any(|p| ck.is_some() && p.canonicalize().ok() == ck)
    });
    if !found.is_empty() && !cfg.overwrite {
        // The newest restart point, a commit where the run was stopped before its first
        // epoch checkpoint (Ctrl-C in epoch 1 leaves only commits).
        let latest = newest_restart_point(dir).map(|(path, _)| path);
        let mut ways: Vec<String> = latest
            .map(|c| format!("continue it with --resume {}", c.display()))
            .into_iter()
            .collect();
        ways.push("choose another --run-dir".into());
        if start_among_them.is_none() {
            ways.push("pass --overwrite to delete them first".into());
        }
        let last = ways.pop().unwrap_or_default();
        let todo = match ways.is_empty() {
            true => last,
            false => format!("{}, or {last}", ways.join(", ")),
        };
        return Err(OutputsError::RunDir(OutputError::NotEmpty {
            path: dir.to_path_buf(),
            what: "holds the files of another run".into(),
            entries: found,
            todo,
        }));
    }
    if let Some((ck, flag)) = start_among_them {
        return Err(OutputsError::OverwriteDeletesWeights {
            weights: ck.to_path_buf(),
            flag,
            dir: dir.to_path_buf(),
        });
    }
    Ok(paths)
}

/// Whether `--overwrite` beside `--resume` would delete the run being continued: the run
/// directory is the checkpoint's own (given as such, or taken because no `--run-dir` was
/// given). Into another directory, `--overwrite` replaces the files found there.
fn overwrite_deletes_resumed_run(cfg: &TrainConfig) -> bool {
    let Some(ck) = cfg.resume.as_deref() else {
        return false;
    };
    if !cfg.run_dir_given {
        return true;
    }
    // The directory it was named in, and the one it is in (a link to a checkpoint elsewhere).
    let canonical = |p: &Path| p.canonicalize().ok();
    let real = canonical(ck);
    let dirs = [
        canonical(output::parent_dir(ck)),
        real.as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf),
    ];
    let run_dir = canonical(&cfg.run_dir);
    run_dir.is_some() && dirs.contains(&run_dir)
}

/// Creates the run directory (one level; two for the default `runs/<model>-<dataset>`) and
/// takes its lock, before anything in it is looked at or written: of two runs started at once
/// on a new directory, one holds it and the other is refused naming it. The default directory
/// of a new run moves to the first numbered one that neither holds an earlier run nor is
/// locked by a live one (said in a note). What this run created is removed again when the
/// lock is released, if the run wrote nothing there ([`RunDirLock::removing_on_release`]).
fn claim(
    cfg: &mut TrainConfig,
    notes: &mut Vec<String>,
) -> Result<Option<RunDirLock>, OutputsError> {
    let mut created = output::CreatedDirs::default();
    let claimed = claim_in(cfg, notes, &mut created);
    match claimed {
        Ok(Some(lock)) => Ok(Some(lock.removing_on_release(created))),
        Ok(None) => Ok(None),
        Err(e) => {
            created.remove_empty();
            Err(e)
        }
    }
}

/// [`claim`]'s work; every directory it makes is recorded in `created`.
fn claim_in(
    cfg: &mut TrainConfig,
    notes: &mut Vec<String>,
    created: &mut output::CreatedDirs,
) -> Result<Option<RunDirLock>, OutputsError> {
    let run_dir_error = OutputsError::RunDir;
    if !cfg.run_dir_given {
        let parent = output::parent_dir(&cfg.run_dir);
        if parent != Path::new(".") {
            created.create(parent).map_err(run_dir_error)?;
        }
    }
    // A resume continues beside its checkpoint (`resume_dir`) or in the directory given; one
    // of a checkpoint kept elsewhere goes to a free default directory, as a new run does.
    let beside_checkpoint = cfg
        .resume
        .as_deref()
        .is_some_and(|ck| output::parent_dir(ck) == cfg.run_dir);
    let numbered = !cfg.run_dir_given && !beside_checkpoint && !cfg.overwrite;
    if !numbered {
        // A job of `dptrain launch` works under the launcher's lock, held across its jobs.
        let Some(pid) = cfg.launched_by else {
            return take_new(&cfg.run_dir, created, !cfg.run_dir_given).map(Some);
        };
        created.create(&cfg.run_dir).map_err(run_dir_error)?;
        if !super::lock::is_held_by(&cfg.run_dir, pid) {
            return Err(lock_error(LockError::NotLaunchers {
                dir: cfg.run_dir.clone(),
                pid,
            }));
        }
        return Ok(None);
    }
    let base = cfg.run_dir.clone();
    for n in 1..10_000 {
        let dir = if n == 1 {
            base.clone()
        } else {
            let mut name = base.as_os_str().to_owned();
            name.push(format!("-{n}"));
            PathBuf::from(name)
        };
        if !run_files_in(&dir).is_empty() {
            continue;
        }
        let lock = match take_new(&dir, created, true) {
            Ok(lock) => lock,
            Err(OutputsError::InUse(_)) => continue,
            Err(e) => return Err(e),
        };
        // A run that ended between the look and the lock.
        if !run_files_in(&dir).is_empty() {
            created.forget(&dir);
            continue;
        }
        if n > 1 {
            notes.push(format!(
                "{} holds an earlier run or one still going (left as it is): this run writes \
                 to {}",
                base.display(),
                dir.display()
            ));
        }
        cfg.run_dir = dir;
        return Ok(Some(lock));
    }
    Err(OutputsError::NoFreeRunDir(base))
}

/// Creates `dir` if absent (recorded in `created`) and takes its lock. A directory this run
/// made but another run locked first is that run's to keep. A directory removed between the
/// two (a refused run removing the empty directory it had made) is made again, with its
/// parent where that is ours to make (`default_dir`: `runs/`, which the refused run may have
/// removed too).
fn take_new(
    dir: &Path,
    created: &mut output::CreatedDirs,
    default_dir: bool,
) -> Result<RunDirLock, OutputsError> {
    for _ in 0..3 {
        let parent = output::parent_dir(dir);
        if default_dir && parent != Path::new(".") {
            created.create(parent).map_err(OutputsError::RunDir)?;
        }
        created.create(dir).map_err(OutputsError::RunDir)?;
        match RunDirLock::take(dir) {
            Err(LockError::Io(OutputError::Io { ref cause, .. }))
                if cause.kind() == std::io::ErrorKind::NotFound => {}
            Err(e @ LockError::InUse { .. }) => {
                created.forget(dir);
                return Err(lock_error(e));
            }
            Err(e) => return Err(lock_error(e)),
            Ok(lock) => return Ok(lock),
        }
    }
    RunDirLock::take(dir).map_err(lock_error)
}

/// A lock that could not be taken, as the run directory's error.
fn lock_error(e: LockError) -> OutputsError {
    match e {
        LockError::InUse { .. } | LockError::NotLaunchers { .. } => OutputsError::InUse(e),
        LockError::Io(e) => OutputsError::RunDir(e),
    }
}

/// Claims the run directory (`claim`: created, locked; with `--resume CKPT` and no
/// `--run-dir`, the checkpoint's own directory, said in a note), removes temporary files that
/// killed runs left there, refuses another run's files (with `--overwrite`, lists them for
/// [`Prepared::clear`], which the caller runs once its other checks have passed, so a refused
/// run deletes nothing), and checks that every file the run writes can be written.
///
/// The default directory (no `--run-dir`) is never refused for holding an earlier run: the
/// run goes to the first free `runs/<model>-<dataset>-N` instead (said in a note), so the
/// README's first command works every time and leaves every earlier run as it was.
pub fn prepare(cfg: &mut TrainConfig) -> Result<Prepared, OutputsError> {
    if cfg.overwrite && overwrite_deletes_resumed_run(cfg) {
        return Err(OutputsError::OverwriteWithResume);
    }
    let mut notes = Vec::new();
    let continues_beside_checkpoint = resume_dir(cfg).map(|dir| cfg.run_dir = dir).is_some();
    let lock = claim(cfg, &mut notes).map_err(|e| match e {
        OutputsError::RunDir(cause) if continues_beside_checkpoint => OutputsError::ResumeDir {
            dir: cfg.run_dir.clone(),
            cause,
        },
        e => e,
    })?;
    if cfg.resume.is_some() {
        notes.push(format!("--resume: continuing in {}", cfg.run_dir.display()));
    }
    let dir = &cfg.run_dir;
    let mut to_delete = Vec::new();
    let run_dir_error = OutputsError::RunDir;
    for stale in output::remove_stale_temps(dir) {
        notes.push(format!(
            "removed {}, left by a run that was killed while writing it",
            stale.display()
        ));
    }
    let found = run_files_in(dir);
    // A file with a run's file name that dptrain did not write is the user's: refused by name
    // and kept, never taken for another run's nor deleted by --overwrite.
    for name in &found {
        if let Some(kind) = kind_of(name) {
            output::check_replaceable(&dir.join(name), kind).map_err(run_dir_error)?;
        }
    }
    // A resume into another directory with --overwrite replaces what is there, as a new
    // run's does (the checkpoint's own directory was refused above).
    let mut holds_the_resumed_run = false;
    if let Some(ck) = cfg.resume.as_deref().filter(|_| !cfg.overwrite) {
        holds_the_resumed_run = check_same_run(cfg, ck, &found).map_err(run_dir_error)?;
    }
    if cfg.resume.is_none() || cfg.overwrite {
        to_delete = files_to_replace(cfg, dir, found)?;
    }
    let mut targets: Vec<PathBuf> = RUN_FILES.iter().map(|(f, _)| dir.join(f)).collect();
    if !cfg.no_checkpoints {
        // Of the epochs' checkpoints, those there were judged with every run file above;
        // those not there yet need only the directory to take files, which the last epoch's
        // shows. Not one path per epoch: `--epochs` may be any count (a run left to Ctrl-C).
        targets.push(super::checkpoint::checkpoint_path(dir, cfg.epochs));
    }
    for t in &targets {
        output::check_file_target(t).map_err(run_dir_error)?;
    }
    // The files this run writes itself are checked to be its kind now, not when an epoch's
    // work would be lost on them (a resumed run finds its own there; one being deleted first
    // is not checked). The report's files are the report's to check.
    let summary = dir.join("summary.json");
    let checkpoints = targets.iter().filter(|t| {
        t.file_name()
            .is_some_and(|n| is_checkpoint_name(&n.to_string_lossy()))
    });
    let own = checkpoints
        .map(|t| (t, &super::checkpoint::CHECKPOINT_FILE))
        .chain([(&summary, &super::summary::SUMMARY_FILE)]);
    for (path, kind) in own.filter(|(p, _)| !to_delete.contains(p)) {
        output::check_replaceable(path, kind).map_err(run_dir_error)?;
    }
    output::check_dir_takes_files(&summary).map_err(run_dir_error)?;
    Ok(Prepared {
        lock,
        to_delete,
        to_trim: cfg.resume.is_some().then(|| dir.join("metrics.jsonl")),
        holds_the_resumed_run,
        notes,
    })
}

/// Refuses to continue the run of checkpoint `ck` in `dir`, which holds the run files `found`,
/// when `dir` is not the checkpoint's own directory and holds checkpoints, none of them of the
/// same run: the model and its layers, the [`super::checkpoint::RunIdentity`] of `ck` or,
/// under `--resume-changed`, of this run (`now`), and the recipe of `ck` or of this run (where
/// both record one: the same data trained at another rate is another run); either side
/// without a recorded identity
/// (an older checkpoint) is judged by the model and layers alone. Its metrics, summary and
/// checkpoints would be another run's, mixed with this one's (`--resume A/ck --run-dir B`,
/// where B held an earlier run, wrote lenet5's epoch 2 after vgg-small's epoch 1). A `dir`
/// without checkpoints (a continuation run with `--no-checkpoints`) is not judged, nor taken
/// for the run's. Returns whether `dir` holds the resumed run (its own directory, or a
/// checkpoint of the same run).
fn check_same_run(cfg: &TrainConfig, ck: &Path, found: &[String]) -> Result<bool, OutputError> {
    let dir = &cfg.run_dir;
    let same_dir = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let checkpoints: Vec<&String> = found
        .iter()
        .filter(|n| is_checkpoint_name(n) || commit_step(n).is_some())
        .collect();
    if same_dir(output::parent_dir(ck), dir) {
        return Ok(true);
    }
    if checkpoints.is_empty() {
        return Ok(false);
    }
    use super::checkpoint::{read_state, RunIdentity};
    let Ok(resumed) = read_state(ck) else {
        return Ok(false); // The resume's own load reports it.
    };
    let now = RunIdentity::of(cfg);
    let same_identity = |theirs: &Option<RunIdentity>| match (theirs, &resumed.run) {
        (Some(a), Some(b)) => {
            a.changes(b).is_empty() || (cfg.resume_changed && a.changes(&now).is_empty())
        }
        _ => true,
    };
    // The recipe too, where both record it: a directory of the same data, batch and seed
    // trained at another rate is another run. Its recipe may be the checkpoint's, or this
    // run's (a continuation that changed the rate, run again).
    use super::recipe::Recipe;
    let same_recipe = |theirs: &Option<RunIdentity>| {
        let recorded = |r: &Option<RunIdentity>| r.as_ref()?.recipe.read().cloned();
        match (recorded(theirs), recorded(&resumed.run)) {
            (Some(a), Some(b)) => a == b || a == Recipe::of(cfg),
            _ => true,
        }
    };
    let of_the_run = |name: &&String| {
        read_state(&dir.join(name)).is_ok_and(|s| {
            s.model == resumed.model
                && s.fingerprint == resumed.fingerprint
                && same_identity(&s.run)
                && same_recipe(&s.run)
        })
    };
    if checkpoints.iter().any(of_the_run) {
        return Ok(true);
    }
    let todo = if cfg.run_dir_given {
        "continue in the checkpoint's own directory (leave --run-dir out), give an empty \
         --run-dir, or pass --overwrite to delete them first"
    } else {
        "give an empty --run-dir"
    };
    Err(OutputError::NotEmpty {
        path: dir.to_path_buf(),
        what: format!("holds the files of another run than {}'s", ck.display()),
        entries: found.to_vec(),
        todo: todo.into(),
    })
}

/// Checks, before the first step, that the trace file of this process (`PATH`, or
/// `PATH.rankN` on MPI rank N) can be written, and returns its path.
pub fn check_trace(cfg: &TrainConfig) -> Result<Option<PathBuf>, OutputsError> {
    let Some(path) = &cfg.trace else {
        return Ok(None);
    };
    let path = trace_path(path, cfg.process_rank);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let in_run_dir = || {
        let dir = |p: &Path| p.canonicalize().ok();
        dir(output::parent_dir(&path)).is_some_and(|d| dir(&cfg.run_dir) == Some(d))
    };
    if let Some(name) = name.filter(|n| kind_of(n).is_some() || n == super::lock::LOCK_NAME) {
        if in_run_dir() {
            return Err(OutputsError::TraceIsRunFile { path, name });
        }
    }
    output::check_writable(&path, &crate::trace::TRACE_FILE).map_err(OutputsError::Trace)?;
    Ok(Some(path))
}

/// The trace file of MPI rank `rank`: rank 0 writes `path`, rank r `path.rank<r>`.
pub fn trace_path(path: &Path, rank: usize) -> PathBuf {
    if rank == 0 {
        return path.to_path_buf();
    }
    let mut p = path.to_path_buf().into_os_string();
    p.push(format!(".rank{rank}"));
    PathBuf::from(p)
}

/// Checks `--trace-steps` against the global steps the run will take (counted from 0 over all
/// epochs: `first_step` (`start_epoch * steps_per_epoch`, plus a commit's steps into it) up to
/// `epochs * steps_per_epoch`): a window that
/// misses them all is an error (it would write an empty trace after the whole run); one that
/// reaches past them is a warning, returned.
pub fn check_trace_steps(
    cfg: &TrainConfig,
    first_step: usize,
    steps_per_epoch: usize,
) -> Result<Option<String>, OutputsError> {
    if cfg.trace.is_none() {
        return Ok(None);
    }
    let steps = first_step..cfg.epochs * steps_per_epoch;
    let w = &cfg.trace_steps;
    if w.start >= steps.end || w.end <= steps.start {
        return Err(OutputsError::TraceMissesRun {
            window: w.clone(),
            steps,
            steps_per_epoch,
        });
    }
    if w.end > steps.end || w.start < steps.start {
        return Ok(Some(format!(
            "--trace-steps {}..{} reaches past this run's global steps {}..{}: only steps {}..{} \
             are traced",
            w.start,
            w.end,
            steps.start,
            steps.end,
            w.start.max(steps.start),
            w.end.min(steps.end)
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abandoned_restart_points_are_never_this_runs_and_go_with_its_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for step in [3, 5, 10] {
            std::fs::write(commit_path(dir, step), b"x").unwrap();
        }
        let epoch2 = super::super::checkpoint::checkpoint_path(dir, 2);
        std::fs::write(&epoch2, b"x").unwrap();
        // Resumed from step 4 of epoch 1: the commits 5 and 10 and epoch 2's checkpoint.
        let a = AbandonedRestartPoints::find(dir, 4, 1).unwrap();
        assert_eq!(
            a.commit_paths(),
            [commit_path(dir, 5), commit_path(dir, 10)]
        );
        assert!(a.holds(&epoch2) && !a.holds(&commit_path(dir, 3)));
        // While the commit of step 5 is being replaced, and after its write failed, the file
        // is the abandoned one: listed, and not removed.
        a.rewriting_commit(5);
        assert!(a.holds(&commit_path(dir, 5)));
        assert!(a.commit_written(5, false).is_empty());
        assert!(a.holds(&commit_path(dir, 5)) && commit_path(dir, 10).exists());
        // An epoch checkpoint written while it is replaced again removes the others, not it.
        a.rewriting_commit(5);
        assert!(a.epoch_written(7).is_empty());
        assert!(commit_path(dir, 5).exists() && !commit_path(dir, 10).exists());
        // Written: this run's, kept.
        assert!(a.commit_written(5, true).is_empty());
        assert!(commit_path(dir, 5).exists() && !a.holds(&commit_path(dir, 5)));
        assert!(a.commit_paths().is_empty() && a.holds(&epoch2));
        // Epoch 2 written again: this run's.
        assert!(a.epoch_written(2).is_empty());
        assert!(!a.holds(&epoch2) && epoch2.exists());
        assert!(AbandonedRestartPoints::find(dir, 10, 2).is_none());
    }

    #[test]
    fn an_interrupted_run_of_several_processes_is_resumed_under_mpirun() {
        let tmp = tempfile::tempdir().unwrap();
        let continuation = |processes| Continuation {
            run_dir: tmp.path().to_path_buf(),
            resumed: Some(PathBuf::from("old/ck.safetensors")),
            run_dir_given: false,
            writes_checkpoints: true,
            processes,
            abandoned: None,
        };
        let over_mpi = continuation(2).line();
        assert!(
            over_mpi.contains(
                "`mpirun -np 2 dptrain train --transport mpi --resume old/ck.safetensors`"
            ),
            "{over_mpi}"
        );
        let here = continuation(1).line();
        assert!(here.contains("`dptrain train --resume old/ck"), "{here}");
    }

    #[test]
    fn a_run_directory_another_run_holds_is_never_removed_with_a_refused_runs_own() {
        let tmp = tempfile::tempdir().unwrap();
        let (runs, dir) = (tmp.path().join("runs"), tmp.path().join("runs/x"));
        let mut theirs = output::CreatedDirs::default();
        let held = take_new(&dir, &mut theirs, true).unwrap();
        let mut ours = output::CreatedDirs::default();
        let refused = take_new(&dir, &mut ours, true);
        assert!(matches!(refused, Err(OutputsError::InUse(_))));
        // Ours made neither: nothing of theirs goes.
        ours.remove_empty();
        assert!(dir.join(super::super::lock::LOCK_NAME).is_file());
        // Theirs, released with nothing written, are removed, parent included.
        drop(held.removing_on_release(theirs));
        assert!(!runs.exists());
    }

    #[test]
    fn checkpoint_names_are_recognised() {
        assert!(is_checkpoint_name("checkpoint-epoch0003.safetensors"));
        assert!(!is_checkpoint_name("checkpoint-epoch.safetensors"));
        assert!(!is_checkpoint_name(
            ".dptrain-tmp-checkpoint-epoch0003.safetensors.1.2"
        ));
        assert!(!is_checkpoint_name("checkpoint-epochx.safetensors"));
    }
}
