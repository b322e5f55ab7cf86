//! One training step and one inference pass. A step reads: embedding
//! forward (group inputs), dense forward and backward on the CPU executor,
//! dense all-reduce, embedding backward (row gradients to their updaters),
//! clipping, then every optimizer.

use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

use super::Trainer;
use crate::features::Batch;
use crate::model::graph::{update_bn_buffers, BnStats};
use crate::model::params::to_vec;
use crate::model::reference::{self, task_loss_of, Ctx};
use crate::model::TaskScores;
use crate::optim::Rule;
use crate::util::Rng;

/// Loss and gradients of one batch (see `Trainer::loss_and_grads`).
pub struct Grads {
    pub loss: f32,
    pub dense: Vec<f32>,
    pub inputs: Vec<Vec<f32>>,
    pub bn_stats: Vec<BnStats>,
}

/// Training diverged: a loss, gradient or parameter stopped being finite.
/// The step's update is not checkpointed or exported; a user error (the
/// learning rate, the data), exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{what} at step {step}; stopping before it is saved (lower the learning rate or check the input data)")]
pub struct Diverged {
    pub step: u64,
    pub what: String,
}

/// What a training step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub loss: f32,
    pub reg_loss: f32,
    pub grad_norm: f32,
    /// The batch's loss or gradient was not finite and its update was not
    /// applied (`Trainer::skip_nonfinite_batches`).
    pub skipped: bool,
}

fn input_tensors(t: &Trainer, inputs: &[Vec<f32>], b: usize, device: &Device, track: bool) -> Vec<Tensor<2>> {
    t.model
        .groups
        .iter()
        .zip(inputs)
        .map(|(g, buf)| {
            let x = Tensor::<2>::from_data(TensorData::new(buf.clone(), [b, g.width]), device);
            if track && g.embedded() {
                x.require_grad()
            } else {
                x
            }
        })
        .collect()
}

/// What is not finite of a step's gradient norm and regularization loss.
/// (A NaN can pass a ReLU (max(NaN, 0) is 0) and leave the loss finite;
/// it still reaches the gradients.)
pub(super) fn non_finite_gradient(norm: f32, reg: f64) -> Option<String> {
    if !norm.is_finite() {
        Some("the gradient norm is not finite".into())
    } else if !reg.is_finite() {
        Some("the regularization loss is not finite".into())
    } else {
        None
    }
}

/// Sum of squares in f64, over fixed chunks in parallel (so the result
/// does not depend on the thread count).
pub(super) fn squared_norm(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(1 << 15)
        .map(|c| c.iter().map(|g| (*g as f64) * (*g as f64)).sum::<f64>())
        .collect();
    parts.iter().sum()
}

impl Trainer {
    /// The name of a dense parameter, or of a table with a touched row,
    /// that holds a non-finite value.
    fn non_finite_parameter(&self, row_grads: &[crate::embedding::RowGrads]) -> Option<String> {
        let p = &self.model.params;
        // A fold per block rather than a short-circuiting `all`, which
        // stays scalar: blocks of 16k values keep the early exit coarse.
        let finite = |c: &[f32]| c.iter().fold(true, |ok, v| ok & v.is_finite());
        if !p.values.par_chunks(1 << 14).all(finite) {
            let s = p
                .specs
                .iter()
                .find(|s| !p.values[s.range()].iter().all(|v| v.is_finite()))?;
            return Some(s.name.clone());
        }
        let t = self.embeddings.non_finite_table(row_grads)?;
        self.model.table_variables.get(t).cloned()
    }

    /// Group input matrices (row-major `[batch, width]`) for a batch, from
    /// the embedding collection. With sharded tables this is a collective:
    /// every rank must call it.
    pub fn group_inputs(&self, batch: &Batch) -> Vec<Vec<f32>> {
        self.embeddings.forward(&self.model.groups, batch, &*self.comm)
    }

    /// Loss of a batch and its gradients with respect to every dense
    /// parameter (flat, in `ParamStore` layout) and every group input matrix,
    /// without regularisation and without changing any state. Training-mode
    /// forward (batch statistics, dropout seeded by the global step), on
    /// the CPU executor.
    pub fn loss_and_grads(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        let mut rng = self.dropout_rng();
        let g = self.model.loss_and_grads(
            inputs,
            crate::model::Targets::of(batch),
            &self.plan.model.tasks,
            &mut rng,
        );
        Grads {
            loss: g.loss,
            dense: g.dense,
            inputs: g.inputs,
            bn_stats: g.bn_stats,
        }
    }

