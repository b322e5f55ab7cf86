//! The CPU executor of the model graph: the training path of every model.
//! The forward pass runs the nodes in order and keeps their values (the
//! tape); the backward pass walks them in reverse, each op's kernel
//! accumulating its parameters' gradients and handing its operands theirs.
//! Nothing flows into nodes that depend on no parameter and no trained
//! input.

use rayon::prelude::*;

use super::capsule;
use super::graph::{BnStats, Graph, Keys, NodeId, Op, DICE_EPS, L2_EPS};
use super::kernels::{self, Interact, RowKeys, LANES, ROWS};
use super::params::ParamStore;
use crate::util::Rng;

/// What the forward pass runs in.
pub enum Mode<'a> {
    /// Batch statistics (reported into `stats`) and dropout masks from `rng`.
    Train {
        rng: &'a mut Rng,
        stats: &'a mut Vec<BnStats>,
        /// The leading rows that are examples (the rest sampled items).
        examples: usize,
    },
    /// Moving averages, no dropout.
    Infer,
}

/// What a node kept for its backward beyond its value.
enum Saved {
    None,
    /// Batch norm: the normalised values and `1 / sqrt(var + eps)`.
    Bn {
        xhat: Vec<f32>,
        inv: Vec<f32>,
    },
    /// Dropout: the mask its input was scaled by.
    Mask(Vec<f32>),
    /// Cross: `xl · w` per row.
    Scalars(Vec<f32>),
    /// Variational dropout: the keep values and their derivatives by the
    /// dropout logits, `[b, entries]`.
    Keep {
        keep: Vec<f32>,
        dkeep: Vec<f32>,
    },
    /// Attention: the weights `[batch, heads, n, n]`.
    Probs(Vec<f32>),
    /// Dice in training: the normalised values, `1 / sqrt(var + eps)` per
    /// column and the gate `p`.
    Dice {
        xhat: Vec<f32>,
        inv: Vec<f32>,
        p: Vec<f32>,
    },
    /// Layer norm: the normalised values and `1 / sqrt(var + eps)` per row.
    Ln {
        xhat: Vec<f32>,
        inv: Vec<f32>,
    },
}

/// The values of one forward pass over `b` rows.
pub struct Tape<'a> {
    graph: &'a Graph,
    inputs: &'a [Vec<f32>],
    vals: Vec<Vec<f32>>,
    saved: Vec<Saved>,
    pub b: usize,
    /// The leading batch rows that are examples (`Mode::Train`'s).
    examples: usize,
}

impl<'a> Tape<'a> {
    /// The value of node `n`, `[b, width]`.
    pub fn value(&self, n: NodeId) -> &[f32] {
        match self.graph.nodes[n.0].op {
            Op::Input { group } => &self.inputs[group],
            _ => &self.vals[n.0],
        }
    }

    /// Runs `graph` on group input matrices `inputs` (`[b, width]` each).
    pub fn forward(
        graph: &'a Graph,
        (params, buffers): (&ParamStore, &ParamStore),
        inputs: &'a [Vec<f32>],
        b: usize,
        mut mode: Mode,
    ) -> Self {
        let examples = match mode {
            Mode::Train { examples, .. } => examples,
            Mode::Infer => b,
        };
        let mut t = Tape {
            graph,
            inputs,
            vals: Vec::with_capacity(graph.nodes.len()),
            saved: Vec::with_capacity(graph.nodes.len()),
            b,
            examples,
        };
        for node in &graph.nodes {
            let (v, s) = t.run(&node.op, (node.width, node.rows), (params, buffers), &mut mode);
            t.vals.push(v);
            t.saved.push(s);
        }
        t
    }

