//! `dptrain data export-images`: a dataset written as an ImageFolder (PNG files in class
//! directories named by zero-padded label), staged so that a failed, interrupted or concurrent
//! export never costs an earlier one.
//!
//! Each split is written into `.dptrain-partial-<split>.<pid>` in the output directory. Only
//! when both are complete is an earlier export's split (with `--overwrite`) renamed aside to
//! `.dptrain-replaced-<split>.<pid>`, the new splits renamed into place and the old ones
//! deleted; a rename that fails puts everything back. A staged directory of a process that is
//! still running is another export at work: refused, never touched. What a killed export left
//! is deleted by the next export once that has its data, except an earlier export's split
//! moved aside whose place is empty: the only copy, refused by name.

use super::{DataError, Dataset, DatasetPair};
use crate::output::OutputError;
use image::ImageFormat;
use std::io::Cursor;
use std::path::Path;

/// The split directories an export writes into its output directory.
const SPLITS: [&str; 2] = ["train", "test"];

/// What a staged directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// A new split being written.
    Partial,
    /// An earlier export's split, moved aside until the new one is in place.
    Replaced,
}

impl Stage {
    fn prefix(self) -> &'static str {
        match self {
            Stage::Partial => ".dptrain-partial-",
            Stage::Replaced => ".dptrain-replaced-",
        }
    }

    /// The staged directory of `split` for process `pid`.
    fn name(self, split: &str, pid: u32) -> String {
        format!("{}{split}.{pid}", self.prefix())
    }
}

/// A staged directory found in an output directory.
#[derive(Debug)]
struct Staged {
    name: String,
    stage: Stage,
    split: &'static str,
    pid: u32,
}

/// The staged directory `name` is, if it is exactly one (`<prefix><split>.<pid>`).
fn staged(name: &str) -> Option<Staged> {
    [Stage::Partial, Stage::Replaced]
        .into_iter()
        .find_map(|stage| {
            let (split, pid) = name.strip_prefix(stage.prefix())?.split_once('.')?;
            let split = SPLITS.into_iter().find(|s| *s == split)?;
            if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(Staged {
                name: name.to_string(),
                stage,
                split,
                pid: pid.parse().ok()?,
            })
        })
}

/// An output directory's entries, sorted out.
struct Survey {
    /// `train` and `test`, where present.
    splits: Vec<String>,
    /// Staged directories.
    staged: Vec<Staged>,
    /// Everything else.
    foreign: Vec<String>,
}

fn survey(out: &Path) -> Result<Survey, DataError> {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| DataError::Io {
            path: out.to_path_buf(),
            cause: e,
        })?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut found = Survey {
        splits: Vec::new(),
        staged: Vec::new(),
        foreign: Vec::new(),
    };
    for name in names {
        if SPLITS.contains(&name.as_str()) {
            found.splits.push(name);
        } else if let Some(s) = staged(&name) {
            found.staged.push(s);
        } else {
            found.foreign.push(name);
        }
    }
    Ok(found)
}

/// How [`export`] treats its output directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExportOptions {
    /// The first `limit` samples of each split (all when `None`).
    pub limit: Option<usize>,
    /// Replace an earlier export's `train/` and `test/` (once the new ones are complete).
    pub overwrite: bool,
}

/// Checks that `out` can take an [`export`], deleting nothing: created if absent (one level:
/// its parent must exist), and empty or, with `overwrite`, holding only an earlier export.
/// Refused: an earlier export without `overwrite` (writing into it would mix two datasets),
/// anything else even with it (not ours to delete), another export at work there, and an
/// earlier export's split that an interrupted export moved aside.
pub fn prepare_export_dir(out: &Path, overwrite: bool) -> Result<(), DataError> {
    crate::output::create_dir(out)?;
    let found = survey(out)?;
    let refuse = |what: String, entries: Vec<String>, todo: String| -> Result<(), DataError> {
        Err(OutputError::NotEmpty {
            path: out.to_path_buf(),
            what,
            entries,
            todo,
        }
        .into())
    };
    if let Some(live) = found
        .staged
        .iter()
        .find(|s| crate::output::is_running(s.pid))
    {
        return refuse(
            format!("is being written by another export (process {})", live.pid),
            vec![live.name.clone()],
            format!(
                "wait for it to finish, or choose another directory (if no export is running, \
                 process {} is another program now: delete {} and export again)",
                live.pid, live.name
            ),
        );
    }
    let orphan =
        |s: &&Staged| s.stage == Stage::Replaced && !found.splits.iter().any(|p| p == s.split);
    if let Some(aside) = found.staged.iter().find(orphan) {
        return refuse(
            "holds an earlier export's split that an interrupted export moved aside".into(),
            vec![aside.name.clone()],
            format!(
                "it is the only copy: rename it back to {}/ (or delete it), then export again",
                aside.split
            ),
        );
    }
    let leftovers: Vec<String> = found.staged.iter().map(|s| s.name.clone()).collect();
    check_exported(out, &leftovers)?;
    if !found.foreign.is_empty() {
        return refuse(
            "is not empty".into(),
            found.foreign,
            "exporting into it would mix the images with what is there: choose a new or empty \
             directory (--overwrite only replaces an earlier export's train/ and test/)"
                .into(),
        );
    }
    if !found.splits.is_empty() && !overwrite {
        return refuse(
            "holds an earlier export".into(),
            found.splits,
            "exporting into it would mix two datasets: choose a new or empty directory, or pass \
             --overwrite to replace its train/ and test/ once the new export is written"
                .into(),
        );
    }
    check_exported(out, &found.splits)
}

