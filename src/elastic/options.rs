//! What `dptrain launch` was asked to do, and what it refuses before any job starts.

use super::error::LaunchError;
use super::hostfile;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What `dptrain launch` was asked to do.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// The hosts (OpenMPI hostfile), read again at every restart point.
    pub hostfile: PathBuf,
    /// The run directory: where the restart points are, passed to every job.
    pub run_dir: PathBuf,
    /// Fewest hosts to run on; below it the run stops.
    pub min_hosts: usize,
    /// Restarts allowed after failures.
    pub max_restarts: usize,
    /// A rank silent this long is lost.
    pub heartbeat_timeout: Duration,
    /// A rank that has not beaten this long after its job started is lost (mpirun must start
    /// it and it must load its data first).
    pub start_timeout: Duration,
    /// The address the ranks send their heartbeats to (this machine's, as they reach it).
    pub listen: IpAddr,
    /// mpirun and its own options, without `--hostfile` and `-np` (set per job).
    pub mpirun: Vec<String>,
    /// The dptrain binary the ranks run.
    pub program: PathBuf,
    /// `train`'s options, as for one job (without `--run-dir`, `--resume`, `--transport`,
    /// `--heartbeat`: the supervisor sets those).
    pub train_args: Vec<String>,
    /// `--overwrite`: a run directory holding another run's files and no restart point is
    /// cleared by the first job (passed to it as train's `--overwrite`).
    pub overwrite: bool,
}

/// `train` options the supervisor sets itself, refused in [`LaunchConfig::train_args`].
const OWNED_TRAIN_FLAGS: [&str; 6] = [
    "--run-dir",
    "--resume",
    "--transport",
    "--heartbeat",
    "--launched-by",
    "--overwrite",
];

/// mpirun options launch sets itself (per job) or whose effect it relies on, refused in
/// [`LaunchConfig::mpirun`].
const OWNED_MPIRUN_FLAGS: [&str; 29] = [
    "--hostfile",
    "-hostfile",
    "--machinefile",
    "-machinefile",
    "--host",
    "-host",
    "-H",
    "-np",
    "--np",
    "-n",
    "-c",
    "--map-by",
    "-map-by",
    "--rankfile",
    "-rankfile",
    "-rf",
    "--npernode",
    "-npernode",
    "--bynode",
    "-bynode",
    "--byslot",
    "-byslot",
    // Processes per node and rank order: other ways to a rank -> host map not by slot.
    "-N",
    "--pernode",
    "-pernode",
    "--ppr",
    "-ppr",
    "--rank-by",
    "-rank-by",
];

impl LaunchConfig {
    /// Refuses what no job could run with, before anything starts.
    pub fn check(&self) -> Result<(), LaunchError> {
        for a in &self.train_args {
            let flag = a.split('=').next().unwrap_or(a);
            if OWNED_TRAIN_FLAGS.contains(&flag) {
                return Err(LaunchError::OwnedFlag(flag.to_string()));
            }
        }
        if self.min_hosts == 0 {
            return Err(LaunchError::Options(
                "--min-hosts 0: a run needs at least one host".into(),
            ));
        }
        if self.heartbeat_timeout < 4 * crate::train::heartbeat::INTERVAL {
            return Err(LaunchError::Options(format!(
                "--heartbeat-timeout must be at least {:.1} s (4 heartbeats), or a late \
                 datagram would lose a live host",
                (4 * crate::train::heartbeat::INTERVAL).as_secs_f64()
            )));
        }
        if self.listen.is_loopback() {
            let here = crate::train::lock::hostname();
            let hosts = hostfile::read(&self.hostfile)?;
            if let Some(far) = hosts.iter().find(|h| !is_this_machine(&h.name, &here)) {
                return Err(LaunchError::Options(format!(
                    "--listen {} is this machine's loopback, which host {} cannot reach: give \
                     --listen the address the hosts reach this machine at",
                    self.listen, far.name
                )));
            }
        }
        if let Some(flag) = self
            .mpirun
            .iter()
            .map(|a| a.split('=').next().unwrap_or(a))
            .find(|flag| OWNED_MPIRUN_FLAGS.contains(flag))
        {
            return Err(LaunchError::Options(format!(
                "--mpirun: {flag} is set by dptrain launch itself (the hosts, the rank count and \
                 the mapping, `--map-by slot`, by which a heartbeat's rank names its host): \
                 leave it out"
            )));
        }
        if self.mpirun.is_empty() {
            return Err(LaunchError::Options("--mpirun is empty".into()));
        }
        Ok(())
    }

