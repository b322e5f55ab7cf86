//! `model_config`, typed: the model class, its feature groups, the
//! architecture block, the tasks it is trained for, and regularization.

pub mod arch;
pub mod backbone;
pub mod encoder;
pub mod groups;
pub mod kind;
pub mod layers;
pub mod mind;
pub mod multimodal;
pub mod tasks;

pub use arch::Arch;
pub use groups::{Bst, FeatureGroup, SeqAttention};
pub use kind::ModelKind;
pub use layers::*;

use crate::config::data_plan::DataPlan;
use crate::config::eval_plan::Metric;
use crate::config::feature_plan::FeaturePlan;
use crate::config::{proto, ConfigError};
use arch::arch;
use tasks::{loss_kind, LossKind, Task};

/// The model section of a pipeline config.
#[derive(Debug, Clone)]
pub struct ModelPlan {
    pub kind: ModelKind,
    pub groups: Vec<FeatureGroup>,
    pub arch: Arch,
    /// What the model is trained for: one task, or one per task tower.
    pub tasks: Vec<Task>,
    pub l2_regularization: f32,
    pub embedding_regularization: f32,
    /// `model_config.variational_dropout`, applied to every feature group.
    pub variational_dropout: Option<VariationalDropout>,
    /// A listwise match model's `item_id` (without
    /// `ignore_in_batch_neg_sam`): the input field whose equal values
    /// mark the batch's other examples that are no negatives of a user.
    pub in_batch_item: Option<String>,
}

impl ModelPlan {
    /// `model` over `features`, its tasks on the labels of `data` and, where
    /// a tower lists none, `eval_metrics` (eval_config's).
    pub fn from_proto(
        model: &proto::EasyRecModel,
        features: &FeaturePlan,
        data: &DataPlan,
        eval_metrics: &[Metric],
    ) -> Result<Self, ConfigError> {
        let kind = ModelKind::from_class(&model.model_class)?;
        let groups = groups::resolve(model, kind, features)?;
        let (arch, l2_regularization, multi) = arch(model, &data.label_fields)?;
        let mut tasks = model_tasks(model, kind, multi, &data.label_fields, eval_metrics)?;
        let label_dims: Vec<usize> = data.label_shapes.iter().map(|s| s.dim).collect();
        tasks::add_kd(model, (&data.label_fields, &label_dims), &mut tasks)?;
        tasks::check_scalar_labels(&tasks, &data.label_fields, &label_dims)?;
        let in_batch_item = match tasks.iter().any(|t| t.in_batch()) {
            true => mind::in_batch_item(model, &data.fields)?,
            false => None,
        };
        let plan = ModelPlan {
            kind,
            groups,
            arch,
            tasks,
            l2_regularization,
            embedding_regularization: model.embedding_regularization(),
            variational_dropout: variational_dropout(model)?,
            in_batch_item,
        };
        // Rows are grouped by one field for every grouped AUC.
        let clash = {
            let mut fields = plan.gauc_uid_fields();
            let first = fields.next();
            first.and_then(|a| fields.find(|b| *b != a).map(|b| format!("(`{a}` and `{b}`)")))
        };
        match clash {
            Some(which) => Err(ConfigError::unsupported(
                "eval_config.metrics_set",
                format!("GAUC / session AUC grouped by two fields {which}"),
            )),
            None => Ok(plan),
        }
    }

    /// Labels made of two label fields' product (indices into
    /// `label_fields`), which tasks find after those: ESMM's CTCVR label.
    pub fn label_products(&self) -> Vec<(usize, usize)> {
        match &self.arch {
            Arch::Esmm { labels, .. } => vec![*labels],
            _ => Vec::new(),
        }
    }

    /// The field every grouped AUC (GAUC's `uid_field`, session AUC's
    /// `session_id_field`) of every task groups rows by, in task order.
    /// JRC losses' session fields join them: rows carry one grouping field.
    pub fn gauc_uid_fields(&self) -> impl Iterator<Item = &str> {
        let metrics = self.tasks.iter().flat_map(|t| &t.metrics).filter_map(|m| match m {
            Metric::Gauc { uid_field } => Some(uid_field.as_str()),
            Metric::SessionAuc { session_id_field } => Some(session_id_field.as_str()),
            _ => None,
        });
        metrics.chain(self.tasks.iter().filter_map(|t| t.session.as_deref()))
    }
}

