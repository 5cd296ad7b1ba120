//! What this process has under way that must not outlive it when a signal ends it, and the
//! watcher that puts it away: temporary files ([`create_registered`], used by `output`'s
//! atomic writes; [`FileRegistration`], a run directory's lock file), scratch directories
//! ([`ScratchRegistration`]), directories a command made, while empty
//! ([`ScratchRegistration::made_if_empty`], `output::CreatedDirs`), and child jobs
//! ([`ChildJob`], `dptrain launch`'s mpirun); and what to say as it ends ([`say_on_signal`]:
//! a run's restart point).
//!
//! Why: a process killed mid-write used to leave its temporary file beside the target (after
//! an interrupted `data pack`, a hidden file as large as what was written), an interrupted
//! export its staged images, a benchmark its scratch directory, and a `dptrain launch` its
//! whole MPI job training on unsupervised, holding the run directory.
//!
//! How: [`watch_signals`], called once by the binary, starts a thread that waits for the
//! signals whose default action ends the process (`CAUGHT`: Ctrl-C, `kill`, a hang-up,
//! Ctrl-\, the CPU time limit, the user signals; SIGXFSZ is ignored instead, so a file
//! past `ulimit -f` fails to write with an error that names it), through signal-hook's self-pipe (the
//! handler itself only writes a byte, the one thing a handler may safely do). On the first it
//! puts every caught signal back to its default action (a second Ctrl-C ends the process at
//! once), stops the child jobs (SIGTERM, SIGKILL after [`CHILD_GRACE`]), removes the files and
//! directories, and ends the process as the signal would have, so the shell still sees an
//! interrupted command (exit status 130 for Ctrl-C). Only signals whose action is the default
//! at start are caught: one ignored (`nohup`'s SIGHUP, a script's background job's SIGINT)
//! stays ignored, one another library handles stays its. [`exit_cleaning_up`] does the same
//! for a process that ends itself (the MPI watchdog) while other threads work.
//!
//! Everything is registered under the register's lock as it comes into being (the file
//! created, the child spawned; files and directories made inside a scratch directory are made
//! under it too, [`creating`]) and let go under it as it goes (renamed into place, reaped);
//! the watcher keeps the register locked until the process has ended, so nothing new is
//! created or started after it has cleaned up. SIGKILL cannot be caught: a temporary file it
//! leaves is cleared by the next write to the same target (`output::remove_stale_temps`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What a signal must not leave behind.
struct Register {
    /// Temporary files that exist now.
    files: Vec<PathBuf>,
    /// Scratch directories, removed whole.
    dirs: Vec<PathBuf>,
    /// Directories this process made, removed if empty (latest first, after the scratch
    /// directories, which may be inside them).
    empty_dirs: Vec<PathBuf>,
    /// Child jobs not yet reaped.
    children: Vec<u32>,
    /// What to tell the user when a signal ends the process (a run: how to continue it),
    /// worked out then: [`say_on_signal`].
    farewell: Option<(u64, Farewell)>,
}

/// A line for stderr, worked out when a signal ends the process.
type Farewell = Box<dyn Fn() -> Option<String> + Send>;

static REGISTER: Mutex<Register> = Mutex::new(Register {
    files: Vec::new(),
    dirs: Vec::new(),
    empty_dirs: Vec::new(),
    children: Vec::new(),
    farewell: None,
});

fn register() -> MutexGuard<'static, Register> {
    // A panic while the lock was held leaves a register that is still right.
    REGISTER.lock().unwrap_or_else(PoisonError::into_inner)
}

fn remove_from<T: PartialEq>(list: &mut Vec<T>, item: &T) {
    if let Some(i) = list.iter().position(|x| x == item) {
        list.remove(i);
    }
}

/// Creates the file at `path` with `create` and registers it (both under the lock: the
/// watcher either removes it or finds it not yet made, and then nothing is made after).
pub fn create_registered(
    path: &Path,
    create: impl FnOnce(&Path) -> std::io::Result<File>,
) -> std::io::Result<File> {
    let mut register = register();
    let file = create(path)?;
    register.files.push(path.to_path_buf());
    Ok(file)
}

/// Runs `create` (which makes a file or directory inside a registered scratch directory)
/// holding the register's lock: nothing is made in one after the watcher has removed it
/// (writer threads of an export would otherwise refill it as it is removed).
pub fn creating<T>(create: impl FnOnce() -> T) -> T {
    let _held = register();
    create()
}

