//! A training run: load data, start the workers (threads, one model replica each, connected by
//! an in-process fabric), follow their progress, write metrics and a summary.
//!
//! The step itself is in [`worker`]; the solver in [`crate::optim`]; the synchronisation in
//! [`crate::parallel`].

pub mod checkpoint;
pub mod metrics;
pub mod processes;
pub mod rundir;
pub mod worker;

use crate::comm::InProcessFabric;
use crate::config::TrainConfig;
use crate::data::{self, Dataset, DatasetSpec};
use crate::pipeline::{BatchFeed, Collator, DistributedSampler, LoadStats, Pipeline, Source};
use metrics::{append_jsonl, peak_rss_mb, Breakdown, EpochRecord, StepTimes};
pub use processes::ProcessGroup;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use worker::{Worker, WorkerSetup};

/// Progress reported by workers to the run.
pub enum Event {
    /// Worker 0's bucket plan, at start.
    Plan {
        /// Bucket sizes.
        description: String,
        /// Each bucket's operation.
        ops: Vec<String>,
    },
    /// A worker finished a step.
    Step {
        /// Worker.
        rank: usize,
        /// Epoch (from 0).
        epoch: usize,
        /// Step within the epoch.
        step: usize,
        /// The worker's loss on its shard.
        loss: f32,
        /// Where the time went.
        times: StepTimes,
    },
    /// Worker 0 finished an epoch and evaluated.
    Epoch {
        /// Epoch (from 0).
        epoch: usize,
        /// Mean training loss of worker 0.
        train_loss: f64,
        /// Test loss.
        test_loss: f64,
        /// Test accuracy, 0..1.
        test_accuracy: f64,
        /// Seconds of training steps in the epoch (worker 0).
        train_seconds: f64,
        /// Checkpoint written, if any.
        checkpoint: Option<PathBuf>,
    },
    /// A worker failed (error or panic); sent before its communication thread goes away, so
    /// the first of these is the cause and later ones are peers noticing it.
    Failed {
        /// Worker.
        rank: usize,
        /// What happened, naming the worker, the phase and the step.
        error: String,
    },
    /// A worker finished training.
    Done {
        /// Worker.
        rank: usize,
        /// Hash of its final weights (equal on every worker when replicas are in sync).
        weights_hash: u64,
        /// Updates it skipped for a non-finite gradient.
        skipped_updates: usize,
    },
}

/// The end result of a run (also written to `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Configuration used.
    pub config: serde_json::Value,
    /// Per-epoch results.
    pub epochs: Vec<EpochRecord>,
    /// Final test accuracy.
    pub final_test_accuracy: f64,
    /// Training throughput over the whole run (images/s, all workers, evaluation excluded).
    pub images_per_s: f64,
    /// Mean step breakdown over the run, averaged over workers, first 5 steps excluded.
    pub breakdown: Breakdown,
    /// Bucket plan.
    pub buckets: String,
    /// Operation per bucket.
    pub bucket_ops: Vec<String>,
    /// Last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// Wall time of the whole run.
    pub wall_seconds: f64,
    /// Hash of each worker's final weights; all equal when the replicas stayed identical.
    pub replica_hashes: Vec<u64>,
    /// Steps whose update was skipped for a NaN/infinite gradient (`--on-nonfinite skip`).
    pub skipped_nonfinite_updates: usize,
    /// Peak resident memory of the process at the end of the run, MiB.
    pub peak_rss_mb: f64,
    /// Sample reads left out with `--skip-bad-samples`.
    pub skipped_samples: usize,
    /// The first few skipped samples and why, each naming its file.
    pub skipped_examples: Vec<String>,
    /// Over several processes, each rank's step breakdown and link figures (in rank order);
    /// empty in a single-process run.
    pub ranks: Vec<processes::RankBreakdown>,
    /// The ranks whose compute or link is much slower than the others', and why.
    pub slow_ranks: Vec<processes::SlowRank>,
    /// Optimizer steps of this run (after the resumed ones, if any).
    pub steps: usize,
    /// The run directory the run wrote to (without `--run-dir`, the next free numbered one
    /// when the default held an earlier run).
    pub run_dir: PathBuf,
}

