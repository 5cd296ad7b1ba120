//! One PNG or JPEG, from its bytes, into interleaved `u8` pixels (1 or 3 channels) of any
//! size, with the EXIF orientation applied; and the resampling every resize goes through.
//!
//! - Decoders: the `image` crate's (PNG through `png`, JPEG through `zune-jpeg`) at full size;
//!   `jpeg-decoder` reads a JPEG's header (size, components: CMYK is refused, EXIF) and decodes
//!   at 1/2, 1/4 or 1/8 scale in its IDCT ([`jpeg_decoder::Decoder::scale`]) when the caller
//!   says a smaller image is enough (PIL's draft mode; `zune-jpeg` 0.5 has no scaled decode).
//! - Colour: greyscale, RGB, RGBA, palette (expanded by `png`), 8 or 16 bits, become the
//!   caller's channel count: alpha is dropped (PIL's `convert("RGB")`, what torchvision's
//!   loader does), 16-bit samples are rounded to 8, RGB to grey uses PIL's ITU-R 601-2 weights.
//! - Sizes are checked from the header before anything is decoded: at most
//!   [`MAX_IMAGE_PIXELS`] for a PNG or a progressive JPEG, [`MAX_JPEG_PIXELS`] for a baseline
//!   JPEG (a camera's photo, decoded reduced) (a ~100-byte PNG that claims 65535 x 65535 is
//!   refused before it allocates), and at least [`MIN_IMAGE_SIDE`] a side; what is decoded
//!   (a JPEG at its reduced scale) is at most [`MAX_IMAGE_PIXELS`]; the decoders' own
//!   allocations are capped at [`MAX_DECODE_BYTES`].
//! - Buffers: [`Decoder`] (one per loader thread) and [`DecodedImage`] keep theirs between
//!   images, so our side allocates nothing once they have grown to the largest image. The
//!   decoders allocate their own state per image (both crates build tables per file;
//!   `jpeg-decoder` returns a fresh `Vec`).

use image::{ColorType, ImageDecoder};
use std::io::Cursor;
use std::path::{Path, PathBuf};

/// Most pixels one image may have (4096 x 4096 = 16.8 M, 48 MiB decoded as RGB). Checked from
/// the header before anything is decoded or allocated: a ~100-byte PNG whose header claims
/// 65535 x 65535 pixels otherwise made the loader allocate 1.29 TB for the split (4.3 G pixels
/// per image). Datasets this trainer trains on are far smaller (MNIST 28 x 28, ImageNet crops
/// a few hundred pixels a side).
pub const MAX_IMAGE_PIXELS: u64 = 4096 * 4096;

/// Most pixels a baseline JPEG may claim (8192 x 8192 = 67 M: a 61-megapixel camera's
/// 9504 x 6336 photo is within). Such a photo is decoded reduced (the scale the model's input
/// needs, [`Decoder::decode`]'s `min_size`), which must then be at most [`MAX_IMAGE_PIXELS`]:
/// `jpeg-decoder` decodes a baseline JPEG row by row into planes of the reduced size, so its
/// memory is the reduced image's. A progressive JPEG keeps every DCT coefficient of the full
/// image while it decodes (2 bytes a sample) and a PNG decodes whole, so both stay at
/// [`MAX_IMAGE_PIXELS`].
pub const MAX_JPEG_PIXELS: u64 = 8192 * 8192;

/// What a decoder itself may allocate for one file (`image::Limits::max_alloc`,
/// `jpeg_decoder::Decoder::set_max_decoding_buffer_size`): the largest image at 8 bytes a
/// pixel (16-bit RGBA, the widest layout a PNG decodes to) plus 16 MiB of decoder state.
pub const MAX_DECODE_BYTES: u64 = MAX_IMAGE_PIXELS * 8 + (16 << 20);

/// Smallest side an image may have, in pixels. An image of 1 to 3 pixels a side holds no
/// content a CNN can learn from once it is scaled up to the model's input (a 1x1 "image" is a
/// colour swatch: a tracking pixel, a broken thumbnail); refusing it names the file instead of
/// training on noise. The bar is 4, not a JPEG block's 8, because small synthetic ImageFolders
/// (6x7 fixtures, icon sets) are legitimate.
pub const MIN_IMAGE_SIDE: u32 = 4;

