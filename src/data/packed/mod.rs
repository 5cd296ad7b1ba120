//! Packed datasets: a whole ImageFolder in one file that the loaders memory-map (FFCV's idea),
//! so training opens one file once, walks no directories and reads each sample as a slice of
//! the mapping. `dptrain data pack DIR --out FILE` writes it ([`pack`]); `--dataset
//! packed:FILE` trains on it.
//!
//! Layout (little-endian; version [`VERSION`]):
//!
//! ```text
//! 0      header, 64 bytes:  magic "DPTPACK\0" | version u32 | header length u32 (64)
//!                           | index offset u64 | index length u64 | index CRC-32 u32
//!                           | reserved u32 | file length u64 | reserved 12 bytes
//!                           | header CRC-32 u32 (of the 60 bytes before it)
//! 64     samples, each at an offset that is a multiple of 64 (zero padding between), so a
//!        raw sample is an aligned H x W x C u8 slice of the mapping, read in place
//! ...    index (at the end: it is written when every sample's place is known):
//!          classes u32 | channels u8 | 3 reserved bytes
//!          per class: name length u16 | UTF-8 name
//!          train count u64 | test count u64
//!          one 24-byte record per sample, training split first:
//!            offset u64 | length u32 | CRC-32 u32 | width u16 | height u16
//!            | channels u8 | encoding u8 (0 raw HWC, 1 JPEG) | label u16
//! ```
//!
//! Every sample has a CRC-32 (crc32fast, SIMD: several GB/s, so checking a 20 kB JPEG costs a
//! few microseconds against a millisecond to decode it) checked on *every* read, and the
//! header and the index have one each, checked at open. The file is untrusted input: its
//! length is checked against the header, the index against its checksum, and every record
//! (offset and length inside the samples region, alignment, size, channels, label) before any
//! of it is used; nothing is allocated from a count in the file before the count is checked
//! against the bytes that hold it.

mod write;

pub use write::{pack, PackOptions, PackSummary, StoreAs, DEFAULT_MAX_SIDE, DEFAULT_QUALITY};

use super::decode::{DecodedImage, Decoder, Resampler, MAX_IMAGE_PIXELS};
use super::{DataError, Dataset, Split, MAX_CLASSES};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// First bytes of every packed file.
pub const MAGIC: [u8; 8] = *b"DPTPACK\0";

/// A packed dataset dptrain wrote: it starts with [`MAGIC`].
pub const PACKED_FILE: crate::output::Kind = crate::output::Kind {
    what: "a packed dataset dptrain wrote",
    head: MAGIC.len(),
    is_one: |head| head == MAGIC,
};
/// Format version written and read.
pub const VERSION: u32 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 64;
/// Every sample starts at a multiple of this (a cache line; SIMD loads of raw pixels).
pub const SAMPLE_ALIGN: u64 = 64;
/// Bytes of one index record.
const RECORD_LEN: usize = 24;

/// How a sample's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `height x width x channels` bytes, interleaved: no decoding at all.
    Raw,
    /// A baseline JPEG file.
    Jpeg,
}

impl Encoding {
    fn code(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Jpeg => 1,
        }
    }
}

/// One sample's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Byte offset of the sample in the file.
    pub offset: u64,
    /// Bytes of the sample.
    pub len: u32,
    /// CRC-32 of those bytes.
    pub crc: u32,
    /// Image width in pixels.
    pub width: u16,
    /// Image height in pixels.
    pub height: u16,
    /// Channels (1 or 3; every sample of a file has the file's count).
    pub channels: u8,
    /// How the bytes are stored.
    pub encoding: Encoding,
    /// Class label.
    pub label: u16,
}

