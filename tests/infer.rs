//! Using a trained checkpoint: it describes its model (and one from before that still
//! resumes), `eval` gives the training run's figures for any worker count, `predict` gives the
//! classes eval counts as correct, `train --weights` starts a new run from trained weights.

use dptrain::config::TrainOptions;
use dptrain::infer::eval::{self, EvalOptions, EvalReport};
use dptrain::infer::TrainedModel;
use dptrain::train::checkpoint::{Checkpoint, CheckpointError};
use dptrain::train::weights::{StartWeights, WeightsError};
use dptrain::train::{train, Summary};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dptrain");

/// A short run of lenet5 that learns something: the bundled MNIST, 2 epochs of 2048 images.
fn options(dir: &Path, f: impl FnOnce(&mut TrainOptions)) -> TrainOptions {
    let mut o = TrainOptions {
        model: Some("lenet5".into()),
        epochs: Some(2),
        batch: Some(64),
        lr: Some(0.05),
        warmup_steps: Some(0),
        train_limit: Some(2048),
        test_limit: Some(300),
        threads: Some(1),
        comm_timeout: Some(30.0),
        run_dir: Some(dir.to_path_buf()),
        quiet: true,
        ..Default::default()
    };
    f(&mut o);
    o
}

fn run(dir: &Path, f: impl FnOnce(&mut TrainOptions)) -> Summary {
    let cfg = options(dir, f).resolve().unwrap();
    train(cfg).unwrap_or_else(|e| panic!("training failed: {e}"))
}

fn dptrain(args: &[&str]) -> (bool, String, String) {
    dptrain_in(Path::new("."), args)
}

/// [`dptrain`] run in the working directory `dir`.
fn dptrain_in(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.success(), text(&o.stdout), text(&o.stderr))
}

fn eval_with(ck: &Path, f: impl FnOnce(&mut EvalOptions)) -> EvalReport {
    let mut o = EvalOptions {
        workers: 1,
        ..Default::default()
    };
    f(&mut o);
    eval::run(ck, &o).unwrap_or_else(|e| panic!("eval failed: {e}"))
}

#[test]
fn eval_gives_the_training_runs_test_figures_for_any_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    // Two training workers: their evaluation ran in chunks of the per-worker batch, 32.
    let s = run(&dir.path().join("run"), |o| o.workers = Some(2));
    let ck = s.checkpoint.clone().unwrap();
    assert!(s.final_test_accuracy > 0.5, "{}", s.final_test_accuracy);
    let last = s.epochs.last().unwrap();
    let one = eval_with(&ck, |o| o.limit = Some(300));
    assert_eq!(one.top1, s.final_test_accuracy);
    assert_eq!(one.loss.to_bits(), last.test_loss.to_bits());
    assert_eq!((one.samples, one.batch, one.top_k), (300, 32, 5));
    assert!(one.top_k_accuracy >= one.top1 && one.top_k_accuracy <= 1.0);
    let per_class: u64 = one.classes.iter().map(|c| c.correct).sum();
    assert_eq!(per_class as f64 / 300.0, one.top1);
    let diagonal: u64 = (0..10).map(|i| one.confusion[i][i]).sum();
    assert_eq!(diagonal, per_class);
    assert_eq!(one.confusion.iter().flatten().sum::<u64>(), 300);
    // The same bits whatever the workers and compute threads, also for chunks that do not
    // divide the split.
    for (workers, threads) in [(3, 1), (4, 2)] {
        let many = eval_with(&ck, |o| {
            o.limit = Some(300);
            o.workers = workers;
            o.threads = Some(threads);
        });
        assert_eq!(EvalReport { workers: 1, ..many }, one);
    }
    let odd = |workers| {
        eval_with(&ck, |o| {
            o.limit = Some(300);
            o.batch = Some(7);
            o.workers = workers;
        })
    };
    assert_eq!(
        EvalReport {
            workers: 1,
            ..odd(3)
        },
        odd(1)
    );
}

