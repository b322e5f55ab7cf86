//! Models, in floors from the data a model reads to what runs it:
//! - `layout`: feature groups as dense input matrices, and their tables;
//! - `graph`: the op graph (the IR) over a flat `ParamStore`;
//! - `builders`: one function per architecture family emitting the graph;
//! - `heads`: task losses, penalties and in-batch softmax, turning output
//!   values into the loss and the output gradients, once for every executor;
//! - `exec`: what runs a graph behind one `Executor` trait (`cpu`, the
//!   training path; `burn`, the reference and the road to other devices;
//!   `onnx`, the emitter of exports).
//!
//! `Model` ties them: a layout, parameters, a graph and the executor it
//! runs on. Single-device; distribution wraps it.

pub mod builders;
pub mod exec;
pub mod graph;
pub mod heads;
pub mod layout;
pub mod names;

use std::sync::Arc;

pub use exec::resident::{Resident, TableLookups};
pub use exec::{Backward, DenseGrad, Executor, ExecutorKind, Mode, Tape};
pub use graph::params::{ParamSpec, ParamStore};
pub use graph::{BnStats, Graph, NodeId, Op};
pub use heads::{score_columns, BatchEval, Interests, Targets, TaskScores};
pub use layout::{
    named_group, CombinedSeq, GroupDropout, GroupLayout, Part, SeqLayout, SeqPart, SeqPartKind, TableSpec,
    DROPOUT_LOGITS,
};

use crate::config::feature_plan::FeatureSpec;
use crate::config::model::tasks::Task;
use crate::config::model::ModelPlan;
use crate::features::Encoder;
use crate::util::Rng;

/// Everything dense about a model: layout, parameters, the network and
/// the executor that runs it.
#[derive(Debug, Clone)]
pub struct Model {
    pub groups: Vec<GroupLayout>,
    pub tables: Vec<TableSpec>,
    /// EasyRec's variable name of each table (`names::table_variables`).
    pub table_variables: Vec<String>,
    pub params: ParamStore,
    /// Non-trained state (batch-norm moving statistics).
    pub buffers: ParamStore,
    pub graph: Graph,
    /// The parameters holding variational dropout's logits, one per group.
    pub dropout_logits: Vec<usize>,
    /// What runs the graph (the CPU executor unless chosen otherwise).
    pub exec: Arc<dyn Executor>,
}

/// Loss of a batch and its gradients: every dense parameter (flat, in
/// `ParamStore` layout) and every group input matrix.
pub struct PassGrads {
    pub loss: f32,
    pub dense: Vec<f32>,
    pub inputs: Vec<Vec<f32>>,
    /// Batch statistics of every batch norm, for its moving averages.
    pub bn_stats: Vec<BnStats>,
}

