//! CIFAR-10, binary version (`cifar-10-binary.tar.gz`).
//!
//! Each batch file is a sequence of 3073-byte records: one label byte, then
//! 32×32 pixels of red, green and blue planes (already C×H×W, so pixels are
//! copied without reordering). Official batches hold 10000 records, but any
//! whole number is accepted so small fixtures and subsets work.

use std::path::{Path, PathBuf};

use crate::data::{join, pair, DataError, Dataset, DatasetPair, TEN_CLASSES};

/// CIFAR-10 image side length.
pub const SIDE: usize = 32;
/// CIFAR-10 channels (RGB).
pub const CHANNELS: usize = 3;
/// Pixel bytes per record.
pub const IMAGE_LEN: usize = CHANNELS * SIDE * SIDE;
/// Bytes per record: label + pixels.
pub const RECORD_LEN: usize = 1 + IMAGE_LEN;
/// Training batch files, in the order their records are concatenated.
pub const TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// Test batch file.
pub const TEST_FILE: &str = "test_batch.bin";
/// Folder the official archive extracts to; looked into when the given
/// directory is its parent, a common mistake.
pub const ARCHIVE_SUBDIR: &str = "cifar-10-batches-bin";

/// What to tell someone whose CIFAR-10 files are missing or damaged.
const GET_HINT: &str = "download the CIFAR-10 binary version (cifar-10-binary.tar.gz) and \
     extract it, then pass the cifar-10-batches-bin directory";

/// Loads all five training batches and the test batch from `dir` (or from
/// `dir/cifar-10-batches-bin` when `dir` does not hold them itself).
pub fn load_cifar10(dir: &Path) -> Result<DatasetPair, DataError> {
    let dir = pick_dir(dir);
    // No directory at all: that is the mistake, not the six files in it.
    if !dir.exists() {
        return Err(DataError::NotFound {
            path: dir.to_path_buf(),
            hint: format!("{GET_HINT} (CIFAR-10's six .bin files)"),
        });
    }
    let all: Vec<&str> = TRAIN_FILES.iter().copied().chain([TEST_FILE]).collect();
    let missing: Vec<&str> = all
        .iter()
        .copied()
        // Only what is absent: a fifo or a device in its place is refused by the read, by type.
        .filter(|f| !dir.join(f).exists())
        .collect();
    if let Some(first) = missing.first() {
        let also = if missing.len() > 1 {
            format!(" (also missing: {})", missing[1..].join(", "))
        } else {
            String::new()
        };
        return Err(DataError::NotFound {
            path: dir.join(first),
            hint: format!(
                "CIFAR-10 needs {} in {}{also}; {GET_HINT}",
                all.join(", "),
                dir.display()
            ),
        });
    }
    let (train, test) = join(
        || -> Result<Dataset, DataError> {
            let mut pixels = Vec::new();
            let mut labels = Vec::new();
            for f in TRAIN_FILES {
                let (p, l) = read_cifar10_batch(&dir.join(f))?;
                pixels.extend_from_slice(&p);
                labels.extend_from_slice(&l);
            }
            Ok(dataset(pixels, labels))
        },
        || -> Result<Dataset, DataError> {
            let (p, l) = read_cifar10_batch(&dir.join(TEST_FILE))?;
            Ok(dataset(p, l))
        },
    );
    pair(train?, test?)
}

/// `dir` itself if it holds the first batch, else its archive subfolder if
/// that does, else `dir` (so errors name what the user gave).
fn pick_dir(dir: &Path) -> PathBuf {
    let sub = dir.join(ARCHIVE_SUBDIR);
    if !dir.join(TRAIN_FILES[0]).is_file() && sub.join(TRAIN_FILES[0]).is_file() {
        sub
    } else {
        dir.to_path_buf()
    }
}

/// Wraps validated CIFAR-10 pixels and labels.
fn dataset(pixels: Vec<u8>, labels: Vec<u8>) -> Dataset {
    Dataset {
        name: "cifar10".to_string(),
        channels: CHANNELS,
        height: SIDE,
        width: SIDE,
        num_classes: TEN_CLASSES,
        pixels,
        labels,
    }
}

