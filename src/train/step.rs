//! One training step and one inference pass: pool embeddings into group
//! inputs, run the dense network on burn, scatter input gradients back to
//! embedding rows, and apply every optimizer.

use anyhow::bail;
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

use super::Trainer;
use crate::config::typed::LossKind;
use crate::embedding::{apply_rows, pool_rows, scatter_grad, RowGrads, RowSource};
use crate::features::{Batch, Encoded};
use crate::model::layers::{update_bn_buffers, BnStats};
use crate::model::params::to_vec;
use crate::model::{fused, Ctx};
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

/// Mean loss of logits `[b, 1]` against labels.
fn loss_of(kind: LossKind, logits: Tensor<2>, labels: Tensor<2>) -> Tensor<1> {
    match kind {
        LossKind::BinaryClassification => {
            // Value: max(x, 0) - x*y + log(1 + exp(-|x|)), the stable sigmoid
            // cross entropy. Gradient: sigmoid(x) - y, attached directly.
            // Differentiating the max/abs form instead takes one-sided
            // slopes at x = 0 that add up to 1 - y instead of 0.5 - y, and
            // logits of exactly 0 are common at the start (zero output bias,
            // rows whose last hidden layer is all zero).
            let pos = logits.clone().clamp_min(0.0);
            let value = pos - logits.clone() * labels.clone() + logits.clone().abs().neg().exp().log1p();
            let slope = (sigmoid(logits.clone()) - labels).detach();
            let linear = logits * slope;
            (linear.clone() + (value - linear).detach()).mean()
        }
        LossKind::Regression => {
            let d = logits - labels;
            (d.clone() * d).mean()
        }
    }
}

impl Trainer {
    /// Loss of a batch and its gradients with respect to every dense
    /// parameter (flat, in `ParamStore` layout) and every group input matrix,
    /// without regularisation and without changing any state. Training-mode
    /// forward (batch statistics, dropout seeded by the global step). Runs
    /// the fused pass where the network allows it, burn's graph otherwise.
    pub fn loss_and_grads(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        if !fused::supports(&self.model.net) {
            return self.loss_and_grads_graph(batch, inputs);
        }
        let m = &self.model;
        let mut rng = self.dropout_rng();
        let g = fused::loss_and_grads(
            &m.net,
            &m.groups,
            &m.params,
            inputs,
            &batch.labels,
            self.plan.loss,
            &mut rng,
        );
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

    /// `loss_and_grads` through burn's autodiff graph, for every network.
    pub fn loss_and_grads_graph(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        let b = batch.size;
        let device = self.train_device.clone();
        let params = self.model.params.tensors(&device, true);
        let xs = input_tensors(self, inputs, b, &device, true);
        let labels = Tensor::<2>::from_data(TensorData::new(batch.labels.clone(), [b, 1]), &device);
        let mut ctx = Ctx {
            p: &params,
            buffers: &self.model.buffers,
            training: true,
            device: &device,
            rng: self.dropout_rng(),
            bn_stats: Vec::new(),
        };
        let logits = self.model.forward(&mut ctx, &xs);
        let bn_stats = std::mem::take(&mut ctx.bn_stats);
        let loss = loss_of(self.plan.loss, logits, labels);
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

    /// Predictions for a batch: probabilities (classification) or values
    /// (regression), with the mean loss over the batch.
    pub fn predict(&self, batch: &Batch) -> (Vec<f32>, f64) {
        let (preds, _, loss) = self.predict_with_logits(batch);
        (preds, loss)
    }

    /// Predictions, logits and the summed loss of a batch.
    pub fn predict_with_logits(&self, batch: &Batch) -> (Vec<f32>, Vec<f32>, f64) {
        let b = batch.size;
        let inputs = group_inputs(self, batch);
        if b == 0 {
            return (Vec::new(), Vec::new(), 0.0);
        }
        let device = &self.eval_device;
        let params = self.model.params.tensors(device, false);
        let xs = input_tensors(self, &inputs, b, device, false);
        let mut ctx = Ctx {
            p: &params,
            buffers: &self.model.buffers,
            training: false,
            device,
            rng: Rng::new(0),
            bn_stats: Vec::new(),
        };
        let logits = self.model.forward(&mut ctx, &xs);
        let labels = Tensor::<2>::from_data(TensorData::new(batch.labels.clone(), [b, 1]), device);
        let loss = to_vec(loss_of(self.plan.loss, logits.clone(), labels))[0] as f64 * b as f64;
        let preds = match self.plan.loss {
            LossKind::BinaryClassification => to_vec(sigmoid(logits.clone())),
            LossKind::Regression => to_vec(logits.clone()),
        };
        (preds, to_vec(logits), loss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_gradient_is_exact_at_zero_logits() {
        let device = Device::flex().autodiff();
        let logits =
            Tensor::<2>::from_data(TensorData::new(vec![0.0f32, 0.0, 2.0, -3.0], [4, 1]), &device).require_grad();
        let labels = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 0.0, 1.0, 0.0], [4, 1]), &device);
        let loss = loss_of(LossKind::BinaryClassification, logits.clone(), labels);
        let value = to_vec(loss.clone())[0];
        let grads = loss.backward();
        let g = to_vec(logits.grad(&grads).expect("logits take part in the loss"));
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let want = [
            (sig(0.0) - 1.0) / 4.0,
            sig(0.0) / 4.0,
            (sig(2.0) - 1.0) / 4.0,
            sig(-3.0) / 4.0,
        ];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "gradient {g:?}, want {want:?}");
        }
        let bce = |x: f32, y: f32| -(y * sig(x).ln() + (1.0 - y) * (1.0 - sig(x)).ln());
        let mean = (bce(0.0, 1.0) + bce(0.0, 0.0) + bce(2.0, 1.0) + bce(-3.0, 0.0)) / 4.0;
        assert!((value - mean).abs() < 1e-6, "loss {value}, want {mean}");
    }
}
