//! Which algorithm computes a convolution (`--conv-algo`): part of the seam's vocabulary, so
//! the rule that picks one is written once, here, whatever the backend.

use super::ConvGeom;
use std::fmt;
use std::str::FromStr;

/// Winograd's output tile: F(m x m, 3 x 3) computes an `m x m` block of outputs from an
/// `(m + 2) x (m + 2)` block of inputs with `(m + 2)^2` multiplications per channel pair
/// where direct convolution does `9 m^2`: 2.25x fewer for m = 2, 4x for m = 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinogradTile {
    /// F(2x2, 3x3): 4x4 input tiles, the smallest transform error.
    F2,
    /// F(4x4, 3x3): 6x6 input tiles, 4x fewer multiplications.
    F4,
}

impl WinogradTile {
    /// Outputs per tile side.
    pub fn m(self) -> usize {
        match self {
            WinogradTile::F2 => 2,
            WinogradTile::F4 => 4,
        }
    }
}

/// How the 3x3 stride-1 convolutions of a net are computed; every other convolution is direct
/// (im2col + GEMM, or the depthwise loop) whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvAlgo {
    /// im2col + GEMM everywhere: the bits of releases before `auto` was the default.
    Direct,
    /// Winograd with this tile for every layer it applies to.
    Winograd(WinogradTile),
    /// Winograd where [`ConvAlgo::winograd_pays`] says it is faster, with the tile
    /// [`ConvAlgo::auto_tile`] picks; direct elsewhere. A fixed rule of the layer's shape (not
    /// of the batch, not a timing taken at start-up): the choice, and so the bits, are the
    /// same on every run, every machine and every worker count. The default: training with it
    /// reaches direct's accuracy (docs/bench/winograd.md) in 0.64-0.83x of direct's step time.
    #[default]
    Auto,
}

impl ConvAlgo {
    /// The Winograd tile this algorithm uses for a layer of geometry `g`, or `None` for direct.
    pub fn tile_for(self, g: &ConvGeom) -> Option<WinogradTile> {
        if !winograd_applies(g) {
            return None;
        }
        match self {
            ConvAlgo::Direct => None,
            ConvAlgo::Winograd(t) => Some(t),
            ConvAlgo::Auto => Self::winograd_pays(g).then(|| Self::auto_tile(g)),
        }
    }

    /// The Winograd tile of a layer's weight gradient, or `None` for im2col + GEMM: a forced
    /// `winograd` uses it wherever it applies; `auto` where [`ConvAlgo::weight_grad_pays`].
    pub fn weight_grad_tile(self, g: &ConvGeom) -> Option<WinogradTile> {
        match self {
            ConvAlgo::Auto => self.tile_for(g).filter(|_| Self::weight_grad_pays(g)),
            _ => self.tile_for(g),
        }
    }

    /// `auto`'s rule for the weight gradient by Winograd, on top of [`ConvAlgo::winograd_pays`]:
    /// an output of at least 8x8. Its transformed-domain sum is per chunk of samples
    /// (`backend::sum_order`), and taking it back to 3x3 costs the same for every chunk
    /// whatever its tile count; on a 4x4 output a chunk has too few tiles to repay it.
    /// Measured (1 thread, batch 64, backward ms, docs/bench/winograd.md): resnet18's
    /// 256-channel 8x8 layer 23.4 with it (F(4x4)) against 42.8 direct; its 512-channel 4x4
    /// layer 46.4 without it (F(2x2) for the input gradient) against 47.3 with F(2x2) and 66.7
    /// with F(4x4).
    pub fn weight_grad_pays(g: &ConvGeom) -> bool {
        g.oh >= 8 && g.ow >= 8
    }

    /// `auto`'s rule for using Winograd: both channel counts at least 16. The tile transforms
    /// cost work linear in the channels, the multiplications they save are quadratic in them,
    /// so Winograd pays from some channel count on. Measured (1 thread, batch 64,
    /// `bench step --layers`, docs/bench/winograd.md, forward + backward ms): resnet20's
    /// 16-channel 32x32 layers 2.17 + 3.97 by F(4x4) against 2.32 + 4.58 direct, its
    /// 32-channel 16x16 ones 1.00 + 1.98 against 1.62 + 3.12; its 3 -> 16 stem 1.40 + 1.74
    /// against 1.04 + 0.95, and vgg-small's 3 -> 32 stem 2.07 + 2.93 against 1.64 + 2.14.
    pub fn winograd_pays(g: &ConvGeom) -> bool {
        g.c >= 16 && g.o >= 16
    }

    /// `auto`'s tile: F(4x4, 3x3) when the output is at least 8x8, F(2x2, 3x3) below. On a
    /// 4x4 output a batch has one F(4x4) tile per sample, too few to repay transforming
    /// 36 x C x O weights each call; F(2x2)'s 16 x C x O cost less (measured on resnet18's
    /// 512-channel 4x4 layers' forward: 15.4 ms by F(2x2), 20.1 by F(4x4), 20.7 direct).
    pub fn auto_tile(g: &ConvGeom) -> WinogradTile {
        if g.oh >= 8 && g.ow >= 8 {
            WinogradTile::F4
        } else {
            WinogradTile::F2
        }
    }
}

/// What one convolution's Winograd buffers grow to in floats (all
/// zero for a layer that runs direct). A net's buffers grow to the largest layer once: its
/// thread scratch to the largest of its layers', and each of the `positions` packed
/// transformed weights to the largest of the layers that have that position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WinogradMemory {
    /// Transformed positions of the layer's tile (16 for F(2x2,3x3), 36 for F(4x4,3x3)).
    pub positions: usize,
    /// One position's packed transformed weights.
    pub packed: usize,
    /// One compute thread's scratch (shared with im2col's column matrix).
    pub thread: usize,
}

/// Winograd's F(m x m, 3 x 3) computes exactly a 3x3 convolution of stride 1, dilation 1 and
/// one group (any padding).
pub fn winograd_applies(g: &ConvGeom) -> bool {
    g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1
}

impl FromStr for ConvAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "direct" => Ok(ConvAlgo::Direct),
            "winograd" | "winograd:4" => Ok(ConvAlgo::Winograd(WinogradTile::F4)),
            "winograd:2" => Ok(ConvAlgo::Winograd(WinogradTile::F2)),
            "auto" => Ok(ConvAlgo::Auto),
            _ => Err(format!(
                "unknown convolution algorithm '{s}': expected direct, winograd (F(4x4,3x3)), winograd:2 (F(2x2,3x3)), winograd:4 or auto"
            )),
        }
    }
}

impl fmt::Display for ConvAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConvAlgo::Direct => "direct",
            ConvAlgo::Winograd(WinogradTile::F4) => "winograd",
            ConvAlgo::Winograd(WinogradTile::F2) => "winograd:2",
            ConvAlgo::Auto => "auto",
        })
    }
}
