//! The element-wise vocabulary of the seam: the activations fused into layers, and dropout's
//! mask (a pure function of the run, the step, the sample and the element, so every backend
//! draws the same mask).

/// An activation fused into the layer before it (or run alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Act {
    /// None.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, 0), 6)`.
    Relu6,
}

impl Act {
    /// Applies the activation in place.
    #[inline]
    pub fn apply(self, v: &mut [f32]) {
        match self {
            Act::None => {}
            Act::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
            Act::Relu6 => v.iter_mut().for_each(|x| *x = x.clamp(0.0, 6.0)),
        }
    }

    /// Zeroes `dy` where the activation's output `y` had no gradient (0 at the kinks, as in
    /// PyTorch).
    #[inline]
    pub fn mask_grad(self, y: &[f32], dy: &mut [f32]) {
        match self {
            Act::None => {}
            Act::Relu => {
                for (d, &v) in dy.iter_mut().zip(y) {
                    *d = if v > 0.0 { *d } else { 0.0 };
                }
            }
            Act::Relu6 => {
                for (d, &v) in dy.iter_mut().zip(y) {
                    *d = if v > 0.0 && v < 6.0 { *d } else { 0.0 };
                }
            }
        }
    }
}

/// Dropout's identity for one call: drop probability, seed, step and the global position of
/// the first sample.
#[derive(Debug, Clone, Copy)]
pub struct DropoutMask {
    /// Probability of zeroing an element.
    pub p: f32,
    /// The run's seed.
    pub seed: u64,
    /// Global step.
    pub step: u64,
    /// Position in the global batch of this call's first sample.
    pub first_sample: u64,
}

impl DropoutMask {
    /// The hash value below which an element is dropped (computed once per call, passed to
    /// [`DropoutMask::keeps`]).
    pub fn threshold(&self) -> u32 {
        (self.p as f64 * u32::MAX as f64) as u32
    }

    /// The factor kept elements are scaled by, `1 / (1 - p)`.
    pub fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// Whether element `e` of the sample at global position `sample` is kept: a hash of
    /// (seed, step, sample, element), so the mask does not depend on the worker count, the
    /// thread count or the order anything runs in. `threshold` is [`DropoutMask::threshold`].
    #[inline]
    pub fn keeps(&self, sample: u64, e: u64, threshold: u32) -> bool {
        let mut z = self.seed
            ^ self.step.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ sample.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
            ^ e.wrapping_mul(0x1656_67b1_9e37_79f9);
        // splitmix64's finaliser.
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 32) as u32) >= threshold
    }
}
