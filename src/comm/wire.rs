//! Compression on the wire (`--compress fp16|bf16`): gradients travel as 16-bit floats and are
//! summed in f32.
//!
//! Why here and not in each algorithm: every mode already moves its data with
//! [`Transport::send`] and [`Transport::recv`], so one [`WireTransport`] wrapped around the
//! real transport halves every message of every mode and hierarchy (and of the simulator's
//! recording transport, so `simulate` prices the same bytes). The algorithms are unchanged:
//! a received partial sum is widened to f32 before it is added, and narrowed again only when
//! it is sent on. So the sums are formed in f32 (the additions of every mode), and what is
//! rounded to 16 bits is each value that crosses a link: a ring's partial sums at each hop, a
//! tree's partial sums, redundant mode's contributions (each rounded once).
//!
//! Bit-identical replicas, as without compression:
//! - ring, halving-doubling and tree compute each element's sum once and copy it: the copies
//!   arrive rounded, the owner holds its sum unrounded, so after the collective every rank
//!   rounds its buffer ([`WireFormat::round`]; idempotent on the copies, the owner's rounding
//!   is the one the copies went through);
//! - redundant mode adds every rank's contribution on every rank: it rounds its own
//!   contribution as the wire rounds it ([`Transport::round_to_wire`]) before adding, so every
//!   rank adds the same values in the same order;
//! - the shared-memory phases of a hierarchy send nothing and are not compressed.
//!
//! The format of a message of `n` values: `ceil(n / 2)` f32 carriers, carrier `i` holding
//! value `2i` in its low 16 bits and `2i + 1` in its high 16 (a zero pad after an odd last
//! value). Carriers are only copied, never computed with, so any transport moves them intact.
//!
//! Not rounded: flat redundant mode's sums (every rank adds the same rounded contributions in
//! the same order, in f32) and tree mode's reduce to worker 0 (only it holds the sum).
//!
//! fp16's range ends at 65504: a value that rounds past it (from 65520) cannot be sent and the
//! collective fails with [`CommError::WireOverflow`] (naming bf16, which has f32's range),
//! instead of training on infinities; this stops the run even with `--on-nonfinite skip`.
//! Below 6.1e-5 fp16 keeps fewer bits (subnormals) and under 3e-8 none: gradients already
//! divided by the global batch can be that small, and bf16 keeps 8 bits down to f32's 1e-38.
//! Non-finite gradients pass through as they are, for the trainer's own check.

use crate::comm::{CommError, SharedMemory, Transport};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use std::sync::Mutex;

/// How gradient values travel between workers (`--compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum WireFormat {
    /// As they are: 32-bit floats.
    #[default]
    F32,
    /// IEEE half precision: 11 significant bits from 6.1e-5 to 65504; fewer below (subnormal),
    /// zero under 3e-8; a value that rounds past 65504 (from 65520) cannot be sent.
    F16,
    /// bfloat16: 8 significant bits over f32's range.
    Bf16,
}

/// What converting costs the communication thread, per value (ns): encoding a value it sends,
/// decoding one it receives, and rounding each value of its sum at the end. `--compress auto`
/// weighs these against the link time the halved bytes save.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WireRates {
    /// fp16: (encode, decode, round) ns per value.
    pub fp16: (f64, f64, f64),
    /// bf16: as `fp16`.
    pub bf16: (f64, f64, f64),
}

impl WireRates {
    /// Measured with `dptrain bench compress` on this project's machine (2-core AMD EPYC,
    /// AVX-512, 2026-12-03), 1 MiB buffers, median of 9 rounds, nothing else running; the 64 KiB
    /// and 16 MiB rows were within 20%. Machines with F16C convert fp16 in hardware; the
    /// figures are one core's, not a model of others.
    pub const MEASURED: WireRates = WireRates {
        fp16: (0.75, 0.52, 0.55),
        bf16: (0.37, 0.52, 0.16),
    };

    /// Seconds a rank spends converting when it sends `sent` values, receives `received` and
    /// ends with a sum of `len`, in `format`.
    pub fn seconds(&self, format: WireFormat, sent: f64, received: f64, len: f64) -> f64 {
        let (e, d, r) = match format {
            WireFormat::F32 => return 0.0,
            WireFormat::F16 => self.fp16,
            WireFormat::Bf16 => self.bf16,
        };
        (sent * e + received * d + len * r) * 1e-9
    }
}

/// Values converted per block: stack buffers of this size, no heap.
const BLOCK: usize = 256;

