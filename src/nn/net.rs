//! The executable network (Caffe's Net): a [`Graph`]'s layers with every buffer allocated once,
//! an explicit forward, and a backward in reverse topological order that writes each layer's
//! parameter gradients straight into the caller's memory (the reducer's bucket buffers) and
//! reports each layer as soon as it is done (a convolution hands its parameter gradient over
//! before it computes its input gradient, so its bucket can leave meanwhile).
//!
//! Set-up (once, for batches of up to `max_batch` samples), one pass each:
//! - fusion (`flow::Fusion::plan`): a `relu`/`relu6` whose input is a `conv2d`,
//!   `batch_norm`, `linear` or `add` read by nothing else runs inside that layer (the
//!   activation is applied to the output in cache, and backward masks the gradient in
//!   place), one "exec" instead of two; each exec's reads and write, and which layers need a
//!   backward at all (those with parameters or upstream of one) and which inputs need a
//!   gradient (no gradient for the data, nor for a branch without parameters upstream)
//!   (`flow::flows`, the data flow `plan::memory` sizes too); then the execs with their layers
//!   and parameter blocks (`ExecLayout::build`);
//! - for each tensor read by several layers, which reader's gradient is written first (the
//!   last reader in forward order) and which ones add to it: a fixed order of additions
//!   (`mark_accumulating`);
//! - gradient buffers for activations, shared by liveness: a gradient lives from the backward
//!   of its tensor's last reader to the backward of its producer, and buffers whose lives do
//!   not overlap are the same memory (`flow::gradient_slots`);
//! - one activation buffer per exec output (all are read by backward) (`activation_buffers`).
//!
//! A net set up for inference only ([`Net::for_inference`], what evaluation and prediction
//! need) runs the same layers and kernels, so its logits are the same bits, but it keeps no
//! activation for a backward: no gradient buffers at all, and activation buffers shared by
//! liveness (a value lives from its exec to its last reader's; the logits are kept), so its
//! memory is a few of the largest activations instead of all of them
//! (`shared_activation_buffers`).
//!
//! Parameters live in one flat vector, a contiguous block per layer ([`ParamBlock`]);
//! gradients have the same block layout wherever they are ([`GradSink`]).

use super::flow::{self, Flow, Fusion};
use super::layer::{
    Backward, BackwardPart, Forward, Layer, LossReport, Mode, StepInfo, TensorInfo, MAX_INPUTS,
};
use super::layers;
use crate::backend::sum_order::{BATCH_CHUNK, BN_BATCH_CHUNK};
use crate::backend::{default_kernels, Act, ConvAlgo, ConvGeom, Kernels, PoolGeom};
use crate::model::{Conv2d, Graph, Op, Pool, Shape, Units};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::ops::Range;
use std::sync::Arc;

/// Where parameter gradients go during backward: the block of one layer, same layout as its
/// parameters. The reducer hands out views into its bucket buffers (PyTorch DDP's
/// `gradient_as_bucket_view`: no copy).
pub trait GradSink {
    /// The gradient memory of parameter block `block` (overwritten by backward).
    fn block_grads(&mut self, block: usize) -> &mut [f32];
    /// Backward has finished writing block `block` (the reducer may send its bucket).
    fn block_written(&mut self, _block: usize) -> Result<(), String> {
        Ok(())
    }
}

/// A gradient buffer per block, for code that needs gradients without a reducer (profiling,
/// benchmarks, tests).
pub struct FlatGrads {
    /// The gradients, laid out as the parameters.
    pub data: Vec<f32>,
    ranges: Vec<Range<usize>>,
}

impl FlatGrads {
    /// Zeroed gradients for `net`'s parameters.
    pub fn for_net(net: &Net) -> Self {
        Self {
            data: vec![0.0; net.params().len()],
            ranges: net.blocks().iter().map(|b| b.range.clone()).collect(),
        }
    }
    /// Block `b`'s gradient.
    pub fn block(&self, b: usize) -> &[f32] {
        &self.data[self.ranges[b].clone()]
    }
}

