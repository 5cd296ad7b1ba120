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
/// The largest B micro-panel kept in L1 across A's micro-panels (see `run`): 32 KB, which
/// leaves room for A's rows in a 48 KB L1 (Intel since Ice Lake) and is all of a 32 KB one
/// (Zen 3; its AVX2 panel is 24 KB).
const B_PANEL_STAYS_BYTES: usize = 32 << 10;
/// Rows of A packed at a time (a multiple of every micro-kernel's `MR`).
const MC: usize = 168;
/// B micro-panels from which a column-major A is packed rather than read in place: each
/// packed block then serves this many panels. A convolution's weight gradient (A the column
/// matrix's transpose, its columns 2-18 KB apart) at 128-512 output channels ran 10-18%
/// faster packed; at 64 (two panels), 13% slower.
const PACK_COLS_FROM_PANELS: usize = 4;

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

/// A's rows gathered from strided segments, for a convolution read in place (implicit im2col):
/// element (i, k) is `data[row_base[i] + (k / seg_len) * seg_stride + k % seg_len]`. A
/// convolution's row is an output pixel and `k` runs over (kernel row, kernel column,
/// channel): each kernel row's taps are `seg_len = kw * c` contiguous floats of a (padded)
/// input row, and the next kernel row's lie `seg_stride` further on.
#[derive(Clone, Copy)]
pub struct GatheredRows<'a> {
    pub data: &'a [f32],
    pub row_base: &'a [usize],
    pub seg_len: usize,
    pub seg_stride: usize,
}

/// The shortest segment [`gemm_packed_gathered`] takes (a KC block spans at most
/// `KC / MIN_SEGMENT + 1` of them; shorter ones gain little over copying the rows).
pub const MIN_SEGMENT: usize = 32;
const MAX_PIECES: usize = KC / MIN_SEGMENT + 2;

/// Whether this machine's micro-kernels read gathered rows (the portable one reads packed A
/// only; callers build the column matrix there instead).
pub(super) fn gathers_rows() -> bool {
    isa() != Isa::Portable
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
    pub(super) fn nrs(self) -> &'static [usize] {
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
            // To test the AVX2 kernels on an AVX-512 machine (`DPTRAIN_GEMM_AVX2=1 cargo test`).
            let avx2_only = std::env::var_os("DPTRAIN_GEMM_AVX2").is_some();
            if is_x86_feature_detected!("avx512f") && !avx2_only {
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
        let (nr, np) = self.set_shape(k, n);
        let mut pc = 0;
        while pc < k {
            let kb = KC.min(k - pc);
            pack_b_block(b, pc, kb, n, nr, &mut self.data[pc * np..(pc + kb) * np]);
            pc += kb;
        }
    }
    /// Takes the shape of a `k x n` B: the panel width for `n`, and the buffer at least `k`
    /// rows of whole panels. Returns the panel width and the padded columns. The buffer never
    /// shrinks: a layer that follows a smaller one would otherwise zero-fill the difference
    /// again on every step, a pass over memory that packing overwrites anyway.
    fn set_shape(&mut self, k: usize, n: usize) -> (usize, usize) {
        let nr = pick(isa().nrs(), n);
        let np = n.div_ceil(nr) * nr;
        if self.data.len() < k * np {
            self.data.resize(k * np, 0.0);
        }
        (self.k, self.n, self.nr) = (k, n, nr);
        (nr, np)
    }

    fn block(&self, pc: usize, kb: usize) -> &[f32] {
        let np = self.n.div_ceil(self.nr) * self.nr;
        &self.data[pc * np..(pc + kb) * np]
    }

    /// Sizes this buffer for a `k x n` matrix that its producer writes in place through
    /// [`PackedB::writer`] instead of packing it from a matrix (Winograd's transformed
    /// weights: computed straight into the packed layout, with no `k x n` copy in between to
    /// write and read again). Zeroes the columns past `n` of the last micro-panel; every other
    /// element must then be written.
    pub fn shape_for_writing(&mut self, k: usize, n: usize) {
        let (nr, np) = self.set_shape(k, n);
        if np == n {
            return;
        }
        let mut pc = 0;
        while pc < k {
            let kb = KC.min(k - pc);
            let last = &mut self.data[pc * np + (np - nr) * kb..(pc + kb) * np];
            for row in last.chunks_exact_mut(nr) {
                row[n % nr..].fill(0.0);
            }
            pc += kb;
        }
    }

    /// A writer of this buffer's elements, shaped by [`PackedB::shape_for_writing`].
    pub fn writer(&mut self) -> PackedWriter<'_> {
        assert!(
            self.nr.is_power_of_two(),
            "micro-panels of {} columns",
            self.nr
        );
        PackedWriter {
            data: self.data.as_mut_ptr(),
            len: self.data.len(),
            k: self.k,
            n: self.n,
            nr: self.nr,
            np: self.n.div_ceil(self.nr) * self.nr,
            _buffer: std::marker::PhantomData,
        }
    }
}

