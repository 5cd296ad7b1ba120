//! Single-precision matrix multiply, `C (+)= A x B`, our own (BLIS-style).
//!
//! Why not the `gemm` crate, which the engine used before: it allocates its packing buffers
//! (and a `Vec<bool>`) on every call, several hundred times a training step, and it packs the
//! weight matrix again for every call, so a convolution over small images (ResNet's last stage:
//! 4x4 pixels, 2.4 M weights) spent more time packing than multiplying. Here the caller packs
//! the reused operand once ([`PackedB`]) and every call packs into a thread-local workspace
//! that stops growing after the first step.
//!
//! Determinism: every element of C is `C + sum_k a*b` (or the sum alone), where the sum over
//! `k` runs in order in one register per element, restarted every [`KC`] values of `k` and
//! added to C block by block. That order depends on `k` alone, never on `m`, `n`, the tile an
//! element falls in, or the thread that computes it. The batch-sum and thread-count guarantees
//! of the layers rest on this.
//!
//! Structure (Goto/BLIS): B is packed into `KC x NR` micro-panels, A into `MR x KC` ones for
//! a block of `MC` rows; a register-blocked micro-kernel computes one `MR x NR` tile of C.
//! The micro-kernel is chosen once at run time: AVX-512 (14 x 32), AVX2+FMA (6 x 16), or a
//! portable one (4 x 8) elsewhere.

use std::cell::RefCell;

/// Depth of one block of the `k` loop (see the module's note on determinism).
pub const KC: usize = 384;
/// Rows of A packed at a time (a multiple of every micro-kernel's `MR`).
const MC: usize = 168;

/// A read-only matrix operand: element (r, c) is `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A dense row-major matrix with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a dense row-major matrix with `cols` columns (read in place).
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }
    /// A general strided view.
    pub fn strided(data: &'a [f32], rs: usize, cs: usize) -> Self {
        Self { data, rs, cs }
    }
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
    #[inline(always)]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.rs + c * self.cs]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

/// A micro-kernel's tile: `mr` rows by `nr` columns of C.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Tile {
    mr: usize,
    nr: usize,
}

impl Isa {
    /// The widths of B's micro-panels this ISA has kernels for, widest first.
    fn nrs(self) -> &'static [usize] {
        match self {
            Isa::Avx512 => &[32, 16],
            Isa::Avx2 => &[16],
            Isa::Portable => &[8],
        }
    }
    /// The heights of A's micro-panels, tallest first.
    fn mrs(self) -> &'static [usize] {
        match self {
            Isa::Avx512 => &[14, 8],
            Isa::Avx2 => &[6],
            Isa::Portable => &[4],
        }
    }
}

/// Picks the panel size for a dimension of `len`: the widest one unless a narrower one pads
/// less (a 16-column C wastes half of a 32-wide kernel; 16 output channels are common).
fn pick(sizes: &[usize], len: usize) -> usize {
    let useful = |s: usize| len as f64 / (len.div_ceil(s) * s) as f64;
    let mut best = sizes[0];
    for &s in &sizes[1..] {
        // A narrower kernel reuses each loaded value less: prefer it only for a clear gain.
        if useful(s) > useful(best) * 1.1 {
            best = s;
        }
    }
    best
}