#[test]
fn eval_computes_convolutions_as_training_did() {
    // Trained with Winograd convolutions: the checkpoint records it, and eval's loss is the
    // run's own to the bit (direct convolutions round differently).
    let dir = tempfile::tempdir().unwrap();
    let s = run(&dir.path().join("run"), |o| {
        o.model = Some("vgg-small".into());
        o.dataset = Some("synthetic:3x32x32".into());
        o.epochs = Some(1);
        o.batch = Some(32);
        o.train_limit = Some(128);
        o.test_limit = Some(64);
        o.conv_algo = Some("winograd".into());
    });
    let ck = s.checkpoint.clone().unwrap();
    let model = TrainedModel::load(&ck).unwrap();
    assert_eq!(
        model.description.conv_algo.to_string(),
        "winograd",
        "{:?}",
        model.description
    );
    let report = eval_with(&ck, |o| o.limit = Some(64));
    let last = s.epochs.last().unwrap();
    assert_eq!(report.top1, s.final_test_accuracy);
    assert_eq!(report.loss.to_bits(), last.test_loss.to_bits());
}

#[test]
fn eval_on_the_command_line_prints_json_and_writes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(&dir.path().join("run"), |o| o.epochs = Some(1));
    let ck = s.checkpoint.unwrap().display().to_string();
    let out = dir.path().join("eval");
    let (ok, stdout, stderr) = dptrain(&[
        "eval",
        "--checkpoint",
        &ck,
        "--limit",
        "300",
        "--workers",
        "2",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["top1"].as_f64(), Some(s.final_test_accuracy));
    assert_eq!(j["classes"].as_array().unwrap().len(), 10);
    for f in ["eval.md", "eval.json", "confusion.png"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let md = std::fs::read_to_string(out.join("eval.md")).unwrap();
    assert!(md.contains("## Confusion matrix") && md.contains("| true \\ predicted |"));
    // The checkpoint given alone, as users write it, is the same evaluation (into the same
    // --out: its own earlier files are replaced); given both ways, refused.
    let (ok, again, stderr) = dptrain(&[
        "eval",
        &ck,
        "--limit",
        "300",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let k: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(k["top1"], j["top1"]);
    assert_eq!(k["confusion"], j["confusion"]);
    let (ok, _, stderr) = dptrain(&["eval", &ck, "--checkpoint", &ck]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
    let (ok, _, stderr) = dptrain(&["eval"]);
    assert!(!ok && stderr.contains("--checkpoint"), "{stderr}");
    // Another dataset shape is refused naming both, and the --out directory the refused
    // evaluation made is not left behind empty.
    let refused_out = dir.path().join("eval-refused");
    let (ok, _, stderr) = dptrain(&[
        "eval",
        "--checkpoint",
        &ck,
        "--dataset",
        "synthetic:3x28x28",
        "--out",
        refused_out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("3x28x28") && stderr.contains("1x28x28"),
        "{stderr}"
    );
    assert!(!refused_out.exists());
}

#[test]
fn a_checkpoint_records_its_model_and_one_from_before_still_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(&dir.path().join("run"), |o| {
        o.epochs = Some(1);
        o.dataset = Some("synthetic".into());
    });
    let path = s.checkpoint.unwrap();
    let m = TrainedModel::load(&path).unwrap();
    let d = &m.description;
    assert_eq!(d.model_source, "builtin:lenet5");
    assert_eq!(d.model_text.as_deref(), Some(dptrain::model::BUILTIN[0].1));
    assert_eq!(d.input, [1, 28, 28]);
    assert_eq!(
        d.class_names,
        (0..10).map(|i| i.to_string()).collect::<Vec<_>>()
    );
    assert_eq!((d.mean.len(), d.std.len()), (1, 1));
    assert_eq!(d.eval_transform, "off");
    assert_eq!(m.graph.fingerprint(), m.checkpoint.state.fingerprint);
    // The same checkpoint as an older dptrain wrote it: no description keys.
    let mut old = Checkpoint::load(&path).unwrap();
    old.description = None;
    let old_path = dir.path().join("old.safetensors");
    old.save(&old_path).unwrap();
    let bytes = std::fs::read(&old_path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let keys = meta.metadata().clone().unwrap();
    assert!(!keys.contains_key("class_names") && !keys.contains_key("model_text"));
    let e = TrainedModel::load(&old_path).err().unwrap();
    assert!(matches!(e, CheckpointError::NoDescription { .. }), "{e}");
    let (ok, _, stderr) = dptrain(&["eval", "--checkpoint", old_path.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("written before dptrain recorded its model"),
        "{stderr}"
    );
    // It resumes, and the resumed run's checkpoint describes its model again.
    let resumed = run(&dir.path().join("resumed"), |o| {
        o.dataset = Some("synthetic".into());
        o.resume = Some(old_path.clone());
    });
    assert_eq!(resumed.epochs.len(), 1);
    let again = TrainedModel::load(resumed.checkpoint.as_ref().unwrap()).unwrap();
    assert_eq!(again.checkpoint.state.epoch, 2);
}

#[test]
fn weights_start_a_new_run_and_only_a_changed_head_starts_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(&dir.path().join("run"), |o| o.epochs = Some(1));
    let ck = s.checkpoint.clone().unwrap();
    drop(s); // and with it the run directory's lock
    let trained = TrainedModel::load(&ck).unwrap();
    // A 5-class model of the same layers: all but the head 'f3' load.
    let five = Box::new(dptrain::train::build_graph("lenet5", [1, 28, 28], 5).unwrap());
    let fresh_net = || {
        let cfg = dptrain::nn::NetConfig {
            max_batch: 1,
            seed: 1,
        };
        dptrain::nn::Net::new(std::sync::Arc::new((*five).clone()), cfg).unwrap()
    };
    let start = StartWeights::plan(&ck, &fresh_net(), &[], &[]).unwrap();
    assert_eq!(start.fresh_layers().collect::<Vec<_>>(), ["f3"]);
    assert!(
        start.notes[0].contains("head 'f3'") && start.notes[0].contains("10 in the checkpoint")
    );
    let mut net = fresh_net();
    let init = fresh_net();
    start.apply(&mut net);
    let source = trained.net(1).unwrap();
    for (b, (old, new)) in net
        .blocks()
        .iter()
        .zip(source.blocks().iter().zip(init.blocks()))
    {
        let got = &net.params()[b.range.clone()];
        if b.name == "f3" {
            assert_eq!(
                got,
                &init.params()[new.range.clone()],
                "the head keeps its init"
            );
        } else {
            assert_eq!(got, &source.params()[old.range.clone()], "{}", b.name);
        }
    }
    // --reinit of a layer that does not exist lists the layers.
    let e = StartWeights::plan(&ck, &fresh_net(), &["fc3".into()], &[])
        .err()
        .unwrap();
    assert!(matches!(e, WeightsError::UnknownLayer { .. }));
    assert!(e.to_string().contains("c1, c2, f1, f2, f3"), "{e}");
    // Ten classes again, but others (MNIST's are "0".."9"): the head loads by position, said
    // with the way to start it afresh; the same names, or the head --reinit, say nothing.
    let ten = || {
        let g = dptrain::train::build_graph("lenet5", [1, 28, 28], 10).unwrap();
        let cfg = dptrain::nn::NetConfig {
            max_batch: 1,
            seed: 1,
        };
        dptrain::nn::Net::new(std::sync::Arc::new(g), cfg).unwrap()
    };
    let names = |f: fn(usize) -> String| (0..10).map(f).collect::<Vec<String>>();
    let letters = names(|i| char::from(b'a' + i as u8).to_string());
    let start = StartWeights::plan(&ck, &ten(), &[], &letters).unwrap();
    let said = start.notes.join("\n");
    assert!(
        said.contains(
            "the checkpoint's classes are 0, 1, 2, 3, 4, 5, 6, 7, ... (2 more), this run's a, b"
        ) && said.contains("give --reinit f3"),
        "{said}"
    );
    assert_eq!(start.fresh_layers().count(), 0);
    let digits = names(|i| i.to_string());
    assert!(StartWeights::plan(&ck, &ten(), &[], &digits)
        .unwrap()
        .notes
        .is_empty());
    let reinit = StartWeights::plan(&ck, &ten(), &["f3".into()], &letters).unwrap();
    assert!(!reinit.notes.join(" ").contains("loaded by position"));
    // The new run: epoch 0 on, its own dataset, the head re-initialisation said.
    let c = ck.to_str().unwrap();
    let run_dir = dir.path().join("tuned");
    let (ok, _, stderr) = dptrain(&[
        "train",
        "--quiet",
        "--weights",
        c,
        "--dataset",
        "synthetic:1x28x28:5",
        "--epochs",
        "1",
        "--train-limit",
        "256",
        "--test-limit",
        "64",
        "--threads",
        "1",
        "--run-dir",
        run_dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("head 'f3' starts from scratch"), "{stderr}");
    let tuned = TrainedModel::load(&run_dir.join("checkpoint-epoch0001.safetensors")).unwrap();
    assert_eq!(tuned.checkpoint.state.epoch, 1);
    assert_eq!(
        tuned.checkpoint.state.run.as_ref().unwrap().dataset,
        "synthetic:1x28x28:5"
    );
    assert_eq!(tuned.class_names().len(), 5);
    // Other shape mismatches, unknown layers and --weights with --resume are refused.
    let refused = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--quiet",
            "--weights",
            c,
            "--epochs",
            "1",
            "--run-dir",
        ];
        let other = dir.path().join("refused");
        args.push(other.to_str().unwrap());
        args.extend(extra);
        let (ok, _, stderr) = dptrain(&args);
        assert!(!ok && !other.join("summary.json").exists());
        stderr
    };
    let e = refused(&["--dataset", "synthetic:3x28x28"]);
    assert!(
        e.contains("layer 'c1'") && e.contains("[6, 1, 5, 5]") && e.contains("[6, 3, 5, 5]"),
        "{e}"
    );
    let e = refused(&["--reinit", "conv9"]);
    assert!(
        e.contains("no layer 'conv9'") && e.contains("c1, c2, f1, f2, f3"),
        "{e}"
    );
    let e = refused(&["--resume", c]);
    assert!(e.contains("give one of them"), "{e}");
    // --overwrite of the directory the --weights checkpoint is in would delete it: refused,
    // the checkpoint kept.
    let own_dir = ck.parent().unwrap().to_str().unwrap();
    let (ok, _, e) = dptrain(&[
        "train",
        "--quiet",
        "--weights",
        c,
        "--epochs",
        "1",
        "--run-dir",
        own_dir,
        "--overwrite",
    ]);
    assert!(
        !ok && e.contains("the checkpoint --weights starts from"),
        "{e}"
    );
    assert!(ck.is_file());
    // Without --overwrite, the refusal does not offer it there.
    let (ok, _, e) = dptrain(&[
        "train",
        "--quiet",
        "--weights",
        c,
        "--epochs",
        "1",
        "--run-dir",
        own_dir,
    ]);
    assert!(
        !ok && e.contains("holds the files of another run")
            && e.contains("or choose another --run-dir")
            && !e.contains("--overwrite"),
        "{e}"
    );
    // Another model's checkpoint: both models are named.
    let e = refused(&["--model", "vgg-small", "--dataset", "synthetic:3x32x32"]);
    assert!(
        e.contains("(model 'lenet5') has no tensor") && e.contains("this run's model 'vgg-small'"),
        "{e}"
    );
    assert!(e.contains("give --model lenet5"), "{e}");
    // Another input size: the flattened layer's size differs, and the size is named.
    let e = refused(&["--dataset", "synthetic:1x32x32"]);
    assert!(
        e.contains("layer 'f1'") && e.contains("trained on 28x28 inputs and this run's are 32x32"),
        "{e}"
    );
    // An explicit --reinit on the same dataset starts that layer over (and says so).
    let (ok, _, stderr) = dptrain(&[
        "train",
        "--quiet",
        "--weights",
        c,
        "--reinit",
        "c1",
        "--epochs",
        "1",
        "--train-limit",
        "64",
        "--test-limit",
        "16",
        "--threads",
        "1",
        "--no-checkpoints",
        "--run-dir",
        dir.path().join("reinit").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("layer 'c1' starts from scratch (--reinit)"),
        "{stderr}"
    );
}

/// The first `limit` images of the bundled MNIST as an ImageFolder of PNGs in `dir/images`.
fn exported_mnist(dir: &Path, limit: usize) -> PathBuf {
    let folder = dir.join("images");
    let (ok, _, stderr) = dptrain(&[
        "data",
        "export-images",
        "--dataset",
        "mnist",
        "--limit",
        &limit.to_string(),
        "--out",
        folder.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    folder
}

/// A model whose outputs are not numbers (weights that overflow: a learning rate of 1e30,
/// its non-finite updates skipped) predicts no class. Training's own evaluation, `eval` and
/// `predict` agree: every image counts as wrong (eval read 100%: NaN compared as no larger
/// than the label's logit), eval says so in a warning and in its JSON, and predict names each
/// image and fails.
#[test]
fn a_model_whose_outputs_are_not_numbers_predicts_no_class() {
    let dir = tempfile::tempdir().unwrap();
    let folder = exported_mnist(dir.path(), 64);
    let s = run(&dir.path().join("run"), |o| {
        o.epochs = Some(1);
        o.lr = Some(1e30);
        o.on_nonfinite = Some("skip".into());
        o.train_limit = Some(256);
        o.test_limit = Some(64);
    });
    let ck = s.checkpoint.unwrap();
    let report = eval_with(&ck, |_| {});
    assert_eq!(report.no_prediction, report.samples as u64, "{report:?}");
    assert_eq!((report.top1, report.top_k_accuracy), (0.0, 0.0));
    assert_eq!(report.top1, s.final_test_accuracy);
    assert!(report.confusion.iter().flatten().all(|&n| n == 0));
    let ck = ck.to_str().unwrap();
    let (ok, stdout, stderr) = dptrain(&["eval", ck, "--limit", "64", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        ok && j["no_prediction"].as_u64() == Some(64)
            && stderr.contains("outputs were not numbers (NaN or infinite) for 64 images"),
        "{stderr}"
    );
    let image = folder.join("test").join("7");
    let (ok, lines, stderr) = predict_json(ck, &[image.to_str().unwrap()]);
    assert!(!ok && !lines.is_empty(), "{stderr}");
    for l in &lines {
        let e = l["error"].as_str().unwrap();
        assert!(
            e.contains("not numbers (NaN or infinite): no class predicted"),
            "{e}"
        );
    }
    // The cause is said once, not once per image.
    assert_eq!(
        stderr.matches("the checkpoint's weights overflow").count(),
        1,
        "{stderr}"
    );
}

/// `predict --json --top-k 1` over `dir`: each image's predicted class, and the errors.
fn predict_json(ck: &str, paths: &[&str]) -> (bool, Vec<serde_json::Value>, String) {
    let mut args = vec![
        "predict",
        "--checkpoint",
        ck,
        "--json",
        "--top-k",
        "1",
        "--batch",
        "7",
    ];
    args.extend(paths);
    let (ok, stdout, stderr) = dptrain(&args);
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (ok, lines, stderr)
}

#[test]
fn predict_on_the_training_images_gives_the_classes_eval_counts_as_correct() {
    let dir = tempfile::tempdir().unwrap();
    let folder = exported_mnist(dir.path(), 400);
    // The folder in the dataset's name, so that eval's --data-dir alone has to drop it.
    let s = run(&dir.path().join("run"), |o| {
        o.dataset = Some(format!("imagefolder:{}", folder.display()));
        o.train_limit = None;
        o.test_limit = None;
        o.batch = Some(32);
        o.epochs = Some(3);
    });
    let ck = s.checkpoint.unwrap();
    let report = eval_with(&ck, |o| o.train_split = true);
    assert_eq!(report.samples, 400);
    assert!(report.top1 > 0.3, "{}", report.top1);
    let train_dir = folder.join("train");
    let (ok, lines, stderr) = predict_json(ck.to_str().unwrap(), &[train_dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert_eq!(lines.len(), 400);
    // The confusion matrix of predict's answers (true class: the file's directory) is eval's.
    let names: Vec<String> = report.classes.iter().map(|c| c.name.clone()).collect();
    for l in &lines {
        let p = l["top"][0]["label"].as_u64().unwrap() as usize;
        assert_eq!(l["top"][0]["class"].as_str(), Some(names[p].as_str()));
    }
    assert_eq!(predicted_confusion(&names, &lines), report.confusion);
    // A non-image and a corrupt PNG are named; every other image is still predicted, and the
    // command fails at the end.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "not an image").unwrap();
    let bad = train_dir.join("3").join("broken.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\n truncated").unwrap();
    let three = train_dir.join("3");
    let (ok, lines, stderr) = predict_json(
        ck.to_str().unwrap(),
        &[notes.to_str().unwrap(), three.to_str().unwrap()],
    );
    assert!(!ok);
    assert!(
        stderr.contains("notes.txt") && stderr.contains("broken.png"),
        "{stderr}"
    );
    let others = report.classes[3].samples;
    assert!(
        stderr.contains(&format!("the other {others} were predicted")),
        "{stderr}"
    );
    let errors: BTreeMap<String, String> = lines
        .iter()
        .filter_map(|l| {
            Some((
                l["file"].as_str()?.to_string(),
                l["error"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    let predicted = lines.iter().filter(|l| l.get("top").is_some()).count();
    assert_eq!(predicted, report.classes[3].samples as usize);
    // Names that are not UTF-8 (any bytes, on Linux) or hold a newline: each JSON line
    // names the file (U+FFFD for what does not decode), the text a line per image.
    {
        use std::os::unix::ffi::OsStrExt;
        let odd = dir.path().join("odd");
        std::fs::create_dir(&odd).unwrap();
        let good = std::fs::read_dir(three.clone())
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let name = |b: &[u8]| odd.join(std::ffi::OsStr::from_bytes(b));
        std::fs::copy(good.path(), name(b"caf\xe9.png")).unwrap();
        std::fs::copy(good.path(), name(b"two\nlines.png")).unwrap();
        std::fs::write(name(b"bro\xe9ken.png"), b"\x89PNG\r\n\x1a\n truncated").unwrap();
        let (ok, lines, stderr) = predict_json(ck.to_str().unwrap(), &[odd.to_str().unwrap()]);
        assert!(!ok && !stderr.contains("panicked"), "{stderr}");
        let file = |l: &serde_json::Value| l["file"].as_str().unwrap().to_string();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(file(&lines[0]).ends_with("bro\u{fffd}ken.png") && lines[0].get("error").is_some());
        assert!(file(&lines[1]).ends_with("caf\u{fffd}.png") && lines[1].get("top").is_some());
        assert!(file(&lines[2]).ends_with("two\nlines.png") && lines[2].get("top").is_some());
        let (_, stdout, _) = dptrain(&[
            "predict",
            "--checkpoint",
            ck.to_str().unwrap(),
            odd.to_str().unwrap(),
        ]);
        assert_eq!(stdout.lines().count(), 2, "{stdout}");
        assert!(stdout.contains("two\\nlines.png: "), "{stdout}");
    }
    // A path that does not exist stops before any work.
    let (ok, lines, stderr) = predict_json(ck.to_str().unwrap(), &["/nonexistent.png"]);
    assert!(
        !ok && lines.is_empty() && stderr.contains("no such file"),
        "{stderr}"
    );
    // The data directory the checkpoint records, moved away: eval says whose path it is.
    let test_split = eval_with(&ck, |_| {});
    std::fs::rename(&folder, dir.path().join("moved")).unwrap();
    let e = eval::run(&ck, &EvalOptions::default())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "the checkpoint's run read imagefolder:{0} from {0}",
            folder.display()
        )) && e.ends_with("give --data-dir with the data's directory here"),
        "{e}"
    );
    // Following it: the checkpoint's dataset read from the new place.
    let moved = eval_with(&ck, |o| o.data_dir = Some(dir.path().join("moved")));
    assert_eq!(
        (moved.samples, moved.top1),
        (test_split.samples, test_split.top1)
    );
}

/// A folder of JPEGs of mixed sizes and aspect ratios, 3 classes told apart by brightness and
/// a stripe's direction, `per_class` images per class in each split.
fn photo_folder(dir: &Path, per_class: usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for split in ["train", "test"] {
        for class in 0..3u32 {
            let d = dir.join(split).join(format!("class-{class}"));
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..per_class {
                let (w, h) = (rng.gen_range(20..90u32), rng.gen_range(20..90u32));
                let noise = rng.gen_range(0..40u32);
                let img = image::RgbImage::from_fn(w, h, |x, y| {
                    let stripe = match class {
                        0 => x % 8 < 4,
                        1 => y % 8 < 4,
                        _ => (x + y) % 8 < 4,
                    };
                    let v = (60 + 60 * class + if stripe { 40 } else { 0 } + noise).min(255) as u8;
                    image::Rgb([v, v / 2, 255 - v])
                });
                let mut bytes = std::io::Cursor::new(Vec::new());
                let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85);
                img.write_with_encoder(enc).unwrap();
                std::fs::write(d.join(format!("{i:03}.jpg")), bytes.into_inner()).unwrap();
            }
        }
    }
}

/// The confusion matrix of `predict --json` lines on an ImageFolder split: truth is each
/// file's class directory.
fn predicted_confusion(classes: &[String], lines: &[serde_json::Value]) -> Vec<Vec<u64>> {
    let mut confusion = vec![vec![0u64; classes.len()]; classes.len()];
    for l in lines {
        let file = PathBuf::from(l["file"].as_str().unwrap());
        let truth = file
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let t = classes.iter().position(|n| n == truth).unwrap();
        confusion[t][l["top"][0]["label"].as_u64().unwrap() as usize] += 1;
    }
    confusion
}

#[test]
fn photos_of_any_size_are_predicted_through_the_checkpoints_evaluation_transform() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("photos");
    photo_folder(&folder, 24);
    let s = run(&dir.path().join("run"), |o| {
        o.dataset = Some("imagefolder".into());
        o.data_dir = Some(folder.clone());
        o.image_size = Some("16".into());
        // torchvision's Resize(18) + CenterCrop(16), so the crop is exercised too.
        o.eval_transform = Some("resize-shorter:18,center-crop".into());
        o.train_limit = None;
        o.test_limit = None;
        o.batch = Some(8);
        o.epochs = Some(2);
        o.lr = Some(0.02);
    });
    let ck = s.checkpoint.unwrap();
    let m = TrainedModel::load(&ck).unwrap();
    assert_eq!(m.description.input, [3, 16, 16]);
    assert_eq!(
        m.description.eval_transform,
        "resize-shorter:18,center-crop"
    );
    assert_eq!(m.class_names(), ["class-0", "class-1", "class-2"]);
    let report = eval_with(&ck, |_| {});
    assert_eq!(report.top1, s.final_test_accuracy);
    let test_dir = folder.join("test");
    let (ok, lines, stderr) = predict_json(ck.to_str().unwrap(), &[test_dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert_eq!(
        predicted_confusion(m.class_names(), &lines),
        report.confusion
    );
    // The test images alone, as DIR/test or as DIR of class directories, evaluate the same.
    let lone = dir.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    std::fs::rename(&test_dir, lone.join("test")).unwrap();
    let alone = eval_with(&ck, |o| o.data_dir = Some(lone.clone()));
    assert_eq!(alone.confusion, report.confusion);
    let alone = eval_with(&ck, |o| o.data_dir = Some(lone.join("test")));
    assert_eq!(alone.confusion, report.confusion);
    // Grey copies of the test images are made colour for this colour model, by eval as by
    // predict: the two count the same.
    let grey = dir.path().join("grey");
    for class in m.class_names() {
        let (from, to) = (lone.join("test").join(class), grey.join("test").join(class));
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            let luma = image::open(&f).unwrap().to_luma8();
            luma.save(to.join(f.file_name().unwrap()).with_extension("png"))
                .unwrap();
        }
    }
    let on_grey = eval_with(&ck, |o| o.data_dir = Some(grey.clone()));
    let grey_test = grey.join("test");
    let (ok, lines, stderr) = predict_json(ck.to_str().unwrap(), &[grey_test.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert_eq!(
        predicted_confusion(m.class_names(), &lines),
        on_grey.confusion
    );
    // The same grey images packed (raw pixels, and as packing chooses) are made colour as
    // the folder's are: the raw pack counts exactly as the folder does.
    for class in m.class_names() {
        let (from, to) = (
            grey.join("test").join(class),
            grey.join("train").join(class),
        );
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
    }
    for (raw, name) in [(true, "grey-raw.dpk"), (false, "grey.dpk")] {
        let pack = dir.path().join(name);
        let (grey_dir, out) = (grey.to_str().unwrap(), pack.to_str().unwrap());
        let mut args = vec!["data", "pack", grey_dir, "--out", out];
        if raw {
            args.push("--raw");
        }
        let (ok, _, stderr) = dptrain_in(dir.path(), &args);
        assert!(ok, "{stderr}");
        let packed = eval_with(&ck, |o| {
            o.dataset = Some("packed".into());
            o.data_dir = Some(pack.clone());
        });
        assert_eq!(packed.samples, on_grey.samples);
        if raw {
            assert_eq!(packed.confusion, on_grey.confusion);
        }
    }
    // Some of the model's classes only: labelled as the model numbers them, the same from a
    // folder and from a raw pack of it.
    let some = dir.path().join("some");
    for split in ["train", "test"] {
        for class in ["class-0", "class-2"] {
            let (from, to) = (grey.join(split).join(class), some.join(split).join(class));
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(&from).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
            }
        }
    }
    let some_pack = dir.path().join("some.dpk");
    let (some_dir, out) = (some.to_str().unwrap(), some_pack.to_str().unwrap());
    let (ok, _, stderr) = dptrain_in(
        dir.path(),
        &["data", "pack", some_dir, "--raw", "--out", out],
    );
    assert!(ok, "{stderr}");
    let on_folder = eval_with(&ck, |o| o.data_dir = Some(some.clone()));
    let on_pack = eval_with(&ck, |o| {
        o.dataset = Some("packed".into());
        o.data_dir = Some(some_pack.clone());
    });
    assert_eq!(on_pack.confusion, on_folder.confusion);
    assert_eq!(
        on_folder.confusion[1].iter().sum::<u64>(),
        0,
        "no class-1 images"
    );
    // Images straight in the directory, not in class directories: said so.
    let loose = lone.join("test").join("class-1");
    let e = eval::run(
        &ck,
        &EvalOptions {
            workers: 1,
            data_dir: Some(loose),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("it holds 24 images itself") && e.contains("CLASS/NAME.png"),
        "{e}"
    );
    // A class directory the model does not know is named against the model's classes.
    std::fs::create_dir(grey.join("test/zebra")).unwrap();
    let e = eval::run(
        &ck,
        &EvalOptions {
            workers: 1,
            data_dir: Some(grey.clone()),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("[zebra] are not among the model's classes [class-0, class-1, class-2]"),
        "{e}"
    );
}

#[test]
fn a_run_on_the_bundled_mnist_started_outside_the_checkout_is_evaluated_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let in_dir = |args: &[&str]| dptrain_in(dir.path(), args);
    let (ok, _, err) = in_dir(&[
        "train",
        "--epochs",
        "1",
        "--train-limit",
        "256",
        "--test-limit",
        "100",
        "--run-dir",
        "run",
        "--quiet",
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = in_dir(&[
        "eval",
        "run/checkpoint-epoch0001.safetensors",
        "--limit",
        "100",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("\"top1\""), "{out}");
}

#[test]
fn a_model_whose_inputs_are_neither_grey_nor_colour_is_refused_for_image_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = run(&dir.path().join("run"), |o| {
        o.dataset = Some("synthetic:4x28x28".into());
        o.epochs = Some(1);
        o.train_limit = Some(128);
        o.test_limit = Some(64);
    });
    let ck = s.checkpoint.unwrap();
    let folder = dir.path().join("photos");
    photo_folder(&folder, 2);
    let e = eval::run(
        &ck,
        &EvalOptions {
            workers: 1,
            dataset: Some("imagefolder".into()),
            data_dir: Some(folder.clone()),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("the model takes 4-channel inputs"), "{e}");
    let test = folder.join("test");
    let (ok, _, stderr) = predict_json(ck.to_str().unwrap(), &[test.to_str().unwrap()]);
    assert!(!ok && stderr.contains("4-channel inputs"), "{stderr}");
    // Its own kind of dataset still evaluates.
    assert_eq!(eval_with(&ck, |o| o.limit = Some(64)).samples, 64);
}

/// Weights that fit any input size (a head after global pooling) load at another size with a
/// note saying both sizes; at the checkpoint's own size nothing is said.
#[test]
fn weights_at_another_input_size_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gap.toml");
    std::fs::write(
        &model,
        r#"name = "gap"
input = [1, 8, 8]
classes = 2
layers = [
  { type = "conv2d", name = "c", out = 4, kernel = 3, padding = 1 },
  { type = "relu", name = "a" },
  { type = "global_avg_pool", name = "g" },
  { type = "linear", name = "fc", out = "classes" },
  { type = "softmax_cross_entropy", name = "loss" },
]
"#,
    )
    .unwrap();
    let m = model.to_str().unwrap();
    let train = |dataset: &str, run: &str, weights: Option<&str>| {
        let run_dir = dir.path().join(run);
        let mut args = vec![
            "train",
            "--quiet",
            "--model",
            m,
            "--dataset",
            dataset,
            "--epochs",
            "1",
            "--train-limit",
            "32",
            "--test-limit",
            "8",
            "--batch",
            "8",
            "--threads",
            "1",
            "--run-dir",
            run_dir.to_str().unwrap(),
        ];
        if let Some(w) = weights {
            args.extend(["--weights", w]);
        }
        let (ok, _, stderr) = dptrain(&args);
        assert!(ok, "{stderr}");
        (run_dir.join("checkpoint-epoch0001.safetensors"), stderr)
    };
    let (ck, _) = train("synthetic:1x8x8:2", "first", None);
    let c = ck.to_str().unwrap();
    let (_, same) = train("synthetic:1x8x8:2", "same", Some(c));
    assert!(!same.contains("inputs, this run's are"), "{same}");
    let (_, other) = train("synthetic:1x12x12:2", "other", Some(c));
    assert!(
        other.contains("the checkpoint was trained on 1x8x8 inputs, this run's are 1x12x12"),
        "{other}"
    );
}