impl Model {
    /// The model `plan` describes over `features`, its parameters
    /// initialised from `seed`; `sampled_items`: batches carry a negative
    /// sampler's items after their examples.
    pub fn new(
        plan: &ModelPlan,
        features: &[FeatureSpec],
        sampled_items: bool,
        enc: &Encoder,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let (groups, tables) = layout::group_layouts(plan, features, enc)?;
        let mut rng = Rng::new(seed ^ 0xdea5e);
        let mut params = ParamStore::default();
        let mut buffers = ParamStore::default();
        let mut scope = graph::Scope {
            params: &mut params,
            buffers: &mut buffers,
            rng: &mut rng,
            release: plan.arch.backbone().map_or_else(Default::default, |b| b.release),
        };
        let dropout: Vec<Option<GroupDropout>> = groups
            .iter()
            .map(|l| {
                plan.variational_dropout
                    .and_then(|vd| GroupDropout::of(l, features, vd.embedding_wise))
            })
            .collect();
        let classes = plan.tasks.first().map_or(1, Task::logit_width);
        let mut graph = builders::build(&plan.arch, (&groups, &dropout), classes, &mut scope)?;
        if sampled_items {
            // EasyRec runs the user tower on the examples alone and the
            // item tower on them and the sampled items.
            if let (Some(u), Some(v)) = (graph.output_node("user_tower_emb"), graph.output_node("item_tower_emb")) {
                graph.norm_examples_only(u, v);
            }
        }
        // The logits the graph's variational dropouts read (not found by
        // name: a backbone block may be called `logit_p...` too).
        let dropout_logits = graph
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::VariationalDropout { p, .. } => Some(p),
                _ => None,
            })
            .collect();
        let table_variables = names::table_variables((&plan.arch, features), &groups, &tables);
        Ok(Model {
            groups,
            tables,
            table_variables,
            params,
            buffers,
            graph,
            dropout_logits,
            exec: Arc::new(exec::cpu::Cpu::default()),
        })
    }

    /// The graph run forward on `exec` over group inputs `x` of `b` rows.
    fn forward_on<'a>(&'a self, exec: &dyn Executor, x: &'a [Vec<f32>], b: usize, mode: Mode) -> Box<dyn Tape + 'a> {
        exec.forward(&self.graph, (&self.params, &self.buffers), x, b, mode)
    }

    /// Variational dropout's penalty on keeping features, EasyRec's
    /// `lambda / rows * Σ (1 - sigmoid(logit))` over every group's logits,
    /// for a batch of `rows`; its gradient is added to `grad` (the dense
    /// parameters' flat gradient).
    pub fn dropout_penalty(&self, lambda: f32, rows: f64, grad: &mut [f32]) -> f64 {
        let per_row = lambda as f64 / rows.max(1.0);
        let mut penalty = 0.0;
        for &i in &self.dropout_logits {
            let range = self.params.specs[i].range();
            for (g, l) in grad[range.clone()].iter_mut().zip(&self.params.values[range]) {
                let rate = 1.0 / (1.0 + (-*l as f64).exp());
                penalty += per_row * (1.0 - rate);
                *g -= (per_row * rate * (1.0 - rate)) as f32;
            }
        }
        penalty
    }

    /// Whether each group's input is trained (holds embedded features).
    pub fn trained_inputs(&self) -> Vec<bool> {
        self.groups.iter().map(GroupLayout::embedded).collect()
    }

    /// Rows of the group inputs `x`: the examples, then any sampled items.
    fn rows_of(&self, x: &[Vec<f32>]) -> usize {
        self.groups
            .iter()
            .zip(x)
            .find(|(g, _)| g.width > 0)
            .map_or(0, |(g, v)| v.len() / g.width)
    }

    /// Training-mode loss and gradients of a batch on the model's
    /// executor, from group input matrices `[b, width]` and the batch's
    /// `Targets`: the tasks' losses weighted and summed. Dropout masks come
    /// from `rng`.
    pub fn loss_and_grads(&self, x: &[Vec<f32>], targets: Targets, tasks: &[Task], rng: &mut Rng) -> PassGrads {
        self.loss_and_grads_on(&*self.exec, x, (targets, tasks), rng)
    }

    /// `loss_and_grads` on another executor (tests hold executors to each
    /// other this way).
    pub fn loss_and_grads_on(
        &self,
        exec: &dyn Executor,
        x: &[Vec<f32>],
        (targets, tasks): (Targets, &[Task]),
        rng: &mut Rng,
    ) -> PassGrads {
        let b = self.rows_of(x);
        let (loss, back, bn_stats) = self.pass_grads(|mode| self.forward_on(exec, x, b, mode), (targets, tasks), rng);
        PassGrads {
            loss,
            dense: back.dense.into_host(),
            inputs: back.inputs,
            bn_stats,
        }
    }

    /// `loss_and_grads` on the parameters `resident` holds on a device
    /// (the model's own are lent to it): the dense gradient is left there.
    /// With `tables`, the lookups in tables kept there too are pooled into
    /// the group inputs there (`x` holds zeros in their columns), and
    /// their gradients are left there.
    pub fn loss_and_grads_resident(
        &self,
        (resident, tables): (&Resident, Option<&TableLookups>),
        x: &[Vec<f32>],
        (targets, tasks): (Targets, &[Task]),
        rng: &mut Rng,
    ) -> (f32, Backward, Vec<BnStats>) {
        let b = self.rows_of(x);
        self.pass_grads(
            |mode| resident.forward(&self.graph, &self.buffers, (x, b, tables), mode),
            (targets, tasks),
            rng,
        )
    }

    /// The training pass `forward` runs (in the mode given), its heads'
    /// loss and the backward from them.
    fn pass_grads<'t>(
        &self,
        forward: impl FnOnce(Mode) -> Box<dyn Tape + 't>,
        (targets, tasks): (Targets, &[Task]),
        rng: &mut Rng,
    ) -> (f32, Backward, Vec<BnStats>) {
        let users = targets.rows;
        let mut bn_stats = Vec::new();
        let mode = Mode::Train {
            rng,
            stats: &mut bn_stats,
            examples: users,
        };
        let tape = forward(mode);
        tape.prefetch(&heads::train_reads(&self.graph, tasks));
        let (loss, seeds) = heads::train(&self.graph, &*tape, tasks, targets, users);
        let needs = self.graph.needs_grad(&self.trained_inputs());
        let back = tape.backward_dense(&self.params, seeds, &needs);
        drop(tape);
        (loss, back, bn_stats)
    }

    /// The graph outputs besides the tasks' that an export carries: a match
    /// model's tower embeddings (`user_tower_emb`, `item_tower_emb`), each
    /// `[batch, d]`, so retrieval can index items and embed users apart;
    /// MIND's interests too (`user_interests`, `[batch, max_k * d]`, and
    /// their count `user_emb_num`).
    pub fn embedding_outputs(&self) -> Vec<(&'static str, NodeId)> {
        ["user_tower_emb", "item_tower_emb", "user_interests", "user_emb_num"]
            .into_iter()
            .filter_map(|n| Some((n, self.graph.output_node(n)?)))
            .collect()
    }

    /// Inference-mode values of `embedding_outputs` for `b` rows, each
    /// `[b, width]` row-major.
    pub fn embedding_values(&self, x: &[Vec<f32>], b: usize) -> Vec<Vec<f32>> {
        let tape = self.forward_on(&*self.exec, x, b, Mode::Infer);
        self.embedding_outputs()
            .into_iter()
            .map(|(_, n)| tape.value(n).to_vec())
            .collect()
    }

    /// Inference-mode scores of a labelled batch's examples for each task,
    /// with the task's batch loss, penalties and summaries (`heads::evaluate`).
    pub fn evaluate_batch(&self, x: &[Vec<f32>], targets: Targets, tasks: &[Task]) -> (Vec<BatchEval>, Vec<f64>) {
        let b = self.rows_of(x);
        let users = targets.rows;
        let tape = (users > 0).then(|| self.forward_on(&*self.exec, x, b, Mode::Infer));
        heads::evaluate(&self.graph, tape.as_deref(), tasks, targets, users)
    }

    /// Inference-mode logits and scores of `b` rows for each task.
    pub fn scores(&self, x: &[Vec<f32>], b: usize, tasks: &[Task]) -> Vec<TaskScores> {
        if b == 0 {
            return tasks.iter().map(|t| TaskScores::from_logits(t, Vec::new())).collect();
        }
        let tape = self.forward_on(&*self.exec, x, b, Mode::Infer);
        heads::scores(&self.graph, &*tape, tasks)
    }
}
