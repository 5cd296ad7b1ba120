//! Checkpoints: safetensors files with the weights, optimizer state, BatchNorm statistics and
//! the position in training, written atomically (through [`crate::output`]).
//!
//! Atomic means: write a temporary file, fsync it, rename it over `NAME`, fsync the directory.
//! A crash at any point leaves either the old file or the new one, never half of one. The data
//! order of an epoch is derived from (seed, epoch), so the epoch number is the whole sampler and
//! RNG state: resuming at an epoch boundary continues bit-exactly.
//!
//! The metadata also records what the run trained on (dataset, global batch, seed, training
//! limit: [`RunIdentity`]), so that `--resume` can refuse a run that would continue under other
//! settings, and the SHA-256 of the tensor data (the bytes after the safetensors header,
//! whatever tensors they hold), checked on every load: a changed byte is reported as a corrupt
//! checkpoint instead of loading silently.

use crate::nn::{Buffer, Param};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Format tag stored in every checkpoint.
pub const FORMAT: &str = "dptrain-checkpoint-1";

/// Metadata key of the SHA-256 (lower-case hex) of the tensor data.
pub const CHECKSUM_KEY: &str = "tensor_sha256";

/// What a run trains on and how: the settings that decide which samples make up each step and
/// in which order. A resumed run must have the same, or it would continue at a global step
/// computed for another run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// Dataset name as given (`--dataset`).
    pub dataset: String,
    /// `--data-dir`, if given.
    pub data_dir: Option<String>,
    /// Global batch (`--batch`).
    pub batch: usize,
    /// Seed (`--seed`).
    pub seed: u64,
    /// `--train-limit`, if any.
    pub train_limit: Option<usize>,
    /// Workers of the run (all processes). Recorded, not compared: the global batch and the data
    /// order do not depend on it.
    pub world: usize,
}

impl RunIdentity {
    /// The identity of the run `cfg` describes.
    pub fn of(cfg: &crate::config::TrainConfig) -> Self {
        Self {
            dataset: cfg.dataset.clone(),
            data_dir: cfg.data_dir.as_ref().map(|d| d.display().to_string()),
            batch: cfg.batch,
            seed: cfg.seed,
            train_limit: cfg.train_limit,
            world: cfg.world(),
        }
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
            out.push(("--dataset", show(self), show(now)));
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

/// Position in training stored with the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainState {
    /// Model name (checked on load).
    pub model: String,
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps completed.
    pub global_step: usize,
    /// What the run trained on; `None` in checkpoints written before it was recorded.
    pub run: Option<RunIdentity>,
}

impl TrainState {
    /// The state after `epoch` epochs and `global_step` steps of the run `cfg` describes.
    pub fn new(cfg: &crate::config::TrainConfig, epoch: usize, global_step: usize) -> Self {
        Self {
            model: cfg.model.clone(),
            epoch,
            global_step,
            run: Some(RunIdentity::of(cfg)),
        }
    }

    /// The metadata entries of this state (all but the format tag and the checksum).
    fn to_metadata(&self) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("model", self.model.clone()),
            ("epoch", self.epoch.to_string()),
            ("global_step", self.global_step.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(r) = &self.run {
            m.insert("dataset".into(), r.dataset.clone());
            if let Some(d) = &r.data_dir {
                m.insert("data_dir".into(), d.clone());
            }
            m.insert("batch".into(), r.batch.to_string());
            m.insert("seed".into(), r.seed.to_string());
            m.insert(
                "train_limit".into(),
                r.train_limit.map_or_else(String::new, |n| n.to_string()),
            );
            m.insert("world".into(), r.world.to_string());
        }
        m
    }

