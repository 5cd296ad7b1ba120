//! The run's input, resolved from the options and the data: the image size, the evaluation
//! transform, the training transforms the loaders run and the normalisation (said in one line
//! at the start, and kept in the configuration the summary and checkpoints record).
//!
//! Defaults:
//! - `--image-size`: the dataset's (an ImageFolder's first image's). An in-memory dataset
//!   (MNIST, IDX, CIFAR-10, synthetic) trains at its own size only.
//! - `--eval-transform`: `resize-shorter,center-crop` (torchvision's rule) for an ImageFolder
//!   given `--image-size`; otherwise `off` (each image resized whole to the image size where
//!   it is not at it already: a folder of one size stays bit-identical to before).
//! - training on an ImageFolder with a list that does not resize (no `random-resized-crop`,
//!   `resize-shorter` or `resize`): the evaluation transform first, then the list.
//! - resuming (`--resume`) an ImageFolder or packed file: the checkpoint's input size and
//!   evaluation transform where `--image-size` / `--eval-transform` are left out, so the same
//!   command resumes at the size the run trained at, whatever the folder's first image is;
//!   resuming any data with `--normalize dataset` (the default): the checkpoint's
//!   normalisation, the one its run trained with.
//! - `--normalize dataset`: published constants (mnist 0.1307/0.3081, fashion-mnist
//!   0.286/0.353, cifar10 0.4914,0.4822,0.4465/0.247,0.2435,0.2616), else estimated.

use super::checkpoint::Checkpoint;
use super::{PrepareError, ResumeError};
use crate::config::TrainConfig;
use crate::data::image_folder::ImageFolder;
use crate::data::{Dataset, DatasetSpec};
use crate::pipeline::{ImageSize, Normalization, NormalizeChoice, Source, Transforms};
use std::path::Path;

/// The evaluation transform of a run on `source` (unresolved defaults kept).
pub fn eval_transform(cfg: &TrainConfig, source: &Source) -> Transforms {
    match (&cfg.eval_transform, source, cfg.image_size) {
        (Some(t), _, _) => t.clone(),
        (None, Source::Folder(_) | Source::Packed(_), Some(_)) => Transforms::eval_default(),
        _ => Transforms::OFF,
    }
}

/// The training transforms the loaders run on `source`: `--augment`, after the evaluation
/// transform when the images are a folder's and the list does not resize.
pub fn training_transforms(cfg: &TrainConfig, source: &Source) -> Transforms {
    let eval = eval_transform(cfg, source);
    match source {
        Source::Folder(_) | Source::Packed(_) if !cfg.augment.resizes() && !eval.is_off() => {
            cfg.augment.after(&eval)
        }
        _ => cfg.augment.clone(),
    }
}

/// Sets both splits of a folder to the run's image size (`--image-size`, else the training
/// split's first image's).
pub fn size_folders(
    cfg: &TrainConfig,
    train: &mut ImageFolder,
    test: &mut ImageFolder,
) -> Result<(), PrepareError> {
    match cfg.image_size {
        Some(s) => train.set_size(s.height, s.width),
        // The first image's size, unless it is past what --image-size may give (a camera's
        // photo): the model would be built for 8000x6000 inputs and refused for its size.
        None if train.height.max(train.width) > crate::pipeline::MAX_IMAGE_SIDE => {
            return Err(PrepareError::Config(format!(
                "{}: the input size defaults to the first training image's, {}x{} (WxH), \
                 past the {} pixels a side an input may have: give --image-size (e.g. 224)",
                train.root.display(),
                train.width,
                train.height,
                crate::pipeline::MAX_IMAGE_SIDE
            )))
        }
        None => {}
    }
    test.set_size(train.height, train.width);
    Ok(())
}

/// A warning where a folder's images differ in size, no `--image-size` was given (nor
/// followed from a checkpoint) and the evaluation transform is off: each image is then
/// stretched whole to the first image's size (for training too where `--augment` does not
/// resize), and the start line's "transforms off" would not say so.
fn stretched_warning(cfg: &TrainConfig, source: &Source, eval: &Transforms) -> Option<String> {
    let (None, Source::Folder(f), true) = (cfg.image_size, source, eval.is_off()) else {
        return None;
    };
    let (w, h) = f.other_size?;
    let used = match cfg.augment.resizes() {
        true => "for evaluation",
        false => "for training and evaluation",
    };
    Some(format!(
        "{}: the images are not all one size (the first is {}x{}, another {w}x{h}, WxH): \
         without --image-size each is stretched whole to the first's {}x{} {used}, its \
         aspect not kept; give --image-size (e.g. 224) to resize each image's shorter side \
         and crop its centre",
        f.root.display(),
        f.width,
        f.height,
        f.width,
        f.height
    ))
}

/// Whether the run's data is read at a size the run chooses (an ImageFolder or a packed
/// file): in-memory datasets train at their own.
pub fn resizable(cfg: &TrainConfig) -> bool {
    matches!(
        DatasetSpec::parse(&cfg.dataset, cfg.data_dir.as_deref(), Path::new("")),
        Ok(DatasetSpec::ImageFolder { .. } | DatasetSpec::Packed { .. })
    )
}

