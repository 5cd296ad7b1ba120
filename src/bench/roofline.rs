//! `dptrain bench roofline`: this machine's ceilings, measured. The arithmetic peak is a
//! register-only FMA loop in the ISA the kernels use (`backend::fma_loop`), on one core and on
//! every core at once; the GEMM's own ceiling is its micro-kernel with every operand in L1
//! (`backend::gemm_tile_loop`), on one core; the memory rates are one core's copy and add on
//! buffers far larger than the caches ([`super::memory_bound::memory_rates`]), alone and with
//! every core busy.
//!
//! `bench step` divides each model's achieved GFLOP/s by [`fma_peak`] at its thread count, so
//! the fraction it prints is of a ceiling measured in the same run, on the same machine.

use std::sync::Barrier;
use std::time::Instant;

/// FMA-loop iterations per timed round: about 50 ms on a 3 GHz core (12 FMAs an iteration, two
/// a cycle), long enough that the clock's resolution and the threads' start do not show.
const ITERATIONS: u64 = 25_000_000;
/// Timed rounds: the FMA peak is the fastest, the memory rates the median.
const ROUNDS: usize = 5;
/// Buffer bytes for the memory rates: 64 MiB, twice the largest L3 of the machines this project
/// runs on, so every pass streams from memory.
const MEMORY_BYTES: usize = 64 << 20;

/// The FMA peak of `threads` threads running the loop at once: total GFLOP/s (floating-point
/// operations over the wall time from the first start to the last end) of the fastest of
/// `ROUNDS` rounds after one warm-up round; and the ISA measured. The fastest, not the
/// median: a ceiling is what the core can do, and other work on the machine only ever slows
/// a round (a median of this busy 2-core machine once read 168 GFLOP/s for 212, and every
/// fraction of peak `bench step` printed in that run was a quarter too high).
pub fn fma_peak(threads: usize) -> (f64, &'static str) {
    let threads = threads.max(1);
    let barrier = Barrier::new(threads);
    let mut isa = "";
    let spans: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut spans = Vec::with_capacity(ROUNDS);
                    let mut name = "";
                    for round in 0..=ROUNDS {
                        barrier.wait();
                        let t0 = Instant::now();
                        let (_, isa) = crate::backend::fma_loop(ITERATIONS);
                        name = isa;
                        if round > 0 {
                            spans.push((t0, Instant::now()));
                        }
                    }
                    (spans, name)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (spans, name) = h.join().expect("an FMA-loop thread panicked");
                isa = name;
                spans
            })
            .collect()
    });
    let per_round = flops_per_round() * threads as f64;
    let secs = super::wall_times(&spans)
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    (per_round / secs / 1e9, isa)
}

/// GEMM micro-kernel calls per timed round: about 50 ms at 180 GFLOP/s (one call of the
/// AVX-512 tile is 14 x 32 x 384 FMAs, 344 kFLOP).
const GEMM_CALLS: u64 = 25_000;

