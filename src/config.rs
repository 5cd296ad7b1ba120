//! Training configuration: defaults, the optional TOML file, command-line flags (which win),
//! and validation of the whole before anything starts.

use crate::comm::{parse_bandwidth, parse_duration, LinkModel};
use crate::optim::{LrSchedule, SgdConfig};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::plan::CommChoice;
pub use exchange::{Exchange, Group as ExchangeGroup, TakenGroup};
pub use kib::KibOrAuto;

mod exchange;
mod kib;

/// `--batch` when not given: the global batch.
pub const DEFAULT_BATCH: usize = 64;

/// `--model` when not given.
pub const DEFAULT_MODEL: &str = "lenet5";

/// `--dataset` when not given: the bundled MNIST.
pub const DEFAULT_DATASET: &str = "mnist";

/// `--seed` when not given.
pub const DEFAULT_SEED: u64 = 1;

/// `--workers` when not given: worker threads per process.
pub const DEFAULT_WORKERS: usize = 1;

/// Commits kept in the run directory by default (`--keep-commits`): the newest and the one
/// before it, in case the newest is being written when the run dies (its temporary file is
/// then removed, the older one stays).
pub const DEFAULT_KEEP_COMMITS: usize = 2;

/// Everything a training run needs, validated.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Model: a built-in name or a model file.
    pub model: String,
    /// A model laid out in code ([`crate::model::ModelBuilder`]), trained instead of loading
    /// `model` (which is then its name).
    pub model_spec: Option<std::sync::Arc<crate::model::ModelSpec>>,
    /// Dataset name (`mnist`, `fashion-mnist`, `cifar10`, `idx`, `synthetic[:CxHxW]`).
    pub dataset: String,
    /// Dataset directory, where the dataset needs one.
    pub data_dir: Option<PathBuf>,
    /// Epochs to train.
    pub epochs: usize,
    /// Which of the settings a resumed run takes from its checkpoint's run were given (on the
    /// command line or in a config file): those not given follow the checkpoint
    /// ([`crate::train::recipe`]).
    pub given: GivenSettings,
    /// Global batch size (split evenly across workers).
    pub batch: usize,
    /// Base learning rate.
    pub lr: f32,
    /// Learning-rate schedule.
    pub lr_schedule: LrSchedule,
    /// Linear warm-up, in steps.
    pub warmup_steps: usize,
    /// SGD settings.
    pub sgd: SgdConfig,
    /// Seed for weights, shuffling and synthetic data.
    pub seed: u64,
    /// Worker threads, each with a model replica.
    pub workers: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Communicate buckets during backward.
    pub overlap: bool,
    /// Communication mode.
    pub comm: CommChoice,
    /// With several processes of several workers: how the workers of a process share the
    /// reduction (see [`crate::comm::hierarchical`]: 2-D, through a leader, or flat over every
    /// worker; `auto` lets the cost model pick with `--comm auto`, and is 2-D otherwise). No
    /// effect with one process or one worker each.
    pub hierarchy: crate::plan::HierarchyChoice,
    /// How gradients travel between workers (`--compress`): f32, 16 bits summed in f32
    /// ([`crate::comm::wire`]), or the cost model's choice per bucket.
    pub compress: crate::plan::CompressChoice,
    /// `--first-bucket-kb` and `--bucket-kb` (KiB; 0: one layer per bucket); with neither
    /// given the caps follow the link and the run's collectives (see
    /// [`crate::plan::PlanInputs::bucket_caps`]).
    pub buckets: crate::plan::BucketFlags,
    /// `--partition-kb`: each bucket reduced in collectives of at most this (see
    /// [`crate::plan::partition_bytes`] for the default).
    pub partition_kb: Option<usize>,
    /// `--schedule`: buckets in backward's order and the update after all are back, or
    /// input-first with each layer updated as the next forward needs it
    /// ([`crate::parallel::schedule`]).
    pub schedule: crate::parallel::Schedule,
    /// `--credit-kb`: what one decision of priority scheduling commits every rank to
    /// (`None`: one partition).
    pub credit_kb: Option<usize>,
    /// Emulated link, if any (with `--transport mpi`: the link `--comm auto` plans for).
    pub link: Option<LinkModel>,
    /// With `--transport mpi`: each worker's emulated port within its process
    /// (`--intra-bandwidth`), if any; it is also the within-host link the plan prices.
    pub intra_link: Option<LinkModel>,
    /// The link an MPI run with `--comm auto` and no `--link-*` measured between its processes
    /// before training, as the standard rate it plans for ([`crate::plan::planned_link`]);
    /// `None` until then, and in every other run.
    pub measured_link: Option<LinkModel>,
    /// Emulated device: each worker's compute held to a profile's times (see
    /// [`crate::testbed::device`]).
    pub device: Option<crate::testbed::device::EmulatedDevice>,
    /// How long a collective may wait for a peer.
    pub comm_timeout: Duration,
    /// What connects the workers: threads of this process, or MPI ranks too.
    pub transport: TransportKind,
    /// Processes in the run (MPI ranks; 1 in-process). Not an option: set when MPI starts.
    pub processes: usize,
    /// This process's rank among them (0 in-process). Not an option: set when MPI starts.
    pub process_rank: usize,
    /// Where metrics, summary and checkpoints go.
    pub run_dir: PathBuf,
    /// `--run-dir` was given (else it is the default `runs/<model>-<dataset>`, whose parent
    /// `runs/` may be created too: see [`crate::output`]).
    pub run_dir_given: bool,
    /// Delete an earlier run's files found in the run directory instead of refusing it.
    pub overwrite: bool,
    /// Resume even if the checkpoint's run had another dataset, batch, seed or training limit.
    pub resume_changed: bool,
    /// Things the user should know that do not stop the run (threads capped, cores
    /// oversubscribed); the run prints them at the start.
    pub warnings: Vec<String>,
    /// The options a resume took from its checkpoint's run before they were resolved, as
    /// flags (`--batch 32`), for the run's note: `crate::train::follow::follow_run_options`.
    pub options_from_checkpoint: Vec<String>,
    /// Where a resume took its data from the checkpoint's run (`--data-dir DIR`, or
    /// `--dataset KIND:PATH`), as that flag: a data error then says the place was the run's
    /// (moved data is found only by a new `--data-dir`).
    pub data_from_checkpoint: Option<String>,
    /// The gradient exchange as the options gave it, which checkpoints record for a resume to
    /// follow ([`Exchange`]).
    pub exchange: Exchange,
    /// Whether a resume would have taken options from its checkpoint's record of its run's
    /// exchange, which does not read back (judged before the options resolved:
    /// `train::follow`); the resume refuses it unless `--resume-changed`.
    pub takes_unread_exchange: bool,
    /// The checkpoint's run's exchange options a resume keeps in [`Self::exchange`] without
    /// following them (`--hierarchical`, `--intra-*` in one process), as flags, for its note.
    pub exchange_kept: Vec<String>,
    /// Whether [`Self::intra_link`] was taken from a resumed checkpoint's run (not given): a
    /// run of one MPI process then leaves it out, said, rather than refuse it.
    pub intra_link_followed: bool,
    /// Whether [`Self::skip_bad_samples`] was taken from a resumed checkpoint's run (not
    /// given): said in a note of its own, with the off form to give instead.
    pub skip_bad_samples_followed: bool,
    /// Write a checkpoint every this many epochs (0: only at the end).
    pub checkpoint_every: usize,
    /// Checkpoints to keep.
    pub keep_checkpoints: usize,
    /// Commit a restart point every this many steps (0: none): `train::commit`.
    pub commit_every: usize,
    /// Commits to keep (the newest).
    pub keep_commits: usize,
    /// Where this process sends its heartbeats (`dptrain launch`'s supervisor).
    pub heartbeat: Option<std::net::SocketAddr>,
    /// The `dptrain launch` whose lock on the run directory this job works under.
    pub launched_by: Option<u32>,
    /// Write no checkpoints at all (benchmarks).
    pub no_checkpoints: bool,
    /// Injected fault, for the reliability tests.
    pub fault: Option<crate::testbed::fault::Fault>,
    /// Skip updates whose gradient is not finite (instead of stopping).
    pub skip_nonfinite: bool,
    /// Checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Checkpoint whose weights a new run starts from (`--weights`, fine-tuning).
    pub weights: Option<PathBuf>,
    /// With `weights`: layers left at their initialisation (`--reinit`).
    pub reinit: Vec<String>,
    /// Also write a metrics line every this many steps (0: per epoch only).
    pub log_every: usize,
    /// Use only the first N training samples (quick runs and tests).
    pub train_limit: Option<usize>,
    /// Use only the first N test samples.
    pub test_limit: Option<usize>,
    /// No progress bar or per-epoch lines.
    pub quiet: bool,
    /// Loader threads of the input pipeline (used when `prefetch > 0`).
    pub loader_threads: usize,
    /// Batches prefetched per worker; 0 collates inside the step (the synchronous baseline).
    pub prefetch: usize,
    /// How the replicas' 3x3 stride-1 convolutions are computed (`--conv-algo`).
    pub conv_algo: crate::backend::ConvAlgo,
    /// Training-time augmentation: the transform list, in order.
    pub augment: crate::pipeline::Augment,
    /// The model's input size (`--image-size`); `None`: the dataset's (an ImageFolder's first
    /// image's). The run sets it once the data is open.
    pub image_size: Option<crate::pipeline::ImageSize>,
    /// The evaluation transform (`--eval-transform`); `None`: `off` when the data is at the
    /// image size, else `resize-shorter,center-crop`. The run sets it, resolved.
    pub eval_transform: Option<crate::pipeline::Transforms>,
    /// Where the input normalisation comes from (`--normalize`); the run replaces it with the
    /// values used (`Given`).
    pub normalize: crate::pipeline::NormalizeChoice,
    /// Leave unreadable samples out of their batch (counted in the summary) instead of failing.
    pub skip_bad_samples: bool,
    /// Write a Chrome trace-event timeline here (see [`crate::trace`]).
    pub trace: Option<PathBuf>,
    /// Global steps (from 0) the timeline covers.
    pub trace_steps: std::ops::Range<usize>,
    /// How progress is shown on stdout.
    pub log_format: LogFormat,
}

