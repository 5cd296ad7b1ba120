//! Where training samples come from: a dataset held in memory, or an ImageFolder read and
//! decoded per sample. The loader only needs "pixels and label of sample i".

use crate::data::image_folder::{DecodeScratch, ImageFolder};
use crate::data::packed::{PackedScratch, PackedSplit};
use crate::data::{DataError, Dataset};
use std::sync::Arc;

use super::Normalize;

/// Images estimated from to normalise an ImageFolder (see [`ImageFolder::estimate_mean_std`]).
const NORM_PROBE: usize = 1000;

/// The training set as the pipeline sees it. Cloning shares the data.
#[derive(Debug, Clone)]
pub enum Source {
    /// Pixels already in memory: reading a sample is a slice.
    Memory(Arc<Dataset>),
    /// Files decoded on demand: reading a sample is a file read plus a PNG/JPEG decode.
    Folder(Arc<ImageFolder>),
    /// A packed file's split, memory-mapped: reading a sample is a slice of the mapping and a
    /// checksum, plus a JPEG decode for a JPEG sample.
    Packed(Arc<PackedSplit>),
}

/// Per-thread buffers that [`Source::read`] reuses.
#[derive(Debug, Default)]
pub struct SampleScratch {
    decode: DecodeScratch,
    packed: PackedScratch,
    pixels: Vec<u8>,
}

impl Source {
    /// Number of samples.
    pub fn len(&self) -> usize {
        match self {
            Source::Memory(d) => d.len(),
            Source::Folder(f) => f.len(),
            Source::Packed(p) => p.len(),
        }
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `[channels, height, width]`.
    pub fn shape(&self) -> [usize; 3] {
        match self {
            Source::Memory(d) => [d.channels, d.height, d.width],
            Source::Folder(f) => [f.channels, f.height, f.width],
            Source::Packed(p) => [p.channels, p.height, p.width],
        }
    }

    /// Bytes per sample.
    pub fn sample_len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        match self {
            Source::Memory(d) => d.num_classes,
            Source::Folder(f) => f.classes.len(),
            Source::Packed(p) => p.classes().len(),
        }
    }

    /// Label of sample `i`.
    pub fn label(&self, i: usize) -> u32 {
        match self {
            Source::Memory(d) => d.labels[i] as u32,
            Source::Folder(f) => f.labels[i] as u32,
            Source::Packed(p) => p.label(i) as u32,
        }
    }

    /// The normalisation for this training set: the dataset's constants in memory, an estimate
    /// from a spread of images for a folder.
    pub fn normalize(&self) -> Normalize {
        match self {
            Source::Memory(d) => Normalize::for_dataset(d),
            Source::Folder(f) => {
                let (m, s) = f.estimate_mean_std(NORM_PROBE);
                Normalize::new(&m, &s)
            }
            Source::Packed(p) => {
                let (m, s) = p.estimate_mean_std(NORM_PROBE);
                Normalize::new(&m, &s)
            }
        }
    }

    /// Keeps the first `n` samples (`--train-limit`). Shares nothing with other clones after.
    pub fn truncate(&mut self, n: usize) {
        match self {
            Source::Memory(d) => {
                let d = Arc::make_mut(d);
                let n = n.min(d.len());
                d.pixels.truncate(n * d.sample_len());
                d.labels.truncate(n);
            }
            Source::Folder(f) => Arc::make_mut(f).truncate(n),
            Source::Packed(p) => Arc::make_mut(p).truncate(n),
        }
    }

    /// Pixels of sample `i` (C×H×W): a slice of memory, or decoded into `scratch`. A folder's bad
    /// file gives an error naming it.
    pub fn read<'a>(
        &'a self,
        i: usize,
        scratch: &'a mut SampleScratch,
    ) -> Result<&'a [u8], DataError> {
        match self {
            Source::Memory(d) => Ok(d.image(i)),
            Source::Folder(f) => {
                scratch.pixels.resize(f.sample_len(), 0);
                f.read(i, &mut scratch.decode, &mut scratch.pixels)?;
                Ok(&scratch.pixels)
            }
            Source::Packed(p) => {
                scratch.pixels.resize(p.sample_len(), 0);
                p.read(i, &mut scratch.packed, &mut scratch.pixels)?;
                Ok(&scratch.pixels)
            }
        }
    }
}
