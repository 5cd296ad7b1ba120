//! How a run fails, as values: what went wrong in a worker ([`WorkerError`], with the phase and
//! step it was in and its [`StepError`] cause) and how the run as a whole ended
//! ([`TrainError`]). The run's triage matches on these (a failure that only echoes another
//! worker's is [`WorkerError::is_echo`]); the binary turns them into messages (`Display`).

use super::checkpoint::CheckpointError;
use super::rundir::OutputsError;
use super::summary::Summary;
use crate::comm::CommError;
use crate::data::DataError;
use crate::model::ModelError;
use crate::pipeline::LoadError;
use std::path::PathBuf;

/// The phase a worker is in, named in its failure messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Building the replica and the first weight broadcast.
    Start,
    /// Waiting for (or collating) the step's batch.
    Data,
    /// The forward pass and the loss.
    Forward,
    /// The backward pass (buckets go to the communication thread as they fill).
    Backward,
    /// Waiting for the last bucket; tree mode's weight broadcast.
    Communication,
    /// The solver step.
    Update,
    /// Worker 0's test-set evaluation and checkpoint, and the other workers' wait for it
    /// between epochs.
    Evaluation,
    /// Global worker 0's copy of a restart point (`--commit-every`).
    Commit,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Start => "start",
            Self::Data => "data",
            Self::Forward => "forward",
            Self::Backward => "backward",
            Self::Communication => "communication",
            Self::Update => "update",
            Self::Evaluation => "evaluation",
            Self::Commit => "commit",
        })
    }
}

/// What went wrong in a step.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StepError {
    /// The input pipeline gave no batch.
    #[error(transparent)]
    Data(#[from] LoadError),
    /// The loss is NaN or infinite (and `--on-nonfinite` is `error`).
    #[error("the loss is {0}: training diverged; lower --lr (or pass --on-nonfinite skip)")]
    NonFiniteLoss(f32),
    /// The summed gradient holds NaN or infinity (and `--on-nonfinite` is `error`).
    #[error(
        "the summed gradient holds NaN or infinity (loss {loss}): training diverged; lower \
         --lr, or pass --on-nonfinite skip to skip such steps"
    )]
    NonFiniteGradient {
        /// The step's loss.
        loss: f32,
    },
    /// The backward pass failed (its gradient sink refused a block).
    #[error("{0}")]
    Backward(String),
    /// Moving or reducing gradients (or weights) failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The worker panicked (caught on its thread).
    #[error("panicked: {0}")]
    Panicked(String),
    /// The run stopped its workers (an output it must write failed; that is the cause).
    #[error("stopped by the run")]
    Stopped,
}

impl StepError {
    /// True when this failure only echoes another worker's (a peer's endpoint went away, the
    /// input pipeline stopped).
    pub fn is_echo(&self) -> bool {
        match self {
            Self::Data(e) => e.is_echo(),
            Self::Comm(e) => e.is_echo(),
            Self::Stopped => true,
            _ => false,
        }
    }
}

/// A worker's failure, as reported to the run ([`super::Event::Failed`]).
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerError {
    /// A step (or the evaluation after an epoch) failed.
    #[error("worker {rank}, {phase}, step {step}: {cause}")]
    Step {
        /// Worker.
        rank: usize,
        /// The phase it was in.
        phase: Phase,
        /// Its global step.
        step: usize,
        /// What went wrong.
        cause: StepError,
    },
    /// The broadcast making every replica equal to worker 0's failed.
    #[error("worker {rank}: initial weight broadcast: {source}")]
    InitialBroadcast {
        /// Worker.
        rank: usize,
        /// What went wrong.
        source: CommError,
    },
    /// The replica could not be built (model, emulated device, optimizer state), or its
    /// compute threads not started.
    #[error("{0}")]
    Setup(String),
    /// The checkpoint to resume from does not fit the replica.
    #[error(transparent)]
    Restore(CheckpointError),
    /// Worker 0 could not write a checkpoint.
    #[error(transparent)]
    Checkpoint(CheckpointError),
    /// The worker's thread panicked outside the step (its panic escaped the worker's own
    /// catching).
    #[error("worker {rank} panicked")]
    Escaped {
        /// Worker.
        rank: usize,
    },
}

