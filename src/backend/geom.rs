//! The geometry of convolutions and pooling windows, per sample: what a layer tells the
//! kernels about its shapes (part of the seam's vocabulary, whatever the backend).

/// Geometry of one convolution, per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub o: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
    /// Zero padding above and below.
    pub ph: usize,
    /// Zero padding left and right.
    pub pw: usize,
    /// Vertical dilation.
    pub dh: usize,
    /// Horizontal dilation.
    pub dw: usize,
    /// Groups (channels are split into this many independent convolutions).
    pub groups: usize,
}

impl ConvGeom {
    /// Input channels per group.
    #[inline]
    pub fn cg(&self) -> usize {
        self.c / self.groups
    }
    /// Output channels per group.
    #[inline]
    pub fn og(&self) -> usize {
        self.o / self.groups
    }
    /// Rows of the weight matrix of one group (`kh * kw * c / groups`).
    #[inline]
    pub fn kkc(&self) -> usize {
        self.kh * self.kw * self.cg()
    }
    /// Weight elements.
    #[inline]
    pub fn weight_len(&self) -> usize {
        self.kkc() * self.o
    }
    /// Output pixels per sample.
    #[inline]
    pub fn pixels(&self) -> usize {
        self.oh * self.ow
    }
    /// Input elements per sample.
    #[inline]
    pub fn in_len(&self) -> usize {
        self.h * self.w * self.c
    }
    /// Output elements per sample.
    #[inline]
    pub fn out_len(&self) -> usize {
        self.pixels() * self.o
    }
    /// A 1x1, stride-1, unpadded convolution: a plain matrix product of the activation.
    #[inline]
    pub(super) fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.sh == 1 && self.sw == 1 && self.ph == 0 && self.pw == 0
    }
    /// One input channel per group: the direct depthwise kernel.
    #[inline]
    pub fn depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.c
    }
    /// Stride 1 with an output as large as the input: the input gradient is a convolution too.
    #[inline]
    pub(super) fn dx_as_conv(&self) -> bool {
        self.sh == 1 && self.sw == 1 && self.oh == self.h && self.ow == self.w
    }
    /// The geometry of the input gradient as a convolution of the output gradient with the
    /// flipped kernel (valid when [`Self::dx_as_conv`]).
    #[inline]
    pub(super) fn flipped(&self) -> ConvGeom {
        ConvGeom {
            c: self.o,
            h: self.oh,
            w: self.ow,
            o: self.c,
            oh: self.h,
            ow: self.w,
            ph: self.dh * (self.kh - 1) - self.ph,
            pw: self.dw * (self.kw - 1) - self.pw,
            groups: self.groups,
            ..*self
        }
    }
    /// Input row and column of output pixel (`oy`, `ox`) under tap (`ki`, `kj`), if inside.
    #[inline]
    pub(super) fn src(&self, oy: usize, ox: usize, ki: usize, kj: usize) -> Option<(usize, usize)> {
        let iy = (oy * self.sh + ki * self.dh).checked_sub(self.ph)?;
        let ix = (ox * self.sw + kj * self.dw).checked_sub(self.pw)?;
        (iy < self.h && ix < self.w).then_some((iy, ix))
    }
}

/// Geometry of a pooling window over one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGeom {
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Window height.
    pub kh: usize,
    /// Window width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
    /// Padding above and below.
    pub ph: usize,
    /// Padding left and right.
    pub pw: usize,
}

impl PoolGeom {
    /// Input elements per sample.
    #[inline]
    pub fn in_len(&self) -> usize {
        self.h * self.w * self.c
    }
    /// Output elements per sample.
    #[inline]
    pub fn out_len(&self) -> usize {
        self.oh * self.ow * self.c
    }
    /// Input row and column of output pixel (`oy`, `ox`) under tap (`ki`, `kj`), if inside.
    #[inline]
    pub(super) fn src(&self, oy: usize, ox: usize, ki: usize, kj: usize) -> Option<(usize, usize)> {
        let iy = (oy * self.sh + ki).checked_sub(self.ph)?;
        let ix = (ox * self.sw + kj).checked_sub(self.pw)?;
        (iy < self.h && ix < self.w).then_some((iy, ix))
    }
}
