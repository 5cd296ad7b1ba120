//! Packed datasets (`dptrain data pack`, `--dataset packed:FILE`): what goes in comes back
//! (raw exactly, JPEG closely), the storage rule, every kind of damage named (a flipped byte in
//! a sample, the index or the header, a truncated file, a wrong magic, an index that lies with
//! a valid checksum), the atomic output, and training on a pack giving the ImageFolder's run.

use dptrain::data::packed::{self, Encoding, PackOptions, PackedFile, StoreAs};
use dptrain::data::{DataError, Split};
use image::{ImageFormat, RgbImage};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{replica_hashes, signalled_when, summary, text, BIN};

/// A smooth, photo-like RGB image (gradients plus a ripple), so JPEG sizes are realistic.
fn photo(w: u32, h: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let s = seed as f32;
        let r = (x as f32 / w as f32 * 200.0 + s * 7.0) as u8;
        let g = (y as f32 / h as f32 * 180.0 + 30.0) as u8;
        let b = (128.0 + 100.0 * ((x + y) as f32 / 9.0 + s).sin()) as u8;
        image::Rgb([r, g, b])
    })
}

/// An ImageFolder under `root` with classes `a`, `b`, `c`: `per_class` training and 2 test
/// images each, of varied sizes (`sizes` cycled), as PNG (`png`) or JPEG files.
fn folder(root: &Path, per_class: u32, sizes: &[(u32, u32)], png: bool) {
    for (split, n) in [("train", per_class), ("test", 2)] {
        for (c, class) in ["a", "b", "c"].iter().enumerate() {
            let dir = root.join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..n {
                let (w, h) = sizes[(i as usize + c) % sizes.len()];
                let img = photo(w, h, i * 3 + c as u32);
                let (name, fmt) = if png {
                    (format!("{i:03}.png"), ImageFormat::Png)
                } else {
                    (format!("{i:03}.jpg"), ImageFormat::Jpeg)
                };
                img.save_with_format(dir.join(name), fmt).unwrap();
            }
        }
    }
}

fn opts(max_side: usize, store: StoreAs) -> PackOptions {
    PackOptions {
        max_side,
        store,
        progress: false,
        skip_bad: false,
    }
}

/// The files of `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Decoded pixels (RGB, HWC) of every image of `split`, in ImageFolder order.
fn originals(root: &Path, split: &str) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    for class in ["a", "b", "c"] {
        let dir = root.join(split).join(class);
        for n in names(&dir) {
            let img = image::open(dir.join(n)).unwrap().into_rgb8();
            out.push((img.width(), img.height(), img.into_raw()));
        }
    }
    out
}

#[test]
fn raw_round_trip_is_exact_and_keeps_order_labels_and_classes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 4, &[(40, 30), (17, 50), (64, 64)], true);
    let out = tmp.path().join("x.pack");
    let s = packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap();
    assert_eq!((s.train, s.test, s.classes, s.channels), (12, 6, 3, 3));
    assert_eq!((s.raw, s.jpeg, s.resized), (12 + 6, 0, 0));
    assert_eq!(s.bytes, std::fs::metadata(&out).unwrap().len());
    let file = PackedFile::open(&out).unwrap();
    assert_eq!(file.classes, ["a", "b", "c"]);
    for (split, name) in [(Split::Train, "train"), (Split::Test, "test")] {
        let want = originals(&root, name);
        let records = file.records(split);
        assert_eq!(records.len(), want.len());
        for (k, (r, (w, h, px))) in records.iter().zip(&want).enumerate() {
            assert_eq!((u32::from(r.width), u32::from(r.height)), (*w, *h));
            assert_eq!(r.encoding, Encoding::Raw);
            assert_eq!(r.offset % packed::SAMPLE_ALIGN, 0, "aligned");
            let per_class = want.len() / 3;
            assert_eq!(usize::from(r.label), k / per_class, "class by class");
            let (_, bytes) = file.sample_bytes(split, k).unwrap();
            assert_eq!(bytes, &px[..], "{name} sample {k} is exact");
        }
    }
}

