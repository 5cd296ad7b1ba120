//! The reference models. Each is a function that lays out blocks; none has device code.
//!
//! Input adaptation (our choice): a model takes the dataset's channels and image size as they
//! are. Its first conv takes `C` channels and its classifier's input size is computed from the
//! image size, so MNIST (1x28x28) trains on vgg-small without padding or channel copies. With
//! the shapes the models were defined for (3x32x32 for vgg-small and resnet20, 1x28x28 for
//! lenet5) the layers are exactly the reference ones.

mod lenet5;
mod resnet20;
mod vgg_small;

use crate::nn::Net;
use candle_core::{Device, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Names accepted by [`build`].
pub const MODEL_NAMES: [&str; 3] = ["lenet5", "vgg-small", "resnet20"];

/// Builds model `name` for inputs of shape `input` (C, H, W) and `classes` outputs, with weights
/// drawn from `seed` (same seed, same weights, on every worker).
pub fn build(
    name: &str,
    input: [usize; 3],
    classes: usize,
    seed: u64,
    dev: &Device,
) -> Result<Net> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_1717_0000_0001);
    let blocks = match name {
        "lenet5" => lenet5::blocks(input, classes, &mut rng, dev)?,
        "vgg-small" => vgg_small::blocks(input, classes, &mut rng, dev)?,
        "resnet20" => resnet20::blocks(input, classes, &mut rng, dev)?,
        other => candle_core::bail!(
            "unknown model '{other}': choose one of {}",
            MODEL_NAMES.join(", ")
        ),
    };
    Ok(Net {
        name: name.to_string(),
        blocks,
        input,
        classes,
    })
}

/// Spatial size after `n` 2x2/2 max-pools (floor mode).
fn pooled(size: usize, n: u32) -> usize {
    size >> n
}
