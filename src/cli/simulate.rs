//! `dptrain simulate`: arguments, the sweep and its table.

use super::profile::{describe_profile, make_profile, DeviceArgs};
use crate::bench::args::{on_off_list, worker_list};
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::plan::{BucketFlags, CommChoice, HierarchyChoice};
use crate::sim::{
    search_buckets, Profile, Simulator, StepConfig, StepResult, Stragglers, Topology,
};
use std::path::PathBuf;

/// Arguments of `dptrain simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Profile JSON (from `dptrain profile`); or give --model and a device speed.
    #[arg(long, required_unless_present = "model")]
    pub profile: Option<PathBuf>,
    /// Model to profile from its graph (with --device-tflops or --device-images-per-s):
    /// a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
    #[arg(long, conflicts_with = "profile")]
    pub model: Option<String>,
    /// Per-worker batch, with --model.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// The device, with --model.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Worker counts, comma-separated, one row each in the order given (multiples of
    /// --devices-per-host).
    #[arg(long, default_value = "2,4,8,16,32,64,128,256,512,1024")]
    pub workers: String,
    /// Devices (workers) per host; they share the host's NIC.
    #[arg(long, default_value_t = 1)]
    pub devices_per_host: usize,
    /// NIC bandwidth of every host (e.g. 10Gbit, 400MB/s); with one device per host, every
    /// worker's port.
    #[arg(long, default_value = "10Gbit")]
    pub link_bandwidth: String,
    /// NIC one-way latency (e.g. 5us).
    #[arg(long, default_value = "5us")]
    pub link_latency: String,
    /// Bandwidth of a device's port within its host (needed with --devices-per-host > 1).
    #[arg(long)]
    pub intra_bandwidth: Option<String>,
    /// Latency within a host.
    #[arg(long, default_value = "1us")]
    pub intra_latency: String,
    /// Software cost of every message, added to its link's latency.
    #[arg(long, default_value = "0")]
    pub message_overhead: String,
    /// Modes, comma-separated (tree, ring, hd, redundant, auto), or all.
    #[arg(long, default_value = "all")]
    pub comm: String,
    /// How each host's devices share a bucket's reduction, read as `train --hierarchical` is:
    /// auto, 2d, leader, off (on: 2d), comma-separated, or all (every one).
    #[arg(long, default_value = "auto")]
    pub hierarchical: String,
    /// on, off or both.
    #[arg(long, default_value = "both")]
    pub overlap: String,
    /// Bucket cap in KiB (0: one block per bucket), read as `train --bucket-kb` is [default:
    /// with neither bucket flag given, the bytes the planning link moves in one latency; with
    /// only --first-bucket-kb given, 0].
    #[arg(long)]
    pub bucket_kb: Option<usize>,
    /// First bucket's cap in KiB, read as `train --first-bucket-kb` is [default: with neither
    /// bucket flag given, as --bucket-kb's; with only --bucket-kb given, 0].
    #[arg(long)]
    pub first_bucket_kb: Option<usize>,
    /// Try a range of bucket caps and report the best for each configuration.
    #[arg(long)]
    pub search_buckets: bool,
    /// Coefficient of variation of each worker's compute per step (stragglers), e.g. 0.02, or
    /// `profile`: the spread measured with the profile. Above 0 every worker is simulated.
    #[arg(long, default_value = "0")]
    pub compute_spread: String,
    /// Seed of the straggler draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Steps simulated and averaged when the spread is above 0, at most 10000.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
}

impl SimulateArgs {
    /// `--first-bucket-kb` and `--bucket-kb` as given, for the planning rules to read exactly
    /// as they read `train`'s ([`crate::plan::BucketFlags::caps_kb`]).
    pub fn bucket_flags(&self) -> BucketFlags {
        BucketFlags {
            first_kb: self.first_bucket_kb,
            kb: self.bucket_kb,
        }
    }
}

/// Parses `auto`, a mode, or `all` (every mode and auto).
fn comm_list(s: &str) -> Result<Vec<CommChoice>, String> {
    if s.trim() == "all" {
        let mut v: Vec<CommChoice> = CommMode::ALL
            .iter()
            .map(|&m| CommChoice::Fixed(m))
            .collect();
        v.push(CommChoice::Auto);
        return Ok(v);
    }
    crate::bench::args::list("--comm", s, CommChoice::parse)
}

/// Parses `--hierarchical`: a comma-separated list of hierarchies, or `all`.
fn hierarchy_list(s: &str) -> Result<Vec<HierarchyChoice>, String> {
    if s.trim() == "all" {
        return Ok(vec![
            HierarchyChoice::Auto,
            HierarchyChoice::Fixed(crate::comm::Hierarchy::TwoD),
            HierarchyChoice::Fixed(crate::comm::Hierarchy::Leader),
            HierarchyChoice::Off,
        ]);
    }
    crate::bench::args::list("--hierarchical", s, HierarchyChoice::parse)
}

