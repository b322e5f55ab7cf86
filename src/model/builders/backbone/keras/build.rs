//! The Keras layers of a backbone block (`parse.rs` beside it types them,
//! in the same order) onto the model graph.

use anyhow::{bail, Context};

use super::super::value::*;
use super::parse::{
    Aggregation, AuxLoss, Bilinear, BilinearKind, BstLayer, GateNet, Keras, MaskBlock, NumericOut, SeNetParams,
};
use crate::config::model::backbone::{Expr, Release};
use crate::config::model::layers::{Mlp, MlpLayer};
use crate::config::model::Activation;
use crate::model::graph::nary::Nary;
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, Kernel, Keys, NodeId, Reduce, Scope};

/// The Keras SENet layer (FiBiNet++'s) over `fields`.
pub(in crate::model::builders::backbone) fn keras_senet(
    fields: &[NodeId],
    p: &SeNetParams,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let style = SeNetStyle::Keras {
        skip: p.skip,
        layer_norm: p.layer_norm,
    };
    senet(fields, name, (p.reduction_ratio, p.groups), style, g, s)
}

/// The field embeddings of a list input.
pub(in crate::model::builders::backbone) fn field_list(v: &Val, g: &mut Graph) -> anyhow::Result<Vec<NodeId>> {
    let Val::L(items) = v else {
        bail!("takes a list of field embeddings, got {}", v.describe(g));
    };
    items.iter().map(|x| tensor(x, g)).collect()
}

/// EasyRec's BiLinear over `fields` (`Keras::Bilinear`): Keras' Dense
/// layers (glorot uniform, bias, no regularizer) named `all`, `each_i` or
/// `interaction_i_j`, and `output`.
pub(in crate::model::builders::backbone) fn bilinear_layer(
    fields: &[NodeId],
    b: &Bilinear,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let f = fields.len();
    if f < 2 {
        bail!("BiLinear needs at least two fields, got {f}");
    }
    let d = g.width(fields[0]);
    let equal = fields.iter().all(|x| g.width(*x) == d);
    if !equal && b.kind != BilinearKind::Interaction {
        bail!("BiLinear of type all or each needs fields of one embedding dimension");
    }
    let k = Kernel::UNREGULARIZED;
    let lin = Activation::Linear;
    let pairs: Vec<(usize, usize)> = (0..f).flat_map(|i| (i + 1..f).map(move |j| (i, j))).collect();
    // Field i through its dense layer, for each pair (i, j).
    let mut projected: Vec<NodeId> = Vec::new();
    match b.kind {
        BilinearKind::All => {
            let head = g.concat(&fields[..f - 1]);
            let rows = g.unfold(head, f - 1);
            let y = s.layer(g, rows, &format!("{name}/all"), d, k, lin);
            let y = g.fold(y, f - 1);
            projected.extend((0..f - 1).map(|i| g.slice(y, i * d, d)));
        }
        BilinearKind::Each => {
            for (i, x) in fields[..f - 1].iter().enumerate() {
                projected.push(s.layer(g, *x, &format!("{name}/each_{i}"), d, k, lin));
            }
        }
        BilinearKind::Interaction => {}
    }
    let mut p = Vec::with_capacity(pairs.len());
    for &(i, j) in &pairs {
        let vi = match b.kind {
            BilinearKind::Interaction => {
                let dj = g.width(fields[j]);
                s.layer(g, fields[i], &format!("{name}/interaction_{i}_{j}"), dj, k, lin)
            }
            _ => projected[i],
        };
        let prod = g.mul(vi, fields[j]);
        p.push(if b.plus { g.row_sum(prod) } else { prod });
    }
    let p = g.concat(&p);
    Ok(s.layer(g, p, &format!("{name}/output"), b.units, k, lin))
}

/// A numeric embedding layer's output from its embeddings `emb`
/// (`[batch, n * dim]`), as `out` asks.
pub(in crate::model::builders::backbone) fn numeric_out(
    emb: NodeId,
    n: usize,
    dim: usize,
    out: NumericOut,
    g: &mut Graph,
) -> Val {
    match out {
        NumericOut::Tensor => Val::T(emb),
        NumericOut::AndStacked => Val::L(vec![Val::T(emb), Val::S { x: emb, n, d: dim }]),
        NumericOut::AndList => {
            let list = (0..n).map(|k| Val::T(g.slice(emb, k * dim, dim))).collect();
            Val::L(vec![Val::T(emb), Val::L(list)])
        }
    }
}

