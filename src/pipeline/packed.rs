//! A packed file's samples through the transforms ([`crate::data::packed`]): what
//! [`super::Source::Packed`] does per sample on the loader threads, and its test split and
//! normalisation estimate, as `source.rs` does them for an ImageFolder.
//!
//! A JPEG sample goes through [`Transforms::apply_bytes`] exactly as an ImageFolder's JPEG file
//! does (decoded at 1/2, 1/4 or 1/8 scale where the crop allows); a raw sample is put into the
//! decoded image as it is ([`crate::data::decode::DecodedImage::set_from_hwc_as`], one copy,
//! no decoding; converted where the split is delivered with other channels than stored) and rendered with [`Transforms::apply_image`]. The same image therefore gives the
//! same pixels from a folder of PNGs and from a `--raw` pack of it.

use super::{Draw, ImageSize, Normalization, Normalize, TransformScratch, Transforms};
use crate::data::packed::{Encoding, PackedSplit};
use crate::data::{DataError, Dataset};

/// Sample `i` of `split` transformed to the split's size with `draw` and normalised into `out`
/// (C×H×W `f32`). A damaged sample gives [`DataError::PackedSample`], naming it.
pub fn write_sample(
    split: &PackedSplit,
    i: usize,
    transforms: &Transforms,
    norm: &Normalize,
    draw: Draw,
    scratch: &mut TransformScratch,
    out: &mut [f32],
) -> Result<(), DataError> {
    let size = ImageSize {
        height: split.height,
        width: split.width,
    };
    let (r, bytes) = split.sample(i)?;
    let c = split.channels;
    match r.encoding {
        Encoding::Jpeg => transforms
            .apply_bytes(bytes, &split.file.path, c, size, norm, draw, scratch, out)
            .map_err(|e| split.corrupt(i, format!("does not decode ({e})"))),
        Encoding::Raw => {
            let (w, h) = (usize::from(r.width), usize::from(r.height));
            let stored = split.file.channels;
            scratch.image.set_from_hwc_as((w, h, stored), bytes, c);
            transforms.apply_image(&scratch.image, size, norm, draw, &mut scratch.render, out);
            Ok(())
        }
    }
}

/// Sample `i` through the evaluation transforms `eval` as `u8` planes (C×H×W) into `out`;
/// `wide` is a scratch of the sample's `f32`s.
fn write_u8(
    split: &PackedSplit,
    i: usize,
    eval: &Transforms,
    scratch: &mut TransformScratch,
    wide: &mut [f32],
    out: &mut [u8],
) -> Result<(), DataError> {
    // pixel * 1 + 0: the rendered bytes themselves, as f32 (exact), rounded back.
    let identity = Normalize::new(
        &vec![0.0; split.channels],
        &vec![1.0 / 255.0; split.channels],
    );
    write_sample(split, i, eval, &identity, Draw::NONE, scratch, wide)?;
    for (o, v) in out.iter_mut().zip(wide.iter()) {
        *o = v.round().clamp(0.0, 255.0) as u8;
    }
    Ok(())
}

/// A packed split through `eval` into an in-memory [`Dataset`] at the split's size (the test
/// split, which every evaluation reads whole), checked against the machine's memory first.
pub fn decode_split(
    split: &PackedSplit,
    eval: &Transforms,
    name: &str,
) -> Result<Dataset, DataError> {
    let n = split.sample_len();
    crate::data::check_split_memory(
        &split.file.path,
        split.len(),
        [split.channels, split.height, split.width],
        "use fewer test images (--test-limit) or a smaller --image-size",
    )?;
    let mut pixels = vec![0u8; split.len() * n];
    let mut scratch = TransformScratch::default();
    let mut wide = vec![0f32; n];
    for (i, out) in pixels.chunks_exact_mut(n.max(1)).enumerate() {
        write_u8(split, i, eval, &mut scratch, &mut wide, out)?;
    }
    Ok(Dataset {
        name: name.to_string(),
        channels: split.channels,
        height: split.height,
        width: split.width,
        num_classes: split.classes().len(),
        pixels,
        labels: (0..split.len()).map(|i| split.label(i)).collect(),
    })
}

/// Per-channel mean and deviation of pixel/255 over up to `max` samples spread evenly over
/// `split`, each through `eval` (as an ImageFolder's estimate); damaged samples are left out
/// and counted. Returns it, the samples it read and the ones it could not.
pub fn estimate_normalization(
    split: &PackedSplit,
    eval: &Transforms,
    max: usize,
) -> (Normalization, usize, Option<super::normalize::Unreadable>) {
    let take = split.len().min(max.max(1));
    let n = split.sample_len();
    let mut probe = Dataset {
        name: "estimate".into(),
        channels: split.channels,
        height: split.height,
        width: split.width,
        num_classes: split.classes().len(),
        pixels: Vec::with_capacity(take * n),
        labels: Vec::with_capacity(take),
    };
    let mut scratch = TransformScratch::default();
    let (mut wide, mut buf) = (vec![0f32; n], vec![0u8; n]);
    let (mut unreadable, mut failed) = (super::normalize::Unreadable::default(), Vec::new());
    for k in 0..take {
        let i = k * split.len() / take;
        match write_u8(split, i, eval, &mut scratch, &mut wide, &mut buf) {
            Ok(()) => {
                probe.pixels.extend_from_slice(&buf);
                probe.labels.push(split.label(i));
            }
            Err(e) => {
                unreadable.errors.push(e.to_string());
                failed.push(split.label(i));
            }
        }
    }
    let (mean, std) = probe.computed_mean_std();
    let labels = (probe.labels.as_slice(), failed.as_slice());
    let unreadable = unreadable.finish(labels, split.classes(), take == split.len());
    (Normalization { mean, std }, probe.labels.len(), unreadable)
}
