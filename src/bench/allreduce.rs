//! `dptrain bench allreduce`: time, algorithm bandwidth and bus bandwidth of an all-reduce per
//! size and mode, with nccl-tests' definitions: algbw = bytes / time,
//! busbw = algbw * 2(N-1)/N. In-process ([`bench_allreduce`]: worker threads, optionally over
//! an emulated link) or across MPI ranks ([`bench_allreduce_processes`], under `mpirun`: our
//! modes next to `MPI_Allreduce`, flat and hierarchical).

use super::args::{float_sizes, list, parse_link, parse_size};
use super::median;
use crate::comm::memory_cost::{in_memory_time, InMemory, MemoryRates};
use crate::comm::{
    all_reduce_sum, predicted_time, AcrossOp, CommMode, Hierarchy, InProcessFabric, LinkModel,
    Transport,
};
use crate::config::TransportKind;
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

impl AllReduceRow {
    /// The row under the name the table shows.
    pub fn named(self, name: String) -> OpRow {
        OpRow {
            name,
            bytes: self.bytes,
            time: self.time,
            algbw: self.algbw,
            busbw: self.busbw,
            model: None,
            bound: None,
        }
    }
}

/// How long a collective of the benchmark may wait for a peer, in seconds: training's default
/// `--comm-timeout`.
pub const TIMEOUT_S: u64 = crate::config::DEFAULT_COMM_TIMEOUT_S as u64;

/// Runs `iters` timed all-reduces (after 2 warm-ups) of `bytes` with `workers` threads.
pub fn bench_allreduce(
    workers: usize,
    bytes: usize,
    mode: CommMode,
    link: Option<LinkModel>,
    iters: usize,
) -> Result<AllReduceRow, String> {
    let t = time_in_process(workers, bytes, BucketOp::AllReduce(mode), link, iters)?;
    let algbw = bytes as f64 / t.as_secs_f64();
    let n = workers as f64;
    Ok(AllReduceRow {
        mode,
        bytes,
        time: t,
        algbw,
        busbw: algbw * 2.0 * (n - 1.0) / n,
    })
}

/// The median over `iters` timed runs (after 2 warm-ups) of `op` on `bytes` with `workers`
/// threads of one fabric, each run's time from its first worker's start to its last's end.
pub fn time_in_process(
    workers: usize,
    bytes: usize,
    op: BucketOp,
    link: Option<LinkModel>,
    iters: usize,
) -> Result<Duration, String> {
    let len = bytes / 4;
    let fabric = InProcessFabric::new(workers, link, Duration::from_secs(TIMEOUT_S));
    let barrier = Arc::new(Barrier::new(workers));
    let handles: Vec<_> = fabric
        .into_iter()
        .map(|t| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> Result<Vec<(Instant, Instant)>, String> {
                let mut buf: Vec<f32> =
                    (0..len).map(|i| (i % 7) as f32 + t.rank() as f32).collect();
                let mut scratch = Vec::new();
                let mut spans = Vec::new();
                let warm_up = warm_up_iterations(bytes);
                for i in 0..iters + warm_up {
                    barrier.wait();
                    let t0 = Instant::now();
                    op.run(&t as &dyn Transport, &mut buf, i as u64, &mut scratch)
                        .map_err(|e| e.to_string())?;
                    if i >= warm_up {
                        spans.push((t0, Instant::now()));
                    }
                }
                Ok(spans)
            })
        })
        .collect();
    // A collective takes from its first rank's start to its last rank's end.
    let mut spans = Vec::with_capacity(workers);
    for h in handles {
        spans.push(
            h.join()
                .map_err(|_| "benchmark thread panicked".to_string())??,
        );
    }
    Ok(Duration::from_secs_f64(median(&mut super::wall_times(
        &spans,
    ))))
}

/// Untimed all-reduces before the timed ones. Small ones are all wake-ups, and the first
/// dozen of a process's first row took up to 14x longer than later rows of the same operation
/// (threads' stacks faulted in, the scheduler placing them: 2-worker `shm` at 4 KB 13-14 us
/// after 2, 1.0 us as a later row); large ones need only their pages touched.
fn warm_up_iterations(bytes: usize) -> usize {
    if bytes <= 1 << 20 {
        20
    } else {
        2
    }
}

