//! Elastic training (`dptrain launch`): a supervisor that keeps an MPI run going when hosts are
//! lost, as torchrun's elastic agent and Horovod elastic do.
//!
//! ```text
//!  read the hostfile ──> live hosts (>= --min-hosts?) ──> newest restart point in the run dir
//!        ^                                                  (commit or epoch checkpoint)
//!        |                                                          |
//!        |                 mpirun -np <slots of live hosts> dptrain train ...
//!        |                    --transport mpi --heartbeat ADDR:PORT [--resume POINT]
//!        |                                                          |
//!        |             watch: each rank's heartbeat (a UDP datagram every 250 ms from a
//!        |             thread of its own: `train::heartbeat`), the job's exit
//!        |                                                          |
//!        +── restart (<= --max-restarts) <── a rank silent for --heartbeat-timeout: its host
//!                                            is dead; stop the job, drop the host
//!                                         <── the job failed after training some steps
//!                                            with every host beating: the same hosts
//!            done <── the job exited 0
//! ```
//!
//! Why heartbeats and not MPI's own errors: a frozen or unplugged host makes its peers wait in
//! a collective until `--comm-timeout` (minutes), and names nobody; its heartbeat stops at
//! once while the survivors' heartbeat threads go on, so the silent rank names the lost host
//! within the heartbeat timeout. Why restart the job rather than shrink it in place: MPI
//! communicators cannot lose a member without ULFM, which OpenMPI ships only as an option;
//! a restart from state committed every few steps (`train --commit-every`) costs seconds, and
//! the run continues exactly: the data order and learning rate depend on the global batch and
//! the step alone, not on the number of workers.
//!
//! Each job gets a heartbeat port of its own, so a frozen rank of an earlier job that wakes up
//! cannot pass for a live one. Everything that happened is in `elastic.json` in the run
//! directory ([`LaunchReport`]) and printed as it happens.

pub mod hostfile;

use crate::train::commit::newest_restart_point;
use crate::train::heartbeat::Beat;
use hostfile::Host;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Why an elastic run stopped before finishing.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The hostfile cannot be used.
    #[error(transparent)]
    Hostfile(#[from] hostfile::HostfileError),
    /// A `train` option the supervisor owns was given.
    #[error(
        "{0} is set by dptrain launch itself (give the run directory as launch's --run-dir; \
         each job resumes from its newest restart point): leave it out of the train options"
    )]
    OwnedFlag(String),
    /// An option of launch itself is impossible.
    #[error("{0}")]
    Options(String),
    /// The run directory could not be made.
    #[error("--run-dir: {0}")]
    RunDir(crate::output::OutputError),
    /// A job's hostfile could not be written.
    #[error("cannot write a job's hostfile: {0}")]
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
         own error is above; {}",
        continue_with(restart_point)
    )]
    JobFailed {
        /// mpirun's exit.
        status: String,
        /// The newest restart point.
        restart_point: Option<PathBuf>,
    },
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

/// How one job ended.
enum JobEnd {
    Finished,
    /// Hosts that fell silent (their first silent rank each, its last beat), when that was
    /// found; the job stopped since.
    Lost(Vec<(Host, usize, Instant)>, Instant),
    /// The job failed (how), or did not start in time; the hosts of ranks that never beat
    /// (their first such rank each).
    Failed(String, Vec<(Host, usize)>),
}

/// The supervisor's clock and report.
struct Supervisor<'a> {
    cfg: &'a LaunchConfig,
    started: Instant,
    report: LaunchReport,
    say: &'a dyn Fn(&str),
}

/// Runs the elastic run `cfg` describes to its end; `say` gets a line for each event. Returns
/// the report (also written to `elastic.json` in the run directory) and how it ended.
pub fn launch(cfg: &LaunchConfig, say: &dyn Fn(&str)) -> (LaunchReport, Result<(), LaunchError>) {
    let mut s = Supervisor {
        cfg,
        started: Instant::now(),
        report: LaunchReport::default(),
        say,
    };
    let result = s.run();
    if cfg.run_dir.is_dir() {
        let json = serde_json::to_vec_pretty(&s.report).unwrap_or_default();
        if let Err(e) = crate::output::write_atomically(&cfg.run_dir.join("elastic.json"), &json) {
            say(&format!("cannot write elastic.json: {e}"));
        }
        // The last job drew the report before the lost hosts were all written down.
        if cfg.run_dir.join("metrics.jsonl").is_file() {
            if let Err(e) = crate::report::write_run_report(&cfg.run_dir) {
                say(&format!(
                    "cannot redraw the run report with the lost hosts: {e}"
                ));
            }
        }
    }
    (s.report, result)
}

