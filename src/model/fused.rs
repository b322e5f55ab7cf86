//! The fused CPU training pass: forward and backward of WideAndDeep and DLRM
//! on flat row-major buffers, with matrix products straight through `gemm`,
//! bias and activation applied in one sweep, the DLRM dot interaction per
//! row, batch norm and dropout in training mode, and no autodiff tape or
//! intermediate tensors.
//!
//! burn's graph (`Net::forward`) stays the reference: it runs the other
//! networks, evaluation and export, and the tests hold both passes to the
//! same loss, gradients and batch statistics. Dropout draws its masks from
//! the same generator, in the same order, as the graph.

use gemm::Parallelism;
use rayon::prelude::*;

use super::arch::{Net, Wide};
use super::layers::{BatchNorm, BnStats, Dnn, DnnLayer, Linear, BN_EPS};
use super::{GroupLayout, ParamStore};
use crate::config::model_plan::{Activation, Interaction};
use crate::config::typed::LossKind;
use crate::util::Rng;

/// Loss of a batch and its gradients: every dense parameter (flat, in
/// `ParamStore` layout) and every group input matrix.
pub struct PassGrads {
    pub loss: f32,
    pub dense: Vec<f32>,
    pub inputs: Vec<Vec<f32>>,
    /// Batch statistics of every batch norm, for its moving averages.
    pub bn_stats: Vec<BnStats>,
}

/// Rows per parallel chunk of the element-wise sweeps.
const ROWS: usize = 64;

/// Whether `net` trains on the fused pass: WideAndDeep and DLRM.
pub fn supports(net: &Net) -> bool {
    matches!(net, Net::WideAndDeep { .. } | Net::Dlrm { .. })
}

/// `c[m, n] (+)= op(a)[m, k] · op(b)[k, n]`, all row-major; `ta` / `tb` read
/// `a` as `[k, m]` / `b` as `[n, k]`, transposed.
fn matmul(c: &mut [f32], a: &[f32], ta: bool, b: &[f32], tb: bool, (m, k, n): (usize, usize, usize), acc: bool) {
    assert!(
        c.len() == m * n && a.len() == m * k && b.len() == k * n,
        "matmul shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            c.fill(0.0);
        }
        return;
    }
    let (a_rs, a_cs) = if ta { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if tb { (1, k as isize) } else { (n as isize, 1) };
    // SAFETY: the asserted lengths bound every index gemm forms from these
    // shapes and strides, and `c` does not alias `a` or `b` (borrow rules).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            acc,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::Rayon(0),
        );
    }
}

/// Samples per interaction block: the lanes of its vector loops.
const LANES: usize = 16;

/// DLRM's dot interaction for up to `LANES` samples at once. The `n`
/// vectors of width `dim` (bottom output first, then the embeddings) are
/// held sample-minor, `[vector * dim + element][sample]`, so one pair's dot
/// products for the whole block are lane-wise multiply-adds with no
/// horizontal sums.
struct Interact {
    dim: usize,
    /// `(i, j)` of each kept Gram entry, in output order.
    pairs: Vec<(usize, usize)>,
    a: Vec<[f32; LANES]>,
    /// Gradients of `a`.
    da: Vec<[f32; LANES]>,
    /// One value per pair: the dot products, or their gradients.
    out: Vec<[f32; LANES]>,
    /// Per vector, `(pair, other vector)` of every pair it is in.
    partners: Vec<Vec<(usize, usize)>>,
}

impl Interact {
    fn new(n: usize, dim: usize, tri: &[i64]) -> Self {
        let pairs: Vec<(usize, usize)> = tri.iter().map(|&f| (f as usize / n, f as usize % n)).collect();
        let mut partners = vec![Vec::new(); n];
        for (p, &(i, j)) in pairs.iter().enumerate() {
            partners[i].push((p, j));
            partners[j].push((p, i));
        }
        Interact {
            dim,
            pairs,
            partners,
            a: vec![[0.0; LANES]; n * dim],
            da: vec![[0.0; LANES]; n * dim],
            out: vec![[0.0; LANES]; tri.len()],
        }
    }

