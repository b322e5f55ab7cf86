//! The two-tower retrieval architectures: DSSM and DropoutNet.

use anyhow::bail;

use super::backbone;
use super::common::*;
use crate::config::model::{DnnSpec, DropoutTower, SenetParams, Similarity};
use crate::model::graph::{Graph, NodeId, Reduce, Scope};

impl Builder<'_> {
    /// DSSM: per tower (`user_dnn`, `item_dnn`) EasyRec's DNN over all but
    /// the last of its hidden units, then a linear layer of the last as
    /// `<tower>_dnn/dnn_<n-1>`; L2-normalised for the cosine. Besides
    /// `logits` (the row's own similarity, scaled by `|sim_w| / T` and
    /// shifted by `sim_b`) the graph has the outputs `user_tower_emb`,
    /// `item_tower_emb` and `user_scaled` (the user embedding times the
    /// similarity's scale: the in-batch loss's user side).
    pub(super) fn dssm(
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
                let style = backbone::SeNetStyle::Classic;
                x = backbone::senet(&fields, &format!("{name}_senet"), params, style, g, s)?;
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
    pub(super) fn dropoutnet(
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
}
