//! Structural checks that hold for any use of a config (train, eval, export,
//! print): required fields, conflicting options, dangling references.
//! Whether this trainer can *run* a config is decided in `typed`.

use std::collections::HashSet;

use prost_reflect::{Cardinality, DynamicMessage, ReflectMessage};

use super::{proto, suggest, ConfigError};
use proto::feature_config::FeatureType;

/// A dropout rate (or any fraction kept below 1) at `path`: in [0, 1).
pub fn rate<T: Into<f64> + std::fmt::Display + Copy>(r: T, path: impl Into<String>) -> Result<(), ConfigError> {
    if (0.0..1.0).contains(&r.into()) {
        Ok(())
    } else {
        Err(ConfigError::invalid(path, format!("{r} is outside [0, 1)")))
    }
}

/// proto2 `required` fields. EasyRec never checks that they are set: an
/// absent one reads as its type's default (the enum's first value, 0, "",
/// an empty message), and so it does here, with a warning naming it. Only
/// the pipeline's own `model_dir` and `model_config` must be present: without
/// them there is nowhere to write and nothing to train.
pub fn required_fields(msg: &DynamicMessage) -> Result<(), ConfigError> {
    super::reflect::visit(msg, "", &mut |m, path| {
        for fd in m.descriptor().fields() {
            if fd.cardinality() != Cardinality::Required
                || fd.field_descriptor_proto().default_value.is_some()
                || m.has_field(&fd)
            {
                continue;
            }
            let at = super::reflect::join(path, fd.name());
            if path.is_empty() {
                return Err(ConfigError::invalid(at, "required field is missing"));
            }
            log::warn!(
                "{at}: required field is missing; EasyRec does not check it and reads its default ({}), \
                 and so does this trainer",
                default_text(&fd)
            );
        }
        Ok(())
    })
}

/// How an absent field's default reads, for the warning.
fn default_text(fd: &prost_reflect::FieldDescriptor) -> String {
    use prost_reflect::Kind;
    match fd.kind() {
        Kind::Enum(e) => e.values().next().map_or_else(|| "0".into(), |v| v.name().to_string()),
        Kind::Message(_) => "an empty message".into(),
        Kind::String => "\"\"".into(),
        Kind::Bool => "false".into(),
        _ => "0".into(),
    }
}

/// The features of a config: `feature_configs` when non-empty, else `feature_config.features`,
/// with the path prefix to name them in errors.
pub fn features(cfg: &proto::EasyRecConfig) -> (&[proto::FeatureConfig], &'static str) {
    if !cfg.feature_configs.is_empty() {
        (&cfg.feature_configs, "feature_configs")
    } else {
        (
            cfg.feature_config.as_ref().map_or(&[][..], |f| &f.features[..]),
            "feature_config.features",
        )
    }
}

/// A feature's name as EasyRec derives it: feature_name, else the first input name.
pub fn feature_name(f: &proto::FeatureConfig) -> &str {
    match &f.feature_name {
        Some(n) if !n.is_empty() => n,
        _ => f.input_names.first().map_or("", String::as_str),
    }
}

/// Model classes with a dedicated parameter block, and that block's field name.
pub const MODEL_BLOCKS: [(&str, &str); 20] = [
    ("WideAndDeep", "wide_and_deep"),
    ("DeepFM", "deepfm"),
    ("MultiTower", "multi_tower"),
    ("FM", "fm"),
    ("DCN", "dcn"),
    ("AutoInt", "autoint"),
    ("DLRM", "dlrm"),
    ("MMoE", "mmoe"),
    ("ESMM", "esmm"),
    ("DBMTL", "dbmtl"),
    ("SimpleMultiTask", "simple_multi_task"),
    ("PLE", "ple"),
    ("DSSM", "dssm"),
    ("MIND", "mind"),
    ("DSSM_SENet", "dssm_senet"),
    ("DropoutNet", "dropoutnet"),
    ("RocketLaunching", "rocket_launching"),
    ("DAT", "dat"),
    ("CMBF", "cmbf"),
    ("Uniter", "uniter"),
];

fn model_block_name(m: &proto::easy_rec_model::Model) -> &'static str {
    use proto::easy_rec_model::Model::*;
    match m {
        ModelParams(_) => "model_params",
        Dummy(_) => "dummy",
        WideAndDeep(_) => "wide_and_deep",
        Deepfm(_) => "deepfm",
        MultiTower(_) => "multi_tower",
        Fm(_) => "fm",
        Dcn(_) => "dcn",
        Autoint(_) => "autoint",
        Dlrm(_) => "dlrm",
        Mmoe(_) => "mmoe",
        Esmm(_) => "esmm",
        Dbmtl(_) => "dbmtl",
        SimpleMultiTask(_) => "simple_multi_task",
        Ple(_) => "ple",
        Dssm(_) => "dssm",
        Mind(_) => "mind",
        DssmSenet(_) => "dssm_senet",
        Dropoutnet(_) => "dropoutnet",
        RocketLaunching(_) => "rocket_launching",
        Dat(_) => "dat",
        Cmbf(_) => "cmbf",
        Uniter(_) => "uniter",
    }
}

