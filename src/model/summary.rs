//! `dptrain model show`: a model's layers with output shapes, parameters, multiply-accumulates
//! and activation memory, and the totals (what torchsummary and Keras' `summary()` print).

use super::graph::{Graph, NodeOp};
use std::fmt::Write;

/// Thousands separators: 11173962 -> "11,173,962".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// The table of `g`, one row per layer, then the totals.
pub fn render(g: &Graph) -> String {
    let mut t = String::new();
    let w = g
        .nodes
        .iter()
        .map(|n| n.name.len())
        .max()
        .unwrap_or(5)
        .clamp(5, 48);
    let _ = writeln!(
        t,
        "{:<w$}  {:<21}  {:>14}  {:>13}  {:>15}  {:>12}",
        "layer", "type", "output", "params", "MACs/sample", "act KB/samp"
    );
    let _ = writeln!(t, "{}", "-".repeat(w + 88));
    let mut act_bytes = 0u64;
    for n in &g.nodes {
        let bytes = 4 * n.shape.numel() as u64;
        if !matches!(n.op, NodeOp::Input) {
            act_bytes += bytes;
        }
        let name = if n.name.len() > w {
            // The last w - 3 bytes, moved forward to a character boundary (names are UTF-8).
            let mut from = n.name.len() - (w - 3);
            while !n.name.is_char_boundary(from) {
                from += 1;
            }
            format!("...{}", &n.name[from..])
        } else {
            n.name.clone()
        };
        let _ = writeln!(
            t,
            "{:<w$}  {:<21}  {:>14}  {:>13}  {:>15}  {:>12.1}",
            name,
            n.type_name(),
            n.shape.to_string(),
            thousands(n.params as u64),
            thousands(n.macs),
            bytes as f64 / 1024.0
        );
    }
    let _ = writeln!(t, "{}", "-".repeat(w + 88));
    let _ = writeln!(
        t,
        "{} layers; {} parameters ({:.2} MB as f32); {} MACs per sample ({:.3} GMAC); activations {:.2} MB per sample (outputs of every layer, kept for backward)",
        g.nodes.len() - 1,
        thousands(g.num_params() as u64),
        g.num_params() as f64 * 4.0 / 1e6,
        thousands(g.macs()),
        g.macs() as f64 / 1e9,
        act_bytes as f64 / 1e6,
    );
    t
}
