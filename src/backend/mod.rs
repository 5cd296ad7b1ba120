//! The kernel seam: every computation of a layer goes through [`Kernels`], and nothing above
//! this module touches a kernel's implementation.
//!
//! The seam's vocabulary lives here, whatever the backend: the activations and dropout's mask
//! ([`Act`], [`DropoutMask`]), the geometry of convolutions and pools ([`ConvGeom`],
//! [`PoolGeom`]) and the summation order of parameter gradients ([`sum_order`]: the chunk
//! sizes and the pairwise tree, which `comm::redundant` continues over ranks, so bit-identical
//! replicas depend on every backend keeping it).
//!
//! Today the one implementation is the CPU backend (`cpu`, built by [`default_kernels`], the
//! one place that names it): our own kernels on host memory, run on the calling worker's
//! rayon pool (im2col + our GEMM for convolutions and linear layers, direct loops for
//! depthwise convolutions, pooling, batch norm and the element-wise passes), each
//! bit-identical for any number of threads. `tests/reference_backend/` holds a second one,
//! plain loops, that every layer's kernels are checked against.
//!
//! A CUDA backend (cudarc: cuBLAS for the GEMMs, cuDNN or own kernels for the rest) drops in
//! here as a second implementation of this trait. The one change the seam will need then is
//! the buffer type: the methods take host slices (`&[f32]`), which a device backend replaces
//! by its own buffer type through an associated type; the layers already only pass buffers
//! through (`crate::nn`), they never read them.

mod act;
mod conv_algo;
mod cpu;
mod geom;
mod kernels;
mod prediction;
pub mod sum_order;

pub use act::{Act, DropoutMask};
pub use conv_algo::{winograd_applies, ConvAlgo, WinogradMemory, WinogradTile};
pub use geom::{ConvGeom, PoolGeom};
pub use kernels::Kernels;
pub use prediction::{predicted, predicts};

/// The kernels a network runs on unless told otherwise ([`crate::nn::Net::new`]): the CPU
/// backend, with fresh (unsized) workspaces.
pub fn default_kernels() -> Box<dyn Kernels> {
    Box::new(cpu::Cpu::default())
}

/// The arithmetic ceiling of the CPU kernels: `iterations` of a register-only FMA loop in the
/// ISA the GEMM uses, on the calling thread. Returns the floating-point operations done and the
/// ISA's name; time it to get the peak (`bench roofline`).
pub fn fma_loop(iterations: u64) -> (f64, &'static str) {
    cpu::fma_loop(iterations)
}

/// The GEMM micro-kernel's ceiling: `calls` multiplications of one micro-kernel tile with its
/// operands in L1, on the calling thread. Returns the floating-point operations done; time it
/// (`bench roofline`).
pub fn gemm_tile_loop(calls: u64) -> f64 {
    cpu::gemm_tile_loop(calls)
}

/// Each compute thread's kernel scratch in the default backend, in floats, and the rows of a
/// convolution's column matrix beyond that a thread may hold at once: what `plan::memory`
/// counts per thread (the scratch, plus that many rows of the model's widest column row).
pub fn thread_scratch_floats() -> (usize, usize) {
    (cpu::thread_scratch_floats(), cpu::COL_ROWS)
}

/// The Winograd buffers of a convolution of geometry `g` under `algo` in the default backend:
/// what `plan::memory` counts for `--conv-algo`.
pub fn conv_algo_floats(algo: ConvAlgo, g: &ConvGeom) -> WinogradMemory {
    cpu::winograd_workspace_floats(algo.tile_for(g), algo.weight_grad_tile(g), g)
}
