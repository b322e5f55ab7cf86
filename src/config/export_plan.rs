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
    /// `enable_early_stop`: when training stops after an evaluation.
    pub early_stop: Option<EarlyStop>,
    /// Inputs a served request may give as a list of values per row
    /// (`multi_value_fields`, or with `auto_multi_value` every input of a
    /// tag, sequence or multi-dimensional raw feature, as EasyRec picks
    /// them); `TrainingPlan` resolves the auto set.
    pub multi_value: MultiValue,
    /// An export option this exporter cannot honour (field, what it asks
    /// for). Configs that set one still load and train with exporter_type
    /// "none"; exporting reports it (see `check`).
    pub unsupported: Option<(&'static str, &'static str)>,
    /// The suffixes of a multi-task model's tasks (`_ctr`), which
    /// `TrainingPlan` sets: a `best_metric` that every task reports under
    /// its own suffix only (`gauc` as `gauc_ctr`, `gauc_cvr`) compares the
    /// mean of the tasks' values.
    pub task_suffixes: Vec<String>,
}

/// When an evaluation stops training.
#[derive(Debug, Clone, PartialEq)]
pub enum EarlyStop {
    /// It comes this many steps (`max_check_steps`) or more after the best
    /// `best_metric` (EasyRec's default).
    NoImprovement { max_steps: u64 },
    /// `metric` exceeds `threshold`: the function EasyRec ships as
    /// `easy_rec.python.test.custom_early_stop_func.custom_early_stop_func`,
    /// its `early_stop_params` `{"metric_name": ..., "thre": ...}`.
    AboveThreshold { metric: String, threshold: f64 },
}

/// The one `early_stop_func` EasyRec itself ships.
pub const THRESHOLD_STOP_FUNC: &str = "easy_rec.python.test.custom_early_stop_func.custom_early_stop_func";

/// Which inputs take a list of values per row when served.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MultiValue {
    #[default]
    None,
    Fields(Vec<String>),
    /// `auto_multi_value`.
    Auto,
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
            early_stop: None,
            multi_value: MultiValue::None,
            unsupported: None,
            task_suffixes: Vec::new(),
        }
    }
}

impl ExportPlan {
    /// `best_metric`'s value among an evaluation's `metrics`.
    pub fn best_value(&self, metrics: &[(String, f64)]) -> anyhow::Result<f64> {
        let find = |name: &str| metrics.iter().find(|(k, _)| k == name).map(|&(_, v)| v);
        let per_task: Option<Vec<f64>> = (!self.task_suffixes.is_empty())
            .then(|| {
                self.task_suffixes
                    .iter()
                    .map(|s| find(&format!("{}{s}", self.best_metric)))
                    .collect()
            })
            .flatten();
        match (find(&self.best_metric), per_task) {
            (Some(value), _) => Ok(value),
            (None, Some(values)) => {
                // EasyRec compares a name its multi-task models never report
                // (and fails at the second evaluation); the tasks' mean is
                // what the name stands for.
                let mean = values.iter().sum::<f64>() / values.len() as f64;
                log::info!(
                    "export_config.best_exporter_metric `{}` is reported per task: comparing the tasks' mean {mean}",
                    self.best_metric
                );
                Ok(mean)
            }
            (None, None) => {
                let have: Vec<&str> = metrics.iter().map(|(k, _)| k.as_str()).collect();
                anyhow::bail!(
                    "export_config.best_exporter_metric `{}` is not among the evaluated metrics ({})",
                    self.best_metric,
                    have.join(", ")
                )
            }
        }
    }

    /// Whether `value` of `best_metric` improves on `best` (bigger or
    /// smaller by `metric_bigger`); anything improves on none.
    pub fn improves(&self, value: f64, best: Option<f64>) -> bool {
        best.is_none_or(|b| if self.metric_bigger { value > b } else { value < b })
    }

