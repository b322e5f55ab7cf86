//! The collection's input and output distribution: what ranks exchange in
//! a step. With row-wise sharded tables (EmbeddingParallel) each rank asks
//! the owners for the rows its batch uses, and sends the gradients of those
//! rows back to them. With replicated tables (data parallel) every rank
//! gathers every rank's row gradients.
//!
//! All tables travel together: an id message is, per table in order, a
//! count followed by that many ids, and the matching float message holds
//! `dim` values per id in the same order. So a step costs four collectives
//! however many tables there are.

use std::collections::BTreeSet;

use super::{Collection, FetchedRows, RowGrads, RowSource};
use crate::dist::Communicator;
use crate::features::{Batch, Encoded};
use crate::model::GroupLayout;

/// Splits a message of `[count, ids...]` per table into per-table id lists.
pub(crate) fn unpack(msg: &[u64], tables: usize) -> Vec<&[u64]> {
    let mut out = Vec::with_capacity(tables);
    let mut at = 0;
    for _ in 0..tables {
        let n = msg[at] as usize;
        out.push(&msg[at + 1..at + 1 + n]);
        at += 1 + n;
    }
    out
}

/// Packs per-table id lists into one message (`unpack`'s inverse).
pub(crate) fn pack(per_table: &[Vec<u64>]) -> Vec<u64> {
    per_table
        .iter()
        .flat_map(|ids| std::iter::once(ids.len() as u64).chain(ids.iter().copied()))
        .collect()
}

/// Per rank, per table: what goes to (or comes from) that rank.
pub type ByOwner<T> = Vec<Vec<Vec<T>>>;

impl Collection {
    /// The distinct ids of every table that `batch` uses, ascending, by
    /// the rank that owns them: `[owner][table]`, for `ranks` ranks.
    pub fn ids_by_owner(&self, groups: &[GroupLayout], batch: &Batch, ranks: usize) -> ByOwner<u64> {
        let mut want: ByOwner<u64> = vec![vec![Vec::new(); self.tables.len()]; ranks];
        for (ti, _) in self.tables.iter().enumerate() {
            for id in Self::ids_of_table(groups, batch, ti) {
                want[self.sharding.owner(id)][ti].push(id);
            }
        }
        want
    }

    /// Row gradients split by the rank that updates them (`ranks` of them;
    /// every row to the first when tables are not sharded): `[rank][table]`
    /// ids, and their gradients back to back.
    pub fn grads_by_owner(&self, grads: &[RowGrads], ranks: usize) -> (ByOwner<u64>, ByOwner<f32>) {
        let nt = self.tables.len();
        let sharded = self.sharding.is_sharded();
        let mut ids: ByOwner<u64> = vec![vec![Vec::new(); nt]; ranks];
        let mut values: ByOwner<f32> = vec![vec![Vec::new(); nt]; ranks];
        for (ti, (t, rg)) in self.tables.iter().zip(grads).enumerate() {
            for (k, &id) in rg.rows.iter().enumerate() {
                let d = if sharded { self.sharding.owner(id) } else { 0 };
                ids[d][ti].push(id);
                values[d][ti].extend_from_slice(&rg.grads[k * t.dim..(k + 1) * t.dim]);
            }
        }
        (ids, values)
    }

