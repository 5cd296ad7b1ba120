//! The `dptrain` binary: a thin shell over the library.

// Training steps allocate nothing (tests/alloc.rs); what does allocate per sample is the input
// pipeline (image decoding), where mimalloc's thread-local free lists beat glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Ctrl-C or kill puts away what is under way (temporary files, scratch directories,
    // launch's MPI job) instead of leaving it.
    if let Err(e) = dptrain::interrupt::watch_signals() {
        dptrain::terminal::print_warning(&format!(
            "cannot watch for signals ({e}): what Ctrl-C or kill interrupts (a write's \
             temporary file, launch's MPI job) is left behind"
        ));
    }
    // A failed write to stdout (a full device) fails the command once it is done; a reader that
    // closed the pipe does not (see dptrain::terminal::print_out).
    if let Err(e) = dptrain::cli::run().and_then(|()| dptrain::terminal::stdout_result()) {
        dptrain::cli::print_error(&e);
        dptrain::interrupt::exit_cleaning_up(1);
    }
}
