//! A match model's in-batch softmax (EasyRec's listwise loss over the
//! batch's items, the drawn negatives and hard negatives), its ranks for
//! the recall metrics, and MIND's per-interest evaluation.

use rayon::prelude::*;

use crate::model::exec::cpu::kernels::{matmul, softmax_in_place};

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
