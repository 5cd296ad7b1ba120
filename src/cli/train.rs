//! `dptrain train`: a run as configured, its report, and what it printed at the end.

use crate::config::TrainOptions;
use crate::terminal::{print_error, print_warning};
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args, Default)]
pub(super) struct TrainCmd {
    /// TOML file with options (same names as the flags); flags given here win.
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    #[command(flatten)]
    pub(super) options: TrainOptions,
}

/// The run the flags and the `--config` file describe; a resume follows its checkpoint's
/// run's model, data, batch, seed, training limit, `--skip-bad-samples` and workers where
/// neither gives them
/// ([`crate::train::follow::follow_run_options`]), and a value so taken that is refused says
/// where it came from; then each group of its gradient exchange that the options resolve
/// with ([`take_exchange`]).
fn resolve(t: &TrainCmd) -> Result<crate::config::TrainConfig, String> {
    let file = t
        .config
        .as_deref()
        .map(TrainOptions::from_toml_file)
        .transpose()?;
    let given = match &file {
        Some(f) => f.clone().overlaid_with(&t.options),
        None => t.options.clone(),
    };
    let followed = crate::train::follow::follow_run_options(&given);
    let flags = followed.options.overlaid_with(&t.options);
    let resolve = |flags: &TrainOptions| match (&t.config, &file) {
        (Some(path), Some(file)) => file.clone().resolve_under(path, flags),
        _ => flags.resolve(),
    };
    let mut taken = followed.taken;
    let as_default = followed.taken_as_default;
    // The run's options set aside with a group the options given hold another of.
    let aside = (!followed.set_aside.is_empty()).then(|| {
        format!(
            "the run's {}, whose group the options given hold another of (give it too to keep \
             it)",
            followed.set_aside.join(", ")
        )
    });
    // A recorded group is judged by itself on a run this resume's options cannot change (a
    // config file's, a --comm-timeout, fewer --workers): the run's workers, synthetic data.
    let workers = followed.recorded_workers;
    let baseline = TrainOptions {
        dataset: Some("synthetic".into()),
        transport: flags.transport.clone(),
        workers,
        batch: workers,
        resume: flags.resume.clone(),
        resume_changed: flags.resume_changed,
        ..Default::default()
    };
    let kept = keep_unfollowed(followed.kept, &flags)?;
    let (mut cfg, dropped) = take_exchange(flags, followed.groups, &baseline, &mut taken, resolve)
        .map_err(|e| {
            // The default values taken only where the refusal names one (`--batch 64`
            // that the given --workers do not divide): otherwise they are noise.
            let named = as_default.iter().filter(|flag| names(&e, flag));
            let all: Vec<&str> = taken.iter().chain(named).map(String::as_str).collect();
            let took = (!all.is_empty()).then(|| {
                format!(
                    "took {} from the checkpoint's run, as it does for each of these options \
                     not given",
                    all.join(", ")
                )
            });
            let set_aside = aside.as_ref().map(|a| format!("did not take {a}"));
            let said: Vec<String> = took.into_iter().chain(set_aside).collect();
            match said.is_empty() {
                true => e,
                false => format!("{e} (this resume {})", said.join("; it ")),
            }
        })?;
    cfg.warnings
        .extend(aside.map(|a| format!("not resuming with {a}")));
    cfg.warnings.extend(dropped);
    cfg.warnings.extend(kept.warnings);
    cfg.exchange = cfg.exchange.clone().keeping(&kept.options);
    cfg.exchange_kept = kept.flags;
    cfg.intra_link_followed = cfg.intra_link.is_some() && given.intra_bandwidth.is_none();
    cfg.skip_bad_samples_followed = followed.skip_bad_samples;
    cfg.options_from_checkpoint = taken;
    cfg.data_from_checkpoint = followed.data;
    cfg.takes_unread_exchange = followed.takes_unread_exchange;
    Ok(cfg)
}

/// Whether the refusal `text` names `flag` with its value (`--batch 64`), as a whole: not
/// `--batch 640`.
fn names(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let mut after = text[at + flag.len()..].chars();
        match (after.next(), after.next()) {
            (Some(c), _) if c.is_alphanumeric() => false,
            (Some('.'), Some(d)) => !d.is_ascii_digit(),
            _ => true,
        }
    })
}

