//! Images of any size: decoding (colour types, bit depths, EXIF orientation, reduced JPEG
//! decoding, bad files named with a typed error), the transform list (parse/Display, RRC's
//! output, the fallback, eval transforms), the same bits as before for fixed-size data, and
//! runs on a folder of mixed sizes that do not depend on the loader-thread count.

use dptrain::config::TrainOptions;
use dptrain::data::decode::{read_info, DecodeError, DecodedImage, Decoder, MIN_IMAGE_SIDE};
use dptrain::pipeline::{
    Draw, ImageSize, Normalization, Normalize, NormalizeChoice, TransformOp, TransformScratch,
    Transforms,
};
use image::{ImageBuffer, Luma, Rgb, Rgba};
use std::io::Cursor;
use std::path::Path;

fn png<P: image::PixelWithColorType>(img: &ImageBuffer<P, Vec<P::Subpixel>>) -> Vec<u8>
where
    [P::Subpixel]: image::EncodableLayout,
{
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn jpeg_grey(w: u32, h: u32, f: impl Fn(u32, u32) -> u8, quality: u8) -> Vec<u8> {
    let img = ImageBuffer::from_fn(w, h, |x, y| Luma([f(x, y)]));
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .encode_image(&img)
        .unwrap();
    out
}

fn decode(bytes: &[u8], channels: usize) -> Result<DecodedImage, DecodeError> {
    let mut img = DecodedImage::default();
    Decoder::default().decode(bytes, Path::new("x/img.bin"), channels, None, &mut img)?;
    Ok(img)
}

#[test]
fn png_colour_types_and_depths_decode_to_grey_or_rgb() {
    // Greyscale 8-bit, to 1 and 3 channels.
    let g = ImageBuffer::from_fn(9, 5, |x, y| Luma([(x * 20 + y) as u8]));
    let d = decode(&png(&g), 1).unwrap();
    assert_eq!((d.width, d.height, d.channels), (9, 5, 1));
    assert_eq!(d.pixels, g.as_raw().clone());
    let d3 = decode(&png(&g), 3).unwrap();
    assert_eq!(&d3.pixels[..6], &[0, 0, 0, 20, 20, 20]);
    // RGBA: alpha dropped, colour kept.
    let rgba = ImageBuffer::from_fn(6, 6, |x, _| Rgba([x as u8 * 40, 7, 200, 3]));
    let d = decode(&png(&rgba), 3).unwrap();
    assert_eq!(&d.pixels[3..6], &[40, 7, 200]);
    // RGB to grey: PIL's weights.
    let rgb = ImageBuffer::from_fn(4, 4, |_, _| Rgb([255u8, 0, 0]));
    assert_eq!(decode(&png(&rgb), 1).unwrap().pixels[0], 76);
    // 16-bit grey: rounded to 8 bits.
    let g16 = ImageBuffer::from_fn(4, 4, |x, _| Luma([x as u16 * 20000]));
    let d = decode(&png(&g16), 1).unwrap();
    assert_eq!(&d.pixels[..4], &[0, 78, 156, 233]);
    // Palette: expanded by the decoder.
    let mut bytes = Vec::new();
    {
        let mut e = png::Encoder::new(&mut bytes, 4, 4);
        e.set_color(png::ColorType::Indexed);
        e.set_depth(png::BitDepth::Eight);
        e.set_palette(vec![10u8, 20, 30, 200, 100, 50]);
        let mut w = e.write_header().unwrap();
        w.write_image_data(&[0, 1, 0, 1].repeat(4)).unwrap();
    }
    let d = decode(&bytes, 3).unwrap();
    assert_eq!(&d.pixels[..6], &[10, 20, 30, 200, 100, 50]);
    assert_eq!(read_info(&bytes, Path::new("p.png")).unwrap().channels, 3);
}

/// `jpeg` with an EXIF APP1 segment holding orientation `tag`, written by hand after SOI.
fn with_orientation(jpeg: &[u8], tag: u8) -> Vec<u8> {
    let mut app1 = vec![0xff, 0xe1, 0, 34];
    app1.extend_from_slice(b"Exif\0\0MM\0\x2a\0\0\0\x08");
    app1.extend_from_slice(&[0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, tag, 0, 0, 0, 0, 0, 0]);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[test]
fn exif_orientation_is_applied() {
    // Stored 16 wide x 8 tall, bright in the top-left 8 x 4 block.
    let base = jpeg_grey(16, 8, |x, y| if x < 8 && y < 4 { 255 } else { 0 }, 95);
    let at = |d: &DecodedImage, x: usize, y: usize| d.pixels[y * d.width + x];
    let plain = decode(&base, 1).unwrap();
    assert_eq!((plain.width, plain.height), (16, 8));
    assert!(at(&plain, 2, 1) > 200 && at(&plain, 12, 6) < 50);
    // 6: rotate 90 degrees clockwise to show; the top-left block goes to the top right.
    let turned = with_orientation(&base, 6);
    assert_eq!(
        read_info(&turned, Path::new("t.jpg")).unwrap().orientation,
        6
    );
    let d = decode(&turned, 1).unwrap();
    assert_eq!((d.width, d.height), (8, 16));
    assert!(at(&d, 6, 2) > 200, "{:?}", d.pixels);
    assert!(at(&d, 1, 2) < 50 && at(&d, 6, 12) < 50);
    // 3: rotate 180; the block goes to the bottom right.
    let d = decode(&with_orientation(&base, 3), 1).unwrap();
    assert_eq!((d.width, d.height), (16, 8));
    assert!(at(&d, 13, 6) > 200 && at(&d, 2, 1) < 50);
}

#[test]
fn bad_images_get_typed_errors_naming_the_file() {
    let path = Path::new("photos/cat/broken.jpg");
    let run = |bytes: &[u8]| {
        let mut img = DecodedImage::default();
        Decoder::default()
            .decode(bytes, path, 3, None, &mut img)
            .unwrap_err()
    };
    let good = jpeg_grey(64, 48, |x, y| (x ^ y) as u8, 90);
    // Truncated inside the scan data.
    let e = run(&good[..good.len() * 2 / 3]);
    assert!(matches!(e, DecodeError::Truncated { .. }), "{e}");
    // CMYK.
    let mut cmyk = Vec::new();
    jpeg_encoder::Encoder::new(&mut cmyk, 90)
        .encode(&[0u8; 16 * 16 * 4], 16, 16, jpeg_encoder::ColorType::Cmyk)
        .unwrap();
    let e = run(&cmyk);
    assert!(matches!(e, DecodeError::Cmyk { .. }), "{e}");
    // Not an image.
    let e = run(b"GIF89a not ours");
    assert!(matches!(e, DecodeError::NotAnImage { .. }), "{e}");
    // An empty file says so.
    let e = run(b"");
    assert!(matches!(e, DecodeError::Empty { .. }), "{e}");
    assert!(e.to_string().contains("is empty (0 bytes)"), "{e}");
    // 1 x 1.
    let e = run(&png(&ImageBuffer::from_pixel(1, 1, Luma([9u8]))));
    assert!(
        matches!(
            e,
            DecodeError::TooSmall {
                width: 1,
                height: 1,
                ..
            }
        ),
        "{e}"
    );
    let ok = png(&ImageBuffer::from_pixel(
        MIN_IMAGE_SIDE,
        MIN_IMAGE_SIDE,
        Luma([9u8]),
    ));
    assert!(decode(&ok, 1).is_ok());
    // A PNG whose header claims 65535 x 65535: refused from the header.
    let mut lying = png(&ImageBuffer::from_pixel(8, 8, Luma([9u8])));
    lying[16..24].copy_from_slice(&[0, 0, 0xff, 0xff, 0, 0, 0xff, 0xff]);
    let e = run(&lying);
    assert!(
        matches!(
            e,
            DecodeError::TooLarge { .. } | DecodeError::Corrupt { .. }
        ),
        "{e}"
    );
    // Past 2^31 pixels a side the decoder's allocation limit refused first, as "memory limit
    // exceeded; the file is damaged": the header's claim is named.
    let mut huge = lying.clone();
    huge[16..24].copy_from_slice(&[0xff; 8]);
    let e = run(&huge);
    assert!(
        matches!(
            e,
            DecodeError::TooLarge {
                width: u32::MAX,
                height: u32::MAX,
                ..
            }
        ),
        "{e}"
    );
    for e in [run(&lying), run(&cmyk), run(b"xx"), run(&good[..300])] {
        assert!(e.to_string().contains("photos/cat/broken.jpg"), "{e}");
        assert_eq!(e.path(), path);
    }
}

#[test]
fn a_damaged_png_is_named_in_words_not_in_the_decoders_debug_text() {
    let good = png(&ImageBuffer::from_pixel(16, 16, Rgb([9u8, 80, 200])));
    // The first chunk after IHDR (at 33) is IDAT: its type renamed to a critical chunk no
    // decoder knows, then its CRC spoiled.
    let idat = 33;
    assert_eq!(&good[idat + 4..idat + 8], b"IDAT");
    let mut unknown = good.clone();
    unknown[idat + 4..idat + 8].copy_from_slice(b"IDAQ");
    let len = u32::from_be_bytes(good[idat..idat + 4].try_into().unwrap()) as usize;
    let mut bad_crc = good.clone();
    bad_crc[idat + 8 + len] ^= 0xff;
    for (bytes, says) in [(unknown, "chunk: 'IDAQ'"), (bad_crc, "'IDAT' chunk")] {
        let e = decode(&bytes, 3).unwrap_err();
        assert!(matches!(e, DecodeError::Corrupt { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains(says), "{text}");
        for debug in [
            "ChunkType",
            "critical:",
            "{",
            "Format error decoding Png",
            "chunk chunk",
        ] {
            assert!(!text.contains(debug), "{text}");
        }
    }
}

#[test]
fn a_large_jpeg_is_decoded_reduced_when_the_target_is_small() {
    let big = jpeg_grey(400, 320, |x, _| (x / 2) as u8, 90);
    let mut img = DecodedImage::default();
    let mut dec = Decoder::default();
    let p = Path::new("big.jpg");
    dec.decode(&big, p, 1, Some((28, 28)), &mut img).unwrap();
    assert_eq!((img.width, img.height), (50, 40), "1/8 scale");
    assert_eq!((img.full_width, img.full_height), (400, 320));
    dec.decode(&big, p, 1, Some((150, 100)), &mut img).unwrap();
    assert_eq!((img.width, img.height), (200, 160), "1/2 scale");
    dec.decode(&big, p, 1, None, &mut img).unwrap();
    assert_eq!((img.width, img.height), (400, 320));
    // Through the evaluation transform: the reduced decode gives nearly the full one's pixels.
    let eval = Transforms::eval_default();
    let size = ImageSize::parse("28").unwrap();
    let mut s = TransformScratch::default();
    let mut out = vec![0u8; 28 * 28];
    eval.apply_bytes_u8(&big, p, 1, size, Draw::NONE, &mut s, &mut out)
        .unwrap();
    // A horizontal ramp 0..200 over the centre crop of 350 of 400 columns (320 high).
    assert!(out[0] < 40 && out[27] > 160, "{:?}", &out[..28]);
    assert!(out.windows(2).take(27).all(|w| w[1] >= w[0]));
}

/// A camera's photo past 4096 x 4096 pixels: a baseline JPEG is decoded at the scale the input
/// needs, refused (naming the scale) when even that is past 4096 x 4096 pixels; a progressive
/// one, which decodes whole, is refused from its header, as is a baseline one past 8192 x 8192.
#[test]
fn a_photo_past_4096_square_decodes_reduced_where_its_kind_allows() {
    let (w, h) = (8000u32, 6000u32);
    let baseline = jpeg_grey(w, h, |x, y| ((x / 16) ^ (y / 16)) as u8, 80);
    let p = Path::new("camera/big.jpg");
    let mut img = DecodedImage::default();
    let mut dec = Decoder::default();
    let info = read_info(&baseline, p).unwrap();
    assert_eq!((info.width, info.height), (w, h));
    dec.decode(&baseline, p, 1, Some((224, 224)), &mut img)
        .unwrap();
    assert_eq!((img.width, img.height), (1000, 750), "1/8 scale");
    assert_eq!((img.full_width, img.full_height), (8000, 6000));
    dec.decode(&baseline, p, 1, Some((3000, 3000)), &mut img)
        .unwrap();
    assert_eq!(
        (img.width, img.height),
        (4000, 3000),
        "1/2 scale: 12 M pixels"
    );
    for (min, factor, decoded) in [
        (None, 1, (8000, 6000)),
        (Some((5000, 3000)), 1, (8000, 6000)),
    ] {
        let e = dec.decode(&baseline, p, 1, min, &mut img).unwrap_err();
        let DecodeError::TooLargeToDecode {
            factor: f,
            decoded_width,
            decoded_height,
            ..
        } = e
        else {
            panic!("{e}")
        };
        assert_eq!((f, (decoded_width, decoded_height)), (factor, decoded));
        assert!(e.to_string().contains("camera/big.jpg") && e.to_string().contains("--image-size"));
    }
    // Progressive: refused from its header whatever the target.
    let mut progressive = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut progressive, 80);
    enc.set_progressive(true);
    enc.encode(
        &vec![128u8; (w * h) as usize],
        w as u16,
        h as u16,
        jpeg_encoder::ColorType::Luma,
    )
    .unwrap();
    let e = dec
        .decode(&progressive, p, 1, Some((224, 224)), &mut img)
        .unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::TooLarge {
                kind: "a progressive or lossless JPEG",
                side: 4096,
                ..
            }
        ),
        "{e}"
    );
    // A baseline header claiming 9000 x 8000 (72 M pixels): refused before decoding.
    let mut lying = jpeg_grey(16, 16, |x, _| x as u8, 90);
    let sof = lying.windows(2).position(|m| m == [0xff, 0xc0]).unwrap();
    lying[sof + 5..sof + 9].copy_from_slice(&[0x1f, 0x40, 0x23, 0x28]);
    let e = read_info(&lying, p).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::TooLarge {
                width: 9000,
                height: 8000,
                kind: "a baseline JPEG",
                side: 8192,
                ..
            }
        ),
        "{e}"
    );
    // No cap on a side alone: a 5000 x 8 strip is 40,000 pixels.
    let strip = png(&ImageBuffer::from_pixel(5000, 8, Luma([9u8])));
    assert_eq!((decode(&strip, 1).unwrap().width, 8), (5000, 8));
}

