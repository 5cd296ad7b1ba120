//! The network: blocks in order, forward with the graph cut at block boundaries, and the
//! block-wise backward that hands each block's gradients out as soon as they exist.
//!
//! Why cut the graph: candle's `backward()` computes every gradient of a graph at once. To get
//! the last block's gradients before the first block's (so their communication can start while
//! backward goes on), forward detaches each block's input into a fresh `Var`. Backward then runs
//! `loss.backward()` for the last block, and `(out_k * grad_k).sum_all().backward()` for each
//! earlier block k, where `grad_k` is the (detached) gradient that reached block k+1's input.
//! The chain rule makes this exactly the full backward, bit for bit (tested).

use super::{Block, Buffer, Param};
use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

/// A network: an ordered list of blocks plus what it expects as input.
pub struct Net {
    /// Model name (`lenet5`, `vgg-small`, `resnet20`).
    pub name: String,
    /// Blocks in forward order.
    pub blocks: Vec<Block>,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Number of output classes.
    pub classes: usize,
}

/// What forward keeps for the block-wise backward.
pub struct ForwardPass {
    /// Input of each block; for blocks after the first, a detached `Var` that collects the
    /// gradient flowing out of the block.
    inputs: Vec<Tensor>,
    /// Output of each block (still attached to the block's graph).
    outputs: Vec<Tensor>,
}

impl ForwardPass {
    /// The network's output (logits).
    pub fn logits(&self) -> &Tensor {
        self.outputs.last().expect("a net has at least one block")
    }
}

impl Net {
    /// All parameters, in forward order.
    pub fn params(&self) -> Vec<Param> {
        self.blocks.iter().flat_map(|b| b.params()).collect()
    }

    /// All buffers (BatchNorm running statistics), in forward order.
    pub fn buffers(&self) -> Vec<Buffer> {
        self.blocks.iter().flat_map(|b| b.buffers()).collect()
    }

    /// Total number of trainable scalars.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|p| p.numel()).sum()
    }

    /// Forward with the graph cut at every block boundary, for [`Net::backward`].
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<ForwardPass> {
        self.forward_observed(x, train, |_| {})
    }

    /// [`Net::forward`], calling `on_block(k)` as soon as block k's output exists (the timeline
    /// times blocks with it; a closure, so an untraced forward pays nothing for the hook).
    pub fn forward_observed(
        &self,
        x: &Tensor,
        train: bool,
        mut on_block: impl FnMut(usize),
    ) -> Result<ForwardPass> {
        let mut inputs = Vec::with_capacity(self.blocks.len());
        let mut outputs: Vec<Tensor> = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let input = match outputs.last() {
                None => x.clone(),
                // A fresh leaf: backward of block k stops here and leaves the gradient on it.
                Some(prev) if train => Var::from_tensor(&prev.detach())?.as_tensor().clone(),
                Some(prev) => prev.clone(),
            };
            outputs.push(block.forward(&input, train)?);
            inputs.push(input);
            on_block(outputs.len() - 1);
        }
        Ok(ForwardPass { inputs, outputs })
    }

    /// Forward without cuts: one graph from input to logits (for evaluation and for checking
    /// the block-wise backward).
    pub fn forward_uncut(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut x = x.clone();
        for block in &self.blocks {
            x = block.forward(&x, train)?;
        }
        Ok(x)
    }

    /// Block-wise backward from `loss` (computed from `fp.logits()`): calls `on_block(k, grads)`
    /// for k = last..0, with `grads` holding the gradients of block k's parameters, as soon as
    /// they are computed.
    pub fn backward(
        &self,
        fp: &ForwardPass,
        loss: &Tensor,
        mut on_block: impl FnMut(usize, &GradStore) -> Result<()>,
    ) -> Result<()> {
        let last = self.blocks.len() - 1;
        let mut grads = loss.backward()?;
        for k in (0..=last).rev() {
            if k < last {
                let upstream = grads
                    .get(&fp.inputs[k + 1])
                    .ok_or_else(|| {
                        candle_core::Error::Msg(format!("no gradient reached block {}", k + 1))
                    })?
                    .detach();
                grads = (&fp.outputs[k] * &upstream)?.sum_all()?.backward()?;
            }
            on_block(k, &grads)?;
        }
        Ok(())
    }
}
