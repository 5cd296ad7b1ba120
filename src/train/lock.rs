//! A run directory belongs to one run at a time: the run that claims it holds an advisory lock
//! (`flock(LOCK_EX | LOCK_NB)`) on `.dptrain-lock` in it for the whole run, and a second run
//! on the same directory is refused at once, naming the first's pid. Before this lock two
//! `train --run-dir X` started together both ran to the end, their epoch lines mixed in one
//! `metrics.jsonl` and their checkpoints and summaries overwriting each other.
//!
//! The lock is the kernel's, so a run that is killed (even `kill -9`) releases it: nothing
//! stale is ever left to clean up by hand. The file holds the holder's pid, host and start
//! time, for the refusal's message; it is removed when the lock is released. A lock taken on
//! a file that its holder removed in between (the holder was ending) is taken again on the
//! new file, so two runs never hold locks on two different files of one name.

use crate::output::{CreatedDirs, OutputError};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in a run directory: dptrain's own file, never counted as another
/// run's, never deleted by `--overwrite` while a run holds it.
pub const LOCK_NAME: &str = ".dptrain-lock";

/// Why a run directory's lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds the lock.
    #[error(
        "run directory {} is in use by {holder}: wait for it, or give another --run-dir",
        dir.display()
    )]
    InUse {
        /// The run directory.
        dir: PathBuf,
        /// Who holds it: "dptrain pid N (started ..., on HOST)".
        holder: String,
    },
    /// `--launched-by PID` names a `dptrain launch` that does not hold the run directory.
    #[error(
        "run directory {} is not held by dptrain launch pid {pid} (--launched-by is for the \
         jobs dptrain launch starts): leave the option out",
        dir.display()
    )]
    NotLaunchers {
        /// The run directory.
        dir: PathBuf,
        /// The pid given.
        pid: u32,
    },
    /// The lock file could not be opened, locked or written.
    #[error(transparent)]
    Io(OutputError),
}

/// The lock of a run directory, held while this value lives; dropping it removes the lock
/// file and releases the lock.
#[derive(Debug)]
pub struct RunDirLock {
    path: PathBuf,
    file: File,
    /// The directories the run created to hold it, removed on release if left empty.
    created: CreatedDirs,
    /// The lock file removed if a signal ends the run (as on release), so that the run
    /// directory it made is left empty and removed too; let go first on release, before the
    /// lock is (a signal after that would remove the next holder's file).
    on_signal: Option<crate::interrupt::FileRegistration>,
}

impl RunDirLock {
    /// Takes the lock of `dir` (which must exist) or fails at once: [`LockError::InUse`] when
    /// another process holds it.
    pub fn take(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_NAME);
        let io = |action: &'static str, cause: std::io::Error| {
            LockError::Io(OutputError::Io {
                path: path.clone(),
                action,
                cause,
            })
        };
        // Bounded: each retry means a holder ended between our open and our lock.
        for _ in 0..100 {
            let file = open_lock_file(&path)?;
            if let Err(e) = flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Err(LockError::InUse {
                        dir: dir.to_path_buf(),
                        holder: read_holder(file),
                    });
                }
                return Err(io("lock", e));
            }
            if !is_at(&file, &path) {
                continue;
            }
            // A user's file of the lock's name is not ours to empty (a lock file holds
            // `pid=...`, or nothing if its writer was killed before writing it).
            let mut head = [0u8; 4];
            let n = std::os::unix::fs::FileExt::read_at(&file, &mut head, 0)
                .map_err(|e| io("read", e))?;
            if n > 0 && !b"pid=".starts_with(&head[..n]) {
                return Err(LockError::Io(OutputError::NotOurs {
                    path,
                    what: "a run directory's lock dptrain wrote",
                }));
            }
            let mut lock = Self {
                on_signal: Some(crate::interrupt::FileRegistration::new(&path)),
                path,
                file,
                created: CreatedDirs::default(),
            };
            let text = holder_text();
            lock.file
                .set_len(0)
                .and_then(|()| lock.file.write_all(text.as_bytes()))
                .map_err(|e| {
                    LockError::Io(OutputError::Io {
                        path: lock.path.clone(),
                        action: "write",
                        cause: e,
                    })
                })?;
            return Ok(lock);
        }
        Err(io(
            "lock",
            std::io::Error::other("its holders kept ending while it was being taken"),
        ))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes `created` (the run directory and its parent, where this run made them) on
    /// release if nothing was written there: a run refused before its first file leaves no
    /// empty directory.
    pub fn removing_on_release(mut self, created: CreatedDirs) -> Self {
        self.created = created;
        self
    }
}

