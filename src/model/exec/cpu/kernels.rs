//! CPU kernels of the model graph's ops on flat row-major buffers: matrix
//! products straight through `gemm`, bias and activation in one sweep,
//! batch norm with f64 statistics, inverted dropout, and the dot
//! interaction over blocks of samples held sample-minor.

use std::mem::MaybeUninit;

use gemm::Parallelism;
use rayon::prelude::*;

use crate::config::model::Activation;
use crate::model::graph::BN_EPS;
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
    // SAFETY: `c` holds the m x n destination (asserted), and does not
    // alias `a` or `b` (borrow rules).
    unsafe { gemm_into(c.as_mut_ptr(), (a, ta), (b, tb), (m, k, n), acc) }
}

/// A new `[rows, width]` row-major matrix whose rows `fill(row, out)`
/// writes whole (`write_row`), on the pool's threads: no pass zeroing it
/// first, for ops that copy (a concatenation, its gradient's split).
///
/// # Safety
/// `fill` must write every one of the `width` elements of each row it is
/// handed (the rest would be read uninitialised).
pub unsafe fn written_rows(
    rows: usize,
    width: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) -> Vec<f32> {
    let mut y: Vec<f32> = Vec::with_capacity(rows * width);
    if width > 0 {
        y.spare_capacity_mut()[..rows * width]
            .par_chunks_mut(width)
            .with_min_len(ROWS)
            .enumerate()
            .for_each(|(r, out)| fill(r, out));
    }
    // SAFETY: the capacity holds rows * width values, and `fill` wrote
    // every element of every row (this function's contract).
    unsafe { y.set_len(rows * width) };
    y
}

/// Copies `src` into the start of `out` (a row of `written_rows`); returns
/// the rest of `out`.
pub fn write_row<'a>(out: &'a mut [MaybeUninit<f32>], src: &[f32]) -> &'a mut [MaybeUninit<f32>] {
    let (head, rest) = out.split_at_mut(src.len());
    head.iter_mut().zip(src).for_each(|(o, v)| {
        o.write(*v);
    });
    rest
}

/// `op(a)[m, k] · op(b)[k, n]` as a new matrix, written once by gemm: no
/// pass zeroing it first (a `vec![0.0; m * n]` memsets every output of
/// every layer, forward and backward, a few ms a step on wide models).
pub fn matmul_new(a: &[f32], ta: bool, b: &[f32], tb: bool, (m, k, n): (usize, usize, usize)) -> Vec<f32> {
    assert!(a.len() == m * k && b.len() == k * n, "matmul shapes");
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0; m * n];
    }
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: the capacity holds the m x n destination; gemm with
    // `read_dst` false writes every one of its elements (row stride n,
    // column stride 1) and reads none, so all are written before
    // `set_len` makes them part of the vector.
    unsafe {
        gemm_into(c.as_mut_ptr(), (a, ta), (b, tb), (m, k, n), false);
        c.set_len(m * n);
    }
    c
}