/// Whether each setting a resumed run can take from its checkpoint's run was given: a resume
/// without `--epochs` trains for the epochs its run was started for, without `--conv-algo`
/// computes as it did, and without the optimisation settings (`--lr`, `--lr-schedule`,
/// `--warmup-steps`, `--momentum`, `--weight-decay`, `--nesterov`, `--augment`) continues
/// with the run's, so `--resume CK` alone finishes the run it interrupted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GivenSettings {
    /// `--epochs`.
    pub epochs: bool,
    /// `--conv-algo`.
    pub conv_algo: bool,
    /// `--lr`.
    pub lr: bool,
    /// `--lr-schedule`.
    pub lr_schedule: bool,
    /// `--warmup-steps`.
    pub warmup_steps: bool,
    /// `--momentum`.
    pub momentum: bool,
    /// `--weight-decay`.
    pub weight_decay: bool,
    /// `--nesterov`.
    pub nesterov: bool,
    /// `--augment`.
    pub augment: bool,
    /// `--test-limit`.
    pub test_limit: bool,
    /// `--commit-every`.
    pub commit_every: bool,
    /// `--checkpoint-every`.
    pub checkpoint_every: bool,
    /// `--keep-checkpoints`.
    pub keep_checkpoints: bool,
    /// `--keep-commits`.
    pub keep_commits: bool,
    /// `--log-every`.
    pub log_every: bool,
}

impl GivenSettings {
    /// Whether every setting of a run's routine was given (`--test-limit`,
    /// `--commit-every`, `--checkpoint-every`, `--keep-checkpoints`, `--keep-commits`,
    /// `--log-every`): then a resume takes none from its checkpoint.
    pub fn whole_routine(&self) -> bool {
        self.test_limit
            && self.commit_every
            && self.checkpoint_every
            && self.keep_checkpoints
            && self.keep_commits
            && self.log_every
    }

    /// Whether every setting of a run's recipe was given (then a resume takes none from its
    /// checkpoint).
    pub fn whole_recipe(&self) -> bool {
        self.lr
            && self.lr_schedule
            && self.warmup_steps
            && self.momentum
            && self.weight_decay
            && self.nesterov
            && self.augment
    }
}

/// What connects the workers of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Worker threads of one process, through the in-process fabric.
    InProcess,
    /// One process per MPI rank (`mpirun -np P dptrain train --transport mpi`), each with
    /// `--workers` threads; needs a binary built with `--features mpi`.
    Mpi,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::InProcess => "inproc",
            Self::Mpi => "mpi",
        })
    }
}

impl TransportKind {
    /// Parses `inproc` or `mpi`; `mpi` is refused with the way out when the binary was built
    /// without the `mpi` feature, so the mistake shows before any work starts.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "inproc" => Ok(Self::InProcess),
            "mpi" if cfg!(feature = "mpi") => Ok(Self::Mpi),
            "mpi" => Err(
                "--transport mpi: this dptrain was built without MPI support; \
                 rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev \
                 and libclang-dev)"
                    .into(),
            ),
            t => Err(format!("--transport must be inproc or mpi, not '{t}'")),
        }
    }
}

/// How a run reports progress on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Progress bar and readable per-epoch lines.
    Text,
    /// One JSON object per epoch (and one at the end), no bar: for scripts.
    Json,
}

