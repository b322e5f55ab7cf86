//! KServe v2's (Triton's) binary tensor data extension: a request body is
//! a JSON header of `Inference-Header-Content-Length` bytes followed by the
//! raw data of every input whose `parameters.binary_data_size` says how
//! many bytes it takes, in the header's order; outputs asked for with
//! `binary_data: true` (or `binary_data_output: true` for all) come back
//! the same way. Numbers are little-endian; each BYTES element is a 4-byte
//! little-endian length followed by its bytes. tritonclient sends its
//! tensors this way by default.

use serde_json::{json, Value};

use super::request::BadRequest;

/// The header's name in requests and answers.
pub const HEADER: &str = "inference-header-content-length";

/// Splits a body into its JSON header and the inputs' binary data, and puts
/// each input's binary data into its `data` as JSON values (so the JSON
/// reader takes it from there).
pub fn parse(body: &[u8], header_len: usize) -> Result<Value, BadRequest> {
    let bad = |m: String| Err(BadRequest(m));
    if header_len > body.len() {
        return bad(format!(
            "Inference-Header-Content-Length is {header_len}, the body holds {} bytes",
            body.len()
        ));
    }
    let (head, mut rest) = body.split_at(header_len);
    let mut v: Value = serde_json::from_slice(head)
        .map_err(|e| BadRequest(format!("the request's JSON header is not valid JSON: {e}")))?;
    let Some(inputs) = v.get_mut("inputs").and_then(Value::as_array_mut) else {
        return bad("the request's JSON header must hold a list of `inputs`".into());
    };
    for t in inputs.iter_mut() {
        let name = t.get("name").and_then(Value::as_str).unwrap_or("?").to_string();
        let Some(size) = t.pointer("/parameters/binary_data_size") else {
            continue;
        };
        let size = size
            .as_u64()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| BadRequest(format!("input `{name}`: binary_data_size must be a byte count")))?;
        if size > rest.len() {
            return bad(format!(
                "input `{name}`: binary_data_size {size} runs past the body ({} bytes left)",
                rest.len()
            ));
        }
        let (data, tail) = rest.split_at(size);
        rest = tail;
        let datatype = t.get("datatype").and_then(Value::as_str).unwrap_or("");
        t["data"] = Value::Array(decode(&name, datatype, data)?);
    }
    if !rest.is_empty() {
        return bad(format!(
            "{} bytes of binary data follow the last input that takes any",
            rest.len()
        ));
    }
    Ok(v)
}

/// One input's raw data as JSON values, by its v2 datatype.
pub fn decode(name: &str, datatype: &str, data: &[u8]) -> Result<Vec<Value>, BadRequest> {
    let fixed = |width: usize| -> Result<std::slice::ChunksExact<'_, u8>, BadRequest> {
        if !data.len().is_multiple_of(width) {
            return Err(BadRequest(format!(
                "input `{name}`: {} bytes of {datatype} data are not a whole number of {width}-byte values",
                data.len()
            )));
        }
        Ok(data.chunks_exact(width))
    };
    macro_rules! nums {
        ($t:ty, $w:expr) => {
            fixed($w)?
                .map(|c| json!(<$t>::from_le_bytes(c.try_into().expect("width"))))
                .collect()
        };
    }
    Ok(match datatype {
        "BOOL" => fixed(1)?.map(|c| json!(c[0] != 0)).collect(),
        "INT8" => nums!(i8, 1),
        "INT16" => nums!(i16, 2),
        "INT32" => nums!(i32, 4),
        "INT64" => nums!(i64, 8),
        "UINT8" => nums!(u8, 1),
        "UINT16" => nums!(u16, 2),
        "UINT32" => nums!(u32, 4),
        "UINT64" => nums!(u64, 8),
        "FP32" => nums!(f32, 4),
        "FP64" => nums!(f64, 8),
        "BYTES" => {
            let mut out = Vec::new();
            let mut at = 0;
            while at < data.len() {
                let len = data
                    .get(at..at + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .ok_or_else(|| BadRequest(format!("input `{name}`: a BYTES element's length is cut short")))?;
                let s = data.get(at + 4..at + 4 + len).ok_or_else(|| {
                    BadRequest(format!(
                        "input `{name}`: a BYTES element of {len} bytes runs past its data"
                    ))
                })?;
                let s = std::str::from_utf8(s)
                    .map_err(|_| BadRequest(format!("input `{name}`: a BYTES element is not UTF-8 text")))?;
                out.push(json!(s));
                at += 4 + len;
            }
            out
        }
        other => {
            return Err(BadRequest(format!(
                "input `{name}`: binary data of datatype `{other}` is not read here"
            )))
        }
    })
}

/// Whether output `name` is asked for as binary data.
pub fn wants_binary(request: &Value, name: &str) -> bool {
    let all = request
        .pointer("/parameters/binary_data_output")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let one = request
        .get("outputs")
        .and_then(Value::as_array)
        .and_then(|outs| {
            outs.iter()
                .find(|o| o.get("name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|o| o.pointer("/parameters/binary_data"))
        .and_then(Value::as_bool);
    one.unwrap_or(all)
}
