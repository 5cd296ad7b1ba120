//! `dptrain bench overlap`: the overlap grid. For each emulated bandwidth, each mode and overlap
//! on/off, a short training run of the model on synthetic data, and one table row: step time,
//! backward, communication (total, exposed, hidden fraction), images/s, scaling efficiency
//! against one worker with the same per-worker batch.

use super::ScratchDir;
use crate::config::TrainOptions;
use crate::train::metrics::StepTimes;
use crate::train::{train, Summary};
use std::path::Path;

/// Arguments of `dptrain bench overlap`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverlapArgs {
    /// Model: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
    #[arg(long, default_value = "vgg-small")]
    pub model: String,
    /// Workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Compute threads per worker.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Global batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Emulated bandwidths, comma-separated ("none" for no emulation).
    #[arg(
        allow_hyphen_values = true,
        long,
        default_value = "none,100Mbit,20Mbit"
    )]
    pub link_bandwidth: String,
    /// Emulated latency.
    #[arg(allow_hyphen_values = true, long, default_value = "50us")]
    pub link_latency: String,
    /// Modes, comma-separated.
    #[arg(long, default_value = "tree,ring,hd,redundant,auto")]
    pub comm: String,
    /// Bucket cap in KiB.
    #[arg(long)]
    pub bucket_kb: Option<usize>,
    /// Schedules with overlap on, comma-separated: overlap, priority (`train --schedule`;
    /// priority is not run with tree, which refuses it).
    #[arg(long, default_value = "overlap")]
    pub schedule: String,
    /// Timed steps per cell.
    #[arg(long, default_value_t = 15)]
    pub steps: usize,
    /// How the 3x3 stride-1 convolutions are computed (as `train --conv-algo`).
    #[arg(long, default_value_t = crate::backend::ConvAlgo::default())]
    pub conv_algo: crate::backend::ConvAlgo,
}

/// One grid cell's settings.
#[derive(Debug, Clone)]
pub struct OverlapCase {
    /// `--comm` value.
    pub comm: String,
    /// Overlap on?
    pub overlap: bool,
    /// `--schedule` (priority only with overlap on).
    pub schedule: crate::parallel::Schedule,
    /// `--link-bandwidth` value, `None` for no emulation.
    pub bandwidth: Option<String>,
    /// `--link-latency` value.
    pub latency: Option<String>,
}

/// The dataset name that gives `model` its reference input shape.
pub fn synthetic_for(model: &str) -> &'static str {
    if model == "lenet5" {
        "synthetic"
    } else {
        "synthetic:3x32x32"
    }
}

/// What stays fixed across the grid.
#[derive(Debug, Clone)]
pub struct GridSpec {
    /// Model name.
    pub model: String,
    /// Workers.
    pub workers: usize,
    /// Global batch.
    pub batch: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Timed steps per cell (5 more run untimed first).
    pub steps: usize,
    /// Bucket cap in KiB (`None`: the default).
    pub bucket_kb: Option<usize>,
    /// How the 3x3 stride-1 convolutions are computed.
    pub conv_algo: crate::backend::ConvAlgo,
}

/// Runs one grid cell: a short training run of `spec.model` on synthetic data.
pub fn run_case(spec: &GridSpec, case: &OverlapCase, dir: &Path) -> Result<Summary, String> {
    Ok(train(case_options(spec, case, dir).resolve()?)?)
}

/// The training options of one grid cell (what [`run_case`] runs): `spec.steps + 5` steps of
/// one epoch on synthetic data, 100 test samples, quiet, no checkpoints, run directory `dir`.
/// Other benchmarks start from these and change what they vary (dataset, pipeline).
pub fn case_options(spec: &GridSpec, case: &OverlapCase, dir: &Path) -> TrainOptions {
    TrainOptions {
        model: Some(spec.model.clone()),
        dataset: Some(synthetic_for(&spec.model).into()),
        epochs: Some(1),
        batch: Some(spec.batch),
        workers: Some(spec.workers),
        threads: Some(spec.threads),
        overlap: Some(if case.overlap { "on" } else { "off" }.into()),
        schedule: Some(case.schedule.to_string()),
        comm: Some(case.comm.clone()),
        bucket_kb: spec.bucket_kb.map(Into::into),
        link_bandwidth: case.bandwidth.clone(),
        link_latency: case.bandwidth.as_ref().and(case.latency.clone()),
        train_limit: Some(spec.batch * (spec.steps + 5)),
        test_limit: Some(100),
        conv_algo: Some(spec.conv_algo.to_string()),
        run_dir: Some(dir.to_path_buf()),
        // The benchmarks run case after case in one scratch run directory of their own.
        overwrite: true,
        quiet: true,
        no_checkpoints: true,
        ..Default::default()
    }
}

