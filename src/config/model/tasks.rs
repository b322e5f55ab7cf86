//! The tasks a model is trained for: one for the single-task models
//! (its loss from `model_config.loss_type`, metrics from `eval_config`),
//! one per task tower for the multi-task ones (each with its label, loss,
//! weight and metrics, named as EasyRec names them: `logits_ctr`, `auc_ctr`).

use super::layers::{dnn, DnnSpec, TaskTower};
use crate::config::eval_plan::{metric_list, Metric};
use crate::config::{proto, ConfigError};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossKind {
    /// Sigmoid cross entropy on one logit.
    BinaryClassification,
    /// Mean squared error.
    Regression,
    /// A match model's in-batch softmax (EasyRec's listwise
    /// `SOFTMAX_CROSS_ENTROPY`): each user's item against the batch's
    /// other items. The task's `logits` are the row's own similarity.
    /// `ignore_in_batch` (EasyRec's `ignore_in_batch_neg_sam`): the batch's
    /// other items are left out, only sampled ones compete.
    InBatchSoftmax { ignore_in_batch: bool },
    /// Softmax cross entropy over `classes` logits (CLASSIFICATION with
    /// `num_class > 1`); the label is the class index.
    MultiClass { classes: usize },
    /// EasyRec's zero-inflated lognormal (`ZILN_LOSS`, lifetime value):
    /// three logits per row (whether the label is positive, the
    /// lognormal's mu and its sigma before softplus), scored as `probs`
    /// (of a positive label) and `y` (the expected value).
    Ziln(ZilnPrediction),
    /// EasyRec's JRC loss (`JRC_LOSS`, num_class 2): two logits per row,
    /// scored as `probs`, the softmax's second class.
    Jrc,
}

impl LossKind {
    /// A match model's in-batch softmax.
    pub fn is_in_batch(self) -> bool {
        matches!(self, LossKind::InBatchSoftmax { .. })
    }

    /// An in-batch softmax that leaves the batch's other items out
    /// (`ignore_in_batch_neg_sam`).
    pub fn ignores_in_batch(self) -> bool {
        matches!(self, LossKind::InBatchSoftmax { ignore_in_batch: true })
    }
}

/// How a ZILN task's expected value `y` is computed from its logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZilnPrediction {
    /// Sigma's upper clip.
    pub max_sigma: f32,
    /// The log of `y` is clipped to [-100, this].
    pub max_log_clip: f32,
    /// `y` is given as its logarithm (unclipped).
    pub return_log: bool,
}

/// One task: a model output trained against one label.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The tower's name; empty for single-task models.
    pub name: String,
    /// Index into `data_config.label_fields`.
    pub label: usize,
    pub weight: f32,
    pub loss: LossKind,
    /// `model_config.losses`: when given, EasyRec trains on their weighted
    /// sum instead of `loss`'s (which still decides the scores' kind).
    pub terms: Vec<LossTerm>,
    pub metrics: Vec<Metric>,
    /// The batch loss sums its rows instead of averaging them (ESMM's).
    pub summed: bool,
    /// Evaluated only, on the rows whose label at this index is > 0, and
    /// not trained (ESMM's masked CVR, `auc_cvr_masked`).
    pub masked_by: Option<usize>,
    /// Knowledge distillation (`model_config.kd`) on this task's logits,
    /// added to its loss.
    pub kd: Vec<KdTerm>,
    /// The input field whose values group rows into sessions for the
    /// task's JRC loss.
    pub session: Option<String>,
    /// EasyRec's ORDER_CALIBRATE_LOSS: per relation task (an index into
    /// the tasks) and weight, `weight * mean(relu(p_this - p_relation))`
    /// over the two tasks' probabilities joins the loss.
    pub calibrate: Vec<(usize, f32)>,
}

/// One `model_config.kd` entry: the task's logits against a soft label
/// field, its loss times `weight`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdTerm {
    /// Index into `data_config.label_fields`.
    pub label: usize,
    pub kind: KdKind,
    pub weight: f32,
    /// Divides the logits and the soft labels (0: none), for the cross
    /// entropies.
    pub temperature: f32,
    /// The soft labels are logits (else probabilities).
    pub label_is_logits: bool,
    /// The task's logits per row, and the soft label's values per row
    /// (`data_config.label_dim`): over 1, a multi-class task distilled
    /// through softmaxes.
    pub classes: usize,
}

