//! How a model sees its input: each feature group laid out as one dense
//! `[batch, width]` matrix (the embedded and raw features' columns in
//! EasyRec's order, then the columns its sequence layers read), and the
//! embedding tables those columns are pooled from. The builders read the
//! layouts; the embedding collection fills them.

use anyhow::{bail, Context};

use super::builders::columns;
use crate::config::feature_plan::{EmbeddingInit, FeatureKind, FeatureSpec, KeyValueSpec, SeqCombiner};
use crate::config::model::{Arch, FeatureGroup, ModelPlan, SeqAttention};
use crate::features::Encoder;

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
/// EasyRec's order (`columns::columns_by_name`), sparse parts first in wide
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
        let wd = columns::wide_dim(arch).with_context(|| {
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
            if tables[t].key_value != f.key_value {
                bail!("features sharing embedding `{name}` disagree on ev_params (a key-value table or not)");
            }
            if tables[t].key_value.is_none() {
                tables[t].rows = tables[t].rows.max(rows as usize);
            }
            t
        }
        None => {
            let rows = match f.key_value {
                Some(kv) => usize::try_from(kv.max_capacity).unwrap_or(usize::MAX),
                None => rows as usize,
            };
            tables.push(TableSpec {
                name,
                rows,
                dim,
                wide: g.wide,
                init: f.init.clone(),
                key_value: f.key_value,
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
    /// Stored as a key-value table (`ev_params`); `rows` is then its
    /// max_capacity.
    pub key_value: Option<KeyValueSpec>,
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
    pub(crate) fn of(l: &GroupLayout, features: &[FeatureSpec], embedding_wise: bool) -> Option<Self> {
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

/// The layout of every feature group of `plan` over `features` (as `enc`
/// encodes them), and the embedding tables their columns are pooled from.
pub fn group_layouts(
    plan: &ModelPlan,
    features: &[FeatureSpec],
    enc: &Encoder,
) -> anyhow::Result<(Vec<GroupLayout>, Vec<TableSpec>)> {
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
        if columns::columns_by_name(&plan.arch, &g.name, g.wide) {
            parts.sort_by_cached_key(|p| features[p.feature].easyrec_column());
        }
        // Wide groups and DeepFM's groups put embedded features first: the
        // FM part reads them as one `[batch, n, dim]` block.
        if g.wide || columns::embedded_first(&plan.arch) {
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
    Ok((groups, tables))
}