/// Why one image could not be decoded. Every variant names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// An empty file (0 bytes): a copy or download that never finished, most often.
    #[error("{}: is empty (0 bytes), not an image; copy it again, or remove it", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Neither the PNG nor the JPEG signature.
    #[error("{}: is neither PNG nor JPEG data (its first bytes match neither signature); convert it to PNG or JPEG, or remove it", path.display())]
    NotAnImage {
        /// The file.
        path: PathBuf,
    },
    /// A JPEG with four colour components (CMYK or YCCK, print separations).
    #[error("{}: is a CMYK JPEG, which has no defined RGB conversion without its colour profile; convert it to RGB (e.g. `convert IN -colorspace sRGB OUT.jpg`) or remove it", path.display())]
    Cmyk {
        /// The file.
        path: PathBuf,
    },
    /// Fewer than [`MIN_IMAGE_SIDE`] pixels on a side.
    #[error("{}: is {width}x{height} pixels; images need at least {min} pixels a side (a smaller one holds nothing a CNN can learn from or classify: a colour swatch, a tracking pixel); leave it out", path.display(), min = MIN_IMAGE_SIDE)]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Width in its header.
        width: u32,
        /// Height in its header.
        height: u32,
    },
    /// More pixels in the header than its kind may have ([`MAX_IMAGE_PIXELS`],
    /// [`MAX_JPEG_PIXELS`]).
    #[error("{}: claims {width}x{height} pixels in its header, more than the {side}x{side} {kind} may have: the file is damaged, or the image is too large (resize it)", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Width in its header.
        width: u32,
        /// Height in its header.
        height: u32,
        /// "a PNG", "a baseline JPEG", "a progressive or lossless JPEG".
        kind: &'static str,
        /// The side of the square of most pixels it may have.
        side: u32,
    },
    /// A photo that would decode to more than [`MAX_IMAGE_PIXELS`] at the scale the input
    /// size needs.
    #[error("{}: is {width}x{height} pixels, and this input size needs it decoded at {}, {decoded_width}x{decoded_height} pixels, more than the 4096x4096 an image is decoded to: resize the image, or use a smaller input size (train --image-size, data pack --max-side)", path.display(), scale_words(*factor))]
    TooLargeToDecode {
        /// The file.
        path: PathBuf,
        /// Width in its header (as displayed).
        width: u32,
        /// Height in its header.
        height: u32,
        /// The reduction the input size allows (1: none).
        factor: usize,
        /// Width it would decode to.
        decoded_width: usize,
        /// Height it would decode to.
        decoded_height: usize,
    },
    /// A JPEG whose data ends before its end-of-image marker.
    #[error("{}: is a truncated JPEG (no end-of-image marker after its last scan): the file was cut short; replace or remove it", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
    },
    /// The decoder refused the data.
    #[error("{}: cannot decode this {format}: {cause}; the file is damaged: replace or remove it", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// "PNG" or "JPEG".
        format: &'static str,
        /// The decoder's message.
        cause: String,
    },
}

impl DecodeError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Empty { path }
            | Self::NotAnImage { path }
            | Self::Cmyk { path }
            | Self::TooSmall { path, .. }
            | Self::TooLarge { path, .. }
            | Self::TooLargeToDecode { path, .. }
            | Self::Truncated { path }
            | Self::Corrupt { path, .. } => path,
        }
    }
}

/// A decoder's message as a user reads it. The `png` crate prints a chunk's type as Rust debug
/// text (`ChunkType { type: IDAT, critical: true, .. }`) and `image` prefixes its own wrapper
/// ("Format error decoding Png: "), which says again what the error's text already says; both
/// are only reworded here, for display (the error stays [`DecodeError::Corrupt`]).
fn decoder_message(e: impl std::fmt::Display) -> String {
    let mut text = e.to_string();
    for wrapper in [
        "Format error decoding Png: ",
        "Format error decoding Jpeg: ",
    ] {
        if let Some(rest) = text.strip_prefix(wrapper) {
            text = rest.to_string();
        }
    }
    const CHUNK: &str = "ChunkType { type: ";
    while let Some(at) = text.find(CHUNK) {
        let Some(len) = text[at..].find('}') else {
            break;
        };
        let inner = &text[at + CHUNK.len()..at + len];
        let name = inner.split(',').next().unwrap_or("").trim();
        text = format!("{}'{name}'{}", &text[..at], &text[at + len + 1..]);
    }
    text.trim_end_matches('.').to_string()
}

