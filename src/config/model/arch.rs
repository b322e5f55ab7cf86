//! EasyRec's model blocks (`model_config.wide_and_deep`, `dlrm`, `mmoe`,
//! ...) as the typed architecture the model builders read.

use super::layers::{
    comparable, dnn, embedding_dnn, DnnSpec, DropoutTower, Interaction, PleLevel, SenetParams, Similarity, TaskTower,
};
use super::tasks::{task_towers, Task, TowerFields};
use crate::config::{proto, ConfigError};

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
    /// MIND (`config::model::mind::Mind`) over the `hist`, `user` and `item` groups.
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

impl Arch {
    /// The backbone of a RankModel, MultiTaskModel or MatchModel.
    pub fn backbone_mut(&mut self) -> Option<&mut super::backbone::Backbone> {
        match self {
            Arch::Backbone(b)
            | Arch::MultiTaskBackbone { backbone: b, .. }
            | Arch::MatchBackbone { backbone: b, .. } => Some(b),
            _ => None,
        }
    }

    /// The backbone of a RankModel, MultiTaskModel or MatchModel.
    pub fn backbone(&self) -> Option<&super::backbone::Backbone> {
        match self {
            Arch::Backbone(b)
            | Arch::MultiTaskBackbone { backbone: b, .. }
            | Arch::MatchBackbone { backbone: b, .. } => Some(b),
            _ => None,
        }
    }
}

