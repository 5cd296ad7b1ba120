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
//! the run continues with the same data order and learning rates: they depend on the global
//! batch and the step alone, not on the number of workers (bit for bit on the same number of
//! workers; on fewer, the same gradients summed in another grouping round differently).
//!
//! The files: this one is the policy (what a failure means, when to restart, whom to drop
//! and take back); `job.rs` runs one job (mpirun started, its exit and heartbeats watched, it
//! stopped) and the probe; `hostfile.rs` the hosts and which of them a job uses; `options.rs`
//! what was asked and what is refused before anything starts; `report.rs` the record
//! (`elastic.json`); `error.rs` why a run stopped.
//!
//! Each job gets a heartbeat port of its own, so a frozen rank of an earlier job that wakes up
//! cannot pass for a live one. Everything that happened is in `elastic.json` in the run
//! directory ([`LaunchReport`]) and printed as it happens.

pub mod error;
pub mod hostfile;
mod job;
pub mod options;
pub mod report;

pub use error::LaunchError;
use hostfile::Host;
use job::{Failed, JobEnd, JobEvents, JobSpec};
pub use options::LaunchConfig;
pub use report::{Failure, Job, LaunchReport};

use crate::train::rundir::newest_restart_point;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The supervisor's clock and report.
struct Supervisor<'a> {
    cfg: &'a LaunchConfig,
    started: Instant,
    report: LaunchReport,
    say: &'a dyn Fn(&str),
    /// The run directory's lock, held from the first job until `elastic.json` and the report
    /// are written.
    lock: Option<crate::train::lock::RunDirLock>,
}

