//! The command line: argument definitions and dispatch. The binary only calls [`run`].

use crate::bench;
use crate::comm::{parse_bandwidth, parse_duration, CommMode, LinkModel};
use crate::config::TrainOptions;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

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
    /// Dataset tools.
    #[command(subcommand)]
    Data(DataCmd),
    /// Model tools.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Measure (or derive from FLOPs) a model's per-block step profile and write it as JSON.
    Profile(crate::sim::cli::ProfileArgs),
    /// Simulate a training step on N workers from a profile: step time, exposed communication
    /// and scaling efficiency per mode, overlap setting and bucket size.
    Simulate(crate::sim::cli::SimulateArgs),
    /// Regenerate each run directory's report.md and plots from its summary.json and
    /// metrics.jsonl; with several runs, also compare them side by side.
    Report {
        /// Run directories.
        #[arg(required = true)]
        run_dirs: Vec<PathBuf>,
        /// Where the comparison (comparison.md, breakdown.png) goes, with several runs (the
        /// directory is created; its parent must exist) [default: runs/comparison].
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ModelCmd {
    /// Check a model and print each layer's output shape, parameters, multiply-accumulates
    /// and activation memory per sample, with the totals.
    Show {
        /// A built-in model name or a model file (see docs/MODEL_FILES.md).
        model: String,
        /// Input shape CxHxW [default: the model file's `input`, else 3x32x32].
        #[arg(long)]
        input: Option<String>,
        /// Classes [default: the model file's `classes`, else 10].
        #[arg(long)]
        classes: Option<usize>,
    },
    /// List the built-in models.
    List,
}

#[derive(Debug, Subcommand)]
enum DataCmd {
    /// Write a dataset as an ImageFolder (DIR/train/<class>/N.png, DIR/test/...), e.g. to train
    /// with `--dataset imagefolder --data-dir DIR`.
    ExportImages {
        /// Dataset to export (any name `train --dataset` takes).
        #[arg(long, default_value = "mnist")]
        dataset: String,
        /// Its directory, where it needs one.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Output directory: new or empty (created if absent; its parent must exist).
        #[arg(long)]
        out: PathBuf,
        /// Export only the first N samples of each split.
        #[arg(long)]
        limit: Option<usize>,
        /// Replace an earlier export in --out (its train/ and test/ are deleted first).
        #[arg(long)]
        overwrite: bool,
    },
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
    /// All-reduce time, algbw and busbw per size and mode: worker threads of this process, or
    /// (`--transport mpi`, under `mpirun -np P`) across MPI ranks next to MPI_Allreduce.
    Allreduce {
        /// Workers (in-process), or worker threads per MPI rank [default: 2 in-process, 1 per
        /// rank with --transport mpi].
        #[arg(long)]
        workers: Option<usize>,
        /// inproc (worker threads of this process) or mpi (run under mpirun; only rank 0
        /// prints) [default: inproc].
        #[arg(long, default_value = "inproc")]
        transport: String,
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
    /// Input pipeline: images/s of the loaders alone, and data wait in training, prefetch off
    /// and on.
    Data {
        /// Dataset (e.g. imagefolder with --data-dir, after `dptrain data export-images`).
        #[arg(long, default_value = "mnist")]
        dataset: String,
        /// Dataset directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Loader-thread counts, comma-separated.
        #[arg(long, default_value = "1,2")]
        loader_threads: String,
        /// Batches prefetched per worker in the "on" runs.
        #[arg(long, default_value_t = 2)]
        prefetch: usize,
        /// Augmentation (off, or e.g. crop:4,flip).
        #[arg(long, default_value = "off")]
        augment: String,
        /// Model of the training runs.
        #[arg(long, default_value = "lenet5")]
        model: String,
        /// Global batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Workers in the training runs.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Compute threads per worker [default: cores / workers].
        #[arg(long)]
        threads: Option<usize>,
        /// Batches timed for the pipeline alone.
        #[arg(long, default_value_t = 200)]
        batches: usize,
        /// Timed training steps per run.
        #[arg(long, default_value_t = 60)]
        steps: usize,
    },
    /// The paper's experiment: Caffe's scheme, then + overlap, + redundant mode, + auto mode,
    /// + preloading, one row each (measured, and simulated at 8, 64 and 512 workers).
    Ablation(crate::bench::ablation::AblationArgs),
    /// Every comparison the project is judged on (step time, all-reduce, overlap, data wait,
    /// ablation, simulator check), written to one markdown page with plots.
    Suite(crate::bench::suite::SuiteArgs),
    /// The step simulator against measured emulated runs, side by side.
    SimCheck(crate::bench::simcheck::SimCheckArgs),
    /// Grid of overlap on/off x communication mode x emulated bandwidth for a model.
    Overlap {
        /// Model.
        #[arg(long, default_value = "vgg-small")]
        model: String,
        /// Workers.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Compute threads per worker.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Global batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Emulated bandwidths, comma-separated ("none" for no emulation).
        #[arg(long, default_value = "none,100Mbit,20Mbit")]
        link_bandwidth: String,
        /// Emulated latency.
        #[arg(long, default_value = "50us")]
        link_latency: String,
        /// Modes, comma-separated.
        #[arg(long, default_value = "tree,ring,hd,redundant,auto")]
        comm: String,
        /// Bucket cap in KiB.
        #[arg(long)]
        bucket_kb: Option<usize>,
        /// Timed steps per cell.
        #[arg(long, default_value_t = 15)]
        steps: usize,
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
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            format!("bad size '{s}': use bytes with an optional K, M or G suffix (e.g. 64M)")
        })
}

/// Parses one entry of a `--threads` list: a count of at least 1.
fn parse_thread_count(t: &str) -> Result<usize, String> {
    match t.parse::<usize>() {
        Ok(0) => Err("--threads 0: a step needs at least 1 compute thread".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "bad thread count '{t}': use whole numbers, e.g. 1,2"
        )),
    }
}

