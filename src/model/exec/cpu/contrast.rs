//! The CPU kernels of `Op::Contrastive`: a softmax cross entropy over the
//! similarities of a batch's rows, its weights kept for the backward.

use rayon::prelude::*;

use super::kernels;
use crate::model::graph::Contrast;

/// The loss of `kind` over the first `e` rows of `a` and `b` (`d` wide):
/// each of `rows` rows' share (`[rows, 1]`, 0 past `e`), and the softmax
/// weights of each logit row (what `backward` reads).
pub fn forward(kind: Contrast, (a, b): (&[f32], &[f32]), d: usize, e: usize, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = (&a[..e * d], &b[..e * d]);
    let mut share = vec![0.0f32; rows];
    match kind {
        Contrast::Nce { t } => {
            let z = [a, b].concat();
            let m = 2 * e;
            let mut p = kernels::matmul_new(&z, false, &z, true, (m, d, m));
            let pos: Vec<f32> = (0..m).map(|i| p[i * m + pair(i, e)] / t).collect();
            let lse = softmax_rows(&mut p, m, t, true);
            for (r, s) in share.iter_mut().enumerate().take(e) {
                *s = 0.5 * ((lse[r] - pos[r]) + (lse[r + e] - pos[r + e]));
            }
            (share, p)
        }
        Contrast::InfoNce { t } => {
            let mut p = kernels::matmul_new(a, false, b, true, (e, d, e));
            let pos: Vec<f32> = (0..e).map(|i| p[i * e + i] / t).collect();
            let lse = softmax_rows(&mut p, e, t, false);
            for (r, s) in share.iter_mut().enumerate().take(e) {
                *s = lse[r] - pos[r];
            }
            (share, p)
        }
    }
}

/// The gradients of `a` and `b` (`[rows, d]` each, 0 past `e`) from that
/// of each row's share `dy`, with `forward`'s weights `p`.
pub fn backward(
    kind: Contrast,
    (a, b): (&[f32], &[f32]),
    (d, e, rows): (usize, usize, usize),
    p: &[f32],
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (mut da, mut db) = (vec![0.0f32; rows * d], vec![0.0f32; rows * d]);
    match kind {
        Contrast::Nce { t } => {
            let m = 2 * e;
            // dL/dS[i, k] = c_i (P[i, k] - [k is i's pair]), S = z zᵀ / t,
            // so dz = (D + Dᵀ) z / t.
            let mut dd = p.to_vec();
            dd.par_chunks_mut(m).enumerate().for_each(|(i, row)| {
                row[pair(i, e)] -= 1.0;
                let c = 0.5 * dy[i % e] / t;
                row.iter_mut().for_each(|v| *v *= c);
            });
            let mut sym = dd.clone();
            for i in 0..m {
                for k in 0..m {
                    sym[i * m + k] += dd[k * m + i];
                }
            }
            let z = [&a[..e * d], &b[..e * d]].concat();
            let dz = kernels::matmul_new(&sym, false, &z, false, (m, m, d));
            da[..e * d].copy_from_slice(&dz[..e * d]);
            db[..e * d].copy_from_slice(&dz[e * d..]);
        }
        Contrast::InfoNce { t } => {
            let mut dd = p.to_vec();
            dd.par_chunks_mut(e).enumerate().for_each(|(i, row)| {
                row[i] -= 1.0;
                let c = dy[i] / t;
                row.iter_mut().for_each(|v| *v *= c);
            });
            // S = a bᵀ / t: da = D b / t, db = Dᵀ a / t.
            kernels::matmul(&mut da[..e * d], &dd, false, &b[..e * d], false, (e, e, d), false);
            kernels::matmul(&mut db[..e * d], &dd, true, &a[..e * d], false, (e, e, d), false);
        }
    }
    (da, db)
}

/// Row `i`'s positive among `2e` rows: the same example's other view.
fn pair(i: usize, e: usize) -> usize {
    if i < e {
        i + e
    } else {
        i - e
    }
}

/// Each row of the `[m, m]` dot products `s`, over `t`, replaced by its
/// softmax (the diagonal left out with `skip_self`); returns each row's
/// log-sum-exp.
fn softmax_rows(s: &mut [f32], m: usize, t: f32, skip_self: bool) -> Vec<f32> {
    s.par_chunks_mut(m)
        .enumerate()
        .map(|(i, row)| {
            row.iter_mut().for_each(|v| *v /= t);
            if skip_self {
                row[i] = f32::NEG_INFINITY;
            }
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|v| ((v - max) as f64).exp()).sum();
            row.iter_mut()
                .for_each(|v| *v = ((*v - max) as f64).exp() as f32 / sum as f32);
            max + sum.ln() as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The losses against a direct computation of EasyRec's formulas.
    #[test]
    fn nce_and_info_nce_match_their_definitions() {
        let (e, d, t) = (3usize, 2usize, 0.5f32);
        let a = [0.1f32, 0.4, -0.3, 0.2, 0.5, -0.1];
        let b = [0.2f32, 0.1, -0.2, 0.3, 0.4, 0.0];
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>() / t;
        let row = |x: &[f32], i: usize| x[i * d..(i + 1) * d].to_vec();
        let z: Vec<Vec<f32>> = (0..e).map(|i| row(&a, i)).chain((0..e).map(|i| row(&b, i))).collect();
        let nce: Vec<f32> = (0..2 * e)
            .map(|i| {
                let lse = (0..2 * e)
                    .filter(|k| *k != i)
                    .map(|k| dot(&z[i], &z[k]).exp())
                    .sum::<f32>()
                    .ln();
                lse - dot(&z[i], &z[pair(i, e)])
            })
            .collect();
        let (got, _) = forward(Contrast::Nce { t }, (&a, &b), d, e, e + 1);
        for r in 0..e {
            assert!((got[r] - 0.5 * (nce[r] + nce[r + e])).abs() < 1e-5, "{got:?}");
        }
        assert_eq!(got[e], 0.0, "rows past the examples");
        let (got, _) = forward(Contrast::InfoNce { t }, (&a, &b), d, e, e);
        for r in 0..e {
            let lse = (0..e).map(|k| dot(&row(&a, r), &row(&b, k)).exp()).sum::<f32>().ln();
            let want = lse - dot(&row(&a, r), &row(&b, r));
            assert!((got[r] - want).abs() < 1e-5, "{got:?}");
        }
    }
}
