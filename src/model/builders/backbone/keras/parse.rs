//! The Keras layers a backbone block may run (`keras_layer`), typed: each
//! class EasyRec's backbone offers that this trainer builds, with its
//! `st_params` or typed parameters checked. A class, key or value it does
//! not honour is refused by name. `build.rs` beside it builds them, in the
//! same order.

use std::collections::BTreeMap;

use crate::config::model::encoder::{EncoderFields, EncoderSpec};
use crate::config::model::layers::{activation, mlp, text_cnn_filters, Activation, Mlp};
use crate::config::{proto, ConfigError};
use crate::model::graph::augment::Augment;
use crate::model::graph::Contrast;

#[derive(Debug, Clone, PartialEq)]
pub enum Keras {
    Mlp(Mlp),
    /// EasyRec's PPNet (PEPNet) over `[x, gate input]`: an MLP whose layers'
    /// outputs are each scaled by a gate network's `2 * sigmoid(...)` of the
    /// gate input (with `full_gate_input`, `x` cut from the gradient beside
    /// it). Lazy: a gate after every layer; eager: one before the first
    /// layer and after every layer but the last.
    PpNet {
        mlp: Mlp,
        gate: GateNet,
        eager: bool,
        full_gate_input: bool,
    },
    /// EasyRec's AITMTower over `[current tower, towers it depends on...]`:
    /// per input a query, key and value projection (Keras Dense of
    /// `project_dim` units, else the current tower's width); the others,
    /// cut from the gradient with `stop_gradient`, through the shared
    /// `transfer` MLP first; the current tower's query attends over every
    /// key (dot products over the square root of the width, softmax).
    Aitm {
        project_dim: Option<usize>,
        transfer: Option<Mlp>,
        stop_gradient: bool,
    },
    /// Keras' `Dense` (glorot_uniform kernel, no regularizer).
    Dense {
        units: usize,
        activation: Activation,
        use_bias: bool,
    },
    /// Keras' `Dropout`.
    Dropout {
        rate: f32,
    },
    /// Keras' `Add` over a list.
    Add,
    /// EasyRec's FM layer: `[batch, 1]`, or `[batch, dim]` with `use_variant`.
    Fm {
        variant: bool,
    },
    /// DLRM's pairwise dot products, lower triangle in row-major order.
    DotInteraction {
        self_interaction: bool,
    },
    /// DCN-v2's cross layer `x0 * (W x + b) + x`, `W` low-rank with
    /// `projection_dim`.
    Cross {
        projection_dim: Option<usize>,
        use_bias: bool,
    },
    /// FiBiNet++'s SENet over a list of field embeddings: per field and
    /// squeeze group the max and the mean, a relu layer `W1` of
    /// `max(1, fields * groups * 2 / reduction_ratio)` units, a linear
    /// layer `W2` to one weight per embedding value; the embeddings
    /// reweighted, plus themselves (`skip`), layer-normed (`layer_norm`).
    SeNet(SeNetParams),
    /// EasyRec's Highway: an optional projection to `emb_size`, then per
    /// layer `v + gate * (act(Dense(v)) - v)` with a sigmoid gate whose
    /// bias starts at `init_gate_bias`.
    Highway {
        emb_size: Option<usize>,
        num_layers: usize,
        activation: Activation,
        dropout: f32,
        init_gate_bias: f32,
    },
    /// EasyRec's PeriodicEmbedding of raw values `[batch, n]`: per feature
    /// `dim / 2` coefficients `c` (normal, stddev `sigma`) and
    /// `[sin(2π c x), cos(2π c x)]`, then, with `linear`, a dense layer of
    /// `dim` per feature (`nd_linear`) and that activation.
    Periodic {
        dim: usize,
        sigma: f32,
        linear: Option<Activation>,
        out: NumericOut,
    },
    /// EasyRec's AutoDisEmbedding of raw values `[batch, n]`: per feature a
    /// leaky-ReLU projection to `bins` scores, mixed by a `[bins, bins]`
    /// matrix plus `keep_prob` of themselves, softmaxed at `temperature`,
    /// weighting `bins` meta-embeddings of `dim`.
    AutoDis {
        dim: usize,
        bins: usize,
        keep_prob: f32,
        temperature: f32,
        out: NumericOut,
    },
    /// EasyRec's NaryDisEmbedding of raw values `[batch, n]`: each value
    /// times `multiplier`, as a 32-bit integer, in each base of `carries`,
    /// its digits' embeddings pooled per base (`graph::nary`), the bases'
    /// side by side per feature; `replicas` such embeddings of `dim`, each
    /// its own output.
    NaryDis {
        dim: usize,
        carries: Vec<u32>,
        multiplier: f32,
        mean: bool,
        replicas: usize,
        out: NumericOut,
    },
    /// EasyRec's MaskBlock layer over `[net, mask_input]` (or one input
    /// for both).
    MaskBlock(MaskBlock),
    /// EasyRec's Gate: the list's `weight_index`-th value weighs the
    /// others (one column each), summed.
    Gate {
        weight_index: usize,
    },
    /// EasyRec's MMoE layer: `experts` expert MLPs over the input (without
    /// `expert_mlp`, the input list's first `experts` values are the
    /// experts and the next one the gates' input), a softmax gate per task
    /// (`gate_<t>`, l2-regularised) mixing them; a list of one mixture per
    /// task.
    Mmoe {
        tasks: usize,
        experts: usize,
        expert_mlp: Option<Mlp>,
    },
    /// FiBiNet++: the SENet over the field embeddings, beside the bilinear
    /// interactions when given, then the MLP when given.
    FiBiNet {
        senet: SeNetParams,
        bilinear: Option<Bilinear>,
        mlp: Option<Mlp>,
    },
    /// FiBiNet's bilinear interactions of field embeddings.
    Bilinear(Bilinear),
    /// xDeepFM's compressed interaction network over `[batch, fields,
    /// dim]`: per layer of `k` feature maps, per embedding column,
    /// `relu(Σ_{a,c} W[k, a, c] · x_i[a] · x_0[c] + b[k])`; each layer's
    /// maps summed over the columns, the layers' sums side by side.
    Cin {
        sizes: Vec<usize>,
    },
    /// EasyRec's DIN layer over a sequence input `(seq, len, target)`: the
    /// target (zero-padded to the sequence's width) tiled over the
    /// positions, each scored by `mlp` on `[q, k, q - k, q * k]` (its last
    /// layer one linear unit with a bias and no batch norm), the scores
    /// softmaxed over the row's positions, the sequence (its first
    /// target-width columns) pooled by them; then the padded target after
    /// it with `need_target`.
    Din {
        mlp: Mlp,
        need_target: bool,
    },
    /// EasyRec's BST layer over a sequence input `(seq, len, target)`.
    Bst(BstLayer),
    /// CL4SRec's augmentation of a sequence input `(seq, len, ...)`: out
    /// comes `(augmented seq, its length)`, drawn anew on every call in
    /// training, the sequence as it is otherwise (`graph::augment`).
    /// `SeqAugmentOps` is EasyRec's compiled op of the same augmentation,
    /// whose mask embedding is a vector (`vector_mask`: its initializer's
    /// fans).
    SeqAugment {
        aug: Augment,
        vector_mask: bool,
    },
    /// EasyRec's AuxiliaryLoss over a list of two: `loss` between them
    /// added to the model's loss, times `weight`, named `<block>_<kind>`
    /// as in EasyRec's loss dict; none for a loss type EasyRec ignores.
    AuxiliaryLoss {
        loss: Option<AuxLoss>,
        weight: f32,
    },
    /// EasyRec's TextCNN layer over a sequence input (`(seq, len, ...)`):
    /// the sequence padded or cut to `pad` positions, Keras' Conv1D (valid
    /// padding, `activation`) per filter size, each max-pooled over time,
    /// side by side, then the optional MLP.
    TextCnn {
        filter_sizes: Vec<usize>,
        num_filters: Vec<usize>,
        pad: usize,
        activation: Activation,
        mlp: Option<Mlp>,
    },
    /// MaskNet: instance-guided masks over (layer-normed) inputs, in
    /// parallel (concatenated) or in series, then an optional MLP.
    MaskNet {
        blocks: Vec<MaskBlock>,
        parallel: bool,
        input_layer_norm: bool,
        mlp: Option<Mlp>,
    },
}

