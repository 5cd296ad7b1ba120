//! Model files: TOML, Caffe's prototxt idea (a list of named layers, each naming its inputs),
//! with templates for repeated structures. The format is documented, with an example per
//! layer type, in `docs/MODEL_FILES.md`.
//!
//! ```toml
//! name = "tiny"
//! input = [1, 28, 28]
//! layers = [
//!   { type = "conv2d", name = "conv1", out = 8, kernel = 3, padding = 1 },
//!   { type = "relu" },                     # reads the previous layer
//!   { use = "block", name = "b1", out = 8 },
//!   { type = "global_avg_pool" },
//!   { type = "linear", name = "fc", out = "classes" },
//! ]
//! [template.block]
//! params = ["out"]
//! layers = [
//!   { type = "conv2d", name = "conv", out = "$out", kernel = 3, padding = 1 },
//!   { type = "add", inputs = ["conv", "input"] },   # "input": the instance's input
//! ]
//! ```

use super::bounds::{MAX_DIM, MAX_LAYERS, MAX_NAME_BYTES};
use super::error::{ModelError, ModelErrorKind};
use super::expr::{Expr, ExprError, SHAPE_VARS};
use super::spec::{
    BatchNorm, Conv2d, Layer, Linear, ModelSpec, Op, OpType, Origin, Pool, SoftmaxCrossEntropy,
    Units, INPUT,
};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use toml::{Spanned, Table, Value};

/// Templates may use templates, this deep.
const MAX_DEPTH: usize = 8;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Option<String>,
    #[serde(default)]
    description: String,
    input: Option<Spanned<[usize; 3]>>,
    classes: Option<Spanned<usize>>,
    layers: Vec<Spanned<Table>>,
    #[serde(default)]
    template: BTreeMap<String, Spanned<RawTemplate>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    #[serde(default)]
    params: Vec<String>,
    #[serde(default)]
    defaults: Table,
    layers: Vec<Spanned<Table>>,
}

/// Parses a model file's text. `file` names it in messages; `default_name` is used when the
/// file has no `name`.
pub fn parse(text: &str, file: &str, default_name: &str) -> Result<ModelSpec, ModelError> {
    let raw: RawModel = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| LineIndex::new(text).line_of(s.start));
        let msg = e.message().trim().to_string();
        ModelError::file(file, line, ModelErrorKind::Syntax(msg))
    })?;
    let lines = LineIndex::new(text);
    check_defaults(&raw, &lines, file)?;
    count_layers(&raw, file)?;
    let mut cx = Expander {
        lines,
        file: Arc::from(file),
        templates: &raw.template,
        layers: Vec::new(),
        first_line: BTreeMap::new(),
        unnamed: 0,
        aliases: BTreeMap::new(),
    };
    let scope = Scope {
        prefix: String::new(),
        input: INPUT.to_string(),
        bindings: BTreeMap::new(),
        instance_line: None,
        depth: 0,
    };
    cx.expand(&raw.layers, &scope)?;
    // Reading a template instance by name reads its last layer.
    let aliases = std::mem::take(&mut cx.aliases);
    for l in &mut cx.layers {
        for i in &mut l.inputs {
            let mut hops = 0;
            while let Some(target) = aliases.get(i.as_str()) {
                *i = target.clone();
                hops += 1;
                if hops > MAX_DEPTH {
                    break;
                }
            }
        }
    }
    if cx.layers.is_empty() {
        return Err(ModelError::file(
            file,
            None,
            ModelErrorKind::Graph("the model has no layers".into()),
        ));
    }
    Ok(ModelSpec {
        name: raw.name.unwrap_or_else(|| default_name.to_string()),
        description: raw.description,
        default_input: raw.input.map(Spanned::into_inner),
        default_classes: raw.classes.map(Spanned::into_inner),
        layers: cx.layers,
        source: file.to_string(),
    })
}