/// "full size" or "1/N scale".
fn scale_words(factor: usize) -> String {
    if factor == 1 {
        "full size".into()
    } else {
        format!("1/{factor} scale")
    }
}

/// The two formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// PNG.
    Png,
    /// JPEG (baseline or progressive).
    Jpeg,
}

impl ImageFormat {
    /// By content (the signature), not by the file's name.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Self::Png)
        } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
            Some(Self::Jpeg)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Png => "PNG",
            Self::Jpeg => "JPEG",
        }
    }
}

/// File extensions (lower case) taken as images where directories are listed (an
/// ImageFolder's class directories, `predict`'s walk): the formats read.
pub const IMAGE_EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// Extensions (lower case) of image formats not read: torchvision's ImageFolder loads the
/// first six (its `IMG_EXTENSIONS`, through PIL), and phones and cameras write the others. A
/// listing counts files of these to say they were left out, rather than drop photos silently.
const UNREAD_IMAGE_EXTENSIONS: [&str; 11] = [
    "bmp", "ppm", "pgm", "tif", "tiff", "webp", "gif", "heic", "heif", "avif", "jxl",
];

/// What a listed file's name says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedFile {
    /// A PNG or JPEG by its extension ([`IMAGE_EXTENSIONS`], any case): read.
    Image,
    /// An image of a format not read (`.webp`, `.heic`, ...): left out, and counted.
    UnreadFormat,
    /// Anything else: not an image.
    Other,
}

impl ListedFile {
    /// By `path`'s extension, in any case.
    pub fn of(path: &Path) -> Self {
        let Some(ext) = path.extension() else {
            return Self::Other;
        };
        let ext = ext.to_string_lossy().to_ascii_lowercase();
        if IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            Self::Image
        } else if UNREAD_IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            Self::UnreadFormat
        } else {
            Self::Other
        }
    }
}

/// What a listing left out, said of images of unread formats (`files`): how many of each
/// extension, and one of them by name. `None` when there are none.
pub fn unread_formats(files: &[PathBuf]) -> Option<String> {
    let first = files.first()?;
    let mut by_ext: std::collections::BTreeMap<String, usize> = Default::default();
    for f in files {
        let ext = f.extension().unwrap_or_default().to_string_lossy();
        *by_ext.entry(ext.to_ascii_lowercase()).or_default() += 1;
    }
    let counts: Vec<String> = by_ext.iter().map(|(e, n)| format!("{n} .{e}")).collect();
    Some(format!(
        "left out {} in formats dptrain does not read ({}; e.g. {}): it reads PNG and JPEG; \
         convert them to train on or predict them",
        crate::terminal::counted(files.len(), "image"),
        counts.join(", "),
        crate::terminal::one_line(first)
    ))
}

/// What a header says, with the orientation applied to the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The format.
    pub format: ImageFormat,
    /// Width as displayed (after the EXIF orientation).
    pub width: u32,
    /// Height as displayed.
    pub height: u32,
    /// 1 for a greyscale image (with or without alpha), else 3.
    pub channels: usize,
    /// The EXIF orientation tag, 1 (none) to 8.
    pub orientation: u8,
}

/// A decoded image: `height x width x channels` bytes, interleaved (HWC), in a buffer that is
/// reused from image to image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodedImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// 1 (grey) or 3 (RGB).
    pub channels: usize,
    /// `height * width * channels` bytes, row by row, channels interleaved.
    pub pixels: Vec<u8>,
    /// Width of the image at full size (after orientation): differs from `width` when a JPEG
    /// was decoded at a reduced scale.
    pub full_width: usize,
    /// Height of the image at full size (after orientation).
    pub full_height: usize,
}

