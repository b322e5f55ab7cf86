//! Feature encoding: raw columns -> dense values and jagged row ids, one
//! entry per configured feature, plus labels (and the GAUC group key).

pub mod fingerprint;

use std::collections::HashMap;

use anyhow::{bail, Context};

use crate::config::data_plan::LabelShape;
use crate::config::feature_plan::{Bucketing, FeatureKind, MultiValue, PositionCombiner};
use crate::config::typed::TrainingPlan;
use crate::data::{Column, Projection, RawBatch};
use crate::util::{hash_i64, hash_str, with_decimal};

/// Ids of one feature for a batch: row `b` owns `ids[offsets[b]..offsets[b+1]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Jagged {
    pub ids: Vec<u64>,
    pub offsets: Vec<u32>,
    pub weights: Option<Vec<f32>>,
    /// A sequence whose positions hold several ids (`seq_multi_sep`): where
    /// each id goes; otherwise id `k` of a row is its position `k`.
    pub positions: Option<SeqPositions>,
}

/// The position of each id of a jagged sequence and each row's count of
/// positions (which may exceed its ids' last position: positions without
/// values count, as EasyRec's sparse sequence lengths do).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeqPositions {
    pub of_id: Vec<u32>,
    pub lens: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Encoded {
    /// Row-major `[batch, dim]`.
    Dense {
        dim: usize,
        values: Vec<f32>,
    },
    Sparse(Jagged),
}

/// A batch ready for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub size: usize,
    /// For each of `data_config.label_fields`, its values row by row: one
    /// per row, or `label_dim` (a distillation's soft labels).
    pub labels: Vec<Vec<f32>>,
    pub features: Vec<Encoded>,
    /// Hashed `uid_field` per row, when a GAUC metric needs it.
    pub uids: Option<Vec<u64>>,
    /// Hashed item id per example (`ModelPlan::in_batch_item`), when the
    /// in-batch softmax leaves out the batch's examples of a user's item.
    pub item_keys: Option<Vec<u64>>,
    /// Each example's `data_config.sample_weight`, when the config names one.
    pub weights: Option<Vec<f32>>,
    /// The last rows are this many items drawn by a negative sampler, no
    /// examples: `labels`, `weights` and `uids` cover only the
    /// `size - sampled` before.
    pub sampled: usize,
    /// Among the sampled rows, the hard negatives: per one, the example
    /// whose user it belongs to and its row.
    pub hard_negatives: Vec<(usize, usize)>,
}

impl Batch {
    /// The rows that are examples.
    pub fn examples(&self) -> usize {
        self.size - self.sampled
    }

    /// Marks the last `n` rows as sampled items: they lose their labels.
    pub fn mark_sampled(&mut self, n: usize) {
        let size = self.size;
        self.sampled = n;
        let rows = self.examples();
        self.labels
            .iter_mut()
            .for_each(|l| l.truncate(rows * (l.len() / size.max(1))));
        if let Some(u) = &mut self.uids {
            u.truncate(rows);
        }
        if let Some(k) = &mut self.item_keys {
            k.truncate(rows);
        }
        if let Some(w) = &mut self.weights {
            w.truncate(rows);
        }
    }
}

/// The bucket of a `hash_bucket_size` feature's value, exactly as
/// TensorFlow's `string_to_hash_bucket_fast` (and so EasyRec) computes it:
/// FarmHash Fingerprint64 of the UTF-8 text, modulo the buckets.
pub fn hash_bucket_str(value: &str, buckets: u64) -> u64 {
    fingerprint::fingerprint64(value.as_bytes()) % buckets
}

/// `hash_bucket_str` of an integer's decimal text (`tf.as_string`), so an
/// id lands in the same bucket from an integer column and from text.
pub fn hash_bucket_i64(value: i64, buckets: u64) -> u64 {
    with_decimal(value, |s| fingerprint::fingerprint64(s.as_bytes())) % buckets
}

#[derive(Debug, Clone)]
enum Buckets {
    Hash(u64),
    /// `num_buckets` ids; one outside them is read as 0 (EasyRec's identity
    /// column has `default_value=0`), warned of once (`warned`).
    Identity {
        n: u64,
        warned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    },
    /// Known values -> index; anything else -> row 0, as EasyRec's
    /// vocabulary columns do (`default_value=0`, no out-of-vocabulary row).
    Vocab(HashMap<String, u64>),
    /// Sorted boundaries: a number's id counts those at most it.
    Boundaries(Vec<f64>),
    /// `Bucketing::Scaled`: float32 `(x - min) / (max - min)` bucketized
    /// by float32 boundaries `k / n`.
    Scaled {
        min: f32,
        max: f32,
        bounds: Vec<f32>,
    },
}

impl Buckets {
    fn new(b: &Bucketing, feature: &str) -> anyhow::Result<Self> {
        Ok(match b {
            Bucketing::Hash(n) => Buckets::Hash(*n),
            Bucketing::Identity(n) => Buckets::Identity {
                n: *n,
                warned: Default::default(),
            },
            Bucketing::Vocab(v) => Buckets::Vocab(v.iter().enumerate().map(|(i, s)| (s.clone(), i as u64)).collect()),
            Bucketing::Boundaries(b) => Buckets::Boundaries(b.clone()),
            Bucketing::RawPositions { .. } => unreachable!("projected raw sequences have their own encoding"),
            Bucketing::Scaled { min, max, buckets } => Buckets::Scaled {
                min: *min as f32,
                max: *max as f32,
                bounds: (0..*buckets).map(|k| (k as f64 / *buckets as f64) as f32).collect(),
            },
            Bucketing::VocabFile(p) => {
                let text = crate::bounded::read_text(p, crate::bounded::table_bytes())
                    .with_context(|| format!("feature `{feature}`: cannot read vocab_file {}", p.display()))?;
                Buckets::Vocab(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .enumerate()
                        .map(|(i, s)| (s.to_string(), i as u64))
                        .collect(),
                )
            }
        })
    }

