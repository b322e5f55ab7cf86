//! One builder per architecture: the only place that knows how EasyRec
//! wires a model's feature groups and layers. Each emits a `Graph` over the
//! `ParamStore`; executors never look at the architecture.

use anyhow::{bail, Context};

use super::graph::{Graph, Kernel, Keys, NodeId, Reduce, Scope};
use super::params::Init;
use super::{GroupDropout, GroupLayout};
use crate::config::model_plan::{
    Activation, Arch, DnnSpec, DropoutTower, Interaction, PleLevel, SenetParams, Similarity, TaskTower,
};
use crate::config::multimodal::Tower;

/// The graph of `arch` over `groups`, its parameters added to `scope`.
/// Single-task models have the output `logits`, `classes` wide; multi-task
/// ones `logits_<tower>` per task tower.
///
/// A group with `dropout` has its plain columns go through variational
/// dropout before anything reads them (EasyRec's input layer does it).
pub fn build(
    arch: &Arch,
    (groups, dropout): (&[GroupLayout], &[Option<GroupDropout>]),
    classes: usize,
    scope: &mut Scope,
) -> anyhow::Result<Graph> {
    let mut g = Graph::default();
    let mut xs = Vec::with_capacity(groups.len());
    for (i, l) in groups.iter().enumerate() {
        let x = g.input(i, l.width);
        // The plain parts, then the combined sequences (a group of
        // sequence attentions alone has neither).
        let mut feats: Vec<NodeId> = (l.plain_width > 0)
            .then(|| g.slice(x, 0, l.plain_width))
            .into_iter()
            .collect();
        for c in l.combined_in_order() {
            feats.push(super::sequence::combine(c, l, x, &mut g, scope)?);
        }
        let mut features = (!feats.is_empty()).then(|| g.concat(&feats));
        if let (Some(d), Some(f)) = (&dropout[i], features) {
            let p = scope
                .params
                .add(&d.name, 1, d.entries, Init::GlorotUniformVector, false, scope.rng);
            features = Some(g.variational_dropout(f, scope.params, p, d.index.clone()));
        }
        xs.push(super::sequence::group_features(l, x, features, &mut g, scope)?);
    }
    let b = Builder { groups, xs, classes };
    let g_ = &mut g;
    let logits = match arch {
        Arch::WideAndDeep {
            wide_output_dim,
            dnn,
            final_dnn,
        } => b.wide_and_deep(g_, scope, *wide_output_dim, dnn, final_dnn.as_ref(), false)?,
        Arch::DeepFm {
            wide_output_dim,
            dnn,
            final_dnn,
        } => b.wide_and_deep(g_, scope, *wide_output_dim, dnn, final_dnn.as_ref(), true)?,
        Arch::Fm => b.fm(g_, scope)?,
        Arch::AutoInt {
            heads,
            head_size,
            layers,
        } => b.autoint(g_, scope, (*heads, *head_size), *layers)?,
        Arch::Multimodal { tower, final_dnn } => {
            let x = super::multimodal::tower(tower, (groups, &b.xs), g_, scope)?;
            let top = scope.dnn(g_, x, "final_dnn", final_dnn);
            scope.unregularized_output(g_, top, "output", classes)
        }
        Arch::Dlrm {
            bot,
            top,
            interaction,
            itself,
            with_dense,
        } => b.dlrm(g_, scope, (bot, top), *interaction, *itself, *with_dense)?,
        Arch::Dcn {
            deep_input,
            deep,
            cross_input,
            cross_num,
            final_dnn,
        } => b.dcn(g_, scope, (deep_input, deep), (cross_input, *cross_num), final_dnn)?,
        Arch::MultiTower {
            towers,
            seq_towers,
            final_dnn,
        } => b.multi_tower(g_, scope, (towers, seq_towers), final_dnn)?,
        Arch::Backbone(bb) => super::backbone::rank(bb, groups, &b.xs, classes, g_, scope)?,
        Arch::MultiTaskBackbone { backbone, towers } => {
            let inputs = super::backbone::task_inputs(backbone, groups, &b.xs, towers.len(), g_, scope)?;
            bayes_towers(g_, scope, inputs, towers, "");
            return Ok(g);
        }
        Arch::Mmoe { experts, towers } => {
            b.mmoe(g_, scope, experts, towers)?;
            return Ok(g);
        }
        Arch::Ple { levels, towers } => {
            b.ple(g_, scope, levels, towers)?;
            return Ok(g);
        }
        Arch::Esmm { groups, cvr, ctr, .. } => {
            b.esmm(g_, scope, groups, (cvr, ctr))?;
            return Ok(g);
        }
        Arch::Dbmtl {
            multimodal,
            bottom,
            experts,
            towers,
        } => {
            b.dbmtl(g_, scope, (multimodal.as_ref(), bottom.as_ref()), experts, towers)?;
            return Ok(g);
        }
        Arch::Dssm {
            user,
            item,
            sim,
            senet,
            amm,
        } => b.dssm(g_, scope, (user, item), (*senet, *amm), *sim)?,
        Arch::DropoutNet { user, item } => b.dropoutnet(g_, scope, (user, item))?,
        Arch::Mind(m) => super::mind::mind(m, (groups, &b.xs), g_, scope)?,
        Arch::RocketLaunching {
            share,
            booster,
            light,
            feature_based,
        } => {
            b.rocket_launching(g_, scope, [share, booster, light], *feature_based)?;
            return Ok(g);
        }
        Arch::MatchBackbone {
            backbone,
            user,
            item,
            sim,
        } => {
            let (u, v) = super::backbone::towers(backbone, groups, &b.xs, (*user, *item), g_, scope)?;
            let norm = |g: &mut Graph, x: NodeId| if sim.cosine { g.l2_normalize(x) } else { x };
            let (u, v) = (norm(g_, u), norm(g_, v));
            similarity(g_, scope, (u, v), *sim)
        }
    };
    g.output("logits", logits);
    Ok(g)
}

