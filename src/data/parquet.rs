//! Parquet input through arrow-rs: one reader per row group, so errors name
//! the row group and ranks can split files by row group.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::column::{Column, RawBatch, StrColumn};
use super::{DataError, ProjColumn, Projection};
use crate::config::data_plan::ColumnType;

/// A Parquet file read with two bounds the parquet crate's `File` reader
/// lacks: a range asked of `get_bytes` must lie inside the file before its
/// buffer is allocated, and a read past the end is an error rather than
/// zero bytes. The crate's page-header parser skips Thrift fields with
/// `io::copy` and does not check how much it copied: a list header claiming
/// 2^31 elements made it re-read the end of the file that many times
/// (`make fuzz` found a 757-byte file taking 20 s). With an error at the end
/// every element consumes at least one byte, so the work is bounded by the
/// file's length.
/// The most of a remote row group's column chunks fetched ahead at once.
const PREFETCH_MAX_BYTES: u64 = 512 << 20;

#[derive(Clone)]
struct BoundedFile {
    source: std::sync::Arc<Source>,
    len: u64,
    /// Byte ranges fetched ahead from a remote object (a row group's
    /// projected column chunks, in one coalesced request per neighbourhood):
    /// reads inside them are served from memory. Shared by the clones.
    fetched: std::sync::Arc<std::sync::Mutex<Vec<(u64, bytes::Bytes)>>>,
}

/// Where a Parquet file's bytes come from: a local file, or ranged reads of
/// a remote object (the footer, then each projected column chunk of the
/// row groups read: never the whole object).
enum Source {
    Local(File),
    Remote(crate::storage::Object),
}

impl BoundedFile {
    fn open(path: &Path) -> Result<Self, DataError> {
        if crate::storage::is_remote(path) {
            let io = |e: crate::storage::StorageError| DataError::io(path, e.into());
            let object = crate::storage::object(path).map_err(io)?;
            let len = object.size().map_err(io)?.ok_or_else(|| {
                DataError::io(
                    path,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
                )
            })?;
            return Ok(BoundedFile {
                source: std::sync::Arc::new(Source::Remote(object)),
                len,
                fetched: Default::default(),
            });
        }
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
        Ok(BoundedFile {
            source: std::sync::Arc::new(Source::Local(file)),
            len,
            fetched: Default::default(),
        })
    }

    /// Fetches `ranges` of a remote object now, together (the object store
    /// merges near ones into one request and runs the rest in parallel);
    /// nothing for a local file. Ranges outside the file are left to the
    /// reader, which reports them.
    fn prefetch(&self, ranges: Vec<std::ops::Range<u64>>) -> Result<(), crate::storage::StorageError> {
        let Source::Remote(o) = &*self.source else {
            return Ok(());
        };
        let ranges: Vec<_> = ranges
            .into_iter()
            .filter(|r| r.start < r.end && r.end <= self.len)
            .collect();
        // A row group too large to hold is read on demand instead.
        if ranges.iter().map(|r| r.end - r.start).sum::<u64>() > PREFETCH_MAX_BYTES {
            return Ok(());
        }
        let got = o.ranges(ranges.clone())?;
        let mut fetched = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        fetched.clear();
        fetched.extend(ranges.iter().map(|r| r.start).zip(got));
        Ok(())
    }

    /// The fetched bytes from `start` to the end of the range holding it.
    fn fetched_from(&self, start: u64) -> Option<bytes::Bytes> {
        let fetched = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        fetched.iter().find_map(|(at, b)| {
            let off = usize::try_from(start.checked_sub(*at)?).ok()?;
            (off < b.len()).then(|| b.slice(off..))
        })
    }
}

impl ::parquet::file::reader::Length for BoundedFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ::parquet::file::reader::ChunkReader for BoundedFile {
    type T = std::io::BufReader<EndIsAnError>;

