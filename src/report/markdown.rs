//! The Markdown pages: a run's `report.md` and the comparison of several runs, with their
//! plots ([`super::plot`]).

use super::plot;
use super::run_data::{EpochRow, Phases, RunData, PHASES};
use crate::train::run_files::RUN_FIGURES;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A run's `report.md`: defined with the run directory's files.
pub use crate::train::run_files::REPORT_FILE;

/// `report --out`'s `comparison.md`, known by its first line.
pub const COMPARISON_FILE: crate::output::Kind = crate::output::Kind {
    what: "a comparison dptrain wrote",
    head: 64,
    is_one: |head| head.starts_with(b"# Comparison\n"),
};

/// `text` as one cell of a Markdown table: a `|` (a model file or a data directory may have
/// one in its name) escaped and a line break made a space, so that neither ends the cell or
/// the row.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// The step breakdown as a Markdown table: one row per phase, ms and % of the step. A run of
/// one worker (`exchanges` false) has no communication to time: "-", not a measured 0. A
/// `resumed` run's breakdown is of the steps after its resume point.
pub fn breakdown_table(p: &Phases, exchanges: bool, resumed: bool) -> String {
    if p.step_ms <= 0.0 {
        let which = match resumed {
            true => {
                "this run trained no more after its resume point (the epochs before it, \
                     below, were timed by the run it resumed)"
            }
            false => "this run had no more",
        };
        return format!(
            "No timed steps: the first {} steps of a run are untimed warm-up, and {which}.\n",
            crate::train::metrics::WARMUP_STEPS
        );
    }
    let mut t = String::from("| phase | ms per step | % of step |\n|---|---:|---:|\n");
    for (i, name) in PHASES.iter().enumerate() {
        match i == EXPOSED_COMM && !exchanges {
            true => writeln!(t, "| {name} | - | - |"),
            false => writeln!(t, "| {name} | {:.2} | {:.1} |", p.ms[i], p.pct(i)),
        }
        .expect("writing to a String");
    }
    let _ = writeln!(t, "| **step** | **{:.2}** | 100.0 |", p.step_ms);
    t += &match exchanges {
        true => format!(
            "\nCommunication: {:.2} ms per step in collectives, {:.0}% of it hidden behind \
             backward.\n",
            p.comm_total_ms,
            p.hidden_pct()
        ),
        false => "\nCommunication: none (one worker: no gradient exchange).\n".into(),
    };
    t
}

/// [`PHASES`]' index of exposed communication.
const EXPOSED_COMM: usize = 3;

/// One row of the per-epoch table. An epoch all within the warm-up has no timed step, so no
/// breakdown: "-" in its step columns, not 0; nor has a run of one worker (`exchanges` false)
/// communication.
fn epoch_row(e: &EpochRow, exchanges: bool) -> String {
    let timed = |v: String| {
        if e.phases.step_ms > 0.0 {
            v
        } else {
            "-".into()
        }
    };
    format!(
        "| {} | {:.4} | {:.4} | {:.2}% | {:.0} | {} | {} | {} |\n",
        e.epoch,
        e.train_loss,
        e.test_loss,
        100.0 * e.test_accuracy,
        e.images_per_s,
        timed(format!("{:.2}", e.phases.step_ms)),
        match exchanges {
            true => timed(format!("{:.1}", e.phases.pct(EXPOSED_COMM))),
            false => "-".into(),
        },
        timed(format!("{:.1}", e.phases.pct(0)))
    )
}

/// Checks that [`write_run_report`] may write its files into `run_dir`: each is absent,
/// empty or of its kind (an earlier report's), so that a command reporting several runs
/// refuses before it rewrites any.
pub fn check_run_report(run_dir: &Path) -> Result<(), String> {
    crate::output::check_replaceable(&run_dir.join("report.md"), &REPORT_FILE)?;
    for figure in RUN_FIGURES {
        crate::output::check_replaceable(&run_dir.join(figure), &plot::PLOT_FILE)?;
    }
    Ok(())
}

/// Writes `report.md`, `loss.png`, `accuracy.png` and `breakdown.png` into `run_dir` from its
/// `summary.json` and `metrics.jsonl`; returns the figures written.
pub fn write_run_report(run_dir: &Path) -> Result<Vec<PathBuf>, String> {
    write_report_of(&RunData::load(run_dir)?)
}

