//! The task losses of EasyRec's heads on the CPU, each its mean over the
//! batch and its gradient by logit: classification, regression,
//! multi-class, sample-weighted, EasyRec's `losses` lists (JRC, ZILN,
//! F1-reweighted, pairwise), and knowledge distillation.

use crate::config::model::tasks::{KdKind, KdTerm, LossKind, LossTermKind, Task, ZilnTerm};
use crate::model::exec::cpu::kernels::{sigmoid, softplus};

/// Mean loss of `logits` and its gradient with respect to each logit.
pub fn loss_grad(kind: LossKind, logits: &[f32], labels: &[f32]) -> (f32, Vec<f32>) {
    if let LossKind::MultiClass { classes } = kind {
        return softmax_ce(logits, labels, classes, None);
    }
    let b = logits.len() as f32;
    let mut total = 0.0f64;
    let grad = logits
        .iter()
        .zip(labels)
        .map(|(&x, &y)| match kind {
            LossKind::BinaryClassification => {
                total += (x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()) as f64;
                (1.0 / (1.0 + (-x).exp()) - y) / b
            }
            LossKind::Regression => {
                total += ((x - y) * (x - y)) as f64;
                2.0 * (x - y) / b
            }
            LossKind::InBatchSoftmax { .. } => unreachable!("the in-batch softmax reads the towers (in_batch_softmax)"),
            LossKind::MultiClass { .. } => unreachable!("answered by softmax_ce"),
            LossKind::Ziln(_) | LossKind::Jrc => unreachable!("a ZILN or JRC task trains its losses term"),
        })
        .collect();
    ((total / logits.len().max(1) as f64) as f32, grad)
}

/// TensorFlow's `sparse_softmax_cross_entropy` of `logits` (`[b, classes]`
/// row-major) against class indices, and its gradient: the mean over the
/// rows, or with `weights` the weighted sum over the count of non-zero
/// weights (no loss without one).
fn softmax_ce(logits: &[f32], labels: &[f32], classes: usize, weights: Option<&[f32]>) -> (f32, Vec<f32>) {
    let rows = labels.len();
    debug_assert_eq!(logits.len(), rows * classes);
    let count = weights.map_or(rows, |w| w.iter().filter(|x| **x != 0.0).count());
    let mut grad = vec![0.0f32; logits.len()];
    if count == 0 {
        return (0.0, grad);
    }
    let mut total = 0.0f64;
    for (r, (z, g)) in logits
        .chunks_exact(classes)
        .zip(grad.chunks_exact_mut(classes))
        .enumerate()
    {
        let w = weights.map_or(1.0, |w| w[r]);
        let y = labels[r] as usize;
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = z.iter().map(|&x| ((x - m) as f64).exp()).sum();
        let lse = m as f64 + sum.ln();
        total += w as f64 * (lse - z[y] as f64);
        for (k, (gk, &x)) in g.iter_mut().zip(z).enumerate() {
            let p = ((x as f64 - lse).exp()) as f32;
            *gk = w * (p - f32::from(u8::from(k == y))) / count as f32;
        }
    }
    ((total / count as f64) as f32, grad)
}

/// `loss_grad` with EasyRec's `sample_weight`: TensorFlow's losses divide
/// `Σ w_i l_i` by the count of non-zero weights (SUM_BY_NONZERO_WEIGHTS),
/// and a batch without one has no loss.
pub fn weighted_loss_grad(kind: LossKind, logits: &[f32], labels: &[f32], w: &[f32]) -> (f32, Vec<f32>) {
    if let LossKind::MultiClass { classes } = kind {
        return softmax_ce(logits, labels, classes, Some(w));
    }
    let nonzero = w.iter().filter(|x| **x != 0.0).count();
    if nonzero == 0 {
        return (0.0, vec![0.0; logits.len()]);
    }
    let n = nonzero as f32;
    let mut total = 0.0f64;
    let grad = logits
        .iter()
        .zip(labels)
        .zip(w)
        .map(|((&x, &y), &w)| match kind {
            LossKind::BinaryClassification => {
                total += w as f64 * (x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()) as f64;
                w * (1.0 / (1.0 + (-x).exp()) - y) / n
            }
            LossKind::Regression => {
                total += w as f64 * ((x - y) * (x - y)) as f64;
                w * 2.0 * (x - y) / n
            }
            LossKind::InBatchSoftmax { .. } => unreachable!("the in-batch softmax reads the towers (in_batch_softmax)"),
            LossKind::MultiClass { .. } => unreachable!("answered by softmax_ce"),
            LossKind::Ziln(_) | LossKind::Jrc => unreachable!("a ZILN or JRC task trains its losses term"),
        })
        .collect();
    ((total / nonzero as f64) as f32, grad)
}

/// A task's batch loss and its gradient with respect to each logit: its
/// `loss_type`'s mean loss, or with `model_config.losses` their weighted sum.
///
/// `sessions` holds each row's session (its `Task::session` field, hashed)
/// for a JRC term; it is empty otherwise.
pub fn task_loss_grad(task: &Task, logits: &[f32], labels: &[f32], sessions: &[u64]) -> (f32, Vec<f32>) {
    if task.summed {
        // The sum over the rows: the mean's loss and slopes times the rows.
        let unsummed = Task {
            summed: false,
            ..task.clone()
        };
        let (l, mut g) = task_loss_grad(&unsummed, logits, labels, sessions);
        let n = labels.len() as f32;
        g.iter_mut().for_each(|x| *x *= n);
        return (l * n, g);
    }
    if task.terms.is_empty() {
        return loss_grad(task.loss, logits, labels);
    }
    let mut total = 0.0f64;
    let mut grad = vec![0.0f32; logits.len()];
    for term in &task.terms {
        let (l, g) = match term.kind {
            LossTermKind::CrossEntropy => loss_grad(LossKind::BinaryClassification, logits, labels),
            LossTermKind::F1Reweighted {
                beta_square,
                label_smoothing,
            } => f1_reweighted(logits, labels, beta_square, label_smoothing),
            LossTermKind::PairWise { margin, temperature } => pairwise(logits, labels, margin, temperature),
            LossTermKind::Ziln(p) => ziln(logits, labels, p),
            LossTermKind::Jrc { alpha } => jrc(logits, labels, sessions, alpha),
        };
        total += term.weight as f64 * l as f64;
        grad.iter_mut().zip(&g).for_each(|(a, b)| *a += term.weight * b);
    }
    (total as f32, grad)
}

