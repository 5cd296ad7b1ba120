//! VGG-small: conv3x3 pad1 C->32, relu, 32->32, relu, pool2; 32->64, relu, 64->64, relu, pool2;
//! 64->128, relu, pool2; fc 2048->classes (for 32x32 input). One block per conv; each conv carries
//! its ReLU and pool fused.

use super::pooled;
use crate::nn::{Block, Conv2d, Flatten, Layer, Linear};
use candle_core::{Device, Result};
use rand_chacha::ChaCha8Rng;

pub(super) fn blocks(
    input: [usize; 3],
    classes: usize,
    rng: &mut ChaCha8Rng,
    dev: &Device,
) -> Result<Vec<Block>> {
    let [c, h, w] = input;
    if h < 8 || w < 8 {
        candle_core::bail!("vgg-small needs images of at least 8x8, got {h}x{w}");
    }
    // (name, in, out, pool after)
    let convs = [
        ("conv1", c, 32, false),
        ("conv2", 32, 32, true),
        ("conv3", 32, 64, false),
        ("conv4", 64, 64, true),
        ("conv5", 64, 128, true),
    ];
    let mut blocks = Vec::new();
    for (i, &(name, cin, cout, pool)) in convs.iter().enumerate() {
        // Conv, ReLU and pool as one layer: the fused ReLU and pool are nearly free (see
        // `Conv2d::with_relu` / `with_max_pool`); parameter names are unchanged.
        let mut conv = Conv2d::new(name, cin, cout, 3, 1, 1, i > 0, rng, dev)?.with_relu();
        if pool {
            conv = conv.with_max_pool(2);
        }
        let layers: Vec<Box<dyn Layer>> = vec![Box::new(conv)];
        blocks.push(Block::new(name, layers));
    }
    let features = 128 * pooled(h, 3) * pooled(w, 3);
    blocks.push(Block::new(
        "fc",
        vec![
            Box::new(Flatten),
            Box::new(Linear::new("fc", features, classes, rng, dev)?),
        ],
    ));
    Ok(blocks)
}
