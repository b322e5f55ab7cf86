//! A model's feature groups: each group's features by index into the
//! feature plan, its sequence layers, and the groups a model reads as
//! unpooled sequences.

use super::kind::ModelKind;
use super::layers::{dnn, Activation, DnnSpec};
use crate::config::feature_plan::{FeatureKind, FeaturePlan, FeatureSpec};
use crate::config::{proto, ConfigError};

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

/// The feature groups of `model` (of class `kind`) over `features`, with
/// MultiTowerDIN's and MultiTowerBST's sequence towers, and the sequences
/// a backbone input layer, MIND or a multi-modal tower reads unpooled
/// taken out of their groups' pooled features.
pub fn resolve(
    model: &proto::EasyRecModel,
    kind: ModelKind,
    features: &FeaturePlan,
) -> Result<Vec<FeatureGroup>, ConfigError> {
    let names = features.names();
    let mut groups = groups(model, &names)?;
    groups.extend(seq_tower_groups(model, &names)?);
    // A group a backbone input layer reads with
    // output_seq_and_normal_feature keeps its sequences unpooled.
    let seq_inputs = model
        .backbone
        .as_ref()
        .map(super::backbone::seq_input_groups)
        .unwrap_or_default();
    for g in groups.iter_mut().filter(|g| seq_inputs.contains(&g.name)) {
        let (seqs, plain): (Vec<usize>, Vec<usize>) = g
            .features
            .iter()
            .partition(|&&fi| matches!(features[fi].kind, FeatureKind::Sequence { combiner: None, .. }));
        if seqs.is_empty() {
            return Err(ConfigError::invalid(
                format!("model_config.feature_groups ({})", g.name),
                "output_seq_and_normal_feature reads a group's sequence features, and this one has none",
            ));
        }
        g.features = plain;
        g.seq.push(SeqAttention::input(&g.name, seqs));
    }
    // MIND reads its `hist` group's sequences unpooled, on the first
    // one's length.
    if kind == ModelKind::Mind {
        if let Some((g, seqs)) = unpooled_sequences(&mut groups, "hist", features, ("MIND", ""))? {
            g.seq.push(SeqAttention::input(&g.name, seqs));
        }
    }
    // A multi-modal tower reads its `text` group's sequences unpooled,
    // each with its own length.
    if super::multimodal::reads_text_unpooled(model) {
        let reader = ("the multi-modal tower", " (EasyRec would leave it out)");
        if let Some((g, seqs)) = unpooled_sequences(&mut groups, "text", features, reader)? {
            for fi in seqs {
                g.seq.push(SeqAttention::input(&g.name, vec![fi]));
            }
        }
    }
    // A SequenceFeature among a group's features is pooled by its
    // sequence_combiner; histories of `sequence_features` need none.
    for g in &groups {
        for &fi in &g.features {
            if let FeatureKind::Sequence { combiner, .. } = &features[fi].kind {
                let path = format!("{}.sequence_combiner", features.paths[fi]);
                return Err(match combiner {
                    Some(_) if !g.wide => continue,
                    Some(_) => ConfigError::unsupported(
                        format!("model_config.feature_groups.feature_names ({})", features[fi].name),
                        format!("a SequenceFeature in the WIDE group `{}`", g.name),
                    ),
                    None if model.backbone.is_some() => ConfigError::unsupported(
                        format!("model_config.feature_groups.feature_names ({})", features[fi].name),
                        "sequence features that backbone blocks read unpooled",
                    ),
                    None => ConfigError::invalid(
                        path,
                        format!(
                            "SequenceFeature `{}` in feature group `{}` needs a sequence_combiner (or use a TagFeature)",
                            features[fi].name, g.name
                        ),
                    ),
                });
            }
        }
    }
    Ok(groups)
}

/// The features of group `name`, taken out of it for a model that reads
/// them as unpooled sequences (`reader`: who, and a note for the error),
/// with the group; `None` without such a group. A feature that is no
/// SequenceFeature is an error naming it.
fn unpooled_sequences<'g>(
    groups: &'g mut [FeatureGroup],
    name: &str,
    features: &[FeatureSpec],
    (reader, note): (&str, &str),
) -> Result<Option<(&'g mut FeatureGroup, Vec<usize>)>, ConfigError> {
    let Some(g) = groups.iter_mut().find(|g| g.name == name) else {
        return Ok(None);
    };
    if let Some(&fi) = g
        .features
        .iter()
        .find(|&&fi| !matches!(features[fi].kind, FeatureKind::Sequence { .. }))
    {
        return Err(ConfigError::invalid(
            format!("model_config.feature_groups ({name})"),
            format!(
                "{reader} reads the sequence features of group `{name}`, and `{}` is not one{note}",
                features[fi].name
            ),
        ));
    }
    let seqs = std::mem::take(&mut g.features);
    Ok(Some((g, seqs)))
}

