//! Evaluation metrics as pure functions over (prediction, label) pairs, and
//! an accumulator that can be merged across batches (and ranks).

use std::collections::BTreeMap;

use crate::config::eval_plan::Metric;
use crate::config::model::tasks::Task;

/// EasyRec's `max_f1`: the largest F1 of "logit > t" over its thresholds
/// t = -1e-7, 1/199, ..., 198/199, 1 + 1e-7 (EasyRec compares the logits,
/// not the probabilities, with them). Scores here are probabilities, and
/// `logit > t` is `p > sigmoid(t)`. Precision or recall without a
/// denominator count 0, as TensorFlow's do; `None` without rows.
pub fn max_f1(probs: &[f32], labels: &[f32]) -> Option<f64> {
    if probs.is_empty() {
        return None;
    }
    let mut pos: Vec<f64> = Vec::new();
    let mut neg: Vec<f64> = Vec::new();
    for (&p, &y) in probs.iter().zip(labels) {
        if y != 0.0 {
            pos.push(p as f64);
        } else {
            neg.push(p as f64);
        }
    }
    pos.sort_by(f64::total_cmp);
    neg.sort_by(f64::total_cmp);
    let above = |sorted: &[f64], cut: f64| (sorted.len() - sorted.partition_point(|&p| p <= cut)) as f64;
    let thresholds = std::iter::once(-1e-7)
        .chain((1..=198).map(|i| i as f64 / 199.0))
        .chain(std::iter::once(1.0 + 1e-7));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    thresholds
        .map(|t| {
            let cut = 1.0 / (1.0 + (-t).exp());
            let tp = above(&pos, cut);
            let fp = above(&neg, cut);
            let precision = ratio(tp, tp + fp);
            let recall = ratio(tp, pos.len() as f64);
            2.0 * precision * recall / (precision + recall + 1e-12)
        })
        .reduce(f64::max)
}

/// Exact ROC AUC; tied scores count one half. `None` without both classes.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_unstable_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut pos, mut neg) = (0f64, 0f64);
    let mut rank_sum = 0f64; // sum of (1-based, tie-averaged) ranks of positives
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            if labels[k] > 0.5 {
                pos += 1.0;
                rank_sum += avg_rank;
            } else {
                neg += 1.0;
            }
        }
        i = j + 1;
    }
    (pos > 0.0 && neg > 0.0).then(|| (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

/// Mean of per-user AUCs over users that have both classes, summed in
/// user order so that the same rows always give the same bits.
pub fn gauc(scores: &[f32], labels: &[f32], uids: &[u64]) -> Option<f64> {
    let mut by_user: BTreeMap<u64, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
    for ((s, l), u) in scores.iter().zip(labels).zip(uids) {
        let e = by_user.entry(*u).or_default();
        e.0.push(*s);
        e.1.push(*l);
    }
    let aucs: Vec<f64> = by_user.values().filter_map(|(s, l)| auc(s, l)).collect();
    (!aucs.is_empty()).then(|| aucs.iter().sum::<f64>() / aucs.len() as f64)
}

/// Mean binary cross-entropy of probabilities (clipped like TensorFlow's log_loss).
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    let eps = 1e-7f64;
    let s: f64 = probs
        .iter()
        .zip(labels)
        .map(|(p, y)| {
            let p = (*p as f64).clamp(eps, 1.0 - eps);
            let y = *y as f64;
            -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
        })
        .sum();
    s / probs.len().max(1) as f64
}

/// Predictions and labels of an evaluation, kept whole for exact AUC.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalState {
    /// Probabilities (classification) or predicted values (regression).
    pub preds: Vec<f32>,
    pub labels: Vec<f32>,
    pub uids: Vec<u64>,
    /// In-batch tasks: each user's ranks of its own item among all items
    /// (the batch's and the sampled ones), among the batch's, and among its
    /// own and the sampled ones.
    pub ranks: Vec<[u32; 3]>,
    /// MIND's in-batch task: the users' ranks by interest and their hard
    /// negatives' verdicts (`model::Interests`).
    pub interests: crate::model::Interests,
    pub loss_sum: f64,
    /// Each evaluation batch's mean loss: EasyRec's `loss` is their
    /// unweighted mean (TensorFlow's streaming mean over batches), so a
    /// short last batch counts as much as a full one.
    pub batch_losses: Vec<f64>,
}