impl Summary {
    /// What a person should be told about the run besides its results: updates skipped for a
    /// non-finite gradient (loudly when most were), sample reads skipped, no timed steps.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let (skipped, steps) = (self.skipped_nonfinite_updates, self.steps);
        if skipped > 0 {
            let msg = format!(
                "{skipped} of {steps} updates were skipped for a NaN or infinite gradient \
                 (--on-nonfinite skip)"
            );
            // More than half skipped: the model barely trained, whatever the accuracy says.
            if 2 * skipped > steps {
                w.push(format!(
                    "MOST UPDATES WERE SKIPPED: {msg}; the model hardly trained: lower --lr (or \
                     raise --warmup-steps) and run again"
                ));
            } else {
                w.push(msg);
            }
        }
        if self.skipped_samples > 0 {
            w.push(format!(
                "{} sample reads were skipped as unreadable (--skip-bad-samples), e.g. {}",
                self.skipped_samples,
                self.skipped_examples.first().map_or("-", String::as_str)
            ));
        }
        if self.breakdown.steps == 0 {
            w.push(self.breakdown.describe());
        }
        w
    }
}

/// Prints a warning on stderr (rank 0 only; shown also with `--quiet`, which keeps stdout
/// quiet).
fn warn(cfg: &TrainConfig, message: &str) {
    if cfg.process_rank == 0 {
        crate::cli::print_warning(message);
    }
}

/// Checks that the checkpoint's run trained on the same data in the same order as this one
/// would (dataset, global batch, seed, training limit): otherwise the resumed run would continue
/// at a global step computed for another run. Refused naming each field and both values, unless
/// `--resume-changed`; returns the warning to show when it was accepted that way, or when the
/// checkpoint is too old to tell.
pub fn check_resume(
    cfg: &TrainConfig,
    model: &str,
    state: &checkpoint::TrainState,
    path: &Path,
) -> Result<Option<String>, String> {
    // The model first: its tensors could not be loaded into another one anyway.
    if state.model != model {
        return Err(format!(
            "the checkpoint is for model '{}', not '{model}': resume with --model {}",
            state.model, state.model
        ));
    }
    let Some(then) = &state.run else {
        return Ok(Some(format!(
            "checkpoint {} does not record its run's dataset, batch and seed (written by an \
             older dptrain): resuming without checking them",
            path.display()
        )));
    };
    let changes = then.changes(&checkpoint::RunIdentity::of(cfg));
    if changes.is_empty() {
        return Ok(None);
    }
    let list = changes
        .iter()
        .map(|(flag, old, new)| format!("{flag} {old} in the checkpoint, {new} now"))
        .collect::<Vec<_>>()
        .join("; ");
    if cfg.resume_changed {
        return Ok(Some(format!(
            "--resume-changed: resuming {} under other settings ({list}); the data order and \
             step count follow the new settings",
            path.display()
        )));
    }
    Err(format!(
        "--resume {}: this run differs from the checkpoint's ({list}); resuming would continue \
         at a step computed for another run: give the checkpoint's values, or pass \
         --resume-changed to resume anyway",
        path.display()
    ))
}

/// The model `--model NAME|FILE` made concrete for samples of `shape` and `classes`
/// classes: a model file error names the file, line and layer.
pub fn build_graph(
    model: &str,
    shape: [usize; 3],
    classes: usize,
) -> Result<crate::model::Graph, String> {
    let spec = crate::model::load(model).map_err(|e| e.to_string())?;
    graph_of(&spec, shape, classes)
}

