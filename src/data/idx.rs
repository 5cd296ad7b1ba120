//! Reader (and a small writer) for IDX files, the format of MNIST and
//! Fashion-MNIST, raw or gzip-compressed.
//!
//! IDX headers are untrusted: a corrupt or hostile file can declare billions
//! of images. Every size taken from a header is therefore checked against
//! what the file can actually hold *before* anything is allocated from it:
//! for raw files against the exact payload length, for gzip files against
//! the most that deflate can expand the compressed bytes to. Decompression
//! reads through `Read::take(expected + 1)` so even a lying stream cannot
//! make us buffer more than the header promised plus one byte (which is how
//! trailing garbage is detected).

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use flate2::bufread::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::data::DataError;

/// Magic number of an IDX file of unsigned bytes with three dimensions
/// (images: count, rows, cols).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;

/// Magic number of an IDX file of unsigned bytes with one dimension (labels).
pub const LABELS_MAGIC: u32 = 0x0000_0801;

/// An IDX file of bytes (as the writer below makes them, of any rank), plain or gzipped:
/// the first 4 bytes, after decompressing, are `00 00 08 rank`.
const IDX_FILE: crate::output::Kind = crate::output::Kind {
    what: "an IDX file",
    head: 4096,
    is_one: |head| {
        let u8_magic = |b: &[u8]| b.len() == 4 && b[..3] == [0, 0, 8] && b[3] > 0;
        if !head.starts_with(&GZIP_MAGIC) {
            return u8_magic(head.get(..4).unwrap_or(head));
        }
        let mut first = [0u8; 4];
        let mut gz = GzDecoder::new(head);
        std::io::Read::read_exact(&mut gz, &mut first).is_ok() && u8_magic(&first)
    },
};

/// First two bytes of every gzip stream; compression is detected from the
/// content, not the file name, because renamed files are common.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Deflate cannot expand data by more than about 1032:1, so a gzip file of
/// `n` bytes cannot decompress to more than `n * 1032` (plus a little for
/// tiny files). Used to reject absurd header counts before allocating.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// Largest payload (in bytes) a gzipped IDX file may declare. Far above any
/// real dataset that fits this trainer's memory, and low enough that a
/// header passing the deflate-ratio check still cannot ask for an absurd
/// buffer. (Raw files need no such cap: their length on disk is the bound.)
pub const MAX_PAYLOAD_BYTES: u64 = 1 << 34;

/// Start of a Git LFS pointer file, recognised so a clone made without LFS
/// gets told to run `git lfs pull` instead of "bad magic".
pub(crate) const LFS_POINTER_PREFIX: &[u8] = b"version https://git-lfs";

/// Image tensor read from an IDX3 file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Image height in pixels.
    pub rows: usize,
    /// Image width in pixels.
    pub cols: usize,
    /// `count * rows * cols` bytes, row-major, image after image.
    pub pixels: Vec<u8>,
}

/// Which of the two IDX layouts we expect; drives magic, rank and wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// IDX3: count x rows x cols.
    Images,
    /// IDX1: count.
    Labels,
}

impl Kind {
    /// Expected magic number.
    fn magic(self) -> u32 {
        match self {
            Kind::Images => IMAGES_MAGIC,
            Kind::Labels => LABELS_MAGIC,
        }
    }

    /// Number of dimensions in the header.
    fn rank(self) -> usize {
        match self {
            Kind::Images => 3,
            Kind::Labels => 1,
        }
    }

    /// Plural noun for messages.
    fn noun(self) -> &'static str {
        match self {
            Kind::Images => "images",
            Kind::Labels => "labels",
        }
    }

    /// The other kind, to recognise swapped image/label paths.
    fn other(self) -> Kind {
        match self {
            Kind::Images => Kind::Labels,
            Kind::Labels => Kind::Images,
        }
    }
}

/// Returns `path` if it exists, else `path` + `.gz` if that exists.
///
/// Lets callers name the canonical uncompressed file and still find the
/// gzipped download (and vice versa when they name the `.gz` and it exists).
pub fn resolve(path: &Path) -> Result<PathBuf, DataError> {
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let mut gz = path.as_os_str().to_owned();
    gz.push(".gz");
    let gz = PathBuf::from(gz);
    if gz.exists() {
        return Ok(gz);
    }
    Err(DataError::NotFound {
        path: path.to_path_buf(),
        hint: format!(
            "neither it nor {} exists; check the dataset directory",
            gz.display()
        ),
    })
}

