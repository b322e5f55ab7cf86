//! One training step and one inference pass. A step reads: embedding
//! forward (group inputs), dense forward and backward on the model's executor,
//! dense all-reduce, embedding backward (row gradients to their updaters),
//! clipping, then every optimizer.

use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use super::dense::{squared_norm, Exchange};
use super::device_dense::{read_scalars, sum_of_squares, DeviceDense};
use super::device_tables::TableGrads;
use super::Trainer;
use crate::embedding::{gathers, RowGrads};
use crate::features::Batch;
use crate::model::graph::params::{read_all, to_vec};
use crate::model::graph::{update_bn_buffers, BnStats};
use crate::model::{DenseGrad, Executor, TaskScores};
use crate::optim::Rule;
use crate::profile::{step_phase as step, timed, Work, MODEL_PASS};
use crate::util::Rng;

/// A gradient on a device without lent parameters: a bug of the step.
const LENT: &str = "a dense gradient on a device is of parameters lent to it";

/// Bytes of `n` f32 values.
fn f32_bytes(n: usize) -> f64 {
    (n * std::mem::size_of::<f32>()) as f64
}

/// Values held in a batch's row gradients.
fn row_values(rows: &[RowGrads]) -> usize {
    rows.iter().map(|r| r.grads.len()).sum()
}

/// What a training pass gives (`Trainer::pass`).
struct Pass {
    loss: f32,
    dense: DenseGrad,
    inputs: Vec<Vec<f32>>,
    bn_stats: Vec<BnStats>,
    /// The gradients of the tables kept on the device, when any are.
    tables: Option<TableGrads>,
}

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

/// A learning rate or data that makes the model diverge: the user's to fix.
impl crate::error::Classified for Diverged {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// A batch's gradients from `Trainer::gradients`, ready to apply or push.
pub struct StepGrads {
    /// The batch's mean loss (over the ranks' batches), unregularized.
    pub loss: f32,
    /// The regularizers' loss.
    pub reg: f64,
    /// The dense gradient, summed over the ranks and clipped: on the
    /// device where the parameters are lent to one (`lend_to_device`).
    pub dense: DenseGrad,
    /// Each table's row gradients, before clipping (none for the tables
    /// kept on the device).
    pub rows: Vec<RowGrads>,
    /// The gradients of the tables kept on the device, summed over the
    /// ranks, before clipping.
    pub tables: Option<TableGrads>,
    pub norm: f32,
    /// What clipping multiplies the gradients by.
    pub scale: f32,
    pub bn_stats: Vec<BnStats>,
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

impl Trainer {
    /// The name of a dense parameter, or of a table with a touched row,
    /// that holds a non-finite value.
    fn non_finite_parameter(&self, non_finite_table: Option<usize>) -> Option<String> {
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
        self.model.table_variables.get(non_finite_table?).cloned()
    }

    /// Group input matrices (row-major `[batch, width]`) for a batch, from
    /// the embedding collection. With sharded tables this is a collective:
    /// every rank must call it. Not while tables are kept on the device
    /// (`settle_device` first).
    pub fn group_inputs(&self, batch: &Batch) -> Vec<Vec<f32>> {
        assert!(
            self.device_tables.is_none(),
            "group inputs of tables kept on the device are pooled there: settle them first"
        );
        self.embeddings.forward(&self.model.groups, batch, &*self.comm)
    }

    /// Loss of a batch and its gradients with respect to every dense
    /// parameter (flat, in `ParamStore` layout) and every group input matrix,
    /// without regularisation and without changing any state. Training-mode
    /// forward (batch statistics, dropout seeded by the global step), on
    /// the model's executor.
    pub fn loss_and_grads(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        self.loss_and_grads_with(&*self.model.exec, batch, inputs)
    }

    /// `loss_and_grads` on the parameters where they are: lent to the
    /// executor's device (`lend_to_device`), whose gradient stays there, or
    /// the model's own; the lookups in tables kept on that device are
    /// pooled there, and their gradients stay there.
    fn pass(&self, batch: &Batch, inputs: &[Vec<f32>]) -> Pass {
        let Some(d) = &self.device_dense else {
            let g = self.loss_and_grads(batch, inputs);
            return Pass {
                loss: g.loss,
                dense: DenseGrad::Host(g.dense),
                inputs: g.inputs,
                bn_stats: g.bn_stats,
                tables: None,
            };
        };
        let mut rng = self.dropout_rng();
        let targets = crate::model::Targets::of(batch);
        // The tables on the device with the batch's lookups in them.
        let kept =
            (self.device_tables.as_ref()).map(|t| (t, gathers(&self.model.groups, batch, &self.embeddings.on_device)));
        let reg = self.plan.model.embedding_regularization;
        let lookups = kept.as_ref().map(|(t, g)| t.lookups(g, reg));
        let (loss, back, bn_stats) = self.model.loss_and_grads_resident(
            (&d.resident, lookups.as_ref()),
            inputs,
            (targets, &self.plan.model.tasks),
            &mut rng,
        );
        let tables = kept.map(|(t, g)| t.grads((back.tables, back.table_reg), &g, &self.embeddings));
        Pass {
            loss,
            dense: back.dense,
            inputs: back.inputs,
            bn_stats,
            tables,
        }
    }

