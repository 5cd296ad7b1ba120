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
//! Atomic means: write `NAME.tmp`, fsync it, rename it over `NAME`, fsync the directory. A crash
//! at any point leaves either the old file or the new one, never half of one. The data order of
//! an epoch is derived from (seed, epoch), so the epoch number is the whole sampler and RNG
//! state: resuming at an epoch boundary continues bit-exactly.

use crate::nn::{Net, TensorInfo};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Format tag stored in every checkpoint.
pub const FORMAT: &str = "dptrain-checkpoint-2";

/// Prefix of the optimizer's tensors.
const MOMENTUM: &str = "optimizer.momentum.";

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
}

/// Each tensor of `net`'s blocks: (full name, tensor, whether it is state, the block).
fn named(net: &Net) -> Vec<(String, TensorInfo, bool, usize)> {
    let mut v = Vec::new();
    for (bi, b) in net.blocks().iter().enumerate() {
        for t in &b.tensors {
            v.push((format!("{}.{}", b.name, t.suffix), t.clone(), false, bi));
        }
        for t in &b.state_tensors {
            v.push((format!("{}.{}", b.name, t.suffix), t.clone(), true, bi));
        }
    }
    v
}

impl Checkpoint {
    /// Captures the model (weights, running statistics) and the optimizer's momentum (laid
    /// out as the parameters).
    pub fn capture(state: TrainState, net: &Net, momentum: &[f32]) -> Self {
        let mut tensors = BTreeMap::new();
        for (name, t, is_state, bi) in named(net) {
            let b = &net.blocks()[bi];
            if is_state {
                let src = &net.state()[b.state_range.clone()][t.offset..t.offset + t.len];
                let value = if t.torch_shape.is_empty() {
                    Stored::I64(src[0] as i64)
                } else {
                    Stored::F32(t.torch_shape.clone(), src.to_vec())
                };
                tensors.insert(name, value);
                continue;
            }
            let range = b.range.start + t.offset..b.range.start + t.offset + t.len;
            let mut w = vec![0.0; t.len];
            t.to_torch(&net.params()[range.clone()], &mut w);
            tensors.insert(name.clone(), Stored::F32(t.torch_shape.clone(), w));
            let mut m = vec![0.0; t.len];
            t.to_torch(&momentum[range], &mut m);
            tensors.insert(
                format!("{MOMENTUM}{name}"),
                Stored::F32(t.torch_shape.clone(), m),
            );
        }
        Self { state, tensors }
    }

    /// Writes the checkpoint atomically to `path`.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        self.save_paced(path, false)
    }

    /// The checkpoint as safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let metadata: HashMap<String, String> = [
            ("format".to_string(), FORMAT.to_string()),
            ("model".to_string(), self.state.model.clone()),
            (
                "fingerprint".to_string(),
                format!("{:016x}", self.state.fingerprint),
            ),
            ("epoch".to_string(), self.state.epoch.to_string()),
            (
                "global_step".to_string(),
                self.state.global_step.to_string(),
            ),
        ]
        .into();
        let raw: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(k, v)| match v {
                Stored::F32(shape, data) => (
                    k.clone(),
                    Dtype::F32,
                    shape.clone(),
                    data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                Stored::I64(x) => (k.clone(), Dtype::I64, Vec::new(), x.to_le_bytes().to_vec()),
            })
            .collect();
        let views = raw
            .iter()
            .map(|(k, dtype, shape, data)| {
                TensorView::new(*dtype, shape.clone(), data)
                    .map(|v| (k.as_str(), v))
                    .map_err(|e| format!("cannot serialise checkpoint tensor '{k}': {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize(views, Some(metadata))
            .map_err(|e| format!("cannot serialise checkpoint: {e}"))
    }

    /// [`Checkpoint::save`]; with `slow`, the write pauses between chunks for about two
    /// seconds in all, so a test can kill the process in the middle of it.
    pub fn save_paced(&self, path: &Path, slow: bool) -> Result<(), String> {
        write_atomically_paced(path, &self.to_bytes()?, slow)
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
        match meta.get("format").map(String::as_str) {
            Some(FORMAT) => {}
            Some("dptrain-checkpoint-1") => {
                return Err(what("written by an earlier dptrain (before model files): retrain, or resume with that version".into()))
            }
            _ => return Err(what("not a dptrain checkpoint (no format tag)".into())),
        }
        let num = |k: &str| -> Result<usize, String> {
            meta.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| what(format!("metadata '{k}' missing or not a number")))
        };
        let fingerprint = meta
            .get("fingerprint")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| what("metadata 'fingerprint' missing or not a number".into()))?;
        let state = TrainState {
            model: meta.get("model").cloned().unwrap_or_default(),
            fingerprint,
            epoch: num("epoch")?,
            global_step: num("global_step")?,
        };
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
        Ok(Self { state, tensors })
    }

    /// Copies the stored state into `net` and returns the momentum buffer. Fails, naming the
    /// tensor, if the checkpoint is from another model or shape.
    pub fn restore(&self, net: &mut Net) -> Result<Vec<f32>, String> {
        let g = net.graph();
        if self.state.model != g.name {
            return Err(format!(
                "the checkpoint is for model '{}', not '{}': resume with --model {}",
                self.state.model, g.name, self.state.model
            ));
        }
        if self.state.fingerprint != g.fingerprint() {
            return Err(format!(
                "the checkpoint's model '{}' has other layers or shapes than this run's (a changed model file, or another dataset shape)",
                self.state.model
            ));
        }
        let get = |name: &str, shape: &[usize]| -> Result<&[f32], String> {
            match self.tensors.get(name) {
                Some(Stored::F32(s, d)) if s == shape => Ok(d),
                Some(Stored::F32(s, _)) => Err(format!("checkpoint tensor '{name}' has shape {s:?}, the model needs {shape:?}")),
                Some(Stored::I64(_)) => Err(format!("checkpoint tensor '{name}' is an integer, the model needs floats")),
                None => Err(format!("checkpoint has no tensor '{name}': it was written by a different model definition")),
            }
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
                        _ => return Err(format!("checkpoint has no int64 tensor '{name}'")),
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
