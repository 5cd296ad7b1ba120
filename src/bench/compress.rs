//! `dptrain bench compress`: what `--compress` costs the communication thread, per value and
//! per MB: encoding a message (narrowing to 16 bits, two to a carrier), decoding it in place,
//! and rounding a sum as the wire does ([`crate::comm::wire`]); and PowerSGD's compute per value
//! on a square matrix ([`crate::comm::powersgd`]). One thread, buffers of a few
//! bucket sizes, median of the rounds. `auto`'s price of a conversion is this command's figure
//! on this machine ([`crate::comm::wire::WireRates::MEASURED`]).

use crate::comm::WireFormat;
use std::time::Instant;

/// Rounds per figure; the median is reported.
const ROUNDS: usize = 9;

/// Arguments of `dptrain bench compress`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompressArgs {
    /// Buffer sizes in KiB, comma-separated.
    #[arg(long, default_value = "64,1024,16384")]
    pub sizes_kb: String,
}

/// Nanoseconds per value of (encode, decode, round) for `format` on buffers of `values`.
pub fn measure(format: WireFormat, values: usize) -> (f64, f64, f64) {
    let src: Vec<f32> = (0..values)
        .map(|i| ((i as f32) * 0.37).sin() * 1e-2)
        .collect();
    let mut wire = vec![0f32; format.carriers(values)];
    let mut buf = vec![0f32; values];
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..=ROUNDS {
        let t0 = Instant::now();
        format.encode(&src, &mut wire).expect("the values fit");
        let t1 = Instant::now();
        buf[..wire.len()].copy_from_slice(&wire);
        let t2 = Instant::now();
        format.decode_in_place(&mut buf);
        let t3 = Instant::now();
        format.round(&mut buf).expect("the values fit");
        let t4 = Instant::now();
        std::hint::black_box(&buf);
        if round > 0 {
            let per = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e9 / values as f64;
            times[0].push(per(t0, t1));
            times[1].push(per(t2, t3));
            times[2].push(per(t3, t4));
        }
    }
    let [mut e, mut d, mut r] = times;
    (
        super::median(&mut e),
        super::median(&mut d),
        super::median(&mut r),
    )
}

/// PowerSGD's compute on one `side x side` matrix at `rank` (the whole `reduce` with the
/// collectives left out): nanoseconds per gradient value in each phase (before round 1,
/// between the rounds, after round 2: [`crate::comm::powersgd::PowerSgdRates`]), medians of
/// the rounds; and the fraction of the values it sends.
pub fn measure_powersgd(side: usize, rank: usize) -> ([f64; 3], f64) {
    use crate::comm::powersgd::{Matrix, PowerSgdBucket};
    let values = side * side;
    let m = Matrix {
        offset: 0,
        rows: side,
        cols: side,
    };
    let mut state = PowerSgdBucket::new(values, vec![m], rank, 1);
    let grad: Vec<f32> = (0..values)
        .map(|i| ((i as f32) * 0.37).sin() * 1e-2)
        .collect();
    let mut buf = grad.clone();
    let mut phases: [Vec<f64>; 3] = Default::default();
    for round in 0..=ROUNDS {
        buf.copy_from_slice(&grad);
        // The collectives' places: the clock read when each round would start.
        let mut marks = Vec::with_capacity(3);
        marks.push(Instant::now());
        state
            .reduce(&mut buf, |_| {
                marks.push(Instant::now());
                Ok(())
            })
            .expect("no collective to fail");
        marks.push(Instant::now());
        if round > 0 {
            for (phase, pair) in phases.iter_mut().zip(marks.windows(2)) {
                phase.push((pair[1] - pair[0]).as_secs_f64() * 1e9 / values as f64);
            }
        }
        std::hint::black_box(&buf);
    }
    let (first, second) = state.round_lens();
    (
        phases.map(|mut p| super::median(&mut p)),
        (first + second) as f64 / values as f64,
    )
}

/// Runs `dptrain bench compress`.
pub fn run_command(a: CompressArgs) -> Result<(), String> {
    let sizes = super::args::list("--sizes-kb", &a.sizes_kb, |s| {
        s.parse::<usize>()
            .ok()
            .filter(|&k| (1..=1 << 20).contains(&k))
            .ok_or_else(|| format!("--sizes-kb: a size in KiB from 1 to 1048576, not {s:?}"))
    })?;
    crate::outln!(
        "{:>6} {:>10} {:>12} {:>12} {:>12} {:>14}",
        "format",
        "size",
        "encode ns/v",
        "decode ns/v",
        "round ns/v",
        "encode+decode"
    );
    for format in [WireFormat::F16, WireFormat::Bf16] {
        for &kb in &sizes {
            let (e, d, r) = measure(format, kb * 1024 / 4);
            // MB of f32 gradient per second through encode + decode.
            let mb_s = 4.0 / (e + d) * 1e3;
            crate::outln!(
                "{:>6} {:>7} KiB {:>12.3} {:>12.3} {:>12.3} {:>9.0} MB/s",
                format.to_string(),
                kb,
                e,
                d,
                r,
                mb_s
            );
            crate::outln!(
                "RESULT compress {format} size_kb={kb} encode_ns={e:.3} decode_ns={d:.3} \
                 round_ns={r:.3}"
            );
        }
    }
    // PowerSGD on a square matrix of each size: its compute per value (both products, the
    // orthogonalisation, the error feedback and the product sent back), and what it sends.
    crate::outln!(
        "{:>11} {:>10} {:>12} {:>9} {:>9} {:>9} {:>12} {:>14}",
        "format",
        "size",
        "compute ns/v",
        "before",
        "between",
        "after",
        "values sent",
        "compute"
    );
    for rank in [1, 2, 4] {
        for &kb in &sizes {
            let side = ((kb * 1024 / 4) as f64).sqrt() as usize;
            let (phases, sent) = measure_powersgd(side.max(1), rank);
            let ns: f64 = phases.iter().sum();
            crate::outln!(
                "{:>11} {:>7} KiB {:>12.3} {:>9.3} {:>9.3} {:>9.3} {:>11.4}x {:>9.0} MB/s",
                format!("powersgd:{rank}"),
                kb,
                ns,
                phases[0],
                phases[1],
                phases[2],
                sent,
                4.0 / ns * 1e3
            );
            crate::outln!(
                "RESULT compress powersgd:{rank} size_kb={kb} compute_ns={ns:.3} \
                 before_ns={:.3} between_ns={:.3} after_ns={:.3} sent_fraction={sent:.4}",
                phases[0],
                phases[1],
                phases[2]
            );
        }
    }
    Ok(())
}