#[test]
fn colour_test_images_beside_a_grey_training_split_are_stored_grey_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 2, &[(20, 20)], true);
    // The training split grey: it decides the file's channels.
    for class in ["a", "b", "c"] {
        let dir = root.join("train").join(class);
        for n in names(&dir) {
            let grey = image::open(dir.join(&n)).unwrap().to_luma8();
            grey.save(dir.join(n)).unwrap();
        }
    }
    let out = tmp.path().join("x.pack");
    let s = packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap();
    assert_eq!(s.channels, 1);
    assert!(s.test_colour_stored_grey);
    let o = dptrain(&[
        "data",
        "pack",
        root.to_str().unwrap(),
        "--raw",
        "--out",
        tmp.path().join("y.pack").to_str().unwrap(),
    ]);
    let err = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("test holds colour images") && err.contains("--dataset imagefolder"),
        "{err}"
    );
    // All colour: nothing to say.
    let (colour, out2) = (tmp.path().join("colour"), tmp.path().join("z.pack"));
    folder(&colour, 2, &[(20, 20)], true);
    assert!(
        !packed::pack(&colour, &out2, &opts(256, StoreAs::Raw))
            .unwrap()
            .test_colour_stored_grey
    );
}

#[test]
fn jpeg_round_trip_is_close_resizes_to_max_side_and_small_images_stay_raw() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    // 120x90 photos (raw 32 kB, far more than twice their JPEG) and 8x8 icons (192 raw bytes,
    // less than twice a JPEG's headers alone).
    folder(&root, 4, &[(120, 90), (8, 8)], true);
    let out = tmp.path().join("q.pack");
    let s = packed::pack(&root, &out, &opts(256, StoreAs::Smaller { quality: 95 })).unwrap();
    let file = PackedFile::open(&out).unwrap();
    let want = originals(&root, "train");
    let train = packed::PackedSplit::of(&file, Split::Train).unwrap();
    let mut scratch = packed::PackedScratch::default();
    let (mut jpegs, mut raws) = (0, 0);
    for (k, (w, h, px)) in want.iter().enumerate() {
        let r = file.records(Split::Train)[k];
        let got = train.image(k, &mut scratch).unwrap();
        assert_eq!((got.width as u32, got.height as u32), (*w, *h));
        if *w == 8 {
            assert_eq!(r.encoding, Encoding::Raw, "a tiny image stays raw");
            assert_eq!(got.pixels, *px);
            raws += 1;
        } else {
            assert_eq!(r.encoding, Encoding::Jpeg, "a photo is stored as JPEG");
            assert!(r.len as usize * 2 < px.len(), "{} vs {}", r.len, px.len());
            let mean_err = got
                .pixels
                .iter()
                .zip(px)
                .map(|(a, b)| (*a as f64 - *b as f64).abs())
                .sum::<f64>()
                / px.len() as f64;
            assert!(mean_err < 3.0, "JPEG q95 is close: mean error {mean_err}");
            jpegs += 1;
        }
    }
    assert!(jpegs > 0 && raws > 0);
    assert_eq!(s.raw + s.jpeg, s.train + s.test);
    // --raw: every sample raw, a larger file.
    let raw_out = tmp.path().join("r.pack");
    let r = packed::pack(&root, &raw_out, &opts(256, StoreAs::Raw)).unwrap();
    assert_eq!(r.jpeg, 0);
    assert!(r.bytes > s.bytes * 2, "{} vs {}", r.bytes, s.bytes);
    // --max-side 60: the 120x90 photos become 60x45, the icons stay 8x8.
    let small = tmp.path().join("s.pack");
    let m = packed::pack(&root, &small, &opts(60, StoreAs::Raw)).unwrap();
    let f = PackedFile::open(&small).unwrap();
    let sizes: std::collections::BTreeSet<(u16, u16)> = f
        .records(Split::Train)
        .iter()
        .map(|r| (r.width, r.height))
        .collect();
    assert_eq!(sizes, [(8, 8), (60, 45)].into_iter().collect());
    let photos = |split| {
        originals(&root, split)
            .iter()
            .filter(|(w, _, _)| *w == 120)
            .count()
    };
    assert_eq!(m.resized, photos("train") + photos("test"));
}

