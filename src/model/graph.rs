//! A model made concrete for one input: layers in topological order, every shape inferred and
//! checked, every count resolved. What the trainer, `model show`, `profile` and `simulate`
//! all work from.

use super::bounds::{MAX_DIM, MAX_ELEMENTS, MAX_LAYERS};
use super::error::{ModelError, ModelErrorKind};
use super::expr::ExprError;
use super::spec::{Conv2d, Layer, Linear, ModelSpec, Op, Pool, Units, INPUT};
use std::collections::{BTreeMap, HashMap};

/// The shape of one sample: channels x height x width (a vector of `n` is `n x 1 x 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Channels (or vector length).
    pub c: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
}

impl Shape {
    /// Elements per sample (a graph's shapes are checked at build to have at most
    /// [`MAX_ELEMENTS`], so this cannot overflow for them).
    pub fn numel(&self) -> usize {
        self.c * self.h * self.w
    }
    /// Spatial positions.
    pub fn pixels(&self) -> usize {
        self.h * self.w
    }
    /// A vector (no spatial extent).
    pub fn is_flat(&self) -> bool {
        self.h == 1 && self.w == 1
    }
}

impl std::fmt::Display for Shape {
    /// `CxHxW`, also for vectors (`120x1x1`): a 16x1x1 image and a vector of 16 are the same.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.c, self.h, self.w)
    }
}

/// A layer with everything resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The layer's name (`input` for node 0).
    pub name: String,
    /// What it computes (with `Units` resolved to `Fixed`).
    pub op: NodeOp,
    /// Indices of the nodes it reads.
    pub inputs: Vec<usize>,
    /// Output shape per sample.
    pub shape: Shape,
    /// Trainable parameters.
    pub params: usize,
    /// Multiply-accumulates per sample in forward (convolutions and linear layers; one per
    /// element for batch norm, as the simulator's FLOPs profiles count them).
    pub macs: u64,
    /// Where it was defined.
    pub origin: String,
}

/// A node's computation with every count known.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeOp {
    /// The network's input.
    Input,
    /// A layer of the model.
    Layer(Op),
}

impl Node {
    /// The layer's op (`None` for the input node).
    pub fn layer(&self) -> Option<&Op> {
        match &self.op {
            NodeOp::Input => None,
            NodeOp::Layer(op) => Some(op),
        }
    }
    /// The type name, as in model files (`input` for the input).
    pub fn type_name(&self) -> &'static str {
        self.layer().map_or("input", Op::type_name)
    }
}

/// The concrete model.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// Model name.
    pub name: String,
    /// Where its description came from.
    pub source: String,
    /// Classes of the dataset (the loss's width).
    pub classes: usize,
    /// Nodes in topological order; node 0 is the input.
    pub nodes: Vec<Node>,
    /// The loss nodes (softmax cross-entropy), the first one's input being the model's
    /// prediction.
    pub losses: Vec<usize>,
}

