//! Small embedding tables kept on the executor's device beside the dense
//! parameters (`--device gpu --device_table_rows N`): their rows and
//! optimizer slots stay there between steps; a pass pools their lookups
//! there (`model::TableLookups`), its backward leaves their gradients
//! there, and their sparse update runs there, as `embedding::apply_rows`
//! runs it on the host:
//! - the rows a step touches are those its lookups name (`embedding::
//!   touched`); every other row keeps its values and slots, except under
//!   TensorFlow's Adam (EasyRec's `adam_optimizer`, and `adamw_optimizer`
//!   less its weight decay), which moves every row by its moments;
//! - `embedding_lr_multiplier` scales the table's learning rate, clipping
//!   scales its gradient, and a table no longer finite stops training.
//!
//! A table is kept there when it is an array held whole by every rank
//! (not sharded, not a key-value table), has at most N rows, and is not
//! frozen; under several synchronous ranks its gradient and touched rows
//! are summed over them on the host (a small table's are small), which
//! embedding_regularization's gradient is not scaled for: with it, such
//! tables stay on the host. The host's copy is read back whenever the
//! dense parameters are (`Trainer::settle_device`).

use burn::tensor::{Bool, Device, Tensor, TensorData};

use super::dense::Exchange;
use super::device_dense::{finite_marker, sum_of_squares, sync};
use crate::config::train_plan::OptimizerSpec;
use crate::embedding::{Collection, Gather, Table};
use crate::model::graph::params::read_all;
use crate::model::TableLookups;
use crate::optim::Rule;

/// The collection's tables kept on a device: per table of the
/// collection, its rows `[rows, dim]` and its optimizer slots (as shaped)
/// when it is kept there.
pub struct DeviceTables {
    weights: Vec<Option<Tensor<2>>>,
    slots: Vec<Vec<Tensor<2>>>,
    device: Device,
}

/// A step's gradients of the tables on the device, with the rows the
/// step touched.
pub struct TableGrads {
    /// Per table of the collection (`None` for one on the host).
    pub grads: Vec<Option<Tensor<2>>>,
    /// Per table on the device: 1 on the rows the step touched (on any
    /// rank), 0 elsewhere.
    pub touched: Vec<Option<Vec<f32>>>,
    /// embedding_regularization's loss of the lookups, on the device.
    pub reg: Option<Tensor<1>>,
}

impl TableGrads {
    /// The gradients' squared norm, a scalar on the device (none without
    /// tables).
    pub fn squares(&self) -> Option<Tensor<1>> {
        self.grads.iter().flatten().map(sum_of_squares).reduce(|a, b| a + b)
    }

    /// The rows (global ids) each table on the device touched, for
    /// incremental updates.
    pub fn touched_rows(&self) -> Vec<(usize, Vec<u64>)> {
        (self.touched.iter().enumerate())
            .filter_map(|(t, m)| {
                let rows = m.as_ref()?.iter().enumerate().filter(|(_, x)| **x > 0.0);
                Some((t, rows.map(|(r, _)| r as u64).collect()))
            })
            .collect()
    }
}

/// Whether `table` may be kept on a device: an array held whole, of at
/// most `max_rows` rows.
pub fn keepable(table: &Table, max_rows: usize) -> bool {
    !table.sharding.is_sharded()
        && !table.is_key_value()
        && table.rows <= max_rows
        && table.weights.len() == table.rows * table.dim
}

impl DeviceTables {
    /// Moves the tables `keep` marks from `emb` to `device`, one transfer
    /// for the values and one for each slot; their host copies are empty
    /// meanwhile (`Collection::on_device` marks them). `None` when `keep`
    /// marks none.
    pub fn lend(emb: &mut Collection, keep: &[bool], device: &Device) -> Option<Self> {
        if !keep.iter().any(|k| *k) {
            return None;
        }
        let up = |v: Vec<f32>, t: &Table| Tensor::<2>::from_data(TensorData::new(v, [t.rows, t.dim]), device);
        let mut weights = Vec::new();
        let mut slots = Vec::new();
        for (t, keep) in emb.tables.iter_mut().zip(keep) {
            if !keep {
                weights.push(None);
                slots.push(Vec::new());
                continue;
            }
            weights.push(Some(up(std::mem::take(&mut t.weights), t)));
            let held: Vec<Vec<f32>> = t.state.slots.iter_mut().map(std::mem::take).collect();
            slots.push(held.into_iter().map(|s| up(s, t)).collect());
        }
        emb.on_device = keep.to_vec();
        Some(DeviceTables {
            weights,
            slots,
            device: device.clone(),
        })
    }

    /// Reads every table back into `emb`, in one transfer.
    pub fn settle(self, emb: &mut Collection) {
        let all: Vec<Tensor<1>> = (self.weights.iter().zip(&self.slots))
            .filter_map(|(w, s)| Some(std::iter::once(w.as_ref()?).chain(s)))
            .flatten()
            .map(|t| t.clone().flatten::<1>(0, 1))
            .collect();
        let flat = read_all(all);
        let mut at = 0;
        for (t, (w, s)) in emb.tables.iter_mut().zip(self.weights.iter().zip(&self.slots)) {
            if w.is_none() {
                continue;
            }
            let n = t.rows * t.dim;
            let mut next = || {
                at += n;
                flat[at - n..at].to_vec()
            };
            t.weights = next();
            for k in 0..s.len() {
                t.state.slots[k] = next();
            }
        }
        emb.on_device = Vec::new();
    }

    /// A pass's view of the tables, with the batch's `gathers` in them
    /// and embedding_regularization `reg`.
    pub fn lookups<'a>(&'a self, gathers: &'a [Gather], reg: f32) -> TableLookups<'a> {
        TableLookups {
            tables: &self.weights,
            gathers,
            reg,
        }
    }

