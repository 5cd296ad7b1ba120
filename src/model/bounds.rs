//! The largest model a model file may describe, so that no size computed from one can
//! overflow (`usize`, `u64`) and no file can make the parser recurse, loop or allocate
//! without bound. Every size a user writes is checked against these before it is used.
//!
//! Where the numbers come from:
//! - [`MAX_DIM`] (2^31): a channel count, image side, kernel, stride, padding or dilation
//!   past two thousand million is no real network (ImageNet models: 2048 channels, 299 px);
//!   products of three such numbers fit a `u64` with room to spare.
//! - [`MAX_ELEMENTS`] (2^40, 4 TiB as f32): no tensor (one sample's activation, one layer's
//!   parameters, all parameters) may be larger; times a batch of 2^23 it still fits a `u64`.
//! - [`MAX_LAYERS`] (200,000): ResNet-1001 (He et al., 2016), the deepest network commonly
//!   trained, has about 3,400 layers counted as model files count them (conv, batch norm,
//!   ReLU, add: 10 per bottleneck, 333 bottlenecks); the largest built-in (Inception-v3) has
//!   about 320. 200,000 is 60 times ResNet-1001, and builds in a fraction of a second.
//! - [`MAX_EXPR_DEPTH`] (64) and [`MAX_EXPR_TERMS`] (256): expressions such as
//!   `"$out * 4"` have a handful of terms; the parser and evaluator recurse once per level.
//! - [`MAX_NAME_BYTES`] (1024): a layer name is a label people read.

/// The largest dimension (channels, height, width, kernel, stride, padding, dilation,
/// groups, units, classes).
pub const MAX_DIM: u64 = 1 << 31;

/// The most elements any one tensor may have (a sample's activation, a layer's parameters,
/// the model's parameters).
pub const MAX_ELEMENTS: u64 = 1 << 40;

/// The most layers a model may have once its templates are expanded.
pub const MAX_LAYERS: u64 = 200_000;

/// The deepest nesting of parentheses in an expression.
pub const MAX_EXPR_DEPTH: usize = 64;

/// The most numbers and variables in one expression.
pub const MAX_EXPR_TERMS: usize = 256;

/// The longest layer (or template) name, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
