//! `train --weights C [--reinit LAYER,...]`: a new run that starts from a checkpoint's trained
//! weights (fine-tuning), where `--resume` continues the checkpoint's own run exactly.
//!
//! The new run has its own identity: epoch 0, fresh optimizer state (no momentum), the new
//! dataset and settings. Weights and running statistics are copied layer by layer by their
//! PyTorch names. What is not copied is left at the new run's seeded initialisation:
//! - the layers named by `--reinit`;
//! - a classifier head whose shape no longer fits because the class count changed (its output
//!   channels are the classes, and every dimension that differs is the class count): said as a
//!   note, since that is what fine-tuning on another dataset means.
//!
//! Every other mismatch is an error naming the layer and both shapes, and a layer the
//! checkpoint lacks is an error naming it: a silent partial load would train a different model
//! than the one asked for.

use super::checkpoint::{Checkpoint, CheckpointError, Stored};
use crate::nn::Net;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why `--weights` cannot start this run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WeightsError {
    /// The checkpoint could not be read.
    #[error("--weights: {0}")]
    Load(CheckpointError),
    /// `--reinit` names a layer the model does not have (or one without parameters).
    #[error(
        "--reinit {name}: the model '{model}' has no layer '{name}' with parameters; its \
         layers with parameters are: {}",
        layers.join(", ")
    )]
    UnknownLayer {
        /// The name given.
        name: String,
        /// The model.
        model: String,
        /// The model's layers with parameters, in forward order.
        layers: Vec<String>,
    },
    /// A tensor's shape differs, and not because the class count changed.
    #[error(transparent)]
    Shape(Box<ShapeMismatch>),
    /// The checkpoint has no tensor for a layer of the model.
    #[error(transparent)]
    Missing(Box<MissingTensor>),
}

/// A layer of this run's model with no tensor in the checkpoint.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "--weights {}: the checkpoint (model '{from}') has no tensor '{tensor}' for layer '{layer}' \
     of this run's model '{model}'; {}",
    path.display(),
    missing_remedy(from, model, model_flag.as_deref(), layer)
)]
pub struct MissingTensor {
    /// The checkpoint.
    pub path: PathBuf,
    /// The checkpoint's model.
    pub from: String,
    /// The `--model` the checkpoint's run was given, where recorded.
    pub model_flag: Option<String>,
    /// This run's model.
    pub model: String,
    /// The layer.
    pub layer: String,
    /// The tensor's full name.
    pub tensor: String,
}

/// A tensor of the checkpoint whose shape differs from this run's model's.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "--weights {}: layer '{layer}': tensor '{tensor}' is {checkpoint:?} in the checkpoint but \
     {model:?} in this model; {}",
    path.display(),
    shape_remedy(layer, *inputs)
)]
pub struct ShapeMismatch {
    /// The checkpoint.
    pub path: PathBuf,
    /// The layer.
    pub layer: String,
    /// The tensor's full name.
    pub tensor: String,
    /// Its shape in the checkpoint.
    pub checkpoint: Vec<usize>,
    /// Its shape in this run's model.
    pub model: Vec<usize>,
    /// The input (C, H, W) the checkpoint was trained on, and this run's, where they differ:
    /// a layer after `flatten` changes its size with the input's.
    pub inputs: Option<([usize; 3], [usize; 3])>,
}

/// What to do about a layer whose shape differs: train at the checkpoint's input size when the
/// input changed (the likely cause, and it keeps the layer's training), else start it over.
fn shape_remedy(layer: &str, inputs: Option<([usize; 3], [usize; 3])>) -> String {
    let reinit = format!("start that layer from scratch with --reinit {layer}");
    match inputs {
        Some((old, new)) if old[0] == new[0] => format!(
            "the checkpoint was trained on {}x{} inputs and this run's are {}x{}: train on \
             inputs of the checkpoint's size (an image folder or a packed file reads its \
             images at --image-size {}x{}), or {reinit}",
            old[1], old[2], new[1], new[2], old[1], old[2]
        ),
        _ => format!("{reinit}, or use a checkpoint of this model"),
    }
}

