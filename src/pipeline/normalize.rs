//! Per-channel input normalisation, `(x / 255 - mean) / std`, as the model expects its input.

use crate::data::Dataset;

/// Per-channel normalisation `(x/255 - mean) / std`, folded into one multiply-add per pixel.
#[derive(Debug, Clone)]
pub struct Normalize {
    scale: Vec<f32>,
    shift: Vec<f32>,
    /// The mean and standard deviation given (recorded in checkpoints as they are).
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalize {
    /// From per-channel mean and standard deviation of pixel/255.
    pub fn new(mean: &[f32], std: &[f32]) -> Self {
        Self {
            scale: std.iter().map(|s| 1.0 / (255.0 * s)).collect(),
            shift: mean.iter().zip(std).map(|(m, s)| -m / s).collect(),
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }

    /// The per-channel mean of pixel/255 it was made from.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// The per-channel standard deviation of pixel/255 it was made from.
    pub fn std(&self) -> &[f32] {
        &self.std
    }

    /// For a dataset, with its own statistics.
    pub fn for_dataset(ds: &Dataset) -> Self {
        let (mean, std) = ds.mean_std();
        Self::new(&mean, &std)
    }

    /// `(scale, shift)` of channel `c`: a pixel `p` becomes `p * scale + shift`.
    pub fn channel(&self, c: usize) -> (f32, f32) {
        (self.scale[c], self.shift[c])
    }

    /// Normalises one image (C planes of `plane` pixels) into `out`.
    pub fn apply(&self, pixels: &[u8], plane: usize, out: &mut [f32]) {
        for (c, (src, dst)) in pixels.chunks(plane).zip(out.chunks_mut(plane)).enumerate() {
            let (a, b) = (self.scale[c], self.shift[c]);
            for (d, &p) in dst.iter_mut().zip(src) {
                *d = p as f32 * a + b;
            }
        }
    }
}

/// Per-channel mean and standard deviation of pixel/255 (`--normalize MEAN,.../STD,...`):
/// what a model's input is normalised with, stored with the run. Display and parse round-trip
/// (`0.485,0.456,0.406/0.229,0.224,0.225`).
#[derive(Debug, Clone, PartialEq)]
pub struct Normalization {
    /// Mean per channel.
    pub mean: Vec<f32>,
    /// Standard deviation per channel (each > 0).
    pub std: Vec<f32>,
}

/// A bad `--normalize`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad normalisation '{given}': {why}; write MEAN,.../STD,... with one value per channel (e.g. 0.1307/0.3081 or 0.485,0.456,0.406/0.229,0.224,0.225), estimate, or dataset")]
pub struct NormalizationError {
    /// As given.
    pub given: String,
    /// What is wrong.
    pub why: String,
}

impl Normalization {
    /// Parses `MEAN,.../STD,...`: as many means as deviations, each finite, deviations > 0.
    pub fn parse(s: &str) -> Result<Self, NormalizationError> {
        let bad = |why: &str| NormalizationError {
            given: s.to_string(),
            why: why.into(),
        };
        let (m, d) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("no '/' between means and deviations"))?;
        let list = |t: &str| -> Result<Vec<f32>, NormalizationError> {
            t.split(',')
                .map(|v| v.trim().parse::<f32>().ok().filter(|x| x.is_finite()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("not a list of numbers"))
        };
        let (mean, std) = (list(m)?, list(d)?);
        if mean.len() != std.len() {
            return Err(bad("as many means as deviations are needed"));
        }
        if !(1..=4).contains(&mean.len()) {
            return Err(bad("1 to 4 channels"));
        }
        if std.iter().any(|&x| x <= 0.0) {
            return Err(bad("every deviation must be > 0"));
        }
        Ok(Self { mean, std })
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.mean.len()
    }

    /// The folded multiply-add form the loaders apply.
    pub fn to_normalize(&self) -> Normalize {
        Normalize::new(&self.mean, &self.std)
    }
}

impl std::fmt::Display for Normalization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let join = |v: &[f32]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        write!(f, "{}/{}", join(&self.mean), join(&self.std))
    }
}

impl std::str::FromStr for Normalization {
    type Err = NormalizationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Where a run's normalisation comes from (`--normalize`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum NormalizeChoice {
    /// The dataset's published constants (MNIST, Fashion-MNIST, CIFAR-10), else estimated from
    /// the training split (`dataset`, the default).
    #[default]
    Dataset,
    /// Estimated from a sample of the training split after the evaluation transform.
    Estimate,
    /// Given values.
    Given(Normalization),
    /// A resumed run's `dataset`: the checkpoint's values, which its run trained with
    /// (`train::inputs::follow_checkpoint`).
    Resumed(Normalization),
}

impl NormalizeChoice {
    /// Parses `dataset`, `estimate` or `MEAN,.../STD,...`.
    pub fn parse(s: &str) -> Result<Self, NormalizationError> {
        match s.trim() {
            "dataset" | "default" => Ok(Self::Dataset),
            "estimate" => Ok(Self::Estimate),
            v => Normalization::parse(v).map(Self::Given),
        }
    }
}

impl std::fmt::Display for NormalizeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dataset => f.write_str("dataset"),
            Self::Estimate => f.write_str("estimate"),
            Self::Given(n) | Self::Resumed(n) => write!(f, "{n}"),
        }
    }
}

/// Images a normalisation estimate could not read, and left out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unreadable {
    /// Each one's error, naming its file (at most the estimate's sample of images).
    pub errors: Vec<String>,
    /// The classes none of whose training images could be read, where the estimate read
    /// every training image (a set of up to its sample's size); otherwise unknown and empty.
    pub lost_classes: Vec<String>,
}

impl Unreadable {
    /// The estimate's record, once it has read the images labelled `read` and failed on
    /// those labelled `failed`, of a set whose `classes` are given (`whole`: it tried every
    /// image of the set): None when it could read them all. A class is lost where it tried
    /// some of its images and read none (a class `--train-limit` left no image of is not).
    pub(crate) fn finish(
        mut self,
        (read, failed): (&[u8], &[u8]),
        classes: &[String],
        whole: bool,
    ) -> Option<Self> {
        if self.errors.is_empty() {
            return None;
        }
        if whole {
            let mut seen = vec![false; classes.len()];
            read.iter().for_each(|&l| seen[usize::from(l)] = true);
            let mut lost = vec![false; classes.len()];
            failed
                .iter()
                .for_each(|&l| lost[usize::from(l)] = !seen[usize::from(l)]);
            self.lost_classes = (classes.iter().zip(lost))
                .filter(|(_, lost)| *lost)
                .map(|(c, _)| c.clone())
                .collect();
        }
        Some(self)
    }

    /// The warning a run that skips unreadable samples (`--skip-bad-samples`) gives of them.
    pub fn warning(&self) -> String {
        format!(
            "{} left out of the normalisation estimate; training skips them \
             (--skip-bad-samples):{}",
            crate::terminal::counted(self.errors.len(), "unreadable image"),
            crate::data::listed(&self.errors)
        )
    }
}

/// A run that does not skip unreadable samples refuses to start when the normalisation
/// estimate met some: training stops at the first it reaches (or, in an epoch's dropped tail,
/// never), so the run would spend its epochs before failing on what is known at start.
impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} among the training images the normalisation estimate read, and training \
             would stop at the first it reaches: mend or remove them, or give \
             --skip-bad-samples to train without them:{}",
            crate::terminal::counted(self.errors.len(), "unreadable image"),
            crate::data::listed(&self.errors)
        )
    }
}
