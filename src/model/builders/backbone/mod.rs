//! RankModel's graph: EasyRec's backbone blocks evaluated in order onto the
//! model graph, then its rank head. Values flowing between blocks are 2-D
//! tensors, 3-D `[batch, n, d]` tensors (kept as `[batch, n * d]`) or Python
//! lists of them, as in EasyRec; each layer checks it gets what it takes.

pub mod keras;
mod value;

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{bail, Context};

use crate::config::model::backbone::{Backbone, Block, InputLayer, InputMode, KerasLayer, Layer, Release, Source};
use crate::config::model::Activation;
use crate::model::graph::{Graph, NodeId, Scope};
use crate::model::layout::GroupLayout;
use keras::*;
pub use keras::{senet, SeNetStyle};
use value::*;

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

/// What blocks are built over: the backbone (for its packages) and the
/// feature groups' inputs.
struct Env<'a> {
    b: &'a Backbone,
    groups: &'a [GroupLayout],
    xs: &'a [NodeId],
    /// The input-layer config a package's runs follow since a run with
    /// `reset_input` (EasyRec keeps it on the package).
    resets: RefCell<HashMap<String, InputLayer>>,
}

/// The values of blocks built so far, by name.
type Outs = HashMap<String, Val>;

/// How deep packages may run one another (the typing refuses cycles).
const MAX_PACKAGE_DEPTH: usize = 32;

/// The backbone's output: its output blocks and top MLP.
fn body(b: &Backbone, groups: &[GroupLayout], xs: &[NodeId], g: &mut Graph, s: &mut Scope) -> anyhow::Result<Val> {
    let first = (s.params.specs.len(), s.buffers.specs.len());
    let env = Env {
        b,
        groups,
        xs,
        resets: RefCell::default(),
    };
    let outs = run_blocks(&env, &b.blocks, (None, None, None), 0, g, s)?;
    let blocks_end = (s.params.specs.len(), s.buffers.specs.len());
    let mut out = output(&b.output, b.output_as_list, &outs, g).context("backbone concat_blocks")?;
    if let Some(m) = &b.top_mlp {
        // EasyRec concatenates a list before its top MLP.
        let x = match out {
            Val::L(items) => concat_list(&items, g).context("backbone top_mlp")?,
            other => other,
        };
        let x = tensor(&x, g).context("backbone top_mlp")?;
        out = Val::T(mlp(x, m, "backbone_top_mlp", g, s));
    }
    if s.release == Release::V071 {
        let end = (s.params.specs.len(), s.buffers.specs.len());
        let mut dice = 0;
        for (store, (from, to, last)) in [
            (&mut *s.params, (first.0, blocks_end.0, end.0)),
            (&mut *s.buffers, (first.1, blocks_end.1, end.1)),
        ] {
            for (i, spec) in store.specs.iter_mut().enumerate().take(last).skip(from) {
                spec.name = name_071(&spec.name, i < to, &mut dice);
            }
        }
    }
    Ok(out)
}

/// EasyRec 0.7.1's name of a backbone variable this builder named as later
/// EasyRec does (see `Release`): under `backbone/` when a block's
/// (`in_blocks`; the top MLP's are not), an MLP's `<x>/layer_<i>/dense/`
/// as `<x>/dnn_<i>/`, its batch norm `<x>/dnn_<i>/bn/`, and a Dice's alpha
/// as `alpha_<x>/dnn_<i>/act` and its statistics as the `dice`-th
/// unnamed `batch_normalization` (counted in the order made).
fn name_071(name: &str, in_blocks: bool, dice: &mut usize) -> String {
    let scope = if in_blocks { "backbone/" } else { "" };
    let layer = name.find("/layer_").and_then(|at| {
        let (x, rest) = (&name[..at], &name[at + "/layer_".len()..]);
        let (i, rest) = rest.split_once('/')?;
        i.parse::<usize>().ok().map(|i| (x, i, rest))
    });
    let Some((x, i, rest)) = layer else {
        return format!("{scope}{name}");
    };
    let unnamed_bn = |k: usize| match k {
        0 => "batch_normalization".to_string(),
        k => format!("batch_normalization_{k}"),
    };
    match rest {
        "bn/dice/alpha" | "dense/dice/alpha" => format!("{scope}alpha_{x}/dnn_{i}/act"),
        "bn/dice/moving_mean" | "dense/dice/moving_mean" => format!("{scope}{}/moving_mean", unnamed_bn(*dice)),
        "bn/dice/moving_variance" | "dense/dice/moving_variance" => {
            *dice += 1;
            format!("{scope}{}/moving_variance", unnamed_bn(*dice - 1))
        }
        _ => match rest.strip_prefix("dense/") {
            Some(var) => format!("{scope}{x}/dnn_{i}/{var}"),
            None => format!("{scope}{x}/dnn_{i}/{rest}"),
        },
    }
}

