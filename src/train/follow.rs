//! The options that make a run the run it is (its model, dataset, global batch, seed,
//! training limit and whether it leaves bad samples out, its workers and how they combine
//! gradients), taken from the checkpoint a resume names where the options leave them out,
//! before the options are resolved: `--resume CK` alone continues the run that wrote CK.
//! The recipe and routine are followed after, on the resolved configuration
//! ([`super::recipe`]); the input size and normalisation in [`super::inputs`].

use crate::config::TrainOptions;
use std::path::{Path, PathBuf};

/// The options [`follow_run_options`] took from a checkpoint's run.
#[derive(Debug, Default)]
pub struct FollowedOptions {
    /// Those options set (the others left unset): laid under the given ones
    /// ([`TrainOptions::overlaid_with`]), they fill only what was not given.
    pub options: TrainOptions,
    /// Each taken value that differs from the option's default, as its flag (`--batch 32`).
    pub taken: Vec<String>,
    /// Whether `--skip-bad-samples` was taken (said by itself, with its off form,
    /// `crate::train`).
    pub skip_bad_samples: bool,
    /// The data's place, where it was taken from the run (`--data-dir DIR`, or `--dataset
    /// KIND:PATH`), as that flag.
    pub data: Option<String>,
    /// Each taken value equal to the option's default, as its flag: not said in the note
    /// (the run would have had it anyway), but named beside `taken` where a taken value is
    /// refused (`--batch 64` that the given `--workers 3` do not divide).
    pub taken_as_default: Vec<String>,
    /// The groups of the run's gradient exchange to take, each where the options resolve
    /// with it (`cli::train`), in order.
    pub groups: Vec<crate::config::TakenGroup>,
    /// The groups of the run's gradient exchange that mean nothing in the resume's number of
    /// processes (`--hierarchical`, `--intra-*` in one process): not followed, but kept in
    /// the record the resumed run writes (`cli::train`), so that a later resume over MPI
    /// still follows them.
    pub kept: Vec<crate::config::TakenGroup>,
    /// Whether the resume would have taken from the run's record of its gradient exchange,
    /// which does not read back.
    pub takes_unread_exchange: bool,
    /// The run's workers per process, where its record of its gradient exchange reads: what
    /// a recorded group is judged on by itself (`cli::train`).
    pub recorded_workers: Option<usize>,
    /// The run's options not taken because the options given hold another of their group
    /// (`--link-bandwidth 1Gbit` where `--link-latency` is given), as flags.
    pub set_aside: Vec<String>,
}

impl FollowedOptions {
    /// Records a value taken, as its flag: in `taken`, or where it is the option's default
    /// (`default`) in `taken_as_default`.
    fn take(&mut self, flag: String, default: bool) {
        match default {
            true => self.taken_as_default.push(flag),
            false => self.taken.push(flag),
        }
    }
}