/// The instruction set the micro-kernels (and `peak`'s FMA loop) use, detected once.
pub(super) fn isa() -> Isa {
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("DPTRAIN_GEMM_PORTABLE").is_some() {
                return Isa::Portable;
            }
            if is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// Rows of A the micro-kernel computes at once (its tallest panel): a caller that picks its
/// own row counts (Winograd's tile blocks) keeps them a multiple of it.
pub(super) fn row_panel() -> usize {
    isa().mrs()[0]
}

/// B packed once for many multiplications (a layer's weights, reused by every tile of a
/// step). Holds `ceil(k / KC)` blocks, each `ceil(n / nr)` micro-panels of `kb x nr` floats,
/// zero-padded to a whole panel.
#[derive(Default)]
pub struct PackedB {
    data: Vec<f32>,
    k: usize,
    n: usize,
    nr: usize,
}

impl PackedB {
    /// Packs the `k x n` matrix `b`, reusing this buffer's memory.
    pub fn pack(&mut self, b: MatRef, k: usize, n: usize) {
        assert!(b.fits(k, n), "PackedB::pack: operand smaller than {k}x{n}");
        let nr = pick(isa().nrs(), n);
        let np = n.div_ceil(nr) * nr;
        self.data.resize(k * np, 0.0);
        self.k = k;
        self.n = n;
        self.nr = nr;
        let mut pc = 0;
        while pc < k {
            let kb = KC.min(k - pc);
            pack_b_block(b, pc, kb, n, nr, &mut self.data[pc * np..(pc + kb) * np]);
            pc += kb;
        }
    }
    fn block(&self, pc: usize, kb: usize) -> &[f32] {
        let np = self.n.div_ceil(self.nr) * self.nr;
        &self.data[pc * np..(pc + kb) * np]
    }
}

/// `dst = src` for the short copies of packing and im2col (a few channels, up to a panel
/// width): fixed-size moves the compiler inlines. A plain loop or `copy_from_slice` of a
/// variable length became a call to `memcpy` per row, most of the time of LeNet's first layer.
#[inline(always)]
pub(crate) fn copy_short(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    if n > 64 {
        dst.copy_from_slice(src);
        return;
    }
    let src = &src[..n];
    let mut i = 0;
    while i + 16 <= n {
        dst[i..i + 16].copy_from_slice(&src[i..i + 16]);
        i += 16;
    }
    let r = n - i;
    if r & 8 != 0 {
        dst[i..i + 8].copy_from_slice(&src[i..i + 8]);
        i += 8;
    }
    if r & 4 != 0 {
        dst[i..i + 4].copy_from_slice(&src[i..i + 4]);
        i += 4;
    }
    if r & 2 != 0 {
        dst[i..i + 2].copy_from_slice(&src[i..i + 2]);
        i += 2;
    }
    if r & 1 != 0 {
        dst[i] = src[i];
    }
}

/// `dst = 0`, inlined likewise.
#[inline(always)]
pub(crate) fn zero_short(dst: &mut [f32]) {
    let n = dst.len();
    if n > 64 {
        dst.fill(0.0);
        return;
    }
    let mut i = 0;
    while i + 16 <= n {
        dst[i..i + 16].copy_from_slice(&[0.0; 16]);
        i += 16;
    }
    let r = n - i;
    if r & 8 != 0 {
        dst[i..i + 8].copy_from_slice(&[0.0; 8]);
        i += 8;
    }
    if r & 4 != 0 {
        dst[i..i + 4].copy_from_slice(&[0.0; 4]);
        i += 4;
    }
    if r & 2 != 0 {
        dst[i..i + 2].copy_from_slice(&[0.0; 2]);
        i += 2;
    }
    if r & 1 != 0 {
        dst[i] = 0.0;
    }
}

/// Packs rows `k0..k0+kb` of `b` (all `n` columns) into nr-wide micro-panels.
fn pack_b_block(b: MatRef, k0: usize, kb: usize, n: usize, nr: usize, out: &mut [f32]) {
    for jp in 0..n.div_ceil(nr) {
        let j0 = jp * nr;
        let w = nr.min(n - j0);
        let dst = &mut out[jp * kb * nr..(jp + 1) * kb * nr];
        if b.cs == 1 {
            for kk in 0..kb {
                let s = (k0 + kk) * b.rs + j0;
                let row = &mut dst[kk * nr..(kk + 1) * nr];
                copy_short(&mut row[..w], &b.data[s..s + w]);
                zero_short(&mut row[w..]);
            }
        } else {
            for kk in 0..kb {
                let row = &mut dst[kk * nr..(kk + 1) * nr];
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if j < w { b.at(k0 + kk, j0 + j) } else { 0.0 };
                }
            }
        }
    }
}

