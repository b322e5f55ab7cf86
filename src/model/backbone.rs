//! RankModel's graph: EasyRec's backbone blocks evaluated in order onto the
//! model graph, then its rank head. Values flowing between blocks are 2-D
//! tensors, 3-D `[batch, n, d]` tensors (kept as `[batch, n * d]`) or Python
//! lists of them, as in EasyRec; each layer checks it gets what it takes.

use std::collections::HashMap;

use anyhow::{bail, Context};

use super::graph::{Graph, Kernel, Keys, NodeId, Scope};
use super::params::Init;
use super::GroupLayout;
use crate::config::backbone::{
    Aggregation, Backbone, Bilinear, BilinearKind, Block, BstLayer, Expr, InputLayer, InputMode, Keras, Layer,
    MaskBlock, Mlp, NumericOut, SeNetParams, Source,
};
use crate::config::model_plan::Activation;

/// A value between blocks.
#[derive(Debug, Clone)]
enum Val {
    /// `[batch, width]`.
    T(NodeId),
    /// `[batch, n, d]`, stored row-major as `[batch, n * d]`.
    S { x: NodeId, n: usize, d: usize },
    /// A Python list (or tuple) of values.
    L(Vec<Val>),
}

impl Val {
    fn describe(&self, g: &Graph) -> String {
        match self {
            Val::T(x) => format!("a [batch, {}] tensor", g.width(*x)),
            Val::S { n, d, .. } => format!("a [batch, {n}, {d}] tensor"),
            Val::L(v) => format!("a list of {}", v.len()),
        }
    }
}

/// RankModel's graph over the group inputs `xs`: the backbone, then an
/// `output` layer of `classes` logits unless the backbone ends in as many
/// columns.
pub fn rank(
    b: &Backbone,
    groups: &[GroupLayout],
    xs: &[NodeId],
    classes: usize,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let out = body(b, groups, xs, g, s)?;
    let x = tensor(&out, g).context("RankModel's output")?;
    Ok(if g.width(x) == classes {
        x
    } else {
        s.unregularized_output(g, x, "output", classes)
    })
}

