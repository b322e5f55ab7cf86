//! `data_config` with the input paths, typed: where examples come from,
//! their columns and labels, how they are read, batched and shuffled, and
//! the negative sampler that joins items to a batch.

use super::{proto, ConfigError};
use proto::dataset_config::{FieldType, InputType};
use proto::easy_rec_config::{EvalPath, TrainPath};

pub use super::kafka_plan::KafkaInput;

/// The data section of a pipeline config.
#[derive(Debug, Clone)]
pub struct DataPlan {
    pub train_paths: Vec<String>,
    pub eval_paths: Vec<String>,
    /// `kafka_train_input`: training reads a topic instead of files.
    pub train_kafka: Option<KafkaInput>,
    /// `kafka_eval_input`: evaluation reads a topic instead of files.
    pub eval_kafka: Option<KafkaInput>,
    /// `data_config.chief_redundant`: under several workers, the chief
    /// reads the same Kafka partitions as the first other worker.
    pub chief_redundant: bool,
    pub format: InputFormat,
    pub batch_size: u32,
    pub num_epochs: u32,
    /// Input columns in file order (CSV) or by name (Parquet).
    pub fields: Vec<InputField>,
    pub label_fields: Vec<String>,
    /// Per label field, its values per row (`data_config.label_dim`, 1
    /// where unset) and the separator its text is split by where over 1
    /// (`label_sep`; empty: into single bytes, as TensorFlow's
    /// `string_split`).
    pub label_shapes: Vec<LabelShape>,
    /// `data_config.sample_weight`: the field that weighs each example's
    /// loss (TensorFlow's losses divide the weighted sum by the count of
    /// non-zero weights; a match model's listwise loss by their sum).
    pub sample_weight: Option<String>,
    pub shuffle: bool,
    pub shuffle_buffer_size: usize,
    pub prefetch_size: usize,
    /// `data_config.negative_sampler`: items appended to every batch as
    /// negatives of a match model's users.
    pub negative_sampling: Option<NegativeSampling>,
}

