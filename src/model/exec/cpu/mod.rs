//! The CPU executor of the model graph: the training path of every model.
//! The forward pass runs the nodes in order and keeps their values (the
//! tape); the backward pass walks them in reverse, each op's kernel
//! accumulating its parameters' gradients and handing its operands theirs.
//! Nothing flows into nodes that depend on no parameter and no trained
//! input.

use std::mem::MaybeUninit;

use rayon::prelude::*;

mod backward;
pub mod blas;
pub mod capsule;
mod contrast;
mod forward;
pub mod kernels;

use kernels::{Interact, LANES, ROWS};

use std::sync::Arc;

use super::{Executor, Mode};
use crate::model::graph::params::ParamStore;
use crate::model::graph::{BnStats, Graph, NodeId, Op};
use crate::profile::{timed, Level, Profile, Work};

/// The CPU executor. With a profile (`Cpu::profiled`) it records each op's
/// time and work: a matrix product's FLOPs, the bytes of the rest.
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    profile: Option<Arc<Profile>>,
}

impl Cpu {
    /// An executor recording into `profile`.
    pub fn profiled(profile: Arc<Profile>) -> Self {
        Cpu { profile: Some(profile) }
    }
}

impl Executor for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn forward<'a>(
        &self,
        graph: &'a Graph,
        state: (&ParamStore, &ParamStore),
        inputs: &'a [Vec<f32>],
        rows: usize,
        mode: Mode,
    ) -> Box<dyn super::Tape + 'a> {
        Box::new(Tape::forward(graph, state, inputs, rows, mode, self.profile.clone()))
    }
}