impl KdTerm {
    /// What the logits and soft labels are divided by: the temperature,
    /// or 1 without one.
    pub fn divisor(&self) -> f32 {
        if self.temperature > 0.0 {
            self.temperature
        } else {
            1.0
        }
    }
}

/// The losses EasyRec's `build_kd_loss` computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdKind {
    /// `CROSS_ENTROPY_LOSS`: TensorFlow's `log_loss` (epsilon 1e-7) of
    /// `sigmoid(z / T)` against `sigmoid(soft / T)`; of a multi-class
    /// task, elementwise over `softmax(z / T)` against `softmax(soft / T)`.
    CrossEntropy,
    /// `KL_DIVERGENCE_LOSS`: Keras' KLD (both sides clipped to [1e-7, 1])
    /// of the distributions `[1 - σ, σ]` (one logit) or the softmaxes over
    /// the temperature, summed over a row's classes, averaged over rows.
    KlDivergence,
    /// `BINARY_CROSS_ENTROPY_LOSS`: sigmoid cross entropy of `z / T`
    /// against `sigmoid(soft / T)`.
    BinaryCrossEntropy,
    /// `L2_LOSS`: the mean squared difference of the logits and the soft
    /// labels.
    L2,
}

/// `model_config.kd`, each entry on the task whose logits it names.
/// `label_dims` are the label fields' values per row.
pub fn add_kd(
    model: &proto::EasyRecModel,
    (label_fields, label_dims): (&[String], &[usize]),
    tasks: &mut [Task],
) -> Result<(), ConfigError> {
    for (i, kd) in model.kd.iter().enumerate() {
        let path = format!("model_config.kd[{i}]");
        if kd.task_space_indicator_name.as_deref().is_some_and(|n| !n.is_empty()) {
            return Err(ConfigError::unsupported(
                format!("{path}.task_space_indicator_name"),
                "distillation weighted by a task space",
            ));
        }
        let label = label_fields
            .iter()
            .position(|l| *l == kd.soft_label_name)
            .ok_or_else(|| {
                ConfigError::invalid(
                    format!("{path}.soft_label_name"),
                    format!("`{}` is not among data_config.label_fields", kd.soft_label_name),
                )
            })?;
        let task = tasks
            .iter_mut()
            .find(|t| t.output() == kd.pred_name && t.trained() && !t.in_batch())
            .ok_or_else(|| {
                ConfigError::unsupported(
                    format!("{path}.pred_name"),
                    format!(
                        "distilling `{}`: only a task's logits (`logits`, `logits_<tower>`) of a pointwise loss",
                        kd.pred_name
                    ),
                )
            })?;
        let classes = task.logit_width();
        if classes != task.classes() {
            return Err(ConfigError::unsupported(
                format!("{path}.pred_name"),
                format!("distilling a task of {classes} logits per row that are no classes"),
            ));
        }
        let dim = label_dims.get(label).copied().unwrap_or(1);
        if dim != classes {
            return Err(ConfigError::invalid(
                format!("{path}.soft_label_name"),
                format!(
                    "`{}` has {dim} value(s) per row (data_config.label_dim) where `{}` has {classes} logits",
                    kd.soft_label_name, kd.pred_name
                ),
            ));
        }
        if !kd.pred_is_logits() {
            return Err(ConfigError::invalid(
                format!("{path}.pred_is_logits"),
                format!("`{}` holds logits", kd.pred_name),
            ));
        }
        let kind = match kd.loss_type() {
            proto::LossType::CrossEntropyLoss => KdKind::CrossEntropy,
            proto::LossType::BinaryCrossEntropyLoss => KdKind::BinaryCrossEntropy,
            proto::LossType::L2Loss => KdKind::L2,
            proto::LossType::KlDivergenceLoss => KdKind::KlDivergence,
            other => {
                return Err(ConfigError::unsupported(
                    format!("{path}.loss_type"),
                    format!(
                        "distillation by {} (supported: CROSS_ENTROPY_LOSS, BINARY_CROSS_ENTROPY_LOSS, KL_DIVERGENCE_LOSS, L2_LOSS)",
                        other.as_str_name()
                    ),
                ))
            }
        };
        task.kd.push(KdTerm {
            label,
            kind,
            weight: kd.loss_weight(),
            temperature: kd.temperature(),
            label_is_logits: kd.label_is_logits(),
            classes,
        });
    }
    Ok(())
}

