//! `dptrain data pack`: an ImageFolder written as one packed file (see the module above for
//! the layout).
//!
//! Each image is decoded as an ImageFolder decodes it ([`crate::data::decode`]: any size, EXIF
//! orientation applied, greyscale or RGB by the ImageFolder's rule), shrunk so its longer side is at most `--max-side`
//! (aspect kept; `fast_image_resize`, Lanczos-3), and stored raw or as JPEG by the rule of
//! [`StoreAs`]: a JPEG file that needs no change is stored as it is, others are encoded at the
//! quality asked for with 4:2:0 chroma subsampling (`jpeg-encoder`; PIL's default too). Images are encoded on the rayon pool a chunk at a time and written in order,
//! so the file's sample order is the ImageFolder's (class by class, names sorted) and sample
//! `i` of `--dataset packed:F` is sample `i` of `--dataset imagefolder` on the same folder.
//!
//! The file appears under its name only when complete ([`crate::output::AtomicFile`]): a
//! failure (a bad image, a full disk) or a kill leaves no half file behind.

use super::{Encoding, Header, Index, Record, HEADER_LEN, SAMPLE_ALIGN};
use crate::data::decode::{DecodedImage, Decoder, ImageFormat};
use crate::data::image_folder::ImageFolder;
use crate::data::{DataError, Split};
use crate::output::AtomicFile;
use rayon::prelude::*;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// `--max-side` when none is given: ImageNet training crops (224) come from images of about
/// this size, and decoding a 256-pixel JPEG costs a quarter of a 500x375 one.
pub const DEFAULT_MAX_SIDE: usize = 256;
/// Largest `--max-side` (the image cap's side).
pub const MAX_SIDE_CAP: usize = 4096;
/// JPEG quality when none is given (as FFCV's default, 90).
pub const DEFAULT_QUALITY: u8 = 90;
/// A sample is stored raw when its raw bytes are at most this many times its JPEG's. Raw costs
/// no decoding at all (a slice of the mapping, against about a millisecond per 256-pixel JPEG),
/// so it wins whenever the file stays near the size JPEGs would give: small images (28x28
/// greyscale: 784 raw bytes against a JPEG of 600-900 bytes, mostly headers; CIFAR's 32x32
/// RGB, 3 kB against about 1.5 kB) are raw; photos (256x192 RGB: 147 kB against 15-25 kB) are
/// JPEG.
pub const RAW_WITHIN: usize = 2;

/// How samples are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreAs {
    /// Every sample raw (`--raw`): the fastest to read, the largest file; pixels exactly as
    /// decoded (and resized).
    Raw,
    /// JPEG at this quality (1..=100), unless raw is within `RAW_WITHIN` times its size.
    Smaller {
        /// JPEG quality.
        quality: u8,
    },
}

/// Options of [`pack`].
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Longer side of every stored image at most this (1..=4096); smaller images are kept.
    pub max_side: usize,
    /// Raw or JPEG.
    pub store: StoreAs,
    /// Draw a progress bar on stderr (when it is a terminal).
    pub progress: bool,
    /// Leave out the images that cannot be read or decoded (`--skip-bad-samples`), listed in
    /// [`PackSummary::skipped`]; without it they fail the pack, every one named.
    pub skip_bad: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        Self {
            max_side: DEFAULT_MAX_SIDE,
            store: StoreAs::Smaller {
                quality: DEFAULT_QUALITY,
            },
            progress: false,
            skip_bad: false,
        }
    }
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// Training samples.
    pub train: usize,
    /// Test samples.
    pub test: usize,
    /// Classes.
    pub classes: usize,
    /// Channels of every image.
    pub channels: usize,
    /// Samples stored raw.
    pub raw: usize,
    /// Samples stored as JPEG.
    pub jpeg: usize,
    /// Images shrunk to `max_side`.
    pub resized: usize,
    /// Bytes of the file.
    pub bytes: u64,
    /// The test split holds colour images that were stored grey (the training split is grey,
    /// and decides the file's channels, as it decides what training on the folder reads).
    pub test_colour_stored_grey: bool,
    /// Images left out (`skip_bad`), each an error naming its file.
    pub skipped: Vec<String>,
}