/// Reads a whole file into memory.
///
/// Its length comes from the file system, not from a header, so it is safe
/// to allocate; the compressed MNIST files are at most a few tens of MB. Only a
/// regular file is read ([`crate::input`]): `/dev/zero` or a fifo is refused.
pub fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    crate::input::read_bytes(path, crate::input::FileKind::Dataset).map_err(|e| {
        DataError::from_input(e, "check the dataset directory, or re-download the file")
    })
}

/// Reads and validates an IDX3 image file (raw or gzipped; `.gz` is tried
/// when `path` is missing).
pub fn read_images(path: &Path) -> Result<IdxImages, DataError> {
    let path = resolve(path)?;
    let bytes = read_file(&path)?;
    parse_images(&path, &bytes)
}

/// Reads and validates an IDX1 label file (raw or gzipped; `.gz` is tried
/// when `path` is missing); every label must be `< num_classes`.
pub fn read_labels(path: &Path, num_classes: usize) -> Result<Vec<u8>, DataError> {
    let path = resolve(path)?;
    let bytes = read_file(&path)?;
    parse_labels(&path, &bytes, num_classes)
}

/// Reads an image file and its label file and checks that they agree in
/// count, so a mismatched pair is caught here and not mid-training.
pub fn read_pair(
    images_path: &Path,
    labels_path: &Path,
    num_classes: usize,
) -> Result<(IdxImages, Vec<u8>), DataError> {
    let images_path = resolve(images_path)?;
    let labels_path = resolve(labels_path)?;
    let images = parse_images(&images_path, &read_file(&images_path)?)?;
    let labels = parse_labels(&labels_path, &read_file(&labels_path)?, num_classes)?;
    check_counts(&images_path, &images, &labels_path, &labels)?;
    Ok((images, labels))
}

/// Errors unless there is exactly one label per image. `images_path` and
/// `labels_path` are only used in the message.
pub fn check_counts(
    images_path: &Path,
    images: &IdxImages,
    labels_path: &Path,
    labels: &[u8],
) -> Result<(), DataError> {
    if images.count != labels.len() {
        return Err(DataError::invalid(
            labels_path,
            format!(
                "declares {} labels but {} declares {} images: the two files do not belong \
                 together; re-download both",
                labels.len(),
                images_path.display(),
                images.count
            ),
        ));
    }
    Ok(())
}

/// Parses the bytes of an IDX3 image file; `path` is only used in messages.
pub fn parse_images(path: &Path, bytes: &[u8]) -> Result<IdxImages, DataError> {
    let (dims, pixels) = parse_tensor(path, bytes, Kind::Images)?;
    Ok(IdxImages {
        count: dims[0],
        rows: dims[1],
        cols: dims[2],
        pixels,
    })
}

/// Parses the bytes of an IDX1 label file and checks every label is
/// `< num_classes`; `path` is only used in messages.
pub fn parse_labels(path: &Path, bytes: &[u8], num_classes: usize) -> Result<Vec<u8>, DataError> {
    let (_, labels) = parse_tensor(path, bytes, Kind::Labels)?;
    check_labels(path, &labels, num_classes)?;
    Ok(labels)
}

/// Errors on the first label `>= num_classes`, naming its index, because
/// an out-of-range label would otherwise index past the logits later on.
pub fn check_labels(path: &Path, labels: &[u8], num_classes: usize) -> Result<(), DataError> {
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= num_classes)
    {
        return Err(DataError::invalid(
            path,
            format!(
                "label {l} at index {i} is out of range: labels must be below {num_classes} \
                 ({num_classes} classes); the file is corrupt or not from this dataset"
            ),
        ));
    }
    Ok(())
}