    /// Loads `count` samples: their bottom outputs (`count` rows of `dim`)
    /// and embeddings (`count` rows of `(n - 1) * dim`). Unused lanes keep
    /// stale values; their results are never read.
    fn load(&mut self, bottom: &[f32], embeddings: &[f32], count: usize) {
        let dim = self.dim;
        let sw = self.a.len() - dim;
        for l in 0..count {
            for (v, x) in self.a[..dim].iter_mut().zip(&bottom[l * dim..(l + 1) * dim]) {
                v[l] = *x;
            }
            for (v, x) in self.a[dim..].iter_mut().zip(&embeddings[l * sw..(l + 1) * sw]) {
                v[l] = *x;
            }
        }
    }

    /// `out[p] = a_i · a_j` for every kept pair `p = (i, j)`.
    fn forward(&mut self) {
        let dim = self.dim;
        for (o, &(i, j)) in self.out.iter_mut().zip(&self.pairs) {
            let mut acc = [0.0f32; LANES];
            for (x, y) in self.a[i * dim..(i + 1) * dim]
                .iter()
                .zip(&self.a[j * dim..(j + 1) * dim])
            {
                for l in 0..LANES {
                    acc[l] += x[l] * y[l];
                }
            }
            *o = acc;
        }
    }

    /// `da` from the gradients in `out`: d(a_i · a_j) sends `a_j` into
    /// `a_i`'s gradient and `a_i` into `a_j`'s (twice `a_i` when i = j).
    /// Each gradient element is summed in registers over its vector's
    /// partners.
    fn backward(&mut self) {
        let dim = self.dim;
        for (u, partners) in self.partners.iter().enumerate() {
            for k in 0..dim {
                let mut acc = [0.0f32; LANES];
                for &(p, v) in partners {
                    let (g, x) = (&self.out[p], &self.a[v * dim + k]);
                    for l in 0..LANES {
                        acc[l] += g[l] * x[l];
                    }
                }
                self.da[u * dim + k] = acc;
            }
        }
    }
}

/// Column sums of a row-major `[rows, n]` matrix, added into `out`.
fn add_col_sums(x: &[f32], n: usize, out: &mut [f32]) {
    let parts: Vec<Vec<f32>> = x
        .par_chunks(n * ROWS * 4)
        .map(|chunk| {
            let mut s = vec![0.0f32; n];
            for row in chunk.chunks_exact(n) {
                s.iter_mut().zip(row).for_each(|(a, v)| *a += v);
            }
            s
        })
        .collect();
    for p in parts {
        out.iter_mut().zip(p).for_each(|(a, v)| *a += v);
    }
}

fn activate(a: Activation, v: f32) -> f32 {
    match a {
        Activation::Relu => v.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Activation::Tanh => v.tanh(),
        Activation::Linear => v,
    }
}