/// Images encoded at once on the rayon pool before they are written in order: enough to keep
/// every core busy, few enough that the encoded bytes held stay small.
const CHUNK: usize = 256;

/// One image ready to be written.
struct Encoded {
    bytes: Vec<u8>,
    width: u16,
    height: u16,
    channels: u8,
    encoding: Encoding,
    resized: bool,
}

/// Packs the ImageFolder `dir` (`dir/train/<class>/...`, `dir/test/<class>/...`) into `out`.
pub fn pack(dir: &Path, out: &Path, opts: &PackOptions) -> Result<PackSummary, DataError> {
    let bad = DataError::PackOption;
    // As small as the ImageFolder reader takes: a smaller sample could be packed and trained
    // on, but never read from the folder it came from.
    let min_side = crate::data::decode::MIN_IMAGE_SIDE as usize;
    if !(min_side..=MAX_SIDE_CAP).contains(&opts.max_side) {
        return Err(bad(format!(
            "--max-side {} must be {min_side}..={MAX_SIDE_CAP} (an image is at least \
             {min_side} px a side)",
            opts.max_side
        )));
    }
    if let StoreAs::Smaller { quality } = opts.store {
        if !(1..=100).contains(&quality) {
            return Err(bad(format!("--quality {quality} must be 1..=100")));
        }
    }
    let train = ImageFolder::open(&dir.join("train"), None)?;
    let test = ImageFolder::open(&dir.join("test"), Some(&train.classes))?;
    // Checked (and the temporary file created) before any image is encoded.
    let mut file = AtomicFile::create(out, &super::PACKED_FILE)?;
    // The ImageFolder's rule (grey or colour from a spread of headers), so both read the same
    // pixels.
    let channels = train.channels as u8;
    let bar = progress_bar(opts.progress, train.len() + test.len());
    let mut index = Index {
        classes: train.classes.clone(),
        channels,
        train: Vec::new(),
        test: Vec::new(),
    };
    let written = write_file(file.file(), &[&train, &test], &mut index, opts, &bar)
        .map_err(|e| DataError::Output(file.error("write", e)))?;
    bar.finish_and_clear();
    if !written.bad.is_empty() && !opts.skip_bad {
        return Err(DataError::BadImages {
            dir: dir.to_path_buf(),
            errors: written.bad,
            remedy: "mend or remove them, or give --skip-bad-samples to pack the rest",
        });
    }
    check_kept(&train, &test, &index)?;
    file.commit()?;
    let raw = index
        .train
        .iter()
        .chain(&index.test)
        .filter(|r| r.encoding == Encoding::Raw)
        .count();
    let total = index.train.len() + index.test.len();
    Ok(PackSummary {
        train: index.train.len(),
        test: index.test.len(),
        classes: index.classes.len(),
        channels: usize::from(channels),
        raw,
        jpeg: total - raw,
        resized: written.resized,
        bytes: written.len,
        test_colour_stored_grey: test.channels > train.channels,
        skipped: written.bad,
    })
}

/// Refuses a pack whose left-out images took every training image of a class (training on it
/// could never predict that class; the ImageFolder reader refuses such a class too), or every
/// test image (a packed file's test split must hold images).
fn check_kept(train: &ImageFolder, test: &ImageFolder, index: &Index) -> Result<(), DataError> {
    let left_out = "was left out as unreadable (--skip-bad-samples): mend them";
    if index.test.is_empty() {
        return Err(DataError::invalid(
            &test.root,
            format!("every test image {left_out}, or add readable ones"),
        ));
    }
    let mut kept = vec![false; index.classes.len()];
    for r in &index.train {
        kept[usize::from(r.label)] = true;
    }
    match kept.iter().position(|k| !k) {
        None => Ok(()),
        Some(c) => Err(DataError::invalid(
            train.root.join(&index.classes[c]),
            format!("every training image of this class {left_out}, or remove the class"),
        )),
    }
}

