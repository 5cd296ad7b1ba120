//! Messages to the terminal beside the results: `error:` and `warning:` lines on stderr. Below
//! every command module (the trainer, benchmarks and the CLI all warn), so none of them has to
//! import the CLI for it. And the one rule for a count in a message ([`counted`]), and for a
//! path inside a command a message suggests ([`shell_quoted`]).

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

/// Prints `note: MESSAGE` to stderr as one preformatted string (one write, see
/// [`print_warning`]): something done or chosen that the user should know about.
pub fn print_note(message: &str) {
    let line = format!("note: {message}\n");
    eprint!("{line}");
}

/// What became of the process's stdout: open, closed by its reader, or failed otherwise.
static STDOUT_STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(STDOUT_OPEN);
const STDOUT_OPEN: u8 = 0;
const STDOUT_CLOSED: u8 = 1;
const STDOUT_FAILED: u8 = 2;
/// The first write error on stdout other than a closed pipe, for [`stdout_result`].
static STDOUT_ERROR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Writes results to stdout: every result line of the binary goes through here (through
/// [`outln!`](crate::outln) and [`out!`](crate::out)), never through `println!`, which panics
/// when stdout fails. A reader that has gone (`| head -1`: a broken pipe) ends printing quietly,
/// as Unix tools do, and the command carries on to the end (a training run still writes its
/// checkpoint, metrics, summary and report); any other failure (`> /dev/full`) ends printing too
/// and is reported by [`stdout_result`] when the command is done. Flushed per call, so a failure
/// is seen at the write that caused it, not at exit.
pub fn print_out(args: std::fmt::Arguments) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_STATE.load(Ordering::Relaxed) != STDOUT_OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) else {
        return;
    };
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        STDOUT_STATE.store(STDOUT_CLOSED, Ordering::Relaxed);
    } else {
        STDOUT_STATE.store(STDOUT_FAILED, Ordering::Relaxed);
        let mut first = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| {
            format!("cannot print the results to stdout: {e} (the rest of the output was dropped)")
        });
    }
}

/// Whether stdout still takes output: false once its reader has gone or a write failed, so a
/// command printing a long stream can stop producing it.
pub fn stdout_open() -> bool {
    STDOUT_STATE.load(std::sync::atomic::Ordering::Relaxed) == STDOUT_OPEN
}

/// The outcome of everything printed through [`print_out`]: `Ok` if every write succeeded or
/// the reader closed the pipe (a quiet stop), the first error otherwise (a full device).
pub fn stdout_result() -> Result<(), String> {
    let first = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    first.clone().map_or(Ok(()), Err)
}

/// `println!` for results: prints through [`terminal::print_out`](crate::terminal::print_out),
/// so a closed pipe or a full device on stdout never panics.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::terminal::print_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::terminal::print_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for results, through [`terminal::print_out`](crate::terminal::print_out) (see
/// [`outln!`](crate::outln)).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::terminal::print_out(format_args!($($arg)*))
    };
}

/// A number as messages show it: as Rust writes it where that is short, in exponent form
/// where it is very small or very large (1e300, not 301 digits; 1e-40, not forty zeros).
/// Generic so an `f32` shows its own shortest digits (0.1, not 0.10000000149).
pub fn number<T: std::fmt::Display + std::fmt::LowerExp + Copy + Into<f64>>(v: T) -> String {
    // The lower end a hair below 1e-4: f32's nearest to 1e-4 is 0.99999997e-4 as an f64, and
    // reads 0.0001 as an f32.
    let x: f64 = v.into();
    if x.is_finite() && x != 0.0 && !(0.999_999e-4..1e6).contains(&x.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// `n` things in a message: "1 image", "2 images" (`thing` singular, plural with an `s`).
pub fn counted(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// `path` on one line of output: as it displays, with control characters (a newline in a file
/// name would split a line-per-file listing) escaped as Rust writes them (`\n`, `\u{7f}`).
pub fn one_line(path: &std::path::Path) -> String {
    let name = path.to_string_lossy();
    if !name.chars().any(char::is_control) {
        return name.into_owned();
    }
    name.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `path` as one shell word, for a command a message tells the user to run: as it is when it
/// holds only characters no shell treats specially, else in single quotes (a quote inside
/// written `'\''`); a name starting with `-` as `./-name`, which no command reads as an
/// option.
pub fn shell_quoted(path: &std::path::Path) -> String {
    // A relative name starting with `-` would be read as an option.
    if path.to_string_lossy().starts_with('-') {
        return shell_quoted(&std::path::Path::new(".").join(path));
    }
    let s = path.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.into_owned();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_path_on_one_line_has_its_control_characters_escaped() {
        assert_eq!(one_line(Path::new("a b/c.jpg")), "a b/c.jpg");
        assert_eq!(one_line(Path::new("two\nlines.jpg")), "two\\nlines.jpg");
        assert_eq!(one_line(Path::new("tab\t\u{7f}.png")), "tab\\t\\u{7f}.png");
    }

    #[test]
    fn a_path_is_quoted_only_where_a_shell_would_split_or_expand_it() {
        assert_eq!(
            shell_quoted(Path::new("data/mnist-1.gz")),
            "data/mnist-1.gz"
        );
        assert_eq!(shell_quoted(Path::new("my data")), "'my data'");
        assert_eq!(shell_quoted(Path::new("it's")), "'it'\\''s'");
        assert_eq!(shell_quoted(Path::new("$HOME")), "'$HOME'");
        assert_eq!(shell_quoted(Path::new("")), "''");
        assert_eq!(shell_quoted(Path::new("-dash")), "./-dash");
    }

    #[test]
    fn numbers_past_a_few_digits_show_an_exponent() {
        assert_eq!(number(1e300), "1e300");
        assert_eq!(number(1e-300), "1e-300");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(f64::INFINITY), "inf");
        // An f32 shows its own shortest digits, 1e-4 included (0.99999997e-4 as an f64).
        assert_eq!(number(0.1f32), "0.1");
        assert_eq!(number(1e-4f32), "0.0001");
        assert_eq!(number(2e7f32), "2e7");
    }
}
