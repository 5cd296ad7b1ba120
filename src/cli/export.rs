//! `dptrain export`: a checkpoint's model as an ONNX inference graph (`crate::export::onnx`
//! says what the graph is). Everything comes from the checkpoint's model description; the
//! class names, input shape, normalisation and evaluation transform go into the ONNX model's
//! metadata, so a consumer knows how to feed it and read its logits.

use crate::export;
use crate::train::description::TrainedModel;
use std::path::PathBuf;

/// Arguments of `dptrain export`.
#[derive(Debug, clap::Args)]
pub(super) struct ExportArgs {
    #[command(flatten)]
    checkpoint: super::checkpoint_arg::CheckpointArg,
    /// The ONNX file to write (a new file, or an earlier export it replaces atomically).
    #[arg(long)]
    out: PathBuf,
}

/// Runs `dptrain export`.
pub(super) fn run(a: ExportArgs) -> Result<(), String> {
    // The output path is checked before the checkpoint is read, so a bad path fails at once.
    crate::output::check_replaceable(&a.out, &export::onnx::ONNX_FILE)?;
    let model = TrainedModel::load(a.checkpoint.path()).map_err(|e| e.to_string())?;
    let net = model.net(1).map_err(|e| e.to_string())?;
    let d = &model.description;
    let [c, h, w] = d.input;
    let metadata = vec![
        ("class_names".to_string(), json(&d.class_names)),
        ("input_shape".to_string(), format!("{c}x{h}x{w}")),
        ("normalize_mean".to_string(), json(&d.mean)),
        ("normalize_std".to_string(), json(&d.std)),
        ("eval_transform".to_string(), d.eval_transform.clone()),
        (
            "checkpoint".to_string(),
            a.checkpoint.path().display().to_string(),
        ),
    ];
    export::write_onnx(&net, &metadata, &a.out).map_err(|e| e.to_string())?;
    crate::outln!(
        "wrote {}: ONNX opset {}, input '{}' float [{}, {c}, {h}, {w}] as (pixel/255 - mean)/std \
         (mean {:?}, std {:?}), output '{}' float [{}, {}]: logits of {} classes",
        a.out.display(),
        export::OPSET,
        export::INPUT_NAME,
        export::BATCH_DIM,
        d.mean,
        d.std,
        export::OUTPUT_NAME,
        export::BATCH_DIM,
        net.graph().classes,
        net.graph().classes
    );
    Ok(())
}

/// A list of the description as JSON, for the metadata.
fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("lists of strings and numbers serialise")
}
