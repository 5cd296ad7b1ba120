//! File-level tests of `dptrain::data`: the bundled MNIST copy, malformed
//! files written to temporary directories, CIFAR-10 and synthetic data.
//! Every bad input must produce an error whose message names the problem.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use dptrain::data::{
    self, cifar, idx, mnist, synthetic, DataError, DatasetSpec, Split, FASHION_MNIST_DEFAULT_DIR,
};
use flate2::write::GzEncoder;
use flate2::Compression;

const MNIST_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/mnist");

fn err_msg<T: std::fmt::Debug>(r: Result<T, DataError>) -> String {
    r.unwrap_err().to_string()
}

/// Raw IDX bytes with an arbitrary magic and dims.
fn idx_bytes(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend_from_slice(data);
    v
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Writes a small valid MNIST-layout IDX directory (gzipped or raw) with
/// `n` training and `n / 2` test images of 4x4.
fn write_idx_dir(dir: &Path, n: u32, gz: bool) {
    let suffix = if gz { ".gz" } else { "" };
    for (images, labels, count) in [
        (mnist::TRAIN_IMAGES_RAW, mnist::TRAIN_LABELS_RAW, n),
        (mnist::TEST_IMAGES_RAW, mnist::TEST_LABELS_RAW, n / 2),
    ] {
        let px: Vec<u8> = (0..count * 16).map(|i| (i % 256) as u8).collect();
        let lb: Vec<u8> = (0..count).map(|i| (i % 10) as u8).collect();
        idx::write_idx_u8(
            &dir.join(format!("{images}{suffix}")),
            &[count, 4, 4],
            &px,
            gz,
        )
        .unwrap();
        idx::write_idx_u8(&dir.join(format!("{labels}{suffix}")), &[count], &lb, gz).unwrap();
    }
}

fn load_idx(dir: &Path) -> Result<data::DatasetPair, DataError> {
    data::load(&DatasetSpec::Idx {
        dir: dir.to_path_buf(),
    })
}

fn copy_mnist_to(dst: &Path) {
    for f in [
        mnist::TRAIN_IMAGES,
        mnist::TRAIN_LABELS,
        mnist::TEST_IMAGES,
        mnist::TEST_LABELS,
        mnist::SHA256SUMS,
    ] {
        fs::copy(Path::new(MNIST_DIR).join(f), dst.join(f)).unwrap();
    }
}

#[test]
fn bundled_mnist_loads_verified() {
    let spec = DatasetSpec::parse("mnist", None, Path::new(MNIST_DIR)).unwrap();
    let d = data::load(&spec).unwrap();
    for (split, n) in [(Split::Train, 60_000), (Split::Test, 10_000)] {
        let s = d.split(split);
        assert_eq!(s.len(), n);
        assert_eq!((s.channels, s.height, s.width), (1, 28, 28));
        assert_eq!(s.num_classes, 10);
        assert_eq!(s.name, "mnist");
        assert_eq!(s.pixels.len(), n * 784);
        assert!(s.labels.iter().all(|&l| l < 10));
        // Every digit occurs.
        for c in 0..10 {
            assert!(s.labels.contains(&c));
        }
    }
    // Well-known first training label of MNIST.
    assert_eq!(d.train.labels[..3], [5, 0, 4]);
    assert_eq!(d.mean_std(), (vec![0.1307], vec![0.3081]));
    // The published constants match the data.
    let (m, s) = d.train.computed_mean_std();
    assert!((m[0] - 0.1307).abs() < 1e-3 && (s[0] - 0.3081).abs() < 1e-3);
}

#[test]
fn tampered_mnist_copy_fails_checksum_naming_file() {
    let tmp = tempfile::tempdir().unwrap();
    copy_mnist_to(tmp.path());
    let victim = tmp.path().join(mnist::TRAIN_LABELS);
    let mut bytes = fs::read(&victim).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    fs::write(&victim, bytes).unwrap();
    // A damaged bundled copy (the copy stands in for data/mnist).
    let m = err_msg(data::load(&DatasetSpec::Mnist {
        dir: tmp.path().into(),
        bundled: true,
    }));
    assert!(m.contains("train-labels-idx1-ubyte.gz"), "{m}");
    assert!(m.contains("SHA-256 mismatch"), "{m}");
    assert!(
        m.contains("expected 1787548bbe0bff1ec2ecdc0ef292b02df999e2d1a6002d27500982c652b17203"),
        "{m}"
    );
    assert!(m.contains("re-clone"), "{m}");
}

#[test]
fn mnist_lfs_pointer_and_missing_sums() {
    let tmp = tempfile::tempdir().unwrap();
    copy_mnist_to(tmp.path());
    fs::write(
        tmp.path().join(mnist::TEST_IMAGES),
        "version https://git-lfs.github.com/spec/v1\noid sha256:1a1a\nsize 1616508\n",
    )
    .unwrap();
    let spec = DatasetSpec::Mnist {
        dir: tmp.path().into(),
        bundled: true,
    };
    let m = err_msg(data::load(&spec));
    assert!(m.contains("t10k-images-idx3-ubyte.gz"), "{m}");
    assert!(m.contains("git lfs pull"), "{m}");

    fs::remove_file(tmp.path().join(mnist::SHA256SUMS)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(m.contains("SHA256SUMS: not found"), "{m}");
    assert!(m.contains("idx:"), "{m}");
}

#[test]
fn idx_dir_raw_and_gzip_round_trip() {
    for gz in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        write_idx_dir(tmp.path(), 20, gz);
        let d = load_idx(tmp.path()).unwrap();
        assert_eq!((d.train.len(), d.test.len()), (20, 10));
        assert_eq!((d.train.height, d.train.width), (4, 4));
        assert_eq!(d.train.image(1), &(16u8..32).collect::<Vec<_>>()[..]);
        assert_eq!(d.test.labels[3], 3);
        assert_eq!(d.train.name, "idx");
    }
}

#[test]
fn gzip_detected_by_content_not_name() {
    // A gzipped file under the raw name still loads.
    let tmp = tempfile::tempdir().unwrap();
    write_idx_dir(tmp.path(), 6, true);
    for f in [
        mnist::TRAIN_IMAGES_RAW,
        mnist::TRAIN_LABELS_RAW,
        mnist::TEST_IMAGES_RAW,
        mnist::TEST_LABELS_RAW,
    ] {
        fs::rename(tmp.path().join(format!("{f}.gz")), tmp.path().join(f)).unwrap();
    }
    assert_eq!(load_idx(tmp.path()).unwrap().train.len(), 6);
}

/// Replaces one file of a valid IDX dir with `bytes` and returns the error.
fn corrupt(file: &str, bytes: &[u8]) -> (String, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    write_idx_dir(tmp.path(), 20, false);
    fs::write(tmp.path().join(file), bytes).unwrap();
    let m = err_msg(load_idx(tmp.path()));
    assert!(m.contains(file), "message must name {file}: {m}");
    (m, tmp.keep())
}

#[test]
fn idx_bad_inputs_give_clear_errors() {
    let lbl = mnist::TRAIN_LABELS_RAW;
    let img = mnist::TRAIN_IMAGES_RAW;
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            img,
            idx_bytes(0x803, &[20, 4, 4], &[0; 20 * 16 - 3]),
            &["declares 20 images of 4x4", "holds 317 bytes", "truncated"],
        ),
        (
            lbl,
            idx_bytes(0x801, &[20], &[0; 10]),
            &["declares 20 labels", "holds 10 bytes", "truncated"],
        ),
        (
            img,
            idx_bytes(0x1234, &[20, 4, 4], &[0; 320]),
            &["magic number 0x00001234", "not an IDX images file"],
        ),
        (
            lbl,
            idx_bytes(0x801, &[19], &[0; 19]),
            &["declares 19 labels", "declares 20 images", "do not belong"],
        ),
        (
            lbl,
            idx_bytes(0x801, &[20], &[10; 20]),
            &["label 10 at index 0 is out of range"],
        ),
        (
            img,
            idx_bytes(0x803, &[1 << 31, 28, 28], &[0; 84]),
            &["declares 2147483648 images of 28x28", "truncated"],
        ),
        (
            img,
            gzip(&idx_bytes(0x803, &[1 << 31, 28, 28], &[0; 84])),
            &["declares 2147483648 images of 28x28", "cannot decompress"],
        ),
        (
            img,
            gzip(&idx_bytes(0x803, &[20, 4, 4], &[0; 320]))[..30].to_vec(),
            &["truncated"],
        ),
        (
            lbl,
            idx_bytes(0x801, &[20], &[0; 25]),
            &["5 trailing bytes after the declared 20 labels"],
        ),
        (
            lbl,
            [gzip(&idx_bytes(0x801, &[20], &[0; 20])), b"XYZ".to_vec()].concat(),
            &["3 trailing bytes after the gzip stream"],
        ),
        (lbl, Vec::new(), &["0 bytes", "too short"]),
    ];
    for (file, bytes, wants) in cases {
        let (m, dir) = corrupt(file, &bytes);
        for w in wants {
            assert!(m.contains(w), "want {w:?} in: {m}");
        }
        fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn idx_missing_dir_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    let m = err_msg(load_idx(&tmp.path().join("nope")));
    assert!(m.contains("nope: not found"), "{m}");
    write_idx_dir(tmp.path(), 4, false);
    fs::remove_file(tmp.path().join(mnist::TEST_LABELS_RAW)).unwrap();
    let m = err_msg(load_idx(tmp.path()));
    assert!(m.contains("t10k-labels-idx1-ubyte: not found"), "{m}");
    assert!(m.contains("t10k-labels-idx1-ubyte.gz"), "{m}");
}

