//! `dptrain eval`: a checkpoint's loss, top-1 and top-5 accuracy, per-class accuracy and
//! confusion matrix on a dataset split (the checkpoint's own dataset unless another is given).
//!
//! Data-parallel over worker threads, each with its own net and compute threads: the split is
//! cut into chunks of `batch` samples (by default the training run's per-worker batch, the
//! chunks its evaluation used), worker `w` takes chunks `w, w + W, ...`. Counts are integers,
//! and the loss is the sum of the chunks' losses in chunk order, so every figure is the same
//! bits whatever the worker and thread counts, and equal to the training run's evaluation of the
//! same checkpoint.

use super::{rank_of, InferError, TrainedModel};
use crate::data::image_folder::same_class_name;
use crate::data::{Dataset, Split};
use crate::nn::Mode;
use crate::pipeline::{collate, Batch, Normalize};
use crate::report::markdown::cell;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// `eval --out`'s `eval.md`, known by its first line.
const EVAL_MD: crate::output::Kind = crate::output::Kind {
    what: "an evaluation dptrain wrote",
    head: 64,
    is_one: |head| head.starts_with(b"# Evaluation: "),
};

/// `eval --out`'s `eval.json`: an object with the results' keys.
const EVAL_JSON: crate::output::Kind = crate::output::Kind {
    what: "an evaluation dptrain wrote",
    head: 64 << 20,
    is_one: |bytes| crate::output::is_json_object_with(bytes, &["checkpoint", "top1", "confusion"]),
};

/// How to evaluate.
#[derive(Debug, Clone, Default)]
pub struct EvalOptions {
    /// Dataset (any name `train --dataset` takes) [default: the checkpoint's].
    pub dataset: Option<String>,
    /// Its directory [default: the checkpoint's, when the dataset is the checkpoint's].
    pub data_dir: Option<PathBuf>,
    /// Which split [default: test].
    pub train_split: bool,
    /// Only the first N samples (as `--test-limit` / `--train-limit` choose them).
    pub limit: Option<usize>,
    /// Worker threads, each with a net [default: 1].
    pub workers: usize,
    /// Samples per forward [default: the training run's per-worker batch].
    pub batch: Option<usize>,
    /// Compute threads per worker [default: cores / workers].
    pub threads: Option<usize>,
}

/// A dataset split ready to evaluate on.
pub struct EvalData {
    /// The dataset as named (with its directory, if any).
    pub dataset: String,
    /// Which split.
    pub split: Split,
    /// The samples.
    pub set: Dataset,
}

/// One class's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassResult {
    /// The class name.
    pub name: String,
    /// Samples of the class.
    pub samples: u64,
    /// Of which predicted as the class (top-1).
    pub correct: u64,
    /// `correct / samples` (`None` without samples).
    pub accuracy: Option<f64>,
}

/// What an evaluation measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// The checkpoint.
    #[serde(serialize_with = "crate::output::path_as_text")]
    pub checkpoint: PathBuf,
    /// Its model.
    pub model: String,
    /// The dataset.
    pub dataset: String,
    /// `test` or `train`.
    pub split: String,
    /// Samples evaluated.
    pub samples: usize,
    /// Mean loss (the model's loss layers, as training reports the test loss).
    pub loss: f64,
    /// Top-1 accuracy.
    pub top1: f64,
    /// Top-k accuracy, k = `top_k` (5, or the class count when smaller).
    pub top_k_accuracy: f64,
    /// The k of `top_k_accuracy`.
    pub top_k: usize,
    /// Per class, label order.
    pub classes: Vec<ClassResult>,
    /// Confusion matrix: `confusion[true][predicted]` samples (those that predict a class).
    pub confusion: Vec<Vec<u64>>,
    /// Samples whose outputs were not all numbers (NaN or infinite: a model whose weights
    /// overflow), so that they predict no class ([`crate::backend::predicts`]): counted
    /// wrong, and in no column of the confusion matrix.
    pub no_prediction: u64,
    /// Worker threads used.
    pub workers: usize,
    /// Samples per forward.
    pub batch: usize,
}

/// The training run's per-worker batch (the chunks its evaluation used), else 64.
pub fn default_batch(model: &TrainedModel) -> usize {
    model
        .checkpoint
        .state
        .run
        .as_ref()
        .map_or(64, |r| (r.batch / r.world.max(1)).max(1))
}

