//! What to load ([`DatasetSpec`], from a command-line name) and the one loader that turns it
//! into both splits ([`load`]).

use crate::data::{
    cifar, idx, image_folder, join, mnist, packed, pair, synthetic, DataError, Dataset,
    DatasetPair, TEN_CLASSES,
};
use std::path::{Path, PathBuf};

/// Where the Debian package `dataset-fashion-mnist` installs its four
/// gzipped IDX files; the default directory for `fashion-mnist`.
pub const FASHION_MNIST_DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Where the MNIST bundled with dptrain is read from: `data/mnist` of the working directory
/// when it holds the bundled copy (a checkout's root), else the checkout dptrain was built
/// from. Every command that reads the bundled MNIST (train, eval, a checkpoint's record of its
/// data) asks here, so a run started outside the checkout and its evaluation find the same
/// files.
pub fn bundled_mnist_dir() -> PathBuf {
    let here = Path::new("data/mnist");
    if here.join("SHA256SUMS").is_file() {
        here.to_path_buf()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist")
    }
}

/// What to load; built by [`DatasetSpec::parse`] or directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetSpec {
    /// MNIST from a directory holding the four gzipped IDX files and a
    /// `SHA256SUMS` that each is verified against.
    Mnist {
        /// Directory with the files.
        dir: PathBuf,
        /// The copy bundled with dptrain (`data/mnist`), not a directory the user gave: decides
        /// what a failed check tells them (restore the checkout, or check their own files).
        bundled: bool,
    },
    /// Fashion-MNIST (unverified IDX files, raw or gzipped).
    FashionMnist {
        /// Directory with the files.
        dir: PathBuf,
    },
    /// Any 10-class IDX dataset laid out like MNIST (unverified).
    Idx {
        /// Directory with `train-images-idx3-ubyte` etc. (`.gz` optional).
        dir: PathBuf,
    },
    /// CIFAR-10 binary version.
    Cifar10 {
        /// Directory with `data_batch_1.bin`..`data_batch_5.bin` and
        /// `test_batch.bin`.
        dir: PathBuf,
    },
    /// Class-per-directory PNG/JPEG files under `dir/train` and `dir/test`.
    ImageFolder {
        /// Directory holding `train/` and `test/`.
        dir: PathBuf,
    },
    /// One file of `dptrain data pack`, memory-mapped (see [`packed`]).
    Packed {
        /// The packed file.
        file: PathBuf,
    },
    /// Generated data; see [`synthetic::generate`].
    Synthetic {
        /// Training samples.
        train: usize,
        /// Test samples.
        test: usize,
        /// Channels per image.
        channels: usize,
        /// Image height.
        height: usize,
        /// Image width.
        width: usize,
        /// Number of classes (1..=256, since labels are `u8`).
        classes: usize,
        /// Seed; equal seeds give identical bytes.
        seed: u64,
    },
}

/// Synthetic training-set size when none is given: MNIST's, so timings
/// compare with the real thing.
pub const SYNTHETIC_DEFAULT_TRAIN: usize = 60_000;
/// Synthetic test-set size when none is given (MNIST's).
pub const SYNTHETIC_DEFAULT_TEST: usize = 10_000;
/// Synthetic seed when none is given.
pub const SYNTHETIC_DEFAULT_SEED: u64 = 0;

impl DatasetSpec {
    /// This spec with a synthetic set's splits cut to at most `train` and `test` samples:
    /// the same bytes as the first samples of the whole set (each split is one sequential
    /// stream), without generating the rest. Other datasets are files, read as they are.
    pub fn generating_at_most(mut self, train: Option<usize>, test: Option<usize>) -> Self {
        if let DatasetSpec::Synthetic {
            train: t, test: e, ..
        } = &mut self
        {
            *t = train.map_or(*t, |n| n.min(*t));
            *e = test.map_or(*e, |n| n.min(*e));
        }
        self
    }

