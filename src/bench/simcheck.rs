//! `dptrain bench sim-check`: the simulator against measured runs and a published one.
//!
//! * `--against emulated` (the default): in-process runs over the emulated link. For each
//!   model, a profile measured here (with as many concurrent replicas as workers, so compute
//!   sees the same contention as in the run), then for each bandwidth and overlap on/off a
//!   short emulated training run ([`super::overlap::run_case`]) and the simulated step beside
//!   it.
//! * `--against cluster`: the namespace cluster of `scripts/cluster.sh` (root, and a binary
//!   built with `--features mpi`): per bandwidth and host count a cluster is brought up, its
//!   links are measured with all-reduce microbenchmarks across it ([`fit_link_to_mix`]: the
//!   runs' own buckets), and per workers per host, model and overlap a short `mpirun` training
//!   run is set beside the simulated step of that topology ([`run_cluster`]). By default each
//!   worker has an emulated device (`train --emulate-device`, a profile measured alone and
//!   scaled by [`device_scale`]): the hosts share this machine's cores, which no cluster does,
//!   and the check is of the simulator's network and overlap model; `--devices shared` runs
//!   the real compute on the shared cores instead.
//! * `--against published`: Goyal et al. 2017, ResNet-50 on 256 P100s, every input stated
//!   with its source and the simulator's measured defaults ([`crate::sim::defaults`]) added,
//!   beside the ideal network's prediction ([`run_published`]).
//!
//! The emulated link adds software costs the specified link does not have: handing a message
//! between threads and waking the receiver (tens of µs per message here). A real network's
//! latency includes such costs too, so the simulator is given the link as the emulation
//! *delivers* it: before the runs, a ring all-reduce of a few bytes is timed on the emulated
//! link, and the per-message excess over the link model is added to the simulated latency (the
//! header prints it). Without it, steps with many small buckets were under-predicted.

use super::allreduce::bench_allreduce;
use super::median;
use super::overlap::{run_case, GridSpec, OverlapCase};
use super::ScratchDir;
use crate::comm::{parse_bandwidth, parse_duration, predicted_time, CommMode, LinkModel};
use crate::measure::MeasureFlags;
use crate::parallel::Schedule;
use crate::plan::CommChoice;
use crate::sim::{
    measure, MeasureSpec, Overheads, Profile, Simulator, StepConfig, Stragglers, Topology, MEASURED,
};
use crate::train::metrics::StepTimes;

/// Arguments of `dptrain bench sim-check`.
#[derive(Debug, clap::Args)]
pub struct SimCheckArgs {
    /// What to check against: emulated (in-process runs over the emulated link), cluster (the
    /// namespace cluster: root and --features mpi), published (Goyal et al. 2017), or all.
    #[arg(long, default_value = "emulated")]
    pub against: String,
    /// Models, comma-separated: built-in names (`dptrain model list`) or model files (docs/MODEL_FILES.md).
    #[arg(long, default_value = "vgg-small,lenet5")]
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
    /// Emulated bandwidths, comma-separated.
    #[arg(allow_hyphen_values = true, long, default_value = "100Mbit,20Mbit")]
    pub link_bandwidth: String,
    /// Emulated latency.
    #[arg(allow_hyphen_values = true, long, default_value = "50us")]
    pub link_latency: String,
    /// Mode (tree, ring, hd, redundant, auto).
    #[arg(long, default_value = "ring")]
    pub comm: String,
    /// Timed steps per run (and per profile).
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
    /// Cluster: host counts, comma-separated.
    #[arg(long, default_value = "2,4")]
    pub hosts: String,
    /// Cluster: workers per host, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub workers_per_host: String,
    /// Cluster: every host's link (tbf rate), comma-separated.
    #[arg(allow_hyphen_values = true, long, default_value = "100mbit,1gbit")]
    pub cluster_bandwidth: String,
    /// Cluster: batch per worker (the global batch is this times the workers): one for every
    /// model, or per model (`vgg-small=32,lenet5=128`).
    #[arg(long, default_value = "vgg-small=32,lenet5=128")]
    pub worker_batch: String,
    /// Cluster: overlap on, off or both.
    #[arg(long, default_value = "both")]
    pub overlap: String,
    /// Cluster: `train --schedule` settings, comma-separated (overlap, priority; priority runs
    /// with overlap on only).
    #[arg(long, default_value = "overlap")]
    pub schedule: String,
    /// Cluster: `train --partition-kb` for the priority runs (and the simulator's) [default:
    /// the trainer's].
    #[arg(long)]
    pub partition_kb: Option<usize>,
    /// Cluster: `train --hierarchical` settings, comma-separated (auto, 2d, leader, off).
    #[arg(long, default_value = "auto")]
    pub hierarchical: String,
    /// Cluster, several workers per host: emulate each worker's port within its host
    /// (`train --intra-bandwidth`, and the simulator's within-host link) at this fraction of
    /// the host's link rate, as devices on a port about as fast as the NIC (0.96: a P100's
    /// 12 GB/s PCIe 3 x16 beside a 100 Gbit/s NIC, the example of issue 22) [default: no
    /// emulation: the workers are threads that share memory].
    #[arg(long)]
    pub intra_ratio: Option<f64>,
    /// Cluster: each worker's compute: emulated (a device of its own, held to a profile
    /// measured alone, see `testbed::device`) or shared (real compute on this machine's shared
    /// cores, profiled with as many replicas at once).
    #[arg(long, default_value = "emulated")]
    pub devices: String,
    /// Cluster, emulated devices: each device's time is the profile's times this many times
    /// the workers per core (at least 1 worker per core), so that the real compute and the
    /// communication threads fit in it, and this machine's scheduling delays (about 10 ms a
    /// step at 8 workers on 2 cores, see docs/bench/sim-check.md) are small beside a step.
    #[arg(long, default_value_t = 6.0)]
    pub device_headroom: f64,
    /// Cluster: passes over every case (each case's figures are its median pass).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Cluster: the script that makes the cluster.
    #[arg(long, default_value = "scripts/cluster.sh")]
    pub cluster_script: std::path::PathBuf,
    /// Cluster: its name (namespaces NAME-sw, NAME-h1, ...).
    #[arg(long, default_value = "dpsimchk")]
    pub cluster_name: String,
}

/// Runs the comparisons `--against` names.
pub fn run(a: SimCheckArgs) -> Result<(), String> {
    // Lists refused before anything is measured: no empty or repeated entry.
    super::args::entries("--model", &a.model)?;
    super::args::entries("--link-bandwidth", &a.link_bandwidth)?;
    super::args::check_emulated_links(&a.model, &a.link_bandwidth, &a.link_latency, false)?;
    super::args::entries("--cluster-bandwidth", &a.cluster_bandwidth)?;
    for bw in a.cluster_bandwidth.split(',').map(str::trim) {
        parse_bandwidth(&trainer_rate(bw)).map_err(|e| format!("--cluster-bandwidth {bw}: {e}"))?;
    }
    super::args::entries("--worker-batch", &a.worker_batch)?;
    super::args::list("--schedule", &a.schedule, Schedule::parse)?;
    super::args::check_timed_counts(&[("--steps", a.steps), ("--rounds", a.rounds)])?;
    if a.device_headroom < 1.0 {
        return Err(format!(
            "--device-headroom must be at least 1 (a device no slower than the real compute it \
             holds), not {}",
            crate::terminal::number(a.device_headroom)
        ));
    }
    if let Some(r) = a.intra_ratio.filter(|r| !(1e-6..=1e4).contains(r)) {
        return Err(format!(
            "--intra-ratio {}: give the within-host port's rate as a fraction of the host's \
             link rate from 1e-6 to 10000",
            crate::terminal::number(r)
        ));
    }
    // The port a ratio makes of each link must be one `train --intra-bandwidth` takes.
    if let Some(r) = a.intra_ratio {
        use crate::comm::transport::{MAX_BANDWIDTH_BYTES_PER_S, MIN_BANDWIDTH_BYTES_PER_S};
        for bw in a.cluster_bandwidth.split(',').map(str::trim) {
            let port = r * parse_bandwidth(&trainer_rate(bw))?;
            if !(MIN_BANDWIDTH_BYTES_PER_S..=MAX_BANDWIDTH_BYTES_PER_S).contains(&port) {
                return Err(format!(
                    "--intra-ratio {r} of --cluster-bandwidth {bw} is a port of {port:.3e} \
                     bytes/s: a link is 1 bit/s to 1 PB/s (1e15 bytes/s)"
                ));
            }
        }
    }
    if a.intra_ratio.is_some() && !matches!(a.against.as_str(), "cluster" | "all") {
        return Err(format!(
            "--intra-ratio sets the port within a host of the namespace cluster: it needs \
             --against cluster (or all), not {}",
            a.against
        ));
    }
    match a.against.as_str() {
        "emulated" => run_emulated(&a),
        "cluster" => run_cluster(&a),
        "published" => run_published().map(|_| ()),
        "all" => {
            run_emulated(&a)?;
            crate::outln!();
            run_cluster(&a)?;
            crate::outln!();
            run_published().map(|_| ())
        }
        o => Err(format!(
            "--against {o:?}: use emulated, cluster, published or all"
        )),
    }
}

/// One row of the in-process comparison: a model at a bandwidth, overlap on or off.
#[derive(Debug, Clone)]
pub struct EmulatedRow {
    /// Model.
    pub model: String,
    /// `--link-bandwidth` entry.
    pub bandwidth: String,
    /// Overlap on?
    pub overlap: bool,
    /// The emulated run's mean step.
    pub measured: StepTimes,
    /// Simulated step from the profile, ms.
    pub sim_ms: f64,
    /// Its exposed communication, ms.
    pub sim_exposed_ms: f64,
    /// Its compute (forward + backward + update), ms.
    pub sim_compute_ms: f64,
    /// Simulated step with the run's own compute times, ms.
    pub cal_ms: f64,
}

