//! "Did you mean": the candidate closest to a misspelt name, for errors about model files.

/// The candidate within 2 edits (insertions, deletions, substitutions) of `name`, the closest
/// first (the least in order on a tie), if any.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    // Names whose lengths differ by more than 2 are further than 2 apart: skipped unmeasured
    // (the distance is quadratic in the lengths).
    let len = name.chars().count();
    if len > 64 {
        return None;
    }
    candidates
        .into_iter()
        .filter(|k| k.len().abs_diff(name.len()) <= 8 && k.chars().count().abs_diff(len) <= 2)
        .map(|k| (distance(name, k), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let sub = prev[j - 1] + (a[i - 1] != b[j - 1]) as usize;
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_name_two_edits_away_and_nothing_further() {
        assert_eq!(closest("kernal", ["stride", "kernel"]), Some("kernel"));
        assert_eq!(closest("conv", ["conv1", "conv22"]), Some("conv1"));
        assert_eq!(closest("out", ["stride", "bias"]), None);
    }
}