impl GradSink for FlatGrads {
    fn block_grads(&mut self, block: usize) -> &mut [f32] {
        &mut self.data[self.ranges[block].clone()]
    }
}

/// The parameters (and state) of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamBlock {
    /// The layer's name (tensor names are `NAME.SUFFIX`).
    pub name: String,
    /// Its graph node.
    pub node: usize,
    /// Its exec (index into [`Net::exec_names`]).
    pub exec: usize,
    /// Range in [`Net::params`].
    pub range: Range<usize>,
    /// Range in [`Net::state`].
    pub state_range: Range<usize>,
    /// The parameter tensors (offsets within the block).
    pub tensors: Vec<TensorInfo>,
    /// The state tensors (offsets within the state block).
    pub state_tensors: Vec<TensorInfo>,
}

/// How a net is set up.
#[derive(Debug, Clone, Copy)]
pub struct NetConfig {
    /// The largest batch a call may pass.
    pub max_batch: usize,
    /// Seed of the initial weights (same seed, same weights).
    pub seed: u64,
}

/// One step of the forward list: a layer (maybe with an activation fused in).
struct Exec {
    /// Graph node whose activation it writes.
    out: usize,
    /// Display name (the primary layer's).
    name: String,
    /// The primary graph node (the layer, not a fused activation).
    node: usize,
    /// Graph nodes it reads.
    inputs: Vec<usize>,
    /// Per input: whether backward adds to its gradient (another reader wrote it first).
    acc: Vec<bool>,
    /// Per input: whether a gradient is needed.
    needs_dx: Vec<bool>,
    /// Parameter block, if any.
    block: Option<usize>,
    /// Whether backward runs (parameters here or upstream).
    backward: bool,
    /// A loss (no output gradient).
    loss: bool,
    layer: Box<dyn Layer>,
}

/// What a backward reports after each exec.
#[derive(Debug, Clone, Copy)]
pub struct ExecDone {
    /// The exec.
    pub exec: usize,
    /// Its parameter block, now written (`None` for an exec without one, and for the second
    /// report of a layer that splits its backward, whose block the first report carried).
    pub block: Option<usize>,
}

/// An executable network.
pub struct Net {
    graph: Arc<Graph>,
    execs: Vec<Exec>,
    /// Activation buffers: one per graph node in training (empty for nodes fused away and for
    /// losses), shared by liveness in inference.
    acts: Vec<Vec<f32>>,
    /// Graph node -> its activation buffer in `acts` (`usize::MAX` for a node without one in
    /// an inference net).
    act_slot: Vec<usize>,
    /// Set up for inference only: no backward.
    inference: bool,
    /// Gradient buffers, shared by liveness.
    grads: Vec<Vec<f32>>,
    /// Graph node -> gradient buffer.
    grad_slot: Vec<Option<usize>>,
    params: Vec<f32>,
    state: Vec<f32>,
    blocks: Vec<ParamBlock>,
    kernels: Box<dyn Kernels>,
    max_batch: usize,
    /// The batch size of the last forward (what backward runs on).
    last_n: usize,
    last_step: StepInfo,
    labels: Vec<u32>,
}

/// Why a net cannot be built for a graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NetError(pub String);

/// What [`Net::forward_gated`] calls before each exec with parameter block `b`:
/// `gate(b, params, blocks)`, the parameters to change in place.
pub type ForwardGate<'a, E> = dyn FnMut(usize, &mut [f32], &[ParamBlock]) -> Result<(), E> + 'a;

impl Net {
    /// Sets up `graph` for batches of up to `cfg.max_batch` samples with weights from
    /// `cfg.seed`, on the CPU backend.
    pub fn new(graph: Arc<Graph>, cfg: NetConfig) -> Result<Self, NetError> {
        Self::with_kernels(graph, cfg, default_kernels())
    }

    /// [`Net::new`] on given kernels.
    pub fn with_kernels(
        graph: Arc<Graph>,
        cfg: NetConfig,
        kernels: Box<dyn Kernels>,
    ) -> Result<Self, NetError> {
        Self::build(graph, cfg, kernels, false)
    }