/// A camera's 8000 x 6000 JPEG, past the 4096 x 4096 pixels an image is decoded to, packs at
/// `--max-side 256`: decoded at the scale that size needs (1/8), then shrunk.
#[test]
fn a_photo_past_4096_square_packs_decoded_reduced() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("camera");
    for split in ["train", "test"] {
        let dir = root.join(split).join("a");
        std::fs::create_dir_all(&dir).unwrap();
        photo(8000, 6000, 1)
            .save_with_format(dir.join("big.jpg"), ImageFormat::Jpeg)
            .unwrap();
    }
    let out = tmp.path().join("c.pack");
    let s = packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap();
    assert_eq!(s.resized, 2);
    let file = PackedFile::open(&out).unwrap();
    let r = file.records(Split::Train)[0];
    assert_eq!((r.width, r.height), (256, 192));
    // The colours survive the reduced decode: the red ramp runs left to right.
    let train = packed::PackedSplit::of(&file, Split::Train).unwrap();
    let mut scratch = packed::PackedScratch::default();
    let img = train.image(0, &mut scratch).unwrap();
    let red = |x: usize| img.pixels[(96 * 256 + x) * 3];
    assert!(red(5) < 20 && red(250) > 180, "{} {}", red(5), red(250));
    // At --max-side 4096 it would be decoded at full size: refused, naming the option.
    let e = packed::pack(&root, &tmp.path().join("d.pack"), &opts(4096, StoreAs::Raw)).unwrap_err();
    assert!(
        e.to_string().contains("big.jpg") && e.to_string().contains("--max-side"),
        "{e}"
    );
}

/// Damaged images fail a pack naming every one (one pass finds them all) and leave no file;
/// `--skip-bad-samples` packs the rest and lists them; a class left without a training image
/// is refused.
#[test]
fn damaged_images_are_all_named_and_skipped_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 3, &[(20, 16)], true);
    let damaged = [
        root.join("train/a/bad1.png"),
        root.join("train/b/bad2.jpg"),
        root.join("test/c/bad3.png"),
    ];
    for f in &damaged {
        std::fs::write(f, b"not an image").unwrap();
    }
    let out = tmp.path().join("p.pack");
    let e = packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap_err();
    let DataError::BadImages { errors, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(errors.len(), 3, "{e}");
    for f in &damaged {
        assert!(e.to_string().contains(&*f.to_string_lossy()), "{e}");
    }
    assert!(e.to_string().contains("--skip-bad-samples"), "{e}");
    assert!(
        !out.exists() && names(tmp.path()) == ["imgs"],
        "{:?}",
        names(tmp.path())
    );
    let skip = PackOptions {
        skip_bad: true,
        ..opts(256, StoreAs::Raw)
    };
    let s = packed::pack(&root, &out, &skip).unwrap();
    assert_eq!((s.skipped.len(), s.train, s.test), (3, 9, 6));
    let file = PackedFile::open(&out).unwrap();
    assert_eq!(file.records(Split::Train).len(), 9);
    // The command says what it left out.
    let o = Command::new(BIN)
        .args(["data", "pack", "--skip-bad-samples", "--raw", "--out"])
        .arg(tmp.path().join("q.pack"))
        .arg(&root)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("left out 3 images") && t.contains("bad2.jpg"),
        "{t}"
    );
    // Every training image of class c damaged: refused, naming the class.
    for i in 0..3 {
        std::fs::write(root.join(format!("train/c/{i:03}.png")), b"x").unwrap();
    }
    let e = packed::pack(&root, &tmp.path().join("r.pack"), &skip).unwrap_err();
    assert!(
        e.to_string().contains("train/c") && e.to_string().contains("left out"),
        "{e}"
    );
    // Every test image cut after its header (which opening the split reads): refused,
    // naming the test split.
    for f in walk(&root.join("test")) {
        let bytes = std::fs::read(&f).unwrap();
        if let Some(idat) = bytes.windows(4).position(|w| w == b"IDAT") {
            std::fs::write(&f, &bytes[..idat + 8]).unwrap();
        }
    }
    let e = packed::pack(&root, &tmp.path().join("r.pack"), &skip).unwrap_err();
    assert!(e.to_string().contains("every test image"), "{e}");
}