/// Resolves `flags` with the groups of the checkpoint's run's gradient exchange laid under
/// them: all at once where they resolve together (a resume of the run's own options), else
/// one at a time in order, each kept where the options still resolve with it, so a group
/// that conflicts with an option given (the run's `--compress powersgd:2` under a given
/// `--comm tree`, its link under `--comm shm`) is left to its default, with a warning
/// naming why, rather than refuse the resume. A group refused on its own too (laid under
/// `baseline`, a run of the recorded workers that nothing of this resume changes) holds a
/// value no run could have had: an edited record, refused as an unreadable one is
/// (`bad_record`), or under `--resume-changed` left with a warning. The options' own checks
/// decide, so no rule is written twice. `flags` themselves must resolve; the groups taken
/// are added to `taken`. Returns the configuration and the warnings.
fn take_exchange(
    flags: TrainOptions,
    groups: Vec<crate::config::TakenGroup>,
    baseline: &TrainOptions,
    taken: &mut Vec<String>,
    resolve: impl Fn(&TrainOptions) -> Result<crate::config::TrainConfig, String>,
) -> Result<(crate::config::TrainConfig, Vec<String>), String> {
    let lay = |under: &TrainOptions, flags: &TrainOptions| under.clone().overlaid_with(flags);
    let all = groups
        .iter()
        .fold(flags.clone(), |f, g| lay(&g.options, &f));
    if let Ok(cfg) = resolve(&all) {
        taken.extend(groups.into_iter().flat_map(|g| g.flags));
        return Ok((cfg, Vec::new()));
    }
    let mut cfg = resolve(&flags)?;
    let mut flags = flags;
    let mut dropped = Vec::new();
    for group in groups {
        let with = lay(&group.options, &flags);
        match resolve(&with) {
            Ok(c) => {
                (cfg, flags) = (c, with);
                taken.extend(group.flags);
            }
            Err(e) => match lay(&group.options, baseline).resolve() {
                Err(bad) if !baseline.resume_changed => {
                    return Err(bad_record(baseline, &group, bad))
                }
                Err(bad) => dropped.push(format!(
                    "not resuming with the checkpoint's run's {}, which no run could have \
                     had: {bad}",
                    group.flags.join(", ")
                )),
                Ok(_) => dropped.push(format!(
                    "not resuming with the checkpoint's run's {}: with the options given, {e}",
                    group.flags.join(", ")
                )),
            },
        }
    }
    Ok((cfg, dropped))
}

/// The recorded groups a resume keeps in its own record without following them.
#[derive(Default)]
struct KeptGroups {
    /// Their options laid together.
    options: TrainOptions,
    /// The same as flags, for the note.
    flags: Vec<String>,
    /// Those not kept under `--resume-changed`, which no run could have had.
    warnings: Vec<String>,
}

/// The recorded groups that mean nothing in this resume's number of processes (`groups`:
/// `--hierarchical`, `--intra-*` in one process), kept in the resumed run's record so that a
/// later resume over MPI follows them still, each judged by the values' own checks
/// ([`TrainOptions::check_mpi_only_values`]): one that no run could have had is refused as an
/// edited record, or under `--resume-changed` left out with a warning (`flags`: the resume).
fn keep_unfollowed(
    groups: Vec<crate::config::TakenGroup>,
    flags: &TrainOptions,
) -> Result<KeptGroups, String> {
    let mut kept = KeptGroups::default();
    for group in groups {
        match group.options.check_mpi_only_values() {
            Ok(()) => {
                kept.options = kept.options.overlaid_with(&group.options);
                kept.flags.extend(group.flags);
            }
            Err(bad) if !flags.resume_changed => return Err(bad_record(flags, &group, bad)),
            Err(bad) => kept.warnings.push(format!(
                "not keeping the checkpoint's run's {} for a resume over MPI, which no run \
                 could have had: {bad}",
                group.flags.join(", ")
            )),
        }
    }
    Ok(kept)
}

/// The refusal of a resume whose checkpoint records a `group` of options that no run could
/// have had (`why`: the options' own refusal): said as an unreadable record is.
fn bad_record(flags: &TrainOptions, group: &crate::config::TakenGroup, why: String) -> String {
    crate::train::ResumeError::UnreadableRecord {
        path: flags.resume.clone().unwrap_or_default(),
        record: crate::train::recorded::Record::Exchange,
        why: format!(
            "the checkpoint records {}, which no run could have had: {why}",
            group.flags.join(", ")
        ),
    }
    .to_string()
}

