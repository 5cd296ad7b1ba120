//! The one error type of the data module.
//!
//! Every message names the file (or spec) at fault, says what is wrong with
//! it, and ends with what the user can do about it, because these errors are
//! printed straight to someone starting a training run who has no debugger.

use std::io;
use std::path::PathBuf;

/// Dataset names that [`crate::data::DatasetSpec::parse`] accepts, listed in
/// errors so a typo is fixable without reading the source.
pub const VALID_NAMES: &str = "mnist, fashion-mnist, idx:<dir> (or idx with a path), \
     cifar10 (or cifar10:<dir>), imagefolder (or imagefolder:<dir>), packed:<file>, synthetic, synthetic:<C>x<H>x<W>[:<classes>]";

/// Why a dataset could not be loaded or generated.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file exists (or should) but reading it failed at the OS level.
    ///
    /// The cause is part of the message rather than a `#[source]` so a plain
    /// `{}` print already tells the whole story.
    #[error("{}: cannot read: {cause}; check that it exists and is readable", path.display())]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The OS error.
        cause: io::Error,
    },

    /// A file a user named is not a regular file of its kind's size ([`crate::input`]'s
    /// refusal, which names the path and what it is).
    #[error(transparent)]
    Input(crate::input::InputError),

    /// Writing a file (a dataset writer, `data export-images`) failed: the output rules of
    /// [`crate::output`] refused the path, or the OS refused the write.
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),

    /// An image file that cannot be decoded (not an image, truncated, CMYK, too small or too
    /// large); the error names the file.
    #[error(transparent)]
    Image(#[from] crate::data::decode::DecodeError),

    /// A required file or directory is absent.
    #[error("{}: not found; {hint}", path.display())]
    NotFound {
        /// The path that was looked for.
        path: PathBuf,
        /// What to do about it (where to get the file, which option to pass).
        hint: String,
    },

    /// A file was read but its contents are not what the format requires
    /// (bad magic, truncated, trailing bytes, label out of range, ...).
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The offending file.
        path: PathBuf,
        /// What is wrong and what to do, as one sentence.
        reason: String,
    },

    /// A file's SHA-256 does not match the digest recorded in `SHA256SUMS`.
    #[error(
        "{}: SHA-256 mismatch: expected {expected}, got {actual}; {hint}",
        path.display()
    )]
    Checksum {
        /// The file whose digest is wrong.
        path: PathBuf,
        /// Digest recorded in `SHA256SUMS` (lower-case hex).
        expected: String,
        /// Digest of the bytes on disk (lower-case hex).
        actual: String,
        /// What to do: re-clone, `git lfs pull`, ...
        hint: String,
    },

    /// A sample of a packed dataset file (`dptrain data pack`) is damaged: its bytes fail
    /// their checksum or do not decode.
    #[error(
        "packed file {} is corrupt: sample {index} ({split}, class '{class}') {reason}; re-pack \
         it (dptrain data pack)",
        path.display()
    )]
    PackedSample {
        /// The packed file.
        path: PathBuf,
        /// "train" or "test".
        split: &'static str,
        /// The sample's index in its split of the file.
        index: usize,
        /// The sample's class name.
        class: String,
        /// What is wrong ("fails its checksum", "does not decode: ...").
        reason: String,
    },

    /// The dataset name is not one this module knows.
    #[error("unknown dataset {name:?}; valid names: {VALID_NAMES}")]
    UnknownDataset {
        /// The name as given.
        name: String,
    },

    /// An export's training split lacks an image of some classes: an ImageFolder made of it
    /// could not be trained on (its reader refuses a class directory without images).
    #[error(
        "the export's training split ({images} images) has no image of class {} (of {classes}): \
         training on an ImageFolder needs an image of every class; export more images (a \
         larger --limit)",
        missing.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
    )]
    ClassesMissing {
        /// Images in the training split.
        images: usize,
        /// The classes without an image.
        missing: Vec<usize>,
        /// Classes of the dataset.
        classes: usize,
    },
    /// An option of `data pack` out of its range.
    #[error("data pack: {0}")]
    PackOption(String),
    /// Images of an ImageFolder that cannot be read or decoded (`data pack`, a split decoded
    /// whole): every one, so that one pass names them all (each entry an error naming its file).
    #[error(
        "{} in {} cannot be read or decoded; {remedy}:{}",
        crate::terminal::counted(errors.len(), "image"),
        dir.display(),
        listed(errors)
    )]
    BadImages {
        /// The ImageFolder, or its split.
        dir: PathBuf,
        /// Why each could not be read or decoded.
        errors: Vec<String>,
        /// What to do about them.
        remedy: &'static str,
    },
    /// The dataset name is known but its arguments are unusable
    /// (missing directory, bad shape, conflicting path, ...).
    #[error("dataset {spec:?}: {reason}")]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
}

/// Most entries [`listed`] shows.
const LISTED: usize = 20;

/// `items` one per indented line, the first `LISTED` (20), then how many more.
pub fn listed(items: &[String]) -> String {
    let mut out: String = items
        .iter()
        .take(LISTED)
        .map(|i| format!("\n  {i}"))
        .collect();
    if items.len() > LISTED {
        out.push_str(&format!("\n  ... and {} more", items.len() - LISTED));
    }
    out
}

impl DataError {
    /// Shorthand for [`DataError::Invalid`], which is built in many places.
    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        DataError::Invalid {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Maps [`crate::input`]'s refusal, turning "not found" into [`DataError::NotFound`] with
    /// `hint` so the user learns where to get the file.
    pub(crate) fn from_input(e: crate::input::InputError, hint: &str) -> Self {
        match e {
            crate::input::InputError::NotFound { path, .. } => DataError::NotFound {
                path,
                hint: hint.to_string(),
            },
            e => DataError::Input(e),
        }
    }

    /// Maps an error from opening/reading `path`, turning "not found" into
    /// [`DataError::NotFound`] with `hint` so the user learns where to get it.
    pub(crate) fn from_io(path: impl Into<PathBuf>, cause: io::Error, hint: &str) -> Self {
        let path = path.into();
        if cause.kind() == io::ErrorKind::NotFound {
            DataError::NotFound {
                path,
                hint: hint.to_string(),
            }
        } else {
            DataError::Io { path, cause }
        }
    }
}