/// A task trains and is evaluated on one label value per row: a label of
/// several (`label_dim`, a distillation's soft labels) is refused as a
/// task's label or mask.
pub fn check_scalar_labels(tasks: &[Task], label_fields: &[String], label_dims: &[usize]) -> Result<(), ConfigError> {
    for t in tasks {
        for l in std::iter::once(t.label).chain(t.masked_by) {
            let dim = label_dims.get(l).copied().unwrap_or(1);
            if dim > 1 {
                let name = label_fields.get(l).map_or("", String::as_str);
                let task = if t.name.is_empty() {
                    "the model".into()
                } else {
                    format!("task `{}`", t.name)
                };
                return Err(ConfigError::invalid(
                    "data_config.label_dim",
                    format!("`{name}` has {dim} values per row; {task} trains on one (a soft label of several is read by model_config.kd)"),
                ));
            }
        }
    }
    Ok(())
}

/// One entry of `model_config.losses`, times its `weight`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossTerm {
    pub kind: LossTermKind,
    pub weight: f32,
}

/// The batch losses EasyRec can list, as its `loss_builder` computes them
/// on the task's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossTermKind {
    /// Sigmoid cross entropy, the mean over the batch.
    CrossEntropy,
    /// `f1_reweight_sigmoid_cross_entropy`: negatives weighted by
    /// `Σp / (β²·P − P + Σp)`, the weights differentiated too.
    F1Reweighted { beta_square: f32, label_smoothing: f32 },
    /// The deprecated `pairwise_loss`: for every pair with a greater label,
    /// the cross entropy of `(z_i − z_j)/T − margin` against 1, the mean
    /// over pairs (0 without pairs).
    PairWise { margin: f32, temperature: f32 },
    /// EasyRec's `jrc_loss` on two logits per row (its fixed weighting
    /// and same-label loss): `alpha` x the softmax cross entropy plus
    /// `1 - alpha` x, per session (the task's `session` field) and class,
    /// the cross entropy of the class's labels against the softmax of the
    /// class's logits over the session's rows, summed over sessions and
    /// divided by the rows.
    Jrc { alpha: f32 },
    /// EasyRec's `zero_inflated_lognormal_loss` on three logits per row:
    /// `class_weight` x the sigmoid cross entropy of the first against
    /// `label > 0`, `reg_weight` x the lognormal's negative log likelihood
    /// of the positive labels (mu, and sigma = clip(softplus(z2),
    /// sqrt(1e-7), max_sigma)) over their count, plus `mu_reg` x mean mu²
    /// and `sigma_reg` x mean z2².
    Ziln(ZilnTerm),
}

/// `ZILNLoss`'s training parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZilnTerm {
    pub mu_reg: f32,
    pub sigma_reg: f32,
    pub max_sigma: f32,
    pub class_weight: f32,
    pub reg_weight: f32,
}

/// A `losses` list (at `path`, of a model or task tower of `num_class`
/// classes) holding `ZILN_LOSS` or `JRC_LOSS`: the task's loss kind (its
/// outputs) and JRC's session field, that loss alone in the list with
/// the class count EasyRec's predictions need (3 and 2); `None` without
/// either.
pub fn list_kind(
    losses: &[proto::Loss],
    num_class: u32,
    path: &str,
) -> Result<Option<(LossKind, Option<String>)>, ConfigError> {
    use proto::loss::LossParam;
    let Some(i) = losses
        .iter()
        .position(|l| matches!(l.loss_type(), proto::LossType::ZilnLoss | proto::LossType::JrcLoss))
    else {
        return Ok(None);
    };
    let t = losses[i].loss_type();
    let (name, classes) = match t {
        proto::LossType::ZilnLoss => ("ZILN_LOSS", 3),
        _ => ("JRC_LOSS", 2),
    };
    if losses.len() > 1 {
        return Err(ConfigError::unsupported(path, format!("{name} beside other losses")));
    }
    let class_path = match path.rsplit_once('.') {
        Some((parent, _)) => format!("{parent}.num_class"),
        None => "num_class".into(),
    };
    if num_class != classes {
        return Err(ConfigError::invalid(
            class_path,
            format!("{name} needs num_class: {classes} ({classes} logits per row), not {num_class}"),
        ));
    }
    let wrong = || {
        ConfigError::invalid(
            format!("{path}[{i}].loss_type"),
            format!("{name} does not take the parameters given with it"),
        )
    };
    Ok(Some(match (t, &losses[i].loss_param) {
        (proto::LossType::ZilnLoss, p) => {
            let p = match p {
                Some(LossParam::ZilnLoss(p)) => *p,
                None => proto::ZilnLoss::default(),
                Some(_) => return Err(wrong()),
            };
            let z = ZilnPrediction {
                max_sigma: p.max_sigma(),
                max_log_clip: p.max_log_clip_value(),
                return_log: p.return_log_pred_value(),
            };
            (LossKind::Ziln(z), None)
        }
        (_, Some(LossParam::JrcLoss(p))) => (LossKind::Jrc, Some(p.session_name.clone())),
        (_, None) => {
            return Err(ConfigError::invalid(
                format!("{path}[{i}].jrc_loss.session_name"),
                "JRC_LOSS needs its session field",
            ))
        }
        (_, Some(_)) => return Err(wrong()),
    }))
}

