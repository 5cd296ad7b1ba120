//! `dptrain report`: run reports regenerated, and several runs compared.

use std::path::{Path, PathBuf};

/// Writes each run directory's report, and with several runs their comparison into `out`
/// (default `runs/comparison`).
pub(super) fn run(run_dirs: &[PathBuf], out: Option<PathBuf>) -> Result<(), String> {
    // The comparison's directory is made (and checked) before any report is rewritten, and a
    // run given twice would be a column beside itself. A command that fails leaves no empty
    // directory it made.
    let mut created = crate::output::CreatedDirs::default();
    let out = match (run_dirs.len() > 1, out) {
        (false, Some(out)) => {
            return Err(format!(
                "--out {}: names the comparison of two or more runs; one run's report is \
                 written into its own directory (leave --out out)",
                out.display()
            ))
        }
        (false, None) => None,
        (true, Some(out)) => Some(out),
        (true, None) => {
            // The default is ours, not the user's: its parent `runs/` may be made.
            created.create(Path::new("runs"))?;
            Some(PathBuf::from("runs/comparison"))
        }
    };
    if let Some(out) = &out {
        created.create(out)?;
    }
    created.removed_if_failed(|| write_reports(run_dirs, out))
}

/// [`run`]'s work once the comparison's directory `out` (if any) exists.
fn write_reports(run_dirs: &[PathBuf], out: Option<PathBuf>) -> Result<(), String> {
    if let Some(out) = &out {
        let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        };
        for (i, a) in run_dirs.iter().enumerate() {
            if let Some(b) = run_dirs[..i].iter().find(|b| same(a, b)) {
                return Err(format!(
                    "{} and {} are the same run: give each run once to compare them",
                    b.display(),
                    a.display()
                ));
            }
        }
        crate::output::check_writable(
            &out.join("comparison.md"),
            &crate::report::markdown::COMPARISON_FILE,
        )?;
        crate::output::check_replaceable(
            &out.join("comparison.png"),
            &crate::report::plot::PLOT_FILE,
        )?;
    }
    for dir in run_dirs {
        if let Some(holder) = crate::train::lock::holder_of(dir) {
            crate::terminal::print_warning(&format!(
                "{} is still being written by {holder}: the report shows the run so far",
                dir.display()
            ));
        }
    }
    // Every run is read before any report is rewritten: one that cannot be read stops the
    // command with the others' reports as they were.
    let mut runs = Vec::with_capacity(run_dirs.len());
    for dir in run_dirs {
        runs.push(crate::report::RunData::load(dir)?);
        crate::report::check_run_report(dir)?;
    }
    for run in &runs {
        let figures = crate::report::write_report_of(run)?;
        crate::outln!(
            "{}: report.md and {} figures",
            run.dir.display(),
            figures.len()
        );
    }
    if let Some(out) = out {
        let table = crate::report::write_comparison(&runs, &out)?;
        crate::outln!("{table}\ncomparison written to {}", out.display());
    }
    Ok(())
}
