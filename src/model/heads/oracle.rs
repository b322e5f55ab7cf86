//! The heads' losses on burn tensors, differentiated by burn's autodiff:
//! the oracle of `losses` and `in_batch` in tests.

use burn::tensor::activation::{log_softmax, sigmoid, softmax};
use burn::tensor::{Device, Tensor, TensorData};

use super::in_batch::NO_HARD_NEGATIVE;
use super::losses;
use super::Targets;
use crate::config::model::tasks::{KdKind, KdTerm, LossKind, LossTermKind, Task};
use crate::model::graph::params::to_vec;
use crate::model::graph::{Penalty, Reduce};

/// Mean loss of logits `[b, 1]` against labels.
pub fn loss_of(kind: LossKind, logits: Tensor<2>, labels: Tensor<2>) -> Tensor<1> {
    match kind {
        LossKind::BinaryClassification => {
            // Value: max(x, 0) - x*y + log(1 + exp(-|x|)), the stable sigmoid
            // cross entropy. Gradient: sigmoid(x) - y, attached directly.
            // Differentiating the max/abs form instead takes one-sided
            // slopes at x = 0 that add up to 1 - y instead of 0.5 - y, and
            // logits of exactly 0 are common at the start (zero output bias,
            // rows whose last hidden layer is all zero).
            let pos = logits.clone().clamp_min(0.0);
            let value = pos - logits.clone() * labels.clone() + logits.clone().abs().neg().exp().log1p();
            let slope = (sigmoid(logits.clone()) - labels).detach();
            let linear = logits * slope;
            (linear.clone() + (value - linear).detach()).mean()
        }
        LossKind::Regression => {
            let d = logits - labels;
            (d.clone() * d).mean()
        }
        LossKind::InBatchSoftmax { .. } => unreachable!("the in-batch softmax reads the towers (in_batch_loss_of)"),
        LossKind::MultiClass { .. } => unreachable!("a multi-class loss reads class indices (softmax_ce_of)"),
        LossKind::Ziln(_) | LossKind::Jrc => unreachable!("a ZILN or JRC task trains its losses term"),
    }
}

/// Softmax cross entropy of `logits` (`[b, classes]`) against class
/// indices on the reference executor, the oracle of the multi-class
/// `losses::loss_grad`: the mean over the rows, or with `weights` their
/// weighted sum over the count of non-zero weights.
pub fn softmax_ce_of(logits: Tensor<2>, label_values: &[f32], weights: Option<&[f32]>) -> Tensor<1> {
    let device = logits.device();
    let [b, c] = logits.dims();
    let mut pick = vec![0.0f32; b * c];
    for (r, &y) in label_values.iter().enumerate() {
        pick[r * c + y as usize] = weights.map_or(1.0, |w| w[r]);
    }
    let count = weights.map_or(b, |w| w.iter().filter(|x| **x != 0.0).count()).max(1);
    let picked = Tensor::<2>::from_data(TensorData::new(pick, [b, c]), &device);
    (log_softmax(logits, 1) * picked).sum().neg().div_scalar(count as f32)
}

