//! The [`Kernels`] trait: the one contract between the layers and a backend.

use super::{Act, ConvAlgo, ConvGeom, DropoutMask, PoolGeom};

/// The kernels a network's layers are made of. Slices are batch-major NHWC activations
/// (`[n, h, w, c]`), weights in each layer's internal layout (see `crate::nn`). "Gradient
/// into `dx`, added when `acc`" means `dx = g` with `acc == false`, `dx += g` otherwise: a
/// tensor read by several layers sums their gradients in a fixed (reverse topological) order.
#[allow(clippy::too_many_arguments)]
pub trait Kernels: Send {
    /// Samples per chunk of every parameter-gradient batch sum (see [`super::sum_order`]): the
    /// network sets it once, before any call.
    fn set_batch_chunk(&mut self, samples: usize);
    /// How the 3x3 stride-1 convolutions are computed (`--conv-algo`); a backend with one way
    /// only ignores it. `ConvAlgo::default()` (auto) until set.
    fn set_conv_algo(&mut self, algo: ConvAlgo);
    /// Convolution forward: `y = act(conv(x, w) + bias)`.
    fn conv2d_forward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        act: Act,
        y: &mut [f32],
    );
    /// Convolution backward from the (activation-masked) output gradient `dy`: `dwb` gets the
    /// weight gradient then the bias gradient (if `has_bias`); `dx` the input gradient.
    fn conv2d_backward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
        has_bias: bool,
        dx: Option<(&mut [f32], bool)>,
    );
    /// The input gradient alone of [`Kernels::conv2d_backward`], the same bits as its `dx`:
    /// a backward that hands the weight gradient on before it computes the input gradient
    /// calls `conv2d_backward` with `dx: None`, then this.
    fn conv2d_input_grad(
        &mut self,
        g: &ConvGeom,
        n: usize,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    );
    /// Fully connected forward: `y[n, o] = act(x[n, i] W^T + b)`, `W` is `[o, i]`.
    fn linear_forward(
        &mut self,
        n: usize,
        i: usize,
        o: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        act: Act,
        y: &mut [f32],
    );
    /// Fully connected backward (see [`Kernels::conv2d_backward`] for `dwb` and `dx`).
    fn linear_backward(
        &mut self,
        n: usize,
        i: usize,
        o: usize,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dwb: &mut [f32],
        has_bias: bool,
        dx: Option<(&mut [f32], bool)>,
    );
    /// Batch norm, training: normalises `rows x c` with batch statistics, stores the mean,
    /// `1/std` and unbiased variance in `saved` (`[mean | invstd | var_unbiased]`, 3c).
    fn batch_norm_forward_train(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        gamma_beta: &[f32],
        eps: f32,
        act: Act,
        y: &mut [f32],
        saved: &mut [f32],
    );
    /// Batch norm, evaluation: normalises with the running statistics `running` (`[mean |
    /// var]`).
    fn batch_norm_forward_eval(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        gamma_beta: &[f32],
        running: &[f32],
        eps: f32,
        act: Act,
        y: &mut [f32],
    );
    /// Batch norm backward: masks `dy` by the activation in place, writes `dgb = [dgamma |
    /// dbeta]` and the input gradient.
    fn batch_norm_backward(
        &mut self,
        rows: usize,
        c: usize,
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        gamma_beta: &[f32],
        saved: &[f32],
        act: Act,
        dgb: &mut [f32],
        dx: Option<(&mut [f32], bool)>,
    );
    /// Max-pool forward, recording each output's window position in `arg`.
    fn max_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        arg: &mut [u8],
    );
    /// Max-pool backward.
    fn max_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        arg: &[u8],
        dx: &mut [f32],
        acc: bool,
    );
    /// Average-pool forward.
    fn avg_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        include_pad: bool,
    );
    /// Average-pool backward.
    fn avg_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
        include_pad: bool,
    );
    /// Global average pool over `p` pixels of `c` channels.
    fn global_avg_pool_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]);
    /// Global average pool backward.
    fn global_avg_pool_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    );
    /// `y = act(x)`.
    fn act_forward(&mut self, act: Act, x: &[f32], y: &mut [f32]);
    /// `dx (+)= dy * act'(y)`.
    fn act_backward(&mut self, act: Act, y: &[f32], dy: &[f32], dx: &mut [f32], acc: bool);
    /// Masks `dy` in place by the activation whose output is `y`.
    fn act_mask(&mut self, act: Act, y: &[f32], dy: &mut [f32]);
    /// `y = act(sum of xs)`, added in order.
    fn add_forward(&mut self, act: Act, xs: &[&[f32]], y: &mut [f32]);
    /// `dx (+)= dy`.
    fn copy_grad(&mut self, dy: &[f32], dx: &mut [f32], acc: bool);
    /// Dropout forward over samples of `len` elements.
    fn dropout_forward(&mut self, m: DropoutMask, len: usize, x: &[f32], y: &mut [f32]);
    /// Dropout backward (the mask recomputed).
    fn dropout_backward(
        &mut self,
        m: DropoutMask,
        len: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    );
    /// Channel concatenation of `rows` rows.
    fn concat_forward(&mut self, rows: usize, xs: &[&[f32]], widths: &[usize], y: &mut [f32]);
    /// Concat backward for the input at channel offset `off` of width `w` (of `c`).
    fn concat_backward(
        &mut self,
        rows: usize,
        c: usize,
        off: usize,
        w: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    );
    /// NHWC to PyTorch's flattened order (c, h, w).
    fn flatten_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]);
    /// Flatten backward.
    fn flatten_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    );
    /// The loader's NCHW batch into the network's NHWC input.
    fn nchw_to_nhwc(&mut self, n: usize, c: usize, p: usize, x: &[f32], y: &mut [f32]);
    /// Softmax cross-entropy forward; returns (sum of losses, correct predictions: a row's
    /// largest logit, first maximum winning, is its label and the row predicts at all,
    /// [`crate::backend::predicts`]).
    fn softmax_xent_forward(
        &mut self,
        n: usize,
        k: usize,
        logits: &[f32],
        labels: &[u32],
        smoothing: f32,
        probs: &mut [f32],
        losses: &mut [f64],
    ) -> (f64, usize);
    /// Softmax cross-entropy backward: `dlogits (+)= (probs - target) * scale`.
    fn softmax_xent_backward(
        &mut self,
        n: usize,
        k: usize,
        probs: &[f32],
        labels: &[u32],
        smoothing: f32,
        scale: f32,
        dlogits: &mut [f32],
        acc: bool,
    );
}
