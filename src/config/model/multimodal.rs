//! The typed configs of EasyRec's multi-modal towers, CMBF's `CMBFTower`
//! and Uniter's `UniterTower` (whole models with `final_dnn`, or DBMTL's
//! shared bottom), read once and checked as EasyRec's layers check them;
//! `model::builders::multimodal` builds them.

use super::encoder::{EncoderFields, EncoderSpec};
use super::layers::{dnn, DnnSpec};
use crate::config::validate::rate;
use crate::config::{proto, ConfigError};

/// A multi-modal tower over the feature groups `image`, `general`, `text`
/// (its sequence features unpooled) and `other`, any of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Tower {
    Cmbf(Cmbf),
    Uniter(Uniter),
}

/// EasyRec's CMBF: the image and the text through self-attention towers,
/// cross attention between them, the pooled results and the `other`
/// features (through `other_dnn`) side by side.
#[derive(Debug, Clone, PartialEq)]
pub struct Cmbf {
    /// Where the tower's config sits, for the messages of checks against
    /// the feature groups.
    pub path: String,
    /// Heads of every attention (`multi_head_num`; EasyRec's towers use it
    /// too, whatever `image_multi_head_num` and `text_multi_head_num` say).
    pub heads: usize,
    pub image: CmbfImage,
    /// `text_head_size * text_multi_head_num`.
    pub text_hidden: usize,
    pub text_layers: usize,
    pub cross_layers: usize,
    /// Per head, the image's and the text's cross-attention widths.
    pub cross_head_sizes: (usize, usize),
    pub hidden_dropout: f32,
    /// Token-type embeddings telling the text sequences apart.
    pub token_type: bool,
    /// Position embeddings of the text sequences, at most this many
    /// positions (`max_position_embeddings`), when `use_position_embeddings`.
    pub max_positions: Option<usize>,
    pub text_emb_dropout: f32,
    pub other_dnn: Option<DnnSpec>,
}

/// EasyRec's Uniter: a `[CLS]` embedding, the image, the general features
/// and the text sequences as positions of one transformer encoder (token
/// types telling the kinds apart), the `[CLS]` position's output and the
/// `other` features (through `other_dnn`) side by side.
#[derive(Debug, Clone, PartialEq)]
pub struct Uniter {
    /// Where the tower's config sits.
    pub path: String,
    pub encoder: EncoderSpec,
    /// Position embeddings of the image and text sequences, at most this
    /// many positions, when `use_position_embeddings`.
    pub max_positions: Option<usize>,
    pub other_dnn: Option<DnnSpec>,
}

/// The image tower's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CmbfImage {
    /// `image_head_size * image_multi_head_num`.
    pub hidden: usize,
    pub layers: usize,
    /// `image_feature_patch_num`: one image feature cut into this many
    /// patches.
    pub patches: usize,
    /// `image_feature_dim`: one unpatched image feature is first projected
    /// to this many values, each then mapped to a vector of its own.
    pub feature_dim: usize,
}

/// A whole model's tower and its `final_dnn`.
pub fn model(x: &proto::easy_rec_model::Model, path: &str) -> Option<Result<(Tower, DnnSpec), ConfigError>> {
    use proto::easy_rec_model::Model as M;
    let (tower, final_dnn, path) = match x {
        M::Cmbf(c) => (
            cmbf(&c.config, &format!("{path}.cmbf.config")).map(Tower::Cmbf),
            &c.final_dnn,
            format!("{path}.cmbf"),
        ),
        M::Uniter(u) => (
            uniter(&u.config, &format!("{path}.uniter.config")).map(Tower::Uniter),
            &u.final_dnn,
            format!("{path}.uniter"),
        ),
        _ => return None,
    };
    Some(tower.and_then(|t| Ok((t, dnn(final_dnn, &format!("{path}.final_dnn"))?))))
}

/// DBMTL's shared bottom tower, when it has one.
pub fn dbmtl_bottom(x: &proto::Dbmtl, path: &str) -> Result<Option<Tower>, ConfigError> {
    Ok(match (&x.bottom_cmbf, &x.bottom_uniter) {
        (Some(c), _) => Some(Tower::Cmbf(cmbf(c, &format!("{path}.bottom_cmbf"))?)),
        (None, Some(u)) => Some(Tower::Uniter(uniter(u, &format!("{path}.bottom_uniter"))?)),
        (None, None) => None,
    })
}