/// MultiTaskModel's task inputs: one backbone output per task tower when
/// the backbone ends in a list (MMoE's), else its one output for each.
pub fn task_inputs(
    b: &Backbone,
    groups: &[GroupLayout],
    xs: &[NodeId],
    tasks: usize,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Vec<NodeId>> {
    match body(b, groups, xs, g, s)? {
        Val::L(items) => {
            if items.len() != tasks {
                bail!(
                    "the backbone outputs {} values for {tasks} task towers: they must be equal",
                    items.len()
                );
            }
            items
                .iter()
                .map(|v| tensor(v, g).context("a task tower's input"))
                .collect()
        }
        one => Ok(vec![tensor(&one, g).context("the task towers' input")?; tasks]),
    }
}

/// The Keras SENet layer (FiBiNet++'s) over `fields`.
fn keras_senet(fields: &[NodeId], p: &SeNetParams, name: &str, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let style = SeNetStyle::Keras {
        skip: p.skip,
        layer_norm: p.layer_norm,
    };
    senet(fields, name, (p.reduction_ratio, p.groups), style, g, s)
}

/// The field embeddings of a list input.
fn field_list(v: &Val, g: &mut Graph) -> anyhow::Result<Vec<NodeId>> {
    let Val::L(items) = v else {
        bail!("takes a list of field embeddings, got {}", v.describe(g));
    };
    items.iter().map(|x| tensor(x, g)).collect()
}

/// EasyRec's BiLinear over `fields` (`Keras::Bilinear`): Keras' Dense
/// layers (glorot uniform, bias, no regularizer) named `all`, `each_i` or
/// `interaction_i_j`, and `output`.
fn bilinear_layer(fields: &[NodeId], b: &Bilinear, name: &str, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
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
fn numeric_out(emb: NodeId, n: usize, dim: usize, out: NumericOut, g: &mut Graph) -> Val {
    match out {
        NumericOut::Tensor => Val::T(emb),
        NumericOut::AndStacked => Val::L(vec![Val::T(emb), Val::S { x: emb, n, d: dim }]),
        NumericOut::AndList => {
            let list = (0..n).map(|k| Val::T(g.slice(emb, k * dim, dim))).collect();
            Val::L(vec![Val::T(emb), Val::L(list)])
        }
    }
}

/// MatchModel's user and item towers: outputs `user` and `item` of the
/// backbone's output list.
pub fn towers(
    b: &Backbone,
    groups: &[GroupLayout],
    xs: &[NodeId],
    (user, item): (usize, usize),
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<(NodeId, NodeId)> {
    let Val::L(items) = body(b, groups, xs, g, s)? else {
        bail!("MatchModel's backbone must output a list holding the user and the item tower");
    };
    let tower = |i: usize, what: &str, g: &mut Graph| -> anyhow::Result<NodeId> {
        let v = items.get(i).with_context(|| {
            format!(
                "{what}_tower_idx_in_output {i} is past the backbone's {} outputs",
                items.len()
            )
        })?;
        tensor(v, g).with_context(|| format!("the {what} tower"))
    };
    let (u, v) = (tower(user, "user", g)?, tower(item, "item", g)?);
    if g.width(u) != g.width(v) {
        bail!(
            "the user tower is {} wide and the item tower {}: they must match to be compared",
            g.width(u),
            g.width(v)
        );
    }
    Ok((u, v))
}

/// The backbone's output: its output blocks and top MLP.
fn body(b: &Backbone, groups: &[GroupLayout], xs: &[NodeId], g: &mut Graph, s: &mut Scope) -> anyhow::Result<Val> {
    let mut outs: HashMap<&str, Val> = HashMap::new();
    for blk in &b.blocks {
        let v = block(blk, &outs, groups, xs, g, s).with_context(|| format!("backbone block `{}`", blk.name))?;
        outs.insert(blk.name.as_str(), v);
    }
    let picked: Vec<Val> = b.output.iter().map(|o| outs[o.as_str()].clone()).collect();
    let mut out = if b.output_as_list {
        match picked.as_slice() {
            [one] => one.clone(),
            _ => Val::L(picked),
        }
    } else {
        merge(picked, -1, g).context("backbone concat_blocks")?
    };
    if let Some(m) = &b.top_mlp {
        // EasyRec concatenates a list before its top MLP.
        let x = match out {
            Val::L(items) => concat_list(&items, g).context("backbone top_mlp")?,
            other => other,
        };
        let x = tensor(&x, g).context("backbone top_mlp")?;
        out = Val::T(mlp(x, m, "backbone_top_mlp", g, s));
    }
    Ok(out)
}

fn block(
    blk: &Block,
    outs: &HashMap<&str, Val>,
    groups: &[GroupLayout],
    xs: &[NodeId],
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    if let Some(il) = blk.input_layer() {
        let Source::Group(name) = &blk.inputs[0].source else {
            unreachable!("typed as a group input")
        };
        let gi = groups
            .iter()
            .position(|l| &l.name == name)
            .with_context(|| format!("no feature group `{name}`"))?;
        return input_layer(&groups[gi], xs[gi], il, &blk.name, g, s);
    }
    let mut inputs = Vec::new();
    for inp in &blk.inputs {
        let Source::Block(name) = &inp.source else {
            unreachable!("group inputs resolve to input-layer blocks")
        };
        let mut v = outs[name.as_str()].clone();
        if let Some(e) = inp.slice {
            v = apply(e, v, g).with_context(|| format!("input_slice of `{name}`"))?;
        }
        if let Some(e) = inp.input_fn {
            v = apply(e, v, g).with_context(|| format!("input_fn of `{name}`"))?;
        }
        inputs.push(v);
    }
    let mut v = if blk.into_list {
        Val::L(inputs)
    } else {
        merge(inputs, blk.concat_axis, g)?
    };
    if let Some(e) = blk.extra_input_fn {
        v = apply(e, v, g).context("extra_input_fn")?;
    }
    let one = blk.layers.len() == 1;
    for (i, l) in blk.layers.iter().enumerate() {
        // EasyRec names a block's single layer after the block, sequential
        // layers `<block>_l<i>`.
        let name = if one {
            blk.name.clone()
        } else {
            format!("{}_l{i}", blk.name)
        };
        v = match l {
            Layer::Input(_) => bail!("an input layer must be the block's only layer"),
            Layer::Keras(k) => keras(k, v, &name, g, s)?,
            Layer::Lambda(e) => apply(*e, v, g).context("lambda")?,
            Layer::Recurrent { steps, fixed, layer } => recurrent(*steps, *fixed, layer, v, &name, g, s)?,
            Layer::Repeat { n, concat, layer } => {
                let mut outs = (0..*n)
                    .map(|i| keras(layer, v.clone(), &format!("{name}_{i}"), g, s))
                    .collect::<anyhow::Result<Vec<Val>>>()?;
                if outs.len() == 1 {
                    outs.pop().expect("one output")
                } else if *concat {
                    let xs = outs.iter().map(|o| tensor(o, g)).collect::<anyhow::Result<Vec<_>>>()?;
                    Val::T(g.concat(&xs))
                } else {
                    Val::L(outs)
                }
            }
        };
    }
    Ok(v)
}

/// EasyRec's input layer over a group. With `do_batch_norm` the tensor
/// goes through one batch norm and the list's features through their own
/// (column-wise, so one batch norm over all of them is the same).
fn input_layer(
    l: &GroupLayout,
    x: NodeId,
    il: InputLayer,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    let mode = il.mode;
    // A group whose sequences stay unpooled hands its blocks its whole
    // input matrix, which only that input layer reads.
    if mode != InputMode::SeqAndNormal && l.seq.iter().any(|sl| sl.att.input_only) {
        bail!(
            "group `{}` is read with output_seq_and_normal_feature elsewhere, so its sequences are unpooled; \
             read it that way here too",
            l.name
        );
    }
    let norm = |g: &mut Graph, s: &mut Scope, what: &str| {
        if il.batch_norm {
            s.batch_norm(g, x, &format!("{name}/{what}"), Activation::Linear)
        } else {
            x
        }
    };
    let listed = match mode {
        InputMode::Tensor => x,
        _ => norm(g, s, "feature_batch_normalization"),
    };
    let x = match mode {
        InputMode::Tensor | InputMode::TensorAndList => norm(g, s, "batch_normalization"),
        _ => x,
    };
    let list = |g: &mut Graph| -> Vec<NodeId> {
        l.feature_columns()
            .into_iter()
            .map(|(col, width)| g.slice(listed, col, width))
            .collect()
    };
    Ok(match mode {
        InputMode::SeqAndNormal => seq_input(l, x, g)?,
        InputMode::Tensor => Val::T(x),
        InputMode::FeatureList => Val::L(list(g).into_iter().map(Val::T).collect()),
        InputMode::TensorAndList => Val::L(vec![Val::T(x), Val::L(list(g).into_iter().map(Val::T).collect())]),
        InputMode::Stacked => {
            let items: Vec<Val> = list(g).into_iter().map(Val::T).collect();
            stacked(stack(&items, g).with_context(|| format!("only_output_3d_tensor of group `{}`", l.name))?)
        }
    })
}

/// `output_seq_and_normal_feature` over group `l`'s input matrix `x`:
/// `(sequences, length, targets)`, the sequences side by side per position
/// `[batch, len, Σ dim]`, the first one's length, the group's other
/// features concatenated (without any: the pair alone).
fn seq_input(l: &GroupLayout, x: NodeId, g: &mut Graph) -> anyhow::Result<Val> {
    let Some(sl) = l.seq.iter().find(|sl| sl.att.input_only) else {
        bail!("group `{}` has no unpooled sequences", l.name);
    };
    let n = sl.len;
    let rows = super::sequence::hist_rows(sl, x, g);
    let d = g.width(rows);
    let seq = Val::S {
        x: g.fold(rows, n),
        n,
        d,
    };
    let len = Val::T(g.slice(x, sl.len_col, 1));
    let mut out = vec![seq, len];
    if l.plain_width > 0 {
        out.push(Val::T(g.slice(x, 0, l.plain_width)));
    }
    Ok(Val::L(out))
}

/// What a sequence layer reads from an `output_seq_and_normal_feature`
/// input layer.
struct SeqIn {
    /// `[batch, n * d]`, positions side by side.
    x: NodeId,
    n: usize,
    d: usize,
    len: NodeId,
    /// The group's other features, when it has any.
    target: Option<NodeId>,
}

/// The `(sequence, length, targets)` a sequence layer reads: its sequence
/// cut or zero-padded to `pad` positions when given (the length as it is:
/// only the text CNN pads, and it reads no length).
fn seq_of(v: &Val, pad: Option<usize>, g: &mut Graph) -> anyhow::Result<SeqIn> {
    let Val::L(items) = v else {
        bail!(
            "takes (sequence, length, ...) from an output_seq_and_normal_feature input layer, got {}",
            v.describe(g)
        );
    };
    let (Some(Val::S { x, n, d }), Some(Val::T(len))) = (items.first(), items.get(1)) else {
        bail!("takes (sequence, length, ...) from an output_seq_and_normal_feature input layer");
    };
    let target = match items.get(2) {
        Some(Val::T(t)) => Some(*t),
        _ => None,
    };
    let (mut x, mut n, d, len) = (*x, *n, *d, *len);
    if let Some(p) = pad {
        if p < n {
            x = g.slice(x, 0, p * d);
        } else if p > n {
            let zeros = g.zeros(x, (p - n) * d);
            x = g.concat(&[x, zeros]);
        }
        n = p;
    }
    Ok(SeqIn { x, n, d, len, target })
}

/// EasyRec's BST Keras layer (`Keras::Bst`) over `(seq, len, target)`.
fn bst(v: &Val, b: &BstLayer, name: &str, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let SeqIn { x, n, d, len, target } = seq_of(v, Some(b.max_position), g).context("BST")?;
    let Some(target) = target else {
        bail!("BST: the target sits at the head, and the input layer's group has no target features besides its sequences");
    };
    if g.width(target) != d {
        bail!(
            "BST: the sequence is {d} wide and the target features {}; EasyRec needs them equal",
            g.width(target)
        );
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
    let target = project(g, target, "target_project");
    let all = g.concat(&[target, seq]);
    let m = n + 1;
    let post = (spec.init_range, spec.hidden_dropout);
    let rows = super::transformer::embedding_postprocessor(g, s, (all, m), (name, name), post);
    // The target and the row's first `len` positions.
    let live = g.shift(len, 1.0);
    let out = super::transformer::encoder(g, s, rows, Keys::Live(live), spec, &format!("{name}/transformer"));
    let out = g.fold(out, m);
    Ok(if b.all_tokens {
        out
    } else {
        g.slice(out, 0, spec.hidden)
    })
}

/// EasyRec's `merge_inputs`: one input as it is, lists joined into one list,
/// tensors concatenated.
fn merge(inputs: Vec<Val>, axis: i32, g: &mut Graph) -> anyhow::Result<Val> {
    if inputs.len() == 1 {
        return Ok(inputs.into_iter().next().expect("one input"));
    }
    if inputs.is_empty() {
        bail!("no inputs to merge");
    }
    if inputs.iter().any(|v| matches!(v, Val::L(_))) {
        let mut all = Vec::new();
        for v in inputs {
            match v {
                Val::L(items) => all.extend(items),
                other => all.push(other),
            }
        }
        return Ok(Val::L(all));
    }
    match axis {
        -1 => concat_list(&inputs, g),
        1 => {
            // Fields of 3-D tensors side by side, each of one dimension.
            let parts: Option<Vec<(NodeId, usize, usize)>> = inputs
                .iter()
                .map(|v| match v {
                    Val::S { x, n, d } => Some((*x, *n, *d)),
                    _ => None,
                })
                .collect();
            let Some(parts) = parts else {
                bail!("input_concat_axis 1 over these inputs is not supported");
            };
            let d = parts[0].2;
            if let Some((_, n, dk)) = parts.iter().find(|p| p.2 != d) {
                bail!("cannot concatenate a [batch, {n}, {dk}] tensor on axis 1 with dimension {d}");
            }
            let nodes: Vec<NodeId> = parts.iter().map(|p| p.0).collect();
            Ok(Val::S {
                x: g.concat(&nodes),
                n: parts.iter().map(|p| p.1).sum(),
                d,
            })
        }
        other => bail!("input_concat_axis {other} over these inputs is not supported"),
    }
}

/// Concatenation on the last axis of 2-D tensors.
fn concat_list(items: &[Val], g: &mut Graph) -> anyhow::Result<Val> {
    let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Val::T(g.concat(&nodes)))
}

/// A 2-D tensor, or what a layer taking one got instead.
fn tensor(v: &Val, g: &Graph) -> anyhow::Result<NodeId> {
    match v {
        Val::T(x) => Ok(*x),
        other => bail!("takes a 2-D tensor, got {}", other.describe(g)),
    }
}

/// `tf.stack(list, axis=1)` of equally wide 2-D tensors, as `(node, n, d)`.
fn stack(items: &[Val], g: &mut Graph) -> anyhow::Result<(NodeId, usize, usize)> {
    let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
    let Some(&first) = nodes.first() else {
        bail!("nothing to stack");
    };
    let d = g.width(first);
    if let Some(x) = nodes.iter().find(|x| g.width(**x) != d) {
        bail!(
            "cannot stack tensors of widths {d} and {}: every embedding_dim must be equal",
            g.width(*x)
        );
    }
    Ok((g.concat(&nodes), nodes.len(), d))
}

/// The stacked value of `stack`'s output.
fn stacked((x, n, d): (NodeId, usize, usize)) -> Val {
    Val::S { x, n, d }
}

/// A 3-D value as `(node, n, d)`: stacked, or a list stacked.
fn fields(v: &Val, g: &mut Graph) -> anyhow::Result<(NodeId, usize, usize)> {
    match v {
        Val::S { x, n, d } => Ok((*x, *n, *d)),
        Val::L(items) => stack(items, g),
        other => bail!("takes a list of 2-D tensors or a 3-D tensor, got {}", other.describe(g)),
    }
}

/// Keras' truncated-normal variance scaling: the standard deviation of
/// `he_normal` (`fan_avg: false`) or `glorot_normal` (`fan_avg: true`).
fn truncated_std(fan_in: usize, fan_out: usize, fan_avg: bool) -> f32 {
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

fn apply(e: Expr, v: Val, g: &mut Graph) -> anyhow::Result<Val> {
    Ok(match (e, v) {
        (Expr::Index(i), Val::L(items)) => {
            let n = items.len();
            items
                .into_iter()
                .nth(i)
                .with_context(|| format!("index {i} of a list of {n}"))?
        }
        (Expr::Repeat(n), v) => Val::L(vec![v; n]),
        (Expr::AddN, Val::L(items)) => {
            let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
            let w = g.width(nodes[0]);
            if nodes.iter().any(|x| g.width(*x) != w) {
                bail!("tf.add_n of tensors of unequal widths");
            }
            Val::T(g.add(&nodes))
        }
        (Expr::ReduceSum, Val::T(x)) => Val::T(g.row_sum(x)),
        (Expr::ReduceSum, Val::S { x, n, d }) => Val::S {
            x: g.sum_blocks(x, n),
            n: 1,
            d,
        },
        (Expr::Concat, Val::L(items)) => concat_list(&items, g)?,
        (Expr::Stack, Val::L(items)) => stacked(stack(&items, g)?),
        (Expr::Unstack { n, d }, Val::T(x)) => {
            if g.width(x) != n * d {
                bail!("cannot reshape [batch, {}] to [-1, {n}, {d}]", g.width(x));
            }
            Val::L((0..n).map(|i| Val::T(g.slice(x, i * d, d))).collect())
        }
        (e, v) => bail!("{e:?} cannot take {}", v.describe(g)),
    })
}

fn keras(k: &Keras, v: Val, name: &str, g: &mut Graph, s: &mut Scope) -> anyhow::Result<Val> {
    Ok(match k {
        Keras::Mlp(m) => {
            let x = tensor(&v, g).context("MLP")?;
            Val::T(mlp(x, m, name, g, s))
        }
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
        Keras::TextCnn {
            filter_sizes,
            num_filters,
            pad,
            activation,
            mlp: top,
        } => {
            let SeqIn { x, n, d, .. } = seq_of(&v, Some(*pad), g).context("TextCNN")?;
            let net = super::sequence::text_cnn((x, n, d), (filter_sizes, num_filters, *activation), name, g, s);
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
fn mask_block(
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

/// EasyRec's `recurrent` layer: the layer `steps` times on its own output;
/// with `fixed`, over a list whose element `fixed` stays and is dropped at
/// the end.
fn recurrent(
    steps: usize,
    fixed: Option<usize>,
    layer: &Keras,
    v: Val,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    let Some(f) = fixed else {
        let mut out = v;
        for i in 0..steps {
            out = keras(layer, out, &format!("{name}_{i}"), g, s)?;
        }
        return Ok(out);
    };
    let Val::L(mut items) = v else {
        bail!("recurrent with fixed_input_index takes a list, got {}", v.describe(g));
    };
    if f >= items.len() {
        bail!("fixed_input_index {f} of a list of {}", items.len());
    }
    for i in 0..steps {
        let out = keras(layer, Val::L(items.clone()), &format!("{name}_{i}"), g, s)?;
        let mut outs = match out {
            Val::L(o) => o.into_iter(),
            one => vec![one; items.len() - 1].into_iter(),
        };
        for (idx, item) in items.iter_mut().enumerate() {
            if idx != f {
                *item = outs.next().context("recurrent layer returned too few outputs")?;
            }
        }
    }
    items.remove(f);
    Ok(if items.len() == 1 {
        items.pop().expect("one item")
    } else {
        Val::L(items)
    })
}

/// EasyRec's MLP block: per layer a dense kernel (he_uniform, in l2), batch
/// norm before or after the activation, dropout; named `name/layer_i/...`.
fn mlp(x: NodeId, m: &Mlp, name: &str, g: &mut Graph, s: &mut Scope) -> NodeId {
    let mut x = x;
    for (i, l) in m.layers.iter().enumerate() {
        let lname = format!("{name}/layer_{i}");
        let k = Kernel {
            init: Init::HeUniform,
            l2: true,
            bias: l.use_bias,
        };
        let dense = format!("{lname}/dense");
        x = if l.use_bn && !l.bn_after_activation {
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
        x = g.dropout(x, l.dropout);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::{Mode, Tape};
    use crate::model::graph::LN_EPS;
    use crate::model::params::ParamStore;
    use crate::util::Rng;

    /// SENet against a direct computation: squeeze each field's groups to
    /// their max and mean (field by field, max before mean), W1 with relu,
    /// W2, reweight, skip, layer norm.
    #[test]
    fn senet_squeezes_excites_and_reweights_as_fibinet_plus_plus() {
        let (b, widths, groups) = (3, [4usize, 6], 2);
        let (mut params, mut buffers, mut rng) = (ParamStore::default(), ParamStore::default(), Rng::new(4));
        let mut s = Scope {
            params: &mut params,
            buffers: &mut buffers,
            rng: &mut rng,
        };
        let mut g = Graph::default();
        let inputs: Vec<NodeId> = widths.iter().enumerate().map(|(i, w)| g.input(i, *w)).collect();
        let style = SeNetStyle::Keras {
            skip: true,
            layer_norm: true,
        };
        let out = senet(&inputs, "se", (2, groups), style, &mut g, &mut s).unwrap();
        for x in params.values.iter_mut() {
            *x += 0.05; // non-zero biases and layer-norm offsets
        }
        let mut r = Rng::new(8);
        let xs: Vec<Vec<f32>> = widths
            .iter()
            .map(|w| (0..b * w).map(|_| r.normal() as f32).collect())
            .collect();
        let tape = Tape::forward(&g, (&params, &buffers), &xs, b, Mode::Infer);
        let got = tape.value(out);
        let p = |name: &str| {
            let s = params.specs.iter().find(|s| s.name == name).unwrap();
            (params.values[s.range()].to_vec(), s.cols)
        };
        let ((w1, n1), (b1, _)) = (p("se/W1/kernel"), p("se/W1/bias"));
        let ((w2, n2), (b2, _)) = (p("se/W2/kernel"), p("se/W2/bias"));
        let ((gamma, _), (beta, _)) = (p("se/output_ln/gamma"), p("se/output_ln/beta"));
        assert_eq!(
            (n1, n2),
            (4, 10),
            "max(1, 2 fields * 2 groups * 2 / 2) units, then one per value"
        );
        for row in 0..b {
            let fields: Vec<&[f32]> = widths
                .iter()
                .zip(&xs)
                .map(|(w, x)| &x[row * w..(row + 1) * w])
                .collect();
            let mut z = Vec::new();
            for f in &fields {
                let per = f.len() / groups;
                let chunks: Vec<&[f32]> = f.chunks(per).collect();
                z.extend(chunks.iter().map(|c| c.iter().copied().fold(f32::MIN, f32::max)));
                z.extend(chunks.iter().map(|c| c.iter().sum::<f32>() / per as f32));
            }
            let dense = |x: &[f32], w: &[f32], bias: &[f32], n: usize| -> Vec<f32> {
                (0..n)
                    .map(|j| bias[j] + x.iter().enumerate().map(|(i, v)| v * w[i * n + j]).sum::<f32>())
                    .collect()
            };
            let a1: Vec<f32> = dense(&z, &w1, &b1, n1).into_iter().map(|v| v.max(0.0)).collect();
            let weights = dense(&a1, &w2, &b2, n2);
            let emb: Vec<f32> = fields.concat();
            let y: Vec<f32> = emb.iter().zip(&weights).map(|(e, w)| e * w + e).collect();
            let mean = y.iter().sum::<f32>() / y.len() as f32;
            let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / y.len() as f32;
            for (j, v) in y.iter().enumerate() {
                let want = (v - mean) / (var + LN_EPS).sqrt() * gamma[j] + beta[j];
                let have = got[row * n2 + j];
                assert!((have - want).abs() < 1e-4, "row {row} value {j}: {have} vs {want}");
            }
        }
    }
}
