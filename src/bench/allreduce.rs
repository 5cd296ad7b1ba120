//! `dptrain bench allreduce`: time, algorithm bandwidth and bus bandwidth of an all-reduce per
//! size and mode, with nccl-tests' definitions: algbw = bytes / time,
//! busbw = algbw * 2(N-1)/N. In-process ([`bench_allreduce`]: worker threads, optionally over
//! an emulated link) or across MPI ranks ([`bench_allreduce_processes`], under `mpirun`: our
//! modes next to `MPI_Allreduce`, flat and hierarchical).

use super::median;
use crate::comm::{
    all_reduce_sum, choose_mode, CommMode, InProcessFabric, LeaderOp, LinkModel, Transport,
};
use crate::parallel::BucketOp;
use crate::train::ProcessGroup;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// One row of the table.
#[derive(Debug, Clone)]
pub struct AllReduceRow {
    /// Mode.
    pub mode: CommMode,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Median time of one all-reduce.
    pub time: Duration,
    /// Algorithm bandwidth, bytes/s.
    pub algbw: f64,
    /// Bus bandwidth, bytes/s.
    pub busbw: f64,
}

/// How long a collective of the benchmark may wait for a peer, in seconds.
pub const TIMEOUT_S: u64 = 120;

/// Runs `iters` timed all-reduces (after 2 warm-ups) of `bytes` with `workers` threads.
pub fn bench_allreduce(
    workers: usize,
    bytes: usize,
    mode: CommMode,
    link: Option<LinkModel>,
    iters: usize,
) -> Result<AllReduceRow, String> {
    let len = bytes / 4;
    let fabric = InProcessFabric::new(workers, link, Duration::from_secs(TIMEOUT_S));
    let barrier = Arc::new(Barrier::new(workers));
    let handles: Vec<_> = fabric
        .into_iter()
        .map(|t| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Result<Vec<f64>, String> {
                let mut buf: Vec<f32> =
                    (0..len).map(|i| (i % 7) as f32 + t.rank() as f32).collect();
                let mut scratch = Vec::new();
                let mut times = Vec::new();
                for i in 0..iters + 2 {
                    barrier.wait();
                    let t0 = Instant::now();
                    all_reduce_sum(mode, &t as &dyn Transport, &mut buf, i as u64, &mut scratch)
                        .map_err(|e| e.to_string())?;
                    let dt = t0.elapsed().as_secs_f64();
                    if i >= 2 {
                        times.push(dt);
                    }
                }
                Ok(times)
            })
        })
        .collect();
    // A collective ends when its slowest rank ends: take the max over ranks per iteration.
    let mut per_iter = vec![0f64; iters];
    for h in handles {
        let times = h
            .join()
            .map_err(|_| "benchmark thread panicked".to_string())??;
        for (m, t) in per_iter.iter_mut().zip(times) {
            *m = m.max(t);
        }
    }
    let t = median(&mut per_iter);
    let algbw = bytes as f64 / t;
    let n = workers as f64;
    Ok(AllReduceRow {
        mode,
        bytes,
        time: Duration::from_secs_f64(t),
        algbw,
        busbw: algbw * 2.0 * (n - 1.0) / n,
    })
}