/// `model_config.losses` of a single-task model, checked: EasyRec's Fixed
/// weighting of the loss types built here, or a refusal naming the entry.
pub fn loss_terms(model: &proto::EasyRecModel, output: LossKind) -> Result<Vec<LossTerm>, ConfigError> {
    if model.losses.is_empty() {
        return Ok(Vec::new());
    }
    fixed_weights(model)?;
    terms_of(&model.losses, "model_config.losses", output)
}

/// EasyRec's loss weighting: only `Fixed` is built here (its `Uncertainty`
/// and `Random` strategies learn or draw the weights).
pub fn fixed_weights(model: &proto::EasyRecModel) -> Result<(), ConfigError> {
    use proto::easy_rec_model::LossWeightStrategy;
    if model.loss_weight_strategy() != LossWeightStrategy::Fixed {
        return Err(ConfigError::unsupported(
            "model_config.loss_weight_strategy",
            format!("{} loss weighting", model.loss_weight_strategy().as_str_name()),
        ));
    }
    Ok(())
}

/// A `losses` list (at `path`) as loss terms on logits trained for `output`.
fn terms_of(losses: &[proto::Loss], path: &str, output: LossKind) -> Result<Vec<LossTerm>, ConfigError> {
    use proto::loss::LossParam;
    let mut terms = Vec::new();
    for (i, l) in losses.iter().enumerate() {
        let path = format!("{path}[{i}]");
        if l.learn_loss_weight() {
            return Err(ConfigError::unsupported(
                format!("{path}.learn_loss_weight"),
                "learned loss weights",
            ));
        }
        let kind = match (l.loss_type(), &l.loss_param) {
            (proto::LossType::Classification, None) => LossTermKind::CrossEntropy,
            (proto::LossType::F1ReweightedLoss, None) => LossTermKind::F1Reweighted {
                beta_square: 1.0,
                label_smoothing: 0.0,
            },
            (proto::LossType::F1ReweightedLoss, Some(LossParam::F1ReweightedLoss(p))) => LossTermKind::F1Reweighted {
                beta_square: p.f1_beta_square,
                label_smoothing: p.label_smoothing,
            },
            (proto::LossType::ZilnLoss, p) if matches!(output, LossKind::Ziln(_)) => {
                let p = match p {
                    Some(LossParam::ZilnLoss(p)) => *p,
                    _ => proto::ZilnLoss::default(),
                };
                LossTermKind::Ziln(ZilnTerm {
                    mu_reg: p.mu_regularization(),
                    sigma_reg: p.sigma_regularization(),
                    max_sigma: p.max_sigma(),
                    class_weight: p.classification_weight(),
                    reg_weight: p.regression_weight(),
                })
            }
            (proto::LossType::JrcLoss, Some(LossParam::JrcLoss(p))) if output == LossKind::Jrc => {
                if p.loss_weight_strategy != "fixed" {
                    return Err(ConfigError::unsupported(
                        format!("{path}.jrc_loss.loss_weight_strategy"),
                        format!("JRC weighting `{}` (supported: fixed)", p.loss_weight_strategy),
                    ));
                }
                if !p.same_label_loss() {
                    return Err(ConfigError::unsupported(
                        format!("{path}.jrc_loss.same_label_loss"),
                        "JRC without the same-label generative loss",
                    ));
                }
                LossTermKind::Jrc { alpha: p.alpha() }
            }
            (proto::LossType::PairWiseLoss, None) => LossTermKind::PairWise {
                margin: 0.0,
                temperature: 1.0,
            },
            (proto::LossType::PairWiseLoss, Some(LossParam::PairwiseLoss(p))) => {
                if p.session_name.as_deref().is_some_and(|s| !s.is_empty()) {
                    return Err(ConfigError::unsupported(
                        format!("{path}.pairwise_loss.session_name"),
                        "pairs within sessions",
                    ));
                }
                if p.temperature() == 0.0 {
                    return Err(ConfigError::invalid(
                        format!("{path}.pairwise_loss.temperature"),
                        "must not be 0",
                    ));
                }
                LossTermKind::PairWise {
                    margin: p.margin,
                    temperature: p.temperature(),
                }
            }
            (
                t @ (proto::LossType::Classification
                | proto::LossType::F1ReweightedLoss
                | proto::LossType::PairWiseLoss),
                Some(_),
            ) => {
                return Err(ConfigError::invalid(
                    format!("{path}.loss_type"),
                    format!("{} does not take the parameters given with it", t.as_str_name()),
                ))
            }
            (t, _) => {
                return Err(ConfigError::unsupported(
                    format!("{path}.loss_type"),
                    format!("loss {} in a losses list", t.as_str_name()),
                ))
            }
        };
        terms.push(LossTerm {
            kind,
            weight: l.weight(),
        });
    }
    if output != LossKind::BinaryClassification && !matches!(output, LossKind::Ziln(_) | LossKind::Jrc) {
        return Err(ConfigError::unsupported(
            path,
            "extra losses of a model not trained by sigmoid cross entropy",
        ));
    }
    Ok(terms)
}