/// One row of an all-reduce table: an operation by name.
#[derive(Debug, Clone)]
pub struct OpRow {
    /// The operation as the table shows it (`ring`, `auto:redundant`, and across processes
    /// `2d:ring`, `leader:ring`, `mpi-native`, ...).
    pub name: String,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Median time of one all-reduce (the slowest worker's, per iteration).
    pub time: Duration,
    /// Algorithm bandwidth, bytes/s.
    pub algbw: f64,
    /// Bus bandwidth over every worker of the run, bytes/s.
    pub busbw: f64,
    /// What the cost model predicts for it, where it prices it (in one process).
    pub model: Option<Duration>,
    /// The memory bound of the same sum measured in the same run (in one process, no link).
    pub bound: Option<Duration>,
}

/// The operations compared at `bytes` over `processes` x `workers`: our modes flat, with
/// several workers per process also hierarchically, `auto` as a training run would pick it
/// (shown as `auto:MODE`), and MPI's own all-reduce.
pub fn process_ops(processes: usize, workers: usize, bytes: usize) -> Vec<(String, BucketOp)> {
    let mut ops: Vec<(String, BucketOp)> = CommMode::ALL
        .iter()
        .map(|&m| (m.to_string(), BucketOp::AllReduce(m)))
        .collect();
    // `auto` exactly as the planning rules pick it for one bucket of `bytes` in a run of
    // `processes` x `workers` (the leaders' phase when hierarchical).
    let auto_op = crate::plan::PlanInputs::defaults(processes, workers, None)
        .bucket_ops(&crate::parallel::BucketPlan::new(&[bytes / 4], 0, 0))
        .remove(0);
    let hier = |hierarchy, across| BucketOp::Hierarchical {
        hierarchy,
        across,
        workers_per_process: workers,
    };
    if workers > 1 {
        for h in Hierarchy::ALL {
            for m in CommMode::ALL {
                let op = hier(h, AcrossOp::AllReduce(m));
                ops.push((op.to_string(), op));
            }
        }
        ops.push((format!("auto:{auto_op}"), auto_op));
        let native = hier(Hierarchy::Leader, AcrossOp::Native);
        ops.push((native.to_string(), native));
    } else {
        ops.push((format!("auto:{auto_op}"), auto_op));
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
) -> Result<Vec<OpRow>, String> {
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
        .transports(workers, None)?
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
            OpRow {
                name: name.clone(),
                bytes: *bytes,
                time: Duration::from_secs_f64(t),
                algbw,
                busbw: algbw * 2.0 * (n - 1.0) / n,
                model: None,
                bound: None,
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
        let warm_up = warm_up_iterations(*bytes);
        for i in 0..iters + warm_up {
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
            if i >= warm_up {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        out.push(times);
    }
    Ok(out)
}

/// Arguments of `dptrain bench allreduce`.
#[derive(Debug, Clone, clap::Args)]
pub struct AllReduceArgs {
    /// Workers (in-process), or worker threads per MPI rank [default: 2 in-process, 1 per
    /// rank with --transport mpi].
    #[arg(long)]
    pub workers: Option<usize>,
    /// inproc (worker threads of this process) or mpi (run under mpirun; only rank 0
    /// prints).
    #[arg(long, default_value = "inproc")]
    pub transport: String,
    /// Sizes in bytes, comma-separated; K, M suffixes allowed.
    #[arg(long, default_value = "4K,64K,1M,16M,64M")]
    pub sizes: String,
    /// Modes, comma-separated, or all.
    #[arg(long, default_value = "all")]
    pub comm: String,
    /// Emulated link bandwidth (e.g. 10Gbit).
    #[arg(allow_hyphen_values = true, long)]
    pub link_bandwidth: Option<String>,
    /// Emulated link latency (e.g. 5us).
    #[arg(allow_hyphen_values = true, long)]
    pub link_latency: Option<String>,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
}

/// Width of the operation column of the in-process table (modes, `auto:MODE`).
pub const IN_PROCESS_NAME_WIDTH: usize = 10;

/// Width of the operation column of the multi-process table (`auto:hier:MODE` and the like).
pub const PROCESS_NAME_WIDTH: usize = 20;

/// An all-reduce table: time, algbw and busbw of operations by size.
#[derive(Debug, Clone)]
pub struct AllReduceTable {
    /// Width of the operation column on the terminal.
    pub name_width: usize,
    /// Rows, in measuring order.
    pub rows: Vec<OpRow>,
}

impl OpRow {
    /// The row on the terminal, its operation column `name_width` wide.
    pub fn terminal(&self, name_width: usize) -> String {
        format!(
            "{:>12} {:>name_width$} {:>12.1} {:>12.3} {:>12.3} {:>10} {:>8}",
            self.bytes,
            self.name,
            self.time.as_secs_f64() * 1e6,
            self.algbw / 1e9,
            self.busbw / 1e9,
            self.model_us(),
            self.times_bound(),
        )
    }

    /// The model's prediction in microseconds, or `-`.
    fn model_us(&self) -> String {
        self.model
            .map_or("-".into(), |m| format!("{:.1}", m.as_secs_f64() * 1e6))
    }

    /// The time over the memory bound, or `-`.
    fn times_bound(&self) -> String {
        self.bound.map_or("-".into(), |b| {
            format!("{:.2}", self.time.as_secs_f64() / b.as_secs_f64())
        })
    }

    /// The row in markdown, its size as `4K`, `16M`.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {} | {:.1} | {:.3} | {:.3} | {} | {} |\n",
            size_label(self.bytes),
            self.name,
            self.time.as_secs_f64() * 1e6,
            self.algbw / 1e9,
            self.busbw / 1e9,
            self.model_us(),
            self.times_bound(),
        )
    }
}

impl AllReduceTable {
    /// The terminal table's header, its operation column `name_width` wide.
    pub fn terminal_header(name_width: usize) -> String {
        format!(
            "{:>12} {:>name_width$} {:>12} {:>12} {:>12} {:>10} {:>8}",
            "bytes", "mode", "time us", "algbw GB/s", "busbw GB/s", "model us", "x bound"
        )
    }

    /// The table on the terminal: header and rows.
    pub fn terminal(&self) -> String {
        let mut s = Self::terminal_header(self.name_width);
        for r in &self.rows {
            s += "\n";
            s += &r.terminal(self.name_width);
        }
        s
    }

    /// The table in markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| bytes | mode | time us | algbw GB/s | busbw GB/s | model us | x bound |\n\
             |---:|---|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            s += &r.markdown();
        }
        s
    }
}

