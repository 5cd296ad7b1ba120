//! Winograd's minimal filtering for 3x3 convolutions of stride 1 (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", CVPR 2016): F(m x m, 3 x 3).
//!
//! An `m x m` block of outputs is `Y = A^T [ (G g G^T) . (B^T d B) ] A` for the `a x a` input
//! tile `d` (a = m + 2) under it and each 3x3 filter `g`, `.` the element-wise product. Over
//! channels, the element-wise products are `a^2` independent matrix products: for each of the
//! `a^2` transformed positions `xi`, `M[xi] (tiles x O) = V[xi] (tiles x C) x U[xi] (C x O)`,
//! with `V` the tiles' transformed inputs and `U` the transformed weights. Those run through
//! the packed GEMM; the transforms are small fixed matrices applied to rows of channels (NHWC:
//! channels innermost, so every transform step is a vector operation over channels).
//!
//! Work: per tile and channel pair `a^2` multiplications instead of `9 m^2`: 2.25x fewer for
//! F(2x2), 4x for F(4x4). The transforms add work linear in the channels (not quadratic), so
//! they pay when the channel counts are not tiny ([`crate::backend::ConvAlgo::winograd_pays`]).
//!
//! Order of work: the weights are transformed once per call, straight into the GEMM's packed
//! layout (the `a^2` packed `U` reused by every tile); tiles go in blocks (a block's `V` and
//! `M` stay in cache between the input transform, the `a^2` GEMMs and the output transform),
//! blocks in parallel. A block's
//! `V`, `M` and `Z` are tile-major (`[tile][xi][channel]`): a transform writes or reads one
//! tile's `a^2 x channels` values contiguously, and each GEMM reads its `xi` as a strided
//! matrix in place (rows `a^2 x channels` apart). Every output is computed from its own tile
//! alone in a fixed order (the GEMM's order over `k` depends on `k` alone), so the result is
//! the same bits for any thread count and block size.
//!
//! Backward, input gradient: for a stride-1 convolution whose output is as large as its input,
//! `dx` is the convolution of `dy` with the flipped kernel (channels swapped), itself a 3x3
//! stride-1 convolution, so it goes through the same forward.
//!
//! Backward, weight gradient: the adjoint of the forward's linear maps. With `Z = A dY A^T`
//! (each output-gradient tile taken back to the transformed domain), `dU[xi] (C x O) =
//! V[xi]^T x Z[xi]` summed over the tiles (a GEMM whose `k` runs over tiles), and `dW = G^T
//! dU G` per channel pair. It runs per chunk of samples ([`weight_grad_chunk`], inside the
//! batch-sum tree of `backend::sum_order`), in tile blocks of a size fixed by the shape
//! alone, so it is the same bits for any thread count and any split of the batch over
//! workers.
//!
//! Transforms: each is generic over the tile (`A`, `M` constants, its matrices compile-time
//! constants through [`Coefficients`], so zero coefficients drop out) and over the vector it
//! runs on (`super::vector`: 16 channels at a time with AVX-512, 8 with AVX2, chosen at run
//! time by [`lanes!`]), reading and writing each value of a tile once.
//!
//! Error: the transforms are exact in real arithmetic; in f32 the larger tile's points (+-2,
//! +-1/2) amplify rounding. Measured against direct convolution in tests/winograd.rs.

use super::gemm::{gemm, gemm_packed, row_panel, MatRef, PackedB, PackedWriter};
#[cfg(target_arch = "x86_64")]
use super::gemm::{isa, Isa};
use super::scratch::{with_scratch, Reservation};
#[cfg(target_arch = "x86_64")]
use super::vector::Wide;
use super::vector::{Narrow, Vector};
use crate::backend::{ConvGeom, WinogradMemory, WinogradTile};
use rayon::prelude::*;

/// One F(M x M, 3 x 3), A = M + 2: `bt` is `B^T`, `g` is `G`, `at` is `A^T`.
struct Transform<const A: usize, const M: usize> {
    bt: [[f32; A]; A],
    g: [[f32; 3]; A],
    at: [[f32; A]; M],
}