/// Bad images first in a split (their headers unreadable, so the split's size comes from a
/// later image): listed and skipped like any other; a split of which no image reads is
/// refused naming them all.
#[test]
fn bad_images_first_in_a_split_are_listed_and_skipped_too() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 20, &[(12, 10)], true);
    let class_a = root.join("train/a");
    let files = names(&class_a);
    for f in &files[..17] {
        std::fs::write(class_a.join(f), b"").unwrap();
    }
    let out = tmp.path().join("p.pack");
    let e = packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap_err();
    assert!(
        matches!(&e, DataError::BadImages { errors, .. } if errors.len() == 17),
        "{e}"
    );
    let skip = PackOptions {
        skip_bad: true,
        ..opts(256, StoreAs::Raw)
    };
    let s = packed::pack(&root, &out, &skip).unwrap();
    assert_eq!((s.skipped.len(), s.train), (17, 43));
    for f in &files[17..] {
        std::fs::write(class_a.join(f), b"").unwrap();
    }
    for class in ["b", "c"] {
        for f in names(&root.join("train").join(class)) {
            std::fs::write(root.join("train").join(class).join(f), b"").unwrap();
        }
    }
    let e = packed::pack(&root, &out, &skip).unwrap_err();
    assert!(
        matches!(&e, DataError::BadImages { errors, .. } if errors.len() == 60)
            && e.to_string().contains("every image of this split"),
        "{e}"
    );
}

/// The files under `dir`, at any depth.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Packs a small folder (raw) and returns the file with its bytes.
fn small_pack(dir: &Path) -> (PathBuf, Vec<u8>) {
    let root = dir.join("imgs");
    folder(&root, 3, &[(12, 12)], true);
    let out = dir.join("p.pack");
    packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    (out, bytes)
}

fn open_err(path: &Path) -> String {
    PackedFile::open(path).unwrap_err().to_string()
}

#[test]
fn a_flipped_byte_in_a_sample_names_the_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, mut bytes) = small_pack(tmp.path());
    let file = PackedFile::open(&out).unwrap();
    // Sample 4 of the training split: class "b" (3 per class).
    let r = file.records(Split::Train)[4];
    drop(file);
    bytes[r.offset as usize + 7] ^= 0x10;
    std::fs::write(&out, &bytes).unwrap();
    let file = PackedFile::open(&out).unwrap();
    let e = file.sample_bytes(Split::Train, 4).unwrap_err();
    match &e {
        DataError::PackedSample {
            split,
            index,
            class,
            ..
        } => assert_eq!((*split, *index, class.as_str()), ("train", 4, "b")),
        other => panic!("{other:?}"),
    }
    let m = e.to_string();
    assert!(
        m.contains("is corrupt: sample 4 (train, class 'b') fails its checksum; re-pack it"),
        "{m}"
    );
    assert!(m.contains("p.pack"), "{m}");
    // Every other sample still reads.
    for k in (0..9).filter(|&k| k != 4) {
        file.sample_bytes(Split::Train, k).unwrap();
    }
    // The normalisation estimate leaves it out, counts what it read and names it.
    let (train, _) = dptrain::data::packed::open_pair(&out).unwrap();
    let source = dptrain::pipeline::Source::Packed(std::sync::Arc::new(train));
    let (_, how, unreadable) = source.normalization(&dptrain::pipeline::Transforms::OFF, true);
    assert_eq!(how, "estimated from 8 training images");
    let unreadable = unreadable.expect("the damaged sample is counted");
    assert_eq!(unreadable.errors.len(), 1);
    assert!(
        unreadable.errors[0].contains("sample 4 (train, class 'b')"),
        "{:?}",
        unreadable.errors
    );
}

