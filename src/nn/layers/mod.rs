//! The layers, one file per concept. Each implements [`super::layer::Layer`] by calling the
//! kernels of [`crate::backend::Kernels`]; none touches a buffer's contents itself.

mod activation;
mod batch_norm;
mod conv;
mod dropout;
mod flatten;
mod join;
mod linear;
mod loss;
mod pool;

pub use activation::Activation;
pub use batch_norm::BatchNorm;
pub use conv::Conv;
pub use dropout::Dropout;
pub use flatten::Flatten;
pub use join::{Add, Concat};
pub use linear::Linear;
pub use loss::SoftmaxCrossEntropy;
pub use pool::{AvgPool, GlobalAvgPool, MaxPool};

use super::layer::TensorInfo;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// PyTorch's default initialisation of convolution and linear layers, for weights and biases
/// alike: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)). Values are
/// drawn in PyTorch's element order and stored in ours, so a seed gives the same network
/// whatever our layout.
fn init_uniform(tensors: &[TensorInfo], params: &mut [f32], fan_in: usize, rng: &mut ChaCha8Rng) {
    let bound = 1.0 / (fan_in as f32).sqrt();
    for t in tensors {
        let torch: Vec<f32> = (0..t.len).map(|_| rng.gen_range(-bound..bound)).collect();
        t.from_torch(&torch, &mut params[t.offset..t.offset + t.len]);
    }
}
