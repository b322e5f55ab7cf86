//! Input: files -> chunks of raw columns (CSV or Parquet) -> shuffled,
//! fixed-size batches of raw rows, read on a background thread.

pub mod column;
pub mod criteo;
pub mod csv;
pub mod kafka;
pub mod parquet;
mod paths;
pub mod sampler;
pub mod tfrecord;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

pub use column::{Column, RawBatch, StrColumn};
pub use paths::expand_paths;

use crate::config::data_plan::{ColumnType, InputField, InputFormat};
use crate::util::Rng;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: column `{column}` is missing", file.display())]
    MissingColumn { file: PathBuf, column: String },
    #[error("{}: {location}: column `{column}` {message}", file.display())]
    Value {
        file: PathBuf,
        location: String,
        column: String,
        message: String,
    },
    /// A row that is wrong as a whole (not one column's value).
    #[error("{}: {location}: {message}", file.display())]
    Row {
        file: PathBuf,
        location: String,
        message: String,
    },
    #[error("{}{}: not a readable Parquet file", path.display(), row_group.map(|r| format!(": row group {r}")).unwrap_or_default())]
    Parquet {
        path: PathBuf,
        row_group: Option<usize>,
        #[source]
        source: ::parquet::errors::ParquetError,
    },
    #[error("{}: row group {row_group}: cannot decode", path.display())]
    Arrow {
        path: PathBuf,
        row_group: usize,
        #[source]
        source: arrow_schema::ArrowError,
    },
    #[error("no input files match `{0}`")]
    NoFiles(String),
    /// A remote input path that cannot be listed.
    #[error("{0}")]
    Remote(String),
    #[error("input path `{pattern}` is not a valid glob pattern: {message}")]
    BadPattern { pattern: String, message: String },
    /// Input files that hold no rows at all.
    #[error("the {purpose} input ({}) holds no rows", paths.join(", "))]
    Empty { purpose: &'static str, paths: Vec<String> },
}

/// Files that cannot be read or hold bad rows: the user's to fix.
impl crate::error::Classified for DataError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

impl DataError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    fn parquet(path: &Path, row_group: Option<usize>, source: ::parquet::errors::ParquetError) -> Self {
        DataError::Parquet {
            path: path.to_path_buf(),
            row_group,
            source,
        }
    }
    fn arrow(path: &Path, row_group: usize, source: arrow_schema::ArrowError) -> Self {
        DataError::Arrow {
            path: path.to_path_buf(),
            row_group,
            source,
        }
    }
}

/// A column the model reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjColumn {
    pub name: String,
    pub ty: ColumnType,
    pub default_val: String,
    /// Nulls are an error (labels).
    pub required: bool,
}

/// Why a cell's text was not appended.
#[derive(Debug, Clone, PartialEq)]
pub enum CellError {
    /// Empty in a required column without a default_val.
    EmptyRequired,
    /// The text (after default substitution) is not a value of the column's type.
    Invalid(String),
}

impl CellError {
    /// What is wrong with the cell of a column of type `ty`, as the
    /// readers name it after the file, row and column.
    pub fn message(&self, ty: ColumnType) -> String {
        match self {
            CellError::EmptyRequired => "is empty and has no default_val".into(),
            CellError::Invalid(v) => format!("`{v}` is not a valid {ty:?} value"),
        }
    }
}

impl ProjColumn {
    /// Appends a cell given as text to `col`, as every reader of text reads
    /// it: an empty cell is the field's default_val, which a required field
    /// must have.
    pub fn push_cell(&self, col: &mut Column, raw: &str) -> Result<(), CellError> {
        if raw.is_empty() && self.required && self.default_val.is_empty() {
            return Err(CellError::EmptyRequired);
        }
        let v = if raw.is_empty() { self.default_val.as_str() } else { raw };
        if col.push_text(v, self.ty) {
            Ok(())
        } else {
            Err(CellError::Invalid(v.to_string()))
        }
    }
}

/// The columns to read, in the order batches carry them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Projection {
    pub columns: Vec<ProjColumn>,
}

impl Projection {
    /// One empty column per projected column, room for `rows`.
    pub fn empty_columns(&self, rows: usize) -> Vec<Column> {
        self.columns.iter().map(|c| Column::of_type(c.ty, rows)).collect()
    }