/// Derivative of the activation, from its output `y`.
fn slope(a: Activation, y: f32) -> f32 {
    match a {
        Activation::Relu => {
            if y > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        Activation::Sigmoid => y * (1.0 - y),
        Activation::Tanh => 1.0 - y * y,
        Activation::Linear => 1.0,
    }
}

/// `act(x · W + bias)` for `b` rows.
fn linear_fwd(p: &ParamStore, l: &Linear, act: Activation, x: &[f32], b: usize) -> Vec<f32> {
    let n = l.d_out;
    let mut y = vec![0.0f32; b * n];
    matmul(&mut y, x, false, p.slice(l.w), false, (b, l.d_in, n), false);
    let bias = l.b.map(|i| p.slice(i));
    if bias.is_some() || act != Activation::Linear {
        y.par_chunks_mut(n * ROWS).for_each(|chunk| {
            for row in chunk.chunks_exact_mut(n) {
                if let Some(bias) = bias {
                    row.iter_mut().zip(bias).for_each(|(v, c)| *v += c);
                }
                if act != Activation::Linear {
                    row.iter_mut().for_each(|v| *v = activate(act, *v));
                }
            }
        });
    }
    y
}

/// Backward of `y = act(x · W + bias)` given `dy`: accumulates the kernel
/// and bias gradients into `dense`, and returns `dx` when asked.
fn linear_bwd(
    p: &ParamStore,
    l: &Linear,
    act: Activation,
    (x, y, mut dy): (&[f32], &[f32], Vec<f32>),
    dense: &mut [f32],
    need_dx: bool,
) -> Option<Vec<f32>> {
    let (k, n) = (l.d_in, l.d_out);
    let b = y.len() / n;
    mul_slope(act, &mut dy, y, n);
    let w = &p.specs[l.w];
    matmul(&mut dense[w.range()], x, true, &dy, false, (k, b, n), true);
    if let Some(bi) = l.b {
        add_col_sums(&dy, n, &mut dense[p.specs[bi].range()]);
    }
    need_dx.then(|| {
        let mut dx = vec![0.0f32; b * k];
        matmul(&mut dx, &dy, false, p.slice(l.w), true, (b, n, k), false);
        dx
    })
}

/// Per-column sums, in f64, of `f(a value, b value, column)` over the rows
/// of two row-major `[rows, n]` matrices read side by side (pass the same
/// matrix twice for sums over one). Partial sums of fixed row blocks are
/// added in order, so the result does not depend on the threads.
fn col_sums_f64(a: &[f32], b: &[f32], n: usize, f: impl Fn(f32, f32, usize) -> f64 + Sync) -> Vec<f64> {
    let parts: Vec<Vec<f64>> = a
        .par_chunks(n * ROWS * 4)
        .zip(b.par_chunks(n * ROWS * 4))
        .map(|(ac, bc)| {
            let mut s = vec![0.0f64; n];
            for (ar, br) in ac.chunks_exact(n).zip(bc.chunks_exact(n)) {
                for c in 0..n {
                    s[c] += f(ar[c], br[c], c);
                }
            }
            s
        })
        .collect();
    let mut sums = vec![0.0f64; n];
    for p in parts {
        sums.iter_mut().zip(p).for_each(|(s, v)| *s += v);
    }
    sums
}

/// `g *= act'(y)` row block by row block, `y` being the activation's output.
fn mul_slope(act: Activation, g: &mut [f32], y: &[f32], n: usize) {
    if act != Activation::Linear {
        g.par_chunks_mut(n * ROWS)
            .zip(y.par_chunks(n * ROWS))
            .for_each(|(d, y)| d.iter_mut().zip(y).for_each(|(d, y)| *d *= slope(act, *y)));
    }
}

/// One DNN layer's values, kept for the backward sweep.
struct LayerTrace {
    /// The activation's output (before dropout).
    act: Vec<f32>,
    /// With batch norm: the normalised values and `1 / sqrt(var + eps)` per
    /// column.
    bn: Option<(Vec<f32>, Vec<f32>)>,
    /// With dropout: the layer's output and the mask it was scaled by.
    dropped: Option<(Vec<f32>, Vec<f32>)>,
}

impl LayerTrace {
    /// What the next layer sees.
    fn out(&self) -> &[f32] {
        self.dropped.as_ref().map_or(&self.act, |(y, _)| y)
    }
}

/// A DNN's layers, kept for the backward sweep.
struct Trace {
    layers: Vec<LayerTrace>,
}

impl Trace {
    fn last(&self) -> &[f32] {
        self.layers.last().expect("a traced stack has a layer").out()
    }
}

/// Training-mode batch norm of `z` (`[b, n]`, bias included) followed by the
/// activation: returns the activation output and the normalised values
/// (written over `z`) with `1 / sqrt(var + eps)`; records the batch mean and
/// (biased) variance.
fn bn_fwd(
    p: &ParamStore,
    bn: &BatchNorm,
    act: Activation,
    mut z: Vec<f32>,
    n: usize,
    stats: &mut Vec<BnStats>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let b = (z.len() / n) as f64;
    let mean: Vec<f32> = col_sums_f64(&z, &z, n, |v, _, _| v as f64)
        .into_iter()
        .map(|s| (s / b) as f32)
        .collect();
    let var: Vec<f32> = col_sums_f64(&z, &z, n, |v, _, c| {
        let d = (v - mean[c]) as f64;
        d * d
    })
    .into_iter()
    .map(|s| (s / b) as f32)
    .collect();
    let inv: Vec<f32> = var.iter().map(|v| 1.0 / (v + BN_EPS).sqrt()).collect();
    let (gamma, beta) = (p.slice(bn.gamma), p.slice(bn.beta));
    let mut a = vec![0.0f32; z.len()];
    z.par_chunks_mut(n * ROWS)
        .zip(a.par_chunks_mut(n * ROWS))
        .for_each(|(zc, ac)| {
            for (zr, ar) in zc.chunks_exact_mut(n).zip(ac.chunks_exact_mut(n)) {
                for c in 0..n {
                    let xh = (zr[c] - mean[c]) * inv[c];
                    zr[c] = xh;
                    ar[c] = activate(act, xh * gamma[c] + beta[c]);
                }
            }
        });
    stats.push(BnStats {
        mean_buffer: bn.mean,
        var_buffer: bn.var,
        mean,
        var,
    });
    (a, z, inv)
}

/// Backward of batch norm: `g` holds the gradient of its output and becomes
/// that of its input; gamma's and beta's gradients go into `dense`.
fn bn_bwd(p: &ParamStore, bn: &BatchNorm, g: &mut [f32], (xhat, inv): (&[f32], &[f32]), dense: &mut [f32]) {
    let n = inv.len();
    let b = g.len() / n;
    let dbeta = col_sums_f64(g, g, n, |v, _, _| v as f64);
    let dgamma = col_sums_f64(g, xhat, n, |v, x, _| (v * x) as f64);
    let gamma = p.slice(bn.gamma);
    for (range, sums) in [(p.specs[bn.gamma].range(), &dgamma), (p.specs[bn.beta].range(), &dbeta)] {
        dense[range].iter_mut().zip(sums).for_each(|(d, s)| *d += *s as f32);
    }
    let bf = b as f64;
    let m1: Vec<f32> = dbeta.iter().map(|s| (s / bf) as f32).collect();
    let m2: Vec<f32> = dgamma.iter().map(|s| (s / bf) as f32).collect();
    let scale: Vec<f32> = gamma.iter().zip(inv).map(|(g, i)| g * i).collect();
    g.par_chunks_mut(n * ROWS)
        .zip(xhat.par_chunks(n * ROWS))
        .for_each(|(gc, xc)| {
            for (gr, xr) in gc.chunks_exact_mut(n).zip(xc.chunks_exact(n)) {
                for c in 0..n {
                    gr[c] = scale[c] * (gr[c] - m1[c] - xr[c] * m2[c]);
                }
            }
        });
}

/// Inverted dropout's mask for a `[b, n]` output, drawn row-major from
/// `rng` exactly as the graph draws it.
fn dropout_mask(rate: f32, len: usize, rng: &mut Rng) -> Vec<f32> {
    let keep = 1.0 - rate;
    (0..len)
        .map(|_| if rng.uniform() < keep as f64 { 1.0 / keep } else { 0.0 })
        .collect()
}

/// Training-mode forward of one DNN layer: dense, batch norm, activation,
/// dropout.
fn layer_fwd(
    p: &ParamStore,
    l: &DnnLayer,
    act: Activation,
    x: &[f32],
    b: usize,
    rng: &mut Rng,
    stats: &mut Vec<BnStats>,
) -> LayerTrace {
    let n = l.linear.d_out;
    let (act_out, bn) = match &l.bn {
        None => (linear_fwd(p, &l.linear, act, x, b), None),
        Some(bn) => {
            let z = linear_fwd(p, &l.linear, Activation::Linear, x, b);
            let (a, xhat, inv) = bn_fwd(p, bn, act, z, n, stats);
            (a, Some((xhat, inv)))
        }
    };
    let dropped = (l.dropout > 0.0).then(|| {
        let mask = dropout_mask(l.dropout, act_out.len(), rng);
        let y = act_out.iter().zip(&mask).map(|(a, m)| a * m).collect();
        (y, mask)
    });
    LayerTrace {
        act: act_out,
        bn,
        dropped,
    }
}

/// Backward of one DNN layer from the gradient of its output: accumulates
/// its parameters' gradients into `dense` and returns that of its input
/// when asked.
fn layer_bwd(
    p: &ParamStore,
    l: &DnnLayer,
    act: Activation,
    (x, t, mut g): (&[f32], &LayerTrace, Vec<f32>),
    dense: &mut [f32],
    need_dx: bool,
) -> Option<Vec<f32>> {
    if let Some((_, mask)) = &t.dropped {
        g.iter_mut().zip(mask).for_each(|(g, m)| *g *= m);
    }
    match (&l.bn, &t.bn) {
        (Some(bn), Some((xhat, inv))) => {
            mul_slope(act, &mut g, &t.act, l.linear.d_out);
            bn_bwd(p, bn, &mut g, (xhat, inv), dense);
            linear_bwd(p, &l.linear, Activation::Linear, (x, &t.act, g), dense, need_dx)
        }
        _ => linear_bwd(p, &l.linear, act, (x, &t.act, g), dense, need_dx),
    }
}

fn dnn_fwd(p: &ParamStore, d: &Dnn, x: &[f32], b: usize, rng: &mut Rng, stats: &mut Vec<BnStats>) -> Trace {
    let mut layers: Vec<LayerTrace> = Vec::with_capacity(d.layers.len());
    for l in &d.layers {
        let input = layers.last().map_or(x, LayerTrace::out);
        let t = layer_fwd(p, l, d.activation, input, b, rng, stats);
        layers.push(t);
    }
    Trace { layers }
}

/// Backward through a DNN from the gradient of its output; returns the
/// gradient of its input when asked.
fn dnn_bwd(
    p: &ParamStore,
    d: &Dnn,
    x: &[f32],
    t: &Trace,
    dy: Vec<f32>,
    dense: &mut [f32],
    need_dx: bool,
) -> Option<Vec<f32>> {
    let mut g = dy;
    for (i, l) in d.layers.iter().enumerate().rev() {
        let input = if i == 0 { x } else { t.layers[i - 1].out() };
        let want = i > 0 || need_dx;
        match layer_bwd(p, l, d.activation, (input, &t.layers[i], g), dense, want) {
            Some(dx) => g = dx,
            None => return None,
        }
    }
    Some(g)
}

/// A DNN with no layers passes its input through.
fn dnn_out<'a>(t: &'a Trace, x: &'a [f32]) -> &'a [f32] {
    if t.layers.is_empty() {
        x
    } else {
        t.last()
    }
}

/// Mean loss of `logits` and its gradient with respect to each logit.
fn loss_grad(kind: LossKind, logits: &[f32], labels: &[f32]) -> (f32, Vec<f32>) {
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
        })
        .collect();
    ((total / logits.len() as f64) as f32, grad)
}

