//! Image transforms on the loader threads: a list of operations applied in the order given
//! (`--augment`, `--eval-transform`), then the normalisation into the batch's `f32`s.
//!
//! Operations (torchvision's names in brackets):
//! - `random-resized-crop[:SMIN,SMAX[:RMIN,RMAX]]` (`RandomResizedCrop(size, scale, ratio)`,
//!   defaults 0.08,1 and 3/4,4/3, the same 10 tries then the centre-crop fallback): a crop of
//!   random area and aspect, resized to `--image-size`;
//! - `flip` (`RandomHorizontalFlip()`): mirror left-right with probability 1/2;
//! - `crop:PAD` (`RandomCrop(size, padding=PAD)`): pad every side with PAD zero pixels, crop the
//!   current size at a random offset;
//! - `resize-shorter[:S]` (`Resize(S)`): the shorter side to S, the longer in proportion
//!   (truncated, as torchvision does); S defaults to round(size * 256 / 224), torchvision's
//!   evaluation rule, except under 64 px where it is the size itself (see [`default_shorter`]);
//! - `center-crop` (`CenterCrop(size)`): the middle `--image-size`, zero-padded when smaller;
//! - `resize` (`Resize((h, w))`): the whole image to `--image-size`, aspect not kept.
//!
//! Every list ends, implicitly, with `resize` if the image is not at `--image-size` by then,
//! so any list gives the model its input shape.
//!
//! The operations compose into one axis-aligned map from output pixels to source pixels
//! ([`Geometry`]), computed from the image's size before it is decoded: a JPEG is then decoded
//! at 1/2, 1/4 or 1/8 scale when the crop needs no more ([`crate::data::decode`]), the one
//! source region is resampled once (`fast_image_resize`) and padding, flip and normalisation are
//! one pass into the batch.
//!
//! Random draws are a hash of (seed, epoch, sample index) and nothing else, as before: `crop`
//! and `flip` take the same bits they always did (the same batches, bit for bit, for lists of
//! only those on data at the image size), `random-resized-crop` a ChaCha8 stream seeded from
//! that hash. Which loader thread fills a batch cannot change a bit of it.

use super::Normalize;
use crate::data::decode::{DecodeError, DecodedImage, Decoder, Region, Resampler};
use rand::{Rng, SeedableRng};
use std::fmt;
use std::path::Path;

/// Largest crop padding accepted: beyond it most crops are mostly padding.
pub const MAX_CROP_PAD: usize = 64;

/// Largest `--image-size` side (the decoder's cap is 4096 x 4096 pixels).
pub const MAX_IMAGE_SIDE: usize = 4096;

/// A bad `--image-size`, `--augment` or `--eval-transform`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// `--image-size` is not `H` or `HxW` with sides 1..=4096.
    #[error("bad image size '{given}': {why}; write H or HxW (e.g. 224 or 28x28), each side 1..={MAX_IMAGE_SIDE}")]
    BadSize {
        /// As given.
        given: String,
        /// What is wrong.
        why: String,
    },
    /// An operation or its arguments.
    #[error("{why}; write off, or a comma-separated list of random-resized-crop[:SMIN,SMAX[:RMIN,RMAX]], flip, crop:PAD, resize-shorter[:S], center-crop, resize (e.g. random-resized-crop,flip or crop:4,flip)")]
    BadList {
        /// What is wrong.
        why: String,
    },
    /// An operation or its arguments in an evaluation list (which takes the deterministic
    /// operations only).
    #[error("{why}; write off, or a comma-separated list of resize-shorter[:S], center-crop, resize (e.g. resize-shorter,center-crop)")]
    BadEvalList {
        /// What is wrong.
        why: String,
    },
    /// The same operation twice in one list. A repeat is never meaningful here: two flips are
    /// one flip with probability 1/2, two crops shift twice by the sum of their paddings, two
    /// resizes resize once; refusing it is clearer than running something else than written.
    #[error("'{op}' appears more than once in '{list}': each operation may appear once (a repeat of flip, crop or a resize does not do more of it); keep one")]
    Repeated {
        /// The operation's name.
        op: String,
        /// The list as given.
        list: String,
    },
    /// A random operation in an evaluation list.
    #[error("'{op}' is random, and an evaluation transform must give the same image every time; use resize-shorter[:S], center-crop and resize")]
    RandomInEval {
        /// The operation.
        op: String,
    },
}