/// Refuses `splits` of `out` unless they hold only what [`export`] writes: a user's file put
/// among the images would otherwise be deleted with them.
fn check_exported(out: &Path, splits: &[String]) -> Result<(), DataError> {
    let not_ours = not_exported(out, splits);
    if not_ours.is_empty() {
        return Ok(());
    }
    Err(OutputError::NotEmpty {
        path: out.to_path_buf(),
        what: "holds files an export does not write".into(),
        entries: not_ours,
        todo: "an export deletes only what an export writes (class directories of numbered \
               .png files, 000142.png: an earlier export's with --overwrite, an interrupted \
               one's always): move those files away, or choose a new or empty directory"
            .into(),
    }
    .into())
}

/// The entries under `out`'s `splits` (splits or staged splits) that [`export`] does not
/// write, as paths relative to `out`: anything but a directory of digits (a class) holding
/// regular files named `<digits>.png`. Links are not followed.
fn not_exported(out: &Path, splits: &[String]) -> Vec<String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let kind = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.file_type()).ok();
    let names = |dir: &Path| -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            // Not known to hold only images: refused as it is, not deleted half-way.
            .unwrap_or_else(|_| vec![String::from("(cannot be listed)")]);
        n.sort();
        n
    };
    let mut foreign = Vec::new();
    for split in splits {
        let split_dir = out.join(split);
        if !kind(&split_dir).is_some_and(|k| k.is_dir()) {
            foreign.push(split.clone());
            continue;
        }
        for class in names(&split_dir) {
            let class_dir = split_dir.join(&class);
            if !digits(&class) || !kind(&class_dir).is_some_and(|k| k.is_dir()) {
                foreign.push(format!("{split}/{class}"));
                continue;
            }
            for file in names(&class_dir) {
                let exported = file.strip_suffix(".png").is_some_and(digits)
                    && kind(&class_dir.join(&file)).is_some_and(|k| k.is_file());
                if !exported {
                    foreign.push(format!("{split}/{class}/{file}"));
                }
            }
        }
    }
    foreign
}

/// Writes the samples of each split of `pair` into `out` as an ImageFolder (see the module's
/// comment for the staging) and returns the number of files written. `out` is checked with
/// [`prepare_export_dir`]; what killed exports left there is deleted once that check passed.
/// On an error nothing of this export is left and an earlier export is as it was. Every file
/// goes through [`crate::output`].
pub fn export(pair: &DatasetPair, out: &Path, options: &ExportOptions) -> Result<usize, DataError> {
    prepare_export_dir(out, options.overwrite)?;
    let train_n = options.limit.unwrap_or(usize::MAX).min(pair.train.len());
    let mut seen = vec![false; pair.train.num_classes];
    for &label in &pair.train.labels[..train_n] {
        if let Some(s) = seen.get_mut(label as usize) {
            *s = true;
        }
    }
    let missing: Vec<usize> = (0..seen.len()).filter(|&c| !seen[c]).collect();
    if !missing.is_empty() {
        return Err(DataError::ClassesMissing {
            images: train_n,
            missing,
            classes: pair.train.num_classes,
        });
    }
    for left in survey(out)?.staged {
        // Checked by prepare_export_dir: a dead process's, holding only an export's files.
        std::fs::remove_dir_all(out.join(&left.name)).map_err(|cause| OutputError::Io {
            path: out.join(&left.name),
            action: "delete (an interrupted export's)",
            cause,
        })?;
    }
    let pid = std::process::id();
    // A signal while the splits are written removes them; one during the swap below leaves
    // what the next export puts right.
    let staged = SPLITS.map(|split| {
        crate::interrupt::ScratchRegistration::new(&out.join(Stage::Partial.name(split, pid)))
    });
    let mut written = 0;
    for (split, ds) in SPLITS.into_iter().zip([&pair.train, &pair.test]) {
        let n = options.limit.unwrap_or(usize::MAX).min(ds.len());
        if let Err(e) = write_split(ds, n, &out.join(Stage::Partial.name(split, pid))) {
            remove_own(out, Stage::Partial);
            return Err(e);
        }
        written += n;
    }
    drop(staged);
    if let Err(e) = put_in_place(out, options.overwrite) {
        remove_own(out, Stage::Partial);
        return Err(e);
    }
    Ok(written)
}