/// [`build_graph`] for a loaded (or built) model.
pub fn graph_of(
    spec: &crate::model::ModelSpec,
    shape: [usize; 3],
    classes: usize,
) -> Result<crate::model::Graph, String> {
    crate::model::Graph::build(spec, shape, classes).map_err(|e| {
        format!(
            "{e}\n(model '{}' on the dataset's {}x{}x{} images with {classes} classes)",
            spec.name, shape[0], shape[1], shape[2]
        )
    })
}

/// Loads the configured dataset (with optional size limits).
pub fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset), String> {
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let bundled = if Path::new("data/mnist/SHA256SUMS").is_file() {
        PathBuf::from("data/mnist")
    } else {
        bundled
    };
    let spec = DatasetSpec::parse(&cfg.dataset, cfg.data_dir.as_deref(), &bundled)
        .map_err(|e| e.to_string())?;
    let pair = data::load(&spec).map_err(|e| e.to_string())?;
    let (mut train, mut test) = (pair.train, pair.test);
    if let Some(n) = cfg.train_limit {
        truncate(&mut train, n);
    }
    if let Some(n) = cfg.test_limit {
        truncate(&mut test, n);
    }
    if train.len() < cfg.batch {
        return Err(format!(
            "the training set has {} samples, fewer than one global batch of {}",
            train.len(),
            cfg.batch
        ));
    }
    Ok((train, test))
}

/// The training set as the input pipeline reads it, and the test set in memory. An ImageFolder's
/// training split stays on disk (decoded per sample by the loaders); its test split, which
/// every evaluation reads whole, is decoded once here.
pub fn load_sources(cfg: &TrainConfig) -> Result<(Source, Dataset), String> {
    let spec = DatasetSpec::parse(
        &cfg.dataset,
        cfg.data_dir.as_deref(),
        Path::new("data/mnist"),
    )
    .map_err(|e| e.to_string())?;
    let DatasetSpec::ImageFolder { dir } = spec else {
        let (train, test) = load_data(cfg)?;
        return Ok((Source::Memory(Arc::new(train)), test));
    };
    let (mut train, mut test) = data::image_folder::open_pair(&dir).map_err(|e| e.to_string())?;
    if let Some(n) = cfg.train_limit {
        train.truncate(n);
    }
    if let Some(n) = cfg.test_limit {
        test.truncate(n);
    }
    if train.len() < cfg.batch {
        return Err(format!(
            "the training set has {} samples, fewer than one global batch of {}",
            train.len(),
            cfg.batch
        ));
    }
    let test = test.decode_all("imagefolder").map_err(|e| {
        format!(
            "{e} (the test split is decoded whole before training; --skip-bad-samples only \
             leaves out training samples)"
        )
    })?;
    Ok((Source::Folder(Arc::new(train)), test))
}

/// The input pipeline of a run: loader threads (unless `--prefetch 0`) and one feed per worker.
pub fn start_pipeline(
    cfg: &TrainConfig,
    source: Source,
    first_epoch: usize,
    stats: Arc<LoadStats>,
) -> Result<(Option<Pipeline>, Vec<BatchFeed>), String> {
    let collator = Collator {
        norm: source.normalize(),
        source,
        augment: cfg.augment,
        seed: cfg.seed,
        skip_bad: cfg.skip_bad_samples,
        stats,
        fault: cfg.fault,
    };
    // Over several processes, this process's workers are global workers first..first+workers.
    let sampler = DistributedSampler::for_ranks(
        collator.source.len(),
        cfg.batch,
        cfg.seed,
        cfg.world(),
        cfg.process_rank * cfg.workers,
        cfg.workers,
    );
    if cfg.prefetch == 0 {
        let feeds = (0..cfg.workers)
            .map(|r| BatchFeed::synchronous(r, collator.clone(), sampler.clone()))
            .collect();
        return Ok((None, feeds));
    }
    let (p, feeds) = Pipeline::start(
        collator,
        sampler,
        first_epoch..cfg.epochs,
        cfg.loader_threads,
        cfg.prefetch,
    )?;
    Ok((Some(p), feeds))
}