/// A size as the flags write it: `64M`, `4K`, or bytes when not a whole number of either.
pub fn size_label(bytes: usize) -> String {
    const MIB: usize = 1 << 20;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}M", bytes / MIB)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

/// Runs `dptrain bench allreduce`: in-process, or one rank of an MPI run.
pub fn run_command(a: AllReduceArgs) -> Result<(), String> {
    let transport = TransportKind::parse(&a.transport)?;
    let mpi = transport == TransportKind::Mpi;
    let workers = a.workers.unwrap_or(if mpi { 1 } else { 2 });
    super::args::check_timed_counts(&[("--iters", a.iters)])?;
    if workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let sizes = float_sizes(&list("--sizes", &a.sizes, |s| {
        parse_size(s).map_err(|e| format!("--sizes: {e}"))
    })?)?;
    if mpi {
        if a.comm != "all" || a.link_bandwidth.is_some() || a.link_latency.is_some() {
            return Err(
                "bench allreduce --transport mpi compares every mode on the \
                                real link: leave out --comm and --link-*"
                    .into(),
            );
        }
        return run_processes(workers, &sizes, a.iters);
    }
    run_in_process(&a, workers, &sizes)
}

/// The operations `--comm` names in one process: modes, `shm` (only without a link: an
/// emulated link says the workers share no memory), and `auto` as a training run would pick
/// it for one bucket of each size (shown as `auto:OP`, added per size).
fn comm_ops(comm: &str, in_memory: bool) -> Result<(Vec<BucketOp>, bool), String> {
    let given = if comm == "all" {
        Vec::new()
    } else {
        super::args::entries("--comm", comm)?
    };
    let with_auto = comm == "all" || given.contains(&"auto");
    let mut ops: Vec<BucketOp> = Vec::new();
    if comm == "all" {
        if in_memory {
            ops.push(BucketOp::SharedMemory);
        }
        ops.extend(CommMode::ALL.iter().map(|&m| BucketOp::AllReduce(m)));
    }
    for name in given.iter().filter(|&&n| n != "auto") {
        if *name == "shm" {
            if !in_memory {
                return Err(
                    "--comm shm reads the other workers' buffers in place: an emulated \
                            link says they share no memory; leave out --link-* for it"
                        .into(),
                );
            }
            ops.push(BucketOp::SharedMemory);
        } else {
            let mode = name
                .parse::<CommMode>()
                .map_err(|e| format!("--comm: {e} (or shm, auto, all)"))?;
            ops.push(BucketOp::AllReduce(mode));
        }
    }
    Ok((ops, with_auto))
}

