//! A training run, in four stages ([`train_in`]): prepare (load data and model, check the
//! checkpoint to resume and every output, the processes' handshake), spawn (the input
//! pipeline, the transports, one thread per worker: one model replica each), follow (the
//! workers' events into the summary and the progress display, [`progress`]) and finish (join,
//! the failure's cause, the timeline, the replica check, the summary).
//!
//! The step itself is in [`worker`]; the solver in [`crate::optim`]; the synchronisation in
//! [`crate::parallel`]; how a run fails in [`error`].

pub mod checkpoint;
pub mod commit;
pub mod description;
pub mod error;
pub mod event;
pub mod follow;
pub mod heartbeat;
pub mod inputs;
pub mod lock;
pub mod memory;
pub mod metrics;
mod priority;
pub mod processes;
pub mod progress;
pub mod recipe;
pub mod recorded;
pub mod run_files;
pub mod rundir;
pub mod summary;
pub mod weights;
pub mod worker;

use crate::comm::InProcessFabric;
use crate::config::TrainConfig;
use crate::data::{self, Dataset, DatasetSpec};
use crate::pipeline::{
    BatchFeed, Collator, DistributedSampler, LoadStats, Pipeline, Source, TestSplit,
};
pub use error::{LateWrite, Phase, PrepareError, ResumeError, StepError, TrainError, WorkerError};
use metrics::peak_rss_mb;
pub use processes::ProcessGroup;
use progress::{ProgressDisplay, RunProgress};
use recorded::Record;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use worker::WorkerSetup;

pub use event::Event;
pub use summary::{ResumedFrom, Summary};

/// Checks that the checkpoint's model takes this run's input shape (refused otherwise, even
/// with `--resume-changed`), and that its run trained on the same data in the same order as
/// this one would (dataset, global batch, seed, training limit): otherwise the resumed run would continue
/// at a global step computed for another run. Refused naming each field and both values, unless
/// `--resume-changed`; returns the warning to show when it was accepted that way, when the
/// checkpoint is too old to tell, or when another `--epochs` stretches a cosine schedule.
pub fn check_resume(
    cfg: &TrainConfig,
    (model, input): (&str, [usize; 3]),
    ck: &checkpoint::Checkpoint,
    path: &Path,
) -> Result<Option<String>, ResumeError> {
    let state = &ck.state;
    // The model and its input first: its tensors could not be loaded into another one anyway.
    if state.model != model {
        return Err(ResumeError::OtherModel {
            checkpoint: state.model.clone(),
            now: model.to_string(),
            model_flag: ck.model_flag(path),
        });
    }
    let mut now = checkpoint::RunIdentity::of(cfg);
    if cfg.processes > 1 {
        // Each process would resolve the data's path on its own file system, and the ranks
        // must agree: over several processes the data is compared as it is named.
        now.data_path = None;
    }
    let changes = state.run.as_ref().map(|then| then.changes(&now));
    if let Some(then) = ck.description.as_ref().map(|d| d.input) {
        if then != input {
            // Other data explains the shape (a resume that left --dataset out reads MNIST):
            // said with every setting that differs, the checkpoint's values named. With the
            // same data, the shape is the image size's, which OtherInput's remedy names.
            let other_data = state.run.as_ref().is_some_and(|then| !then.same_data(&now));
            if let Some(changes) = changes.filter(|_| other_data && !cfg.resume_changed) {
                return Err(ResumeError::OtherRun {
                    path: path.to_path_buf(),
                    changes,
                    inside_epoch: state.step_in_epoch > 0,
                    inputs: Some((then, input)),
                });
            }
            return Err(ResumeError::OtherInput {
                path: path.to_path_buf(),
                checkpoint: then,
                now: input,
                resizable: inputs::resizable(cfg),
            });
        }
    }
    let Some(changes) = changes else {
        return Ok(Some(format!(
            "checkpoint {} does not record its run's dataset, batch and seed (written by an \
             older dptrain): resuming without checking them",
            path.display()
        )));
    };
    let stretched = recipe::schedule_stretched(cfg, state.run.as_ref().and_then(|r| r.epochs));
    if changes.is_empty() {
        return Ok(stretched);
    }
    if cfg.resume_changed && state.step_in_epoch > 0 {
        return Err(ResumeError::ChangedMidEpoch {
            path: path.to_path_buf(),
            epoch: state.epoch,
            changes,
        });
    }
    if cfg.resume_changed {
        let accepted = format!(
            "--resume-changed: resuming {} under other settings ({}); the data order and \
             step count follow the new settings (the normalisation stays the checkpoint's \
             unless --normalize gives values or estimate)",
            path.display(),
            error::describe_changes(&changes)
        );
        return Ok(Some(match stretched {
            Some(s) => format!("{accepted}; {s}"),
            None => accepted,
        }));
    }
    Err(ResumeError::OtherRun {
        path: path.to_path_buf(),
        changes,
        inside_epoch: state.step_in_epoch > 0,
        inputs: None,
    })
}

/// The model `--model NAME|FILE` made concrete for samples of `shape` and `classes`
/// classes: a model file error names the file, line and layer.
pub fn build_graph(
    model: &str,
    shape: [usize; 3],
    classes: usize,
) -> Result<crate::model::Graph, PrepareError> {
    let spec = crate::model::load(model)?;
    graph_of(&spec, shape, classes)
}

/// [`build_graph`] for a loaded (or built) model.
pub fn graph_of(
    spec: &crate::model::ModelSpec,
    shape: [usize; 3],
    classes: usize,
) -> Result<crate::model::Graph, PrepareError> {
    crate::model::Graph::build(spec, shape, classes).map_err(|source| PrepareError::ModelShape {
        source: Box::new(source),
        model: spec.name.clone(),
        shape,
        classes,
    })
}

/// Loads the configured dataset (with optional size limits).
pub fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset), PrepareError> {
    let bundled = crate::data::bundled_mnist_dir();
    let spec = DatasetSpec::parse(&cfg.dataset, cfg.data_dir.as_deref(), &bundled)?
        .generating_at_most(cfg.train_limit, cfg.test_limit);
    let pair = data::load(&spec)?;
    let (mut train, mut test) = (pair.train, pair.test);
    if let Some(n) = cfg.train_limit {
        truncate(&mut train, n);
    }
    if let Some(n) = cfg.test_limit {
        truncate(&mut test, n);
    }
    fits_the_run(train.len(), cfg)?;
    Ok((train, test))
}

/// Refuses `--epochs` whose steps in all (`epochs` of `steps_per_epoch`) no step counter
/// holds: the learning-rate schedule and the data order count them from 0 to that product.
fn steps_are_countable(epochs: usize, steps_per_epoch: usize) -> Result<(), PrepareError> {
    match epochs.checked_mul(steps_per_epoch) {
        Some(_) => Ok(()),
        None => Err(PrepareError::TooManySteps {
            epochs,
            steps_per_epoch,
        }),
    }
}

