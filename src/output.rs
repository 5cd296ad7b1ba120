//! Every file and directory dptrain writes goes through this module, so one set of rules holds
//! for all of them (trace, run directory, checkpoints, summary, report and plots, `report
//! --out`, `profile --out`, `bench --out`, `data export-images --out`):
//!
//! - **A file is replaced only by one of its kind.** Each writer names the [`Kind`] of file it
//!   writes (a profile, a packed dataset, a run report...), and an existing non-empty file at
//!   the path is replaced only if it is of that kind, i.e. an earlier output of the same
//!   command; anything else is refused and kept ([`OutputError::NotOurs`]). Before this rule,
//!   `profile --out model.safetensors` or `data pack --out notes.txt` replaced the user's file.
//!   An empty file is replaced (nothing is lost, and `--out "$(mktemp)"` works).
//! - **Only regular files are written or replaced.** An existing device node, fifo, socket or
//!   directory at an output path is refused, never replaced: before this rule `--trace
//!   /dev/full`, run as root, renamed a JSON file over the device node.
//! - **Symbolic links are neither followed nor replaced** at the file itself: a link given as an
//!   output would otherwise let a write land on (or replace) whatever it points to. Links to
//!   directories *above* the file are fine (e.g. `runs/` linked to a bigger disk): they do not
//!   replace anything.
//! - **No directory is created beyond the one named**: a missing parent is an error that says to
//!   create it. [`create_dir`] makes exactly one level; the trainer's own default
//!   (`runs/<model>-<dataset>`) is the one place where two levels are made, because the user
//!   named neither.
//! - **Replacing writes are atomic**: the bytes go to a temporary file in the same directory,
//!   created with `create_new` (so it can be neither a link planted in advance nor someone
//!   else's file), fsynced and renamed over the target. A crash leaves the old file or the new
//!   one; every failure path (disk full included) removes the temporary file, and temporary
//!   files of killed processes are removed by [`remove_stale_temps`]. Temporary files are
//!   named `.dptrain-tmp-NAME.<pid>.<n>` ([`TEMP_PREFIX`]) and only exactly that is removed.
//! - **Appends are whole lines** ([`append_line`]): a line that does not fit is cut back off,
//!   so a full disk never leaves a torn line.
//!
//! Errors are [`OutputError`]: each names the path, what was wrong and what to do.

mod temp_file;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use temp_file::TempFile;

/// Why an output path cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The path ends in `/`, which names a directory, where a file is written.
    #[error(
        "{}: ends in /, which names a directory; dptrain writes a file here: give the file's \
         path without the trailing /",
        path.display()
    )]
    TrailingSlash {
        /// The output path.
        path: PathBuf,
    },
    /// Something other than a regular file is at the path (device node, fifo, socket,
    /// directory).
    #[error(
        "{}: is a {kind}, not a regular file; dptrain writes only regular files and never \
         replaces anything else: give the path of a new or existing regular file",
        path.display()
    )]
    NotRegular {
        /// The output path.
        path: PathBuf,
        /// What is there ("character device", "fifo", ...).
        kind: &'static str,
    },
    /// Something other than a directory is where an output directory should be.
    #[error(
        "{}: is a {kind}, not a directory: give the path of a new or existing directory",
        path.display()
    )]
    NotADirTarget {
        /// The output directory.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// The output path is a symbolic link.
    #[error(
        "{}: is a symbolic link; dptrain neither writes through links nor replaces them: give \
         the real path",
        path.display()
    )]
    Symlink {
        /// The output path.
        path: PathBuf,
    },
    /// The directory the output goes into does not exist.
    #[error(
        "{}: the directory {} does not exist; create it first (dptrain creates no directory \
         beyond the one named)",
        path.display(),
        dir.display()
    )]
    MissingDir {
        /// The output path.
        path: PathBuf,
        /// Its missing directory.
        dir: PathBuf,
    },
    /// Something on the way to the output path is not a directory.
    #[error("{}: {} is not a directory", path.display(), dir.display())]
    NotADir {
        /// The output path.
        path: PathBuf,
        /// The component that should be a directory.
        dir: PathBuf,
    },
    /// An output directory holds files that writing into it would mix with or overwrite.
    #[error(
        "{}: {what} ({}); {todo}",
        path.display(),
        list_some(entries)
    )]
    NotEmpty {
        /// The directory.
        path: PathBuf,
        /// What it holds, in words.
        what: String,
        /// Some of the entries found.
        entries: Vec<String>,
        /// What the user can do.
        todo: String,
    },
    /// A file is at the output path that this write did not make: not of the kind it writes.
    #[error(
        "{} exists and is not {what}; dptrain replaces only its own earlier output of the same \
         kind: give another path, or move that file away",
        path.display()
    )]
    NotOurs {
        /// The output path.
        path: PathBuf,
        /// The kind the write replaces, in words.
        what: &'static str,
    },
    /// The operating system refused a write.
    #[error("cannot {action} {}: {cause}", path.display())]
    Io {
        /// The path being written.
        path: PathBuf,
        /// What was being done ("write", "create the directory", ...).
        action: &'static str,
        /// The OS error.
        cause: std::io::Error,
    },
}