/// The tasks of `model` (of class `kind`): a multi-task model's `multi`
/// (their metrics `eval_metrics` where a tower lists none), or the one
/// task of a single-task model on `model_config.label_name`.
fn model_tasks(
    model: &proto::EasyRecModel,
    kind: ModelKind,
    multi: Option<Vec<Task>>,
    label_fields: &[String],
    eval_metrics: &[Metric],
) -> Result<Vec<Task>, ConfigError> {
    Ok(match multi {
        // A tower without metrics_set takes eval_config's.
        Some(mut tasks) => {
            tasks::fixed_weights(model)?;
            if !model.losses.is_empty() {
                // Multi-task models take losses per task tower.
                return Err(ConfigError::unsupported(
                    "model_config.losses",
                    "a model-level losses list on a multi-task model",
                ));
            }
            for t in tasks.iter_mut().filter(|t| t.metrics.is_empty()) {
                t.metrics = eval_metrics.to_vec();
            }
            for t in &tasks {
                tasks::check_output_metrics(t.loss, &t.metrics, "eval_config.metrics_set")?;
            }
            tasks
        }
        None => {
            // EasyRec's single-task models train on `label_name`, by
            // default the first label field.
            let label = match model.label_name.as_deref().filter(|l| !l.is_empty()) {
                Some(l) => label_fields.iter().position(|f| f == l).ok_or_else(|| {
                    ConfigError::invalid(
                        "model_config.label_name",
                        format!("`{l}` is not among data_config.label_fields"),
                    )
                })?,
                None => 0,
            };
            let mut metrics = eval_metrics.to_vec();
            let mut session = None;
            let loss = if matches!(kind, ModelKind::Dssm | ModelKind::MatchModel | ModelKind::Mind) {
                let ignore = mind::ignore_in_batch(model);
                let loss = tasks::match_loss_kind(model.loss_type(), model.num_class(), ignore)?;
                if kind == ModelKind::Mind && loss.is_in_batch() {
                    // EasyRec's listwise MIND evaluates recall_at_topk
                    // and passes over any other metric.
                    metrics.retain(|m| {
                        let keep = m.name() == "recall_at_topk";
                        if !keep {
                            log::warn!(
                                "eval_config.metrics_set: MIND trained with SOFTMAX_CROSS_ENTROPY evaluates recall_at_topk only; {} is left out, as EasyRec does",
                                m.name()
                            );
                        }
                        keep
                    });
                }
                tasks::check_match_metrics(loss, &metrics)?;
                loss
            } else if kind == ModelKind::DropoutNet {
                // EasyRec's DropoutNet trains on its `losses` alone, on
                // the similarity as a logit.
                if model.losses.is_empty() {
                    return Err(ConfigError::invalid(
                        "model_config.losses",
                        "DropoutNet trains on its losses list, and this one is empty",
                    ));
                }
                LossKind::BinaryClassification
            } else if let Some((kind, s)) = tasks::list_kind(&model.losses, model.num_class(), "model_config.losses")? {
                session = s;
                kind
            } else {
                loss_kind(model.loss_type(), model.num_class(), "model_config")?
            };
            let terms = tasks::loss_terms(model, loss)?;
            // Several logits per row need the one output layer of the
            // models that have it.
            let several = match loss {
                LossKind::MultiClass { classes } => Some((
                    "model_config.num_class",
                    format!(
                        "multi-class classification ({classes} classes) on {}",
                        model.model_class
                    ),
                )),
                LossKind::Ziln(_) | LossKind::Jrc => Some((
                    "model_config.losses",
                    format!("{} on {}", model.losses[0].loss_type().as_str_name(), model.model_class),
                )),
                _ => None,
            };
            if let Some((field, what)) = several.filter(|_| !kind.has_class_head()) {
                return Err(ConfigError::unsupported(field, what));
            }
            tasks::check_output_metrics(loss, &metrics, "eval_config.metrics_set")?;
            vec![Task {
                terms,
                metrics,
                session,
                ..Task::on_label("", label, loss)
            }]
        }
    })
}

/// EasyRec's variational dropout (`model_config.variational_dropout`): each
/// feature group's features (`embedding_wise`: each of their columns) learn
/// a dropout rate, and the loss gains `lambda / batch * Σ (1 - rate)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VariationalDropout {
    pub lambda: f32,
    pub embedding_wise: bool,
}

fn variational_dropout(model: &proto::EasyRecModel) -> Result<Option<VariationalDropout>, ConfigError> {
    let Some(vd) = &model.variational_dropout else {
        return Ok(None);
    };
    if model.backbone.is_some() {
        return Err(ConfigError::unsupported(
            "model_config.variational_dropout",
            "variational dropout in a backbone model's input layers",
        ));
    }
    let lambda = vd.regularization_lambda();
    if !lambda.is_finite() || lambda < 0.0 {
        return Err(ConfigError::invalid(
            "model_config.variational_dropout.regularization_lambda",
            format!("{lambda} is not a finite value >= 0"),
        ));
    }
    Ok(Some(VariationalDropout {
        lambda,
        embedding_wise: vd.embedding_wise_variational_dropout(),
    }))
}
