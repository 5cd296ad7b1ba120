//! The vocabulary of a model: layer types with their settings, and the builder that lays them
//! out in code (the same vocabulary as the model files, see `docs/MODEL_FILES.md`).

use super::expr::Expr;
use std::sync::Arc;

/// The name that refers to the network's input (and, inside a template, to the instance's
/// input). No layer may take it.
pub const INPUT: &str = "input";

/// A number of channels or units, possibly known only once shapes are inferred: a literal,
/// the dataset's class count, or an expression of `channels` (the layer's input channels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Units {
    /// A fixed count.
    Fixed(usize),
    /// An expression of `channels` and `classes`, evaluated at shape inference.
    Expr(Expr),
}

impl Units {
    /// The dataset's class count.
    pub fn classes() -> Self {
        Units::Expr(Expr::Var("classes".into()))
    }
}

impl From<usize> for Units {
    fn from(n: usize) -> Self {
        Units::Fixed(n)
    }
}

/// 2-D convolution (PyTorch's `Conv2d`).
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2d {
    /// Output channels.
    pub out: Units,
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Stride (rows, columns).
    pub stride: [usize; 2],
    /// Zero padding (rows, columns), or `None` for "same" (stride 1: output as large as the
    /// input).
    pub padding: Option<[usize; 2]>,
    /// Dilation (rows, columns).
    pub dilation: [usize; 2],
    /// Groups; equal to the input channels for a depthwise convolution.
    pub groups: Units,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Conv2d {
    /// A square `kernel` x `kernel` convolution to `out` channels, stride 1, no padding, bias.
    pub fn new(out: impl Into<Units>, kernel: usize) -> Self {
        Self {
            out: out.into(),
            kernel: [kernel; 2],
            stride: [1; 2],
            padding: Some([0; 2]),
            dilation: [1; 2],
            groups: Units::Fixed(1),
            bias: true,
        }
    }
    /// With this stride in both directions.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s; 2];
        self
    }
    /// With this padding on every side.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = Some([p; 2]);
        self
    }
    /// With this dilation in both directions.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = [d; 2];
        self
    }
    /// With this many groups.
    pub fn groups(mut self, g: impl Into<Units>) -> Self {
        self.groups = g.into();
        self
    }
    /// Depthwise: one group per input channel.
    pub fn depthwise(mut self) -> Self {
        self.groups = Units::Expr(Expr::Var("channels".into()));
        self
    }
    /// Without a bias (a convolution followed by batch norm needs none).
    pub fn no_bias(mut self) -> Self {
        self.bias = false;
        self
    }
}

/// Batch normalisation over channels (PyTorch's `BatchNorm2d` / `BatchNorm1d`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm {
    /// Weight of the current batch in the running statistics.
    pub momentum: f32,
    /// Added to the variance.
    pub eps: f32,
}

impl Default for BatchNorm {
    fn default() -> Self {
        Self {
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

/// A pooling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Stride (defaults to the window).
    pub stride: [usize; 2],
    /// Padding (rows, columns).
    pub padding: [usize; 2],
}

impl Pool {
    /// A square window of `k`, stride `k`, no padding.
    pub fn new(k: usize) -> Self {
        Self {
            kernel: [k; 2],
            stride: [k; 2],
            padding: [0; 2],
        }
    }
    /// With this stride.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s; 2];
        self
    }
    /// With this padding.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = [p; 2];
        self
    }
}

/// Fully connected layer (PyTorch's `Linear`); its input must be flat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Linear {
    /// Output units.
    pub out: Units,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Linear {
    /// A linear layer to `out` units, with bias.
    pub fn new(out: impl Into<Units>) -> Self {
        Self {
            out: out.into(),
            bias: true,
        }
    }
}

/// Softmax cross-entropy against the labels (a loss: its input is the logits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxCrossEntropy {
    /// Label smoothing `eps`: the target is `(1 - eps) * onehot + eps / classes`.
    pub label_smoothing: f32,
    /// Weight of this loss in the total (for auxiliary heads).
    pub weight: f32,
}

impl Default for SoftmaxCrossEntropy {
    fn default() -> Self {
        Self {
            label_smoothing: 0.0,
            weight: 1.0,
        }
    }
}

