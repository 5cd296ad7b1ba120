//! What a checkpoint says about the model it holds, so that `eval`, `predict` and `export` need
//! nothing but the file: the model file's text, the class names, the input size, the input
//! normalisation and the evaluation transforms ([`ModelDescription`]), and the model rebuilt
//! from them with its weights ([`TrainedModel`]).
//!
//! Stored as extra safetensors metadata keys next to the training position (the format tag
//! stays `dptrain-checkpoint-2`: a checkpoint without these keys is still a valid checkpoint of
//! that format, it resumes as before and only `eval`/`predict`/`export` refuse it, with
//! [`CheckpointError::NoDescription`]). Keys, all strings (PyTorch users read them with
//! `safetensors.safe_open(path, "pt").metadata()`):
//!
//! | key | value |
//! |---|---|
//! | `model_source` | `builtin:NAME`, or the model file's path as given to `--model` |
//! | `model_path` | the model file's absolute path, links resolved (absent for a built-in, a model laid out in code, or a path that did not resolve) |
//! | `model_text` | the model file's TOML text (absent for a model laid out in code) |
//! | `class_names` | JSON array of strings, label order |
//! | `input_shape` | `CxHxW` of the model's input |
//! | `normalize_mean`, `normalize_std` | JSON arrays, per channel, of pixel/255 |
//! | `eval_transform` | the evaluation transforms, resolved, as their text (`off`: images used at the input size) |

mod record;

pub use record::{parse_shape, ModelDescription, NO_TRANSFORM};

use super::checkpoint::{Checkpoint, CheckpointError};
use crate::model::{Graph, ModelSpec};
use crate::nn::{Net, NetConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fashion-MNIST's class names, label order (Zalando's README).
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// CIFAR-10's class names, label order (`batches.meta.txt`).
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

impl ModelDescription {
    /// The evaluation transforms, parsed (`path` names the checkpoint in the error).
    pub fn eval_transforms(
        &self,
        path: &Path,
    ) -> Result<crate::pipeline::Transforms, CheckpointError> {
        crate::pipeline::Transforms::parse_eval(&self.eval_transform).map_err(|e| {
            CheckpointError::Invalid {
                path: path.to_path_buf(),
                detail: format!("its evaluation transform does not parse: {e}"),
            }
        })
    }

    /// The model's input size, height x width.
    pub fn image_size(&self) -> crate::pipeline::ImageSize {
        crate::pipeline::ImageSize {
            height: self.input[1],
            width: self.input[2],
        }
    }

    /// The model, parsed from the recorded text; a model recorded without text is loaded by
    /// its built-in name (`builtin:NAME`), else refused ([`CheckpointError::NoModelText`]).
    pub fn spec(&self, path: &Path) -> Result<ModelSpec, CheckpointError> {
        let invalid = |e: crate::model::ModelError| CheckpointError::Invalid {
            path: path.to_path_buf(),
            detail: format!("the recorded model does not load: {e}"),
        };
        match (&self.model_text, self.model_source.strip_prefix("builtin:")) {
            (Some(text), builtin) => {
                let stem = builtin.unwrap_or_else(|| {
                    Path::new(&self.model_source)
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or("model")
                });
                crate::model::file::parse(text, &self.model_source, stem).map_err(invalid)
            }
            (None, Some(name)) => crate::model::load(name).map_err(invalid),
            (None, None) => Err(CheckpointError::NoModelText {
                path: path.to_path_buf(),
                model: self.model_source.clone(),
            }),
        }
    }
}

/// The class names of a training set: an ImageFolder's directory names, the published names
/// of Fashion-MNIST and CIFAR-10, else the labels as numbers (`"0"`..`"9"` for MNIST).
pub fn class_names(source: &crate::pipeline::Source) -> Vec<String> {
    use crate::pipeline::Source;
    match source {
        Source::Folder(f) => f.classes.clone(),
        Source::Packed(p) => p.classes().to_vec(),
        Source::Memory(d) => dataset_class_names(d),
    }
}

/// Class names for a message: the first 8, then how many more.
pub fn class_list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
    match names.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{}, ... ({more} more)", shown.join(", ")),
    }
}

/// Whether two runs' classes are one list, label for label (names compared as
/// [`crate::data::image_folder::same_class_name`] does).
pub fn same_classes(a: &[String], b: &[String]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| crate::data::image_folder::same_class_name(x, y))
}

