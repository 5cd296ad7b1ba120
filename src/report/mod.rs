//! Run reports: `report.md` and PNG plots in a run directory, and side-by-side comparisons.
//!
//! Everything here reads only what a run leaves behind (`summary.json`, `metrics.jsonl`), as
//! JSON values rather than the writer's structs, so `dptrain report` also works on older run
//! directories and on runs that stopped early (no summary, some epoch lines). The files read are
//! [`run_data`]'s, the pages [`markdown`]'s, the plots [`plot`]'s.

pub mod markdown;
pub mod plot;
pub mod run_data;

pub use markdown::{
    breakdown_table, check_run_report, write_comparison, write_report_of, write_run_report,
};
pub use run_data::{EpochRow, Phases, RunData, PHASES};
