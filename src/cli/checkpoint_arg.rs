//! The checkpoint argument of `eval` and `export`: `--checkpoint PATH`, or the path alone
//! (`dptrain eval runs/x/checkpoint-epoch0010.safetensors`), as users write it.

use std::path::{Path, PathBuf};

/// A checkpoint given as `--checkpoint PATH` or alone; exactly one of the two.
#[derive(Debug, clap::Args)]
pub(super) struct CheckpointArg {
    /// The checkpoint (a run's checkpoint-epochNNNN.safetensors), given as --checkpoint PATH
    /// or alone.
    #[arg(
        long = "checkpoint",
        value_name = "CHECKPOINT",
        required_unless_present = "checkpoint_given_alone"
    )]
    checkpoint: Option<PathBuf>,
    /// The checkpoint, given without --checkpoint.
    #[arg(value_name = "CHECKPOINT", conflicts_with = "checkpoint", hide = true)]
    checkpoint_given_alone: Option<PathBuf>,
}

impl CheckpointArg {
    /// The checkpoint's path, however it was given.
    pub(super) fn path(&self) -> &Path {
        self.checkpoint
            .as_deref()
            .or(self.checkpoint_given_alone.as_deref())
            .expect("clap requires one of the two")
    }
}
