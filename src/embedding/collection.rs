//! The embedding collection (TorchRec's EmbeddingBagCollection): every
//! table of a model with its `Sharding`, and the three things a step asks
//! of it. Forward pools a batch's ids into the model's group input
//! matrices (fetching remote rows first when tables are sharded); backward
//! scatters the gradients of those matrices onto rows and delivers them to
//! the ranks that update them; apply runs each table's optimizer on its
//! touched rows. What is computed (pooling, scatter, updates) is here once;
//! how it is distributed is the sharding's input and output exchange
//! (`exchange.rs`).

use rayon::prelude::*;

use super::{
    apply_rows, length_rows, pool_rows, positions_rows, scatter_grad, scatter_positions, FetchedRows, RowGrads,
    RowSource, Sharding, Storage, Table,
};
use crate::config::train_plan::OptimizerSpec;
use crate::dist::Communicator;
use crate::features::{Batch, Encoded};
use crate::model::{GroupLayout, SeqPartKind};
use crate::optim::Rule;

pub struct Collection {
    pub tables: Vec<Table>,
    pub sharding: Sharding,
    /// The step `evict_stale` last ran at: a second call at that step (the
    /// run loop's before an incremental update, then the save's) has
    /// nothing left to evict and is skipped on every rank alike.
    stale_evicted_at: Option<u64>,
    /// Per table, whether a device keeps it meanwhile
    /// (`train::device_tables`; empty for none): its host rows are empty,
    /// and `forward`, `scatter` and `apply` leave it to the device.
    pub on_device: Vec<bool>,
}

impl Collection {
    /// The collection of `tables`; each group part pools with its own
    /// combiner (`Part::mean`).
    pub fn new(tables: Vec<Table>, sharding: Sharding) -> Self {
        Collection {
            tables,
            sharding,
            stale_evicted_at: None,
            on_device: Vec::new(),
        }
    }

    /// Whether a device keeps table `t` meanwhile.
    pub fn is_on_device(&self, t: usize) -> bool {
        self.on_device.get(t).copied().unwrap_or(false)
    }

    /// Whether any table is a key-value table (`admit` has work to do).
    pub fn has_key_value(&self) -> bool {
        self.tables.iter().any(Table::is_key_value)
    }

    /// Before a training step's lookups: counts the step's sighting of
    /// every key the global batch looks up in a key-value table and creates
    /// the rows of the keys admitted now (`Table::admit`). Arrays have
    /// nothing to do; with key-value tables this is a collective on
    /// several ranks.
    pub fn admit(&mut self, groups: &[GroupLayout], batch: &Batch, step: u64, comm: &dyn Communicator) {
        if !self.has_key_value() {
            return;
        }
        let seen = self.keys_seen(groups, batch, comm);
        self.tables
            .par_iter_mut()
            .zip(seen)
            .for_each(|(t, keys)| t.admit(&keys, step));
    }