/// What to do about a layer the checkpoint lacks: with another model named, train that one,
/// by the `--model` its run was given (`model_flag`, a built-in name or a model file).
fn missing_remedy(from: &str, model: &str, model_flag: Option<&str>, layer: &str) -> String {
    let reinit = format!("start that layer from scratch with --reinit {layer}");
    if from != model {
        let give = match model_flag {
            Some(flag) => format!("give --model {flag}"),
            None => "give the --model its run was given".to_string(),
        };
        format!(
            "to fine-tune the checkpoint's model {give} (the model is not taken from the \
             checkpoint), or {reinit}"
        )
    } else {
        format!("{reinit}, or give a checkpoint of a model that has it")
    }
}

/// The weights a run starts from: a checkpoint and the layers left at their initialisation.
#[derive(Clone)]
pub struct StartWeights {
    checkpoint: Arc<Checkpoint>,
    /// Parameter blocks (by name) that keep the new run's initialisation.
    fresh: BTreeSet<String>,
    /// What was decided, to tell the user at the start (heads re-initialised, `--reinit`).
    pub notes: Vec<String>,
}

impl StartWeights {
    /// Reads `path` and checks it against `net` (this run's model, any batch): `reinit` must
    /// name layers with parameters; every other layer must be in the checkpoint with the same
    /// shapes, but for a head whose class count changed.
    /// `classes` are this run's class names in label order (empty where the data names none):
    /// a head kept at the same class count whose classes are others is said.
    pub fn plan(
        path: &Path,
        net: &Net,
        reinit: &[String],
        classes: &[String],
    ) -> Result<Self, WeightsError> {
        let ck = Checkpoint::load(path).map_err(WeightsError::Load)?;
        let mut start = Self::plan_for(Arc::new(ck), path, net, reinit)?;
        start.notes.extend(start.other_classes(net, classes));
        Ok(start)
    }

    /// A warning when the checkpoint's head is loaded as it is (the class count is the same,
    /// and it is not `--reinit`) but the checkpoint's classes are not this run's `classes`,
    /// label for label: its outputs are taken by position, so each trains as another class
    /// (fine-tuning from cat/dog/fish onto bird/cat/frog, 'cat' learnt as output 0 starts as
    /// 'bird'). The head is the last layer with parameters whose output has a channel per
    /// class.
    fn other_classes(&self, net: &Net, classes: &[String]) -> Option<String> {
        let old = &self.checkpoint.description.as_ref()?.class_names;
        if classes.is_empty()
            || old.len() != classes.len()
            || super::description::same_classes(old, classes)
        {
            return None;
        }
        let g = net.graph();
        let head = net
            .blocks()
            .iter()
            .rev()
            .find(|b| g.nodes[b.node].shape.c == g.classes)?;
        if self.fresh.contains(&head.name) {
            return None;
        }
        let list = super::description::class_list;
        Some(format!(
            "--weights: the checkpoint's classes are {}, this run's {}: its head '{}' is loaded \
             by position, so each output starts as the class the checkpoint had there; give \
             --reinit {} to start the head from scratch",
            list(old),
            list(classes),
            head.name,
            head.name
        ))
    }