/// A dataset name without the path it may hold (`imagefolder:DIR` -> `imagefolder`); other
/// names (`mnist`, `synthetic:1x8x8`) as they are.
fn name_without_path(dataset: &str) -> String {
    match dataset.split_once(':') {
        Some((head, _)) if has_location(dataset) => head.to_string(),
        _ => dataset.to_string(),
    }
}

/// Whether the data `dataset` names is read from a directory or file.
fn has_location(dataset: &str) -> bool {
    crate::data::DatasetSpec::parse(dataset, None, &crate::data::bundled_mnist_dir())
        .is_ok_and(|s| s.location().is_some())
}

/// The dataset and data directory the checkpoint's run read: as that run was given them,
/// unless that path is not found from here and the absolute path the checkpoint also
/// records is (a relative path given in another working directory).
fn recorded_data(r: &crate::train::checkpoint::RunIdentity) -> (String, Option<PathBuf>) {
    let given = r.data_dir.as_ref().map(PathBuf::from);
    let spec = crate::data::DatasetSpec::parse(
        &r.dataset,
        given.as_deref(),
        &crate::data::bundled_mnist_dir(),
    );
    let found = spec
        .ok()
        .and_then(|s| s.location().map(Path::exists))
        .unwrap_or(true);
    match &r.data_path {
        Some(absolute) if !found && Path::new(absolute).exists() => {
            (name_without_path(&r.dataset), Some(PathBuf::from(absolute)))
        }
        _ => (r.dataset.clone(), given),
    }
}

/// Refuses the data the checkpoint's run read (`dataset`, `data_dir` as recorded) where it is
/// not found from here, saying whose path it is and how to give another: the recorded path is
/// the one that run was given, which may be relative to where it started. `resolved` is the
/// absolute path the checkpoint also records (where that run found the data), named as tried
/// too when it is another path.
fn recorded_data_is_here(
    dataset: &str,
    data_dir: Option<&Path>,
    resolved: Option<&str>,
) -> Result<(), InferError> {
    let spec =
        crate::data::DatasetSpec::parse(dataset, data_dir, &crate::data::bundled_mnist_dir());
    let Some(path) = spec.as_ref().ok().and_then(|s| s.location()) else {
        return Ok(());
    };
    if path.exists() {
        return Ok(());
    }
    let given = if path.is_relative() {
        " (a relative path, as that run was given it)"
    } else {
        ""
    };
    let (from, relative) = match (data_dir, has_location(dataset) && dataset.contains(':')) {
        (Some(_), _) => ("--data-dir ", given),
        (None, true) => ("", given),
        // A default location (the bundled MNIST, the Debian package's Fashion-MNIST).
        (None, false) if path.is_relative() => {
            ("", " (its default, relative to where that run started)")
        }
        (None, false) => ("", " (its default)"),
    };
    let packed = matches!(spec, Ok(crate::data::DatasetSpec::Packed { .. }));
    let remedy = if packed {
        "give --data-dir with the packed file's path here"
    } else {
        "give --data-dir with the data's directory here"
    };
    let also = match resolved {
        Some(abs) if Path::new(abs) != path => format!(", nor is {abs}, where that run found it"),
        _ => String::new(),
    };
    Err(InferError::Options(format!(
        "the checkpoint's run read {dataset} from {from}{}, which is not found from \
         here{relative}{also}: {remedy}",
        path.display()
    )))
}

