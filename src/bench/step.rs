//! `dptrain bench step`: the median time of one training step (forward, backward, SGD
//! update) of a model on one worker, on synthetic data.

use super::median;
use crate::measure::SyntheticReplica;
use std::time::Instant;

/// Per-phase medians of one step, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct StepBench {
    /// Whole step.
    pub step_ms: f64,
    /// Forward and loss.
    pub forward_ms: f64,
    /// Backward.
    pub backward_ms: f64,
    /// Update.
    pub update_ms: f64,
}

/// Times `steps` steps (after 3 warm-up steps) of `model` at `batch` on `threads` threads.
pub fn bench_step(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
) -> Result<StepBench, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<StepBench, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        let (mut step, mut fwd, mut bwd, mut upd) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        for i in 0..steps + 3 {
            let m = replica.step(|_| {}, |_| {});
            if i >= 3 {
                step.push(ms(m.start, m.update));
                fwd.push(ms(m.start, m.forward));
                bwd.push(ms(m.forward, m.backward));
                upd.push(ms(m.backward, m.update));
            }
        }
        Ok(StepBench {
            step_ms: median(&mut step),
            forward_ms: median(&mut fwd),
            backward_ms: median(&mut bwd),
            update_ms: median(&mut upd),
        })
    })
}

/// Arguments of `dptrain bench step`.
#[derive(Debug, Clone, clap::Args)]
pub struct StepArgs {
    /// Models, comma-separated: built-in names (`dptrain model list`) or model files (docs/MODEL_FILES.md).
    #[arg(long, default_value = "lenet5,vgg-small")]
    pub model: String,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub threads: String,
    /// Timed steps.
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
}

/// One row of the step table: a model at a thread count.
#[derive(Debug, Clone)]
pub struct StepRow {
    /// The model as the list gave it.
    pub model: String,
    /// Compute threads.
    pub threads: usize,
    /// Its per-phase medians.
    pub times: StepBench,
}

/// The step table: every model at every thread count, at one batch.
#[derive(Debug, Clone)]
pub struct StepTable {
    /// Batch of every row.
    pub batch: usize,
    /// Rows, by model then thread count.
    pub rows: Vec<StepRow>,
}

/// Measures every model of `models` at every count of `threads` (in that order), calling
/// `on_row` with each row as it is measured.
pub fn measure_table(
    models: &[&str],
    batch: usize,
    threads: &[usize],
    steps: usize,
    mut on_row: impl FnMut(&StepRow, usize),
) -> Result<StepTable, String> {
    let mut rows = Vec::new();
    for m in models {
        for &t in threads {
            let row = StepRow {
                model: m.to_string(),
                threads: t,
                times: bench_step(m.trim(), batch, t, steps)?,
            };
            on_row(&row, batch);
            rows.push(row);
        }
    }
    Ok(StepTable { batch, rows })
}

impl StepRow {
    /// The row on the terminal, and its `RESULT` line.
    pub fn terminal(&self, batch: usize) -> String {
        let r = &self.times;
        format!(
            "{:<10} {:>5} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.2}\n\
             RESULT dptrain {} time threads={} median_ms={:.2}",
            self.model,
            batch,
            self.threads,
            r.step_ms,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            self.model,
            self.threads,
            r.step_ms
        )
    }

    /// The row in markdown, with the images/s of its step.
    pub fn markdown(&self, batch: usize) -> String {
        let r = &self.times;
        format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |\n",
            self.model.trim(),
            self.threads,
            r.step_ms,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            batch as f64 * 1e3 / r.step_ms
        )
    }
}

impl StepTable {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:<10} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10}",
            "model", "batch", "threads", "step ms", "fwd ms", "bwd ms", "upd ms"
        )
    }

    /// The table on the terminal: header, then each row and its `RESULT` line.
    pub fn terminal(&self) -> String {
        let mut s = Self::terminal_header();
        for r in &self.rows {
            s += "\n";
            s += &r.terminal(self.batch);
        }
        s
    }

    /// The table in markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| model | threads | step | forward | backward | update | images/s |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            s += &r.markdown(self.batch);
        }
        s
    }
}

/// Runs `dptrain bench step`: the table, printed row by row as it is measured.
pub fn run_command(a: StepArgs) -> Result<(), String> {
    let threads = super::args::list("--threads", &a.threads, super::args::parse_thread_count)?;
    super::args::check_bench_threads(&threads);
    if a.batch == 0 || a.steps == 0 {
        return Err("--batch and --steps must be at least 1".into());
    }
    let models = super::args::entries("--model", &a.model)?;
    for m in &models {
        crate::measure::check_step_memory(m.trim(), a.batch, 1)?;
    }
    crate::outln!("{}", StepTable::terminal_header());
    measure_table(&models, a.batch, &threads, a.steps, |row, batch| {
        crate::outln!("{}", row.terminal(batch))
    })?;
    Ok(())
}