impl DataPlan {
    /// `data_config` (required) with the config's train and eval input
    /// paths (its `train_path` and `eval_path` oneofs).
    pub fn from_proto(
        data: Option<&proto::DatasetConfig>,
        (train_path, eval_path): (Option<&TrainPath>, Option<&EvalPath>),
    ) -> Result<Self, ConfigError> {
        let mut binary_parts = Vec::new();
        let mut train_kafka = None;
        let mut eval_kafka = None;
        let train_paths = match train_path {
            Some(TrainPath::TrainInputPath(p)) | Some(TrainPath::ParquetTrainInput(p)) => paths(p),
            Some(TrainPath::KafkaTrainInput(k)) => {
                train_kafka = Some(KafkaInput::from_proto(k, "kafka_train_input")?);
                Vec::new()
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
        let eval_paths = match eval_path {
            Some(EvalPath::EvalInputPath(p)) | Some(EvalPath::ParquetEvalInput(p)) => paths(p),
            Some(EvalPath::BinaryEvalInput(b)) => binary_input(b, "binary_eval_input", &mut binary_parts)?,
            Some(EvalPath::KafkaEvalInput(k)) => {
                eval_kafka = Some(KafkaInput::from_proto(k, "kafka_eval_input")?);
                Vec::new()
            }
            None => Vec::new(),
            Some(_) => return Err(ConfigError::unsupported("eval_path", "this eval input source")),
        };
        let data = data.ok_or_else(|| ConfigError::invalid("data_config", "required for training"))?;
        let format = input_format(data, binary_parts)?;
        let reads_kafka = data.input_type() == InputType::KafkaInput;
        if reads_kafka && train_kafka.is_none() {
            return Err(ConfigError::invalid(
                "data_config.input_type",
                "KafkaInput reads kafka_train_input { server topic group }, not input paths",
            ));
        }
        if !reads_kafka && (train_kafka.is_some() || eval_kafka.is_some()) {
            return Err(ConfigError::invalid(
                if train_kafka.is_some() {
                    "kafka_train_input"
                } else {
                    "kafka_eval_input"
                },
                "a topic is read by data_config.input_type: KafkaInput",
            ));
        }
        let negative_sampling = negative_sampling(data)?;
        if data.label_fields.is_empty() {
            return Err(ConfigError::invalid(
                "data_config.label_fields",
                "training needs a label field",
            ));
        }
        let fields = input_fields(data)?;
        let label_shapes = label_shapes(data, &fields)?;
        let sample_weight = data.sample_weight.clone().filter(|w| !w.is_empty());
        if let Some(w) = sample_weight.as_deref() {
            match fields.iter().find(|f| f.name == w) {
                None => {
                    return Err(ConfigError::invalid(
                        "data_config.sample_weight",
                        format!("`{w}` is not among data_config.input_fields"),
                    ))
                }
                Some(f) if f.ty == ColumnType::Str => {
                    return Err(ConfigError::invalid(
                        "data_config.sample_weight",
                        format!("`{w}` is a STRING field; weights are numbers"),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(DataPlan {
            train_paths,
            eval_paths,
            format,
            batch_size: data.batch_size(),
            num_epochs: data.num_epochs(),
            fields,
            label_fields: data.label_fields.clone(),
            label_shapes,
            sample_weight,
            shuffle: data.shuffle(),
            shuffle_buffer_size: data.shuffle_buffer_size().max(1) as usize,
            prefetch_size: data.prefetch_size().max(1) as usize,
            negative_sampling,
            train_kafka,
            eval_kafka,
            chief_redundant: data.chief_redundant(),
        })
    }

    /// Whether there is evaluation input (files or a topic).
    pub fn has_eval(&self) -> bool {
        !self.eval_paths.is_empty() || self.eval_kafka.is_some()
    }

    /// The training input, for messages.
    pub fn train_source(&self) -> String {
        match &self.train_kafka {
            Some(k) => format!("Kafka topic `{}` at {}", k.topic, k.servers.join(",")),
            None => self.train_paths.join(", "),
        }
    }
}

/// A label field's values per row and, over one, what splits its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelShape {
    pub dim: usize,
    pub separator: String,
}

impl LabelShape {
    /// One value per row.
    pub fn scalar() -> Self {
        LabelShape {
            dim: 1,
            separator: String::new(),
        }
    }
}

/// `data_config.label_dim` and `label_sep` per label field. EasyRec splits
/// a STRING label of `label_dim > 1` by its `label_sep` into that many
/// values per row (a multi-class distillation's soft labels); other
/// fields it leaves one value per row, which no `label_dim > 1` can be.
fn label_shapes(data: &proto::DatasetConfig, fields: &[InputField]) -> Result<Vec<LabelShape>, ConfigError> {
    if data.label_dim.len() > data.label_fields.len() {
        return Err(ConfigError::invalid(
            "data_config.label_dim",
            format!(
                "{} entries for {} label_fields",
                data.label_dim.len(),
                data.label_fields.len()
            ),
        ));
    }
    data.label_fields
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let dim = data.label_dim.get(i).copied().unwrap_or(1).max(1) as usize;
            if dim == 1 {
                return Ok(LabelShape::scalar());
            }
            let path = format!("data_config.label_dim[{i}]");
            if dim > MAX_LABEL_DIM {
                return Err(ConfigError::invalid(
                    path,
                    format!("{dim} values per row is over the {MAX_LABEL_DIM} a label may have"),
                ));
            }
            match fields.iter().find(|f| f.name == *name) {
                Some(f) if f.ty != ColumnType::Str => {
                    return Err(ConfigError::invalid(
                        path,
                        format!("{dim} values per row are split from text; `{name}` is not a STRING field"),
                    ))
                }
                _ => {}
            }
            let separator = data.label_sep.get(i).cloned().ok_or_else(|| {
                ConfigError::invalid(
                    format!("data_config.label_sep[{i}]"),
                    format!("`{name}` has {dim} values per row and needs the separator between them"),
                )
            })?;
            Ok(LabelShape { dim, separator })
        })
        .collect()
}

/// The most values per row a label may have (`label_dim`). A row's split
/// is bounded by its text; this bounds what the config asks for (and what
/// the data generator writes per row).
pub const MAX_LABEL_DIM: usize = 1 << 16;

/// `data_config.input_type` and what it reads with: the binary input's
/// parts (`binary_parts`, which only CriteoInput reads), separators,
/// compression.
fn input_format(data: &proto::DatasetConfig, binary_parts: Vec<BinaryPart>) -> Result<InputFormat, ConfigError> {
    Ok(match data.input_type() {
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
        InputType::CriteoInput => InputFormat::CriteoBinary { parts: binary_parts },
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
        // Each message's value is one row of `separator`-joined fields.
        InputType::KafkaInput => InputFormat::Csv {
            separator: data.separator().to_string(),
            with_header: false,
        },
        InputType::RtpInput => InputFormat::Rtp {
            separator: data.separator().to_string(),
            layout: rtp_layout(data)?,
        },
        other => {
            return Err(ConfigError::unsupported(
                "data_config.input_type",
                format!("input type {}", other.as_str_name()),
            ))
        }
    })
}

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

fn paths(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Int,
    Float,
    Str,
    Bool,
}

/// One column of the input, as `data_config.input_fields` declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct InputField {
    pub name: String,
    pub ty: ColumnType,
    pub default_val: String,
}

fn input_fields(data: &proto::DatasetConfig) -> Result<Vec<InputField>, ConfigError> {
    data.input_fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let path = format!("data_config.input_fields[{i}]");
            if f.user_define_fn.as_deref().is_some_and(|s| !s.is_empty()) {
                return Err(ConfigError::unsupported(
                    format!("{path}.user_define_fn"),
                    "Python user-defined input functions",
                ));
            }
            if f.input_dim() != 1 || f.input_shape() != 1 {
                return Err(ConfigError::unsupported(
                    format!("{path}.input_dim"),
                    "multi-dimensional input fields",
                ));
            }
            let ty = match f.input_type() {
                FieldType::Int32 | FieldType::Int64 => ColumnType::Int,
                FieldType::Float | FieldType::Double => ColumnType::Float,
                FieldType::String => ColumnType::Str,
                FieldType::Bool => ColumnType::Bool,
            };
            Ok(InputField {
                name: f.input_name.clone(),
                ty,
                default_val: f.default_val.clone().unwrap_or_default(),
            })
        })
        .collect()
}
