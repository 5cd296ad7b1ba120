//! `dptrain report`: run reports regenerated, and several runs compared.

use std::path::{Path, PathBuf};

/// Writes each run directory's report, and with several runs their comparison into `out`
/// (default `runs/comparison`).
pub(super) fn run(run_dirs: &[PathBuf], out: Option<PathBuf>) -> Result<(), String> {
    for dir in run_dirs {
        if let Some(holder) = crate::train::lock::holder_of(dir) {
            crate::terminal::print_warning(&format!(
                "{} is still being written by {holder}: the report shows the run so far",
                dir.display()
            ));
        }
        let figures = crate::report::write_run_report(dir)?;
        crate::outln!("{}: report.md and {} figures", dir.display(), figures.len());
    }
    if run_dirs.len() > 1 {
        let out = match out {
            Some(out) => out,
            None => {
                // The default is ours, not the user's: its parent `runs/` may be made.
                crate::output::create_dir(Path::new("runs"))?;
                PathBuf::from("runs/comparison")
            }
        };
        let table = crate::report::write_comparison(run_dirs, &out)?;
        crate::outln!("{table}\ncomparison written to {}", out.display());
    }
    Ok(())
}
