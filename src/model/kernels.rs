//! CPU kernels of the model graph's ops on flat row-major buffers: matrix
//! products straight through `gemm`, bias and activation in one sweep,
//! batch norm with f64 statistics, inverted dropout, and the dot
//! interaction over blocks of samples held sample-minor.

use gemm::Parallelism;
use rayon::prelude::*;

use super::graph::BN_EPS;
use crate::config::model_plan::Activation;
use crate::config::tasks::{KdKind, KdTerm, LossKind, LossTermKind, Task, ZilnTerm};
use crate::util::Rng;

/// Rows per parallel chunk of the element-wise sweeps.
pub const ROWS: usize = 64;

/// `c[m, n] (+)= op(a)[m, k] · op(b)[k, n]`, all row-major; `ta` / `tb` read
/// `a` as `[k, m]` / `b` as `[n, k]`, transposed.
pub fn matmul(c: &mut [f32], a: &[f32], ta: bool, b: &[f32], tb: bool, (m, k, n): (usize, usize, usize), acc: bool) {
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

/// Softmax of `row` in place (an empty row stays empty).
pub fn softmax_in_place(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0;
    row.iter_mut().for_each(|v| {
        *v = (*v - m).exp();
        s += *v;
    });
    row.iter_mut().for_each(|v| *v /= s);
}

/// The index of the row's greatest value, the first among equals (as
/// TensorFlow's `argmax`): a multi-class task's predicted class.
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, k| if row[k] > row[b] { k } else { b })
}

/// `1 / sqrt(max(Σ v², L2_EPS))`: what TensorFlow's `l2_normalize`
/// scales a row by.
pub fn l2_inv(row: &[f32]) -> f32 {
    1.0 / row.iter().map(|v| v * v).sum::<f32>().max(super::graph::L2_EPS).sqrt()
}

/// How many of `n` positions a length `len` keeps live: position `k` is
/// live where `k < len` (a fractional length counts up, none below 0).
pub fn live(len: f32, n: usize) -> usize {
    (len.max(0.0).ceil() as usize).min(n)
}

/// The keys one batch row's queries attend to (`graph::Keys` read for it).
#[derive(Debug, Clone, Copy)]
pub enum RowKeys<'a> {
    /// The first `n` keys; a row with none gets zeros.
    Live(usize),
    /// 1 (attended) or 0 per key: `(1 - m) * MASK_ADDER` added to the scores.
    Mask(&'a [f32]),
}