impl Graph {
    /// The input shape.
    pub fn input(&self) -> Shape {
        self.nodes[0].shape
    }
    /// The node holding the logits the model predicts with (the first loss's input).
    pub fn logits(&self) -> usize {
        self.nodes[self.losses[0]].inputs[0]
    }
    /// Total trainable parameters.
    pub fn num_params(&self) -> usize {
        self.nodes.iter().map(|n| n.params).sum()
    }
    /// Total forward multiply-accumulates per sample.
    pub fn macs(&self) -> u64 {
        self.nodes.iter().map(|n| n.macs).sum()
    }
    /// A fingerprint of the structure (names, ops, shapes): equal for the same model on the
    /// same input, used to check that a checkpoint or a peer has this model.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for n in &self.nodes {
            let s = format!("{}|{:?}|{:?}|{}", n.name, n.op, n.inputs, n.shape);
            for b in s.bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    /// Builds the graph of `spec` for samples of shape `input` (C, H, W) and `classes`
    /// classes: resolves names, orders the layers, infers and checks every shape. A model
    /// without a loss layer gets a softmax cross-entropy on its last layer.
    pub fn build(spec: &ModelSpec, input: [usize; 3], classes: usize) -> Result<Graph, ModelError> {
        if input.contains(&0) || classes == 0 {
            return Err(ModelError::file(
                &spec.source,
                None,
                ModelErrorKind::Shape(format!(
                    "the input {}x{}x{} with {classes} classes has a zero dimension",
                    input[0], input[1], input[2]
                )),
            ));
        }
        let at = Locator {
            source: &spec.source,
        };
        let whole = |kind| ModelError::file(&spec.source, None, kind);
        if spec.layers.len() as u64 > MAX_LAYERS {
            return Err(whole(ModelErrorKind::TooManyLayers {
                count: spec.layers.len() as u64,
                limit: MAX_LAYERS,
                chain: String::new(),
            }));
        }
        let input = Shape {
            c: input[0],
            h: input[1],
            w: input[2],
        };
        check_shape("input", input).map_err(whole)?;
        if classes as u64 > MAX_DIM {
            return Err(whole(ModelErrorKind::TooLarge {
                field: "classes".into(),
                value: classes.to_string(),
                limit: format!("at most {MAX_DIM}"),
            }));
        }
        let layers = with_default_loss(&spec.layers);
        let reads = resolve_reads(&layers, &at)?;
        let order = topo_order(&reads).map_err(|cycle| {
            let names: Vec<String> = cycle.iter().map(|&i| layers[i - 1].name.clone()).collect();
            at.layer(&layers[cycle[0] - 1], ModelErrorKind::Cycle(names))
        })?;
        let nodes = infer_nodes(&layers, &reads, &order, input, classes, &at)?;
        check_totals(&nodes).map_err(whole)?;
        let losses = losses_main_first(&nodes);
        check_every_output_is_read(&nodes, &losses, |i| &layers[order[i] - 1], &at)?;
        Ok(Graph {
            name: spec.name.clone(),
            source: spec.source.clone(),
            classes,
            nodes,
            losses,
        })
    }
}

/// Where a model's errors point: a layer's file and line, or the model's source.
struct Locator<'a> {
    /// The model's source (for layers without an origin).
    source: &'a str,
}

impl Locator<'_> {
    /// An error about layer `l`.
    fn layer(&self, l: &Layer, kind: ModelErrorKind) -> ModelError {
        let layer = Some(format!("'{}' ({})", l.name, l.op.type_name()));
        match &l.origin {
            Some(o) => ModelError::at(o, layer, kind),
            None => ModelError {
                file: self.source.to_string(),
                line: None,
                layer,
                kind: Box::new(kind),
            },
        }
    }

    /// Where node `l` was defined, for [`Node::origin`].
    fn origin(&self, l: &Layer) -> String {
        l.origin
            .as_ref()
            .map_or(self.source.to_string(), |o| o.to_string())
    }
}

/// The model's layers, with a softmax cross-entropy named `loss` on the last one when it has
/// no loss layer.
fn with_default_loss(spec_layers: &[Layer]) -> Vec<Layer> {
    let mut layers = spec_layers.to_vec();
    if !layers
        .iter()
        .any(|l| matches!(l.op, Op::SoftmaxCrossEntropy(_)))
    {
        let last = layers.last();
        let loss = Layer {
            name: "loss".into(),
            op: Op::SoftmaxCrossEntropy(Default::default()),
            inputs: vec![last.map(|l| l.name.clone()).unwrap_or_default()],
            // Where the layer it reads is written: an error about the loss (a logit count
            // that is not the class count) points there.
            origin: last.and_then(|l| l.origin.clone()),
        };
        layers.push(loss);
    }
    layers
}

/// What each layer reads, as indices (1-based: 0 is the input; entry 0 is the input's empty
/// list): every name defined once, every input defined and read once, every layer reading
/// something.
fn resolve_reads(layers: &[Layer], at: &Locator) -> Result<Vec<Vec<usize>>, ModelError> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    index.insert(INPUT, 0);
    for (i, l) in layers.iter().enumerate() {
        if index.insert(l.name.as_str(), i + 1).is_some() {
            return Err(at.layer(
                l,
                ModelErrorKind::DuplicateName {
                    name: l.name.clone(),
                    first_line: 0,
                },
            ));
        }
    }
    let mut reads: Vec<Vec<usize>> = vec![Vec::new()];
    // read_by[j] == i + 1: layer i reads j already (a `contains` per input was quadratic
    // in the inputs of a concat).
    let mut read_by = vec![0usize; layers.len() + 1];
    for (i, l) in layers.iter().enumerate() {
        let mut r = Vec::new();
        for name in &l.inputs {
            let Some(&j) = index.get(name.as_str()) else {
                return Err(at.layer(
                    l,
                    ModelErrorKind::MissingInput {
                        name: name.clone(),
                        hint: similar(name, &index),
                    },
                ));
            };
            if read_by[j] == i + 1 {
                return Err(at.layer(
                    l,
                    ModelErrorKind::Graph(format!(
                        "reads '{name}' twice; read it once (add(x, x) is scale(x, 2))"
                    )),
                ));
            }
            read_by[j] = i + 1;
            r.push(j);
        }
        if r.is_empty() {
            return Err(at.layer(l, ModelErrorKind::Graph("reads nothing".into())));
        }
        reads.push(r);
    }
    Ok(reads)
}

