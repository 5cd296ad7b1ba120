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
//! - `--normalize dataset`: published constants (mnist 0.1307/0.3081, fashion-mnist
//!   0.286/0.353, cifar10 0.4914,0.4822,0.4465/0.247,0.2435,0.2616), else estimated.

use super::PrepareError;
use crate::config::TrainConfig;
use crate::data::image_folder::ImageFolder;
use crate::data::Dataset;
use crate::pipeline::{ImageSize, NormalizeChoice, Source, Transforms};

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
pub fn size_folders(cfg: &TrainConfig, train: &mut ImageFolder, test: &mut ImageFolder) {
    if let Some(s) = cfg.image_size {
        train.set_size(s.height, s.width);
    }
    test.set_size(train.height, train.width);
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

/// Resolves the run's image size, evaluation transform (defaults filled in) and
/// normalisation into `cfg`, from the data; returns the line that says them, and a warning of
/// unreadable images the normalisation estimate met, if any.
pub fn resolve(cfg: &mut TrainConfig, source: &Source) -> (String, Option<String>) {
    let [c, h, w] = source.shape();
    let size = ImageSize {
        height: h,
        width: w,
    };
    let eval = eval_transform(cfg, source).resolved(size);
    let (norm, how, unreadable) = match &cfg.normalize {
        NormalizeChoice::Given(n) => (n.clone(), "given".to_string(), None),
        choice => source.normalization(&eval, *choice == NormalizeChoice::Estimate),
    };
    let line = format!(
        "input {c}x{h}x{w}, training transforms {}, evaluation transform {eval}, normalise \
         {norm} ({how})",
        training_transforms(cfg, source).resolved(size)
    );
    cfg.image_size = Some(size);
    cfg.eval_transform = Some(eval);
    cfg.normalize = NormalizeChoice::Given(norm);
    (line, unreadable)
}
