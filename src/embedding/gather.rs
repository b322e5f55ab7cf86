//! A batch's lookups in a table as one weighted gather-scatter, for a
//! device that keeps the table (`train::device_tables`): output row
//! `targets[i]` adds `coefs[i]` times the table's row `rows[i]`.
//!
//! Pooling (`pool_rows`: a sum, or a mean that leaves out weights <= 0)
//! and a sequence laid out by position (`positions_rows`) are both one,
//! with the coefficients their host scatter (`scatter_grad`,
//! `scatter_positions`) uses: the device's backward is the transpose of
//! its forward, as the host's is. Its `rows` are the rows a host step
//! touches (a pooled id of weight 0 included), so the sparse optimizers'
//! "touched rows" are the same too.

use super::pooled_weight;
use crate::features::{Batch, Encoded, Jagged};
use crate::model::{GroupLayout, SeqPartKind};

/// One part's lookups of a batch (a plain part, or a sequence part).
#[derive(Debug, Clone, PartialEq)]
pub struct Gather {
    /// The group input the output goes to, and its first column there.
    pub group: usize,
    pub col: usize,
    /// The table (its index in the collection) and its rows' width.
    pub table: usize,
    pub dim: usize,
    /// Output rows per batch row: 1 pooled, `len` laid out by position
    /// (the output `[batch * per_row, dim]` is the group's `[batch,
    /// per_row * dim]` columns).
    pub per_row: usize,
    /// Per lookup: the table's row, the output row, the coefficient.
    pub rows: Vec<i64>,
    pub targets: Vec<i64>,
    pub coefs: Vec<f32>,
}

impl Gather {
    fn new((group, col): (usize, usize), (table, dim): (usize, usize), per_row: usize) -> Self {
        Gather {
            group,
            col,
            table,
            dim,
            per_row,
            rows: Vec::new(),
            targets: Vec::new(),
            coefs: Vec::new(),
        }
    }

    /// `pool_rows`' lookups of `j` (a weighted mean when `mean`).
    fn pooled(mut self, j: &Jagged, mean: bool) -> Self {
        for b in 0..j.offsets.len() - 1 {
            let (s, e) = (j.offsets[b] as usize, j.offsets[b + 1] as usize);
            let wsum: f32 = if mean {
                (s..e).map(|i| pooled_weight(j, i, mean)).sum()
            } else {
                1.0
            };
            let div = if wsum > 0.0 { wsum } else { 1.0 };
            for i in s..e {
                self.push(j.ids[i], b, pooled_weight(j, i, mean) / div);
            }
        }
        self
    }

    /// `positions_rows`' lookups of `j`'s first `len` positions.
    fn positions(mut self, j: &Jagged, len: usize) -> Self {
        for b in 0..j.offsets.len() - 1 {
            for (id, pos, w) in super::placed_ids(j, b, len) {
                self.push(id, b * len + pos, w);
            }
        }
        self
    }

    fn push(&mut self, id: u64, target: usize, coef: f32) {
        // A table held whole, whose rows are its ids (`Table::slot`).
        self.rows.push(id as i64);
        self.targets.push(target as i64);
        self.coefs.push(coef);
    }

    /// The output's width in its group, `per_row * dim`.
    pub fn width(&self) -> usize {
        self.per_row * self.dim
    }
}

/// The lookups of `batch` in the tables `on_device` marks, part by part
/// in group order: what `Collection::forward_from` leaves out for them.
pub fn gathers(groups: &[GroupLayout], batch: &Batch, on_device: &[bool]) -> Vec<Gather> {
    let lent = |t: usize| on_device.get(t).copied().unwrap_or(false);
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for p in &g.parts {
            if let (Encoded::Sparse(j), Some(t)) = (&batch.features[p.feature], p.table) {
                if lent(t) {
                    out.push(Gather::new((gi, p.col), (t, p.dim), 1).pooled(j, p.mean));
                }
            }
        }
        for p in &g.seq_parts {
            let Encoded::Sparse(j) = &batch.features[p.feature] else {
                unreachable!("sequence parts read ids")
            };
            match p.kind {
                SeqPartKind::Pooled { table, dim, mean } if lent(table) => {
                    out.push(Gather::new((gi, p.col), (table, dim), 1).pooled(j, mean))
                }
                SeqPartKind::Positions { table, dim, len } if lent(table) => {
                    out.push(Gather::new((gi, p.col), (table, dim), len).positions(j, len))
                }
                _ => {}
            }
        }
    }
    out
}