/// Rewrites the index of a packed file with `edit` and recomputes both checksums, as a writer
/// with a bug would: the checksums pass, the record checks must catch it.
fn forge_index(bytes: &mut Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) {
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let index_offset = u64_at(bytes, 16) as usize;
    let mut index = bytes[index_offset..].to_vec();
    edit(&mut index);
    bytes.truncate(index_offset);
    bytes.extend_from_slice(&index);
    let len = bytes.len() as u64;
    bytes[24..32].copy_from_slice(&(index.len() as u64).to_le_bytes());
    bytes[32..36].copy_from_slice(&crc32fast::hash(&index).to_le_bytes());
    bytes[40..48].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn damaged_headers_indexes_and_files_are_refused_with_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, bytes) = small_pack(tmp.path());
    let bad = tmp.path().join("bad.pack");
    let try_bytes = |b: &[u8]| {
        std::fs::write(&bad, b).unwrap();
        open_err(&bad)
    };
    // A flipped byte in the index (its last record's label), then in the header.
    let mut b = bytes.clone();
    *b.last_mut().unwrap() ^= 1;
    let m = try_bytes(&b);
    assert!(
        m.contains("is corrupt: its index fails its checksum"),
        "{m}"
    );
    let mut b = bytes.clone();
    b[17] ^= 1;
    let m = try_bytes(&b);
    assert!(m.contains("its header fails its checksum"), "{m}");
    // Truncated: a half copy, and a file shorter than the header.
    let m = try_bytes(&bytes[..bytes.len() / 2]);
    assert!(m.contains("truncated"), "{m}");
    let m = try_bytes(&bytes[..20]);
    assert!(
        m.contains("shorter than a packed dataset's 64-byte header"),
        "{m}"
    );
    // Wrong magic; an empty file; a directory; a missing file.
    let mut b = bytes.clone();
    b[0] = b'X';
    let m = try_bytes(&b);
    assert!(m.contains("is not a packed dataset"), "{m}");
    let m = try_bytes(&[]);
    assert!(m.contains("is empty"), "{m}");
    assert!(open_err(tmp.path()).contains("not a regular file"));
    let m = open_err(&tmp.path().join("absent.pack"));
    assert!(
        m.contains("not found") && m.contains("dptrain data pack"),
        "{m}"
    );
    // A future version.
    let mut b = bytes.clone();
    b[8] = 9;
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    let m = try_bytes(&b);
    assert!(m.contains("format version 9"), "{m}");
    // Indexes that pass their checksum but lie. Records start after the class table:
    // 8 bytes + 3 classes of (2 + 1) bytes + 16 bytes of counts = 33.
    let first = 33;
    for (edit, want) in [
        (
            Box::new(|ix: &mut Vec<u8>| {
                ix[first..first + 8].copy_from_slice(&u64::MAX.to_le_bytes())
            }) as Box<dyn Fn(&mut Vec<u8>)>,
            "outside the samples region",
        ),
        (
            Box::new(|ix: &mut Vec<u8>| ix[first..first + 8].copy_from_slice(&65u64.to_le_bytes())),
            "not a multiple of 64",
        ),
        (
            Box::new(|ix: &mut Vec<u8>| ix[first + 22] = 7),
            "has label 7 of 3 classes",
        ),
        (
            Box::new(|ix: &mut Vec<u8>| ix[first + 16] = 13),
            "gives a raw 13x12x3 image 432 bytes",
        ),
        (
            Box::new(|ix: &mut Vec<u8>| ix[first + 21] = 9),
            "unknown encoding",
        ),
        // A sample count of 2^60: refused from the index's length, nothing allocated.
        (
            Box::new(|ix: &mut Vec<u8>| ix[17..25].copy_from_slice(&(1u64 << 60).to_le_bytes())),
            "samples but holds",
        ),
        (
            Box::new(|ix: &mut Vec<u8>| ix[0..4].copy_from_slice(&0u32.to_le_bytes())),
            "says 0 classes",
        ),
    ] {
        let mut b = bytes.clone();
        forge_index(&mut b, edit);
        let m = try_bytes(&b);
        assert!(m.contains(want), "want {want:?}: {m}");
        assert!(m.contains("re-pack"), "{m}");
    }
    // The original still opens.
    PackedFile::open(&out).unwrap();
}

