//! `dptrain predict`: the most likely classes of image files, with their names and
//! probabilities, in batches through the checkpoint's evaluation transforms and normalisation.
//!
//! A file that cannot be read or decoded, or whose outputs are not numbers, is a per-file
//! error naming it; the other files are still predicted (a folder of thousands of photos
//! should not stop at the first odd one), and the caller reports the failures and exits
//! non-zero at the end.

use super::{softmax, top_k, InferError, TrainedModel};
use crate::data::decode::{unread_formats, ListedFile};
use crate::data::DataError;
use crate::nn::{Mode, Net};
use crate::pipeline::{Draw, ImageSize, Normalize, TransformScratch, Transforms};
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One class of a prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassProbability {
    /// The class name.
    pub class: String,
    /// Its label (index in the checkpoint's classes).
    pub label: usize,
    /// Softmax probability.
    pub probability: f32,
}

/// The top classes of one image, most likely first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// The image file.
    #[serde(serialize_with = "crate::output::path_as_text")]
    pub file: PathBuf,
    /// The `k` most likely classes.
    pub top: Vec<ClassProbability>,
}

/// Why one file has no prediction.
#[derive(Debug, thiserror::Error)]
pub enum PredictFailure {
    /// It could not be read or decoded.
    #[error(transparent)]
    Read(#[from] DataError),
    /// The model's outputs for it are not numbers ([`crate::backend::predicts`]): the
    /// caller says why once ([`super::NO_PREDICTION_CAUSE`]), not once per image.
    #[error(
        "{}: the model's outputs for it are not numbers (NaN or infinite): no class predicted",
        file.display()
    )]
    NoPrediction {
        /// The image file.
        file: PathBuf,
    },
}

/// The image files named by `paths`: a file as given (whatever its extension, so a non-image
/// is reported, not skipped), a directory walked recursively for `.png`/`.jpg`/`.jpeg` files in
/// name order. A path that does not exist, or a directory without images, is an error before
/// any work. Returns the files and whether any came from a directory (a progress bar is worth
/// drawing).
pub fn collect_images(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, bool), InferError> {
    let mut files = Vec::new();
    let mut walked = false;
    for p in paths {
        if p.is_dir() {
            walked = true;
            let before = files.len();
            let mut unread = Vec::new();
            walk_from(p, (&mut files, &mut unread), &mut Vec::new())?;
            let left_out = unread_formats(&unread);
            if files.len() == before {
                return Err(InferError::Options(format!(
                    "{}: no .png, .jpg or .jpeg files in this directory or below{}",
                    p.display(),
                    left_out.map(|w| format!(" ({w})")).unwrap_or_default()
                )));
            }
            if let Some(w) = left_out {
                crate::terminal::print_warning(&format!("{}: {w}", p.display()));
            }
        } else if p.exists() {
            files.push(p.clone());
        } else {
            // A link that leads nowhere is named as one, not as a missing file; any other
            // cause (a loop in a directory on the way, no permission) as the system says it.
            let cause = |e: std::io::Error| match e.kind() {
                std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
                _ if e.raw_os_error() == Some(libc::ELOOP) => "a link loop".to_string(),
                _ => e.to_string(),
            };
            let what = match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(p) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        "a link to nothing (its target does not exist)".to_string()
                    }
                    Err(e) => cause(e),
                    Ok(_) => "not readable".to_string(),
                },
                Ok(_) => "not readable".to_string(),
                Err(e) => cause(e),
            };
            return Err(InferError::Options(format!("{}: {what}", p.display())));
        }
    }
    Ok((files, walked))
}

/// Adds the images under `dir` to `out.0`, in name order, subdirectories in place, and the
/// images of formats not read to `out.1`; with the directories entered so far (device and
/// inode): a directory reached again
/// through a link (a link loop, or a second link to it) is skipped with a warning instead of
/// being walked again, so a loop cannot make the walk endless. An entry with an image's name
/// that is not a regular file (a fifo, a device) is skipped with a warning, since reading it
/// could block.
fn walk_from(
    dir: &Path,
    out: (&mut Vec<PathBuf>, &mut Vec<PathBuf>),
    entered: &mut Vec<(u64, u64)>,
) -> Result<(), InferError> {
    let (images, unread) = out;
    use std::os::unix::fs::MetadataExt;
    let io = |e: std::io::Error| {
        InferError::Data(DataError::Io {
            path: dir.to_path_buf(),
            cause: e,
        })
    };
    let meta = std::fs::metadata(dir).map_err(io)?;
    if entered.contains(&(meta.dev(), meta.ino())) {
        crate::terminal::print_warning(&format!(
            "{}: skipped, a directory already walked (through a link)",
            dir.display()
        ));
        return Ok(());
    }
    entered.push((meta.dev(), meta.ino()));
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for p in entries {
        let listed = ListedFile::of(&p);
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => walk_from(&p, (&mut *images, &mut *unread), entered)?,
            Ok(m) if m.is_file() && listed == ListedFile::Image => images.push(p),
            Ok(m) if m.is_file() && listed == ListedFile::UnreadFormat => unread.push(p),
            Ok(m) if m.is_file() => {}
            _ if listed == ListedFile::Image => crate::terminal::print_warning(&format!(
                "{}: skipped, not a regular file (a fifo, a device, a dangling link or a link \
                 loop)",
                p.display()
            )),
            _ => {}
        }
    }
    Ok(())
}

