//! The options that make a run the run it is (its model, dataset, global batch, seed and
//! training limit), taken from the checkpoint a resume names where the options leave them out,
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
}

/// What a resume takes from its checkpoint's run where neither the command line nor a config
/// file (`given`, the two laid together) says: the model, the dataset and its directory, the
/// global batch, the seed and the training limit. These decide the run's data order and
/// steps, so a resume under others is another run ([`crate::train::check_resume`] refuses
/// it); followed, `--resume CK` alone continues the run of any model on any data that wrote
/// CK. Read from the checkpoint's header alone, before the options are resolved, so that a
/// followed value meets every check a given one meets (a batch that the given `--workers`
/// do not divide, say). Nothing is taken from a header that does not read (the resume then
/// refuses the checkpoint, saying why), from one that records no run (an older dptrain's),
/// or for a model whose file is no longer where its run found it (the resume then refuses
/// the model, naming that file).
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
    let o = &mut followed.options;
    if given.model.is_none() {
        let model =
            crate::train::checkpoint::model_flag(header.description.as_ref(), path).filter(|m| {
                crate::model::builtin_names().contains(&m.as_str()) || Path::new(m).is_file()
            });
        if let Some(m) = model {
            if m != crate::config::DEFAULT_MODEL {
                followed.taken.push(format!("--model {m}"));
            }
            o.model = Some(m);
        }
    }
    if given.dataset.is_none() {
        let (dataset, data_dir) = recorded_data(run, given.data_dir.is_some());
        let default = dataset == crate::config::DEFAULT_DATASET && data_dir.is_none();
        if !default {
            followed.taken.push(format!("--dataset {dataset}"));
        }
        if let Some(d) = &data_dir {
            followed.taken.push(format!("--data-dir {}", d.display()));
        }
        o.dataset = Some(dataset);
        o.data_dir = data_dir;
    }
    if given.batch.is_none() {
        if run.batch != crate::config::DEFAULT_BATCH {
            followed.taken.push(format!("--batch {}", run.batch));
        }
        o.batch = Some(run.batch);
    }
    if given.seed.is_none() {
        if run.seed != crate::config::DEFAULT_SEED {
            followed.taken.push(format!("--seed {}", run.seed));
        }
        o.seed = Some(run.seed);
    }
    if given.train_limit.is_none() {
        if let Some(n) = run.train_limit {
            followed.taken.push(format!("--train-limit {n}"));
            o.train_limit = Some(n);
        }
    }
    followed
}

/// The dataset (and `--data-dir`, unless `dir_given`) the checkpoint's run was given. A
/// directory given relative to where that run started, and not found from here, is taken as
/// the absolute path the run resolved it to (`data_path`): a resume started elsewhere finds
/// the same data.
fn recorded_data(
    run: &crate::train::checkpoint::RunIdentity,
    dir_given: bool,
) -> (String, Option<PathBuf>) {
    let absolute = run.data_path.as_deref().map(PathBuf::from);
    let found = |p: &str| Path::new(p).exists();
    let data_dir = match (&run.data_dir, &absolute) {
        _ if dir_given => None,
        (Some(d), Some(abs)) if !found(d) => Some(abs.clone()),
        (d, _) => d.as_deref().map(PathBuf::from),
    };
    let dataset = match (run.dataset.split_once(':'), &absolute) {
        (Some((kind, dir)), Some(abs)) if run.data_dir.is_none() && !found(dir) => {
            format!("{kind}:{}", abs.display())
        }
        _ => run.dataset.clone(),
    };
    (dataset, data_dir)
}
