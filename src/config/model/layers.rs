//! The building blocks the model section's parts share: activations, DNN
//! blocks, how match models compare towers, multi-task towers, and their
//! parsers. A leaf: every other part of the section reads it.

use crate::config::{proto, validate, ConfigError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Sigmoid,
    Tanh,
    Linear,
    /// `tf.nn.leaky_relu`: `x` above 0, `0.2 x` below.
    LeakyRelu,
    /// `tf.nn.elu`: `x` above 0, `exp(x) - 1` below.
    Elu,
    /// `tf.nn.selu`: `SELU_SCALE` times ELU with `SELU_ALPHA` below 0.
    Selu,
    /// `tf.nn.softplus`: `log(1 + exp(x))`.
    Softplus,
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
        "elu" => Activation::Elu,
        "selu" => Activation::Selu,
        "softplus" => Activation::Softplus,
        "" | "linear" | "None" | "none" => Activation::Linear,
        other => {
            return Err(ConfigError::unsupported(
                path,
                format!(
                    "activation `{other}` (supported: relu, leaky_relu, elu, selu, softplus, sigmoid, tanh, linear)"
                ),
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
        validate::rate(r, format!("{path}.dropout_ratio"))?;
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

/// EasyRec's MLP block, one entry per dense layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    pub layers: Vec<MlpLayer>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MlpLayer {
    pub units: usize,
    pub use_bias: bool,
    /// Whether EasyRec 0.7.1 gives the layer a bias: its MLP has no
    /// `use_final_bias` and defaults `use_bias` to true.
    pub use_bias_071: bool,
    pub use_bn: bool,
    /// Batch norm after the activation rather than before it.
    pub bn_after_activation: bool,
    pub activation: Activation,
    /// A softmax over the layer's units where its activation goes
    /// (`final_activation: "softmax"`; `activation` is then linear).
    pub softmax: bool,
    pub dropout: f32,
}

/// EasyRec's MLP block from its `mlp` parameters.
pub fn mlp(m: &proto::Mlp, path: &str) -> Result<Mlp, ConfigError> {
    if m.hidden_units.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.hidden_units"),
            "an MLP needs at least one layer",
        ));
    }
    if m.hidden_units.contains(&0) {
        return Err(ConfigError::invalid(
            format!("{path}.hidden_units"),
            "a layer of width 0",
        ));
    }
    for &r in &m.dropout_ratio {
        crate::config::validate::rate(r, format!("{path}.dropout_ratio"))?;
    }
    if !matches!(m.initializer(), "he_uniform" | "") {
        return Err(ConfigError::unsupported(
            format!("{path}.initializer"),
            format!("kernel initializer `{}` (supported: he_uniform)", m.initializer()),
        ));
    }
    if m.add_to_outputs() {
        return Err(ConfigError::unsupported(
            format!("{path}.add_to_outputs"),
            "extra model outputs from MLP blocks",
        ));
    }
    let act = layer_activation(m.activation(), &format!("{path}.activation"))?;
    let final_softmax = m.final_activation() == "softmax";
    let final_act = if final_softmax {
        Activation::Linear
    } else {
        layer_activation(m.final_activation(), &format!("{path}.final_activation"))?
    };
    let n = m.hidden_units.len();
    Ok(Mlp {
        layers: m
            .hidden_units
            .iter()
            .enumerate()
            .map(|(i, &units)| {
                let last = i + 1 == n;
                MlpLayer {
                    units: units as usize,
                    use_bias: if last { m.use_final_bias() } else { m.use_bias() },
                    use_bias_071: m.use_bias.unwrap_or(true),
                    use_bn: if last { m.use_final_bn() } else { m.use_bn() },
                    bn_after_activation: m.use_bn_after_activation(),
                    activation: if last { final_act } else { act },
                    softmax: last && final_softmax,
                    dropout: m.dropout_ratio.get(i).copied().unwrap_or(0.0),
                }
            })
            .collect(),
    })
}

/// A text CNN's filter sizes and counts (at `path`), checked against the
/// `pad` positions it convolves.
pub fn text_cnn_filters(
    sizes: &[u32],
    counts: &[u32],
    pad: usize,
    path: &str,
) -> Result<(Vec<usize>, Vec<usize>), ConfigError> {
    if sizes.is_empty() || sizes.len() != counts.len() {
        return Err(ConfigError::invalid(
            format!("{path}.num_filters"),
            format!(
                "{} filter_sizes and {} num_filters: give one count per size",
                sizes.len(),
                counts.len()
            ),
        ));
    }
    if let Some(k) = sizes.iter().find(|k| **k == 0 || **k as usize > pad) {
        return Err(ConfigError::invalid(
            format!("{path}.filter_sizes"),
            format!("a filter of size {k} over {pad} positions (pad_sequence_length, else max_seq_len)"),
        ));
    }
    if counts.contains(&0) {
        return Err(ConfigError::invalid(
            format!("{path}.num_filters"),
            "a filter count of 0",
        ));
    }
    let usize_of = |v: &[u32]| v.iter().map(|k| *k as usize).collect();
    Ok((usize_of(sizes), usize_of(counts)))
}
