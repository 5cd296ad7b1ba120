//! Checkpoints: safetensors files with the weights, optimizer state, BatchNorm statistics and
//! the position in training, written atomically.
//!
//! Tensor names and layouts are PyTorch's `state_dict` of the equivalent module: `LAYER.weight`
//! (convolutions as `[out, in/groups, kh, kw]`), `LAYER.bias`, `LAYER.running_mean`,
//! `LAYER.running_var`, `LAYER.num_batches_tracked` (int64), with the model file's layer names
//! (the built-in files use the module paths of `../shared/peers/models.py` and torchvision),
//! so `model.load_state_dict({k: v for k, v in safetensors.torch.load_file(path).items()
//! if not k.startswith("optimizer.")})` loads the weights. The momentum buffers are
//! `optimizer.momentum.LAYER.SUFFIX`, same shapes.
//!
//! Atomic means (through [`crate::output`]): write a temporary file, fsync it, rename it over
//! `NAME`, fsync the directory. A crash at any point leaves either the old file or the new one,
//! never half of one. The data order of an epoch is derived from (seed, epoch), so the epoch
//! number is the whole sampler and RNG state: resuming at an epoch boundary continues
//! bit-exactly.
//!
//! The metadata also records what the run trained on (dataset, global batch, seed, training
//! limit: [`RunIdentity`]), so that `--resume` can refuse a run that would continue under other
//! settings (and the workers and epochs it ran with, recorded, not compared), and the SHA-256 of the tensor data (the bytes after the safetensors header,
//! whatever tensors they hold), checked on every load: a changed byte is reported as a corrupt
//! checkpoint instead of loading silently.

mod write;

pub use write::{CHECKPOINT_FILE, CHECKSUM_KEY};

use super::description::ModelDescription;
use super::recorded::Recorded;
use crate::nn::{Net, TensorInfo};
use safetensors::tensor::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be written, read or restored.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be read (missing, not a regular file, over the cap); shared, since
    /// the error is cloned and an I/O error is not.
    #[error(transparent)]
    Read(std::sync::Arc<crate::input::InputError>),
    /// The file could not be read, or its bytes are not a checkpoint this dptrain can use.
    #[error("checkpoint {}: {detail}", path.display())]
    Invalid {
        /// The checkpoint.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The tensor data does not hash to the checksum written with it.
    #[error(
        "checkpoint {} is corrupt (checksum mismatch: its tensor data hashes to {got}, it was \
         written as {want}): the file changed after it was written; use another checkpoint \
         (an earlier epoch's, or a restart point)",
        path.display()
    )]
    Corrupt {
        /// The checkpoint.
        path: PathBuf,
        /// The data's SHA-256.
        got: String,
        /// The checksum in the header.
        want: String,
    },
    /// The checkpoint could not be serialised (the message names the tensor, if one was the
    /// cause).
    #[error("{0}")]
    Serialise(String),
    /// The checkpoint file could not be written (the output rules' message).
    #[error("{0}")]
    Write(String),
    /// The checkpoint is of another model.
    #[error(
        "the checkpoint is for model '{checkpoint}', not '{now}' (model names are the model \
         files' `name`): give the model file the checkpoint was trained with"
    )]
    OtherModel {
        /// The checkpoint's model.
        checkpoint: String,
        /// The net's.
        now: String,
    },
    /// The checkpoint's model has other layers or shapes than the net.
    #[error(
        "the checkpoint's model '{0}' has other layers or shapes than this run's (a changed \
         model file, or another dataset shape)"
    )]
    OtherShapes(String),
    /// A tensor the net needs is missing or of another shape or type.
    #[error("{0}")]
    Tensor(String),
    /// The checkpoint does not describe its model (model file, classes, input, normalisation):
    /// it was written before dptrain recorded them.
    #[error(
        "checkpoint {} was written before dptrain recorded its model (model file, class names, \
         input size, normalisation), which eval, predict and export need: it still resumes \
         and gives its weights to `train --weights`; retrain with this dptrain, or write a new \
         checkpoint from it with `dptrain train --weights {} --model MODEL --dataset DATASET \
         --epochs 1`",
        path.display(),
        path.display()
    )]
    NoDescription {
        /// The checkpoint.
        path: PathBuf,
    },
    /// The checkpoint's model was laid out in code, so it holds no model file to rebuild it
    /// from.
    #[error(
        "checkpoint {}: its model ({model}) was laid out in code, not in a model file, so the \
         checkpoint cannot rebuild it; load it in code with the same ModelBuilder, or train \
         from a model file (docs/MODEL_FILES.md)",
        path.display()
    )]
    NoModelText {
        /// The checkpoint.
        path: PathBuf,
        /// Where the model came from (`builder:NAME`).
        model: String,
    },
}

impl From<write::WriteError> for CheckpointError {
    fn from(e: write::WriteError) -> Self {
        match e {
            write::WriteError::Serialise(why) => {
                CheckpointError::Serialise(format!("cannot serialise checkpoint: {why}"))
            }
            write::WriteError::Output(e) => CheckpointError::Write(e.to_string()),
        }
    }
}

impl From<CheckpointError> for String {
    fn from(e: CheckpointError) -> Self {
        e.to_string()
    }
}

/// Format tag stored in every checkpoint.
pub const FORMAT: &str = "dptrain-checkpoint-2";

