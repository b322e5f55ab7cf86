//! The CPU executor's forward pass: each op's kernel over the values of
//! its operands, keeping what its backward needs.

use rayon::prelude::*;

use super::kernels::{self, RowKeys};
use super::{capsule, column_stats, contrast, narrow, Saved, Tape};
use crate::model::exec::Mode;
use crate::model::graph::nary::Nary;
use crate::model::graph::params::ParamStore;
use crate::model::graph::{augment, Keys, NodeId, Op, DICE_EPS};

impl Tape<'_> {
    pub(super) fn run(
        &self,
        op: &Op,
        (width, rows): (usize, usize),
        (p, buffers): (&ParamStore, &ParamStore),
        mode: &mut Mode,
    ) -> (Vec<f32>, Saved) {
        // This node's rows: `rows` per batch row.
        let b = self.b * rows;
        let w_of = |x: &NodeId| self.graph.width(*x);
        match op {
            Op::Input { .. } => (Vec::new(), Saved::None),
            Op::Linear { x, w, b: bias, act } => {
                let k = w_of(x);
                let mut y = self.product("fwd x·W", (b, k, width), || {
                    if narrow(k, width) {
                        let mut y = vec![0.0f32; b * width];
                        kernels::narrow_matmul(&mut y, self.value(*x), p.slice(*w), (k, width));
                        y
                    } else {
                        kernels::matmul_new(self.value(*x), false, p.slice(*w), false, (b, k, width))
                    }
                });
                self.sweep("fwd bias+activation", 8 * b * width, || {
                    kernels::bias_act(&mut y, width, bias.map(|i| p.slice(i)), *act)
                });
                (y, Saved::None)
            }
            Op::BatchNorm {
                x,
                gamma,
                beta,
                mean,
                var,
                act,
                examples_only,
                fixed,
            } => {
                let mut z = self.value(*x).to_vec();
                let stat_rows = if *examples_only { self.examples * rows } else { b };
                let (m, v, train) = if *fixed {
                    let (m, v) = (buffers.slice(*mean).to_vec(), buffers.slice(*var).to_vec());
                    (m, v, matches!(mode, Mode::Train { .. }))
                } else {
                    column_stats(mode, &z[..stat_rows * width], width, (*mean, *var), buffers)
                };
                let inv = kernels::bn_inv(&v);
                let a = kernels::bn_apply(&mut z, width, (&m, &inv), (p.slice(*gamma), p.slice(*beta)), *act);
                (a, if train { Saved::Bn { xhat: z, inv } } else { Saved::None })
            }
            Op::Act { x, act } => {
                let mut y = self.value(*x).to_vec();
                kernels::bias_act(&mut y, width, None, *act);
                (y, Saved::None)
            }
            Op::Dice { x, alpha, mean, var } => {
                let z = self.value(*x);
                let (m, v, train) = column_stats(mode, z, width, (*mean, *var), buffers);
                let inv: Vec<f32> = v.iter().map(|v| 1.0 / (v + DICE_EPS).sqrt()).collect();
                let xhat: Vec<f32> = z
                    .chunks_exact(width.max(1))
                    .flat_map(|r| r.iter().zip(&m).zip(&inv).map(|((x, m), i)| (x - m) * i))
                    .collect();
                let (y, pg) = kernels::dice(z, &xhat, p.slice(*alpha));
                (
                    y,
                    if train {
                        Saved::Dice { xhat, inv, p: pg }
                    } else {
                        Saved::None
                    },
                )
            }
            Op::Dropout { x, rate } => match mode {
                Mode::Train { rng, .. } => {
                    let mask = kernels::dropout_mask(*rate, b * width, rng);
                    let y = self.value(*x).iter().zip(&mask).map(|(a, m)| a * m).collect();
                    (y, Saved::Mask(mask))
                }
                Mode::Infer => (self.value(*x).to_vec(), Saved::None),
            },
            Op::VariationalDropout { x, p: lp, index } => {
                let lp = p.slice(*lp);
                let (keep, dkeep) = match mode {
                    Mode::Train { rng, .. } => {
                        let u: Vec<f32> = (0..b * lp.len()).map(|_| rng.uniform() as f32).collect();
                        kernels::concrete_keep(lp, b, Some(&u))
                    }
                    Mode::Infer => kernels::concrete_keep(lp, b, None),
                };
                let n = lp.len();
                let mut y = self.value(*x).to_vec();
                y.par_chunks_mut(width)
                    .zip(keep.par_chunks(n))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(row, k)| row.iter_mut().zip(index).for_each(|(v, j)| *v *= k[*j]));
                let saved = match mode {
                    Mode::Train { .. } => Saved::Keep { keep, dkeep },
                    Mode::Infer => Saved::None,
                };
                (y, saved)
            }
            Op::SeqAugment { x, len, mask, n, aug } => match mode {
                Mode::Train { rng, .. } => {
                    let (plans, lens) = aug.plans(self.value(*len), *n, rng);
                    let y = augment::apply(self.value(*x), &plans, &lens, p.slice(*mask), *n);
                    (y, Saved::Plan(plans))
                }
                Mode::Infer => {
                    let xw = w_of(x);
                    let mut y = Vec::with_capacity(b * width);
                    for (r, l) in self.value(*x).chunks_exact(xw).zip(self.value(*len)) {
                        y.extend_from_slice(r);
                        y.push(*l);
                    }
                    (y, Saved::None)
                }
            },
            Op::Contrastive { a, b: other, kind } => {
                let values = (self.value(*a), self.value(*other));
                let (y, probs) = contrast::forward(*kind, values, w_of(a), self.examples, b);
                match mode {
                    Mode::Train { .. } => (y, Saved::Probs(probs)),
                    Mode::Infer => (y, Saved::None),
                }
            }
            Op::Concat(xs) => {
                // Each output row written once, its parts in turn.
                let parts: Vec<(&[f32], usize)> = xs.iter().map(|x| (self.value(*x), w_of(x))).collect();
                assert_eq!(
                    parts.iter().map(|p| p.1).sum::<usize>(),
                    width,
                    "a concatenation's width"
                );
                // SAFETY: the parts' widths add up to the row's (asserted),
                // and each part's values are written in turn.
                let y = unsafe {
                    kernels::written_rows(b, width, |r, mut out| {
                        for &(v, w) in &parts {
                            out = kernels::write_row(out, &v[r * w..(r + 1) * w]);
                        }
                    })
                };
                (y, Saved::None)
            }
            Op::Slice { x, start } => {
                let (w, v) = (w_of(x), self.value(*x));
                // SAFETY: each row is given `width` values (a slice of
                // that length, or a panic out of bounds).
                let y = unsafe {
                    kernels::written_rows(b, width, |r, out| {
                        kernels::write_row(out, &v[r * w + start..r * w + start + width]);
                    })
                };
                (y, Saved::None)
            }
            Op::Add(xs) => {
                let mut y = self.value(xs[0]).to_vec();
                for x in &xs[1..] {
                    y.par_iter_mut().zip(self.value(*x)).for_each(|(a, v)| *a += v);
                }
                (y, Saved::None)
            }
            Op::Mul(a, c) => {
                let y = self.value(*a).iter().zip(self.value(*c)).map(|(x, y)| x * y).collect();
                (y, Saved::None)
            }
            Op::SumBlocks { x, n } => {
                let d = width;
                let mut y = vec![0.0f32; b * d];
                y.par_chunks_mut(d)
                    .zip(self.value(*x).par_chunks(n * d))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| {
                        for blk in row.chunks_exact(d) {
                            out.iter_mut().zip(blk).for_each(|(o, v)| *o += v);
                        }
                    });
                (y, Saved::None)
            }
            Op::MaxBlocks { x, n } => {
                let d = width;
                let mut y = vec![0.0f32; b * d];
                y.par_chunks_mut(d)
                    .zip(self.value(*x).par_chunks(n * d))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| {
                        out.copy_from_slice(&row[..d]);
                        for blk in row.chunks_exact(d).skip(1) {
                            out.iter_mut().zip(blk).for_each(|(o, v)| *o = o.max(*v));
                        }
                    });
                (y, Saved::None)
            }
            Op::Fm { x, n } => {
                let d = width;
                let mut y = vec![0.0f32; b * d];
                y.par_chunks_mut(d)
                    .zip(self.value(*x).par_chunks(n * d))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| {
                        for c in 0..d {
                            let (mut s, mut sq) = (0.0f32, 0.0f32);
                            for k in 0..*n {
                                let v = row[k * d + c];
                                s += v;
                                sq += v * v;
                            }
                            out[c] = 0.5 * (s * s - sq);
                        }
                    });
                (y, Saved::None)
            }
            Op::RowSum { x } => {
                let w = w_of(x);
                let y = self.value(*x).chunks_exact(w.max(1)).map(|r| r.iter().sum()).collect();
                (y, Saved::None)
            }
            Op::Dot { xs, dim, pairs } => (self.dot_fwd(b, xs, *dim, pairs), Saved::None),
            Op::Cross { x0, xl, w, b: bias } => {
                // One sweep per row: its scalar xl · w, then the output.
                let d = width.max(1);
                let (wv, bias) = (p.slice(*w), p.slice(*bias));
                // The output written once, not zeroed first.
                let (mut y, mut s) = (Vec::with_capacity(b * width), vec![0.0f32; b]);
                y.spare_capacity_mut()[..b * width]
                    .par_chunks_mut(d)
                    .zip(s.par_iter_mut())
                    .zip(self.value(*xl).par_chunks(d))
                    .zip(self.value(*x0).par_chunks(d))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(((out, sr), xr), x0r)| {
                        *sr = kernels::dot(xr, wv);
                        for c in 0..d {
                            out[c].write(xr[c] + (x0r[c] * *sr + bias[c]));
                        }
                    });
                // SAFETY: the capacity holds b * width values and every row
                // of them (width values each) was written above.
                unsafe { y.set_len(b * width) };
                (y, Saved::Scalars(s))
            }
            Op::Softmax { x } => {
                let mut y = self.value(*x).to_vec();
                y.par_chunks_mut(width).for_each(kernels::softmax_in_place);
                (y, Saved::None)
            }
            Op::WeightedSum { gate, xs } => {
                let gv = self.value(*gate);
                let k = xs.len();
                let mut y = vec![0.0f32; b * width];
                let xvs: Vec<&[f32]> = xs.iter().map(|x| self.value(*x)).collect();
                y.par_chunks_mut(width.max(1)).enumerate().for_each(|(r, out)| {
                    for (e, xv) in xvs.iter().enumerate() {
                        let g = gv[r * k + e];
                        let v = &xv[r * width..(r + 1) * width];
                        out.iter_mut().zip(v).for_each(|(o, v)| *o += g * v);
                    }
                });
                (y, Saved::None)
            }
            Op::Zeros { .. } => (vec![0.0f32; b * width], Saved::None),
            Op::Bias { x, b: bias } => {
                let bias = p.slice(*bias);
                let mut y = self.value(*x).to_vec();
                y.par_chunks_mut(width)
                    .with_min_len(kernels::ROWS)
                    .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
                (y, Saved::None)
            }
            Op::LayerNorm { x, gamma, beta, eps } => {
                let (gamma, beta) = (p.slice(*gamma), p.slice(*beta));
                let mut xhat = self.value(*x).to_vec();
                let mut inv = vec![0.0f32; b];
                xhat.par_chunks_mut(width)
                    .zip(inv.par_iter_mut())
                    .with_min_len(kernels::ROWS)
                    .for_each(|(row, iv)| {
                        let n = row.len() as f32;
                        let m = row.iter().sum::<f32>() / n;
                        let var = row.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / n;
                        *iv = 1.0 / (var + eps).sqrt();
                        row.iter_mut().for_each(|v| *v = (*v - m) * *iv);
                    });
                let mut y = xhat.clone();
                y.par_chunks_mut(width).for_each(|row| {
                    for ((v, g), bt) in row.iter_mut().zip(gamma).zip(beta) {
                        *v = *v * g + bt;
                    }
                });
                let saved = if matches!(mode, Mode::Train { .. }) {
                    Saved::Ln { xhat, inv }
                } else {
                    Saved::None
                };
                (y, saved)
            }
            Op::Sub(a, c) => {
                let y = self.value(*a).iter().zip(self.value(*c)).map(|(x, y)| x - y).collect();
                (y, Saved::None)
            }
            Op::StopGradient { x } => (self.value(*x).to_vec(), Saved::None),
            Op::ProductLogit { a, b: c } => {
                let y = self
                    .value(*a)
                    .iter()
                    .zip(self.value(*c))
                    .map(|(x, y)| kernels::product_logit(*x, *y).0)
                    .collect();
                (y, Saved::None)
            }
            Op::L2Normalize { x } => {
                let mut y = self.value(*x).to_vec();
                let mut inv = vec![0.0f32; b];
                y.par_chunks_mut(width.max(1))
                    .zip(inv.par_iter_mut())
                    .with_min_len(kernels::ROWS)
                    .for_each(|(row, iv)| {
                        *iv = kernels::l2_inv(row);
                        row.iter_mut().for_each(|v| *v *= *iv);
                    });
                (y, Saved::Scalars(inv))
            }
            Op::Capsules { len, count } => (self.value(*len).iter().map(|l| count.of(*l)).collect(), Saved::None),
            Op::CapsuleRouting { x, len, caps, routing } => {
                let (n, e) = (self.graph.rows(*x), self.graph.width(*x));
                let (max_k, stddev, init) = (&routing.max_k, routing.stddev, &routing.init);
                // Training starts each row from draws of its own, row by
                // row (the reference executor draws them alike).
                let starts: Vec<Vec<f32>> = match mode {
                    Mode::Train { rng, .. } => (0..b)
                        .map(|_| {
                            (0..n * max_k)
                                .map(|_| (rng.truncated_normal() * stddev as f64) as f32)
                                .collect()
                        })
                        .collect(),
                    Mode::Infer => vec![init.clone(); b],
                };
                let r = capsule::Settings {
                    max_k: *max_k,
                    iters: routing.iters,
                    scale: routing.scale,
                };
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width.max(1))
                    .zip(self.value(*x).par_chunks((n * e).max(1)))
                    .zip(self.value(*len).par_iter().zip(self.value(*caps)))
                    .zip(starts)
                    .with_min_len(kernels::ROWS)
                    .for_each(|(((out, xr), (l, c)), start)| {
                        let live = (kernels::live(*l, n), kernels::live(*c, *max_k));
                        capsule::route(xr, e, live, start, r, out);
                    });
                (y, Saved::None)
            }
            Op::InterestSimilarity { x, caps, max_k } => {
                let wx = self.graph.width(*x);
                let y = self
                    .value(*x)
                    .chunks_exact(wx.max(1))
                    .zip(self.value(*caps))
                    .flat_map(|(row, c)| capsule::interest_similarity(row, wx / max_k, *c).0)
                    .collect();
                (y, Saved::None)
            }
            Op::Squash { x, pow, ratio } => {
                let mut y = self.value(*x).to_vec();
                y.par_chunks_mut(width.max(1)).for_each(|row| {
                    let (f, _) = capsule::squash_factor(row.iter().map(|v| v * v).sum(), *pow, *ratio);
                    row.iter_mut().for_each(|v| *v *= f);
                });
                (y, Saved::None)
            }
            Op::Scale { x, factor, w } => {
                let s = factor * w.map_or(1.0, |w| p.slice(w)[0].abs());
                (self.value(*x).iter().map(|v| v * s).collect(), Saved::None)
            }
            Op::Shift { x, by } => (self.value(*x).iter().map(|v| v + by).collect(), Saved::None),
            Op::Transpose { x, n } => (kernels::transpose_rows(self.value(*x), width, *n), Saved::None),
            Op::GroupedLinear { x, w, b: bias, n } => {
                let din = self.graph.width(*x);
                let (wv, bv) = (p.slice(*w), bias.map(|bi| p.slice(bi)));
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width)
                    .zip(self.value(*x).par_chunks(din))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| kernels::grouped_linear_row(row, wv, bv, *n, out));
                (y, Saved::None)
            }
            Op::NaryEmbed {
                x,
                table,
                nary,
                cols: (c0, w),
            } => {
                let (n, bases) = (self.graph.width(*x), nary.carries.len());
                let (tv, tcols) = (p.slice(*table), p.specs[*table].cols);
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width)
                    .zip(self.value(*x).par_chunks(n))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| {
                        for (f, &v) in row.iter().enumerate() {
                            let u = Nary::value(v);
                            for k in 0..bases {
                                let o = &mut out[(f * bases + k) * w..][..*w];
                                let digits = nary.rows(f, k, u, |r| {
                                    let t = &tv[r * tcols + c0..][..*w];
                                    o.iter_mut().zip(t).for_each(|(o, t)| *o += t);
                                });
                                if nary.mean {
                                    o.iter_mut().for_each(|o| *o /= digits as f32);
                                }
                            }
                        }
                    });
                (y, Saved::None)
            }
            Op::SinCos { x, n } => {
                let e = width / (2 * n);
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width)
                    .zip(self.value(*x).par_chunks(width / 2))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(out, row)| {
                        for (o, blk) in out.chunks_exact_mut(2 * e).zip(row.chunks_exact(e)) {
                            let (s, c) = o.split_at_mut(e);
                            for ((s, c), v) in s.iter_mut().zip(c).zip(blk) {
                                (*s, *c) = v.sin_cos();
                            }
                        }
                    });
                (y, Saved::None)
            }
            Op::Outer { a, b: c } => {
                let (wa, wc) = (self.graph.width(*a), self.graph.width(*c));
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width.max(1))
                    .zip(self.value(*a).par_chunks(wa.max(1)))
                    .zip(self.value(*c).par_chunks(wc.max(1)))
                    .with_min_len(kernels::ROWS)
                    .for_each(|((out, ar), cr)| {
                        for (blk, x) in out.chunks_exact_mut(wc).zip(ar) {
                            blk.iter_mut().zip(cr).for_each(|(o, y)| *o = x * y);
                        }
                    });
                (y, Saved::None)
            }
            Op::Tile { x, n } => {
                let y = self
                    .value(*x)
                    .chunks_exact(width.max(1))
                    .flat_map(|row| std::iter::repeat_n(row, *n).flatten())
                    .copied()
                    .collect();
                (y, Saved::None)
            }
            Op::Unfold { x, .. } | Op::Fold { x, .. } => (self.value(*x).to_vec(), Saved::None),
            Op::MaskedSoftmax { x, len } => {
                let mut y = self.value(*x).to_vec();
                let lens = self.value(*len);
                y.par_chunks_mut(width).zip(lens).for_each(|(row, l)| {
                    let (live, pad) = row.split_at_mut(kernels::live(*l, width));
                    pad.fill(0.0);
                    kernels::softmax_in_place(live);
                });
                (y, Saved::None)
            }
            Op::Attention {
                q,
                k,
                v,
                heads,
                scale,
                keys,
            } => {
                let (f, t) = (b / self.b, self.graph.rows(*k));
                let (wq, wv) = (self.graph.width(*q), width);
                let mut y = vec![0.0f32; b * wv];
                let mut probs = vec![0.0f32; self.b * heads * f * t];
                let row_keys: Vec<RowKeys> = match keys {
                    Keys::All => vec![RowKeys::Live(t); self.b],
                    Keys::Live(l) => self
                        .value(*l)
                        .iter()
                        .map(|l| RowKeys::Live(kernels::live(*l, t)))
                        .collect(),
                    Keys::Mask(m) => self.value(*m).chunks(t.max(1)).map(RowKeys::Mask).collect(),
                };
                y.par_chunks_mut(f * wv)
                    .zip(probs.par_chunks_mut((heads * f * t).max(1)))
                    .zip(self.value(*q).par_chunks(f * wq))
                    .zip(self.value(*k).par_chunks(t * wq))
                    .zip(self.value(*v).par_chunks(t * wv))
                    .zip(row_keys)
                    .with_min_len(kernels::ROWS)
                    .for_each(|(((((o, p), q), k), v), keys)| {
                        kernels::attention_fwd((q, k, v), (*heads, *scale, keys), (f, t), o, p)
                    });
                (y, Saved::Probs(probs))
            }
            Op::PrefixMask { len, n } => {
                let mut y = vec![0.0f32; b * n];
                y.par_chunks_mut((*n).max(1))
                    .zip(self.value(*len))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(row, l)| {
                        row[..kernels::live(*l, *n)].fill(1.0);
                    });
                (y, Saved::None)
            }
            Op::AttnPool { w, x } => {
                let n = self.graph.width(*w);
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width)
                    .zip(self.value(*w).par_chunks(n))
                    .zip(self.value(*x).par_chunks(n * width))
                    .with_min_len(kernels::ROWS)
                    .for_each(|((out, wr), xr)| {
                        for (wk, blk) in wr.iter().zip(xr.chunks_exact(width)) {
                            out.iter_mut().zip(blk).for_each(|(o, v)| *o += wk * v);
                        }
                    });
                (y, Saved::None)
            }
        }
    }
}