/// EasyRec's BST Keras layer (`Keras::Bst`) over `(seq, len, target)`.
/// Without target features (CL4SRec's encoder) the positions go alone,
/// masked as EasyRec's additive mask of the row's length does (a row of
/// none attends to every position alike); out comes the head position's
/// output, or every position's.
pub(in crate::model::builders::backbone) fn bst(
    v: &Val,
    b: &BstLayer,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let SeqIn { x, n, d, len, target } = seq_of(v, Some(b.max_position), g).context("BST")?;
    match target {
        Some(t) if g.width(t) != d => bail!(
            "BST: the sequence is {d} wide and the target features {}; EasyRec needs them equal",
            g.width(t)
        ),
        None if b.all_tokens && b.reserve_target => bail!(
            "BST: output_all_token_embeddings without target features and with reserve_target_position: \
             EasyRec's attention mask then holds one position more than the sequence, which it cannot run"
        ),
        _ => {}
    }
    // Projected to the hidden size with ReLU (tf.layers.dense with the
    // block's l2 regularizer) when their width differs.
    let spec = &b.encoder;
    let mut project = |g: &mut Graph, x: NodeId, what: &str| {
        if d == spec.hidden {
            x
        } else {
            let dense = Kernel::DENSE;
            s.layer(g, x, &format!("{name}/{what}"), spec.hidden, dense, Activation::Relu)
        }
    };
    let rows = g.unfold(x, n);
    let rows = project(g, rows, "seq_project");
    let seq = g.fold(rows, n);
    let (all, m) = match target {
        Some(t) => {
            let t = project(g, t, "target_project");
            (g.concat(&[t, seq]), n + 1)
        }
        None => (seq, n),
    };
    let post = (spec.init_range, spec.hidden_dropout);
    let rows = crate::model::builders::transformer::embedding_postprocessor(g, s, (all, m), (name, name), post);
    let keys = match target {
        // The target and the row's first `len` positions.
        Some(_) => Keys::Live(g.shift(len, 1.0)),
        None => Keys::Mask(g.prefix_mask(len, n)),
    };
    let out = crate::model::builders::transformer::encoder(g, s, rows, keys, spec, &format!("{name}/transformer"));
    let out = g.fold(out, m);
    Ok(if b.all_tokens {
        out
    } else {
        g.slice(out, 0, spec.hidden)
    })
}

/// Keras' truncated-normal variance scaling: the standard deviation of
/// `he_normal` (`fan_avg: false`) or `glorot_normal` (`fan_avg: true`).
pub(in crate::model::builders::backbone) fn truncated_std(fan_in: usize, fan_out: usize, fan_avg: bool) -> f32 {
    // The normal cut at two standard deviations has this much less spread.
    const CUT: f64 = 0.879_625_661_034_239_8;
    let var = if fan_avg {
        2.0 / (fan_in + fan_out) as f64
    } else {
        2.0 / fan_in as f64
    };
    (var.sqrt() / CUT) as f32
}

/// Which of EasyRec's two SENets: the Keras layer (FiBiNet++'s: `W1` with
/// he_normal, `W2`, no regularizer, optional skip connection and layer
/// norm) or DSSM_SENet's (`reduce` with the model's l2_regularization,
/// `excite`, nothing after the reweighting).
#[derive(Debug, Clone, Copy)]
pub enum SeNetStyle {
    Keras { skip: bool, layer_norm: bool },
    Classic,
}

/// A SENet over field embeddings `fields`, each of a width divisible by
/// `groups`: per field and group the max and the mean, a relu layer of
/// `max(1, fields * groups * 2 / ratio)` units, a layer to one weight per
/// embedding value (glorot_normal), the embeddings reweighted.
pub fn senet(
    fields: &[NodeId],
    name: &str,
    (ratio, groups): (usize, usize),
    style: SeNetStyle,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let mut squeezed = Vec::new();
    for &f in fields {
        let dim = g.width(f);
        if dim < groups || !dim.is_multiple_of(groups) {
            bail!("SENet: a field embedding of dimension {dim} is not divisible into {groups} squeeze groups");
        }
        // Each group's values as a row of their own: max and mean per row.
        let per = dim / groups;
        let rows = g.unfold(f, groups);
        let max = g.max_blocks(rows, per);
        let sum = g.sum_blocks(rows, per);
        let mean = g.scale(sum, 1.0 / per as f32, None);
        squeezed.push(g.fold(max, groups));
        squeezed.push(g.fold(mean, groups));
    }
    let z = g.concat(&squeezed);
    let emb = g.concat(fields);
    let (zw, ew) = (g.width(z), g.width(emb));
    let reduction = (fields.len() * groups * 2 / ratio).max(1);
    let (reduce, excite, w1) = match style {
        SeNetStyle::Keras { .. } => (
            "W1",
            "W2",
            Kernel {
                init: Init::TruncatedNormal(truncated_std(zw, reduction, false)),
                l2: false,
                bias: true,
            },
        ),
        SeNetStyle::Classic => ("reduce", "excite", Kernel::DENSE),
    };
    let a1 = s.layer(g, z, &format!("{name}/{reduce}"), reduction, w1, Activation::Relu);
    let w2 = Kernel {
        init: Init::TruncatedNormal(truncated_std(reduction, ew, true)),
        l2: false,
        bias: true,
    };
    let weights = s.layer(g, a1, &format!("{name}/{excite}"), ew, w2, Activation::Linear);
    let mut out = g.mul(emb, weights);
    if let SeNetStyle::Keras { skip, layer_norm } = style {
        if skip {
            out = g.add(&[out, emb]);
        }
        if layer_norm {
            out = s.layer_norm(g, out, &format!("{name}/output_ln"));
        }
    }
    Ok(out)
}