    fn rows(&self) -> u64 {
        match self {
            Buckets::Hash(n) | Buckets::Identity { n, .. } => *n,
            Buckets::Vocab(m) => (m.len() as u64).max(1),
            Buckets::Boundaries(b) => b.len() as u64 + 1,
            Buckets::Scaled { bounds, .. } => bounds.len() as u64 + 1,
        }
    }

    fn of_str(&self, s: &str, feature: &str) -> anyhow::Result<u64> {
        Ok(match self {
            Buckets::Hash(n) => hash_bucket_str(s, *n),
            Buckets::Identity { .. } => {
                let v: i64 = s
                    .trim()
                    .parse()
                    .with_context(|| format!("feature `{feature}`: `{s}` is not an integer id (num_buckets is set)"))?;
                self.identity(v, feature)
            }
            Buckets::Vocab(m) => m.get(s).copied().unwrap_or(0),
            Buckets::Boundaries(b) => {
                let x: f64 = s
                    .trim()
                    .parse()
                    .with_context(|| format!("feature `{feature}`: `{s}` is not a number (boundaries are set)"))?;
                b.partition_point(|v| *v <= x) as u64
            }
            Buckets::Scaled { .. } => {
                let x: f64 = s
                    .trim()
                    .parse()
                    .with_context(|| format!("feature `{feature}`: `{s}` is not a number (num_buckets scales it)"))?;
                self.scaled(x)
            }
        })
    }

    /// A number's bucket among `Scaled` boundaries.
    fn scaled(&self, x: f64) -> u64 {
        let Buckets::Scaled { min, max, bounds } = self else {
            unreachable!("only scaled buckets scale")
        };
        let v = (x as f32 - min) / (max - min);
        bounds.partition_point(|b| *b <= v) as u64
    }

    fn of_int(&self, v: i64, feature: &str) -> anyhow::Result<u64> {
        Ok(match self {
            Buckets::Hash(n) => hash_bucket_i64(v, *n),
            Buckets::Identity { .. } => self.identity(v, feature),
            Buckets::Vocab(m) => m.get(&v.to_string()).copied().unwrap_or(0),
            Buckets::Boundaries(b) => b.partition_point(|x| *x <= v as f64) as u64,
            Buckets::Scaled { .. } => self.scaled(v as f64),
        })
    }

    /// Id `v` of an identity column: itself within [0, num_buckets), else 0.
    fn identity(&self, v: i64, feature: &str) -> u64 {
        let Buckets::Identity { n, warned } = self else {
            unreachable!("only identity buckets read ids as they are")
        };
        if v >= 0 && (v as u64) < *n {
            return v as u64;
        }
        if !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            log::warn!(
                "feature `{feature}`: id {v} is outside [0, num_buckets = {n}): read as id 0, as EasyRec's identity \
                 column does (default_value 0); further ids outside it are read so without a warning"
            );
        }
        0
    }
}

#[derive(Debug, Clone)]
enum Enc {
    /// An ExprFeature: one number per row from its input columns.
    Expr {
        cols: Vec<usize>,
        expr: crate::config::expr::Expression,
        name: String,
        inputs: Vec<String>,
    },
    /// `FeatureKind::Lookup`.
    Lookup {
        key_col: usize,
        map_col: usize,
        buckets: u64,
        separator: String,
        kv_separator: String,
        max_selected: usize,
    },
    Dense {
        col: usize,
        dim: usize,
        min_max: Option<(f64, f64)>,
        separator: String,
    },
    /// A RawFeature with boundaries, bucketized as EasyRec does it: the
    /// value as float32, scaled by min_val / max_val when set (EasyRec's
    /// input scales before the bucketized column reads it), against the
    /// boundaries as float32.
    Bucketized {
        col: usize,
        boundaries: Vec<f32>,
        min_max: Option<(f64, f64)>,
    },
    /// A RawFeature with embedding_dim and no boundaries, as EasyRec builds
    /// it: value `k` of the row weights row `k` of a `[dim, embedding_dim]`
    /// table (`<name>_raw_proj_val`).
    Projected {
        col: usize,
        dim: usize,
        min_max: Option<(f64, f64)>,
        separator: String,
    },
    Id {
        col: usize,
        buckets: Buckets,
    },
    Tag {
        col: usize,
        buckets: Buckets,
        separator: String,
        kv_separator: Option<String>,
        /// A second input holding one weight per tag (EasyRec's
        /// `<name>_w` weighted column).
        weight_col: Option<usize>,
        /// A sequence keeps its first `max_len` values (positions).
        max_len: Option<usize>,
        /// A sequence of several values per position.
        multi: Option<MultiValue>,
    },
    /// `Bucketing::RawPositions`: `len` positions per row, values weighting
    /// row `t` (0 from `t = dim` on), several per position split by
    /// `multi_sep`; a mean combiner divides a position's weights by their sum.
    RawPositions {
        col: usize,
        dim: u32,
        len: usize,
        separator: String,
        multi_sep: Option<String>,
        mean: bool,
    },
    Combo {
        cols: Vec<usize>,
        buckets: u64,
        join_sep: String,
        /// Per input, the separator splitting its values ("" or none: one value).
        input_seps: Vec<String>,
    },
}

/// Turns raw batches into model batches. Cheap to clone into reader threads.
/// Input data the features cannot encode: a user error (exit code 1).
#[derive(Debug, thiserror::Error)]
#[error("bad input data: {0}")]
pub struct EncodeError(pub String);

impl crate::error::Classified for EncodeError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// What a label field's values must be, by the losses trained on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LabelKind {
    Any,
    /// In [0, 1].
    Binary,
    /// A class index below the count.
    Class(usize),
}

#[derive(Debug, Clone)]

