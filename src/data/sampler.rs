//! EasyRec's negative samplers (`data_config.negative_sampler`,
//! `negative_sampler_in_memory`): rows of an item table drawn for every
//! batch and appended after its examples, so a match model's item tower
//! embeds them and every user of the batch scores them as negatives.
//!
//! The item table is EasyRec's: a header line of `name:type` columns, then
//! tab-separated rows of an item id, a weight and the item's attributes
//! joined by `attr_delimiter`, one per `attr_fields` entry and in its order.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::column::{Column, RawBatch};
use super::{CellError, DataError, Projection};
use crate::config::typed::NegativeSampling;
use crate::util::Rng;

/// The item table a sampler draws from.
#[derive(Debug, Clone)]
pub struct ItemTable {
    path: PathBuf,
    ids: Vec<String>,
    /// Running sums of the rows' weights (graph-learn's node weights).
    cum_weights: Vec<f64>,
    /// Per row, its attributes in `attr_fields` order.
    attrs: Vec<Vec<String>>,
}

impl ItemTable {
    /// Reads the table at `path`, whose rows carry `attr_count` attributes
    /// joined by `delimiter`. The header names the id, weight and feature
    /// columns (`id…`, `weight…`, `feature…`); without such names they are
    /// the first, second and third, as EasyRec reads them.
    pub fn load(path: &Path, attr_count: usize, delimiter: &str) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or("").split('\t').collect();
        let column = |prefix: &str, default: usize| {
            header
                .iter()
                .position(|h| h.trim().starts_with(prefix))
                .unwrap_or(default)
        };
        let (id_col, weight_col, feature_col) = (column("id", 0), column("weight", 1), column("feature", 2));
        let row_error = |line: usize, message: String| DataError::Row {
            file: path.to_path_buf(),
            location: format!("line {line}"),
            message,
        };
        let mut table = ItemTable {
            path: path.to_path_buf(),
            ids: Vec::new(),
            cum_weights: Vec::new(),
            attrs: Vec::new(),
        };
        let mut total = 0.0f64;
        for (i, line) in lines.enumerate() {
            let line_no = i + 2;
            if line.trim().is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split('\t').collect();
            let cell = |c: usize, what: &str| {
                cells.get(c).copied().ok_or_else(|| {
                    row_error(
                        line_no,
                        format!(
                            "{} tab-separated columns, no {what} column (column {})",
                            cells.len(),
                            c + 1
                        ),
                    )
                })
            };
            let id = cell(id_col, "item id")?.trim();
            let w = cell(weight_col, "weight")?.trim();
            let weight: f64 = w
                .parse()
                .ok()
                .filter(|w: &f64| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| row_error(line_no, format!("weight `{w}` is not a finite number >= 0")))?;
            let attrs: Vec<String> = cell(feature_col, "feature")?
                .split(delimiter)
                .map(str::to_string)
                .collect();
            if attrs.len() != attr_count {
                return Err(row_error(
                    line_no,
                    format!(
                        "{} attributes separated by `{delimiter}`, but attr_fields names {attr_count}",
                        attrs.len()
                    ),
                ));
            }
            total += weight;
            table.ids.push(id.to_string());
            table.cum_weights.push(total);
            table.attrs.push(attrs);
        }
        if table.ids.is_empty() {
            return Err(DataError::Empty {
                purpose: "negative sampler's item",
                paths: vec![path.display().to_string()],
            });
        }
        if total <= 0.0 {
            return Err(row_error(2, "every item's weight is 0: nothing can be sampled".into()));
        }
        Ok(table)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// A row drawn in proportion to its weight.
    fn weighted_row(&self, rng: &mut Rng) -> usize {
        let total = *self.cum_weights.last().expect("a loaded table has rows");
        let u = rng.uniform() * total;
        self.cum_weights.partition_point(|&c| c <= u).min(self.len() - 1)
    }
}

/// Draws negatives for batches and appends them as rows.
#[derive(Debug, Clone)]
pub struct NegativeSampler {
    table: std::sync::Arc<ItemTable>,
    /// graph-learn's sampler: by weight, with replacement. Otherwise the
    /// in-memory one: uniformly, without replacement.
    weighted: bool,
    /// Per projected column, the attribute it takes from the table.
    attr_of: Vec<Option<usize>>,
    /// The projected column of `item_id_field`.
    item_col: usize,
}

