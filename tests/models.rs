//! Model files and shape checks: every error names the file, line and layer; no input shape
//! passes the check and then fails in forward.

use dptrain::model::{file, Graph, ModelErrorKind};
use dptrain::nn::{FlatGrads, GradSink, Mode, Net, NetConfig, StepInfo};
use std::sync::Arc;

fn parse_err(text: &str) -> dptrain::model::ModelError {
    match file::parse(text, "bad.toml", "bad") {
        Err(e) => e,
        Ok(spec) => Graph::build(&spec, [1, 8, 8], 10).expect_err("the model should be refused"),
    }
}

#[test]
fn model_file_errors_name_the_line_and_the_layer() {
    // A shape error: both shapes named.
    let e = parse_err(
        "layers = [\n  { type = \"conv2d\", name = \"a\", out = 4, kernel = 3 },\n  { type = \"conv2d\", name = \"b\", input = \"input\", out = 4, kernel = 1 },\n  { type = \"add\", name = \"sum\", inputs = [\"a\", \"b\"] },\n]\n",
    );
    let msg = e.to_string();
    assert!(matches!(*e.kind, ModelErrorKind::Shape(_)), "{msg}");
    assert!(msg.starts_with("bad.toml:4: layer 'sum' (add)"), "{msg}");
    assert!(msg.contains("4x6x6") && msg.contains("4x8x8"), "{msg}");
    // A cycle.
    let e = parse_err(
        "layers = [\n  { type = \"relu\", name = \"a\", input = \"b\" },\n  { type = \"relu\", name = \"b\", input = \"a\" },\n  { type = \"linear\", out = 10, input = \"b\" },\n]\n",
    );
    assert!(matches!(*e.kind, ModelErrorKind::Cycle(_)), "{e}");
    assert!(
        e.to_string().starts_with("bad.toml:2: layer 'a' (relu)")
            || e.to_string().starts_with("bad.toml:3: layer 'b' (relu)"),
        "{e}"
    );
    // An unknown layer type.
    let e = parse_err("layers = [\n  { type = \"conv2d\", out = 4, kernel = 3 },\n  { type = \"convolution\", name = \"c\" },\n]\n");
    assert!(
        matches!(*e.kind, ModelErrorKind::UnknownType(ref t) if t == "convolution"),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("bad.toml:3:") && e.to_string().contains("conv2d"),
        "{e}"
    );
    // A missing input, with a suggestion.
    let e = parse_err("layers = [\n  { type = \"conv2d\", name = \"conv1\", out = 4, kernel = 3 },\n  { type = \"relu\", name = \"r\", input = \"conv2\" },\n]\n");
    assert!(
        matches!(*e.kind, ModelErrorKind::MissingInput { .. }),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("bad.toml:3: layer 'r' (relu)")
            && e.to_string().contains("did you mean 'conv1'"),
        "{e}"
    );
    // An unknown key, listing the ones the type takes.
    let e = parse_err(
        "layers = [\n  { type = \"conv2d\", name = \"c\", out = 4, kernel = 3, stide = 2 },\n]\n",
    );
    assert!(
        matches!(*e.kind, ModelErrorKind::UnknownKey { ref key, .. } if key == "stide"),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("bad.toml:2: layer 'c' (conv2d)")
            && e.to_string().contains("stride"),
        "{e}"
    );
    // An unknown top-level key (TOML's own message, with the line).
    let e = parse_err("name = \"x\"\nlayer = []\n");
    assert!(
        matches!(*e.kind, ModelErrorKind::Syntax(_)) && e.line == Some(2),
        "{e}"
    );
    // Inside a template: the instance's line and the template's.
    let e = parse_err(
        "layers = [\n  { type = \"conv2d\", out = 4, kernel = 3 },\n  { use = \"blk\", name = \"b1\", width = 4 },\n]\n[template.blk]\nparams = [\"width\"]\nlayers = [\n  { type = \"conv2d\", name = \"c\", out = \"$width\", kernel = 9 },\n]\n",
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("bad.toml:3 (template line 8): layer 'b1.c' (conv2d)"),
        "{msg}"
    );
}

