//! `dptrain profile` and `dptrain simulate`: arguments and the printed tables.

use super::profile::{from_graph, DeviceSpec, DeviceSpeed};
use super::step::{search_buckets, Simulator, StepConfig, StepResult, Stragglers};
use super::topology::Topology;
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::measure::{measure, Profile, MAX_PROFILE_BATCH};
use crate::model::reference_graph;
use crate::plan::{BucketFlags, CommChoice};
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
    pub fn speed(&self) -> Option<DeviceSpeed> {
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
    /// Model: a built-in name or a model file. Measured on this machine's training engine, or
    /// derived from its graph with --device-tflops or --device-images-per-s.
    #[arg(long)]
    pub model: String,
    /// Per-worker batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Compute threads (measured profiles).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed steps (measured profiles; 3 more run untimed first).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Replicas measured at once, to include the contention of that many emulated workers
    /// sharing this machine.
    #[arg(long, default_value_t = 1)]
    pub concurrent: usize,
    /// The device, instead of measuring.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Output JSON file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Bytes a measured training step needs per sample, as a multiple of the f32 bytes of every
/// layer's output: the network keeps each output for backward and at most as much again in
/// gradient buffers (shared by liveness, usually far less); 2.5 leaves a margin for the
/// kernels' scratch.
const STEP_BYTES_FACTOR: f64 = 2.5;

/// Refuses a measured profile whose step would not fit in this machine's memory.
pub fn check_step_memory(model: &str, batch: usize, replicas: usize) -> Result<(), String> {
    let g = reference_graph(model)?;
    let elems: usize = g.nodes.iter().map(|n| n.shape.numel()).sum();
    let bytes = 4.0 * elems as f64 * STEP_BYTES_FACTOR * batch as f64 * replicas as f64
        + 16.0 * g.num_params() as f64 * replicas as f64;
    let replicas = if replicas > 1 {
        format!(" on {replicas} replicas")
    } else {
        String::new()
    };
    crate::limits::check_memory(
        &format!("a {model} step at batch {batch}{replicas}"),
        bytes,
        "lower --batch",
    )
}

/// Builds the profile `profile`/`simulate` were asked for: from the graph and a device speed,
/// or measured on this machine. Either is checked as a loaded profile is.
fn make_profile(
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
    let p = match device.speed() {
        Some(speed) => from_graph(&graph, batch, speed)?,
        None => measured()?,
    };
    crate::measure::profile::validate(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

/// Runs `dptrain profile`.
pub fn profile(a: ProfileArgs) -> Result<(), String> {
    // The output is checked before the minutes of measuring it would hold.
    crate::output::check_writable(&a.out).map_err(|e| format!("--out: {e}"))?;
    let p = make_profile(&a.model, a.batch, &a.device, || {
        if a.threads == 0 {
            return Err("--threads 0: a step needs at least 1 compute thread".into());
        }
        if a.threads > crate::limits::cores() {
            crate::cli::print_warning(&format!(
                "--threads {} is more than the {} cores this process may use: the measured \
                 times include time-slicing",
                a.threads,
                crate::limits::cores()
            ));
        }
        check_step_memory(&a.model, a.batch, a.concurrent.max(1))?;
        measure(&a.model, a.batch, a.threads, a.steps, a.concurrent)
    })?;
    p.save(&a.out).map_err(|e| format!("--out: {e}"))?;
    println!("{}", describe_profile(&p));
    println!("profile written to {}", a.out.display());
    Ok(())
}

/// Arguments of `dptrain simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Profile JSON (from `dptrain profile`); or give --model and a device speed.
    #[arg(long, required_unless_present = "model")]
    pub profile: Option<PathBuf>,
    /// Model to profile from its graph (with --device-tflops or --device-images-per-s).
    #[arg(long, conflicts_with = "profile")]
    pub model: Option<String>,
    /// Per-worker batch, with --model.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// The device, with --model.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Worker counts, comma-separated (multiples of --devices-per-host).
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
    /// Reduce within each host first (on), flat over every worker (off), or both.
    #[arg(long, default_value = "on")]
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
    /// Steps simulated and averaged when the spread is above 0.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
}

/// A short table of a profile's blocks.
pub fn describe_profile(p: &Profile) -> String {
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

/// Parses `auto`, a mode, or `all` (every mode and auto).
pub fn comm_list(s: &str) -> Result<Vec<CommChoice>, String> {
    if s.trim() == "all" {
        let mut v: Vec<CommChoice> = CommMode::ALL
            .iter()
            .map(|&m| CommChoice::Fixed(m))
            .collect();
        v.push(CommChoice::Auto);
        return Ok(v);
    }
    s.split(',').map(|m| CommChoice::parse(m.trim())).collect()
}

/// Parses `on`, `off` or `both`.
pub fn on_off_list(flag: &str, s: &str) -> Result<Vec<bool>, String> {
    match s.trim() {
        "on" => Ok(vec![true]),
        "off" => Ok(vec![false]),
        "both" => Ok(vec![true, false]),
        o => Err(format!("--{flag} {o:?}: use on, off or both")),
    }
}

/// Parses a comma-separated list of worker counts; each must be a positive integer.
pub fn worker_list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|w| match w.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "bad worker count '{w}': give positive integers, e.g. 8,64,512"
            )),
        })
        .collect()
}

