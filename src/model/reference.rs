//! The model graph on burn tensors: the reference executor. burn's
//! autodiff differentiates it, so tests hold the CPU executor's hand-written
//! backward to it; later it runs the graph on burn's other devices.

use burn::tensor::activation::{log_softmax, relu, sigmoid, softmax, tanh};
use burn::tensor::{Device, Int, Tensor, TensorData};

use super::graph::{
    BnStats, Graph, Keys, Op, Penalty, Reduce, BN_EPS, DICE_EPS, L2_EPS, MASK_ADDER, SQUASH_EPS, VD_EPS, VD_TEMP,
};
use super::kernels::{self, NO_HARD_NEGATIVE};
use super::params::{to_vec, ParamStore};
use super::Targets;
use crate::config::model_plan::Activation;
use crate::config::tasks::{KdKind, KdTerm, LossKind, LossTermKind, Task};
use crate::util::Rng;

/// Per-pass state of a forward pass.
pub struct Ctx<'a> {
    /// Trainable parameters, indexed like `ParamStore::specs`.
    pub p: &'a [Tensor<2>],
    /// Batch-norm moving statistics (not trained).
    pub buffers: &'a ParamStore,
    pub training: bool,
    pub device: &'a Device,
    /// Dropout masks come from here, in node order.
    pub rng: Rng,
    /// Batch statistics seen in training, in node order.
    pub bn_stats: Vec<BnStats>,
    /// The leading rows that are examples (the rest sampled items).
    pub examples: usize,
}

impl Ctx<'_> {
    fn constant(&self, values: Vec<f32>, rows: usize, cols: usize) -> Tensor<2> {
        Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), self.device)
    }

    /// A normalization's column mean and variance: of the rows `stat` in
    /// training (recorded for the moving averages in buffers `mean`,
    /// `var`), those moving averages otherwise.
    fn column_stats(&mut self, stat: Tensor<2>, (mean, var): (usize, usize), width: usize) -> (Tensor<2>, Tensor<2>) {
        if self.training {
            let m = stat.clone().mean_dim(0);
            let c = stat - m.clone();
            let v = (c.clone() * c).mean_dim(0);
            self.bn_stats.push(BnStats {
                mean_buffer: mean,
                var_buffer: var,
                mean: to_vec(m.clone()),
                var: to_vec(v.clone()),
            });
            (m, v)
        } else {
            (
                self.constant(self.buffers.slice(mean).to_vec(), 1, width),
                self.constant(self.buffers.slice(var).to_vec(), 1, width),
            )
        }
    }
}

