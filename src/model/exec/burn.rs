//! The model graph on burn tensors: the reference executor. burn's
//! autodiff differentiates it, so tests hold the CPU executor's hand-written
//! backward to it; on another burn device (wgpu) the same code runs the
//! graph there.

use std::cell::OnceCell;

use burn::tensor::activation::{relu, sigmoid, softmax, tanh};
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};

use super::resident::TableLookups;
use super::{Backward, DenseGrad, Executor, Mode};
use crate::config::model::Activation;
use crate::model::exec::cpu::kernels;
use crate::model::graph::nary::Nary;
use crate::model::graph::params::{read_all, to_vec, ParamStore};
use crate::model::graph::{
    augment, BnStats, Contrast, Graph, Keys, NodeId, Op, BN_EPS, DICE_EPS, L2_EPS, MASK_ADDER, SQUASH_EPS, VD_EPS,
    VD_TEMP,
};
use crate::util::Rng;

/// The graph on a burn device, differentiated by burn's autodiff.
#[derive(Debug, Clone)]
pub struct Burn {
    device: Device,
    name: &'static str,
}

impl Burn {
    /// burn's CPU backend with autodiff: the tests' oracle.
    pub fn reference() -> Self {
        Burn::on(Device::flex().autodiff())
    }

    /// On `device`, which must carry autodiff for `Tape::backward`.
    pub fn on(device: Device) -> Self {
        Burn { device, name: "burn" }
    }

    /// On this rank's GPU (`gpu::open`), with autodiff.
    #[cfg(feature = "gpu")]
    pub fn gpu(local_rank: usize) -> Result<Self, super::DeviceError> {
        let device = super::gpu::open(local_rank)?;
        Ok(Burn {
            device: device.autodiff(),
            name: "gpu",
        })
    }
}

impl Executor for Burn {
    fn name(&self) -> &'static str {
        self.name
    }

    fn forward<'a>(
        &self,
        graph: &'a Graph,
        (params, buffers): (&ParamStore, &ParamStore),
        inputs: &'a [Vec<f32>],
        rows: usize,
        mode: Mode,
    ) -> Box<dyn super::Tape + 'a> {
        // One upload of every parameter, sliced into leaves there (on a GPU
        // each upload is a transfer of its own); none of no values.
        let inner = self.device.clone().inner();
        let flat = (!params.values.is_empty()).then(|| {
            let values = TensorData::new(params.values.clone(), [params.values.len()]);
            Tensor::<1>::from_data(values, &inner)
        });
        let p = leaves(flat.as_ref(), &shapes(params), &inner);
        Box::new(pass(&self.device, graph, (p, buffers), (inputs, rows), mode, None))
    }

    fn resident_device(&self) -> Option<Device> {
        Some(self.device.clone().inner())
    }
}

/// Each parameter's range in the flat values and its `[rows, cols]`, in
/// `specs` order.
pub(super) fn shapes(params: &ParamStore) -> Vec<(std::ops::Range<usize>, [usize; 2])> {
    params.specs.iter().map(|s| (s.range(), [s.rows, s.cols])).collect()
}

/// Every parameter of the flat values `flat` (on `device`, without
/// autodiff; none when there are no values) as an autodiff leaf of its
/// shape.
pub(super) fn leaves(
    flat: Option<&Tensor<1>>,
    shapes: &[(std::ops::Range<usize>, [usize; 2])],
    device: &Device,
) -> Vec<Tensor<2>> {
    shapes
        .iter()
        .map(|(r, shape)| {
            let t = match flat.filter(|_| !r.is_empty()) {
                Some(flat) => flat.clone().narrow(0, r.start, r.len()).reshape(*shape),
                None => Tensor::<2>::zeros(*shape, device),
            };
            t.autodiff().require_grad()
        })
        .collect()
}