/// Line numbers of byte offsets, by binary search over the line starts (a scan from the
/// start of the text per layer made parsing quadratic in the file's length).
struct LineIndex {
    /// Byte offset of every `\n`.
    breaks: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let breaks = text
            .bytes()
            .enumerate()
            .filter(|&(_, b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        Self { breaks }
    }

    /// 1-based line of byte offset `pos`.
    fn line_of(&self, pos: usize) -> usize {
        self.breaks.partition_point(|&b| b < pos) + 1
    }
}

/// The file's own `input` and `classes`: positive, and within [`MAX_DIM`].
fn check_defaults(raw: &RawModel, lines: &LineIndex, file: &str) -> Result<(), ModelError> {
    let bad = |span: std::ops::Range<usize>, kind| {
        Err(ModelError::file(
            file,
            Some(lines.line_of(span.start)),
            kind,
        ))
    };
    let names = raw.template.keys().map(|n| ("template", n.as_str()));
    let top = [("name", raw.name.as_deref().unwrap_or(""))];
    for (what, text) in top
        .into_iter()
        .chain(names)
        .chain([("description", raw.description.as_str())])
    {
        if let Some(c) = text.chars().find(|c| c.is_control()) {
            return Err(ModelError::file(file, None, ModelErrorKind::BadValue {
                key: what.into(),
                message: format!("holds the control character U+{:04X}: {what}s are printed, use visible characters", c as u32),
            }));
        }
    }
    if let Some(c) = &raw.classes {
        let n = *c.get_ref();
        if n == 0 {
            return bad(
                c.span(),
                ModelErrorKind::BadValue {
                    key: "classes".into(),
                    message: "the model file's class count must be at least 1".into(),
                },
            );
        }
        if n as u64 > MAX_DIM {
            return bad(c.span(), too_large("classes", n, "at most 2^31 classes"));
        }
    }
    if let Some(i) = &raw.input {
        let dims = *i.get_ref();
        if dims.contains(&0) {
            return bad(i.span(), ModelErrorKind::BadValue {
                key: "input".into(),
                message: format!(
                    "the model file's input [{}, {}, {}] has a zero dimension: give [channels, height, width], each at least 1",
                    dims[0], dims[1], dims[2]
                ),
            });
        }
        if let Some(&d) = dims.iter().find(|&&d| d as u64 > MAX_DIM) {
            return bad(
                i.span(),
                too_large("input", d, "each dimension is at most 2^31"),
            );
        }
    }
    Ok(())
}

fn too_large(field: &str, value: impl std::fmt::Display, limit: &str) -> ModelErrorKind {
    ModelErrorKind::TooLarge {
        field: field.into(),
        value: value.to_string(),
        limit: limit.into(),
    }
}

/// Refuses, before anything is expanded, a file whose templates expand to more than
/// [`MAX_LAYERS`] layers: each template's size computed once, bottom-up, saturating.
fn count_layers(raw: &RawModel, file: &str) -> Result<(), ModelError> {
    let mut counter = Counter {
        templates: &raw.template,
        sizes: BTreeMap::new(),
        busy: BTreeSet::new(),
    };
    let count = counter.list(&raw.layers, 0);
    if count <= MAX_LAYERS {
        return Ok(());
    }
    let mut chain = Vec::new();
    let mut tables = &raw.layers;
    for _ in 0..MAX_DEPTH {
        let mut uses: BTreeMap<&str, u64> = BTreeMap::new();
        for t in tables {
            if let Some(Value::String(name)) = t.get_ref().get("use") {
                *uses.entry(name.as_str()).or_default() += 1;
            }
        }
        let heaviest = uses.into_iter().max_by_key(|&(name, n)| {
            n.saturating_mul(counter.sizes.get(name).copied().unwrap_or(1))
        });
        let Some((name, n)) = heaviest else { break };
        let Some(t) = raw.template.get(name) else {
            break;
        };
        let each = counter.sizes.get(name).copied().unwrap_or(1);
        chain.push(format!("{n} x '{name}' ({each} layers each)"));
        tables = &t.get_ref().layers;
    }
    let chain = if chain.is_empty() {
        String::new()
    } else {
        format!("; most come from {}", chain.join(", which uses "))
    };
    Err(ModelError::file(
        file,
        None,
        ModelErrorKind::TooManyLayers {
            count,
            limit: MAX_LAYERS,
            chain,
        },
    ))
}

/// Layers each template expands to.
struct Counter<'a> {
    templates: &'a BTreeMap<String, Spanned<RawTemplate>>,
    sizes: BTreeMap<&'a str, u64>,
    /// Templates being counted (a template using itself is left to the expansion's error).
    busy: BTreeSet<&'a str>,
}