fn activate(a: Activation, x: Tensor<2>) -> Tensor<2> {
    match a {
        Activation::Relu => relu(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::Tanh => tanh(x),
        Activation::Linear => x,
        Activation::LeakyRelu => burn::tensor::activation::leaky_relu(x, f64::from(super::kernels::LEAKY_SLOPE)),
        Activation::Dice => unreachable!("Scope builds Dice as an op of its own"),
    }
}

/// Every node's value for group inputs `x` (`[b, width]` each).
pub fn forward(graph: &Graph, ctx: &mut Ctx, x: &[Tensor<2>]) -> Vec<Tensor<2>> {
    let batch = x.first().map_or(0, |t| t.dims()[0]);
    let mut v: Vec<Tensor<2>> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let width = node.width;
        // This node's rows.
        let b = batch * node.rows;
        let y = match &node.op {
            Op::Input { group } => x[*group].clone(),
            Op::Linear { x, w, b: bias, act } => {
                let y = v[x.0].clone().matmul(ctx.p[*w].clone());
                let y = match bias {
                    Some(i) => y + ctx.p[*i].clone(),
                    None => y,
                };
                activate(*act, y)
            }
            Op::BatchNorm {
                x,
                gamma,
                beta,
                mean,
                var,
                act,
                examples_only,
            } => {
                let x = v[x.0].clone();
                let stat = if *examples_only && ctx.training {
                    x.clone().narrow(0, 0, ctx.examples * node.rows)
                } else {
                    x.clone()
                };
                let (m, var) = ctx.column_stats(stat, (*mean, *var), width);
                let inv = var.add_scalar(BN_EPS).sqrt().recip();
                activate(*act, (x - m) * inv * ctx.p[*gamma].clone() + ctx.p[*beta].clone())
            }
            Op::LayerNorm { x, gamma, beta, eps } => {
                let x = v[x.0].clone();
                let m = x.clone().mean_dim(1);
                let c = x - m;
                let var = (c.clone() * c.clone()).mean_dim(1);
                let inv = var.add_scalar(*eps).sqrt().recip();
                c * inv * ctx.p[*gamma].clone() + ctx.p[*beta].clone()
            }
            Op::Dice { x, alpha, mean, var } => {
                let x = v[x.0].clone();
                let (m, var) = ctx.column_stats(x.clone(), (*mean, *var), width);
                let inv = var.add_scalar(DICE_EPS).sqrt().recip();
                let p = sigmoid((x.clone() - m) * inv);
                let a = ctx.p[*alpha].clone();
                x * (p.clone() + a * (p.neg().add_scalar(1.0)))
            }
            Op::Act { x, act } => activate(*act, v[x.0].clone()),
            Op::Dropout { x, rate } => {
                if ctx.training {
                    let keep = 1.0 - rate;
                    let mask: Vec<f32> = (0..b * width)
                        .map(|_| {
                            if ctx.rng.uniform() < keep as f64 {
                                1.0 / keep
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    v[x.0].clone() * ctx.constant(mask, b, width)
                } else {
                    v[x.0].clone()
                }
            }
            Op::Concat(xs) => Tensor::cat(xs.iter().map(|x| v[x.0].clone()).collect(), 1),
            Op::Slice { x, start } => v[x.0].clone().narrow(1, *start, width),
            Op::Add(xs) => xs[1..].iter().fold(v[xs[0].0].clone(), |acc, x| acc + v[x.0].clone()),
            Op::Mul(a, c) => v[a.0].clone() * v[c.0].clone(),
            Op::SumBlocks { x, n } => v[x.0].clone().reshape([b, *n, width]).sum_dim(1).reshape([b, width]),
            Op::MaxBlocks { x, n } => {
                // The maximum as a weighted sum of the blocks: weights of
                // 1 / ties at the maxima (a constant), TensorFlow's gradient.
                let xv = to_vec(v[x.0].clone());
                let mut w = vec![0.0f32; xv.len()];
                for (row, wr) in xv.chunks(n * width).zip(w.chunks_mut(n * width)) {
                    for c in 0..width {
                        let m = (0..*n).map(|k| row[k * width + c]).fold(f32::NEG_INFINITY, f32::max);
                        let at: Vec<usize> = (0..*n).filter(|k| row[k * width + c] == m).collect();
                        for k in &at {
                            wr[k * width + c] = 1.0 / at.len() as f32;
                        }
                    }
                }
                let w = ctx.constant(w, b, n * width);
                (v[x.0].clone() * w)
                    .reshape([b, *n, width])
                    .sum_dim(1)
                    .reshape([b, width])
            }
            Op::Fm { x, n } => {
                let blocks: Tensor<3> = v[x.0].clone().reshape([b, *n, width]);
                let s: Tensor<2> = blocks.clone().sum_dim(1).reshape([b, width]);
                let sq: Tensor<2> = (blocks.clone() * blocks).sum_dim(1).reshape([b, width]);
                (s.clone() * s - sq).mul_scalar(0.5)
            }
            Op::RowSum { x } => v[x.0].clone().sum_dim(1),
            Op::Bias { x, b: bias } => v[x.0].clone() + ctx.p[*bias].clone().reshape([1, width]),
            Op::Dot { xs, dim, pairs } => {
                let all = Tensor::cat(xs.iter().map(|x| v[x.0].clone()).collect(), 1);
                let n = all.dims()[1] / dim;
                let all: Tensor<3> = all.reshape([b, n, *dim]);
                let dots: Tensor<2> = all.clone().matmul(all.swap_dims(1, 2)).reshape([b, n * n]);
                let flat: Vec<i64> = pairs.iter().map(|&(i, j)| (i * n + j) as i64).collect();
                let idx = Tensor::<1, Int>::from_data(TensorData::new(flat, [pairs.len()]), ctx.device);
                dots.select(1, idx)
            }
            Op::Cross { x0, xl, w, b: bias } => {
                let s = v[xl.0].clone().matmul(ctx.p[*w].clone()); // [b, 1]
                v[x0.0].clone() * s + ctx.p[*bias].clone() + v[xl.0].clone()
            }
            Op::Softmax { x } => softmax(v[x.0].clone(), 1),
            Op::WeightedSum { gate, xs } => {
                let g = v[gate.0].clone();
                xs.iter()
                    .enumerate()
                    .map(|(e, x)| v[x.0].clone() * g.clone().narrow(1, e, 1))
                    .reduce(|a, c| a + c)
                    .expect("a weighted sum has operands")
            }
            Op::Zeros { .. } => ctx.constant(vec![0.0; b * width], b, width),
            Op::Sub(a, c) => v[a.0].clone() - v[c.0].clone(),
            Op::StopGradient { x } => v[x.0].clone().detach(),
            Op::ProductLogit { a, b: c } => {
                let (x, y) = (v[a.0].clone().neg(), v[c.0].clone().neg());
                let z = Tensor::cat(vec![x.clone(), y.clone(), x + y], 1);
                let m = z.clone().max_dim(1).detach();
                ((z - m.clone()).exp().sum_dim(1).log() + m).neg()
            }
            Op::Tile { x, n } => {
                let t: Tensor<3> = v[x.0].clone().reshape([b / n, 1, width]);
                t.repeat_dim(1, *n).reshape([b, width])
            }
            Op::Unfold { .. } | Op::Fold { .. } => v[node.op.operands()[0].0].clone().reshape([b, width]),
            Op::PrefixMask { len, n } => ctx.constant(prefix_mask(&to_vec(v[len.0].clone()), *n), b, *n),
            Op::MaskedSoftmax { x, len } => {
                let mask = ctx.constant(prefix_mask(&to_vec(v[len.0].clone()), width), b, width);
                live_softmax(v[x.0].clone(), mask)
            }
            Op::Capsules { len, count } => {
                let counts = to_vec(v[len.0].clone()).iter().map(|l| count.of(*l)).collect();
                ctx.constant(counts, b, 1)
            }
            Op::CapsuleRouting { x, len, caps, routing } => {
                let (n, e, k) = (graph.rows(*x), graph.width(*x), routing.max_k);
                let (iters, scale, stddev, init) = (&routing.iters, &routing.scale, &routing.stddev, &routing.init);
                let start: Vec<f32> = if ctx.training {
                    (0..batch * n * k)
                        .map(|_| (ctx.rng.truncated_normal() * *stddev as f64) as f32)
                        .collect()
                } else {
                    init.iter().copied().cycle().take(batch * n * k).collect()
                };
                let xs: Tensor<3> = v[x.0].clone().detach().reshape([batch, n, e]);
                let positions: Tensor<3> = ctx
                    .constant(prefix_mask(&to_vec(v[len.0].clone()), n), batch, n)
                    .reshape([batch, n, 1]);
                let live_caps: Tensor<3> = ctx
                    .constant(prefix_mask(&to_vec(v[caps.0].clone()), k), batch, k)
                    .reshape([batch, 1, k]);
                let xn = if *scale > 0.0 {
                    l2_normalized(xs.clone())
                } else {
                    xs.clone()
                };
                let by = if *scale > 0.0 { *scale } else { 1.0 };
                let mut logits: Tensor<3> = ctx.constant(start, batch * n, k).reshape([batch, n, k]);
                let mut w = logits.clone();
                for it in 0..*iters {
                    let caps_mask = live_caps.clone().repeat_dim(1, n);
                    w = live_softmax(logits.clone(), caps_mask) * positions.clone();
                    if it + 1 == *iters {
                        break;
                    }
                    let high = l2_normalized(w.clone().swap_dims(1, 2).matmul(xs.clone()));
                    logits = xn.clone().matmul(high.swap_dims(1, 2)).mul_scalar(by);
                }
                w.swap_dims(1, 2).reshape([batch, k * n])
            }
            Op::InterestSimilarity { x, caps, max_k } => {
                let wx = graph.width(*x);
                let counts = to_vec(v[caps.0].clone());
                let m: Vec<f32> = counts.iter().map(|c| if *c > 1.0 { 1.0 } else { 0.0 }).collect();
                let den: Vec<f32> = counts.iter().map(|c| 1.0 / (c * (c - 1.0)).max(1.0)).collect();
                let x3: Tensor<3> = v[x.0].clone().reshape([b, *max_k, wx / max_k]);
                let sum = x3.clone().sum_dim(1).reshape([b, wx / max_k]);
                let whole = (sum.clone() * sum).sum_dim(1);
                let parts = (x3.clone() * x3).reshape([b, wx]).sum_dim(1);
                let m = ctx.constant(m, b, 1);
                let s = (whole - parts) * ctx.constant(den, b, 1);
                Tensor::cat(vec![s.add_scalar(1.0).div_scalar(2.0) * m.clone(), m], 1)
            }
            Op::Squash { x, pow, ratio } => {
                let x = v[x.0].clone();
                let n = (x.clone() * x.clone()).sum_dim(1).clamp_min(SQUASH_EPS);
                let f = (n.clone() / n.clone().add_scalar(1.0)).powf_scalar(*pow) * n.sqrt().recip();
                x * f.mul_scalar(*ratio)
            }
            Op::L2Normalize { x } => l2_normalized(v[x.0].clone()),
            Op::Shift { x, by } => v[x.0].clone().add_scalar(*by),
            Op::GroupedLinear { x, w, b: bias, n } => {
                let din = graph.width(*x) / n;
                let dout = width / n;
                let x3: Tensor<3> = v[x.0].clone().reshape([b, *n, din]).swap_dims(0, 1);
                let w3: Tensor<3> = ctx.p[*w].clone().reshape([*n, din, dout]);
                let y = x3.matmul(w3).swap_dims(0, 1).reshape([b, width]);
                match bias {
                    Some(bi) => y + ctx.p[*bi].clone(),
                    None => y,
                }
            }
            Op::SinCos { x, n } => {
                let e = width / (2 * n);
                let x3: Tensor<3> = v[x.0].clone().reshape([b, *n, e]);
                Tensor::cat(vec![x3.clone().sin(), x3.cos()], 2).reshape([b, width])
            }
            Op::Transpose { x, n } => {
                let t: Tensor<3> = v[x.0].clone().reshape([b, *n, width / n]);
                t.swap_dims(1, 2).reshape([b, width])
            }
            Op::Outer { a, b: c } => {
                let (wa, wc) = (graph.width(*a), graph.width(*c));
                let a3: Tensor<3> = v[a.0].clone().reshape([b, wa, 1]);
                let c3: Tensor<3> = v[c.0].clone().reshape([b, 1, wc]);
                a3.matmul(c3).reshape([b, width])
            }
            Op::Scale { x, factor, w } => {
                let y = v[x.0].clone().mul_scalar(*factor);
                match w {
                    Some(w) => y * ctx.p[*w].clone().abs().reshape([1, 1]),
                    None => y,
                }
            }
            Op::VariationalDropout { x, p: lp, index } => {
                let lp = ctx.p[*lp].clone();
                let n = lp.dims()[1];
                let rate = sigmoid(lp);
                let keep = if ctx.training {
                    let u: Vec<f32> = (0..b * n).map(|_| ctx.rng.uniform() as f32).collect();
                    let u = ctx.constant(u, b, n);
                    let logit =
                        |q: Tensor<2>| q.clone().add_scalar(VD_EPS).log() - q.neg().add_scalar(1.0 + VD_EPS).log();
                    let z = (logit(rate) + logit(u)).div_scalar(VD_TEMP);
                    sigmoid(z).neg().add_scalar(1.0)
                } else {
                    rate.neg().add_scalar(1.0)
                };
                let flat: Vec<i64> = index.iter().map(|&j| j as i64).collect();
                let idx = Tensor::<1, Int>::from_data(TensorData::new(flat, [width]), ctx.device);
                v[x.0].clone() * keep.select(1, idx)
            }
            Op::Attention {
                q,
                k,
                v: val,
                heads,
                scale,
                keys,
            } => {
                let (f, t, h) = (node.rows, graph.rows(*k), *heads);
                let split =
                    |x: Tensor<2>, n: usize, w: usize| -> Tensor<4> { x.reshape([batch, n, h, w / h]).swap_dims(1, 2) };
                let wq = graph.width(*q);
                let (q4, k4, v4) = (
                    split(v[q.0].clone(), f, wq),
                    split(v[k.0].clone(), t, wq),
                    split(v[val.0].clone(), t, width),
                );
                let s = q4.matmul(k4.swap_dims(2, 3)).mul_scalar(*scale);
                let p = match keys {
                    Keys::All => softmax(s, 3),
                    Keys::Live(len) => {
                        // As MaskedSoftmax, the mask `[batch, 1, 1, keys]`.
                        let mask: Tensor<4> = ctx
                            .constant(prefix_mask(&to_vec(v[len.0].clone()), t), batch, t)
                            .reshape([batch, 1, 1, t]);
                        live_softmax(s, mask)
                    }
                    Keys::Mask(m) => {
                        let m: Tensor<4> = v[m.0].clone().reshape([batch, 1, 1, t]);
                        softmax(s + m.neg().add_scalar(1.0).mul_scalar(MASK_ADDER), 3)
                    }
                };
                p.matmul(v4).swap_dims(1, 2).reshape([b, width])
            }
            Op::AttnPool { w, x } => {
                let n = graph.width(*w);
                let w3: Tensor<3> = v[w.0].clone().reshape([b, 1, n]);
                let x3: Tensor<3> = v[x.0].clone().reshape([b, n, width]);
                w3.matmul(x3).reshape([b, width])
            }
        };
        v.push(y);
    }
    v
}

/// `t` over its L2 norm along the last axis, TensorFlow's `l2_normalize`:
/// `t / sqrt(max(Σ t², L2_EPS))`.
fn l2_normalized<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let norm = (t.clone() * t.clone()).sum_dim(D - 1).clamp_min(L2_EPS).sqrt();
    t / norm
}

/// The softmax over the last axis of `logits` where `mask` (1 or 0,
/// broadcast to it) is 1: masked logits far below the rest, then the mask
/// again, so a row with nothing live is zeros.
fn live_softmax<const D: usize>(logits: Tensor<D>, mask: Tensor<D>) -> Tensor<D> {
    let sunk = logits * mask.clone() + mask.clone().sub_scalar(1.0).mul_scalar(1e9);
    softmax(sunk, D - 1) * mask
}

/// Per length, `n` columns of 1 below it and 0 from it on.
fn prefix_mask(lens: &[f32], n: usize) -> Vec<f32> {
    lens.iter()
        .flat_map(|l| (0..n).map(move |k| if (k as f32) < *l { 1.0 } else { 0.0 }))
        .collect()
}

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
/// `kernels::loss_grad`: the mean over the rows, or with `weights` their
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
/// of `kernels::in_batch_softmax`: `us`, `v`, `u` are `[n, d]`, their
/// first `targets.labels` rows examples (weighing `targets.weights`, else
/// 1) and the rest sampled items, the last of them hard negatives.
pub fn in_batch_loss_of(
    (us, v, u): (Tensor<2>, Tensor<2>, Tensor<2>),
    targets: Targets,
    ignore_in_batch: bool,
) -> Tensor<1> {
    let b = targets.labels.first().map_or(0, Vec::len);
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
/// oracle of `kernels::weighted_loss_grad`: the weighted sum over the
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
        (Reduce::Mean, None) => v.mean(),
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
/// `kernels::kd_loss_grad` (the soft labels are constants).
pub fn kd_loss_of(kd: &KdTerm, logits: Tensor<2>, soft: &[f32]) -> Tensor<1> {
    let device = logits.device();
    let b = soft.len();
    let t = kd.divisor();
    let eps = 1e-7f32;
    let targets: Vec<f32> = soft.iter().map(|&s| super::kernels::kd_target(kd, s) as f32).collect();
    let y = Tensor::<2>::from_data(TensorData::new(targets, [b, 1]), &device);
    let per_row = match kd.kind {
        KdKind::CrossEntropy => {
            let p = sigmoid(logits.div_scalar(t));
            let one_minus = p.clone().neg().add_scalar(1.0);
            let ny = y.clone().neg().add_scalar(1.0);
            (y * p.add_scalar(eps).log() + ny * one_minus.add_scalar(eps).log()).neg()
        }
        KdKind::BinaryCrossEntropy => sigmoid_ce(logits.div_scalar(t), y),
        KdKind::L2 => {
            let d = logits - y;
            d.clone() * d
        }
    };
    per_row.mean().mul_scalar(kd.weight)
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
/// `kernels::task_loss_grad`: its `loss_type`'s, or the weighted sum of
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
                let sigma = softplus_of(z2.clone()).clamp(kernels::ZILN_MIN_SIGMA as f32, zp.max_sigma);
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
