//! Reading TensorFlow checkpoints (the "V2" tensor bundle EasyRec saves)
//! without TensorFlow: `PREFIX.index` is a LevelDB-style sorted table whose
//! values are `BundleEntryProto` records (dtype, shape, shard, offset, size,
//! CRC32C), and `PREFIX.data-NNNNN-of-MMMMM` hold the tensors' little-endian
//! bytes. Every block and every tensor is checked against its CRC32C, so a
//! damaged file is an error naming it, never wrong weights. Partitioned
//! variables saved whole (their slices under OrderedCode keys) are put
//! back together.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;

use super::Unusable;

use crate::tf_proto::{BundleEntryProto, BundleHeaderProto};

/// The table footer's magic number (LevelDB's, which TensorFlow's table keeps).
const TABLE_MAGIC: u64 = 0xdb47_7524_8b80_fb57;
const FOOTER_LEN: usize = 48;
/// Bytes after each block: its compression type and masked CRC32C.
const TRAILER_LEN: usize = 5;

/// TensorFlow's `DataType` values this reader turns into numbers.
const DT_FLOAT: i32 = 1;
const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;

/// One tensor's record in the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub dtype: i32,
    pub shape: Vec<usize>,
    shard: usize,
    offset: u64,
    size: u64,
    crc: u32,
    /// A partitioned variable saved under its full name: the extents
    /// `(start, length)` of its slices (`length` -1: the whole dimension),
    /// each stored under a key `slice_key` builds.
    slices: Vec<Vec<(i64, i64)>>,
}

impl Entry {
    /// TensorFlow's name of the entry's type.
    pub fn dtype_name(&self) -> String {
        match self.dtype {
            DT_FLOAT => "float32".into(),
            DT_DOUBLE => "float64".into(),
            DT_INT32 => "int32".into(),
            DT_INT64 => "int64".into(),
            7 => "string".into(),
            n => format!("dtype {n}"),
        }
    }
}

/// An opened TensorFlow checkpoint: its index read and checked, its data
/// files read on demand.
#[derive(Debug)]
pub struct TfCheckpoint {
    prefix: PathBuf,
    num_shards: usize,
    pub entries: BTreeMap<String, Entry>,
    /// The slices of partitioned variables, by their binary keys.
    slice_entries: BTreeMap<Vec<u8>, Entry>,
}

/// The checkpoint prefix `path` means, if it is a TensorFlow checkpoint:
/// a prefix whose `.index` exists, or a directory whose `checkpoint` state
/// file names one.
pub fn find(path: &Path) -> Option<PathBuf> {
    if index_of(path).is_file() {
        return Some(path.to_path_buf());
    }
    if path.is_dir() {
        let text = fs::read_to_string(path.join("checkpoint")).ok()?;
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("model_checkpoint_path:") {
                let name = Path::new(rest.trim().trim_matches('"'));
                let p = if name.is_absolute() {
                    name.to_path_buf()
                } else {
                    path.join(name)
                };
                if index_of(&p).is_file() {
                    return Some(p);
                }
            }
        }
    }
    None
}

fn index_of(prefix: &Path) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".index");
    PathBuf::from(s)
}

fn data_file(prefix: &Path, shard: usize, num_shards: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!(".data-{shard:05}-of-{num_shards:05}"));
    PathBuf::from(s)
}

