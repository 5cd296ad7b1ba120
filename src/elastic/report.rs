//! What an elastic run did, as `elastic.json` holds it: its jobs and the hosts it lost.

use serde::Serialize;
use std::path::PathBuf;

/// One job of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Job {
    /// Hosts it ran on.
    pub hosts: Vec<String>,
    /// The restart point it resumed from, and its global step.
    pub resumed_from: Option<(PathBuf, usize)>,
    /// When it started, seconds since the launch.
    pub started_s: f64,
    /// When its first step after the restart point was reported.
    pub first_step_s: Option<f64>,
    /// When it ended.
    pub ended_s: f64,
    /// Most global steps any rank reported done.
    pub last_step: Option<usize>,
    /// How it ended: "finished", "host lost", "failed (STATUS)".
    pub outcome: String,
}

/// One lost host, with its timeline (seconds since the launch).
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// The host.
    pub host: String,
    /// The job (from 1) that lost it.
    pub job: usize,
    /// Its first rank in the job.
    pub rank: usize,
    /// Its last heartbeat.
    pub last_beat_s: f64,
    /// When it was declared lost.
    pub detected_s: f64,
    /// When the next job reported its first step (`None`: no next job ran).
    pub running_again_s: Option<f64>,
    /// Steps done before the failure that the next job did again.
    pub steps_redone: Option<usize>,
}

/// `elastic.json`, an object with a [`LaunchReport`]'s keys: defined with the run
/// directory's files.
pub use crate::train::run_files::ELASTIC_FILE;

/// Everything an elastic run did: `elastic.json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LaunchReport {
    /// The jobs, in order.
    pub jobs: Vec<Job>,
    /// The hosts lost.
    pub failures: Vec<Failure>,
    /// Whether the run finished.
    pub finished: bool,
}