/// Packs rows `m0..m0+mb`, columns `k0..k0+kb` of `a` into mr-tall micro-panels (for each
/// `k`, mr consecutive values), zero-padded to whole panels.
fn pack_a_block(a: MatRef, m0: usize, mb: usize, k0: usize, kb: usize, mr: usize, out: &mut [f32]) {
    for ip in 0..mb.div_ceil(mr) {
        let i0 = m0 + ip * mr;
        let h = mr.min(m0 + mb - i0);
        let dst = &mut out[ip * kb * mr..(ip + 1) * kb * mr];
        if a.rs == 1 {
            // Column-major A: the mr values of one k are contiguous.
            for kk in 0..kb {
                let s = (k0 + kk) * a.cs + i0;
                let col = &mut dst[kk * mr..(kk + 1) * mr];
                copy_short(&mut col[..h], &a.data[s..s + h]);
                zero_short(&mut col[h..]);
            }
        } else {
            // Row-major (or general) A: gather the mr rows' values of each k; the rows are
            // mr sequential streams, so the reads stay in cache lines already loaded.
            let rows: [usize; 16] = std::array::from_fn(|i| (i0 + i.min(h.max(1) - 1)) * a.rs);
            for kk in 0..kb {
                let off = (k0 + kk) * a.cs;
                let col = &mut dst[kk * mr..(kk + 1) * mr];
                for i in 0..h {
                    col[i] = a.data[rows[i] + off];
                }
                zero_short(&mut col[h..]);
            }
        }
    }
}

#[derive(Default)]
struct Workspace {
    a: Vec<f32>,
    b: PackedB,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
}

/// `C[m x n] (+)= A[m x k] x B[k x n]`; C is row-major with row stride `ldc`. With
/// `accumulate` false, C's old values are ignored (it may hold anything, NaN included).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    WORKSPACE.with(|ws| {
        let mut ws = ws.borrow_mut();
        let Workspace { a: abuf, b: bbuf } = &mut *ws;
        bbuf.pack(b, k, n);
        run(m, n, k, a, bbuf, c, ldc, accumulate, abuf);
    })
}

/// [`gemm`] with B packed beforehand (see [`PackedB`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        b.k == k && b.n == n,
        "gemm_packed: B is {}x{}, not {k}x{n}",
        b.k,
        b.n
    );
    if m == 0 || n == 0 {
        return;
    }
    WORKSPACE.with(|ws| {
        let mut ws = ws.borrow_mut();
        run(m, n, k, a, b, c, ldc, accumulate, &mut ws.a);
    })
}

