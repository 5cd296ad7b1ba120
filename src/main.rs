//! The `dptrain` binary: a thin shell over the library.

// Training steps allocate nothing (tests/alloc.rs); what does allocate per sample is the input
// pipeline (image decoding), where mimalloc's thread-local free lists beat glibc's arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Ctrl-C or kill removes the temporary files being written, instead of leaving them.
    if let Err(e) = dptrain::output::remove_on_signal() {
        eprintln!("warning: cannot watch for signals ({e}): an interrupted write may leave its temporary file");
    }
    // A failed write to stdout (a full device) fails the command once it is done; a reader that
    // closed the pipe does not (see dptrain::terminal::print_out).
    if let Err(e) = dptrain::cli::run().and_then(|()| dptrain::terminal::stdout_result()) {
        dptrain::cli::print_error(&e);
        std::process::exit(1);
    }
}