/// LevelDB's CRC masking, which TensorFlow applies to stored checksums.
fn unmask(masked: u32) -> u32 {
    let rot = masked.wrapping_sub(0xa282_ead8);
    rot.rotate_left(15)
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The `(offset, size)` a block handle encodes.
fn handle(buf: &[u8], pos: &mut usize) -> Option<(usize, usize)> {
    let off = usize::try_from(varint(buf, pos)?).ok()?;
    let size = usize::try_from(varint(buf, pos)?).ok()?;
    Some((off, size))
}

/// The key/value pairs of one table block.
fn block_entries(block: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let n = block.len();
    let restarts = u32::from_le_bytes(block.get(n.checked_sub(4)?..)?.try_into().ok()?) as usize;
    let end = n.checked_sub(4)?.checked_sub(restarts.checked_mul(4)?)?;
    let mut out = Vec::new();
    let mut key: Vec<u8> = Vec::new();
    let mut pos = 0;
    while pos < end {
        let shared = usize::try_from(varint(block, &mut pos)?).ok()?;
        let own = usize::try_from(varint(block, &mut pos)?).ok()?;
        let vlen = usize::try_from(varint(block, &mut pos)?).ok()?;
        if shared > key.len() {
            return None;
        }
        key.truncate(shared);
        key.extend_from_slice(block.get(pos..pos.checked_add(own)?)?);
        pos += own;
        let value = block.get(pos..pos.checked_add(vlen)?)?.to_vec();
        pos += vlen;
        out.push((key.clone(), value));
    }
    (pos == end).then_some(out)
}

impl TfCheckpoint {
    /// Reads and checks the index of checkpoint `prefix`.
    pub fn open(prefix: &Path) -> Result<Self, Unusable> {
        let path = index_of(prefix);
        let bytes = fs::read(&path).map_err(|e| {
            Unusable(format!(
                "TensorFlow checkpoint {}: cannot read its index {}: {e}",
                prefix.display(),
                path.display()
            ))
        })?;
        Self::from_index(prefix, &bytes)
    }

    /// Checks and reads `bytes` as the index of checkpoint `prefix` (whose
    /// data files are read on demand).
    pub fn from_index(prefix: &Path, bytes: &[u8]) -> Result<Self, Unusable> {
        let path = index_of(prefix);
        let bad = |what: &str| {
            Unusable(format!(
                "TensorFlow checkpoint index {} is damaged: {what}",
                path.display()
            ))
        };
        let footer = bytes
            .len()
            .checked_sub(FOOTER_LEN)
            .map(|at| &bytes[at..])
            .ok_or_else(|| bad("shorter than a table footer"))?;
        let magic = u64::from_le_bytes(footer[FOOTER_LEN - 8..].try_into().expect("8 bytes"));
        if magic != TABLE_MAGIC {
            return Err(bad("no table footer (truncated, or not a checkpoint index)"));
        }
        let mut pos = 0;
        let _meta = handle(footer, &mut pos).ok_or_else(|| bad("unreadable footer"))?;
        let index = handle(footer, &mut pos).ok_or_else(|| bad("unreadable footer"))?;
        let read_block = |(off, size): (usize, usize)| -> Result<Vec<u8>, Unusable> {
            let end = off
                .checked_add(size)
                .and_then(|e| e.checked_add(TRAILER_LEN))
                .filter(|e| *e <= bytes.len())
                .ok_or_else(|| bad("a block lies past the end of the file"))?;
            let (body, trailer) = bytes[off..end].split_at(size);
            let stored = unmask(u32::from_le_bytes(trailer[1..5].try_into().expect("4 bytes")));
            let crc = crc32c::crc32c_append(crc32c::crc32c(body), &trailer[..1]);
            if crc != stored {
                return Err(bad(&format!("the block at byte {off} fails its checksum")));
            }
            match trailer[0] {
                0 => Ok(body.to_vec()),
                // Snappy encodes at most 64 bytes per tag of two or more
                // bytes: a longer claimed length is a crafted block.
                1 if snap::raw::decompress_len(body).map_or(true, |n| n > body.len().saturating_mul(32)) => Err(bad(
                    &format!("the block at byte {off} claims an impossible uncompressed length"),
                )),
                1 => snap::raw::Decoder::new()
                    .decompress_vec(body)
                    .map_err(|e| bad(&format!("the block at byte {off} does not decompress: {e}"))),
                t => Err(bad(&format!("the block at byte {off} has unknown compression {t}"))),
            }
        };
        let index_block = read_block(index)?;
        let mut header = None;
        let mut entries = BTreeMap::new();
        let mut slice_entries = BTreeMap::new();
        // A table's keys are sorted and distinct (LevelDB's rule): a block
        // listed twice, or keys out of order, is a crafted or damaged index.
        let mut last_key: Option<Vec<u8>> = None;
        let mut handles = std::collections::HashSet::new();
        for (_, h) in block_entries(&index_block).ok_or_else(|| bad("unreadable index block"))? {
            let mut p = 0;
            let h = handle(&h, &mut p).ok_or_else(|| bad("unreadable block handle"))?;
            if !handles.insert(h) {
                return Err(bad(&format!("the index lists the block at byte {} twice", h.0)));
            }
            let block = read_block(h)?;
            for (key, value) in block_entries(&block).ok_or_else(|| bad("unreadable data block"))? {
                if last_key.as_ref().is_some_and(|k| *k >= key) {
                    return Err(bad(&format!(
                        "its keys are not sorted and distinct (at `{}`)",
                        String::from_utf8_lossy(&key)
                    )));
                }
                last_key = Some(key.clone());
                if key.is_empty() {
                    header = Some(BundleHeaderProto::decode(value.as_slice()).map_err(|e| bad(&e.to_string()))?);
                    continue;
                }
                let e = BundleEntryProto::decode(value.as_slice())
                    .map_err(|e| bad(&format!("entry {}: {e}", String::from_utf8_lossy(&key))))?;
                let shape: Vec<usize> = e
                    .shape
                    .as_ref()
                    .map(|s| s.dim.iter().map(|d| usize::try_from(d.size)).collect())
                    .transpose()
                    .map_err(|_| bad(&format!("`{}` has a negative dimension", String::from_utf8_lossy(&key))))?
                    .unwrap_or_default();
                if shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d)).is_none() {
                    return Err(bad(&format!(
                        "`{}` has shape {shape:?}, more values than this machine can address",
                        String::from_utf8_lossy(&key)
                    )));
                }
                let slices = e
                    .slices
                    .iter()
                    .map(|sl| {
                        sl.extent
                            .iter()
                            .map(|x| match x.has_length {
                                Some(crate::tf_proto::tensor_slice_proto::extent::HasLength::Length(l)) => (x.start, l),
                                None => (0, -1),
                            })
                            .collect()
                    })
                    .collect();
                let entry = Entry {
                    dtype: e.dtype,
                    shape,
                    shard: usize::try_from(e.shard_id).unwrap_or(usize::MAX),
                    offset: u64::try_from(e.offset).unwrap_or(u64::MAX),
                    size: u64::try_from(e.size).unwrap_or(u64::MAX),
                    crc: unmask(e.crc32c),
                    slices,
                };
                // Slices of partitioned variables are stored under binary
                // keys (starting with a zero byte) beside their full name.
                match String::from_utf8(key) {
                    Ok(name) if !name.starts_with('\0') => {
                        entries.insert(name, entry);
                    }
                    Ok(name) => {
                        slice_entries.insert(name.into_bytes(), entry);
                    }
                    Err(e) => {
                        slice_entries.insert(e.into_bytes(), entry);
                    }
                }
            }
        }
        let header = header.ok_or_else(|| bad("no bundle header"))?;
        if header.endianness != 0 {
            return Err(bad("big-endian checkpoints are not supported"));
        }
        let num_shards = usize::try_from(header.num_shards).map_err(|_| bad("negative shard count"))?;
        Ok(TfCheckpoint {
            prefix: prefix.to_path_buf(),
            num_shards,
            entries,
            slice_entries,
        })
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    fn entry(&self, name: &str) -> Result<&Entry, Unusable> {
        self.entries.get(name).ok_or_else(|| {
            Unusable(format!(
                "TensorFlow checkpoint {} has no variable `{name}`",
                self.prefix.display()
            ))
        })
    }

    /// The data file holding entry `e` (called `name` in errors), after
    /// checking that its bytes lie inside it.
    fn data_of(&self, e: &Entry, name: &str) -> Result<PathBuf, Unusable> {
        if e.shard >= self.num_shards {
            return Err(Unusable(format!(
                "TensorFlow checkpoint {}: `{name}` names data shard {} of {}",
                self.prefix.display(),
                e.shard,
                self.num_shards
            )));
        }
        let path = data_file(&self.prefix, e.shard, self.num_shards);
        let len = fs::metadata(&path)
            .map_err(|err| Unusable(format!("TensorFlow checkpoint data file {}: {err}", path.display())))?
            .len();
        match e.offset.checked_add(e.size) {
            Some(end) if end <= len => Ok(path),
            _ => Err(Unusable(format!(
                "TensorFlow checkpoint data file {} is truncated: `{name}` lies at bytes {}..{}, the file has {len}",
                path.display(),
                e.offset,
                e.offset.saturating_add(e.size)
            ))),
        }
    }

    /// The raw bytes of entry `e` (called `name` in errors), checked
    /// against the index's CRC.
    fn bytes(&self, e: &Entry, name: &str) -> Result<Vec<u8>, Unusable> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.data_of(e, name)?;
        let io = |err: std::io::Error| Unusable(format!("TensorFlow checkpoint data file {}: {err}", path.display()));
        let mut f = fs::File::open(&path).map_err(io)?;
        // Below the file's length (`data_of`), so it fits in memory's address space.
        let mut buf = vec![0u8; usize::try_from(e.size).map_err(|_| io(std::io::ErrorKind::FileTooLarge.into()))?];
        f.seek(SeekFrom::Start(e.offset))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(io)?;
        if crc32c::crc32c(&buf) != e.crc {
            return Err(Unusable(format!(
                "TensorFlow checkpoint data file {} is damaged: `{name}` fails its checksum",
                path.display()
            )));
        }
        Ok(buf)
    }

    /// Checks that entry `e` is a number tensor whose stored size is its
    /// shape's and lies inside its data file; returns its value width.
    fn numeric(&self, e: &Entry, name: &str) -> Result<usize, Unusable> {
        let width = match e.dtype {
            DT_FLOAT | DT_INT32 => 4,
            DT_DOUBLE | DT_INT64 => 8,
            _ => {
                return Err(Unusable(format!(
                    "TensorFlow checkpoint {}: `{name}` is of type {}, not a number",
                    self.prefix.display(),
                    e.dtype_name()
                )))
            }
        };
        // The product fits (checked when the index was read).
        let count: usize = e.shape.iter().product();
        if count.checked_mul(width).and_then(|n| u64::try_from(n).ok()) != Some(e.size) {
            return Err(Unusable(format!(
                "TensorFlow checkpoint {}: `{name}` holds {} bytes for shape {:?}",
                self.prefix.display(),
                e.size,
                e.shape
            )));
        }
        self.data_of(e, name)?;
        Ok(width)
    }

    /// Reads and checks every tensor's bytes against its checksum (the
    /// slices of partitioned variables too), as inspect_checkpoint does.
    pub fn verify_all(&self) -> Result<(), Unusable> {
        for (name, e) in &self.entries {
            if e.slices.is_empty() {
                self.bytes(e, name)?;
            }
        }
        for e in self.slice_entries.values() {
            self.bytes(e, "a slice of a partitioned variable")?;
        }
        Ok(())
    }

    /// The values of entry `e` as f32 (float64 and integers converted).
    fn values(&self, e: &Entry, name: &str) -> Result<Vec<f32>, Unusable> {
        let width = self.numeric(e, name)?;
        let buf = self.bytes(e, name)?;
        Ok(buf
            .chunks_exact(width)
            .map(|c| match e.dtype {
                DT_FLOAT => f32::from_le_bytes(c.try_into().expect("4 bytes")),
                DT_INT32 => i32::from_le_bytes(c.try_into().expect("4 bytes")) as f32,
                DT_DOUBLE => f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32,
                _ => i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32,
            })
            .collect())
    }

    /// A partitioned variable put together from its slices. Every slice
    /// is found and checked against the data files before the whole is
    /// allocated, so a crafted full shape cannot claim more memory than
    /// the files hold; each value is written by exactly one slice.
    fn assemble(&self, e: &Entry, name: &str) -> Result<Vec<f32>, Unusable> {
        let bad = |what: String| {
            Unusable(format!(
                "TensorFlow checkpoint {}: `{name}` {what}",
                self.prefix.display()
            ))
        };
        let shape = &e.shape;
        let mut parts = Vec::with_capacity(e.slices.len());
        let mut covered = 0usize;
        for extents in &e.slices {
            if extents.len() != shape.len() {
                return Err(bad(format!(
                    "has a slice of rank {} for shape {shape:?}",
                    extents.len()
                )));
            }
            // Each dimension's range; a full extent is the whole dimension.
            let mut ranges = Vec::new();
            for (&(start, len), &dim) in extents.iter().zip(shape) {
                let (s, l) = if len < 0 {
                    (0, dim)
                } else {
                    (
                        usize::try_from(start).unwrap_or(usize::MAX),
                        usize::try_from(len).unwrap_or(usize::MAX),
                    )
                };
                if s.checked_add(l).is_none_or(|end| end > dim) {
                    return Err(bad(format!("has a slice outside shape {shape:?}")));
                }
                ranges.push((s, l));
            }
            let part = self
                .slice_entries
                .get(&slice_key(name, extents))
                .ok_or_else(|| bad("lacks one of its slices".into()))?;
            let lens: Vec<usize> = ranges.iter().map(|r| r.1).collect();
            if part.shape != lens {
                return Err(bad(format!(
                    "has a slice of shape {:?} where {lens:?} belongs",
                    part.shape
                )));
            }
            self.numeric(part, name)?;
            // Inside the shape, so the sum stays below its (checked) product.
            covered += lens.iter().product::<usize>();
            parts.push((part, ranges, lens));
        }
        let total: usize = shape.iter().product();
        if covered != total {
            return Err(bad(format!("has slices covering {covered} of {total} values")));
        }
        let mut out = vec![0.0f32; total];
        let mut written = vec![false; total];
        for (part, ranges, lens) in parts {
            let values = self.values(part, name)?;
            // Row-major walk over the slice, placing each value.
            let mut idx = vec![0usize; lens.len()];
            for v in values {
                let mut flat = 0usize;
                for ((i, (s, _)), dim) in idx.iter().zip(&ranges).zip(shape) {
                    flat = flat * dim + s + i;
                }
                if std::mem::replace(&mut written[flat], true) {
                    return Err(bad("has overlapping slices".into()));
                }
                out[flat] = v;
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < lens[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        Ok(out)
    }

    /// Tensor `name` as f32 values (float64 and integers converted); a
    /// partitioned variable saved in slices comes back whole.
    pub fn read_f32(&self, name: &str) -> Result<super::Loaded, Unusable> {
        let e = self.entry(name)?;
        let data = if e.slices.is_empty() {
            self.values(e, name)?
        } else {
            self.assemble(e, name)?
        };
        Ok(super::Loaded::f32(e.shape.clone(), data))
    }

    /// The `global_step` variable, if the checkpoint has one.
    pub fn global_step(&self) -> Result<Option<u64>, Unusable> {
        let Some(e) = self.entries.get("global_step") else {
            return Ok(None);
        };
        if e.dtype != DT_INT64 || !e.shape.is_empty() {
            return Ok(None);
        }
        let buf = self.bytes(e, "global_step")?;
        let v = i64::from_le_bytes(buf.as_slice().try_into().map_err(|_| {
            Unusable(format!(
                "TensorFlow checkpoint {}: global_step is not 8 bytes",
                self.prefix.display()
            ))
        })?);
        Ok(u64::try_from(v).ok())
    }
}

/// TensorFlow's key of one slice of a partitioned variable
/// (`checkpoint::EncodeTensorNameSlice`): OrderedCode of 0, the name, the
/// rank, then each extent's start and length (-1 for a whole dimension).
fn slice_key(name: &str, extents: &[(i64, i64)]) -> Vec<u8> {
    let mut k = Vec::new();
    ordered_num(&mut k, 0);
    for &b in name.as_bytes() {
        match b {
            0x00 => k.extend_from_slice(&[0x00, 0xff]),
            0xff => k.extend_from_slice(&[0xff, 0x00]),
            b => k.push(b),
        }
    }
    k.extend_from_slice(&[0x00, 0x01]);
    ordered_num(&mut k, extents.len() as u64);
    for &(start, len) in extents {
        let (start, len) = if len < 0 { (0, -1) } else { (start, len) };
        ordered_signed(&mut k, start);
        ordered_signed(&mut k, len);
    }
    k
}

/// OrderedCode's WriteNumIncreasing: the byte count, then big-endian bytes.
fn ordered_num(k: &mut Vec<u8>, v: u64) {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    k.push((8 - skip) as u8);
    k.extend_from_slice(&bytes[skip..]);
}

/// OrderedCode's WriteSignedNumIncreasing: a length-prefixed,
/// sign-extended big-endian encoding whose first bits give the length.
fn ordered_signed(k: &mut Vec<u8>, v: i64) {
    const HEADER: [[u8; 2]; 11] = [
        [0, 0],
        [0x80, 0],
        [0xc0, 0],
        [0xe0, 0],
        [0xf0, 0],
        [0xf8, 0],
        [0xfc, 0],
        [0xfe, 0],
        [0xff, 0],
        [0xff, 0x80],
        [0xff, 0xc0],
    ];
    let x = if v < 0 { !v as u64 } else { v as u64 };
    if x < 64 {
        k.push(HEADER[1][0] ^ (v as u8));
        return;
    }
    let bits = 64 - x.leading_zeros() as usize;
    let len = (bits + 7) / 7;
    let mut buf = [if v < 0 { 0xff } else { 0x00 }; 10];
    buf[2..].copy_from_slice(&v.to_be_bytes());
    let begin = 10 - len;
    buf[begin] ^= HEADER[len][0];
    buf[begin + 1] ^= HEADER[len][1];
    k.extend_from_slice(&buf[begin..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_round_trips() {
        let crc = 0x1234_5678u32;
        let masked = (crc.rotate_right(15)).wrapping_add(0xa282_ead8);
        assert_eq!(unmask(masked), crc);
    }

    /// OrderedCode's signed encoding at its length boundaries (the
    /// partitioned fixture in tests/compat.rs checks two-byte values against
    /// keys TensorFlow wrote).
    #[test]
    fn ordered_signed_numbers() {
        let enc = |v: i64| {
            let mut k = Vec::new();
            ordered_signed(&mut k, v);
            k
        };
        assert_eq!(enc(0), [0x80]);
        assert_eq!(enc(-1), [0x7f]);
        assert_eq!(enc(63), [0xbf]);
        assert_eq!(enc(-64), [0x40]);
        assert_eq!(enc(64), [0xc0, 0x40]);
        assert_eq!(enc(-65), [0x3f, 0xbf]);
        assert_eq!(enc(8191), [0xdf, 0xff]);
        assert_eq!(enc(8192), [0xe0, 0x20, 0x00]);
        let mut k = Vec::new();
        ordered_num(&mut k, 0);
        ordered_num(&mut k, 258);
        assert_eq!(k, [0x00, 0x02, 0x01, 0x02]);
    }

    #[test]
    fn block_entries_share_key_prefixes() {
        // Two entries, "ab"->"1" and "ac"->"2" (one shared byte), one restart.
        let mut b = vec![0, 2, 1, b'a', b'b', b'1', 1, 1, 1, b'c', b'2'];
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        let e = block_entries(&b).unwrap();
        assert_eq!(
            e,
            vec![(b"ab".to_vec(), b"1".to_vec()), (b"ac".to_vec(), b"2".to_vec())]
        );
        // A shared length past the previous key is refused, not a panic.
        let mut bad = vec![5, 1, 0, b'x'];
        bad.extend_from_slice(&0u32.to_le_bytes());
        assert!(block_entries(&bad).is_none());
    }
}