impl From<OutputError> for String {
    fn from(e: OutputError) -> Self {
        e.to_string()
    }
}

/// A kind of file dptrain writes, named by its writer beside its format, so that a write
/// replaces only a file of that kind (see the module comment).
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The kind, in words, as the refusal names it ("a profile dptrain wrote").
    pub what: &'static str,
    /// How many bytes from the start of an existing file [`Kind::is_one`] is given (all of a
    /// shorter file); a file is read no further.
    pub head: usize,
    /// Whether a file starting with these bytes is of this kind.
    pub is_one: fn(&[u8]) -> bool,
}

/// A path in a JSON file or line dptrain writes, as text: JSON strings are Unicode, and a name
/// that is not (a Linux file name may hold any bytes) is written with U+FFFD for what does not
/// decode (serde's own form refuses it, which failed a run after its training, or panicked
/// `predict --json`). For `#[serde(serialize_with = "crate::output::path_as_text")]`.
pub fn path_as_text<P: AsRef<Path>, S: serde::Serializer>(
    path: &P,
    to: S,
) -> Result<S::Ok, S::Error> {
    to.serialize_str(&path.as_ref().to_string_lossy())
}

/// [`path_as_text`] for an optional path (`null` when absent).
pub fn optional_path_as_text<P: AsRef<Path>, S: serde::Serializer>(
    path: &Option<P>,
    to: S,
) -> Result<S::Ok, S::Error> {
    match path {
        Some(p) => path_as_text(p, to),
        None => to.serialize_none(),
    }
}

/// Whether `bytes` are a JSON object holding every one of `keys`: the test of the JSON files
/// dptrain writes (whole files: their [`Kind::head`] is larger than they grow).
pub fn is_json_object_with(bytes: &[u8], keys: &[&str]) -> bool {
    // A quick refusal of what cannot be an object (a binary file read whole otherwise).
    const OBJECT_OPENS: u8 = 0x7b; // the opening brace
    if bytes.trim_ascii_start().first() != Some(&OBJECT_OPENS) {
        return false;
    }
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes)
        .is_ok_and(|m| keys.iter().all(|k| m.contains_key(*k)))
}

/// Whether `bytes` contain `needle`: the test of the formats whose head holds a marker.
pub fn holds(bytes: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || bytes.windows(needle.len()).any(|w| w == needle)
}

