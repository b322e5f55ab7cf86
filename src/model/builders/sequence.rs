//! Target attention over behaviour sequences (DIN), as EasyRec's
//! `SequenceFeatureLayer.target_attention` computes it for a feature
//! group's `sequence_features`: the keys' embeddings are tiled over the
//! history's positions, each position scored by a small network on
//! `[key, hist, key - hist, key * hist]`, the scores softmaxed over the
//! positions the row has, and the history (and its auxiliary sequences)
//! pooled with those weights. The group's features are its plain features
//! followed by each attention's output.
//!
//! Histories have a fixed number of positions (`max_seq_len`), where
//! EasyRec pads to the longest row of each batch: the masked softmax gives
//! the same result either way, but batch norms inside the scoring network
//! see the padded positions too, so their statistics differ from EasyRec's
//! unless every batch has a row of full length.

use anyhow::bail;

use crate::config::feature_plan::SeqCombiner;
use crate::config::model::{Activation, Bst, DnnSpec};
use crate::model::graph::{Graph, Kernel, Keys, NodeId, Scope};
use crate::model::layout::{CombinedSeq, GroupLayout, SeqLayout};

/// The features of group `l` from its input matrix `x`: its own features
/// (`features`: the plain parts and combined sequences, `features_width`
/// wide; none in a group of attentions alone), then the output of each
/// target attention.
pub fn group_features(
    l: &GroupLayout,
    x: NodeId,
    features: Option<NodeId>,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    if l.seq.is_empty() {
        return Ok(features.unwrap_or(x));
    }
    if l.seq.iter().any(|sl| sl.att.input_only) {
        // A backbone input layer reads the group's parts from its input.
        return Ok(x);
    }
    let mut outs: Vec<NodeId> = features.into_iter().collect();
    for sl in &l.seq {
        outs.push(match sl.att.bst {
            Some(bst) => bst_block(sl, bst, x, g, s)?,
            None => target_attention(sl, x, g, s)?,
        });
    }
    Ok(g.concat(&outs))
}

/// A sequence among the group's features pooled by its combiner
/// (EasyRec's input layer: `attention` or `text_cnn`), `[b, c.width]`.
pub fn combine(c: &CombinedSeq, l: &GroupLayout, x: NodeId, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let ((col, dim), n) = (c.positions, c.len);
    let h = g.slice(x, col, n * dim);
    let name = format!("{}/{}", l.name, c.name);
    Ok(match &c.combiner {
        SeqCombiner::Attention => {
            // tf.layers.dense(units=1, use_bias=False) with the kernel
            // regularizer, per position.
            let k = Kernel {
                bias: false,
                ..Kernel::DENSE
            };
            let rows = g.unfold(h, n);
            let z = s.layer(g, rows, &format!("{name}/attention"), 1, k, Activation::Linear);
            let scores = g.fold(z, n);
            let len = g.slice(x, c.len_col.expect("attention masks by the length"), 1);
            let w = g.masked_softmax(scores, len);
            g.attn_pool(w, h)
        }
        SeqCombiner::TextCnn {
            filter_sizes,
            num_filters,
            activation,
            ..
        } => text_cnn(
            (h, n, dim),
            (filter_sizes, num_filters, *activation),
            &format!("{name}_text_cnn"),
            g,
            s,
        ),
    })
}