pub fn structure(cfg: &proto::EasyRecConfig) -> Result<(), ConfigError> {
    if cfg.model_dir.trim().is_empty() {
        return Err(ConfigError::invalid("model_dir", "must not be empty"));
    }
    if let Some(train) = &cfg.train_config {
        check_train(train, &cfg.model_config)?;
    }
    if let Some(data) = &cfg.data_config {
        check_data(data)?;
    }
    let input_names: Option<HashSet<&str>> = cfg
        .data_config
        .as_ref()
        .filter(|d| !d.input_fields.is_empty())
        .map(|d| d.input_fields.iter().map(|f| f.input_name.as_str()).collect());
    let feature_names = check_features(cfg, input_names.as_ref())?;
    check_model(&cfg.model_config, &feature_names)?;
    super::export_plan::ExportPlan::from_proto(cfg.export_config.as_ref())?;
    Ok(())
}

fn check_train(train: &proto::TrainConfig, model: &proto::EasyRecModel) -> Result<(), ConfigError> {
    if train.save_checkpoints_steps.is_some() && train.save_checkpoints_secs.is_some() {
        return Err(ConfigError::invalid(
            "train_config.save_checkpoints_secs",
            "conflicts with train_config.save_checkpoints_steps; set only one of them",
        ));
    }
    let n = train.optimizer_config.len();
    let class = model.model_class.as_str();
    let (max, rule) = if class == "WideAndDeep" {
        (
            3,
            "WideAndDeep takes 1 (all variables), 2 (wide part, everything else) or 3 (wide, deep embeddings, dense)",
        )
    } else {
        (2, "a model takes 1 (all variables) or 2 (embeddings, everything else)")
    };
    if n > max {
        return Err(ConfigError::invalid(
            "train_config.optimizer_config",
            format!("{n} optimizers given, but {rule}"),
        ));
    }
    for (i, opt) in train.optimizer_config.iter().enumerate() {
        let path = format!("train_config.optimizer_config[{i}]");
        let Some(kind) = &opt.optimizer else {
            return Err(ConfigError::invalid(
                path,
                "no optimizer chosen (e.g. adam_optimizer { ... })",
            ));
        };
        let (name, lr) = optimizer_lr(kind);
        if lr.and_then(|l| l.learning_rate.as_ref()).is_none() {
            return Err(ConfigError::invalid(
                format!("{path}.{name}.learning_rate"),
                "missing; choose a schedule such as constant_learning_rate { learning_rate: 0.001 }",
            ));
        }
    }
    Ok(())
}

/// The oneof member name and learning-rate block of an optimizer.
pub fn optimizer_lr(kind: &proto::optimizer::Optimizer) -> (&'static str, Option<&proto::LearningRate>) {
    use proto::optimizer::Optimizer::*;
    match kind {
        RmsPropOptimizer(o) => ("rms_prop_optimizer", o.learning_rate.as_ref()),
        MomentumOptimizer(o) => ("momentum_optimizer", o.learning_rate.as_ref()),
        AdamOptimizer(o) => ("adam_optimizer", o.learning_rate.as_ref()),
        MomentumwOptimizer(o) => ("momentumw_optimizer", o.learning_rate.as_ref()),
        AdamwOptimizer(o) => ("adamw_optimizer", o.learning_rate.as_ref()),
        AdamAsyncOptimizer(o) => ("adam_async_optimizer", o.learning_rate.as_ref()),
        AdagradOptimizer(o) => ("adagrad_optimizer", o.learning_rate.as_ref()),
        FtrlOptimizer(o) => ("ftrl_optimizer", o.learning_rate.as_ref()),
        AdamAsyncwOptimizer(o) => ("adam_asyncw_optimizer", o.learning_rate.as_ref()),
        LazyAdamOptimizer(o) => ("lazy_adam_optimizer", o.learning_rate.as_ref()),
    }
}

fn check_data(data: &proto::DatasetConfig) -> Result<(), ConfigError> {
    if data.batch_size() == 0 {
        return Err(ConfigError::invalid("data_config.batch_size", "must be at least 1"));
    }
    let mut seen = HashSet::new();
    for (i, f) in data.input_fields.iter().enumerate() {
        if !seen.insert(f.input_name.as_str()) {
            return Err(ConfigError::invalid(
                format!("data_config.input_fields[{i}].input_name"),
                format!("`{}` is defined twice", f.input_name),
            ));
        }
    }
    if !data.input_fields.is_empty() {
        let names: Vec<String> = data.input_fields.iter().map(|f| f.input_name.clone()).collect();
        for (i, l) in data.label_fields.iter().enumerate() {
            if !seen.contains(l.as_str()) {
                return Err(ConfigError::invalid(
                    format!("data_config.label_fields[{i}]"),
                    format!("no input field named `{l}`{}", suggest::did_you_mean(l, &names)),
                ));
            }
        }
    }
    Ok(())
}