pub struct Encoder {
    pub projection: Projection,
    names: Vec<String>,
    encs: Vec<Enc>,
    /// One per label field; none when encoding for inference, where inputs
    /// may have no label.
    label_cols: Vec<usize>,
    /// Per label field: a classification task trains on it, so its values
    /// must lie in [0, 1]; a multi-class one, so they must be class
    /// indices (whole numbers below the count given).
    label_kinds: Vec<LabelKind>,
    /// Per label field, its values per row and their separator.
    label_shapes: Vec<LabelShape>,
    uid_col: Option<usize>,
    /// `ModelPlan::in_batch_item`'s column.
    item_col: Option<usize>,
    /// Labels appended as two labels' product (`ModelPlan::label_products`).
    label_products: Vec<(usize, usize)>,
    /// `data_config.sample_weight`'s column (training and evaluation).
    weight_col: Option<usize>,
}

impl Encoder {
    pub fn new(plan: &TrainingPlan, uid_field: Option<&str>) -> anyhow::Result<Self> {
        Self::build(plan, uid_field, true)
    }

    /// An encoder that reads no label column (batches carry no labels).
    pub fn for_inference(plan: &TrainingPlan) -> anyhow::Result<Self> {
        Self::build(plan, None, false)
    }

    fn build(plan: &TrainingPlan, uid_field: Option<&str>, with_label: bool) -> anyhow::Result<Self> {
        let mut projection = Projection::default();
        let col = |p: &mut Projection, name: &str, required: bool| {
            p.add(name, &plan.data.fields, required)
                .with_context(|| format!("`{name}` is not among data_config.input_fields"))
        };
        let label_cols = if with_label {
            plan.data
                .label_fields
                .iter()
                .map(|l| col(&mut projection, l, true))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let mut encs = Vec::new();
        for f in &plan.features {
            let first = f
                .inputs
                .first()
                .with_context(|| format!("feature `{}` has no input_names", f.name))?;
            let enc = match &f.kind {
                FeatureKind::Raw { expr: Some(expr), .. } => Enc::Expr {
                    cols: f
                        .inputs
                        .iter()
                        .map(|i| col(&mut projection, i, false))
                        .collect::<anyhow::Result<_>>()?,
                    expr: expr.clone(),
                    name: f.name.clone(),
                    inputs: f.inputs.clone(),
                },
                FeatureKind::Raw {
                    dim,
                    min_max,
                    boundaries,
                    separator,
                    expr: None,
                } => {
                    let c = col(&mut projection, first, false)?;
                    if !boundaries.is_empty() {
                        if boundaries.windows(2).any(|w| w[1] <= w[0]) {
                            bail!("feature `{}`: boundaries must be strictly increasing", f.name);
                        }
                        Enc::Bucketized {
                            col: c,
                            boundaries: boundaries.iter().map(|&b| b as f32).collect(),
                            min_max: *min_max,
                        }
                    } else if f.embedding_dim > 0 {
                        Enc::Projected {
                            col: c,
                            dim: *dim as usize,
                            min_max: *min_max,
                            separator: separator.clone(),
                        }
                    } else {
                        Enc::Dense {
                            col: c,
                            dim: *dim as usize,
                            min_max: *min_max,
                            separator: separator.clone(),
                        }
                    }
                }
                FeatureKind::Id { buckets } => Enc::Id {
                    col: col(&mut projection, first, false)?,
                    buckets: Buckets::new(buckets, &f.name)?,
                },
                FeatureKind::Tag {
                    buckets,
                    separator,
                    kv_separator,
                } => {
                    let weight_col = match f.inputs.get(1) {
                        Some(_) if kv_separator.is_some() => bail!(
                            "TagFeature `{}` has both kv_separator and a weight input (`{}`); give its weights one way",
                            f.name,
                            f.inputs[1]
                        ),
                        Some(w) => Some(col(&mut projection, w, false)?),
                        None => None,
                    };
                    Enc::Tag {
                        col: col(&mut projection, first, false)?,
                        buckets: Buckets::new(buckets, &f.name)?,
                        separator: separator.clone(),
                        kv_separator: kv_separator.clone(),
                        weight_col,
                        max_len: None,
                        multi: None,
                    }
                }
                FeatureKind::Sequence {
                    buckets: Bucketing::RawPositions { dim },
                    separator,
                    max_len,
                    multi,
                    ..
                } => Enc::RawPositions {
                    col: col(&mut projection, first, false)?,
                    dim: *dim,
                    len: *max_len,
                    separator: separator.clone(),
                    multi_sep: multi.as_ref().map(|m| m.separator.clone()),
                    mean: multi.as_ref().is_some_and(|m| m.combiner == PositionCombiner::Mean),
                },
                FeatureKind::Sequence {
                    buckets,
                    separator,
                    max_len,
                    multi,
                    ..
                } => Enc::Tag {
                    col: col(&mut projection, first, false)?,
                    buckets: Buckets::new(buckets, &f.name)?,
                    separator: separator.clone(),
                    kv_separator: None,
                    weight_col: None,
                    max_len: Some(*max_len),
                    multi: multi.clone(),
                },
                FeatureKind::Lookup {
                    buckets,
                    separator,
                    kv_separator,
                    max_selected,
                } => Enc::Lookup {
                    key_col: col(&mut projection, first, false)?,
                    map_col: col(&mut projection, &f.inputs[1], false)?,
                    buckets: *buckets,
                    separator: separator.clone(),
                    kv_separator: kv_separator.clone(),
                    max_selected: *max_selected,
                },
                FeatureKind::Combo {
                    buckets,
                    join_sep,
                    input_seps,
                } => Enc::Combo {
                    cols: f
                        .inputs
                        .iter()
                        .map(|i| col(&mut projection, i, false))
                        .collect::<anyhow::Result<_>>()?,
                    buckets: *buckets,
                    join_sep: join_sep.clone(),
                    input_seps: input_seps.clone(),
                },
            };
            encs.push(enc);
        }
        let uid_col = uid_field.map(|u| col(&mut projection, u, false)).transpose()?;
        let item_col = plan
            .model
            .in_batch_item
            .as_deref()
            .filter(|_| with_label)
            .map(|i| col(&mut projection, i, false))
            .transpose()?;
        let weight_col = plan
            .data
            .sample_weight
            .as_deref()
            .filter(|_| with_label)
            .map(|w| col(&mut projection, w, false))
            .transpose()?;
        if let Some(s) = plan.data.negative_sampling.as_ref().filter(|_| with_label) {
            // The sampler skips the batch's own items, or its users'.
            col(&mut projection, &s.item_id_field, false)?;
            if let Some(u) = &s.users {
                col(&mut projection, &u.user_id_field, false)?;
            }
        }
        Ok(Encoder {
            projection,
            names: plan.features.names(),
            encs,
            label_cols,
            label_kinds: (0..plan.data.label_fields.len())
                .map(|l| {
                    let on = || plan.model.tasks.iter().filter(move |t| t.label == l);
                    match on().map(|t| t.classes()).max() {
                        Some(c) if c > 1 => LabelKind::Class(c),
                        _ if on().any(|t| t.classification()) => LabelKind::Binary,
                        _ => LabelKind::Any,
                    }
                })
                .collect(),
            label_shapes: plan.data.label_shapes.clone(),
            uid_col,
            item_col,
            weight_col,
            label_products: if with_label {
                plan.model.label_products()
            } else {
                Vec::new()
            },
        })
    }

    /// Embedding rows a sparse feature addresses; `None` for dense features.
    pub fn table_rows(&self, feature: usize) -> Option<u64> {
        match &self.encs[feature] {
            Enc::Dense { .. } | Enc::Expr { .. } => None,
            Enc::Bucketized { boundaries, .. } => Some(boundaries.len() as u64 + 1),
            Enc::Projected { dim, .. } => Some(*dim as u64),
            Enc::RawPositions { dim, .. } => Some(*dim as u64),
            Enc::Id { buckets, .. } | Enc::Tag { buckets, .. } => Some(buckets.rows()),
            Enc::Combo { buckets, .. } | Enc::Lookup { buckets, .. } => Some(*buckets),
        }
    }

    /// Width of a dense feature.
    pub fn dense_dim(&self, feature: usize) -> Option<usize> {
        match &self.encs[feature] {
            Enc::Dense { dim, .. } => Some(*dim),
            Enc::Expr { .. } => Some(1),
            _ => None,
        }
    }

    /// Encodes a batch of raw columns; a value the features cannot take
    /// (an id outside num_buckets, a non-numeric label, ...) is an
    /// `EncodeError`, the user's data problem.
    pub fn encode(&self, raw: &RawBatch) -> anyhow::Result<Batch> {
        self.encode_columns(raw)
            .map_err(|e| anyhow::Error::new(EncodeError(format!("{e:#}"))))
    }

    fn encode_columns(&self, raw: &RawBatch) -> anyhow::Result<Batch> {
        let n = raw.num_rows;
        let scalar = LabelShape::scalar();
        let mut labels = self
            .label_cols
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let shape = self.label_shapes.get(i).unwrap_or(&scalar);
                label_values(&raw.columns[c], shape, &self.projection.columns[c].name)
            })
            .collect::<anyhow::Result<Vec<Vec<f32>>>>()?;
        for &(a, b) in &self.label_products {
            let product = labels[a].iter().zip(&labels[b]).map(|(x, y)| x * y).collect();
            labels.push(product);
        }
        for (values, &c) in labels.iter().zip(&self.label_cols) {
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                bail!(
                    "label column `{}` holds {v}, which is not a finite number",
                    self.projection.columns[c].name
                );
            }
        }
        for ((values, &c), kind) in labels.iter().zip(&self.label_cols).zip(&self.label_kinds) {
            let name = &self.projection.columns[c].name;
            match *kind {
                LabelKind::Any => {}
                LabelKind::Binary => {
                    if let Some(v) = values.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                        bail!("label column `{name}` holds {v}, which is not in [0, 1] as a classification loss needs");
                    }
                }
                LabelKind::Class(n) => {
                    if let Some(v) = values
                        .iter()
                        .find(|v| v.fract() != 0.0 || !(0.0..n as f32).contains(*v))
                    {
                        bail!("label column `{name}` holds {v}, which is not a class index in 0..{n} as num_class {n} needs");
                    }
                }
            }
        }
        let weights = match self.weight_col.map(|c| (c, &raw.columns[c])) {
            None => None,
            Some((_, Column::Float(v))) => Some(v.iter().map(|x| *x as f32).collect::<Vec<f32>>()),
            Some((_, Column::Int(v))) => Some(v.iter().map(|x| *x as f32).collect()),
            Some((c, other)) => bail!(
                "sample weight column `{}` holds {} values; it must be numeric",
                self.projection.columns[c].name,
                other.type_name()
            ),
        };
        if let Some(v) = weights.iter().flatten().find(|v| !v.is_finite() || **v < 0.0) {
            bail!(
                "sample weight column `{}` holds {v}, which is not a finite number >= 0",
                self.projection.columns[self.weight_col.unwrap_or(0)].name
            );
        }
        let features = self
            .encs
            .iter()
            .zip(&self.names)
            .map(|(e, name)| encode_one(e, raw, n).with_context(|| format!("encoding feature `{name}`")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let keys = |c: usize| -> Vec<u64> {
            match &raw.columns[c] {
                Column::Int(v) => v.iter().map(|x| hash_i64(*x)).collect(),
                Column::Str(s) => (0..n).map(|i| hash_str(s.get(i))).collect(),
                Column::Float(v) => v.iter().map(|x| x.to_bits()).collect(),
                Column::List { .. } => vec![0; n],
            }
        };
        let uids = self.uid_col.map(keys);
        let item_keys = self.item_col.map(keys);
        Ok(Batch {
            size: n,
            labels,
            features,
            uids,
            item_keys,
            weights,
            sampled: 0,
            hard_negatives: Vec::new(),
        })
    }
}