/// EasyRec's text CNN over `h`, `n` positions of `dim` side by side:
/// per filter size, Keras' Conv1D (valid padding, `activation`) named
/// `<name>/conv1d[_i]`, max-pooled over time; the pooled filters side by
/// side. Conv1D is a dense layer over each window of `size` positions:
/// its kernel `[size, dim, filters]` is the `[size * dim, filters]` matrix
/// of a window's columns. No regularizer.
pub fn text_cnn(
    (h, n, dim): (NodeId, usize, usize),
    (filter_sizes, num_filters, activation): (&[usize], &[usize], Activation),
    name: &str,
    g: &mut Graph,
    s: &mut Scope,
) -> NodeId {
    let k = Kernel::UNREGULARIZED;
    let mut pooled = Vec::new();
    for (i, (&size, &filters)) in filter_sizes.iter().zip(num_filters).enumerate() {
        let steps = n + 1 - size;
        let windows: Vec<NodeId> = (0..steps).map(|t| g.slice(h, t * dim, size * dim)).collect();
        let w = g.concat(&windows);
        let rows = g.unfold(w, steps);
        let conv = if i == 0 {
            "conv1d".to_string()
        } else {
            format!("conv1d_{i}")
        };
        let y = s.layer(g, rows, &format!("{name}/{conv}"), filters, k, activation);
        let y = g.fold(y, steps);
        pooled.push(g.max_blocks(y, steps));
    }
    g.concat(&pooled)
}

fn target_attention(sl: &SeqLayout, x: NodeId, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let att = &sl.att;
    let n = sl.len;
    let keys: Vec<NodeId> = sl.keys.iter().map(|&(c, w)| g.slice(x, c, w)).collect();
    let mut key = g.concat(&keys);
    let mut hist = hist_rows(sl, x, g);
    let (dk, dh) = (g.width(key), g.width(hist));
    if dk != dh {
        if !att.allow_key_transform {
            bail!(
                "sequence group `{}`: its keys are {dk} wide and its histories {dh}; set allow_key_transform to bridge them",
                att.name
            );
        }
        if dh > dk && !att.transform_dnn {
            let pad = g.zeros(key, dh - dk);
            key = g.concat(&[key, pad]);
        } else {
            // tf.layers.dense without a regularizer.
            let k = Kernel::UNREGULARIZED;
            let lin = Activation::Linear;
            key = s.layer(
                g,
                key,
                &format!("sequence_key_transform_layer_{}", att.name),
                dh,
                k,
                lin,
            );
            hist = s.layer(
                g,
                hist,
                &format!("sequence_fea_transform_layer_{}", att.name),
                dh,
                k,
                lin,
            );
        }
    }
    let tiled = g.tile(key, n);
    let (diff, prod) = (g.sub(tiled, hist), g.mul(tiled, hist));
    let din = g.concat(&[tiled, hist, diff, prod]);
    let z = scoring_dnn(s, g, din, &att.scope, &att.dnn);
    let scores = g.fold(z, n);
    let len = g.slice(x, sl.len_col, 1);
    let w = g.masked_softmax(scores, len);
    let hist = g.fold(hist, n);
    let mut out = vec![g.attn_pool(w, hist)];
    for &(c, d) in &sl.aux {
        let aux = g.slice(x, c, n * d);
        out.push(g.attn_pool(w, aux));
    }
    if att.need_key_feature {
        out.push(key);
    }
    Ok(g.concat(&out))
}

/// The histories of `sl` in the group input `x`, each position a row of
/// its own: `[b * len, Σ dim]`, the histories side by side.
pub fn hist_rows(sl: &SeqLayout, x: NodeId, g: &mut Graph) -> NodeId {
    let n = sl.len;
    let rows: Vec<NodeId> = sl
        .hist
        .iter()
        .map(|&(c, d)| {
            let h = g.slice(x, c, n * d);
            g.unfold(h, n)
        })
        .collect();
    g.concat(&rows)
}

