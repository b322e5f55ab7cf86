//! What ranks exchange in a step. With sharded tables (EmbeddingParallel):
//! each rank asks the owners for the rows its batch uses, and sends the
//! gradients of those rows back to them. With whole tables on every rank
//! (data parallel): every rank gathers every rank's row gradients.

use std::collections::BTreeSet;

use super::Trainer;
use crate::embedding::{FetchedRows, RowGrads};
use crate::features::{Batch, Encoded};

impl Trainer {
    /// Distinct ids of table `ti` in `batch`, ascending.
    fn ids_of_table(&self, batch: &Batch, ti: usize) -> BTreeSet<u64> {
        let mut ids = BTreeSet::new();
        for g in &self.model.groups {
            for p in g.parts.iter().filter(|p| p.table == Some(ti)) {
                if let Encoded::Sparse(j) = &batch.features[p.feature] {
                    ids.extend(j.ids.iter().copied());
                }
            }
        }
        ids
    }

    /// The rows of every table that `batch` uses, fetched from their owners
    /// with two all-to-alls per table (ids out, rows back).
    pub fn fetch_rows(&self, batch: &Batch) -> Vec<FetchedRows> {
        let n = self.comm.size();
        self.tables
            .iter()
            .enumerate()
            .map(|(ti, t)| {
                let mut want: Vec<Vec<u64>> = vec![Vec::new(); n];
                for id in self.ids_of_table(batch, ti) {
                    want[t.owner(id)].push(id);
                }
                let asked = self.comm.all_to_all_u64(&want);
                let answers: Vec<Vec<f32>> = asked
                    .iter()
                    .map(|ids| {
                        let mut rows = Vec::with_capacity(ids.len() * t.dim);
                        for id in ids {
                            let l = t.local(*id);
                            rows.extend_from_slice(&t.weights[l * t.dim..(l + 1) * t.dim]);
                        }
                        rows
                    })
                    .collect();
                let got = self.comm.all_to_all_f32(&answers);
                let mut fetched = FetchedRows {
                    dim: t.dim,
                    ..FetchedRows::default()
                };
                for (ids, rows) in want.iter().zip(got) {
                    for id in ids {
                        fetched.index.insert(*id, fetched.index.len());
                    }
                    fetched.data.extend(rows);
                }
                fetched
            })
            .collect()
    }

    /// Row gradients as the optimizer step needs them: with sharded tables,
    /// each owner's rows summed over all ranks; with whole tables, every
    /// rank's rows summed on every rank. A single process keeps its own.
    pub fn exchange_row_grads(&self, local: Vec<RowGrads>) -> Vec<RowGrads> {
        let n = self.comm.size();
        if n == 1 {
            return local;
        }
        self.tables
            .iter()
            .zip(local)
            .map(|(t, rg)| {
                let (from_ids, from_grads) = if self.sharded {
                    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); n];
                    let mut grads: Vec<Vec<f32>> = vec![Vec::new(); n];
                    for (k, &id) in rg.rows.iter().enumerate() {
                        let o = t.owner(id);
                        ids[o].push(id);
                        grads[o].extend_from_slice(&rg.grads[k * t.dim..(k + 1) * t.dim]);
                    }
                    (self.comm.all_to_all_u64(&ids), self.comm.all_to_all_f32(&grads))
                } else {
                    (self.comm.all_gather_u64(&rg.rows), self.comm.all_gather_f32(&rg.grads))
                };
                let mut merged = RowGrads::default();
                for (ids, grads) in from_ids.iter().zip(&from_grads) {
                    for (k, &id) in ids.iter().enumerate() {
                        merged.add(id, &grads[k * t.dim..(k + 1) * t.dim]);
                    }
                }
                merged
            })
            .collect()
    }
}
