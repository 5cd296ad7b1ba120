//! Issue 21, model files: every size checked (row 1), nesting bounded (row 2), templates
//! counted before they are expanded (row 4), large files handled in linear time and bounded
//! memory (row 5), and the two unclear messages (`classes = 0`, control characters).

use dptrain::model::{self, file, Graph, ModelError, ModelErrorKind};
use std::process::Command;

fn show(text: &str) -> Result<String, ModelError> {
    model::show_text(text, "m.toml")
}

fn refused(text: &str) -> (ModelError, String) {
    let e = show(text).expect_err("the model is refused");
    let shown = e.to_string();
    (e, shown)
}

/// A model of `middle` (layers, written as TOML tables) between a 1x28x28 input and a
/// linear classifier.
fn model_of(middle: &str) -> String {
    format!(
        "input = [1, 28, 28]\nlayers = [\n{middle}\n  {{ type = \"flatten\" }},\n  {{ type = \"linear\", out = \"classes\" }},\n]\n"
    )
}

#[test]
fn row1_sizes_that_would_wrap_are_refused_naming_layer_field_and_value() {
    let cases = [
        (
            r#"{ type = "conv2d", name = "c", out = 4, kernel = 5, padding = 9223372036854775807 },"#,
            "padding",
            "9223372036854775807",
        ),
        (
            r#"{ type = "conv2d", name = "c", out = 4, kernel = 4294967297, dilation = 4294967296 },"#,
            "kernel",
            "4294967297",
        ),
        (
            r#"{ type = "conv2d", name = "c", out = 4, kernel = 3, dilation = 4294967296 },"#,
            "dilation",
            "4294967296",
        ),
        (
            r#"{ type = "conv2d", name = "c", out = "$channels * 4000000000000000000", kernel = 1 },"#,
            "out",
            "4000000000000000000",
        ),
        // Within 2^31 each, but the output (2e9 x 28 x 28) is past 2^40 elements.
        (
            r#"{ type = "conv2d", name = "c", out = 2000000000, kernel = 1 },"#,
            "output",
            "2000000000 x 28 x 28",
        ),
        // 2^31 x 2^31 weights: the parameter count is past 2^40.
        (
            r#"{ type = "conv2d", name = "c", out = 2147483648, kernel = [1, 1] }, { type = "global_avg_pool" }, { type = "linear", name = "c2", out = 2147483648 },"#,
            "output",
            "2147483648",
        ),
    ];
    for (layer, field, value) in cases {
        let (e, shown) = refused(&model_of(layer));
        assert!(
            matches!(*e.kind, ModelErrorKind::TooLarge { .. }),
            "{layer}: {shown}"
        );
        assert!(shown.contains("layer 'c"), "{layer}: {shown}");
        assert!(shown.contains(&format!("'{field}'")), "{layer}: {shown}");
        assert!(shown.contains(value), "{layer}: {shown}");
        assert!(shown.contains("too large"), "{layer}: {shown}");
    }
    // A linear layer whose weights (1e6 x 2e6) pass 2^40 elements.
    let (e, shown) = refused(
        r#"input = [1000000, 1, 1]
layers = [ { type = "linear", name = "fc", out = 2000000 }, { type = "linear", out = "classes" } ]"#,
    );
    assert!(
        matches!(*e.kind, ModelErrorKind::TooLarge { ref field, .. } if field == "params"),
        "{shown}"
    );
    assert!(
        shown.contains("'fc'") && shown.contains("2000000 x 1000000"),
        "{shown}"
    );
    // An input (from a dataset or --input) past the bounds is refused before any layer.
    let spec = file::parse(&model_of(""), "m.toml", "m").unwrap();
    let e = Graph::build(&spec, [1, 1 << 32, 1], 10).unwrap_err();
    assert!(
        e.to_string()
            .contains("'input' is 1x4294967296x1, too large"),
        "{e}"
    );
}