#[test]
fn a_name_an_expression_cannot_use_is_said_for_what_it_is() {
    let with = |value: &str, expr: &str| {
        let text = format!(
            "layers = [\n  {{ type = \"conv2d\", out = 4, kernel = 3 }},\n  {{ use = \"blk\", name = \"b1\", width = {value} }},\n]\n[template.blk]\nparams = [\"width\"]\nlayers = [\n  {{ type = \"conv2d\", name = \"c\", out = \"{expr}\", kernel = 1 }},\n]\n"
        );
        parse_err(&text).to_string()
    };
    // A parameter that is not an integer, used in an expression: not "unknown".
    let msg = with("\"wide\"", "$width * 2");
    assert!(
        msg.contains("\"$width * 2\": the template parameter 'width' is \"wide\", not an integer"),
        "{msg}"
    );
    // The string substituted whole: the parameter it came from, not an unknown name 'wide'.
    let msg = with("\"wide\"", "$width");
    assert!(
        msg.contains("\"wide\": the template parameter 'width' is \"wide\", not an integer"),
        "{msg}"
    );
    assert!(
        !msg.contains("$wide") && !msg.contains("unknown name"),
        "{msg}"
    );
    // A name no parameter gave: unknown, as written.
    let e = parse_err("layers = [\n  { type = \"conv2d\", out = \"wide\", kernel = 3 },\n]\n");
    assert!(
        e.to_string().contains("\"wide\": unknown name 'wide'"),
        "{e}"
    );
    // A shape variable where a size must be fixed.
    let e = parse_err("layers = [\n  { type = \"conv2d\", out = 4, kernel = \"channels\" },\n]\n");
    assert!(
        e.to_string()
            .contains("'kernel' cannot depend on the input's shape"),
        "{e}"
    );
}

#[test]
fn array_of_tables_layers_read_like_inline_ones() {
    let text = "[[layers]]\ntype = \"conv2d\"\nname = \"c\"\nout = 4\nkernel = 3\n\n[[layers]]\ntype = \"relu\"\n\n[[layers]]\ntype = \"flatten\"\n\n[[layers]]\ntype = \"linear\"\nname = \"fc\"\nout = \"classes\"\n";
    let spec = file::parse(text, "t.toml", "t").unwrap();
    assert_eq!(spec.layers.len(), 4);
    assert_eq!(spec.layers[0].origin.as_ref().unwrap().line, 1);
    let g = Graph::build(&spec, [1, 8, 8], 10).unwrap();
    assert_eq!(g.num_params(), 4 * 9 + 4 + 10 * 4 * 36 + 10);
}

/// Forward and backward of one sample (training mode) and forward in evaluation.
fn run_once(g: Arc<Graph>) {
    let input = g.input();
    let mut net = Net::new(
        g,
        NetConfig {
            max_batch: 1,
            seed: 1,
        },
    )
    .unwrap();
    let x = vec![0.5f32; input.numel()];
    let info = StepInfo {
        seed: 1,
        step: 0,
        first_sample: 0,
        global_batch: 1,
    };
    net.forward(&x, &[0], 1, Mode::Train(info));
    let mut grads = FlatGrads::for_net(&net);
    net.backward(&mut grads, &mut |_| Ok(())).unwrap();
    net.forward(&x, &[0], 1, Mode::Eval);
}

#[test]
fn no_input_size_passes_the_shape_check_and_then_fails() {
    // Every built-in model that trains here, at every square size 1..64 and 1..4 channels
    // (plus a few non-square ones): the check either refuses the size, naming a layer, or a
    // training step and an evaluation run through.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for model in [
        "lenet5",
        "vgg-small",
        "resnet20",
        "densenet-small",
        "mobilenetv2",
        "resnet18",
    ] {
        let spec = dptrain::model::load(model).unwrap();
        let mut sizes: Vec<(usize, usize)> = (1..=64).map(|s| (s, s)).collect();
        sizes.extend([(13, 29), (32, 7), (1, 64), (64, 3)]);
        let (mut passed, mut refused) = (0, 0);
        for c in 1..=4 {
            for &(h, w) in &sizes {
                // resnet18 and mobilenetv2 are large: every 7th size (and all of the smallest).
                if matches!(model, "resnet18" | "mobilenetv2") && h > 8 && h % 7 != 0 {
                    continue;
                }
                match Graph::build(&spec, [c, h, w], 10) {
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("layer '"), "{model} at {c}x{h}x{w}: {msg}");
                        refused += 1;
                    }
                    Ok(g) => {
                        let g = Arc::new(g);
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            pool.install(|| run_once(g))
                        }));
                        assert!(
                            r.is_ok(),
                            "{model} at {c}x{h}x{w} passed the shape check but failed in a step"
                        );
                        passed += 1;
                    }
                }
            }
        }
        // Padded models take any size (as in PyTorch); pooled ones refuse the smallest.
        assert!(passed > 0, "{model}: no size passed ({refused} refused)");
        if matches!(model, "lenet5" | "vgg-small") {
            assert!(refused > 0, "{model}: no size was refused");
        }
    }
    // LeNet-5's exact limit: 16x16 is the smallest input (12..15 were let through before).
    let lenet = dptrain::model::load("lenet5").unwrap();
    assert!(Graph::build(&lenet, [1, 15, 15], 10).is_err());
    assert!(Graph::build(&lenet, [1, 16, 16], 10).is_ok());
}