impl Supervisor<'_> {
    fn secs(&self, t: Instant) -> f64 {
        t.duration_since(self.started).as_secs_f64()
    }

    fn run(&mut self) -> Result<(), LaunchError> {
        self.check()?;
        hostfile::read(&self.cfg.hostfile)?;
        // The run directory is the launch's across its jobs: a lost host's frozen rank 0
        // cannot keep the next job out of it.
        crate::output::create_dir(&self.cfg.run_dir).map_err(LaunchError::RunDir)?;
        let _lock = crate::train::lock::RunDirLock::take(&self.cfg.run_dir)?;
        let mut lost: Vec<String> = Vec::new();
        let mut restarts = 0;
        loop {
            let listed = hostfile::read(&self.cfg.hostfile)?;
            self.take_back(&listed, &mut lost)?;
            let hosts: Vec<Host> = listed
                .into_iter()
                .filter(|h| !lost.contains(&h.name))
                .collect();
            let restart_point = newest_restart_point(&self.cfg.run_dir);
            if hosts.len() < self.cfg.min_hosts {
                return Err(LaunchError::BelowMinHosts {
                    live: hosts.len(),
                    min: self.cfg.min_hosts,
                    restart_point: restart_point.map(|(p, _)| p),
                });
            }
            let (hosts, spares) = split_for_batch(hosts, batch_split(&self.cfg.train_args));
            if !spares.is_empty() {
                let names: Vec<&str> = spares.iter().map(|h| h.name.as_str()).collect();
                (self.say)(&format!(
                    "{} wait(s) as spare: the global batch does not split evenly over every \
                     live host's ranks",
                    names.join(" ")
                ));
            }
            match self.run_job(&hosts, restart_point)? {
                JobEnd::Finished => {
                    self.report.finished = true;
                    return Ok(());
                }
                JobEnd::Lost(gone, detected) => {
                    let gone = gone.into_iter().map(|(h, r, last)| (h, r, last, detected));
                    self.lose(gone, &mut lost);
                }
                JobEnd::Failed(status, never_beat) => {
                    self.after_failure(status, &never_beat, &mut lost)?
                }
            }
            restarts += 1;
            if restarts > self.cfg.max_restarts {
                return Err(LaunchError::TooManyRestarts {
                    max: self.cfg.max_restarts,
                    restart_point: newest_restart_point(&self.cfg.run_dir).map(|(p, _)| p),
                });
            }
        }
    }

    /// Records lost hosts: (host, its first rank, its last beat, when it was found lost).
    fn lose(
        &mut self,
        gone: impl Iterator<Item = (Host, usize, Instant, Instant)>,
        lost: &mut Vec<String>,
    ) {
        for (host, rank, last, detected) in gone {
            self.report.failures.push(Failure {
                host: host.name.clone(),
                job: self.report.jobs.len(),
                rank,
                last_beat_s: self.secs(last),
                detected_s: self.secs(detected),
                running_again_s: None,
                steps_redone: None,
            });
            lost.push(host.name);
        }
    }

    /// A job that failed with every rank beating: restart it if it trained past its restart
    /// point. One that failed before training: a host lost while it started (its ranks never
    /// beat and it does not answer a probe) is dropped; with every host answering the failure
    /// is the job's own (options, data, the run directory), which no restart mends.
    fn after_failure(
        &mut self,
        status: String,
        never_beat: &[(Host, usize)],
        lost: &mut Vec<String>,
    ) -> Result<(), LaunchError> {
        let job = self.report.jobs.last().expect("a job ran");
        let resumed = job.resumed_from.as_ref().map_or(0, |(_, s)| *s);
        let started = self.started + Duration::from_secs_f64(job.started_s);
        if job.last_step.is_some_and(|s| s > resumed) {
            (self.say)(&format!(
                "the job failed ({status}) after training, before any host fell silent: restarting it on the same hosts"
            ));
            return Ok(());
        }
        let gone = self.unreachable(never_beat)?;
        if gone.is_empty() {
            return Err(LaunchError::JobFailed {
                status,
                restart_point: newest_restart_point(&self.cfg.run_dir).map(|(p, _)| p),
            });
        }
        let detected = Instant::now();
        for (host, rank) in &gone {
            (self.say)(&format!(
                "host {} (rank {rank}) lost while the job started: it does not answer",
                host.name
            ));
        }
        self.lose(
            gone.into_iter().map(|(h, r)| (h, r, started, detected)),
            lost,
        );
        Ok(())
    }

    /// Of `suspects` (hosts whose ranks never beat in a job that failed), those that do not
    /// answer a probe.
    fn unreachable(&self, suspects: &[(Host, usize)]) -> Result<Vec<(Host, usize)>, LaunchError> {
        let hosts: Vec<&Host> = suspects.iter().map(|(h, _)| h).collect();
        let answered = self.probe(&hosts)?;
        Ok(suspects
            .iter()
            .filter(|(h, _)| !answered.contains(&h.name))
            .cloned()
            .collect())
    }

    /// At a restart point: the lost hosts still listed that answer a probe are lost no more.
    fn take_back(&mut self, listed: &[Host], lost: &mut Vec<String>) -> Result<(), LaunchError> {
        let candidates: Vec<&Host> = listed.iter().filter(|h| lost.contains(&h.name)).collect();
        for name in self.probe(&candidates)? {
            (self.say)(&format!("host {name} answers again: it joins the next job"));
            lost.retain(|l| *l != name);
        }
        Ok(())
    }

    /// The names of `hosts` that answer a probe: a one-rank job running `dptrain --version`
    /// there that ends well within [`PROBE_TIMEOUT`]. All are probed at once.
    fn probe(&self, hosts: &[&Host]) -> Result<Vec<String>, LaunchError> {
        let mut probes = Vec::new();
        for h in hosts {
            let files = JobFiles::new(std::slice::from_ref(*h))?;
            let child = Command::new(&self.cfg.mpirun[0])
                .args(&self.cfg.mpirun[1..])
                .arg("--hostfile")
                .arg(&files.hostfile)
                .args(["-np", "1"])
                .arg(&self.cfg.program)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|source| LaunchError::Spawn {
                    program: self.cfg.mpirun[0].clone(),
                    source,
                })?;
            probes.push((h.name.clone(), child, files, None));
        }
        let deadline = Instant::now() + PROBE_TIMEOUT;
        while Instant::now() < deadline && probes.iter().any(|p| p.3.is_none()) {
            for p in probes.iter_mut().filter(|p| p.3.is_none()) {
                p.3 = p.1.try_wait().ok().flatten().map(|s| s.success());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut answered = Vec::new();
        for (name, mut child, _files, ended) in probes {
            if ended.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            if ended == Some(true) {
                answered.push(name);
            }
        }
        Ok(answered)
    }

    fn check(&self) -> Result<(), LaunchError> {
        for a in &self.cfg.train_args {
            let flag = a.split('=').next().unwrap_or(a);
            if OWNED_TRAIN_FLAGS.contains(&flag) {
                return Err(LaunchError::OwnedFlag(flag.to_string()));
            }
        }
        if self.cfg.min_hosts == 0 {
            return Err(LaunchError::Options(
                "--min-hosts 0: a run needs at least one host".into(),
            ));
        }
        if self.cfg.heartbeat_timeout < 4 * crate::train::heartbeat::INTERVAL {
            return Err(LaunchError::Options(format!(
                "--heartbeat-timeout must be at least {:.1} s (4 heartbeats), or a late \
                 datagram would lose a live host",
                (4 * crate::train::heartbeat::INTERVAL).as_secs_f64()
            )));
        }
        if self.cfg.mpirun.is_empty() {
            return Err(LaunchError::Options("--mpirun is empty".into()));
        }
        Ok(())
    }

    /// Starts one job on `hosts` from `restart_point` and watches it to its end.
    fn run_job(
        &mut self,
        hosts: &[Host],
        restart_point: Option<(PathBuf, crate::train::checkpoint::TrainState)>,
    ) -> Result<JobEnd, LaunchError> {
        let listen = self.cfg.listen;
        let socket = UdpSocket::bind(SocketAddr::new(listen, 0))
            .and_then(|s| {
                s.set_read_timeout(Some(Duration::from_millis(100)))
                    .map(|_| s)
            })
            .map_err(|source| LaunchError::Listen {
                addr: listen,
                source,
            })?;
        let addr = socket.local_addr().map_err(|source| LaunchError::Listen {
            addr: listen,
            source,
        })?;
        let scratch = JobFiles::new(hosts)?;
        let ranks: usize = hosts.iter().map(|h| h.slots).sum();
        let resumed_from = restart_point.map(|(p, s)| (p, s.global_step));
        let mut cmd = Command::new(&self.cfg.mpirun[0]);
        cmd.args(&self.cfg.mpirun[1..])
            .arg("--hostfile")
            .arg(&scratch.hostfile)
            .args(["-np", &ranks.to_string()])
            .arg(&self.cfg.program)
            .arg("train")
            .args(&self.cfg.train_args)
            .args(["--transport", "mpi", "--heartbeat", &addr.to_string()])
            .args(["--launched-by", &std::process::id().to_string()])
            .arg("--run-dir")
            .arg(&self.cfg.run_dir)
            .stdin(Stdio::null());
        match &resumed_from {
            Some((p, _)) => {
                cmd.arg("--resume").arg(p);
            }
            // A job before it wrote any restart point left only files of its own.
            None if !self.report.jobs.is_empty() => {
                cmd.arg("--overwrite");
            }
            None => {}
        }
        let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
        (self.say)(&format!(
            "job {}: {ranks} rank(s) on {} ({}){}",
            self.report.jobs.len() + 1,
            names.len(),
            names.join(" "),
            resumed_from
                .as_ref()
                .map_or(String::new(), |(p, s)| format!(
                    ", resuming {} (step {s})",
                    p.display()
                ))
        ));
        let started = Instant::now();
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            program: self.cfg.mpirun[0].clone(),
            source,
        })?;
        self.report.jobs.push(Job {
            hosts: names,
            resumed_from,
            started_s: self.secs(started),
            first_step_s: None,
            ended_s: 0.0,
            last_step: None,
            outcome: String::new(),
        });
        let end = self.watch(child, &socket, hosts, ranks, started);
        drop(scratch);
        let now = self.secs(Instant::now());
        let job = self.report.jobs.last_mut().expect("pushed above");
        job.ended_s = now;
        job.outcome = match &end {
            JobEnd::Finished => "finished".into(),
            JobEnd::Lost(..) => "host lost".into(),
            JobEnd::Failed(s, _) => format!("failed ({s})"),
        };
        Ok(end)
    }

    /// Watches a running job: its exit, and each rank's heartbeat.
    fn watch(
        &mut self,
        mut child: Child,
        socket: &UdpSocket,
        hosts: &[Host],
        ranks: usize,
        started: Instant,
    ) -> JobEnd {
        let mut last_beat: Vec<Option<Instant>> = vec![None; ranks];
        let resumed = self
            .report
            .jobs
            .last()
            .and_then(|j| j.resumed_from.as_ref());
        let resumed = resumed.map_or(0, |(_, s)| *s);
        let mut buf = [0u8; 128];
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                if status.success() {
                    return JobEnd::Finished;
                }
                let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
                return JobEnd::Failed(status.to_string(), never_beat);
            }
            if let Ok(n) = socket.recv(&mut buf) {
                if let Some(beat) = Beat::parse(&buf[..n]).filter(|b| b.rank < ranks) {
                    let now = Instant::now();
                    last_beat[beat.rank] = Some(now);
                    if let Some(steps) = beat.steps {
                        self.saw_steps(steps, resumed, now);
                    }
                }
            }
            let now = Instant::now();
            // A rank that beat and fell silent: its host is lost.
            let silent = first_rank_per_host(
                hosts,
                last_beat
                    .iter()
                    .map(|t| t.is_some_and(|t| now.duration_since(t) > self.cfg.heartbeat_timeout)),
            );
            if !silent.is_empty() {
                let silent: Vec<_> = silent
                    .into_iter()
                    .map(|(h, r)| (h, r, last_beat[r].expect("it beat")))
                    .collect();
                for (h, r, last) in &silent {
                    (self.say)(&format!(
                        "host {} (rank {r}) lost: silent for {:.1} s; stopping the job",
                        h.name,
                        now.duration_since(*last).as_secs_f64()
                    ));
                }
                stop_job(&mut child);
                return JobEnd::Lost(silent, now);
            }
            // Ranks that never beat: the job did not start (MPI waits for every rank before
            // any can beat); which hosts are to blame is for a probe to say.
            if now.duration_since(started) > self.cfg.start_timeout
                && last_beat.iter().any(Option::is_none)
            {
                stop_job(&mut child);
                let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
                let why = format!(
                    "not started within --start-timeout {:.0} s",
                    self.cfg.start_timeout.as_secs_f64()
                );
                return JobEnd::Failed(why, never_beat);
            }
        }
    }

    /// A rank reported `steps` done: the job's progress, and the previous failures' restart
    /// time and steps redone once this job trains past its restart point.
    fn saw_steps(&mut self, steps: usize, resumed: usize, now: Instant) {
        let at = self.secs(now);
        let job = self.report.jobs.last_mut().expect("a job runs");
        job.last_step = job.last_step.max(Some(steps));
        if steps <= resumed || job.first_step_s.is_some() {
            return;
        }
        job.first_step_s = Some(at);
        let jobs = &self.report.jobs;
        for f in self.report.failures.iter_mut() {
            if f.running_again_s.is_none() {
                f.running_again_s = Some(at);
                // The steps the failed job had done past this job's restart point.
                let before = jobs[f.job - 1].last_step.unwrap_or(0);
                f.steps_redone = Some(before.saturating_sub(resumed));
            }
        }
        (self.say)(&format!("job {} is training (step {steps})", jobs.len()));
    }
}