#[test]
fn fashion_mnist_default_dir_is_debian_package() {
    let spec = DatasetSpec::parse("fashion-mnist", None, Path::new(MNIST_DIR)).unwrap();
    assert_eq!(
        spec,
        DatasetSpec::FashionMnist {
            dir: FASHION_MNIST_DEFAULT_DIR.into()
        }
    );
    // scripts/test.sh installs the Debian package; without it this test fails with the hint.
    let d = data::load(&spec).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((d.train.len(), d.test.len()), (60_000, 10_000));
    assert_eq!(
        (d.train.height, d.train.width, d.train.channels),
        (28, 28, 1)
    );
    assert_eq!(d.train.name, "fashion-mnist");
    assert!(d.train.labels.iter().all(|&l| l < 10));
}

#[test]
fn fashion_mnist_missing_names_the_package_to_install() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = DatasetSpec::FashionMnist {
        dir: tmp.path().join("absent"),
    };
    let m = err_msg(data::load(&spec));
    assert!(m.contains("apt-get install dataset-fashion-mnist"), "{m}");
}

fn cifar_fixture(dir: &Path, per_file: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for (k, f) in cifar::TRAIN_FILES
        .iter()
        .chain([&cifar::TEST_FILE])
        .enumerate()
    {
        let images: Vec<u8> = (0..per_file * cifar::IMAGE_LEN)
            .map(|i| (i * 31 + k * 7) as u8)
            .collect();
        let labels: Vec<u8> = (0..per_file).map(|i| ((i + k) % 10) as u8).collect();
        cifar::write_cifar10_batch(&dir.join(f), &images, &labels).unwrap();
        out.push((images, labels));
    }
    out
}

