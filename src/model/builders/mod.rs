//! One builder per architecture: the only place that knows how EasyRec
//! wires a model's feature groups and layers. Each emits a `Graph` over the
//! `ParamStore`; executors never look at the architecture.

pub mod backbone;
pub mod columns;
mod common;
pub mod mind;
pub mod multimodal;
mod multitask;
mod rank;
mod retrieval;
pub mod sequence;
pub mod transformer;

use crate::model::graph::params::Init;
use crate::model::graph::{Graph, NodeId, Scope};
use crate::model::layout::{named_group, GroupDropout, GroupLayout};

use crate::config::model::Arch;
use common::{bayes_towers, similarity, Builder};
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
            feats.push(sequence::combine(c, l, x, &mut g, scope)?);
        }
        let mut features = (!feats.is_empty()).then(|| g.concat(&feats));
        if let (Some(d), Some(f)) = (&dropout[i], features) {
            let p = scope
                .params
                .add(&d.name, 1, d.entries, Init::GlorotUniformVector, false, scope.rng);
            features = Some(g.variational_dropout(f, scope.params, p, d.index.clone()));
        }
        xs.push(sequence::group_features(l, x, features, &mut g, scope)?);
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
            let x = multimodal::tower(tower, (groups, &b.xs), g_, scope)?;
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
        Arch::Backbone(bb) => backbone::rank(bb, groups, &b.xs, classes, g_, scope)?,
        Arch::MultiTaskBackbone { backbone, towers } => {
            let inputs = backbone::task_inputs(backbone, groups, &b.xs, towers.len(), g_, scope)?;
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
        Arch::Mind(m) => mind::mind(m, (groups, &b.xs), g_, scope)?,
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
            let (u, v) = backbone::towers(backbone, groups, &b.xs, (*user, *item), g_, scope)?;
            let norm = |g: &mut Graph, x: NodeId| if sim.cosine { g.l2_normalize(x) } else { x };
            let (u, v) = (norm(g_, u), norm(g_, v));
            similarity(g_, scope, (u, v), *sim)
        }
    };
    g.output("logits", logits);
    Ok(g)
}

/// The groups EasyRec reads with `input_layer(..., is_combine=False)`:
/// their sequences unpooled, each table's variable in the scope
/// `input_layer/<column>` rather than that of an input-layer call (the
/// multi-modal models' `text` group, MIND's `hist`).
pub fn unpooled_groups(arch: &Arch, groups: &[GroupLayout]) -> Vec<usize> {
    match arch {
        Arch::Multimodal { .. }
        | Arch::Dbmtl {
            multimodal: Some(_), ..
        } => named_group(groups, "text").into_iter().collect(),
        Arch::Mind(_) => named_group(groups, "hist").into_iter().collect(),
        _ => Vec::new(),
    }
}

/// The groups in the order EasyRec's model calls its input layer on them:
/// each call opens a variable scope, `input_layer`, `input_layer_1`, ...,
/// that holds the tables of that group. Groups the model does not read
/// come last.
pub fn input_layer_order(arch: &Arch, groups: &[GroupLayout]) -> Vec<usize> {
    let named = |names: &[&str]| -> Vec<usize> { names.iter().filter_map(|n| named_group(groups, n)).collect() };
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
        // The groups in the order their input-layer blocks run.
        Arch::Backbone(b) | Arch::MultiTaskBackbone { backbone: b, .. } | Arch::MatchBackbone { backbone: b, .. } => b
            .all_blocks()
            .filter(|blk| blk.input_layer().is_some())
            .filter_map(|blk| match &blk.inputs.first()?.source {
                crate::config::model::backbone::Source::Group(n) => named_group(groups, n),
                _ => None,
            })
            .collect(),
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