impl<'a> Counter<'a> {
    /// Layers `tables` expand to, at template nesting `depth` (past [`MAX_DEPTH`] the
    /// expansion fails anyway, so counting stops there: the recursion stays shallow).
    fn list(&mut self, tables: &'a [Spanned<Table>], depth: usize) -> u64 {
        tables.iter().fold(0u64, |sum, t| {
            let n = match t.get_ref().get("use") {
                Some(Value::String(name)) if depth < MAX_DEPTH => self.template(name, depth + 1),
                _ => 1,
            };
            sum.saturating_add(n)
        })
    }

    fn template(&mut self, name: &'a str, depth: usize) -> u64 {
        if let Some(&n) = self.sizes.get(name) {
            return n;
        }
        let Some(t) = self.templates.get(name) else {
            return 1;
        };
        if !self.busy.insert(name) {
            return 1;
        }
        let n = self.list(&t.get_ref().layers, depth);
        self.busy.remove(name);
        self.sizes.insert(name, n);
        n
    }
}

/// Refuses a name with a control character (it would reach terminals raw) or longer than
/// [`MAX_NAME_BYTES`].
fn check_name(key: &str, s: &str, index: usize) -> Result<(), ModelErrorKind> {
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(ModelErrorKind::ControlCharacter {
            key: key.into(),
            index,
            codepoint: format!("U+{:04X}", c as u32),
        });
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(too_large(
            key,
            format!("{} bytes long", s.len()),
            &format!("names are at most {MAX_NAME_BYTES} bytes"),
        ));
    }
    Ok(())
}

struct Expander<'a> {
    lines: LineIndex,
    file: Arc<str>,
    templates: &'a BTreeMap<String, Spanned<RawTemplate>>,
    layers: Vec<Layer>,
    first_line: BTreeMap<String, usize>,
    unnamed: usize,
    /// Template instance name -> the name of its last layer (what reading the instance reads).
    aliases: BTreeMap<String, String>,
}

/// Where a layer's table is: its line, and its 1-based position in its list.
#[derive(Clone, Copy)]
struct Position {
    line: usize,
    index: usize,
}

/// Where a list of layers is being expanded: at the top level, or inside a template instance.
struct Scope {
    /// `NAME.` of the instance (empty at the top level).
    prefix: String,
    /// What `input` (and the first layer's default input) refers to.
    input: String,
    /// Template parameters.
    bindings: BTreeMap<String, Value>,
    /// Line of the instance (for layers made by a template).
    instance_line: Option<usize>,
    depth: usize,
}

impl Scope {
    /// The full name of a name written in this scope.
    fn resolve(&self, local: &str) -> String {
        if local == INPUT {
            self.input.clone()
        } else {
            format!("{}{local}", self.prefix)
        }
    }
}

/// One layer table being read: its remaining keys, for the unknown-key check.
struct Keys<'t> {
    table: Table,
    err: &'t dyn Fn(ModelErrorKind) -> ModelError,
    ty: String,
    allowed: Vec<&'static str>,
    ints: BTreeMap<String, i64>,
    /// The template parameters in scope, whatever their type: an expression naming one that
    /// is not an integer is told so (not "unknown").
    params: &'t BTreeMap<String, Value>,
}

