//! The bundled MNIST copy: four gzipped IDX files plus a `SHA256SUMS`.
//!
//! Each file is hashed before it is parsed so a damaged checkout (a Git LFS
//! pointer, a partial download, a hand-edited file) is reported as such
//! instead of surfacing as a confusing format error or, worse, loading
//! subtly wrong data.

use crate::input::FileKind;
use std::path::{Path, PathBuf};

use crate::terminal::shell_quoted;
use sha2::{Digest, Sha256};

use crate::data::idx::{self, LFS_POINTER_PREFIX};
use crate::data::{join, pair, DataError, Dataset, DatasetPair, TEN_CLASSES};

/// Training images of the bundled copy.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte.gz";
/// Training labels of the bundled copy.
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte.gz";
/// Test images of the bundled copy.
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte.gz";
/// Test labels of the bundled copy.
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte.gz";

/// Uncompressed name of [`TRAIN_IMAGES`]; IDX directories may hold either
/// form, and [`idx::resolve`] adds `.gz` when needed.
pub const TRAIN_IMAGES_RAW: &str = "train-images-idx3-ubyte";
/// Uncompressed name of [`TRAIN_LABELS`].
pub const TRAIN_LABELS_RAW: &str = "train-labels-idx1-ubyte";
/// Uncompressed name of [`TEST_IMAGES`].
pub const TEST_IMAGES_RAW: &str = "t10k-images-idx3-ubyte";
/// Uncompressed name of [`TEST_LABELS`].
pub const TEST_LABELS_RAW: &str = "t10k-labels-idx1-ubyte";

/// Name of the checksum file, in `sha256sum` output format.
pub const SHA256SUMS: &str = "SHA256SUMS";

/// What to tell someone whose bundled copy is damaged.
const REPAIR_HINT: &str = "the bundled MNIST copy is damaged: restore it with \
     `git checkout -- data/mnist` (run `git lfs pull` first if the repository uses Git LFS), or \
     re-clone the repository";

/// What to tell someone whose own MNIST directory (`--data-dir`, `mnist:<dir>`) fails its
/// checks: the files are theirs, so nothing about the bundled copy applies.
fn own_copy_hint(dir: &Path) -> String {
    format!(
        "the MNIST files in {} do not match the SHA256SUMS there (`--dataset mnist` with a \
         directory checks the four .gz files against it): replace the damaged file, or train \
         on the files unchecked with --dataset idx --data-dir {}",
        dir.display(),
        shell_quoted(dir)
    )
}

/// How to write the checksums of a user's MNIST directory, or go without them.
fn own_sums_hint(dir: &Path) -> String {
    format!(
        "`--dataset mnist` with a directory checks the four .gz files against the SHA256SUMS \
         beside them: write it with `cd {} && sha256sum *.gz > SHA256SUMS` once the files are \
         known to be good, or train on the files unchecked with --dataset idx --data-dir {}",
        shell_quoted(dir),
        shell_quoted(dir)
    )
}

