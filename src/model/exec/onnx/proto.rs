//! A small builder of ONNX graphs over the schema compiled from
//! protos/onnx/onnx.proto, and the writer of `model.onnx` with large
//! initializers in an external data file.

use std::path::Path;

use anyhow::Context;
use prost::Message;

#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

use proto::tensor_proto::DataType;
use proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension::Value as DimValue, tensor_shape_proto::Dimension,
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// The operator set the graphs use (ReduceSum takes its axes as an input).
/// 16: the first with ScatterND's and ScatterElements' `reduction`.
pub const OPSET: i64 = 16;
const IR_VERSION: i64 = 7;

/// One dimension of a graph input or output.
#[derive(Debug, Clone, PartialEq)]
pub enum Dim {
    Fixed(usize),
    Named(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Elem {
    F32,
    F64,
    I64,
}

impl Elem {
    fn code(self) -> i32 {
        match self {
            Elem::F32 => DataType::Float as i32,
            Elem::F64 => DataType::Double as i32,
            Elem::I64 => DataType::Int64 as i32,
        }
    }
}

pub enum Attr {
    Float(f32),
    Int(i64),
    Ints(Vec<i64>),
    Str(String),
}

/// A graph under construction: nodes in topological order (every node is
/// added after its inputs), initializers, inputs and outputs.
#[derive(Default)]
pub struct Graph {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    next: usize,
}

fn value_info(name: &str, elem: Elem, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => DimValue::DimValue(*n as i64),
                Dim::Named(s) => DimValue::DimParam(s.clone()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem.code(),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Graph {
    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{what}_{}", self.next)
    }

    /// Adds a node with one output, named `out` or a fresh name; returns it.
    pub fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<(&str, Attr)>, out: Option<&str>) -> String {
        let out = out.map_or_else(|| self.fresh(op), str::to_string);
        let attribute = attrs
            .into_iter()
            .map(|(name, a)| {
                let mut p = AttributeProto {
                    name: name.to_string(),
                    ..Default::default()
                };
                match a {
                    Attr::Float(f) => {
                        p.r#type = AttributeType::Float as i32;
                        p.f = f;
                    }
                    Attr::Int(i) => {
                        p.r#type = AttributeType::Int as i32;
                        p.i = i;
                    }
                    Attr::Ints(v) => {
                        p.r#type = AttributeType::Ints as i32;
                        p.ints = v;
                    }
                    Attr::Str(v) => {
                        p.r#type = AttributeType::String as i32;
                        p.s = v.into_bytes();
                    }
                }
                p
            })
            .collect();
        let name = self.fresh(&format!("{op}_node"));
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            name,
            op_type: op.to_string(),
            attribute,
            ..Default::default()
        });
        out
    }

    /// `op(inputs)` with no attributes and a fresh output name.
    pub fn op(&mut self, op: &str, inputs: &[&str]) -> String {
        self.node(op, inputs, Vec::new(), None)
    }

    /// A float initializer (a weight, or a constant when `name` is `None`).
    pub fn f32s(&mut self, name: Option<&str>, dims: &[usize], data: &[f32]) -> String {
        let name = name.map_or_else(|| self.fresh("const"), str::to_string);
        let raw = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.initializer(name, (dims, data.len()), Elem::F32, raw)
    }

    /// Initializer `name` of `dims` (holding `len` values) of `elem`, from
    /// its little-endian bytes.
    fn initializer(&mut self, name: String, (dims, len): (&[usize], usize), elem: Elem, raw_data: Vec<u8>) -> String {
        assert_eq!(dims.iter().product::<usize>(), len, "initializer shape");
        self.inits.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: elem.code(),
            name: name.clone(),
            raw_data,
            ..Default::default()
        });
        name
    }

    /// A double constant.
    pub fn f64s(&mut self, dims: &[usize], data: &[f64]) -> String {
        let name = self.fresh("const");
        let raw = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.initializer(name, (dims, data.len()), Elem::F64, raw)
    }

    /// An int64 constant.
    pub fn i64s(&mut self, dims: &[usize], data: &[i64]) -> String {
        let name = self.fresh("const");
        self.named_i64s(&name, dims, data)
    }

    /// An int64 initializer under `name`.
    pub fn named_i64s(&mut self, name: &str, dims: &[usize], data: &[i64]) -> String {
        let raw = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.initializer(name.to_string(), (dims, data.len()), Elem::I64, raw)
    }

    pub fn input(&mut self, name: &str, elem: Elem, dims: &[Dim]) -> String {
        self.inputs.push(value_info(name, elem, dims));
        name.to_string()
    }

    pub fn output(&mut self, name: &str, elem: Elem, dims: &[Dim]) {
        self.outputs.push(value_info(name, elem, dims));
    }

    pub fn num_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The model, with every initializer of at least `external_min_bytes`
    /// moved into `dir/<data_file>` (ONNX external data, 64-byte aligned).
    /// Writes `dir/model.onnx`; returns each file written with its size and
    /// CRC-32C, for the export's record of what it holds.
    pub fn write(mut self, dir: &Path, data_file: &str, external_min_bytes: usize) -> anyhow::Result<Vec<WrittenFile>> {
        let mut external: Vec<u8> = Vec::new();
        for t in &mut self.inits {
            if t.raw_data.len() < external_min_bytes || t.raw_data.is_empty() {
                continue;
            }
            while !external.len().is_multiple_of(64) {
                external.push(0);
            }
            let offset = external.len();
            let length = t.raw_data.len();
            external.append(&mut t.raw_data);
            t.data_location = Some(proto::tensor_proto::DataLocation::External as i32);
            t.external_data = [
                ("location", data_file.to_string()),
                ("offset", offset.to_string()),
                ("length", length.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v,
            })
            .collect();
        }
        let model = ModelProto {
            ir_version: IR_VERSION,
            producer_name: "rustrec".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            }],
            graph: Some(GraphProto {
                node: self.nodes,
                name: "rustrec".into(),
                initializer: self.inits,
                input: self.inputs,
                output: self.outputs,
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = model.encode_to_vec();
        let mut written = Vec::new();
        if !external.is_empty() {
            let p = dir.join(data_file);
            std::fs::write(&p, &external).with_context(|| format!("cannot write {}", p.display()))?;
            written.push(WrittenFile::of(data_file, &external));
        }
        let p = dir.join("model.onnx");
        std::fs::write(&p, &bytes).with_context(|| format!("cannot write {}", p.display()))?;
        written.push(WrittenFile::of("model.onnx", &bytes));
        Ok(written)
    }
}

/// A file of an export: its name, size and CRC-32C (as checkpoints carry
/// theirs), so a loader can tell a damaged or truncated file from a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub name: String,
    pub bytes: u64,
    pub crc32c: u32,
}

impl WrittenFile {
    fn of(name: &str, data: &[u8]) -> Self {
        WrittenFile {
            name: name.to_string(),
            bytes: data.len() as u64,
            crc32c: crc32c::crc32c(data),
        }
    }
}
