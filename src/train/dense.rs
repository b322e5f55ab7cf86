//! The dense side of training, beside the embedding side's
//! `embedding::Collection`: the dense parameters' optimizer state and
//! update, their regularizers, and how a step's gradients meet the other
//! ranks' (`Exchange`): all-reduced in a synchronous step, kept by a
//! parameter-server worker to push. The step (`Trainer::gradients`) reads
//! the same for both.

use std::ops::Range;

use rayon::prelude::*;

use super::freeze::Frozen;
use crate::config::model::ModelPlan;
use crate::config::train_plan::OptimizerSpec;
use crate::dist::Communicator;
use crate::embedding::{Collection, RowGrads};
use crate::features::Batch;
use crate::model::{GroupLayout, Model, ParamStore};
use crate::optim::{Rule, SlotState};

/// The dense parameters' optimizer and its slots (`ParamStore` layout);
/// the parameters themselves are the model's, which its executor reads.
pub struct Dense {
    /// The dense optimizer, an index into `train_config`'s optimizers.
    pub optimizer: usize,
    pub slots: SlotState,
}

impl Dense {
    /// Fresh slots for `len` parameters under `optimizers[optimizer]`.
    pub fn new(optimizers: &[OptimizerSpec], optimizer: usize, len: usize) -> Self {
        Dense {
            optimizer,
            slots: SlotState::new(&optimizers[optimizer].kind, len),
        }
    }

    /// Adds the dense regularizers (l2_regularization on the weights that
    /// take it, variational dropout's penalty over `rows` examples) to
    /// `grad`; returns their loss.
    pub fn regularize(&self, model: &Model, plan: &ModelPlan, grad: &mut [f32], rows: f64) -> f64 {
        let mut reg = 0.0f64;
        let l2 = plan.l2_regularization;
        if l2 > 0.0 {
            // One pass over every regularized weight, in fixed blocks (the
            // sum does not depend on the thread count) handed to the pool at
            // once (a parallel loop per weight and a second pass for its norm
            // took MMoE's 28 kernels 0.8 ms a step, one pass 0.56).
            let values = &model.params.values;
            let mut blocks: Vec<(&mut [f32], &[f32])> = Vec::new();
            let (mut rest, mut at) = (&mut grad[..], 0);
            let mut ranges: Vec<Range<usize>> = model.params.specs.iter().filter(|s| s.l2).map(|s| s.range()).collect();
            ranges.sort_by_key(|r| r.start);
            for r in ranges {
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - at);
                let (mine, tail) = tail.split_at_mut(r.len());
                (rest, at) = (tail, r.end);
                blocks.extend(mine.chunks_mut(BLOCK).zip(values[r].chunks(BLOCK)));
            }
            let sums: Vec<f64> = blocks
                .into_par_iter()
                .map(|(g, w)| {
                    g.iter_mut().zip(w).for_each(|(g, w)| *g += l2 * w);
                    crate::util::sum_of_squares(w)
                })
                .collect();
            reg += 0.5 * l2 as f64 * sums.iter().sum::<f64>();
        }
        if let Some(vd) = plan.variational_dropout {
            reg += model.dropout_penalty(vd.lambda, rows, grad);
        }
        reg
    }

    /// The optimizer's update at global step `step` of the parameters in
    /// `range` (flat `ParamStore` indices) from their gradient `grad`
    /// (aligned with `range`), leaving `frozen` ones as they are.
    pub fn apply(
        &mut self,
        params: &mut ParamStore,
        (grad, range): (&[f32], Range<usize>),
        optimizers: &[OptimizerSpec],
        (step, frozen): (u64, &Frozen),
    ) {
        let rule = Rule::at(&optimizers[self.optimizer], step);
        let trained: Vec<Range<usize>> = if frozen.any() {
            frozen.trained_ranges(&params.specs)
        } else {
            std::iter::once(0..params.values.len()).collect()
        };
        for r in trained {
            let (lo, hi) = (r.start.max(range.start), r.end.min(range.end));
            if lo >= hi {
                continue;
            }
            let slots = self.slots.view(lo..hi);
            rule.apply_parallel(
                &mut params.values[lo..hi],
                &grad[lo - range.start..hi - range.start],
                slots,
            );
        }
    }
}

/// How a step's gradients meet the other ranks': a synchronous step sums
/// them over every rank (row gradients delivered to the ranks that update
/// the rows); a parameter-server worker keeps its own, to push.
#[derive(Clone, Copy)]
pub enum Exchange<'a> {
    Collective(&'a dyn Communicator),
    Local,
}

impl Exchange<'_> {
    /// The ranks whose gradients are summed.
    pub fn ranks(&self) -> usize {
        match self {
            Exchange::Collective(c) => c.size(),
            Exchange::Local => 1,
        }
    }

    pub fn sum(&self, v: &mut [f64]) {
        if let Exchange::Collective(c) = self {
            c.all_reduce_sum(v);
        }
    }

    pub fn sum_f32(&self, v: &mut [f32]) {
        if let Exchange::Collective(c) = self {
            c.all_reduce_sum_f32(v);
        }
    }

    /// The row gradients of every table from the group inputs' gradients,
    /// where they are applied (`Collection::backward`) or this rank's own.
    pub fn rows(
        &self,
        emb: &Collection,
        (groups, batch): (&[GroupLayout], &Batch),
        grads: &[Vec<f32>],
    ) -> Vec<RowGrads> {
        match self {
            Exchange::Collective(c) => emb.backward(groups, batch, grads, *c),
            Exchange::Local => emb.scatter(groups, batch, grads),
        }
    }

    /// The squared norm of row gradients from `rows`, over the job.
    pub fn rows_squared_norm(&self, emb: &Collection, rows: &[RowGrads]) -> f64 {
        match self {
            Exchange::Collective(c) => emb.squared_norm(rows, *c),
            Exchange::Local => rows.iter().map(RowGrads::squared_norm).sum(),
        }
    }
}

/// The blocks a pass over the dense parameters hands the pool's threads.
const BLOCK: usize = 1 << 15;

/// Sum of squares in f64, over fixed chunks in parallel (so the result
/// does not depend on the thread count).
pub fn squared_norm(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x.par_chunks(BLOCK).map(crate::util::sum_of_squares).collect();
    parts.iter().sum()
}
