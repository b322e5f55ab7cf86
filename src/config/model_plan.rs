//! `model_config`, typed: the model class, its feature groups, the
//! architecture block, the tasks it is trained for, and regularization.

use super::arch::arch;
use super::data_plan::DataPlan;
use super::eval_plan::Metric;
use super::feature_plan::FeaturePlan;
use super::tasks::{self, loss_kind, LossKind, Task};
use super::{proto, ConfigError};

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
        if model.ev_params.is_some() {
            return Err(ConfigError::unsupported(
                "model_config.ev_params",
                "key-value embedding variables",
            ));
        }
        let groups = super::groups::resolve(model, kind, features)?;
        let (arch, l2_regularization, multi) = arch(model, &data.label_fields)?;
        let mut tasks = model_tasks(model, kind, multi, &data.label_fields, eval_metrics)?;
        tasks::add_kd(model, &data.label_fields, &mut tasks)?;
        let in_batch_item = match tasks.iter().any(|t| t.in_batch()) {
            true => super::mind::in_batch_item(model, &data.fields)?,
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
                let ignore = super::mind::ignore_in_batch(model);
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    WideAndDeep,
    Dlrm,
    DeepFm,
    Fm,
    AutoInt,
    Dcn,
    MultiTower,
    /// MultiTower with DIN towers over `seq_att_groups`.
    MultiTowerDin,
    /// MultiTower with BST towers over `seq_att_groups`.
    MultiTowerBst,
    Mmoe,
    Dbmtl,
    /// A tower per task over the `all` group.
    SimpleMultiTask,
    Esmm,
    /// Progressive layered extraction.
    Ple,
    /// A `backbone` DAG with EasyRec's rank head.
    RankModel,
    /// A `backbone` DAG with task towers.
    MultiTaskModel,
    /// Two-tower retrieval.
    Dssm,
    /// Multi-interest retrieval: capsules over a behaviour sequence.
    Mind,
    /// Two-tower retrieval robust to missing preference features.
    DropoutNet,
    /// A `backbone` DAG whose two outputs are a match model's towers.
    MatchModel,
    /// A light network hinted by a booster.
    RocketLaunching,
    /// CMBF or Uniter: a multi-modal tower with EasyRec's rank head.
    Multimodal,
}

impl ModelKind {
    /// Whether the model ends in one output layer as wide as
    /// `model_config.num_class`, as EasyRec's single-task rank models do.
    pub fn has_class_head(self) -> bool {
        use ModelKind::*;
        matches!(
            self,
            WideAndDeep
                | Dlrm
                | DeepFm
                | AutoInt
                | Dcn
                | MultiTower
                | MultiTowerDin
                | MultiTowerBst
                | RankModel
                | Multimodal
        )
    }

    /// `model_config.model_class`.
    pub fn from_class(class: &str) -> Result<Self, ConfigError> {
        Ok(match class {
            "WideAndDeep" => ModelKind::WideAndDeep,
            "DLRM" => ModelKind::Dlrm,
            "DeepFM" => ModelKind::DeepFm,
            "FM" => ModelKind::Fm,
            "AutoInt" => ModelKind::AutoInt,
            "DCN" => ModelKind::Dcn,
            "MultiTower" => ModelKind::MultiTower,
            "MultiTowerDIN" => ModelKind::MultiTowerDin,
            "MultiTowerBST" => ModelKind::MultiTowerBst,
            "MMoE" => ModelKind::Mmoe,
            "ESMM" => ModelKind::Esmm,
            "DBMTL" => ModelKind::Dbmtl,
            "SimpleMultiTask" => ModelKind::SimpleMultiTask,
            "PLE" => ModelKind::Ple,
            "RankModel" => ModelKind::RankModel,
            "MultiTaskModel" => ModelKind::MultiTaskModel,
            // DSSM_SENet is DSSM with a SENet in each tower; DAT is DSSM
            // with augmented vectors.
            "DSSM" | "DSSM_SENet" | "DAT" => ModelKind::Dssm,
            "MIND" => ModelKind::Mind,
            "DropoutNet" => ModelKind::DropoutNet,
            "MatchModel" => ModelKind::MatchModel,
            "RocketLaunching" => ModelKind::RocketLaunching,
            "CMBF" | "Uniter" => ModelKind::Multimodal,
            other => {
                return Err(ConfigError::Unsupported {
                    path: "model_config.model_class".into(),
                    what: format!("model class `{other}`"),
                    hint: " (supported: WideAndDeep, DLRM, DeepFM, FM, AutoInt, DCN, MultiTower, MultiTowerDIN, MultiTowerBST, MMoE, ESMM, DBMTL, SimpleMultiTask, PLE, RankModel, MultiTaskModel, MatchModel, DSSM, DSSM_SENet, DAT, MIND, DropoutNet, RocketLaunching, CMBF, Uniter)".into(),
                })
            }
        })
    }
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Sigmoid,
    Tanh,
    Linear,
    /// `tf.nn.leaky_relu`: `x` above 0, `0.2 x` below.
    LeakyRelu,
    /// DIN's Dice (EasyRec's `dice`), a layer of its own with batch
    /// statistics and a parameter (`Op::Dice`): only DNN and MLP layers
    /// take it (`layer_activation`), and `Scope` builds it.
    Dice,
}