/// MultiTowerBST's tower, EasyRec's transformer block (`bst`): the keys
/// side by side and the histories side by side, each position one vector;
/// the history cut or zero-padded to `seq_len - 1` positions, the key after
/// them. Per head, a slice of the columns (`ceil(d / heads)` wide, the
/// last head what is left) gets its own query, key and value layers and
/// attends (unscaled) to the row's history positions and the key; the
/// heads' outputs go through `multi_head_attention`, are added to the
/// input and layer-normalised, then `feed_forward_net` with another add
/// and norm; out come all positions side by side, `[b, seq_len * d]`.
///
/// The key sits first inside the block and moves last at the end: the
/// block treats positions alike (no position embedding), so the result is
/// EasyRec's, and the history mask is then "keys below len + 1".
fn bst_block(sl: &SeqLayout, bst: Bst, x: NodeId, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let (n, m) = (sl.len, bst.seq_len - 1);
    let keys: Vec<NodeId> = sl.keys.iter().map(|&(c, w)| g.slice(x, c, w)).collect();
    let key = g.concat(&keys);
    let rows: Vec<NodeId> = sl
        .hist
        .iter()
        .map(|&(c, dim)| {
            let h = g.slice(x, c, n.min(m) * dim);
            let h = if n < m {
                let pad = g.zeros(x, (m - n) * dim);
                g.concat(&[h, pad])
            } else {
                h
            };
            g.unfold(h, m)
        })
        .collect();
    let hist = g.concat(&rows);
    let d = g.width(key);
    if g.width(hist) != d {
        bail!(
            "BST tower `{}`: its keys are {d} wide and its histories {}; EasyRec stacks them as one sequence, so they must match",
            sl.att.name,
            g.width(hist)
        );
    }
    let hist = g.fold(hist, m);
    let all = g.concat(&[key, hist]);
    let all = g.unfold(all, m + 1);
    let len = g.slice(x, sl.len_col, 1);
    let live = g.shift(len, 1.0);
    // tf.layers.dense without a regularizer, in a scope of its name.
    let k = Kernel::UNREGULARIZED;
    let lin = Activation::Linear;
    let mut dense =
        |g: &mut Graph, x: NodeId, name: &str, units: usize| s.layer(g, x, &format!("{name}/{name}_0"), units, k, lin);
    let part = d.div_ceil(bst.heads);
    let mut heads = Vec::new();
    for start in (0..d).step_by(part) {
        let w = part.min(d - start);
        let cols = g.slice(all, start, w);
        let name = format!("multi_head_{start}");
        let q = dense(g, cols, &format!("{name}_query"), w);
        let kk = dense(g, cols, &format!("{name}_key"), w);
        let v = dense(g, cols, &format!("{name}_value"), w);
        heads.push(g.attention((q, kk, v), (1, 1.0), Keys::Live(live)));
    }
    let heads = g.concat(&heads);
    let att = dense(g, heads, "multi_head_attention", d);
    let sum = g.add(&[all, att]);
    let t = s.layer_norm_named(g, sum, BST_NORMS[0], BST_LN_EPS);
    let ff = s.layer(g, t, "feed_forward_net/feed_forward_net_0", d, k, lin);
    let sum = g.add(&[t, ff]);
    let out = s.layer_norm_named(g, sum, BST_NORMS[1], BST_LN_EPS);
    let out = g.fold(out, m + 1);
    let (key_out, hist_out) = (g.slice(out, 0, d), g.slice(out, d, m * d));
    Ok(g.concat(&[hist_out, key_out]))
}

/// EasyRec's own layer normalization (`layers/layer_norm.py`), which BST uses.
const BST_LN_EPS: f32 = 1e-6;
const BST_NORMS: [(&str, &str); 2] = [
    (
        "layer_normalization/layer_norm_scale",
        "layer_normalization/layer_norm_bias",
    ),
    (
        "layer_normalization_1/layer_norm_scale",
        "layer_normalization_1/layer_norm_bias",
    ),
];

