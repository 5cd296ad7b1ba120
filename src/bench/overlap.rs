//! `dptrain bench overlap`: the overlap grid. For each emulated bandwidth, each mode and overlap
//! on/off, a short training run of the model on synthetic data, and one table row: step time,
//! backward, communication (total, exposed, hidden fraction), images/s, scaling efficiency
//! against one worker with the same per-worker batch.

use crate::config::TrainOptions;
use crate::train::{train, Summary};
use std::path::Path;

/// One grid cell's settings.
#[derive(Debug, Clone)]
pub struct OverlapCase {
    /// `--comm` value.
    pub comm: String,
    /// Overlap on?
    pub overlap: bool,
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
        comm: Some(case.comm.clone()),
        bucket_kb: spec.bucket_kb,
        link_bandwidth: case.bandwidth.clone(),
        link_latency: case.bandwidth.as_ref().and(case.latency.clone()),
        train_limit: Some(spec.batch * (spec.steps + 5)),
        test_limit: Some(100),
        run_dir: Some(dir.to_path_buf()),
        // The benchmarks run case after case in one scratch run directory of their own.
        overwrite: true,
        quiet: true,
        no_checkpoints: true,
        ..Default::default()
    }
}

/// Prints the table header.
pub fn header() -> String {
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

/// Formats one row; `single` is the images/s of one worker with the same per-worker batch.
pub fn row(case: &OverlapCase, s: &Summary, workers: usize, single: f64) -> String {
    let m = &s.breakdown.mean;
    let hidden = if m.comm_total_ms > 0.0 {
        100.0 * m.hidden_comm_ms() / m.comm_total_ms
    } else {
        0.0
    };
    let mode = if case.comm == "auto" {
        format!("auto:{}", short_ops(&s.bucket_ops))
    } else {
        case.comm.clone()
    };
    format!(
        "{:>10} {:>10} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>9.0} {:>6.1}",
        case.bandwidth.as_deref().unwrap_or("none"),
        mode,
        if case.overlap { "on" } else { "off" },
        m.step_ms,
        m.backward_ms,
        m.comm_total_ms,
        m.exposed_comm_ms,
        hidden,
        s.images_per_s,
        100.0 * s.images_per_s / (workers as f64 * single)
    )
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
