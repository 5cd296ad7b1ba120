//! The files a run writes into its run directory, each with its [`Kind`]: how the run
//! directory's rules ([`super::rundir`]) tell a run's file from a user's file of the same name
//! before the first step. A user's `report.md` in a run directory is neither "another run" nor
//! deleted by `--overwrite`; it is refused by name and kept.
//!
//! The kinds of the files the report and the elastic launcher write are defined here, below
//! them, so the run directory can check them; those writers use these constants.

use crate::output::Kind;

/// `metrics.jsonl`: lines of JSON objects, each with its `kind` (older runs' lines have
/// `epoch`); known by its first line.
pub const METRICS_FILE: Kind = Kind {
    what: "a run's metrics dptrain wrote",
    head: 64 << 10,
    is_one: |head| match head.iter().position(|&b| b == b'\n') {
        Some(end) => {
            let first = &head[..end];
            crate::output::is_json_object_with(first, &["kind"])
                || crate::output::is_json_object_with(first, &["epoch"])
        }
        // A first line cut short by a run that stopped while writing it (a resume trims it).
        None => head.starts_with(b"{\""),
    },
};

/// A run's `report.md`, known by its first line.
pub const REPORT_FILE: Kind = Kind {
    what: "a run report dptrain wrote",
    head: 64,
    is_one: |head| head.starts_with(b"# Run report: "),
};

/// The size of the report's figures (width, height), which knows figures written before they
/// carried a `Software` text.
pub const FIGURE_SIZE: (u32, u32) = (800, 480);

/// A figure: a PNG whose `Software` text (PNG's registered keyword) is dptrain's, or one of
/// [`FIGURE_SIZE`] without it (figures written before the text was added).
pub const PLOT_FILE: Kind = Kind {
    what: "a figure dptrain drew",
    head: 4096,
    is_one: |head| {
        const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
        // The signature, then IHDR: length, "IHDR", width and height big-endian.
        let size = |at: usize| {
            head.get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        head.starts_with(PNG)
            && (crate::output::holds(head, b"Software\0dptrain")
                || (size(16), size(20)) == (Some(FIGURE_SIZE.0), Some(FIGURE_SIZE.1)))
    },
};

/// `elastic.json` of `dptrain launch`: an object with its launch report's keys.
pub const ELASTIC_FILE: Kind = Kind {
    what: "an elastic run's record dptrain wrote",
    head: 64 << 20,
    is_one: |bytes| crate::output::is_json_object_with(bytes, &["jobs", "failures", "finished"]),
};

/// The figures of a run's report: loss, accuracy, step breakdown.
pub const RUN_FIGURES: [&str; 3] = ["loss.png", "accuracy.png", "breakdown.png"];

/// Files a run writes into its directory besides its checkpoints and commits, with their kinds.
pub const RUN_FILES: [(&str, &Kind); 7] = [
    ("metrics.jsonl", &METRICS_FILE),
    ("elastic.json", &ELASTIC_FILE),
    ("summary.json", &super::summary::SUMMARY_FILE),
    ("report.md", &REPORT_FILE),
    (RUN_FIGURES[0], &PLOT_FILE),
    (RUN_FIGURES[1], &PLOT_FILE),
    (RUN_FIGURES[2], &PLOT_FILE),
];
