//! `fg_json_path`: EasyRec's RTP feature-generation file (`fg.json`) in
//! place of the config's input fields and features, as EasyRec's
//! `fg_util.load_fg_json_to_config` and `convert_rtp_fg` make them. The rows
//! are what RTP's feature generation wrote (one column of `name\x03value`
//! pairs, read by `RTPInput`); the file says how each generated feature is
//! embedded:
//!
//! - the label fields come first, INT32 with default `0`; then one input
//!   field per feature, named as the feature;
//! - `id_feature` is an IdFeature (a TagFeature when `is_multi`),
//!   `raw_feature` a RawFeature (DOUBLE; bucketized by `boundaries`, or an
//!   id of `bucketize_boundaries` already bucketized), `lookup_feature` and
//!   `match_feature` a TagFeature when `needDiscrete` (the default) and raw
//!   otherwise, `combo_feature` a TagFeature, `overlap_feature` a
//!   TagFeature for the `*_word_divided` methods and an IdFeature otherwise;
//!   the features of a `sequence_name` block are SequenceFeatures named
//!   `<sequence_name>_<feature_name>`; `extra_combo_info` adds a ComboFeature;
//! - buckets: `hash_bucket_size` (with `filter_freq` or `steps_to_live`, a
//!   key-value table), `vocab_file`, `vocab_list` or `num_buckets`;
//!   `embedding_dimension` or `embedding_dim` (the file's `embedding_dim`,
//!   16 by default), `combiner` (`sum` by default), `shared_name`;
//! - every feature's separator is `\x03`.
//!
//! The config's `feature_configs` are replaced; features under its
//! `feature_config` stay, the generated ones appended (EasyRec's way of
//! adding features the file does not define). The path becomes
//! `!<path>`, EasyRec's mark of a config whose file is already loaded (so a
//! saved `pipeline.config` is read as it is). A feature type EasyRec's
//! converter does not know is refused by name (EasyRec's check of it never
//! fires).

use std::path::{Path, PathBuf};

use prost::Message;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};
use serde_json::Value as Json;

use super::proto::dataset_config::{Field, FieldType};
use super::proto::feature_config::FeatureType;
use super::proto::{EvParams, FeatureConfig};
use super::ConfigError;

/// The separator of values within a generated feature (RTP's `\x03`).
const IN_COLUMN: &str = "\u{3}";
/// The table size `filter_freq` / `steps_to_live` set (a key-value table).
const KEY_VALUE_BUCKETS: u64 = i64::MAX as u64;
/// The most hash buckets EasyRec's converter takes without `max_partitions`.
const UNPARTITIONED_BUCKETS: u64 = 10_000_000;