impl super::Tape for Tape<'_> {
    fn value(&self, n: NodeId) -> &[f32] {
        Tape::value(self, n)
    }

    fn backward(
        &self,
        params: &ParamStore,
        seeds: Vec<(NodeId, Vec<f32>)>,
        needs: &[bool],
        dense: &mut [f32],
    ) -> Vec<Vec<f32>> {
        Tape::backward(self, params, seeds, needs, dense)
    }
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
    /// Attention: the weights `[batch, heads, n, n]`; a contrastive loss:
    /// its softmax weights.
    Probs(Vec<f32>),
    /// Sequence augmentation: each output position's source
    /// (`graph::augment`).
    Plan(Vec<i32>),
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
    profile: Option<Arc<Profile>>,
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
        profile: Option<Arc<Profile>>,
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
            profile,
        };
        for (i, node) in graph.nodes.iter().enumerate() {
            let run = |mode: &mut Mode| t.run(&node.op, (node.width, node.rows), (params, buffers), mode);
            // A product's parts are timed apart, inside `run`.
            let (v, s) = match &node.op {
                Op::Linear { .. } => run(&mut mode),
                op => timed(
                    t.profile.as_deref(),
                    (Level::Op, || format!("fwd {}", op_kind(op))),
                    |_| Some(Work::Bytes(t.bytes_moved(NodeId(i)))),
                    || run(&mut mode),
                ),
            };
            t.vals.push(v);
            t.saved.push(s);
        }
        t
    }

    /// The bytes an op over node `n` reads from its operands and writes.
    fn bytes_moved(&self, n: NodeId) -> f64 {
        let g = self.graph;
        let node = &g.nodes[n.0];
        let values: usize = node
            .op
            .operands()
            .iter()
            .map(|x| g.width(*x) * g.rows(*x))
            .sum::<usize>()
            + node.width * node.rows;
        (values * self.b * std::mem::size_of::<f32>()) as f64
    }

    /// Runs matrix product `f` of `(m, k, n)`, timed as `what` when profiled.
    fn product<T>(&self, what: &str, (m, k, n): (usize, usize, usize), f: impl FnOnce() -> T) -> T {
        timed(
            self.profile.as_deref(),
            (Level::Op, || format!("{what} [{m}x{k}]·[{k}x{n}]")),
            |_| Some(Work::Flops(2.0 * (m * k * n) as f64)),
            f,
        )
    }

    /// Runs element-wise sweep `f` over `bytes`, timed as `what` when profiled.
    fn sweep<T>(&self, what: &str, bytes: usize, f: impl FnOnce() -> T) -> T {
        timed(
            self.profile.as_deref(),
            (Level::Op, || what.to_string()),
            |_| Some(Work::Bytes(bytes as f64)),
            f,
        )
    }

    /// The operands of a dot op as `(values, width)`.
    fn sources(&self, xs: &[NodeId]) -> Vec<(&[f32], usize)> {
        xs.iter().map(|x| (self.value(*x), self.graph.width(*x))).collect()
    }

    fn dot_fwd(&self, b: usize, xs: &[NodeId], dim: usize, pairs: &[(usize, usize)]) -> Vec<f32> {
        let zw = pairs.len();
        let src = self.sources(xs);
        let n = src.iter().map(|(_, w)| w).sum::<usize>() / dim;
        if zw == 0 {
            return Vec::new();
        }
        let mut z: Vec<f32> = Vec::with_capacity(b * zw);
        z.spare_capacity_mut()[..b * zw]
            .par_chunks_mut(zw * ROWS)
            .enumerate()
            .for_each(|(c, zc)| {
                let mut dots = Interact::new(n, dim, pairs);
                for (q, zq) in zc.chunks_mut(zw * LANES).enumerate() {
                    let r0 = c * ROWS + q * LANES;
                    let count = zq.len() / zw;
                    dots.load(&src, r0, count);
                    dots.forward();
                    for (k, zr) in zq.chunks_exact_mut(zw).enumerate() {
                        for (o, v) in zr.iter_mut().zip(&dots.out) {
                            o.write(v[k]);
                        }
                    }
                }
            });
        // SAFETY: the capacity holds b * zw values and the chunks above
        // wrote every one (each row's zw pair values).
        unsafe { z.set_len(b * zw) };
        z
    }

    /// Gradients of a dot op's operands from that of its output, each
    /// operand's written once, row by row.
    fn dot_bwd(&self, b: usize, xs: &[NodeId], dim: usize, pairs: &[(usize, usize)], dz: &[f32]) -> Vec<Vec<f32>> {
        let zw = pairs.len();
        let src = self.sources(xs);
        let widths: Vec<usize> = src.iter().map(|(_, w)| *w).collect();
        let n = widths.iter().sum::<usize>() / dim;
        if zw == 0 {
            return widths.iter().map(|w| vec![0.0; b * w]).collect();
        }
        let mut outs: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(b * w)).collect();
        // Per block of ROWS rows, that block's rows of every operand.
        let mut blocks: Vec<Vec<&mut [MaybeUninit<f32>]>> = (0..b.div_ceil(ROWS)).map(|_| Vec::new()).collect();
        for (out, &w) in outs.iter_mut().zip(&widths) {
            if w == 0 {
                blocks.iter_mut().for_each(|parts| parts.push(&mut []));
                continue;
            }
            let rows = out.spare_capacity_mut()[..b * w].chunks_mut(w * ROWS);
            blocks.iter_mut().zip(rows).for_each(|(parts, r)| parts.push(r));
        }
        blocks.into_par_iter().enumerate().for_each(|(c, mut parts)| {
            let mut dots = Interact::new(n, dim, pairs);
            let count_all = ROWS.min(b - c * ROWS);
            for q in 0..count_all.div_ceil(LANES) {
                let r0 = c * ROWS + q * LANES;
                let count = LANES.min(count_all - q * LANES);
                dots.load(&src, r0, count);
                for k in 0..count {
                    let dzr = &dz[(r0 + k) * zw..(r0 + k + 1) * zw];
                    for (g, v) in dots.out.iter_mut().zip(dzr) {
                        g[k] = *v;
                    }
                }
                dots.backward();
                for k in 0..count {
                    let row = q * LANES + k;
                    let mut col = 0;
                    for (part, &w) in parts.iter_mut().zip(&widths) {
                        for (o, v) in part[row * w..(row + 1) * w].iter_mut().zip(&dots.da[col..col + w]) {
                            o.write(v[k]);
                        }
                        col += w;
                    }
                }
            }
        });
        for (out, w) in outs.iter_mut().zip(&widths) {
            // SAFETY: the capacity holds b * w values, and the blocks above
            // wrote every row of every operand.
            unsafe { out.set_len(b * w) };
        }
        outs
    }
}

/// An op's kind, for profiles: its variant's name.
fn op_kind(op: &Op) -> String {
    let s = format!("{op:?}");
    let end = s.find([' ', '(', '{']).unwrap_or(s.len());
    s[..end].to_string()
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
            let c = col;
            col += w;
            // SAFETY: each row is given its `w` values (a slice of that
            // length, or a panic out of bounds).
            unsafe {
                kernels::written_rows(rows, w, |r, out| {
                    kernels::write_row(out, &x[r * total + c..r * total + c + w]);
                })
            }
        })
        .collect()
}