    /// [`Net::new`] for inference only (evaluation, prediction): the same parameters, layers
    /// and kernels (its evaluation logits are the same bits), but no gradient buffers and
    /// activation buffers shared by liveness; [`Net::backward`] fails on it.
    pub fn for_inference(graph: Arc<Graph>, cfg: NetConfig) -> Result<Self, NetError> {
        Self::build(graph, cfg, default_kernels(), true)
    }

    fn build(
        graph: Arc<Graph>,
        cfg: NetConfig,
        mut kernels: Box<dyn Kernels>,
        inference: bool,
    ) -> Result<Self, NetError> {
        kernels.set_batch_chunk(batch_chunk(&graph));
        let g = &*graph;
        let (mb, nn) = (cfg.max_batch.max(1), g.nodes.len());
        let readers = readers_of(g)?;
        let fusion = Fusion::plan(g, &readers);
        let flows = flow::flows(g, &fusion);
        let mut layout = ExecLayout::build(g, &fusion, &flows, mb)?;
        // Each node's shape is within model::bounds (at most 2^40 elements), but the batch is
        // the user's: every buffer length, and their sum, checked before the closure below
        // multiplies unchecked.
        let total = g.nodes.iter().try_fold(0usize, |sum, n| {
            mb.checked_mul(n.shape.numel())
                .and_then(|len| sum.checked_add(len))
        });
        if total.is_none() {
            return Err(NetError(format!(
                "a batch of {mb} makes the activation buffers of {} overflow a 64-bit size: use a smaller --batch",
                g.name
            )));
        }
        let numel = |j: usize| mb * g.nodes[j].shape.numel();
        let ((grads, grad_slot), (acts, act_slot)) = if inference {
            let keep = fusion.value_of[g.logits()];
            let acts = shared_activation_buffers(&layout.execs, nn, numel, keep);
            ((Vec::new(), vec![None; nn]), acts)
        } else {
            for (ex, f) in layout.execs.iter_mut().zip(&flows) {
                ex.backward = f.backward;
                ex.needs_dx.clone_from(&f.needs_dx);
            }
            mark_accumulating(&mut layout.execs, nn);
            let (sizes, grad_slot) = flow::gradient_slots(&flows, nn, numel);
            let grads = sizes.iter().map(|&len| vec![0.0; len]).collect();
            let acts = activation_buffers(&layout.execs, nn, numel);
            ((grads, grad_slot), (acts, (0..nn).collect()))
        };
        let (params, state) = layout.initial_params(cfg.seed);
        let ExecLayout { execs, blocks, .. } = layout;
        Ok(Self {
            graph,
            execs,
            acts,
            act_slot,
            inference,
            grads,
            grad_slot,
            params,
            state,
            blocks,
            kernels,
            max_batch: mb,
            last_n: 0,
            last_step: StepInfo {
                seed: cfg.seed,
                step: 0,
                first_sample: 0,
                global_batch: 1,
            },
            labels: vec![0; mb],
        })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// How the net's 3x3 stride-1 convolutions are computed from now on (`ConvAlgo::default()`,
    /// `auto`, until set).
    pub fn set_conv_algo(&mut self, algo: ConvAlgo) {
        self.kernels.set_conv_algo(algo);
    }
    /// The largest batch.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }
    /// All parameters, block after block.
    pub fn params(&self) -> &[f32] {
        &self.params
    }
    /// All parameters, mutable (the optimizer, weight broadcasts, checkpoints).
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }
    /// The parameters, mutable, with their block layout (for the optimizer).
    pub fn params_and_blocks(&mut self) -> (&mut [f32], &[ParamBlock]) {
        (&mut self.params, &self.blocks)
    }
    /// Non-trained state (running statistics), block after block.
    pub fn state(&self) -> &[f32] {
        &self.state
    }
    /// The state, mutable (checkpoints).
    pub fn state_mut(&mut self) -> &mut [f32] {
        &mut self.state
    }
    /// The parameter blocks, in forward order.
    pub fn blocks(&self) -> &[ParamBlock] {
        &self.blocks
    }
    /// The execs' names, in forward order.
    pub fn exec_names(&self) -> impl Iterator<Item = &str> {
        self.execs.iter().map(|e| e.name.as_str())
    }
    /// The graph node each exec computes (its layer; a fused activation is not counted).
    pub fn exec_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.execs.iter().map(|e| e.node)
    }
    /// Number of execs.
    pub fn num_execs(&self) -> usize {
        self.execs.len()
    }
    /// Bytes of activation and gradient buffers (what a step keeps in memory besides the
    /// parameters).
    pub fn buffer_bytes(&self) -> usize {
        4 * (self.acts.iter().map(Vec::len).sum::<usize>()
            + self.grads.iter().map(Vec::len).sum::<usize>())
    }
    /// The logits of the last forward (`n x classes`). (The logits' only reader is the loss,
    /// so they are never fused away.)
    pub fn logits(&self) -> &[f32] {
        &self.acts[self.act_slot[self.graph.logits()]][..self.last_n * self.graph.classes]
    }

    /// Forward on `n` samples: `images` in the loader's NCHW layout, `labels` for the loss.
    /// Returns the losses' sum over samples and the main head's correct predictions.
    pub fn forward(&mut self, images: &[f32], labels: &[u32], n: usize, mode: Mode) -> LossReport {
        self.forward_observed(images, labels, n, mode, &mut |_| {})
    }

    /// [`Net::forward`], calling `on_exec(e)` after each exec (the timeline times layers
    /// with it).
    pub fn forward_observed(
        &mut self,
        images: &[f32],
        labels: &[u32],
        n: usize,
        mode: Mode,
        on_exec: &mut dyn FnMut(usize),
    ) -> LossReport {
        let mut no_gate = |_: usize, _: &mut [f32], _: &[ParamBlock]| Ok(());
        let report: Result<_, std::convert::Infallible> =
            self.forward_gated(images, labels, n, mode, &mut no_gate, on_exec);
        match report {
            Ok(r) => r,
        }
    }

    /// [`Net::forward_observed`], calling `gate(b, params, blocks)` before each exec with
    /// parameter block `b` runs, with the parameters to change in place (`--schedule
    /// priority` applies the last step's update of that block there); an error from the gate
    /// stops the forward and is returned.
    pub fn forward_gated<E>(
        &mut self,
        images: &[f32],
        labels: &[u32],
        n: usize,
        mode: Mode,
        gate: &mut ForwardGate<'_, E>,
        on_exec: &mut dyn FnMut(usize),
    ) -> Result<LossReport, E> {
        assert!(
            n >= 1 && n <= self.max_batch,
            "batch of {n} for a net set up for at most {}",
            self.max_batch
        );
        let input = self.graph.input();
        assert!(
            images.len() >= n * input.numel() && labels.len() >= n,
            "batch buffers too small"
        );
        self.last_n = n;
        self.labels[..n].copy_from_slice(&labels[..n]);
        if let Mode::Train(s) = mode {
            self.last_step = s;
        }
        let k = &mut *self.kernels;
        k.nchw_to_nhwc(
            n,
            input.c,
            input.pixels(),
            images,
            &mut self.acts[self.act_slot[0]],
        );
        let mut report = LossReport::default();
        for e in 0..self.execs.len() {
            if let Some(b) = self.execs[e].block {
                gate(b, &mut self.params, &self.blocks)?;
            }
            let ex = &mut self.execs[e];
            let out_slot = if ex.loss {
                None
            } else {
                Some(self.act_slot[ex.out])
            };
            let mut out = out_slot.map_or_else(Vec::new, |b| std::mem::take(&mut self.acts[b]));
            {
                let mut ins: [&[f32]; MAX_INPUTS] = [&[]; MAX_INPUTS];
                for (slot, &j) in ins.iter_mut().zip(&ex.inputs) {
                    *slot = &self.acts[self.act_slot[j]][..n * self.graph.nodes[j].shape.numel()];
                }
                let (prange, srange) = match ex.block {
                    Some(b) => (
                        self.blocks[b].range.clone(),
                        self.blocks[b].state_range.clone(),
                    ),
                    None => (0..0, 0..0),
                };
                let olen = n * self.graph.nodes[ex.out].shape.numel();
                ex.layer.forward(Forward {
                    k,
                    n,
                    inputs: &ins[..ex.inputs.len()],
                    out: if ex.loss { &mut [] } else { &mut out[..olen] },
                    params: &self.params[prange],
                    state: &mut self.state[srange],
                    mode,
                    labels: &self.labels[..n],
                    report: &mut report,
                });
            }
            if let Some(b) = out_slot {
                self.acts[b] = out;
            }
            on_exec(e);
        }
        Ok(report)
    }

    /// Backward of the last training forward: parameter gradients into `grads` (each block
    /// overwritten), calling `on_done` after each exec that ran, in the order they ran
    /// (reverse topological); an error from `on_done` stops the backward and is returned.
    ///
    /// A layer that [`Layer::splits_backward`] computes its parameter gradient first, and its
    /// block is written (`grads.block_written`, `on_done` with the block) before its input
    /// gradient is computed (`on_done` again, without the block): the bucket holding the block
    /// can leave while the input gradient, which only this worker needs, is computed. Same
    /// arithmetic, same bits; only when the block is handed over changes.
    pub fn backward(
        &mut self,
        grads: &mut dyn GradSink,
        on_done: &mut dyn FnMut(ExecDone) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.inference {
            return Err("backward on a net set up for inference only (Net::for_inference)".into());
        }
        assert!(self.last_n > 0, "backward before a training forward");
        for e in (0..self.execs.len()).rev() {
            let ex = &self.execs[e];
            if !ex.backward {
                continue;
            }
            let block = ex.block;
            let split = block.is_some()
                && ex.layer.splits_backward()
                && ex.needs_dx.iter().any(|&needed| needed);
            let first = match split {
                true => BackwardPart::ParamsOnly,
                false => BackwardPart::Whole,
            };
            self.backward_exec(e, first, grads);
            if let Some(b) = block {
                grads.block_written(b)?;
            }
            on_done(ExecDone { exec: e, block })?;
            if split {
                self.backward_exec(e, BackwardPart::InputsOnly, grads);
                on_done(ExecDone {
                    exec: e,
                    block: None,
                })?;
            }
        }
        Ok(())
    }

    /// Exec `e`'s backward (the gradients `part` says) on the last training forward.
    fn backward_exec(&mut self, e: usize, part: BackwardPart, grads: &mut dyn GradSink) {
        let (n, step) = (self.last_n, self.last_step);
        let k = &mut *self.kernels;
        let ex = &mut self.execs[e];
        let mut dout = match (ex.loss, self.grad_slot[ex.out]) {
            (false, Some(b)) => std::mem::take(&mut self.grads[b]),
            _ => Vec::new(),
        };
        // A parameters-only call writes no input gradient.
        let needs_dx = |kk: usize| ex.needs_dx[kk] && part != BackwardPart::ParamsOnly;
        let mut taken: [Vec<f32>; MAX_INPUTS] = Default::default();
        for (kk, &j) in ex.inputs.iter().enumerate() {
            if needs_dx(kk) {
                let b = self.grad_slot[j].expect("a gradient slot for every input that needs one");
                taken[kk] = std::mem::take(&mut self.grads[b]);
            }
        }
        {
            let mut ins: [&[f32]; MAX_INPUTS] = [&[]; MAX_INPUTS];
            for (slot, &j) in ins.iter_mut().zip(&ex.inputs) {
                *slot = &self.acts[self.act_slot[j]][..n * self.graph.nodes[j].shape.numel()];
            }
            let mut dins: [Option<(&mut [f32], bool)>; MAX_INPUTS] = Default::default();
            for (kk, (slot, t)) in dins
                .iter_mut()
                .zip(taken.iter_mut())
                .enumerate()
                .take(ex.inputs.len())
            {
                if needs_dx(kk) {
                    let len = n * self.graph.nodes[ex.inputs[kk]].shape.numel();
                    *slot = Some((&mut t[..len], ex.acc[kk]));
                }
            }
            let (prange, srange) = match ex.block {
                Some(b) => (
                    self.blocks[b].range.clone(),
                    self.blocks[b].state_range.clone(),
                ),
                None => (0..0, 0..0),
            };
            let olen = if ex.loss {
                0
            } else {
                n * self.graph.nodes[ex.out].shape.numel()
            };
            let dparams: &mut [f32] = match (ex.block, part) {
                (_, BackwardPart::InputsOnly) | (None, _) => &mut [],
                (Some(b), _) => grads.block_grads(b),
            };
            ex.layer.backward(Backward {
                k,
                n,
                inputs: &ins[..ex.inputs.len()],
                out: &self.acts[self.act_slot[ex.out]][..olen],
                dout: if ex.loss { &mut [] } else { &mut dout[..olen] },
                dinputs: &mut dins[..ex.inputs.len()],
                params: &self.params[prange],
                dparams,
                state: &self.state[srange],
                step,
                labels: &self.labels[..n],
                part,
            });
        }
        if let (false, Some(b)) = (ex.loss, self.grad_slot[ex.out]) {
            self.grads[b] = dout;
        }
        for (kk, &j) in ex.inputs.iter().enumerate() {
            if needs_dx(kk) {
                let b = self.grad_slot[j].expect("checked above");
                self.grads[b] = std::mem::take(&mut taken[kk]);
            }
        }
    }
}