/// EasyRec's `jrc_loss` (fixed weighting, same-label loss) of logits
/// `[b, 2]` against 0/1 labels, rows grouped by `sessions`, and its
/// gradient: `alpha` x the softmax cross entropy plus `1 - alpha` x the
/// generative loss, per session S and class c, `-Σ_{i∈S} y_ic (z_ic -
/// logsumexp_{k∈S} z_kc)` (y_i1 the label, y_i0 its complement), summed
/// over sessions over the rows (EasyRec's mean over rows of their
/// session's loss over its size).
fn jrc(logits: &[f32], labels: &[f32], sessions: &[u64], alpha: f32) -> (f32, Vec<f32>) {
    let b = labels.len();
    assert_eq!(sessions.len(), b, "a JRC loss needs every row's session");
    let (ce, ce_grad) = softmax_ce(logits, labels, 2, None);
    let mut by_session: std::collections::HashMap<u64, Vec<usize>> = std::collections::HashMap::new();
    for (r, s) in sessions.iter().enumerate() {
        by_session.entry(*s).or_default().push(r);
    }
    let mut ge = 0.0f64;
    let mut grad: Vec<f32> = ce_grad.iter().map(|g| alpha * g).collect();
    let scale = (1.0 - alpha as f64) / b.max(1) as f64;
    for rows in by_session.values() {
        for c in 0..2 {
            let target = |r: usize| {
                if c == 1 {
                    labels[r] as f64
                } else {
                    1.0 - labels[r] as f64
                }
            };
            let z = |r: usize| logits[r * 2 + c] as f64;
            let m = rows.iter().map(|&r| z(r)).fold(f64::NEG_INFINITY, f64::max);
            let lse = m + rows.iter().map(|&r| (z(r) - m).exp()).sum::<f64>().ln();
            let total: f64 = rows.iter().map(|&r| target(r)).sum();
            for &r in rows {
                ge -= target(r) * (z(r) - lse);
                let p = (z(r) - lse).exp();
                grad[r * 2 + c] += (scale * (total * p - target(r))) as f32;
            }
        }
    }
    let loss = alpha as f64 * ce as f64 + (1.0 - alpha as f64) * ge / b.max(1) as f64;
    (loss as f32, grad)
}

/// The smallest sigma of a ZILN task: Keras' `sqrt(epsilon())`.
pub const ZILN_MIN_SIGMA: f64 = 3.162_277_66e-4;

/// ZILN's sigma and its slope with respect to the third logit:
/// `clip(softplus(z), ZILN_MIN_SIGMA, max_sigma)` (no slope where clipped).
pub fn ziln_sigma(z: f64, max_sigma: f64) -> (f64, f64) {
    let s = softplus(z);
    if s < ZILN_MIN_SIGMA {
        (ZILN_MIN_SIGMA, 0.0)
    } else if s > max_sigma {
        (max_sigma, 0.0)
    } else {
        (s, sigmoid(z))
    }
}

/// EasyRec's `zero_inflated_lognormal_pred` of one row's three logits:
/// the probability of a positive label and the expected value
/// `exp(log_sigmoid(z0) + mu + sigma² / 2)`, its logarithm clipped to
/// [-100, max_log_clip] (or the unclipped logarithm with `return_log`).
pub fn ziln_prediction(z: &[f32], p: crate::config::model::tasks::ZilnPrediction) -> (f32, f32) {
    let (z0, mu) = (z[0] as f64, z[1] as f64);
    let (sigma, _) = ziln_sigma(z[2] as f64, p.max_sigma as f64);
    let log_y = -softplus(-z0) + mu + 0.5 * sigma * sigma;
    let y = if p.return_log {
        log_y
    } else {
        log_y.clamp(-100.0, p.max_log_clip as f64).exp()
    };
    (sigmoid(z0) as f32, y as f32)
}

/// EasyRec's `zero_inflated_lognormal_loss` of logits `[b, 3]` against
/// the labels (`LossTermKind::Ziln`), and its gradient.
fn ziln(logits: &[f32], labels: &[f32], p: ZilnTerm) -> (f32, Vec<f32>) {
    let [mu_reg, sigma_reg, max_sigma, class_weight, reg_weight] =
        [p.mu_reg, p.sigma_reg, p.max_sigma, p.class_weight, p.reg_weight].map(f64::from);
    let b = labels.len().max(1) as f64;
    let positives = labels.iter().filter(|y| **y > 0.0).count() as f64 + 1e-8;
    let half_log_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let (mut cls, mut reg, mut mu2, mut z2sq) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut grad = vec![0.0f32; logits.len()];
    for (r, (z, g)) in logits.chunks_exact(3).zip(grad.chunks_exact_mut(3)).enumerate() {
        let (z0, mu, z2) = (z[0] as f64, z[1] as f64, z[2] as f64);
        let positive = labels[r] > 0.0;
        let p = f64::from(u8::from(positive));
        cls += softplus(z0) - z0 * p;
        g[0] = (class_weight * (sigmoid(z0) - p) / b) as f32;
        let (sigma, dsigma) = ziln_sigma(z2, max_sigma);
        let mut dmu = 2.0 * mu_reg * mu / b;
        let mut dz2 = 2.0 * sigma_reg * z2 / b;
        if positive {
            let x = (labels[r] as f64).ln();
            let d = x - mu;
            // -log p(label) of LogNormal(mu, sigma).
            reg += x + sigma.ln() + half_log_2pi + d * d / (2.0 * sigma * sigma);
            dmu += reg_weight * (-d / (sigma * sigma)) / positives;
            dz2 += reg_weight * (1.0 / sigma - d * d / (sigma * sigma * sigma)) * dsigma / positives;
        }
        g[1] = dmu as f32;
        g[2] = dz2 as f32;
        mu2 += mu * mu;
        z2sq += z2 * z2;
    }
    let loss = class_weight * cls / b + reg_weight * reg / positives + mu_reg * mu2 / b + sigma_reg * z2sq / b;
    (loss as f32, grad)
}

