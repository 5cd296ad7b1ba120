//! The one way dptrain reads a file a user named: [`crate::output`]'s twin.
//!
//! Every path that comes from a user (a model file, a config, a profile, a run's summary and
//! metrics, dataset files, images, checkpoints) is read through here, so that three things hold
//! for all of them at once:
//! - **Only regular files.** A fifo, a device (`/dev/zero`, `/dev/stdin`), a socket or a
//!   directory is refused by its type before a byte is read. The file is opened with
//!   `O_NONBLOCK` and checked with `fstat` on the open descriptor, so opening a fifo that has no
//!   writer does not hang, and a file swapped for a fifo between a check and the open is still
//!   caught.
//! - **A size cap fitting the kind of file** ([`FileKind::cap`]): a model file is text a person
//!   writes, so 8 MiB is far more than any network needs, while a metrics log of a long run may
//!   be hundreds of megabytes. The cap is enforced on the bytes read (`take(cap + 1)`), not only
//!   on the length `stat` reports, because `/proc` files report 0 and a file may grow while read.
//! - **A typed error that names the path, what it was expected to be, and what to do.**

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::limits::human_bytes;

/// What a file is for: decides its size cap and how errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A model file (`--model M.toml`).
    ModelFile,
    /// A run config (`--config run.toml`).
    Config,
    /// A hostfile (`dptrain launch --hostfile`).
    Hostfile,
    /// A measured device profile (`--emulate-device`, `simulate --profile`).
    Profile,
    /// A run's `summary.json`.
    Summary,
    /// A run's `metrics.jsonl`.
    Metrics,
    /// A JSON or text file a benchmark or check reads (sim-check tables, ablation results).
    Table,
    /// A dataset file (IDX, CIFAR batches, checksum lists).
    Dataset,
    /// A packed dataset (`dptrain data pack`): memory-mapped, never read whole.
    PackedDataset,
    /// One image of an image folder, or one to predict.
    Image,
    /// A checkpoint or weights file (safetensors).
    Checkpoint,
}

impl FileKind {
    /// The most bytes a file of this kind may have.
    pub fn cap(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            // A hand-written text: ResNet-152 spelled out layer by layer is about 100 KiB.
            FileKind::ModelFile => 8 * MIB,
            FileKind::Config | FileKind::Hostfile => MIB,
            // Measured profiles are a few KiB; the largest built-in is under 100 KiB.
            FileKind::Profile => 16 * MIB,
            FileKind::Summary => 16 * MIB,
            // About 300 bytes a line: `--log-every 1` for three million steps.
            FileKind::Metrics => 1024 * MIB,
            FileKind::Table => 64 * MIB,
            // Checked again against the machine's memory by the readers (data::check_split_memory).
            FileKind::Dataset => 16 * 1024 * MIB,
            // Mapped, not read: the cap only refuses a length no dataset has (16 TiB).
            FileKind::PackedDataset => 16 * 1024 * 1024 * MIB,
            // A 4096 x 4096 RGB PNG stored uncompressed is 48 MiB; decode refuses larger images.
            FileKind::Image => 256 * MIB,
            FileKind::Checkpoint => 64 * 1024 * MIB,
        }
    }

    /// What to do about a path of this kind that is not a regular file: one the user named
    /// is to be named again; a dataset's files are found in the directory the user named
    /// (`--data-dir`), where the file itself belongs.
    fn not_regular_remedy(self) -> &'static str {
        match self {
            FileKind::Dataset => "put the file itself there (a link to one is fine)",
            _ => "give the path of a file",
        }
    }

    /// How an error names a file of this kind.
    pub fn noun(self) -> &'static str {
        match self {
            FileKind::ModelFile => "model file",
            FileKind::Config => "config file",
            FileKind::Hostfile => "hostfile",
            FileKind::Profile => "device profile",
            FileKind::Summary => "run summary",
            FileKind::Metrics => "metrics log",
            FileKind::Table => "table",
            FileKind::Dataset => "dataset file",
            FileKind::PackedDataset => "packed dataset",
            FileKind::Image => "image",
            FileKind::Checkpoint => "checkpoint",
        }
    }
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The path names nothing.
    #[error("{noun} {path} does not exist", noun = kind.noun(), path = path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
        /// What it was to be.
        kind: FileKind,
    },
    /// The path names something that is not a regular file.
    #[error(
        "{noun} {path} is {what}, not a regular file: {remedy}",
        noun = kind.noun(), path = path.display(), remedy = kind.not_regular_remedy()
    )]
    NotRegular {
        /// The path given.
        path: PathBuf,
        /// What it was to be.
        kind: FileKind,
        /// What it is ("a fifo", "a character device", "a directory", ...).
        what: &'static str,
    },
    /// The file is larger than any file of its kind may be.
    #[error(
        "{noun} {path} is larger than {cap}, the most a {noun} may be: is it the right file?",
        noun = kind.noun(), path = path.display(), cap = human_bytes(*cap as f64)
    )]
    TooLarge {
        /// The path given.
        path: PathBuf,
        /// What it was to be.
        kind: FileKind,
        /// The cap it passed.
        cap: u64,
    },
    /// A text file that is not UTF-8.
    #[error("{noun} {path} is not UTF-8 text: {source}", noun = kind.noun(), path = path.display())]
    NotText {
        /// The path given.
        path: PathBuf,
        /// What it was to be.
        kind: FileKind,
        /// Where the bytes stop being UTF-8.
        source: std::str::Utf8Error,
    },
    /// Opening or reading failed.
    #[error("cannot read {noun} {path}: {source}", noun = kind.noun(), path = path.display())]
    Io {
        /// The path given.
        path: PathBuf,
        /// What it was to be.
        kind: FileKind,
        /// What the system said.
        source: std::io::Error,
    },
}