/// The losses EasyRec's AuxiliaryLoss layer computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AuxLoss {
    /// `l2_loss`: the mean over the batch of the squared distance.
    L2,
    /// `nce_loss` and `info_nce` (`Op::Contrastive`).
    Contrast(Contrast),
}

impl AuxLoss {
    /// EasyRec's suffix of the loss's name.
    pub fn suffix(self) -> &'static str {
        match self {
            AuxLoss::L2 => "l2_loss",
            AuxLoss::Contrast(Contrast::Nce { .. }) => "nce_loss",
            AuxLoss::Contrast(Contrast::InfoNce { .. }) => "info_nce_loss",
        }
    }
}

/// A SENet's `reduction_ratio`, `num_squeeze_group`,
/// `use_skip_connection` and `use_output_layer_norm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeNetParams {
    pub reduction_ratio: usize,
    pub groups: usize,
    pub skip: bool,
    pub layer_norm: bool,
}

/// EasyRec's BST Keras layer: the sequence cut or zero-padded to
/// `max_position` positions, projected (dense, ReLU) to `hidden` when
/// narrower or wider, the target (projected the same way) before it, so
/// `max_position + 1` positions; position embeddings, layer norm, then
/// the transformer encoder over the positions up to the row's length (and
/// the target); out comes every position side by side
/// (`output_all_token_embeddings`) or the target's alone.
#[derive(Debug, Clone, PartialEq)]
pub struct BstLayer {
    pub encoder: EncoderSpec,
    pub max_position: usize,
    pub all_tokens: bool,
    /// `reserve_target_position`: without target features, whether
    /// EasyRec's attention mask keeps a position for one (which it can
    /// only run when out comes the head position alone).
    pub reserve_target: bool,
}

fn bst_layer(b: &proto::BstEncoder, path: &str) -> Result<BstLayer, ConfigError> {
    if !b.use_position_embeddings {
        // EasyRec's BST adds position embeddings whatever this says.
        log::warn!("{path}.use_position_embeddings: false is ignored, as EasyRec's BST layer ignores it");
    }
    match b.target_item_position.as_str() {
        "head" => {}
        "tail" | "ignore" => {
            return Err(ConfigError::unsupported(
                format!("{path}.target_item_position"),
                format!("the target item at `{}` (supported: head)", b.target_item_position),
            ))
        }
        other => {
            return Err(ConfigError::invalid(
                format!("{path}.target_item_position"),
                format!("`{other}` is not head, tail or ignore"),
            ))
        }
    }
    if b.max_position_embeddings == 0 || b.intermediate_size == 0 {
        return Err(ConfigError::invalid(
            path,
            "max_position_embeddings and intermediate_size are at least 1",
        ));
    }
    let fields = EncoderFields {
        hidden_size: b.hidden_size,
        num_hidden_layers: b.num_hidden_layers,
        num_attention_heads: b.num_attention_heads,
        intermediate_size: b.intermediate_size,
        hidden_act: &b.hidden_act,
        hidden_dropout_prob: b.hidden_dropout_prob,
        attention_probs_dropout_prob: b.attention_probs_dropout_prob,
        initializer_range: b.initializer_range,
    };
    Ok(BstLayer {
        encoder: fields.spec(path, "")?,
        max_position: b.max_position_embeddings as usize,
        all_tokens: b.output_all_token_embeddings,
        reserve_target: b.reserve_target_position,
    })
}