    /// [`StartWeights::plan`] for a checkpoint already read from `path`.
    pub fn plan_for(
        ck: Arc<Checkpoint>,
        path: &Path,
        net: &Net,
        reinit: &[String],
    ) -> Result<Self, WeightsError> {
        let layers: Vec<String> = net.blocks().iter().map(|b| b.name.clone()).collect();
        if let Some(name) = reinit.iter().find(|r| !layers.contains(r)) {
            return Err(WeightsError::UnknownLayer {
                name: name.clone(),
                model: net.graph().name.clone(),
                layers,
            });
        }
        let mut fresh: BTreeSet<String> = reinit.iter().cloned().collect();
        let given = fresh.clone();
        let mut notes: Vec<String> = reinit
            .iter()
            .map(|r| format!("--weights: layer '{r}' starts from scratch (--reinit)"))
            .collect();
        let old_classes = ck.description.as_ref().map(|d| d.class_names.len());
        let g = net.graph();
        // Weights that fit any input size (convolutions, a head after global pooling) load
        // silently at another one: said, since features learnt at one scale meet another.
        let input = g.input();
        let trained_input = ck.description.as_ref().map(|d| d.input);
        if let Some(old) = trained_input {
            if old != [input.c, input.h, input.w] {
                notes.push(format!(
                    "--weights: the checkpoint was trained on {}x{}x{} inputs, this run's are \
                     {}x{}x{} (an image folder's are its first image's size unless \
                     --image-size H[xW] is given)",
                    old[0], old[1], old[2], input.c, input.h, input.w
                ));
            }
        }
        for b in net.blocks().iter().filter(|b| !given.contains(&b.name)) {
            let is_head = g.nodes[b.node].shape.c == g.classes;
            let mut head_changed = None;
            for t in b.tensors.iter().chain(&b.state_tensors) {
                let name = format!("{}.{}", b.name, t.suffix);
                let stored = match ck.tensors.get(&name) {
                    Some(Stored::F32(s, _)) => s.clone(),
                    Some(Stored::I64(_)) if t.torch_shape.is_empty() => continue,
                    Some(Stored::I64(_)) => Vec::new(),
                    None => {
                        return Err(WeightsError::Missing(Box::new(MissingTensor {
                            path: path.to_path_buf(),
                            from: ck.state.model.clone(),
                            model_flag: ck.model_flag(path),
                            model: g.name.clone(),
                            layer: b.name.clone(),
                            tensor: name,
                        })))
                    }
                };
                if stored == t.torch_shape {
                    continue;
                }
                let class_dims_only = stored.len() == t.torch_shape.len()
                    && stored.iter().zip(&t.torch_shape).all(|(&old, &new)| {
                        old == new || (new == g.classes && old_classes.is_none_or(|c| c == old))
                    });
                if !(is_head && class_dims_only) {
                    return Err(WeightsError::Shape(Box::new(ShapeMismatch {
                        path: path.to_path_buf(),
                        layer: b.name.clone(),
                        tensor: name,
                        checkpoint: stored,
                        model: t.torch_shape.clone(),
                        inputs: trained_input
                            .filter(|&old| old != [input.c, input.h, input.w])
                            .map(|old| (old, [input.c, input.h, input.w])),
                    })));
                }
                head_changed.get_or_insert((name, stored, t.torch_shape.clone()));
            }
            if let Some((tensor, old, new)) = head_changed {
                notes.push(format!(
                    "--weights: head '{}' starts from scratch: the class count changed ({} in \
                     the checkpoint, {} now; '{tensor}' was {old:?}, is {new:?})",
                    b.name,
                    old_classes.map_or_else(|| "another".to_string(), |c| c.to_string()),
                    g.classes
                ));
                fresh.insert(b.name.clone());
            }
        }
        Ok(Self {
            checkpoint: ck,
            fresh,
            notes,
        })
    }

    /// The layers that keep their initialisation.
    pub fn fresh_layers(&self) -> impl Iterator<Item = &str> {
        self.fresh.iter().map(String::as_str)
    }

    /// Copies the checkpoint's weights and running statistics into `net` (a net of the model
    /// it was planned for), all but the fresh layers. The optimizer state is not taken.
    pub fn apply(&self, net: &mut Net) {
        let blocks = net.blocks().to_vec();
        for b in blocks.iter().filter(|b| !self.fresh.contains(&b.name)) {
            for t in &b.tensors {
                let name = format!("{}.{}", b.name, t.suffix);
                if let Some(Stored::F32(_, src)) = self.checkpoint.tensors.get(&name) {
                    let range = b.range.start + t.offset..b.range.start + t.offset + t.len;
                    t.from_torch(src, &mut net.params_mut()[range]);
                }
            }
            for t in &b.state_tensors {
                let name = format!("{}.{}", b.name, t.suffix);
                let dst = &mut net.state_mut()[b.state_range.clone()][t.offset..t.offset + t.len];
                match self.checkpoint.tensors.get(&name) {
                    Some(Stored::F32(_, src)) => dst.copy_from_slice(src),
                    Some(Stored::I64(v)) => dst[0] = *v as f32,
                    None => {}
                }
            }
        }
    }
}