impl Task {
    /// A task named `name` (empty for a single task) trained by `loss` on
    /// label field `label` alone: weight 1, no extra losses, metrics,
    /// distillation, mask or session.
    pub fn on_label(name: &str, label: usize, loss: LossKind) -> Task {
        Task {
            name: name.to_string(),
            label,
            weight: 1.0,
            loss,
            terms: Vec::new(),
            metrics: Vec::new(),
            summed: false,
            masked_by: None,
            kd: Vec::new(),
            session: None,
            calibrate: Vec::new(),
        }
    }

    /// What EasyRec appends to this task's outputs and metrics: `_ctr`, or
    /// nothing for a single task.
    pub fn suffix(&self) -> String {
        if self.name.is_empty() {
            String::new()
        } else {
            format!("_{}", self.name)
        }
    }

    /// What EasyRec appends to this task's metrics: the suffix, then
    /// `_masked` for a masked task.
    pub fn metric_suffix(&self) -> String {
        match self.masked_by {
            Some(_) => format!("{}_masked", self.suffix()),
            None => self.suffix(),
        }
    }

    /// Whether the task's loss is trained (a masked task is evaluated only).
    pub fn trained(&self) -> bool {
        self.masked_by.is_none()
    }

    /// The model graph output holding this task's logits.
    pub fn output(&self) -> String {
        format!("logits{}", self.suffix())
    }

    /// The name of this task's scores: `probs<suffix>`, or `y<suffix>` for
    /// regression.
    pub fn score_name(&self) -> String {
        match self.loss {
            LossKind::BinaryClassification
            | LossKind::InBatchSoftmax { .. }
            | LossKind::MultiClass { .. }
            | LossKind::Ziln(_)
            | LossKind::Jrc => format!("probs{}", self.suffix()),
            LossKind::Regression => format!("y{}", self.suffix()),
        }
    }

    pub fn classification(&self) -> bool {
        matches!(self.loss, LossKind::BinaryClassification | LossKind::Jrc)
    }

    /// The classes of a multi-class task; one otherwise.
    pub fn classes(&self) -> usize {
        match self.loss {
            LossKind::MultiClass { classes } => classes,
            _ => 1,
        }
    }

