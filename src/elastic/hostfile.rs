//! The hosts an elastic run may use: OpenMPI's hostfile format, read again at every restart
//! point (a line added joins the next job), and the live subset written for one job.

use std::path::{Path, PathBuf};

/// One host line: its name or address and how many ranks it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Name or address, as mpirun is given it.
    pub name: String,
    /// Ranks on it (`slots=N`, 1 when absent).
    pub slots: usize,
}

/// Why a hostfile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HostfileError {
    /// It could not be read.
    #[error(transparent)]
    Read(#[from] crate::input::InputError),
    /// A line is not `HOST [slots=N]`.
    #[error("hostfile {}, line {line}: {detail}", path.display())]
    Line {
        /// The hostfile.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// No host in it.
    #[error("hostfile {}: no hosts (one `HOST slots=N` per line)", .0.display())]
    Empty(PathBuf),
}

/// Most slots one host line may ask for: a typo, not a machine, past it.
const MAX_SLOTS: usize = 4096;

/// The hosts of the hostfile at `path`, in order (blank lines and `#` comments skipped; a host
/// named twice is an error, since its ranks would be counted twice).
pub fn read(path: &Path) -> Result<Vec<Host>, HostfileError> {
    let text = crate::input::read_text(path, crate::input::FileKind::Hostfile)?;
    let mut hosts: Vec<Host> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |detail: String| HostfileError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            detail,
        };
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default().to_string();
        let mut slots = 1;
        for w in words {
            let n = w
                .strip_prefix("slots=")
                .ok_or_else(|| bad(format!("'{w}': only `slots=N` may follow the host")))?;
            slots = n
                .parse()
                .ok()
                .filter(|s| (1..=MAX_SLOTS).contains(s))
                .ok_or_else(|| bad(format!("slots={n}: give a number from 1 to {MAX_SLOTS}")))?;
        }
        if hosts.iter().any(|h| h.name == name) {
            return Err(bad(format!("host {name} is listed twice")));
        }
        hosts.push(Host { name, slots });
    }
    if hosts.is_empty() {
        return Err(HostfileError::Empty(path.to_path_buf()));
    }
    Ok(hosts)
}

/// The hostfile text of `hosts`.
pub fn render(hosts: &[Host]) -> String {
    hosts
        .iter()
        .map(|h| format!("{} slots={}\n", h.name, h.slots))
        .collect()
}

/// The host of MPI rank `rank` when `hosts` run a job mapped by slot (mpirun's default: each
/// host's slots filled in order).
pub fn host_of_rank(hosts: &[Host], rank: usize) -> Option<&Host> {
    let mut first = 0;
    hosts.iter().find(|h| {
        first += h.slots;
        rank < first
    })
}

/// `hosts` cut to the most leading ones over whose ranks x `workers` the global `batch`
/// splits evenly (train refuses any other), and the rest, spares until a restart needs them.
/// All of them when nothing splits it or the split is unknown: train then says why.
pub fn split_for_batch(hosts: Vec<Host>, split: Option<(usize, usize)>) -> (Vec<Host>, Vec<Host>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Host>, HostfileError> {
        let path = std::env::temp_dir().join(format!(
            "dptrain-hostfile-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::write(&path, text).unwrap();
        let got = read(&path);
        std::fs::remove_file(&path).unwrap();
        got
    }

    #[test]
    fn hostfiles_parse_with_slots_and_comments_and_ranks_map_by_slot() {
        let hosts = parse("# cluster\n10.0.0.1 slots=2\n\n10.0.0.2  # one rank\n").unwrap();
        assert_eq!(hosts.len(), 2);
        assert_eq!((hosts[0].slots, hosts[1].slots), (2, 1));
        let of = |r| host_of_rank(&hosts, r).map(|h| h.name.as_str());
        assert_eq!(
            (of(0), of(1), of(2), of(3)),
            (Some("10.0.0.1"), Some("10.0.0.1"), Some("10.0.0.2"), None)
        );
        assert_eq!(parse(&render(&hosts)).unwrap(), hosts);
    }

    #[test]
    fn survivors_the_batch_does_not_split_over_wait_as_spares() {
        let hosts = |n: usize| -> Vec<Host> {
            (1..=n)
                .map(|i| Host {
                    name: format!("h{i}"),
                    slots: 1,
                })
                .collect()
        };
        let (used, spares) = split_for_batch(hosts(3), Some((64, 1)));
        assert_eq!((used.len(), spares.len()), (2, 1));
        assert_eq!(spares[0].name, "h3");
        let (used, spares) = split_for_batch(hosts(3), Some((96, 2)));
        assert_eq!((used.len(), spares.len()), (3, 0));
        let (used, _) = split_for_batch(hosts(3), None);
        assert_eq!(used.len(), 3);
    }

    #[test]
    fn bad_hostfiles_name_the_line() {
        for (text, says) in [
            ("a\nb max_slots=3\n", "line 2"),
            ("a slots=0\n", "slots=0"),
            ("a\na\n", "twice"),
            ("# nothing\n", "no hosts"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
