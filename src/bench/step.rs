//! `dptrain bench step`: the median time of one training step (forward, backward, SGD
//! update) of a model on one worker, on synthetic data.

use super::median;
use crate::backend::ConvAlgo;
use crate::measure::{MeasureSpec, SyntheticReplica};
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
    /// Floating-point operations of one step, counted as direct convolution and GEMM do them:
    /// 6 x the forward multiply-accumulates x the batch (2 per MAC forward, 4 for the input and
    /// weight gradients; the first layer's unneeded input gradient included), in GFLOP.
    pub gflop: f64,
}

impl StepBench {
    /// Achieved GFLOP/s of the whole step.
    pub fn gflops(&self) -> f64 {
        self.gflop / (self.step_ms / 1e3)
    }
}

/// Times `steps` steps (after 3 warm-up steps) of `model` at `batch` on `threads` threads, its
/// 3x3 convolutions by `conv_algo`.
pub fn bench_step(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
    conv_algo: ConvAlgo,
) -> Result<StepBench, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| -> Result<StepBench, String> {
        let mut replica = SyntheticReplica::new(model, batch)?;
        replica.net.set_conv_algo(conv_algo);
        let gflop = 6.0 * replica.net.graph().macs() as f64 * batch as f64 / 1e9;
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
            gflop,
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
    /// Also time every block (a layer with parameters and the layers after it up to the next)
    /// and print its achieved GFLOP/s forward and backward against the FMA peak.
    #[arg(long)]
    pub layers: bool,
    /// How the 3x3 stride-1 convolutions are computed: direct (im2col + GEMM), winograd
    /// (F(4x4,3x3)), winograd:2 (F(2x2,3x3)) or auto (Winograd where its rule says it pays).
    #[arg(long, default_value_t = crate::backend::ConvAlgo::default())]
    pub conv_algo: ConvAlgo,
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
    /// The FMA peak of this many threads, GFLOP/s, measured in the same run
    /// ([`super::roofline::fma_peak`]).
    pub peak_gflops: f64,
}

impl StepRow {
    /// The step's achieved GFLOP/s as a fraction of the peak.
    pub fn peak_fraction(&self) -> f64 {
        self.times.gflops() / self.peak_gflops
    }
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
    conv_algo: ConvAlgo,
    mut on_row: impl FnMut(&StepRow, usize),
) -> Result<StepTable, String> {
    let mut rows = Vec::new();
    let peaks: Vec<f64> = threads
        .iter()
        .map(|&t| super::roofline::fma_peak(t).0)
        .collect();
    for m in models {
        for (&t, &peak_gflops) in threads.iter().zip(&peaks) {
            let row = StepRow {
                model: m.to_string(),
                threads: t,
                times: bench_step(m.trim(), batch, t, steps, conv_algo)?,
                peak_gflops,
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
            "{:<10} {:>5} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>8.1} {:>6.0}%\n\
             RESULT dptrain {} time threads={} median_ms={:.2}",
            self.model,
            batch,
            self.threads,
            r.step_ms,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            r.gflops(),
            100.0 * self.peak_fraction(),
            self.model,
            self.threads,
            r.step_ms
        )
    }

    /// The row in markdown, with the images/s of its step.
    pub fn markdown(&self, batch: usize) -> String {
        let r = &self.times;
        format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {:.0}% |\n",
            self.model.trim(),
            self.threads,
            r.step_ms,
            r.forward_ms,
            r.backward_ms,
            r.update_ms,
            batch as f64 * 1e3 / r.step_ms,
            r.gflops(),
            100.0 * self.peak_fraction()
        )
    }
}

impl StepTable {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:<10} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7}",
            "model", "batch", "threads", "step ms", "fwd ms", "bwd ms", "upd ms", "GFLOP/s", "peak"
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
            "| model | threads | step | forward | backward | update | images/s | GFLOP/s | of FMA peak |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            s += &r.markdown(self.batch);
        }
        s
    }
}

/// Runs `dptrain bench step`: the table, printed row by row as it is measured.
pub fn run_command(a: StepArgs) -> Result<(), String> {
    let threads = super::args::list(
        "--threads",
        &a.threads,
        super::args::thread_count("--threads"),
    )?;
    super::args::check_timed_counts(&[("--steps", a.steps)])?;
    if a.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let models = super::args::entries("--model", &a.model)?;
    // Every row is checked before the first is measured.
    for m in &models {
        for &t in &threads {
            MeasureSpec {
                conv_algo: a.conv_algo,
                flags: crate::measure::MeasureFlags::THREADS_ONLY,
                ..MeasureSpec::new(m.trim(), a.batch, t, a.steps)
            }
            .check()?;
        }
    }
    super::args::warn_threads_past_cores(&threads);
    crate::outln!("{}", StepTable::terminal_header());
    let table = measure_table(
        &models,
        a.batch,
        &threads,
        a.steps,
        a.conv_algo,
        |row, batch| crate::outln!("{}", row.terminal(batch)),
    )?;
    if a.layers {
        for row in &table.rows {
            let layers = measure_layers(row, a.batch, a.steps, a.conv_algo)?;
            crate::outln!("\n{}", layers.terminal());
        }
    }
    Ok(())
}

