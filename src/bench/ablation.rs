//! `dptrain bench ablation`: the paper's experiment. Starting from Caffe's scheme, one
//! optimisation is added per row, so each row's gain is that optimisation's alone:
//!
//! | row | adds | comm | overlap | loading |
//! |---|---|---|---|---|
//! | 1 | baseline (Caffe) | `tree`: reduce to worker 0, which updates and broadcasts the weights | off | in the step (`--prefetch 0`) |
//! | 2 | overlap | tree | **on** | in the step |
//! | 3 | redundant mode | **redundant** | on | in the step |
//! | 4 | auto mode | **auto** (per bucket, the alpha-beta cost model) | on | in the step |
//! | 5 | preloading | auto | on | **loader threads, prefetch K** |
//!
//! Redundant and auto are separate rows: at two workers on one link the cost model may well
//! pick redundant for every bucket (then row 4 equals row 3, which is itself a finding), while
//! at 64 or 512 simulated workers redundant's N-1 full-size messages lose to ring or
//! halving-doubling, and auto is what keeps the gain.
//!
//! Each row is a short emulated training run (the overlap grid's [`case_options`], so the same
//! trainer, link emulation and step accounting as every other benchmark) on an ImageFolder:
//! PNG files decoded per sample by the loaders, with augmentation. In-memory data would make
//! loading free and preloading pointless; decoding gives loading the cost it has on real data.
//! Beside the measured rows, the same rows from the simulator at 8, 64 and 512 workers, from a
//! profile of the model measured on this machine.

use super::data::{export_image_folder, image_source_for};
use super::median;
use super::overlap::{case_options, GridSpec, OverlapCase};
use super::ScratchDir;
use crate::comm::{parse_bandwidth, parse_duration, LinkModel};
use crate::config::CommChoice;
use crate::config::TrainOptions;
use crate::sim::{measure, MeasureSpec, Simulator, StepConfig, Stragglers, Topology};
use crate::train::metrics::StepTimes;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Steps of each run left out of the figures (the first steps allocate and fill caches); they
/// are the 5 untimed steps [`case_options`] adds.
pub const WARMUP_STEPS: usize = 5;

/// Test samples each run evaluates (the evaluation is not timed; it only has to exist).
const TEST_SAMPLES: usize = 100;

/// `ablation.md`, known by its first line.
const ABLATION_MD: crate::output::Kind = crate::output::Kind {
    what: "an ablation table dptrain wrote",
    head: 64,
    is_one: |head| head.starts_with(b"# Ablation\n"),
};

/// `ablation.json`: an object with an [`AblationReport`]'s first keys.
const ABLATION_JSON: crate::output::Kind = crate::output::Kind {
    what: "an ablation table dptrain wrote",
    head: 64 << 20,
    is_one: |bytes| crate::output::is_json_object_with(bytes, &["model", "workers", "link"]),
};

/// Arguments of `dptrain bench ablation`.
#[derive(Debug, Clone, clap::Args)]
pub struct AblationArgs {
    /// Model: a built-in name (`dptrain model list`) or a model file (docs/MODEL_FILES.md).
    #[arg(long, default_value = "lenet5")]
    pub model: String,
    /// Workers of the measured rows (at least 2).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Emulated link bandwidth per worker (e.g. 1Gbit, 100MB/s), or "none" for memory speed.
    #[arg(allow_hyphen_values = true, long, default_value = "1Gbit")]
    pub link_bandwidth: String,
    /// Emulated one-way link latency (e.g. 50us).
    #[arg(allow_hyphen_values = true, long, default_value = "50us")]
    pub link_latency: String,
    /// Timed steps per run (5 more run first, untimed). lenet5 steps take a few ms, so the
    /// default keeps the whole ablation to seconds; vgg-small takes a few minutes.
    #[arg(long, default_value_t = 60)]
    pub steps: usize,
    /// Rounds: each runs every row once; a row's images/s is its median over rounds.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Compute threads per worker.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Global batch, split evenly over the workers.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Loader threads of the preloading row.
    #[arg(long, default_value_t = 1)]
    pub loader_threads: usize,
    /// Batches prefetched per worker in the preloading row.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Augmentation applied by the loaders in every row (off, or e.g. crop:4,flip).
    #[arg(long, default_value = "crop:4,flip")]
    pub augment: String,
    /// Simulated worker counts, comma-separated.
    #[arg(long, default_value = "8,64,512")]
    pub sim_workers: String,
    /// Also write ablation.md and ablation.json into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What one row sets: the four settings the ablation varies. Loader threads are the same in
/// every row (they only run with `prefetch > 0`), so "loading" is one setting: `prefetch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// `--comm`: tree, redundant or auto.
    pub comm: String,
    /// `--overlap`.
    pub overlap: bool,
    /// `--prefetch`: 0 loads each batch inside the step (synchronous), K > 0 preloads.
    pub prefetch: usize,
    /// `--loader-threads` (used only when `prefetch > 0`).
    pub loader_threads: usize,
}

