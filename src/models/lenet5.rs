//! LeNet-5: conv5x5(C->6) relu pool2, conv5x5(6->16) relu pool2, fc 256->120 relu, 120->84 relu,
//! 84->classes (for 1x28x28 input; the first fc's input follows the image size).

use crate::nn::{Block, Conv2d, Flatten, Linear, Relu};
use candle_core::{Device, Result};
use rand_chacha::ChaCha8Rng;

pub(super) fn blocks(
    input: [usize; 3],
    classes: usize,
    rng: &mut ChaCha8Rng,
    dev: &Device,
) -> Result<Vec<Block>> {
    let [c, h, w] = input;
    if h < 12 || w < 12 {
        candle_core::bail!("lenet5 needs images of at least 12x12, got {h}x{w}");
    }
    let (fh, fw) = (((h - 4) / 2 - 4) / 2, ((w - 4) / 2 - 4) / 2);
    // Each conv carries its ReLU and pool fused (see `Conv2d::with_relu` / `with_max_pool`).
    Ok(vec![
        Block::new(
            "conv1",
            vec![Box::new(
                Conv2d::new("conv1", c, 6, 5, 1, 0, false, rng, dev)?
                    .with_relu()
                    .with_max_pool(2),
            )],
        ),
        Block::new(
            "conv2",
            vec![Box::new(
                Conv2d::new("conv2", 6, 16, 5, 1, 0, true, rng, dev)?
                    .with_relu()
                    .with_max_pool(2),
            )],
        ),
        Block::new(
            "fc1",
            vec![
                Box::new(Flatten),
                Box::new(Linear::new("fc1", 16 * fh * fw, 120, rng, dev)?),
                Box::new(Relu),
            ],
        ),
        Block::new(
            "fc2",
            vec![
                Box::new(Linear::new("fc2", 120, 84, rng, dev)?),
                Box::new(Relu),
            ],
        ),
        Block::new(
            "fc3",
            vec![Box::new(Linear::new("fc3", 84, classes, rng, dev)?)],
        ),
    ])
}