impl EvalState {
    pub fn merge(&mut self, other: EvalState) {
        self.preds.extend(other.preds);
        self.labels.extend(other.labels);
        self.uids.extend(other.uids);
        self.ranks.extend(other.ranks);
        self.interests.ranks.extend(other.interests.ranks);
        self.interests.hard_hits.extend(other.interests.hard_hits);
        self.loss_sum += other.loss_sum;
        self.batch_losses.extend(other.batch_losses);
    }

    /// EasyRec's eval `loss`: the mean of the batches' mean losses (the
    /// per-row mean when no batches were recorded).
    pub fn loss(&self) -> f64 {
        if self.batch_losses.is_empty() {
            self.loss_sum / self.labels.len().max(1) as f64
        } else {
            self.batch_losses.iter().sum::<f64>() / self.batch_losses.len() as f64
        }
    }

    /// `loss` plus each of the task's metrics, in order; classification
    /// adds logloss.
    pub fn report(&self, task: &Task) -> Vec<(String, f64)> {
        if task.classes() > 1 {
            return self.report_classes(&task.metrics, task.classes());
        }
        let (metrics, classification) = (&task.metrics, task.classification());
        let n = self.preds.len().max(1) as f64;
        let mut out = vec![("loss".to_string(), self.loss())];
        if classification {
            out.push(("logloss".into(), logloss(&self.preds, &self.labels)));
        }
        let hard = &self.interests.hard_hits;
        if !hard.is_empty() {
            // MIND's hard_neg_acc: the users whose own item beats their hard negatives.
            let acc = hard.iter().filter(|h| **h).count() as f64 / hard.len() as f64;
            out.push(("hard_neg_acc".into(), acc));
        }
        for m in metrics {
            let v = match m {
                Metric::RecallAtTopK { k } => {
                    // Without sampled negatives the in-batch recall is the
                    // recall, and the own item always leads the (empty)
                    // sampled list; EasyRec reports all three.
                    let recall = |ranks: &[[u32; 3]], i: usize| {
                        let hits = ranks.iter().filter(|r| (r[i] as usize) < *k).count();
                        (!ranks.is_empty()).then(|| hits as f64 / ranks.len() as f64)
                    };
                    for (i, name) in ["recall", "recall_in_batch", "recall_neg_sam"].into_iter().enumerate() {
                        out.push((format!("{name}@{k}"), recall(&self.ranks, i).unwrap_or(f64::NAN)));
                    }
                    // MIND's, by each item's best similarity to an interest.
                    let by_interest = &self.interests.ranks;
                    if !by_interest.is_empty() {
                        for (i, name) in [(0, "interests_recall"), (2, "interests_neg_sam_recall")] {
                            out.push((format!("{name}@{k}"), recall(by_interest, i).unwrap_or(f64::NAN)));
                        }
                    }
                    continue;
                }
                Metric::Auc => auc(&self.preds, &self.labels),
                Metric::Gauc { .. } | Metric::SessionAuc { .. } => gauc(&self.preds, &self.labels, &self.uids),
                Metric::Accuracy => Some(
                    self.preds
                        .iter()
                        .zip(&self.labels)
                        .filter(|(p, y)| (**p > 0.5) == (**y > 0.5))
                        .count() as f64
                        / n,
                ),
                Metric::Mse | Metric::Rmse => {
                    let mse = self
                        .preds
                        .iter()
                        .zip(&self.labels)
                        .map(|(p, y)| ((p - y) as f64).powi(2))
                        .sum::<f64>()
                        / n;
                    Some(if *m == Metric::Rmse { mse.sqrt() } else { mse })
                }
                Metric::MaxF1 => max_f1(&self.preds, &self.labels),
                Metric::Mae => Some(
                    self.preds
                        .iter()
                        .zip(&self.labels)
                        .map(|(p, y)| ((p - y) as f64).abs())
                        .sum::<f64>()
                        / n,
                ),
            };
            out.push((m.name().to_string(), v.unwrap_or(f64::NAN)));
        }
        out
    }

