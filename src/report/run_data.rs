//! What a run directory holds, as far as a report needs it: `summary.json` and
//! `metrics.jsonl` read as JSON values (type-checked field by field), never as the writer's
//! structs.

use serde_json::Value;
use std::path::{Path, PathBuf};

use crate::input::{self, FileKind, InputError};
use crate::terminal::print_warning;

/// The phases of the step breakdown, in the order they happen (and are stacked).
pub const PHASES: [&str; 5] = ["data wait", "forward", "backward", "exposed comm", "update"];

/// Mean time per step of each phase, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// Data wait, forward, backward, exposed comm, update (the order of [`PHASES`]).
    pub ms: [f64; 5],
    /// Whole step.
    pub step_ms: f64,
    /// Time the communication thread spent in collectives (hidden + exposed).
    pub comm_total_ms: f64,
}

impl Phases {
    /// From a serialised [`crate::train::metrics::Breakdown`] (`{"steps":..,"mean":{..}}`).
    fn from_breakdown(v: &Value) -> Option<Self> {
        let m = v.get("mean")?;
        let f = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        Some(Self {
            ms: [
                f("data_ms"),
                f("forward_ms"),
                f("backward_ms"),
                f("exposed_comm_ms"),
                f("update_ms"),
            ],
            step_ms: f("step_ms"),
            comm_total_ms: f("comm_total_ms"),
        })
    }

    /// Share of the step of phase `i`, in percent.
    pub fn pct(&self, i: usize) -> f64 {
        100.0 * self.ms[i] / self.step_ms.max(1e-9)
    }

    /// Whether a collective was timed: a step of one worker never times one (it exchanges
    /// nothing), a step of several always does.
    pub fn communicated(&self) -> bool {
        self.comm_total_ms > 0.0 || self.ms[3] > 0.0
    }

    /// Share of communication hidden behind backward, in percent (0 without communication).
    pub fn hidden_pct(&self) -> f64 {
        if self.comm_total_ms > 0.0 {
            100.0 * (self.comm_total_ms - self.ms[3]).max(0.0) / self.comm_total_ms
        } else {
            0.0
        }
    }
}

/// One epoch's line of `metrics.jsonl`.
#[derive(Debug, Clone, Default)]
pub struct EpochRow {
    /// Epoch, from 1.
    pub epoch: usize,
    /// Mean training loss (worker 0).
    pub train_loss: f64,
    /// Test loss.
    pub test_loss: f64,
    /// Test accuracy, 0..1.
    pub test_accuracy: f64,
    /// Training images/s over the epoch.
    pub images_per_s: f64,
    /// Mean step breakdown over the epoch.
    pub phases: Phases,
    /// Workers of the job that finished the epoch (None: a run from before they were
    /// recorded).
    pub workers: Option<usize>,
}

/// A host `dptrain launch` lost during the run (from `elastic.json`).
#[derive(Debug, Clone)]
pub struct LostHost {
    /// The host.
    pub host: String,
    /// Global steps done by the job that lost it.
    pub at_step: Option<usize>,
    /// Seconds from its last heartbeat to its detection.
    pub found_after_s: f64,
    /// Seconds from its detection to the next job's first step.
    pub training_again_after_s: Option<f64>,
    /// Steps the next job did again.
    pub steps_redone: Option<usize>,
}

/// What a run directory holds, as far as a report needs it.
#[derive(Debug, Clone)]
pub struct RunData {
    /// The run directory.
    pub dir: PathBuf,
    /// The configuration (empty when the run left no summary).
    pub config: serde_json::Map<String, Value>,
    /// One row per epoch, in order.
    pub epochs: Vec<EpochRow>,
    /// The summary, if the run finished.
    pub summary: Option<Value>,
    /// Mean step breakdown over the run (the summary's, else the epochs' weighted mean).
    pub phases: Phases,
    /// Hosts lost on the way (`elastic.json` of `dptrain launch`), in order.
    pub lost_hosts: Vec<LostHost>,
}