#[test]
fn a_failed_pack_leaves_nothing_and_links_and_directories_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 3, &[(12, 12)], true);
    std::fs::write(
        root.join("train/b/zz-broken.png"),
        b"\x89PNG\r\n\x1a\nnot really",
    )
    .unwrap();
    let outdir = tmp.path().join("out");
    std::fs::create_dir(&outdir).unwrap();
    let out = outdir.join("p.pack");
    let m = packed::pack(&root, &out, &opts(256, StoreAs::Raw))
        .unwrap_err()
        .to_string();
    assert!(m.contains("zz-broken.png"), "{m}");
    assert!(
        names(&outdir).is_empty(),
        "no file, no temporary: {:?}",
        names(&outdir)
    );
    // A file that is not a pack is never replaced, by a complete pack either.
    std::fs::write(&out, b"keep me").unwrap();
    let m = packed::pack(&root, &out, &opts(256, StoreAs::Raw))
        .unwrap_err()
        .to_string();
    assert!(m.contains("is not a packed dataset dptrain wrote"), "{m}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_file(root.join("train/b/zz-broken.png")).unwrap();
    packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap();
    PackedFile::open(&out).unwrap();
    // An earlier pack is replaced only by a complete one: a failed one leaves it as it was.
    let earlier = std::fs::read(&out).unwrap();
    std::fs::write(
        root.join("train/b/zz-broken.png"),
        b"\x89PNG\r\n\x1a\nnot really",
    )
    .unwrap();
    packed::pack(&root, &out, &opts(256, StoreAs::Raw)).unwrap_err();
    assert_eq!(std::fs::read(&out).unwrap(), earlier);
    assert_eq!(names(&outdir), ["p.pack"]);
    std::fs::remove_file(root.join("train/b/zz-broken.png")).unwrap();
    // A directory or a link at the output path is refused, and left alone.
    let m = packed::pack(&root, &outdir, &opts(256, StoreAs::Raw))
        .unwrap_err()
        .to_string();
    assert!(m.contains("is a directory"), "{m}");
    let link = outdir.join("link.pack");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    let m = packed::pack(&root, &link, &opts(256, StoreAs::Raw))
        .unwrap_err()
        .to_string();
    assert!(m.contains("symbolic link"), "{m}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // Impossible options.
    for (o, want) in [
        (
            opts(0, StoreAs::Raw),
            "data pack: --max-side 0 must be 4..=4096",
        ),
        // Smaller than the ImageFolder reader takes.
        (
            opts(3, StoreAs::Raw),
            "data pack: --max-side 3 must be 4..=4096",
        ),
        (opts(5000, StoreAs::Raw), "--max-side 5000"),
        (opts(256, StoreAs::Smaller { quality: 0 }), "--quality 0"),
    ] {
        let m = packed::pack(&root, &out, &o).unwrap_err().to_string();
        assert!(m.contains(want), "{m}");
    }
}

fn dptrain(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[test]
fn training_on_a_raw_pack_gives_the_image_folders_run_and_corruption_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p).display().to_string();
    let o = dptrain(&[
        "data",
        "export-images",
        "--dataset",
        "mnist",
        "--limit",
        "256",
        "--out",
        &t("mn"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = dptrain(&["data", "pack", &t("mn"), "--out", &t("mn.pack"), "--raw"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("256 train + 256 test samples of 10 classes"),
        "{}",
        text(&o)
    );
    let train = |dataset: &[&str], run: &str, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--quiet",
            "--epochs",
            "2",
            "--batch",
            "32",
            "--threads",
            "1",
        ];
        a.extend(dataset);
        a.extend(["--run-dir", run, "--no-checkpoints"]);
        a.extend(extra);
        dptrain(&a)
    };
    let packed_ds = format!("packed:{}", t("mn.pack"));
    for extra in [
        &[][..],
        &["--loader-threads", "2", "--augment", "crop:2,flip"][..],
    ] {
        let a = train(
            &["--dataset", "imagefolder", "--data-dir", &t("mn")],
            &t("a"),
            extra,
        );
        assert!(a.status.success(), "{}", text(&a));
        let b = train(&["--dataset", &packed_ds], &t("b"), extra);
        assert!(b.status.success(), "{}", text(&b));
        assert_eq!(
            replica_hashes(&tmp.path().join("a")),
            replica_hashes(&tmp.path().join("b"))
        );
        assert_eq!(
            summary(&tmp.path().join("a"))["final_test_accuracy"],
            summary(&tmp.path().join("b"))["final_test_accuracy"]
        );
        std::fs::remove_dir_all(tmp.path().join("a")).unwrap();
        std::fs::remove_dir_all(tmp.path().join("b")).unwrap();
    }
    // One flipped byte in training sample 40 (class 1: 256 samples sorted by class).
    let file = PackedFile::open(Path::new(&t("mn.pack"))).unwrap();
    let r = file.records(Split::Train)[40];
    let class = file.classes[usize::from(r.label)].clone();
    drop(file);
    let mut bytes = std::fs::read(t("mn.pack")).unwrap();
    bytes[r.offset as usize + 100] ^= 0x80;
    std::fs::write(t("mn.pack"), &bytes).unwrap();
    let o = train(&["--dataset", &packed_ds], &t("c"), &[]);
    assert!(!o.status.success());
    let m = text(&o);
    let want = format!("is corrupt: sample 40 (train, class '{class}') fails its checksum");
    assert!(m.contains(&want) && m.contains("--skip-bad-samples"), "{m}");
    assert!(!m.contains("panicked"), "{m}");
    let o = train(&["--dataset", &packed_ds], &t("d"), &["--skip-bad-samples"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        summary(&tmp.path().join("d"))["skipped_samples"],
        2,
        "once per epoch"
    );
}

#[test]
fn a_jpeg_that_needs_no_change_is_stored_as_it_is_and_others_are_re_encoded() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 2, &[(120, 90)], false);
    let files: Vec<Vec<u8>> = ["a", "b", "c"]
        .iter()
        .flat_map(|c| {
            let dir = root.join("train").join(c);
            names(&dir)
                .into_iter()
                .map(move |n| std::fs::read(dir.join(n)).unwrap())
        })
        .collect();
    let kept = tmp.path().join("k.pack");
    packed::pack(&root, &kept, &opts(256, StoreAs::Smaller { quality: 90 })).unwrap();
    let f = PackedFile::open(&kept).unwrap();
    for (k, want) in files.iter().enumerate() {
        assert_eq!(
            f.sample_bytes(Split::Train, k).unwrap().1,
            &want[..],
            "sample {k}"
        );
    }
    // Shrunk: encoded anew (4:2:0, the quality asked for), so other bytes.
    let shrunk = tmp.path().join("s.pack");
    packed::pack(&root, &shrunk, &opts(60, StoreAs::Smaller { quality: 90 })).unwrap();
    let f = PackedFile::open(&shrunk).unwrap();
    let (r, bytes) = f.sample_bytes(Split::Train, 0).unwrap();
    assert_eq!((r.width, r.height, r.encoding), (60, 45, Encoding::Jpeg));
    assert_ne!(bytes, &files[0][..]);
}

#[test]
fn any_size_photos_train_the_same_from_the_folder_and_from_a_raw_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 16, &[(40, 30), (17, 50), (64, 64), (33, 21)], true);
    let pack = tmp.path().join("r.pack");
    packed::pack(&root, &pack, &opts(256, StoreAs::Raw)).unwrap();
    let run = |dataset: &str, dir: &str| {
        let dir = tmp.path().join(dir);
        let d = dir.display().to_string();
        let o = dptrain(&[
            "train",
            "--quiet",
            "--dataset",
            dataset,
            "--model",
            "lenet5",
            "--image-size",
            "28",
            "--augment",
            "random-resized-crop,flip",
            "--epochs",
            "2",
            "--batch",
            "16",
            "--threads",
            "1",
            "--loader-threads",
            "2",
            "--run-dir",
            &d,
            "--no-checkpoints",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        (
            replica_hashes(&dir),
            summary(&dir)["final_test_accuracy"].clone(),
        )
    };
    let folder_run = run(&format!("imagefolder:{}", root.display()), "a");
    let packed_run = run(&format!("packed:{}", pack.display()), "b");
    assert_eq!(folder_run, packed_run);
}

#[test]
fn a_pack_whose_every_image_is_enlarged_to_the_input_size_is_said() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 4, &[(40, 30), (64, 64)], true);
    let small = tmp.path().join("small.pack");
    packed::pack(&root, &small, &opts(16, StoreAs::Raw)).unwrap();
    let large = tmp.path().join("large.pack");
    packed::pack(&root, &large, &opts(64, StoreAs::Raw)).unwrap();
    let warning = |pack: &Path, side: usize| {
        let (mut train, _) = packed::open_pair(pack).unwrap();
        assert!(train.longest_stored_side() <= 64);
        train.set_size(side, side);
        train.enlarged_warning()
    };
    let said = warning(&small, 28).expect("every image is at most 16 px, read at 28");
    assert!(
        said.contains("at most 16 pixels") && said.contains("--max-side 28 or more"),
        "{said}"
    );
    // One image at least as large as the input: not every one is enlarged.
    assert_eq!(warning(&large, 28), None);
    assert_eq!(warning(&small, 16), None);
    // Said by a run on it.
    let d = tmp.path().join("run").display().to_string();
    let o = dptrain(&[
        "train",
        "--quiet",
        "--dataset",
        &format!("packed:{}", small.display()),
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--batch",
        "4",
        "--threads",
        "1",
        "--run-dir",
        &d,
        "--no-checkpoints",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("every one is enlarged"), "{}", text(&o));
}

