//! The feature configs, typed: how each feature turns input values into
//! ids or numbers, and its embedding table.

use std::collections::HashSet;
use std::path::PathBuf;

use super::model::layers::{self, Activation};
use super::{proto, validate, ConfigError};
use proto::feature_config::FeatureType;

/// The features section of a pipeline config (`feature_configs`, or
/// `feature_config.features`): the features a model can read, in config
/// order; feature groups index them.
#[derive(Debug, Clone, Default)]
pub struct FeaturePlan {
    pub specs: Vec<FeatureSpec>,
    /// Where each feature sits in the config (`feature_configs[3]`).
    pub paths: Vec<String>,
}

impl std::ops::Deref for FeaturePlan {
    type Target = [FeatureSpec];

    fn deref(&self) -> &[FeatureSpec] {
        &self.specs
    }
}

impl<'a> IntoIterator for &'a FeaturePlan {
    type Item = &'a FeatureSpec;
    type IntoIter = std::slice::Iter<'a, FeatureSpec>;

    fn into_iter(self) -> Self::IntoIter {
        self.specs.iter()
    }
}

impl FeaturePlan {
    /// The feature configs `feats` at `prefix` (`validate::features`), for
    /// the model whose groups read them: a feature no group reads that
    /// this trainer cannot build is left out with a warning (it changes
    /// nothing EasyRec computes).
    pub fn from_proto(
        (feats, prefix): (&[proto::FeatureConfig], &str),
        model: &proto::EasyRecModel,
    ) -> Result<Self, ConfigError> {
        let grouped: HashSet<&str> = model
            .feature_groups
            .iter()
            .flat_map(|g| {
                let seq = g
                    .sequence_features
                    .iter()
                    .flat_map(|s| &s.seq_att_map)
                    .flat_map(|m| m.key.iter().chain(&m.hist_seq).chain(&m.aux_hist_seq));
                g.feature_names.iter().chain(seq).map(String::as_str)
            })
            .collect();
        // Features a group pools: only their sequence_combiner matters.
        let pooled: HashSet<&str> = model
            .feature_groups
            .iter()
            .flat_map(|g| g.feature_names.iter().map(String::as_str))
            .collect();
        let global = model
            .ev_params
            .as_ref()
            .map(|ev| KeyValueSpec::from_proto(ev, "model_config.ev_params"))
            .transpose()?;
        let mut plan = FeaturePlan::default();
        for (i, f) in feats.iter().enumerate() {
            let name = validate::feature_name(f);
            let path = format!("{prefix}[{i}]");
            match feature(f, &path, pooled.contains(name), global) {
                Ok(spec) => {
                    plan.specs.push(spec);
                    plan.paths.push(path);
                }
                Err(e @ ConfigError::Unsupported { .. }) if !grouped.contains(name) => {
                    log::warn!("{e}; feature `{name}` is in no feature group, so it is left out");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(plan)
    }

    /// The features' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|f| f.name.clone()).collect()
    }
}

/// How an IdFeature / TagFeature turns a raw value into a row id.
#[derive(Debug, Clone, PartialEq)]
pub enum Bucketing {
    Hash(u64),
    Identity(u64),
    Vocab(Vec<String>),
    VocabFile(PathBuf),
    /// Numbers bucketized by sorted boundaries: the id is how many
    /// boundaries are at most the value (TensorFlow's `bucketize`), so
    /// `len + 1` rows. A sequence of RawFeature values with boundaries.
    Boundaries(Vec<f64>),
    /// A sequence of RawFeature values with `num_buckets` and `min_val <
    /// max_val`, as EasyRec buckets it: each value scaled to
    /// `(x - min) / (max - min)` in float32, then bucketized by the
    /// boundaries `k / buckets` for `k` in `0..buckets` (`buckets + 1` rows).
    Scaled {
        min: f64,
        max: f64,
        buckets: u64,
    },
    /// A sequence of RawFeature values with embedding_dim and neither
    /// boundaries nor buckets, as EasyRec projects it: every row has
    /// `sequence_length` positions (zeros past its values), and each value
    /// `x > 0` at position `t` weights table row `t` (row 0 from `t = dim`
    /// on, TensorFlow's identity column defaulting out-of-range ids) of a
    /// `[dim, embedding_dim]` table, `dim` being `raw_input_dim`.
    RawPositions {
        dim: u32,
    },
}

/// How the several values of one position of a sequence (`seq_multi_sep`)
/// are combined, as the feature's `combiner` says (TensorFlow's embedding
/// combiners): their embeddings' sum or mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionCombiner {
    Sum,
    Mean,
}

impl PositionCombiner {
    /// The weight of each of a position's `n` values.
    pub fn weight(self, n: usize) -> f32 {
        match self {
            PositionCombiner::Sum => 1.0,
            PositionCombiner::Mean => 1.0 / n as f32,
        }
    }
}

/// `seq_multi_sep`: each position of a sequence holds several values split
/// by `separator`, whose embeddings `combiner` combines into the position's.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiValue {
    pub separator: String,
    pub combiner: PositionCombiner,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FeatureKind {
    Id {
        buckets: Bucketing,
    },
    Tag {
        buckets: Bucketing,
        separator: String,
        kv_separator: Option<String>,
    },
    /// Numeric value(s): normalized to [0, 1] when min/max are given,
    /// bucketized into an embedding when boundaries are given.
    Raw {
        dim: u32,
        min_max: Option<(f64, f64)>,
        boundaries: Vec<f64>,
        /// Splits a value of `raw_input_dim` > 1 (EasyRec's feature
        /// `separator`, "|" unless set).
        separator: String,
        /// EasyRec's ExprFeature: the value is this expression over the
        /// feature's inputs (one value per row).
        expr: Option<super::expr::Expression>,
    },
    /// EasyRec's ComboFeature: the cross of its inputs' values (each input
    /// split by its `combo_input_seps` entry, if any), hashed as
    /// TensorFlow's crossed column does; with `combo_join_sep`, the values
    /// joined by it and hashed as text.
    Combo {
        buckets: u64,
        join_sep: String,
        input_seps: Vec<String>,
    },
    /// EasyRec's LookupFeature: the row's key (first input) looked up in
    /// its map (second input, `k<kv_separator>v` entries split on
    /// `separator`); the values of every matching entry hashed, a bag of at
    /// most `max_selected` ids.
    Lookup {
        buckets: u64,
        separator: String,
        kv_separator: String,
        max_selected: usize,
    },
    /// EasyRec's SequenceFeature of ids: the values of a row in order,
    /// each bucketed, the first `max_len` kept (`max_seq_len`).
    Sequence {
        buckets: Bucketing,
        separator: String,
        max_len: usize,
        /// How a feature group pools it (`sequence_combiner`), if set.
        combiner: Option<SeqCombiner>,
        /// Several values per position (`seq_multi_sep`).
        multi: Option<MultiValue>,
    },
}

/// How a SequenceFeature among a feature group's features is pooled into
/// the group (its `sequence_combiner`), after the group's other features.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqCombiner {
    /// A score per position (a dense layer of one unit without bias),
    /// softmaxed over the positions the row has; the embeddings pooled
    /// with those weights.
    Attention,
    /// EasyRec's TextCNN: the sequence padded or cut to `pad` positions
    /// (`pad_sequence_length`, else the feature's `max_seq_len`), a
    /// Keras Conv1D (valid padding, then `activation`) per filter size,
    /// each max-pooled over time; the pooled filters side by side.
    TextCnn {
        filter_sizes: Vec<usize>,
        num_filters: Vec<usize>,
        pad: usize,
        activation: Activation,
    },
}