/// What a resume takes from its checkpoint's run where neither the command line nor a config
/// file (`given`, the two laid together) says: the model, the dataset and its directory, the
/// global batch, the seed, the training limit, `--skip-bad-samples` (of data that can hold
/// bad samples) and the workers, and the groups of its gradient exchange to try
/// (`follow_exchange`). These decide the run's data order and
/// steps, so a resume under others is another run ([`crate::train::check_resume`] refuses
/// it); followed, `--resume CK` alone continues the run of any model on any data that wrote
/// CK. Read from the checkpoint's header alone, before the options are resolved, so that a
/// followed value meets every check a given one meets (a batch that the given `--workers`
/// do not divide, say; a model file or data no longer where the run found it, said naming
/// that path). Nothing is taken from a header that does not read (the resume then refuses
/// the checkpoint, saying why) or from one that records no run (an older dptrain's). A
/// dataset given without a directory takes the run's directory when it names the run's
/// dataset; a directory given alone takes the run's dataset kind.
pub fn follow_run_options(given: &TrainOptions) -> FollowedOptions {
    let mut followed = FollowedOptions::default();
    let Some(path) = given.resume.as_deref() else {
        return followed;
    };
    let Ok(header) = crate::train::checkpoint::read_header(path) else {
        return followed;
    };
    let Some(run) = header.state.run.as_ref() else {
        return followed;
    };
    let mut options = TrainOptions::default();
    let o = &mut options;
    let one_process = given.transport.as_deref() != Some("mpi");
    if given.model.is_none() {
        if let Some(m) = recorded_model(&header, path, one_process) {
            followed.take(format!("--model {m}"), m == crate::config::DEFAULT_MODEL);
            o.model = Some(m);
        }
    }
    let data = recorded_data(run, one_process);
    match (&given.dataset, &given.data_dir) {
        (None, None) => {
            let (dataset, data_dir) = data;
            let default = dataset == crate::config::DEFAULT_DATASET && data_dir.is_none();
            followed.take(format!("--dataset {dataset}"), default);
            if let Some(d) = &data_dir {
                followed.taken.push(format!("--data-dir {}", d.display()));
                followed.data = Some(format!("--data-dir {}", d.display()));
            } else if run.data_path.is_some() && dataset.contains(':') {
                // `kind:PATH` names its own place.
                followed.data = Some(format!("--dataset {dataset}"));
            }
            o.dataset = Some(dataset);
            o.data_dir = data_dir;
        }
        // A directory given: the run's dataset kind with it (not a directory its name held).
        (None, Some(_)) => {
            let kind = run
                .dataset
                .split_once(':')
                .filter(|_| run.data_path.is_some());
            let kind = kind.map_or(run.dataset.as_str(), |(kind, _)| kind);
            followed.taken.push(format!("--dataset {kind}"));
            o.dataset = Some(kind.to_string());
        }
        // The run's dataset named again without its directory: the run's directory with it.
        (Some(named), None) if *named == run.dataset => {
            if let (_, Some(d)) = data {
                followed.taken.push(format!("--data-dir {}", d.display()));
                followed.data = Some(format!("--data-dir {}", d.display()));
                o.data_dir = Some(d);
            }
        }
        _ => {}
    }
    if given.batch.is_none() {
        let default = run.batch == crate::config::DEFAULT_BATCH;
        followed.take(format!("--batch {}", run.batch), default);
        o.batch = Some(run.batch);
    }
    if given.seed.is_none() {
        let default = run.seed == crate::config::DEFAULT_SEED;
        followed.take(format!("--seed {}", run.seed), default);
        o.seed = Some(run.seed);
    }
    if given.train_limit.is_none() {
        if let Some(n) = run.train_limit {
            followed.taken.push(format!("--train-limit {n}"));
            o.train_limit = Some(n);
        }
    }
    // A run that left bad samples out goes on leaving them out (its batches were shortened
    // by them) unless told otherwise (`--skip-bad-samples=false`), and one that did not may
    // start to.
    if run.skip_bad_samples == Some(true)
        && run.can_hold_bad_samples()
        && given.skip_bad_samples.is_none()
    {
        followed.skip_bad_samples = true;
        o.skip_bad_samples = Some(true);
    }
    followed.options = options;
    follow_exchange(given, run, one_process, &mut followed);
    followed
}