/// Writes an IDX file of unsigned bytes with the given dimensions, gzipped
/// or raw. Used by tests and tools to produce fixtures; refuses data whose
/// length does not match `dims` so it can never write a corrupt file.
pub fn write_idx_u8(path: &Path, dims: &[u32], data: &[u8], gzip: bool) -> Result<(), DataError> {
    let rank = u8::try_from(dims.len())
        .ok()
        .filter(|&r| r > 0)
        .ok_or_else(|| DataError::invalid(path, "IDX needs between 1 and 255 dimensions"))?;
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize));
    if expected != Some(data.len()) {
        return Err(DataError::invalid(
            path,
            format!(
                "refusing to write {} bytes for dimensions {dims:?}: the data does not match",
                data.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(4 + 4 * dims.len() + data.len());
    buf.extend_from_slice(&[0, 0, 0x08, rank]);
    for d in dims {
        buf.extend_from_slice(&d.to_be_bytes());
    }
    buf.extend_from_slice(data);
    let out = if gzip {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(&buf)
            .and_then(|_| enc.finish())
            .map_err(|e| crate::output::OutputError::Io {
                path: path.to_path_buf(),
                action: "compress",
                cause: e,
            })?
    } else {
        buf
    };
    Ok(crate::output::write_atomically(path, &out, &IDX_FILE)?)
}

/// Human description of a header's declared contents, e.g.
/// "60000 images of 28x28", used in every size-related message.
fn describe(kind: Kind, dims: &[usize]) -> String {
    match kind {
        Kind::Images => format!("{} images of {}x{}", dims[0], dims[1], dims[2]),
        Kind::Labels => format!("{} labels", dims[0]),
    }
}

/// Checks the magic number at the start of `bytes` (at least 4 bytes; more
/// lets a Git LFS pointer be recognised by its full prefix).
fn check_magic(path: &Path, bytes: &[u8], kind: Kind) -> Result<(), DataError> {
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if magic == kind.magic() {
        return Ok(());
    }
    let reason = if bytes.starts_with(LFS_POINTER_PREFIX) {
        "is a Git LFS pointer, not the data: run `git lfs pull` (or re-clone with Git LFS \
         installed)"
            .to_string()
    } else if magic == kind.other().magic() {
        format!(
            "is an IDX {} file, but {} were expected: the image and label paths are swapped",
            kind.other().noun(),
            kind.noun()
        )
    } else {
        format!(
            "has magic number 0x{magic:08x}, but an IDX {} file starts with 0x{:08x}: it is \
             not an IDX {} file of unsigned bytes; check the path or re-download it",
            kind.noun(),
            kind.magic(),
            kind.noun()
        )
    };
    Err(DataError::invalid(path, reason))
}

/// Validates magic and dimensions of a header (`4 + 4 * rank` bytes).
fn check_header(path: &Path, header: &[u8], kind: Kind) -> Result<Vec<usize>, DataError> {
    check_magic(path, header, kind)?;
    let dims: Vec<usize> = header[4..]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    if dims[0] == 0 {
        return Err(DataError::invalid(
            path,
            format!(
                "declares 0 {}: there is nothing to train or test on; re-download it",
                kind.noun()
            ),
        ));
    }
    if dims[1..].contains(&0) {
        return Err(DataError::invalid(
            path,
            format!(
                "declares {}: images must be at least 1x1; the header is corrupt, re-download it",
                describe(kind, &dims)
            ),
        ));
    }
    Ok(dims)
}

/// Bytes of payload the header declares, refusing products that overflow.
fn declared_len(path: &Path, kind: Kind, dims: &[usize]) -> Result<u64, DataError> {
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| {
            DataError::invalid(
                path,
                format!(
                    "declares {}, a size that overflows 64 bits: the header is corrupt; \
                     re-download it",
                    describe(kind, dims)
                ),
            )
        })
}

/// "the file is truncated" message shared by the raw and gzip paths.
fn truncated(path: &Path, kind: Kind, dims: &[usize], expected: u64, got: u64) -> DataError {
    let what = match kind {
        Kind::Images => format!("{expected} bytes of pixels"),
        Kind::Labels => "one byte each".to_string(),
    };
    DataError::invalid(
        path,
        format!(
            "declares {} ({what}) but holds {got} bytes of {}: the file is truncated; \
             re-download it",
            describe(kind, dims),
            kind.noun()
        ),
    )
}

/// Maps an I/O error from the gzip decoder to a message about the file.
fn gzip_error(path: &Path, e: io::Error) -> DataError {
    let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
        "gzip stream ends before its end marker: the file is truncated; re-download it".to_string()
    } else {
        format!("gzip stream is corrupt ({e}): re-download it")
    };
    DataError::invalid(path, reason)
}

/// Parses a raw or gzipped IDX u8 tensor of the given kind, returning its
/// dimensions and payload.
fn parse_tensor(path: &Path, bytes: &[u8], kind: Kind) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let header_len = 4 + 4 * kind.rank();
    if bytes.starts_with(&GZIP_MAGIC) {
        return parse_gzip(path, bytes, kind, header_len);
    }
    // Magic first, on the whole input: a wrong or LFS-pointer file should
    // be called that, not "truncated".
    if bytes.len() >= 4 {
        check_magic(path, bytes, kind)?;
    }
    if bytes.len() < header_len {
        return Err(DataError::invalid(
            path,
            format!(
                "is {} bytes, too short for the {header_len}-byte IDX {} header: the file is \
                 truncated or empty; re-download it",
                bytes.len(),
                kind.noun()
            ),
        ));
    }
    let dims = check_header(path, &bytes[..header_len], kind)?;
    let expected = declared_len(path, kind, &dims)?;
    let payload = &bytes[header_len..];
    let got = payload.len() as u64;
    if got < expected {
        return Err(truncated(path, kind, &dims, expected, got));
    }
    if got > expected {
        return Err(DataError::invalid(
            path,
            format!(
                "has {} trailing bytes after the declared {}: the file is corrupt or not a single \
                 IDX file; re-download it",
                got - expected,
                describe(kind, &dims)
            ),
        ));
    }
    Ok((dims, payload.to_vec()))
}