#[test]
fn image_sizes_and_lists_parse_print_and_refuse() {
    assert_eq!(ImageSize::parse("28").unwrap().to_string(), "28");
    let s = ImageSize::parse("32x48").unwrap();
    assert_eq!((s.height, s.width, s.to_string()), (32, 48, "32x48".into()));
    for bad in ["0", "4097", "28x0", "x", "", "12x12x3"] {
        assert!(ImageSize::parse(bad).is_err(), "{bad}");
    }
    for list in [
        "off",
        "random-resized-crop,flip",
        "random-resized-crop:0.25,1,flip",
        "random-resized-crop:0.25,1:0.5,2",
        "crop:4,flip",
        "flip,crop:4",
        "resize-shorter,center-crop",
        "resize-shorter:256,center-crop",
        "resize",
    ] {
        let t = Transforms::parse(list).unwrap();
        assert_eq!(t.to_string(), list);
        assert_eq!(Transforms::parse(&t.to_string()).unwrap(), t);
    }
    let rrc = Transforms::parse("random-resized-crop:0.25,1:0.5,2").unwrap();
    assert_eq!(
        rrc.ops[0],
        TransformOp::RandomResizedCrop {
            scale: (0.25, 1.0),
            ratio: (0.5, 2.0)
        }
    );
    for bad in [
        "rotate",
        "crop:0",
        "crop:x",
        "random-resized-crop:0.5",
        "random-resized-crop:0.9,0.1",
        "random-resized-crop:0.5,2",
        "resize-shorter:0",
        "",
        " ",
    ] {
        assert!(Transforms::parse(bad).is_err(), "{bad}");
    }
    assert!(Transforms::parse_eval("resize-shorter,center-crop,flip").is_err());
    // The stored form has the defaults filled in and round-trips through parse_eval.
    let eval = Transforms::eval_default().resolved(ImageSize::parse("224").unwrap());
    assert_eq!(eval.to_string(), "resize-shorter:256,center-crop");
    assert_eq!(Transforms::parse_eval(&eval.to_string()).unwrap(), eval);
    let small = Transforms::eval_default().resolved(ImageSize::parse("28").unwrap());
    assert_eq!(small.to_string(), "resize-shorter:28,center-crop");
    // Options: --image-size 0 and over the cap fail before training.
    for bad in ["0", "5000", "28x99999"] {
        let o = TrainOptions {
            image_size: Some(bad.into()),
            ..Default::default()
        };
        let e = o.resolve().unwrap_err();
        assert!(e.contains("--image-size") && e.contains("4096"), "{e}");
    }
}

