//! EasyRec's BERT-style transformer encoder as configured (its BST
//! layer's and Uniter's fields), checked: what `model::builders::transformer`
//! builds.

use crate::config::ConfigError;

/// The activation of a transformer's intermediate layers (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenAct {
    /// BERT's tanh approximation of GELU.
    Gelu,
    Relu,
    Tanh,
    Swish,
}

/// EasyRec's transformer encoder's shape (`transformer_encoder`'s
/// arguments; `model::builders::transformer` builds it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderSpec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub act: HiddenAct,
    pub hidden_dropout: f32,
    /// The stddev of the truncated normal the kernels and position
    /// embeddings start from (`initializer_range`).
    pub init_range: f32,
}

/// A transformer's `hidden_act` (at `path`).
pub fn hidden_act(name: &str, path: String) -> Result<HiddenAct, ConfigError> {
    Ok(match name {
        "gelu" => HiddenAct::Gelu,
        "relu" => HiddenAct::Relu,
        "tanh" => HiddenAct::Tanh,
        "swish" => HiddenAct::Swish,
        other => {
            return Err(ConfigError::unsupported(
                path,
                format!("the activation `{other}` (supported: gelu, relu, tanh, swish)"),
            ))
        }
    })
}

/// The fields EasyRec's BERT-style encoders are configured by (its BST
/// layer's and Uniter's).
pub struct EncoderFields<'a> {
    pub hidden_size: u32,
    pub num_hidden_layers: u32,
    pub num_attention_heads: u32,
    pub intermediate_size: u32,
    pub hidden_act: &'a str,
    pub hidden_dropout_prob: f32,
    pub attention_probs_dropout_prob: f32,
    pub initializer_range: f32,
}

impl EncoderFields<'_> {
    /// The encoder, its fields at `path` checked; `dropout_hint` follows
    /// the refusal of attention-probability dropout.
    pub fn spec(&self, path: &str, dropout_hint: &str) -> Result<EncoderSpec, ConfigError> {
        let act = hidden_act(self.hidden_act, format!("{path}.hidden_act"))?;
        if self.attention_probs_dropout_prob > 0.0 {
            return Err(ConfigError::unsupported(
                format!("{path}.attention_probs_dropout_prob"),
                format!("dropout of attention probabilities{dropout_hint}"),
            ));
        }
        let (hidden, heads) = (self.hidden_size, self.num_attention_heads);
        if hidden == 0 || heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(ConfigError::invalid(
                format!("{path}.hidden_size"),
                format!("{hidden} is not a positive multiple of num_attention_heads ({heads})"),
            ));
        }
        if self.intermediate_size == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.intermediate_size"),
                "must be at least 1",
            ));
        }
        crate::config::validate::rate(self.hidden_dropout_prob, format!("{path}.hidden_dropout_prob"))?;
        Ok(EncoderSpec {
            hidden: hidden as usize,
            layers: self.num_hidden_layers as usize,
            heads: heads as usize,
            intermediate: self.intermediate_size as usize,
            act,
            hidden_dropout: self.hidden_dropout_prob,
            init_range: self.initializer_range,
        })
    }
}
