//! Column-major raw input: what a reader hands to feature encoding.

use crate::config::data_plan::ColumnType;

/// Strings stored back to back with offsets, like Arrow's Utf8 array.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StrColumn {
    pub offsets: Vec<usize>,
    pub bytes: String,
}

impl StrColumn {
    pub fn new() -> Self {
        StrColumn {
            offsets: vec![0],
            bytes: String::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> &str {
        &self.bytes[self.offsets[i]..self.offsets[i + 1]]
    }

    pub fn push(&mut self, s: &str) {
        self.bytes.push_str(s);
        self.offsets.push(self.bytes.len());
    }
}

/// One input column of a chunk of rows. Nulls are already replaced by the
/// field's default value.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    Float(Vec<f64>),
    Int(Vec<i64>),
    Str(StrColumn),
    /// A list per row (Parquet list columns); `offsets` has rows + 1 entries.
    List {
        offsets: Vec<usize>,
        values: Box<Column>,
    },
}

impl Column {
    pub fn len(&self) -> usize {
        match self {
            Column::Float(v) => v.len(),
            Column::Int(v) => v.len(),
            Column::Str(s) => s.len(),
            Column::List { offsets, .. } => offsets.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Column::Float(_) => "float",
            Column::Int(_) => "int",
            Column::Str(_) => "string",
            Column::List { .. } => "list",
        }
    }

    /// An empty scalar column that holds values of `ty`.
    pub fn of_type(ty: ColumnType, capacity: usize) -> Column {
        match ty {
            ColumnType::Float => Column::Float(Vec::with_capacity(capacity)),
            ColumnType::Int | ColumnType::Bool => Column::Int(Vec::with_capacity(capacity)),
            ColumnType::Str => Column::Str(StrColumn::new()),
        }
    }

    /// Appends one value given as text, as a CSV cell holds it (an empty
    /// text is 0 for numbers); false when the text is not a value of `ty`.
    /// Nulls must already be replaced by the field's default.
    pub fn push_text(&mut self, v: &str, ty: ColumnType) -> bool {
        match self {
            Column::Float(d) => parse_f64(v).map(|x| d.push(x)).is_some(),
            Column::Int(d) => parse_i64(v, ty).map(|x| d.push(x)).is_some(),
            Column::Str(d) => {
                d.push(v);
                true
            }
            Column::List { .. } => false,
        }
    }

    /// An empty column of the same type.
    pub fn empty_like(&self) -> Column {
        match self {
            Column::Float(_) => Column::Float(Vec::new()),
            Column::Int(_) => Column::Int(Vec::new()),
            Column::Str(_) => Column::Str(StrColumn::new()),
            Column::List { values, .. } => Column::List {
                offsets: vec![0],
                values: Box::new(values.empty_like()),
            },
        }
    }

    /// Appends rows `rows` of `src` (same type) to `self`.
    pub fn extend_from(&mut self, src: &Column, rows: &[usize]) {
        match (self, src) {
            (Column::Float(d), Column::Float(s)) => d.extend(rows.iter().map(|&r| s[r])),
            (Column::Int(d), Column::Int(s)) => d.extend(rows.iter().map(|&r| s[r])),
            (Column::Str(d), Column::Str(s)) => {
                for &r in rows {
                    d.push(s.get(r));
                }
            }
            (
                Column::List {
                    offsets: od,
                    values: vd,
                },
                Column::List {
                    offsets: os,
                    values: vs,
                },
            ) => {
                for &r in rows {
                    let idx: Vec<usize> = (os[r]..os[r + 1]).collect();
                    vd.extend_from(vs, &idx);
                    od.push(vd.len());
                }
            }
            (d, s) => panic!(
                "column type changed between chunks: {} vs {}",
                d.type_name(),
                s.type_name()
            ),
        }
    }
}

fn parse_f64(v: &str) -> Option<f64> {
    if v.is_empty() {
        return Some(0.0);
    }
    v.trim().parse().ok()
}

fn parse_i64(v: &str, ty: ColumnType) -> Option<i64> {
    if v.is_empty() {
        return Some(0);
    }
    let v = v.trim();
    if ty == ColumnType::Bool {
        return match v {
            "true" | "True" | "1" => Some(1),
            "false" | "False" | "0" => Some(0),
            _ => None,
        };
    }
    v.parse()
        .ok()
        .or_else(|| v.parse::<f64>().ok().filter(|f| f.fract() == 0.0).map(|f| f as i64))
}

/// Rows of the projected columns, in projection order.
#[derive(Debug, Clone, PartialEq)]
pub struct RawBatch {
    pub num_rows: usize,
    pub columns: Vec<Column>,
}

impl RawBatch {
    pub fn empty_like(&self) -> RawBatch {
        RawBatch {
            num_rows: 0,
            columns: self.columns.iter().map(Column::empty_like).collect(),
        }
    }

    pub fn extend_from(&mut self, src: &RawBatch, rows: &[usize]) {
        for (d, s) in self.columns.iter_mut().zip(&src.columns) {
            d.extend_from(s, rows);
        }
        self.num_rows += rows.len();
    }

    /// Part `rank` of `size` contiguous, near-equal parts (a rank's slice
    /// of a global batch; the first `num_rows % size` parts get one more row).
    pub fn part(&self, rank: usize, size: usize) -> RawBatch {
        if size == 1 {
            return self.clone();
        }
        let (n, base, extra) = (self.num_rows, self.num_rows / size, self.num_rows % size);
        let start = rank * base + rank.min(extra);
        let len = base + usize::from(rank < extra);
        let rows: Vec<usize> = (start..(start + len).min(n)).collect();
        let mut out = self.empty_like();
        out.extend_from(self, &rows);
        out
    }
}