impl SeqCombiner {
    /// Positions of the sequence the combiner reads, for a feature that
    /// keeps `max_len`.
    pub fn positions(&self, max_len: usize) -> usize {
        match self {
            SeqCombiner::Attention => max_len,
            SeqCombiner::TextCnn { pad, .. } => *pad,
        }
    }

    /// Its output width for embeddings of `dim`.
    pub fn width(&self, dim: usize) -> usize {
        match self {
            SeqCombiner::Attention => dim,
            SeqCombiner::TextCnn { num_filters, .. } => num_filters.iter().sum(),
        }
    }
}

/// `max_len`: the positions the sequence keeps (`max_seq_len`).
fn seq_combiner(c: &proto::SequenceCombiner, path: &str, max_len: usize) -> Result<Option<SeqCombiner>, ConfigError> {
    use proto::sequence_combiner::Combiner;
    Ok(match &c.combiner {
        None => None,
        Some(Combiner::Attention(_)) => Some(SeqCombiner::Attention),
        Some(Combiner::MultiHeadAttention(_)) => {
            return Err(ConfigError::unsupported(
                format!("{path}.multi_head_attention"),
                "the multi_head_attention sequence combiner",
            ))
        }
        Some(Combiner::TextCnn(t)) => {
            let path = format!("{path}.text_cnn");
            if t.mlp.is_some() {
                return Err(ConfigError::unsupported(
                    format!("{path}.mlp"),
                    "an MLP after the text CNN",
                ));
            }
            let pad = match t.pad_sequence_length as usize {
                0 => {
                    // EasyRec then convolves each batch padded to its own
                    // longest row, so a row's score depends on its batch
                    // (EasyRec warns so); the fixed length closest to it
                    // is the longest a row can be.
                    log::warn!(
                        "{path}: without pad_sequence_length EasyRec pads each batch to its longest row and its scores depend on the batch; here every row is padded to max_seq_len ({max_len})"
                    );
                    max_len
                }
                p => p,
            };
            let (filter_sizes, num_filters) =
                super::model::layers::text_cnn_filters(&t.filter_sizes, &t.num_filters, pad, &path)?;
            Some(SeqCombiner::TextCnn {
                filter_sizes,
                num_filters,
                pad,
                activation: layers::activation(t.activation(), &format!("{path}.activation"))?,
            })
        }
    })
}