fn check_features<'a>(
    cfg: &'a proto::EasyRecConfig,
    input_names: Option<&HashSet<&str>>,
) -> Result<HashSet<&'a str>, ConfigError> {
    let (features, prefix) = features(cfg);
    let all_inputs: Vec<String> = input_names
        .map(|s| s.iter().map(|x| x.to_string()).collect())
        .unwrap_or_default();
    let mut names = HashSet::new();
    for (i, f) in features.iter().enumerate() {
        let name = feature_name(f);
        let path = format!("{prefix}[{i}]");
        if name.is_empty() {
            return Err(ConfigError::invalid(
                path,
                "a feature needs input_names (or feature_name)",
            ));
        }
        if !names.insert(name) {
            return Err(ConfigError::invalid(path, format!("feature `{name}` is defined twice")));
        }
        if let Some(inputs) = input_names {
            for (j, input) in f.input_names.iter().enumerate() {
                if !inputs.contains(input.as_str()) {
                    return Err(ConfigError::invalid(
                        format!("{path}.input_names[{j}]"),
                        format!(
                            "no data_config.input_fields entry named `{input}`{}",
                            suggest::did_you_mean(input, &all_inputs)
                        ),
                    ));
                }
            }
        }
        let ft = f.feature_type();
        if matches!(ft, FeatureType::IdFeature | FeatureType::TagFeature) {
            let set: Vec<&str> = [
                ("hash_bucket_size", f.hash_bucket_size() > 0),
                ("num_buckets", f.num_buckets() > 0),
                ("vocab_list", !f.vocab_list.is_empty()),
                ("vocab_file", f.vocab_file.as_deref().is_some_and(|v| !v.is_empty())),
            ]
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
            if set.len() > 1 {
                return Err(ConfigError::invalid(
                    path,
                    format!(
                        "{} (`{name}`) sets {}; use exactly one of hash_bucket_size, num_buckets, vocab_list, vocab_file",
                        ft.as_str_name(),
                        set.join(" and ")
                    ),
                ));
            }
            if set.is_empty() && ft == FeatureType::IdFeature {
                return Err(ConfigError::invalid(
                    path,
                    format!("IdFeature (`{name}`) needs one of hash_bucket_size, num_buckets, vocab_list, vocab_file"),
                ));
            }
        }
        if !["sum", "mean", "sqrtn"].contains(&f.combiner()) {
            return Err(ConfigError::invalid(
                format!("{path}.combiner"),
                format!("`{}` is not one of sum, mean, sqrtn", f.combiner()),
            ));
        }
        if ft == FeatureType::RawFeature && f.min_val.is_some() && f.max_val.is_some() && f.max_val() <= f.min_val() {
            return Err(ConfigError::invalid(
                format!("{path}.max_val"),
                "must be greater than min_val",
            ));
        }
        if f.boundaries.windows(2).any(|w| w[1] <= w[0]) {
            return Err(ConfigError::invalid(
                format!("{path}.boundaries"),
                "must be strictly increasing",
            ));
        }
    }
    Ok(names)
}

fn check_model(model: &proto::EasyRecModel, feature_names: &HashSet<&str>) -> Result<(), ConfigError> {
    let all: Vec<String> = feature_names.iter().map(|s| s.to_string()).collect();
    for (g, group) in model.feature_groups.iter().enumerate() {
        if group.feature_names.is_empty() && group.sequence_features.is_empty() {
            return Err(ConfigError::invalid(
                format!("model_config.feature_groups[{g}]"),
                format!("feature group `{}` lists no features", group.group_name()),
            ));
        }
        for (j, name) in group.feature_names.iter().enumerate() {
            if !feature_names.contains(name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("model_config.feature_groups[{g}].feature_names[{j}]"),
                    format!("no feature named `{name}`{}", suggest::did_you_mean(name, &all)),
                ));
            }
            if let Some(first) = group.feature_names[..j].iter().position(|n| n == name) {
                return Err(ConfigError::invalid(
                    format!("model_config.feature_groups[{g}].feature_names[{j}]"),
                    format!(
                        "feature `{name}` is already listed in group `{}` (feature_names[{first}])",
                        group.group_name()
                    ),
                ));
            }
        }
    }
    let class = model.model_class.as_str();
    if let Some((_, block)) = MODEL_BLOCKS.iter().find(|(c, _)| *c == class) {
        match &model.model {
            Some(m) if model_block_name(m) == *block => {}
            Some(m) => {
                return Err(ConfigError::invalid(
                    format!("model_config.{}", model_block_name(m)),
                    format!("model_class {class} needs a `{block} {{ ... }}` block, not this one"),
                ))
            }
            None => {
                return Err(ConfigError::invalid(
                    "model_config",
                    format!("model_class {class} needs a `{block} {{ ... }}` block"),
                ))
            }
        }
    }
    if let Some(proto::easy_rec_model::Model::Dlrm(d)) = &model.model {
        let op = d.arch_interaction_op();
        if op != "dot" && op != "cat" {
            return Err(ConfigError::invalid(
                "model_config.dlrm.arch_interaction_op",
                format!("`{op}` is not one of dot, cat"),
            ));
        }
    }
    Ok(())
}
