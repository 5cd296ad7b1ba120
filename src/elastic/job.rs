//! One job of an elastic run: `mpirun ... dptrain train` started on the hosts given, watched
//! (its exit, each rank's heartbeat) until it ends or a host falls silent, and stopped; and
//! the probe, a one-rank job that says whether a host can run anything at all.

use super::error::LaunchError;
use super::hostfile::{self, Host};
use super::options::LaunchConfig;
use crate::interrupt::ChildJob;
use crate::train::heartbeat::Beat;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
    /// mpirun ended well with no rank ever beating: it ran something other than the ranks.
    NothingRan,
    /// Some rank never beat within `--start-timeout`; the job was stopped.
    /// Whether any rank beat (if none did, `--listen` is likely unreachable).
    NoHeartbeat { any_beat: bool },
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Exited(status) => f.write_str(status),
            Failed::NothingRan => f.write_str("mpirun ended well with no rank's heartbeat"),
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
    // A process group of its own, so Ctrl-C reaches launch alone: mpirun killed by it at
    // once would leave its ranks (each in a group of their own) training on for a while,
    // holding the run directory. launch's signal watcher stops it instead (SIGTERM, which
    // mpirun passes on to the ranks and waits for).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = ChildJob::spawn(&mut cmd).map_err(|source| LaunchError::Spawn {
        program: cfg.mpirun[0].clone(),
        source,
    })?;
    Ok(watch(spec, child, &socket, started, events))
}

/// Watches a running job: its exit, and each rank's heartbeat.
fn watch(
    spec: &JobSpec<'_>,
    mut child: ChildJob,
    socket: &UdpSocket,
    started: Instant,
    events: &mut dyn JobEvents,
) -> JobEnd {
    let (hosts, ranks) = (spec.hosts, spec.ranks());
    let mut last_beat: Vec<Option<Instant>> = vec![None; ranks];
    let mut buf = [0u8; 128];
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            // Every rank beats as it starts: a job that ended well without a beat ran
            // something else (an --mpirun that is no mpirun, a wrapper that did nothing).
            let any_beat = last_beat.iter().any(Option::is_some);
            if status.success() && any_beat {
                return JobEnd::Finished;
            }
            let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
            let how = if status.success() {
                Failed::NothingRan
            } else {
                Failed::Exited(status.to_string())
            };
            return JobEnd::Failed(how, never_beat);
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
            // SIGTERM, which mpirun passes to the ranks it can reach; SIGKILL after the
            // grace (a lost host's daemon can keep it waiting): killed, mpirun's daemons on
            // the live hosts lose it and end their ranks themselves.
            child.stop();
            return JobEnd::Lost(silent, now);
        }
        // Ranks that never beat: the job did not start (MPI waits for every rank before
        // any can beat); which hosts are to blame is for a probe to say.
        if now.duration_since(started) > spec.cfg.start_timeout
            && last_beat.iter().any(Option::is_none)
        {
            child.stop();
            let never_beat = first_rank_per_host(hosts, last_beat.iter().map(Option::is_none));
            let any_beat = last_beat.iter().any(Option::is_some);
            return JobEnd::Failed(Failed::NoHeartbeat { any_beat }, never_beat);
        }
    }
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

/// How a host answered its probe: a one-rank job running `dptrain --version` there.
pub(super) struct ProbeResult {
    /// Whether it ended well within [`PROBE_TIMEOUT`].
    pub answered: bool,
    /// How it ended (its exit status), if it did within [`PROBE_TIMEOUT`] (a host that is
    /// down often keeps mpirun waiting).
    pub ended: Option<String>,
    /// The end of what mpirun and the probe printed ([`Probe::said`]).
    pub said: String,
}

/// Probes every host of `hosts` at once (see [`ProbeResult`]), in their order.
pub(super) fn probe(cfg: &LaunchConfig, hosts: &[&Host]) -> Result<Vec<ProbeResult>, LaunchError> {
    let mut probes = Vec::new();
    for h in hosts {
        probes.push(Probe::start(
            cfg,
            h,
            cfg.program.as_os_str(),
            Some("--version"),
        )?);
    }
    Probe::wait_all(&mut probes);
    Ok(probes
        .iter()
        .map(|p| ProbeResult {
            answered: p.ended.is_some_and(|s| s.success()),
            ended: p.ended.map(|s| s.to_string()),
            said: p.said(),
        })
        .collect())
}