/// Replaces `message`'s input fields and features by those of the file its
/// `fg_json_path` names (looked for as given, then beside the config and
/// in the folders above it: EasyRec's samples name it from the repository
/// root). Nothing when the path is unset or marked loaded (`!`).
pub fn load(message: &mut DynamicMessage, config_path: &Path) -> Result<(), ConfigError> {
    let path = match message.get_field_by_name("fg_json_path").as_deref() {
        Some(Value::String(p)) => p.clone(),
        _ => return Ok(()),
    };
    if path.is_empty() || path.starts_with('!') {
        return Ok(());
    }
    let file = resolve(&path, config_path);
    let text = crate::storage::read_text(&file, crate::bounded::CONFIG_BYTES).map_err(|source| ConfigError::Io {
        path: file.clone(),
        source,
    })?;
    let shown = file.display().to_string();
    let fg: Json = serde_json::from_str(&text).map_err(|e| ConfigError::Syntax {
        file: shown.clone(),
        line: e.line(),
        col: e.column(),
        message: e.to_string(),
    })?;
    let labels: Vec<String> = match message.get_field_by_name("data_config").as_deref() {
        Some(Value::Message(data)) => match data.get_field_by_name("label_fields").as_deref() {
            Some(Value::List(l)) => l.iter().filter_map(|v| v.as_str().map(String::from)).collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    let (fields, features) = convert(&fg, &labels, &shown)?;
    splice(message, fields, features)?;
    message.set_field_by_name("fg_json_path", Value::String(format!("!{path}")));
    log::info!("data_config.input_fields and the features come from fg_json_path {shown}");
    Ok(())
}

/// `path` as given when it is there (or remote), else the first of the
/// config's folder and the folders above it that holds it (for a remote
/// config, the object beside it).
fn resolve(path: &str, config_path: &Path) -> PathBuf {
    let given = PathBuf::from(path);
    if given.is_absolute() || crate::storage::is_remote(&given) || given.exists() {
        return given;
    }
    if crate::storage::is_remote(config_path) {
        // A remote config's file beside it (one lookup, no walk upwards).
        let folder = config_path.to_string_lossy();
        let (folder, _) = folder.rsplit_once('/').unwrap_or((&folder, ""));
        let beside = crate::storage::join(Path::new(folder), path);
        let found = crate::storage::object(&beside).and_then(|o| o.size());
        return if matches!(found, Ok(Some(_))) { beside } else { given };
    }
    let mut dir = config_path.parent();
    while let Some(d) = dir {
        let candidate = d.join(&given);
        if candidate.exists() {
            return candidate;
        }
        dir = d.parent();
    }
    given
}

/// The input fields and feature configs of feature-generation file `fg`.
fn convert(fg: &Json, labels: &[String], file: &str) -> Result<(Vec<Field>, Vec<FeatureConfig>), ConfigError> {
    let at = |what: &str| format!("fg_json_path {file}: {what}");
    let embedding_dim = match fg.get("embedding_dim") {
        Some(v) => whole(v).ok_or_else(|| ConfigError::invalid(at("embedding_dim"), "is not a whole number"))?,
        None => 16,
    };
    let mut out = Converted {
        fields: labels
            .iter()
            .map(|l| Field {
                input_name: l.clone(),
                input_type: FieldType::Int32 as i32,
                default_val: Some("0".into()),
                ..Default::default()
            })
            .collect(),
        features: Vec::new(),
        embedding_dim,
    };
    let features = fg
        .get("features")
        .and_then(Json::as_array)
        .ok_or_else(|| ConfigError::invalid(at("features"), "is not a list of features"))?;
    for (i, f) in features.iter().enumerate() {
        let here = at(&format!("features[{i}]"));
        if f.get("feature_name").is_some() {
            let name = text(f, "feature_name", &here)?;
            let kind = text(f, "feature_type", &here)?;
            out.feature(&kind, &name, f, false, &here)?;
        } else if f.get("sequence_name").is_some() {
            let sequence = text(f, "sequence_name", &here)?;
            let subs = f
                .get("features")
                .and_then(Json::as_array)
                .ok_or_else(|| ConfigError::invalid(format!("{here}.features"), "is not a list of features"))?;
            for (j, s) in subs.iter().enumerate() {
                let here = format!("{here}.features[{j}]");
                let name = text(s, "feature_name", &here)?;
                let kind = text(s, "feature_type", &here)?;
                out.feature(&kind, &format!("{sequence}_{name}"), s, true, &here)?;
            }
        } else {
            return Err(ConfigError::invalid(here, "has neither feature_name nor sequence_name"));
        }
    }
    Ok((out.fields, out.features))
}

/// What the conversion has made so far.
struct Converted {
    fields: Vec<Field>,
    features: Vec<FeatureConfig>,
    embedding_dim: u64,
}

impl Converted {
    /// One feature of the file (EasyRec's `process_features`).
    fn feature(&mut self, kind: &str, name: &str, f: &Json, sequence: bool, at: &str) -> Result<(), ConfigError> {
        let mut fc = FeatureConfig {
            input_names: vec![name.to_string()],
            separator: Some(IN_COLUMN.into()),
            ..Default::default()
        };
        let mut field = Field {
            input_name: name.to_string(),
            input_type: FieldType::String as i32,
            ..Default::default()
        };
        let dim = match f.get("embedding_dimension").or_else(|| f.get("embedding_dim")) {
            Some(v) => {
                whole(v).ok_or_else(|| ConfigError::invalid(format!("{at}.embedding_dim"), "is not a whole number"))?
            }
            None => self.embedding_dim,
        };
        let dim =
            u32::try_from(dim).map_err(|_| ConfigError::invalid(format!("{at}.embedding_dim"), "is too large"))?;
        let combiner = match f.get("combiner") {
            Some(c) => c
                .as_str()
                .ok_or_else(|| ConfigError::invalid(format!("{at}.combiner"), "is not a string"))?
                .to_string(),
            None => "sum".into(),
        };
        if f.get("is_cache").and_then(Json::as_bool) == Some(true) {
            log::warn!("{at}.is_cache: a DeepRec embedding cache, which does not change what is trained; ignored");
        }
        let is_multi = f.get("is_multi").and_then(Json::as_bool).unwrap_or(false);
        let discrete = f.get("needDiscrete").and_then(Json::as_bool).unwrap_or(true);
        let weighted = f.get("needWeighting").and_then(Json::as_bool).unwrap_or(false);
        let set_type = |fc: &mut FeatureConfig, t: FeatureType| fc.feature_type = t as i32;
        if sequence {
            set_type(&mut fc, FeatureType::SequenceFeature);
            fc.embedding_dim = Some(dim);
            if kind == "raw_feature" {
                fc.sub_feature_type = Some(FeatureType::RawFeature as i32);
                field.default_val = Some(f.get("default_value").map_or("0.0".into(), python_str));
                if f.get("boundaries").is_some() {
                    fc.boundaries = numbers(f, "boundaries", at)?;
                }
                let value_dim = value_dimension(f, at)?;
                if value_dim > 1 {
                    fc.raw_input_dim = Some(value_dim);
                }
            } else {
                fc.sub_feature_type = Some(FeatureType::IdFeature as i32);
                buckets(f, &mut fc, Some(&mut field), at)?;
                fc.combiner = Some(combiner);
            }
        } else {
            match kind {
                "id_feature" => {
                    if is_multi {
                        set_type(&mut fc, FeatureType::TagFeature);
                        if let Some(kv) = f.get("kv_separator").and_then(Json::as_str).filter(|s| !s.is_empty()) {
                            fc.kv_separator = Some(kv.into());
                        }
                    } else {
                        set_type(&mut fc, FeatureType::IdFeature);
                    }
                    fc.embedding_dim = Some(dim);
                    buckets(f, &mut fc, Some(&mut field), at)?;
                    fc.combiner = Some(combiner);
                }
                "lookup_feature" | "match_feature" => {
                    let multi = is_multi || f.get("matchType").and_then(Json::as_str) == Some("multihit");
                    if discrete {
                        set_type(&mut fc, FeatureType::TagFeature);
                        if weighted {
                            // EasyRec gives them an empty kv_separator, which
                            // its tag reader splits into single characters.
                            return Err(ConfigError::unsupported(
                                format!("{at}.needWeighting"),
                                "weighted lookup and match features (EasyRec's converter gives them an empty \
                                 kv_separator, which splits each value into characters)",
                            ));
                        }
                        fc.embedding_dim = Some(dim);
                        buckets(f, &mut fc, Some(&mut field), at)?;
                        fc.combiner = Some(combiner);
                    } else {
                        if kind == "match_feature" && f.get("bucketize_boundaries").is_some() {
                            return Err(ConfigError::invalid(
                                format!("{at}.bucketize_boundaries"),
                                "a match_feature without needDiscrete cannot be bucketized (EasyRec asserts so)",
                            ));
                        }
                        raw(f, &mut fc, &mut field, multi, dim, at)?;
                    }
                }
                "raw_feature" => raw(f, &mut fc, &mut field, is_multi, dim, at)?,
                "combo_feature" => {
                    set_type(&mut fc, FeatureType::TagFeature);
                    buckets(f, &mut fc, Some(&mut field), at)?;
                    fc.embedding_dim = Some(dim);
                    fc.combiner = Some(combiner);
                }
                "overlap_feature" => {
                    let method = text(f, "method", at)?;
                    let t = if ["common_word_divided", "diff_word_divided"].contains(&method.as_str()) {
                        FeatureType::TagFeature
                    } else {
                        FeatureType::IdFeature
                    };
                    set_type(&mut fc, t);
                    buckets(f, &mut fc, Some(&mut field), at)?;
                    fc.embedding_dim = Some(dim);
                    fc.combiner = Some(combiner);
                }
                other => {
                    return Err(ConfigError::unsupported(
                        format!("{at}.feature_type"),
                        format!(
                            "RTP feature type `{other}` (EasyRec's converter knows id_feature, raw_feature, \
                             lookup_feature, match_feature, combo_feature, overlap_feature and sequence blocks)"
                        ),
                    ))
                }
            }
        }
        if let Some(shared) = f.get("shared_name") {
            let shared = shared
                .as_str()
                .ok_or_else(|| ConfigError::invalid(format!("{at}.shared_name"), "is not a string"))?;
            fc.embedding_name = Some(shared.into());
        }
        self.features.push(fc);
        self.fields.push(field);
        if let Some(extra) = f.get("extra_combo_info") {
            self.combo(name, extra, &format!("{at}.extra_combo_info"))?;
        }
        Ok(())
    }

    /// `extra_combo_info`: a ComboFeature of the feature and the features
    /// it names.
    fn combo(&mut self, name: &str, extra: &Json, at: &str) -> Result<(), ConfigError> {
        let others: Vec<String> = match extra.get("feature_names") {
            Some(Json::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    ConfigError::invalid(format!("{at}.feature_names"), "holds a name that is not a string")
                })?,
            _ => Vec::new(),
        };
        if others.is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.feature_names"),
                "a ComboFeature needs at least one other feature",
            ));
        }
        if extra.get("hash_bucket_size").is_none() {
            return Err(ConfigError::invalid(
                format!("{at}.hash_bucket_size"),
                "must be set in a ComboFeature",
            ));
        }
        let mut input_names = vec![name.to_string()];
        input_names.extend(others);
        let default_name = format!("combo__{}", input_names.join("_"));
        let feature_name = match extra.get("final_feature_name") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| ConfigError::invalid(format!("{at}.final_feature_name"), "is not a string"))?
                .to_string(),
            None => default_name,
        };
        let dim = match extra.get("embedding_dimension").or_else(|| extra.get("embedding_dim")) {
            Some(v) => {
                whole(v).ok_or_else(|| ConfigError::invalid(format!("{at}.embedding_dim"), "is not a whole number"))?
            }
            None => self.embedding_dim,
        };
        let mut fc = FeatureConfig {
            feature_name: Some(feature_name),
            input_names,
            feature_type: FeatureType::ComboFeature as i32,
            embedding_dim: Some(
                u32::try_from(dim).map_err(|_| ConfigError::invalid(format!("{at}.embedding_dim"), "is too large"))?,
            ),
            combiner: Some(
                extra
                    .get("combiner")
                    .and_then(Json::as_str)
                    .unwrap_or("mean")
                    .to_string(),
            ),
            ..Default::default()
        };
        buckets(extra, &mut fc, None, at)?;
        self.features.push(fc);
        Ok(())
    }
}

