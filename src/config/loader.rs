//! Reading a pipeline config file (text proto, or JSON for `.json`), EasyRec's
//! `auto_expand_input_fields`, and printing a config back as text proto.

use std::path::Path;

use prost_reflect::{text_format::FormatOptions, DynamicMessage, ReflectMessage, Value};

use super::{overrides::Overrides, pipeline_descriptor, proto, text_format, validate, ConfigError};

/// A config after overrides and structural validation, in both forms.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// Reflective form, used for printing and further edits.
    pub message: DynamicMessage,
    /// Generated prost struct with the same content.
    pub config: proto::EasyRecConfig,
}

impl LoadedConfig {
    /// The effective config as text proto (what `--print_config` shows and
    /// what train_eval writes to model_dir/pipeline.config).
    pub fn to_text(&self) -> String {
        render_text(&self.message)
    }
}

/// Reads `path`, applies `overrides` in EasyRec's order and validates.
pub fn load_pipeline(path: &Path, overrides: &Overrides) -> Result<LoadedConfig, ConfigError> {
    let mut message = read_pipeline_file(path)?;
    overrides.apply(&mut message)?;
    finish(message)
}

/// Validates a message and converts it to the prost struct.
pub fn finish(message: DynamicMessage) -> Result<LoadedConfig, ConfigError> {
    validate::required_fields(&message)?;
    let config: proto::EasyRecConfig = message
        .transcode_to()
        .map_err(|e| ConfigError::invalid("<root>", format!("internal transcoding error: {e}")))?;
    validate::structure(&config)?;
    Ok(LoadedConfig { message, config })
}

/// Parses a config file without overrides or validation.
pub fn read_pipeline_file(path: &Path) -> Result<DynamicMessage, ConfigError> {
    let text = crate::storage::read_text(path, crate::bounded::CONFIG_BYTES).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // Editors on some systems start UTF-8 files with a byte order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let file = path.display().to_string();
    let mut message = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
        parse_json(&file, text)?
    } else {
        let (message, warnings) =
            text_format::parse_text_warning(&pipeline_descriptor(), text).map_err(|e| ConfigError::Syntax {
                file: file.clone(),
                line: e.line,
                col: e.col,
                message: e.message,
            })?;
        for w in warnings {
            log::warn!("{file}:{}:{}: {}", w.line, w.col, w.message);
        }
        message
    };
    // EasyRec loads an RTP feature-generation file before anything else
    // reads the fields (and before overrides: they may edit its features).
    super::fg::load(&mut message, path)?;
    let auto_expand = auto_expand_input_fields(&message);
    if auto_expand {
        expand_input_fields(&mut message)?;
    }
    expand_feature_names(&mut message)?;
    expand_shared_features(&mut message, auto_expand)?;
    Ok(message)
}

fn parse_json(file: &str, text: &str) -> Result<DynamicMessage, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let msg = DynamicMessage::deserialize(pipeline_descriptor(), &mut de)
        .and_then(|m| de.end().map(|_| m))
        .map_err(|e| ConfigError::Syntax {
            file: file.to_string(),
            line: e.line(),
            col: e.column(),
            message: e.to_string(),
        })?;
    Ok(msg)
}

/// The value of field `name` of `m` when it is set (looking does not set
/// it, as `get_field_mut` alone would for a message field).
fn set_field_mut<'m>(m: &'m mut DynamicMessage, name: &str) -> Option<&'m mut Value> {
    let fd = m.descriptor().get_field_by_name(name).expect("schema field");
    m.has_field(&fd).then(|| m.get_field_mut(&fd))
}