    /// The gradients of a pass (`Backward::tables`, `table_reg`) with the
    /// rows its `gathers` touched in `emb`'s tables.
    pub fn grads(
        &self,
        (grads, reg): (Vec<Option<Tensor<2>>>, Option<Tensor<1>>),
        gathers: &[Gather],
        emb: &Collection,
    ) -> TableGrads {
        let touched = (self.weights.iter().enumerate())
            .map(|(i, w)| {
                w.as_ref()?;
                let mask = crate::embedding::touched(gathers, i, emb.tables[i].rows);
                Some(mask.into_iter().map(|t| f32::from(u8::from(t))).collect())
            })
            .collect();
        TableGrads { grads, touched, reg }
    }

    /// The gradients of a step without examples on this rank: zeros.
    pub fn zero_grads(&self, emb: &Collection) -> TableGrads {
        TableGrads {
            grads: (self.weights.iter())
                .map(|w| w.as_ref().map(|w| Tensor::<2>::zeros(w.dims(), &self.device)))
                .collect(),
            touched: (self.weights.iter().zip(&emb.tables))
                .map(|(w, t)| w.as_ref().map(|_| vec![0.0; t.rows]))
                .collect(),
            reg: None,
        }
    }

    /// Sums the gradients (this rank's weighted by its `share` of the
    /// global batch, as the group inputs' are) and touched rows over the
    /// ranks of `ex`, on the host. Nothing on one rank.
    pub fn sum_over_ranks(&self, g: &mut TableGrads, share: f32, ex: Exchange) {
        if ex.ranks() < 2 {
            return;
        }
        let shapes: Vec<Option<[usize; 2]>> = g.grads.iter().map(|t| t.as_ref().map(|t| t.dims())).collect();
        let mut flat = read_all(g.grads.iter().flatten().map(|t| t.clone().flatten::<1>(0, 1)).collect());
        flat.iter_mut().for_each(|x| *x *= share);
        ex.sum_f32(&mut flat);
        let mut at = 0;
        for (t, shape) in g.grads.iter_mut().zip(shapes) {
            let Some(shape) = shape else { continue };
            let n = shape[0] * shape[1];
            *t = Some(Tensor::<2>::from_data(
                TensorData::new(flat[at..at + n].to_vec(), shape),
                &self.device,
            ));
            at += n;
        }
        let mut touched: Vec<f32> = g.touched.iter().flatten().flatten().copied().collect();
        ex.sum_f32(&mut touched);
        let mut at = 0;
        for m in g.touched.iter_mut().flatten() {
            for x in m.iter_mut() {
                *x = if touched[at] > 0.0 { 1.0 } else { 0.0 };
                at += 1;
            }
        }
    }

    /// Each table's optimizer at global step `step` on its touched rows
    /// (and the rows TensorFlow's Adam moves), gradients scaled by `scale`
    /// (clipping); `emb` says which optimizer each table takes.
    pub fn apply(&mut self, g: TableGrads, emb: &Collection, optimizers: &[OptimizerSpec], (step, scale): (u64, f32)) {
        for (i, (grad, touched)) in g.grads.into_iter().zip(g.touched).enumerate() {
            let (Some(grad), Some(touched)) = (grad, touched) else {
                continue;
            };
            let w = self.weights[i].take().expect("a gradient is of a table on the device");
            let t = &emb.tables[i];
            let spec = &optimizers[t.optimizer];
            let mut rule = Rule::at(spec, step);
            rule.lr *= spec.embedding_lr_multiplier.unwrap_or(1.0);
            let shape = [t.rows, t.dim];
            let flat = |x: Tensor<2>| x.flatten::<1>(0, 1);
            let g = flat(grad).mul_scalar(scale);
            let (w, slots) = (flat(w), self.slots[i].drain(..).map(flat).collect::<Vec<_>>());
            let (new_w, new_slots) = rule.apply_tensors(w.clone(), g.clone(), slots.clone());
            let untouched = rule.kind.untouched_rows_rule();
            let back = |x: Tensor<1>| x.reshape(shape);
            if rule.kind.moves_untouched_rows() && untouched == rule.kind {
                // TensorFlow's Adam: every row takes the update (the rows
                // the step did not touch, that of their zero gradient).
                self.weights[i] = Some(back(new_w));
                self.slots[i] = new_slots.into_iter().map(back).collect();
                continue;
            }
            // What the rows the step did not touch become: as they were,
            // or under AdamW Adam's update of their zero gradient, without
            // the weight decay.
            let (rest_w, rest_slots) = if rule.kind.moves_untouched_rows() {
                Rule {
                    kind: untouched,
                    ..rule
                }
                .apply_tensors(w, g, slots)
            } else {
                (w, slots)
            };
            let per_value: Vec<f32> = touched.iter().flat_map(|x| std::iter::repeat_n(*x, t.dim)).collect();
            let mask: Tensor<1, Bool> =
                Tensor::<1>::from_data(TensorData::new(per_value, [shape[0] * shape[1]]), &self.device)
                    .greater_elem(0.5);
            self.weights[i] = Some(back(rest_w.mask_where(mask.clone(), new_w)));
            self.slots[i] = (rest_slots.into_iter().zip(new_slots))
                .map(|(rest, new)| back(rest.mask_where(mask.clone(), new)))
                .collect();
        }
    }

    /// Per table on the device, its `device_dense::finite_marker`.
    pub fn finite_markers(&self) -> Vec<(usize, Tensor<1>)> {
        (self.weights.iter().enumerate())
            .filter_map(|(i, w)| Some((i, finite_marker(w.as_ref()?))))
            .collect()
    }

    /// Waits for the device's queued work (profiles).
    pub fn sync(&self) {
        sync(&self.device);
    }
}