/// Samples per chunk of the parameter-gradient batch sums. 4-sample chunks make a split batch
/// give the same bits, which only a network without batch norm can (its statistics are each
/// worker's): others sum in larger chunks, with fewer partial gradients to add.
fn batch_chunk(g: &Graph) -> usize {
    let has_bn = g
        .nodes
        .iter()
        .any(|n| matches!(n.layer(), Some(Op::BatchNorm(_))));
    if has_bn {
        BN_BATCH_CHUNK
    } else {
        BATCH_CHUNK
    }
}

/// The readers of each node, in node order; fails for a layer reading more than
/// [`MAX_INPUTS`] inputs.
fn readers_of(g: &Graph) -> Result<Vec<Vec<usize>>, NetError> {
    if let Some(n) = g.nodes.iter().find(|n| n.inputs.len() > MAX_INPUTS) {
        return Err(NetError(format!(
            "layer '{}' reads {} inputs; at most {MAX_INPUTS} are supported",
            n.name,
            n.inputs.len()
        )));
    }
    Ok(flow::readers(g))
}

/// The forward list and the parameter blocks it owns, before any buffer exists.
struct ExecLayout {
    execs: Vec<Exec>,
    blocks: Vec<ParamBlock>,
    /// Total parameters.
    param_len: usize,
    /// Total state.
    state_len: usize,
}

