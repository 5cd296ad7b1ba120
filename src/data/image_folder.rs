//! ImageFolder datasets: one directory per class holding PNG or JPEG files, as torchvision's
//! `ImageFolder` lays them out:
//!
//! ```text
//! DIR/train/<class>/<any name>.png|.jpg|.jpeg
//! DIR/test/<class>/...
//! ```
//!
//! Classes are the training split's subdirectory names in sorted order (label = position).
//! Unlike the other readers this one is *lazy*: [`ImageFolder::open`] only lists the files and
//! decodes one to learn the shape (and the headers of a spread of them, for grey or colour);
//! each sample is read and decoded when a loader thread asks for
//! it, so decoding is real per-step work that the input pipeline has to hide. Images may have
//! any size: the input pipeline's transforms (`pipeline::Transforms`) take each to the image
//! size, which is the first image's unless `--image-size` sets it ([`ImageFolder::set_size`]);
//! [`ImageFolder::read`] here resizes the whole image to it (what `off` does). Decoding is
//! [`crate::data::decode`]'s.
//!
//! [`super::image_export::export`] writes any in-memory [`Dataset`] pair in this layout (`dptrain data export-images`).

use super::decode::{unread_formats, DecodedImage, Decoder, ListedFile, Resampler};
use super::{DataError, Dataset};
use std::path::{Path, PathBuf};

pub use super::decode::{MAX_DECODE_BYTES, MAX_IMAGE_PIXELS};

/// Most classes an ImageFolder may have: as a packed file ([`super::MAX_CLASSES`]).
const MAX_FOLDER_CLASSES: usize = super::MAX_CLASSES;

/// Images spread over a split whose headers decide grey or colour.
const COLOUR_PROBE: usize = 64;

/// What the headers of a spread of a split's images said ([`ImageFolder::probe_a_spread`]).
struct SpreadProbe {
    /// 3 if any was colour, else 1.
    channels: usize,
    /// The first (width, height) other than the first image's.
    other_size: Option<(usize, usize)>,
}

/// One split of an ImageFolder: the file list, labels and shape; pixels are read on demand.
#[derive(Debug, Clone)]
pub struct ImageFolder {
    /// The split's directory (`DIR/train` or `DIR/test`).
    pub root: PathBuf,
    /// Class names; a label is an index into this list.
    pub classes: Vec<String>,
    /// Image files, class by class, each class's files in name order.
    pub files: Vec<PathBuf>,
    /// Label of each file.
    pub labels: Vec<u8>,
    /// 3 (RGB; alpha is dropped) when any of up to 64 images spread over the
    /// split is colour, else 1 (greyscale). Every image is decoded with this many channels.
    pub channels: usize,
    /// Height samples are delivered at (the image size): the first image's unless set.
    pub height: usize,
    /// Width samples are delivered at.
    pub width: usize,
    /// A (width, height) other than the first image's among the headers of a spread of up
    /// to 64 images (None: all alike, as far as they show): without `--image-size` each
    /// image is stretched to the first one's size.
    pub other_size: Option<(usize, usize)>,
}

/// Reusable buffers for [`ImageFolder::read`], one per thread, so that reading a sample
/// allocates nothing of ours once they have grown to the largest file.
#[derive(Debug, Default)]
pub struct DecodeScratch {
    file: Vec<u8>,
    decoder: Decoder,
    image: DecodedImage,
    resampler: Resampler,
    hwc: Vec<u8>,
}