/// Prefix of the optimizer's tensors.
const MOMENTUM: &str = "optimizer.momentum.";

/// What a run trains on and how: the settings that decide which samples make up each step and
/// in which order. A resumed run must have the same, or it would continue at a global step
/// computed for another run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// Dataset name as given (`--dataset`).
    pub dataset: String,
    /// `--data-dir`, if given.
    pub data_dir: Option<String>,
    /// The data's directory or file as an absolute path with links resolved, where it could be
    /// (key `data_path`; absent in older checkpoints): the same data given by another path
    /// (absolute for relative, or from another working directory) is the same dataset.
    pub data_path: Option<String>,
    /// Global batch (`--batch`).
    pub batch: usize,
    /// Seed (`--seed`).
    pub seed: u64,
    /// `--train-limit`, if any.
    pub train_limit: Option<usize>,
    /// `--skip-bad-samples` (key `skip_bad_samples`; absent in older checkpoints): a bad
    /// sample left out shortens its batch, so a resume follows it (`crate::train::follow`)
    /// rather than fail on the first bad file, hours in.
    pub skip_bad_samples: Option<bool>,
    /// Workers of the run (all processes). Recorded, not compared: the global batch and the data
    /// order do not depend on it.
    pub world: usize,
    /// The epochs the run was started for (`--epochs`; key `epochs`, absent in older
    /// checkpoints). Recorded, not compared: a resume may extend a run, and is told when the
    /// learning-rate schedule spans the total ([`crate::train::check_resume`]).
    pub epochs: Option<usize>,
    /// The run's learning rate, schedule, SGD settings and augmentation (absent in older
    /// checkpoints). Recorded, not compared: a resume follows what it is not given again
    /// ([`crate::train::recipe`]).
    pub recipe: Recorded<crate::train::recipe::Recipe>,
    /// How the run evaluated, committed, checkpointed and logged, and what it kept
    /// ([`crate::train::recipe::Routine`]: keys `test_limit`, empty for none, `commit_every`,
    /// `checkpoint_every`, `keep_checkpoints`, `keep_commits`, `log_every`; absent in older
    /// checkpoints). Followed like the recipe.
    pub routine: Recorded<crate::train::recipe::Routine>,
    /// How the run's workers combined their gradients, as its options gave it (key
    /// `exchange`, JSON; absent in older checkpoints). Recorded, not compared: a resume
    /// follows what it is not given again (`crate::train::follow`).
    pub exchange: Recorded<crate::config::Exchange>,
}

impl RunIdentity {
    /// The identity of the run `cfg` describes.
    pub fn of(cfg: &crate::config::TrainConfig) -> Self {
        Self {
            dataset: cfg.dataset.clone(),
            data_dir: cfg.data_dir.as_ref().map(|d| d.display().to_string()),
            data_path: crate::data::DatasetSpec::parse(
                &cfg.dataset,
                cfg.data_dir.as_deref(),
                &crate::data::bundled_mnist_dir(),
            )
            .ok()
            .and_then(|spec| spec.location()?.canonicalize().ok())
            .map(|p| p.display().to_string()),
            batch: cfg.batch,
            seed: cfg.seed,
            train_limit: cfg.train_limit,
            skip_bad_samples: Some(cfg.skip_bad_samples),
            world: cfg.world(),
            epochs: Some(cfg.epochs),
            recipe: Recorded::Read(crate::train::recipe::Recipe::of(cfg)),
            routine: Recorded::Read(crate::train::recipe::Routine::of(cfg)),
            exchange: Recorded::Read(cfg.exchange.clone()),
        }
    }

    /// Whether the run's data named its own classes (an ImageFolder's directories, a packed
    /// file's list), rather than a built-in dataset's.
    pub fn names_its_classes(&self) -> bool {
        self.can_hold_bad_samples()
    }

    /// Whether the run's data is files decoded as read, of which some may not decode (an
    /// ImageFolder, a packed file): where `--skip-bad-samples` means something.
    pub fn can_hold_bad_samples(&self) -> bool {
        let spec = crate::data::DatasetSpec::parse(
            &self.dataset,
            self.data_dir.as_deref().map(Path::new),
            Path::new("(bundled)"),
        );
        matches!(
            spec,
            Ok(crate::data::DatasetSpec::ImageFolder { .. }
                | crate::data::DatasetSpec::Packed { .. })
        )
    }

    /// Whether `now` trains on the same dataset as the checkpoint's run (`self`).
    pub fn same_data(&self, now: &RunIdentity) -> bool {
        same_dataset(self, now)
    }

    /// The fields that differ between the checkpoint's run (`self`) and `now`: (option, the
    /// checkpoint's value, this run's value).
    pub fn changes(&self, now: &RunIdentity) -> Vec<(&'static str, String, String)> {
        let limit = |l: Option<usize>| l.map_or_else(|| "none".to_string(), |n| n.to_string());
        let mut out = Vec::new();
        if !same_dataset(self, now) {
            let show = |r: &RunIdentity| match &r.data_dir {
                Some(d) => format!("{} (--data-dir {d})", r.dataset),
                None => r.dataset.clone(),
            };
            let (then, is) = (show(self), show(now));
            // Named alike, found in two places: the places tell them apart.
            let at = |r: &RunIdentity, named: String| match &r.data_path {
                Some(p) if then == is => format!("{named} at {p}"),
                _ => named,
            };
            out.push(("--dataset", at(self, then.clone()), at(now, is.clone())));
        }
        if self.batch != now.batch {
            out.push(("--batch", self.batch.to_string(), now.batch.to_string()));
        }
        if self.seed != now.seed {
            out.push(("--seed", self.seed.to_string(), now.seed.to_string()));
        }
        if self.train_limit != now.train_limit {
            out.push((
                "--train-limit",
                limit(self.train_limit),
                limit(now.train_limit),
            ));
        }
        out
    }
}