/// The wide side: summed wide embeddings of every wide group plus a linear
/// map of its raw values, `[b, dim]`.
fn wide_fwd(w: &Wide, p: &ParamStore, groups: &[GroupLayout], x: &[Vec<f32>], b: usize) -> Option<Vec<f32>> {
    if w.groups.is_empty() {
        return None;
    }
    let dim = w.dim;
    let mut s = vec![0.0f32; b * dim];
    for (&(g, n, dw), raw) in w.groups.iter().zip(&w.raw) {
        let width = groups[g].width;
        s.par_chunks_mut(dim)
            .zip(x[g].par_chunks(width))
            .for_each(|(out, row)| {
                for k in 0..n {
                    out.iter_mut()
                        .zip(&row[k * dim..(k + 1) * dim])
                        .for_each(|(o, v)| *o += v);
                }
            });
        if let Some(kernel) = raw {
            let xr = raw_columns(&x[g], width, n * dim, dw);
            matmul(&mut s, &xr, false, p.slice(*kernel), false, (b, dw, dim), true);
        }
    }
    Some(s)
}

/// Columns `[from, from + w)` of a `[rows, width]` matrix, contiguous.
fn raw_columns(x: &[f32], width: usize, from: usize, w: usize) -> Vec<f32> {
    x.chunks_exact(width)
        .flat_map(|row| &row[from..from + w])
        .copied()
        .collect()
}