impl ExecLayout {
    /// One exec per flow (each node that is not a fused activation, in node order), each
    /// with its layer and, if it has parameters, its block.
    fn build(g: &Graph, fusion: &Fusion, flows: &[Flow], mb: usize) -> Result<Self, NetError> {
        let mut layout = Self {
            execs: Vec::new(),
            blocks: Vec::new(),
            param_len: 0,
            state_len: 0,
        };
        let main_loss = g.losses[0];
        for f in flows {
            let (i, n) = (f.node, &g.nodes[f.node]);
            let layer = make_layer(g, i, fusion.act[i], i == main_loss, mb)?;
            let block = layout.add_block(&n.name, i, layer.as_ref());
            if block.is_some() != f.params {
                // The graph's parameter count and the layer's tensors disagree: a bug, which
                // would make the backward marks and the memory plan wrong.
                return Err(NetError(format!(
                    "layer '{}': the graph counts {} parameters, its layer {}",
                    n.name,
                    n.params,
                    if block.is_some() {
                        "has some"
                    } else {
                        "has none"
                    }
                )));
            }
            layout.execs.push(Exec {
                out: f.out,
                name: n.name.clone(),
                node: i,
                needs_dx: vec![false; f.inputs.len()],
                acc: vec![false; f.inputs.len()],
                inputs: f.inputs.clone(),
                block,
                backward: false,
                loss: f.loss,
                layer,
            });
        }
        Ok(layout)
    }