    fn get_read(&self, start: u64) -> ::parquet::errors::Result<Self::T> {
        use std::io::{Seek, SeekFrom};
        let inner: Box<dyn std::io::Read + Send> = match &*self.source {
            Source::Local(file) => {
                let mut file = file.try_clone()?;
                file.seek(SeekFrom::Start(start))?;
                Box::new(file)
            }
            Source::Remote(o) => match self.fetched_from(start) {
                // Fetched bytes, then (only if read past them) the object.
                Some(b) => {
                    let end = start + b.len() as u64;
                    let rest = crate::storage::RemoteRead::new(o.clone(), end, self.len);
                    Box::new(std::io::Read::chain(std::io::Cursor::new(b), rest))
                }
                None => Box::new(crate::storage::RemoteRead::new(o.clone(), start, self.len)),
            },
        };
        Ok(std::io::BufReader::new(EndIsAnError(inner)))
    }

    fn get_bytes(&self, start: u64, length: usize) -> ::parquet::errors::Result<bytes::Bytes> {
        let inside = start.checked_add(length as u64).is_some_and(|end| end <= self.len);
        if !inside {
            return Err(::parquet::errors::ParquetError::EOF(format!(
                "bytes {start}..+{length} asked of a file of {}",
                self.len
            )));
        }
        match &*self.source {
            Source::Local(file) => file.get_bytes(start, length),
            Source::Remote(o) => match self.fetched_from(start).filter(|b| b.len() >= length) {
                Some(b) => Ok(b.slice(..length)),
                None => o
                    .range(start..start + length as u64)
                    .map_err(|e| ::parquet::errors::ParquetError::External(Box::new(e))),
            },
        }
    }
}

/// A file whose read at its end fails (`UnexpectedEof`) instead of
/// returning no bytes; see [`BoundedFile`].
struct EndIsAnError(Box<dyn std::io::Read + Send>);

impl std::io::Read for EndIsAnError {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        if n == 0 && !buf.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(n)
    }
}

/// Number of row groups of a Parquet file.
pub fn row_groups(path: &Path) -> Result<usize, DataError> {
    let file = BoundedFile::open(path)?;
    let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| DataError::parquet(path, None, e))?;
    Ok(b.metadata().num_row_groups())
}

/// Reads the projected columns of one row group in chunks.
pub struct ParquetChunks {
    path: PathBuf,
    row_group: usize,
    reader: ParquetRecordBatchReader,
    projection: Projection,
    rows_read: usize,
    /// The reader panicked: it is not asked again.
    reader_failed: bool,
}