/// EasyRec's BiLinear layer: per pair `i < j` of fields, field `i` through
/// a dense layer (one for all fields, one per field or one per pair, as
/// `kind` says), then its dot product with field `j` (`plus`, FiBiNet++'s
/// bilinear+) or their element-wise product; all pairs side by side into a
/// dense `output` layer of `units`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bilinear {
    pub kind: BilinearKind,
    pub plus: bool,
    pub units: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BilinearKind {
    All,
    Each,
    Interaction,
}

fn bilinear(b: &proto::Bilinear, path: &str) -> Result<Bilinear, ConfigError> {
    let kind = match b.r#type.to_lowercase().as_str() {
        "all" => BilinearKind::All,
        "each" => BilinearKind::Each,
        "interaction" => BilinearKind::Interaction,
        other => {
            return Err(ConfigError::invalid(
                format!("{path}.type"),
                format!("bilinear type `{other}` (EasyRec's are all, each and interaction)"),
            ))
        }
    };
    if b.num_output_units == 0 {
        return Err(ConfigError::invalid(
            format!("{path}.num_output_units"),
            "must be at least 1",
        ));
    }
    Ok(Bilinear {
        kind,
        plus: b.use_plus,
        units: b.num_output_units as usize,
    })
}

fn senet_params(p: &proto::SeNet, path: &str) -> Result<SeNetParams, ConfigError> {
    let params = SeNetParams {
        reduction_ratio: p.reduction_ratio as usize,
        groups: p.num_squeeze_group() as usize,
        skip: p.use_skip_connection(),
        layer_norm: p.use_output_layer_norm(),
    };
    if params.reduction_ratio == 0 || params.groups == 0 {
        return Err(ConfigError::invalid(
            path,
            "SENet's reduction_ratio and num_squeeze_group must be at least 1",
        ));
    }
    Ok(params)
}

/// What a numeric embedding layer outputs: the embeddings side by side
/// `[batch, n * dim]`, with `output_3d_tensor` also as `[batch, n, dim]`,
/// with `output_tensor_list` also as a list of `[batch, dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumericOut {
    Tensor,
    AndStacked,
    AndList,
}

impl NumericOut {
    fn of(list: bool, stacked: bool) -> Self {
        if list {
            NumericOut::AndList
        } else if stacked {
            NumericOut::AndStacked
        } else {
            NumericOut::Tensor
        }
    }
}

/// One mask block of MaskNet.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskBlock {
    /// The aggregation layer's width: `reduction_factor` times the mask
    /// input's width, or `aggregation_size`.
    pub aggregation: Aggregation,
    /// Hidden width of the output layer (then layer norm and relu); none
    /// returns the masked input.
    pub output_size: Option<usize>,
    pub input_layer_norm: bool,
    pub projection_dim: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aggregation {
    Factor(f32),
    Size(usize),
}

/// PPNet's gate network (EasyRec's `GateNN`): a Dense of `hidden_dim`
/// units (the gated layer's width unless set), batch norm with `use_bn`,
/// the activation, dropout, then a sigmoid Dense of the gated width,
/// doubled. Its Dense layers take a bias only without batch norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateNet {
    /// The width of eager mode's first gate (the input's width).
    pub output_dim: usize,
    pub hidden_dim: Option<usize>,
    pub activation: Activation,
    pub use_bn: bool,
    pub dropout: f32,
}

/// `st_params` as plain values, refusing keys a layer does not read.
struct StParams<'a> {
    fields: &'a BTreeMap<String, prost_types::Value>,
    path: String,
}

impl StParams<'_> {
    fn check_keys(&self, known: &[&str], class: &str) -> Result<(), ConfigError> {
        match self.fields.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(ConfigError::unsupported(
                format!("{}.{k}", self.path),
                format!("`{k}` of Keras layer {class}"),
            )),
            None => Ok(()),
        }
    }

    /// `key`'s value when set (not null), read by `pick`; another kind of
    /// value is an error saying it needs a `kind`.
    fn value<'s, T>(
        &'s self,
        key: &str,
        kind: &str,
        pick: impl Fn(&'s prost_types::value::Kind) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        use prost_types::value::Kind;
        match self.fields.get(key).and_then(|v| v.kind.as_ref()) {
            None | Some(Kind::NullValue(_)) => Ok(None),
            Some(k) => pick(k)
                .map(Some)
                .ok_or_else(|| ConfigError::invalid(format!("{}.{key}", self.path), format!("needs a {kind}"))),
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        use prost_types::value::Kind;
        self.value(key, "number_value", |k| match k {
            Kind::NumberValue(x) => Some(*x),
            _ => None,
        })
    }

    fn numbers(&self, key: &str) -> Result<Option<Vec<f64>>, ConfigError> {
        use prost_types::value::Kind;
        self.value(key, "list of numbers", |k| match k {
            Kind::ListValue(l) => l
                .values
                .iter()
                .map(|v| match v.kind {
                    Some(Kind::NumberValue(x)) => Some(x),
                    _ => None,
                })
                .collect(),
            _ => None,
        })
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        use prost_types::value::Kind;
        self.value(key, "bool_value", |k| match k {
            Kind::BoolValue(x) => Some(*x),
            _ => None,
        })
    }

    fn string(&self, key: &str) -> Result<Option<&str>, ConfigError> {
        use prost_types::value::Kind;
        self.value(key, "string_value", |k| match k {
            Kind::StringValue(x) => Some(x.as_str()),
            _ => None,
        })
    }

    fn count(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.number(key)? {
            Some(x) if x >= 1.0 && x.fract() == 0.0 => Ok(Some(x as usize)),
            Some(x) => Err(ConfigError::invalid(
                format!("{}.{key}", self.path),
                format!("{x} is not a positive whole number"),
            )),
            None => Ok(None),
        }
    }
}