impl DecodedImage {
    /// Wraps pixels already decoded (`height x width x channels`, interleaved) as an image at
    /// full size, e.g. a packed dataset's raw sample, reusing this image's buffer.
    pub fn set_from_hwc(&mut self, width: usize, height: usize, channels: usize, hwc: &[u8]) {
        assert_eq!(
            hwc.len(),
            width * height * channels,
            "pixels for {width}x{height}x{channels}"
        );
        self.pixels.clear();
        self.pixels.extend_from_slice(hwc);
        (self.width, self.height, self.channels) = (width, height, channels);
        (self.full_width, self.full_height) = (width, height);
    }

    /// [`DecodedImage::set_from_hwc`] for pixels stored with `stored` channels, delivered with
    /// `channels` (grey replicated to RGB, RGB to grey with PIL's weights, as a decoded file's
    /// are): a packed file of grey images read for a colour model.
    pub fn set_from_hwc_as(
        &mut self,
        (width, height, stored): (usize, usize, usize),
        hwc: &[u8],
        channels: usize,
    ) {
        if stored == channels {
            return self.set_from_hwc(width, height, channels, hwc);
        }
        assert_eq!(
            hwc.len(),
            width * height * stored,
            "pixels for {width}x{height}x{stored}"
        );
        let layout = Layout::new(stored, false);
        convert(hwc, layout, width * height, channels, &mut self.pixels);
        (self.width, self.height, self.channels) = (width, height, channels);
        (self.full_width, self.full_height) = (width, height);
    }

    /// Same as [`DecodedImage::set_from_hwc`] from planes (C x H x W, an in-memory dataset's
    /// layout).
    pub fn set_from_chw(&mut self, width: usize, height: usize, channels: usize, chw: &[u8]) {
        let plane = width * height;
        assert_eq!(
            chw.len(),
            plane * channels,
            "pixels for {channels}x{height}x{width}"
        );
        self.pixels.resize(chw.len(), 0);
        if channels == 1 {
            self.pixels.copy_from_slice(chw);
        } else {
            for (p, px) in self.pixels.chunks_exact_mut(channels).enumerate() {
                for (c, v) in px.iter_mut().enumerate() {
                    *v = chw[c * plane + p];
                }
            }
        }
        (self.width, self.height, self.channels) = (width, height, channels);
        (self.full_width, self.full_height) = (width, height);
    }
}

/// One thread's decoding state: the decoders' output before colour conversion and orientation,
/// reused between images.
#[derive(Debug, Default)]
pub struct Decoder {
    raw: Vec<u8>,
    turned: Vec<u8>,
}

/// The header of `bytes` (named `path` in errors), checked: a known format, not CMYK, within
/// [`MIN_IMAGE_SIDE`] and [`MAX_IMAGE_PIXELS`].
pub fn read_info(bytes: &[u8], path: &Path) -> Result<ImageInfo, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty {
            path: path.to_path_buf(),
        });
    }
    let format = ImageFormat::sniff(bytes).ok_or_else(|| DecodeError::NotAnImage {
        path: path.to_path_buf(),
    })?;
    let corrupt = |cause: String| DecodeError::Corrupt {
        path: path.to_path_buf(),
        format: format.name(),
        cause,
    };
    let (w, h, channels, orientation, cap) = match format {
        ImageFormat::Jpeg => {
            let d = jpeg_header(bytes, path)?;
            let info = d.info().ok_or_else(|| corrupt("no frame header".into()))?;
            let cap = if info.coding_process == jpeg_decoder::CodingProcess::DctSequential {
                HeaderCap::BASELINE_JPEG
            } else {
                HeaderCap::OTHER_JPEG
            };
            let channels = match info.pixel_format {
                jpeg_decoder::PixelFormat::L8 | jpeg_decoder::PixelFormat::L16 => 1,
                jpeg_decoder::PixelFormat::RGB24 => 3,
                jpeg_decoder::PixelFormat::CMYK32 => {
                    return Err(DecodeError::Cmyk {
                        path: path.to_path_buf(),
                    })
                }
            };
            let orientation = d
                .exif_data()
                .and_then(image::metadata::Orientation::from_exif_chunk)
                .map_or(1, |o| o.to_exif());
            (
                u32::from(info.width),
                u32::from(info.height),
                channels,
                orientation,
                cap,
            )
        }
        ImageFormat::Png => {
            // The header's size before the decoder's: past 2^31 a side its allocation limit
            // refuses first, as "memory limit exceeded" (a damaged or hostile header).
            if let Some((w, h)) = png_header_size(bytes) {
                check_size(path, w, h, HeaderCap::PNG)?;
            }
            let mut d = png_decoder(bytes, path)?;
            let (w, h) = d.dimensions();
            check_size(path, w, h, HeaderCap::PNG)?;
            let channels = if is_grey(d.color_type()) { 1 } else { 3 };
            let orientation = d.orientation().map_or(1, |o| o.to_exif());
            (w, h, channels, orientation, HeaderCap::PNG)
        }
    };
    check_size(path, w, h, cap)?;
    let (width, height) = if orientation >= 5 { (h, w) } else { (w, h) };
    Ok(ImageInfo {
        format,
        width,
        height,
        channels,
        orientation,
    })
}

