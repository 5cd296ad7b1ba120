//! Deterministic synthetic data of any shape, for benchmarks and tests that
//! must not depend on files.
//!
//! It is *learnable* so a training smoke test can assert that loss falls and
//! accuracy rises: every class has a fixed random template image, and each
//! sample is its class's template plus independent uniform noise, clamped to
//! `u8`. The per-pixel noise is large compared with the template contrast,
//! so single pixels are unreliable but the image as a whole identifies the
//! class, as with real data. Everything comes from ChaCha8 seeded by
//! `seed`, so equal seeds give identical bytes on every platform.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::data::{DataError, Dataset, DatasetPair};

/// Template pixels are drawn from this range: away from 0 and 255 so
/// noise is rarely clipped and the class signal survives clamping.
const TEMPLATE_RANGE: std::ops::RangeInclusive<u8> = 48..=207;

/// Noise is uniform in `[-NOISE_AMPLITUDE, NOISE_AMPLITUDE)`.
const NOISE_AMPLITUDE: i32 = 96;

/// Largest dataset `generate` will build, in bytes, so a typo in the sizes
/// fails fast instead of exhausting memory.
pub const MAX_BYTES: u64 = 1 << 34;

/// RNG streams: templates are shared by both splits (so test data is drawn
/// from the same distribution as training), while samples of each split
/// come from their own stream so changing `test` leaves `train` unchanged.
const TEMPLATE_STREAM: u64 = 0;
/// Stream of the training samples.
const TRAIN_STREAM: u64 = 1;
/// Stream of the test samples.
const TEST_STREAM: u64 = 2;

/// Generates `train` + `test` samples of shape `(channels, height, width)`
/// over `classes` classes from `seed`. Labels are uniformly random.
pub fn generate(
    train: usize,
    test: usize,
    shape: (usize, usize, usize),
    classes: usize,
    seed: u64,
) -> Result<DatasetPair, DataError> {
    let (c, h, w) = shape;
    let spec = format!("synthetic:{c}x{h}x{w}:{classes}");
    let bad = |reason: String| DataError::BadSpec {
        spec: spec.clone(),
        reason,
    };
    if c == 0 || h == 0 || w == 0 {
        return Err(bad("every dimension must be at least 1".into()));
    }
    if !(1..=256).contains(&classes) {
        return Err(bad(format!(
            "{classes} classes: labels are bytes, so use 1 to 256 classes"
        )));
    }
    if train == 0 || test == 0 {
        return Err(bad(format!(
            "{train} training and {test} test samples: both splits need at least one"
        )));
    }
    let total = [c, h, w, train.saturating_add(test)]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .filter(|&n| n <= MAX_BYTES);
    if total.is_none() {
        return Err(bad(format!(
            "{train}+{test} samples of {c}x{h}x{w} exceed the {MAX_BYTES}-byte limit; use fewer \
             or smaller samples"
        )));
    }

    let sample_len = c * h * w;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(TEMPLATE_STREAM);
    let templates: Vec<u8> = (0..classes * sample_len)
        .map(|_| rng.gen_range(TEMPLATE_RANGE))
        .collect();

    let split = |n: usize, stream: u64| -> Dataset {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        let mut pixels = vec![0u8; n * sample_len];
        let mut labels = Vec::with_capacity(n);
        for sample in pixels.chunks_exact_mut(sample_len) {
            let label = rng.gen_range(0..classes);
            labels.push(label as u8);
            // Raw random bytes become the noise in place: one RNG call per
            // sample instead of one per pixel.
            rng.fill_bytes(sample);
            let t = &templates[label * sample_len..(label + 1) * sample_len];
            for (p, &tv) in sample.iter_mut().zip(t) {
                let noise = (i32::from(*p) - 128) * NOISE_AMPLITUDE / 128;
                *p = (i32::from(tv) + noise).clamp(0, 255) as u8;
            }
        }
        Dataset {
            name: "synthetic".to_string(),
            channels: c,
            height: h,
            width: w,
            num_classes: classes,
            pixels,
            labels,
        }
    };
    Ok(DatasetPair {
        train: split(train, TRAIN_STREAM),
        test: split(test, TEST_STREAM),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_samples_are_the_first_samples_of_more() {
        // A run with --train-limit generates only the samples it reads: they must be the
        // ones the whole set would have started with.
        let all = generate(40, 30, (3, 5, 4), 7, 11).unwrap();
        let few = generate(9, 4, (3, 5, 4), 7, 11).unwrap();
        for (few, all) in [(&few.train, &all.train), (&few.test, &all.test)] {
            assert_eq!(few.pixels, all.pixels[..few.pixels.len()]);
            assert_eq!(few.labels, all.labels[..few.labels.len()]);
        }
        assert_eq!((few.train.len(), few.test.len()), (9, 4));
    }

    #[test]
    fn rejects_bad_shapes() {
        for (shape, classes, want) in [
            ((0, 2, 2), 10, "at least 1"),
            ((1, 2, 2), 0, "1 to 256"),
            ((1, 2, 2), 257, "1 to 256"),
            ((1, 1 << 20, 1 << 20), 10, "limit"),
        ] {
            let m = generate(10, 10, shape, classes, 0).unwrap_err().to_string();
            assert!(m.contains(want), "{m}");
        }
        let m = generate(usize::MAX, usize::MAX, (9, 9, 9), 10, 0)
            .unwrap_err()
            .to_string();
        assert!(m.contains("limit"), "{m}");
    }

    #[test]
    fn nearest_template_classifier_learns_it() {
        // Class means estimated from training data classify the test split
        // well: the data is learnable, not noise.
        let d = generate(2000, 500, (1, 8, 8), 10, 7).unwrap();
        let n = d.train.sample_len();
        let mut sums = vec![0f64; 10 * n];
        let mut counts = [0f64; 10];
        for i in 0..d.train.len() {
            let l = d.train.labels[i] as usize;
            counts[l] += 1.0;
            for (s, &p) in sums[l * n..(l + 1) * n].iter_mut().zip(d.train.image(i)) {
                *s += f64::from(p);
            }
        }
        let mut correct = 0;
        for i in 0..d.test.len() {
            let img = d.test.image(i);
            let best = (0..10)
                .map(|c| {
                    let dist: f64 = img
                        .iter()
                        .zip(&sums[c * n..(c + 1) * n])
                        .map(|(&p, &s)| (f64::from(p) - s / counts[c]).powi(2))
                        .sum();
                    (dist, c)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap()
                .1;
            correct += usize::from(best == d.test.labels[i] as usize);
        }
        let acc = correct as f64 / d.test.len() as f64;
        assert!(acc > 0.9, "accuracy {acc}");
        // ...but not trivially: single pixels are noisy.
        assert!(d.train.pixels.iter().any(|&p| p < 40));
    }
}