/// What [`write_file`] wrote.
struct Written {
    /// The file's length.
    len: u64,
    /// Images shrunk.
    resized: usize,
    /// The images that could not be read or decoded, each an error naming it (after the first,
    /// without `skip_bad`, the rest are only decoded, to name them all).
    bad: Vec<String>,
}

/// Writes header, samples (the splits of `folders`, training first, their records pushed onto
/// `index`) and index into `f`.
fn write_file(
    f: &mut std::fs::File,
    folders: &[&ImageFolder; 2],
    index: &mut Index,
    opts: &PackOptions,
    bar: &indicatif::ProgressBar,
) -> std::io::Result<Written> {
    let mut w = Writer {
        out: std::io::BufWriter::with_capacity(1 << 20, &mut *f),
        at: HEADER_LEN as u64,
    };
    // A placeholder until the index's place and checksum are known.
    w.out.write_all(&[0u8; HEADER_LEN])?;
    let (mut resized, mut bad) = (0, Vec::new());
    for (split, folder) in [Split::Train, Split::Test].into_iter().zip(folders) {
        for (files, labels) in folder.files.chunks(CHUNK).zip(folder.labels.chunks(CHUNK)) {
            let encoded: Vec<Result<Encoded, DataError>> = files
                .par_iter()
                .map(|p| encode(p, index.channels, opts))
                .collect();
            for (e, &label) in encoded.into_iter().zip(labels) {
                bar.inc(1);
                let e = match e {
                    Ok(e) if bad.is_empty() || opts.skip_bad => e,
                    Ok(_) => continue,
                    Err(why) => {
                        bad.push(why.to_string());
                        continue;
                    }
                };
                resized += usize::from(e.resized);
                let r = w.sample(&e, label)?;
                match split {
                    Split::Train => index.train.push(r),
                    Split::Test => index.test.push(r),
                }
            }
        }
    }
    let index_bytes = index.to_bytes();
    let header = Header {
        index_offset: w.at,
        index_len: index_bytes.len() as u64,
        index_crc: crc32fast::hash(&index_bytes),
        file_len: w.at + index_bytes.len() as u64,
    };
    w.out.write_all(&index_bytes)?;
    w.out.flush()?;
    drop(w);
    f.seek(SeekFrom::Start(0))?;
    f.write_all(&header.to_bytes())?;
    Ok(Written {
        len: header.file_len,
        resized,
        bad,
    })
}

/// Sample bytes going into the file, each at an aligned offset.
struct Writer<W: Write> {
    out: W,
    at: u64,
}

impl<W: Write> Writer<W> {
    /// Pads to the next aligned offset, writes the sample and returns its record.
    fn sample(&mut self, e: &Encoded, label: u8) -> std::io::Result<Record> {
        let pad = self.at.next_multiple_of(SAMPLE_ALIGN) - self.at;
        self.out
            .write_all(&[0u8; SAMPLE_ALIGN as usize][..pad as usize])?;
        self.at += pad;
        let len = u32::try_from(e.bytes.len()).map_err(std::io::Error::other)?;
        let r = Record {
            offset: self.at,
            len,
            crc: crc32fast::hash(&e.bytes),
            width: e.width,
            height: e.height,
            channels: e.channels,
            encoding: e.encoding,
            label: u16::from(label),
        };
        self.out.write_all(&e.bytes)?;
        self.at += u64::from(len);
        Ok(r)
    }
}

/// The progress bar of a pack (hidden unless asked for and stderr is a terminal).
fn progress_bar(show: bool, total: usize) -> indicatif::ProgressBar {
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} images  {per_sec}  ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    crate::input::read_bytes(path, crate::input::FileKind::Image).map_err(DataError::Input)
}

