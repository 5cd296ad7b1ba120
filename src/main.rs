//! The `dptrain` binary: a thin shell over the library.

// mimalloc reuses freed blocks of the large per-op tensors instead of returning them to the
// kernel and faulting them in again each step (glibc's default for big allocations).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (linked in through the `mimalloc` crate).
    fn mi_option_set(option: std::os::raw::c_int, value: std::os::raw::c_long);
}

/// `mi_option_purge_delay` in mimalloc 2's `mi_option_t`.
const MI_OPTION_PURGE_DELAY: std::os::raw::c_int = 15;

fn main() {
    // Never hand freed memory back to the OS: a training step frees and reallocates the same
    // large tensors every step, and with mimalloc's default 10 ms purge delay each step paid
    // ~500 page faults again (vgg-small, 2 workers: 20-25k minor faults per 40 steps before,
    // ~600 after), faults that threads of one process take under one kernel lock. Memory stays
    // bounded by the peak of one step.
    // SAFETY: a plain option store in the allocator, done before any other thread exists.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    if let Err(e) = dptrain::cli::run() {
        dptrain::cli::print_error(&e);
        std::process::exit(1);
    }
}