/// A sequence's length when `max_seq_len` does not say: the model gives
/// each of its positions a slot, and longer rows keep their first values.
pub const DEFAULT_MAX_SEQ_LEN: usize = 50;

/// How an embedding table's rows start (FeatureConfig.initializer).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingInit {
    /// EasyRec's embedding_column default: truncated normal, stddev
    /// 0.01/sqrt(dim) (its feature_column compat module; TensorFlow's own
    /// is 1/sqrt(dim)).
    Default,
    TruncatedNormal {
        mean: f32,
        stddev: f32,
    },
    RandomNormal {
        mean: f32,
        stddev: f32,
    },
    /// Glorot (Xavier) normal over the table's `[rows, dim]` shape.
    GlorotNormal,
    /// One value for every element, or `dim` values for every row.
    Constant(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSpec {
    pub name: String,
    pub inputs: Vec<String>,
    pub kind: FeatureKind,
    /// Table name (features sharing it share rows) and dimension; 0 = no embedding.
    pub table: String,
    pub embedding_dim: u32,
    pub mean_combiner: bool,
    pub init: EmbeddingInit,
    /// `ev_params` (its own or model_config's): its table is a key-value
    /// table and its ids are keys (`KEY_SPACE`), not rows.
    pub key_value: Option<KeyValueSpec>,
}

/// The id space of a key-value feature, as EasyRec sets it for an
/// embedding variable: `hash_bucket_size` becomes `MAX_HASH_BUCKET_SIZE`
/// (hashes modulo 2^63-1) and identity ids may be any non-negative int64.
pub const KEY_SPACE: u64 = i64::MAX as u64;

/// EasyRec's `EVParams` (DeepRec's EmbeddingVariable options) of a
/// key-value table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyValueSpec {
    /// An id gets a row (and updates) once it was seen this often in
    /// training batches; 0 or 1: at once.
    pub filter_freq: u64,
    /// Rows not looked up in training for more than this many global steps
    /// are evicted when a checkpoint is saved; 0: never.
    pub steps_to_live: u64,
    /// Rows at most: past it the least recently used rows are evicted.
    pub max_capacity: u64,
}