impl Settings {
    /// Names of the settings in which `self` and `other` differ.
    pub fn differences(&self, other: &Settings) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.comm != other.comm {
            d.push("comm");
        }
        if self.overlap != other.overlap {
            d.push("overlap");
        }
        if self.prefetch != other.prefetch {
            d.push("prefetch");
        }
        if self.loader_threads != other.loader_threads {
            d.push("loader_threads");
        }
        d
    }

    /// "in step" or "preload K x T" (K batches per worker, T loader threads).
    pub fn loading(&self) -> String {
        if self.prefetch == 0 {
            "in step".into()
        } else {
            format!("preload {}x{}", self.prefetch, self.loader_threads)
        }
    }
}

/// One row of the ablation: what it adds and the settings it runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// What this row adds to the previous one ("baseline" for the first).
    pub adds: &'static str,
    /// The settings.
    pub settings: Settings,
}

/// The ablation's rows, each adding one optimisation to the previous one: the baseline (tree
/// with root update, overlap off, loading in the step), + overlap, + redundant mode, + auto
/// mode, + preloading (`prefetch` batches per worker, `loader_threads` loader threads).
pub fn stages(prefetch: usize, loader_threads: usize) -> Vec<Stage> {
    let mut s = Settings {
        comm: "tree".into(),
        overlap: false,
        prefetch: 0,
        loader_threads,
    };
    let mut rows = vec![Stage {
        adds: "baseline (tree, root update)",
        settings: s.clone(),
    }];
    let mut add = |adds: &'static str, change: &dyn Fn(&mut Settings)| {
        change(&mut s);
        rows.push(Stage {
            adds,
            settings: s.clone(),
        });
    };
    add("+ overlap", &|s| s.overlap = true);
    add("+ redundant mode", &|s| s.comm = "redundant".into());
    add("+ auto mode", &|s| s.comm = "auto".into());
    add("+ preloading", &|s| s.prefetch = prefetch);
    rows
}

/// The ablation's fixed parameters, validated.
#[derive(Debug, Clone)]
pub struct AblationSpec {
    /// Model.
    pub model: String,
    /// Workers of the measured rows.
    pub workers: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Global batch.
    pub batch: usize,
    /// Timed steps per run.
    pub steps: usize,
    /// Rounds of runs (every row once per round).
    pub repeats: usize,
    /// `--link-bandwidth` and `--link-latency` as given; `None` for no emulation.
    pub link: Option<(String, String)>,
    /// The same, parsed (for the simulator).
    pub link_model: Option<LinkModel>,
    /// Augmentation.
    pub augment: String,
    /// Loader threads of the preloading row.
    pub loader_threads: usize,
    /// Prefetch depth of the preloading row.
    pub prefetch: usize,
    /// Simulated worker counts.
    pub sim_workers: Vec<usize>,
}