fn truncate(ds: &mut Dataset, n: usize) {
    let n = n.min(ds.len());
    ds.pixels.truncate(n * ds.sample_len());
    ds.labels.truncate(n);
}

/// Prints above the progress bar, or plainly when there is no terminal to draw it on.
fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

/// Trains as configured; prints progress unless `cfg.quiet`. With `--transport mpi` this
/// process is one rank of the run (MPI is started and ended here).
pub fn train(cfg: TrainConfig) -> Result<Summary, String> {
    let group = ProcessGroup::start(cfg.transport, cfg.comm_timeout)?;
    let result = train_in(cfg, &group);
    group.end(result.is_ok());
    result
}

/// Trains as this process's part of `group`'s run. Only rank 0 prints, writes metrics,
/// checkpoints and the summary; every rank can resume from rank 0's checkpoint.
pub fn train_in(mut cfg: TrainConfig, group: &ProcessGroup) -> Result<Summary, String> {
    let wall = Instant::now();
    cfg.processes = group.size();
    cfg.process_rank = group.rank();
    let lead = cfg.process_rank == 0;
    if !lead {
        cfg.quiet = true;
    }
    crate::plan::per_worker_batch(cfg.batch, cfg.workers, cfg.processes)
        .map_err(|e| e.to_string())?;
    let (train_source, test_set) = load_sources(&cfg)?;
    let graph = Arc::new(match &cfg.model_spec {
        Some(spec) => graph_of(spec, train_source.shape(), train_source.num_classes())?,
        None => build_graph(&cfg.model, train_source.shape(), train_source.num_classes())?,
    });
    let resume = match &cfg.resume {
        Some(p) => {
            let ck = checkpoint::Checkpoint::load(p)?;
            if let Some(note) = check_resume(&cfg, &graph.name, &ck.state, p)? {
                warn(&cfg, &note);
            }
            Some(Arc::new(ck))
        }
        None => None,
    };
    let start_epoch = resume.as_ref().map_or(0, |c| c.state.epoch);
    if start_epoch >= cfg.epochs {
        return Err(format!(
            "the checkpoint has already completed {start_epoch} epochs; ask for more with --epochs"
        ));
    }
    // Every output is checked (and the run directory prepared) before the first step, so a
    // path that cannot be written costs no training.
    let steps_per_epoch = train_source.len() / cfg.batch;
    if let Some(w) = rundir::check_trace_steps(&cfg, start_epoch, steps_per_epoch)? {
        warn(&cfg, &w);
    }
    // The run directory first: a trace file may go into it.
    let prepared = if lead {
        Some(rundir::prepare(&mut cfg)?)
    } else {
        None
    };
    // Only now: `prepare` may have moved the run to a numbered directory.
    let metrics_path = cfg.run_dir.join("metrics.jsonl");
    let trace_path = rundir::check_trace(&cfg)?;
    if let Some(prepared) = prepared {
        for w in &cfg.warnings {
            warn(&cfg, w);
        }
        for note in prepared.clear(&cfg.run_dir)? {
            if !cfg.quiet {
                eprintln!("note: {note}");
            }
        }
    }
    if group.size() > 1 {
        let lines =
            processes::run_description(&cfg, &graph, &train_source, test_set.len(), start_epoch)?;
        group.handshake(&lines)?;
    }
    let cfg = Arc::new(cfg);
    let train_len = train_source.len();
    let load_stats = Arc::new(LoadStats::default());
    // Lives until every worker has been joined; dropping it joins the loader threads.
    let (pipeline, feeds) = start_pipeline(&cfg, train_source, start_epoch, load_stats.clone())?;
    let test_set = Arc::new(test_set);
    // Over several processes every worker thread gets a transport over the whole run (global
    // ranks, process-major), so every mode, flat or hierarchical, runs across them unchanged.
    let transports = if cfg.processes > 1 {
        group
            .transports(cfg.workers)?
            .ok_or("MPI is not running in this process")?
            .into_iter()
            .map(Some)
            .collect()
    } else if cfg.workers > 1 {
        InProcessFabric::new(cfg.workers, cfg.link, cfg.comm_timeout)
            .into_iter()
            .map(|t| Some(Box::new(t) as Box<dyn crate::comm::Transport>))
            .collect()
    } else {
        vec![None]
    };
    // One clock for the whole timeline: microseconds since the run started.
    let trace_sink = cfg
        .trace
        .as_ref()
        .map(|_| crate::trace::TraceSink::new(wall, cfg.trace_steps.clone()));
    // Bounded (a fixed ring): a worker's step sends its times without allocating; the run's
    // thread drains it far faster than steps fill it.
    let (tx, rx) = crossbeam_channel::bounded(4096);
    let mut handles = Vec::new();
    // Workers are numbered across the run: this process's are first_rank.. (rank 0 leads).
    let first_rank = cfg.process_rank * cfg.workers;
    for ((local, transport), feed) in transports.into_iter().enumerate().zip(feeds) {
        let rank = first_rank + local;
        let setup = WorkerSetup {
            rank,
            cfg: cfg.clone(),
            graph: graph.clone(),
            feed,
            test: test_set.clone(),
            transport: transport.map(|t| t as Box<dyn crate::comm::Transport>),
            events: tx.clone(),
            resume: resume.clone(),
            tracer: trace_sink
                .as_ref()
                .map_or_else(crate::trace::Tracer::off, |sink| {
                    let mut tracks =
                        vec![(crate::trace::worker_tid(rank), format!("worker {rank}"))];
                    if cfg.world() > 1 {
                        tracks.push((crate::trace::comm_tid(rank), format!("comm {rank}")));
                    }
                    sink.tracer(&tracks)
                }),
        };
        let threads = cfg.threads;
        let emulated_device = cfg.device.is_some();
        let handle = std::thread::Builder::new()
            .name(format!("worker-{rank}"))
            .spawn(move || -> Result<(), String> {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("worker-{rank}-compute-{i}"))
                    .build()
                    .map_err(|e| e.to_string())?;
                pool.install(|| {
                    let worker = Worker::new(setup)?;
                    // After Worker::new has started the communication thread, which must
                    // keep the default priority (threads inherit their creator's).
                    if emulated_device {
                        rayon::broadcast(|_| crate::testbed::device::lower_compute_priority());
                    } else {
                        rayon::broadcast(|_| crate::parallel::yield_cpu_to_communication());
                    }
                    worker.run()
                })
            })
            .map_err(|e| format!("cannot start worker thread: {e}"))?;
        handles.push(handle);
    }
    drop(tx);

    let spe = steps_per_epoch;
    debug_assert_eq!(spe, train_len / cfg.batch);
    let total_steps = (cfg.epochs - start_epoch) * spe;
    let json_log = cfg.log_format == crate::config::LogFormat::Json;
    let bar = if cfg.quiet || json_log {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total_steps as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut summary = Summary {
        config: cfg.to_json(),
        epochs: Vec::new(),
        final_test_accuracy: 0.0,
        images_per_s: 0.0,
        breakdown: Breakdown::default(),
        buckets: String::new(),
        bucket_ops: Vec::new(),
        checkpoint: None,
        wall_seconds: 0.0,
        skipped_nonfinite_updates: 0,
        replica_hashes: vec![0; cfg.workers],
        peak_rss_mb: 0.0,
        skipped_samples: 0,
        skipped_examples: Vec::new(),
        ranks: Vec::new(),
        slow_ranks: Vec::new(),
        steps: 0,
        run_dir: cfg.run_dir.clone(),
    };
    let mut epoch_breakdown = Breakdown::default();
    let mut train_seconds = 0.0;
    let mut io_error = None;
    let mut first_failure: Option<(String, bool)> = None;
    let mut window: (usize, f64) = (0, 0.0);
    for event in rx.iter() {
        match event {
            Event::Plan { description, ops } => {
                tracing::info!(buckets = %description, ops = %ops.join(", "), "bucket plan");
                if !cfg.quiet && !json_log {
                    say(
                        &bar,
                        format!(
                            "{} on {}: {} workers x {} threads, comm {}, overlap {}\n  {}; per bucket: {}",
                            cfg.model,
                            cfg.dataset,
                            cfg.world(),
                            cfg.threads,
                            cfg.comm,
                            if cfg.overlap { "on" } else { "off" },
                            description,
                            ops.join(", ")
                        ),
                    );
                }
                summary.buckets = description;
                summary.bucket_ops = ops;
            }
            Event::Step {
                rank,
                epoch,
                step,
                loss,
                times,
            } => {
                if step >= metrics::WARMUP_STEPS || epoch > start_epoch {
                    summary.breakdown.add(&times);
                    epoch_breakdown.add(&times);
                }
                if rank == 0 {
                    bar.inc(1);
                    window = (window.0 + 1, window.1 + times.step_ms);
                    if window.0 == 20 {
                        let m = &epoch_breakdown.mean;
                        let pct = |v: f64| 100.0 * v / m.step_ms.max(1e-9);
                        bar.set_message(format!(
                            "loss {loss:.3}  {:.0} img/s  data wait {:.1}%  exposed comm {:.1}%",
                            cfg.batch as f64 * 1e3 * 20.0 / window.1,
                            pct(m.data_ms),
                            pct(m.exposed_comm_ms)
                        ));
                        window = (0, 0.0);
                    }
                    if cfg.log_every > 0 && step % cfg.log_every == 0 {
                        let line = serde_json::json!({"kind": "step", "epoch": epoch + 1, "step": step, "loss": loss, "times": times});
                        if let Err(e) = append_jsonl(&metrics_path, &line) {
                            io_error.get_or_insert(e.to_string());
                        }
                    }
                }
            }
            Event::Failed { rank, error } => {
                tracing::debug!(rank, error = %error, "worker failed");
                // Peers of a failed worker fail too ("peer ... is gone", "the input pipeline
                // stopped"); those echoes only stand in for the cause if nothing else came.
                let echo =
                    error.contains("is gone") || error.contains("the input pipeline stopped");
                match &first_failure {
                    None => first_failure = Some((error, echo)),
                    Some((_, true)) if !echo => first_failure = Some((error, echo)),
                    _ => {}
                }
            }
            Event::Done {
                rank,
                weights_hash,
                skipped_updates,
            } => {
                summary.skipped_nonfinite_updates =
                    summary.skipped_nonfinite_updates.max(skipped_updates);
                summary.replica_hashes[rank - first_rank] = weights_hash
            }
            Event::Epoch {
                epoch,
                train_loss,
                test_loss,
                test_accuracy,
                train_seconds: secs,
                checkpoint,
            } => {
                train_seconds += secs;
                let record = EpochRecord {
                    epoch: epoch + 1,
                    train_loss,
                    test_loss,
                    test_accuracy,
                    images_per_s: (spe * cfg.batch) as f64 / secs.max(1e-9),
                    seconds: secs,
                    breakdown: std::mem::take(&mut epoch_breakdown),
                    peak_rss_mb: peak_rss_mb(),
                };
                if json_log {
                    let mut line = serde_json::to_value(&record).unwrap_or_default();
                    line["kind"] = "epoch".into();
                    line["epochs"] = cfg.epochs.into();
                    println!("{line}");
                } else if !cfg.quiet {
                    say(&bar, format!(
                        "epoch {}/{}: train loss {:.4}, test loss {:.4}, test accuracy {:.2}%, {:.0} images/s\n  {}",
                        epoch + 1,
                        cfg.epochs,
                        train_loss,
                        test_loss,
                        100.0 * test_accuracy,
                        record.images_per_s,
                        record.breakdown.describe()
                    ));
                }
                let mut line = serde_json::to_value(&record).unwrap_or_default();
                line["kind"] = "epoch".into();
                if let Err(e) = append_jsonl(&metrics_path, &line) {
                    io_error.get_or_insert(e.to_string());
                }
                summary.final_test_accuracy = test_accuracy;
                summary.epochs.push(record);
                if checkpoint.is_some() {
                    summary.checkpoint = checkpoint;
                }
            }
        }
    }
    bar.finish_and_clear();
    // The first error is the cause; later ones are usually peers noticing it.
    let mut errors = Vec::new();
    for (rank, h) in handles.into_iter().enumerate() {
        // A worker's panic is caught and reported as Event::Failed; a join error means the
        // panic escaped that (e.g. while starting).
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(format!("worker {rank} panicked")),
        }
    }
    drop(pipeline);
    // Every worker has been joined, so every tracer has handed in its events. Written before
    // the error checks: a timeline of a failed run helps to see why it failed. A failure to
    // write it is reported after the summary and report are written, which it must not cost.
    // Each MPI rank traces its own workers: rank 0 writes PATH, rank r PATH.rank<r>.
    let mut trace_error = None;
    if let (Some(sink), Some(path)) = (&trace_sink, &trace_path) {
        match sink.write(path) {
            Ok(()) => tracing::info!(path = %path.display(), events = sink.len(), "trace written"),
            Err(e) => trace_error = Some(e),
        }
    }
    // The first failure reported is the cause; the rest are its echoes (peers whose
    // collectives or input pipeline stopped because of it).
    if let Some((cause, _)) = first_failure {
        return Err(cause);
    }
    if let Some(cause) = errors
        .iter()
        .find(|e| !e.contains("the input pipeline stopped"))
    {
        return Err(cause.clone());
    }
    if let Some(first) = errors.first() {
        return Err(first.clone());
    }
    if cfg.processes > 1 {
        // Every rank checks every replica, so a divergence stops all of them alike.
        summary.replica_hashes = group.gather_hashes(&summary.replica_hashes)?;
    }
    if summary
        .replica_hashes
        .iter()
        .any(|&h| h != summary.replica_hashes[0])
    {
        return Err(format!("replicas diverged: final weight hashes differ across workers {:x?}; this is a bug, please report it", summary.replica_hashes));
    }
    if cfg.processes > 1 {
        // In a multi-process run this process's breakdown covers its own workers only.
        (summary.ranks, summary.slow_ranks) = group.rank_report(&summary.breakdown)?;
        if !cfg.quiet && !json_log {
            println!(
                "{}",
                processes::describe_ranks(&summary.ranks, &summary.slow_ranks)
            );
        }
    }
    summary.images_per_s = (total_steps * cfg.batch) as f64 / train_seconds.max(1e-9);
    summary.wall_seconds = wall.elapsed().as_secs_f64();
    summary.peak_rss_mb = peak_rss_mb();
    summary.skipped_samples = load_stats.skipped();
    summary.skipped_examples = load_stats.examples();
    summary.steps = total_steps;
    if lead {
        let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        crate::output::write_atomically(&cfg.run_dir.join("summary.json"), json.as_bytes())?;
        // The report is a view of the files just written; failing to draw it loses no result.
        if let Err(e) = crate::report::write_run_report(&cfg.run_dir) {
            tracing::warn!("cannot write the run report: {e}");
        }
    }
    if let Some(e) = io_error {
        return Err(format!(
            "{e} (summary.json and report.md were written; the per-epoch lines are missing)"
        ));
    }
    if let Some(e) = trace_error {
        return Err(format!(
            "{e} (training finished; summary.json and report.md are in {})",
            cfg.run_dir.display()
        ));
    }
    Ok(summary)
}
