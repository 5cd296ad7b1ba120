//! Options given where they would change nothing: each command refuses them by name rather
//! than ignoring them (`simulate --profile P --batch 8`: a profile's batch is its own).

/// The first of `options` (flag, whether given) that was given.
pub(super) fn first_given(options: &[(&'static str, bool)]) -> Option<&'static str> {
    options
        .iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| *flag)
}
