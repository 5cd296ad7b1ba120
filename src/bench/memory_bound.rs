//! What memory allows an all-reduce between threads, measured on this machine in the same run
//! as the all-reduces (`bench allreduce` without a link): one core's copy and add rates, and
//! the *memory bound* of a sum over `W` workers.
//! (The copy and add rates price the message modes' copies and additions, the in-place rate
//! the shared-memory collective's pass: [`crate::comm::memory_cost`].)
//!
//! The bound is the least memory traffic any all-reduce of `W` buffers of `n` bytes in shared
//! memory has: every byte of every buffer is read once (it is a term of a sum) and written
//! once (it ends holding the sum), `W·n` bytes each way, at best split evenly over the `W`
//! threads: each reads `n` and writes the same `n` back. So it is measured as `W` threads at
//! once each updating `n` bytes of a buffer of its own in place (`x += 1`: read, write, no
//! second buffer), with no synchronisation, no transport and no additions of buffers (which a
//! blocked sum does in cache). With more threads than cores they share the cores, as the
//! workers do.

use super::median;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Copy, add and in-place update rates of one core while `threads` cores do the same at once (as the
/// workers' communication threads do), bytes per second of the buffer, on `bytes`-byte
/// buffers (median of `iters` after a warm-up).
pub fn memory_rates(threads: usize, bytes: usize, iters: usize) -> (f64, f64, f64) {
    let copy = on_threads(threads, bytes, iters, |src, dst| dst.copy_from_slice(src));
    let add = on_threads(threads, bytes, iters, |src, dst| {
        for (d, s) in dst.iter_mut().zip(src) {
            *d += *s;
        }
    });
    let update = on_threads(threads, bytes, iters, in_place);
    let rate = |t: f64| bytes as f64 / t.max(1e-9);
    (rate(copy), rate(add), rate(update))
}

/// Reads and writes every element of `dst` once, in place: the bound's traffic.
fn in_place(_: &[f32], dst: &mut [f32]) {
    for d in dst.iter_mut() {
        *d += 1.0;
    }
}

/// The memory bound (module docs) of summing `bytes` over `workers` threads: median over
/// `iters` (after a warm-up) of the wall time, first start to last end.
pub fn memory_bound(workers: usize, bytes: usize, iters: usize) -> Duration {
    Duration::from_secs_f64(on_threads(workers, bytes, iters, in_place))
}

/// Each of `threads` threads, at once, runs `work` on buffers of its own of `bytes`; the median
/// over `iters` (after a warm-up) of the slowest thread's seconds.
fn on_threads(threads: usize, bytes: usize, iters: usize, work: fn(&[f32], &mut [f32])) -> f64 {
    let len = bytes / 4;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let src: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
                let mut dst: Vec<f32> = (0..len).map(|i| (i % 5) as f32).collect();
                let mut spans = Vec::with_capacity(iters);
                for i in 0..=iters {
                    barrier.wait();
                    let t0 = Instant::now();
                    work(&src, &mut dst);
                    std::hint::black_box(&mut dst);
                    if i > 0 {
                        spans.push((t0, Instant::now()));
                    }
                }
                spans
            })
        })
        .collect();
    let spans: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("a memory-bound thread panicked"))
        .collect();
    median(&mut super::wall_times(&spans))
}