#[test]
fn normalisation_parses_prints_and_refuses() {
    let n = Normalization::parse("0.485,0.456,0.406/0.229,0.224,0.225").unwrap();
    assert_eq!(n.channels(), 3);
    assert_eq!(n.to_string(), "0.485,0.456,0.406/0.229,0.224,0.225");
    assert_eq!(Normalization::parse(&n.to_string()).unwrap(), n);
    assert_eq!(
        NormalizeChoice::parse("estimate").unwrap(),
        NormalizeChoice::Estimate
    );
    for bad in ["0.5", "0.5/0", "0.5,0.5/0.2", "a/b", "0.1/-1"] {
        assert!(Normalization::parse(bad).is_err(), "{bad}");
    }
}

/// A 64 x 64 RGB image whose red channel is 4x, green 4y: where each output pixel came from.
fn ramp() -> DecodedImage {
    let mut img = DecodedImage::default();
    let hwc: Vec<u8> = (0..64 * 64)
        .flat_map(|p| [(p % 64 * 4) as u8, (p / 64 * 4) as u8, 0])
        .collect();
    img.set_from_hwc(64, 64, 3, &hwc);
    img
}

fn render(t: &Transforms, img: &DecodedImage, size: usize, draw: Draw) -> Vec<f32> {
    let identity = Normalize::new(&[0.0; 3], &[1.0 / 255.0; 3]);
    let mut out = vec![0f32; 3 * size * size];
    let mut r = dptrain::pipeline::RenderScratch::default();
    t.apply_image(
        img,
        ImageSize::new(size, size).unwrap(),
        &identity,
        draw,
        &mut r,
        &mut out,
    );
    out
}