/// A match model's in-batch softmax on the reference executor, the oracle
/// of `in_batch::in_batch_softmax`: `us`, `v`, `u` are `[n, d]`, their
/// first `targets.labels` rows examples (weighing `targets.weights`, else
/// 1) and the rest sampled items, the last of them hard negatives.
pub fn in_batch_loss_of(
    (us, v, u): (Tensor<2>, Tensor<2>, Tensor<2>),
    targets: Targets,
    ignore_in_batch: bool,
) -> Tensor<1> {
    let b = targets.rows;
    let hard = targets.hard_negatives;
    let rows = v.dims()[0];
    let shared = rows - hard.len();
    let device = us.device();
    let constant =
        |values: Vec<f32>, shape: [usize; 2]| Tensor::<2>::from_data(TensorData::new(values, shape), &device);
    let mut logits = us
        .clone()
        .narrow(0, 0, b)
        .matmul(v.clone().narrow(0, 0, shared).swap_dims(0, 1));
    let items = targets.items;
    if ignore_in_batch || !items.is_empty() {
        // The batch's items a user leaves out sink out of its softmax: all
        // others, or those of its own item.
        let off: Vec<f32> = (0..b * shared)
            .map(|k| {
                let (i, j) = (k / shared, k % shared);
                let out = j < b && j != i && (ignore_in_batch || items[i] == items[j]);
                if out {
                    NO_HARD_NEGATIVE
                } else {
                    0.0
                }
            })
            .collect();
        logits = logits + constant(off, [b, shared]);
    }
    if !hard.is_empty() {
        // Each pair's score, gathered and scattered by one-hot matrices
        // into its user's row; the empty places hold the mask.
        let mut count = vec![0usize; b];
        let mut slot = Vec::with_capacity(hard.len());
        for &(i, _) in hard {
            slot.push(count[i]);
            count[i] += 1;
        }
        let most = count.iter().copied().max().unwrap_or(0);
        let k = hard.len();
        let one_hot = |at: &dyn Fn(usize) -> usize, width: usize| {
            let mut m = vec![0.0f32; k * width];
            (0..k).for_each(|j| m[j * width + at(j)] = 1.0);
            constant(m, [k, width])
        };
        let pick_u = one_hot(&|j| hard[j].0, rows);
        let pick_v = one_hot(&|j| hard[j].1, rows);
        let scores = (pick_u.matmul(us.clone()) * pick_v.matmul(v.clone())).sum_dim(1);
        let place = one_hot(&|j| hard[j].0 * most + slot[j], b * most).swap_dims(0, 1);
        let mut mask = vec![NO_HARD_NEGATIVE; b * most];
        for (j, &(i, _)) in hard.iter().enumerate() {
            mask[i * most + slot[j]] = 0.0;
        }
        let hard_logits = place.matmul(scores).reshape([b, most]) + constant(mask, [b, most]);
        logits = Tensor::cat(vec![logits, hard_logits], 1);
    }
    let n = logits.dims()[1];
    let eye: Vec<f32> = (0..b * n).map(|k| f32::from(u8::from(k / n == k % n))).collect();
    let hit = (softmax(logits, 1) * constant(eye, [b, n])).sum_dim(1);
    let ce = hit.add_scalar(1e-12).log().neg();
    // relu(−u·v) with TensorFlow's slope 0 at 0 (a user embedding of
    // zeros scores exactly 0 and is not pushed).
    let below = (u.narrow(0, 0, b) * v.narrow(0, 0, b)).sum_dim(1).neg();
    let active = below.clone().greater_elem(0.0).float().detach();
    let reg = below * active;
    let w = targets.weights.map_or_else(|| vec![1.0; b], <[f32]>::to_vec);
    let mass: f32 = w.iter().sum();
    ((ce + reg) * constant(w, [b, 1])).sum().div_scalar(mass)
}

/// A loss with EasyRec's sample weights on the reference executor, the
/// oracle of `losses::weighted_loss_grad`: the weighted sum over the
/// count of non-zero weights.
pub fn weighted_loss_of(kind: LossKind, logits: Tensor<2>, label_values: &[f32], weights: &[f32]) -> Tensor<1> {
    let device = logits.device();
    let b = label_values.len();
    let column = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device);
    let labels = column(label_values.to_vec());
    let per_row = match kind {
        LossKind::BinaryClassification => sigmoid_ce(logits, labels),
        LossKind::Regression => {
            let d = logits - labels;
            d.clone() * d
        }
        LossKind::InBatchSoftmax { .. } => unreachable!("the in-batch softmax reads the towers (in_batch_loss_of)"),
        LossKind::MultiClass { .. } => return softmax_ce_of(logits, label_values, Some(weights)),
        LossKind::Ziln(_) | LossKind::Jrc => unreachable!("sample weights of a losses list are refused"),
    };
    let nonzero = weights.iter().filter(|w| **w != 0.0).count().max(1);
    (per_row * column(weights.to_vec())).sum().div_scalar(nonzero as f32)
}

/// A graph penalty's weighted loss on the reference executor, the oracle
/// of `Reduce::apply`: `v` is `[b, 1]` (`[b, 2]` for `ReluOfShare`).
pub fn penalty_of(p: &Penalty, v: Tensor<2>, weights: Option<&[f32]>) -> Tensor<1> {
    let device = v.device();
    let b = v.dims()[0];
    let l = match (p.reduce, weights) {
        (Reduce::Mean, None) | (Reduce::UnweightedMean, _) => v.mean(),
        (Reduce::Mean, Some(w)) => {
            let n = w.iter().filter(|x| **x != 0.0).count().max(1);
            let w = Tensor::<2>::from_data(TensorData::new(w.to_vec(), [b, 1]), &device);
            (v * w).sum().div_scalar(n as f32)
        }
        (Reduce::RootOfSum, _) => v.sum().sqrt(),
        (Reduce::ReluOfShare { max }, _) => {
            // The counts are constants; relu's slope at 0 is TensorFlow's 0.
            let count: f32 = to_vec(v.clone().narrow(1, 1, 1)).iter().sum();
            let over = v.narrow(1, 0, 1).sum().div_scalar(count.max(1.0)).sub_scalar(max);
            let active = over.clone().greater_elem(0.0).float().detach();
            over * active
        }
    };
    l.mul_scalar(p.weight)
}