/// With `data_config.auto_expand_input_fields` (the caller checks it), a
/// field named `f[1-3]` stands for f1, f2, f3 (same type and default).
fn expand_input_fields(message: &mut DynamicMessage) -> Result<(), ConfigError> {
    let Some(Value::Message(data)) = set_field_mut(message, "data_config") else {
        return Ok(());
    };
    let Some(Value::List(items)) = set_field_mut(data, "input_fields") else {
        return Ok(());
    };
    expand_list(
        items,
        |i| format!("data_config.input_fields[{i}].input_name"),
        |item| {
            item.as_message()
                .and_then(|f| f.get_field_by_name("input_name"))
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        },
        |item, name| {
            let mut copy = item.clone();
            if let Value::Message(field) = &mut copy {
                field.set_field_by_name("input_name", Value::String(name));
            }
            copy
        },
    )
}

/// Replaces every entry of `items` whose name (`name_of`) is a range like
/// `f[1-3]` by one entry per name (`renamed`), in place; a malformed range
/// is an error at `path(index)`.
fn expand_list(
    items: &mut Vec<Value>,
    path: impl Fn(usize) -> String,
    name_of: impl Fn(&Value) -> String,
    renamed: impl Fn(&Value, String) -> Value,
) -> Result<(), ConfigError> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.drain(..).enumerate() {
        match expand_range(&name_of(&item)) {
            Some(Ok(names)) => out.extend(names.into_iter().map(|n| renamed(&item, n))),
            Some(Err(msg)) => return Err(ConfigError::invalid(path(i), msg)),
            None => out.push(item),
        }
    }
    *items = out;
    Ok(())
}

/// Whether `data_config.auto_expand_input_fields` is on.
fn auto_expand_input_fields(message: &DynamicMessage) -> bool {
    message
        .get_field_by_name("data_config")
        .and_then(|d| d.as_message()?.get_field_by_name("auto_expand_input_fields")?.as_bool())
        .unwrap_or(false)
}

/// EasyRec's `shared_names`: a feature config with `shared_names: "f2"`
/// also stands for a copy of itself reading input `f2` (its own table
/// unless `embedding_name` says otherwise), appended after every feature
/// config as EasyRec appends them; names are ranges like `f[2-3]` with
/// `auto_expand_input_fields`.
fn expand_shared_features(message: &mut DynamicMessage, auto_expand: bool) -> Result<(), ConfigError> {
    if let Some(Value::List(items)) = set_field_mut(message, "feature_configs") {
        expand_shared_list("feature_configs", items, auto_expand)?;
    }
    if let Some(Value::Message(fc)) = set_field_mut(message, "feature_config") {
        if let Some(Value::List(items)) = set_field_mut(fc, "features") {
            expand_shared_list("feature_config.features", items, auto_expand)?;
        }
    }
    Ok(())
}