/// EasyRec's `f1_reweight_sigmoid_cross_entropy` (mean over the batch):
/// positives weigh 1, the rest `w = Σp / (β²·P − P + Σp + 1e-8)`, `P` the
/// positives and `p` the probabilities, so `w` moves with every logit.
/// `dL/dz_k = (w_k (p_k − y'_k) + S · (β²P − P + ε)/D² · p_k(1 − p_k)) / B`
/// with `S` the negatives' summed cross entropy and `D` w's denominator.
fn f1_reweighted(logits: &[f32], labels: &[f32], beta_square: f32, smoothing: f32) -> (f32, Vec<f32>) {
    let b = logits.len().max(1) as f64;
    let eps = 1e-8f64;
    let (beta2, ls) = (beta_square as f64, smoothing as f64);
    let p: Vec<f64> = logits.iter().map(|&z| sigmoid(z as f64)).collect();
    let pos = labels.iter().map(|&y| y as f64).sum::<f64>();
    let tp: f64 = p.iter().sum();
    let c = beta2 * pos - pos + eps;
    let d = c + tp;
    let neg_w = tp / d;
    let smooth = |y: f64| y * (1.0 - ls) + 0.5 * ls;
    let ce = |z: f64, y: f64| softplus(z) - smooth(y) * z;
    let mut total = 0.0f64;
    let mut s_neg = 0.0f64;
    for (&z, &y) in logits.iter().zip(labels) {
        let (z, y) = (z as f64, y as f64);
        let e = ce(z, y);
        if y == 1.0 {
            total += e;
        } else {
            total += neg_w * e;
            s_neg += e;
        }
    }
    let dw = c / (d * d);
    let grad = labels
        .iter()
        .zip(&p)
        .map(|(&y, &pk)| {
            let y = y as f64;
            let w = if y == 1.0 { 1.0 } else { neg_w };
            ((w * (pk - smooth(y)) + s_neg * dw * pk * (1.0 - pk)) / b) as f32
        })
        .collect();
    ((total / b) as f32, grad)
}

/// EasyRec's (deprecated) `pairwise_loss`: over every pair `i, j` with
/// `y_i > y_j`, `softplus(−x)` with `x = (z_i − z_j)/T − margin`, the mean
/// over pairs; 0 when the batch has none.
fn pairwise(logits: &[f32], labels: &[f32], margin: f32, temperature: f32) -> (f32, Vec<f32>) {
    let t = temperature as f64;
    let mut grad = vec![0.0f64; logits.len()];
    let (mut total, mut pairs) = (0.0f64, 0u64);
    for (i, (&zi, &yi)) in logits.iter().zip(labels).enumerate() {
        for (j, (&zj, &yj)) in logits.iter().zip(labels).enumerate() {
            if yi > yj {
                let x = (zi as f64 - zj as f64) / t - margin as f64;
                total += softplus(-x);
                let g = (sigmoid(x) - 1.0) / t;
                grad[i] += g;
                grad[j] -= g;
                pairs += 1;
            }
        }
    }
    if pairs == 0 {
        return (0.0, vec![0.0; logits.len()]);
    }
    let n = pairs as f64;
    ((total / n) as f32, grad.iter().map(|g| (g / n) as f32).collect())
}

/// TensorFlow's `log_loss` epsilon and Keras' `epsilon()`.
const KD_EPS: f64 = 1e-7;

/// The soft label of a distillation term as a probability (its logit
/// over the temperature through a sigmoid), or as it is for L2: a constant
/// of the loss, which the reference executor reads from here too.
pub fn kd_target(kd: &KdTerm, soft: f32) -> f64 {
    if kd.kind == KdKind::L2 {
        return soft as f64;
    }
    sigmoid(kd_label_logit(kd, soft) / kd.divisor() as f64)
}

/// A soft label as a logit (before the temperature), as `build_kd_loss`
/// makes it: as it is, else the log of a probability (a multi-class or
/// cross-entropy term's) or its log-odds (a binary one's).
pub fn kd_label_logit(kd: &KdTerm, soft: f32) -> f64 {
    let s = soft as f64;
    match (kd.kind, kd.label_is_logits) {
        (KdKind::L2, _) | (_, true) => s,
        (KdKind::CrossEntropy, false) => (s + KD_EPS).ln(),
        (KdKind::KlDivergence, false) if kd.classes > 1 => (s + KD_EPS).ln(),
        (KdKind::BinaryCrossEntropy | KdKind::KlDivergence, false) => {
            let p = s.clamp(KD_EPS, 1.0 - KD_EPS);
            (p / (1.0 - p)).ln()
        }
    }
}

/// A knowledge-distillation term's loss on `logits` against the soft
/// labels `soft` (EasyRec's `build_kd_loss`), times its weight, and its
/// gradient with respect to each logit. A multi-class task's logits and
/// soft labels are `[rows, classes]` row-major.
pub fn kd_loss_grad(kd: &KdTerm, logits: &[f32], soft: &[f32]) -> (f32, Vec<f32>) {
    match kd.kind {
        KdKind::KlDivergence => kd_kl_divergence(kd, logits, soft),
        KdKind::CrossEntropy if kd.classes > 1 => kd_softmax_log_loss(kd, logits, soft),
        _ => kd_elementwise(kd, logits, soft),
    }
}

/// The terms whose loss is a mean over every logit: the cross entropies
/// of one-logit tasks, the binary cross entropy and L2 of any.
fn kd_elementwise(kd: &KdTerm, logits: &[f32], soft: &[f32]) -> (f32, Vec<f32>) {
    let b = logits.len().max(1) as f64;
    let t = kd.divisor() as f64;
    let w = kd.weight as f64;
    let mut total = 0.0f64;
    let grad = logits
        .iter()
        .zip(soft)
        .map(|(&z, &s)| {
            let (z, y) = (z as f64, kd_target(kd, s));
            let (l, dz) = match kd.kind {
                KdKind::CrossEntropy => {
                    let p = sigmoid(z / t);
                    let (l, dp) = log_loss(y, p);
                    (l, dp * p * (1.0 - p) / t)
                }
                KdKind::BinaryCrossEntropy => (softplus(z / t) - y * z / t, (sigmoid(z / t) - y) / t),
                KdKind::L2 => ((z - y) * (z - y), 2.0 * (z - y)),
                KdKind::KlDivergence => unreachable!("answered by kd_kl_divergence"),
            };
            total += l;
            (w * dz / b) as f32
        })
        .collect();
    ((w * total / b) as f32, grad)
}

/// TensorFlow's `log_loss` of a probability `p` against `y` (epsilon
/// 1e-7), and its slope by `p`.
fn log_loss(y: f64, p: f64) -> (f64, f64) {
    let l = -(y * (p + KD_EPS).ln() + (1.0 - y) * (1.0 - p + KD_EPS).ln());
    (l, -(y / (p + KD_EPS) - (1.0 - y) / (1.0 - p + KD_EPS)))
}