/// Gzip half of [`parse_tensor`].
fn parse_gzip(
    path: &Path,
    bytes: &[u8],
    kind: Kind,
    header_len: usize,
) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let mut dec = GzDecoder::new(bytes);
    let mut header = vec![0u8; header_len];
    dec.read_exact(&mut header).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            DataError::invalid(
                path,
                format!(
                    "decompresses to less than the {header_len}-byte IDX {} header: the file is \
                     truncated or empty; re-download it",
                    kind.noun()
                ),
            )
        } else {
            gzip_error(path, e)
        }
    })?;
    let dims = check_header(path, &header, kind)?;
    let expected = declared_len(path, kind, &dims)?;
    // The header could still claim far more than the compressed bytes can
    // expand to (or than any sane file holds); reject that before reserving
    // memory for it.
    let possible = (bytes.len() as u64)
        .saturating_mul(MAX_DEFLATE_RATIO)
        .saturating_add(1024)
        .min(MAX_PAYLOAD_BYTES);
    if expected > possible {
        return Err(DataError::invalid(
            path,
            format!(
                "declares {} ({expected} bytes), but a {}-byte gzip file cannot decompress to \
                 that much (at most {possible} bytes are accepted): the header is corrupt or the \
                 file is truncated; re-download it",
                describe(kind, &dims),
                bytes.len()
            ),
        ));
    }
    let cap = usize::try_from(expected + 1).map_err(|_| {
        DataError::invalid(path, "declares more data than this machine can address")
    })?;
    let mut data = Vec::with_capacity(cap);
    (&mut dec)
        .take(expected + 1)
        .read_to_end(&mut data)
        .map_err(|e| gzip_error(path, e))?;
    let got = data.len() as u64;
    if got < expected {
        return Err(truncated(path, kind, &dims, expected, got));
    }
    if got > expected {
        return Err(DataError::invalid(
            path,
            format!(
                "decompresses to more bytes than the declared {}: the file has trailing data or a \
                 corrupt header; re-download it",
                describe(kind, &dims)
            ),
        ));
    }
    // Reaching EOF above made the decoder verify the gzip trailer (CRC and
    // length); anything left in the input after that is not part of it.
    let rest = dec.into_inner();
    if !rest.is_empty() {
        return Err(DataError::invalid(
            path,
            format!(
                "has {} trailing bytes after the gzip stream: the file is corrupt or was \
                 appended to; re-download it",
                rest.len()
            ),
        ));
    }
    Ok((dims, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = magic.to_be_bytes().to_vec();
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn a_file_is_replaced_only_by_an_idx_file_of_bytes_of_any_rank() {
        let dir = tempfile::tempdir().unwrap();
        for gzip in [false, true] {
            let path = dir.path().join(format!("x{gzip}"));
            // Rank 2, then written again over itself.
            for _ in 0..2 {
                write_idx_u8(&path, &[2, 3], &[1; 6], gzip).unwrap();
            }
            // A user's gzip or other file is not an IDX file: kept.
            for other in [gz(b"notes, not an IDX file"), b"\0\0\x0d\x01float".to_vec()] {
                std::fs::write(&path, &other).unwrap();
                let e = write_idx_u8(&path, &[2], &[1, 2], gzip).unwrap_err();
                assert!(e.to_string().contains("is not an IDX file"), "{e}");
                assert_eq!(std::fs::read(&path).unwrap(), other);
            }
        }
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    fn msg<T: std::fmt::Debug>(r: Result<T, DataError>) -> String {
        r.unwrap_err().to_string()
    }

    const P: &str = "x/f";

    #[test]
    fn parses_raw_and_gzip_images() {
        let pixels: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
        let raw = idx(IMAGES_MAGIC, &[2, 3, 4], &pixels);
        for bytes in [raw.clone(), gz(&raw)] {
            let im = parse_images(Path::new(P), &bytes).unwrap();
            assert_eq!((im.count, im.rows, im.cols), (2, 3, 4));
            assert_eq!(im.pixels, pixels);
        }
    }

    #[test]
    fn parses_labels_and_checks_range() {
        let raw = idx(LABELS_MAGIC, &[3], &[0, 9, 5]);
        assert_eq!(parse_labels(Path::new(P), &raw, 10).unwrap(), vec![0, 9, 5]);
        let m = msg(parse_labels(Path::new(P), &raw, 9));
        assert!(m.contains("label 9 at index 1 is out of range"), "{m}");
    }

    #[test]
    fn wrong_magic_and_swapped_files() {
        let raw = idx(0x0000_0903, &[1, 1, 1], &[0]);
        let m = msg(parse_images(Path::new(P), &raw));
        assert!(m.contains("magic number 0x00000903"), "{m}");
        let labels = idx(LABELS_MAGIC, &[1], &[0]);
        let m = msg(parse_images(Path::new(P), &labels));
        assert!(m.contains("swapped"), "{m}");
    }

    #[test]
    fn truncated_and_trailing_raw() {
        let raw = idx(IMAGES_MAGIC, &[2, 2, 2], &[0; 7]);
        let m = msg(parse_images(Path::new(P), &raw));
        assert!(
            m.contains("declares 2 images of 2x2 (8 bytes of pixels) but holds 7"),
            "{m}"
        );
        assert!(m.contains("truncated"), "{m}");
        let raw = idx(IMAGES_MAGIC, &[2, 2, 2], &[0; 9]);
        let m = msg(parse_images(Path::new(P), &raw));
        assert!(m.contains("1 trailing bytes"), "{m}");
        let m = msg(parse_images(Path::new(P), &[0, 0, 8]));
        assert!(m.contains("too short"), "{m}");
    }

    #[test]
    fn huge_counts_do_not_allocate() {
        // 2^31 images of 28x28 in a ~100-byte file: must fail on the size
        // check, never reach an allocation of ~1.6 TB.
        let raw = idx(IMAGES_MAGIC, &[1 << 31, 28, 28], &[0; 84]);
        let m = msg(parse_images(Path::new(P), &raw));
        assert!(m.contains("2147483648 images"), "{m}");
        let m = msg(parse_images(Path::new(P), &gz(&raw)));
        assert!(m.contains("2147483648 images"), "{m}");
        // All dims at u32::MAX overflows u64 multiplication.
        let raw = idx(IMAGES_MAGIC, &[u32::MAX; 3], &[]);
        let m = msg(parse_images(Path::new(P), &raw));
        assert!(m.contains("overflows"), "{m}");
        // A plausible-for-gzip size that the stream does not hold.
        let raw = idx(LABELS_MAGIC, &[5000], &[0; 10]);
        let m = msg(parse_labels(Path::new(P), &gz(&raw), 10));
        assert!(m.contains("declares 5000 labels"), "{m}");
    }

    #[test]
    fn gzip_truncated_trailing_and_corrupt() {
        let pixels: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 251) as u8).collect();
        let raw = idx(IMAGES_MAGIC, &[10, 20, 20], &pixels);
        let z = gz(&raw);
        // Cut anywhere: never a panic, always an error mentioning truncation
        // or corruption.
        for cut in [1, 5, 10, 20, z.len() / 2, z.len() - 4, z.len() - 1] {
            let m = msg(parse_images(Path::new(P), &z[..cut]));
            assert!(
                m.contains("truncated") || m.contains("corrupt"),
                "cut {cut}: {m}"
            );
        }
        let mut t = z.clone();
        t.extend_from_slice(b"junk");
        let m = msg(parse_images(Path::new(P), &t));
        assert!(m.contains("4 trailing bytes after the gzip stream"), "{m}");
        // Valid gzip whose content has trailing bytes after the IDX payload.
        let mut long = raw.clone();
        long.push(1);
        let m = msg(parse_images(Path::new(P), &gz(&long)));
        assert!(m.contains("more bytes than the declared"), "{m}");
        // Flip a byte in the CRC trailer.
        let mut c = z.clone();
        let n = c.len();
        c[n - 6] ^= 0xff;
        let m = msg(parse_images(Path::new(P), &c));
        assert!(m.contains("corrupt"), "{m}");
    }

    #[test]
    fn lfs_pointer_is_named() {
        let ptr = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 9\n";
        let m = msg(parse_images(Path::new(P), ptr));
        assert!(m.contains("git lfs pull"), "{m}");
    }

    #[test]
    fn zero_count_and_zero_size() {
        let m = msg(parse_images(
            Path::new(P),
            &idx(IMAGES_MAGIC, &[0, 2, 2], &[]),
        ));
        assert!(m.contains("declares 0 images"), "{m}");
        let m = msg(parse_images(
            Path::new(P),
            &idx(IMAGES_MAGIC, &[1, 0, 2], &[]),
        ));
        assert!(m.contains("at least 1x1"), "{m}");
    }
}
