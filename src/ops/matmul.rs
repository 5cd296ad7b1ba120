//! A thin, safe front to the `gemm` crate for our kernels.
//!
//! `gemm` takes raw pointers and strides; [`Mat`] carries a borrowed operand with its strides
//! and [`matmul`] checks that every index the strides can reach lies inside the slices before
//! calling it. Single-threaded on purpose: callers parallelise over samples or chunks, which
//! keeps results independent of the thread count.

use gemm::{gemm, Parallelism};

/// A read-only row-major matrix operand: element (r, c) is `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// A dense row-major `[rows, cols]` matrix.
    pub(crate) fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a dense row-major matrix with `cols` columns (read in place).
    pub(crate) fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }
    /// Whether every element of a `[rows, cols]` view lies inside `data`.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst[m, n] (+)= lhs[m, k] x rhs[k, n]`, `dst` dense row-major, single-threaded.
pub(crate) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
) {
    assert!(dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n));
    // SAFETY: the assert above bounds every index the strides can reach.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}