/// The rows of one model at one bandwidth, with the emulation's measured per-message cost.
#[derive(Debug, Clone)]
pub struct EmulatedGroup {
    /// Model.
    pub model: String,
    /// `--link-bandwidth` entry.
    pub bandwidth: String,
    /// Per-message overhead of the emulation, added to the simulated latency.
    pub overhead: std::time::Duration,
    /// Overlap on, then off.
    pub rows: Vec<EmulatedRow>,
}

/// The in-process comparison: every model at every bandwidth.
#[derive(Debug, Clone)]
pub struct EmulatedCheck {
    /// The line saying what was run.
    pub title: String,
    /// By model, then bandwidth.
    pub groups: Vec<EmulatedGroup>,
}

impl EmulatedRow {
    /// Simulated against measured step, %.
    pub fn error_pct(&self) -> f64 {
        100.0 * (self.sim_ms / self.measured.step_ms - 1.0)
    }

    /// Calibrated (the run's compute) against measured step, %.
    pub fn calibrated_error_pct(&self) -> f64 {
        100.0 * (self.cal_ms / self.measured.step_ms - 1.0)
    }

    /// The row on the terminal, and its `RESULT` line.
    pub fn terminal(&self) -> String {
        let m = &self.measured;
        format!(
            "{:>10} {:>10} {:>7} {:>9.1} {:>9.1} {:>+7.1} {:>9.1} {:>+7.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n\
             RESULT dptrain simcheck model={} bw={} overlap={} measured_ms={:.2} simulated_ms={:.2} calibrated_ms={:.2}",
            self.model,
            self.bandwidth,
            if self.overlap { "on" } else { "off" },
            m.step_ms,
            self.sim_ms,
            self.error_pct(),
            self.cal_ms,
            self.calibrated_error_pct(),
            m.exposed_comm_ms,
            self.sim_exposed_ms,
            m.data_ms + m.forward_ms + m.backward_ms + m.update_ms,
            self.sim_compute_ms,
            self.model,
            self.bandwidth,
            self.overlap,
            m.step_ms,
            self.sim_ms,
            self.cal_ms
        )
    }
}

impl EmulatedGroup {
    /// The line above the group's rows: the emulation's measured per-message cost.
    pub fn terminal_head(&self) -> String {
        format!(
            "{} at {}: measured per-message overhead of the emulation {:.0} us (added to the simulated latency)",
            self.model,
            self.bandwidth,
            self.overhead.as_secs_f64() * 1e6
        )
    }
}

impl EmulatedCheck {
    /// The column header.
    pub fn terminal_header() -> String {
        format!(
            "{:>10} {:>10} {:>7} {:>9} {:>9} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
            "model",
            "bandwidth",
            "overlap",
            "meas ms",
            "sim ms",
            "err%",
            "cal ms",
            "err%",
            "meas exp",
            "sim exp",
            "meas cpt",
            "sim cpt"
        )
    }

    /// The last line: the largest errors.
    pub fn terminal_footer(&self) -> String {
        let rows = || self.groups.iter().flat_map(|g| &g.rows);
        let worst = rows().map(|r| r.error_pct().abs()).fold(0.0, f64::max);
        let worst_cal = rows()
            .map(|r| r.calibrated_error_pct().abs())
            .fold(0.0, f64::max);
        format!(
            "largest |error|: {worst:.1}% from the profile, {worst_cal:.1}% with the run's compute \
             (target: within 10%); exp = exposed comm, cpt = data + forward + backward + update"
        )
    }

    /// The whole comparison on the terminal, as `bench sim-check` prints it.
    pub fn terminal(&self) -> String {
        let mut s = format!("{}\n{}\n", self.title, Self::terminal_header());
        for g in &self.groups {
            s += &g.terminal_head();
            s += "\n";
            for r in &g.rows {
                s += &r.terminal();
                s += "\n";
            }
        }
        s + &self.terminal_footer()
    }

    /// The comparison for a markdown page: the terminal table without its `RESULT` lines, as
    /// preformatted text (its columns and per-group lines read best as printed).
    pub fn markdown(&self) -> String {
        let table: Vec<String> = self
            .terminal()
            .lines()
            .filter(|l| !l.starts_with("RESULT "))
            .map(str::to_string)
            .collect();
        format!("```text\n{}\n```\n", table.join("\n"))
    }
}

/// The profile `--against emulated` simulates `model` from: as many replicas at once as the
/// runs have workers, each on the compute threads a run's worker runs
/// ([`crate::limits::threads_per_worker`], `--threads` capped at the cores).
fn emulated_profile_spec<'m>(a: &SimCheckArgs, model: &'m str) -> MeasureSpec<'m> {
    let threads = crate::limits::threads_per_worker(Some(a.threads), a.workers).0;
    MeasureSpec {
        concurrent: a.workers,
        flags: MeasureFlags::workers("--workers"),
        ..MeasureSpec::new(model, a.batch / a.workers, threads, a.steps)
    }
}

/// The profile a `--against cluster` row of `workers` in all simulates `model` from, at
/// `batch` per worker: `workers` replicas at once on this machine's cores (1: a device's
/// profile, measured alone), each on the compute threads a run's worker runs
/// ([`crate::limits::threads_per_worker`], `--threads` capped at the cores).
fn cluster_profile_spec<'m>(
    a: &SimCheckArgs,
    model: &'m str,
    batch: usize,
    workers: usize,
) -> MeasureSpec<'m> {
    let threads = crate::limits::threads_per_worker(Some(a.threads), workers).0;
    MeasureSpec {
        concurrent: workers,
        flags: MeasureFlags {
            concurrent: (workers > 1).then_some("--hosts x --workers-per-host"),
            ..MeasureFlags::workers("")
        },
        ..MeasureSpec::new(model, batch, threads, a.steps.min(20))
    }
}

/// Runs `--against emulated`, printing as it goes.
pub fn run_emulated(a: &SimCheckArgs) -> Result<(), String> {
    let check = measure_emulated(a, &mut |line| crate::outln!("{line}"))?;
    crate::outln!("{}", check.terminal_footer());
    Ok(())
}

/// The in-process comparison: one row per (model, bandwidth, overlap); each line of the
/// terminal table goes to `on_line` as it is measured (all but the footer).
pub fn measure_emulated(
    a: &SimCheckArgs,
    on_line: &mut dyn FnMut(&str),
) -> Result<EmulatedCheck, String> {
    if a.workers < 2 {
        return Err("--workers must be at least 2".into());
    }
    crate::plan::per_worker_batch(a.batch, a.workers, 1).map_err(|e| e.to_string())?;
    crate::comm::transport::check_in_process_workers(a.workers)?;
    let comm = CommChoice::parse(&a.comm)?;
    let models: Vec<&str> = a.model.split(',').map(str::trim).collect();
    // Every model's profile is checked before the first is measured.
    for model in &models {
        emulated_profile_spec(a, model).check()?;
    }
    let scratch = ScratchDir::new("simcheck");
    let mut check = EmulatedCheck {
        title: format!(
            "{} workers x {} thread(s), global batch {}, {}, latency {}; measured = mean emulated step, simulated from a profile measured with {} concurrent replicas",
            a.workers, a.threads, a.batch, a.comm, a.link_latency, a.workers
        ),
        groups: Vec::new(),
    };
    on_line(&check.title);
    on_line(&EmulatedCheck::terminal_header());
    let mut simulator = Simulator::new();
    for model in models {
        let profile = measure(&emulated_profile_spec(a, model))?;
        for bw in a.link_bandwidth.split(',').map(str::trim) {
            let group = EmulatedGroup {
                model: model.to_string(),
                bandwidth: bw.to_string(),
                overhead: std::time::Duration::ZERO,
                rows: Vec::new(),
            };
            let group = emulated_group(
                a,
                group,
                comm,
                &profile,
                &mut simulator,
                scratch.path(),
                on_line,
            )?;
            check.groups.push(group);
        }
    }
    Ok(check)
}

/// One model at one bandwidth: the emulation's per-message cost, then overlap on and off, each
/// an emulated run beside the simulated step.
fn emulated_group(
    a: &SimCheckArgs,
    mut group: EmulatedGroup,
    comm: CommChoice,
    profile: &Profile,
    simulator: &mut Simulator,
    dir: &std::path::Path,
    on_line: &mut dyn FnMut(&str),
) -> Result<EmulatedGroup, String> {
    let given = LinkModel {
        bandwidth_bytes_per_s: parse_bandwidth(&group.bandwidth)?,
        latency: parse_duration(&a.link_latency)?,
    };
    group.overhead = message_overhead(a.workers, &given)?;
    on_line(&group.terminal_head());
    let link = LinkModel {
        latency: given.latency + group.overhead,
        ..given
    };
    let spec = GridSpec {
        model: group.model.clone(),
        workers: a.workers,
        batch: a.batch,
        threads: a.threads,
        steps: a.steps,
        bucket_kb: None,
        conv_algo: crate::backend::ConvAlgo::default(),
    };
    for overlap in [true, false] {
        let case = OverlapCase {
            comm: a.comm.clone(),
            overlap,
            schedule: crate::parallel::Schedule::Overlap,
            bandwidth: Some(group.bandwidth.clone()),
            latency: Some(a.link_latency.clone()),
        };
        let measured = run_case(&spec, &case, dir)?.breakdown.mean;
        let step = StepConfig {
            compress: crate::plan::CompressChoice::NONE,
            schedule: crate::parallel::Schedule::Overlap,
            partition_kb: None,
            credit_kb: None,
            topology: Topology::flat(a.workers, link),
            comm,
            hierarchy: crate::plan::HierarchyChoice::Auto,
            overlap,
            // The trainer's default caps, planned for the link the run was given.
            buckets: crate::plan::BucketFlags::default(),
            planning_link: Some(given),
            planning_intra: None,
            stragglers: Stragglers::NONE,
        };
        let sim = simulator.step(profile, &step)?;
        // The run's own compute totals with the profile's per-block shape: isolates the
        // communication and overlap model from compute-speed drift on a shared machine.
        let cal = simulator.step(
            &profile.rescaled(
                measured.data_ms + measured.forward_ms,
                measured.backward_ms,
                measured.update_ms,
            ),
            &step,
        )?;
        let row = EmulatedRow {
            model: group.model.clone(),
            bandwidth: group.bandwidth.clone(),
            overlap,
            measured,
            sim_ms: sim.step_ms,
            sim_exposed_ms: sim.exposed_ms,
            sim_compute_ms: sim.forward_ms + sim.backward_ms + sim.update_ms,
            cal_ms: cal.step_ms,
        };
        on_line(&row.terminal());
        group.rows.push(row);
    }
    Ok(group)
}

