//! Random rows for any supported config: every input field gets values its
//! features can read (vocabulary words, in-range bucket ids, separated tags,
//! numbers for raw features), so a config can be trained without its data.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use crate::config::data_plan::{ColumnType, InputFormat};
use crate::config::feature_plan::{Bucketing, FeatureKind};
use crate::config::typed::TrainingPlan;
use crate::data::criteo;
use crate::util::Rng;

/// A cell value before it is written as text or typed Parquet.
enum Cell {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Int(v) => v.to_string(),
            Cell::Float(v) => format!("{v:.4}"),
            Cell::Str(s) => s.clone(),
            Cell::Bool(b) => b.to_string(),
        }
    }
}

fn token(rng: &mut Rng, buckets: &Bucketing) -> String {
    match buckets {
        Bucketing::Vocab(words) if !words.is_empty() => words[rng.below(words.len() as u64) as usize].clone(),
        Bucketing::Identity(n) => rng.below((*n).max(1)).to_string(),
        Bucketing::Boundaries(b) => {
            let (lo, hi) = (b.first().copied().unwrap_or(0.0), b.last().copied().unwrap_or(1.0));
            format!("{:.3}", lo - 1.0 + rng.uniform() * (hi - lo + 2.0))
        }
        Bucketing::Scaled { min, max, .. } => format!("{:.3}", min + rng.uniform() * (max - min)),
        Bucketing::RawPositions { .. } => format!("{:.3}", rng.uniform() * 10.0),
        _ => format!("t{}", rng.below(50)),
    }
}