/// Reads the split to evaluate on and checks that it fits the model (input shape, classes).
pub fn load_data(model: &TrainedModel, opts: &EvalOptions) -> Result<EvalData, InferError> {
    let run = model.checkpoint.state.run.as_ref();
    let (dataset, data_dir) = match (&opts.dataset, run) {
        (Some(d), _) => (d.clone(), opts.data_dir.clone()),
        // The checkpoint's dataset read from another place: its name without the path it
        // may hold (`imagefolder:DIR`), which would be a second one.
        (None, Some(r)) if opts.data_dir.is_some() => {
            (name_without_path(&r.dataset), opts.data_dir.clone())
        }
        (None, Some(r)) => recorded_data(r),
        (None, None) => {
            return Err(InferError::Options(
                "the checkpoint does not record its dataset: give --dataset (and --data-dir)"
                    .into(),
            ))
        }
    };
    if opts.limit == Some(0) {
        return Err(InferError::Options(
            "--limit 0 leaves nothing to evaluate: give at least 1, or leave it out".into(),
        ));
    }
    if opts.dataset.is_none() && opts.data_dir.is_none() {
        let resolved = run.and_then(|r| r.data_path.as_deref());
        recorded_data_is_here(&dataset, data_dir.as_deref(), resolved)?;
    }
    let split = if opts.train_split {
        Split::Train
    } else {
        Split::Test
    };
    let spec = crate::data::DatasetSpec::parse(
        &dataset,
        data_dir.as_deref(),
        &crate::data::bundled_mnist_dir(),
    );
    let shown = match &data_dir {
        Some(d) => format!("{dataset} (--data-dir {})", d.display()),
        None => dataset.clone(),
    };
    if let Ok(crate::data::DatasetSpec::ImageFolder { dir }) = &spec {
        let split_dir = match split {
            Split::Train => dir.join("train"),
            // torchvision's ImageFolder root: class directories without train/ or test/.
            Split::Test if !dir.join("test").is_dir() && !dir.join("train").exists() => {
                dir.to_path_buf()
            }
            Split::Test => dir.join("test"),
        };
        let set = folder_split(model, &split_dir, opts.limit)?;
        return Ok(EvalData {
            dataset: shown,
            split,
            set,
        });
    }
    if let Ok(crate::data::DatasetSpec::Packed { file }) = &spec {
        let set = packed_split(model, file, split, opts.limit)?;
        return Ok(EvalData {
            dataset: shown,
            split,
            set,
        });
    }
    // Other datasets are in memory at their own size (checked below).
    let cfg = crate::config::TrainOptions {
        dataset: Some(dataset.clone()),
        data_dir: data_dir.clone(),
        batch: Some(1),
        train_limit: opts.limit.filter(|_| split == Split::Train),
        test_limit: opts.limit.filter(|_| split == Split::Test),
        quiet: true,
        ..Default::default()
    }
    .resolve()
    .map_err(InferError::Options)?;
    let (train, test) = crate::train::load_data(&cfg).map_err(prepare_error)?;
    let set = match split {
        Split::Test => test,
        Split::Train => train,
    };
    let names = crate::train::description::dataset_class_names(&set);
    check_fits(model, &shown, &set, &names)?;
    Ok(EvalData {
        dataset: shown,
        split,
        set,
    })
}

/// The images of one split directory of an ImageFolder, each class directory one of the
/// model's classes (labelled as the model numbers them; some may be missing), read as the
/// model's input (its channels: grey images are made colour and colour grey, as `predict`
/// does; its size through the checkpoint's evaluation transform), the first `limit` only.
fn folder_split(
    model: &TrainedModel,
    split_dir: &Path,
    limit: Option<usize>,
) -> Result<Dataset, InferError> {
    let d = &model.description;
    let channels = super::image_channels(model)?;
    // A class directory the model does not know: named against the model's classes (the
    // folder's own check would speak of a training split).
    let mut unknown: Vec<String> = std::fs::read_dir(split_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|c| !d.class_names.iter().any(|n| same_class_name(n, c)))
        .collect();
    unknown.sort();
    refuse_unknown_classes(model, split_dir, "class directories", &unknown)?;
    let mut folder = crate::data::image_folder::ImageFolder::open(split_dir, Some(&d.class_names))?;
    folder.channels = channels;
    folder.set_size(d.input[1], d.input[2]);
    if let Some(n) = limit {
        folder.truncate(n);
    }
    let eval = d.eval_transforms(&model.path)?;
    Ok(crate::pipeline::decode_split(
        &folder,
        &eval,
        "imagefolder",
    )?)
}

/// Refuses a dataset at `place` with classes (its `what`) the model does not know, naming them
/// against the model's classes.
fn refuse_unknown_classes(
    model: &TrainedModel,
    place: &Path,
    what: &str,
    unknown: &[String],
) -> Result<(), InferError> {
    if unknown.is_empty() {
        return Ok(());
    }
    Err(InferError::Mismatch {
        checkpoint: model.path.clone(),
        dataset: place.display().to_string(),
        what: format!(
            "its {what} [{}] are not among the model's classes [{}]",
            unknown.join(", "),
            model.description.class_names.join(", ")
        ),
    })
}