    fn run(
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
                let mut y = vec![0.0f32; b * width];
                let k = w_of(x);
                if narrow(k, width) {
                    kernels::narrow_matmul(&mut y, self.value(*x), p.slice(*w), (k, width));
                } else {
                    kernels::matmul(&mut y, self.value(*x), false, p.slice(*w), false, (b, k, width), false);
                }
                kernels::bias_act(&mut y, width, bias.map(|i| p.slice(i)), *act);
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
            } => {
                let mut z = self.value(*x).to_vec();
                let stat_rows = if *examples_only { self.examples * rows } else { b };
                let (m, v, train) = column_stats(mode, &z[..stat_rows * width], width, (*mean, *var), buffers);
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
                    .for_each(|(row, k)| row.iter_mut().zip(index).for_each(|(v, j)| *v *= k[*j]));
                let saved = match mode {
                    Mode::Train { .. } => Saved::Keep { keep, dkeep },
                    Mode::Infer => Saved::None,
                };
                (y, saved)
            }
            Op::Concat(xs) => {
                let mut y = vec![0.0f32; b * width];
                let mut col = 0;
                for x in xs {
                    let w = w_of(x);
                    if w == 0 {
                        continue;
                    }
                    let v = self.value(*x);
                    y.par_chunks_mut(width)
                        .zip(v.par_chunks(w))
                        .for_each(|(row, src)| row[col..col + w].copy_from_slice(&src[..w]));
                    col += w;
                }
                (y, Saved::None)
            }
            Op::Slice { x, start } => {
                let w = w_of(x);
                let y = self
                    .value(*x)
                    .chunks_exact(w)
                    .flat_map(|row| &row[*start..start + width])
                    .copied()
                    .collect();
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
                let (mut y, mut s) = (vec![0.0f32; b * width], vec![0.0f32; b]);
                y.par_chunks_mut(d)
                    .zip(s.par_iter_mut())
                    .zip(self.value(*xl).par_chunks(d))
                    .zip(self.value(*x0).par_chunks(d))
                    .with_min_len(kernels::ROWS)
                    .for_each(|(((out, sr), xr), x0r)| {
                        *sr = kernels::dot(xr, wv);
                        for c in 0..d {
                            out[c] = xr[c] + (x0r[c] * *sr + bias[c]);
                        }
                    });
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
                    .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
                (y, Saved::None)
            }
            Op::LayerNorm { x, gamma, beta, eps } => {
                let (gamma, beta) = (p.slice(*gamma), p.slice(*beta));
                let mut xhat = self.value(*x).to_vec();
                let mut inv = vec![0.0f32; b];
                xhat.par_chunks_mut(width)
                    .zip(inv.par_iter_mut())
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
                    .for_each(|(out, row)| kernels::grouped_linear_row(row, wv, bv, *n, out));
                (y, Saved::None)
            }
            Op::SinCos { x, n } => {
                let e = width / (2 * n);
                let mut y = vec![0.0f32; b * width];
                y.par_chunks_mut(width)
                    .zip(self.value(*x).par_chunks(width / 2))
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
                    .for_each(|(((((o, p), q), k), v), keys)| {
                        kernels::attention_fwd((q, k, v), (*heads, *scale, keys), (f, t), o, p)
                    });
                (y, Saved::Probs(probs))
            }
            Op::PrefixMask { len, n } => {
                let mut y = vec![0.0f32; b * n];
                y.par_chunks_mut((*n).max(1))
                    .zip(self.value(*len))
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
                    .for_each(|((out, wr), xr)| {
                        for (wk, blk) in wr.iter().zip(xr.chunks_exact(width)) {
                            out.iter_mut().zip(blk).for_each(|(o, v)| *o += wk * v);
                        }
                    });
                (y, Saved::None)
            }
        }
    }

    /// The operands of a dot op as `(values, width)`.
    fn sources(&self, xs: &[NodeId]) -> Vec<(&[f32], usize)> {
        xs.iter().map(|x| (self.value(*x), self.graph.width(*x))).collect()
    }

    fn dot_fwd(&self, b: usize, xs: &[NodeId], dim: usize, pairs: &[(usize, usize)]) -> Vec<f32> {
        let zw = pairs.len();
        let src = self.sources(xs);
        let n = src.iter().map(|(_, w)| w).sum::<usize>() / dim;
        let mut z = vec![0.0f32; b * zw];
        if zw == 0 {
            return z;
        }
        z.par_chunks_mut(zw * ROWS).enumerate().for_each(|(c, zc)| {
            let mut dots = Interact::new(n, dim, pairs);
            for (q, zq) in zc.chunks_mut(zw * LANES).enumerate() {
                let r0 = c * ROWS + q * LANES;
                let count = zq.len() / zw;
                dots.load(&src, r0, count);
                dots.forward();
                for (k, zr) in zq.chunks_exact_mut(zw).enumerate() {
                    for (o, v) in zr.iter_mut().zip(&dots.out) {
                        *o = v[k];
                    }
                }
            }
        });
        z
    }

    /// Gradients of a dot op's operands from that of its output.
    fn dot_bwd(&self, b: usize, xs: &[NodeId], dim: usize, pairs: &[(usize, usize)], dz: &[f32]) -> Vec<Vec<f32>> {
        let zw = pairs.len();
        let src = self.sources(xs);
        let widths: Vec<usize> = src.iter().map(|(_, w)| *w).collect();
        let total: usize = widths.iter().sum();
        let n = total / dim;
        // Gradient of the operands side by side, then split.
        let mut dall = vec![0.0f32; b * total];
        if zw > 0 {
            dall.par_chunks_mut(total * ROWS).enumerate().for_each(|(c, dc)| {
                let mut dots = Interact::new(n, dim, pairs);
                for (q, dq) in dc.chunks_mut(total * LANES).enumerate() {
                    let r0 = c * ROWS + q * LANES;
                    let count = dq.len() / total;
                    dots.load(&src, r0, count);
                    for k in 0..count {
                        let dzr = &dz[(r0 + k) * zw..(r0 + k + 1) * zw];
                        for (g, v) in dots.out.iter_mut().zip(dzr) {
                            g[k] = *v;
                        }
                    }
                    dots.backward();
                    for (k, dr) in dq.chunks_exact_mut(total).enumerate() {
                        for (o, v) in dr.iter_mut().zip(&dots.da) {
                            *o = v[k];
                        }
                    }
                }
            });
        }
        split_columns(&dall, total, &widths)
    }

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
                    match bias {
                        Some(bi) => {
                            let db = &mut dense[p.specs[*bi].range()];
                            kernels::slope_col_sums(*act, &mut dy, &self.vals[i], width, db);
                        }
                        None => kernels::mul_slope(*act, &mut dy, &self.vals[i], width),
                    }
                    let xv = self.value(*x);
                    let dw = &mut dense[p.specs[*w].range()];
                    if narrow(k, width) {
                        kernels::narrow_weight_grad(dw, xv, &dy, (k, width));
                    } else {
                        kernels::matmul(dw, xv, true, &dy, false, (k, b, width), true);
                    }
                    if needs[x.0] {
                        // Into the input's gradient so far, when another
                        // reader of it already gave one (MMoE's experts and
                        // gates), rather than a new matrix added to it.
                        let (dx, acc) = match grads[x.0].take() {
                            Some(d) => (d, true),
                            None => (vec![0.0f32; b * k], false),
                        };
                        let mut dx = dx;
                        if narrow(k, width) {
                            kernels::narrow_input_grad(&mut dx, &dy, p.slice(*w), (k, width), acc);
                        } else {
                            kernels::matmul(&mut dx, &dy, false, p.slice(*w), true, (b, width, k), acc);
                        }
                        grads[x.0] = Some(dx);
                    }
                }
                Op::BatchNorm {
                    x,
                    gamma,
                    beta,
                    act,
                    examples_only,
                    ..
                } => {
                    let Saved::Bn { xhat, inv } = &self.saved[i] else {
                        unreachable!("backward runs on a training tape")
                    };
                    kernels::mul_slope(*act, &mut dy, &self.vals[i], width);
                    let rows = if *examples_only {
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
                Op::SinCos { x, n } => {
                    let e = width / (2 * n);
                    let mut dx = vec![0.0f32; b * width / 2];
                    dx.par_chunks_mut(width / 2)
                        .zip(self.value(*x).par_chunks(width / 2))
                        .zip(dy.par_chunks(width))
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

/// A normalization's column mean and variance: of the rows `z` in
/// training (recorded for the moving averages in buffers `mean`, `var`),
/// those moving averages otherwise; and whether it trains.
fn column_stats(
    mode: &mut Mode,
    z: &[f32],
    width: usize,
    (mean, var): (usize, usize),
    buffers: &ParamStore,
) -> (Vec<f32>, Vec<f32>, bool) {
    match mode {
        Mode::Train { stats, .. } => {
            let (m, v) = kernels::batch_moments(z, width);
            stats.push(BnStats {
                mean_buffer: mean,
                var_buffer: var,
                mean: m.clone(),
                var: v.clone(),
            });
            (m, v, true)
        }
        Mode::Infer => (buffers.slice(mean).to_vec(), buffers.slice(var).to_vec(), false),
    }
}

/// Adds `d` to the gradient of node `n` when it needs one.
/// Whether a `Linear` from `k` to `n` columns runs on the narrow sweeps
/// rather than gemm.
fn narrow(k: usize, n: usize) -> bool {
    k > 0 && (1..=kernels::NARROW).contains(&n)
}

fn accumulate(grads: &mut [Option<Vec<f32>>], needs: &[bool], n: NodeId, d: Vec<f32>) {
    if !needs[n.0] {
        return;
    }
    match &mut grads[n.0] {
        Some(g) => g.par_iter_mut().zip(&d).for_each(|(a, v)| *a += v),
        slot => *slot = Some(d),
    }
}

/// The column blocks of a `[rows, total]` matrix as separate matrices.
fn split_columns(x: &[f32], total: usize, widths: &[usize]) -> Vec<Vec<f32>> {
    let rows = x.len().checked_div(total).unwrap_or(0);
    let mut col = 0;
    widths
        .iter()
        .map(|&w| {
            let mut out = vec![0.0f32; rows * w];
            if w > 0 {
                out.par_chunks_mut(w)
                    .zip(x.par_chunks(total))
                    .for_each(|(o, row)| o.copy_from_slice(&row[col..col + w]));
            }
            col += w;
            out
        })
        .collect()
}