/// Refuses an existing non-empty file at `path` that is not of `kind` (the first
/// [`Kind::head`] bytes decide). An absent path is fine; what else may be there is
/// [`check_file_target`]'s.
fn check_owned(path: &Path, kind: &Kind) -> Result<(), OutputError> {
    use std::io::Read;
    // A file that cannot be read is not known to be ours: refused (with the OS's reason),
    // never replaced.
    const ACTION: &str = "read, to see what it is, before replacing";
    let file = match open_regular(path, OpenOptions::new().read(true), ACTION) {
        Ok(f) => f,
        Err(OutputError::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    let mut head = Vec::new();
    file.take(kind.head as u64)
        .read_to_end(&mut head)
        .map_err(|cause| OutputError::Io {
            path: path.to_path_buf(),
            action: ACTION,
            cause,
        })?;
    if head.is_empty() || (kind.is_one)(&head) {
        return Ok(());
    }
    Err(OutputError::NotOurs {
        path: path.to_path_buf(),
        what: kind.what,
    })
}

/// The first few names of a list, then how many more.
fn list_some(entries: &[String]) -> String {
    const SHOWN: usize = 6;
    let mut s = entries
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if entries.len() > SHOWN {
        s += &format!(" and {} more", entries.len() - SHOWN);
    }
    s
}

/// What a non-regular file is, in words.
fn kind_of(ft: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return "character device";
        }
        if ft.is_block_device() {
            return "block device";
        }
        if ft.is_fifo() {
            return "fifo (named pipe)";
        }
        if ft.is_socket() {
            return "socket";
        }
    }
    if ft.is_dir() {
        "directory"
    } else if ft.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

/// The directory `path` is in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks that `path` may be written as a file: it is absent or a regular file (not a link,
/// device, fifo, socket or directory), and its directory exists. Touches nothing.
pub fn check_file_target(path: &Path) -> Result<(), OutputError> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().ends_with(b"/") {
        return Err(OutputError::TrailingSlash {
            path: path.to_path_buf(),
        });
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(OutputError::Symlink {
                path: path.to_path_buf(),
            })
        }
        Ok(m) if !m.file_type().is_file() => {
            return Err(OutputError::NotRegular {
                path: path.to_path_buf(),
                kind: kind_of(&m.file_type()),
            })
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(OutputError::Io {
                path: path.to_path_buf(),
                action: "inspect",
                cause: e,
            })
        }
    }
    let dir = parent_dir(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(OutputError::NotADir {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(OutputError::MissingDir {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        }),
        Err(e) => Err(OutputError::Io {
            path: path.to_path_buf(),
            action: "inspect the directory of",
            cause: e,
        }),
    }
}

/// [`check_file_target`], and a file already at `path` is of `kind` (or empty): the checks of
/// every write, for a command to make before its work. Reads at most [`Kind::head`] bytes.
pub fn check_replaceable(path: &Path, kind: &Kind) -> Result<(), OutputError> {
    check_file_target(path)?;
    check_owned(path, kind)
}

/// [`check_replaceable`], and proves the directory takes new files by creating and removing a
/// temporary one: a read-only directory or file system, or a full disk's inode table, shows
/// here, before the work whose result would be lost.
pub fn check_writable(path: &Path, kind: &Kind) -> Result<(), OutputError> {
    check_replaceable(path, kind)?;
    check_dir_takes_files(path)
}

/// Proves that the directory of `path` takes new files (see [`check_writable`]), for a path
/// whose present file is checked otherwise (one that is to be deleted first).
pub fn check_dir_takes_files(path: &Path) -> Result<(), OutputError> {
    let (tmp, file) = create_temp(path)?;
    drop((file, tmp));
    Ok(())
}

/// Temporary files of this process are numbered, so two writers of one target never share one.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name from a file or an option (a model file's `name`, a dataset spec) made safe to be one
/// path component: every character but ASCII letters, digits, `-`, `_` and `.` becomes `_`,
/// and a leading `.` too, so that `../../escaped` and `a/b` cannot leave or nest inside the
/// folder they are joined to, nor name a hidden file. The only way such names become paths.
pub fn path_component(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with('.') {
        out.insert(0, '_');
    }
    out
}

/// Prefix of every temporary file: `.dptrain-tmp-NAME.<pid>.<n>`. A name no user would pick
/// (hidden, and naming dptrain), because temporary files of killed runs are deleted on sight:
/// with the old `NAME.<pid>.<n>.tmp`, a user's `thesis.99999.0.tmp` in a run directory was
/// deleted as a stale temporary file.
pub const TEMP_PREFIX: &str = ".dptrain-tmp-";

/// Creates a new temporary file next to `path` (`.dptrain-tmp-NAME.<pid>.<n>`) with
/// `create_new`, so nothing that already exists, a planted link included, is ever opened.
fn create_temp(path: &Path) -> Result<(TempFile, File), OutputError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let dir = parent_dir(path);
    remove_stale_temps_of(dir, &name);
    // The file it replaces keeps its permissions (a private 0600 file stays private).
    let mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{TEMP_PREFIX}{name}.{}.{n}", std::process::id()));
        match TempFile::create_new(tmp) {
            Ok((tmp, f)) => {
                if let Some(mode) = mode {
                    f.set_permissions(mode).map_err(|e| OutputError::Io {
                        path: path.to_path_buf(),
                        action: "give the new file the old one's permissions, beside",
                        cause: e,
                    })?;
                }
                return Ok((tmp, f));
            }
            // A leftover of an earlier process with our pid; take the next number.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(OutputError::Io {
                    path: path.to_path_buf(),
                    action: "create a file next to",
                    cause: e,
                })
            }
        }
    }
}

/// Writes `bytes`, a file of `kind`, to `path` atomically (see the module comment); the path
/// must pass [`check_replaceable`].
pub fn write_atomically(path: &Path, bytes: &[u8], kind: &Kind) -> Result<(), OutputError> {
    check_replaceable(path, kind)?;
    let (tmp, mut f) = create_temp(path)?;
    let io = |action: &'static str, cause: std::io::Error| OutputError::Io {
        path: path.to_path_buf(),
        action,
        cause,
    };
    // Any failure drops `tmp`, which removes it.
    f.write_all(bytes).map_err(|e| io("write", e))?;
    f.sync_all().map_err(|e| io("write (fsync)", e))?;
    drop(f);
    // Checked again right before the rename: something may have appeared meanwhile.
    check_replaceable(path, kind)?;
    tmp.rename_to(path)
        .map_err(|e| io("rename into place", e))?;
    if let Ok(d) = File::open(parent_dir(path)) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A file written in pieces (too large to hold in memory, such as a packed dataset) that
