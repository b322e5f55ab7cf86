//! Models: feature groups laid out as dense input matrices, and each
//! architecture as a graph of layer-level ops (`graph`) emitted by its
//! builder (`builders`) and run by the CPU executor (`cpu`, training and
//! evaluation), burn (`reference`, the tests' oracle) or the ONNX emitter
//! (`export::graph`). Single-device; distribution wraps them.

pub mod backbone;
pub mod builders;
pub mod capsule;
pub mod cpu;
pub mod graph;
pub mod kernels;
pub mod mind;
pub mod multimodal;
pub mod names;
#[cfg(test)]
mod op_tests;
pub mod params;
pub mod reference;
pub mod sequence;
pub mod transformer;

use anyhow::{bail, Context};

pub use graph::{BnStats, Graph, NodeId, Op};
pub use params::{ParamSpec, ParamStore};

use crate::config::feature_plan::{EmbeddingInit, FeatureKind, FeatureSpec, SeqCombiner};
use crate::config::model_plan::{Arch, FeatureGroup, ModelPlan, SeqAttention};
use crate::config::tasks::{LossKind, Task};
use crate::features::{Batch, Encoder};
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
/// groups and in DeepFM; then the columns its sequence attentions read.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLayout {
    pub name: String,
    pub wide: bool,
    pub width: usize,
    /// The width of the plain parts, the group's features proper.
    pub plain_width: usize,
    pub parts: Vec<Part>,
    /// Indices into `parts` in the group's `feature_names` order (EasyRec's
    /// per-feature list).
    pub listed: Vec<usize>,
    /// Columns after the plain parts, for `combined` and `seq`.
    pub seq_parts: Vec<SeqPart>,
    /// Sequence features among the group's features, each pooled by its
    /// combiner, in the group's `feature_names` order.
    pub combined: Vec<CombinedSeq>,
    /// Target attentions over sequences, appended to the group's features.
    pub seq: Vec<SeqLayout>,
}

/// The index of the non-wide group called `name`.
pub fn named_group(groups: &[GroupLayout], name: &str) -> Option<usize> {
    groups.iter().position(|g| g.name == name && !g.wide)
}

impl GroupLayout {
    /// The width of the group's features as the model reads them: its
    /// plain parts, then its combined sequences' outputs.
    pub fn features_width(&self) -> usize {
        self.plain_width + self.combined.iter().map(|c| c.width).sum::<usize>()
    }

    /// Each feature's `(col, width)` in the group's features (plain parts
    /// by `listed`, then the combined sequences), in `feature_names` order
    /// as EasyRec lists them: plain features first.
    pub fn feature_columns(&self) -> Vec<(usize, usize)> {
        let plain = self.listed.iter().map(|&p| (self.parts[p].col, self.parts[p].dim));
        plain
            .chain(self.combined.iter().map(|c| (c.out_col, c.width)))
            .collect()
    }

    /// The combined sequences in the order their outputs follow the plain
    /// parts (EasyRec's input layer concatenates them by column name).
    pub fn combined_in_order(&self) -> Vec<&CombinedSeq> {
        let mut seqs: Vec<&CombinedSeq> = self.combined.iter().collect();
        seqs.sort_by_key(|c| c.out_col);
        seqs
    }

    pub fn sparse_parts(&self) -> impl Iterator<Item = &Part> {
        self.parts.iter().filter(|p| p.table.is_some())
    }
    pub fn dense_width(&self) -> usize {
        self.parts.iter().filter(|p| p.table.is_none()).map(|p| p.dim).sum()
    }
    /// Whether any column is looked up in a table (so is trained).
    pub fn embedded(&self) -> bool {
        self.sparse_parts().next().is_some() || self.seq_parts.iter().any(|p| p.kind.table().is_some())
    }
}

/// A sequence among a group's features, pooled by its combiner: it reads
/// the positions (and, for attention, the length) columns of its input,
/// its output sits at `out_col` of the group's features (after the plain
/// parts, the combined sequences ordered as EasyRec's input layer
/// concatenates them, by column name).
#[derive(Debug, Clone, PartialEq)]
pub struct CombinedSeq {
    pub feature: usize,
    /// The feature's name, which its layers are named after.
    pub name: String,
    pub combiner: SeqCombiner,
    /// `(col, dim)` of the positions block, `len * dim` wide.
    pub positions: (usize, usize),
    pub len: usize,
    /// The column of the row's length, where the combiner masks by it.
    pub len_col: Option<usize>,
    pub out_col: usize,
    pub width: usize,
}

