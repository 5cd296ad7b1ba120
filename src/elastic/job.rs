//! One job of an elastic run: `mpirun ... dptrain train` started on the hosts given, watched
//! (its exit, each rank's heartbeat) until it ends or a host falls silent, and stopped; and
//! the probe, a one-rank job that says whether a host can run anything at all.

use super::error::LaunchError;
use super::hostfile::{self, Host};
use super::options::LaunchConfig;
use crate::train::heartbeat::Beat;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How one job ended.
pub(super) enum JobEnd {
    Finished,
    /// Hosts that fell silent (their first silent rank each, its last beat), when that was
    /// found; the job stopped since.
    Lost(Vec<(Host, usize, Instant)>, Instant),
    /// The job failed, or no heartbeat came in time; the hosts of ranks that never beat
    /// (their first such rank each).
    Failed(Failed, Vec<(Host, usize)>),
}

/// How a job failed.
pub(super) enum Failed {
    /// mpirun exited so (its exit status).
    Exited(String),
    /// Some rank never beat within `--start-timeout`; the job was stopped.
    /// Whether any rank beat (if none did, `--listen` is likely unreachable).
    NoHeartbeat { any_beat: bool },
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Exited(status) => f.write_str(status),
            Failed::NoHeartbeat { .. } => {
                f.write_str("a rank sent no heartbeat within --start-timeout")
            }
        }
    }
}

/// A job to run.
pub(super) struct JobSpec<'a> {
    /// What launch was asked to do.
    pub cfg: &'a LaunchConfig,
    /// The hosts it runs on, in rank order.
    pub hosts: &'a [Host],
    /// The restart point it resumes from.
    pub resume: Option<&'a Path>,
    /// Whether the run directory holds only an earlier job's files to replace (no restart
    /// point was written before it was lost).
    pub overwrite: bool,
}

impl JobSpec<'_> {
    /// MPI ranks of the job: every host's slots.
    pub fn ranks(&self) -> usize {
        self.hosts.iter().map(|h| h.slots).sum()
    }
}

/// What a running job tells the supervisor.
pub(super) trait JobEvents {
    /// A rank reported `steps` global steps done, at `at`.
    fn steps(&mut self, steps: usize, at: Instant);
    /// A line for the user.
    fn say(&self, line: &str);
}

/// Starts `spec`'s job and watches it to its end.
pub(super) fn run(spec: &JobSpec<'_>, events: &mut dyn JobEvents) -> Result<JobEnd, LaunchError> {
    let cfg = spec.cfg;
    let listen = cfg.listen;
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
    let files = JobFiles::new(spec.hosts)?;
    let mut cmd = Command::new(&cfg.mpirun[0]);
    cmd.args(&cfg.mpirun[1..])
        .arg("--hostfile")
        .arg(&files.hostfile)
        .args(["-np", &spec.ranks().to_string()])
        // Each host's slots filled in turn: how a heartbeat's rank names its host.
        .args(["--map-by", "slot"])
        .arg(&cfg.program)
        .arg("train")
        .args(&cfg.train_args)
        .args(["--transport", "mpi", "--heartbeat", &addr.to_string()])
        .args(["--launched-by", &std::process::id().to_string()])
        .arg("--run-dir")
        .arg(&cfg.run_dir)
        .stdin(Stdio::null());
    if let Some(p) = spec.resume {
        cmd.arg("--resume").arg(p);
    } else if spec.overwrite {
        cmd.arg("--overwrite");
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: cfg.mpirun[0].clone(),
        source,
    })?;
    Ok(watch(spec, child, &socket, started, events))
}

/// Watches a running job: its exit, and each rank's heartbeat.
fn watch(
    spec: &JobSpec<'_>,
    mut child: Child,
    socket: &UdpSocket,
    started: Instant,
    events: &mut dyn JobEvents,
) -> JobEnd {
    let (hosts, ranks) = (spec.hosts, spec.ranks());
    let mut last_beat: Vec<Option<Instant>> = vec![None; ranks];
    let mut buf = [0u8; 128];
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            if status.success() {
                return JobEnd::Finished;
            }
            let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
            return JobEnd::Failed(Failed::Exited(status.to_string()), never_beat);
        }
        if let Ok(n) = socket.recv(&mut buf) {
            if let Some(beat) = Beat::parse(&buf[..n]).filter(|b| b.rank < ranks) {
                let now = Instant::now();
                last_beat[beat.rank] = Some(now);
                if let Some(steps) = beat.steps {
                    events.steps(steps, now);
                }
            }
        }
        let now = Instant::now();
        // A rank that beat and fell silent: its host is lost.
        let silent = first_rank_per_host(
            hosts,
            last_beat
                .iter()
                .map(|t| t.is_some_and(|t| now.duration_since(t) > spec.cfg.heartbeat_timeout)),
        );
        if !silent.is_empty() {
            let silent: Vec<_> = silent
                .into_iter()
                .map(|(h, r)| (h, r, last_beat[r].expect("it beat")))
                .collect();
            for (h, r, last) in &silent {
                events.say(&format!(
                    "host {} (rank {r}) lost: silent for {:.1} s; stopping the job",
                    h.name,
                    now.duration_since(*last).as_secs_f64()
                ));
            }
            stop(&mut child);
            return JobEnd::Lost(silent, now);
        }
        // Ranks that never beat: the job did not start (MPI waits for every rank before
        // any can beat); which hosts are to blame is for a probe to say.
        if now.duration_since(started) > spec.cfg.start_timeout
            && last_beat.iter().any(Option::is_none)
        {
            stop(&mut child);
            let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
            let any_beat = last_beat.iter().any(Option::is_some);
            return JobEnd::Failed(Failed::NoHeartbeat { any_beat }, never_beat);
        }
    }
}

