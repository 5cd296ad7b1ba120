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

mod common;

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
    // No directory at all: the directory is named, not its six files.
    let gone = tmp.path().join("gone");
    let m = err_msg(data::load(&DatasetSpec::Cifar10 { dir: gone.clone() }));
    assert!(
        m.contains(&format!("{}: not found", gone.display())) && !m.contains("also missing"),
        "{m}"
    );
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

/// Counts this thread's live heap bytes and their peak, so a test can bound what a decode
/// allocates while other tests of this binary allocate on their own threads.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }

    fn track(delta: isize) {
        let _ = LIVE.try_with(|live| {
            let v = live.get() + delta;
            live.set(v);
            let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        });
    }

    // SAFETY: every call is forwarded to the system allocator unchanged; only counts are kept.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let p = System.alloc(l);
            if !p.is_null() {
                track(l.size() as isize);
            }
            p
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            let p = System.alloc_zeroed(l);
            if !p.is_null() {
                track(l.size() as isize);
            }
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            System.dealloc(p, l);
            track(-(l.size() as isize));
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            let q = System.realloc(p, l, new);
            if !q.is_null() {
                track(new as isize - l.size() as isize);
            }
            q
        }
    }

    /// Runs `f` and returns its result and the most heap bytes it held at once (this thread).
    pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let out = f();
        let peak = PEAK.with(Cell::get);
        (out, (peak - base).max(0) as usize)
    }
}

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32(&body).to_be_bytes());
    v
}

/// A PNG of a valid header claiming `w`x`h` (bit depth and colour type as given), followed by
/// `tail` (image data, possibly garbage or cut short).
fn png_header(w: u32, h: u32, depth: u8, color: u8, interlace: u8, tail: &[u8]) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[depth, color, 0, 0, interlace]);
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    v.extend(png_chunk(b"IHDR", &ihdr));
    v.extend_from_slice(tail);
    v
}

/// A baseline JPEG's markers up to its first scan, claiming `w`x`h`, then `tail`.
fn jpeg_header(w: u16, h: u16, components: u8, tail: &[u8]) -> Vec<u8> {
    let mut v = vec![0xff, 0xd8];
    // One quantisation table (all ones).
    v.extend_from_slice(&[0xff, 0xdb, 0x00, 0x43, 0x00]);
    v.extend(std::iter::repeat_n(1u8, 64));
    // Start of frame: precision 8, height, width, components with sampling 1x1, table 0.
    let len = 8 + 3 * components as u16;
    v.extend_from_slice(&[0xff, 0xc0]);
    v.extend_from_slice(&len.to_be_bytes());
    v.push(8);
    v.extend_from_slice(&h.to_be_bytes());
    v.extend_from_slice(&w.to_be_bytes());
    v.push(components);
    for c in 0..components {
        v.extend_from_slice(&[c + 1, 0x11, 0]);
    }
    // A minimal Huffman table (DC, class 0, id 0: one code of length 1).
    let mut counts = [0u8; 16];
    counts[0] = 1;
    v.extend_from_slice(&[0xff, 0xc4, 0x00, 0x14, 0x00]);
    v.extend_from_slice(&counts);
    v.push(0);
    // Start of scan over every component.
    let sos_len = 6 + 2 * components as u16;
    v.extend_from_slice(&[0xff, 0xda]);
    v.extend_from_slice(&sos_len.to_be_bytes());
    v.push(components);
    for c in 0..components {
        v.extend_from_slice(&[c + 1, 0x00]);
    }
    v.extend_from_slice(&[0, 63, 0]);
    v.extend_from_slice(tail);
    v
}

/// Most heap one open-and-read of a hostile file may take: the largest image accepted
/// (4096x4096) decoded through the widest buffer a decoder uses (16-bit RGBA, 8 bytes a pixel)
/// plus its RGB copy and the sample buffer, with room for the decoders' state. A 65535x65535
/// header used to ask for 4.3 G pixels per image (1.29 TB for the split).
const DECODE_BOUND: usize = 320 << 20;