const SUPPORTED_LAYERS: &str =
    "MLP, PPNet, AITMTower, Dense, Dropout, Add, FM, DotInteraction, Cross, CIN, MaskNet, Highway, SENet, FiBiNet, BiLinear, MMoE, MaskBlock, Gate, PeriodicEmbedding, AutoDisEmbedding, NaryDisEmbedding, DIN, BST, TextCNN, SeqAugment, SeqAugmentOps, AuxiliaryLoss";

pub fn parse(k: &proto::KerasLayer, path: &str) -> Result<Keras, ConfigError> {
    use proto::keras_layer::Params;
    let class = k.class_name.as_str();
    let empty = BTreeMap::new();
    let st = StParams {
        fields: match &k.params {
            Some(Params::StParams(s)) => &s.fields,
            _ => &empty,
        },
        path: format!("{path}.st_params"),
    };
    // A layer that reads only its typed parameter block.
    let takes = |expected: &str| ConfigError::invalid(path, format!("Keras layer {class} takes {expected}"));
    let params_for = |expected: &str| -> Result<(), ConfigError> {
        match &k.params {
            None | Some(Params::StParams(_)) => Ok(()),
            Some(other) => Err(ConfigError::invalid(
                path,
                format!("Keras layer {class} takes {expected}, not `{other:?}`"),
            )),
        }
    };
    Ok(match class {
        "MLP" => match &k.params {
            Some(Params::Mlp(m)) => Keras::Mlp(mlp(m, &format!("{path}.mlp"))?),
            _ => return Err(ConfigError::invalid(path, "Keras layer MLP needs its `mlp` parameters")),
        },
        "PPNet" => match &k.params {
            Some(Params::Ppnet(p)) => ppnet(p, &format!("{path}.ppnet"))?,
            _ => return Err(takes("`ppnet { mlp { ... } gate_params { ... } mode: ... }`")),
        },
        "AITMTower" => match &k.params {
            Some(Params::Aitm(a)) => Keras::Aitm {
                project_dim: a.project_dim.filter(|d| *d > 0).map(|d| d as usize),
                transfer: a
                    .transfer_mlp
                    .as_ref()
                    .map(|m| mlp(m, &format!("{path}.aitm.transfer_mlp")))
                    .transpose()?,
                stop_gradient: a.stop_gradient(),
            },
            _ => {
                params_for("`aitm` or st_params")?;
                st.check_keys(&["project_dim", "stop_gradient"], class)?;
                Keras::Aitm {
                    project_dim: st.count("project_dim")?.filter(|d| *d > 0),
                    transfer: None,
                    stop_gradient: st.boolean("stop_gradient")?.unwrap_or(true),
                }
            }
        },
        "Dense" => {
            params_for("st_params")?;
            st.check_keys(&["units", "activation", "use_bias"], class)?;
            Keras::Dense {
                units: st
                    .count("units")?
                    .ok_or_else(|| ConfigError::invalid(&st.path, "Dense needs `units`"))?,
                activation: activation(
                    st.string("activation")?.unwrap_or("linear"),
                    &format!("{}.activation", st.path),
                )?,
                use_bias: st.boolean("use_bias")?.unwrap_or(true),
            }
        }
        "Dropout" => {
            params_for("st_params")?;
            st.check_keys(&["rate"], class)?;
            let rate = st
                .number("rate")?
                .ok_or_else(|| ConfigError::invalid(&st.path, "Dropout needs `rate`"))?;
            crate::config::validate::rate(rate, format!("{}.rate", st.path))?;
            Keras::Dropout { rate: rate as f32 }
        }
        "Add" => {
            params_for("no parameters")?;
            st.check_keys(&[], class)?;
            Keras::Add
        }
        "FM" => match &k.params {
            Some(Params::Fm(f)) => Keras::Fm {
                variant: f.use_variant(),
            },
            _ => {
                params_for("`fm` or st_params")?;
                st.check_keys(&["use_variant"], class)?;
                Keras::Fm {
                    variant: st.boolean("use_variant")?.unwrap_or(false),
                }
            }
        },
        "DotInteraction" => {
            params_for("st_params")?;
            st.check_keys(&["self_interaction", "skip_gather"], class)?;
            if st.boolean("skip_gather")?.unwrap_or(false) {
                return Err(ConfigError::unsupported(
                    format!("{}.skip_gather", st.path),
                    "DotInteraction's zero-padded square output",
                ));
            }
            Keras::DotInteraction {
                self_interaction: st.boolean("self_interaction")?.unwrap_or(false),
            }
        }
        "Cross" => {
            params_for("st_params")?;
            st.check_keys(&["projection_dim", "diag_scale", "use_bias"], class)?;
            if st.number("diag_scale")?.unwrap_or(0.0) != 0.0 {
                return Err(ConfigError::unsupported(
                    format!("{}.diag_scale", st.path),
                    "Cross's diagonal scale",
                ));
            }
            Keras::Cross {
                projection_dim: st.count("projection_dim")?,
                use_bias: st.boolean("use_bias")?.unwrap_or(true),
            }
        }
        "PeriodicEmbedding" => {
            let (dim, sigma, linear, act, out) = match &k.params {
                Some(Params::PeriodicEmbedding(p)) => (
                    p.embedding_dim as usize,
                    p.sigma,
                    p.add_linear_layer(),
                    p.linear_activation().to_string(),
                    NumericOut::of(p.output_tensor_list(), p.output_3d_tensor()),
                ),
                _ => {
                    params_for("`periodic_embedding` or st_params")?;
                    st.check_keys(
                        &[
                            "embedding_dim",
                            "sigma",
                            "add_linear_layer",
                            "linear_activation",
                            "output_3d_tensor",
                            "output_tensor_list",
                        ],
                        class,
                    )?;
                    (
                        st.count("embedding_dim")?.unwrap_or(0),
                        st.number("sigma")?.unwrap_or(f64::NAN) as f32,
                        st.boolean("add_linear_layer")?.unwrap_or(true),
                        st.string("linear_activation")?.unwrap_or("relu").to_string(),
                        NumericOut::of(
                            st.boolean("output_tensor_list")?.unwrap_or(false),
                            st.boolean("output_3d_tensor")?.unwrap_or(false),
                        ),
                    )
                }
            };
            if dim == 0 || dim % 2 == 1 {
                return Err(ConfigError::invalid(
                    format!("{path}.embedding_dim"),
                    format!("PeriodicEmbedding's embedding_dim must be even and positive, not {dim}"),
                ));
            }
            if !(sigma.is_finite() && sigma > 0.0) {
                return Err(ConfigError::invalid(
                    format!("{path}.sigma"),
                    "PeriodicEmbedding needs a positive sigma",
                ));
            }
            Keras::Periodic {
                dim,
                sigma,
                linear: linear
                    .then(|| activation(&act, &format!("{path}.linear_activation")))
                    .transpose()?,
                out,
            }
        }
        "AutoDisEmbedding" => {
            let (dim, bins, keep_prob, temperature, out) = match &k.params {
                Some(Params::AutoDisEmbedding(p)) => (
                    p.embedding_dim as usize,
                    p.num_bins as usize,
                    p.keep_prob,
                    p.temperature,
                    NumericOut::of(p.output_tensor_list(), p.output_3d_tensor()),
                ),
                _ => {
                    params_for("`auto_dis_embedding` or st_params")?;
                    st.check_keys(
                        &[
                            "embedding_dim",
                            "num_bins",
                            "keep_prob",
                            "temperature",
                            "output_3d_tensor",
                            "output_tensor_list",
                        ],
                        class,
                    )?;
                    (
                        st.count("embedding_dim")?.unwrap_or(0),
                        st.count("num_bins")?.unwrap_or(0),
                        st.number("keep_prob")?.unwrap_or(0.8) as f32,
                        st.number("temperature")?.unwrap_or(f64::NAN) as f32,
                        NumericOut::of(
                            st.boolean("output_tensor_list")?.unwrap_or(false),
                            st.boolean("output_3d_tensor")?.unwrap_or(false),
                        ),
                    )
                }
            };
            if dim == 0 || bins == 0 {
                return Err(ConfigError::invalid(
                    path,
                    "AutoDisEmbedding needs a positive embedding_dim and num_bins",
                ));
            }
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(ConfigError::invalid(
                    format!("{path}.temperature"),
                    "AutoDisEmbedding needs a positive temperature",
                ));
            }
            Keras::AutoDis {
                dim,
                bins,
                keep_prob,
                temperature,
                out,
            }
        }
        "NaryDisEmbedding" => nary_dis(k, &st, path)?,
        "DIN" => {
            let Some(Params::Din(d)) = &k.params else {
                return Err(takes("`din { attention_dnn { ... } }`"));
            };
            let path = format!("{path}.din");
            match d.attention_normalizer.as_str() {
                "softmax" => {}
                "sigmoid" => {
                    return Err(ConfigError::unsupported(
                        format!("{path}.attention_normalizer"),
                        "DIN's sigmoid attention normalizer",
                    ))
                }
                other => {
                    return Err(ConfigError::invalid(
                        format!("{path}.attention_normalizer"),
                        format!("`{other}` is not softmax or sigmoid"),
                    ))
                }
            }
            // EasyRec's DIN overrides its scoring MLP's last layer.
            let mut m = d.attention_dnn.clone();
            m.use_final_bn = Some(false);
            m.use_final_bias = Some(true);
            m.final_activation = Some("linear".into());
            if m.hidden_units.last() != Some(&1) {
                return Err(ConfigError::invalid(
                    format!("{path}.attention_dnn.hidden_units"),
                    "DIN scores each position with the MLP's last layer: it has 1 unit",
                ));
            }
            let mut scorer = mlp(&m, &format!("{path}.attention_dnn"))?;
            // EasyRec 0.7.1 scores with its `dnn.DNN`: a bias in every layer.
            for l in &mut scorer.layers {
                l.use_bias_071 = true;
            }
            Keras::Din {
                mlp: scorer,
                need_target: d.need_target_feature,
            }
        }
        "BST" => {
            let Some(Params::Bst(b)) = &k.params else {
                return Err(takes("`bst { hidden_size: ... }`"));
            };
            Keras::Bst(bst_layer(b, &format!("{path}.bst"))?)
        }
        "SeqAugment" | "SeqAugmentOps" => {
            let default = proto::SequenceAugment::default();
            let a = match &k.params {
                Some(Params::SeqAug(a)) => a,
                None => &default,
                Some(_) => return Err(takes("`seq_aug { mask_rate: ... crop_rate: ... reorder_rate: ... }`")),
            };
            let at = format!("{path}.seq_aug");
            for (field, rate) in [
                ("mask_rate", a.mask_rate),
                ("crop_rate", a.crop_rate),
                ("reorder_rate", a.reorder_rate),
            ] {
                if !(0.0..=1.0).contains(&rate) {
                    return Err(ConfigError::invalid(
                        format!("{at}.{field}"),
                        format!("{rate} is not a share between 0 and 1"),
                    ));
                }
            }
            Keras::SeqAugment {
                aug: Augment {
                    crop: a.crop_rate,
                    mask: a.mask_rate,
                    reorder: a.reorder_rate,
                },
                vector_mask: class == "SeqAugmentOps",
            }
        }
        "AuxiliaryLoss" => {
            params_for("st_params")?;
            st.check_keys(&["loss_type", "loss_weight", "temperature"], class)?;
            let kind = st
                .string("loss_type")?
                .ok_or_else(|| ConfigError::invalid(&st.path, "AuxiliaryLoss needs `loss_type`"))?;
            let t = st.number("temperature")?.unwrap_or(0.1) as f32;
            if t <= 0.0 || !t.is_finite() {
                return Err(ConfigError::invalid(
                    format!("{}.temperature", st.path),
                    format!("{t} is not a positive temperature"),
                ));
            }
            let loss = match kind {
                "l2_loss" => Some(AuxLoss::L2),
                "nce_loss" => Some(AuxLoss::Contrast(Contrast::Nce { t })),
                "info_nce" => Some(AuxLoss::Contrast(Contrast::InfoNce { t })),
                other => {
                    log::warn!(
                        "{}.loss_type: `{other}` is none of l2_loss, nce_loss, info_nce; EasyRec's AuxiliaryLoss adds no loss for it, nor does this",
                        st.path
                    );
                    None
                }
            };
            Keras::AuxiliaryLoss {
                loss,
                weight: st.number("loss_weight")?.unwrap_or(1.0) as f32,
            }
        }
        "TextCNN" => {
            let Some(Params::TextCnn(t)) = &k.params else {
                return Err(takes(
                    "`text_cnn { filter_sizes: [...] num_filters: [...] pad_sequence_length: n }`",
                ));
            };
            let path = format!("{path}.text_cnn");
            if t.pad_sequence_length == 0 {
                return Err(ConfigError::unsupported(
                    format!("{path}.pad_sequence_length"),
                    "a text CNN without pad_sequence_length (EasyRec then pads each batch to its longest row, so a row's score depends on its batch)",
                ));
            }
            let pad = t.pad_sequence_length as usize;
            let (filter_sizes, num_filters) = text_cnn_filters(&t.filter_sizes, &t.num_filters, pad, &path)?;
            Keras::TextCnn {
                filter_sizes,
                num_filters,
                pad,
                activation: activation(t.activation(), &format!("{path}.activation"))?,
                mlp: t.mlp.as_ref().map(|m| mlp(m, &format!("{path}.mlp"))).transpose()?,
            }
        }
        "CIN" => {
            let sizes = match &k.params {
                Some(Params::Cin(c)) => c.hidden_feature_sizes.clone(),
                _ => return Err(takes("`cin { hidden_feature_sizes: [...] }`")),
            };
            if sizes.is_empty() || sizes.iter().any(|&h| h < 1) {
                return Err(ConfigError::invalid(
                    format!("{path}.cin.hidden_feature_sizes"),
                    "needs at least one layer, each of at least one feature map",
                ));
            }
            Keras::Cin {
                sizes: sizes.into_iter().map(|h| h as usize).collect(),
            }
        }
        "MaskBlock" => match &k.params {
            Some(Params::MaskBlock(b)) => Keras::MaskBlock(mask_block(b, &format!("{path}.mask_block"))?),
            _ => return Err(takes("`mask_block { ... }`")),
        },
        "Gate" => {
            params_for("st_params")?;
            st.check_keys(&["weight_index"], class)?;
            let weight_index = match st.number("weight_index")? {
                Some(x) if x >= 0.0 && x.fract() == 0.0 => x as usize,
                Some(x) => {
                    return Err(ConfigError::invalid(
                        format!("{}.weight_index", st.path),
                        format!("{x} is not an index"),
                    ))
                }
                None => 0,
            };
            Keras::Gate { weight_index }
        }
        "MMoE" => match &k.params {
            Some(Params::Mmoe(m)) => {
                if m.num_task == 0 || m.num_expert() == 0 {
                    return Err(ConfigError::invalid(
                        format!("{path}.mmoe"),
                        "MMoE needs num_task and num_expert of at least 1",
                    ));
                }
                Keras::Mmoe {
                    tasks: m.num_task as usize,
                    experts: m.num_expert() as usize,
                    expert_mlp: m
                        .expert_mlp
                        .as_ref()
                        .map(|e| mlp(e, &format!("{path}.mmoe.expert_mlp")))
                        .transpose()?,
                }
            }
            _ => return Err(takes("`mmoe { num_task: ... num_expert: ... expert_mlp { ... } }`")),
        },
        "FiBiNet" => match &k.params {
            Some(Params::Fibinet(f)) => Keras::FiBiNet {
                senet: senet_params(&f.senet, &format!("{path}.fibinet.senet"))?,
                bilinear: f
                    .bilinear
                    .as_ref()
                    .map(|b| bilinear(b, &format!("{path}.fibinet.bilinear")))
                    .transpose()?,
                mlp: f
                    .mlp
                    .as_ref()
                    .map(|m| mlp(m, &format!("{path}.fibinet.mlp")))
                    .transpose()?,
            },
            _ => return Err(takes("`fibinet { senet { ... } bilinear { ... } mlp { ... } }`")),
        },
        "BiLinear" => match &k.params {
            Some(Params::Bilinear(b)) => Keras::Bilinear(bilinear(b, &format!("{path}.bilinear"))?),
            _ => return Err(takes("`bilinear { type: ... num_output_units: ... }`")),
        },
        "SENet" => Keras::SeNet(match &k.params {
            Some(Params::Senet(p)) => senet_params(p, path)?,
            _ => {
                params_for("`senet` or st_params")?;
                st.check_keys(
                    &[
                        "reduction_ratio",
                        "num_squeeze_group",
                        "use_skip_connection",
                        "use_output_layer_norm",
                    ],
                    class,
                )?;
                // `count` refuses zeros.
                SeNetParams {
                    reduction_ratio: st.count("reduction_ratio")?.unwrap_or(4),
                    groups: st.count("num_squeeze_group")?.unwrap_or(2),
                    skip: st.boolean("use_skip_connection")?.unwrap_or(true),
                    layer_norm: st.boolean("use_output_layer_norm")?.unwrap_or(true),
                }
            }
        }),
        "Highway" => {
            let (emb_size, num_layers, act, dropout, bias) = match &k.params {
                Some(Params::Highway(h)) => (
                    Some(h.emb_size as usize).filter(|e| *e > 0),
                    h.num_layers() as usize,
                    h.activation.clone(),
                    h.dropout_rate(),
                    h.init_gate_bias(),
                ),
                _ => {
                    params_for("`highway` or st_params")?;
                    st.check_keys(
                        &["emb_size", "num_layers", "activation", "dropout_rate", "init_gate_bias"],
                        class,
                    )?;
                    (
                        st.count("emb_size")?,
                        st.count("num_layers")?.unwrap_or(1),
                        st.string("activation")?.unwrap_or("relu").to_string(),
                        st.number("dropout_rate")?.unwrap_or(0.0) as f32,
                        st.number("init_gate_bias")?.unwrap_or(-3.0) as f32,
                    )
                }
            };
            crate::config::validate::rate(dropout, format!("{path}.dropout_rate"))?;
            Keras::Highway {
                emb_size,
                num_layers,
                activation: activation(&act, &format!("{path}.activation"))?,
                dropout,
                init_gate_bias: bias,
            }
        }
        "MaskNet" => match &k.params {
            Some(Params::Masknet(m)) => masknet(m, &format!("{path}.masknet"))?,
            _ => {
                return Err(ConfigError::invalid(
                    path,
                    "Keras layer MaskNet needs its `masknet` parameters",
                ))
            }
        },
        other => {
            return Err(ConfigError::Unsupported {
                path: format!("{path}.class_name"),
                what: format!("Keras layer `{other}`"),
                hint: format!(" (supported: {SUPPORTED_LAYERS})"),
            })
        }
    })
}

