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

use super::graph::{Graph, Kernel, NodeId, Scope};
use super::{GroupLayout, SeqLayout};
use crate::config::model_plan::{Activation, DnnSpec};

/// The features of group `l` from its input matrix `x`: its plain columns
/// (`plain`, what the model makes of `x`'s first `plain_width` columns),
/// then the output of each target attention.
pub fn group_features(
    l: &GroupLayout,
    x: NodeId,
    plain: NodeId,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    if l.seq.is_empty() {
        return Ok(plain);
    }
    let mut outs = Vec::new();
    if l.plain_width > 0 {
        outs.push(plain);
    }
    for sl in &l.seq {
        outs.push(target_attention(sl, x, g, s)?);
    }
    Ok(g.concat(&outs))
}

fn target_attention(sl: &SeqLayout, x: NodeId, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let att = &sl.att;
    let n = sl.len;
    let keys: Vec<NodeId> = sl.keys.iter().map(|&(c, w)| g.slice(x, c, w)).collect();
    let mut key = g.concat(&keys);
    // Each position a row of its own: `[b * n, dh]`, the histories side by side.
    let rows: Vec<NodeId> = sl
        .hist
        .iter()
        .map(|&(c, d)| {
            let h = g.slice(x, c, n * d);
            g.unfold(h, n)
        })
        .collect();
    let mut hist = g.concat(&rows);
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
            let k = Kernel {
                l2: false,
                ..Kernel::DENSE
            };
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

/// EasyRec's DNN with `last_layer_no_activation` and
/// `last_layer_no_batch_norm`: the last layer is a plain dense layer.
fn scoring_dnn(s: &mut Scope, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> NodeId {
    let last = spec.hidden_units.len() - 1;
    let hidden = DnnSpec {
        hidden_units: spec.hidden_units[..last].to_vec(),
        dropout: spec.dropout.iter().take(last).copied().collect(),
        ..spec.clone()
    };
    let x = s.dnn(g, x, name, &hidden);
    let z = s.dense(
        g,
        x,
        &format!("{name}/dnn_{last}"),
        spec.hidden_units[last],
        Activation::Linear,
    );
    g.dropout(z, spec.dropout.get(last).copied().unwrap_or(0.0))
}
