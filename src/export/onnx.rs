//! A net as an ONNX inference graph (`dptrain export`).
//!
//! What the graph is:
//! - opset [`OPSET`] (17), IR version 8; one input [`INPUT_NAME`], float `[N, C, H, W]`
//!   (NCHW, the loader's layout, normalised as in training: the normalisation is not in the
//!   graph, it is written in the model's metadata when the caller gives it), and one output
//!   [`OUTPUT_NAME`], float `[N, classes]`; `N` is the symbolic dimension [`BATCH_DIM`], so any
//!   batch size runs;
//! - the logits of the main head: the loss layers are not exported (a consumer applies softmax
//!   if it wants probabilities), nor is anything only they read (auxiliary heads);
//! - batch norm as `BatchNormalization` with the running statistics (inference form), not
//!   folded into the convolution before it: the graph keeps one node per layer with the layers'
//!   names and PyTorch's parameter names, and serving runtimes fold it themselves (onnxruntime's
//!   basic graph optimisations do);
//! - dropout removed (it is the identity in evaluation); a ReLU fused into the layer before it
//!   in dptrain's net is its own `Relu` node; `relu6` is `Clip(0, 6)`; `linear` is `Gemm` with
//!   PyTorch's `[out, in]` weight; `global_avg_pool` is `GlobalAveragePool` + `Flatten`
//!   (PyTorch's `adaptive_avg_pool2d(x, 1)` + `flatten`).
//!
//! Every layer type of `docs/MODEL_FILES.md` has an ONNX form: the mapping is one exhaustive
//! match over [`Op`], so a new layer type does not compile until it has one. What ONNX cannot
//! hold is a model whose weights pass protobuf's 2 GiB message limit (ONNX's external-data
//! files, which this exporter does not write, exist for those): [`ExportError::TooLarge`],
//! checked before anything is built.

use crate::model::{Conv2d, Graph, Op, Pool};
use crate::nn::{Net, ParamBlock};
use crate::output::{self, OutputError};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_proto::DataType;
use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
use onnx_protobuf::{
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use protobuf::{Message, MessageField};
use std::collections::HashMap;
use std::path::Path;

/// The ONNX operator set the graph uses.
pub const OPSET: i64 = 17;
/// The ONNX IR version written (the one that goes with opset 17).
const IR_VERSION: i64 = 8;
/// The graph's input: normalised images, `[N, C, H, W]`.
pub const INPUT_NAME: &str = "input";
/// The graph's output: the main head's logits, `[N, classes]`.
pub const OUTPUT_NAME: &str = "logits";
/// The symbolic batch dimension of the input and the output.
pub const BATCH_DIM: &str = "N";
/// Protobuf's limit on one message's encoded size, and so on one ONNX file's.
const MAX_MODEL_BYTES: u64 = i32::MAX as u64;

/// Why a net cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The weights do not fit in one protobuf message.
    #[error(
        "model '{model}' has {bytes} bytes of weights, but one ONNX file holds at most {limit} \
         bytes (protobuf's 2 GiB message limit); larger models need ONNX's external-data \
         files, which dptrain does not write"
    )]
    TooLarge {
        /// The model's name.
        model: String,
        /// Bytes of parameters and statistics.
        bytes: u64,
        /// The most one file holds.
        limit: u64,
    },
    /// A layer has no form in the inference graph.
    #[error("layer '{layer}' ({op}) cannot be exported to ONNX: {reason}")]
    Unsupported {
        /// The layer's name.
        layer: String,
        /// Its type, as in model files.
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// Protobuf could not encode the model.
    #[error("encoding the ONNX model: {0}")]
    Encode(String),
    /// The output file could not be written.
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// The ONNX model of `net` (see the module comment), with `metadata` (key, value) pairs in
/// the model's `metadata_props` (class names, normalisation: what a consumer needs to feed
/// and read the graph).
pub fn to_onnx(net: &Net, metadata: &[(String, String)]) -> Result<ModelProto, ExportError> {
    to_onnx_within(net, metadata, MAX_MODEL_BYTES)
}

/// Writes [`to_onnx`]'s model to `path` atomically (through [`crate::output`]): the path is
/// checked before the model is built, and nothing is left under it on a failure.
pub fn write_onnx(
    net: &Net,
    metadata: &[(String, String)],
    path: &Path,
) -> Result<(), ExportError> {
    output::check_replaceable(path, &ONNX_FILE)?;
    let model = to_onnx(net, metadata)?;
    let bytes = model
        .write_to_bytes()
        .map_err(|e| ExportError::Encode(e.to_string()))?;
    output::write_atomically(path, &bytes, &ONNX_FILE)?;
    Ok(())
}

/// An ONNX model dptrain exported: its `producer_name` (field 2 of `ModelProto`, which
/// protobuf writes in the schema's order: after `ir_version` and the small `opset_import`)
/// is `dptrain`.
pub const ONNX_FILE: output::Kind = output::Kind {
    what: "an ONNX model dptrain exported",
    head: 1024,
    is_one: |head| producer_of(head) == Some(b"dptrain".as_slice()),
};

/// The `producer_name` of an ONNX model from its first bytes, skipping the fields before it
/// (varints and length-delimited ones); `None` if the head ends first or is not protobuf.
fn producer_of(mut head: &[u8]) -> Option<&[u8]> {
    // A varint's value and the bytes after it.
    fn varint(b: &[u8]) -> Option<(u64, &[u8])> {
        let mut v = 0u64;
        for (i, &byte) in b.iter().enumerate().take(10) {
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some((v, &b[i + 1..]));
            }
        }
        None
    }
    loop {
        let (tag, rest) = varint(head)?;
        match (tag >> 3, tag & 7) {
            (field, 2) => {
                let (len, rest) = varint(rest)?;
                let (value, rest) = rest.split_at_checked(usize::try_from(len).ok()?)?;
                if field == 2 {
                    return Some(value);
                }
                head = rest;
            }
            (_, 0) => head = varint(rest)?.1,
            _ => return None,
        }
    }
}