/// Whether two runs name the same dataset: equal as parsed (so `synthetic` and
/// `synthetic:1x28x28:10` are one dataset, and `mnist` is the bundled copy wherever the run
/// starts), or, for names that no longer parse, equal as written.
fn same_dataset(a: &RunIdentity, b: &RunIdentity) -> bool {
    let kind = |r: &RunIdentity| {
        let spec = crate::data::DatasetSpec::parse(
            &r.dataset,
            r.data_dir.as_deref().map(Path::new),
            Path::new("(bundled)"),
        );
        spec.ok().map(|s| std::mem::discriminant(&s))
    };
    // One kind of data at one place, however each run named the place.
    if let (Some(x), Some(y)) = (&a.data_path, &b.data_path) {
        if x == y && kind(a).is_some() && kind(a) == kind(b) {
            return true;
        }
        // Two places that both exist: the same relative words said in two working directories
        // name two datasets. (The bundled MNIST is one dataset wherever the run starts; a
        // recorded place that is gone, moved data, is left to the names; one that now leads
        // elsewhere through a link is resolved again.)
        let recorded_now = Path::new(x).canonicalize().ok();
        if !is_bundled(a) && recorded_now.is_some_and(|r| r != Path::new(y)) {
            return false;
        }
    }
    let parse = |r: &RunIdentity| {
        crate::data::DatasetSpec::parse(
            &r.dataset,
            r.data_dir.as_deref().map(Path::new),
            Path::new("(bundled)"),
        )
        .ok()
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => (&a.dataset, &a.data_dir) == (&b.dataset, &b.data_dir),
    }
}

/// Whether `r` trains on the MNIST copy bundled with dptrain (no directory given).
fn is_bundled(r: &RunIdentity) -> bool {
    matches!(
        crate::data::DatasetSpec::parse(
            &r.dataset,
            r.data_dir.as_deref().map(Path::new),
            Path::new("(bundled)"),
        ),
        Ok(crate::data::DatasetSpec::Mnist { bundled: true, .. })
    )
}

/// Position in training stored with the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainState {
    /// Model name (checked on load).
    pub model: String,
    /// The model graph's fingerprint (checked on load: same layers, same shapes).
    pub fingerprint: u64,
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps completed.
    pub global_step: usize,
    /// Steps of epoch `epoch` already done: 0 for an epoch checkpoint, the position in the
    /// epoch for a commit taken inside one (`--commit-every`), where a resumed run starts.
    pub step_in_epoch: usize,
    /// What the run trained on.
    pub run: Option<RunIdentity>,
}

impl TrainState {
    /// The state after `epoch` epochs and `global_step` steps of the run `cfg` describes, on
    /// model `graph`.
    pub fn new(
        cfg: &crate::config::TrainConfig,
        graph: &crate::model::Graph,
        epoch: usize,
        global_step: usize,
    ) -> Self {
        Self {
            model: graph.name.clone(),
            fingerprint: graph.fingerprint(),
            epoch,
            global_step,
            step_in_epoch: 0,
            run: Some(RunIdentity::of(cfg)),
        }
    }

    /// The state of a commit inside epoch `epoch`, after `step_in_epoch` of its steps.
    pub fn within_epoch(mut self, step_in_epoch: usize) -> Self {
        self.step_in_epoch = step_in_epoch;
        self
    }

    /// The metadata entries of this state (all but the format tag and the checksum).
    fn to_metadata(&self) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("model", self.model.clone()),
            ("fingerprint", format!("{:016x}", self.fingerprint)),
            ("epoch", self.epoch.to_string()),
            ("global_step", self.global_step.to_string()),
            ("step_in_epoch", self.step_in_epoch.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(r) = &self.run {
            m.insert("dataset".into(), r.dataset.clone());
            if let Some(d) = &r.data_dir {
                m.insert("data_dir".into(), d.clone());
            }
            if let Some(d) = &r.data_path {
                m.insert("data_path".into(), d.clone());
            }
            m.insert("batch".into(), r.batch.to_string());
            m.insert("seed".into(), r.seed.to_string());
            m.insert(
                "train_limit".into(),
                r.train_limit.map_or_else(String::new, |n| n.to_string()),
            );
            m.insert("world".into(), r.world.to_string());
            if let Some(skip) = r.skip_bad_samples {
                m.insert("skip_bad_samples".into(), skip.to_string());
            }
            if let Some(e) = r.epochs {
                m.insert("epochs".into(), e.to_string());
            }
            if let Some(recipe) = r.recipe.read() {
                recipe.write_metadata(&mut m);
            }
            if let Some(routine) = r.routine.read() {
                routine.write_metadata(&mut m);
            }
            if let Some(exchange) = r.exchange.read() {
                m.insert("exchange".into(), exchange.to_metadata());
            }
        }
        m
    }