/// A value for `field` that every feature reading it accepts.
fn cell(plan: &TrainingPlan, field: &str, ty: ColumnType, rng: &mut Rng) -> Cell {
    if let Some(l) = plan.data.label_fields.iter().position(|l| l == field) {
        // A soft label of several values: probabilities, single digits
        // (tenths) where the separator is empty (split into bytes).
        if let Some(shape) = plan.data.label_shapes.get(l).filter(|s| s.dim > 1) {
            let values: Vec<String> = (0..shape.dim)
                .map(|_| match shape.separator.is_empty() {
                    true => rng.below(10).to_string(),
                    false => format!("{:.3}", rng.uniform()),
                })
                .collect();
            let sep = shape.separator.chars().next().map(String::from).unwrap_or_default();
            return Cell::Str(values.join(&sep));
        }
        return match ty {
            ColumnType::Float => Cell::Float(rng.below(2) as f64),
            ColumnType::Str => Cell::Str(rng.below(2).to_string()),
            _ => Cell::Int(rng.below(2) as i64),
        };
    }
    // An ExprFeature reads its inputs as numbers, whatever else reads them.
    let in_expr = plan
        .features
        .iter()
        .any(|f| matches!(f.kind, FeatureKind::Raw { expr: Some(_), .. }) && f.inputs.iter().any(|i| i == field));
    if in_expr {
        let v = rng.below(10);
        return match ty {
            ColumnType::Float => Cell::Float(v as f64),
            ColumnType::Str => Cell::Str(v.to_string()),
            _ => Cell::Int(v as i64),
        };
    }
    let feature = plan.features.iter().find(|f| f.inputs.iter().any(|i| i == field));
    let text = match feature.map(|f| &f.kind) {
        Some(FeatureKind::Tag {
            buckets,
            separator,
            kv_separator,
        }) if ty == ColumnType::Str => {
            let n = 1 + rng.below(3);
            let mut s = String::new();
            for i in 0..n {
                if i > 0 {
                    s.push_str(separator);
                }
                s.push_str(&token(rng, buckets));
                if let Some(kv) = kv_separator {
                    let _ = write!(s, "{kv}{:.2}", rng.uniform());
                }
            }
            Some(s)
        }
        // Histories of 0 to 4 values.
        Some(FeatureKind::Sequence {
            buckets,
            separator,
            multi,
            ..
        }) if ty == ColumnType::Str => Some(
            (0..rng.below(5))
                .map(|_| match multi {
                    // One to three values per position.
                    Some(m) => (0..1 + rng.below(3))
                        .map(|_| token(rng, buckets))
                        .collect::<Vec<_>>()
                        .join(&m.separator),
                    None => token(rng, buckets),
                })
                .collect::<Vec<_>>()
                .join(separator),
        ),
        Some(FeatureKind::Raw {
            dim,
            min_max,
            separator,
            ..
        }) => {
            let (lo, hi) = min_max.unwrap_or((0.0, 10.0));
            let mut v: Vec<f64> = (0..*dim).map(|_| lo + (hi - lo) * rng.uniform()).collect();
            if ty == ColumnType::Int {
                v.iter_mut().for_each(|x| *x = x.floor());
            }
            if *dim > 1 || ty == ColumnType::Str {
                Some(v.iter().map(|x| format!("{x:.4}")).collect::<Vec<_>>().join(separator))
            } else if ty == ColumnType::Int {
                return Cell::Int(v[0] as i64);
            } else {
                return Cell::Float(v[0]);
            }
        }
        Some(FeatureKind::Combo { buckets, .. }) => Some(token(rng, &Bucketing::Hash(*buckets))),
        // Keys k0..k4; maps of 0 to 3 entries over the same keys, so some
        // rows find their key.
        Some(FeatureKind::Lookup {
            separator,
            kv_separator,
            max_selected,
            ..
        }) => Some(if feature.is_some_and(|f| f.inputs[0] == field) {
            format!("k{}", rng.below(5))
        } else {
            (0..rng.below(4).min(*max_selected as u64))
                .map(|i| format!("k{i}{kv_separator}v{}", rng.below(20)))
                .collect::<Vec<_>>()
                .join(separator)
        }),
        Some(FeatureKind::Id { buckets }) => match (ty, buckets) {
            (ColumnType::Int, Bucketing::Identity(n)) => return Cell::Int(rng.below((*n).max(1)) as i64),
            (ColumnType::Str, b) => Some(token(rng, b)),
            _ => None,
        },
        _ => None,
    };
    match (text, ty) {
        (Some(s), _) => Cell::Str(s),
        (None, ColumnType::Int) => Cell::Int(rng.below(50) as i64),
        (None, ColumnType::Float) => Cell::Float(rng.uniform() * 10.0),
        (None, ColumnType::Bool) => Cell::Bool(rng.below(2) == 1),
        (None, ColumnType::Str) => Cell::Str(format!("s{}", rng.below(50))),
    }
}