/// Whether the model reads its `text` group's sequences unpooled (a
/// multi-modal tower's text).
pub fn reads_text_unpooled(model: &proto::EasyRecModel) -> bool {
    use proto::easy_rec_model::Model as M;
    match &model.model {
        Some(M::Cmbf(_) | M::Uniter(_)) => true,
        Some(M::Dbmtl(d)) => d.bottom_cmbf.is_some() || d.bottom_uniter.is_some(),
        _ => false,
    }
}

fn cmbf(c: &proto::CmbfTower, path: &str) -> Result<Cmbf, ConfigError> {
    let at = |f: &str| format!("{path}.{f}");
    if c.attention_probs_dropout_prob > 0.0 {
        return Err(ConfigError::unsupported(
            at("attention_probs_dropout_prob"),
            "dropout of attention probabilities",
        ));
    }
    rate(c.hidden_dropout_prob, at("hidden_dropout_prob"))?;
    rate(c.text_seq_emb_dropout_prob, at("text_seq_emb_dropout_prob"))?;
    let heads = c.multi_head_num as usize;
    if heads == 0 {
        return Err(ConfigError::invalid(at("multi_head_num"), "must be at least 1"));
    }
    let image_hidden = (c.image_head_size * c.image_multi_head_num) as usize;
    let text_hidden = (c.text_head_size * c.text_multi_head_num) as usize;
    if c.image_cross_head_size == 0 || c.text_cross_head_size == 0 {
        return Err(ConfigError::invalid(
            at("image_cross_head_size"),
            "image_cross_head_size and text_cross_head_size must be at least 1",
        ));
    }
    let max_positions = if c.use_position_embeddings {
        if c.max_position_embeddings == 0 {
            return Err(ConfigError::invalid(
                at("max_position_embeddings"),
                "must be at least 1 when use_position_embeddings is true (its default)",
            ));
        }
        Some(c.max_position_embeddings as usize)
    } else {
        None
    };
    Ok(Cmbf {
        path: path.to_string(),
        heads,
        image: CmbfImage {
            hidden: image_hidden,
            layers: c.image_self_attention_layer_num as usize,
            patches: c.image_feature_patch_num as usize,
            feature_dim: c.image_feature_dim as usize,
        },
        text_hidden,
        text_layers: c.text_self_attention_layer_num as usize,
        cross_layers: c.cross_modal_layer_num as usize,
        cross_head_sizes: (c.image_cross_head_size as usize, c.text_cross_head_size as usize),
        hidden_dropout: c.hidden_dropout_prob,
        token_type: c.use_token_type,
        max_positions,
        text_emb_dropout: c.text_seq_emb_dropout_prob,
        other_dnn: c
            .other_feature_dnn
            .as_ref()
            .map(|d| dnn(d, &at("other_feature_dnn")))
            .transpose()?,
    })
}

fn uniter(u: &proto::UniterTower, path: &str) -> Result<Uniter, ConfigError> {
    let fields = EncoderFields {
        hidden_size: u.hidden_size,
        num_hidden_layers: u.num_hidden_layers,
        num_attention_heads: u.num_attention_heads,
        intermediate_size: u.intermediate_size,
        hidden_act: &u.hidden_act,
        hidden_dropout_prob: u.hidden_dropout_prob,
        attention_probs_dropout_prob: u.attention_probs_dropout_prob,
        initializer_range: u.initializer_range,
    };
    let encoder = fields.spec(path, " (EasyRec's default is 0.1: set it to 0)")?;
    let max_positions = if u.use_position_embeddings {
        Some(u.max_position_embeddings as usize)
    } else {
        None
    };
    Ok(Uniter {
        path: path.to_string(),
        encoder,
        max_positions,
        other_dnn: u
            .other_feature_dnn
            .as_ref()
            .map(|d| dnn(d, &format!("{path}.other_feature_dnn")))
            .transpose()?,
    })
}