/// The architecture block, its l2_regularization and, for multi-task
/// models, their tasks.
pub fn arch(
    model: &proto::EasyRecModel,
    label_fields: &[String],
) -> Result<(Arch, f32, Option<Vec<Task>>), ConfigError> {
    use proto::easy_rec_model::Model as M;
    let m = "model_config";
    if model.backbone.is_some()
        && !matches!(
            model.model_class.as_str(),
            "RankModel" | "MultiTaskModel" | "MatchModel"
        )
    {
        return Err(ConfigError::unsupported(
            format!("{m}.backbone"),
            format!(
                "a backbone on model class {} (RankModel, MultiTaskModel and MatchModel run backbones)",
                model.model_class
            ),
        ));
    }
    let experts = |expert_dnn: Option<&proto::Dnn>, num: u32, path: &str| -> Result<Vec<DnnSpec>, ConfigError> {
        match expert_dnn {
            Some(_) if num == 0 => Err(ConfigError::invalid(
                format!("{path}.num_expert"),
                "expert_dnn is set, so num_expert must be above 0",
            )),
            Some(d) => Ok(vec![dnn(d, &format!("{path}.expert_dnn"))?; num as usize]),
            None => Ok(Vec::new()),
        }
    };
    Ok(match &model.model {
        Some(M::Mmoe(x)) => {
            let path = format!("{m}.mmoe");
            let mut ex = experts(x.expert_dnn.as_ref(), x.num_expert(), &path)?;
            if ex.is_empty() {
                ex = x
                    .experts
                    .iter()
                    .enumerate()
                    .map(|(i, e)| dnn(&e.dnn, &format!("{path}.experts[{i}].dnn")))
                    .collect::<Result<_, _>>()?;
            }
            if ex.is_empty() {
                return Err(ConfigError::invalid(
                    path,
                    "MMoE needs expert_dnn with num_expert, or experts",
                ));
            }
            let fields: Vec<TowerFields> = x.task_towers.iter().map(TowerFields::from).collect();
            let (towers, tasks) = task_towers(&fields, &path, label_fields)?;
            (Arch::Mmoe { experts: ex, towers }, x.l2_regularization, Some(tasks))
        }
        Some(M::Esmm(x)) => {
            let path = format!("{m}.esmm");
            let (arch, tasks) = esmm(x, &path, label_fields, model.backbone.is_some())?;
            (arch, x.l2_regularization, Some(tasks))
        }
        Some(M::Ple(x)) => {
            let path = format!("{m}.ple");
            if model.backbone.is_some() {
                return Err(ConfigError::unsupported(
                    "model_config.backbone",
                    "PLE over a backbone (use model_class MultiTaskModel)",
                ));
            }
            if x.extraction_networks.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.extraction_networks"),
                    "PLE needs at least one extraction network",
                ));
            }
            let levels = x
                .extraction_networks
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let p = format!("{path}.extraction_networks[{i}]");
                    if n.expert_num_per_task == 0 {
                        return Err(ConfigError::invalid(
                            format!("{p}.expert_num_per_task"),
                            "each task needs at least one expert",
                        ));
                    }
                    let share_net = match (&n.share_expert_net, n.share_num()) {
                        (_, 0) => None,
                        (Some(d), _) => Some(dnn(d, &format!("{p}.share_expert_net"))?),
                        (None, _) => {
                            return Err(ConfigError::invalid(
                                format!("{p}.share_expert_net"),
                                "share_num is set, so the shared experts need share_expert_net",
                            ))
                        }
                    };
                    Ok(PleLevel {
                        name: n.network_name.clone(),
                        per_task: n.expert_num_per_task as usize,
                        task_net: dnn(&n.task_expert_net, &format!("{p}.task_expert_net"))?,
                        shared: if share_net.is_some() { n.share_num() as usize } else { 0 },
                        share_net,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Vec<TowerFields> = x.task_towers.iter().map(TowerFields::from).collect();
            let (towers, tasks) = task_towers(&fields, &path, label_fields)?;
            (Arch::Ple { levels, towers }, x.l2_regularization(), Some(tasks))
        }
        Some(M::SimpleMultiTask(x)) => {
            let path = format!("{m}.simple_multi_task");
            if model.backbone.is_some() {
                return Err(ConfigError::unsupported(
                    "model_config.backbone",
                    "SimpleMultiTask over a backbone (use model_class MultiTaskModel)",
                ));
            }
            let fields: Vec<TowerFields> = x.task_towers.iter().map(TowerFields::from).collect();
            let (towers, tasks) = task_towers(&fields, &path, label_fields)?;
            let arch = Arch::Mmoe {
                experts: Vec::new(),
                towers,
            };
            (arch, x.l2_regularization, Some(tasks))
        }
        Some(M::ModelParams(p)) if model.model_class == "MultiTaskModel" => {
            let path = format!("{m}.model_params");
            let b = model
                .backbone
                .as_ref()
                .ok_or_else(|| ConfigError::invalid(format!("{m}.backbone"), "MultiTaskModel needs a backbone"))?;
            if !p.outputs.is_empty() {
                return Err(ConfigError::unsupported(
                    format!("{path}.outputs"),
                    "`outputs` on a MultiTaskModel",
                ));
            }
            let fields: Vec<TowerFields> = p.task_towers.iter().map(TowerFields::from).collect();
            let (towers, tasks) = task_towers(&fields, &path, label_fields)?;
            let backbone = super::backbone::backbone(b, &group_names(model), &format!("{m}.backbone"))?;
            (
                Arch::MultiTaskBackbone { backbone, towers },
                p.l2_regularization(),
                Some(tasks),
            )
        }
        Some(M::Dbmtl(x)) => {
            let path = format!("{m}.dbmtl");
            let fields: Vec<TowerFields> = x.task_towers.iter().map(TowerFields::from).collect();
            let (towers, tasks) = task_towers(&fields, &path, label_fields)?;
            let multimodal = super::multimodal::dbmtl_bottom(x, &path)?;
            if multimodal.is_some() && x.bottom_dnn.is_some() {
                log::warn!("{path}.bottom_dnn is left out: the multi-modal bottom replaces it, as in EasyRec");
            }
            (
                Arch::Dbmtl {
                    bottom: x
                        .bottom_dnn
                        .as_ref()
                        .filter(|_| multimodal.is_none())
                        .map(|d| dnn(d, &format!("{path}.bottom_dnn")))
                        .transpose()?,
                    multimodal,
                    experts: experts(x.expert_dnn.as_ref(), x.num_expert(), &path)?,
                    towers,
                },
                x.l2_regularization(),
                Some(tasks),
            )
        }
        Some(M::RocketLaunching(x)) => {
            let (arch, tasks) = rocket_launching(x, model)?;
            (arch, x.l2_regularization(), Some(tasks))
        }
        other => {
            let (a, l2) = single_task_arch(other.as_ref(), model)?;
            (a, l2, None)
        }
    })
}