    /// The distinct ids of the key-value tables that the global batch
    /// (every rank's `batch`) looks up and this rank holds, ascending, by
    /// table (empty for arrays): the sightings `Table::admit` counts. A
    /// collective on several ranks when any table is key-value.
    pub(super) fn keys_seen(&self, groups: &[GroupLayout], batch: &Batch, comm: &dyn Communicator) -> Vec<Vec<u64>> {
        let nt = self.tables.len();
        let n = comm.size();
        let sharded = self.sharding.is_sharded();
        let mut want: ByOwner<u64> = vec![vec![Vec::new(); nt]; if sharded { n } else { 1 }];
        for (ti, t) in self.tables.iter().enumerate() {
            if !t.is_key_value() {
                continue;
            }
            for id in Self::ids_of_table(groups, batch, ti) {
                want[if sharded { self.sharding.owner(id) } else { 0 }][ti].push(id);
            }
        }
        if n == 1 {
            return want.swap_remove(0);
        }
        let messages: Vec<Vec<u64>> = want.iter().map(|per_table| pack(per_table)).collect();
        let got = if sharded {
            comm.all_to_all_u64(&messages)
        } else {
            comm.all_gather_u64(&messages[0])
        };
        let mut seen: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); nt];
        for msg in &got {
            for (set, ids) in seen.iter_mut().zip(unpack(msg, nt)) {
                set.extend(ids.iter().copied());
            }
        }
        seen.into_iter().map(|s| s.into_iter().collect()).collect()
    }

    /// Distinct ids of table `ti` in `batch`, ascending.
    fn ids_of_table(groups: &[GroupLayout], batch: &Batch, ti: usize) -> BTreeSet<u64> {
        let mut ids = BTreeSet::new();
        for g in groups {
            let plain = g.parts.iter().filter(|p| p.table == Some(ti)).map(|p| p.feature);
            let seq = g
                .seq_parts
                .iter()
                .filter(|p| p.kind.table() == Some(ti))
                .map(|p| p.feature);
            for f in plain.chain(seq) {
                if let Encoded::Sparse(j) = &batch.features[f] {
                    ids.extend(j.ids.iter().copied());
                }
            }
        }
        ids
    }

    /// The rows of every table that `batch` uses, fetched from their owners:
    /// one all-to-all of ids out, one of rows back.
    pub(super) fn fetch_rows(
        &self,
        groups: &[GroupLayout],
        batch: &Batch,
        comm: &dyn Communicator,
    ) -> Vec<FetchedRows> {
        let nt = self.tables.len();
        // want[owner][table]: the ids to ask that owner for.
        let want = self.ids_by_owner(groups, batch, comm.size());
        let requests: Vec<Vec<u64>> = want.iter().map(|per_table| pack(per_table)).collect();
        let asked = comm.all_to_all_u64(&requests);
        let answers: Vec<Vec<f32>> = asked
            .iter()
            .map(|msg| {
                let mut rows = Vec::new();
                for (t, ids) in self.tables.iter().zip(unpack(msg, nt)) {
                    for id in ids {
                        rows.extend_from_slice(t.row(*id));
                    }
                }
                rows
            })
            .collect();
        let got = comm.all_to_all_f32(&answers);
        let mut fetched: Vec<FetchedRows> = self.tables.iter().map(|t| FetchedRows::of_dim(t.dim)).collect();
        for (per_table, rows) in want.iter().zip(got) {
            let mut at = 0;
            for ((ids, f), t) in per_table.iter().zip(&mut fetched).zip(&self.tables) {
                let len = ids.len() * t.dim;
                f.extend(ids, &rows[at..at + len]);
                at += len;
            }
        }
        fetched
    }

    /// Row gradients as the optimizer step needs them: with sharded tables,
    /// each owner's rows summed over all ranks; with whole tables, every
    /// rank's rows summed on every rank. A single process keeps its own.
    pub(super) fn exchange_row_grads(&self, local: Vec<RowGrads>, comm: &dyn Communicator) -> Vec<RowGrads> {
        let (n, nt) = (comm.size(), self.tables.len());
        if n == 1 {
            return local;
        }
        let sharded = self.sharding.is_sharded();
        // Per destination: [count, ids...] per table, and their gradients.
        let (ids, table_grads) = self.grads_by_owner(&local, if sharded { n } else { 1 });
        let grads: Vec<Vec<f32>> = table_grads.into_iter().map(|per_table| per_table.concat()).collect();
        let messages: Vec<Vec<u64>> = ids.iter().map(|per_table| pack(per_table)).collect();
        let (from_ids, from_grads) = if sharded {
            (comm.all_to_all_u64(&messages), comm.all_to_all_f32(&grads))
        } else {
            (comm.all_gather_u64(&messages[0]), comm.all_gather_f32(&grads[0]))
        };
        let mut merged = vec![RowGrads::default(); nt];
        for (msg, g) in from_ids.iter().zip(&from_grads) {
            let mut at = 0;
            for ((ids, m), t) in unpack(msg, nt).into_iter().zip(&mut merged).zip(&self.tables) {
                for id in ids {
                    m.add(*id, &g[at..at + t.dim]);
                    at += t.dim;
                }
            }
        }
        merged
    }
}