    /// Adds `name` (declared in `fields`) unless present; returns its index.
    pub fn add(&mut self, name: &str, fields: &[InputField], required: bool) -> Option<usize> {
        if let Some(i) = self.columns.iter().position(|c| c.name == name) {
            self.columns[i].required |= required;
            return Some(i);
        }
        let f = fields.iter().find(|f| f.name == name)?;
        self.columns.push(ProjColumn {
            name: name.to_string(),
            ty: f.ty,
            default_val: f.default_val.clone(),
            required,
        });
        Some(self.columns.len() - 1)
    }
}

/// The dense and category files of binary part `label`: the files at its
/// position in the sorted expansion of its part's globs.
fn companions(parts: &[crate::config::data_plan::BinaryPart], label: &Path) -> Result<(PathBuf, PathBuf), DataError> {
    for part in parts {
        let labels = expand_paths(std::slice::from_ref(&part.label))?;
        let Some(i) = labels.iter().position(|l| l == label) else {
            continue;
        };
        let dense = expand_paths(std::slice::from_ref(&part.dense))?;
        let category = expand_paths(std::slice::from_ref(&part.category))?;
        if dense.len() != labels.len() || category.len() != labels.len() {
            return Err(DataError::Row {
                file: label.to_path_buf(),
                location: "binary input".into(),
                message: format!(
                    "`{}`, `{}` and `{}` match {}, {} and {} files: they must match up",
                    part.label,
                    part.dense,
                    part.category,
                    labels.len(),
                    dense.len(),
                    category.len()
                ),
            });
        }
        return Ok((dense[i].clone(), category[i].clone()));
    }
    Err(DataError::Row {
        file: label.to_path_buf(),
        location: "binary input".into(),
        message: "is no label file of binary_train_input or binary_eval_input".into(),
    })
}

/// One unit of reading: a CSV file or one Parquet row group.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub path: PathBuf,
    pub row_group: Option<usize>,
}

/// What to read and how.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub files: Vec<PathBuf>,
    pub format: InputFormat,
    /// All declared input fields (CSV column order).
    pub fields: Vec<InputField>,
    pub projection: Projection,
    pub batch_size: usize,
    /// `None` = repeat forever.
    pub epochs: Option<u32>,
    pub shuffle: bool,
    pub shuffle_buffer: usize,
    pub seed: u64,
    /// This reader's share: (rank, world size). Splits are dealt round-robin.
    pub shard: (usize, usize),
    /// Batches to skip at the start (resuming at a global step).
    pub skip_batches: u64,
    /// Stop after this many rows (0 = no limit).
    pub max_rows: u64,
}