/// RocketLaunching's layers and its two tasks, `booster` and `light`, both
/// trained by CLASSIFICATION on the first label field, as EasyRec's are.
fn rocket_launching(x: &proto::RocketLaunching, model: &proto::EasyRecModel) -> Result<(Arch, Vec<Task>), ConfigError> {
    let path = "model_config.rocket_launching";
    if model.loss_type() != proto::LossType::Classification {
        return Err(ConfigError::unsupported(
            "model_config.loss_type",
            format!(
                "RocketLaunching with {} (it trains CLASSIFICATION)",
                model.loss_type().as_str_name()
            ),
        ));
    }
    for (field, set) in [
        ("losses", !model.losses.is_empty()),
        ("kd", !model.kd.is_empty()),
        ("label_name", model.label_name.is_some()),
    ] {
        if set {
            return Err(ConfigError::unsupported(
                format!("model_config.{field}"),
                "RocketLaunching's own losses on the first label field (EasyRec builds no other)",
            ));
        }
    }
    if x.feature_based_distillation() {
        log::warn!(
            "{path}.feature_based_distillation: as in EasyRec, each light hidden layer's Euclidean distance \
             to the booster's (not feature_distillation_function) joins the loss times -0.1, pushing them apart"
        );
    }
    let loss = super::tasks::loss_kind(proto::LossType::Classification, model.num_class(), "model_config")?;
    let tasks = ["booster", "light"]
        .into_iter()
        .map(|name| Task::on_label(name, 0, loss))
        .collect();
    let arch = Arch::RocketLaunching {
        share: dnn(&x.share_dnn, &format!("{path}.share_dnn"))?,
        booster: dnn(&x.booster_dnn, &format!("{path}.booster_dnn"))?,
        light: dnn(&x.light_dnn, &format!("{path}.light_dnn"))?,
        feature_based: x.feature_based_distillation(),
    };
    Ok((arch, tasks))
}

/// Whether an optional DNN has hidden layers.
fn has_layers(d: Option<&proto::Dnn>) -> bool {
    d.is_some_and(|d| !d.hidden_units.is_empty())
}

