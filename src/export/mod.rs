//! Exporting a trained network for serving elsewhere: `dptrain export` writes an ONNX
//! inference graph ([`onnx`]) from a built [`crate::nn::Net`] (its graph, weights and batch-norm
//! running statistics).

pub mod onnx;

pub use onnx::{to_onnx, write_onnx, ExportError, BATCH_DIM, INPUT_NAME, OPSET, OUTPUT_NAME};
