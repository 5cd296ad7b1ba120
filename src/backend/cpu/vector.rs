//! The vectors Winograd's tile transforms run on: a few operations (load, store, fused
//! multiply-add) over one register of channels, written with the ISA's intrinsics.
//!
//! Why not arrays the compiler vectorises (what the transforms used first): at 16 lanes it
//! split each `[f32; 16]` operation into 8 + 4 + 2 + 1 + 1 lane pieces and spilled them to the
//! stack, and the full-width reload of those pieces stalled on store forwarding: a third of
//! the input transform's time sat on one store (`perf annotate`, resnet18). An intrinsic is one
//! instruction on one register.
//!
//! Every lane runs the same operations in the same order whatever the width (`fma` is fused on
//! every path), so the width never changes a bit of the result.

/// One register of `LANES` channels.
pub(super) trait Vector: Copy {
    /// Channels per register.
    const LANES: usize;
    /// All lanes zero.
    fn zero() -> Self;
    /// Lanes `0..w` of `src` (zero past `w`); `w <= LANES` and `w <= src.len()`.
    fn load(src: &[f32], w: usize) -> Self;
    /// Writes lanes `0..w` into `dst` (`w <= LANES`, `w <= dst.len()`).
    fn store(self, dst: &mut [f32], w: usize);
    /// `self + coef * v`, fused (one rounding), lane by lane.
    fn fma(self, coef: f32, v: Self) -> Self;
    /// `self + v`, lane by lane.
    fn add(self, v: Self) -> Self;
}

/// Eight lanes in a plain array: the fallback where no intrinsic path is compiled in.
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
)))]
pub(super) type Narrow = [f32; 8];

#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
)))]
impl Vector for [f32; 8] {
    const LANES: usize = 8;
    #[inline(always)]
    fn zero() -> Self {
        [0.0; 8]
    }
    #[inline(always)]
    fn load(src: &[f32], w: usize) -> Self {
        let mut v = [0.0; 8];
        v[..w].copy_from_slice(&src[..w]);
        v
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32], w: usize) {
        dst[..w].copy_from_slice(&self[..w]);
    }
    #[inline(always)]
    fn fma(self, coef: f32, v: Self) -> Self {
        std::array::from_fn(|l| coef.mul_add(v[l], self[l]))
    }
    #[inline(always)]
    fn add(self, v: Self) -> Self {
        std::array::from_fn(|l| self[l] + v[l])
    }
}

/// Eight lanes of AVX2 (the crate's x86-64-v3 baseline, so always available where compiled).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
pub(super) type Narrow = std::arch::x86_64::__m256;

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
impl Vector for std::arch::x86_64::__m256 {
    const LANES: usize = 8;
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX is enabled for the whole crate (this impl's cfg).
        unsafe { std::arch::x86_64::_mm256_setzero_ps() }
    }
    #[inline(always)]
    fn load(src: &[f32], w: usize) -> Self {
        use std::arch::x86_64::*;
        let src = &src[..w];
        // SAFETY: AVX2 is enabled for the whole crate; a full load reads 8 floats of `src`
        // (w == 8), a masked one only the `w` lanes inside it.
        unsafe {
            if w == 8 {
                _mm256_loadu_ps(src.as_ptr())
            } else {
                _mm256_maskload_ps(src.as_ptr(), avx2_mask(w))
            }
        }
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32], w: usize) {
        use std::arch::x86_64::*;
        let dst = &mut dst[..w];
        // SAFETY: as in `load`, writing only the `w` lanes inside `dst`.
        unsafe {
            if w == 8 {
                _mm256_storeu_ps(dst.as_mut_ptr(), self)
            } else {
                _mm256_maskstore_ps(dst.as_mut_ptr(), avx2_mask(w), self)
            }
        }
    }
    #[inline(always)]
    fn fma(self, coef: f32, v: Self) -> Self {
        use std::arch::x86_64::*;
        // SAFETY: FMA is enabled for the whole crate.
        unsafe { _mm256_fmadd_ps(_mm256_set1_ps(coef), v, self) }
    }
    #[inline(always)]
    fn add(self, v: Self) -> Self {
        // SAFETY: AVX is enabled for the whole crate.
        unsafe { std::arch::x86_64::_mm256_add_ps(self, v) }
    }
}

/// The mask of AVX2's masked loads and stores for lanes `0..w`.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
fn avx2_mask(w: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let w = w as i32;
    // SAFETY: AVX is enabled for the whole crate.
    unsafe {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(w), lane)
    }
}

/// Sixteen lanes of AVX-512. Only instantiated inside functions compiled with `avx512f`
/// enabled and called after it was detected (`lanes!` in `winograd.rs`): that is what makes
/// the intrinsics below sound.
#[cfg(target_arch = "x86_64")]
pub(super) type Wide = std::arch::x86_64::__m512;

#[cfg(target_arch = "x86_64")]
impl Vector for std::arch::x86_64::__m512 {
    const LANES: usize = 16;
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: see `Wide`.
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    fn load(src: &[f32], w: usize) -> Self {
        use std::arch::x86_64::*;
        let src = &src[..w];
        // SAFETY: see `Wide`; a masked load reads only the `w` lanes inside `src`.
        unsafe { _mm512_maskz_loadu_ps(wide_mask(w), src.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, dst: &mut [f32], w: usize) {
        use std::arch::x86_64::*;
        let dst = &mut dst[..w];
        // SAFETY: see `Wide`; a masked store writes only the `w` lanes inside `dst`.
        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), wide_mask(w), self) }
    }
    #[inline(always)]
    fn fma(self, coef: f32, v: Self) -> Self {
        use std::arch::x86_64::*;
        // SAFETY: see `Wide`.
        unsafe { _mm512_fmadd_ps(_mm512_set1_ps(coef), v, self) }
    }
    #[inline(always)]
    fn add(self, v: Self) -> Self {
        // SAFETY: see `Wide`.
        unsafe { std::arch::x86_64::_mm512_add_ps(self, v) }
    }
}

/// The mask of AVX-512's masked loads and stores for lanes `0..w` (`w <= 16`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn wide_mask(w: usize) -> u16 {
    (((1u32 << w) - 1) & 0xffff) as u16
}