/// Refuses a training set of `samples` that the run cannot train on: smaller than one global
/// batch, or of more steps in all than a counter holds ([`steps_are_countable`]). Every
/// kind of data goes through here.
fn fits_the_run(samples: usize, cfg: &TrainConfig) -> Result<(), PrepareError> {
    let batch = cfg.batch;
    if samples < batch {
        return Err(PrepareError::TooFewSamples { samples, batch });
    }
    steps_are_countable(cfg.epochs, samples / batch)
}

/// The training set as the input pipeline reads it, and the test set in memory. An ImageFolder's
/// training split stays on disk (decoded per sample by the loaders); its test split, which
/// every evaluation reads whole, is decoded once here.
pub fn load_sources(cfg: &TrainConfig) -> Result<(Source, TestSplit), PrepareError> {
    let spec = DatasetSpec::parse(
        &cfg.dataset,
        cfg.data_dir.as_deref(),
        &crate::data::bundled_mnist_dir(),
    )?;
    if let DatasetSpec::Packed { file } = &spec {
        return load_packed(cfg, file);
    }
    let DatasetSpec::ImageFolder { dir } = spec else {
        let (train, test) = load_data(cfg)?;
        inputs::check_memory_size(cfg, &train)?;
        return Ok((Source::Memory(Arc::new(train)), TestSplit::Loaded(test)));
    };
    let (mut train, mut test) = data::image_folder::open_pair(&dir)?;
    if let Some(n) = cfg.train_limit {
        train.truncate(n);
    }
    if let Some(n) = cfg.test_limit {
        test.truncate(n);
    }
    fits_the_run(train.len(), cfg)?;
    inputs::size_folders(cfg, &mut train, &mut test)?;
    let source = Source::Folder(Arc::new(train));
    let eval = inputs::eval_transform(cfg, &source);
    Ok((source, TestSplit::Folder { split: test, eval }))
}

/// [`load_sources`] for a packed file: the training split read per sample from the mapping by
/// the loaders, the test split decoded once, by the caller.
fn load_packed(cfg: &TrainConfig, file: &Path) -> Result<(Source, TestSplit), PrepareError> {
    let (mut train, mut test) = data::packed::open_pair(file)?;
    if let Some(n) = cfg.train_limit {
        train.truncate(n);
    }
    if let Some(n) = cfg.test_limit {
        test.truncate(n);
    }
    fits_the_run(train.len(), cfg)?;
    if let Some(s) = cfg.image_size {
        train.set_size(s.height, s.width);
    }
    test.set_size(train.height, train.width);
    let source = Source::Packed(Arc::new(train));
    let eval = inputs::eval_transform(cfg, &source);
    Ok((source, TestSplit::Packed { split: test, eval }))
}