/// Feature groups with names resolved to feature indices. A WIDE_AND_DEEP
/// group feeds both the named deep group and the wide side.
fn groups(model: &proto::EasyRecModel, feature_names: &[String]) -> Result<Vec<FeatureGroup>, ConfigError> {
    use proto::WideOrDeep;
    let mut out: Vec<FeatureGroup> = Vec::new();
    for (i, g) in model.feature_groups.iter().enumerate() {
        let path = format!("model_config.feature_groups[{i}]");
        let features = feature_indices(&g.feature_names, feature_names, &format!("{path}.feature_names"))?;
        let seq = g
            .sequence_features
            .iter()
            .enumerate()
            .map(|(k, s)| seq_attention(s, &format!("{path}.sequence_features[{k}]"), feature_names))
            .collect::<Result<Vec<_>, _>>()?;
        if g.negative_sampler() {
            return Err(ConfigError::unsupported(
                format!("{path}.negative_sampler"),
                "negative sampling",
            ));
        }
        let name = g.group_name.clone().unwrap_or_else(|| "all".into());
        match g.wide_deep() {
            WideOrDeep::Deep => out.push(FeatureGroup {
                name,
                features,
                wide: false,
                seq,
            }),
            WideOrDeep::Wide if !seq.is_empty() => {
                return Err(ConfigError::invalid(
                    format!("{path}.sequence_features"),
                    "a WIDE group has no sequence features (EasyRec attends over sequences in deep groups)",
                ))
            }
            WideOrDeep::Wide => out.push(FeatureGroup {
                name,
                features,
                wide: true,
                seq,
            }),
            WideOrDeep::WideAndDeep => {
                out.push(FeatureGroup {
                    name: "wide".into(),
                    features: features.clone(),
                    wide: true,
                    seq: Vec::new(),
                });
                out.push(FeatureGroup {
                    name,
                    features,
                    wide: false,
                    seq,
                });
            }
        }
    }
    Ok(out)
}

/// The `seq_att_groups` entry a sequence tower at `path` names, and its index.
fn seq_att_group<'a>(
    model: &'a proto::EasyRecModel,
    input: &str,
    path: &str,
) -> Result<(usize, &'a proto::SeqAttGroupConfig), ConfigError> {
    model
        .seq_att_groups
        .iter()
        .enumerate()
        .find(|(_, s)| s.group_name.as_deref() == Some(input))
        .ok_or_else(|| {
            ConfigError::invalid(
                format!("{path}.input"),
                format!("no seq_att_groups entry is named `{input}`"),
            )
        })
}

/// MultiTowerDIN's DIN towers and MultiTowerBST's BST towers as feature
/// groups of their own over the `seq_att_groups` entry each names: a DIN
/// tower is its target attention, scored by the tower's `dnn`
/// (`<input>_dnn`), its key always in the output; a BST tower is EasyRec's
/// transformer block over its history and key.
fn seq_tower_groups(model: &proto::EasyRecModel, feature_names: &[String]) -> Result<Vec<FeatureGroup>, ConfigError> {
    let Some(proto::easy_rec_model::Model::MultiTower(t)) = &model.model else {
        return Ok(Vec::new());
    };
    match model.model_class.as_str() {
        "MultiTowerDIN" => {}
        "MultiTowerBST" => return bst_tower_groups(model, t, feature_names),
        class => {
            if !model.seq_att_groups.is_empty() {
                log::warn!(
                    "model_config.seq_att_groups: model class {class} reads no seq_att_groups (MultiTowerDIN and \
                     MultiTowerBST do); EasyRec's {class} ignores them, and so does this trainer"
                );
            }
            return Ok(Vec::new());
        }
    }
    let mut out = Vec::new();
    for (i, tower) in t.din_towers.iter().enumerate() {
        let path = format!("model_config.multi_tower.din_towers[{i}]");
        let (k, sg) = seq_att_group(model, &tower.input, &path)?;
        let mut att = seq_attention(sg, &format!("model_config.seq_att_groups[{k}]"), feature_names)?;
        if sg.allow_key_transform() || !sg.need_key_feature() || sg.seq_dnn.is_some() || !att.aux.is_empty() {
            log::warn!(
                "model_config.seq_att_groups[{k}]: MultiTowerDIN scores with its tower's dnn and ignores seq_dnn, allow_key_transform, need_key_feature and aux_hist_seq, as EasyRec does"
            );
        }
        att.dnn = dnn(&tower.dnn, &format!("{path}.dnn"))?;
        if att.dnn.hidden_units.last() != Some(&1) {
            return Err(ConfigError::invalid(
                format!("{path}.dnn.hidden_units"),
                "the attention's last layer scores each position: it has 1 unit",
            ));
        }
        att.scope = format!("{}_dnn", tower.input);
        att.need_key_feature = true;
        att.allow_key_transform = false;
        att.aux.clear();
        out.push(seq_tower_group(&tower.input, att));
    }
    Ok(out)
}