fn mask_block(b: &proto::MaskBlock, path: &str) -> Result<MaskBlock, ConfigError> {
    // EasyRec takes reduction_factor when set, else aggregation_size.
    let aggregation = match (b.reduction_factor, b.aggregation_size) {
        (Some(f), _) if f > 0.0 => Aggregation::Factor(f),
        (_, Some(n)) if n > 0 => Aggregation::Size(n as usize),
        _ => {
            return Err(ConfigError::invalid(
                path,
                "a mask block needs reduction_factor or aggregation_size",
            ))
        }
    };
    Ok(MaskBlock {
        aggregation,
        output_size: b.output_size.filter(|n| *n > 0).map(|n| n as usize),
        input_layer_norm: b.input_layer_norm(),
        projection_dim: b.projection_dim.filter(|n| *n > 0).map(|n| n as usize),
    })
}

fn masknet(m: &proto::MaskNet, path: &str) -> Result<Keras, ConfigError> {
    if m.mask_blocks.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.mask_blocks"),
            "MaskNet needs a mask block",
        ));
    }
    let blocks = m
        .mask_blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let bpath = format!("{path}.mask_blocks[{i}]");
            mask_block(b, &bpath)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Keras::MaskNet {
        blocks,
        parallel: m.use_parallel,
        input_layer_norm: m.input_layer_norm(),
        mlp: m.mlp.as_ref().map(|x| mlp(x, &format!("{path}.mlp"))).transpose()?,
    })
}