impl NegativeSampler {
    /// A sampler over `spec`'s table for batches of `projection`'s columns,
    /// which must hold `item_id_field`.
    pub fn new(spec: &NegativeSampling, projection: &Projection) -> Result<Self, DataError> {
        let table = ItemTable::load(
            Path::new(&spec.items_path),
            spec.attr_fields.len(),
            &spec.attr_delimiter,
        )?;
        let item_col = projection
            .columns
            .iter()
            .position(|c| c.name == spec.item_id_field)
            .expect("the encoder projects the sampler's item_id_field");
        Ok(NegativeSampler {
            table: std::sync::Arc::new(table),
            weighted: spec.weighted,
            attr_of: projection
                .columns
                .iter()
                .map(|c| spec.attr_fields.iter().position(|a| *a == c.name))
                .collect(),
            item_col,
        })
    }

    /// Appends `n` sampled items to `raw` after its examples and returns how
    /// many it appended: EasyRec's samplers skip items of the batch. Columns
    /// that are no item attribute (the user's, the labels) take their
    /// default; the model reads only the item tower of these rows.
    pub fn append(
        &self,
        raw: &mut RawBatch,
        projection: &Projection,
        n: usize,
        rng: &mut Rng,
    ) -> Result<usize, DataError> {
        if n == 0 || raw.num_rows == 0 {
            return Ok(0);
        }
        let in_batch = batch_ids(&raw.columns[self.item_col]);
        let t = &self.table;
        let rows: Vec<usize> = if self.weighted {
            // graph-learn draws by node weight and retries a draw that hits
            // a batch item; a table of hardly anything else keeps the last.
            (0..n)
                .map(|_| {
                    let mut r = t.weighted_row(rng);
                    for _ in 0..64 {
                        if !in_batch.contains(t.ids[r].as_str()) {
                            break;
                        }
                        r = t.weighted_row(rng);
                    }
                    r
                })
                .collect()
        } else {
            // numpy's choice(len, n + batch, replace=False), then the draws
            // that are no batch item, at most n of them.
            let want = n + raw.num_rows;
            if want > t.len() {
                return Err(DataError::Row {
                    file: t.path.clone(),
                    location: "the whole table".into(),
                    message: format!(
                        "{} items cannot give {n} samples plus a batch of {} without replacement",
                        t.len(),
                        raw.num_rows
                    ),
                });
            }
            distinct(t.len(), want, rng)
                .into_iter()
                .filter(|&r| !in_batch.contains(t.ids[r].as_str()))
                .take(n)
                .collect()
        };
        for (c, (col, spec)) in raw.columns.iter_mut().zip(&projection.columns).enumerate() {
            for &r in &rows {
                let text = self.attr_of[c].map_or("", |a| t.attrs[r][a].as_str());
                let pushed = match spec.push_cell(col, text) {
                    // A label of a sampled row is never read.
                    Err(CellError::EmptyRequired) if col.push_text("0", spec.ty) => Ok(()),
                    other => other,
                };
                pushed.map_err(|e| DataError::Value {
                    file: t.path.clone(),
                    location: format!("item `{}`", t.ids[r]),
                    column: spec.name.clone(),
                    message: match e {
                        CellError::Invalid(v) => format!("`{v}` is not a valid {:?} value", spec.ty),
                        CellError::EmptyRequired => "is empty and has no default_val".into(),
                    },
                })?;
            }
        }
        raw.num_rows += rows.len();
        Ok(rows.len())
    }
}

/// The batch's item ids as text, to compare with the table's.
fn batch_ids(col: &Column) -> HashSet<String> {
    match col {
        Column::Int(v) => v.iter().map(i64::to_string).collect(),
        Column::Float(v) => v.iter().map(f64::to_string).collect(),
        Column::Str(s) => (0..s.len()).map(|i| s.get(i).trim().to_string()).collect(),
        Column::List { .. } => HashSet::new(),
    }
}

