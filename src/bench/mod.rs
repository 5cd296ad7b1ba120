//! Benchmarks: commands that print figures (never tests that fail on a slow day).
//!
//! One module per `dptrain bench` command; [`suite`] runs short versions of them all and
//! writes one markdown page with plots.

pub mod ablation;
pub mod allreduce;
pub mod args;
pub mod compress;
pub mod data;
pub mod infer;
pub mod loader;
pub mod memory_bound;
pub mod overlap;
pub mod roofline;
pub mod simcheck;
pub mod step;
pub mod suite;

pub use crate::measure::median;

/// Each iteration's wall time over threads that ran it at once: from the earliest thread's
/// start to the latest's end (with more threads than cores, a thread timing only itself
/// would miss the time it waited for a core). `spans[thread][iteration]` = (start, end).
pub fn wall_times(spans: &[Vec<(std::time::Instant, std::time::Instant)>]) -> Vec<f64> {
    let iters = spans.iter().map(Vec::len).min().unwrap_or(0);
    (0..iters)
        .map(|i| {
            let start = spans.iter().map(|s| s[i].0).min().expect("a thread");
            let end = spans.iter().map(|s| s[i].1).max().expect("a thread");
            end.duration_since(start).as_secs_f64()
        })
        .collect()
}

use std::path::{Path, PathBuf};

/// A directory under the system's temporary directory for one benchmark's run directories and
/// exported data, named after the benchmark and this process; removed (with its contents) when
/// dropped, also when the benchmark fails half-way or a signal ends it.
pub struct ScratchDir {
    dir: PathBuf,
    /// Removed whole if a signal ends the benchmark.
    _registration: crate::interrupt::ScratchRegistration,
}

impl ScratchDir {
    /// `$TMPDIR/dptrain-bench-<name>-<pid>`, emptied if it exists, and created: what goes
    /// into it creates one level at most (see [`crate::output`]). If it cannot be created, the
    /// first write into it says why.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dptrain-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = crate::output::create_dir(&dir);
        Self {
            _registration: crate::interrupt::ScratchRegistration::new(&dir),
            dir,
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