/// Moves this process's complete staged splits into place: an earlier export's (with
/// `overwrite`, checked again now, minutes after [`prepare_export_dir`]) aside first, deleted
/// only once both new ones are in place; a rename that fails puts back what was moved.
fn put_in_place(out: &Path, overwrite: bool) -> Result<(), DataError> {
    let pid = std::process::id();
    let existing = survey(out)?.splits;
    if !existing.is_empty() && !overwrite {
        return Err(OutputError::NotEmpty {
            path: out.to_path_buf(),
            what: "received another export while this one was written".into(),
            entries: existing,
            todo: "run one export into a directory at a time".into(),
        }
        .into());
    }
    check_exported(out, &existing)?;
    let rename = |from: String, to: String| {
        std::fs::rename(out.join(&from), out.join(&to)).map_err(|cause| OutputError::Io {
            path: out.join(to),
            action: "rename into place",
            cause,
        })
    };
    let mut aside = Vec::new();
    for split in &existing {
        if let Err(e) = rename(split.clone(), Stage::Replaced.name(split, pid)) {
            undo(out, &[], &aside);
            return Err(e.into());
        }
        aside.push(split.clone());
    }
    let mut placed = Vec::new();
    for split in SPLITS {
        if let Err(e) = rename(Stage::Partial.name(split, pid), split.to_string()) {
            undo(out, &placed, &aside);
            return Err(e.into());
        }
        placed.push(split.to_string());
    }
    // A failure here leaves a dead process's staged directory beside its split: the next
    // export deletes it. A signal now removes them (the new export is whole).
    let replaced: Vec<_> = aside
        .iter()
        .map(|split| {
            crate::interrupt::ScratchRegistration::new(&out.join(Stage::Replaced.name(split, pid)))
        })
        .collect();
    for split in &aside {
        let _ = std::fs::remove_dir_all(out.join(Stage::Replaced.name(split, pid)));
    }
    drop(replaced);
    Ok(())
}

/// Puts back what [`put_in_place`] moved before it failed: the new splits placed go back to
/// staging (deleted by the caller), the earlier export's come back.
fn undo(out: &Path, placed: &[String], aside: &[String]) {
    let pid = std::process::id();
    for split in placed {
        let _ = std::fs::rename(out.join(split), out.join(Stage::Partial.name(split, pid)));
    }
    for split in aside {
        let _ = std::fs::rename(out.join(Stage::Replaced.name(split, pid)), out.join(split));
    }
}

/// Deletes this process's staged directories of `stage` in `out` (best effort: a dead
/// process's are deleted by the next export).
fn remove_own(out: &Path, stage: Stage) {
    for split in SPLITS {
        let _ = std::fs::remove_dir_all(out.join(stage.name(split, std::process::id())));
    }
}

/// Writes the first `n` samples of `ds` as PNG files into class directories under `dir`,
/// which must not exist yet.
fn write_split(ds: &Dataset, n: usize, dir: &Path) -> Result<(), DataError> {
    use rayon::prelude::*;
    let digits = (ds.num_classes.max(2) - 1).to_string().len();
    let class_dir = |c: usize| dir.join(format!("{c:0digits$}"));
    // Made while no signal is putting the staged directory away (see `crate::interrupt`).
    crate::interrupt::creating(|| -> Result<(), DataError> {
        // Not created if it exists: another export writing here at the same time.
        std::fs::create_dir(dir).map_err(|e| crate::output::OutputError::Io {
            path: dir.to_path_buf(),
            action: "create",
            cause: e,
        })?;
        for c in 0..ds.num_classes {
            crate::output::create_dir(&class_dir(c))?;
        }
        Ok(())
    })?;
    let (w, h, plane) = (ds.width, ds.height, ds.width * ds.height);
    (0..n).into_par_iter().try_for_each(|i| {
        let path = class_dir(ds.labels[i] as usize).join(format!("{i:06}.png"));
        let img = ds.image(i);
        let (bytes, color): (std::borrow::Cow<[u8]>, _) = match ds.channels {
            1 => (img.into(), image::ExtendedColorType::L8),
            3 => {
                let hwc = (0..plane)
                    .flat_map(|p| [img[p], img[plane + p], img[2 * plane + p]])
                    .collect::<Vec<u8>>();
                (hwc.into(), image::ExtendedColorType::Rgb8)
            }
            c => {
                return Err(DataError::invalid(
                    &path,
                    format!("cannot write {c}-channel images as PNG; only 1 or 3"),
                ))
            }
        };
        let mut png = Cursor::new(Vec::new());
        image::write_buffer_with_format(
            &mut png,
            &bytes,
            w as u32,
            h as u32,
            color,
            ImageFormat::Png,
        )
        .map_err(|e| DataError::invalid(&path, format!("cannot encode as PNG: {e}")))?;
        crate::output::write_new_file(&path, png.get_ref())?;
        Ok(())
    })
}
