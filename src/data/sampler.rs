//! EasyRec's negative samplers (`data_config.negative_sampler`,
//! `negative_sampler_in_memory`): rows of an item table drawn for every
//! batch and appended after its examples, so a match model's item tower
//! embeds them and every user of the batch scores them as negatives.
//!
//! The item table is EasyRec's: a header line of `name:type` columns, then
//! tab-separated rows of an item id, a weight and the item's attributes
//! joined by `attr_delimiter`, one per `attr_fields` entry and in its order.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::column::{Column, RawBatch};
use super::{CellError, DataError, Projection};
use crate::config::data_plan::{NegativeSampling, SampleDraw};
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
    /// Row of each item id (the first, should one repeat).
    index: HashMap<String, usize>,
}

impl ItemTable {
    /// Reads the table at `path`, whose rows carry `attr_count` attributes
    /// joined by `delimiter`. The header names the id, weight and feature
    /// columns (`id…`, `weight…`, `feature…`); without such names they are
    /// the first, second and third, as EasyRec reads them.
    pub fn load(path: &Path, attr_count: usize, delimiter: &str) -> Result<Self, DataError> {
        let text =
            crate::bounded::read_text(path, crate::bounded::table_bytes()).map_err(|e| DataError::io(path, e))?;
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
            index: HashMap::new(),
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
            table.index.entry(id.to_string()).or_insert(table.ids.len());
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

/// Per user id, item table rows (an edge table's).
type Edges = HashMap<String, Vec<usize>>;

/// Reads an edge table (`userid itemid weight`, tab-separated after a
/// header) into each user's items in file order, keeping the edges whose
/// user is in `users` and whose item is in `items`, as graph-learn joins
/// them to its nodes.
fn load_edges(path: &Path, users: &HashSet<String>, items: &ItemTable) -> Result<Edges, DataError> {
    let text = crate::bounded::read_text(path, crate::bounded::table_bytes()).map_err(|e| DataError::io(path, e))?;
    let mut edges = Edges::new();
    let mut left_out = 0usize;
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split('\t').collect();
        let [user, item, ..] = cells[..] else {
            return Err(DataError::Row {
                file: path.to_path_buf(),
                location: format!("line {}", i + 1),
                message: format!("{} tab-separated columns, not a user id and an item id", cells.len()),
            });
        };
        match items.index.get(item.trim()) {
            Some(&r) if users.contains(user.trim()) => edges.entry(user.trim().to_string()).or_default().push(r),
            _ => left_out += 1,
        }
    }
    if left_out > 0 {
        log::warn!(
            "{}: {left_out} edges name a user or item missing from the sampler's tables; left out",
            path.display()
        );
    }
    Ok(edges)
}

/// The ids of a user table (`id weight`, tab-separated after a header).
fn load_users(path: &Path) -> Result<HashSet<String>, DataError> {
    let text = crate::bounded::read_text(path, crate::bounded::table_bytes()).map_err(|e| DataError::io(path, e))?;
    let users: HashSet<String> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split('\t').next())
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
        .collect();
    if users.is_empty() {
        return Err(DataError::Empty {
            purpose: "negative sampler's user",
            paths: vec![path.display().to_string()],
        });
    }
    Ok(users)
}

/// A sampler's user side: the column of the batch's user ids and their
/// edges.
#[derive(Debug)]
struct UserSide {
    col: usize,
    positives: Edges,
    hard: Edges,
    num_hard: usize,
}

/// What `NegativeSampler::append` added after a batch's examples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Appended {
    /// Rows appended: the drawn items, then the hard negatives.
    pub rows: usize,
    /// Per hard negative, the example whose user it belongs to and its row
    /// in the batch.
    pub hard: Vec<(usize, usize)>,
}

/// Draws negatives for batches and appends them as rows.
#[derive(Debug, Clone)]
pub struct NegativeSampler {
    table: Arc<ItemTable>,
    draw: SampleDraw,
    /// Per projected column, the attribute it takes from the table.
    attr_of: Vec<Option<usize>>,
    /// The projected column of `item_id_field`.
    item_col: usize,
    users: Option<Arc<UserSide>>,
}