/// The input pipeline of a run: loader threads (unless `--prefetch 0`) and one feed per worker,
/// from the batch of `first_step` (epoch x steps per epoch + step in it).
pub fn start_pipeline(
    cfg: &TrainConfig,
    source: Source,
    first_step: usize,
    stats: Arc<LoadStats>,
) -> Result<(Option<Pipeline>, Vec<BatchFeed>), String> {
    let norm = match &cfg.normalize {
        crate::pipeline::NormalizeChoice::Given(n)
        | crate::pipeline::NormalizeChoice::Resumed(n) => n.to_normalize(),
        _ => source.normalize(),
    };
    let collator = Collator {
        norm,
        augment: inputs::training_transforms(cfg, &source),
        source,
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
    let steps = first_step..sampler.global_steps(0..cfg.epochs).end;
    let (p, feeds) = Pipeline::start(collator, sampler, steps, cfg.loader_threads, cfg.prefetch)?;
    Ok((Some(p), feeds))
}

fn truncate(ds: &mut Dataset, n: usize) {
    let n = n.min(ds.len());
    ds.pixels.truncate(n * ds.sample_len());
    ds.labels.truncate(n);
    // The samples cut off would otherwise stay resident for the whole run.
    ds.pixels.shrink_to_fit();
    ds.labels.shrink_to_fit();
}

/// Trains as configured; prints progress unless `cfg.quiet`, and the run's warnings as
/// `warning:` lines on stderr ([`crate::terminal::print_warning`]). With `--transport mpi` this
/// process is one rank of the run (MPI is started and ended here). The report (`report.md`) is
/// the caller's to draw from the run directory.
pub fn train(cfg: TrainConfig) -> Result<Summary, TrainError> {
    let group =
        ProcessGroup::start(cfg.transport, cfg.comm_timeout).map_err(PrepareError::Processes)?;
    let result = train_in(cfg, &group, &crate::terminal::print_warning);
    group.end(result.is_ok());
    result
}

/// Trains as this process's part of `group`'s run. Only rank 0 prints, writes metrics,
/// checkpoints and the summary, and passes warnings to `warn` as they come (a resumed
/// checkpoint's, the configuration's, the workers'); every rank can resume from rank 0's
/// checkpoint. A write that fails after `summary.json` was written returns
/// [`TrainError::LateWrite`], which holds the summary.
pub fn train_in(
    mut cfg: TrainConfig,
    group: &ProcessGroup,
    warn: &dyn Fn(&str),
) -> Result<Summary, TrainError> {
    let wall = Instant::now();
    cfg.processes = group.size();
    cfg.process_rank = group.rank();
    let lead = cfg.process_rank == 0;
    if !lead {
        cfg.quiet = true;
    }
    crate::plan::per_worker_batch(cfg.batch, cfg.workers, cfg.processes)
        .map_err(|e| TrainError::from(PrepareError::Config(e.to_string())))?;
    if cfg.intra_link.is_some() && cfg.processes == 1 && cfg.intra_link_followed {
        // The checkpoint's run's port, which this process has none of: left (its record keeps
        // it, as a resume in one process does).
        cfg.intra_link = None;
        cfg.warnings.push(
            "not resuming with the checkpoint's run's --intra-bandwidth: this run has one \
             process, which has no port between processes to emulate"
                .into(),
        );
    }
    if cfg.intra_link.is_some() && cfg.processes == 1 {
        // One process has no hierarchy: its workers would plan and run as flat threads, and
        // the port would be recorded but not emulated.
        return Err(PrepareError::Config(
            "--intra-bandwidth emulates the port within a process of a run of several \
             processes, and this run has one (mpirun -np 1, or a launch down to one host): \
             leave it out, or emulate every worker's port with --link-bandwidth and \
             --transport inproc"
                .into(),
        )
        .into());
    }
    // Every rank meets the same warnings; rank 0 alone shows them.
    let warn_on_lead = |message: &str| {
        if lead {
            warn(message);
        }
    };
    let (mut run, train_source) = prepare(cfg, group, &warn_on_lead)?;
    // A signal that ends the run says how to continue it (where the binary watches signals);
    // under `dptrain launch`, launch continues it.
    let farewell = (lead && run.cfg.launched_by.is_none()).then(|| {
        let continuation = rundir::Continuation {
            run_dir: run.cfg.run_dir.clone(),
            resumed: run.cfg.resume.clone(),
            run_dir_given: run.cfg.run_dir_given,
            writes_checkpoints: !run.cfg.no_checkpoints,
            processes: run.cfg.processes,
            abandoned: run.abandoned.clone(),
        };
        crate::interrupt::say_on_signal(move || Some(continuation.line()))
    });
    let mut progress = RunProgress::new(&run.cfg, run.first_step(), run.steps_per_epoch);
    if run.holds_the_resumed_run {
        progress.supersede_from((run.start_epoch, run.start_step_in_epoch));
    }
    let workers = spawn_workers(&run, train_source, group, wall, &progress.stop)
        .map_err(TrainError::Start)?;
    // The workers restore from these and let go of them: nothing holds a resumed run's whole
    // checkpoint (its weights and momentum) or the start weights through the training.
    (run.resume, run.weights) = (None, None);
    let mut display = ProgressDisplay::new(&run.cfg, run.total_steps());
    progress.follow(&run.cfg, &workers.events, &mut display, &warn_on_lead);
    // Training is over: a signal from here on has nothing left to resume.
    drop(farewell);
    display.finish();
    finish(&run, workers, progress, &display, group, wall)
}

/// Everything a run has checked and loaded before its first step.
struct PreparedRun {
    /// The configuration, final (the run directory may have moved to a numbered one).
    cfg: Arc<TrainConfig>,
    graph: Arc<crate::model::Graph>,
    test_set: Arc<Dataset>,
    /// The checkpoint of `--resume`, until the workers have it (then `None`: see `train_in`).
    resume: Option<Arc<checkpoint::Checkpoint>>,
    /// The weights of `--weights`, checked against the model, until the workers have them.
    weights: Option<Arc<weights::StartWeights>>,
    /// What the run's checkpoints record about the model (the normalisation filled in by
    /// the worker).
    description: Arc<description::ModelDescription>,
    start_epoch: usize,
    /// Steps of `start_epoch` done before this run (a commit's).
    start_step_in_epoch: usize,
    steps_per_epoch: usize,
    /// Where the `--trace` timeline goes, if one was asked for.
    trace_path: Option<PathBuf>,
    /// The run directory's lock (rank 0, which alone writes the run directory), held until
    /// the summary that carries it is dropped: after the caller has drawn the report.
    run_dir_lock: Option<Arc<lock::RunDirLock>>,
    /// Whether the run directory holds the resumed run's files (its own directory, or a copy
    /// of it): then its `metrics.jsonl` is that run's, whose lines past the resumed step this
    /// run writes again.
    holds_the_resumed_run: bool,
    /// The restart points past the resumed step ([`rundir::AbandonedRestartPoints`]).
    abandoned: Option<Arc<rundir::AbandonedRestartPoints>>,
}

impl PreparedRun {
    /// Steps of this run (after the resumed ones).
    fn total_steps(&self) -> usize {
        (self.cfg.epochs - self.start_epoch) * self.steps_per_epoch - self.start_step_in_epoch
    }

    /// The global step of the run's first batch in the data order.
    fn first_step(&self) -> usize {
        self.start_epoch * self.steps_per_epoch + self.start_step_in_epoch
    }
}

/// Loads the data and the model, checks a checkpoint to resume from and every output, prepares
/// the run directory and, over several processes, checks that all describe the same run. Every
/// output is checked before the first step, so a path that cannot be written costs no
/// training. Returns the run and its training set (for the input pipeline).
fn prepare(
    mut cfg: TrainConfig,
    group: &ProcessGroup,
    warn: &dyn Fn(&str),
) -> Result<(PreparedRun, Source), PrepareError> {
    let resume = open_resume(&cfg)?;
    // Said once the run is known to go ahead (after `prepare_outputs`), not before a refusal.
    let (resume_notes, resume_warnings) = follow_resumed_run(&mut cfg, resume.as_deref())?;
    let (train_source, test_split) = load_sources(&cfg).map_err(|e| followed_data(e, &cfg))?;
    if let Some(ck) = resume.as_deref() {
        check_resume_classes(&cfg, ck, &train_source)?;
    }
    inputs::check_normalization_channels(&cfg, &train_source)?;
    let graph = Arc::new(match &cfg.model_spec {
        Some(spec) => graph_of(spec, train_source.shape(), train_source.num_classes())?,
        None => build_graph(&cfg.model, train_source.shape(), train_source.num_classes())?,
    });
    // Before anything large is allocated (the test split decoded, images read for the
    // normalisation's estimate) and before the run directory exists.
    memory::check_device(&cfg, &graph)?;
    memory::check_run_memory(
        &cfg,
        &graph,
        memory::loaded_bytes(&train_source, &test_split),
    )?;
    let (input_line, input_warnings) = inputs::resolve(&mut cfg, &train_source)?;
    let shows_notes = cfg.process_rank == 0 && !cfg.quiet;
    let say_notes = |notes: &[String]| {
        if shows_notes {
            notes.iter().for_each(|n| eprintln!("note: {n}"));
        }
    };
    let test_set = test_split.decode().map_err(PrepareError::TestSplit)?;
    let input = graph.input();
    let mut fit_note = None;
    if let Some(ck) = resume.as_deref() {
        let model = (graph.name.as_str(), [input.c, input.h, input.w]);
        fit_note = check_resume_fits(&cfg, model, ck)?;
        continue_computing_as(&mut cfg, ck);
    }
    let description = Arc::new(description::describe_run(&cfg, &graph, &train_source));
    let weights = load_weights(&cfg, &graph, &description.class_names, warn)?;
    let start_epoch = resume.as_ref().map_or(0, |c| c.state.epoch);
    let start_step_in_epoch = resume.as_ref().map_or(0, |c| c.state.step_in_epoch);
    let steps_per_epoch = train_source.len() / cfg.batch;
    if start_step_in_epoch > 0 && start_step_in_epoch >= steps_per_epoch {
        return Err(PrepareError::Resume(ResumeError::PastEpochEnd {
            path: cfg.resume.clone().unwrap_or_default(),
            step_in_epoch: start_step_in_epoch,
            steps_per_epoch,
        }));
    }
    let first_step = start_epoch * steps_per_epoch + start_step_in_epoch;
    let outputs = prepare_outputs(&mut cfg, first_step, steps_per_epoch, warn)?;
    // Said once the run directory's checks are past, so that a run refused there is not
    // told first what it would have followed (a check of the processes can still refuse).
    say_notes(&[input_line]);
    input_warnings.iter().chain(&fit_note).for_each(|w| warn(w));
    say_notes(&resume_notes);
    resume_warnings.iter().for_each(|w| warn(w));
    let abandoned = abandoned_restart_points(&cfg, resume.as_deref(), warn);
    if group.size() > 1 {
        plan_for_the_measured_link(&mut cfg, group).map_err(PrepareError::Processes)?;
        let lines =
            processes::run_description(&cfg, &graph, &train_source, test_set.len(), start_epoch)
                .map_err(PrepareError::Processes)?;
        group.handshake(&lines).map_err(PrepareError::Processes)?;
    }
    let run = PreparedRun {
        cfg: Arc::new(cfg),
        graph,
        test_set: Arc::new(test_set),
        resume,
        weights,
        description,
        start_epoch,
        start_step_in_epoch,
        steps_per_epoch,
        trace_path: outputs.trace_path,
        run_dir_lock: outputs.run_dir_lock.map(Arc::new),
        holds_the_resumed_run: outputs.holds_the_resumed_run,
        abandoned,
    };
    Ok((run, train_source))
}

/// With `--comm auto` and no `--link-*`, an MPI run plans for the link it measures between its
/// processes, as the standard rate that measurement belongs to ([`crate::plan::planned_link`]),
/// instead of assuming 10 Gbit/s: on a slower link the assumption sends small buckets to
/// every rank at once (redundant mode), which costs the link N-1 copies of them. Collective,
/// and run whatever the options (a few milliseconds at 1 Gbit/s): a rank whose options differ
/// must still reach the handshake, which names the difference, rather than wait alone in a
/// probe the others skipped.
fn plan_for_the_measured_link(cfg: &mut TrainConfig, group: &ProcessGroup) -> Result<(), String> {
    let Some(measured) = group.slowest_path_bytes_per_s()? else {
        return Ok(());
    };
    if cfg.comm != crate::plan::CommChoice::Auto || cfg.link.is_some() {
        return Ok(());
    }
    let link = crate::plan::planned_link(measured);
    cfg.measured_link = Some(link);
    if cfg.process_rank == 0 && !cfg.quiet {
        eprintln!(
            "note: --comm auto plans for a {:.0} Mbit/s link (the slowest path between \
             processes measured {:.0} Mbit/s; --link-bandwidth sets another)",
            link.bandwidth_bytes_per_s * 8e-6,
            measured * 8e-6
        );
    }
    Ok(())
}

/// A resumed run computes its convolutions as the checkpoint's run did (its recorded
/// `--conv-algo`; direct in checkpoints from before it was recorded) unless `--conv-algo` is
/// given, so that resuming with the same command continues the run bit for bit whatever the
/// default is.
fn continue_computing_as(cfg: &mut TrainConfig, ck: &checkpoint::Checkpoint) {
    if !cfg.given.conv_algo {
        cfg.conv_algo = ck
            .description
            .as_ref()
            .map_or(crate::backend::ConvAlgo::Direct, |d| d.conv_algo);
    }
}

/// What a resumed run takes from its checkpoint's run ([`inputs::follow_checkpoint`],
/// [`recipe`]): the notes and warnings that say so. The schedule's warnings are judged only
/// then, on the epochs and schedule the run will follow.
fn follow_resumed_run(
    cfg: &mut TrainConfig,
    resume: Option<&checkpoint::Checkpoint>,
) -> Result<(Vec<String>, Vec<String>), PrepareError> {
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    if let (Some(ck), Some(path)) = (resume, cfg.resume.clone()) {
        if !cfg.options_from_checkpoint.is_empty() {
            notes.push(format!(
                "resuming the checkpoint's run's {} (give the option for another)",
                cfg.options_from_checkpoint.join(", ")
            ));
        }
        if cfg.skip_bad_samples_followed {
            notes.push(
                "resuming the checkpoint's run's --skip-bad-samples: it left unreadable training \
                 samples out of their batches, and so does this run (give \
                 --skip-bad-samples=false to stop at the first instead)"
                    .into(),
            );
        }
        if !cfg.exchange_kept.is_empty() && !cfg.no_checkpoints {
            notes.push(format!(
                "keeping the checkpoint's run's {} in this run's checkpoints for a resume over \
                 MPI to follow (in one process they mean nothing)",
                cfg.exchange_kept.join(", ")
            ));
        }
        notes.extend(inputs::follow_checkpoint(cfg, ck, &path)?);
        let run = ck.state.run.as_ref();
        notes.extend(recipe::follow_epochs(cfg, run.and_then(|r| r.epochs)));
        notes.extend(run.and_then(unrecorded));
        let takes_recipe = !cfg.given.whole_recipe();
        let recorded = run.map(|r| &r.recipe);
        let (recorded, warning) = readable(cfg, recorded, Record::Recipe, takes_recipe)?;
        warnings.extend(warning);
        let followed =
            recipe::follow_recipe(cfg, recorded).map_err(|source| ResumeError::Recipe {
                path: path.clone(),
                source,
            })?;
        notes.extend(followed.notes);
        warnings.extend(followed.warnings);
        let takes_routine = !cfg.given.whole_routine();
        let recorded = run.map(|r| &r.routine);
        let (recorded, warning) = readable(cfg, recorded, Record::Routine, takes_routine)?;
        warnings.extend(warning);
        let routine = recipe::follow_routine(cfg, recorded);
        notes.extend(routine.notes);
        warnings.extend(routine.warnings);
        // Whether the resume would have taken from it was judged before the options resolved.
        let takes_exchange = cfg.takes_unread_exchange;
        let recorded = run.map(|r| &r.exchange);
        warnings.extend(readable(cfg, recorded, Record::Exchange, takes_exchange)?.1);
        let recorded_compress = run.and_then(|r| r.exchange.read()?.compress.as_deref());
        warnings.extend(recipe::powersgd_dropped(
            cfg,
            ck.has_powersgd_state(),
            recorded_compress,
        ));
        notes.extend(run.and_then(|r| {
            let recorded = (r.world, r.exchange.read().map(|e| e.workers));
            recipe::workers_changed(cfg, recorded, ck.has_powersgd_state())
        }));
    }
    warnings.extend(crate::config::schedule_warnings(
        &cfg.lr_schedule,
        cfg.epochs,
    ));
    Ok((notes, warnings))
}

/// The checkpoint's `recorded` record (which one: `record`) where it reads back; where it
/// does not, [`unread_record`]'s judgement of it, given whether the resume would take from
/// it (`takes`): the refusal, or the warning (and nothing to follow).
fn readable<'a, T>(
    cfg: &TrainConfig,
    recorded: Option<&'a recorded::Recorded<T>>,
    record: Record,
    takes: bool,
) -> Result<(Option<&'a T>, Option<String>), ResumeError> {
    match recorded.and_then(|r| r.unreadable()) {
        Some(why) => Ok((
            None,
            Some(unread_record(cfg, record, why.to_string(), takes)?),
        )),
        None => Ok((recorded.and_then(recorded::Recorded::read), None)),
    }
}