impl Record {
    fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&self.width.to_le_bytes());
        out.extend_from_slice(&self.height.to_le_bytes());
        out.push(self.channels);
        out.push(self.encoding.code());
        out.extend_from_slice(&self.label.to_le_bytes());
    }

    /// Parses one record (exactly [`RECORD_LEN`] bytes); `None` for an unknown encoding.
    fn parse(b: &[u8]) -> Option<Record> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Record {
            offset: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32_at(8),
            crc: u32_at(12),
            width: u16_at(16),
            height: u16_at(18),
            channels: b[20],
            encoding: match b[21] {
                0 => Encoding::Raw,
                1 => Encoding::Jpeg,
                _ => return None,
            },
            label: u16_at(22),
        })
    }
}

/// The header's variable fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    index_offset: u64,
    index_len: u64,
    index_crc: u32,
    file_len: u64,
}

impl Header {
    fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.index_offset.to_le_bytes());
        h[24..32].copy_from_slice(&self.index_len.to_le_bytes());
        h[32..36].copy_from_slice(&self.index_crc.to_le_bytes());
        h[40..48].copy_from_slice(&self.file_len.to_le_bytes());
        let crc = crc32fast::hash(&h[..HEADER_LEN - 4]);
        h[HEADER_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Checks magic, version, length and checksum of the header at the start of `file`
    /// (`actual_len` bytes long) and returns its fields.
    fn parse(path: &Path, file: &[u8]) -> Result<Header, DataError> {
        let bad = |reason: String| DataError::invalid(path, reason);
        let u32_at = |i: usize| u32::from_le_bytes(file[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(file[i..i + 8].try_into().expect("8 bytes"));
        if file.len() < 8 || file[..8] != MAGIC {
            return Err(bad(
                "is not a packed dataset (it does not start with \"DPTPACK\"); make one with \
                 `dptrain data pack DIR --out FILE`"
                    .into(),
            ));
        }
        if file.len() < HEADER_LEN {
            return Err(bad(format!(
                "is {} bytes, shorter than a packed dataset's {HEADER_LEN}-byte header: the file \
                 is truncated; copy it again or re-pack it",
                file.len()
            )));
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "is a packed dataset of format version {version}; this dptrain reads version \
                 {VERSION}: re-pack it with this dptrain"
            )));
        }
        if crc32fast::hash(&file[..HEADER_LEN - 4]) != u32_at(HEADER_LEN - 4)
            || u32_at(12) as usize != HEADER_LEN
        {
            return Err(bad(
                "is corrupt: its header fails its checksum; re-pack it (dptrain data pack)".into(),
            ));
        }
        let h = Header {
            index_offset: u64_at(16),
            index_len: u64_at(24),
            index_crc: u32_at(32),
            file_len: u64_at(40),
        };
        if h.file_len != file.len() as u64 {
            return Err(bad(format!(
                "is {} bytes but its header says {}: the file is truncated or has bytes \
                 appended (an interrupted copy?); copy it again or re-pack it",
                file.len(),
                h.file_len
            )));
        }
        if h.index_offset < HEADER_LEN as u64
            || h.index_offset.checked_add(h.index_len) != Some(h.file_len)
        {
            return Err(bad(format!(
                "is corrupt: its header places the index at {}..+{} in a file of {} bytes; \
                 re-pack it",
                h.index_offset, h.index_len, h.file_len
            )));
        }
        Ok(h)
    }
}

/// The index: what [`Record`]s the file holds and what they mean.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Index {
    classes: Vec<String>,
    channels: u8,
    train: Vec<Record>,
    test: Vec<Record>,
}

