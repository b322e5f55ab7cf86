//! Models: feature groups laid out as dense input matrices, and each
//! architecture as a graph of layer-level ops (`graph`) emitted by its
//! builder (`builders`) and run by the CPU executor (`cpu`, training and
//! evaluation), burn (`reference`, the tests' oracle) or the ONNX emitter
//! (`export::graph`). Single-device; distribution wraps them.

pub mod backbone;
pub mod builders;
pub mod cpu;
pub mod graph;
pub mod kernels;
pub mod names;
#[cfg(test)]
mod op_tests;
pub mod params;
pub mod reference;

use anyhow::{bail, Context};

pub use graph::{BnStats, Graph, NodeId, Op};
pub use params::{ParamSpec, ParamStore};

use crate::config::typed::{EmbeddingInit, FeatureKind, LossKind, Task, TrainingPlan};
use crate::features::Encoder;
use crate::util::Rng;

/// One feature's columns inside a group's input matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub feature: usize,
    pub col: usize,
    pub dim: usize,
    /// Embedding table it is pooled from; `None` for raw values.
    pub table: Option<usize>,
    /// Pooled by weighted mean rather than sum: the feature's combiner,
    /// except in wide groups, which EasyRec always sums.
    pub mean: bool,
}

/// A feature group as the model sees it: `[batch, width]`, its columns in
/// EasyRec's order (`builders::columns_by_name`), sparse parts first in wide
/// groups and in DeepFM.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLayout {
    pub name: String,
    pub wide: bool,
    pub width: usize,
    pub parts: Vec<Part>,
    /// Indices into `parts` in the group's `feature_names` order (EasyRec's
    /// per-feature list).
    pub listed: Vec<usize>,
}

impl GroupLayout {
    pub fn sparse_parts(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().filter(|p| p.table.is_some())
    }
    pub fn dense_width(&self) -> usize {
        self.parts.iter().filter(|p| p.table.is_none()).map(|p| p.dim).sum()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    pub name: String,
    pub rows: usize,
    pub dim: usize,
    pub wide: bool,
    pub init: EmbeddingInit,
}

/// Everything dense about a model: layout, parameters and the network.
#[derive(Debug, Clone)]
pub struct Model {
    pub groups: Vec<GroupLayout>,
    pub tables: Vec<TableSpec>,
    pub params: ParamStore,
    /// Non-trained state (batch-norm moving statistics).
    pub buffers: ParamStore,
    pub graph: Graph,
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
    pub fn new(plan: &TrainingPlan, enc: &Encoder, seed: u64) -> anyhow::Result<Self> {
        let mut tables: Vec<TableSpec> = Vec::new();
        let mut groups = Vec::new();
        for g in &plan.groups {
            let mut parts = Vec::new();
            for &fi in &g.features {
                let f = &plan.features[fi];
                let part = match enc.table_rows(fi) {
                    None => Part {
                        feature: fi,
                        col: 0,
                        dim: enc.dense_dim(fi).expect("dense feature has a width"),
                        table: None,
                        mean: false,
                    },
                    Some(rows) => {
                        let (name, dim) = if g.wide {
                            let wd = builders::wide_dim(&plan.arch).with_context(|| {
                                format!(
                                    "feature group `{}` is WIDE, which only WideAndDeep, DeepFM, FM and backbone input layers with wide_output_dim use",
                                    g.name
                                )
                            })?;
                            (format!("{}_wide", f.table), wd)
                        } else {
                            if f.embedding_dim == 0 {
                                let what = if matches!(f.kind, FeatureKind::Raw { .. }) {
                                    "a RawFeature with boundaries"
                                } else {
                                    "a sparse feature"
                                };
                                bail!(
                                    "feature `{}` is {what} in group `{}` and needs embedding_dim > 0",
                                    f.name,
                                    g.name
                                );
                            }
                            (f.table.clone(), f.embedding_dim as usize)
                        };
                        let t = match tables.iter().position(|t| t.name == name) {
                            Some(t) => {
                                if tables[t].dim != dim {
                                    bail!(
                                        "features sharing embedding `{name}` disagree on embedding_dim ({} vs {dim})",
                                        tables[t].dim
                                    );
                                }
                                if tables[t].init != f.init {
                                    bail!("features sharing embedding `{name}` disagree on their initializer");
                                }
                                tables[t].rows = tables[t].rows.max(rows as usize);
                                t
                            }
                            None => {
                                tables.push(TableSpec {
                                    name,
                                    rows: rows as usize,
                                    dim,
                                    wide: g.wide,
                                    init: f.init.clone(),
                                });
                                tables.len() - 1
                            }
                        };
                        Part {
                            feature: fi,
                            col: 0,
                            dim,
                            table: Some(t),
                            mean: f.mean_combiner && !g.wide,
                        }
                    }
                };
                parts.push(part);
            }
            // Columns in the order EasyRec's input layer puts them, so its
            // kernels line up row for row with ours.
            if builders::columns_by_name(&plan.arch, &g.name, g.wide) {
                parts.sort_by_cached_key(|p| plan.features[p.feature].easyrec_column());
            }
            // Wide groups and DeepFM's groups put embedded features first: the
            // FM part reads them as one `[batch, n, dim]` block.
            if g.wide || builders::embedded_first(&plan.arch) {
                parts.sort_by_key(|p| p.table.is_none());
            }
            let mut col = 0;
            for p in &mut parts {
                p.col = col;
                col += p.dim;
            }
            let listed = g
                .features
                .iter()
                .map(|f| {
                    parts
                        .iter()
                        .position(|p| p.feature == *f)
                        .expect("each listed feature has a part")
                })
                .collect();
            groups.push(GroupLayout {
                name: g.name.clone(),
                wide: g.wide,
                width: col,
                parts,
                listed,
            });
        }
        let mut rng = Rng::new(seed ^ 0xdea5e);
        let mut params = ParamStore::default();
        let mut buffers = ParamStore::default();
        let mut scope = graph::Scope {
            params: &mut params,
            buffers: &mut buffers,
            rng: &mut rng,
        };
        let graph = builders::build(&plan.arch, &groups, &mut scope)?;
        Ok(Model {
            groups,
            tables,
            params,
            buffers,
            graph,
        })
    }