/// mpirun's failure to run anything on this machine (`true` on `localhost`), if it fails so:
/// asked when no host answers a probe, since a probe goes through mpirun too. `None` when it
/// runs, or does not end within [`PROBE_TIMEOUT`] (a slow start says nothing).
pub(super) fn mpirun_fails_here(cfg: &LaunchConfig) -> Result<Option<ProbeResult>, LaunchError> {
    let here = Host {
        name: "localhost".into(),
        slots: 1,
    };
    let mut probe = [Probe::start(cfg, &here, "true".as_ref(), None)?];
    Probe::wait_all(&mut probe);
    Ok(match probe[0].ended {
        Some(s) if !s.success() => Some(ProbeResult {
            answered: false,
            ended: Some(s.to_string()),
            said: probe[0].said(),
        }),
        _ => None,
    })
}

/// A one-rank job started by mpirun on one host, its output kept in its files. Dropped
/// before it ended, it is killed.
struct Probe {
    child: ChildJob,
    files: JobFiles,
    /// How it ended, once it has.
    ended: Option<std::process::ExitStatus>,
}

impl Probe {
    /// Starts `program [arg]` on `host`.
    fn start(
        cfg: &LaunchConfig,
        host: &Host,
        program: &std::ffi::OsStr,
        arg: Option<&str>,
    ) -> Result<Self, LaunchError> {
        let files = JobFiles::new(std::slice::from_ref(host))?;
        let output =
            crate::output::create_new_file(&files.output()).map_err(LaunchError::JobFiles)?;
        let stderr = output.try_clone().map_err(|cause| {
            LaunchError::JobFiles(crate::output::OutputError::Io {
                path: files.output(),
                action: "open a second handle (for stderr) to",
                cause,
            })
        })?;
        let mut cmd = Command::new(&cfg.mpirun[0]);
        cmd.args(&cfg.mpirun[1..])
            .arg("--hostfile")
            .arg(&files.hostfile)
            .args(["-np", "1"])
            .arg(program)
            .args(arg)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(stderr);
        let child = ChildJob::spawn(&mut cmd).map_err(|source| LaunchError::Spawn {
            program: cfg.mpirun[0].clone(),
            source,
        })?;
        Ok(Self {
            child,
            files,
            ended: None,
        })
    }

    /// Waits until every probe has ended or [`PROBE_TIMEOUT`] has passed.
    fn wait_all(probes: &mut [Probe]) {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        while Instant::now() < deadline && probes.iter().any(|p| p.ended.is_none()) {
            for p in probes.iter_mut().filter(|p| p.ended.is_none()) {
                p.ended = p.child.try_wait().ok().flatten();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of what it printed (from its last [`SAID_BYTES`]), on one line: blank
    /// lines, mpirun's rules of dashes and control characters (a remote terminal's escapes)
    /// left out.
    fn said(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let mut tail = Vec::new();
        if let Ok(mut f) = std::fs::File::open(self.files.output()) {
            let len = f.metadata().map_or(0, |m| m.len());
            let from = len.saturating_sub(SAID_BYTES as u64);
            let _ = f
                .seek(SeekFrom::Start(from))
                .and_then(|_| f.take(SAID_BYTES as u64).read_to_end(&mut tail));
        }
        let text = String::from_utf8_lossy(&tail);
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.chars().filter(|c| !c.is_control()).collect::<String>())
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '-'))
            .collect();
        if lines.is_empty() {
            return "it printed nothing".into();
        }
        lines.join(" ")
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if self.ended.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How much of a probe's output is quoted.
const SAID_BYTES: usize = 2048;

/// How long a lost host has to answer the probe at a restart point.
const PROBE_TIMEOUT: Duration = Duration::from_secs(4);

/// The files of one job (its hostfile), in a directory of their own removed afterwards.
struct JobFiles {
    dir: PathBuf,
    hostfile: PathBuf,
    /// Removed if a signal ends launch.
    _scratch: crate::interrupt::ScratchRegistration,
}

impl JobFiles {
    fn new(hosts: &[Host]) -> Result<Self, LaunchError> {
        // A new private directory each time: one made in advance under this name (with a
        // link to a file of ours in it) is never written into.
        let dir = crate::output::create_private_dir(&std::env::temp_dir(), "dptrain-launch-")
            .map_err(LaunchError::JobFiles)?;
        let files = Self {
            hostfile: dir.join("hostfile"),
            _scratch: crate::interrupt::ScratchRegistration::new(&dir),
            dir,
        };
        crate::output::write_new_file(&files.hostfile, hostfile::render(hosts).as_bytes())
            .map_err(LaunchError::JobFiles)?;
        Ok(files)
    }

    /// Where a probe's output goes.
    fn output(&self) -> PathBuf {
        self.dir.join("output")
    }
}

impl Drop for JobFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