/// Bucket modes chosen by `auto`, e.g. `R,R,H` (first letter of each mode).
fn short_ops(ops: &[String]) -> String {
    ops.iter()
        .map(|o| match o.as_str() {
            "redundant" => "r",
            "ring" => "g",
            "hd" => "h",
            _ => "t",
        })
        .collect()
}

/// The grid's cells in table order: per bandwidth (`None`: no emulation), per mode, overlap on
/// with each of `schedules` (priority not with tree, which refuses it), then off, every
/// emulated cell at `latency`.
pub fn grid_cases(
    bandwidths: &[Option<String>],
    modes: &[&str],
    schedules: &[crate::parallel::Schedule],
    latency: &str,
) -> Vec<OverlapCase> {
    use crate::parallel::Schedule;
    let mut cases = Vec::new();
    for bw in bandwidths {
        for mode in modes {
            let on = schedules
                .iter()
                .filter(|&&s| s == Schedule::Overlap || *mode != "tree")
                .map(|&s| (true, s));
            for (overlap, schedule) in on.chain([(false, Schedule::Overlap)]) {
                cases.push(OverlapCase {
                    comm: mode.to_string(),
                    overlap,
                    schedule,
                    bandwidth: bw.clone(),
                    latency: Some(latency.to_string()),
                });
            }
        }
    }
    cases
}

/// Images/s of one worker at the grid's per-worker batch (ring, overlap on, no emulation):
/// the reference of the grid's weak-scaling efficiency.
pub fn single_worker_images_per_s(spec: &GridSpec, dir: &Path) -> Result<f64, String> {
    let one = GridSpec {
        workers: 1,
        batch: spec.batch / spec.workers,
        ..spec.clone()
    };
    let base = OverlapCase {
        comm: "ring".into(),
        overlap: true,
        schedule: crate::parallel::Schedule::Overlap,
        bandwidth: None,
        latency: None,
    };
    Ok(run_case(&one, &base, dir)?.images_per_s)
}

/// One measured cell of the grid.
#[derive(Debug, Clone)]
pub struct OverlapCell {
    /// Its settings.
    pub case: OverlapCase,
    /// The run's mean step.
    pub mean: StepTimes,
    /// The run's images/s.
    pub images_per_s: f64,
    /// Each bucket's operation as the run chose it.
    pub bucket_ops: Vec<String>,
}

/// The measured grid, with what its efficiencies are relative to.
#[derive(Debug, Clone)]
pub struct OverlapGrid {
    /// Workers of every cell.
    pub workers: usize,
    /// Images/s of one worker at the same per-worker batch.
    pub single: f64,
    /// Cells in table order.
    pub cells: Vec<OverlapCell>,
}

/// Runs every case in `cases` (in `dir`), calling `on_cell` with each cell as it is measured;
/// `single` is [`single_worker_images_per_s`].
pub fn measure_grid(
    spec: &GridSpec,
    single: f64,
    cases: &[OverlapCase],
    dir: &Path,
    mut on_cell: impl FnMut(&OverlapGrid, &OverlapCell),
) -> Result<OverlapGrid, String> {
    let mut grid = OverlapGrid {
        workers: spec.workers,
        single,
        cells: Vec::with_capacity(cases.len()),
    };
    for case in cases {
        let s = run_case(spec, case, dir)?;
        let cell = OverlapCell {
            case: case.clone(),
            mean: s.breakdown.mean,
            images_per_s: s.images_per_s,
            bucket_ops: s.bucket_ops,
        };
        on_cell(&grid, &cell);
        grid.cells.push(cell);
    }
    Ok(grid)
}

impl OverlapCase {
    /// The overlap column: `on`, `off`, or `prio` (overlap on, `--schedule priority`).
    fn overlap_label(&self) -> &'static str {
        match (self.overlap, self.schedule) {
            (false, _) => "off",
            (true, crate::parallel::Schedule::Overlap) => "on",
            (true, crate::parallel::Schedule::Priority) => "prio",
        }
    }
}

