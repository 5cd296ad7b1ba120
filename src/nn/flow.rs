//! A net's data flow from its graph alone, before any layer is built or buffer allocated: which
//! activations run inside the layer before them (`Fusion`), each exec's reads and write and
//! whether its backward runs (`flows`), and the gradient buffers shared by liveness
//! (`gradient_slots`).
//!
//! [`super::Net`] builds its execs and allocates its buffers from these; `plan::memory` sizes
//! the same buffers from them without building a net. One walk for both, so the memory
//! estimate is what the net allocates (`plan::memory`'s test holds them equal).

use crate::backend::Act;
use crate::model::{Graph, Op};

/// The readers of each node, in node order.
pub(crate) fn readers(g: &Graph) -> Vec<Vec<usize>> {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &j in &n.inputs {
            readers[j].push(i);
        }
    }
    readers
}

/// Which activations run inside the layer before them: a `relu`/`relu6` whose input is a
/// `conv2d`, `batch_norm`, `linear` or `add` read by nothing else.
pub(crate) struct Fusion {
    /// Per node: for a fused activation, the producer it runs in.
    pub fused_into: Vec<Option<usize>>,
    /// Per node: for a producer, the activation fused into it.
    pub act: Vec<Act>,
    /// Per node: the node whose buffer holds its value (a fused producer's is its
    /// activation's).
    pub value_of: Vec<usize>,
}

impl Fusion {
    /// The fusion of `g`, whose nodes' readers are `readers`.
    pub fn plan(g: &Graph, readers: &[Vec<usize>]) -> Self {
        let nn = g.nodes.len();
        let mut fused_into = vec![None; nn];
        let mut act = vec![Act::None; nn];
        for (j, n) in g.nodes.iter().enumerate() {
            let a = match n.layer() {
                Some(Op::Relu) => Act::Relu,
                Some(Op::Relu6) => Act::Relu6,
                _ => continue,
            };
            let i = n.inputs[0];
            let fusable = matches!(
                g.nodes[i].layer(),
                Some(Op::Conv2d(_) | Op::BatchNorm(_) | Op::Linear(_) | Op::Add)
            );
            if fusable && readers[i].len() == 1 && act[i] == Act::None {
                fused_into[j] = Some(i);
                act[i] = a;
            }
        }
        let mut value_of: Vec<usize> = (0..nn).collect();
        for (j, into) in fused_into.iter().enumerate() {
            if let Some(i) = *into {
                value_of[i] = j;
            }
        }
        Self {
            fused_into,
            act,
            value_of,
        }
    }
}

/// One exec's data flow: a graph node that is not a fused activation, in node (topological)
/// order.
pub(crate) struct Flow {
    /// The graph node it runs (the layer, not a fused activation).
    pub node: usize,
    /// The graph node whose buffer it writes.
    pub out: usize,
    /// The graph nodes whose buffers it reads.
    pub inputs: Vec<usize>,
    /// Whether the layer has parameters.
    pub params: bool,
    /// A loss (no output buffer, no output gradient).
    pub loss: bool,
    /// Whether its backward runs: parameters here or upstream.
    pub backward: bool,
    /// Per input: whether a gradient is needed (none for the data, nor for a branch without
    /// parameters upstream).
    pub needs_dx: Vec<bool>,
}

/// The execs of `g` under `fusion`, with which of them run backward.
pub(crate) fn flows(g: &Graph, fusion: &Fusion) -> Vec<Flow> {
    let mut needs_grad = vec![false; g.nodes.len()];
    let mut flows = Vec::new();
    for (i, n) in g.nodes.iter().enumerate().skip(1) {
        if fusion.fused_into[i].is_some() {
            continue;
        }
        let inputs: Vec<usize> = n.inputs.iter().map(|&j| fusion.value_of[j]).collect();
        let needs_dx: Vec<bool> = inputs.iter().map(|&j| needs_grad[j]).collect();
        let (params, loss) = (
            n.params > 0,
            matches!(n.layer(), Some(Op::SoftmaxCrossEntropy(_))),
        );
        let backward = params || needs_dx.iter().any(|&b| b);
        let out = fusion.value_of[i];
        needs_grad[out] = backward && !loss;
        flows.push(Flow {
            node: i,
            out,
            inputs,
            params,
            loss,
            backward,
            needs_dx,
        });
    }
    flows
}

/// The gradient buffers' sizes and each graph node's buffer: a gradient lives from the
/// backward of its tensor's last reader to the backward of its producer, and buffers whose
/// lives do not overlap are the same memory. `numel(j)` is the size of node `j`'s gradient;
/// `nn` the graph's node count.
pub(crate) fn gradient_slots(
    flows: &[Flow],
    nn: usize,
    numel: impl Fn(usize) -> usize,
) -> (Vec<usize>, Vec<Option<usize>>) {
    let mut slot: Vec<Option<usize>> = vec![None; nn];
    let mut sizes: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    for f in flows.iter().rev().filter(|f| f.backward) {
        for (&j, _) in f.inputs.iter().zip(&f.needs_dx).filter(|(_, &n)| n) {
            if slot[j].is_none() {
                let b = take_free(&mut free, &mut sizes);
                sizes[b] = sizes[b].max(numel(j));
                slot[j] = Some(b);
            }
        }
        // This exec's output gradient dies here.
        if let (Some(b), false) = (slot[f.out], f.loss) {
            free.push(b);
        }
    }
    (sizes, slot)
}

/// A free buffer of those sized in `sizes` (the largest, to be grown if needed), else a new
/// one of size 0.
pub(crate) fn take_free(free: &mut Vec<usize>, sizes: &mut Vec<usize>) -> usize {
    let largest = free
        .iter()
        .enumerate()
        .max_by_key(|(_, &b)| sizes[b])
        .map(|(fi, _)| fi);
    match largest {
        Some(fi) => free.swap_remove(fi),
        None => {
            sizes.push(0);
            sizes.len() - 1
        }
    }
}
