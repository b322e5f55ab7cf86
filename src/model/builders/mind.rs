//! MIND's graph, as EasyRec's `MIND.build_predict_graph` wires it: the
//! `hist` group's sequences into interest capsules (`model::capsule`),
//! each capsule with the user's features into an interest, the item
//! tower, and the label-aware attention of the interests on the row's
//! item.

use anyhow::{bail, Context};

use crate::config::model::mind::Mind;
use crate::config::model::Activation;
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, Keys, NodeId, Reduce, Routing, Scope};
use crate::model::layout::GroupLayout;

/// MIND's logit (the row's user against its item), with the outputs
/// `user_tower_emb`, `item_tower_emb` and `user_scaled` of a match model
/// (`builders::similarity`) and `user_interests` (`[b, max_k * d]`, the
/// interests past the row's count zeroed) and `user_emb_num` (the count).
///
/// The sequences keep `min(max_seq_len of the features, capsule
/// max_seq_len)` positions: EasyRec's padding to the capsule's
/// max_seq_len adds positions the routing weighs 0.
pub fn mind(
    m: &Mind,
    (groups, xs): (&[GroupLayout], &[NodeId]),
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let find = |name: &str| {
        crate::model::layout::named_group(groups, name)
            .with_context(|| format!("MIND needs a feature group named `{name}`"))
    };
    let hi = find("hist")?;
    let (l, x) = (&groups[hi], xs[hi]);
    let sl = l
        .seq
        .iter()
        .find(|sl| sl.att.input_only)
        .context("MIND reads the sequence features of group `hist`, and it has none")?;
    let c = &m.capsule;
    let p = sl.len.min(c.max_seq_len);
    let len = g.slice(x, sl.len_col, 1);
    let (mut seqs, mut time) = (Vec::new(), None);
    for (i, &(col, d)) in sl.hist.iter().enumerate() {
        let h = g.slice(x, col, p * d);
        let rows = g.unfold(h, p);
        if m.time_id == Some(i) {
            if d != 1 {
                bail!(
                    "model_config.mind.time_id_fea: the time feature must have an embedding_dim of 1, and it has {d}"
                );
            }
            time = Some(rows);
        } else {
            seqs.push(rows);
        }
    }
    if seqs.is_empty() {
        bail!("MIND needs a sequence in group `hist` besides its time_id_fea");
    }
    let mut hist = if m.average {
        let widths: Vec<usize> = seqs.iter().map(|n| g.width(*n)).collect();
        if widths.iter().any(|w| *w != widths[0]) {
            bail!("MIND's user_seq_combine SUM averages the `hist` sequences, which needs one embedding_dim, and they have {widths:?}");
        }
        let sum = g.add(&seqs);
        if seqs.len() > 1 {
            g.scale(sum, 1.0 / seqs.len() as f32, None)
        } else {
            sum
        }
    } else {
        g.concat(&seqs)
    };
    if let Some(pre) = &m.pre_capsule {
        hist = s.dnn(g, hist, "pre_capsule_dnn", pre);
    }
    if let Some(t) = time {
        // Positions weighted by the softmax of their time embedding over
        // the sequence.
        let scores = g.fold(t, p);
        let w = g.masked_softmax(scores, len);
        let w = g.unfold(w, p);
        hist = g.outer(w, hist);
    }

    // The capsule layer: positions mapped by `capsule/S`, routed (on
    // values cut from the gradient) into `max_k` capsules, squashed; the
    // capsules past the row's count zeroed.
    let k = c.max_k;
    let sw = s.params.add(
        "capsule/S",
        g.width(hist),
        c.high_dim,
        Init::GlorotUniform,
        false,
        s.rng,
    );
    let high = g.linear(hist, s.params, sw, None, Activation::Linear);
    let count = crate::model::graph::capsule::Count {
        max_k: k,
        positions: p,
        constant: c.constant_count,
    };
    let caps = g.capsules(len, count);
    let routing = Routing {
        max_k: k,
        iters: c.iters,
        scale: c.logits_scale,
        stddev: c.logits_stddev,
        init: crate::model::graph::capsule::eval_logits(p, k, c.logits_stddev),
    };
    let weights = g.capsule_routing((high, len, caps), routing);
    let seq = g.fold(high, p);
    let pooled: Vec<NodeId> = (0..k)
        .map(|j| {
            let wj = g.slice(weights, j * p, p);
            g.attn_pool(wj, seq)
        })
        .collect();
    let pooled = g.concat(&pooled);
    let rows = g.unfold(pooled, k);
    let squashed = g.squash(rows, c.squash_pow, c.scale_ratio);
    let live = g.prefix_mask(caps, k);
    let live = g.unfold(live, k);
    let capsules = g.outer(live, squashed);

    // Interests: each capsule beside the user's features.
    let ui = find("user")?;
    let u = s.batch_norm(g, xs[ui], "user_fea_bn", Activation::Linear);
    let u = s.dnn(g, u, "user_dnn", &m.user);
    let u = g.tile(u, k);
    let both = g.concat(&[capsules, u]);
    let mut interests = s.dnn_linear_last(g, both, "concat_dnn", &m.concat);
    let ii = find("item")?;
    let mut item = s.dnn_linear_last(g, xs[ii], "item_dnn", &m.item);
    if m.sim.cosine {
        interests = g.l2_normalize(interests);
        item = g.l2_normalize(item);
    }

    // Label-aware attention: the interests weighted by the softmax of
    // their similarity to the row's item times simi_pow, over the live ones.
    let user = g.attention((item, interests, interests), (1, m.simi_pow), Keys::Live(caps));
    let shown = g.outer(live, interests);
    let shown = g.fold(shown, k);
    // EasyRec's similarity of a user's interests, and of its capsules (the
    // mean cosine of two of them, over the users with several): reported
    // in evaluation, and with max_interests_simi below 1 the interests'
    // excess over it is the loss reg_interest_simi.
    let similarity = |g: &mut Graph, x: NodeId| {
        let n = g.l2_normalize(x);
        let n = g.outer(live, n);
        let n = g.fold(n, k);
        g.interest_similarity(n, caps, k)
    };
    let interest_simi = similarity(g, interests);
    let capsule_simi = similarity(g, capsules);
    g.summary("interest_similarity", interest_simi);
    g.summary("capsule_similarity", capsule_simi);
    if let Some(max) = m.max_interests_simi {
        g.penalty("reg_interest_simi", interest_simi, Reduce::ReluOfShare { max }, 1.0);
    }
    g.output("user_interests", shown);
    g.output("user_emb_num", caps);
    Ok(super::common::similarity(g, s, (user, item), m.sim))
}