impl Drop for RunDirLock {
    fn drop(&mut self) {
        drop(self.on_signal.take());
        // Removed while still locked (and only if it is still ours), then released: a run
        // that opened it meanwhile finds it gone once it has the lock, and takes a new one.
        if is_at(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
        self.created.remove_empty();
    }
}

/// Who holds the lock of `dir`, if a live process does (for commands that only read a run
/// directory, such as `report`, to say that the run is still going). Takes no lock and
/// creates nothing.
pub fn holder_of(dir: &Path) -> Option<String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(dir.join(LOCK_NAME))
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
        Ok(()) => None,
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Some(read_holder(file)),
        Err(_) => None,
    }
}

/// Whether process `pid` (a `dptrain launch`) holds the lock of `dir` now: a job it starts
/// then works in the directory under its lock (a lost host's frozen job may still hold its
/// own open files, never the lock).
pub fn is_held_by(dir: &Path, pid: u32) -> bool {
    holder_of(dir).is_some()
        && std::fs::read_to_string(dir.join(LOCK_NAME))
            .is_ok_and(|t| t.lines().any(|l| l == format!("pid={pid}")))
}

/// Opens flags shared by every open of the lock file: no link followed, no fifo waited on.
trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

/// Opens (creating if absent) the lock file: a regular file only.
fn open_lock_file(path: &Path) -> Result<File, LockError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |action: &'static str, cause: std::io::Error| {
        LockError::Io(OutputError::Io {
            path: path.to_path_buf(),
            action,
            cause,
        })
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags_nofollow()
        .open(path)
        .map_err(|e| io("create a file in the run directory (its lock)", e))?;
    let m = file.metadata().map_err(|e| io("inspect", e))?;
    if !m.is_file() {
        return Err(LockError::Io(OutputError::NotRegular {
            path: path.to_path_buf(),
            kind: "special file",
        }));
    }
    Ok(file)
}

/// `flock(2)` on `file`.
fn flock(file: &File, operation: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: the descriptor is open for as long as `file` is borrowed; flock touches no
    // memory of ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), operation) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether `file` is (still) the file at `path`: same device and inode.
fn is_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What the lock file says about its holder, in words. The holder writes it right after
/// taking the lock, so an empty file is read again a few times before giving up on it.
fn read_holder(mut file: File) -> String {
    let mut text = String::new();
    for _ in 0..50 {
        text.clear();
        use std::io::Seek;
        let read = file
            .seek(std::io::SeekFrom::Start(0))
            .and_then(|_| (&mut file).take(4096).read_to_string(&mut text));
        if read.is_ok() && text.ends_with('\n') {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    describe_holder(&text)
}

/// "dptrain pid N (started T, on HOST)" from the lock file's `key=value` lines.
fn describe_holder(text: &str) -> String {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| {
                v.chars()
                    .filter(|c| !c.is_control())
                    .take(100)
                    .collect::<String>()
            })
    };
    match field("pid") {
        Some(pid) => format!(
            "dptrain pid {pid} (started {}, on {})",
            field("started").unwrap_or_else(|| "at an unknown time".into()),
            field("host").unwrap_or_else(|| "an unknown host".into())
        ),
        None => "another dptrain process (which has not said its pid yet)".into(),
    }
}

/// The lock file's text: this process's pid, host and start time.
fn holder_text() -> String {
    format!(
        "pid={}\nhost={}\nstarted={}\n",
        std::process::id(),
        hostname(),
        utc_now()
    )
}

/// This machine's name (`gethostname`), `unknown` where it cannot be had.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The calendar date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_the_calendar_s() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_when_dropped() {
        let dir = std::env::temp_dir().join(format!("dptrain-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = RunDirLock::take(&dir).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        let err = RunDirLock::take(&dir).unwrap_err();
        let pid = std::process::id();
        let message = err.to_string();
        assert!(
            message.contains(&format!("is in use by dptrain pid {pid} (started ")),
            "{message}"
        );
        assert!(message.ends_with("wait for it, or give another --run-dir"));
        assert_eq!(
            holder_of(&dir).map(|h| h.starts_with(&format!("dptrain pid {pid} "))),
            Some(true)
        );
        drop(lock);
        assert!(!dir.join(LOCK_NAME).exists());
        assert_eq!(holder_of(&dir), None);
        let again = RunDirLock::take(&dir).unwrap();
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_lock_file_without_a_pid_reads_plainly() {
        assert_eq!(
            describe_holder(""),
            "another dptrain process (which has not said its pid yet)"
        );
        assert_eq!(
            describe_holder("pid=7\nhost=a\u{1b}b\nstarted=x\n"),
            "dptrain pid 7 (started x, on ab)"
        );
    }
}