    /// The parameter block of the next exec's `layer` (graph node `node`), if it has
    /// parameters.
    fn add_block(&mut self, name: &str, node: usize, layer: &dyn Layer) -> Option<usize> {
        let (tensors, state_tensors) = (layer.param_tensors(), layer.state_tensors());
        if tensors.is_empty() {
            return None;
        }
        let len: usize = tensors.iter().map(|t| t.len).sum();
        let state_len: usize = state_tensors.iter().map(|t| t.len.max(1)).sum();
        self.blocks.push(ParamBlock {
            name: name.to_string(),
            node,
            exec: self.execs.len(),
            range: self.param_len..self.param_len + len,
            state_range: self.state_len..self.state_len + state_len,
            tensors,
            state_tensors,
        });
        self.param_len += len;
        self.state_len += state_len;
        Some(self.blocks.len() - 1)
    }

    /// Every block's initial parameters and state, drawn from `seed` in block order.
    fn initial_params(&self, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut params = vec![0.0; self.param_len];
        let mut state = vec![0.0; self.state_len];
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_1717_0000_0001);
        for b in &self.blocks {
            self.execs[b.exec].layer.init(
                &mut params[b.range.clone()],
                &mut state[b.state_range.clone()],
                &mut rng,
            );
        }
        (params, state)
    }
}