impl OverlapCell {
    /// Communication hidden under backward, % of all communication.
    fn hidden_pct(&self) -> f64 {
        let m = &self.mean;
        if m.comm_total_ms > 0.0 {
            100.0 * m.hidden_comm_ms() / m.comm_total_ms
        } else {
            0.0
        }
    }

    /// Weak-scaling efficiency against `single` images/s of one worker, %.
    fn efficiency_pct(&self, grid: &OverlapGrid) -> f64 {
        100.0 * self.images_per_s / (grid.workers as f64 * grid.single)
    }

    /// The cell's terminal row; auto's modes shown as `auto:` and one letter per bucket.
    pub fn terminal(&self, grid: &OverlapGrid) -> String {
        let (case, m) = (&self.case, &self.mean);
        let mode = if case.comm == "auto" {
            format!("auto:{}", short_ops(&self.bucket_ops))
        } else {
            case.comm.clone()
        };
        format!(
            "{:>10} {:>10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>9.0} {:>6.1}",
            case.bandwidth.as_deref().unwrap_or("none"),
            mode,
            case.overlap_label(),
            m.step_ms,
            m.backward_ms,
            m.comm_total_ms,
            m.exposed_comm_ms,
            self.hidden_pct(),
            self.images_per_s,
            self.efficiency_pct(grid)
        )
    }

    /// The cell's markdown row (its bandwidth is the page's).
    pub fn markdown(&self, grid: &OverlapGrid) -> String {
        let m = &self.mean;
        format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} |\n",
            self.case.comm,
            self.case.overlap_label(),
            m.step_ms,
            m.backward_ms,
            m.comm_total_ms,
            m.exposed_comm_ms,
            self.hidden_pct(),
            self.images_per_s,
            self.efficiency_pct(grid)
        )
    }
}

impl OverlapGrid {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:>10} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>6}",
            "bandwidth",
            "comm",
            "overlap",
            "step ms",
            "bwd ms",
            "comm ms",
            "exposed",
            "hidden%",
            "img/s",
            "eff%"
        )
    }

    /// The grid on the terminal: header and rows.
    pub fn terminal(&self) -> String {
        let mut s = Self::terminal_header();
        for c in &self.cells {
            s += "\n";
            s += &c.terminal(self);
        }
        s
    }

    /// The grid in markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| comm | overlap | step ms | backward ms | comm ms | exposed ms | hidden % | images/s | eff % |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for c in &self.cells {
            s += &c.markdown(self);
        }
        s
    }
}

/// Runs `dptrain bench overlap`: the grid, printed row by row as it is measured.
pub fn run_command(a: OverlapArgs) -> Result<(), String> {
    super::args::entries("--link-bandwidth", &a.link_bandwidth)?;
    super::args::check_emulated_links(&a.model, &a.link_bandwidth, &a.link_latency, true)?;
    super::args::entries("--comm", &a.comm)?;
    super::args::check_timed_counts(&[("--steps", a.steps)])?;
    if a.workers < 2 {
        return Err("--workers must be at least 2".into());
    }
    crate::plan::per_worker_batch(a.batch, a.workers, 1).map_err(|e| e.to_string())?;
    let scratch = ScratchDir::new("overlap");
    let spec = GridSpec {
        model: a.model.clone(),
        workers: a.workers,
        batch: a.batch,
        threads: a.threads,
        steps: a.steps,
        bucket_kb: a.bucket_kb,
        conv_algo: a.conv_algo,
    };
    let single = single_worker_images_per_s(&spec, scratch.path())?;
    crate::outln!(
        "{}, {} workers x {} threads, global batch {}, latency {}; 1 worker at batch {}: {single:.0} images/s",
        a.model,
        a.workers,
        a.threads,
        a.batch,
        a.link_latency,
        a.batch / a.workers
    );
    crate::outln!("{}", OverlapGrid::terminal_header());
    let bandwidths: Vec<Option<String>> = a
        .link_bandwidth
        .split(',')
        .map(|bw| (bw.trim() != "none").then(|| bw.trim().to_string()))
        .collect();
    let modes: Vec<&str> = a.comm.split(',').map(str::trim).collect();
    let schedules = super::args::entries("--schedule", &a.schedule)?
        .into_iter()
        .map(crate::parallel::Schedule::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let cases = grid_cases(&bandwidths, &modes, &schedules, &a.link_latency);
    measure_grid(&spec, single, &cases, scratch.path(), |grid, cell| {
        crate::outln!("{}", cell.terminal(grid))
    })?;
    Ok(())
}