/// Timed runs of [`message_overhead`]'s probe.
const PROBE_RUNS: usize = 40;

/// The emulated link's software cost per message: a few-byte ring all-reduce (2(N-1)
/// dependent messages, each ~`latency` long) timed on the emulated link, minus the link model's
/// prediction, per message. Never negative.
fn message_overhead(workers: usize, link: &LinkModel) -> Result<std::time::Duration, String> {
    let bytes = 4 * workers;
    let model = predicted_time(CommMode::Ring, workers, bytes, link);
    // 40 timed runs after 2 warm-ups: on a slow link (each message waits its latency and
    // crawls at the bandwidth) that is long, and said before it starts rather than silent.
    let probe_s = model.as_secs_f64() * (PROBE_RUNS + 2) as f64;
    if probe_s > 10.0 {
        crate::terminal::print_note(&format!(
            "measuring the emulated link's cost per message ({PROBE_RUNS} ring all-reduces of \
             {bytes} bytes at {} bytes/s, latency {:?}): about {probe_s:.0} s",
            link.bandwidth_bytes_per_s, link.latency
        ));
    }
    let measured = bench_allreduce(workers, bytes, CommMode::Ring, Some(*link), PROBE_RUNS)?.time;
    let messages = 2 * (workers - 1) as u32;
    Ok(measured.saturating_sub(model) / messages)
}

/// Fits a link to two timings of `mode` over `world` ranks with the cost model's formula
/// (`time = latency_terms x α + serialized_bytes x β`, [`crate::comm::cost_terms`]): two
/// equations, solved for α and β. The link as the transport delivers it for this pattern and
/// these sizes of messages: software costs, TCP and MPI included.
pub fn fit_link(
    mode: CommMode,
    world: usize,
    small: (usize, std::time::Duration),
    large: (usize, std::time::Duration),
) -> Result<LinkModel, String> {
    fit_link_to_mix(mode, world, small, &[large])
}

/// [`fit_link`] with the second equation the sum over a mix of sizes (the buckets of a step,
/// each timed alone): the link that gives the mix's total time, which is what a step that
/// reduces those buckets one after another sees, whatever the transport does differently at
/// different sizes (here MPI's rendezvous protocol above 64 KB).
pub fn fit_link_to_mix(
    mode: CommMode,
    world: usize,
    (small_bytes, small): (usize, std::time::Duration),
    mix: &[(usize, std::time::Duration)],
) -> Result<LinkModel, String> {
    let ts = crate::comm::cost_terms(mode, world, small_bytes);
    let (mut l_terms, mut l_bytes, mut l_time) = (0.0, 0.0, 0.0);
    for &(bytes, t) in mix {
        let tl = crate::comm::cost_terms(mode, world, bytes);
        l_terms += tl.latency_terms;
        l_bytes += tl.serialized_bytes;
        l_time += t.as_secs_f64();
    }
    let sizes = || {
        mix.iter()
            .map(|(b, _)| b.to_string())
            .collect::<Vec<_>>()
            .join("+")
    };
    let det = ts.latency_terms * l_bytes - l_terms * ts.serialized_bytes;
    if ts.latency_terms == 0.0 || det <= 0.0 {
        return Err(format!(
            "{mode} over {world} ranks at {small_bytes} and {} bytes: two sizes with \
             different shares of latency and bytes are needed",
            sizes()
        ));
    }
    let s = small.as_secs_f64();
    let alpha = (s * l_bytes - l_time * ts.serialized_bytes) / det;
    let beta = (ts.latency_terms * l_time - l_terms * s) / det;
    if beta <= 0.0 || alpha < 0.0 {
        return Err(format!(
            "{mode} over {world}: {} bytes took {l_time:.6} s and {small_bytes} bytes \
             {small:?}, which no link explains (the large size is too small or the timings \
             too noisy): time a larger size",
            sizes()
        ));
    }
    Ok(LinkModel {
        bandwidth_bytes_per_s: 1.0 / beta,
        latency: std::time::Duration::from_secs_f64(alpha),
    })
}

/// The sizes the links are timed at: one message's latency, and (within a host) enough bytes
/// that the rate dominates.
const FIT_SIZES: (usize, usize) = (4, 4 << 20);

/// A namespace cluster made by `scripts/cluster.sh`, taken down when dropped (also when the
/// check fails half-way).
struct Cluster {
    script: std::path::PathBuf,
    name: String,
}

impl Cluster {
    fn up(
        script: &std::path::Path,
        name: &str,
        hosts: usize,
        bandwidth: &str,
    ) -> Result<Self, String> {
        if !script.is_file() {
            return Err(format!(
                "{}: no such script; run from the repository root or give --cluster-script",
                script.display()
            ));
        }
        let c = Self {
            script: script.to_path_buf(),
            name: name.to_string(),
        };
        let out = std::process::Command::new(&c.script)
            .args([
                "up",
                &hosts.to_string(),
                "--bandwidth",
                bandwidth,
                "--name",
                name,
            ])
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} up {hosts} --bandwidth {bandwidth} failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(c)
    }

    /// The mean ping round trip `up` measured, ms.
    fn rtt_ms(&self) -> Result<f64, String> {
        let dir = std::env::var("DPTRAIN_CLUSTER_DIR").unwrap_or("/tmp/dptrain-cluster".into());
        let path = std::path::Path::new(&dir)
            .join(&self.name)
            .join("cluster.env");
        let text = crate::input::read_text(&path, crate::input::FileKind::Table)
            .map_err(|e| e.to_string())?;
        let line = text
            .lines()
            .find(|l| l.starts_with("RTT="))
            .ok_or_else(|| format!("{}: no RTT line", path.display()))?;
        let v: Vec<f64> = line
            .split(|c: char| c.is_whitespace() || c == ',' || c == '\'')
            .filter_map(|w| w.parse::<f64>().ok())
            .collect();
        if v.is_empty() {
            return Err(format!("{}: no round trips in {line:?}", path.display()));
        }
        Ok(v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Runs `args` under `mpirun -np np` across the hosts; returns stdout.
    fn mpirun(&self, np: usize, args: &[String]) -> Result<String, String> {
        let out = std::process::Command::new(&self.script)
            .args(["mpirun", "--name", &self.name, "-np", &np.to_string()])
            .args(args)
            .output()
            .map_err(|e| format!("running {} mpirun: {e}", self.script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "mpirun -np {np} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.script)
            .args(["down", "--name", &self.name])
            .output();
    }
}

/// The median time of `mode` at `bytes` in `bench allreduce --transport mpi`'s table.
fn parse_allreduce(out: &str, mode: &str, bytes: usize) -> Result<std::time::Duration, String> {
    out.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 3 && w[0] == bytes.to_string() && w[1] == mode)
                .then(|| w[2].parse::<f64>().ok())
                .flatten()
        })
        .map(|us| std::time::Duration::from_secs_f64(us / 1e6))
        .ok_or_else(|| format!("no {mode} row at {bytes} bytes in:\n{out}"))
}

/// One run's step, phase by phase: medians over its timed steps (worker 0 of rank 0), or
/// medians of such medians over passes.
#[derive(Debug, Clone, Copy)]
struct Phases {
    step: f64,
    data: f64,
    forward: f64,
    backward: f64,
    update: f64,
    exposed: f64,
}

impl Phases {
    /// From a run's `metrics.jsonl` (written with `--log-every 1`), leaving out the first 5
    /// steps as the summary does. Medians, not means: on a machine shared with other jobs a
    /// few steps stall for tens of ms.
    fn median_of_steps(path: &std::path::Path) -> Result<Self, String> {
        let text = crate::input::read_text(path, crate::input::FileKind::Metrics)
            .map_err(|e| e.to_string())?;
        let steps: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["kind"] == "step" && v["step"].as_u64().is_some_and(|s| s >= 5))
            .collect();
        if steps.is_empty() {
            return Err(format!("{}: no timed steps", path.display()));
        }
        let med = |k: &str| {
            median(
                &mut steps
                    .iter()
                    .map(|v| v["times"][k].as_f64().unwrap_or(f64::NAN))
                    .collect::<Vec<_>>(),
            )
        };
        Ok(Self {
            step: med("step_ms"),
            data: med("data_ms"),
            forward: med("forward_ms"),
            backward: med("backward_ms"),
            update: med("update_ms"),
            exposed: med("exposed_comm_ms"),
        })
    }

    /// The median pass of each phase.
    fn median_of(runs: &[Phases]) -> Self {
        let med = |f: fn(&Phases) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
        Self {
            step: med(|p| p.step),
            data: med(|p| p.data),
            forward: med(|p| p.forward),
            backward: med(|p| p.backward),
            update: med(|p| p.update),
            exposed: med(|p| p.exposed),
        }
    }
}