// Stops a job: SIGTERM to mpirun (which passes it to the ranks it can reach), SIGKILL if it
/// has not ended within [`STOP_GRACE`] (a lost host's daemon can keep it waiting), then reaps
/// it. Killed, mpirun's daemons on the live hosts lose it and end their ranks themselves.
fn stop(child: &mut Child) {
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

/// The names of `hosts` that answer a probe: a one-rank job running `dptrain --version`
/// there that ends well within [`PROBE_TIMEOUT`]. All are probed at once.
pub(super) fn probe(cfg: &LaunchConfig, hosts: &[&Host]) -> Result<Vec<String>, LaunchError> {
    let mut probes = Vec::new();
    for h in hosts {
        let program = cfg.program.as_os_str();
        probes.push(Probe::start(cfg, h, program, "--version")?);
    }
    Probe::wait_all(&mut probes);
    Ok(probes
        .into_iter()
        .zip(hosts)
        .filter(|(p, _)| p.ended.as_ref().is_some_and(|s| s.success()))
        .map(|(_, h)| h.name.clone())
        .collect())
}

/// Whether mpirun runs a process on this machine (`true` on `localhost`): asked when no host
/// answers a probe, since a probe goes through mpirun too. An mpirun that refuses to run at
/// all (as root without OpenMPI's consent, a broken installation) is named with its own
/// words, not taken for every host being lost.
pub(super) fn check_mpirun_here(cfg: &LaunchConfig) -> Result<(), LaunchError> {
    let here = Host {
        name: "localhost".into(),
        slots: 1,
    };
    let mut probe = [Probe::start(cfg, &here, "true".as_ref(), "")?];
    Probe::wait_all(&mut probe);
    let [probe] = probe;
    let status = match &probe.ended {
        Some(s) if s.success() => return Ok(()),
        Some(s) => s.to_string(),
        None => format!("no end within {} s", PROBE_TIMEOUT.as_secs()),
    };
    Err(LaunchError::MpirunFails {
        mpirun: cfg.mpirun.join(" "),
        status,
        said: probe.said(),
    })
}

/// A one-rank job started by mpirun on one host, its output kept in its files.
struct Probe {
    child: Child,
    files: JobFiles,
    /// How it ended, once it has.
    ended: Option<std::process::ExitStatus>,
}

impl Probe {
    /// Starts `program arg` (no argument when `arg` is empty) on `host`.
    fn start(
        cfg: &LaunchConfig,
        host: &Host,
        program: &std::ffi::OsStr,
        arg: &str,
    ) -> Result<Self, LaunchError> {
        let files = JobFiles::new(std::slice::from_ref(host))?;
        let output = std::fs::File::create(files.dir.join("output")).map_err(|e| {
            LaunchError::JobFiles(crate::output::OutputError::Io {
                path: files.dir.join("output"),
                action: "create",
                cause: e,
            })
        })?;
        let stderr = output.try_clone().map_err(|source| LaunchError::Spawn {
            program: cfg.mpirun[0].clone(),
            source,
        })?;
        let child = Command::new(&cfg.mpirun[0])
            .args(&cfg.mpirun[1..])
            .arg("--hostfile")
            .arg(&files.hostfile)
            .args(["-np", "1"])
            .arg(program)
            .args((!arg.is_empty()).then_some(arg))
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(stderr)
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                program: cfg.mpirun[0].clone(),
                source,
            })?;
        Ok(Self {
            child,
            files,
            ended: None,
        })
    }

    /// Waits until every probe has ended or [`PROBE_TIMEOUT`] has passed, and kills the rest.
    fn wait_all(probes: &mut [Probe]) {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        while Instant::now() < deadline && probes.iter().any(|p| p.ended.is_none()) {
            for p in probes.iter_mut().filter(|p| p.ended.is_none()) {
                p.ended = p.child.try_wait().ok().flatten();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in probes.iter_mut().filter(|p| p.ended.is_none()) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// The last lines of what it printed (at most [`SAID_BYTES`]), blank lines and mpirun's
    /// rules of dashes left out.
    fn said(&self) -> String {
        let bytes = std::fs::read(self.files.dir.join("output")).unwrap_or_default();
        let tail = &bytes[bytes.len().saturating_sub(SAID_BYTES)..];
        let text = String::from_utf8_lossy(tail);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '-'))
            .collect();
        if lines.is_empty() {
            return "it printed nothing".into();
        }
        lines.join(" ")
    }
}

/// How much of a failed probe's output its error quotes.
const SAID_BYTES: usize = 2048;

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