/// Per table of `rows` rows, 1 on the rows `gathers` look up (the rows a
/// step's sparse update touches), 0 elsewhere.
pub fn touched(gathers: &[Gather], table: usize, rows: usize) -> Vec<bool> {
    let mut mask = vec![false; rows];
    for g in gathers.iter().filter(|g| g.table == table) {
        for &r in &g.rows {
            mask[r as usize] = true;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::{pool_rows, positions_rows, scatter_grad, scatter_positions, RowGrads, RowSource};

    struct Rows(Vec<f32>, usize);
    impl RowSource for Rows {
        fn dim(&self) -> usize {
            self.1
        }
        fn row(&self, g: u64) -> &[f32] {
            &self.0[g as usize * self.1..(g as usize + 1) * self.1]
        }
    }

    /// The gather-scatter on the host: `[outputs, dim]`.
    fn run(g: &Gather, t: &Rows, outputs: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; outputs * g.dim];
        for ((r, o), c) in g.rows.iter().zip(&g.targets).zip(&g.coefs) {
            for (d, x) in out[*o as usize * g.dim..][..g.dim].iter_mut().zip(t.row(*r as u64)) {
                *d += c * x;
            }
        }
        out
    }

    /// Its transpose: each lookup's row gets its coefficient times its
    /// output row's gradient.
    fn transpose(g: &Gather, grad: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; rows * g.dim];
        for ((r, o), c) in g.rows.iter().zip(&g.targets).zip(&g.coefs) {
            for (d, x) in out[*r as usize * g.dim..][..g.dim]
                .iter_mut()
                .zip(&grad[*o as usize * g.dim..])
            {
                *d += c * x;
            }
        }
        out
    }

    fn dense(acc: &RowGrads, rows: usize, dim: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; rows * dim];
        for (k, r) in acc.rows.iter().enumerate() {
            out[*r as usize * dim..][..dim].copy_from_slice(&acc.grads[k * dim..(k + 1) * dim]);
        }
        out
    }

    /// Pooled (sum and mean, weights of every sign, an empty row) and laid
    /// out by position (several ids a position, a row past `len`): the
    /// gather-scatter is `pool_rows` and `positions_rows`, its transpose
    /// `scatter_grad` and `scatter_positions`, and its rows those the
    /// host's row gradients hold.
    #[test]
    fn a_gather_pools_and_scatters_as_the_host_does() {
        let dim = 2;
        // Six rows, row 5 never looked up.
        let t = Rows((0..12).map(|x| x as f32 * 0.5 - 1.0).collect(), dim);
        let mut j = Jagged {
            ids: vec![0, 3, 1, 4, 4, 2],
            offsets: vec![0, 3, 3, 6],
            weights: Some(vec![0.5, -1.0, 2.0, 0.0, 1.5, 3.0]),
            positions: None,
        };
        let grad: Vec<f32> = (0..3 * dim).map(|x| x as f32 - 2.5).collect();
        for mean in [false, true] {
            let g = Gather::new((0, 0), (0, dim), 1).pooled(&j, mean);
            let mut want = vec![0.0f32; 3 * dim];
            pool_rows(&t, &j, mean, &mut want, dim, 0, 0);
            // (A mean divides each coefficient, the host the sum: rounding.)
            let got = run(&g, &t, 3);
            assert!(
                got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
                "mean {mean}: {got:?} vs {want:?}"
            );
            let mut acc = RowGrads::default();
            scatter_grad(&j, mean, &grad, dim, 0, dim, &mut acc);
            let back = transpose(&g, &grad, 6);
            for (a, b) in back.iter().zip(dense(&acc, 6, dim)) {
                assert!((a - b).abs() < 1e-6, "mean {mean}: {back:?}");
            }
            let mut rows: Vec<u64> = acc.rows.clone();
            rows.sort_unstable();
            let mask = touched(&[g], 0, 6);
            assert!(!mask[5]);
            assert_eq!(rows, (0..6u64).filter(|r| mask[*r as usize]).collect::<Vec<_>>());
        }
        // Positions: row 0 holds ids {0, 3} at position 0 and 1 at 1; row
        // 2 runs past len 2.
        j.positions = Some(crate::features::SeqPositions {
            of_id: vec![0, 0, 1, 0, 1, 2],
            lens: vec![2, 0, 3],
        });
        let len = 2;
        let g = Gather::new((0, 1), (0, dim), len).positions(&j, len);
        let stride = 1 + len * dim;
        let mut want = vec![0.0f32; 3 * stride];
        positions_rows(&t, &j, len, &mut want, (stride, 1), 0);
        let got = run(&g, &t, 3 * len);
        for b in 0..3 {
            assert_eq!(
                got[b * len * dim..(b + 1) * len * dim],
                want[b * stride + 1..(b + 1) * stride]
            );
        }
        let grad: Vec<f32> = (0..3 * stride).map(|x| x as f32 * 0.25).collect();
        let mut acc = RowGrads::default();
        scatter_positions(&j, len, &grad, (stride, 1), dim, &mut acc);
        let packed: Vec<f32> = (0..3)
            .flat_map(|b| grad[b * stride + 1..(b + 1) * stride].to_vec())
            .collect();
        assert_eq!(transpose(&g, &packed, 6), dense(&acc, 6, dim));
        let mut rows = acc.rows.clone();
        rows.sort_unstable();
        let mask = touched(&[g], 0, 6);
        // Id 2 sits past `len`: not looked up, not touched.
        assert!(!mask[2] && !mask[5]);
        assert_eq!(rows, (0..6u64).filter(|r| mask[*r as usize]).collect::<Vec<_>>());
    }
}
