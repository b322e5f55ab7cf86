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
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // Editors on some systems start UTF-8 files with a byte order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let file = path.display().to_string();
    let mut message = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
        parse_json(&file, text)?
    } else {
        text_format::parse_text(&pipeline_descriptor(), text).map_err(|e| ConfigError::Syntax {
            file,
            line: e.line,
            col: e.col,
            message: e.message,
        })?
    };
    expand_input_fields(&mut message)?;
    expand_feature_names(&mut message)?;
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

/// With `data_config.auto_expand_input_fields`, a field named `f[1-3]`
/// stands for f1, f2, f3 (same type and default).
fn expand_input_fields(message: &mut DynamicMessage) -> Result<(), ConfigError> {
    let desc = message.descriptor();
    let data_fd = desc.get_field_by_name("data_config").expect("schema field");
    if !message.has_field(&data_fd) {
        return Ok(());
    }
    let Value::Message(data) = message.get_field_mut(&data_fd) else {
        return Ok(());
    };
    let ddesc = data.descriptor();
    let flag = ddesc
        .get_field_by_name("auto_expand_input_fields")
        .expect("schema field");
    if !data.get_field(&flag).as_bool().unwrap_or(false) {
        return Ok(());
    }
    let fields_fd = ddesc.get_field_by_name("input_fields").expect("schema field");
    let Value::List(items) = data.get_field_mut(&fields_fd) else {
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

/// A feature group's `feature_names` entry `f[1-3]` stands for f1, f2, f3,
/// always (EasyRec's FeatureGroup expands them without a flag).
fn expand_feature_names(message: &mut DynamicMessage) -> Result<(), ConfigError> {
    let desc = message.descriptor();
    let model_fd = desc.get_field_by_name("model_config").expect("schema field");
    if !message.has_field(&model_fd) {
        return Ok(());
    }
    let Value::Message(model) = message.get_field_mut(&model_fd) else {
        return Ok(());
    };
    let groups_fd = model
        .descriptor()
        .get_field_by_name("feature_groups")
        .expect("schema field");
    let Value::List(groups) = model.get_field_mut(&groups_fd) else {
        return Ok(());
    };
    for (g, group) in groups.iter_mut().enumerate() {
        let Value::Message(group) = group else { continue };
        let names_fd = group
            .descriptor()
            .get_field_by_name("feature_names")
            .expect("schema field");
        let Value::List(names) = group.get_field_mut(&names_fd) else {
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
}
