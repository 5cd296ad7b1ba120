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
//! - packed files of `dptrain data pack`, memory-mapped ([`packed`]; read per sample like an
//!   ImageFolder),
//! - a deterministic, learnable synthetic set of any shape ([`synthetic`]).
//!
//! Files are untrusted input: malformed data yields a [`DataError`] that
//! names the file, the problem and the fix, never a panic, and no buffer is
//! sized from a header before that header is checked against the file.

pub mod cifar;
mod dataset;
pub mod decode;
mod error;
pub mod idx;
pub mod image_export;
pub mod image_folder;
pub mod mnist;
pub mod packed;
mod spec;
pub mod synthetic;

pub use dataset::{check_split_memory, Dataset, DatasetPair, Split, MAX_CLASSES, TEN_CLASSES};
pub(crate) use dataset::{join, pair};
pub use error::{listed, DataError, VALID_NAMES};
pub use spec::{
    bundled_mnist_dir, load, load_idx_dir, DatasetSpec, FASHION_MNIST_DEFAULT_DIR,
    SYNTHETIC_DEFAULT_SEED, SYNTHETIC_DEFAULT_TEST, SYNTHETIC_DEFAULT_TRAIN,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