/// The nodes in topological `order` (indices into `reads`, the input first), each layer's
/// shape, parameters and MACs inferred from its inputs'.
fn infer_nodes(
    layers: &[Layer],
    reads: &[Vec<usize>],
    order: &[usize],
    input: Shape,
    classes: usize,
    at: &Locator,
) -> Result<Vec<Node>, ModelError> {
    let mut pos = vec![0; reads.len()];
    for (p, &i) in order.iter().enumerate() {
        pos[i] = p;
    }
    let mut nodes: Vec<Node> = Vec::with_capacity(order.len());
    nodes.push(Node {
        name: INPUT.into(),
        op: NodeOp::Input,
        inputs: Vec::new(),
        shape: input,
        params: 0,
        macs: 0,
        origin: at.source.to_string(),
    });
    for &i in &order[1..] {
        let l = &layers[i - 1];
        let ins: Vec<usize> = reads[i].iter().map(|&j| pos[j]).collect();
        let shapes: Vec<(String, Shape)> = ins
            .iter()
            .map(|&j| (nodes[j].name.clone(), nodes[j].shape))
            .collect();
        let (op, shape, params, macs) =
            infer(&l.op, &shapes, classes).map_err(|kind| at.layer(l, kind))?;
        nodes.push(Node {
            name: l.name.clone(),
            op: NodeOp::Layer(op),
            inputs: ins,
            shape,
            params,
            macs,
            origin: at.origin(l),
        });
    }
    Ok(nodes)
}