impl ParquetChunks {
    pub fn open(path: &Path, row_group: usize, projection: &Projection, chunk_rows: usize) -> Result<Self, DataError> {
        let file = BoundedFile::open(path)?;
        let handle = file.clone();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| DataError::parquet(path, None, e))?;
        let schema = builder.schema().clone();
        let mut roots = Vec::with_capacity(projection.columns.len());
        for c in &projection.columns {
            let idx = schema.index_of(&c.name).map_err(|_| DataError::MissingColumn {
                file: path.to_path_buf(),
                column: c.name.clone(),
            })?;
            check_type(path, c, schema.field(idx).data_type())?;
            roots.push(idx);
        }
        // The leaf columns read: their chunks of this row group are fetched
        // at once from remote storage, and their dictionaries checked.
        let leaves: Vec<usize> = (0..builder.parquet_schema().num_columns())
            .filter(|&i| roots.contains(&builder.parquet_schema().get_column_root_idx(i)))
            .collect();
        if row_group < builder.metadata().num_row_groups() {
            let rg = builder.metadata().row_group(row_group);
            let ranges = leaves
                .iter()
                .filter_map(|&i| {
                    let c = rg.column(i);
                    let start =
                        u64::try_from(c.dictionary_page_offset().unwrap_or_else(|| c.data_page_offset())).ok()?;
                    Some(start..start.checked_add(u64::try_from(c.compressed_size()).ok()?)?)
                })
                .collect();
            handle.prefetch(ranges).map_err(|e| DataError::io(path, e.into()))?;
        }
        check_chunks(path, builder.metadata(), (row_group, &handle), &leaves)?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader = builder
            .with_projection(mask)
            .with_row_groups(vec![row_group])
            .with_batch_size(chunk_rows)
            .build()
            .map_err(|e| DataError::parquet(path, Some(row_group), e))?;
        Ok(ParquetChunks {
            path: path.to_path_buf(),
            row_group,
            reader,
            projection: projection.clone(),
            rows_read: 0,
            reader_failed: false,
        })
    }

    fn convert(&self, batch: &RecordBatch) -> Result<RawBatch, DataError> {
        let mut columns = Vec::with_capacity(self.projection.columns.len());
        for spec in &self.projection.columns {
            let arr = batch
                .column_by_name(&spec.name)
                .expect("projected column present in its batch");
            columns.push(self.column(spec, arr)?);
        }
        Ok(RawBatch {
            num_rows: batch.num_rows(),
            columns,
        })
    }

    fn column(&self, spec: &ProjColumn, arr: &ArrayRef) -> Result<Column, DataError> {
        if let Some(i) = (0..arr.len()).find(|&i| arr.is_null(i)).filter(|_| spec.required) {
            return Err(DataError::Value {
                file: self.path.clone(),
                location: format!("row group {}, row {}", self.row_group, self.rows_read + i),
                column: spec.name.clone(),
                message: "is null, and a label may not be".into(),
            });
        }
        Ok(match arr.data_type() {
            DataType::List(_) | DataType::LargeList(_) => {
                let (offsets, values): (Vec<usize>, ArrayRef) = match arr.data_type() {
                    DataType::List(_) => {
                        let l = arr.as_list::<i32>();
                        (
                            l.value_offsets().iter().map(|o| *o as usize).collect(),
                            l.values().clone(),
                        )
                    }
                    _ => {
                        let l = arr.as_list::<i64>();
                        (
                            l.value_offsets().iter().map(|o| *o as usize).collect(),
                            l.values().clone(),
                        )
                    }
                };
                let inner = ProjColumn {
                    required: false,
                    default_val: String::new(),
                    ..spec.clone()
                };
                let values = self.column(&inner, &values)?;
                let base = offsets[0];
                Column::List {
                    offsets: offsets.iter().map(|o| o - base).collect(),
                    values: Box::new(if base == 0 {
                        values
                    } else {
                        let mut v = values.empty_like();
                        let idx: Vec<usize> = (base..*offsets.last().unwrap()).collect();
                        v.extend_from(&values, &idx);
                        v
                    }),
                }
            }
            _ => {
                let col = scalar(arr, spec).ok_or_else(|| DataError::Value {
                    file: self.path.clone(),
                    location: format!("row group {}", self.row_group),
                    column: spec.name.clone(),
                    message: format!("has type {}, which cannot be read as {:?}", arr.data_type(), spec.ty),
                })?;
                self.whole_numbers(spec, col)?
            }
        })
    }

    /// A floating-point column of a field declared INT32 or INT64 as the
    /// integers it holds; a fraction is refused naming its row, as the
    /// text readers refuse `0.5` in such a field.
    fn whole_numbers(&self, spec: &ProjColumn, col: Column) -> Result<Column, DataError> {
        let Column::Float(values) = &col else {
            return Ok(col);
        };
        if spec.ty != ColumnType::Int {
            return Ok(col);
        }
        if let Some(row) = values.iter().position(|v| v.fract() != 0.0 || !v.is_finite()) {
            return Err(DataError::Value {
                file: self.path.clone(),
                location: format!("row group {}, row {row}", self.row_group),
                column: spec.name.clone(),
                message: format!("`{}` is not a valid Int value", values[row]),
            });
        }
        Ok(Column::Int(values.iter().map(|v| *v as i64).collect()))
    }
}

/// The structural rule the parquet crate asserts (and panics on) when it
/// reads: row group `row_group` exists and each of its column chunks lies,
/// at a start and length that are not negative, inside the file.
fn check_chunks(
    path: &Path,
    meta: &::parquet::file::metadata::ParquetMetaData,
    (row_group, file): (usize, &BoundedFile),
    read: &[usize],
) -> Result<(), DataError> {
    let file_len = file.len;
    let bad = |message: String| DataError::Row {
        file: path.to_path_buf(),
        location: format!("row group {row_group}"),
        message,
    };
    if row_group >= meta.num_row_groups() {
        return Err(bad(format!("the file has {} row groups", meta.num_row_groups())));
    }
    for (i, c) in meta.row_group(row_group).columns().iter().enumerate() {
        let start = c.dictionary_page_offset().unwrap_or_else(|| c.data_page_offset());
        let len = c.compressed_size();
        let inside = u64::try_from(start)
            .ok()
            .zip(u64::try_from(len).ok())
            .and_then(|(s, l)| s.checked_add(l))
            .is_some_and(|end| end <= file_len);
        if !inside {
            return Err(bad(format!(
                "column chunk {i} claims bytes {start}..+{len} of a file of {file_len}: a damaged or crafted file"
            )));
        }
        if read.contains(&i) {
            check_dictionary(file, c, meta.row_group(row_group).num_rows()).map_err(bad)?;
        }
    }
    Ok(())
}

