//! `dptrain bench allreduce`: time, algorithm bandwidth and bus bandwidth of an in-process
//! all-reduce per size and mode, with nccl-tests' definitions:
//! algbw = bytes / time, busbw = algbw * 2(N-1)/N.

use super::median;
use crate::comm::{all_reduce_sum, CommMode, InProcessFabric, LinkModel, Transport};
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

/// Runs `iters` timed all-reduces (after 2 warm-ups) of `bytes` with `workers` threads.
pub fn bench_allreduce(
    workers: usize,
    bytes: usize,
    mode: CommMode,
    link: Option<LinkModel>,
    iters: usize,
) -> Result<AllReduceRow, String> {
    let len = bytes / 4;
    let fabric = InProcessFabric::new(workers, link, Duration::from_secs(120));
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
