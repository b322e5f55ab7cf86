//! Models: feature groups laid out as dense input matrices, and the five
//! architectures on burn tensors. Single-device; distribution wraps them.

pub mod arch;
pub mod fused;
pub mod layers;
pub mod params;

use anyhow::{bail, Context};
use burn::tensor::Tensor;

pub use arch::Net;
pub use layers::Ctx;
pub use params::{ParamSpec, ParamStore};

use crate::config::model_plan::Arch;
use crate::config::typed::{EmbeddingInit, FeatureKind, TrainingPlan};
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
}

/// A feature group as the model sees it: `[batch, width]`, sparse parts first
/// in wide groups and in DeepFM, config order otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLayout {
    pub name: String,
    pub wide: bool,
    pub width: usize,
    pub parts: Vec<Part>,
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
    pub net: Net,
}

fn wide_dim(arch: &Arch) -> Option<usize> {
    match arch {
        Arch::WideAndDeep { wide_output_dim, .. } | Arch::DeepFm { wide_output_dim, .. } => Some(*wide_output_dim),
        _ => None,
    }
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
                    },
                    Some(rows) => {
                        let (name, dim) = if g.wide {
                            let wd = wide_dim(&plan.arch).with_context(|| {
                                format!(
                                    "feature group `{}` is WIDE, which only WideAndDeep and DeepFM use",
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
                        }
                    }
                };
                parts.push(part);
            }
            // Wide groups and DeepFM's groups put embedded features first: the
            // FM part reads them as one `[batch, n, dim]` block.
            if g.wide || matches!(plan.arch, Arch::DeepFm { .. }) {
                parts.sort_by_key(|p| p.table.is_none());
            }
            let mut col = 0;
            for p in &mut parts {
                p.col = col;
                col += p.dim;
            }
            groups.push(GroupLayout {
                name: g.name.clone(),
                wide: g.wide,
                width: col,
                parts,
            });
        }
        let mut rng = Rng::new(seed ^ 0xdea5e);
        let mut params = ParamStore::default();
        let mut buffers = ParamStore::default();
        let net = Net::new(&plan.arch, &groups, &mut params, &mut buffers, &mut rng)?;
        Ok(Model {
            groups,
            tables,
            params,
            buffers,
            net,
        })
    }

    /// Logits `[batch, 1]` from group inputs `[batch, width]`.
    pub fn forward(&self, ctx: &mut Ctx, inputs: &[Tensor<2>]) -> Tensor<2> {
        self.net.forward(ctx, inputs)
    }
}
