//! Checkpoints: safetensors files with the weights, optimizer state, BatchNorm statistics and
//! the position in training, written atomically.
//!
//! Atomic means: write `NAME.tmp`, fsync it, rename it over `NAME`, fsync the directory. A crash
//! at any point leaves either the old file or the new one, never half of one. The data order of
//! an epoch is derived from (seed, epoch), so the epoch number is the whole sampler and RNG
//! state: resuming at an epoch boundary continues bit-exactly.

use crate::nn::{Buffer, Param};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Format tag stored in every checkpoint.
pub const FORMAT: &str = "dptrain-checkpoint-1";

/// Position in training stored with the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainState {
    /// Model name (checked on load).
    pub model: String,
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps completed.
    pub global_step: usize,
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
        let metadata: HashMap<String, String> = [
            ("format".to_string(), FORMAT.to_string()),
            ("model".to_string(), self.state.model.clone()),
            ("epoch".to_string(), self.state.epoch.to_string()),
            (
                "global_step".to_string(),
                self.state.global_step.to_string(),
            ),
        ]
        .into();
        let bytes = safetensors::serialize(
            self.tensors.iter().map(|(k, v)| (k.as_str(), v)),
            Some(metadata),
        )
        .map_err(|e| format!("cannot serialise checkpoint: {e}"))?;
        write_atomically_paced(path, &bytes, slow)
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
        let num = |k: &str| -> Result<usize, String> {
            meta.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| what(format!("metadata '{k}' missing or not a number")))
        };
        let state = TrainState {
            model: meta.get("model").cloned().unwrap_or_default(),
            epoch: num("epoch")?,
            global_step: num("global_step")?,
        };
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

/// Writes `bytes` to `path` so that a crash leaves either the old file or the new one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    write_atomically_paced(path, bytes, false)
}

fn write_atomically_paced(path: &Path, bytes: &[u8], slow: bool) -> Result<(), String> {
    let err = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", path.display());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tmp_path(path);
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| err("create temporary file for", e))?;
        if slow {
            let chunk = bytes.len().div_ceil(20).max(1);
            for part in bytes.chunks(chunk) {
                f.write_all(part).map_err(|e| err("write", e))?;
                f.flush().map_err(|e| err("write", e))?;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        } else {
            f.write_all(bytes).map_err(|e| err("write", e))?;
        }
        f.sync_all().map_err(|e| err("fsync", e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| err("rename into place", e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
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
