//! ResNet-20 for CIFAR (He et al. 2016, section 4.2): conv3x3(C->16)-BN-ReLU, three stages of
//! three basic blocks (16, 32, 64 channels; stride 2 at the start of stages 2 and 3, projection
//! shortcuts there), global average pool, fc 64->classes. One block per basic block.

use crate::nn::{BasicBlock, BatchNorm2d, Block, Conv2d, GlobalAvgPool, Linear, Relu};
use candle_core::{Device, Result};
use rand_chacha::ChaCha8Rng;

pub(super) fn blocks(
    input: [usize; 3],
    classes: usize,
    rng: &mut ChaCha8Rng,
    dev: &Device,
) -> Result<Vec<Block>> {
    let [c, h, w] = input;
    if h < 4 || w < 4 {
        candle_core::bail!("resnet20 needs images of at least 4x4, got {h}x{w}");
    }
    let mut blocks = vec![Block::new(
        "stem",
        vec![
            Box::new(Conv2d::new("stem.conv", c, 16, 3, 1, 1, false, rng, dev)?),
            Box::new(BatchNorm2d::new("stem.bn", 16, dev)?),
            Box::new(Relu),
        ],
    )];
    let mut in_c = 16;
    for (stage, out_c) in [16, 32, 64].into_iter().enumerate() {
        for i in 0..3 {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            let name = format!("layer{}.{i}", stage + 1);
            blocks.push(Block::new(
                name.clone(),
                vec![Box::new(BasicBlock::new(
                    &name, in_c, out_c, stride, rng, dev,
                )?)],
            ));
            in_c = out_c;
        }
    }
    blocks.push(Block::new(
        "head",
        vec![
            Box::new(GlobalAvgPool),
            Box::new(Linear::new("fc", 64, classes, rng, dev)?),
        ],
    ));
    Ok(blocks)
}