    /// What the batch's mean loss divides by: its examples, or with sample
    /// weights the count of non-zero ones (a listwise loss: their sum).
    /// A rank's loss counts by its share of the global batch's mass.
    fn loss_mass(&self, batch: &Batch) -> f64 {
        match &batch.weights {
            None => batch.examples() as f64,
            Some(w) if self.plan.model.tasks.iter().any(|t| t.in_batch()) => w.iter().map(|&x| x as f64).sum(),
            Some(w) => w.iter().filter(|x| **x != 0.0).count() as f64,
        }
    }

    /// Dropout's generator for the current step (the same for both passes).
    fn dropout_rng(&self) -> Rng {
        Rng::new(self.seed ^ crate::util::mix64(self.step + 1))
    }

    /// `loss_and_grads` through burn's autodiff on the reference executor:
    /// the oracle of the CPU executor's backward.
    pub fn loss_and_grads_graph(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        let b = batch.size;
        let device = self.reference_device.clone();
        let params = self.model.params.tensors(&device, true);
        let xs = input_tensors(self, inputs, b, &device, true);
        let mut ctx = Ctx {
            p: &params,
            buffers: &self.model.buffers,
            training: true,
            device: &device,
            rng: self.dropout_rng(),
            bn_stats: Vec::new(),
            examples: batch.examples(),
        };
        let values = reference::forward(&self.model.graph, &mut ctx, &xs);
        let bn_stats = std::mem::take(&mut ctx.bn_stats);
        let loss = self
            .plan
            .model
            .tasks
            .iter()
            .filter(|t| t.trained())
            .map(|t| {
                if t.in_batch() {
                    let [us, v, u] = self.model.tower_outputs().map(|n| values[n.0].clone());
                    let targets = crate::model::Targets::of(batch);
                    let ignore = t.loss.ignores_in_batch();
                    return reference::in_batch_loss_of((us, v, u), targets, ignore).mul_scalar(t.weight);
                }
                let out = self
                    .model
                    .graph
                    .output_node(&t.output())
                    .expect("every task has an output");
                let logits = values[out.0].clone();
                let main = match &batch.weights {
                    Some(w) => reference::weighted_loss_of(t.loss, logits.clone(), &batch.labels[t.label], w),
                    None => task_loss_of(
                        t,
                        logits.clone(),
                        &batch.labels[t.label],
                        batch.uids.as_deref().unwrap_or_default(),
                    ),
                }
                .mul_scalar(t.weight);
                t.kd.iter().fold(main, |acc, kd| {
                    acc + reference::kd_loss_of(kd, logits.clone(), &batch.labels[kd.label])
                })
            })
            .chain(self.model.graph.penalties.iter().map(|p| {
                // Penalties read the examples' rows, not sampled items'.
                let examples = values[p.node.0].clone().narrow(0, 0, batch.examples());
                reference::penalty_of(p, examples, batch.weights.as_deref())
            }))
            .reduce(|a, c| a + c)
            .expect("a model has a task");
        let grads = loss.backward();
        let mut dense = vec![0.0f32; self.model.params.values.len()];
        for (spec, p) in self.model.params.specs.iter().zip(&params) {
            if let Some(pg) = p.grad(&grads) {
                dense[spec.range()].copy_from_slice(&to_vec(pg));
            }
        }
        let inputs = self
            .model
            .groups
            .iter()
            .zip(&xs)
            .map(|(g, x)| x.grad(&grads).map_or_else(|| vec![0.0; b * g.width], to_vec))
            .collect();
        Grads {
            loss: to_vec(loss)[0],
            dense,
            inputs,
            bn_stats,
        }
    }