impl StreamSpec {
    /// The splits this reader owns, in file order.
    pub fn splits(&self) -> Result<Vec<Split>, DataError> {
        let mut all = Vec::new();
        for f in &self.files {
            match self.format {
                InputFormat::Csv { .. }
                | InputFormat::Rtp { .. }
                | InputFormat::TfRecord { .. }
                | InputFormat::CriteoBinary { .. } => all.push(Split {
                    path: f.clone(),
                    row_group: None,
                }),
                InputFormat::Parquet { .. } => {
                    for rg in 0..parquet::row_groups(f)? {
                        all.push(Split {
                            path: f.clone(),
                            row_group: Some(rg),
                        })
                    }
                }
            }
        }
        let (rank, size) = self.shard;
        Ok(all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % size == rank)
            .map(|(_, s)| s)
            .collect())
    }

    fn open(
        &self,
        split: &Split,
        chunk_rows: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RawBatch, DataError>>>, DataError> {
        Ok(match (&self.format, split.row_group) {
            (InputFormat::Csv { separator, with_header }, _) => {
                let names: Vec<String> = self.fields.iter().map(|f| f.name.clone()).collect();
                Box::new(csv::CsvChunks::open(
                    &split.path,
                    separator,
                    *with_header,
                    &names,
                    &self.projection,
                    chunk_rows,
                )?)
            }
            (InputFormat::Rtp { separator, layout }, _) => {
                let names: Vec<String> = self.fields.iter().map(|f| f.name.clone()).collect();
                Box::new(csv::CsvChunks::open_rtp(
                    &split.path,
                    separator,
                    layout,
                    &names,
                    &self.projection,
                    chunk_rows,
                )?)
            }
            (InputFormat::Parquet { .. }, Some(rg)) => Box::new(parquet::ParquetChunks::open(
                &split.path,
                rg,
                &self.projection,
                chunk_rows,
            )?),
            (InputFormat::Parquet { .. }, None) => unreachable!("parquet splits carry a row group"),
            (
                InputFormat::TfRecord {
                    compression,
                    rows_per_record,
                },
                _,
            ) => Box::new(tfrecord::TfRecordChunks::open(
                &split.path,
                (*compression, *rows_per_record),
                &self.projection,
                chunk_rows,
            )?),
            (InputFormat::CriteoBinary { parts }, _) => {
                let (dense, category) = companions(parts, &split.path)?;
                Box::new(criteo::CriteoChunks::open(
                    (&split.path, &dense, &category),
                    &self.projection,
                    chunk_rows,
                )?)
            }
        })
    }

    /// Runs the whole stream on the calling thread, calling `emit` per batch
    /// until it returns false.
    ///
    /// With `shuffle`, the splits of each epoch come in a random order and
    /// rows pass through TensorFlow's shuffle buffer (EasyRec's
    /// `dataset.shuffle(shuffle_buffer_size)` before `repeat`): each row out
    /// is drawn from the next `shuffle_buffer` rows read, and the buffer is
    /// drained at the end of every epoch. A small buffer keeps the file's
    /// order nearly as it is, as in EasyRec.
    pub fn run(&self, emit: impl FnMut(RawBatch) -> bool) -> Result<(), DataError> {
        let splits = self.splits()?;
        let chunk_rows = self.shuffle_buffer.max(self.batch_size).max(4096);
        let mut out = Batcher {
            batch_size: self.batch_size,
            max_rows: self.max_rows,
            pending: None,
            skip: self.skip_batches,
            rows_out: 0,
            emit,
        };
        let mut epoch: u32 = 0;
        while self.epochs.is_none_or(|e| epoch < e) {
            let mut order: Vec<usize> = (0..splits.len()).collect();
            let mut rng = Rng::new(self.seed ^ (0x5eed_0000 + epoch as u64));
            if self.shuffle {
                rng.shuffle(&mut order);
            }
            let mut any = false;
            // Rows read and not yet drawn from the shuffle buffer.
            let mut held: Option<RawBatch> = None;
            let mut ahead: Option<(usize, OpenAhead)> = None;
            for (pos, &si) in order.iter().enumerate() {
                let chunks = match ahead.take() {
                    Some((s, opening)) if s == si => opening.wait()?,
                    _ => self.open(&splits[si], chunk_rows)?,
                };
                // The next remote row group is fetched while this one is read.
                if let Some(&next) = order.get(pos + 1) {
                    ahead =
                        OpenAhead::start(&self.format, &splits[next], &self.projection, chunk_rows).map(|o| (next, o));
                }
                for chunk in chunks {
                    let chunk = chunk?;
                    any |= chunk.num_rows > 0;
                    if !self.shuffle {
                        let rows: Vec<usize> = (0..chunk.num_rows).collect();
                        if !out.push(&chunk, &rows) {
                            return Ok(());
                        }
                        continue;
                    }
                    // The buffer's rows, then the chunk's: each row is copied
                    // once into its batch, never into a window of both.
                    let before = held.as_ref().map_or(0, |h| h.num_rows);
                    let n = before + chunk.num_rows;
                    let (drawn, kept) = shuffle_buffer_order(n, self.shuffle_buffer, false, &mut rng);
                    if !in_runs((held.as_ref(), &chunk), &drawn, |src, rows| out.push(src, rows)) {
                        return Ok(());
                    }
                    let mut next = chunk.empty_like();
                    in_runs((held.as_ref(), &chunk), &kept, |src, rows| {
                        next.extend_from(src, rows);
                        true
                    });
                    held = Some(next);
                }
            }
            if let Some(h) = held.take() {
                let (drawn, _) = shuffle_buffer_order(h.num_rows, self.shuffle_buffer, true, &mut rng);
                if !out.push(&h, &drawn) {
                    return Ok(());
                }
            }
            if !any {
                break;
            }
            epoch += 1;
        }
        out.finish();
        Ok(())
    }
}

/// The order in which TensorFlow's shuffle buffer of `buffer` rows gives
/// out rows `0..n` read in order: each row out is drawn at random from the
/// buffer and its place taken by the next row read. Returns the rows given
/// out and, unless this is the `last` of the input (then the buffer is
/// drained at random), the rows still in the buffer, in its order.
fn shuffle_buffer_order(n: usize, buffer: usize, last: bool, rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let size = buffer.max(1).min(n);
    let mut held: Vec<usize> = (0..size).collect();
    let mut drawn = Vec::with_capacity(n);
    for next in size..n {
        let j = rng.below(held.len() as u64) as usize;
        drawn.push(held[j]);
        held[j] = next;
    }
    if last {
        while !held.is_empty() {
            let j = rng.below(held.len() as u64) as usize;
            drawn.push(held.swap_remove(j));
        }
    }
    (drawn, held)
}