impl Index {
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + (self.train.len() + self.test.len()) * RECORD_LEN);
        out.extend_from_slice(&(self.classes.len() as u32).to_le_bytes());
        out.extend_from_slice(&[self.channels, 0, 0, 0]);
        for c in &self.classes {
            out.extend_from_slice(&(c.len() as u16).to_le_bytes());
            out.extend_from_slice(c.as_bytes());
        }
        out.extend_from_slice(&(self.train.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.test.len() as u64).to_le_bytes());
        for r in self.train.iter().chain(&self.test) {
            r.write_to(&mut out);
        }
        out
    }

    /// Parses and validates the index bytes `b` (already checksummed) of a file whose
    /// samples lie in `HEADER_LEN..samples_end`.
    fn parse(path: &Path, b: &[u8], samples_end: u64) -> Result<Index, DataError> {
        let corrupt = |what: String| {
            DataError::invalid(path, format!("is corrupt: its index {what}; re-pack it"))
        };
        let mut cur = Cursor { b, at: 0 };
        let short = || corrupt("ends early".into());
        let classes = cur.u32().ok_or_else(short)? as usize;
        let head = cur.take(4).ok_or_else(short)?;
        let channels = head[0];
        if !(1..=MAX_CLASSES).contains(&classes) || !matches!(channels, 1 | 3) {
            return Err(corrupt(format!(
                "says {classes} classes of {channels}-channel images (1..={MAX_CLASSES} classes, \
                 1 or 3 channels)"
            )));
        }
        let mut names = Vec::with_capacity(classes);
        for _ in 0..classes {
            let n = cur.u16().ok_or_else(short)? as usize;
            let name = cur.take(n).ok_or_else(short)?;
            let name = std::str::from_utf8(name)
                .map_err(|_| corrupt("has a class name that is not UTF-8".into()))?;
            names.push(name.to_string());
        }
        let train = cur.u64().ok_or_else(short)?;
        let test = cur.u64().ok_or_else(short)?;
        let rest = (b.len() - cur.at) as u64;
        // Checked before anything is allocated from the counts.
        if train
            .checked_add(test)
            .and_then(|n| n.checked_mul(RECORD_LEN as u64))
            != Some(rest)
        {
            return Err(corrupt(format!(
                "says {train} + {test} samples but holds {rest} bytes of records ({RECORD_LEN} each)"
            )));
        }
        let mut records = cur.b[cur.at..]
            .chunks_exact(RECORD_LEN)
            .enumerate()
            .map(|(k, r)| {
                let r = Record::parse(r)
                    .ok_or_else(|| corrupt(format!("gives record {k} an unknown encoding")))?;
                check_record(&r, channels, classes, samples_end)
                    .map_err(|why| corrupt(format!("record {k} {why}")))?;
                Ok(r)
            });
        let train = records
            .by_ref()
            .take(train as usize)
            .collect::<Result<Vec<_>, DataError>>()?;
        let test = records.collect::<Result<Vec<_>, DataError>>()?;
        Ok(Index {
            classes: names,
            channels,
            train,
            test,
        })
    }
}

/// Why a record cannot be used, or `Ok`.
fn check_record(r: &Record, channels: u8, classes: usize, samples_end: u64) -> Result<(), String> {
    let end = r.offset.checked_add(u64::from(r.len));
    if r.offset < HEADER_LEN as u64 || end.is_none_or(|e| e > samples_end) || r.len == 0 {
        return Err(format!(
            "places a sample at {}..+{}, outside the samples region {HEADER_LEN}..{samples_end}",
            r.offset, r.len
        ));
    }
    if !r.offset.is_multiple_of(SAMPLE_ALIGN) {
        return Err(format!(
            "places a sample at {}, not a multiple of {SAMPLE_ALIGN}",
            r.offset
        ));
    }
    let pixels = u64::from(r.width) * u64::from(r.height);
    if pixels == 0 || pixels > MAX_IMAGE_PIXELS || r.channels != channels {
        return Err(format!(
            "describes a {}x{}x{} image (the file's images have {channels} channels, at most \
             4096x4096 pixels)",
            r.width, r.height, r.channels
        ));
    }
    if r.encoding == Encoding::Raw && u64::from(r.len) != pixels * u64::from(channels) {
        return Err(format!(
            "gives a raw {}x{}x{} image {} bytes",
            r.width, r.height, r.channels, r.len
        ));
    }
    if usize::from(r.label) >= classes {
        return Err(format!("has label {} of {classes} classes", r.label));
    }
    Ok(())
}