/// A label column's values: numbers as they are; text as numbers, as
/// EasyRec's `string_to_number`, each row split into `shape.dim` of them
/// where over one (by any character of the separator, empty parts
/// skipped, or into single bytes by an empty one: TensorFlow's
/// `string_split`).
fn label_values(col: &Column, shape: &LabelShape, name: &str) -> anyhow::Result<Vec<f32>> {
    let number = |t: &str| {
        t.trim()
            .parse::<f32>()
            .with_context(|| format!("label column `{name}` holds `{t}`, which is not a number"))
    };
    match col {
        Column::Float(v) if shape.dim == 1 => Ok(v.iter().map(|x| *x as f32).collect()),
        Column::Int(v) if shape.dim == 1 => Ok(v.iter().map(|x| *x as f32).collect()),
        Column::Str(s) if shape.dim == 1 => (0..s.len()).map(|r| number(s.get(r))).collect(),
        Column::Str(s) => {
            let mut out = Vec::with_capacity(s.len());
            for r in 0..s.len() {
                let text = s.get(r);
                let before = out.len();
                if shape.separator.is_empty() {
                    for k in 0..text.len() {
                        out.push(number(text.get(k..k + 1).unwrap_or("\u{fffd}"))?);
                    }
                } else {
                    for part in text.split(|c| shape.separator.contains(c)).filter(|p| !p.is_empty()) {
                        out.push(number(part)?);
                    }
                }
                let got = out.len() - before;
                if got != shape.dim {
                    bail!(
                        "label column `{name}` holds `{text}`: {got} value(s) where data_config.label_dim gives {}",
                        shape.dim
                    );
                }
            }
            Ok(out)
        }
        other => bail!(
            "label column `{name}` holds {} values; it must be numbers{}",
            other.type_name(),
            if shape.dim > 1 { " split from text" } else { "" }
        ),
    }
}