impl NegativeSampler {
    /// A sampler over `spec`'s tables for batches of `projection`'s
    /// columns, which must hold `item_id_field` (and `user_id_field`).
    pub fn new(spec: &NegativeSampling, projection: &Projection) -> Result<Self, DataError> {
        let table = ItemTable::load(
            Path::new(&spec.items_path),
            spec.attr_fields.len(),
            &spec.attr_delimiter,
        )?;
        let column = |name: &str| {
            projection
                .columns
                .iter()
                .position(|c| c.name == name)
                .expect("the encoder projects the sampler's id fields")
        };
        let users = match &spec.users {
            None => None,
            Some(u) => {
                let ids = load_users(Path::new(&u.users_path))?;
                let edges = |p: &Option<String>| {
                    p.as_deref()
                        .map(|p| load_edges(Path::new(p), &ids, &table))
                        .transpose()
                        .map(Option::unwrap_or_default)
                };
                Some(Arc::new(UserSide {
                    col: column(&u.user_id_field),
                    positives: edges(&u.positive_edges)?,
                    hard: edges(&u.hard_edges)?,
                    num_hard: u.num_hard_sample as usize,
                }))
            }
        };
        Ok(NegativeSampler {
            item_col: column(&spec.item_id_field),
            table: Arc::new(table),
            draw: spec.draw,
            attr_of: projection
                .columns
                .iter()
                .map(|c| spec.attr_fields.iter().position(|a| *a == c.name))
                .collect(),
            users,
        })
    }

    /// Appends `n` drawn items to `raw` after its examples, then each
    /// example's user's hard negatives. Columns that are no item attribute
    /// (the user's, the labels) take their default; the model reads only
    /// the item tower of these rows.
    pub fn append(
        &self,
        raw: &mut RawBatch,
        projection: &Projection,
        n: usize,
        rng: &mut Rng,
    ) -> Result<Appended, DataError> {
        let b = raw.num_rows;
        if b == 0 {
            return Ok(Appended::default());
        }
        let mut rows = self.draw(raw, n, rng)?;
        let user_ids = self.users.as_ref().map(|u| column_ids(&raw.columns[u.col]));
        let mut hard = Vec::new();
        if let (Some(u), Some(ids)) = (&self.users, &user_ids) {
            for (i, id) in ids.iter().enumerate() {
                for &r in u.hard.get(id).into_iter().flatten().take(u.num_hard) {
                    hard.push((i, b + rows.len()));
                    rows.push(r);
                }
            }
        }
        let t = &self.table;
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
                    message: e.message(spec.ty),
                })?;
            }
        }
        raw.num_rows += rows.len();
        Ok(Appended { rows: rows.len(), hard })
    }

    /// The `n` table rows drawn for a batch (`SampleDraw`).
    fn draw(&self, raw: &RawBatch, n: usize, rng: &mut Rng) -> Result<Vec<usize>, DataError> {
        let t = &self.table;
        if n == 0 {
            return Ok(Vec::new());
        }
        // A draw that hits an item it must skip is retried; a table of
        // hardly anything else keeps the last.
        fn retry(mut draw: impl FnMut() -> usize, skip: impl Fn(usize) -> bool) -> usize {
            let mut r = draw();
            for _ in 0..64 {
                if !skip(r) {
                    break;
                }
                r = draw();
            }
            r
        }
        Ok(match self.draw {
            SampleDraw::Weighted => {
                let in_batch = column_ids(&raw.columns[self.item_col])
                    .into_iter()
                    .collect::<HashSet<_>>();
                let skip = |r: usize| in_batch.contains(t.ids[r].as_str());
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    out.push(retry(|| t.weighted_row(rng), skip));
                }
                out
            }
            SampleDraw::AvoidPositives => {
                // graph-learn draws ceil(n / batch) items per example,
                // each avoiding that example's user's positive items.
                let users = self.users.as_ref().expect("a v2 sampler has users");
                let ids = column_ids(&raw.columns[users.col]);
                let per = n.div_ceil(ids.len());
                let mut out = Vec::with_capacity(n);
                for k in 0..n {
                    let pos = users.positives.get(&ids[k / per]);
                    let skip = |r: usize| pos.is_some_and(|p| p.contains(&r));
                    out.push(retry(|| rng.below(t.len() as u64) as usize, skip));
                }
                out
            }
            SampleDraw::Distinct => {
                // numpy's choice(len, n + batch, replace=False), then the
                // draws that are no batch item, at most n of them.
                let in_batch = column_ids(&raw.columns[self.item_col])
                    .into_iter()
                    .collect::<HashSet<_>>();
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
            }
        })
    }
}

