//! The tasks a model is trained for: one for the single-task models
//! (its loss from `model_config.loss_type`, metrics from `eval_config`),
//! one per task tower for the multi-task ones (each with its label, loss,
//! weight and metrics, named as EasyRec names them: `logits_ctr`, `auc_ctr`).

use super::model_plan::{dnn, metric_list, DnnSpec, Metric, TaskTower};
use super::typed::LossKind;
use super::{proto, ConfigError};

/// One task: a model output trained against one label.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The tower's name; empty for single-task models.
    pub name: String,
    /// Index into `data_config.label_fields`.
    pub label: usize,
    pub weight: f32,
    pub loss: LossKind,
    pub metrics: Vec<Metric>,
}

impl Task {
    /// What EasyRec appends to this task's outputs and metrics: `_ctr`, or
    /// nothing for a single task.
    pub fn suffix(&self) -> String {
        if self.name.is_empty() {
            String::new()
        } else {
            format!("_{}", self.name)
        }
    }

    /// The model graph output holding this task's logits.
    pub fn output(&self) -> String {
        format!("logits{}", self.suffix())
    }

    /// The name of this task's scores: `probs<suffix>`, or `y<suffix>` for
    /// regression.
    pub fn score_name(&self) -> String {
        match self.loss {
            LossKind::BinaryClassification => format!("probs{}", self.suffix()),
            LossKind::Regression => format!("y{}", self.suffix()),
        }
    }

    pub fn classification(&self) -> bool {
        self.loss == LossKind::BinaryClassification
    }
}

/// A loss type and class count as a `LossKind`.
pub fn loss_kind(loss_type: proto::LossType, num_class: u32, path: &str) -> Result<LossKind, ConfigError> {
    match (loss_type, num_class) {
        (proto::LossType::Classification, 1) => Ok(LossKind::BinaryClassification),
        (proto::LossType::L2Loss, _) => Ok(LossKind::Regression),
        (proto::LossType::Classification, n) => Err(ConfigError::unsupported(
            format!("{path}.num_class"),
            format!("multi-class classification ({n} classes)"),
        )),
        (other, _) => Err(ConfigError::unsupported(
            format!("{path}.loss_type"),
            format!("loss {}", other.as_str_name()),
        )),
    }
}

/// The fields task towers of both kinds share.
pub struct TowerFields<'a> {
    pub name: &'a str,
    pub label_name: Option<&'a str>,
    pub metrics: &'a [proto::EvalMetrics],
    pub loss_type: proto::LossType,
    pub num_class: u32,
    pub dnn: Option<&'a proto::Dnn>,
    pub weight: f32,
    pub task_space_indicator_label: Option<&'a str>,
    pub extra_losses: usize,
    /// BayesTaskTower only.
    pub relation_tower_names: &'a [String],
    pub relation_dnn: Option<&'a proto::Dnn>,
    pub use_ait_module: bool,
}

impl<'a> From<&'a proto::TaskTower> for TowerFields<'a> {
    fn from(t: &'a proto::TaskTower) -> Self {
        TowerFields {
            name: &t.tower_name,
            label_name: t.label_name.as_deref(),
            metrics: &t.metrics_set,
            loss_type: t.loss_type(),
            num_class: t.num_class(),
            dnn: t.dnn.as_ref(),
            weight: t.weight(),
            task_space_indicator_label: t.task_space_indicator_label.as_deref(),
            extra_losses: t.losses.len(),
            relation_tower_names: &[],
            relation_dnn: None,
            use_ait_module: false,
        }
    }
}

impl<'a> From<&'a proto::BayesTaskTower> for TowerFields<'a> {
    fn from(t: &'a proto::BayesTaskTower) -> Self {
        TowerFields {
            name: &t.tower_name,
            label_name: t.label_name.as_deref(),
            metrics: &t.metrics_set,
            loss_type: t.loss_type(),
            num_class: t.num_class(),
            dnn: t.dnn.as_ref(),
            weight: t.weight(),
            task_space_indicator_label: t.task_space_indicator_label.as_deref(),
            extra_losses: t.losses.len(),
            relation_tower_names: &t.relation_tower_names,
            relation_dnn: t.relation_dnn.as_ref(),
            use_ait_module: t.use_ait_module(),
        }
    }
}

/// The towers of a multi-task model (their layers) and their tasks. A tower
/// without `label_name` takes the label field at its position, as EasyRec
/// does.
pub fn task_towers(
    towers: &[TowerFields],
    path: &str,
    label_fields: &[String],
) -> Result<(Vec<TaskTower>, Vec<Task>), ConfigError> {
    if towers.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.task_towers"),
            "a multi-task model needs task towers",
        ));
    }
    let mut layers: Vec<TaskTower> = Vec::new();
    let mut tasks = Vec::new();
    for (i, t) in towers.iter().enumerate() {
        let p = format!("{path}.task_towers[{i}]");
        if t.name.is_empty() {
            return Err(ConfigError::invalid(format!("{p}.tower_name"), "must not be empty"));
        }
        if layers.iter().any(|l| l.name == t.name) {
            return Err(ConfigError::invalid(
                format!("{p}.tower_name"),
                format!("`{}` names two towers", t.name),
            ));
        }
        if t.extra_losses > 0 {
            return Err(ConfigError::unsupported(
                format!("{p}.losses"),
                "a list of losses per task",
            ));
        }
        if t.task_space_indicator_label.is_some() {
            return Err(ConfigError::unsupported(
                format!("{p}.task_space_indicator_label"),
                "task-space loss weights",
            ));
        }
        if t.use_ait_module {
            return Err(ConfigError::unsupported(
                format!("{p}.use_ait_module"),
                "the AITM module",
            ));
        }
        let label = match t.label_name {
            Some(l) => label_fields.iter().position(|f| f == l).ok_or_else(|| {
                ConfigError::invalid(
                    format!("{p}.label_name"),
                    format!(
                        "`{l}` is not among data_config.label_fields ({})",
                        label_fields.join(", ")
                    ),
                )
            })?,
            None if i < label_fields.len() => i,
            None => {
                return Err(ConfigError::invalid(
                    format!("{p}.label_name"),
                    format!("not set, and data_config.label_fields has no label at position {i}"),
                ))
            }
        };
        let relations = t
            .relation_tower_names
            .iter()
            .map(|r| {
                layers.iter().position(|l| &l.name == r).ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{p}.relation_tower_names"),
                        format!("`{r}` is not a tower before `{}`", t.name),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let opt_dnn = |d: Option<&proto::Dnn>, field: &str| -> Result<Option<DnnSpec>, ConfigError> {
            d.map(|d| dnn(d, &format!("{p}.{field}"))).transpose()
        };
        layers.push(TaskTower {
            name: t.name.to_string(),
            dnn: opt_dnn(t.dnn, "dnn")?,
            relation_dnn: opt_dnn(t.relation_dnn, "relation_dnn")?,
            relations,
        });
        tasks.push(Task {
            name: t.name.to_string(),
            label,
            weight: t.weight,
            loss: loss_kind(t.loss_type, t.num_class, &p)?,
            metrics: metric_list(t.metrics, &format!("{p}.metrics_set"))?,
        });
    }
    Ok((layers, tasks))
}
