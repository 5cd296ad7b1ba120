//! Model descriptions: what a network is, independent of how it runs.
//!
//! A model is a list of named layers, each naming what it reads ([`ModelSpec`], Caffe's
//! prototxt idea), written in a TOML file (`file.rs`, documented in `docs/MODEL_FILES.md`) or
//! laid out in code ([`ModelBuilder`]). [`Graph::build`] makes it concrete for a dataset's
//! input shape and class count: topological order, every shape inferred and checked, every
//! parameter counted. The trainer (`crate::nn::Net`), `dptrain model show`, `profile` and
//! `simulate` all work from that graph.
//!
//! The built-in models are model files in `src/model/builtin/`, embedded in the binary.

pub mod bounds;
pub mod error;
pub mod expr;
pub mod file;
pub mod graph;
pub mod spec;
mod suggest;
pub mod summary;

pub use error::{ModelError, ModelErrorKind};
pub use graph::{Graph, Node, NodeOp, Shape};
pub use spec::{
    BatchNorm, Conv2d, Layer, Linear, ModelBuilder, ModelSpec, Op, OpType, Origin, Pool,
    SoftmaxCrossEntropy, Units, INPUT,
};

use std::path::Path;

/// The built-in models: name and file text. The first five train on this machine; the rest
/// are the simulator's reference architectures (ImageNet-sized), which train too but slowly.
pub const BUILTIN: [(&str, &str); 10] = [
    ("lenet5", include_str!("builtin/lenet5.toml")),
    ("vgg-small", include_str!("builtin/vgg-small.toml")),
    ("resnet20", include_str!("builtin/resnet20.toml")),
    ("resnet18", include_str!("builtin/resnet18.toml")),
    ("mobilenetv2", include_str!("builtin/mobilenetv2.toml")),
    (
        "densenet-small",
        include_str!("builtin/densenet-small.toml"),
    ),
    ("alexnet", include_str!("builtin/alexnet.toml")),
    ("vgg16", include_str!("builtin/vgg16.toml")),
    ("resnet50", include_str!("builtin/resnet50.toml")),
    ("inception-v3", include_str!("builtin/inception-v3.toml")),
];

/// Inception-v3 without its auxiliary classifier: the built-in file minus the layers named
/// `AuxLogits.*` (so the two cannot drift apart).
const NOAUX: &str = "inception-v3-noaux";

/// The names of the built-in models.
pub fn builtin_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
    v.push(NOAUX);
    v
}

/// Loads `--model NAME|FILE`: a built-in name, or the path of a model file.
pub fn load(name_or_path: &str) -> Result<ModelSpec, ModelError> {
    if let Some((name, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
        return file::parse(text, &format!("builtin:{name}"), name);
    }
    if name_or_path == NOAUX {
        let mut spec = load("inception-v3")?;
        spec.layers.retain(|l| !l.name.starts_with("AuxLogits."));
        spec.name = NOAUX.into();
        spec.description =
            "Inception-v3 (torchvision) without the auxiliary classifier, 299x299".into();
        spec.source = format!("builtin:{NOAUX}");
        return Ok(spec);
    }
    let path = Path::new(name_or_path);
    let looks_like_file = name_or_path.ends_with(".toml") || name_or_path.contains('/');
    if !looks_like_file && !path.exists() {
        let names = builtin_names();
        let hint = suggest::closest(name_or_path, names.iter().copied())
            .map(|n| format!("did you mean '{n}'? "))
            .unwrap_or_default();
        return Err(ModelError::file(
            name_or_path,
            None,
            ModelErrorKind::Graph(format!(
                "unknown model: {hint}choose one of {}, or give the path of a model file (.toml, see docs/MODEL_FILES.md)",
                names.join(", ")
            )),
        ));
    }
    let text = crate::input::read_text(path, crate::input::FileKind::ModelFile).map_err(|e| {
        let mut why = e.to_string();
        if path.is_file() && path.extension().is_some_and(|x| x == "safetensors") {
            why += "; it is a checkpoint, not a model file: a checkpoint holds its model, which \
                    eval, predict and export read from it, train --resume continues and train \
                    --weights starts from";
        }
        ModelError::file(name_or_path, None, ModelErrorKind::Read(why))
    })?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    file::parse(&text, name_or_path, stem)
}

/// What `dptrain model show` builds: `spec`'s graph on `input` (default: the file's, else
/// 3x32x32) with `classes` classes (default: the file's, else 10).
pub fn show_graph(
    spec: &ModelSpec,
    input: Option<[usize; 3]>,
    classes: Option<usize>,
) -> Result<Graph, ModelError> {
    let input = input.or(spec.default_input).unwrap_or([3, 32, 32]);
    Graph::build(spec, input, classes.or(spec.default_classes).unwrap_or(10))
}

/// `dptrain model show` on a model file's text (no file read): parsed, built on the
/// file's own input and classes, rendered as the table. What the fuzz target runs.
pub fn show_text(text: &str, file: &str) -> Result<String, ModelError> {
    let spec = file::parse(text, file, "model")?;
    let g = show_graph(&spec, None, None)?;
    Ok(summary::render(&g))
}

/// The graph of `model` on the input it was designed for (its file's `input`, `classes`;
/// 10 classes when it names none).
pub fn reference_graph(model: &str) -> Result<Graph, String> {
    let spec = load(model).map_err(|e| e.to_string())?;
    let input = spec.default_input.ok_or_else(|| {
        format!(
            "model '{}' names no input shape (add `input = [C, H, W]` to its file)",
            spec.name
        )
    })?;
    Graph::build(&spec, input, spec.default_classes.unwrap_or(10)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parameter counts of PyTorch's definitions (../shared/peers/models.py for the first
    /// five, torchvision for the rest), and of our DenseNet.
    #[test]
    fn builtin_models_have_the_reference_parameter_counts() {
        let want = [
            ("lenet5", 44_426),
            ("vgg-small", 159_914),
            ("resnet20", 272_474),
            ("resnet18", 11_173_962),
            ("mobilenetv2", 2_237_770),
            ("alexnet", 61_100_840),
            ("vgg16", 138_357_544),
            ("resnet50", 25_557_032),
            ("inception-v3", 27_161_264),
            ("inception-v3-noaux", 23_834_568),
        ];
        for (name, params) in want {
            let spec = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let input = spec.default_input.expect("built-ins say their input");
            let classes = spec.default_classes.unwrap_or(10);
            let g = Graph::build(&spec, input, classes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(g.num_params(), params, "{name}");
        }
        let d = load("densenet-small").unwrap();
        let g = Graph::build(&d, [3, 32, 32], 10).unwrap();
        assert!(g.nodes.iter().any(|n| n.type_name() == "concat"));
    }
}
