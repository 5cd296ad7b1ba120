//! Architecture descriptions for the simulator: a model as blocks of (parameter sizes, forward
//! MACs per sample), one block per layer that has parameters, in forward order; the layers
//! without parameters after it (activations, pools, adds) are folded into it, so a block's
//! gradients are ready once backward has passed everything from its layer on.
//!
//! Every model is a model file (`crate::model`): ours and the reference ImageNet
//! architectures (AlexNet, VGG-16, ResNet-50, Inception-v3 with and without the auxiliary
//! classifier, as torchvision defines them), so one description serves the trainer,
//! `profile` and `simulate`. Parameter counts and MACs come from the graph's shapes.

use crate::model::Graph;

/// One block of an architecture: the unit of gradient readiness, as in [`crate::nn::Block`].
#[derive(Debug, Clone, PartialEq)]
pub struct ArchBlock {
    /// Block name.
    pub name: String,
    /// Element count of each parameter tensor, in layer order.
    pub param_sizes: Vec<usize>,
    /// Forward multiply-accumulates of one sample.
    pub macs: u64,
}

impl ArchBlock {
    /// Parameters in the block.
    pub fn params(&self) -> usize {
        self.param_sizes.iter().sum()
    }
}

/// A model as a list of blocks in forward order.
#[derive(Debug, Clone, PartialEq)]
pub struct Arch {
    /// Model name.
    pub name: String,
    /// Input shape of one sample (C, H, W).
    pub input: [usize; 3],
    /// Blocks in forward order.
    pub blocks: Vec<ArchBlock>,
}

impl Arch {
    /// Total parameters.
    pub fn params(&self) -> usize {
        self.blocks.iter().map(|b| b.params()).sum()
    }

    /// Total forward MACs of one sample.
    pub fn macs(&self) -> u64 {
        self.blocks.iter().map(|b| b.macs).sum()
    }
}

/// Describes model `name` (a built-in name or a model file) on the input its file names.
pub fn describe(name: &str) -> Result<Arch, String> {
    let g = crate::bench::replica::reference_graph(name)?;
    Ok(Arch::from_graph(&g))
}

impl Arch {
    /// The blocks of `g` (see the module's note).
    pub fn from_graph(g: &Graph) -> Arch {
        let seg = segments(g);
        let mut blocks: Vec<ArchBlock> = Vec::new();
        for (i, n) in g.nodes.iter().enumerate().skip(1) {
            if n.params > 0 {
                blocks.push(ArchBlock {
                    name: n.name.clone(),
                    param_sizes: vec![n.params],
                    macs: 0,
                });
            }
            if let Some(b) = seg[i] {
                blocks[b].macs += n.macs;
            }
        }
        // Layers before the first one with parameters belong to it.
        if let Some(first) = blocks.first_mut() {
            first.macs += (1..g.nodes.len())
                .filter(|&i| seg[i].is_none())
                .map(|i| g.nodes[i].macs)
                .sum::<u64>();
        }
        let s = g.input();
        Arch {
            name: g.name.clone(),
            input: [s.c, s.h, s.w],
            blocks,
        }
    }
}

/// The block each graph node belongs to: the last layer with parameters at or before it
/// (`None` before the first).
pub fn segments(g: &Graph) -> Vec<Option<usize>> {
    let mut cur = None;
    let mut count = 0;
    g.nodes
        .iter()
        .map(|n| {
            if n.params > 0 {
                cur = Some(count);
                count += 1;
            }
            cur
        })
        .collect()
}