#[test]
fn random_resized_crop_crops_within_scale_and_draws_per_sample() {
    let img = ramp();
    let t = Transforms::parse("random-resized-crop:0.25,0.25:1,1").unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in 0..50 {
        let out = render(&t, &img, 16, Draw::new(5, 1, i));
        assert_eq!(
            out,
            render(&t, &img, 16, Draw::new(5, 1, i)),
            "reproducible"
        );
        // A 32 x 32 crop: red spans ~ 4 * 32 across the row, and rises left to right.
        let row = &out[..16];
        let span = row[15] - row[0];
        assert!((100.0..=128.0).contains(&span), "span {span}");
        assert!(row.windows(2).all(|w| w[1] >= w[0]));
        seen.insert(out[0] as u32 * 1000 + out[256] as u32);
    }
    assert!(
        seen.len() > 20,
        "crops should land in many places: {}",
        seen.len()
    );
    // Flip mirrors some samples.
    let tf = Transforms::parse("random-resized-crop:0.25,0.25:1,1,flip").unwrap();
    let falling = (0..50)
        .filter(|&i| {
            let out = render(&tf, &img, 16, Draw::new(5, 1, i));
            out[15] < out[0]
        })
        .count();
    assert!((10..=40).contains(&falling), "{falling} of 50 flipped");
    // The fallback: a ratio no crop of this square can have gives the centre crop at the
    // nearest ratio (2:1 -> the full width, half the height, centred).
    let t = Transforms::parse("random-resized-crop:1,1:2,2").unwrap();
    let out = render(&t, &img, 16, Draw::new(5, 1, 3));
    let green_top = out[256];
    let green_bottom = out[256 + 15 * 16];
    assert!((60.0..70.0).contains(&green_top), "{green_top}");
    assert!((185.0..196.0).contains(&green_bottom), "{green_bottom}");
}

#[test]
fn a_centre_crop_starts_where_torchvisions_does() {
    use dptrain::pipeline::centre_crop_offset;
    // torchvision's center_crop: int(round((side - crop) / 2)), Python's round taking halves
    // to even; a side shorter than the crop is padded by (crop - side) // 2 before it.
    for (side, crop, start) in [
        (24.0, 24.0, 0.0),
        (25.0, 24.0, 0.0),
        (26.0, 24.0, 1.0),
        (27.0, 24.0, 2.0),
        (29.0, 24.0, 2.0),
        (31.0, 24.0, 4.0),
        (23.0, 24.0, 0.0),
        (22.0, 24.0, -1.0),
        (21.0, 24.0, -1.0),
        (19.0, 24.0, -2.0),
    ] {
        assert_eq!(centre_crop_offset(side, crop), start, "{side} -> {crop}");
    }
}

#[test]
fn eval_transform_of_a_non_square_image_centres_and_keeps_aspect() {
    let mut img = DecodedImage::default();
    // 96 wide x 48 tall, red = 255 in the middle third of the width, else 0.
    let hwc: Vec<u8> = (0..96 * 48)
        .flat_map(|p| {
            let x = p % 96;
            [if (32..64).contains(&x) { 255 } else { 0 }, 0, 0]
        })
        .collect();
    img.set_from_hwc(96, 48, 3, &hwc);
    // Shorter side to 24 (the size, under 64 px): 48 x 24, centre 24 x 24 = columns 12..36
    // of the resized image = source columns 24..72: red in the middle 16 columns.
    let eval = Transforms::eval_default();
    let out = render(&eval, &img, 24, Draw::NONE);
    let row = &out[12 * 24..13 * 24];
    assert!(row[0] < 10.0 && row[23] < 10.0, "{row:?}");
    assert!(
        row[12] > 245.0 && row[5] > 200.0 && row[18] > 200.0,
        "{row:?}"
    );
    // `off` squashes the whole image: red in the middle third.
    let out = render(&Transforms::OFF, &img, 24, Draw::NONE);
    let row = &out[12 * 24..13 * 24];
    assert!(
        row[2] < 10.0 && row[12] > 245.0 && row[21] < 10.0,
        "{row:?}"
    );
}

