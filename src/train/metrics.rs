//! Where each step's time went, and the files a run leaves behind.

use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Time of one step on one worker, by phase.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct StepTimes {
    /// Waiting for the batch.
    pub data_ms: f64,
    /// Forward pass and loss.
    pub forward_ms: f64,
    /// Block-wise backward (including handing buckets to the communication thread).
    pub backward_ms: f64,
    /// Communication not hidden behind backward: from the end of backward until the last bucket
    /// was reduced (plus the weight broadcast in tree mode).
    pub exposed_comm_ms: f64,
    /// Time the communication thread spent in collectives (hidden + exposed).
    pub comm_total_ms: f64,
    /// CPU time the communication thread used in them: its work, without its waits (absent
    /// from older runs' metrics).
    #[serde(default)]
    pub comm_cpu_ms: f64,
    /// Optimizer update.
    pub update_ms: f64,
    /// Whole step.
    pub step_ms: f64,
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl StepTimes {
    /// Communication hidden behind backward.
    pub fn hidden_comm_ms(&self) -> f64 {
        (self.comm_total_ms - self.exposed_comm_ms).max(0.0)
    }
}

/// Steps at the start of a run left out of its step breakdown: the first steps pay for
/// allocations, page faults and the loaders filling their queues.
pub const WARMUP_STEPS: usize = 5;

/// Mean step breakdown over many steps and workers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Breakdown {
    /// Timed training steps (each step once, whatever the workers: the count of this process's
    /// first worker).
    pub steps: usize,
    /// Mean times, over the timed steps of every worker of this process.
    pub mean: StepTimes,
    /// The workers' steps averaged into `mean`.
    #[serde(skip)]
    samples: usize,
}

impl Breakdown {
    /// Adds one step's times of this process's worker `local` (a step counts once, at the
    /// process's first worker, `local` 0).
    pub fn add(&mut self, t: &StepTimes, local: usize) {
        let n = self.samples as f64;
        let upd = |m: &mut f64, v: f64| *m = (*m * n + v) / (n + 1.0);
        upd(&mut self.mean.data_ms, t.data_ms);
        upd(&mut self.mean.forward_ms, t.forward_ms);
        upd(&mut self.mean.backward_ms, t.backward_ms);
        upd(&mut self.mean.exposed_comm_ms, t.exposed_comm_ms);
        upd(&mut self.mean.comm_total_ms, t.comm_total_ms);
        upd(&mut self.mean.comm_cpu_ms, t.comm_cpu_ms);
        upd(&mut self.mean.update_ms, t.update_ms);
        upd(&mut self.mean.step_ms, t.step_ms);
        self.samples += 1;
        if local == 0 {
            self.steps += 1;
        }
    }

    /// One-line table row: each phase in ms and % of the step; says so when no step was timed
    /// (a run shorter than the untimed warm-up), rather than printing zeros.
    pub fn describe(&self) -> String {
        if self.steps == 0 {
            return format!(
                "no timed steps: the first {WARMUP_STEPS} steps of a run are untimed warm-up \
                 and this run had no more; train longer for a step breakdown"
            );
        }
        let m = &self.mean;
        let pct = |v: f64| 100.0 * v / m.step_ms.max(1e-9);
        // No collective ran (one worker): there is no communication phase to account for.
        let communicated = m.comm_total_ms > 0.0 || m.exposed_comm_ms > 0.0;
        let mut phases = vec![
            ("data", m.data_ms),
            ("forward", m.forward_ms),
            ("backward", m.backward_ms),
        ];
        if communicated {
            phases.push(("exposed comm", m.exposed_comm_ms));
        }
        phases.push(("update", m.update_ms));
        let phases: Vec<String> = phases
            .iter()
            .map(|&(name, ms)| format!("{name} {ms:.2} ({:.1}%)", pct(ms)))
            .collect();
        let comm = if communicated {
            let hidden = 100.0 * m.hidden_comm_ms() / m.comm_total_ms.max(1e-9);
            format!(
                "comm total {:.2} ms, {hidden:.0}% hidden, comm thread CPU {:.2} ms",
                m.comm_total_ms, m.comm_cpu_ms
            )
        } else {
            "no gradient exchange".to_string()
        };
        format!("step {:.2} ms = {}; {comm}", m.step_ms, phases.join(" + "))
    }
}

/// Whether a `metrics.jsonl` line records training at or past `resumed`, (epochs done, steps
/// of the next done) where a resumed run starts: a step line from there on, or the line of an
/// epoch after the last one done. What a resumed run writes again. Other lines are kept.
/// Positions, not step counts: `--resume-changed` may change the steps an epoch has.
pub fn line_past(line: &str, (epochs_done, steps_done): (usize, usize)) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    let number = |key: &str| v[key].as_u64().map(|n| n as usize);
    match (v["kind"].as_str(), number("epoch")) {
        (Some("step"), Some(epoch)) => number("step")
            .is_some_and(|step| (epoch.saturating_sub(1), step) >= (epochs_done, steps_done)),
        (Some("epoch"), Some(epoch)) => epoch > epochs_done,
        _ => false,
    }
}