    /// Whether each group's input is trained (holds embedded features).
    pub fn trained_inputs(&self) -> Vec<bool> {
        self.groups.iter().map(|g| g.sparse_parts().next().is_some()).collect()
    }

    /// The graph output of each task.
    fn task_outputs(&self, tasks: &[Task]) -> Vec<NodeId> {
        tasks
            .iter()
            .map(|t| {
                self.graph
                    .output_node(&t.output())
                    .unwrap_or_else(|| panic!("the model graph has output `{}`", t.output()))
            })
            .collect()
    }

    /// Training-mode loss and gradients of a batch on the CPU executor, from
    /// group input matrices `[b, width]` and the batch's label fields: the
    /// tasks' losses weighted and summed. Dropout masks come from `rng`.
    pub fn loss_and_grads(&self, x: &[Vec<f32>], labels: &[Vec<f32>], tasks: &[Task], rng: &mut Rng) -> PassGrads {
        let b = labels.first().map_or(0, Vec::len);
        let mut bn_stats = Vec::new();
        let mode = cpu::Mode::Train {
            rng,
            stats: &mut bn_stats,
        };
        let tape = cpu::Tape::forward(&self.graph, (&self.params, &self.buffers), x, b, mode);
        let mut loss = 0.0f32;
        let mut seeds = Vec::new();
        for (t, out) in tasks.iter().zip(self.task_outputs(tasks)) {
            let (l, mut dl) = kernels::task_loss_grad(t, tape.value(out), &labels[t.label]);
            loss += t.weight * l;
            if t.weight != 1.0 {
                dl.iter_mut().for_each(|g| *g *= t.weight);
            }
            seeds.push((out, dl));
        }
        let needs = self.graph.needs_grad(&self.trained_inputs());
        let mut dense = vec![0.0f32; self.params.values.len()];
        let inputs = tape.backward(&self.params, seeds, &needs, &mut dense);
        PassGrads {
            loss,
            dense,
            inputs,
            bn_stats,
        }
    }

    /// Inference-mode logits and scores of `b` rows for each task, on the
    /// CPU executor.
    pub fn scores(&self, x: &[Vec<f32>], b: usize, tasks: &[Task]) -> Vec<TaskScores> {
        if b == 0 {
            return tasks.iter().map(|t| TaskScores::from_logits(t, Vec::new())).collect();
        }
        let tape = cpu::Tape::forward(&self.graph, (&self.params, &self.buffers), x, b, cpu::Mode::Infer);
        tasks
            .iter()
            .zip(self.task_outputs(tasks))
            .map(|(t, n)| TaskScores::from_logits(t, tape.value(n).to_vec()))
            .collect()
    }
}

/// One task's predictions for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskScores {
    pub logits: Vec<f32>,
    /// Probabilities (classification) or values (regression).
    pub scores: Vec<f32>,
}

impl TaskScores {
    pub fn from_logits(task: &Task, logits: Vec<f32>) -> Self {
        let scores = match task.loss {
            LossKind::BinaryClassification => logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
            LossKind::Regression => logits.clone(),
        };
        TaskScores { logits, scores }
    }
}