#[allow(clippy::too_many_arguments)]
fn run(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    abuf: &mut Vec<f32>,
) {
    assert!(a.fits(m, k), "gemm: A smaller than {m}x{k}");
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "gemm: C smaller than {m}x{n}"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
        }
        return;
    }
    let isa = isa();
    let t = Tile {
        mr: pick(isa.mrs(), m),
        nr: b.nr,
    };
    // A row- or column-major A is read in place by the micro-kernel (packing it cost as much
    // as the multiply when C is narrow); other strides are packed into mr-tall panels.
    let layout = if isa == Isa::Portable {
        ALayout::Packed
    } else if a.cs == 1 {
        ALayout::RowMajor
    } else if a.rs == 1 {
        ALayout::ColMajor
    } else {
        ALayout::Packed
    };
    let mc = MC / t.mr * t.mr;
    if layout == ALayout::Packed && abuf.len() < mc * KC {
        abuf.resize(mc * KC, 0.0);
    }
    let npanels = n.div_ceil(t.nr);
    let mut pc = 0;
    while pc < k {
        let kb = KC.min(k - pc);
        let bblock = b.block(pc, kb);
        let add = accumulate || pc > 0;
        let mut ic = 0;
        while ic < m {
            let mb = mc.min(m - ic);
            if layout == ALayout::Packed {
                pack_a_block(a, ic, mb, pc, kb, t.mr, abuf);
            }
            for jp in 0..npanels {
                let bp = &bblock[jp * kb * t.nr..(jp + 1) * kb * t.nr];
                let j0 = jp * t.nr;
                let w = t.nr.min(n - j0);
                for ip in 0..mb.div_ceil(t.mr) {
                    let i0 = ic + ip * t.mr;
                    let h = t.mr.min(m - i0);
                    let ap = match layout {
                        ALayout::Packed => {
                            APanel::Packed(&abuf[ip * kb * t.mr..(ip + 1) * kb * t.mr])
                        }
                        ALayout::RowMajor => APanel::Rows {
                            data: &a.data[i0 * a.rs + pc..],
                            ld: a.rs,
                        },
                        ALayout::ColMajor => APanel::Cols {
                            data: &a.data[pc * a.cs + i0..],
                            ld: a.cs,
                        },
                    };
                    tile(isa, t, kb, ap, bp, &mut c[i0 * ldc + j0..], ldc, h, w, add);
                }
            }
            ic += mb;
        }
        pc += kb;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ALayout {
    Packed,
    RowMajor,
    ColMajor,
}

/// Where a micro-kernel reads its mr rows of A from.
#[derive(Clone, Copy)]
enum APanel<'a> {
    /// Packed: for each k, mr consecutive values.
    Packed(&'a [f32]),
    /// Row i at `data[i * ld..]`, its k values contiguous.
    Rows { data: &'a [f32], ld: usize },
    /// For each k, the mr values contiguous at `data[k * ld..]`.
    Cols { data: &'a [f32], ld: usize },
}

/// One `h x w` part (at most mr x nr) of C from A's rows and a packed B panel.
#[allow(clippy::too_many_arguments)]
#[inline]
fn tile(
    isa: Isa,
    t: Tile,
    kb: usize,
    a: APanel,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    h: usize,
    w: usize,
    add: bool,
) {
    debug_assert!(b.len() >= kb * t.nr);
    let full = h == t.mr && w == t.nr;
    // Whole tiles are stored straight into C; edge tiles through a local tile (and the rows of
    // A past the edge are not read: the kernel reads row min(i, h-1) instead).
    let mut local = [0f32; 14 * 32];
    let (dst, dld, dadd): (&mut [f32], usize, bool) = if full {
        assert!(c.len() >= (t.mr - 1) * ldc + t.nr);
        (c, ldc, add)
    } else {
        (&mut local[..], t.nr, false)
    };
    let (bp, cp) = (b.as_ptr(), dst.as_mut_ptr());
    // (pointer, row stride, k stride) of A; every index read is checked here.
    let (ap, ars, acs) = match a {
        APanel::Packed(p) => {
            assert!(p.len() >= kb * t.mr);
            (p.as_ptr(), 1, t.mr)
        }
        APanel::Rows { data, ld } => {
            assert!(kb > 0 && data.len() >= (h - 1) * ld + kb);
            (data.as_ptr(), ld, 1)
        }
        APanel::Cols { data, ld } => {
            assert!(kb > 0 && data.len() >= (kb - 1) * ld + h);
            (data.as_ptr(), 1, ld)
        }
    };
    let rows = h;
    macro_rules! k512 {
        ($mr:literal, $nv:literal) => {
            // SAFETY: AVX-512 was detected; A's rows below `rows` and k below kb are in
            // bounds (asserted above), B holds kb x nr, the destination an mr x nr tile.
            unsafe {
                if acs == 1 {
                    x86::avx512::<$mr, $nv, true>(kb, ap, ars, rows, bp, cp, dld, dadd)
                } else {
                    x86::avx512::<$mr, $nv, false>(kb, ap, acs, rows, bp, cp, dld, dadd)
                }
            }
        };
    }
    match (isa, t.mr, t.nr) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, 14, 32) => k512!(14, 2),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, 14, 16) => k512!(14, 1),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, 8, 32) => k512!(8, 2),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, 8, 16) => k512!(8, 1),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 and FMA.
        (Isa::Avx2, 6, 16) => unsafe {
            if acs == 1 {
                x86::avx2_6x16::<true>(kb, ap, ars, rows, bp, cp, dld, dadd)
            } else {
                x86::avx2_6x16::<false>(kb, ap, acs, rows, bp, cp, dld, dadd)
            }
        },
        (Isa::Portable, 4, 8) => match a {
            APanel::Packed(p) => portable_kernel(kb, p, b, dst, dld, dadd),
            _ => unreachable!("the portable kernel reads packed A"),
        },
        other => unreachable!("no micro-kernel for {other:?}"),
    }
    if !full {
        for i in 0..h {
            let row = &mut c[i * ldc..i * ldc + w];
            let src = &local[i * t.nr..i * t.nr + w];
            if add {
                for (d, s) in row.iter_mut().zip(src) {
                    *d += *s;
                }
            } else {
                row.copy_from_slice(src);
            }
        }
    }
}

