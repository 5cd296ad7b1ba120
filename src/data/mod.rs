//! Datasets for training: loading, validation and generation.
//!
//! Everything is held in memory as `u8` pixels in N×C×H×W order with one
//! `u8` label per sample; conversion to floats and normalisation (see
//! [`Dataset::mean_std`]) happen later, per batch, so the resident copy
//! stays four times smaller than an `f32` one.
//!
//! Sources, chosen with [`DatasetSpec`] (usually from a command-line name
//! via [`DatasetSpec::parse`]) and loaded with [`load`]:
//! - bundled MNIST, SHA-256 verified ([`mnist`]),
//! - Fashion-MNIST or any other 10-class IDX directory ([`idx`]),
//! - CIFAR-10 binary batches ([`cifar`]),
//! - ImageFolder directories of PNG/JPEG files ([`image_folder`]; read lazily per sample by the
//!   input pipeline when training, decoded whole by [`load`]),
//! - a deterministic, learnable synthetic set of any shape ([`synthetic`]).
//!
//! Files are untrusted input: malformed data yields a [`DataError`] that
//! names the file, the problem and the fix, never a panic, and no buffer is
//! sized from a header before that header is checked against the file.

pub mod cifar;
mod error;
pub mod idx;
pub mod image_folder;
pub mod mnist;
pub mod synthetic;

use std::path::{Path, PathBuf};

pub use error::{DataError, VALID_NAMES};

/// Where the Debian package `dataset-fashion-mnist` installs its four
/// gzipped IDX files; the default directory for `fashion-mnist`.
pub const FASHION_MNIST_DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Classes in MNIST, Fashion-MNIST, generic IDX sets and CIFAR-10.
pub const TEN_CLASSES: usize = 10;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, path: Option<&str>) -> Result<DatasetSpec, DataError> {
        DatasetSpec::parse(name, path.map(Path::new), Path::new("bundled"))
    }

    #[test]
    fn parses_names() {
        assert_eq!(
            parse("mnist", None).unwrap(),
            DatasetSpec::Mnist {
                dir: "bundled".into(),
                bundled: true
            }
        );
        assert_eq!(
            parse("fashion-mnist", None).unwrap(),
            DatasetSpec::FashionMnist {
                dir: FASHION_MNIST_DEFAULT_DIR.into()
            }
        );
        assert_eq!(
            parse("idx:/d", None).unwrap(),
            DatasetSpec::Idx { dir: "/d".into() }
        );
        assert_eq!(
            parse("idx", Some("/e")).unwrap(),
            DatasetSpec::Idx { dir: "/e".into() }
        );
        assert_eq!(
            parse("cifar10:/c", None).unwrap(),
            DatasetSpec::Cifar10 { dir: "/c".into() }
        );
        match parse("synthetic:3x32x32", None).unwrap() {
            DatasetSpec::Synthetic {
                channels: 3,
                height: 32,
                width: 32,
                classes: 10,
                train: 60_000,
                test: 10_000,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        match parse("synthetic:1x8x8:4", None).unwrap() {
            DatasetSpec::Synthetic { classes: 4, .. } => {}
            other => panic!("{other:?}"),
        }
        match parse("synthetic", None).unwrap() {
            DatasetSpec::Synthetic {
                channels: 1,
                height: 28,
                width: 28,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_bad_names() {
        let m = parse("imagenet", None).unwrap_err().to_string();
        assert!(m.contains("unknown dataset \"imagenet\""), "{m}");
        assert!(m.contains("mnist") && m.contains("cifar10") && m.contains("synthetic"));
        for (name, path, want) in [
            ("idx", None, "needs a directory"),
            ("cifar10", None, "data_batch_1.bin"),
            ("idx:/a", Some("/b"), "directory given twice"),
            ("synthetic:3x32", None, "three numbers"),
            ("synthetic:axbxc", None, "bad shape"),
            ("synthetic:1x2x2:q", None, "bad class count"),
            ("synthetic", Some("/x"), "drop the path"),
        ] {
            let m = parse(name, path).unwrap_err().to_string();
            assert!(m.contains(want), "{name}: {m}");
        }
    }

    #[test]
    fn mean_std_constants_and_computed() {
        let mut d = Dataset {
            name: "mnist".into(),
            channels: 1,
            height: 1,
            width: 2,
            num_classes: 10,
            pixels: vec![0, 255, 0, 255],
            labels: vec![0, 1],
        };
        assert_eq!(d.mean_std(), (vec![0.1307], vec![0.3081]));
        d.name = "idx".into();
        let (m, s) = d.mean_std();
        assert!((m[0] - 0.5).abs() < 1e-6 && (s[0] - 0.5).abs() < 1e-6);
        d.pixels = vec![7; 4];
        assert_eq!(d.mean_std().1, vec![1.0]);
        assert_eq!(d.image(1), &[7, 7]);
        assert_eq!(d.sample_len(), 2);
    }
}
