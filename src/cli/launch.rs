//! `dptrain launch`: an elastic run over MPI (`crate::elastic`), which outlives lost hosts.

use crate::elastic::{self, LaunchConfig};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub(super) struct LaunchArgs {
    /// The hosts, as OpenMPI's hostfile (`HOST slots=N` per line), read again at every
    /// restart: a host added to it joins the next job.
    #[arg(long)]
    hostfile: PathBuf,
    /// The run directory: every job trains into it and resumes from its newest restart point
    /// (`train --commit-every N` writes one every N steps).
    #[arg(long)]
    run_dir: PathBuf,
    /// Fewest hosts to go on with; below it the run stops, naming its newest state.
    #[arg(long, default_value_t = 1)]
    min_hosts: usize,
    /// Restarts allowed after failures before the run stops.
    #[arg(long, default_value_t = 3)]
    max_restarts: usize,
    /// Seconds a rank may be silent before its host is taken for lost.
    #[arg(long, default_value_t = 10.0)]
    heartbeat_timeout: f64,
    /// Seconds a job's rank may take to send its first heartbeat (mpirun starts it, it loads
    /// its data).
    #[arg(long, default_value_t = 120.0)]
    start_timeout: f64,
    /// This machine's address as the ranks reach it: where they send heartbeats.
    #[arg(long, default_value = "127.0.0.1")]
    listen: std::net::IpAddr,
    /// The mpirun command and its options (split at spaces), without --hostfile and -np,
    /// which each job gets from the live hosts.
    #[arg(long, default_value = "mpirun")]
    mpirun: String,
    /// Delete the files of another run in --run-dir first, where it holds no restart point
    /// to resume from (train's --overwrite, given to the first job).
    #[arg(long)]
    overwrite: bool,
    /// `train`'s options (after `--`, optionally after the word `train`), without --run-dir,
    /// --resume, --transport and --heartbeat, which launch sets.
    #[arg(last = true)]
    train: Vec<String>,
}

fn seconds(flag: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero() && *d <= Duration::from_secs(86_400))
        .ok_or_else(|| format!("{flag} {s}: give seconds from above 0 to 86400"))
}

/// Runs the elastic run; prints each event and, at the end, the failures' timeline.
pub(super) fn run(a: LaunchArgs) -> Result<(), String> {
    let program = std::env::current_exe()
        .map_err(|e| format!("cannot find the dptrain binary to launch: {e}"))?;
    let cfg = LaunchConfig {
        hostfile: a.hostfile,
        run_dir: a.run_dir,
        min_hosts: a.min_hosts,
        max_restarts: a.max_restarts,
        heartbeat_timeout: seconds("--heartbeat-timeout", a.heartbeat_timeout)?,
        start_timeout: seconds("--start-timeout", a.start_timeout)?,
        listen: a.listen,
        mpirun: a.mpirun.split_whitespace().map(String::from).collect(),
        program,
        // `-- train --batch 96` reads as `-- --batch 96`.
        train_args: match a.train.split_first() {
            Some((first, rest)) if first == "train" => rest.to_vec(),
            _ => a.train,
        },
        overwrite: a.overwrite,
    };
    let say = |line: &str| eprintln!("launch: {line}");
    let (report, result) = elastic::launch(&cfg, &say);
    for f in &report.failures {
        say(&format!(
            "lost {} (rank {}): last heartbeat at {:.1} s, detected at {:.1} s, training again \
             at {}, steps redone {}",
            f.host,
            f.rank,
            f.last_beat_s,
            f.detected_s,
            f.running_again_s
                .map_or("-".into(), |t| format!("{t:.1} s")),
            f.steps_redone.map_or("-".into(), |n| n.to_string()),
        ));
    }
    result.map_err(|e| e.to_string())
}