pub(in crate::model::builders::backbone) fn keras(
    k: &Keras,
    v: Val,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    Ok(match k {
        Keras::Mlp(m) => {
            let x = tensor(&v, g).context("MLP")?;
            Val::T(mlp(x, m, name, g, s))
        }
        Keras::PpNet {
            mlp: m,
            gate,
            eager,
            full_gate_input,
        } => {
            let items = field_list(&v, g).context("PPNet")?;
            let [x, gate_in] = items[..] else {
                bail!(
                    "PPNet takes a list of its input and its gate input, got {} values",
                    items.len()
                );
            };
            Val::T(ppnet((x, gate_in), (m, gate, *eager, *full_gate_input), name, g, s)?)
        }
        Keras::Aitm {
            project_dim,
            transfer,
            stop_gradient,
        } => match &v {
            // EasyRec's AITMTower passes a single tower through.
            Val::L(_) => {
                let items = field_list(&v, g).context("AITMTower")?;
                if items.is_empty() {
                    bail!("AITMTower takes a list of towers, got an empty one");
                }
                Val::T(aitm(
                    &items,
                    (*project_dim, transfer.as_ref(), *stop_gradient),
                    name,
                    g,
                    s,
                )?)
            }
            _ => v,
        },
        Keras::Din {
            mlp: scorer,
            need_target,
        } => {
            let SeqIn { x, n, d, len, target } = seq_of(&v, None, g).context("DIN")?;
            let Some(target) = target else {
                bail!("DIN: the input layer's group has no target features besides its sequences");
            };
            let dq = g.width(target);
            if dq > d {
                bail!("DIN: the target features are {dq} wide, wider than the sequence ({d})");
            }
            let query = if dq < d {
                let pad = g.zeros(target, d - dq);
                g.concat(&[target, pad])
            } else {
                target
            };
            let keys = g.unfold(x, n);
            let q = g.tile(query, n);
            let (diff, prod) = (g.sub(q, keys), g.mul(q, keys));
            let all = g.concat(&[q, keys, diff, prod]);
            let z = mlp(all, scorer, &format!("{name}/din_attention"), g, s);
            let scores = g.fold(z, n);
            let w = g.masked_softmax(scores, len);
            let pooled_keys = if dq < d {
                let cut = g.slice(keys, 0, dq);
                g.fold(cut, n)
            } else {
                x
            };
            let out = g.attn_pool(w, pooled_keys);
            Val::T(if *need_target { g.concat(&[out, query]) } else { out })
        }
        Keras::Bst(b) => Val::T(bst(&v, b, name, g, s)?),
        Keras::SeqAugment { aug, vector_mask } => {
            let SeqIn { x, n, d, len, .. } = seq_of(&v, None, g).context("SeqAugment")?;
            let init = if *vector_mask {
                Init::GlorotUniformVector
            } else {
                Init::GlorotUniform
            };
            let mask = s.params.add(&format!("{name}/mask"), 1, d, init, false, s.rng);
            let y = g.seq_augment(x, len, (&*s.params, mask), *aug);
            let seq = g.slice(y, 0, n * d);
            let len = g.slice(y, n * d, 1);
            Val::L(vec![Val::S { x: seq, n, d }, Val::T(len)])
        }
        Keras::AuxiliaryLoss { loss, weight } => {
            let pair = match &v {
                Val::L(items) if items.len() == 2 => items,
                other => bail!(
                    "AuxiliaryLoss takes a list of two (merge_inputs_into_list), got {}",
                    other.describe(g)
                ),
            };
            let a = tensor(&pair[0], g).context("AuxiliaryLoss")?;
            let c = tensor(&pair[1], g).context("AuxiliaryLoss")?;
            if g.width(a) != g.width(c) {
                bail!(
                    "AuxiliaryLoss: its inputs are {} and {} wide; they must match",
                    g.width(a),
                    g.width(c)
                );
            }
            let Some(loss) = loss else {
                return Ok(Val::T(g.zeros(a, 1)));
            };
            let node = match loss {
                AuxLoss::L2 => {
                    let diff = g.sub(a, c);
                    let sq = g.mul(diff, diff);
                    g.row_sum(sq)
                }
                AuxLoss::Contrast(kind) => g.contrastive(a, c, *kind),
            };
            g.penalty(
                &format!("{name}_{}", loss.suffix()),
                node,
                Reduce::UnweightedMean,
                *weight,
            );
            Val::T(node)
        }
        Keras::TextCnn {
            filter_sizes,
            num_filters,
            pad,
            activation,
            mlp: top,
        } => {
            let SeqIn { x, n, d, .. } = seq_of(&v, Some(*pad), g).context("TextCNN")?;
            let net = crate::model::builders::sequence::text_cnn(
                (x, n, d),
                (filter_sizes, num_filters, *activation),
                name,
                g,
                s,
            );
            Val::T(match top {
                Some(m) => mlp(net, m, &format!("{name}/mlp"), g, s),
                None => net,
            })
        }
        Keras::Dense {
            units,
            activation,
            use_bias,
        } => {
            let x = tensor(&v, g).context("Dense")?;
            let k = Kernel {
                bias: *use_bias,
                ..Kernel::UNREGULARIZED
            };
            Val::T(s.layer(g, x, name, *units, k, *activation))
        }
        Keras::Dropout { rate } => Val::T(g.dropout(tensor(&v, g).context("Dropout")?, *rate)),
        Keras::SeNet(p) => {
            let fields = field_list(&v, g).context("SENet")?;
            Val::T(keras_senet(&fields, p, name, g, s)?)
        }
        Keras::Highway {
            emb_size,
            num_layers,
            activation,
            dropout,
            init_gate_bias,
        } => {
            // Keras' Dense layers: glorot uniform, no regularizer.
            let k = Kernel::UNREGULARIZED;
            let mut x = tensor(&v, g).context("Highway")?;
            if let Some(e) = emb_size.filter(|e| *e != g.width(x)) {
                x = s.layer(g, x, &format!("{name}/input_projection"), e, k, Activation::Linear);
            }
            let d = g.width(x);
            for i in 0..*num_layers {
                let gate_name = format!("{name}/gate_{i}");
                let gate = s.layer_biased(g, x, &gate_name, (d, *init_gate_bias), k, Activation::Sigmoid);
                // The transforms are Keras' unnamed Dense layers.
                let dense = if i == 0 {
                    "dense".to_string()
                } else {
                    format!("dense_{i}")
                };
                let t = s.layer(g, x, &format!("{name}/{dense}"), d, k, *activation);
                let t = g.dropout(t, *dropout);
                let diff = g.sub(t, x);
                let gated = g.mul(gate, diff);
                x = g.add(&[x, gated]);
            }
            Val::T(x)
        }
        Keras::Add => match v {
            Val::L(items) => apply(Expr::AddN, Val::L(items), g).context("Add")?,
            other => bail!("Add takes a list, got {}", other.describe(g)),
        },
        Keras::Fm { variant } => {
            let (x, n, _) = fields(&v, g).context("FM")?;
            let cross = g.fm(x, n);
            Val::T(if *variant { cross } else { g.row_sum(cross) })
        }
        Keras::Periodic {
            dim,
            sigma,
            linear,
            out,
        } => {
            let x = tensor(&v, g).context("PeriodicEmbedding")?;
            let n = g.width(x);
            // Keras' glorot_uniform of NLinear's `[1, n, dim, dim]` weights.
            let limit = (6.0 / (2 * n * dim) as f32).sqrt();
            let p = &mut *s.params;
            let c = p.add(
                &format!("{name}/coefficients"),
                n,
                dim / 2,
                Init::Normal(*sigma),
                false,
                s.rng,
            );
            let z = g.grouped_linear(x, s.params, c, None, n);
            let z = g.scale(z, 2.0 * std::f32::consts::PI, None);
            let mut emb = g.sin_cos(z, n);
            if let Some(act) = linear {
                let p = &mut *s.params;
                let w = p.add(
                    &format!("{name}/nd_linear/weights"),
                    n * dim,
                    *dim,
                    Init::Uniform(limit),
                    false,
                    s.rng,
                );
                let b = p.add(&format!("{name}/nd_linear/bias"), 1, n * dim, Init::Zeros, false, s.rng);
                emb = g.grouped_linear(emb, s.params, w, Some(b), n);
                emb = g.act(emb, *act);
            }
            numeric_out(emb, n, *dim, *out, g)
        }
        Keras::AutoDis {
            dim,
            bins,
            keep_prob,
            temperature,
            out,
        } => {
            let x = tensor(&v, g).context("AutoDisEmbedding")?;
            let n = g.width(x);
            let (k, d) = (*bins, *dim);
            // Keras' glorot_uniform of `[1, n, k]`, `[n, k, k]` and `[n, k, d]`
            // (a 3-D shape's fans are its last two sizes times the first).
            let glorot = |fan_in: usize, fan_out: usize| Init::Uniform((6.0 / (fan_in + fan_out) as f32).sqrt());
            let p = &mut *s.params;
            let proj_w = p.add(&format!("{name}/project_w"), n, k, glorot(n, k), false, s.rng);
            let proj_mat = p.add(
                &format!("{name}/project_mat"),
                n * k,
                k,
                glorot(n * k, n * k),
                false,
                s.rng,
            );
            let meta = p.add(
                &format!("{name}/meta_embedding"),
                n * k,
                d,
                glorot(n * k, n * d),
                false,
                s.rng,
            );
            let h = g.grouped_linear(x, s.params, proj_w, None, n);
            let h = g.act(h, Activation::LeakyRelu);
            let y = g.grouped_linear(h, s.params, proj_mat, None, n);
            let kept = g.scale(h, *keep_prob, None);
            let x_bar = g.add(&[y, kept]);
            let logits = g.scale(x_bar, 1.0 / temperature, None);
            let per_feature = g.unfold(logits, n);
            let w = g.softmax(per_feature);
            let x_hat = g.fold(w, n);
            let emb = g.grouped_linear(x_hat, s.params, meta, None, n);
            numeric_out(emb, n, d, *out, g)
        }
        Keras::NaryDis {
            dim,
            carries,
            multiplier,
            mean,
            replicas,
            out,
        } => {
            let x = tensor(&v, g).context("NaryDisEmbedding")?;
            let x = if *multiplier == 1.0 {
                x
            } else {
                g.scale(x, *multiplier, None)
            };
            let n = g.width(x);
            let nary = Nary::new(carries.clone(), *mean);
            // Keras' add_weight: glorot_uniform over `[rows, columns]`.
            let table = s.params.add(
                &format!("{name}/embed_table"),
                n * nary.vocab(),
                dim * replicas,
                Init::GlorotUniform,
                false,
                s.rng,
            );
            let width = carries.len() * dim;
            let embs: Vec<NodeId> = (0..*replicas)
                .map(|r| g.nary_embed(x, s.params, table, nary.clone(), (r * dim, *dim)))
                .collect();
            if let [emb] = embs[..] {
                numeric_out(emb, n, width, *out, g)
            } else {
                // Each replica's output, then (with output_tensor_list or
                // output_3d_tensor) each one's per-feature form.
                let mut items: Vec<Val> = embs.iter().map(|&e| Val::T(e)).collect();
                for &e in &embs {
                    match out {
                        NumericOut::Tensor => {}
                        NumericOut::AndStacked => items.push(Val::S { x: e, n, d: width }),
                        NumericOut::AndList => {
                            items.push(Val::L((0..n).map(|k| Val::T(g.slice(e, k * width, width))).collect()))
                        }
                    }
                }
                Val::L(items)
            }
        }
        Keras::MaskBlock(blk) => {
            let (net, mask_input) = match &v {
                Val::L(items) if items.len() >= 2 => (tensor(&items[0], g)?, tensor(&items[1], g)?),
                other => {
                    let x = tensor(other, g).context("MaskBlock")?;
                    (x, x)
                }
            };
            Val::T(mask_block(blk, net, mask_input, name, g, s)?)
        }
        Keras::Gate { weight_index } => {
            let items = field_list(&v, g).context("Gate")?;
            if items.len() < 2 || *weight_index >= items.len() {
                bail!(
                    "Gate takes a list of the weights (at {weight_index}) and the values, got {} values",
                    items.len()
                );
            }
            let weights = items[*weight_index];
            let values: Vec<NodeId> = (0..items.len())
                .filter(|i| i != weight_index)
                .map(|i| items[i])
                .collect();
            if g.width(weights) != values.len() {
                bail!(
                    "Gate's weights have {} columns for {} values",
                    g.width(weights),
                    values.len()
                );
            }
            let d = g.width(values[0]);
            if values.iter().any(|x| g.width(*x) != d) {
                bail!("Gate's values must be equally wide");
            }
            Val::T(g.weighted_sum(weights, &values))
        }
        Keras::Mmoe {
            tasks,
            experts,
            expert_mlp,
        } => {
            let (outs, gate_in) = match expert_mlp {
                Some(m) => {
                    let x = tensor(&v, g).context("MMoE")?;
                    let outs = (0..*experts)
                        .map(|i| mlp(x, m, &format!("{name}/expert_{i}"), g, s))
                        .collect::<Vec<_>>();
                    (outs, x)
                }
                None => {
                    let items = field_list(&v, g).context("MMoE without expert_mlp")?;
                    if items.len() <= *experts {
                        bail!(
                            "MMoE without expert_mlp takes its {experts} experts and then the gates' input, got {} values",
                            items.len()
                        );
                    }
                    (items[..*experts].to_vec(), items[*experts])
                }
            };
            let d = g.width(outs[0]);
            if outs.iter().any(|o| g.width(*o) != d) {
                bail!("MMoE's experts must be equally wide to be mixed");
            }
            let k = Kernel::DENSE;
            let mixtures = (0..*tasks)
                .map(|t| {
                    let z = s.layer(g, gate_in, &format!("{name}/gate_{t}"), *experts, k, Activation::Linear);
                    let gate = g.softmax(z);
                    Val::T(g.weighted_sum(gate, &outs))
                })
                .collect();
            Val::L(mixtures)
        }
        Keras::FiBiNet {
            senet: p,
            bilinear,
            mlp: m,
        } => {
            let fields = field_list(&v, g).context("FiBiNet")?;
            let mut out = vec![keras_senet(&fields, p, &format!("{name}/senet"), g, s)?];
            if let Some(b) = bilinear {
                out.push(bilinear_layer(&fields, b, &format!("{name}/bilinear"), g, s)?);
            }
            let x = g.concat(&out);
            Val::T(match m {
                Some(m) => mlp(x, m, &format!("{name}/mlp"), g, s),
                None => x,
            })
        }
        Keras::Bilinear(b) => {
            let fields = field_list(&v, g).context("BiLinear")?;
            Val::T(bilinear_layer(&fields, b, name, g, s)?)
        }
        Keras::Cin { sizes } => {
            let (x, h0, d) = fields(&v, g).context("CIN")?;
            // One row per embedding column, holding that column of every field.
            let x0 = g.transpose(x, h0);
            let x0 = g.unfold(x0, d);
            let (mut xi, mut hi) = (x0, h0);
            let mut pooled = Vec::new();
            for (i, &hk) in sizes.iter().enumerate() {
                // EasyRec's kernel `[hk, hi, h0]` as the `[hi * h0, hk]`
                // matrix of the outer products' columns; he_normal by its
                // fan in (hi * hk, Keras' for a 3-D shape), no regularizer.
                let init = Init::TruncatedNormal(truncated_std(hi * hk, h0 * hk, false));
                let p = &mut *s.params;
                let w = p.add(&format!("{name}/cin_kernel_{i}"), hi * h0, hk, init, false, s.rng);
                let b = p.add(&format!("{name}/cin_bias_{i}"), 1, hk, Init::Zeros, false, s.rng);
                let o = g.outer(xi, x0);
                xi = g.linear(o, s.params, w, Some(b), Activation::Relu);
                hi = hk;
                let maps = g.fold(xi, d);
                pooled.push(g.sum_blocks(maps, d));
            }
            Val::T(g.concat(&pooled))
        }
        Keras::DotInteraction { self_interaction } => {
            let (x, n, d) = fields(&v, g).context("DotInteraction")?;
            // TensorFlow's boolean mask reads the lower triangle row by row.
            let pairs = (0..n)
                .flat_map(|i| {
                    (0..=i)
                        .filter(move |&j| j < i || *self_interaction)
                        .map(move |j| (i, j))
                })
                .collect();
            Val::T(g.dot(&[x], d, pairs))
        }
        Keras::Cross {
            projection_dim,
            use_bias,
        } => {
            let (x0, x) = match &v {
                Val::L(items) if items.len() == 2 => (tensor(&items[0], g)?, tensor(&items[1], g)?),
                Val::T(x) => (*x, *x),
                other => bail!("Cross takes a tensor or a list of two, got {}", other.describe(g)),
            };
            let d = g.width(x);
            if g.width(x0) != d {
                bail!("Cross: x0 has width {} and x {d}", g.width(x0));
            }
            let k = Kernel {
                init: Init::TruncatedNormal(0.05),
                l2: false,
                bias: *use_bias,
            };
            let lin = Activation::Linear;
            let prod = match projection_dim {
                None => s.layer(g, x, &format!("{name}/dense"), d, k, lin),
                Some(p) => {
                    let u = Kernel { bias: false, ..k };
                    let h = s.layer(g, x, &format!("{name}/dense_u"), *p, u, lin);
                    s.layer(g, h, &format!("{name}/dense_v"), d, k, lin)
                }
            };
            let crossed = g.mul(x0, prod);
            Val::T(g.add(&[crossed, x]))
        }
        Keras::MaskNet {
            blocks,
            parallel,
            input_layer_norm,
            mlp: top,
        } => {
            let mut x = tensor(&v, g).context("MaskNet")?;
            if *input_layer_norm {
                x = s.layer_norm(g, x, &format!("{name}/input_ln"));
            }
            let mut outs = Vec::new();
            let mut net = x;
            for (i, blk) in blocks.iter().enumerate() {
                let bname = format!("{name}/block_{i}");
                if *parallel {
                    outs.push(mask_block(blk, x, x, &bname, g, s)?);
                } else {
                    net = mask_block(blk, net, x, &bname, g, s)?;
                }
            }
            let out = if *parallel { g.concat(&outs) } else { net };
            Val::T(match top {
                Some(m) => mlp(out, m, &format!("{name}/mlp"), g, s),
                None => out,
            })
        }
    })
}