    /// `report` of a multi-class task, whose `preds` hold each row's
    /// probability per class and `labels` class indices: EasyRec's
    /// `accuracy` (of the most probable class), `recall_at_topk` (the
    /// share of rows whose class is among the `k` most probable) and, with
    /// two classes, `auc` of the second class's probability.
    fn report_classes(&self, metrics: &[Metric], classes: usize) -> Vec<(String, f64)> {
        let rows = self.preds.chunks_exact(classes);
        let n = self.labels.len().max(1) as f64;
        // Each row's classes more probable than its label's.
        let above: Vec<usize> = rows
            .clone()
            .zip(&self.labels)
            .map(|(p, &y)| p.iter().filter(|&&q| q > p[y as usize]).count())
            .collect();
        let share = |hit: &dyn Fn(usize) -> bool| above.iter().filter(|&&a| hit(a)).count() as f64 / n;
        let mut out = vec![("loss".to_string(), self.loss())];
        for m in metrics {
            let v = match m {
                Metric::Accuracy => {
                    let best = rows.clone().map(crate::model::exec::cpu::kernels::argmax);
                    best.zip(&self.labels).filter(|(b, y)| *b == **y as usize).count() as f64 / n
                }
                Metric::RecallAtTopK { k } => share(&|a| a < *k),
                Metric::Auc => {
                    let second: Vec<f32> = rows.clone().map(|p| p[1]).collect();
                    auc(&second, &self.labels).unwrap_or(f64::NAN)
                }
                other => unreachable!("{} of a multi-class task is refused by its config", other.name()),
            };
            out.push((m.name().to_string(), v));
        }
        out
    }
}

/// The metrics of every task: a single task's as `report` gives them; for
/// several tasks the weighted total `loss`, then each task's entries with
/// its suffix (`loss_ctr`, `auc_ctr`, ...), as EasyRec names them.
/// `states` holds the tasks' states, then one per graph penalty (named by
/// `penalties`): each joins `loss`, as in EasyRec's sum of its losses, and
/// is reported by its name; then one per graph summary (named by
/// `summaries`), reported by its name, the mean of its batch values.
pub fn report_tasks(
    tasks: &[Task],
    states: &[EvalState],
    (penalties, summaries): (&[String], &[String]),
) -> Vec<(String, f64)> {
    let (states, extra) = states.split_at(tasks.len());
    let (extra, values) = extra.split_at(penalties.len().min(extra.len()));
    let named = |names: &[String], st: &[EvalState]| -> Vec<(String, f64)> {
        names.iter().zip(st).map(|(n, s)| (n.clone(), s.loss())).collect()
    };
    let extra = named(penalties, extra);
    let mut out = match (tasks, states) {
        ([t], [st]) => st.report(t),
        _ => report_several(tasks, states),
    };
    out[0].1 += extra.iter().map(|(_, v)| v).sum::<f64>();
    out.extend(extra);
    out.extend(named(summaries, values));
    out
}