/// A column block that the sequence layers of a group read.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqPart {
    pub feature: usize,
    pub col: usize,
    pub kind: SeqPartKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SeqPartKind {
    /// The feature's embeddings pooled as a plain part's are (a key that
    /// is not among the group's features).
    Pooled { table: usize, dim: usize, mean: bool },
    /// The embeddings of the row's first `len` values side by side,
    /// `[len * dim]`, zeros past the row's length.
    Positions { table: usize, dim: usize, len: usize },
    /// The row's number of values (at most `len`), one column.
    Length { len: usize },
}

impl SeqPartKind {
    pub fn width(&self) -> usize {
        match self {
            SeqPartKind::Pooled { dim, .. } => *dim,
            SeqPartKind::Positions { dim, len, .. } => dim * len,
            SeqPartKind::Length { .. } => 1,
        }
    }
    pub fn table(&self) -> Option<usize> {
        match self {
            SeqPartKind::Pooled { table, .. } | SeqPartKind::Positions { table, .. } => Some(*table),
            SeqPartKind::Length { .. } => None,
        }
    }
}

/// Where one target attention's inputs sit in its group's input matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqLayout {
    pub att: SeqAttention,
    /// `(col, width)` of each key's embedding.
    pub keys: Vec<(usize, usize)>,
    /// `(col, dim)` of each history's positions block (`len * dim` wide).
    pub hist: Vec<(usize, usize)>,
    pub aux: Vec<(usize, usize)>,
    /// Positions per history.
    pub len: usize,
    /// The column holding each row's history length.
    pub len_col: usize,
}

/// Appends a column block of `kind` for `feature` at `col` (moved past it);
/// returns where the block starts.
fn add_seq_part(seq_parts: &mut Vec<SeqPart>, col: &mut usize, feature: usize, kind: SeqPartKind) -> usize {
    let at = *col;
    *col += kind.width();
    seq_parts.push(SeqPart { feature, col: at, kind });
    at
}

