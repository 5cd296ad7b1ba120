//! A block: a named sequence of layers, the unit of gradient readiness.

use super::{Buffer, Layer, Param};
use candle_core::{Result, Tensor};

/// A named sequence of layers run one after the other.
pub struct Block {
    /// Name used as the prefix of every parameter name in the block.
    pub name: String,
    layers: Vec<Box<dyn Layer>>,
}

impl Block {
    /// Makes a block from its layers, in forward order.
    pub fn new(name: impl Into<String>, layers: Vec<Box<dyn Layer>>) -> Self {
        Self {
            name: name.into(),
            layers,
        }
    }

    /// Runs every layer in order.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward(&x, train)?;
        }
        Ok(x)
    }

    /// The block's parameters, in layer order.
    pub fn params(&self) -> Vec<Param> {
        self.layers.iter().flat_map(|l| l.params()).collect()
    }

    /// The block's buffers (running statistics), in layer order.
    pub fn buffers(&self) -> Vec<Buffer> {
        self.layers.iter().flat_map(|l| l.buffers()).collect()
    }

    /// Multiply-accumulates of one sample's forward pass, given the block's input shape
    /// (C, H, W or features); returns them and the output shape.
    pub fn flops(&self, input: &[usize]) -> (u64, Vec<usize>) {
        let mut shape = input.to_vec();
        let mut total = 0;
        for l in &self.layers {
            let (f, s) = l.macs(&shape);
            total += f;
            shape = s;
        }
        (total, shape)
    }
}
