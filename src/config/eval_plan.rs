//! `eval_config`, typed: how much to evaluate, how often, and the
//! metrics a task without metrics of its own reports.

use super::{proto, ConfigError};

/// The eval section of a pipeline config.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalPlan {
    /// Evaluate on this many examples (0 = all).
    pub num_examples: u64,
    /// Evaluate at a checkpoint save once this many seconds passed since the
    /// last evaluation (EasyRec's eval_interval_secs, the EvalSpec throttle).
    pub interval_secs: u32,
    /// `metrics_set`: every task's metrics unless its tower lists its own.
    pub metrics: Vec<Metric>,
}

impl EvalPlan {
    pub fn from_proto(eval: Option<&proto::EvalConfig>) -> Result<Self, ConfigError> {
        Ok(EvalPlan {
            num_examples: eval.map_or(0, |e| e.num_examples()) as u64,
            interval_secs: eval.map_or(300, |e| e.eval_interval_secs()),
            metrics: metric_list(eval.map_or(&[][..], |e| &e.metrics_set[..]), "eval_config.metrics_set")?,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    Auc,
    Gauc {
        uid_field: String,
    },
    /// EasyRec's `session_auc`: GAUC's mean of per-group AUCs, the groups
    /// by `session_id_field`.
    SessionAuc {
        session_id_field: String,
    },
    Accuracy,
    Mse,
    Rmse,
    Mae,
    /// EasyRec's `max_f1`: the best F1 over its 200 thresholds.
    MaxF1,
    /// A listwise match model's `recall@k`: the share of users whose own
    /// item is among the `k` highest-scored of the batch's items.
    RecallAtTopK {
        k: usize,
    },
}

impl Metric {
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Auc => "auc",
            Metric::Gauc { .. } => "gauc",
            Metric::SessionAuc { .. } => "session_auc",
            Metric::Accuracy => "accuracy",
            Metric::Mse => "mean_squared_error",
            Metric::Rmse => "root_mean_squared_error",
            Metric::Mae => "mean_absolute_error",
            Metric::MaxF1 => "max_f1",
            Metric::RecallAtTopK { .. } => "recall_at_topk",
        }
    }
}

/// A `metrics_set` list at `path`.
pub fn metric_list(list: &[proto::EvalMetrics], path: &str) -> Result<Vec<Metric>, ConfigError> {
    use proto::eval_metrics::Metric as M;
    let mut out = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let path = format!("{path}[{i}]");
        out.push(match &m.metric {
            Some(M::Auc(_)) => Metric::Auc,
            Some(M::Gauc(g)) => {
                if g.reduction() != "mean" {
                    return Err(ConfigError::unsupported(
                        format!("{path}.gauc.reduction"),
                        format!("reduction `{}` (supported: mean)", g.reduction()),
                    ));
                }
                Metric::Gauc {
                    uid_field: g.uid_field.clone(),
                }
            }
            Some(M::SessionAuc(g)) => {
                if g.reduction() != "mean" {
                    return Err(ConfigError::unsupported(
                        format!("{path}.session_auc.reduction"),
                        format!("reduction `{}` (supported: mean)", g.reduction()),
                    ));
                }
                Metric::SessionAuc {
                    session_id_field: g.session_id_field.clone(),
                }
            }
            Some(M::Accuracy(_)) => Metric::Accuracy,
            Some(M::MeanSquaredError(_)) => Metric::Mse,
            Some(M::RootMeanSquaredError(_)) => Metric::Rmse,
            Some(M::MeanAbsoluteError(_)) => Metric::Mae,
            Some(M::MaxF1(_)) => Metric::MaxF1,
            Some(M::RecallAtTopk(r)) => {
                if r.topk() == 0 {
                    return Err(ConfigError::invalid(
                        format!("{path}.recall_at_topk.topk"),
                        "must be at least 1",
                    ));
                }
                Metric::RecallAtTopK { k: r.topk() as usize }
            }
            Some(other) => {
                let name = format!("{other:?}");
                let name = name.split('(').next().unwrap_or("").to_string();
                return Err(ConfigError::unsupported(path, format!("metric {name}")));
            }
            None => continue,
        });
    }
    Ok(out)
}