/// A match model's logit from its (normalised, for the cosine) tower
/// embeddings `u` and `v`: `u · v / temperature`, times `|sim_w|` plus
/// `sim_b` with `scale_simi`. Besides it, the graph gets the outputs
/// `user_tower_emb`, `item_tower_emb` and `user_scaled` (the user
/// embedding times the similarity's scale: the in-batch loss's user side).
pub(super) fn similarity(g: &mut Graph, s: &mut Scope, (u, v): (NodeId, NodeId), sim: Similarity) -> NodeId {
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

/// The width of the wide side's embeddings, for the architectures that
/// have a wide side.
pub fn wide_dim(arch: &Arch) -> Option<usize> {
    match arch {
        Arch::WideAndDeep { wide_output_dim, .. } | Arch::DeepFm { wide_output_dim, .. } => Some(*wide_output_dim),
        Arch::Fm => Some(1),
        Arch::Backbone(b) | Arch::MultiTaskBackbone { backbone: b, .. } | Arch::MatchBackbone { backbone: b, .. } => {
            b.wide_output_dim
        }
        _ => None,
    }
}

/// Whether the architecture reads the embedded features of every group as
/// one leading block (DeepFM's FM part), so groups put them first.
pub fn embedded_first(arch: &Arch) -> bool {
    matches!(arch, Arch::DeepFm { .. } | Arch::Fm)
}

/// Whether `arch` reads its group `name` as EasyRec's input-layer tensor,
/// whose columns TensorFlow orders by feature-column name
/// (`FeatureSpec::easyrec_column`). Wide groups, WideAndDeep's deep side
/// and DLRM's sparse group read EasyRec's per-feature list instead, in
/// `feature_names` order.
pub fn columns_by_name(arch: &Arch, name: &str, wide: bool) -> bool {
    match arch {
        _ if wide => false,
        Arch::WideAndDeep { .. } => false,
        Arch::Dlrm { .. } => name != "sparse",
        _ => true,
    }
}

/// The groups in the order EasyRec's model calls its input layer on them:
/// each call opens a variable scope, `input_layer`, `input_layer_1`, ...,
/// that holds the tables of that group. Groups the model does not read
/// come last.
pub fn input_layer_order(arch: &Arch, groups: &[GroupLayout]) -> Vec<usize> {
    let named = |names: &[&str]| -> Vec<usize> { names.iter().filter_map(|n| super::named_group(groups, n)).collect() };
    let mut order: Vec<usize> = match arch {
        Arch::WideAndDeep { .. } | Arch::DeepFm { .. } | Arch::Fm => {
            let wide = (0..groups.len()).filter(|&i| groups[i].wide);
            wide.chain((0..groups.len()).filter(|&i| !groups[i].wide)).collect()
        }
        Arch::Dlrm { .. } => named(&["sparse", "dense"]),
        Arch::Multimodal { .. }
        | Arch::Dbmtl {
            multimodal: Some(_), ..
        } => named(&["image", "general", "text", "other"]),
        Arch::Dcn {
            deep_input,
            cross_input,
            ..
        } => named(&[deep_input.as_str(), cross_input.as_str()]),
        Arch::MultiTower { towers, .. } => named(&towers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()),
        Arch::Mmoe { .. }
        | Arch::Ple { .. }
        | Arch::Dbmtl { .. }
        | Arch::AutoInt { .. }
        | Arch::RocketLaunching { .. } => named(&["all"]),
        Arch::Esmm { groups, .. } if !groups.is_empty() => {
            named(&groups.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>())
        }
        Arch::Esmm { .. } => named(&["all"]),
        Arch::Backbone(_) | Arch::MultiTaskBackbone { .. } | Arch::MatchBackbone { .. } => Vec::new(),
        Arch::Dssm { .. } => named(&["user", "item"]),
        Arch::Mind(_) => named(&["hist", "user", "item"]),
        Arch::DropoutNet { .. } => named(&["user_content", "user_preference", "item_content", "item_preference"]),
    };
    order.dedup();
    for i in 0..groups.len() {
        if !order.contains(&i) {
            order.push(i);
        }
    }
    order
}

struct Builder<'a> {
    groups: &'a [GroupLayout],
    /// Each group's input node.
    xs: Vec<NodeId>,
    /// The single-task models' logits per row (`num_class`).
    classes: usize,
}

