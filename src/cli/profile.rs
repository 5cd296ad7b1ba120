//! `dptrain profile`: a model's per-block step profile, measured here or derived from its
//! graph and a device speed, written as JSON.

use crate::measure::MAX_PROFILE_BATCH;
use crate::model::reference_graph;
use crate::sim::{from_graph, measure, DeviceSpec, DeviceSpeed, MeasureSpec, Profile};
use std::path::PathBuf;

/// How fast the device is, for a profile from the model's graph.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArgs {
    /// Derive times from FLOPs for a device of this peak TFLOPS.
    #[arg(long)]
    pub device_tflops: Option<f64>,
    /// Fraction of peak reached, with --device-tflops [default: 0.4].
    #[arg(long)]
    pub efficiency: Option<f64>,
    /// Derive times from this device's training throughput on the model (images/s at the
    /// profile's batch, e.g. a published single-device figure).
    #[arg(long, conflicts_with = "device_tflops")]
    pub device_images_per_s: Option<f64>,
    /// Device memory bandwidth in GB/s (the update is memory-bound), with a device speed
    /// [default: 900].
    #[arg(long)]
    pub mem_gbs: Option<f64>,
}

/// `--efficiency`'s default: an assumption, not a measurement (give the device's own figure
/// where known); kept as it was when the two were default values of the flags.
const DEFAULT_EFFICIENCY: f64 = 0.4;

/// `--mem-gbs`'s default: the V100's HBM2 bandwidth, 900 GB/s (NVIDIA's V100 datasheet).
const DEFAULT_MEM_GBS: f64 = 900.0;

impl DeviceArgs {
    /// The device speed given, if any.
    pub(super) fn speed(&self) -> Option<DeviceSpeed> {
        let mem_gbs = self.mem_gbs.unwrap_or(DEFAULT_MEM_GBS);
        match (self.device_tflops, self.device_images_per_s) {
            (Some(tflops), _) => Some(DeviceSpeed::Flops(DeviceSpec {
                tflops,
                efficiency: self.efficiency.unwrap_or(DEFAULT_EFFICIENCY),
                mem_gbs,
            })),
            (None, Some(images_per_s)) => Some(DeviceSpeed::ImagesPerSecond {
                images_per_s,
                mem_gbs,
            }),
            (None, None) => None,
        }
    }

    /// Refuses a device figure that would change nothing: `--efficiency` without
    /// `--device-tflops`, `--mem-gbs` without a device speed (a measured profile's times are
    /// this machine's).
    pub(super) fn check_applies(&self) -> Result<(), String> {
        if self.efficiency.is_some() && self.device_tflops.is_none() {
            return Err(
                "--efficiency is the fraction of --device-tflops reached: it applies \
                        with --device-tflops only"
                    .into(),
            );
        }
        if self.mem_gbs.is_some() && self.speed().is_none() {
            return Err(
                "--mem-gbs is the device's memory bandwidth: it applies with \
                        --device-tflops or --device-images-per-s only (a measured profile's \
                        times are this machine's)"
                    .into(),
            );
        }
        Ok(())
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
    /// Compute threads (measured profiles) [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed steps (measured profiles; 3 more run untimed first), at most 10000 [default: 10].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Replicas measured at once, to include the contention of that many emulated workers
    /// sharing this machine (measured profiles) [default: 1].
    #[arg(long)]
    pub concurrent: Option<usize>,
    /// How the 3x3 stride-1 convolutions are computed (measured profiles): direct, winograd
    /// (F(4x4,3x3)), winograd:2 (F(2x2,3x3)) or auto [default: auto].
    #[arg(long)]
    pub conv_algo: Option<crate::backend::ConvAlgo>,
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
    device.check_applies()?;
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
    // Options of a measurement, given with a device speed (a derived profile), would change
    // nothing: refused rather than ignored.
    if a.device.speed().is_some() {
        let measuring = super::given::first_given(&[
            ("--threads", a.threads.is_some()),
            ("--steps", a.steps.is_some()),
            ("--concurrent", a.concurrent.is_some()),
            ("--conv-algo", a.conv_algo.is_some()),
        ]);
        if let Some(flag) = measuring {
            return Err(format!(
                "{flag} is an option of a measured profile, and a device speed \
                 (--device-tflops, --device-images-per-s) derives the times from the graph: \
                 leave out one of the two"
            ));
        }
    }
    // The output is checked before the minutes of measuring it would hold.
    crate::output::check_writable(&a.out, &crate::measure::PROFILE_FILE)
        .map_err(|e| format!("--out: {e}"))?;
    let p = make_profile(&a.model, a.batch, &a.device, || {
        let threads = a.threads.unwrap_or(1);
        let steps = a.steps.unwrap_or(10);
        let concurrent = a.concurrent.unwrap_or(1);
        let conv_algo = a.conv_algo.unwrap_or_default();
        if steps > MAX_PROFILE_STEPS {
            return Err(format!(
                "--steps {steps}: at most {MAX_PROFILE_STEPS} timed steps (the times of each \
                 are kept)"
            ));
        }
        let spec = MeasureSpec {
            concurrent,
            conv_algo,
            ..MeasureSpec::new(&a.model, a.batch, threads, steps)
        };
        spec.check()?;
        if threads > crate::limits::cores() {
            super::print_warning(&format!(
                "--threads {threads} is more than the {} cores this process may use: the \
                 measured times include time-slicing",
                crate::limits::cores()
            ));
        }
        measure(&spec)
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