/// How many pixels a header may claim, by kind of image.
#[derive(Debug, Clone, Copy)]
struct HeaderCap {
    /// As the error names it.
    kind: &'static str,
    /// Most pixels.
    pixels: u64,
}

impl HeaderCap {
    const PNG: Self = Self {
        kind: "a PNG",
        pixels: MAX_IMAGE_PIXELS,
    };
    const BASELINE_JPEG: Self = Self {
        kind: "a baseline JPEG",
        pixels: MAX_JPEG_PIXELS,
    };
    const OTHER_JPEG: Self = Self {
        kind: "a progressive or lossless JPEG",
        pixels: MAX_IMAGE_PIXELS,
    };
}

/// Refuses a size under [`MIN_IMAGE_SIDE`] a side or over `cap`'s pixels.
fn check_size(path: &Path, width: u32, height: u32, cap: HeaderCap) -> Result<(), DecodeError> {
    if u64::from(width) * u64::from(height) > cap.pixels {
        return Err(DecodeError::TooLarge {
            path: path.to_path_buf(),
            width,
            height,
            kind: cap.kind,
            side: cap.pixels.isqrt() as u32,
        });
    }
    if width.min(height) < MIN_IMAGE_SIDE {
        return Err(DecodeError::TooSmall {
            path: path.to_path_buf(),
            width,
            height,
        });
    }
    Ok(())
}

fn is_grey(c: ColorType) -> bool {
    matches!(
        c,
        ColorType::L8 | ColorType::La8 | ColorType::L16 | ColorType::La16
    )
}

fn limits() -> image::Limits {
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits
}

/// The width and height a PNG's first chunk (IHDR, right after the 8-byte signature: its
/// length, its type, then width and height, big-endian) declares, if it is there.
fn png_header_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let ihdr = bytes.get(8..24)?;
    // IHDR's data is 13 bytes: another length is a damaged chunk, the decoder's to name.
    if ihdr[0..4] != [0, 0, 0, 13] || &ihdr[4..8] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&ihdr[8..12]), be(&ihdr[12..16])))
}

fn png_decoder<'a>(
    bytes: &'a [u8],
    path: &Path,
) -> Result<image::codecs::png::PngDecoder<Cursor<&'a [u8]>>, DecodeError> {
    image::codecs::png::PngDecoder::with_limits(Cursor::new(bytes), limits()).map_err(|e| {
        DecodeError::Corrupt {
            path: path.to_path_buf(),
            format: "PNG",
            cause: decoder_message(e),
        }
    })
}

/// A `jpeg-decoder` with its header read (and its allocations capped).
fn jpeg_header<'a>(
    bytes: &'a [u8],
    path: &Path,
) -> Result<jpeg_decoder::Decoder<Cursor<&'a [u8]>>, DecodeError> {
    let mut d = jpeg_decoder::Decoder::new(Cursor::new(bytes));
    d.set_max_decoding_buffer_size(MAX_DECODE_BYTES as usize);
    d.read_info().map_err(|e| DecodeError::Corrupt {
        path: path.to_path_buf(),
        format: "JPEG",
        cause: decoder_message(e),
    })?;
    Ok(d)
}

