//! A batch in the layout the model takes, and the collation that fills it.

use crate::data::Dataset;

/// One worker's batch: normalised f32 images (N, C, H, W) and labels, in buffers that are
/// refilled step after step.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Normalised pixels, N*C*H*W.
    pub images: Vec<f32>,
    /// Class labels, N.
    pub labels: Vec<u32>,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Per-channel normalisation `(x/255 - mean) / std`, folded into one multiply-add per pixel.
#[derive(Debug, Clone)]
pub struct Normalize {
    scale: Vec<f32>,
    shift: Vec<f32>,
}

impl Normalize {
    /// From per-channel mean and standard deviation of pixel/255.
    pub fn new(mean: &[f32], std: &[f32]) -> Self {
        Self {
            scale: std.iter().map(|s| 1.0 / (255.0 * s)).collect(),
            shift: mean.iter().zip(std).map(|(m, s)| -m / s).collect(),
        }
    }

    /// For a dataset, with its own statistics.
    pub fn for_dataset(ds: &Dataset) -> Self {
        let (mean, std) = ds.mean_std();
        Self::new(&mean, &std)
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

/// Fills `batch` with samples `indices` of `ds`, reusing its buffers.
pub fn collate(ds: &Dataset, indices: &[u32], norm: &Normalize, batch: &mut Batch) {
    let len = ds.sample_len();
    batch.images.resize(indices.len() * len, 0.0);
    batch.labels.clear();
    for (&i, out) in indices.iter().zip(batch.images.chunks_mut(len)) {
        norm.apply(ds.image(i as usize), ds.height * ds.width, out);
        batch.labels.push(ds.labels[i as usize] as u32);
    }
}
