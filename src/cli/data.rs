//! `dptrain data ...`: dataset tools.

use crate::config::TrainOptions;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub(super) enum DataCmd {
    /// Write a dataset as an ImageFolder (DIR/train/<class>/N.png, DIR/test/...), e.g. to train
    /// with `--dataset imagefolder --data-dir DIR`.
    ExportImages {
        /// Dataset to export: mnist, fashion-mnist, idx, cifar10 or synthetic (an ImageFolder
        /// or a packed file is already one to train on).
        #[arg(long, default_value = "mnist")]
        dataset: String,
        /// Its directory, where it needs one.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Output directory: new or empty (created if absent; its parent must exist).
        #[arg(long)]
        out: PathBuf,
        /// Export only the first N samples of each split.
        #[arg(long)]
        limit: Option<usize>,
        /// Replace an earlier export in --out (its train/ and test/ are deleted first; refused
        /// when they hold anything an export does not write, such as a user's file).
        #[arg(long)]
        overwrite: bool,
    },
    /// Pack an ImageFolder (DIR/train/<class>/..., DIR/test/...) into one memory-mapped file
    /// (index + samples, a checksum per sample), to train with `--dataset packed:FILE`.
    Pack(PackArgs),
}

/// Arguments of `dptrain data pack`.
#[derive(Debug, clap::Args)]
pub(super) struct PackArgs {
    /// The ImageFolder: a directory holding train/ and test/, one subdirectory per class.
    dir: PathBuf,
    /// The packed file to write (a new file, or a regular file it replaces; written beside
    /// and renamed when complete).
    #[arg(long)]
    out: PathBuf,
    /// Shrink every image so its longer side is at most this many pixels (aspect kept).
    #[arg(long, default_value_t = crate::data::packed::DEFAULT_MAX_SIDE)]
    max_side: usize,
    /// JPEG quality 1..=100 of samples stored as JPEG (a sample is stored raw instead when its
    /// raw bytes are at most twice its JPEG's: small images).
    #[arg(long, conflicts_with = "raw")]
    quality: Option<u8>,
    /// Store every sample raw (decoded pixels: no decoding when training, a larger file).
    #[arg(long)]
    raw: bool,
    /// Leave out the images that cannot be read or decoded (each named in a warning), from
    /// both splits; without it they fail the pack, every one named.
    #[arg(long)]
    skip_bad_samples: bool,
}

/// Runs one `dptrain data` command.
pub(super) fn run(cmd: DataCmd) -> Result<(), String> {
    match cmd {
        DataCmd::ExportImages {
            dataset,
            data_dir,
            out,
            limit,
            overwrite,
        } => export_images(dataset, data_dir, &out, limit, overwrite),
        DataCmd::Pack(a) => pack(a),
    }
}

/// `dptrain data pack`: an ImageFolder written as one packed file.
fn pack(a: PackArgs) -> Result<(), String> {
    use crate::data::packed::{self, PackOptions, StoreAs};
    let store = if a.raw {
        StoreAs::Raw
    } else {
        StoreAs::Smaller {
            quality: a.quality.unwrap_or(packed::DEFAULT_QUALITY),
        }
    };
    let opts = PackOptions {
        max_side: a.max_side,
        store,
        progress: true,
        skip_bad: a.skip_bad_samples,
    };
    let started = std::time::Instant::now();
    let s = packed::pack(&a.dir, &a.out, &opts).map_err(|e| e.to_string())?;
    crate::outln!(
        "wrote {} ({:.1} MB, {:.1} s): {} train + {} test samples of {} classes, {} channel(s); \
         {} raw, {} JPEG; {} shrunk to a longer side of {} px; train with --dataset packed:{}",
        a.out.display(),
        s.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        s.train,
        s.test,
        s.classes,
        s.channels,
        s.raw,
        s.jpeg,
        s.resized,
        a.max_side,
        a.out.display()
    );
    if !s.skipped.is_empty() {
        crate::terminal::print_warning(&format!(
            "left out {} that cannot be read or decoded (--skip-bad-samples):{}",
            crate::terminal::counted(s.skipped.len(), "image"),
            crate::data::listed(&s.skipped)
        ));
    }
    if s.test_colour_stored_grey {
        crate::terminal::print_warning(&format!(
            "{}/test holds colour images and train/ only grey ones: the pack stores every image \
             grey, as training on the folder reads them (the training split decides); a colour \
             model sees them in colour only from the folder (eval --dataset imagefolder \
             --data-dir {})",
            a.dir.display(),
            crate::terminal::shell_quoted(&a.dir)
        ));
    }
    Ok(())
}

/// Refuses to export an ImageFolder or a packed file as images: read into memory, an
/// ImageFolder's photos would all be resized to its first image's size, and both would lose
/// their class names to the export's numbered class directories.
fn refuse_export_of_files(dataset: &str, data_dir: Option<&std::path::Path>) -> Result<(), String> {
    use crate::data::DatasetSpec;
    let spec = DatasetSpec::parse(dataset, data_dir, &crate::data::bundled_mnist_dir());
    let what = match spec {
        Ok(DatasetSpec::ImageFolder { dir }) => format!(
            "{} is already an ImageFolder: export-images would resize every image to the first \
             one's size and number its classes; train on it as it is, or copy it",
            dir.display()
        ),
        Ok(DatasetSpec::Packed { file }) => format!(
            "{} is a packed dataset: export-images would number its named classes; train on \
             it as it is",
            file.display()
        ),
        _ => return Ok(()),
    };
    Err(format!(
        "--dataset {dataset}: {what} (export-images writes mnist, fashion-mnist, idx, cifar10 \
         and synthetic data as PNG files)"
    ))
}

/// `dptrain data export-images`: a dataset written as an ImageFolder.
fn export_images(
    dataset: String,
    data_dir: Option<std::path::PathBuf>,
    out: &std::path::Path,
    limit: Option<usize>,
    overwrite: bool,
) -> Result<(), String> {
    // Checked before the dataset is loaded: a refusal costs nothing.
    if limit == Some(0) {
        return Err("--limit 0 exports nothing: give at least 1 (or leave it out)".into());
    }
    refuse_export_of_files(&dataset, data_dir.as_deref())?;
    // A refused or failed export leaves no empty directory it made.
    let mut created = crate::output::CreatedDirs::default();
    created.create(out).map_err(|e| e.to_string())?;
    created.removed_if_failed(|| {
        crate::data::image_export::prepare_export_dir(out, overwrite).map_err(|e| e.to_string())?;
        let cfg = TrainOptions {
            dataset: Some(dataset),
            data_dir,
            train_limit: limit,
            test_limit: limit,
            batch: Some(1),
            ..Default::default()
        }
        .resolve()?;
        let (train, test) = crate::train::load_data(&cfg)?;
        let pair = crate::data::DatasetPair { train, test };
        let options = crate::data::image_export::ExportOptions {
            limit: None,
            overwrite,
        };
        let n =
            crate::data::image_export::export(&pair, out, &options).map_err(|e| e.to_string())?;
        crate::outln!(
            "wrote {n} PNG files to {} (train/ and test/, {} classes); train with \
             --dataset imagefolder --data-dir {}",
            out.display(),
            pair.train.num_classes,
            out.display()
        );
        Ok(())
    })
}
