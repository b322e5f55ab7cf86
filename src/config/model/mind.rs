//! MIND's typed configuration (`model_config.mind`): the capsule layer
//! over the `hist` group's sequences, the user, concat and item DNNs, and
//! the label-aware attention, checked against what EasyRec's model does.

use super::layers::{comparable, dnn, embedding_dnn, DnnSpec, Similarity};
use crate::config::data_plan::InputField;
use crate::config::proto;
use crate::config::ConfigError;

/// MIND (`Arch::Mind`): the `hist` group's sequences, combined per
/// position, through `pre_capsule`, weighted by the softmax of the time
/// feature when there is one, routed into interest capsules; each capsule
/// beside the `user` group's DNN output through `concat` (its last layer
/// linear) is an interest; the `item` group through `item` (last layer
/// linear) is the item. The user's embedding is the interests weighted by
/// the softmax of their similarity to the row's item times `simi_pow`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mind {
    pub pre_capsule: Option<DnnSpec>,
    pub user: DnnSpec,
    pub concat: DnnSpec,
    pub item: DnnSpec,
    /// Average the sequences per position (`SUM`), else concatenate them.
    pub average: bool,
    pub capsule: Capsule,
    pub simi_pow: f32,
    pub sim: Similarity,
    /// The index among the `hist` group's features of the time feature
    /// (`time_id_fea`), which weighs the positions instead of being one.
    pub time_id: Option<usize>,
    /// `max_interests_simi` below 1: the loss `reg_interest_simi`, how far
    /// the batch's mean similarity of a user's interests exceeds it.
    pub max_interests_simi: Option<f32>,
}

/// EasyRec's `Capsule`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capsule {
    pub max_k: usize,
    pub max_seq_len: usize,
    pub high_dim: usize,
    pub iters: usize,
    pub logits_scale: f32,
    pub logits_stddev: f32,
    pub squash_pow: f32,
    pub scale_ratio: f32,
    pub constant_count: bool,
}

/// MIND's typed configuration and its l2_regularization; `path` is where
/// `m` sits in the config.
pub fn mind(m: &proto::Mind, model: &proto::EasyRecModel, path: &str) -> Result<(Mind, f32), ConfigError> {
    let c = &m.capsule_config;
    let cpath = format!("{path}.capsule_config");
    for (v, name) in [
        (c.max_k(), "max_k"),
        (c.max_seq_len, "max_seq_len"),
        (c.high_dim, "high_dim"),
        (c.num_iters(), "num_iters"),
    ] {
        if v == 0 {
            return Err(ConfigError::invalid(format!("{cpath}.{name}"), "must be at least 1"));
        }
    }
    let capsule = Capsule {
        max_k: c.max_k() as usize,
        max_seq_len: c.max_seq_len as usize,
        high_dim: c.high_dim as usize,
        iters: c.num_iters() as usize,
        logits_scale: c.routing_logits_scale(),
        logits_stddev: c.routing_logits_stddev(),
        squash_pow: c.squash_pow(),
        scale_ratio: c.scale_ratio(),
        constant_count: c.const_caps_num(),
    };
    let concat = embedding_dnn(&m.concat_dnn, &format!("{path}.concat_dnn"))?;
    let item = embedding_dnn(&m.item_dnn, &format!("{path}.item_dnn"))?;
    comparable(&concat, &item, &format!("{path}.item_dnn.hidden_units"))?;
    if m.simi_pow() >= 100.0 {
        return Err(ConfigError::unsupported(
            format!("{path}.simi_pow"),
            "simi_pow >= 100 (EasyRec's arg-max interest instead of the attention)",
        ));
    }
    let max_interests_simi = m.max_interests_simi();
    if !max_interests_simi.is_finite() {
        return Err(ConfigError::invalid(
            format!("{path}.max_interests_simi"),
            "must be a number",
        ));
    }
    let time_id = match m.time_id_fea.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => {
            let hist = model.feature_groups.iter().find(|g| g.group_name() == "hist");
            Some(
                hist.and_then(|g| g.feature_names.iter().position(|f| f == t))
                    .ok_or_else(|| {
                        ConfigError::invalid(
                            format!("{path}.time_id_fea"),
                            format!("`{t}` is not a feature of group `hist`"),
                        )
                    })?,
            )
        }
    };
    let pre_capsule = match &m.pre_capsule_dnn {
        Some(d) if !d.hidden_units.is_empty() => Some(dnn(d, &format!("{path}.pre_capsule_dnn"))?),
        _ => None,
    };
    let cosine = m.simi_func() == proto::Similarity::Cosine;
    Ok((
        Mind {
            pre_capsule,
            user: dnn(&m.user_dnn, &format!("{path}.user_dnn"))?,
            concat,
            item,
            average: m.user_seq_combine() == proto::mind::UserSeqCombineMethod::Sum,
            capsule,
            simi_pow: m.simi_pow(),
            sim: Similarity {
                cosine,
                temperature: 1.0,
                scale_simi: m.scale_simi(),
            },
            time_id,
            max_interests_simi: (max_interests_simi < 1.0).then_some(max_interests_simi),
        },
        m.l2_regularization,
    ))
}

/// A listwise match model's `item_id` (DSSM, DSSM_SENet, MIND), the input
/// field whose equal values leave the batch's other examples out of a
/// user's negatives; `None` without one, or with `ignore_in_batch_neg_sam`,
/// which leaves them all out (EasyRec then ignores `item_id`).
pub fn in_batch_item(model: &proto::EasyRecModel, fields: &[InputField]) -> Result<Option<String>, ConfigError> {
    use proto::easy_rec_model::Model as M;
    let (item, block) = match &model.model {
        Some(M::Dssm(d)) => (d.item_id.as_deref(), "dssm"),
        Some(M::DssmSenet(d)) => (d.item_id.as_deref(), "dssm_senet"),
        Some(M::Mind(m)) => (m.item_id.as_deref(), "mind"),
        _ => (None, ""),
    };
    let Some(item) = item.filter(|i| !i.is_empty() && !ignore_in_batch(model)) else {
        return Ok(None);
    };
    if !fields.iter().any(|f| f.name == item) {
        return Err(ConfigError::invalid(
            format!("model_config.{block}.item_id"),
            format!("`{item}` is not among data_config.input_fields"),
        ));
    }
    Ok(Some(item.to_string()))
}

/// Whether the model's in-batch softmax leaves the batch's other items
/// out (`ignore_in_batch_neg_sam` of DSSM, DSSM_SENet, DAT or MIND).
pub fn ignore_in_batch(model: &proto::EasyRecModel) -> bool {
    use proto::easy_rec_model::Model as M;
    match &model.model {
        Some(M::Dssm(d)) => d.ignore_in_batch_neg_sam,
        Some(M::DssmSenet(d)) => d.ignore_in_batch_neg_sam,
        Some(M::Dat(d)) => d.ignore_in_batch_neg_sam,
        Some(M::Mind(m)) => m.ignore_in_batch_neg_sam(),
        _ => false,
    }
}
