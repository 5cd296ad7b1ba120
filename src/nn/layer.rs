//! The layer contract (Caffe's `layer.hpp`): set-up sizes everything once; forward reads the
//! inputs and writes the output; backward reads the output's gradient and writes the inputs'
//! and the parameters' gradients. Buffers belong to the network ([`super::Net`]), which hands
//! each call exactly the slices it may touch, sized for the call's batch.

use crate::backend::Kernels;
use rand_chacha::ChaCha8Rng;

/// The most inputs one layer may read (a concatenation of up to this many branches).
pub const MAX_INPUTS: usize = 16;

/// How a parameter tensor is laid out in the parameter block, relative to PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorLayout {
    /// The same as PyTorch's.
    Plain,
    /// A convolution weight stored `[kh, kw, c/groups, o]` (HWIO); PyTorch's is `[o, c/groups,
    /// kh, kw]`.
    Hwio {
        /// Kernel height.
        kh: usize,
        /// Kernel width.
        kw: usize,
        /// Input channels per group.
        cg: usize,
        /// Output channels.
        o: usize,
    },
}

/// One named tensor of a layer's parameter (or state) block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Suffix of its name: the full name is `LAYER.SUFFIX` (PyTorch's state_dict key).
    pub suffix: &'static str,
    /// Offset in the block.
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// PyTorch's shape.
    pub torch_shape: Vec<usize>,
    /// How it is stored.
    pub layout: TensorLayout,
}

impl TensorInfo {
    /// A tensor stored as PyTorch stores it.
    pub fn plain(suffix: &'static str, offset: usize, torch_shape: Vec<usize>) -> Self {
        Self {
            suffix,
            offset,
            len: torch_shape.iter().product(),
            torch_shape,
            layout: TensorLayout::Plain,
        }
    }

    /// Calls `f(ours, torch)` with the index of every element in our layout and in PyTorch's.
    fn each_index(&self, len: usize, mut f: impl FnMut(usize, usize)) {
        match self.layout {
            TensorLayout::Plain => (0..len).for_each(|i| f(i, i)),
            TensorLayout::Hwio { kh, kw, cg, o } => {
                for oi in 0..o {
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                f(
                                    ((ki * kw + kj) * cg + ci) * o + oi,
                                    ((oi * cg + ci) * kh + ki) * kw + kj,
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Converts this tensor from our layout (`ours`) to PyTorch's (`out`).
    pub fn to_torch(&self, ours: &[f32], out: &mut [f32]) {
        self.each_index(out.len(), |o, t| out[t] = ours[o]);
    }

    /// Converts this tensor from PyTorch's layout (`torch`) to ours (`out`).
    pub fn from_torch(&self, torch: &[f32], out: &mut [f32]) {
        self.each_index(out.len(), |o, t| out[o] = torch[t]);
    }
}

/// Where a training step is, for what must be a pure function of it (dropout masks) and for
/// the loss's normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInfo {
    /// The run's seed.
    pub seed: u64,
    /// Global step.
    pub step: u64,
    /// Position of this call's first sample in the global batch.
    pub first_sample: u64,
    /// Samples in the global batch (over every worker): the loss is a mean over them, so each
    /// sample's gradient is the same whatever the number of workers.
    pub global_batch: usize,
}

/// Training (batch statistics, dropout) or evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A training step.
    Train(StepInfo),
    /// Evaluation.
    Eval,
}

/// What the loss layers report for a forward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossReport {
    /// Sum over samples of the weighted losses.
    pub loss_sum: f64,
    /// Samples whose largest logit (of the main head) is the label.
    pub correct: usize,
}

/// What a forward call gets.
pub struct Forward<'a> {
    /// The kernels.
    pub k: &'a mut dyn Kernels,
    /// Samples in this call.
    pub n: usize,
    /// The inputs, `n` samples each.
    pub inputs: &'a [&'a [f32]],
    /// The output, `n` samples.
    pub out: &'a mut [f32],
    /// The layer's parameter block.
    pub params: &'a [f32],
    /// The layer's state block (running statistics).
    pub state: &'a mut [f32],
    /// Training or evaluation.
    pub mode: Mode,
    /// The batch's labels (for the loss).
    pub labels: &'a [u32],
    /// Where the loss layers report.
    pub report: &'a mut LossReport,
}

/// What a backward call gets.
pub struct Backward<'a> {
    /// The kernels.
    pub k: &'a mut dyn Kernels,
    /// Samples in this call.
    pub n: usize,
    /// The inputs of the forward pass.
    pub inputs: &'a [&'a [f32]],
    /// The output of the forward pass.
    pub out: &'a [f32],
    /// The output's gradient. The layer may overwrite it (it is dead after this call), e.g. to
    /// mask it by a fused activation in place.
    pub dout: &'a mut [f32],
    /// Per input: where its gradient goes and whether to add to it (another reader of the
    /// same tensor wrote first), or `None` when no gradient is needed.
    pub dinputs: &'a mut [Option<(&'a mut [f32], bool)>],
    /// The layer's parameters.
    pub params: &'a [f32],
    /// The parameters' gradient, same layout; overwritten (it is the bucket's memory).
    pub dparams: &'a mut [f32],
    /// The layer's state block.
    pub state: &'a [f32],
    /// The step.
    pub step: StepInfo,
    /// The batch's labels.
    pub labels: &'a [u32],
    /// Which gradients this call computes ([`BackwardPart::Whole`] unless the layer
    /// [`Layer::splits_backward`]).
    pub part: BackwardPart,
}

/// Which of a layer's gradients a backward call computes. The net calls a layer that
/// [`Layer::splits_backward`] twice: `ParamsOnly`, then `InputsOnly` with the same tensors, so
/// that the parameter gradient can be handed to the reducer before the input gradient is
/// computed. The two calls write the same bits as one `Whole` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardPart {
    /// Input and parameter gradients.
    Whole,
    /// The parameter gradients alone (`dinputs` all `None`); `dout` may be changed as in a
    /// whole call, and the `InputsOnly` call gets it so.
    ParamsOnly,
    /// The input gradients alone (`dparams` empty), after a `ParamsOnly` call.
    InputsOnly,
}

/// A layer of an executable network. Implementations keep only what they own per layer
/// (geometry, their saved forward state sized for the largest batch); everything else comes
/// with the call.
pub trait Layer: Send {
    /// The tensors of the parameter block, in block order.
    fn param_tensors(&self) -> Vec<TensorInfo> {
        Vec::new()
    }
    /// The tensors of the state block (not trained, but checkpointed).
    fn state_tensors(&self) -> Vec<TensorInfo> {
        Vec::new()
    }
    /// Initial parameters and state (PyTorch's default initialisation), drawing from `rng`.
    fn init(&self, _params: &mut [f32], _state: &mut [f32], _rng: &mut ChaCha8Rng) {}
    /// Forward.
    fn forward(&mut self, cx: Forward<'_>);
    /// Backward.
    fn backward(&mut self, cx: Backward<'_>);
    /// Whether [`Layer::backward`] can compute its input and parameter gradients in two calls
    /// ([`BackwardPart`]); only such a layer is called with a part other than `Whole`.
    fn splits_backward(&self) -> bool {
        false
    }
}