/// EasyRec's `_gen_raw_config`: a raw value, or an id of
/// `bucketize_boundaries` (already bucketized by RTP).
fn raw(
    f: &Json,
    fc: &mut FeatureConfig,
    field: &mut Field,
    multi: bool,
    dim: u32,
    at: &str,
) -> Result<(), ConfigError> {
    if let Some(b) = f.get("bucketize_boundaries") {
        let b = b
            .as_str()
            .ok_or_else(|| ConfigError::invalid(format!("{at}.bucketize_boundaries"), "is not a string"))?;
        if multi {
            field.input_type = FieldType::String as i32;
            fc.feature_type = FeatureType::TagFeature as i32;
        } else {
            field.input_type = FieldType::Int32 as i32;
            fc.feature_type = FeatureType::IdFeature as i32;
        }
        fc.num_buckets = Some(b.split(',').count() as u64 + 1);
        fc.embedding_dim = Some(dim);
    } else {
        fc.feature_type = FeatureType::RawFeature as i32;
        field.default_val = Some(f.get("default_value").map_or("0.0".into(), python_str));
        let value_dim = value_dimension(f, at)?;
        if value_dim > 1 {
            fc.raw_input_dim = Some(value_dim);
            field.input_type = FieldType::String as i32;
        } else {
            field.input_type = FieldType::Double as i32;
        }
        if f.get("boundaries").is_some() {
            fc.boundaries = numbers(f, "boundaries", at)?;
            fc.embedding_dim = Some(dim);
        }
    }
    if let Some(n) = f.get("normalizer_fn") {
        let n = n
            .as_str()
            .ok_or_else(|| ConfigError::invalid(format!("{at}.normalizer_fn"), "is not a string"))?;
        fc.normalizer_fn = Some(n.into());
    }
    Ok(())
}

