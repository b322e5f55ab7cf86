//! Task heads: what a model's outputs are trained and scored against,
//! written once for every executor. An executor runs the graph forward
//! into a tape; the heads read the task outputs off it and give the
//! batch's loss (each task's loss and distillation terms, the graph's
//! penalties, a match model's in-batch softmax) with the gradient seeds of
//! those outputs; the executor runs backward from the seeds.

pub mod in_batch;
pub mod losses;
#[cfg(test)]
pub mod oracle;

use super::exec::cpu::kernels;
use super::exec::Tape;
use super::graph::{self, Graph, NodeId};
use crate::config::model::tasks::{LossKind, Task};
use crate::features::Batch;

/// A loss and the gradient seeds of the graph nodes it reads.
pub type Seeds = Vec<(NodeId, Vec<f32>)>;

/// The graph output of each task.
pub fn task_outputs(graph: &Graph, tasks: &[Task]) -> Vec<NodeId> {
    tasks
        .iter()
        .map(|t| {
            let n = graph
                .output_node(&t.output())
                .unwrap_or_else(|| panic!("the model graph has output `{}`", t.output()));
            assert_eq!(
                graph.width(n),
                t.logit_width(),
                "task output `{}` has a column per logit",
                t.output()
            );
            n
        })
        .collect()
}

/// A match model's `user_scaled`, `item_tower_emb` and `user_tower_emb`
/// outputs, what its in-batch softmax reads.
pub fn tower_outputs(graph: &Graph) -> [NodeId; 3] {
    ["user_scaled", "item_tower_emb", "user_tower_emb"].map(|n| {
        graph
            .output_node(n)
            .unwrap_or_else(|| panic!("a match model's graph has output `{n}`"))
    })
}

/// The tower outputs' nodes and their values on `tape`, whose first
/// `users` rows are examples, for the in-batch loss `loss`.
fn towers<'t>(
    graph: &Graph,
    tape: &'t dyn Tape,
    users: usize,
    (targets, loss): (Targets<'t>, LossKind),
) -> ([NodeId; 3], in_batch::Towers<'t>) {
    let [us, v, u] = tower_outputs(graph);
    let towers = in_batch::Towers {
        us: tape.value(us),
        v: tape.value(v),
        u: tape.value(u),
        d: graph.width(v),
        users,
        weights: targets.weights,
        hard: targets.hard_negatives,
        ignore_in_batch: loss.ignores_in_batch(),
        items: targets.items,
    };
    ([us, v, u], towers)
}

/// The nodes `train` reads off a tape for `tasks`: the trained tasks'
/// outputs (a match model's towers for an in-batch task), those their
/// calibrations read, and the graph's penalties. An executor whose reads
/// are round trips reads them in one (`Tape::prefetch`).
pub fn train_reads(graph: &Graph, tasks: &[Task]) -> Vec<NodeId> {
    let outs = task_outputs(graph, tasks);
    let mut nodes = Vec::new();
    for (t, &out) in tasks.iter().zip(&outs) {
        match (t.trained(), t.in_batch()) {
            (true, true) => nodes.extend(tower_outputs(graph)),
            (true, false) => nodes.push(out),
            (false, _) => {}
        }
        if !t.calibrate.is_empty() {
            nodes.push(out);
            nodes.extend(t.calibrate.iter().map(|&(r, _)| outs[r]));
        }
    }
    nodes.extend(graph.penalties.iter().map(|p| p.node));
    nodes.sort_by_key(|n| n.0);
    nodes.dedup();
    nodes
}