/// What the cost model predicts for `op` on `bytes` over `workers` threads: memory work
/// without a link ([`crate::comm::memory_cost`]), the alpha-beta model with one.
fn predicted(
    op: BucketOp,
    workers: usize,
    bytes: usize,
    link: Option<LinkModel>,
) -> Option<Duration> {
    let way = match op {
        BucketOp::SharedMemory => InMemory::SharedMemory,
        BucketOp::AllReduce(m) => match link {
            Some(l) => return Some(predicted_time(m, workers, bytes, &l)),
            None => InMemory::Messages(m),
        },
        _ => return None,
    };
    let cores = crate::limits::cores();
    Some(in_memory_time(
        way,
        workers,
        bytes,
        cores,
        &MemoryRates::MEASURED,
    ))
}

/// Refuses sizes whose largest message cannot cross the emulated link within the benchmark's
/// timeout (a worker would fail on it mid-run, its peer reporting it gone), naming this
/// command's options. The largest message is the whole buffer for tree, halving-doubling (its
/// fold of a non-power-of-two rank count) and redundant, a ring's share of it for ring.
fn check_messages_arrive(
    a: &AllReduceArgs,
    link: &LinkModel,
    ops: &[BucketOp],
    with_auto: bool,
    workers: usize,
    sizes: &[usize],
) -> Result<(), String> {
    let buffer = sizes.iter().copied().max().unwrap_or(0);
    let ring_only = !with_auto
        && ops
            .iter()
            .all(|op| *op == BucketOp::AllReduce(CommMode::Ring));
    let largest = if ring_only {
        buffer.div_ceil(workers.max(1))
    } else {
        buffer
    };
    let secs = link.arrival_s(largest);
    if secs < TIMEOUT_S as f64 {
        return Ok(());
    }
    Err(format!(
        "--link-bandwidth {} moves a {largest}-byte message (of the {buffer}-byte buffer) in \
         {secs:.0} s, past the {TIMEOUT_S} s a message may take here: give a faster link or \
         smaller --sizes",
        a.link_bandwidth.as_deref().unwrap_or_default()
    ))
}