/// The model's input size (`--image-size H[xW]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageSize {
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
}

impl ImageSize {
    /// A size, checked: each side 1..=[`MAX_IMAGE_SIDE`].
    pub fn new(height: usize, width: usize) -> Result<Self, TransformError> {
        let s = ImageSize { height, width };
        for side in [height, width] {
            if side == 0 || side > MAX_IMAGE_SIDE {
                return Err(TransformError::BadSize {
                    given: s.to_string(),
                    why: format!("a side of {side} is outside 1..={MAX_IMAGE_SIDE}"),
                });
            }
        }
        Ok(s)
    }

    /// Parses `H` (square) or `HxW`.
    pub fn parse(s: &str) -> Result<Self, TransformError> {
        let bad = |why: &str| TransformError::BadSize {
            given: s.to_string(),
            why: why.into(),
        };
        let num = |t: &str| t.trim().parse::<usize>().map_err(|_| bad("not a number"));
        match s.trim().split_once(['x', 'X']) {
            None => {
                let n = num(s)?;
                Self::new(n, n)
            }
            Some((h, w)) => Self::new(num(h)?, num(w)?),
        }
    }

    /// Pixels.
    pub fn pixels(&self) -> usize {
        self.height * self.width
    }
}

impl fmt::Display for ImageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.height == self.width {
            write!(f, "{}", self.height)
        } else {
            write!(f, "{}x{}", self.height, self.width)
        }
    }
}

impl std::str::FromStr for ImageSize {
    type Err = TransformError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// One operation of a transform list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TransformOp {
    /// A random crop of area `scale` (fractions of the image) and aspect `ratio` (w/h),
    /// resized to the image size.
    RandomResizedCrop {
        /// Area fraction range.
        scale: (f64, f64),
        /// Aspect ratio range (width / height).
        ratio: (f64, f64),
    },
    /// Mirror left-right with probability 1/2.
    Flip,
    /// Zero padding of `pad` pixels, then a crop of the current size at a random offset.
    Crop {
        /// Padding per side.
        pad: usize,
    },
    /// Shorter side to `size` (None: the default for the image size, [`default_shorter`]).
    ResizeShorter {
        /// Target of the shorter side.
        size: Option<usize>,
    },
    /// The middle of the image at the image size.
    CenterCrop,
    /// The whole image to the image size.
    Resize,
}

/// torchvision's defaults for `RandomResizedCrop`.
const RRC_SCALE: (f64, f64) = (0.08, 1.0);
const RRC_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);

impl TransformOp {
    /// Whether the operation draws random numbers.
    pub fn is_random(&self) -> bool {
        matches!(
            self,
            Self::RandomResizedCrop { .. } | Self::Flip | Self::Crop { .. }
        )
    }

    /// Whether it changes the image's scale (so a list with one needs no resize first).
    pub fn resizes(&self) -> bool {
        matches!(
            self,
            Self::RandomResizedCrop { .. } | Self::ResizeShorter { .. } | Self::Resize
        )
    }