/// The note of a resume whose checkpoint records none of some part of its run (an older
/// dptrain wrote it), naming each: the resumed run takes the flags' values for them.
fn unrecorded(run: &checkpoint::RunIdentity) -> Option<String> {
    let absent: Vec<&str> = [
        (run.recipe.is_absent(), Record::Recipe.name()),
        (run.routine.is_absent(), Record::Routine.name()),
        (
            run.routine.read().is_some_and(|r| r.outputs.is_none()),
            "checkpoint and log cadence and keep counts",
        ),
        (run.exchange.is_absent(), Record::Exchange.name()),
        (
            run.skip_bad_samples.is_none() && run.can_hold_bad_samples(),
            "--skip-bad-samples setting",
        ),
    ]
    .into_iter()
    .filter_map(|(absent, name)| absent.then_some(name))
    .collect();
    (!absent.is_empty()).then(|| {
        format!(
            "the checkpoint records no {} (an older dptrain wrote it): the resumed run takes \
             the flags' (give the run's where they were not the defaults)",
            absent.join("; no ")
        )
    })
}

/// A record of the checkpoint's run (`record`) that does not read back (`why`): refused,
/// naming the ways out, where the resume would take options from it (`takes`) and is not
/// under `--resume-changed`; else the warning that the options given and the defaults are
/// used.
fn unread_record(
    cfg: &TrainConfig,
    record: Record,
    why: String,
    takes: bool,
) -> Result<String, ResumeError> {
    match takes && !cfg.resume_changed {
        true => Err(ResumeError::UnreadableRecord {
            path: cfg.resume.clone().unwrap_or_default(),
            record,
            why,
        }),
        false => Ok(format!(
            "{why}: not following the run's {record} (the options given and the defaults are \
             used)"
        )),
    }
}