/// Runs `graph` forward on `device` (with autodiff) from the parameters
/// `p` (autodiff leaves, `ParamStore` order) over the group inputs; with
/// `resident` (a `Resident`'s layout) the tape's `backward_dense` leaves
/// the parameters' gradient on the device.
pub(super) fn pass<'a>(
    device: &Device,
    graph: &'a Graph,
    (p, buffers): (Vec<Tensor<2>>, &ParamStore),
    (inputs, rows): (&'a [Vec<f32>], usize),
    mode: Mode,
    resident: Option<(FlatLayout, Option<&TableLookups>)>,
) -> BurnTape<'a> {
    let xs: Vec<Tensor<2>> = inputs
        .iter()
        .map(|v| {
            let width = v.len().checked_div(rows).unwrap_or(0);
            Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, width]), device).require_grad()
        })
        .collect();
    let (training, rng, examples) = match &mode {
        Mode::Train { rng, examples, .. } => (true, (**rng).clone(), *examples),
        Mode::Infer => (false, Rng::new(0), rows),
    };
    let mut ctx = Ctx {
        p: &p,
        buffers,
        training,
        device,
        rng,
        bn_stats: Vec::new(),
        examples,
    };
    let (fed, tables, table_reg) = match resident.as_ref().and_then(|(_, t)| *t) {
        Some(lookups) => pooled_inputs(device, &xs, rows, lookups),
        None => (xs.clone(), Vec::new(), None),
    };
    let values = forward(graph, &mut ctx, &fed);
    if let Mode::Train { rng, stats, .. } = mode {
        *rng = ctx.rng;
        stats.extend(read_stats(ctx.bn_stats));
    }
    BurnTape {
        graph,
        host: values.iter().map(|_| OnceCell::new()).collect(),
        values,
        params: p,
        xs,
        resident: resident.map(|(layout, _)| layout),
        tables,
        table_reg,
    }
}

/// The group inputs `xs` (`rows` rows, autodiff leaves) with the lookups
/// of `l` pooled into their columns on `device`, each gather one gather
/// of rows and one scatter-add into its output; with the tables as
/// autodiff leaves (per table of `l.tables`) and embedding
/// regularization's loss over the pooled values.
#[allow(clippy::type_complexity)]
fn pooled_inputs(
    device: &Device,
    xs: &[Tensor<2>],
    rows: usize,
    l: &TableLookups,
) -> (Vec<Tensor<2>>, Vec<Option<Tensor<2>>>, Option<Tensor<1>>) {
    let tables: Vec<Option<Tensor<2>>> = (l.tables.iter())
        .map(|t| t.as_ref().map(|t| t.clone().autodiff().require_grad()))
        .collect();
    let mut fed = xs.to_vec();
    let n: usize = l.gathers.iter().map(|g| g.rows.len()).sum();
    if n == 0 {
        return (fed, tables, None);
    }
    // Every lookup's row and output row in one upload, the coefficients
    // in another (on a GPU each upload is a round trip).
    let idx: Vec<i64> = (l.gathers.iter().flat_map(|g| g.rows.iter()))
        .chain(l.gathers.iter().flat_map(|g| g.targets.iter()))
        .copied()
        .collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [2 * n]), device);
    let coefs: Vec<f32> = l.gathers.iter().flat_map(|g| g.coefs.iter().copied()).collect();
    let coefs = Tensor::<1>::from_data(TensorData::new(coefs, [n]), device);
    let (mut at, mut reg) = (0, None);
    for g in l.gathers {
        let k = g.rows.len();
        if k == 0 {
            continue;
        }
        let table = tables[g.table].as_ref().expect("a gather's table is on the device");
        let looked_up = table.clone().select(0, idx.clone().narrow(0, at, k));
        let weighted = looked_up * coefs.clone().narrow(0, at, k).reshape([k, 1]);
        let out = Tensor::<2>::zeros([rows * g.per_row, g.dim], device)
            .select_assign(0, idx.clone().narrow(0, n + at, k), weighted, IndexingUpdateOp::Add)
            .reshape([rows, g.width()]);
        if l.reg > 0.0 {
            let r = (out.clone() * out.clone()).sum().mul_scalar(0.5 * l.reg);
            reg = Some(match reg {
                Some(sum) => sum + r,
                None => r,
            });
        }
        let x = &mut fed[g.group];
        *x = x.clone().slice_assign([0..rows, g.col..g.col + g.width()], out);
        at += k;
    }
    (fed, tables, reg)
}

/// A forward pass on burn: every node's tensor, read back to the host
/// when asked.
pub(super) struct BurnTape<'a> {
    graph: &'a Graph,
    values: Vec<Tensor<2>>,
    host: Vec<OnceCell<Vec<f32>>>,
    params: Vec<Tensor<2>>,
    xs: Vec<Tensor<2>>,
    /// Of a `Resident`'s pass: where its gradient goes.
    resident: Option<FlatLayout>,
    /// Of a pass over tables on the device (`TableLookups`): each one as
    /// an autodiff leaf, and embedding regularization's loss.
    tables: Vec<Option<Tensor<2>>>,
    table_reg: Option<Tensor<1>>,
}

/// The flat layout of a `Resident`'s parameters: each one's range and
/// shape (`shapes`: in `ParamStore::specs` order, one after another),
/// their length, and the device (without autodiff) that holds them.
#[derive(Clone)]
pub(super) struct FlatLayout {
    pub shapes: Vec<(std::ops::Range<usize>, [usize; 2])>,
    pub len: usize,
    pub device: Device,
}