/// A distillation term's loss on the reference executor, the oracle of
/// `losses::kd_loss_grad` (the soft labels are constants).
pub fn kd_loss_of(kd: &KdTerm, logits: Tensor<2>, soft: &[f32]) -> Tensor<1> {
    let device = logits.device();
    let [b, c] = logits.dims();
    let t = kd.divisor();
    let eps = 1e-7f32;
    let constant = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, c]), &device);
    // The teacher's probabilities: per logit (sigmoid), or per row over
    // a multi-class task's classes (softmax: its CE and KL terms), from
    // the soft labels as logits.
    let teacher = || {
        let logits: Vec<f32> = soft
            .iter()
            .map(|&s| super::losses::kd_label_logit(kd, s) as f32)
            .collect();
        let logits = constant(logits).div_scalar(t);
        match (c, kd.kind) {
            (2.., KdKind::CrossEntropy | KdKind::KlDivergence) => softmax(logits, 1),
            _ => sigmoid(logits),
        }
    };
    let log_loss = |y: Tensor<2>, p: Tensor<2>| {
        let one_minus = p.clone().neg().add_scalar(1.0);
        let ny = y.clone().neg().add_scalar(1.0);
        (y * p.add_scalar(eps).log() + ny * one_minus.add_scalar(eps).log()).neg()
    };
    // Keras' KLD terms `y log(y / p)`, both clipped to [eps, 1].
    let kld = |y: Tensor<2>, p: Tensor<2>| {
        let y = y.clamp(eps, 1.0);
        y.clone() * (y.log() - p.clamp(eps, 1.0).log())
    };
    match kd.kind {
        KdKind::CrossEntropy if c > 1 => log_loss(teacher(), softmax(logits.div_scalar(t), 1)).mean(),
        KdKind::CrossEntropy => log_loss(teacher(), sigmoid(logits.div_scalar(t))).mean(),
        KdKind::KlDivergence if c > 1 => kld(teacher(), softmax(logits.div_scalar(t), 1)).sum_dim(1).mean(),
        KdKind::KlDivergence => {
            let (y, p) = (teacher(), sigmoid(logits.div_scalar(t)));
            let one = |x: Tensor<2>| x.neg().add_scalar(1.0);
            (kld(y.clone(), p.clone()) + kld(one(y), one(p))).mean()
        }
        KdKind::BinaryCrossEntropy => sigmoid_ce(logits.div_scalar(t), teacher()).mean(),
        KdKind::L2 => {
            let d = logits - constant(soft.to_vec());
            (d.clone() * d).mean()
        }
    }
    .mul_scalar(kd.weight)
}

/// `log(1 + exp(z))`, stable, with the slope `sigmoid(z)` attached
/// directly: the max/abs form's one-sided slopes at `z = 0` (an output
/// whose inputs are all zero) sum to 1 or 0 instead of 0.5 (see `loss_of`).
fn softplus_of(z: Tensor<2>) -> Tensor<2> {
    let value = z.clone().clamp_min(0.0) + z.clone().abs().neg().exp().log1p();
    let linear = z.clone() * sigmoid(z).detach();
    linear.clone() + (value - linear).detach()
}

/// A cross entropy whose gradient is `p − y` exactly (see `loss_of`):
/// `softplus(z) − y·z` per element, `y` a constant.
fn sigmoid_ce(z: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
    let value = z.clone().clamp_min(0.0) - z.clone() * y.clone() + z.clone().abs().neg().exp().log1p();
    let slope = (sigmoid(z.clone()) - y).detach();
    let linear = z * slope;
    linear.clone() + (value - linear).detach()
}

