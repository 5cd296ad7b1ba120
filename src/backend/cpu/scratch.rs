//! Per-thread scratch of the convolution kernels (column matrices of im2col, padded input
//! rows of implicit im2col and their row offsets, Winograd's transformed tiles): buffers per
//! compute thread that grow to the largest request once.

use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ROW_OFFSETS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Column-matrix floats a tile aims for (192 K floats, 768 KB: it stays in L2 between the
/// im2col that writes it and the GEMM that reads it).
pub(super) const COL_BUDGET: usize = 3 << 16;

/// Rows a thread's row offsets hold (a gathered convolution tile's rows: its column matrix
/// would be at most `COL_BUDGET` floats, each row at least `MIN_SEGMENT`).
pub(super) const MAX_GATHERED_ROWS: usize = COL_BUDGET / super::gemm::MIN_SEGMENT;

/// What each compute thread holds for any layer, in floats: the column budget, GEMM's packed
/// block of A and the row offsets (8 bytes each). The column matrix grows past the budget when
/// a single row is wider than it allows ([`super::gemm::KC`] rows of the widest).
pub fn thread_floats() -> usize {
    COL_BUDGET + super::gemm::packed_a_floats() + 2 * MAX_GATHERED_ROWS
}

/// Runs `f` on the calling thread's row offsets (of implicit im2col), `len` of them at most
/// [`MAX_GATHERED_ROWS`]; the buffer is that long from its first use, so it never grows again.
pub(super) fn with_row_offsets<R>(len: usize, f: impl FnOnce(&mut [usize]) -> R) -> R {
    assert!(
        len <= MAX_GATHERED_ROWS,
        "{len} gathered rows, more than {MAX_GATHERED_ROWS}"
    );
    ROW_OFFSETS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < MAX_GATHERED_ROWS {
            c.resize(MAX_GATHERED_ROWS, 0);
        }
        f(&mut c[..len])
    })
}

/// Runs `f` on the calling thread's scratch, at least `len` floats (grown if shorter).
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < len {
            c.resize(len, 0.0);
        }
        f(&mut c[..len])
    })
}

/// What a workspace has reserved of every thread's scratch (see [`Reservation::reserve`]).
#[derive(Default)]
pub(super) struct Reservation {
    /// Floats reserved on the global pool's threads, for calls from outside any pool.
    global: usize,
}

impl Reservation {
    /// Grows the scratch of every thread of the current pool to at least `len` floats before a
    /// parallel loop whose tasks need `len`. Without it a thread grows its scratch the first
    /// time work stealing hands it one of a layer's largest tasks, which on a loaded machine
    /// can be a later step: an allocation in a steady-state step (seen in tests/alloc.rs and
    /// tests/inference_net.rs). Inside a pool every thread's scratch has the same length (each
    /// growth is a broadcast to all of them), so the calling thread's tells whether a broadcast
    /// is needed; outside one (the work goes to the global pool) this remembers what it
    /// reserved there.
    pub(super) fn reserve(&mut self, len: usize) {
        let reserved = match rayon::current_thread_index() {
            Some(_) => SCRATCH.with(|c| c.borrow().len()),
            None => self.global,
        };
        if len <= reserved {
            return;
        }
        rayon::broadcast(|_| {
            with_scratch(len, |_| ());
            with_row_offsets(0, |_| ());
            super::gemm::reserve_workspace();
        });
        if rayon::current_thread_index().is_none() {
            self.global = len;
        }
    }
}
