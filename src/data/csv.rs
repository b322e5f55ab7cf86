//! CSVInput: one record per line, columns in `input_fields` order, split on
//! `data_config.separator`; empty values take the field's default. RTPInput:
//! one record per line as well, its columns split on `rtp_separator`, the
//! labels in some of them and every other field in one column of its own,
//! split on `separator` (`RtpLayout`). Files named `*.gz` are gzip, as
//! EasyRec's CSVInput reads them.

use std::io::{BufRead, BufReader, Cursor};
use std::path::{Path, PathBuf};

use super::column::RawBatch;
use super::{DataError, Projection};
use crate::config::data_plan::RtpLayout;

/// Lines of CSV text: a file's, or text in memory.
type Lines = Box<dyn Iterator<Item = std::io::Result<String>> + Send>;

/// The longest line read: far beyond any row of features, and a bound on
/// what a file without line breaks (or a crafted one) makes us hold.
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// `BufRead::lines` that refuses a line longer than `MAX_LINE_BYTES`
/// instead of growing a string to the size of the file.
struct BoundedLines<R> {
    inner: R,
    done: bool,
}

impl<R: std::io::BufRead> Iterator for BoundedLines<R> {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::io::Read;
        if self.done {
            return None;
        }
        let mut buf = Vec::new();
        match (&mut self.inner).take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut buf) {
            Ok(0) => {
                self.done = true;
                None
            }
            Ok(_) if buf.len() as u64 > MAX_LINE_BYTES => {
                self.done = true;
                Some(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a line longer than {MAX_LINE_BYTES} bytes"),
                )))
            }
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                Some(String::from_utf8(buf).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8")
                }))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

fn bounded_lines<R: std::io::BufRead + Send + 'static>(inner: R) -> Lines {
    Box::new(BoundedLines { inner, done: false })
}

/// How a row's fields are laid out.
struct Layout<'a> {
    separator: &'a str,
    with_header: bool,
    field_names: &'a [String],
    declared_by: &'static str,
}

/// Reads a CSV file in chunks of `chunk_rows` rows.
pub struct CsvChunks {
    /// The file, or what the rows in memory are, for messages.
    path: PathBuf,
    lines: Lines,
    line_no: usize,
    separator: String,
    rtp: Option<RtpLayout>,
    num_fields: usize,
    /// What declares the fields, for a row with another count.
    declared_by: &'static str,
    projection: Projection,
    /// Position of each projected column among the file's fields.
    positions: Vec<usize>,
    chunk_rows: usize,
}

impl CsvChunks {
    pub fn open(
        path: &Path,
        separator: &str,
        with_header: bool,
        field_names: &[String],
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let file = crate::storage::open(path).map_err(|e| DataError::io(path, e))?;
        // EasyRec's CSVInput reads `.gz` files as gzip.
        let lines: Lines = if path.extension().is_some_and(|e| e == "gz") {
            bounded_lines(BufReader::with_capacity(
                1 << 20,
                flate2::read::MultiGzDecoder::new(file),
            ))
        } else {
            bounded_lines(BufReader::with_capacity(1 << 20, file))
        };
        let layout = Layout {
            separator,
            with_header,
            field_names,
            declared_by: "data_config.input_fields",
        };
        Self::over(path, lines, layout, projection, chunk_rows)
    }

    /// An RTPInput file (`rtp` says where the fields are).
    pub fn open_rtp(
        path: &Path,
        separator: &str,
        rtp: &RtpLayout,
        field_names: &[String],
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let mut c = Self::open(path, separator, false, field_names, projection, chunk_rows)?;
        c.rtp = Some(rtp.clone());
        Ok(c)
    }

    /// Rows held in memory (`name` stands for them in messages), one per
    /// line, without a header: e.g. the packed `features` strings a serving
    /// request carries when `export_config.multi_placeholder` is false.
    pub fn from_text(
        name: &str,
        text: String,
        separator: &str,
        field_names: &[String],
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let lines: Lines = bounded_lines(Cursor::new(text));
        let layout = Layout {
            separator,
            with_header: false,
            field_names,
            declared_by: "the export's packed serving layout",
        };
        Self::over(Path::new(name), lines, layout, projection, chunk_rows)
    }