#[test]
fn row2_deep_parentheses_are_refused_not_a_stack_overflow() {
    let deep = format!("{}10{}", "(".repeat(20_000), ")".repeat(20_000));
    let text = format!("layers = [ {{ type = \"linear\", name = \"fc\", out = \"{deep}\" }} ]\n");
    let (_, shown) = refused(&text);
    assert!(
        shown.contains("layer 'fc' (linear): 'out': parentheses nest deeper than 64 levels"),
        "{shown}"
    );
    // 200,000 terms (a left-deep tree the evaluator would recurse through) likewise.
    let long = "1+".repeat(200_000) + "1";
    let text = format!("layers = [ {{ type = \"linear\", name = \"fc\", out = \"{long}\" }} ]\n");
    let (_, shown) = refused(&text);
    assert!(
        shown.contains("expression has more than 256 numbers and variables"),
        "{shown}"
    );
    // The TOML itself: the toml crate bounds its own nesting (arrays, inline tables, dotted
    // headers), reported as a syntax error on the line.
    let nested = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    let text = format!("layers = [ {{ type = \"relu\", x = {nested} }} ]\n");
    let (e, shown) = refused(&text);
    assert!(matches!(*e.kind, ModelErrorKind::Syntax(_)), "{shown}");
    assert!(shown.contains("recursion limit"), "{shown}");
}

/// 7 template levels, each using the next `uses` times (`uses`^7 layers).
fn template_tower(levels: usize, uses: usize) -> String {
    let mut t = String::from(
        "input = [1, 8, 8]\nlayers = [ { use = \"l1\", name = \"top\" }, { type = \"flatten\" }, { type = \"linear\", out = \"classes\" } ]\n",
    );
    for i in 1..=levels {
        t += &format!("[template.l{i}]\nlayers = [ ");
        for j in 0..uses {
            if i < levels {
                t += &format!("{{ use = \"l{}\", name = \"u{j}\" }}, ", i + 1);
            } else {
                t += &format!("{{ type = \"relu\", name = \"r{j}\" }}, ");
            }
        }
        t += "]\n";
    }
    t
}

/// Runs test `name` of this binary in a child process with `MODEL_LIMITS_CHILD` set; returns
/// what it wrote (stdout, then stderr, where the child's branch reports).
fn in_child(name: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("MODEL_LIMITS_CHILD", "1")
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    said
}