/// The ids of the cross of `parts` (each input's values), as EasyRec's
/// ComboFeature computes them: per element of the cartesian product,
/// TensorFlow's crossed-column hash (`SparseCrossHashed`: FingerprintCat64
/// over the values' Fingerprint64, from its default key), or with
/// `join_sep` the Fingerprint64 of the values joined by it.
pub fn cross(parts: &[Vec<String>], buckets: u64, join_sep: &str, out: &mut Vec<u64>) {
    const HASH_KEY: u64 = 0x00DE_CAFC_AFFE;
    if parts.iter().any(Vec::is_empty) {
        return;
    }
    let mut idx = vec![0usize; parts.len()];
    loop {
        let id = if join_sep.is_empty() {
            idx.iter().zip(parts).fold(HASH_KEY, |h, (&k, p)| {
                fingerprint::fingerprint_cat64(h, fingerprint::fingerprint64(p[k].as_bytes()))
            }) % buckets
        } else {
            let text: Vec<&str> = idx.iter().zip(parts).map(|(&k, p)| p[k].as_str()).collect();
            fingerprint::fingerprint64(text.join(join_sep).as_bytes()) % buckets
        };
        out.push(id);
        // Next element: the last input varies fastest.
        let mut d = parts.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < parts[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Calls `f` with each value of row `r` as text or integer.
fn for_each_value(
    col: &Column,
    r: usize,
    separator: Option<&str>,
    f: &mut dyn FnMut(Value<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match col {
        Column::Int(v) => f(Value::Int(v[r])),
        Column::Float(v) => f(Value::Float(v[r])),
        Column::Str(s) => {
            let text = s.get(r);
            match separator {
                Some(sep) if !sep.is_empty() => {
                    for part in text.split(sep).filter(|p| !p.is_empty()) {
                        f(Value::Str(part))?;
                    }
                    Ok(())
                }
                _ if text.is_empty() => Ok(()),
                _ => f(Value::Str(text)),
            }
        }
        Column::List { offsets, values } => {
            for i in offsets[r]..offsets[r + 1] {
                for_each_value(values, i, None, f)?;
            }
            Ok(())
        }
    }
}

/// Calls `f` with each value at one position of a sequence: its text split
/// by `sep` (`seq_multi_sep`, empty parts dropped) when there is one, else
/// the value itself.
fn position_values<'a>(
    v: Value<'a>,
    sep: Option<&str>,
    f: &mut dyn FnMut(Value<'a>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    match (v, sep) {
        (Value::Str(s), Some(sep)) => s
            .split(sep)
            .filter(|p| !p.is_empty())
            .try_for_each(|p| f(Value::Str(p))),
        (v, _) => f(v),
    }
}

#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl Value<'_> {
    fn bucket(&self, b: &Buckets, feature: &str) -> anyhow::Result<u64> {
        match *self {
            Value::Int(v) => b.of_int(v, feature),
            Value::Float(v) if v.fract() == 0.0 => b.of_int(v as i64, feature),
            Value::Float(v) => b.of_str(&v.to_string(), feature),
            Value::Str(s) => b.of_str(s, feature),
        }
    }

    /// The value as a number. NaN and infinities are refused: they would
    /// poison training, and each scoring path (checkpoint, ONNX runtime)
    /// would carry them differently through bucketing and activations.
    fn number(&self) -> anyhow::Result<f64> {
        let x = match *self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
            Value::Str(s) => s.trim().parse().with_context(|| format!("`{s}` is not a number"))?,
        };
        if !x.is_finite() {
            bail!("{x} is not a finite number");
        }
        Ok(x)
    }

    fn text(&self) -> String {
        match *self {
            Value::Int(v) => v.to_string(),
            Value::Float(v) => v.to_string(),
            Value::Str(s) => s.to_string(),
        }
    }
}

/// The value a bucketized RawFeature compares with its boundaries, in
/// float32 as EasyRec's graph computes it: `to_float(x)`, then
/// `(x - min_val) / (max_val - min_val)` when max_val > min_val.
fn bucketized_value(x: f64, min_max: Option<(f64, f64)>) -> f32 {
    let x = x as f32;
    match min_max {
        Some((lo, hi)) if hi > lo => (x - lo as f32) / (hi as f32 - lo as f32),
        _ => x,
    }
}

/// A raw value mapped to [0, 1] by its feature's min_val / max_val, when
/// max_val > min_val.
fn scaled(x: f64, min_max: Option<(f64, f64)>) -> f64 {
    match min_max {
        Some((lo, hi)) if hi > lo => (x - lo) / (hi - lo),
        // EasyRec scales only when max_val > min_val (one of them set
        // alone may leave it so), else reads the value as it is.
        _ => x,
    }
}

/// Appends an id and its weight, whatever its sign: whether an entry of
/// weight <= 0 counts is the pooling's to say (TensorFlow's safe embedding
/// lookup leaves it out of a mean, and keeps it in a sum, EasyRec's default
/// combiner: a raw feature's projection of a negative value is that value
/// times its row; `embedding::pool_rows`).
fn push_weighted(
    ids: &mut Vec<u64>,
    weights: &mut Vec<f32>,
    weight: f32,
    id: impl FnOnce() -> anyhow::Result<u64>,
) -> anyhow::Result<()> {
    ids.push(id()?);
    weights.push(weight);
    Ok(())
}

fn encode_one(e: &Enc, raw: &RawBatch, n: usize) -> anyhow::Result<Encoded> {
    let mut j = Jagged {
        ids: Vec::with_capacity(n),
        offsets: Vec::with_capacity(n + 1),
        weights: None,
        positions: None,
    };
    j.offsets.push(0);
    match e {
        Enc::Expr {
            cols,
            expr,
            name,
            inputs: input_names,
        } => {
            let mut inputs = vec![0.0; cols.len()];
            let mut values = Vec::with_capacity(n);
            for r in 0..n {
                for ((x, &c), input) in inputs.iter_mut().zip(cols).zip(input_names) {
                    // EasyRec reads each input as float64 (strings with
                    // string_to_number); an empty cell is its default_val.
                    let mut got = None;
                    for_each_value(&raw.columns[c], r, None, &mut |v| {
                        got.get_or_insert(
                            v.number()
                                .with_context(|| format!("ExprFeature `{name}`: row {r}: input `{input}`"))?,
                        );
                        Ok(())
                    })?;
                    *x = got.unwrap_or(0.0);
                }
                values.push(expr.eval(&inputs) as f32);
            }
            return Ok(Encoded::Dense { dim: 1, values });
        }
        Enc::Dense {
            col,
            dim,
            min_max,
            separator,
        } => {
            let mut values = Vec::with_capacity(n * dim);
            for r in 0..n {
                let start = values.len();
                for_each_value(&raw.columns[*col], r, Some(separator), &mut |v| {
                    let x = scaled(v.number()?, *min_max);
                    values.push(x as f32);
                    Ok(())
                })?;
                let got = values.len() - start;
                if got == 0 && *dim == 1 {
                    values.push(0.0);
                } else if got != *dim {
                    bail!("row {r} has {got} values, raw_input_dim is {dim}");
                }
            }
            return Ok(Encoded::Dense { dim: *dim, values });
        }
        Enc::Bucketized {
            col,
            boundaries,
            min_max,
        } => {
            for r in 0..n {
                for_each_value(&raw.columns[*col], r, None, &mut |v| {
                    let x = bucketized_value(v.number()?, *min_max);
                    j.ids.push(boundaries.partition_point(|b| *b <= x) as u64);
                    Ok(())
                })?;
                j.offsets.push(j.ids.len() as u32);
            }
        }
        Enc::Projected {
            col,
            dim,
            min_max,
            separator,
        } => {
            let mut weights = Vec::with_capacity(n * dim);
            for r in 0..n {
                let mut k = 0u64;
                for_each_value(&raw.columns[*col], r, Some(separator), &mut |v| {
                    let x = scaled(v.number()?, *min_max);
                    push_weighted(&mut j.ids, &mut weights, x as f32, || Ok(k))?;
                    k += 1;
                    Ok(())
                })?;
                if k != *dim as u64 && !(k == 0 && *dim == 1) {
                    bail!("row {r} has {k} values, raw_input_dim is {dim}");
                }
                j.offsets.push(j.ids.len() as u32);
            }
            j.weights = Some(weights);
        }
        Enc::RawPositions { .. } => encode_raw_positions(e, raw, n, &mut j)?,
        Enc::Id { col, buckets } => {
            for r in 0..n {
                for_each_value(&raw.columns[*col], r, None, &mut |v| {
                    j.ids.push(v.bucket(buckets, "")?);
                    Ok(())
                })?;
                j.offsets.push(j.ids.len() as u32);
            }
        }
        Enc::Tag {
            weight_col: Some(_), ..
        } => encode_weighted_tags(e, raw, n, &mut j)?,
        Enc::Tag {
            max_len: Some(_),
            multi: Some(_),
            ..
        } => encode_multi_value_sequence(e, raw, n, &mut j)?,
        Enc::Tag { weight_col: None, .. } => encode_tags(e, raw, n, &mut j)?,
        Enc::Lookup { .. } => encode_lookup(e, raw, n, &mut j)?,
        Enc::Combo {
            cols,
            buckets,
            join_sep,
            input_seps,
        } => {
            let mut parts: Vec<Vec<String>> = vec![Vec::new(); cols.len()];
            for r in 0..n {
                for (i, (p, c)) in parts.iter_mut().zip(cols).enumerate() {
                    p.clear();
                    let sep = input_seps.get(i).map(String::as_str).filter(|s| !s.is_empty());
                    for_each_value(&raw.columns[*c], r, sep, &mut |v| {
                        p.push(v.text());
                        Ok(())
                    })?;
                }
                cross(&parts, *buckets, join_sep, &mut j.ids);
                j.offsets.push(j.ids.len() as u32);
            }
        }
    }
    Ok(Encoded::Sparse(j))
}

/// A raw feature's values as weights at their positions (`Enc::RawPositions`).
fn encode_raw_positions(e: &Enc, raw: &RawBatch, n: usize, j: &mut Jagged) -> anyhow::Result<()> {
    let Enc::RawPositions {
        col,
        dim,
        len,
        separator,
        multi_sep,
        mean,
    } = e
    else {
        unreachable!("encode_raw_positions of another encoding")
    };
    let mut weights = Vec::new();
    let mut p = SeqPositions::default();
    let mut xs: Vec<f64> = Vec::new();
    for r in 0..n {
        let mut t = 0usize;
        for_each_value(&raw.columns[*col], r, Some(separator), &mut |v| {
            if t == *len {
                bail!("row {r} has more than sequence_length ({len}) positions");
            }
            xs.clear();
            position_values(v, multi_sep.as_deref(), &mut |x| {
                xs.push(x.number()?);
                Ok(())
            })?;
            if xs.len() > *dim as usize {
                bail!("row {r}: position {t} has {} values, raw_input_dim is {dim}", xs.len());
            }
            // TensorFlow's safe lookup drops weights not above 0.
            let sum: f64 = xs.iter().filter(|x| **x > 0.0).sum();
            for &x in xs.iter().filter(|x| **x > 0.0) {
                j.ids.push(if t < *dim as usize { t as u64 } else { 0 });
                weights.push(if *mean { (x / sum) as f32 } else { x as f32 });
                p.of_id.push(t as u32);
            }
            t += 1;
            Ok(())
        })?;
        p.lens.push(*len as u32);
        j.offsets.push(j.ids.len() as u32);
    }
    j.weights = Some(weights);
    j.positions = Some(p);
    Ok(())
}

/// Tags weighted by a second column (`Enc::Tag` with `weight_col`).
fn encode_weighted_tags(e: &Enc, raw: &RawBatch, n: usize, j: &mut Jagged) -> anyhow::Result<()> {
    let Enc::Tag {
        col,
        buckets,
        separator,
        kv_separator,
        weight_col: Some(wc),
        ..
    } = e
    else {
        unreachable!("encode_weighted_tags of another encoding")
    };
    let mut weights = Vec::with_capacity(n);
    let mut ws: Vec<f32> = Vec::new();
    for r in 0..n {
        ws.clear();
        for_each_value(&raw.columns[*wc], r, Some(separator), &mut |v| {
            ws.push(v.number()? as f32);
            Ok(())
        })?;
        let mut k = 0usize;
        for_each_value(&raw.columns[*col], r, Some(separator), &mut |v| {
            let w = *ws
                .get(k)
                .with_context(|| format!("row {r} has more tags than weights ({})", ws.len()))?;
            k += 1;
            push_weighted(&mut j.ids, &mut weights, w, || v.bucket(buckets, ""))
        })?;
        if k != ws.len() {
            bail!("row {r} has {k} tags but {} weights", ws.len());
        }
        j.offsets.push(j.ids.len() as u32);
    }
    debug_assert!(kv_separator.is_none());
    j.weights = Some(weights);
    Ok(())
}

/// A sequence of several ids per position (`Enc::Tag` with `multi`).
fn encode_multi_value_sequence(e: &Enc, raw: &RawBatch, n: usize, j: &mut Jagged) -> anyhow::Result<()> {
    let Enc::Tag {
        col,
        buckets,
        separator,
        max_len: Some(max_len),
        multi: Some(multi),
        ..
    } = e
    else {
        unreachable!("encode_multi_value_sequence of another encoding")
    };
    let mut weights = Vec::new();
    let mut p = SeqPositions::default();
    let mut values = Vec::new();
    for r in 0..n {
        // As TensorFlow's sparse sequence: an empty position (`a||b`)
        // holds no values but keeps its place, and the length runs
        // to the last position holding one.
        let (mut pos, mut len) = (0u32, 0u32);
        let mut position = |v: Value<'_>| -> anyhow::Result<()> {
            if pos as usize == *max_len {
                return Ok(());
            }
            values.clear();
            position_values(v, Some(&multi.separator), &mut |x| {
                values.push(x.bucket(buckets, "")?);
                Ok(())
            })?;
            let w = multi.combiner.weight(values.len());
            for &id in &values {
                j.ids.push(id);
                weights.push(w);
                p.of_id.push(pos);
            }
            pos += 1;
            if !values.is_empty() {
                len = pos;
            }
            Ok(())
        };
        match &raw.columns[*col] {
            Column::Str(s) if !separator.is_empty() => {
                let text = s.get(r);
                if !text.is_empty() {
                    for part in text.split(separator.as_str()) {
                        position(Value::Str(part))?;
                    }
                }
            }
            other => for_each_value(other, r, Some(separator), &mut position)?,
        }
        p.lens.push(len);
        j.offsets.push(j.ids.len() as u32);
    }
    if multi.combiner != PositionCombiner::Sum {
        j.weights = Some(weights);
    }
    j.positions = Some(p);
    Ok(())
}