#[test]
fn fixed_size_crop_and_flip_are_the_same_bits_from_memory_and_from_png() {
    // The fixed-size path (in-memory data) and the decode path (a PNG of the same pixels at
    // the image size) give the same floats for the same draws.
    let (w, h) = (12usize, 10usize);
    let chw: Vec<u8> = (0..3 * w * h).map(|v| (v * 7 % 251) as u8).collect();
    let hwc: Vec<u8> = (0..w * h)
        .flat_map(|p| [chw[p], chw[w * h + p], chw[2 * w * h + p]])
        .collect();
    let bytes = png(&ImageBuffer::<Rgb<u8>, _>::from_raw(w as u32, h as u32, hwc).unwrap());
    let norm = Normalize::new(&[0.4, 0.5, 0.6], &[0.2, 0.25, 0.3]);
    let size = ImageSize::new(h, w).unwrap();
    for list in ["off", "crop:3", "flip", "crop:3,flip"] {
        let t = Transforms::parse(list).unwrap();
        let mut s = TransformScratch::default();
        for i in 0..20 {
            let draw = Draw::new(9, 2, i);
            let mut a = vec![0f32; 3 * w * h];
            t.apply_planar(&chw, [3, h, w], size, &norm, draw, &mut s, &mut a);
            let mut b = vec![0f32; 3 * w * h];
            t.apply_bytes(
                &bytes,
                Path::new("s.png"),
                3,
                size,
                &norm,
                draw,
                &mut s,
                &mut b,
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{list} sample {i}");
            // And the same as the one-call form the old augmentation had.
            let mut c = vec![0f32; 3 * w * h];
            t.apply(&chw, [3, h, w], &norm, 9, 2, i, &mut c);
            assert_eq!(bits(&a), bits(&c), "{list} sample {i}");
        }
    }
}

/// An ImageFolder of `n` training and `m` test JPEG/PNG images of mixed sizes and aspect
/// ratios (two classes: a bright disc or a dark one on grey).
fn mixed_folder(dir: &Path, n: usize, m: usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for (split, count) in [("train", n), ("test", m)] {
        for class in 0..2 {
            std::fs::create_dir_all(dir.join(split).join(class.to_string())).unwrap();
        }
        for i in 0..count {
            let class = i % 2;
            let (w, h) = (rng.gen_range(20..120u32), rng.gen_range(20..120u32));
            let v = if class == 0 { 230u8 } else { 20 };
            let img = ImageBuffer::from_fn(w, h, |x, y| {
                let (dx, dy) = (x as f32 / w as f32 - 0.5, y as f32 / h as f32 - 0.5);
                Rgb(if dx * dx + dy * dy < 0.1 {
                    [v, v / 2, 128]
                } else {
                    [128, 128, 128]
                })
            });
            let path = dir.join(split).join(class.to_string());
            if i % 3 == 0 {
                std::fs::write(path.join(format!("{i}.png")), png(&img)).unwrap();
            } else {
                let mut out = Vec::new();
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 60 + (i % 30) as u8)
                    .encode_image(&img)
                    .unwrap();
                std::fs::write(path.join(format!("{i}.jpg")), out).unwrap();
            }
        }
    }
}

fn mixed_run(dir: &Path, run: &Path, loaders: usize, prefetch: usize) -> dptrain::train::Summary {
    let o = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.to_path_buf()),
        model: Some("lenet5".into()),
        image_size: Some("28".into()),
        augment: Some("random-resized-crop:0.3,1,flip".into()),
        epochs: Some(2),
        batch: Some(16),
        workers: Some(2),
        threads: Some(1),
        loader_threads: Some(loaders),
        prefetch: Some(prefetch),
        comm_timeout: Some(30.0),
        run_dir: Some(run.to_path_buf()),
        no_checkpoints: true,
        quiet: true,
        ..Default::default()
    };
    dptrain::train::train(o.resolve().unwrap()).unwrap()
}

#[test]
fn a_folder_of_mixed_sizes_trains_the_same_for_any_loader_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mixed");
    mixed_folder(&dir, 96, 20);
    let a = mixed_run(&dir, &tmp.path().join("a"), 1, 2);
    let b = mixed_run(&dir, &tmp.path().join("b"), 3, 2);
    let c = mixed_run(&dir, &tmp.path().join("c"), 1, 0);
    assert_eq!(
        a.replica_hashes, b.replica_hashes,
        "3 loader threads changed the run"
    );
    assert_eq!(
        a.replica_hashes, c.replica_hashes,
        "prefetch 0 changed the run"
    );
    // The resolved input is in the run's configuration (summary.json).
    let cfg = &a.config;
    assert_eq!(cfg["image_size"], "28");
    assert_eq!(cfg["eval_transform"], "resize-shorter:28,center-crop");
    let norm = Normalization::parse(cfg["normalize"].as_str().unwrap()).unwrap();
    assert_eq!(norm.channels(), 3);
    assert!(norm.mean.iter().all(|&m| (0.2..0.8).contains(&m)), "{norm}");
}

fn summary_json(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn a_folder_resumed_without_its_image_size_resumes_at_the_checkpoints() {
    // The folder's first image is not 24x24: without the checkpoint's size the resumed run
    // would default to it and be refused as other input.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mixed");
    mixed_folder(&dir, 64, 16);
    let options = |run: &str, epochs: usize| TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.clone()),
        model: Some("lenet5".into()),
        epochs: Some(epochs),
        batch: Some(16),
        workers: Some(2),
        threads: Some(1),
        run_dir: Some(tmp.path().join(run)),
        quiet: true,
        ..Default::default()
    };
    let whole = dptrain::train::train(
        TrainOptions {
            image_size: Some("24".into()),
            eval_transform: Some("resize".into()),
            commit_every: Some(3),
            ..options("whole", 2)
        }
        .resolve()
        .unwrap(),
    )
    .unwrap();
    let first = tmp.path().join("whole/checkpoint-epoch0001.safetensors");
    assert!(first.exists());
    // The folder named by another path (a link) is the same data.
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let resumed = dptrain::train::train(
        TrainOptions {
            resume: Some(first.clone()),
            data_dir: Some(link),
            ..options("resumed", 2)
        }
        .resolve()
        .unwrap(),
    )
    .unwrap();
    assert_eq!(resumed.config["image_size"], "24");
    // Its summary says it resumed, and from where (its figures are its own steps').
    assert!(whole.resumed_from.is_none());
    let from = resumed.resumed_from.as_ref().unwrap();
    assert_eq!((from.epochs_done, from.steps_into_epoch), (1, 0));
    assert_eq!(from.describe(), "resumed after epoch 1");
    assert_eq!(resumed.epochs.len(), 1);
    let json = summary_json(&tmp.path().join("resumed"));
    assert_eq!(json["resumed_from"]["epochs_done"], 1);
    dptrain::report::write_run_report(&tmp.path().join("resumed")).unwrap();
    let report = std::fs::read_to_string(tmp.path().join("resumed/report.md")).unwrap();
    assert!(
        report.contains("| resumed | after epoch 1 from `")
            && report.contains("checkpoint-epoch0001.safetensors`"),
        "{report}"
    );
    dptrain::report::write_run_report(&tmp.path().join("whole")).unwrap();
    let report = std::fs::read_to_string(tmp.path().join("whole/report.md")).unwrap();
    assert!(!report.contains("| resumed |"), "{report}");
    assert_eq!(
        resumed.config["eval_transform"],
        whole.config["eval_transform"]
    );
    assert_eq!(
        resumed.replica_hashes, whole.replica_hashes,
        "the resumed run is not the uninterrupted one"
    );
    // Under other settings (fewer images, whose estimate would differ) the normalisation
    // stays the one the checkpoint's run trained with.
    let changed = dptrain::train::train(
        TrainOptions {
            resume: Some(first.clone()),
            resume_changed: true,
            train_limit: Some(32),
            ..options("changed", 2)
        }
        .resolve()
        .unwrap(),
    )
    .unwrap();
    assert_eq!(changed.config["normalize"], whole.config["normalize"]);
    // A commit inside an epoch under another batch: --resume-changed is not its remedy.
    let commit = std::fs::read_dir(tmp.path().join("whole"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("commit-")
                && dptrain::train::checkpoint::Checkpoint::load(p)
                    .unwrap()
                    .state
                    .step_in_epoch
                    > 0
        })
        .expect("a commit inside an epoch");
    let e = dptrain::train::train(
        TrainOptions {
            resume: Some(commit),
            batch: Some(32),
            ..options("commit", 2)
        }
        .resolve()
        .unwrap(),
    )
    .unwrap_err();
    let e = String::from(e);
    assert!(
        e.contains("(--batch 16 in the checkpoint, 32 now)")
            && e.contains("or resume from an epoch checkpoint with --resume-changed"),
        "{e}"
    );
    // A size given on resume is still the user's, and refused as other input.
    let e = dptrain::train::train(
        TrainOptions {
            resume: Some(first),
            image_size: Some("32".into()),
            ..options("other", 2)
        }
        .resolve()
        .unwrap(),
    )
    .unwrap_err();
    let e = String::from(e);
    assert!(
        e.contains("trained on 3x24x24")
            && e.contains("gives 3x32x32")
            && e.contains("leave --image-size out to resume at the checkpoint's 24x24"),
        "{e}"
    );
}