/// EasyRec's `_set_hash_bucket`: the first of hash_bucket_size, vocab_file,
/// vocab_list and num_buckets the feature sets.
fn buckets(f: &Json, fc: &mut FeatureConfig, field: Option<&mut Field>, at: &str) -> Result<(), ConfigError> {
    let partitions = match f.get("max_partitions") {
        Some(v) => {
            let n = whole(v)
                .ok_or_else(|| ConfigError::invalid(format!("{at}.max_partitions"), "is not a whole number"))?;
            fc.max_partitions = Some(i32::try_from(n).unwrap_or(i32::MAX));
            true
        }
        None => false,
    };
    if let Some(v) = f.get("hash_bucket_size") {
        let n =
            whole(v).ok_or_else(|| ConfigError::invalid(format!("{at}.hash_bucket_size"), "is not a whole number"))?;
        if n > UNPARTITIONED_BUCKETS && !partitions {
            return Err(ConfigError::invalid(
                format!("{at}.hash_bucket_size"),
                format!("{n} buckets: EasyRec asks for max_partitions > 1 beside more than {UNPARTITIONED_BUCKETS}"),
            ));
        }
        fc.hash_bucket_size = Some(n);
        let mut ev = EvParams::default();
        for (key, slot) in [
            ("filter_freq", &mut ev.filter_freq),
            ("steps_to_live", &mut ev.steps_to_live),
        ] {
            if let Some(v) = f.get(key).and_then(Json::as_i64).filter(|&v| v >= 0) {
                *slot = Some(v as u64);
            }
        }
        if ev.filter_freq.is_some() || ev.steps_to_live.is_some() {
            fc.hash_bucket_size = Some(KEY_VALUE_BUCKETS);
            fc.ev_params = Some(ev);
        }
    } else if let Some(v) = f.get("vocab_file") {
        let v = v
            .as_str()
            .ok_or_else(|| ConfigError::invalid(format!("{at}.vocab_file"), "is not a string"))?;
        fc.vocab_file = Some(v.into());
    } else if let Some(v) = f.get("vocab_list") {
        let list = match v {
            Json::Array(a) => a.iter().map(python_str).collect(),
            Json::String(s) => vec![s.clone()],
            _ => return Err(ConfigError::invalid(format!("{at}.vocab_list"), "is not a list")),
        };
        fc.vocab_list = list;
    } else if let Some(v) = f.get("num_buckets") {
        let n = whole(v).ok_or_else(|| ConfigError::invalid(format!("{at}.num_buckets"), "is not a whole number"))?;
        fc.num_buckets = Some(n);
        if let Some(field) = field {
            field.default_val = Some(f.get("default_value").map_or("0".into(), python_str));
        }
    } else {
        return Err(ConfigError::invalid(
            at,
            "one of hash_bucket_size, vocab_file, vocab_list and num_buckets must be set",
        ));
    }
    Ok(())
}

