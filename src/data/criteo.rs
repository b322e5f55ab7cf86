//! EasyRec's CriteoInput: three binary files per part, little-endian and
//! row-aligned: the labels (`int32` per row), the dense features (13
//! `float32` per row, fields `f1`..`f13`) and the categorical ones (26
//! `int32` per row, fields `c1`..`c26`), as EasyRec's `BinaryDataset`
//! reads them. The declared input types do not apply: EasyRec reads floats
//! and ints whatever `input_fields` says.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::column::{Column, RawBatch};
use super::{DataError, Projection};

/// Dense and categorical fields per row.
pub const DENSE: usize = 13;
pub const CATEGORICAL: usize = 26;

/// Where a projected column comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    Label,
    Dense(usize),
    Category(usize),
}

/// One part's three files, read `chunk_rows` rows at a time.
pub struct CriteoChunks {
    files: [(PathBuf, BufReader<File>); 3],
    sources: Vec<Source>,
    rows_left: u64,
    chunk_rows: usize,
}

/// The field a column name stands for.
fn source(name: &str) -> Option<Source> {
    let index = |rest: &str, n: usize| {
        rest.parse::<usize>()
            .ok()
            .filter(|i| (1..=n).contains(i))
            .map(|i| i - 1)
    };
    if name == "label" {
        Some(Source::Label)
    } else if let Some(i) = name.strip_prefix('f').and_then(|r| index(r, DENSE)) {
        Some(Source::Dense(i))
    } else {
        name.strip_prefix('c')
            .and_then(|r| index(r, CATEGORICAL))
            .map(Source::Category)
    }
}