/// Decodes, orients, shrinks and encodes one image.
fn encode(path: &Path, channels: u8, opts: &PackOptions) -> Result<Encoded, DataError> {
    let bytes = read_file(path)?;
    let mut img = DecodedImage::default();
    // A photo larger than --max-side needs no more than the shrunk size decoded (a JPEG then
    // decodes at 1/2 to 1/8 scale, PIL's draft mode, before the Lanczos shrink).
    let full = crate::data::decode::read_info(&bytes, path)?;
    let (w, h) = (full.width as usize, full.height as usize);
    let target = shrunk_size(w, h, opts.max_side);
    let min_size = target.unwrap_or((w, h));
    let info = Decoder::default().decode(
        &bytes,
        path,
        usize::from(channels),
        Some(min_size),
        &mut img,
    )?;
    let (w, h, hwc) = (img.width, img.height, img.pixels);
    let (hwc, w, h, resized) = match target {
        None => (hwc, w, h, false),
        Some(size) => {
            let hwc = shrink(&hwc, (w, h), usize::from(channels), size)
                .map_err(|e| DataError::invalid(path, format!("cannot resize: {e}")))?;
            (hwc, size.0, size.1, true)
        }
    };
    let (width, height) = (w as u16, h as u16);
    let raw = |bytes| Encoded {
        bytes,
        width,
        height,
        channels,
        encoding: Encoding::Raw,
        resized,
    };
    let StoreAs::Smaller { quality } = opts.store else {
        return Ok(raw(hwc));
    };
    // A JPEG that needs no change (not shrunk, not rotated, the pack's channels) is kept as it
    // is: no second generation of JPEG loss, the same bytes the ImageFolder decodes.
    let keep = !resized
        && info.format == ImageFormat::Jpeg
        && info.orientation <= 1
        && info.channels == usize::from(channels);
    let jpeg = if keep {
        bytes
    } else {
        let color = if channels == 1 {
            jpeg_encoder::ColorType::Luma
        } else {
            jpeg_encoder::ColorType::Rgb
        };
        let mut jpeg = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut jpeg, quality);
        encoder.set_sampling_factor(jpeg_encoder::SamplingFactor::R_4_2_0);
        encoder
            .encode(&hwc, width, height, color)
            .map_err(|e| DataError::invalid(path, format!("cannot encode as JPEG: {e}")))?;
        jpeg
    };
    if hwc.len() <= RAW_WITHIN * jpeg.len() {
        return Ok(raw(hwc));
    }
    Ok(Encoded {
        bytes: jpeg,
        encoding: Encoding::Jpeg,
        ..raw(Vec::new())
    })
}

/// The size a `w x h` image is shrunk to so that its longer side is `max_side` (aspect kept,
/// each side rounded), or `None` when it already fits. The shorter side stays at least the
/// ImageFolder reader's minimum ([`crate::data::decode::MIN_IMAGE_SIDE`]; `max_side` is no
/// less, and both sides of an image read are): a 1200 x 6 strip packed at 256 becomes
/// 256 x 4, not 256 x 1, a sample its folder could never have held.
fn shrunk_size(w: usize, h: usize, max_side: usize) -> Option<(usize, usize)> {
    let long = w.max(h);
    if long <= max_side {
        return None;
    }
    let min_side = crate::data::decode::MIN_IMAGE_SIDE as usize;
    let scale = max_side as f64 / long as f64;
    let side = |s: usize| ((s as f64 * scale).round() as usize).clamp(min_side, max_side);
    Some((side(w), side(h)))
}

/// `hwc` (w x h x c) resized to `nw x nh` (Lanczos-3).
fn shrink(
    hwc: &[u8],
    (w, h): (usize, usize),
    c: usize,
    (nw, nh): (usize, usize),
) -> Result<Vec<u8>, String> {
    use fast_image_resize as fr;
    let pixel = if c == 1 {
        fr::PixelType::U8
    } else {
        fr::PixelType::U8x3
    };
    let src =
        fr::images::ImageRef::new(w as u32, h as u32, hwc, pixel).map_err(|e| e.to_string())?;
    let mut dst = fr::images::Image::new(nw as u32, nh as u32, pixel);
    let options =
        fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Lanczos3));
    fr::Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| e.to_string())?;
    Ok(dst.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shrunk_image_keeps_the_readers_smallest_side() {
        assert_eq!(shrunk_size(1200, 6, 256), Some((256, 4)));
        assert_eq!(shrunk_size(6, 5000, 256), Some((4, 256)));
        assert_eq!(shrunk_size(1024, 512, 256), Some((256, 128)));
        assert_eq!(shrunk_size(200, 100, 256), None);
    }
}