/// True when a JPEG's last scan (SOS, FF DA) is followed by an end-of-image marker (FF D9).
/// Entropy-coded data cannot hold FF D9 (an FF byte there is stuffed as FF 00), so a file cut
/// inside its scan data has none after the last SOS. The decoders fill a cut scan with grey
/// instead of failing, which would train on half images silently.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let last_sos = bytes.windows(2).rposition(|w| w == [0xff, 0xda]);
    match last_sos {
        Some(p) => bytes[p..].windows(2).any(|w| w == [0xff, 0xd9]),
        None => false,
    }
}

impl Decoder {
    /// Decodes `bytes` (the file `path`, named in errors) into `out` with `channels` (1 or 3)
    /// channels, the EXIF orientation applied. `min_size` (width, height, as displayed) allows
    /// a JPEG to be decoded at 1/2, 1/4 or 1/8 scale, the smallest that is still at least that
    /// large on both sides; `None` decodes at full size. `out.full_width`/`full_height` give
    /// the full size either way.
    pub fn decode(
        &mut self,
        bytes: &[u8],
        path: &Path,
        channels: usize,
        min_size: Option<(usize, usize)>,
        out: &mut DecodedImage,
    ) -> Result<ImageInfo, DecodeError> {
        assert!(channels == 1 || channels == 3, "1 or 3 channels");
        let info = read_info(bytes, path)?;
        let corrupt = |cause: String| DecodeError::Corrupt {
            path: path.to_path_buf(),
            format: info.format.name(),
            cause,
        };
        // Stored (not displayed) size: the orientation is applied after decoding.
        let (sw, sh) = if info.orientation >= 5 {
            (info.height as usize, info.width as usize)
        } else {
            (info.width as usize, info.height as usize)
        };
        let (mut w, mut h, layout) = match info.format {
            ImageFormat::Jpeg => {
                if !jpeg_is_complete(bytes) {
                    return Err(DecodeError::Truncated {
                        path: path.to_path_buf(),
                    });
                }
                let factor = reduction(info, min_size);
                check_decoded_size(path, info, factor)?;
                if factor > 1 {
                    self.decode_jpeg_scaled(bytes, path, (sw, sh), factor)?
                } else {
                    self.decode_full(bytes, info.format)
                        .map_err(|e| corrupt(decoder_message(e)))?
                }
            }
            ImageFormat::Png => self
                .decode_full(bytes, info.format)
                .map_err(|e| corrupt(decoder_message(e)))?,
        };
        convert(&self.raw, layout, w * h, channels, &mut out.pixels);
        if info.orientation > 1 {
            orient(
                &mut out.pixels,
                &mut self.turned,
                (w, h, channels),
                info.orientation,
            );
            if info.orientation >= 5 {
                std::mem::swap(&mut w, &mut h);
            }
        }
        (out.width, out.height, out.channels) = (w, h, channels);
        (out.full_width, out.full_height) = (info.width as usize, info.height as usize);
        Ok(info)
    }

    /// Full size through the `image` crate's decoder, into `self.raw`.
    fn decode_full(
        &mut self,
        bytes: &[u8],
        format: ImageFormat,
    ) -> Result<(usize, usize, Layout), image::ImageError> {
        fn read(
            d: impl ImageDecoder,
            raw: &mut Vec<u8>,
        ) -> image::ImageResult<(usize, usize, Layout)> {
            let (w, h) = d.dimensions();
            let layout = Layout::of(d.color_type());
            raw.resize(d.total_bytes() as usize, 0);
            d.read_image(raw)?;
            Ok((w as usize, h as usize, layout))
        }
        match format {
            ImageFormat::Png => read(
                image::codecs::png::PngDecoder::with_limits(Cursor::new(bytes), limits())?,
                &mut self.raw,
            ),
            ImageFormat::Jpeg => {
                let mut d = image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes))?;
                d.set_limits(limits())?;
                read(d, &mut self.raw)
            }
        }
    }

    /// A JPEG at 1/`factor` scale through `jpeg-decoder`'s scaled IDCT, into `self.raw`.
    fn decode_jpeg_scaled(
        &mut self,
        bytes: &[u8],
        path: &Path,
        (sw, sh): (usize, usize),
        factor: usize,
    ) -> Result<(usize, usize, Layout), DecodeError> {
        let corrupt = |e: jpeg_decoder::Error| DecodeError::Corrupt {
            path: path.to_path_buf(),
            format: "JPEG",
            cause: decoder_message(e),
        };
        let mut d = jpeg_header(bytes, path)?;
        let want = |s: usize| s.div_ceil(factor).min(u16::MAX as usize) as u16;
        let (w, h) = d.scale(want(sw), want(sh)).map_err(corrupt)?;
        let px = d.decode().map_err(corrupt)?;
        let layout = match d.info().map(|i| i.pixel_format) {
            Some(jpeg_decoder::PixelFormat::L8) => Layout::new(1, false),
            Some(jpeg_decoder::PixelFormat::RGB24) => Layout::new(3, false),
            _ => {
                return Err(DecodeError::Corrupt {
                    path: path.to_path_buf(),
                    format: "JPEG",
                    cause: "unexpected pixel format after scaling".into(),
                })
            }
        };
        self.raw.clear();
        self.raw.extend_from_slice(&px);
        Ok((w as usize, h as usize, layout))
    }
}