/// Reads one batch file into (pixels, labels).
pub fn read_cifar10_batch(path: &Path) -> Result<(Vec<u8>, Vec<u8>), DataError> {
    let bytes = crate::input::read_bytes(path, crate::input::FileKind::Dataset)
        .map_err(|e| DataError::from_input(e, GET_HINT))?;
    parse_cifar10_batch(path, &bytes)
}

/// Splits the bytes of one batch into (pixels, labels), checking the size
/// is a whole, non-zero number of records and every label is below 10.
/// `path` is only used in messages.
pub fn parse_cifar10_batch(path: &Path, bytes: &[u8]) -> Result<(Vec<u8>, Vec<u8>), DataError> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(RECORD_LEN) {
        return Err(DataError::invalid(
            path,
            format!(
                "is {} bytes, not a whole non-zero number of {RECORD_LEN}-byte CIFAR-10 records \
                 ({} whole records and {} bytes over): the file is truncated or not a CIFAR-10 \
                 binary batch; {GET_HINT}",
                bytes.len(),
                bytes.len() / RECORD_LEN,
                bytes.len() % RECORD_LEN
            ),
        ));
    }
    let n = bytes.len() / RECORD_LEN;
    let mut pixels = Vec::with_capacity(n * IMAGE_LEN);
    let mut labels = Vec::with_capacity(n);
    for (i, rec) in bytes.chunks_exact(RECORD_LEN).enumerate() {
        let label = rec[0];
        if usize::from(label) >= TEN_CLASSES {
            return Err(DataError::invalid(
                path,
                format!(
                    "record {i} has label {label}, but CIFAR-10 labels are 0..=9: the file is \
                     corrupt or is a CIFAR-100 batch; {GET_HINT}"
                ),
            ));
        }
        labels.push(label);
        pixels.extend_from_slice(&rec[1..]);
    }
    Ok((pixels, labels))
}

/// A CIFAR-10 binary batch (as [`write_cifar10_batch`] writes them): whole records, each
/// starting with a label 0..=9, as far as the head shows.
const CIFAR_FILE: crate::output::Kind = crate::output::Kind {
    what: "a CIFAR-10 batch",
    head: 64 * RECORD_LEN,
    is_one: |head| {
        (head.len() % RECORD_LEN == 0 || head.len() == 64 * RECORD_LEN)
            && head
                .chunks(RECORD_LEN)
                .all(|r| usize::from(r[0]) < TEN_CLASSES)
    },
};

/// Writes a CIFAR-10 binary batch: `images` is `labels.len()` records of
/// 3072 C×H×W bytes. Validates before writing so it never produces a file
/// that [`read_cifar10_batch`] would reject. Used to build test fixtures.
pub fn write_cifar10_batch(path: &Path, images: &[u8], labels: &[u8]) -> Result<(), DataError> {
    if images.len() != labels.len() * IMAGE_LEN {
        return Err(DataError::invalid(
            path,
            format!(
                "refusing to write {} image bytes for {} labels: need {IMAGE_LEN} bytes per label",
                images.len(),
                labels.len()
            ),
        ));
    }
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= TEN_CLASSES)
    {
        return Err(DataError::invalid(
            path,
            format!("refusing to write label {l} at index {i}: CIFAR-10 labels are 0..=9"),
        ));
    }
    let mut out = Vec::with_capacity(labels.len() * RECORD_LEN);
    for (l, img) in labels.iter().zip(images.chunks_exact(IMAGE_LEN)) {
        out.push(*l);
        out.extend_from_slice(img);
    }
    Ok(crate::output::write_atomically(path, &out, &CIFAR_FILE)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checks_size_and_labels() {
        let p = Path::new("b.bin");
        let mut rec = vec![3u8; RECORD_LEN * 2];
        let (px, lb) = parse_cifar10_batch(p, &rec).unwrap();
        assert_eq!((px.len(), lb), (2 * IMAGE_LEN, vec![3, 3]));
        rec[RECORD_LEN] = 12;
        let m = parse_cifar10_batch(p, &rec).unwrap_err().to_string();
        assert!(m.contains("record 1 has label 12"), "{m}");
        let m = parse_cifar10_batch(p, &rec[..RECORD_LEN + 5])
            .unwrap_err()
            .to_string();
        assert!(m.contains("not a whole non-zero number"), "{m}");
        assert!(parse_cifar10_batch(p, &[]).is_err());
    }
}