/// A file this process removes when it is done with it (a run directory's lock file),
/// removed if a signal ends the process while this lives; dropping it only lets go.
#[derive(Debug)]
pub struct FileRegistration(PathBuf);

impl FileRegistration {
    /// Registers `path`.
    pub fn new(path: &Path) -> Self {
        register().files.push(path.to_path_buf());
        Self(path.to_path_buf())
    }
}

impl Drop for FileRegistration {
    fn drop(&mut self) {
        let_go_file(&self.0);
    }
}

/// Lets go of a file registered by [`create_registered`] (renamed into place, or removed).
pub fn let_go_file(path: &Path) {
    remove_from(&mut register().files, &path.to_path_buf());
}

/// While this lives, a signal that ends the process first prints what `farewell` returns then
/// (after the temporary files are removed), as a `note:` line on stderr: a run says which
/// restart point continues it. One at a time: a later registration replaces an earlier one.
#[derive(Debug)]
#[must_use = "the line is said only while the registration lives"]
pub struct FarewellRegistration(u64);

/// Registers `farewell` ([`FarewellRegistration`]).
pub fn say_on_signal(
    farewell: impl Fn() -> Option<String> + Send + 'static,
) -> FarewellRegistration {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    register().farewell = Some((id, Box::new(farewell)));
    FarewellRegistration(id)
}

impl Drop for FarewellRegistration {
    fn drop(&mut self) {
        let mut register = register();
        // Only its own: a later registration (another run of this process) stays.
        if register
            .farewell
            .as_ref()
            .is_some_and(|(id, _)| *id == self.0)
        {
            register.farewell = None;
        }
    }
}

/// A scratch directory removed if a signal ends the process, while this lives: whole
/// ([`Self::new`]), or only if it is empty ([`Self::made_if_empty`]). Dropping it only lets go (its
/// owner removes or keeps the directory).
#[derive(Debug)]
pub struct ScratchRegistration {
    dir: PathBuf,
    whole: bool,
}

impl ScratchRegistration {
    /// Registers `dir` (made, or about to be made, by this process), removed whole.
    pub fn new(dir: &Path) -> Self {
        register().dirs.push(dir.to_path_buf());
        Self {
            dir: dir.to_path_buf(),
            whole: true,
        }
    }

    /// Runs `make`, which creates `dir` for a command's output and says whether this call
    /// made it, and registers `dir` when it did, removed only while it is empty: an
    /// interrupted command leaves no empty directory it made, and never touches one that was
    /// there or that received a file. Both under the register's lock, so no signal comes
    /// between the directory made and registered.
    pub fn made_if_empty<E>(
        dir: &Path,
        make: impl FnOnce() -> Result<bool, E>,
    ) -> Result<Option<Self>, E> {
        let mut register = register();
        if !make()? {
            return Ok(None);
        }
        register.empty_dirs.push(dir.to_path_buf());
        Ok(Some(Self {
            dir: dir.to_path_buf(),
            whole: false,
        }))
    }
}

impl Drop for ScratchRegistration {
    fn drop(&mut self) {
        let mut register = register();
        let list = if self.whole {
            &mut register.dirs
        } else {
            &mut register.empty_dirs
        };
        remove_from(list, &self.dir);
    }
}

/// A child process that is stopped if a signal ends this process; reaped through
/// [`ChildJob::try_wait`] and [`ChildJob::wait`], which let go of it under the register's
/// lock (so a pid reused after the reaping is never signalled).
#[derive(Debug)]
pub struct ChildJob {
    child: Child,
    reaped: bool,
}

impl ChildJob {
    /// Spawns `cmd` and registers it.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Self> {
        let mut register = register();
        let child = cmd.spawn()?;
        register.children.push(child.id());
        Ok(Self {
            child,
            reaped: false,
        })
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has ended.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.reaped {
            return self.child.try_wait();
        }
        let mut register = register();
        let status = self.child.try_wait()?;
        if status.is_some() {
            remove_from(&mut register.children, &self.child.id());
            self.reaped = true;
        }
        Ok(status)
    }

    /// Waits for it to end (polling [`Self::try_wait`]: the register is never held while
    /// blocked).
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill()
    }

    /// Stops it as a signal's watcher does: SIGTERM, SIGKILL if it has not ended within
    /// [`CHILD_GRACE`], reaped either way.
    pub fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, not reaped yet (try_wait has not seen it end).
        if !self.reaped {
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + CHILD_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.kill();
        let _ = self.wait();
    }
}

