//! `dptrain bench sim-check`: the simulator against measured emulated runs. For each model,
//! a profile measured here (with as many concurrent replicas as workers, so compute sees the
//! same contention as in the run), then for each bandwidth and overlap on/off a short emulated
//! training run ([`super::overlap::run_case`]) and the simulated step beside it.
//!
//! The emulated link adds software costs the specified link does not have: handing a message
//! between threads and waking the receiver (tens of µs per message here). A real network's
//! latency includes such costs too, so the simulator is given the link as the emulation
//! *delivers* it: before the runs, a ring all-reduce of a few bytes is timed on the emulated
//! link, and the per-message excess over the link model is added to the simulated latency (the
//! header prints it). Without it, steps with many small buckets were under-predicted.

use super::allreduce::bench_allreduce;
use super::overlap::{run_case, GridSpec, OverlapCase};
use crate::comm::{parse_bandwidth, parse_duration, predicted_time, CommMode, LinkModel};
use crate::config::CommChoice;
use crate::sim::{measure, Simulator, StepConfig, Stragglers, Topology};

/// Arguments of `dptrain bench sim-check`.
#[derive(Debug, clap::Args)]
pub struct SimCheckArgs {
    /// Models, comma-separated (ours: lenet5, vgg-small, resnet20).
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
    #[arg(long, default_value = "100Mbit,20Mbit")]
    pub link_bandwidth: String,
    /// Emulated latency.
    #[arg(long, default_value = "50us")]
    pub link_latency: String,
    /// Mode (tree, ring, hd, redundant, auto).
    #[arg(long, default_value = "ring")]
    pub comm: String,
    /// Timed steps per run (and per profile).
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
}

/// Runs the comparison and prints one row per (model, bandwidth, overlap).
pub fn run(a: SimCheckArgs) -> Result<(), String> {
    if a.workers < 2 || !a.batch.is_multiple_of(a.workers) {
        return Err("--workers must be at least 2 and divide --batch".into());
    }
    let comm = CommChoice::parse(&a.comm)?;
    let tmp = std::env::temp_dir().join(format!("dptrain-bench-simcheck-{}", std::process::id()));
    println!(
        "{} workers x {} thread(s), global batch {}, {}, latency {}; measured = mean emulated step, simulated from a profile measured with {} concurrent replicas",
        a.workers, a.threads, a.batch, a.comm, a.link_latency, a.workers
    );
    println!(
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
    );
    let (mut worst, mut worst_cal): (f64, f64) = (0.0, 0.0);
    let mut simulator = Simulator::new();
    for model in a.model.split(',').map(str::trim) {
        let profile = measure(model, a.batch / a.workers, a.threads, a.steps, a.workers)?;
        let spec = GridSpec {
            model: model.to_string(),
            workers: a.workers,
            batch: a.batch,
            threads: a.threads,
            steps: a.steps,
            bucket_kb: None,
        };
        for bw in a.link_bandwidth.split(',').map(str::trim) {
            let link = LinkModel {
                bandwidth_bytes_per_s: parse_bandwidth(bw)?,
                latency: parse_duration(&a.link_latency)?,
            };
            let given = link;
            let overhead = message_overhead(a.workers, &link)?;
            println!(
                "{model} at {bw}: measured per-message overhead of the emulation {:.0} us (added to the simulated latency)",
                overhead.as_secs_f64() * 1e6
            );
            let link = LinkModel {
                latency: link.latency + overhead,
                ..link
            };
            for overlap in [true, false] {
                let case = OverlapCase {
                    comm: a.comm.clone(),
                    overlap,
                    bandwidth: Some(bw.to_string()),
                    latency: Some(a.link_latency.clone()),
                };
                let measured = run_case(&spec, &case, &tmp)?.breakdown.mean;
                let step = StepConfig {
                    topology: Topology::flat(a.workers, link),
                    comm,
                    hierarchical: true,
                    overlap,
                    // The trainer's default caps, planned for the link the run was given.
                    bucket_kb: None,
                    planning_link: Some(given),
                    stragglers: Stragglers::NONE,
                };
                let sim = simulator.step(&profile, &step)?;
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
                let cal_err = 100.0 * (cal.step_ms / measured.step_ms - 1.0);
                let err = 100.0 * (sim.step_ms / measured.step_ms - 1.0);
                worst = worst.max(err.abs());
                worst_cal = worst_cal.max(cal_err.abs());
                println!(
                    "{:>10} {:>10} {:>7} {:>9.1} {:>9.1} {:>+7.1} {:>9.1} {:>+7.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                    model,
                    bw,
                    if overlap { "on" } else { "off" },
                    measured.step_ms,
                    sim.step_ms,
                    err,
                    cal.step_ms,
                    cal_err,
                    measured.exposed_comm_ms,
                    sim.exposed_ms,
                    measured.data_ms + measured.forward_ms + measured.backward_ms + measured.update_ms,
                    sim.forward_ms + sim.backward_ms + sim.update_ms
                );
                println!(
                    "RESULT dptrain simcheck model={model} bw={bw} overlap={overlap} measured_ms={:.2} simulated_ms={:.2} calibrated_ms={:.2}",
                    measured.step_ms, sim.step_ms, cal.step_ms
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "largest |error|: {worst:.1}% from the profile, {worst_cal:.1}% with the run's compute \
         (target: within 10%); exp = exposed comm, cpt = data + forward + backward + update"
    );
    Ok(())
}

/// The emulated link's software cost per message: a few-byte ring all-reduce (2(N-1)
/// dependent messages, each ~`latency` long) timed on the emulated link, minus the link model's
/// prediction, per message. Never negative.
fn message_overhead(workers: usize, link: &LinkModel) -> Result<std::time::Duration, String> {
    let bytes = 4 * workers;
    let measured = bench_allreduce(workers, bytes, CommMode::Ring, Some(*link), 40)?.time;
    let model = predicted_time(CommMode::Ring, workers, bytes, link);
    let messages = 2 * (workers - 1) as u32;
    Ok(measured.saturating_sub(model) / messages)
}