/// One split of a packed file read as the model's input (its channels, converted as
/// [`folder_split`] converts; its size through the checkpoint's evaluation transform), the
/// first `limit` only. As a folder's, its classes may be some of the model's, each labelled
/// as the model numbers it.
fn packed_split(
    model: &TrainedModel,
    file: &Path,
    split: Split,
    limit: Option<usize>,
) -> Result<Dataset, InferError> {
    let d = &model.description;
    let channels = super::image_channels(model)?;
    let (train, test) = crate::data::packed::open_pair(file)?;
    let mut set = match split {
        Split::Train => train,
        Split::Test => test,
    };
    let unknown: Vec<String> = (set.classes().iter())
        .filter(|c| !d.class_names.iter().any(|n| same_class_name(n, c)))
        .cloned()
        .collect();
    refuse_unknown_classes(model, file, "classes", &unknown)?;
    // The file's label of each class, as the model's (every class is the model's, so each
    // position is below its class count, which labels of u8 hold).
    let model_label: Vec<u8> = (set.classes().iter())
        .map(|c| {
            d.class_names
                .iter()
                .position(|n| same_class_name(n, c))
                .unwrap_or(0) as u8
        })
        .collect();
    set.channels = channels;
    set.set_size(d.input[1], d.input[2]);
    if let Some(w) = set.enlarged_warning() {
        crate::terminal::print_warning(&w);
    }
    if let Some(n) = limit {
        set.truncate(n);
    }
    let eval = d.eval_transforms(&model.path)?;
    let mut data = crate::pipeline::decode_packed_split(&set, &eval, "packed")?;
    for label in &mut data.labels {
        *label = model_label[usize::from(*label)];
    }
    data.num_classes = d.class_names.len();
    Ok(data)
}

/// A failure to load the dataset, typed where it is the data's.
fn prepare_error(e: crate::train::PrepareError) -> InferError {
    match e {
        crate::train::PrepareError::Data(d) | crate::train::PrepareError::TestSplit(d) => d.into(),
        other => InferError::Options(other.to_string()),
    }
}

/// Refuses a split whose images are not the model's input or whose classes are not its.
fn check_fits(
    model: &TrainedModel,
    dataset: &str,
    set: &Dataset,
    names: &[String],
) -> Result<(), InferError> {
    let d = &model.description;
    let mismatch = |what: String| InferError::Mismatch {
        checkpoint: model.path.clone(),
        dataset: dataset.to_string(),
        what,
    };
    let shape = [set.channels, set.height, set.width];
    if shape != d.input {
        let s = |v: [usize; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
        return Err(mismatch(format!(
            "its images are {} (CxHxW), the model takes {}",
            s(shape),
            s(d.input)
        )));
    }
    if names != d.class_names.as_slice() {
        return Err(mismatch(format!(
            "its classes are [{}], the model's are [{}]",
            names.join(", "),
            d.class_names.join(", ")
        )));
    }
    Ok(())
}

/// Reads the checkpoint and the split, and evaluates.
pub fn run(checkpoint: &Path, opts: &EvalOptions) -> Result<EvalReport, InferError> {
    let model = TrainedModel::load(checkpoint)?;
    let data = load_data(&model, opts)?;
    evaluate(&model, &data, opts)
}

/// What one worker counted.
struct Tally {
    /// (chunk, loss sum of the chunk).
    losses: Vec<(usize, f64)>,
    /// Per class: samples, top-1 correct, top-k correct.
    per_class: Vec<[u64; 3]>,
    /// Row-major `classes x classes`.
    confusion: Vec<u64>,
    /// Samples whose outputs predict no class.
    no_prediction: u64,
}

impl Tally {
    fn new(classes: usize) -> Self {
        Self {
            losses: Vec::new(),
            per_class: vec![[0; 3]; classes],
            confusion: vec![0; classes * classes],
            no_prediction: 0,
        }
    }

    fn add(&mut self, other: Tally) {
        self.losses.extend(other.losses);
        for (a, b) in self.per_class.iter_mut().zip(other.per_class) {
            (0..3).for_each(|i| a[i] += b[i]);
        }
        for (a, b) in self.confusion.iter_mut().zip(other.confusion) {
            *a += b;
        }
        self.no_prediction += other.no_prediction;
    }
}

/// The work of one evaluation: the model, the samples, how they are cut and shared.
struct Plan<'a> {
    model: &'a TrainedModel,
    set: &'a Dataset,
    norm: Normalize,
    batch: usize,
    chunks: usize,
    workers: usize,
    threads: usize,
    top_k: usize,
}