/// Results of one epoch.
#[derive(Debug, Clone, Serialize)]
pub struct EpochRecord {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss over the epoch (worker 0's shards).
    pub train_loss: f64,
    /// Test loss.
    pub test_loss: f64,
    /// Test top-1 accuracy, 0..1.
    pub test_accuracy: f64,
    /// Training images per second over the epoch (all workers).
    pub images_per_s: f64,
    /// Workers (all processes) of the job that finished the epoch: a resume or `dptrain
    /// launch` may change them between epochs, so `report` judges each epoch's communication
    /// by its own.
    pub workers: usize,
    /// Wall time of the epoch's training steps.
    pub seconds: f64,
    /// Mean step breakdown over the epoch.
    pub breakdown: Breakdown,
    /// Peak resident memory of the process so far, in MiB (see [`peak_rss_mb`]); flat across
    /// epochs when nothing grows per epoch.
    pub peak_rss_mb: f64,
}

/// Peak resident memory of this process in MiB (`VmHWM` of `/proc/self/status`), 0 where the
/// kernel does not report it.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Appends one JSON line to `path` (through [`crate::output::append_line`]: a regular file
/// only, never through a link).
pub fn append_jsonl(path: &Path, value: &impl Serialize) -> Result<(), crate::output::OutputError> {
    let line = serde_json::to_string(value).map_err(|e| crate::output::OutputError::Io {
        path: path.to_path_buf(),
        action: "serialise a line for",
        cause: std::io::Error::other(e),
    })?;
    crate::output::append_line(path, &line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakdown(exposed_comm_ms: f64, comm_total_ms: f64) -> Breakdown {
        let mut b = Breakdown::default();
        b.add(
            &StepTimes {
                data_ms: 1.0,
                forward_ms: 3.0,
                backward_ms: 4.0,
                exposed_comm_ms,
                comm_total_ms,
                comm_cpu_ms: 0.5,
                update_ms: 1.0,
                step_ms: 9.0 + exposed_comm_ms,
            },
            0,
        );
        b
    }

    #[test]
    fn a_step_breakdown_names_communication_only_where_a_collective_ran() {
        let two = breakdown(1.0, 4.0).describe();
        assert!(
            two.contains("+ exposed comm 1.00 (10.0%) + update"),
            "{two}"
        );
        assert!(
            two.ends_with("comm total 4.00 ms, 75% hidden, comm thread CPU 0.50 ms"),
            "{two}"
        );
        let one = breakdown(0.0, 0.0).describe();
        assert!(
            one.starts_with("step 9.00 ms = data 1.00 (11.1%) + forward 3.00 (33.3%)"),
            "{one}"
        );
        assert!(
            !one.contains("exposed comm") && one.ends_with("; no gradient exchange"),
            "{one}"
        );
        let none = Breakdown::default().describe();
        assert!(none.starts_with("no timed steps"), "{none}");
    }

    #[test]
    fn the_lines_past_a_resumed_step_are_its_steps_and_the_epochs_after_the_last_done() {
        // Resumed at step 4 of epoch 2 (1 epoch done, 4 steps of the next).
        let past = |line: &str| line_past(line, (1, 4));
        assert!(!past(r#"{"kind":"step","epoch":2,"step":3}"#));
        assert!(past(r#"{"kind":"step","epoch":2,"step":4}"#));
        assert!(past(r#"{"kind":"step","epoch":3,"step":0}"#));
        assert!(!past(r#"{"kind":"epoch","epoch":1}"#));
        assert!(past(r#"{"kind":"epoch","epoch":2}"#));
        assert!(!past("not json") && !past(r#"{"kind":"note"}"#));
        // Resumed at an epoch's end: that epoch's lines stay, whatever its length was (the
        // earlier run's epochs may have had more steps, under --resume-changed).
        assert!(!line_past(r#"{"kind":"epoch","epoch":2}"#, (2, 0)));
        assert!(!line_past(r#"{"kind":"step","epoch":2,"step":90}"#, (2, 0)));
        assert!(line_past(r#"{"kind":"step","epoch":3,"step":0}"#, (2, 0)));
    }

    #[test]
    fn a_step_counts_once_and_every_worker_s_times_are_averaged() {
        let times = |step_ms: f64| StepTimes {
            step_ms,
            ..Default::default()
        };
        let mut b = Breakdown::default();
        for (ms, local) in [(10.0, 0), (20.0, 1), (30.0, 0), (40.0, 1)] {
            b.add(&times(ms), local);
        }
        assert_eq!(b.steps, 2);
        assert_eq!(b.mean.step_ms, 25.0);
    }
}