/// `expand_shared_features` on one list of feature configs at `path`.
fn expand_shared_list(path: &str, items: &mut Vec<Value>, auto_expand: bool) -> Result<(), ConfigError> {
    let mut copies = Vec::new();
    for (i, item) in items.iter_mut().enumerate() {
        let Value::Message(f) = item else { continue };
        let shared: Vec<String> = match f.get_field_by_name("shared_names").as_deref() {
            Some(Value::List(names)) => names.iter().filter_map(|n| n.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        };
        if shared.is_empty() {
            continue;
        }
        f.clear_field_by_name("shared_names");
        for name in shared {
            let names = match auto_expand.then(|| expand_range(&name)).flatten() {
                Some(Ok(names)) => names,
                Some(Err(msg)) => return Err(ConfigError::invalid(format!("{path}[{i}].shared_names"), msg)),
                None => vec![name],
            };
            for n in names {
                let mut copy = f.clone();
                copy.set_field_by_name("input_names", Value::List(vec![Value::String(n)]));
                copies.push(Value::Message(copy));
            }
        }
    }
    items.extend(copies);
    Ok(())
}

/// A feature group's `feature_names` entry `f[1-3]` stands for f1, f2, f3,
/// always (EasyRec's FeatureGroup expands them without a flag).
fn expand_feature_names(message: &mut DynamicMessage) -> Result<(), ConfigError> {
    let Some(Value::Message(model)) = set_field_mut(message, "model_config") else {
        return Ok(());
    };
    let Some(Value::List(groups)) = set_field_mut(model, "feature_groups") else {
        return Ok(());
    };
    for (g, group) in groups.iter_mut().enumerate() {
        let Value::Message(group) = group else { continue };
        let Some(Value::List(names)) = set_field_mut(group, "feature_names") else {
            continue;
        };
        expand_list(
            names,
            |i| format!("model_config.feature_groups[{g}].feature_names[{i}]"),
            |name| name.as_str().unwrap_or_default().to_string(),
            |_, name| Value::String(name),
        )?;
    }
    Ok(())
}

/// `c[1-26]` -> Some(Ok([c1..c26])); names without a range -> None.
fn expand_range(name: &str) -> Option<Result<Vec<String>, String>> {
    let open = name.find('[')?;
    let close = open + name[open..].find(']')?;
    let (lo, hi) = name[open + 1..close].split_once('-')?;
    let (prefix, suffix) = (&name[..open], &name[close + 1..]);
    Some(match (lo.trim().parse::<u64>(), hi.trim().parse::<u64>()) {
        (Ok(a), Ok(b)) if a <= b => Ok((a..=b).map(|k| format!("{prefix}{k}{suffix}")).collect()),
        _ => Err(format!("`{name}`: expected a range like f[1-21] with start <= end")),
    })
}

/// Text proto of `message` with one field per line.
pub fn render_text(message: &DynamicMessage) -> String {
    let mut s = message.to_text_format_with_options(&FormatOptions::new().pretty(true));
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_expand() {
        assert_eq!(expand_range("c[1-3]").unwrap().unwrap(), vec!["c1", "c2", "c3"]);
        assert_eq!(expand_range("x[2-2]_y").unwrap().unwrap(), vec!["x2_y"]);
        assert!(expand_range("plain").is_none());
        assert!(expand_range("c[3-1]").unwrap().is_err());
    }

    #[test]
    fn feature_group_names_expand_without_a_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.config");
        std::fs::write(
            &path,
            r#"model_config { feature_groups { group_name: "all" feature_names: ["field[1-3]", "other"] } }"#,
        )
        .unwrap();
        let msg = read_pipeline_file(&path).unwrap();
        let text = render_text(&msg);
        assert!(
            text.contains(r#"feature_names: ["field1", "field2", "field3", "other"]"#),
            "{text}"
        );
    }

    /// `shared_names` appends a copy per name after every feature config,
    /// ranges expanded only with auto_expand_input_fields.
    #[test]
    fn shared_names_stand_for_copies_of_the_feature() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.config");
        for (flag, want) in [
            ("true", vec!["f1", "g", "f2", "f3"]),
            ("false", vec!["f1", "g", "f[2-3]"]),
        ] {
            std::fs::write(
                &path,
                format!(
                    r#"data_config {{ auto_expand_input_fields: {flag} }}
feature_config {{
  features {{ input_names: "f1" shared_names: "f[2-3]" feature_type: IdFeature embedding_dim: 4 hash_bucket_size: 9 }}
  features {{ input_names: "g" feature_type: RawFeature }} }}"#
                ),
            )
            .unwrap();
            let cfg: proto::EasyRecConfig = read_pipeline_file(&path).unwrap().transcode_to().unwrap();
            let feats = &cfg.feature_config.as_ref().unwrap().features;
            let names: Vec<&str> = feats.iter().map(|f| f.input_names[0].as_str()).collect();
            assert_eq!(names, want, "auto_expand_input_fields: {flag}");
            assert!(feats.iter().all(|f| f.shared_names.is_empty()));
            assert!(feats
                .iter()
                .filter(|f| f.input_names[0] != "g")
                .all(|f| f.hash_bucket_size == Some(9) && f.embedding_dim == Some(4)));
        }
    }
}