/// appears under its final name only when complete: the bytes go to a `create_new` temporary
/// file beside `path`, and [`AtomicFile::commit`] fsyncs and renames it over `path` (which must
/// pass [`check_file_target`] then too). Dropping it uncommitted (an error, a panic) removes
/// the temporary file, so a failed write leaves nothing under either name.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    /// What may be replaced at `path`, checked again at the commit (a long write leaves time
    /// for a file to appear there).
    kind: Kind,
    tmp: TempFile,
    file: File,
}

impl AtomicFile {
    /// Checks `path` for a file of `kind` ([`check_replaceable`]) and creates the temporary
    /// file beside it.
    pub fn create(path: &Path, kind: &Kind) -> Result<Self, OutputError> {
        check_replaceable(path, kind)?;
        let (tmp, file) = create_temp(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            kind: *kind,
            tmp,
            file,
        })
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file being written.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// An [`OutputError::Io`] for this file: what was being done and the OS error.
    pub fn error(&self, action: &'static str, cause: std::io::Error) -> OutputError {
        OutputError::Io {
            path: self.path.clone(),
            action,
            cause,
        }
    }

    /// Flushes the temporary file to disk and renames it over the final path.
    pub fn commit(self) -> Result<(), OutputError> {
        let Self {
            path,
            kind,
            tmp,
            file,
        } = self;
        let error = |action, cause| OutputError::Io {
            path: path.clone(),
            action,
            cause,
        };
        // Any failure drops `tmp`, which removes it.
        file.sync_all().map_err(|e| error("write (fsync)", e))?;
        drop(file);
        // Checked again right before the rename: something may have appeared meanwhile.
        check_replaceable(&path, &kind)?;
        tmp.rename_to(&path)
            .map_err(|e| error("rename into place", e))?;
        if let Ok(d) = File::open(parent_dir(&path)) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Creates `path` and writes `bytes` to it; the file must not exist yet (`create_new`: nothing
/// is replaced, no link followed). A failed write removes the partial file. For the many small
/// files of an export, which are new by construction.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut f = create_new_file(path)?;
    if let Err(e) = f.write_all(bytes) {
        drop(f);
        let _ = std::fs::remove_file(path);
        return Err(OutputError::Io {
            path: path.to_path_buf(),
            action: "write",
            cause: e,
        });
    }
    Ok(())
}

/// Creates `path`, which must not exist (`create_new`: nothing is replaced, no link
/// followed), and opens it for writing.
pub fn create_new_file(path: &Path) -> Result<File, OutputError> {
    // Under the interrupt register's lock: the file may be in a scratch directory a signal
    // is removing.
    crate::interrupt::creating(|| OpenOptions::new().write(true).create_new(true).open(path))
        .map_err(|e| OutputError::Io {
            path: path.to_path_buf(),
            action: "create",
            cause: e,
        })
}

/// Makes a new directory only this user may enter (mode 0700) in `parent`, for this
/// process's own scratch files: `<prefix><pid>-<n>`, taking the next `n` while the name
/// exists, so a directory made in advance by someone else (with a link in it to a file of
/// ours) is never used.
pub fn create_private_dir(parent: &Path, prefix: &str) -> Result<PathBuf, OutputError> {
    use std::os::unix::fs::DirBuilderExt;
    loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("{prefix}{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(OutputError::Io {
                    path: dir,
                    action: "create the directory",
                    cause: e,
                })
            }
        }
    }
}

/// Makes sure `dir` is a directory, creating it (one level: its parent must exist) if absent.
/// An existing directory, also one reached through a link, is used as it is.
pub fn create_dir(dir: &Path) -> Result<(), OutputError> {
    create_dir_made(dir).map(|_| ())
}

/// [`create_dir`], returning whether this call made the directory (false: it was there, or
/// another process made it in between).
fn create_dir_made(dir: &Path) -> Result<bool, OutputError> {
    // `a/./b/.` is `a/b` (mkdir of a path ending in `.` fails: `.` of a directory not yet there).
    let normal: PathBuf = dir.components().collect();
    let dir = normal.as_path();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(false),
        Ok(m) => {
            return Err(OutputError::NotADirTarget {
                path: dir.to_path_buf(),
                kind: if m.is_file() {
                    "regular file"
                } else {
                    kind_of(&m.file_type())
                },
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(OutputError::Io {
                path: dir.to_path_buf(),
                action: "inspect",
                cause: e,
            })
        }
    }
    // A dangling link would make create_dir create its target somewhere else.
    if std::fs::symlink_metadata(dir).is_ok() {
        return Err(OutputError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    let parent = parent_dir(dir);
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(OutputError::NotADir {
                path: dir.to_path_buf(),
                dir: parent.to_path_buf(),
            })
        }
        Err(_) => {
            return Err(OutputError::MissingDir {
                path: dir.to_path_buf(),
                dir: parent.to_path_buf(),
            })
        }
    }
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(true),
        // Another process made it in between: fine, as long as it is a directory.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
        Err(e) => Err(OutputError::Io {
            path: dir.to_path_buf(),
            action: "create the directory",
            cause: e,
        }),
    }
}

