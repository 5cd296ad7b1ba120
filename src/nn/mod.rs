//! Layers, blocks and the network (Caffe's "layer" and "net", kept apart from the solver).
//!
//! A [`Net`] is an ordered list of [`Block`]s. A block is the unit at which gradients become
//! ready during backward: the parallel engine groups parameters into gradient buckets by block
//! and starts communicating a bucket as soon as backward has passed its blocks.

mod block;
mod layers;
mod net;

pub use block::Block;
pub use layers::{
    BasicBlock, BatchNorm2d, Conv2d, Flatten, GlobalAvgPool, Layer, Linear, MaxPool2d, Relu,
};
pub use net::{ForwardPass, Net};

use candle_core::Var;

/// A trainable tensor and its stable name (used in checkpoints and bucket plans).
#[derive(Debug, Clone)]
pub struct Param {
    /// Dotted name, e.g. `block2.conv.weight`.
    pub name: String,
    /// The tensor; candle's autodiff produces its gradient.
    pub var: Var,
}

impl Param {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.var.as_tensor().elem_count()
    }
}

/// A non-trainable tensor that is part of the model state (BatchNorm running statistics).
#[derive(Debug, Clone)]
pub struct Buffer {
    /// Dotted name, e.g. `block0.bn.running_mean`.
    pub name: String,
    /// The tensor; replaced (not mutated) when it changes.
    pub value: std::sync::Arc<std::sync::Mutex<candle_core::Tensor>>,
}
