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
use crate::embedding::{Collection, Sharding, Table};
use crate::features::{Batch, Encoder};
use crate::model::{Model, ParamStore, TaskScores};
use crate::optim::SlotState;
use crate::train::{Trainer, SEED};

pub struct Bundle {
    pub plan: TrainingPlan,
    pub model: Model,
    /// Whole tables (replicated).
    pub embeddings: Collection,
    /// Global step of the weights.
    pub step: u64,
}

impl Bundle {
    /// The weights of checkpoint `dir` (optimizer slots are not read into
    /// the model; tables saved by any number of ranks come back whole).
    pub fn restore(plan: TrainingPlan, dir: &Path) -> anyhow::Result<Self> {
        plan.memory.check_here(1)?;
        let enc = Encoder::for_inference(&plan).map_err(crate::config::ConfigError::unbuildable)?;
        let mut model = Model::new(&plan, &enc, SEED).map_err(crate::config::ConfigError::unbuildable)?;
        let (step, mut tensors) = checkpoint::load(dir)?;
        let mut take = |name: String, shape: [usize; 2]| checkpoint::take(&mut tensors, &name, &shape, dir);
        for store in [&mut model.params, &mut model.buffers] {
            let store: &mut ParamStore = store;
            for i in 0..store.specs.len() {
                let s = &store.specs[i];
                let v = take(format!("dense/{}", s.name), [s.rows, s.cols])?;
                store.slice_mut(i).copy_from_slice(&v);
            }
        }
        let mut tables = Vec::new();
        for t in &model.tables {
            tables.push(Table {
                name: t.name.clone(),
                rows: t.rows,
                dim: t.dim,
                weights: take(format!("embedding/{}", t.name), [t.rows, t.dim])?,
                state: SlotState::default(),
                optimizer: 0,
                sharding: Sharding::Replicated,
            });
        }
        let embeddings = Collection::new(tables, Sharding::Replicated, &plan.features);
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
        let tables = t
            .embeddings
            .tables
            .iter()
            .map(|tb| Table {
                name: tb.name.clone(),
                rows: tb.rows,
                dim: tb.dim,
                weights: tb.weights.clone(),
                state: SlotState::default(),
                optimizer: 0,
                sharding: Sharding::Replicated,
            })
            .collect();
        Ok(Bundle {
            plan: t.plan.clone(),
            model: t.model.clone(),
            embeddings: Collection::new(tables, Sharding::Replicated, &t.plan.features),
            step: t.step,
        })
    }

    /// Each task's scores of an encoded batch (in `plan.tasks` order).
    pub fn score(&self, batch: &Batch) -> Vec<TaskScores> {
        let inputs = self.embeddings.forward(&self.model.groups, batch, &Single);
        self.model.scores(&inputs, batch.size, &self.plan.tasks)
    }

    /// Whole tables, indexed like `Model::tables`.
    pub fn tables(&self) -> Vec<&[f32]> {
        self.embeddings.tables.iter().map(|t| t.weights.as_slice()).collect()
    }
}