/// Refuses a decode (at 1/`factor` scale) of more than [`MAX_IMAGE_PIXELS`].
fn check_decoded_size(path: &Path, info: ImageInfo, factor: usize) -> Result<(), DecodeError> {
    let (w, h) = (info.width as usize, info.height as usize);
    let (dw, dh) = (w.div_ceil(factor), h.div_ceil(factor));
    if (dw as u64) * (dh as u64) <= MAX_IMAGE_PIXELS {
        return Ok(());
    }
    Err(DecodeError::TooLargeToDecode {
        path: path.to_path_buf(),
        width: info.width,
        height: info.height,
        factor,
        decoded_width: dw,
        decoded_height: dh,
    })
}

/// The largest JPEG scale reduction (1, 2, 4 or 8) whose image is still at least `min_size`.
fn reduction(info: ImageInfo, min_size: Option<(usize, usize)>) -> usize {
    let Some((mw, mh)) = min_size else { return 1 };
    let (w, h) = (info.width as usize, info.height as usize);
    [8, 4, 2]
        .into_iter()
        .find(|&f| w.div_ceil(f) >= mw.max(1) && h.div_ceil(f) >= mh.max(1))
        .unwrap_or(1)
}

/// A decoder's output layout: samples per pixel and whether each is 16 bits (native endian).
#[derive(Debug, Clone, Copy)]
struct Layout {
    samples: usize,
    wide: bool,
}

impl Layout {
    fn new(samples: usize, wide: bool) -> Self {
        Self { samples, wide }
    }

    fn of(c: ColorType) -> Self {
        let wide = c.bytes_per_pixel() as usize > c.channel_count() as usize;
        Self::new(c.channel_count() as usize, wide)
    }
}

/// `n` pixels of `layout` from `raw` into `out` with `channels` channels: alpha dropped,
/// 16 bits rounded to 8, grey replicated to RGB, RGB to grey with PIL's weights
/// (L = (19595 R + 38470 G + 7471 B + 2^15) >> 16, ITU-R 601-2).
fn convert(raw: &[u8], layout: Layout, n: usize, channels: usize, out: &mut Vec<u8>) {
    out.resize(n * channels, 0);
    let bytes = if layout.wide { 2 } else { 1 };
    let stride = layout.samples * bytes;
    let sample = |px: &[u8], k: usize| -> u8 {
        if layout.wide {
            let v = u16::from_ne_bytes([px[2 * k], px[2 * k + 1]]);
            ((u32::from(v) * 255 + 32767) / 65535) as u8
        } else {
            px[k]
        }
    };
    let colour = layout.samples >= 3;
    if !layout.wide && stride == channels {
        out.copy_from_slice(&raw[..n * channels]);
        return;
    }
    for (px, o) in raw.chunks_exact(stride).zip(out.chunks_exact_mut(channels)) {
        match (colour, channels) {
            (false, 1) => o[0] = sample(px, 0),
            (false, _) => o.fill(sample(px, 0)),
            (true, 3) => {
                for (k, v) in o.iter_mut().enumerate() {
                    *v = sample(px, k);
                }
            }
            (true, _) => {
                let (r, g, b) = (
                    u32::from(sample(px, 0)),
                    u32::from(sample(px, 1)),
                    u32::from(sample(px, 2)),
                );
                o[0] = ((19595 * r + 38470 * g + 7471 * b + 0x8000) >> 16) as u8;
            }
        }
    }
}