    /// Reads the state back from checkpoint metadata; `what` wraps messages.
    fn from_metadata(
        meta: &HashMap<String, String>,
        what: &dyn Fn(String) -> CheckpointError,
    ) -> Result<Self, CheckpointError> {
        let num = |k: &str| -> Result<usize, CheckpointError> {
            meta.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| what(format!("metadata '{k}' missing or not a number")))
        };
        let run = match meta.get("dataset") {
            None => None,
            Some(dataset) => {
                let world = num("world")?;
                Some(RunIdentity {
                    dataset: dataset.clone(),
                    world,
                    data_dir: meta.get("data_dir").cloned(),
                    data_path: meta.get("data_path").cloned(),
                    batch: num("batch")?,
                    seed: meta
                        .get("seed")
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| what("metadata 'seed' missing or not a number".into()))?,
                    train_limit: match meta.get("train_limit").map(String::as_str) {
                        None | Some("") => None,
                        Some(_) => Some(num("train_limit")?),
                    },
                    skip_bad_samples: match meta.get("skip_bad_samples").map(String::as_str) {
                        None => None,
                        Some("false") => Some(false),
                        Some("true") => Some(true),
                        Some(_) => {
                            return Err(what(
                                "metadata 'skip_bad_samples' is neither true nor false".into(),
                            ))
                        }
                    },
                    epochs: match meta.get("epochs") {
                        None => None,
                        Some(_) => Some(num("epochs")?),
                    },
                    recipe: crate::train::recipe::Recipe::from_metadata(meta),
                    routine: Recorded::from_result(crate::train::recipe::Routine::from_metadata(
                        meta,
                    )),
                    exchange: Recorded::from_result(
                        meta.get("exchange")
                            .map(|e| crate::config::Exchange::from_metadata(e, world))
                            .transpose(),
                    ),
                })
            }
        };
        let fingerprint = meta
            .get("fingerprint")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| what("metadata 'fingerprint' missing or not a number".into()))?;
        Ok(Self {
            model: meta.get("model").cloned().unwrap_or_default(),
            fingerprint,
            epoch: num("epoch")?,
            global_step: num("global_step")?,
            // Absent in checkpoints from before commits: those are all at an epoch's end.
            step_in_epoch: match meta.get("step_in_epoch") {
                None => 0,
                Some(_) => num("step_in_epoch")?,
            },
            run,
        })
    }
}

/// The tensor data of serialised safetensors bytes: everything after the 8-byte header length
/// and the header. `None` when the bytes are too short for the header they announce.
fn data_section(bytes: &[u8]) -> Option<&[u8]> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let start = usize::try_from(n).ok()?.checked_add(8)?;
    bytes.get(start..)
}

/// Lower-case hex SHA-256 of `bytes`.
fn sha256_hex(bytes: &[u8]) -> String {
    crate::data::mnist::sha256_hex(bytes)
}

/// One stored tensor: f32 values, or an int64 counter.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// Float values with PyTorch's shape.
    F32(Vec<usize>, Vec<f32>),
    /// An int64 scalar (BatchNorm's `num_batches_tracked`).
    I64(i64),
}

impl Stored {
    /// The values as floats (a counter as one value).
    pub fn values(&self) -> Vec<f32> {
        match self {
            Stored::F32(_, v) => v.clone(),
            Stored::I64(x) => vec![*x as f32],
        }
    }
}

/// Everything a checkpoint holds, ready to write or just read.
pub struct Checkpoint {
    /// Training position.
    pub state: TrainState,
    /// Named tensors, PyTorch's names and layouts.
    pub tensors: BTreeMap<String, Stored>,
    /// What the model is (file, classes, input, normalisation); `None` in checkpoints written
    /// before dptrain recorded it.
    pub description: Option<ModelDescription>,
}

/// `--compress powersgd:R`'s state in a checkpoint: every worker's error feedback, worker by
/// worker, `[workers, values]` (what the product left out, which the next steps send), and the
/// warm-start Q, the same on every worker.
const POWERSGD_ERROR: &str = "optimizer.powersgd.error";
/// See [`POWERSGD_ERROR`].
const POWERSGD_Q: &str = "optimizer.powersgd.q";

/// The optimizer's state as a checkpoint holds it: the momentum (laid out as the parameters)
/// and, with `--compress powersgd:R`, PowerSGD's.
#[derive(Clone, Copy)]
pub struct OptimizerState<'a> {
    /// The momentum buffers.
    pub momentum: &'a [f32],
    /// PowerSGD's error feedback and Q.
    pub powersgd: Option<&'a PowerSgdState>,
}

impl<'a> OptimizerState<'a> {
    /// Momentum alone.
    pub fn momentum(momentum: &'a [f32]) -> Self {
        Self {
            momentum,
            powersgd: None,
        }
    }
}

/// What to say of a file given as a checkpoint that is not one: what a checkpoint is, and for
/// an ONNX export (`dptrain export`'s output, a common mix-up) that it is not read back.
fn not_a_checkpoint(path: &Path) -> String {
    let onnx = path
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("onnx"));
    format!(
        "; a checkpoint is what a training run writes in its run directory \
         (checkpoint-epochNNNN.safetensors, commit-stepNNNNNNNNN.safetensors){}",
        if onnx {
            ": an ONNX export is not read back, give the checkpoint it was exported from"
        } else {
            ""
        }
    )
}

