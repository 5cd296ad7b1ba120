//! Per-channel input normalisation, `(x / 255 - mean) / std`, as the model expects its input.

use crate::data::Dataset;

/// Per-channel normalisation `(x/255 - mean) / std`, folded into one multiply-add per pixel.
#[derive(Debug, Clone)]
pub struct Normalize {
    scale: Vec<f32>,
    shift: Vec<f32>,
    /// The mean and standard deviation given (recorded in checkpoints as they are).
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalize {
    /// From per-channel mean and standard deviation of pixel/255.
    pub fn new(mean: &[f32], std: &[f32]) -> Self {
        Self {
            scale: std.iter().map(|s| 1.0 / (255.0 * s)).collect(),
            shift: mean.iter().zip(std).map(|(m, s)| -m / s).collect(),
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }

    /// The per-channel mean of pixel/255 it was made from.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// The per-channel standard deviation of pixel/255 it was made from.
    pub fn std(&self) -> &[f32] {
        &self.std
    }

    /// For a dataset, with its own statistics.
    pub fn for_dataset(ds: &Dataset) -> Self {
        let (mean, std) = ds.mean_std();
        Self::new(&mean, &std)
    }

    /// `(scale, shift)` of channel `c`: a pixel `p` becomes `p * scale + shift`.
    pub fn channel(&self, c: usize) -> (f32, f32) {
        (self.scale[c], self.shift[c])
    }

    /// Normalises one image (C planes of `plane` pixels) into `out`.
    pub fn apply(&self, pixels: &[u8], plane: usize, out: &mut [f32]) {
        for (c, (src, dst)) in pixels.chunks(plane).zip(out.chunks_mut(plane)).enumerate() {
            let (a, b) = (self.scale[c], self.shift[c]);
            for (d, &p) in dst.iter_mut().zip(src) {
                *d = p as f32 * a + b;
            }
        }
    }
}
