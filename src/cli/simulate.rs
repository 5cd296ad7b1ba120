//! `dptrain simulate`: arguments, the sweep and its table.

use super::profile::{describe_profile, make_profile, DeviceArgs};
use crate::bench::args::{on_off_list, worker_list};
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::config::KibOrAuto;
use crate::plan::{BucketFlags, CommChoice, HierarchyChoice};
use crate::sim::{
    search_buckets, search_schedule, Overheads, Profile, Simulator, StepConfig, StepResult,
    Stragglers, Topology, MEASURED, PRIORITY_TRIES,
};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `dptrain simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Profile JSON (from `dptrain profile`); or give --model and a device speed.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Model to profile from its graph (with --device-tflops or --device-images-per-s):
    /// a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
    #[arg(long, conflicts_with = "profile")]
    pub model: Option<String>,
    /// Per-worker batch, with --model [default: 32] (a profile's is its own).
    #[arg(long)]
    pub batch: Option<usize>,
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
    #[arg(allow_hyphen_values = true, long, default_value = "10Gbit")]
    pub link_bandwidth: String,
    /// NIC one-way latency (e.g. 5us).
    #[arg(allow_hyphen_values = true, long, default_value = "5us")]
    pub link_latency: String,
    /// Bandwidth of a device's port within its host (needed with --devices-per-host > 1).
    #[arg(allow_hyphen_values = true, long)]
    pub intra_bandwidth: Option<String>,
    /// Latency within a host, with --intra-bandwidth [default: 1us].
    #[arg(allow_hyphen_values = true, long)]
    pub intra_latency: Option<String>,
    /// Software cost of every message, added to its link's latency (e.g. 5us) [default: the
    /// measured one, `sim::defaults::MEASURED`: 14us].
    #[arg(allow_hyphen_values = true, long)]
    pub message_overhead: Option<String>,
    /// Fraction of the NIC's line rate (--link-bandwidth) a real stack delivers, from 0.01 to
    /// 1 [default: the measured one: 0.94].
    #[arg(long)]
    pub nic_efficiency: Option<f64>,
    /// Fixed cost of every step of more than one worker that communication cannot hide (e.g.
    /// 0.5ms) [default: the measured one: 0.5ms].
    #[arg(allow_hyphen_values = true, long)]
    pub step_overhead: Option<String>,
    /// Simulate the ideal network alone: no per-message or per-step overhead, the NIC at its
    /// line rate, every worker alike (flags given with it still apply).
    #[arg(long)]
    pub ideal: bool,
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
    /// Gradients on the wire, read as `train --compress` is: none, fp16, bf16 (half the bytes
    /// of every message; the conversions' compute is not simulated), auto (the cost model's
    /// choice per bucket) or powersgd:R (two rounds per bucket of the trainer's sizes, and the
    /// arithmetic around them at this machine's measured rates).
    #[arg(long, default_value = "none")]
    pub compress: String,
    /// When buckets are reduced, read as `train --schedule` is: overlap, or priority
    /// (partitions input-first, the next forward gated per layer; with overlap on only)
    /// [default: overlap].
    #[arg(long)]
    pub schedule: Option<String>,
    /// Partition size in KiB, read as `train --partition-kb` is [default: the trainer's for the
    /// schedule; auto: that default].
    #[arg(long)]
    pub partition_kb: Option<KibOrAuto>,
    /// Under --schedule priority, the KiB of partitions one decision of rank 0 commits every
    /// rank to, read as `train --credit-kb` is [default: one partition; auto: that default].
    #[arg(long)]
    pub credit_kb: Option<KibOrAuto>,
    /// Bucket cap in KiB (0: one block per bucket), read as `train --bucket-kb` is [default:
    /// with neither bucket flag given, the bytes the planning link moves in one latency, and
    /// under --schedule overlap at least the cap that pipelines the gradient best on the simulated
    /// cluster's collectives, as the trainer's; with only --first-bucket-kb given, 0; auto: that
    /// default].
    #[arg(long)]
    pub bucket_kb: Option<KibOrAuto>,
    /// First bucket's cap in KiB, read as `train --first-bucket-kb` is [default: with neither
    /// bucket flag given, as --bucket-kb's; with only --bucket-kb given, 0; auto: that default].
    #[arg(long)]
    pub first_bucket_kb: Option<KibOrAuto>,
    /// Try a range of bucket caps and report the best for each configuration.
    #[arg(long)]
    pub search_buckets: bool,
    /// Try `--schedule overlap` and `priority` with a range of partition sizes (the trainer's
    /// default and 16 KiB-16 MiB) and report the best for each configuration, with its schedule
    /// and its gain over overlap (`--schedule` and `--partition-kb` are then what is searched).
    #[arg(long)]
    pub search_schedule: bool,
    /// Coefficient of variation of each worker's compute per step (stragglers), e.g. 0.02, or
    /// `profile`: the spread measured with the profile [default: the measured one: 0.015].
    #[arg(long)]
    pub compute_spread: Option<String>,
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
            first_kb: KibOrAuto::resolved(self.first_bucket_kb),
            kb: KibOrAuto::resolved(self.bucket_kb),
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
/// hierarchical and overlap settings, each row with the measured overheads (or those given)
/// and beside it the ideal network's efficiency.
pub(super) fn run(a: SimulateArgs) -> Result<(), String> {
    let workers = worker_list("--workers", &a.workers)?;
    if a.steps == 0 {
        return Err("--steps 0: give at least 1 (the straggler draws averaged)".into());
    }
    if a.steps > MAX_STEPS {
        return Err(format!(
            "--steps {}: at most {MAX_STEPS} straggler draws are averaged (each configuration \
             simulates every one, and the mean of more moves by less than the spread's noise)",
            a.steps
        ));
    }
    let p = load_profile(&a)?;
    let line_rate = topology(&a)?;
    let o = overheads(&a, &p)?;
    let base = o.apply(line_rate);
    // Every worker count checked before anything is printed.
    let clusters = workers
        .iter()
        .map(|&n| base.with_workers(n))
        .collect::<Result<Vec<_>, _>>()?;
    let stragglers = Stragglers {
        spread: o.compute_spread,
        seed: a.seed,
        steps: a.steps,
    };
    let mut sim = Simulator::new();
    let schedule = schedule_of(&a)?;
    let single_cfg = StepConfig {
        compress: crate::plan::CompressChoice::parse(&a.compress)?,
        schedule,
        partition_kb: KibOrAuto::resolved(a.partition_kb),
        credit_kb: KibOrAuto::resolved(a.credit_kb),
        topology: Topology::flat(1, base.nic),
        comm: CommChoice::Fixed(CommMode::Ring),
        hierarchy: HierarchyChoice::Auto,
        overlap: true,
        buckets: a.bucket_flags(),
        planning_link: None,
        planning_intra: None,
        stragglers,
    };
    let single = sim.step(&p, &single_cfg)?.step_ms;
    // The ideal network's 1-worker step: every worker alike (one worker has no other cost).
    let ideal = if a.ideal {
        None
    } else {
        let c = StepConfig {
            stragglers: Stragglers::NONE,
            ..single_cfg
        };
        Some((Overheads::IDEAL.apply(line_rate), sim.step(&p, &c)?.step_ms))
    };
    let overlaps: Vec<bool> = on_off_list("overlap", &a.overlap)?
        .into_iter()
        .filter(|&on| on || schedule == crate::parallel::Schedule::Overlap)
        .collect();
    if overlaps.is_empty() {
        return Err(
            "--schedule priority with --overlap off: priority scheduling sends each \
                    bucket as backward fills it; use --overlap on or both"
                .into(),
        );
    }
    let sweep = Sweep {
        profile: &p,
        single_cfg,
        single,
        ideal,
        search: a.search_buckets,
        search_schedule: a.search_schedule,
        comms: comm_list(&a.comm)?,
        hiers: hierarchy_list(&a.hierarchical)?,
        // Priority scheduling needs overlap on.
        overlaps,
    };
    // Every flag read before the table starts: a refusal is the only output.
    crate::outln!("{}", describe_profile(&p).lines().next().unwrap_or(""));
    crate::outln!("{}", setting_line(&a, &o, p.batch, single));
    crate::outln!("{}", header(ideal.is_some()));
    let (mut rows, mut refused) = (0usize, 0usize);
    for cluster in clusters {
        let (r, f) = sweep.print_rows(&mut sim, cluster);
        rows += r;
        refused += f;
    }
    // Nothing simulated is a failure, not a table.
    if rows > 0 && refused == rows {
        return Err(format!(
            "every configuration ({rows}) was refused (each row says why: too large to \
             simulate, or a combination the trainer refuses)"
        ));
    }
    Ok(())
}

/// `--schedule` (overlap when not given), refused with the flags that would change nothing:
/// a `--schedule` or `--partition-kb` that `--search-schedule` would replace, a partition size
/// under overlap.
fn schedule_of(a: &SimulateArgs) -> Result<crate::parallel::Schedule, String> {
    // The search tries both schedules and its own partition sizes: a given one would be
    // silently replaced.
    // (`--partition-kb auto` is the default, which the search tries among the others.)
    let searched = super::given::first_given(&[
        ("--schedule", a.schedule.is_some()),
        (
            "--partition-kb",
            KibOrAuto::resolved(a.partition_kb).is_some(),
        ),
    ]);
    if let (true, Some(flag)) = (a.search_schedule, searched) {
        return Err(format!(
            "{flag} with --search-schedule: the search tries --schedule overlap and priority \
             with a range of --partition-kb and reports the best; leave {flag} out, or drop \
             --search-schedule to simulate the one given"
        ));
    }
    let schedule = crate::parallel::Schedule::parse(a.schedule.as_deref().unwrap_or("overlap"))?;
    // The trainer cuts buckets into partitions under overlap too, but the simulator models
    // them under priority only: a given value would change nothing it prints.
    if schedule == crate::parallel::Schedule::Overlap
        && KibOrAuto::resolved(a.partition_kb).is_some()
    {
        return Err(
            "--partition-kb: the simulator models partitions under --schedule priority only \
             (under overlap it sends each bucket whole); add --schedule priority or drop it"
                .into(),
        );
    }
    Ok(schedule)
}

/// The run's overheads: the measured defaults ([`MEASURED`]), or the ideal network's with
/// `--ideal`, each replaced by its flag where given.
fn overheads(a: &SimulateArgs, p: &Profile) -> Result<Overheads, String> {
    let mut o = if a.ideal {
        Overheads::IDEAL
    } else {
        MEASURED.overheads()
    };
    if let Some(m) = &a.message_overhead {
        o.message_overhead = parse_duration(m).map_err(|e| format!("--message-overhead: {e}"))?;
    }
    if let Some(e) = a.nic_efficiency {
        // Below 1% a "link" delivers nothing a cluster trains over (1e-300 printed steps of
        // 300 digits).
        if !(0.01..=1.0).contains(&e) {
            return Err(format!(
                "--nic-efficiency {}: give the fraction of the line rate delivered, from \
                 0.01 to 1",
                crate::terminal::number(e)
            ));
        }
        o.nic_efficiency = e;
    }
    if let Some(s) = &a.step_overhead {
        o.step_overhead = parse_duration(s).map_err(|e| format!("--step-overhead: {e}"))?;
    }
    if let Some(s) = &a.compute_spread {
        o.compute_spread = compute_spread(s, p)?;
    }
    o.validate()?;
    Ok(o)
}

/// The profile `--profile` names, or one from `--model`'s graph and the device speed.
fn load_profile(a: &SimulateArgs) -> Result<Profile, String> {
    match (&a.profile, &a.model) {
        (Some(path), _) => {
            // A profile's times and batch are its own: figures that would derive others are
            // refused, not ignored.
            let d = &a.device;
            let deriving = super::given::first_given(&[
                ("--batch", a.batch.is_some()),
                ("--device-tflops", d.device_tflops.is_some()),
                ("--device-images-per-s", d.device_images_per_s.is_some()),
                ("--efficiency", d.efficiency.is_some()),
                ("--mem-gbs", d.mem_gbs.is_some()),
            ]);
            if let Some(flag) = deriving {
                return Err(format!(
                    "{flag} applies with --model (a profile derived from the graph): a \
                     --profile's times and batch are its own; leave out one of the two"
                ));
            }
            Profile::load(path).map_err(|e| e.to_string())
        }
        (None, Some(model)) => make_profile(model, a.batch.unwrap_or(32), &a.device, || {
            Err(format!(
                "simulate --model {model} needs --device-tflops or --device-images-per-s (or \
                 measure a profile with `dptrain profile` and pass --profile)"
            ))
        }),
        (None, None) => Err("give --profile FILE, or --model with a device speed".into()),
    }
}

/// One host of the cluster (the sweep multiplies it) as the flags give it: its NIC at its line
/// rate and the link within it (needed with more than one device), before any overhead.
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
    if d == 1
        && (a.intra_latency.is_some()
            || a.intra_bandwidth
                .as_deref()
                .is_some_and(|b| b.trim() != "none"))
    {
        return Err(
            "--intra-bandwidth and --intra-latency price the link between the devices of a \
             host, and with --devices-per-host 1 there is none: give --devices-per-host, or \
             leave them out"
                .into(),
        );
    }
    // `none` is train's "no emulated port"; one device a host has no port to price.
    let intra_given = a
        .intra_bandwidth
        .as_deref()
        .filter(|b| d > 1 || b.trim() != "none");
    let intra = match intra_given {
        Some(b) if b.trim() == "none" => {
            return Err(format!(
                "--intra-bandwidth none: with --devices-per-host {d} the simulator prices the \
                 link between the devices of a host, so it needs its rate, e.g. 20GB/s for one \
                 NVLink, 12GB/s for PCIe 3 x16 (none, no emulated port, is train's)"
            ))
        }
        Some(b) => LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(b)
                .map_err(|e| format!("--intra-bandwidth: {e}"))?,
            latency: parse_duration(a.intra_latency.as_deref().unwrap_or("1us"))
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
    Ok(Topology {
        hosts: 1,
        devices_per_host: d,
        intra,
        nic,
        overhead: Duration::ZERO,
        step_overhead: Duration::ZERO,
    })
}

/// The largest `--compute-spread` simulated: a coefficient of variation of 1.
const MAX_SPREAD: f64 = 1.0;

/// `--compute-spread`: a number from 0 to [`MAX_SPREAD`], or the spread measured with the
/// profile.
fn compute_spread(v: &str, p: &Profile) -> Result<f64, String> {
    match v.trim() {
        "profile" => match p.compute_spread {
            None => Err(format!(
                "--compute-spread profile: {} has no measured spread (profiles from FLOPs or \
                 images/s have none); give a number",
                p.model
            )),
            // The same bound as a spread given: a profile measured on a busy machine can
            // record one past it.
            Some(x) if x > MAX_SPREAD => Err(format!(
                "--compute-spread profile: the profile's measured spread is {:.1}%, more than \
                 the {:.0}% simulated (the machine was busy while it was measured?): measure \
                 it again, or give a number",
                100.0 * x,
                100.0 * MAX_SPREAD
            )),
            Some(x) => Ok(x),
        },
        v => match v.parse::<f64>() {
            Ok(x) if (0.0..=MAX_SPREAD).contains(&x) => Ok(x),
            Ok(x) if x > MAX_SPREAD => Err(format!(
                "--compute-spread {v}: at most {MAX_SPREAD} (a coefficient of variation of \
                 100%; measured spreads are about 0.015): past it the log-normal's draws lie \
                 mostly far below their mean, and the steps averaged no longer estimate it"
            )),
            _ => Err(format!(
                "--compute-spread {v:?}: give a number from 0 to {MAX_SPREAD} (e.g. 0.02) or \
                 `profile`"
            )),
        },
    }
}

/// The lines under the profile's: the cluster, the overheads (measured defaults or given) and
/// the 1-worker step.
fn setting_line(a: &SimulateArgs, o: &Overheads, batch: usize, single: f64) -> String {
    let d = a.devices_per_host;
    let given = |flag: bool| {
        if flag {
            "given"
        } else if a.ideal {
            "ideal"
        } else {
            "measured default"
        }
    };
    format!(
        "{} device(s) per host; NIC {} / {}{}; weak scaling at batch {} per worker; 1 worker: \
         {single:.3} ms/step{}\noverheads: message {:.1} us ({}), NIC {:.0}% of the line rate \
         ({}), step {:.2} ms ({}), compute spread {:.1}% ({}){}; sources: src/sim/defaults.rs",
        d,
        a.link_bandwidth,
        a.link_latency,
        if d > 1 {
            format!(
                ", within a host {} / {}",
                a.intra_bandwidth.as_deref().unwrap_or(""),
                a.intra_latency.as_deref().unwrap_or("1us")
            )
        } else {
            String::new()
        },
        batch,
        match crate::plan::CompressChoice::parse(&a.compress) {
            Ok(crate::plan::CompressChoice::NONE) | Err(_) => String::new(),
            Ok(w) => format!("; gradients on the wire: {w}"),
        } + &match a.schedule.as_deref() {
            Some("priority") => format!(
                "; --schedule priority, partitions of {}",
                KibOrAuto::resolved(a.partition_kb)
                    .map_or("the trainer's default".into(), |k| format!("{k} KiB"))
            ),
            _ => String::new(),
        },
        o.message_overhead.as_secs_f64() * 1e6,
        given(a.message_overhead.is_some()),
        o.nic_efficiency * 100.0,
        given(a.nic_efficiency.is_some()),
        o.step_overhead.as_secs_f64() * 1e3,
        given(a.step_overhead.is_some()),
        100.0 * o.compute_spread,
        given(a.compute_spread.is_some()),
        if o.compute_spread > 0.0 {
            format!(" (mean of {} seeded steps)", a.steps)
        } else {
            String::new()
        },
    )
}

/// What every worker count of the sweep runs: each mode x hierarchical x overlap setting.
struct Sweep<'a> {
    profile: &'a Profile,
    /// The 1-worker configuration the others vary (buckets, stragglers).
    single_cfg: StepConfig,
    /// Its step time, ms.
    single: f64,
    /// The ideal network's host (the sweep multiplies it) and 1-worker step, ms; `None` with
    /// `--ideal`.
    ideal: Option<(Topology, f64)>,
    /// Search the bucket caps (`--search-buckets`)?
    search: bool,
    /// Search the schedule and its partitions (`--search-schedule`)?
    search_schedule: bool,
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
                    rows += 1;
                    let found = self.run_one(sim, &cfg).and_then(|(c, kb, r, note)| {
                        Ok((self.ideal_eff(sim, &c, kb)?, c, kb, r, note))
                    });
                    match found {
                        Ok((ideal, c, kb, r, note)) => {
                            let eff = Efficiency {
                                single: self.single,
                                ideal,
                            };
                            let line = row(&c, kb, &r, eff, self.profile.batch);
                            crate::outln!("{line}{note}")
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

impl Sweep<'_> {
    /// One configuration, with its buckets or schedule searched as asked: the configuration
    /// that ran, its bucket cap (searched or given), its step, and what the row adds (the
    /// schedule found).
    fn run_one(
        &self,
        sim: &mut Simulator,
        cfg: &StepConfig,
    ) -> Result<(StepConfig, Option<usize>, StepResult, String), String> {
        if self.search_schedule {
            let found = search_schedule(sim, self.profile, cfg, self.search)?;
            let kb = found
                .bucket_kb
                .or_else(|| found.cfg.buckets.caps_kb().map(|(_, b)| b));
            let note = match found.cfg.schedule {
                crate::parallel::Schedule::Priority => format!(
                    "  priority, partitions of {}: {:.2}x overlap's {:.3} ms",
                    found
                        .cfg
                        .partition_kb
                        .map_or("the default".into(), |k| format!("{k} KiB")),
                    found.overlap_ms / found.result.step_ms,
                    found.overlap_ms
                ),
                crate::parallel::Schedule::Overlap => "  overlap".to_string(),
            };
            let note = match found.priority_left_out {
                0 => note,
                n => format!(
                    "{note} ({n} of {PRIORITY_TRIES} priority tries refused or past the \
                     simulator's limits)"
                ),
            };
            return Ok((found.cfg, kb, found.result, note));
        }
        if self.search {
            let (kb, r) = search_buckets(sim, self.profile, cfg)?;
            return Ok((*cfg, Some(kb), r, String::new()));
        }
        let r = sim.step(self.profile, cfg)?;
        Ok((
            *cfg,
            cfg.buckets.caps_kb().map(|(_, b)| b),
            r,
            String::new(),
        ))
    }

    /// The ideal network's efficiency for `cfg` at the bucket cap `kb` that `cfg` ran with
    /// (searched or given), %; `None` with `--ideal`.
    fn ideal_eff(
        &self,
        sim: &mut Simulator,
        cfg: &StepConfig,
        kb: Option<usize>,
    ) -> Result<Option<f64>, String> {
        let Some((host, single)) = self.ideal else {
            return Ok(None);
        };
        let buckets = match kb {
            Some(kb) if self.search => BucketFlags {
                first_kb: Some(cfg.buckets.first_kb.unwrap_or(kb)),
                kb: Some(kb),
            },
            _ => cfg.buckets,
        };
        let c = StepConfig {
            topology: host.with_workers(cfg.topology.workers())?,
            stragglers: Stragglers::NONE,
            buckets,
            ..*cfg
        };
        Ok(Some(100.0 * single / sim.step(self.profile, &c)?.step_ms))
    }
}

/// A row's efficiencies: its own 1-worker step, ms, and the ideal network's efficiency, %.
#[derive(Debug, Clone, Copy)]
struct Efficiency {
    single: f64,
    ideal: Option<f64>,
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

/// The table header of [`row`] (with the ideal network's column or without).
fn header(ideal: bool) -> String {
    let h = format!(
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
    );
    if ideal {
        h + &format!(" {:>7}", "ideal%")
    } else {
        h
    }
}

/// One configuration's line: `eff.single` is the 1-worker step time (weak-scaling
/// efficiency), `eff.ideal` the ideal network's efficiency beside it; `bucket_kb` the cap
/// searched or given (`None`: the trainer's default).
fn row(
    cfg: &StepConfig,
    bucket_kb: Option<usize>,
    r: &StepResult,
    eff: Efficiency,
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
    let line = format!(
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
        100.0 * eff.single / r.step_ms
    );
    match eff.ideal {
        Some(i) => line + &format!(" {i:>7.1}"),
        None => line,
    }
}
