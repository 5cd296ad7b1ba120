//! The command line: argument definitions and dispatch. The binary only calls [`run`].

use crate::bench;
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::config::TrainOptions;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Fast data-parallel training of convolutional neural networks.
#[derive(Debug, Parser)]
#[command(name = "dptrain", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a model (the default command: lenet5 on the bundled MNIST).
    Train(Box<TrainCmd>),
    /// Benchmarks that print figures.
    #[command(subcommand)]
    Bench(BenchCmd),
}

impl Default for Command {
    fn default() -> Self {
        Command::Train(Box::default())
    }
}

#[derive(Debug, clap::Args, Default)]
struct TrainCmd {
    /// TOML file with options (same names as the flags); flags given here win.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    options: TrainOptions,
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// Median training-step time of a model on one worker.
    Step {
        /// Models, comma-separated.
        #[arg(long, default_value = "lenet5,vgg-small")]
        model: String,
        /// Batch size.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Thread counts, comma-separated.
        #[arg(long, default_value = "1,2")]
        threads: String,
        /// Timed steps.
        #[arg(long, default_value_t = 30)]
        steps: usize,
    },
    /// In-process all-reduce time, algbw and busbw per size and mode.
    Allreduce {
        /// Workers.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Sizes in bytes, comma-separated; K, M suffixes allowed.
        #[arg(long, default_value = "4K,64K,1M,16M,64M")]
        sizes: String,
        /// Modes, comma-separated, or all.
        #[arg(long, default_value = "all")]
        comm: String,
        /// Emulated link bandwidth (e.g. 10Gbit).
        #[arg(long)]
        link_bandwidth: Option<String>,
        /// Emulated link latency (e.g. 5us).
        #[arg(long)]
        link_latency: Option<String>,
        /// Timed iterations per size.
        #[arg(long, default_value_t = 10)]
        iters: usize,
    },
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',').map(|x| parse(x.trim())).collect()
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mult).map_err(|_| {
        format!("bad size '{s}': use bytes with an optional K, M or G suffix (e.g. 64M)")
    })
}

fn parse_link(bw: &Option<String>, lat: &Option<String>) -> Result<Option<LinkModel>, String> {
    match bw {
        None if lat.is_some() => Err("--link-latency needs --link-bandwidth too".into()),
        None => Ok(None),
        Some(b) => Ok(Some(LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(b)?,
            latency: parse_duration(lat.as_deref().unwrap_or("0"))?,
        })),
    }
}

/// Parses the command line and runs the command; the error is the message to print.
pub fn run() -> Result<(), String> {
    let cli = Cli::parse();
    match cli.command.unwrap_or_default() {
        Command::Train(t) => {
            let options = match &t.config {
                Some(path) => TrainOptions::from_toml_file(path)?.overlaid_with(&t.options),
                None => t.options,
            };
            let cfg = options.resolve()?;
            let run_dir = cfg.run_dir.clone();
            let s = crate::train::train(cfg)?;
            println!(
                "done: test accuracy {:.2}%, {:.0} images/s, {:.1} s; {}\nrun directory: {}",
                100.0 * s.final_test_accuracy,
                s.images_per_s,
                s.wall_seconds,
                s.breakdown.describe(),
                run_dir.display()
            );
            Ok(())
        }
        Command::Bench(BenchCmd::Step {
            model,
            batch,
            threads,
            steps,
        }) => {
            let threads = list(&threads, |t| {
                t.parse::<usize>()
                    .map_err(|_| format!("bad thread count '{t}'"))
            })?;
            println!(
                "{:<10} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10}",
                "model", "batch", "threads", "step ms", "fwd ms", "bwd ms", "upd ms"
            );
            for m in model.split(',') {
                for &t in &threads {
                    let r = bench::step::bench_step(m.trim(), batch, t, steps)?;
                    println!(
                        "{:<10} {:>5} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                        m, batch, t, r.step_ms, r.forward_ms, r.backward_ms, r.update_ms
                    );
                    println!(
                        "RESULT dptrain {m} time threads={t} median_ms={:.2}",
                        r.step_ms
                    );
                }
            }
            Ok(())
        }
        Command::Bench(BenchCmd::Allreduce {
            workers,
            sizes,
            comm,
            link_bandwidth,
            link_latency,
            iters,
        }) => {
            if workers == 0 {
                return Err("--workers must be at least 1".into());
            }
            let sizes = list(&sizes, parse_size)?;
            let modes = if comm == "all" {
                CommMode::ALL.to_vec()
            } else {
                list(&comm, |m| m.parse::<CommMode>())?
            };
            let link = parse_link(&link_bandwidth, &link_latency)?;
            println!(
                "all-reduce, {workers} workers, link: {}",
                link.map_or("none (memory)".to_string(), |l| format!(
                    "{:.0} MB/s, {:?}",
                    l.bandwidth_bytes_per_s / 1e6,
                    l.latency
                ))
            );
            println!(
                "{:>12} {:>10} {:>12} {:>12} {:>12}",
                "bytes", "mode", "time us", "algbw GB/s", "busbw GB/s"
            );
            for &bytes in &sizes {
                for &mode in &modes {
                    let r = bench::allreduce::bench_allreduce(workers, bytes, mode, link, iters)?;
                    println!(
                        "{:>12} {:>10} {:>12.1} {:>12.3} {:>12.3}",
                        bytes,
                        mode.to_string(),
                        r.time.as_secs_f64() * 1e6,
                        r.algbw / 1e9,
                        r.busbw / 1e9
                    );
                }
            }
            Ok(())
        }
    }
}
