//! `dptrain data ...`: dataset tools.

use crate::config::TrainOptions;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub(super) enum DataCmd {
    /// Write a dataset as an ImageFolder (DIR/train/<class>/N.png, DIR/test/...), e.g. to train
    /// with `--dataset imagefolder --data-dir DIR`.
    ExportImages {
        /// Dataset to export (any name `train --dataset` takes).
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
        /// Replace an earlier export in --out (its train/ and test/ are deleted first).
        #[arg(long)]
        overwrite: bool,
    },
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
    }
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
    crate::data::image_folder::prepare_export_dir(out, overwrite).map_err(|e| e.to_string())?;
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
    let n = crate::data::image_folder::export(&pair, out, None).map_err(|e| e.to_string())?;
    println!(
        "wrote {n} PNG files to {} (train/ and test/, {} classes); train with \
         --dataset imagefolder --data-dir {}",
        out.display(),
        pair.train.num_classes,
        out.display()
    );
    Ok(())
}
