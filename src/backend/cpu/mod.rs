//! The CPU backend: our kernels on host memory (see [`super::Kernels`]).
//!
//! Every kernel runs on the calling thread's rayon pool (a worker's compute threads) and gives
//! the same bits for any pool size: parallel work is split into pieces whose results do not
//! depend on who computes them, and every sum has a fixed order (the pairwise tree of
//! [`super::sum_order`], in `batch_sum`, for the batch reductions of parameter gradients;
//! fixed row blocks elsewhere).

mod batch_sum;
mod conv;
mod elementwise;
mod gemm;
mod linear;
mod loss;
mod norm;
mod peak;
mod pool;
mod scratch;
mod vector;
mod winograd;

use super::{Act, ConvAlgo, ConvGeom, DropoutMask, Kernels, PoolGeom};
use conv::ConvWorkspace;
pub use gemm::KC as COL_ROWS;
use linear::LinearWorkspace;
use norm::{BnSaved, BnScratch};
pub use peak::{fma_loop, gemm_tile_loop};
pub use scratch::thread_floats as thread_scratch_floats;
pub use winograd::workspace_floats as winograd_workspace_floats;

/// The CPU backend of one worker: its kernels' reusable memory (packed weights, tree-sum
/// buffers, statistics scratch). Sized by the first step; later steps allocate nothing.
#[derive(Default)]
pub struct Cpu {
    conv: ConvWorkspace,
    linear: LinearWorkspace,
    bn: BnScratch,
}

impl Kernels for Cpu {
    fn set_batch_chunk(&mut self, samples: usize) {
        self.conv.set_chunk(samples);
        self.linear.set_chunk(samples);
    }
    fn set_conv_algo(&mut self, algo: ConvAlgo) {
        self.conv.set_algo(algo);
    }
    fn conv2d_forward(
        &mut self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        act: Act,
        y: &mut [f32],
    ) {
        self.conv.forward(g, n, x, w, bias, act, y)
    }
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
    ) {
        self.conv.backward(g, n, x, w, dy, dwb, has_bias, dx)
    }
    fn conv2d_input_grad(
        &mut self,
        g: &ConvGeom,
        n: usize,
        w: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        self.conv.input_grad(g, n, w, dy, dx, acc)
    }
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
    ) {
        self.linear.forward(n, i, o, x, w, bias, act, y)
    }
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
    ) {
        self.linear.backward(n, i, o, x, w, dy, dwb, has_bias, dx)
    }
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
    ) {
        let (gamma, beta) = gamma_beta.split_at(c);
        let (mean, rest) = saved.split_at_mut(c);
        let (invstd, var_unbiased) = rest.split_at_mut(c);
        let saved = BnSaved {
            mean,
            invstd,
            var_unbiased,
        };
        norm::forward_train(rows, c, x, gamma, beta, eps, act, y, saved, &mut self.bn)
    }
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
    ) {
        let (gamma, beta) = gamma_beta.split_at(c);
        let (mean, var) = running.split_at(c);
        norm::forward_eval(
            rows,
            c,
            x,
            gamma,
            beta,
            mean,
            var,
            eps,
            act,
            y,
            &mut self.bn,
        )
    }
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
    ) {
        let gamma = &gamma_beta[..c];
        let (mean, invstd) = (&saved[..c], &saved[c..2 * c]);
        norm::backward(
            rows,
            c,
            x,
            y,
            dy,
            gamma,
            mean,
            invstd,
            act,
            dgb,
            dx,
            &mut self.bn,
        )
    }
    fn max_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        arg: &mut [u8],
    ) {
        pool::max_forward(g, n, x, y, arg)
    }
    fn max_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        arg: &[u8],
        dx: &mut [f32],
        acc: bool,
    ) {
        pool::max_backward(g, n, dy, arg, dx, acc)
    }
    fn avg_pool_forward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
        y: &mut [f32],
        include_pad: bool,
    ) {
        pool::avg_forward(g, n, x, y, include_pad)
    }
    fn avg_pool_backward(
        &mut self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
        include_pad: bool,
    ) {
        pool::avg_backward(g, n, dy, dx, acc, include_pad)
    }
    fn global_avg_pool_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
        pool::global_avg_forward(n, p, c, x, y)
    }
    fn global_avg_pool_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        pool::global_avg_backward(n, p, c, dy, dx, acc)
    }
    fn act_forward(&mut self, act: Act, x: &[f32], y: &mut [f32]) {
        elementwise::act_forward(act, x, y)
    }
    fn act_backward(&mut self, act: Act, y: &[f32], dy: &[f32], dx: &mut [f32], acc: bool) {
        elementwise::act_backward(act, y, dy, dx, acc)
    }
    fn act_mask(&mut self, act: Act, y: &[f32], dy: &mut [f32]) {
        elementwise::mask_in_place(act, y, dy)
    }
    fn add_forward(&mut self, act: Act, xs: &[&[f32]], y: &mut [f32]) {
        elementwise::add_forward(act, xs, y)
    }
    fn copy_grad(&mut self, dy: &[f32], dx: &mut [f32], acc: bool) {
        elementwise::copy_grad(dy, dx, acc)
    }
    fn dropout_forward(&mut self, m: DropoutMask, len: usize, x: &[f32], y: &mut [f32]) {
        elementwise::dropout_forward(m, len, x, y)
    }
    fn dropout_backward(
        &mut self,
        m: DropoutMask,
        len: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        elementwise::dropout_backward(m, len, dy, dx, acc)
    }
    fn concat_forward(&mut self, rows: usize, xs: &[&[f32]], widths: &[usize], y: &mut [f32]) {
        elementwise::concat_forward(rows, xs, widths, y)
    }
    fn concat_backward(
        &mut self,
        rows: usize,
        c: usize,
        off: usize,
        w: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        elementwise::concat_backward(rows, c, off, w, dy, dx, acc)
    }
    fn flatten_forward(&mut self, n: usize, p: usize, c: usize, x: &[f32], y: &mut [f32]) {
        elementwise::flatten_forward(n, p, c, x, y)
    }
    fn flatten_backward(
        &mut self,
        n: usize,
        p: usize,
        c: usize,
        dy: &[f32],
        dx: &mut [f32],
        acc: bool,
    ) {
        elementwise::flatten_backward(n, p, c, dy, dx, acc)
    }
    fn nchw_to_nhwc(&mut self, n: usize, c: usize, p: usize, x: &[f32], y: &mut [f32]) {
        elementwise::nchw_to_nhwc(n, c, p, x, y)
    }
    fn softmax_xent_forward(
        &mut self,
        n: usize,
        k: usize,
        logits: &[f32],
        labels: &[u32],
        smoothing: f32,
        probs: &mut [f32],
        losses: &mut [f64],
    ) -> (f64, usize) {
        loss::softmax_xent_forward(n, k, logits, labels, smoothing, probs, losses)
    }
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
    ) {
        loss::softmax_xent_backward(n, k, probs, labels, smoothing, scale, dlogits, acc)
    }
}