impl AblationSpec {
    /// Checks the arguments; the error says which flag to change and how.
    pub fn from_args(a: &AblationArgs) -> Result<Self, String> {
        crate::model::load(&a.model).map_err(|e| format!("--model: {e}"))?;
        if a.workers < 2 {
            return Err(format!(
                "--workers {}: the ablation compares ways of communicating, so it needs at least 2 workers",
                a.workers
            ));
        }
        crate::plan::per_worker_batch(a.batch, a.workers, 1).map_err(|e| e.to_string())?;
        crate::comm::transport::check_in_process_workers(a.workers)?;
        super::args::check_timed_counts(&[("--steps", a.steps), ("--repeats", a.repeats)])?;
        if a.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        if a.prefetch == 0 || a.loader_threads == 0 {
            return Err(
                "--prefetch and --loader-threads are the preloading row's settings: give at least 1 each"
                    .into(),
            );
        }
        let sim_workers = super::args::worker_list("--sim-workers", &a.sim_workers)?;
        let (link, link_model) = if a.link_bandwidth.trim() == "none" {
            (None, None)
        } else {
            let model = LinkModel {
                bandwidth_bytes_per_s: parse_bandwidth(&a.link_bandwidth)
                    .map_err(|e| format!("--link-bandwidth: {e}"))?,
                latency: parse_duration(&a.link_latency)
                    .map_err(|e| format!("--link-latency: {e}"))?,
            };
            (
                Some((a.link_bandwidth.clone(), a.link_latency.clone())),
                Some(model),
            )
        };
        // After the one bandwidth is read (a list is not one: its error says so).
        super::args::check_emulated_links(&a.model, &a.link_bandwidth, &a.link_latency, true)?;
        // The augmentation's own parser gives the message for a bad value.
        TrainOptions {
            augment: Some(a.augment.clone()),
            ..Default::default()
        }
        .resolve()?;
        let spec = Self {
            model: a.model.clone(),
            workers: a.workers,
            threads: a.threads,
            batch: a.batch,
            steps: a.steps,
            repeats: a.repeats,
            link,
            link_model,
            augment: a.augment.clone(),
            loader_threads: a.loader_threads,
            prefetch: a.prefetch,
            sim_workers,
        };
        spec.profile_spec().check()?;
        Ok(spec)
    }

    /// The profile the simulated rows rest on: as many replicas at once as the measured rows
    /// have workers, each on the compute threads a measured row's worker runs
    /// ([`crate::limits::threads_per_worker`], `--threads` capped at the cores).
    fn profile_spec(&self) -> MeasureSpec<'_> {
        let threads = crate::limits::threads_per_worker(Some(self.threads), self.workers).0;
        MeasureSpec {
            concurrent: self.workers,
            flags: crate::measure::MeasureFlags::workers("--workers"),
            ..MeasureSpec::new(
                &self.model,
                self.per_worker_batch(),
                threads,
                self.steps.clamp(3, 20),
            )
        }
    }

    /// Per-worker batch (the same in every run: weak scaling).
    pub fn per_worker_batch(&self) -> usize {
        self.batch / self.workers
    }

    /// Training samples a run reads: one epoch of `steps + WARMUP_STEPS` global batches.
    pub fn train_samples(&self) -> usize {
        self.batch * (self.steps + WARMUP_STEPS)
    }

    /// The link as text, e.g. "1Gbit / 50us" or "none (memory speed)".
    pub fn link_text(&self) -> String {
        match &self.link {
            Some((b, l)) => format!("{b} / {l}"),
            None => "none (memory speed)".into(),
        }
    }
}

