//! Where training samples come from: a dataset held in memory, or an ImageFolder read and
//! decoded per sample. The loader only needs "sample i, transformed, and its label". An
//! ImageFolder's test split and its normalisation estimate go through the evaluation
//! transforms here too.

use crate::data::image_folder::ImageFolder;
use crate::data::packed::PackedSplit;
use crate::data::{DataError, Dataset};
use crate::terminal::counted;
use std::sync::Arc;

use super::{Draw, ImageSize, Normalization, Normalize, TransformScratch, Transforms, Unreadable};

/// Images estimated from to normalise an ImageFolder (see [`estimate_normalization`]).
const NORM_PROBE: usize = 1000;

/// The training set as the pipeline sees it. Cloning shares the data.
#[derive(Debug, Clone)]
pub enum Source {
    /// Pixels already in memory: reading a sample is a slice.
    Memory(Arc<Dataset>),
    /// Files decoded on demand: reading a sample is a file read plus a PNG/JPEG decode.
    Folder(Arc<ImageFolder>),
    /// A packed file's split, memory-mapped: reading a sample is a slice of the mapping and a
    /// checksum, plus a JPEG decode for a JPEG sample (`pipeline/packed.rs`).
    Packed(Arc<PackedSplit>),
}

/// Per-thread buffers that [`Source::write_sample`] reuses.
#[derive(Debug, Default)]
pub struct SampleScratch {
    file: Vec<u8>,
    transform: TransformScratch,
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

    /// `[channels, height, width]` of the samples delivered (a folder's: the image size).
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
    /// from a spread of images for a folder (resized to its size as `off` does).
    pub fn normalize(&self) -> Normalize {
        self.normalization(&Transforms::OFF, false).0.to_normalize()
    }