/// What a layer computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// 2-D convolution.
    Conv2d(Conv2d),
    /// Batch normalisation.
    BatchNorm(BatchNorm),
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, 0), 6)`.
    Relu6,
    /// Max pooling.
    MaxPool(Pool),
    /// Average pooling; `count_include_pad` as in PyTorch (default true).
    AvgPool(Pool, bool),
    /// Mean over the spatial positions: C x H x W to C.
    GlobalAvgPool,
    /// Fully connected layer.
    Linear(Linear),
    /// Dropout with this drop probability (training only).
    Dropout(f32),
    /// Element-wise sum of the inputs (the residual connection).
    Add,
    /// Concatenation of the inputs along channels.
    Concat,
    /// C x H x W to C*H*W, in PyTorch's order.
    Flatten,
    /// The loss.
    SoftmaxCrossEntropy(SoftmaxCrossEntropy),
}

/// Declares [`OpType`] from one list of (variant, model-file name, doc): the enum, its
/// [`OpType::ALL`] and its [`OpType::name`] cannot disagree.
macro_rules! op_types {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// The kinds of layer, without their settings: the one list of the layer types a
        /// model file can name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum OpType {
            $($(#[doc = $doc])* $variant,)*
        }

        impl OpType {
            /// Every layer type, in the order messages list them.
            pub const ALL: &'static [OpType] = &[$(OpType::$variant,)*];

            /// The type name used in model files.
            pub const fn name(self) -> &'static str {
                match self {
                    $(OpType::$variant => $name,)*
                }
            }
        }
    };
}

op_types! {
    /// `conv2d`.
    Conv2d => "conv2d",
    /// `batch_norm`.
    BatchNorm => "batch_norm",
    /// `relu`.
    Relu => "relu",
    /// `relu6`.
    Relu6 => "relu6",
    /// `max_pool`.
    MaxPool => "max_pool",
    /// `avg_pool`.
    AvgPool => "avg_pool",
    /// `global_avg_pool`.
    GlobalAvgPool => "global_avg_pool",
    /// `linear`.
    Linear => "linear",
    /// `dropout`.
    Dropout => "dropout",
    /// `add`.
    Add => "add",
    /// `concat`.
    Concat => "concat",
    /// `flatten`.
    Flatten => "flatten",
    /// `softmax_cross_entropy`.
    SoftmaxCrossEntropy => "softmax_cross_entropy",
}

impl OpType {
    /// The type a model file's `type = NAME` names, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name() == name)
    }
}

impl Op {
    /// Its type.
    pub fn op_type(&self) -> OpType {
        match self {
            Op::Conv2d(_) => OpType::Conv2d,
            Op::BatchNorm(_) => OpType::BatchNorm,
            Op::Relu => OpType::Relu,
            Op::Relu6 => OpType::Relu6,
            Op::MaxPool(_) => OpType::MaxPool,
            Op::AvgPool(..) => OpType::AvgPool,
            Op::GlobalAvgPool => OpType::GlobalAvgPool,
            Op::Linear(_) => OpType::Linear,
            Op::Dropout(_) => OpType::Dropout,
            Op::Add => OpType::Add,
            Op::Concat => OpType::Concat,
            Op::Flatten => OpType::Flatten,
            Op::SoftmaxCrossEntropy(_) => OpType::SoftmaxCrossEntropy,
        }
    }

    /// The type name used in model files.
    pub fn type_name(&self) -> &'static str {
        self.op_type().name()
    }

    /// Every type name a model file can use, in [`OpType::ALL`]'s order.
    pub fn type_names() -> impl Iterator<Item = &'static str> {
        OpType::ALL.iter().map(|t| t.name())
    }
}

/// Where a layer was defined (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The model file.
    pub file: Arc<str>,
    /// 1-based line of the layer's table (of the template instance, for template layers: the
    /// template's line is in `template_line`).
    pub line: usize,
    /// For a layer made by a template: the line of its definition in the template.
    pub template_line: Option<usize>,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)?;
        if let Some(t) = self.template_line {
            write!(f, " (template line {t})")?;
        }
        Ok(())
    }
}

/// One layer: its unique name, what it computes and what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Unique name; parameter names are `NAME.weight`, `NAME.bias`, ...
    pub name: String,
    /// The computation.
    pub op: Op,
    /// Names of the layers read ([`INPUT`] for the network's input), in order.
    pub inputs: Vec<String>,
    /// Where it was defined, if it came from a file.
    pub origin: Option<Origin>,
}

/// A model: its layers, in the order they were written.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Model name (checkpoints and reports use it).
    pub name: String,
    /// One line on what it is.
    pub description: String,
    /// The input (C, H, W) the model was designed for, used when no dataset gives one
    /// (`model show`, `profile`).
    pub default_input: Option<[usize; 3]>,
    /// The class count it was designed for (ImageNet models: 1000), used likewise.
    pub default_classes: Option<usize>,
    /// Layers in file order.
    pub layers: Vec<Layer>,
    /// Where it came from (a path, or `builtin:NAME`).
    pub source: String,
}

/// Lays out a model in code, with the model files' vocabulary:
///
/// ```
/// use dptrain::model::{ModelBuilder, Conv2d, Linear, Pool, INPUT};
/// let mut m = ModelBuilder::new("tiny");
/// let x = m.conv2d("conv1", INPUT, Conv2d::new(8, 3).padding(1));
/// let x = m.relu(&x);
/// let x = m.max_pool(&x, Pool::new(2));
/// let x = m.flatten(&x);
/// m.linear("fc", &x, Linear::new(dptrain::model::Units::classes()));
/// let spec = m.build();
/// assert_eq!(spec.layers.len(), 5);
/// ```
pub struct ModelBuilder {
    spec: ModelSpec,
}