/// Opens an ImageFolder whose only training image is `bytes` (in `dir`), reads every sample
/// and decodes the split whole; returns the errors, and fails the test if any step holds
/// more than [`DECODE_BOUND`] of heap.
fn open_hostile(dir: &Path, name: &str, bytes: &[u8]) -> Vec<String> {
    use dptrain::data::image_folder::{DecodeScratch, ImageFolder};
    let class = dir.join("train/0");
    let _ = fs::remove_dir_all(dir.join("train"));
    fs::create_dir_all(&class).unwrap();
    let path = class.join(name);
    fs::write(&path, bytes).unwrap();
    let mut errors = Vec::new();
    let (opened, peak) = counting::peak_during(|| ImageFolder::open(&dir.join("train"), None));
    assert!(peak <= DECODE_BOUND, "{name}: open held {peak} bytes");
    match opened {
        Err(e) => errors.push(e.to_string()),
        Ok(folder) => {
            // What the loaders will allocate per sample, from the header: bounded too.
            assert!(
                folder.sample_len() <= DECODE_BOUND,
                "{name}: accepted a header claiming {}x{}x{}",
                folder.channels,
                folder.height,
                folder.width
            );
            let (read, peak) = counting::peak_during(|| {
                let mut scratch = DecodeScratch::default();
                let mut out = vec![0u8; folder.sample_len()];
                folder.read(0, &mut scratch, &mut out)
            });
            assert!(peak <= DECODE_BOUND, "{name}: read held {peak} bytes");
            if let Err(e) = read {
                errors.push(e.to_string());
            }
            let (all, peak) = counting::peak_during(|| folder.decode_all("hostile").map(|_| ()));
            assert!(peak <= DECODE_BOUND, "{name}: decode_all held {peak} bytes");
            if let Err(e) = all {
                errors.push(e.to_string());
            }
        }
    }
    for e in &errors {
        assert!(e.contains(name), "the error does not name the file: {e}");
    }
    errors
}

#[test]
fn hostile_image_headers_are_refused_within_a_memory_bound() {
    use rand::{Rng, SeedableRng};
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
    // The reported case first: ~100 bytes claiming 65535 x 65535.
    let mut tail = png_chunk(b"IDAT", &[0x78, 0x9c, 0x63, 0, 0, 0, 1, 0, 1]);
    tail.extend(png_chunk(b"IEND", &[]));
    let huge = png_header(65535, 65535, 8, 2, 0, &tail);
    assert!(huge.len() < 100);
    let errors = open_hostile(tmp.path(), "huge.png", &huge);
    assert!(
        errors[0].contains("claims 65535x65535 pixels") && errors[0].contains("4096x4096"),
        "{errors:?}"
    );
    let errors = open_hostile(
        tmp.path(),
        "huge.jpg",
        &jpeg_header(65535, 65535, 3, &[0; 16]),
    );
    assert!(
        errors[0].contains("claims 65535x65535 pixels"),
        "{errors:?}"
    );
    // Then a few hundred: sizes up to 65535 a side (many near the cap and near 1), every PNG
    // colour layout, interlaced or not, data cut short or garbage.
    let side = |rng: &mut rand_chacha::ChaCha8Rng| -> u32 {
        match rng.gen_range(0..4) {
            0 => rng.gen_range(1..=16),
            1 => rng.gen_range(4000..=4200),
            2 => 65535 - rng.gen_range(0..4),
            _ => rng.gen_range(1..=65535),
        }
    };
    for i in 0..300 {
        let (w, h) = (side(&mut rng), side(&mut rng));
        let mut garbage: Vec<u8> = (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect();
        // Half of the image data starts like a zlib stream, so inflating begins.
        if rng.gen_bool(0.5) {
            garbage.splice(0..0, [0x78, 0x9c]);
        }
        let (name, mut bytes) = if i % 2 == 0 {
            let (depth, color) = [
                (1, 0),
                (8, 0),
                (16, 0),
                (8, 2),
                (16, 2),
                (8, 3),
                (8, 4),
                (8, 6),
                (16, 6),
            ][rng.gen_range(0..9)];
            let idat = png_chunk(b"IDAT", &garbage);
            (
                format!("case{i}.png"),
                png_header(w, h, depth, color, rng.gen_range(0..2), &idat),
            )
        } else {
            let c = [1, 3][rng.gen_range(0..2)];
            (
                format!("case{i}.jpg"),
                jpeg_header(w.min(65535) as u16, h.min(65535) as u16, c, &garbage),
            )
        };
        // Cut short at a random point half of the time.
        if rng.gen_bool(0.5) {
            let keep = rng.gen_range(8..=bytes.len());
            bytes.truncate(keep);
        }
        let errors = open_hostile(tmp.path(), &name, &bytes);
        // None of these is a whole image: each one fails somewhere, naming the file.
        assert!(!errors.is_empty(), "{name} ({w}x{h}) was accepted");
    }
}

#[test]
fn an_own_mnist_dir_that_fails_its_checks_does_not_blame_the_bundled_copy() {
    let tmp = tempfile::tempdir().unwrap();
    copy_mnist_to(tmp.path());
    let victim = tmp.path().join(mnist::TEST_LABELS);
    let mut bytes = fs::read(&victim).unwrap();
    bytes[10] ^= 1;
    fs::write(&victim, bytes).unwrap();
    // As `--dataset mnist --data-dir DIR` gives it.
    let spec = DatasetSpec::parse("mnist", Some(tmp.path()), Path::new(MNIST_DIR)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("SHA-256 mismatch") && m.contains("t10k-labels"),
        "{m}"
    );
    assert!(!m.contains("bundled"), "{m}");
    assert!(m.contains("--dataset idx --data-dir"), "{m}");
    fs::remove_file(tmp.path().join(mnist::SHA256SUMS)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("SHA256SUMS: not found") && !m.contains("bundled"),
        "{m}"
    );
    // Missing checksums are not files that "do not match" them: it says how to make them.
    assert!(
        m.contains("sha256sum *.gz > SHA256SUMS") && !m.contains("do not match"),
        "{m}"
    );
    // Written as `sha256sum ./*.gz` does: the names' "./" is the directory, not the name.
    let bundled = fs::read_to_string(Path::new(MNIST_DIR).join(mnist::SHA256SUMS)).unwrap();
    let sums = bundled.replace("  ", "  ./");
    assert!(sums.contains("  ./t10k-labels"), "{sums}");
    fs::write(tmp.path().join(mnist::SHA256SUMS), &sums).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("SHA-256 mismatch") && m.contains("t10k-labels"),
        "{m}"
    );
    // Or as `sha256sum $PWD/*.gz` does: absolute names of the files there.
    let absolute = bundled.replace("  ", &format!("  {}/", tmp.path().display()));
    fs::write(tmp.path().join(mnist::SHA256SUMS), &absolute).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("SHA-256 mismatch") && m.contains("t10k-labels"),
        "{m}"
    );
    // An entry missing is not a mismatch either.
    let first_gone: String = sums.lines().skip(1).map(|l| format!("{l}\n")).collect();
    fs::write(tmp.path().join(mnist::SHA256SUMS), first_gone).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("has no entry for t10k-images") && !m.contains("do not match"),
        "{m}"
    );
    // Not a file: what belongs there, not "give the path of a file" (the user gave a dir).
    fs::remove_file(tmp.path().join(mnist::SHA256SUMS)).unwrap();
    fs::create_dir(tmp.path().join(mnist::SHA256SUMS)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("SHA256SUMS is a directory, not a regular file: put the file itself there"),
        "{m}"
    );
    fs::remove_dir(tmp.path().join(mnist::SHA256SUMS)).unwrap();
    fs::write(tmp.path().join(mnist::SHA256SUMS), &sums).unwrap();
    // A file missing is named before any checksum is asked for; uncompressed files are
    // pointed to idx.
    fs::remove_file(tmp.path().join(mnist::TRAIN_LABELS)).unwrap();
    let m = err_msg(data::load(&spec));
    assert!(
        m.contains("has no train-labels-idx1-ubyte.gz") && !m.contains("SHA-256"),
        "{m}"
    );
    let raw = tmp.path().join("raw data");
    fs::create_dir(&raw).unwrap();
    for f in [
        mnist::TRAIN_IMAGES_RAW,
        mnist::TRAIN_LABELS_RAW,
        mnist::TEST_IMAGES_RAW,
        mnist::TEST_LABELS_RAW,
    ] {
        fs::write(raw.join(f), b"").unwrap();
    }
    let spec_raw = DatasetSpec::parse("mnist", Some(&raw), Path::new(MNIST_DIR)).unwrap();
    let m = err_msg(data::load(&spec_raw));
    assert!(
        m.contains("uncompressed IDX files")
            && m.contains(&format!("--dataset idx --data-dir '{}'", raw.display())),
        "{m}"
    );
    // The bundled copy's own failure still says how to restore it.
    let spec = DatasetSpec::parse("mnist", None, tmp.path()).unwrap();
    assert!(err_msg(data::load(&spec)).contains("the bundled MNIST copy is damaged"));
}