/// PowerSGD's state of a whole run: every worker's error feedback (all buckets' in bucket
/// order, worker after worker) and the warm-start Q (all buckets').
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PowerSgdState {
    /// `[workers, values]`.
    pub error_shape: [usize; 2],
    /// Every worker's error feedback.
    pub errors: Vec<f32>,
    /// `[values]`.
    pub q_shape: [usize; 1],
    /// The warm-start Q.
    pub q: Vec<f32>,
}

impl PowerSgdState {
    /// Worker `w`'s error feedback.
    pub fn error_of(&self, w: usize) -> &[f32] {
        let n = self.error_shape[1];
        &self.errors[w * n..(w + 1) * n]
    }
}

/// The `state_dict` name of tensor `t` of block `block`.
fn tensor_name(block: &crate::nn::ParamBlock, t: &TensorInfo) -> String {
    format!("{}.{}", block.name, t.suffix)
}

/// Each tensor of `net`'s blocks: (full name, tensor, whether it is state, the block).
fn named(net: &Net) -> Vec<(String, TensorInfo, bool, usize)> {
    let mut v = Vec::new();
    for (bi, b) in net.blocks().iter().enumerate() {
        for t in &b.tensors {
            v.push((tensor_name(b, t), t.clone(), false, bi));
        }
        for t in &b.state_tensors {
            v.push((tensor_name(b, t), t.clone(), true, bi));
        }
    }
    v
}

/// Each tensor of `net`'s blocks, and its momentum, as they are written: PyTorch's names and
/// shapes, the values where they live (weights and momentum in our layout; BatchNorm's
/// statistics and counter as stored).
fn net_entries<'a>(net: &'a Net, optimizer: OptimizerState<'a>) -> Vec<write::Entry<'a>> {
    let momentum = optimizer.momentum;
    let mut entries = Vec::new();
    if let Some(p) = optimizer.powersgd {
        entries.push(write::Entry {
            name: POWERSGD_ERROR.into(),
            shape: &p.error_shape,
            values: write::Values::Torch(&p.errors),
        });
        entries.push(write::Entry {
            name: POWERSGD_Q.into(),
            shape: &p.q_shape,
            values: write::Values::Torch(&p.q),
        });
    }
    for b in net.blocks() {
        for t in &b.tensors {
            let range = b.range.start + t.offset..b.range.start + t.offset + t.len;
            let name = tensor_name(b, t);
            entries.push(write::Entry {
                name: format!("{MOMENTUM}{name}"),
                shape: &t.torch_shape,
                values: write::Values::Ours(t, &momentum[range.clone()]),
            });
            entries.push(write::Entry {
                name,
                shape: &t.torch_shape,
                values: write::Values::Ours(t, &net.params()[range]),
            });
        }
        for t in &b.state_tensors {
            let src = &net.state()[b.state_range.clone()][t.offset..t.offset + t.len];
            entries.push(write::Entry {
                name: tensor_name(b, t),
                shape: &t.torch_shape,
                values: if t.torch_shape.is_empty() {
                    write::Values::Counter(src[0] as i64)
                } else {
                    write::Values::Torch(src)
                },
            });
        }
    }
    entries
}

/// The metadata of a checkpoint of `state` and `description` (all but the checksum).
fn metadata(state: &TrainState, description: Option<&ModelDescription>) -> HashMap<String, String> {
    let mut metadata = state.to_metadata();
    if let Some(d) = description {
        metadata.extend(d.to_metadata());
    }
    metadata
}

/// Writes a checkpoint of `net` and `optimizer` at `state` atomically to `path`, straight from
/// the net's memory: one tensor at a time is converted to PyTorch's layout, so the write holds
/// one tensor, not a copy of the model (see [`write`]). With `slow`, as
/// [`Checkpoint::save_paced`].
pub fn save_net(
    path: &Path,
    state: &TrainState,
    description: &ModelDescription,
    net: &Net,
    optimizer: OptimizerState<'_>,
    slow: bool,
) -> Result<(), CheckpointError> {
    write::write(
        path,
        net_entries(net, optimizer),
        metadata(state, Some(description)),
        slow,
    )
    .map_err(CheckpointError::from)
}

/// What `--model` the run of the checkpoint at `path` was given: the built-in name or model
/// file path its `description` records, else the `model` of the `summary.json` beside it
/// (older checkpoints).
pub fn model_flag(description: Option<&ModelDescription>, path: &Path) -> Option<String> {
    if let Some(d) = description {
        let source = &d.model_source;
        return Some(
            source
                .strip_prefix("builtin:")
                .unwrap_or(source)
                .to_string(),
        );
    }
    let summary = crate::output::parent_dir(path).join("summary.json");
    let text = crate::input::read_text(&summary, crate::input::FileKind::Summary).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["config"]["model"].as_str().map(str::to_string)
}

impl Checkpoint {
    /// What `--model` the checkpoint's run was given: the built-in name or model file path
    /// the checkpoint records, else the `model` of the `summary.json` beside it (`path`, for
    /// older checkpoints).
    pub fn model_flag(&self, path: &Path) -> Option<String> {
        model_flag(self.description.as_ref(), path)
    }