impl Drop for ChildJob {
    fn drop(&mut self) {
        if !self.reaped {
            // Left running by its owner: no longer ours to stop.
            remove_from(&mut register().children, &self.child.id());
        }
    }
}

/// How long stopped child jobs have to end before they are killed (mpirun passes the signal
/// on to its ranks and waits for them).
pub const CHILD_GRACE: Duration = Duration::from_secs(2);

/// The signals caught, where their action is the default (each of which ends the process).
const CAUGHT: [libc::c_int; 8] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGXCPU,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

/// Starts the thread that cleans up (see the module comment) when one of the `CAUGHT`
/// signals arrives, then ends the process as that signal would have. For the binary: a
/// library user keeps its own signal handling. On an error every signal is left at its
/// default action, as if this had not been called.
pub fn watch_signals() -> std::io::Result<()> {
    // A file grown past `ulimit -f` then fails to write (EFBIG), which every writer reports,
    // naming the file, and cleans up after, instead of the process ending with no word.
    if is_default(libc::SIGXFSZ) {
        // SAFETY: signal(2) with SIG_IGN installs no code of ours.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    }
    let caught: Vec<libc::c_int> = CAUGHT.into_iter().filter(|&s| is_default(s)).collect();
    let watching = || -> std::io::Result<()> {
        let mut signals = signal_hook::iterator::Signals::new(&caught)?;
        let defaults = caught.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    restore_defaults(&defaults);
                    clean_up_and(Say::Farewell, || {
                        let _ = signal_hook::low_level::emulate_default_handler(signal);
                        // Not reached (the default action of each caught signal ends it).
                        std::process::exit(128 + signal)
                    })
                }
            })?;
        Ok(())
    };
    // A failed start leaves signal-hook's handler installed with nothing to act on it: the
    // signals would do nothing at all.
    watching().inspect_err(|_| restore_defaults(&caught))
}

/// Exits with `code` once what is under way is put away: for a process that ends itself while
/// other threads may be writing (a run's error, the MPI watchdog).
pub fn exit_cleaning_up(code: i32) -> ! {
    clean_up_and(Say::Nothing, || std::process::exit(code))
}

/// Whether the process ending says the registered farewell: on a signal, not on an exit of
/// its own (whose error has said why).
#[derive(PartialEq)]
enum Say {
    Farewell,
    Nothing,
}

/// Stops the child jobs, removes the files and directories, says the farewell if `say` asks,
/// and runs `end` (which ends the process) with the register still locked, so nothing new
/// comes between the two.
fn clean_up_and(say: Say, end: impl FnOnce() -> std::convert::Infallible) -> ! {
    let register = register();
    stop_children(&register.children);
    for f in &register.files {
        let _ = std::fs::remove_file(f);
    }
    for d in &register.dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    for d in register.empty_dirs.iter().rev() {
        let _ = std::fs::remove_dir(d);
    }
    if let (Say::Farewell, Some((_, farewell))) = (say, &register.farewell) {
        // Nothing it does may keep the process from ending: a panic is caught, and a stderr
        // that cannot be written (a closed pipe, a terminal gone with its SIGHUP) ignored.
        let line = std::panic::catch_unwind(std::panic::AssertUnwindSafe(farewell));
        if let Ok(Some(line)) = line {
            use std::io::Write;
            // On a line of its own: a progress bar may hold the current one.
            let _ = writeln!(std::io::stderr().lock(), "\nnote: {line}");
        }
    }
    match end() {}
}

/// SIGTERM to each of `pids`, then SIGKILL to those still running after [`CHILD_GRACE`];
/// each reaped.
fn stop_children(pids: &[u32]) {
    let pids: Vec<libc::pid_t> = pids.iter().map(|&p| p as libc::pid_t).collect();
    // SAFETY (each block): kill(2) and waitpid(2) on children not yet reaped: their owners
    // reap them only under the register's lock, which the caller holds.
    let ended = |pid| unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) != 0 };
    for &pid in &pids {
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + CHILD_GRACE;
    let mut running = pids;
    while !running.is_empty() && Instant::now() < deadline {
        running.retain(|&pid| !ended(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in running {
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Whether `signal`'s action is the default now (neither ignored nor handled).
fn is_default(signal: libc::c_int) -> bool {
    // SAFETY: sigaction(2) with no new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    }
}

/// Puts `signals` back to their default action.
fn restore_defaults(signals: &[libc::c_int]) {
    for &s in signals {
        // SAFETY: signal(2) with SIG_DFL installs no code of ours.
        unsafe {
            libc::signal(s, libc::SIG_DFL);
        }
    }
}