/// Runs `dptrain simulate`.
pub fn simulate(a: SimulateArgs) -> Result<(), String> {
    let p = match (&a.profile, &a.model) {
        (Some(path), _) => Profile::load(path).map_err(|e| e.to_string())?,
        (None, Some(model)) => make_profile(model, a.batch, &a.device, || {
            Err(format!(
                "simulate --model {model} needs --device-tflops or --device-images-per-s (or \
                 measure a profile with `dptrain profile` and pass --profile)"
            ))
        })?,
        (None, None) => return Err("give --profile FILE, or --model with a device speed".into()),
    };
    let workers = worker_list(&a.workers)?;
    let nic = LinkModel {
        bandwidth_bytes_per_s: parse_bandwidth(&a.link_bandwidth)
            .map_err(|e| format!("--link-bandwidth: {e}"))?,
        latency: parse_duration(&a.link_latency).map_err(|e| format!("--link-latency: {e}"))?,
    };
    let d = a.devices_per_host;
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
    let base = Topology {
        hosts: 1,
        devices_per_host: d,
        intra,
        nic,
        overhead,
    };
    let comms = comm_list(&a.comm)?;
    let overlaps = on_off_list("overlap", &a.overlap)?;
    let hiers = on_off_list("hierarchical", &a.hierarchical)?;
    let spread = match a.compute_spread.trim() {
        "profile" => p.compute_spread.ok_or_else(|| {
            format!(
                "--compute-spread profile: {} has no measured spread (profiles from FLOPs or \
                 images/s have none); give a number",
                p.model
            )
        })?,
        v => match v.parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => x,
            _ => {
                return Err(format!(
                    "--compute-spread {v:?}: give a number >= 0 (e.g. 0.02) or `profile`"
                ))
            }
        },
    };
    let stragglers = Stragglers {
        spread,
        seed: a.seed,
        steps: a.steps,
    };
    // The trainer's reading of the same flags (`plan::BucketFlags`), so both plan the same
    // buckets.
    let buckets = BucketFlags {
        first_kb: a.first_bucket_kb,
        kb: a.bucket_kb,
    };
    let mut sim = Simulator::new();
    let single_cfg = StepConfig {
        topology: Topology::flat(1, nic),
        comm: CommChoice::Fixed(CommMode::Ring),
        hierarchical: true,
        overlap: true,
        buckets,
        planning_link: None,
        stragglers,
    };
    let single = sim.step(&p, &single_cfg)?.step_ms;
    println!("{}", describe_profile(&p).lines().next().unwrap_or(""));
    println!(
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
        p.batch
    );
    println!("{}", header());
    let (mut rows, mut refused) = (0usize, 0usize);
    for &n in &workers {
        let topology = base.with_workers(n)?;
        for &comm in &comms {
            for &hierarchical in &hiers {
                for &overlap in &overlaps {
                    let cfg = StepConfig {
                        topology,
                        comm,
                        hierarchical,
                        overlap,
                        ..single_cfg
                    };
                    let result = if a.search_buckets {
                        search_buckets(&mut sim, &p, &cfg).map(|(kb, r)| (Some(kb), r))
                    } else {
                        sim.step(&p, &cfg)
                            .map(|r| (buckets.caps_kb().map(|(_, b)| b), r))
                    };
                    // A configuration too large to simulate says why and the sweep goes on.
                    rows += 1;
                    match result {
                        Ok((kb, r)) => println!("{}", row(&cfg, kb, &r, single, p.batch)),
                        Err(e) => {
                            refused += 1;
                            println!(
                                "{:>7} {:>9} {:>10} {:>5} {:>7} refused: {e}",
                                n,
                                format!("{}x{}", topology.hosts, topology.devices_per_host),
                                comm.to_string(),
                                if hierarchical { "on" } else { "off" },
                                if overlap { "on" } else { "off" },
                            )
                        }
                    }
                }
            }
        }
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

/// The table header of [`row`].
pub fn header() -> String {
    format!(
        "{:>7} {:>9} {:>10} {:>5} {:>7} {:>9} {:>7} {:>10} {:>10} {:>10} {:>11} {:>6}",
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
pub fn row(
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
        "{:>7} {:>9} {:>10} {:>5} {:>7} {:>9} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>11.0} {:>6.1}",
        world,
        format!("{}x{}", t.hosts, t.devices_per_host),
        cfg.comm.to_string(),
        if cfg.hierarchical { "on" } else { "off" },
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