    /// The normalisation `--normalize` asks for: the dataset's published constants (else
    /// computed from the split) in memory, or an estimate from up to 1000 images through
    /// `eval` for a folder or with `estimate`. Returns it, where it came from (for the run's
    /// start line) and the unreadable images it left out, if any.
    pub fn normalization(
        &self,
        eval: &Transforms,
        estimate: bool,
    ) -> (Normalization, String, Option<Unreadable>) {
        match self {
            Source::Memory(d) => {
                let (mean, std) = if estimate {
                    d.computed_mean_std()
                } else {
                    d.mean_std()
                };
                let how = if estimate || d.mean_std() == d.computed_mean_std() {
                    format!("estimated from the {}", counted(d.len(), "training image"))
                } else {
                    format!("{}'s published constants", d.name)
                };
                (Normalization { mean, std }, how, None)
            }
            Source::Folder(f) => estimate_normalization(f, eval, NORM_PROBE),
            Source::Packed(p) => {
                let (n, read, unreadable) =
                    super::packed::estimate_normalization(p, eval, NORM_PROBE);
                (n, estimated_through(read, eval), unreadable)
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

    /// Sample `i` of `epoch`, transformed by `transforms` with the draws of (seed, epoch, i)
    /// and normalised, into `out` (C×H×W at [`Source::shape`]). A folder's bad file gives an
    /// error naming it.
    #[allow(clippy::too_many_arguments)]
    pub fn write_sample(
        &self,
        i: usize,
        transforms: &Transforms,
        norm: &Normalize,
        draw: Draw,
        scratch: &mut SampleScratch,
        out: &mut [f32],
    ) -> Result<(), DataError> {
        let [c, h, w] = self.shape();
        let size = ImageSize {
            height: h,
            width: w,
        };
        match self {
            Source::Memory(d) => {
                transforms.apply_planar(
                    d.image(i),
                    [c, h, w],
                    size,
                    norm,
                    draw,
                    &mut scratch.transform,
                    out,
                );
                Ok(())
            }
            Source::Folder(f) => {
                let path = f.read_file(i, &mut scratch.file)?;
                transforms.apply_bytes(
                    &scratch.file,
                    path,
                    c,
                    size,
                    norm,
                    draw,
                    &mut scratch.transform,
                    out,
                )?;
                Ok(())
            }
            Source::Packed(p) => super::packed::write_sample(
                p,
                i,
                transforms,
                norm,
                draw,
                &mut scratch.transform,
                out,
            ),
        }
    }
}

/// How a normalisation was estimated from `images` training images, seen through the
/// evaluation transforms `eval` (said only when there are some).
fn estimated_through(images: usize, eval: &Transforms) -> String {
    let images = counted(images, "training image");
    if eval.is_off() {
        format!("estimated from {images}")
    } else {
        format!("estimated from {images} through {eval}")
    }
}

/// A run's test split as opened: a dataset read whole, or an image split with the evaluation
/// transforms it goes through, decoded only by [`TestSplit::decode`], once the caller has
/// checked that the run fits in memory (a run refused for its size decodes nothing: 40 test
/// images at 4096 x 4096 took 2 GB and seconds before the refusal).
#[derive(Debug)]
pub enum TestSplit {
    /// In memory already.
    Loaded(Dataset),
    /// An ImageFolder's test split.
    Folder {
        /// The split.
        split: ImageFolder,
        /// Its evaluation transforms.
        eval: Transforms,
    },
    /// A packed file's test split.
    Packed {
        /// The split.
        split: PackedSplit,
        /// Its evaluation transforms.
        eval: Transforms,
    },
}

impl TestSplit {
    /// Bytes its pixels take in memory, decoded.
    pub fn decoded_bytes(&self) -> usize {
        match self {
            Self::Loaded(d) => d.pixels.capacity(),
            Self::Folder { split, .. } => split.len() * split.sample_len(),
            Self::Packed { split, .. } => split.len() * split.sample_len(),
        }
    }

    /// The split in memory (an image split decoded through its evaluation transforms).
    pub fn decode(self) -> Result<Dataset, DataError> {
        match self {
            Self::Loaded(d) => Ok(d),
            Self::Folder { split, eval } => decode_split(&split, &eval, "imagefolder"),
            Self::Packed { split, eval } => super::decode_packed_split(&split, &eval, "packed"),
        }
    }
}

/// A folder split through the evaluation transforms `eval` into an in-memory [`Dataset`] at the
/// folder's size (an ImageFolder's test split, which every evaluation reads whole), checked
/// against the machine's memory before it is allocated.
pub fn decode_split(
    folder: &ImageFolder,
    eval: &Transforms,
    name: &str,
) -> Result<Dataset, DataError> {
    let n = folder.sample_len();
    crate::data::check_split_memory(
        &folder.root,
        folder.len(),
        [folder.channels, folder.height, folder.width],
        "use fewer test images (--test-limit) or a smaller --image-size",
    )?;
    let mut pixels = vec![0u8; folder.len() * n];
    let (mut file, mut scratch) = (Vec::new(), TransformScratch::default());
    let mut bad = Vec::new();
    for (i, out) in pixels.chunks_exact_mut(n.max(1)).enumerate() {
        // Every bad image named in one pass, not one per run.
        if let Err(e) = render_sample(folder, i, eval, &mut file, &mut scratch, out) {
            bad.push(e.to_string());
        }
    }
    if !bad.is_empty() {
        return Err(DataError::BadImages {
            dir: folder.root.clone(),
            errors: bad,
            remedy: "mend or remove them",
        });
    }
    Ok(Dataset {
        name: name.to_string(),
        channels: folder.channels,
        height: folder.height,
        width: folder.width,
        num_classes: folder.classes.len(),
        pixels,
        labels: folder.labels.clone(),
    })
}

/// Sample `i` of `folder` through `eval` at the folder's size, as bytes, into `out` (`file`
/// and `scratch` reused from sample to sample).
fn render_sample(
    folder: &ImageFolder,
    i: usize,
    eval: &Transforms,
    file: &mut Vec<u8>,
    scratch: &mut TransformScratch,
    out: &mut [u8],
) -> Result<(), DataError> {
    let size = ImageSize {
        height: folder.height,
        width: folder.width,
    };
    let path = folder.read_file(i, file)?;
    eval.apply_bytes_u8(file, path, folder.channels, size, Draw::NONE, scratch, out)?;
    Ok(())
}

/// Per-channel mean and deviation of pixel/255 over up to `max` images spread evenly over
/// `folder`, each through `eval` at the folder's size (decoding all would cost an epoch at
/// start). Files that fail to decode are left out; returns the estimate, how it was made, and
/// those files, if any (training stops at the first unless it skips bad samples).
pub fn estimate_normalization(
    folder: &ImageFolder,
    eval: &Transforms,
    max: usize,
) -> (Normalization, String, Option<Unreadable>) {
    let take = folder.len().min(max.max(1));
    let mut probe = Dataset {
        name: "estimate".into(),
        channels: folder.channels,
        height: folder.height,
        width: folder.width,
        num_classes: folder.classes.len(),
        pixels: Vec::with_capacity(take * folder.sample_len()),
        labels: Vec::with_capacity(take),
    };
    let (mut file, mut scratch) = (Vec::new(), TransformScratch::default());
    let mut buf = vec![0u8; folder.sample_len()];
    let (mut unreadable, mut failed) = (Unreadable::default(), Vec::new());
    for k in 0..take {
        let i = k * folder.len() / take;
        match render_sample(folder, i, eval, &mut file, &mut scratch, &mut buf) {
            Ok(()) => {
                probe.pixels.extend_from_slice(&buf);
                probe.labels.push(folder.labels[i]);
            }
            Err(e) => {
                unreadable.errors.push(e.to_string());
                failed.push(folder.labels[i]);
            }
        }
    }
    let (mean, std) = probe.computed_mean_std();
    let how = estimated_through(probe.labels.len(), eval);
    let labels = (probe.labels.as_slice(), failed.as_slice());
    let unreadable = unreadable.finish(labels, &folder.classes, take == folder.len());
    (Normalization { mean, std }, how, unreadable)
}
