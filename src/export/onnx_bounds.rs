//! An export's ONNX model checked within bounds before a runtime loads it:
//! the model is decoded from a bounded read, and every initializer's shape
//! must be addressable and its bytes (inline, or in an external data file
//! inside the export at an offset and length inside that file) exactly
//! what its shape and type take. A crafted `model.onnx` claiming a tensor
//! of 2^40 rows, or data past its file, is refused naming the tensor
//! instead of reaching an allocation.

use std::path::{Component, Path};

use anyhow::{bail, Context};
use prost::Message;

use crate::model::exec::onnx::proto::proto::{ModelProto, TensorProto};

/// The bytes of one element of ONNX data type `t`, when fixed.
fn element_bytes(t: i32) -> Option<u64> {
    Some(match t {
        1 | 6 | 12 => 4,       // float, int32, uint32
        2 | 3 | 9 => 1,        // uint8, int8, bool
        4 | 5 | 10 | 16 => 2,  // uint16, int16, float16, bfloat16
        7 | 11 | 13 | 14 => 8, // int64, double, uint64, complex64
        15 => 16,              // complex128
        _ => return None,
    })
}

/// Checks `model.onnx` at `path` of the export `dir`.
pub fn check(dir: &Path, path: &Path) -> anyhow::Result<()> {
    check_model(dir, path).with_context(|| format!("cannot load ONNX model {}", path.display()))
}

fn check_model(dir: &Path, path: &Path) -> anyhow::Result<()> {
    let bytes = crate::bounded::read(path, crate::bounded::table_bytes())?;
    let model = ModelProto::decode(bytes.as_slice()).context("not an ONNX model")?;
    let Some(graph) = &model.graph else {
        bail!("it holds no graph");
    };
    for t in &graph.initializer {
        tensor(dir, t)?;
    }
    Ok(())
}

fn tensor(dir: &Path, t: &TensorProto) -> anyhow::Result<()> {
    let bad = |what: String| anyhow::anyhow!("initializer `{}` {what}", t.name);
    let count = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| u64::try_from(d).ok().and_then(|d| n.checked_mul(d)))
        .ok_or_else(|| bad(format!("has shape {:?}, more values than can be addressed", t.dims)))?;
    let Some(width) = element_bytes(t.data_type) else {
        return Ok(()); // strings and packed types: their bytes are their own lengths
    };
    let want = count
        .checked_mul(width)
        .ok_or_else(|| bad(format!("has shape {:?}, more bytes than can be addressed", t.dims)))?;
    let got = if !t.external_data.is_empty() {
        external(dir, t).map_err(|e| bad(e.to_string()))?
    } else if !t.raw_data.is_empty() {
        t.raw_data.len() as u64
    } else {
        let typed = (t.float_data.len() + t.int32_data.len()) as u64 * 4
            + (t.int64_data.len() + t.double_data.len() + t.uint64_data.len()) as u64 * 8;
        // int32_data also carries the narrow types, one element each.
        if width < 4 {
            t.int32_data.len() as u64 * width
        } else {
            typed
        }
    };
    if got != want {
        return Err(bad(format!(
            "has shape {:?} ({want} bytes), but holds {got} bytes",
            t.dims
        )));
    }
    Ok(())
}

/// The length of a tensor's external data after checking that its file is
/// inside the export and the range inside the file.
fn external(dir: &Path, t: &TensorProto) -> anyhow::Result<u64> {
    let field = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
    let location = field("location").context("has external data without a location")?;
    let rel = Path::new(location);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        bail!("has external data at `{location}`, outside the export");
    }
    let file_len = std::fs::metadata(dir.join(rel))
        .with_context(|| format!("has external data in `{location}`, which cannot be read"))?
        .len();
    let num = |k: &str| -> anyhow::Result<Option<u64>> {
        field(k)
            .map(|v| v.parse::<u64>().with_context(|| format!("has external data {k} `{v}`")))
            .transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    let length = match num("length")? {
        Some(l) => l,
        None => file_len.saturating_sub(offset),
    };
    match offset.checked_add(length) {
        Some(end) if end <= file_len => Ok(length),
        _ => bail!("has external data at bytes {offset}..+{length} of `{location}`, which holds {file_len}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::onnx::proto::proto::{GraphProto, StringStringEntryProto};

    fn write(dir: &Path, t: TensorProto) -> std::path::PathBuf {
        let model = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![t],
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = dir.join("model.onnx");
        std::fs::write(&p, model.encode_to_vec()).unwrap();
        p
    }

    #[test]
    fn shapes_past_their_bytes_or_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ok = TensorProto {
            name: "w".into(),
            dims: vec![2, 2],
            data_type: 1,
            raw_data: vec![0; 16],
            ..Default::default()
        };
        check(d, &write(d, ok.clone())).unwrap();
        let huge = TensorProto {
            dims: vec![1 << 40, 4],
            ..ok.clone()
        };
        let e = format!("{:#}", check(d, &write(d, huge)).unwrap_err());
        assert!(e.contains("`w`") && e.contains("holds 16 bytes"), "{e}");
        let overflow = TensorProto {
            dims: vec![1 << 62, 1 << 62],
            ..ok.clone()
        };
        assert!(check(d, &write(d, overflow)).is_err());
        std::fs::write(d.join("model.onnx.data"), [0u8; 8]).unwrap();
        let entry = |k: &str, v: &str| StringStringEntryProto {
            key: k.into(),
            value: v.into(),
        };
        let past = TensorProto {
            raw_data: Vec::new(),
            external_data: vec![
                entry("location", "model.onnx.data"),
                entry("offset", "0"),
                entry("length", "16"),
            ],
            data_location: Some(1),
            ..ok.clone()
        };
        let e = format!("{:#}", check(d, &write(d, past)).unwrap_err());
        assert!(e.contains("which holds 8"), "{e}");
        let outside = TensorProto {
            raw_data: Vec::new(),
            external_data: vec![entry("location", "../secret")],
            data_location: Some(1),
            ..ok
        };
        let e = format!("{:#}", check(d, &write(d, outside)).unwrap_err());
        assert!(e.contains("outside the export"), "{e}");
    }
}