/// The class names of an in-memory dataset: Fashion-MNIST's and CIFAR-10's by name, others'
/// numbers.
pub fn dataset_class_names(d: &crate::data::Dataset) -> Vec<String> {
    let known: Option<&[&str]> = match d.name.as_str() {
        "fashion-mnist" => Some(&FASHION_MNIST_CLASSES),
        "cifar10" => Some(&CIFAR10_CLASSES),
        _ => None,
    };
    match known {
        Some(names) if names.len() == d.num_classes => {
            names.iter().map(|s| s.to_string()).collect()
        }
        _ => (0..d.num_classes).map(|i| i.to_string()).collect(),
    }
}

/// Where the model `--model` names came from and its file's text: a built-in's embedded file,
/// a model file read again (its parse built the run's graph; a file changed in between is
/// caught when the text is loaded, by the graph's fingerprint), nothing for a model laid out in
/// code.
pub fn model_text(cfg: &crate::config::TrainConfig) -> (String, Option<String>) {
    if let Some(spec) = &cfg.model_spec {
        return (spec.source.clone(), None);
    }
    if let Some((name, text)) = crate::model::BUILTIN.iter().find(|(n, _)| *n == cfg.model) {
        return (format!("builtin:{name}"), Some(text.to_string()));
    }
    if crate::model::builtin_names().contains(&cfg.model.as_str()) {
        // A built-in derived from another's file (inception-v3-noaux): loaded by its name.
        return (format!("builtin:{}", cfg.model), None);
    }
    let text = crate::input::read_text(Path::new(&cfg.model), crate::input::FileKind::ModelFile);
    (cfg.model.clone(), text.ok())
}

/// The description of a run's checkpoints, once the run has resolved its input (image size,
/// evaluation transform, normalisation: `train::inputs::resolve`); a normalisation not yet
/// resolved is left empty for the worker to fill in from its feed.
pub fn describe_run(
    cfg: &crate::config::TrainConfig,
    graph: &Graph,
    source: &crate::pipeline::Source,
) -> ModelDescription {
    let (model_source, model_text) = model_text(cfg);
    let s = graph.input();
    let norm = match &cfg.normalize {
        crate::pipeline::NormalizeChoice::Given(n)
        | crate::pipeline::NormalizeChoice::Resumed(n) => Some(n),
        _ => None,
    };
    // A model file's place, for a resume started elsewhere (a built-in's name resolves to no
    // file; nor, but by accident, one laid out in code).
    let model_path = (cfg.model_spec.is_none() && !model_source.starts_with("builtin:"))
        .then(|| Path::new(&cfg.model).canonicalize().ok())
        .flatten()
        .map(|p| p.display().to_string());
    ModelDescription {
        model_source,
        model_path,
        model_text,
        class_names: class_names(source),
        input: [s.c, s.h, s.w],
        mean: norm.map_or_else(Vec::new, |n| n.mean.clone()),
        std: norm.map_or_else(Vec::new, |n| n.std.clone()),
        eval_transform: cfg
            .eval_transform
            .as_ref()
            .map_or_else(|| NO_TRANSFORM.to_string(), |t| t.to_string()),
        conv_algo: cfg.conv_algo,
    }
}

/// A trained model read from a checkpoint: the checkpoint, its description and the graph
/// rebuilt from it (checked against the checkpoint's fingerprint), ready to make nets with
/// the weights restored ([`TrainedModel::net`]).
pub struct TrainedModel {
    /// The file it was read from.
    pub path: PathBuf,
    /// Tensors and training position.
    pub checkpoint: Checkpoint,
    /// What the checkpoint says about its model.
    pub description: ModelDescription,
    /// The model made concrete for the recorded input and classes.
    pub graph: Arc<Graph>,
}

impl TrainedModel {
    /// Reads `path` and rebuilds its model. Fails with [`CheckpointError::NoDescription`] for
    /// a checkpoint written before dptrain recorded its model, and when the recorded model does
    /// not build the graph the tensors were trained on.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let checkpoint = Checkpoint::load(path)?;
        let description = checkpoint.description(path)?.clone();
        let spec = description.spec(path)?;
        description.eval_transforms(path)?;
        let classes = description.class_names.len();
        let graph = Graph::build(&spec, description.input, classes).map_err(|e| {
            CheckpointError::Invalid {
                path: path.to_path_buf(),
                detail: format!("the recorded model does not build: {e}"),
            }
        })?;
        if graph.fingerprint() != checkpoint.state.fingerprint {
            return Err(CheckpointError::Invalid {
                path: path.to_path_buf(),
                detail: format!(
                    "the recorded model '{}' ({}) is not the one its tensors were trained on \
                     (the model file changed while the run started?)",
                    graph.name, description.model_source
                ),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            checkpoint,
            description,
            graph: Arc::new(graph),
        })
    }