impl Keys<'_> {
    fn bad(&self, key: &str, message: impl Into<String>) -> ModelError {
        (self.err)(ModelErrorKind::BadValue {
            key: key.to_string(),
            message: message.into(),
        })
    }

    /// A required `key` is missing: naming a key of the table that looks like it misspelt.
    fn missing(&self, key: &str) -> ModelError {
        match super::suggest::closest(key, self.table.keys().map(String::as_str)) {
            Some(k) => self.bad(key, format!("missing (required); is '{k}' it, misspelt?")),
            None => self.bad(key, "missing (required)"),
        }
    }

    /// `name` in the expression `text` of `key` is not bound to an integer: a template
    /// parameter of another type, a shape variable where sizes must be fixed, or no name.
    fn unknown_name(&self, key: &str, text: &str, name: &str) -> ModelError {
        // `out = "$width"` with `width = "wide"` arrives here as the text "wide", substituted
        // whole: the parameter it came from is named, not an unknown name 'wide'.
        let substituted = self
            .params
            .iter()
            .find(|(_, v)| v.as_str() == Some(text))
            .map(|(k, v)| (k.as_str(), v));
        let why = match self.params.get(name).map(|v| (name, v)).or(substituted) {
            Some((param, v)) => format!("the template parameter '{param}' is {v}, not an integer"),
            None if SHAPE_VARS.contains(&name) => format!(
                "'{key}' cannot depend on the input's shape: channels and classes may be used \
                 in counts only (out, groups)"
            ),
            None => format!(
                "unknown name '{name}' (an expression may use template parameters, channels and \
                 classes)"
            ),
        };
        self.bad(key, format!("\"{text}\": {why}"))
    }

    /// An expression's error, for `key` whose text is `text`.
    fn expr_error(&self, key: &str, text: &str, e: ExprError) -> ModelError {
        match e {
            ExprError::UnknownVar(name) => self.unknown_name(key, text, &name),
            other => self.bad(key, other.to_string()),
        }
    }

    fn take(&mut self, key: &'static str) -> Option<Value> {
        self.allowed.push(key);
        self.table.remove(key)
    }

    fn int_value(&self, key: &str, v: &Value) -> Result<i64, ModelError> {
        match v {
            Value::Integer(i) => Ok(*i),
            Value::String(s) => {
                let e = Expr::parse(s).map_err(|m| self.bad(key, m.to_string()))?;
                e.bind(&self.ints)
                    .eval(&self.ints)
                    .map_err(|m| self.expr_error(key, s, m))
            }
            other => Err(self.bad(
                key,
                format!("expected an integer, got {}", other.type_str()),
            )),
        }
    }

    fn usize_of(&self, key: &str, v: &Value, min: i64) -> Result<usize, ModelError> {
        let i = self.int_value(key, v)?;
        if i < min {
            return Err(self.bad(key, format!("must be at least {min}, got {i}")));
        }
        self.dim(key, i)
    }

    /// `i` (already checked non-negative) as a dimension: at most [`MAX_DIM`].
    fn dim(&self, key: &str, i: i64) -> Result<usize, ModelError> {
        match u64::try_from(i) {
            Ok(n) if n <= MAX_DIM => usize::try_from(n).map_err(|_| self.too_large(key, i)),
            _ => Err(self.too_large(key, i)),
        }
    }

    fn too_large(&self, key: &str, value: i64) -> ModelError {
        (self.err)(too_large(
            key,
            value,
            "sizes in a model are at most 2^31 (2147483648)",
        ))
    }

    /// An integer or `[rows, cols]`.
    fn pair(
        &mut self,
        key: &'static str,
        default: [usize; 2],
        min: i64,
    ) -> Result<[usize; 2], ModelError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Array(a)) if a.len() == 2 => Ok([
                self.usize_of(key, &a[0], min)?,
                self.usize_of(key, &a[1], min)?,
            ]),
            Some(Value::Array(_)) => Err(self.bad(key, "expected an integer or [rows, columns]")),
            Some(v) => {
                let n = self.usize_of(key, &v, min)?;
                Ok([n, n])
            }
        }
    }

    fn required_pair(&mut self, key: &'static str) -> Result<[usize; 2], ModelError> {
        if !self.table.contains_key(key) {
            return Err(self.missing(key));
        }
        self.pair(key, [0, 0], 1)
    }

    /// A count that may depend on `channels` / `classes`.
    fn units(&mut self, key: &'static str, default: Option<Units>) -> Result<Units, ModelError> {
        let Some(v) = self.take(key) else {
            return default.ok_or_else(|| self.missing(key));
        };
        match &v {
            Value::Integer(i) if *i >= 1 => Ok(Units::Fixed(self.dim(key, *i)?)),
            Value::String(s) => {
                let e = Expr::parse(s)
                    .map_err(|m| self.bad(key, m.to_string()))?
                    .bind(&self.ints);
                let mut free = Vec::new();
                e.free_vars(&mut free);
                if let Some(f) = free.iter().find(|f| !SHAPE_VARS.contains(&f.as_str())) {
                    return Err(self.unknown_name(key, s, f));
                }
                if free.is_empty() {
                    let n = e.eval(&self.ints).map_err(|m| self.expr_error(key, s, m))?;
                    if n < 1 {
                        return Err(self.bad(key, format!("must be at least 1, got {n}")));
                    }
                    return Ok(Units::Fixed(self.dim(key, n)?));
                }
                Ok(Units::Expr(e))
            }
            other => Err(self.bad(
                key,
                format!(
                    "expected a positive integer or an expression such as \"classes\", got {other}"
                ),
            )),
        }
    }

    fn bool(&mut self, key: &'static str, default: bool) -> Result<bool, ModelError> {
        match self.take(key) {
            None => Ok(default),
            Some(Value::Boolean(b)) => Ok(b),
            Some(v) => Err(self.bad(key, format!("expected true or false, got {v}"))),
        }
    }

    fn float(
        &mut self,
        key: &'static str,
        default: f64,
        lo: f64,
        hi: f64,
    ) -> Result<f32, ModelError> {
        let v = match self.take(key) {
            None => return Ok(default as f32),
            Some(Value::Float(f)) => f,
            Some(Value::Integer(i)) => i as f64,
            Some(v) => return Err(self.bad(key, format!("expected a number, got {v}"))),
        };
        if !(lo..=hi).contains(&v) {
            return Err(self.bad(key, format!("must be in [{lo}, {hi}], got {v}")));
        }
        Ok(v as f32)
    }

    /// Fails on any key not taken.
    fn finish(self) -> Result<(), ModelError> {
        if let Some(key) = self.table.keys().next() {
            return Err((self.err)(ModelErrorKind::UnknownKey {
                key: key.clone(),
                ty: self.ty.clone(),
                allowed: self.allowed.join(", "),
            }));
        }
        Ok(())
    }
}