impl WireFormat {
    /// Bytes one value takes on the wire.
    pub fn bytes_per_value(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// Parses `none`, `fp16` or `bf16`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "f32" => Ok(Self::F32),
            "fp16" | "f16" | "half" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            _ => Err(format!(
                "--compress must be none, fp16 or bf16, not {s:?} (fp16: 16-bit IEEE floats on \
                 the wire, largest 65504; bf16: 16 bits with f32's range)"
            )),
        }
    }

    /// f32 carriers a message of `values` values takes.
    pub fn carriers(self, values: usize) -> usize {
        match self {
            Self::F32 => values,
            Self::F16 | Self::Bf16 => values.div_ceil(2),
        }
    }

    /// Narrows `src` to 16 bits, two values per f32 carrier, into `dst` (`carriers(src.len())`
    /// long). Fails on a finite value past fp16's range.
    pub fn encode(self, src: &[f32], dst: &mut [f32]) -> Result<(), f32> {
        debug_assert_eq!(dst.len(), self.carriers(src.len()));
        if self == Self::F32 {
            dst.copy_from_slice(src);
            return Ok(());
        }
        let mut halves = [0u16; BLOCK];
        for (values, carriers) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK / 2)) {
            let h = &mut halves[..values.len()];
            self.narrow(values, h)?;
            for (c, pair) in carriers.iter_mut().zip(h.chunks(2)) {
                let hi = pair.get(1).copied().unwrap_or(0);
                *c = f32::from_bits(u32::from(pair[0]) | (u32::from(hi) << 16));
            }
        }
        Ok(())
    }

    /// 16-bit patterns of `src` in `dst`; a finite value that fp16 cannot hold is the error.
    fn narrow(self, src: &[f32], dst: &mut [u16]) -> Result<(), f32> {
        match self {
            Self::F32 => unreachable!("f32 is not narrowed"),
            Self::F16 => {
                dst.reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(src);
                // Infinity out of a finite value: past the range (rounding up to 65520 or more).
                let overflow = dst
                    .iter()
                    .zip(src)
                    .find(|&(&h, &x)| h & 0x7fff == 0x7c00 && x.is_finite());
                match overflow {
                    Some((_, &x)) => Err(x),
                    None => Ok(()),
                }
            }
            Self::Bf16 => {
                for (d, &x) in dst.iter_mut().zip(src) {
                    *d = bf16::from_f32(x).to_bits();
                }
                Ok(())
            }
        }
    }

    /// f32 values of the 16-bit patterns `src` in `dst`.
    fn widen(self, src: &[u16], dst: &mut [f32]) {
        match self {
            Self::F32 => unreachable!("f32 is not widened"),
            Self::F16 => src.reinterpret_cast::<f16>().convert_to_f32_slice(dst),
            // bf16 is f32's top half: exact by a shift.
            Self::Bf16 => {
                for (d, &h) in dst.iter_mut().zip(src) {
                    *d = f32::from_bits(u32::from(h) << 16);
                }
            }
        }
    }

    /// Widens in place: `buf`'s first `carriers(buf.len())` elements hold the message; on
    /// return `buf` holds its values. Blocks run from the end, so a block's values are
    /// written only over carriers already read.
    pub fn decode_in_place(self, buf: &mut [f32]) {
        if self == Self::F32 {
            return;
        }
        let n = buf.len();
        let mut halves = [0u16; BLOCK];
        let mut values = [0f32; BLOCK];
        let mut start = n.div_ceil(BLOCK) * BLOCK;
        while start > 0 {
            start -= BLOCK;
            let len = BLOCK.min(n - start);
            let first = start / 2;
            for (i, pair) in halves[..len].chunks_mut(2).enumerate() {
                let bits = buf[first + i].to_bits();
                pair[0] = bits as u16;
                if let Some(hi) = pair.get_mut(1) {
                    *hi = (bits >> 16) as u16;
                }
            }
            self.widen(&halves[..len], &mut values[..len]);
            buf[start..start + len].copy_from_slice(&values[..len]);
        }
    }

    /// Rounds every value of `buf` to what the wire would carry. Fails as sending would.
    pub fn round(self, buf: &mut [f32]) -> Result<(), f32> {
        if self == Self::F32 {
            return Ok(());
        }
        let mut halves = [0u16; BLOCK];
        for block in buf.chunks_mut(BLOCK) {
            let h = &mut halves[..block.len()];
            self.narrow(block, h)?;
            self.widen(h, block);
        }
        Ok(())
    }
}

impl WireFormat {
    /// The name `--compress` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "none",
            Self::F16 => "fp16",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for WireFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A transport whose messages travel in `format` (see the module docs). `outgoing` is the
/// buffer a send encodes into: the caller's, reserved once, so a step allocates nothing.
pub struct WireTransport<'a> {
    inner: &'a dyn Transport,
    format: WireFormat,
    outgoing: &'a Mutex<Vec<f32>>,
}