/// Predicts batches of images with one net.
pub struct Predictor<'a> {
    model: &'a TrainedModel,
    net: Net,
    norm: Normalize,
    /// The checkpoint's evaluation transforms.
    eval: Transforms,
    /// The collated batch (NCHW floats) and dummy labels for the loss.
    images: Vec<f32>,
    labels: Vec<u32>,
    probs: Vec<f32>,
}

impl<'a> Predictor<'a> {
    /// A predictor for batches of up to `batch` images.
    pub fn new(model: &'a TrainedModel, batch: usize) -> Result<Self, InferError> {
        if batch == 0 {
            return Err(InferError::Options("--batch must be at least 1".into()));
        }
        super::check_memory(model, batch, (1, None), crate::limits::cores())?;
        super::image_channels(model)?;
        Ok(Self {
            model,
            net: model.net(batch)?,
            norm: model.normalize(),
            eval: model.description.eval_transforms(&model.path)?,
            images: Vec::new(),
            labels: vec![0; batch],
            probs: Vec::new(),
        })
    }

    /// The largest batch.
    pub fn batch(&self) -> usize {
        self.net.max_batch()
    }

    /// Predicts `files` (at most [`Predictor::batch`]): each file's top `k` classes, or why
    /// it has none (it could not be read, or the model's outputs for it are not numbers), in
    /// order. The files are decoded in parallel.
    pub fn predict(
        &mut self,
        files: &[PathBuf],
        k: usize,
    ) -> Vec<Result<Prediction, PredictFailure>> {
        assert!(files.len() <= self.batch(), "more files than the batch");
        let [c, h, w] = self.model.description.input;
        let plane = c * h * w;
        let size = self.model.description.image_size();
        let eval = &self.eval;
        let decoded: Vec<Result<Vec<u8>, DataError>> = files
            .par_iter()
            .map_init(TransformScratch::default, |scratch, f| {
                decode(f, c, size, eval, scratch)
            })
            .collect();
        let good: Vec<usize> = (0..files.len()).filter(|&i| decoded[i].is_ok()).collect();
        let mut out: Vec<Option<Result<Prediction, PredictFailure>>> = Vec::new();
        out.resize_with(files.len(), || None);
        if !good.is_empty() {
            self.images.resize(good.len() * plane, 0.0);
            for (slot, &i) in good.iter().enumerate() {
                let pixels = decoded[i].as_ref().expect("decoded");
                let dst = &mut self.images[slot * plane..(slot + 1) * plane];
                self.norm.apply(pixels, h * w, dst);
            }
            let n = good.len();
            self.net.forward(&self.images, &self.labels, n, Mode::Eval);
            let classes = self.model.class_names();
            let logits = self.net.logits().to_vec();
            for (row, &i) in logits.chunks_exact(classes.len()).zip(&good) {
                if !crate::backend::predicts(row) {
                    out[i] = Some(Err(PredictFailure::NoPrediction {
                        file: files[i].clone(),
                    }));
                    continue;
                }
                softmax(row, &mut self.probs);
                // Ranked by logit, as eval ranks (two logits a few ulps apart may round to
                // one probability); each class with its probability.
                let top = top_k(row, k.min(classes.len()))
                    .into_iter()
                    .map(|(label, _)| ClassProbability {
                        class: classes[label].clone(),
                        label,
                        probability: self.probs[label],
                    })
                    .collect();
                out[i] = Some(Ok(Prediction {
                    file: files[i].clone(),
                    top,
                }));
            }
        }
        for (i, d) in decoded.into_iter().enumerate() {
            if let Err(e) = d {
                out[i] = Some(Err(e.into()));
            }
        }
        out.into_iter()
            .map(|r| r.expect("every file answered"))
            .collect()
    }
}

/// One image read and put through the evaluation transforms to the model's input (C x H x W
/// bytes), as eval reads an ImageFolder's split (`pipeline::decode_split`), so both give the
/// model the same pixels.
fn decode(
    file: &Path,
    channels: usize,
    size: ImageSize,
    eval: &Transforms,
    scratch: &mut TransformScratch,
) -> Result<Vec<u8>, DataError> {
    // A fifo or a device is refused by type, a file over the image cap by its length, before
    // a byte is read; a file larger than any image dptrain decodes is refused after.
    let bytes =
        crate::input::read_bytes(file, crate::input::FileKind::Image).map_err(DataError::Input)?;
    if bytes.len() as u64 > crate::data::decode::MAX_DECODE_BYTES {
        return Err(DataError::invalid(
            file,
            format!(
                "is {} bytes, more than any image dptrain decodes ({} bytes)",
                bytes.len(),
                crate::data::decode::MAX_DECODE_BYTES
            ),
        ));
    }
    let mut pixels = vec![0u8; channels * size.pixels()];
    eval.apply_bytes_u8(
        &bytes,
        file,
        channels,
        size,
        Draw::NONE,
        scratch,
        &mut pixels,
    )?;
    Ok(pixels)
}
