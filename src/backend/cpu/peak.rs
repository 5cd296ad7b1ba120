//! The machine's arithmetic peak, measured: a register-only fused multiply-add loop in the
//! instruction set the GEMM's micro-kernel uses (`bench roofline`, and the fraction of peak
//! `bench step` prints).
//!
//! Each iteration issues one FMA into each of `ACC` independent accumulators. With an FMA
//! latency of 4-5 cycles and two FMA pipes (Zen 3, Skylake-SP and later) ten in flight keep both
//! pipes busy; twelve leave a margin. Nothing is loaded or stored inside the loop, so the time
//! is the FMA throughput alone: the ceiling no kernel in that ISA can pass.

use super::gemm::isa;
#[cfg(target_arch = "x86_64")]
use super::gemm::Isa;
use std::hint::black_box;

/// Independent accumulators: enough to hide the FMA latency on both pipes (module docs).
const ACC: usize = 12;

/// Runs `iterations` iterations of the loop on the calling thread; returns the floating-point
/// operations it did (2 per lane per FMA) and the ISA's name.
pub fn fma_loop(iterations: u64) -> (f64, &'static str) {
    let iterations = black_box(iterations);
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returned Avx512 only after detecting avx512f at run time.
        Isa::Avx512 => unsafe {
            black_box(x86::avx512(iterations));
            (flops(iterations, 16), "avx512")
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` returned Avx2 only after detecting avx2 and fma at run time.
        Isa::Avx2 => unsafe {
            black_box(x86::avx2(iterations));
            (flops(iterations, 8), "avx2+fma")
        },
        _ => {
            black_box(portable(iterations));
            (flops(iterations, 8), "portable")
        }
    }
}

/// The GEMM's own ceiling: `calls` multiplications of one micro-kernel tile (the kernel's
/// tallest `mr` rows by B's widest panel, one `KC`-deep block, A row-major) through the same
/// entry point the layers use, every operand in L1 after the first call. Returns the
/// floating-point operations done. What this reaches below the FMA loop is the micro-kernel's
/// inner loop itself (its loads of B and broadcasts of A beside the FMAs): no layer that reads
/// A's rows in place (a convolution's forward and stride-1 input gradient) does better, and a
/// packed A (the weight gradients) only a few points; `bench roofline` prints both.
pub fn gemm_tile_loop(calls: u64) -> f64 {
    use super::gemm::{gemm_packed, row_panel, MatRef, PackedB, KC};
    let (m, n, k) = (row_panel(), isa().nrs()[0], KC);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.125).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.25).collect();
    let mut c = vec![0f32; m * n];
    let mut packed = PackedB::default();
    packed.pack(MatRef::rows(&b, n), k, n);
    for _ in 0..black_box(calls) {
        gemm_packed(
            m,
            n,
            k,
            MatRef::rows(black_box(&a), k),
            &packed,
            &mut c,
            n,
            false,
        );
    }
    black_box(&c);
    (2 * m * n * k) as f64 * calls as f64
}

fn flops(iterations: u64, lanes: usize) -> f64 {
    iterations as f64 * (ACC * lanes * 2) as f64
}

/// The portable kernel's form: eight-lane arrays the compiler vectorises as it can.
fn portable(iterations: u64) -> f32 {
    let mut acc = [[0.0f32; 8]; ACC];
    let (a, b) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..iterations {
        for lane in acc.iter_mut() {
            for v in lane.iter_mut() {
                *v = v.mul_add(a, b);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ACC;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(iterations: u64) -> f32 {
        let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        let mut acc = [_mm256_setzero_ps(); ACC];
        for _ in 0..iterations {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        let mut s = _mm256_setzero_ps();
        for v in acc {
            s = _mm256_add_ps(s, v);
        }
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out.iter().sum()
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512(iterations: u64) -> f32 {
        let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut acc = [_mm512_setzero_ps(); ACC];
        for _ in 0..iterations {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        let mut s = _mm512_setzero_ps();
        for v in acc {
            s = _mm512_add_ps(s, v);
        }
        _mm512_reduce_add_ps(s)
    }
}