/// A sequence tower's feature group: its sequence layer alone.
fn seq_tower_group(name: &str, att: SeqAttention) -> FeatureGroup {
    FeatureGroup {
        name: name.to_string(),
        features: Vec::new(),
        wide: false,
        seq: vec![att],
    }
}

fn bst_tower_groups(
    model: &proto::EasyRecModel,
    t: &proto::MultiTower,
    feature_names: &[String],
) -> Result<Vec<FeatureGroup>, ConfigError> {
    if t.bst_towers.len() > 1 {
        return Err(ConfigError::unsupported(
            "model_config.multi_tower.bst_towers",
            "more than one BST tower (EasyRec's share some of their variables and not others)",
        ));
    }
    let mut out = Vec::new();
    for (i, tower) in t.bst_towers.iter().enumerate() {
        let path = format!("model_config.multi_tower.bst_towers[{i}]");
        let (k, sg) = seq_att_group(model, &tower.input, &path)?;
        let mut att = seq_attention(sg, &format!("model_config.seq_att_groups[{k}]"), feature_names)?;
        if sg.allow_key_transform() || sg.seq_dnn.is_some() || !att.aux.is_empty() {
            log::warn!(
                "model_config.seq_att_groups[{k}]: MultiTowerBST ignores seq_dnn, allow_key_transform, need_key_feature and aux_hist_seq, as EasyRec does"
            );
        }
        if tower.seq_len < 2 {
            return Err(ConfigError::invalid(
                format!("{path}.seq_len"),
                "the history's positions and the key: at least 2",
            ));
        }
        if tower.multi_head_size == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.multi_head_size"),
                "must be at least 1",
            ));
        }
        att.aux.clear();
        att.bst = Some(Bst {
            seq_len: tower.seq_len as usize,
            heads: tower.multi_head_size as usize,
        });
        out.push(seq_tower_group(&tower.input, att));
    }
    Ok(out)
}

/// The indices of features `names` (a list at `path`).
fn feature_indices(names: &[String], feature_names: &[String], path: &str) -> Result<Vec<usize>, ConfigError> {
    names
        .iter()
        .map(|n| {
            feature_names
                .iter()
                .position(|f| f == n)
                .ok_or_else(|| ConfigError::invalid(path, format!("no feature named `{n}`")))
        })
        .collect()
}

/// A `sequence_features` (or `seq_att_groups`) entry at `path`.
fn seq_attention(
    s: &proto::SeqAttGroupConfig,
    path: &str,
    feature_names: &[String],
) -> Result<SeqAttention, ConfigError> {
    let index = |names: &[String], field: &str| feature_indices(names, feature_names, &format!("{path}.{field}"));
    let name = s.group_name.clone().unwrap_or_default();
    let (mut keys, mut hist, mut aux) = (Vec::new(), Vec::new(), Vec::new());
    for (k, m) in s.seq_att_map.iter().enumerate() {
        let mpath = format!("seq_att_map[{k}]");
        keys.extend(index(&m.key, &format!("{mpath}.key"))?);
        hist.extend(index(&m.hist_seq, &format!("{mpath}.hist_seq"))?);
        aux = index(&m.aux_hist_seq, &format!("{mpath}.aux_hist_seq"))?;
    }
    if keys.is_empty() || hist.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.seq_att_map"),
            "needs at least one key and one hist_seq",
        ));
    }
    if s.tf_summary() {
        log::warn!("{path}.tf_summary: sequence embedding histograms are not written");
    }
    // EasyRec's default scoring network.
    let dnn = match &s.seq_dnn {
        Some(d) => dnn(d, &format!("{path}.seq_dnn"))?,
        None => DnnSpec {
            hidden_units: vec![128, 64, 32, 1],
            dropout: Vec::new(),
            activation: Activation::Relu,
            use_bn: true,
        },
    };
    if dnn.hidden_units.last() != Some(&1) {
        return Err(ConfigError::invalid(
            format!("{path}.seq_dnn.hidden_units"),
            "the attention's last layer scores each position: it has 1 unit",
        ));
    }
    Ok(SeqAttention {
        scope: format!("seq_dnn{name}"),
        name,
        keys,
        hist,
        aux,
        dnn,
        need_key_feature: s.need_key_feature(),
        allow_key_transform: s.allow_key_transform(),
        transform_dnn: s.transform_dnn(),
        bst: None,
        input_only: false,
    })
}
