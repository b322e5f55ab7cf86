//! Request bodies in TF Serving's REST forms and KServe's v2 form, decoded
//! into the input columns the model reads: the same `RawBatch` a CSV or
//! Parquet reader hands to feature encoding, so serving encodes features
//! with the code that trained them. Every refusal names the input and row.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::config::data_plan::ColumnType;
use crate::data::{CellError, Column, ProjColumn, RawBatch};
use crate::export::runtime::ExportedModel;

/// The name of the one string input of a packed export, as EasyRec's
/// `multi_placeholder: false` signature names it.
pub const PACKED_INPUT: &str = "features";

/// A request the client must fix (HTTP 400).
#[derive(Debug, Clone, PartialEq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(msg: impl Into<String>) -> Result<T, BadRequest> {
    Err(BadRequest(msg.into()))
}

/// The one signature an export serves, TF Serving's default name.
pub const SIGNATURE: &str = "serving_default";

/// How a TF Serving request listed its rows; the answer uses the same form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Form {
    /// `{"instances": [row, ...]}` answered by `{"predictions": [...]}`.
    Rows,
    /// `{"inputs": {input: [values]}}` answered by `{"outputs": {...}}`.
    Columns,
}

/// The inputs a served model takes: one per input field it reads, or one
/// packed string per row.
pub fn request_inputs(model: &ExportedModel) -> Vec<(String, ColumnType)> {
    if model.packed.is_some() {
        return vec![(PACKED_INPUT.to_string(), ColumnType::Str)];
    }
    model
        .enc
        .projection
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.ty))
        .collect()
}

/// A TF Serving `:predict` body.
pub fn tf_serving(body: &Value, model: &ExportedModel) -> Result<(RawBatch, Form), BadRequest> {
    let Some(obj) = body.as_object() else {
        return bad("the request body must be a JSON object with `instances` or `inputs`");
    };
    // TF Serving answers a signature the model lacks with an error; an
    // export has one, `serving_default` (what an absent name means).
    match obj.get("signature_name") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == SIGNATURE || s.is_empty() => {}
        Some(other) => {
            return bad(format!(
                "`signature_name` {other} is not a signature of this model (it has `{SIGNATURE}`)"
            ))
        }
    }
    match (obj.get("instances"), obj.get("inputs")) {
        (Some(_), Some(_)) => bad("the request has both `instances` and `inputs`: send one of them"),
        (Some(rows), None) => Ok((instances(rows, model)?, Form::Rows)),
        (None, Some(cols)) => Ok((inputs(cols, model)?, Form::Columns)),
        (None, None) => bad("the request has neither `instances` (rows) nor `inputs` (columns)"),
    }
}

/// `instances`: one object per row (input name to value); for a packed
/// export also one string per row, or `{"features": string}`.
fn instances(rows: &Value, model: &ExportedModel) -> Result<RawBatch, BadRequest> {
    let Some(rows) = rows.as_array() else {
        return bad("`instances` must be a list of rows");
    };
    if rows.is_empty() {
        return bad("`instances` is empty: send at least one row");
    }
    if model.packed.is_some() {
        let packed: Option<Vec<&str>> = rows.iter().map(packed_row).collect();
        if let Some(packed) = packed {
            return unpack(model, &packed);
        }
    }
    let mut cols = Columns::new(model, rows.len());
    for (r, row) in rows.iter().enumerate() {
        let Some(row) = row.as_object() else {
            return bad(format!(
                "row {r} of `instances` is {}, not an object of input values",
                kind(row)
            ));
        };
        for c in 0..cols.specs.len() {
            // An absent input is its field's default_val, as null is
            // (EasyRec's predictor fills both).
            let v = row.get(&cols.specs[c].name).unwrap_or(&Value::Null);
            cols.push(c, r, v)?;
        }
    }
    Ok(cols.finish(rows.len()))
}

/// A packed row: a string, or an object whose only member is `features`.
fn packed_row(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) if o.len() == 1 => o.get(PACKED_INPUT)?.as_str(),
        _ => None,
    }
}

fn unpack(model: &ExportedModel, rows: &[&str]) -> Result<RawBatch, BadRequest> {
    model
        .unpack(rows)
        .map_err(|e| BadRequest(format!("packed `{PACKED_INPUT}`: {e:#}")))
}

/// `inputs`: an object of one list per input (all as long), or for a packed
/// export the list of packed strings itself.
fn inputs(cols: &Value, model: &ExportedModel) -> Result<RawBatch, BadRequest> {
    let named: Map<String, Value>;
    let obj = match cols {
        Value::Object(o) => o,
        Value::Array(_) if model.packed.is_some() => {
            named = Map::from_iter([(PACKED_INPUT.to_string(), cols.clone())]);
            &named
        }
        other => {
            return bad(format!(
                "`inputs` is {}, not an object of one list per input",
                kind(other)
            ))
        }
    };
    let lists: Vec<(&str, &Value)> = obj.iter().map(|(k, v)| (k.as_str(), v)).collect();
    named_columns(&lists, model, "`inputs`")
}