/// Applies EXIF orientation `tag` (2..=8) to `pixels` (w x h x c, stored), using `spare` as
/// the second buffer. Tags 5 to 8 swap width and height.
fn orient(pixels: &mut Vec<u8>, spare: &mut Vec<u8>, (w, h, c): (usize, usize, usize), tag: u8) {
    spare.resize(pixels.len(), 0);
    let (dw, dh) = if tag >= 5 { (h, w) } else { (w, h) };
    for y in 0..dh {
        for x in 0..dw {
            // The stored pixel shown at (x, y).
            let (sx, sy) = match tag {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                8 => (w - 1 - y, x),
                _ => (x, y),
            };
            let (s, d) = ((sy * w + sx) * c, (y * dw + x) * c);
            spare[d..d + c].copy_from_slice(&pixels[s..s + c]);
        }
    }
    std::mem::swap(pixels, spare);
}

/// A region of a source image, in its pixels (fractional: resampling handles sub-pixel
/// windows as `fast_image_resize` does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Region {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

/// Resampling with `fast_image_resize` (SIMD; convolution with a bilinear filter whose support
/// widens with the reduction, which is PIL's antialiased `BILINEAR`), with its buffers kept
/// between calls.
#[derive(Debug, Default)]
pub struct Resampler {
    resizer: fast_image_resize::Resizer,
}

impl Resampler {
    /// `region` of `src` resized to `width x height` into `dst` (interleaved, `src.channels`).
    /// A region of whole pixels already at the output size is copied exactly.
    pub fn resize(
        &mut self,
        src: &DecodedImage,
        region: Region,
        (width, height): (usize, usize),
        dst: &mut Vec<u8>,
    ) {
        let c = src.channels;
        dst.resize(width * height * c, 0);
        let whole = |v: f64| (v - v.round()).abs() < 1e-9;
        let same = (region.width - width as f64).abs() < 1e-9
            && (region.height - height as f64).abs() < 1e-9;
        if same && whole(region.left) && whole(region.top) {
            let (x0, y0) = (region.left.round() as usize, region.top.round() as usize);
            for y in 0..height {
                let s = ((y0 + y) * src.width + x0) * c;
                dst[y * width * c..(y + 1) * width * c]
                    .copy_from_slice(&src.pixels[s..s + width * c]);
            }
            return;
        }
        use fast_image_resize::{images, FilterType, PixelType, ResizeAlg, ResizeOptions};
        let pt = if c == 1 {
            PixelType::U8
        } else {
            PixelType::U8x3
        };
        let from = images::ImageRef::new(src.width as u32, src.height as u32, &src.pixels, pt)
            .expect("a decoded image's buffer holds its pixels");
        let mut to = images::Image::from_slice_u8(width as u32, height as u32, dst, pt)
            .expect("sized above");
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(region.left, region.top, region.width, region.height);
        self.resizer
            .resize(&from, &mut to, &options)
            .expect("same pixel type, region inside the image");
    }
    /// The whole of `img` resized to `width x height` (aspect not kept) into `out` as C×H×W
    /// planes, through `hwc` (the interleaved result, reused). What a split read whole
    /// (`decode_all` of an ImageFolder or a packed file) does; the input pipeline's transforms
    /// keep the aspect.
    pub fn squash_into_planes(
        &mut self,
        img: &DecodedImage,
        (width, height): (usize, usize),
        hwc: &mut Vec<u8>,
        out: &mut [u8],
    ) {
        let region = Region {
            left: 0.0,
            top: 0.0,
            width: img.width as f64,
            height: img.height as f64,
        };
        self.resize(img, region, (width, height), hwc);
        let plane = width * height;
        if img.channels == 1 {
            out[..plane].copy_from_slice(&hwc[..plane]);
        } else {
            // Interleaved RGB to planes.
            for (p, px) in hwc.chunks_exact(3).enumerate() {
                out[p] = px[0];
                out[plane + p] = px[1];
                out[2 * plane + p] = px[2];
            }
        }
    }
}