/// A column chunk's dictionary page (its first page, when it has one) holds
/// no more values than its bytes can: the parquet crate sizes the
/// dictionary by the count before decoding a value, so a 1 KB file claiming
/// 2^30 INT64 entries made it write 8 GB (found by `make fuzz`). The page
/// is read here with the crate's own page reader, which does not decode it.
fn check_dictionary(
    file: &BoundedFile,
    c: &::parquet::file::metadata::ColumnChunkMetaData,
    rows: i64,
) -> Result<(), String> {
    use ::parquet::basic::Type;
    use ::parquet::column::page::{Page, PageReader};
    use ::parquet::file::serialized_reader::SerializedPageReader;
    let file = file.clone();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let rows = usize::try_from(rows).unwrap_or(0);
        SerializedPageReader::new(std::sync::Arc::new(file), c, rows, None).and_then(|mut r| r.get_next_page())
    }));
    let Ok(Ok(Some(Page::DictionaryPage { buf, num_values, .. }))) = first else {
        return Ok(()); // another page, or one the reader reports
    };
    let descr = c.column_descr();
    let bits: u64 = match descr.physical_type() {
        Type::BOOLEAN => 1,
        Type::INT32 | Type::FLOAT | Type::BYTE_ARRAY => 32,
        Type::INT64 | Type::DOUBLE => 64,
        Type::INT96 => 96,
        Type::FIXED_LEN_BYTE_ARRAY => 8 * u64::try_from(descr.type_length()).unwrap_or(0).max(1),
    };
    if u64::from(num_values) * bits <= 8 * buf.len() as u64 {
        Ok(())
    } else {
        Err(format!(
            "column `{}`: its dictionary page claims {num_values} values in {} bytes: a damaged or crafted file",
            descr.name(),
            buf.len()
        ))
    }
}