/// `softmax(v / t)` of one row.
fn softmax_over(v: impl Iterator<Item = f64>, t: f64) -> Vec<f64> {
    let v: Vec<f64> = v.map(|x| x / t).collect();
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// The gradient by a row's logits of a loss whose slopes by that row's
/// `softmax(z / t)` are `g`: `p_j (g_j - Σ g_c p_c) / t`.
fn through_softmax(p: &[f64], g: &[f64], t: f64) -> Vec<f64> {
    let dot: f64 = p.iter().zip(g).map(|(p, g)| p * g).sum();
    p.iter().zip(g).map(|(p, g)| p * (g - dot) / t).collect()
}

/// A multi-class term over the softmaxes at the temperature, row by row:
/// `term(y, p)` is one class's loss and its slope by `p`; the total is
/// divided by `per` (and times the weight).
fn kd_softmax_rows(
    kd: &KdTerm,
    (logits, soft): (&[f32], &[f32]),
    per: f64,
    term: impl Fn(f64, f64) -> (f64, f64),
) -> (f32, Vec<f32>) {
    let (c, t, w) = (kd.classes, kd.divisor() as f64, kd.weight as f64);
    let mut total = 0.0f64;
    let mut grad = Vec::with_capacity(logits.len());
    for (z, s) in logits.chunks_exact(c).zip(soft.chunks_exact(c)) {
        let y = softmax_over(s.iter().map(|&s| kd_label_logit(kd, s)), t);
        let p = softmax_over(z.iter().map(|&z| z as f64), t);
        let g: Vec<f64> = y
            .iter()
            .zip(&p)
            .map(|(&y, &p)| {
                let (l, slope) = term(y, p);
                total += l;
                slope
            })
            .collect();
        grad.extend(through_softmax(&p, &g, t).into_iter().map(|d| (w * d / per) as f32));
    }
    ((w * total / per) as f32, grad)
}

/// A multi-class task's CROSS_ENTROPY_LOSS: `log_loss` elementwise of
/// `softmax(z / T)` against `softmax(soft / T)`, the mean over every
/// element.
fn kd_softmax_log_loss(kd: &KdTerm, logits: &[f32], soft: &[f32]) -> (f32, Vec<f32>) {
    kd_softmax_rows(kd, (logits, soft), logits.len().max(1) as f64, log_loss)
}

/// KL_DIVERGENCE_LOSS: per row, Keras' KLD `Σ y log(y / p)` (both clipped
/// to [1e-7, 1], the clip's slope 0 outside) of the teacher's
/// distribution against the student's, `[1 - σ, σ]` of one logit or the
/// softmax of several over the temperature; the mean over rows.
fn kd_kl_divergence(kd: &KdTerm, logits: &[f32], soft: &[f32]) -> (f32, Vec<f32>) {
    let (c, t, w) = (kd.classes, kd.divisor() as f64, kd.weight as f64);
    let rows = (logits.len() / c.max(1)).max(1) as f64;
    let clip = |x: f64| x.clamp(KD_EPS, 1.0);
    // A class's loss `y log(y / q)` and its slope by `q`.
    let term = |y: f64, q: f64| {
        let (y, qc) = (clip(y), clip(q));
        let slope = if (KD_EPS..=1.0).contains(&q) { -y / qc } else { 0.0 };
        (y * (y / qc).ln(), slope)
    };
    if c > 1 {
        return kd_softmax_rows(kd, (logits, soft), rows, term);
    }
    let mut total = 0.0f64;
    let mut grad = Vec::with_capacity(logits.len());
    for (&z, &s) in logits.iter().zip(soft) {
        let y = sigmoid(kd_label_logit(kd, s) / t);
        let p = sigmoid(z as f64 / t);
        let ((l1, g1), (l0, g0)) = (term(y, p), term(1.0 - y, 1.0 - p));
        total += l1 + l0;
        grad.push((w * (g1 - g0) * p * (1.0 - p) / t / rows) as f32);
    }
    ((w * total / rows) as f32, grad)
}

/// EasyRec's ORDER_CALIBRATE_LOSS of a task over a relation task, from
/// their logits (one per row): `weight * mean(relu(σ(z) - σ(r)))`, with
/// its gradients by `z` and by `r` (relu's slope 0 at 0, as TensorFlow's).
pub fn order_calibrate(z: &[f32], r: &[f32], weight: f32) -> (f32, Vec<f32>, Vec<f32>) {
    let b = z.len().max(1) as f64;
    let w = weight as f64;
    let mut total = 0.0f64;
    let (mut gz, mut gr) = (vec![0.0f32; z.len()], vec![0.0f32; r.len()]);
    for (k, (&a, &c)) in z.iter().zip(r).enumerate() {
        let (pa, pc) = (sigmoid(a as f64), sigmoid(c as f64));
        if pa > pc {
            total += pa - pc;
            gz[k] = (w / b * pa * (1.0 - pa)) as f32;
            gr[k] = (-w / b * pc * (1.0 - pc)) as f32;
        }
    }
    ((w * total / b) as f32, gz, gr)
}

/// A task's batch loss (evaluation).
pub fn loss_value(task: &Task, logits: &[f32], labels: &[f32], sessions: &[u64]) -> f64 {
    task_loss_grad(task, logits, labels, sessions).0 as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::cpu::kernels::product_logit;
    use crate::model::heads::in_batch::*;

    fn task(terms: Vec<LossTermKind>) -> Task {
        Task {
            terms: terms
                .into_iter()
                .map(|kind| crate::config::model::tasks::LossTerm { kind, weight: 1.5 })
                .collect(),
            ..Task::on_label("", 0, LossKind::BinaryClassification)
        }
    }

    /// Distillation: a hand-computed cross entropy, and central
    /// differences of every kind agree with its gradient.
    #[test]
    fn distillation_losses_and_their_gradients() {
        let kd = |kind, label_is_logits| KdTerm {
            label: 1,
            kind,
            weight: 0.5,
            temperature: 2.0,
            label_is_logits,
            classes: 1,
        };
        // One row: z = 1, soft logit 2, T = 2: p = sigmoid(0.5), y = sigmoid(1).
        let (l, _) = kd_loss_grad(&kd(KdKind::CrossEntropy, true), &[1.0], &[2.0]);
        let (p, y) = (sigmoid(0.5), sigmoid(1.0));
        let want = -0.5 * (y * (p + 1e-7).ln() + (1.0 - y) * (1.0 - p + 1e-7).ln());
        assert!((l as f64 - want).abs() < 1e-6, "{l} vs {want}");
        let logits = [0.3f32, -1.2, 2.0, 0.0];
        for (term, soft) in [
            (kd(KdKind::CrossEntropy, true), [1.5f32, -0.5, 0.2, 3.0]),
            (kd(KdKind::CrossEntropy, false), [0.9f32, 0.1, 0.5, 0.99]),
            (kd(KdKind::BinaryCrossEntropy, true), [1.5f32, -0.5, 0.2, 3.0]),
            (kd(KdKind::BinaryCrossEntropy, false), [0.9f32, 0.1, 0.5, 0.99]),
            (kd(KdKind::L2, true), [1.5f32, -0.5, 0.2, 3.0]),
            (kd(KdKind::KlDivergence, true), [1.5f32, -0.5, 0.2, 3.0]),
            (kd(KdKind::KlDivergence, false), [0.9f32, 0.1, 0.5, 0.99]),
        ] {
            let (_, g) = kd_loss_grad(&term, &logits, &soft);
            let what = format!("{term:?}");
            assert_slopes(&what, |z| kd_loss_grad(&term, z, &soft).0, &logits, &g, (&[], 1e-3));
        }
    }

    /// Distillation of a multi-class task (and KL of a one-logit one):
    /// EasyRec's formula by hand for the softmaxes' log loss, gradients by
    /// central differences, and values and gradients equal to burn's
    /// autodiff of the reference (`oracle::kd_loss_of`).
    #[test]
    fn multi_class_distillation_matches_easyrec_finite_differences_and_the_reference() {
        use crate::model::heads::oracle as reference;
        use burn::tensor::{Tensor, TensorData};
        let kd = |kind, label_is_logits, classes| KdTerm {
            label: 1,
            kind,
            weight: 0.7,
            temperature: 2.0,
            label_is_logits,
            classes,
        };
        let z = [0.3f32, -1.2, 2.0, 0.0, 1.5, -0.4];
        let probs = [0.2f32, 0.5, 0.3, 0.05, 0.05, 0.9];
        let logits_soft = [1.0f32, -2.0, 0.5, 0.3, 0.3, -1.0];
        // By hand: softmax(log(q + eps) / 2) against softmax(z / 2), TF's
        // log_loss over the 6 elements, times 0.7.
        let softmax = |v: &[f64]| {
            let e: Vec<f64> = v.iter().map(|x| (x / 2.0).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let mut want = 0.0;
        for r in 0..2 {
            let y = softmax(
                &probs[3 * r..3 * r + 3]
                    .iter()
                    .map(|q| (*q as f64 + 1e-7).ln())
                    .collect::<Vec<_>>(),
            );
            let p = softmax(&z[3 * r..3 * r + 3].iter().map(|x| *x as f64).collect::<Vec<_>>());
            for (y, p) in y.iter().zip(&p) {
                want -= y * (p + 1e-7).ln() + (1.0 - y) * (1.0 - p + 1e-7).ln();
            }
        }
        want *= 0.7 / 6.0;
        let (l, _) = kd_loss_grad(&kd(KdKind::CrossEntropy, false, 3), &z, &probs);
        assert!((l as f64 - want).abs() < 1e-6, "{l} vs {want}");
        let cases = [
            (kd(KdKind::CrossEntropy, false, 3), &probs[..], 3),
            (kd(KdKind::CrossEntropy, true, 3), &logits_soft[..], 3),
            (kd(KdKind::KlDivergence, false, 3), &probs[..], 3),
            (kd(KdKind::KlDivergence, true, 3), &logits_soft[..], 3),
            (kd(KdKind::BinaryCrossEntropy, false, 3), &probs[..], 3),
            (kd(KdKind::L2, true, 3), &logits_soft[..], 3),
            (kd(KdKind::KlDivergence, false, 1), &probs[..], 1),
            (kd(KdKind::KlDivergence, true, 1), &logits_soft[..], 1),
            (kd(KdKind::CrossEntropy, false, 1), &probs[..], 1),
        ];
        for (term, soft, c) in cases {
            let what = format!("{term:?}");
            let (l, g) = kd_loss_grad(&term, &z, soft);
            assert_slopes(&what, |z| kd_loss_grad(&term, z, soft).0, &z, &g, (&[], 1e-3));
            let device = burn::tensor::Device::flex().autodiff();
            let t = Tensor::<2>::from_data(TensorData::new(z.to_vec(), [6 / c, c]), &device).require_grad();
            let r = reference::kd_loss_of(&term, t.clone(), soft);
            let rl: f32 = r.clone().into_scalar();
            assert!((rl - l).abs() < 1e-5, "{what}: {rl} vs {l}");
            let rg = crate::model::graph::params::to_vec(t.grad(&r.backward()).unwrap());
            for (k, (a, b)) in g.iter().zip(&rg).enumerate() {
                assert!((a - b).abs() < 1e-5, "{what}, logit {k}: cpu {a} vs reference {b}");
            }
        }
    }

    /// Central differences of each term's loss agree with its gradient.
    #[test]
    fn listed_losses_have_their_finite_difference_gradients() {
        let logits = [0.3f32, -1.2, 2.0, 0.0, -0.4, 1.1];
        let labels = [1.0f32, 0.0, 1.0, 0.0, 0.0, 1.0];
        for kind in [
            LossTermKind::F1Reweighted {
                beta_square: 2.25,
                label_smoothing: 0.1,
            },
            LossTermKind::PairWise {
                margin: 0.3,
                temperature: 0.7,
            },
        ] {
            let t = task(vec![kind]);
            let (_, g) = task_loss_grad(&t, &logits, &labels, &[]);
            let what = format!("{kind:?}");
            assert_slopes(
                &what,
                |z| task_loss_grad(&t, z, &labels, &[]).0,
                &logits,
                &g,
                (&[], 2e-3),
            );
        }
    }

    /// Ranks count the higher in-batch logits of each row, ties with the
    /// lower columns (TensorFlow's top_k order); the loss is the softmax's
    /// diagonal cross entropy plus the negative positives' penalty.
    #[test]
    fn in_batch_ranks_and_loss_follow_the_logits() {
        // Users and items in 1-D: logits L_ij = us_i * v_j.
        let us = [1.0f32, -1.0, 2.0];
        let v = [0.5f32, 0.5, -1.0];
        let u = [1.0f32, -1.0, 2.0];
        let t = Towers {
            us: &us,
            v: &v,
            u: &u,
            d: 1,
            users: 3,
            weights: None,
            hard: &[],
            ignore_in_batch: false,
            items: &[],
        };
        // Rows: [0.5 0.5 -1], [-0.5 -0.5 1], [1 1 -2].
        let logits = in_batch_logits(&t);
        assert_eq!(in_batch_ranks(&logits, 3), vec![[0, 0, 0], [2, 2, 0], [2, 2, 0]]);
        let (loss, _) = in_batch_softmax(&t, logits);
        let row = |l: [f64; 3], i: usize| -(l[i].exp() / l.iter().map(|x| x.exp()).sum::<f64>()).ln();
        let ce = row([0.5, 0.5, -1.0], 0) + row([-0.5, -0.5, 1.0], 1) + row([1.0, 1.0, -2.0], 2);
        // Row 1's own pair scores -0.5, row 2's -2: relu(0.5) + relu(2).
        let want = (ce + 0.5 + 2.0) / 3.0;
        assert!((loss as f64 - want).abs() < 1e-5, "loss {loss}, want {want}");
    }

    /// Sampled items widen every user's softmax and rank list; their user
    /// rows get no gradient. Checked against central differences.
    #[test]
    fn sampled_items_join_the_softmax_of_every_user() {
        let (d, b, n) = (2, 2, 5);
        let us: Vec<f32> = (0..n * d).map(|k| ((k * 7 % 5) as f32 - 2.0) * 0.3).collect();
        let v: Vec<f32> = (0..n * d).map(|k| ((k * 3 % 7) as f32 - 3.0) * 0.25).collect();
        let u: Vec<f32> = us.iter().map(|x| -x).collect();
        // Without hard negatives, and with user 1's two (rows 3 and 4;
        // user 0's column masked).
        for hard in [&[][..], &[(1, 3), (1, 4)][..]] {
            let loss = |us: &[f32], v: &[f32], u: &[f32]| {
                let t = Towers {
                    us,
                    v,
                    u,
                    d,
                    users: b,
                    weights: Some(&[0.5, 2.0]),
                    hard,
                    ignore_in_batch: false,
                    items: &[],
                };
                in_batch_softmax(&t, in_batch_logits(&t))
            };
            let (l0, g) = loss(&us, &v, &u);
            assert!(g.us[b * d..].iter().chain(&g.u[b * d..]).all(|x| *x == 0.0));
            let eps = 1e-3f32;
            for (which, k) in [(0, 1), (0, 2), (1, 3), (1, 7), (1, 9), (2, 0)] {
                let bump = |s: f32| {
                    let (mut a, mut c, mut e) = (us.clone(), v.clone(), u.clone());
                    [&mut a, &mut c, &mut e][which][k] += s;
                    loss(&a, &c, &e).0 as f64
                };
                let numeric = (bump(eps) - bump(-eps)) / (2.0 * eps as f64);
                let analytic = [&g.us, &g.v, &g.u][which][k] as f64;
                assert!(
                    (numeric - analytic).abs() < 2e-3,
                    "{hard:?} {which}/{k}: {numeric} vs {analytic} (loss {l0})"
                );
            }
        }
        let t = Towers {
            us: &us,
            v: &v,
            u: &u,
            d,
            users: b,
            weights: None,
            hard: &[(1, 3), (1, 4)],
            ignore_in_batch: false,
            items: &[],
        };
        let l = in_batch_logits(&t);
        assert_eq!((l.len(), l[3], l[4]), (2 * 5, NO_HARD_NEGATIVE, NO_HARD_NEGATIVE));
        let dot = |i: usize, r: usize| (0..d).map(|c| us[i * d + c] * v[r * d + c]).sum::<f32>();
        assert_eq!((l[8], l[9]), (dot(1, 3), dot(1, 4)));
    }

    /// Leaving the batch's other items out (`ignore_in_batch_neg_sam`):
    /// each user's softmax is over its own item and the drawn ones.
    #[test]
    fn ignoring_in_batch_items_leaves_the_own_and_the_drawn() {
        let (d, b, n) = (1, 2, 4);
        let us = [1.0f32, -0.5, 0.0, 0.0];
        let v = [0.3f32, 0.8, -0.2, 0.6];
        let t = Towers {
            us: &us,
            v: &v,
            u: &us,
            d,
            users: b,
            weights: None,
            hard: &[],
            ignore_in_batch: true,
            items: &[],
        };
        let l = in_batch_logits(&t);
        assert_eq!((l[1], l[n]), (NO_HARD_NEGATIVE, NO_HARD_NEGATIVE));
        let (loss, _) = in_batch_softmax(&t, l);
        let row = |own: f64, drawn: [f64; 2]| -(own.exp() / (own.exp() + drawn[0].exp() + drawn[1].exp())).ln();
        let ce = row(0.3, [-0.2, 0.6]) + row(-0.4, [0.1, -0.3]);
        // relu(-u_i · v_i): user 1's own pair scores -0.4.
        let want = (ce + 0.4) / 2.0;
        assert!((loss as f64 - want).abs() < 1e-5, "loss {loss}, want {want}");
    }

    /// MIND's scores by interest: an item's best similarity to one of the
    /// user's interests; ranks among the batch's and drawn items, and the
    /// own logit against the hard negatives' scores.
    #[test]
    fn interests_rank_items_by_their_best_interest() {
        // 2 users of 2 interests in 1-D; items: the users' own two, one
        // drawn and one hard negative of user 1.
        let ui = [1.0f32, -1.0, 0.5, 0.0];
        let v = [0.2f32, -0.6, 0.4, 0.9];
        let t = Towers {
            us: &[0.0; 4],
            v: &v,
            u: &[0.0; 4],
            d: 1,
            users: 2,
            weights: None,
            hard: &[(1, 3)],
            ignore_in_batch: false,
            items: &[],
        };
        let sims = interest_sims(&ui, 2, &t);
        // max(x, -x) for user 0, max(0.5x, 0) for user 1.
        let want = [0.2, 0.6, 0.4, 0.9, 0.1, 0.0, 0.2, 0.45];
        sims.iter()
            .zip(want)
            .for_each(|(a, b)| assert!((a - b).abs() < 1e-6, "{sims:?}"));
        let eval = interest_eval(&sims, &[0.3, 0.5], &t);
        // User 0: its 0.2 below 0.6 and 0.4; user 1: its 0.0 below 0.1 and 0.2.
        assert_eq!(eval.ranks, vec![[2, 1, 1], [2, 1, 1]]);
        // User 1's logit 0.5 beats its hard negative's 0.45; user 0 has none.
        assert_eq!(eval.hard_hits, vec![true, true]);
    }

    /// EasyRec's `item_id`: a user's softmax leaves out the batch's other
    /// examples of its own item.
    #[test]
    fn the_batch_examples_of_a_users_item_are_no_negatives() {
        let us = [1.0f32, -0.5, 0.3];
        let v = [0.3f32, 0.8, -0.2];
        let t = Towers {
            us: &us,
            v: &v,
            u: &us,
            d: 1,
            users: 3,
            weights: None,
            hard: &[],
            ignore_in_batch: false,
            items: &[7, 9, 7],
        };
        let l = in_batch_logits(&t);
        // Users 0 and 2 share item 7: each leaves the other out.
        assert_eq!((l[2], l[6]), (NO_HARD_NEGATIVE, NO_HARD_NEGATIVE));
        assert_eq!((l[0], l[1], l[4], l[8]), (0.3, 0.8, -0.4, 0.3 * -0.2));
    }

    /// Ranks over all items, the batch's, and the own with the sampled.
    #[test]
    fn ranks_count_every_item_above_the_own_one() {
        // User 0 against items [own, other, s1, s2, s3]: [3, 1, 5, 3, 0];
        // user 1 against [other, own, s1, s2, s3]: [5, 2, 2, 3, 4].
        let l = [3.0, 1.0, 5.0, 3.0, 0.0, 5.0, 2.0, 2.0, 3.0, 4.0];
        assert_eq!(in_batch_ranks(&l, 2), vec![[1, 0, 1], [3, 1, 2]]);
    }

    /// The product logit is the logit of the probabilities' product, also
    /// where they saturate.
    #[test]
    fn product_logit_is_the_logit_of_the_product() {
        for (a, b) in [(0.3f32, -1.2f32), (4.0, 3.0), (-30.0, 2.0), (60.0, 70.0)] {
            let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
            let p = sig(a as f64) * sig(b as f64);
            let (y, _, _) = product_logit(a, b);
            let want = (p / (1.0 - p)).ln();
            if want.is_finite() {
                assert!(
                    (y as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{a} {b}: {y} vs {want}"
                );
            }
            assert!(y.is_finite());
        }
    }

    /// Sample weights: all 1 is the plain mean; otherwise the weighted sum
    /// over the count of non-zero weights, with matching gradients.
    #[test]
    fn sample_weights_divide_by_the_non_zero_count() {
        let (z, y) = ([0.3f32, -1.2, 2.0, 0.1], [1.0f32, 0.0, 1.0, 0.0]);
        for kind in [LossKind::BinaryClassification, LossKind::Regression] {
            let (plain, pg) = loss_grad(kind, &z, &y);
            let (ones, og) = weighted_loss_grad(kind, &z, &y, &[1.0; 4]);
            assert!((plain - ones).abs() < 1e-6 && pg.iter().zip(&og).all(|(a, b)| (a - b).abs() < 1e-7));
            let w = [2.0f32, 0.0, 0.5, 1.0];
            let (l, g) = weighted_loss_grad(kind, &z, &y, &w);
            let per_row: Vec<f32> = (0..4).map(|i| loss_grad(kind, &z[i..=i], &y[i..=i]).0).collect();
            let want = per_row.iter().zip(&w).map(|(l, w)| l * w).sum::<f32>() / 3.0;
            assert!((l - want).abs() < 1e-6, "{kind:?}: {l} vs {want}");
            let what = format!("{kind:?}");
            assert_slopes(&what, |z| weighted_loss_grad(kind, z, &y, &w).0, &z, &g, (&[], 2e-3));
        }
        assert_eq!(
            weighted_loss_grad(LossKind::Regression, &z, &y, &[0.0; 4]),
            (0.0, vec![0.0; 4])
        );
    }

    /// Softmax cross entropy over four classes: the mean of `-log p_y`,
    /// weighted rows over the non-zero count, gradients by finite
    /// differences, and the same values as the reference executor's.
    #[test]
    fn softmax_cross_entropy_matches_its_definition_and_the_reference() {
        use crate::model::heads::oracle as reference;
        use burn::tensor::{Tensor, TensorData};
        let kind = LossKind::MultiClass { classes: 4 };
        let z = [0.3f32, -1.2, 2.0, 0.1, 5.0, -3.0, 0.0, 1.0, -0.5, 0.5, 0.25, -2.0];
        let y = [2.0f32, 0.0, 3.0];
        let w = [2.0f32, 0.0, 0.5];
        let nll = |r: usize| {
            let row = &z[r * 4..r * 4 + 4];
            let lse = row.iter().map(|x| x.exp()).sum::<f32>().ln();
            lse - row[y[r] as usize]
        };
        let (plain, _) = loss_grad(kind, &z, &y);
        assert!((plain - (nll(0) + nll(1) + nll(2)) / 3.0).abs() < 1e-5);
        let (l, g) = weighted_loss_grad(kind, &z, &y, &w);
        assert!((l - (2.0 * nll(0) + 0.5 * nll(2)) / 2.0).abs() < 1e-5, "{l}");
        assert_slopes(
            "softmax",
            |z| weighted_loss_grad(kind, z, &y, &w).0,
            &z,
            &g,
            (&[], 2e-3),
        );
        let device = Default::default();
        let t = Tensor::<2>::from_data(TensorData::new(z.to_vec(), [3, 4]), &device);
        let r: f32 = reference::weighted_loss_of(kind, t.clone(), &y, &w).into_scalar();
        assert!((r - l).abs() < 1e-5, "{r} vs {l}");
        let r: f32 = reference::softmax_ce_of(t, &y, None).into_scalar();
        assert!((r - plain).abs() < 1e-5, "{r} vs {plain}");
    }

    /// ZILN's loss: its gradient by finite differences (inside sigma's
    /// clip) and against the reference executor's autodiff, sigma clipped
    /// at both ends included; its prediction by EasyRec's formula.
    #[test]
    fn ziln_loss_matches_finite_differences_and_the_reference() {
        use crate::model::heads::oracle as reference;
        use burn::tensor::{Tensor, TensorData};
        let params = ZilnTerm {
            mu_reg: 0.02,
            sigma_reg: 0.01,
            max_sigma: 3.0,
            class_weight: 1.0,
            reg_weight: 0.7,
        };
        let kind = LossTermKind::Ziln(params);
        let z = [0.3f32, 0.5, -0.2, -1.2, 1.5, 0.8, 2.0, -0.3, 4.0, 0.1, 2.2, -12.0];
        let y = [2.5f32, 0.0, 0.7, 0.0];
        let (l, g) = ziln(&z, &y, params);
        // Sigma's clips are kinks: their logits are checked below.
        assert_slopes("ZILN", |z| ziln(z, &y, params).0, &z, &g, (&[8, 11], 2e-3));
        // Sigma clipped above (row 2) and below (row 3): only the
        // penalty's slope.
        for k in [8, 11] {
            assert!((g[k] - 2.0 * 0.01 * z[k] / 4.0).abs() < 1e-7, "logit {k}: {}", g[k]);
        }
        let task = Task {
            terms: vec![crate::config::model::tasks::LossTerm { kind, weight: 1.0 }],
            loss: LossKind::Ziln(crate::config::model::tasks::ZilnPrediction {
                max_sigma: 3.0,
                max_log_clip: 20.0,
                return_log: false,
            }),
            ..task(Vec::new())
        };
        let device = burn::tensor::Device::flex().autodiff();
        let t = Tensor::<2>::from_data(TensorData::new(z.to_vec(), [4, 3]), &device).require_grad();
        let r = reference::task_loss_of(&task, t.clone(), &y, &[]);
        let rl: f32 = r.clone().into_scalar();
        assert!((rl - l).abs() < 1e-5, "{rl} vs {l}");
        let grads = r.backward();
        let rg = crate::model::graph::params::to_vec(t.grad(&grads).unwrap());
        for (k, (a, b)) in g.iter().zip(&rg).enumerate() {
            assert!((a - b).abs() < 1e-5, "logit {k}: cpu {a} vs reference {b}");
        }
        let (p, v) = ziln_prediction(&z[..3], task_ziln(&task));
        let sigma = (1.0f64 + (-0.2f64).exp()).ln();
        let want = (-(1.0 + (-0.3f64).exp()).ln() + 0.5 + 0.5 * sigma * sigma).exp();
        assert!((p - 1.0 / (1.0 + (-0.3f32).exp())).abs() < 1e-6 && (v as f64 - want).abs() < 1e-5 * want);
    }

    /// JRC: the loss and gradient against EasyRec's formulation on the
    /// reference executor (masked [b, b] log-softmax over rows), and the
    /// gradient by finite differences; sessions of one row, and of rows
    /// that share a label, included.
    #[test]
    fn jrc_loss_matches_easyrecs_formulation_and_finite_differences() {
        use crate::model::heads::oracle as reference;
        use burn::tensor::{Tensor, TensorData};
        let z = [0.3f32, -0.5, 1.2, 0.4, -0.7, 0.9, 0.0, 0.2, 2.0, -1.0, 0.5, 0.5];
        let y = [1.0f32, 0.0, 1.0, 1.0, 0.0, 0.0];
        let sessions = [7u64, 7, 3, 7, 9, 3];
        let t = Task {
            terms: vec![crate::config::model::tasks::LossTerm {
                kind: LossTermKind::Jrc { alpha: 0.3 },
                weight: 1.0,
            }],
            loss: LossKind::Jrc,
            session: Some("s".into()),
            ..task(Vec::new())
        };
        let (l, g) = task_loss_grad(&t, &z, &y, &sessions);
        assert_slopes("JRC", |z| task_loss_grad(&t, z, &y, &sessions).0, &z, &g, (&[], 2e-3));
        let device = burn::tensor::Device::flex().autodiff();
        let x = Tensor::<2>::from_data(TensorData::new(z.to_vec(), [6, 2]), &device).require_grad();
        let r = reference::task_loss_of(&t, x.clone(), &y, &sessions);
        let rl: f32 = r.clone().into_scalar();
        assert!((rl - l).abs() < 1e-5, "{rl} vs {l}");
        let grads = r.backward();
        let rg = crate::model::graph::params::to_vec(x.grad(&grads).unwrap());
        for (k, (a, b)) in g.iter().zip(&rg).enumerate() {
            assert!((a - b).abs() < 1e-5, "logit {k}: cpu {a} vs reference {b}");
        }
    }

    /// `g` is the slope of `f` (`what`) at `z` by central differences
    /// within `tol`, but at the indices `skip`.
    fn assert_slopes(what: &str, f: impl Fn(&[f32]) -> f32, z: &[f32], g: &[f32], (skip, tol): (&[usize], f32)) {
        let eps = 1e-3f32;
        for k in (0..z.len()).filter(|k| !skip.contains(k)) {
            let (mut up, mut down) = (z.to_vec(), z.to_vec());
            up[k] += eps;
            down[k] -= eps;
            let numeric = (f(&up) - f(&down)) / (2.0 * eps);
            assert!(
                (numeric - g[k]).abs() < tol,
                "{what} logit {k}: numeric {numeric}, analytic {}",
                g[k]
            );
        }
    }

    fn task_ziln(t: &Task) -> crate::config::model::tasks::ZilnPrediction {
        match t.loss {
            LossKind::Ziln(z) => z,
            _ => unreachable!(),
        }
    }

    /// A batch without a pair of different labels has no pairwise loss.
    /// ORDER_CALIBRATE_LOSS against a hand computation and central
    /// differences (rows away from the relu's kink).
    #[test]
    fn order_calibration_penalises_a_task_above_its_relation() {
        let z = [0.5f32, -1.0, 2.0, 0.1];
        let r = [0.0f32, 0.3, 1.0, 0.1];
        let (l, gz, gr) = order_calibrate(&z, &r, 0.5);
        let s = |x: f32| 1.0 / (1.0 + (-x as f64).exp());
        let want = 0.5 * ((s(0.5) - s(0.0)) + (s(2.0) - s(1.0))) / 4.0;
        assert!((l as f64 - want).abs() < 1e-7, "{l} vs {want}");
        assert_eq!((gz[1], gr[1], gz[3], gr[3]), (0.0, 0.0, 0.0, 0.0));
        for k in [0, 2] {
            for (which, g) in [(0, gz[k]), (1, gr[k])] {
                let bump = |e: f32| {
                    let (mut a, mut c) = (z, r);
                    [&mut a, &mut c][which][k] += e;
                    order_calibrate(&a, &c, 0.5).0 as f64
                };
                let num = (bump(1e-3) - bump(-1e-3)) / 2e-3;
                assert!((num - g as f64).abs() < 1e-4, "{which}/{k}: {num} vs {g}");
            }
        }
    }

    #[test]
    fn a_batch_without_pairs_has_no_pairwise_loss() {
        let t = task(vec![LossTermKind::PairWise {
            margin: 0.0,
            temperature: 1.0,
        }]);
        let (l, g) = task_loss_grad(&t, &[0.5, -0.5], &[1.0, 1.0], &[]);
        assert_eq!((l, g), (0.0, vec![0.0, 0.0]));
    }
}
