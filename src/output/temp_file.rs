//! [`TempFile`]: a temporary file of an atomic write (see the module above), removed on every
//! way the write can fail: an error (dropped), a panic (dropped) and a signal that ends the
//! process (registered with [`crate::interrupt`] while it exists).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// A temporary file of this process: removed when dropped, unless renamed into place first
/// ([`TempFile::rename_to`]), and removed too if a signal ends the process.
#[derive(Debug)]
pub(super) struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Creates `path`, which must not exist (`create_new`: no planted link is followed).
    pub(super) fn create_new(path: PathBuf) -> std::io::Result<(Self, File)> {
        let file = crate::interrupt::create_registered(&path, |p| {
            OpenOptions::new().write(true).create_new(true).open(p)
        })?;
        Ok((Self { path }, file))
    }

    /// Its path.
    #[cfg(test)]
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames it over `target`; when that fails it is removed.
    pub(super) fn rename_to(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, target)?;
        crate::interrupt::let_go_file(&std::mem::take(&mut self.path));
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
        crate::interrupt::let_go_file(&self.path);
    }
}