fn check_type(path: &Path, c: &ProjColumn, dt: &DataType) -> Result<(), DataError> {
    let inner = match dt {
        DataType::List(f) | DataType::LargeList(f) => f.data_type(),
        d => d,
    };
    let numeric = inner.is_numeric() || matches!(inner, DataType::Boolean);
    let stringy = matches!(inner, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let ok = match c.ty {
        ColumnType::Float | ColumnType::Int | ColumnType::Bool => numeric,
        ColumnType::Str => numeric || stringy,
    };
    if ok {
        Ok(())
    } else {
        Err(DataError::Value {
            file: path.to_path_buf(),
            location: "schema".into(),
            column: c.name.clone(),
            message: format!("has type {dt}, but data_config.input_fields declares {:?}", c.ty),
        })
    }
}

fn default_f64(spec: &ProjColumn) -> f64 {
    spec.default_val.trim().parse().unwrap_or(0.0)
}

fn scalar(arr: &ArrayRef, spec: &ProjColumn) -> Option<Column> {
    macro_rules! prim {
        ($t:ty, $variant:ident, $conv:expr, $def:expr) => {{
            let a = arr.as_primitive::<$t>();
            let def = $def;
            Column::$variant(
                (0..a.len())
                    .map(|i| if a.is_null(i) { def } else { $conv(a.value(i)) })
                    .collect(),
            )
        }};
    }
    let want_float = spec.ty == ColumnType::Float;
    let col = match arr.data_type() {
        DataType::Float64 => prim!(Float64Type, Float, |v: f64| v, default_f64(spec)),
        DataType::Float32 => prim!(Float32Type, Float, |v: f32| v as f64, default_f64(spec)),
        DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 | DataType::UInt32 | DataType::UInt64
            if want_float =>
        {
            let def = default_f64(spec);
            let vals: Vec<f64> = match arr.data_type() {
                DataType::Int64 => prim_vals::<Int64Type>(arr, def, |v| v as f64),
                DataType::Int32 => prim_vals::<Int32Type>(arr, def, |v| v as f64),
                DataType::Int16 => prim_vals::<Int16Type>(arr, def, |v| v as f64),
                DataType::Int8 => prim_vals::<Int8Type>(arr, def, |v| v as f64),
                DataType::UInt32 => prim_vals::<UInt32Type>(arr, def, |v| v as f64),
                _ => prim_vals::<UInt64Type>(arr, def, |v| v as f64),
            };
            Column::Float(vals)
        }
        DataType::Int64 => prim!(Int64Type, Int, |v: i64| v, default_f64(spec) as i64),
        DataType::Int32 => prim!(Int32Type, Int, |v: i32| v as i64, default_f64(spec) as i64),
        DataType::Int16 => prim!(Int16Type, Int, |v: i16| v as i64, default_f64(spec) as i64),
        DataType::Int8 => prim!(Int8Type, Int, |v: i8| v as i64, default_f64(spec) as i64),
        DataType::UInt32 => prim!(UInt32Type, Int, |v: u32| v as i64, default_f64(spec) as i64),
        DataType::UInt64 => prim!(UInt64Type, Int, |v: u64| v as i64, default_f64(spec) as i64),
        DataType::Boolean => {
            let a = arr.as_boolean();
            Column::Int((0..a.len()).map(|i| (!a.is_null(i) && a.value(i)) as i64).collect())
        }
        DataType::Utf8 => strings(
            arr.len(),
            |i| (!arr.is_null(i)).then(|| arr.as_string::<i32>().value(i)),
            spec,
        ),
        DataType::LargeUtf8 => strings(
            arr.len(),
            |i| (!arr.is_null(i)).then(|| arr.as_string::<i64>().value(i)),
            spec,
        ),
        DataType::Utf8View => strings(
            arr.len(),
            |i| (!arr.is_null(i)).then(|| arr.as_string_view().value(i)),
            spec,
        ),
        _ => return None,
    };
    Some(match (col, want_float) {
        (Column::Str(s), true) => {
            let mut v = Vec::with_capacity(s.len());
            for i in 0..s.len() {
                v.push(s.get(i).trim().parse().ok()?);
            }
            Column::Float(v)
        }
        (c, _) => c,
    })
}

fn prim_vals<T: arrow_array::types::ArrowPrimitiveType>(
    arr: &ArrayRef,
    def: f64,
    f: impl Fn(T::Native) -> f64,
) -> Vec<f64> {
    let a = arr.as_primitive::<T>();
    (0..a.len())
        .map(|i| if a.is_null(i) { def } else { f(a.value(i)) })
        .collect()
}

fn strings<'a>(n: usize, get: impl Fn(usize) -> Option<&'a str>, spec: &ProjColumn) -> Column {
    let mut s = StrColumn::new();
    for i in 0..n {
        s.push(get(i).unwrap_or(&spec.default_val));
    }
    Column::Str(s)
}

