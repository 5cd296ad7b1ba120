//! A dataset in memory: `u8` pixels (N×C×H×W) and one label per sample, a split of it, and
//! the pair of splits every run needs.

use crate::data::{idx, DataError};

/// Classes in MNIST, Fashion-MNIST, generic IDX sets and CIFAR-10.
pub const TEN_CLASSES: usize = 10;

/// Most classes a dataset (an ImageFolder, a packed file) may have: a label is one byte
/// (`u8`) in every dataset, batch and packed file.
pub const MAX_CLASSES: usize = 256;

/// One split of a dataset held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// Short name ("mnist", "fashion-mnist", "idx", "cifar10",
    /// "synthetic"); selects the normalisation constants.
    pub name: String,
    /// Channels per image (1 for greyscale, 3 for RGB).
    pub channels: usize,
    /// Image height in pixels.
    pub height: usize,
    /// Image width in pixels.
    pub width: usize,
    /// Number of classes; every label is below it.
    pub num_classes: usize,
    /// `len() * sample_len()` bytes, N×C×H×W row-major.
    pub pixels: Vec<u8>,
    /// One label per sample, each `< num_classes`.
    pub labels: Vec<u8>,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Bytes per sample: `channels * height * width`.
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Pixels of sample `i` in C×H×W order.
    ///
    /// # Panics
    /// If `i >= len()`; that is a caller bug, not bad input.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.sample_len();
        &self.pixels[i * n..(i + 1) * n]
    }

    /// Per-channel mean and standard deviation of pixel values scaled to
    /// [0, 1], for normalising inputs as `(x / 255 - mean) / std`.
    ///
    /// Well-known datasets use their published training-set constants so
    /// results match the literature; anything else is computed from this
    /// split. Normalise the test split with the *training* split's values
    /// (see [`DatasetPair::mean_std`]).
    pub fn mean_std(&self) -> (Vec<f32>, Vec<f32>) {
        let known: Option<(&[f32], &[f32])> = match self.name.as_str() {
            "mnist" => Some((&[0.1307], &[0.3081])),
            "fashion-mnist" => Some((&[0.2860], &[0.3530])),
            "cifar10" => Some((&[0.4914, 0.4822, 0.4465], &[0.2470, 0.2435, 0.2616])),
            _ => None,
        };
        match known {
            Some((m, s)) if m.len() == self.channels => (m.to_vec(), s.to_vec()),
            _ => self.computed_mean_std(),
        }
    }

    /// Per-channel mean and standard deviation measured from the pixels
    /// (scaled to [0, 1]). A channel with no spread gets std 1 so dividing
    /// by it stays finite.
    pub fn computed_mean_std(&self) -> (Vec<f32>, Vec<f32>) {
        let plane = self.height * self.width;
        let mut sum = vec![0u64; self.channels];
        let mut sq = vec![0u64; self.channels];
        if plane > 0 && self.channels > 0 {
            for sample in self.pixels.chunks_exact(self.sample_len()) {
                for (c, ch) in sample.chunks_exact(plane).enumerate() {
                    // u64 sums are exact: even 2^32 samples of 255^2 fit.
                    sum[c] += ch.iter().map(|&p| u64::from(p)).sum::<u64>();
                    sq[c] += ch.iter().map(|&p| u64::from(p) * u64::from(p)).sum::<u64>();
                }
            }
        }
        let n = (self.len() * plane) as f64;
        let mut means = Vec::with_capacity(self.channels);
        let mut stds = Vec::with_capacity(self.channels);
        for c in 0..self.channels {
            if n == 0.0 {
                means.push(0.0);
                stds.push(1.0);
                continue;
            }
            let m = sum[c] as f64 / n / 255.0;
            let var = (sq[c] as f64 / n / (255.0 * 255.0) - m * m).max(0.0);
            let s = var.sqrt();
            means.push(m as f32);
            stds.push(if s > 1e-6 { s as f32 } else { 1.0 });
        }
        (means, stds)
    }
}

/// Which half of a [`DatasetPair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training split.
    Train,
    /// The held-out evaluation split.
    Test,
}

/// Training and test splits of one dataset, loaded together because every
/// run needs both and they must agree in shape and classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetPair {
    /// Training split.
    pub train: Dataset,
    /// Test split.
    pub test: Dataset,
}

impl DatasetPair {
    /// The requested split.
    pub fn split(&self, split: Split) -> &Dataset {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// Normalisation constants of the training split, to be used for both
    /// splits so the test set sees the same transform as training.
    pub fn mean_std(&self) -> (Vec<f32>, Vec<f32>) {
        self.train.mean_std()
    }
}

impl Dataset {
    /// Wraps validated IDX images and labels (greyscale, one channel).
    pub(crate) fn from_idx(
        name: &str,
        images: idx::IdxImages,
        labels: Vec<u8>,
        num_classes: usize,
    ) -> Self {
        Dataset {
            name: name.to_string(),
            channels: 1,
            height: images.rows,
            width: images.cols,
            num_classes,
            pixels: images.pixels,
            labels,
        }
    }
}

/// Pairs two splits, rejecting ones whose image shapes differ since a model
/// built for one could not run on the other.
pub(crate) fn pair(train: Dataset, test: Dataset) -> Result<DatasetPair, DataError> {
    let shape = |d: &Dataset| (d.channels, d.height, d.width);
    if shape(&train) != shape(&test) {
        return Err(DataError::BadSpec {
            spec: train.name.clone(),
            reason: format!(
                "training images are {:?} (CxHxW) but test images are {:?}: the splits come from \
                 different datasets; re-download them",
                shape(&train),
                shape(&test)
            ),
        });
    }
    Ok(DatasetPair { train, test })
}

/// Runs two loads on two threads: decompressing the train and test files
/// concurrently roughly halves load time on a 2-core machine.
pub(crate) fn join<A, B>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B)
where
    A: Send,
    B: Send,
{
    std::thread::scope(|s| {
        let hb = s.spawn(b);
        let ra = a();
        let rb = match hb.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (ra, rb)
    })
}

/// Refuses to decode a whole split of `len` images of `[channels, height, width]` (named by
/// `path`) that the machine could not hold, before anything is allocated; `fix` says what to
/// change.
pub fn check_split_memory(
    path: &std::path::Path,
    len: usize,
    [channels, height, width]: [usize; 3],
    fix: &str,
) -> Result<(), DataError> {
    crate::limits::check_memory(
        &format!("decoding its {len} images at {channels}x{height}x{width}"),
        len as f64 * (channels * height * width) as f64,
        fix,
    )
    .map_err(|e| DataError::invalid(path, e))
}