/// Most `--steps` (straggler draws per configuration): beyond it a sweep takes hours.
const MAX_STEPS: usize = 10_000;

/// Runs `dptrain simulate`: the profile, the cluster and the sweep over worker counts, modes,
/// hierarchical and overlap settings.
pub(super) fn run(a: SimulateArgs) -> Result<(), String> {
    let workers = worker_list("--workers", &a.workers)?;
    if a.steps > MAX_STEPS {
        return Err(format!(
            "--steps {}: at most {MAX_STEPS} straggler draws are averaged (each configuration \
             simulates every one, and the mean of more moves by less than the spread's noise)",
            a.steps
        ));
    }
    let p = load_profile(&a)?;
    let base = topology(&a)?;
    let spread = compute_spread(&a, &p)?;
    let stragglers = Stragglers {
        spread,
        seed: a.seed,
        steps: a.steps,
    };
    let mut sim = Simulator::new();
    let single_cfg = StepConfig {
        topology: Topology::flat(1, base.nic),
        comm: CommChoice::Fixed(CommMode::Ring),
        hierarchy: HierarchyChoice::Auto,
        overlap: true,
        buckets: a.bucket_flags(),
        planning_link: None,
        stragglers,
    };
    let single = sim.step(&p, &single_cfg)?.step_ms;
    crate::outln!("{}", describe_profile(&p).lines().next().unwrap_or(""));
    crate::outln!("{}", setting_line(&a, spread, p.batch, single));
    crate::outln!("{}", header());
    let sweep = Sweep {
        profile: &p,
        single_cfg,
        single,
        search: a.search_buckets,
        comms: comm_list(&a.comm)?,
        hiers: hierarchy_list(&a.hierarchical)?,
        overlaps: on_off_list("overlap", &a.overlap)?,
    };
    let (mut rows, mut refused) = (0usize, 0usize);
    for &n in &workers {
        let (r, f) = sweep.print_rows(&mut sim, base.with_workers(n)?);
        rows += r;
        refused += f;
    }
    // Nothing simulated is a failure, not a table.
    if rows > 0 && refused == rows {
        return Err(format!(
            "every configuration ({rows}) was refused as too large to simulate (each row says \
             why): simulate fewer --workers"
        ));
    }
    Ok(())
}

/// The profile `--profile` names, or one from `--model`'s graph and the device speed.
fn load_profile(a: &SimulateArgs) -> Result<Profile, String> {
    match (&a.profile, &a.model) {
        (Some(path), _) => Profile::load(path).map_err(|e| e.to_string()),
        (None, Some(model)) => make_profile(model, a.batch, &a.device, || {
            Err(format!(
                "simulate --model {model} needs --device-tflops or --device-images-per-s (or \
                 measure a profile with `dptrain profile` and pass --profile)"
            ))
        }),
        (None, None) => Err("give --profile FILE, or --model with a device speed".into()),
    }
}

/// One host of the cluster (the sweep multiplies it): its NIC, the link within it (needed
/// with more than one device) and the per-message overhead.
fn topology(a: &SimulateArgs) -> Result<Topology, String> {
    let nic = LinkModel {
        bandwidth_bytes_per_s: parse_bandwidth(&a.link_bandwidth)
            .map_err(|e| format!("--link-bandwidth: {e}"))?,
        latency: parse_duration(&a.link_latency).map_err(|e| format!("--link-latency: {e}"))?,
    };
    let d = a.devices_per_host;
    if d == 0 {
        return Err("--devices-per-host 0: a host holds at least 1 device".into());
    }
    let intra = match &a.intra_bandwidth {
        Some(b) => LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(b)
                .map_err(|e| format!("--intra-bandwidth: {e}"))?,
            latency: parse_duration(&a.intra_latency)
                .map_err(|e| format!("--intra-latency: {e}"))?,
        },
        None if d > 1 => {
            return Err(format!(
                "--devices-per-host {d} needs --intra-bandwidth (and --intra-latency): the link \
                 between the devices of a host, e.g. 20GB/s for one NVLink, 12GB/s for PCIe 3 x16"
            ))
        }
        None => nic,
    };
    let overhead =
        parse_duration(&a.message_overhead).map_err(|e| format!("--message-overhead: {e}"))?;
    Ok(Topology {
        hosts: 1,
        devices_per_host: d,
        intra,
        nic,
        overhead,
    })
}

/// `--compute-spread`: a number >= 0, or the spread measured with the profile.
fn compute_spread(a: &SimulateArgs, p: &Profile) -> Result<f64, String> {
    match a.compute_spread.trim() {
        "profile" => p.compute_spread.ok_or_else(|| {
            format!(
                "--compute-spread profile: {} has no measured spread (profiles from FLOPs or \
                 images/s have none); give a number",
                p.model
            )
        }),
        v => match v.parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => Ok(x),
            _ => Err(format!(
                "--compute-spread {v:?}: give a number >= 0 (e.g. 0.02) or `profile`"
            )),
        },
    }
}

