//! Layers and the network that runs them (Caffe's "layer" and "net", kept apart from the
//! solver, `crate::optim`).
//!
//! [`Net`] runs a [`crate::model::Graph`]: forward in topological order into buffers
//! allocated once, backward in reverse order writing each layer's parameter gradients into a
//! [`GradSink`] (the reducer's bucket buffers in training) and reporting each layer as soon as
//! its gradients exist, which is when the reducer may start communicating them.

pub(crate) mod flow;
pub mod layer;
pub mod layers;
mod net;

pub use layer::{BackwardPart, LossReport, Mode, StepInfo, TensorInfo, TensorLayout};
pub use net::{
    conv_geometries, ExecDone, FlatGrads, GradSink, Net, NetConfig, NetError, ParamBlock,
};