impl super::Tape for BurnTape<'_> {
    fn value(&self, n: NodeId) -> &[f32] {
        self.host[n.0].get_or_init(|| to_vec(self.values[n.0].clone()))
    }

    fn prefetch(&self, nodes: &[NodeId]) {
        let size = |n: &NodeId| self.values[n.0].dims().iter().product::<usize>();
        let unread: Vec<NodeId> = (nodes.iter().copied())
            .filter(|n| self.host[n.0].get().is_none() && size(n) > 0)
            .collect();
        if unread.len() < 2 {
            return;
        }
        let flat = read_all(
            unread
                .iter()
                .map(|n| self.values[n.0].clone().flatten::<1>(0, 1))
                .collect(),
        );
        let mut at = 0;
        for n in unread {
            let len = size(&n);
            // A node asked twice in `nodes` was filled the first time.
            let _ = self.host[n.0].set(flat[at..at + len].to_vec());
            at += len;
        }
    }

    fn backward(
        &self,
        p: &ParamStore,
        seeds: Vec<(NodeId, Vec<f32>)>,
        needs: &[bool],
        dense: &mut [f32],
    ) -> Vec<Vec<f32>> {
        let (params, inputs, _) = self.gradients(seeds, needs);
        // Every gradient read back in one transfer (on a GPU each read is a
        // round trip): the parameters' that flowed, then the inputs'.
        let flat = read_all(params.iter().chain(&inputs).map(|(_, g)| g.clone()).collect());
        let mut at = 0;
        for (i, _) in &params {
            let range = p.specs[*i].range();
            let n = range.len();
            dense[range]
                .iter_mut()
                .zip(&flat[at..at + n])
                .for_each(|(d, v)| *d += v);
            at += n;
        }
        self.input_grads(&inputs, &flat[at..])
    }

    fn backward_dense(&self, p: &ParamStore, seeds: Vec<(NodeId, Vec<f32>)>, needs: &[bool]) -> Backward {
        let Some(layout) = &self.resident else {
            return super::backward_on_host(self, p, seeds, needs);
        };
        let (params, inputs, tables) = self.gradients(seeds, needs);
        // The parameters' gradient stays on the device, in the flat layout
        // (zeros where none flowed); the inputs' are read back at once.
        let mut flowed: Vec<Option<Tensor<1>>> = vec![None; layout.shapes.len()];
        for (i, g) in params {
            flowed[i] = Some(g);
        }
        let parts: Vec<Tensor<1>> = (layout.shapes.iter().map(|(r, _)| r).zip(flowed))
            .filter(|(r, _)| !r.is_empty())
            .map(|(r, g)| g.unwrap_or_else(|| Tensor::<1>::zeros([r.len()], &layout.device)))
            .collect();
        let dense = match parts.is_empty() {
            true => Tensor::<1>::zeros([layout.len], &layout.device),
            false => Tensor::cat(parts, 0),
        };
        let flat = read_all(inputs.iter().map(|(_, g)| g.clone()).collect());
        Backward {
            dense: DenseGrad::Device(Box::new(dense)),
            inputs: self.input_grads(&inputs, &flat),
            tables,
            table_reg: self.table_reg.clone().map(Tensor::inner),
        }
    }
}