impl RunData {
    /// Reads `summary.json` and `metrics.jsonl` of `dir`; needs at least one of them. A torn
    /// last line of `metrics.jsonl` (what a crash or a full disk leaves) is skipped with a
    /// warning; a bad line before it is an error naming the line.
    pub fn load(dir: &Path) -> Result<Self, String> {
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "run directory {} does not exist: give the --run-dir of a training run",
                    dir.display()
                ))
            }
            Err(e) => return Err(format!("cannot read run directory {}: {e}", dir.display())),
            Ok(m) if !m.is_dir() => {
                return Err(format!(
                    "{} is not a directory: give a run directory (the --run-dir of a training \
                     run), which holds summary.json and metrics.jsonl",
                    dir.display()
                ))
            }
            Ok(_) => {}
        }
        let summary = read_summary(&dir.join("summary.json"))?;
        let metrics_path = dir.join("metrics.jsonl");
        let metrics = read_optional(&metrics_path, FileKind::Metrics)?;
        let mut lines = match &metrics {
            Some(text) => epoch_lines(&metrics_path, text)?,
            None => Vec::new(),
        };
        if summary.is_none() && metrics.is_none() {
            return Err(format!(
                "{} is not a run directory: it has no summary.json and no metrics.jsonl \
                 (give the --run-dir of a training run)",
                dir.display()
            ));
        }
        if summary.is_none() && lines.is_empty() {
            return Err(format!(
                "{}: no summary.json and no epoch lines in metrics.jsonl: the run stopped \
                 before its first epoch ended",
                dir.display()
            ));
        }
        // metrics.jsonl has every epoch, also of resumed runs; the summary only this run's.
        if lines.is_empty() {
            if let Some(e) = summary.as_ref().and_then(|s| s["epochs"].as_array()) {
                lines = e.clone();
            }
        }
        let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let epochs: Vec<EpochRow> = lines
            .iter()
            .map(|v| EpochRow {
                epoch: v["epoch"].as_u64().unwrap_or(0) as usize,
                train_loss: f(v, "train_loss"),
                test_loss: f(v, "test_loss"),
                test_accuracy: f(v, "test_accuracy"),
                images_per_s: f(v, "images_per_s"),
                phases: Phases::from_breakdown(&v["breakdown"]).unwrap_or_default(),
                workers: v["workers"].as_u64().map(|w| w as usize),
            })
            .collect();
        // The summary's breakdown is of the steps this run timed (after its resume point, for
        // a resumed run), none when all were warm-up; the epochs' mean only for a run that
        // wrote no summary (it stopped early).
        let phases = summary
            .as_ref()
            .and_then(|s| Phases::from_breakdown(&s["breakdown"]))
            .unwrap_or_else(|| mean_phases(&lines));
        let config = summary
            .as_ref()
            .and_then(|s| s["config"].as_object().cloned())
            .unwrap_or_default();
        let lost_hosts = read_lost_hosts(&dir.join("elastic.json"))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            epochs,
            summary,
            phases,
            lost_hosts,
        })
    }

    /// A short name for tables and legends: the directory's last component.
    pub fn name(&self) -> String {
        self.dir.file_name().map_or_else(
            || self.dir.display().to_string(),
            |n| n.to_string_lossy().into(),
        )
    }

    /// A number in `summary.json`, if the run wrote one.
    pub(crate) fn summary_f64(&self, key: &str) -> Option<f64> {
        self.summary.as_ref()?.get(key)?.as_f64()
    }

    /// Where each lost host was lost, in epochs (its job's steps over the steps per epoch),
    /// for the plots; empty without the summary's steps per epoch.
    pub fn lost_at_epochs(&self) -> Vec<f64> {
        let spe = self.summary_f64("steps_per_epoch").filter(|&s| s > 0.0);
        let Some(spe) = spe else {
            return Vec::new();
        };
        self.lost_hosts
            .iter()
            .filter_map(|l| Some(l.at_step? as f64 / spe))
            .collect()
    }

    /// Final test accuracy (the summary's, else the last epoch's), 0..1.
    pub fn final_accuracy(&self) -> Option<f64> {
        self.summary_f64("final_test_accuracy")
            .or_else(|| self.epochs.last().map(|e| e.test_accuracy))
    }

    /// Training images/s over the run (the summary's, else the mean over epochs).
    pub fn images_per_s(&self) -> Option<f64> {
        self.summary_f64("images_per_s").or_else(|| {
            let n = self.epochs.len();
            (n > 0).then(|| self.epochs.iter().map(|e| e.images_per_s).sum::<f64>() / n as f64)
        })
    }

    /// Whether the run's workers exchanged gradients in `phases` (an epoch's or the run's):
    /// they timed a collective, or the run had more than one worker in all (workers per
    /// process x processes; a run that did not record its workers, with no summary, is taken
    /// to). The recorded workers are the last job's: a resume or `dptrain launch` may have run
    /// the earlier epochs on more.
    pub fn exchanges_gradients(&self, phases: &Phases) -> bool {
        let count = |key: &str| self.config.get(key).and_then(Value::as_u64);
        phases.communicated()
            || count("workers").is_none_or(|w| w * count("processes").unwrap_or(1) > 1)
    }

    /// Whether the workers exchanged gradients in epoch `e`: by the workers it recorded where
    /// it did (the job that finished it), else as [`Self::exchanges_gradients`] judges.
    pub fn epoch_exchanges_gradients(&self, e: &EpochRow) -> bool {
        match e.workers {
            Some(w) => e.phases.communicated() || w > 1,
            None => self.exchanges_gradients(&e.phases),
        }
    }

    /// Whether this run resumed a checkpoint (its summary's figures are then of the steps
    /// after it).
    pub fn resumed(&self) -> bool {
        self.summary
            .as_ref()
            .is_some_and(|s| !s["resumed_from"].is_null())
    }

    /// A configuration value as text (`-` when the run did not record it).
    pub(crate) fn config_str(&self, key: &str) -> String {
        match self.config.get(key) {
            None | Some(Value::Null) => "-".into(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }
    }
}

