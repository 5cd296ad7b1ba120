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

/// Bytes of memory available to this process now, if the system says: the smallest of
/// `MemAvailable`, the cgroup's headroom and the address space `RLIMIT_AS` leaves
/// ([`memory_room`]).
pub fn available_memory() -> Option<u64> {
    memory_room().map(|r| r.bytes)
}

/// What bounds the memory a request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimit {
    /// `MemAvailable` in `/proc/meminfo`.
    MemAvailable,
    /// The cgroup v2 `memory.max - memory.current`.
    Cgroup,
    /// `RLIMIT_AS` (`ulimit -v`) minus the address space already mapped (`VmSize`).
    AddressSpace,
}

/// The memory a request may take now and which limit says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRoom {
    /// Bytes.
    pub bytes: u64,
    /// The limit that is smallest.
    pub limit: MemoryLimit,
}

impl std::fmt::Display for MemoryRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = human_bytes(self.bytes as f64);
        match self.limit {
            MemoryLimit::MemAvailable => write!(f, "this machine has {b} available"),
            MemoryLimit::Cgroup => write!(f, "this container (cgroup memory.max) allows {b} more"),
            MemoryLimit::AddressSpace => write!(
                f,
                "the address-space limit (ulimit -v, RLIMIT_AS) leaves {b} to this process"
            ),
        }
    }
}

/// The memory this process may still take: the smallest of `MemAvailable`, the cgroup v2
/// headroom and `RLIMIT_AS` minus the current virtual size. Under `ulimit -v` an allocation
/// past the limit fails (Rust aborts the process) however much the machine has free, so the
/// address space counts as much as the physical memory.
pub fn memory_room() -> Option<MemoryRoom> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| status_kb(&s, "MemAvailable:"));
    memory_room_from(
        meminfo,
        cgroup_headroom(Path::new("/sys/fs/cgroup")),
        address_space_headroom(),
    )
}

/// [`memory_room`] from the three figures (`None`: not known or no limit).
pub fn memory_room_from(
    meminfo: Option<u64>,
    cgroup: Option<u64>,
    address_space: Option<u64>,
) -> Option<MemoryRoom> {
    [
        (meminfo, MemoryLimit::MemAvailable),
        (cgroup, MemoryLimit::Cgroup),
        (address_space, MemoryLimit::AddressSpace),
    ]
    .into_iter()
    .filter_map(|(b, limit)| b.map(|bytes| MemoryRoom { bytes, limit }))
    .min_by_key(|r| r.bytes)
}

/// `RLIMIT_AS` minus this process's current virtual size (`VmSize`), if a limit is set.
pub fn address_space_headroom() -> Option<u64> {
    let limit = address_space_limit()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = status_kb(&status, "VmSize:")?;
    Some(limit.saturating_sub(used))
}

/// The soft `RLIMIT_AS` in bytes, `None` when unlimited (or unknown).
pub fn address_space_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own, and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// A `Key:   123 kB` line of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn status_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
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
/// overflow on the way) and that is more than `MEMORY_SHARE` of the memory this process may
/// take ([`memory_room`]); `todo` says how to ask for less.
pub fn check_memory(what: &str, bytes: f64, todo: &str) -> Result<(), String> {
    check_memory_in(what, bytes, todo, memory_room()).map_err(|e| e.to_string())
}

/// [`check_memory`] against a given amount of available memory (`None`: unknown, passes).
pub fn check_memory_against(
    what: &str,
    bytes: f64,
    todo: &str,
    available: Option<u64>,
) -> Result<(), String> {
    let room = available.map(|bytes| MemoryRoom {
        bytes,
        limit: MemoryLimit::MemAvailable,
    });
    check_memory_in(what, bytes, todo, room).map_err(|e| e.to_string())
}

/// [`check_memory`] against a given room, with a typed error.
pub fn check_memory_in(
    what: &str,
    bytes: f64,
    todo: &str,
    room: Option<MemoryRoom>,
) -> Result<(), MemoryError> {
    let Some(room) = room else {
        return Ok(());
    };
    if fits(bytes, room.bytes) {
        return Ok(());
    }
    Err(MemoryError {
        what: what.to_string(),
        needed: bytes,
        room,
        todo: todo.to_string(),
    })
}

/// Whether `bytes` fits in `MEMORY_SHARE` of `room` bytes.
pub fn fits(bytes: f64, room: u64) -> bool {
    bytes.is_finite() && bytes <= MEMORY_SHARE * room as f64
}

/// A request refused for memory: what, how much, what bounds it, what to lower.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} needs about {}, but {room}: {todo}", human_bytes(*.needed))]
pub struct MemoryError {
    /// What was asked for (with its parts, when known).
    pub what: String,
    /// Bytes it needs (estimated).
    pub needed: f64,
    /// What the process may take, and which limit says so.
    pub room: MemoryRoom,
    /// What to lower.
    pub todo: String,
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
    fn the_smallest_limit_bounds_and_is_named() {
        let gib = 1u64 << 30;
        let room = memory_room_from(Some(8 * gib), None, Some(2 * gib)).unwrap();
        assert_eq!(room.limit, MemoryLimit::AddressSpace);
        let e = check_memory_in("x", 3e9, "lower --sizes", Some(room)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("ulimit -v") && m.contains("2.0 GiB"), "{m}");
        let room = memory_room_from(Some(gib), Some(4 * gib), None).unwrap();
        assert_eq!(room.limit, MemoryLimit::MemAvailable);
        assert_eq!(memory_room_from(None, None, None), None);
        assert_eq!(status_kb("VmSize:\t  2048 kB\n", "VmSize:"), Some(2 << 20));
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(12.0), "12 bytes");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
    }
}