fn wide_bwd(w: &Wide, groups: &[GroupLayout], x: &[Vec<f32>], ds: &[f32], grads: &mut PassGrads, p: &ParamStore) {
    let dim = w.dim;
    let b = ds.len() / dim;
    for (&(g, n, dw), raw) in w.groups.iter().zip(&w.raw) {
        let width = groups[g].width;
        grads.inputs[g]
            .par_chunks_mut(width)
            .zip(ds.par_chunks(dim))
            .for_each(|(row, d)| {
                for k in 0..n {
                    row[k * dim..(k + 1) * dim].iter_mut().zip(d).for_each(|(a, v)| *a += v);
                }
            });
        if let Some(kernel) = raw {
            let xr = raw_columns(&x[g], width, n * dim, dw);
            let dk = &mut grads.dense[p.specs[*kernel].range()];
            matmul(dk, &xr, true, ds, false, (dw, b, dim), true);
            // The raw columns' own gradient, for a complete input gradient.
            let mut dxr = vec![0.0f32; b * dw];
            matmul(&mut dxr, ds, false, p.slice(*kernel), true, (b, dim, dw), false);
            for (row, d) in grads.inputs[g].chunks_exact_mut(width).zip(dxr.chunks_exact(dw)) {
                row[n * dim..].iter_mut().zip(d).for_each(|(a, v)| *a += v);
            }
        }
    }
}