/// The JSON type a field must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Number,
    Text,
    Array,
    Object,
}

impl Kind {
    fn holds(self, v: &Value) -> bool {
        match self {
            // serde_json writes a NaN as null: a run's own summary may hold one.
            Kind::Number => v.is_number() || v.is_null(),
            Kind::Text => v.is_string(),
            Kind::Array => v.is_array(),
            Kind::Object => v.is_object(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Number => "a number",
            Kind::Text => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// The type of a JSON value, in words.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Fields of `summary.json` the report reads, with their types (as `train::Summary` writes
/// them); `/` separates nested keys.
const SUMMARY_FIELDS: &[(&str, Kind)] = &[
    ("config", Kind::Object),
    ("epochs", Kind::Array),
    ("final_test_accuracy", Kind::Number),
    ("images_per_s", Kind::Number),
    ("wall_seconds", Kind::Number),
    ("peak_rss_mb", Kind::Number),
    ("buckets", Kind::Text),
    ("replica_hashes", Kind::Array),
    ("breakdown", Kind::Object),
    ("breakdown/steps", Kind::Number),
    ("breakdown/mean", Kind::Object),
    ("breakdown/mean/data_ms", Kind::Number),
    ("breakdown/mean/forward_ms", Kind::Number),
    ("breakdown/mean/backward_ms", Kind::Number),
    ("breakdown/mean/exposed_comm_ms", Kind::Number),
    ("breakdown/mean/comm_total_ms", Kind::Number),
    ("breakdown/mean/update_ms", Kind::Number),
    ("breakdown/mean/step_ms", Kind::Number),
];

/// Fields of an epoch line of `metrics.jsonl` the report reads.
const EPOCH_FIELDS: &[(&str, Kind)] = &[
    ("epoch", Kind::Number),
    ("train_loss", Kind::Number),
    ("test_loss", Kind::Number),
    ("test_accuracy", Kind::Number),
    ("images_per_s", Kind::Number),
    ("breakdown", Kind::Object),
    ("breakdown/steps", Kind::Number),
    ("breakdown/mean", Kind::Object),
    ("breakdown/mean/step_ms", Kind::Number),
];

/// Reads `path` as text, or `None` when it does not exist; anything else that stops the read
/// (a fifo, a device, a file over its cap) is an error.
fn read_optional(path: &Path, kind: FileKind) -> Result<Option<String>, String> {
    match input::read_text(path, kind) {
        Ok(text) => Ok(Some(text)),
        Err(InputError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads and type-checks `summary.json`, or `None` when the run wrote none.
fn read_summary(path: &Path) -> Result<Option<Value>, String> {
    let Some(text) = read_optional(path, FileKind::Summary)? else {
        return Ok(None);
    };
    // A pretty-printed file of many lines: its line counts as well as the column.
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: line {}, {}; it is not a summary dptrain wrote (cut short, or edited): \
             re-run the training, or remove the file to report from metrics.jsonl",
            path.display(),
            e.line(),
            json_error(&e)
        )
    })?;
    // Every summary dptrain writes has its configuration: without one, the report would be
    // empty and say nothing of why.
    let typed = check_types(&v, SUMMARY_FIELDS).and_then(|()| match v.get("config") {
        Some(_) => Ok(()),
        None => Err("has no field 'config'".to_string()),
    });
    typed.map_err(|e| {
        format!(
            "{}: {e}; it is not a summary dptrain wrote (or it was edited): \
             re-run the training, or remove the file to report from metrics.jsonl",
            path.display()
        )
    })?;
    Ok(Some(v))
}

/// A JSON error without serde's "at line 1 column N" (a metrics line is one line of the file,
/// so that position would name the wrong line): its column and what went wrong.
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text);
    format!("column {}: {message}", e.column())
}

/// The hosts lost, from `elastic.json` at `path` (none when there is no such file: a run not
/// started by `dptrain launch`).
fn read_lost_hosts(path: &Path) -> Result<Vec<LostHost>, String> {
    let Some(text) = read_optional(path, FileKind::Summary)? else {
        return Ok(Vec::new());
    };
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON ({e})", path.display()))?;
    let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
    let n = |x: &Value| x.as_f64();
    let lost = v["failures"].as_array().cloned().unwrap_or_default();
    Ok(lost
        .iter()
        .map(|f| {
            let job = f["job"]
                .as_u64()
                .and_then(|j| jobs.get((j as usize).checked_sub(1)?));
            let detected = n(&f["detected_s"]).unwrap_or(f64::NAN);
            LostHost {
                host: f["host"].as_str().unwrap_or("?").to_string(),
                at_step: job
                    .and_then(|j| j["last_step"].as_u64())
                    .map(|s| s as usize),
                found_after_s: detected - n(&f["last_beat_s"]).unwrap_or(f64::NAN),
                training_again_after_s: n(&f["running_again_s"]).map(|t| t - detected),
                steps_redone: f["steps_redone"].as_u64().map(|s| s as usize),
            }
        })
        .collect())
}

/// The epoch lines of `metrics.jsonl` (its text given), type-checked. Lines are numbered from
/// 1 as in the file, blank lines included. The last line is torn when the writer stopped in
/// the middle of it (a crash, a full disk): it has no newline or ends before the JSON does. It
/// is skipped with a warning; a bad line before it is an error. Lines that are neither epoch
/// nor step lines (no `kind` dptrain writes) are skipped with one warning naming the first.
fn epoch_lines(path: &Path, text: &str) -> Result<Vec<Value>, String> {
    let last = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .last()
        .map(|(i, _)| i);
    let mut lines = Vec::new();
    let mut foreign: Option<(usize, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) if Some(i) == last && (e.is_eof() || !text.ends_with('\n')) => {
                print_warning(&format!(
                    "{} line {}: skipped a torn last line ({}), what a run that crashed or \
                     ran out of disk leaves",
                    path.display(),
                    i + 1,
                    json_error(&e)
                ));
                continue;
            }
            Err(e) => {
                return Err(format!(
                    "{} line {}: {}; it is not a line dptrain wrote (or it was edited)",
                    path.display(),
                    i + 1,
                    json_error(&e)
                ))
            }
        };
        match v.get("kind").and_then(Value::as_str) {
            Some("epoch") => {}
            Some("step") => continue,
            _ => {
                let (count, _) = foreign.get_or_insert((0, i + 1));
                *count += 1;
                continue;
            }
        }
        check_types(&v, EPOCH_FIELDS).map_err(|e| {
            format!(
                "{} line {}: {e}; it is not a line dptrain wrote (or it was edited)",
                path.display(),
                i + 1
            )
        })?;
        // A run resumed from an earlier checkpoint trains its epochs again and appends
        // them: the later lines supersede the abandoned ones (which stay in the file).
        if let Some(epoch) = v["epoch"].as_u64() {
            let redone = |l: &Value| l["epoch"].as_u64().is_some_and(|e| e >= epoch);
            while lines.last().is_some_and(redone) {
                lines.pop();
            }
        }
        lines.push(v);
    }
    if let Some((count, first)) = foreign {
        print_warning(&format!(
            "{}: skipped {} that dptrain does not write (neither an epoch nor a step line; \
             the first is line {first})",
            path.display(),
            crate::terminal::counted(count, "line")
        ));
    }
    Ok(lines)
}