/// The error of a small run on `dataset` with `change` made to its options, which must be
/// refused before it writes anything.
fn refused_before_training(dataset: &str, change: impl FnOnce(&mut TrainOptions)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = TrainOptions {
        dataset: Some(dataset.into()),
        train_limit: Some(64),
        test_limit: Some(16),
        batch: Some(16),
        epochs: Some(1),
        run_dir: Some(tmp.path().join("r")),
        no_checkpoints: true,
        quiet: true,
        ..Default::default()
    };
    change(&mut o);
    let e = String::from(dptrain::train::train(o.resolve().unwrap()).unwrap_err());
    assert!(!tmp.path().join("r").exists(), "{e}: something was written");
    e
}

#[test]
fn an_in_memory_dataset_at_another_image_size_is_refused_before_training() {
    let e = refused_before_training("synthetic:1x8x8", |o| o.image_size = Some("16".into()));
    assert!(
        e.contains("--image-size 16") && e.contains("export-images"),
        "{e}"
    );
}

#[test]
fn a_normalisation_of_other_channels_than_the_datas_is_refused_before_training() {
    for (dataset, normalize, want) in [
        (
            "synthetic:3x8x8",
            "0.5/0.25",
            "0.5/0.25: 1 channel for images of 3 channels",
        ),
        (
            "synthetic:1x8x8",
            "0.5,0.5,0.5/0.2,0.2,0.2",
            ": 3 channels for images of 1 channel",
        ),
    ] {
        let e = refused_before_training(dataset, |o| o.normalize = Some(normalize.into()));
        assert!(e.contains(want) && e.contains("--normalize"), "{e}");
    }
}

#[test]
fn random_resized_crop_on_in_memory_data_is_the_same_for_any_loader_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |loaders: usize, prefetch: usize, augment: &str| {
        let o = TrainOptions {
            dataset: Some("synthetic:3x16x16".into()),
            augment: Some(augment.into()),
            train_limit: Some(256),
            test_limit: Some(32),
            batch: Some(32),
            epochs: Some(1),
            workers: Some(2),
            threads: Some(1),
            model: Some("lenet5".into()),
            loader_threads: Some(loaders),
            prefetch: Some(prefetch),
            comm_timeout: Some(30.0),
            run_dir: Some(
                tmp.path()
                    .join(format!("r{loaders}-{prefetch}-{}", augment.len())),
            ),
            no_checkpoints: true,
            quiet: true,
            ..Default::default()
        };
        dptrain::train::train(o.resolve().unwrap())
            .unwrap()
            .replica_hashes
    };
    let list = "random-resized-crop:0.3,1,flip,crop:2";
    let base = run(1, 2, list);
    assert_eq!(run(3, 2, list), base, "3 loader threads changed the run");
    assert_eq!(run(1, 0, list), base, "prefetch 0 changed the run");
    assert_ne!(run(1, 2, "off"), base, "the transforms had no effect");
}

#[test]
fn an_empty_class_directory_is_refused_in_training_and_allowed_in_test() {
    use dptrain::data::image_folder::ImageFolder;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 8, 4);
    let train = ImageFolder::open(&dir.join("train"), None).unwrap();
    assert_eq!(train.classes.len(), 2);
    // A class with no image in the test split: evaluated as it is.
    std::fs::create_dir(dir.join("test").join("fish")).unwrap();
    let classes = ["0".to_string(), "1".to_string(), "fish".to_string()];
    assert!(ImageFolder::open(&dir.join("test"), Some(&classes)).is_ok());
    // In the training split it could never be learned: refused, naming it.
    std::fs::create_dir(dir.join("train").join("fish")).unwrap();
    let e = ImageFolder::open(&dir.join("train"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fish") && e.contains("holds no .png, .jpg or .jpeg files"),
        "{e}"
    );
}