    /// A net for batches of up to `max_batch` samples with the checkpoint's weights and
    /// running statistics (run it with `Mode::Eval`).
    pub fn net(&self, max_batch: usize) -> Result<Net, CheckpointError> {
        let cfg = NetConfig { max_batch, seed: 0 };
        let mut net = Net::for_inference(self.graph.clone(), cfg)
            .map_err(|e| CheckpointError::Tensor(format!("cannot set up the model: {e}")))?;
        self.checkpoint.restore(&mut net)?;
        net.set_conv_algo(self.description.conv_algo);
        Ok(net)
    }

    /// The input normalisation the model was trained with.
    pub fn normalize(&self) -> crate::pipeline::Normalize {
        crate::pipeline::Normalize::new(&self.description.mean, &self.description.std)
    }

    /// The class names, label order.
    pub fn class_names(&self) -> &[String] {
        &self.description.class_names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ModelDescription {
        ModelDescription {
            model_source: "builtin:lenet5".into(),
            model_path: Some("/models/lenet5.toml".into()),
            model_text: Some(crate::model::BUILTIN[0].1.into()),
            class_names: (0..10).map(|i| format!("class, {i}")).collect(),
            input: [1, 28, 28],
            mean: vec![0.1307],
            std: vec![0.3081],
            eval_transform: NO_TRANSFORM.into(),
            conv_algo: crate::backend::ConvAlgo::Auto,
        }
    }

    #[test]
    fn a_description_reads_back_as_written_and_its_absence_is_none() {
        let d = sample();
        let back = ModelDescription::from_metadata(&d.to_metadata()).unwrap();
        assert_eq!(back, Some(d.clone()));
        assert_eq!(back.unwrap().mean[0].to_bits(), 0.1307f32.to_bits());
        assert_eq!(
            ModelDescription::from_metadata(&std::collections::HashMap::new()).unwrap(),
            None
        );
        // A checkpoint from before `conv_algo` was recorded trained with direct convolutions;
        // a value that does not parse is named.
        let mut m = d.to_metadata();
        m.remove("conv_algo");
        let old = ModelDescription::from_metadata(&m).unwrap().unwrap();
        assert_eq!(old.conv_algo, crate::backend::ConvAlgo::Direct);
        m.insert("conv_algo".into(), "fast".into());
        let e = ModelDescription::from_metadata(&m).unwrap_err();
        assert!(e.contains("conv_algo") && e.contains("fast"), "{e}");
        // Half a description is a broken file, named by the key.
        let mut m = d.to_metadata();
        m.remove("input_shape");
        let e = ModelDescription::from_metadata(&m).unwrap_err();
        assert!(e.contains("'input_shape' missing"), "{e}");
        let mut m = d.to_metadata();
        m.insert("normalize_std".into(), "[1, 2]".into());
        let e = ModelDescription::from_metadata(&m).unwrap_err();
        assert!(e.contains("2 deviations"), "{e}");
        // A deviation of 0 or below would divide every input by it.
        for std in ["[0]", "[-1]"] {
            m.insert("normalize_std".into(), std.into());
            let e = ModelDescription::from_metadata(&m).unwrap_err();
            assert!(
                e.contains("'normalize_std' holds") && e.contains("above 0"),
                "{e}"
            );
        }
    }

    #[test]
    fn shapes_parse_only_with_three_positive_sizes() {
        assert_eq!(parse_shape("3x224x224"), Some([3, 224, 224]));
        assert_eq!(parse_shape("0x2x2"), None);
        assert_eq!(parse_shape("3x2"), None);
        assert_eq!(parse_shape("axbxc"), None);
    }

    #[test]
    fn a_model_without_text_loads_by_builtin_name_or_is_refused() {
        let mut d = sample();
        d.model_text = None;
        assert_eq!(d.spec(Path::new("c")).unwrap().name, "lenet5");
        d.model_source = "builder:tiny".into();
        let e = d.spec(Path::new("c")).unwrap_err();
        assert!(matches!(e, CheckpointError::NoModelText { .. }), "{e}");
    }
}
