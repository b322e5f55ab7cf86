//! What scoring and export need of a trained model, and nothing of
//! training: the plan, the model (layout, graph, parameters, batch-norm
//! statistics) and whole embedding tables, without optimizer slots or
//! ranks. Restored from a checkpoint of any world size, or taken from a
//! trainer.

use std::path::Path;

use anyhow::bail;

use crate::checkpoint;
use crate::config::typed::TrainingPlan;
use crate::dist::Single;
use crate::embedding::{Collection, Sharding, Storage, Table};
use crate::features::{Batch, Encoder};
use crate::model::exec::onnx::GraphTable;
use crate::model::{names, Model, ParamStore, TaskScores};
use crate::optim::SlotState;
use crate::train::Trainer;

pub struct Bundle {
    pub plan: TrainingPlan,
    pub model: Model,
    /// Whole tables (replicated).
    pub embeddings: Collection,
    /// Global step of the weights.
    pub step: u64,
}

/// The weights of `model` in EasyRec checkpoint `prefix`, under the names
/// and shapes this trainer's checkpoints use, with its global step. Every
/// variable of the model must be there, and every weight of the checkpoint
/// must have its place in the model: a checkpoint of another model is
/// refused, never half used.
fn easyrec_tensors(
    model: &Model,
    ckpt: &checkpoint::tensorflow::TfCheckpoint,
) -> anyhow::Result<(u64, std::collections::BTreeMap<String, checkpoint::Loaded>)> {
    let (tensors, unused) = names::from_tensorflow(ckpt, model, false, &[])?;
    names::refuse_unused(ckpt, &unused)?;
    Ok((ckpt.global_step()?.unwrap_or(0), tensors))
}

impl Bundle {
    /// The weights of checkpoint `dir` (optimizer slots are not read into
    /// the model; tables saved by any number of ranks come back whole).
    pub fn restore(mut plan: TrainingPlan, dir: &Path) -> anyhow::Result<Self> {
        plan.memory.check_here(1)?;
        // EasyRec's checkpoint, opened once: its names say which release
        // wrote a backbone, then its tensors are read.
        let tf = checkpoint::tensorflow::find(dir)
            .map(|prefix| checkpoint::tensorflow::TfCheckpoint::open(&prefix).map(|c| (prefix, c)))
            .transpose()?;
        // Ours: its tensor names say the same (a backbone fine-tuned from 0.7.1).
        let own = match &tf {
            Some((prefix, ckpt)) => {
                names::follow_release_of(&mut plan.model.arch, ckpt, prefix)?;
                None
            }
            None => {
                let own = checkpoint::load(dir)?;
                let held: Vec<String> = own.1.keys().cloned().collect();
                names::follow_release_of_own(&mut plan.model.arch, &held, dir)?;
                Some(own)
            }
        };
        let enc = Encoder::for_inference(&plan).map_err(crate::config::ConfigError::unbuildable)?;
        let sampled = plan.data.negative_sampling.is_some();
        let seed = plan.train.seed;
        let mut model = Model::new(&plan.model, &plan.features, sampled, &enc, seed)
            .map_err(crate::config::ConfigError::unbuildable)?;
        let (step, mut tensors) = match (own, &tf) {
            (Some(own), _) => own,
            (None, Some((_, ckpt))) => easyrec_tensors(&model, ckpt)?,
            (None, None) => unreachable!("ours is read where EasyRec's checkpoint is not"),
        };
        let mut take = |name: &str, shape: &[usize]| checkpoint::take(&mut tensors, name, shape, dir);
        for store in [&mut model.params, &mut model.buffers] {
            let store: &mut ParamStore = store;
            for i in 0..store.specs.len() {
                let s = &store.specs[i];
                let v = take(&s.name, &names::variable_shape(s))?;
                store.slice_mut(i).copy_from_slice(&v);
            }
        }
        let mut tables = Vec::new();
        let none = crate::config::train_plan::OptimizerKind::Momentum { momentum: 0.0 };
        for (t, var) in model.tables.iter().zip(&model.table_variables) {
            match t.key_value {
                Some(kv) => {
                    let mut table =
                        Table::key_value((&t.name, t.dim), kv, (&t.init, seed), (0, &none), Sharding::Replicated);
                    table.restore_key_value(var, &none, &mut tensors, (false, dir))?;
                    tables.push(table.for_inference());
                }
                None => tables.push(Table {
                    name: t.name.clone(),
                    rows: t.rows,
                    dim: t.dim,
                    weights: checkpoint::take(&mut tensors, var, &[t.rows, t.dim], dir)?,
                    state: SlotState::default(),
                    optimizer: 0,
                    sharding: Sharding::Replicated,
                    storage: crate::embedding::Storage::Array,
                }),
            }
        }
        let embeddings = Collection::new(tables, Sharding::Replicated);
        Ok(Bundle {
            plan,
            model,
            embeddings,
            step,
        })
    }

    /// A copy of a single-process trainer's current model.
    pub fn of(t: &Trainer) -> anyhow::Result<Self> {
        if t.embeddings.sharding.is_sharded() {
            bail!("an inference bundle needs whole tables; restore the checkpoint in a single process");
        }
        let tables = t.embeddings.tables.iter().map(Table::for_inference).collect();
        Ok(Bundle {
            plan: t.plan.clone(),
            model: t.model.clone(),
            embeddings: Collection::new(tables, Sharding::Replicated),
            step: t.step,
        })
    }

    /// Each task's scores of an encoded batch (in `plan.model.tasks` order).
    pub fn score(&self, batch: &Batch) -> Vec<TaskScores> {
        let inputs = self.embeddings.forward(&self.model.groups, batch, &Single);
        self.model.scores(&inputs, batch.size, &self.plan.model.tasks)
    }

    /// Whole tables as the exported graph holds them, indexed like
    /// `Model::tables`: an array's rows; a key-value table's rows by
    /// ascending key with the layout that finds them.
    pub fn tables(&self) -> Vec<GraphTable<'_>> {
        self.embeddings
            .tables
            .iter()
            .map(|t| match &t.storage {
                Storage::Array => GraphTable::array(&t.weights, t.rows),
                Storage::KeyValue(kv) => {
                    let (rows, _) = kv.state();
                    let keys: Vec<u64> = rows.iter().map(|(s, _)| s.key).collect();
                    let values = rows
                        .iter()
                        .flat_map(|(_, slot)| &t.weights[slot * t.dim..(slot + 1) * t.dim])
                        .copied()
                        .collect();
                    GraphTable::key_value(&keys, values, t.dim)
                }
            })
            .collect()
    }
}