/// The checkpoint of `--resume`, read before the data (its input size and evaluation
/// transform are the defaults of a resumed ImageFolder's: [`inputs::follow_checkpoint`]).
fn open_resume(cfg: &TrainConfig) -> Result<Option<Arc<checkpoint::Checkpoint>>, ResumeError> {
    let Some(path) = &cfg.resume else {
        return Ok(None);
    };
    let ck = checkpoint::Checkpoint::load(path).map_err(ResumeError::Load)?;
    Ok(Some(Arc::new(ck)))
}

/// Checks the checkpoint of `--resume` against this run's model and data ([`check_resume`]),
/// with epochs left to train; returns its warning, if any.
fn check_resume_fits(
    cfg: &TrainConfig,
    model: (&str, [usize; 3]),
    ck: &checkpoint::Checkpoint,
) -> Result<Option<String>, ResumeError> {
    let path = cfg.resume.as_deref().unwrap_or(Path::new(""));
    let note = check_resume(cfg, model, ck, path)?;
    // Refused whatever the note says: a stretched schedule means nothing to a run that
    // trains no epoch.
    if ck.state.epoch >= cfg.epochs {
        return Err(ResumeError::AlreadyDone(ck.state.epoch));
    }
    Ok(note)
}

/// `e`, said as data whose place this resume took from its checkpoint's run where it is data
/// not found there (moved or deleted since); other errors as they are.
fn followed_data(e: PrepareError, cfg: &TrainConfig) -> PrepareError {
    use crate::data::DataError;
    use crate::input::InputError;
    let Some(taken) = &cfg.data_from_checkpoint else {
        return e;
    };
    match e {
        PrepareError::Data(
            source @ (DataError::NotFound { .. } | DataError::Input(InputError::NotFound { .. })),
        ) => PrepareError::FollowedData {
            taken: taken.clone(),
            source: Box::new(source),
        },
        other => other,
    }
}

/// Refuses a resume whose data names other classes, or another order, than the checkpoint's
/// run trained on, where both name their classes (an ImageFolder's directories, a pack's
/// list): a class directory renamed, added or removed since. A built-in dataset's classes are
/// its own (its export to a folder names them by number, and may resume it under
/// `--resume-changed`). Before anything is decoded.
fn check_resume_classes(
    cfg: &TrainConfig,
    ck: &checkpoint::Checkpoint,
    source: &Source,
) -> Result<(), ResumeError> {
    let named_then = ck.state.run.as_ref().is_some_and(|r| r.names_its_classes());
    let recorded = ck.description.as_ref().map(|d| &d.class_names);
    let (Some(then), true, Source::Folder(_) | Source::Packed(_)) = (recorded, named_then, source)
    else {
        return Ok(());
    };
    let now = description::class_names(source);
    if description::same_classes(then, &now) {
        return Ok(());
    }
    Err(ResumeError::OtherClasses {
        path: cfg.resume.clone().unwrap_or_default(),
        checkpoint: then.clone(),
        now,
    })
}

/// The weights of `--weights`, checked against this run's model (a net of batch 1 made for
/// the check); what was re-initialised goes to `warn`.
fn load_weights(
    cfg: &TrainConfig,
    graph: &Arc<crate::model::Graph>,
    classes: &[String],
    warn: &dyn Fn(&str),
) -> Result<Option<Arc<weights::StartWeights>>, PrepareError> {
    let Some(path) = &cfg.weights else {
        return Ok(None);
    };
    let net_cfg = crate::nn::NetConfig {
        max_batch: 1,
        seed: cfg.seed,
    };
    let net = crate::nn::Net::new(graph.clone(), net_cfg)
        .map_err(|e| PrepareError::Config(e.to_string()))?;
    let start = weights::StartWeights::plan(path, &net, &cfg.reinit, classes)?;
    for note in &start.notes {
        warn(note);
    }
    Ok(Some(Arc::new(start)))
}

/// Checks every output and (on rank 0) prepares the run directory, which may move `cfg` to a
/// numbered one (or, resuming, to the checkpoint's); shows the configuration's warnings and the
/// notes of clearing the directory. Returns where the trace goes, if one was asked for, and
/// the run directory's lock (rank 0).
fn prepare_outputs(
    cfg: &mut TrainConfig,
    first_step: usize,
    steps_per_epoch: usize,
    warn: &dyn Fn(&str),
) -> Result<PreparedOutputs, PrepareError> {
    if let Some(w) = rundir::check_trace_steps(cfg, first_step, steps_per_epoch)? {
        warn(&w);
    }
    // The run directory first: a trace file may go into it.
    let prepared = if cfg.process_rank == 0 {
        Some(rundir::prepare(cfg)?)
    } else {
        None
    };
    // Only now: `prepare` may have moved the run to a numbered directory.
    let trace_path = rundir::check_trace(cfg)?;
    let Some(mut prepared) = prepared else {
        return Ok(PreparedOutputs {
            trace_path,
            run_dir_lock: None,
            holds_the_resumed_run: false,
        });
    };
    for w in &cfg.warnings {
        warn(w);
    }
    for note in prepared.clear(&cfg.run_dir, warn)? {
        if !cfg.quiet {
            crate::terminal::print_note(&note);
        }
    }
    Ok(PreparedOutputs {
        trace_path,
        run_dir_lock: prepared.lock.take(),
        holds_the_resumed_run: prepared.holds_the_resumed_run,
    })
}

/// What [`prepare_outputs`] checked and holds: this process's trace file, the run
/// directory's lock (process 0), and whether that directory holds the resumed run's files
/// ([`rundir::Prepared::holds_the_resumed_run`]).
struct PreparedOutputs {
    trace_path: Option<PathBuf>,
    run_dir_lock: Option<lock::RunDirLock>,
    holds_the_resumed_run: bool,
}