/// Training: the batch's loss over the trained tasks (weighted and
/// summed, distillation terms added as they are) and the graph's
/// penalties, with the gradient seed of every output node it reads. The
/// tape's first `users` rows are examples, the rest sampled items.
pub fn train(graph: &Graph, tape: &dyn Tape, tasks: &[Task], targets: Targets, users: usize) -> (f32, Seeds) {
    let Targets { labels, weights, .. } = targets;
    let mut loss = 0.0f32;
    let mut seeds = Vec::new();
    let outs = task_outputs(graph, tasks);
    for (t, &out) in tasks.iter().zip(&outs) {
        if !t.trained() {
            continue;
        }
        if t.in_batch() {
            let ([us, v, u], towers) = towers(graph, tape, users, (targets, t.loss));
            let (l, gr) = in_batch::in_batch_softmax(&towers, in_batch::in_batch_logits(&towers));
            let w = t.weight;
            loss += w * l;
            for (n, mut g) in [(us, gr.us), (v, gr.v), (u, gr.u)] {
                if w != 1.0 {
                    g.iter_mut().for_each(|x| *x *= w);
                }
                seeds.push((n, g));
            }
            continue;
        }
        let (l, mut dl) = match weights {
            Some(w) => losses::weighted_loss_grad(t.loss, tape.value(out), &labels[t.label], w),
            None => losses::task_loss_grad(t, tape.value(out), &labels[t.label], targets.sessions),
        };
        loss += t.weight * l;
        if t.weight != 1.0 {
            dl.iter_mut().for_each(|g| *g *= t.weight);
        }
        for kd in &t.kd {
            let (l, g) = losses::kd_loss_grad(kd, tape.value(out), &labels[kd.label]);
            loss += l;
            dl.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
        seeds.push((out, dl));
    }
    for (t, &out) in tasks.iter().zip(&outs) {
        for &(r, w) in &t.calibrate {
            let (zt, zr) = (tape.value(out), tape.value(outs[r]));
            let (l, mut gt, mut gr) = losses::order_calibrate(&zt[..users], &zr[..users], w);
            loss += l;
            gt.resize(zt.len(), 0.0);
            gr.resize(zr.len(), 0.0);
            seeds.push((out, gt));
            seeds.push((outs[r], gr));
        }
    }
    for (l, node, seed) in penalties_on(graph, tape, users, weights) {
        loss += l;
        seeds.push((node, seed));
    }
    (loss, seeds)
}

/// Each graph penalty on `tape`, read on its first `users` rows (the
/// examples, not sampled items): its weighted loss, its node and that
/// node's gradient seed (zeros on the other rows).
fn penalties_on(graph: &Graph, tape: &dyn Tape, users: usize, weights: Option<&[f32]>) -> Vec<(f32, NodeId, Vec<f32>)> {
    graph
        .penalties
        .iter()
        .map(|p| {
            let v = tape.value(p.node);
            let (l, g) = p.reduce.apply(&v[..users * graph.width(p.node)], weights);
            let mut seed: Vec<f32> = g.into_iter().map(|x| x * p.weight).collect();
            seed.resize(v.len(), 0.0);
            (p.weight * l, p.node, seed)
        })
        .collect()
}

/// Evaluation of a labelled batch whose first `users` rows on `tape` are
/// its examples: each task's scores, batch loss and, for in-batch tasks,
/// each user's ranks of its own item (`in_batch::in_batch_ranks`).
///
/// Beside them, each graph penalty's loss on the batch, weighted as
/// trained (EasyRec's eval loss sums them in), then each graph summary's
/// value on the batch. No tape (a batch without examples): empty scores
/// and zero losses.
pub fn evaluate(
    graph: &Graph,
    tape: Option<&dyn Tape>,
    tasks: &[Task],
    targets: Targets,
    users: usize,
) -> (Vec<BatchEval>, Vec<f64>) {
    let Targets { labels, weights, .. } = targets;
    let Some(tape) = tape else {
        let evals = tasks
            .iter()
            .map(|t| BatchEval {
                scores: TaskScores::from_logits(t, Vec::new()),
                loss: 0.0,
                ranks: Vec::new(),
                interests: Interests::default(),
            })
            .collect();
        return (evals, vec![0.0; graph.penalties.len() + graph.summaries.len()]);
    };
    let summaries = graph
        .summaries
        .iter()
        .map(|m| graph::share(&tape.value(m.node)[..users * 2]) as f64);
    let penalties = penalties_on(graph, tape, users, weights)
        .into_iter()
        .map(|(l, _, _)| l as f64)
        .chain(summaries)
        .collect();
    let evals = tasks
        .iter()
        .zip(task_outputs(graph, tasks))
        .map(|(t, n)| {
            let scores = TaskScores::from_logits(t, tape.value(n)[..users * t.logit_width()].to_vec());
            if !t.in_batch() {
                let loss = match weights {
                    Some(w) => losses::weighted_loss_grad(t.loss, &scores.logits, &labels[t.label], w).0 as f64,
                    None => losses::loss_value(t, &scores.logits, &labels[t.label], targets.sessions),
                } + t
                    .kd
                    .iter()
                    .map(|kd| losses::kd_loss_grad(kd, &scores.logits, &labels[kd.label]).0 as f64)
                    .sum::<f64>();
                return BatchEval {
                    scores,
                    loss,
                    ranks: Vec::new(),
                    interests: Interests::default(),
                };
            }
            let (_, towers) = towers(graph, tape, users, (targets, t.loss));
            let logits = in_batch::in_batch_logits(&towers);
            let interests = match graph.output_node("user_interests") {
                Some(ui) => {
                    let k = graph.width(ui) / towers.d.max(1);
                    let sims = in_batch::interest_sims(tape.value(ui), k, &towers);
                    in_batch::interest_eval(&sims, &scores.logits, &towers)
                }
                None => Interests::default(),
            };
            BatchEval {
                scores,
                ranks: in_batch::in_batch_ranks(&logits, users),
                loss: in_batch::in_batch_softmax(&towers, logits).0 as f64,
                interests,
            }
        })
        .collect();
    (evals, penalties)
}

/// Each task's logits and scores off `tape`, every row.
pub fn scores(graph: &Graph, tape: &dyn Tape, tasks: &[Task]) -> Vec<TaskScores> {
    tasks
        .iter()
        .zip(task_outputs(graph, tasks))
        .map(|(t, n)| TaskScores::from_logits(t, tape.value(n).to_vec()))
        .collect()
}

/// What a batch's losses compare the model's outputs with: its examples'
/// label fields and sample weights (`data_config.sample_weight`), and
/// which sampled rows are whose hard negatives.
#[derive(Debug, Clone, Copy)]
pub struct Targets<'a> {
    /// The examples (a batch's rows before any sampled items).
    pub rows: usize,
    /// Per label field, its values row by row (`Batch::labels`).
    pub labels: &'a [Vec<f32>],
    pub weights: Option<&'a [f32]>,
    pub hard_negatives: &'a [(usize, usize)],
    /// Each example's session (its grouping field, hashed) where a JRC
    /// loss reads it; empty otherwise.
    pub sessions: &'a [u64],
    /// Each example's item (hashed) where the in-batch softmax leaves out
    /// the batch's other examples of a user's item; empty otherwise.
    pub items: &'a [u64],
}

