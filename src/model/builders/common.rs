//! What the builders share: the `Builder` over a model's groups and
//! their input nodes, a match model's similarity, task towers, gates and
//! the FM input.

use anyhow::{bail, Context};

use crate::config::model::{Activation, Similarity, TaskTower};
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, NodeId, Scope};
use crate::model::layout::{named_group, GroupLayout};

pub(super) struct Builder<'a> {
    pub(super) groups: &'a [GroupLayout],
    /// Each group's input node.
    pub(super) xs: Vec<NodeId>,
    /// The single-task models' logits per row (`num_class`).
    pub(super) classes: usize,
}

impl Builder<'_> {
    /// The non-wide group called `name`.
    pub(super) fn group(&self, name: &str, model: &str) -> anyhow::Result<usize> {
        named_group(self.groups, name).with_context(|| format!("{model} needs a feature group named `{name}`"))
    }

    /// The group called `deep`, else the first non-wide one.
    pub(super) fn deep_group(&self, model: &str) -> anyhow::Result<usize> {
        named_group(self.groups, "deep")
            .or_else(|| self.groups.iter().position(|g| !g.wide))
            .with_context(|| format!("{model} needs a deep feature group"))
    }
}

/// A match model's logit from its (normalised, for the cosine) tower
/// embeddings `u` and `v`: `u · v / temperature`, times `|sim_w|` plus
/// `sim_b` with `scale_simi`. Besides it, the graph gets the outputs
/// `user_tower_emb`, `item_tower_emb` and `user_scaled` (the user
/// embedding times the similarity's scale: the in-batch loss's user side).
pub fn similarity(g: &mut Graph, s: &mut Scope, (u, v): (NodeId, NodeId), sim: Similarity) -> NodeId {
    let (w, b) = if sim.scale_simi {
        (
            Some(s.params.add("sim_w", 1, 1, Init::Ones, false, s.rng)),
            Some(s.params.add("sim_b", 1, 1, Init::Zeros, false, s.rng)),
        )
    } else {
        (None, None)
    };
    let us = g.scale(u, 1.0 / sim.temperature, w);
    let uv = g.mul(us, v);
    let mut logit = g.row_sum(uv);
    if let Some(b) = b {
        logit = g.bias(logit, b);
    }
    g.output("user_tower_emb", u);
    g.output("item_tower_emb", v);
    g.output("user_scaled", us);
    logit
}

/// MMoE's, SimpleMultiTask's and PLE's task towers over one input each:
/// the tower's DNN (named after it), then `dnn_output_<i>`, the output
/// `logits_<tower>`.
pub(super) fn task_heads(g: &mut Graph, s: &mut Scope, towers: &[TaskTower], inputs: Vec<NodeId>) {
    for (i, (t, input)) in towers.iter().zip(inputs).enumerate() {
        let h = match &t.dnn {
            Some(d) => s.dnn(g, input, &t.name, d),
            None => input,
        };
        let logits = s.dense(g, h, &format!("dnn_output_{i}"), t.logits, Activation::Linear);
        g.output(&format!("logits_{}", t.name), logits);
    }
}

/// An expert gate (MMoE's and PLE's): the dense layer `layer` over
/// `selector`, one logit per expert, softmaxed, mixing `experts`.
pub(super) fn gate(
    g: &mut Graph,
    s: &mut Scope,
    selector: NodeId,
    experts: &[NodeId],
    layer: &str,
) -> anyhow::Result<NodeId> {
    if experts.iter().any(|e| g.width(*e) != g.width(experts[0])) {
        bail!("the experts that gate `{layer}` mixes must end with the same width");
    }
    let w = s.dense(g, selector, layer, experts.len(), Activation::Linear);
    let w = g.softmax(w);
    Ok(g.weighted_sum(w, experts))
}

/// DBMTL's (and MultiTaskModel's) task towers over one input each: a DNN
/// (named `<tower><dnn_suffix>`), then the Bayesian part, where each tower
/// sees its own features and the relation outputs of the towers it depends
/// on (all earlier), then a one-logit output `logits_<tower>`.
pub(super) fn bayes_towers(g: &mut Graph, s: &mut Scope, inputs: Vec<NodeId>, towers: &[TaskTower], dnn_suffix: &str) {
    let features: Vec<NodeId> = towers
        .iter()
        .zip(inputs)
        .map(|(t, input)| match &t.dnn {
            Some(d) => s.dnn(g, input, &format!("{}{dnn_suffix}", t.name), d),
            None => input,
        })
        .collect();
    let mut relation: Vec<NodeId> = Vec::new();
    for (i, t) in towers.iter().enumerate() {
        let parts: Vec<NodeId> = std::iter::once(features[i])
            .chain(t.relations.iter().map(|&r| relation[r]))
            .collect();
        let input = g.concat(&parts);
        let r = match &t.relation_dnn {
            Some(d) => s.dnn(g, input, &format!("{}/relation_dnn", t.name), d),
            None => input,
        };
        relation.push(r);
        let logits = s.dense(g, r, &format!("{}/output", t.name), t.logits, Activation::Linear);
        g.output(&format!("logits_{}", t.name), logits);
    }
}

/// A teacher's hint to a student, per row: `Σ (a - stop_gradient(target))²`
/// times `per` (1 / width for the mean), the target cut from the gradient
/// (RocketLaunching's hints, DAT's mimic losses).
pub(super) fn squared_gap(g: &mut Graph, a: NodeId, target: NodeId, per: f32) -> NodeId {
    let target = g.stop_gradient(target);
    let d = g.sub(a, target);
    let sq = g.mul(d, d);
    let sum = g.row_sum(sq);
    if per == 1.0 {
        sum
    } else {
        g.scale(sum, per, None)
    }
}

/// The FM features of a deep group from its features `x`: its leading
/// run of embedded parts, then its combined sequences, all of one width,
/// side by side, with their count.
pub(super) fn fm_input(l: &GroupLayout, x: NodeId, model: &str, g: &mut Graph) -> anyhow::Result<(NodeId, usize)> {
    let sparse: Vec<_> = l.sparse_parts().collect();
    let Some(d) = sparse.first().map(|p| p.dim).or(l.combined.first().map(|c| c.width)) else {
        bail!("{model}: group `{}` has no embedded features for the FM part", l.name)
    };
    if sparse.iter().any(|p| p.dim != d) || l.combined.iter().any(|c| c.width != d) {
        bail!(
            "{model}: every embedded feature of group `{}` needs the same embedding_dim (a sequence's combiner output included)",
            l.name
        );
    }
    let mut blocks = Vec::new();
    if !sparse.is_empty() {
        blocks.push(g.slice(x, 0, sparse.len() * d));
    }
    let seqs = l.combined_in_order();
    blocks.extend(seqs.iter().map(|c| g.slice(x, c.out_col, d)));
    let v = g.concat(&blocks);
    Ok((v, sparse.len() + seqs.len()))
}