impl InputError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            InputError::NotFound { path, .. }
            | InputError::NotRegular { path, .. }
            | InputError::TooLarge { path, .. }
            | InputError::NotText { path, .. }
            | InputError::Io { path, .. } => path,
        }
    }
}

/// What a file type is, in words, for files that are not regular.
fn type_name(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a fifo"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file of at most `kind`'s cap; returns the file
/// and its length. Never blocks on a fifo (see the module comment).
pub fn open_regular(path: &Path, kind: FileKind) -> Result<(File, u64), InputError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            InputError::NotFound {
                path: path.to_path_buf(),
                kind,
            }
        } else {
            InputError::Io {
                path: path.to_path_buf(),
                kind,
                source,
            }
        }
    };
    // Refuse by type before opening where we can: opening a device can have effects.
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(InputError::NotRegular {
            path: path.to_path_buf(),
            kind,
            what: type_name(meta.file_type()),
        });
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(InputError::NotRegular {
            path: path.to_path_buf(),
            kind,
            what: type_name(meta.file_type()),
        });
    }
    if meta.len() > kind.cap() {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            kind,
            cap: kind.cap(),
        });
    }
    Ok((file, meta.len()))
}

/// Reads the whole of `path` into `buf` (cleared first; its capacity is kept, so a reader of
/// many images allocates once), refusing what [`open_regular`] refuses and anything that
/// grows past the cap while read.
pub fn read_into(path: &Path, kind: FileKind, buf: &mut Vec<u8>) -> Result<(), InputError> {
    let (file, len) = open_regular(path, kind)?;
    buf.clear();
    buf.reserve(len as usize);
    file.take(kind.cap() + 1)
        .read_to_end(buf)
        .map_err(|source| InputError::Io {
            path: path.to_path_buf(),
            kind,
            source,
        })?;
    if buf.len() as u64 > kind.cap() {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            kind,
            cap: kind.cap(),
        });
    }
    Ok(())
}

/// Reads the whole of `path` (see [`read_into`]).
pub fn read_bytes(path: &Path, kind: FileKind) -> Result<Vec<u8>, InputError> {
    let mut buf = Vec::new();
    read_into(path, kind, &mut buf)?;
    Ok(buf)
}

/// Reads `path` as UTF-8 text (see [`read_into`]).
pub fn read_text(path: &Path, kind: FileKind) -> Result<String, InputError> {
    let bytes = read_bytes(path, kind)?;
    String::from_utf8(bytes).map_err(|e| InputError::NotText {
        path: path.to_path_buf(),
        kind,
        source: e.utf8_error(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_directories_are_refused_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, what) in [
            (Path::new("/dev/zero"), "a character device"),
            (fifo.as_path(), "a fifo"),
            (dir.path(), "a directory"),
        ] {
            let e = read_text(path, FileKind::ModelFile).unwrap_err();
            assert!(
                matches!(e, InputError::NotRegular { what: w, .. } if w == what),
                "{path:?}: {e}"
            );
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
    }

    #[test]
    fn a_file_over_its_cap_is_refused_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        let f = File::create(&big).unwrap();
        f.set_len(FileKind::Config.cap() + 1).unwrap();
        let e = read_text(&big, FileKind::Config).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("1.0 MiB"), "{e}");
        let e = read_text(&dir.path().join("none"), FileKind::Config).unwrap_err();
        assert!(matches!(e, InputError::NotFound { .. }), "{e}");
        assert!(e.to_string().starts_with("config file "), "{e}");
    }

    #[test]
    fn proc_files_that_report_no_length_are_read_whole() {
        let text = read_text(Path::new("/proc/self/status"), FileKind::Table).unwrap();
        assert!(text.contains("VmRSS"), "{text}");
    }
}
