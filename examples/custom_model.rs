//! A network laid out in code and trained with the trainer: a small residual CNN on the
//! bundled MNIST (one epoch on a few thousand images), then its layer table.
//!
//! ```sh
//! cargo run --release --example custom_model
//! ```

use dptrain::config::TrainOptions;
use dptrain::model::{Conv2d, Graph, Linear, ModelBuilder, Pool, Units, INPUT};

fn main() -> Result<(), String> {
    // The same vocabulary as a model file (docs/MODEL_FILES.md): named layers, each reading
    // the layers it names.
    let mut m = ModelBuilder::new("tiny-resnet").default_input(1, 28, 28);
    let x = m.conv2d("stem", INPUT, Conv2d::new(16, 3).padding(1).no_bias());
    let x = m.batch_norm("stem_bn", &x);
    let x = m.relu(&x);
    // A residual block: two 3x3 convolutions and the identity shortcut.
    let y = m.conv2d("block.c1", &x, Conv2d::new(16, 3).padding(1).no_bias());
    let y = m.batch_norm("block.b1", &y);
    let y = m.relu(&y);
    let y = m.conv2d("block.c2", &y, Conv2d::new(16, 3).padding(1).no_bias());
    let y = m.batch_norm("block.b2", &y);
    let s = m.add(&[&y, &x]);
    let s = m.relu(&s);
    let p = m.max_pool(&s, Pool::new(2));
    // A wider, strided stage, then the classifier.
    let z = m.conv2d(
        "down",
        &p,
        Conv2d::new(32, 3).stride(2).padding(1).no_bias(),
    );
    let z = m.batch_norm("down_bn", &z);
    let z = m.relu(&z);
    let z = m.flatten(&z);
    m.linear("fc", &z, Linear::new(Units::classes()));
    let spec = m.build();

    let graph = Graph::build(&spec, [1, 28, 28], 10).map_err(|e| e.to_string())?;
    dptrain::out!("{}", dptrain::model::summary::render(&graph));

    let dir = std::env::temp_dir().join(format!("dptrain-example-{}", std::process::id()));
    let options = TrainOptions {
        epochs: Some(1),
        train_limit: Some(4096),
        test_limit: Some(1000),
        lr: Some(0.05),
        run_dir: Some(dir.clone()),
        no_checkpoints: true,
        quiet: true,
        ..Default::default()
    };
    let summary = dptrain::train::train(options.resolve_with_model(spec)?)?;
    dptrain::outln!(
        "tiny-resnet, 1 epoch on 4096 MNIST images: test accuracy {:.2}%",
        100.0 * summary.final_test_accuracy
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