    fn parse(part: &str) -> Result<Self, TransformError> {
        let bad = |why: String| TransformError::BadList { why };
        let (name, args) = match part.split_once(':') {
            Some((n, a)) => (n.trim(), Some(a.trim())),
            None => (part.trim(), None),
        };
        let pair = |s: &str, what: &str| -> Result<(f64, f64), TransformError> {
            let v: Vec<f64> = s
                .split(',')
                .map(|t| t.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|_| bad(format!("bad {what} '{s}' in '{part}'")))?;
            match v.as_slice() {
                &[a, b] if a.is_finite() && b.is_finite() && 0.0 < a && a <= b => Ok((a, b)),
                _ => Err(bad(format!(
                    "{what} '{s}' in '{part}' must be two numbers MIN,MAX with 0 < MIN <= MAX"
                ))),
            }
        };
        let op = match (name, args) {
            ("flip", None) => Self::Flip,
            ("center-crop", None) => Self::CenterCrop,
            ("resize", None) => Self::Resize,
            ("resize-shorter", None) => Self::ResizeShorter { size: None },
            ("resize-shorter", Some(a)) => {
                let s: usize = a
                    .parse()
                    .map_err(|_| bad(format!("bad size '{a}' in '{part}'")))?;
                if s == 0 || s > MAX_IMAGE_SIDE {
                    return Err(bad(format!(
                        "resize-shorter size {s} must be 1..={MAX_IMAGE_SIDE}"
                    )));
                }
                Self::ResizeShorter { size: Some(s) }
            }
            ("crop", Some(a)) => {
                let pad: usize = a
                    .parse()
                    .map_err(|_| bad(format!("bad crop padding '{a}'")))?;
                if pad == 0 || pad > MAX_CROP_PAD {
                    return Err(bad(format!(
                        "crop padding {pad} must be 1..={MAX_CROP_PAD}"
                    )));
                }
                Self::Crop { pad }
            }
            ("random-resized-crop", a) => {
                let (scale, ratio) = match a.map(|a| a.split_once(':')) {
                    None => (RRC_SCALE, RRC_RATIO),
                    Some(None) => (pair(a.unwrap_or_default(), "scale")?, RRC_RATIO),
                    Some(Some((s, r))) => (pair(s, "scale")?, pair(r, "ratio")?),
                };
                if scale.1 > 1.0 {
                    return Err(bad(format!(
                        "random-resized-crop scale {},{} must be within 0..1 (fractions of the \
                         image's area)",
                        scale.0, scale.1
                    )));
                }
                Self::RandomResizedCrop { scale, ratio }
            }
            _ => return Err(bad(format!("unknown or malformed transform '{part}'"))),
        };
        Ok(op)
    }
}

impl fmt::Display for TransformOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RandomResizedCrop { scale, ratio } => {
                f.write_str("random-resized-crop")?;
                if (*scale, *ratio) != (RRC_SCALE, RRC_RATIO) {
                    write!(f, ":{},{}", scale.0, scale.1)?;
                    if *ratio != RRC_RATIO {
                        write!(f, ":{},{}", ratio.0, ratio.1)?;
                    }
                }
                Ok(())
            }
            Self::Flip => f.write_str("flip"),
            Self::Crop { pad } => write!(f, "crop:{pad}"),
            Self::ResizeShorter { size: None } => f.write_str("resize-shorter"),
            Self::ResizeShorter { size: Some(s) } => write!(f, "resize-shorter:{s}"),
            Self::CenterCrop => f.write_str("center-crop"),
            Self::Resize => f.write_str("resize"),
        }
    }
}

/// Where a centre crop of `crop` pixels starts on a side of `side` pixels, torchvision's
/// `center_crop` to the pixel: `int(round((side - crop) / 2))` with Python's `round` (halves
/// to even) when the side is at least the crop; else the side is zero-padded by
/// `(crop - side) // 2` before it (the odd pixel after it), so the crop starts that far
/// before the side's first pixel.
pub fn centre_crop_offset(side: f64, crop: f64) -> f64 {
    if side >= crop {
        ((side - crop) / 2.0).round_ties_even()
    } else {
        -((crop - side) / 2.0).floor()
    }
}

/// The shorter side `resize-shorter` goes to by default for an image size: torchvision's
/// evaluation rule round(side * 256 / 224) (the 0.875 centre crop), from the shorter side of
/// the size; for sizes under 64 px the side itself (no border cut), because datasets of
/// that scale (MNIST 28, CIFAR 32) have their content out to the edge and are evaluated
/// uncropped, as their in-memory test sets are here.
pub fn default_shorter(size: ImageSize) -> usize {
    let side = size.height.min(size.width);
    if side < 64 {
        side
    } else {
        (side as f64 * 256.0 / 224.0).round() as usize
    }
}

/// A transform list, applied in order (`--augment`, `--eval-transform`). The empty list is
/// `off`. Parse and Display round-trip.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transforms {
    /// The operations, first applied first.
    pub ops: Vec<TransformOp>,
}

/// The training augmentation's old name: a transform list.
pub type Augment = Transforms;

impl Transforms {
    /// No operations (only the implicit resize to the image size where needed).
    pub const OFF: Transforms = Transforms { ops: Vec::new() };