#[test]
fn cifar_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let parts = cifar_fixture(tmp.path(), 3);
    let spec = DatasetSpec::parse("cifar10", Some(tmp.path()), Path::new(MNIST_DIR)).unwrap();
    let d = data::load(&spec).unwrap();
    assert_eq!((d.train.len(), d.test.len()), (15, 3));
    assert_eq!(
        (d.train.channels, d.train.height, d.train.width),
        (3, 32, 32)
    );
    let train_px: Vec<u8> = parts[..5].iter().flat_map(|p| p.0.clone()).collect();
    let train_lb: Vec<u8> = parts[..5].iter().flat_map(|p| p.1.clone()).collect();
    assert_eq!(d.train.pixels, train_px);
    assert_eq!(d.train.labels, train_lb);
    assert_eq!((&d.test.pixels, &d.test.labels), (&parts[5].0, &parts[5].1));
    assert_eq!(d.mean_std().0, vec![0.4914, 0.4822, 0.4465]);

    // The archive's own subfolder is found from its parent.
    let parent = tempfile::tempdir().unwrap();
    let sub = parent.path().join(cifar::ARCHIVE_SUBDIR);
    fs::create_dir(&sub).unwrap();
    cifar_fixture(&sub, 1);
    let d = data::load(&DatasetSpec::Cifar10 {
        dir: parent.path().into(),
    })
    .unwrap();
    assert_eq!(d.train.len(), 5);

    // The writer refuses inconsistent input.
    let m = err_msg(cifar::write_cifar10_batch(
        &tmp.path().join("x.bin"),
        &[0; 10],
        &[1],
    ));
    assert!(m.contains("refusing"), "{m}");
}

