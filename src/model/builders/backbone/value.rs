//! The values flowing between backbone blocks, as EasyRec's: 2-D tensors,
//! 3-D `[batch, n, d]` tensors (kept as `[batch, n * d]`) or Python lists
//! of them, and the ways a layer reads them.

use anyhow::{bail, Context};

use crate::config::model::backbone::Expr;
use crate::model::graph::{Graph, NodeId};
use crate::model::layout::GroupLayout;

/// A value between blocks.
#[derive(Debug, Clone)]
pub(super) enum Val {
    /// `[batch, width]`.
    T(NodeId),
    /// `[batch, n, d]`, stored row-major as `[batch, n * d]`.
    S { x: NodeId, n: usize, d: usize },
    /// A Python list (or tuple) of values.
    L(Vec<Val>),
}

impl Val {
    pub(super) fn describe(&self, g: &Graph) -> String {
        match self {
            Val::T(x) => format!("a [batch, {}] tensor", g.width(*x)),
            Val::S { n, d, .. } => format!("a [batch, {n}, {d}] tensor"),
            Val::L(v) => format!("a list of {}", v.len()),
        }
    }
}

/// What a sequence layer reads from an `output_seq_and_normal_feature`
/// input layer.
pub(super) struct SeqIn {
    /// `[batch, n * d]`, positions side by side.
    pub(super) x: NodeId,
    pub(super) n: usize,
    pub(super) d: usize,
    pub(super) len: NodeId,
    /// The group's other features, when it has any.
    pub(super) target: Option<NodeId>,
}

/// The `(sequence, length, targets)` a sequence layer reads: its sequence
/// cut or zero-padded to `pad` positions when given (the length as it is:
/// only the text CNN pads, and it reads no length).
pub(super) fn seq_of(v: &Val, pad: Option<usize>, g: &mut Graph) -> anyhow::Result<SeqIn> {
    let Val::L(items) = v else {
        bail!(
            "takes (sequence, length, ...) from an output_seq_and_normal_feature input layer, got {}",
            v.describe(g)
        );
    };
    let (Some(Val::S { x, n, d }), Some(Val::T(len))) = (items.first(), items.get(1)) else {
        bail!("takes (sequence, length, ...) from an output_seq_and_normal_feature input layer");
    };
    let target = match items.get(2) {
        Some(Val::T(t)) => Some(*t),
        _ => None,
    };
    let (mut x, mut n, d, len) = (*x, *n, *d, *len);
    if let Some(p) = pad {
        if p < n {
            x = g.slice(x, 0, p * d);
        } else if p > n {
            let zeros = g.zeros(x, (p - n) * d);
            x = g.concat(&[x, zeros]);
        }
        n = p;
    }
    Ok(SeqIn { x, n, d, len, target })
}

/// EasyRec's `merge_inputs`: one input as it is, lists joined into one list,
/// tensors concatenated.
pub(super) fn merge(inputs: Vec<Val>, axis: i32, g: &mut Graph) -> anyhow::Result<Val> {
    if inputs.len() == 1 {
        return Ok(inputs.into_iter().next().expect("one input"));
    }
    if inputs.is_empty() {
        bail!("no inputs to merge");
    }
    if inputs.iter().any(|v| matches!(v, Val::L(_))) {
        let mut all = Vec::new();
        for v in inputs {
            match v {
                Val::L(items) => all.extend(items),
                other => all.push(other),
            }
        }
        return Ok(Val::L(all));
    }
    match axis {
        -1 => concat_list(&inputs, g),
        1 => {
            // Fields of 3-D tensors side by side, each of one dimension.
            let parts: Option<Vec<(NodeId, usize, usize)>> = inputs
                .iter()
                .map(|v| match v {
                    Val::S { x, n, d } => Some((*x, *n, *d)),
                    _ => None,
                })
                .collect();
            let Some(parts) = parts else {
                bail!("input_concat_axis 1 over these inputs is not supported");
            };
            let d = parts[0].2;
            if let Some((_, n, dk)) = parts.iter().find(|p| p.2 != d) {
                bail!("cannot concatenate a [batch, {n}, {dk}] tensor on axis 1 with dimension {d}");
            }
            let nodes: Vec<NodeId> = parts.iter().map(|p| p.0).collect();
            Ok(Val::S {
                x: g.concat(&nodes),
                n: parts.iter().map(|p| p.1).sum(),
                d,
            })
        }
        other => bail!("input_concat_axis {other} over these inputs is not supported"),
    }
}