impl WorkerError {
    /// True when this failure only echoes another worker's: a peer's endpoint went away (it
    /// failed first), or the input pipeline stopped (because another worker or a loader
    /// failed). The run reports the first failure that is not an echo.
    pub fn is_echo(&self) -> bool {
        match self {
            Self::Step { cause, .. } => cause.is_echo(),
            Self::InitialBroadcast { source, .. } => source.is_echo(),
            _ => false,
        }
    }
}

/// Why a run could not start: what is checked before the first step, so that none of it costs
/// training.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The configuration does not describe a run this process group can make.
    #[error("{0}")]
    Config(String),
    /// The dataset could not be found, read or decoded.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The data a resume took from its checkpoint's run (`taken`: the flag it took) could not
    /// be read there: moved or deleted since, most likely.
    #[error(
        "{source} (this resume took {taken} from the checkpoint's run: if the data has moved, \
         give --data-dir with where it is now and --resume-changed, as a resume cannot tell \
         moved data from other data)"
    )]
    FollowedData {
        /// The flag taken: `--data-dir DIR` or `--dataset KIND:PATH`.
        taken: String,
        /// What reading it found (boxed: a `DataError` is large).
        source: Box<DataError>,
    },
    /// The training set is smaller than one global batch.
    #[error("the training set has {samples} samples, fewer than one global batch of {batch}")]
    TooFewSamples {
        /// Training samples (after `--train-limit`).
        samples: usize,
        /// The global batch.
        batch: usize,
    },
    /// More steps in all than a step counter holds.
    #[error(
        "--epochs {epochs} of {steps_per_epoch} steps each is more steps than a run can count \
         ({max} in all): give fewer epochs (a run of many can be stopped with Ctrl-C and \
         resumed)",
        max = usize::MAX
    )]
    TooManySteps {
        /// `--epochs`.
        epochs: usize,
        /// Steps in one epoch (training samples / global batch).
        steps_per_epoch: usize,
    },
    /// An ImageFolder's test split, decoded whole before training, holds a bad sample.
    #[error(
        "the test split, decoded whole before training (--skip-bad-samples only leaves out \
         training samples): {0}"
    )]
    TestSplit(DataError),
    /// The model could not be loaded (a model file's error names the file, line and layer).
    #[error(transparent)]
    Model(Box<ModelError>),
    /// The model does not fit the dataset's samples.
    #[error(
        "{source}\n(model '{model}' on the dataset's {}x{}x{} images with {classes} classes)",
        shape[0],
        shape[1],
        shape[2]
    )]
    ModelShape {
        /// What the graph builder found.
        source: Box<ModelError>,
        /// The model's name.
        model: String,
        /// The samples' shape (C, H, W).
        shape: [usize; 3],
        /// The dataset's classes.
        classes: usize,
    },
    /// Training images the normalisation estimate could not read, without
    /// `--skip-bad-samples`.
    #[error("{0}")]
    UnreadableTraining(crate::pipeline::Unreadable),
    /// Every training image of a class is unreadable (known where the normalisation estimate
    /// read the whole set), and `--skip-bad-samples` would train without the class.
    #[error(
        "every training image of {} {} is unreadable, so --skip-bad-samples would train a \
         model that never sees it: mend them (and pack again, for a packed file), or remove \
         the class:{}",
        if .0.lost_classes.len() == 1 { "class" } else { "each of the classes" },
        .0.lost_classes.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", "),
        crate::data::listed(&.0.errors)
    )]
    UnreadableClass(crate::pipeline::Unreadable),
    /// The checkpoint to resume from cannot continue this run.
    #[error(transparent)]
    Resume(#[from] ResumeError),
    /// The checkpoint of `--weights` does not fit this run's model (boxed: its variants
    /// carry the names of both models and a layer's shapes).
    #[error(transparent)]
    Weights(Box<super::weights::WeightsError>),
    /// An output cannot be written (checked, and the run directory prepared, up front).
    #[error(transparent)]
    Outputs(#[from] OutputsError),
    /// The processes of the run could not start or do not describe the same run.
    #[error("{0}")]
    Processes(String),
    /// The run would not fit in the memory this process may take.
    #[error(transparent)]
    Memory(#[from] crate::limits::MemoryError),
    /// The emulated device's profile is not of this run.
    #[error(transparent)]
    Device(#[from] crate::testbed::device::DeviceError),
}

impl From<super::weights::WeightsError> for PrepareError {
    fn from(e: super::weights::WeightsError) -> Self {
        Self::Weights(Box::new(e))
    }
}

impl From<ModelError> for PrepareError {
    fn from(e: ModelError) -> Self {
        Self::Model(Box::new(e))
    }
}

impl From<PrepareError> for String {
    fn from(e: PrepareError) -> Self {
        e.to_string()
    }
}

/// Why a checkpoint cannot be resumed by this run.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The file could not be read or is not a valid checkpoint.
    #[error(transparent)]
    Load(#[from] CheckpointError),
    /// The checkpoint is of another model.
    #[error(
        "the checkpoint is for model '{checkpoint}', not '{now}': {}",
        resume_with(model_flag)
    )]
    OtherModel {
        /// The checkpoint's model (its name, as the model file's `name` gives it).
        checkpoint: String,
        /// This run's.
        now: String,
        /// What `--model` gave the checkpoint's run (a built-in name or the model file's
        /// path), as the checkpoint or its run's `summary.json` records it.
        model_flag: Option<String>,
    },
    /// The checkpoint's model takes another input shape than this run's data gives it.
    #[error(
        "--resume {}: the checkpoint's run trained on {}x{}x{} inputs, this run's data gives \
         {}x{}x{}; {}",
        path.display(),
        checkpoint[0],
        checkpoint[1],
        checkpoint[2],
        now[0],
        now[1],
        now[2],
        input_remedy(checkpoint, now, *resizable)
    )]
    OtherInput {
        /// The checkpoint.
        path: PathBuf,
        /// The checkpoint's input, `[C, H, W]`.
        checkpoint: [usize; 3],
        /// This run's.
        now: [usize; 3],
        /// Whether this run's data is read at a size the run chooses (an ImageFolder or a
        /// packed file), which resumes at the checkpoint's unless `--image-size` says other.
        resizable: bool,
    },
    /// The checkpoint's run trained on other data, in another order, or another batch.
    #[error(
        "--resume {}: this run differs from the checkpoint's ({}); resuming would continue \
         at a step computed for another run: give the checkpoint's values{}",
        path.display(),
        describe_changes(changes),
        if let Some((then, now)) = inputs {
            format!(
                " (its model takes {}x{}x{} inputs and this data gives {}x{}x{}, which \
                 --resume-changed cannot resume)",
                then[0], then[1], then[2], now[0], now[1], now[2]
            )
        } else if *inside_epoch {
            ", or resume from an epoch checkpoint with --resume-changed (a commit inside an \
             epoch continues only the run that wrote it)"
                .to_string()
        } else {
            ", or pass --resume-changed to resume anyway".to_string()
        }
    )]
    OtherRun {
        /// The checkpoint.
        path: PathBuf,
        /// Each setting that differs: (flag, the checkpoint's value, this run's).
        changes: Vec<(&'static str, String, String)>,
        /// Whether the checkpoint is a commit inside an epoch, which `--resume-changed` does
        /// not resume.
        inside_epoch: bool,
        /// The checkpoint's input and this data's (C, H, W), where they differ too: then
        /// only the checkpoint's values resume.
        inputs: Option<([usize; 3], [usize; 3])>,
    },
    /// The resumed run's momentum and Nesterov setting, one taken from the checkpoint's
    /// recorded recipe, do not go together.
    #[error("--resume {}: {source}", path.display())]
    Recipe {
        /// The checkpoint.
        path: PathBuf,
        /// Why.
        source: super::recipe::RecipeRefusal,
    },
    /// A record of the checkpoint's run that a resume follows (its recipe, its routine or
    /// its gradient exchange: [`super::recorded::Record`]) does not read back, and the
    /// resume would take options from it.
    #[error(
        "--resume {}: {why} (its metadata was changed, or a newer dptrain wrote it), so the \
         run's {record} cannot be followed; resume from another checkpoint of the run, give \
         its options yourself ({}), give --resume-changed to resume on the options given and \
         the defaults, or start a new run from its weights with --weights",
        path.display(),
        record.options()
    )]
    UnreadableRecord {
        /// The checkpoint.
        path: PathBuf,
        /// Which record.
        record: super::recorded::Record,
        /// Why it does not read.
        why: String,
    },
    /// `--resume-changed` from a commit inside an epoch: its position in the epoch belongs to
    /// the old settings' data order.
    #[error(
        "--resume {}: a commit inside epoch {} continues only the run that wrote it \
         (--resume-changed would resume it under other settings: {}); resume from an epoch \
         checkpoint instead, or give the commit's settings",
        path.display(),
        epoch + 1,
        describe_changes(changes)
    )]
    ChangedMidEpoch {
        /// The commit.
        path: PathBuf,
        /// Its epoch (epochs completed before it).
        epoch: usize,
        /// Each setting that differs.
        changes: Vec<(&'static str, String, String)>,
    },
    /// This run's data names other classes (or another order) than the checkpoint's run
    /// trained on: an ImageFolder's class directory renamed, added or removed since. Its
    /// head's outputs are the checkpoint's classes in its order, so resuming would train each
    /// output as another class; refused whatever `--resume-changed` says.
    #[error(
        "--resume {}: this run's data has other classes than the checkpoint's run trained on \
         ({}): its head's outputs are the checkpoint's classes in their order, so resuming \
         would train outputs as other classes; give the data as it was (class directories \
         named as then), or start a new run from its weights with --weights (--reinit the \
         head to start it afresh)",
        path.display(),
        class_difference(checkpoint, now)
    )]
    OtherClasses {
        /// The checkpoint.
        path: PathBuf,
        /// Its run's classes, in label order.
        checkpoint: Vec<String>,
        /// This run's.
        now: Vec<String>,
    },
    /// A commit's position inside its epoch is past the epoch's steps here (the training set
    /// has fewer samples than when it was written).
    #[error(
        "--resume {}: the commit is {step_in_epoch} steps into its epoch, but an epoch here has \
         {steps_per_epoch}: the training set changed since it was written; resume from an \
         epoch checkpoint, or give the data it was trained on",
        path.display()
    )]
    PastEpochEnd {
        /// The commit.
        path: PathBuf,
        /// Its steps into the epoch.
        step_in_epoch: usize,
        /// Steps per epoch of this run.
        steps_per_epoch: usize,
    },
    /// The checkpoint has trained every epoch asked for already.
    #[error(
        "the checkpoint has already completed {}; ask for more with --epochs",
        crate::terminal::counted(*.0, "epoch")
    )]
    AlreadyDone(usize),
}