impl<'a> Targets<'a> {
    pub fn of(batch: &'a Batch) -> Self {
        Targets {
            rows: batch.examples(),
            labels: &batch.labels,
            weights: batch.weights.as_deref(),
            hard_negatives: &batch.hard_negatives,
            sessions: batch.uids.as_deref().unwrap_or_default(),
            items: batch.item_keys.as_deref().unwrap_or_default(),
        }
    }
}

/// One task's evaluation of a labelled batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEval {
    pub scores: TaskScores,
    /// The batch's mean loss.
    pub loss: f64,
    /// In-batch tasks: each user's ranks of its own item among all items,
    /// the batch's and its own with the sampled ones (`in_batch::in_batch_ranks`).
    pub ranks: Vec<[u32; 3]>,
    /// MIND's: the same ranks by each item's best similarity to one of the
    /// user's interests (`in_batch::interest_sims`), and per user whether
    /// its own logit beats its hard negatives' best interest similarities
    /// (batches with hard negatives); empty otherwise.
    pub interests: Interests,
}

/// A MIND in-batch task's per-user evaluation by its interests
/// (`BatchEval::interests`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interests {
    pub ranks: Vec<[u32; 3]>,
    pub hard_hits: Vec<bool>,
}

/// One task's predictions for a batch, row-major: per row `logit_width`
/// logits (a multi-class task's classes, ZILN's three, else one) and
/// `score_width` scores (a multi-class task's classes, else one).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskScores {
    pub logits: Vec<f32>,
    /// Probabilities (classification: per class for a multi-class task) or
    /// values (regression).
    pub scores: Vec<f32>,
    /// A ZILN task's expected value `y` per row.
    pub values: Option<Vec<f32>>,
    pub logit_width: usize,
    pub score_width: usize,
}