/// A user's MNIST directory must hold the four .gz files: one missing is named as missing
/// (before its checksums are asked for), and uncompressed IDX files are pointed to `idx`.
fn check_own_files(dir: &Path) -> Result<(), DataError> {
    let gz = [TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS];
    let raw = [
        TRAIN_IMAGES_RAW,
        TRAIN_LABELS_RAW,
        TEST_IMAGES_RAW,
        TEST_LABELS_RAW,
    ];
    if !dir.is_dir() {
        let hint = format!(
            "`--dataset mnist` with a directory reads {}, {}, {} and {} there, checked \
             against its SHA256SUMS: give the directory that holds them",
            gz[0], gz[1], gz[2], gz[3]
        );
        return Err(if dir.exists() {
            DataError::invalid(dir, format!("is not a directory; {hint}"))
        } else {
            DataError::NotFound {
                path: dir.to_path_buf(),
                hint,
            }
        });
    }
    let missing: Vec<&str> = gz.into_iter().filter(|f| !dir.join(f).exists()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let all_raw = raw.iter().all(|f| dir.join(f).exists());
    let why = if all_raw {
        format!(
            "holds the uncompressed IDX files, and `--dataset mnist` reads the four .gz files \
             checked against SHA256SUMS: train on these with --dataset idx --data-dir {}",
            shell_quoted(dir)
        )
    } else {
        format!(
            "has no {} (`--dataset mnist` with a directory reads {}, {}, {} and {}, checked \
             against SHA256SUMS): put the missing files there, or give the directory that \
             holds them",
            missing.join(", "),
            gz[0],
            gz[1],
            gz[2],
            gz[3]
        )
    };
    Err(DataError::invalid(dir, why))
}

/// Loads MNIST from `dir`, verifying every file against `dir/SHA256SUMS` first; `bundled`
/// says whether `dir` is the copy shipped with dptrain (it decides what a failure tells the
/// user to do).
pub fn load_mnist(dir: &Path, bundled: bool) -> Result<DatasetPair, DataError> {
    let hint = if bundled {
        REPAIR_HINT.to_string()
    } else {
        check_own_files(dir)?;
        own_copy_hint(dir)
    };
    let hint = hint.as_str();
    let sums_path = dir.join(SHA256SUMS);
    // The checksums themselves unreadable, or without an entry: for a user's directory, say
    // how to write them rather than that the files do not match them.
    let sums_hint = if bundled {
        format!(
            "MNIST is loaded only with its checksums; {hint} (or load unverified files with \
             idx:{})",
            dir.display()
        )
    } else {
        own_sums_hint(dir)
    };
    // One that is there but cannot be read (its permissions) is not to be written again.
    let unreadable = if sums_path.exists() && !bundled {
        "`--dataset mnist` with a directory checks the four .gz files against it: make it \
         readable"
    } else {
        &sums_hint
    };
    let sums_text = crate::input::read_text(&sums_path, FileKind::Dataset)
        .map_err(|e| DataError::from_input(e, unreadable))?;
    let sums_hint = if bundled { hint } else { &sums_hint };
    let sums = parse_sums(&sums_path, &sums_text, sums_hint)?;
    // `sha256sum $PWD/*.gz` names each file by its absolute path: the same file.
    let here = dir.canonicalize().ok();
    let names_file = |name: &str, file: &str| {
        let path = Path::new(name);
        name == file
            || (path.is_absolute()
                && path.file_name().is_some_and(|n| n == file)
                && here.is_some()
                && path.parent().and_then(|p| p.canonicalize().ok()) == here)
    };
    let expected = |file: &str| -> Result<String, DataError> {
        sums.iter()
            .find(|(name, _)| names_file(name, file))
            .map(|(_, h)| h.clone())
            .ok_or_else(|| {
                DataError::invalid(&sums_path, format!("has no entry for {file}; {sums_hint}"))
            })
    };
    let hashes = [
        expected(TRAIN_IMAGES)?,
        expected(TRAIN_LABELS)?,
        expected(TEST_IMAGES)?,
        expected(TEST_LABELS)?,
    ];
    let split = |images: &str, ih: &str, labels: &str, lh: &str| -> Result<Dataset, DataError> {
        let (ip, ib) = read_checked(&dir.join(images), ih, hint)?;
        let (lp, lb) = read_checked(&dir.join(labels), lh, hint)?;
        let im = idx::parse_images(&ip, &ib)?;
        drop(ib);
        let lb = idx::parse_labels(&lp, &lb, TEN_CLASSES)?;
        idx::check_counts(&ip, &im, &lp, &lb)?;
        Ok(Dataset::from_idx("mnist", im, lb, TEN_CLASSES))
    };
    let (train, test) = join(
        || split(TRAIN_IMAGES, &hashes[0], TRAIN_LABELS, &hashes[1]),
        || split(TEST_IMAGES, &hashes[2], TEST_LABELS, &hashes[3]),
    );
    pair(train?, test?)
}

/// Parses `sha256sum` output: lines of `<64 hex> <space><space or *><name>`.
/// Blank lines and `#` comments are skipped; anything else is an error so a
/// mangled file is not mistaken for a missing entry.
pub fn parse_sha256sums(path: &Path, text: &str) -> Result<Vec<(String, String)>, DataError> {
    parse_sums(path, text, REPAIR_HINT)
}

/// [`parse_sha256sums`] with the repair hint for the copy being read.
fn parse_sums(path: &Path, text: &str, hint: &str) -> Result<Vec<(String, String)>, DataError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let parsed = line.split_once(' ').and_then(|(hash, rest)| {
            let name = rest.strip_prefix([' ', '*']).unwrap_or(rest).trim();
            // `sha256sum ./*.gz` writes the names with the directory they were given in.
            let name = name.strip_prefix("./").unwrap_or(name);
            let ok = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
            (ok && !name.is_empty()).then(|| (name.to_string(), hash.to_ascii_lowercase()))
        });
        match parsed {
            Some(entry) => out.push(entry),
            None => {
                return Err(DataError::invalid(
                    path,
                    format!("line {} is not `<sha256 hex>  <file name>`; {hint}", n + 1),
                ))
            }
        }
    }
    Ok(out)
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `bytes` as lower-case hex, two digits each (how every digest is written).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `path` and checks its SHA-256 against `expected` (hex), returning
/// the path and the bytes so they are parsed exactly as verified.
pub fn read_verified(path: &Path, expected: &str) -> Result<(PathBuf, Vec<u8>), DataError> {
    read_checked(path, expected, REPAIR_HINT)
}

/// [`read_verified`] with the repair hint for the copy being read.
fn read_checked(path: &Path, expected: &str, hint: &str) -> Result<(PathBuf, Vec<u8>), DataError> {
    let bytes = crate::input::read_bytes(path, FileKind::Dataset)
        .map_err(|e| DataError::from_input(e, hint))?;
    let actual = sha256_hex(&bytes);
    if !actual.eq_ignore_ascii_case(expected) {
        let hint = if bytes.starts_with(LFS_POINTER_PREFIX) {
            "the file is a Git LFS pointer, not the data: run `git lfs pull` (or re-clone with \
             Git LFS installed)"
                .to_string()
        } else {
            hint.to_string()
        };
        return Err(DataError::Checksum {
            path: path.to_path_buf(),
            expected: expected.to_ascii_lowercase(),
            actual,
            hint,
        });
    }
    Ok((path.to_path_buf(), bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sums() {
        let h = "a".repeat(64);
        let text = format!("{h}  one.gz\n\n# comment\n{h} *two.gz\n");
        let s = parse_sha256sums(Path::new("S"), &text).unwrap();
        assert_eq!(s, vec![("one.gz".into(), h.clone()), ("two.gz".into(), h)]);
        let m = parse_sha256sums(Path::new("S"), "zz  f\n")
            .unwrap_err()
            .to_string();
        assert!(m.contains("line 1"), "{m}");
    }

    #[test]
    fn sha_of_empty() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