/// The namespace-cluster comparison: one row per (bandwidth, hosts, workers per host, model,
/// overlap).
pub fn run_cluster(a: &SimCheckArgs) -> Result<(), String> {
    if !cfg!(feature = "mpi") {
        return Err(
            "bench sim-check --against cluster runs the trainer over MPI: build with `cargo \
             build --release --features mpi`"
                .into(),
        );
    }
    let scratch = ScratchDir::new("simcheck-cluster");
    let check = ClusterCheck::new(a, scratch.path())?;
    let mut state = ClusterState {
        simulator: Simulator::new(),
        profiles: Vec::new(),
        totals: ErrorTotals::default(),
    };
    for bw in a.cluster_bandwidth.split(',').map(str::trim) {
        for &hosts in &check.hosts {
            if hosts < 2 {
                return Err("--hosts: a cluster needs at least 2 hosts".into());
            }
            check.run_on_cluster(bw, hosts, scratch.path(), &mut state)?;
        }
    }
    let t = &state.totals;
    crate::outln!(
        "\n{} rows; largest |error|: {:.1}% from the profile, {:.1}% with the \
         run's compute (target: within 10%); exp = exposed comm, cpt = data + forward + \
         backward + update",
        t.rows,
        t.worst,
        t.worst_cal
    );
    Ok(())
}

/// An emulated device: a model's profile measured alone, and the file the runs'
/// `--emulate-device` reads it from.
struct Device {
    model: String,
    profile: crate::sim::Profile,
    path: std::path::PathBuf,
}

/// What every cluster of the check shares: the parsed flags and this machine's figures.
struct ClusterCheck<'a> {
    a: &'a SimCheckArgs,
    comm: CommChoice,
    /// The pattern the links are timed with: the run's mode (ring for auto).
    fit_mode: CommMode,
    hosts: Vec<usize>,
    per_host: Vec<usize>,
    overlaps: Vec<bool>,
    schedules: Vec<Schedule>,
    hierarchies: Vec<crate::plan::HierarchyChoice>,
    /// This program, which the cluster's ranks run.
    exe: std::path::PathBuf,
    cores: usize,
    /// Within a host, threads of one process: the link timed here.
    intra: LinkModel,
    /// With emulated devices, one per model.
    devices: Vec<Device>,
}

/// What the clusters of the check accumulate: the simulator, the profiles made so far (by
/// model and workers) and the errors.
struct ClusterState {
    simulator: Simulator,
    profiles: Vec<(String, usize, crate::sim::Profile)>,
    totals: ErrorTotals,
}

/// The largest errors so far, and the rows.
#[derive(Default)]
struct ErrorTotals {
    worst: f64,
    worst_cal: f64,
    rows: usize,
}

/// One cluster's links as measured across it.
struct ClusterLinks {
    /// Mean ping round trip, ms.
    rtt: f64,
    /// The link within a host per workers per host.
    intra_of: Vec<(usize, LinkModel)>,
    /// What `--comm auto` and the bucket caps plan for in the runs and in the simulator alike.
    planning: LinkModel,
    /// Between hosts, per model (fitted to its own buckets).
    fits: Vec<(String, LinkModel)>,
}

/// One row's inputs: a cluster, its workers per host, a model, the overlap setting and the
/// schedule.
#[derive(Debug, Clone, Copy)]
struct ClusterCase<'a> {
    /// `--cluster-bandwidth` entry (tc's spelling).
    bw: &'a str,
    hosts: usize,
    per_host: usize,
    model: &'a str,
    overlap: bool,
    schedule: Schedule,
    hierarchy: crate::plan::HierarchyChoice,
}

/// The cluster table's column header.
fn cluster_header() -> String {
    format!(
        "{:>6} {:>5} {:>4} {:>10} {:>7} {:>6} {:>9} {:>9} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "link",
        "hosts",
        "w/h",
        "model",
        "overlap",
        "hier",
        "meas ms",
        "sim ms",
        "err%",
        "cal ms",
        "err%",
        "meas exp",
        "sim exp",
        "meas cpt",
        "sim cpt"
    )
}

impl<'a> ClusterCheck<'a> {
    /// Parses the flags, times the link within a host and (with emulated devices) measures
    /// each model's device profile into `scratch`.
    fn new(a: &'a SimCheckArgs, scratch: &std::path::Path) -> Result<Self, String> {
        let comm = CommChoice::parse(&a.comm)?;
        let fit_mode = match comm {
            CommChoice::Fixed(m) => m,
            _ => CommMode::Ring,
        };
        let hosts = super::args::worker_list("--hosts", &a.hosts)?;
        let per_host = super::args::worker_list("--workers-per-host", &a.workers_per_host)?;
        let overlaps = super::args::on_off_list("overlap", &a.overlap)?;
        let schedules = super::args::list("--schedule", &a.schedule, Schedule::parse)?;
        let hierarchies = super::args::list(
            "--hierarchical",
            &a.hierarchical,
            crate::plan::HierarchyChoice::parse,
        )?;
        let emulated = match a.devices.as_str() {
            "emulated" => true,
            "shared" => false,
            o => return Err(format!("--devices {o:?}: use emulated or shared")),
        };
        // Every profile is checked before anything is measured: a device's alone, or all the
        // largest cluster's workers at once on this machine's cores.
        let most_workers = hosts.iter().max().unwrap_or(&1) * per_host.iter().max().unwrap_or(&1);
        for model in a.model.split(',').map(str::trim) {
            let batch = per_model_batch(&a.worker_batch, model)?;
            let workers = if emulated { 1 } else { most_workers };
            cluster_profile_spec(a, model, batch, workers).check()?;
        }
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let t = |bytes| bench_allreduce(2, bytes, fit_mode, None, 40).map(|r| r.time);
        let intra = fit_link(
            fit_mode,
            2,
            (FIT_SIZES.0, t(FIT_SIZES.0)?),
            (FIT_SIZES.1, t(FIT_SIZES.1)?),
        )?;
        crate::outln!(
            "namespace cluster, {}, {} thread(s) per worker, batch {} per worker, {} timed steps; \
             within a host (threads, timed here): {:.2} GB/s, {:.1} us per message",
            a.comm,
            a.threads,
            a.worker_batch,
            a.steps,
            intra.bandwidth_bytes_per_s / 1e9,
            intra.latency.as_secs_f64() * 1e6
        );
        if let Some(ratio) = a.intra_ratio {
            crate::outln!(
                "within a host of several workers, each worker's port emulated at {ratio} x the \
                 host's link (train --intra-bandwidth), the threads' hand-over on top"
            );
        }
        let mut check = Self {
            a,
            comm,
            fit_mode,
            hosts,
            per_host,
            overlaps,
            schedules,
            hierarchies,
            exe,
            cores: crate::limits::cores(),
            intra,
            devices: Vec::new(),
        };
        if !(a.device_headroom >= 1.0 && a.device_headroom <= 100.0) {
            return Err(format!(
                "--device-headroom {}: give a factor from 1 to 100",
                a.device_headroom
            ));
        }
        if emulated {
            check.devices = check.measure_devices(scratch)?;
        }
        Ok(check)
    }