/// A task's batch loss on the reference executor, the oracle of
/// `losses::task_loss_grad`: its `loss_type`'s, or the weighted sum of
/// `model_config.losses`.
pub fn task_loss_of(task: &Task, logits: Tensor<2>, label_values: &[f32], sessions: &[u64]) -> Tensor<1> {
    if task.summed {
        let unsummed = Task {
            summed: false,
            ..task.clone()
        };
        return task_loss_of(&unsummed, logits, label_values, sessions).mul_scalar(label_values.len() as f32);
    }
    let device = logits.device();
    let b = label_values.len();
    let column = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device);
    let labels = column(label_values.to_vec());
    if let LossKind::MultiClass { .. } = task.loss {
        return softmax_ce_of(logits, label_values, None);
    }
    if task.terms.is_empty() {
        return loss_of(task.loss, logits, labels);
    }
    let mut total: Option<Tensor<1>> = None;
    for term in &task.terms {
        let l = match term.kind {
            LossTermKind::CrossEntropy => loss_of(LossKind::BinaryClassification, logits.clone(), labels.clone()),
            LossTermKind::F1Reweighted {
                beta_square,
                label_smoothing,
            } => {
                let pos: f32 = label_values.iter().sum();
                let is_pos: Vec<f32> = label_values.iter().map(|&y| f32::from(u8::from(y == 1.0))).collect();
                let smoothed: Vec<f32> = label_values
                    .iter()
                    .map(|&y| y * (1.0 - label_smoothing) + 0.5 * label_smoothing)
                    .collect();
                let tp = sigmoid(logits.clone()).sum().reshape([1, 1]);
                let denom = tp.clone().add_scalar(beta_square * pos - pos + 1e-8);
                let neg_w = tp / denom; // [1, 1]
                let is_pos = column(is_pos);
                let w = is_pos.clone() + (is_pos.neg().add_scalar(1.0)) * neg_w;
                (w * sigmoid_ce(logits.clone(), column(smoothed)))
                    .sum()
                    .div_scalar(b.max(1) as f32)
            }
            LossTermKind::Ziln(zp) => {
                let column = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, 1]), &device);
                let positive: Vec<f32> = label_values.iter().map(|y| f32::from(u8::from(*y > 0.0))).collect();
                let count = positive.iter().sum::<f32>() + 1e-8;
                // log of the label where positive, 0 (the label 1) elsewhere.
                let log_label: Vec<f32> = label_values
                    .iter()
                    .map(|y| if *y > 0.0 { y.ln() } else { 0.0 })
                    .collect();
                let (p, x) = (column(positive), column(log_label));
                let (z0, mu, z2) = (
                    logits.clone().narrow(1, 0, 1),
                    logits.clone().narrow(1, 1, 1),
                    logits.clone().narrow(1, 2, 1),
                );
                let cls = sigmoid_ce(z0, p.clone()).mean();
                let sigma = softplus_of(z2.clone()).clamp(losses::ZILN_MIN_SIGMA as f32, zp.max_sigma);
                let d = x.clone() - mu.clone();
                let half_log_2pi = 0.5 * (2.0 * std::f32::consts::PI).ln();
                let nll = x
                    + sigma.clone().log().add_scalar(half_log_2pi)
                    + (d.clone() * d).div(sigma.clone() * sigma).mul_scalar(0.5);
                let reg = (nll * p).sum().div_scalar(count);
                cls.mul_scalar(zp.class_weight)
                    + reg.mul_scalar(zp.reg_weight)
                    + (mu.clone() * mu).mean().mul_scalar(zp.mu_reg)
                    + (z2.clone() * z2).mean().mul_scalar(zp.sigma_reg)
            }
            LossTermKind::Jrc { alpha } => {
                // EasyRec's jrc_loss as written: [b, b] session masks, the
                // logits tiled and masked, log-softmax over the rows.
                let ce = softmax_ce_of(logits.clone(), label_values, None);
                let mask: Vec<f32> = (0..b * b)
                    .map(|k| f32::from(u8::from(sessions[k / b] == sessions[k % b])))
                    .collect();
                let size: Vec<f32> = (0..b).map(|j| (0..b).map(|i| mask[i * b + j]).sum()).collect();
                let square = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [b, b]), &device);
                let off = square(mask.iter().map(|x| (1.0 - x) * -1e9).collect());
                let mut ge: Option<Tensor<2>> = None;
                for c in 0..2 {
                    let y: Vec<f32> = (0..b * b)
                        .map(|k| {
                            let yi = label_values[k / b];
                            mask[k] * if c == 1 { yi } else { 1.0 - yi }
                        })
                        .collect();
                    let z = logits.clone().narrow(1, c, 1); // [b, 1], broadcast over columns j
                    let tiled = z.matmul(Tensor::<2>::ones([1, b], &device)) + off.clone();
                    let l = (square(y) * log_softmax(tiled, 0)).sum_dim(0).neg(); // [1, b]
                    ge = Some(match ge {
                        Some(g) => g + l,
                        None => l,
                    });
                }
                let sizes = Tensor::<2>::from_data(TensorData::new(size, [1, b]), &device);
                let ge = ge.expect("two classes").div(sizes).mean();
                ce.mul_scalar(alpha) + ge.mul_scalar(1.0 - alpha)
            }
            LossTermKind::PairWise { margin, temperature } => {
                let mut mask = vec![0.0f32; b * b];
                let mut pairs = 0usize;
                for (i, yi) in label_values.iter().enumerate() {
                    for (j, yj) in label_values.iter().enumerate() {
                        if yi > yj {
                            mask[i * b + j] = 1.0;
                            pairs += 1;
                        }
                    }
                }
                if pairs == 0 {
                    logits.clone().sum().mul_scalar(0.0)
                } else {
                    let z = logits.clone().div_scalar(temperature);
                    let x = (z.clone() - z.swap_dims(0, 1)).sub_scalar(margin); // [b, b]
                    let mask = Tensor::<2>::from_data(TensorData::new(mask, [b, b]), &device);
                    let ones = Tensor::<2>::from_data(TensorData::new(vec![1.0f32; b * b], [b, b]), &device);
                    (sigmoid_ce(x, ones) * mask).sum().div_scalar(pairs as f32)
                }
            }
        }
        .mul_scalar(term.weight);
        total = Some(match total {
            Some(t) => t + l,
            None => l,
        });
    }
    total.expect("a losses list has an entry")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::heads::in_batch;

    /// The heads' in-batch softmax (written once for every executor)
    /// against burn's autodiff of the same loss: with sample weights, hard
    /// negatives and the batch's other examples of a user's item left out.
    #[test]
    fn in_batch_softmax_matches_autodiff() {
        let (d, b, rows) = (3, 4, 9);
        let mut r = crate::util::Rng::new(11);
        let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| r.normal() as f32 * 0.7).collect() };
        let (us, v, u) = (draw(rows * d), draw(rows * d), draw(rows * d));
        let labels = vec![vec![1.0; b]];
        let hard = [(1, 6), (1, 7), (3, 8)];
        let items = [7u64, 8, 7, 9];
        let weights = [0.5f32, 2.0, 1.0, 0.0];
        for (ignore, items) in [(false, &items[..]), (true, &[][..]), (false, &[][..])] {
            let targets = Targets {
                rows: b,
                labels: &labels,
                weights: Some(&weights),
                hard_negatives: &hard,
                sessions: &[],
                items,
            };
            let t = in_batch::Towers {
                us: &us,
                v: &v,
                u: &u,
                d,
                users: b,
                weights: targets.weights,
                hard: &hard,
                ignore_in_batch: ignore,
                items,
            };
            let (loss, g) = in_batch::in_batch_softmax(&t, in_batch::in_batch_logits(&t));
            let device = Device::flex().autodiff();
            let leaf =
                |x: &[f32]| Tensor::<2>::from_data(TensorData::new(x.to_vec(), [rows, d]), &device).require_grad();
            let (ut, vt, uu) = (leaf(&us), leaf(&v), leaf(&u));
            let want = in_batch_loss_of((ut.clone(), vt.clone(), uu.clone()), targets, ignore);
            let want_loss = to_vec(want.clone())[0];
            let grads = want.backward();
            assert!((loss - want_loss).abs() < 1e-5, "{ignore}: loss {loss} vs {want_loss}");
            for (name, got, x) in [("us", &g.us, &ut), ("v", &g.v, &vt), ("u", &g.u, &uu)] {
                let w = x.grad(&grads).map_or_else(|| vec![0.0; rows * d], to_vec);
                for (k, (a, c)) in got.iter().zip(&w).enumerate() {
                    assert!(
                        (a - c).abs() < 1e-5,
                        "{ignore}: d/d {name}[{k}] heads {a} vs autodiff {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn cross_entropy_gradient_is_exact_at_zero_logits() {
        let device = Device::flex().autodiff();
        let logits =
            Tensor::<2>::from_data(TensorData::new(vec![0.0f32, 0.0, 2.0, -3.0], [4, 1]), &device).require_grad();
        let labels = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 0.0, 1.0, 0.0], [4, 1]), &device);
        let loss = loss_of(LossKind::BinaryClassification, logits.clone(), labels);
        let value = to_vec(loss.clone())[0];
        let grads = loss.backward();
        let g = to_vec(logits.grad(&grads).expect("logits take part in the loss"));
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let want = [
            (sig(0.0) - 1.0) / 4.0,
            sig(0.0) / 4.0,
            (sig(2.0) - 1.0) / 4.0,
            sig(-3.0) / 4.0,
        ];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "gradient {g:?}, want {want:?}");
        }
        let bce = |x: f32, y: f32| -(y * sig(x).ln() + (1.0 - y) * (1.0 - sig(x)).ln());
        let mean = (bce(0.0, 1.0) + bce(0.0, 0.0) + bce(2.0, 1.0) + bce(-3.0, 0.0)) / 4.0;
        assert!((value - mean).abs() < 1e-6, "loss {value}, want {mean}");
    }
}
