//! The command line: argument definitions and dispatch. The binary only calls [`run`]; each
//! command with more than a call to make lives in a file of its own here, and the benchmarks'
//! commands in their `bench/` files.

mod bench;
mod checkpoint_arg;
mod data;
mod eval;
mod export;
mod given;
mod launch;
mod model;
mod predict;
mod profile;
mod report;
pub mod simulate;
mod train;
mod values;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use data::DataCmd;
use std::path::PathBuf;

pub use crate::terminal::{print_error, print_warning};

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
    Train(Box<train::TrainCmd>),
    /// Train over MPI and outlive lost hosts: restart on the survivors from the newest
    /// restart point (`train --commit-every`), watching each rank's heartbeat.
    Launch(launch::LaunchArgs),
    /// Benchmarks that print figures.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Dataset tools.
    #[command(subcommand)]
    Data(DataCmd),
    /// Model tools.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Evaluate a checkpoint on a dataset split: loss, top-1, top-5, per-class accuracy and
    /// the confusion matrix.
    Eval(eval::EvalArgs),
    /// Predict the classes of image files (or directories of them) with a checkpoint.
    Predict(predict::PredictArgs),
    /// Write a checkpoint's model as an ONNX inference graph (opset 17, dynamic batch).
    Export(export::ExportArgs),
    /// Measure (or derive from FLOPs) a model's per-block step profile and write it as JSON.
    Profile(profile::ProfileArgs),
    /// Simulate a training step on N workers from a profile: step time, exposed communication
    /// and scaling efficiency per mode, overlap setting and bucket size.
    Simulate(Box<simulate::SimulateArgs>),
    /// Regenerate each run directory's report.md and plots from its summary.json and
    /// metrics.jsonl; with several runs, also compare them side by side.
    Report {
        /// Run directories.
        #[arg(required = true)]
        run_dirs: Vec<PathBuf>,
        /// Where the comparison (comparison.md, comparison.png) goes, with several runs (the
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
        /// Model: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
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

impl Default for Command {
    fn default() -> Self {
        Command::Train(Box::default())
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

/// Parses the command line and runs the command; the error is the message to print.
pub fn run() -> Result<(), String> {
    // Every number option of every subcommand is read by `values`' parsers (see there).
    let matches = values::with_number_parsers(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging();
    match cli.command.unwrap_or_default() {
        Command::Profile(a) => profile::run(a),
        Command::Simulate(a) => simulate::run(*a),
        Command::Model(ModelCmd::Show {
            model,
            input,
            classes,
        }) => model::show(&model, input.as_deref(), classes),
        Command::Model(ModelCmd::List) => model::list(),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Export(a) => export::run(a),
        Command::Data(cmd) => data::run(cmd),
        Command::Report { run_dirs, out } => report::run(&run_dirs, out),
        Command::Train(t) => train::run(*t),
        Command::Launch(a) => launch::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Predict(a) => predict::run(a),
    }
}