/// F(2x2, 3x3), interpolation points 0, 1, -1 (Lavin & Gray, section 4.1).
const F2: Transform<4, 2> = Transform {
    bt: [
        [1.0, 0.0, -1.0, 0.0],
        [0.0, 1.0, 1.0, 0.0],
        [0.0, -1.0, 1.0, 0.0],
        [0.0, 1.0, 0.0, -1.0],
    ],
    g: [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ],
    at: [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]],
};

/// F(4x4, 3x3), interpolation points 0, 1, -1, 2, -2 (Lavin & Gray, section 4.2).
const F4: Transform<6, 4> = Transform {
    bt: [
        [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
        [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
        [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
        [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
        [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
        [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
    ],
    g: [
        [1.0 / 4.0, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ],
    at: [
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
        [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
        [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
    ],
};

/// The transforms as compile-time constants: the vector code reads its coefficients from
/// `<Lavin as Coefficients<A, M>>::T`, so they fold into the instructions and the zero ones
/// vanish (through a `&Transform` argument they were loads and compares in every tile).
trait Coefficients<const A: usize, const M: usize> {
    const T: Transform<A, M>;
}

/// Lavin & Gray's transforms ([`F2`], [`F4`]).
struct Lavin;

impl Coefficients<4, 2> for Lavin {
    const T: Transform<4, 2> = F2;
}

impl Coefficients<6, 4> for Lavin {
    const T: Transform<6, 4> = F4;
}

/// Runs `$body` with `$t` bound to the tile's transform (each arm a separate instance of the
/// generic code, with its matrices as constants).
macro_rules! on_tile {
    ($tile:expr, $t:ident => $body:expr) => {
        match $tile {
            WinogradTile::F2 => {
                let $t = &F2;
                $body
            }
            WinogradTile::F4 => {
                let $t = &F4;
                $body
            }
        }
    };
}

/// The most transformed positions of any tile (F(4x4,3x3): 6 x 6).
const MAX_POSITIONS: usize = 36;

/// Transformed positions (`A^2`) of a tile.
fn positions(tile: WinogradTile) -> usize {
    on_tile!(tile, t => a2(t))
}

fn a2<const A: usize, const M: usize>(_: &Transform<A, M>) -> usize {
    A * A
}

/// `sum over r of coef[r] * vals[r]` for a row of a constant matrix (zero terms skipped).
#[inline(always)]
fn combine<const N: usize, V: Vector>(coef: &[f32; N], vals: &[V; N]) -> V {
    let mut acc = V::zero();
    for r in 0..N {
        if coef[r] != 0.0 {
            acc = acc.fma(coef[r], vals[r]);
        }
    }
    acc
}

/// Lanes `0..w` of `src` (zero past `w`).
#[inline(always)]
fn load<V: Vector>(src: &[f32], w: usize) -> V {
    V::load(src, w)
}

/// Lanes `0..w` from `src[0]`, `src[stride]`, ... (zero past `w`).
#[inline(always)]
fn gather<V: Vector>(src: &[f32], stride: usize, w: usize) -> V {
    let mut lanes = [0.0f32; 16];
    for (l, v) in lanes[..w].iter_mut().enumerate() {
        *v = src[l * stride];
    }
    V::load(&lanes, w)
}

/// Writes (or adds) the first `w` lanes of `v` into `dst`.
#[inline(always)]
fn store<V: Vector>(dst: &mut [f32], v: &V, w: usize, accumulate: bool) {
    let v = if accumulate {
        v.add(V::load(dst, w))
    } else {
        *v
    };
    v.store(dst, w)
}

/// Defines `$name(t, ...)`, which runs `$body::<A, M, V>(...)` (`t` only names the tile) on the
/// widest vector this machine has (`super::vector`): an AVX-512 instance (compiled with
/// `avx512f` enabled, 16 lanes) when the GEMM uses AVX-512, else 8 lanes (the crate's AVX2
/// baseline). The transforms are most of Winograd's work besides the GEMMs; twice the lanes
/// halves their instructions.
macro_rules! lanes {
    ($(#[$doc:meta])* fn $name:ident => $body:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        fn $name<const A: usize, const M: usize>(_t: &Transform<A, M>, $($arg: $ty),*)
        where
            Lavin: Coefficients<A, M>,
        {
            #[cfg(target_arch = "x86_64")]
            if isa() == Isa::Avx512 {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide<const A: usize, const M: usize>($($arg: $ty),*)
                where
                    Lavin: Coefficients<A, M>,
                {
                    $body::<A, M, Wide>($($arg),*)
                }
                // SAFETY: `isa()` returned Avx512 only after detecting avx512f at run time.
                return unsafe { wide::<A, M>($($arg),*) };
            }
            $body::<A, M, Narrow>($($arg),*)
        }
    };
}

/// Floats of a tile block's `V` and `M` a block aims for: 128 K floats (512 KB), one L2 of
/// the machines this project runs on, so a block's transformed tiles are still in cache when
/// the GEMMs read them and when the output transform reads the products.
const BLOCK_BUDGET: usize = 1 << 17;
/// Most tiles per block: past this the GEMMs' rows gain nothing and the block leaves L2.
const MAX_BLOCK_TILES: usize = 120;

/// The output pointer the tile blocks write through: tiles cover disjoint output pixels, so
/// no two tasks write the same element.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each output element is written by exactly one tile (tiles partition the output
// pixels), and the slice it points into outlives the parallel loop.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// Reusable memory of Winograd convolutions: the transformed weights and their packed forms.
/// Sized by the largest layer on the first step.
#[derive(Default)]
pub struct WinogradWorkspace {
    /// The transformed weights `U[xi]`, packed for the GEMM, one per transformed position.
    packed: Vec<PackedB>,
    reserved: Reservation,
}

impl WinogradWorkspace {
    /// `y (+)= conv(x, w)` for a 3x3 stride-1 convolution (`crate::backend::winograd_applies`)
    /// with HWIO weights, no bias or activation (the caller's epilogue adds them); added into
    /// `y` when `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        tile: WinogradTile,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        y: &mut [f32],
        accumulate: bool,
    ) {
        debug_assert!(crate::backend::winograd_applies(g));
        on_tile!(tile, t => self.forward_with(t, g, n, x, w, false, y, accumulate))
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_with<const A: usize, const M: usize>(
        &mut self,
        t: &Transform<A, M>,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        flipped: bool,
        y: &mut [f32],
        accumulate: bool,
    ) where
        Lavin: Coefficients<A, M>,
    {
        // The flipped kernel's geometry is `g` (its channels already swapped by the caller).
        let (wc, wo) = if flipped { (g.o, g.c) } else { (g.c, g.o) };
        self.prepare_weights(t, w, wc, wo, flipped);
        let (a2, c, o) = (A * A, g.c, g.o);
        let tiles = n * g.oh.div_ceil(M) * g.ow.div_ceil(M);
        let tb = block_tiles(tiles, c, o, a2);
        self.reserved.reserve(a2 * tb * (c + o));
        let y = &mut y[..n * g.out_len()];
        let x = &x[..n * g.in_len()];
        let out = Out(y.as_mut_ptr());
        let packed = &self.packed[..a2];
        (0..tiles.div_ceil(tb)).into_par_iter().for_each(|blk| {
            let first = blk * tb;
            let count = tb.min(tiles - first);
            with_scratch(a2 * tb * (c + o), |scratch| {
                let (v, prod) = scratch.split_at_mut(a2 * tb * c);
                input_tiles(t, g, x, first..first + count, v);
                for (xi, u) in packed.iter().enumerate() {
                    // V[.][xi] as a tiles x c matrix, rows a tile's whole transform apart.
                    let a = MatRef::strided(&v[xi * c..], a2 * c, 1);
                    gemm_packed(count, o, c, a, u, &mut prod[xi * o..], a2 * o, false);
                }
                output_tiles(t, g, prod, first..first + count, out, accumulate);
            });
        });
    }

    /// `dx (+)= ` the input gradient of a 3x3 stride-1 convolution whose output is as large as
    /// its input: the convolution of `dy` with the flipped kernel, channels swapped.
    #[allow(clippy::too_many_arguments)]
    pub fn input_grad(
        &mut self,
        tile: WinogradTile,
        g: &ConvGeom,
        n: usize,
        dy: &[f32],
        w: &[f32],
        dx: &mut [f32],
        accumulate: bool,
    ) {
        let flipped = g.flipped();
        on_tile!(tile, t => self.forward_with(t, &flipped, n, dy, w, true, dx, accumulate))
    }

    /// Grows every compute thread's scratch for [`weight_grad_chunk`] on this geometry before
    /// the batch-sum tree runs the chunks.
    pub fn reserve_weight_grad(&mut self, tile: WinogradTile, g: &ConvGeom) {
        self.reserved.reserve(weight_grad_scratch(tile, g));
    }

    /// `U[xi] = (G w G^T)[xi]` for every input and output channel, written straight into the
    /// GEMM's packed layout; with `flipped`, of the input gradient's kernel instead (taps
    /// reversed, input and output channels swapped), read from `w` in place: the transform of
    /// each channel pair is the same arithmetic on the same taps, and the swap is which index
    /// becomes the packed matrix's row.
    fn prepare_weights<const A: usize, const M: usize>(
        &mut self,
        t: &Transform<A, M>,
        w: &[f32],
        c: usize,
        o: usize,
        flipped: bool,
    ) where
        Lavin: Coefficients<A, M>,
    {
        let a2 = A * A;
        // The transformed convolution's input and output channels: swapped when flipped.
        let (ins, outs) = if flipped { (o, c) } else { (c, o) };
        // Grown, never shrunk: a net with both tiles (16 and 36 positions) would otherwise free
        // and rebuild packed buffers on every step.
        if self.packed.len() < a2 {
            self.packed.resize_with(a2, PackedB::default);
        }
        let mut writers = self.packed[..a2].iter_mut().map(|p| {
            p.shape_for_writing(ins, outs);
            Some(p.writer())
        });
        let writers: [Option<PackedWriter>; MAX_POSITIONS] =
            std::array::from_fn(|_| writers.next().flatten());
        let writers = &writers[..a2];
        // One task per block of rows (the transformed convolution's input channels): the
        // blocks are disjoint. Within a block, each group of output channels for every row
        // before the next group: a group's writes then fill a run of whole micro-panel rows in
        // each position's buffer, instead of one row's scattering over every panel of all 36.
        // (Fewer rows per task where there are few: every thread gets some.)
        let per_task = (ins / (4 * rayon::current_num_threads())).clamp(1, WEIGHT_ROWS);
        (0..ins.div_ceil(per_task)).into_par_iter().for_each(|blk| {
            let rows = blk * per_task..((blk + 1) * per_task).min(ins);
            weights_of_channels(t, w, c, o, rows, flipped, writers)
        });
    }
}

lanes! {
    /// `U[xi][ch][.] = (G w[.][.][ch][.] G^T)[xi]` for each input channel `ch` of `chs`: its
    /// transformed weights for every output channel, of the `c -> o` convolution `w` or, when
    /// `flipped`, of its input gradient's `o -> c` one (taps reversed, `w[.][.][.][ch]` read
    /// across its rows), written as row `ch` of each position's packed matrix.
    fn weights_of_channels => weights_of_channels_lanes(
        w: &[f32],
        c: usize,
        o: usize,
        chs: std::ops::Range<usize>,
        flipped: bool,
        packed: &[Option<PackedWriter>],
    )
}

/// Input channels per task of the weight transform, at most.
const WEIGHT_ROWS: usize = 16;

#[inline(always)]
fn weights_of_channels_lanes<const A: usize, const M: usize, V: Vector>(
    w: &[f32],
    c: usize,
    o: usize,
    chs: std::ops::Range<usize>,
    flipped: bool,
    packed: &[Option<PackedWriter>],
) where
    Lavin: Coefficients<A, M>,
{
    let t = &<Lavin as Coefficients<A, M>>::T;
    let outs = if flipped { c } else { o };
    let mut lanes = [0f32; 16];
    for o0 in (0..outs).step_by(V::LANES) {
        let wl = V::LANES.min(outs - o0);
        for ch in chs.clone() {
            // The 3x3 taps of input channel ch, output channels o0..o0 + wl: a row of `w`, or
            // (flipped) a column read across rows, taps reversed.
            let taps: [[V; 3]; 3] = std::array::from_fn(|ki| {
                std::array::from_fn(|kj| {
                    if flipped {
                        let at = &w[((2 - ki) * 3 + (2 - kj)) * c * o..][..c * o];
                        gather(&at[o0 * o + ch..], o, wl)
                    } else {
                        load(&w[((ki * 3 + kj) * c + ch) * o + o0..], wl)
                    }
                })
            });
            // Stage 1: rows[i][kj] = sum over ki of G[i][ki] taps[ki][kj].
            let rows: [[V; 3]; A] = std::array::from_fn(|i| {
                std::array::from_fn(|kj| combine(&t.g[i], &[taps[0][kj], taps[1][kj], taps[2][kj]]))
            });
            // Stage 2: U[i][j] = sum over kj of rows[i][kj] G[j][kj].
            for i in 0..A {
                for j in 0..A {
                    let u = combine(&t.g[j], &rows[i]);
                    store(&mut lanes, &u, wl, false);
                    let writer = packed[i * A + j].as_ref().expect("a writer per position");
                    // SAFETY: row `ch` is this call's alone (one task per block of rows, see
                    // `prepare_weights`).
                    unsafe { writer.write(ch, o0, &lanes[..wl]) };
                }
            }
        }
    }
}

/// The weight gradient `dw` (HWIO, `9 x c x o`, overwritten) of samples `samples` of a 3x3
/// stride-1 convolution: see the module's note. Runs on the calling thread (the chunks of the
/// batch-sum tree run in parallel); its scratch is [`weight_grad_scratch`] floats.
pub fn weight_grad_chunk(
    tile: WinogradTile,
    g: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    samples: std::ops::Range<usize>,
    dw: &mut [f32],
) {
    on_tile!(tile, t => weight_grad_with(t, g, x, dy, samples, dw))
}

fn weight_grad_with<const A: usize, const M: usize>(
    t: &Transform<A, M>,
    g: &ConvGeom,
    x: &[f32],
    dy: &[f32],
    samples: std::ops::Range<usize>,
    dw: &mut [f32],
) where
    Lavin: Coefficients<A, M>,
{
    let (a2, c, o) = (A * A, g.c, g.o);
    let per_sample = g.oh.div_ceil(M) * g.ow.div_ceil(M);
    let (first, last) = (samples.start * per_sample, samples.end * per_sample);
    let tb = grad_block_tiles(c, o, a2);
    with_scratch(a2 * (c * o + tb * (c + o)), |scratch| {
        let (acc, rest) = scratch.split_at_mut(a2 * c * o);
        let (v, z) = rest.split_at_mut(a2 * tb * c);
        let mut start = first;
        while start < last {
            let count = tb.min(last - start);
            input_tiles(t, g, x, start..start + count, v);
            grad_tiles(t, g, dy, start..start + count, z);
            for xi in 0..a2 {
                // dU[xi] (+)= V[xi]^T x Z[xi]: A is V[xi] read transposed, k the block's tiles.
                let vt = MatRef::strided(&v[xi * c..], 1, a2 * c);
                let zb = MatRef::strided(&z[xi * o..], a2 * o, 1);
                let dst = &mut acc[xi * c * o..(xi + 1) * c * o];
                gemm(c, o, count, vt, zb, dst, o, start > first);
            }
            start += count;
        }
        if first == last {
            acc.fill(0.0);
        }
        weights_from_transformed(t, acc, c * o, dw);
    });
}

lanes! {
    /// `dW[ki][kj] = sum over (i, j) of G[i][ki] G[j][kj] dU[i][j]` for each of the `co`
    /// channel pairs: the transformed-domain gradient `du` (`[xi][co]`) taken back to 3x3.
    fn weights_from_transformed => weights_from_transformed_lanes(
        du: &[f32],
        co: usize,
        dw: &mut [f32],
    )
}

#[inline(always)]
fn weights_from_transformed_lanes<const A: usize, const M: usize, V: Vector>(
    acc: &[f32],
    co: usize,
    dw: &mut [f32],
) where
    Lavin: Coefficients<A, M>,
{
    let t = &<Lavin as Coefficients<A, M>>::T;
    let gt: [[f32; A]; 3] = std::array::from_fn(|k| std::array::from_fn(|i| t.g[i][k]));
    for e0 in (0..co).step_by(V::LANES) {
        let wl = V::LANES.min(co - e0);
        let du: [[V; A]; A] = std::array::from_fn(|i| {
            std::array::from_fn(|j| load(&acc[(i * A + j) * co + e0..], wl))
        });
        // Stage 1: rows[ki][j] = sum over i of G[i][ki] dU[i][j].
        let rows: [[V; A]; 3] = std::array::from_fn(|ki| {
            std::array::from_fn(|j| combine(&gt[ki], &std::array::from_fn(|i| du[i][j])))
        });
        for ki in 0..3 {
            for kj in 0..3 {
                let d = combine(&gt[kj], &rows[ki]);
                store(&mut dw[(ki * 3 + kj) * co + e0..], &d, wl, false);
            }
        }
    }
}

/// Floats of scratch [`weight_grad_chunk`] takes on its thread: the transformed-domain
/// gradient `A^2 x c x o` and a block's `V` and `Z`.
pub fn weight_grad_scratch(tile: WinogradTile, g: &ConvGeom) -> usize {
    let a2 = positions(tile);
    let tb = grad_block_tiles(g.c, g.o, a2);
    a2 * (g.c * g.o + tb * (g.c + g.o))
}

/// What a layer of geometry `g` makes Winograd's buffers grow to, with `forward` the tile of
/// its forward and input gradient and `weight_grad` that of its weight gradient (`None`:
/// direct): each position's packed transformed weights (padded to whole micro-panels, the
/// flipped kernel's too), and one compute thread's scratch (the larger of a
/// forward block and [`weight_grad_chunk`]'s).
pub fn workspace_floats(
    forward: Option<WinogradTile>,
    weight_grad: Option<WinogradTile>,
    g: &ConvGeom,
) -> WinogradMemory {
    let (c, o) = (g.c, g.o);
    let mut m = WinogradMemory::default();
    if let Some(tile) = forward {
        let a2 = positions(tile);
        let tiles = (BLOCK_BUDGET / (a2 * (c + o)).max(1))
            .min(MAX_BLOCK_TILES)
            .max(row_panel());
        m.positions = a2;
        m.packed = c.max(o) * c.max(o).div_ceil(32) * 32;
        m.thread = a2 * tiles * (c + o);
    }
    if let Some(tile) = weight_grad {
        m.thread = m.thread.max(weight_grad_scratch(tile, g));
    }
    m
}

/// Tiles per block of the weight gradient: what fits [`BLOCK_BUDGET`], within 8 and
/// [`MAX_BLOCK_TILES`]; a function of the shape alone (never of the thread count), since the
/// blocks are the order of the gradient's sum over tiles.
fn grad_block_tiles(c: usize, o: usize, a2: usize) -> usize {
    (BLOCK_BUDGET / (a2 * (c + o)).max(1)).clamp(8, MAX_BLOCK_TILES)
}

/// Tiles per block: what fits [`BLOCK_BUDGET`], at least one micro-kernel panel, at most
/// [`MAX_BLOCK_TILES`], and few enough that every thread gets a block; a multiple of the
/// micro-kernel's rows.
fn block_tiles(tiles: usize, c: usize, o: usize, a2: usize) -> usize {
    let panel = row_panel();
    let threads = rayon::current_num_threads().max(1);
    let by_cache = BLOCK_BUDGET / (a2 * (c + o)).max(1);
    let per_thread = tiles.div_ceil(threads);
    let tb = by_cache.min(MAX_BLOCK_TILES).min(per_thread).max(panel);
    (tb / panel * panel).max(panel).min(tiles.max(1))
}

lanes! {
    /// `V[k][xi] = (B^T d B)[xi]` for the `k`-th tile of `tiles`, `d`
    /// its input pixels (zero outside the image).
    fn input_tiles => input_tiles_lanes(
        g: &ConvGeom,
        x: &[f32],
        tiles: std::ops::Range<usize>,
        v: &mut [f32],
    )
}

lanes! {
    /// `Z[k][xi] = (A dY A^T)[xi]` for the `k`-th tile of `tiles`: the
    /// output gradient's `M x M` tile (zero past the output's edge) in the transformed domain.
    fn grad_tiles => grad_tiles_lanes(
        g: &ConvGeom,
        dy: &[f32],
        tiles: std::ops::Range<usize>,
        z: &mut [f32],
    )
}

lanes! {
    /// `Y = A^T P A` for each tile of `tiles` into `out` (see [`output_tiles_lanes`]).
    fn output_tiles => output_tiles_lanes(
        g: &ConvGeom,
        prod: &[f32],
        tiles: std::ops::Range<usize>,
        out: Out,
        accumulate: bool,
    )
}

/// Where tile `tile` of an `M x M`-tiled output lies: its sample and the output row and
/// column of its first pixel.
fn tile_origin<const M: usize>(g: &ConvGeom, tile: usize) -> (usize, usize, usize) {
    let (th, tw) = (g.oh.div_ceil(M), g.ow.div_ceil(M));
    let s = tile / (th * tw);
    let r = tile % (th * tw);
    (s, (r / tw) * M, (r % tw) * M)
}

/// The input transform of a block's tiles (see [`input_tiles`]).
#[inline(always)]
fn input_tiles_lanes<const A: usize, const M: usize, V: Vector>(
    g: &ConvGeom,
    x: &[f32],
    tiles: std::ops::Range<usize>,
    v: &mut [f32],
) where
    Lavin: Coefficients<A, M>,
{
    let t = &<Lavin as Coefficients<A, M>>::T;
    for (k, tile) in tiles.enumerate() {
        let (s, oy, ox) = tile_origin::<M>(g, tile);
        let c = g.c;
        let xs = &x[s * g.in_len()..][..g.in_len()];
        // Where each pixel of the window starts in `xs`, or None outside the image.
        let at: [[Option<usize>; A]; A] = std::array::from_fn(|r| {
            std::array::from_fn(|col| {
                let iy = (oy + r).checked_sub(g.ph).filter(|&iy| iy < g.h)?;
                let ix = (ox + col).checked_sub(g.pw).filter(|&ix| ix < g.w)?;
                Some((iy * g.w + ix) * c)
            })
        });
        for c0 in (0..c).step_by(V::LANES) {
            let wl = V::LANES.min(c - c0);
            let d: [[V; A]; A] = std::array::from_fn(|r| {
                std::array::from_fn(|col| match at[r][col] {
                    Some(p) => load(&xs[p + c0..], wl),
                    None => V::zero(),
                })
            });
            // Stage 1: rows[i][col] = sum over r of B^T[i][r] d[r][col].
            let rows: [[V; A]; A] = std::array::from_fn(|i| {
                std::array::from_fn(|col| combine(&t.bt[i], &std::array::from_fn(|r| d[r][col])))
            });
            // Stage 2: V[i][j] = sum over col of rows[i][col] B^T[j][col].
            for i in 0..A {
                for j in 0..A {
                    let val = combine(&t.bt[j], &rows[i]);
                    store(&mut v[((k * A + i) * A + j) * c + c0..], &val, wl, false);
                }
            }
        }
    }
}

/// The output-gradient transform of a block's tiles (see [`grad_tiles`]).
#[inline(always)]
fn grad_tiles_lanes<const A: usize, const M: usize, V: Vector>(
    g: &ConvGeom,
    dy: &[f32],
    tiles: std::ops::Range<usize>,
    z: &mut [f32],
) where
    Lavin: Coefficients<A, M>,
{
    let t = &<Lavin as Coefficients<A, M>>::T;
    for (k, tile) in tiles.enumerate() {
        let (s, oy, ox) = tile_origin::<M>(g, tile);
        let o = g.o;
        let dys = &dy[s * g.out_len()..][..g.out_len()];
        let at_t: [[f32; M]; A] = std::array::from_fn(|i| std::array::from_fn(|p| t.at[p][i]));
        for o0 in (0..o).step_by(V::LANES) {
            let wl = V::LANES.min(o - o0);
            let d: [[V; M]; M] = std::array::from_fn(|p| {
                std::array::from_fn(|q| {
                    if oy + p < g.oh && ox + q < g.ow {
                        load(&dys[((oy + p) * g.ow + ox + q) * o + o0..], wl)
                    } else {
                        V::zero()
                    }
                })
            });
            // Stage 1: rows[i][q] = sum over p of A^T[p][i] dY[p][q].
            let rows: [[V; M]; A] = std::array::from_fn(|i| {
                std::array::from_fn(|q| combine(&at_t[i], &std::array::from_fn(|p| d[p][q])))
            });
            // Stage 2: Z[i][j] = sum over q of rows[i][q] A^T[q][j].
            for i in 0..A {
                for j in 0..A {
                    let val = combine(&at_t[j], &rows[i]);
                    store(&mut z[((k * A + i) * A + j) * o + o0..], &val, wl, false);
                }
            }
        }
    }
}

/// `Y = A^T P A` for each tile of `tiles` (block positions from 0) from its products
/// `P`, written (or added) into its output pixels inside the image. `out` points at `g`'s
/// whole output ([`Out`]: a block's tiles are its own, no other task writes their pixels).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn output_tiles_lanes<const A: usize, const M: usize, V: Vector>(
    g: &ConvGeom,
    prod: &[f32],
    tiles: std::ops::Range<usize>,
    out: Out,
    accumulate: bool,
) where
    Lavin: Coefficients<A, M>,
{
    let t = &<Lavin as Coefficients<A, M>>::T;
    for (k, tile) in tiles.enumerate() {
        let (s, oy, ox) = tile_origin::<M>(g, tile);
        let o = g.o;
        let (rows_in, cols_in) = (M.min(g.oh - oy), M.min(g.ow - ox));
        for o0 in (0..o).step_by(V::LANES) {
            let wl = V::LANES.min(o - o0);
            let pm: [[V; A]; A] = std::array::from_fn(|i| {
                std::array::from_fn(|j| load(&prod[((k * A + i) * A + j) * o + o0..], wl))
            });
            // Stage 1: rows[p][j] = sum over i of A^T[p][i] P[i][j].
            let rows: [[V; A]; M] = std::array::from_fn(|p| {
                std::array::from_fn(|j| combine(&t.at[p], &std::array::from_fn(|i| pm[i][j])))
            });
            // Stage 2: Y[p][q] = sum over j of rows[p][j] A^T[q][j], the pixels inside the image.
            for (p, row) in rows.iter().enumerate().take(rows_in) {
                for q in 0..cols_in {
                    let val = combine(&t.at[q], row);
                    let at = (s * g.pixels() + (oy + p) * g.ow + ox + q) * o + o0;
                    // SAFETY: `at + wl <= n * out_len` (the pixel is inside the image), and the
                    // pixel is this tile's alone (`Out`).
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), wl) };
                    store(dst, &val, wl, accumulate);
                }
            }
        }
    }
}