/// Trains as the flags (and the `--config` file) say; over MPI this process is one rank.
pub(super) fn run(t: TrainCmd) -> Result<(), String> {
    let cfg = resolve(&t)?;
    let json_log = cfg.log_format == crate::config::LogFormat::Json;
    let group = crate::train::ProcessGroup::start(cfg.transport, cfg.comm_timeout)?;
    let (rank, processes) = (group.rank(), group.size());
    // Beating from before the data loads until after MPI ends (`dptrain launch` watches it).
    let heartbeat = cfg
        .heartbeat
        .map(|to| crate::train::heartbeat::Heartbeat::start(to, rank))
        .transpose()
        .map_err(|e| format!("--heartbeat: cannot send heartbeats: {e}"))?;
    // Warnings are shown as they come and kept for the JSON done line, which lists every one.
    let said = std::cell::RefCell::new(Vec::new());
    let warn = |w: &str| {
        print_warning(w);
        said.borrow_mut().push(w.to_string());
    };
    let result = crate::train::train_in(cfg, &group, &warn);
    // The report is a view of the files the run wrote (also before a late write error);
    // failing to draw it loses no result.
    let written = result.as_ref().map_or_else(|e| e.summary(), Some);
    if let (Some(s), 0) = (written, rank) {
        if let Err(e) = crate::report::write_run_report(&s.run_dir) {
            print_warning(&format!(
                "cannot write the run report (the run's results are in its other files): {e}"
            ));
        }
    }
    if let (Err(e), true) = (&result, processes > 1) {
        // Reported before the ranks part: once one rank exits with an error, mpirun
        // may stop the others before they have said why.
        print_error(&format!(
            "rank {rank} of {processes}: {}",
            explained(e, t.config.as_deref())
        ));
        group.end(false);
        crate::interrupt::exit_cleaning_up(1);
    }
    group.end(result.is_ok());
    drop(heartbeat);
    let s = result.map_err(|e| explained(&e, t.config.as_deref()))?;
    if rank != 0 {
        return Ok(());
    }
    let warnings = s.warnings();
    if json_log {
        let mut all = said.take();
        all.extend(warnings);
        let line = serde_json::json!({
            "kind": "done",
            "final_test_accuracy": s.final_test_accuracy,
            "images_per_s": s.images_per_s,
            "wall_seconds": s.wall_seconds,
            "breakdown": s.breakdown,
            "skipped_nonfinite_updates": s.skipped_nonfinite_updates,
            "steps": s.steps,
            "resumed_from": s.resumed_from,
            "warnings": all,
            "run_dir": s.run_dir,
        });
        crate::outln!("{line}");
        return Ok(());
    }
    // With no timed step the breakdown is only the warning below, said once there.
    let breakdown = if s.breakdown.steps > 0 {
        format!("; {}", s.breakdown.describe())
    } else {
        String::new()
    };
    crate::outln!(
        "done: test accuracy {:.2}%, {:.0} images/s, {:.1} s{breakdown}\nrun directory: {}",
        100.0 * s.final_test_accuracy,
        s.images_per_s,
        s.wall_seconds,
        s.run_dir.display()
    );
    // A resumed run's figures are its own steps', which would otherwise read as the run's.
    if let Some(r) = &s.resumed_from {
        crate::outln!(
            "{} ({}): the images/s, time and step breakdown above are of this run's steps",
            r.describe(),
            r.checkpoint.display()
        );
    }
    for w in &warnings {
        crate::outln!("warning: {w}");
    }
    Ok(())
}

/// A run's error, saying where its options came from when a config file gave some: a value
/// refused while the run is prepared may be the file's, and the messages name flags. (Not
/// for the test images' decoding or the processes' handshake, which no option decides.)
fn explained(e: &crate::train::TrainError, config: Option<&Path>) -> String {
    use crate::train::{PrepareError, TrainError};
    match (e, config) {
        (TrainError::Prepare(PrepareError::TestSplit(_) | PrepareError::Processes(_)), _) => {
            e.to_string()
        }
        (TrainError::Prepare(_), Some(path)) => format!(
            "{e} (options also came from config file {}, whose keys are the flags' names \
             without --)",
            path.display()
        ),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{PrepareError, TrainError};

    #[test]
    fn a_refusal_names_a_flag_with_its_whole_value() {
        let e = "--batch 64 must be a positive multiple of --workers 3 (each ...)";
        assert!(names(e, "--batch 64") && names(e, "--workers 3"));
        assert!(!names(e, "--batch 6") && !names(e, "--workers 30"));
        assert!(names("give --lr 0.5.", "--lr 0.5") && !names("--lr 0.55", "--lr 0.5"));
        assert!(!names("--lr 1.5", "--lr 1") && !names(e, "--seed 1"));
    }

    #[test]
    fn an_error_preparing_a_run_names_the_config_file_it_may_come_from() {
        let e = TrainError::Prepare(PrepareError::Config("--run-dir: x".into()));
        let file = Path::new("run.toml");
        assert_eq!(explained(&e, None), "--run-dir: x");
        assert!(
            explained(&e, Some(file)).ends_with("(options also came from config file run.toml, whose keys are the flags' names without --)"),
            "{}",
            explained(&e, Some(file))
        );
        // A failure of training itself, or of the processes' handshake, is not the file's.
        let late = TrainError::Start("no thread".into());
        assert_eq!(explained(&late, Some(file)), "no thread");
        let handshake = TrainError::Prepare(PrepareError::Processes("rank 1 differs".into()));
        assert_eq!(explained(&handshake, Some(file)), "rank 1 differs");
    }
}