/// `k` distinct indices below `n` in random order.
fn distinct(n: usize, k: usize, rng: &mut Rng) -> Vec<usize> {
    if 2 * k > n {
        let mut all: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut all);
        all.truncate(k);
        return all;
    }
    let mut seen = HashSet::with_capacity(k);
    let mut out = Vec::with_capacity(k);
    while out.len() < k {
        let r = rng.below(n as u64) as usize;
        if seen.insert(r) {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model_plan::ColumnType;
    use crate::data::ProjColumn;

    fn table(dir: &Path, rows: &[(&str, &str, &str)]) -> PathBuf {
        let mut text = String::from("id:int64\tweight:float\tfeature:string\n");
        for (id, w, f) in rows {
            text.push_str(&format!("{id}\t{w}\t{f}\n"));
        }
        let p = dir.join("items");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn spec(path: &Path, weighted: bool) -> NegativeSampling {
        NegativeSampling {
            items_path: path.display().to_string(),
            num_sample: 3,
            num_eval_sample: 0,
            attr_fields: vec!["item".into(), "price".into()],
            item_id_field: "item".into(),
            attr_delimiter: ":".into(),
            weighted,
        }
    }

    fn projection() -> Projection {
        let col = |name: &str, ty, required| ProjColumn {
            name: name.into(),
            ty,
            default_val: String::new(),
            required,
        };
        Projection {
            columns: vec![
                col("label", ColumnType::Int, true),
                col("user", ColumnType::Str, false),
                col("item", ColumnType::Int, false),
                col("price", ColumnType::Float, false),
            ],
        }
    }

    fn batch(items: &[i64]) -> RawBatch {
        let mut users = crate::data::StrColumn::new();
        items.iter().for_each(|_| users.push("u"));
        RawBatch {
            num_rows: items.len(),
            columns: vec![
                Column::Int(vec![1; items.len()]),
                Column::Str(users),
                Column::Int(items.to_vec()),
                Column::Float(vec![1.5; items.len()]),
            ],
        }
    }

    #[test]
    fn weighted_draws_follow_the_weights_and_skip_batch_items() {
        let dir = tempfile::tempdir().unwrap();
        let p = table(
            dir.path(),
            &[("1", "1", "1:0.5"), ("2", "3", "2:2.5"), ("3", "0", "3:9")],
        );
        let s = NegativeSampler::new(&spec(&p, true), &projection()).unwrap();
        let mut rng = Rng::new(7);
        let mut raw = batch(&[5]);
        assert_eq!(s.append(&mut raw, &projection(), 4000, &mut rng).unwrap(), 4000);
        let Column::Int(items) = &raw.columns[2] else { panic!() };
        let twos = items[1..].iter().filter(|&&i| i == 2).count() as f64;
        assert!((twos / 4000.0 - 0.75).abs() < 0.03, "{twos}");
        assert!(!items[1..].contains(&3), "a weight of 0 is never drawn");
        // Attributes land in their columns, the rest takes defaults.
        let Column::Float(price) = &raw.columns[3] else {
            panic!()
        };
        assert!(items[1..]
            .iter()
            .zip(&price[1..])
            .all(|(i, p)| (*i == 1) == (*p == 0.5)));
        let Column::Str(users) = &raw.columns[1] else { panic!() };
        assert_eq!(users.get(1), "");
        // An item of the batch is not drawn while others can be.
        let mut raw = batch(&[2]);
        s.append(&mut raw, &projection(), 50, &mut rng).unwrap();
        let Column::Int(items) = &raw.columns[2] else { panic!() };
        assert!(items[1..].iter().all(|&i| i == 1), "{items:?}");
    }

    #[test]
    fn in_memory_draws_are_distinct_and_need_enough_items() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<(String, String)> = (0..10).map(|i| (i.to_string(), format!("{i}:1"))).collect();
        let rows: Vec<(&str, &str, &str)> = rows.iter().map(|(a, b)| (a.as_str(), "1", b.as_str())).collect();
        let p = table(dir.path(), &rows);
        let s = NegativeSampler::new(&spec(&p, false), &projection()).unwrap();
        let mut rng = Rng::new(3);
        let mut raw = batch(&[0, 1]);
        let n = s.append(&mut raw, &projection(), 6, &mut rng).unwrap();
        let Column::Int(items) = &raw.columns[2] else { panic!() };
        let drawn: HashSet<i64> = items[2..].iter().copied().collect();
        assert_eq!(drawn.len(), n);
        assert!(
            (4..=6).contains(&n) && !drawn.contains(&0) && !drawn.contains(&1),
            "{items:?}"
        );
        let err = s.append(&mut batch(&[0, 1]), &projection(), 9, &mut rng).unwrap_err();
        assert!(err.to_string().contains("without replacement"), "{err}");
    }

    #[test]
    fn malformed_tables_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = table(dir.path(), &[("1", "1", "1:2"), ("2", "x", "2:3")]);
        let err = ItemTable::load(&p, 2, ":").unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("weight `x`"), "{err}");
        let p = table(dir.path(), &[("1", "1", "1:2:3")]);
        let err = ItemTable::load(&p, 2, ":").unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("3 attributes"), "{err}");
        let p = table(dir.path(), &[]);
        assert!(matches!(ItemTable::load(&p, 2, ":"), Err(DataError::Empty { .. })));
    }
}