/// EasyRec's DNN block: dense -> batch norm (optional) -> activation -> dropout, per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct DnnSpec {
    pub hidden_units: Vec<usize>,
    pub dropout: Vec<f32>,
    pub activation: Activation,
    pub use_bn: bool,
}

/// Which feature groups feed a model, by index into the feature plan.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureGroup {
    pub name: String,
    pub features: Vec<usize>,
    pub wide: bool,
    /// Target attentions over behaviour sequences (EasyRec's
    /// `sequence_features`), appended to the group's features in order.
    pub seq: Vec<SeqAttention>,
}

/// One `sequence_features` entry of a feature group: DIN's target
/// attention of the key features' embeddings over the history sequences'
/// (EasyRec's `SequenceFeatureLayer.target_attention`). Keys and histories
/// of all its `seq_att_map`s are concatenated, as EasyRec does.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqAttention {
    /// The entry's `group_name`.
    pub name: String,
    /// Where the scoring network's layers live: `<scope>/dnn_i`.
    pub scope: String,
    pub keys: Vec<usize>,
    pub hist: Vec<usize>,
    /// Sequences pooled with the same attention weights (the last
    /// `seq_att_map`'s `aux_hist_seq`, as in EasyRec).
    pub aux: Vec<usize>,
    /// The attention's scoring network; its last layer has one unit and
    /// neither batch norm nor activation.
    pub dnn: DnnSpec,
    pub need_key_feature: bool,
    pub allow_key_transform: bool,
    pub transform_dnn: bool,
    /// MultiTowerBST's tower instead of a DIN attention: a transformer
    /// block over the history and the key.
    pub bst: Option<Bst>,
    /// No attention: the histories are what a backbone input layer with
    /// `output_seq_and_normal_feature` hands its blocks (no keys, no
    /// scoring network).
    pub input_only: bool,
}

impl SeqAttention {
    /// The unpooled sequences `hist` of group `group`, for a backbone
    /// input layer (`output_seq_and_normal_feature`).
    pub fn input(group: &str, hist: Vec<usize>) -> Self {
        SeqAttention {
            name: group.to_string(),
            scope: String::new(),
            keys: Vec::new(),
            hist,
            aux: Vec::new(),
            dnn: DnnSpec {
                hidden_units: Vec::new(),
                dropout: Vec::new(),
                activation: Activation::Linear,
                use_bn: false,
            },
            need_key_feature: false,
            allow_key_transform: false,
            transform_dnn: false,
            bst: None,
            input_only: true,
        }
    }
}

/// One of MultiTowerBST's `bst_towers`: the history cut or padded to
/// `seq_len - 1` positions, the key after them, through EasyRec's
/// transformer block of `heads` heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bst {
    pub seq_len: usize,
    pub heads: usize,
}

/// How a match model compares its towers: the cosine (both L2-normalised,
/// divided by `temperature`) or the inner product, then scaled by
/// `|sim_w|` and shifted by `sim_b` with `scale_simi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Similarity {
    pub cosine: bool,
    pub temperature: f32,
    pub scale_simi: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interaction {
    Dot,
    Cat,
}

/// DSSM_SENet's `(reduction_ratio, num_squeeze_group)`, user's then item's.
pub type SenetParams = [(usize, usize); 2];