impl ModelBuilder {
    /// Starts an empty model.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            spec: ModelSpec {
                source: format!("builder:{name}"),
                name,
                description: String::new(),
                default_input: None,
                default_classes: None,
                layers: Vec::new(),
            },
        }
    }

    /// Sets the input shape the model is designed for.
    pub fn default_input(mut self, c: usize, h: usize, w: usize) -> Self {
        self.spec.default_input = Some([c, h, w]);
        self
    }

    /// Adds a layer named `name` computing `op` on `inputs`; returns its name.
    pub fn layer(&mut self, name: impl Into<String>, op: Op, inputs: &[&str]) -> String {
        let name = name.into();
        self.spec.layers.push(Layer {
            name: name.clone(),
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            origin: None,
        });
        name
    }

    fn unnamed(&mut self, op: Op, inputs: &[&str]) -> String {
        let name = format!("{}_{}", op.type_name(), self.spec.layers.len());
        self.layer(name, op, inputs)
    }

    /// A convolution.
    pub fn conv2d(&mut self, name: &str, input: &str, c: Conv2d) -> String {
        self.layer(name, Op::Conv2d(c), &[input])
    }
    /// Batch normalisation with PyTorch's defaults.
    pub fn batch_norm(&mut self, name: &str, input: &str) -> String {
        self.layer(name, Op::BatchNorm(BatchNorm::default()), &[input])
    }
    /// A ReLU.
    pub fn relu(&mut self, input: &str) -> String {
        self.unnamed(Op::Relu, &[input])
    }
    /// A ReLU6.
    pub fn relu6(&mut self, input: &str) -> String {
        self.unnamed(Op::Relu6, &[input])
    }
    /// Max pooling.
    pub fn max_pool(&mut self, input: &str, p: Pool) -> String {
        self.unnamed(Op::MaxPool(p), &[input])
    }
    /// Average pooling (padding counted, as PyTorch's default).
    pub fn avg_pool(&mut self, input: &str, p: Pool) -> String {
        self.unnamed(Op::AvgPool(p, true), &[input])
    }
    /// Global average pooling.
    pub fn global_avg_pool(&mut self, input: &str) -> String {
        self.unnamed(Op::GlobalAvgPool, &[input])
    }
    /// A fully connected layer.
    pub fn linear(&mut self, name: &str, input: &str, l: Linear) -> String {
        self.layer(name, Op::Linear(l), &[input])
    }
    /// Dropout.
    pub fn dropout(&mut self, input: &str, p: f32) -> String {
        self.unnamed(Op::Dropout(p), &[input])
    }
    /// Element-wise sum.
    pub fn add(&mut self, inputs: &[&str]) -> String {
        self.unnamed(Op::Add, inputs)
    }
    /// Channel concatenation.
    pub fn concat(&mut self, inputs: &[&str]) -> String {
        self.unnamed(Op::Concat, inputs)
    }
    /// Flatten.
    pub fn flatten(&mut self, input: &str) -> String {
        self.unnamed(Op::Flatten, &[input])
    }

    /// The finished model.
    pub fn build(self) -> ModelSpec {
        self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_name_reads_back_as_its_type() {
        for &t in OpType::ALL {
            assert_eq!(OpType::from_name(t.name()), Some(t));
        }
        assert_eq!(OpType::from_name("convolution"), None);
        assert_eq!(Op::Dropout(0.5).type_name(), "dropout");
    }
}
