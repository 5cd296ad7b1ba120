//! Parsers and checks of the benchmarks' (and the simulator's) flag values: lists, sizes,
//! thread and worker counts, on/off choices, an emulated link.

use crate::comm::{parse_bandwidth, parse_duration, LinkModel};
use crate::terminal::print_warning;

/// Parses `--flag`'s comma-separated list, each entry (trimmed) with `parse`: an empty entry
/// (`a,,b`, a trailing comma, an empty list) and an entry given twice (by value: `1K,1024`
/// too) are refused, since each would measure one configuration twice or stand for a typo.
/// The order given is the order measured.
pub fn list<T: PartialEq + std::fmt::Debug>(
    flag: &str,
    s: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut out: Vec<T> = Vec::new();
    for entry in entries(flag, s)? {
        let v = parse(entry)?;
        if out.contains(&v) {
            return Err(format!(
                "{flag} {s:?}: '{entry}' repeats an earlier entry; give each value once"
            ));
        }
        out.push(v);
    }
    Ok(out)
}

/// The entries of `--flag`'s comma-separated list, trimmed: none empty, none given twice.
pub fn entries<'a>(flag: &str, s: &'a str) -> Result<Vec<&'a str>, String> {
    let mut out: Vec<&str> = Vec::new();
    for entry in s.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!(
                "{flag} {s:?}: an empty entry (two commas in a row, or one at an end); \
                 give values separated by single commas, e.g. a,b"
            ));
        }
        if out.contains(&entry) {
            return Err(format!(
                "{flag} {s:?}: '{entry}' is given twice; give each value once"
            ));
        }
        out.push(entry);
    }
    Ok(out)
}

/// Parses a size in bytes with an optional K, M or G suffix (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            format!("bad size '{s}': use bytes with an optional K, M or G suffix (e.g. 64M)")
        })
}

/// The most timed steps, iterations, batches or rounds a benchmark takes: far more than a
/// median needs, and small enough that the per-count timing records (a few words each) and
/// the run's time stay bounded (`--steps 18446744073709551615` overflowed an allocation).
pub const MAX_TIMED_COUNT: usize = 100_000;

/// Checks a benchmark's counts of timed steps, iterations, batches or rounds, each given as
/// (flag, value): 1 to [`MAX_TIMED_COUNT`], the first out of range named.
pub fn check_timed_counts(counts: &[(&str, usize)]) -> Result<(), String> {
    match counts
        .iter()
        .find(|(_, n)| !(1..=MAX_TIMED_COUNT).contains(n))
    {
        Some((flag, n)) => Err(format!(
            "{flag} {n}: give a count from 1 to {MAX_TIMED_COUNT}"
        )),
        None => Ok(()),
    }
}

/// The parser of one entry of `flag`'s list of thread counts (`--threads`,
/// `--loader-threads`): a count of at least 1.
pub fn thread_count(flag: &'static str) -> impl Fn(&str) -> Result<usize, String> {
    move |t| match t.parse::<usize>() {
        Ok(0) => Err(format!("{flag} 0: give at least 1 thread")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{flag}: bad thread count '{t}': use whole numbers, e.g. 1,2"
        )),
    }
}

/// Benchmarks measure the thread counts asked for, also past the cores (that is a measurement
/// too), but never silently: each count above the cores gets a warning. (Past
/// [`crate::measure::MAX_THREADS_PER_CORE`] per core, [`crate::measure::MeasureSpec::check`]
/// refuses them.)
pub fn warn_threads_past_cores(threads: &[usize]) {
    let cores = crate::limits::cores();
    for &t in threads.iter().filter(|&&t| t > cores) {
        print_warning(&format!(
            "--threads {t} is more than the {cores} cores this process may use: those threads \
             time-slice, so the step time measured for {t} is not a {t}-core figure"
        ));
    }
}

/// Sizes in bytes for an all-reduce of f32 values: below one f32 (4 bytes) is refused, and a
/// size that is not a whole number of f32s is rounded down to one, with a note saying so.
pub fn float_sizes(sizes: &[usize]) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(sizes.len());
    for &s in sizes {
        if s < 4 {
            return Err(format!(
                "--sizes: {s} bytes is less than one f32 (4 bytes), and the all-reduce sums \
                 f32 values: give at least 4"
            ));
        }
        let rounded = s - s % 4;
        if rounded != s {
            print_warning(&format!(
                "--sizes: {s} bytes is not a whole number of f32 values: measuring {rounded} bytes"
            ));
        }
        out.push(rounded);
    }
    Ok(out)
}