/// "FLAG OLD in the checkpoint, NEW now; ..." for each changed setting.
pub fn describe_changes(changes: &[(&'static str, String, String)]) -> String {
    changes
        .iter()
        .map(|(flag, old, new)| format!("{flag} {old} in the checkpoint, {new} now"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// An output that failed after training had finished; the summary was written before it.
#[derive(Debug, thiserror::Error)]
pub enum LateWrite {
    /// The `--trace` timeline.
    #[error(
        "{error} (training finished; summary.json is in {})",
        run_dir.display()
    )]
    Trace {
        /// What went wrong.
        error: String,
        /// The run directory (which holds the results).
        run_dir: PathBuf,
    },
}

/// How to resume with the checkpoint's model: `--model` as its run was given it, when recorded.
fn resume_with(model_flag: &Option<String>) -> String {
    match model_flag {
        Some(m) => format!("resume with --model {m} (what its run was given)"),
        None => "resume with the --model its run was given (a built-in name or the model \
                 file; neither the checkpoint nor a summary.json beside it records which)"
            .into(),
    }
}

/// Where a stopped run can be continued from, for its message.
fn continue_hint(checkpoint: &Option<PathBuf>) -> String {
    checkpoint.as_ref().map_or(String::new(), |c| {
        format!(
            "; once the cause is fixed, continue with --resume {} (this run's newest restart \
             point, whole)",
            c.display()
        )
    })
}

/// Why a run ended without its summary, or with a write that failed late.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Before the first step: the configuration, data, model, checkpoint to resume, an
    /// output, or the processes' handshake.
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    /// Starting the loader or worker threads, or the transports between them.
    #[error("{0}")]
    Start(String),
    /// A worker failed (the cause, not one of its echoes).
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The replicas ended with different weights.
    #[error(
        "replicas diverged: final weight hashes differ across workers {0:x?}; this is a bug, \
         please report it"
    )]
    Diverged(Vec<u64>),
    /// A line of `metrics.jsonl` could not be written: the run stopped at the first one (a
    /// run whose record silently lacks lines would pass for a complete one), and wrote no
    /// summary.
    #[error(
        "{error}; the run stopped at this line (no summary.json was written){}",
        continue_hint(checkpoint)
    )]
    Metrics {
        /// The failed append, naming `metrics.jsonl` and the cause.
        error: Box<crate::output::OutputError>,
        /// The newest restart point in the run directory, if any.
        checkpoint: Option<PathBuf>,
    },
    /// Worker 0 could not write a checkpoint or restart point (a full disk): the run stopped
    /// there, and the restart points written before it are whole (each is written beside and
    /// renamed into place).
    #[error(
        "{error}; the run stopped there (no summary.json was written){}",
        continue_hint(restart)
    )]
    CheckpointWrite {
        /// The failed write, naming the file and the cause.
        error: CheckpointError,
        /// The newest restart point in the run directory, if any.
        restart: Option<PathBuf>,
    },
    /// After training: the processes' final exchanges, or `summary.json`.
    #[error("{0}")]
    Finish(String),
    /// Training finished and the summary was written, but a later output failed.
    #[error("{error}")]
    LateWrite {
        /// The run's results (also in `summary.json`).
        summary: Box<Summary>,
        /// What failed.
        error: LateWrite,
    },
}