    /// Parses `off`/`none`, or a comma-separated list of operations. Numbers after an
    /// operation's colon belong to it (`random-resized-crop:0.25,1,flip` is two operations).
    /// An empty list is refused, as every list option's empty value is: it reads as a value
    /// lost on the way (`--augment "$AUG"`), not as `off`.
    pub fn parse(s: &str) -> Result<Self, TransformError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(TransformError::BadList {
                why: "an empty list".into(),
            });
        }
        if matches!(s, "off" | "none") {
            return Ok(Self::OFF);
        }
        let mut parts: Vec<String> = Vec::new();
        for token in s.split(',').map(str::trim) {
            let continues = token
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == '.');
            match parts.last_mut() {
                Some(last) if continues => {
                    last.push(',');
                    last.push_str(token);
                }
                _ => parts.push(token.to_string()),
            }
        }
        let ops = parts
            .iter()
            .map(|p| TransformOp::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, op) in ops.iter().enumerate() {
            let same = |o: &TransformOp| std::mem::discriminant(o) == std::mem::discriminant(op);
            if ops[..i].iter().any(same) {
                let name = op.to_string();
                return Err(TransformError::Repeated {
                    op: name.split(':').next().unwrap_or_default().to_string(),
                    list: s.to_string(),
                });
            }
        }
        Ok(Self { ops })
    }

    /// Parses an evaluation list: as [`Transforms::parse`], refusing random operations.
    pub fn parse_eval(s: &str) -> Result<Self, TransformError> {
        let t = Self::parse(s).map_err(|e| match e {
            TransformError::BadList { why } => TransformError::BadEvalList { why },
            e => e,
        })?;
        if let Some(op) = t.ops.iter().find(|o| o.is_random()) {
            return Err(TransformError::RandomInEval { op: op.to_string() });
        }
        Ok(t)
    }

    /// torchvision's evaluation transform: `resize-shorter,center-crop`.
    pub fn eval_default() -> Self {
        Self {
            ops: vec![
                TransformOp::ResizeShorter { size: None },
                TransformOp::CenterCrop,
            ],
        }
    }

    /// True for the empty list.
    pub fn is_off(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether any operation draws random numbers.
    pub fn is_random(&self) -> bool {
        self.ops.iter().any(TransformOp::is_random)
    }

    /// Whether any operation resizes.
    pub fn resizes(&self) -> bool {
        self.ops.iter().any(TransformOp::resizes)
    }

    /// The list with every default filled in for `size` (`resize-shorter` gets its S): what a
    /// checkpoint stores, so that it means the same whatever the defaults become.
    pub fn resolved(&self, size: ImageSize) -> Self {
        let ops = self
            .ops
            .iter()
            .map(|op| match op {
                TransformOp::ResizeShorter { size: None } => TransformOp::ResizeShorter {
                    size: Some(default_shorter(size)),
                },
                o => *o,
            })
            .collect();
        Self { ops }
    }

    /// `self` with `first` in front (a training list that does not resize, on images not at
    /// the image size, gets the evaluation list first).
    pub fn after(&self, first: &Transforms) -> Self {
        let mut ops = first.ops.clone();
        ops.extend_from_slice(&self.ops);
        Self { ops }
    }

    /// Only `crop` and `flip`, at most one of each: the list the fixed-size path runs.
    fn is_legacy(&self) -> bool {
        let crops = self
            .ops
            .iter()
            .filter(|o| matches!(o, TransformOp::Crop { .. }))
            .count();
        let flips = self
            .ops
            .iter()
            .filter(|o| matches!(o, TransformOp::Flip))
            .count();
        crops + flips == self.ops.len() && crops <= 1 && flips <= 1
    }

    fn crop_pad(&self) -> usize {
        self.ops
            .iter()
            .find_map(|o| match o {
                TransformOp::Crop { pad } => Some(*pad),
                _ => None,
            })
            .unwrap_or(0)
    }

    fn flips(&self) -> bool {
        self.ops.contains(&TransformOp::Flip)
    }

    /// The map from the output (`size`) to a source image of `width x height` pixels for
    /// sample `index` of `epoch` (the draws of random operations come from these).
    pub fn geometry(
        &self,
        (width, height): (usize, usize),
        size: ImageSize,
        draw: Draw,
    ) -> Geometry {
        let mut g = Geometry::identity(width, height);
        for (k, op) in self.ops.iter().enumerate() {
            g.apply(*op, size, draw, k);
        }
        if (g.out_w, g.out_h) != (size.width, size.height) {
            g.apply(TransformOp::Resize, size, draw, self.ops.len());
        }
        g
    }

    /// Writes sample `index` of `epoch` (`pixels`, C x H x W: an in-memory dataset's sample)
    /// transformed to the same size and normalised to `out` (C x H x W `f32`). Lists of only
    /// `crop` and `flip` take the fixed-size path (the same bits as before transform lists);
    /// others allocate a scratch per call: loaders call [`Transforms::apply_planar`].
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        pixels: &[u8],
        [c, h, w]: [usize; 3],
        norm: &Normalize,
        seed: u64,
        epoch: usize,
        index: usize,
        out: &mut [f32],
    ) {
        let size = ImageSize {
            height: h,
            width: w,
        };
        let draw = Draw::new(seed, epoch, index);
        let mut scratch = TransformScratch::default();
        self.apply_planar(pixels, [c, h, w], size, norm, draw, &mut scratch, out);
    }

    /// An in-memory sample (`pixels`, C x H x W of `shape`) transformed to `size` and
    /// normalised into `out` (C x H x W `f32`). Off, and lists of only `crop` and `flip` at the
    /// sample's own size, take the fixed-size path (the same bits as before transform lists).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_planar(
        &self,
        pixels: &[u8],
        [c, h, w]: [usize; 3],
        size: ImageSize,
        norm: &Normalize,
        draw: Draw,
        scratch: &mut TransformScratch,
        out: &mut [f32],
    ) {
        let same = (size.height, size.width) == (h, w);
        if same && self.is_off() {
            norm.apply(pixels, h * w, out);
        } else if same && self.is_legacy() {
            self.apply_fixed(pixels, [c, h, w], norm, draw, out);
        } else {
            scratch.image.set_from_chw(w, h, c, pixels);
            let TransformScratch { image, render, .. } = scratch;
            self.apply_image(image, size, norm, draw, render, out);
        }
    }

    /// Crop (zero padding) and flip at the image's own size, from the hash `draw.bits()`.
    fn apply_fixed(
        &self,
        pixels: &[u8],
        [c, h, w]: [usize; 3],
        norm: &Normalize,
        draw: Draw,
        out: &mut [f32],
    ) {
        let r = draw.bits();
        let p = self.crop_pad();
        let span = 2 * p as u64 + 1;
        // Offsets of the crop window in the padded image, 0..=2p; minus p gives the shift.
        let dy = (r % span) as isize - p as isize;
        let dx = ((r >> 20) % span) as isize - p as isize;
        let flip = self.flips() && (r >> 63) == 1;
        for ch in 0..c {
            let (a, b) = norm.channel(ch);
            let src = &pixels[ch * h * w..(ch + 1) * h * w];
            let dst = &mut out[ch * h * w..(ch + 1) * h * w];
            for y in 0..h {
                let sy = y as isize + dy;
                let row = &mut dst[y * w..(y + 1) * w];
                if sy < 0 || sy >= h as isize {
                    row.fill(b); // a padded (zero) pixel, normalised
                    continue;
                }
                let srow = &src[sy as usize * w..(sy as usize + 1) * w];
                for (x, d) in row.iter_mut().enumerate() {
                    // Crop, then flip: output column x shows cropped column w-1-x.
                    let cx = if flip { w - 1 - x } else { x };
                    let sx = cx as isize + dx;
                    let v = if sx < 0 || sx >= w as isize {
                        0
                    } else {
                        srow[sx as usize]
                    };
                    *d = v as f32 * a + b;
                }
            }
        }
    }

    /// Decodes `bytes` (the file `path`) with `channels` channels and writes it transformed to
    /// `size` and normalised into `out` (C x H x W `f32`, `channels * size.pixels()`). The
    /// draws come from `draw` (an evaluation list ignores them: pass [`Draw::NONE`]).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_bytes(
        &self,
        bytes: &[u8],
        path: &Path,
        channels: usize,
        size: ImageSize,
        norm: &Normalize,
        draw: Draw,
        scratch: &mut TransformScratch,
        out: &mut [f32],
    ) -> Result<(), DecodeError> {
        self.decode_render(bytes, path, channels, size, draw, scratch)?;
        write_normalized(&scratch.render.canvas, channels, size, norm, out);
        Ok(())
    }

    /// As [`Transforms::apply_bytes`], into `u8` planes (C x H x W) without normalising: an
    /// in-memory dataset's sample (the test split of an ImageFolder).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_bytes_u8(
        &self,
        bytes: &[u8],
        path: &Path,
        channels: usize,
        size: ImageSize,
        draw: Draw,
        scratch: &mut TransformScratch,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        self.decode_render(bytes, path, channels, size, draw, scratch)?;
        hwc_to_chw(&scratch.render.canvas, channels, size, out);
        Ok(())
    }

    /// An image already decoded (any size, interleaved; e.g. a packed dataset's raw sample put
    /// into a [`DecodedImage`] with [`DecodedImage::set_from_hwc`]) transformed to `size` and
    /// normalised into `out` (C x H x W `f32`).
    pub fn apply_image(
        &self,
        image: &DecodedImage,
        size: ImageSize,
        norm: &Normalize,
        draw: Draw,
        render: &mut RenderScratch,
        out: &mut [f32],
    ) {
        let g = self.geometry((image.full_width, image.full_height), size, draw);
        g.render(image, render);
        write_normalized(&render.canvas, image.channels, size, norm, out);
    }

    /// Decodes (reduced where the geometry allows) and renders into `scratch.render.canvas`.
    fn decode_render(
        &self,
        bytes: &[u8],
        path: &Path,
        channels: usize,
        size: ImageSize,
        draw: Draw,
        scratch: &mut TransformScratch,
    ) -> Result<(), DecodeError> {
        let info = crate::data::decode::read_info(bytes, path)?;
        let full = (info.width as usize, info.height as usize);
        let g = self.geometry(full, size, draw);
        let TransformScratch {
            decoder,
            image,
            render,
        } = scratch;
        decoder.decode(bytes, path, channels, Some(g.min_source_size(full)), image)?;
        g.render(image, render);
        Ok(())
    }
}