/// `Op::Attention` over one batch row of `f` queries and `t` keys: `q`
/// `[f, heads * dk]`, `k` `[t, heads * dk]`, `v` `[t, heads * dv]`;
/// writes `out` `[f, heads * dv]` and the attention weights `probs`
/// `[heads, f, t]` (zeros for keys past a live prefix, for the backward
/// pass).
pub fn attention_fwd(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (heads, scale, keys): (usize, f32, RowKeys),
    (f, t): (usize, usize),
    out: &mut [f32],
    probs: &mut [f32],
) {
    let (wq, wv) = (q.len() / f, v.len() / t);
    let (dk, dv) = (wq / heads, wv / heads);
    let live = match keys {
        RowKeys::Live(n) => n.min(t),
        RowKeys::Mask(_) => t,
    };
    for h in 0..heads {
        for i in 0..f {
            let (p, masked) = probs[(h * f + i) * t..][..t].split_at_mut(live);
            masked.fill(0.0);
            let qi = &q[i * wq + h * dk..][..dk];
            for (j, pj) in p.iter_mut().enumerate() {
                let kj = &k[j * wq + h * dk..][..dk];
                *pj = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
            if let RowKeys::Mask(m) = keys {
                p.iter_mut()
                    .zip(m)
                    .for_each(|(p, m)| *p += (1.0 - m) * super::graph::MASK_ADDER);
            }
            if live > 0 {
                softmax_in_place(p);
            }
            let o = &mut out[i * wv + h * dv..][..dv];
            o.fill(0.0);
            for (j, pj) in p.iter().enumerate() {
                let vj = &v[j * wv + h * dv..][..dv];
                o.iter_mut().zip(vj).for_each(|(o, x)| *o += pj * x);
            }
        }
    }
}

/// The gradients of `attention_fwd` for one batch row of `f` queries and
/// `t` keys, `(dq, dk, dv)` written whole, from the output's gradient
/// `dout` and the saved weights (a mask is a constant: nothing flows to it).
pub fn attention_bwd(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (heads, scale): (usize, f32),
    (f, t): (usize, usize),
    (probs, dout): (&[f32], &[f32]),
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (wq, wv) = (q.len() / f, v.len() / t);
    let (dkw, dvw) = (wq / heads, wv / heads);
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    let mut ds = vec![0.0f32; t];
    for h in 0..heads {
        for i in 0..f {
            let p = &probs[(h * f + i) * t..][..t];
            let doi = &dout[i * wv + h * dvw..][..dvw];
            for (j, (pj, d)) in p.iter().zip(ds.iter_mut()).enumerate() {
                let (vj, dvj) = (&v[j * wv + h * dvw..][..dvw], &mut dv[j * wv + h * dvw..][..dvw]);
                *d = doi.iter().zip(vj).map(|(a, b)| a * b).sum();
                dvj.iter_mut().zip(doi).for_each(|(g, o)| *g += pj * o);
            }
            let s: f32 = p.iter().zip(&ds).map(|(a, b)| a * b).sum();
            let qi = &q[i * wq + h * dkw..][..dkw];
            for (j, (pj, d)) in p.iter().zip(&ds).enumerate() {
                let g = pj * (d - s) * scale;
                let kj = &k[j * wq + h * dkw..][..dkw];
                let dqi = &mut dq[i * wq + h * dkw..][..dkw];
                dqi.iter_mut().zip(kj).for_each(|(o, x)| *o += g * x);
                let dkj = &mut dk[j * wq + h * dkw..][..dkw];
                dkj.iter_mut().zip(qi).for_each(|(o, x)| *o += g * x);
            }
        }
    }
}

/// `Op::GroupedLinear` forward of one row: `n` blocks of `x` times their
/// rows of `w` (`[n * din, dout]`), plus `b`.
pub fn grouped_linear_row(x: &[f32], w: &[f32], b: Option<&[f32]>, n: usize, out: &mut [f32]) {
    let (din, dout) = (x.len() / n, out.len() / n);
    for k in 0..n {
        let o = &mut out[k * dout..][..dout];
        match b {
            Some(b) => o.copy_from_slice(&b[k * dout..][..dout]),
            None => o.fill(0.0),
        }
        for i in 0..din {
            let xv = x[k * din + i];
            let wr = &w[(k * din + i) * dout..][..dout];
            o.iter_mut().zip(wr).for_each(|(o, w)| *o += xv * w);
        }
    }
}

/// Each `width`-wide row of `x` read as an `[n, width / n]` matrix,
/// transposed.
pub fn transpose_rows(x: &[f32], width: usize, n: usize) -> Vec<f32> {
    let m = width / n;
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(width.max(1))
        .zip(x.par_chunks(width.max(1)))
        .for_each(|(out, row)| {
            for i in 0..n {
                for j in 0..m {
                    out[j * n + i] = row[i * m + j];
                }
            }
        });
    y
}

/// Column sums of a row-major `[rows, n]` matrix, added into `out`.
pub fn add_col_sums(x: &[f32], n: usize, out: &mut [f32]) {
    if n == 0 {
        return;
    }
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

/// `a · b` in 16 running partial sums, so it compiles to vector code (one
/// running sum is a chain the compiler may not reorder).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    let mut acc = [0.0f32; L];
    for (x, y) in ac.zip(bc) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The widest `Linear` output that the `narrow_*` sweeps compute instead of
/// gemm, whose packing costs more than such a product: MMoE's four-column
/// gates over 429 inputs took gemm 0.27 ms forward and 0.68 ms for the
/// weight gradient at batch 2048 (about 25 GFLOPS, a tenth of its rate on
/// wide layers).
pub const NARROW: usize = 8;

/// `w[k, n]` as `[n, k]`.
fn transposed(w: &[f32], (k, n): (usize, usize)) -> Vec<f32> {
    (0..n).flat_map(|j| (0..k).map(move |i| w[i * n + j])).collect()
}

/// `y[b, n] = x[b, k] · w[k, n]` for a narrow `n`: a dot product per output.
pub fn narrow_matmul(y: &mut [f32], x: &[f32], w: &[f32], (k, n): (usize, usize)) {
    let wt = transposed(w, (k, n));
    y.par_chunks_mut(n * ROWS)
        .zip(x.par_chunks(k * ROWS))
        .for_each(|(yb, xb)| {
            for (yr, xr) in yb.chunks_exact_mut(n).zip(xb.chunks_exact(k)) {
                for (v, wj) in yr.iter_mut().zip(wt.chunks_exact(k)) {
                    *v = dot(xr, wj);
                }
            }
        });
}

/// `dw[k, n] += x[b, k]ᵀ · dy[b, n]` for a narrow `n`, in row blocks whose
/// partial sums are added in order (independent of the threads).
pub fn narrow_weight_grad(dw: &mut [f32], x: &[f32], dy: &[f32], (k, n): (usize, usize)) {
    let parts: Vec<Vec<f32>> = x
        .par_chunks(k * ROWS * 4)
        .zip(dy.par_chunks(n * ROWS * 4))
        .map(|(xb, db)| {
            // Transposed, `[n, k]`: each row of x adds to n contiguous rows.
            let mut s = vec![0.0f32; n * k];
            for (xr, dr) in xb.chunks_exact(k).zip(db.chunks_exact(n)) {
                for (sj, d) in s.chunks_exact_mut(k).zip(dr) {
                    sj.iter_mut().zip(xr).for_each(|(a, v)| *a += v * d);
                }
            }
            s
        })
        .collect();
    for p in parts {
        for (j, pj) in p.chunks_exact(k).enumerate() {
            for (i, v) in pj.iter().enumerate() {
                dw[i * n + j] += v;
            }
        }
    }
}

/// `dx[b, k] (+)= dy[b, n] · w[k, n]ᵀ` for a narrow `n`.
pub fn narrow_input_grad(dx: &mut [f32], dy: &[f32], w: &[f32], (k, n): (usize, usize), acc: bool) {
    let wt = transposed(w, (k, n));
    dx.par_chunks_mut(k * ROWS)
        .zip(dy.par_chunks(n * ROWS))
        .for_each(|(xb, db)| {
            for (xr, dr) in xb.chunks_exact_mut(k).zip(db.chunks_exact(n)) {
                if !acc {
                    xr.fill(0.0);
                }
                for (wj, d) in wt.chunks_exact(k).zip(dr) {
                    xr.iter_mut().zip(wj).for_each(|(a, v)| *a += v * d);
                }
            }
        });
}

/// `tf.nn.leaky_relu`'s default slope below 0.
pub const LEAKY_SLOPE: f32 = 0.2;

pub fn activate(a: Activation, v: f32) -> f32 {
    match a {
        Activation::Relu => v.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Activation::Tanh => v.tanh(),
        Activation::Linear => v,
        Activation::LeakyRelu => {
            if v > 0.0 {
                v
            } else {
                LEAKY_SLOPE * v
            }
        }
        Activation::Dice => unreachable!("Scope builds Dice as an op of its own"),
    }
}

/// Derivative of the activation, from its output `y`.
pub fn slope(a: Activation, y: f32) -> f32 {
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
        Activation::LeakyRelu => {
            if y > 0.0 {
                1.0
            } else {
                LEAKY_SLOPE
            }
        }
        Activation::Dice => unreachable!("Scope builds Dice as an op of its own"),
    }
}

/// `g *= act'(y)` row block by row block, `y` being the activation's output.
pub fn mul_slope(act: Activation, g: &mut [f32], y: &[f32], n: usize) {
    fn sweep(g: &mut [f32], y: &[f32], n: usize, f: impl Fn(f32) -> f32 + Sync) {
        g.par_chunks_mut(n * ROWS)
            .zip(y.par_chunks(n * ROWS))
            .for_each(|(d, y)| d.iter_mut().zip(y).for_each(|(d, y)| *d *= f(*y)));
    }
    if n == 0 {
        return;
    }
    // One loop per activation, so the common ones compile to vector code
    // (a `match` per element kept the sweep scalar).
    match act {
        Activation::Linear => {}
        Activation::Relu => sweep(g, y, n, |y| slope(Activation::Relu, y)),
        a => sweep(g, y, n, move |y| slope(a, y)),
    }
}

/// `mul_slope`, then the result's column sums added into `out` (as
/// `add_col_sums`, the same row blocks in the same order), in one sweep
/// over `g`: a layer's output gradient and its bias gradient.
pub fn slope_col_sums(act: Activation, g: &mut [f32], y: &[f32], n: usize, out: &mut [f32]) {
    fn sweep(g: &mut [f32], y: &[f32], n: usize, f: impl Fn(f32) -> f32 + Sync) -> Vec<Vec<f32>> {
        g.par_chunks_mut(n * ROWS * 4)
            .zip(y.par_chunks(n * ROWS * 4))
            .map(|(gc, yc)| {
                let mut s = vec![0.0f32; n];
                for (gr, yr) in gc.chunks_exact_mut(n).zip(yc.chunks_exact(n)) {
                    for ((d, y), a) in gr.iter_mut().zip(yr).zip(s.iter_mut()) {
                        *d *= f(*y);
                        *a += *d;
                    }
                }
                s
            })
            .collect()
    }
    if n == 0 {
        return;
    }
    let parts = match act {
        Activation::Linear => sweep(g, y, n, |_| 1.0),
        Activation::Relu => sweep(g, y, n, |y| slope(Activation::Relu, y)),
        a => sweep(g, y, n, move |y| slope(a, y)),
    };
    for p in parts {
        out.iter_mut().zip(p).for_each(|(a, v)| *a += v);
    }
}

/// `y = act(y + bias)` in one sweep over `[rows, n]`.
pub fn bias_act(y: &mut [f32], n: usize, bias: Option<&[f32]>, act: Activation) {
    if (bias.is_none() && act == Activation::Linear) || n == 0 {
        return;
    }
    fn sweep(y: &mut [f32], n: usize, bias: Option<&[f32]>, f: impl Fn(f32) -> f32 + Sync) {
        y.par_chunks_mut(n * ROWS).for_each(|chunk| {
            for row in chunk.chunks_exact_mut(n) {
                match bias {
                    Some(bias) => row.iter_mut().zip(bias).for_each(|(v, c)| *v = f(*v + c)),
                    None => row.iter_mut().for_each(|v| *v = f(*v)),
                }
            }
        });
    }
    // One loop per activation, as in `mul_slope`.
    match act {
        Activation::Linear => sweep(y, n, bias, |v| v),
        Activation::Relu => sweep(y, n, bias, |v| activate(Activation::Relu, v)),
        a => sweep(y, n, bias, move |v| activate(a, v)),
    }
}

/// Per-column sums, in f64, of `f(a value, b value, column)` over the rows
/// of two row-major `[rows, n]` matrices read side by side (pass the same
/// matrix twice for sums over one). Partial sums of fixed row blocks are
/// added in order, so the result does not depend on the threads.
pub fn col_sums_f64(a: &[f32], b: &[f32], n: usize, f: impl Fn(f32, f32, usize) -> f64 + Sync) -> Vec<f64> {
    let mut sums = vec![0.0f64; n];
    if n == 0 {
        return sums;
    }
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
    for p in parts {
        sums.iter_mut().zip(p).for_each(|(s, v)| *s += v);
    }
    sums
}

/// Batch mean and biased variance of the columns of `[rows, n]`.
pub fn batch_moments(z: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let b = (z.len() / n.max(1)).max(1) as f64;
    let mean: Vec<f32> = col_sums_f64(z, z, n, |v, _, _| v as f64)
        .into_iter()
        .map(|s| (s / b) as f32)
        .collect();
    let var: Vec<f32> = col_sums_f64(z, z, n, |v, _, c| {
        let d = (v - mean[c]) as f64;
        d * d
    })
    .into_iter()
    .map(|s| (s / b) as f32)
    .collect();
    (mean, var)
}

/// Normalises `z` (`[rows, n]`) in place with `mean` and `inv = 1 / sqrt(var
/// + eps)`, and returns `act(xhat * gamma + beta)`.
pub fn bn_apply(
    z: &mut [f32],
    n: usize,
    (mean, inv): (&[f32], &[f32]),
    (gamma, beta): (&[f32], &[f32]),
    act: Activation,
) -> Vec<f32> {
    let mut a = vec![0.0f32; z.len()];
    if n == 0 {
        return a;
    }
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
    a
}

/// Dice's forward over `x` (`[rows, n]`, `n` the width of `alpha`) from
/// its normalised values `xhat`: its output and the gate `p = sigmoid(xhat)`.
pub fn dice(x: &[f32], xhat: &[f32], alpha: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let p: Vec<f32> = xhat.iter().map(|h| 1.0 / (1.0 + (-h).exp())).collect();
    let y = x
        .iter()
        .zip(&p)
        .zip(alpha.iter().cycle())
        .map(|((x, g), a)| x * (g + a * (1.0 - g)))
        .collect();
    (y, p)
}

pub fn bn_inv(var: &[f32]) -> Vec<f32> {
    var.iter().map(|v| 1.0 / (v + BN_EPS).sqrt()).collect()
}

/// Backward of training-mode batch norm: `g` holds the gradient of its
/// output (before the activation's slope is applied by the caller) and
/// becomes that of its input; returns the gradients of gamma and beta.
pub fn bn_bwd(g: &mut [f32], xhat: &[f32], inv: &[f32], gamma: &[f32], stat_rows: usize) -> (Vec<f64>, Vec<f64>) {
    let n = inv.len();
    let b = stat_rows.max(1) as f64;
    let dbeta = col_sums_f64(g, g, n, |v, _, _| v as f64);
    let dgamma = col_sums_f64(g, xhat, n, |v, x, _| (v * x) as f64);
    let m1: Vec<f32> = dbeta.iter().map(|s| (s / b) as f32).collect();
    let m2: Vec<f32> = dgamma.iter().map(|s| (s / b) as f32).collect();
    let scale: Vec<f32> = gamma.iter().zip(inv).map(|(g, i)| g * i).collect();
    if n > 0 {
        g.par_chunks_mut(n * ROWS)
            .zip(xhat.par_chunks(n * ROWS))
            .enumerate()
            .for_each(|(k, (gc, xc))| {
                for (r, (gr, xr)) in gc.chunks_exact_mut(n).zip(xc.chunks_exact(n)).enumerate() {
                    // Rows outside the statistics move no mean or variance.
                    if k * ROWS + r >= stat_rows {
                        gr.iter_mut().zip(&scale).for_each(|(v, s)| *v *= s);
                        continue;
                    }
                    for c in 0..n {
                        gr[c] = scale[c] * (gr[c] - m1[c] - xr[c] * m2[c]);
                    }
                }
            });
    }
    (dgamma, dbeta)
}

/// Inverted dropout's mask for `len` values, drawn in order from `rng`.
pub fn dropout_mask(rate: f32, len: usize, rng: &mut Rng) -> Vec<f32> {
    let keep = 1.0 - rate;
    (0..len)
        .map(|_| if rng.uniform() < keep as f64 { 1.0 / keep } else { 0.0 })
        .collect()
}

/// Variational dropout's keep values over `rows` rows of the dropout
/// logits `lp` (`Op::VariationalDropout`), `[rows, lp.len()]`, with their
/// derivatives by the logits. `u`: one uniform draw per value in training
/// (the concrete relaxation of a Bernoulli keep), none otherwise (the
/// expected keep `1 - rate`, derivatives left empty).
pub fn concrete_keep(lp: &[f32], rows: usize, u: Option<&[f32]>) -> (Vec<f32>, Vec<f32>) {
    use super::graph::{VD_EPS, VD_TEMP};
    let rates: Vec<f64> = lp.iter().map(|l| sigmoid(*l as f64)).collect();
    let Some(u) = u else {
        let keep = rates.iter().map(|r| (1.0 - r) as f32);
        return (keep.cycle().take(rows * lp.len()).collect(), Vec::new());
    };
    assert_eq!(u.len(), rows * lp.len(), "one draw per row and entry");
    let (eps, t) = (VD_EPS as f64, VD_TEMP as f64);
    let logit_rate: Vec<f64> = rates.iter().map(|r| (r + eps).ln() - (1.0 - r + eps).ln()).collect();
    // d logit(rate) / d lp through rate = sigmoid(lp).
    let dlogit: Vec<f64> = rates
        .iter()
        .map(|r| (1.0 / (r + eps) + 1.0 / (1.0 - r + eps)) * r * (1.0 - r))
        .collect();
    let mut keep = Vec::with_capacity(u.len());
    let mut dkeep = Vec::with_capacity(u.len());
    for (k, u) in u.iter().enumerate() {
        let j = k % lp.len();
        let u = *u as f64;
        let z = (logit_rate[j] + (u + eps).ln() - (1.0 - u + eps).ln()) / t;
        let s = sigmoid(z);
        keep.push((1.0 - s) as f32);
        dkeep.push((-s * (1.0 - s) / t * dlogit[j]) as f32);
    }
    (keep, dkeep)
}

/// Samples per interaction block: the lanes of its vector loops.
pub const LANES: usize = 16;

/// Dot products between vectors of width `dim` for up to `LANES` samples
/// at once. The vectors are held sample-minor, `[vector * dim +
/// element][sample]`, so one pair's dot products for the whole block are
/// lane-wise multiply-adds with no horizontal sums.
pub struct Interact {
    dim: usize,
    /// `(i, j)` of each output column.
    pairs: Vec<(usize, usize)>,
    pub a: Vec<[f32; LANES]>,
    /// Gradients of `a`.
    pub da: Vec<[f32; LANES]>,
    /// One value per pair: the dot products, or their gradients.
    pub out: Vec<[f32; LANES]>,
    /// Per vector, `(pair, other vector)` of every pair it is in.
    partners: Vec<Vec<(usize, usize)>>,
}

impl Interact {
    pub fn new(n: usize, dim: usize, pairs: &[(usize, usize)]) -> Self {
        let mut partners = vec![Vec::new(); n];
        for (p, &(i, j)) in pairs.iter().enumerate() {
            partners[i].push((p, j));
            partners[j].push((p, i));
        }
        Interact {
            dim,
            pairs: pairs.to_vec(),
            partners,
            a: vec![[0.0; LANES]; n * dim],
            da: vec![[0.0; LANES]; n * dim],
            out: vec![[0.0; LANES]; pairs.len()],
        }
    }

    /// Loads `count` samples starting at row `r0` from matrices laid side
    /// by side (`(values, width)` each). Unused lanes keep stale values;
    /// their results are never read.
    pub fn load(&mut self, xs: &[(&[f32], usize)], r0: usize, count: usize) {
        let mut col = 0;
        for &(x, w) in xs {
            for l in 0..count {
                let row = &x[(r0 + l) * w..(r0 + l + 1) * w];
                for (v, value) in self.a[col..col + w].iter_mut().zip(row) {
                    v[l] = *value;
                }
            }
            col += w;
        }
    }

    /// `out[p] = a_i · a_j` for every pair `p = (i, j)`.
    pub fn forward(&mut self) {
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
    pub fn backward(&mut self) {
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
pub fn ziln_prediction(z: &[f32], p: crate::config::tasks::ZilnPrediction) -> (f32, f32) {
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

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// log(1 + exp(x)), stable.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
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

/// What a match model's in-batch softmax reads: per row the user
/// embedding times the similarity's scale (`us`), the item embedding (`v`)
/// and the plain user embedding (`u`), each `[n, d]`. The first `users`
/// rows are examples; the others are sampled items, whose user rows are
/// not read. The last of them may be hard negatives, each scored by one
/// user only (`hard`: per one, its user and its row).
pub struct Towers<'a> {
    pub us: &'a [f32],
    pub v: &'a [f32],
    pub u: &'a [f32],
    pub d: usize,
    pub users: usize,
    /// The users' sample weights (`None`: all 1).
    pub weights: Option<&'a [f32]>,
    pub hard: &'a [(usize, usize)],
    /// Leave the batch's other items out of each user's logits
    /// (`NO_HARD_NEGATIVE` in their columns).
    pub ignore_in_batch: bool,
    /// Each user's item, hashed (empty: none given): the batch's other
    /// examples of the same item are left out of its logits.
    pub items: &'a [u64],
}

impl Towers<'_> {
    /// The items every user is scored against: the examples' and the
    /// drawn ones.
    fn shared(&self) -> usize {
        self.v.len() / self.d.max(1) - self.hard.len()
    }

    /// Per user, its hard negatives' rows in order; and the most any has.
    fn hard_by_user(&self) -> (Vec<Vec<usize>>, usize) {
        let mut by = vec![Vec::new(); self.users];
        for &(i, r) in self.hard {
            by[i].push(r);
        }
        let most = by.iter().map(Vec::len).max().unwrap_or(0);
        (by, most)
    }
}

/// `logit(σ(a)·σ(b)) = −log(e^−a + e^−b + e^−(a+b))` and its slopes in
/// `a` and `b`: with `s` the softmax of `(−a, −b, −a−b)`, `s₁ + s₃` and
/// `s₂ + s₃`.
pub fn product_logit(a: f32, b: f32) -> (f32, f32, f32) {
    let z = [-(a as f64), -(b as f64), -(a as f64) - b as f64];
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e = z.map(|v| (v - m).exp());
    let sum: f64 = e.iter().sum();
    let y = -(m + sum.ln());
    ((y as f32), ((e[0] + e[2]) / sum) as f32, ((e[1] + e[2]) / sum) as f32)
}

/// What a hard-negative column holds for a user with fewer (EasyRec's
/// `-1e32` mask, which `exp` turns into 0).
pub const NO_HARD_NEGATIVE: f32 = -1e32;

/// The gradients of `in_batch_softmax` with respect to `us`, `v` and `u`.
pub struct TowerGrads {
    pub us: Vec<f32>,
    pub v: Vec<f32>,
    pub u: Vec<f32>,
}

/// Whether user `i`'s logits leave out the batch's item `j` (`j != i`):
/// all of them with `ignore_in_batch`, else those of the user's own item
/// when items are given (EasyRec's `_mask_in_batch`).
pub fn in_batch_left_out(t: &Towers, i: usize, j: usize) -> bool {
    t.ignore_in_batch || (!t.items.is_empty() && t.items[i] == t.items[j])
}

/// The logits of the users against the shared items (`Us · Vᵀ`), then
/// against their own hard negatives (`NO_HARD_NEGATIVE` where a user has
/// fewer than the most), `[users, shared + most]` row-major.
pub fn in_batch_logits(t: &Towers) -> Vec<f32> {
    let (b, n, d) = (t.users, t.shared(), t.d);
    let mut l = vec![0.0f32; b * n];
    matmul(&mut l, &t.us[..b * d], false, &t.v[..n * d], true, (b, d, n), false);
    for i in 0..b {
        for j in (0..b.min(n)).filter(|&j| j != i && in_batch_left_out(t, i, j)) {
            l[i * n + j] = NO_HARD_NEGATIVE;
        }
    }
    let (by, most) = t.hard_by_user();
    if most == 0 {
        return l;
    }
    let cols = n + most;
    let mut out = vec![NO_HARD_NEGATIVE; b * cols];
    for (i, rows) in by.iter().enumerate() {
        out[i * cols..i * cols + n].copy_from_slice(&l[i * n..(i + 1) * n]);
        let ui = &t.us[i * d..(i + 1) * d];
        for (k, &r) in rows.iter().enumerate() {
            out[i * cols + n + k] = ui.iter().zip(&t.v[r * d..(r + 1) * d]).map(|(a, c)| a * c).sum();
        }
    }
    out
}

/// EasyRec's listwise SOFTMAX_CROSS_ENTROPY of a match model: over the
/// logits of the users against the batch's, the drawn and their hard
/// negative items (`in_batch_logits`, consumed) the mean of
/// `−log(softmax(L_i)_i + 1e-12)` (`cross_entropy_loss`), plus the mean of
/// `relu(−u_i · v_i)` (`reg_pos_loss`); with sample weights both are
/// weighted means (`Σ w_i l_i / Σ w_i`). The loss and its gradients, with
/// zeros for the user rows of sampled items.
pub fn in_batch_softmax(t: &Towers, logits: Vec<f32>) -> (f32, TowerGrads) {
    let (d, b, n) = (t.d, t.users, t.shared());
    let rows = t.v.len() / d.max(1);
    let cols = logits.len() / b.max(1);
    let weight = |i: usize| t.weights.map_or(1.0, |w| w[i]);
    let mass = t.weights.map_or(b as f32, |w| w.iter().sum());
    if mass == 0.0 {
        // Users that all weigh 0 (EasyRec's 0/0): no loss, no gradient.
        let zeros = vec![0.0; rows * d];
        return (
            0.0,
            TowerGrads {
                us: zeros.clone(),
                v: zeros.clone(),
                u: zeros,
            },
        );
    }
    let mut p = logits;
    p.par_chunks_mut(cols.max(1)).for_each(softmax_in_place);
    let mut total = 0.0f64;
    // dL_ij = c_i w_i (p_ij − δ_ij) / W with c_i = p_ii / (p_ii + 1e-12),
    // the epsilon's share of the log's slope, and W the weights' sum.
    let mut dl = p;
    for i in 0..b {
        let pii = dl[i * cols + i] as f64;
        total += -(pii + 1e-12).ln() * weight(i) as f64;
        let c = (pii / (pii + 1e-12)) as f32;
        let row = &mut dl[i * cols..(i + 1) * cols];
        row[i] -= 1.0;
        row.iter_mut().for_each(|g| *g *= c * weight(i) / mass);
    }
    let mut dus = vec![0.0f32; rows * d];
    let mut dv = vec![0.0f32; rows * d];
    if cols == n {
        matmul(&mut dus[..b * d], &dl, false, &t.v[..n * d], false, (b, n, d), false);
        matmul(&mut dv[..n * d], &dl, true, &t.us[..b * d], false, (n, b, d), false);
    } else {
        let shared: Vec<f32> = dl.chunks_exact(cols).flat_map(|r| r[..n].iter().copied()).collect();
        matmul(
            &mut dus[..b * d],
            &shared,
            false,
            &t.v[..n * d],
            false,
            (b, n, d),
            false,
        );
        matmul(&mut dv[..n * d], &shared, true, &t.us[..b * d], false, (n, b, d), false);
        let (by, _) = t.hard_by_user();
        for (i, hard) in by.iter().enumerate() {
            for (k, &r) in hard.iter().enumerate() {
                let g = dl[i * cols + n + k];
                for c in 0..d {
                    dus[i * d + c] += g * t.v[r * d + c];
                    dv[r * d + c] += g * t.us[i * d + c];
                }
            }
        }
    }
    // reg_pos_loss: a positive pair scored below 0 is pushed up.
    let mut du = vec![0.0f32; rows * d];
    for i in 0..b {
        let (ui, vi) = (&t.u[i * d..(i + 1) * d], &t.v[i * d..(i + 1) * d]);
        let s: f32 = ui.iter().zip(vi).map(|(a, c)| a * c).sum();
        if s < 0.0 {
            total += -s as f64 * weight(i) as f64;
            for k in 0..d {
                du[i * d + k] = -vi[k] * weight(i) / mass;
                dv[i * d + k] -= ui[k] * weight(i) / mass;
            }
        }
    }
    ((total / mass as f64) as f32, TowerGrads { us: dus, v: dv, u: du })
}

/// MIND's item scores by interest (EasyRec's `simple_item_sim` and
/// `hard_neg_sim`): per user `i` and item row `r` of the towers' items,
/// `max_h ui[i, h] · v[r]` over the user's `max_k` interests (the masked
/// ones, zeros, among them, as EasyRec's; `ui` holds `k` of them side by
/// side per row, users first), `[users, rows]`.
pub fn interest_sims(ui: &[f32], k: usize, t: &Towers) -> Vec<f32> {
    let (d, b) = (t.d.max(1), t.users);
    let rows = t.v.len() / d;
    let mut out = vec![f32::NEG_INFINITY; b * rows];
    for i in 0..b {
        let interests = &ui[i * k * d..(i + 1) * k * d];
        for r in 0..rows {
            let item = &t.v[r * d..(r + 1) * d];
            out[i * rows + r] = interests
                .chunks_exact(d)
                .map(|h| h.iter().zip(item).map(|(a, c)| a * c).sum::<f32>())
                .fold(f32::NEG_INFINITY, f32::max);
        }
    }
    out
}

/// MIND's evaluation by interest from `interest_sims`: each user's ranks
/// of its own item among the batch's and the drawn ones (EasyRec's
/// `interests_recall@k` and `interests_neg_sam_recall@k` read them), and
/// with hard negatives whether the user's own `logits` (the graph's, with
/// the similarity's scale and bias, as EasyRec compares them) is first
/// against its hard negatives' scores (`hard_neg_acc`; ties go to it).
pub fn interest_eval(sims: &[f32], logits: &[f32], t: &Towers) -> super::Interests {
    let (b, rows) = (t.users, sims.len() / t.users.max(1));
    let shared = t.shared();
    let simple: Vec<f32> = sims
        .chunks_exact(rows.max(1))
        .flat_map(|r| r[..shared].to_vec())
        .collect();
    let ranks = in_batch_ranks(&simple, b);
    let hard_hits = if t.hard.is_empty() {
        Vec::new()
    } else {
        let (by, _) = t.hard_by_user();
        (0..b)
            .map(|i| by[i].iter().all(|&r| sims[i * rows + r] <= logits[i]))
            .collect()
    };
    super::Interests { ranks, hard_hits }
}

/// Where each user's own item ranks by its logits (`[b, n]`, `b` users
/// against the batch's `b` items and `n - b` sampled ones, hard negatives
/// included): how many items
/// score higher, ties going to the lower column as TensorFlow's `top_k`
/// breaks them. Per user `[among all items, among the batch's, among its
/// own and the sampled ones]`, EasyRec's `recall@k`, `recall_in_batch@k`
/// and `recall_neg_sam@k` (which count the users under `k`).
pub fn in_batch_ranks(l: &[f32], b: usize) -> Vec<[u32; 3]> {
    let n = l.len() / b.max(1);
    (0..b)
        .map(|i| {
            let row = &l[i * n..(i + 1) * n];
            let own = row[i];
            let above = |j: usize, x: f32| x > own || (x == own && j < i);
            let in_batch = row[..b].iter().enumerate().filter(|&(j, &x)| above(j, x)).count() as u32;
            // Sampled items come after the own one: it wins their ties.
            let sampled = row[b..].iter().filter(|&&x| x > own).count() as u32;
            [in_batch + sampled, in_batch, sampled]
        })
        .collect()
}

/// TensorFlow's `log_loss` epsilon and Keras' `epsilon()`.
const KD_EPS: f64 = 1e-7;

/// The soft label of a distillation term as a probability (its logit
/// over the temperature through a sigmoid), or as it is for L2: a constant
/// of the loss, which the reference executor reads from here too.
pub fn kd_target(kd: &KdTerm, soft: f32) -> f64 {
    let s = soft as f64;
    let t = kd.divisor() as f64;
    let logit = match (kd.kind, kd.label_is_logits) {
        (KdKind::L2, _) => return s,
        (_, true) => s,
        (KdKind::CrossEntropy, false) => (s + KD_EPS).ln(),
        (KdKind::BinaryCrossEntropy, false) => {
            let p = s.clamp(KD_EPS, 1.0 - KD_EPS);
            (p / (1.0 - p)).ln()
        }
    };
    sigmoid(logit / t)
}

/// A knowledge-distillation term's loss on `logits` against the soft
/// labels `soft` (EasyRec's `build_kd_loss`), times its weight, and its
/// gradient with respect to each logit.
pub fn kd_loss_grad(kd: &KdTerm, logits: &[f32], soft: &[f32]) -> (f32, Vec<f32>) {
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
                    let l = -(y * (p + KD_EPS).ln() + (1.0 - y) * (1.0 - p + KD_EPS).ln());
                    let dp = -(y / (p + KD_EPS) - (1.0 - y) / (1.0 - p + KD_EPS));
                    (l, dp * p * (1.0 - p) / t)
                }
                KdKind::BinaryCrossEntropy => (softplus(z / t) - y * z / t, (sigmoid(z / t) - y) / t),
                KdKind::L2 => ((z - y) * (z - y), 2.0 * (z - y)),
            };
            total += l;
            (w * dz / b) as f32
        })
        .collect();
    ((w * total / b) as f32, grad)
}