/// Evaluates `model` on `data` over `opts.workers` threads.
pub fn evaluate(
    model: &TrainedModel,
    data: &EvalData,
    opts: &EvalOptions,
) -> Result<EvalReport, InferError> {
    let batch = opts.batch.unwrap_or_else(|| default_batch(model));
    for (flag, value) in [("--batch", batch), ("--workers", opts.workers)] {
        if value == 0 {
            return Err(InferError::Options(format!("{flag} must be at least 1")));
        }
    }
    // A batch past the split is the split in one chunk (the same chunks, so the same figures),
    // and is sized for memory as such.
    let batch = batch.min(data.set.len().max(1));
    let classes = model.class_names().len();
    let chunks = data.set.len().div_ceil(batch);
    let workers = opts.workers.min(chunks).max(1);
    let threads = crate::limits::threads_per_worker(opts.threads, workers).0;
    super::check_memory(model, batch, (workers, Some("--workers")), threads)?;
    let plan = Plan {
        model,
        set: &data.set,
        norm: model.normalize(),
        batch,
        chunks,
        workers,
        threads,
        top_k: classes.min(5),
    };
    let tallies: Vec<Result<Tally, InferError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let plan = &plan;
                s.spawn(move || plan.worker(w))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(InferError::Threads("a worker panicked".into())))
            })
            .collect()
    });
    let mut total = Tally::new(classes);
    for t in tallies {
        total.add(t?);
    }
    Ok(plan.report(data, total, opts.workers))
}

impl Plan<'_> {
    /// Worker `w`: its chunks, on its own net and compute threads.
    fn worker(&self, w: usize) -> Result<Tally, InferError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .thread_name(move |i| format!("eval-{w}-compute-{i}"))
            .build()
            .map_err(|e| InferError::Threads(e.to_string()))?;
        pool.install(|| {
            let mut net = self.model.net(self.batch)?;
            let classes = self.model.class_names().len();
            let mut tally = Tally::new(classes);
            let (mut batch, mut indices) = (Batch::default(), Vec::with_capacity(self.batch));
            for chunk in (w..self.chunks).step_by(self.workers) {
                let start = chunk * self.batch;
                indices.clear();
                indices.extend(start as u32..(start + self.batch).min(self.set.len()) as u32);
                collate(self.set, &indices, &self.norm, &mut batch);
                let n = indices.len();
                let r = net.forward(&batch.images, &batch.labels, n, Mode::Eval);
                tally.losses.push((chunk, r.loss_sum));
                for (row, &y) in net.logits().chunks_exact(classes).zip(&batch.labels) {
                    let y = y as usize;
                    let rank = rank_of(row, y);
                    let c = &mut tally.per_class[y];
                    c[0] += 1;
                    c[1] += u64::from(rank == 0);
                    c[2] += u64::from(rank < self.top_k);
                    match crate::backend::predicted(row) {
                        Some(p) => tally.confusion[y * classes + p] += 1,
                        None => tally.no_prediction += 1,
                    }
                }
            }
            Ok(tally)
        })
    }

    /// The figures from the summed counts; the loss added in chunk order.
    fn report(&self, data: &EvalData, mut total: Tally, workers: usize) -> EvalReport {
        total.losses.sort_by_key(|&(chunk, _)| chunk);
        let mut loss_sum = 0.0f64;
        for (_, l) in &total.losses {
            loss_sum += l;
        }
        let n = data.set.len().max(1) as f64;
        let sum = |i: usize| total.per_class.iter().map(|c| c[i]).sum::<u64>() as f64;
        let names = self.model.class_names();
        let k = names.len();
        EvalReport {
            checkpoint: self.model.path.clone(),
            model: self.model.graph.name.clone(),
            dataset: data.dataset.clone(),
            split: match data.split {
                Split::Train => "train".into(),
                Split::Test => "test".into(),
            },
            samples: data.set.len(),
            loss: loss_sum / n,
            top1: sum(1) / n,
            top_k_accuracy: sum(2) / n,
            top_k: self.top_k,
            classes: names
                .iter()
                .zip(&total.per_class)
                .map(|(name, c)| ClassResult {
                    name: name.clone(),
                    samples: c[0],
                    correct: c[1],
                    accuracy: (c[0] > 0).then(|| c[1] as f64 / c[0] as f64),
                })
                .collect(),
            confusion: total
                .confusion
                .chunks(k.max(1))
                .map(<[u64]>::to_vec)
                .collect(),
            no_prediction: total.no_prediction,
            workers,
            batch: self.batch,
        }
    }
}

