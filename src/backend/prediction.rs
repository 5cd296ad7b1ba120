//! What counts as a prediction, for every backend's loss forward and for eval and predict:
//! the one rule, so that training's test accuracy, `eval`'s counts and confusion matrix and
//! `predict`'s classes cannot disagree.

/// Whether a row of logits predicts a class: every logit is a number. A row holding NaN or an
/// infinity (a model whose weights overflow) predicts none, so its sample counts as wrong in
/// training's test accuracy (every backend's loss forward), in `eval` and in `predict` alike,
/// never as whichever class a comparison with NaN happens to leave first (a diverged model's
/// eval once read 100%).
pub fn predicts(logits: &[f32]) -> bool {
    logits.iter().all(|v| v.is_finite())
}

/// The class a row of logits predicts: the first largest logit (ties to the lower label, as
/// argmax), or none where the row does not [`predicts`].
pub fn predicted(logits: &[f32]) -> Option<usize> {
    if !predicts(logits) {
        return None;
    }
    let mut best = 0;
    for (j, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = j;
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_largest_logit_of_a_row_of_numbers_is_its_class() {
        assert_eq!(predicted(&[1.0, 3.0, 3.0, -1.0]), Some(1));
        // Signed zeros are equal: the lower label.
        assert_eq!(predicted(&[-0.0, 0.0]), Some(0));
        assert_eq!(predicted(&[0.0, f32::NAN]), None);
        assert_eq!(predicted(&[f32::NEG_INFINITY, 0.0]), None);
    }
}