/// The loss nodes, the main head first: the prediction is the input of the loss with the
/// largest weight (auxiliary heads have smaller ones).
fn losses_main_first(nodes: &[Node]) -> Vec<usize> {
    let weight = |i: usize| match nodes[i].layer() {
        Some(Op::SoftmaxCrossEntropy(l)) => Some(l.weight),
        _ => None,
    };
    let mut losses: Vec<usize> = (0..nodes.len()).filter(|&i| weight(i).is_some()).collect();
    losses.sort_by(|&a, &b| {
        weight(b)
            .partial_cmp(&weight(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    losses
}

/// Every output is used: by a later layer, or it is a loss (which nothing reads). `layer(i)`
/// is node `i`'s layer.
fn check_every_output_is_read<'a>(
    nodes: &[Node],
    losses: &[usize],
    layer: impl Fn(usize) -> &'a Layer,
    at: &Locator,
) -> Result<(), ModelError> {
    let mut used = vec![false; nodes.len()];
    for n in nodes {
        for &j in &n.inputs {
            used[j] = true;
        }
    }
    let mut is_loss = vec![false; nodes.len()];
    for &i in losses {
        is_loss[i] = true;
    }
    for (i, n) in nodes.iter().enumerate().skip(1) {
        if !used[i] && !is_loss[i] {
            return Err(at.layer(
                layer(i),
                ModelErrorKind::Graph(
                    "its output is used by no layer (only loss layers may end the network)".into(),
                ),
            ));
        }
        if is_loss[i] && used[i] {
            return Err(at.layer(
                layer(i),
                ModelErrorKind::Graph(format!(
                    "a loss ends the network, but '{}' reads it",
                    n.name
                )),
            ));
        }
    }
    Ok(())
}

/// A defined name close to `name` ("did you mean"), or empty.
fn similar(name: &str, index: &HashMap<&str, usize>) -> String {
    super::suggest::closest(name, index.keys().copied())
        .map(|k| format!(" (did you mean '{k}'?)"))
        .unwrap_or_default()
}

/// Kahn's algorithm, taking the lowest-numbered ready layer first (so a file in a valid order
/// keeps its order); returns the cycle's layers (indices into `reads`) on failure.
fn topo_order(reads: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    let n = reads.len();
    let mut indeg = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, r) in reads.iter().enumerate() {
        indeg[i] = r.len();
        for &j in r {
            users[j].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Walk back along unfinished reads from an unfinished layer until one repeats.
    let mut at = (0..n)
        .find(|&i| indeg[i] > 0)
        .expect("some layer is unfinished");
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    while seen[at] == usize::MAX {
        seen[at] = path.len();
        path.push(at);
        at = *reads[at]
            .iter()
            .find(|&&j| indeg[j] > 0)
            .expect("an unfinished layer reads one");
    }
    let mut cycle = path[seen[at]..].to_vec();
    cycle.reverse();
    cycle.push(cycle[0]);
    Err(cycle)
}

fn resolve(u: &Units, key: &str, channels: usize, classes: usize) -> Result<usize, ModelErrorKind> {
    match u {
        Units::Fixed(n) => Ok(*n),
        Units::Expr(e) => {
            let vars: BTreeMap<String, i64> = [
                ("channels".to_string(), channels as i64),
                ("classes".to_string(), classes as i64),
            ]
            .into();
            let v = e.eval(&vars).map_err(|m| match m {
                ExprError::Overflow { .. } => too_large(key, e.to_string(), m.to_string()),
                _ => ModelErrorKind::Shape(format!("'{key}' = {e}: {m}")),
            })?;
            if v < 1 {
                return Err(ModelErrorKind::Shape(format!(
                    "'{key}' = {e} is {v} for {channels} input channels; it must be at least 1"
                )));
            }
            match usize::try_from(v) {
                Ok(n) if v as u64 <= MAX_DIM => Ok(n),
                _ => Err(too_large(
                    key,
                    format!("{e} = {v}"),
                    format!("at most {MAX_DIM}"),
                )),
            }
        }
    }
}

/// A size past the bounds of `model::bounds`.
fn too_large(field: &str, value: String, limit: String) -> ModelErrorKind {
    ModelErrorKind::TooLarge {
        field: field.into(),
        value,
        limit,
    }
}

/// `factors` multiplied, at most `limit`, or the error naming `field` and the product.
fn product(field: &str, factors: &[u64], limit: u64) -> Result<u64, ModelErrorKind> {
    let p = factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f));
    match p {
        Some(p) if p <= limit => Ok(p),
        _ => {
            let shown: Vec<String> = factors.iter().map(u64::to_string).collect();
            Err(too_large(
                field,
                shown.join(" x "),
                format!("at most {limit} (model::bounds)"),
            ))
        }
    }
}

/// A shape within the bounds: each dimension at most [`MAX_DIM`], at most [`MAX_ELEMENTS`]
/// elements, so every later product of it (times a batch) stays in range.
fn check_shape(field: &str, s: Shape) -> Result<(), ModelErrorKind> {
    if [s.c, s.h, s.w].iter().any(|&d| d as u64 > MAX_DIM) {
        return Err(too_large(
            field,
            s.to_string(),
            format!("each dimension is at most {MAX_DIM}"),
        ));
    }
    product(field, &[s.c as u64, s.h as u64, s.w as u64], MAX_ELEMENTS).map(|_| ())
}

/// The model's totals in range: parameters at most [`MAX_ELEMENTS`], MACs in a `u64`.
fn check_totals(nodes: &[Node]) -> Result<(), ModelErrorKind> {
    let params = nodes
        .iter()
        .try_fold(0u64, |sum, n| sum.checked_add(n.params as u64));
    match params {
        Some(p) if p <= MAX_ELEMENTS => {}
        _ => {
            return Err(too_large(
                "parameters",
                "the model's total".into(),
                format!("at most {MAX_ELEMENTS}"),
            ))
        }
    }
    let macs = nodes
        .iter()
        .try_fold(0u64, |sum, n| sum.checked_add(n.macs));
    macs.map(|_| ()).ok_or_else(|| {
        too_large(
            "MACs",
            "the model's total".into(),
            "what a 64-bit count holds".into(),
        )
    })
}

/// Output size of a sliding window, or why it does not fit (each argument is at most
/// [`MAX_DIM`], or a "same" padding derived from two such; checked all the same).
fn window(len: usize, k: usize, s: usize, p: usize, d: usize, axis: &str) -> Result<usize, String> {
    let overflow =
        || format!("a window of {k} (dilation {d}, padding {p}) along the {axis} overflows");
    let span = k
        .checked_sub(1)
        .and_then(|k1| d.checked_mul(k1))
        .and_then(|x| x.checked_add(1))
        .ok_or_else(overflow)?;
    let padded = p
        .checked_mul(2)
        .and_then(|p2| len.checked_add(p2))
        .ok_or_else(overflow)?;
    if padded < span {
        return Err(format!(
            "a window of {k} (dilation {d}, padding {p}) does not fit the input's {axis} of {len}"
        ));
    }
    Ok((padded - span) / s + 1)
}

type Inferred = (Op, Shape, usize, u64);

/// The output shape, parameter count and MACs of `op` on inputs of `shapes`, with `Units`
/// resolved, or a message naming the shapes that do not fit: a dispatch to each type's rule.
fn infer(op: &Op, shapes: &[(String, Shape)], classes: usize) -> Result<Inferred, ModelErrorKind> {
    let inferred = infer_unchecked(op, shapes, classes)?;
    check_shape("output", inferred.1)?;
    Ok(inferred)
}

/// [`infer`] before the output's bounds are checked.
fn infer_unchecked(
    op: &Op,
    shapes: &[(String, Shape)],
    classes: usize,
) -> Result<Inferred, ModelErrorKind> {
    let input = Input {
        name: &shapes[0].0,
        shape: shapes[0].1,
    };
    let x = input.shape;
    if !matches!(op, Op::Add | Op::Concat) && shapes.len() != 1 {
        return Err(ModelErrorKind::Shape(format!(
            "{} takes one input, got {}",
            op.type_name(),
            shapes.len()
        )));
    }
    Ok(match op {
        Op::Conv2d(c) => infer_conv(c, input, classes)?,
        Op::BatchNorm(_) => (op.clone(), x, 2 * x.c, x.numel() as u64),
        Op::Relu | Op::Relu6 | Op::Dropout(_) => (op.clone(), x, 0, 0),
        Op::MaxPool(p) | Op::AvgPool(p, _) => {
            let shape = pool_shape(p, matches!(op, Op::MaxPool(_)), input)?;
            (op.clone(), shape, 0, 0)
        }
        Op::GlobalAvgPool => (op.clone(), Shape { c: x.c, h: 1, w: 1 }, 0, 0),
        Op::Flatten => {
            let flat = Shape {
                c: product(
                    "output",
                    &[x.c as u64, x.h as u64, x.w as u64],
                    MAX_ELEMENTS,
                )? as usize,
                h: 1,
                w: 1,
            };
            (op.clone(), flat, 0, 0)
        }
        Op::Linear(l) => infer_linear(l, input, classes)?,
        Op::Add => (op.clone(), add_shape(shapes)?, 0, 0),
        Op::Concat => (op.clone(), concat_shape(shapes)?, 0, 0),
        Op::SoftmaxCrossEntropy(_) => {
            if !x.is_flat() || x.c != classes {
                return Err(ModelErrorKind::Shape(format!(
                    "the loss needs one logit per class ({classes}), but '{}' gives {x}",
                    input.name
                )));
            }
            (op.clone(), Shape { c: 1, h: 1, w: 1 }, 0, 0)
        }
    })
}

/// A layer's (first) input: the name messages give it, and its shape.
#[derive(Clone, Copy)]
struct Input<'a> {
    name: &'a str,
    shape: Shape,
}

impl Input<'_> {
    /// The output size of a sliding window along `axis` of this input (`len` long).
    fn window(
        &self,
        len: usize,
        k: usize,
        s: usize,
        p: usize,
        d: usize,
        axis: &str,
    ) -> Result<usize, String> {
        window(len, k, s, p, d, axis)
            .map_err(|m| format!("{m} ('{}' is {})", self.name, self.shape))
    }
}