impl TaskScores {
    pub fn from_logits(task: &Task, logits: Vec<f32>) -> Self {
        let mut values = None;
        let scores = match task.loss {
            // A match model's listwise scores are exported as EasyRec does:
            // the sigmoid of the row's own similarity.
            LossKind::BinaryClassification | LossKind::InBatchSoftmax { .. } => {
                logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect()
            }
            LossKind::Regression => logits.clone(),
            LossKind::MultiClass { classes } => {
                let mut p = logits.clone();
                p.chunks_exact_mut(classes).for_each(kernels::softmax_in_place);
                p
            }
            // EasyRec's JRC probability: the second class's.
            LossKind::Jrc => logits
                .chunks_exact(2)
                .map(|z| {
                    let mut p = [z[0], z[1]];
                    kernels::softmax_in_place(&mut p);
                    p[1]
                })
                .collect(),
            LossKind::Ziln(z) => {
                let (probs, ys) = logits.chunks_exact(3).map(|l| losses::ziln_prediction(l, z)).unzip();
                values = Some(ys);
                probs
            }
        };
        TaskScores {
            logits,
            scores,
            values,
            logit_width: task.logit_width(),
            score_width: task.classes(),
        }
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.logits.truncate(rows * self.logit_width);
        self.scores.truncate(rows * self.score_width);
        if let Some(v) = &mut self.values {
            v.truncate(rows);
        }
    }

    /// Rows `start..end` alone.
    /// Appends the rows of `next` (the same task's scores of later rows).
    pub fn append(&mut self, next: TaskScores) {
        self.logits.extend(next.logits);
        self.scores.extend(next.scores);
        if let (Some(v), Some(n)) = (self.values.as_mut(), next.values) {
            v.extend(n);
        }
    }

    pub fn rows_in(&self, start: usize, end: usize) -> TaskScores {
        let (l, s) = (self.logit_width, self.score_width);
        TaskScores {
            logits: self.logits[start * l..end * l].to_vec(),
            scores: self.scores[start * s..end * s].to_vec(),
            values: self.values.as_ref().map(|v| v[start..end].to_vec()),
            logit_width: l,
            score_width: s,
        }
    }
}

/// The columns predict and serve give for `task`: its logits and scores
/// (`logits`, `probs` or `y`, with the task's suffix), per logit
/// `logits_<k>` where a row has several, per class `probs_<k>` (EasyRec's
/// `probs_1` is the second class's) and the most probable class `y` for
/// a multi-class task, and ZILN's expected value `y`.
pub fn score_columns(task: &Task) -> Vec<String> {
    let per = |base: String, n: usize| -> Vec<String> {
        match n {
            1 => vec![base],
            n => (0..n).map(|k| format!("{base}_{k}")).collect(),
        }
    };
    let mut out = per(task.output(), task.logit_width());
    out.extend(per(task.score_name(), task.classes()));
    if task.classes() > 1 || matches!(task.loss, LossKind::Ziln(_)) {
        out.push(format!("y{}", task.suffix()));
    }
    out
}

impl TaskScores {
    /// The values of `score_columns`, one per row each.
    pub fn columns(&self) -> Vec<Vec<f32>> {
        let column = |v: &[f32], w: usize, k: usize| v.iter().skip(k).step_by(w).copied().collect::<Vec<f32>>();
        let (l, s) = (self.logit_width, self.score_width);
        let mut out: Vec<Vec<f32>> = (0..l).map(|k| column(&self.logits, l, k)).collect();
        out.extend((0..s).map(|k| column(&self.scores, s, k)));
        if s > 1 {
            let best = self.scores.chunks_exact(s).map(|p| kernels::argmax(p) as f32).collect();
            out.push(best);
        }
        if let Some(v) = &self.values {
            out.push(v.clone());
        }
        out
    }
}