/// Replaces every string value that is exactly `$name` by the bound value (any type); other
/// strings with `$` stay expressions, evaluated where a number is expected.
fn substitute(v: &mut Value, bindings: &BTreeMap<String, Value>) {
    match v {
        Value::String(s) => {
            if let Some(b) = s.strip_prefix('$').and_then(|n| bindings.get(n)) {
                *v = b.clone();
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| substitute(x, bindings)),
        Value::Table(t) => t.iter_mut().for_each(|(_, x)| substitute(x, bindings)),
        _ => {}
    }
}

impl Expander<'_> {
    fn expand(&mut self, tables: &[Spanned<Table>], scope: &Scope) -> Result<String, ModelError> {
        let mut prev = scope.input.clone();
        for (i, t) in tables.iter().enumerate() {
            let line = self.lines.line_of(t.span().start);
            let mut table = t.get_ref().clone();
            for (_, v) in table.iter_mut() {
                substitute(v, &scope.bindings);
            }
            let at = Position { line, index: i + 1 };
            prev = if table.contains_key("use") {
                self.instance(table, at, scope, &prev)?
            } else {
                self.layer(table, at, scope, &prev)?
            };
        }
        Ok(prev)
    }

    fn origin(&self, line: usize, scope: &Scope) -> Origin {
        match scope.instance_line {
            Some(inst) => Origin {
                file: self.file.clone(),
                line: inst,
                template_line: Some(line),
            },
            None => Origin {
                file: self.file.clone(),
                line,
                template_line: None,
            },
        }
    }

    fn err_at(
        &self,
        line: usize,
        scope: &Scope,
        layer: Option<String>,
        kind: ModelErrorKind,
    ) -> ModelError {
        ModelError::at(&self.origin(line, scope), layer, kind)
    }

    /// A name-like string (`name`, `use`), checked by [`check_name`].
    fn string(
        &self,
        table: &mut Table,
        key: &str,
        index: usize,
        err: &dyn Fn(ModelErrorKind) -> ModelError,
    ) -> Result<Option<String>, ModelError> {
        match table.remove(key) {
            None => Ok(None),
            Some(Value::String(s)) => {
                check_name(key, &s, index).map_err(err)?;
                Ok(Some(s))
            }
            Some(v) => Err(err(ModelErrorKind::BadValue {
                key: key.into(),
                message: format!("expected a string, got {v}"),
            })),
        }
    }

    /// The full names of the inputs a table names (`input = "x"` or `inputs = [...]`).
    fn inputs(
        &self,
        table: &mut Table,
        scope: &Scope,
        prev: &str,
        index: usize,
        err: &dyn Fn(ModelErrorKind) -> ModelError,
    ) -> Result<Vec<String>, ModelError> {
        let name = |key: &str, s: &str| {
            check_name(key, s, index).map_err(err)?;
            Ok(scope.resolve(s))
        };
        let bad = |m: String| {
            err(ModelErrorKind::BadValue {
                key: "inputs".into(),
                message: m,
            })
        };
        match (table.remove("input"), table.remove("inputs")) {
            (Some(_), Some(_)) => Err(bad("give either 'input' or 'inputs', not both".into())),
            (Some(Value::String(s)), None) => Ok(vec![name("input", &s)?]),
            (Some(v), None) => Err(bad(format!("'input' must be a layer name, got {v}"))),
            (None, Some(Value::Array(a))) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => name("inputs", s),
                    other => Err(bad(format!("expected layer names, got {other}"))),
                })
                .collect(),
            (None, Some(v)) => Err(bad(format!("expected an array of layer names, got {v}"))),
            (None, None) => Ok(vec![prev.to_string()]),
        }
    }

    fn claim_name(&mut self, name: &str, line: usize, scope: &Scope) -> Result<(), ModelError> {
        if name == INPUT || name.is_empty() {
            return Err(self.err_at(line, scope, Some(format!("'{name}'")), ModelErrorKind::BadValue {
                key: "name".into(),
                message: format!("'{INPUT}' (and the empty name) refer to the network's input; choose another name"),
            }));
        }
        if let Some(&first) = self.first_line.get(name) {
            return Err(self.err_at(
                line,
                scope,
                Some(format!("'{name}'")),
                ModelErrorKind::DuplicateName {
                    name: name.to_string(),
                    first_line: first,
                },
            ));
        }
        self.first_line.insert(name.to_string(), line);
        Ok(())
    }

    fn layer(
        &mut self,
        mut table: Table,
        at: Position,
        scope: &Scope,
        prev: &str,
    ) -> Result<String, ModelError> {
        let line = at.line;
        let plain = |k: ModelErrorKind| self.err_at(line, scope, None, k);
        let ty = match table.remove("type") {
            Some(Value::String(s)) => {
                check_name("type", &s, at.index).map_err(plain)?;
                s
            }
            Some(v) => {
                return Err(plain(ModelErrorKind::BadValue {
                    key: "type".into(),
                    message: format!("expected a layer type name, got {v}"),
                }))
            }
            None => {
                return Err(plain(ModelErrorKind::BadValue {
                    key: "type".into(),
                    message: "missing: every layer needs a 'type' (or 'use' for a template)".into(),
                }))
            }
        };
        let Some(op_type) = OpType::from_name(&ty) else {
            return Err(plain(ModelErrorKind::UnknownType(ty)));
        };
        let local = self.string(&mut table, "name", at.index, &plain)?;
        let name = self.layer_name(local.as_deref(), scope, &ty);
        let label = format!("'{name}' ({ty})");
        let err = |k: ModelErrorKind| self.err_at(line, scope, Some(label.clone()), k);
        let inputs = self.inputs(&mut table, scope, prev, at.index, &err)?;
        let ints = scope
            .bindings
            .iter()
            .filter_map(|(k, v)| v.as_integer().map(|i| (k.clone(), i)))
            .collect();
        let mut keys = Keys {
            table,
            err: &err,
            ty: ty.clone(),
            allowed: vec!["type", "name", "input", "inputs"],
            ints,
            params: &scope.bindings,
        };
        let op = parse_op(op_type, &mut keys)?;
        keys.finish()?;
        // The count before expanding cannot see a template chosen by a parameter
        // (`use = "$t"`): this bounds those too.
        if self.layers.len() as u64 >= MAX_LAYERS {
            return Err(err(ModelErrorKind::TooManyLayers {
                count: MAX_LAYERS + 1,
                limit: MAX_LAYERS,
                chain: " (counted while expanding, at this layer)".into(),
            }));
        }
        self.claim_name(&name, line, scope)?;
        self.layers.push(Layer {
            name: name.clone(),
            op,
            inputs,
            origin: Some(self.origin(line, scope)),
        });
        Ok(name)
    }

    /// The full name of a layer or template instance: its `name` within `scope`, or for an
    /// unnamed one `KIND_N` (`N` counting the file's unnamed layers).
    fn layer_name(&mut self, local: Option<&str>, scope: &Scope, kind: &str) -> String {
        match local {
            Some(n) => scope.resolve(n),
            None => {
                self.unnamed += 1;
                format!("{}{kind}_{}", scope.prefix, self.unnamed)
            }
        }
    }

    fn instance(
        &mut self,
        mut table: Table,
        at: Position,
        scope: &Scope,
        prev: &str,
    ) -> Result<String, ModelError> {
        let line = at.line;
        let plain = |k: ModelErrorKind| self.err_at(line, scope, None, k);
        let tname = self
            .string(&mut table, "use", at.index, &plain)?
            .unwrap_or_default();
        let Some(template) = self.templates.get(&tname) else {
            return Err(plain(ModelErrorKind::UnknownTemplate {
                name: tname,
                known: self
                    .templates
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            }));
        };
        if scope.depth >= MAX_DEPTH {
            return Err(plain(ModelErrorKind::Graph(format!(
                "templates nest deeper than {MAX_DEPTH} levels (does '{tname}' use itself?)"
            ))));
        }
        let local = self.string(&mut table, "name", at.index, &plain)?;
        let name = self.layer_name(local.as_deref(), scope, &tname);
        let label = format!("'{name}' (template {tname})");
        let err = |k: ModelErrorKind| self.err_at(line, scope, Some(label.clone()), k);
        let inputs = self.inputs(&mut table, scope, prev, at.index, &err)?;
        if inputs.len() != 1 {
            return Err(err(ModelErrorKind::BadValue {
                key: "inputs".into(),
                message: format!("a template instance reads one input, got {}", inputs.len()),
            }));
        }
        let t = template.get_ref();
        let mut bindings = BTreeMap::new();
        for (k, v) in t.defaults.iter() {
            if !t.params.contains(k) {
                let tl = self.lines.line_of(template.span().start);
                return Err(self.err_at(
                    tl,
                    scope,
                    None,
                    ModelErrorKind::BadValue {
                        key: format!("template.{tname}.defaults.{k}"),
                        message: format!(
                            "'{k}' is not one of the template's params ({})",
                            t.params.join(", ")
                        ),
                    },
                ));
            }
            bindings.insert(k.clone(), v.clone());
        }
        for (k, v) in table {
            if !t.params.contains(&k) {
                let mut allowed = vec!["use".to_string(), "name".into(), "input".into()];
                allowed.extend(t.params.iter().cloned());
                return Err(err(ModelErrorKind::UnknownKey {
                    key: k,
                    ty: format!("template {tname}"),
                    allowed: allowed.join(", "),
                }));
            }
            bindings.insert(k, v);
        }
        if let Some(missing) = t.params.iter().find(|p| !bindings.contains_key(*p)) {
            return Err(err(ModelErrorKind::BadValue {
                key: missing.clone(),
                message: format!("missing: template '{tname}' needs {}", t.params.join(", ")),
            }));
        }
        self.claim_name(&name, line, scope)?;
        let inner = Scope {
            prefix: format!("{name}."),
            input: inputs[0].clone(),
            bindings,
            instance_line: Some(scope.instance_line.unwrap_or(line)),
            depth: scope.depth + 1,
        };
        let last = self.expand(&t.layers, &inner)?;
        self.aliases.insert(name, last.clone());
        Ok(last)
    }
}

