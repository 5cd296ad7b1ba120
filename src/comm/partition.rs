//! What every way of summing shares and no transport: the partition of a buffer into chunks
//! every rank computes alike, reused scratch space, and the one addition (so sums are
//! deterministic).

use std::ops::Range;

/// Element range of chunk `i` when `len` elements are split into `parts`
/// nearly equal chunks (the first `len % parts` chunks get one extra), so
/// every rank computes the same partition without communicating.
pub(crate) fn chunk_range(len: usize, parts: usize, i: usize) -> Range<usize> {
    chunk_span(len, parts, i, i + 1)
}

/// Element range covering chunks `first..last` of the partition above.
pub(crate) fn chunk_span(len: usize, parts: usize, first: usize, last: usize) -> Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = |c: usize| c * base + c.min(extra);
    start(first)..start(last)
}

/// Returns `scratch[..n]`, growing (never shrinking) the buffer first.
pub(crate) fn scratch_slice(scratch: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if scratch.len() < n {
        scratch.resize(n, 0.0);
    }
    &mut scratch[..n]
}

/// `dst[i] += src[i]`, one f32 add per element so the result depends only on
/// the two operands (no reassociation), which keeps modes deterministic.
pub(crate) fn add_into(dst: &mut [f32], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_everything() {
        for len in [0, 1, 5, 7, 100] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk_range(len, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() <= len / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
                assert_eq!(chunk_span(len, parts, 0, parts), 0..len);
            }
        }
    }
}
