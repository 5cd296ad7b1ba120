//! `dptrain profile` and `dptrain simulate`: arguments and the printed tables.

use super::arch::describe;
use super::profile::{from_flops, measure, DeviceSpec, Profile};
use super::step::{search_buckets, simulate_step, CommChoice, StepConfig, StepResult};
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use std::path::PathBuf;

/// Arguments of `dptrain profile`.
#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// Model: lenet5, vgg-small, resnet20 (measured or by FLOPs); alexnet, vgg16, resnet50,
    /// inception-v3, inception-v3-noaux (by FLOPs only).
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
    /// Derive times from FLOPs for a device of this peak TFLOPS instead of measuring.
    #[arg(long)]
    pub device_tflops: Option<f64>,
    /// Fraction of peak reached, with --device-tflops.
    #[arg(long, default_value_t = 0.4)]
    pub efficiency: f64,
    /// Device memory bandwidth in GB/s (the update is memory-bound), with --device-tflops.
    #[arg(long, default_value_t = 900.0)]
    pub mem_gbs: f64,
    /// Output JSON file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Largest per-worker batch a profile is made for: far past any real per-worker batch, and
/// small enough that step times and byte counts stay in range of the simulator's arithmetic.
pub const MAX_PROFILE_BATCH: usize = 1 << 20;

/// Arguments of `dptrain simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Profile JSON (from `dptrain profile`).
    #[arg(long)]
    pub profile: PathBuf,
    /// Worker counts, comma-separated.
    #[arg(long, default_value = "2,4,8,16,32,64,128,256,512,1024")]
    pub workers: String,
    /// Port bandwidth of every worker (e.g. 10Gbit, 400MB/s).
    #[arg(long, default_value = "10Gbit")]
    pub link_bandwidth: String,
    /// One-way latency (e.g. 5us).
    #[arg(long, default_value = "5us")]
    pub link_latency: String,
    /// Modes, comma-separated (tree, ring, hd, redundant, auto), or all.
    #[arg(long, default_value = "all")]
    pub comm: String,
    /// on, off or both.
    #[arg(long, default_value = "both")]
    pub overlap: String,
    /// Bucket cap in KiB (0: one block per bucket) [default, as the trainer's: 0, or with
    /// --comm auto the bytes the link moves in one latency].
    #[arg(long)]
    pub bucket_kb: Option<usize>,
    /// First bucket's cap in KiB [default: as --bucket-kb's].
    #[arg(long)]
    pub first_bucket_kb: Option<usize>,
    /// Try a range of bucket caps and report the best for each configuration.
    #[arg(long)]
    pub search_buckets: bool,
}

/// Bytes a measured training step needs per sample, as a multiple of the f32 bytes of every
/// layer's output: the network keeps each output for backward and at most as much again in
/// gradient buffers (shared by liveness, usually far less); 2.5 leaves a margin for the
/// kernels' scratch.
const STEP_BYTES_FACTOR: f64 = 2.5;

/// Refuses a measured profile whose step would not fit in this machine's memory.
pub fn check_step_memory(model: &str, batch: usize, replicas: usize) -> Result<(), String> {
    let g = crate::bench::replica::reference_graph(model)?;
    let elems: usize = g.nodes.iter().map(|n| n.shape.numel()).sum();
    let bytes = 4.0 * elems as f64 * STEP_BYTES_FACTOR * batch as f64 * replicas as f64
        + 16.0 * g.num_params() as f64 * replicas as f64;
    tracing::debug!(
        model,
        batch,
        replicas,
        elems,
        bytes,
        "estimated step memory"
    );
    crate::limits::check_memory(
        &format!(
            "a {model} step at batch {batch}{}",
            if replicas > 1 {
                format!(" on {replicas} replicas")
            } else {
                String::new()
            }
        ),
        bytes,
        "lower --batch",
    )
}

/// Runs `dptrain profile`.
pub fn profile(a: ProfileArgs) -> Result<(), String> {
    // An unknown name is an unknown name, whether or not --device-tflops was given.
    describe(&a.model)?;
    if a.batch == 0 || a.batch > MAX_PROFILE_BATCH {
        return Err(format!(
            "--batch {}: give a per-worker batch from 1 to {MAX_PROFILE_BATCH}",
            a.batch
        ));
    }
    // The output is checked before the minutes of measuring it would hold.
    crate::output::check_writable(&a.out).map_err(|e| format!("--out: {e}"))?;
    if a.device_tflops.is_none() {
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
    }
    let p = match a.device_tflops {
        Some(tflops) => from_flops(
            &describe(&a.model)?,
            a.batch,
            DeviceSpec {
                tflops,
                efficiency: a.efficiency,
                mem_gbs: a.mem_gbs,
            },
        )?,
        None => measure(&a.model, a.batch, a.threads, a.steps, a.concurrent)?,
    };
    p.save(&a.out).map_err(|e| format!("--out: {e}"))?;
    println!("{}", describe_profile(&p));
    println!("profile written to {}", a.out.display());
    Ok(())
}