/// Rows `rows` of `held` then `chunk` (an index past `held`'s rows is
/// `chunk`'s) handed to `f` in order, in runs from one of the two; false
/// once `f` returns false.
fn in_runs(
    (held, chunk): (Option<&RawBatch>, &RawBatch),
    rows: &[usize],
    mut f: impl FnMut(&RawBatch, &[usize]) -> bool,
) -> bool {
    let before = held.map_or(0, |h| h.num_rows);
    let mut run: Vec<usize> = Vec::new();
    let mut from_held = false;
    for &r in rows {
        let h = r < before;
        if h != from_held && !run.is_empty() {
            let src = if from_held { held.expect("held rows") } else { chunk };
            if !f(src, &run) {
                return false;
            }
            run.clear();
        }
        from_held = h;
        run.push(if h { r } else { r - before });
    }
    if run.is_empty() {
        return true;
    }
    f(if from_held { held.expect("held rows") } else { chunk }, &run)
}

/// Rows gathered into batches of `batch_size` for `emit`, after skipping
/// `skip` batches (a resumed job) and up to `max_rows` rows in all.
struct Batcher<F: FnMut(RawBatch) -> bool> {
    batch_size: usize,
    max_rows: u64,
    pending: Option<RawBatch>,
    skip: u64,
    /// Rows in the batches handed on or skipped.
    rows_out: u64,
    emit: F,
}

impl<F: FnMut(RawBatch) -> bool> Batcher<F> {
    /// Adds `rows` of `src`; false once `emit` or the row limit stops the stream.
    fn push(&mut self, src: &RawBatch, rows: &[usize]) -> bool {
        let mut at = 0;
        while at < rows.len() {
            let p = self.pending.get_or_insert_with(|| src.empty_like());
            let mut take = (self.batch_size - p.num_rows).min(rows.len() - at);
            if self.max_rows > 0 {
                take = take.min((self.max_rows - self.rows_out - p.num_rows as u64) as usize);
            }
            p.extend_from(src, &rows[at..at + take]);
            at += take;
            let limit_hit = self.max_rows > 0 && self.rows_out + p.num_rows as u64 >= self.max_rows;
            if p.num_rows == self.batch_size || limit_hit {
                let b = self.pending.take().expect("pending batch");
                if !self.hand_on(b) || limit_hit {
                    return false;
                }
            }
        }
        true
    }

    fn hand_on(&mut self, b: RawBatch) -> bool {
        self.rows_out += b.num_rows as u64;
        if self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        (self.emit)(b)
    }

    /// Hands on the last, partial batch.
    fn finish(&mut self) {
        if let Some(b) = self.pending.take().filter(|b| b.num_rows > 0) {
            self.hand_on(b);
        }
    }
}

/// A remote Parquet row group opened on a thread of its own (its footer
/// read and its projected column chunks fetched) while the reader decodes
/// the one before: the network's wait overlaps the decoding. Local files
/// and other formats open when their turn comes.
struct OpenAhead(JoinHandle<Result<parquet::ParquetChunks, DataError>>);

impl OpenAhead {
    fn start(format: &InputFormat, split: &Split, projection: &Projection, chunk_rows: usize) -> Option<Self> {
        let (InputFormat::Parquet { .. }, Some(rg)) = (format, split.row_group) else {
            return None;
        };
        if !crate::storage::is_remote(&split.path) {
            return None;
        }
        let (path, projection) = (split.path.clone(), projection.clone());
        std::thread::Builder::new()
            .name("parquet-ahead".into())
            .spawn(move || parquet::ParquetChunks::open(&path, rg, &projection, chunk_rows))
            .ok()
            .map(OpenAhead)
    }