impl KeyValueSpec {
    /// `ev_params` at `path`; `use_cache` and `init_capacity` are SOK's GPU
    /// cache and pre-allocation, which a table that grows on the CPU does
    /// not need: accepted with a note.
    pub fn from_proto(ev: &proto::EvParams, path: &str) -> Result<Self, ConfigError> {
        if ev.use_cache() {
            log::warn!("{path}.use_cache: SOK's GPU embedding cache does not apply to these CPU tables; ignored");
        }
        if ev.max_capacity() == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.max_capacity"),
                "a key-value table holds at least one row",
            ));
        }
        if ev.init_capacity.is_some() && ev.init_capacity() > ev.max_capacity() {
            return Err(ConfigError::invalid(
                format!("{path}.init_capacity"),
                format!("{} is above max_capacity ({})", ev.init_capacity(), ev.max_capacity()),
            ));
        }
        Ok(KeyValueSpec {
            filter_freq: ev.filter_freq(),
            steps_to_live: ev.steps_to_live(),
            max_capacity: ev.max_capacity(),
        })
    }
}

impl FeatureSpec {
    /// A RawFeature with embedding_dim and no boundaries: EasyRec weights
    /// the rows of a `[raw_input_dim, embedding_dim]` table by its values.
    pub fn projected(&self) -> bool {
        matches!(&self.kind, FeatureKind::Raw { boundaries, .. } if boundaries.is_empty()) && self.embedding_dim > 0
    }

    /// Whether its ids come with weights: projected raw values, tags with
    /// `kv_separator` or with a second (weight) input.
    pub fn weighted_ids(&self) -> bool {
        self.projected()
            || matches!(&self.kind, FeatureKind::Tag { kv_separator, .. } if kv_separator.is_some() || self.inputs.len() > 1)
            || matches!(&self.kind, FeatureKind::Sequence { multi: Some(m), .. } if m.combiner != PositionCombiner::Sum)
            || matches!(
                &self.kind,
                FeatureKind::Sequence {
                    buckets: Bucketing::RawPositions { .. },
                    ..
                }
            )
    }

    /// Whether its ids come with the sequence position of each and each
    /// row's count of positions: a sequence of several values per position.
    pub fn positioned_ids(&self) -> bool {
        matches!(&self.kind, FeatureKind::Sequence { multi: Some(_), .. })
            || matches!(
                &self.kind,
                FeatureKind::Sequence {
                    buckets: Bucketing::RawPositions { .. },
                    ..
                }
            )
    }

    /// EasyRec's name of the feature column it becomes (TensorFlow's
    /// feature-column name): what an input layer sorts its columns by and
    /// names their tables after.
    pub fn easyrec_column(&self) -> String {
        let f = &self.name;
        match &self.kind {
            FeatureKind::Raw { boundaries, .. } if !boundaries.is_empty() => format!("{f}_bucketized_embedding"),
            _ if self.projected() => format!("{f}_weighted_by_{f}_raw_proj_val_embedding"),
            FeatureKind::Raw { .. } => f.clone(),
            FeatureKind::Tag { .. } if self.inputs.len() > 1 => format!("{f}_weighted_by_{f}_w_embedding"),
            _ if self.table != self.name => format!("{}_shared_embedding", self.table),
            _ => format!("{f}_embedding"),
        }
    }
}

