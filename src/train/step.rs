//! One training step and one inference pass: pool embeddings into group
//! inputs, run the model graph on the CPU executor, scatter input gradients
//! back to embedding rows, and apply every optimizer.

use anyhow::bail;
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

use super::Trainer;
use crate::embedding::{apply_rows, pool_rows, scatter_grad, RowGrads, RowSource};
use crate::features::{Batch, Encoded};
use crate::model::graph::{update_bn_buffers, BnStats};
use crate::model::params::to_vec;
use crate::model::reference::{self, loss_of, Ctx};
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

/// What a training step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    pub loss: f32,
    pub reg_loss: f32,
    pub grad_norm: f32,
}

/// Group input matrices (row-major `[batch, width]`) for a batch. With
/// sharded tables this is a collective: every rank must call it.
pub fn group_inputs(t: &Trainer, batch: &Batch) -> Vec<Vec<f32>> {
    /// Batch rows per parallel task: every part of a row block in one go.
    const ROWS: usize = 32;
    let b = batch.size;
    let fetched = t.sharded.then(|| t.fetch_rows(batch));
    let (tables, features) = (&t.tables, &t.plan.features);
    t.model
        .groups
        .iter()
        .map(|g| {
            let mut buf = vec![0.0f32; b * g.width];
            if g.width == 0 {
                return buf;
            }
            buf.par_chunks_mut(ROWS * g.width).enumerate().for_each(|(blk, out)| {
                let first = blk * ROWS;
                for p in &g.parts {
                    match (&batch.features[p.feature], p.table) {
                        (Encoded::Sparse(j), Some(ti)) => {
                            let mean = features[p.feature].mean_combiner;
                            let src: &dyn RowSource = match &fetched {
                                Some(f) => &f[ti],
                                None => &tables[ti],
                            };
                            pool_rows(src, j, mean, out, g.width, p.col, first);
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
            });
            buf
        })
        .collect()
}

fn input_tensors(t: &Trainer, inputs: &[Vec<f32>], b: usize, device: &Device, track: bool) -> Vec<Tensor<2>> {
    t.model
        .groups
        .iter()
        .zip(inputs)
        .map(|(g, buf)| {
            let x = Tensor::<2>::from_data(TensorData::new(buf.clone(), [b, g.width]), device);
            if track && g.parts.iter().any(|p| p.table.is_some()) {
                x.require_grad()
            } else {
                x
            }
        })
        .collect()
}

/// Sum of squares in f64, over fixed chunks in parallel (so the result
/// does not depend on the thread count).
fn squared_norm(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(1 << 15)
        .map(|c| c.iter().map(|g| (*g as f64) * (*g as f64)).sum::<f64>())
        .collect();
    parts.iter().sum()
}

impl Trainer {
    /// Loss of a batch and its gradients with respect to every dense
    /// parameter (flat, in `ParamStore` layout) and every group input matrix,
    /// without regularisation and without changing any state. Training-mode
    /// forward (batch statistics, dropout seeded by the global step), on
    /// the CPU executor.
    pub fn loss_and_grads(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        let mut rng = self.dropout_rng();
        let g = self
            .model
            .loss_and_grads(inputs, &batch.labels, &self.plan.tasks, &mut rng);
        Grads {
            loss: g.loss,
            dense: g.dense,
            inputs: g.inputs,
            bn_stats: g.bn_stats,
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
        };
        let values = reference::forward(&self.model.graph, &mut ctx, &xs);
        let bn_stats = std::mem::take(&mut ctx.bn_stats);
        let loss = self
            .plan
            .tasks
            .iter()
            .map(|t| {
                let out = self
                    .model
                    .graph
                    .output_node(&t.output())
                    .expect("every task has an output");
                let labels = Tensor::<2>::from_data(TensorData::new(batch.labels[t.label].clone(), [b, 1]), &device);
                loss_of(t.loss, values[out.0].clone(), labels).mul_scalar(t.weight)
            })
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
        let b = batch.size;
        let ranks = self.comm.size();
        let inputs = group_inputs(self, batch);
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
        let mut totals = [b as f64, local_loss as f64 * b as f64];
        self.comm.all_reduce_sum(&mut totals);
        let global_rows = totals[0].max(1.0);
        let loss_value = (totals[1] / global_rows) as f32;
        if ranks > 1 {
            let share = (b as f64 / global_rows) as f32;
            dense_grad.iter_mut().for_each(|g| *g *= share);
            self.comm.all_reduce_sum_f32(&mut dense_grad);
            for gin in &mut input_grads {
                gin.iter_mut().for_each(|g| *g *= share);
            }
        }
        if !loss_value.is_finite() {
            bail!(
                "loss is {loss_value} at step {}; stopping (lower the learning rate or check the input data)",
                self.step
            );
        }
        let mut reg = 0.0f64; // identical on every rank
        let mut emb_reg_loss = 0.0f64; // this rank's lookups only
        let l2 = self.plan.l2_regularization;
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

        // Embedding gradients: d loss / d group input, scattered to rows.
        let emb_reg = self.plan.embedding_regularization;
        if emb_reg > 0.0 {
            for ((g, gin), buf) in self.model.groups.iter().zip(&mut input_grads).zip(&inputs) {
                for p in g.sparse_parts() {
                    for r in 0..b {
                        for c in p.col..p.col + p.dim {
                            let v = buf[r * g.width + c];
                            gin[r * g.width + c] += emb_reg * v;
                            emb_reg_loss += 0.5 * (emb_reg * v * v) as f64;
                        }
                    }
                }
            }
        }
        // One table's rows at a time, tables in parallel; parts sharing a
        // table add up in config order.
        let mut row_grads: Vec<RowGrads> = vec![RowGrads::default(); self.tables.len()];
        row_grads.par_iter_mut().enumerate().for_each(|(ti, acc)| {
            for (g, gin) in self.model.groups.iter().zip(&input_grads) {
                for p in g.sparse_parts().filter(|p| p.table == Some(ti)) {
                    let Encoded::Sparse(j) = &batch.features[p.feature] else {
                        unreachable!("sparse part has jagged ids")
                    };
                    let mean = self.plan.features[p.feature].mean_combiner;
                    scatter_grad(j, mean, gin, g.width, p.col, p.dim, acc);
                }
            }
        });

        let row_grads = self.exchange_row_grads(row_grads);

        // Global-norm clipping over every gradient, as tf.clip_by_global_norm.
        // Sharded row gradients are spread over their owners: sum their norms.
        let table_sq: Vec<f64> = row_grads.par_iter().map(RowGrads::squared_norm).collect();
        let mut sums = [table_sq.iter().sum::<f64>(), emb_reg_loss];
        if self.sharded {
            self.comm.all_reduce_sum(&mut sums);
        } else {
            self.comm.all_reduce_sum(&mut sums[1..]);
        }
        reg += sums[1];
        let sq: f64 = squared_norm(&dense_grad) + sums[0];
        let norm = sq.sqrt() as f32;
        let scale = match self.plan.gradient_clip_norm {
            Some(c) if norm > c => c / norm,
            _ => 1.0,
        };

        let dense_rule = Rule::at(&self.plan.optimizers[self.assign.dense], self.step);
        if scale != 1.0 {
            dense_grad.iter_mut().for_each(|g| *g *= scale);
        }
        let n = self.model.params.values.len();
        let slots = self.dense_state.view(0..n);
        dense_rule.apply_parallel(&mut self.model.params.values, &dense_grad, slots);
        let (optimizers, step) = (&self.plan.optimizers, self.step);
        self.tables.par_iter_mut().zip(&row_grads).for_each(|(table, rg)| {
            let spec = &optimizers[table.optimizer];
            let mut rule = Rule::at(spec, step);
            rule.lr *= spec.embedding_lr_multiplier.unwrap_or(1.0);
            apply_rows(table, rg, &rule, scale);
        });
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
        })
    }

    /// Each task's predictions for a batch (in `plan.tasks` order). With
    /// sharded tables this is a collective: every rank must call it.
    pub fn score(&self, batch: &Batch) -> Vec<TaskScores> {
        let b = batch.size;
        let inputs = group_inputs(self, batch);
        let tasks = &self.plan.tasks;
        if b == 0 {
            return tasks.iter().map(|t| TaskScores::from_logits(t, Vec::new())).collect();
        }
        let logits = self.model.logits(&inputs, b, tasks);
        tasks
            .iter()
            .zip(logits)
            .map(|(t, l)| TaskScores::from_logits(t, l))
            .collect()
    }
}