/// Builds `blocks` in order: the backbone's (`main` none) or package
/// `package`'s, `main` then being the backbone's values and `input` the
/// package's.
fn run_blocks(
    env: &Env,
    blocks: &[Block],
    (main, input, package): (Option<&Outs>, Option<&Val>, Option<&str>),
    depth: usize,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Outs> {
    let mut outs = Outs::new();
    for blk in blocks {
        let reset = package.and_then(|p| env.resets.borrow().get(p).copied());
        let v = block(env, blk, (&outs, main, input), (depth, reset), g, s)
            .with_context(|| format!("backbone block `{}`", blk.name))?;
        outs.insert(blk.name.clone(), v);
    }
    Ok(outs)
}

/// The output blocks' values: a list, or merged as one.
fn output(names: &[String], as_list: bool, outs: &Outs, g: &mut Graph) -> anyhow::Result<Val> {
    let picked: Vec<Val> = names.iter().map(|o| outs[o.as_str()].clone()).collect();
    Ok(if as_list {
        match picked.as_slice() {
            [one] => one.clone(),
            _ => Val::L(picked),
        }
    } else {
        merge(picked, -1, g)?
    })
}

/// The value an input reads: a block's, the backbone's from a package, the
/// package's input, or a package run on its `package_input` (a block
/// beside the reader, else a package run on nothing) as EasyRec's
/// `Package.block_input` does.
fn source(
    env: &Env,
    src: &Source,
    (outs, main, input): (&Outs, Option<&Outs>, Option<&Val>),
    depth: usize,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    match src {
        Source::Block(name) => Ok(outs[name.as_str()].clone()),
        Source::Outer(name) => main
            .and_then(|m| m.get(name))
            .cloned()
            .with_context(|| format!("backbone block `{name}` has not run")),
        Source::PackageInput => input
            .cloned()
            .context("use_package_input in a package run without a package_input"),
        Source::Package { name, input: on, reset } => {
            if let Some(r) = reset {
                env.resets.borrow_mut().insert(name.clone(), *r);
            }
            let backbone = main.unwrap_or(outs);
            let arg = match on {
                None => None,
                Some(x) => Some(match outs.get(x) {
                    Some(v) => v.clone(),
                    None => package(env, x, (backbone, None), depth, g, s)?,
                }),
            };
            package(env, name, (backbone, arg.as_ref()), depth, g, s)
        }
        Source::Group(_) => unreachable!("group inputs resolve to input-layer blocks"),
    }
}

/// One run of package `name` on `input`: its blocks built again, their
/// variables those of its first run (the stores reuse names meanwhile).
fn package(
    env: &Env,
    name: &str,
    (main, input): (&Outs, Option<&Val>),
    depth: usize,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    if depth >= MAX_PACKAGE_DEPTH {
        bail!("packages run one another more than {MAX_PACKAGE_DEPTH} deep");
    }
    let p = env
        .b
        .packages
        .iter()
        .find(|p| p.name == name)
        .with_context(|| format!("no package `{name}`"))?;
    let reuse = (s.params.reuse, s.buffers.reuse);
    let before = (s.params.specs.len(), s.buffers.specs.len());
    (s.params.reuse, s.buffers.reuse) = (true, true);
    let outs = run_blocks(env, &p.blocks, (Some(main), input, Some(name)), depth + 1, g, s);
    (s.params.reuse, s.buffers.reuse) = reuse;
    let outs = outs.with_context(|| format!("package `{name}`"))?;
    let again = s
        .params
        .reused_with_new_shape(before.0)
        .or_else(|| s.buffers.reused_with_new_shape(before.1));
    if let Some(v) = again {
        bail!(
            "package `{name}` runs on an input of another shape than before: its variable `{}` would be {}x{} here",
            v.name,
            v.rows,
            v.cols
        );
    }
    output(&p.output, p.output_as_list, &outs, g).with_context(|| format!("package `{name}`'s output"))
}

/// Builds block `blk`; its input layer follows `reset` when given (its
/// package's `reset_input`).
fn block(
    env: &Env,
    blk: &Block,
    at: (&Outs, Option<&Outs>, Option<&Val>),
    (depth, reset): (usize, Option<InputLayer>),
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    if let Some(il) = blk.input_layer() {
        let il = reset.unwrap_or(il);
        let Source::Group(name) = &blk.inputs[0].source else {
            unreachable!("typed as a group input")
        };
        let gi = env
            .groups
            .iter()
            .position(|l| &l.name == name)
            .with_context(|| format!("no feature group `{name}`"))?;
        return input_layer(&env.groups[gi], env.xs[gi], il, &blk.name, g, s);
    }
    let mut inputs = Vec::new();
    for inp in &blk.inputs {
        let name = match &inp.source {
            Source::Block(n) | Source::Outer(n) | Source::Package { name: n, .. } => n.as_str(),
            Source::PackageInput => "package_input",
            Source::Group(_) => unreachable!("group inputs resolve to input-layer blocks"),
        };
        let mut v = source(env, &inp.source, at, depth, g, s)?;
        if inp.ignore {
            continue;
        }
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
            Layer::Keras(k) => keras_layer(k, v, &name, g, s)?,
            Layer::Lambda(e) => apply(*e, v, g).context("lambda")?,
            Layer::Recurrent { steps, fixed, layer } => recurrent(*steps, *fixed, layer, v, &name, g, s)?,
            Layer::Repeat { n, concat, layer } => {
                let mut outs = (0..*n)
                    .map(|i| keras_layer(layer, v.clone(), &format!("{name}_{i}"), g, s))
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
    // `dropout_rate`: each listed feature apart, and the tensor.
    let list = |g: &mut Graph| -> Vec<NodeId> {
        l.feature_columns()
            .into_iter()
            .map(|(col, width)| {
                let f = g.slice(listed, col, width);
                g.dropout(f, il.dropout)
            })
            .collect()
    };
    let x = match mode {
        InputMode::Tensor | InputMode::TensorAndList => g.dropout(x, il.dropout),
        _ => x,
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

/// Types a block's Keras layer (`keras::parse`, refusing what is not
/// honoured under its config path) and builds it on `v`.
fn keras_layer(k: &KerasLayer, v: Val, name: &str, g: &mut Graph, s: &mut Scope) -> anyhow::Result<Val> {
    let typed = keras::parse(&k.proto, &k.path)?;
    keras(&typed, v, name, g, s)
}

/// EasyRec's `recurrent` layer: the layer `steps` times on its own output;
/// with `fixed`, over a list whose element `fixed` stays and is dropped at
/// the end.
fn recurrent(
    steps: usize,
    fixed: Option<usize>,
    layer: &KerasLayer,
    v: Val,
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Val> {
    let Some(f) = fixed else {
        let mut out = v;
        for i in 0..steps {
            out = keras_layer(layer, out, &format!("{name}_{i}"), g, s)?;
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
        let out = keras_layer(layer, Val::L(items.clone()), &format!("{name}_{i}"), g, s)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::{cpu::Cpu, Executor, Mode};
    use crate::model::graph::params::ParamStore;
    use crate::model::graph::LN_EPS;
    use crate::util::Rng;

    #[test]
    fn easyrec_071_names_of_a_backbones_variables() {
        let mut dice = 0;
        let mut n = |name: &str, in_blocks: bool| name_071(name, in_blocks, &mut dice);
        assert_eq!(
            n("user_mlp/layer_0/dense/kernel", true),
            "backbone/user_mlp/dnn_0/kernel"
        );
        assert_eq!(n("user_mlp/layer_1/dense/bias", true), "backbone/user_mlp/dnn_1/bias");
        assert_eq!(n("user_mlp/layer_1/bn/gamma", true), "backbone/user_mlp/dnn_1/bn/gamma");
        assert_eq!(
            n("backbone_top_mlp/layer_0/bn/moving_mean", false),
            "backbone_top_mlp/dnn_0/bn/moving_mean"
        );
        assert_eq!(
            n("din/din_attention/layer_1/bn/dice/alpha", true),
            "backbone/alpha_din/din_attention/dnn_1/act"
        );
        // Each Dice's statistics: the next unnamed batch normalization.
        for k in ["batch_normalization", "batch_normalization_1"] {
            assert_eq!(
                n("din/din_attention/layer_0/bn/dice/moving_mean", true),
                format!("backbone/{k}/moving_mean")
            );
            assert_eq!(
                n("din/din_attention/layer_0/bn/dice/moving_variance", true),
                format!("backbone/{k}/moving_variance")
            );
        }
        assert_eq!(n("fibinet/senet/W1/kernel", true), "backbone/fibinet/senet/W1/kernel");
        assert_eq!(n("x/layer_a/dense/kernel", true), "backbone/x/layer_a/dense/kernel");
    }

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
            release: Default::default(),
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
        let tape = Cpu::default().forward(&g, (&params, &buffers), &xs, b, Mode::Infer);
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