/// Takes the run's workers where `given` leaves them out ([`followed_workers`]), and sets
/// aside the groups of its record of how they combined gradients
/// ([`crate::config::Exchange`]) that `given` gives none of and that mean something in the
/// resume's transport ([`crate::config::Exchange::applies`]), for `cli::train` to take each
/// that the options resolve with; those that mean nothing there, to keep in the resumed
/// run's record (`kept`). A record that does not read back is taken nothing from;
/// where the resume would have taken from it, `takes_unread_exchange` says so, and the
/// resume refuses it (`crate::config::TrainConfig::takes_unread_exchange`).
fn follow_exchange(
    given: &TrainOptions,
    run: &crate::train::checkpoint::RunIdentity,
    one_process: bool,
    followed: &mut FollowedOptions,
) {
    if given.workers.is_none() {
        if let Some(w) = followed_workers(run, one_process) {
            followed.take(
                format!("--workers {w}"),
                w == crate::config::DEFAULT_WORKERS,
            );
            followed.options.workers = Some(w);
        }
    }
    use crate::config::Exchange;
    use crate::train::recorded::Recorded;
    match &run.exchange {
        Recorded::Read(e) => {
            followed.recorded_workers = Some(e.workers);
            followed.groups = e.groups_to_take(given, |group, value| {
                Exchange::applies(group, Some(value), one_process)
            });
            // Whatever their value: `--comm mpi-native` is not kept (a resume in one process
            // runs a mode of its own, which its record says).
            followed.kept = e.groups_to_take(given, |group, _| {
                !Exchange::applies(group, None, one_process)
            });
            followed.set_aside = e.set_aside(given);
        }
        Recorded::Unreadable(_) => {
            let applies = |group| Exchange::applies(group, None, one_process);
            let workers_needed = !one_process && given.workers.is_none();
            followed.takes_unread_exchange =
                workers_needed || !Exchange::every_group_given(given, applies);
        }
        Recorded::Absent => {}
    }
}

/// The `--workers` a resume not given them takes from the checkpoint's run (`run`): in one
/// process, as many as the whole run had (its `world`); over MPI, as many per process as
/// its processes had, where it ran several (a run of one process says nothing of how many
/// ranks now share its workers) and its record reads. `dptrain launch` splits its hosts
/// for the same count.
pub fn followed_workers(
    run: &crate::train::checkpoint::RunIdentity,
    one_process: bool,
) -> Option<usize> {
    match (one_process, run.exchange.read()) {
        (true, _) => Some(run.world),
        (false, Some(e)) if run.world > e.workers => Some(e.workers),
        (false, _) => None,
    }
}

/// The `--model` the checkpoint's run was given (`checkpoint::model_flag`): a built-in's name,
/// or a model file: in one process at the absolute path its run resolved it to, where recorded
/// (a file moved since is then not found there, and the resume says so naming that path,
/// rather than load another file of the same relative name from here); over MPI as given,
/// each rank resolving it on its own file system.
fn recorded_model(
    header: &crate::train::checkpoint::Header,
    path: &Path,
    one_process: bool,
) -> Option<String> {
    let given = crate::train::checkpoint::model_flag(header.description.as_ref(), path)?;
    let resolved = header
        .description
        .as_ref()
        .and_then(|d| d.model_path.clone())
        .filter(|_| one_process && !crate::model::builtin_names().contains(&given.as_str()));
    Some(resolved.unwrap_or(given))
}