fn embedding_init(f: &proto::FeatureConfig, path: &str) -> Result<EmbeddingInit, ConfigError> {
    use proto::initializer::InitializerOneof as I;
    Ok(
        match f.initializer.as_ref().and_then(|i| i.initializer_oneof.as_ref()) {
            None => EmbeddingInit::Default,
            Some(I::TruncatedNormalInitializer(t)) => EmbeddingInit::TruncatedNormal {
                mean: t.mean(),
                stddev: t.stddev(),
            },
            Some(I::RandomNormalInitializer(r)) => EmbeddingInit::RandomNormal {
                mean: r.mean(),
                stddev: r.stddev(),
            },
            Some(I::GlorotNormalInitializer(_)) => EmbeddingInit::GlorotNormal,
            Some(I::ConstantInitializer(c)) => {
                let n = c.consts.len();
                if n != 1 && n != f.embedding_dim() as usize {
                    return Err(ConfigError::invalid(
                        format!("{path}.initializer.constant_initializer.consts"),
                        format!("needs 1 value or embedding_dim ({}) values, got {n}", f.embedding_dim()),
                    ));
                }
                EmbeddingInit::Constant(c.consts.clone())
            }
        },
    )
}

fn buckets(f: &proto::FeatureConfig) -> Option<Bucketing> {
    if f.hash_bucket_size() > 0 {
        Some(Bucketing::Hash(f.hash_bucket_size()))
    } else if f.num_buckets() > 0 {
        Some(Bucketing::Identity(f.num_buckets()))
    } else if !f.vocab_list.is_empty() {
        Some(Bucketing::Vocab(f.vocab_list.clone()))
    } else {
        f.vocab_file
            .as_ref()
            .filter(|v| !v.is_empty())
            .map(|v| Bucketing::VocabFile(PathBuf::from(v)))
    }
}