fn has_tables(g: &GroupLayout) -> bool {
    g.parts.iter().any(|p| p.table.is_some())
}

/// Loss and gradients of one batch on the fused pass (see `supports`), from
/// group input matrices `[b, width]` and `b` labels; dropout masks come
/// from `rng`.
pub fn loss_and_grads(
    net: &Net,
    groups: &[GroupLayout],
    p: &ParamStore,
    x: &[Vec<f32>],
    labels: &[f32],
    kind: LossKind,
    rng: &mut Rng,
) -> PassGrads {
    let b = labels.len();
    let mut grads = PassGrads {
        loss: 0.0,
        dense: vec![0.0; p.values.len()],
        inputs: groups.iter().map(|g| vec![0.0; b * g.width]).collect(),
        bn_stats: Vec::new(),
    };
    let stats = &mut grads.bn_stats;
    match net {
        Net::WideAndDeep {
            wide,
            deep,
            dnn,
            final_dnn,
            out,
        } => {
            let w = wide_fwd(wide, p, groups, x, b);
            let deep_in = &x[*deep];
            let t = dnn_fwd(p, dnn, deep_in, b, rng, stats);
            let h = dnn_out(&t, deep_in);
            let hd = dnn.d_out;
            let need_deep = has_tables(&groups[*deep]);
            let (dw, dh) = match final_dnn {
                Some(f) => {
                    let wd = wide.dim;
                    let mut cat = vec![0.0f32; b * (wd + hd)];
                    cat.par_chunks_mut(wd + hd).enumerate().for_each(|(r, row)| {
                        if let Some(w) = &w {
                            row[..wd].copy_from_slice(&w[r * wd..(r + 1) * wd]);
                        }
                        row[wd..].copy_from_slice(&h[r * hd..(r + 1) * hd]);
                    });
                    let tf = dnn_fwd(p, f, &cat, b, rng, stats);
                    let top = dnn_out(&tf, &cat);
                    let logits = linear_fwd(p, out, Activation::Linear, top, b);
                    let (loss, dl) = loss_grad(kind, &logits, labels);
                    grads.loss = loss;
                    let dtop = linear_bwd(p, out, Activation::Linear, (top, &logits, dl), &mut grads.dense, true)
                        .expect("asked for dx");
                    let dcat = if f.layers.is_empty() {
                        dtop
                    } else {
                        dnn_bwd(p, f, &cat, &tf, dtop, &mut grads.dense, true).expect("asked for dx")
                    };
                    let mut dw = vec![0.0f32; b * wd];
                    let mut dh = vec![0.0f32; b * hd];
                    for r in 0..b {
                        let row = &dcat[r * (wd + hd)..(r + 1) * (wd + hd)];
                        dw[r * wd..(r + 1) * wd].copy_from_slice(&row[..wd]);
                        dh[r * hd..(r + 1) * hd].copy_from_slice(&row[wd..]);
                    }
                    (dw, dh)
                }
                None => {
                    let mut logits = linear_fwd(p, out, Activation::Linear, h, b);
                    if let Some(w) = &w {
                        logits.iter_mut().zip(w).for_each(|(l, v)| *l += v);
                    }
                    let (loss, dl) = loss_grad(kind, &logits, labels);
                    grads.loss = loss;
                    let dh = linear_bwd(
                        p,
                        out,
                        Activation::Linear,
                        (h, &logits, dl.clone()),
                        &mut grads.dense,
                        true,
                    )
                    .expect("asked for dx");
                    (dl, dh)
                }
            };
            if w.is_some() {
                wide_bwd(wide, groups, x, &dw, &mut grads, p);
            }
            let dx = if dnn.layers.is_empty() {
                Some(dh)
            } else {
                dnn_bwd(p, dnn, deep_in, &t, dh, &mut grads.dense, need_deep)
            };
            if let Some(dx) = dx.filter(|_| need_deep) {
                grads.inputs[*deep].iter_mut().zip(dx).for_each(|(a, v)| *a += v);
            }
        }
        Net::Dlrm {
            dense,
            sparse,
            n_sparse,
            dim,
            bot,
            top,
            out,
            interaction,
            tri,
            with_dense,
        } => {
            let (n_sparse, dim) = (*n_sparse, *dim);
            let dense_in = &x[*dense];
            let tb = dnn_fwd(p, bot, dense_in, b, rng, stats);
            let d = dnn_out(&tb, dense_in);
            let dd_w = bot.d_out;
            let s = &x[*sparse];
            let sw = n_sparse * dim;
            let dense_cols = match interaction {
                Interaction::Dot if !*with_dense => 0,
                _ => dd_w,
            };
            let zw = match interaction {
                Interaction::Dot => dense_cols + tri.len(),
                Interaction::Cat => dd_w + sw,
            };
            let n = n_sparse + 1;
            let mut z = vec![0.0f32; b * zw];
            z.par_chunks_mut(zw * ROWS).enumerate().for_each(|(c, zc)| {
                let mut dots = Interact::new(n, dim, tri);
                for (q, zq) in zc.chunks_mut(zw * LANES).enumerate() {
                    let r0 = c * ROWS + q * LANES;
                    let count = zq.len() / zw;
                    for (k, zr) in zq.chunks_exact_mut(zw).enumerate() {
                        let r = r0 + k;
                        zr[..dense_cols].copy_from_slice(&d[r * dd_w..r * dd_w + dense_cols]);
                        if let Interaction::Cat = interaction {
                            zr[dd_w..].copy_from_slice(&s[r * sw..(r + 1) * sw]);
                        }
                    }
                    if let Interaction::Dot = interaction {
                        dots.load(
                            &d[r0 * dd_w..(r0 + count) * dd_w],
                            &s[r0 * sw..(r0 + count) * sw],
                            count,
                        );
                        dots.forward();
                        for (k, zr) in zq.chunks_exact_mut(zw).enumerate() {
                            for (o, v) in zr[dense_cols..].iter_mut().zip(&dots.out) {
                                *o = v[k];
                            }
                        }
                    }
                }
            });
            let tt = dnn_fwd(p, top, &z, b, rng, stats);
            let h = dnn_out(&tt, &z);
            let logits = linear_fwd(p, out, Activation::Linear, h, b);
            let (loss, dl) = loss_grad(kind, &logits, labels);
            grads.loss = loss;
            let dh =
                linear_bwd(p, out, Activation::Linear, (h, &logits, dl), &mut grads.dense, true).expect("asked for dx");
            let dz = if top.layers.is_empty() {
                dh
            } else {
                dnn_bwd(p, top, &z, &tt, dh, &mut grads.dense, true).expect("asked for dx")
            };
            let mut dd = vec![0.0f32; b * dd_w];
            let need_sparse = has_tables(&groups[*sparse]);
            let ds = &mut grads.inputs[*sparse];
            dd.par_chunks_mut(dd_w * ROWS)
                .zip(ds.par_chunks_mut(sw * ROWS))
                .enumerate()
                .for_each(|(c, (ddc, dsc))| {
                    let mut dots = Interact::new(n, dim, tri);
                    for (q, (ddq, dsq)) in ddc.chunks_mut(dd_w * LANES).zip(dsc.chunks_mut(sw * LANES)).enumerate() {
                        let r0 = c * ROWS + q * LANES;
                        let count = ddq.len() / dd_w;
                        let dzq = &dz[r0 * zw..(r0 + count) * zw];
                        for (ddr, dzr) in ddq.chunks_exact_mut(dd_w).zip(dzq.chunks_exact(zw)) {
                            ddr[..dense_cols].copy_from_slice(&dzr[..dense_cols]);
                        }
                        match interaction {
                            Interaction::Cat => {
                                if need_sparse {
                                    for (dsr, dzr) in dsq.chunks_exact_mut(sw).zip(dzq.chunks_exact(zw)) {
                                        dsr.copy_from_slice(&dzr[dd_w..]);
                                    }
                                }
                            }
                            Interaction::Dot => {
                                dots.load(
                                    &d[r0 * dd_w..(r0 + count) * dd_w],
                                    &s[r0 * sw..(r0 + count) * sw],
                                    count,
                                );
                                for (k, dzr) in dzq.chunks_exact(zw).enumerate() {
                                    for (g, v) in dots.out.iter_mut().zip(&dzr[dense_cols..]) {
                                        g[k] = *v;
                                    }
                                }
                                dots.backward();
                                for (k, (ddr, dsr)) in
                                    ddq.chunks_exact_mut(dd_w).zip(dsq.chunks_exact_mut(sw)).enumerate()
                                {
                                    // The bottom output's gradient adds to the part passed through.
                                    ddr.iter_mut().zip(&dots.da[..dim]).for_each(|(o, v)| *o += v[k]);
                                    dsr.iter_mut().zip(&dots.da[dim..]).for_each(|(o, v)| *o = v[k]);
                                }
                            }
                        }
                    }
                });
            if !need_sparse {
                ds.fill(0.0);
            }
            let need_dense = has_tables(&groups[*dense]);
            let dx = if bot.layers.is_empty() {
                Some(dd)
            } else {
                dnn_bwd(p, bot, dense_in, &tb, dd, &mut grads.dense, need_dense)
            };
            if let Some(dx) = dx.filter(|_| need_dense) {
                grads.inputs[*dense].iter_mut().zip(dx).for_each(|(a, v)| *a += v);
            }
        }
        _ => unreachable!("callers check `supports` first"),
    }
    grads
}