/// The directories a command created ([`CreatedDirs::create`]), to remove again if the command
/// ends without writing into them: a run or an export refused after making its output
/// directory leaves no empty directory behind, nor does one a signal ends (each is registered
/// with `interrupt` while this holds it). Only a directory this command made, and only while
/// it is empty (`rmdir`), is removed: a user's directory, or one that received any file, is
/// never touched.
#[derive(Debug, Default)]
pub struct CreatedDirs {
    /// Outermost first, each with its registration.
    dirs: Vec<(PathBuf, crate::interrupt::ScratchRegistration)>,
}

impl CreatedDirs {
    /// [`create_dir`], remembering `dir` when this call made it (not when it was there, nor
    /// when another process made it first).
    pub fn create(&mut self, dir: &Path) -> Result<(), OutputError> {
        // As made: `a/./b/.` is `a/b` (rmdir of a path ending in `.` fails).
        let dir: PathBuf = dir.components().collect();
        if self.dirs.iter().any(|(d, _)| *d == dir) {
            return create_dir_made(&dir).map(drop);
        }
        if let Some(registration) =
            crate::interrupt::ScratchRegistration::made_if_empty(&dir, || create_dir_made(&dir))?
        {
            self.dirs.push((dir, registration));
        }
        Ok(())
    }

    /// Forgets `dir`, if it was created (it is another process's now).
    pub fn forget(&mut self, dir: &Path) {
        self.dirs.retain(|(d, _)| d != dir);
    }

    /// Runs `work` (the command's work once its directories exist); if it fails, removes
    /// the created directories it left empty ([`Self::remove_empty`]).
    pub fn removed_if_failed<T, E>(mut self, work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let result = work();
        if result.is_err() {
            self.remove_empty();
        }
        result
    }

    /// Removes the created directories that are still empty, latest first, stopping at the
    /// first that is not (every caller creates a chain of nested directories, outermost
    /// first, so its parents are then not empty either).
    pub fn remove_empty(&mut self) {
        while let Some((dir, _registration)) = self.dirs.pop() {
            if std::fs::remove_dir(&dir).is_err() {
                self.dirs.clear();
            }
        }
    }
}

/// Removes temporary files (`.dptrain-tmp-NAME.<pid>.<n>`, see [`write_atomically`]) that
/// processes no longer running left in `dir` when they were killed mid-write; returns what was
/// removed. Only names of exactly that form are touched: files of live processes (this one and
/// another run's included), anything that is not a regular file, and every other name (a
/// user's `thesis.99999.0.tmp`) are left alone.
pub fn remove_stale_temps(dir: &Path) -> Vec<PathBuf> {
    remove_dead_temps(dir, |_| true)
}

/// [`remove_stale_temps`] for the temporary files of one target `name` in `dir`: a write
/// killed before it could remove its temporary file (SIGKILL, a crash) leaves it, and the
/// next write to the same file clears it.
fn remove_stale_temps_of(dir: &Path, name: &str) {
    remove_dead_temps(dir, |target| target == name);
}

