//! Trainer-ready view of a validated config: enums instead of strings and
//! oneofs, defaults resolved, and a clear "not supported" for every EasyRec
//! option this trainer cannot honour (never silently ignored).

use std::path::PathBuf;

use super::model_plan::{self, Arch, FeatureGroup, InputField, Metric};
use super::tasks::loss_kind;
pub use super::tasks::Task;
use super::{proto, validate, ConfigError};
use proto::dataset_config::InputType;
use proto::feature_config::FeatureType;

#[derive(Debug, Clone, PartialEq)]
pub enum InputFormat {
    Csv {
        separator: String,
        with_header: bool,
    },
    /// One column per feature (ParquetInputV2); `packed` for ParquetInput.
    Parquet {
        packed: bool,
    },
    /// EasyRec's RTPInput: text lines whose non-label fields share one
    /// column, split on `separator`.
    Rtp {
        separator: String,
        layout: RtpLayout,
    },
    /// EasyRec's TFRecordInput: tf.Example records, one value per field,
    /// in files compressed as `data_compression_type` says.
    TfRecord {
        compression: Compression,
        /// BatchTFRecordInput: tf.SequenceExample records of this many
        /// rows each (`n_data_batch_tfrecord`).
        rows_per_record: Option<usize>,
    },
    /// EasyRec's CriteoInput: binary parts of three row-aligned files (see
    /// `data::criteo`); the input paths name the label files, `parts` every
    /// part's three (train and eval).
    CriteoBinary {
        parts: Vec<BinaryPart>,
    },
}

/// `data_config.data_compression_type` of TFRecord files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zlib,
}

/// One `binary_train_input` / `binary_eval_input` entry: globs of the
/// label, dense and category files, matched up in sorted order.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryPart {
    pub label: String,
    pub dense: String,
    pub category: String,
}

/// The parts of a binary input at `field`, added to `parts`; returns the
/// label globs (the input's paths).
fn binary_input(
    b: &proto::BinaryDataInput,
    field: &str,
    parts: &mut Vec<BinaryPart>,
) -> Result<Vec<String>, ConfigError> {
    let n = b.label_path.len();
    if n == 0 || b.dense_path.len() != n || b.category_path.len() != n {
        return Err(ConfigError::invalid(
            field,
            format!(
                "needs one label_path, dense_path and category_path per part (got {}, {} and {})",
                n,
                b.dense_path.len(),
                b.category_path.len()
            ),
        ));
    }
    for i in 0..n {
        parts.push(BinaryPart {
            label: b.label_path[i].clone(),
            dense: b.dense_path[i].clone(),
            category: b.category_path[i].clone(),
        });
    }
    Ok(b.label_path.clone())
}

/// EasyRec's RTPInput layout: a line's columns (split on `rtp_separator`)
/// hold the label fields at `label_cols` (the first input fields, in
/// order) and the other fields, in `input_fields` order, in column
/// `feature_col`, split on the separator.
#[derive(Debug, Clone, PartialEq)]
pub struct RtpLayout {
    pub rtp_separator: String,
    pub label_cols: Vec<usize>,
    pub feature_col: usize,
}