    /// Evicts the rows of key-value tables not seen for longer than their
    /// `steps_to_live` before `step` (when a checkpoint is saved), logging
    /// each table's count on rank `rank` 0 (summed over ranks by `comm`).
    pub fn evict_stale(&mut self, step: u64, comm: &dyn Communicator, var_names: &[String]) {
        if !self.has_key_value() || self.stale_evicted_at == Some(step) {
            return;
        }
        self.stale_evicted_at = Some(step);
        // Per table the rows evicted now, then the capacity evictions so
        // far: summed over the owners in one collective.
        let mut counts: Vec<u64> = self.tables.iter_mut().map(|t| t.evict_stale(step) as u64).collect();
        counts.push(
            self.tables
                .iter()
                .map(|t| match &t.storage {
                    Storage::KeyValue(kv) => kv.evicted.capacity,
                    Storage::Array => 0,
                })
                .sum(),
        );
        if self.sharding.is_sharded() {
            let all = comm.all_gather_u64(&counts);
            counts = (0..counts.len())
                .map(|i| all.iter().map(|a| a.get(i).copied().unwrap_or(0)).sum())
                .collect();
        }
        let by_capacity = counts.pop().unwrap_or(0);
        let evicted = counts;
        if comm.rank() == 0 && by_capacity > 0 {
            log::info!("max_capacity: {by_capacity} key-value rows evicted to make room so far (at step {step})");
        }
        let with_ttl = |t: &Table| matches!(&t.storage, Storage::KeyValue(kv) if kv.spec.steps_to_live > 0);
        if comm.rank() == 0 && self.tables.iter().any(with_ttl) {
            let per_table: Vec<String> = self
                .tables
                .iter()
                .zip(&evicted)
                .zip(var_names)
                .filter(|((t, n), _)| with_ttl(t) && **n > 0)
                .map(|((_, n), var)| format!("{var}: {n}"))
                .collect();
            log::info!(
                "steps_to_live: {} key-value rows not seen for longer evicted at step {step}{}",
                evicted.iter().sum::<u64>(),
                if per_table.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", per_table.join(", "))
                }
            );
        }
    }

    /// Group input matrices (row-major `[batch, width]`) for a batch:
    /// embedded parts pooled from their tables, raw values copied. With
    /// sharded tables this is a collective: every rank must call it.
    pub fn forward(&self, groups: &[GroupLayout], batch: &Batch, comm: &dyn Communicator) -> Vec<Vec<f32>> {
        let fetched = self.sharding.is_sharded().then(|| self.fetch_rows(groups, batch, comm));
        self.forward_from(groups, batch, fetched.as_deref())
    }

    /// `forward` reading the rows of each table from `fetched` (every row
    /// the batch uses, by table), else from this rank's tables; a table a
    /// device keeps leaves its columns zero (the device pools them).
    pub fn forward_from(
        &self,
        groups: &[GroupLayout],
        batch: &Batch,
        fetched: Option<&[FetchedRows]>,
    ) -> Vec<Vec<f32>> {
        /// Batch rows per parallel task: every part of a row block in one go.
        const ROWS: usize = 32;
        let b = batch.size;
        groups
            .iter()
            .map(|g| {
                let mut buf = vec![0.0f32; b * g.width];
                if g.width == 0 {
                    return buf;
                }
                // Table `ti`'s rows: fetched from their owners when sharded.
                let src = |ti: usize| -> &dyn RowSource {
                    match fetched {
                        Some(f) => &f[ti],
                        None => &self.tables[ti],
                    }
                };
                buf.par_chunks_mut(ROWS * g.width).enumerate().for_each(|(blk, out)| {
                    let first = blk * ROWS;
                    for p in &g.parts {
                        match (&batch.features[p.feature], p.table) {
                            (Encoded::Sparse(_), Some(ti)) if self.is_on_device(ti) => {}
                            (Encoded::Sparse(j), Some(ti)) => {
                                pool_rows(src(ti), j, p.mean, out, g.width, p.col, first);
                            }
                            (Encoded::Dense { dim, values }, None) => {
                                for (k, row) in out.chunks_exact_mut(g.width).enumerate() {
                                    let r = first + k;
                                    row[p.col..p.col + dim].copy_from_slice(&values[r * dim..(r + 1) * dim]);
                                }
                            }
                            _ => unreachable!("feature encoding matches the group layout"),
                        }
                    }
                    for p in &g.seq_parts {
                        let Encoded::Sparse(j) = &batch.features[p.feature] else {
                            unreachable!("sequence parts read ids")
                        };
                        match p.kind {
                            _ if p.kind.table().is_some_and(|t| self.is_on_device(t)) => {}
                            SeqPartKind::Pooled { table, mean, .. } => {
                                pool_rows(src(table), j, mean, out, g.width, p.col, first)
                            }
                            SeqPartKind::Positions { table, len, .. } => {
                                positions_rows(src(table), j, len, out, (g.width, p.col), first)
                            }
                            SeqPartKind::Length { len } => length_rows(j, len, out, (g.width, p.col), first),
                        }
                    }
                });
                buf
            })
            .collect()
    }

    /// Adds embedding_regularization's gradient (`reg * value` of every
    /// pooled embedding of this rank's rows) to the group input gradients;
    /// returns its loss term, `reg / 2 * Σ value²`. (A table a device
    /// keeps has its regularizer there.)
    pub fn regularize(
        &self,
        groups: &[GroupLayout],
        inputs: &[Vec<f32>],
        input_grads: &mut [Vec<f32>],
        reg: f32,
    ) -> f64 {
        let mut loss = 0.0f64;
        for ((g, gin), buf) in groups.iter().zip(input_grads).zip(inputs) {
            let rows = buf.len().checked_div(g.width).unwrap_or(0);
            let here = |t: Option<usize>| t.is_some_and(|t| !self.is_on_device(t));
            let seq = g
                .seq_parts
                .iter()
                .filter(|p| here(p.kind.table()))
                .map(|p| (p.col, p.kind.width()));
            let plain = g.sparse_parts().filter(|p| here(p.table)).map(|p| (p.col, p.dim));
            for (col, width) in plain.chain(seq) {
                for r in 0..rows {
                    for c in col..col + width {
                        let v = buf[r * g.width + c];
                        gin[r * g.width + c] += reg * v;
                        loss += 0.5 * (reg * v * v) as f64;
                    }
                }
            }
        }
        loss
    }

    /// The row gradients of every table from the gradients of the group
    /// inputs, delivered where the update runs: with sharded tables each
    /// owner gets its rows' gradients summed over all ranks; replicated,
    /// every rank gets every rank's. A collective on several ranks.
    pub fn backward(
        &self,
        groups: &[GroupLayout],
        batch: &Batch,
        input_grads: &[Vec<f32>],
        comm: &dyn Communicator,
    ) -> Vec<RowGrads> {
        let local = self.scatter(groups, batch, input_grads);
        self.exchange_row_grads(local, comm)
    }

    /// This rank's row gradients of every table (by global row) from the
    /// gradients of its group inputs, before any exchange.
    pub fn scatter(&self, groups: &[GroupLayout], batch: &Batch, input_grads: &[Vec<f32>]) -> Vec<RowGrads> {
        // One table's rows at a time, tables in parallel; parts sharing a
        // table add up in config order.
        let mut row_grads: Vec<RowGrads> = vec![RowGrads::default(); self.tables.len()];
        row_grads.par_iter_mut().enumerate().for_each(|(ti, acc)| {
            if self.is_on_device(ti) {
                return;
            }
            let ids: usize = groups
                .iter()
                .flat_map(|g| g.sparse_parts().filter(|p| p.table == Some(ti)))
                .map(|p| match &batch.features[p.feature] {
                    Encoded::Sparse(j) => j.ids.len(),
                    _ => 0,
                })
                .sum();
            acc.reserve(ids, self.tables[ti].dim);
            for (g, gin) in groups.iter().zip(input_grads) {
                for p in g.sparse_parts().filter(|p| p.table == Some(ti)) {
                    let Encoded::Sparse(j) = &batch.features[p.feature] else {
                        unreachable!("sparse part has jagged ids")
                    };
                    scatter_grad(j, p.mean, gin, g.width, p.col, p.dim, acc);
                }
                for p in g.seq_parts.iter().filter(|p| p.kind.table() == Some(ti)) {
                    let Encoded::Sparse(j) = &batch.features[p.feature] else {
                        unreachable!("sequence parts read ids")
                    };
                    match p.kind {
                        SeqPartKind::Pooled { dim, mean, .. } => scatter_grad(j, mean, gin, g.width, p.col, dim, acc),
                        SeqPartKind::Positions { dim, len, .. } => {
                            scatter_positions(j, len, gin, (g.width, p.col), dim, acc)
                        }
                        SeqPartKind::Length { .. } => {}
                    }
                }
            }
        });
        row_grads
    }

    /// Squared norm of row gradients from `backward`, over the whole job
    /// (sharded gradients are spread over their owners). A collective on
    /// several ranks.
    pub fn squared_norm(&self, grads: &[RowGrads], comm: &dyn Communicator) -> f64 {
        let per_table: Vec<f64> = grads.par_iter().map(RowGrads::squared_norm).collect();
        let mut sum = [per_table.iter().sum::<f64>()];
        if self.sharding.is_sharded() {
            comm.all_reduce_sum(&mut sum);
        }
        sum[0]
    }

    /// Applies each table's optimizer at global step `step` to its touched
    /// rows (and, under TensorFlow's Adam, the rows it still moves),
    /// gradients scaled by `scale` (clipping); a table marked in `frozen`
    /// is left as it is, and so is one a device keeps (it updates it).
    /// Returns a table with a row that is not finite after the update, if
    /// any.
    #[must_use = "a table that is no longer finite stops training"]
    pub fn apply(
        &mut self,
        grads: &[RowGrads],
        optimizers: &[OptimizerSpec],
        (step, frozen): (u64, &[bool]),
        scale: f32,
    ) -> Option<usize> {
        let on_device = |i: usize| self.on_device.get(i).copied().unwrap_or(false);
        self.tables
            .par_iter_mut()
            .zip(grads)
            .enumerate()
            .map(|(i, (table, rg))| {
                if frozen.get(i).copied().unwrap_or(false) || on_device(i) {
                    return true;
                }
                let spec = &optimizers[table.optimizer];
                let mut rule = Rule::at(spec, step);
                rule.lr *= spec.embedding_lr_multiplier.unwrap_or(1.0);
                apply_rows(table, rg, &rule, scale)
            })
            .collect::<Vec<bool>>()
            .iter()
            .position(|finite| !finite)
    }
}