/// [`to_onnx`] for files of at most `limit` bytes of weights.
fn to_onnx_within(
    net: &Net,
    metadata: &[(String, String)],
    limit: u64,
) -> Result<ModelProto, ExportError> {
    let g = net.graph();
    let bytes = 4 * (net.params().len() + net.state().len()) as u64;
    if bytes > limit {
        return Err(ExportError::TooLarge {
            model: g.name.clone(),
            bytes,
            limit,
        });
    }
    let mut b = Builder::new(net);
    b.values[0] = Some(Value {
        name: INPUT_NAME.into(),
        rank: 4,
    });
    let need = needed_nodes(g);
    for i in (1..g.nodes.len()).filter(|&i| need[i]) {
        let v = b.layer(i)?;
        b.values[i] = Some(v);
    }
    let logits = b.values[g.logits()].clone().expect("the logits are needed");
    let logits = b.with_rank(logits, 2);
    b.node(
        "Identity",
        OUTPUT_NAME,
        &[&logits.name],
        OUTPUT_NAME,
        vec![],
    );
    Ok(b.finish(metadata))
}

/// Which nodes the main head's logits depend on (the rest, auxiliary heads and the losses,
/// are not exported).
fn needed_nodes(g: &Graph) -> Vec<bool> {
    let mut need = vec![false; g.nodes.len()];
    need[g.logits()] = true;
    for i in (0..g.nodes.len()).rev() {
        if need[i] {
            for &j in &g.nodes[i].inputs {
                need[j] = true;
            }
        }
    }
    need
}

/// A value of the ONNX graph: its name and rank (4: `N x C x H x W`; 2: `N x C`, a flat
/// value).
#[derive(Debug, Clone)]
struct Value {
    name: String,
    rank: usize,
}

/// The graph under construction.
struct Builder<'a> {
    net: &'a Net,
    /// Graph node -> its parameter block.
    blocks: Vec<Option<&'a ParamBlock>>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    /// Graph node -> its value in the ONNX graph (`None` until exported).
    values: Vec<Option<Value>>,
    /// (value, rank) -> the value reshaped to that rank, made once.
    reshaped: HashMap<(String, usize), Value>,
    /// Scalar constants made once, by name.
    constants: Vec<String>,
}

impl<'a> Builder<'a> {
    fn new(net: &'a Net) -> Self {
        let g = net.graph();
        let mut blocks = vec![None; g.nodes.len()];
        for b in net.blocks() {
            blocks[b.node] = Some(b);
        }
        Self {
            net,
            blocks,
            nodes: Vec::new(),
            initializers: Vec::new(),
            values: vec![None; g.nodes.len()],
            reshaped: HashMap::new(),
            constants: Vec::new(),
        }
    }