/// Ctrl-C (or kill) in the middle of a pack removes its temporary file, leaves the earlier
/// pack at `--out` as it was, and the command ends as interrupted (by the signal); a pack
/// started ignoring SIGHUP (as under nohup) goes on through a hang-up.
#[test]
fn an_interrupted_pack_leaves_no_temporary_file_and_the_earlier_pack() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("imgs");
    folder(&root, 3, &[(40, 30)], true);
    let outdir = tmp.path().join("out");
    std::fs::create_dir(&outdir).unwrap();
    let out = outdir.join("p.pack");
    let o = dptrain(&[
        "data",
        "pack",
        root.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let earlier = std::fs::read(&out).unwrap();
    // Enough large images that the pack is still writing long after its temporary file
    // appears (it is made before the first image is read); more if a machine packs them all
    // before the signal lands.
    let mut per_class = 150;
    folder(&root, per_class, &[(320, 240), (300, 260)], true);
    let mut cases = vec![
        (libc::SIGINT, false),
        (libc::SIGTERM, false),
        (libc::SIGHUP, true),
    ];
    while let Some(&(signal, nohup)) = cases.first() {
        let Some(status) = pack_signalled(&root, &out, signal, nohup) else {
            assert!(per_class < 5000, "every pack ended before the signal");
            per_class *= 2;
            folder(&root, per_class, &[(320, 240), (300, 260)], true);
            continue;
        };
        if nohup {
            assert!(status.success(), "nohup's SIGHUP ended the pack: {status}");
            assert_ne!(std::fs::read(&out).unwrap(), earlier, "the new pack");
        } else {
            assert_eq!(status.signal(), Some(signal), "{status}");
            assert_eq!(
                names(&outdir),
                ["p.pack"],
                "signal {signal}: only the earlier pack"
            );
            assert_eq!(std::fs::read(&out).unwrap(), earlier, "signal {signal}");
        }
        cases.remove(0);
    }
}

/// Packs `root` raw into `out` and sends `signal` once its temporary file exists (see
/// [`signalled_when`]).
fn pack_signalled(
    root: &Path,
    out: &Path,
    signal: libc::c_int,
    nohup: bool,
) -> Option<std::process::ExitStatus> {
    let mut cmd = Command::new(BIN);
    cmd.args(["data", "pack", "--raw", "--out"])
        .arg(out)
        .arg(root);
    let dir = out.parent().unwrap();
    signalled_when(cmd, || names(dir).len() >= 2, signal, nohup)
}