    /// The task's logits per row: its classes, ZILN's three, or one.
    pub fn logit_width(&self) -> usize {
        match self.loss {
            LossKind::Ziln(_) => 3,
            LossKind::Jrc => 2,
            _ => self.classes(),
        }
    }

    /// The outputs an export gives for this task, each `[batch]` but a
    /// multi-class task's (and ZILN's logits), `[batch, width]`: its
    /// logits, its scores, and ZILN's expected value `y<suffix>`.
    pub fn export_outputs(&self) -> Vec<String> {
        let mut out = vec![self.output(), self.score_name()];
        if let LossKind::Ziln(_) = self.loss {
            out.push(format!("y{}", self.suffix()));
        }
        out
    }

    /// Whether the task's loss and metrics read the whole batch's
    /// similarities (a match model's listwise loss).
    pub fn in_batch(&self) -> bool {
        self.loss.is_in_batch()
    }
}

/// A loss type and class count as a `LossKind`.
pub fn loss_kind(loss_type: proto::LossType, num_class: u32, path: &str) -> Result<LossKind, ConfigError> {
    match (loss_type, num_class) {
        (proto::LossType::Classification, 1) => Ok(LossKind::BinaryClassification),
        (proto::LossType::L2Loss, _) => Ok(LossKind::Regression),
        (proto::LossType::Classification, 0) => {
            Err(ConfigError::invalid(format!("{path}.num_class"), "must be at least 1"))
        }
        (proto::LossType::Classification, n) => Ok(LossKind::MultiClass { classes: n as usize }),
        (other, _) => Err(ConfigError::unsupported(
            format!("{path}.loss_type"),
            format!("loss {}", other.as_str_name()),
        )),
    }
}

/// A match model's loss (EasyRec's `MatchModel`): pointwise
/// CLASSIFICATION (one class) or L2_LOSS on the similarity, or listwise
/// SOFTMAX_CROSS_ENTROPY over the batch's items.
pub fn match_loss_kind(
    loss_type: proto::LossType,
    num_class: u32,
    ignore_in_batch: bool,
) -> Result<LossKind, ConfigError> {
    match loss_type {
        proto::LossType::SoftmaxCrossEntropy => Ok(LossKind::InBatchSoftmax { ignore_in_batch }),
        proto::LossType::Classification if num_class != 1 => Err(ConfigError::invalid(
            "model_config.num_class",
            "a match model's CLASSIFICATION loss scores one class",
        )),
        t @ (proto::LossType::Classification | proto::LossType::L2Loss) => loss_kind(t, num_class, "model_config"),
        other => Err(ConfigError::unsupported(
            "model_config.loss_type",
            format!(
                "loss {} on a match model (supported: CLASSIFICATION, L2_LOSS, SOFTMAX_CROSS_ENTROPY)",
                other.as_str_name()
            ),
        )),
    }
}

/// The metrics EasyRec's match models evaluate: `auc` with
/// CLASSIFICATION, `mean_absolute_error` with L2_LOSS, `recall_at_topk`
/// with the listwise loss; it stops on any other, and so does this.
pub fn check_match_metrics(loss: LossKind, metrics: &[Metric]) -> Result<(), ConfigError> {
    let (trained, evaluates) = match loss {
        LossKind::BinaryClassification => ("CLASSIFICATION", "auc"),
        LossKind::Regression => ("L2_LOSS", "mean_absolute_error"),
        LossKind::InBatchSoftmax { .. } => ("SOFTMAX_CROSS_ENTROPY", "recall_at_topk"),
        LossKind::MultiClass { .. } | LossKind::Ziln(_) | LossKind::Jrc => {
            unreachable!("a match model scores one logit")
        }
    };
    match metrics.iter().position(|m| m.name() != evaluates) {
        Some(i) => Err(ConfigError::invalid(
            format!("eval_config.metrics_set[{i}]"),
            format!(
                "a match model trained with {trained} evaluates {evaluates}, not {}",
                metrics[i].name()
            ),
        )),
        None => Ok(()),
    }
}

/// The metrics a task of `loss` can evaluate, checked for the losses whose
/// outputs EasyRec's metrics read apart: multi-class, ZILN and JRC tasks.
pub fn check_output_metrics(loss: LossKind, metrics: &[Metric], path: &str) -> Result<(), ConfigError> {
    match loss {
        LossKind::MultiClass { classes } => check_multi_class_metrics(classes, metrics, path),
        LossKind::Ziln(_) | LossKind::Jrc => check_probs_metrics(metrics, path),
        _ => Ok(()),
    }
}