fn single_task_arch(
    block: Option<&proto::easy_rec_model::Model>,
    model: &proto::EasyRecModel,
) -> Result<(Arch, f32), ConfigError> {
    use proto::easy_rec_model::Model as M;
    let m = "model_config";
    Ok(match block {
        Some(M::WideAndDeep(w)) => (
            Arch::WideAndDeep {
                // EasyRec's WideAndDeep without final_dnn adds the wide side
                // to the logits, so it makes it one column per class.
                wide_output_dim: if has_layers(w.final_dnn.as_ref()) {
                    w.wide_output_dim as usize
                } else {
                    let classes = model.num_class().max(1);
                    if w.wide_output_dim != classes {
                        log::warn!(
                            "{m}.wide_and_deep.wide_output_dim: {} is replaced by num_class ({classes}) without final_dnn, as EasyRec does",
                            w.wide_output_dim
                        );
                    }
                    classes as usize
                },
                dnn: dnn(&w.dnn, &format!("{m}.wide_and_deep.dnn"))?,
                // A final_dnn without layers is none, as EasyRec reads it.
                final_dnn: w
                    .final_dnn
                    .as_ref()
                    .filter(|d| !d.hidden_units.is_empty())
                    .map(|d| dnn(d, &format!("{m}.wide_and_deep.final_dnn")))
                    .transpose()?,
            },
            w.l2_regularization(),
        ),
        Some(M::Dlrm(d)) => {
            let interaction = match d.arch_interaction_op() {
                "dot" => Interaction::Dot,
                "cat" => Interaction::Cat,
                other => {
                    return Err(ConfigError::invalid(
                        format!("{m}.dlrm.arch_interaction_op"),
                        format!("`{other}` is neither \"dot\" nor \"cat\""),
                    ))
                }
            };
            (
                Arch::Dlrm {
                    bot: dnn(&d.bot_dnn, &format!("{m}.dlrm.bot_dnn"))?,
                    top: dnn(&d.top_dnn, &format!("{m}.dlrm.top_dnn"))?,
                    interaction,
                    itself: d.arch_interaction_itself(),
                    with_dense: d.arch_with_dense_feature(),
                },
                d.l2_regularization(),
            )
        }
        Some(M::Fm(f)) => {
            if f.use_variant() {
                // EasyRec's FM model builds its FM term with the classic layer,
                // which has no variant: the field only reaches backbone FM blocks.
                log::warn!("{m}.fm.use_variant: EasyRec's FM model does not read it, and neither does this trainer");
            }
            (Arch::Fm, f.l2_regularization())
        }
        // CMBF and Uniter have no l2_regularization of their own.
        Some(x @ (M::Cmbf(_) | M::Uniter(_))) => {
            let (tower, final_dnn) = super::multimodal::model(x, m).expect("a multi-modal model")?;
            (Arch::Multimodal { tower, final_dnn }, 0.0)
        }
        Some(M::Autoint(a)) => {
            for (field, v) in [
                ("multi_head_num", a.multi_head_num),
                ("multi_head_size", a.multi_head_size),
                ("interacting_layer_num", a.interacting_layer_num),
            ] {
                if v == 0 {
                    return Err(ConfigError::invalid(
                        format!("{m}.autoint.{field}"),
                        "must be at least 1",
                    ));
                }
            }
            (
                Arch::AutoInt {
                    heads: a.multi_head_num as usize,
                    head_size: a.multi_head_size as usize,
                    layers: a.interacting_layer_num as usize,
                },
                a.l2_regularization,
            )
        }
        Some(M::Deepfm(d)) => (
            Arch::DeepFm {
                wide_output_dim: d.wide_output_dim() as usize,
                dnn: dnn(&d.dnn, &format!("{m}.deepfm.dnn"))?,
                final_dnn: d
                    .final_dnn
                    .as_ref()
                    .filter(|d| !d.hidden_units.is_empty())
                    .map(|x| dnn(x, &format!("{m}.deepfm.final_dnn")))
                    .transpose()?,
            },
            d.l2_regularization(),
        ),
        Some(M::Dcn(d)) => (
            Arch::Dcn {
                deep_input: d.deep_tower.input.clone(),
                deep: dnn(&d.deep_tower.dnn, &format!("{m}.dcn.deep_tower.dnn"))?,
                cross_input: d.cross_tower.input.clone(),
                cross_num: d.cross_tower.cross_num as usize,
                final_dnn: dnn(&d.final_dnn, &format!("{m}.dcn.final_dnn"))?,
            },
            d.l2_regularization,
        ),
        Some(M::MultiTower(t)) => multi_tower(t, model)?,
        Some(M::ModelParams(p)) if model.model_class == "RankModel" => {
            (Arch::Backbone(single_task_backbone(model, p)?), p.l2_regularization())
        }
        Some(M::ModelParams(p)) if model.model_class == "MatchModel" => match_backbone(p, model)?,
        Some(M::DssmSenet(d)) => dssm_senet(d)?,
        Some(M::Dat(d)) => dat(d, model, &format!("{m}.dat"))?,
        Some(M::Dssm(d)) => {
            let classification = model.loss_type() == proto::LossType::Classification;
            dssm(d, &format!("{m}.dssm"), Normalise::ReleaseRule { classification })?
        }
        Some(M::Mind(d)) => {
            let (mind, l2) = super::mind::mind(d, model, &format!("{m}.mind"))?;
            (Arch::Mind(Box::new(mind)), l2)
        }
        Some(M::Dropoutnet(d)) => dropoutnet(d, &format!("{m}.dropoutnet"))?,
        _ if matches!(
            model.model_class.as_str(),
            "RankModel" | "MultiTaskModel" | "MatchModel"
        ) =>
        {
            return Err(ConfigError::invalid(
                m,
                format!("{} needs `model_params` and a `backbone`", model.model_class),
            ))
        }
        _ => {
            return Err(ConfigError::invalid(
                m,
                format!("model_class {} needs its parameter block", model.model_class),
            ))
        }
    })
}