/// The GEMM micro-kernel's ceiling on one core ([`crate::backend::gemm_tile_loop`]): GFLOP/s
/// of the fastest of `ROUNDS` rounds after a warm-up round (fastest for the reason
/// [`fma_peak`] gives).
pub fn gemm_tile_peak() -> f64 {
    crate::backend::gemm_tile_loop(GEMM_CALLS);
    (0..ROUNDS)
        .map(|_| {
            let t0 = Instant::now();
            let flops = crate::backend::gemm_tile_loop(GEMM_CALLS);
            flops / t0.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// Floating-point operations of one thread's round.
fn flops_per_round() -> f64 {
    // The loop's count is arithmetic on the iteration count; zero iterations run nothing.
    let (per_iteration, _) = crate::backend::fma_loop(1);
    per_iteration * ITERATIONS as f64
}

/// The measured ceilings.
#[derive(Debug, Clone)]
pub struct Roofline {
    /// The ISA of the FMA loop (the kernels').
    pub isa: &'static str,
    /// Cores the all-core figures used.
    pub cores: usize,
    /// GFLOP/s of one core alone.
    pub fma_one_core: f64,
    /// GFLOP/s of every core at once, in total.
    pub fma_all_cores: f64,
    /// GFLOP/s of the GEMM's micro-kernel on one core, operands in L1, A's rows read in place:
    /// the most a layer that reads them so can reach.
    pub gemm_tile_one_core: f64,
    /// One core's copy and add rates alone, GB/s of the buffer.
    pub copy_one: f64,
    /// See `copy_one`.
    pub add_one: f64,
    /// One core's copy and add rates while every core does the same, GB/s.
    pub copy_all: f64,
    /// See `copy_all`.
    pub add_all: f64,
}

/// Measures the roofline of this machine on `cores` cores.
pub fn measure(cores: usize) -> Roofline {
    let (fma_one_core, isa) = fma_peak(1);
    let (fma_all_cores, _) = fma_peak(cores);
    let gemm_tile_one_core = gemm_tile_peak();
    let (copy_one, add_one, _) = super::memory_bound::memory_rates(1, MEMORY_BYTES, ROUNDS);
    let (copy_all, add_all, _) = super::memory_bound::memory_rates(cores, MEMORY_BYTES, ROUNDS);
    Roofline {
        isa,
        cores,
        fma_one_core,
        fma_all_cores,
        gemm_tile_one_core,
        copy_one: copy_one / 1e9,
        add_one: add_one / 1e9,
        copy_all: copy_all / 1e9,
        add_all: add_all / 1e9,
    }
}

impl Roofline {
    /// The figures on the terminal, with `RESULT` lines.
    pub fn terminal(&self) -> String {
        format!(
            "FMA peak ({isa}): {one:.1} GFLOP/s on one core, {all:.1} GFLOP/s on {c} cores ({per:.1} each)\n\
             GEMM micro-kernel, operands in L1: {gt:.1} GFLOP/s on one core ({gp:.0}% of the FMA peak)\n\
             memory, one core alone: copy {co:.2} GB/s, add {ao:.2} GB/s ({mb} MiB buffers)\n\
             memory, each of {c} cores at once: copy {ca:.2} GB/s, add {aa:.2} GB/s\n\
             RESULT roofline fma_gflops threads=1 value={one:.1}\n\
             RESULT roofline fma_gflops threads={c} value={all:.1}\n\
             RESULT roofline gemm_tile_gflops threads=1 value={gt:.1}",
            isa = self.isa,
            gt = self.gemm_tile_one_core,
            gp = 100.0 * self.gemm_tile_one_core / self.fma_one_core,
            one = self.fma_one_core,
            all = self.fma_all_cores,
            c = self.cores,
            per = self.fma_all_cores / self.cores as f64,
            co = self.copy_one,
            ao = self.add_one,
            ca = self.copy_all,
            aa = self.add_all,
            mb = MEMORY_BYTES >> 20,
        )
    }
}

/// Arguments of `dptrain bench roofline`.
#[derive(Debug, Clone, clap::Args)]
pub struct RooflineArgs {
    /// Cores for the all-core figures, at most every core this process may use (the
    /// default).
    #[arg(long)]
    pub cores: Option<usize>,
}

/// Runs `dptrain bench roofline`.
pub fn run_command(a: RooflineArgs) -> Result<(), String> {
    let available = crate::limits::cores();
    let cores = a.cores.unwrap_or(available);
    // Each core's measurement has its own buffers; past the cores, threads time-slice and a
    // per-core peak means nothing.
    if cores == 0 || cores > available {
        return Err(format!(
            "--cores {cores}: the all-core figures are measured on 1 to {available} cores \
             (the cores this process may use)"
        ));
    }
    crate::outln!("{}", measure(cores).terminal());
    Ok(())
}