    fn over(
        path: &Path,
        mut lines: Lines,
        layout: Layout,
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let Layout {
            separator,
            with_header,
            field_names,
            declared_by,
        } = layout;
        let mut line_no = 0;
        let sep = if separator.is_empty() { "," } else { separator };
        // With a header, as EasyRec's CSVInput: the fields are found by the
        // header's names (in any order, with other columns beside them) and
        // a row has as many fields as the header.
        let mut header: Option<Vec<String>> = None;
        if with_header {
            line_no += 1;
            if let Some(h) = lines.next() {
                let h = h.map_err(|e| DataError::io(path, e))?;
                // A byte order mark before the first name is not part of it.
                let h = h.trim_start_matches('\u{feff}');
                header = Some(h.trim().split(sep).map(|n| n.trim().to_string()).collect());
            }
        }
        let (names, declared_by) = match &header {
            Some(h) => (&h[..], "the header line"),
            None => (field_names, declared_by),
        };
        let positions = projection
            .columns
            .iter()
            .map(|c| {
                names
                    .iter()
                    .position(|f| *f == c.name)
                    .ok_or_else(|| DataError::MissingColumn {
                        file: path.to_path_buf(),
                        column: c.name.clone(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let num_fields = names.len();
        Ok(CsvChunks {
            path: path.to_path_buf(),
            lines,
            line_no,
            separator: sep.into(),
            rtp: None,
            num_fields,
            declared_by,
            projection: projection.clone(),
            positions,
            chunk_rows,
        })
    }

    /// A line's fields in `input_fields` order.
    fn fields<'l>(&self, line: &'l str) -> Result<Vec<&'l str>, String> {
        let sep = self.separator.as_str();
        let Some(rtp) = &self.rtp else {
            let fields: Vec<&str> = line.split(sep).collect();
            if fields.len() != self.num_fields {
                return Err(format!(
                    "{} fields, but {} declares {}",
                    fields.len(),
                    self.declared_by,
                    self.num_fields
                ));
            }
            return Ok(fields);
        };
        let cols: Vec<&str> = line.split(rtp.rtp_separator.as_str()).collect();
        let needed = rtp
            .label_cols
            .iter()
            .chain([&rtp.feature_col])
            .max()
            .map_or(0, |c| c + 1);
        if cols.len() < needed {
            return Err(format!(
                "{} columns split on rtp_separator `{}`, but data_config.selected_cols reads column {}",
                cols.len(),
                rtp.rtp_separator,
                needed - 1
            ));
        }
        let mut fields: Vec<&str> = rtp.label_cols.iter().map(|&c| cols[c]).collect();
        fields.extend(cols[rtp.feature_col].split(sep));
        if fields.len() != self.num_fields {
            return Err(format!(
                "{} feature values in column {} (split on `{}`), but data_config.input_fields declares {} besides the labels",
                fields.len() - rtp.label_cols.len(),
                rtp.feature_col,
                sep.escape_default(),
                self.num_fields - rtp.label_cols.len()
            ));
        }
        Ok(fields)
    }

    fn parse_error(&self, column: &str, message: String) -> DataError {
        DataError::Value {
            file: self.path.clone(),
            location: format!("line {}", self.line_no),
            column: column.to_string(),
            message,
        }
    }
}

impl Iterator for CsvChunks {
    type Item = Result<RawBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut columns = self.projection.empty_columns(self.chunk_rows);
        let mut rows = 0;
        while rows < self.chunk_rows {
            let line = match self.lines.next() {
                None => break,
                Some(Err(e)) => return Some(Err(DataError::io(&self.path, e))),
                Some(Ok(l)) => l,
            };
            self.line_no += 1;
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                continue;
            }
            let fields = match self.fields(line) {
                Ok(f) => f,
                Err(message) => {
                    return Some(Err(DataError::Row {
                        file: self.path.clone(),
                        location: format!("line {}", self.line_no),
                        message,
                    }))
                }
            };
            for ((col, spec), &pos) in columns.iter_mut().zip(&self.projection.columns).zip(&self.positions) {
                if let Err(e) = spec.push_cell(col, fields[pos]) {
                    return Some(Err(self.parse_error(&spec.name, e.message(spec.ty))));
                }
            }
            rows += 1;
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
    use crate::data::{Column, ProjColumn};

    #[test]
    fn lines_end_at_breaks_and_past_the_bound_are_refused() {
        let lines: Vec<String> = bounded_lines(Cursor::new("a,b\r\nc\n\nd".to_string()))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(lines, ["a,b", "c", "", "d"]);
        // A stream without line breaks stops at the bound, not at its end.
        let endless = std::io::BufReader::new(std::io::repeat(b'x'));
        let err = bounded_lines(endless).next().unwrap().unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
    }

    fn column(name: &str, ty: crate::config::data_plan::ColumnType) -> ProjColumn {
        ProjColumn {
            name: name.into(),
            ty,
            default_val: String::new(),
            required: false,
        }
    }

    /// As EasyRec's CSVInput: with a header, fields are found by its names,
    /// in any order and beside columns the config does not declare.
    #[test]
    fn a_header_line_places_the_fields_by_name() {
        use crate::config::data_plan::ColumnType;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.csv");
        std::fs::write(&path, "b,extra,a\nx,1,7\ny,2,8\n").unwrap();
        let fields = ["a".to_string(), "b".to_string()];
        let projection = Projection {
            columns: vec![column("a", ColumnType::Int), column("b", ColumnType::Str)],
        };
        let mut chunks = CsvChunks::open(&path, ",", true, &fields, &projection, 10).unwrap();
        let batch = chunks.next().unwrap().unwrap();
        assert_eq!(batch.num_rows, 2);
        match (&batch.columns[0], &batch.columns[1]) {
            (Column::Int(a), Column::Str(b)) => {
                assert_eq!(a, &[7, 8]);
                assert_eq!((b.get(0), b.get(1)), ("x", "y"));
            }
            other => panic!("unexpected columns {other:?}"),
        }
        // A declared field the header lacks is named.
        std::fs::write(&path, "b,extra\nx,1\n").unwrap();
        let err = CsvChunks::open(&path, ",", true, &fields, &projection, 10)
            .err()
            .unwrap();
        assert!(err.to_string().contains("column `a` is missing"), "{err}");
    }
}
