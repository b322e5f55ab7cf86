//! TFRecord files: records framed as `u64` length, masked CRC-32C of the
//! length, the bytes, masked CRC-32C of the bytes (all little-endian). The
//! summaries' event files use the framing; EasyRec's TFRecordInput reads
//! tf.Example records whose every input field is a feature of one value
//! (`FixedLenFeature` of shape 1, its default when absent);
//! BatchTFRecordInput tf.SequenceExample records whose every field is a
//! list of `n_data_batch_tfrecord` such features, one per row.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::column::{Column, RawBatch};
use super::{DataError, Projection};
use crate::config::data_plan::Compression;
use crate::tf_proto::{feature::Kind, Example, Feature, SequenceExample};

/// LevelDB's masking of a stored CRC-32C, which TFRecord keeps.
fn masked_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one framed record.
pub fn write_record(out: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc(data).to_le_bytes())
}

/// `data` compressed as a TFRecord file of `compression` is.
pub fn compress(data: &[u8], compression: Compression) -> Vec<u8> {
    let level = flate2::Compression::default();
    let done = match compression {
        Compression::None => return data.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
            e.write_all(data).and_then(|()| e.finish())
        }
        Compression::Zlib => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
            e.write_all(data).and_then(|()| e.finish())
        }
    };
    done.expect("compressing into memory")
}

/// The largest record a reader accepts: far above any tf.Example of a
/// row (or a batch of rows), far below the memory of a training machine.
pub const MAX_RECORD_BYTES: u64 = 1 << 30;

/// The records of a stream, checksums verified; an error says at which
/// byte the bad record starts. A record's length is trusted only after its
/// checksum and below `MAX_RECORD_BYTES`, and its bytes are read as they
/// arrive (never allocated ahead), so a crafted length cannot exhaust
/// memory or panic.
pub struct RecordReader<R> {
    inner: R,
    at: u64,
}

impl<R: Read> RecordReader<R> {
    pub fn new(inner: R) -> Self {
        RecordReader { inner, at: 0 }
    }

    /// The next record, `None` at a clean end.
    pub fn next_record(&mut self) -> Option<Result<Vec<u8>, String>> {
        let at = self.at;
        let mut head = [0u8; 12];
        let mut got = 0;
        while got < head.len() {
            match self.inner.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Some(Err(format!("byte {at}: {e}"))),
            }
        }
        if got == 0 {
            return None;
        }
        let record = (|| {
            if got < head.len() {
                return Err(format!("byte {at}: truncated record"));
            }
            let len_bytes: [u8; 8] = head[..8].try_into().expect("8 bytes");
            if masked_crc(&len_bytes) != u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) {
                return Err(format!("byte {at}: bad length checksum"));
            }
            let len = u64::from_le_bytes(len_bytes);
            if len > MAX_RECORD_BYTES {
                return Err(format!(
                    "byte {at}: a record of {len} bytes, more than the {MAX_RECORD_BYTES} a record may hold"
                ));
            }
            // Grows with the bytes read, up to `len`, whatever `len` claims.
            let mut data = Vec::with_capacity(len.min(1 << 16) as usize);
            let mut crc = [0u8; 4];
            let got = (&mut self.inner)
                .take(len)
                .read_to_end(&mut data)
                .map_err(|e| format!("byte {at}: {e}"))?;
            if got as u64 != len {
                return Err(format!("byte {at}: truncated record ({got} of its {len} bytes)"));
            }
            self.inner
                .read_exact(&mut crc)
                .map_err(|_| format!("byte {at}: truncated record"))?;
            if masked_crc(&data) != u32::from_le_bytes(crc) {
                return Err(format!("byte {at}: bad data checksum"));
            }
            self.at = self.at.saturating_add(16 + len);
            Ok(data)
        })();
        Some(record)
    }
}

/// A TFRecord file of tf.Examples, `chunk_rows` records at a time.
pub struct TfRecordChunks {
    path: PathBuf,
    records: RecordReader<Box<dyn Read + Send>>,
    record_no: usize,
    projection: Projection,
    /// BatchTFRecordInput's rows per record (`n_data_batch_tfrecord`).
    rows_per_record: Option<usize>,
    chunk_rows: usize,
    done: bool,
}