/// Tags, `k:w` weighted tags, or a sequence's first ids (`Enc::Tag`).
fn encode_tags(e: &Enc, raw: &RawBatch, n: usize, j: &mut Jagged) -> anyhow::Result<()> {
    let Enc::Tag {
        col,
        buckets,
        separator,
        kv_separator,
        weight_col: None,
        max_len,
        ..
    } = e
    else {
        unreachable!("encode_tags of another encoding")
    };
    let mut weights = kv_separator.as_ref().map(|_| Vec::with_capacity(n));
    // A sequence of hashed or listed ids splits its text as EasyRec's
    // `tf.strings.split` does: empty parts keep their place as the id of
    // "", and an empty text is one such part (tags, split by
    // `tf.string_split`, drop them). Integer ids cannot be empty (TensorFlow
    // refuses to read "" as a number): those parts are dropped.
    let keeps_empty = max_len.is_some() && matches!(buckets, Buckets::Hash(_) | Buckets::Vocab(_));
    for r in 0..n {
        let start = j.ids.len();
        match &raw.columns[*col] {
            Column::Str(s) if keeps_empty && !separator.is_empty() => {
                for part in s.get(r).split(separator.as_str()) {
                    j.ids.push(buckets.of_str(part, "")?);
                }
            }
            other => for_each_value(other, r, Some(separator), &mut |v| {
                match (kv_separator, &mut weights, v) {
                    (Some(kv), Some(w), Value::Str(s)) => {
                        let (k, wt) = s.split_once(kv.as_str()).unwrap_or((s, "1"));
                        let wt: f32 = wt
                            .trim()
                            .parse()
                            .with_context(|| format!("weight `{wt}` of tag `{k}` is not a number"))?;
                        push_weighted(&mut j.ids, w, wt, || buckets.of_str(k, ""))?;
                    }
                    (_, w, v) => {
                        j.ids.push(v.bucket(buckets, "")?);
                        if let Some(w) = w {
                            w.push(1.0);
                        }
                    }
                }
                Ok(())
            })?,
        }
        if let Some(l) = max_len {
            // A sequence's first `l` values (sequences have no weights).
            j.ids.truncate(j.ids.len().min(start + l));
        }
        j.offsets.push(j.ids.len() as u32);
    }
    j.weights = weights;
    Ok(())
}