/// Reads the settings of a layer of type `ty`.
fn parse_op(ty: OpType, k: &mut Keys) -> Result<Op, ModelError> {
    Ok(match ty {
        OpType::Conv2d => {
            let out = k.units("out", None)?;
            let kernel = k.required_pair("kernel")?;
            let stride = k.pair("stride", [1, 1], 1)?;
            let dilation = k.pair("dilation", [1, 1], 1)?;
            let padding = match k.take("padding") {
                Some(Value::String(s)) if s == "same" => None,
                Some(v) => {
                    k.table.insert("padding".into(), v);
                    k.allowed.pop();
                    Some(k.pair("padding", [0, 0], 0)?)
                }
                None => Some([0, 0]),
            };
            let groups = k.units("groups", Some(Units::Fixed(1)))?;
            let bias = k.bool("bias", true)?;
            Op::Conv2d(Conv2d {
                out,
                kernel,
                stride,
                padding,
                dilation,
                groups,
                bias,
            })
        }
        OpType::BatchNorm => Op::BatchNorm(BatchNorm {
            momentum: k.float("momentum", 0.1, 0.0, 1.0)?,
            eps: k.float("eps", 1e-5, 1e-12, 1.0)?,
        }),
        OpType::Relu => Op::Relu,
        OpType::Relu6 => Op::Relu6,
        OpType::MaxPool | OpType::AvgPool => {
            let kernel = k.required_pair("kernel")?;
            let stride = k.pair("stride", kernel, 1)?;
            let padding = k.pair("padding", [0, 0], 0)?;
            let pool = Pool {
                kernel,
                stride,
                padding,
            };
            if ty == OpType::MaxPool {
                Op::MaxPool(pool)
            } else {
                Op::AvgPool(pool, k.bool("count_include_pad", true)?)
            }
        }
        OpType::GlobalAvgPool => Op::GlobalAvgPool,
        OpType::Linear => Op::Linear(Linear {
            out: k.units("out", None)?,
            bias: k.bool("bias", true)?,
        }),
        OpType::Dropout => {
            let p = k.float("p", 0.5, 0.0, 1.0)?;
            if p >= 1.0 {
                return Err(k.bad("p", "must be below 1 (dropout of every element)"));
            }
            Op::Dropout(p)
        }
        OpType::Add => Op::Add,
        OpType::Concat => Op::Concat,
        OpType::Flatten => Op::Flatten,
        OpType::SoftmaxCrossEntropy => Op::SoftmaxCrossEntropy(SoftmaxCrossEntropy {
            label_smoothing: k.float("label_smoothing", 0.0, 0.0, 1.0)?,
            weight: k.float("weight", 1.0, 0.0, 1e6)?,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A required key misspelt is named as the likely misspelling (it would otherwise only be
    /// reported as missing, the misspelt key never mentioned).
    #[test]
    fn a_misspelt_required_key_is_named() {
        let e = parse(
            r#"layers = [ { type = "conv2d", out = 4, kernal = 3 } ]"#,
            "t.toml",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("'kernel'") && e.contains("is 'kernal' it, misspelt?"),
            "{e}"
        );
        let e = parse(
            r#"layers = [ { type = "conv2d", out = 4 } ]"#,
            "t.toml",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("missing (required)") && !e.contains("misspelt"),
            "{e}"
        );
    }

    #[test]
    fn templates_expand_with_prefixed_names_and_inputs() {
        let text = r#"
name = "t"
layers = [
  { type = "conv2d", name = "stem", out = 4, kernel = 3, padding = 1 },
  { use = "block", name = "b1", out = 4 },
  { use = "block", name = "b2", out = "$x", x = 8 },
]
[template.block]
params = ["out"]
layers = [
  { type = "conv2d", name = "c", out = "$out * 2", kernel = 1 },
  { type = "relu" },
  { type = "add", inputs = ["c", "input"] },
]
"#;
        let e = parse(text, "t.toml", "t").unwrap_err();
        // b2 passes an unknown parameter 'x'.
        assert!(
            matches!(*e.kind, ModelErrorKind::UnknownKey { ref key, .. } if key == "x"),
            "{e}"
        );
        assert_eq!(e.line, Some(6));
        let text = text.replace(r#"out = "$x", x = 8"#, "out = 8");
        let spec = parse(&text, "t.toml", "t").unwrap();
        let names: Vec<&str> = spec.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names[0], "stem");
        assert_eq!(names[1], "b1.c");
        assert_eq!(spec.layers[1].inputs, vec!["stem"]);
        assert_eq!(spec.layers[3].inputs, vec!["b1.c", "stem"]);
        assert_eq!(spec.layers[4].inputs, vec![names[3]]);
        match &spec.layers[4].op {
            Op::Conv2d(c) => assert_eq!(c.out, Units::Fixed(16)),
            other => panic!("{other:?}"),
        }
    }
}