/// A run's threads once started: the loader threads, one thread per worker, the events they
/// send, the timeline they trace into.
struct RunningWorkers {
    /// Lives until every worker has been joined; dropping it joins the loader threads.
    pipeline: Option<Pipeline>,
    load_stats: Arc<LoadStats>,
    threads: Vec<std::thread::JoinHandle<()>>,
    events: crossbeam_channel::Receiver<Event>,
    trace_sink: Option<Arc<crate::trace::TraceSink>>,
}

/// Starts the input pipeline on `train_source` and one thread per worker of this process, each
/// with its transport and its tracer.
fn spawn_workers(
    run: &PreparedRun,
    train_source: Source,
    group: &ProcessGroup,
    wall: Instant,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Result<RunningWorkers, String> {
    let cfg = &run.cfg;
    let load_stats = Arc::new(LoadStats::default());
    let (pipeline, feeds) =
        start_pipeline(cfg, train_source, run.first_step(), load_stats.clone())?;
    let transports = worker_transports(cfg, group)?;
    // One clock for the whole timeline: microseconds since the run started.
    let trace_sink = cfg
        .trace
        .as_ref()
        .map(|_| crate::trace::TraceSink::new(wall, cfg.trace_steps.clone()));
    // Bounded (a fixed ring): a worker's step sends its times without allocating; the run's
    // thread drains it far faster than steps fill it.
    let (tx, rx) = crossbeam_channel::bounded(4096);
    let mut threads = Vec::new();
    // Workers are numbered across the run: this process's are first_rank.. (rank 0 leads).
    let first_rank = cfg.process_rank * cfg.workers;
    for ((local, transport), feed) in transports.into_iter().enumerate().zip(feeds) {
        let rank = first_rank + local;
        let setup = WorkerSetup {
            rank,
            cfg: cfg.clone(),
            graph: run.graph.clone(),
            feed,
            test: run.test_set.clone(),
            transport,
            events: tx.clone(),
            resume: run.resume.clone(),
            weights: run.weights.clone(),
            description: run.description.clone(),
            tracer: worker_tracer(trace_sink.as_ref(), rank, cfg.world()),
            stop: stop.clone(),
            abandoned: run.abandoned.clone().filter(|_| rank == 0),
        };
        let compute_threads = cfg.threads;
        let thread = std::thread::Builder::new()
            .name(format!("worker-{rank}"))
            .spawn(move || worker::run_worker_thread(setup, compute_threads))
            .map_err(|e| format!("cannot start worker thread: {e}"))?;
        threads.push(thread);
    }
    Ok(RunningWorkers {
        pipeline,
        load_stats,
        threads,
        events: rx,
        trace_sink,
    })
}

/// Each local worker's transport. Over several processes every worker thread gets a transport
/// over the whole run (global ranks, process-major), so every mode, flat or hierarchical, runs
/// across them unchanged; a single worker has none.
fn worker_transports(
    cfg: &TrainConfig,
    group: &ProcessGroup,
) -> Result<Vec<Option<Box<dyn crate::comm::Transport>>>, String> {
    if cfg.processes > 1 {
        let transports = group
            .transports(cfg.workers, cfg.intra_link)?
            .ok_or("MPI is not running in this process")?;
        return Ok(transports.into_iter().map(Some).collect());
    }
    if cfg.workers > 1 {
        return Ok(
            InProcessFabric::new(cfg.workers, cfg.link, cfg.comm_timeout)
                .into_iter()
                .map(|t| Some(Box::new(t) as Box<dyn crate::comm::Transport>))
                .collect(),
        );
    }
    Ok(vec![None])
}

/// Worker `rank`'s handle on the timeline: its own track, and its communication thread's
/// when there are peers ([`crate::trace::Tracer::off`] without `--trace`).
fn worker_tracer(
    sink: Option<&Arc<crate::trace::TraceSink>>,
    rank: usize,
    world: usize,
) -> crate::trace::Tracer {
    sink.map_or_else(crate::trace::Tracer::off, |sink| {
        let mut tracks = vec![(crate::trace::worker_tid(rank), format!("worker {rank}"))];
        if world > 1 {
            tracks.push((crate::trace::comm_tid(rank), format!("comm {rank}")));
        }
        sink.tracer(&tracks)
    })
}

/// Ends the run: joins the threads, writes the timeline, returns the cause of a failure, or
/// checks the replicas, gathers the ranks' report, completes and writes the summary. A write
/// that fails after the summary is written is returned last, with the summary.
fn finish(
    run: &PreparedRun,
    workers: RunningWorkers,
    mut progress: RunProgress,
    display: &ProgressDisplay,
    group: &ProcessGroup,
    wall: Instant,
) -> Result<Summary, TrainError> {
    let cfg = &run.cfg;
    for (local, thread) in workers.threads.into_iter().enumerate() {
        // A worker's failures, panics included, are reported as Event::Failed; a join error
        // means a panic escaped that.
        if thread.join().is_err() {
            let rank = cfg.process_rank * cfg.workers + local;
            progress.failures.push(WorkerError::Escaped { rank });
        }
    }
    drop(workers.pipeline);
    // Every worker has been joined, so every tracer has handed in its events. Written before
    // the failure is returned: a timeline of a failed run helps to see why it failed. A failure
    // to write it is returned after the summary is written, which it must not cost.
    let trace_error = write_trace(workers.trace_sink.as_deref(), run.trace_path.as_deref());
    if let Some((error, before)) = progress.metrics_error {
        // The first failure ends the run: a worker's that came before the line, else the line.
        if !progress.failures[..before].iter().any(|f| !f.is_echo()) {
            return Err(TrainError::Metrics {
                error: Box::new(error),
                checkpoint: newest_restart_point(run),
            });
        }
    }
    match the_cause(progress.failures) {
        Some(WorkerError::Checkpoint(error)) => {
            let restart = newest_restart_point(run);
            return Err(TrainError::CheckpointWrite { error, restart });
        }
        Some(cause) => return Err(TrainError::Worker(cause)),
        None => {}
    }
    let mut summary = progress.summary;
    check_replicas(cfg, group, &mut summary.replica_hashes)?;
    if cfg.processes > 1 {
        // In a multi-process run this process's breakdown covers its own workers only.
        (summary.ranks, summary.slow_ranks) = group
            .rank_report(&summary.breakdown)
            .map_err(TrainError::Finish)?;
        if display.prints_results() {
            crate::outln!(
                "{}",
                processes::describe_ranks(&summary.ranks, &summary.slow_ranks)
            );
        }
    }
    let total_steps = run.total_steps();
    summary.images_per_s = (total_steps * cfg.batch) as f64 / progress.train_seconds.max(1e-9);
    summary.wall_seconds = wall.elapsed().as_secs_f64();
    summary.peak_rss_mb = peak_rss_mb();
    summary.skipped_samples = workers.load_stats.skipped();
    summary.skipped_examples = workers.load_stats.examples();
    summary.steps = total_steps;
    summary.resumed_from = cfg.resume.clone().map(|path| summary::ResumedFrom {
        checkpoint: path,
        epochs_done: run.start_epoch,
        steps_into_epoch: run.start_step_in_epoch,
    });
    summary.steps_per_epoch = run.steps_per_epoch;
    summary.run_dir_lock = run.run_dir_lock.clone();
    if cfg.process_rank == 0 {
        write_summary(&summary).map_err(TrainError::Finish)?;
    }
    let Some(error) = trace_error else {
        return Ok(summary);
    };
    let late = LateWrite::Trace {
        error,
        run_dir: cfg.run_dir.clone(),
    };
    Err(TrainError::LateWrite {
        summary: Box::new(summary),
        error: late,
    })
}

/// The newest restart point (epoch checkpoint or commit) in the run directory, but those the
/// run abandons, for the message of a run that stopped.
fn newest_restart_point(run: &PreparedRun) -> Option<PathBuf> {
    let abandoned = run.abandoned.as_deref();
    rundir::newest_restart_point_but(&run.cfg.run_dir, abandoned).map(|(path, _)| path)
}

/// The restart points in the run directory past the step a resume (`resume`) continues from
/// ([`rundir::AbandonedRestartPoints`]), each named to `warn` where the run writes restart
/// points (under `--no-checkpoints` it supersedes none: they stay, unsaid, though still not
/// where it continues from); none where the run is not the directory's writer (process
/// rank 0).
fn abandoned_restart_points(
    cfg: &TrainConfig,
    resume: Option<&checkpoint::Checkpoint>,
    warn: &dyn Fn(&str),
) -> Option<Arc<rundir::AbandonedRestartPoints>> {
    let state = &resume.filter(|_| cfg.process_rank == 0)?.state;
    let abandoned =
        rundir::AbandonedRestartPoints::find(&cfg.run_dir, state.global_step, state.epoch)?;
    if cfg.no_checkpoints {
        return Some(Arc::new(abandoned));
    }
    for path in abandoned.commit_paths() {
        warn(&format!(
            "{} is past the resumed step: it is from training this run redoes, and is removed \
             when this run writes its first restart point (resume from it, or into another \
             --run-dir, to keep it)",
            path.display()
        ));
    }
    for (epoch, path) in abandoned.epoch_paths() {
        warn(&format!(
            "{} is past the resumed epoch {}: it is from training this run redoes, and is \
             replaced only if this run checkpoints epoch {epoch} (resume from it, or into \
             another --run-dir, to keep it)",
            path.display(),
            state.epoch
        ));
    }
    Some(Arc::new(abandoned))
}

/// The failure a run reports: the first that is not an echo of another (peers whose
/// collectives or input pipeline stopped because of it), else the first.
fn the_cause(mut failures: Vec<WorkerError>) -> Option<WorkerError> {
    let first = failures.iter().position(|e| !e.is_echo()).unwrap_or(0);
    (first < failures.len()).then(|| failures.swap_remove(first))
}

/// Writes the `--trace` timeline (each MPI rank traces its own workers: rank 0 writes PATH,
/// rank r PATH.rank<r>); returns why it could not be written.
fn write_trace(sink: Option<&crate::trace::TraceSink>, path: Option<&Path>) -> Option<String> {
    let (Some(sink), Some(path)) = (sink, path) else {
        return None;
    };
    match sink.write(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), events = sink.len(), "trace written");
            None
        }
        Err(e) => Some(e),
    }
}