/// PPNet's parameters at `path`, read as EasyRec's `Parameter` reads them:
/// an unset `mode` is its proto default, eager; an unset gate `hidden_dim`
/// is the gated width.
fn ppnet(p: &proto::PpNet, path: &str) -> Result<Keras, ConfigError> {
    let eager = match p.mode.as_str() {
        "lazy" => false,
        "eager" | "" => true,
        other => {
            // EasyRec runs any mode but `lazy` as eager.
            log::warn!("{path}.mode: `{other}` is not lazy, and EasyRec runs it as eager; so does this trainer");
            true
        }
    };
    let gp = &p.gate_params;
    let gate = GateNet {
        output_dim: gp.output_dim.unwrap_or(0) as usize,
        hidden_dim: gp.hidden_dim.filter(|d| *d > 0).map(|d| d as usize),
        activation: crate::config::model::layers::layer_activation(
            gp.activation(),
            &format!("{path}.gate_params.activation"),
        )?,
        use_bn: gp.use_bn(),
        dropout: gp.dropout_rate(),
    };
    crate::config::validate::rate(gate.dropout, format!("{path}.gate_params.dropout_rate"))?;
    if gate.activation == Activation::Dice && gate.use_bn {
        return Err(ConfigError::unsupported(
            format!("{path}.gate_params.activation"),
            "dice after a gate's batch norm",
        ));
    }
    Ok(Keras::PpNet {
        mlp: mlp(&p.mlp, &format!("{path}.mlp"))?,
        gate,
        eager,
        full_gate_input: p.full_gate_input(),
    })
}