impl EvalReport {
    /// The headline: samples, loss, top-1, top-k.
    pub fn headline(&self) -> String {
        // With one class, top-k is top-1: said once.
        let top_k = if self.top_k > 1 {
            format!(", top-{} {:.2}%", self.top_k, 100.0 * self.top_k_accuracy)
        } else {
            String::new()
        };
        format!(
            "{} on {} ({} split, {}): loss {:.4}, top-1 {:.2}%{top_k}",
            self.model,
            self.dataset,
            self.split,
            crate::terminal::counted(self.samples, "image"),
            self.loss,
            100.0 * self.top1,
        )
    }

    /// What to say of samples that predict no class, if any: a warning.
    pub fn no_prediction_warning(&self) -> Option<String> {
        (self.no_prediction > 0).then(|| {
            format!(
                "the model's outputs were not numbers (NaN or infinite) for {} of {}: they \
                 predict no class, so they count as wrong and are in no column of the \
                 confusion matrix; {}",
                crate::terminal::counted(self.no_prediction as usize, "image"),
                self.samples,
                super::NO_PREDICTION_CAUSE
            )
        })
    }

    /// The per-class table (markdown).
    pub fn class_table(&self) -> String {
        let mut s =
            String::from("| class | samples | correct | accuracy |\n|---|---:|---:|---:|\n");
        for c in &self.classes {
            let acc = c
                .accuracy
                .map_or_else(|| "-".to_string(), |a| format!("{:.2}%", 100.0 * a));
            s += &format!(
                "| {} | {} | {} | {acc} |\n",
                cell(&c.name),
                c.samples,
                c.correct
            );
        }
        s
    }

    /// The confusion matrix (markdown): rows true classes, columns predicted.
    pub fn confusion_table(&self) -> String {
        let names: Vec<String> = self.classes.iter().map(|c| cell(&c.name)).collect();
        let mut s = format!("| true \\ predicted | {} |\n", names.join(" | "));
        s += &format!("|---|{}\n", "---:|".repeat(names.len()));
        for (name, row) in names.iter().zip(&self.confusion) {
            let row: Vec<String> = row.iter().map(u64::to_string).collect();
            s += &format!("| {name} | {} |\n", row.join(" | "));
        }
        s
    }

    /// The whole report as a markdown page.
    pub fn markdown(&self) -> String {
        format!(
            "# Evaluation: {}\n\n{}\n\n{}Checkpoint `{}`; {} worker(s), batch {}.\n\n\
             ## Per class\n\n{}\n## Confusion matrix\n\nRows: true class; columns: predicted \
             class.\n\n{}\n![confusion matrix](confusion.png)\n",
            self.model,
            self.headline(),
            self.no_prediction_warning()
                .map_or(String::new(), |w| format!("**Warning:** {w}.\n\n")),
            self.checkpoint.display(),
            self.workers,
            self.batch,
            self.class_table(),
            self.confusion_table()
        )
    }

    /// Checks, before an evaluation whose results they would hold, that [`Self::write`] may
    /// write its files into `dir`: it is or can be made a directory, and each file is absent,
    /// empty or an earlier evaluation's.
    pub fn check_out(dir: &Path) -> Result<(), InferError> {
        let out = |e: crate::output::OutputError| InferError::Output(e.to_string());
        crate::output::create_dir(dir).map_err(out)?;
        for (name, kind) in [
            ("eval.md", &EVAL_MD),
            ("eval.json", &EVAL_JSON),
            ("confusion.png", &crate::report::plot::PLOT_FILE),
        ] {
            crate::output::check_writable(&dir.join(name), kind).map_err(out)?;
        }
        Ok(())
    }