impl InputFormat {
    /// The separator of a row's fields as a packed serving string carries
    /// them ("," for Parquet input, EasyRec's default).
    pub fn field_separator(&self) -> &str {
        match self {
            InputFormat::Csv { separator, .. } | InputFormat::Rtp { separator, .. } if !separator.is_empty() => {
                separator
            }
            _ => ",",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// NoStrategy or PSStrategy: EasyRec's parameter-server training, one
    /// process alone or several ranks: synchronously as embedding-parallel,
    /// asynchronously on server and worker ranks (`TrainingPlan::asynchronous`).
    Single,
    /// Tables sharded across ranks, dense part replicated (EmbeddingParallel, Sok).
    EmbeddingParallel,
    /// Every parameter replicated, gradients all-reduced.
    DataParallel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointCadence {
    Steps(u32),
    Secs(u32),
}

impl CheckpointCadence {
    /// Whether a checkpoint is due at global step `step`, the last one
    /// saved at `saved`.
    pub fn due(self, step: u64, saved: std::time::Instant) -> bool {
        match self {
            CheckpointCadence::Steps(n) => n > 0 && step.is_multiple_of(n as u64),
            CheckpointCadence::Secs(s) => saved.elapsed().as_secs() >= s as u64,
        }
    }
}

/// Learning rate as a function of the global step, EasyRec's formulas.
#[derive(Debug, Clone, PartialEq)]
pub enum LrSchedule {
    Constant(f32),
    ExponentialDecay {
        initial: f32,
        decay_steps: u32,
        factor: f32,
        staircase: bool,
        burnin_lr: f32,
        burnin_steps: u32,
        min_lr: f32,
    },
    ManualStep {
        initial: f32,
        schedule: Vec<(u32, f32)>,
        warmup: bool,
    },
    CosineDecay {
        base: f32,
        total_steps: u32,
        warmup_lr: f32,
        warmup_steps: u32,
        hold_steps: u32,
    },
    PolyDecay {
        base: f32,
        total_steps: i64,
        power: f32,
        end_lr: f32,
    },
    Transformer {
        base: f32,
        hidden_size: i32,
        warmup_steps: i32,
        step_scaling: f32,
    },
}

impl LrSchedule {
    pub fn at(&self, step: u64) -> f32 {
        let s = step as f64;
        let v = match *self {
            LrSchedule::Constant(lr) => lr as f64,
            LrSchedule::ExponentialDecay {
                initial,
                decay_steps,
                factor,
                staircase,
                burnin_lr,
                burnin_steps,
                min_lr,
            } => {
                let burnin = if burnin_lr == 0.0 { initial } else { burnin_lr } as f64;
                let lr = if step < burnin_steps as u64 {
                    burnin
                } else {
                    let mut p = (s - burnin_steps as f64) / decay_steps.max(1) as f64;
                    if staircase {
                        p = p.floor();
                    }
                    initial as f64 * (factor as f64).powf(p)
                };
                lr.max(min_lr as f64)
            }
            LrSchedule::ManualStep {
                initial,
                ref schedule,
                warmup,
            } => {
                let mut rates = vec![initial as f64];
                rates.extend(schedule.iter().map(|(_, r)| *r as f64));
                let first = schedule.first().map_or(0, |(b, _)| *b) as u64;
                if warmup && step < first && rates.len() > 1 {
                    rates[0] + (rates[1] - rates[0]) * s / first as f64
                } else {
                    rates[schedule.iter().filter(|(b, _)| step >= *b as u64).count()]
                }
            }
            LrSchedule::CosineDecay {
                base,
                total_steps,
                warmup_lr,
                warmup_steps,
                hold_steps,
            } => {
                let (base, total, warm, hold) =
                    (base as f64, total_steps as f64, warmup_steps as f64, hold_steps as f64);
                if s > total {
                    0.0
                } else if warmup_steps > 0 && s < warm {
                    (base - warmup_lr as f64) / warm * s + warmup_lr as f64
                } else if hold_steps > 0 && s <= warm + hold {
                    base
                } else {
                    0.5 * base * (1.0 + (std::f64::consts::PI * (s - warm - hold) / (total - warm - hold)).cos())
                }
            }
            LrSchedule::PolyDecay {
                base,
                total_steps,
                power,
                end_lr,
            } => {
                let t = total_steps.max(1) as f64;
                let p = s.min(t) / t;
                (base - end_lr) as f64 * (1.0 - p).powf(power as f64) + end_lr as f64
            }
            LrSchedule::Transformer {
                base,
                hidden_size,
                warmup_steps,
                step_scaling,
            } => {
                let n = s * step_scaling as f64 + 1.0;
                let decay = (hidden_size as f64).powf(-0.5) * (n * (warmup_steps as f64).powf(-1.5)).min(n.powf(-0.5));
                decay * base as f64
            }
        };
        v as f32
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerKind {
    /// Momentum SGD (momentum 0 is plain SGD).
    Momentum {
        momentum: f32,
    },
    /// Momentum with decoupled weight decay (TensorFlow's MomentumW): each
    /// updated value first shrinks by `weight_decay` times itself.
    MomentumW {
        momentum: f32,
        weight_decay: f32,
    },
    Adam {
        beta1: f32,
        beta2: f32,
    },
    /// Adam whose untouched embedding rows keep their moments.
    LazyAdam {
        beta1: f32,
        beta2: f32,
    },
    /// PAI-TensorFlow's AdamAsyncOptimizer: Adam whose beta powers are kept
    /// per variable (advanced by each of its updates, so `beta^t` in
    /// synchronous training) and whose sparse updates touch only the
    /// gathered rows, which is `LazyAdam`'s update; only its checkpoint
    /// slot names differ.
    AdamAsync {
        beta1: f32,
        beta2: f32,
    },
    AdamW {
        beta1: f32,
        beta2: f32,
        weight_decay: f32,
    },
    Adagrad {
        initial_accumulator: f32,
    },
    Ftrl {
        lr_power: f32,
        initial_accumulator: f32,
        l1: f32,
        l2: f32,
        l2_shrinkage: f32,
    },
    RmsProp {
        momentum: f32,
        decay: f32,
        epsilon: f32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerSpec {
    pub kind: OptimizerKind,
    pub lr: LrSchedule,
    pub embedding_lr_multiplier: Option<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    WideAndDeep,
    Dlrm,
    DeepFm,
    Fm,
    AutoInt,
    Dcn,
    MultiTower,
    /// MultiTower with DIN towers over `seq_att_groups`.
    MultiTowerDin,
    /// MultiTower with BST towers over `seq_att_groups`.
    MultiTowerBst,
    Mmoe,
    Dbmtl,
    /// A tower per task over the `all` group.
    SimpleMultiTask,
    Esmm,
    /// Progressive layered extraction.
    Ple,
    /// A `backbone` DAG with EasyRec's rank head.
    RankModel,
    /// A `backbone` DAG with task towers.
    MultiTaskModel,
    /// Two-tower retrieval.
    Dssm,
    /// Multi-interest retrieval: capsules over a behaviour sequence.
    Mind,
    /// Two-tower retrieval robust to missing preference features.
    DropoutNet,
    /// A `backbone` DAG whose two outputs are a match model's towers.
    MatchModel,
    /// A light network hinted by a booster.
    RocketLaunching,
    /// CMBF or Uniter: a multi-modal tower with EasyRec's rank head.
    Multimodal,
}

impl ModelKind {
    /// Whether the model ends in one output layer as wide as
    /// `model_config.num_class`, as EasyRec's single-task rank models do.
    pub fn has_class_head(self) -> bool {
        use ModelKind::*;
        matches!(
            self,
            WideAndDeep
                | Dlrm
                | DeepFm
                | AutoInt
                | Dcn
                | MultiTower
                | MultiTowerDin
                | MultiTowerBst
                | RankModel
                | Multimodal
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossKind {
    /// Sigmoid cross entropy on one logit.
    BinaryClassification,
    /// Mean squared error.
    Regression,
    /// A match model's in-batch softmax (EasyRec's listwise
    /// `SOFTMAX_CROSS_ENTROPY`): each user's item against the batch's
    /// other items. The task's `logits` are the row's own similarity.
    /// `ignore_in_batch` (EasyRec's `ignore_in_batch_neg_sam`): the batch's
    /// other items are left out, only sampled ones compete.
    InBatchSoftmax { ignore_in_batch: bool },
    /// Softmax cross entropy over `classes` logits (CLASSIFICATION with
    /// `num_class > 1`); the label is the class index.
    MultiClass { classes: usize },
    /// EasyRec's zero-inflated lognormal (`ZILN_LOSS`, lifetime value):
    /// three logits per row (whether the label is positive, the
    /// lognormal's mu and its sigma before softplus), scored as `probs`
    /// (of a positive label) and `y` (the expected value).
    Ziln(ZilnPrediction),
    /// EasyRec's JRC loss (`JRC_LOSS`, num_class 2): two logits per row,
    /// scored as `probs`, the softmax's second class.
    Jrc,
}

impl LossKind {
    /// A match model's in-batch softmax.
    pub fn is_in_batch(self) -> bool {
        matches!(self, LossKind::InBatchSoftmax { .. })
    }

    /// An in-batch softmax that leaves the batch's other items out
    /// (`ignore_in_batch_neg_sam`).
    pub fn ignores_in_batch(self) -> bool {
        matches!(self, LossKind::InBatchSoftmax { ignore_in_batch: true })
    }
}

/// How a ZILN task's expected value `y` is computed from its logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZilnPrediction {
    /// Sigma's upper clip.
    pub max_sigma: f32,
    /// The log of `y` is clipped to [-100, this].
    pub max_log_clip: f32,
    /// `y` is given as its logarithm (unclipped).
    pub return_log: bool,
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
        activation: model_plan::Activation,
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

/// Where RTPInput's fields are (`selected_cols`: the label columns, then
/// the feature column), checked against the input fields: EasyRec reads
/// the labels into the first input fields.
fn rtp_layout(data: &proto::DatasetConfig) -> Result<RtpLayout, ConfigError> {
    let path = "data_config.selected_cols";
    let cols = data
        .selected_cols()
        .split(',')
        .map(|c| c.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| {
            ConfigError::invalid(
                path,
                format!(
                    "`{}` is not a list of column numbers (the label columns, then the feature column)",
                    data.selected_cols()
                ),
            )
        })?;
    let (feature_col, label_cols) = cols.split_last().expect("split yields one item");
    if label_cols.len() != data.label_fields.len() {
        return Err(ConfigError::invalid(
            path,
            format!(
                "{} label columns for {} label_fields: RTPInput reads one column per label, then the feature column",
                label_cols.len(),
                data.label_fields.len()
            ),
        ));
    }
    for (i, f) in data.input_fields.iter().take(label_cols.len()).enumerate() {
        if !data.label_fields.contains(&f.input_name) {
            return Err(ConfigError::invalid(
                format!("data_config.input_fields[{i}]"),
                format!(
                    "`{}` is not a label field: RTPInput reads its label columns into the first input fields",
                    f.input_name
                ),
            ));
        }
    }
    if data.rtp_separator().is_empty() {
        return Err(ConfigError::invalid("data_config.rtp_separator", "must not be empty"));
    }
    Ok(RtpLayout {
        rtp_separator: data.rtp_separator().to_string(),
        label_cols: label_cols.to_vec(),
        feature_col: *feature_col,
    })
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
                super::backbone::text_cnn_filters(&t.filter_sizes, &t.num_filters, pad, &path)?;
            Some(SeqCombiner::TextCnn {
                filter_sizes,
                num_filters,
                pad,
                activation: model_plan::activation(t.activation(), &format!("{path}.activation"))?,
            })
        }
    })
}

/// The file in model_dir whose appearance ends training when
/// `enable_oss_stop_signal` is set (EasyRec's name).
pub const STOP_SIGNAL: &str = "OSS_STOP_SIGNAL";

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

/// Everything training needs, checked for support.
#[derive(Debug, Clone)]
pub struct TrainingPlan {
    pub model_dir: PathBuf,
    pub train_paths: Vec<String>,
    pub eval_paths: Vec<String>,
    pub format: InputFormat,
    pub batch_size: u32,
    pub num_epochs: u32,
    pub num_steps: Option<u32>,
    pub strategy: Strategy,
    /// With `Strategy::Single` (NoStrategy, PSStrategy: EasyRec's
    /// parameter-server training), the option that makes the workers
    /// asynchronous, if one does: `sync_replicas: false`, or PSStrategy
    /// (EasyRec turns sync_replicas off under any strategy but NoStrategy).
    /// Several ranks train synchronously without one (each global step one
    /// batch from every worker, their gradients averaged) and with one
    /// asynchronously on parameter-server ranks (`train::ps`); one process
    /// trains alike either way.
    pub asynchronous: Option<&'static str>,
    /// A listwise match model's `item_id` (without
    /// `ignore_in_batch_neg_sam`): the input field whose equal values
    /// mark the batch's other examples that are no negatives of a user.
    pub in_batch_item: Option<String>,
    pub checkpoints: CheckpointCadence,
    pub keep_checkpoint_max: u32,
    /// `enable_oss_stop_signal`: training ends (as at num_steps) once the
    /// file `STOP_SIGNAL` appears in model_dir.
    pub stop_signal: bool,
    pub log_step_count_steps: u32,
    pub save_summary_steps: u32,
    pub gradient_clip_norm: Option<f32>,
    pub optimizers: Vec<OptimizerSpec>,
    pub model: ModelKind,
    /// What the model is trained for: one task, or one per task tower.
    pub tasks: Vec<Task>,
    pub features: Vec<FeatureSpec>,
    /// Input columns in file order (CSV) or by name (Parquet).
    pub fields: Vec<InputField>,
    pub label_fields: Vec<String>,
    pub groups: Vec<FeatureGroup>,
    pub arch: Arch,
    pub l2_regularization: f32,
    pub embedding_regularization: f32,
    /// `model_config.variational_dropout`, applied to every feature group.
    pub variational_dropout: Option<VariationalDropout>,
    /// `data_config.negative_sampler`: items appended to every batch as
    /// negatives of a match model's users.
    pub negative_sampling: Option<NegativeSampling>,
    /// `train_config.freeze_gradient`: regular expressions; a variable whose
    /// TensorFlow name (`deep/dnn_0/kernel:0`) one matches is not trained.
    pub freeze_gradient: Vec<String>,
    /// `data_config.sample_weight`: the field that weighs each example's
    /// loss (TensorFlow's losses divide the weighted sum by the count of
    /// non-zero weights; a match model's listwise loss by their sum).
    pub sample_weight: Option<String>,
    pub shuffle: bool,
    pub shuffle_buffer_size: usize,
    pub prefetch_size: usize,
    /// Evaluate on this many examples (0 = all).
    pub eval_num_examples: u64,
    /// Evaluate at a checkpoint save once this many seconds passed since the
    /// last evaluation (EasyRec's eval_interval_secs, the EvalSpec throttle).
    pub eval_interval_secs: u32,
    pub fine_tune: Option<FineTune>,
    pub export: super::export_plan::ExportPlan,
    /// What the config will allocate, checked against the machine before
    /// anything is.
    pub memory: super::sizes::Claims,
}

/// EasyRec's variational dropout (`model_config.variational_dropout`): each
/// feature group's features (`embedding_wise`: each of their columns) learn
/// a dropout rate, and the loss gains `lambda / batch * Σ (1 - rate)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VariationalDropout {
    pub lambda: f32,
    pub embedding_wise: bool,
}

/// How a negative sampler draws its `num_sample` items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleDraw {
    /// graph-learn's `node_weight` sampler (`negative_sampler`,
    /// `hard_negative_sampler`): by the items' weights, with replacement,
    /// skipping the batch's items.
    Weighted,
    /// `negative_sampler_in_memory`: uniformly, without replacement,
    /// skipping the batch's items.
    Distinct,
    /// graph-learn's conditional edge sampler (`negative_sampler_v2`,
    /// `hard_negative_sampler_v2`): uniformly, skipping the items each
    /// example's user has a positive edge to.
    AvoidPositives,
}

/// The user side of a sampler: EasyRec's user table and its edge tables
/// (`userid:int64 itemid:int64 weight:float`, tab-separated after a header).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerUsers {
    /// The field of a batch's user ids.
    pub user_id_field: String,
    /// Users (`id:int64 weight:float`): edges of other users are left out.
    pub users_path: String,
    /// `pos_edge_input_path` (v2 samplers).
    pub positive_edges: Option<String>,
    /// `hard_neg_edge_input_path` (hard-negative samplers): each example's
    /// user's items there, at most `num_hard_sample`, join its softmax.
    pub hard_edges: Option<String>,
    pub num_hard_sample: u32,
}

/// EasyRec's negative samplers: `num_sample` items of the table at
/// `items_path` follow a training batch's examples, `num_eval_sample` an
/// evaluation batch's, then (hard-negative samplers) each user's hard
/// negatives.
#[derive(Debug, Clone, PartialEq)]
pub struct NegativeSampling {
    pub items_path: String,
    pub num_sample: u32,
    pub num_eval_sample: u32,
    /// The input fields the table's attributes fill, in their order.
    pub attr_fields: Vec<String>,
    /// The field of a batch's item ids, which are not drawn as negatives.
    pub item_id_field: String,
    pub attr_delimiter: String,
    pub draw: SampleDraw,
    pub users: Option<SamplerUsers>,
}

/// `train_config.freeze_gradient`, each a valid regular expression.
fn freeze_patterns(patterns: &[String]) -> Result<Vec<String>, ConfigError> {
    for (i, p) in patterns.iter().enumerate() {
        if let Err(e) = regex::Regex::new(p) {
            return Err(ConfigError::invalid(
                format!("train_config.freeze_gradient[{i}]"),
                format!("`{p}` is not a regular expression: {e}"),
            ));
        }
    }
    Ok(patterns.to_vec())
}

/// `data_config`'s sampler, checked against its input fields.
fn negative_sampling(data: &proto::DatasetConfig) -> Result<Option<NegativeSampling>, ConfigError> {
    use proto::dataset_config::Sampler;
    // Every kind's common fields, then its user side.
    struct Common<'a> {
        items: &'a str,
        num_sample: u32,
        num_eval_sample: u32,
        attr_fields: &'a [String],
        item_id_field: &'a str,
        attr_delimiter: &'a str,
        field_delimiter: &'a str,
    }
    macro_rules! common {
        ($s:expr, $items:expr) => {
            Common {
                items: $items,
                num_sample: $s.num_sample,
                num_eval_sample: $s.num_eval_sample(),
                attr_fields: &$s.attr_fields,
                item_id_field: &$s.item_id_field,
                attr_delimiter: $s.attr_delimiter(),
                field_delimiter: $s.field_delimiter(),
            }
        };
    }
    let users = |user_id_field: &str, users_path: &str, pos: Option<&str>, hard: Option<&str>, n: u32| SamplerUsers {
        user_id_field: user_id_field.to_string(),
        users_path: users_path.to_string(),
        positive_edges: pos.map(str::to_string),
        hard_edges: hard.map(str::to_string),
        num_hard_sample: n,
    };
    let (name, c, draw, users) = match &data.sampler {
        None => return Ok(None),
        Some(Sampler::NegativeSampler(s)) => (
            "negative_sampler",
            common!(s, &s.input_path),
            SampleDraw::Weighted,
            None,
        ),
        Some(Sampler::NegativeSamplerInMemory(s)) => (
            "negative_sampler_in_memory",
            common!(s, &s.input_path),
            SampleDraw::Distinct,
            None,
        ),
        Some(Sampler::NegativeSamplerV2(s)) => (
            "negative_sampler_v2",
            common!(s, &s.item_input_path),
            SampleDraw::AvoidPositives,
            Some(users(
                &s.user_id_field,
                &s.user_input_path,
                Some(&s.pos_edge_input_path),
                None,
                0,
            )),
        ),
        Some(Sampler::HardNegativeSampler(s)) => (
            "hard_negative_sampler",
            common!(s, &s.item_input_path),
            SampleDraw::Weighted,
            Some(users(
                &s.user_id_field,
                &s.user_input_path,
                None,
                Some(&s.hard_neg_edge_input_path),
                s.num_hard_sample,
            )),
        ),
        Some(Sampler::HardNegativeSamplerV2(s)) => (
            "hard_negative_sampler_v2",
            common!(s, &s.item_input_path),
            SampleDraw::AvoidPositives,
            Some(users(
                &s.user_id_field,
                &s.user_input_path,
                Some(&s.pos_edge_input_path),
                Some(&s.hard_neg_edge_input_path),
                s.num_hard_sample,
            )),
        ),
    };
    let path = format!("data_config.{name}");
    let declared = |f: &str| data.input_fields.iter().any(|i| i.input_name == f);
    if let Some(f) = c.attr_fields.iter().find(|f| !declared(f)) {
        return Err(ConfigError::invalid(
            format!("{path}.attr_fields"),
            format!("`{f}` is not among data_config.input_fields"),
        ));
    }
    let id_fields = [
        Some(("item_id_field", c.item_id_field)),
        users.as_ref().map(|u| ("user_id_field", u.user_id_field.as_str())),
    ];
    for (field, f) in id_fields.into_iter().flatten() {
        if !declared(f) {
            return Err(ConfigError::invalid(
                format!("{path}.{field}"),
                format!("`{f}` is not among data_config.input_fields"),
            ));
        }
    }
    if c.num_sample == 0 {
        return Err(ConfigError::invalid(
            format!("{path}.num_sample"),
            "a sampler draws at least one item",
        ));
    }
    if c.field_delimiter != "\u{1}" {
        log::warn!(
            "{path}.field_delimiter: EasyRec uses it only on its DataScience platform; tables in files are tab-separated, as EasyRec reads them"
        );
    }
    Ok(Some(NegativeSampling {
        items_path: c.items.to_string(),
        num_sample: c.num_sample,
        num_eval_sample: c.num_eval_sample,
        attr_fields: c.attr_fields.to_vec(),
        item_id_field: c.item_id_field.to_string(),
        attr_delimiter: c.attr_delimiter.to_string(),
        draw,
        users,
    }))
}

/// `fine_tune_checkpoint` with its `fine_tune_ckpt_var_map` file.
#[derive(Debug, Clone, PartialEq)]
pub struct FineTune {
    pub checkpoint: PathBuf,
    pub var_map: Option<PathBuf>,
}

/// The features of group `name`, taken out of it for a model that reads
/// them as unpooled sequences (`reader`: who, and a note for the error),
/// with the group; `None` without such a group. A feature that is no
/// SequenceFeature is an error naming it.
fn unpooled_sequences<'g>(
    groups: &'g mut [model_plan::FeatureGroup],
    name: &str,
    features: &[FeatureSpec],
    (reader, note): (&str, &str),
) -> Result<Option<(&'g mut model_plan::FeatureGroup, Vec<usize>)>, ConfigError> {
    let Some(g) = groups.iter_mut().find(|g| g.name == name) else {
        return Ok(None);
    };
    if let Some(&fi) = g
        .features
        .iter()
        .find(|&&fi| !matches!(features[fi].kind, FeatureKind::Sequence { .. }))
    {
        return Err(ConfigError::invalid(
            format!("model_config.feature_groups ({name})"),
            format!(
                "{reader} reads the sequence features of group `{name}`, and `{}` is not one{note}",
                features[fi].name
            ),
        ));
    }
    let seqs = std::mem::take(&mut g.features);
    Ok(Some((g, seqs)))
}

fn paths(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

impl TrainingPlan {
    /// The inputs a served request may give as a list of values per row
    /// (`export_config.multi_value_fields` or `auto_multi_value`), each
    /// with the separator its feature splits a value by, which joins the
    /// list back into the text that feature reads.
    pub fn multi_value_inputs(&self) -> Result<Vec<(String, String)>, ConfigError> {
        use super::export_plan::MultiValue;
        // The separator of a feature reading input field `name` as a list.
        let separator = |name: &str| {
            self.features.iter().find_map(|f| match &f.kind {
                FeatureKind::Tag { separator, .. } if f.inputs.iter().take(2).any(|i| i == name) => {
                    Some(separator.clone())
                }
                FeatureKind::Sequence { separator, .. } if f.inputs[0] == name => Some(separator.clone()),
                FeatureKind::Raw { dim, separator, .. } if *dim > 1 && f.inputs[0] == name => Some(separator.clone()),
                _ => None,
            })
        };
        match &self.export.multi_value {
            MultiValue::None => Ok(Vec::new()),
            MultiValue::Auto => {
                let mut out: Vec<(String, String)> = Vec::new();
                for f in &self.fields {
                    if let Some(sep) = separator(&f.name) {
                        out.push((f.name.clone(), sep));
                    }
                }
                Ok(out)
            }
            MultiValue::Fields(names) => names
                .iter()
                .map(|n| {
                    separator(n).map(|sep| (n.clone(), sep)).ok_or_else(|| {
                        ConfigError::invalid(
                            "export_config.multi_value_fields.input_name",
                            format!("`{n}` is no input of a tag, sequence or multi-dimensional raw feature, so it takes one value per row"),
                        )
                    })
                })
                .collect(),
        }
    }

    /// Labels made of two label fields' product (indices into
    /// `label_fields`), which tasks find after those: ESMM's CTCVR label.
    pub fn label_products(&self) -> Vec<(usize, usize)> {
        match &self.arch {
            Arch::Esmm { labels, .. } => vec![*labels],
            _ => Vec::new(),
        }
    }

    /// The field every grouped AUC (GAUC's `uid_field`, session AUC's
    /// `session_id_field`) of every task groups rows by, in task order.
    /// JRC losses' session fields join them: rows carry one grouping field.
    pub fn gauc_uid_fields(&self) -> impl Iterator<Item = &str> {
        let metrics = self.tasks.iter().flat_map(|t| &t.metrics).filter_map(|m| match m {
            Metric::Gauc { uid_field } => Some(uid_field.as_str()),
            Metric::SessionAuc { session_id_field } => Some(session_id_field.as_str()),
            _ => None,
        });
        metrics.chain(self.tasks.iter().filter_map(|t| t.session.as_deref()))
    }

    pub fn from_config(cfg: &proto::EasyRecConfig) -> Result<Self, ConfigError> {
        use proto::easy_rec_config::{EvalPath, TrainPath};
        let mut binary_parts = Vec::new();
        let train_paths = match &cfg.train_path {
            Some(TrainPath::TrainInputPath(p)) | Some(TrainPath::ParquetTrainInput(p)) => paths(p),
            Some(TrainPath::KafkaTrainInput(_)) => {
                return Err(ConfigError::unsupported("kafka_train_input", "Kafka input"))
            }
            Some(TrainPath::DatahubTrainInput(_)) => {
                return Err(ConfigError::unsupported("datahub_train_input", "DataHub input"))
            }
            Some(TrainPath::HiveTrainInput(_)) => {
                return Err(ConfigError::unsupported("hive_train_input", "Hive input"))
            }
            Some(TrainPath::BinaryTrainInput(b)) => binary_input(b, "binary_train_input", &mut binary_parts)?,
            None => {
                return Err(ConfigError::invalid(
                    "train_input_path",
                    "no training data: set train_input_path or parquet_train_input",
                ))
            }
        };
        let eval_paths = match &cfg.eval_path {
            Some(EvalPath::EvalInputPath(p)) | Some(EvalPath::ParquetEvalInput(p)) => paths(p),
            Some(EvalPath::BinaryEvalInput(b)) => binary_input(b, "binary_eval_input", &mut binary_parts)?,
            None => Vec::new(),
            Some(_) => return Err(ConfigError::unsupported("eval_path", "this eval input source")),
        };
        let data = cfg
            .data_config
            .clone()
            .ok_or_else(|| ConfigError::invalid("data_config", "required for training"))?;
        let format = match data.input_type() {
            InputType::CsvInput => InputFormat::Csv {
                separator: data.separator().to_string(),
                with_header: data.with_header(),
            },
            InputType::CriteoInput if binary_parts.is_empty() => {
                return Err(ConfigError::invalid(
                    "data_config.input_type",
                    "CriteoInput reads binary_train_input (and binary_eval_input) { label_path dense_path category_path }, not input paths",
                ))
            }
            InputType::CriteoInput => InputFormat::CriteoBinary {
                parts: binary_parts.clone(),
            },
            _ if !binary_parts.is_empty() => {
                return Err(ConfigError::invalid(
                    "binary_train_input",
                    "binary input is read by data_config.input_type: CriteoInput",
                ))
            }
            InputType::ParquetInput => InputFormat::Parquet { packed: true },
            InputType::TfRecordInput | InputType::BatchTfRecordInput => InputFormat::TfRecord {
                rows_per_record: match data.input_type() {
                    InputType::BatchTfRecordInput => Some(
                        data.n_data_batch_tfrecord
                            .filter(|n| *n > 0)
                            .ok_or_else(|| {
                                ConfigError::invalid(
                                    "data_config.n_data_batch_tfrecord",
                                    "BatchTFRecordInput needs the rows each record holds",
                                )
                            })? as usize,
                    ),
                    _ => None,
                },
                // TensorFlow's compression_type names.
                compression: match data.data_compression_type() {
                    "" => Compression::None,
                    "GZIP" => Compression::Gzip,
                    "ZLIB" => Compression::Zlib,
                    other => {
                        return Err(ConfigError::invalid(
                            "data_config.data_compression_type",
                            format!("`{other}` (TensorFlow's are \"\", GZIP and ZLIB)"),
                        ))
                    }
                },
            },
            InputType::ParquetInputV2 => InputFormat::Parquet { packed: false },
            InputType::RtpInput => InputFormat::Rtp {
                separator: data.separator().to_string(),
                layout: rtp_layout(&data)?,
            },
            other => {
                return Err(ConfigError::unsupported(
                    "data_config.input_type",
                    format!("input type {}", other.as_str_name()),
                ))
            }
        };
        let negative_sampling = negative_sampling(&data)?;
        let sample_weight = data.sample_weight.clone().filter(|w| !w.is_empty());
        let train = cfg.train_config.clone().unwrap_or_default();
        refuse_unhonoured(&train)?;
        let (strategy, asynchronous) = strategy(&train)?;
        let checkpoints = match train.save_checkpoints_secs {
            Some(s) => CheckpointCadence::Secs(s),
            None => CheckpointCadence::Steps(train.save_checkpoints_steps()),
        };
        if train.optimizer_config.is_empty() {
            return Err(ConfigError::invalid(
                "train_config.optimizer_config",
                "training needs at least one optimizer",
            ));
        }
        let optimizers = train
            .optimizer_config
            .iter()
            .enumerate()
            .map(|(i, o)| optimizer(o, &format!("train_config.optimizer_config[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let model = &cfg.model_config;
        let kind = match model.model_class.as_str() {
            "WideAndDeep" => ModelKind::WideAndDeep,
            "DLRM" => ModelKind::Dlrm,
            "DeepFM" => ModelKind::DeepFm,
            "FM" => ModelKind::Fm,
            "AutoInt" => ModelKind::AutoInt,
            "DCN" => ModelKind::Dcn,
            "MultiTower" => ModelKind::MultiTower,
            "MultiTowerDIN" => ModelKind::MultiTowerDin,
            "MultiTowerBST" => ModelKind::MultiTowerBst,
            "MMoE" => ModelKind::Mmoe,
            "ESMM" => ModelKind::Esmm,
            "DBMTL" => ModelKind::Dbmtl,
            "SimpleMultiTask" => ModelKind::SimpleMultiTask,
            "PLE" => ModelKind::Ple,
            "RankModel" => ModelKind::RankModel,
            "MultiTaskModel" => ModelKind::MultiTaskModel,
            // DSSM_SENet is DSSM with a SENet in each tower; DAT is DSSM
            // with augmented vectors.
            "DSSM" | "DSSM_SENet" | "DAT" => ModelKind::Dssm,
            "MIND" => ModelKind::Mind,
            "DropoutNet" => ModelKind::DropoutNet,
            "MatchModel" => ModelKind::MatchModel,
            "RocketLaunching" => ModelKind::RocketLaunching,
            "CMBF" | "Uniter" => ModelKind::Multimodal,
            other => {
                return Err(ConfigError::Unsupported {
                    path: "model_config.model_class".into(),
                    what: format!("model class `{other}`"),
                    hint: " (supported: WideAndDeep, DLRM, DeepFM, FM, AutoInt, DCN, MultiTower, MultiTowerDIN, MultiTowerBST, MMoE, ESMM, DBMTL, SimpleMultiTask, PLE, RankModel, MultiTaskModel, MatchModel, DSSM, DSSM_SENet, DAT, MIND, DropoutNet, RocketLaunching, CMBF, Uniter)".into(),
                })
            }
        };
        if model.ev_params.is_some() {
            return Err(ConfigError::unsupported(
                "model_config.ev_params",
                "key-value embedding variables",
            ));
        }
        let (feats, prefix) = validate::features(cfg);
        let grouped: std::collections::HashSet<&str> = model
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
        let pooled: std::collections::HashSet<&str> = model
            .feature_groups
            .iter()
            .flat_map(|g| g.feature_names.iter().map(String::as_str))
            .collect();
        let mut features = Vec::with_capacity(feats.len());
        for (i, f) in feats.iter().enumerate() {
            let name = validate::feature_name(f);
            match feature(f, &format!("{prefix}[{i}]"), pooled.contains(name)) {
                Ok(spec) => features.push(spec),
                // A feature no group reads changes nothing EasyRec computes:
                // one of a kind this trainer cannot build is left out, said.
                Err(e @ ConfigError::Unsupported { .. }) if !grouped.contains(validate::feature_name(f)) => {
                    log::warn!(
                        "{e}; feature `{}` is in no feature group, so it is left out",
                        validate::feature_name(f)
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let num_steps = train.num_steps.filter(|n| *n > 0);
        let names: Vec<String> = features.iter().map(|f| f.name.clone()).collect();
        let mut groups = model_plan::groups(model, &names)?;
        groups.extend(model_plan::seq_tower_groups(model, &names)?);
        // A group a backbone input layer reads with
        // output_seq_and_normal_feature keeps its sequences unpooled.
        let seq_inputs = model
            .backbone
            .as_ref()
            .map(super::backbone::seq_input_groups)
            .unwrap_or_default();
        for g in groups.iter_mut().filter(|g| seq_inputs.contains(&g.name)) {
            let (seqs, plain): (Vec<usize>, Vec<usize>) = g
                .features
                .iter()
                .partition(|&&fi| matches!(features[fi].kind, FeatureKind::Sequence { combiner: None, .. }));
            if seqs.is_empty() {
                return Err(ConfigError::invalid(
                    format!("model_config.feature_groups ({})", g.name),
                    "output_seq_and_normal_feature reads a group's sequence features, and this one has none",
                ));
            }
            g.features = plain;
            g.seq.push(model_plan::SeqAttention::input(&g.name, seqs));
        }
        // MIND reads its `hist` group's sequences unpooled, on the first
        // one's length.
        if kind == ModelKind::Mind {
            if let Some((g, seqs)) = unpooled_sequences(&mut groups, "hist", &features, ("MIND", ""))? {
                g.seq.push(model_plan::SeqAttention::input(&g.name, seqs));
            }
        }
        // A multi-modal tower reads its `text` group's sequences unpooled,
        // each with its own length.
        if super::multimodal::reads_text_unpooled(model) {
            let reader = ("the multi-modal tower", " (EasyRec would leave it out)");
            if let Some((g, seqs)) = unpooled_sequences(&mut groups, "text", &features, reader)? {
                for fi in seqs {
                    g.seq.push(model_plan::SeqAttention::input(&g.name, vec![fi]));
                }
            }
        }
        // A SequenceFeature among a group's features is pooled by its
        // sequence_combiner; histories of `sequence_features` need none.
        for g in &groups {
            for &fi in &g.features {
                if let FeatureKind::Sequence { combiner, .. } = &features[fi].kind {
                    let i = feats
                        .iter()
                        .position(|f| validate::feature_name(f) == features[fi].name);
                    let path = format!("{prefix}[{}].sequence_combiner", i.unwrap_or(fi));
                    return Err(match combiner {
                        Some(_) if !g.wide => continue,
                        Some(_) => ConfigError::unsupported(
                            format!("model_config.feature_groups.feature_names ({})", features[fi].name),
                            format!("a SequenceFeature in the WIDE group `{}`", g.name),
                        ),
                        None if model.backbone.is_some() => ConfigError::unsupported(
                            format!("model_config.feature_groups.feature_names ({})", features[fi].name),
                            "sequence features that backbone blocks read unpooled",
                        ),
                        None => ConfigError::invalid(
                            path,
                            format!(
                                "SequenceFeature `{}` in feature group `{}` needs a sequence_combiner (or use a TagFeature)",
                                features[fi].name, g.name
                            ),
                        ),
                    });
                }
            }
        }
        if data.label_fields.is_empty() {
            return Err(ConfigError::invalid(
                "data_config.label_fields",
                "training needs a label field",
            ));
        }
        let (arch, l2_regularization, multi) = model_plan::arch(model, &data.label_fields)?;
        let mut tasks = match multi {
            // A tower without metrics_set takes eval_config's.
            Some(mut tasks) => {
                super::tasks::fixed_weights(model)?;
                if !model.losses.is_empty() {
                    // Multi-task models take losses per task tower.
                    return Err(ConfigError::unsupported(
                        "model_config.losses",
                        "a model-level losses list on a multi-task model",
                    ));
                }
                let eval_metrics = model_plan::metrics(cfg.eval_config.as_ref())?;
                for t in tasks.iter_mut().filter(|t| t.metrics.is_empty()) {
                    t.metrics = eval_metrics.clone();
                }
                for t in &tasks {
                    super::tasks::check_output_metrics(t.loss, &t.metrics, "eval_config.metrics_set")?;
                }
                tasks
            }
            None => {
                // EasyRec's single-task models train on `label_name`, by
                // default the first label field.
                let label = match model.label_name.as_deref().filter(|l| !l.is_empty()) {
                    Some(l) => data.label_fields.iter().position(|f| f == l).ok_or_else(|| {
                        ConfigError::invalid(
                            "model_config.label_name",
                            format!("`{l}` is not among data_config.label_fields"),
                        )
                    })?,
                    None => 0,
                };
                let mut metrics = model_plan::metrics(cfg.eval_config.as_ref())?;
                let mut session = None;
                let loss = if matches!(kind, ModelKind::Dssm | ModelKind::MatchModel | ModelKind::Mind) {
                    let ignore = super::mind::ignore_in_batch(model);
                    let loss = super::tasks::match_loss_kind(model.loss_type(), model.num_class(), ignore)?;
                    if kind == ModelKind::Mind && loss.is_in_batch() {
                        // EasyRec's listwise MIND evaluates recall_at_topk
                        // and passes over any other metric.
                        metrics.retain(|m| {
                            let keep = m.name() == "recall_at_topk";
                            if !keep {
                                log::warn!(
                                    "eval_config.metrics_set: MIND trained with SOFTMAX_CROSS_ENTROPY evaluates recall_at_topk only; {} is left out, as EasyRec does",
                                    m.name()
                                );
                            }
                            keep
                        });
                    }
                    super::tasks::check_match_metrics(loss, &metrics)?;
                    loss
                } else if kind == ModelKind::DropoutNet {
                    // EasyRec's DropoutNet trains on its `losses` alone, on
                    // the similarity as a logit.
                    if model.losses.is_empty() {
                        return Err(ConfigError::invalid(
                            "model_config.losses",
                            "DropoutNet trains on its losses list, and this one is empty",
                        ));
                    }
                    LossKind::BinaryClassification
                } else if let Some((kind, s)) =
                    super::tasks::list_kind(&model.losses, model.num_class(), "model_config.losses")?
                {
                    session = s;
                    kind
                } else {
                    loss_kind(model.loss_type(), model.num_class(), "model_config")?
                };
                let terms = super::tasks::loss_terms(model, loss)?;
                // Several logits per row need the one output layer of the
                // models that have it.
                let several = match loss {
                    LossKind::MultiClass { classes } => Some((
                        "model_config.num_class",
                        format!(
                            "multi-class classification ({classes} classes) on {}",
                            model.model_class
                        ),
                    )),
                    LossKind::Ziln(_) | LossKind::Jrc => Some((
                        "model_config.losses",
                        format!("{} on {}", model.losses[0].loss_type().as_str_name(), model.model_class),
                    )),
                    _ => None,
                };
                if let Some((field, what)) = several.filter(|_| !kind.has_class_head()) {
                    return Err(ConfigError::unsupported(field, what));
                }
                super::tasks::check_output_metrics(loss, &metrics, "eval_config.metrics_set")?;
                vec![Task {
                    terms,
                    metrics,
                    session,
                    ..Task::on_label("", label, loss)
                }]
            }
        };
        super::tasks::add_kd(model, &data.label_fields, &mut tasks)?;
        let fine_tune = Some(train.fine_tune_checkpoint())
            .filter(|c| !c.is_empty())
            .map(|c| FineTune {
                checkpoint: PathBuf::from(c),
                var_map: Some(train.fine_tune_ckpt_var_map())
                    .filter(|m| !m.is_empty())
                    .map(PathBuf::from),
            });
        let in_batch_item = match tasks.iter().any(|t| t.in_batch()) {
            true => super::mind::in_batch_item(model, &data)?,
            false => None,
        };
        let plan = TrainingPlan {
            memory: super::sizes::Claims::of(cfg, optimizer_slots(kind, &optimizers))?,
            fields: model_plan::input_fields(&data)?,
            label_fields: data.label_fields.clone(),
            groups,
            arch,
            l2_regularization,
            embedding_regularization: model.embedding_regularization(),
            variational_dropout: variational_dropout(model)?,
            negative_sampling,
            sample_weight,
            freeze_gradient: freeze_patterns(&train.freeze_gradient)?,
            shuffle: data.shuffle(),
            shuffle_buffer_size: data.shuffle_buffer_size().max(1) as usize,
            prefetch_size: data.prefetch_size().max(1) as usize,
            eval_num_examples: cfg.eval_config.as_ref().map_or(0, |e| e.num_examples()) as u64,
            eval_interval_secs: cfg.eval_config.as_ref().map_or(300, |e| e.eval_interval_secs()),
            fine_tune,
            export: super::export_plan::export_plan(cfg.export_config.as_ref())?,
            model_dir: PathBuf::from(&cfg.model_dir),
            train_paths,
            eval_paths,
            format,
            batch_size: data.batch_size(),
            num_epochs: data.num_epochs(),
            num_steps,
            strategy,
            asynchronous,
            in_batch_item,
            checkpoints,
            keep_checkpoint_max: train.keep_checkpoint_max(),
            stop_signal: train.enable_oss_stop_signal(),
            log_step_count_steps: train.log_step_count_steps().max(1),
            save_summary_steps: train.save_summary_steps(),
            gradient_clip_norm: Some(train.gradient_clipping_by_norm()).filter(|c| *c > 0.0),
            optimizers,
            model: kind,
            tasks,
            features,
        };
        plan.multi_value_inputs()?;
        if let Some(w) = plan.sample_weight.as_deref() {
            match plan.fields.iter().find(|f| f.name == w) {
                None => {
                    return Err(ConfigError::invalid(
                        "data_config.sample_weight",
                        format!("`{w}` is not among data_config.input_fields"),
                    ))
                }
                Some(f) if f.ty == model_plan::ColumnType::Str => {
                    return Err(ConfigError::invalid(
                        "data_config.sample_weight",
                        format!("`{w}` is a STRING field; weights are numbers"),
                    ))
                }
                Some(_) => {}
            }
            if matches!(plan.arch, model_plan::Arch::Dssm { amm: Some(_), .. }) {
                // EasyRec multiplies DAT's [batch, dim] mimic losses by the
                // [batch] weights, which only broadcast as a scalar.
                return Err(ConfigError::unsupported(
                    "data_config.sample_weight",
                    "per-sample weights of DAT's adaptive-mimic losses",
                ));
            }
            match plan.tasks.as_slice() {
                [t] if t.terms.is_empty() => {}
                [_] => {
                    return Err(ConfigError::unsupported(
                        "data_config.sample_weight",
                        "per-sample weights of a model_config.losses list",
                    ))
                }
                _ => {
                    return Err(ConfigError::unsupported(
                        "data_config.sample_weight",
                        "per-sample weights of a multi-task model's losses",
                    ))
                }
            }
        }
        if plan.negative_sampling.is_some() && !plan.tasks.iter().all(Task::in_batch) {
            return Err(ConfigError::invalid(
                "data_config.negative_sampler",
                "sampled negatives feed a match model's listwise loss (loss_type: SOFTMAX_CROSS_ENTROPY), which this model does not train",
            ));
        }
        // Rows are grouped by one field for every grouped AUC.
        let clash = {
            let mut fields = plan.gauc_uid_fields();
            let first = fields.next();
            first.and_then(|a| fields.find(|b| *b != a).map(|b| format!("(`{a}` and `{b}`)")))
        };
        match clash {
            Some(which) => Err(ConfigError::unsupported(
                "eval_config.metrics_set",
                format!("GAUC / session AUC grouped by two fields {which}"),
            )),
            None => Ok(plan),
        }
    }
}

fn variational_dropout(model: &proto::EasyRecModel) -> Result<Option<VariationalDropout>, ConfigError> {
    let Some(vd) = &model.variational_dropout else {
        return Ok(None);
    };
    if model.backbone.is_some() {
        return Err(ConfigError::unsupported(
            "model_config.variational_dropout",
            "variational dropout in a backbone model's input layers",
        ));
    }
    let lambda = vd.regularization_lambda();
    if !lambda.is_finite() || lambda < 0.0 {
        return Err(ConfigError::invalid(
            "model_config.variational_dropout.regularization_lambda",
            format!("{lambda} is not a finite value >= 0"),
        ));
    }
    Ok(Some(VariationalDropout {
        lambda,
        embedding_wise: vd.embedding_wise_variational_dropout(),
    }))
}

/// train_config options that change what EasyRec does and that this
/// trainer cannot do, refused by name when set. (TensorFlow's runtime
/// hints, such as thread counts, `protocol` or `write_graph`, change no
/// result and are accepted; the README lists them.)
fn refuse_unhonoured(train: &proto::TrainConfig) -> Result<(), ConfigError> {
    let set: [(&str, &str, bool); 4] = [
        ("is_profiling", "profiling", train.is_profiling()),
        (
            "incr_save_config",
            "incremental saving",
            train.incr_save_config.is_some(),
        ),
        (
            "force_restore_shape_compatible",
            "restoring tensors of another shape",
            train.force_restore_shape_compatible(),
        ),
        (
            "summary_model_vars",
            "summaries of every variable",
            train.summary_model_vars(),
        ),
    ];
    if let Some((field, what, _)) = set.iter().find(|(_, _, on)| *on) {
        return Err(ConfigError::unsupported(format!("train_config.{field}"), *what));
    }
    if train.dead_line.as_deref().is_some_and(|d| !d.is_empty()) {
        return Err(ConfigError::unsupported(
            "train_config.dead_line",
            "a training deadline",
        ));
    }
    Ok(())
}

/// How `train_distribute` (with `sync_replicas` and `num_gpus_per_worker`)
/// spreads training over the ranks: the strategy, and the option that makes
/// parameter-server workers asynchronous (`TrainingPlan::asynchronous`).
fn strategy(train: &proto::TrainConfig) -> Result<(Strategy, Option<&'static str>), ConfigError> {
    use proto::DistributionStrategy::*;
    let s = train.train_distribute();
    // EasyRec reads num_gpus_per_worker only for CollectiveAllReduce,
    // whose workers then run that many replicas each; here a rank is one
    // replica.
    if s == CollectiveAllReduceStrategy && train.num_gpus_per_worker() > 1 {
        return Err(ConfigError::Unsupported {
            path: "train_config.num_gpus_per_worker".into(),
            what: format!(
                "{} replicas per worker under CollectiveAllReduceStrategy",
                train.num_gpus_per_worker()
            ),
            hint: "; start one rank per replica instead".into(),
        });
    }
    let asynchronous = match s {
        // EasyRec turns sync_replicas off under any strategy but NoStrategy.
        PsStrategy => Some("train_config.train_distribute"),
        _ if !train.sync_replicas() => Some("train_config.sync_replicas"),
        _ => None,
    };
    let strategy = match s {
        NoStrategy | PsStrategy => Strategy::Single,
        EmbeddingParallelStrategy | SokStrategy => Strategy::EmbeddingParallel,
        MirroredStrategy | MultiWorkerMirroredStrategy | CollectiveAllReduceStrategy | HorovodStrategy => {
            Strategy::DataParallel
        }
        ExascaleStrategy => {
            return Err(ConfigError::Unsupported {
                path: "train_config.train_distribute".into(),
                what: format!("{} (PAI's collective training)", s.as_str_name()),
                hint: "; use EmbeddingParallelStrategy or MultiWorkerMirroredStrategy".into(),
            })
        }
    };
    Ok((strategy, asynchronous))
}

/// Slot vectors the optimizers keep per table row and per dense weight.
fn optimizer_slots(kind: ModelKind, optimizers: &[OptimizerSpec]) -> super::sizes::Slots {
    let assign = crate::optim::Assignment::new(kind, optimizers.len());
    let slots = |i: usize| optimizers.get(i).map_or(0, |o| crate::optim::slot_inits(&o.kind).len());
    super::sizes::Slots {
        tables: slots(assign.wide_tables).max(slots(assign.deep_tables)),
        dense: slots(assign.dense),
    }
}

fn optimizer(o: &proto::Optimizer, path: &str) -> Result<OptimizerSpec, ConfigError> {
    use proto::optimizer::Optimizer as O;
    if o.use_moving_average() {
        return Err(ConfigError::unsupported(
            format!("{path}.use_moving_average"),
            "moving averages of weights",
        ));
    }
    let kind_msg = o.optimizer.as_ref().expect("checked by validate::structure");
    let (name, lr) = validate::optimizer_lr(kind_msg);
    let kind = match kind_msg {
        O::MomentumOptimizer(m) => OptimizerKind::Momentum {
            momentum: m.momentum_optimizer_value(),
        },
        O::AdamOptimizer(a) => OptimizerKind::Adam {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::LazyAdamOptimizer(a) => OptimizerKind::LazyAdam {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::AdamwOptimizer(a) => OptimizerKind::AdamW {
            beta1: a.beta1(),
            beta2: a.beta2(),
            weight_decay: a.weight_decay(),
        },
        O::AdagradOptimizer(a) => OptimizerKind::Adagrad {
            initial_accumulator: a.initial_accumulator_value(),
        },
        O::FtrlOptimizer(f) => OptimizerKind::Ftrl {
            lr_power: f.learning_rate_power(),
            initial_accumulator: f.initial_accumulator_value(),
            l1: f.l1_reg(),
            l2: f.l2_reg(),
            l2_shrinkage: f.l2_shrinkage_reg(),
        },
        O::RmsPropOptimizer(r) => OptimizerKind::RmsProp {
            momentum: r.momentum_optimizer_value(),
            decay: r.decay(),
            epsilon: r.epsilon(),
        },
        O::MomentumwOptimizer(m) => OptimizerKind::MomentumW {
            momentum: m.momentum_optimizer_value(),
            weight_decay: m.weight_decay(),
        },
        O::AdamAsyncOptimizer(a) => OptimizerKind::AdamAsync {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::AdamAsyncwOptimizer(_) => {
            return Err(ConfigError::unsupported(
                format!("{path}.{name}"),
                format!("optimizer {name}"),
            ))
        }
    };
    let lr_path = format!("{path}.{name}.learning_rate");
    let lr = schedule(
        lr.and_then(|l| l.learning_rate.as_ref())
            .expect("checked by validate::structure"),
        &lr_path,
    )?;
    Ok(OptimizerSpec {
        kind,
        lr,
        embedding_lr_multiplier: o.embedding_learning_rate_multiplier,
    })
}

/// Every number of a learning-rate schedule must be finite, and every rate
/// non-negative (a negative rate climbs the loss; `nan` or `1e999` makes the
/// first step diverge).
fn check_rate_numbers(lr: &proto::LearningRate, path: &str) -> Result<(), ConfigError> {
    use prost_reflect::Value;
    let msg = super::reflect::dynamic(lr, "protos.LearningRate")?;
    super::reflect::visit(&msg, path, &mut |m, at| {
        for (fd, v) in m.fields() {
            let (x, shown) = match v {
                Value::F32(x) => (*x as f64, x.to_string()),
                Value::F64(x) => (*x, x.to_string()),
                _ => continue,
            };
            let name = fd.name();
            let field = super::reflect::join(at, name);
            if !x.is_finite() {
                return Err(ConfigError::invalid(field, format!("{shown} is not a finite number")));
            }
            if (name.contains("learning_rate") || name.ends_with("_lr")) && x < 0.0 {
                return Err(ConfigError::invalid(
                    field,
                    format!("a learning rate cannot be negative ({shown})"),
                ));
            }
        }
        Ok(())
    })
}

fn schedule(lr: &proto::learning_rate::LearningRate, path: &str) -> Result<LrSchedule, ConfigError> {
    use proto::learning_rate::LearningRate as L;
    check_rate_numbers(
        &proto::LearningRate {
            learning_rate: Some(lr.clone()),
        },
        path,
    )?;
    Ok(match lr {
        L::ConstantLearningRate(c) => LrSchedule::Constant(c.learning_rate()),
        L::ExponentialDecayLearningRate(e) => LrSchedule::ExponentialDecay {
            initial: e.initial_learning_rate(),
            decay_steps: e.decay_steps(),
            factor: e.decay_factor(),
            staircase: e.staircase(),
            burnin_lr: e.burnin_learning_rate(),
            burnin_steps: e.burnin_steps(),
            min_lr: e.min_learning_rate(),
        },
        L::ManualStepLearningRate(m) => {
            let schedule: Vec<(u32, f32)> = m.schedule.iter().map(|s| (s.step(), s.learning_rate())).collect();
            if schedule.windows(2).any(|w| w[1].0 <= w[0].0) || schedule.first().is_some_and(|s| s.0 == 0) {
                return Err(ConfigError::invalid(
                    format!("{path}.manual_step_learning_rate.schedule"),
                    "steps must be positive and strictly increasing",
                ));
            }
            LrSchedule::ManualStep {
                initial: m.initial_learning_rate(),
                schedule,
                warmup: m.warmup(),
            }
        }
        L::CosineDecayLearningRate(c) => {
            if c.total_steps() < c.warmup_steps() + c.hold_base_rate_steps() {
                return Err(ConfigError::invalid(
                    format!("{path}.cosine_decay_learning_rate.total_steps"),
                    "must be at least warmup_steps + hold_base_rate_steps",
                ));
            }
            LrSchedule::CosineDecay {
                base: c.learning_rate_base(),
                total_steps: c.total_steps(),
                warmup_lr: c.warmup_learning_rate(),
                warmup_steps: c.warmup_steps(),
                hold_steps: c.hold_base_rate_steps(),
            }
        }
        L::PolyDecayLearningRate(p) => LrSchedule::PolyDecay {
            base: p.learning_rate_base,
            total_steps: p.total_steps,
            power: p.power,
            end_lr: p.end_learning_rate(),
        },
        L::TransformerLearningRate(t) => LrSchedule::Transformer {
            base: t.learning_rate_base,
            hidden_size: t.hidden_size,
            warmup_steps: t.warmup_steps,
            step_scaling: t.step_scaling_rate(),
        },
    })
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
fn feature(f: &proto::FeatureConfig, path: &str, pooled: bool) -> Result<FeatureSpec, ConfigError> {
    let name = validate::feature_name(f).to_string();
    let need_buckets = || {
        buckets(f).ok_or_else(|| {
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
        FeatureType::SequenceFeature => {
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
            FeatureKind::Sequence {
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
            }
        }
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
                buckets,
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
                buckets,
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
    if f.ev_params.is_some() {
        return Err(ConfigError::unsupported(
            format!("{path}.ev_params"),
            "key-value embedding variables",
        ));
    }
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
    Ok(FeatureSpec {
        name,
        inputs: f.input_names.clone(),
        kind,
        table,
        embedding_dim: f.embedding_dim(),
        mean_combiner: f.combiner() == "mean",
        init: embedding_init(f, path)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_decay_matches_tf() {
        let s = LrSchedule::ExponentialDecay {
            initial: 0.1,
            decay_steps: 10,
            factor: 0.5,
            staircase: true,
            burnin_lr: 0.0,
            burnin_steps: 0,
            min_lr: 0.01,
        };
        assert_eq!(s.at(0), 0.1);
        assert_eq!(s.at(9), 0.1);
        assert!((s.at(10) - 0.05).abs() < 1e-7);
        assert!((s.at(100) - 0.01).abs() < 1e-7, "floored at min_lr");
    }

    #[test]
    fn manual_step_with_and_without_warmup() {
        let s = LrSchedule::ManualStep {
            initial: 0.0,
            schedule: vec![(10, 1.0), (20, 0.5)],
            warmup: false,
        };
        assert_eq!((s.at(0), s.at(9), s.at(10), s.at(25)), (0.0, 0.0, 1.0, 0.5));
        let w = LrSchedule::ManualStep {
            initial: 0.0,
            schedule: vec![(10, 1.0), (20, 0.5)],
            warmup: true,
        };
        assert!((w.at(5) - 0.5).abs() < 1e-7);
        assert_eq!(w.at(10), 1.0);
    }

    #[test]
    fn cosine_poly_and_transformer() {
        let c = LrSchedule::CosineDecay {
            base: 1.0,
            total_steps: 100,
            warmup_lr: 0.0,
            warmup_steps: 10,
            hold_steps: 0,
        };
        assert!((c.at(5) - 0.5).abs() < 1e-6);
        assert!((c.at(10) - 1.0).abs() < 1e-6);
        assert!((c.at(55) - 0.5).abs() < 1e-6);
        assert_eq!(c.at(101), 0.0);
        let p = LrSchedule::PolyDecay {
            base: 1.0,
            total_steps: 10,
            power: 1.0,
            end_lr: 0.0,
        };
        assert!((p.at(5) - 0.5).abs() < 1e-6);
        assert_eq!(p.at(50), 0.0);
        let t = LrSchedule::Transformer {
            base: 1.0,
            hidden_size: 4,
            warmup_steps: 4,
            step_scaling: 1.0,
        };
        // step 3: min(4 * 4^-1.5, 4^-0.5) = 0.5; * 4^-0.5 = 0.25
        assert!((t.at(3) - 0.25).abs() < 1e-6);
    }
}