    /// Trains on one batch at the current global step, then advances it.
    ///
    /// On several ranks each one holds a slice of the global batch. Its mean
    /// loss is weighted by its share of the rows, so the summed gradients
    /// are those of the mean loss over the whole global batch, as one
    /// process computes them.
    pub fn train_step(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let b = batch.examples();
        let ranks = self.comm.size();
        let inputs = self.group_inputs(batch);
        let Grads {
            loss: local_loss,
            dense: mut dense_grad,
            inputs: mut input_grads,
            bn_stats,
        } = if b > 0 {
            self.loss_and_grads(batch, &inputs)
        } else {
            Grads {
                loss: 0.0,
                dense: vec![0.0; self.model.params.values.len()],
                inputs: inputs.iter().map(|_| Vec::new()).collect(),
                bn_stats: Vec::new(),
            }
        };
        let mass = self.loss_mass(batch);
        let mut totals = [mass, local_loss as f64 * mass, b as f64];
        self.comm.all_reduce_sum(&mut totals);
        let global_mass = totals[0].max(f64::MIN_POSITIVE);
        let global_rows = totals[2].max(1.0);
        let loss_value = (totals[1] / global_mass) as f32;
        if ranks > 1 {
            let share = (mass / global_mass) as f32;
            dense_grad.iter_mut().for_each(|g| *g *= share);
            self.comm.all_reduce_sum_f32(&mut dense_grad);
            for gin in &mut input_grads {
                gin.iter_mut().for_each(|g| *g *= share);
            }
        }
        if !loss_value.is_finite() {
            return self.skip_or_stop(format!("the loss is {loss_value}"));
        }
        let mut reg = self.dense_regularization(&mut dense_grad, global_rows); // identical on every rank

        // Embedding backward: d loss / d group input, scattered to rows
        // and delivered to the ranks that update them.
        let emb_reg = self.plan.model.embedding_regularization;
        let mut emb_reg_loss = [0.0f64]; // this rank's lookups, then summed
        if emb_reg > 0.0 {
            emb_reg_loss[0] = self
                .embeddings
                .regularize(&self.model.groups, &inputs, &mut input_grads, emb_reg);
        }
        let mut row_grads = self
            .embeddings
            .backward(&self.model.groups, batch, &input_grads, &*self.comm);
        if self.frozen.any() {
            self.frozen
                .clear(&self.model.params.specs, &mut dense_grad, &mut row_grads);
        }

        // Global-norm clipping over every gradient, as tf.clip_by_global_norm.
        let table_sq = self.embeddings.squared_norm(&row_grads, &*self.comm);
        self.comm.all_reduce_sum(&mut emb_reg_loss);
        reg += emb_reg_loss[0];
        let sq: f64 = squared_norm(&dense_grad) + table_sq;
        let norm = sq.sqrt() as f32;
        if let Some(what) = non_finite_gradient(norm, reg) {
            return self.skip_or_stop(what);
        }
        let scale = self.clip_scale(norm);
        if scale != 1.0 {
            dense_grad.iter_mut().for_each(|g| *g *= scale);
        }
        let n = self.model.params.values.len();
        self.apply_dense(&dense_grad, 0..n, self.step);
        self.embeddings
            .apply(&row_grads, &self.plan.train.optimizers, self.step, scale);
        self.check_updated(&row_grads, self.step)?;
        update_bn_buffers(&mut self.model.buffers, bn_stats);
        if ranks > 1 && !self.model.buffers.values.is_empty() {
            // Moving averages saw each rank's own rows: keep replicas equal.
            self.comm.all_reduce_sum_f32(&mut self.model.buffers.values);
            let n = ranks as f32;
            self.model.buffers.values.iter_mut().for_each(|v| *v /= n);
        }
        self.step += 1;
        Ok(StepStats {
            loss: loss_value + reg as f32,
            reg_loss: reg as f32,
            grad_norm: norm,
            skipped: false,
        })
    }

    /// Adds the dense regularizers (l2_regularization on the weights that
    /// take it, variational dropout's penalty over `rows` examples) to
    /// `dense_grad`; returns their loss.
    pub(super) fn dense_regularization(&self, dense_grad: &mut [f32], rows: f64) -> f64 {
        let mut reg = 0.0f64;
        let l2 = self.plan.model.l2_regularization;
        for spec in &self.model.params.specs {
            if spec.l2 && l2 > 0.0 {
                let w = &self.model.params.values[spec.range()];
                dense_grad[spec.range()]
                    .par_iter_mut()
                    .zip(w)
                    .for_each(|(g, w)| *g += l2 * w);
                reg += 0.5 * l2 as f64 * squared_norm(w);
            }
        }
        if let Some(vd) = self.plan.model.variational_dropout {
            reg += self.model.dropout_penalty(vd.lambda, rows, dense_grad);
        }
        reg
    }