/// EasyRec's DNN with `last_layer_no_activation` and
/// `last_layer_no_batch_norm`: the last layer is a plain dense layer.
fn scoring_dnn(s: &mut Scope, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> NodeId {
    let z = s.dnn_linear_last(g, x, name, spec);
    let last = spec.hidden_units.len() - 1;
    g.dropout(z, spec.dropout.get(last).copied().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::{cpu::Cpu, Executor, Mode};
    use crate::model::graph::params::ParamStore;
    use crate::util::Rng;

    /// A group of one combined sequence of `n` positions of width `d`,
    /// with its length column after them; the output of `combine` on
    /// random rows, the rows and the parameters.
    fn run(combiner: SeqCombiner, n: usize, d: usize, lens: &[f32]) -> (Vec<f32>, Vec<f32>, ParamStore) {
        let width = n * d + 1;
        let l = GroupLayout {
            name: "g".into(),
            wide: false,
            width,
            plain_width: 0,
            parts: Vec::new(),
            listed: Vec::new(),
            seq_parts: Vec::new(),
            combined: Vec::new(),
            seq: Vec::new(),
        };
        let c = CombinedSeq {
            feature: 0,
            name: "s".into(),
            width: combiner.width(d),
            combiner,
            positions: (0, d),
            len: n,
            len_col: Some(n * d),
            out_col: 0,
        };
        let (mut params, mut buffers, mut rng) = (ParamStore::default(), ParamStore::default(), Rng::new(7));
        let mut s = Scope {
            params: &mut params,
            buffers: &mut buffers,
            rng: &mut rng,
            release: Default::default(),
        };
        let mut g = Graph::default();
        let x = g.input(0, width);
        let out = combine(&c, &l, x, &mut g, &mut s).unwrap();
        // Non-zero biases.
        for v in params.values.iter_mut() {
            *v += 0.1;
        }
        let mut r = Rng::new(3);
        let b = lens.len();
        let mut rows: Vec<f32> = (0..b * width).map(|_| r.normal() as f32).collect();
        for (k, len) in lens.iter().enumerate() {
            rows[k * width + n * d] = *len;
        }
        let inputs = [rows.clone()];
        let t = Cpu::default().forward(&g, (&params, &buffers), &inputs, b, Mode::Infer);
        (t.value(out).to_vec(), rows, params)
    }

    /// Keras' Conv1D (kernel `[size, dim, filters]`, valid padding) then
    /// global max pooling, per filter size, computed directly.
    #[test]
    fn text_cnn_is_keras_conv1d_then_global_max_pooling() {
        let (n, d) = (5, 3);
        let (sizes, counts) = (vec![2, 4], vec![3, 2]);
        let combiner = SeqCombiner::TextCnn {
            filter_sizes: sizes.clone(),
            num_filters: counts.clone(),
            pad: n,
            activation: Activation::Relu,
        };
        let (y, rows, p) = run(combiner, n, d, &[5.0, 2.0]);
        let width = n * d + 1;
        for (r, row) in rows.chunks(width).enumerate() {
            let mut want = Vec::new();
            for (i, (&k, &f)) in sizes.iter().zip(&counts).enumerate() {
                let (w, bias) = (p.slice(2 * i), p.slice(2 * i + 1));
                for o in 0..f {
                    let best = (0..=n - k)
                        .map(|t| {
                            let mut z = bias[o];
                            for j in 0..k {
                                for c in 0..d {
                                    z += row[(t + j) * d + c] * w[(j * d + c) * f + o];
                                }
                            }
                            z.max(0.0)
                        })
                        .fold(f32::MIN, f32::max);
                    want.push(best);
                }
            }
            let got = &y[r * want.len()..(r + 1) * want.len()];
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "row {r}: {got:?} vs {want:?}");
            }
        }
    }

    /// EasyRec's attention combiner: a score per position, softmaxed over
    /// the row's positions, the embeddings pooled with those weights.
    #[test]
    fn attention_combiner_pools_the_positions_a_row_has() {
        let (n, d) = (4, 2);
        let (y, rows, p) = run(SeqCombiner::Attention, n, d, &[3.0, 1.0, 0.0]);
        let w = p.slice(0);
        for (r, row) in rows.chunks(n * d + 1).enumerate() {
            let len = row[n * d] as usize;
            let scores: Vec<f32> = (0..len).map(|t| (0..d).map(|c| row[t * d + c] * w[c]).sum()).collect();
            let m = scores.iter().copied().fold(f32::MIN, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f32 = e.iter().sum();
            for c in 0..d {
                let want: f32 = (0..len).map(|t| e[t] / total * row[t * d + c]).sum();
                let got = y[r * d + c];
                assert!((got - want).abs() < 1e-5, "row {r} col {c}: {got} vs {want}");
            }
        }
    }
}