/// A batch's ids (items', users') as text, to compare with the tables'.
fn column_ids(col: &Column) -> Vec<String> {
    match col {
        Column::Int(v) => v.iter().map(i64::to_string).collect(),
        Column::Float(v) => v.iter().map(f64::to_string).collect(),
        Column::Str(s) => (0..s.len()).map(|i| s.get(i).trim().to_string()).collect(),
        Column::List { offsets, .. } => vec![String::new(); offsets.len().saturating_sub(1)],
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
    use crate::config::data_plan::ColumnType;
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

    fn spec(path: &Path, draw: SampleDraw) -> NegativeSampling {
        NegativeSampling {
            items_path: path.display().to_string(),
            num_sample: 3,
            num_eval_sample: 0,
            attr_fields: vec!["item".into(), "price".into()],
            item_id_field: "item".into(),
            attr_delimiter: ":".into(),
            draw,
            users: None,
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
        let s = NegativeSampler::new(&spec(&p, SampleDraw::Weighted), &projection()).unwrap();
        let mut rng = Rng::new(7);
        let mut raw = batch(&[5]);
        assert_eq!(s.append(&mut raw, &projection(), 4000, &mut rng).unwrap().rows, 4000);
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
        let s = NegativeSampler::new(&spec(&p, SampleDraw::Distinct), &projection()).unwrap();
        let mut rng = Rng::new(3);
        let mut raw = batch(&[0, 1]);
        let n = s.append(&mut raw, &projection(), 6, &mut rng).unwrap().rows;
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

    /// v2 draws skip the user's positive items; hard negatives are the
    /// user's hard edges (at most `num_hard_sample`), after the draws, with
    /// edges of users or items the tables lack left out.
    #[test]
    fn user_edges_steer_draws_and_give_hard_negatives() {
        use crate::config::data_plan::SamplerUsers;
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<(String, String)> = (0..4).map(|i| (i.to_string(), format!("{i}:1"))).collect();
        let rows: Vec<(&str, &str, &str)> = rows.iter().map(|(a, b)| (a.as_str(), "1", b.as_str())).collect();
        let p = table(dir.path(), &rows);
        let write = |name: &str, text: &str| {
            let f = dir.path().join(name);
            std::fs::write(&f, text).unwrap();
            f.display().to_string()
        };
        let users = write("users", "id:int64\tweight:float\nu\t1\nv\t1\n");
        let pos = write(
            "pos",
            "userid:int64\titemid:int64\tweight:float\nu\t0\t1\nu\t1\t1\nu\t2\t1\n",
        );
        let hard = write("hard", "h\nu\t3\t1\nu\t2\t1\nu\t1\t1\nv\t9\t1\nw\t0\t1\n");
        let mut s = spec(&p, SampleDraw::AvoidPositives);
        s.attr_fields = vec!["item".into(), "price".into()];
        s.users = Some(SamplerUsers {
            user_id_field: "user".into(),
            users_path: users,
            positive_edges: Some(pos),
            hard_edges: Some(hard),
            num_hard_sample: 2,
        });
        let sampler = NegativeSampler::new(&s, &projection()).unwrap();
        let mut raw = batch(&[0, 1]);
        if let Column::Str(u) = &mut raw.columns[1] {
            *u = crate::data::StrColumn::new();
            u.push("u");
            u.push("v");
        }
        let a = sampler.append(&mut raw, &projection(), 40, &mut Rng::new(5)).unwrap();
        let Column::Int(items) = &raw.columns[2] else { panic!() };
        // Draws 0..20 are user u's (ceil(40 / 2) each): never its positives.
        assert!(items[2..22].iter().all(|&i| i == 3), "{items:?}");
        assert_eq!(a.rows, 42);
        assert_eq!(a.hard, vec![(0, 42), (0, 43)]);
        assert_eq!(&items[42..], &[3, 2]);
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