    /// The directory or file the data is read from; none for generated data.
    pub fn location(&self) -> Option<&Path> {
        match self {
            DatasetSpec::Mnist { dir, .. }
            | DatasetSpec::FashionMnist { dir }
            | DatasetSpec::Idx { dir }
            | DatasetSpec::Cifar10 { dir }
            | DatasetSpec::ImageFolder { dir } => Some(dir),
            DatasetSpec::Packed { file } => Some(file),
            DatasetSpec::Synthetic { .. } => None,
        }
    }

    /// Turns a command-line dataset name (and optional directory) into a
    /// spec.
    ///
    /// Names: `mnist` (defaults to `bundled_mnist_dir`), `fashion-mnist`
    /// (defaults to [`FASHION_MNIST_DEFAULT_DIR`]), `idx:<dir>` or `idx`
    /// with `path`, `cifar10:<dir>` or `cifar10` with `path`, `synthetic`
    /// (60000/10000 samples of 1x28x28, 10 classes) and
    /// `synthetic:<C>x<H>x<W>[:<classes>]`. Directories embedded in the name
    /// and `path` are mutually exclusive so neither silently wins.
    pub fn parse(
        name: &str,
        path: Option<&Path>,
        bundled_mnist_dir: &Path,
    ) -> Result<Self, DataError> {
        let spec = name.trim();
        let (head, arg) = match spec.split_once(':') {
            Some((h, a)) => (h, Some(a)),
            None => (spec, None),
        };
        let head = head.to_ascii_lowercase();
        let bad = |reason: String| DataError::BadSpec {
            spec: spec.to_string(),
            reason,
        };
        // Directory from "name:<dir>" or from `path`, not both.
        let dir_of = |arg: Option<&str>| -> Result<Option<PathBuf>, DataError> {
            match (arg, path) {
                (Some(a), Some(p)) => Err(bad(format!(
                    "directory given twice ({a} in the name and {} as a path); give one",
                    p.display()
                ))),
                (Some(""), None) => Err(bad("empty directory after ':'".to_string())),
                (Some(a), None) => Ok(Some(PathBuf::from(a))),
                (None, p) => Ok(p.map(Path::to_path_buf)),
            }
        };
        match head.as_str() {
            "mnist" => Ok(match dir_of(arg)? {
                Some(dir) => DatasetSpec::Mnist {
                    dir,
                    bundled: false,
                },
                None => DatasetSpec::Mnist {
                    dir: bundled_mnist_dir.to_path_buf(),
                    bundled: true,
                },
            }),
            "fashion-mnist" | "fashion_mnist" | "fashionmnist" => Ok(DatasetSpec::FashionMnist {
                dir: dir_of(arg)?.unwrap_or_else(|| PathBuf::from(FASHION_MNIST_DEFAULT_DIR)),
            }),
            "idx" => match dir_of(arg)? {
                Some(dir) => Ok(DatasetSpec::Idx { dir }),
                None => Err(bad(
                    "needs a directory: write idx:<dir> or pass the directory as the data path"
                        .to_string(),
                )),
            },
            "cifar10" | "cifar-10" => match dir_of(arg)? {
                Some(dir) => Ok(DatasetSpec::Cifar10 { dir }),
                None => Err(bad(
                    "needs the directory holding data_batch_1.bin..data_batch_5.bin and \
                     test_batch.bin: write cifar10:<dir> or pass it as the data path"
                        .to_string(),
                )),
            },
            "imagefolder" | "image-folder" => match dir_of(arg)? {
                Some(dir) => Ok(DatasetSpec::ImageFolder { dir }),
                None => Err(bad(
                    "needs the directory holding train/ and test/ (one subdirectory per class): \
                     write imagefolder:<dir> or pass it with --data-dir"
                        .to_string(),
                )),
            },
            "packed" => match dir_of(arg)? {
                Some(file) => Ok(DatasetSpec::Packed { file }),
                None => Err(bad(
                    "needs the file `dptrain data pack` wrote: write packed:<file> or pass it \
                     with --data-dir"
                        .to_string(),
                )),
            },
            "synthetic" => {
                if let Some(p) = path {
                    return Err(bad(format!(
                        "synthetic data is generated, not read; drop the path {}",
                        p.display()
                    )));
                }
                let (shape, classes) = match arg {
                    None => ((1, 28, 28), TEN_CLASSES),
                    Some(a) => parse_synthetic_arg(a).map_err(bad)?,
                };
                Ok(DatasetSpec::Synthetic {
                    train: SYNTHETIC_DEFAULT_TRAIN,
                    test: SYNTHETIC_DEFAULT_TEST,
                    channels: shape.0,
                    height: shape.1,
                    width: shape.2,
                    classes,
                    seed: SYNTHETIC_DEFAULT_SEED,
                })
            }
            _ => Err(DataError::UnknownDataset {
                name: spec.to_string(),
            }),
        }
    }
}

