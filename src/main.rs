//! The `dptrain` binary: a thin shell over the library.

// mimalloc reuses freed blocks of the large per-op tensors instead of returning them to the
// kernel and faulting them in again each step (glibc's default for big allocations).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if let Err(e) = dptrain::cli::run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