    /// What gradients of global norm `norm` are multiplied by: below 1
    /// when gradient_clip_norm clips them (tf.clip_by_global_norm).
    pub(super) fn clip_scale(&self, norm: f32) -> f32 {
        match self.plan.train.gradient_clip_norm {
            Some(c) if norm > c => c / norm,
            _ => 1.0,
        }
    }

    /// The dense optimizer's update at global step `step` of the
    /// parameters in `range` (flat `ParamStore` indices) from their
    /// gradient `grad` (aligned with `range`), leaving frozen ones as they
    /// are.
    pub(super) fn apply_dense(&mut self, grad: &[f32], range: std::ops::Range<usize>, step: u64) {
        let rule = Rule::at(&self.plan.train.optimizers[self.assign.dense], step);
        let trained: Vec<std::ops::Range<usize>> = if self.frozen.any() {
            self.frozen.trained_ranges(&self.model.params.specs)
        } else {
            std::iter::once(0..self.model.params.values.len()).collect()
        };
        for r in trained {
            let (lo, hi) = (r.start.max(range.start), r.end.min(range.end));
            if lo >= hi {
                continue;
            }
            let slots = self.dense_state.view(lo..hi);
            rule.apply_parallel(
                &mut self.model.params.values[lo..hi],
                &grad[lo - range.start..hi - range.start],
                slots,
            );
        }
    }

    /// A batch whose loss or gradient is not finite (`what`), seen alike by
    /// every rank (both are all-reduced): while `skip_nonfinite_batches`
    /// allows, its update is dropped and the global step moves past it;
    /// otherwise training stops with `Diverged`. A parameter that turns
    /// non-finite after an update always stops: it cannot be taken back.
    fn skip_or_stop(&mut self, what: String) -> anyhow::Result<StepStats> {
        self.skip_nonfinite(&what, self.step)?;
        self.step += 1;
        Ok(StepStats {
            loss: f32::NAN,
            reg_loss: f32::NAN,
            grad_norm: f32::NAN,
            skipped: true,
        })
    }

    /// Counts a batch of global step `step` whose loss or gradient is not
    /// finite (`what`) as skipped while `skip_nonfinite_batches` allows,
    /// warning on rank 0; otherwise the run diverged.
    pub(super) fn skip_nonfinite(&mut self, what: &str, step: u64) -> Result<(), Diverged> {
        if self.skipped_batches >= self.skip_nonfinite_batches {
            let what = if self.skip_nonfinite_batches > 0 {
                format!(
                    "{what} ({} batches skipped already, as many as --skip_nonfinite_batches allows)",
                    self.skipped_batches
                )
            } else {
                what.to_string()
            };
            return Err(Diverged { step, what });
        }
        self.skipped_batches += 1;
        if self.comm.rank() == 0 {
            log::warn!(
                "{what} at step {step}: batch skipped, its update not applied ({} of at most {} by \
                 --skip_nonfinite_batches)",
                self.skipped_batches,
                self.skip_nonfinite_batches
            );
        }
        Ok(())
    }

    /// The run diverged when a dense parameter, or a row `row_grads`
    /// touched, is no longer finite after the update of step `step`.
    pub(super) fn check_updated(&self, row_grads: &[crate::embedding::RowGrads], step: u64) -> Result<(), Diverged> {
        match self.non_finite_parameter(row_grads) {
            Some(name) => Err(Diverged {
                step,
                what: format!("parameter `{name}` is not finite after the update"),
            }),
            None => Ok(()),
        }
    }

    /// Each task's predictions for a batch (in `plan.model.tasks` order). With
    /// sharded tables this is a collective: every rank must call it.
    /// (Of the batch's examples, not of any sampled items.)
    pub fn score(&self, batch: &Batch) -> Vec<TaskScores> {
        let inputs = self.group_inputs(batch);
        let mut scores = self.model.scores(&inputs, batch.size, &self.plan.model.tasks);
        for s in &mut scores {
            s.truncate(batch.examples());
        }
        scores
    }
}