/// The training options of one row: the overlap grid's cell ([`case_options`]) with the row's
/// comm and overlap, on the ImageFolder at `data_dir` with the spec's augmentation and the
/// row's loading, logging every step's times to `run_dir/metrics.jsonl`.
pub fn stage_options(
    spec: &AblationSpec,
    settings: &Settings,
    data_dir: &Path,
    run_dir: &Path,
) -> TrainOptions {
    let grid = GridSpec {
        model: spec.model.clone(),
        workers: spec.workers,
        batch: spec.batch,
        threads: spec.threads,
        steps: spec.steps,
        bucket_kb: None,
        conv_algo: crate::backend::ConvAlgo::default(),
    };
    let case = OverlapCase {
        comm: settings.comm.clone(),
        overlap: settings.overlap,
        schedule: crate::parallel::Schedule::Overlap,
        bandwidth: spec.link.as_ref().map(|l| l.0.clone()),
        latency: spec.link.as_ref().map(|l| l.1.clone()),
    };
    let mut o = case_options(&grid, &case, run_dir);
    o.dataset = Some("imagefolder".into());
    o.data_dir = Some(data_dir.to_path_buf());
    o.augment = Some(spec.augment.clone());
    o.prefetch = Some(settings.prefetch);
    o.loader_threads = Some(settings.loader_threads);
    o.log_every = Some(1);
    o.test_limit = Some(TEST_SAMPLES);
    o
}

/// The 1-worker reference: the same per-worker batch, with preloading (the best a single
/// worker does), so efficiency counts everything the ablation improves.
pub fn single_worker_options(spec: &AblationSpec, data_dir: &Path, run_dir: &Path) -> TrainOptions {
    let one = AblationSpec {
        workers: 1,
        batch: spec.per_worker_batch(),
        link: None,
        ..spec.clone()
    };
    let settings = Settings {
        comm: "ring".into(),
        overlap: true,
        prefetch: spec.prefetch,
        loader_threads: spec.loader_threads,
    };
    stage_options(&one, &settings, data_dir, run_dir)
}

/// Worker 0's step times after warm-up, read from a run's `metrics.jsonl` (written with
/// `--log-every 1`).
fn timed_steps(run_dir: &Path) -> Result<Vec<StepTimes>, String> {
    let path = run_dir.join("metrics.jsonl");
    let text = crate::input::read_text(&path, crate::input::FileKind::Metrics)
        .map_err(|e| e.to_string())?;
    let mut steps = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{}: {e}", path.display()))?;
        let is_timed_step = v["kind"] == "step"
            && v["step"]
                .as_u64()
                .is_some_and(|s| s as usize >= WARMUP_STEPS);
        if is_timed_step {
            steps.push(
                serde_json::from_value(v["times"].clone())
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            );
        }
    }
    if steps.is_empty() {
        return Err(format!("{}: no timed steps recorded", path.display()));
    }
    Ok(steps)
}

/// Per-phase medians of `steps` (each phase on its own, so they need not add up to the
/// median step).
fn median_times(steps: &[StepTimes]) -> StepTimes {
    let m = |f: fn(&StepTimes) -> f64| median(&mut steps.iter().map(f).collect::<Vec<_>>());
    StepTimes {
        data_ms: m(|t| t.data_ms),
        forward_ms: m(|t| t.forward_ms),
        backward_ms: m(|t| t.backward_ms),
        exposed_comm_ms: m(|t| t.exposed_comm_ms),
        comm_total_ms: m(|t| t.comm_total_ms),
        comm_cpu_ms: m(|t| t.comm_cpu_ms),
        update_ms: m(|t| t.update_ms),
        step_ms: m(|t| t.step_ms),
    }
}