/// `pooled`: a feature group lists the feature among its features, so a
/// sequence is pooled by its `sequence_combiner` (which histories of
/// `sequence_features` ignore).
fn feature(
    f: &proto::FeatureConfig,
    path: &str,
    pooled: bool,
    global: Option<KeyValueSpec>,
) -> Result<FeatureSpec, ConfigError> {
    let name = validate::feature_name(f).to_string();
    let key_value = match &f.ev_params {
        Some(ev) => Some(KeyValueSpec::from_proto(ev, &format!("{path}.ev_params"))?),
        None => global,
    };
    let need_buckets = || {
        // EasyRec's embedding variable: hashes modulo 2^63-1, identity ids
        // up to int64's largest (also without num_buckets).
        let keyed = |b: Bucketing| match b {
            Bucketing::Hash(_) if key_value.is_some() => Bucketing::Hash(KEY_SPACE),
            Bucketing::Identity(_) if key_value.is_some() => Bucketing::Identity(KEY_SPACE),
            b => b,
        };
        let any = buckets(f).or_else(|| key_value.map(|_| Bucketing::Identity(KEY_SPACE)));
        any.map(keyed).ok_or_else(|| {
            ConfigError::invalid(
                path,
                format!("`{name}` needs hash_bucket_size, num_buckets or a vocabulary"),
            )
        })
    };
    let kind = match f.feature_type() {
        FeatureType::IdFeature => FeatureKind::Id {
            buckets: need_buckets()?,
        },
        FeatureType::TagFeature => FeatureKind::Tag {
            buckets: need_buckets()?,
            separator: f.separator().to_string(),
            kv_separator: f.kv_separator.clone().filter(|s| !s.is_empty()),
        },
        FeatureType::SequenceFeature => sequence(f, path, pooled, &name, need_buckets)?,
        FeatureType::RawFeature => {
            if f.normalizer_fn.as_deref().is_some_and(|n| !n.is_empty()) {
                return Err(ConfigError::unsupported(
                    format!("{path}.normalizer_fn"),
                    "Python normalizer functions",
                ));
            }
            let min_max = (f.min_val.is_some() || f.max_val.is_some()).then(|| (f.min_val(), f.max_val()));
            FeatureKind::Raw {
                dim: f.raw_input_dim(),
                min_max,
                boundaries: f.boundaries.clone(),
                separator: f.separator().to_string(),
                expr: None,
            }
        }
        FeatureType::ExprFeature => {
            let text = f.expression.clone().unwrap_or_default();
            if text.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.expression"),
                    format!("ExprFeature `{name}` needs an expression over its input_names"),
                ));
            }
            let expr = super::expr::Expression::parse(&text, &f.input_names)
                .map_err(|e| ConfigError::invalid(format!("{path}.expression"), format!("`{text}` {e}")))?;
            // EasyRec's parse_expr_feature makes a plain numeric column.
            for (set, field) in [
                (f.min_val.is_some() || f.max_val.is_some(), "min_val/max_val"),
                (!f.boundaries.is_empty(), "boundaries"),
            ] {
                if set {
                    log::warn!("{path}: ExprFeature `{name}` ignores {field}, as EasyRec's does");
                }
            }
            FeatureKind::Raw {
                dim: 1,
                min_max: None,
                boundaries: Vec::new(),
                separator: f.separator().to_string(),
                expr: Some(expr),
            }
        }
        FeatureType::ComboFeature => {
            if f.input_names.len() < 2 {
                return Err(ConfigError::invalid(
                    format!("{path}.input_names"),
                    format!("ComboFeature `{name}` crosses at least two inputs"),
                ));
            }
            let Some(Bucketing::Hash(buckets)) = buckets(f) else {
                return Err(ConfigError::invalid(
                    path,
                    format!("ComboFeature `{name}` needs hash_bucket_size, as EasyRec hashes its crosses"),
                ));
            };
            if !f.combo_input_seps.is_empty() && f.combo_input_seps.len() != f.input_names.len() {
                return Err(ConfigError::invalid(
                    format!("{path}.combo_input_seps"),
                    format!(
                        "needs one separator per input ({}), got {}",
                        f.input_names.len(),
                        f.combo_input_seps.len()
                    ),
                ));
            }
            FeatureKind::Combo {
                buckets: if key_value.is_some() { KEY_SPACE } else { buckets },
                join_sep: f.combo_join_sep().to_string(),
                input_seps: f.combo_input_seps.clone(),
            }
        }
        FeatureType::LookupFeature => {
            if f.input_names.len() != 2 {
                return Err(ConfigError::invalid(
                    format!("{path}.input_names"),
                    format!("LookupFeature `{name}` reads a key and a map: two inputs"),
                ));
            }
            let Some(Bucketing::Hash(buckets)) = buckets(f) else {
                return Err(ConfigError::invalid(
                    path,
                    format!("LookupFeature `{name}` needs hash_bucket_size, as EasyRec hashes the values it finds"),
                ));
            };
            let kv_separator = f.kv_separator.clone().unwrap_or_default();
            if kv_separator.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.kv_separator"),
                    format!("LookupFeature `{name}` needs the separator between a map entry's key and value"),
                ));
            }
            let max_selected = usize::try_from(f.lookup_max_sel_elem_num())
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ConfigError::invalid(format!("{path}.lookup_max_sel_elem_num"), "must be at least 1"))?;
            FeatureKind::Lookup {
                buckets: if key_value.is_some() { KEY_SPACE } else { buckets },
                separator: f.separator().to_string(),
                kv_separator,
                max_selected,
            }
        }
        other => {
            return Err(ConfigError::unsupported(
                format!("{path}.feature_type"),
                format!("feature type {}", other.as_str_name()),
            ))
        }
    };
    if f.combiner() == "sqrtn" {
        return Err(ConfigError::unsupported(
            format!("{path}.combiner"),
            "the sqrtn combiner",
        ));
    }
    let table = match &f.embedding_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => name.clone(),
    };
    // An ExprFeature is a plain number (EasyRec's numeric column), never
    // embedded.
    let is_expr = matches!(&kind, FeatureKind::Raw { expr: Some(_), .. });
    if is_expr && f.embedding_dim() > 0 {
        log::warn!("{path}: ExprFeature `{name}` ignores embedding_dim, as EasyRec's does (a numeric column)");
    }
    Ok(FeatureSpec {
        name,
        inputs: f.input_names.clone(),
        kind,
        table,
        embedding_dim: if is_expr { 0 } else { f.embedding_dim() },
        mean_combiner: f.combiner() == "mean",
        init: embedding_init(f, path)?,
        key_value,
    })
}