/// Writes `rows` random rows with the plan's input fields to `path`, as CSV
/// or Parquet according to the plan's input type.
pub fn generate_for_plan(plan: &TrainingPlan, rows: usize, seed: u64, path: &Path) -> anyhow::Result<()> {
    let mut rng = Rng::new(seed);
    let table: Vec<Vec<Cell>> = (0..rows)
        .map(|_| {
            plan.data
                .fields
                .iter()
                .map(|f| cell(plan, &f.name, f.ty, &mut rng))
                .collect()
        })
        .collect();
    match &plan.data.format {
        InputFormat::TfRecord {
            compression,
            rows_per_record,
        } => {
            use crate::tf_proto::{
                feature::Kind, BytesList, Example, Feature, FeatureList, FeatureLists, Features, FloatList, Int64List,
                SequenceExample,
            };
            let feature = |c: &Cell| {
                let kind = match c {
                    Cell::Int(v) => Kind::Int64List(Int64List { value: vec![*v] }),
                    Cell::Bool(b) => Kind::Int64List(Int64List {
                        value: vec![i64::from(*b)],
                    }),
                    Cell::Float(v) => Kind::FloatList(FloatList { value: vec![*v as f32] }),
                    Cell::Str(s) => Kind::BytesList(BytesList {
                        value: vec![s.clone().into_bytes()],
                    }),
                };
                Feature { kind: Some(kind) }
            };
            let mut out = Vec::new();
            // A batched record holds its rows; whole records only.
            for rows in table.chunks(rows_per_record.unwrap_or(1)) {
                let bytes = match rows_per_record {
                    None => {
                        let feature = plan
                            .data
                            .fields
                            .iter()
                            .zip(&rows[0])
                            .map(|(f, c)| (f.name.clone(), feature(c)))
                            .collect();
                        prost::Message::encode_to_vec(&Example {
                            features: Some(Features { feature }),
                        })
                    }
                    Some(n) if rows.len() < *n => break,
                    Some(_) => {
                        let feature_list = plan
                            .data
                            .fields
                            .iter()
                            .enumerate()
                            .map(|(i, f)| {
                                let list = FeatureList {
                                    feature: rows.iter().map(|r| feature(&r[i])).collect(),
                                };
                                (f.name.clone(), list)
                            })
                            .collect();
                        prost::Message::encode_to_vec(&SequenceExample {
                            context: None,
                            feature_lists: Some(FeatureLists { feature_list }),
                        })
                    }
                };
                crate::data::tfrecord::write_record(&mut out, &bytes)?;
            }
            std::fs::write(path, crate::data::tfrecord::compress(&out, *compression))
                .with_context(|| format!("cannot write {}", path.display()))
        }
        InputFormat::CriteoBinary { parts } => {
            // The part whose label file `path` is names the other two.
            let name = path.to_string_lossy();
            let part = parts
                .iter()
                .find(|p| p.label == name)
                .with_context(|| format!("{name} is no label file of the plan's binary input"))?;
            // The table's cells of label, f1..f13 and c1..c26 (0 where the
            // config declares no such field), as numbers.
            let at = |name: String| plan.data.fields.iter().position(|f| f.name == name);
            let (label, dense, category) = (
                at("label".into()),
                std::array::from_fn::<_, { criteo::DENSE }, _>(|i| at(format!("f{}", i + 1))),
                std::array::from_fn::<_, { criteo::CATEGORICAL }, _>(|i| at(format!("c{}", i + 1))),
            );
            let number = |row: &[Cell], field: Option<usize>| match field.map(|k| &row[k]) {
                Some(Cell::Int(v)) => *v as f64,
                Some(Cell::Float(v)) => *v,
                Some(Cell::Bool(b)) => f64::from(u8::from(*b)),
                Some(Cell::Str(s)) => s.parse().unwrap_or(0.0),
                None => 0.0,
            };
            let rows: Vec<_> = table
                .iter()
                .map(|row| {
                    let y = number(row, label) as i32;
                    let f = dense.map(|k| number(row, k) as f32);
                    let c = category.map(|k| number(row, k) as i32);
                    (y, f, c)
                })
                .collect();
            criteo::write_part((path, Path::new(&part.dense), Path::new(&part.category)), &rows)
                .with_context(|| format!("cannot write the binary part of {name}"))
        }
        InputFormat::Csv { separator, with_header } => {
            let mut text = String::new();
            if *with_header {
                let names: Vec<&str> = plan.data.fields.iter().map(|f| f.name.as_str()).collect();
                text.push_str(&names.join(separator));
                text.push('\n');
            }
            for row in &table {
                let cells: Vec<String> = row.iter().map(Cell::text).collect();
                text.push_str(&cells.join(separator));
                text.push('\n');
            }
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        InputFormat::Rtp { layout, .. } => {
            let separator = plan.data.format.field_separator();
            // The label fields in their columns, every other field in the
            // feature column; columns nothing reads hold a filler.
            let width = layout
                .label_cols
                .iter()
                .chain([&layout.feature_col])
                .max()
                .map_or(0, |c| c + 1);
            let nlab = layout.label_cols.len();
            let mut text = String::new();
            for row in &table {
                let mut cols = vec!["-".to_string(); width];
                for (i, &c) in layout.label_cols.iter().enumerate() {
                    cols[c] = row[i].text();
                }
                let feats: Vec<String> = row[nlab..].iter().map(Cell::text).collect();
                cols[layout.feature_col] = feats.join(separator);
                text.push_str(&cols.join(&layout.rtp_separator));
                text.push('\n');
            }
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        InputFormat::Parquet { .. } => {
            let mut fields = Vec::new();
            let mut columns: Vec<ArrayRef> = Vec::new();
            for (c, f) in plan.data.fields.iter().enumerate() {
                let col = table.iter().map(|r| &r[c]);
                let (dt, array): (DataType, ArrayRef) = match &table.first().map(|r| &r[c]) {
                    Some(Cell::Int(_)) => (
                        DataType::Int64,
                        Arc::new(Int64Array::from_iter_values(col.map(|v| match v {
                            Cell::Int(i) => *i,
                            _ => 0,
                        }))),
                    ),
                    Some(Cell::Float(_)) => (
                        DataType::Float64,
                        Arc::new(Float64Array::from_iter_values(col.map(|v| match v {
                            Cell::Float(x) => *x,
                            _ => 0.0,
                        }))),
                    ),
                    Some(Cell::Bool(_)) => (
                        DataType::Boolean,
                        Arc::new(BooleanArray::from(
                            col.map(|v| matches!(v, Cell::Bool(true))).collect::<Vec<_>>(),
                        )),
                    ),
                    _ => (
                        DataType::Utf8,
                        Arc::new(StringArray::from_iter_values(col.map(Cell::text))),
                    ),
                };
                fields.push(Field::new(&f.name, dt, false));
                columns.push(array);
            }
            let schema = Arc::new(Schema::new(fields));
            let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut w = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None)?;
            w.write(&RecordBatch::try_new(schema, columns)?)?;
            w.close()?;
            Ok(())
        }
    }
}

/// Writes the tables of the plan's negative sampler where its config puts
/// them: `items` items with ids `0..items`, random weights, and attributes
/// that fit the features reading each of `attr_fields`, in EasyRec's
/// layout (a `name:type` header, then id, weight and the attributes joined
/// by `attr_delimiter`, tab-separated); and for samplers with a user side
/// the users that `generate_for_plan` writes, each with three positive and
/// three hard-negative edges.
pub fn generate_sampler_tables(plan: &TrainingPlan, items: usize, seed: u64) -> anyhow::Result<()> {
    let s = plan
        .data
        .negative_sampling
        .as_ref()
        .context("the config has no negative sampler")?;
    let ty_of = |name: &str| {
        plan.data
            .fields
            .iter()
            .find(|f| f.name == name)
            .map_or(ColumnType::Str, |f| f.ty)
    };
    let write = |path: &str, text: String| std::fs::write(path, text).with_context(|| format!("cannot write {path}"));
    let mut rng = Rng::new(seed);
    let mut text = String::from("id:int64\tweight:float\tfeature:string\n");
    for id in 0..items {
        let attrs: Vec<String> = s
            .attr_fields
            .iter()
            .map(|a| cell(plan, a, ty_of(a), &mut rng).text())
            .collect();
        let _ = writeln!(
            text,
            "{id}\t{:.3}\t{}",
            0.5 + rng.uniform(),
            attrs.join(&s.attr_delimiter)
        );
    }
    write(&s.items_path, text)?;
    let Some(u) = &s.users else { return Ok(()) };
    let ty = ty_of(&u.user_id_field);
    let mut users: Vec<String> = (0..400)
        .map(|_| cell(plan, &u.user_id_field, ty, &mut rng).text())
        .collect();
    users.sort();
    users.dedup();
    let mut table = String::from("id:int64\tweight:float\n");
    users.iter().for_each(|id| {
        let _ = writeln!(table, "{id}\t1.0");
    });
    write(&u.users_path, table)?;
    for path in [&u.positive_edges, &u.hard_edges].into_iter().flatten() {
        let mut edges = String::from("userid:int64\titemid:int64\tweight:float\n");
        for id in &users {
            for _ in 0..3 {
                let _ = writeln!(edges, "{id}\t{}\t1.0", rng.below(items as u64));
            }
        }
        write(path, edges)?;
    }
    Ok(())
}