/// Removes the regular temporary files in `dir` of processes no longer running whose target
/// `of` accepts; returns them.
fn remove_dead_temps(dir: &Path, of: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((target, pid)) = temp_owner(&name) else {
            continue;
        };
        let alive = is_running(pid);
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        if of(target) && !alive && regular && std::fs::remove_file(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

/// Whether process `pid` is running (this one counts): what an output named by its process
/// may be deleted by, only when it is not.
pub fn is_running(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (name) S ...": the state follows the name's last ')'; a zombie has ended (its
    // parent has not yet collected it), so what it left is no longer being written.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X'))
}

/// The target name and the pid in a temporary file's name `.dptrain-tmp-NAME.<pid>.<n>`, if it
/// is exactly one: the prefix, a non-empty target, then a pid and a counter of decimal digits.
fn temp_owner(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let mut parts = rest.rsplitn(3, '.');
    let n = parts.next()?;
    let pid = parts.next()?;
    let target = parts.next().filter(|s| !s.is_empty())?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(n) || !digits(pid) {
        return None;
    }
    n.parse::<u64>().ok()?;
    Some((target, pid.parse::<u32>().ok()?))
}

/// True when `name` is a temporary file of [`write_atomically`] for the file `target`.
pub fn is_temp_of(name: &str, target: &str) -> bool {
    temp_owner(name).is_some_and(|(t, _)| t == target)
}

/// A file that lines are appended to, seen as [`append_whole`] needs it: its length now, and
/// a way back to it. For [`File`]; tests give one that fails part way.
pub trait AppendTarget: Write {
    /// The length of the file now, where the next append starts.
    fn end(&mut self) -> std::io::Result<u64>;
    /// Cuts the file back to `len` bytes.
    fn truncate_to(&mut self, len: u64) -> std::io::Result<()>;
}

impl AppendTarget for File {
    fn end(&mut self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn truncate_to(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)
    }
}

/// Appends `bytes` whole or not at all: on a short write or an error (a full disk), the file
/// is cut back to its length before, so no partial line is left for a reader (or a resumed
/// run's next line) to trip over. The error is the write's.
pub fn append_whole(f: &mut impl AppendTarget, bytes: &[u8]) -> std::io::Result<()> {
    let before = f.end()?;
    let Err(e) = f.write_all(bytes).and_then(|()| f.flush()) else {
        return Ok(());
    };
    if let Err(cut) = f.truncate_to(before) {
        return Err(std::io::Error::new(
            e.kind(),
            format!("{e}; and its partial line could not be removed: {cut}"),
        ));
    }
    Err(e)
}

/// Opens `path` (created if absent, when `create`) for appending or trimming: never through a
/// link planted after [`check_file_target`], never blocking on a fifo, a regular file only.
fn open_appendable(path: &Path, create: bool) -> Result<File, OutputError> {
    check_file_target(path)?;
    let mut options = OpenOptions::new();
    options
        .create(create)
        .append(create)
        .read(true)
        .write(!create);
    open_regular(path, &mut options, "open for appending")
}

/// Opens `path` with `options`, neither following a link nor waiting on a fifo put there
/// since the path was checked, and checks by the handle that a regular file was opened. An
/// open that fails is [`OutputError::Io`] with `action`.
fn open_regular(
    path: &Path,
    options: &mut OpenOptions,
    action: &'static str,
) -> Result<File, OutputError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let io = |action: &'static str, cause: std::io::Error| OutputError::Io {
        path: path.to_path_buf(),
        action,
        cause,
    };
    let f = options.open(path).map_err(|e| io(action, e))?;
    let m = f.metadata().map_err(|e| io("inspect", e))?;
    if !m.is_file() {
        return Err(OutputError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(&m.file_type()),
        });
    }
    Ok(f)
}

/// Appends `line` and a newline to `path` (created if absent), which must pass
/// [`check_file_target`]; the open does not follow a link planted after the check. The line is
/// written whole or not at all ([`append_whole`]): a full disk leaves the file as it was.
pub fn append_line(path: &Path, line: &str) -> Result<(), OutputError> {
    let mut f = open_appendable(path, true)?;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    append_whole(&mut f, &bytes).map_err(|cause| OutputError::Io {
        path: path.to_path_buf(),
        action: "append a line to",
        cause,
    })
}

/// Cuts a partial last line (bytes after the last newline: what a crash in the middle of an
/// append by an older dptrain left) off `path`, so the next append starts a line of its own;
/// returns how many bytes were cut (0 when the file ends in a newline, is empty or absent).
/// Reads backwards from the end in blocks, so a long file is not read whole.
pub fn trim_partial_line(path: &Path) -> Result<u64, OutputError> {
    use std::io::{Read, Seek, SeekFrom};
    if !path.exists() {
        return Ok(0);
    }
    let mut f = open_appendable(path, false)?;
    let io = |action: &'static str, cause: std::io::Error| OutputError::Io {
        path: path.to_path_buf(),
        action,
        cause,
    };
    let len = f.metadata().map_err(|e| io("inspect", e))?.len();
    let mut block = [0u8; 8192];
    let mut end = len;
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(block.len() as u64);
        let part = &mut block[..(end - start) as usize];
        f.seek(SeekFrom::Start(start))
            .and_then(|_| f.read_exact(part))
            .map_err(|e| io("read", e))?;
        if let Some(i) = part.iter().rposition(|&b| b == b'\n') {
            break start + i as u64 + 1;
        }
        end = start;
    };
    if keep < len {
        f.set_len(keep)
            .map_err(|e| io("cut the partial last line of", e))?;
    }
    Ok(len - keep)
}