    /// Writes `eval.md`, `eval.json` and `confusion.png` into `dir` ([`Self::check_out`]
    /// first); returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, InferError> {
        let out = |e: crate::output::OutputError| InferError::Output(e.to_string());
        Self::check_out(dir)?;
        let md = dir.join("eval.md");
        crate::output::write_atomically(&md, self.markdown().as_bytes(), &EVAL_MD).map_err(out)?;
        let json = dir.join("eval.json");
        let text =
            serde_json::to_string_pretty(self).map_err(|e| InferError::Output(e.to_string()))?;
        crate::output::write_atomically(&json, text.as_bytes(), &EVAL_JSON).map_err(out)?;
        let png = dir.join("confusion.png");
        let names: Vec<String> = self.classes.iter().map(|c| c.name.clone()).collect();
        let flat: Vec<u64> = self.confusion.concat();
        let title = format!("Confusion matrix: {} on {}", self.model, self.split);
        crate::report::plot::confusion_matrix(&png, &title, &names, &flat)
            .map_err(InferError::Output)?;
        Ok(vec![md, json, png])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_data_not_found_from_here_names_whose_path_and_the_remedy() {
        let tmp = tempfile::tempdir().unwrap();
        let here = tmp.path().join("photos");
        std::fs::create_dir(&here).unwrap();
        let err =
            |dataset: &str, dir: Option<&Path>| match recorded_data_is_here(dataset, dir, None) {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
        // Found: nothing to say, wherever the path was given; generated data has no path.
        assert_eq!(err("imagefolder", Some(&here)), "");
        assert_eq!(err(&format!("imagefolder:{}", here.display()), None), "");
        assert_eq!(err("synthetic:1x8x8", None), "");
        // A directory in the dataset's name.
        let e = err("imagefolder:no-such-dir-of-the-eval-test/photos", None);
        assert!(
            e.contains("read imagefolder:no-such-dir-of-the-eval-test/photos from no-such-dir-of-the-eval-test/photos")
                && e.contains("a relative path, as that run was given it")
                && e.ends_with("give --data-dir with the data's directory here"),
            "{e}"
        );
        let e = err("packed", Some(Path::new("/gone/set.dpk")));
        assert!(
            e.contains("from --data-dir /gone/set.dpk")
                && !e.contains("relative")
                && e.ends_with("give --data-dir with the packed file's path here"),
            "{e}"
        );
        // Neither the path as given nor the absolute one recorded beside it: both are named.
        let e = recorded_data_is_here(
            "imagefolder",
            Some(Path::new("gone/photos")),
            Some("/old/photos"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("from --data-dir gone/photos")
                && e.contains("nor is /old/photos, where that run found it"),
            "{e}"
        );
        // A relative path given in another working directory: the absolute path recorded
        // beside it is read instead, where it is found.
        let identity = |dataset: &str, data_dir: Option<&str>, data_path: &Path| {
            crate::train::checkpoint::RunIdentity {
                dataset: dataset.into(),
                data_dir: data_dir.map(str::to_string),
                data_path: Some(data_path.display().to_string()),
                batch: 64,
                seed: 1,
                train_limit: None,
                skip_bad_samples: Some(false),
                world: 1,
                epochs: None,
                recipe: crate::train::recorded::Recorded::Absent,
                routine: crate::train::recorded::Recorded::Absent,
                exchange: crate::train::recorded::Recorded::Absent,
            }
        };
        let elsewhere = Some(here.clone());
        for (dataset, data_dir) in [
            ("imagefolder", Some("gone/photos")),
            ("imagefolder:gone/photos", None),
        ] {
            let (name, dir) = recorded_data(&identity(dataset, data_dir, &here));
            assert_eq!(
                (name.as_str(), &dir),
                ("imagefolder", &elsewhere),
                "{dataset}"
            );
        }
        // Found as given: as given; neither found: as given (refused by name above).
        let (name, dir) =
            recorded_data(&identity("imagefolder", here.to_str(), Path::new("/gone")));
        assert_eq!((name.as_str(), dir), ("imagefolder", elsewhere));
        let (name, dir) = recorded_data(&identity("imagefolder", Some("gone"), Path::new("/gone")));
        assert_eq!(
            (name.as_str(), dir),
            ("imagefolder", Some(PathBuf::from("gone")))
        );
        // The name without its path, for --data-dir given alone.
        assert_eq!(
            name_without_path("imagefolder:no-such-dir-of-the-eval-test/photos"),
            "imagefolder"
        );
        assert_eq!(name_without_path("packed:a/b.dpk"), "packed");
        assert_eq!(name_without_path("synthetic:1x8x8"), "synthetic:1x8x8");
        assert_eq!(name_without_path("mnist"), "mnist");
    }
}
