//! Errors in a model description, naming where (file and line), which layer, and what.

use super::spec::{Op, Origin};
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
    /// The model file cannot be read (missing, not a regular file, too large, not UTF-8).
    #[error("{0}")]
    Read(String),
    /// A size past what any model may have (see `model::bounds`), or whose arithmetic
    /// overflows.
    #[error("'{field}' is {value}, too large: {limit}")]
    TooLarge {
        /// The field (`padding`, `out`, `output`, `params`, ...).
        field: String,
        /// Its value, or the computation that overflows.
        value: String,
        /// The bound, in words.
        limit: String,
    },
    /// Templates expand to more layers than a model may have, counted before expanding.
    #[error("the model expands to {count} layers, more than the {limit} a model may have (model::bounds::MAX_LAYERS){chain}")]
    TooManyLayers {
        /// Layers once expanded (saturating: `u64::MAX` means "more than that").
        count: u64,
        /// The cap.
        limit: u64,
        /// The heaviest chain of template uses, as `; most come from ...`, or empty.
        chain: String,
    },
    /// A name holds a control character (it would be printed raw in messages and tables).
    #[error("{key} of the layer at position {index} holds the control character {codepoint}: names are printed, use visible characters")]
    ControlCharacter {
        /// The key (`name`, `use`, `inputs`, `type`).
        key: String,
        /// 1-based position of the layer in its list (`layers` or the template's).
        index: usize,
        /// The character, as `U+0007`.
        codepoint: String,
    },
}

/// A message about shapes that do not fit.
impl From<String> for ModelErrorKind {
    fn from(message: String) -> Self {
        ModelErrorKind::Shape(message)
    }
}

/// A model error with its location. Shown with control characters (other than line breaks)
/// escaped: names and keys in it come from the file.
#[derive(Debug, Clone, PartialEq, Error)]
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

impl ModelError {
    /// An error at `origin`: a layer's table, and inside a template also the template's line,
    /// shown as `FILE:LINE (template line T): ` (the instance's line, then the template's).
    pub fn at(origin: &Origin, layer: Option<String>, kind: ModelErrorKind) -> Self {
        let (file, line) = match origin.template_line {
            Some(_) => (origin.to_string(), None),
            None => (origin.file.to_string(), Some(origin.line)),
        };
        ModelError {
            file,
            line,
            layer,
            kind: Box::new(kind),
        }
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A read error already names its path.
        let text = match &*self.kind {
            ModelErrorKind::Read(_) => self.kind.to_string(),
            kind => format!(
                "{}{}{}",
                location(&self.file, &self.line),
                layer_part(&self.layer),
                kind
            ),
        };
        for c in text.chars() {
            if c.is_control() && c != '\n' {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
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

    #[test]
    fn control_characters_in_a_message_are_escaped() {
        let e = ModelError::file(
            "m.toml",
            Some(2),
            ModelErrorKind::UnknownType("re\x1b[2Jlu".into()),
        );
        let shown = e.to_string();
        assert!(
            shown.starts_with("m.toml:2: unknown layer type 're\\u{1b}[2Jlu'"),
            "{shown}"
        );
        assert!(!shown.contains('\x1b'), "{shown}");
    }
}