    /// The value of graph node `i`: one arm per layer type.
    fn layer(&mut self, i: usize) -> Result<Value, ExportError> {
        let g = self.net.graph();
        let node = &g.nodes[i];
        let name = node.name.as_str();
        let op = node
            .layer()
            .expect("node 0 is the input; layers start at 1");
        let inputs: Vec<Value> = node
            .inputs
            .iter()
            .map(|&j| self.values[j].clone().expect("inputs come first"))
            .collect();
        let x = inputs[0].clone();
        Ok(match op {
            Op::Conv2d(c) => {
                let x = self.with_rank(x, 4);
                self.conv(i, c, &x)
            }
            Op::BatchNorm(bn) => {
                let ins = [
                    x.name.clone(),
                    self.tensor(i, "weight", false),
                    self.tensor(i, "bias", false),
                    self.tensor(i, "running_mean", true),
                    self.tensor(i, "running_var", true),
                ];
                let attrs = vec![
                    attr_float("epsilon", bn.eps),
                    // ONNX's momentum weighs the old statistics, PyTorch's the batch's.
                    attr_float("momentum", 1.0 - bn.momentum),
                ];
                self.op("BatchNormalization", name, &ins, x.rank, attrs)
            }
            Op::Relu => self.op("Relu", name, &[x.name], x.rank, vec![]),
            Op::Relu6 => {
                let lo = self.scalar("relu6.min", 0.0);
                let hi = self.scalar("relu6.max", 6.0);
                self.op("Clip", name, &[x.name, lo, hi], x.rank, vec![])
            }
            Op::MaxPool(p) => {
                let x = self.with_rank(x, 4);
                self.op("MaxPool", name, &[x.name], 4, pool_attrs(p))
            }
            Op::AvgPool(p, include_pad) => {
                let x = self.with_rank(x, 4);
                let mut attrs = pool_attrs(p);
                attrs.push(attr_int("count_include_pad", *include_pad as i64));
                self.op("AveragePool", name, &[x.name], 4, attrs)
            }
            Op::GlobalAvgPool => {
                let x = self.with_rank(x, 4);
                let pooled = format!("{name}/pool");
                self.node("GlobalAveragePool", &pooled, &[&x.name], &pooled, vec![]);
                self.op("Flatten", name, &[pooled], 2, vec![attr_int("axis", 1)])
            }
            Op::Linear(l) => {
                let x = self.with_rank(x, 2);
                let mut ins = vec![x.name, self.tensor(i, "weight", false)];
                if l.bias {
                    ins.push(self.tensor(i, "bias", false));
                }
                self.op("Gemm", name, &ins, 2, vec![attr_int("transB", 1)])
            }
            // The identity in evaluation: readers read its input.
            Op::Dropout(_) => x,
            Op::Add | Op::Concat => {
                let rank = inputs.iter().map(|v| v.rank).min().expect("two inputs");
                let names: Vec<String> = inputs
                    .into_iter()
                    .map(|v| self.with_rank(v, rank).name)
                    .collect();
                match op {
                    Op::Add => self.op("Sum", name, &names, rank, vec![]),
                    _ => self.op("Concat", name, &names, rank, vec![attr_int("axis", 1)]),
                }
            }
            Op::Flatten => self.op("Flatten", name, &[x.name], 2, vec![attr_int("axis", 1)]),
            Op::SoftmaxCrossEntropy(_) => {
                return Err(ExportError::Unsupported {
                    layer: name.into(),
                    op: op.type_name(),
                    reason: "a loss whose output the prediction reads has no inference form".into(),
                })
            }
        })
    }

    /// A convolution node (PyTorch's `[out, in/groups, kh, kw]` weight).
    fn conv(&mut self, i: usize, c: &Conv2d, x: &Value) -> Value {
        let p = c.padding.expect("padding resolved by Graph::build");
        let groups = match &c.groups {
            crate::model::Units::Fixed(v) => *v as i64,
            crate::model::Units::Expr(e) => unreachable!("units resolved by Graph::build: {e}"),
        };
        let mut ins = vec![x.name.clone(), self.tensor(i, "weight", false)];
        if c.bias {
            ins.push(self.tensor(i, "bias", false));
        }
        let attrs = vec![
            attr_ints("kernel_shape", &c.kernel),
            attr_ints("strides", &c.stride),
            attr_ints("pads", &[p[0], p[1], p[0], p[1]]),
            attr_ints("dilations", &c.dilation),
            attr_int("group", groups),
        ];
        let name = self.net.graph().nodes[i].name.clone();
        self.op("Conv", &name, &ins, 4, attrs)
    }

