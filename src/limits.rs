//! What this machine has (cores, memory), and the checks that hold requests to it before any
//! work starts, so that a size typed with a few digits too many is refused with a message
//! instead of an allocation that aborts the process, an OOM kill, or a run that looks hung.
//!
//! Memory is the smaller of `MemAvailable` in `/proc/meminfo` and what the cgroup (container)
//! still allows (`memory.max - memory.current`, cgroup v2); where neither can be read the checks
//! pass, since refusing work on a guess would be worse.

use std::path::Path;

/// Cores this process may run on (`std::thread::available_parallelism`, which honours CPU
/// affinity and cgroup quotas), at least 1.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Bytes of memory available to this process now, if the system says.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    });
    let cgroup = cgroup_headroom(Path::new("/sys/fs/cgroup"));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `memory.max - memory.current` of the cgroup v2 at `root`, if it has a limit.
fn cgroup_headroom(root: &Path) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(root.join(f)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max" (no limit) fails here
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// A byte count for people: `1.5 GiB`, `320.0 MiB`, `12 bytes`.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024.0 {
        return format!("{bytes:.0} bytes");
    }
    let mut v = bytes / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Share of the available memory one request may take: the rest is for what the estimate does
/// not see (the allocator, other buffers, the rest of the system).
const MEMORY_SHARE: f64 = 0.8;

/// Refuses `what` if it needs about `bytes` (an estimate; f64 so that absurd requests do not
/// overflow on the way) and that is more than `MEMORY_SHARE` of the available memory;
/// `todo` says how to ask for less.
pub fn check_memory(what: &str, bytes: f64, todo: &str) -> Result<(), String> {
    check_memory_against(what, bytes, todo, available_memory())
}

/// [`check_memory`] against a given amount of available memory (`None`: unknown, passes).
pub fn check_memory_against(
    what: &str,
    bytes: f64,
    todo: &str,
    available: Option<u64>,
) -> Result<(), String> {
    let Some(avail) = available else {
        return Ok(());
    };
    if bytes.is_finite() && bytes <= MEMORY_SHARE * avail as f64 {
        return Ok(());
    }
    Err(format!(
        "{what} needs about {}, but this machine has {} available: {todo}",
        human_bytes(bytes),
        human_bytes(avail as f64)
    ))
}

/// Compute threads per worker for a run of `workers` workers on this process's cores.
///
/// Asked for none: the cores split over the workers (at least 1 each). Asked for more than
/// there are cores: capped at the cores, with a warning. Threads beyond the cores make a step
/// slower, never faster (they time-slice; `--threads 1000` made lenet5 steps take seconds), and
/// the result does not depend on the thread count (fixed-order sums), so capping changes
/// nothing but the time. Workers x threads above the cores (several workers on few cores) is
/// allowed, since emulating many workers on one machine is what the trainer is for, but said.
/// Returns the thread count and the warnings to show.
pub fn threads_per_worker(requested: Option<usize>, workers: usize) -> (usize, Vec<String>) {
    threads_per_worker_on(requested, workers, cores())
}

/// [`threads_per_worker`] on a machine of `cores` cores.
pub fn threads_per_worker_on(
    requested: Option<usize>,
    workers: usize,
    cores: usize,
) -> (usize, Vec<String>) {
    let mut warnings = Vec::new();
    let threads = match requested {
        None => (cores / workers.max(1)).max(1),
        Some(t) if t > cores => {
            warnings.push(format!(
                "--threads {t} is more than the {cores} cores this process may use: using \
                 {cores} threads per worker (more would only time-slice the same cores, and \
                 results do not depend on the thread count)"
            ));
            cores
        }
        Some(t) => t,
    };
    if workers * threads > cores {
        warnings.push(format!(
            "{workers} workers x {threads} threads = {} compute threads on {cores} cores: \
             the cores are oversubscribed, so steps take longer than on a machine with a core \
             per thread (fine for emulating workers; lower --threads or --workers to measure \
             speed)",
            workers * threads
        ));
    }
    (threads, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_capped_at_the_cores_and_oversubscription_is_said() {
        assert_eq!(threads_per_worker_on(None, 1, 8), (8, vec![]));
        assert_eq!(threads_per_worker_on(None, 3, 8).0, 2);
        let (t, w) = threads_per_worker_on(Some(1000), 1, 2);
        assert_eq!(t, 2);
        assert!(
            w[0].contains("--threads 1000") && w[0].contains("2 cores"),
            "{w:?}"
        );
        let (t, w) = threads_per_worker_on(None, 4, 2);
        assert_eq!(t, 1);
        assert!(w[0].contains("oversubscribed"), "{w:?}");
        assert!(threads_per_worker_on(Some(2), 1, 2).1.is_empty());
    }

    #[test]
    fn memory_checks_refuse_what_does_not_fit() {
        let gib = 1u64 << 30;
        assert!(check_memory_against("x", 1e9, "", Some(4 * gib)).is_ok());
        let e =
            check_memory_against("the batch", 313e9, "lower --batch", Some(4 * gib)).unwrap_err();
        assert!(
            e.contains("the batch needs about 291.5 GiB")
                && e.contains("4.0 GiB available")
                && e.contains("lower --batch"),
            "{e}"
        );
        assert!(check_memory_against("x", f64::INFINITY, "", Some(gib)).is_err());
        assert!(check_memory_against("x", 1e30, "", None).is_ok());
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(12.0), "12 bytes");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
    }
}
