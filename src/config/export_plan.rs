//! export_config, typed: which exporter runs during train_eval and what it keeps.

use super::{proto, ConfigError};

/// EasyRec's exporter_type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    /// Once, after train_eval finishes (the default).
    Final,
    /// After every evaluation.
    Latest,
    /// After an evaluation that improves `best_metric`; also keeps that checkpoint.
    Best,
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExportPlan {
    pub exporter: Exporter,
    pub best_metric: String,
    pub metric_bigger: bool,
    pub exports_to_keep: usize,
    /// Fixed batch dimension of the graph inputs; `None` = any batch size.
    pub batch_size: Option<usize>,
    pub asset_files: Vec<String>,
    /// `multi_placeholder: false`: serving sends one string per row, the
    /// model's input fields joined by the data separator (EasyRec's single
    /// `features` placeholder), instead of one input per feature.
    pub packed_input: bool,
    /// `filter_inputs` (default true): serving inputs are the input fields
    /// the model reads; false: every input field but the labels.
    pub filter_inputs: bool,
    /// An export option this exporter cannot honour (field, what it asks
    /// for). Configs that set one still load and train with exporter_type
    /// "none"; exporting reports it (see `check`).
    pub unsupported: Option<(&'static str, &'static str)>,
}

impl ExportPlan {
    /// Errors when the config asks for an export this trainer cannot write.
    pub fn check(&self) -> Result<(), ConfigError> {
        match self.unsupported {
            Some((field, what)) => Err(ConfigError::unsupported(
                format!("export_config.{field}"),
                format!("{what} (set export_config.exporter_type: \"none\" to train without exporting)"),
            )),
            None => Ok(()),
        }
    }
}

impl Default for ExportPlan {
    fn default() -> Self {
        ExportPlan {
            exporter: Exporter::Final,
            best_metric: "auc".into(),
            metric_bigger: true,
            exports_to_keep: 1,
            batch_size: None,
            asset_files: Vec::new(),
            packed_input: false,
            filter_inputs: true,
            unsupported: None,
        }
    }
}

pub fn export_plan(cfg: Option<&proto::ExportConfig>) -> Result<ExportPlan, ConfigError> {
    let Some(e) = cfg else {
        return Ok(ExportPlan::default());
    };
    let unsupported = [
        (e.enable_early_stop(), "enable_early_stop", "early stopping"),
        (
            e.multi_value_fields.is_some(),
            "multi_value_fields",
            "multi-value placeholders",
        ),
        (e.auto_multi_value(), "auto_multi_value", "multi-value placeholders"),
        (
            e.placeholder_named_by_input(),
            "placeholder_named_by_input",
            "inputs named by column",
        ),
        (e.export_features(), "export_features", "features as outputs"),
        (e.export_rtp_outputs(), "export_rtp_outputs", "RTP outputs"),
    ];
    let unsupported = unsupported
        .iter()
        .find(|(set, _, _)| *set)
        .map(|(_, field, what)| (*field, *what));
    let exporter = match e.exporter_type() {
        "final" => Exporter::Final,
        "latest" => Exporter::Latest,
        "best" => Exporter::Best,
        "none" => Exporter::None,
        other => {
            return Err(ConfigError::invalid(
                "export_config.exporter_type",
                format!("`{other}` is not one of final, latest, best, none"),
            ))
        }
    };
    if e.exports_to_keep() < 1 {
        return Err(ConfigError::invalid(
            "export_config.exports_to_keep",
            "must be at least 1",
        ));
    }
    Ok(ExportPlan {
        exporter,
        best_metric: e.best_exporter_metric().to_string(),
        metric_bigger: e.metric_bigger(),
        exports_to_keep: e.exports_to_keep() as usize,
        batch_size: usize::try_from(e.batch_size()).ok().filter(|b| *b > 0),
        asset_files: e.asset_files.clone(),
        packed_input: !e.multi_placeholder(),
        filter_inputs: e.filter_inputs(),
        unsupported,
    })
}