/// Concatenation on the last axis of 2-D tensors.
pub(super) fn concat_list(items: &[Val], g: &mut Graph) -> anyhow::Result<Val> {
    let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Val::T(g.concat(&nodes)))
}

/// A 2-D tensor, or what a layer taking one got instead.
pub(super) fn tensor(v: &Val, g: &Graph) -> anyhow::Result<NodeId> {
    match v {
        Val::T(x) => Ok(*x),
        other => bail!("takes a 2-D tensor, got {}", other.describe(g)),
    }
}

/// `tf.stack(list, axis=1)` of equally wide 2-D tensors, as `(node, n, d)`.
pub(super) fn stack(items: &[Val], g: &mut Graph) -> anyhow::Result<(NodeId, usize, usize)> {
    let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
    let Some(&first) = nodes.first() else {
        bail!("nothing to stack");
    };
    let d = g.width(first);
    if let Some(x) = nodes.iter().find(|x| g.width(**x) != d) {
        bail!(
            "cannot stack tensors of widths {d} and {}: every embedding_dim must be equal",
            g.width(*x)
        );
    }
    Ok((g.concat(&nodes), nodes.len(), d))
}

/// The stacked value of `stack`'s output.
pub(super) fn stacked((x, n, d): (NodeId, usize, usize)) -> Val {
    Val::S { x, n, d }
}

/// A 3-D value as `(node, n, d)`: stacked, or a list stacked.
pub(super) fn fields(v: &Val, g: &mut Graph) -> anyhow::Result<(NodeId, usize, usize)> {
    match v {
        Val::S { x, n, d } => Ok((*x, *n, *d)),
        Val::L(items) => stack(items, g),
        other => bail!("takes a list of 2-D tensors or a 3-D tensor, got {}", other.describe(g)),
    }
}

/// `output_seq_and_normal_feature` over group `l`'s input matrix `x`:
/// `(sequences, length, targets)`, the sequences side by side per position
/// `[batch, len, Σ dim]`, the first one's length, the group's other
/// features concatenated (without any: the pair alone).
pub(super) fn seq_input(l: &GroupLayout, x: NodeId, g: &mut Graph) -> anyhow::Result<Val> {
    let Some(sl) = l.seq.iter().find(|sl| sl.att.input_only) else {
        bail!("group `{}` has no unpooled sequences", l.name);
    };
    let n = sl.len;
    let rows = super::super::sequence::hist_rows(sl, x, g);
    let d = g.width(rows);
    let seq = Val::S {
        x: g.fold(rows, n),
        n,
        d,
    };
    let len = Val::T(g.slice(x, sl.len_col, 1));
    let mut out = vec![seq, len];
    if l.plain_width > 0 {
        out.push(Val::T(g.slice(x, 0, l.plain_width)));
    }
    Ok(Val::L(out))
}

pub(super) fn apply(e: Expr, v: Val, g: &mut Graph) -> anyhow::Result<Val> {
    Ok(match (e, v) {
        (Expr::Index(i), Val::L(items)) => {
            let n = items.len();
            items
                .into_iter()
                .nth(i)
                .with_context(|| format!("index {i} of a list of {n}"))?
        }
        (Expr::Repeat(n), v) => Val::L(vec![v; n]),
        (Expr::AddN, Val::L(items)) => {
            let nodes = items.iter().map(|v| tensor(v, g)).collect::<anyhow::Result<Vec<_>>>()?;
            let w = g.width(nodes[0]);
            if nodes.iter().any(|x| g.width(*x) != w) {
                bail!("tf.add_n of tensors of unequal widths");
            }
            Val::T(g.add(&nodes))
        }
        (Expr::ReduceSum, Val::T(x)) => Val::T(g.row_sum(x)),
        (Expr::ReduceSum, Val::S { x, n, d }) => Val::S {
            x: g.sum_blocks(x, n),
            n: 1,
            d,
        },
        (Expr::Concat, Val::L(items)) => concat_list(&items, g)?,
        (Expr::Stack, Val::L(items)) => stacked(stack(&items, g)?),
        (Expr::Unstack { n, d }, Val::T(x)) => {
            if g.width(x) != n * d {
                bail!("cannot reshape [batch, {}] to [-1, {n}, {d}]", g.width(x));
            }
            Val::L((0..n).map(|i| Val::T(g.slice(x, i * d, d))).collect())
        }
        (e, v) => bail!("{e:?} cannot take {}", v.describe(g)),
    })
}