/// A convolution's padding: as given, or for "same" the padding that keeps the size.
fn conv_padding(c: &Conv2d) -> Result<[usize; 2], String> {
    match c.padding {
        Some(p) => Ok(p),
        None => {
            if c.stride != [1, 1] || c.kernel.iter().any(|k| k % 2 == 0) {
                return Err("padding = \"same\" needs stride 1 and odd kernel sizes".into());
            }
            Ok([
                c.dilation[0] * (c.kernel[0] - 1) / 2,
                c.dilation[1] * (c.kernel[1] - 1) / 2,
            ])
        }
    }
}

/// A convolution's rule: channels and groups resolved and checked, padding resolved.
fn infer_conv(c: &Conv2d, input: Input, classes: usize) -> Result<Inferred, ModelErrorKind> {
    let x = input.shape;
    let out = resolve(&c.out, "out", x.c, classes)?;
    let groups = resolve(&c.groups, "groups", x.c, classes)?;
    if !x.c.is_multiple_of(groups) || !out.is_multiple_of(groups) {
        return Err(ModelErrorKind::Shape(format!("groups = {groups} must divide the input channels ({}, from '{}' of {x}) and the output channels ({out})", x.c, input.name)));
    }
    let padding = conv_padding(c)?;
    let oh = input.window(
        x.h,
        c.kernel[0],
        c.stride[0],
        padding[0],
        c.dilation[0],
        "height",
    )?;
    let ow = input.window(
        x.w,
        c.kernel[1],
        c.stride[1],
        padding[1],
        c.dilation[1],
        "width",
    )?;
    let (k, cin) = (c.kernel.map(|k| k as u64), (x.c / groups) as u64);
    let per_out = product("kernel", &[k[0], k[1], cin], MAX_ELEMENTS)?;
    let weights = product("params", &[out as u64, per_out], MAX_ELEMENTS)?;
    let params = (weights + if c.bias { out as u64 } else { 0 }) as usize;
    let resolved = Conv2d {
        out: Units::Fixed(out),
        groups: Units::Fixed(groups),
        padding: Some(padding),
        ..c.clone()
    };
    let shape = Shape {
        c: out,
        h: oh,
        w: ow,
    };
    let macs = product("MACs", &[weights, oh as u64, ow as u64], u64::MAX)?;
    Ok((Op::Conv2d(resolved), shape, params, macs))
}