impl fmt::Display for Transforms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ops.is_empty() {
            return f.write_str("off");
        }
        for (k, op) in self.ops.iter().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            write!(f, "{op}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Transforms {
    type Err = TransformError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Per-thread buffers for applying transforms: the decoder's, the decoded image, the
/// rendering's. Reused from image to image (nothing of ours is allocated once grown).
#[derive(Debug, Default)]
pub struct TransformScratch {
    /// The decoder's state.
    pub decoder: Decoder,
    /// The image as decoded (or an in-memory sample, interleaved).
    pub image: DecodedImage,
    /// The rendering's buffers; `render.canvas` holds the last output (H x W x C, u8).
    pub render: RenderScratch,
}

/// The random draws of one sample: a hash of (seed, epoch, sample index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw(u64);

impl Draw {
    /// The draws of sample `index` in `epoch` of a run seeded `seed`.
    pub fn new(seed: u64, epoch: usize, index: usize) -> Self {
        Draw(mix(mix(mix(seed) ^ epoch as u64) ^ index as u64))
    }

    /// Draws for a deterministic (evaluation) list: any value does.
    pub const NONE: Draw = Draw(0);

    fn bits(self) -> u64 {
        self.0
    }

    /// A generator for operation `k` of the list.
    fn stream(self, k: usize) -> rand_chacha::ChaCha8Rng {
        rand_chacha::ChaCha8Rng::seed_from_u64(mix(self.0 ^ mix(0x7261_6e64 + k as u64)))
    }
}

/// SplitMix64's finaliser: a cheap, well-mixed hash of one word.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where each output pixel comes from: source x = `ax * u + bx` for output coordinate u
/// (pixel centres at k + 0.5), the same for y; output `out_w x out_h`; source `src_w x src_h`
/// (outside it: zero). A negative `ax` is a mirror.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    ax: f64,
    bx: f64,
    ay: f64,
    by: f64,
    out_w: usize,
    out_h: usize,
    src_w: usize,
    src_h: usize,
}