    /// The global batch and workers per rank the train options give (where absent, those of
    /// the run resumed, `resumed`: its batch and the workers per process a resume over MPI
    /// takes, `train::follow::followed_workers`, which train follows; else the defaults), or
    /// `None` when a `--config` file may set them or a value does not parse (train says why).
    pub fn batch_split(&self, resumed: Option<(usize, Option<usize>)>) -> Option<(usize, usize)> {
        let (mut batch, mut workers) = (
            resumed.map_or(crate::config::DEFAULT_BATCH, |(b, _)| b),
            resumed
                .and_then(|(_, w)| w)
                .unwrap_or(crate::config::DEFAULT_WORKERS),
        );
        let mut args = self.train_args.iter();
        while let Some(a) = args.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let mut value = || inline.clone().or_else(|| args.next().cloned());
            match flag {
                "--config" => return None,
                "--batch" => batch = value()?.parse().ok()?,
                "--workers" => workers = value()?.parse().ok()?,
                _ => {}
            }
        }
        Some((batch, workers))
    }
}

/// Whether hostfile name `name` is this machine (named `here`), as a loopback heartbeat
/// address can be reached from.
fn is_this_machine(name: &str, here: &str) -> bool {
    name == "localhost" || name == here || name.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_train_args(a: &[&str]) -> LaunchConfig {
        LaunchConfig {
            hostfile: PathBuf::new(),
            run_dir: PathBuf::new(),
            min_hosts: 1,
            max_restarts: 0,
            heartbeat_timeout: Duration::from_secs(10),
            start_timeout: Duration::from_secs(10),
            listen: IpAddr::from([127, 0, 0, 1]),
            mpirun: vec!["mpirun".into()],
            program: PathBuf::new(),
            train_args: a.iter().map(|s| s.to_string()).collect(),
            overwrite: false,
        }
    }

    #[test]
    fn the_batch_and_workers_are_read_from_the_train_options() {
        let split = |a: &[&str]| with_train_args(a).batch_split(None);
        assert_eq!(split(&[]), Some((64, 1)));
        // A resume takes its run's batch where --batch is not given; a given one wins.
        let resumed = |a: &[&str]| with_train_args(a).batch_split(Some((48, None)));
        assert_eq!(resumed(&[]), Some((48, 1)));
        assert_eq!(resumed(&["--batch", "96"]), Some((96, 1)));
        // And its workers per process, where a resume over MPI takes them.
        let two = |a: &[&str]| with_train_args(a).batch_split(Some((48, Some(2))));
        assert_eq!(two(&[]), Some((48, 2)));
        assert_eq!(two(&["--workers", "3"]), Some((48, 3)));
        assert_eq!(split(&["--batch", "96", "--workers=2"]), Some((96, 2)));
        assert_eq!(split(&["--config", "run.toml"]), None);
        assert_eq!(split(&["--batch", "x"]), None);
    }

    #[test]
    fn only_this_machine_reaches_a_loopback_listener() {
        for name in ["localhost", "127.0.0.1", "::1", "node7"] {
            assert!(is_this_machine(name, "node7"), "{name}");
        }
        for name in ["10.0.0.2", "node8"] {
            assert!(!is_this_machine(name, "node7"), "{name}");
        }
    }
}