/// The emulated link of `--link-bandwidth` and `--link-latency`: none without a bandwidth (a
/// latency alone is refused), latency 0 if only the bandwidth is given.
pub fn parse_link(bw: &Option<String>, lat: &Option<String>) -> Result<Option<LinkModel>, String> {
    // The value judged first: a bad one is named as such, with or without a bandwidth.
    let latency = lat
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| format!("--link-latency: {e}"))?;
    match (bw, latency) {
        (None, Some(_)) => Err("--link-latency needs --link-bandwidth too".into()),
        (None, None) => Ok(None),
        (Some(b), latency) => Ok(Some(LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(b)
                .map_err(|e| format!("--link-bandwidth: {e}"))?,
            latency: latency.unwrap_or(std::time::Duration::ZERO),
        })),
    }
}

/// Refuses, before anything is measured, a `--link-bandwidth` list entry (`none`: no
/// emulation, where the command takes it) that with `--link-latency` could not carry the
/// benchmark's emulated runs within their timeout ([`crate::config::DEFAULT_COMM_TIMEOUT_S`]:
/// they have no `--comm-timeout`): no message could arrive in time, or the first one, each
/// model of `models` (a comma-separated list) sending its weights whole to every worker,
/// could not. Each would otherwise fail its run only after the runs before it.
pub fn check_emulated_links(
    models: &str,
    bandwidths: &str,
    latency: &str,
    none_allowed: bool,
) -> Result<(), String> {
    let latency = parse_duration(latency).map_err(|e| format!("--link-latency: {e}"))?;
    let timeout = crate::config::DEFAULT_COMM_TIMEOUT_S;
    let mut weights = Vec::new();
    for model in models.split(',').map(str::trim) {
        let graph = crate::model::reference_graph(model)?;
        weights.push((graph.name.clone(), 4 * graph.num_params()));
    }
    for bw in bandwidths.split(',').map(str::trim) {
        match bw {
            "none" if none_allowed => continue,
            "none" => {
                return Err(
                    "--link-bandwidth none: this benchmark compares emulated links; \
                            give each entry a bandwidth, e.g. 1Gbit"
                        .into(),
                )
            }
            _ => {}
        }
        let link = LinkModel {
            bandwidth_bytes_per_s: parse_bandwidth(bw)
                .map_err(|e| format!("--link-bandwidth: {e}"))?,
            latency,
        };
        let flags = crate::config::LinkFlags::Link;
        crate::config::check_link_against_timeout(&link, timeout, flags, None)?;
        for (model, bytes) in &weights {
            let secs = link.arrival_s(*bytes);
            if secs >= timeout {
                return Err(format!(
                    "--link-bandwidth {bw}: each emulated run starts by sending {model}'s \
                     {bytes} bytes of weights to every worker, which takes {secs:.0} s at this \
                     link, past the {timeout} s a message may take here: give a faster link"
                ));
            }
        }
    }
    Ok(())
}

/// Parses `on`, `off` or `both`.
pub fn on_off_list(flag: &str, s: &str) -> Result<Vec<bool>, String> {
    match s.trim() {
        "on" => Ok(vec![true]),
        "off" => Ok(vec![false]),
        "both" => Ok(vec![true, false]),
        o => Err(format!("--{flag} {o:?}: use on, off or both")),
    }
}

/// The most workers a worker list takes: the simulator's per-chunk records refuse more
/// (16 Mi elements), and larger counts overflow its tree walk's rank arithmetic.
pub const MAX_WORKER_COUNT: usize = 1 << 24;

/// Parses `--flag`'s comma-separated list of worker counts: each a positive integer up to
/// [`MAX_WORKER_COUNT`], none empty or repeated (see [`list`]).
pub fn worker_list(flag: &str, s: &str) -> Result<Vec<usize>, String> {
    list(flag, s, |w| match w.parse::<usize>() {
        Ok(n) if n > MAX_WORKER_COUNT => Err(format!(
            "{flag}: {n} workers is more than the {MAX_WORKER_COUNT} (2^24) a run or a \
             simulation can hold"
        )),
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{flag}: bad worker count '{w}': give positive integers, e.g. 8,64,512"
        )),
    })
}