/// Columns given as one list per input, in any order; extra inputs are
/// ignored, as the model does not read them; an absent one is its
/// field's default_val on every row. `what` names the lists in refusals.
fn named_columns(lists: &[(&str, &Value)], model: &ExportedModel, what: &str) -> Result<RawBatch, BadRequest> {
    let mut rows: Option<(usize, &str)> = None;
    for (name, v) in lists {
        let Some(list) = v.as_array() else {
            return bad(format!(
                "{what}: input `{name}` is {}, not a list of one value per row",
                kind(v)
            ));
        };
        match rows {
            None => rows = Some((list.len(), name)),
            Some((n, first)) if n != list.len() => {
                return bad(format!(
                    "{what}: input `{name}` has {} values but `{first}` has {n}: every input needs one per row",
                    list.len()
                ))
            }
            Some(_) => {}
        }
    }
    let n = match rows {
        Some((0, _)) | None => return bad(format!("{what} holds no rows")),
        Some((n, _)) => n,
    };
    let find = |name: &str| lists.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
    if model.packed.is_some() {
        if let Some(list) = find(PACKED_INPUT) {
            let packed: Vec<&str> = as_list(list)
                .iter()
                .enumerate()
                .map(|(r, v)| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => bad(format!(
                        "row {r}: input `{PACKED_INPUT}` is {}, not a string",
                        kind(other)
                    )),
                })
                .collect::<Result<_, _>>()?;
            return unpack(model, &packed);
        }
    }
    let mut cols = Columns::new(model, n);
    for c in 0..cols.specs.len() {
        let name = cols.specs[c].name.clone();
        match find(&name) {
            Some(list) => {
                for (r, v) in as_list(list).iter().enumerate() {
                    cols.push(c, r, v)?;
                }
            }
            // An absent input is its field's default_val on every row.
            None => {
                for r in 0..n {
                    cols.push(c, r, &Value::Null)?;
                }
            }
        }
    }
    Ok(cols.finish(n))
}

fn as_list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A KServe v2 `infer` body: `inputs` is a list of
/// `{name, shape, datatype, data}` tensors of one value per row.
pub fn kserve_v2(body: &Value, model: &ExportedModel) -> Result<RawBatch, BadRequest> {
    let Some(tensors) = body.get("inputs").and_then(Value::as_array) else {
        return bad("the request body must be a JSON object whose `inputs` is a list of tensors");
    };
    let mut flat: Vec<(String, Value)> = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return bad(format!("inputs[{i}] has no `name` string"));
        };
        let Some(datatype) = t.get("datatype").and_then(Value::as_str) else {
            return bad(format!("input `{name}` has no `datatype` string"));
        };
        if !V2_TYPES.contains(&datatype) {
            return bad(format!(
                "input `{name}`: datatype `{datatype}` is not one of KServe v2's ({})",
                V2_TYPES.join(", ")
            ));
        }
        let Some(shape) = t.get("shape").and_then(Value::as_array) else {
            return bad(format!("input `{name}` has no `shape` list"));
        };
        let dims: Option<Vec<u64>> = shape.iter().map(Value::as_u64).collect();
        // A multi-value input holds `[rows, values]`.
        let multi = model.multi_value.contains_key(name);
        let dims = match dims {
            Some(d) if !d.is_empty() && d[1..].iter().all(|&x| x == 1) => d,
            Some(d) if multi && d.len() == 2 => d,
            _ => {
                return bad(format!(
                    "input `{name}`: shape {} is not [rows] or [rows, 1]{}",
                    Value::Array(shape.clone()),
                    if multi {
                        " or [rows, values]"
                    } else {
                        ": each input holds one value per row"
                    }
                ))
            }
        };
        let per_row = dims.get(1).copied().unwrap_or(1).max(1);
        let mut data = Vec::new();
        flatten(t.get("data").unwrap_or(&Value::Null), &mut data);
        // The shape is the client's: its product may not fit a number.
        let Some(values) = dims[0].checked_mul(per_row) else {
            return bad(format!(
                "input `{name}`: shape {} holds more values than any request",
                Value::Array(shape.clone())
            ));
        };
        if data.len() as u64 != values {
            return bad(format!(
                "input `{name}`: shape says {values} values, data holds {}",
                data.len()
            ));
        }
        let data = if multi {
            data.chunks(per_row as usize)
                .map(|row| Value::Array(row.to_vec()))
                .collect()
        } else {
            data
        };
        flat.push((name.to_string(), Value::Array(data)));
    }
    let lists: Vec<(&str, &Value)> = flat.iter().map(|(k, v)| (k.as_str(), v)).collect();
    named_columns(&lists, model, "inputs")
}

