//! MIND's capsule layer as EasyRec's `CapsuleLayer` computes it, on the
//! CPU: the dynamic routing of a sequence's positions into interest
//! capsules and the squash of a capsule.

use super::kernels;
use crate::model::graph::SQUASH_EPS;

/// The settings one row's routing reads.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub max_k: usize,
    pub iters: usize,
    pub scale: f32,
}

/// One batch row's dynamic routing: `x` its `n` positions of width `e`
/// side by side, `live` of them in the sequence, `caps` capsules live,
/// `logits` the first routing logits `[n, max_k]` (consumed). Writes the
/// routing weights after the last iteration's softmax into `out`, `[max_k,
/// n]` (capsule by capsule).
///
/// Per iteration: the logits softmaxed over the live capsules (the others
/// and the positions past the sequence weigh 0); unless it is the last,
/// each capsule is the weighted sum of the positions, L2-normalised, and
/// the next logits are `scale · norm(x_s) · c_k` (`x_s · c_k` when `scale`
/// is 0).
pub fn route(x: &[f32], e: usize, (live, caps): (usize, usize), mut logits: Vec<f32>, r: Settings, out: &mut [f32]) {
    let k = r.max_k;
    let n = x.len().checked_div(e).unwrap_or(0);
    let caps = caps.min(k);
    let mut w = vec![0.0f32; n * k];
    let normed: Vec<f32> = if r.scale > 0.0 {
        x.chunks_exact(e.max(1)).flat_map(l2_normalized).collect()
    } else {
        x.to_vec()
    };
    let mut high = vec![0.0f32; k * e];
    for it in 0..r.iters {
        w.fill(0.0);
        for s in 0..live.min(n) {
            let row = &mut w[s * k..s * k + caps];
            row.copy_from_slice(&logits[s * k..s * k + caps]);
            kernels::softmax_in_place(row);
        }
        if it + 1 == r.iters {
            break;
        }
        high.fill(0.0);
        for s in 0..n {
            let xs = &x[s * e..(s + 1) * e];
            for c in 0..k {
                let ws = w[s * k + c];
                if ws != 0.0 {
                    high[c * e..(c + 1) * e]
                        .iter_mut()
                        .zip(xs)
                        .for_each(|(h, v)| *h += ws * v);
                }
            }
        }
        for c in 0..k {
            let hc = l2_normalized(&high[c * e..(c + 1) * e]);
            high[c * e..(c + 1) * e].copy_from_slice(&hc);
        }
        let by = if r.scale > 0.0 { r.scale } else { 1.0 };
        for s in 0..n {
            let xs = &normed[s * e..(s + 1) * e];
            for c in 0..k {
                let dot: f32 = xs.iter().zip(&high[c * e..(c + 1) * e]).map(|(a, b)| a * b).sum();
                logits[s * k + c] = by * dot;
            }
        }
    }
    for c in 0..k {
        for s in 0..n {
            out[c * n + s] = w[s * k + c];
        }
    }
}

/// `v / sqrt(max(Σ v², L2_EPS))`, TensorFlow's `l2_normalize`.
fn l2_normalized(v: &[f32]) -> Vec<f32> {
    let inv = kernels::l2_inv(v);
    v.iter().map(|a| a * inv).collect()
}

/// One row's `Op::InterestSimilarity` of its `max_k` interests `x` (each
/// `d` wide), `caps` of them live: `[(s + 1) / 2 · m, m]`, `m` whether
/// there are several; and the gradient of the first value with respect
/// to `x`, times `dy`.
pub fn interest_similarity(x: &[f32], d: usize, caps: f32) -> ([f32; 2], impl Fn(f32) -> Vec<f32> + '_) {
    let m = if caps > 1.0 { 1.0 } else { 0.0 };
    let den = (caps * (caps - 1.0)).max(1.0);
    let mut sum = vec![0.0f32; d];
    for blk in x.chunks_exact(d.max(1)) {
        sum.iter_mut().zip(blk).for_each(|(s, v)| *s += v);
    }
    let whole: f32 = sum.iter().map(|v| v * v).sum();
    let parts: f32 = x.iter().map(|v| v * v).sum();
    let s = (whole - parts) / den;
    let grad = move |dy: f32| -> Vec<f32> {
        // d/dx_k of (|S|² − Σ|x_k|²) / (2 den) is (S − x_k) / den.
        x.chunks_exact(d.max(1))
            .flat_map(|blk| {
                blk.iter()
                    .zip(&sum)
                    .map(|(v, s)| dy * m * (s - v) / den)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    ([(s + 1.0) / 2.0 * m, m], grad)
}

/// The squash factor of a row whose squared norm is `sq`:
/// `(n / (1 + n))^pow · ratio / √n` with `n = max(sq, SQUASH_EPS)`, and
/// its slope in `sq` (0 where the floor holds).
pub fn squash_factor(sq: f32, pow: f32, ratio: f32) -> (f32, f32) {
    let n = sq.max(SQUASH_EPS);
    let f = (n / (1.0 + n)).powf(pow) * ratio / n.sqrt();
    let slope = if sq > SQUASH_EPS {
        f * (pow / (n * (1.0 + n)) - 0.5 / n)
    } else {
        0.0
    };
    (f, slope)
}

/// The gradient of a squashed row `y = f(Σ x²) · x` with respect to `x`,
/// from the gradient `dy`: `f · dy + 2 f' (dy · x) x`.
pub fn squash_grad(x: &[f32], dy: &[f32], pow: f32, ratio: f32) -> Vec<f32> {
    let sq: f32 = x.iter().map(|v| v * v).sum();
    let (f, slope) = squash_factor(sq, pow, ratio);
    let dot: f32 = dy.iter().zip(x).map(|(a, b)| a * b).sum();
    dy.iter().zip(x).map(|(d, v)| f * d + 2.0 * slope * dot * v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::graph::capsule::eval_logits;

    #[test]
    fn routing_weights_are_softmaxes_over_live_capsules_and_positions() {
        let (n, e, k) = (4, 3, 3);
        let x: Vec<f32> = (0..n * e).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.3).collect();
        let init = eval_logits(n, k, 1.0);
        let mut out = vec![9.0f32; k * n];
        let r = Settings {
            max_k: k,
            iters: 3,
            scale: 20.0,
        };
        route(&x, e, (3, 2), init, r, &mut out);
        for s in 0..n {
            let col: Vec<f32> = (0..k).map(|c| out[c * n + s]).collect();
            if s < 3 {
                assert!((col[0] + col[1] - 1.0).abs() < 1e-6 && col[2] == 0.0, "{col:?}");
            } else {
                assert!(col.iter().all(|v| *v == 0.0), "{col:?}");
            }
        }
    }

    #[test]
    fn squash_gradient_matches_finite_differences() {
        let x = [0.3f32, -0.7, 0.2];
        let dy = [0.5f32, 0.1, -0.4];
        let g = squash_grad(&x, &dy, 0.5, 1.3);
        let obj = |x: &[f32]| -> f64 {
            let (f, _) = squash_factor(x.iter().map(|v| v * v).sum(), 0.5, 1.3);
            x.iter().zip(&dy).map(|(a, d)| (f * a * d) as f64).sum()
        };
        for j in 0..3 {
            let (mut up, mut down) = (x, x);
            up[j] += 1e-3;
            down[j] -= 1e-3;
            let num = (obj(&up) - obj(&down)) / 2e-3;
            assert!((num - g[j] as f64).abs() < 1e-3, "{j}: {num} vs {}", g[j]);
        }
    }
}
