//! `dptrain predict`: the most likely classes of image files.

use crate::infer::predict::{collect_images, PredictFailure, Prediction, Predictor};
use crate::infer::TrainedModel;
use crate::infer::NO_PREDICTION_CAUSE;
use crate::terminal::print_error;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(super) struct PredictArgs {
    /// The checkpoint (a run's checkpoint-epochNNNN.safetensors).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Image files, or directories walked for .png/.jpg/.jpeg files.
    #[arg(required = true)]
    images: Vec<PathBuf>,
    /// Classes shown per image.
    #[arg(long, default_value_t = 3)]
    top_k: usize,
    /// Images per forward.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// One JSON object per image (file and top classes, or file and error) instead of text.
    #[arg(long)]
    json: bool,
}

/// Predicts every image; a file that cannot be read is reported and the others still
/// predicted, and the command then fails naming how many.
pub(super) fn run(a: PredictArgs) -> Result<(), String> {
    if a.top_k == 0 {
        return Err("--top-k must be at least 1".into());
    }
    let model = TrainedModel::load(&a.checkpoint).map_err(|e| e.to_string())?;
    let (files, walked) = collect_images(&a.images)?;
    // A batch past the images would only allocate for images that are not there (eval
    // clamps its batch to the split the same way).
    let batch = a.batch.min(files.len().max(1));
    let mut predictor = Predictor::new(&model, batch)?;
    let bar = if walked {
        indicatif::ProgressBar::new(files.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let (mut failed, mut no_prediction) = (0, 0);
    for chunk in files.chunks(predictor.batch()) {
        for (file, result) in chunk.iter().zip(predictor.predict(chunk, a.top_k)) {
            let text = match result {
                Ok(p) => Some(line(&p, a.json)),
                Err(e) => {
                    failed += 1;
                    no_prediction += usize::from(matches!(e, PredictFailure::NoPrediction { .. }));
                    bar.suspend(|| print_error(&e.to_string()));
                    a.json
                        .then(|| serde_json::json!({"file": file.to_string_lossy(), "error": e.to_string()}))
                        .map(|j| j.to_string())
                }
            };
            let Some(text) = text else { continue };
            bar.suspend(|| crate::outln!("{text}"));
            if !crate::terminal::stdout_open() {
                // The reader has gone (`| head`) or stdout failed: nothing more to print to
                // (a failure other than a closed pipe is reported by main).
                return Ok(());
            }
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    if no_prediction > 0 {
        print_error(&format!(
            "the model's outputs were not numbers for {}: {NO_PREDICTION_CAUSE}",
            crate::terminal::counted(no_prediction, "image")
        ));
    }
    let predicted = files.len() - failed;
    match (failed, predicted) {
        (0, _) => Ok(()),
        (1, 0) => Err("the file could not be predicted (named above)".into()),
        (_, 0) => Err(format!(
            "none of the {failed} files could be predicted (each named above)"
        )),
        (_, 1) => Err(format!(
            "{failed} of {} files could not be predicted (each named above); the other one \
             was predicted",
            files.len()
        )),
        _ => Err(format!(
            "{failed} of {} files could not be predicted (each named above); the other \
             {predicted} were predicted",
            files.len()
        )),
    }
}

/// One image's result: `FILE: class 97.12%, class 1.03%, ...`, or its JSON.
fn line(p: &Prediction, json: bool) -> String {
    if json {
        // Nothing in a prediction fails to serialise (the file is written as text:
        // `output::path_as_text`); were it to, the line says so rather than going blank.
        return serde_json::to_string(p).unwrap_or_else(|e| {
            serde_json::json!({"file": p.file.to_string_lossy(), "error": e.to_string()})
                .to_string()
        });
    }
    let top: Vec<String> = p
        .top
        .iter()
        .map(|c| format!("{} {:.2}%", c.class, 100.0 * c.probability))
        .collect();
    format!("{}: {}", crate::terminal::one_line(&p.file), top.join(", "))
}