/// Benchmarks measure the thread counts asked for, also past the cores (that is a measurement
/// too), but never silently: each count above the cores gets a warning.
fn check_bench_threads(threads: &[usize]) {
    let cores = crate::limits::cores();
    for &t in threads.iter().filter(|&&t| t > cores) {
        print_warning(&format!(
            "--threads {t} is more than the {cores} cores this process may use: those threads \
             time-slice, so the step time measured for {t} is not a {t}-core figure"
        ));
    }
}

/// Sizes in bytes for an all-reduce of f32 values: below one f32 (4 bytes) is refused, and a
/// size that is not a whole number of f32s is rounded down to one, with a note saying so.
fn float_sizes(sizes: &[usize]) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(sizes.len());
    for &s in sizes {
        if s < 4 {
            return Err(format!(
                "--sizes: {s} bytes is less than one f32 (4 bytes), and the all-reduce sums \
                 f32 values: give at least 4"
            ));
        }
        let rounded = s - s % 4;
        if rounded != s {
            print_warning(&format!(
                "--sizes: {s} bytes is not a whole number of f32 values: measuring {rounded} bytes"
            ));
        }
        out.push(rounded);
    }
    Ok(out)
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

/// Diagnostic messages (bucket plan, mode choices, files written) go to stderr through
/// `tracing`, filtered by `RUST_LOG` (e.g. `RUST_LOG=dptrain=debug`); warnings only by default,
/// so stdout stays the progress and results.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Prints `error: MESSAGE` to stderr in one write, so lines from several MPI ranks sharing one
/// terminal or pipe do not interleave mid-line (`eprintln!` writes its pieces separately).
pub fn print_error(message: &str) {
    use std::io::Write;
    let line = format!("error: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Prints `warning: MESSAGE` to stderr as one preformatted string (one write, see
/// [`print_error`]); through `eprint!`, so that tests capture it.
pub fn print_warning(message: &str) {
    let line = format!("warning: {message}\n");
    eprint!("{line}");
}

/// `dptrain model show`.
fn model_show(model: &str, input: Option<&str>, classes: Option<usize>) -> Result<(), String> {
    let spec = crate::model::load(model).map_err(|e| e.to_string())?;
    let shape = match input {
        Some(s) => {
            let dims: Vec<usize> = s
                .split('x')
                .map(|d| {
                    d.trim()
                        .parse()
                        .map_err(|_| format!("--input {s:?}: expected CxHxW, e.g. 3x32x32"))
                })
                .collect::<Result<_, _>>()?;
            match dims[..] {
                [c, h, w] if c > 0 && h > 0 && w > 0 => [c, h, w],
                _ => {
                    return Err(format!(
                        "--input {s:?}: expected three positive sizes CxHxW, e.g. 3x32x32"
                    ))
                }
            }
        }
        None => spec.default_input.unwrap_or([3, 32, 32]),
    };
    let classes = classes.or(spec.default_classes).unwrap_or(10);
    if classes == 0 {
        return Err("--classes must be at least 1".into());
    }
    let g = crate::model::Graph::build(&spec, shape, classes).map_err(|e| e.to_string())?;
    println!(
        "{} ({}): input {}x{}x{}, {classes} classes{}",
        g.name,
        spec.source,
        shape[0],
        shape[1],
        shape[2],
        if spec.description.is_empty() {
            String::new()
        } else {
            format!("; {}", spec.description)
        }
    );
    print!("{}", crate::model::summary::render(&g));
    Ok(())
}

/// Parses the command line and runs the command; the error is the message to print.
pub fn run() -> Result<(), String> {
    let cli = Cli::parse();
    init_logging();
    match cli.command.unwrap_or_default() {
        Command::Profile(a) => crate::sim::cli::profile(a),
        Command::Model(ModelCmd::Show {
            model,
            input,
            classes,
        }) => model_show(&model, input.as_deref(), classes),
        Command::Model(ModelCmd::List) => {
            for name in crate::model::builtin_names() {
                let spec = crate::model::load(name).map_err(|e| e.to_string())?;
                println!("{name:<20} {}", spec.description);
            }
            Ok(())
        }
        Command::Bench(BenchCmd::SimCheck(a)) => bench::simcheck::run(a),
        Command::Bench(BenchCmd::Ablation(a)) => bench::ablation::run_command(a),
        Command::Bench(BenchCmd::Suite(a)) => bench::suite::run_command(a),
        Command::Simulate(a) => crate::sim::cli::simulate(a),
        Command::Report { run_dirs, out } => {
            for dir in &run_dirs {
                let figures = crate::report::write_run_report(dir)?;
                println!("{}: report.md and {} figures", dir.display(), figures.len());
            }
            if run_dirs.len() > 1 {
                let out = match out {
                    Some(out) => out,
                    None => {
                        // The default is ours, not the user's: its parent `runs/` may be made.
                        crate::output::create_dir(Path::new("runs"))?;
                        PathBuf::from("runs/comparison")
                    }
                };
                let table = crate::report::write_comparison(&run_dirs, &out)?;
                println!("{table}\ncomparison written to {}", out.display());
            }
            Ok(())
        }
        Command::Train(t) => {
            let options = match &t.config {
                Some(path) => TrainOptions::from_toml_file(path)?.overlaid_with(&t.options),
                None => t.options,
            };
            let cfg = options.resolve()?;
            let json_log = cfg.log_format == crate::config::LogFormat::Json;
            let group = crate::train::ProcessGroup::start(cfg.transport, cfg.comm_timeout)?;
            let (rank, processes) = (group.rank(), group.size());
            let result = crate::train::train_in(cfg, &group, &print_warning);
            // The report is a view of the files the run wrote (also before a late write error);
            // failing to draw it loses no result.
            let written = result.as_ref().map_or_else(|e| e.summary(), Some);
            if let (Some(s), 0) = (written, rank) {
                if let Err(e) = crate::report::write_run_report(&s.run_dir) {
                    tracing::warn!("cannot write the run report: {e}");
                }
            }
            if let (Err(e), true) = (&result, processes > 1) {
                // Reported before the ranks part: once one rank exits with an error, mpirun
                // may stop the others before they have said why.
                print_error(&format!("rank {rank} of {processes}: {e}"));
                group.end(false);
                std::process::exit(1);
            }
            group.end(result.is_ok());
            let s = result?;
            if rank != 0 {
                return Ok(());
            }
            let warnings = s.warnings();
            if json_log {
                let line = serde_json::json!({
                    "kind": "done",
                    "final_test_accuracy": s.final_test_accuracy,
                    "images_per_s": s.images_per_s,
                    "wall_seconds": s.wall_seconds,
                    "breakdown": s.breakdown,
                    "skipped_nonfinite_updates": s.skipped_nonfinite_updates,
                    "steps": s.steps,
                    "warnings": warnings,
                    "run_dir": s.run_dir,
                });
                println!("{line}");
                return Ok(());
            }
            println!(
                "done: test accuracy {:.2}%, {:.0} images/s, {:.1} s; {}\nrun directory: {}",
                100.0 * s.final_test_accuracy,
                s.images_per_s,
                s.wall_seconds,
                s.breakdown.describe(),
                s.run_dir.display()
            );
            for w in &warnings {
                println!("warning: {w}");
            }
            Ok(())
        }
        Command::Bench(BenchCmd::Step {
            model,
            batch,
            threads,
            steps,
        }) => {
            let threads = list(&threads, parse_thread_count)?;
            check_bench_threads(&threads);
            if batch == 0 || steps == 0 {
                return Err("--batch and --steps must be at least 1".into());
            }
            for m in model.split(',') {
                crate::sim::cli::check_step_memory(m.trim(), batch, 1)?;
            }
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
        Command::Bench(BenchCmd::Overlap {
            model,
            workers,
            threads,
            batch,
            link_bandwidth,
            link_latency,
            comm,
            bucket_kb,
            steps,
        }) => {
            use bench::overlap::{header, row, run_case, GridSpec, OverlapCase};
            if workers < 2 || batch % workers != 0 {
                return Err("--workers must be at least 2 and divide --batch".into());
            }
            let tmp =
                std::env::temp_dir().join(format!("dptrain-bench-overlap-{}", std::process::id()));
            let spec = GridSpec {
                model: model.clone(),
                workers,
                batch,
                threads,
                steps,
                bucket_kb,
            };
            let base = OverlapCase {
                comm: "ring".into(),
                overlap: true,
                bandwidth: None,
                latency: None,
            };
            let single = run_case(
                &GridSpec {
                    workers: 1,
                    batch: batch / workers,
                    ..spec.clone()
                },
                &base,
                &tmp,
            )?
            .images_per_s;
            println!("{model}, {workers} workers x {threads} threads, global batch {batch}, latency {link_latency}; 1 worker at batch {}: {single:.0} images/s", batch / workers);
            println!("{}", header());
            for bw in link_bandwidth.split(',') {
                for mode in comm.split(',') {
                    for overlap in [true, false] {
                        let case = OverlapCase {
                            comm: mode.trim().into(),
                            overlap,
                            bandwidth: (bw.trim() != "none").then(|| bw.trim().to_string()),
                            latency: Some(link_latency.clone()),
                        };
                        let s = run_case(&spec, &case, &tmp)?;
                        println!("{}", row(&case, &s, workers, single));
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Command::Data(DataCmd::ExportImages {
            dataset,
            data_dir,
            out,
            limit,
            overwrite,
        }) => {
            // Checked before the dataset is loaded: a refusal costs nothing.
            crate::data::image_folder::prepare_export_dir(&out, overwrite)
                .map_err(|e| e.to_string())?;
            let cfg = TrainOptions {
                dataset: Some(dataset),
                data_dir,
                train_limit: limit,
                test_limit: limit,
                batch: Some(1),
                ..Default::default()
            }
            .resolve()?;
            let (train, test) = crate::train::load_data(&cfg)?;
            let pair = crate::data::DatasetPair { train, test };
            let n =
                crate::data::image_folder::export(&pair, &out, None).map_err(|e| e.to_string())?;
            println!(
                "wrote {n} PNG files to {} (train/ and test/, {} classes); train with \
                 --dataset imagefolder --data-dir {}",
                out.display(),
                pair.train.num_classes,
                out.display()
            );
            Ok(())
        }
        Command::Bench(BenchCmd::Data {
            dataset,
            data_dir,
            loader_threads,
            prefetch,
            augment,
            model,
            batch,
            workers,
            threads,
            batches,
            steps,
        }) => {
            use bench::data::{data_wait_pct, pipeline_images_per_s, training_run};
            let counts = list(&loader_threads, |t| {
                t.parse::<usize>()
                    .map_err(|_| format!("bad loader-thread count '{t}'"))
            })?;
            if prefetch == 0 {
                return Err("--prefetch is the \"on\" setting; give at least 1".into());
            }
            let base = TrainOptions {
                dataset: Some(dataset.clone()),
                data_dir,
                augment: Some(augment.clone()),
                model: Some(model.clone()),
                batch: Some(batch),
                workers: Some(workers),
                threads,
                ..Default::default()
            };
            base.resolve()?;
            println!("input pipeline alone: {dataset}, batch {batch}, augment {augment}, {batches} batches");
            println!(
                "{:>14} {:>9} {:>12}",
                "loader threads", "prefetch", "images/s"
            );
            let sync = pipeline_images_per_s(&base, 1, 0, batches)?;
            println!("{:>14} {:>9} {:>12.0}", "(in step)", 0, sync);
            println!(
                "RESULT dptrain data pipeline loader_threads=0 prefetch=0 images_per_s={sync:.0}"
            );
            for &t in &counts {
                let r = pipeline_images_per_s(&base, t, prefetch, batches)?;
                println!("{:>14} {:>9} {:>12.0}", t, prefetch, r);
                println!("RESULT dptrain data pipeline loader_threads={t} prefetch={prefetch} images_per_s={r:.0}");
            }
            let tmp =
                std::env::temp_dir().join(format!("dptrain-bench-data-{}", std::process::id()));
            println!("\ntraining: {model}, {workers} worker(s), {steps} timed steps");
            println!(
                "{:>14} {:>9} {:>9} {:>9} {:>12} {:>10} {:>8}",
                "loader threads",
                "prefetch",
                "step ms",
                "data ms",
                "data wait %",
                "images/s",
                "RSS MiB"
            );
            let mut cases = vec![(1, 0)];
            cases.extend(counts.iter().map(|&t| (t, prefetch)));
            for (t, k) in cases {
                let s = training_run(&base, t, k, steps, &tmp)?;
                let m = &s.breakdown.mean;
                let shown = if k == 0 {
                    "(in step)".to_string()
                } else {
                    t.to_string()
                };
                println!(
                    "{:>14} {:>9} {:>9.2} {:>9.3} {:>12.2} {:>10.0} {:>8.0}",
                    shown,
                    k,
                    m.step_ms,
                    m.data_ms,
                    data_wait_pct(&s),
                    s.images_per_s,
                    s.peak_rss_mb
                );
                println!(
                    "RESULT dptrain data train loader_threads={t} prefetch={k} data_wait_pct={:.2}",
                    data_wait_pct(&s)
                );
            }
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Command::Bench(BenchCmd::Allreduce {
            workers,
            transport,
            sizes,
            comm,
            link_bandwidth,
            link_latency,
            iters,
        }) => {
            let transport = crate::config::TransportKind::parse(&transport)?;
            let mpi = transport == crate::config::TransportKind::Mpi;
            let workers = workers.unwrap_or(if mpi { 1 } else { 2 });
            if workers == 0 || iters == 0 {
                return Err("--workers and --iters must be at least 1".into());
            }
            let sizes = float_sizes(&list(&sizes, parse_size)?)?;
            if mpi {
                if comm != "all" || link_bandwidth.is_some() || link_latency.is_some() {
                    return Err(
                        "bench allreduce --transport mpi compares every mode on the \
                                real link: leave out --comm and --link-*"
                            .into(),
                    );
                }
                return bench_allreduce_mpi(workers, &sizes, iters);
            }
            // "auto" runs the mode the cost model picks for each size (shown as auto:MODE).
            let with_auto = comm == "all" || comm.split(',').any(|m| m.trim() == "auto");
            let modes = if comm == "all" {
                CommMode::ALL.to_vec()
            } else {
                list(&comm.replace("auto", "").replace(",,", ","), |m| {
                    m.parse::<CommMode>()
                })
                .or_else(|e| {
                    if comm.trim() == "auto" {
                        Ok(Vec::new())
                    } else {
                        Err(e)
                    }
                })?
            };
            let link = parse_link(&link_bandwidth, &link_latency)?;
            if let Some(l) = &link {
                crate::config::check_link_against_timeout(l, bench::allreduce::TIMEOUT_S as f64)?;
            }
            // Each worker holds the buffer, a scratch copy and the messages in flight.
            let largest = sizes.iter().copied().max().unwrap_or(0);
            crate::limits::check_memory(
                &format!("an all-reduce of {largest} bytes on {workers} workers"),
                3.0 * workers as f64 * largest as f64,
                "give smaller --sizes or fewer --workers",
            )?;
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
                let auto = with_auto.then(|| {
                    let model = link.unwrap_or(crate::train::worker::IN_PROCESS_LINK);
                    crate::comm::choose_mode(workers, bytes, &model)
                });
                let rows = modes
                    .iter()
                    .map(|&m| (m, false))
                    .chain(auto.map(|m| (m, true)));
                for (mode, is_auto) in rows {
                    let r = bench::allreduce::bench_allreduce(workers, bytes, mode, link, iters)?;
                    let name = if is_auto {
                        format!("auto:{mode}")
                    } else {
                        mode.to_string()
                    };
                    println!(
                        "{:>12} {:>10} {:>12.1} {:>12.3} {:>12.3}",
                        bytes,
                        name,
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

/// `bench allreduce --transport mpi`: this process is one rank; rank 0 prints the table.
fn bench_allreduce_mpi(workers: usize, sizes: &[usize], iters: usize) -> Result<(), String> {
    let timeout = std::time::Duration::from_secs(120);
    let group = crate::train::ProcessGroup::start(crate::config::TransportKind::Mpi, timeout)?;
    let result = bench::allreduce::bench_allreduce_processes(&group, workers, sizes, iters);
    let (rank, processes) = (group.rank(), group.size());
    group.end(result.is_ok());
    let rows = result.map_err(|e| format!("rank {rank} of {processes}: {e}"))?;
    if rank != 0 {
        return Ok(());
    }
    println!(
        "all-reduce over MPI: {processes} processes x {workers} workers ({} in all), median of \
         {iters}; busbw = algbw * 2(N-1)/N",
        processes * workers
    );
    println!(
        "{:>12} {:>20} {:>12} {:>12} {:>12}",
        "bytes", "mode", "time us", "algbw GB/s", "busbw GB/s"
    );
    for r in rows {
        println!(
            "{:>12} {:>20} {:>12.1} {:>12.3} {:>12.3}",
            r.bytes,
            r.name,
            r.time.as_secs_f64() * 1e6,
            r.algbw / 1e9,
            r.busbw / 1e9
        );
    }
    Ok(())
}