    /// Captures the model (weights, running statistics) and the optimizer's momentum (laid
    /// out as the parameters): a copy in PyTorch's layouts.
    pub fn capture(state: TrainState, net: &Net, optimizer: OptimizerState<'_>) -> Self {
        let mut scratch = Vec::new();
        let tensors = net_entries(net, optimizer)
            .into_iter()
            .map(|e| {
                let value = match e.values {
                    write::Values::Counter(x) => Stored::I64(x),
                    write::Values::Torch(v) => Stored::F32(e.shape.to_vec(), v.to_vec()),
                    write::Values::Ours(t, ours) => {
                        scratch.resize(t.len, 0.0);
                        t.to_torch(ours, &mut scratch);
                        Stored::F32(e.shape.to_vec(), scratch.clone())
                    }
                };
                (e.name, value)
            })
            .collect();
        Self {
            state,
            tensors,
            description: None,
        }
    }

    /// [`Checkpoint::capture`] into this checkpoint's buffers (captured from the same net
    /// before): the commits' copy, which allocates no tensor.
    pub fn recapture(&mut self, state: TrainState, net: &Net, optimizer: OptimizerState<'_>) {
        self.state = state;
        for e in net_entries(net, optimizer) {
            let Some(slot) = self.tensors.get_mut(&e.name) else {
                continue;
            };
            match (e.values, slot) {
                (write::Values::Counter(x), Stored::I64(old)) => *old = x,
                (write::Values::Torch(v), Stored::F32(_, old)) => old.copy_from_slice(v),
                (write::Values::Ours(t, ours), Stored::F32(_, old)) => t.to_torch(ours, old),
                _ => {}
            }
        }
    }

    /// The checkpoint with `description` recorded.
    pub fn with_description(mut self, description: ModelDescription) -> Self {
        self.description = Some(description);
        self
    }

    /// The model description, or [`CheckpointError::NoDescription`] naming `path` (the file
    /// it was read from) for a checkpoint that has none.
    pub fn description(&self, path: &Path) -> Result<&ModelDescription, CheckpointError> {
        self.description
            .as_ref()
            .ok_or_else(|| CheckpointError::NoDescription {
                path: path.to_path_buf(),
            })
    }