/// Reads an index: bounds-checked, little-endian.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// An open packed file: the mapping and its validated index. Shared by both splits and every
/// loader thread.
pub struct PackedFile {
    /// The file.
    pub path: PathBuf,
    map: memmap2::Mmap,
    /// Class names; a label is an index into this list.
    pub classes: Vec<String>,
    /// Channels of every image (1 or 3).
    pub channels: usize,
    train: Vec<Record>,
    test: Vec<Record>,
}

impl std::fmt::Debug for PackedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedFile")
            .field("path", &self.path)
            .field("bytes", &self.map.len())
            .field("classes", &self.classes.len())
            .field("train", &self.train.len())
            .field("test", &self.test.len())
            .finish()
    }
}

impl PackedFile {
    /// Opens and maps `path`, checking its header and index (see the module comment).
    pub fn open(path: &Path) -> Result<Arc<PackedFile>, DataError> {
        // A fifo or a device is refused by type before anything is mapped.
        let (file, len) = crate::input::open_regular(path, crate::input::FileKind::PackedDataset)
            .map_err(|e| {
            DataError::from_input(
                e,
                "make a packed dataset with `dptrain data pack DIR --out FILE`",
            )
        })?;
        if len == 0 {
            return Err(DataError::invalid(
                path,
                "is empty, not a packed dataset: re-pack it",
            ));
        }
        // SAFETY: the mapping is read-only, and every read through it is bounds-checked
        // against the length validated here. Another process truncating the file while it is
        // mapped would make a read fault (SIGBUS), as with any memory-mapped reader (FFCV,
        // numpy.memmap); rewriting it in place would show as checksum failures. `data pack`
        // never does either: it writes a new file and renames it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| DataError::Io {
            path: path.into(),
            cause: e,
        })?;
        let h = Header::parse(path, &map)?;
        let index = &map[h.index_offset as usize..];
        if crc32fast::hash(index) != h.index_crc {
            return Err(DataError::invalid(
                path,
                "is corrupt: its index fails its checksum; re-pack it (dptrain data pack)",
            ));
        }
        let ix = Index::parse(path, index, h.index_offset)?;
        // Training reads samples in a shuffled order: read-ahead of the neighbours would only
        // evict pages that are still needed when the file is larger than memory.
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        Ok(Arc::new(PackedFile {
            path: path.to_path_buf(),
            map,
            classes: ix.classes,
            channels: usize::from(ix.channels),
            train: ix.train,
            test: ix.test,
        }))
    }

    /// Bytes of the file.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// The records of `split`.
    pub fn records(&self, split: Split) -> &[Record] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// The bytes of sample `index` of `split`, checked against its CRC-32.
    pub fn sample_bytes(&self, split: Split, index: usize) -> Result<(&Record, &[u8]), DataError> {
        let r = &self.records(split)[index];
        let (start, len) = (r.offset as usize, r.len as usize);
        // One read-ahead request for the whole sample: with the file larger than memory (its
        // pages evicted), touching it page by page otherwise costs one disk read per 4 kB page
        // (the mapping is `Random`). About a microsecond when the pages are cached.
        #[cfg(unix)]
        let _ = self.map.advise_range(memmap2::Advice::WillNeed, start, len);
        // In bounds: every record was checked against the mapping's length at open.
        let bytes = &self.map[start..start + len];
        if crc32fast::hash(bytes) != r.crc {
            return Err(self.corrupt(split, index, "fails its checksum".into()));
        }
        Ok((r, bytes))
    }

    /// The error for a damaged sample, naming it.
    pub fn corrupt(&self, split: Split, index: usize, reason: String) -> DataError {
        let r = &self.records(split)[index];
        DataError::PackedSample {
            path: self.path.clone(),
            split: split_name(split),
            index,
            class: self.classes[usize::from(r.label)].clone(),
            reason,
        }
    }
}