/// One block's times and achieved rates.
#[derive(Debug, Clone)]
pub struct LayerRow {
    /// The block's layer with parameters.
    pub name: String,
    /// Its type and output shape (`conv 64x32x32`).
    pub what: String,
    /// Forward multiply-accumulates of one sample.
    pub macs_per_sample: u64,
    /// Whether the block's layer is a convolution or a linear layer (a GEMM, whose rate
    /// against the FMA peak means something; a batch norm's does not).
    pub gemm: bool,
    /// Median forward and backward milliseconds.
    pub forward_ms: f64,
    /// See `forward_ms`.
    pub backward_ms: f64,
}

/// Every block of one model at one thread count.
#[derive(Debug, Clone)]
pub struct LayerTable {
    /// The model, its thread count and the peak the rates are a fraction of.
    pub model: String,
    /// See `model`.
    pub threads: usize,
    /// See `model`.
    pub peak_gflops: f64,
    /// Batch of every row.
    pub batch: usize,
    /// Blocks in execution order.
    pub rows: Vec<LayerRow>,
}

/// Times every block of `row`'s model (`measure::measure`, the profile's block-by-block timing).
pub fn measure_layers(
    row: &StepRow,
    batch: usize,
    steps: usize,
    conv_algo: ConvAlgo,
) -> Result<LayerTable, String> {
    let profile = crate::measure::measure(&MeasureSpec {
        conv_algo,
        flags: crate::measure::MeasureFlags::THREADS_ONLY,
        ..MeasureSpec::new(row.model.trim(), batch, row.threads, steps)
    })?;
    let graph = crate::model::reference_graph(row.model.trim())?;
    let rows = profile
        .blocks
        .iter()
        .map(|b| {
            let node = graph.nodes.iter().find(|n| n.name == b.name);
            let what = node
                .map(|n| format!("{} {}", n.type_name(), n.shape))
                .unwrap_or_default();
            LayerRow {
                name: b.name.clone(),
                what,
                macs_per_sample: b.macs_per_sample,
                gemm: node.is_some_and(|n| matches!(n.type_name(), "conv2d" | "linear")),
                forward_ms: b.forward_ms,
                backward_ms: b.backward_ms,
            }
        })
        .collect();
    Ok(LayerTable {
        model: row.model.trim().to_string(),
        threads: row.threads,
        peak_gflops: row.peak_gflops,
        batch,
        rows,
    })
}

impl LayerTable {
    /// The table on the terminal: forward at 2 and backward at 4 FLOPs per MAC (input and weight
    /// gradients; a first layer computes the weight gradient only, so its backward rate is
    /// overstated twofold).
    pub fn terminal(&self) -> String {
        let mut s = format!(
            "{} at {} thread(s), batch {}: per block (FMA peak {:.1} GFLOP/s)\n{:<16} {:<24} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>6}",
            self.model, self.threads, self.batch, self.peak_gflops,
            "block", "layer", "MMAC", "fwd ms", "bwd ms", "fwd GF/s", "peak", "bwd GF/s", "peak"
        );
        for r in &self.rows {
            let flop = r.macs_per_sample as f64 * self.batch as f64 / 1e9;
            let (f, b) = (
                2.0 * flop / (r.forward_ms / 1e3),
                4.0 * flop / (r.backward_ms / 1e3),
            );
            let rates = if r.gemm {
                format!(
                    "{:>8.1} {:>5.0}% {:>8.1} {:>5.0}%",
                    f,
                    100.0 * f / self.peak_gflops,
                    b,
                    100.0 * b / self.peak_gflops
                )
            } else {
                format!("{:>8} {:>6} {:>8} {:>6}", "-", "-", "-", "-")
            };
            s += &format!(
                "\n{:<16} {:<24} {:>9.1} {:>9.2} {:>9.2} {rates}",
                r.name,
                r.what,
                r.macs_per_sample as f64 / 1e6,
                r.forward_ms,
                r.backward_ms,
            );
        }
        s
    }
}