/// A folder copied from a Mac names its directories decomposed (NFD): `café` is `cafe` and a
/// combining accent. Against a class list made on Linux (composed, NFC: the training split's,
/// or a checkpoint's for eval) it is the same class, not an unknown one; one class written in
/// both forms in one split is refused, naming both.
#[test]
fn a_class_directory_in_another_unicode_form_is_the_same_class() {
    use dptrain::data::image_folder::ImageFolder;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 8, 4);
    let (composed, decomposed) = ("caf\u{e9}", "cafe\u{301}");
    std::fs::rename(dir.join("train/1"), dir.join("train").join(composed)).unwrap();
    std::fs::rename(dir.join("test/1"), dir.join("test").join(decomposed)).unwrap();
    let train = ImageFolder::open(&dir.join("train"), None).unwrap();
    assert_eq!(train.classes, ["0", composed]);
    let test = ImageFolder::open(&dir.join("test"), Some(&train.classes)).unwrap();
    assert_eq!(test.classes, ["0", composed]);
    // Its images are read, and labelled as the class.
    assert_eq!(test.labels.iter().filter(|&&l| l == 1).count(), 2);
    // A checkpoint of the composed name evaluates the decomposed copy as the composed one.
    let run = tmp.path().join("run");
    let o = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.clone()),
        image_size: Some("28".into()),
        epochs: Some(1),
        batch: Some(4),
        threads: Some(1),
        run_dir: Some(run.clone()),
        quiet: true,
        ..Default::default()
    };
    dptrain::train::train(o.resolve().unwrap()).unwrap();
    let ck = run.join("checkpoint-epoch0001.safetensors");
    let eval = || {
        let opts = dptrain::infer::eval::EvalOptions {
            workers: 1,
            ..Default::default()
        };
        dptrain::infer::eval::run(&ck, &opts).unwrap_or_else(|e| panic!("{e}"))
    };
    let decomposed_test = eval();
    assert_eq!(decomposed_test.samples, 4);
    std::fs::rename(
        dir.join("test").join(decomposed),
        dir.join("test").join(composed),
    )
    .unwrap();
    let composed_test = eval();
    assert_eq!(decomposed_test.loss.to_bits(), composed_test.loss.to_bits());
    // Both forms in one split: refused, naming both.
    std::fs::create_dir(dir.join("train").join(decomposed)).unwrap();
    let e = ImageFolder::open(&dir.join("train"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("one class written in two Unicode forms")
            && e.contains("caf<U+00E9>")
            && e.contains("cafe<U+0301>"),
        "{e}"
    );
}

#[test]
fn one_grey_image_first_does_not_turn_a_colour_folder_grey() {
    use dptrain::data::image_folder::ImageFolder;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 8, 4);
    let grey = ImageBuffer::from_fn(24, 24, |x, _| Luma([(x * 10) as u8]));
    // Sorted first in the first class.
    std::fs::write(dir.join("train").join("0").join("-.png"), png(&grey)).unwrap();
    let train = ImageFolder::open(&dir.join("train"), None).unwrap();
    assert_eq!(
        (train.channels, train.width),
        (3, 24),
        "{:?}",
        train.files[0]
    );
    // A folder of grey images only stays grey.
    let only = tmp.path().join("grey");
    for class in ["a", "b"] {
        std::fs::create_dir_all(only.join(class)).unwrap();
        std::fs::write(only.join(class).join("1.png"), png(&grey)).unwrap();
    }
    assert_eq!(ImageFolder::open(&only, None).unwrap().channels, 1);
}

#[test]
fn the_normalisation_counts_the_images_it_read_and_names_every_unreadable_one() {
    use dptrain::data::image_folder::ImageFolder;
    use dptrain::pipeline::estimate_normalization;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 8, 4);
    for name in ["zy.png", "zz.png"] {
        let bad = dir.join("train").join("1").join(name);
        std::fs::write(&bad, b"\x89PNG\r\n\x1a\n truncated").unwrap();
    }
    let folder = ImageFolder::open(&dir.join("train"), None).unwrap();
    assert_eq!(folder.len(), 10);
    let (_, how, warning) = estimate_normalization(&folder, &Transforms::OFF, 1000);
    assert_eq!(how, "estimated from 8 training images");
    let unreadable = warning.expect("the unreadable images are counted");
    assert_eq!(unreadable.errors.len(), 2);
    let warning = unreadable.warning();
    let refusal = unreadable.to_string();
    for (said, starts, then) in [
        (
            &warning,
            "2 unreadable images left out",
            "training skips them (--skip-bad-samples)",
        ),
        (
            &refusal,
            "2 unreadable images among",
            "training would stop at the first it reaches",
        ),
    ] {
        assert!(
            said.starts_with(starts)
                && said.contains(then)
                && said.contains("zy.png")
                && said.contains("zz.png"),
            "{said}"
        );
    }
    assert!(refusal.contains("give --skip-bad-samples"), "{refusal}");
}