impl CriteoChunks {
    /// Opens the part of `label`, `dense` and `category` files.
    pub fn open(
        (label, dense, category): (&Path, &Path, &Path),
        projection: &Projection,
        chunk_rows: usize,
    ) -> Result<Self, DataError> {
        let sources = projection
            .columns
            .iter()
            .map(|c| {
                source(&c.name).ok_or_else(|| DataError::MissingColumn {
                    file: label.to_path_buf(),
                    column: format!("{} (CriteoInput holds label, f1..f13 and c1..c26)", c.name),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).map_err(|e| DataError::io(p, e));
        let rows = size(label)? / 4;
        for (p, per_row, what) in [
            (label, 4u64, "one int32 label"),
            (dense, DENSE as u64 * 4, "13 float32 values"),
            (category, CATEGORICAL as u64 * 4, "26 int32 values"),
        ] {
            let bytes = size(p)?;
            if bytes != rows * per_row {
                return Err(DataError::Row {
                    file: p.to_path_buf(),
                    location: format!("{bytes} bytes"),
                    message: format!(
                        "holds {what} per row: {} bytes for the {rows} rows of {}",
                        rows * per_row,
                        label.display()
                    ),
                });
            }
        }
        let open = |p: &Path| -> Result<(PathBuf, BufReader<File>), DataError> {
            let f = File::open(p).map_err(|e| DataError::io(p, e))?;
            Ok((p.to_path_buf(), BufReader::new(f)))
        };
        Ok(CriteoChunks {
            files: [open(label)?, open(dense)?, open(category)?],
            sources,
            rows_left: rows,
            chunk_rows: chunk_rows.max(1),
        })
    }

    /// `n` rows of `width` 4-byte values from file `k`.
    fn read(&mut self, k: usize, n: usize, width: usize) -> Result<Vec<[u8; 4]>, DataError> {
        let (path, r) = &mut self.files[k];
        let mut bytes = vec![0u8; n * width * 4];
        r.read_exact(&mut bytes).map_err(|e| DataError::io(path, e))?;
        Ok(bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect())
    }
}

impl Iterator for CriteoChunks {
    type Item = Result<RawBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rows_left == 0 {
            return None;
        }
        let n = (self.rows_left as usize).min(self.chunk_rows);
        self.rows_left -= n as u64;
        let read = (|| -> Result<RawBatch, DataError> {
            let labels = self.read(0, n, 1)?;
            let dense = self.read(1, n, DENSE)?;
            let category = self.read(2, n, CATEGORICAL)?;
            let columns = self
                .sources
                .iter()
                .map(|s| match *s {
                    Source::Label => Column::Int(labels.iter().map(|b| i32::from_le_bytes(*b) as i64).collect()),
                    Source::Dense(i) => Column::Float(
                        (0..n)
                            .map(|r| f32::from_le_bytes(dense[r * DENSE + i]) as f64)
                            .collect(),
                    ),
                    Source::Category(i) => Column::Int(
                        (0..n)
                            .map(|r| i32::from_le_bytes(category[r * CATEGORICAL + i]) as i64)
                            .collect(),
                    ),
                })
                .collect();
            Ok(RawBatch { num_rows: n, columns })
        })();
        if read.is_err() {
            self.rows_left = 0;
        }
        Some(read)
    }
}

/// Writes `rows` as one part's three files (what `CriteoChunks` reads).
pub fn write_part(
    (label, dense, category): (&Path, &Path, &Path),
    rows: &[(i32, [f32; DENSE], [i32; CATEGORICAL])],
) -> std::io::Result<()> {
    let (mut l, mut d, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for (y, f, k) in rows {
        l.extend_from_slice(&y.to_le_bytes());
        f.iter().for_each(|v| d.extend_from_slice(&v.to_le_bytes()));
        k.iter().for_each(|v| c.extend_from_slice(&v.to_le_bytes()));
    }
    std::fs::write(label, l)?;
    std::fs::write(dense, d)?;
    std::fs::write(category, c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::data_plan::ColumnType;
    use crate::data::ProjColumn;

    fn projection(names: &[&str]) -> Projection {
        Projection {
            columns: names
                .iter()
                .map(|n| ProjColumn {
                    name: n.to_string(),
                    ty: ColumnType::Int,
                    default_val: String::new(),
                    required: false,
                })
                .collect(),
        }
    }

    #[test]
    fn reads_the_three_files_of_a_part_row_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let rows: Vec<(i32, [f32; DENSE], [i32; CATEGORICAL])> = (0..5)
            .map(|r| {
                let f = std::array::from_fn(|i| r as f32 + i as f32 / 100.0);
                let c = std::array::from_fn(|i| r * 100 + i as i32);
                (r % 2, f, c)
            })
            .collect();
        write_part((&p("l"), &p("d"), &p("c")), &rows).unwrap();
        let chunks: Vec<RawBatch> =
            CriteoChunks::open((&p("l"), &p("d"), &p("c")), &projection(&["c26", "label", "f2"]), 2)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(chunks.iter().map(|c| c.num_rows).collect::<Vec<_>>(), vec![2, 2, 1]);
        let mut c26: Vec<i64> = Vec::new();
        let mut label: Vec<i64> = Vec::new();
        let mut f2: Vec<f64> = Vec::new();
        for ch in &chunks {
            let (Column::Int(a), Column::Int(b), Column::Float(c)) = (&ch.columns[0], &ch.columns[1], &ch.columns[2])
            else {
                panic!("categories and labels are ints, dense values floats")
            };
            c26.extend(a);
            label.extend(b);
            f2.extend(c);
        }
        assert_eq!(c26, vec![25, 125, 225, 325, 425]);
        assert_eq!(label, vec![0, 1, 0, 1, 0]);
        assert!(
            f2.iter()
                .zip(0..)
                .all(|(v, r)| (v - (f64::from(r) + 0.01)).abs() < 1e-6),
            "{f2:?}"
        );

        // A dense file a row short, and a field CriteoInput does not hold.
        std::fs::write(p("d"), vec![0u8; 4 * DENSE * 4]).unwrap();
        let err = CriteoChunks::open((&p("l"), &p("d"), &p("c")), &projection(&["label"]), 2)
            .err()
            .unwrap();
        assert!(err.to_string().contains("holds 13 float32 values per row"), "{err}");
        let err = CriteoChunks::open((&p("l"), &p("c"), &p("c")), &projection(&["c27"]), 2)
            .err()
            .unwrap();
        assert!(err.to_string().contains("c27"), "{err}");
    }
}