#[derive(Debug, Clone, PartialEq)]
pub enum Arch {
    WideAndDeep {
        wide_output_dim: usize,
        dnn: DnnSpec,
        final_dnn: Option<DnnSpec>,
    },
    Dlrm {
        bot: DnnSpec,
        top: DnnSpec,
        interaction: Interaction,
        itself: bool,
        with_dense: bool,
    },
    DeepFm {
        wide_output_dim: usize,
        dnn: DnnSpec,
        final_dnn: Option<DnnSpec>,
    },
    /// EasyRec's FM: the wide side's sum, the FM term over the `deep`
    /// group's embeddings summed, and `fm_bias`.
    Fm,
    /// AutoInt: the `all` group's embeddings as fields, `layers`
    /// interacting layers of multi-head self-attention (`heads` heads of
    /// `head_size` columns, a residual projection, ReLU), then `output`.
    AutoInt {
        heads: usize,
        head_size: usize,
        layers: usize,
    },
    /// CMBF or Uniter: the multi-modal tower over the groups `image`,
    /// `general`, `text` (its sequences unpooled) and `other`, then
    /// `final_dnn` and `output`.
    Multimodal {
        tower: super::multimodal::Tower,
        final_dnn: DnnSpec,
    },
    Dcn {
        deep_input: String,
        deep: DnnSpec,
        cross_input: String,
        cross_num: usize,
        final_dnn: DnnSpec,
    },
    MultiTower {
        towers: Vec<(String, DnnSpec)>,
        /// MultiTowerDIN's DIN towers or MultiTowerBST's BST towers: groups
        /// whose features are a sequence layer's output (a DIN target
        /// attention or a BST transformer), concatenated as they are.
        seq_towers: Vec<String>,
        final_dnn: DnnSpec,
    },
    /// Multi-gate mixture of experts: experts over one group, a softmax
    /// gate per task mixing them, a tower per task. Without experts, each
    /// tower reads the group itself (EasyRec's SimpleMultiTask).
    Mmoe {
        experts: Vec<DnnSpec>,
        towers: Vec<TaskTower>,
    },
    /// ESMM: each of `groups` (a feature group and its DNN) or, without
    /// them, the `all` group, concatenated, feeds the CVR and the CTR tower
    /// (a DNN, then `<tower>/dnn_output`); `logits_ctcvr` is the logit of
    /// their probabilities' product. `labels`: the CVR and CTR tasks' label
    /// fields, whose product the CTCVR task trains on.
    Esmm {
        groups: Vec<(String, DnnSpec)>,
        cvr: TaskTower,
        ctr: TaskTower,
        labels: (usize, usize),
    },
    /// Progressive layered extraction over the `all` group: per level,
    /// experts of each task and shared experts, each task's gate mixing
    /// its own and the shared ones (and, below the last level, a shared
    /// gate mixing all of them for the next level's shared experts); a
    /// tower per task over its last mixture.
    Ple {
        levels: Vec<PleLevel>,
        towers: Vec<TaskTower>,
    },
    /// Deep Bayesian multi-task learning: an optional shared bottom DNN,
    /// optional MMoE experts, a tower per task and relation DNNs that feed
    /// each task the relation outputs of the tasks it depends on.
    Dbmtl {
        /// A multi-modal tower instead of the `all` group (`bottom_cmbf`,
        /// `bottom_uniter`; `bottom` is then none, as EasyRec leaves it out).
        multimodal: Option<super::multimodal::Tower>,
        bottom: Option<DnnSpec>,
        experts: Vec<DnnSpec>,
        towers: Vec<TaskTower>,
    },
    /// RankModel: EasyRec's `backbone` block DAG, then a one-logit `output`
    /// layer unless the backbone already ends in one column.
    Backbone(super::backbone::Backbone),
    /// MultiTaskModel: the backbone, then DBMTL's task towers (DNN, relation
    /// DNN, output) over its output, or over one output each when it ends
    /// in a list.
    MultiTaskBackbone {
        backbone: super::backbone::Backbone,
        towers: Vec<TaskTower>,
    },
    /// MatchModel: the backbone's outputs `user` and `item` (indices into
    /// its output list) as the towers, compared as DSSM's are.
    MatchBackbone {
        backbone: super::backbone::Backbone,
        user: usize,
        item: usize,
        sim: Similarity,
    },
    /// DSSM: the `user` and `item` groups through a DNN each (the last
    /// layer linear), L2-normalised for the cosine, and their similarity
    /// divided by the temperature, then scaled by `|sim_w|` and shifted by
    /// `sim_b` with `scale_simi`.
    Dssm {
        user: DnnSpec,
        item: DnnSpec,
        sim: Similarity,
        /// DSSM_SENet: each tower's features first go through a SENet
        /// (`reduction_ratio`, `num_squeeze_group`), user's then item's.
        senet: Option<SenetParams>,
        /// DAT: each tower also reads its side's `<side>_id_augment` group,
        /// whose vector learns to mimic the other tower's output: the
        /// weights of `amm_loss_u` and `amm_loss_i`.
        amm: Option<[f32; 2]>,
    },
    /// MIND (`config::mind::Mind`) over the `hist`, `user` and `item` groups.
    Mind(Box<super::mind::Mind>),
    /// DropoutNet: per side (user, item) the `<side>_content` group through
    /// its DNN and the `<side>_preference` group, each row dropped whole
    /// with the side's rate in training, through its own; both outputs
    /// (of the groups the model has) through the side's tower, its last
    /// layer linear; the L2-normalised embeddings' inner product.
    DropoutNet { user: DropoutTower, item: DropoutTower },
    /// RocketLaunching over the `all` group: `share` DNN, then the
    /// `booster` DNN and, on the shared output cut from the gradient, the
    /// `light` one, each into its own output layer (tasks `booster` and
    /// `light`); the light logits are hinted by the booster's (their mean
    /// squared difference, the booster's cut from the gradient) and with
    /// `feature_based` each light hidden layer by the first booster layer
    /// of its width.
    RocketLaunching {
        share: DnnSpec,
        booster: DnnSpec,
        light: DnnSpec,
        feature_based: bool,
    },
}

