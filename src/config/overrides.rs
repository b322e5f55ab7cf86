//! Command-line changes to a loaded config, applied in EasyRec's order:
//! --model_dir, --train_input_path, --eval_input_path, --fine_tune_checkpoint,
//! then --edit_config_json merged with the extend args (`--train_config.num_steps=10`).

use prost_reflect::{DynamicMessage, Value};

use super::{edit, ConfigError};

/// The six prefixes EasyRec accepts for extend args.
pub const EXTEND_PREFIXES: [&str; 6] = [
    "data_config.",
    "train_config.",
    "feature_config.",
    "model_config.",
    "export_config.",
    "eval_config.",
];

#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub model_dir: Option<String>,
    pub train_input_path: Vec<String>,
    pub eval_input_path: Vec<String>,
    pub fine_tune_checkpoint: Option<String>,
    /// JSON object text from `--edit_config_json`.
    pub edit_config_json: Option<String>,
    /// `(path, value)` pairs from extend args, in command-line order.
    pub extend_args: EditPairs,
}

impl Overrides {
    pub fn apply(&self, msg: &mut DynamicMessage) -> Result<(), ConfigError> {
        if let Some(dir) = &self.model_dir {
            msg.set_field_by_name("model_dir", Value::String(dir.clone()));
        }
        if !self.train_input_path.is_empty() {
            set_input_path(msg, "train", &self.train_input_path.join(","));
        }
        if !self.eval_input_path.is_empty() {
            set_input_path(msg, "eval", &self.eval_input_path.join(","));
        }
        if let Some(ckpt) = &self.fine_tune_checkpoint {
            edit::apply_edits(msg, &[("train_config.fine_tune_checkpoint".into(), ckpt.clone())])?;
        }
        let edits = self.edit_list()?;
        edit::apply_edits(msg, &edits)
    }

    /// `--edit_config_json` entries with the extend args merged in (a repeated
    /// key takes the later value at the earlier key's place, as a Python dict does).
    fn edit_list(&self) -> Result<Vec<(String, String)>, ConfigError> {
        let mut edits: Vec<(String, String)> = Vec::new();
        if let Some(json) = &self.edit_config_json {
            let parsed: serde_json::Value = serde_json::from_str(json).map_err(|e| ConfigError::Edit {
                key: "--edit_config_json".into(),
                message: format!("not valid JSON: {e}"),
            })?;
            let serde_json::Value::Object(map) = parsed else {
                return Err(ConfigError::Edit {
                    key: "--edit_config_json".into(),
                    message: "expected a JSON object of {\"path\": value}".into(),
                });
            };
            for (k, v) in map {
                edits.push((k, edit::python_str(&v)));
            }
        }
        for (k, v) in &self.extend_args {
            match edits.iter_mut().find(|(ek, _)| ek == k) {
                Some(slot) => slot.1 = v.clone(),
                None => edits.push((k.clone(), v.clone())),
            }
        }
        Ok(edits)
    }
}

/// Sets the train or eval path, keeping the Parquet member when the config uses it.
fn set_input_path(msg: &mut DynamicMessage, which: &str, value: &str) {
    let parquet = format!("parquet_{which}_input");
    let field = if msg.has_field_by_name(&parquet) {
        parquet
    } else {
        format!("{which}_input_path")
    };
    msg.set_field_by_name(&field, Value::String(value.to_string()));
}

/// `(path, value)` config edits in command-line order.
pub type EditPairs = Vec<(String, String)>;

/// Splits EasyRec extend args (`--train_config.num_steps=10` or
/// `--train_config.num_steps 10`) out of a command line. Returns the pairs
/// and the remaining arguments.
pub fn split_extend_args(args: &[String]) -> Result<(EditPairs, Vec<String>), ConfigError> {
    let mut pairs = Vec::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let body = arg.strip_prefix("--").unwrap_or("");
        if EXTEND_PREFIXES.iter().any(|p| body.starts_with(p)) {
            let strip = |s: &str| s.trim_matches([' ', '"', '\'']).to_string();
            if let Some((k, v)) = body.split_once('=') {
                pairs.push((k.to_string(), strip(v)));
                i += 1;
            } else if i + 1 < args.len() {
                pairs.push((body.to_string(), strip(&args[i + 1])));
                i += 2;
            } else {
                return Err(ConfigError::Edit {
                    key: body.to_string(),
                    message: "missing value".into(),
                });
            }
            continue;
        }
        let name = body.split('=').next().unwrap_or("");
        if name.contains('.') {
            return Err(ConfigError::Edit {
                key: name.to_string(),
                message: format!(
                    "config paths on the command line must start with one of --{}",
                    EXTEND_PREFIXES.join(", --")
                ),
            });
        }
        rest.push(arg.clone());
        i += 1;
    }
    Ok((pairs, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn both_spellings_of_extend_args() {
        let (pairs, rest) = split_extend_args(&s(&[
            "train_eval",
            "--train_config.num_steps=10",
            "--pipeline_config_path",
            "p.config",
            "--data_config.batch_size",
            "'64'",
        ]))
        .unwrap();
        assert_eq!(
            pairs,
            vec![
                ("train_config.num_steps".into(), "10".into()),
                ("data_config.batch_size".into(), "64".into())
            ]
        );
        assert_eq!(rest, s(&["train_eval", "--pipeline_config_path", "p.config"]));
    }

    #[test]
    fn other_prefixes_are_refused() {
        let err = split_extend_args(&s(&["x", "--foo_config.a=1"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("foo_config.a"), "{err}");
        assert!(err.contains("--train_config."), "{err}");
        let err = split_extend_args(&s(&["x", "--train_config.num_steps"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing value"), "{err}");
    }
}
