//! A batch in the layout the model takes, and the collation that fills it.

use super::{Augment, Draw, Normalize, SampleScratch, Source};
use crate::data::Dataset;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One worker's batch: normalised f32 images (N, C, H, W) and labels, in buffers that are
/// refilled step after step.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Normalised pixels, N*C*H*W.
    pub images: Vec<f32>,
    /// Class labels, N.
    pub labels: Vec<u32>,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Fills `batch` with samples `indices` of `ds`, reusing its buffers.
pub fn collate(ds: &Dataset, indices: &[u32], norm: &Normalize, batch: &mut Batch) {
    let len = ds.sample_len();
    batch.images.resize(indices.len() * len, 0.0);
    batch.labels.clear();
    for (&i, out) in indices.iter().zip(batch.images.chunks_mut(len)) {
        norm.apply(ds.image(i as usize), ds.height * ds.width, out);
        batch.labels.push(ds.labels[i as usize] as u32);
    }
}

/// Bad samples met while loading (with `--skip-bad-samples`), for the run's summary.
#[derive(Debug, Default)]
pub struct LoadStats {
    skipped: AtomicUsize,
    examples: Mutex<Vec<String>>,
}

/// Skip messages kept for the summary; the count goes on past it.
const KEPT_EXAMPLES: usize = 5;

impl LoadStats {
    /// Sample reads skipped so far (a bad file counts once per epoch it is drawn in).
    pub fn skipped(&self) -> usize {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The first few skip reasons, each naming the file.
    pub fn examples(&self) -> Vec<String> {
        self.examples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    fn record(&self, why: String) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut v) = self.examples.lock() {
            if v.len() < KEPT_EXAMPLES {
                v.push(why);
            }
        }
    }
}

/// Everything needed to turn sample indices into a training batch; cloned into every loader
/// thread (the data itself is shared).
#[derive(Debug, Clone)]
pub struct Collator {
    /// The training set.
    pub source: Source,
    /// Normalisation applied after augmentation.
    pub norm: Normalize,
    /// The training transforms, in order (`--augment`, with the evaluation list in front when
    /// a folder's images need resizing and the list does not resize).
    pub augment: Augment,
    /// The run's seed (augmentation draws from (seed, epoch, sample index)).
    pub seed: u64,
    /// Leave unreadable samples out of their batch (and count them) instead of failing.
    pub skip_bad: bool,
    /// Where skipped samples are counted.
    pub stats: Arc<LoadStats>,
    /// An injected loader failure (reliability tests).
    pub fault: Option<crate::testbed::fault::Fault>,
}

impl Collator {
    /// Fails like a broken loader if an injected `data` fault strikes this batch.
    pub fn check_fault(&self, global_step: usize, worker: usize) -> Result<(), String> {
        use crate::testbed::fault::FaultPhase;
        match self.fault {
            Some(f) if f.hits(FaultPhase::Data, global_step, worker) => Err(format!(
                "injected fault: loader failure for global step {global_step}"
            )),
            _ => Ok(()),
        }
    }

    /// Fills `batch` with samples `indices` of `epoch`, reusing its buffers (no allocation once
    /// they have reached batch size). A bad sample fails the batch with an error naming it, or
    /// is left out when `skip_bad` (the batch is then shorter).
    pub fn fill(
        &self,
        indices: &[u32],
        epoch: usize,
        scratch: &mut SampleScratch,
        batch: &mut Batch,
    ) -> Result<(), String> {
        let len = self.source.sample_len();
        batch.images.resize(indices.len() * len, 0.0);
        batch.labels.clear();
        let mut n = 0;
        for &i in indices {
            let i = i as usize;
            let out = &mut batch.images[n * len..(n + 1) * len];
            let draw = Draw::new(self.seed, epoch, i);
            match self
                .source
                .write_sample(i, &self.augment, &self.norm, draw, scratch, out)
            {
                Ok(()) => {
                    batch.labels.push(self.source.label(i));
                    n += 1;
                }
                Err(e) if self.skip_bad => self.stats.record(format!("sample {i}: {e}")),
                Err(e) => {
                    return Err(format!(
                        "sample {i}: {e} (or train with --skip-bad-samples to leave unreadable \
                         samples out and count them)"
                    ))
                }
            }
        }
        batch.images.truncate(n * len);
        if n == 0 && !indices.is_empty() {
            return Err(format!(
                "every one of the {} samples of a batch was unreadable (skipped so far: {}; \
                 first: {}); check the dataset",
                indices.len(),
                self.stats.skipped(),
                self.stats.examples().first().map_or("-", String::as_str)
            ));
        }
        Ok(())
    }
}