impl<'a> WireTransport<'a> {
    /// `inner`'s messages in `format`, encoded through `outgoing`.
    pub fn new(
        inner: &'a dyn Transport,
        format: WireFormat,
        outgoing: &'a Mutex<Vec<f32>>,
    ) -> Self {
        Self {
            inner,
            format,
            outgoing,
        }
    }

    fn overflow(&self, value: f32) -> CommError {
        CommError::WireOverflow {
            rank: self.inner.rank(),
            format: self.format.name(),
            value,
        }
    }
}

impl Transport for WireTransport<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world(&self) -> usize {
        self.inner.world()
    }

    fn send(&self, to: usize, tag: u64, data: &[f32]) -> Result<(), CommError> {
        if self.format == WireFormat::F32 {
            return self.inner.send(to, tag, data);
        }
        // Only this rank's communication thread sends through it: never contended.
        let mut out = self.outgoing.lock().unwrap_or_else(|p| p.into_inner());
        out.resize(self.format.carriers(data.len()), 0.0);
        self.format
            .encode(data, &mut out)
            .map_err(|v| self.overflow(v))?;
        self.inner.send(to, tag, &out)
    }

    fn recv(&self, from: usize, tag: u64, out: &mut [f32]) -> Result<(), CommError> {
        if self.format == WireFormat::F32 {
            return self.inner.recv(from, tag, out);
        }
        let carriers = self.format.carriers(out.len());
        self.inner.recv(from, tag, &mut out[..carriers])?;
        self.format.decode_in_place(out);
        Ok(())
    }

    fn warm_up(&self, largest_message: usize) {
        self.inner.warm_up(largest_message);
    }

    fn shared_memory(&self) -> Option<SharedMemory<'_>> {
        self.inner.shared_memory()
    }

    fn round_to_wire(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.format.round(buf).map_err(|v| self.overflow(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.731).sin() * 3.0).powi(3) * 10f32.powi(i as i32 % 7 - 3))
            .collect()
    }

    #[test]
    fn a_message_round_trips_to_the_rounded_values_at_every_length() {
        for format in [WireFormat::F16, WireFormat::Bf16] {
            for n in [0, 1, 2, 3, 255, 256, 257, 511, 512, 513, 1000] {
                let src = values(n);
                let mut wire = vec![0f32; format.carriers(n)];
                format.encode(&src, &mut wire).unwrap();
                let mut buf = vec![f32::NAN; n];
                buf[..wire.len()].copy_from_slice(&wire);
                format.decode_in_place(&mut buf);
                let mut rounded = src.clone();
                format.round(&mut rounded).unwrap();
                assert_eq!(
                    buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    rounded.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{format} n={n}"
                );
                // Rounding is to nearest: within half a unit of the last place kept.
                let ulp = if format == WireFormat::F16 {
                    2f32.powi(-11)
                } else {
                    2f32.powi(-8)
                };
                for (x, r) in src.iter().zip(&rounded) {
                    if x.abs() > 1e-4 {
                        assert!((x - r).abs() <= x.abs() * ulp, "{format}: {x} -> {r}");
                    }
                }
                // And idempotent: a rounded value travels exactly.
                let mut again = rounded.clone();
                format.round(&mut again).unwrap();
                assert_eq!(again, rounded);
            }
        }
    }

    #[test]
    fn fp16_refuses_a_value_past_its_range_and_bf16_carries_it() {
        let mut src = values(300);
        src[277] = 70_000.0;
        let mut wire = vec![0f32; 150];
        assert_eq!(WireFormat::F16.encode(&src, &mut wire), Err(70_000.0));
        assert!(WireFormat::Bf16.encode(&src, &mut wire).is_ok());
        // Non-finite values are not an overflow: they pass for the trainer to see.
        src[277] = f32::INFINITY;
        src[3] = f32::NAN;
        WireFormat::F16.encode(&src, &mut wire).unwrap();
        let mut buf = vec![0f32; 300];
        buf[..150].copy_from_slice(&wire);
        WireFormat::F16.decode_in_place(&mut buf);
        assert!(buf[277].is_infinite() && buf[3].is_nan());
        assert!(WireFormat::F16.round(&mut [65504.0]).is_ok());
    }

    #[test]
    fn f32_encodes_as_a_copy_and_decodes_as_itself() {
        let src = values(9);
        let mut wire = vec![0f32; 9];
        WireFormat::F32.encode(&src, &mut wire).unwrap();
        WireFormat::F32.decode_in_place(&mut wire);
        assert_eq!(wire, src);
    }

    #[test]
    fn names_round_trip_and_a_bad_one_is_refused() {
        for f in [WireFormat::F32, WireFormat::F16, WireFormat::Bf16] {
            assert_eq!(WireFormat::parse(&f.to_string()).unwrap(), f);
        }
        let e = WireFormat::parse("zstd").unwrap_err();
        assert!(e.contains("none, fp16 or bf16"), "{e}");
    }
}
