//! Kernels we own, and the device seam.
//!
//! Model code never calls a device-specific kernel directly: it calls [`conv2d`] and
//! [`max_pool2d`] here. On the CPU these run our own candle custom ops (im2col + the `gemm`
//! crate for convolution, a direct kernel for max-pool) because candle's CPU versions measured
//! 3-9x slower than PyTorch on this machine and candle 0.11's max-pool backward is wrong (it
//! spreads a quarter of the gradient to every element of a 2x2 window). On any other device the
//! calls fall through to candle's own kernels (cuDNN when candle is built with it), so a CUDA
//! path drops in here and nowhere else.
//!
//! Every op here is tested against numerical gradients in `tests/gradcheck.rs`.

pub mod batch_sum;
mod conv2d;
mod im2col;
mod linear;
mod matmul;
mod max_pool;

pub use conv2d::Conv2dOp;
pub use linear::LinearOp;
pub use max_pool::MaxPool2dOp;

use candle_core::{CpuStorage, Layout, Result, Tensor};

/// Geometry of a square-kernel 2-D convolution (the kernel size comes from the weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Step between output positions, in input pixels.
    pub stride: usize,
    /// Zero padding added on every side of the input.
    pub padding: usize,
}

/// 2-D convolution of `x` (N, C, H, W) with `weight` (O, C, K, K) and `bias` (O).
///
/// `input_grad` says whether the backward pass must produce a gradient for `x`; the first
/// layer of a network passes `false` so that the (large, useless) data gradient is never
/// computed.
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    geom: ConvGeometry,
    input_grad: bool,
) -> Result<Tensor> {
    conv2d_fused(x, weight, bias, geom, input_grad, ConvEpilogue::default())
}

/// [`conv2d`] followed by a ReLU, as one op: `max(conv2d(x) + bias, 0)`.
pub fn conv2d_relu(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    geom: ConvGeometry,
    input_grad: bool,
) -> Result<Tensor> {
    let epilogue = ConvEpilogue {
        relu: true,
        pool: None,
    };
    conv2d_fused(x, weight, bias, geom, input_grad, epilogue)
}

/// What runs after a convolution inside the same op (see [`conv2d_fused`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConvEpilogue {
    /// Apply a ReLU to the output.
    pub relu: bool,
    /// Then max-pool it with this (square) window and an equal stride, floor mode.
    pub pool: Option<usize>,
}

/// [`conv2d`], then optionally a ReLU and a non-overlapping max-pool, as one op:
/// `max_pool2d(relu(conv2d(x) + bias), k, k)`.
///
/// On the CPU these are fused into the convolution kernel. The ReLU is a clamp of the output
/// in forward and a mask (`output > 0`) of the gradient in backward, where candle's own ReLU
/// costs a forward pass and five full-tensor passes in backward. The pool reads each sample's
/// convolution output while it is in cache and records where each maximum was, so the
/// full-resolution output never becomes a tensor (no storage for it, no gradient for candle to
/// allocate, zero and accumulate). The gradient at exactly zero is 0, as in PyTorch; pooling
/// ties go to the first maximum, as in [`max_pool2d`].
pub fn conv2d_fused(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    geom: ConvGeometry,
    input_grad: bool,
    epilogue: ConvEpilogue,
) -> Result<Tensor> {
    if x.device().is_cpu() {
        let x = x.contiguous()?;
        let op = Conv2dOp {
            geom,
            input_grad,
            relu: epilogue.relu,
            pool: epilogue.pool,
            argmax: Default::default(),
        };
        x.apply_op3(weight, bias, op)
    } else {
        let y = x.conv2d(weight, geom.padding, geom.stride, 1, 1)?;
        let mut y = y.broadcast_add(&bias.reshape((1, bias.dim(0)?, 1, 1))?)?;
        if epilogue.relu {
            y = y.relu()?;
        }
        match epilogue.pool {
            Some(k) => max_pool2d(&y, k, k),
            None => Ok(y),
        }
    }
}

/// Fully connected layer: `x` (N, I) times the transpose of `weight` (O, I), plus `bias` (O).
///
/// On the CPU this is our [`LinearOp`], whose batch sums follow `batch_sum`'s pairwise tree so
/// that splitting a batch across workers does not change a bit; elsewhere it is candle's
/// `matmul` + `broadcast_add`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() {
        x.contiguous()?.apply_op3(weight, bias, LinearOp)
    } else {
        x.matmul(&weight.t()?)?.broadcast_add(bias)
    }
}

/// Max-pooling of `x` (N, C, H, W) with a square `kernel` and `stride`, no padding, floor mode
/// (PyTorch's defaults).
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize) -> Result<Tensor> {
    if x.device().is_cpu() {
        x.contiguous()?.apply_op1(MaxPool2dOp { kernel, stride })
    } else {
        x.max_pool2d_with_stride(kernel, stride)
    }
}

/// Tells candle how many threads one worker computes with.
///
/// candle's own CPU matmul sizes its GEMM parallelism from `RAYON_NUM_THREADS` (or the number
/// of cores), not from the rayon pool it runs in. Inside a worker's one-thread pool it then asked
/// for two-way parallelism on this 2-core machine, and two workers' backward passes slowed each
/// other down by half (vgg-small, 2 workers x 1 thread: 449 -> 678 images/s once set). The
/// variable is read on every matmul, so this takes effect at once; our own kernels use the
/// calling pool directly and do not need it.
pub fn set_threads_per_worker(threads: usize) {
    // Set before the workers start; candle reads it through std::env (Rust's env lock).
    std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string());
}

/// Borrows the f32 elements of a contiguous CPU tensor without copying.
pub(crate) fn f32_slice<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [f32]> {
    let data = match storage {
        CpuStorage::F32(v) => v.as_slice(),
        _ => candle_core::bail!("{what}: expected f32 data"),
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{what}: expected a contiguous tensor"),
    }
}

/// Runs `f` over the f32 elements of a CPU tensor, making it contiguous first if needed.
pub(crate) fn with_f32<R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&[f32]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => f(f32_slice(cpu, layout, what)?),
        _ => candle_core::bail!("{what}: expected a CPU tensor"),
    }
}

/// Output size of a sliding window (floor mode).
pub(crate) fn out_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<usize> {
    let padded = input + 2 * padding;
    if stride == 0 || kernel == 0 || padded < kernel {
        candle_core::bail!(
            "window of {kernel} (stride {stride}, padding {padding}) does not fit an input of {input}"
        );
    }
    Ok((padded - kernel) / stride + 1)
}