/// A short table of a profile's blocks.
pub fn describe_profile(p: &Profile) -> String {
    let mut s = format!(
        "{} at batch {} ({}): forward {:.3} ms, backward {:.3} ms, update {:.3} ms, {:.2} M params\n",
        p.model,
        p.batch,
        p.source,
        p.forward_ms(),
        p.backward_ms(),
        p.update_ms,
        p.grad_bytes() as f64 / 4e6
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
fn comm_list(s: &str) -> Result<Vec<CommChoice>, String> {
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

fn overlap_list(s: &str) -> Result<Vec<bool>, String> {
    match s.trim() {
        "on" => Ok(vec![true]),
        "off" => Ok(vec![false]),
        "both" => Ok(vec![true, false]),
        o => Err(format!("--overlap {o:?}: use on, off or both")),
    }
}

/// Runs `dptrain simulate`.
pub fn simulate(a: SimulateArgs) -> Result<(), String> {
    let p = Profile::load(&a.profile)?;
    let workers: Vec<usize> = a
        .workers
        .split(',')
        .map(|w| match w.trim().parse::<usize>() {
            Ok(n) if (1..=super::validate::MAX_WORKERS).contains(&n) => Ok(n),
            Ok(n) if n > 1 => Err(format!(
                "--workers {n}: the simulator takes up to {} workers",
                super::validate::MAX_WORKERS
            )),
            _ => Err(format!("bad worker count '{w}': use whole numbers from 1")),
        })
        .collect::<Result<_, _>>()?;
    let link = LinkModel {
        bandwidth_bytes_per_s: parse_bandwidth(&a.link_bandwidth)?,
        latency: parse_duration(&a.link_latency)?,
    };
    let comms = comm_list(&a.comm)?;
    let overlaps = overlap_list(&a.overlap)?;
    if !(link.bandwidth_bytes_per_s.is_finite() && link.bandwidth_bytes_per_s > 0.0) {
        return Err("--link-bandwidth must be a positive bandwidth".into());
    }
    let base = StepConfig {
        world: 1,
        link,
        comm: CommChoice::Fixed(CommMode::Ring),
        overlap: true,
        first_cap_bytes: a.first_bucket_kb.unwrap_or(0) * 1024,
        cap_bytes: a.bucket_kb.unwrap_or(0) * 1024,
    };
    // The trainer's rule: given caps, or what the link moves in one latency.
    let (first_cap, cap) = crate::parallel::bucket_caps(a.first_bucket_kb, a.bucket_kb, &link);
    let single = simulate_step(&p, &base)?.step_ms;
    println!("{}", describe_profile(&p).lines().next().unwrap_or(""));
    println!(
        "link {} / {} per worker port; weak scaling at batch {} per worker; 1 worker: {single:.3} ms/step",
        a.link_bandwidth, a.link_latency, p.batch
    );
    let mut cfgs = Vec::new();
    for &world in &workers {
        for &comm in &comms {
            for &overlap in &overlaps {
                let mut cfg = StepConfig {
                    world,
                    comm,
                    overlap,
                    ..base
                };
                cfg.first_cap_bytes = first_cap;
                cfg.cap_bytes = cap;
                cfgs.push(cfg);
            }
        }
    }
    // Every configuration is sized before any runs: none may take minutes or exhaust memory.
    for cfg in &cfgs {
        super::validate::simulation_size(&p, cfg, a.search_buckets)?;
    }
    println!("{}", header());
    for cfg in &cfgs {
        let (kb, r) = if a.search_buckets {
            search_buckets(&p, cfg)?
        } else {
            (cfg.cap_bytes.div_ceil(1024), simulate_step(&p, cfg)?)
        };
        println!("{}", row(cfg, kb, &r, single, p.batch));
    }
    Ok(())
}

/// The table header of [`row`].
pub fn header() -> String {
    format!(
        "{:>7} {:>10} {:>7} {:>9} {:>7} {:>10} {:>10} {:>10} {:>11} {:>6}",
        "workers",
        "comm",
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

/// One configuration's line: `single` is the 1-worker step time (weak-scaling efficiency).
pub fn row(
    cfg: &StepConfig,
    bucket_kb: usize,
    r: &StepResult,
    single: f64,
    batch: usize,
) -> String {
    let bucket = if bucket_kb == 0 {
        "block".to_string()
    } else if bucket_kb >= 1 << 30 {
        "all".to_string()
    } else {
        format!("{bucket_kb}K")
    };
    format!(
        "{:>7} {:>10} {:>7} {:>9} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>11.0} {:>6.1}",
        cfg.world,
        cfg.comm.to_string(),
        if cfg.overlap { "on" } else { "off" },
        bucket,
        r.bucket_bytes.len(),
        r.step_ms,
        r.comm_ms,
        r.exposed_ms,
        (cfg.world * batch) as f64 / (r.step_ms / 1e3),
        100.0 * single / r.step_ms
    )
}