/// The fixed order of additions into a gradient read by several layers: walking backward,
/// the first reader to run writes it and the others add to it.
fn mark_accumulating(execs: &mut [Exec], nn: usize) {
    let mut written = vec![false; nn];
    for ex in execs.iter_mut().rev().filter(|ex| ex.backward) {
        for k in 0..ex.inputs.len() {
            if ex.needs_dx[k] {
                ex.acc[k] = written[ex.inputs[k]];
                written[ex.inputs[k]] = true;
            }
        }
    }
}

/// One activation buffer per exec output and the input's (all are read by backward); none for
/// fused-away nodes and losses. `numel(j)` is the size of node `j`'s activation.
fn activation_buffers(execs: &[Exec], nn: usize, numel: impl Fn(usize) -> usize) -> Vec<Vec<f32>> {
    let mut acts: Vec<Vec<f32>> = vec![Vec::new(); nn];
    acts[0] = vec![0.0; numel(0)];
    for ex in execs.iter().filter(|ex| !ex.loss) {
        acts[ex.out] = vec![0.0; numel(ex.out)];
    }
    acts
}

/// Activation buffers shared by liveness, for a net without backward, and the buffer of each
/// graph node: an exec's output takes a free buffer (the largest, grown if needed) before its
/// inputs whose last reader it is free theirs, so no exec writes a buffer it reads. `keep`'s
/// buffer (the logits) is never freed; the loss layers have none.
fn shared_activation_buffers(
    execs: &[Exec],
    nn: usize,
    numel: impl Fn(usize) -> usize,
    keep: usize,
) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut last_reader = vec![usize::MAX; nn];
    for (e, ex) in execs.iter().enumerate() {
        for &j in &ex.inputs {
            last_reader[j] = e;
        }
    }
    let mut slot = vec![usize::MAX; nn];
    let (mut sizes, mut free): (Vec<usize>, Vec<usize>) = (vec![numel(0)], vec![]);
    slot[0] = 0;
    for (e, ex) in execs.iter().enumerate() {
        if !ex.loss {
            let b = flow::take_free(&mut free, &mut sizes);
            sizes[b] = sizes[b].max(numel(ex.out));
            slot[ex.out] = b;
        }
        for (k, &j) in ex.inputs.iter().enumerate() {
            let first_mention = !ex.inputs[..k].contains(&j);
            if first_mention && last_reader[j] == e && j != keep {
                free.push(slot[j]);
            }
        }
    }
    (sizes.iter().map(|&len| vec![0.0; len]).collect(), slot)
}