fn report_several(tasks: &[Task], states: &[EvalState]) -> Vec<(String, f64)> {
    let total: f64 = tasks.iter().zip(states).map(|(t, s)| t.weight as f64 * s.loss()).sum();
    let mut out = vec![("loss".to_string(), total)];
    for (t, st) in tasks.iter().zip(states) {
        let suffix = t.metric_suffix();
        out.extend(
            st.report(t)
                .into_iter()
                // A task that is not trained reports its metrics only.
                .filter(|(k, _)| t.trained() || !matches!(k.as_str(), "loss" | "logloss"))
                .map(|(k, v)| (format!("{k}{suffix}"), v)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three rows of three classes: accuracy of the most probable class,
    /// recall at 2 of the label among the two most probable.
    #[test]
    fn a_multi_class_task_reports_accuracy_and_recall_at_k() {
        let task = Task {
            metrics: vec![Metric::Accuracy, Metric::RecallAtTopK { k: 2 }],
            ..Task::on_label("", 0, crate::config::model::tasks::LossKind::MultiClass { classes: 3 })
        };
        let st = EvalState {
            preds: vec![0.7, 0.2, 0.1, 0.1, 0.3, 0.6, 0.5, 0.4, 0.1],
            labels: vec![0.0, 1.0, 2.0],
            ..Default::default()
        };
        let r = st.report(&task);
        assert_eq!(r[1], ("accuracy".to_string(), 1.0 / 3.0));
        assert_eq!(r[2], ("recall_at_topk".to_string(), 2.0 / 3.0));
    }

    /// A graph penalty joins the eval `loss` and is reported by its name,
    /// for one task as for several.
    #[test]
    fn penalties_join_the_eval_loss() {
        let task = |name: &str| Task {
            weight: 2.0,
            ..Task::on_label(name, 0, crate::config::model::tasks::LossKind::BinaryClassification)
        };
        let state = |l: f64| EvalState {
            preds: vec![0.5],
            labels: vec![1.0],
            batch_losses: vec![l],
            ..Default::default()
        };
        let names = ["hint_loss".to_string()];
        let one = report_tasks(&[task("")], &[state(0.5), state(0.25)], (&names, &[]));
        assert_eq!(one[0], ("loss".to_string(), 0.75));
        assert_eq!(one.last(), Some(&("hint_loss".to_string(), 0.25)));
        let two = report_tasks(
            &[task("a"), task("b")],
            &[state(0.5), state(1.0), state(0.25)],
            (&names, &[]),
        );
        assert_eq!(two[0], ("loss".to_string(), 2.0 * 0.5 + 2.0 * 1.0 + 0.25));
        assert_eq!(two.last(), Some(&("hint_loss".to_string(), 0.25)));
        // A summary is reported after them and stays out of the loss.
        let simi = ["interest_similarity".to_string()];
        let three = report_tasks(&[task("")], &[state(0.5), state(0.25), state(0.8)], (&names, &simi));
        assert_eq!(three[0], ("loss".to_string(), 0.75));
        assert_eq!(three.last(), Some(&("interest_similarity".to_string(), 0.8)));
    }

    #[test]
    fn max_f1_thresholds_the_logits_as_easyrec_does() {
        let sig = |z: f32| 1.0 / (1.0 + (-z).exp());
        // Logits 2.0 and 0.5 positive, 0.7 and -1.0 negative. "logit > t"
        // for t in (0.5, 0.7): tp 1, fp 1 -> F1 0.5; t just below 0.5:
        // tp 2, fp 1 -> P 2/3, R 1 -> F1 0.8; t >= 1: tp 1, fp 0 -> F1 2/3.
        let probs: Vec<f32> = [2.0, 0.5, 0.7, -1.0].iter().map(|&z| sig(z)).collect();
        let labels = [1.0, 1.0, 0.0, 0.0];
        let f1 = max_f1(&probs, &labels).unwrap();
        assert!((f1 - 0.8).abs() < 1e-9, "{f1}");
        // Nothing above any threshold and no positives: 0, as TensorFlow.
        assert_eq!(max_f1(&[sig(-3.0)], &[0.0]), Some(0.0));
        assert_eq!(max_f1(&[], &[]), None);
    }

    fn brute_auc(s: &[f32], l: &[f32]) -> f64 {
        let (mut num, mut den) = (0.0, 0.0);
        for i in 0..s.len() {
            for j in 0..s.len() {
                if l[i] > 0.5 && l[j] < 0.5 {
                    den += 1.0;
                    num += if s[i] > s[j] {
                        1.0
                    } else if s[i] == s[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        num / den
    }

    #[test]
    fn auc_matches_pair_counting_with_ties() {
        let mut rng = crate::util::Rng::new(3);
        let s: Vec<f32> = (0..300).map(|_| (rng.below(20) as f32) / 20.0).collect();
        let l: Vec<f32> = s.iter().map(|x| (rng.uniform() < *x as f64) as u8 as f32).collect();
        assert!((auc(&s, &l).unwrap() - brute_auc(&s, &l)).abs() < 1e-12);
        assert_eq!(auc(&[0.1, 0.2], &[1.0, 1.0]), None);
    }

    #[test]
    fn gauc_averages_users_with_both_classes() {
        let s = [0.9, 0.1, 0.2, 0.8, 0.5];
        let l = [1.0, 0.0, 1.0, 0.0, 1.0];
        let u = [1, 1, 2, 2, 3];
        // user 1: AUC 1, user 2: AUC 0, user 3 skipped.
        assert_eq!(gauc(&s, &l, &u), Some(0.5));
    }
}