/// Parses `<C>x<H>x<W>[:<classes>]`; errors are reasons for [`DataError::BadSpec`].
fn parse_synthetic_arg(arg: &str) -> Result<((usize, usize, usize), usize), String> {
    let usage = "expected synthetic:<C>x<H>x<W>[:<classes>], e.g. synthetic:3x32x32 or \
                 synthetic:1x28x28:10";
    let (shape, classes) = match arg.split_once(':') {
        Some((s, c)) => (s, Some(c)),
        None => (arg, None),
    };
    let dims: Vec<usize> = shape
        .split(['x', 'X'])
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("bad shape {shape:?}; {usage}"))?;
    let &[c, h, w] = dims.as_slice() else {
        return Err(format!("shape {shape:?} needs three numbers; {usage}"));
    };
    let classes = match classes {
        None => TEN_CLASSES,
        Some(s) => s
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("bad class count {s:?}; {usage}"))?,
    };
    Ok(((c, h, w), classes))
}

/// Loads (or generates) both splits of the dataset described by `spec`.
pub fn load(spec: &DatasetSpec) -> Result<DatasetPair, DataError> {
    match spec {
        DatasetSpec::Mnist { dir, bundled } => mnist::load_mnist(dir, *bundled),
        DatasetSpec::FashionMnist { dir } => load_idx_dir(
            dir,
            "fashion-mnist",
            TEN_CLASSES,
            "install it with `apt-get install dataset-fashion-mnist`, or pass the directory \
             holding the Fashion-MNIST IDX files",
        ),
        DatasetSpec::Idx { dir } => load_idx_dir(
            dir,
            "idx",
            TEN_CLASSES,
            "the directory must hold train-images-idx3-ubyte, train-labels-idx1-ubyte, \
             t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each optionally .gz)",
        ),
        DatasetSpec::Cifar10 { dir } => cifar::load_cifar10(dir),
        DatasetSpec::ImageFolder { dir } => {
            let (train, test) = image_folder::open_pair(dir)?;
            pair(
                train.decode_all("imagefolder")?,
                test.decode_all("imagefolder")?,
            )
        }
        DatasetSpec::Packed { file } => {
            let (train, test) = packed::open_pair(file)?;
            pair(train.decode_all("packed")?, test.decode_all("packed")?)
        }
        DatasetSpec::Synthetic {
            train,
            test,
            channels,
            height,
            width,
            classes,
            seed,
        } => synthetic::generate(*train, *test, (*channels, *height, *width), *classes, *seed),
    }
}

/// Loads an MNIST-layout IDX directory without checksums (for
/// Fashion-MNIST and user-supplied sets). `name` becomes
/// [`Dataset::name`]; `hint` is appended when the directory is missing.
pub fn load_idx_dir(
    dir: &Path,
    name: &str,
    num_classes: usize,
    hint: &str,
) -> Result<DatasetPair, DataError> {
    if !dir.is_dir() {
        return Err(DataError::NotFound {
            path: dir.to_path_buf(),
            hint: hint.to_string(),
        });
    }
    let split = |images: &str, labels: &str| -> Result<Dataset, DataError> {
        let (im, lb) = idx::read_pair(&dir.join(images), &dir.join(labels), num_classes)?;
        Ok(Dataset::from_idx(name, im, lb, num_classes))
    };
    let (train, test) = join(
        || split(mnist::TRAIN_IMAGES_RAW, mnist::TRAIN_LABELS_RAW),
        || split(mnist::TEST_IMAGES_RAW, mnist::TEST_LABELS_RAW),
    );
    pair(train?, test?)
}
