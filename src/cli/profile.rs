//! `dptrain profile`: a model's per-block step profile, measured here or derived from its
//! graph and a device speed, written as JSON.

use crate::measure::{check_step_memory, MAX_PROFILE_BATCH};
use crate::model::reference_graph;
use crate::sim::{from_graph, measure, DeviceSpec, DeviceSpeed, MeasureSpec, Profile};
use std::path::PathBuf;

/// How fast the device is, for a profile from the model's graph.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArgs {
    /// Derive times from FLOPs for a device of this peak TFLOPS.
    #[arg(long)]
    pub device_tflops: Option<f64>,
    /// Fraction of peak reached, with --device-tflops.
    #[arg(long, default_value_t = 0.4)]
    pub efficiency: f64,
    /// Derive times from this device's training throughput on the model (images/s at the
    /// profile's batch, e.g. a published single-device figure).
    #[arg(long, conflicts_with = "device_tflops")]
    pub device_images_per_s: Option<f64>,
    /// Device memory bandwidth in GB/s (the update is memory-bound).
    #[arg(long, default_value_t = 900.0)]
    pub mem_gbs: f64,
}

impl DeviceArgs {
    /// The device speed given, if any.
    pub(super) fn speed(&self) -> Option<DeviceSpeed> {
        match (self.device_tflops, self.device_images_per_s) {
            (Some(tflops), _) => Some(DeviceSpeed::Flops(DeviceSpec {
                tflops,
                efficiency: self.efficiency,
                mem_gbs: self.mem_gbs,
            })),
            (None, Some(images_per_s)) => Some(DeviceSpeed::ImagesPerSecond {
                images_per_s,
                mem_gbs: self.mem_gbs,
            }),
            (None, None) => None,
        }
    }
}

/// Arguments of `dptrain profile`.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// Model: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md). Measured on this machine's training engine, or
    /// derived from its graph with --device-tflops or --device-images-per-s.
    #[arg(long)]
    pub model: String,
    /// Per-worker batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Compute threads (measured profiles).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed steps (measured profiles; 3 more run untimed first), at most 10000.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Replicas measured at once, to include the contention of that many emulated workers
    /// sharing this machine.
    #[arg(long, default_value_t = 1)]
    pub concurrent: usize,
    /// How the 3x3 stride-1 convolutions are computed (measured profiles): direct, winograd
    /// (F(4x4,3x3)), winograd:2 (F(2x2,3x3)) or auto.
    #[arg(long, default_value_t = crate::backend::ConvAlgo::default())]
    pub conv_algo: crate::backend::ConvAlgo,
    /// The device, instead of measuring.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Output JSON file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Builds the profile `profile`/`simulate` were asked for: from the graph and a device speed,
/// or measured on this machine. Either is checked as a loaded profile is.
pub(super) fn make_profile(
    model: &str,
    batch: usize,
    device: &DeviceArgs,
    measured: impl FnOnce() -> Result<Profile, String>,
) -> Result<Profile, String> {
    // An unknown name is an unknown name, whether or not a device speed was given.
    let graph = reference_graph(model)?;
    if batch == 0 || batch > MAX_PROFILE_BATCH {
        return Err(format!(
            "--batch {batch}: give a per-worker batch from 1 to {MAX_PROFILE_BATCH}"
        ));
    }
    let Some(speed) = device.speed() else {
        let p = measured()?;
        crate::measure::profile::validate(&p).map_err(|e| e.to_string())?;
        return Ok(p);
    };
    let p = from_graph(&graph, batch, speed)?;
    // Figures of a device given on the command line, not a profile file to re-create.
    crate::measure::profile::validate(&p).map_err(|e| {
        format!(
            "the device given ({}) makes an impossible profile of {model} at batch {batch}: \
             {e}; check the device's figures",
            p.source
        )
    })?;
    Ok(p)
}

/// The most timed steps a measured profile takes: each step's times are kept.
const MAX_PROFILE_STEPS: usize = 10_000;

/// Runs `dptrain profile`.
pub(super) fn run(a: ProfileArgs) -> Result<(), String> {
    // The output is checked before the minutes of measuring it would hold.
    crate::output::check_writable(&a.out, &crate::measure::PROFILE_FILE)
        .map_err(|e| format!("--out: {e}"))?;
    let p = make_profile(&a.model, a.batch, &a.device, || {
        if a.threads == 0 {
            return Err("--threads 0: a step needs at least 1 compute thread".into());
        }
        if a.steps > MAX_PROFILE_STEPS {
            return Err(format!(
                "--steps {}: at most {MAX_PROFILE_STEPS} timed steps (the times of each are \
                 kept)",
                a.steps
            ));
        }
        if a.threads > crate::limits::cores() {
            super::print_warning(&format!(
                "--threads {} is more than the {} cores this process may use: the measured \
                 times include time-slicing",
                a.threads,
                crate::limits::cores()
            ));
        }
        check_step_memory(&a.model, a.batch, a.concurrent.max(1), a.conv_algo)?;
        measure(&MeasureSpec {
            concurrent: a.concurrent,
            conv_algo: a.conv_algo,
            ..MeasureSpec::new(&a.model, a.batch, a.threads, a.steps)
        })
    })?;
    p.save(&a.out).map_err(|e| format!("--out: {e}"))?;
    crate::outln!("{}", describe_profile(&p));
    crate::outln!("profile written to {}", a.out.display());
    Ok(())
}

/// A short table of a profile's blocks.
pub(super) fn describe_profile(p: &Profile) -> String {
    let mut s = format!(
        "{} at batch {} ({}): forward {:.3} ms, backward {:.3} ms, update {:.3} ms, {:.2} M params{}\n",
        p.model,
        p.batch,
        p.source,
        p.forward_ms(),
        p.backward_ms(),
        p.update_ms,
        p.grad_bytes() as f64 / 4e6,
        p.compute_spread
            .map_or(String::new(), |c| format!(", compute spread {:.1}%", 100.0 * c))
    );
    s += &format!(
        "{:<16} {:>10} {:>10} {:>12} {:>14}\n",
        "block", "fwd ms", "bwd ms", "grad KiB", "MACs/sample"
    );
    for b in &p.blocks {
        s += &format!(
            "{:<16} {:>10.3} {:>10.3} {:>12.1} {:>14}\n",
            b.name,
            b.forward_ms,
            b.backward_ms,
            b.grad_bytes() as f64 / 1024.0,
            b.macs_per_sample
        );
    }
    s.trim_end().to_string()
}
