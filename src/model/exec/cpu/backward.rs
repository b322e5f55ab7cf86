//! The CPU executor's backward pass: the nodes in reverse, each op's
//! kernel accumulating its parameters' gradients and handing its operands
//! theirs.

use rayon::prelude::*;

use super::kernels::{self};
use super::{accumulate, capsule, contrast, narrow, split_columns, Saved, Tape};
use crate::model::graph::nary::Nary;
use crate::model::graph::params::ParamStore;
use crate::model::graph::{augment, NodeId, Op, L2_EPS};
use crate::profile::{Level, Work};

impl Tape<'_> {
    /// Backward from the gradients of some nodes (`seeds`): accumulates
    /// every parameter's gradient into `dense` (`ParamStore` layout) and
    /// returns the gradient of each group input (zeros where `needs` says
    /// it is not trained).
    pub fn backward(
        &self,
        p: &ParamStore,
        seeds: Vec<(NodeId, Vec<f32>)>,
        needs: &[bool],
        dense: &mut [f32],
    ) -> Vec<Vec<f32>> {
        let g = self.graph;
        let mut grads: Vec<Option<Vec<f32>>> = vec![None; g.nodes.len()];
        let mut input_grads: Vec<Vec<f32>> = Vec::new();
        for (n, d) in seeds {
            accumulate(&mut grads, needs, n, d);
        }
        for i in (0..g.nodes.len()).rev() {
            let Some(mut dy) = grads[i].take() else { continue };
            // A product's parts are timed apart, below.
            let started = match &g.nodes[i].op {
                Op::Linear { .. } => None,
                _ => self.profile.as_ref().map(|_| std::time::Instant::now()),
            };
            let width = g.nodes[i].width;
            // This node's rows.
            let b = self.b * g.nodes[i].rows;
            match &g.nodes[i].op {
                Op::Input { group } => {
                    if input_grads.len() <= *group {
                        input_grads.resize(group + 1, Vec::new());
                    }
                    input_grads[*group] = dy;
                }
                Op::Linear { x, w, b: bias, act } => {
                    let k = g.width(*x);
                    self.sweep("bwd activation slope, bias gradient", 12 * b * width, || match bias {
                        Some(bi) => {
                            let db = &mut dense[p.specs[*bi].range()];
                            kernels::slope_col_sums(*act, &mut dy, &self.vals[i], width, db);
                        }
                        None => kernels::mul_slope(*act, &mut dy, &self.vals[i], width),
                    });
                    let xv = self.value(*x);
                    let dw = &mut dense[p.specs[*w].range()];
                    self.product("bwd dW = xᵀ·dy", (k, b, width), || {
                        if narrow(k, width) {
                            kernels::narrow_weight_grad(dw, xv, &dy, (k, width));
                        } else {
                            kernels::matmul(dw, xv, true, &dy, false, (k, b, width), true);
                        }
                    });
                    if needs[x.0] {
                        // Into the input's gradient so far, when another
                        // reader of it already gave one (MMoE's experts and
                        // gates), rather than a new matrix added to it.
                        let before = grads[x.0].take();
                        let dx = self.product("bwd dx = dy·Wᵀ", (b, width, k), || match before {
                            Some(mut dx) => {
                                if narrow(k, width) {
                                    kernels::narrow_input_grad(&mut dx, &dy, p.slice(*w), (k, width), true);
                                } else {
                                    kernels::matmul(&mut dx, &dy, false, p.slice(*w), true, (b, width, k), true);
                                }
                                dx
                            }
                            None if narrow(k, width) => {
                                let mut dx = vec![0.0f32; b * k];
                                kernels::narrow_input_grad(&mut dx, &dy, p.slice(*w), (k, width), false);
                                dx
                            }
                            None => kernels::matmul_new(&dy, false, p.slice(*w), true, (b, width, k)),
                        });
                        grads[x.0] = Some(dx);
                    }
                }
                Op::BatchNorm {
                    x,
                    gamma,
                    beta,
                    act,
                    examples_only,
                    fixed,
                    ..
                } => {
                    let Saved::Bn { xhat, inv } = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    kernels::mul_slope(*act, &mut dy, &self.vals[i], width);
                    // Fixed statistics: no row moves a mean or variance.
                    let rows = if *fixed {
                        0
                    } else if *examples_only {
                        self.examples * g.nodes[i].rows
                    } else {
                        b
                    };
                    let (dgamma, dbeta) = kernels::bn_bwd(&mut dy, xhat, inv, p.slice(*gamma), rows);
                    for (param, sums) in [(*gamma, &dgamma), (*beta, &dbeta)] {
                        dense[p.specs[param].range()]
                            .iter_mut()
                            .zip(sums)
                            .for_each(|(d, s)| *d += *s as f32);
                    }
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::Act { x, act } => {
                    kernels::mul_slope(*act, &mut dy, &self.vals[i], width);
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::Dice { x, alpha, .. } => {
                    let Saved::Dice { xhat, inv, p: gate } = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    let a = p.slice(*alpha);
                    let xv = self.value(*x);
                    // y = x (p + a (1 - p)): through x directly, through the
                    // gate's normalised input, and into `alpha`.
                    let mut dalpha = vec![0.0f64; width];
                    let mut dz = vec![0.0f32; dy.len()];
                    let mut direct = vec![0.0f32; dy.len()];
                    for (r, ((d, xr), pr)) in dy
                        .chunks_exact(width)
                        .zip(xv.chunks_exact(width))
                        .zip(gate.chunks_exact(width))
                        .enumerate()
                    {
                        for c in 0..width {
                            let k = r * width + c;
                            dalpha[c] += (d[c] * xr[c] * (1.0 - pr[c])) as f64;
                            dz[k] = d[c] * xr[c] * (1.0 - a[c]) * pr[c] * (1.0 - pr[c]);
                            direct[k] = d[c] * (pr[c] + a[c] * (1.0 - pr[c]));
                        }
                    }
                    dense[p.specs[*alpha].range()]
                        .iter_mut()
                        .zip(&dalpha)
                        .for_each(|(d, s)| *d += *s as f32);
                    if needs[x.0] {
                        let ones = vec![1.0f32; width];
                        kernels::bn_bwd(&mut dz, xhat, inv, &ones, b);
                        dz.iter_mut().zip(&direct).for_each(|(g, d)| *g += d);
                        accumulate(&mut grads, needs, *x, dz);
                    }
                }
                Op::SeqAugment { x, mask, n, .. } => {
                    let Saved::Plan(plans) = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    let d = p.specs[*mask].len();
                    let mut dx = vec![0.0f32; b * n * d];
                    let mut dm = vec![0.0f64; d];
                    for ((dyr, dxr), pr) in dy
                        .chunks_exact(width)
                        .zip(dx.chunks_exact_mut(n * d))
                        .zip(plans.chunks_exact(*n))
                    {
                        for (j, &s) in pr.iter().enumerate() {
                            let g = &dyr[j * d..(j + 1) * d];
                            match s {
                                augment::EMPTY => {}
                                augment::MASKED => dm.iter_mut().zip(g).for_each(|(m, v)| *m += *v as f64),
                                s => {
                                    let s = s as usize;
                                    dxr[s * d..(s + 1) * d].iter_mut().zip(g).for_each(|(o, v)| *o += v);
                                }
                            }
                        }
                    }
                    dense[p.specs[*mask].range()]
                        .iter_mut()
                        .zip(&dm)
                        .for_each(|(o, v)| *o += *v as f32);
                    accumulate(&mut grads, needs, *x, dx);
                }
                Op::Contrastive { a, b: other, kind } => {
                    let Saved::Probs(probs) = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    let values = (self.value(*a), self.value(*other));
                    let shape = (g.width(*a), self.examples, b);
                    let (da, db) = contrast::backward(*kind, values, shape, probs, &dy);
                    accumulate(&mut grads, needs, *a, da);
                    accumulate(&mut grads, needs, *other, db);
                }
                Op::Dropout { x, .. } => {
                    let Saved::Mask(mask) = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    dy.iter_mut().zip(mask).for_each(|(g, m)| *g *= m);
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::VariationalDropout { x, p: lp, index } => {
                    let Saved::Keep { keep, dkeep } = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    let n = p.specs[*lp].len();
                    let mut dp = vec![0.0f64; n];
                    let xv = self.value(*x);
                    for (r, (dyr, xr)) in dy.chunks_exact_mut(width).zip(xv.chunks_exact(width)).enumerate() {
                        let (k, dk) = (&keep[r * n..(r + 1) * n], &dkeep[r * n..(r + 1) * n]);
                        for ((d, v), j) in dyr.iter_mut().zip(xr).zip(index) {
                            dp[*j] += (*d as f64) * (*v as f64) * dk[*j] as f64;
                            *d *= k[*j];
                        }
                    }
                    dense[p.specs[*lp].range()]
                        .iter_mut()
                        .zip(dp)
                        .for_each(|(d, s)| *d += s as f32);
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::Concat(xs) => {
                    let widths: Vec<usize> = xs.iter().map(|x| g.width(*x)).collect();
                    for (x, d) in xs.iter().zip(split_columns(&dy, width, &widths)) {
                        accumulate(&mut grads, needs, *x, d);
                    }
                }
                Op::Slice { x, start } => {
                    if needs[x.0] {
                        let w = g.width(*x);
                        let mut dx = vec![0.0f32; b * w];
                        dx.par_chunks_mut(w).zip(dy.par_chunks(width)).for_each(|(row, d)| {
                            row[*start..start + width].copy_from_slice(d);
                        });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::Add(xs) => {
                    for x in xs {
                        accumulate(&mut grads, needs, *x, dy.clone());
                    }
                }
                Op::Mul(a, c) => {
                    for (x, other) in [(*a, *c), (*c, *a)] {
                        if needs[x.0] {
                            let d = dy.iter().zip(self.value(other)).map(|(g, v)| g * v).collect();
                            accumulate(&mut grads, needs, x, d);
                        }
                    }
                }
                Op::SumBlocks { x, n } => {
                    if needs[x.0] {
                        let mut dx = vec![0.0f32; b * n * width];
                        dx.par_chunks_mut(n * width)
                            .zip(dy.par_chunks(width))
                            .with_min_len(kernels::ROWS)
                            .for_each(|(row, d)| {
                                row.chunks_exact_mut(width).for_each(|blk| blk.copy_from_slice(d));
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::MaxBlocks { x, n } => {
                    if needs[x.0] {
                        let mut dx = vec![0.0f32; b * n * width];
                        let (xv, yv) = (self.value(*x), &self.vals[i]);
                        dx.par_chunks_mut(n * width)
                            .zip(xv.par_chunks(n * width))
                            .zip(yv.par_chunks(width).zip(dy.par_chunks(width)))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((out, row), (y, d))| {
                                for c in 0..width {
                                    let ties = (0..*n).filter(|k| row[k * width + c] == y[c]).count();
                                    let share = d[c] / ties.max(1) as f32;
                                    for k in (0..*n).filter(|k| row[k * width + c] == y[c]) {
                                        out[k * width + c] = share;
                                    }
                                }
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::Fm { x, n } => {
                    if needs[x.0] {
                        let d = width;
                        let xv = self.value(*x);
                        let mut dx = vec![0.0f32; b * n * d];
                        dx.par_chunks_mut(n * d)
                            .zip(xv.par_chunks(n * d))
                            .zip(dy.par_chunks(d))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((out, row), g)| {
                                for c in 0..d {
                                    let s: f32 = (0..*n).map(|k| row[k * d + c]).sum();
                                    for k in 0..*n {
                                        out[k * d + c] = g[c] * (s - row[k * d + c]);
                                    }
                                }
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::RowSum { x } => {
                    if needs[x.0] {
                        let w = g.width(*x);
                        let dx = dy.iter().flat_map(|v| std::iter::repeat_n(*v, w)).collect();
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::Dot { xs, dim, pairs } => {
                    for (x, d) in xs.iter().zip(self.dot_bwd(b, xs, *dim, pairs, &dy)) {
                        accumulate(&mut grads, needs, *x, d);
                    }
                }
                Op::Cross { x0, xl, w, b: bias } => {
                    let Saved::Scalars(s) = &self.saved[i] else {
                        unreachable!("cross keeps its row scalars")
                    };
                    // One sweep over row blocks (the matrices outgrow the
                    // caches; separate passes each read them again): per
                    // row ds = dy · x0, the bias and weight gradients' block
                    // sums, x0's gradient dy * s added in place, and dy
                    // turned into xl's gradient dy + ds * w.
                    const BLOCK: usize = 4 * kernels::ROWS;
                    let d = width.max(1);
                    let (x0v, xlv, wv) = (self.value(*x0), self.value(*xl), p.slice(*w));
                    let (mut dx0, acc) = match grads[x0.0].take() {
                        Some(g) => (g, true),
                        None => (vec![0.0f32; b * width], false),
                    };
                    let parts: Vec<(Vec<f32>, Vec<f32>)> = dy
                        .par_chunks_mut(d * BLOCK)
                        .zip(dx0.par_chunks_mut(d * BLOCK))
                        .zip(x0v.par_chunks(d * BLOCK))
                        .zip(xlv.par_chunks(d * BLOCK))
                        .zip(s.par_chunks(BLOCK))
                        .map(|((((g, o), x0b), xlb), sb)| {
                            let (mut db, mut dw) = (vec![0.0f32; d], vec![0.0f32; d]);
                            let rows = g.chunks_exact_mut(d).zip(o.chunks_exact_mut(d));
                            for (((g, o), (x0r, xr)), s) in
                                rows.zip(x0b.chunks_exact(d).zip(xlb.chunks_exact(d))).zip(sb)
                            {
                                let ds = kernels::dot(g, x0r);
                                db.iter_mut().zip(&*g).for_each(|(a, v)| *a += v);
                                dw.iter_mut().zip(xr).for_each(|(a, v)| *a += ds * v);
                                if acc {
                                    o.iter_mut().zip(&*g).for_each(|(o, v)| *o += v * s);
                                } else {
                                    o.iter_mut().zip(&*g).for_each(|(o, v)| *o = v * s);
                                }
                                g.iter_mut().zip(wv).for_each(|(o, w)| *o += ds * w);
                            }
                            (db, dw)
                        })
                        .collect();
                    for (db, dw) in parts {
                        let sums = [(*bias, db), (*w, dw)];
                        for (param, part) in sums {
                            dense[p.specs[param].range()]
                                .iter_mut()
                                .zip(part)
                                .for_each(|(a, v)| *a += v);
                        }
                    }
                    if needs[x0.0] {
                        grads[x0.0] = Some(dx0);
                    }
                    accumulate(&mut grads, needs, *xl, dy);
                }
                // Masked columns have y = 0, so their gradient is 0 too.
                Op::Softmax { x } | Op::MaskedSoftmax { x, .. } => {
                    let y = &self.vals[i];
                    dy.par_chunks_mut(width).zip(y.par_chunks(width)).for_each(|(g, y)| {
                        let dot: f32 = g.iter().zip(y).map(|(a, b)| a * b).sum();
                        g.iter_mut().zip(y).for_each(|(g, y)| *g = y * (*g - dot));
                    });
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::WeightedSum { gate, xs } => {
                    let k = xs.len();
                    let gv = self.value(*gate);
                    // Row blocks in parallel: per-row work is a few dot
                    // products, too little for a task of its own.
                    const BLOCK: usize = 64;
                    let width = width.max(1);
                    if needs[gate.0] {
                        let mut dgate = vec![0.0f32; b * k];
                        let xvs: Vec<&[f32]> = xs.iter().map(|x| self.value(*x)).collect();
                        dgate
                            .par_chunks_mut(k * BLOCK)
                            .zip(dy.par_chunks(width * BLOCK))
                            .enumerate()
                            .for_each(|(blk, (out, d))| {
                                for (r, (o, g)) in out.chunks_exact_mut(k).zip(d.chunks_exact(width)).enumerate() {
                                    let at = (blk * BLOCK + r) * width;
                                    for (oe, xv) in o.iter_mut().zip(&xvs) {
                                        *oe = kernels::dot(g, &xv[at..at + width]);
                                    }
                                }
                            });
                        accumulate(&mut grads, needs, *gate, dgate);
                    }
                    for (e, x) in xs.iter().enumerate() {
                        if needs[x.0] {
                            let mut dx = vec![0.0f32; b * width];
                            dx.par_chunks_mut(width * BLOCK)
                                .zip(dy.par_chunks(width * BLOCK))
                                .enumerate()
                                .for_each(|(blk, (o, d))| {
                                    for (r, (o, d)) in o.chunks_exact_mut(width).zip(d.chunks_exact(width)).enumerate()
                                    {
                                        let s = gv[(blk * BLOCK + r) * k + e];
                                        o.iter_mut().zip(d).for_each(|(o, d)| *o = d * s);
                                    }
                                });
                            accumulate(&mut grads, needs, *x, dx);
                        }
                    }
                }
                Op::Zeros { .. }
                | Op::StopGradient { .. }
                | Op::PrefixMask { .. }
                | Op::Capsules { .. }
                | Op::CapsuleRouting { .. } => {}
                Op::InterestSimilarity { x, caps, max_k } => {
                    let wx = g.width(*x);
                    let mut dx = vec![0.0f32; self.b * wx];
                    dx.par_chunks_mut(wx.max(1))
                        .zip(self.value(*x).par_chunks(wx.max(1)))
                        .zip(self.value(*caps).par_iter().zip(dy.par_chunks(2)))
                        .with_min_len(kernels::ROWS)
                        .for_each(|((o, row), (c, d))| {
                            let (_, grad) = capsule::interest_similarity(row, wx / max_k, *c);
                            o.copy_from_slice(&grad(d[0]));
                        });
                    accumulate(&mut grads, needs, *x, dx);
                }
                Op::Squash { x, pow, ratio } => {
                    let mut dx = vec![0.0f32; dy.len()];
                    dx.par_chunks_mut(width.max(1))
                        .zip(self.value(*x).par_chunks(width.max(1)))
                        .zip(dy.par_chunks(width.max(1)))
                        .with_min_len(kernels::ROWS)
                        .for_each(|((o, xr), d)| o.copy_from_slice(&capsule::squash_grad(xr, d, *pow, *ratio)));
                    accumulate(&mut grads, needs, *x, dx);
                }
                Op::Bias { x, b: bias } => {
                    kernels::add_col_sums(&dy, width, &mut dense[p.specs[*bias].range()]);
                    accumulate(&mut grads, needs, *x, dy);
                }
                Op::L2Normalize { x } => {
                    if needs[x.0] {
                        let Saved::Scalars(inv) = &self.saved[i] else {
                            unreachable!("l2 normalisation saves its row scales")
                        };
                        // Rows whose norm is floored are a constant scaling.
                        let mut dx = dy;
                        dx.par_chunks_mut(width.max(1))
                            .zip(self.vals[i].par_chunks(width.max(1)))
                            .zip(self.value(*x).par_chunks(width.max(1)))
                            .zip(inv.par_iter())
                            .with_min_len(kernels::ROWS)
                            .for_each(|(((d, y), xr), iv)| {
                                let floored = xr.iter().map(|v| v * v).sum::<f32>() <= L2_EPS;
                                let yd: f32 = if floored {
                                    0.0
                                } else {
                                    y.iter().zip(d.iter()).map(|(a, b)| a * b).sum()
                                };
                                d.iter_mut().zip(y).for_each(|(d, y)| *d = iv * (*d - y * yd));
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::Shift { x, .. } => accumulate(&mut grads, needs, *x, dy),
                Op::GroupedLinear { x, w, b: bias, n } => {
                    let (wi, din) = (g.width(*x) / n, g.width(*x));
                    let dout = width / n;
                    let xv = self.value(*x);
                    // dW_k = x_kᵀ dy_k over the rows; db = dy's column sums.
                    let dw = &mut dense[p.specs[*w].range()];
                    for (row, d) in xv.chunks_exact(din).zip(dy.chunks_exact(width)) {
                        for k in 0..*n {
                            let dk = &d[k * dout..][..dout];
                            for i in 0..wi {
                                let xv = row[k * wi + i];
                                let o = &mut dw[(k * wi + i) * dout..][..dout];
                                o.iter_mut().zip(dk).for_each(|(o, g)| *o += xv * g);
                            }
                        }
                    }
                    if let Some(bi) = bias {
                        kernels::add_col_sums(&dy, width, &mut dense[p.specs[*bi].range()]);
                    }
                    if needs[x.0] {
                        let wv = p.slice(*w);
                        let mut dx = vec![0.0f32; b * din];
                        dx.par_chunks_mut(din).zip(dy.par_chunks(width)).for_each(|(o, d)| {
                            for k in 0..*n {
                                let dk = &d[k * dout..][..dout];
                                for i in 0..wi {
                                    let wr = &wv[(k * wi + i) * dout..][..dout];
                                    o[k * wi + i] = wr.iter().zip(dk).map(|(w, g)| w * g).sum();
                                }
                            }
                        });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::NaryEmbed {
                    x,
                    table,
                    nary,
                    cols: (c0, w),
                } => {
                    // Into the table's rows only: the cast to integers
                    // passes nothing back to `x`.
                    let (n, bases) = (g.width(*x), nary.carries.len());
                    let tcols = p.specs[*table].cols;
                    let dt = &mut dense[p.specs[*table].range()];
                    for (row, d) in self.value(*x).chunks_exact(n).zip(dy.chunks_exact(width)) {
                        for (f, &v) in row.iter().enumerate() {
                            let u = Nary::value(v);
                            for k in 0..bases {
                                let dk = &d[(f * bases + k) * w..][..*w];
                                let s = if nary.mean {
                                    1.0 / nary.rows(f, k, u, |_| ()) as f32
                                } else {
                                    1.0
                                };
                                nary.rows(f, k, u, |r| {
                                    let o = &mut dt[r * tcols + c0..][..*w];
                                    o.iter_mut().zip(dk).for_each(|(o, g)| *o += s * g);
                                });
                            }
                        }
                    }
                }
                Op::SinCos { x, n } => {
                    let e = width / (2 * n);
                    let mut dx = vec![0.0f32; b * width / 2];
                    dx.par_chunks_mut(width / 2)
                        .zip(self.value(*x).par_chunks(width / 2))
                        .zip(dy.par_chunks(width))
                        .with_min_len(kernels::ROWS)
                        .for_each(|((o, row), d)| {
                            for ((o, blk), d) in o
                                .chunks_exact_mut(e)
                                .zip(row.chunks_exact(e))
                                .zip(d.chunks_exact(2 * e))
                            {
                                let (ds, dc) = d.split_at(e);
                                for (((o, v), ds), dc) in o.iter_mut().zip(blk).zip(ds).zip(dc) {
                                    let (s, c) = v.sin_cos();
                                    *o = ds * c - dc * s;
                                }
                            }
                        });
                    accumulate(&mut grads, needs, *x, dx);
                }
                // The transpose of `[n, m]` is `[m, n]`: transposing back.
                Op::Transpose { x, n } => {
                    let m = width / n;
                    accumulate(&mut grads, needs, *x, kernels::transpose_rows(&dy, width, m));
                }
                Op::Outer { a, b: c } => {
                    let (wa, wc) = (g.width(*a), g.width(*c));
                    let (av, cv) = (self.value(*a), self.value(*c));
                    if needs[a.0] {
                        let mut da = vec![0.0f32; b * wa];
                        da.par_chunks_mut(wa.max(1))
                            .zip(dy.par_chunks(width.max(1)))
                            .zip(cv.par_chunks(wc.max(1)))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((o, d), cr)| {
                                for (o, blk) in o.iter_mut().zip(d.chunks_exact(wc)) {
                                    *o = blk.iter().zip(cr).map(|(g, y)| g * y).sum();
                                }
                            });
                        accumulate(&mut grads, needs, *a, da);
                    }
                    if needs[c.0] {
                        let mut dc = vec![0.0f32; b * wc];
                        dc.par_chunks_mut(wc.max(1))
                            .zip(dy.par_chunks(width.max(1)))
                            .zip(av.par_chunks(wa.max(1)))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((o, d), ar)| {
                                for (blk, x) in d.chunks_exact(wc).zip(ar) {
                                    o.iter_mut().zip(blk).for_each(|(o, g)| *o += g * x);
                                }
                            });
                        accumulate(&mut grads, needs, *c, dc);
                    }
                }
                Op::Scale { x, factor, w } => {
                    let wv = w.map_or(1.0, |w| p.slice(w)[0]);
                    if let Some(w) = w {
                        let dot: f64 = dy
                            .iter()
                            .zip(self.value(*x))
                            .map(|(d, v)| (*d as f64) * (*v as f64))
                            .sum();
                        // d|w|/dw: the sign, 0 at 0 as TensorFlow's abs has it.
                        let sign = if wv == 0.0 { 0.0 } else { wv.signum() as f64 };
                        dense[p.specs[*w].range()][0] += (dot * (*factor as f64) * sign) as f32;
                    }
                    if needs[x.0] {
                        let s = factor * wv.abs();
                        accumulate(&mut grads, needs, *x, dy.iter().map(|d| d * s).collect());
                    }
                }
                Op::ProductLogit { a, b: c } => {
                    let (va, vc) = (self.value(*a), self.value(*c));
                    let (mut da, mut dc) = (vec![0.0f32; dy.len()], vec![0.0f32; dy.len()]);
                    for (k, d) in dy.iter().enumerate() {
                        let (_, sa, sc) = kernels::product_logit(va[k], vc[k]);
                        da[k] = d * sa;
                        dc[k] = d * sc;
                    }
                    accumulate(&mut grads, needs, *a, da);
                    accumulate(&mut grads, needs, *c, dc);
                }
                Op::Sub(a, c) => {
                    if needs[c.0] {
                        accumulate(&mut grads, needs, *c, dy.iter().map(|v| -v).collect());
                    }
                    accumulate(&mut grads, needs, *a, dy);
                }
                Op::Tile { x, n } => {
                    if needs[x.0] {
                        let mut dx = vec![0.0f32; b / n * width];
                        dx.par_chunks_mut(width.max(1))
                            .zip(dy.par_chunks(n * width.max(1)))
                            .with_min_len(kernels::ROWS)
                            .for_each(|(o, copies)| {
                                for c in copies.chunks_exact(width) {
                                    o.iter_mut().zip(c).for_each(|(o, v)| *o += v);
                                }
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::Unfold { x, .. } | Op::Fold { x, .. } => accumulate(&mut grads, needs, *x, dy),
                Op::Attention {
                    q, k, v, heads, scale, ..
                } => {
                    let Saved::Probs(probs) = &self.saved[i] else {
                        unreachable!("attention saves its weights")
                    };
                    let (f, t) = (b / self.b, g.rows(*k));
                    let wq = g.width(*q);
                    let (mut dq, mut dk, mut dv) = (
                        vec![0.0f32; b * wq],
                        vec![0.0f32; self.b * t * wq],
                        vec![0.0f32; self.b * t * width],
                    );
                    dq.par_chunks_mut(f * wq)
                        .zip(dk.par_chunks_mut(t * wq))
                        .zip(dv.par_chunks_mut(t * width))
                        .zip(probs.par_chunks((heads * f * t).max(1)))
                        .zip(dy.par_chunks(f * width))
                        .enumerate()
                        .with_min_len(kernels::ROWS)
                        .for_each(|(e, ((((dq, dk), dv), p), d))| {
                            let qkv = (
                                &self.value(*q)[e * f * wq..][..f * wq],
                                &self.value(*k)[e * t * wq..][..t * wq],
                                &self.value(*v)[e * t * width..][..t * width],
                            );
                            kernels::attention_bwd(qkv, (*heads, *scale), (f, t), (p, d), (dq, dk, dv));
                        });
                    accumulate(&mut grads, needs, *q, dq);
                    accumulate(&mut grads, needs, *k, dk);
                    accumulate(&mut grads, needs, *v, dv);
                }
                Op::AttnPool { w, x } => {
                    let n = g.width(*w);
                    let (wv, xv) = (self.value(*w), self.value(*x));
                    if needs[w.0] {
                        let mut dw = vec![0.0f32; b * n];
                        dw.par_chunks_mut(n)
                            .zip(xv.par_chunks(n * width))
                            .zip(dy.par_chunks(width))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((o, xr), d)| {
                                for (o, blk) in o.iter_mut().zip(xr.chunks_exact(width)) {
                                    *o = blk.iter().zip(d).map(|(a, b)| a * b).sum();
                                }
                            });
                        accumulate(&mut grads, needs, *w, dw);
                    }
                    if needs[x.0] {
                        let mut dx = vec![0.0f32; b * n * width];
                        dx.par_chunks_mut(n * width)
                            .zip(wv.par_chunks(n))
                            .zip(dy.par_chunks(width))
                            .with_min_len(kernels::ROWS)
                            .for_each(|((o, wr), d)| {
                                for (blk, wk) in o.chunks_exact_mut(width).zip(wr) {
                                    blk.iter_mut().zip(d).for_each(|(o, v)| *o = wk * v);
                                }
                            });
                        accumulate(&mut grads, needs, *x, dx);
                    }
                }
                Op::LayerNorm { x, gamma, beta, .. } => {
                    let Saved::Ln { xhat, inv } = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    let scaled: Vec<f32> = dy.iter().zip(xhat).map(|(d, h)| d * h).collect();
                    kernels::add_col_sums(&scaled, width, &mut dense[p.specs[*gamma].range()]);
                    kernels::add_col_sums(&dy, width, &mut dense[p.specs[*beta].range()]);
                    if needs[x.0] {
                        let gm = p.slice(*gamma);
                        dy.par_chunks_mut(width)
                            .zip(xhat.par_chunks(width))
                            .zip(inv.par_iter())
                            .with_min_len(kernels::ROWS)
                            .for_each(|((d, h), iv)| {
                                let n = width as f32;
                                d.iter_mut().zip(gm).for_each(|(d, g)| *d *= g);
                                let mean_d = d.iter().sum::<f32>() / n;
                                let mean_dh = d.iter().zip(h).map(|(d, h)| d * h).sum::<f32>() / n;
                                d.iter_mut()
                                    .zip(h)
                                    .for_each(|(d, h)| *d = iv * (*d - mean_d - h * mean_dh));
                            });
                        accumulate(&mut grads, needs, *x, dy);
                    }
                }
            }
            if let (Some(t), Some(p)) = (started, self.profile.as_deref()) {
                let name = format!("bwd {}", super::op_kind(&g.nodes[i].op));
                let bytes = self.bytes_moved(NodeId(i)) * 2.0;
                p.record(Level::Op, name, t.elapsed().as_secs_f64(), Some(Work::Bytes(bytes)));
            }
        }
        // Every group input gets a gradient, zeros where none flowed.
        let mut out = Vec::new();
        for node in &g.nodes {
            if let Op::Input { group } = node.op {
                if out.len() <= group {
                    out.resize(group + 1, Vec::new());
                }
                out[group] = input_grads
                    .get_mut(group)
                    .map(std::mem::take)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| vec![0.0; self.b * node.width]);
            }
        }
        out
    }
}