    /// The dense side of parameters lent to the executor's device, which
    /// a gradient on that device is of.
    fn lent(&self) -> &DeviceDense {
        self.device_dense.as_ref().expect(LENT)
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

    /// `loss_and_grads` on another executor than the model's: tests hold
    /// the CPU executor to burn's reference this way.
    pub fn loss_and_grads_with(&self, exec: &dyn Executor, batch: &Batch, inputs: &[Vec<f32>]) -> Grads {
        let mut rng = self.dropout_rng();
        let targets = crate::model::Targets::of(batch);
        let g = self
            .model
            .loss_and_grads_on(exec, inputs, (targets, &self.plan.model.tasks), &mut rng);
        Grads {
            loss: g.loss,
            dense: g.dense,
            inputs: g.inputs,
            bn_stats: g.bn_stats,
        }
    }

    /// The middle of a training step, the same for a synchronous step and
    /// a parameter-server worker (`ex` says which): the batch's loss and
    /// gradients on the model's executor, summed over the ranks, the dense
    /// and embedding regularizers added, the row gradients delivered where
    /// they are applied, frozen variables cleared and the dense gradient
    /// clipped by the global norm (the rows are scaled by `scale` when
    /// applied). `Err` names what is not finite.
    ///
    /// On several ranks each one holds a slice of the global batch. Its mean
    /// loss is weighted by its share of the rows, so the summed gradients
    /// are those of the mean loss over the whole global batch, as one
    /// process computes them.
    pub(super) fn gradients(&self, batch: &Batch, inputs: &[Vec<f32>], ex: Exchange) -> Result<StepGrads, String> {
        let b = batch.examples();
        let groups = &self.model.groups;
        let prof = self.profile.as_deref();
        let Pass {
            loss: local_loss,
            dense: mut dense_grad,
            inputs: mut input_grads,
            bn_stats,
            tables: mut table_grads,
        } = if b > 0 {
            timed(prof, step(MODEL_PASS), |_| None, || self.pass(batch, inputs))
        } else {
            let n = self.model.params.len();
            let dense = match &self.device_dense {
                Some(d) => DenseGrad::Device(Box::new(Tensor::<1>::zeros([n], d.resident.device()))),
                None => DenseGrad::Host(vec![0.0; n]),
            };
            Pass {
                loss: 0.0,
                dense,
                inputs: inputs.iter().map(|_| Vec::new()).collect(),
                bn_stats: Vec::new(),
                tables: self.device_tables.as_ref().map(|t| t.zero_grads(&self.embeddings)),
            }
        };
        let mass = self.loss_mass(batch);
        let mut totals = [mass, local_loss as f64 * mass, b as f64];
        ex.sum(&mut totals);
        let global_mass = totals[0].max(f64::MIN_POSITIVE);
        let global_rows = totals[2].max(1.0);
        let loss = (totals[1] / global_mass) as f32;
        if ex.ranks() > 1 {
            let share = (mass / global_mass) as f32;
            let n = self.model.params.len();
            timed(
                prof,
                step("dense gradient all-reduce"),
                |_| Some(Work::Bytes(f32_bytes(2 * n))),
                || {
                    let sum = |g: &mut Vec<f32>| {
                        g.iter_mut().for_each(|g| *g *= share);
                        ex.sum_f32(g);
                    };
                    match &mut dense_grad {
                        DenseGrad::Host(g) => sum(g),
                        // Read back, summed with the other ranks', sent again.
                        DenseGrad::Device(t) => {
                            let mut g = to_vec((**t).clone());
                            sum(&mut g);
                            **t = Tensor::<1>::from_data(TensorData::new(g, [n]), &t.device());
                        }
                    }
                    for gin in &mut input_grads {
                        gin.iter_mut().for_each(|g| *g *= share);
                    }
                    if let (Some(t), Some(g)) = (&self.device_tables, &mut table_grads) {
                        t.sum_over_ranks(g, share, ex);
                    }
                },
            );
        }
        if !loss.is_finite() {
            return Err(format!("the loss is {loss}"));
        }
        // Identical on every rank: the dense gradient is summed already.
        // On a device their loss is read back with the norm.
        let (mut reg, device_reg) = timed(
            prof,
            step("dense regularizers"),
            |_| None,
            || match &mut dense_grad {
                DenseGrad::Device(t) => {
                    let (g, reg) = self.lent().regularize((**t).clone(), global_rows);
                    **t = g;
                    if prof.is_some() {
                        self.lent().sync();
                    }
                    (0.0, reg)
                }
                DenseGrad::Host(g) => (
                    self.dense.regularize(&self.model, &self.plan.model, g, global_rows),
                    None,
                ),
            },
        );

        // Embedding backward: d loss / d group input, scattered to rows
        // and delivered to the ranks that update them.
        let emb_reg = self.plan.model.embedding_regularization;
        let mut emb_reg_loss = [0.0f64]; // this rank's lookups, then summed
        if emb_reg > 0.0 {
            emb_reg_loss[0] = self.embeddings.regularize(groups, inputs, &mut input_grads, emb_reg);
        }
        let input_values: usize = input_grads.iter().map(Vec::len).sum();
        let mut rows = timed(
            prof,
            step("row gradients (inputs' gradients scattered to rows)"),
            // The inputs' gradients read, the rows' written.
            |rows: &Vec<RowGrads>| Some(Work::Bytes(f32_bytes(input_values + row_values(rows)))),
            || ex.rows(&self.embeddings, (groups, batch), &input_grads),
        );
        if self.frozen.any() {
            match &mut dense_grad {
                DenseGrad::Device(t) => **t = self.lent().clear_frozen((**t).clone()),
                DenseGrad::Host(g) => self.frozen.clear(&self.model.params.specs, g, &mut []),
            }
            self.frozen.clear_rows(&mut rows);
        }

        // Global-norm clipping over every gradient, as tf.clip_by_global_norm.
        let n = self.model.params.len();
        let norm = timed(
            prof,
            step("gradient norm"),
            |_| Some(Work::Bytes(f32_bytes(n + row_values(&rows)))),
            || {
                let mut table_sq = ex.rows_squared_norm(&self.embeddings, &rows);
                let dense_sq = match &dense_grad {
                    DenseGrad::Device(t) => {
                        // The dense gradient's squared norm and regularizers'
                        // loss with the same of the tables on the device (summed
                        // over the ranks already; their regularizer is only
                        // where there is one rank), in one transfer.
                        let kept = table_grads.as_ref();
                        let [sq, r, kept_sq, kept_reg] = read_scalars([
                            Some(sum_of_squares(&**t)),
                            device_reg,
                            kept.and_then(TableGrads::squares),
                            kept.and_then(|g| g.reg.clone()),
                        ]);
                        reg += r;
                        table_sq += kept_sq;
                        emb_reg_loss[0] += kept_reg;
                        sq
                    }
                    DenseGrad::Host(g) => squared_norm(g),
                };
                ex.sum(&mut emb_reg_loss);
                (dense_sq + table_sq).sqrt() as f32
            },
        );
        reg += emb_reg_loss[0];
        if let Some(what) = non_finite_gradient(norm, reg) {
            return Err(what);
        }
        let scale = self.clip_scale(norm);
        if scale != 1.0 {
            match &mut dense_grad {
                DenseGrad::Host(g) => g.iter_mut().for_each(|g| *g *= scale),
                DenseGrad::Device(t) => **t = (**t).clone().mul_scalar(scale),
            }
        }
        Ok(StepGrads {
            loss,
            reg,
            dense: dense_grad,
            rows,
            tables: table_grads,
            norm,
            scale,
            bn_stats,
        })
    }

    /// Trains on one batch at the current global step, then advances it.
    /// A collective on several ranks (`gradients`).
    pub fn train_step(&mut self, batch: &Batch) -> anyhow::Result<StepStats> {
        let profile = self.profile.clone();
        let prof = profile.as_deref();
        self.lend_to_device();
        timed(
            prof,
            step("embedding admission"),
            |_| None,
            || self.embeddings.admit(&self.model.groups, batch, self.step, &*self.comm),
        );
        // Each pooled value written, and (one id a slot) a row's value read.
        let inputs = timed(
            prof,
            step("embedding lookup and pooling"),
            |x: &Vec<Vec<f32>>| Some(Work::Bytes(2.0 * f32_bytes(x.iter().map(Vec::len).sum()))),
            // (The columns of tables kept on the device stay zero here.)
            || self.embeddings.forward(&self.model.groups, batch, &*self.comm),
        );
        let g = match self.gradients(batch, &inputs, Exchange::Collective(&*self.comm)) {
            Ok(g) => g,
            Err(what) => return self.skip_or_stop(what),
        };
        let n = self.model.params.len();
        let optimizers = &self.plan.train.optimizers;
        let dense_optimizer = &optimizers[self.dense.optimizer];
        // A gradient read, a parameter and two slots read and written.
        timed(
            prof,
            step("dense update"),
            |_| Some(Work::Bytes(f32_bytes(7 * n))),
            || match g.dense {
                DenseGrad::Device(t) => {
                    let d = self.device_dense.as_mut().expect(LENT);
                    d.apply(*t, &Rule::at(dense_optimizer, self.step));
                    if prof.is_some() {
                        d.sync();
                    }
                }
                DenseGrad::Host(dense) => self.dense.apply(
                    &mut self.model.params,
                    (&dense, 0..n),
                    optimizers,
                    (self.step, &self.frozen),
                ),
            },
        );
        // A gradient read, a row's value and slot read and written (and
        // checked finite).
        let touched = row_values(&g.rows);
        let table = timed(
            prof,
            step("table update"),
            |_| Some(Work::Bytes(f32_bytes(5 * touched))),
            || {
                self.embeddings
                    .apply(&g.rows, optimizers, (self.step, &self.frozen.tables), g.scale)
            },
        );
        // (Incremental updates record them; nothing else reads them.)
        let touched_on_device = match (&self.incr, &g.tables) {
            (Some(_), Some(t)) => t.touched_rows(),
            _ => Vec::new(),
        };
        if let (Some(grads), Some(t)) = (g.tables, &mut self.device_tables) {
            timed(
                prof,
                step("table update on the device"),
                |_| None,
                || {
                    t.apply(grads, &self.embeddings, optimizers, (self.step, g.scale));
                    if prof.is_some() {
                        t.sync();
                    }
                },
            );
        }
        let (dense_finite, table_on_device) = self.finite_on_device();
        let table = table.or(table_on_device);
        if !dense_finite {
            // Read back to name the parameter.
            self.settle_device();
        }
        timed(
            prof,
            step("finite check of dense parameters"),
            |_| Some(Work::Bytes(f32_bytes(n))),
            || self.check_updated(table, self.step),
        )?;
        if let Some(incr) = &mut self.incr {
            incr.touch(&g.rows);
            for (t, rows) in &touched_on_device {
                incr.touch_table(*t, rows);
            }
        }
        update_bn_buffers(&mut self.model.buffers, g.bn_stats);
        if self.comm.size() > 1 && !self.model.buffers.values.is_empty() {
            // Moving averages saw each rank's own rows: keep replicas equal.
            self.comm.all_reduce_sum_f32(&mut self.model.buffers.values);
            let n = self.comm.size() as f32;
            self.model.buffers.values.iter_mut().for_each(|v| *v /= n);
        }
        self.step += 1;
        Ok(StepStats {
            loss: g.loss + g.reg as f32,
            reg_loss: g.reg as f32,
            grad_norm: g.norm,
            skipped: false,
        })
    }

    /// Whether the dense parameters lent to the device are finite, and
    /// the first table kept there that is not: one transfer for all.
    fn finite_on_device(&self) -> (bool, Option<usize>) {
        let dense = self.device_dense.as_ref().map(DeviceDense::finite_marker);
        let tables = (self.device_tables.as_ref()).map_or_else(Vec::new, |t| t.finite_markers());
        let markers = dense.iter().cloned().chain(tables.iter().map(|(_, m)| m.clone()));
        let read = read_all(markers.collect());
        let (dense_finite, rest) = match dense {
            Some(_) => (read[0] == 0.0, &read[1..]),
            None => (true, &read[..]),
        };
        let table = (tables.iter().zip(rest))
            .find(|(_, v)| **v != 0.0)
            .map(|((i, _), _)| *i);
        (dense_finite, table)
    }

    /// What gradients of global norm `norm` are multiplied by: below 1
    /// when gradient_clip_norm clips them (tf.clip_by_global_norm).
    fn clip_scale(&self, norm: f32) -> f32 {
        match self.plan.train.gradient_clip_norm {
            Some(c) if norm > c => c / norm,
            _ => 1.0,
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

    /// The run diverged when a dense parameter, or table
    /// `non_finite_table` (what `Collection::apply` found), is no longer
    /// finite after the update of step `step`.
    pub(super) fn check_updated(&self, non_finite_table: Option<usize>, step: u64) -> Result<(), Diverged> {
        match self.non_finite_parameter(non_finite_table) {
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
