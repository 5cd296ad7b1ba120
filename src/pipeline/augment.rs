//! Training-time augmentation: random crop with zero padding, horizontal flip, then the
//! normalisation, in one pass from `u8` pixels to the batch's `f32`s.
//!
//! The random choices for a sample are a hash of (seed, epoch, sample index) and nothing else:
//! no generator state is carried between samples, so which loader thread collates a batch, and
//! in what order, cannot change a single bit of it.

use super::Normalize;

/// Which augmentations to apply (`--augment`, e.g. `crop:4,flip`; `off` for none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Augment {
    /// Pad each side with this many zero pixels, then crop the original size at a random
    /// offset (torchvision's `RandomCrop(size, padding=pad)`); 0 for no crop.
    pub crop_pad: usize,
    /// Mirror left-right with probability 1/2.
    pub flip: bool,
}

/// Largest crop padding accepted: beyond it most crops are mostly padding.
pub const MAX_CROP_PAD: usize = 64;

impl Augment {
    /// No augmentation.
    pub const OFF: Augment = Augment {
        crop_pad: 0,
        flip: false,
    };

    /// Parses `off`/`none`, or a comma-separated list of `crop:P` and `flip`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let mut a = Augment::OFF;
        if matches!(s, "" | "off" | "none") {
            return Ok(a);
        }
        let usage = "write off, or a comma-separated list of crop:PAD and flip (e.g. crop:4,flip)";
        for part in s.split(',').map(str::trim) {
            match part.split_once(':') {
                None if part == "flip" => a.flip = true,
                Some(("crop", p)) => {
                    a.crop_pad = p
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad crop padding '{p}'; {usage}"))?;
                    if a.crop_pad == 0 || a.crop_pad > MAX_CROP_PAD {
                        return Err(format!(
                            "crop padding {} must be 1..={MAX_CROP_PAD}; {usage}",
                            a.crop_pad
                        ));
                    }
                }
                _ => return Err(format!("unknown augmentation '{part}'; {usage}")),
            }
        }
        Ok(a)
    }

    /// True when nothing is applied.
    pub fn is_off(&self) -> bool {
        *self == Augment::OFF
    }

    /// Writes the augmented, normalised sample `index` of `epoch` (`pixels`, C×H×W) to `out`.
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
        if self.is_off() {
            norm.apply(pixels, h * w, out);
            return;
        }
        let r = mix(mix(mix(seed) ^ epoch as u64) ^ index as u64);
        let p = self.crop_pad;
        let span = 2 * p as u64 + 1;
        // Offsets of the crop window in the padded image, 0..=2p; minus p gives the shift.
        let dy = (r % span) as isize - p as isize;
        let dx = ((r >> 20) % span) as isize - p as isize;
        let flip = self.flip && (r >> 63) == 1;
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
}

impl std::fmt::Display for Augment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.crop_pad, self.flip) {
            (0, false) => f.write_str("off"),
            (0, true) => f.write_str("flip"),
            (p, false) => write!(f, "crop:{p}"),
            (p, true) => write!(f, "crop:{p},flip"),
        }
    }
}

/// SplitMix64's finaliser: a cheap, well-mixed hash of one word.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!(Augment::parse("off").unwrap(), Augment::OFF);
        let a = Augment::parse("crop:4,flip").unwrap();
        assert_eq!((a.crop_pad, a.flip), (4, true));
        assert_eq!(a.to_string(), "crop:4,flip");
        assert!(Augment::parse("crop:x").unwrap_err().contains("bad crop"));
        assert!(Augment::parse("rotate").unwrap_err().contains("unknown"));
        assert!(Augment::parse("crop:0").is_err());
    }

    #[test]
    fn crop_and_flip_move_pixels_and_pad_with_zero() {
        // One 1x3x3 image 1..9; identity normalisation.
        let px: Vec<u8> = (1..=9).collect();
        let norm = Normalize::new(&[0.0], &[1.0 / 255.0]);
        let a = Augment::parse("crop:1,flip").unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            let mut out = [0f32; 9];
            a.apply(&px, [1, 3, 3], &norm, 7, 0, i, &mut out);
            // Every output is a source pixel or padding, and the same call is reproducible.
            assert!(out.iter().all(|&v| v == 0.0 || (1.0..=9.0).contains(&v)));
            let mut again = [0f32; 9];
            a.apply(&px, [1, 3, 3], &norm, 7, 0, i, &mut again);
            assert_eq!(out, again);
            seen.insert(out.map(|v| v as u8));
        }
        // 3x3 offsets x 2 flips = 18 distinct outputs, all reached.
        assert_eq!(seen.len(), 18);
    }
}