/// The dataset and `--data-dir` the checkpoint's run was given. In one process, a directory
/// (or a file: a packed set) is taken at the absolute path that run resolved it to
/// (`data_path`): a resume started from another directory reads the same data, and one whose
/// data has moved is told that path is not found, rather than read another `data/` of the
/// same relative name. Over MPI each rank would resolve a path on its own file system, and the
/// ranks compare the data as named (`crate::train::check_resume`): named as the run named it.
fn recorded_data(
    run: &crate::train::checkpoint::RunIdentity,
    one_process: bool,
) -> (String, Option<PathBuf>) {
    let absolute = run
        .data_path
        .as_deref()
        .map(PathBuf::from)
        .filter(|_| one_process);
    // `kind:DIR` names its directory; `synthetic:CxHxW` names none (no data_path).
    let embedded = run
        .dataset
        .split_once(':')
        .filter(|_| run.data_path.is_some() && run.data_dir.is_none());
    match (&run.data_dir, embedded, absolute) {
        (Some(_), _, Some(abs)) => (run.dataset.clone(), Some(abs)),
        (Some(dir), _, None) => (run.dataset.clone(), Some(PathBuf::from(dir))),
        (None, Some((kind, _)), Some(abs)) => (format!("{kind}:{}", abs.display()), None),
        _ => (run.dataset.clone(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::checkpoint::RunIdentity;

    fn run(dataset: &str, data_dir: Option<&str>, data_path: Option<&Path>) -> RunIdentity {
        RunIdentity {
            dataset: dataset.into(),
            data_dir: data_dir.map(str::to_string),
            data_path: data_path.map(|p| p.display().to_string()),
            batch: 64,
            seed: 1,
            train_limit: None,
            skip_bad_samples: Some(false),
            world: 1,
            epochs: Some(1),
            recipe: crate::train::recorded::Recorded::Absent,
            routine: crate::train::recorded::Recorded::Absent,
            exchange: crate::train::recorded::Recorded::Absent,
        }
    }

    #[test]
    fn the_workers_are_followed_as_the_resume_can_have_them() {
        let workers = |world: usize, per_process: Option<usize>, one_process: bool| {
            let mut recorded = run("mnist", None, None);
            recorded.world = world;
            recorded.exchange = match per_process {
                Some(w) => crate::train::recorded::Recorded::Read(crate::config::Exchange {
                    workers: w,
                    comm: Some("ring".into()),
                    ..Default::default()
                }),
                None => crate::train::recorded::Recorded::Absent,
            };
            let mut followed = FollowedOptions::default();
            follow_exchange(
                &TrainOptions::default(),
                &recorded,
                one_process,
                &mut followed,
            );
            let comm = followed.groups.first().and_then(|g| g.options.comm.clone());
            (followed.options.workers, comm)
        };
        let ring = Some("ring".to_string());
        // In one process: the whole run's workers, from a run of one process or several.
        assert_eq!(workers(4, Some(4), true), (Some(4), ring.clone()));
        assert_eq!(workers(4, Some(2), true), (Some(4), ring.clone()));
        assert_eq!(workers(3, None, true), (Some(3), None));
        // Over MPI: a process's workers, where the run had several processes; from a run of
        // one, the ranks now sharing its workers are not known.
        assert_eq!(workers(4, Some(2), false), (Some(2), ring.clone()));
        assert_eq!(workers(2, Some(2), false), (None, ring));
        assert_eq!(workers(4, None, false), (None, None));
        // Given, never replaced.
        let mut followed = FollowedOptions::default();
        let given = TrainOptions {
            workers: Some(3),
            ..Default::default()
        };
        follow_exchange(&given, &run("mnist", None, None), true, &mut followed);
        assert_eq!(followed.options.workers, None);
    }

    #[test]
    fn the_data_is_followed_where_the_run_found_it() {
        let abs = Path::new("/data/resolved");
        // A relative --data-dir: at the absolute path in one process (found there or not), as
        // named over MPI.
        let relative = run("idx", Some("data"), Some(abs));
        assert_eq!(
            recorded_data(&relative, true),
            ("idx".into(), Some(abs.into()))
        );
        let named = ("idx".to_string(), Some(PathBuf::from("data")));
        assert_eq!(recorded_data(&relative, false), named);
        assert_eq!(recorded_data(&run("idx", Some("data"), None), true), named);
        // A directory in the name: rewritten to the absolute path alike.
        let embedded = run("idx:data", None, Some(abs));
        let want = format!("idx:{}", abs.display());
        assert_eq!(recorded_data(&embedded, true), (want, None));
        assert_eq!(recorded_data(&embedded, false), ("idx:data".into(), None));
        // Synthetic data names no directory; the bundled MNIST none either.
        let synthetic = run("synthetic:1x28x28:10", None, None);
        let same = ("synthetic:1x28x28:10".to_string(), None);
        assert_eq!(recorded_data(&synthetic, true), same);
        assert_eq!(
            recorded_data(&run("mnist", None, Some(abs)), true),
            ("mnist".into(), None)
        );
    }
}