impl ImageFolder {
    /// Lists `split_dir` (one subdirectory per class), probes its first image for the size and
    /// a spread of images' headers for grey or colour.
    /// `classes` fixes the class list (the test split uses the training split's); `None` takes
    /// this directory's subdirectories.
    pub fn open(split_dir: &Path, classes: Option<&[String]>) -> Result<Self, DataError> {
        let hint = "an ImageFolder needs train/ and test/ directories with one subdirectory \
                    per class; make one with `dptrain data export-images --dataset mnist --out DIR`";
        let entries =
            std::fs::read_dir(split_dir).map_err(|e| DataError::from_io(split_dir, e, hint))?;
        let mut found = Vec::new();
        for e in entries {
            let e = e.map_err(|e| DataError::from_io(split_dir, e, hint))?;
            if e.path().is_dir() {
                found.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        found.sort();
        // A class of the training split with no image could never be learned, only predicted
        // (torchvision's ImageFolder refuses it too); the test split may lack some classes.
        let training = classes.is_none();
        let dirs = class_directories(split_dir, found, classes)?;
        let classes: Vec<String> = dirs.iter().map(|(class, _)| class.clone()).collect();
        if classes.is_empty() {
            return Err(DataError::invalid(
                split_dir,
                format!(
                    "has no class directories{}; an ImageFolder needs 1 to {MAX_FOLDER_CLASSES} \
                     ({hint})",
                    loose_images(split_dir)
                ),
            ));
        }
        if classes.len() > MAX_FOLDER_CLASSES {
            return Err(DataError::invalid(
                split_dir,
                format!(
                    "has {} class directories; dptrain trains at most {MAX_FOLDER_CLASSES} \
                     classes (a label is one byte in its datasets and packed files): merge \
                     classes, or move the others out of train/ and test/",
                    classes.len()
                ),
            ));
        }
        let (mut files, mut labels, mut unread) = (Vec::new(), Vec::new(), Vec::new());
        for (label, (_, dir)) in dirs.iter().enumerate() {
            let listing = class_files(&split_dir.join(dir), hint)?;
            warn_unread_subdirectories(&split_dir.join(dir), listing.subdirs);
            if training && listing.images.is_empty() && classes.len() > 1 {
                return Err(DataError::invalid(
                    split_dir.join(dir),
                    format!(
                        "holds no .png, .jpg or .jpeg files{}: a class of the training split \
                         needs images to be learned; add some, or remove the directory",
                        unread_formats(&listing.unread)
                            .map(|w| format!(" ({w})"))
                            .unwrap_or_default()
                    ),
                ));
            }
            labels.extend(std::iter::repeat_n(label as u8, listing.images.len()));
            files.extend(listing.images);
            unread.extend(listing.unread);
        }
        let left_out = unread_formats(&unread);
        if files.is_empty() {
            return Err(DataError::invalid(
                split_dir,
                format!(
                    "holds no .png, .jpg or .jpeg files in class directories{}{}; {hint}",
                    loose_images(split_dir),
                    left_out.map(|w| format!(" ({w})")).unwrap_or_default()
                ),
            ));
        }
        if let Some(w) = left_out {
            crate::terminal::print_warning(&format!("{}: {w}", split_dir.display()));
        }
        let loose = class_files(split_dir, hint)?.images.len();
        if loose > 0 {
            crate::terminal::print_warning(&format!(
                "{}: {loose} image{} directly in it not read: an ImageFolder reads the images in \
                 its class directories only",
                split_dir.display(),
                if loose == 1 { "" } else { "s" }
            ));
        }
        let mut folder = ImageFolder {
            root: split_dir.to_path_buf(),
            classes,
            files,
            labels,
            channels: 0,
            height: 0,
            width: 0,
            other_size: None,
        };
        // The first image whose header reads sets the size; a bad file before it is reported
        // (or skipped, or listed by `data pack`) later, like any other bad file. A split of
        // which no image reads names them all.
        let mut bad = Vec::new();
        for path in &folder.files {
            match probe(path) {
                Ok(info) => {
                    (folder.width, folder.height) = (info.width as usize, info.height as usize);
                    let spread = folder.probe_a_spread();
                    folder.channels = info.channels.max(spread.channels);
                    folder.other_size = spread.other_size;
                    return Ok(folder);
                }
                Err(e) => bad.push(e.to_string()),
            }
        }
        Err(DataError::BadImages {
            dir: folder.root,
            errors: bad,
            remedy: "that is every image of this split: mend them, or give it readable ones",
        })
    }

    /// The headers of up to [`COLOUR_PROBE`] images spread evenly over the split: 3 channels
    /// if any is colour, else 1 (one grey image first must not turn a colour dataset grey:
    /// PIL's `convert("RGB")`, torchvision's default, reads every image as RGB), and the
    /// first size other than the split's. Files that do not decode are left out; training
    /// reports them.
    fn probe_a_spread(&self) -> SpreadProbe {
        let stride = self.files.len().div_ceil(COLOUR_PROBE).max(1);
        let spread = || self.files.iter().step_by(stride);
        // Each stops at the first that answers it (the colour probe reads whole files, the
        // size probe their first 256 KiB).
        let colour = spread().any(|path| probe(path).is_ok_and(|info| info.channels == 3));
        let other_size = spread()
            .filter_map(|path| header_size(path))
            .find(|&size| size != (self.width, self.height));
        SpreadProbe {
            channels: if colour { 3 } else { 1 },
            other_size,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Bytes per decoded sample: `channels * height * width`.
    pub fn sample_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Keeps `n` samples only (`--train-limit`, `--test-limit`): every (len/n)-th file rather
    /// than the first n, because files are listed class by class and the first n would leave
    /// out whole classes.
    pub fn truncate(&mut self, n: usize) {
        let len = self.len();
        if n >= len {
            return;
        }
        let keep: Vec<usize> = (0..n).map(|k| k * len / n).collect();
        self.files = keep.iter().map(|&i| self.files[i].clone()).collect();
        self.labels = keep.iter().map(|&i| self.labels[i]).collect();
    }

    /// Samples are delivered at `height x width` from now on (`--image-size`).
    pub fn set_size(&mut self, height: usize, width: usize) {
        (self.height, self.width) = (height, width);
    }

    /// The bytes of sample `i`'s file, read into `buf` (reused); returns its path.
    pub fn read_file<'a>(&'a self, i: usize, buf: &mut Vec<u8>) -> Result<&'a Path, DataError> {
        let path = &self.files[i];
        // A file swapped for a fifo or a device since the listing is refused, never blocks.
        crate::input::read_into(path, crate::input::FileKind::Image, buf)
            .map_err(DataError::Input)?;
        Ok(path)
    }

    /// Reads and decodes sample `i` into `out` (C×H×W, `sample_len()` bytes), the whole image
    /// resized to the split's size where it has another (aspect not kept; the input pipeline's
    /// transforms do better). A file that cannot be read, is not a PNG/JPEG, is truncated, too
    /// small or too large gives an error naming it.
    pub fn read(
        &self,
        i: usize,
        scratch: &mut DecodeScratch,
        out: &mut [u8],
    ) -> Result<(), DataError> {
        let path = self.read_file(i, &mut scratch.file)?;
        let (w, h) = (self.width, self.height);
        scratch.decoder.decode(
            &scratch.file,
            path,
            self.channels,
            Some((w, h)),
            &mut scratch.image,
        )?;
        scratch
            .resampler
            .squash_into_planes(&scratch.image, (w, h), &mut scratch.hwc, out);
        Ok(())
    }

    /// Decodes every sample into an in-memory [`Dataset`] (the test split, which evaluation
    /// reads whole every epoch, and [`crate::data::load`]).
    pub fn decode_all(&self, name: &str) -> Result<Dataset, DataError> {
        let n = self.sample_len();
        // The whole split in memory: checked against the machine before allocating it.
        crate::data::check_split_memory(
            &self.root,
            self.len(),
            [self.channels, self.height, self.width],
            "use fewer test images (--test-limit) or smaller ones",
        )?;
        let mut pixels = vec![0u8; self.len() * n];
        let mut scratch = DecodeScratch::default();
        for (i, out) in pixels.chunks_exact_mut(n.max(1)).enumerate() {
            self.read(i, &mut scratch, out)?;
        }
        Ok(Dataset {
            name: name.to_string(),
            channels: self.channels,
            height: self.height,
            width: self.width,
            num_classes: self.classes.len(),
            pixels,
            labels: self.labels.clone(),
        })
    }

    /// Per-channel mean and standard deviation of pixel/255, estimated from up to `max` images
    /// spread evenly over the split (decoding all of them would cost a full epoch at start).
    /// Files that fail to decode are left out of the estimate; they are reported in training.
    pub fn estimate_mean_std(&self, max: usize) -> (Vec<f32>, Vec<f32>) {
        let take = self.len().min(max.max(1));
        let mut probe = Dataset {
            name: "imagefolder".into(),
            channels: self.channels,
            height: self.height,
            width: self.width,
            num_classes: self.classes.len(),
            pixels: Vec::with_capacity(take * self.sample_len()),
            labels: Vec::with_capacity(take),
        };
        let mut scratch = DecodeScratch::default();
        let mut buf = vec![0u8; self.sample_len()];
        for k in 0..take {
            let i = k * self.len() / take;
            if self.read(i, &mut scratch, &mut buf).is_ok() {
                probe.pixels.extend_from_slice(&buf);
                probe.labels.push(self.labels[i]);
            }
        }
        probe.computed_mean_std()
    }
}

/// Warns when the class directory `dir` holds directories (`subdirs` of them): their images are
/// not read (torchvision's ImageFolder reads them; here a class is the images directly in its
/// directory), and a silently smaller dataset would surprise.
fn warn_unread_subdirectories(dir: &Path, subdirs: usize) {
    if subdirs > 0 {
        crate::terminal::print_warning(&format!(
            "{}: {subdirs} director{} in this class not read: an ImageFolder reads the images \
             directly in each class directory; move theirs up to count them",
            dir.display(),
            if subdirs == 1 { "y" } else { "ies" }
        ));
    }
}

/// What to add when `dir` holds images itself rather than in class directories: the count,
/// and where they belong (an empty string when it holds none).
fn loose_images(dir: &Path) -> String {
    match class_files(dir, "").map(|l| l.images.len()) {
        Ok(n) if n > 0 => format!(
            " (it holds {} itself: an ImageFolder keeps each class's images in a \
             directory named after the class, {}/CLASS/NAME.png; `dptrain predict` takes \
             loose images)",
            crate::terminal::counted(n, "image"),
            dir.display()
        ),
        _ => String::new(),
    }
}

/// Each class of the split in label order, with the directory that holds its images: the
/// directories `found` (sorted, as torchvision orders them) when `known` is `None`; else
/// `known`'s classes (the training split's, or a checkpoint's), each read from the directory
/// of the same name, compared as [`same_class_name`] does (a copy made on macOS names its
/// directories in another Unicode form). A directory of no known class, or two of one, is
/// refused by name. A known class without a directory has none (no images).
fn class_directories(
    split_dir: &Path,
    found: Vec<String>,
    known: Option<&[String]>,
) -> Result<Vec<(String, String)>, DataError> {
    let Some(known) = known else {
        for (i, a) in found.iter().enumerate() {
            if let Some(b) = found[i + 1..].iter().find(|b| same_class_name(a, b)) {
                return Err(two_forms(split_dir, a, b));
            }
        }
        return Ok(found.into_iter().map(|d| (d.clone(), d)).collect());
    };
    let mut dirs: Vec<Option<String>> = vec![None; known.len()];
    for dir in found {
        let Some(class) = known.iter().position(|k| same_class_name(k, &dir)) else {
            return Err(DataError::invalid(
                split_dir.join(dir),
                "is a class the training split does not have; rename or remove it",
            ));
        };
        if let Some(first) = &dirs[class] {
            return Err(two_forms(split_dir, first, &dir));
        }
        dirs[class] = Some(dir);
    }
    Ok(known
        .iter()
        .zip(dirs)
        .map(|(k, d)| (k.clone(), d.unwrap_or_else(|| k.clone())))
        .collect())
}

/// The refusal of two directories of `split_dir` that name one class in two Unicode forms:
/// both names, and each spelled by its code points beyond ASCII, since on screen they look
/// the same.
fn two_forms(split_dir: &Path, a: &str, b: &str) -> DataError {
    let spelled = |name: &str| -> String {
        name.chars()
            .map(|c| match c.is_ascii() {
                true => c.to_string(),
                false => format!("<U+{:04X}>", u32::from(c)),
            })
            .collect()
    };
    DataError::invalid(
        split_dir,
        format!(
            "holds the class directories '{a}' and '{b}' ({} and {}), one class written in two \
             Unicode forms; merge them into one",
            spelled(a),
            spelled(b)
        ),
    )
}

/// Whether two class names are one class: equal, or equal once both are in Unicode's composed
/// form (NFC). macOS file systems store names decomposed (NFD: `é` as `e` and a combining
/// accent), so a folder copied from a Mac names `café` with other bytes than one made on
/// Linux; both are the class the user typed.
pub fn same_class_name(a: &str, b: &str) -> bool {
    use unicode_normalization::UnicodeNormalization;
    a == b || a.nfc().eq(b.nfc())
}

/// One class directory, listed once.
#[derive(Debug, Default)]
struct ClassListing {
    /// Its image files (PNG and JPEG by name), sorted.
    images: Vec<PathBuf>,
    /// How many directories it holds (not read).
    subdirs: usize,
    /// Its images of formats not read (`.webp`, `.heic`...: [`ListedFile::UnreadFormat`]).
    unread: Vec<PathBuf>,
}

/// Lists one class directory. An entry with an image's extension that is not a regular
/// file (a fifo, a device, a directory, a dangling link or a link loop) is skipped with a
/// warning naming it, since reading it could block or never end.
fn class_files(dir: &Path, hint: &str) -> Result<ClassListing, DataError> {
    let mut listing = ClassListing::default();
    if !dir.is_dir() {
        return Ok(listing);
    }
    let mut skipped: Vec<(PathBuf, &str)> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| DataError::from_io(dir, e, hint))? {
        let e = e.map_err(|e| DataError::from_io(dir, e, hint))?;
        let p = e.path();
        let listed = ListedFile::of(&p);
        if listed != ListedFile::Image {
            let kind = e.file_type();
            // One named like an image (`dir.png`) is counted among the skipped instead.
            listing.subdirs += usize::from(kind.as_ref().is_ok_and(|t| t.is_dir()));
            if listed == ListedFile::UnreadFormat
                && std::fs::metadata(&p).is_ok_and(|m| m.is_file())
            {
                listing.unread.push(p);
            }
            continue;
        }
        match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => listing.images.push(p),
            Ok(m) => skipped.push((p, entry_type(m.file_type()))),
            Err(_) => skipped.push((p, "a dangling link or a link loop")),
        }
    }
    if let Some((first, what)) = skipped.first() {
        crate::terminal::print_warning(&format!(
            "{}: skipped {} entr{} with an image's name that {} not a regular file ({} is {what})",
            dir.display(),
            skipped.len(),
            if skipped.len() == 1 { "y" } else { "ies" },
            if skipped.len() == 1 { "is" } else { "are" },
            first.display()
        ));
    }
    listing.images.sort();
    listing.unread.sort();
    Ok(listing)
}