/// Images per second of `batch` images per step at the median step time of `steps`. The
/// median, not the mean: on a machine shared with other jobs a few steps stall for tens of
/// ms, and the mean of a short run then says more about the neighbours than the settings.
fn images_per_s(batch: usize, steps: &[StepTimes]) -> f64 {
    let step_ms = median(&mut steps.iter().map(|t| t.step_ms).collect::<Vec<_>>());
    batch as f64 * 1e3 / step_ms.max(1e-9)
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredStage {
    /// What the row adds.
    pub adds: String,
    /// Its settings.
    pub settings: Settings,
    /// Each bucket's operation as the run chose it (auto's choices show here).
    pub bucket_ops: Vec<String>,
    /// Global batch / median step time of worker 0 after warm-up (median over rounds).
    pub images_per_s: f64,
    /// `images_per_s` over the baseline's.
    pub speedup: f64,
    /// Weak-scaling efficiency: `images_per_s / (workers x single-worker images/s)`.
    pub efficiency: f64,
    /// Per-phase medians over the timed steps, ms.
    pub median: StepTimes,
}

/// One simulated row at one worker count.
#[derive(Debug, Clone, Serialize)]
pub struct SimulatedStage {
    /// What the row adds.
    pub adds: String,
    /// Simulated workers.
    pub workers: usize,
    /// Simulated step plus the data wait assumed for the row, ms.
    pub step_ms: f64,
    /// The data wait added: the measured in-step load time, or 0 with preloading.
    pub data_ms: f64,
    /// Exposed communication (tree mode: with the weight broadcast), ms.
    pub exposed_ms: f64,
    /// `workers x per-worker batch / step`.
    pub images_per_s: f64,
    /// Weak-scaling efficiency against the simulated 1-worker step with preloading.
    pub efficiency: f64,
    /// `images_per_s` over the simulated baseline's at the same worker count.
    pub speedup: f64,
}

/// Everything the ablation measured and simulated (what `ablation.json` holds).
#[derive(Debug, Clone, Serialize)]
pub struct AblationReport {
    /// Model.
    pub model: String,
    /// Workers of the measured rows.
    pub workers: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Global batch.
    pub batch: usize,
    /// Timed steps per run.
    pub steps: usize,
    /// Rounds (every row once per round).
    pub repeats: usize,
    /// Link as given.
    pub link: String,
    /// What the runs read.
    pub data: String,
    /// Images/s of one worker at the per-worker batch, with preloading.
    pub single_worker_images_per_s: f64,
    /// The measured rows.
    pub measured: Vec<MeasuredStage>,
    /// Where the simulator's profile came from.
    pub profile_source: String,
    /// The in-step load time added to simulated rows without preloading (the baseline's
    /// measured median data wait), ms.
    pub sync_data_ms: f64,
    /// The simulated rows, by worker count then row.
    pub simulated: Vec<SimulatedStage>,
    /// Wall time of the whole ablation, s.
    pub wall_seconds: f64,
}

/// Runs the ablation: exports the ImageFolder, runs the 1-worker reference and every row,
/// measures a profile and simulates the rows at the spec's worker counts.
pub fn run(spec: &AblationSpec) -> Result<AblationReport, String> {
    let started = std::time::Instant::now();
    let scratch = ScratchDir::new("ablation");
    let data_dir = scratch.path().join("images");
    let source = image_source_for(&spec.model);
    export_image_folder(source, spec.train_samples(), TEST_SAMPLES, &data_dir)?;
    let (single, measured) = measure_rows(spec, &data_dir, scratch.path())?;
    let simulated = simulate_rows(spec, &measured)?;
    Ok(AblationReport {
        model: spec.model.clone(),
        workers: spec.workers,
        threads: spec.threads,
        batch: spec.batch,
        steps: spec.steps,
        repeats: spec.repeats,
        link: spec.link_text(),
        data: format!(
            "ImageFolder exported from {source} ({} train PNGs decoded per sample by the loaders), augment {}",
            spec.train_samples(),
            spec.augment
        ),
        single_worker_images_per_s: single,
        measured,
        profile_source: simulated.profile_source,
        sync_data_ms: simulated.sync_data_ms,
        simulated: simulated.rows,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every row measured (and the 1-worker reference) on the ImageFolder at `data_dir`, run
/// directories in `scratch`: the reference's images/s and the measured rows.
fn measure_rows(
    spec: &AblationSpec,
    data_dir: &Path,
    scratch: &Path,
) -> Result<(f64, Vec<MeasuredStage>), String> {
    // Rounds run every row once, in order; a row's images/s is its median over rounds. Spread
    // this way, a slow spell of a shared machine lands on all rows rather than on one.
    let rows = stages(spec.prefetch, spec.loader_threads);
    let mut single_rounds = Vec::new();
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut pooled: Vec<Vec<StepTimes>> = vec![Vec::new(); rows.len()];
    let mut ops: Vec<Vec<String>> = vec![Vec::new(); rows.len()];
    for _ in 0..spec.repeats {
        let run_dir = scratch.join("run-single");
        train_quietly(single_worker_options(spec, data_dir, &run_dir))?;
        single_rounds.push(images_per_s(
            spec.per_worker_batch(),
            &timed_steps(&run_dir)?,
        ));
        for (i, stage) in rows.iter().enumerate() {
            let run_dir = scratch.join(format!("run-{}", i + 1));
            let summary = train_quietly(stage_options(spec, &stage.settings, data_dir, &run_dir))?;
            let steps = timed_steps(&run_dir)?;
            rounds[i].push(images_per_s(spec.batch, &steps));
            pooled[i].extend(steps);
            ops[i] = summary.bucket_ops;
        }
    }
    let single = median(&mut single_rounds);
    let mut measured: Vec<MeasuredStage> = Vec::new();
    for (i, stage) in rows.into_iter().enumerate() {
        let ips = median(&mut rounds[i]);
        let base = measured.first().map_or(ips, |b| b.images_per_s);
        measured.push(MeasuredStage {
            adds: stage.adds.into(),
            settings: stage.settings,
            bucket_ops: std::mem::take(&mut ops[i]),
            images_per_s: ips,
            speedup: ips / base,
            efficiency: ips / (spec.workers as f64 * single),
            median: median_times(&pooled[i]),
        });
    }
    Ok((single, measured))
}

/// The simulated rows and what they rest on.
struct SimulatedRows {
    profile_source: String,
    sync_data_ms: f64,
    rows: Vec<SimulatedStage>,
}

/// The measured rows' settings simulated at each of the spec's worker counts, from a profile
/// measured here.
fn simulate_rows(spec: &AblationSpec, measured: &[MeasuredStage]) -> Result<SimulatedRows, String> {
    let profile = measure(&spec.profile_spec())?;
    // The link an in-process run of this spec plans for (`plan::PlanInputs::auto_link`).
    let link = crate::plan::PlanInputs::defaults(1, spec.workers, spec.link_model).auto_link();
    let mut simulator = Simulator::new();
    let mut sim = |world: usize, comm: CommChoice, overlap: bool| {
        simulator.step(
            &profile,
            &StepConfig {
                compress: crate::plan::CompressChoice::NONE,
                schedule: crate::parallel::Schedule::Overlap,
                partition_kb: None,
                credit_kb: None,
                topology: Topology::flat(world, link),
                comm,
                hierarchy: crate::plan::HierarchyChoice::Auto,
                overlap,
                // The trainer's default buckets (`plan::PlanInputs::bucket_caps`), as the
                // measured rows ran.
                buckets: crate::plan::BucketFlags::default(),
                planning_link: None,
                planning_intra: None,
                stragglers: Stragglers::NONE,
            },
        )
    };
    let single_sim_ms = sim(1, CommChoice::parse("ring")?, true)?.step_ms;
    let sync_data_ms = measured[0].median.data_ms;
    let mut rows = Vec::new();
    for &world in &spec.sim_workers {
        let mut base_ms = None;
        for m in measured {
            let r = sim(
                world,
                CommChoice::parse(&m.settings.comm)?,
                m.settings.overlap,
            )?;
            let data_ms = if m.settings.prefetch == 0 {
                sync_data_ms
            } else {
                0.0
            };
            let step_ms = r.step_ms + data_ms;
            let base = *base_ms.get_or_insert(step_ms);
            rows.push(SimulatedStage {
                adds: m.adds.clone(),
                workers: world,
                step_ms,
                data_ms,
                exposed_ms: r.exposed_ms,
                images_per_s: (world * spec.per_worker_batch()) as f64 * 1e3 / step_ms,
                efficiency: single_sim_ms / step_ms,
                speedup: base / step_ms,
            });
        }
    }
    Ok(SimulatedRows {
        profile_source: profile.source.clone(),
        sync_data_ms,
        rows,
    })
}

/// A short training run that prints nothing (the options say `quiet`).
fn train_quietly(opts: TrainOptions) -> Result<crate::train::Summary, String> {
    Ok(crate::train::train(opts.resolve()?)?)
}

/// The bucket operations of a run, compressed: `tree-reduce+root-update`, `redundant`, or
/// `ring x3, redundant x2` when they differ.
fn ops_text(ops: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for op in ops {
        match counts.iter_mut().find(|c| c.0 == op) {
            Some(c) => c.1 += 1,
            None => counts.push((op, 1)),
        }
    }
    match counts.as_slice() {
        [(op, _)] => op.to_string(),
        _ => counts
            .iter()
            .map(|(op, n)| format!("{op} x{n}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

impl AblationReport {
    /// The report as markdown: a header saying what was measured and how, the measured table,
    /// and the simulated table.
    pub fn markdown(&self) -> String {
        let mut s = self.measured_markdown();
        s += &self.preloading_note();
        s += &self.simulated_markdown();
        s
    }

    /// The report on the terminal: its markdown, then one `RESULT` line per measured row.
    pub fn terminal(&self) -> String {
        let results: Vec<String> = self
            .measured
            .iter()
            .map(|m| {
                format!(
                    "RESULT dptrain ablation model={} workers={} row=\"{}\" images_per_s={:.0} speedup={:.3}",
                    self.model, self.workers, m.adds, m.images_per_s, m.speedup
                )
            })
            .collect();
        format!("{}\n{}", self.markdown(), results.join("\n"))
    }

    /// What was measured and how, and the measured table.
    fn measured_markdown(&self) -> String {
        let per_worker = self.batch / self.workers;
        let mut s = format!(
            "**{}**, {} workers x {} thread(s), link {}, global batch {} ({per_worker} per worker), \
             {} round(s) of one run per row, {} timed steps per run after {WARMUP_STEPS} warm-up \
             steps.\n\n\
             Data: {}.\n\n\
             images/s = global batch / median step time of worker 0, median over rounds; speed-up \
             over row 1; \
             efficiency = weak scaling: images/s / ({} x {:.0} images/s of 1 worker at batch \
             {per_worker} with preloading). Step breakdown: per-phase medians over all timed \
             steps of all rounds, ms (they need not add up to the median step).\n\n",
            self.model,
            self.workers,
            self.threads,
            self.link,
            self.batch,
            self.repeats,
            self.steps,
            self.data,
            self.workers,
            self.single_worker_images_per_s
        );
        s += "| # | adds | comm (per bucket) | overlap | loading | images/s | speed-up | eff % | step | data | fwd | bwd | exposed comm | update |\n";
        s += "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        for (i, m) in self.measured.iter().enumerate() {
            let t = &m.median;
            s += &format!(
                "| {} | {} | {} | {} | {} | {:.0} | {:.2}x | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                i + 1,
                m.adds,
                ops_text(&m.bucket_ops),
                if m.settings.overlap { "on" } else { "off" },
                m.settings.loading(),
                m.images_per_s,
                m.speedup,
                100.0 * m.efficiency,
                t.step_ms,
                t.data_ms,
                t.forward_ms,
                t.backward_ms,
                t.exposed_comm_ms,
                t.update_ms
            );
        }
        s
    }

    /// Why preloading gained little, when it did and the loaders had no cores of their own;
    /// empty otherwise.
    fn preloading_note(&self) -> String {
        let [.., before, last] = self.measured.as_slice() else {
            return String::new();
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let busy = self.workers * self.threads + last.settings.loader_threads;
        let gained_little = last.speedup < before.speedup * 1.05;
        if !(gained_little && busy > cores) {
            return String::new();
        }
        format!(
            "\nPreloading took the data wait from {:.2} to {:.2} ms, yet images/s went \
             from {:.0} to {:.0}: its {} loader thread(s) share this machine's {cores} \
             core(s) with {} worker compute thread(s), so decoding still takes CPU time \
             from the step (and the extra thread adds scheduling noise). With spare \
             cores (or a GPU doing the compute) the data wait goes without that cost.\n",
            before.median.data_ms,
            last.median.data_ms,
            before.images_per_s,
            last.images_per_s,
            last.settings.loader_threads,
            self.workers * self.threads
        )
    }

    /// What the simulated rows rest on, and their table: one column per worker count.
    fn simulated_markdown(&self) -> String {
        let per_worker = self.batch / self.workers;
        let worlds: Vec<usize> = {
            let mut w: Vec<usize> = self.simulated.iter().map(|r| r.workers).collect();
            w.dedup();
            w
        };
        let mut s = format!(
            "\nSimulated on the same link, from a profile {} at batch {per_worker}; buckets one \
             block each (the trainer's default). The simulator does not model loading: rows \
             without preloading add the baseline's measured in-step load time ({:.2} ms, its \
             median data wait) to the simulated step, preloaded rows assume a data wait of 0. \
             Cells: step ms / efficiency % / speed-up over row 1.\n\n",
            self.profile_source, self.sync_data_ms
        );
        s += "| # | adds |";
        for w in &worlds {
            s += &format!(" {w} workers |");
        }
        s += "\n|---|---|";
        s += &"---:|".repeat(worlds.len());
        s += "\n";
        for (i, m) in self.measured.iter().enumerate() {
            s += &format!("| {} | {} |", i + 1, m.adds);
            for w in &worlds {
                if let Some(r) = self
                    .simulated
                    .iter()
                    .find(|r| r.workers == *w && r.adds == m.adds)
                {
                    s += &format!(
                        " {:.1} / {:.1}% / {:.2}x |",
                        r.step_ms,
                        100.0 * r.efficiency,
                        r.speedup
                    );
                }
            }
            s += "\n";
        }
        s
    }

    /// Writes `ablation.md` and `ablation.json` into `dir` (created if needed: one level, see
    /// [`crate::output`]).
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        crate::output::create_dir(dir)?;
        let md = format!("# Ablation\n\n{}", self.markdown());
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        for (name, text, kind) in [
            ("ablation.md", md, &ABLATION_MD),
            ("ablation.json", json, &ABLATION_JSON),
        ] {
            crate::output::write_atomically(&dir.join(name), text.as_bytes(), kind)?;
        }
        Ok(())
    }
}

/// Runs `dptrain bench ablation`: prints the tables, and writes them with `--out`.
pub fn run_command(a: AblationArgs) -> Result<(), String> {
    let spec = AblationSpec::from_args(&a)?;
    let mut created = crate::output::CreatedDirs::default();
    if let Some(dir) = &a.out {
        created.create(dir).map_err(|e| format!("--out: {e}"))?;
    }
    // A failed ablation leaves no empty --out it made.
    created.removed_if_failed(|| run_and_write(&spec, a.out.as_deref()))
}

/// The ablation of `spec`, printed, and written into `out` (which exists).
fn run_and_write(spec: &AblationSpec, out: Option<&Path>) -> Result<(), String> {
    if let Some(dir) = out {
        // Checked before the minutes of runs whose tables it would hold.
        for (name, kind) in [
            ("ablation.md", &ABLATION_MD),
            ("ablation.json", &ABLATION_JSON),
        ] {
            crate::output::check_writable(&dir.join(name), kind)
                .map_err(|e| format!("--out: {e}"))?;
        }
    }
    crate::outln!(
        "ablation of {} on {} workers: {} round(s) of 6 short runs (1-worker reference + 5 rows), then a profile and the simulator",
        spec.model, spec.workers, spec.repeats
    );
    let report = run(spec)?;
    crate::outln!("{}", report.terminal());
    if let Some(dir) = out {
        report.write(dir)?;
        crate::outln!("written to {}", dir.join("ablation.md").display());
    }
    crate::outln!("ablation took {:.0} s", report.wall_seconds);
    Ok(())
}
