//! Training: the trainer state (tables, dense model, optimizer slots, global
//! step), its checkpoints, evaluation, and the step loop.

pub mod run;
pub mod state;
pub mod step;

use anyhow::Context;
use burn::tensor::Device;

use crate::config::model_plan::Metric;
use crate::config::typed::{InputFormat, TrainingPlan};
use crate::data::{expand_paths, Prefetch, StreamSpec};
use crate::embedding::Table;
use crate::features::{Batch, Encoder};
use crate::metrics::EvalState;
use crate::model::Model;
use crate::optim::{Assignment, SlotState};

pub use step::StepStats;

/// Seed of every random choice (initialisation, shuffling, dropout), so two
/// runs of one config train identically.
pub const SEED: u64 = 20_260_101;

pub struct Trainer {
    pub plan: TrainingPlan,
    pub enc: Encoder,
    pub model: Model,
    pub tables: Vec<Table>,
    pub dense_state: SlotState,
    pub assign: Assignment,
    /// Global step: batches trained so far.
    pub step: u64,
    pub seed: u64,
    pub train_device: Device,
    pub eval_device: Device,
}

impl Trainer {
    pub fn new(plan: TrainingPlan) -> anyhow::Result<Self> {
        let uid = plan.metrics.iter().find_map(|m| match m {
            Metric::Gauc { uid_field } => Some(uid_field.as_str()),
            _ => None,
        });
        let enc = Encoder::new(&plan, uid)?;
        let seed = SEED;
        let model = Model::new(&plan, &enc, seed)?;
        let model_kind = plan.model;
        let assign = Assignment::new(model_kind, plan.optimizers.len());
        let tables = model
            .tables
            .iter()
            .map(|t| {
                let opt = if t.wide { assign.wide_tables } else { assign.deep_tables };
                let state = SlotState::new(&plan.optimizers[opt].kind, t.rows * t.dim);
                Table::new(&t.name, t.rows, t.dim, &t.init, seed, state, opt)
            })
            .collect();
        let dense_state = SlotState::new(&plan.optimizers[assign.dense].kind, model.params.values.len());
        Ok(Trainer {
            plan,
            enc,
            model,
            tables,
            dense_state,
            assign,
            step: 0,
            seed,
            train_device: Device::flex().autodiff(),
            eval_device: Device::flex(),
        })
    }

    /// A stream of encoded batches over `paths`.
    pub fn stream(&self, paths: &[String], train: bool, skip_batches: u64) -> anyhow::Result<Prefetch<Batch>> {
        let files = expand_paths(paths)?;
        if files.is_empty() {
            anyhow::bail!("no input files given");
        }
        let p = &self.plan;
        let epochs = if !train {
            Some(1)
        } else if p.num_epochs > 0 {
            Some(p.num_epochs)
        } else if matches!(p.format, InputFormat::Csv { .. }) && p.num_steps.is_some() {
            None
        } else {
            Some(1)
        };
        let spec = StreamSpec {
            files,
            format: p.format.clone(),
            fields: p.fields.clone(),
            projection: self.enc.projection.clone(),
            batch_size: p.batch_size.max(1) as usize,
            epochs,
            shuffle: train && p.shuffle,
            shuffle_buffer: p.shuffle_buffer_size,
            seed: self.seed,
            shard: (0, 1),
            skip_batches,
            max_rows: if train { 0 } else { p.eval_num_examples },
        };
        let enc = self.enc.clone();
        Ok(Prefetch::start(spec, p.prefetch_size.min(8), move |raw| {
            enc.encode(&raw)
        }))
    }

    /// Predictions, labels and loss over a whole input.
    pub fn evaluate(&self, paths: &[String]) -> anyhow::Result<EvalState> {
        let mut st = EvalState::default();
        for batch in self.stream(paths, false, 0)? {
            let batch = batch.context("reading evaluation data")?;
            let (preds, loss) = self.predict(&batch);
            st.merge(EvalState {
                preds,
                labels: batch.labels,
                uids: batch.uids.unwrap_or_default(),
                loss_sum: loss,
            });
        }
        Ok(st)
    }
}