/// What a file type that is not a regular file is, in words.
fn entry_type(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a fifo"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "a socket"
    }
}

/// The header of `path`, checked (see [`crate::data::decode::read_info`]).
fn probe(path: &Path) -> Result<super::decode::ImageInfo, DataError> {
    let bytes =
        crate::input::read_bytes(path, crate::input::FileKind::Image).map_err(DataError::Input)?;
    Ok(super::decode::read_info(&bytes, path)?)
}

/// Bytes of a file's start the size probe reads: its header and metadata (a JPEG's APP
/// segments, EXIF among them, are at most 64 KiB each; the `image` crate's JPEG reader would
/// read the whole file).
const HEADER_PREFIX: u64 = 256 * 1024;

/// The size `path` is read at (after its EXIF orientation, and within the sizes training
/// takes), from its first [`HEADER_PREFIX`] bytes, checked as [`probe`] checks them; None
/// where they do not tell.
fn header_size(path: &Path) -> Option<(usize, usize)> {
    use std::io::Read;
    let (file, _) = crate::input::open_regular(path, crate::input::FileKind::Image).ok()?;
    let mut prefix = Vec::new();
    file.take(HEADER_PREFIX).read_to_end(&mut prefix).ok()?;
    let info = super::decode::read_info(&prefix, path).ok()?;
    Some((info.width as usize, info.height as usize))
}

/// Opens `dir/train` and `dir/test` (the test split with the training split's classes,
/// channels and size).
pub fn open_pair(dir: &Path) -> Result<(ImageFolder, ImageFolder), DataError> {
    let train = ImageFolder::open(&dir.join("train"), None)?;
    let mut test = ImageFolder::open(&dir.join("test"), Some(&train.classes))?;
    // The training split decides the channels and the size; test images are taken to them.
    test.channels = train.channels;
    test.set_size(train.height, train.width);
    Ok((train, test))
}