/// The table of embedded feature `fi` in group `g` (made on first use) and
/// its width. `seq`: looked up by the group's sequence layers, which EasyRec
/// does in a variable scope of the group's own, so the feature has a table
/// there unless it shares one by `embedding_name`.
fn table_of(
    tables: &mut Vec<TableSpec>,
    (features, arch): (&[FeatureSpec], &Arch),
    (g, seq): (&FeatureGroup, bool),
    fi: usize,
    rows: u64,
) -> anyhow::Result<(usize, usize)> {
    let f = &features[fi];
    let table = if seq && f.table == f.name {
        format!("{}/{}", g.name, f.table)
    } else {
        f.table.clone()
    };
    let (name, dim) = if g.wide {
        let wd = builders::wide_dim(arch).with_context(|| {
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
        (table, f.embedding_dim as usize)
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
    Ok((t, dim))
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
    /// EasyRec's variable name of each table (`names::table_variables`).
    pub table_variables: Vec<String>,
    pub params: ParamStore,
    /// Non-trained state (batch-norm moving statistics).
    pub buffers: ParamStore,
    pub graph: Graph,
    /// The parameters holding variational dropout's logits, one per group.
    pub dropout_logits: Vec<usize>,
}

/// The name EasyRec gives variational dropout's logits (`logit_p` for the
/// group `all`, `logit_p_<group>` otherwise).
pub const DROPOUT_LOGITS: &str = "logit_p";

/// Variational dropout of a group's plain columns (`Op::VariationalDropout`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDropout {
    /// The logits' name.
    pub name: String,
    /// How many dropout rates the group learns.
    pub entries: usize,
    /// The rate of each plain column, by entry.
    pub index: Vec<usize>,
}

impl GroupDropout {
    /// EasyRec's entries: one per feature (`embedding_wise`: per column)
    /// in the order its input layer concatenates the features (combined
    /// sequences last), whatever order the group's columns are in here.
    /// `None` for a group without features of its own.
    fn of(l: &GroupLayout, features: &[FeatureSpec], embedding_wise: bool) -> Option<Self> {
        if l.features_width() == 0 {
            return None;
        }
        // Each feature's `(col, width)` in EasyRec's order: the plain parts
        // by column name, then the combined sequences.
        let mut plain: Vec<&Part> = l.parts.iter().collect();
        plain.sort_by_cached_key(|p| features[p.feature].easyrec_column());
        let blocks = plain
            .iter()
            .map(|p| (p.col, p.dim))
            .chain(l.combined_in_order().into_iter().map(|c| (c.out_col, c.width)));
        let mut index = vec![0; l.features_width()];
        let mut next = 0;
        for (col, width) in blocks {
            for c in 0..width {
                index[col + c] = next + if embedding_wise { c } else { 0 };
            }
            next += if embedding_wise { width } else { 1 };
        }
        let name = if l.name == "all" {
            DROPOUT_LOGITS.to_string()
        } else {
            format!("{DROPOUT_LOGITS}_{}", l.name)
        };
        Some(GroupDropout {
            name,
            entries: next,
            index,
        })
    }
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
        let mut tables: Vec<TableSpec> = Vec::new();
        let mut groups = Vec::new();
        for g in &plan.groups {
            let mut parts = Vec::new();
            let mut pooled = Vec::new();
            for &fi in &g.features {
                let f = &features[fi];
                if let FeatureKind::Sequence {
                    combiner: Some(c),
                    max_len,
                    ..
                } = &f.kind
                {
                    pooled.push((fi, c.clone(), *max_len));
                    continue;
                }
                let part = match enc.table_rows(fi) {
                    None => Part {
                        feature: fi,
                        col: 0,
                        dim: enc.dense_dim(fi).expect("dense feature has a width"),
                        table: None,
                        mean: false,
                    },
                    Some(rows) => {
                        let (t, dim) = table_of(&mut tables, (features, &plan.arch), (g, false), fi, rows)?;
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
                parts.sort_by_cached_key(|p| features[p.feature].easyrec_column());
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
                .filter(|f| !pooled.iter().any(|(p, ..)| p == *f))
                .map(|f| {
                    parts
                        .iter()
                        .position(|p| p.feature == *f)
                        .expect("each listed feature has a part")
                })
                .collect();
            let plain_width = col;
            let mut seq_parts = Vec::new();
            let mut combined = Vec::new();
            for (fi, combiner, max_len) in pooled {
                let rows = enc.table_rows(fi).expect("a sequence has ids");
                let (table, dim) = table_of(&mut tables, (features, &plan.arch), (g, false), fi, rows)?;
                let len = combiner.positions(max_len);
                let pos = add_seq_part(&mut seq_parts, &mut col, fi, SeqPartKind::Positions { table, dim, len });
                let len_col = matches!(combiner, SeqCombiner::Attention)
                    .then(|| add_seq_part(&mut seq_parts, &mut col, fi, SeqPartKind::Length { len }));
                combined.push(CombinedSeq {
                    feature: fi,
                    name: features[fi].name.clone(),
                    width: combiner.width(dim),
                    combiner,
                    positions: (pos, dim),
                    len,
                    len_col,
                    out_col: 0,
                });
            }
            let mut by_column: Vec<usize> = (0..combined.len()).collect();
            by_column.sort_by_cached_key(|&k| features[combined[k].feature].easyrec_column());
            let mut out = plain_width;
            for k in by_column {
                combined[k].out_col = out;
                out += combined[k].width;
            }
            let mut seq = Vec::new();
            for att in &g.seq {
                let mut keys = Vec::new();
                for &fi in &att.keys {
                    match parts.iter().find(|p| p.feature == fi) {
                        Some(p) => keys.push((p.col, p.dim)),
                        None => {
                            // A key outside the group is looked up for the
                            // attention alone (EasyRec's key search).
                            let rows = enc.table_rows(fi).with_context(|| {
                                format!("sequence key `{}` is not an embedded feature", features[fi].name)
                            })?;
                            let (table, dim) = table_of(&mut tables, (features, &plan.arch), (g, true), fi, rows)?;
                            let mean = features[fi].mean_combiner;
                            let kind = SeqPartKind::Pooled { table, dim, mean };
                            keys.push((add_seq_part(&mut seq_parts, &mut col, fi, kind), dim));
                        }
                    }
                }
                let mut len = None;
                let mut positions = |fis: &[usize], col: &mut usize| -> anyhow::Result<Vec<(usize, usize)>> {
                    let mut out = Vec::new();
                    for &fi in fis {
                        let f = &features[fi];
                        let FeatureKind::Sequence { max_len, .. } = f.kind else {
                            bail!(
                                "hist_seq `{}` of sequence group `{}` is not a SequenceFeature",
                                f.name,
                                att.name
                            );
                        };
                        if *len.get_or_insert(max_len) != max_len {
                            bail!(
                                "the histories of sequence group `{}` keep different lengths (max_seq_len); give them one",
                                att.name
                            );
                        }
                        let rows = enc.table_rows(fi).expect("a sequence has ids");
                        let (table, dim) = table_of(&mut tables, (features, &plan.arch), (g, true), fi, rows)?;
                        let kind = SeqPartKind::Positions {
                            table,
                            dim,
                            len: max_len,
                        };
                        out.push((add_seq_part(&mut seq_parts, col, fi, kind), dim));
                    }
                    Ok(out)
                };
                let hist = positions(&att.hist, &mut col)?;
                let aux = positions(&att.aux, &mut col)?;
                let len = len.expect("a sequence group has a history");
                // The first history's length masks the attention, as in EasyRec.
                let len_col = add_seq_part(&mut seq_parts, &mut col, att.hist[0], SeqPartKind::Length { len });
                seq.push(SeqLayout {
                    att: att.clone(),
                    keys,
                    hist,
                    aux,
                    len,
                    len_col,
                });
            }
            groups.push(GroupLayout {
                name: g.name.clone(),
                wide: g.wide,
                width: col,
                plain_width,
                parts,
                listed,
                seq_parts,
                combined,
                seq,
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
        })
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

    /// The graph output of each task.
    fn task_outputs(&self, tasks: &[Task]) -> Vec<NodeId> {
        tasks
            .iter()
            .map(|t| {
                let n = self
                    .graph
                    .output_node(&t.output())
                    .unwrap_or_else(|| panic!("the model graph has output `{}`", t.output()));
                assert_eq!(
                    self.graph.width(n),
                    t.logit_width(),
                    "task output `{}` has a column per logit",
                    t.output()
                );
                n
            })
            .collect()
    }

    /// Rows of the group inputs `x`: the examples, then any sampled items.
    fn rows_of(&self, x: &[Vec<f32>]) -> usize {
        self.groups
            .iter()
            .zip(x)
            .find(|(g, _)| g.width > 0)
            .map_or(0, |(g, v)| v.len() / g.width)
    }

    /// Training-mode loss and gradients of a batch on the CPU executor, from
    /// group input matrices `[b, width]` and the batch's `Targets`: the
    /// tasks' losses weighted and summed. Dropout masks come from `rng`.
    pub fn loss_and_grads(&self, x: &[Vec<f32>], targets: Targets, tasks: &[Task], rng: &mut Rng) -> PassGrads {
        let Targets { labels, weights, .. } = targets;
        let b = self.rows_of(x);
        let users = labels.first().map_or(b, Vec::len);
        let mut bn_stats = Vec::new();
        let mode = cpu::Mode::Train {
            rng,
            stats: &mut bn_stats,
            examples: users,
        };
        let tape = cpu::Tape::forward(&self.graph, (&self.params, &self.buffers), x, b, mode);
        let mut loss = 0.0f32;
        let mut seeds = Vec::new();
        for (t, out) in tasks.iter().zip(self.task_outputs(tasks)) {
            if !t.trained() {
                continue;
            }
            if t.in_batch() {
                let ([us, v, u], towers) = self.towers(&tape, users, (targets, t.loss));
                let (l, gr) = kernels::in_batch_softmax(&towers, kernels::in_batch_logits(&towers));
                let w = t.weight;
                loss += w * l;
                for (n, mut g) in [(us, gr.us), (v, gr.v), (u, gr.u)] {
                    if w != 1.0 {
                        g.iter_mut().for_each(|x| *x *= w);
                    }
                    seeds.push((n, g));
                }
                continue;
            }
            let (l, mut dl) = match weights {
                Some(w) => kernels::weighted_loss_grad(t.loss, tape.value(out), &labels[t.label], w),
                None => kernels::task_loss_grad(t, tape.value(out), &labels[t.label], targets.sessions),
            };
            loss += t.weight * l;
            if t.weight != 1.0 {
                dl.iter_mut().for_each(|g| *g *= t.weight);
            }
            // Distillation terms join the loss as they are.
            for kd in &t.kd {
                let (l, g) = kernels::kd_loss_grad(kd, tape.value(out), &labels[kd.label]);
                loss += l;
                dl.iter_mut().zip(g).for_each(|(a, b)| *a += b);
            }
            seeds.push((out, dl));
        }
        for (l, node, seed) in self.penalties_on(&tape, users, weights) {
            loss += l;
            seeds.push((node, seed));
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
        let tape = cpu::Tape::forward(&self.graph, (&self.params, &self.buffers), x, b, cpu::Mode::Infer);
        self.embedding_outputs()
            .into_iter()
            .map(|(_, n)| tape.value(n).to_vec())
            .collect()
    }

    /// A match model's `user_scaled`, `item_tower_emb` and `user_tower_emb`
    /// outputs, what its in-batch softmax reads.
    pub fn tower_outputs(&self) -> [NodeId; 3] {
        ["user_scaled", "item_tower_emb", "user_tower_emb"].map(|n| {
            self.graph
                .output_node(n)
                .unwrap_or_else(|| panic!("a match model's graph has output `{n}`"))
        })
    }

    /// The tower outputs' nodes and their values on `tape`, whose first
    /// `users` rows are examples, for the in-batch loss `loss`.
    fn towers<'t>(
        &self,
        tape: &'t cpu::Tape,
        users: usize,
        (targets, loss): (Targets<'t>, LossKind),
    ) -> ([NodeId; 3], kernels::Towers<'t>) {
        let [us, v, u] = self.tower_outputs();
        let towers = kernels::Towers {
            us: tape.value(us),
            v: tape.value(v),
            u: tape.value(u),
            d: self.graph.width(v),
            users,
            weights: targets.weights,
            hard: targets.hard_negatives,
            ignore_in_batch: loss.ignores_in_batch(),
            items: targets.items,
        };
        ([us, v, u], towers)
    }

    /// Inference-mode scores of a labelled batch's examples for each task,
    /// with the task's batch loss and, for in-batch tasks, each user's
    /// ranks of its own item (`kernels::in_batch_ranks`).
    ///
    /// Beside them, each graph penalty's loss on the batch, weighted as
    /// trained (EasyRec's eval loss sums them in), then each graph
    /// summary's value on the batch.
    pub fn evaluate_batch(&self, x: &[Vec<f32>], targets: Targets, tasks: &[Task]) -> (Vec<BatchEval>, Vec<f64>) {
        let Targets { labels, weights, .. } = targets;
        let b = self.rows_of(x);
        let users = labels.first().map_or(b, Vec::len);
        if users == 0 {
            let evals = tasks
                .iter()
                .map(|t| BatchEval {
                    scores: TaskScores::from_logits(t, Vec::new()),
                    loss: 0.0,
                    ranks: Vec::new(),
                    interests: Interests::default(),
                })
                .collect();
            return (
                evals,
                vec![0.0; self.graph.penalties.len() + self.graph.summaries.len()],
            );
        }
        let tape = cpu::Tape::forward(&self.graph, (&self.params, &self.buffers), x, b, cpu::Mode::Infer);
        let summaries = self
            .graph
            .summaries
            .iter()
            .map(|m| graph::share(&tape.value(m.node)[..users * 2]) as f64);
        let penalties = self
            .penalties_on(&tape, users, weights)
            .into_iter()
            .map(|(l, _, _)| l as f64)
            .chain(summaries)
            .collect();
        let evals = tasks
            .iter()
            .zip(self.task_outputs(tasks))
            .map(|(t, n)| {
                let scores = TaskScores::from_logits(t, tape.value(n)[..users * t.logit_width()].to_vec());
                if !t.in_batch() {
                    let loss = match weights {
                        Some(w) => kernels::weighted_loss_grad(t.loss, &scores.logits, &labels[t.label], w).0 as f64,
                        None => kernels::loss_value(t, &scores.logits, &labels[t.label], targets.sessions),
                    } + t
                        .kd
                        .iter()
                        .map(|kd| kernels::kd_loss_grad(kd, &scores.logits, &labels[kd.label]).0 as f64)
                        .sum::<f64>();
                    return BatchEval {
                        scores,
                        loss,
                        ranks: Vec::new(),
                        interests: Interests::default(),
                    };
                }
                let (_, towers) = self.towers(&tape, users, (targets, t.loss));
                let logits = kernels::in_batch_logits(&towers);
                let interests = match self.graph.output_node("user_interests") {
                    Some(ui) => {
                        let k = self.graph.width(ui) / towers.d.max(1);
                        let sims = kernels::interest_sims(tape.value(ui), k, &towers);
                        kernels::interest_eval(&sims, &scores.logits, &towers)
                    }
                    None => Interests::default(),
                };
                BatchEval {
                    scores,
                    ranks: kernels::in_batch_ranks(&logits, users),
                    loss: kernels::in_batch_softmax(&towers, logits).0 as f64,
                    interests,
                }
            })
            .collect();
        (evals, penalties)
    }

    /// Each graph penalty on `tape`, read on its first `users` rows (the
    /// examples, not sampled items): its weighted loss, its node and that
    /// node's gradient seed (zeros on the other rows).
    fn penalties_on(&self, tape: &cpu::Tape, users: usize, weights: Option<&[f32]>) -> Vec<(f32, NodeId, Vec<f32>)> {
        self.graph
            .penalties
            .iter()
            .map(|p| {
                let v = tape.value(p.node);
                let (l, g) = p.reduce.apply(&v[..users * self.graph.width(p.node)], weights);
                let mut seed: Vec<f32> = g.into_iter().map(|x| x * p.weight).collect();
                seed.resize(v.len(), 0.0);
                (p.weight * l, p.node, seed)
            })
            .collect()
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

/// What a batch's losses compare the model's outputs with: its examples'
/// label fields and sample weights (`data_config.sample_weight`), and
/// which sampled rows are whose hard negatives.
#[derive(Debug, Clone, Copy)]
pub struct Targets<'a> {
    pub labels: &'a [Vec<f32>],
    pub weights: Option<&'a [f32]>,
    pub hard_negatives: &'a [(usize, usize)],
    /// Each example's session (its grouping field, hashed) where a JRC
    /// loss reads it; empty otherwise.
    pub sessions: &'a [u64],
    /// Each example's item (hashed) where the in-batch softmax leaves out
    /// the batch's other examples of a user's item; empty otherwise.
    pub items: &'a [u64],
}

impl<'a> Targets<'a> {
    pub fn of(batch: &'a Batch) -> Self {
        Targets {
            labels: &batch.labels,
            weights: batch.weights.as_deref(),
            hard_negatives: &batch.hard_negatives,
            sessions: batch.uids.as_deref().unwrap_or_default(),
            items: batch.item_keys.as_deref().unwrap_or_default(),
        }
    }
}

/// One task's evaluation of a labelled batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEval {
    pub scores: TaskScores,
    /// The batch's mean loss.
    pub loss: f64,
    /// In-batch tasks: each user's ranks of its own item among all items,
    /// the batch's and its own with the sampled ones (`kernels::in_batch_ranks`).
    pub ranks: Vec<[u32; 3]>,
    /// MIND's: the same ranks by each item's best similarity to one of the
    /// user's interests (`kernels::interest_sims`), and per user whether
    /// its own logit beats its hard negatives' best interest similarities
    /// (batches with hard negatives); empty otherwise.
    pub interests: Interests,
}

/// A MIND in-batch task's per-user evaluation by its interests
/// (`BatchEval::interests`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interests {
    pub ranks: Vec<[u32; 3]>,
    pub hard_hits: Vec<bool>,
}

/// One task's predictions for a batch, row-major: per row `logit_width`
/// logits (a multi-class task's classes, ZILN's three, else one) and
/// `score_width` scores (a multi-class task's classes, else one).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskScores {
    pub logits: Vec<f32>,
    /// Probabilities (classification: per class for a multi-class task) or
    /// values (regression).
    pub scores: Vec<f32>,
    /// A ZILN task's expected value `y` per row.
    pub values: Option<Vec<f32>>,
    pub logit_width: usize,
    pub score_width: usize,
}

impl TaskScores {
    pub fn from_logits(task: &Task, logits: Vec<f32>) -> Self {
        let mut values = None;
        let scores = match task.loss {
            // A match model's listwise scores are exported as EasyRec does:
            // the sigmoid of the row's own similarity.
            LossKind::BinaryClassification | LossKind::InBatchSoftmax { .. } => {
                logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect()
            }
            LossKind::Regression => logits.clone(),
            LossKind::MultiClass { classes } => {
                let mut p = logits.clone();
                p.chunks_exact_mut(classes).for_each(kernels::softmax_in_place);
                p
            }
            // EasyRec's JRC probability: the second class's.
            LossKind::Jrc => logits
                .chunks_exact(2)
                .map(|z| {
                    let mut p = [z[0], z[1]];
                    kernels::softmax_in_place(&mut p);
                    p[1]
                })
                .collect(),
            LossKind::Ziln(z) => {
                let (probs, ys) = logits.chunks_exact(3).map(|l| kernels::ziln_prediction(l, z)).unzip();
                values = Some(ys);
                probs
            }
        };
        TaskScores {
            logits,
            scores,
            values,
            logit_width: task.logit_width(),
            score_width: task.classes(),
        }
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.logits.truncate(rows * self.logit_width);
        self.scores.truncate(rows * self.score_width);
        if let Some(v) = &mut self.values {
            v.truncate(rows);
        }
    }

    /// Rows `start..end` alone.
    pub fn rows_in(&self, start: usize, end: usize) -> TaskScores {
        let (l, s) = (self.logit_width, self.score_width);
        TaskScores {
            logits: self.logits[start * l..end * l].to_vec(),
            scores: self.scores[start * s..end * s].to_vec(),
            values: self.values.as_ref().map(|v| v[start..end].to_vec()),
            logit_width: l,
            score_width: s,
        }
    }
}

/// The columns predict and serve give for `task`: its logits and scores
/// (`logits`, `probs` or `y`, with the task's suffix), per logit
/// `logits_<k>` where a row has several, per class `probs_<k>` (EasyRec's
/// `probs_1` is the second class's) and the most probable class `y` for
/// a multi-class task, and ZILN's expected value `y`.
pub fn score_columns(task: &Task) -> Vec<String> {
    let per = |base: String, n: usize| -> Vec<String> {
        match n {
            1 => vec![base],
            n => (0..n).map(|k| format!("{base}_{k}")).collect(),
        }
    };
    let mut out = per(task.output(), task.logit_width());
    out.extend(per(task.score_name(), task.classes()));
    if task.classes() > 1 || matches!(task.loss, LossKind::Ziln(_)) {
        out.push(format!("y{}", task.suffix()));
    }
    out
}

impl TaskScores {
    /// The values of `score_columns`, one per row each.
    pub fn columns(&self) -> Vec<Vec<f32>> {
        let column = |v: &[f32], w: usize, k: usize| v.iter().skip(k).step_by(w).copied().collect::<Vec<f32>>();
        let (l, s) = (self.logit_width, self.score_width);
        let mut out: Vec<Vec<f32>> = (0..l).map(|k| column(&self.logits, l, k)).collect();
        out.extend((0..s).map(|k| column(&self.scores, s, k)));
        if s > 1 {
            let best = self.scores.chunks_exact(s).map(|p| kernels::argmax(p) as f32).collect();
            out.push(best);
        }
        if let Some(v) = &self.values {
            out.push(v.clone());
        }
        out
    }
}