const V2_TYPES: &[&str] = &[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES",
];

/// v2 data may be nested row-major lists; scalars are taken in order. A
/// null value (as a NaN of binary FP32/FP64 data reads) is a missing value,
/// its field's default_val, as an empty CSV cell; absent data holds none.
fn flatten(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Null => {}
        v => flatten_into(v, out),
    }
}

fn flatten_into(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| flatten_into(x, out)),
        other => out.push(other.clone()),
    }
}

/// The input columns under construction, in the encoder's projection order.
struct Columns<'a> {
    specs: &'a [ProjColumn],
    cols: Vec<Column>,
    /// Per column, the separator joining a list of values when the
    /// export takes the input as a list (`multi_value_fields`).
    multi: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn new(model: &'a ExportedModel, rows: usize) -> Self {
        let specs = &model.enc.projection.columns[..];
        Columns {
            specs,
            cols: specs.iter().map(|s| Column::of_type(s.ty, rows)).collect(),
            multi: specs
                .iter()
                .map(|s| model.multi_value.get(&s.name).map(String::as_str))
                .collect(),
        }
    }

    /// Appends row `r`'s value `v` of input `c`. A string is read as a CSV
    /// cell holding it would be; numbers and booleans go in as they are
    /// (an integer into a string input as its digits); null or "" is the
    /// field's default_val.
    fn push(&mut self, c: usize, r: usize, v: &Value) -> Result<(), BadRequest> {
        let spec = &self.specs[c];
        let col = &mut self.cols[c];
        let refuse = |what: String| bad(format!("row {r}: input `{}`: {what}", spec.name));
        let text: Cow<str> = match v {
            Value::Null => Cow::Borrowed(""),
            Value::String(s) => Cow::Borrowed(s),
            Value::Number(n) => match (col, spec.ty) {
                (Column::Float(d), _) => {
                    d.push(n.as_f64().unwrap_or(f64::NAN));
                    return Ok(());
                }
                (Column::Int(d), ColumnType::Int) => match n.as_i64() {
                    Some(x) => {
                        d.push(x);
                        return Ok(());
                    }
                    None => Cow::Owned(n.to_string()),
                },
                _ if spec.ty == ColumnType::Str && (n.is_i64() || n.is_u64()) => Cow::Owned(n.to_string()),
                _ if spec.ty == ColumnType::Str => {
                    return refuse(format!(
                        "the number {n} for a string input: send it as a string, as the data holds it"
                    ))
                }
                _ => Cow::Owned(n.to_string()),
            },
            Value::Bool(b) if spec.ty != ColumnType::Str => Cow::Borrowed(if *b { "1" } else { "0" }),
            // TF Serving's binary string: `{"b64": "..."}`, the text it encodes.
            Value::Object(o) if o.len() == 1 && o.contains_key("b64") => {
                use base64::Engine as _;
                let Some(Value::String(encoded)) = o.get("b64") else {
                    return refuse("`b64` holds no string".into());
                };
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| BadRequest(format!("row {r}: input `{}`: `b64`: {e}", spec.name)))?;
                match String::from_utf8(bytes) {
                    Ok(text) => Cow::Owned(text),
                    Err(_) => return refuse("`b64` decodes to bytes that are not UTF-8 text".into()),
                }
            }
            // A multi-value input's list: its values joined by the
            // separator its feature splits them at.
            Value::Array(items) if self.multi[c].is_some() => {
                let sep = self.multi[c].unwrap_or_default();
                let mut parts = Vec::with_capacity(items.len());
                for x in items {
                    parts.push(match x {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        other => {
                            return refuse(format!(
                                "a list holding {}: a multi-value input's list holds strings or numbers",
                                kind(other)
                            ))
                        }
                    });
                }
                Cow::Owned(parts.join(sep))
            }
            other => return refuse(format!("{}, not a single {} value", kind(other), type_name(spec.ty))),
        };
        match spec.push_cell(&mut self.cols[c], &text) {
            Ok(()) => Ok(()),
            Err(CellError::EmptyRequired) => refuse("is empty and has no default_val".into()),
            Err(CellError::Invalid(v)) => refuse(format!("`{v}` is not a valid {} value", type_name(spec.ty))),
        }
    }

    fn finish(self, rows: usize) -> RawBatch {
        RawBatch {
            num_rows: rows,
            columns: self.cols,
        }
    }
}

fn type_name(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Int => "integer",
        ColumnType::Float => "number",
        ColumnType::Str => "string",
        ColumnType::Bool => "boolean",
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