/// "train" or "test".
pub fn split_name(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Test => "test",
    }
}

/// Reusable buffers for reading packed samples whole ([`PackedSplit::image`],
/// [`PackedSplit::read`]), one per thread.
#[derive(Debug, Default)]
pub struct PackedScratch {
    decoder: Decoder,
    image: DecodedImage,
    resampler: Resampler,
    hwc: Vec<u8>,
}

/// One split of a packed file, as a dataset: the samples kept (all, or a `--train-limit`
/// selection) and the size they are delivered at.
#[derive(Debug, Clone)]
pub struct PackedSplit {
    /// The file.
    pub file: Arc<PackedFile>,
    /// Which split.
    pub split: Split,
    /// Indices into the file's split of the samples kept, in order.
    keep: Vec<u32>,
    /// Channels samples are delivered with: the file's unless set (a colour model evaluated
    /// on grey images), converted as a decoded file's are.
    pub channels: usize,
    /// Height samples are delivered at (the image size): the first sample's unless set
    /// ([`PackedSplit::set_size`]), as an ImageFolder's.
    pub height: usize,
    /// Width samples are delivered at.
    pub width: usize,
}

/// Opens a packed file and returns its training and test splits, both delivered at the size
/// of the first training sample (as an ImageFolder's; `set_size` changes it).
pub fn open_pair(path: &Path) -> Result<(PackedSplit, PackedSplit), DataError> {
    let file = PackedFile::open(path)?;
    let train = PackedSplit::of(&file, Split::Train)?;
    let mut test = PackedSplit::of(&file, Split::Test)?;
    test.set_size(train.height, train.width);
    Ok((train, test))
}