/// Stops a job: SIGTERM to mpirun (which passes it to the ranks it can reach), SIGKILL if it
/// has not ended within [`STOP_GRACE`] (a lost host's daemon can keep it waiting), then reaps
/// it. Killed, mpirun's daemons on the live hosts lose it and end their ranks themselves.
fn stop_job(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The hosts of the ranks (in rank order) for which `marked` is true, each once, with its
/// first such rank.
fn first_rank_per_host(hosts: &[Host], marked: impl Iterator<Item = bool>) -> Vec<(Host, usize)> {
    let mut found: Vec<(Host, usize)> = Vec::new();
    for (r, _) in marked.enumerate().filter(|(_, m)| *m) {
        match hostfile::host_of_rank(hosts, r) {
            Some(h) if !found.iter().any(|(x, _)| x.name == h.name) => found.push((h.clone(), r)),
            _ => {}
        }
    }
    found
}

/// The global batch and workers per rank that `train_args` give (the defaults where absent),
/// or `None` when a `--config` file may set them or a value does not parse (train says why).
fn batch_split(train_args: &[String]) -> Option<(usize, usize)> {
    let (mut batch, mut workers) = (crate::config::DEFAULT_BATCH, crate::config::DEFAULT_WORKERS);
    let mut args = train_args.iter();
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

/// `hosts` cut to the most leading ones over whose ranks x `workers` the global `batch`
/// splits evenly (train refuses any other), and the rest, spares until a restart needs them.
/// All of them when nothing splits it or the split is unknown: train then says why.
fn split_for_batch(hosts: Vec<Host>, split: Option<(usize, usize)>) -> (Vec<Host>, Vec<Host>) {
    let Some((batch, workers)) = split else {
        return (hosts, Vec::new());
    };
    let fits = |k: usize| {
        let ranks: usize = hosts[..k].iter().map(|h| h.slots).sum();
        ranks * workers > 0 && batch.is_multiple_of(ranks * workers)
    };
    match (1..=hosts.len()).rev().find(|&k| fits(k)) {
        Some(k) => {
            let mut used = hosts;
            let spares = used.split_off(k);
            (used, spares)
        }
        None => (hosts, Vec::new()),
    }
}

/// How long a lost host has to answer the probe at a restart point.
const PROBE_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a stopped job's mpirun may take to end before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The files of one job (its hostfile), in a directory of their own removed afterwards.
struct JobFiles {
    dir: PathBuf,
    hostfile: PathBuf,
}

impl JobFiles {
    fn new(hosts: &[Host]) -> Result<Self, LaunchError> {
        let dir = std::env::temp_dir().join(format!(
            "dptrain-launch-{}-{}",
            std::process::id(),
            JOB_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        crate::output::create_dir(&dir).map_err(LaunchError::JobFiles)?;
        let hostfile = dir.join("hostfile");
        crate::output::write_new_file(&hostfile, hostfile::render(hosts).as_bytes())
            .map_err(LaunchError::JobFiles)?;
        Ok(Self { dir, hostfile })
    }
}

static JOB_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for JobFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<Host> {
        (1..=n)
            .map(|i| Host {
                name: format!("h{i}"),
                slots: 1,
            })
            .collect()
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_batch_and_workers_are_read_from_the_train_options() {
        assert_eq!(batch_split(&args(&[])), Some((64, 1)));
        assert_eq!(
            batch_split(&args(&["--batch", "96", "--workers=2"])),
            Some((96, 2))
        );
        assert_eq!(batch_split(&args(&["--config", "run.toml"])), None);
        assert_eq!(batch_split(&args(&["--batch", "x"])), None);
    }

    #[test]
    fn survivors_the_batch_does_not_split_over_wait_as_spares() {
        let (used, spares) = split_for_batch(hosts(3), Some((64, 1)));
        assert_eq!((used.len(), spares.len()), (2, 1));
        assert_eq!(spares[0].name, "h3");
        let (used, spares) = split_for_batch(hosts(3), Some((96, 2)));
        assert_eq!((used.len(), spares.len()), (3, 0));
        let (used, _) = split_for_batch(hosts(3), None);
        assert_eq!(used.len(), 3);
    }
}