/// Cuts `path` at its first line for which `cut` holds, keeping every line before it; returns
/// how many lines went (0 when none holds, or the file is absent). Reads forward line by line,
/// so a long file is never held whole; the lines are whole (see [`trim_partial_line`]).
pub fn cut_lines_from(
    path: &Path,
    mut cut: impl FnMut(&str) -> bool,
) -> Result<usize, OutputError> {
    use std::io::{BufRead, BufReader, Seek, SeekFrom};
    if !path.exists() {
        return Ok(0);
    }
    let f = open_appendable(path, false)?;
    let io = |action: &'static str, cause: std::io::Error| OutputError::Io {
        path: path.to_path_buf(),
        action,
        cause,
    };
    let mut reader = BufReader::new(&f);
    let (mut line, mut offset, mut at, mut cut_lines) = (String::new(), 0u64, None, 0);
    loop {
        line.clear();
        let n = reader.read_line(&mut line).map_err(|e| io("read", e))?;
        if n == 0 {
            break;
        }
        if at.is_none() && cut(line.trim_end()) {
            at = Some(offset);
        }
        if at.is_some() {
            cut_lines += 1;
        }
        offset += n as u64;
    }
    if let Some(at) = at {
        let mut f = &f;
        f.seek(SeekFrom::Start(at)).map_err(|e| io("seek in", e))?;
        f.set_len(at)
            .map_err(|e| io("cut the superseded lines of", e))?;
    }
    Ok(cut_lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_created_directories_left_empty_are_removed_innermost_first() {
        let tmp = tempfile::tempdir().unwrap();
        let (user, outer) = (tmp.path().join("user"), tmp.path().join("outer"));
        std::fs::create_dir(&user).unwrap();
        let mut made = CreatedDirs::default();
        for d in [&user, &outer, &outer.join("a"), &user.join("b")] {
            made.create(d).unwrap();
        }
        made.remove_empty();
        // The user's directory was there before: kept; the rest were empty.
        assert!(user.is_dir() && !user.join("b").exists() && !outer.exists());
        let mut made = CreatedDirs::default();
        made.create(&outer).unwrap();
        made.create(&outer.join("a")).unwrap();
        std::fs::write(outer.join("a/f"), "x").unwrap();
        made.remove_empty();
        // A directory that received a file is kept, and with it its parent.
        assert!(outer.join("a/f").is_file());
        // A path with `.` components is the directory it names, made and removed.
        let dotted = tmp.path().join("user/./c/.");
        let mut made = CreatedDirs::default();
        made.create(&dotted).unwrap();
        assert!(user.join("c").is_dir());
        made.remove_empty();
        assert!(!user.join("c").exists() && user.is_dir());
    }

    #[test]
    fn lines_are_cut_from_the_first_that_matches_and_none_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        std::fs::write(&path, "a 1\nb 2\na 3\nb 4\n").unwrap();
        assert_eq!(cut_lines_from(&path, |l| l.ends_with('9')).unwrap(), 0);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a 1\nb 2\na 3\nb 4\n"
        );
        // Everything from the first match goes, matching or not.
        assert_eq!(cut_lines_from(&path, |l| l == "b 2").unwrap(), 3);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 1\n");
        assert_eq!(
            cut_lines_from(&dir.path().join("absent"), |_| true).unwrap(),
            0
        );
    }

    #[test]
    fn a_process_that_has_ended_is_not_running_even_before_it_is_collected() {
        assert!(is_running(std::process::id()));
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(is_running(sleeper.id()));
        sleeper.kill().unwrap();
        // Killed but not yet waited for: a zombie, which has ended.
        let zombie = sleeper.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while is_running(zombie) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_running(zombie));
        sleeper.wait().unwrap();
        assert!(!is_running(zombie));
    }

    #[test]
    fn a_file_path_ending_in_a_slash_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx/");
        let e = check_file_target(&path).unwrap_err();
        assert!(matches!(e, OutputError::TrailingSlash { .. }), "{e}");
        assert!(e.to_string().contains("ends in /"), "{e}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
        assert!(check_file_target(&dir.path().join("model.onnx")).is_ok());
    }

    #[test]
    fn temp_names_are_recognised() {
        assert_eq!(
            temp_owner(".dptrain-tmp-summary.json.123.0"),
            Some(("summary.json", 123))
        );
        assert_eq!(temp_owner(".dptrain-tmp-a.b.c.45.7"), Some(("a.b.c", 45)));
        // A user's names, and near misses, are not temporary files.
        for name in [
            "thesis.99999.0.tmp",
            "summary.json.123.0.tmp",
            ".dptrain-tmp-.1.2",
            ".dptrain-tmp-x.1",
            ".dptrain-tmp-x.+1.2",
            ".dptrain-tmp-x.1.2.tmp",
            ".dptrain-tmp-x.1.",
            "dptrain-tmp-x.1.2",
        ] {
            assert_eq!(temp_owner(name), None, "{name}");
        }
        assert!(is_temp_of(
            ".dptrain-tmp-c.safetensors.9.3",
            "c.safetensors"
        ));
        assert!(!is_temp_of(".dptrain-tmp-c.safetensors.9.3", "c.safe"));
        assert!(!is_temp_of(".dptrain-tmp-c.safetensors.9.3", "c"));
    }

    /// A kind for these tests: files starting `TEST`.
    const TEST_KIND: Kind = Kind {
        what: "a test file",
        head: 4,
        is_one: |head| head == b"TEST",
    };

    #[test]
    fn a_file_is_replaced_only_by_one_of_its_kind_or_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        // Absent, then its own earlier output, then an empty file: written.
        write_atomically(&path, b"TEST 1", &TEST_KIND).unwrap();
        write_atomically(&path, b"TEST 2", &TEST_KIND).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"TEST 2");
        std::fs::write(&path, b"").unwrap();
        let mut f = AtomicFile::create(&path, &TEST_KIND).unwrap();
        f.file().write_all(b"TEST 3").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"TEST 3");
        // Anything else is refused by every way of writing, and kept; no temporary file.
        std::fs::write(&path, b"TES").unwrap();
        let refused = |e: OutputError| {
            assert!(
                matches!(
                    &e,
                    OutputError::NotOurs {
                        what: "a test file",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(
                e.to_string().contains("exists and is not a test file"),
                "{e}"
            );
        };
        refused(write_atomically(&path, b"TEST 4", &TEST_KIND).unwrap_err());
        refused(AtomicFile::create(&path, &TEST_KIND).unwrap_err());
        refused(check_writable(&path, &TEST_KIND).unwrap_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"TES");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn json_and_marker_tests_read_what_they_say() {
        assert!(is_json_object_with(br#"{"a": 1, "b": []}"#, &["a", "b"]));
        assert!(!is_json_object_with(br#"{"a": 1}"#, &["a", "b"]));
        assert!(!is_json_object_with(br#"[{"a": 1, "b": 2}]"#, &["a"]));
        assert!(!is_json_object_with(br#"{"a": 1, "b""#, &["a"]));
        assert!(holds(b"xx\"format\":\"y", b"\"format\""));
        assert!(!holds(b"short", b"longer than it"));
    }

    #[test]
    fn temp_files_carry_the_prefix_and_are_recognised() {
        let dir = std::env::temp_dir().join(format!("dptrain-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tmp, f) = create_temp(&dir.join("summary.json")).unwrap();
        drop(f);
        let name = tmp
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(is_temp_of(&name, "summary.json"), "{name}");
        // Ours, of a live process: left alone.
        assert!(remove_stale_temps(&dir).is_empty());
        assert!(tmp.path().exists());
        let path = tmp.path().to_path_buf();
        drop(tmp);
        assert!(!path.exists(), "a dropped temporary file is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_file_keeps_its_permissions_and_a_killed_writes_temp_is_cleared() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.pack");
        std::fs::write(&path, b"TEST old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // A write of this file killed mid-way (a pid above Linux's pid_max: no such process),
        // and one of another file, which is not this write's to clear.
        let dead = |target: &str| dir.path().join(format!("{TEMP_PREFIX}{target}.4194305.0"));
        std::fs::write(dead("data.pack"), b"partial").unwrap();
        std::fs::write(dead("other.pack"), b"partial").unwrap();
        write_atomically(&path, b"TEST new", &TEST_KIND).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"TEST new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(
            !dead("data.pack").exists(),
            "the killed write's temporary file is cleared"
        );
        assert!(dead("other.pack").exists());
    }

    /// A file in memory that takes `room` bytes, then fails as a full disk does.
    struct FullAfter {
        bytes: Vec<u8>,
        room: usize,
    }

    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room.saturating_sub(self.bytes.len()));
            if n == 0 && !buf.is_empty() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.bytes.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl AppendTarget for FullAfter {
        fn end(&mut self) -> std::io::Result<u64> {
            Ok(self.bytes.len() as u64)
        }
        fn truncate_to(&mut self, len: u64) -> std::io::Result<()> {
            self.bytes.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn an_append_that_does_not_fit_leaves_no_partial_line() {
        let mut f = FullAfter {
            bytes: Vec::new(),
            room: 10,
        };
        append_whole(&mut f, b"{\"a\":1}\n").unwrap();
        assert_eq!(f.bytes, b"{\"a\":1}\n");
        // 2 bytes of room left: the short write is undone, the error is the disk's.
        let e = append_whole(&mut f, b"{\"b\":2}\n").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(f.bytes, b"{\"a\":1}\n");
    }

    #[test]
    fn a_partial_last_line_is_trimmed() {
        let dir = std::env::temp_dir().join(format!("dptrain-trim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        assert_eq!(trim_partial_line(&path).unwrap(), 0);
        let long = "x".repeat(20_000);
        std::fs::write(&path, format!("{{\"a\":1}}\n{long}")).unwrap();
        assert_eq!(trim_partial_line(&path).unwrap(), 20_000);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n");
        assert_eq!(trim_partial_line(&path).unwrap(), 0);
        std::fs::write(&path, "no newline").unwrap();
        assert_eq!(trim_partial_line(&path).unwrap(), 10);
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        append_line(&path, "{}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