/// Most elements of a max_pool window: the position of each output's maximum in its window
/// is kept in a `u8` for backward (`backend::cpu::pool`).
pub const MAX_POOL_WINDOW: usize = 255;

/// A pooling window's output shape (`max` for max pooling, whose window positions are
/// stored in a byte).
fn pool_shape(p: &Pool, max: bool, input: Input) -> Result<Shape, String> {
    if 2 * p.padding[0] > p.kernel[0] || 2 * p.padding[1] > p.kernel[1] {
        return Err(format!(
            "padding {:?} must be at most half the window {:?} (as in PyTorch)",
            p.padding, p.kernel
        ));
    }
    let x = input.shape;
    let oh = input.window(x.h, p.kernel[0], p.stride[0], p.padding[0], 1, "height")?;
    let ow = input.window(x.w, p.kernel[1], p.stride[1], p.padding[1], 1, "width")?;
    if max && p.kernel[0] * p.kernel[1] > MAX_POOL_WINDOW {
        return Err(format!(
            "max_pool windows are at most {MAX_POOL_WINDOW} elements (each maximum's position \
             in its window is kept in a byte for backward), got {}x{}: pool in two steps (a \
             16x16 window of stride 16 is two max_pools of kernel 4)",
            p.kernel[0], p.kernel[1]
        ));
    }
    Ok(Shape {
        c: x.c,
        h: oh,
        w: ow,
    })
}

/// A linear layer's rule: a flat input, the output count resolved.
fn infer_linear(l: &Linear, input: Input, classes: usize) -> Result<Inferred, ModelErrorKind> {
    let x = input.shape;
    if !x.is_flat() {
        return Err(ModelErrorKind::Shape(format!("linear needs a flat input, but '{}' is {x}: put a flatten (or global_avg_pool) before it", input.name)));
    }
    let out = resolve(&l.out, "out", x.c, classes)?;
    let weights = product("params", &[out as u64, x.c as u64], MAX_ELEMENTS)?;
    let params = (weights + if l.bias { out as u64 } else { 0 }) as usize;
    let resolved = Linear {
        out: Units::Fixed(out),
        ..l.clone()
    };
    let shape = Shape { c: out, h: 1, w: 1 };
    Ok((Op::Linear(resolved), shape, params, weights))
}

