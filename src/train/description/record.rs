//! The model description as checkpoint metadata: the record and its keys (see the parent
//! module's comment for what each key holds). Kept apart from the code that loads a model from
//! it, which needs the checkpoint reader that reads this record.

use std::collections::HashMap;

/// The evaluation transform of a dataset read at its own size (`Transforms::OFF`'s text: each
/// image resized whole to the input size only where it is not at it already).
pub const NO_TRANSFORM: &str = "off";

/// Metadata keys of the description (see the module comment).
const KEYS: [&str; 7] = [
    "model_source",
    "model_text",
    "class_names",
    "input_shape",
    "normalize_mean",
    "normalize_std",
    "eval_transform",
];

/// What a checkpoint records about its model beyond the tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDescription {
    /// Where the model came from: `builtin:NAME` or the model file's path as given.
    pub model_source: String,
    /// The model file's absolute path with links resolved, where it could be (key
    /// `model_path`, optional: absent for a built-in, a model laid out in code, and in older
    /// checkpoints): a resume started in another directory than its run finds the file by it
    /// (`crate::train::follow`).
    pub model_path: Option<String>,
    /// The model file's text; `None` for a model laid out in code
    /// ([`crate::model::ModelBuilder`]), which has no file.
    pub model_text: Option<String>,
    /// Class names in label order: an ImageFolder's directory names; `"0"`..`"9"` for MNIST
    /// and IDX sets, [`super::FASHION_MNIST_CLASSES`], [`super::CIFAR10_CLASSES`]; `"0"`.. for synthetic data.
    pub class_names: Vec<String>,
    /// The model's input, `[C, H, W]`.
    pub input: [usize; 3],
    /// Per-channel mean of pixel/255 that inputs are normalised with.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation of pixel/255.
    pub std: Vec<f32>,
    /// The evaluation transforms as text, resolved (`resize-shorter:32,center-crop`;
    /// [`NO_TRANSFORM`]: images used at the input size), as `crate::pipeline::Transforms`
    /// writes and parses them.
    pub eval_transform: String,
    /// How the model's 3x3 stride-1 convolutions were computed in training (`--conv-algo`):
    /// `eval` and `predict` compute them the same way, so their logits are the run's own to
    /// the bit. Key `conv_algo`, optional: a checkpoint without it trained with `direct`.
    pub conv_algo: crate::backend::ConvAlgo,
}

impl ModelDescription {
    /// The metadata entries of this description.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let json = |v: serde_json::Value| v.to_string();
        let mut m = HashMap::new();
        m.insert("model_source".into(), self.model_source.clone());
        if let Some(p) = &self.model_path {
            m.insert("model_path".into(), p.clone());
        }
        if let Some(t) = &self.model_text {
            m.insert("model_text".into(), t.clone());
        }
        m.insert("class_names".into(), json(self.class_names.clone().into()));
        let [c, h, w] = self.input;
        m.insert("input_shape".into(), format!("{c}x{h}x{w}"));
        m.insert("normalize_mean".into(), float_list(&self.mean));
        m.insert("normalize_std".into(), float_list(&self.std));
        m.insert("eval_transform".into(), self.eval_transform.clone());
        m.insert("conv_algo".into(), self.conv_algo.to_string());
        m
    }

    /// Reads the description back: `Ok(None)` when the checkpoint has none (written before
    /// dptrain recorded it); a key present but malformed, or missing beside the others, is an
    /// error, the message naming the key.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<Option<Self>, String> {
        let what = |m: String| m;
        if !KEYS.iter().any(|k| meta.contains_key(*k)) {
            return Ok(None);
        }
        let get = |k: &str| -> Result<&String, String> {
            meta.get(k)
                .ok_or_else(|| what(format!("metadata '{k}' missing from the model description")))
        };
        let json = |k: &str| -> Result<serde_json::Value, String> {
            serde_json::from_str(get(k)?)
                .map_err(|e| what(format!("metadata '{k}' is not JSON: {e}")))
        };
        let class_names: Vec<String> =
            serde_json::from_value(json("class_names")?).map_err(|e| {
                what(format!(
                    "metadata 'class_names' is not a list of names: {e}"
                ))
            })?;
        let floats = |k: &str| -> Result<Vec<f32>, String> {
            let numbers: Vec<serde_json::Number> = serde_json::from_value(json(k)?)
                .map_err(|e| what(format!("metadata '{k}' is not a list of numbers: {e}")))?;
            // Through the decimal text, so each value is the f32 it was written from.
            numbers
                .iter()
                .map(|n| n.to_string().parse::<f32>().ok().filter(|v| v.is_finite()))
                .collect::<Option<_>>()
                .ok_or_else(|| what(format!("metadata '{k}' holds a number that is not an f32")))
        };
        let input = parse_shape(get("input_shape")?).ok_or_else(|| {
            what("metadata 'input_shape' is not CxHxW with positive sizes".into())
        })?;
        let (mean, std) = (floats("normalize_mean")?, floats("normalize_std")?);
        if mean.len() != input[0] || std.len() != input[0] || class_names.is_empty() {
            return Err(what(format!(
                "the model description is inconsistent: {} means, {} deviations and {} class \
                 names for {} input channels",
                mean.len(),
                std.len(),
                class_names.len(),
                input[0]
            )));
        }
        if let Some(bad) = std.iter().find(|&&s| s <= 0.0) {
            return Err(what(format!(
                "metadata 'normalize_std' holds {bad}: a standard deviation divides, so each \
                 is above 0"
            )));
        }
        let conv_algo = match meta.get("conv_algo") {
            None => crate::backend::ConvAlgo::Direct,
            Some(a) => a
                .parse()
                .map_err(|e| what(format!("metadata 'conv_algo': {e}")))?,
        };
        Ok(Some(Self {
            model_source: get("model_source")?.clone(),
            model_path: meta.get("model_path").cloned(),
            model_text: meta.get("model_text").cloned(),
            class_names,
            input,
            mean,
            std,
            eval_transform: get("eval_transform")?.clone(),
            conv_algo,
        }))
    }
}

/// A JSON array of f32 values, each in its shortest text that reads back as the same f32
/// (`[0.1307]`, not the f64 widening's `[0.1307000070810318]`).
fn float_list(values: &[f32]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// `CxHxW` with every size positive.
pub fn parse_shape(s: &str) -> Option<[usize; 3]> {
    let v: Vec<usize> = s
        .split('x')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    match v[..] {
        [c, h, w] if c > 0 && h > 0 && w > 0 => Some([c, h, w]),
        _ => None,
    }
}