impl Builder<'_> {
    /// The non-wide group called `name`.
    fn group(&self, name: &str, model: &str) -> anyhow::Result<usize> {
        super::named_group(self.groups, name).with_context(|| format!("{model} needs a feature group named `{name}`"))
    }

    /// The group called `deep`, else the first non-wide one.
    fn deep_group(&self, model: &str) -> anyhow::Result<usize> {
        super::named_group(self.groups, "deep")
            .or_else(|| self.groups.iter().position(|g| !g.wide))
            .with_context(|| format!("{model} needs a deep feature group"))
    }

    /// The wide side, `[b, dim]`: per wide group its embedded features'
    /// wide embeddings summed, plus a linear map of its raw values.
    fn wide(&self, g: &mut Graph, s: &mut Scope, dim: usize) -> Option<NodeId> {
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
    fn wide_and_deep(
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
    fn fm(&self, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
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
    fn autoint(
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

    fn dlrm(
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

    fn dcn(
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

    fn multi_tower(
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

impl Builder<'_> {
    /// EasyRec's RocketLaunching (`Arch::RocketLaunching`): outputs
    /// `logits_booster` and `logits_light`, `classes` wide each, and its
    /// penalties: `hint_loss`, the light logits' mean squared difference
    /// from the booster's, and with `feature_based` per light hidden layer
    /// `similarity_<k>`, -0.1 times its Euclidean distance over the batch
    /// to the first booster layer as wide (EasyRec's sign and distance,
    /// whatever feature_distillation_function says), the booster's side
    /// cut from the gradient throughout.
    fn rocket_launching(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        [share, booster, light]: [&DnnSpec; 3],
        feature_based: bool,
    ) -> anyhow::Result<()> {
        let all = self.group("all", "RocketLaunching")?;
        let shared = s.dnn(g, self.xs[all], "share_dnn", share);
        let b_layers = s.dnn_layers(g, shared, "booster_dnn", booster);
        let cut = g.stop_gradient(shared);
        let l_layers = s.dnn_layers(g, cut, "light_dnn", light);
        let last = |layers: &[NodeId], x: NodeId| layers.last().copied().unwrap_or(x);
        let b_out = s.dense(
            g,
            last(&b_layers, shared),
            "booster_output",
            self.classes,
            Activation::Linear,
        );
        let l_out = s.dense(
            g,
            last(&l_layers, cut),
            "light_output",
            self.classes,
            Activation::Linear,
        );
        g.output("logits_booster", b_out);
        g.output("logits_light", l_out);
        let hint = squared_gap(g, l_out, b_out, 1.0 / self.classes as f32);
        g.penalty("hint_loss", hint, Reduce::Mean, 1.0);
        if feature_based {
            let mut count = 0;
            for (i, &lu) in light.hidden_units.iter().enumerate() {
                if let Some(j) = booster.hidden_units.iter().position(|&bu| bu == lu) {
                    let gap = squared_gap(g, l_layers[i], b_layers[j], 1.0);
                    g.penalty(&format!("similarity_{count}"), gap, Reduce::RootOfSum, -0.1);
                    count += 1;
                }
            }
        }
        Ok(())
    }

    /// DSSM: per tower (`user_dnn`, `item_dnn`) EasyRec's DNN over all but
    /// the last of its hidden units, then a linear layer of the last as
    /// `<tower>_dnn/dnn_<n-1>`; L2-normalised for the cosine. Besides
    /// `logits` (the row's own similarity, scaled by `|sim_w| / T` and
    /// shifted by `sim_b`) the graph has the outputs `user_tower_emb`,
    /// `item_tower_emb` and `user_scaled` (the user embedding times the
    /// similarity's scale: the in-batch loss's user side).
    fn dssm(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (user, item): (&DnnSpec, &DnnSpec),
        (senet, amm): (Option<SenetParams>, Option<[f32; 2]>),
        sim: Similarity,
    ) -> anyhow::Result<NodeId> {
        // DAT's augmented vectors, user's then item's.
        let augments = match amm {
            Some(_) => Some([
                self.xs[self.group("user_id_augment", "DAT")?],
                self.xs[self.group("item_id_augment", "DAT")?],
            ]),
            None => None,
        };
        let mut tower = |name: &str, spec: &DnnSpec, se: Option<(usize, usize)>| -> anyhow::Result<NodeId> {
            let gi = self.group(name, "DSSM")?;
            let mut x = self.xs[gi];
            if let Some(a) = augments {
                x = g.concat(&[x, a[usize::from(name == "item")]]);
            }
            if let Some(params) = se {
                // DSSM_SENet reads the group's plain features, one by one.
                let l = &self.groups[gi];
                if !l.seq.is_empty() || !l.combined.is_empty() {
                    bail!("DSSM_SENet: group `{name}` holds sequences, which its SENet does not read");
                }
                let fields: Vec<NodeId> = l.feature_columns().into_iter().map(|(c, w)| g.slice(x, c, w)).collect();
                let style = super::backbone::SeNetStyle::Classic;
                x = super::backbone::senet(&fields, &format!("{name}_senet"), params, style, g, s)?;
            }
            let e = s.dnn_linear_last(g, x, &format!("{name}_dnn"), spec);
            Ok(if sim.cosine { g.l2_normalize(e) } else { e })
        };
        let u = tower("user", user, senet.map(|s| s[0]))?;
        let v = tower("item", item, senet.map(|s| s[1]))?;
        if let (Some([wu, wi]), Some([au, ai])) = (amm, augments) {
            // EasyRec's amm_loss_u and amm_loss_i: the mean squared gap of
            // each side's augmented vector to the other tower's output,
            // that output cut from the gradient.
            let d = g.width(u);
            for (name, a, p, w) in [("amm_loss_u", au, v, wu), ("amm_loss_i", ai, u, wi)] {
                if g.width(a) != d {
                    bail!(
                        "DAT: the `{}_id_augment` group is {} wide, and must be as wide as the towers' output ({d})",
                        if name == "amm_loss_u" { "user" } else { "item" },
                        g.width(a)
                    );
                }
                let mean = squared_gap(g, a, p, 1.0 / d as f32);
                g.penalty(name, mean, Reduce::Mean, w);
            }
        }
        Ok(similarity(g, s, (u, v), sim))
    }

    /// DropoutNet (`Arch::DropoutNet`): each side's embedding, then their
    /// cosine.
    fn dropoutnet(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (user, item): (&DropoutTower, &DropoutTower),
    ) -> anyhow::Result<NodeId> {
        let mut side = |name: &str, t: &DropoutTower| -> anyhow::Result<NodeId> {
            let find = |part: &str| {
                let group = format!("{name}_{part}");
                self.groups.iter().position(|l| l.name == group)
            };
            let mut parts = Vec::new();
            if let Some(gi) = find("content") {
                parts.push(s.dnn(g, self.xs[gi], &format!("{name}_content"), &t.content));
            }
            if let Some(gi) = find("preference") {
                let x = self.xs[gi];
                // Bernoulli dropout of whole rows: a one-column mask,
                // inverted-dropout scaled, weighting the row.
                let ones = g.ones(x, 1);
                let keep = g.dropout(ones, t.dropout);
                let x = g.weighted_sum(keep, &[x]);
                parts.push(s.dnn(g, x, &format!("{name}_preference"), &t.preference));
            }
            if parts.is_empty() {
                bail!("DropoutNet has neither a `{name}_content` nor a `{name}_preference` feature group");
            }
            let x = g.concat(&parts);
            let e = s.dnn_linear_last(g, x, &format!("{name}_dnn"), &t.tower);
            Ok(g.l2_normalize(e))
        };
        let u = side("user", user)?;
        let v = side("item", item)?;
        let sim = Similarity {
            cosine: true,
            temperature: 1.0,
            scale_simi: false,
        };
        Ok(similarity(g, s, (u, v), sim))
    }

    /// EasyRec's MMoE layer over `x`: the experts, then per task a softmax
    /// gate (`mmoe/gate_<t>/dnn`) mixing their outputs.
    fn mixture(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        x: NodeId,
        experts: &[DnnSpec],
        tasks: usize,
    ) -> anyhow::Result<Vec<NodeId>> {
        let outs: Vec<NodeId> = experts
            .iter()
            .enumerate()
            .map(|(e, spec)| s.dnn(g, x, &format!("mmoe/expert_{e}"), spec))
            .collect();
        (0..tasks)
            .map(|t| gate(g, s, x, &outs, &format!("mmoe/gate_{t}/dnn")))
            .collect()
    }

    /// The group `all` that multi-task models read.
    fn all_group(&self, model: &str) -> anyhow::Result<NodeId> {
        Ok(self.xs[self.group("all", model)?])
    }

    fn mmoe(&self, g: &mut Graph, s: &mut Scope, experts: &[DnnSpec], towers: &[TaskTower]) -> anyhow::Result<()> {
        let x = self.all_group(if experts.is_empty() { "SimpleMultiTask" } else { "MMoE" })?;
        let inputs = if experts.is_empty() {
            vec![x; towers.len()]
        } else {
            self.mixture(g, s, x, experts, towers.len())?
        };
        task_heads(g, s, towers, inputs);
        Ok(())
    }

    /// EasyRec's ESMM: each group's DNN (`<group>/dnn_<i>`), or the `all`
    /// group, concatenated into both towers (`<tower>/dnn_<i>`, then
    /// `<tower>/dnn_output`): `logits_<cvr>`, `logits_<ctr>`, and
    /// `logits_ctcvr`, the logit of their probabilities' product.
    fn esmm(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        groups: &[(String, DnnSpec)],
        (cvr, ctr): (&TaskTower, &TaskTower),
    ) -> anyhow::Result<()> {
        let all = if groups.is_empty() {
            self.all_group("ESMM")?
        } else {
            let parts = groups
                .iter()
                .map(|(name, spec)| {
                    let x = self.xs[self.group(name, "ESMM")?];
                    Ok(s.dnn(g, x, name, spec))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            g.concat(&parts)
        };
        let mut logits = Vec::new();
        for t in [cvr, ctr] {
            let spec = t.dnn.as_ref().context("an ESMM tower has a dnn")?;
            if t.logits != 1 {
                bail!("ESMM: tower `{}` must score one logit for pCTCVR", t.name);
            }
            let h = s.dnn(g, all, &t.name, spec);
            let z = s.dense(g, h, &format!("{}/dnn_output", t.name), 1, Activation::Linear);
            g.output(&format!("logits_{}", t.name), z);
            logits.push(z);
        }
        let ctcvr = g.product_logit(logits[0], logits[1]);
        g.output("logits_ctcvr", ctcvr);
        Ok(())
    }

    /// EasyRec's PLE: per level (`<level>`), the experts of task `t`
    /// (`<level>_task_<t>_expert_<e>/dnn`) and the shared ones
    /// (`<level>_share/dnn_expert_<e>/dnn`); task `t`'s gate
    /// (`<level>_task_<t>_gate/dnn`) over its experts then the shared
    /// ones, and below the last level the shared gate
    /// (`<level>_share_gate/dnn`) over every expert; then the task towers.
    fn ple(&self, g: &mut Graph, s: &mut Scope, levels: &[PleLevel], towers: &[TaskTower]) -> anyhow::Result<()> {
        let x = self.all_group("PLE")?;
        let mut task_in = vec![x; towers.len()];
        let mut shared_in = x;
        for (li, level) in levels.iter().enumerate() {
            let name = &level.name;
            let shared: Vec<NodeId> = (0..level.shared)
                .map(|e| {
                    let net = level.share_net.as_ref().expect("shared experts have a network");
                    s.dnn(g, shared_in, &format!("{name}_share/dnn_expert_{e}/dnn"), net)
                })
                .collect();
            let mut all = Vec::new();
            let mut next = Vec::new();
            for (t, &input) in task_in.iter().enumerate() {
                let own: Vec<NodeId> = (0..level.per_task)
                    .map(|e| s.dnn(g, input, &format!("{name}_task_{t}_expert_{e}/dnn"), &level.task_net))
                    .collect();
                let mixed: Vec<NodeId> = own.iter().chain(&shared).copied().collect();
                next.push(gate(g, s, input, &mixed, &format!("{name}_task_{t}_gate/dnn"))?);
                all.extend(own);
            }
            if li + 1 < levels.len() {
                all.extend(&shared);
                shared_in = gate(g, s, shared_in, &all, &format!("{name}_share_gate/dnn"))?;
            }
            task_in = next;
        }
        task_heads(g, s, towers, task_in);
        Ok(())
    }

    fn dbmtl(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (multimodal, bottom): (Option<&Tower>, Option<&DnnSpec>),
        experts: &[DnnSpec],
        towers: &[TaskTower],
    ) -> anyhow::Result<()> {
        let mut x = match multimodal {
            Some(t) => super::multimodal::tower(t, (self.groups, &self.xs), g, s)?,
            None => self.all_group("DBMTL")?,
        };
        if let Some(d) = bottom {
            x = s.dnn(g, x, "bottom_dnn", d);
        }
        let inputs = if experts.is_empty() {
            vec![x; towers.len()]
        } else {
            self.mixture(g, s, x, experts, towers.len())?
        };
        bayes_towers(g, s, inputs, towers, "/dnn");
        Ok(())
    }
}

/// MMoE's, SimpleMultiTask's and PLE's task towers over one input each:
/// the tower's DNN (named after it), then `dnn_output_<i>`, the output
/// `logits_<tower>`.
fn task_heads(g: &mut Graph, s: &mut Scope, towers: &[TaskTower], inputs: Vec<NodeId>) {
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
fn gate(g: &mut Graph, s: &mut Scope, selector: NodeId, experts: &[NodeId], layer: &str) -> anyhow::Result<NodeId> {
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
fn bayes_towers(g: &mut Graph, s: &mut Scope, inputs: Vec<NodeId>, towers: &[TaskTower], dnn_suffix: &str) {
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
fn squared_gap(g: &mut Graph, a: NodeId, target: NodeId, per: f32) -> NodeId {
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
fn fm_input(l: &GroupLayout, x: NodeId, model: &str, g: &mut Graph) -> anyhow::Result<(NodeId, usize)> {
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