/// gemm of `op(a) · op(b)` into the row-major `[m, n]` matrix at `c`,
/// added to what is there when `acc`.
///
/// # Safety
/// `c` must be valid for writes (and reads when `acc`) of `m * n` values
/// that alias neither `a` nor `b`; `a` and `b` must hold `m * k` and
/// `k * n` values, and `m`, `k`, `n` be non-zero.
unsafe fn gemm_into(
    c: *mut f32,
    (a, ta): (&[f32], bool),
    (b, tb): (&[f32], bool),
    (m, k, n): (usize, usize, usize),
    acc: bool,
) {
    debug_assert!(a.len() == m * k && b.len() == k * n);
    if let super::blas::Kernels::OpenBlas(blas) = super::blas::kernels() {
        // SAFETY: this function's own contract.
        if unsafe { blas.matmul(c, (a, ta), (b, tb), (m, k, n), acc) } {
            return;
        }
    }
    let (a_rs, a_cs) = if ta { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if tb { (1, k as isize) } else { (n as isize, 1) };
    // SAFETY: the caller's contract bounds every index gemm forms from
    // these shapes and strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
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
    1.0 / row
        .iter()
        .map(|v| v * v)
        .sum::<f32>()
        .max(crate::model::graph::L2_EPS)
        .sqrt()
}

pub use crate::model::graph::live;

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
                    .for_each(|(p, m)| *p += (1.0 - m) * crate::model::graph::MASK_ADDER);
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

/// `tf.nn.selu`'s constants (Klambauer et al.).
pub const SELU_ALPHA: f32 = 1.673_263_2;
pub const SELU_SCALE: f32 = 1.050_701;

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
        Activation::Elu => {
            if v > 0.0 {
                v
            } else {
                v.exp_m1()
            }
        }
        Activation::Selu => {
            if v > 0.0 {
                SELU_SCALE * v
            } else {
                SELU_SCALE * SELU_ALPHA * v.exp_m1()
            }
        }
        Activation::Softplus => v.max(0.0) + (-v.abs()).exp().ln_1p(),
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
        // exp(x) = y + 1 below 0.
        Activation::Elu => {
            if y > 0.0 {
                1.0
            } else {
                y + 1.0
            }
        }
        // SCALE * ALPHA * exp(x) = y + SCALE * ALPHA below 0.
        Activation::Selu => {
            if y > 0.0 {
                SELU_SCALE
            } else {
                y + SELU_SCALE * SELU_ALPHA
            }
        }
        // sigmoid(x) = 1 - exp(-y).
        Activation::Softplus => -(-y).exp_m1(),
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
    use crate::model::graph::{VD_EPS, VD_TEMP};
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
///
/// Each sum runs in its own order (over elements forward, over partners
/// backward), but `JOINT` of them run side by side: one sum alone is a
/// chain of dependent adds that waits on the add's latency, several
/// independent chains keep the vector units busy, and the shared operand
/// is loaded once for all of them.
pub struct Interact {
    dim: usize,
    /// The pairs grouped by their first vector: `(i, [(pair, j)])`.
    by_first: Vec<(usize, Vec<(usize, usize)>)>,
    pub a: Vec<[f32; LANES]>,
    /// Gradients of `a`.
    pub da: Vec<[f32; LANES]>,
    /// One value per pair: the dot products, or their gradients.
    pub out: Vec<[f32; LANES]>,
    /// Per vector, `(pair, other vector)` of every pair it is in.
    partners: Vec<Vec<(usize, usize)>>,
}

/// Sums computed side by side in `Interact`.
const JOINT: usize = 4;

impl Interact {
    pub fn new(n: usize, dim: usize, pairs: &[(usize, usize)]) -> Self {
        let mut partners = vec![Vec::new(); n];
        let mut by_first: Vec<(usize, Vec<(usize, usize)>)> = Vec::new();
        for (p, &(i, j)) in pairs.iter().enumerate() {
            partners[i].push((p, j));
            partners[j].push((p, i));
            match by_first.last_mut() {
                Some((first, list)) if *first == i => list.push((p, j)),
                _ => by_first.push((i, vec![(p, j)])),
            }
        }
        Interact {
            dim,
            by_first,
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
        let (dim, a) = (self.dim, &self.a);
        for (i, list) in &self.by_first {
            let x = &a[i * dim..(i + 1) * dim];
            let mut chunks = list.chunks_exact(JOINT);
            for c in &mut chunks {
                let sums = dots::<JOINT>(x, std::array::from_fn(|t| &a[c[t].1 * dim..(c[t].1 + 1) * dim]));
                for (t, &(p, _)) in c.iter().enumerate() {
                    self.out[p] = sums[t];
                }
            }
            for &(p, j) in chunks.remainder() {
                self.out[p] = dots::<1>(x, [&a[j * dim..(j + 1) * dim]])[0];
            }
        }
    }

    /// `da` from the gradients in `out`: d(a_i · a_j) sends `a_j` into
    /// `a_i`'s gradient and `a_i` into `a_j`'s (twice `a_i` when i = j).
    /// Each gradient element is summed in registers over its vector's
    /// partners, `JOINT` elements of a vector at once.
    pub fn backward(&mut self) {
        let dim = self.dim;
        for (u, partners) in self.partners.iter().enumerate() {
            let mut k = 0;
            while k + JOINT <= dim {
                let sums = partner_sums::<JOINT>(&self.out, &self.a, partners, dim, k);
                self.da[u * dim + k..u * dim + k + JOINT].copy_from_slice(&sums);
                k += JOINT;
            }
            for k in k..dim {
                self.da[u * dim + k] = partner_sums::<1>(&self.out, &self.a, partners, dim, k)[0];
            }
        }
    }
}

/// `x · y_t` lane-wise for each of the `N` vectors `ys`, summed over the
/// elements in order.
#[inline(always)]
fn dots<const N: usize>(x: &[[f32; LANES]], ys: [&[[f32; LANES]]; N]) -> [[f32; LANES]; N] {
    let mut acc = [[0.0f32; LANES]; N];
    for (k, xk) in x.iter().enumerate() {
        for t in 0..N {
            let yk = &ys[t][k];
            for l in 0..LANES {
                acc[t][l] += xk[l] * yk[l];
            }
        }
    }
    acc
}

/// For elements `k..k + N` of one vector: the sum over its `partners`
/// `(pair, other)` of the pair's gradient times the other's element, in
/// the partners' order.
#[inline(always)]
fn partner_sums<const N: usize>(
    out: &[[f32; LANES]],
    a: &[[f32; LANES]],
    partners: &[(usize, usize)],
    dim: usize,
    k: usize,
) -> [[f32; LANES]; N] {
    let mut acc = [[0.0f32; LANES]; N];
    for &(p, v) in partners {
        let g = &out[p];
        let x = &a[v * dim + k..v * dim + k + N];
        for t in 0..N {
            for l in 0..LANES {
                acc[t][l] += g[l] * x[t][l];
            }
        }
    }
    acc
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

/// The logistic function in f64.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// log(1 + exp(x)), stable.
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}