    /// A node `op_type` named `name` writing the value `name` of rank `rank`.
    fn op(
        &mut self,
        op_type: &str,
        name: &str,
        inputs: &[String],
        rank: usize,
        attrs: Vec<AttributeProto>,
    ) -> Value {
        let ins: Vec<&str> = inputs.iter().map(String::as_str).collect();
        // A layer may be named like the graph's output, which the last node writes.
        let value = match name {
            OUTPUT_NAME => format!("{name}/layer"),
            _ => name.to_string(),
        };
        self.node(op_type, name, &ins, &value, attrs);
        Value { name: value, rank }
    }

    fn node(
        &mut self,
        op_type: &str,
        name: &str,
        inputs: &[&str],
        output: &str,
        attrs: Vec<AttributeProto>,
    ) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: name.into(),
            op_type: op_type.into(),
            attribute: attrs,
            ..Default::default()
        });
    }

    /// `v` with rank `rank`: itself, or (made once) its `Flatten` to `N x C` or its
    /// `Unsqueeze` to `N x C x 1 x 1` (only flat values change rank: a linear layer's input, a
    /// convolution on a vector, a sum of a vector and a 1x1 map).
    fn with_rank(&mut self, v: Value, rank: usize) -> Value {
        if v.rank == rank {
            return v;
        }
        let key = (v.name.clone(), rank);
        if let Some(r) = self.reshaped.get(&key) {
            return r.clone();
        }
        let out = format!("{}/rank{rank}", v.name);
        if rank == 2 {
            self.node("Flatten", &out, &[&v.name], &out, vec![attr_int("axis", 1)]);
        } else {
            let axes = "unsqueeze.axes".to_string();
            if !self.constants.contains(&axes) {
                self.initializers.push(tensor_i64(&axes, &[2, 3]));
                self.constants.push(axes.clone());
            }
            self.node("Unsqueeze", &out, &[&v.name, &axes], &out, vec![]);
        }
        let r = Value { name: out, rank };
        self.reshaped.insert(key, r.clone());
        r
    }

    /// The name of a float scalar initializer of `value`, made once.
    fn scalar(&mut self, name: &str, value: f32) -> String {
        if !self.constants.iter().any(|c| c == name) {
            self.initializers.push(tensor_f32(name, &[], &[value]));
            self.constants.push(name.into());
        }
        name.into()
    }

    /// Node `i`'s parameter (or, with `state`, state) tensor `suffix` as an initializer in
    /// PyTorch's layout, named as in PyTorch's `state_dict` (`LAYER.SUFFIX`); its name.
    fn tensor(&mut self, i: usize, suffix: &str, state: bool) -> String {
        let block = self.blocks[i].expect("a layer with parameters has a block");
        let (all, range, tensors) = if state {
            (self.net.state(), &block.state_range, &block.state_tensors)
        } else {
            (self.net.params(), &block.range, &block.tensors)
        };
        let t = tensors
            .iter()
            .find(|t| t.suffix == suffix)
            .expect("the layer's tensors are named as its type has them");
        let src = &all[range.clone()][t.offset..t.offset + t.len];
        let mut data = vec![0.0; t.len];
        t.to_torch(src, &mut data);
        let name = format!("{}.{suffix}", block.name);
        self.initializers
            .push(tensor_f32(&name, &t.torch_shape, &data));
        name
    }

    /// The finished model.
    fn finish(self, metadata: &[(String, String)]) -> ModelProto {
        let g = self.net.graph();
        let x = g.input();
        let mut props = vec![
            ("dptrain.model".to_string(), g.name.clone()),
            ("dptrain.source".to_string(), g.source.clone()),
            ("dptrain.classes".to_string(), g.classes.to_string()),
        ];
        props.extend(metadata.iter().cloned());
        let graph = GraphProto {
            node: self.nodes,
            name: g.name.clone(),
            initializer: self.initializers,
            input: vec![value_info(INPUT_NAME, &[x.c, x.h, x.w])],
            output: vec![value_info(OUTPUT_NAME, &[g.classes])],
            ..Default::default()
        };
        ModelProto {
            ir_version: IR_VERSION,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
                ..Default::default()
            }],
            producer_name: "dptrain".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            graph: MessageField::some(graph),
            metadata_props: props
                .into_iter()
                .map(|(key, value)| StringStringEntryProto {
                    key,
                    value,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// A pooling window's attributes (floor mode, as dptrain's and PyTorch's default).
fn pool_attrs(p: &Pool) -> Vec<AttributeProto> {
    let pad = p.padding;
    vec![
        attr_ints("kernel_shape", &p.kernel),
        attr_ints("strides", &p.stride),
        attr_ints("pads", &[pad[0], pad[1], pad[0], pad[1]]),
    ]
}

fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        type_: AttributeType::INT.into(),
        i: v,
        ..Default::default()
    }
}

fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        type_: AttributeType::FLOAT.into(),
        f: v,
        ..Default::default()
    }
}

fn attr_ints(name: &str, v: &[usize]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        type_: AttributeType::INTS.into(),
        ints: v.iter().map(|&x| x as i64).collect(),
        ..Default::default()
    }
}

/// A float tensor of `dims` holding `data` (little-endian raw data).
fn tensor_f32(name: &str, dims: &[usize], data: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: DataType::FLOAT as i32,
        name: name.into(),
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

/// A 1-D int64 tensor.
fn tensor_i64(name: &str, data: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![data.len() as i64],
        data_type: DataType::INT64 as i32,
        name: name.into(),
        int64_data: data.to_vec(),
        ..Default::default()
    }
}

/// A float tensor input or output of shape `[N, dims...]`.
fn value_info(name: &str, dims: &[usize]) -> ValueInfoProto {
    let mut dim = vec![Dimension {
        value: Some(dimension::Value::DimParam(BATCH_DIM.into())),
        ..Default::default()
    }];
    dim.extend(dims.iter().map(|&d| Dimension {
        value: Some(dimension::Value::DimValue(d as i64)),
        ..Default::default()
    }));
    let tensor = type_proto::Tensor {
        elem_type: DataType::FLOAT as i32,
        shape: MessageField::some(TensorShapeProto {
            dim,
            ..Default::default()
        }),
        ..Default::default()
    };
    ValueInfoProto {
        name: name.into(),
        type_: MessageField::some(TypeProto {
            value: Some(type_proto::Value::TensorType(tensor)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{self, Graph};
    use crate::nn::NetConfig;
    use std::sync::Arc;

    fn lenet() -> Net {
        let spec = model::load("lenet5").unwrap();
        let g = Graph::build(&spec, [1, 28, 28], 10).unwrap();
        Net::new(
            Arc::new(g),
            NetConfig {
                max_batch: 1,
                seed: 1,
            },
        )
        .unwrap()
    }

    #[test]
    fn a_model_past_the_file_limit_is_refused_before_anything_is_built() {
        let net = lenet();
        let bytes = 4 * (net.params().len() + net.state().len()) as u64;
        match to_onnx_within(&net, &[], bytes - 1) {
            Err(ExportError::TooLarge {
                model,
                bytes: b,
                limit,
            }) => {
                assert_eq!((model.as_str(), b, limit), ("lenet5", bytes, bytes - 1));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(to_onnx_within(&net, &[], bytes).is_ok());
    }

    #[test]
    fn the_graph_has_one_dynamic_batch_input_the_logits_and_the_metadata() {
        let net = lenet();
        let meta = [("classes".to_string(), "a,b".to_string())];
        let m = to_onnx(&net, &meta).unwrap();
        assert_eq!(m.opset_import[0].version, OPSET);
        let g = m.graph.as_ref().unwrap();
        assert_eq!(g.input.len(), 1);
        assert_eq!(g.output[0].name, OUTPUT_NAME);
        let Some(type_proto::Value::TensorType(t)) = &g.input[0].type_.value else {
            panic!("a tensor input");
        };
        let dims: Vec<_> = t.shape.dim.iter().map(|d| d.value.clone()).collect();
        assert_eq!(dims[0], Some(dimension::Value::DimParam(BATCH_DIM.into())));
        assert_eq!(
            dims[1..],
            [1, 28, 28].map(|d| Some(dimension::Value::DimValue(d)))
        );
        assert!(m
            .metadata_props
            .iter()
            .any(|p| p.key == "classes" && p.value == "a,b"));
        // No loss node, and the initializers are PyTorch's state_dict names.
        assert!(g.node.iter().all(|n| n.op_type != "Softmax"));
        assert!(g.initializer.iter().any(|t| t.name == "c1.weight"));
    }
}