impl BurnTape<'_> {
    /// Backward from `seeds` (and embedding regularization's loss of
    /// tables on the device): the flattened gradient of each parameter one
    /// flowed to (by index), of each group input `needs` trains, and of
    /// each table on the device (zeros where none flowed).
    #[allow(clippy::type_complexity)]
    fn gradients(
        &self,
        seeds: Vec<(NodeId, Vec<f32>)>,
        needs: &[bool],
    ) -> (Vec<(usize, Tensor<1>)>, Vec<(usize, Tensor<1>)>, Vec<Option<Tensor<2>>>) {
        // The seeds' inner product with their nodes: its gradient is the
        // vector-Jacobian product the seeds ask for.
        let objective = seeds
            .into_iter()
            .map(|(n, seed)| {
                let v = &self.values[n.0];
                let seed = Tensor::<2>::from_data(TensorData::new(seed, v.dims()), &v.device());
                (v.clone() * seed).sum()
            })
            .chain(self.table_reg.clone())
            .reduce(|a, b| a + b);
        let table_grads = |gr: Option<&burn::tensor::Gradients>| -> Vec<Option<Tensor<2>>> {
            (self.tables.iter())
                .map(|t| {
                    let t = t.as_ref()?;
                    let g = gr.and_then(|gr| t.grad(gr));
                    Some(g.unwrap_or_else(|| Tensor::<2>::zeros(t.dims(), &t.clone().inner().device())))
                })
                .collect()
        };
        let Some(gr) = objective.map(|o| o.backward()) else {
            return (Vec::new(), Vec::new(), table_grads(None));
        };
        let trained_inputs = self.trained_inputs(needs);
        let params = (self.params.iter().enumerate())
            .filter_map(|(i, t)| Some((i, t.grad(&gr)?.flatten::<1>(0, 1))))
            .collect();
        let inputs = (self.xs.iter().enumerate())
            .filter(|(group, _)| trained_inputs.contains(group))
            .filter_map(|(group, x)| Some((group, x.grad(&gr)?.flatten::<1>(0, 1))))
            .collect();
        (params, inputs, table_grads(Some(&gr)))
    }

    /// Each group input's gradient: those of `flowed` read back into
    /// `flat` one after another, zeros for the others.
    fn input_grads(&self, flowed: &[(usize, Tensor<1>)], flat: &[f32]) -> Vec<Vec<f32>> {
        let mut dx: Vec<Vec<f32>> = self.xs.iter().map(|x| vec![0.0; x.dims().iter().product()]).collect();
        let mut at = 0;
        for (group, _) in flowed {
            let n = dx[*group].len();
            dx[*group].copy_from_slice(&flat[at..at + n]);
            at += n;
        }
        dx
    }

    /// The group inputs a gradient flows to (`needs`, per node).
    fn trained_inputs(&self, needs: &[bool]) -> Vec<usize> {
        self.graph
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match n.op {
                Op::Input { group } if needs[i] => Some(group),
                _ => None,
            })
            .collect()
    }
}

/// The batch statistics of a pass read back, in one transfer (on a GPU
/// each read is a round trip).
fn read_stats(pending: Vec<((usize, usize), Tensor<2>, Tensor<2>)>) -> Vec<BnStats> {
    let parts = pending
        .iter()
        .flat_map(|(_, m, v)| [m.clone().flatten::<1>(0, 1), v.clone().flatten::<1>(0, 1)])
        .collect();
    let flat = read_all(parts);
    let mut at = 0;
    let mut take = |t: &Tensor<2>| {
        let n = t.dims().iter().product::<usize>();
        at += n;
        flat[at - n..at].to_vec()
    };
    pending
        .iter()
        .map(|((mean_buffer, var_buffer), m, v)| BnStats {
            mean_buffer: *mean_buffer,
            var_buffer: *var_buffer,
            mean: take(m),
            var: take(v),
        })
        .collect()
}

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
    /// Batch statistics seen in training, in node order: the buffers
    /// they are for, and their mean and variance on the device (read back
    /// together at the end of the pass, `read_stats`).
    pub bn_stats: Vec<((usize, usize), Tensor<2>, Tensor<2>)>,
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
            self.bn_stats
                .push(((mean, var), m.clone().detach(), v.clone().detach()));
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
        Activation::LeakyRelu => burn::tensor::activation::leaky_relu(x, f64::from(kernels::LEAKY_SLOPE)),
        Activation::Elu => elu(x),
        Activation::Selu => {
            let (s, a) = (kernels::SELU_SCALE, kernels::SELU_ALPHA);
            x.clone().clamp_min(0.0).mul_scalar(s) + x.clamp_max(0.0).exp().sub_scalar(1.0).mul_scalar(s * a)
        }
        // max(x, 0) + log(1 + exp(-|x|)), stable.
        Activation::Softplus => x.clone().clamp_min(0.0) + x.abs().neg().exp().log1p(),
        Activation::Dice => unreachable!("Scope builds Dice as an op of its own"),
    }
}