#[test]
fn cifar_bad_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    cifar_fixture(tmp.path(), 2);
    let spec = DatasetSpec::Cifar10 {
        dir: tmp.path().into(),
    };
    let b3 = tmp.path().join("data_batch_3.bin");
    let good = fs::read(&b3).unwrap();

    fs::write(&b3, &good[..good.len() - 1]).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(m.contains("data_batch_3.bin: is 6145 bytes"), "{m}");
    assert!(m.contains("3073-byte"), "{m}");

    let mut bad = good.clone();
    bad[cifar::RECORD_LEN] = 12;
    fs::write(&b3, &bad).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(m.contains("data_batch_3.bin: record 1 has label 12"), "{m}");

    fs::remove_file(&b3).unwrap();
    fs::remove_file(tmp.path().join(cifar::TEST_FILE)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(m.contains("data_batch_3.bin: not found"), "{m}");
    assert!(m.contains("also missing: test_batch.bin"), "{m}");
    assert!(m.contains("cifar-10-binary.tar.gz"), "{m}");
}

#[test]
fn synthetic_is_deterministic_and_shaped() {
    let a = synthetic::generate(50, 20, (3, 8, 6), 7, 42).unwrap();
    let b = synthetic::generate(50, 20, (3, 8, 6), 7, 42).unwrap();
    let c = synthetic::generate(50, 20, (3, 8, 6), 7, 43).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.train.pixels, c.train.pixels);
    assert_ne!(a.train.pixels, a.test.pixels[..]);
    for s in [&a.train, &a.test] {
        assert_eq!((s.channels, s.height, s.width, s.num_classes), (3, 8, 6, 7));
        assert_eq!(s.pixels.len(), s.len() * 3 * 8 * 6);
        assert!(s.labels.iter().all(|&l| l < 7));
    }
    assert_eq!((a.train.len(), a.test.len()), (50, 20));
    // Changing the test size leaves training data untouched.
    let d = synthetic::generate(50, 5, (3, 8, 6), 7, 42).unwrap();
    assert_eq!(d.train, a.train);
    // Normalisation constants are measured and sane.
    let (m, s) = a.mean_std();
    assert_eq!((m.len(), s.len()), (3, 3));
    assert!(m.iter().all(|&x| (0.3..0.7).contains(&x)));
    assert!(s.iter().all(|&x| (0.1..0.5).contains(&x)));
}

#[test]
fn synthetic_spec_loads() {
    let spec = DatasetSpec::parse("synthetic:3x32x32", None, Path::new(MNIST_DIR)).unwrap();
    let DatasetSpec::Synthetic {
        channels,
        height,
        width,
        classes,
        seed,
        ..
    } = spec
    else {
        panic!("{spec:?}")
    };
    let small = DatasetSpec::Synthetic {
        train: 10,
        test: 4,
        channels,
        height,
        width,
        classes,
        seed,
    };
    let d = data::load(&small).unwrap();
    assert_eq!(d.train.pixels.len(), 10 * 3 * 32 * 32);
    assert_eq!(d.test.len(), 4);
}