/// Training options as given on the command line or in a TOML file; `None` means "not given".
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TrainOptions {
    /// Model: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md)
    /// [default: lenet5; resumed: the checkpoint's run's].
    #[arg(long)]
    pub model: Option<String>,
    /// Dataset: mnist (bundled), fashion-mnist, cifar10, idx, imagefolder:DIR, packed:FILE
    /// (`dptrain data pack`), synthetic or synthetic:CxHxW [default: mnist; resumed: the
    /// checkpoint's run's].
    #[arg(long)]
    pub dataset: Option<String>,
    /// Dataset directory (fashion-mnist, cifar10, idx; mnist defaults to the bundled copy)
    /// [resumed: the checkpoint's run's].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Epochs [default: 4; resumed: the checkpoint's run's].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Global batch size, split evenly across workers [default: 64; resumed: the checkpoint's
    /// run's].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Base learning rate [default: 0.05; resumed: the checkpoint's run's].
    #[arg(long)]
    pub lr: Option<f32>,
    /// Schedule: constant, cosine, or `step:E1,E2[:GAMMA]` [default: cosine; resumed: the
    /// checkpoint's run's].
    #[arg(long)]
    pub lr_schedule: Option<String>,
    /// Linear warm-up steps: the rate rises from 0 to --lr over them (one longer than the run
    /// never reaches --lr) [default: 100; resumed: the checkpoint's run's].
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// SGD momentum [default: 0.9; resumed: the checkpoint's run's].
    #[arg(long)]
    pub momentum: Option<f32>,
    /// Weight decay [default: 5e-4; resumed: the checkpoint's run's].
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Nesterov momentum: true or false [default: true; resumed: the checkpoint's run's].
    #[arg(long)]
    pub nesterov: Option<bool>,
    /// Seed [default: 1; resumed: the checkpoint's run's].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker threads, each with a model replica [default: 1; resumed: the checkpoint's run's].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Compute threads per worker [default: cores / workers, at least 1].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Overlap communication with backward: on or off [default: on; resumed: the checkpoint's
    /// run's].
    #[arg(long)]
    pub overlap: Option<String>,
    /// Communication mode: auto, tree, ring, hd, redundant; shm (the workers of one process
    /// read each other's buffers in place: one process, no emulated link); mpi-native
    /// (MPI_Allreduce, with --transport mpi) [default: auto; resumed: the checkpoint's run's].
    #[arg(long)]
    pub comm: Option<String>,
    /// With several MPI ranks of several --workers each: 2d (reduce-scatter within each
    /// process, each worker's shard across the processes with the --comm mode, all-gather
    /// within), leader (everything through local worker 0, which alone crosses the network),
    /// off (the mode flat over every worker), or auto (with --comm auto the cost model picks
    /// per bucket; otherwise 2d; mpi-native always uses leader); on means 2d [default: auto;
    /// resumed: the checkpoint's run's].
    #[arg(long)]
    pub hierarchical: Option<String>,
    /// Gradients on the wire: none (f32), fp16 (half the bytes; a value that rounds past 65504
    /// stops the run), bf16 (half the bytes, f32's range), auto (bf16 on each bucket where
    /// the cost model predicts the link time saved exceeds twice the conversions), or
    /// powersgd:R (each weight matrix that gains sent as a rank-R product with error
    /// feedback, in f32; not with --comm tree); sums stay in f32. Applies to the messages of
    /// every mode and hierarchy, not to shm (no messages) nor mpi-native [default: none; resumed:
    /// the checkpoint's run's].
    #[arg(long)]
    pub compress: Option<String>,
    /// Gradient bucket cap in KiB, 0 for one block per bucket (more than the gradient: one
    /// bucket) [default: with neither bucket flag given, the bytes the link moves in one
    /// latency, so that no bucket is latency-bound, and under --schedule overlap at least the cap that
    /// pipelines the gradient best on the run's collectives (`plan::PlanInputs::pipelined_cap`);
    /// with only --first-bucket-kb given, 0; resumed: the checkpoint's run's; auto: the
    /// default as if the flag were not given (beside --first-bucket-kb N: 0), also on a
    /// resume].
    #[arg(long)]
    pub bucket_kb: Option<KibOrAuto>,
    /// First bucket's cap in KiB [default: with neither bucket flag given, as --bucket-kb's;
    /// with only --bucket-kb given, 0; resumed: the checkpoint's run's; auto: the default
    /// as if the flag were not given (beside --bucket-kb N: 0), also on a resume].
    #[arg(long)]
    pub first_bucket_kb: Option<KibOrAuto>,
    /// When buckets are reduced: overlap (in the order backward fills them; the update once
    /// all are back, as DDP) or priority (the layers nearest the input first, each layer
    /// updated just before the next step's forward needs it, so communication also runs under
    /// the next forward; the same weights, bit for bit) [default: overlap; resumed: the
    /// checkpoint's run's].
    #[arg(long)]
    pub schedule: Option<String>,
    /// Each bucket is reduced in collectives (partitions) of at most this many KiB, at least 1;
    /// under --schedule priority an early layer's partition waits for at most one other
    /// [default: with --schedule priority, the larger of 160 KB (P3's 40,000 parameters) and 8
    /// times what the link moves in one latency; with overlap, whole buckets; resumed: the
    /// checkpoint's run's; auto: the default, also on a resume].
    #[arg(long)]
    pub partition_kb: Option<KibOrAuto>,
    /// Under --schedule priority, the KiB of partitions one decision of rank 0 commits every
    /// rank to, input-first among the buckets it holds (ByteScheduler's credit; at least one
    /// partition): fewer decision messages, and an urgent partition waits for up to this
    /// [default: one partition; resumed: the checkpoint's run's; auto: the default, also on a
    /// resume].
    #[arg(long)]
    pub credit_kb: Option<KibOrAuto>,
    /// Emulated link bandwidth per worker port, e.g. 10Gbit, 400MB/s, or none (no emulation,
    /// as `bench` takes it) [default: none; resumed: the checkpoint's run's].
    #[arg(allow_hyphen_values = true, long)]
    pub link_bandwidth: Option<String>,
    /// Emulated link latency, e.g. 5us [default: 0 with --link-bandwidth; resumed: the checkpoint's
    /// run's].
    #[arg(allow_hyphen_values = true, long)]
    pub link_latency: Option<String>,
    /// With --transport mpi and several workers per process: emulated bandwidth of each
    /// worker's port within its process (the devices of one host, e.g. 12GB/s for PCIe 3 x16),
    /// which every message between a process's workers crosses and `--comm auto` plans for;
    /// none: no emulation [default: none: the workers are threads that share memory; resumed: the
    /// checkpoint's run's].
    #[arg(allow_hyphen_values = true, long)]
    pub intra_bandwidth: Option<String>,
    /// Emulated latency of that port, e.g. 5us [default: 0 with --intra-bandwidth; resumed: the
    /// checkpoint's run's].
    #[arg(allow_hyphen_values = true, long)]
    pub intra_latency: Option<String>,
    /// Emulated device for testbeds where workers share a few cores: hold each worker's
    /// forward, each block's backward and the update to the times in this profile (written by
    /// `dptrain profile` at the per-worker batch) [default: no emulation].
    #[arg(long)]
    pub emulate_device: Option<PathBuf>,
    /// With --emulate-device: the factor on the profile's times (3 or more times the workers
    /// sharing each core, so that the real compute fits in the device's time) [default: 1].
    #[arg(long)]
    pub emulate_device_scale: Option<f64>,
    /// Seconds a collective may wait for a peer before the run stops [default: 120].
    #[arg(long)]
    pub comm_timeout: Option<f64>,
    /// What connects workers: inproc (threads of this process) or mpi (one process per MPI
    /// rank, started by mpirun; needs the `mpi` build feature) [default: inproc].
    #[arg(long)]
    pub transport: Option<String>,
    /// Run directory for metrics, summary and checkpoints (default: `runs/<model>-<dataset>`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Checkpoint every N epochs, 0 (or more than --epochs) for only the last [default: 1; resumed:
    /// the checkpoint's run's].
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Checkpoints to keep, at least 1 (the newest; more than written keeps all) [default: 2;
    /// resumed: the checkpoint's run's].
    #[arg(long)]
    pub keep_checkpoints: Option<usize>,
    /// Commit a restart point every N steps (`commit-stepN.safetensors`, written in the
    /// background, the newest --keep-commits kept), which `--resume` and `dptrain launch` continue from
    /// exactly; 0 for none [default: 0; resumed: the checkpoint's run's].
    #[arg(long)]
    pub commit_every: Option<usize>,
    /// Commits to keep, at least 1 (the newest) [default: 2; resumed: the checkpoint's run's].
    #[arg(long)]
    pub keep_commits: Option<usize>,
    /// Send a heartbeat (UDP) to ADDR:PORT every 250 ms: how `dptrain launch` watches its
    /// ranks (it passes this itself).
    #[arg(long)]
    pub heartbeat: Option<String>,
    /// The pid of the `dptrain launch` that started this job and holds the run directory's
    /// lock across its jobs (it passes this itself; never from a config file).
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub launched_by: Option<u32>,
    /// Resume from this checkpoint file.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// With --resume: accept a checkpoint whose run had another --dataset, --batch, --seed or
    /// --train-limit (refused otherwise, since the run would continue under other settings),
    /// or whose record of the options a resume follows does not read back (then the options
    /// given and the defaults).
    #[arg(long)]
    #[serde(default)]
    pub resume_changed: bool,
    /// Start a new run from this checkpoint's weights (fine-tuning: epoch 0, no optimizer
    /// state, this run's dataset and settings); a head whose class count changed starts from
    /// scratch. Not with --resume, which continues a run exactly.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// With --weights: layers (comma-separated, names as in the model file) that start from
    /// scratch instead, e.g. --reinit fc3.
    #[arg(long)]
    pub reinit: Option<String>,
    /// Reuse a run directory that holds another run's files (metrics, summary, report,
    /// checkpoints): they are deleted first. Without it such a directory is refused.
    #[arg(long)]
    #[serde(default)]
    pub overwrite: bool,
    /// Write no checkpoints (for benchmark runs).
    #[arg(long)]
    #[serde(default)]
    pub no_checkpoints: bool,
    /// Fault injection for reliability tests: `forward|backward|comm|data@STEP[:WORKER]` or
    /// slow-checkpoint (a flag for the tests, never from a config file).
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub inject_fault: Option<String>,
    /// What a NaN/infinite loss or gradient does: stop (with the step) or skip the update and
    /// count it [default: stop; resumed: the checkpoint's run's].
    #[arg(long)]
    pub on_nonfinite: Option<String>,
    /// Also log metrics every N steps (more than an epoch's steps: per epoch only) [default: 0,
    /// per epoch only; resumed: the checkpoint's run's].
    #[arg(long)]
    pub log_every: Option<usize>,
    /// Train on the first N samples only, at least 1 (more than the dataset has: all of it)
    /// [resumed: the checkpoint's run's].
    #[arg(long)]
    pub train_limit: Option<usize>,
    /// Evaluate on the first N test samples only, at least 1 (more than it has: all of it)
    /// [resumed: the checkpoint's run's].
    #[arg(long)]
    pub test_limit: Option<usize>,
    /// No progress bar, notes or per-epoch lines: only the closing `done:` line, the run
    /// directory and warnings.
    #[arg(long)]
    #[serde(default)]
    pub quiet: bool,
    /// Input-pipeline loader threads [default: cores/4, 1 to 8].
    #[arg(long)]
    pub loader_threads: Option<usize>,
    /// Batches prefetched per worker, 0 to load inside the step [default: 2].
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// How 3x3 stride-1 convolutions are computed: direct (im2col + GEMM), winograd or
    /// winograd:4 (F(4x4,3x3)), winograd:2 (F(2x2,3x3)) or auto (Winograd where it measured faster: at
    /// least 16 channels in and out) [default: auto; resumed: the checkpoint's run's].
    #[arg(long)]
    pub conv_algo: Option<String>,
    /// Training transforms in order: off, or a list of random-resized-crop (optionally
    /// :SMIN,SMAX and then :RMIN,RMAX), flip, crop:PAD, resize-shorter (optionally :S),
    /// center-crop, resize, e.g. crop:4,flip or random-resized-crop,flip [default: off; resumed:
    /// the checkpoint's run's].
    #[arg(long)]
    pub augment: Option<String>,
    /// The model's input size, H or HxW (each side 1..=4096) [default: the dataset's; an
    /// ImageFolder's first image's; resumed, the checkpoint's].
    #[arg(long)]
    #[serde(default, deserialize_with = "text_or_whole_number")]
    pub image_size: Option<String>,
    /// Evaluation transforms (no random ones): e.g. resize-shorter,center-crop (torchvision's
    /// Resize(size*256/224) + CenterCrop) or resize [default: off when the data is at the image
    /// size, else resize-shorter,center-crop; resumed, the checkpoint's].
    #[arg(long)]
    pub eval_transform: Option<String>,
    /// Input normalisation: dataset (published constants, else estimated), estimate (from a
    /// sample of the training split after the evaluation transform) or MEAN,.../STD,... per
    /// channel, e.g. 0.485,0.456,0.406/0.229,0.224,0.225 [default: dataset; resumed, dataset is
    /// the checkpoint's].
    #[arg(long)]
    pub normalize: Option<String>,
    /// Leave unreadable samples out of their batch and count them, instead of stopping;
    /// `--skip-bad-samples=false` stops at the first [default: false; resumed: the
    /// checkpoint's run's].
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    #[serde(default)]
    pub skip_bad_samples: Option<bool>,
    /// Write a timeline of the traced steps (Chrome trace-event JSON: open in Perfetto or
    /// chrome://tracing) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Global steps to trace, A..B (from 0, B excluded) [default: 5..8].
    #[arg(long)]
    pub trace_steps: Option<String>,
    /// Progress on stdout: text (bar and epoch lines) or json (one line per epoch, no bar)
    /// [default: text].
    #[arg(long)]
    pub log_format: Option<String>,
}

/// A config file's value of an option the command line reads as text that is often a number
/// (`image-size = 28`, as `image-size = "28"` or `--image-size 28` read): a whole number is
/// taken as its digits, and the text is then read as the flag's is.
fn text_or_whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number or a string, e.g. 224 or \"32x48\"")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Visitor).map(Some)
}

/// `--comm-timeout` when not given, in seconds: how long a collective waits for a peer (the
/// benchmarks' emulated runs use it too).
pub const DEFAULT_COMM_TIMEOUT_S: f64 = 120.0;

/// Longest `--comm-timeout`, in seconds (a year): anything longer means "never" and would
/// overflow the clock arithmetic of the deadlines.
pub const MAX_COMM_TIMEOUT_S: f64 = 365.0 * 24.0 * 3600.0;

/// Shortest `--comm-timeout`, in seconds (1 ms): a few scheduler quanta, below which a
/// collective times out waiting for a peer thread that was merely descheduled (1e-300 was
/// taken and became a zero deadline: every wait failed at once).
pub const MIN_COMM_TIMEOUT_S: f64 = 1e-3;

/// Which flags set an emulated link: the network's or a host's port within its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFlags {
    /// `--link-bandwidth` and `--link-latency`.
    Link,
    /// `--intra-bandwidth` and `--intra-latency`.
    Intra,
}

impl LinkFlags {
    /// The flags' common prefix (`--{prefix}-latency`).
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Link => "link",
            Self::Intra => "intra",
        }
    }
}

/// Refuses an emulated link on which no message could arrive within the timeout: the latency
/// alone, or one f32 (the smallest message a collective sends) at the bandwidth, takes longer.
/// Messages the link cannot deliver in time for other reasons (bigger ones) fail at once in the
/// transport ([`crate::comm::CommError::LinkTooSlow`]), so no run sleeps past its timeout.
/// `flags` says which flags set the link, for the messages.
pub fn check_link_against_timeout(
    link: &LinkModel,
    timeout_s: f64,
    flags: LinkFlags,
    timeout_flag: Option<&str>,
) -> Result<(), String> {
    let flags = flags.prefix();
    // The timeout as this command names it: its option, or a fixed one (a benchmark's).
    let (timeout, or_raise) = match timeout_flag {
        Some(f) => (format!("{f} {timeout_s} s"), format!(" or raise {f}")),
        None => (format!("the {timeout_s} s timeout"), String::new()),
    };
    let latency = link.latency.as_secs_f64();
    if latency >= timeout_s {
        return Err(format!(
            "--{flags}-latency {latency} s is not below {timeout}: every message waits the \
             latency, so every collective would time out; lower the latency{or_raise}"
        ));
    }
    let one_float = link.arrival_s(4);
    if one_float >= timeout_s {
        return Err(format!(
            "--{flags}-bandwidth {} bytes/s moves one float (4 bytes) in {:.0} s, not within \
             {timeout}, and a step moves the whole gradient: raise the bandwidth (e.g. \
             1Gbit){or_raise}",
            link.bandwidth_bytes_per_s, one_float
        ));
    }
    Ok(())
}