    /// `--model`'s models.
    fn models(&self) -> impl Iterator<Item = &'a str> {
        self.a.model.split(',').map(str::trim)
    }

    /// The per-worker batch of `model`.
    fn batch_of(&self, model: &str) -> Result<usize, String> {
        per_model_batch(&self.a.worker_batch, model)
    }

    /// Each model's profile measured alone (one replica: the device), written for the runs'
    /// `--emulate-device`.
    fn measure_devices(&self, scratch: &std::path::Path) -> Result<Vec<Device>, String> {
        let (a, cores) = (self.a, self.cores);
        let mut devices = Vec::new();
        for model in self.models() {
            let batch = self.batch_of(model)?;
            let p = measure(&cluster_profile_spec(a, model, batch, 1))?;
            let path = scratch.join(format!("{model}-device.json"));
            let json = serde_json::to_string(&p).map_err(|e| e.to_string())?;
            crate::output::write_atomically(&path, json.as_bytes(), &crate::measure::PROFILE_FILE)?;
            crate::outln!(
                "{model} device (profile measured alone): forward {:.2} ms, backward {:.2} ms, \
                 update {:.2} ms at batch {}; held to that x {} max(W, {cores}) / {cores} for W \
                 workers on these {cores} cores",
                p.forward_ms(),
                p.backward_ms(),
                p.update_ms,
                self.batch_of(model)?,
                a.device_headroom,
            );
            devices.push(Device {
                model: model.to_string(),
                profile: p,
                path,
            });
        }
        Ok(devices)
    }

    /// One cluster of `hosts` at `bw`: brought up, its links measured, every case run
    /// `--rounds` times and set beside the simulated step; taken down after.
    fn run_on_cluster(
        &self,
        bw: &str,
        hosts: usize,
        scratch: &std::path::Path,
        state: &mut ClusterState,
    ) -> Result<(), String> {
        let a = self.a;
        // Parsed once before anything ran (`run`).
        let ours = trainer_rate(bw);
        let cluster = Cluster::up(&a.cluster_script, &a.cluster_name, hosts, bw)?;
        let links = self.measure_links(&cluster, hosts, bw, &ours)?;
        crate::outln!("{}", cluster_header());
        // Every case of this cluster, then `rounds` passes over them: a slow spell of the
        // shared machine lands on all cases, and each case's figure is its median pass.
        let mut cases: Vec<ClusterCase> = Vec::new();
        for &per_host in &self.per_host {
            for model in self.models() {
                for &overlap in &self.overlaps {
                    for &schedule in &self.schedules {
                        // Priority's updates wait for the next forward: it needs overlap.
                        if schedule == Schedule::Priority && !overlap {
                            continue;
                        }
                        for &hierarchy in &self.hierarchies {
                            cases.push(ClusterCase {
                                bw,
                                hosts,
                                per_host,
                                model,
                                overlap,
                                schedule,
                                hierarchy,
                            });
                        }
                    }
                }
            }
        }
        let mut passes: Vec<Vec<Phases>> = vec![Vec::new(); cases.len()];
        for round in 0..a.rounds.max(1) {
            for (i, case) in cases.iter().enumerate() {
                let dir = scratch.join(format!(
                    "{}-{hosts}x{}-{}-{}-{}-{round}",
                    case.model, case.per_host, case.overlap, case.schedule, case.hierarchy
                ));
                let args = self.train_args(case, &ours, links.rtt, &dir)?;
                cluster.mpirun(hosts, &args)?;
                passes[i].push(Phases::median_of_steps(&dir.join("metrics.jsonl"))?);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        for (case, runs) in cases.iter().zip(&passes) {
            let profile = self.case_profile(case, &mut state.profiles)?;
            self.compare_case(case, &links, &Phases::median_of(runs), &profile, state)?;
        }
        drop(cluster);
        Ok(())
    }

    /// The cluster's links: the ping round trip `up` measured, within a host per workers per
    /// host, and between hosts fitted to each model's buckets.
    fn measure_links(
        &self,
        cluster: &Cluster,
        hosts: usize,
        bw: &str,
        ours: &str,
    ) -> Result<ClusterLinks, String> {
        let rtt = cluster.rtt_ms()?;
        let name = self.fit_mode.to_string();
        // Within a host, a message also waits for the receiving thread to wake up in a
        // process of the cluster; the trainer's own hierarchical all-reduce of 4 bytes times
        // it: its leaders' part is the flat one of one worker per host, and the rest is one
        // message to the leader and one back.
        let flat_small = self.small_allreduce(cluster, hosts, 1, &name)?;
        let mut intra_of: Vec<(usize, LinkModel)> = vec![(1, self.intra)];
        for &d in self.per_host.iter().filter(|&&d| d > 1) {
            let hier = self.small_allreduce(cluster, hosts, d, &format!("leader:{name}"))?;
            let extra = hier.saturating_sub(flat_small) / 2;
            let link = LinkModel {
                latency: self.intra.latency.max(extra),
                ..self.intra
            };
            crate::outln!(
                "{hosts} hosts at {bw}, {d} workers per host: within a host {:.1} us per \
                 message (leader:{name} of {} B {:.1} us, {name} of one worker per host {:.1} us)",
                link.latency.as_secs_f64() * 1e6,
                FIT_SIZES.0,
                hier.as_secs_f64() * 1e6,
                flat_small.as_secs_f64() * 1e6
            );
            intra_of.push((d, link));
        }
        let planning = LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(ours)?,
            latency: std::time::Duration::from_secs_f64(rtt / 2e3),
        };
        let mut fits: Vec<(String, LinkModel)> = Vec::new();
        for model in self.models() {
            let nic = self.fit_model_link(cluster, hosts, bw, model, &planning, rtt)?;
            fits.push((model.to_string(), nic));
        }
        Ok(ClusterLinks {
            rtt,
            intra_of,
            planning,
            fits,
        })
    }

    /// `bench allreduce --transport mpi` across the cluster: the time of `op` at the smallest
    /// fit size with `workers` per host.
    fn small_allreduce(
        &self,
        cluster: &Cluster,
        hosts: usize,
        workers: usize,
        op: &str,
    ) -> Result<std::time::Duration, String> {
        let mut args = vec![self.exe.display().to_string()];
        args.extend(
            [
                "bench",
                "allreduce",
                "--transport",
                "mpi",
                "--iters",
                "30",
                "--sizes",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.extend([
            FIT_SIZES.0.to_string(),
            "--workers".into(),
            workers.to_string(),
        ]);
        parse_allreduce(&cluster.mpirun(hosts, &args)?, op, FIT_SIZES.0)
    }

    /// The link between hosts as `model`'s runs see it: the links are timed at the sizes the
    /// runs send, because the transport's rate depends on the message size here (tbf lets a
    /// burst through at once; above 64 KB MPI's rendezvous protocol halves the rate of a
    /// 2-host ring), so the link is fitted to the total time of the model's own buckets.
    fn fit_model_link(
        &self,
        cluster: &Cluster,
        hosts: usize,
        bw: &str,
        model: &str,
        planning: &LinkModel,
        rtt: f64,
    ) -> Result<LinkModel, String> {
        let name = self.fit_mode.to_string();
        // The buckets of the runs of one worker per host (the trainer's plan and caps for
        // the checked mode), each a whole number of f32 per rank as the all-reduce bench
        // takes it, timed one by one: the link is fitted to their total.
        let lens: Vec<usize> = crate::measure::blocks_of(model)?
            .iter()
            .map(|b| b.iter().sum())
            .collect();
        let runs = crate::plan::PlanInputs {
            comm: self.comm,
            ..crate::plan::PlanInputs::defaults(hosts, 1, Some(*planning))
        };
        let buckets: Vec<usize> = runs
            .bucket_plan(&lens)
            .buckets
            .iter()
            .map(|b| (4 * b.len).div_ceil(4 * hosts) * 4 * hosts)
            .collect();
        let mut distinct = buckets.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut args = vec![self.exe.display().to_string()];
        args.extend(
            [
                "bench",
                "allreduce",
                "--transport",
                "mpi",
                "--workers",
                "1",
                "--iters",
                "30",
                "--sizes",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        let list: Vec<String> = distinct.iter().map(|b| b.to_string()).collect();
        args.push(format!("{},{}", FIT_SIZES.0, list.join(",")));
        let out = cluster.mpirun(hosts, &args)?;
        let mix = buckets
            .iter()
            .map(|&b| Ok((b, parse_allreduce(&out, &name, b)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let nic = fit_link_to_mix(
            self.fit_mode,
            hosts,
            (FIT_SIZES.0, parse_allreduce(&out, &name, FIT_SIZES.0)?),
            &mix,
        )?;
        let total: std::time::Duration = mix.iter().map(|(_, t)| *t).sum();
        crate::outln!(
            "\n{hosts} hosts at {bw} (tbf), ping round trip {rtt:.3} ms; {model}: between \
             hosts (MPI over TCP; {name} all-reduce of {} B and of each of its {} buckets, \
             {} B in all, {:.1} ms in all, timed across the cluster) {:.1} MB/s, {:.1} us \
             per message",
            FIT_SIZES.0,
            buckets.len(),
            buckets.iter().sum::<usize>(),
            total.as_secs_f64() * 1e3,
            nic.bandwidth_bytes_per_s / 1e6,
            nic.latency.as_secs_f64() * 1e6
        );
        Ok(nic)
    }

    /// The `mpirun` command line of one case's training run, into `dir`.
    fn train_args(
        &self,
        case: &ClusterCase,
        ours: &str,
        rtt: f64,
        dir: &std::path::Path,
    ) -> Result<Vec<String>, String> {
        let (a, model, d, hosts) = (self.a, case.model, case.per_host, case.hosts);
        let batch = self.batch_of(model)? * hosts * d;
        let mut args: Vec<String> = vec![self.exe.display().to_string()];
        args.extend(
            [
                "train",
                "--transport",
                "mpi",
                "--model",
                model,
                "--dataset",
                super::overlap::synthetic_for(model),
                "--epochs",
                "1",
                "--test-limit",
                "100",
                "--quiet",
                "--no-checkpoints",
                "--log-every",
                "1",
                "--comm",
                &a.comm,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.extend([
            "--workers".into(),
            d.to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--batch".into(),
            batch.to_string(),
            "--train-limit".into(),
            (batch * (a.steps + 5)).to_string(),
            "--overlap".into(),
            if case.overlap { "on" } else { "off" }.into(),
            "--schedule".into(),
            case.schedule.to_string(),
            "--hierarchical".into(),
            case.hierarchy.to_string(),
            "--link-bandwidth".into(),
            ours.to_string(),
            "--link-latency".into(),
            format!("{:.0}us", rtt / 2.0 * 1e3),
            "--run-dir".into(),
            dir.display().to_string(),
        ]);
        if let Some(port) = self.intra_port(ours, d)? {
            args.extend([
                "--intra-bandwidth".into(),
                format!("{}B/s", port.bandwidth_bytes_per_s),
            ]);
        }
        if let Some(kb) = self.partition_kb(case) {
            args.extend(["--partition-kb".into(), kb.to_string()]);
        }
        if let Some(device) = self.devices.iter().find(|dev| dev.model == model) {
            args.extend([
                "--emulate-device".into(),
                device.path.display().to_string(),
                "--emulate-device-scale".into(),
                device_scale(hosts * d, self.cores, a.device_headroom).to_string(),
            ]);
        }
        Ok(args)
    }

    /// The emulated port within a host (`--intra-ratio` of the host's link `ours`), where a
    /// host has `per_host` > 1 workers: what the runs give `train --intra-bandwidth`, with no
    /// latency of its own (the threads' hand-over adds the measured one).
    fn intra_port(&self, ours: &str, per_host: usize) -> Result<Option<LinkModel>, String> {
        match self.a.intra_ratio {
            Some(ratio) if per_host > 1 => Ok(Some(LinkModel {
                bandwidth_bytes_per_s: ratio * parse_bandwidth(ours)?,
                latency: std::time::Duration::ZERO,
            })),
            _ => Ok(None),
        }
    }

    /// `--partition-kb` for a priority case (overlap's buckets go whole, as by default).
    fn partition_kb(&self, case: &ClusterCase) -> Option<usize> {
        self.a
            .partition_kb
            .filter(|_| case.schedule == Schedule::Priority)
    }

    /// The profile a case is simulated from, made once per (model, workers): the device's
    /// alone profile at the runs' scale, or (shared cores) one measured with as many replicas
    /// at once.
    fn case_profile(
        &self,
        case: &ClusterCase,
        profiles: &mut Vec<(String, usize, crate::sim::Profile)>,
    ) -> Result<crate::sim::Profile, String> {
        let (a, model, cores) = (self.a, case.model, self.cores);
        let workers = case.hosts * case.per_host;
        if let Some((_, _, p)) = profiles
            .iter()
            .find(|(m, w, _)| m == model && *w == workers)
        {
            return Ok(p.clone());
        }
        let p = match self.devices.iter().find(|dev| dev.model == model) {
            // The device: the alone profile at the runs' scale, every worker alike.
            Some(device) => {
                let p = &device.profile;
                let k = device_scale(workers, cores, a.device_headroom);
                let mut p = p.rescaled(k * p.forward_ms(), k * p.backward_ms(), k * p.update_ms);
                p.compute_spread = Some(0.0);
                crate::outln!(
                    "  ({model} device for {workers} workers: x {k}, compute {:.1} ms a \
                     step)",
                    p.forward_ms() + p.backward_ms() + p.update_ms
                );
                p
            }
            None => {
                // Every worker of the cluster shares this machine's cores: measure with
                // as many replicas at once.
                let batch = self.batch_of(model)?;
                let p = measure(&cluster_profile_spec(a, model, batch, workers))?;
                crate::outln!(
                    "  ({model} profile, {workers} replicas at once: compute {:.1} ms a \
                     step, spread {:.1}%)",
                    p.forward_ms() + p.backward_ms() + p.update_ms,
                    100.0 * p.compute_spread.unwrap_or(0.0)
                );
                p
            }
        };
        profiles.push((model.to_string(), workers, p.clone()));
        Ok(p)
    }

    /// Simulates one case on its cluster's measured links beside its runs' median pass `m`,
    /// and prints the row.
    fn compare_case(
        &self,
        case: &ClusterCase,
        links: &ClusterLinks,
        m: &Phases,
        profile: &crate::sim::Profile,
        state: &mut ClusterState,
    ) -> Result<(), String> {
        let (d, model) = (case.per_host, case.model);
        let nic = links
            .fits
            .iter()
            .find(|(fitted, _)| fitted == model)
            .expect("fitted above")
            .1;
        let measured_intra = links
            .intra_of
            .iter()
            .find(|(dd, _)| *dd == d)
            .map_or(self.intra, |(_, l)| *l);
        let port = self.intra_port(&trainer_rate(case.bw), d)?;
        // An emulated port: its rate, and the threads' measured hand-over on top.
        let intra = port.map_or(measured_intra, |p| LinkModel {
            latency: measured_intra.latency,
            ..p
        });
        let topology = Topology {
            hosts: case.hosts,
            devices_per_host: d,
            intra,
            nic,
            overhead: std::time::Duration::ZERO,
            step_overhead: std::time::Duration::ZERO,
        };
        let step = StepConfig {
            compress: crate::plan::CompressChoice::NONE,
            schedule: case.schedule,
            partition_kb: self.partition_kb(case),
            credit_kb: None,
            topology,
            comm: self.comm,
            // As the measured run.
            hierarchy: case.hierarchy,
            overlap: case.overlap,
            buckets: crate::plan::BucketFlags::default(),
            planning_link: Some(links.planning),
            // The trainer's: it plans within a host on the port it emulates, else on its
            // assumed in-process link.
            planning_intra: Some(port.unwrap_or(crate::plan::IN_PROCESS_LINK)),
            // The workers' compute varies as much as the profile says (emulated devices:
            // not at all).
            stragglers: Stragglers {
                spread: profile.compute_spread.unwrap_or(0.0),
                seed: 1,
                steps: 50,
            },
        };
        let sim = state.simulator.step(profile, &step)?;
        let cal = state.simulator.step(
            &profile.rescaled(m.data + m.forward, m.backward, m.update),
            &step,
        )?;
        let err = 100.0 * (sim.step_ms / m.step - 1.0);
        let cal_err = 100.0 * (cal.step_ms / m.step - 1.0);
        let t = &mut state.totals;
        t.worst = t.worst.max(err.abs());
        t.worst_cal = t.worst_cal.max(cal_err.abs());
        t.rows += 1;
        crate::outln!(
            "{:>6} {:>5} {:>4} {:>10} {:>7} {:>6} {:>9.1} {:>9.1} {:>+7.1} {:>9.1} {:>+7.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            case.bw,
            case.hosts,
            d,
            model,
            overlap_column(case),
            case.hierarchy.to_string(),
            m.step,
            sim.step_ms,
            err,
            cal.step_ms,
            cal_err,
            m.exposed,
            sim.exposed_ms,
            m.data + m.forward + m.backward + m.update,
            sim.forward_ms + sim.backward_ms + sim.update_ms
        );
        crate::outln!(
            "RESULT dptrain simcheck-cluster bw={} hosts={} workers_per_host={d} model={model} overlap={} schedule={} hierarchical={} intra_bytes_per_s={} measured_ms={:.2} simulated_ms={:.2} calibrated_ms={:.2}",
            case.bw, case.hosts, case.overlap, case.schedule, case.hierarchy,
            port.map_or("-".into(), |p| p.bandwidth_bytes_per_s.to_string()),
            m.step, sim.step_ms, cal.step_ms
        );
        Ok(())
    }
}

/// tc's rate ("100mbit") in our spelling ("100Mbit"), for the trainer's flags.
fn trainer_rate(tc_rate: &str) -> String {
    tc_rate.replace("mbit", "Mbit").replace("gbit", "Gbit")
}

/// The cluster table's overlap column: on, off, or prio (`--schedule priority`, overlap on).
fn overlap_column(case: &ClusterCase) -> &'static str {
    match (case.schedule, case.overlap) {
        (Schedule::Priority, _) => "prio",
        (Schedule::Overlap, true) => "on",
        (Schedule::Overlap, false) => "off",
    }
}

/// The per-worker batch of `model` in `--worker-batch`: one number for every model, or
/// `MODEL=N` entries.
pub fn per_model_batch(spec: &str, model: &str) -> Result<usize, String> {
    let parse = |v: &str| match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "--worker-batch {spec:?}: {v:?} is not a batch (a whole number from 1)"
        )),
    };
    if !spec.contains('=') {
        return parse(spec);
    }
    for entry in spec.split(',') {
        let Some((m, v)) = entry.split_once('=') else {
            return Err(format!(
                "--worker-batch {spec:?}: give one number, or MODEL=N entries"
            ));
        };
        if m.trim() == model {
            return parse(v);
        }
    }
    Err(format!(
        "--worker-batch {spec:?} gives no batch for {model}: add {model}=N"
    ))
}

/// The factor the emulated devices of `workers` workers sharing `cores` cores are held to (on
/// a profile measured alone): the workers per core (at least 1: a worker with a core of its
/// own still shares it with the communication threads and the network stacks) times
/// `headroom`, so that the real compute fits in the device's time.
pub fn device_scale(workers: usize, cores: usize, headroom: f64) -> f64 {
    headroom * workers.max(cores) as f64 / cores.max(1) as f64
}

/// One input of the published comparison, and where it comes from.
#[derive(Debug, Clone)]
pub struct Assumption {
    /// What it is.
    pub what: &'static str,
    /// The figure fed to the simulator.
    pub value: String,
    /// Its source, or why it was assumed.
    pub source: &'static str,
}

/// The published comparison: inputs, the prediction beside the published figure, and how the
/// prediction moves when the least certain inputs change.
#[derive(Debug, Clone)]
pub struct Published {
    /// The run: who, what, on what.
    pub title: String,
    /// The published statement, with where it is.
    pub claim: String,
    /// Every input and its source.
    pub assumptions: Vec<Assumption>,
    /// The published scaling efficiency, %.
    pub published: f64,
    /// Points from the published figure the prediction is held to (the issue's target).
    pub target: f64,
    /// The baseline's and the scaled run's workers.
    pub workers: (usize, usize),
    /// The ideal network's efficiency (no overheads, the NIC at its line rate, every GPU
    /// alike), %: an upper bound of the prediction.
    pub ideal: f64,
    /// (variant, baseline step ms, scaled step ms, efficiency %); the first row is the
    /// prediction from the stated inputs with the measured defaults.
    pub rows: Vec<(String, f64, f64, f64)>,
}

impl Published {
    /// The prediction from the stated inputs with the measured defaults, %.
    pub fn predicted(&self) -> f64 {
        self.rows[0].3
    }
}

/// P100's backward pass of ResNet-50 at 32 images (Goyal et al. 2017, §4), s.
const GOYAL_BACKWARD_S: f64 = 0.120;

/// Goyal et al. 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
/// arXiv:1706.02677): ResNet-50 on 32 servers of 8 P100s, ~90% weak-scaling efficiency from 8
/// to 256 GPUs. Simulates the 8-GPU baseline (one server) and the 256-GPU run with the inputs
/// below and the measured defaults ([`crate::sim::defaults::MEASURED`]), the ideal network
/// beside them, and variants of the uncertain inputs.
pub fn goyal2017() -> Result<Published, String> {
    let graph = crate::model::reference_graph("resnet50")?;
    let inputs = GoyalInputs::new(&graph);
    let profile = crate::sim::from_graph(
        &graph,
        inputs.batch,
        crate::sim::DeviceSpeed::ImagesPerSecond {
            images_per_s: inputs.images_per_s,
            mem_gbs: inputs.mem_gbs,
        },
    )?;
    let measured = MEASURED.overheads();
    let base = StepConfig {
        compress: crate::plan::CompressChoice::NONE,
        schedule: crate::parallel::Schedule::Overlap,
        partition_kb: None,
        credit_kb: None,
        topology: measured.apply(inputs.topology),
        comm: CommChoice::Fixed(CommMode::HalvingDoubling),
        // Goyal et al.'s three phases: each server's sum in one buffer, then across.
        hierarchy: crate::plan::HierarchyChoice::Fixed(crate::comm::Hierarchy::Leader),
        overlap: true,
        // As they aggregated: each layer's gradient as soon as it is computed (--bucket-kb 0).
        buckets: crate::plan::BucketFlags {
            first_kb: Some(0),
            kb: Some(0),
        },
        planning_link: None,
        planning_intra: None,
        stragglers: default_stragglers(&measured),
    };
    let ideal = StepConfig {
        topology: Overheads::IDEAL.apply(inputs.topology),
        stragglers: Stragglers::NONE,
        ..base
    };
    let mut sim = Simulator::new();
    let workers = (8, 256);
    Ok(Published {
        title: "Goyal et al. 2017 (arXiv:1706.02677), ResNet-50 on P100s".into(),
        claim: "~90% scaling efficiency when moving from 8 to 256 GPUs (abstract); efficiency = \
                8-GPU step / 256-GPU step at 32 images per GPU"
            .into(),
        assumptions: goyal_assumptions(&graph, &inputs),
        published: 90.0,
        target: 5.0,
        workers,
        ideal: scaling(&mut sim, &profile, &ideal, workers)?.2,
        rows: goyal_variants(&mut sim, &profile, base, workers)?,
    })
}

/// The straggler draws of a published comparison: the measured spread, the simulator's
/// default seed and 20 steps (`simulate`'s default).
fn default_stragglers(o: &Overheads) -> Stragglers {
    Stragglers {
        spread: o.compute_spread,
        seed: 1,
        steps: 20,
    }
}

/// The baseline's and the scaled run's steps (ms) under `c` (its topology at the baseline's
/// size) and the efficiency, %.
fn scaling(
    sim: &mut Simulator,
    profile: &Profile,
    c: &StepConfig,
    (small, large): (usize, usize),
) -> Result<(f64, f64, f64), String> {
    let at = |n: usize| -> Result<StepConfig, String> {
        Ok(StepConfig {
            topology: c.topology.with_workers(n)?,
            ..*c
        })
    };
    let a = sim.step(profile, &at(small)?)?.step_ms;
    let b = sim.step(profile, &at(large)?)?.step_ms;
    Ok((a, b, 100.0 * a / b))
}

/// The figures [`goyal2017`] feeds the simulator (their sources are in
/// [`goyal_assumptions`]).
struct GoyalInputs {
    /// Images per GPU.
    batch: usize,
    /// P100's HBM2 bandwidth, GB/s.
    mem_gbs: f64,
    /// The SGD update, s.
    update_s: f64,
    /// The device throughput the step comes to, for `--device-images-per-s`.
    images_per_s: f64,
    /// One 8-GPU server, its NIC at the line rate and no overheads (the defaults add them).
    topology: Topology,
}

impl GoyalInputs {
    fn new(graph: &crate::model::Graph) -> Self {
        let batch = 32;
        let mem_gbs = 732.0;
        // The step at the per-GPU batch: backward as published, forward half of it (2 x MACs
        // against 4 x MACs: the 1:2 split the profiles use), plus the memory-bound update; as
        // a device throughput for --device-images-per-s.
        let update_s = graph.num_params() as f64 * 20.0 / (mem_gbs * 1e9);
        let images_per_s = batch as f64 / (1.5 * GOYAL_BACKWARD_S + update_s);
        let us = std::time::Duration::from_micros;
        let topology = Topology {
            hosts: 1,
            devices_per_host: 8,
            intra: LinkModel {
                bandwidth_bytes_per_s: 20e9,
                latency: us(5),
            },
            nic: LinkModel {
                bandwidth_bytes_per_s: 50e9 / 8.0,
                latency: us(10),
            },
            overhead: std::time::Duration::ZERO,
            step_overhead: std::time::Duration::ZERO,
        };
        Self {
            batch,
            mem_gbs,
            update_s,
            images_per_s,
            topology,
        }
    }
}

/// The measured defaults as inputs of a published comparison, each with its source.
fn default_assumptions() -> Vec<Assumption> {
    MEASURED
        .rows()
        .into_iter()
        .map(|(what, value, source)| Assumption {
            what,
            value: format!("{value} (the measured default, sim::defaults)"),
            source,
        })
        .collect()
}

/// Every input of [`goyal2017`] with its source.
fn goyal_assumptions(graph: &crate::model::Graph, inputs: &GoyalInputs) -> Vec<Assumption> {
    let GoyalInputs {
        batch,
        update_s,
        images_per_s,
        topology: topo,
        ..
    } = *inputs;
    let mut v = vec![
        Assumption {
            what: "model",
            value: format!(
                "ResNet-50 (torchvision v1.5 graph, {:.2} M parameters, {:.2} GMACs per image)",
                graph.num_params() as f64 / 1e6,
                graph.macs() as f64 / 1e9
            ),
            source: "Goyal et al. 2017 train ResNet-50 (§4: \"approximately 25 million parameters\")",
        },
        Assumption {
            what: "batch per GPU",
            value: format!("{batch} images"),
            source: "Goyal et al. 2017: n = 32 images per GPU throughout (kn = 256 on 8 GPUs, 8k on 256)",
        },
        Assumption {
            what: "compute per GPU",
            value: format!(
                "backward {:.0} ms, forward {:.0} ms, update {:.1} ms at 32 images: \
                 --device-images-per-s {images_per_s:.1}",
                GOYAL_BACKWARD_S * 1e3,
                GOYAL_BACKWARD_S * 0.5e3,
                update_s * 1e3
            ),
            source: "backward: Goyal et al. 2017 §4 (\"Backwards pass time for ResNet-50 on a \
                     single NVIDIA Tesla P100 GPU is 120 ms\"); forward = backward / 2: our FLOPs \
                     rule (backward computes two products per forward one), assumed; update: SGD \
                     with momentum, 20 bytes per parameter at P100's 732 GB/s HBM2 (NVIDIA P100 \
                     datasheet)",
        },
        Assumption {
            what: "cluster",
            value: "32 servers x 8 GPUs; baseline 1 server x 8".into(),
            source: "Goyal et al. 2017 §4 (Big Basin servers, 8 P100 each) and abstract (8 -> 256 GPUs)",
        },
        Assumption {
            what: "within a server",
            value: "20 GB/s per GPU port, 5 us".into(),
            source: "NVLink: 20 GB/s per link and direction on P100 (NVIDIA P100 whitepaper; \
                     Big Basin's OCP specification shows the NVLink hybrid cube mesh at 20 GB/s \
                     per link); one link per GPU port assumed (the mesh gives each GPU 4 links, \
                     to 4 of its 7 peers); latency assumed",
        },
        Assumption {
            what: "between servers",
            value: format!(
                "one NIC per server, {:.0} Gbit/s line rate full duplex (times the NIC \
                 efficiency below), 10 us",
                topo.nic.bandwidth_bytes_per_s * 8.0 / 1e9
            ),
            source: "Goyal et al. 2017 §4: Mellanox ConnectX-4 50 Gbit Ethernet per server; \
                     latency assumed (not published)",
        },
        Assumption {
            what: "algorithm",
            value: "hierarchical: within the server to GPU 0, recursive halving-doubling among \
                    the 32 servers' GPU 0s, back within (our --comm hd --hierarchical leader); the \
                    8-GPU baseline is one process, so flat hd over its 8 GPUs as the trainer \
                    runs it"
                .into(),
            source: "Goyal et al. 2017 §4: three phases (sum within each server, all-reduce \
                     across servers with recursive halving and doubling, broadcast within); they \
                     used NCCL within a server, where our trainer gathers to the leader",
        },
        Assumption {
            what: "overlap and buckets",
            value: "overlap on; one bucket per layer with parameters (--bucket-kb 0)".into(),
            source: "Goyal et al. 2017 §4: a layer's gradient is aggregated as soon as it is \
                     computed, while backprop continues",
        },
    ];
    v.extend(default_assumptions());
    v
}

/// The baseline's and the scaled run's steps and the efficiency, from the stated inputs
/// (`base`, with the measured defaults) and with each uncertain input changed.
fn goyal_variants(
    sim: &mut Simulator,
    profile: &Profile,
    base: StepConfig,
    workers: (usize, usize),
) -> Result<Vec<(String, f64, f64, f64)>, String> {
    let us = std::time::Duration::from_micros;
    let mut rows = Vec::new();
    let mut variant = |name: &str, f: &dyn Fn(&mut StepConfig)| -> Result<(), String> {
        let mut c = base;
        f(&mut c);
        let (small, big, eff) = scaling(sim, profile, &c, workers)?;
        rows.push((name.to_string(), small, big, eff));
        Ok(())
    };
    variant("as stated above, measured defaults", &|_| {})?;
    variant("NIC at half the rate (23.5 Gbit/s)", &|c| {
        c.topology.nic.bandwidth_bytes_per_s /= 2.0
    })?;
    variant("latency + overhead 50 us per message", &|c| {
        let l = us(50) - c.topology.overhead;
        c.topology.nic.latency = l;
        c.topology.intra.latency = l;
    })?;
    variant("within a server 10 GB/s", &|c| {
        c.topology.intra.bandwidth_bytes_per_s = 10e9
    })?;
    variant("within a server 80 GB/s (all 4 NVLinks)", &|c| {
        c.topology.intra.bandwidth_bytes_per_s = 80e9
    })?;
    variant("no stragglers (every GPU alike)", &|c| {
        c.stragglers = Stragglers::NONE
    })?;
    variant("stragglers: 3% compute spread (20 seeded steps)", &|c| {
        c.stragglers.spread = 0.03
    })?;
    variant("no per-step overhead", &|c| {
        c.topology.step_overhead = std::time::Duration::ZERO
    })?;
    variant("ring among the servers", &|c| {
        c.comm = CommChoice::Fixed(CommMode::Ring)
    })?;
    variant("flat hd over every GPU (--hierarchical off)", &|c| {
        c.hierarchy = crate::plan::HierarchyChoice::Off
    })?;
    variant("overlap off", &|c| c.overlap = false)?;
    Ok(rows)
}

impl Published {
    /// The comparison on the terminal: inputs with sources, the variants' table, and the
    /// prediction beside the published figure and the ideal network's.
    pub fn terminal(&self) -> String {
        let (small, large) = self.workers;
        let mut s = format!("{}: published {}\ninputs:\n", self.title, self.claim);
        for a in &self.assumptions {
            s += &format!("  {}: {}\n      source: {}\n", a.what, a.value, a.source);
        }
        s += &format!(
            "{:<50} {:>12} {:>12} {:>8} {:>10}\n",
            "variant",
            format!("{small} GPUs ms"),
            format!("{large} GPUs ms"),
            "eff%",
            format!("vs {:.0}%", self.published)
        );
        for (name, small, big, eff) in &self.rows {
            s += &format!(
                "{name:<50} {small:>12.1} {big:>12.1} {eff:>8.1} {:>+10.1}\n",
                eff - self.published
            );
        }
        let d = self.predicted() - self.published;
        s + &format!(
            "prediction from the stated inputs with the measured defaults: {:.1}% (the ideal \
             network: {:.1}%) against the published ~{:.0}%: {d:+.1} points (target: within {:.0})",
            self.predicted(),
            self.ideal,
            self.published,
            self.target
        )
    }

    /// One line of the summary table: run, published, ideal, predicted, difference.
    fn summary_row(&self) -> String {
        format!(
            "| {} | {} -> {} | {:.0}% | {:.1}% | {:.1}% | {:+.1} |",
            self.title,
            self.workers.0,
            self.workers.1,
            self.published,
            self.ideal,
            self.predicted(),
            self.predicted() - self.published
        )
    }
}

/// Every published comparison (one so far: see docs/bench/sim-check.md for the runs
/// considered and why they are not here).
pub fn published_runs() -> Result<Vec<Published>, String> {
    Ok(vec![goyal2017()?])
}

/// Prints [`published_runs`]: per run its inputs with sources, the prediction beside the
/// published figure and the ideal network's, the variants; then the summary.
pub fn run_published() -> Result<Vec<Published>, String> {
    let runs = published_runs()?;
    for p in &runs {
        crate::outln!("{}\n", p.terminal());
    }
    crate::outln!("| run | GPUs | published | ideal network | measured defaults | points |");
    crate::outln!("|---|---|---:|---:|---:|---:|");
    for p in &runs {
        crate::outln!("{}", p.summary_row());
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_link_fitted_to_its_own_predictions_comes_back() {
        let link = LinkModel {
            bandwidth_bytes_per_s: 12.5e6,
            latency: Duration::from_micros(40),
        };
        for mode in CommMode::ALL {
            for world in [2usize, 4, 8] {
                let t = |b| predicted_time(mode, world, b, &link);
                let small = t(4);
                let large = t(1 << 20);
                let got = fit_link(mode, world, (4, small), (1 << 20, large)).unwrap();
                let lat = got.latency.as_secs_f64() / link.latency.as_secs_f64();
                assert!((lat - 1.0).abs() < 1e-6, "{mode} {world}: {got:?}");
                let bw = got.bandwidth_bytes_per_s / link.bandwidth_bytes_per_s;
                assert!((bw - 1.0).abs() < 1e-6, "{mode} {world}: {got:?}");
            }
        }
        // A mix of sizes fitted to the link's own predictions gives the link back too, and
        // a transport slower on the large sizes gives the rate that totals the mix.
        let t = |b| predicted_time(CommMode::Ring, 4, b, &link);
        let sizes = [624usize, 10_000, 123_360, 295_424];
        let mix: Vec<_> = sizes.iter().map(|&b| (b, t(b))).collect();
        let got = fit_link_to_mix(CommMode::Ring, 4, (4, t(4)), &mix).unwrap();
        assert!((got.bandwidth_bytes_per_s / link.bandwidth_bytes_per_s - 1.0).abs() < 1e-6);
        let slower: Vec<_> = mix
            .iter()
            .map(|&(b, d)| (b, if b > 65536 { d * 2 } else { d }))
            .collect();
        let got = fit_link_to_mix(CommMode::Ring, 4, (4, t(4)), &slower).unwrap();
        let total = |l: &LinkModel| {
            sizes
                .iter()
                .map(|&b| predicted_time(CommMode::Ring, 4, b, l))
                .sum::<Duration>()
        };
        let want: Duration = slower.iter().map(|&(_, d)| d).sum();
        assert!((total(&got).as_secs_f64() / want.as_secs_f64() - 1.0).abs() < 1e-6);
        assert!(got.bandwidth_bytes_per_s < 0.6 * link.bandwidth_bytes_per_s);
        // A large size no slower than latency alone cannot give a rate.
        let e = fit_link(
            CommMode::Ring,
            2,
            (4, Duration::from_micros(100)),
            (1 << 20, Duration::from_micros(100)),
        )
        .unwrap_err();
        assert!(e.contains("time a larger size"), "{e}");
    }

    #[test]
    fn the_mpi_allreduce_table_as_printed_is_read_back() {
        use crate::bench::allreduce::{AllReduceTable, OpRow, PROCESS_NAME_WIDTH};
        let row = |name: &str, bytes, us: f64| OpRow {
            name: name.into(),
            bytes,
            time: Duration::from_secs_f64(us * 1e-6),
            algbw: 1e9,
            busbw: 1e9,
            model: None,
            bound: None,
        };
        let table = AllReduceTable {
            name_width: PROCESS_NAME_WIDTH,
            rows: vec![
                row("ring", 4, 115.5),
                row("leader:ring", 4, 230.25),
                row("auto:2d:redundant", 4 << 20, 698659.2),
            ],
        };
        let out = table.terminal();
        assert_eq!(
            parse_allreduce(&out, "leader:ring", 4).unwrap(),
            Duration::from_secs_f64(230.2e-6)
        );
        assert_eq!(
            parse_allreduce(&out, "auto:2d:redundant", 4 << 20).unwrap(),
            Duration::from_secs_f64(698659.2e-6)
        );
        assert!(table
            .markdown()
            .contains("| 4M | auto:2d:redundant | 698659.2 | 1.000 | 1.000 |"));
        assert_eq!(crate::bench::allreduce::size_label(1536), "1536");
    }

    #[test]
    fn worker_batches_are_one_for_all_or_one_per_model() {
        assert_eq!(per_model_batch("64", "lenet5").unwrap(), 64);
        let spec = "vgg-small=32, lenet5=128";
        assert_eq!(per_model_batch(spec, "lenet5").unwrap(), 128);
        assert_eq!(per_model_batch(spec, "vgg-small").unwrap(), 32);
        assert!(per_model_batch(spec, "resnet20")
            .unwrap_err()
            .contains("resnet20=N"));
        assert!(per_model_batch("lenet5=0", "lenet5")
            .unwrap_err()
            .contains("not a batch"));
        assert!(per_model_batch("32,lenet5=1", "x")
            .unwrap_err()
            .contains("MODEL=N"));
        assert_eq!(device_scale(8, 2, 3.0), 12.0);
        assert_eq!(device_scale(1, 2, 3.0), 3.0);
    }

    #[test]
    fn the_mpi_allreduce_table_and_step_lines_are_read() {
        let out = "all-reduce over MPI: 2 processes x 1 workers\n\
                   \x20      bytes                 mode      time us   algbw GB/s   busbw GB/s\n\
                   \x20          4                 ring        115.5        0.000        0.000\n\
                   \x20    4194304                 ring     698659.2        0.006        0.006\n";
        assert_eq!(
            parse_allreduce(out, "ring", 4).unwrap(),
            Duration::from_secs_f64(115.5e-6)
        );
        assert!(parse_allreduce(out, "hd", 4)
            .unwrap_err()
            .contains("no hd row"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut text = String::new();
        for step in 0..9 {
            // Steps 0-4 are warm-up; of 5..=8 (10 to 13 ms) the median is 11.5.
            let ms = if step < 5 {
                100.0
            } else {
                9.0 + step as f64 - 4.0
            };
            text += &format!(
                "{{\"kind\": \"step\", \"step\": {step}, \"times\": {{\"step_ms\": {ms}, \"data_ms\": 0, \"forward_ms\": 1, \"backward_ms\": 2, \"update_ms\": 0.5, \"exposed_comm_ms\": 3}}}}\n"
            );
        }
        text += "{\"kind\": \"epoch\"}\n";
        std::fs::write(&path, text).unwrap();
        let p = Phases::median_of_steps(&path).unwrap();
        assert_eq!((p.step, p.backward, p.exposed), (11.5, 2.0, 3.0));
    }
}