    /// Reads the state back from checkpoint metadata; `what` wraps messages.
    fn from_metadata(
        meta: &HashMap<String, String>,
        what: &dyn Fn(String) -> String,
    ) -> Result<Self, String> {
        let num = |k: &str| -> Result<usize, String> {
            meta.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| what(format!("metadata '{k}' missing or not a number")))
        };
        let run = match meta.get("dataset") {
            None => None,
            Some(dataset) => Some(RunIdentity {
                dataset: dataset.clone(),
                data_dir: meta.get("data_dir").cloned(),
                batch: num("batch")?,
                seed: meta
                    .get("seed")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| what("metadata 'seed' missing or not a number".into()))?,
                train_limit: match meta.get("train_limit").map(String::as_str) {
                    None | Some("") => None,
                    Some(_) => Some(num("train_limit")?),
                },
                world: num("world")?,
            }),
        };
        Ok(Self {
            model: meta.get("model").cloned().unwrap_or_default(),
            epoch: num("epoch")?,
            global_step: num("global_step")?,
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

/// Everything a checkpoint holds, ready to write or just read.
pub struct Checkpoint {
    /// Training position.
    pub state: TrainState,
    /// Named tensors: `param.NAME`, `momentum.NAME`, `buffer.NAME`.
    pub tensors: HashMap<String, Tensor>,
}

impl Checkpoint {
    /// Captures the model and optimizer state.
    pub fn capture(
        state: TrainState,
        params: &[Param],
        momentum: &[Vec<f32>],
        buffers: &[Buffer],
    ) -> candle_core::Result<Self> {
        let mut tensors = HashMap::new();
        for (p, m) in params.iter().zip(momentum) {
            tensors.insert(format!("param.{}", p.name), p.var.as_tensor().copy()?);
            tensors.insert(
                format!("momentum.{}", p.name),
                Tensor::from_slice(m, p.var.shape(), &Device::Cpu)?,
            );
        }
        for b in buffers {
            let v = b.value.lock().unwrap_or_else(|e| e.into_inner()).clone();
            tensors.insert(format!("buffer.{}", b.name), v);
        }
        Ok(Self { state, tensors })
    }

    /// Writes the checkpoint atomically to `path`.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        self.save_paced(path, false)
    }

    /// [`Checkpoint::save`]; with `slow`, the write pauses between chunks for about two
    /// seconds in all, so a test can kill the process in the middle of it.
    pub fn save_paced(&self, path: &Path, slow: bool) -> Result<(), String> {
        let serialise = |metadata: HashMap<String, String>| {
            safetensors::serialize(
                self.tensors.iter().map(|(k, v)| (k.as_str(), v)),
                Some(metadata),
            )
            .map_err(|e| format!("cannot serialise checkpoint: {e}"))
        };
        // The checksum covers the data section, which the metadata does not change: serialise
        // once to hash it, then again with the digest in the header.
        let mut metadata = self.state.to_metadata();
        let unsigned = serialise(metadata.clone())?;
        let digest = sha256_hex(data_section(&unsigned).ok_or("cannot serialise checkpoint")?);
        drop(unsigned);
        metadata.insert(CHECKSUM_KEY.into(), digest);
        let bytes = serialise(metadata)?;
        crate::output::write_atomically_paced(path, &bytes, slow).map_err(|e| e.to_string())
    }

    /// Reads and checks a checkpoint file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("checkpoint {}: {e}", path.display()))?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses and checks checkpoint bytes; `path` is only used in messages (also the entry
    /// point of the checkpoint fuzz target).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, String> {
        let what = |e: String| format!("checkpoint {}: {e}", path.display());
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| what(format!("not a safetensors file ({e})")))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(FORMAT) {
            return Err(what("not a dptrain checkpoint (no format tag)".into()));
        }
        match meta.get(CHECKSUM_KEY) {
            Some(want) => {
                let got = data_section(bytes).map(sha256_hex).unwrap_or_default();
                if !got.eq_ignore_ascii_case(want) {
                    return Err(format!(
                        "checkpoint {} is corrupt (checksum mismatch: its tensor data hashes to \
                         {got}, it was written as {want}): the file changed after it was \
                         written; resume from another checkpoint",
                        path.display()
                    ));
                }
            }
            None => tracing::warn!(
                "checkpoint {} has no checksum (written by an older dptrain): its tensors \
                 cannot be verified",
                path.display()
            ),
        }
        let state = TrainState::from_metadata(&meta, &what)?;
        let tensors = candle_core::safetensors::load_buffer(bytes, &Device::Cpu)
            .map_err(|e| what(e.to_string()))?;
        Ok(Self { state, tensors })
    }

    /// Copies the stored state into a model and returns the momentum buffers. Fails, naming
    /// the tensor, if the checkpoint is from another model or shape.
    pub fn restore(
        &self,
        model: &str,
        params: &[Param],
        buffers: &[Buffer],
    ) -> Result<Vec<Vec<f32>>, String> {
        if self.state.model != model {
            return Err(format!(
                "the checkpoint is for model '{}', not '{model}': resume with --model {}",
                self.state.model, self.state.model
            ));
        }
        let get = |name: &str, shape: &candle_core::Shape| -> Result<&Tensor, String> {
            let t = self.tensors.get(name).ok_or_else(|| format!("checkpoint has no tensor '{name}': it was written by a different model definition"))?;
            if t.shape() != shape {
                return Err(format!("checkpoint tensor '{name}' has shape {:?}, the model needs {:?} (different dataset shape?)", t.dims(), shape.dims()));
            }
            Ok(t)
        };
        let mut momentum = Vec::with_capacity(params.len());
        for p in params {
            let w = get(&format!("param.{}", p.name), p.var.shape())?;
            p.var.set(w).map_err(|e| e.to_string())?;
            let m = get(&format!("momentum.{}", p.name), p.var.shape())?;
            momentum.push(
                m.flatten_all()
                    .and_then(|m| m.to_vec1::<f32>())
                    .map_err(|e| e.to_string())?,
            );
        }
        for b in buffers {
            let mut slot = b.value.lock().unwrap_or_else(|e| e.into_inner());
            let v = get(&format!("buffer.{}", b.name), slot.shape())?;
            *slot = v.clone();
        }
        Ok(momentum)
    }
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
        if number.is_some_and(|e| e + keep <= epoch) {
            let _ = std::fs::remove_file(&path);
        }
    }
}