/// `bench allreduce` in this process: worker threads, optionally over an emulated link; the
/// table printed row by row as it is measured. Without a link each size's memory bound is
/// measured too ([`super::memory_bound`]) and every row says how far above it it is.
fn run_in_process(a: &AllReduceArgs, workers: usize, sizes: &[usize]) -> Result<(), String> {
    let link = parse_link(&a.link_bandwidth, &a.link_latency)?;
    let (ops, with_auto) = comm_ops(&a.comm, link.is_none())?;
    if let Some(l) = &link {
        crate::config::check_link_against_timeout(
            l,
            TIMEOUT_S as f64,
            crate::config::LinkFlags::Link,
            None,
        )?;
        check_messages_arrive(a, l, &ops, with_auto, workers, sizes)?;
    }
    crate::comm::transport::check_in_process_workers(workers)?;
    // Each worker holds the buffer and a scratch copy; the fabric its channels and the
    // messages in flight (one to every peer at once in the redundant mode).
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let redundant = with_auto || ops.contains(&BucketOp::AllReduce(CommMode::Redundant));
    let inputs = crate::plan::memory::MemoryInputs {
        graph: None,
        batch_per_worker: 0,
        workers,
        threads: 0,
        training: false,
        data_buffers: 0,
        other_threads: 0,
        largest_message: largest / 4,
        // No warm-up here: a worker's messages are those in flight.
        messages_per_worker: if redundant { workers - 1 } else { 2 },
        extra_per_worker: Some(("the buffer and its scratch", 2.0 * largest as f64)),
        loaded: 0.0,
        conv_algo: crate::backend::ConvAlgo::Direct,
        workers_flag: Some("--workers"),
        message_flag: Some("--sizes"),
    };
    crate::plan::memory::estimate(&inputs)
        .check(&format!(
            "an all-reduce of {largest} bytes on {workers} workers"
        ))
        .map_err(|e| e.to_string())?;
    crate::outln!(
        "all-reduce, {workers} workers, link: {}",
        link.map_or("none (memory)".to_string(), |l| format!(
            "{:.0} MB/s, {:?}",
            l.bandwidth_bytes_per_s / 1e6,
            l.latency
        ))
    );
    if link.is_none() {
        let probe = largest.clamp(1 << 20, 64 << 20);
        let cores = workers.min(crate::limits::cores());
        let (copy, add, update) = super::memory_bound::memory_rates(cores, probe, a.iters.max(3));
        let assumed = MemoryRates::MEASURED;
        crate::outln!(
            "memory, one core of {cores} busy, {} buffers: copy {:.2} GB/s, add {:.2} GB/s, in \
             place {:.2} GB/s (the model assumes {:.2}, {:.2}, {:.2}); x bound = time / the \
             memory bound measured per size",
            size_label(probe),
            copy / 1e9,
            add / 1e9,
            update / 1e9,
            assumed.copy_bytes_per_s / 1e9,
            assumed.add_bytes_per_s / 1e9,
            assumed.in_place_bytes_per_s / 1e9,
        );
    }
    let width = IN_PROCESS_NAME_WIDTH;
    crate::outln!("{}", AllReduceTable::terminal_header(width));
    let n = workers as f64;
    for &bytes in sizes {
        let bound = link
            .is_none()
            .then(|| super::memory_bound::memory_bound(workers, bytes, a.iters));
        let auto = with_auto.then(|| {
            crate::plan::PlanInputs::defaults(1, workers, link)
                .bucket_ops(&crate::parallel::BucketPlan::new(&[bytes / 4], 0, 0))
                .remove(0)
        });
        let rows = ops
            .iter()
            .map(|&op| (op, false))
            .chain(auto.map(|op| (op, true)));
        for (op, is_auto) in rows {
            let time = time_in_process(workers, bytes, op, link, a.iters)?;
            let algbw = bytes as f64 / time.as_secs_f64();
            let row = OpRow {
                name: if is_auto {
                    format!("auto:{op}")
                } else {
                    op.to_string()
                },
                bytes,
                time,
                algbw,
                busbw: algbw * 2.0 * (n - 1.0) / n,
                model: predicted(op, workers, bytes, link),
                bound,
            };
            crate::outln!("{}", row.terminal(width));
        }
    }
    Ok(())
}

/// `bench allreduce --transport mpi`: this process is one rank; rank 0 prints the table.
fn run_processes(workers: usize, sizes: &[usize], iters: usize) -> Result<(), String> {
    let timeout = Duration::from_secs(TIMEOUT_S);
    let group = ProcessGroup::start(TransportKind::Mpi, timeout)?;
    let result = bench_allreduce_processes(&group, workers, sizes, iters);
    let (rank, processes) = (group.rank(), group.size());
    group.end(result.is_ok());
    let rows = result.map_err(|e| format!("rank {rank} of {processes}: {e}"))?;
    if rank != 0 {
        return Ok(());
    }
    crate::outln!(
        "all-reduce over MPI: {processes} processes x {workers} workers ({} in all), median of \
         {iters}; busbw = algbw * 2(N-1)/N",
        processes * workers
    );
    let table = AllReduceTable {
        name_width: PROCESS_NAME_WIDTH,
        rows,
    };
    crate::outln!("{}", table.terminal());
    Ok(())
}
