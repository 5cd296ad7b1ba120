//! Using a trained model: `dptrain eval` ([`eval`]: loss, top-1/top-5, per-class accuracy and
//! the confusion matrix of a checkpoint on a dataset split, data-parallel over worker threads)
//! and `dptrain predict` ([`predict`]: the top classes of image files).
//!
//! Both read everything from the checkpoint ([`TrainedModel`]: the model file's text, class
//! names, input size, normalisation, evaluation transforms) and run the net's `Mode::Eval`
//! forward, the same kernels as training's evaluation, so `eval` on a run's test split gives
//! that run's test accuracy to the bit.

pub mod eval;
pub mod predict;

pub use crate::train::description::TrainedModel;

use crate::data::DataError;
use crate::train::checkpoint::CheckpointError;

/// Why an evaluation or a prediction could not be made.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// The checkpoint could not be read, or does not describe its model.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The dataset could not be found, read or decoded.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The options do not make an evaluation (the message says which and what to do).
    #[error("{0}")]
    Options(String),
    /// The dataset's samples are not what the model takes.
    #[error(
        "the dataset {dataset} does not fit checkpoint {}: {what}",
        checkpoint.display()
    )]
    Mismatch {
        /// The checkpoint.
        checkpoint: std::path::PathBuf,
        /// The dataset.
        dataset: String,
        /// What differs, with both values.
        what: String,
    },
    /// The model's inputs are neither grey nor colour images, which image and packed files
    /// are read as.
    #[error(
        "checkpoint {}: the model takes {channels}-channel inputs, and image files (and packed \
         files of them) are read grey (1 channel) or colour (3): predict cannot feed it, and \
         eval only on a dataset of its own kind (eval --dataset)",
        checkpoint.display()
    )]
    NotImages {
        /// The checkpoint.
        checkpoint: std::path::PathBuf,
        /// Its input channels.
        channels: usize,
    },
    /// A result file could not be written.
    #[error("{0}")]
    Output(String),
    /// Worker threads could not be started.
    #[error("cannot start evaluation threads: {0}")]
    Threads(String),
    /// The nets asked for do not fit in the memory this process may use.
    #[error(transparent)]
    Memory(#[from] crate::limits::MemoryError),
}

/// Refuses `workers` inference nets of `model` at `batch` (each on `threads` threads) that would
/// not fit, before any is allocated: the run memory estimate (`plan::memory`) with no
/// gradients, shared with `train`, `profile` and the benchmarks. `workers_flag` is the
/// command's option that sets the workers, if it has one (`eval --workers`; not `predict`).
pub fn check_memory(
    model: &crate::train::description::TrainedModel,
    batch: usize,
    (workers, workers_flag): (usize, Option<&'static str>),
    threads: usize,
) -> Result<(), InferError> {
    let mut inputs =
        crate::plan::memory::MemoryInputs::training(&model.graph, batch, workers, threads);
    inputs.training = false;
    inputs.workers_flag = workers_flag;
    inputs.data_buffers = workers;
    inputs.conv_algo = model.description.conv_algo;
    let nets = if workers == 1 {
        "an inference net".to_string()
    } else {
        format!("{workers} inference nets")
    };
    crate::plan::memory::estimate(&inputs).check(&format!("{nets} at --batch {batch}"))?;
    Ok(())
}

/// The channels images are read with for `model`: its input's, which must be grey (1) or
/// colour (3) for image files and packed files to be converted to it (an image is decoded as
/// one or the other).
pub fn image_channels(
    model: &crate::train::description::TrainedModel,
) -> Result<usize, InferError> {
    match model.description.input[0] {
        c @ (1 | 3) => Ok(c),
        channels => Err(InferError::NotImages {
            checkpoint: model.path.clone(),
            channels,
        }),
    }
}

impl From<InferError> for String {
    fn from(e: InferError) -> Self {
        e.to_string()
    }
}

/// The probabilities of one row of logits (softmax, in f64 as the loss computes it).
pub fn softmax(logits: &[f32], out: &mut Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&z| ((z - max) as f64).exp()).sum();
    out.clear();
    out.extend(
        logits
            .iter()
            .map(|&z| (((z - max) as f64).exp() / sum) as f32),
    );
}

/// Why a model's outputs are not numbers, said once: after the images `predict` found so, in `eval`'s warning.
pub const NO_PREDICTION_CAUSE: &str = "the checkpoint's weights overflow (a run that diverged: \
its metrics show from when); train again from an earlier checkpoint or with a lower --lr";

/// The rank of class `label` among `logits`: how many classes come before it, by larger
/// logit, ties to the lower label (so rank 0 is the argmax with the first maximum winning, as
/// the loss layer counts a correct prediction). A row that predicts nothing (a logit not a
/// number: [`crate::backend::predicts`]) ranks every label last, past any top-k.
pub fn rank_of(logits: &[f32], label: usize) -> usize {
    if !crate::backend::predicts(logits) {
        return logits.len();
    }
    let z = logits[label];
    logits
        .iter()
        .enumerate()
        .filter(|&(j, &v)| v > z || (v == z && j < label))
        .count()
}

/// The `k` most likely classes of a row of numbers ([`crate::backend::predicts`]): (label,
/// value), largest first, equal values (-0 and 0 too) to the lower label, so the first is
/// [`crate::backend::predicted`] and each label's place is its [`rank_of`].
pub fn top_k(values: &[f32], k: usize) -> Vec<(usize, f32)> {
    // A NaN would make the order inconsistent: callers rank rows that predict.
    debug_assert!(
        crate::backend::predicts(values),
        "top_k of a row that predicts nothing"
    );
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| {
        let by_value = values[b].partial_cmp(&values[a]);
        by_value
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    order.truncate(k);
    order.into_iter().map(|i| (i, values[i])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_top_k_break_ties_to_the_lower_label() {
        let z = [1.0, 3.0, 3.0, -1.0];
        assert_eq!(rank_of(&z, 1), 0);
        assert_eq!(rank_of(&z, 2), 1);
        assert_eq!(rank_of(&z, 0), 2);
        assert_eq!(rank_of(&z, 3), 3);
        assert_eq!(top_k(&z, 2), vec![(1, 3.0), (2, 3.0)]);
        let mut p = Vec::new();
        softmax(&z, &mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] == p[2] && p[1] > p[0] && p[0] > p[3]);
    }

    #[test]
    fn top_k_rank_and_the_predicted_class_agree_on_signed_zeros() {
        let z = [-0.0, 0.0, -1.0];
        assert_eq!(top_k(&z, 1)[0].0, crate::backend::predicted(&z).unwrap());
        assert_eq!(rank_of(&z, 0), 0);
        assert_eq!(rank_of(&z, 1), 1);
    }

    #[test]
    fn a_row_that_is_not_all_numbers_ranks_every_label_last() {
        for z in [
            [f32::NAN; 3],
            [1.0, f32::NAN, 0.0],
            [f32::INFINITY, 0.0, 0.0],
        ] {
            assert!((0..3).all(|y| rank_of(&z, y) == 3), "{z:?}");
        }
    }
}
