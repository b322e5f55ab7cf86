//! The safetensors file format (little-endian u64 header size, JSON header,
//! raw data), for f32 tensors. Small enough to write here; any safetensors
//! reader (Python's included) opens these files.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// A tensor's values: f32 weights, or u64 keys and counts (key-value tables).
#[derive(Debug, Clone, PartialEq)]
pub enum Values<'a> {
    F32(Cow<'a, [f32]>),
    U64(Cow<'a, [u64]>),
}

impl Values<'_> {
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::U64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn dtype(&self) -> (&'static str, usize) {
        match self {
            Values::F32(_) => ("F32", 4),
            Values::U64(_) => ("U64", 8),
        }
    }
}

/// A tensor to write, borrowed from where it lives (or built for the file).
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Values<'a>,
}

impl<'a> TensorRef<'a> {
    pub fn new(name: impl Into<String>, shape: Vec<usize>, data: &'a [f32]) -> Self {
        TensorRef {
            name: name.into(),
            shape,
            data: Values::F32(Cow::Borrowed(data)),
        }
    }

    /// f32 values gathered for the file.
    pub fn owned(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Self {
        TensorRef {
            name: name.into(),
            shape,
            data: Values::F32(Cow::Owned(data)),
        }
    }

    /// u64 values (a key-value table's keys, counts and steps).
    pub fn u64(name: impl Into<String>, shape: Vec<usize>, data: Vec<u64>) -> Self {
        TensorRef {
            name: name.into(),
            shape,
            data: Values::U64(Cow::Owned(data)),
        }
    }
}

/// 64-bit checksum of a byte string (FNV-style over 8-byte words, finalised).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().expect("8 bytes"))).wrapping_mul(0x0000_0100_0000_01b3);
        h = h.rotate_left(23);
    }
    for b in chunks.remainder() {
        h = (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    crate::util::mix64(h)
}

/// Writes the tensors; returns (bytes written, checksum of the file).
pub fn write_file(path: &Path, tensors: &[TensorRef<'_>]) -> anyhow::Result<(u64, u64)> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for t in tensors {
        let n: usize = t.shape.iter().product();
        if n != t.data.len() {
            bail!(
                "tensor {}: shape {:?} does not hold {} values",
                t.name,
                t.shape,
                t.data.len()
            );
        }
        let (dtype, width) = t.data.dtype();
        header.insert(
            t.name.clone(),
            json!({"dtype": dtype, "shape": t.shape, "data_offsets": [offset, offset + width * n]}),
        );
        offset += width * n;
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut bytes = Vec::with_capacity(8 + h.len() + offset);
    bytes.extend_from_slice(&(h.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&h);
    for t in tensors {
        match &t.data {
            Values::F32(v) => v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
            Values::U64(v) => v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        }
    }
    let file = File::create(path)?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    w.write_all(&bytes)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all().ok();
    Ok((bytes.len() as u64, checksum(&bytes)))
}

/// A tensor read back: (name, shape, values).
pub type NamedTensor = (String, Vec<usize>, Values<'static>);

/// Every size is checked against the file's own length before it is used,
/// so a crafted header can neither overflow nor allocate beyond the file.
pub fn read_file(bytes: &[u8]) -> anyhow::Result<Vec<NamedTensor>> {
    let (len, rest) = bytes
        .split_first_chunk::<8>()
        .context("file too short for a safetensors header")?;
    let n = usize::try_from(u64::from_le_bytes(*len))
        .ok()
        .filter(|&n| n <= rest.len())
        .with_context(|| {
            format!(
                "header length {} runs past the end of the file",
                u64::from_le_bytes(*len)
            )
        })?;
    let (head, data) = rest.split_at(n);
    let header: Value = serde_json::from_slice(head).context("header is not JSON")?;
    let mut out = Vec::new();
    for (name, info) in header.as_object().context("header is not an object")? {
        if name == "__metadata__" {
            continue;
        }
        let width = match info["dtype"].as_str() {
            Some("F32") => 4,
            Some("U64") => 8,
            _ => bail!(
                "tensor {name}: dtype {} (only F32 and U64 are written here)",
                info["dtype"]
            ),
        };
        let shape: Vec<usize> = serde_json::from_value(info["shape"].clone()).context("bad shape")?;
        let off: [usize; 2] = serde_json::from_value(info["data_offsets"].clone()).context("bad data_offsets")?;
        let raw = data
            .get(off[0]..off[1])
            .with_context(|| format!("tensor {name}: data offsets {off:?} outside the file"))?;
        let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if count.and_then(|c| c.checked_mul(width)) != Some(raw.len()) {
            bail!("tensor {name}: {} bytes of data for shape {shape:?}", raw.len());
        }
        let values = match width {
            4 => Values::F32(Cow::Owned(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect(),
            )),
            _ => Values::U64(Cow::Owned(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            )),
        };
        out.push((name.clone(), shape, values));
    }
    Ok(out)
}