/// The process's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The `KEY <n>` line the child printed.
fn reported(stdout: &str, key: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.split_once(key).map(|(_, value)| value))
        .unwrap_or_else(|| panic!("no {key} in {stdout}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn row4_templates_expanding_past_the_cap_are_refused_before_expanding() {
    if std::env::var_os("MODEL_LIMITS_CHILD").is_some() {
        // 14^7 = 105,413,504 layers from a 3 KB file.
        let (e, shown) = refused(&template_tower(7, 14));
        assert!(
            matches!(
                *e.kind,
                ModelErrorKind::TooManyLayers {
                    count: 105_413_506,
                    ..
                }
            ),
            "{shown}"
        );
        assert!(shown.contains("more than the 200000"), "{shown}");
        assert!(
            shown.contains("1 x 'l1' (105413504 layers each), which uses 14 x 'l2'"),
            "{shown}"
        );
        assert!(shown.contains("14 x 'l7' (14 layers each)"), "{shown}");
        // 10^6 layers from a 2 KB file.
        let (_, shown) = refused(&template_tower(6, 10));
        assert!(shown.contains("expands to 1000002 layers"), "{shown}");
        eprintln!("\nVMHWM {}", peak_rss_kib());
        return;
    }
    let stdout = in_child("row4_templates_expanding_past_the_cap_are_refused_before_expanding");
    // Expanding 1e8 layers took 3.3 GB before it aborted; refusing takes what the test
    // binary itself needs.
    let kib = reported(&stdout, "VMHWM");
    assert!(kib < 200 * 1024, "peak RSS {kib} KiB");
    // Just under the cap is accepted: 5 levels of 10 (100,000 ReLUs).
    let g = model::show_text(&template_tower(5, 10), "m.toml").unwrap();
    assert!(g.contains("100003 layers"), "{}", &g[g.len() - 300..]);
}

fn relu_layers(n: usize) -> String {
    let mut t = String::from("input = [1, 4, 4]\nlayers = [\n{ type = \"flatten\" },\n");
    for _ in 0..n {
        t += "{ type = \"relu\" },\n";
    }
    t + "{ type = \"linear\", out = \"classes\" },\n]\n"
}

#[test]
fn row5_a_file_of_100k_layers_shows_in_bounded_memory() {
    if std::env::var_os("MODEL_LIMITS_CHILD").is_some() {
        let text = relu_layers(100_000);
        let table = model::show_text(&text, "m.toml").unwrap();
        assert!(
            table.contains("100003 layers"),
            "{}",
            &table[table.len() - 300..]
        );
        assert!(table.contains("relu_100000"));
        eprintln!("\nVMHWM {}", peak_rss_kib());
        return;
    }
    let stdout = in_child("row5_a_file_of_100k_layers_shows_in_bounded_memory");
    // Measured: about 230 MB for the release binary's `model show` of this file.
    let kib = reported(&stdout, "VMHWM");
    assert!(kib < 1024 * 1024, "peak RSS {kib} KiB");
    // Past the cap (written out, not by templates), refused with the count.
    let (e, shown) = refused(&relu_layers(200_000));
    assert!(
        matches!(
            *e.kind,
            ModelErrorKind::TooManyLayers { count: 200_002, .. }
        ),
        "{shown}"
    );
}

#[test]
fn a_model_files_zero_classes_names_the_files_field() {
    let text = "classes = 0\ninput = [1, 8, 8]\nlayers = [ { type = \"flatten\" }, { type = \"linear\", out = \"classes\" } ]\n";
    let (e, shown) = refused(text);
    assert!(
        matches!(*e.kind, ModelErrorKind::BadValue { ref key, .. } if key == "classes"),
        "{shown}"
    );
    assert_eq!(
        shown,
        "m.toml:1: 'classes': the model file's class count must be at least 1"
    );
    // Through the binary too: not the --classes flag's message.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zero.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dptrain"))
        .args(["model", "show", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("'classes': the model file's class count"),
        "{stderr}"
    );
    assert!(!stderr.contains("--classes"), "{stderr}");
}

#[test]
fn names_with_control_characters_are_refused_naming_the_layer_position() {
    let text = "input = [1, 8, 8]\nlayers = [ { type = \"flatten\" }, { type = \"linear\", name = \"fc\\u001b[2J\", out = \"classes\" } ]\n";
    let (e, shown) = refused(text);
    assert!(
        matches!(
            *e.kind,
            ModelErrorKind::ControlCharacter { ref key, index: 2, ref codepoint } if key == "name" && codepoint == "U+001B"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("name of the layer at position 2 holds the control character U+001B"),
        "{shown}"
    );
    assert!(!shown.contains('\u{1b}'), "{shown}");
    // In an input name, and in a template's layers (the position within the template).
    let text = "layers = [ { type = \"relu\", input = \"a\\u0007\" } ]\n";
    let (_, shown) = refused(text);
    assert!(
        shown.contains("input of the layer at position 1"),
        "{shown}"
    );
    let text = "layers = [ { use = \"b\", name = \"x\" } ]\n[template.b]\nlayers = [ { type = \"relu\" }, { type = \"relu\", name = \"\\u0085\" } ]\n";
    let (_, shown) = refused(text);
    assert!(
        shown.contains("position 2 holds the control character U+0085"),
        "{shown}"
    );
    // Whatever else reaches a message from the file is escaped (an unknown key here).
    let text = "layers = [ { type = \"relu\", \"k\\u001b\" = 1 } ]\n";
    let (_, shown) = refused(text);
    assert!(shown.contains("unknown key 'k\\u{1b}'"), "{shown}");
}