impl TfRecordChunks {
    pub fn open(
        path: &Path,
        (compression, rows_per_record): (Compression, Option<usize>),
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let f = BufReader::new(crate::storage::open(path).map_err(|e| DataError::io(path, e))?);
        let reader: Box<dyn Read + Send> = match compression {
            Compression::None => Box::new(f),
            Compression::Gzip => Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(f))),
            Compression::Zlib => Box::new(BufReader::new(flate2::bufread::ZlibDecoder::new(f))),
        };
        Ok(TfRecordChunks {
            path: path.to_path_buf(),
            records: RecordReader::new(reader),
            record_no: 0,
            projection: projection.clone(),
            rows_per_record,
            chunk_rows: chunk_rows.max(1),
            done: false,
        })
    }

    /// Appends record `data`'s rows (one, or `rows_per_record` of a batched
    /// record) of the projected fields; returns how many.
    fn push_record(&self, data: &[u8], columns: &mut [Column]) -> Result<usize, DataError> {
        let location = format!("record {}", self.record_no);
        let row_error = |message: String| DataError::Row {
            file: self.path.clone(),
            location: location.clone(),
            message,
        };
        // Per field, its value per row (`None`: absent).
        let rows: usize;
        let mut lists: Vec<Vec<Option<Feature>>> = Vec::with_capacity(self.projection.columns.len());
        match self.rows_per_record {
            None => {
                let example = Example::decode(data).map_err(|e| row_error(format!("not a tf.Example: {e}")))?;
                let mut features = example.features.map(|f| f.feature).unwrap_or_default();
                rows = 1;
                for spec in &self.projection.columns {
                    lists.push(vec![features.remove(&spec.name)]);
                }
            }
            Some(n) => {
                let example =
                    SequenceExample::decode(data).map_err(|e| row_error(format!("not a tf.SequenceExample: {e}")))?;
                let mut fl = example.feature_lists.map(|f| f.feature_list).unwrap_or_default();
                rows = n;
                for spec in &self.projection.columns {
                    let list = match fl.remove(&spec.name) {
                        // allow_missing: an absent field is its default in every row.
                        None => vec![None; n],
                        Some(l) if l.feature.len() == n => l.feature.into_iter().map(Some).collect(),
                        Some(l) => {
                            return Err(row_error(format!(
                                "field `{}` holds {} rows; n_data_batch_tfrecord is {n}",
                                spec.name,
                                l.feature.len()
                            )))
                        }
                    };
                    lists.push(list);
                }
            }
        }
        for ((spec, col), list) in self.projection.columns.iter().zip(columns.iter_mut()).zip(&lists) {
            let value_error = |message: String| DataError::Value {
                file: self.path.clone(),
                location: location.clone(),
                column: spec.name.clone(),
                message,
            };
            for f in list {
                // TensorFlow would parse an absent label as its default (0):
                // training on labels nobody wrote is refused instead.
                if spec.required && f.as_ref().and_then(|f| f.kind.as_ref()).is_none() {
                    return Err(value_error(
                        "is absent from the record, and a label must be in every record".into(),
                    ));
                }
                let text = match f.as_ref().and_then(|f| f.kind.as_ref()) {
                    None => String::new(),
                    Some(kind) => one_value(kind).map_err(value_error)?,
                };
                spec.push_cell(col, &text)
                    .map_err(|e| value_error(e.message(spec.ty)))?;
            }
        }
        Ok(rows)
    }
}

/// A feature's one value as text (EasyRec's fixed-length features of shape 1).
fn one_value(kind: &Kind) -> Result<String, String> {
    let n = match kind {
        Kind::BytesList(l) => l.value.len(),
        Kind::FloatList(l) => l.value.len(),
        Kind::Int64List(l) => l.value.len(),
    };
    if n != 1 {
        return Err(format!("holds {n} values; TFRecord input reads one per field and row"));
    }
    Ok(match kind {
        Kind::BytesList(l) => String::from_utf8(l.value[0].clone()).map_err(|_| "is not UTF-8 text".to_string())?,
        Kind::FloatList(l) => l.value[0].to_string(),
        Kind::Int64List(l) => l.value[0].to_string(),
    })
}

