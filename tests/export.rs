//! ONNX export: every built-in model and the model-file fixture exported from a net with
//! random weights and batch-norm statistics, run by tract (a Rust ONNX runtime) at two batch
//! sizes from the one graph (the batch dimension is symbolic), gives dptrain's evaluation
//! logits within 1e-4 (relative to the logit's size, for logits past 1).

use dptrain::export::{self, ExportError};
use dptrain::model::{self, Graph, ModelSpec};
use dptrain::nn::{Mode, Net, NetConfig};
use protobuf::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tract_onnx::prelude::*;

const TOLERANCE: f32 = 1e-4;

/// A net of `spec` on `input` with `classes` classes for batches up to `max_batch`, with its
/// batch-norm layers given statistics and affine parameters far from their initial values
/// (else evaluation would not tell the running statistics apart from none).
fn net_with_statistics(
    spec: &ModelSpec,
    input: [usize; 3],
    classes: usize,
    max_batch: usize,
) -> Net {
    let g = Graph::build(spec, input, classes).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
    let mut net = Net::new(Arc::new(g), NetConfig { max_batch, seed: 7 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let blocks = net.blocks().to_vec();
    for b in blocks.iter().filter(|b| !b.state_tensors.is_empty()) {
        let c = b.state_tensors[0].len;
        let state = &mut net.state_mut()[b.state_range.clone()];
        for ch in 0..c {
            state[ch] = rng.gen_range(-0.5..0.5);
            state[c + ch] = rng.gen_range(0.5..1.5);
        }
        let params = &mut net.params_mut()[b.range.clone()];
        for ch in 0..c {
            params[ch] = rng.gen_range(0.5..1.5);
            params[c + ch] = rng.gen_range(-0.2..0.2);
        }
    }
    net
}

/// Exports `net`, runs the ONNX graph in tract at each of `batches` and compares the logits
/// with the net's own evaluation forward on the same images.
fn check_export(net: &mut Net, batches: &[usize]) {
    let name = net.graph().name.clone();
    let bytes = export::to_onnx(net, &[])
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .write_to_bytes()
        .unwrap();
    let plan = tract_onnx::onnx()
        .model_for_read(&mut bytes.as_slice())
        .and_then(|m| m.into_optimized())
        .and_then(|m| m.into_runnable())
        .unwrap_or_else(|e| panic!("{name}: tract cannot load the export: {e:?}"));
    let x = net.graph().input();
    let classes = net.graph().classes;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for &n in batches {
        let images: Vec<f32> = (0..n * x.numel())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        net.forward(&images, &vec![0; n], n, Mode::Eval);
        let ours = net.logits().to_vec();
        let input = Tensor::from_shape(&[n, x.c, x.h, x.w], &images).unwrap();
        let out = plan.run(tvec!(input.into())).unwrap();
        assert_eq!(
            out[0].shape(),
            &[n, classes],
            "{name}: output shape at batch {n}"
        );
        let view = out[0].to_plain_array_view::<f32>().unwrap();
        let theirs: Vec<f32> = view.iter().copied().collect();
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
            .fold(0.0f32, f32::max);
        assert!(
            worst <= TOLERANCE,
            "{name} at batch {n}: logits differ by up to {worst} (ours {:?}, tract {:?})",
            &ours[..classes.min(5)],
            &theirs[..classes.min(5)]
        );
    }
}

/// Checks built-in `name` on the input and class count its file names.
fn check_builtin(name: &str, batches: &[usize]) {
    let spec = model::load(name).unwrap();
    let input = spec.default_input.expect("built-ins name their input");
    let classes = spec.default_classes.unwrap_or(10);
    let max = *batches.iter().max().unwrap();
    check_export(
        &mut net_with_statistics(&spec, input, classes, max),
        batches,
    );
}

#[test]
fn the_small_builtin_models_export_to_the_same_logits() {
    for name in [
        "lenet5",
        "vgg-small",
        "resnet20",
        "resnet18",
        "mobilenetv2",
        "densenet-small",
    ] {
        check_builtin(name, &[2, 5]);
    }
}

#[test]
fn the_imagenet_builtin_models_export_to_the_same_logits() {
    for name in [
        "alexnet",
        "resnet50",
        "inception-v3",
        "inception-v3-noaux",
        "vgg16",
    ] {
        check_builtin(name, &[1, 2]);
    }
}

#[test]
fn the_every_layer_fixture_exports_to_the_same_logits() {
    let text = include_str!("fixtures/every_layer.toml");
    let spec = model::file::parse(text, "every_layer.toml", "every_layer").unwrap();
    let every: Vec<&str> = spec.layers.iter().map(|l| l.op.type_name()).collect();
    for t in dptrain::model::Op::type_names() {
        assert!(every.contains(&t), "the fixture has no {t} layer");
    }
    check_export(&mut net_with_statistics(&spec, [3, 12, 12], 5, 5), &[2, 5]);
}

#[test]
fn the_export_has_no_loss_dropout_or_auxiliary_head() {
    let text = include_str!("fixtures/every_layer.toml");
    let spec = model::file::parse(text, "every_layer.toml", "every_layer").unwrap();
    let net = net_with_statistics(&spec, [3, 12, 12], 5, 1);
    let m = export::to_onnx(&net, &[]).unwrap();
    let g = m.graph.as_ref().unwrap();
    let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
    assert!(
        !ops.contains(&"Dropout") && !ops.contains(&"Softmax"),
        "{ops:?}"
    );
    assert!(g.node.iter().all(|n| !n.name.starts_with("aux")), "{ops:?}");
    assert_eq!(
        ops.iter().filter(|o| **o == "BatchNormalization").count(),
        3
    );
}

#[test]
fn write_onnx_writes_a_file_tract_reads_and_refuses_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let net = net_with_statistics(&model::load("lenet5").unwrap(), [1, 28, 28], 10, 1);
    let path = dir.path().join("lenet5.onnx");
    export::write_onnx(&net, &[], &path).unwrap();
    let loaded = tract_onnx::onnx().model_for_path(&path).unwrap();
    assert_eq!(loaded.input_outlets().unwrap().len(), 1);
    let err = export::write_onnx(&net, &[], dir.path()).unwrap_err();
    assert!(matches!(err, ExportError::Output(_)), "{err}");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(
        names.len(),
        1,
        "only the model file, no temporary file left"
    );
    // An earlier export is replaced; any other file is not (a checkpoint given as the output
    // would be lost), and stays as it was. An empty file holds nothing to lose (mktemp's).
    export::write_onnx(&net, &[], &path).unwrap();
    for (name, bytes) in [
        (
            "run.safetensors",
            b"\x10\0\0\0\0\0\0\0{\"a\":1}      ".to_vec(),
        ),
        ("summary.json", b"{\"epochs\": []}".to_vec()),
        ("other.onnx", b"\x08\x07\x12\x07pytorch".to_vec()),
    ] {
        let other = dir.path().join(name);
        std::fs::write(&other, &bytes).unwrap();
        let err = export::write_onnx(&net, &[], &other).unwrap_err();
        assert!(
            matches!(
                err,
                ExportError::Output(dptrain::output::OutputError::NotOurs { .. })
            ) && err
                .to_string()
                .contains("is not an ONNX model dptrain exported"),
            "{name}: {err}"
        );
        assert_eq!(std::fs::read(&other).unwrap(), bytes, "{name}");
    }
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    export::write_onnx(&net, &[], &empty).unwrap();
    assert!(std::fs::metadata(&empty).unwrap().len() > 0);
}

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_dptrain");

/// A one-epoch lenet5 run on a slice of the bundled MNIST; its checkpoint.
fn tiny_run(dir: &std::path::Path) -> std::path::PathBuf {
    let run = dir.join("run");
    let o = std::process::Command::new(BIN)
        .args(["train", "--quiet", "--epochs", "1", "--train-limit", "512"])
        .args(["--test-limit", "64", "--threads", "1", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run.join("checkpoint-epoch0001.safetensors")
}

#[test]
fn dptrain_export_writes_the_checkpoints_model_with_its_description() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny_run(dir.path());
    let out = dir.path().join("lenet5.onnx");
    let o = std::process::Command::new(BIN)
        .args(["export", "--checkpoint"])
        .arg(&ckpt)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let m = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap();
    let meta = |k: &str| {
        m.metadata_props
            .iter()
            .find(|p| p.key == k)
            .map(|p| p.value.clone())
    };
    assert_eq!(meta("normalize_mean").as_deref(), Some("[0.1307]"));
    assert_eq!(meta("input_shape").as_deref(), Some("1x28x28"));
    assert!(meta("class_names").unwrap().starts_with("[\""));
    // The trained weights, not fresh ones: the checkpoint's own net gives the same logits.
    let model = dptrain::train::description::TrainedModel::load(&ckpt).unwrap();
    let mut net = model.net(3).unwrap();
    let exported = export::to_onnx(&net, &[]).unwrap();
    let g = exported.graph.as_ref().unwrap();
    assert_eq!(g.initializer, m.graph.as_ref().unwrap().initializer);
    check_export(&mut net, &[3]);
}

#[test]
fn dptrain_export_refuses_a_checkpoint_without_a_model_description() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny_run(dir.path());
    let mut c = dptrain::train::checkpoint::Checkpoint::load(&ckpt).unwrap();
    c.description = None;
    let old = dir.path().join("old.safetensors");
    c.save(&old).unwrap();
    let out = dir.path().join("old.onnx");
    let o = std::process::Command::new(BIN)
        .args(["export", "--checkpoint"])
        .arg(&old)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("was written before dptrain recorded its model"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    // Nor a directory for the output, checked before the checkpoint is read.
    let o = std::process::Command::new(BIN)
        .args(["export", "--checkpoint"])
        .arg(&ckpt)
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"));
}
