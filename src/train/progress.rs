//! Following a run while it goes: the workers' [`Event`]s summed into the summary
//! ([`RunProgress`]), the metrics lines, and what a person sees ([`ProgressDisplay`]: the bar,
//! the plan, each epoch's line).

use super::error::WorkerError;
use super::event::Event;
use super::metrics::{self, append_jsonl, peak_rss_mb, Breakdown, EpochRecord, StepTimes};
use super::summary::Summary;
use crate::config::{LogFormat, TrainConfig};
use std::path::{Path, PathBuf};

/// Steps of worker 0 averaged into one progress-bar message.
const MESSAGE_WINDOW: usize = 20;

/// What a person sees while the run goes: a progress bar (none with `--quiet` or JSON lines,
/// which print each epoch as a line instead), the bucket plan, one line per epoch.
pub struct ProgressDisplay {
    bar: indicatif::ProgressBar,
    quiet: bool,
    json_log: bool,
    /// Worker 0's steps since the last message, and their total milliseconds.
    window: (usize, f64),
}

impl ProgressDisplay {
    /// The display of a run of `total_steps` steps.
    pub fn new(cfg: &TrainConfig, total_steps: usize) -> Self {
        let json_log = cfg.log_format == LogFormat::Json;
        let bar = if cfg.quiet || json_log {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(total_steps as u64)
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  ETA {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Self {
            bar,
            quiet: cfg.quiet,
            json_log,
            window: (0, 0.0),
        }
    }

    /// Prints above the progress bar, or plainly when there is no terminal to draw it on.
    fn say(&self, line: String) {
        if self.bar.is_hidden() {
            crate::outln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// The run's setup and worker 0's bucket plan.
    pub fn plan(&self, cfg: &TrainConfig, description: &str, ops: &[String]) {
        tracing::info!(buckets = %description, ops = %ops.join(", "), "bucket plan");
        if self.quiet || self.json_log {
            return;
        }
        // The schedule and compression when not the defaults, which the rest of the line shows.
        let mut beyond = String::new();
        if cfg.schedule != crate::parallel::Schedule::Overlap {
            beyond.push_str(&format!(", schedule {}", cfg.schedule));
        }
        if cfg.compress != crate::plan::CompressChoice::NONE {
            beyond.push_str(&format!(", compress {}", cfg.compress));
        }
        let who = format!(
            "{} on {}: {} x {}",
            cfg.model,
            cfg.dataset,
            crate::terminal::counted(cfg.world(), "worker"),
            crate::terminal::counted(cfg.threads, "thread")
        );
        if cfg.world() == 1 {
            // One replica: its gradients are its own, so no bucket is ever sent.
            self.say(format!("{who}{beyond}; one worker: no gradient exchange"));
            return;
        }
        self.say(format!(
            "{who}, comm {}, overlap {}{beyond}\n  {}; per bucket: {}",
            cfg.comm,
            if cfg.overlap { "on" } else { "off" },
            description,
            ops.join(", ")
        ));
    }

    /// Worker 0 finished a step: the bar moves; every `MESSAGE_WINDOW` steps its message
    /// shows the loss, the throughput and the epoch's data wait and exposed communication.
    pub fn step(&mut self, batch: usize, loss: f32, step_ms: f64, epoch: &Breakdown) {
        self.bar.inc(1);
        self.window = (self.window.0 + 1, self.window.1 + step_ms);
        if self.window.0 < MESSAGE_WINDOW {
            return;
        }
        let m = &epoch.mean;
        let pct = |v: f64| 100.0 * v / m.step_ms.max(1e-9);
        self.bar.set_message(format!(
            "loss {loss:.3}  {:.0} img/s  data wait {:.1}%  exposed comm {:.1}%",
            batch as f64 * 1e3 * MESSAGE_WINDOW as f64 / self.window.1,
            pct(m.data_ms),
            pct(m.exposed_comm_ms)
        ));
        self.window = (0, 0.0);
    }

    /// An epoch's results: a JSON line (`--log-format json`) or a line above the bar.
    pub fn epoch(&self, epochs: usize, record: &EpochRecord) {
        if self.json_log {
            let mut line = serde_json::to_value(record).unwrap_or_default();
            line["kind"] = "epoch".into();
            line["epochs"] = epochs.into();
            crate::outln!("{line}");
        } else if !self.quiet {
            // An epoch with no timed step has no breakdown; the run's warnings say why, once.
            let breakdown = if record.breakdown.steps > 0 {
                format!("\n  {}", record.breakdown.describe())
            } else {
                String::new()
            };
            self.say(format!(
                "epoch {}/{}: train loss {:.4}, test loss {:.4}, test accuracy {:.2}%, {:.0} \
                 images/s{breakdown}",
                record.epoch,
                epochs,
                record.train_loss,
                record.test_loss,
                100.0 * record.test_accuracy,
                record.images_per_s,
            ));
        }
    }

    /// Training is over: the bar goes.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Whether results may be printed (not `--quiet`, not JSON lines).
    pub fn prints_results(&self) -> bool {
        !self.quiet && !self.json_log
    }
}

/// What the run has learnt from its workers' events so far.
pub struct RunProgress {
    /// The summary as far as the events fill it (epochs, breakdown, plan, checkpoint, each
    /// worker's final hash, skipped updates).
    pub summary: Summary,
    /// Every failure reported, in the order they came.
    pub failures: Vec<WorkerError>,
    /// Seconds of training steps (worker 0, evaluation excluded).
    pub train_seconds: f64,
    /// The first metrics line that could not be written, and how many worker failures had
    /// come before it (a failure before it is the run's cause, not the line).
    pub metrics_error: Option<(crate::output::OutputError, usize)>,
    /// Set on the first failed metrics line: the workers stop before their next step.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    epoch_breakdown: Breakdown,
    metrics_path: PathBuf,
    /// The global step the run started at (a resumed run's first).
    first_step: usize,
    /// The global rank of this process's first worker.
    first_rank: usize,
    steps_per_epoch: usize,
    /// Resuming its own run directory: where (epochs done, steps of the next done) the lines
    /// of `metrics.jsonl` this run writes again begin; cut before its first line is written,
    /// so a run that fails before training leaves the file as it was.
    superseded_from: Option<(usize, usize)>,
    /// Warnings met while following the run, for [`RunProgress::follow`]'s `warn`.
    warnings: Vec<String>,
}

impl RunProgress {
    /// Nothing learnt yet about a run of `cfg` from global step `first_step`, with
    /// `steps_per_epoch`.
    pub fn new(cfg: &TrainConfig, first_step: usize, steps_per_epoch: usize) -> Self {
        Self {
            summary: Summary::empty(cfg),
            failures: Vec::new(),
            train_seconds: 0.0,
            metrics_error: None,
            stop: Default::default(),
            epoch_breakdown: Breakdown::default(),
            metrics_path: cfg.run_dir.join("metrics.jsonl"),
            first_step,
            first_rank: cfg.process_rank * cfg.workers,
            steps_per_epoch,
            superseded_from: None,
            warnings: Vec::new(),
        }
    }

    /// The run resumes at `resumed` (epochs done, steps of the next done) in a directory that
    /// holds its run (`rundir::Prepared::holds_the_resumed_run`):
    /// `metrics.jsonl`'s lines from there on are cut before this run writes its first.
    pub fn supersede_from(&mut self, resumed: (usize, usize)) {
        self.superseded_from = Some(resumed);
    }

    /// Takes in every event until the last worker has gone (the channel closes); warnings met
    /// on the way (a worker's, the metrics file's) go to `warn` as they come.
    pub fn follow(
        &mut self,
        cfg: &TrainConfig,
        events: &crossbeam_channel::Receiver<Event>,
        display: &mut ProgressDisplay,
        warn: &dyn Fn(&str),
    ) {
        for event in events.iter() {
            match event {
                Event::Warning(message) => warn(&message),
                Event::Plan { description, ops } => {
                    display.plan(cfg, &description, &ops);
                    self.summary.buckets = description;
                    self.summary.bucket_ops = ops;
                }
                Event::Step {
                    rank,
                    epoch,
                    step,
                    loss,
                    times,
                } => self.step(cfg, display, rank, (epoch, step), loss, &times),
                Event::Failed { rank, error } => {
                    tracing::debug!(rank, error = %error, "worker failed");
                    self.failures.push(error);
                }
                Event::Done {
                    rank,
                    weights_hash,
                    skipped_updates,
                } => {
                    let skipped = &mut self.summary.skipped_nonfinite_updates;
                    *skipped = (*skipped).max(skipped_updates);
                    self.summary.replica_hashes[rank - self.first_rank] = weights_hash;
                }
                Event::Epoch {
                    epoch,
                    train_loss,
                    test_loss,
                    test_accuracy,
                    train_seconds,
                    checkpoint,
                } => {
                    let record = self.epoch_record(
                        cfg,
                        epoch,
                        (train_loss, test_loss, test_accuracy),
                        train_seconds,
                    );
                    display.epoch(cfg.epochs, &record);
                    self.epoch_done(record, checkpoint);
                }
            }
            for message in self.warnings.drain(..) {
                warn(&message);
            }
        }
    }

    /// A worker's step: its times count past the warm-up; worker 0's moves the display and,
    /// every `--log-every` steps, writes a metrics line.
    fn step(
        &mut self,
        cfg: &TrainConfig,
        display: &mut ProgressDisplay,
        rank: usize,
        (epoch, step): (usize, usize),
        loss: f32,
        times: &StepTimes,
    ) {
        let global = epoch * self.steps_per_epoch + step;
        super::heartbeat::record_steps_done(global + 1);
        // Warm-up: this run's first steps, wherever in an epoch it started.
        if global >= self.first_step + metrics::WARMUP_STEPS {
            // Ranks are global; this process's workers are `workers` of them from its first.
            let local = rank - self.first_rank;
            self.summary.breakdown.add(times, local);
            self.epoch_breakdown.add(times, local);
        }
        if rank != 0 {
            return;
        }
        display.step(cfg.batch, loss, times.step_ms, &self.epoch_breakdown);
        if cfg.log_every > 0 && step % cfg.log_every == 0 {
            let line = serde_json::json!({"kind": "step", "epoch": epoch + 1, "step": step, "loss": loss, "times": times});
            self.write_metrics_line(&line);
        }
    }

    /// Worker 0's epoch (`losses`: train loss, test loss, test accuracy) as recorded, with the
    /// epoch's breakdown (which starts over).
    fn epoch_record(
        &mut self,
        cfg: &TrainConfig,
        epoch: usize,
        (train_loss, test_loss, test_accuracy): (f64, f64, f64),
        seconds: f64,
    ) -> EpochRecord {
        self.train_seconds += seconds;
        // A resumed run's first epoch trained only the steps after its commit.
        let first = self.first_step.saturating_sub(epoch * self.steps_per_epoch);
        let steps = self.steps_per_epoch.saturating_sub(first);
        EpochRecord {
            epoch: epoch + 1,
            train_loss,
            test_loss,
            test_accuracy,
            images_per_s: (steps * cfg.batch) as f64 / seconds.max(1e-9),
            workers: cfg.world(),
            seconds,
            breakdown: std::mem::take(&mut self.epoch_breakdown),
            peak_rss_mb: peak_rss_mb(),
        }
    }

    /// Writes the epoch's metrics line and keeps its record (and its checkpoint, if any).
    fn epoch_done(&mut self, record: EpochRecord, checkpoint: Option<PathBuf>) {
        let mut line = serde_json::to_value(&record).unwrap_or_default();
        line["kind"] = "epoch".into();
        self.write_metrics_line(&line);
        self.summary.final_test_accuracy = record.test_accuracy;
        self.summary.epochs.push(record);
        if checkpoint.is_some() {
            self.summary.checkpoint = checkpoint;
        }
    }

    /// Appends a line to `metrics.jsonl` (whole, or not at all); the first failure stops the
    /// run: the workers leave before their next step, and the failure is the run's error. No
    /// line is written after it, so the file is the run's record up to that line.
    fn write_metrics_line(&mut self, line: &serde_json::Value) {
        if self.metrics_error.is_some() {
            return;
        }
        if let Some(resumed) = self.superseded_from.take() {
            let past = |l: &str| metrics::line_past(l, resumed);
            match crate::output::cut_lines_from(&self.metrics_path, past) {
                Ok(0) => {}
                Ok(n) => self.warnings.push(format!(
                    "{}: removed {} past the resumed step (training this run supersedes)",
                    self.metrics_path.display(),
                    crate::terminal::counted(n, "line")
                )),
                Err(e) => {
                    self.metrics_error = Some((e, self.failures.len()));
                    self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
            }
        }
        if let Err(e) = append_jsonl(Path::new(&self.metrics_path), line) {
            self.metrics_error = Some((e, self.failures.len()));
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