/// Parses `--reinit LAYER,...` (names as in the model file; empty and repeated entries
/// refused).
pub fn parse_reinit(list: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        return Err(format!(
            "--reinit '{list}': give layer names separated by commas, e.g. --reinit fc3"
        ));
    }
    let repeated = (1..names.len()).find(|&i| names[..i].contains(&names[i]));
    if let Some(n) = repeated.map(|i| &names[i]) {
        return Err(format!(
            "--reinit '{list}': layer '{n}' is named twice; name each layer once"
        ));
    }
    Ok(names)
}

/// Warnings for a valid `--lr-schedule` that does not do what it reads as (given the epochs
/// the run trains for, a resume's once it has followed its checkpoint): step milestones
/// past the last epoch are never reached.
pub fn schedule_warnings(schedule: &LrSchedule, epochs: usize) -> Vec<String> {
    match schedule {
        LrSchedule::Step { milestones, .. } => milestones
            .iter()
            .filter(|&&m| m >= epochs)
            .map(|m| {
                format!(
                    "--lr-schedule: milestone {m} is not before the last epoch ({}, counted \
                     from 0): it never lowers the rate in this run",
                    crate::terminal::counted(epochs, "epoch")
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

macro_rules! overlay {
    ($dst:ident, $src:ident, $($f:ident),*) => { $( if $src.$f.is_some() { $dst.$f = $src.$f.clone(); } )* };
}

impl TrainConfig {
    /// Workers of the whole run: `--workers` per process times the processes.
    pub fn world(&self) -> usize {
        self.workers * self.processes
    }

    /// What this run's collectives mostly wait on, for how its compute threads share the cores
    /// ([`crate::parallel::yield_cpu_to_communication`]): the network between processes, or
    /// the emulated link of a run in one process, or else memory.
    pub fn collectives_wait(&self) -> crate::parallel::CollectivesWait {
        use crate::parallel::CollectivesWait;
        if self.processes > 1 || self.link.is_some() {
            CollectivesWait::OnALink
        } else {
            CollectivesWait::OnMemory
        }
    }

    /// What this run's bucket plan depends on ([`crate::plan`]).
    pub fn plan_inputs(&self) -> crate::plan::PlanInputs {
        crate::plan::PlanInputs {
            comm: self.comm,
            hierarchy: self.hierarchy,
            processes: self.processes,
            workers_per_process: self.workers,
            link: self.link.or(self.measured_link),
            intra_link: self.intra_link,
            compress: self.compress,
            buckets: self.buckets,
            schedule: self.schedule,
            partition_kb: self.partition_kb,
            cores: crate::limits::cores(),
        }
    }

    /// The configuration as JSON, for the run's summary and checkpoints.
    pub fn to_json(&self) -> serde_json::Value {
        let mut json = serde_json::json!({
            "model": self.model, "dataset": self.dataset, "epochs": self.epochs, "batch": self.batch,
            "lr": decimal(self.lr), "lr_schedule": self.lr_schedule.to_string(), "warmup_steps": self.warmup_steps,
            "momentum": decimal(self.sgd.momentum), "weight_decay": decimal(self.sgd.weight_decay), "nesterov": self.sgd.nesterov,
            "seed": self.seed, "workers": self.workers, "threads": self.threads, "overlap": self.overlap,
            "comm": self.comm.to_string(), "hierarchical": self.hierarchy.to_string(), "compress": self.compress.to_string(), "transport": self.transport.to_string(),
            "processes": self.processes, "bucket_kb": self.buckets.kb, "first_bucket_kb": self.buckets.first_kb,
            "schedule": self.schedule.to_string(), "partition_kb": self.partition_kb, "credit_kb": self.credit_kb,
            "link_bandwidth_bytes_per_s": self.link.map(|l| l.bandwidth_bytes_per_s),
            "measured_link_bandwidth_bytes_per_s": self.measured_link.map(|l| l.bandwidth_bytes_per_s),
            "link_latency_us": self.link.map(|l| l.latency.as_secs_f64() * 1e6),
            "emulate_device": self.device.as_ref().map(|d| d.path.display().to_string()),
            "emulate_device_scale": self.device.as_ref().map(|d| d.scale),
            "train_limit": self.train_limit, "test_limit": self.test_limit,
            "weights": self.weights.as_ref().map(|w| w.display().to_string()), "reinit": self.reinit,
            "loader_threads": self.loader_threads, "prefetch": self.prefetch,
            "conv_algo": self.conv_algo.to_string(),
            "augment": self.augment.to_string(), "skip_bad_samples": self.skip_bad_samples,
            "image_size": self.image_size.map(|s| s.to_string()),
            "eval_transform": self.eval_transform.as_ref().map(|t| t.to_string()),
            "normalize": self.normalize.to_string(),
        });
        // Apart, in the link's flat form: more keys in one json! pass its recursion limit.
        let port = self.intra_link;
        json["intra_bandwidth_bytes_per_s"] = port.map(|l| l.bandwidth_bytes_per_s).into();
        json["intra_latency_us"] = port.map(|l| l.latency.as_secs_f64() * 1e6).into();
        json["commit_every"] = self.commit_every.into();
        json["on_nonfinite"] = if self.skip_nonfinite { "skip" } else { "stop" }.into();
        json
    }
}

impl TrainOptions {
    /// Reads options from a TOML file (same names as the flags, e.g. `bucket-kb = 128`).
    pub fn from_toml_file(path: &Path) -> Result<Self, String> {
        let text = crate::input::read_text(path, crate::input::FileKind::Config)
            .map_err(|e| e.to_string())?;
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
    }

    /// Parses a config file's TOML text (what [`Self::from_toml_file`] reads); `origin`
    /// names the file in messages. The config fuzz target's entry point.
    pub fn from_toml_text(text: &str, origin: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| format!("config file {origin}: {e}"))
    }

    /// The run the config file at `path` (its options `self`) and the command line's `flags`
    /// (which win) describe. A refused value is blamed where it comes from, judged by which
    /// side alone meets the same refusal: the flags' is the command line's as it is; the
    /// file's (or one met only with both, the flags alone being fine) is named as the file's
    /// (the messages name options by their flags, and the file's keys are those names without
    /// `--`); one that neither side alone meets names both.
    pub fn resolve_under(self, path: &Path, flags: &TrainOptions) -> Result<TrainConfig, String> {
        let file = self.clone();
        self.overlaid_with(flags).resolve().map_err(|e| {
            let flags_alone = flags.resolve().err();
            if flags_alone.as_deref() == Some(e.as_str()) {
                e
            } else if flags_alone.is_none() || file.resolve().err().as_deref() == Some(e.as_str()) {
                format!(
                    "config file {}: {e} (its keys are the flags' names without --)",
                    path.display()
                )
            } else {
                format!(
                    "{e} (from the command line and config file {} together)",
                    path.display()
                )
            }
        })
    }

    /// `self` with every option that `over` gives replaced by `over`'s value.
    pub fn overlaid_with(mut self, over: &TrainOptions) -> Self {
        overlay!(
            self,
            over,
            model,
            dataset,
            data_dir,
            inject_fault,
            on_nonfinite,
            epochs,
            batch,
            lr,
            lr_schedule,
            warmup_steps,
            momentum,
            weight_decay,
            nesterov,
            seed,
            workers,
            threads,
            overlap,
            comm,
            hierarchical,
            compress,
            bucket_kb,
            first_bucket_kb,
            schedule,
            partition_kb,
            credit_kb,
            link_bandwidth,
            link_latency,
            intra_bandwidth,
            intra_latency,
            emulate_device,
            emulate_device_scale,
            comm_timeout,
            transport,
            run_dir,
            checkpoint_every,
            keep_checkpoints,
            commit_every,
            keep_commits,
            heartbeat,
            launched_by,
            resume,
            weights,
            reinit,
            log_every,
            train_limit,
            test_limit,
            loader_threads,
            prefetch,
            conv_algo,
            augment,
            image_size,
            eval_transform,
            normalize,
            skip_bad_samples,
            trace,
            trace_steps,
            log_format
        );
        self.quiet |= over.quiet;
        self.no_checkpoints |= over.no_checkpoints;
        self.overwrite |= over.overwrite;
        self.resume_changed |= over.resume_changed;
        self
    }

    /// Applies defaults and validates everything, so a bad option fails before training starts,
    /// with a message that says what to do.
    pub fn resolve(&self) -> Result<TrainConfig, String> {
        self.resolve_for(None)
    }

    /// [`TrainOptions::resolve`] for a model laid out in code (`--model` is ignored).
    pub fn resolve_with_model(&self, spec: crate::model::ModelSpec) -> Result<TrainConfig, String> {
        self.resolve_for(Some(std::sync::Arc::new(spec)))
    }

    fn resolve_for(
        &self,
        model_spec: Option<std::sync::Arc<crate::model::ModelSpec>>,
    ) -> Result<TrainConfig, String> {
        let (model, model_name) = self.resolve_model(&model_spec)?;
        let dataset = self
            .dataset
            .clone()
            .unwrap_or_else(|| DEFAULT_DATASET.into());
        let workers = self.resolve_workers()?;
        let comm = self.resolve_comm(workers.workers)?;
        let (schedule, partition_kb, credit_kb) = self.resolve_schedule(&comm)?;
        let link = self.resolve_link()?;
        let device = self.resolve_device()?;
        let comm_timeout = self.resolve_comm_timeout(link.as_ref())?;
        let intra_link = self.resolve_intra_link(&comm, workers.workers, comm_timeout)?;
        let solver = self.resolve_solver()?;
        let epochs = self.epochs.unwrap_or(4);
        if epochs == 0 {
            return Err("--epochs must be at least 1".into());
        }
        self.check_resume()?;
        self.check_limits()?;
        let input = self.resolve_input()?;
        let outputs = self.resolve_outputs(&model_name, &dataset)?;
        let mut warnings = workers.warnings;
        warnings.extend(self.untraced_window());
        Ok(TrainConfig {
            model,
            model_spec,
            dataset,
            data_dir: self.data_dir.clone(),
            epochs,
            given: self.given(),
            batch: workers.batch,
            lr: solver.lr,
            lr_schedule: solver.lr_schedule,
            warmup_steps: self.warmup_steps.unwrap_or(100),
            sgd: solver.sgd,
            seed: self.seed.unwrap_or(DEFAULT_SEED),
            workers: workers.workers,
            threads: workers.threads,
            overlap: comm.overlap,
            comm: comm.comm,
            hierarchy: comm.hierarchy,
            compress: comm.compress,
            buckets: crate::plan::BucketFlags {
                first_kb: KibOrAuto::resolved(self.first_bucket_kb),
                kb: KibOrAuto::resolved(self.bucket_kb),
            },
            schedule,
            partition_kb,
            credit_kb,
            link,
            intra_link,
            measured_link: None,
            device,
            comm_timeout,
            transport: comm.transport,
            processes: 1,
            process_rank: 0,
            run_dir: outputs.run_dir,
            run_dir_given: self.run_dir.is_some(),
            overwrite: self.overwrite,
            resume_changed: self.resume_changed,
            warnings,
            options_from_checkpoint: Vec::new(),
            data_from_checkpoint: None,
            exchange: Exchange::of(self, workers.workers),
            takes_unread_exchange: false,
            exchange_kept: Vec::new(),
            intra_link_followed: false,
            skip_bad_samples_followed: false,
            checkpoint_every: self.checkpoint_every.unwrap_or(1),
            keep_checkpoints: self.keep_checkpoints.unwrap_or(2),
            commit_every: self.commit_every.unwrap_or(0),
            keep_commits: self.keep_commits.unwrap_or(DEFAULT_KEEP_COMMITS),
            launched_by: self.launched_by,
            heartbeat: self.resolve_heartbeat()?,
            no_checkpoints: self.no_checkpoints,
            fault: self
                .inject_fault
                .as_deref()
                .map(crate::testbed::fault::Fault::parse)
                .transpose()
                .map_err(|e| e.to_string())?,
            skip_nonfinite: match self.on_nonfinite.as_deref().unwrap_or("stop") {
                "stop" => false,
                "skip" => true,
                o => return Err(format!("--on-nonfinite must be stop or skip, not '{o}'")),
            },
            resume: self.resume.clone(),
            weights: self.weights.clone(),
            reinit: match &self.reinit {
                Some(list) => parse_reinit(list)?,
                None => Vec::new(),
            },
            log_every: self.log_every.unwrap_or(0),
            train_limit: self.train_limit,
            test_limit: self.test_limit,
            quiet: self.quiet,
            loader_threads: input.loader_threads,
            prefetch: input.prefetch,
            conv_algo: match &self.conv_algo {
                Some(a) => a.parse().map_err(|e| format!("--conv-algo: {e}"))?,
                None => crate::backend::ConvAlgo::default(),
            },
            augment: input.augment,
            image_size: input.image_size,
            eval_transform: input.eval_transform,
            normalize: input.normalize,
            skip_bad_samples: self.skip_bad_samples.unwrap_or(false),
            trace: self.trace.clone(),
            trace_steps: outputs.trace_steps,
            log_format: outputs.log_format,
        })
    }

    /// Which of the settings a resume follows from its checkpoint were given.
    fn given(&self) -> GivenSettings {
        GivenSettings {
            epochs: self.epochs.is_some(),
            conv_algo: self.conv_algo.is_some(),
            lr: self.lr.is_some(),
            lr_schedule: self.lr_schedule.is_some(),
            warmup_steps: self.warmup_steps.is_some(),
            momentum: self.momentum.is_some(),
            weight_decay: self.weight_decay.is_some(),
            nesterov: self.nesterov.is_some(),
            augment: self.augment.is_some(),
            test_limit: self.test_limit.is_some(),
            commit_every: self.commit_every.is_some(),
            checkpoint_every: self.checkpoint_every.is_some(),
            keep_checkpoints: self.keep_checkpoints.is_some(),
            keep_commits: self.keep_commits.is_some(),
            log_every: self.log_every.is_some(),
        }
    }

    /// Where `--heartbeat` sends: `dptrain launch`'s supervisor.
    fn resolve_heartbeat(&self) -> Result<Option<std::net::SocketAddr>, String> {
        let Some(a) = self.heartbeat.as_deref() else {
            return Ok(None);
        };
        a.parse().map(Some).map_err(|_| {
            format!("--heartbeat {a}: give the supervisor's ADDRESS:PORT, e.g. 10.0.0.1:7000")
        })
    }

    /// The model to load and its name (the default run directory's): a model file is parsed
    /// here so that a bad one fails before anything starts; its shapes are checked once the
    /// dataset is known.
    fn resolve_model(
        &self,
        model_spec: &Option<std::sync::Arc<crate::model::ModelSpec>>,
    ) -> Result<(String, String), String> {
        if let Some(spec) = model_spec {
            return Ok((spec.name.clone(), spec.name.clone()));
        }
        let model = self.model.clone().unwrap_or_else(|| DEFAULT_MODEL.into());
        let name = crate::model::load(&model).map_err(|e| e.to_string())?.name;
        Ok((model, name))
    }

    /// Workers, the global batch split evenly over them, and compute threads per worker.
    fn resolve_workers(&self) -> Result<ResolvedWorkers, String> {
        let workers = self.workers.unwrap_or(DEFAULT_WORKERS);
        if workers == 0 {
            return Err("--workers must be at least 1".into());
        }
        crate::comm::transport::check_in_process_workers(workers)?;
        let batch = self.batch.unwrap_or(DEFAULT_BATCH);
        crate::plan::per_worker_batch(batch, workers, 1).map_err(|e| e.to_string())?;
        if self.threads == Some(0) {
            return Err("--threads must be at least 1".into());
        }
        let (threads, warnings) = crate::limits::threads_per_worker(self.threads, workers);
        Ok(ResolvedWorkers {
            workers,
            batch,
            threads,
            warnings,
        })
    }

    /// How gradients travel: overlap, mode, transport and the hierarchy, and the combinations
    /// that cannot work.
    fn resolve_comm(&self, workers: usize) -> Result<ResolvedComm, String> {
        let overlap = on_off("--overlap", self.overlap.as_deref().unwrap_or("on"))?;
        let comm = CommChoice::parse(self.comm.as_deref().unwrap_or("auto"))
            .map_err(|e| format!("--comm: {e}"))?;
        let transport = TransportKind::parse(self.transport.as_deref().unwrap_or("inproc"))?;
        if comm == CommChoice::Native && transport != TransportKind::Mpi {
            return Err("--comm mpi-native needs --transport mpi".into());
        }
        if comm == CommChoice::SharedMemory && transport != TransportKind::InProcess {
            return Err(
                "--comm shm reads the other workers' buffers in place, so every worker must be \
                 a thread of one process: use --transport inproc (over MPI, the workers of \
                 each process already share memory within a hierarchy, unless \
                 --intra-bandwidth emulates a port: --comm auto or a mode with \
                 --hierarchical 2d or leader)"
                    .into(),
            );
        }
        if comm == CommChoice::SharedMemory && self.emulated_bandwidth().is_some() {
            return Err(
                "--comm shm and --link-bandwidth: an emulated link says the workers are devices \
                 apart, which share no memory; leave out --link-* or choose a mode that sends \
                 messages (tree, ring, hd, redundant, auto)"
                    .into(),
            );
        }
        let hierarchy =
            crate::plan::HierarchyChoice::parse(self.hierarchical.as_deref().unwrap_or("auto"))?;
        let leader_or_auto = matches!(
            hierarchy,
            crate::plan::HierarchyChoice::Fixed(crate::comm::Hierarchy::Leader)
                | crate::plan::HierarchyChoice::Auto
        );
        if comm == CommChoice::Native && !leader_or_auto && workers > 1 {
            return Err(format!(
                "--comm mpi-native with --workers > 1 needs --hierarchical leader or auto, not \
                 {hierarchy} (MPI_Allreduce runs once per process, between the process leaders)"
            ));
        }
        let compress =
            crate::plan::CompressChoice::parse(self.compress.as_deref().unwrap_or("none"))?;
        if comm == CommChoice::Fixed(crate::comm::CommMode::Tree) {
            if let Some(why) = compress.tree_refusal() {
                return Err(why);
            }
        }
        // `auto` leaves buckets that send no messages in f32; a format given must apply.
        let given = match compress {
            crate::plan::CompressChoice::Fixed(w) if w != crate::comm::WireFormat::F32 => Some(w),
            _ => None,
        };
        if let Some(compress) = given {
            match comm {
                CommChoice::Native => {
                    return Err(format!(
                        "--compress {compress} with --comm mpi-native: MPI_Allreduce sums f32 \
                         values itself; choose a mode of ours (auto, ring, hd, tree, redundant) \
                         or --compress none"
                    ))
                }
                CommChoice::SharedMemory => {
                    return Err(format!(
                        "--compress {compress} with --comm shm: the shared-memory collective \
                         sends no messages, so there is nothing to compress; leave out \
                         --compress, or emulate a link (--link-bandwidth) with a mode that \
                         sends messages"
                    ))
                }
                _ => {}
            }
        }
        Ok(ResolvedComm {
            overlap,
            comm,
            transport,
            hierarchy,
            compress,
        })
    }

    /// `--schedule`, `--partition-kb` and `--credit-kb`, and what priority scheduling cannot
    /// work with.
    fn resolve_schedule(
        &self,
        comm: &ResolvedComm,
    ) -> Result<(crate::parallel::Schedule, Option<usize>, Option<usize>), String> {
        use crate::parallel::Schedule;
        let schedule = Schedule::parse(self.schedule.as_deref().unwrap_or("overlap"))?;
        let partition_kb = KibOrAuto::resolved(self.partition_kb);
        let credit_kb = KibOrAuto::resolved(self.credit_kb);
        let refusal = crate::parallel::schedule::order_refusal(schedule, partition_kb, credit_kb);
        if let Some(why) = refusal {
            return Err(why);
        }
        if schedule == Schedule::Priority {
            check_priority(comm, self.on_nonfinite.as_deref() == Some("skip"))?;
        }
        Ok((schedule, partition_kb, credit_kb))
    }

    /// `--link-bandwidth` unless it is absent or `none` (no emulated link).
    fn emulated_bandwidth(&self) -> Option<&str> {
        emulated(&self.link_bandwidth)
    }

    /// The emulated link, if `--link-bandwidth` gives one.
    fn resolve_link(&self) -> Result<Option<LinkModel>, String> {
        // The value judged first: a bad one is named as such, with or without a bandwidth.
        let latency = self
            .link_latency
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| format!("--link-latency: {e}"))?;
        match (self.emulated_bandwidth(), latency) {
            (None, Some(_)) => {
                Err("--link-latency needs --link-bandwidth, and one other than none".into())
            }
            (None, None) => Ok(None),
            (Some(b), latency) => Ok(Some(LinkModel {
                bandwidth_bytes_per_s: parse_bandwidth(b)
                    .map_err(|e| format!("--link-bandwidth: {e}"))?,
                latency: latency.unwrap_or(Duration::ZERO),
            })),
        }
    }

    /// The emulated port within a process, if `--intra-bandwidth` gives one: only where a
    /// process has several workers and other processes to reach through MPI (in one process,
    /// `--link-bandwidth` already gives every worker its own emulated port).
    fn resolve_intra_link(
        &self,
        comm: &ResolvedComm,
        workers: usize,
        comm_timeout: Duration,
    ) -> Result<Option<LinkModel>, String> {
        let Some(port) = self.intra_port()? else {
            return Ok(None);
        };
        if comm.transport != TransportKind::Mpi || workers < 2 {
            return Err(format!(
                "--intra-bandwidth emulates the port between the workers of one process in a \
                 run of several processes (--transport mpi with --workers 2 or more), not \
                 --transport {} with --workers {workers}; with --transport inproc, \
                 --link-bandwidth gives every worker its own emulated port",
                comm.transport
            ));
        }
        // The wire formats would round a process's partial sums on the port, where the cost
        // model prices the within-host phases in f32 (`wire_route_time`).
        if comm.compress != crate::plan::CompressChoice::NONE
            && comm.compress.powersgd_rank().is_none()
        {
            return Err(format!(
                "--intra-bandwidth with --compress {}: 16-bit values on the port within a \
                 process are not supported (the within-host phases stay f32); use --compress \
                 none or powersgd:R, or leave out --intra-bandwidth",
                comm.compress
            ));
        }
        check_link_against_timeout(
            &port,
            comm_timeout.as_secs_f64(),
            LinkFlags::Intra,
            Some("--comm-timeout"),
        )?;
        Ok(Some(port))
    }

    /// The port `--intra-bandwidth` and `--intra-latency` emulate, read by themselves (what
    /// they need of the rest of the run: [`Self::resolve_intra_link`]).
    fn intra_port(&self) -> Result<Option<LinkModel>, String> {
        let bandwidth = match (emulated(&self.intra_bandwidth), &self.intra_latency) {
            (None, None) => return Ok(None),
            (None, Some(_)) => {
                return Err(
                    "--intra-latency needs --intra-bandwidth, and one other than none".into(),
                )
            }
            (Some(b), _) => b,
        };
        Ok(Some(LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(bandwidth)
                .map_err(|e| format!("--intra-bandwidth: {e}"))?,
            latency: parse_duration(self.intra_latency.as_deref().unwrap_or("0"))
                .map_err(|e| format!("--intra-latency: {e}"))?,
        }))
    }

    /// Checks the values of the options that mean something only over MPI (`--hierarchical`,
    /// `--intra-*`) by themselves, as resolving them over MPI reads them: what a resume in
    /// one process keeps of its checkpoint's run's record without following it is judged so
    /// (`cli::train`), whether or not this binary has MPI.
    pub fn check_mpi_only_values(&self) -> Result<(), String> {
        crate::plan::HierarchyChoice::parse(self.hierarchical.as_deref().unwrap_or("auto"))?;
        self.intra_port().map(|_| ())
    }

    /// The emulated device, if `--emulate-device` gives a profile.
    fn resolve_device(&self) -> Result<Option<crate::testbed::device::EmulatedDevice>, String> {
        match (&self.emulate_device, self.emulate_device_scale) {
            (None, Some(_)) => Err("--emulate-device-scale needs --emulate-device too".into()),
            (None, None) => Ok(None),
            (Some(p), k) => crate::testbed::device::EmulatedDevice::load(p, k.unwrap_or(1.0))
                .map(Some)
                .map_err(|e| e.to_string()),
        }
    }

    /// How long a collective may wait, checked against the emulated link (a bucket that
    /// could not cross it in time would fail every step).
    fn resolve_comm_timeout(&self, link: Option<&LinkModel>) -> Result<Duration, String> {
        let comm_timeout = self.comm_timeout.unwrap_or(DEFAULT_COMM_TIMEOUT_S);
        if !(MIN_COMM_TIMEOUT_S..=MAX_COMM_TIMEOUT_S).contains(&comm_timeout) {
            return Err(format!(
                "--comm-timeout must be a number of seconds from {MIN_COMM_TIMEOUT_S} (1 ms) \
                 to {MAX_COMM_TIMEOUT_S} (a year), not {}",
                crate::terminal::number(comm_timeout)
            ));
        }
        if let Some(l) = link {
            check_link_against_timeout(l, comm_timeout, LinkFlags::Link, Some("--comm-timeout"))?;
        }
        Ok(Duration::from_secs_f64(comm_timeout))
    }

    /// Learning rate, its schedule and SGD's settings.
    fn resolve_solver(&self) -> Result<ResolvedSolver, String> {
        let lr = self.lr.unwrap_or(0.05);
        crate::optim::check_lr(lr).map_err(|e| e.to_string())?;
        let sgd = SgdConfig {
            momentum: self.momentum.unwrap_or(0.9),
            weight_decay: self.weight_decay.unwrap_or(5e-4),
            nesterov: self.nesterov.unwrap_or(true),
        };
        match sgd.check() {
            // A resume that leaves --momentum or --nesterov out takes the checkpoint's run's,
            // which may make the pair valid: judged once followed (`train::recipe`).
            Err(e)
                if e.setting == crate::optim::SolverSetting::Nesterov
                    && self.resume_follows_nesterov_pair() => {}
            Err(e) => return Err(e.to_string()),
            Ok(()) => {}
        }
        Ok(ResolvedSolver {
            lr,
            lr_schedule: LrSchedule::parse(self.lr_schedule.as_deref().unwrap_or("cosine"))?,
            sgd,
        })
    }

    /// Whether a resume will take `--momentum` or `--nesterov` from its checkpoint's run.
    fn resume_follows_nesterov_pair(&self) -> bool {
        self.resume.is_some() && (self.momentum.is_none() || self.nesterov.is_none())
    }

    /// `--resume` names a file; `--resume-changed` only goes with it; `--weights` names a file
    /// and not beside `--resume`; `--reinit` only goes with `--weights`.
    fn check_resume(&self) -> Result<(), String> {
        match (&self.weights, &self.resume, &self.reinit) {
            (Some(_), Some(_), _) => {
                return Err(
                    "--weights starts a new run from a checkpoint's weights and \
                            --resume continues a run exactly: give one of them"
                        .into(),
                )
            }
            (Some(w), None, _) => {
                // Refused by type here, before a run directory is made.
                crate::input::open_regular(w, crate::input::FileKind::Checkpoint)
                    .map_err(|e| format!("--weights: {e}"))?;
            }
            (None, _, Some(_)) => {
                return Err("--reinit only applies with --weights CHECKPOINT".into())
            }
            _ => {}
        }
        match &self.resume {
            Some(r) => crate::input::open_regular(r, crate::input::FileKind::Checkpoint)
                .map(|_| ())
                .map_err(|e| format!("--resume: {e}")),
            None if self.resume_changed => {
                Err("--resume-changed only applies with --resume CHECKPOINT".into())
            }
            _ => Ok(()),
        }
    }

    /// Sample limits that leave something to train and test on.
    fn check_limits(&self) -> Result<(), String> {
        if self.test_limit == Some(0) {
            return Err(
                "--test-limit 0 leaves no test set to evaluate on: give at least 1 (or leave \
                 the option out to use the whole test set)"
                    .into(),
            );
        }
        if self.keep_checkpoints == Some(0) {
            return Err(
                "--keep-checkpoints 0 would keep no checkpoint to resume from: give at \
                 least 1 (or --no-checkpoints to write none)"
                    .into(),
            );
        }
        if self.keep_commits == Some(0) {
            return Err(
                "--keep-commits 0 would keep no restart point: give at least 1 (or leave out \
                 --commit-every to commit none)"
                    .into(),
            );
        }
        if self.commit_every.is_some_and(|k| k > 0) && self.no_checkpoints {
            return Err(
                "--commit-every writes restart points, which --no-checkpoints turns off: give \
                 one of them"
                    .into(),
            );
        }
        if self.train_limit == Some(0) {
            return Err("--train-limit 0 leaves nothing to train on: give at least --batch samples (or leave the option out)".into());
        }
        Ok(())
    }

    /// The input pipeline: loader threads, prefetch depth and augmentation.
    fn resolve_input(&self) -> Result<ResolvedInput, String> {
        let loader_threads = self
            .loader_threads
            .unwrap_or_else(crate::pipeline::default_loader_threads);
        if !(1..=crate::pipeline::MAX_LOADER_THREADS).contains(&loader_threads) {
            return Err(format!(
                "--loader-threads must be 1..={}, not {loader_threads}",
                crate::pipeline::MAX_LOADER_THREADS
            ));
        }
        let prefetch = self.prefetch.unwrap_or(2);
        if prefetch > crate::pipeline::MAX_PREFETCH {
            return Err(format!(
                "--prefetch must be at most {} batches per worker, not {prefetch} (2 is plenty \
                 when loading outruns training; use more loader threads when it does not)",
                crate::pipeline::MAX_PREFETCH
            ));
        }
        let augment = crate::pipeline::Augment::parse(self.augment.as_deref().unwrap_or("off"))
            .map_err(|e| format!("--augment: {e}"))?;
        let image_size = self
            .image_size
            .as_deref()
            .map(crate::pipeline::ImageSize::parse)
            .transpose()
            .map_err(|e| format!("--image-size: {e}"))?;
        let eval_transform = self
            .eval_transform
            .as_deref()
            .map(crate::pipeline::Transforms::parse_eval)
            .transpose()
            .map_err(|e| format!("--eval-transform: {e}"))?;
        let normalize =
            crate::pipeline::NormalizeChoice::parse(self.normalize.as_deref().unwrap_or("dataset"))
                .map_err(|e| format!("--normalize: {e}"))?;
        Ok(ResolvedInput {
            loader_threads,
            prefetch,
            augment,
            image_size,
            eval_transform,
            normalize,
        })
    }

    /// A warning for a `--trace-steps` without `--trace`: not a refusal, since a config file
    /// may hold a window for the runs that trace.
    fn untraced_window(&self) -> Option<String> {
        (self.trace_steps.is_some() && self.trace.is_none()).then(|| {
            "--trace-steps chooses the steps --trace records, and no --trace is given: nothing \
             is traced"
                .to_string()
        })
    }

    /// Where the run writes and how it reports: trace window, log format, run directory.
    fn resolve_outputs(&self, model_name: &str, dataset: &str) -> Result<ResolvedOutputs, String> {
        let trace_steps = match &self.trace_steps {
            Some(s) => crate::trace::parse_steps(s).map_err(|e| format!("--trace-steps: {e}"))?,
            None => crate::trace::DEFAULT_STEPS,
        };
        let log_format = match self.log_format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            f => return Err(format!("--log-format must be text or json, not '{f}'")),
        };
        let run_dir = self.run_dir.clone().unwrap_or_else(|| {
            // Names from model files and dataset specs, made single path components.
            let name = crate::output::path_component(&format!("{model_name}-{dataset}"));
            PathBuf::from("runs").join(name)
        });
        Ok(ResolvedOutputs {
            trace_steps,
            log_format,
            run_dir,
        })
    }
}

/// An `f32` setting as the decimal it was given as (0.05, not the 0.05000000074505806 its
/// binary value widens to): the shortest decimal that reads back as the same `f32`.
fn decimal(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// An emulated bandwidth flag's value, unless it is absent or `none` (no emulation): the
/// one reading of `none` for `--link-bandwidth` and `--intra-bandwidth`, as `bench` takes it.
fn emulated(flag: &Option<String>) -> Option<&str> {
    flag.as_deref().filter(|b| b.trim() != "none")
}

/// `--flag on|off` (or `true|false`) as a switch.
fn on_off(flag: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        v => Err(format!("{flag} must be on or off, not '{v}'")),
    }
}

/// `--workers`, `--batch` and `--threads`, resolved.
struct ResolvedWorkers {
    workers: usize,
    batch: usize,
    threads: usize,
    warnings: Vec<String>,
}

/// [`crate::parallel::schedule::priority_refusal`] of these options.
fn check_priority(comm: &ResolvedComm, skip_nonfinite: bool) -> Result<(), String> {
    let tree = comm.comm == CommChoice::Fixed(crate::comm::CommMode::Tree);
    match crate::parallel::schedule::priority_refusal(comm.overlap, tree, skip_nonfinite) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// `--overlap`, `--comm`, `--transport` and `--hierarchical`, resolved.
struct ResolvedComm {
    overlap: bool,
    comm: CommChoice,
    transport: TransportKind,
    hierarchy: crate::plan::HierarchyChoice,
    compress: crate::plan::CompressChoice,
}

/// `--lr`, `--lr-schedule` and SGD's flags, resolved.
struct ResolvedSolver {
    lr: f32,
    lr_schedule: LrSchedule,
    sgd: SgdConfig,
}

/// `--loader-threads`, `--prefetch` and `--augment`, resolved.
struct ResolvedInput {
    loader_threads: usize,
    prefetch: usize,
    augment: crate::pipeline::Augment,
    image_size: Option<crate::pipeline::ImageSize>,
    eval_transform: Option<crate::pipeline::Transforms>,
    normalize: crate::pipeline::NormalizeChoice,
}

/// `--trace-steps`, `--log-format` and the run directory, resolved.
struct ResolvedOutputs {
    trace_steps: std::ops::Range<usize>,
    log_format: LogFormat,
    run_dir: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(f: impl FnOnce(&mut TrainOptions)) -> Result<TrainConfig, String> {
        let mut o = TrainOptions::default();
        f(&mut o);
        o.resolve()
    }

    #[test]
    fn skip_bad_samples_is_on_bare_and_off_in_either_form() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: TrainOptions,
        }
        let parsed = |args: &[&str]| {
            let args = std::iter::once("train").chain(args.iter().copied());
            <Cli as clap::Parser>::try_parse_from(args)
                .map(|c| c.options.skip_bad_samples)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parsed(&[]), Ok(None));
        assert_eq!(parsed(&["--skip-bad-samples"]), Ok(Some(true)));
        assert_eq!(
            parsed(&["--skip-bad-samples", "--epochs", "2"]),
            Ok(Some(true))
        );
        assert_eq!(parsed(&["--skip-bad-samples=false"]), Ok(Some(false)));
        assert_eq!(parsed(&["--skip-bad-samples", "false"]), Ok(Some(false)));
        assert!(parsed(&["--skip-bad-samples", "no"]).is_err());
    }

    #[test]
    fn bandwidth_none_emulates_no_link_or_port_and_takes_no_latency() {
        let none = opts(|o| {
            o.workers = Some(2);
            o.link_bandwidth = Some("none".into());
        })
        .unwrap();
        assert!(none.link.is_none());
        let shm = opts(|o| {
            o.workers = Some(2);
            o.comm = Some("shm".into());
            o.link_bandwidth = Some("none".into());
        });
        assert!(shm.is_ok(), "{shm:?}");
        let err = opts(|o| {
            o.workers = Some(2);
            o.link_bandwidth = Some("none".into());
            o.link_latency = Some("50us".into());
        })
        .unwrap_err();
        assert!(err.contains("one other than none"), "{err}");
        // The same reading for the port within a process: none is no port, with any transport.
        let no_port = opts(|o| {
            o.workers = Some(2);
            o.intra_bandwidth = Some("none".into());
        })
        .unwrap();
        assert!(no_port.intra_link.is_none());
        let err = opts(|o| {
            o.workers = Some(2);
            o.intra_bandwidth = Some("none".into());
            o.intra_latency = Some("5us".into());
        })
        .unwrap_err();
        assert!(
            err.contains("--intra-latency needs --intra-bandwidth"),
            "{err}"
        );
    }

    #[test]
    fn collectives_wait_on_a_link_when_one_is_emulated_or_the_workers_are_processes() {
        use crate::parallel::CollectivesWait;
        let in_memory = opts(|o| o.workers = Some(2)).unwrap();
        assert_eq!(in_memory.collectives_wait(), CollectivesWait::OnMemory);
        let emulated = opts(|o| {
            o.workers = Some(2);
            o.link_bandwidth = Some("100Mbit".into());
        })
        .unwrap();
        assert_eq!(emulated.collectives_wait(), CollectivesWait::OnALink);
        let processes = TrainConfig {
            processes: 2,
            ..in_memory
        };
        assert_eq!(processes.collectives_wait(), CollectivesWait::OnALink);
    }

    #[cfg(feature = "mpi")]
    #[test]
    fn mpi_native_with_several_workers_needs_the_hierarchy() {
        let err = opts(|o| {
            o.transport = Some("mpi".into());
            o.comm = Some("mpi-native".into());
            o.workers = Some(2);
            o.hierarchical = Some("off".into());
        })
        .unwrap_err();
        assert!(err.contains("--hierarchical leader or auto"), "{err}");
    }

    #[cfg(feature = "mpi")]
    #[test]
    fn an_emulated_port_within_a_process_needs_several_workers_and_plans_on_it() {
        let mpi = |workers: usize, bandwidth: &str| {
            opts(|o| {
                o.transport = Some("mpi".into());
                o.workers = Some(workers);
                o.intra_bandwidth = Some(bandwidth.into());
                o.intra_latency = Some("5us".into());
            })
        };
        let err = mpi(1, "12GB/s").unwrap_err();
        assert!(
            err.contains("not --transport mpi with --workers 1"),
            "{err}"
        );
        let err = opts(|o| {
            o.transport = Some("mpi".into());
            o.workers = Some(2);
            o.intra_bandwidth = Some("12GB/s".into());
            o.compress = Some("bf16".into());
        })
        .unwrap_err();
        assert!(
            err.contains("--intra-bandwidth with --compress bf16"),
            "{err}"
        );
        let err = mpi(2, "12GB/z").unwrap_err();
        assert!(err.starts_with("--intra-bandwidth: "), "{err}");
        // One float must cross the port within --comm-timeout, as on --link-bandwidth.
        let err = opts(|o| {
            o.transport = Some("mpi".into());
            o.workers = Some(2);
            o.intra_bandwidth = Some("1bit".into());
            o.comm_timeout = Some(5.0);
        })
        .unwrap_err();
        assert!(
            err.starts_with("--intra-bandwidth 0.125 bytes/s moves one float"),
            "{err}"
        );
        let cfg = mpi(2, "12GB/s").unwrap();
        let port = LinkModel {
            bandwidth_bytes_per_s: 12e9,
            latency: Duration::from_micros(5),
        };
        assert_eq!(cfg.intra_link, Some(port));
        assert_eq!(cfg.plan_inputs().intra_link, Some(port));
        assert_eq!(cfg.to_json()["intra_bandwidth_bytes_per_s"], 12e9);
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        type Case = (Box<dyn FnOnce(&mut TrainOptions)>, &'static str);
        let cases: Vec<Case> = vec![
            (
                Box::new(|o| o.workers = Some(0)),
                "--workers must be at least 1",
            ),
            (
                Box::new(|o| {
                    o.workers = Some(3);
                    o.batch = Some(64)
                }),
                "multiple of --workers",
            ),
            (
                Box::new(|o| o.model = Some("resnet50x".into())),
                "unknown model",
            ),
            (
                Box::new(|o| o.link_bandwidth = Some("10Gbt".into())),
                "--link-bandwidth",
            ),
            (
                Box::new(|o| {
                    o.workers = Some(2);
                    o.intra_bandwidth = Some("12GB/s".into())
                }),
                "--intra-bandwidth emulates the port between the workers of one process in a \
                 run of several processes (--transport mpi with --workers 2 or more), not \
                 --transport inproc",
            ),
            (
                Box::new(|o| o.intra_latency = Some("5us".into())),
                "--intra-latency needs --intra-bandwidth",
            ),
            (Box::new(|o| o.comm = Some("star".into())), "--comm"),
            (
                Box::new(|o| o.transport = Some("tcp".into())),
                "--transport must be inproc or mpi",
            ),
            (
                Box::new(|o| o.comm = Some("mpi-native".into())),
                "needs --transport mpi",
            ),
            (Box::new(|o| o.overlap = Some("maybe".into())), "--overlap"),
            (
                Box::new(|o| o.hierarchical = Some("sometimes".into())),
                "--hierarchical must be auto, 2d, leader or off",
            ),
            (Box::new(|o| o.lr = Some(-1.0)), "--lr"),
            (
                Box::new(|o| o.resume = Some("/no/such/ckpt.safetensors".into())),
                "checkpoint /no/such/ckpt.safetensors does not exist",
            ),
            (
                Box::new(|o| o.lr_schedule = Some("zigzag".into())),
                "--lr-schedule",
            ),
            (Box::new(|o| o.loader_threads = Some(0)), "--loader-threads"),
            (Box::new(|o| o.prefetch = Some(1000)), "--prefetch"),
            (Box::new(|o| o.augment = Some("rotate".into())), "--augment"),
            (
                Box::new(|o| o.trace_steps = Some("8..5".into())),
                "--trace-steps",
            ),
            (
                Box::new(|o| o.log_format = Some("xml".into())),
                "--log-format",
            ),
            (
                Box::new(|o| o.test_limit = Some(0)),
                "--test-limit 0 leaves no test set",
            ),
            (
                Box::new(|o| o.train_limit = Some(0)),
                "--train-limit 0 leaves nothing",
            ),
            (
                Box::new(|o| o.threads = Some(0)),
                "--threads must be at least 1",
            ),
            (
                Box::new(|o| o.emulate_device_scale = Some(2.0)),
                "--emulate-device-scale needs --emulate-device",
            ),
            (
                Box::new(|o| o.emulate_device = Some("/no/such/profile.json".into())),
                "--emulate-device: device profile /no/such/profile.json does not exist",
            ),
            (
                Box::new(|o| o.comm_timeout = Some(1e30)),
                "--comm-timeout must be a number of seconds from 0.001 (1 ms) to 31536000 (a \
                 year), not 1e30",
            ),
            (
                Box::new(|o| {
                    o.link_bandwidth = Some("1bit".into());
                    o.comm_timeout = Some(5.0);
                }),
                "moves one float (4 bytes) in 32 s",
            ),
            (
                Box::new(|o| {
                    o.link_bandwidth = Some("1Gbit".into());
                    o.link_latency = Some("1000s".into());
                    o.comm_timeout = Some(5.0);
                }),
                "--link-latency 1000 s is not below --comm-timeout 5 s",
            ),
            (
                Box::new(|o| o.resume_changed = true),
                "--resume-changed only applies with --resume",
            ),
        ];
        for (f, want) in cases {
            let err = opts(f).unwrap_err();
            assert!(err.contains(want), "expected '{want}' in '{err}'");
        }
    }

    #[test]
    fn threads_past_the_cores_are_capped_and_said() {
        let cores = crate::limits::cores();
        let cfg = opts(|o| o.threads = Some(cores + 1000)).unwrap();
        assert_eq!(cfg.threads, cores);
        assert!(
            cfg.warnings
                .iter()
                .any(|w| w.contains(&format!("--threads {}", cores + 1000))),
            "{:?}",
            cfg.warnings
        );
        let cfg = opts(|o| {
            o.workers = Some(cores + 1);
            o.batch = Some(cores + 1);
        })
        .unwrap();
        assert!(
            cfg.warnings.iter().any(|w| w.contains("oversubscribed")),
            "{:?}",
            cfg.warnings
        );
    }

    #[test]
    fn the_run_s_json_gives_settings_as_they_were_written() {
        let cfg = opts(|o| {
            o.lr = Some(0.05);
            o.momentum = Some(0.9);
            o.lr_schedule = Some("step:3,5:0.2".into());
        })
        .unwrap();
        let json = cfg.to_json();
        assert_eq!(json["lr"], 0.05);
        assert_eq!(json["momentum"], 0.9);
        assert_eq!(json["lr_schedule"], "step:3,5:0.2");
    }

    #[test]
    fn flags_win_over_the_file() {
        let file: TrainOptions = toml::from_str("epochs = 7\nbatch = 32\nbucket-kb = 128").unwrap();
        let cli = TrainOptions {
            epochs: Some(2),
            ..Default::default()
        };
        let cfg = file.clone().overlaid_with(&cli).resolve().unwrap();
        assert_eq!((cfg.epochs, cfg.batch, cfg.buckets.kb), (2, 32, Some(128)));
        // A refused value is named as the file's when it is the file's, else as the flag's.
        let path = Path::new("run.toml");
        // A size written as a number reads as the flag's text; another type is named.
        let sized: TrainOptions = toml::from_str("image-size = 28").unwrap();
        assert_eq!(sized.image_size.as_deref(), Some("28"));
        let sized: TrainOptions = toml::from_str("image-size = \"32x48\"").unwrap();
        assert_eq!(sized.image_size.as_deref(), Some("32x48"));
        let e = toml::from_str::<TrainOptions>("image-size = 2.5").unwrap_err();
        assert!(e.to_string().contains("a whole number or a string"), "{e}");
        let zero: TrainOptions = toml::from_str("epochs = 0").unwrap();
        let err = zero.clone().resolve_under(path, &cli).err();
        assert!(err.is_none(), "the flag's --epochs 2 wins: {err:?}");
        let err = zero
            .resolve_under(path, &TrainOptions::default())
            .unwrap_err();
        assert!(
            err.starts_with("config file run.toml: --epochs") && err.contains("without --"),
            "{err}"
        );
        let bad_flag = TrainOptions {
            batch: Some(0),
            ..Default::default()
        };
        let err = file.clone().resolve_under(path, &bad_flag).unwrap_err();
        assert!(
            err.contains("--batch") && !err.contains("config file"),
            "{err}"
        );
        // The flags alone fail (--reinit needs the file's weights) and the file's value is the
        // one refused: still the file's.
        let reinit = TrainOptions {
            reinit: Some("fc3".into()),
            ..Default::default()
        };
        assert!(reinit.resolve().is_err());
        let weighted_zero: TrainOptions =
            toml::from_str("weights = \"w.safetensors\"\nepochs = 0").unwrap();
        let err = weighted_zero.resolve_under(path, &reinit).unwrap_err();
        assert!(err.starts_with("config file run.toml: --epochs"), "{err}");
        assert!(
            toml::from_str::<TrainOptions>("epoks = 3").is_err(),
            "unknown keys are refused"
        );
        // The hidden flags a launcher or a test passes are not a file's to set.
        for internal in ["launched-by = 1", "inject-fault = \"comm@1\""] {
            let err = toml::from_str::<TrainOptions>(internal).unwrap_err();
            assert!(
                err.to_string().contains("unknown field"),
                "{internal}: {err}"
            );
        }
    }

    #[test]
    fn buckets_follow_the_link_unless_caps_are_given() {
        let with = |f: &dyn Fn(&mut TrainOptions)| {
            let mut o = TrainOptions {
                workers: Some(2),
                link_bandwidth: Some("10Gbit".into()),
                link_latency: Some("2ms".into()),
                ..Default::default()
            };
            f(&mut o);
            // A gradient smaller than the link's latency-bytes: the caps are the link's.
            o.resolve().unwrap().plan_inputs().bucket_caps(1_000_000)
        };
        // 10 Gbit/s x 2 ms = 2.5 MB: a smaller bucket would wait on latency more than it sends.
        assert_eq!(with(&|_| {}), (2_500_000, 2_500_000));
        assert_eq!(with(&|o| o.bucket_kb = Some(0.into())), (0, 0));
        assert_eq!(
            with(&|o| o.first_bucket_kb = Some(64.into())),
            (64 * 1024, 0)
        );
        // One rule for every mode (layers are small units; a fixed mode gets the same caps).
        assert_eq!(
            with(&|o| o.comm = Some("ring".into())),
            (2_500_000, 2_500_000)
        );
    }
}
