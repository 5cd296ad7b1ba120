//! Messages to the terminal beside the results: `error:` and `warning:` lines on stderr. Below
//! every command module (the trainer, benchmarks and the CLI all warn), so none of them has to
//! import the CLI for it.

/// Prints `error: MESSAGE` to stderr in one write, so lines from several MPI ranks sharing one
/// terminal or pipe do not interleave mid-line (`eprintln!` writes its pieces separately).
pub fn print_error(message: &str) {
    use std::io::Write;
    let line = format!("error: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Prints `warning: MESSAGE` to stderr as one preformatted string (one write, see
/// [`print_error`]); through `eprint!`, so that tests capture it.
pub fn print_warning(message: &str) {
    let line = format!("warning: {message}\n");
    eprint!("{line}");
}