/// MaskNet's mask block: `net` times a mask computed from `mask_input`,
/// then optionally a dense layer, layer norm and relu.
pub(in crate::model::builders::backbone) fn mask_block(
    blk: &MaskBlock,
    net: NodeId,
    mask_input: NodeId,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let net = if blk.input_layer_norm {
        s.layer_norm(g, net, &format!("{name}/input_ln"))
    } else {
        net
    };
    let aggregation = match blk.aggregation {
        Aggregation::Size(n) => n,
        Aggregation::Factor(f) => (g.width(mask_input) as f32 * f) as usize,
    };
    if aggregation == 0 {
        bail!("the mask block's aggregation layer has width 0");
    }
    // Keras' Dense defaults (glorot_uniform, a bias, no regularizer), and
    // EasyRec's choices per layer on top.
    let keras = Kernel::UNREGULARIZED;
    let lin = Activation::Linear;
    let mut m = mask_input;
    if let Some(p) = blk.projection_dim {
        let project = Kernel {
            l2: true,
            bias: false,
            ..keras
        };
        m = s.layer(g, m, &format!("{name}/project"), p, project, lin);
    }
    let aggregate = Kernel {
        init: Init::HeUniform,
        l2: true,
        ..keras
    };
    let aggr = s.layer(
        g,
        m,
        &format!("{name}/aggregation"),
        aggregation,
        aggregate,
        Activation::Relu,
    );
    let d = g.width(net);
    let weights = s.layer(g, aggr, &format!("{name}/weights"), d, keras, lin);
    let masked = g.mul(net, weights);
    let Some(out) = blk.output_size else {
        return Ok(masked);
    };
    let output = Kernel { bias: false, ..keras };
    let hidden = s.layer(g, masked, &format!("{name}/output"), out, output, lin);
    let ln = s.layer_norm(g, hidden, &format!("{name}/output_ln"));
    Ok(g.act(ln, Activation::Relu))
}