/// Writes runs of a row of a [`PackedB`] from several threads at once (each row of Winograd's
/// transformed weights is one input channel's, computed by one task).
pub struct PackedWriter<'a> {
    data: *mut f32,
    len: usize,
    k: usize,
    n: usize,
    /// Columns per micro-panel, a power of two.
    nr: usize,
    /// Columns padded to whole micro-panels.
    np: usize,
    _buffer: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the writer is a `&mut` to the buffer shared between threads; `PackedWriter::write`'s
// contract (no element written by two calls at once) is what makes the sharing sound.
unsafe impl Send for PackedWriter<'_> {}
unsafe impl Sync for PackedWriter<'_> {}

impl PackedWriter<'_> {
    /// Writes `vals` as elements `(row, col..col + vals.len())` of the matrix.
    ///
    /// # Safety
    /// No other call may write any of these elements at the same time (callers give each row
    /// to one thread). Bounds are checked.
    #[inline]
    pub unsafe fn write(&self, row: usize, col: usize, vals: &[f32]) {
        assert!(
            row < self.k && col + vals.len() <= self.n,
            "PackedWriter: ({row}, {col}..+{}) outside {}x{}",
            vals.len(),
            self.k,
            self.n
        );
        // Block `pc` holds rows pc..pc + kb: panel after panel of kb x nr, a row nr floats.
        let pc = row - row % KC;
        let kb = KC.min(self.k - pc);
        let row_start = pc * self.np + (row - pc) * self.nr;
        let mut j = 0;
        while j < vals.len() {
            let c = col + j;
            let within = c & (self.nr - 1);
            let run = (self.nr - within).min(vals.len() - j);
            let at = row_start + (c - within) * kb + within;
            assert!(at + run <= self.len);
            // SAFETY: inside the buffer (checked above), and the caller guarantees no
            // concurrent write of these elements.
            unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr().add(j), self.data.add(at), run) };
            j += run;
        }
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
    if a.rs == 1 {
        // Column-major A (the weight gradient's column matrix, read transposed): the `mb`
        // values of one k are contiguous, so each k's run is read once, front to back, and
        // dealt out to the panels. Panel by panel instead, every k's read landed in a new
        // line `a.cs` floats past the last (9 KB apart for 256 channels), a miss the
        // prefetcher could not foresee. On a Zen 4 the packing was 9% of the profile of a
        // step of a 256-channel layer, most of it those loads; this order took the layer's
        // weight gradient from 61-65 to 55 ms (1 thread, batch 64).
        let panels = mb.div_ceil(mr);
        for kk in 0..kb {
            let s = (k0 + kk) * a.cs + m0;
            let run = &a.data[s..s + mb];
            for ip in 0..panels {
                let h = mr.min(mb - ip * mr);
                let col = &mut out[(ip * kb + kk) * mr..(ip * kb + kk + 1) * mr];
                copy_short(&mut col[..h], &run[ip * mr..ip * mr + h]);
                zero_short(&mut col[h..]);
            }
        }
        return;
    }
    for ip in 0..mb.div_ceil(mr) {
        let i0 = m0 + ip * mr;
        let h = mr.min(m0 + mb - i0);
        let dst = &mut out[ip * kb * mr..(ip + 1) * kb * mr];
        // Row-major (or general) A: gather the mr rows' values of each k; the rows are mr
        // sequential streams, so the reads stay in cache lines already loaded.
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

#[derive(Default)]
struct Workspace {
    a: Vec<f32>,
    b: PackedB,
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
}

/// Floats of a thread's packed-A buffer at its largest.
pub(super) fn packed_a_floats() -> usize {
    MC * KC
}

/// Grows the calling thread's packed-A buffer to its largest size (`MC x KC`), so no later
/// GEMM on this thread allocates it (`scratch::Reservation` calls it on every thread).
pub(super) fn reserve_workspace() {
    WORKSPACE.with(|ws| {
        let mut ws = ws.borrow_mut();
        if ws.a.len() < packed_a_floats() {
            ws.a.resize(packed_a_floats(), 0.0);
        }
    });
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
        run(m, n, k, AOperand::Mat(a), bbuf, c, ldc, accumulate, abuf);
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
    run_packed(m, n, k, AOperand::Mat(a), b, c, ldc, accumulate);
}

/// A GEMM whose B was packed beforehand, on the thread's workspace: the entry points' shared
/// check of B and their early exit.
#[allow(clippy::too_many_arguments)]
fn run_packed(
    m: usize,
    n: usize,
    k: usize,
    a: AOperand,
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

/// [`gemm_packed`] with A's rows gathered in place ([`GatheredRows`]): the same sums in the
/// same order as on the matrix those rows would form, so the same bits.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_gathered(
    m: usize,
    n: usize,
    k: usize,
    a: GatheredRows,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        gathers_rows(),
        "gemm_packed_gathered: no micro-kernel reads gathered rows here"
    );
    assert!(
        a.seg_len >= MIN_SEGMENT,
        "gemm_packed_gathered: segments shorter than {MIN_SEGMENT}"
    );
    // Segments that do not overlap: the pieces then ascend, and the last one ends furthest
    // (what the bounds checks here and in `tile_gathered` rest on).
    assert!(
        a.seg_stride >= a.seg_len,
        "gemm_packed_gathered: segments {} apart, shorter than their {} floats",
        a.seg_stride,
        a.seg_len
    );
    assert!(
        a.row_base.len() >= m,
        "gemm_packed_gathered: {} rows, not {m}",
        a.row_base.len()
    );
    // Every row's last value is in bounds; the micro-kernel reads nothing past it.
    let last = (k.max(1) - 1) / a.seg_len * a.seg_stride + (k.max(1) - 1) % a.seg_len;
    let deepest = a.row_base[..m].iter().max().copied().unwrap_or(0);
    assert!(
        m == 0 || n == 0 || k == 0 || deepest + last < a.data.len(),
        "gemm_packed_gathered: A's rows out of bounds"
    );
    run_packed(m, n, k, AOperand::Gathered(a), b, c, ldc, accumulate);
}