impl PackedSplit {
    /// Every sample of `split` of `file`; its shape is its first sample's. A split without
    /// samples is an error.
    pub fn of(file: &Arc<PackedFile>, split: Split) -> Result<PackedSplit, DataError> {
        let records = file.records(split);
        let Some(first) = records.first() else {
            return Err(DataError::invalid(
                &file.path,
                format!(
                    "has no {} samples; pack an ImageFolder whose {0}/ holds images",
                    split_name(split)
                ),
            ));
        };
        Ok(PackedSplit {
            file: file.clone(),
            split,
            keep: (0..records.len() as u32).collect(),
            channels: file.channels,
            height: usize::from(first.height),
            width: usize::from(first.width),
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Class names.
    pub fn classes(&self) -> &[String] {
        &self.file.classes
    }

    /// Bytes per decoded sample: `channels * height * width`.
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Keeps `n` samples, every (len/n)-th (as [`crate::data::image_folder::ImageFolder::truncate`]
    /// does: the file lists samples class by class).
    pub fn truncate(&mut self, n: usize) {
        let len = self.len();
        if n < len {
            self.keep = (0..n).map(|k| self.keep[k * len / n]).collect();
        }
    }

    /// The file's index of sample `i`.
    pub fn file_index(&self, i: usize) -> usize {
        self.keep[i] as usize
    }

    /// Label of sample `i`.
    pub fn label(&self, i: usize) -> u8 {
        self.file.records(self.split)[self.file_index(i)].label as u8
    }

    /// The longest side of the kept samples as stored (0 for none).
    pub fn longest_stored_side(&self) -> usize {
        let records = self.file.records(self.split);
        (self.keep.iter())
            .map(|&k| &records[k as usize])
            .map(|r| usize::from(r.width.max(r.height)))
            .max()
            .unwrap_or(0)
    }

    /// A warning when every kept sample is stored smaller than the size it is delivered at:
    /// each is enlarged, and a pack made with a `--max-side` below the input size has thrown
    /// away the detail the input could hold (a model trained on 64 px photos scored 94%, the
    /// same model 78% on a pack of them at `--max-side 32`).
    pub fn enlarged_warning(&self) -> Option<String> {
        let longest = self.longest_stored_side();
        let wanted = self.height.max(self.width);
        (longest > 0 && longest < wanted).then(|| {
            format!(
                "{}: its {} images are at most {longest} pixels on their longer side and are \
                 read at {}x{}: every one is enlarged; if they were packed with --max-side \
                 {longest} from larger photos, pack again with --max-side {wanted} or more",
                self.file.path.display(),
                split_name(self.split),
                self.height,
                self.width
            )
        })
    }

    /// Samples are delivered at `height x width` from now on (`--image-size`).
    pub fn set_size(&mut self, height: usize, width: usize) {
        (self.height, self.width) = (height, width);
    }

    /// Sample `i`: its record and its bytes, checked against the checksum (raw pixels, or a
    /// JPEG file). A sample that fails it gives [`DataError::PackedSample`], naming it.
    pub fn sample(&self, i: usize) -> Result<(&Record, &[u8]), DataError> {
        self.file.sample_bytes(self.split, self.file_index(i))
    }

    /// The error for sample `i` being damaged.
    pub fn corrupt(&self, i: usize, reason: String) -> DataError {
        self.file.corrupt(self.split, self.file_index(i), reason)
    }

    /// Sample `i` decoded whole (raw pixels copied, a JPEG decoded at full size), at the size
    /// it is stored at.
    pub fn image<'a>(
        &self,
        i: usize,
        scratch: &'a mut PackedScratch,
    ) -> Result<&'a DecodedImage, DataError> {
        let (r, bytes) = self.sample(i)?;
        let (w, h) = (usize::from(r.width), usize::from(r.height));
        match r.encoding {
            Encoding::Raw => {
                let stored = self.file.channels;
                scratch
                    .image
                    .set_from_hwc_as((w, h, stored), bytes, self.channels);
            }
            Encoding::Jpeg => {
                let decoded = scratch.decoder.decode(
                    bytes,
                    &self.file.path,
                    self.channels,
                    None,
                    &mut scratch.image,
                );
                if let Err(e) = decoded {
                    return Err(self.corrupt(i, format!("does not decode ({e})")));
                }
                if (scratch.image.width, scratch.image.height) != (w, h) {
                    let why = format!(
                        "decodes to {}x{}, not the {w}x{h} its index says",
                        scratch.image.width, scratch.image.height
                    );
                    return Err(self.corrupt(i, why));
                }
            }
        }
        Ok(&scratch.image)
    }

    /// Reads sample `i` into `out` (C×H×W, `sample_len()` bytes), the whole image resized to
    /// the split's size where it has another (aspect not kept: what an ImageFolder's `read`
    /// does; the input pipeline's transforms do better).
    pub fn read(
        &self,
        i: usize,
        scratch: &mut PackedScratch,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let (w, h) = (self.width, self.height);
        self.image(i, scratch)?;
        scratch
            .resampler
            .squash_into_planes(&scratch.image, (w, h), &mut scratch.hwc, out);
        Ok(())
    }

    /// Decodes every sample into an in-memory [`Dataset`] (the test split; [`crate::data::load`]).
    pub fn decode_all(&self, name: &str) -> Result<Dataset, DataError> {
        let n = self.sample_len();
        crate::data::check_split_memory(
            &self.file.path,
            self.len(),
            [self.channels, self.height, self.width],
            "use fewer test images (--test-limit) or smaller ones",
        )?;
        let mut pixels = vec![0u8; self.len() * n];
        let mut scratch = PackedScratch::default();
        for (i, out) in pixels.chunks_exact_mut(n.max(1)).enumerate() {
            self.read(i, &mut scratch, out)?;
        }
        Ok(Dataset {
            name: name.to_string(),
            channels: self.channels,
            height: self.height,
            width: self.width,
            num_classes: self.file.classes.len(),
            pixels,
            labels: (0..self.len()).map(|i| self.label(i)).collect(),
        })
    }
}