impl Geometry {
    fn identity(w: usize, h: usize) -> Self {
        Geometry {
            ax: 1.0,
            bx: 0.0,
            ay: 1.0,
            by: 0.0,
            out_w: w,
            out_h: h,
            src_w: w,
            src_h: h,
        }
    }

    /// Output becomes `w x h` showing what the current output's window
    /// [x0, x0 + cw) x [y0, y0 + ch) showed.
    fn window(&mut self, (x0, y0, cw, ch): (f64, f64, f64, f64), (w, h): (usize, usize)) {
        self.bx += self.ax * x0;
        self.by += self.ay * y0;
        self.ax *= cw / w as f64;
        self.ay *= ch / h as f64;
        (self.out_w, self.out_h) = (w, h);
    }

    fn apply(&mut self, op: TransformOp, size: ImageSize, draw: Draw, k: usize) {
        let (cw, ch) = (self.out_w as f64, self.out_h as f64);
        let (sw, sh) = (size.width, size.height);
        match op {
            TransformOp::Resize => self.window((0.0, 0.0, cw, ch), (sw, sh)),
            TransformOp::ResizeShorter { size: s } => {
                let s = s.unwrap_or_else(|| default_shorter(size));
                let (w, h) = (self.out_w, self.out_h);
                // torchvision: the longer side is int(s * long / short).
                let (nw, nh) = if w <= h {
                    (s, (s as f64 * h as f64 / w as f64) as usize)
                } else {
                    ((s as f64 * w as f64 / h as f64) as usize, s)
                };
                self.window((0.0, 0.0, cw, ch), (nw.max(1), nh.max(1)));
            }
            TransformOp::CenterCrop => {
                let x0 = centre_crop_offset(cw, sw as f64);
                let y0 = centre_crop_offset(ch, sh as f64);
                self.window((x0, y0, sw as f64, sh as f64), (sw, sh));
            }
            TransformOp::Crop { pad } => {
                let r = draw.bits();
                let span = 2 * pad as u64 + 1;
                let dy = (r % span) as f64 - pad as f64;
                let dx = ((r >> 20) % span) as f64 - pad as f64;
                self.window((dx, dy, cw, ch), (self.out_w, self.out_h));
            }
            TransformOp::Flip => {
                if draw.bits() >> 63 == 1 {
                    // u -> width - u.
                    self.bx += self.ax * cw;
                    self.ax = -self.ax;
                }
            }
            TransformOp::RandomResizedCrop { scale, ratio } => {
                let (i, j, h, w) =
                    rrc_params(self.out_w, self.out_h, scale, ratio, &mut draw.stream(k));
                self.window((j as f64, i as f64, w as f64, h as f64), (sw, sh));
            }
        }
    }

