//! The ranking architectures: WideAndDeep and DeepFM, FM, AutoInt, DLRM,
//! DCN and MultiTower.

use anyhow::{bail, Context};

use super::common::*;
use crate::config::model::{Activation, DnnSpec, Interaction};
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, Kernel, Keys, NodeId, Scope};

impl Builder<'_> {
    /// The wide side, `[b, dim]`: per wide group its embedded features'
    /// wide embeddings summed, plus a linear map of its raw values.
    pub(super) fn wide(&self, g: &mut Graph, s: &mut Scope, dim: usize) -> Option<NodeId> {
        let mut terms = Vec::new();
        for (i, l) in self.groups.iter().enumerate().filter(|(_, l)| l.wide) {
            let n = l.sparse_parts().count();
            let dw = l.dense_width();
            if n > 0 {
                let e = g.slice(self.xs[i], 0, n * dim);
                terms.push(g.sum_blocks(e, n));
            }
            if dw > 0 {
                let k = s.params.add(
                    &format!("{}/raw_kernel", l.name),
                    dw,
                    dim,
                    Init::GlorotUniform,
                    true,
                    s.rng,
                );
                let r = g.slice(self.xs[i], n * dim, dw);
                terms.push(g.linear(r, s.params, k, None, Activation::Linear));
            }
        }
        (!terms.is_empty()).then(|| g.add(&terms))
    }

    /// WideAndDeep, and DeepFM (`fm`: with the FM term over the deep
    /// group's leading embedded features). With final_dnn the sides are
    /// concatenated (a missing wide side as zeros; DeepFM's summed to one
    /// column unless it has one per class, as EasyRec sums it) and end in
    /// an output unit per class; without it the deep side gets its own
    /// output units and the other sides are added, which needs a wide side
    /// of one column per class (DeepFM's FM term is mapped to the classes
    /// by a dense `fm_logits` when there are several).
    pub(super) fn wide_and_deep(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        wide_dim: usize,
        dnn: &DnnSpec,
        final_dnn: Option<&DnnSpec>,
        fm: bool,
    ) -> anyhow::Result<NodeId> {
        let model = if fm { "DeepFM" } else { "WideAndDeep" };
        let wide = self.wide(g, s, wide_dim);
        let deep = self.deep_group(model)?;
        let x = self.xs[deep];
        let fm_out = if fm {
            let (v, n) = fm_input(&self.groups[deep], x, model, g)?;
            Some(g.fm(v, n))
        } else {
            None
        };
        let h = s.dnn(g, x, "deep_feature", dnn);
        let classes = self.classes;
        Ok(match final_dnn {
            Some(f) => {
                let mut w = wide.unwrap_or_else(|| g.zeros(h, wide_dim));
                if fm && wide_dim > 1 && wide_dim != classes {
                    w = g.row_sum(w);
                }
                let c = g.concat(&[Some(w), fm_out, Some(h)].into_iter().flatten().collect::<Vec<_>>());
                let top = s.dnn(g, c, "final_dnn", f);
                s.dense(g, top, "output", classes, Activation::Linear)
            }
            None => {
                if wide_dim != classes {
                    bail!("{model} without final_dnn needs wide_output_dim equal to num_class ({classes})");
                }
                let out = if fm { "deep_logits" } else { "deep_out" };
                let o = s.dense(g, h, out, classes, Activation::Linear);
                let fm_sum = fm_out.map(|f| {
                    if classes > 1 {
                        s.dense(g, f, "fm_logits", classes, Activation::Linear)
                    } else {
                        g.row_sum(f)
                    }
                });
                let terms: Vec<NodeId> = [wide, Some(o), fm_sum].into_iter().flatten().collect();
                // The wide side first, as EasyRec adds them.
                g.add(&terms)
            }
        })
    }

    /// EasyRec's FM model: `wide_feature` (the wide side, one column) plus
    /// the FM term over the `deep` group's embeddings summed over its
    /// columns, plus `fm_bias`.
    pub(super) fn fm(&self, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
        let deep = self.deep_group("FM")?;
        let (v, n) = fm_input(&self.groups[deep], self.xs[deep], "FM", g)?;
        let pairwise = g.fm(v, n);
        let fm_sum = g.row_sum(pairwise);
        let wide = self.wide(g, s, 1).unwrap_or_else(|| g.zeros(fm_sum, 1));
        let sum = g.add(&[wide, fm_sum]);
        let bias = s.params.add("fm_bias", 1, 1, Init::Zeros, false, s.rng);
        Ok(g.bias(sum, bias))
    }

    /// EasyRec's AutoInt over the `all` group, read as fields of one
    /// embedding_dim (a sequence attention's outputs included): per
    /// interacting layer, query, key and value projections (no bias) into
    /// `heads` heads of `head_size`, self-attention among the fields, plus
    /// a projection of the layer's input, through ReLU; then the fields
    /// side by side into the one-logit `output`.
    pub(super) fn autoint(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (heads, head_size): (usize, usize),
        layers: usize,
    ) -> anyhow::Result<NodeId> {
        let all = self.group("all", "AutoInt")?;
        let l = &self.groups[all];
        let d = l
            .sparse_parts()
            .next()
            .map(|p| p.dim)
            .context("AutoInt: group `all` has no embedded features")?;
        let width = g.width(self.xs[all]);
        if l.dense_width() > 0 || l.sparse_parts().any(|p| p.dim != d) || !width.is_multiple_of(d) {
            bail!("AutoInt: every feature of group `all` must be an embedding of one embedding_dim ({d}), as EasyRec requires");
        }
        let n = width / d;
        let proj = Kernel {
            bias: false,
            ..Kernel::DENSE
        };
        let lin = Activation::Linear;
        let mut t = g.unfold(self.xs[all], n);
        for i in 0..layers {
            let name = format!("multi_head_self_attention_layer_{i}");
            let mut p =
                |what: &str, g: &mut Graph| s.layer(g, t, &format!("{name}/{what}"), heads * head_size, proj, lin);
            let (q, k, v) = (p("query/dnn", g), p("key/dnn", g), p("value/dnn", g));
            // EasyRec divides by head_size ** -0.5: the scores grow with
            // the head's width rather than being normalised by it.
            let a = g.attention((q, k, v), (heads, (head_size as f32).sqrt()), Keys::All);
            let res = s.layer(g, t, &format!("{name}/dnn"), heads * head_size, proj, lin);
            let sum = g.add(&[a, res]);
            t = g.act(sum, Activation::Relu);
        }
        let flat = g.fold(t, n);
        Ok(s.unregularized_output(g, flat, "output", self.classes))
    }

    pub(super) fn dlrm(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (bot, top): (&DnnSpec, &DnnSpec),
        interaction: Interaction,
        itself: bool,
        with_dense: bool,
    ) -> anyhow::Result<NodeId> {
        let dense = self.group("dense", "DLRM")?;
        let sparse = self.group("sparse", "DLRM")?;
        let sg = &self.groups[sparse];
        if sg.parts.iter().any(|p| p.table.is_none()) || !sg.combined.is_empty() {
            bail!("DLRM: group `sparse` may only hold embedded features, not sequences");
        }
        let n_sparse = sg.parts.len();
        let dim = sg.parts.first().map_or(0, |p| p.dim);
        if n_sparse == 0 || sg.parts.iter().any(|p| p.dim != dim) {
            bail!("DLRM: group `sparse` needs features of one embedding_dim");
        }
        let d = s.dnn(g, self.xs[dense], "bot_dnn", bot);
        let z = match interaction {
            Interaction::Cat => g.concat(&[d, self.xs[sparse]]),
            Interaction::Dot => {
                if g.width(d) != dim {
                    bail!(
                        "DLRM: bot_dnn must end with the embedding_dim ({dim}) for the dot interaction, it ends with {}",
                        g.width(d)
                    );
                }
                let n = n_sparse + 1;
                let off = usize::from(!itself);
                let pairs = (0..n).flat_map(|i| (i + off..n).map(move |j| (i, j))).collect();
                let inter = g.dot(&[d, self.xs[sparse]], dim, pairs);
                // EasyRec's order: the interactions, the sparse embeddings,
                // then (arch_with_dense_feature) the bottom output.
                if with_dense {
                    g.concat(&[inter, self.xs[sparse], d])
                } else {
                    g.concat(&[inter, self.xs[sparse]])
                }
            }
        };
        let h = s.dnn(g, z, "top_dnn", top);
        Ok(s.dense(g, h, "output", self.classes, Activation::Linear))
    }

    pub(super) fn dcn(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (deep_input, deep): (&str, &DnnSpec),
        (cross_input, cross_num): (&str, usize),
        final_dnn: &DnnSpec,
    ) -> anyhow::Result<NodeId> {
        let deep_group = self.group(deep_input, "DCN deep_tower")?;
        let cross_group = self.group(cross_input, "DCN cross_tower")?;
        let h = s.dnn(g, self.xs[deep_group], "dnn", deep);
        let x0 = self.xs[cross_group];
        let d = g.width(x0);
        let mut xl = x0;
        // EasyRec's cross variables: `tf.get_variable` of shape [d] with its
        // default (Glorot uniform) initializer, the bias included, and no
        // regularizer.
        for i in 0..cross_num {
            let w = s.params.add(
                &format!("cross_layer_{i}_w"),
                d,
                1,
                Init::GlorotUniformVector,
                false,
                s.rng,
            );
            let b = s.params.add(
                &format!("cross_layer_{i}_b"),
                1,
                d,
                Init::GlorotUniformVector,
                false,
                s.rng,
            );
            xl = g.cross(x0, xl, w, b);
        }
        let c = g.concat(&[h, xl]);
        let top = s.dnn(g, c, "final_dnn", final_dnn);
        Ok(s.unregularized_output(g, top, "output", self.classes))
    }

    pub(super) fn multi_tower(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (towers, seq_towers): (&[(String, DnnSpec)], &[String]),
        final_dnn: &DnnSpec,
    ) -> anyhow::Result<NodeId> {
        if towers.is_empty() && seq_towers.is_empty() {
            bail!("MultiTower needs at least one tower");
        }
        let mut outs = Vec::new();
        for (name, spec) in towers {
            let gi = self.group(name, "MultiTower")?;
            // EasyRec batch-normalises every tower's input, whatever use_bn says.
            let x = s.batch_norm(g, self.xs[gi], &format!("{name}_fea_bn"), Activation::Linear);
            outs.push(s.dnn(g, x, &format!("{name}_dnn"), spec));
        }
        // A DIN or BST tower's output joins as it is.
        for name in seq_towers {
            outs.push(self.xs[self.group(name, "MultiTower")?]);
        }
        let c = g.concat(&outs);
        let top = s.dnn(g, c, "final_dnn", final_dnn);
        Ok(s.unregularized_output(g, top, "output", self.classes))
    }
}
