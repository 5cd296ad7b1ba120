//! What counts as a prediction, for every backend's loss forward and for eval and predict.

/// Whether a row of logits predicts a class: every logit is a number. A row holding NaN or an
/// infinity (a model whose weights overflow) predicts none, so its sample counts as wrong in
/// training's test accuracy (every backend's loss forward), in `eval` and in `predict` alike,
/// never as whichever class a comparison with NaN happens to leave first (a diverged model's
/// eval once read 100%).
pub fn predicts(logits: &[f32]) -> bool {
    logits.iter().all(|v| v.is_finite())
}