fn dptrain_cli(args: &[&str], dir: &Path) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn export_images_refuses_a_directory_that_holds_something() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let export = |extra: &[&str]| {
        let mut args = vec![
            "data",
            "export-images",
            "--dataset",
            "synthetic:1x4x4:1",
            "--limit",
            "4",
        ];
        args.extend_from_slice(extra);
        dptrain_cli(&args, t)
    };
    // A limit that leaves a class without a training image is refused before writing: an
    // ImageFolder with an empty class directory cannot be trained on.
    let (code, err) = dptrain_cli(
        &[
            "data",
            "export-images",
            "--dataset",
            "synthetic:1x4x4:10",
            "--limit",
            "3",
            "--out",
            "few",
        ],
        t,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("has no image of class") && err.contains("a larger --limit"),
        "{err}"
    );
    // The directory the refused export made is not left behind empty.
    assert!(!t.join("few").exists());
    let (code, err) = export(&["--out", "png"]);
    assert_eq!(code, 0, "{err}");
    let count = |d: &str| walk(&t.join(d)).len();
    assert_eq!(count("png"), 8);
    // Into the same directory again: two datasets would mix; refused, nothing written.
    let (code, err) = dptrain_cli(
        &[
            "data",
            "export-images",
            "--dataset",
            "synthetic:1x4x4:1",
            "--limit",
            "2",
            "--out",
            "png",
        ],
        t,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("holds an earlier export") && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(count("png"), 8);
    // An ImageFolder is already one: exporting it would resize and renumber it; refused.
    let (code, err) = dptrain_cli(
        &[
            "data",
            "export-images",
            "--dataset",
            "imagefolder",
            "--data-dir",
            "png",
            "--out",
            "again",
        ],
        t,
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is already an ImageFolder"), "{err}");
    assert!(!t.join("again").exists());
    // --overwrite replaces it.
    let (code, err) = dptrain_cli(
        &[
            "data",
            "export-images",
            "--dataset",
            "synthetic:1x4x4:1",
            "--limit",
            "2",
            "--out",
            "png",
            "--overwrite",
        ],
        t,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(count("png"), 4);
    // Anything else in the directory is not ours: refused even with --overwrite.
    fs::write(t.join("png/notes.txt"), b"mine").unwrap();
    let (code, err) = export(&["--out", "png", "--overwrite"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("notes.txt") && err.contains("is not empty"),
        "{err}"
    );
    assert_eq!(fs::read(t.join("png/notes.txt")).unwrap(), b"mine");
    fs::remove_file(t.join("png/notes.txt")).unwrap();
    // Nor are a user's files among the images, which --overwrite would delete with them.
    let class = fs::read_dir(t.join("png/train"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::write(class.join("labels.csv"), b"mine").unwrap();
    fs::create_dir(t.join("png/test/extra")).unwrap();
    let (code, err) = export(&["--out", "png", "--overwrite"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("labels.csv")
            && err.contains("test/extra")
            && err.contains("files an export does not write"),
        "{err}"
    );
    assert_eq!(fs::read(class.join("labels.csv")).unwrap(), b"mine");
    assert_eq!(count("png"), 5, "nothing deleted");
    fs::remove_file(class.join("labels.csv")).unwrap();
    fs::remove_dir(t.join("png/test/extra")).unwrap();
    let (code, err) = export(&["--out", "png", "--overwrite"]);
    assert_eq!(code, 0, "{err}");
    // A write that fails says so ("cannot create"), not "cannot read".
    let ro = t.join("ro");
    fs::create_dir(&ro).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    }
    // Modes do not stop root: sysfs does.
    let target = if fs::write(ro.join("probe"), b"").is_ok() {
        "/sys/kernel/dptrain-export".to_string()
    } else {
        ro.join("png").display().to_string()
    };
    let (code, err) = export(&["--out", &target]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot create") && !err.contains("cannot read"),
        "{err}"
    );
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// `dptrain data export-images` of `size` images of a synthetic set into `out`.
fn export_images(out: &Path, size: &str, limit: usize) -> std::process::Command {
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args(["data", "export-images", "--dataset"])
        .arg(format!("synthetic:3x{size}:2"))
        .args(["--limit", &limit.to_string(), "--overwrite", "--out"])
        .arg(out);
    cmd
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// How an export into `out` ended when sent SIGTERM while it staged its images (more images
/// each time it finished first, with `out` put back by `reset` first).
fn export_signalled_while_staging(out: &Path, reset: impl Fn()) -> std::process::ExitStatus {
    let mut limit = 200;
    loop {
        reset();
        let staged = || {
            fs::read_dir(out).is_ok_and(|entries| {
                entries.filter_map(Result::ok).any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".dptrain-partial-")
                })
            })
        };
        let export = export_images(out, "256x256", limit);
        match common::signalled_when(export, staged, libc::SIGTERM, false) {
            Some(status) => return status,
            None if limit < 10_000 => limit *= 4,
            None => panic!("every export ended before the signal"),
        }
    }
}

/// A signal while an export writes its images removes what it staged (the earlier export in
/// `--out` stays whole), as it removes an atomic write's temporary file.
#[test]
fn an_interrupted_export_leaves_no_staged_images() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ex");
    let earlier_export = || {
        let _ = fs::remove_dir_all(&out);
        let o = export_images(&out, "8x8", 4).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    earlier_export();
    let earlier = names_in(&out.join("train").join("0"));
    let status = export_signalled_while_staging(&out, earlier_export);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert_eq!(names_in(&out), ["test", "train"], "staged images left");
    assert_eq!(names_in(&out.join("train").join("0")), earlier);
}

/// An export into a new `--out` that a signal ends leaves no directory: the one it made is
/// removed with what it staged there.
#[test]
fn an_interrupted_export_to_a_new_directory_leaves_none() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("new");
    let status = export_signalled_while_staging(&out, || {
        let _ = fs::remove_dir_all(&out);
    });
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert!(!out.exists(), "left {:?}", names_in(&out));
}