    /// The smallest source size (width, height) that still gives every output pixel at least
    /// one source pixel: what a JPEG may be decoded down to.
    pub fn min_source_size(&self, (w, h): (usize, usize)) -> (usize, usize) {
        let need = |len: usize, a: f64| (len as f64 / a.abs().max(1e-12)).ceil() as usize;
        (need(w, self.ax).min(w), need(h, self.ay).min(h))
    }

    /// Renders into `work.canvas` (out_h x out_w x c, zero where padded) from `image`, whose
    /// pixels may be a reduced decode of the `src_w x src_h` image the geometry is for.
    fn render(&self, image: &DecodedImage, work: &mut RenderScratch) {
        let c = image.channels;
        let (ow, oh) = (self.out_w, self.out_h);
        let canvas = &mut work.canvas;
        canvas.clear();
        canvas.resize(ow * oh * c, 0);
        let (Some((u0, u1)), Some((v0, v1))) = (
            visible(self.ax, self.bx, self.src_w, ow),
            visible(self.ay, self.by, self.src_h, oh),
        ) else {
            return; // all padding
        };
        // The visible outputs' source span, in the decoded pixels (scaled by kx, ky when a
        // JPEG was decoded reduced).
        let kx = image.width as f64 / self.src_w as f64;
        let ky = image.height as f64 / self.src_h as f64;
        let span = |a: f64, b: f64, k0: usize, k1: usize, scale: f64, len: usize| {
            let (p, q) = (a * k0 as f64 + b, a * k1 as f64 + b);
            let lo = (p.min(q) * scale).clamp(0.0, len as f64);
            let hi = (p.max(q) * scale).clamp(0.0, len as f64);
            (lo, (hi - lo).max(1e-6))
        };
        let (left, width) = span(self.ax, self.bx, u0, u1, kx, image.width);
        let (top, height) = span(self.ay, self.by, v0, v1, ky, image.height);
        let (vw, vh) = (u1 - u0, v1 - v0);
        let region = Region {
            left,
            top,
            width,
            height,
        };
        work.resampler
            .resize(image, region, (vw, vh), &mut work.tile);
        // Place the visible part (vh x vw x c), mirrored where the map runs backwards.
        let tile = &work.tile;
        let (mirror_x, mirror_y) = (self.ax < 0.0, self.ay < 0.0);
        for y in 0..vh {
            let sy = if mirror_y { vh - 1 - y } else { y };
            let src_row = &tile[sy * vw * c..(sy + 1) * vw * c];
            let at = ((v0 + y) * ow + u0) * c;
            let dst_row = &mut canvas[at..at + vw * c];
            if mirror_x {
                for (d, s) in dst_row
                    .chunks_exact_mut(c)
                    .zip(src_row.chunks_exact(c).rev())
                {
                    d.copy_from_slice(s);
                }
            } else {
                dst_row.copy_from_slice(src_row);
            }
        }
    }
}