/// Fills in a resumed run's normalisation from its checkpoint unless `--normalize` asks for
/// an estimate or values, and its image size and evaluation transform where the options leave
/// them out, for an ImageFolder or packed file (an in-memory dataset has one size); returns
/// the note that says which of the last two were taken, if any (the input line says the
/// normalisation's origin). Without it, a folder resumed
/// without the `--image-size` its run was given would default to its first image's size and be
/// refused as other input, or decode that first image whole before being refused.
pub fn follow_checkpoint(
    cfg: &mut TrainConfig,
    ck: &Checkpoint,
    path: &Path,
) -> Result<Option<String>, ResumeError> {
    let Some(d) = &ck.description else {
        return Ok(None);
    };
    // The run's own normalisation (the input line says whose).
    if cfg.normalize == NormalizeChoice::Dataset {
        cfg.normalize = NormalizeChoice::Resumed(Normalization {
            mean: d.mean.clone(),
            std: d.std.clone(),
        });
    }
    if !resizable(cfg) || (cfg.image_size.is_some() && cfg.eval_transform.is_some()) {
        return Ok(None);
    }
    let mut taken = Vec::new();
    if cfg.image_size.is_none() {
        cfg.image_size = Some(d.image_size());
        taken.push(format!("image size {}", d.image_size()));
    }
    if cfg.eval_transform.is_none() {
        let eval = d.eval_transforms(path)?;
        taken.push(format!("evaluation transform {eval}"));
        cfg.eval_transform = Some(eval);
    }
    Ok(Some(format!(
        "resuming at the checkpoint's {} ({})",
        taken.join(" and "),
        path.display()
    )))
}

/// Refuses an `--image-size` other than an in-memory dataset's own.
pub fn check_memory_size(cfg: &TrainConfig, train: &Dataset) -> Result<(), PrepareError> {
    match cfg.image_size {
        Some(s) if (s.height, s.width) != (train.height, train.width) => {
            Err(PrepareError::Config(format!(
                "--image-size {s}: {} images are {}x{} and in-memory datasets train at their own \
                 size; leave --image-size out, or export the dataset as an ImageFolder \
                 (`dptrain data export-images`) to train it at another size",
                train.name, train.height, train.width
            )))
        }
        _ => Ok(()),
    }
}

/// Refuses a given `--normalize` of other channels than `source`'s images (before the model is
/// built: it is the options' mistake). A resumed checkpoint's normalisation of other channels
/// is other input, which the checkpoint's check refuses naming both shapes.
pub fn check_normalization_channels(
    cfg: &TrainConfig,
    source: &Source,
) -> Result<(), PrepareError> {
    let NormalizeChoice::Given(norm) = &cfg.normalize else {
        return Ok(());
    };
    let c = source.shape()[0];
    if norm.channels() == c {
        return Ok(());
    }
    Err(PrepareError::Config(format!(
        "--normalize {norm}: {} for images of {}; give one mean and one standard deviation per \
         channel",
        crate::terminal::counted(norm.channels(), "channel"),
        crate::terminal::counted(c, "channel")
    )))
}

/// Resolves the run's image size, evaluation transform (defaults filled in) and
/// normalisation into `cfg`, from the data; returns the line that says them, and the warnings:
/// unreadable images the normalisation estimate met (skipped under `--skip-bad-samples`,
/// else refused), a packed file whose every image is enlarged.
pub fn resolve(
    cfg: &mut TrainConfig,
    source: &Source,
) -> Result<(String, Vec<String>), PrepareError> {
    let [c, h, w] = source.shape();
    let size = ImageSize {
        height: h,
        width: w,
    };
    let eval = eval_transform(cfg, source).resolved(size);
    let (norm, how, unreadable) = match &cfg.normalize {
        NormalizeChoice::Given(n) => (n.clone(), "given".to_string(), None),
        NormalizeChoice::Resumed(n) => (n.clone(), "the checkpoint's".to_string(), None),
        choice => source.normalization(&eval, *choice == NormalizeChoice::Estimate),
    };
    let mut warnings = Vec::new();
    match unreadable {
        // Skipping would leave a class with nothing to learn it from (as `data pack` refuses).
        Some(u) if cfg.skip_bad_samples && !u.lost_classes.is_empty() => {
            return Err(PrepareError::UnreadableClass(u))
        }
        Some(u) if cfg.skip_bad_samples => warnings.push(u.warning()),
        Some(u) => return Err(PrepareError::UnreadableTraining(u)),
        None => {}
    }
    if let Source::Packed(split) = source {
        warnings.extend(split.enlarged_warning());
    }
    warnings.extend(stretched_warning(cfg, source, &eval));
    let line = format!(
        "input {c}x{h}x{w}, training transforms {}, evaluation transform {eval}, normalise \
         {norm} ({how})",
        training_transforms(cfg, source).resolved(size)
    );
    cfg.image_size = Some(size);
    cfg.eval_transform = Some(eval);
    cfg.normalize = NormalizeChoice::Given(norm);
    Ok((line, warnings))
}
