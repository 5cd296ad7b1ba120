//! Why an elastic run stopped: each cause typed, each message naming what to do and, where
//! there is one, the newest state to continue from.

use std::net::IpAddr;
use std::path::PathBuf;

/// Why an elastic run stopped before finishing.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The hostfile cannot be used.
    #[error(transparent)]
    Hostfile(#[from] super::hostfile::HostfileError),
    /// A `train` option the supervisor owns was given.
    #[error(
        "{0} is set by dptrain launch itself (give the run directory as launch's --run-dir; \
         each job resumes from its newest restart point; --overwrite is launch's own option, \
         before the --): leave it out of the train options"
    )]
    OwnedFlag(String),
    /// An option of launch itself is impossible.
    #[error("{0}")]
    Options(String),
    /// The run directory could not be made.
    #[error("--run-dir: {0}")]
    RunDir(crate::output::OutputError),
    /// A job's files (its hostfile, a probe's output) could not be written.
    #[error("cannot write a job's files: {0}")]
    JobFiles(crate::output::OutputError),
    /// Another run holds the run directory.
    #[error(transparent)]
    Lock(#[from] crate::train::lock::LockError),
    /// The heartbeat socket could not be opened.
    #[error("cannot listen for heartbeats on {addr}: {source}")]
    Listen {
        /// The address.
        addr: IpAddr,
        /// Why.
        source: std::io::Error,
    },
    /// mpirun could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// mpirun runs nothing, not even on this machine, and says so for every host: no host is
    /// to blame.
    #[error(
        "{mpirun} cannot run a process even on this machine ({status}), and says the same for \
         every host, so no host is to blame; mend what it says and launch again{}. It says: \
         {said}",
        relaunch_from(restart_point)
    )]
    MpirunFails {
        /// mpirun and its options.
        mpirun: String,
        /// How the one-rank job on this machine ended.
        status: String,
        /// The end of what it printed.
        said: String,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
    /// Fewer live hosts than `--min-hosts`.
    #[error(
        "{live} live host(s) left, fewer than --min-hosts {min}; {}",
        continue_with(restart_point)
    )]
    BelowMinHosts {
        /// Hosts alive.
        live: usize,
        /// `--min-hosts`.
        min: usize,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
    /// `--max-restarts` used up.
    #[error(
        "the run failed again after {max} restart(s) (--max-restarts); {}",
        continue_with(restart_point)
    )]
    TooManyRestarts {
        /// `--max-restarts`.
        max: usize,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
    /// The job failed before training a step, with every host alive: a problem no restart
    /// mends (options, data, the run directory).
    #[error(
        "the job failed before its first step with every host answering ({status}): its \
         own error is above; mend it and launch again{}",
        relaunch_from(restart_point)
    )]
    JobFailed {
        /// mpirun's exit.
        status: String,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
    /// mpirun ended well, but no rank ever sent a heartbeat: it ran something else.
    #[error(
        "{mpirun} ended well, but no rank sent a heartbeat, so it did not run dptrain train: \
         give --mpirun an mpirun (with its own options only) and launch again{}",
        relaunch_from(restart_point)
    )]
    NothingRan {
        /// mpirun and its options.
        mpirun: String,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
    /// No heartbeat reached the supervisor within `--start-timeout`, with every host
    /// answering: the ranks cannot reach `--listen`.
    #[error(
        "no rank's heartbeat reached {listen} within --start-timeout {timeout_s:.0} s, and \
         every host answers: give --listen the address the hosts reach this machine at (and \
         let UDP through to it); {}",
        continue_with(restart_point)
    )]
    NoHeartbeat {
        /// `--listen`.
        listen: IpAddr,
        /// `--start-timeout`, seconds.
        timeout_s: f64,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
}

/// Where a launch run again after a fault of its own (no host lost) continues from, if
/// anywhere.
fn relaunch_from(restart_point: &Option<PathBuf>) -> String {
    restart_point.as_ref().map_or(String::new(), |p| {
        format!(" (it continues from {}, the newest state)", p.display())
    })
}

fn continue_with(restart_point: &Option<PathBuf>) -> String {
    match restart_point {
        Some(p) => format!(
            "the newest state is {}: run dptrain launch again (or train --resume it)",
            p.display()
        ),
        None => "no restart point was written (give train --commit-every N)".into(),
    }
}