/// Runs the elastic run `cfg` describes to its end; `say` gets a line for each event. Returns
/// the report (also written to `elastic.json` in the run directory) and how it ended.
pub fn launch(cfg: &LaunchConfig, say: &dyn Fn(&str)) -> (LaunchReport, Result<(), LaunchError>) {
    let mut s = Supervisor {
        cfg,
        started: Instant::now(),
        report: LaunchReport::default(),
        say,
        lock: None,
    };
    let result = s.run();
    // A launch that started no job has nothing to report, and its report would be another
    // run's file in the directory the corrected launch is given.
    if cfg.run_dir.is_dir() && !s.report.jobs.is_empty() {
        let json = serde_json::to_vec_pretty(&s.report).unwrap_or_default();
        if let Err(e) = crate::output::write_atomically(
            &cfg.run_dir.join("elastic.json"),
            &json,
            &report::ELASTIC_FILE,
        ) {
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
    drop(s.lock.take());
    (s.report, result)
}

impl Supervisor<'_> {
    fn secs(&self, t: Instant) -> f64 {
        t.duration_since(self.started).as_secs_f64()
    }

    fn run(&mut self) -> Result<(), LaunchError> {
        self.cfg.check()?;
        hostfile::read(&self.cfg.hostfile)?;
        // The run directory is the launch's across its jobs: a lost host's frozen rank 0
        // cannot keep the next job out of it.
        // A launch that fails before any job wrote there leaves no empty directory it made.
        let mut created = crate::output::CreatedDirs::default();
        created
            .create(&self.cfg.run_dir)
            .map_err(LaunchError::RunDir)?;
        let lock = crate::train::lock::RunDirLock::take(&self.cfg.run_dir)?;
        self.lock = Some(lock.removing_on_release(created));
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
            // What the resumed ranks follow where the train options do not say.
            let resumed_run = restart_point.as_ref().and_then(|(_, s)| s.run.as_ref());
            let resumed = resumed_run.map(|run| {
                let workers = crate::train::follow::followed_workers(run, false);
                (run.batch, workers)
            });
            let (hosts, spares) = hostfile::split_for_batch(hosts, self.cfg.batch_split(resumed));
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
        how: Failed,
        never_beat: &[(Host, usize)],
        lost: &mut Vec<String>,
    ) -> Result<(), LaunchError> {
        let job = self.report.jobs.last().expect("a job ran");
        let resumed = job.resumed_from.as_ref().map_or(0, |(_, s)| *s);
        let started = self.started + Duration::from_secs_f64(job.started_s);
        if job.last_step.is_some_and(|s| s > resumed) {
            (self.say)(&format!(
                "the job failed ({how}) after training, before any host fell silent: \
                 restarting it on the same hosts"
            ));
            return Ok(());
        }
        let gone = self.unreachable(never_beat)?;
        if gone.is_empty() {
            let restart_point = newest_restart_point(&self.cfg.run_dir).map(|(p, _)| p);
            return Err(match how {
                Failed::Exited(status) => LaunchError::JobFailed {
                    status,
                    restart_point,
                },
                Failed::NothingRan => LaunchError::NothingRan {
                    mpirun: self.cfg.mpirun.join(" "),
                    restart_point,
                },
                Failed::NoHeartbeat { any_beat: false } => LaunchError::NoHeartbeat {
                    listen: self.cfg.listen,
                    timeout_s: self.cfg.start_timeout.as_secs_f64(),
                    restart_point,
                },
                Failed::NoHeartbeat { any_beat: true } => {
                    let silent: Vec<String> = never_beat
                        .iter()
                        .map(|(h, r)| format!("{} (rank {r})", h.name))
                        .collect();
                    LaunchError::JobFailed {
                        status: format!(
                            "{} sent no heartbeat within --start-timeout {:.0} s while the \
                             others did, and every host answers a probe",
                            silent.join(", "),
                            self.cfg.start_timeout.as_secs_f64()
                        ),
                        restart_point,
                    }
                }
            });
        }
        let detected = Instant::now();
        for (host, rank, said) in &gone {
            (self.say)(&format!(
                "host {} (rank {rank}) lost while the job started: it does not answer \
                 (its probe: {})",
                host.name,
                first_words(said)
            ));
        }
        self.lose(
            gone.into_iter().map(|(h, r, _)| (h, r, started, detected)),
            lost,
        );
        Ok(())
    }

    /// Of `suspects` (hosts whose ranks never beat in a job that failed), those that do not
    /// answer a probe, each with the end of what its probe printed. When none answers and
    /// mpirun fails on this machine too, printing what it printed for every host, the fault
    /// is mpirun's (as root without OpenMPI's consent, a bad mpirun option), not the hosts'.
    fn unreachable(
        &self,
        suspects: &[(Host, usize)],
    ) -> Result<Vec<(Host, usize, String)>, LaunchError> {
        let hosts: Vec<&Host> = suspects.iter().map(|(h, _)| h).collect();
        let results = job::probe(self.cfg, &hosts)?;
        if !results.is_empty() && results.iter().all(|r| !r.answered) {
            if let Some(here) = job::mpirun_fails_here(self.cfg)? {
                if results
                    .iter()
                    .all(|r| r.ended.is_some() && r.said == here.said)
                {
                    return Err(LaunchError::MpirunFails {
                        // As --mpirun gave it (split at white space: no word holds any).
                        mpirun: self.cfg.mpirun.join(" "),
                        status: here.ended.unwrap_or_default(),
                        said: here.said,
                        restart_point: newest_restart_point(&self.cfg.run_dir).map(|(p, _)| p),
                    });
                }
            }
        }
        Ok(suspects
            .iter()
            .zip(results)
            .filter(|(_, r)| !r.answered)
            .map(|((h, rank), r)| (h.clone(), *rank, r.said))
            .collect())
    }

    /// At a restart point: the lost hosts still listed that answer a probe are lost no more.
    fn take_back(&mut self, listed: &[Host], lost: &mut Vec<String>) -> Result<(), LaunchError> {
        let candidates: Vec<&Host> = listed.iter().filter(|h| lost.contains(&h.name)).collect();
        let results = job::probe(self.cfg, &candidates)?;
        for (h, _) in candidates.iter().zip(results).filter(|(_, r)| r.answered) {
            (self.say)(&format!(
                "host {} answers again: it joins the next job",
                h.name
            ));
            lost.retain(|l| *l != h.name);
        }
        Ok(())
    }

    /// Starts one job on `hosts` from `restart_point` and watches it to its end.
    fn run_job(
        &mut self,
        hosts: &[Host],
        restart_point: Option<(PathBuf, crate::train::checkpoint::TrainState)>,
    ) -> Result<JobEnd, LaunchError> {
        let resumed_from = restart_point.map(|(p, s)| (p, s.global_step));
        let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
        let spec = JobSpec {
            cfg: self.cfg,
            hosts,
            resume: resumed_from.as_ref().map(|(p, _)| p.as_path()),
            // A job before it wrote any restart point left only files of its own; before the
            // first job, the directory is cleared when asked, or when all it holds is the
            // report of an earlier launch that left no restart point (a launch given a
            // mistyped train option: the corrected one would be refused, and a job cannot
            // be given --overwrite).
            overwrite: !self.report.jobs.is_empty()
                || self.cfg.overwrite
                || crate::train::rundir::run_files_in(&self.cfg.run_dir) == ["elastic.json"],
        };
        (self.say)(&format!(
            "job {}: {} rank(s) on {} ({}){}",
            self.report.jobs.len() + 1,
            spec.ranks(),
            names.len(),
            names.join(" "),
            resumed_from
                .as_ref()
                .map_or(String::new(), |(p, s)| format!(
                    ", resuming {} (step {s})",
                    p.display()
                ))
        ));
        self.report.jobs.push(Job {
            hosts: names,
            resumed_from: resumed_from.clone(),
            started_s: self.secs(Instant::now()),
            first_step_s: None,
            ended_s: 0.0,
            last_step: None,
            outcome: String::new(),
        });
        let end = job::run(&spec, self);
        let now = self.secs(Instant::now());
        let job = self.report.jobs.last_mut().expect("pushed above");
        job.ended_s = now;
        job.outcome = match &end {
            Ok(JobEnd::Finished) => "finished".into(),
            Ok(JobEnd::Lost(..)) => "host lost".into(),
            Ok(JobEnd::Failed(how, _)) => format!("failed ({how})"),
            Err(e) => format!("not started ({e})"),
        };
        end
    }
}

impl JobEvents for Supervisor<'_> {
    /// The job's progress, and the previous failures' restart time and steps redone once this
    /// job trains past its restart point.
    fn steps(&mut self, steps: usize, now: Instant) {
        let at = self.secs(now);
        let job = self.report.jobs.last_mut().expect("a job runs");
        let resumed = job.resumed_from.as_ref().map_or(0, |(_, s)| *s);
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

    fn say(&self, line: &str) {
        (self.say)(line);
    }
}

/// The first [`PROBE_WORDS`] characters of a probe's output (the cause comes first: ssh's
/// line before OpenMPI's paragraphs of help).
fn first_words(said: &str) -> String {
    match said.char_indices().nth(PROBE_WORDS) {
        Some((cut, _)) => format!("{} ...", &said[..cut]),
        None => said.to_string(),
    }
}

/// How much of a lost host's probe output its line quotes.
const PROBE_WORDS: usize = 300;