#[test]
fn model_show_prints_every_layer_and_the_totals() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(["model", "show", "resnet18"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("layers.7.c2") && text.contains("512x4x4"),
        "{text}"
    );
    assert!(text.contains("11,173,962 parameters"), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args([
            "model",
            "show",
            "resnet50",
            "--input",
            "3x32x32",
            "--classes",
            "100",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(["model", "show", "lenet5", "--input", "1x12x12"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{err}");
    assert!(
        err.contains("layer 'c2' (conv2d)") && err.contains("6x4x4"),
        "{err}"
    );
}

/// A gradient sink that records the order blocks are written in.
struct Recording {
    grads: FlatGrads,
    written: Vec<usize>,
}

impl GradSink for Recording {
    fn block_grads(&mut self, block: usize) -> &mut [f32] {
        assert!(
            !self.written.contains(&block),
            "block {block}'s gradient asked for after it was written"
        );
        self.grads.block_grads(block)
    }
    fn block_written(&mut self, block: usize) -> Result<(), String> {
        self.written.push(block);
        Ok(())
    }
}

#[test]
fn a_convolution_hands_its_block_over_before_its_input_gradient() {
    for (model, input) in [
        ("vgg-small", [3, 32, 32]),
        ("lenet5", [1, 28, 28]),
        ("resnet20", [3, 32, 32]),
    ] {
        let spec = dptrain::model::load(model).unwrap();
        let g = Arc::new(Graph::build(&spec, input, 10).unwrap());
        let mut net = Net::new(
            g.clone(),
            NetConfig {
                max_batch: 2,
                seed: 1,
            },
        )
        .unwrap();
        let x = vec![0.25f32; 2 * g.input().numel()];
        let info = StepInfo {
            seed: 1,
            step: 0,
            first_sample: 0,
            global_batch: 2,
        };
        net.forward(&x, &[0, 1], 2, Mode::Train(info));
        let mut sink = Recording {
            grads: FlatGrads::for_net(&net),
            written: Vec::new(),
        };
        let mut reports = Vec::new();
        net.backward(&mut sink, &mut |d| {
            reports.push((d.exec, d.block));
            Ok(())
        })
        .unwrap();
        // Every block once, the last first.
        let blocks = net.blocks().len();
        assert_eq!(
            sink.written,
            (0..blocks).rev().collect::<Vec<_>>(),
            "{model}"
        );
        // Each convolution but the first (whose input needs no gradient) reports twice: with
        // its block, then without it, after its input gradient.
        let names: Vec<&str> = net.exec_names().collect();
        let nodes: Vec<usize> = net.exec_nodes().collect();
        let mut split = 0;
        for (k, w) in reports.windows(2).enumerate() {
            if w[0].0 == w[1].0 {
                assert!(w[0].1.is_some() && w[1].1.is_none(), "{model}: {w:?}");
                let op = g.nodes[nodes[w[0].0]].layer();
                assert!(
                    matches!(op, Some(dptrain::model::Op::Conv2d(_))),
                    "{model}: {} split at report {k}",
                    names[w[0].0]
                );
                split += 1;
            }
        }
        let convs = g
            .nodes
            .iter()
            .filter(|n| matches!(n.layer(), Some(dptrain::model::Op::Conv2d(_))))
            .count();
        assert_eq!(
            split,
            convs - 1,
            "{model}: every convolution but the first splits"
        );
    }
}