#[test]
fn skipping_every_unreadable_image_of_a_class_is_refused_where_the_estimate_read_them_all() {
    use dptrain::data::image_folder::ImageFolder;
    use dptrain::pipeline::estimate_normalization;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 16, 4);
    // Class 1 keeps readable images: no class is lost.
    let class1 = dir.join("train").join("1");
    std::fs::write(class1.join("zz.png"), b"\x89PNG\r\n\x1a\n truncated").unwrap();
    let folder = ImageFolder::open(&dir.join("train"), None).unwrap();
    let (_, _, u) = estimate_normalization(&folder, &Transforms::OFF, 1000);
    assert!(u.unwrap().lost_classes.is_empty());
    // Every image of class 1 unreadable: lost where the estimate read the whole split, unknown
    // where it read a sample.
    for f in std::fs::read_dir(&class1).unwrap() {
        std::fs::write(f.unwrap().path(), b"").unwrap();
    }
    let folder = ImageFolder::open(&dir.join("train"), None).unwrap();
    let (_, _, u) = estimate_normalization(&folder, &Transforms::OFF, 1000);
    assert_eq!(u.unwrap().lost_classes, ["1"]);
    let (_, _, u) = estimate_normalization(&folder, &Transforms::OFF, 4);
    assert!(u.unwrap().lost_classes.is_empty());
    // A class --train-limit leaves no image of is not lost: one bad file of class 0 and the
    // limit keeping every third file, none of class 1's one.
    let few = tmp.path().join("few");
    std::fs::create_dir_all(few.join("1")).unwrap();
    std::fs::rename(dir.join("train").join("0"), few.join("0")).unwrap();
    std::fs::write(few.join("0").join("!.png"), b"").unwrap();
    std::fs::copy(few.join("0").join("0.png"), few.join("1").join("a.png")).unwrap();
    let mut folder = ImageFolder::open(&few, None).unwrap();
    assert_eq!((folder.len(), folder.labels[0]), (10, 0));
    folder.truncate(3);
    assert!(!folder.labels.contains(&1));
    let (_, _, u) = estimate_normalization(&folder, &Transforms::OFF, 1000);
    assert!(u.unwrap().lost_classes.is_empty());
    std::fs::rename(few.join("0"), dir.join("train").join("0")).unwrap();
    // Training that would skip them all is refused, naming the class (it trained before).
    let o = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.clone()),
        image_size: Some("28".into()),
        skip_bad_samples: Some(true),
        epochs: Some(1),
        batch: Some(4),
        run_dir: Some(tmp.path().join("run")),
        quiet: true,
        ..Default::default()
    };
    let e = dptrain::train::train(o.resolve().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("every training image of class '1' is unreadable") && e.contains("is empty"),
        "{e}"
    );
    assert!(!tmp.path().join("run").exists());
}

#[test]
fn a_resume_on_renamed_or_added_classes_is_refused_naming_both_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 32, 8);
    let options = |run: &str, epochs: usize| TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.clone()),
        image_size: Some("28".into()),
        epochs: Some(epochs),
        batch: Some(16),
        run_dir: Some(tmp.path().join(run)),
        quiet: true,
        ..Default::default()
    };
    dptrain::train::train(options("first", 1).resolve().unwrap()).unwrap();
    let ck = tmp.path().join("first/checkpoint-epoch0001.safetensors");
    let resume = |changed: bool| {
        let o = TrainOptions {
            resume: Some(ck.clone()),
            resume_changed: changed,
            ..options("again", 2)
        };
        dptrain::train::train(o.resolve().unwrap())
            .unwrap_err()
            .to_string()
    };
    // Class 1 renamed 2: the labels would be the same numbers, the names not.
    for split in ["train", "test"] {
        std::fs::rename(dir.join(split).join("1"), dir.join(split).join("2")).unwrap();
    }
    for changed in [false, true] {
        let e = resume(changed);
        assert!(
            e.contains("(2 classes then, 2 now; added: 2; removed: 1)") && e.contains("--weights"),
            "{e}"
        );
    }
    // A class added (blamed on the model's shapes before).
    for split in ["train", "test"] {
        std::fs::rename(dir.join(split).join("2"), dir.join(split).join("1")).unwrap();
        let (from, to) = (dir.join(split).join("1"), dir.join(split).join("3"));
        std::fs::create_dir(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
    }
    let e = resume(false);
    assert!(e.contains("(2 classes then, 3 now; added: 3)"), "{e}");
    assert!(!tmp.path().join("again").exists());
}

#[test]
fn a_folder_of_mixed_sizes_without_an_image_size_is_warned_of_the_stretch() {
    use dptrain::data::image_folder::ImageFolder;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 8, 4);
    // One photo stored rotated (EXIF orientation 6) in every file is one size, read upright.
    let rotated = tmp.path().join("rotated");
    let photo = with_orientation(&jpeg_grey(40, 30, |x, y| (x * 3 + y) as u8, 90), 6);
    for class in ["a", "b"] {
        std::fs::create_dir_all(rotated.join(class)).unwrap();
        for i in 0..3 {
            std::fs::write(rotated.join(class).join(format!("{i}.jpg")), &photo).unwrap();
        }
    }
    let upright = ImageFolder::open(&rotated, None).unwrap();
    assert_eq!(
        (upright.width, upright.height, upright.other_size),
        (30, 40, None)
    );
    let folder = ImageFolder::open(&dir.join("train"), None).unwrap();
    let (w, h) = folder.other_size.expect("the spread shows another size");
    assert_ne!((w, h), (folder.width, folder.height));
    let o = TrainOptions {
        dataset: Some("imagefolder".into()),
        data_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut cfg = o.resolve().unwrap();
    let source = dptrain::pipeline::Source::Folder(std::sync::Arc::new(folder.clone()));
    let (_, warnings) = dptrain::train::inputs::resolve(&mut cfg, &source).unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("not all one size") && w.contains("give --image-size")),
        "{warnings:?}"
    );
    // Given a size, nothing to say.
    let mut cfg = TrainOptions {
        image_size: Some("28".into()),
        ..o
    }
    .resolve()
    .unwrap();
    let (_, warnings) = dptrain::train::inputs::resolve(&mut cfg, &source).unwrap();
    assert!(!warnings.iter().any(|w| w.contains("not all one size")));
}

#[test]
fn a_resume_whose_data_moved_says_the_place_was_the_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("photos");
    mixed_folder(&dir, 32, 8);
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let first = run(&[
        "train",
        "--dataset",
        "imagefolder",
        "--data-dir",
        dir.to_str().unwrap(),
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--batch",
        "16",
        "--run-dir",
        "first",
        "--quiet",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
    let ck = "first/checkpoint-epoch0001.safetensors";
    let o = run(&["train", "--resume", ck, "--epochs", "2", "--quiet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("photos/train")
            && err.contains(&format!(
                "(this resume took --data-dir {} from the checkpoint's run: if the data has \
                 moved, give --data-dir with where it is now and --resume-changed",
                dir.display()
            )),
        "{err}"
    );
    // Given the new place, it resumes.
    let moved = [
        "train",
        "--resume",
        ck,
        "--epochs",
        "2",
        "--data-dir",
        "moved",
        "--resume-changed",
        "--quiet",
    ];
    let o = run(&moved);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