/// The portable micro-kernel (4 x 8), same summation order as the SIMD ones.
fn portable_kernel(kb: usize, a: &[f32], b: &[f32], c: &mut [f32], ldc: usize, add: bool) {
    const MR: usize = 4;
    const NR: usize = 8;
    let mut acc = [[0f32; NR]; MR];
    for kk in 0..kb {
        let bv = &b[kk * NR..kk * NR + NR];
        for i in 0..MR {
            let av = a[kk * MR + i];
            for j in 0..NR {
                acc[i][j] = av.mul_add(bv[j], acc[i][j]);
            }
        }
    }
    for i in 0..MR {
        let row = &mut c[i * ldc..i * ldc + NR];
        for j in 0..NR {
            row[j] = if add { row[j] + acc[i][j] } else { acc[i][j] };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// An `MR x 16*NV` tile: `MR * NV` zmm accumulators, NV B vectors and one broadcast of A
    /// per row and k. A's element (i, k) is at `a + i * ld + k` when `ROWS` (row-major, `ld`
    /// its row stride), else at `a + i + k * ld`; rows at or past `rows` repeat row `rows - 1`
    /// (their results land in the caller's scratch tile and are dropped).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx512<const MR: usize, const NV: usize, const ROWS: bool>(
        kb: usize,
        a: *const f32,
        ld: usize,
        rows: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let row_off: [usize; MR] = std::array::from_fn(|i| {
            if ROWS {
                i.min(rows - 1) * ld
            } else {
                i.min(rows - 1)
            }
        });
        let mut b = b;
        for kk in 0..kb {
            let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
            let base = if ROWS { a.add(kk) } else { a.add(kk * ld) };
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*base.add(row_off[i]));
                for v in 0..NV {
                    row[v] = _mm512_fmadd_ps(av, bv[v], row[v]);
                }
            }
            b = b.add(16 * NV);
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                let p = c.add(i * ldc + 16 * v);
                let r = if add {
                    _mm512_add_ps(_mm512_loadu_ps(p), r)
                } else {
                    r
                };
                _mm512_storeu_ps(p, r);
            }
        }
    }

    /// A 6 x 16 tile: 12 ymm accumulators (A read as in [`avx512`]).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx2_6x16<const ROWS: bool>(
        kb: usize,
        a: *const f32,
        ld: usize,
        rows: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        const MR: usize = 6;
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let row_off: [usize; MR] = std::array::from_fn(|i| {
            if ROWS {
                i.min(rows - 1) * ld
            } else {
                i.min(rows - 1)
            }
        });
        let mut b = b;
        for kk in 0..kb {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            let base = if ROWS { a.add(kk) } else { a.add(kk * ld) };
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*base.add(row_off[i]));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            b = b.add(16);
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                let p = c.add(i * ldc + 8 * v);
                let r = if add {
                    _mm256_add_ps(_mm256_loadu_ps(p), r)
                } else {
                    r
                };
                _mm256_storeu_ps(p, r);
            }
        }
    }
}