/// The largest NaryDisEmbedding table, in values (1 GiB of f32): its rows
/// grow with the bases (`carries`), its columns with `embedding_dim` times
/// `num_replicas`, per input feature.
const MAX_NARY_TABLE_PER_FEATURE: u128 = 1 << 28;

/// EasyRec's NaryDisEmbedding parameters, read as its `Parameter` reads
/// them: unset fields take the layer's defaults (`carries` [2, 9],
/// `multiplier` 1, `intra_ary_pooling` sum, one replica).
fn nary_dis(k: &proto::KerasLayer, st: &StParams<'_>, path: &str) -> Result<Keras, ConfigError> {
    use proto::keras_layer::Params;
    let (dim, carries, multiplier, pooling, replicas, out) = match &k.params {
        Some(Params::NaryDisEmbedding(p)) => {
            if p.inter_ary_pooling() != "concat" {
                // EasyRec reads no inter_ary_pooling ("not supported yet").
                log::warn!(
                    "{path}.nary_dis_embedding.inter_ary_pooling: `{}` is ignored, as EasyRec ignores it: \
                     the bases' embeddings are concatenated",
                    p.inter_ary_pooling()
                );
            }
            (
                f64::from(p.embedding_dim),
                p.carries.iter().map(|&c| f64::from(c)).collect::<Vec<_>>(),
                p.multiplier(),
                p.intra_ary_pooling().to_string(),
                f64::from(p.num_replicas()),
                NumericOut::of(p.output_tensor_list(), p.output_3d_tensor()),
            )
        }
        None | Some(Params::StParams(_)) => {
            st.check_keys(
                &[
                    "embedding_dim",
                    "carries",
                    "multiplier",
                    "intra_ary_pooling",
                    "num_replicas",
                    "output_3d_tensor",
                    "output_tensor_list",
                ],
                "NaryDisEmbedding",
            )?;
            // EasyRec's check_required on st_params.
            for key in ["embedding_dim", "carries"] {
                if !st.fields.contains_key(key) {
                    return Err(ConfigError::invalid(
                        format!("{path}.st_params.{key}"),
                        format!("NaryDisEmbedding needs `{key}`"),
                    ));
                }
            }
            (
                st.number("embedding_dim")?.unwrap_or(0.0),
                st.numbers("carries")?.unwrap_or_default(),
                st.number("multiplier")?.unwrap_or(1.0) as f32,
                st.string("intra_ary_pooling")?.unwrap_or("sum").to_string(),
                st.number("num_replicas")?.unwrap_or(1.0),
                NumericOut::of(
                    st.boolean("output_tensor_list")?.unwrap_or(false),
                    st.boolean("output_3d_tensor")?.unwrap_or(false),
                ),
            )
        }
        Some(other) => {
            return Err(ConfigError::invalid(
                path,
                format!("Keras layer NaryDisEmbedding takes `nary_dis_embedding` or st_params, not `{other:?}`"),
            ))
        }
    };
    let whole = |x: f64, field: &str, least: f64| -> Result<usize, ConfigError> {
        if x >= least && x.fract() == 0.0 && x <= f64::from(u32::MAX) {
            Ok(x as usize)
        } else {
            Err(ConfigError::invalid(
                format!("{path}.{field}"),
                format!("NaryDisEmbedding's {field} must be a whole number of at least {least}, not {x}"),
            ))
        }
    };
    let dim = whole(dim, "embedding_dim", 1.0)?;
    let replicas = whole(replicas, "num_replicas", 1.0)?;
    // An empty list takes EasyRec's default bases.
    let carries = if carries.is_empty() { vec![2.0, 9.0] } else { carries };
    let carries = carries
        .into_iter()
        .map(|c| whole(c, "carries", 2.0).map(|c| c as u32))
        .collect::<Result<Vec<_>, _>>()?;
    let rows: u128 = carries
        .iter()
        .map(|&c| crate::model::graph::nary::Nary::length(c) as u128)
        .sum();
    if rows * (dim * replicas) as u128 > MAX_NARY_TABLE_PER_FEATURE {
        return Err(ConfigError::invalid(
            format!("{path}.carries"),
            format!(
                "NaryDisEmbedding's table would hold {rows} rows of {} values per feature, over the {} values allowed",
                dim * replicas,
                MAX_NARY_TABLE_PER_FEATURE
            ),
        ));
    }
    if !multiplier.is_finite() {
        return Err(ConfigError::invalid(
            format!("{path}.multiplier"),
            "NaryDisEmbedding needs a finite multiplier",
        ));
    }
    let mean = match pooling.as_str() {
        "sum" => false,
        "mean" => true,
        other => {
            return Err(ConfigError::invalid(
                format!("{path}.intra_ary_pooling"),
                format!("NaryDisEmbedding pools by `sum` or `mean`, not `{other}`"),
            ))
        }
    };
    Ok(Keras::NaryDis {
        dim,
        carries,
        multiplier,
        mean,
        replicas,
        out,
    })
}
