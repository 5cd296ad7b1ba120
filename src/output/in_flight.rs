//! The temporary files this process is writing now ([`TempFile`]), and their removal when a
//! signal ends the process ([`remove_on_signal`]).
//!
//! Why: a replacing write goes to a temporary file beside its target (see the module above),
//! and a process killed mid-write used to leave it there until the next write to the same
//! target: after an interrupted `data pack`, a hidden file as large as what was written.
//!
//! How: [`remove_on_signal`], called once by the binary, starts a thread that waits for
//! SIGINT, SIGTERM or SIGHUP (signal-hook's self-pipe: the handler itself only writes a byte,
//! the one thing a handler may safely do), removes every registered file, and ends the process
//! as the signal would have, so the shell still sees an interrupted command (exit status 130
//! for Ctrl-C). A signal the process was started ignoring (`nohup`'s SIGHUP) stays ignored. A
//! file is registered before it is created and let go once renamed into place
//! or removed; the thread keeps the register locked until the process has ended, so no
//! temporary file is created after the removal. SIGKILL cannot be caught: what it leaves is
//! cleared by the next write to the same target (`remove_stale_temps`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The temporary files of this process that exist (or are being created) now.
static IN_FLIGHT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn in_flight() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic while the lock was held leaves a list that is still right.
    IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner)
}

fn let_go(path: &Path) {
    let mut files = in_flight();
    if let Some(i) = files.iter().position(|p| p == path) {
        files.swap_remove(i);
    }
}

/// A temporary file of this process: removed when dropped, unless renamed into place first
/// ([`TempFile::rename_to`]), and removed too if a signal ends the process.
#[derive(Debug)]
pub(super) struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Creates `path`, which must not exist (`create_new`: no planted link is followed).
    pub(super) fn create_new(path: PathBuf) -> std::io::Result<(Self, File)> {
        in_flight().push(path.clone());
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => Ok((Self { path }, file)),
            Err(e) => {
                // Not ours (it existed) or never made: not ours to remove either.
                let_go(&path);
                Err(e)
            }
        }
    }

    /// Its path.
    #[cfg(test)]
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames it over `target`; when that fails it is removed.
    pub(super) fn rename_to(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        let_go(&std::mem::take(&mut self.path));
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return; // renamed into place
        }
        // Never left behind: on a full disk it would keep the disk full.
        let _ = std::fs::remove_file(&self.path);
        let_go(&self.path);
    }
}

/// Starts the thread that removes this process's temporary files when SIGINT, SIGTERM or
/// SIGHUP arrives, then ends the process as that signal would have (see the module comment).
/// For the binary: a library user keeps its own signal handling.
pub fn remove_on_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // A signal the process was started ignoring stays ignored: `nohup` ignores SIGHUP, and a
    // shell script's background job SIGINT; catching them would let them end the run.
    let caught = [SIGINT, SIGTERM, SIGHUP]
        .into_iter()
        .filter(|&s| !ignored(s));
    let mut signals = signal_hook::iterator::Signals::new(caught)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // Held until the process ends: nothing new is created after the removal.
                let files = in_flight();
                for f in files.iter() {
                    let _ = std::fs::remove_file(f);
                }
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                // Not reached (the default action of these signals ends the process).
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

/// Whether `signal` is ignored (`SIG_IGN`) now.
fn ignored(signal: libc::c_int) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}