/// The layer implementing node `i` (with `act` fused in): one arm per layer type.
fn make_layer(
    g: &Graph,
    i: usize,
    act: Act,
    main_loss: bool,
    mb: usize,
) -> Result<Box<dyn Layer>, NetError> {
    let n = &g.nodes[i];
    let x = g.nodes[n.inputs[0]].shape;
    let y = n.shape;
    let op = n.layer().expect("node 0 is the input; layers start at 1");
    Ok(match op {
        Op::Conv2d(c) => Box::new(layers::Conv {
            geom: conv_geom(c, x, y),
            bias: c.bias,
            act,
        }),
        Op::BatchNorm(b) => Box::new(layers::BatchNorm::new(
            x.c,
            x.pixels(),
            b.momentum,
            b.eps,
            act,
        )),
        Op::Relu => Box::new(layers::Activation(Act::Relu)),
        Op::Relu6 => Box::new(layers::Activation(Act::Relu6)),
        Op::MaxPool(p) => Box::new(layers::MaxPool::new(pool_geom(p, x, y), mb)),
        Op::AvgPool(p, include_pad) => Box::new(layers::AvgPool {
            geom: pool_geom(p, x, y),
            include_pad: *include_pad,
        }),
        Op::GlobalAvgPool => Box::new(layers::GlobalAvgPool {
            pixels: x.pixels(),
            c: x.c,
        }),
        Op::Linear(l) => Box::new(layers::Linear {
            i: x.c,
            o: y.c,
            bias: l.bias,
            act,
        }),
        Op::Dropout(p) => Box::new(layers::Dropout {
            p: *p,
            len: x.numel(),
        }),
        Op::Add => Box::new(layers::Add { act }),
        Op::Concat => Box::new(layers::Concat {
            widths: n.inputs.iter().map(|&j| g.nodes[j].shape.c).collect(),
            pixels: x.pixels(),
        }),
        Op::Flatten => Box::new(layers::Flatten {
            pixels: x.pixels(),
            c: x.c,
        }),
        Op::SoftmaxCrossEntropy(l) => Box::new(layers::SoftmaxCrossEntropy::new(
            x.c,
            l.label_smoothing,
            l.weight,
            main_loss,
            mb,
        )),
    })
}

/// The kernels' geometry of every convolution of `g`, in node order: what the net's
/// convolution layers are built with (`plan::memory` sizes their workspaces from it).
pub fn conv_geometries(g: &Graph) -> Vec<ConvGeom> {
    g.nodes
        .iter()
        .filter_map(|n| match n.layer() {
            Some(Op::Conv2d(c)) => Some(conv_geom(c, g.nodes[n.inputs[0]].shape, n.shape)),
            _ => None,
        })
        .collect()
}

/// The kernels' geometry of convolution `c` from input shape `x` to output shape `y` (its
/// padding and groups resolved by `Graph::build`).
fn conv_geom(c: &Conv2d, x: Shape, y: Shape) -> ConvGeom {
    let p = c.padding.expect("padding resolved by Graph::build");
    let groups = match &c.groups {
        Units::Fixed(v) => *v,
        Units::Expr(e) => unreachable!("units resolved by Graph::build: {e}"),
    };
    ConvGeom {
        c: x.c,
        h: x.h,
        w: x.w,
        o: y.c,
        oh: y.h,
        ow: y.w,
        kh: c.kernel[0],
        kw: c.kernel[1],
        sh: c.stride[0],
        sw: c.stride[1],
        ph: p[0],
        pw: p[1],
        dh: c.dilation[0],
        dw: c.dilation[1],
        groups,
    }
}

/// The kernels' geometry of pooling window `p` from input shape `x` to output shape `y`.
fn pool_geom(p: &Pool, x: Shape, y: Shape) -> PoolGeom {
    PoolGeom {
        c: x.c,
        h: x.h,
        w: x.w,
        oh: y.h,
        ow: y.w,
        kh: p.kernel[0],
        kw: p.kernel[1],
        sh: p.stride[0],
        sw: p.stride[1],
        ph: p.padding[0],
        pw: p.padding[1],
    }
}