/// Buffers of one rendering: the resampler's, the resampled visible part, the output canvas.
#[derive(Debug, Default)]
pub struct RenderScratch {
    resampler: Resampler,
    tile: Vec<u8>,
    /// The transformed image (H x W x C) before normalisation.
    pub canvas: Vec<u8>,
}

/// The output pixel range [k0, k1) whose centres map inside the source `0..src`, for
/// source = a * (k + 0.5) + b; None when empty.
fn visible(a: f64, b: f64, src: usize, out: usize) -> Option<(usize, usize)> {
    // Pixel k is visible when its centre maps into [0, src).
    let (lo, hi) = {
        let p = (0.0 - b) / a;
        let q = (src as f64 - b) / a;
        (p.min(q), p.max(q))
    };
    // k + 0.5 in [lo, hi).
    let k0 = (lo - 0.5).ceil().max(0.0);
    let k1 = ((hi - 0.5).ceil()).min(out as f64);
    (k1 > k0).then_some((k0 as usize, k1 as usize))
}

/// torchvision's `RandomResizedCrop.get_params`: (top, left, height, width) of the crop in a
/// `width x height` image.
fn rrc_params(
    width: usize,
    height: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut impl Rng,
) -> (usize, usize, usize, usize) {
    let area = (width * height) as f64;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * uniform(rng, scale.0, scale.1);
        let aspect = uniform(rng, lr0, lr1).exp();
        let w = (target * aspect).sqrt().round() as usize;
        let h = (target / aspect).sqrt().round() as usize;
        if 0 < w && w <= width && 0 < h && h <= height {
            let i = rng.gen_range(0..=height - h);
            let j = rng.gen_range(0..=width - w);
            return (i, j, h, w);
        }
    }
    // Fallback: the centre crop with the ratio clamped into range.
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio.0 {
        (
            width,
            ((width as f64 / ratio.0).round() as usize).clamp(1, height),
        )
    } else if in_ratio > ratio.1 {
        (
            ((height as f64 * ratio.1).round() as usize).clamp(1, width),
            height,
        )
    } else {
        (width, height)
    };
    ((height - h) / 2, (width - w) / 2, h, w)
}

fn uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> f64 {
    if hi > lo {
        rng.gen_range(lo..hi)
    } else {
        lo
    }
}

/// `canvas` (H x W x C) normalised into planes (C x H x W).
fn write_normalized(canvas: &[u8], c: usize, size: ImageSize, norm: &Normalize, out: &mut [f32]) {
    let plane = size.pixels();
    if c == 1 {
        norm.apply(&canvas[..plane], plane, &mut out[..plane]);
        return;
    }
    for ch in 0..c {
        let (a, b) = norm.channel(ch);
        let dst = &mut out[ch * plane..(ch + 1) * plane];
        for (d, px) in dst.iter_mut().zip(canvas.chunks_exact(c)) {
            *d = px[ch] as f32 * a + b;
        }
    }
}

/// `canvas` (H x W x C) into planes (C x H x W).
fn hwc_to_chw(canvas: &[u8], c: usize, size: ImageSize, out: &mut [u8]) {
    let plane = size.pixels();
    if c == 1 {
        out[..plane].copy_from_slice(&canvas[..plane]);
        return;
    }
    for (p, px) in canvas.chunks_exact(c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            out[ch * plane + p] = v;
        }
    }
}