/// The line under the profile's: the cluster, the spread and the 1-worker step.
fn setting_line(a: &SimulateArgs, spread: f64, batch: usize, single: f64) -> String {
    let d = a.devices_per_host;
    format!(
        "{} device(s) per host; NIC {} / {}{}; message overhead {}; compute spread {:.1}%{}; \
         weak scaling at batch {} per worker; 1 worker: {single:.3} ms/step",
        d,
        a.link_bandwidth,
        a.link_latency,
        if d > 1 {
            format!(
                ", within a host {} / {}",
                a.intra_bandwidth.as_deref().unwrap_or(""),
                a.intra_latency
            )
        } else {
            String::new()
        },
        a.message_overhead,
        100.0 * spread,
        if spread > 0.0 {
            format!(" (mean of {} seeded steps)", a.steps)
        } else {
            String::new()
        },
        batch
    )
}

/// What every worker count of the sweep runs: each mode x hierarchical x overlap setting.
struct Sweep<'a> {
    profile: &'a Profile,
    /// The 1-worker configuration the others vary (buckets, stragglers).
    single_cfg: StepConfig,
    /// Its step time, ms.
    single: f64,
    /// Search the bucket caps (`--search-buckets`)?
    search: bool,
    comms: Vec<CommChoice>,
    hiers: Vec<HierarchyChoice>,
    overlaps: Vec<bool>,
}

impl Sweep<'_> {
    /// Prints one row per configuration on `topology`; returns the rows and how many of them
    /// were refused as too large to simulate (a refused row says why and the sweep goes on).
    fn print_rows(&self, sim: &mut Simulator, topology: Topology) -> (usize, usize) {
        let (mut rows, mut refused) = (0, 0);
        for &comm in &self.comms {
            for &hierarchy in &self.hiers {
                for &overlap in &self.overlaps {
                    let cfg = StepConfig {
                        topology,
                        comm,
                        hierarchy,
                        overlap,
                        ..self.single_cfg
                    };
                    let result = if self.search {
                        search_buckets(sim, self.profile, &cfg).map(|(kb, r)| (Some(kb), r))
                    } else {
                        sim.step(self.profile, &cfg)
                            .map(|r| (cfg.buckets.caps_kb().map(|(_, b)| b), r))
                    };
                    rows += 1;
                    match result {
                        Ok((kb, r)) => {
                            crate::outln!("{}", row(&cfg, kb, &r, self.single, self.profile.batch))
                        }
                        Err(e) => {
                            refused += 1;
                            crate::outln!("{}", refused_row(&cfg, &e));
                        }
                    }
                }
            }
        }
        (rows, refused)
    }
}

/// The line of a configuration too large to simulate, saying why.
fn refused_row(cfg: &StepConfig, e: &str) -> String {
    let t = &cfg.topology;
    format!(
        "{:>7} {:>9} {:>10} {:>6} {:>7} refused: {e}",
        t.workers(),
        format!("{}x{}", t.hosts, t.devices_per_host),
        cfg.comm.to_string(),
        cfg.hierarchy.to_string(),
        if cfg.overlap { "on" } else { "off" },
    )
}

/// The table header of [`row`].
fn header() -> String {
    format!(
        "{:>7} {:>9} {:>10} {:>6} {:>7} {:>9} {:>7} {:>10} {:>10} {:>10} {:>11} {:>6}",
        "workers",
        "hosts",
        "comm",
        "hier",
        "overlap",
        "bucket",
        "buckets",
        "step ms",
        "comm ms",
        "exposed",
        "img/s",
        "eff%"
    )
}

/// One configuration's line: `single` is the 1-worker step time (weak-scaling efficiency);
/// `bucket_kb` the cap searched or given (`None`: the trainer's default).
fn row(
    cfg: &StepConfig,
    bucket_kb: Option<usize>,
    r: &StepResult,
    single: f64,
    batch: usize,
) -> String {
    let bucket = match bucket_kb {
        None => "default".to_string(),
        Some(0) => "block".to_string(),
        Some(kb) if kb >= 1 << 30 => "all".to_string(),
        Some(kb) => format!("{kb}K"),
    };
    let t = &cfg.topology;
    let world = t.workers();
    format!(
        "{:>7} {:>9} {:>10} {:>6} {:>7} {:>9} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>11.0} {:>6.1}",
        world,
        format!("{}x{}", t.hosts, t.devices_per_host),
        cfg.comm.to_string(),
        cfg.hierarchy.to_string(),
        if cfg.overlap { "on" } else { "off" },
        bucket,
        r.bucket_bytes.len(),
        r.step_ms,
        r.comm_ms,
        r.exposed_ms,
        (world * batch) as f64 / (r.step_ms / 1e3),
        100.0 * single / r.step_ms
    )
}