impl Iterator for TfRecordChunks {
    type Item = Result<RawBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut columns = self.projection.empty_columns(self.chunk_rows);
        let mut rows = 0;
        while rows < self.chunk_rows {
            let data = match self.records.next_record() {
                None => {
                    self.done = true;
                    break;
                }
                Some(Err(message)) => {
                    self.done = true;
                    return Some(Err(DataError::Row {
                        file: self.path.clone(),
                        location: format!("record {}", self.record_no),
                        message,
                    }));
                }
                Some(Ok(d)) => d,
            };
            match self.push_record(&data, &mut columns) {
                Ok(n) => rows += n,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            self.record_no += 1;
        }
        (rows > 0).then_some(Ok(RawBatch {
            num_rows: rows,
            columns,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::data_plan::ColumnType;
    use crate::data::ProjColumn;
    use crate::tf_proto::{Feature, Features, FloatList, Int64List};

    fn example(fields: Vec<(&str, Kind)>) -> Vec<u8> {
        let feature = fields
            .into_iter()
            .map(|(n, k)| (n.to_string(), Feature { kind: Some(k) }))
            .collect();
        Example {
            features: Some(Features { feature }),
        }
        .encode_to_vec()
    }

    #[test]
    fn records_round_trip_and_damage_is_found() {
        let mut bytes = Vec::new();
        for r in [&b"one"[..], b"", b"three"] {
            write_record(&mut bytes, r).unwrap();
        }
        let mut rd = RecordReader::new(&bytes[..]);
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| rd.next_record())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, vec![b"one".to_vec(), Vec::new(), b"three".to_vec()]);
        let mut bad = bytes.clone();
        bad[13] ^= 1;
        let err = RecordReader::new(&bad[..]).next_record().unwrap().unwrap_err();
        assert_eq!(err, "byte 0: bad data checksum");
        let short = &bytes[..bytes.len() - 2];
        let mut rd = RecordReader::new(short);
        let errs: Vec<_> = std::iter::from_fn(|| rd.next_record()).collect();
        assert_eq!(errs.last().unwrap().as_ref().unwrap_err(), "byte 35: truncated record");
    }

    #[test]
    fn examples_give_one_value_per_field_or_its_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tfrecord");
        let mut bytes = Vec::new();
        let rows = [
            example(vec![
                ("a", Kind::Int64List(Int64List { value: vec![7] })),
                ("b", Kind::FloatList(FloatList { value: vec![0.5] })),
            ]),
            example(vec![("a", Kind::Int64List(Int64List { value: vec![3] }))]),
        ];
        rows.iter().for_each(|r| write_record(&mut bytes, r).unwrap());
        std::fs::write(&path, &bytes).unwrap();
        let col = |name: &str, ty, default_val: &str| ProjColumn {
            name: name.into(),
            ty,
            default_val: default_val.into(),
            required: false,
        };
        let projection = Projection {
            columns: vec![col("b", ColumnType::Float, "1.5"), col("a", ColumnType::Int, "")],
        };
        let read = |path: &Path, c| {
            TfRecordChunks::open(path, (c, None), &projection, 10)
                .unwrap()
                .collect::<Result<Vec<RawBatch>, _>>()
                .unwrap()
        };
        let want = vec![Column::Float(vec![0.5, 1.5]), Column::Int(vec![7, 3])];
        assert_eq!(read(&path, Compression::None)[0].columns, want);
        // The same records gzip- and zlib-compressed.
        for c in [Compression::Gzip, Compression::Zlib] {
            let packed = dir.path().join(format!("{c:?}"));
            std::fs::write(&packed, compress(&bytes, c)).unwrap();
            assert_eq!(read(&packed, c)[0].columns, want);
        }

        // BatchTFRecordInput: rows in lists; an absent field is its default.
        let lists = |a: Vec<i64>| {
            let feature = a
                .into_iter()
                .map(|v| Feature {
                    kind: Some(Kind::Int64List(Int64List { value: vec![v] })),
                })
                .collect();
            let feature_list = [("a".to_string(), crate::tf_proto::FeatureList { feature })].into();
            SequenceExample {
                context: None,
                feature_lists: Some(crate::tf_proto::FeatureLists { feature_list }),
            }
            .encode_to_vec()
        };
        let batched = dir.path().join("batched");
        let mut b = Vec::new();
        write_record(&mut b, &lists(vec![4, 5, 6])).unwrap();
        write_record(&mut b, &lists(vec![7, 8, 9])).unwrap();
        std::fs::write(&batched, &b).unwrap();
        let got: Vec<RawBatch> = TfRecordChunks::open(&batched, (Compression::None, Some(3)), &projection, 4)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            got[0].columns,
            vec![Column::Float(vec![1.5; 6]), Column::Int(vec![4, 5, 6, 7, 8, 9])]
        );
        let err = TfRecordChunks::open(&batched, (Compression::None, Some(2)), &projection, 4)
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("field `a` holds 3 rows; n_data_batch_tfrecord is 2"),
            "{err}"
        );

        write_record(
            &mut bytes,
            &example(vec![("a", Kind::Int64List(Int64List { value: vec![1, 2] }))]),
        )
        .unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let err = TfRecordChunks::open(&path, (Compression::None, None), &projection, 10)
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("record 2: column `a` holds 2 values"), "{err}");
    }
}