/// Checks that every replica ended with the same weights (over several processes, every
/// process's; every rank checks them all, so a divergence stops all of them alike).
fn check_replicas(
    cfg: &TrainConfig,
    group: &ProcessGroup,
    hashes: &mut Vec<u64>,
) -> Result<(), TrainError> {
    if cfg.processes > 1 {
        *hashes = group.gather_hashes(hashes).map_err(TrainError::Finish)?;
    }
    if hashes.iter().any(|&h| h != hashes[0]) {
        return Err(TrainError::Diverged(hashes.clone()));
    }
    Ok(())
}

/// Writes `summary.json` into the summary's run directory.
fn write_summary(summary: &Summary) -> Result<(), String> {
    let json = serde_json::to_string_pretty(summary).map_err(|e| e.to_string())?;
    crate::output::write_atomically(
        &summary.run_dir.join("summary.json"),
        json.as_bytes(),
        &summary::SUMMARY_FILE,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::CommError;
    use crate::pipeline::{BatchFailure, LoadError, StopReason};

    #[test]
    fn an_unreadable_record_refuses_only_a_resume_that_would_take_from_it() {
        let ck = tempfile::NamedTempFile::new().unwrap();
        let resumed = |f: &dyn Fn(&mut crate::config::TrainOptions)| {
            let mut o = crate::config::TrainOptions {
                dataset: Some("synthetic".into()),
                resume: Some(ck.path().to_path_buf()),
                ..Default::default()
            };
            f(&mut o);
            o.resolve().unwrap()
        };
        let mut run = checkpoint::RunIdentity::of(&resumed(&|_| {}));
        run.recipe = recorded::Recorded::Unreadable("metadata 'lr' missing or not valid".into());
        let judged = |cfg: &TrainConfig| {
            let takes = !cfg.given.whole_recipe();
            readable(cfg, Some(&run.recipe), Record::Recipe, takes)
                .map(|(recipe, said)| (recipe.is_some(), said))
        };
        let err = judged(&resumed(&|o| o.lr = Some(0.1)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metadata 'lr' missing or not valid")
                && err.contains("give its options yourself (--lr, --lr-schedule, --warmup-steps"),
            "{err}"
        );
        // Every setting given: nothing is taken from it; under --resume-changed, the options
        // given and the defaults. Either way, said, and no run to follow it from.
        let every = resumed(&|o| {
            o.lr = Some(0.1);
            o.lr_schedule = Some("constant".into());
            o.warmup_steps = Some(0);
            o.momentum = Some(0.9);
            o.weight_decay = Some(0.0);
            o.nesterov = Some(true);
            o.augment = Some("off".into());
        });
        let changed = resumed(&|o| o.resume_changed = true);
        for cfg in [every, changed] {
            let (followed, said) = judged(&cfg).unwrap();
            assert!(
                !followed
                    && said
                        .unwrap()
                        .contains("not following the run's learning rate")
            );
        }
        // The routine reads back: followed.
        let cfg = resumed(&|_| {});
        let (followed, said) = readable(&cfg, Some(&run.routine), Record::Routine, true).unwrap();
        assert!(followed.is_some() && said.is_none());
    }

    /// Options that change a run's bits (which samples a batch holds, whether an update is
    /// skipped, how a convolution rounds) are compared at the start, so ranks given them
    /// apart (a config file per host) are refused, not left to drift.
    #[test]
    fn the_handshake_compares_what_changes_a_runs_bits() {
        let describe = |change: &dyn Fn(&mut crate::config::TrainOptions)| {
            let mut options = crate::config::TrainOptions {
                dataset: Some("synthetic:1x28x28:4".into()),
                train_limit: Some(64),
                test_limit: Some(16),
                batch: Some(16),
                ..Default::default()
            };
            change(&mut options);
            let cfg = options.resolve().unwrap();
            let (train, _) = load_sources(&cfg).unwrap();
            let graph = build_graph(&cfg.model, train.shape(), 4).unwrap();
            processes::run_description(&cfg, &std::sync::Arc::new(graph), &train, 16, 0).unwrap()
        };
        let base = describe(&|_| {});
        type Change<'a> = (&'a str, &'a dyn Fn(&mut crate::config::TrainOptions));
        let changes: [Change; 3] = [
            ("skip bad samples", &|o| o.skip_bad_samples = Some(true)),
            ("skip non-finite updates", &|o| {
                o.on_nonfinite = Some("skip".into())
            }),
            ("convolution algorithm", &|o| {
                o.conv_algo = Some("direct".into())
            }),
        ];
        for (line, change) in changes {
            let other = describe(change);
            let differ: Vec<&String> = base
                .iter()
                .zip(&other)
                .filter(|(a, b)| a != b)
                .map(|(a, _)| &a.0)
                .collect();
            assert_eq!(differ, [line]);
        }
    }

    #[test]
    fn a_checkpoint_recording_parts_of_its_run_only_is_said_naming_each_it_lacks() {
        let cfg = crate::config::TrainOptions {
            dataset: Some("synthetic".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let mut run = checkpoint::RunIdentity::of(&cfg);
        assert_eq!(unrecorded(&run), None);
        // Written between the routine and the keep counts' recording.
        let mut routine = *run.routine.read().unwrap();
        routine.outputs = None;
        run.routine = recorded::Recorded::Read(routine);
        run.exchange = recorded::Recorded::Absent;
        assert_eq!(
            unrecorded(&run).unwrap(),
            "the checkpoint records no checkpoint and log cadence and keep counts; no \
             communication options (an older dptrain wrote it): the resumed run takes the \
             flags' (give the run's where they were not the defaults)"
        );
        // A folder's run that records no --skip-bad-samples setting is said; one of data
        // read whole (no sample of which can be bad) is not.
        run.exchange = recorded::Recorded::Read(cfg.exchange.clone());
        run.skip_bad_samples = None;
        assert!(!unrecorded(&run).unwrap().contains("--skip-bad-samples"));
        run.dataset = "imagefolder".into();
        run.data_dir = Some("photos".into());
        assert!(unrecorded(&run)
            .unwrap()
            .contains("no --skip-bad-samples setting (an older dptrain wrote it)"));
        // An unreadable record is not absent: judged elsewhere (`readable`).
        run.recipe = recorded::Recorded::Unreadable("metadata 'lr' missing".into());
        run.routine = recorded::Recorded::Absent;
        let said = unrecorded(&run).unwrap();
        assert!(
            said.starts_with("the checkpoint records no evaluation, checkpoint and log routine;"),
            "{said}"
        );
    }

    fn failed(rank: usize, phase: Phase, cause: StepError) -> WorkerError {
        WorkerError::Step {
            rank,
            phase,
            step: 3,
            cause,
        }
    }

    fn peer_gone(rank: usize) -> WorkerError {
        let gone = CommError::PeerGone {
            rank,
            peer: 0,
            tag: 7,
        };
        failed(rank, Phase::Communication, gone.into())
    }

    fn pipeline_stopped(rank: usize) -> WorkerError {
        let left = StopReason::WorkerLeft {
            rank: 0,
            at: 3,
            of: 8,
        };
        failed(rank, Phase::Data, LoadError::Stopped(left).into())
    }

    fn panicked(rank: usize) -> WorkerError {
        failed(rank, Phase::Forward, StepError::Panicked("boom".into()))
    }

    #[test]
    fn the_cause_is_the_first_failure_that_is_not_an_echo() {
        let failures = vec![peer_gone(1), pipeline_stopped(2), panicked(0), panicked(3)];
        assert!(failures[0].is_echo() && failures[1].is_echo() && !failures[2].is_echo());
        let cause = the_cause(failures).unwrap();
        assert!(
            matches!(cause, WorkerError::Step { rank: 0, .. }),
            "{cause}"
        );
        // Only echoes: the first stands in for the cause.
        let cause = the_cause(vec![pipeline_stopped(2), peer_gone(1)]).unwrap();
        assert!(
            matches!(cause, WorkerError::Step { rank: 2, .. }),
            "{cause}"
        );
        assert!(the_cause(Vec::new()).is_none());
        // A panic that escaped the worker is a cause, not an echo.
        let cause = the_cause(vec![peer_gone(1), WorkerError::Escaped { rank: 0 }]).unwrap();
        assert_eq!(cause.to_string(), "worker 0 panicked");
    }

    #[test]
    fn a_late_write_error_keeps_the_summary_for_the_report() {
        let cfg = crate::config::TrainOptions::default().resolve().unwrap();
        let late = TrainError::LateWrite {
            summary: Box::new(Summary::empty(&cfg)),
            error: LateWrite::Trace {
                error: "t.json: cannot write".into(),
                run_dir: PathBuf::from("runs/x"),
            },
        };
        assert_eq!(late.summary().map(|s| &s.run_dir), Some(&cfg.run_dir));
        assert_eq!(
            late.to_string(),
            "t.json: cannot write (training finished; summary.json is in runs/x)"
        );
        assert!(TrainError::Diverged(vec![1, 2]).summary().is_none());
    }

    #[test]
    fn failures_read_as_the_messages_users_know() {
        assert_eq!(
            panicked(1).to_string(),
            "worker 1, forward, step 3: panicked: boom"
        );
        let loader = LoadError::Batch {
            epoch: 0,
            step: 3,
            worker: Some(1),
            cause: BatchFailure::Read("injected fault: loader failure for global step 3".into()),
        };
        let stopped = LoadError::Stopped(StopReason::LoaderFailed(Box::new(loader.clone())));
        assert_eq!(
            failed(1, Phase::Data, loader.into()).to_string(),
            "worker 1, data, step 3: loading epoch 1, step 3 for worker 1: injected fault: \
             loader failure for global step 3"
        );
        assert!(stopped.is_echo());
        assert_eq!(
            stopped.to_string(),
            "the input pipeline stopped: loading epoch 1, step 3 for worker 1: injected fault: \
             loader failure for global step 3"
        );
        let gone = peer_gone(1).to_string();
        assert!(
            gone.starts_with("worker 1, communication, step 3: rank 1: peer rank 0 is gone"),
            "{gone}"
        );
        let diverged = StepError::NonFiniteGradient { loss: f32::NAN };
        assert!(!diverged.is_echo());
        assert!(diverged
            .to_string()
            .starts_with("the summed gradient holds NaN"));
    }
}