/// A SequenceFeature's kind: how its values become ids, how many it keeps,
/// and how its positions combine.
fn sequence(
    f: &proto::FeatureConfig,
    path: &str,
    pooled: bool,
    name: &str,
    need_buckets: impl Fn() -> Result<Bucketing, ConfigError>,
) -> Result<FeatureKind, ConfigError> {
    // How a sequence of RawFeature values becomes ids, in EasyRec's
    // order of precedence; `None` for a sequence of ids.
    // Boundaries are checked increasing with every feature's.
    let raw_buckets = match f.sub_feature_type() {
                FeatureType::IdFeature => None,
                FeatureType::RawFeature if f.hash_bucket_size() > 0 => return Err(ConfigError::invalid(
                    format!("{path}.hash_bucket_size"),
                    "a sequence of RawFeature values is bucketized by boundaries, not hashed (EasyRec stops on it too)",
                )),
                FeatureType::RawFeature if !f.boundaries.is_empty() => Some(Bucketing::Boundaries(f.boundaries.clone())),
                FeatureType::RawFeature if f.num_buckets() > 1 && f.max_val() > f.min_val() => Some(Bucketing::Scaled {
                    min: f.min_val(),
                    max: f.max_val(),
                    buckets: f.num_buckets(),
                }),
                FeatureType::RawFeature if f.num_buckets() > 1 => {
                    return Err(ConfigError::unsupported(
                        format!("{path}.num_buckets"),
                        "a sequence of RawFeature values with num_buckets but not min_val < max_val (EasyRec then reads the values as integer ids)",
                    ))
                }
                FeatureType::RawFeature if f.embedding_dim() == 0 => {
                    return Err(ConfigError::unsupported(
                        format!("{path}.sub_feature_type"),
                        "sequences of RawFeature values without boundaries, buckets or embedding_dim (dense value sequences)",
                    ))
                }
                FeatureType::RawFeature => {
                    let multi = f.seq_multi_sep.as_deref().is_some_and(|s| !s.is_empty());
                    if multi != (f.raw_input_dim() > 1) {
                        return Err(ConfigError::invalid(
                            format!("{path}.raw_input_dim"),
                            "a sequence of raw values has raw_input_dim > 1 exactly when seq_multi_sep splits its positions (EasyRec's shapes fail otherwise)",
                        ));
                    }
                    Some(Bucketing::RawPositions { dim: f.raw_input_dim() })
                }
                other => {
                    return Err(ConfigError::unsupported(
                        format!("{path}.sub_feature_type"),
                        format!("sequences of {} values", other.as_str_name()),
                    ))
                }
            };
    let multi = f
        .seq_multi_sep
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|sep| MultiValue {
            separator: sep.to_string(),
            // validate checked it; sqrtn is refused below.
            combiner: if f.combiner() == "mean" {
                PositionCombiner::Mean
            } else {
                PositionCombiner::Sum
            },
        });
    let max_len = match f.max_seq_len {
        // EasyRec lays projected values out densely over
        // `sequence_length` positions.
        _ if matches!(raw_buckets, Some(Bucketing::RawPositions { .. })) => f.sequence_length().max(1) as usize,
        Some(0) => {
            return Err(ConfigError::invalid(
                format!("{path}.max_seq_len"),
                "a sequence keeps at least one value",
            ))
        }
        Some(n) => n as usize,
        None => {
            log::info!(
                        "SequenceFeature `{name}` keeps the first {DEFAULT_MAX_SEQ_LEN} values of a row (set max_seq_len to change)"
                    );
            DEFAULT_MAX_SEQ_LEN
        }
    };
    Ok(FeatureKind::Sequence {
        buckets: match raw_buckets {
            Some(b) => b,
            None => need_buckets()?,
        },
        separator: f.separator().to_string(),
        max_len,
        combiner: match &f.sequence_combiner {
            Some(c) if pooled => seq_combiner(c, &format!("{path}.sequence_combiner"), max_len)?,
            _ => None,
        },
        multi,
    })
}