/// A as the GEMM reads it: a strided matrix or gathered rows.
#[derive(Clone, Copy)]
enum AOperand<'a> {
    Mat(MatRef<'a>),
    Gathered(GatheredRows<'a>),
}

#[allow(clippy::too_many_arguments)]
fn run(
    m: usize,
    n: usize,
    k: usize,
    a: AOperand,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    abuf: &mut Vec<f32>,
) {
    if let AOperand::Mat(a) = a {
        assert!(a.fits(m, k), "gemm: A smaller than {m}x{k}");
    }
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
    // as the multiply when C is narrow), a column-major one packed when C is wide enough to
    // reuse each packed block (`PACK_COLS_FROM_PANELS`); other strides are packed into
    // mr-tall panels; gathered rows are read where they lie.
    let layout = match a {
        AOperand::Gathered(_) => ALayout::Gathered,
        AOperand::Mat(_) if isa == Isa::Portable => ALayout::Packed,
        AOperand::Mat(a) if a.cs == 1 => ALayout::RowMajor,
        AOperand::Mat(a) if a.rs == 1 && b.n.div_ceil(b.nr) < PACK_COLS_FROM_PANELS => {
            ALayout::ColMajor
        }
        AOperand::Mat(_) => ALayout::Packed,
    };
    let mc = MC / t.mr * t.mr;
    if layout == ALayout::Packed && abuf.len() < mc * KC {
        abuf.resize(mc * KC, 0.0);
    }
    let npanels = n.div_ceil(t.nr);
    // Which operand stays in L1 while the other streams past it from L2. B's micro-panel is
    // `KC x nr` floats: 24 KB at 16 columns fits L1 beside A's rows and is reused across A's
    // micro-panels (panels outer). At 32 columns it is 48 KB, all of a 48 KB L1, and was read
    // from L2 for every micro-panel of A anyway: then A's micro-panel (14 rows, 21 KB) stays
    // and B streams, prefetched by the micro-kernel (BLIS's order). Measured on two 512 -> 512
    // 3x3 layers at 4x4 (1 thread): backward 0.84x the time, forward with the prefetch 0.85x;
    // 128 channels at 16x16 unchanged.
    let b_streams = KC * t.nr * std::mem::size_of::<f32>() > B_PANEL_STAYS_BYTES;
    let mut pc = 0;
    while pc < k {
        let kb = KC.min(k - pc);
        let bblock = b.block(pc, kb);
        let add = accumulate || pc > 0;
        let mut ic = 0;
        while ic < m {
            let mb = mc.min(m - ic);
            if let (ALayout::Packed, AOperand::Mat(a)) = (layout, a) {
                pack_a_block(a, ic, mb, pc, kb, t.mr, abuf);
            }
            let mpanels = mb.div_ceil(t.mr);
            for step in 0..npanels * mpanels {
                let (jp, ip) = if b_streams {
                    (step % npanels, step / npanels)
                } else {
                    (step / mpanels, step % mpanels)
                };
                let bp = &bblock[jp * kb * t.nr..(jp + 1) * kb * t.nr];
                let j0 = jp * t.nr;
                let w = t.nr.min(n - j0);
                let i0 = ic + ip * t.mr;
                let h = t.mr.min(m - i0);
                let ap = match (layout, a) {
                    (ALayout::Packed, _) => {
                        APanel::Packed(&abuf[ip * kb * t.mr..(ip + 1) * kb * t.mr])
                    }
                    (ALayout::RowMajor, AOperand::Mat(a)) => APanel::Rows {
                        data: &a.data[i0 * a.rs + pc..],
                        ld: a.rs,
                    },
                    (ALayout::ColMajor, AOperand::Mat(a)) => APanel::Cols {
                        data: &a.data[pc * a.cs + i0..],
                        ld: a.cs,
                    },
                    (_, AOperand::Gathered(g)) => APanel::Gathered {
                        rows: g,
                        i0,
                        k0: pc,
                    },
                    _ => unreachable!("the layout follows the operand"),
                };
                tile(isa, t, kb, ap, bp, &mut c[i0 * ldc + j0..], ldc, h, w, add);
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
    Gathered,
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
    /// Rows `i0..` of gathered rows, from `k0` on.
    Gathered {
        rows: GatheredRows<'a>,
        i0: usize,
        k0: usize,
    },
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
    let kernel = |dst: &mut [f32], dld: usize, dadd: bool| {
        if let APanel::Gathered { rows: g, i0, k0 } = a {
            tile_gathered(isa, t, kb, g, i0, k0, h, b, dst, dld, dadd);
        } else {
            tile_strided(isa, t, kb, a, h, b, dst, dld, dadd);
        }
    };
    // Whole tiles are stored straight into C. Edge tiles go through a local tile (and the rows
    // of A past the edge are not read: the kernel reads row min(i, h-1) instead), declared
    // only here: zeroing its 1.8 KB for every whole tile was 6% of a 512-channel layer's step.
    if h == t.mr && w == t.nr {
        assert!(c.len() >= (t.mr - 1) * ldc + t.nr);
        kernel(c, ldc, add);
        return;
    }
    let mut local = [0f32; 14 * 32];
    kernel(&mut local[..], t.nr, false);
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

/// The micro-kernel over gathered rows: A's k range `k0..k0 + kb` cut where segments end, one
/// piece per segment, summed in one set of registers (the order of one contiguous row).
#[allow(clippy::too_many_arguments)]
fn tile_gathered(
    isa: Isa,
    t: Tile,
    kb: usize,
    g: GatheredRows,
    i0: usize,
    k0: usize,
    h: usize,
    b: &[f32],
    dst: &mut [f32],
    dld: usize,
    dadd: bool,
) {
    let mut pieces = [(0usize, 0usize); MAX_PIECES];
    let (mut n, mut k) = (0, k0);
    while k < k0 + kb {
        let (seg, off) = (k / g.seg_len, k % g.seg_len);
        let len = (g.seg_len - off).min(k0 + kb - k);
        pieces[n] = (len, seg * g.seg_stride + off);
        n += 1;
        k += len;
    }
    let pieces = &pieces[..n];
    let mut row_off = [0usize; 14];
    for (i, r) in row_off.iter_mut().enumerate().take(t.mr) {
        *r = g.row_base[i0 + i.min(h - 1)];
    }
    // Bounds: the deepest row's last piece ends inside the data (the pieces ascend).
    let deepest = row_off[..t.mr].iter().max().copied().unwrap_or(0);
    let &(len, off) = pieces.last().expect("kb > 0");
    assert!(
        deepest + off + len <= g.data.len(),
        "gathered rows out of bounds"
    );
    assert!(b.len() >= kb * t.nr && dst.len() >= (t.mr - 1) * dld + t.nr);
    // SAFETY: every row's pieces are in bounds (asserted above), B holds kb x nr (asserted),
    // the destination an mr x nr tile (asserted).
    unsafe {
        simd_kernel(
            isa,
            t,
            pieces,
            g.data.as_ptr(),
            &row_off,
            None,
            b,
            dst,
            dld,
            dadd,
        )
    }
}

/// The SIMD micro-kernel for `t` on this ISA over A's pieces (see [`x86::avx512`]): rows at
/// `a + row_off[i]`, each row's k values contiguous, or `ld` apart with `Some(ld)`.
///
/// # Safety
/// Every value the pieces name for rows `0..t.mr` is inside A's allocation, B holds `kb x nr`
/// floats (kb the pieces' total), and `dst` an `mr x nr` tile with row stride `dld`.
#[allow(clippy::too_many_arguments)]
unsafe fn simd_kernel(
    isa: Isa,
    t: Tile,
    pieces: &[(usize, usize)],
    a: *const f32,
    row_off: &[usize; 14],
    ld: Option<usize>,
    b: &[f32],
    dst: &mut [f32],
    dld: usize,
    dadd: bool,
) {
    let (bp, cp) = (b.as_ptr(), dst.as_mut_ptr());
    macro_rules! k512 {
        ($mr:literal, $nv:literal) => {{
            let ro: &[usize; $mr] = row_off[..$mr].try_into().expect("mr offsets");
            // SAFETY: AVX-512 was detected; the rest is the caller's promise.
            match ld {
                None => x86::avx512::<$mr, $nv, true>(pieces, a, ro, 1, bp, cp, dld, dadd),
                Some(ld) => x86::avx512::<$mr, $nv, false>(pieces, a, ro, ld, bp, cp, dld, dadd),
            }
        }};
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
        (Isa::Avx2, 6, 16) => {
            let ro: &[usize; 6] = row_off[..6].try_into().expect("mr offsets");
            // SAFETY: AVX2 and FMA were detected; the rest is the caller's promise.
            match ld {
                None => x86::avx2_6x16::<true>(pieces, a, ro, 1, bp, cp, dld, dadd),
                Some(ld) => x86::avx2_6x16::<false>(pieces, a, ro, ld, bp, cp, dld, dadd),
            }
        }
        other => unreachable!("no SIMD micro-kernel for {other:?}"),
    }
}

/// The micro-kernel over a strided or packed A.
#[allow(clippy::too_many_arguments)]
fn tile_strided(
    isa: Isa,
    t: Tile,
    kb: usize,
    a: APanel,
    h: usize,
    b: &[f32],
    dst: &mut [f32],
    dld: usize,
    dadd: bool,
) {
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
        APanel::Gathered { .. } => unreachable!("gathered rows go to tile_gathered"),
    };
    if isa == Isa::Portable {
        match a {
            APanel::Packed(p) => portable_kernel(kb, p, b, dst, dld, dadd),
            _ => unreachable!("the portable kernel reads packed A"),
        }
        return;
    }
    // One piece, the whole block; rows at or past h repeat row h - 1 (their results land in
    // the caller's scratch tile and are dropped).
    let row_off: [usize; 14] = std::array::from_fn(|i| i.min(h - 1) * ars);
    let ld = (acs != 1).then_some(acs);
    assert!(b.len() >= kb * t.nr && dst.len() >= (t.mr - 1) * dld + t.nr);
    // SAFETY: A's rows below h and k below kb are in bounds (asserted above), B and the
    // destination too.
    unsafe { simd_kernel(isa, t, &[(kb, 0)], ap, &row_off, ld, b, dst, dld, dadd) }
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

    /// How many k steps ahead the AVX-512 kernel prefetches B: 12 and 24 measured alike on
    /// the 512-channel layers (12 x 128 bytes, 1.5 KB, well inside what L1 holds in flight).
    const PREFETCH_K: usize = 12;

    /// An `MR x 16*NV` tile: `MR * NV` zmm accumulators, NV B vectors and one broadcast of A
    /// per row and k. A comes in pieces `(len, off)`, summed in order in the same registers
    /// (so a row cut into pieces sums as one contiguous row would): within a piece, A's
    /// element (i, k) is at `a + off + row_off[i] + k` when `ROWS` (a row-major or gathered
    /// A), else at `a + off + row_off[i] + k * ld` (column-major or packed). B advances one
    /// `16 * NV`-float row per k across the pieces.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn avx512<const MR: usize, const NV: usize, const ROWS: bool>(
        pieces: &[(usize, usize)],
        a: *const f32,
        row_off: &[usize; MR],
        ld: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let row_off = *row_off;
        let mut b = b;
        for &(len, off) in pieces {
            let a = a.add(off);
            for kk in 0..len {
                let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
                // B's row PREFETCH_K steps ahead, so it is in L1 when its turn comes: B
                // streams from L2 where its panel is larger than L1 (see `run`); where the
                // panel stays in L1 the prefetch finds the line there.
                for v in 0..NV {
                    _mm_prefetch::<_MM_HINT_T0>(
                        b.wrapping_add(16 * NV * PREFETCH_K + 16 * v) as *const i8
                    );
                }
                let base = if ROWS { a.add(kk) } else { a.add(kk * ld) };
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*base.add(row_off[i]));
                    for v in 0..NV {
                        row[v] = _mm512_fmadd_ps(av, bv[v], row[v]);
                    }
                }
                b = b.add(16 * NV);
            }
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
        pieces: &[(usize, usize)],
        a: *const f32,
        row_off: &[usize; 6],
        ld: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; 6];
        let row_off = *row_off;
        let mut b = b;
        for &(len, off) in pieces {
            let a = a.add(off);
            for kk in 0..len {
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