/// `tf.nn.elu`: `x` above 0, `exp(x) - 1` below.
fn elu(x: Tensor<2>) -> Tensor<2> {
    x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp().sub_scalar(1.0)
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
                fixed,
            } => {
                let x = v[x.0].clone();
                let stat = if *examples_only && ctx.training {
                    x.clone().narrow(0, 0, ctx.examples * node.rows)
                } else {
                    x.clone()
                };
                let (m, var) = if *fixed {
                    (
                        ctx.constant(ctx.buffers.slice(*mean).to_vec(), 1, width),
                        ctx.constant(ctx.buffers.slice(*var).to_vec(), 1, width),
                    )
                } else {
                    ctx.column_stats(stat, (*mean, *var), width)
                };
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
            Op::NaryEmbed {
                x,
                table,
                nary,
                cols: (c0, w),
            } => {
                // The digits' rows (from the values on the host), padded to
                // the longest base with row 0 at weight 0, gathered and
                // pooled by their weights.
                let (n, bases) = (graph.width(*x), nary.carries.len());
                let most = nary.carries.iter().map(|&c| Nary::positions(c)).max().unwrap_or(1);
                let slots = b * n * bases * most;
                let (mut idx, mut weight) = (vec![0i64; slots], vec![0.0f32; slots]);
                for (i, &xv) in to_vec(v[x.0].clone()).iter().enumerate() {
                    let u = Nary::value(xv);
                    for k in 0..bases {
                        let at = (i * bases + k) * most;
                        let mut j = 0;
                        let digits = nary.rows(i % n, k, u, |r| {
                            idx[at + j] = r as i64;
                            j += 1;
                        });
                        let s = if nary.mean { 1.0 / digits as f32 } else { 1.0 };
                        weight[at..at + digits].iter_mut().for_each(|x| *x = s);
                    }
                }
                let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [slots]), ctx.device);
                let weight = Tensor::<2>::from_data(TensorData::new(weight, [slots, 1]), ctx.device);
                let rows = ctx.p[*table].clone().narrow(1, *c0, *w).select(0, idx) * weight;
                let pooled: Tensor<3> = rows.reshape([b * n * bases, most, *w]).sum_dim(1);
                pooled.reshape([b, width])
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
            Op::SeqAugment { x, len, mask, n, aug } => {
                if ctx.training {
                    let d = graph.width(*x) / n;
                    let (plans, lens) = aug.plans(&to_vec(v[len.0].clone()), *n, &mut ctx.rng);
                    // The positions as rows, then an empty row and the mask.
                    let table = Tensor::cat(
                        vec![
                            v[x.0].clone().reshape([b * n, d]),
                            ctx.constant(vec![0.0; d], 1, d),
                            ctx.p[*mask].clone(),
                        ],
                        0,
                    );
                    let at: Vec<i64> = plans
                        .iter()
                        .enumerate()
                        .map(|(k, &src)| match src {
                            augment::EMPTY => (b * n) as i64,
                            augment::MASKED => (b * n + 1) as i64,
                            src => ((k / n) * n) as i64 + src as i64,
                        })
                        .collect();
                    let idx = Tensor::<1, Int>::from_data(TensorData::new(at, [b * n]), ctx.device);
                    let y = table.select(0, idx).reshape([b, n * d]);
                    Tensor::cat(vec![y, ctx.constant(lens, b, 1)], 1)
                } else {
                    Tensor::cat(vec![v[x.0].clone(), v[len.0].clone()], 1)
                }
            }
            Op::Contrastive { a, b: other, kind } => {
                let e = if ctx.training { ctx.examples } else { b };
                let share = if e == 0 {
                    None
                } else {
                    let (x, y) = (v[a.0].clone().narrow(0, 0, e), v[other.0].clone().narrow(0, 0, e));
                    Some(contrastive(*kind, x, y, ctx))
                };
                match share {
                    Some(s) if b > e => Tensor::cat(vec![s, ctx.constant(vec![0.0; b - e], b - e, 1)], 0),
                    Some(s) => s,
                    None => ctx.constant(vec![0.0; b], b, 1),
                }
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

/// Each example's share of contrastive loss `kind` between rows `x` and
/// `y` (`[e, d]` each), `[e, 1]` (`Op::Contrastive`).
fn contrastive(kind: Contrast, x: Tensor<2>, y: Tensor<2>, ctx: &Ctx) -> Tensor<2> {
    let e = x.dims()[0];
    let lse = |s: Tensor<2>| {
        let m = s.clone().max_dim(1).detach();
        (s - m.clone()).exp().sum_dim(1).log() + m
    };
    match kind {
        Contrast::Nce { t } => {
            let pos = (x.clone() * y.clone()).sum_dim(1).div_scalar(t);
            let z = Tensor::cat(vec![x, y], 0);
            let m = 2 * e;
            // A row's own similarity left out: far below the rest.
            let own: Vec<f32> = (0..m * m).map(|k| if k % (m + 1) == 0 { -1e9 } else { 0.0 }).collect();
            let s = z.clone().matmul(z.transpose()).div_scalar(t) + ctx.constant(own, m, m);
            let l = lse(s);
            (l.clone().narrow(0, 0, e) + l.narrow(0, e, e)).mul_scalar(0.5) - pos
        }
        Contrast::InfoNce { t } => {
            let pos = (x.clone() * y.clone()).sum_dim(1).div_scalar(t);
            lse(x.matmul(y.transpose()).div_scalar(t)) - pos
        }
    }
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
