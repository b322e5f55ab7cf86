//! The multi-task architectures: MMoE, ESMM, PLE, DBMTL and
//! RocketLaunching.

use anyhow::{bail, Context};

use super::common::*;
use super::multimodal;
use crate::config::model::multimodal::Tower;
use crate::config::model::{Activation, DnnSpec, PleLevel, TaskTower};
use crate::model::graph::{Graph, NodeId, Reduce, Scope};

impl Builder<'_> {
    /// EasyRec's RocketLaunching (`Arch::RocketLaunching`): outputs
    /// `logits_booster` and `logits_light`, `classes` wide each, and its
    /// penalties: `hint_loss`, the light logits' mean squared difference
    /// from the booster's, and with `feature_based` per light hidden layer
    /// `similarity_<k>`, -0.1 times its Euclidean distance over the batch
    /// to the first booster layer as wide (EasyRec's sign and distance,
    /// whatever feature_distillation_function says), the booster's side
    /// cut from the gradient throughout.
    pub(super) fn rocket_launching(
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

    /// EasyRec's MMoE layer over `x`: the experts, then per task a softmax
    /// gate (`mmoe/gate_<t>/dnn`) mixing their outputs. EasyRec's MMoE and
    /// DBMTL build the layer without `is_training`, so its experts run as
    /// in inference in training too: batch norms on moving averages that
    /// stay at their initial values, no dropout.
    pub(super) fn mixture(
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
            .map(|(e, spec)| s.dnn_inference(g, x, &format!("mmoe/expert_{e}"), spec))
            .collect();
        (0..tasks)
            .map(|t| gate(g, s, x, &outs, &format!("mmoe/gate_{t}/dnn")))
            .collect()
    }

    /// The group `all` that multi-task models read.
    pub(super) fn all_group(&self, model: &str) -> anyhow::Result<NodeId> {
        Ok(self.xs[self.group("all", model)?])
    }

    pub(super) fn mmoe(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        experts: &[DnnSpec],
        towers: &[TaskTower],
    ) -> anyhow::Result<()> {
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
    pub(super) fn esmm(
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
    pub(super) fn ple(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        levels: &[PleLevel],
        towers: &[TaskTower],
    ) -> anyhow::Result<()> {
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

    pub(super) fn dbmtl(
        &self,
        g: &mut Graph,
        s: &mut Scope,
        (multimodal, bottom): (Option<&Tower>, Option<&DnnSpec>),
        experts: &[DnnSpec],
        towers: &[TaskTower],
    ) -> anyhow::Result<()> {
        let mut x = match multimodal {
            Some(t) => multimodal::tower(t, (self.groups, &self.xs), g, s)?,
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
