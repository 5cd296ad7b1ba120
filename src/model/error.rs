//! Errors in a model description, naming where (file and line), which layer, and what.

use super::spec::Op;
use thiserror::Error;

/// What is wrong with a model.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelErrorKind {
    /// The file is not valid TOML, or its top level has an unknown key.
    #[error("{0}")]
    Syntax(String),
    /// A layer (or template instance) has a key its type does not take.
    #[error("unknown key '{key}' for {ty}; it takes: {allowed}")]
    UnknownKey {
        /// The key.
        key: String,
        /// The layer type (or `template NAME`).
        ty: String,
        /// The keys it takes.
        allowed: String,
    },
    /// A layer's `type` is not one we know.
    #[error("unknown layer type '{0}'; known types: {known}", known = Op::type_names().collect::<Vec<_>>().join(", "))]
    UnknownType(String),
    /// `use = NAME` names no template.
    #[error("unknown template '{name}'; this file defines: {known}")]
    UnknownTemplate {
        /// The name used.
        name: String,
        /// The templates defined.
        known: String,
    },
    /// A key has a value of the wrong kind or range.
    #[error("'{key}': {message}")]
    BadValue {
        /// The key.
        key: String,
        /// What is wrong, and what is expected.
        message: String,
    },
    /// Two layers have the same name.
    #[error("the name '{name}' is already taken by the layer at line {first_line}")]
    DuplicateName {
        /// The name.
        name: String,
        /// Where the first one is.
        first_line: usize,
    },
    /// A layer reads a name no layer defines.
    #[error("reads '{name}', which no layer defines{hint}")]
    MissingInput {
        /// The missing name.
        name: String,
        /// A suggestion (a similar name), or empty.
        hint: String,
    },
    /// Layers read each other in a circle.
    #[error("layers form a cycle: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    /// Shapes do not fit (the message names both).
    #[error("{0}")]
    Shape(String),
    /// Anything else about the graph as a whole.
    #[error("{0}")]
    Graph(String),
}

/// A model error with its location.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{}{}{kind}", location(.file, .line), layer_part(.layer))]
pub struct ModelError {
    /// The model file (or `builtin:NAME`, `builder:NAME`).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The layer (with its type), when the error is about one.
    pub layer: Option<String>,
    /// What is wrong (boxed: errors travel in `Result`s on every parse path, and the kind's
    /// strings would make each of those results large).
    pub kind: Box<ModelErrorKind>,
}

fn location(file: &str, line: &Option<usize>) -> String {
    match line {
        Some(l) => format!("{file}:{l}: "),
        None => format!("{file}: "),
    }
}

fn layer_part(layer: &Option<String>) -> String {
    layer
        .as_ref()
        .map(|l| format!("layer {l}: "))
        .unwrap_or_default()
}

impl ModelError {
    /// An error about the file as a whole.
    pub fn file(file: &str, line: Option<usize>, kind: ModelErrorKind) -> Self {
        Self {
            file: file.to_string(),
            line,
            layer: None,
            kind: Box::new(kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_type_lists_every_known_one_in_order() {
        assert_eq!(
            ModelErrorKind::UnknownType("convolution".into()).to_string(),
            "unknown layer type 'convolution'; known types: conv2d, batch_norm, relu, relu6, \
             max_pool, avg_pool, global_avg_pool, linear, dropout, add, concat, flatten, \
             softmax_cross_entropy"
        );
    }
}