/// ESMM's architecture and tasks: the CTCVR task (`probs_ctcvr` against
/// the product of the CVR and CTR labels, weighted as the CVR tower) and
/// the CTR task, both summed over the batch as EasyRec's losses are, then
/// the CVR tower evaluated only where the CTR label is positive
/// (`auc_cvr_masked`). The CTCVR label is label field `label_fields.len()`.
fn esmm(
    x: &proto::Esmm,
    path: &str,
    label_fields: &[String],
    backbone: bool,
) -> Result<(Arch, Vec<Task>), ConfigError> {
    if backbone {
        return Err(ConfigError::unsupported(
            "model_config.backbone",
            "ESMM over a backbone",
        ));
    }
    let groups = x
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| Ok((g.input.clone(), dnn(&g.dnn, &format!("{path}.groups[{i}].dnn"))?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    // EasyRec's tower order: the CVR (main) tower, then the CTR one.
    let fields = [TowerFields::from(&x.cvr_tower), TowerFields::from(&x.ctr_tower)];
    for (t, name) in [(&x.cvr_tower, "cvr_tower"), (&x.ctr_tower, "ctr_tower")] {
        if t.loss_type() != proto::LossType::Classification {
            return Err(ConfigError::unsupported(
                format!("{path}.{name}.loss_type"),
                format!("an ESMM tower trained by {}", t.loss_type().as_str_name()),
            ));
        }
        if !t.losses.is_empty() {
            return Err(ConfigError::unsupported(
                format!("{path}.{name}.losses"),
                "a losses list on an ESMM tower (EasyRec's ESMM trains loss_type)",
            ));
        }
        if t.dnn.is_none() {
            return Err(ConfigError::invalid(
                format!("{path}.{name}.dnn"),
                "an ESMM tower needs its dnn",
            ));
        }
    }
    let (mut towers, tasks) = task_towers(&fields, path, label_fields)?;
    let (ctr, cvr) = (towers.pop().expect("two towers"), towers.pop().expect("two towers"));
    let [cvr_task, ctr_task]: [Task; 2] = tasks.try_into().expect("two tasks");
    let labels = (cvr_task.label, ctr_task.label);
    let ctcvr = Task {
        name: "ctcvr".into(),
        label: label_fields.len(),
        summed: true,
        ..cvr_task.clone()
    };
    let masked = Task {
        weight: 0.0,
        masked_by: Some(ctr_task.label),
        ..cvr_task
    };
    let ctr_task = Task {
        summed: true,
        ..ctr_task
    };
    Ok((
        Arch::Esmm {
            groups,
            cvr,
            ctr,
            labels,
        },
        vec![ctcvr, ctr_task, masked],
    ))
}

/// DropoutNet's sides (`path`: where `d` sits in the config).
fn dropoutnet(d: &proto::DropoutNet, path: &str) -> Result<(Arch, f32), ConfigError> {
    let side = |name: &str, content: &proto::Dnn, preference: &proto::Dnn, tower: &proto::Dnn, rate: f32| {
        let tower = dnn(tower, &format!("{path}.{name}_tower"))?;
        if tower.hidden_units.is_empty() {
            return Err(ConfigError::invalid(
                format!("{path}.{name}_tower.hidden_units"),
                "the tower's last layer is its embedding: it needs at least one layer",
            ));
        }
        crate::config::validate::rate(rate, format!("{path}.{name}_dropout_rate"))?;
        Ok(DropoutTower {
            content: dnn(content, &format!("{path}.{name}_content"))?,
            preference: dnn(preference, &format!("{path}.{name}_preference"))?,
            tower,
            dropout: rate,
        })
    };
    let user = side(
        "user",
        &d.user_content,
        &d.user_preference,
        &d.user_tower,
        d.user_dropout_rate,
    )?;
    let item = side(
        "item",
        &d.item_content,
        &d.item_preference,
        &d.item_tower,
        d.item_dropout_rate,
    )?;
    if user.tower.hidden_units.last() != item.tower.hidden_units.last() {
        return Err(ConfigError::invalid(
            format!("{path}.item_tower.hidden_units"),
            "the towers' last layers must be equally wide to be compared",
        ));
    }
    Ok((Arch::DropoutNet { user, item }, d.l2_regularization))
}

/// DAT as EasyRec builds it: DSSM's towers, always L2-normalised, their
/// similarity over `temperature` without a learned scale, trained by the
/// listwise SOFTMAX_CROSS_ENTROPY alone, plus the adaptive-mimic losses.
fn dat(d: &proto::Dat, model: &proto::EasyRecModel, path: &str) -> Result<(Arch, f32), ConfigError> {
    if model.loss_type() != proto::LossType::SoftmaxCrossEntropy {
        return Err(ConfigError::unsupported(
            "model_config.loss_type",
            format!(
                "DAT with {} (EasyRec's DAT trains SOFTMAX_CROSS_ENTROPY only)",
                model.loss_type().as_str_name()
            ),
        ));
    }
    let plain = proto::Dssm {
        user_tower: dssm_tower(&d.user_tower.id, &d.user_tower.dnn),
        item_tower: dssm_tower(&d.item_tower.id, &d.item_tower.dnn),
        l2_regularization: d.l2_regularization,
        simi_func: Some(proto::Similarity::Cosine as i32),
        scale_simi: Some(false),
        item_id: None,
        ignore_in_batch_neg_sam: d.ignore_in_batch_neg_sam,
        temperature: d.temperature,
    };
    dssm_variant(&plain, path, (None, Some([d.amm_u_weight, d.amm_i_weight])))
}

/// A DSSM tower of a model that is DSSM with more (DSSM_SENet, DAT).
fn dssm_tower(id: &str, dnn: &proto::Dnn) -> proto::DssmTower {
    proto::DssmTower {
        id: id.to_string(),
        dnn: dnn.clone(),
    }
}

/// DSSM's arch of `plain` with a variant's extras: DSSM_SENet's SENets,
/// DAT's mimic-loss weights.
fn dssm_variant(
    plain: &proto::Dssm,
    path: &str,
    (senet, amm): (Option<SenetParams>, Option<[f32; 2]>),
) -> Result<(Arch, f32), ConfigError> {
    let (arch, l2) = dssm(plain, path, Normalise::Always)?;
    let Arch::Dssm { user, item, sim, .. } = arch else {
        unreachable!("dssm builds a DSSM")
    };
    Ok((
        Arch::Dssm {
            user,
            item,
            sim,
            senet,
            amm,
        },
        l2,
    ))
}

/// When DSSM's `simi_func: COSINE` normalises the towers' outputs.
#[derive(Debug, Clone, Copy)]
enum Normalise {
    /// Later EasyRec (and its DSSM variants, DSSM_SENet and DAT, which
    /// the release lacks): always, the similarity then divided by
    /// `temperature`.
    Always,
    /// EasyRec 0.7.1, the release on PyPI, whose DSSM has no
    /// `temperature`: only for a CLASSIFICATION loss; a list-wise DSSM
    /// (SOFTMAX_CROSS_ENTROPY) compares the towers' raw outputs. Followed
    /// unless the config sets `temperature`, which only later EasyRec
    /// reads.
    ReleaseRule { classification: bool },
}

/// DSSM's towers and similarity (`path`: where `d` sits in the config).
fn dssm(d: &proto::Dssm, path: &str, normalise: Normalise) -> Result<(Arch, f32), ConfigError> {
    let user = embedding_dnn(&d.user_tower.dnn, &format!("{path}.user_tower.dnn"))?;
    let item = embedding_dnn(&d.item_tower.dnn, &format!("{path}.item_tower.dnn"))?;
    comparable(&user, &item, &format!("{path}.item_tower.dnn.hidden_units"))?;
    let mut cosine = d.simi_func() == proto::Similarity::Cosine;
    if let Normalise::ReleaseRule { classification: false } = normalise {
        if cosine && d.temperature.is_none() {
            log::warn!(
                "{path}.simi_func: COSINE without `temperature` on a list-wise DSSM compares the towers' raw \
                 outputs, as EasyRec 0.7.1 (the PyPI release) does; set `temperature` (later EasyRec's field) \
                 to normalise them"
            );
            cosine = false;
        }
    }
    let sim = Similarity {
        cosine,
        temperature: similarity_temperature(cosine, d.temperature(), path)?,
        scale_simi: d.scale_simi(),
    };
    Ok((
        Arch::Dssm {
            user,
            item,
            sim,
            senet: None,
            amm: None,
        },
        d.l2_regularization,
    ))
}

/// The typed backbone of a RankModel or MatchModel, which have no task
/// towers or extra outputs.
fn single_task_backbone(
    model: &proto::EasyRecModel,
    p: &proto::ModelParams,
) -> Result<super::backbone::Backbone, ConfigError> {
    let class = &model.model_class;
    let b = model
        .backbone
        .as_ref()
        .ok_or_else(|| ConfigError::invalid("model_config.backbone", format!("{class} needs a backbone")))?;
    for (field, set) in [
        ("outputs", !p.outputs.is_empty()),
        ("task_towers", !p.task_towers.is_empty()),
    ] {
        if set {
            return Err(ConfigError::unsupported(
                format!("model_config.model_params.{field}"),
                format!("`{field}` on a {class}"),
            ));
        }
    }
    super::backbone::backbone(b, &group_names(model), "model_config.backbone")
}

/// The temperature a match model divides its similarity by: `temperature`
/// for the cosine (EasyRec reads it only then), else 1.
fn similarity_temperature(cosine: bool, temperature: f32, path: &str) -> Result<f32, ConfigError> {
    let t = if cosine { temperature } else { 1.0 };
    if !(t.is_finite() && t > 0.0) {
        return Err(ConfigError::invalid(
            format!("{path}.temperature"),
            format!("{t} is not a positive number"),
        ));
    }
    Ok(t)
}

/// The feature groups' names, as blocks of a backbone name them.
fn group_names(model: &proto::EasyRecModel) -> Vec<String> {
    model
        .feature_groups
        .iter()
        .map(|g| g.group_name.clone().unwrap_or_else(|| "all".into()))
        .collect()
}

/// MultiTower's towers (and MultiTowerDIN's / MultiTowerBST's sequence towers).
fn multi_tower(t: &proto::MultiTower, model: &proto::EasyRecModel) -> Result<(Arch, f32), ConfigError> {
    let m = "model_config";
    let class = model.model_class.as_str();
    for (field, set, owner) in [
        ("din_towers", !t.din_towers.is_empty(), "MultiTowerDIN"),
        ("bst_towers", !t.bst_towers.is_empty(), "MultiTowerBST"),
    ] {
        if set && class != owner {
            log::warn!(
                "{m}.multi_tower.{field}: model class {class} reads no {field} ({owner} does); \
                         EasyRec's {class} ignores them, and so does this trainer"
            );
        }
    }
    let read = |owner: &str| class == owner;
    let towers = t
        .towers
        .iter()
        .enumerate()
        .map(|(i, tw)| {
            Ok((
                tw.input.clone(),
                dnn(&tw.dnn, &format!("{m}.multi_tower.towers[{i}].dnn"))?,
            ))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok((
        Arch::MultiTower {
            towers,
            seq_towers: t
                .din_towers
                .iter()
                .filter(|_| read("MultiTowerDIN"))
                .map(|d| d.input.clone())
                .chain(
                    t.bst_towers
                        .iter()
                        .filter(|_| read("MultiTowerBST"))
                        .map(|b| b.input.clone()),
                )
                .collect(),
            final_dnn: dnn(&t.final_dnn, &format!("{m}.multi_tower.final_dnn"))?,
        },
        t.l2_regularization,
    ))
}

/// A MatchModel's backbone with its user and item tower outputs.
fn match_backbone(p: &proto::ModelParams, model: &proto::EasyRecModel) -> Result<(Arch, f32), ConfigError> {
    let m = "model_config";
    let path = format!("{m}.model_params");
    let backbone = single_task_backbone(model, p)?;
    let index = |v: i32, field: &str| {
        usize::try_from(v).map_err(|_| ConfigError::invalid(format!("{path}.{field}"), format!("{v} is not an index")))
    };
    let (user, item) = (
        index(p.user_tower_idx_in_output(), "user_tower_idx_in_output")?,
        index(p.item_tower_idx_in_output(), "item_tower_idx_in_output")?,
    );
    let cosine = p.simi_func() == proto::Similarity::Cosine;
    let sim = Similarity {
        cosine,
        temperature: similarity_temperature(cosine, p.temperature(), &path)?,
        scale_simi: p.scale_simi(),
    };
    Ok((
        Arch::MatchBackbone {
            backbone,
            user,
            item,
            sim,
        },
        p.l2_regularization(),
    ))
}

/// DSSM_SENet: DSSM with a SENet over each tower's inputs.
fn dssm_senet(d: &proto::DssmSeNet) -> Result<(Arch, f32), ConfigError> {
    let m = "model_config";
    let path = format!("{m}.dssm_senet");
    let senet = |t: &proto::DssmSeNetTower, name: &str| -> Result<(usize, usize), ConfigError> {
        let (r, g) = (t.senet.reduction_ratio as usize, t.senet.num_squeeze_group() as usize);
        if r == 0 || g == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.{name}.senet"),
                "reduction_ratio and num_squeeze_group must be at least 1",
            ));
        }
        Ok((r, g))
    };
    let senets = [senet(&d.user_tower, "user_tower")?, senet(&d.item_tower, "item_tower")?];
    let plain = proto::Dssm {
        user_tower: dssm_tower(&d.user_tower.id, &d.user_tower.dnn),
        item_tower: dssm_tower(&d.item_tower.id, &d.item_tower.dnn),
        l2_regularization: d.l2_regularization,
        simi_func: d.simi_func,
        scale_simi: d.scale_simi,
        item_id: d.item_id.clone(),
        ignore_in_batch_neg_sam: d.ignore_in_batch_neg_sam,
        temperature: d.temperature,
    };
    dssm_variant(&plain, &path, (Some(senets), None))
}