    /// Writes the checkpoint atomically to `path`.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        self.save_paced(path, false)
    }

    /// [`Checkpoint::save`]; with `slow`, the write pauses between tensors for about two
    /// seconds in all, so a test can kill the process in the middle of it.
    pub fn save_paced(&self, path: &Path, slow: bool) -> Result<(), CheckpointError> {
        let entries = self
            .tensors
            .iter()
            .map(|(name, v)| match v {
                Stored::F32(shape, values) => write::Entry {
                    name: name.clone(),
                    shape,
                    values: write::Values::Torch(values),
                },
                Stored::I64(x) => write::Entry {
                    name: name.clone(),
                    shape: &[],
                    values: write::Values::Counter(*x),
                },
            })
            .collect();
        write::write(
            path,
            entries,
            metadata(&self.state, self.description.as_ref()),
            slow,
        )
        .map_err(CheckpointError::from)
    }

    /// Reads and checks a checkpoint file.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = crate::input::read_bytes(path, crate::input::FileKind::Checkpoint)
            .map_err(|e| CheckpointError::Read(std::sync::Arc::new(e)))?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses and checks checkpoint bytes; `path` is only used in messages (also the entry
    /// point of the checkpoint fuzz target).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, CheckpointError> {
        let what = |detail: String| CheckpointError::Invalid {
            path: path.to_path_buf(),
            detail,
        };
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
            what(format!(
                "not a safetensors file ({e}){}",
                not_a_checkpoint(path)
            ))
        })?;
        let meta = meta.metadata().clone().unwrap_or_default();
        match meta.get("format").map(String::as_str) {
            Some(FORMAT) => {}
            Some("dptrain-checkpoint-1") => {
                return Err(what("written by an earlier dptrain (before model files): retrain, or resume with that version".into()))
            }
            Some(other) if other.starts_with("dptrain-checkpoint-") => {
                return Err(what(format!(
                    "its format is {other}, which this dptrain does not read (it reads \
                     {FORMAT}): written by a newer dptrain, or edited"
                )))
            }
            Some(other) => {
                return Err(what(format!(
                    "not a dptrain checkpoint (its format tag is '{other}')"
                )))
            }
            None => return Err(what("not a dptrain checkpoint (no format tag)".into())),
        }
        match meta.get(CHECKSUM_KEY) {
            Some(want) => {
                let got = data_section(bytes).map(sha256_hex).unwrap_or_default();
                if !got.eq_ignore_ascii_case(want) {
                    return Err(CheckpointError::Corrupt {
                        path: path.to_path_buf(),
                        got,
                        want: want.clone(),
                    });
                }
            }
            None => crate::terminal::print_warning(&format!(
                "checkpoint {} has no checksum (written by an older dptrain): its tensors \
                 cannot be verified",
                path.display()
            )),
        }
        let state = TrainState::from_metadata(&meta, &what)?;
        let description = ModelDescription::from_metadata(&meta).map_err(what)?;
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| what(format!("not a safetensors file ({e})")))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let value = match view.dtype() {
                Dtype::F32 => Stored::F32(
                    view.shape().to_vec(),
                    data.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                ),
                Dtype::I64 if data.len() == 8 => {
                    Stored::I64(i64::from_le_bytes(data.try_into().expect("8 bytes")))
                }
                other => {
                    return Err(what(format!(
                        "tensor '{name}' has type {other:?}; expected F32 (or an I64 counter)"
                    )))
                }
            };
            tensors.insert(name, value);
        }
        Ok(Self {
            state,
            tensors,
            description,
        })
    }

    /// Whether the checkpoint holds PowerSGD's state (without reading it).
    pub fn has_powersgd_state(&self) -> bool {
        self.tensors.contains_key(POWERSGD_ERROR)
    }

    /// PowerSGD's state, if the checkpoint holds one (a run with `--compress powersgd:R`, 2 or
    /// more workers). A malformed one is an error naming the tensor.
    pub fn powersgd(&self) -> Result<Option<PowerSgdState>, CheckpointError> {
        let (Some(error), Some(q)) = (
            self.tensors.get(POWERSGD_ERROR),
            self.tensors.get(POWERSGD_Q),
        ) else {
            return Ok(None);
        };
        match (error, q) {
            (Stored::F32(es, e), Stored::F32(qs, q)) if es.len() == 2 && qs.len() == 1 => {
                Ok(Some(PowerSgdState {
                    error_shape: [es[0], es[1]],
                    errors: e.clone(),
                    q_shape: [qs[0]],
                    q: q.clone(),
                }))
            }
            _ => Err(CheckpointError::Tensor(format!(
                "checkpoint tensors '{POWERSGD_ERROR}' and '{POWERSGD_Q}' must be f32 of 2 and 1 \
                 dimensions"
            ))),
        }
    }

    /// Copies the stored state into `net` and returns the momentum buffer. Fails, naming the
    /// tensor, if the checkpoint is from another model or shape.
    pub fn restore(&self, net: &mut Net) -> Result<Vec<f32>, CheckpointError> {
        let g = net.graph();
        if self.state.model != g.name {
            return Err(CheckpointError::OtherModel {
                checkpoint: self.state.model.clone(),
                now: g.name.clone(),
            });
        }
        if self.state.fingerprint != g.fingerprint() {
            return Err(CheckpointError::OtherShapes(self.state.model.clone()));
        }
        let get = |name: &str, shape: &[usize]| -> Result<&[f32], CheckpointError> {
            let wrong = match self.tensors.get(name) {
                Some(Stored::F32(s, d)) if s == shape => return Ok(d),
                Some(Stored::F32(s, _)) => format!("checkpoint tensor '{name}' has shape {s:?}, the model needs {shape:?}"),
                Some(Stored::I64(_)) => format!("checkpoint tensor '{name}' is an integer, the model needs floats"),
                None => format!("checkpoint has no tensor '{name}': it was written by a different model definition"),
            };
            Err(CheckpointError::Tensor(wrong))
        };
        let mut momentum = vec![0.0; net.params().len()];
        let tensors = named(net);
        for (name, t, is_state, bi) in tensors {
            let b = net.blocks()[bi].clone();
            if is_state {
                let dst = &mut net.state_mut()[b.state_range.clone()][t.offset..t.offset + t.len];
                if t.torch_shape.is_empty() {
                    match self.tensors.get(&name) {
                        Some(Stored::I64(v)) => dst[0] = *v as f32,
                        _ => {
                            return Err(CheckpointError::Tensor(format!(
                                "checkpoint has no int64 tensor '{name}'"
                            )))
                        }
                    }
                } else {
                    dst.copy_from_slice(get(&name, &t.torch_shape)?);
                }
                continue;
            }
            let range = b.range.start + t.offset..b.range.start + t.offset + t.len;
            t.from_torch(
                get(&name, &t.torch_shape)?,
                &mut net.params_mut()[range.clone()],
            );
            t.from_torch(
                get(&format!("{MOMENTUM}{name}"), &t.torch_shape)?,
                &mut momentum[range],
            );
        }
        Ok(momentum)
    }
}

/// Most bytes a checkpoint's header may take (the safetensors crate's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// What the header of a checkpoint records: its training position and, where written, the
/// model's description. The tensors are neither read nor checked ([`Checkpoint::load`] does
/// both).
pub struct Header {
    /// The training position and the run it belongs to.
    pub state: TrainState,
    /// The model's description (absent in older checkpoints).
    pub description: Option<ModelDescription>,
}

/// The header of the checkpoint at `path` ([`Header`]), for choosing among checkpoints, or
/// following a run's options, without reading each whole.
pub fn read_header(path: &Path) -> Result<Header, CheckpointError> {
    use std::io::Read;
    let what = |detail: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        detail,
    };
    let (mut file, len) = crate::input::open_regular(path, crate::input::FileKind::Checkpoint)
        .map_err(|e| CheckpointError::Read(std::sync::Arc::new(e)))?;
    let mut size = [0u8; 8];
    file.read_exact(&mut size)
        .map_err(|e| what(format!("cannot read its header ({e})")))?;
    let n = u64::from_le_bytes(size);
    if n > MAX_HEADER || n > len.saturating_sub(8) {
        return Err(what(format!("a header of {n} bytes in a file of {len}")));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| what(format!("cannot read its header ({e})")))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| what(format!("not a safetensors header ({e})")))?;
    let meta: HashMap<String, String> = json["__metadata__"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(what("not a dptrain checkpoint of this version".into()));
    }
    Ok(Header {
        state: TrainState::from_metadata(&meta, &what)?,
        description: ModelDescription::from_metadata(&meta).map_err(what)?,
    })
}