/// EasyRec's MLP block: per layer a dense kernel (he_uniform, in l2), batch
/// norm before or after the activation, dropout; named `name/layer_i/...`.
pub(in crate::model::builders::backbone) fn mlp(
    x: NodeId,
    m: &Mlp,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> NodeId {
    let mut x = x;
    for (i, l) in m.layers.iter().enumerate() {
        x = mlp_layer(x, l, &format!("{name}/layer_{i}"), g, s);
    }
    x
}

/// One of an MLP's layers, `lname/dense` then its batch norm `lname/bn`
/// (before or after the activation), activation and dropout.
fn mlp_layer(x: NodeId, l: &MlpLayer, lname: &str, g: &mut Graph, s: &mut Scope) -> NodeId {
    let k = Kernel {
        init: Init::HeUniform,
        l2: true,
        bias: match s.release {
            Release::Current => l.use_bias,
            Release::V071 => l.use_bias_071,
        },
    };
    let dense = format!("{lname}/dense");
    let x = if l.use_bn && !l.bn_after_activation {
        let z = s.layer(g, x, &dense, l.units, k, Activation::Linear);
        let y = s.batch_norm(g, z, &format!("{lname}/bn"), l.activation);
        if l.softmax {
            g.softmax(y)
        } else {
            y
        }
    } else {
        let z = s.layer(g, x, &dense, l.units, k, l.activation);
        let z = if l.softmax { g.softmax(z) } else { z };
        if l.use_bn {
            s.batch_norm(g, z, &format!("{lname}/bn"), Activation::Linear)
        } else {
            z
        }
    };
    g.dropout(x, l.dropout)
}

/// EasyRec's PPNet (`Keras::PpNet`) over `x` with its gate input.
pub(in crate::model::builders::backbone) fn ppnet(
    (x, gate_in): (NodeId, NodeId),
    (m, gate, eager, full_gate_input): (&Mlp, &GateNet, bool, bool),
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let gate_in = if full_gate_input {
        let cut = g.stop_gradient(x);
        g.concat(&[cut, gate_in])
    } else {
        gate_in
    };
    let mut x = x;
    if eager {
        let d = g.width(x);
        if gate.output_dim != d {
            bail!(
                "PPNet in eager mode gates its {d}-wide input first: its gate_params.output_dim is {}, not {d}",
                gate.output_dim
            );
        }
        let w = gate_net(gate_in, gate, d, &format!("{name}/gate_0"), g, s);
        x = g.mul(x, w);
    }
    let n = m.layers.len();
    for (i, l) in m.layers.iter().enumerate() {
        x = mlp_layer(x, l, &format!("{name}/layer_{i}"), g, s);
        if i + 1 < n || !eager {
            let w = gate_net(gate_in, gate, l.units, &format!("{name}/gate_{}", i + 1), g, s);
            x = g.mul(x, w);
        }
    }
    Ok(x)
}

/// PPNet's gate network (EasyRec's `GateNN`) over `x`, `units` wide:
/// `2 * sigmoid(weight(act(bn(dense(x)))))`, Keras' default layer names.
fn gate_net(x: NodeId, gate: &GateNet, units: usize, name: &str, g: &mut Graph, s: &mut Scope) -> NodeId {
    let k = Kernel {
        init: Init::HeUniform,
        l2: false,
        bias: !gate.use_bn,
    };
    let hidden = gate.hidden_dim.unwrap_or(units);
    let h = if gate.use_bn {
        let z = s.layer(g, x, &format!("{name}/dense"), hidden, k, Activation::Linear);
        s.batch_norm(g, z, &format!("{name}/batch_normalization"), gate.activation)
    } else {
        s.layer(g, x, &format!("{name}/dense"), hidden, k, gate.activation)
    };
    let h = g.dropout(h, gate.dropout);
    let w = s.layer(g, h, &format!("{name}/weight"), units, k, Activation::Sigmoid);
    g.scale(w, 2.0, None)
}

/// EasyRec's AITMTower (`Keras::Aitm`) over the current tower `items[0]`
/// and the towers it depends on.
pub(in crate::model::builders::backbone) fn aitm(
    items: &[NodeId],
    (project_dim, transfer, stop_gradient): (Option<usize>, Option<&Mlp>, bool),
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    if transfer.is_some() && items.len() > 2 {
        bail!(
            "AITMTower shares one transfer MLP among {} towers it depends on; one is supported",
            items.len() - 1
        );
    }
    let dim = project_dim.unwrap_or_else(|| g.width(items[0]));
    let mut query = None;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for (i, &t) in items.iter().enumerate() {
        let dep = if i == 0 {
            t
        } else {
            let d = if stop_gradient { g.stop_gradient(t) } else { t };
            match transfer {
                Some(m) => mlp(d, m, &format!("{name}/transfer"), g, s),
                None => d,
            }
        };
        let proj = |what: &str, g: &mut Graph, s: &mut Scope| {
            s.layer(
                g,
                dep,
                &format!("{name}/{what}_{i}"),
                dim,
                Kernel::UNREGULARIZED,
                Activation::Linear,
            )
        };
        let q = proj("query", g, s);
        query.get_or_insert(q);
        keys.push(proj("key", g, s));
        values.push(proj("value", g, s));
    }
    let q = query.expect("the current tower");
    let scores: Vec<NodeId> = keys
        .iter()
        .map(|&k| {
            let qk = g.mul(q, k);
            let dot = g.row_sum(qk);
            g.scale(dot, 1.0 / (dim as f32).sqrt(), None)
        })
        .collect();
    let scores = g.concat(&scores);
    let weights = g.softmax(scores);
    Ok(g.weighted_sum(weights, &values))
}
