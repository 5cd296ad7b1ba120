//! `dptrain bench ...`: the subcommands' definitions and their dispatch; each command's
//! arguments, measuring and tables live in its `bench/` file.

use crate::bench;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(super) enum BenchCmd {
    /// Median training-step time of a model on one worker.
    Step(bench::step::StepArgs),
    /// Median inference-forward time of a model (what eval and predict run per batch).
    Infer(bench::infer::InferArgs),
    /// All-reduce time, algbw and busbw per size and mode: worker threads of this process, or
    /// (`--transport mpi`, under `mpirun -np P`) across MPI ranks next to MPI_Allreduce.
    Allreduce(bench::allreduce::AllReduceArgs),
    /// Input pipeline: images/s of the loaders alone, and data wait in training, prefetch off
    /// and on.
    Data(bench::data::DataArgs),
    /// Input pipeline alone on photos: images/s of an ImageFolder and packed files, decode +
    /// random-resized-crop + flip + normalise, per loader-thread count (interleaved, medians).
    Loader(bench::loader::LoaderArgs),
    /// The paper's experiment: Caffe's scheme, then + overlap, + redundant mode, + auto mode,
    /// + preloading, one row each (measured, and simulated at 8, 64 and 512 workers).
    Ablation(bench::ablation::AblationArgs),
    /// Every comparison the project is judged on (step time, all-reduce, overlap, data wait,
    /// ablation, simulator check), written to one markdown page with plots.
    Suite(bench::suite::SuiteArgs),
    /// The step simulator against measured emulated runs, side by side.
    SimCheck(Box<bench::simcheck::SimCheckArgs>),
    /// Grid of overlap on/off x communication mode x emulated bandwidth for a model.
    Overlap(bench::overlap::OverlapArgs),
    /// This machine's ceilings: the FMA peak of one core and of all (a register-only loop in
    /// the kernels' ISA) and the memory's copy and add rates.
    Roofline(bench::roofline::RooflineArgs),
    /// What `--compress fp16|bf16` costs the communication thread: ns per value to encode,
    /// decode and round, per buffer size.
    Compress(bench::compress::CompressArgs),
}

/// Runs one `dptrain bench` command.
pub(super) fn run(cmd: BenchCmd) -> Result<(), String> {
    match cmd {
        BenchCmd::Step(a) => bench::step::run_command(a),
        BenchCmd::Infer(a) => bench::infer::run_command(a),
        BenchCmd::Allreduce(a) => bench::allreduce::run_command(a),
        BenchCmd::Data(a) => bench::data::run_command(a),
        BenchCmd::Loader(a) => bench::loader::run_command(a),
        BenchCmd::Ablation(a) => bench::ablation::run_command(a),
        BenchCmd::Suite(a) => bench::suite::run_command(a),
        BenchCmd::SimCheck(a) => bench::simcheck::run(*a),
        BenchCmd::Overlap(a) => bench::overlap::run_command(a),
        BenchCmd::Roofline(a) => bench::roofline::run_command(a),
        BenchCmd::Compress(a) => bench::compress::run_command(a),
    }
}