/// One row of the multi-process table: an operation by name.
#[derive(Debug, Clone)]
pub struct ProcessRow {
    /// The operation as the table shows it (`ring`, `hier:ring`, `auto:redundant`,
    /// `mpi-native`, ...).
    pub name: String,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Median time of one all-reduce (the slowest worker's, per iteration).
    pub time: Duration,
    /// Algorithm bandwidth, bytes/s.
    pub algbw: f64,
    /// Bus bandwidth over every worker of the run, bytes/s.
    pub busbw: f64,
}

/// The operations compared at `bytes` over `processes` x `workers`: our modes flat, with
/// several workers per process also hierarchically, `auto` as a training run would pick it
/// (shown as `auto:MODE`), and MPI's own all-reduce.
pub fn process_ops(processes: usize, workers: usize, bytes: usize) -> Vec<(String, BucketOp)> {
    let mut ops: Vec<(String, BucketOp)> = CommMode::ALL
        .iter()
        .map(|&m| (m.to_string(), BucketOp::AllReduce(m)))
        .collect();
    let auto = choose_mode(processes, bytes, &crate::plan::BETWEEN_PROCESSES_LINK);
    let hier = |leader| BucketOp::Hierarchical {
        leader,
        workers_per_process: workers,
    };
    if workers > 1 {
        for m in CommMode::ALL {
            ops.push((format!("hier:{m}"), hier(LeaderOp::AllReduce(m))));
        }
        ops.push((format!("auto:hier:{auto}"), hier(LeaderOp::AllReduce(auto))));
        ops.push(("hier:mpi-native".into(), hier(LeaderOp::Native)));
    } else {
        ops.push((format!("auto:{auto}"), BucketOp::AllReduce(auto)));
        ops.push(("mpi-native".into(), BucketOp::Native));
    }
    ops
}

/// Times every operation of [`process_ops`] at every size across the processes of `group`,
/// `workers` threads each: `iters` timed runs after 2 warm-ups, every worker of the run in
/// step before each (a small all-reduce as the barrier). Collective: every process calls it
/// with the same arguments; every process gets the table.
pub fn bench_allreduce_processes(
    group: &ProcessGroup,
    workers: usize,
    sizes: &[usize],
    iters: usize,
) -> Result<Vec<ProcessRow>, String> {
    let processes = group.size();
    let plan: Vec<(usize, String, BucketOp)> = sizes
        .iter()
        .flat_map(|&b| {
            process_ops(processes, workers, b)
                .into_iter()
                .map(move |(name, op)| (b, name, op))
        })
        .collect();
    let transports = group
        .transports(workers)?
        .ok_or("bench allreduce --transport mpi runs under mpirun with MPI started")?;
    // Per operation and iteration, the slowest of this process's workers.
    let local: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .map(|t| {
                let plan = &plan;
                s.spawn(move || time_ops(t.as_ref(), plan, iters))
            })
            .collect();
        let mut slowest = vec![vec![0f64; iters]; plan.len()];
        for h in handles {
            let times = h
                .join()
                .map_err(|_| "benchmark thread panicked".to_string())??;
            for (m, t) in slowest.iter_mut().flatten().zip(times.iter().flatten()) {
                *m = m.max(*t);
            }
        }
        Ok::<_, String>(slowest)
    })?;
    // ... and of every process's.
    let mine: Vec<u8> = local
        .iter()
        .flatten()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let all = group.all_gather(&mine, 100)?;
    let mut slowest = local;
    for other in &all {
        let values = other
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")));
        for (m, t) in slowest.iter_mut().flatten().zip(values) {
            *m = m.max(t);
        }
    }
    let n = (processes * workers) as f64;
    Ok(plan
        .iter()
        .zip(&mut slowest)
        .map(|((bytes, name, _), times)| {
            let t = median(times);
            let algbw = *bytes as f64 / t;
            ProcessRow {
                name: name.clone(),
                bytes: *bytes,
                time: Duration::from_secs_f64(t),
                algbw,
                busbw: algbw * 2.0 * (n - 1.0) / n,
            }
        })
        .collect())
}

/// One worker's part of [`bench_allreduce_processes`]: seconds per operation and iteration.
fn time_ops(
    t: &dyn Transport,
    plan: &[(usize, String, BucketOp)],
    iters: usize,
) -> Result<Vec<Vec<f64>>, String> {
    let largest = plan.iter().map(|(b, _, _)| b / 4).max().unwrap_or(0);
    let mut data = vec![0f32; largest];
    let mut scratch = Vec::new();
    let mut token = [0f32; 1];
    let mut collective = 0u64;
    let mut out = Vec::with_capacity(plan.len());
    for (bytes, name, op) in plan {
        let buf = &mut data[..bytes / 4];
        let mut times = Vec::with_capacity(iters);
        for i in 0..iters + 2 {
            for (j, x) in buf.iter_mut().enumerate() {
                *x = (j % 7) as f32 + t.rank() as f32;
            }
            collective += 1;
            all_reduce_sum(
                CommMode::Redundant,
                t,
                &mut token,
                collective << 16 | 1,
                &mut scratch,
            )
            .map_err(|e| format!("barrier before {name}: {e}"))?;
            let t0 = Instant::now();
            op.run(t, buf, collective << 16, &mut scratch)
                .map_err(|e| format!("{name}, {bytes} bytes: {e}"))?;
            if i >= 2 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        out.push(times);
    }
    Ok(out)
}