    /// Early stopping (EasyRec's `stop_if_no_increase_hook` /
    /// `stop_if_no_decrease_hook`): records an evaluation of `metrics` at
    /// `step` into `best` (the best value and its step so far) and says
    /// whether training stops, this evaluation coming `early_stop` or more
    /// steps after the best one (TensorFlow's
    /// `_stop_if_no_metric_improvement_fn`, over this run's evaluations).
    ///
    /// With `EarlyStop::AboveThreshold` it stops once the metric exceeds
    /// the threshold, and `best` is left alone.
    pub fn stops_early(
        &self,
        best: &mut Option<(f64, u64)>,
        step: u64,
        metrics: &[(String, f64)],
    ) -> anyhow::Result<bool> {
        let max_steps = match &self.early_stop {
            None => return Ok(false),
            Some(EarlyStop::AboveThreshold { metric, threshold }) => {
                return match metrics.iter().find(|(k, _)| k == metric) {
                    Some((_, v)) => Ok(*v > *threshold),
                    None => anyhow::bail!(
                        "export_config.early_stop_params: metric `{metric}` is not among the evaluated metrics ({})",
                        metrics.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                };
            }
            Some(EarlyStop::NoImprovement { max_steps }) => *max_steps,
        };
        let value = self.best_value(metrics)?;
        if self.improves(value, best.map(|(b, _)| b)) {
            *best = Some((value, step));
        }
        let (_, best_step) = best.expect("set above");
        Ok(step - best_step >= max_steps)
    }
}

fn early_stop(e: &proto::ExportConfig) -> Result<Option<EarlyStop>, ConfigError> {
    if !e.enable_early_stop() {
        return Ok(None);
    }
    match e.early_stop_func.as_deref().filter(|f| !f.is_empty()) {
        None => {}
        Some(THRESHOLD_STOP_FUNC) => return threshold_stop(e.early_stop_params()).map(Some),
        Some(other) => {
            return Err(ConfigError::unsupported(
                "export_config.early_stop_func",
                format!("the Python early-stopping function `{other}` (supported: {THRESHOLD_STOP_FUNC})"),
            ))
        }
    }
    let max_steps = u64::try_from(e.max_check_steps()).map_err(|_| {
        ConfigError::invalid(
            "export_config.max_check_steps",
            format!("{} is negative", e.max_check_steps()),
        )
    })?;
    Ok(Some(EarlyStop::NoImprovement { max_steps }))
}

/// `early_stop_params` of EasyRec's threshold function, a JSON object
/// with `metric_name` (a string) and `thre` (a number).
fn threshold_stop(params: &str) -> Result<EarlyStop, ConfigError> {
    let field = "export_config.early_stop_params";
    let v: serde_json::Value = serde_json::from_str(params)
        .map_err(|e| ConfigError::invalid(field, format!("`{params}` is not JSON: {e}")))?;
    let metric = v.get("metric_name").and_then(|m| m.as_str());
    let threshold = v.get("thre").and_then(|t| t.as_f64());
    match (metric, threshold) {
        (Some(m), Some(t)) => Ok(EarlyStop::AboveThreshold {
            metric: m.to_string(),
            threshold: t,
        }),
        _ => Err(ConfigError::invalid(
            field,
            format!("`{params}` needs \"metric_name\" (a string) and \"thre\" (a number) for {THRESHOLD_STOP_FUNC}"),
        )),
    }
}

impl ExportPlan {
    /// `export_config`, or the defaults without one.
    pub fn from_proto(cfg: Option<&proto::ExportConfig>) -> Result<ExportPlan, ConfigError> {
        let Some(e) = cfg else {
            return Ok(ExportPlan::default());
        };
        // placeholder_named_by_input needs nothing: served inputs are always
        // named by their input field.
        let unsupported = [
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
            early_stop: early_stop(e)?,
            multi_value: match &e.multi_value_fields {
                _ if e.auto_multi_value() => MultiValue::Auto,
                Some(m) if !m.input_name.is_empty() => MultiValue::Fields(m.input_name.clone()),
                _ => MultiValue::None,
            },
            unsupported,
            task_suffixes: Vec::new(),
        })
    }
}