/// [`write_run_report`] of a run already read (so that what reading it warned of is said
/// once).
pub fn write_report_of(run: &RunData) -> Result<Vec<PathBuf>, String> {
    let run_dir = run.dir.as_path();
    check_run_report(run_dir)?;
    let mut figures = Vec::new();
    let mut md = String::new();
    let title = match (run.config.get("model"), run.config.get("dataset")) {
        (Some(m), Some(d)) => format!(
            "{} on {}",
            m.as_str().unwrap_or("?"),
            d.as_str().unwrap_or("?")
        ),
        _ => run.name(),
    };
    let _ = writeln!(md, "# Run report: {title}\n");
    let _ = writeln!(md, "Run directory: `{}`\n", run.dir.display());
    md.push_str("## Results\n\n| | |\n|---|---|\n");
    if let Some(a) = run.final_accuracy() {
        let _ = writeln!(md, "| final test accuracy | {:.2}% |", 100.0 * a);
    }
    if let Some(r) = run.images_per_s() {
        let _ = writeln!(md, "| training throughput | {r:.0} images/s |");
    }
    let _ = writeln!(md, "| epochs | {} |", run.epochs.len());
    if let Some(w) = run.summary_f64("wall_seconds") {
        let _ = writeln!(md, "| wall time | {w:.1} s |");
    }
    if let Some(m) = run.summary_f64("peak_rss_mb") {
        let _ = writeln!(md, "| peak resident memory | {m:.0} MiB |");
    }
    if let Some(s) = &run.summary {
        let resumed =
            serde_json::from_value::<crate::train::ResumedFrom>(s["resumed_from"].clone());
        if let Ok(r) = resumed {
            let _ = writeln!(
                md,
                "| resumed | {} from `{}` (throughput, wall time and the step breakdown are of \
                 the steps trained after it) |",
                r.position(),
                cell(&r.checkpoint.display().to_string())
            );
        }
        if let Some(b) = s["buckets"].as_str() {
            let _ = writeln!(md, "| gradient buckets | {b} |");
        }
        if let Some(h) = s["replica_hashes"].as_array() {
            let same = h.windows(2).all(|w| w[0] == w[1]);
            let _ = writeln!(
                md,
                "| replicas | {} |",
                if same { "identical" } else { "DIVERGED" }
            );
        }
    } else {
        md.push_str("| summary | none: the run did not finish |\n");
    }
    if !run.lost_hosts.is_empty() {
        md.push_str(
            "\n## Hosts lost (dptrain launch, `elastic.json`)\n\n| host | at step | found after | \
             training again after | steps redone |\n|---|---:|---:|---:|---:|\n",
        );
        let opt = |x: Option<String>| x.unwrap_or_else(|| "-".into());
        for l in &run.lost_hosts {
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} s | {} | {} |",
                cell(&l.host),
                opt(l.at_step.map(|s| s.to_string())),
                l.found_after_s,
                opt(l.training_again_after_s.map(|t| format!("{t:.1} s"))),
                opt(l.steps_redone.map(|s| s.to_string())),
            );
        }
    }
    md.push_str("\n## Step breakdown (mean per step over all workers)\n\n");
    md.push_str(&breakdown_table(
        &run.phases,
        run.exchanges_gradients(&run.phases),
        run.resumed(),
    ));
    if !run.epochs.is_empty() {
        md.push_str("\n## Per epoch\n\n| epoch | train loss | test loss | test accuracy | images/s | step ms | exposed comm % | data wait % |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for e in &run.epochs {
            md.push_str(&epoch_row(e, run.epoch_exchanges_gradients(e)));
        }
        md.push_str("\n## Figures\n\n");
        let plots: [(&str, &str, plot::PlotFn); 3] = [
            (RUN_FIGURES[0], "Loss per epoch", plot::loss),
            (RUN_FIGURES[1], "Test accuracy per epoch", plot::accuracy),
            (
                RUN_FIGURES[2],
                "Step breakdown per epoch",
                plot::breakdown_per_epoch,
            ),
        ];
        for (file, caption, draw) in plots {
            let path = run.dir.join(file);
            draw(run, &path)?;
            let _ = writeln!(md, "![{caption}]({file})\n");
            figures.push(path);
        }
    }
    if !run.config.is_empty() {
        md.push_str("## Configuration\n\n| option | value |\n|---|---|\n");
        for k in run.config.keys() {
            let _ = writeln!(md, "| {} | {} |", cell(k), cell(&run.config_str(k)));
        }
    }
    crate::output::write_atomically(&run.dir.join("report.md"), md.as_bytes(), &REPORT_FILE)?;
    tracing::info!(dir = %run.dir.display(), figures = figures.len(), "report written");
    Ok(figures)
}