impl Iterator for ParquetChunks {
    type Item = Result<RawBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.reader_failed {
            return None;
        }
        // The parquet crate panics on some malformed pages (a division by
        // zero in its byte-array decoder, found by `make fuzz`): a file it
        // cannot decode is the user's damaged file, refused naming it.
        let reader = &mut self.reader;
        let next = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next())) {
            Ok(next) => next?,
            Err(panic) => {
                let what = crate::util::panic_message(&*panic);
                self.reader_failed = true;
                return Some(Err(DataError::Row {
                    file: self.path.clone(),
                    location: format!("row group {}", self.row_group),
                    message: format!("cannot be decoded (the Parquet reader failed: {what})"),
                }));
            }
        };
        let batch = match next {
            Ok(b) => b,
            Err(e) => return Some(Err(DataError::arrow(&self.path, self.row_group, e))),
        };
        let out = self.convert(&batch);
        self.rows_read += batch.num_rows();
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Float64Array, RecordBatch};
    use arrow_schema::{Field, Schema};
    use std::sync::Arc;

    fn read(values: Vec<f64>) -> Result<Vec<RawBatch>, DataError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("label", DataType::Float64, false)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Float64Array::from(values))]).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let projection = Projection {
            columns: vec![ProjColumn {
                name: "label".into(),
                ty: ColumnType::Int,
                default_val: String::new(),
                required: true,
            }],
        };
        ParquetChunks::open(&path, 0, &projection, 10).unwrap().collect()
    }

    #[test]
    fn a_fraction_in_a_field_declared_int_is_refused_as_csv_refuses_it() {
        let got = read(vec![1.0, 0.0]).unwrap();
        assert_eq!(got[0].columns[0], Column::Int(vec![1, 0]));
        let err = read(vec![1.0, 0.5]).unwrap_err().to_string();
        assert!(
            err.contains("row 1") && err.contains("`label`") && err.contains("0.5"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod found_by_fuzzing {
    use super::*;

    /// The fuzz target's projection: a required int label and a string.
    fn label_and_user() -> Projection {
        let column = |name: &str, ty, required| ProjColumn {
            name: name.into(),
            ty,
            default_val: String::new(),
            required,
        };
        Projection {
            columns: vec![
                column("label", ColumnType::Int, true),
                column("user", ColumnType::Str, false),
            ],
        }
    }

    /// Reads the first 16 row groups of `tests/data/fuzz/<name>` as the
    /// fuzz target does; returns the row groups and the errors, each of
    /// which must name the file.
    fn read_fuzz_file(name: &str) -> (usize, Vec<String>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz").join(name);
        let projection = label_and_user();
        let groups = row_groups(&path).unwrap();
        let errors: Vec<String> = (0..groups.min(16))
            .filter_map(|g| {
                ParquetChunks::open(&path, g, &projection, 64)
                    .and_then(|c| c.collect::<Result<Vec<_>, _>>())
                    .err()
            })
            .map(|e| e.to_string())
            .collect();
        for e in &errors {
            assert!(e.contains(name), "{e}");
        }
        (groups, errors)
    }

    #[test]
    fn a_page_the_parquet_crate_panics_on_is_an_error_naming_the_file() {
        let (groups, errors) = read_fuzz_file("parquet_zero_divisor.parquet");
        assert!(groups > 0);
        assert!(!errors.is_empty());
    }

    #[test]
    fn a_column_chunk_at_a_negative_offset_is_an_error_not_a_panic() {
        // `make fuzz` found it: the parquet crate asserts on it while reading.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz/parquet_negative_chunk.parquet");
        let projection = Projection {
            columns: vec![ProjColumn {
                name: "label".into(),
                ty: ColumnType::Int,
                default_val: String::new(),
                required: true,
            }],
        };
        let groups = row_groups(&path).unwrap();
        assert!(groups > 0);
        for g in 0..groups {
            let read = ParquetChunks::open(&path, g, &projection, 64).and_then(|c| c.collect::<Result<Vec<_>, _>>());
            let err = read.unwrap_err().to_string();
            assert!(err.contains("parquet_negative_chunk.parquet"), "{err}");
        }
    }

    #[test]
    fn thrift_skips_past_the_end_of_a_file_fail_at_its_end() {
        // `make fuzz` found it: a page header whose skipped list claims 2^31
        // elements re-read the end of a 757-byte file for 20 s.
        let (_, errors) = read_fuzz_file("parquet_skip_past_end.parquet");
        assert!(!errors.is_empty());
    }

    #[test]
    fn a_bounded_file_refuses_ranges_and_reads_beyond_its_end() {
        use ::parquet::file::reader::ChunkReader;
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let f = BoundedFile::open(&path).unwrap();
        assert_eq!(&f.get_bytes(2, 8).unwrap()[..], b"23456789");
        assert!(f.get_bytes(2, 9).is_err());
        assert!(f.get_bytes(u64::MAX, 2).is_err());
        let mut r = f.get_read(8).unwrap();
        let mut two = [0u8; 2];
        r.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"89");
        assert_eq!(r.read(&mut two).unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_dictionary_claiming_more_values_than_its_bytes_is_refused() {
        // `make fuzz` found it: 2^30 INT64 entries claimed in a 1 KB file.
        let (_, errors) = read_fuzz_file("parquet_huge_dictionary.parquet");
        assert!(
            errors.iter().any(|e| e.contains("dictionary page claims")),
            "{errors:?}"
        );
    }
}