/// A sum's shape: two or more inputs of one shape.
fn add_shape(shapes: &[(String, Shape)]) -> Result<Shape, String> {
    if shapes.len() < 2 {
        return Err(format!(
            "add needs at least two inputs, got {}",
            shapes.len()
        ));
    }
    let (first, x) = (&shapes[0].0, shapes[0].1);
    if let Some((n, s)) = shapes.iter().find(|(_, s)| *s != x) {
        return Err(format!(
            "add needs inputs of one shape, but '{first}' is {x} and '{n}' is {s}"
        ));
    }
    Ok(x)
}

/// A concatenation's shape: two or more inputs of one height and width, channels added.
fn concat_shape(shapes: &[(String, Shape)]) -> Result<Shape, String> {
    if shapes.len() < 2 {
        return Err(format!(
            "concat needs at least two inputs, got {}",
            shapes.len()
        ));
    }
    let (first, x) = (&shapes[0].0, shapes[0].1);
    if let Some((n, s)) = shapes.iter().find(|(_, s)| (s.h, s.w) != (x.h, x.w)) {
        return Err(format!("concat joins channels of inputs of one height and width, but '{first}' is {x} and '{n}' is {s}"));
    }
    // Each input is within the bounds, and there are at most MAX_LAYERS of them: the sum
    // fits (the output's bounds are checked by `infer`).
    let c = shapes.iter().map(|(_, s)| s.c).sum();
    Ok(Shape { c, h: x.h, w: x.w })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::file::parse;

    fn build(text: &str) -> Result<Graph, ModelError> {
        Graph::build(&parse(text, "m.toml", "m").unwrap(), [1, 8, 8], 10)
    }

    #[test]
    fn infers_shapes_and_orders_forward_references() {
        let g = build(
            r#"layers = [
  { type = "conv2d", name = "a", out = 4, kernel = 3, padding = 1 },
  { type = "add", name = "sum", inputs = ["a", "b"] },
  { type = "conv2d", name = "b", input = "a", out = 4, kernel = 1 },
  { type = "global_avg_pool", input = "sum" },
  { type = "linear", name = "fc", out = "classes" },
]"#,
        )
        .unwrap();
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(&names[..4], &["input", "a", "b", "sum"]);
        assert_eq!(g.nodes[3].shape, Shape { c: 4, h: 8, w: 8 });
        assert_eq!(g.num_params(), (4 * 9 + 4) + (4 * 4 + 4) + (10 * 4 + 10));
    }

    #[test]
    fn errors_name_line_layer_and_shapes() {
        let e = build(
            r#"layers = [
  { type = "conv2d", name = "a", out = 4, kernel = 3 },
  { type = "add", inputs = ["a", "input"] },
]"#,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("m.toml:3: layer"), "{msg}");
        assert!(msg.contains("4x6x6") && msg.contains("1x8x8"), "{msg}");
        let e = build(
            r#"layers = [
  { type = "relu", name = "a", input = "b" },
  { type = "relu", name = "b", input = "a" },
  { type = "linear", out = 10, input = "a" },
]"#,
        )
        .unwrap_err();
        assert!(matches!(*e.kind, ModelErrorKind::Cycle(_)), "{e}");
        assert!(
            e.to_string().contains("a -> b -> a") || e.to_string().contains("b -> a -> b"),
            "{e}"
        );
        let e = build(r#"layers = [ { type = "relu", input = "nope" } ]"#).unwrap_err();
        assert!(
            matches!(*e.kind, ModelErrorKind::MissingInput { .. }),
            "{e}"
        );
    }

    /// A max_pool window past 255 elements is refused saying how to pool the same area; one
    /// that does not fit the input says that first.
    #[test]
    fn max_pool_windows_past_a_byte_are_refused_with_the_two_step_remedy() {
        let pool = |k: usize, side: usize| {
            let text = format!(
                r#"layers = [ {{ type = "max_pool", kernel = {k} }}, {{ type = "flatten" }},
  {{ type = "linear", out = "classes" }} ]"#
            );
            Graph::build(&parse(&text, "m.toml", "m").unwrap(), [1, side, side], 10)
                .map_err(|e| e.to_string())
        };
        let e = pool(16, 32).unwrap_err();
        assert!(
            e.contains("at most 255 elements")
                && e.contains("got 16x16")
                && e.contains("two steps"),
            "{e}"
        );
        let e = pool(64, 26).unwrap_err();
        assert!(e.contains("does not fit") && !e.contains("255"), "{e}");
        assert!(pool(8, 8).is_ok());
    }
}