impl TrainError {
    /// The summary a run wrote before failing late ([`TrainError::LateWrite`]), for the
    /// caller's report.
    pub fn summary(&self) -> Option<&Summary> {
        match self {
            Self::LateWrite { summary, .. } => Some(summary),
            _ => None,
        }
    }
}

impl From<TrainError> for String {
    fn from(e: TrainError) -> Self {
        e.to_string()
    }
}

/// What gives the checkpoint's input again: its image size (for data read at a size the run
/// chooses, by leaving `--image-size` out), the same data, or (channels alone differing) the
/// same images, since an ImageFolder is read as RGB if any of the images spread over it is
/// colour.
fn input_remedy(checkpoint: &[usize; 3], now: &[usize; 3], resizable: bool) -> String {
    let [_, h, w] = checkpoint;
    if checkpoint[1..] != now[1..] && resizable {
        format!("leave --image-size out to resume at the checkpoint's {h}x{w}")
    } else if checkpoint[1..] != now[1..] {
        format!("give the data the checkpoint's run trained on ({h}x{w} images)")
    } else {
        "give the same data: the channel count is the data's (an ImageFolder is RGB if any of \
         up to 64 images spread over it is colour, else grey)"
            .to_string()
    }
}

/// How this run's classes (`now`) differ from a checkpoint's (`then`), for
/// [`ResumeError::OtherClasses`]: the classes added and removed (a renamed class deep in a
/// long list would not show in its first names, and it shifts the labels after it), or, for
/// the same classes in another order, the first label that differs.
fn class_difference(then: &[String], now: &[String]) -> String {
    use crate::data::image_folder::same_class_name;
    let list = |names: Vec<String>| crate::train::description::class_list(&names);
    let missing = |from: &[String], of: &[String]| -> Vec<String> {
        from.iter()
            .filter(|c| !of.iter().any(|o| same_class_name(c, o)))
            .cloned()
            .collect()
    };
    let (added, removed) = (missing(now, then), missing(then, now));
    let mut said = vec![format!("{} classes then, {} now", then.len(), now.len())];
    if !added.is_empty() {
        said.push(format!("added: {}", list(added)));
    }
    if !removed.is_empty() {
        said.push(format!("removed: {}", list(removed)));
    }
    if said.len() == 1 {
        let first = then
            .iter()
            .zip(now)
            .position(|(a, b)| !same_class_name(a, b));
        said.push(match first {
            Some(i) => format!(
                "the same classes in another order: label {i} was '{}' and is now '{}'",
                then[i], now[i]
            ),
            None => "the same classes".into(),
        });
    }
    said.join("; ")
}