/// The training position recorded in the checkpoint at `path`, from its header alone
/// ([`read_header`]).
pub fn read_state(path: &Path) -> Result<TrainState, CheckpointError> {
    read_header(path).map(|h| h.state)
}

/// Path of the checkpoint after `epoch` in `dir`.
pub fn checkpoint_path(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("checkpoint-epoch{epoch:04}.safetensors"))
}

/// After writing the checkpoint of `epoch`, deletes this run's checkpoints older than the last
/// `keep` (those of epochs `<= epoch - keep`). Files of later epochs, left in a reused run
/// directory by an earlier run, are never touched: pruning by name alone would keep those and
/// delete this run's newest work.
pub fn prune(dir: &Path, keep: usize, epoch: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        let number = path.file_name().and_then(|n| n.to_str()).and_then(|n| {
            n.strip_prefix("checkpoint-epoch")?
                .strip_suffix(".safetensors")?
                .parse::<usize>()
                .ok()
        });
        // Saturating: `--keep-checkpoints` of any size keeps all (a wrapped sum deleted all).
        if number.is_some_and(|e| e.saturating_add(keep) <= epoch) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_the_last_ones_and_any_count_above_the_epochs_keeps_all() {
        let tmp = tempfile::tempdir().unwrap();
        let names = |dir: &Path| {
            let mut n: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        for e in 1..=3 {
            std::fs::write(checkpoint_path(tmp.path(), e), b"").unwrap();
        }
        let all = names(tmp.path());
        // A sum that wrapped deleted every one, the newest too.
        prune(tmp.path(), usize::MAX, 3);
        prune(tmp.path(), usize::MAX - 1, 3);
        assert_eq!(names(tmp.path()), all);
        prune(tmp.path(), 2, 3);
        assert_eq!(
            names(tmp.path()),
            [
                "checkpoint-epoch0002.safetensors",
                "checkpoint-epoch0003.safetensors"
            ]
        );
    }

    #[test]
    fn the_same_relative_data_path_in_two_places_is_two_datasets() {
        let tmp = tempfile::tempdir().unwrap();
        let place = |sub: &str| {
            let d = tmp.path().join(sub).join("photos");
            std::fs::create_dir_all(&d).unwrap();
            d.canonicalize().unwrap().display().to_string()
        };
        let run = |dataset: &str, dir: Option<&str>, at: Option<String>| RunIdentity {
            dataset: dataset.into(),
            data_dir: dir.map(String::from),
            data_path: at,
            batch: 64,
            seed: 1,
            train_limit: None,
            skip_bad_samples: Some(false),
            world: 2,
            epochs: Some(3),
            recipe: Recorded::Absent,
            routine: Recorded::Absent,
            exchange: Recorded::Absent,
        };
        let (a, b) = (place("a"), place("b"));
        let then = run("imagefolder", Some("photos"), Some(a.clone()));
        assert!(then.changes(&then.clone()).is_empty());
        let changes = then.changes(&run("imagefolder", Some("photos"), Some(b.clone())));
        assert_eq!(changes.len(), 1, "{changes:?}");
        let (flag, was, is) = &changes[0];
        assert_eq!(*flag, "--dataset");
        assert!(was.ends_with(&format!("at {a}")) && is.ends_with(&format!("at {b}")));
        // The same place named two ways is one dataset.
        assert!(then
            .changes(&run("imagefolder", Some(&a), Some(a.clone())))
            .is_empty());
        // A recorded place that is gone (the data moved): left to the names.
        let gone = run(
            "imagefolder",
            Some("photos"),
            Some("/nonexistent/photos".into()),
        );
        assert!(gone
            .changes(&run("imagefolder", Some("photos"), Some(b.clone())))
            .is_empty());
        // Data moved, its old place now a link to the new one: one dataset.
        std::os::unix::fs::symlink(tmp.path().join("b"), tmp.path().join("link")).unwrap();
        let linked = tmp.path().join("link/photos").display().to_string();
        let before_the_move = run("imagefolder", Some("photos"), Some(linked));
        assert!(before_the_move
            .changes(&run("imagefolder", Some("photos"), Some(b.clone())))
            .is_empty());
        // The bundled MNIST is one dataset wherever the run starts.
        let bundled = run("mnist", None, Some(a));
        assert!(bundled.changes(&run("mnist", None, Some(b))).is_empty());
    }

    /// A safetensors file of one tensor with `metadata`.
    fn file_with(metadata: &[(&str, &str)]) -> Vec<u8> {
        let meta: HashMap<String, String> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let zero = [0u8; 4];
        let one =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &zero).unwrap();
        safetensors::serialize([("w", one)], Some(meta)).unwrap()
    }

    #[test]
    fn a_checkpoint_of_another_format_says_which() {
        let path = Path::new("c.safetensors");
        let message = |metadata: &[(&str, &str)]| {
            Checkpoint::from_bytes(&file_with(metadata), path)
                .err()
                .unwrap()
                .to_string()
        };
        let e = message(&[("format", "dptrain-checkpoint-9")]);
        assert!(
            e.contains("its format is dptrain-checkpoint-9, which this dptrain does not read")
                && e.contains(FORMAT),
            "{e}"
        );
        let e = message(&[("format", "pt")]);
        assert!(e.contains("its format tag is 'pt'"), "{e}");
        let e = message(&[]);
        assert!(e.contains("no format tag"), "{e}");
    }
}