/// One side of DropoutNet.
#[derive(Debug, Clone, PartialEq)]
pub struct DropoutTower {
    pub content: DnnSpec,
    pub preference: DnnSpec,
    pub tower: DnnSpec,
    pub dropout: f32,
}

/// One of PLE's `extraction_networks`.
#[derive(Debug, Clone, PartialEq)]
pub struct PleLevel {
    pub name: String,
    pub per_task: usize,
    pub task_net: DnnSpec,
    /// The shared experts' count and network.
    pub shared: usize,
    pub share_net: Option<DnnSpec>,
}

/// A task tower's layers (its label, loss and metrics are a `tasks::Task`).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskTower {
    pub name: String,
    pub dnn: Option<DnnSpec>,
    /// DBMTL: the DNN over this tower's output and its relation towers'.
    pub relation_dnn: Option<DnnSpec>,
    /// Indices of the earlier towers this one depends on.
    pub relations: Vec<usize>,
    /// The tower's logits per row (its task's `logit_width`).
    pub logits: usize,
}

/// An activation as EasyRec names it (`relu`, `tf.nn.relu`, ...), at `path`.
pub fn activation(name: &str, path: &str) -> Result<Activation, ConfigError> {
    Ok(match name.trim_start_matches("tf.nn.").trim_start_matches("tf.") {
        "relu" => Activation::Relu,
        "sigmoid" => Activation::Sigmoid,
        "tanh" => Activation::Tanh,
        "leaky_relu" => Activation::LeakyRelu,
        "" | "linear" | "None" | "none" => Activation::Linear,
        other => {
            return Err(ConfigError::unsupported(
                path,
                format!("activation `{other}` (supported: relu, leaky_relu, sigmoid, tanh, linear)"),
            ))
        }
    })
}

/// A DNN or MLP layer's activation: `activation`'s, or `dice`.
pub fn layer_activation(name: &str, path: &str) -> Result<Activation, ConfigError> {
    match name {
        "dice" | "Dice" => Ok(Activation::Dice),
        other => activation(other, path),
    }
}

pub fn dnn(d: &proto::Dnn, path: &str) -> Result<DnnSpec, ConfigError> {
    let activation = layer_activation(d.activation(), &format!("{path}.activation"))?;
    if !d.dropout_ratio.is_empty() && d.dropout_ratio.len() != d.hidden_units.len() {
        return Err(ConfigError::invalid(
            format!("{path}.dropout_ratio"),
            format!(
                "has {} values for {} hidden_units",
                d.dropout_ratio.len(),
                d.hidden_units.len()
            ),
        ));
    }
    for &r in &d.dropout_ratio {
        super::validate::rate(r, format!("{path}.dropout_ratio"))?;
    }
    if d.hidden_units.contains(&0) {
        return Err(ConfigError::invalid(
            format!("{path}.hidden_units"),
            "a layer of width 0",
        ));
    }
    Ok(DnnSpec {
        hidden_units: d.hidden_units.iter().map(|u| *u as usize).collect(),
        dropout: d.dropout_ratio.clone(),
        activation,
        use_bn: d.use_bn(),
    })
}

/// A DNN whose last layer is an embedding a match model compares (`path`:
/// where `d` sits): it needs a layer.
pub fn embedding_dnn(d: &proto::Dnn, path: &str) -> Result<DnnSpec, ConfigError> {
    let spec = dnn(d, path)?;
    if spec.hidden_units.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.hidden_units"),
            "its last layer is the embedding compared: it needs at least one layer",
        ));
    }
    Ok(spec)
}

/// The embeddings of `a` and `b` are compared, so their last layers must be
/// equally wide (`path`: `b`'s hidden_units, named in the error).
pub fn comparable(a: &DnnSpec, b: &DnnSpec, path: &str) -> Result<(), ConfigError> {
    let (x, y) = (a.hidden_units.last(), b.hidden_units.last());
    if x != y {
        return Err(ConfigError::invalid(
            path,
            format!(
                "the embeddings compared must be equally wide, and the last layers are {} and {}",
                x.unwrap_or(&0),
                y.unwrap_or(&0)
            ),
        ));
    }
    Ok(())
}