fn text(f: &Json, key: &str, at: &str) -> Result<String, ConfigError> {
    f.get(key)
        .and_then(Json::as_str)
        .map(String::from)
        .ok_or_else(|| ConfigError::invalid(format!("{at}.{key}"), "is missing or not a string"))
}

/// A whole number, written as a number or as text.
fn whole(v: &Json) -> Option<u64> {
    match v {
        Json::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|x| x.fract() == 0.0 && *x >= 0.0).map(|x| x as u64)),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn numbers(f: &Json, key: &str, at: &str) -> Result<Vec<f64>, ConfigError> {
    let bad = || ConfigError::invalid(format!("{at}.{key}"), "is not a list of numbers");
    match f.get(key) {
        Some(Json::Array(a)) => a
            .iter()
            .map(|v| v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(bad),
        Some(Json::String(s)) => s
            .split(',')
            .map(|x| x.trim().parse().ok())
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn value_dimension(f: &Json, at: &str) -> Result<u32, ConfigError> {
    match f.get("value_dimension") {
        None => Ok(1),
        Some(v) => whole(v)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| ConfigError::invalid(format!("{at}.value_dimension"), "is not a whole number")),
    }
}

/// A JSON value as Python's `str` writes it (EasyRec stores defaults so).
fn python_str(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Bool(b) => if *b { "True" } else { "False" }.into(),
        other => other.to_string(),
    }
}

/// Puts the converted fields and features into `message`.
fn splice(message: &mut DynamicMessage, fields: Vec<Field>, features: Vec<FeatureConfig>) -> Result<(), ConfigError> {
    let desc = message.descriptor();
    let kind = |name: &str| {
        desc.get_field_by_name(name)
            .and_then(|f| f.kind().as_message().cloned())
            .expect("schema field")
    };
    let data_desc = kind("data_config");
    let field_desc = data_desc
        .get_field_by_name("input_fields")
        .and_then(|f| f.kind().as_message().cloned())
        .expect("schema field");
    let feature_desc = kind("feature_configs");
    let dynamic = |desc: &prost_reflect::MessageDescriptor, bytes: Vec<u8>| {
        DynamicMessage::decode(desc.clone(), bytes.as_slice())
            .map(Value::Message)
            .map_err(|e| ConfigError::invalid("fg_json_path", format!("internal transcoding error: {e}")))
    };
    let fields: Vec<Value> = fields
        .into_iter()
        .map(|f| dynamic(&field_desc, f.encode_to_vec()))
        .collect::<Result<_, _>>()?;
    let features: Vec<Value> = features
        .into_iter()
        .map(|f| dynamic(&feature_desc, f.encode_to_vec()))
        .collect::<Result<_, _>>()?;
    let mut data = match message.get_field_by_name("data_config").as_deref() {
        Some(Value::Message(m)) => m.clone(),
        _ => DynamicMessage::new(data_desc),
    };
    data.set_field_by_name("input_fields", Value::List(fields));
    message.set_field_by_name("data_config", Value::Message(data));
    message.clear_field_by_name("feature_configs");
    let mut holder = match message.get_field_by_name("feature_config").as_deref() {
        Some(Value::Message(m)) => m.clone(),
        _ => DynamicMessage::new(kind("feature_config")),
    };
    let mut all = match holder.get_field_by_name("features").as_deref() {
        Some(Value::List(l)) => l.clone(),
        _ => Vec::new(),
    };
    all.extend(features);
    holder.set_field_by_name("features", Value::List(all));
    message.set_field_by_name("feature_config", Value::Message(holder));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/rtp_fg")
            .join(name)
    }

    /// Every feature type and option of the converter, against what
    /// EasyRec 0.7.1's own converter made of the same file
    /// (tests/data/rtp_fg/make_expected.py).
    #[test]
    fn every_feature_type_converts_as_easyrecs_converter_does() {
        let fg: Json = serde_json::from_str(&std::fs::read_to_string(fixture("all_types.json")).unwrap()).unwrap();
        let (fields, features) = convert(&fg, &["clk".to_string()], "all_types.json").unwrap();
        let text = std::fs::read_to_string(fixture("expected.config")).unwrap();
        let want: super::super::proto::EasyRecConfig =
            super::super::text_format::parse_text(&super::super::pipeline_descriptor(), &text)
                .unwrap()
                .transcode_to()
                .unwrap();
        let want_fields = &want.data_config.as_ref().unwrap().input_fields;
        let want_features = &want.feature_config.as_ref().unwrap().features;
        assert_eq!(fields.len(), want_fields.len());
        for (got, want) in fields.iter().zip(want_fields) {
            assert_eq!(got, want);
        }
        assert_eq!(features.len(), want_features.len());
        for (got, want) in features.iter().zip(want_features) {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn what_easyrecs_converter_cannot_make_is_refused_by_name() {
        let refused = |feature: &str| {
            let fg: Json = serde_json::from_str(&format!("{{\"features\": [{feature}]}}")).unwrap();
            convert(&fg, &[], "fg.json").unwrap_err().to_string()
        };
        let e = refused(r#"{"feature_name": "x", "feature_type": "expr_feature", "expression": "a+b"}"#);
        assert!(
            e.contains("features[0].feature_type") && e.contains("`expr_feature`") && e.contains("not supported"),
            "{e}"
        );
        let e = refused(
            r#"{"feature_name": "x", "feature_type": "lookup_feature", "needWeighting": true, "hash_bucket_size": 5}"#,
        );
        assert!(e.contains("needWeighting") && e.contains("not supported"), "{e}");
        let e = refused(r#"{"feature_name": "x", "feature_type": "id_feature"}"#);
        assert!(e.contains("one of hash_bucket_size"), "{e}");
        let e = refused(r#"{"feature_name": "x", "feature_type": "id_feature", "hash_bucket_size": 20000000}"#);
        assert!(e.contains("max_partitions"), "{e}");
        let e = refused(r#"{"expression": "a"}"#);
        assert!(e.contains("neither feature_name nor sequence_name"), "{e}");
        // EasyRec's converter fails on a vocab_list (it assigns a repeated
        // field); this one keeps it.
        let fg: Json = serde_json::from_str(
            r#"{"features": [{"feature_name": "c", "feature_type": "id_feature", "vocab_list": ["a", "b"]}]}"#,
        )
        .unwrap();
        let (_, features) = convert(&fg, &[], "fg.json").unwrap();
        assert_eq!(features[0].vocab_list, ["a", "b"]);
    }

    /// A config's fg_json_path, named from the repository root as EasyRec's
    /// samples name it, is found above the config; its fields replace the
    /// config's, features under `feature_config` stay, the path is marked
    /// loaded, and a marked path is left alone.
    #[test]
    fn a_config_takes_its_fields_and_features_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("samples/configs");
        std::fs::create_dir_all(dir.path().join("samples/fg_only_here")).unwrap();
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::copy(
            fixture("all_types.json"),
            dir.path().join("samples/fg_only_here/fg.json"),
        )
        .unwrap();
        let text = r#"
fg_json_path: "samples/fg_only_here/fg.json"
data_config { input_type: RTPInput label_fields: "clk" input_fields { input_name: "gone" } }
feature_configs { input_names: "gone" feature_type: IdFeature hash_bucket_size: 5 }
feature_config { features { input_names: "user_id" feature_name: "kept" hash_bucket_size: 7 embedding_dim: 4 } }
"#;
        let mut message = super::super::text_format::parse_text(&super::super::pipeline_descriptor(), text).unwrap();
        load(&mut message, &nested.join("pipeline.config")).unwrap();
        let cfg: super::super::proto::EasyRecConfig = message.transcode_to().unwrap();
        assert_eq!(cfg.fg_json_path.as_deref(), Some("!samples/fg_only_here/fg.json"));
        let fields: Vec<&str> = cfg
            .data_config
            .as_ref()
            .unwrap()
            .input_fields
            .iter()
            .map(|f| f.input_name.as_str())
            .collect();
        assert_eq!(fields[..3], ["clk", "user_id", "tags"]);
        assert!(!fields.contains(&"gone"));
        assert!(cfg.feature_configs.is_empty());
        let features = &cfg.feature_config.as_ref().unwrap().features;
        assert_eq!(features[0].feature_name.as_deref(), Some("kept"));
        assert_eq!(features.len(), 1 + 24);
        // Loaded already: nothing changes.
        let before = message.clone();
        load(&mut message, &nested.join("pipeline.config")).unwrap();
        assert_eq!(message, before);
        // A file that is not there is named.
        let mut missing = super::super::text_format::parse_text(
            &super::super::pipeline_descriptor(),
            "fg_json_path: \"nowhere/fg.json\"",
        )
        .unwrap();
        let e = load(&mut missing, &nested.join("pipeline.config"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nowhere/fg.json"), "{e}");
    }
}