/// Checks that `v` is an object whose fields in `fields` have the stated types. Absent fields
/// pass (older runs, runs that stopped early); present ones of another type are an error
/// naming the field, since reading them as zeros gave an all-zero report.
fn check_types(v: &Value, fields: &[(&str, Kind)]) -> Result<(), String> {
    if !v.is_object() {
        return Err(format!("is {}, not a JSON object", kind_of(v)));
    }
    for (path, kind) in fields {
        let found = path
            .split('/')
            .try_fold(v, |node, key| node.as_object().and_then(|o| o.get(key)));
        match found {
            Some(x) if !kind.holds(x) => {
                return Err(format!(
                    "field '{}' is {}, not {}",
                    path.replace('/', "."),
                    kind_of(x),
                    kind.name()
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Step-weighted mean of the epochs' breakdowns.
fn mean_phases(lines: &[Value]) -> Phases {
    let mut sum = Phases::default();
    let mut steps = 0.0;
    for v in lines {
        let Some(p) = Phases::from_breakdown(&v["breakdown"]) else {
            continue;
        };
        let n = v["breakdown"]["steps"].as_f64().unwrap_or(0.0);
        for i in 0..5 {
            sum.ms[i] += n * p.ms[i];
        }
        sum.step_ms += n * p.step_ms;
        sum.comm_total_ms += n * p.comm_total_ms;
        steps += n;
    }
    if steps > 0.0 {
        for m in &mut sum.ms {
            *m /= steps;
        }
        sum.step_ms /= steps;
        sum.comm_total_ms /= steps;
    }
    sum
}