/// An emulated link from a run's config keys `{prefix}_bandwidth_bytes_per_s` and
/// `{prefix}_latency_us`: rate and latency (`none` where the run had none).
fn emulated_link(r: &RunData, prefix: &str) -> String {
    let value = |key: String| r.config.get(&key).and_then(Value::as_f64);
    match value(format!("{prefix}_bandwidth_bytes_per_s")) {
        Some(bytes_per_s) => {
            let latency = value(format!("{prefix}_latency_us")).unwrap_or(0.0);
            format!("{:.0} Mbit/s, {latency:.0} us", bytes_per_s * 8e-6)
        }
        None => "none".into(),
    }
}

/// Compares runs side by side: writes `out/comparison.md` (one column per run) and
/// `out/comparison.png` (one stacked bar per run; not `breakdown.png`, so that an `--out`
/// that is one of the runs keeps that run's own figure); returns the table.
pub fn write_comparison(runs: &[RunData], out: &Path) -> Result<String, String> {
    let mut t = String::from("| |");
    for r in runs {
        let _ = write!(t, " {} |", cell(&r.name()));
    }
    t.push_str("\n|---|");
    t.push_str(&"---:|".repeat(runs.len()));
    t.push('\n');
    let mut row = |label: &str, value: &dyn Fn(&RunData) -> String| {
        let _ = write!(t, "| {label} |");
        for r in runs {
            let _ = write!(t, " {} |", cell(&value(r)));
        }
        t.push('\n');
    };
    let keys = [
        "model", "dataset", "workers", "threads", "batch", "comm", "overlap", "schedule",
        "compress",
    ];
    // A run without summary.json stopped early or is still going: its figures are partial.
    row("finished", &|r| match &r.summary {
        Some(_) => "yes".into(),
        None => format!(
            "**no** ({} done)",
            crate::terminal::counted(r.epochs.len(), "epoch")
        ),
    });
    for key in keys {
        row(key, &|r| r.config_str(key));
    }
    row("link", &|r| emulated_link(r, "link"));
    row("port within a host", &|r| emulated_link(r, "intra"));
    row("test accuracy", &|r| {
        r.final_accuracy()
            .map_or("-".into(), |a| format!("{:.2}%", 100.0 * a))
    });
    row("images/s", &|r| {
        r.images_per_s().map_or("-".into(), |v| format!("{v:.0}"))
    });
    // A run none of whose steps were timed (all within the warm-up) has no breakdown: "-",
    // not a measured 0.00.
    let timed = |r: &RunData, cell: String| match r.phases.step_ms > 0.0 {
        true => cell,
        false => "-".into(),
    };
    row("step ms", &|r| timed(r, format!("{:.2}", r.phases.step_ms)));
    // Nor has a run of one worker communication.
    let exchanged = |r: &RunData, cell: String| match r.exchanges_gradients(&r.phases) {
        true => timed(r, cell),
        false => "-".into(),
    };
    for (i, name) in PHASES.iter().enumerate() {
        row(&format!("{name} ms (%)"), &|r| {
            let cell = format!("{:.2} ({:.1}%)", r.phases.ms[i], r.phases.pct(i));
            match i == EXPOSED_COMM {
                true => exchanged(r, cell),
                false => timed(r, cell),
            }
        });
    }
    row("comm hidden", &|r| {
        exchanged(r, format!("{:.0}%", r.phases.hidden_pct()))
    });
    crate::output::create_dir(out)?;
    plot::breakdown_per_run(runs, &out.join("comparison.png"))?;
    let md =
        format!("# Comparison\n\n{t}\n## Figures\n\n![Step breakdown per run](comparison.png)\n");
    crate::output::write_atomically(&out.join("comparison.md"), md.as_bytes(), &COMPARISON_FILE)?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_without_timed_steps_compares_as_unmeasured_not_as_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let run = |name: &str, step_ms: f64| RunData {
            dir: tmp.path().join(name),
            config: serde_json::Map::new(),
            epochs: Vec::new(),
            summary: None,
            phases: Phases {
                ms: [0.0, step_ms / 2.0, step_ms / 2.0, 0.0, 0.0],
                step_ms,
                comm_total_ms: 0.0,
            },
            lost_hosts: Vec::new(),
        };
        let table = write_comparison(
            &[run("timed", 4.0), run("warm-up", 0.0)],
            &tmp.path().join("cmp"),
        )
        .unwrap();
        let line = |label: &str| {
            let at = table.find(&format!("| {label} |")).unwrap();
            table[at..].lines().next().unwrap().to_string()
        };
        assert_eq!(line("step ms"), "| step ms | 4.00 | - |");
        assert_eq!(
            line("forward ms (%)"),
            "| forward ms (%) | 2.00 (50.0%) | - |"
        );
        assert_eq!(line("comm hidden"), "| comm hidden | 0% | - |");
    }

    #[test]
    fn communication_is_judged_per_epoch_whatever_the_last_job_ran() {
        let mut config = serde_json::Map::new();
        config.insert("workers".into(), 1.into());
        let run = RunData {
            dir: PathBuf::from("run"),
            config,
            epochs: Vec::new(),
            summary: None,
            phases: Phases::default(),
            lost_hosts: Vec::new(),
        };
        // The last job ran one worker; an earlier epoch of two timed its collectives.
        let earlier = Phases {
            ms: [0.0, 1.0, 1.0, 0.5, 0.0],
            step_ms: 2.5,
            comm_total_ms: 2.0,
        };
        assert!(run.exchanges_gradients(&earlier));
        assert!(!run.exchanges_gradients(&Phases {
            comm_total_ms: 0.0,
            ms: [0.0, 1.0, 1.0, 0.0, 0.0],
            ..earlier
        }));
        // An epoch that recorded its workers is judged by them: one worker's epoch of a run
        // whose last job had two shows none, whatever the run's config says.
        let mut two = run.clone();
        two.config.insert("workers".into(), 2.into());
        let epoch = |workers| EpochRow {
            epoch: 1,
            train_loss: 1.0,
            test_loss: 1.0,
            test_accuracy: 0.5,
            images_per_s: 10.0,
            phases: Phases {
                comm_total_ms: 0.0,
                ms: [0.0, 1.0, 1.0, 0.0, 0.0],
                ..earlier
            },
            workers,
        };
        assert!(!two.epoch_exchanges_gradients(&epoch(Some(1))));
        assert!(two.epoch_exchanges_gradients(&epoch(Some(2))));
        assert!(two.epoch_exchanges_gradients(&epoch(None)));
        assert!(!run.epoch_exchanges_gradients(&epoch(None)));
    }

    #[test]
    fn a_name_with_a_pipe_or_a_line_break_stays_in_its_cell() {
        assert_eq!(cell("my|net.toml"), "my\\|net.toml");
        assert_eq!(cell("two\nlines"), "two lines");
    }

    #[test]
    fn an_epoch_within_the_warm_up_shows_no_breakdown() {
        let epoch = |step_ms: f64| EpochRow {
            epoch: 1,
            train_loss: 0.5,
            test_loss: 0.25,
            test_accuracy: 0.9,
            images_per_s: 100.0,
            phases: Phases {
                ms: [1.0, step_ms / 2.0, step_ms / 2.0 - 2.0, 1.0, 0.0],
                step_ms,
                comm_total_ms: 1.0,
            },
            workers: Some(2),
        };
        assert_eq!(
            epoch_row(&epoch(10.0), true),
            "| 1 | 0.5000 | 0.2500 | 90.00% | 100 | 10.00 | 10.0 | 10.0 |\n"
        );
        assert_eq!(
            epoch_row(&epoch(0.0), true),
            "| 1 | 0.5000 | 0.2500 | 90.00% | 100 | - | - | - |\n"
        );
        // One worker exchanges nothing: no communication column, no communication line.
        assert_eq!(
            epoch_row(&epoch(10.0), false),
            "| 1 | 0.5000 | 0.2500 | 90.00% | 100 | 10.00 | - | 10.0 |\n"
        );
        let alone = breakdown_table(&epoch(10.0).phases, false, false);
        assert!(alone.contains("| exposed comm | - | - |\n"), "{alone}");
        assert!(alone.contains("Communication: none (one worker"), "{alone}");
        assert!(breakdown_table(&epoch(10.0).phases, true, false)
            .contains("| exposed comm | 1.00 | 10.0 |"));
    }
}