    fn wait(self) -> Result<Box<dyn Iterator<Item = Result<RawBatch, DataError>>>, DataError> {
        match self.0.join() {
            Ok(opened) => Ok(Box::new(opened?)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Batches produced on a background thread, `depth` ahead of the consumer.
pub struct Prefetch<T> {
    rx: Receiver<Result<T, anyhow::Error>>,
    handle: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Prefetch<T> {
    /// Streams `spec`, mapping each raw batch through `map` on the reader thread.
    pub fn start(
        spec: StreamSpec,
        depth: usize,
        mut map: impl FnMut(RawBatch) -> anyhow::Result<T> + Send + 'static,
    ) -> Self {
        Self::spawn(depth, move |send| {
            spec.run(|raw| send(map(raw)))?;
            Ok(())
        })
    }

    /// Runs `produce` on a reader thread; it hands each item to the
    /// function it is given, which returns false once the consumer is gone
    /// or the item was an error (then `produce` should return).
    pub fn spawn(
        depth: usize,
        produce: impl FnOnce(&mut dyn FnMut(anyhow::Result<T>) -> bool) -> anyhow::Result<()> + Send + 'static,
    ) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("reader".into())
            .spawn(move || {
                // A panic here (a bug, ours or a reader crate's, on some
                // malformed file) would close the channel and read as the
                // end of the data: it is sent on as an error instead.
                let read = std::panic::AssertUnwindSafe(|| {
                    let mut send = |item: anyhow::Result<T>| {
                        let failed = item.is_err();
                        tx.send(item).is_ok() && !failed
                    };
                    if let Err(e) = produce(&mut send) {
                        let _ = tx.send(Err(e));
                    }
                });
                if let Err(panic) = std::panic::catch_unwind(read) {
                    let what = crate::util::panic_message(&*panic);
                    let _ = tx.send(Err(anyhow::anyhow!(
                        "the input reader failed (an internal error): {what}"
                    )));
                }
            })
            .expect("spawn reader thread");
        Prefetch {
            rx,
            handle: Some(handle),
        }
    }
}

impl<T> Iterator for Prefetch<T> {
    type Item = Result<T, anyhow::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rx.recv().ok()
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        // Unblock the reader by dropping the receiver side first.
        let (_, dead) = sync_channel(1);
        let rx = std::mem::replace(&mut self.rx, dead);
        drop(rx);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of CSV file `path` holding one int column `a`: batches of
    /// one row, one epoch, in file order.
    fn int_column_stream(path: &Path, with_header: bool) -> StreamSpec {
        let fields = vec![InputField {
            name: "a".into(),
            ty: ColumnType::Int,
            default_val: String::new(),
        }];
        let mut projection = Projection::default();
        projection.add("a", &fields, false);
        StreamSpec {
            files: vec![path.to_path_buf()],
            format: InputFormat::Csv {
                separator: ",".into(),
                with_header,
            },
            fields,
            projection,
            batch_size: 1,
            epochs: Some(1),
            shuffle: false,
            shuffle_buffer: 1,
            seed: 0,
            shard: (0, 1),
            skip_batches: 0,
            max_rows: 0,
        }
    }

    #[test]
    fn a_reader_that_panics_ends_in_an_error_not_the_end_of_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.csv");
        std::fs::write(&path, "a\n1\n2\n").unwrap();
        let spec = int_column_stream(&path, true);
        let mut batches = Prefetch::start(spec, 2, |raw| -> anyhow::Result<usize> {
            assert!(raw.num_rows == 0, "a reader bug");
            Ok(raw.num_rows)
        });
        let err = batches.next().expect("an item, not the end").unwrap_err();
        assert!(err.to_string().contains("input reader failed"), "{err}");
    }

    #[test]
    fn globs_match_names_and_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for f in [
            "part-0001.parquet",
            "part-0002.parquet",
            "part-0001.csv",
            ".part-9.parquet",
            "sub/deep/part-3.parquet",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let names = |pat: &str| -> Vec<String> {
            expand_paths(&[root.join(pat).to_string_lossy().into_owned()])
                .unwrap()
                .iter()
                .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(names("part-*.parquet"), ["part-0001.parquet", "part-0002.parquet"]);
        assert_eq!(names("part-000?.csv"), ["part-0001.csv"]);
        assert_eq!(names("**/*.parquet").len(), 3, "{:?}", names("**/*.parquet"));
        // A directory lists only its own files: none here, named as such.
        let none = expand_paths(&[root.join("sub").to_string_lossy().into_owned()]).unwrap_err();
        assert!(matches!(none, DataError::NoFiles(_)), "{none}");
        let bad = expand_paths(&[root.join("a***b").to_string_lossy().into_owned()]).unwrap_err();
        assert!(matches!(bad, DataError::BadPattern { .. }), "{bad}");
    }

    /// `.gz` CSV files are read through gzip, as EasyRec's CSVInput does.
    #[test]
    fn gzip_csv_files_read_like_plain_ones() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let text = "1,a\n0,b\n1,c\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text.as_bytes()).unwrap();
        std::fs::write(dir.path().join("x.csv.gz"), gz.finish().unwrap()).unwrap();
        std::fs::write(dir.path().join("x.csv"), text).unwrap();
        let fields = [("label", ColumnType::Int), ("c", ColumnType::Str)].map(|(n, ty)| InputField {
            name: n.into(),
            ty,
            default_val: String::new(),
        });
        let mut projection = Projection::default();
        projection.add("c", &fields, false);
        projection.add("label", &fields, true);
        let read = |name: &str| {
            let names: Vec<String> = fields.iter().map(|f| f.name.clone()).collect();
            csv::CsvChunks::open(&dir.path().join(name), ",", false, &names, &projection, 10)
                .unwrap()
                .collect::<Result<Vec<RawBatch>, _>>()
                .unwrap()
        };
        assert_eq!(read("x.csv.gz"), read("x.csv"));
        assert_eq!(read("x.csv.gz")[0].num_rows, 3);
    }

    #[test]
    fn the_shuffle_buffer_draws_each_row_from_the_next_rows_read() {
        let mut rng = Rng::new(7);
        // A buffer of one keeps the order.
        assert_eq!(shuffle_buffer_order(5, 1, true, &mut rng).0, [0, 1, 2, 3, 4]);
        let (drawn, kept) = shuffle_buffer_order(100, 8, false, &mut rng);
        assert_eq!((drawn.len(), kept.len()), (92, 8));
        // The i-th row out was read among the first i + 8.
        assert!(drawn.iter().enumerate().all(|(i, &r)| r < i + 8), "{drawn:?}");
        let mut all: Vec<usize> = drawn.iter().chain(&kept).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert_ne!(drawn, (0..92).collect::<Vec<_>>());
        // Fewer rows than the buffer: all held, or all drawn at the end.
        assert_eq!(shuffle_buffer_order(3, 8, false, &mut rng), (vec![], vec![0, 1, 2]));
        let mut last = shuffle_buffer_order(3, 8, true, &mut rng).0;
        last.sort_unstable();
        assert_eq!(last, [0, 1, 2]);
    }

    /// The stream's shuffle is EasyRec's: a buffer of `shuffle_buffer_size`
    /// rows carried across chunks and files, drained at each epoch's end.
    #[test]
    fn a_shuffled_stream_keeps_rows_near_their_place_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let rows = 10_000;
        let path = dir.path().join("x.csv");
        let text: String = (0..rows).map(|i| format!("{i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let read = |buffer: usize, seed: u64| {
            let spec = StreamSpec {
                batch_size: 300,
                epochs: Some(2),
                shuffle: true,
                shuffle_buffer: buffer,
                seed,
                ..int_column_stream(&path, false)
            };
            let mut out = Vec::new();
            spec.run(|b| {
                let Column::Int(v) = &b.columns[0] else { panic!("ints") };
                out.extend(v.iter().copied());
                true
            })
            .unwrap();
            out
        };
        let got = read(32, 1);
        assert_eq!(got.len(), 2 * rows);
        for epoch in got.chunks(rows) {
            let mut sorted = epoch.to_vec();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..rows as i64).collect::<Vec<_>>(),
                "each epoch holds every row once"
            );
            assert!(
                epoch.iter().enumerate().all(|(i, &r)| (r as usize) < i + 32),
                "drawn from the next 32"
            );
            assert_ne!(epoch, sorted.as_slice());
        }
        assert_ne!(got[..rows], got[rows..], "each epoch is shuffled again");
        assert_eq!(got, read(32, 1), "one seed, one order");
        assert_ne!(got, read(32, 2));
        // A buffer as large as the data mixes rows from its whole length.
        let wide = read(rows, 1);
        assert!(wide[..100].iter().any(|&r| r > 5000), "{:?}", &wide[..100]);
    }

    #[test]
    fn pathological_globs_end_quickly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a".repeat(200)), "x").unwrap();
        let t = std::time::Instant::now();
        let pat = dir.path().join("*a*a*a*a*a*a*a*a*b").to_string_lossy().into_owned();
        assert!(matches!(expand_paths(&[pat]), Err(DataError::NoFiles(_))));
        // A backtracking matcher takes minutes here; a linear one, microseconds.
        assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
        let stars = dir.path().join("*".repeat(200_000)).to_string_lossy().into_owned();
        assert!(expand_paths(&[stars]).is_err());
    }
}