/// A task's batch loss (evaluation).
pub fn loss_value(task: &Task, logits: &[f32], labels: &[f32], sessions: &[u64]) -> f64 {
    task_loss_grad(task, logits, labels, sessions).0 as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(terms: Vec<LossTermKind>) -> Task {
        Task {
            terms: terms
                .into_iter()
                .map(|kind| crate::config::tasks::LossTerm { kind, weight: 1.5 })
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
        ] {
            let (_, g) = kd_loss_grad(&term, &logits, &soft);
            let what = format!("{term:?}");
            assert_slopes(&what, |z| kd_loss_grad(&term, z, &soft).0, &logits, &g, (&[], 1e-3));
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
        use crate::model::reference;
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
        use crate::model::reference;
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
            terms: vec![crate::config::tasks::LossTerm { kind, weight: 1.0 }],
            loss: LossKind::Ziln(crate::config::tasks::ZilnPrediction {
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
        let rg = crate::model::params::to_vec(t.grad(&grads).unwrap());
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
        use crate::model::reference;
        use burn::tensor::{Tensor, TensorData};
        let z = [0.3f32, -0.5, 1.2, 0.4, -0.7, 0.9, 0.0, 0.2, 2.0, -1.0, 0.5, 0.5];
        let y = [1.0f32, 0.0, 1.0, 1.0, 0.0, 0.0];
        let sessions = [7u64, 7, 3, 7, 9, 3];
        let t = Task {
            terms: vec![crate::config::tasks::LossTerm {
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
        let rg = crate::model::params::to_vec(x.grad(&grads).unwrap());
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

    fn task_ziln(t: &Task) -> crate::config::tasks::ZilnPrediction {
        match t.loss {
            LossKind::Ziln(z) => z,
            _ => unreachable!(),
        }
    }

    /// A batch without a pair of different labels has no pairwise loss.
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