/// The values of a map column whose keys equal the key column (`Enc::Lookup`).
fn encode_lookup(e: &Enc, raw: &RawBatch, n: usize, j: &mut Jagged) -> anyhow::Result<()> {
    let Enc::Lookup {
        key_col,
        map_col,
        buckets,
        separator,
        kv_separator,
        max_selected,
    } = e
    else {
        unreachable!("encode_lookup of another encoding")
    };
    let mut key = String::new();
    for r in 0..n {
        key.clear();
        for_each_value(&raw.columns[*key_col], r, None, &mut |v| {
            key.push_str(&v.text());
            Ok(())
        })?;
        let start = j.ids.len();
        for_each_value(&raw.columns[*map_col], r, Some(separator), &mut |v| {
            let entry = v.text();
            let (k, val) = entry.split_once(kv_separator.as_str()).with_context(|| {
                format!("row {r}: map entry `{entry}` has no `{kv_separator}` between its key and value")
            })?;
            if k == key {
                j.ids.push(hash_bucket_str(val, *buckets));
            }
            Ok(())
        })?;
        if j.ids.len() - start > *max_selected {
            bail!(
                "row {r}: key `{key}` matches {} map entries, more than lookup_max_sel_elem_num ({max_selected})",
                j.ids.len() - start
            );
        }
        j.offsets.push(j.ids.len() as u32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{bucketized_value, scaled, Bucketing, Buckets};

    /// As EasyRec's `categorical_column_with_identity(default_value=0)`:
    /// an id outside [0, num_buckets) is read as 0; one that is not an
    /// integer is an error.
    #[test]
    fn identity_ids_outside_num_buckets_are_read_as_0() {
        let b = Buckets::new(&Bucketing::Identity(10), "c").unwrap();
        assert_eq!(b.of_int(3, "c").unwrap(), 3);
        assert_eq!(b.of_int(12, "c").unwrap(), 0);
        assert_eq!(b.of_int(-1, "c").unwrap(), 0);
        assert_eq!(b.of_str(" 9", "c").unwrap(), 9);
        assert_eq!(b.of_str("10", "c").unwrap(), 0);
        assert!(b.of_str("x2", "c").is_err());
    }

    /// As EasyRec: a bucketized raw value is scaled by min_val / max_val
    /// first, in float32; a scale whose max is not above its min leaves
    /// the value as it is.
    #[test]
    fn raw_values_are_scaled_as_easyrec_scales_them() {
        assert_eq!(bucketized_value(50.0, Some((0.0, 100.0))), 0.5);
        assert_eq!(bucketized_value(50.0, None), 50.0);
        assert_eq!(bucketized_value(0.1, None), 0.1f32);
        assert_eq!(scaled(7.0, Some((5.0, 0.0))), 7.0);
        assert_eq!(scaled(7.0, Some((-3.0, 0.0))), 10.0 / 3.0);
    }

    /// Labels as EasyRec reads them: text as numbers (`string_to_number`),
    /// a row of `label_dim` values split by any character of `label_sep`
    /// (empty parts skipped) or into bytes by an empty one; a row of
    /// another count, or text that is no number, is named.
    #[test]
    fn labels_are_numbers_split_from_text_as_easyrec_splits_them() {
        use super::{label_values, Column, LabelShape};
        use crate::data::column::StrColumn;
        let text = |rows: &[&str]| {
            let mut c = StrColumn::new();
            rows.iter().for_each(|r| c.push(r));
            Column::Str(c)
        };
        let shape = |dim, sep: &str| LabelShape {
            dim,
            separator: sep.into(),
        };
        let one = LabelShape::scalar();
        assert_eq!(label_values(&text(&["1", " 0.5"]), &one, "y").unwrap(), [1.0, 0.5]);
        assert_eq!(
            label_values(&text(&["091", "100"]), &shape(3, ""), "s").unwrap(),
            [0.0, 9.0, 1.0, 1.0, 0.0, 0.0]
        );
        assert_eq!(
            label_values(&text(&["0.2,0.8", "0.5;;0.5"]), &shape(2, ",;"), "s").unwrap(),
            [0.2, 0.8, 0.5, 0.5]
        );
        let err = |col, shape| format!("{:#}", label_values(&col, &shape, "s").unwrap_err());
        assert!(err(text(&["0.2,0.8,0.1"]), shape(2, ","))
            .contains("`0.2,0.8,0.1`: 3 value(s) where data_config.label_dim gives 2"));
        assert!(err(text(&["a"]), one.clone()).contains("label column `s` holds `a`, which is not a number"));
        assert!(err(Column::Int(vec![1]), shape(2, ",")).contains("numbers split from text"));
    }
}
