//! `dptrain bench infer`: the median time of one inference forward (evaluation mode, on a net
//! set up for inference only: `Net::for_inference`) of a model on random images, what
//! `eval` and `predict` run per batch. `scripts/compare_infer.sh` runs it interleaved with
//! PyTorch's `model.eval()` + `torch.no_grad()` (`../shared/peers/pytorch_infer.py`).

use super::median;
use crate::model;
use crate::nn::{Mode, Net, NetConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `dptrain bench infer`.
#[derive(Debug, Clone, clap::Args)]
pub struct InferArgs {
    /// Models, comma-separated: built-in names (`dptrain model list`) or model files (docs/MODEL_FILES.md).
    #[arg(long, default_value = "resnet18")]
    pub model: String,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub threads: String,
    /// Timed forwards (after 3 warm-up ones).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Time the evaluation forward of a net set up for training instead (every activation
    /// and the gradient buffers kept), for comparison.
    #[arg(long)]
    pub training_net: bool,
}

/// One row: a model at a thread count.
#[derive(Debug, Clone)]
pub struct InferRow {
    /// The model.
    pub model: String,
    /// Compute threads.
    pub threads: usize,
    /// Batch.
    pub batch: usize,
    /// Median milliseconds of one forward of the batch.
    pub median_ms: f64,
    /// Bytes of the net's activation and gradient buffers.
    pub buffer_bytes: usize,
}

/// Times `steps` inference forwards (after 3 warm-up ones) of `model` at `batch` on
/// `threads` threads, on a net set up for inference (or, with `training_net`, for training).
pub fn bench_infer(
    model: &str,
    batch: usize,
    threads: usize,
    steps: usize,
    training_net: bool,
) -> Result<InferRow, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| e.to_string())?;
    pool.install(|| {
        let g = Arc::new(model::reference_graph(model)?);
        let x = g.input();
        let cfg = NetConfig {
            max_batch: batch,
            seed: 1,
        };
        let net = if training_net {
            Net::new(g, cfg)
        } else {
            Net::for_inference(g, cfg)
        };
        let mut net = net.map_err(|e| e.to_string())?;
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let images: Vec<f32> = (0..batch * x.numel())
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let labels = vec![0u32; batch];
        let mut times = Vec::with_capacity(steps);
        for i in 0..steps + 3 {
            let t0 = Instant::now();
            net.forward(&images, &labels, batch, Mode::Eval);
            if i >= 3 {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(InferRow {
            model: model.to_string(),
            threads,
            batch,
            median_ms: median(&mut times),
            buffer_bytes: net.buffer_bytes(),
        })
    })
}

impl InferRow {
    /// The terminal table's header.
    pub fn terminal_header() -> String {
        format!(
            "{:<14} {:>5} {:>7} {:>10} {:>10} {:>11}",
            "model", "batch", "threads", "fwd ms", "images/s", "buffers MB"
        )
    }

    /// The row on the terminal, and its `RESULT` line (the form `pytorch_infer.py` prints).
    pub fn terminal(&self) -> String {
        format!(
            "{:<14} {:>5} {:>7} {:>10.2} {:>10.0} {:>11.1}\n\
             RESULT dptrain {} infer threads={} median_ms={:.3}",
            self.model,
            self.batch,
            self.threads,
            self.median_ms,
            self.batch as f64 * 1e3 / self.median_ms,
            self.buffer_bytes as f64 / 1e6,
            self.model,
            self.threads,
            self.median_ms
        )
    }
}

/// Runs `dptrain bench infer`: a row per model and thread count, printed as measured.
pub fn run_command(a: InferArgs) -> Result<(), String> {
    let threads = super::args::list(
        "--threads",
        &a.threads,
        super::args::thread_count("--threads"),
    )?;
    super::args::check_timed_counts(&[("--steps", a.steps)])?;
    if a.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let models = super::args::entries("--model", &a.model)?;
    // Every row is checked before the first is measured: the training step's memory bounds
    // the inference net's (a superset of its buffers).
    for m in &models {
        for &t in &threads {
            crate::measure::MeasureSpec {
                flags: crate::measure::MeasureFlags::THREADS_ONLY,
                ..crate::measure::MeasureSpec::new(m, a.batch, t, a.steps)
            }
            .check()?;
        }
    }
    super::args::warn_threads_past_cores(&threads);
    crate::outln!("{}", InferRow::terminal_header());
    for m in models {
        for &t in &threads {
            crate::outln!(
                "{}",
                bench_infer(m, a.batch, t, a.steps, a.training_net)?.terminal()
            );
        }
    }
    Ok(())
}