/// The metrics EasyRec evaluates on a multi-class task: `accuracy` and
/// `recall_at_topk` (of the label among the `k` highest logits), and `auc`
/// of the second class's probability with two classes; it stops on any
/// other, and so does this.
fn check_multi_class_metrics(classes: usize, metrics: &[Metric], path: &str) -> Result<(), ConfigError> {
    for (i, m) in metrics.iter().enumerate() {
        match m {
            Metric::Accuracy | Metric::RecallAtTopK { .. } => {}
            Metric::Auc if classes == 2 => {}
            other => {
                return Err(ConfigError::invalid(
                    format!("{path}[{i}]"),
                    format!(
                        "a task of {classes} classes evaluates accuracy, recall_at_topk{}, not {}",
                        if classes == 2 { " and auc" } else { "" },
                        other.name()
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The metrics of a ZILN or JRC task: the ranking metrics of its `probs`
/// (`auc`, `gauc`, `session_auc`); EasyRec's regression metrics of ZILN's
/// `y` and max_f1 of JRC's logits are not built here.
fn check_probs_metrics(metrics: &[Metric], path: &str) -> Result<(), ConfigError> {
    for (i, m) in metrics.iter().enumerate() {
        match m {
            Metric::Auc | Metric::Gauc { .. } | Metric::SessionAuc { .. } => {}
            other => {
                return Err(ConfigError::unsupported(
                    format!("{path}[{i}]"),
                    format!(
                        "{} of a ZILN or JRC task (supported: auc, gauc, session_auc)",
                        other.name()
                    ),
                ))
            }
        }
    }
    Ok(())
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
    pub losses: &'a [proto::Loss],
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
            losses: &t.losses,
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
            losses: &t.losses,
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
    let mut tasks: Vec<Task> = Vec::new();
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
        let (loss, session) = match list_kind(t.losses, t.num_class, &format!("{p}.losses"))? {
            Some((LossKind::Jrc, session)) => (LossKind::Jrc, session),
            Some(_) => {
                return Err(ConfigError::unsupported(
                    format!("{p}.losses"),
                    "ZILN_LOSS in a task tower",
                ))
            }
            None => (loss_kind(t.loss_type, t.num_class, &p)?, None),
        };
        if let LossKind::MultiClass { classes } = loss {
            return Err(ConfigError::unsupported(
                format!("{p}.num_class"),
                format!("a multi-class task tower ({classes} classes)"),
            ));
        }
        let metrics = metric_list(t.metrics, &format!("{p}.metrics_set"))?;
        check_output_metrics(loss, &metrics, &format!("{p}.metrics_set"))?;
        layers.push(TaskTower {
            name: t.name.to_string(),
            dnn: opt_dnn(t.dnn, "dnn")?,
            relation_dnn: opt_dnn(t.relation_dnn, "relation_dnn")?,
            relations: relations.clone(),
            logits: if loss == LossKind::Jrc { 2 } else { 1 },
        });
        let (terms, calibrate) = tower_terms(t.losses, &format!("{p}.losses"), loss)?;
        // EasyRec compares the towers' `probs`, which only classification
        // towers of one logit have.
        let binary = |k: LossKind| k == LossKind::BinaryClassification;
        let comparable = binary(loss) && relations.iter().all(|&r| binary(tasks[r].loss));
        if !calibrate.is_empty() && !comparable {
            return Err(ConfigError::unsupported(
                format!("{p}.losses"),
                "ORDER_CALIBRATE_LOSS between towers that are not both binary classification",
            ));
        }
        tasks.push(Task {
            terms,
            weight: t.weight,
            metrics,
            session,
            calibrate: relations
                .iter()
                .flat_map(|&r| calibrate.iter().map(move |&w| (r, w)))
                .collect(),
            ..Task::on_label(t.name, label, loss)
        });
    }
    Ok((layers, tasks))
}

/// A task tower's `losses`: trained instead of its `loss_type`, each
/// weighted by the FIRST loss's `weight`, as EasyRec's `build_loss_graph`
/// indexes the tower's weights (per loss op, from 0 for every loss), times
/// the tower's weight. Beside them, the weight of each ORDER_CALIBRATE_LOSS
/// entry, which EasyRec computes apart (against the tower's relation
/// towers, times its own weight alone).
fn tower_terms(losses: &[proto::Loss], path: &str, output: LossKind) -> Result<(Vec<LossTerm>, Vec<f32>), ConfigError> {
    let calibrate = losses
        .iter()
        .filter(|l| l.loss_type() == proto::LossType::OrderCalibrateLoss)
        .map(|l| l.weight())
        .collect::<Vec<_>>();
    let listed: Vec<proto::Loss> = losses
        .iter()
        .filter(|l| l.loss_type() != proto::LossType::OrderCalibrateLoss)
        .cloned()
        .collect();
    let Some(first) = listed.first() else {
        if !calibrate.is_empty() {
            return Err(ConfigError::unsupported(
                path,
                "ORDER_CALIBRATE_LOSS as a task tower's only loss (EasyRec then trains the tower on no loss of its own)",
            ));
        }
        return Ok((Vec::new(), calibrate));
    };
    let w = first.weight();
    if listed.iter().any(|l| l.weight() != w) {
        log::warn!(
            "{path}: EasyRec weighs every loss of a task tower by the first one's weight ({w}); so does this trainer"
        );
    }
    let mut terms = terms_of(&listed, path, output)?;
    terms.iter_mut().for_each(|t| t.weight = w);
    Ok((terms, calibrate))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(losses: &str) -> proto::EasyRecModel {
        let text = format!("model_config {{ model_class: \"DeepFM\" {losses} }}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.config");
        std::fs::write(&path, text).unwrap();
        let msg = crate::config::loader::read_pipeline_file(&path).unwrap();
        let cfg: proto::EasyRecConfig = msg.transcode_to().unwrap();
        cfg.model_config
    }

    #[test]
    fn a_loss_type_not_built_here_is_refused_with_or_without_its_parameters() {
        for losses in [
            "losses { loss_type: BINARY_FOCAL_LOSS }",
            "losses { loss_type: BINARY_FOCAL_LOSS binary_focal_loss { gamma: 2 } }",
        ] {
            let err = loss_terms(&model(losses), LossKind::BinaryClassification)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(
                    "model_config.losses[0].loss_type: loss BINARY_FOCAL_LOSS in a losses list is not supported"
                ),
                "{losses}: {err}"
            );
        }
        // A loss built here with another loss's parameters is a mistake.
        let err = loss_terms(
            &model("losses { loss_type: PAIR_WISE_LOSS f1_reweighted_loss { f1_beta_square: 2 } }"),
            LossKind::BinaryClassification,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("PAIR_WISE_LOSS does not take the parameters given with it"),
            "{err}"
        );
    }

    /// A task tower's losses replace its loss_type, each weighted by the
    /// first loss's weight (EasyRec's indexing), the tower's weight apart.
    #[test]
    fn tower_losses_take_the_first_weight_as_easyrec_does() {
        let m =
            model("losses { loss_type: CLASSIFICATION weight: 0.5 } losses { loss_type: PAIR_WISE_LOSS weight: 2.0 }");
        let fields = TowerFields {
            name: "ctr",
            label_name: None,
            metrics: &[],
            loss_type: proto::LossType::Classification,
            num_class: 1,
            dnn: None,
            weight: 3.0,
            task_space_indicator_label: None,
            losses: &m.losses,
            relation_tower_names: &[],
            relation_dnn: None,
            use_ait_module: false,
        };
        let (_, tasks) = task_towers(&[fields], "model_config.mmoe", &["label".to_string()]).unwrap();
        let t = &tasks[0];
        assert_eq!(t.weight, 3.0);
        let kinds: Vec<(LossTermKind, f32)> = t.terms.iter().map(|t| (t.kind, t.weight)).collect();
        assert_eq!(
            kinds,
            [
                (LossTermKind::CrossEntropy, 0.5),
                (
                    LossTermKind::PairWise {
                        margin: 0.0,
                        temperature: 1.0
                    },
                    0.5
                )
            ]
        );
        let learned = model("losses { loss_type: CLASSIFICATION learn_loss_weight: true }");
        let err = terms_of(&learned.losses, "x.losses", LossKind::BinaryClassification)
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.losses[0].learn_loss_weight"), "{err}");
    }
}
