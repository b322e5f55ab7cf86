//! The model graph: layer-level ops over the `ParamStore`, emitted once per
//! architecture by its builder (`model::builders`) and run by several
//! executors (`model::exec`): the CPU training executor, burn's graph as the
//! reference and the ONNX emitter.
//!
//! Every value is a row-major `[batch * rows, width]` matrix; a node knows
//! its width and its `rows` per batch row (1 but inside sequence ops, which
//! give each position of a sequence a row of its own: `Unfold`, `Tile`,
//! and `Fold` back), the batch comes with the inputs. Nodes are in topological order
//! (each is pushed after its operands), which is also the order executors
//! run them in, so dropout draws its masks and batch norm reports its
//! statistics in the same order everywhere.

pub mod augment;
pub mod capsule;
pub mod nary;
pub mod params;
pub mod scope;

use crate::config::model::Activation;
use params::ParamStore;
pub use scope::{Kernel, Scope};

/// A node of a `Graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A feature group's input matrix (`model::GroupLayout`).
    Input {
        group: usize,
    },
    /// `act(x · W + b)`, `W` being `[width(x), width]`.
    Linear {
        x: NodeId,
        w: usize,
        b: Option<usize>,
        act: Activation,
    },
    /// TensorFlow's batch normalization then `act`: batch statistics in
    /// training, the moving averages (`mean`, `var` in the buffer store)
    /// otherwise. `examples_only`: the statistics are over the batch's
    /// examples, not the sampled items after them (a match model's user
    /// tower, which EasyRec runs on the examples alone). `fixed`: the
    /// moving averages in every mode, never updated (EasyRec's layers built
    /// with `is_training=False`: MMoE's experts).
    BatchNorm {
        x: NodeId,
        gamma: usize,
        beta: usize,
        mean: usize,
        var: usize,
        act: Activation,
        examples_only: bool,
        fixed: bool,
    },
    Act {
        x: NodeId,
        act: Activation,
    },
    /// Inverted dropout in training, the identity otherwise.
    Dropout {
        x: NodeId,
        rate: f32,
    },
    /// Columns side by side.
    Concat(Vec<NodeId>),
    /// Columns `[start, start + width)`.
    Slice {
        x: NodeId,
        start: usize,
    },
    /// Element-wise sum of operands of one width.
    Add(Vec<NodeId>),
    /// Element-wise product.
    Mul(NodeId, NodeId),
    /// `[b, n * d] -> [b, d]`: the sum of the `n` column blocks.
    SumBlocks {
        x: NodeId,
        n: usize,
    },
    /// `[b, n * d] -> [b, d]`: the largest of the `n` column blocks, column
    /// by column (Keras' global max pooling over `n` steps). The gradient
    /// is shared equally by the blocks holding the maximum, as
    /// TensorFlow's `reduce_max` gradient is.
    MaxBlocks {
        x: NodeId,
        n: usize,
    },
    /// Factorization machine's pairwise term over the `n` blocks `v_k` of
    /// `[b, n * d]`: `0.5 * ((Σ v_k)² - Σ v_k²)`, `[b, d]`.
    Fm {
        x: NodeId,
        n: usize,
    },
    /// `[b, d] -> [b, 1]`.
    RowSum {
        x: NodeId,
    },
    /// Dot products of vectors of width `dim`, the columns of `xs` side by
    /// side cut into vectors; one output column per `(i, j)` pair.
    Dot {
        xs: Vec<NodeId>,
        dim: usize,
        pairs: Vec<(usize, usize)>,
    },
    /// DCN's cross layer: `x0 * (xl · w) + b + xl`, `w` being `[d, 1]`.
    Cross {
        x0: NodeId,
        xl: NodeId,
        w: usize,
        b: usize,
    },
    /// ESMM's `logit(σ(a)·σ(b))` of two one-column logits, computed
    /// stably as `−log(e^−a + e^−b + e^−(a+b))`.
    ProductLogit {
        a: NodeId,
        b: NodeId,
    },
    /// Softmax over the columns of each row.
    Softmax {
        x: NodeId,
    },
    /// `Σ_k gate[:, k] * xs[k]`: a gate's mixture of equally wide values.
    WeightedSum {
        gate: NodeId,
        xs: Vec<NodeId>,
    },
    /// Zeros, as many rows as `like`.
    Zeros {
        like: NodeId,
    },
    /// `x + b`, `b` being a parameter of `width(x)` values added to every row.
    Bias {
        x: NodeId,
        b: usize,
    },
    /// Layer normalization over each row's columns:
    /// `(x - mean) / sqrt(var + eps) * gamma + beta` (Keras' `eps` is
    /// `LN_EPS`).
    LayerNorm {
        x: NodeId,
        gamma: usize,
        beta: usize,
        eps: f32,
    },
    /// Each row read as an `[n, width / n]` matrix and transposed:
    /// `[r, n * m] -> [r, m * n]`.
    Transpose {
        x: NodeId,
        n: usize,
    },
    /// Each row's outer product `a_i * b_j` at column `i * width(b) + j`.
    Outer {
        a: NodeId,
        b: NodeId,
    },
    /// `n` dense layers side by side: `x`'s `n` column blocks of `din`,
    /// block `k` times rows `k * din..(k + 1) * din` of `w` (`[n * din,
    /// dout]`), plus block `k` of `b` (`[1, n * dout]`) when given
    /// (EasyRec's `NLinear`, one layer per feature).
    GroupedLinear {
        x: NodeId,
        w: usize,
        b: Option<usize>,
        n: usize,
    },
    /// EasyRec's NaryDisEmbedding lookup of `x`'s `n` raw values
    /// (`nary::Nary`): per value and base, the pooled columns `cols.0 ..
    /// cols.0 + cols.1` of its digits' rows of table `table` (a parameter
    /// of `n * nary.vocab()` rows); `[r, n] -> [r, n * bases * cols.1]`,
    /// value-major. Nothing flows back to `x` (EasyRec casts it to
    /// integers).
    NaryEmbed {
        x: NodeId,
        table: usize,
        nary: nary::Nary,
        cols: (usize, usize),
    },
    /// `[r, n * e] -> [r, n * 2e]`: per column block its sines, then its
    /// cosines.
    SinCos {
        x: NodeId,
        n: usize,
    },
    /// DIN's Dice (EasyRec's `dice`): `p = sigmoid((x - mean) / sqrt(var +
    /// DICE_EPS))`, column by column, with the batch's statistics in
    /// training and the moving averages `mean`, `var` (buffers) otherwise;
    /// `x * (p + alpha * (1 - p))`, `alpha` a parameter of one value per
    /// column.
    Dice {
        x: NodeId,
        alpha: usize,
        mean: usize,
        var: usize,
    },
    /// `x + by`, a constant.
    Shift {
        x: NodeId,
        by: f32,
    },
    /// `a - b`.
    Sub(NodeId, NodeId),
    /// `x` as a constant: nothing flows back through it (TensorFlow's
    /// `stop_gradient`).
    StopGradient {
        x: NodeId,
    },
    /// `[r, d] -> [r * n, d]`: each row `n` times in a row.
    Tile {
        x: NodeId,
        n: usize,
    },
    /// `[r, n * d] -> [r * n, d]`: each row's `n` column blocks as rows of
    /// their own (the same values, row-major).
    Unfold {
        x: NodeId,
        n: usize,
    },
    /// `[r * n, d] -> [r, n * d]`: `Unfold`'s inverse.
    Fold {
        x: NodeId,
        n: usize,
    },
    /// Softmax over the first `len[r]` columns of each row (`len` is
    /// `[r, 1]`, a count), zeros after them; a row of length 0 is zeros.
    MaskedSoftmax {
        x: NodeId,
        len: NodeId,
    },
    /// `[r, n]`, `[r, n * d] -> [r, d]`: `Σ_k w[:, k] * x_k`, `x_k` the
    /// `k`-th column block of `x` (attention pooling over a sequence).
    AttnPool {
        w: NodeId,
        x: NodeId,
    },
    /// Multi-head scaled dot-product attention of each batch row's `rows(q)`
    /// queries over its `rows(k)` keys (AutoInt's interacting layer, a
    /// transformer's self-attention, CMBF's cross attention): per head `h`,
    /// `softmax(q_h · k_hᵀ · scale) · v_h`, the heads' columns side by
    /// side. `q` and `k` are `[r, heads * dk]`, `v` `[rk, heads * dv]` (as
    /// many rows as `k`) and the output `[r, heads * dv]`; `keys` masks
    /// the keys.
    Attention {
        q: NodeId,
        k: NodeId,
        v: NodeId,
        heads: usize,
        scale: f32,
        keys: Keys,
    },
    /// `[r, 1] -> [r, n]`: 1 in the columns `j < len`, 0 after them (a
    /// sequence's padding mask from its length); constant.
    PrefixMask {
        len: NodeId,
        n: usize,
    },
    /// `[r, 1] -> [r, 1]`: MIND's interest count of each row from its
    /// sequence length `len` (a count, at most `positions` live), as
    /// EasyRec's capsule layer: `max_k` with `constant`, else
    /// `max(1, min(max_k, ⌊ln len⌋))` (1 for an empty sequence); constant.
    Capsules {
        len: NodeId,
        count: capsule::Count,
    },
    /// MIND's dynamic routing (EasyRec's `CapsuleLayer`) of each batch
    /// row's `rows(x)` positions `x` (`[r * n, e]`) into `max_k` capsules:
    /// the routing weights after the last iteration's softmax, `[r, max_k *
    /// n]` capsule by capsule. Positions from `len` on and capsules from
    /// `caps` on weigh 0. Every iteration runs on `x` cut from the
    /// gradient, as EasyRec's, so the weights are a constant. The first
    /// logits are `init` (`[n, max_k]`) in inference and truncated normal
    /// draws of spread `stddev` in training; each iteration after the
    /// first scores position `s` against capsule `k` as `scale ·
    /// norm(x_s) · norm(c_k)` (`x_s · norm(c_k)` when `scale` is 0).
    CapsuleRouting {
        x: NodeId,
        len: NodeId,
        caps: NodeId,
        routing: Routing,
    },
    /// MIND's interest similarity of each row (EasyRec's
    /// `_build_interest_simi`): `x` holds the row's `max_k` interests side
    /// by side (normalised, those past `caps` zeroed); with `S` their sum,
    /// `s = (|S|² − Σ |x_k|²) / max(c (c − 1), 1)`, the mean cosine of two
    /// of them. `[r, 2]`: `(s + 1) / 2` and 1 for a row of more than one
    /// interest, else 0 and 0 (the second column a constant).
    InterestSimilarity {
        x: NodeId,
        caps: NodeId,
        max_k: usize,
    },
    /// Each row squashed, EasyRec's capsule `squash`: `x · (n / (1 +
    /// n))^pow · ratio / √n` with `n = max(Σ x², SQUASH_EPS)`.
    Squash {
        x: NodeId,
        pow: f32,
        ratio: f32,
    },
    /// Each row divided by its L2 norm, TensorFlow's `l2_normalize`:
    /// `x / sqrt(max(Σ x², L2_EPS))`.
    L2Normalize {
        x: NodeId,
    },
    /// `x * factor`, times `|w|` when `w` (a one-value parameter) is given.
    Scale {
        x: NodeId,
        factor: f32,
        w: Option<usize>,
    },
    /// EasyRec's variational dropout of a group's features: column `c` is
    /// scaled by a keep value of entry `index[c]` of the logits `p` (a
    /// `[1, n]` parameter, `sigmoid(p)` the dropout rates). In training the
    /// keep value is the concrete relaxation of a Bernoulli draw,
    /// `1 - sigmoid((logit(rate) + logit(u)) / VD_TEMP)` with `u` uniform
    /// per row and entry; otherwise it is `1 - rate`.
    VariationalDropout {
        x: NodeId,
        p: usize,
        index: Vec<usize>,
    },
    /// CL4SRec's sequence augmentation (EasyRec's `SeqAugment`) of `x`
    /// (`[r, n * d]`, positions side by side) of lengths `len` (`[r, 1]`):
    /// in training each row is cropped, masked (positions replaced by the
    /// parameter `mask`, `[1, d]`) or reordered as `augment::Augment::plan`
    /// draws; otherwise it stays as it is. `[r, n * d + 1]`: the sequence,
    /// then its new length (a constant).
    SeqAugment {
        x: NodeId,
        len: NodeId,
        mask: usize,
        n: usize,
        aug: augment::Augment,
    },
    /// A contrastive loss between rows `a` and `b` (`[r, d]` each) over the
    /// batch's examples (EasyRec's `contrastive_loss`): `[r, 1]`, each
    /// example row's share, so that their mean is the loss (rows past the
    /// examples 0).
    Contrastive {
        a: NodeId,
        b: NodeId,
        kind: Contrast,
    },
}

/// Which contrastive loss an `Op::Contrastive` computes, of temperature
/// `t`. With `z` the rows of `a` then those of `b` (`2E` rows for `E`
/// examples), `Nce` is the cross entropy of each `z_i` picking its pair
/// (`a_i` with `b_i`) among all other rows by `z_i · z_k / t` (CL4SRec's
/// `nce_loss`), a row's share `(l_i + l_{i+E}) / 2`; `InfoNce` that of
/// `a_i` picking `b_i` among all `b_k` by `a_i · b_k / t` (`info_nce_loss`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Contrast {
    Nce { t: f32 },
    InfoNce { t: f32 },
}

/// The settings of an `Op::CapsuleRouting`.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub max_k: usize,
    pub iters: usize,
    pub scale: f32,
    pub stddev: f32,
    /// The inference logits, `[positions, max_k]`.
    pub init: Vec<f32>,
}

/// Which keys an `Op::Attention` attends to, per batch row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keys {
    All,
    /// `[batch, 1]`, a count: key `j` only where `j < len`; a row with no
    /// key left gets zeros.
    Live(NodeId),
    /// `[batch, rows(k)]` of 1 (attended) and 0 (masked), applied as
    /// EasyRec's BERT attention does: `(1 - m) * MASK_ADDER` added to the
    /// scores (so a row with every key masked attends to all equally).
    Mask(NodeId),
}

impl Keys {
    pub fn node(self) -> Option<NodeId> {
        match self {
            Keys::All => None,
            Keys::Live(x) | Keys::Mask(x) => Some(x),
        }
    }
}

/// What `Keys::Mask` adds to a masked key's score (EasyRec's `-10000.0`).
pub const MASK_ADDER: f32 = -10000.0;

/// The temperature of `Op::VariationalDropout`'s concrete relaxation.
pub const VD_TEMP: f32 = 0.1;
/// What `Op::VariationalDropout` adds inside its logarithms (NumPy's
/// double epsilon, as EasyRec).
pub const VD_EPS: f32 = f64::EPSILON as f32;

/// The floor of the squared norm `Op::L2Normalize` divides by (TensorFlow's
/// `l2_normalize` epsilon).
pub const L2_EPS: f32 = 1e-12;

/// The floor of the squared norm `Op::Squash` reads (EasyRec's).
pub const SQUASH_EPS: f32 = 1e-8;

impl Op {
    /// The nodes this op reads.
    pub fn operands(&self) -> Vec<NodeId> {
        match self {
            Op::Input { .. } => Vec::new(),
            Op::Linear { x, .. }
            | Op::BatchNorm { x, .. }
            | Op::Act { x, .. }
            | Op::Dropout { x, .. }
            | Op::Slice { x, .. }
            | Op::SumBlocks { x, .. }
            | Op::MaxBlocks { x, .. }
            | Op::Fm { x, .. }
            | Op::RowSum { x }
            | Op::Bias { x, .. }
            | Op::LayerNorm { x, .. }
            | Op::Tile { x, .. }
            | Op::Unfold { x, .. }
            | Op::Fold { x, .. }
            | Op::L2Normalize { x }
            | Op::Scale { x, .. }
            | Op::Shift { x, .. }
            | Op::Transpose { x, .. }
            | Op::GroupedLinear { x, .. }
            | Op::SinCos { x, .. }
            | Op::NaryEmbed { x, .. }
            | Op::Dice { x, .. }
            | Op::VariationalDropout { x, .. }
            | Op::StopGradient { x }
            | Op::Squash { x, .. }
            | Op::Softmax { x } => vec![*x],
            Op::Capsules { len, .. } => vec![*len],
            Op::SeqAugment { x, len, .. } => vec![*x, *len],
            Op::Contrastive { a, b, .. } => vec![*a, *b],
            Op::CapsuleRouting { x, len, caps, .. } => vec![*x, *len, *caps],
            Op::InterestSimilarity { x, caps, .. } => vec![*x, *caps],
            Op::Sub(a, b) | Op::ProductLogit { a, b } | Op::Outer { a, b } => vec![*a, *b],
            Op::MaskedSoftmax { x, len } => vec![*x, *len],
            Op::AttnPool { w, x } => vec![*w, *x],
            Op::Attention { q, k, v, keys, .. } => [*q, *k, *v].into_iter().chain(keys.node()).collect(),
            Op::PrefixMask { len, .. } => vec![*len],
            Op::Concat(xs) | Op::Add(xs) | Op::Dot { xs, .. } => xs.clone(),
            Op::Mul(a, b) => vec![*a, *b],
            Op::Cross { x0, xl, .. } => vec![*x0, *xl],
            Op::WeightedSum { gate, xs } => std::iter::once(*gate).chain(xs.iter().copied()).collect(),
            Op::Zeros { .. } => Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub width: usize,
    /// Rows per batch row: the value is `[batch * rows, width]`.
    pub rows: usize,
}

/// A model's computation from its group inputs to its named outputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    pub nodes: Vec<Node>,
    /// Named outputs, e.g. `("logits", n)`, `[batch, width]`.
    pub outputs: Vec<(String, NodeId)>,
    /// Losses of the architecture itself, beside its tasks' (a teacher's
    /// hint to its student), trained and never exported.
    pub penalties: Vec<Penalty>,
    /// Values evaluation reports beside the tasks' metrics, never trained.
    pub summaries: Vec<Summary>,
}

/// A loss the graph computes: one value per row, reduced over the batch's
/// examples (sampled items' rows left out) and weighted.
#[derive(Debug, Clone, PartialEq)]
pub struct Penalty {
    /// EasyRec's name of the loss (`hint_loss`).
    pub name: String,
    /// `[batch, 1]`.
    pub node: NodeId,
    pub reduce: Reduce,
    pub weight: f32,
}

/// A value of the graph that evaluation reports by name (MIND's
/// `interest_similarity`): per batch `share` of its examples' rows
/// `(value, count)`, averaged over the batches (TensorFlow's streaming
/// mean of a batch value).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub name: String,
    /// `[batch, 2]`.
    pub node: NodeId,
}

/// `Σ value / max(Σ count, 1)` over rows `(value, count)` side by side.
pub fn share(v: &[f32]) -> f32 {
    let (s, c) = v
        .chunks_exact(2)
        .fold((0.0f32, 0.0f32), |(s, c), r| (s + r[0], c + r[1]));
    s / c.max(1.0)
}

/// How a penalty's per-row values become one loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reduce {
    /// The mean over the rows; with sample weights their weighted sum over
    /// the count of non-zero weights, as TensorFlow's losses weigh.
    Mean,
    /// The square root of the sum over the rows (a distance over the whole
    /// batch, unweighted).
    RootOfSum,
    /// The mean over the rows, sample weights or not (EasyRec's auxiliary
    /// losses weigh every example alike).
    UnweightedMean,
    /// Over rows of two columns `(value, count)`: `relu(Σ value / max(Σ
    /// count, 1) − max)`, unweighted (MIND's `reg_interest_simi`, the mean
    /// similarity of the rows that count above `max`); the counts are
    /// constants.
    ReluOfShare { max: f32 },
}

impl Reduce {
    /// The loss of per-row values `v` and its gradient with respect to each.
    pub fn apply(self, v: &[f32], weights: Option<&[f32]>) -> (f32, Vec<f32>) {
        match (self, weights) {
            (Reduce::Mean, None) | (Reduce::UnweightedMean, _) => {
                let n = v.len().max(1) as f32;
                (v.iter().sum::<f32>() / n, vec![1.0 / n; v.len()])
            }
            (Reduce::Mean, Some(w)) => {
                let n = w.iter().filter(|x| **x != 0.0).count();
                if n == 0 {
                    return (0.0, vec![0.0; v.len()]);
                }
                let s: f32 = v.iter().zip(w).map(|(a, b)| a * b).sum();
                (s / n as f32, w.iter().map(|x| x / n as f32).collect())
            }
            (Reduce::RootOfSum, _) => {
                let r = v.iter().sum::<f32>().sqrt();
                (r, vec![0.5 / r; v.len()])
            }
            (Reduce::ReluOfShare { max }, _) => {
                let over = share(v) - max;
                let mut g = vec![0.0f32; v.len()];
                if over <= 0.0 {
                    return (0.0, g);
                }
                let count: f32 = v.iter().skip(1).step_by(2).sum();
                g.iter_mut().step_by(2).for_each(|x| *x = 1.0 / count.max(1.0));
                (over, g)
            }
        }
    }
}

#[cfg(test)]
mod reduce_tests {
    use super::Reduce;

    #[test]
    fn relu_of_share_is_the_counted_rows_mean_above_its_bound() {
        let r = Reduce::ReluOfShare { max: 0.5 };
        // Rows (value, count): two counted rows of mean 0.8.
        let v = [0.9f32, 1.0, 0.0, 0.0, 0.7, 1.0];
        let (l, g) = r.apply(&v, None);
        assert!((l - 0.3).abs() < 1e-6, "{l}");
        assert_eq!(g, vec![0.5, 0.0, 0.5, 0.0, 0.5, 0.0]);
        let (l, g) = r.apply(&[0.2, 1.0, 0.1, 1.0], None);
        assert_eq!((l, g), (0.0, vec![0.0; 4]));
    }
}

impl Graph {
    pub fn width(&self, n: NodeId) -> usize {
        self.nodes[n.0].width
    }

    /// Rows per batch row of node `n`'s value.
    pub fn rows(&self, n: NodeId) -> usize {
        self.nodes[n.0].rows
    }

    fn push(&mut self, op: Op, width: usize) -> NodeId {
        let rows = match &op {
            Op::Input { .. } => 1,
            Op::Zeros { like } => self.rows(*like),
            Op::Tile { x, n } | Op::Unfold { x, n } => self.rows(*x) * n,
            Op::Attention { q, k, v, keys, .. } => {
                assert!(
                    self.rows(*v) == self.rows(*k) && keys.node().is_none_or(|l| self.rows(l) == 1),
                    "attention over as many values as keys per batch row, one mask per batch row"
                );
                self.rows(*q)
            }
            // Per batch row: the routing weights of its positions.
            Op::CapsuleRouting { x, len, caps, routing } => {
                assert!(
                    self.rows(*len) == 1 && self.rows(*caps) == 1 && self.width(*caps) == 1,
                    "routing by one length and one capsule count per batch row"
                );
                assert_eq!(
                    width,
                    routing.max_k * self.rows(*x),
                    "routing weights per capsule and position"
                );
                1
            }
            Op::Fold { x, n } => {
                assert!(
                    self.rows(*x).is_multiple_of(*n),
                    "fold of {} rows by {n}",
                    self.rows(*x)
                );
                self.rows(*x) / n
            }
            op => {
                let xs = op.operands();
                let r = self.rows(xs[0]);
                assert!(
                    xs.iter().all(|x| self.rows(*x) == r),
                    "operands of {op:?} differ in rows"
                );
                r
            }
        };
        self.nodes.push(Node { op, width, rows });
        NodeId(self.nodes.len() - 1)
    }

    pub fn input(&mut self, group: usize, width: usize) -> NodeId {
        self.push(Op::Input { group }, width)
    }

    pub fn linear(&mut self, x: NodeId, p: &ParamStore, w: usize, b: Option<usize>, act: Activation) -> NodeId {
        let spec = &p.specs[w];
        assert_eq!(spec.rows, self.width(x), "kernel `{}` rows", spec.name);
        self.push(Op::Linear { x, w, b, act }, spec.cols)
    }

    pub fn act(&mut self, x: NodeId, act: Activation) -> NodeId {
        if act == Activation::Linear {
            return x;
        }
        let w = self.width(x);
        self.push(Op::Act { x, act }, w)
    }

    pub fn dropout(&mut self, x: NodeId, rate: f32) -> NodeId {
        if rate <= 0.0 {
            return x;
        }
        let w = self.width(x);
        self.push(Op::Dropout { x, rate }, w)
    }

    pub fn concat(&mut self, xs: &[NodeId]) -> NodeId {
        if let [x] = xs {
            return *x;
        }
        let w = xs.iter().map(|x| self.width(*x)).sum();
        self.push(Op::Concat(xs.to_vec()), w)
    }

    pub fn slice(&mut self, x: NodeId, start: usize, width: usize) -> NodeId {
        assert!(start + width <= self.width(x), "slice past the end");
        if start == 0 && width == self.width(x) {
            return x;
        }
        self.push(Op::Slice { x, start }, width)
    }

    pub fn add(&mut self, xs: &[NodeId]) -> NodeId {
        if let [x] = xs {
            return *x;
        }
        let w = self.width(xs[0]);
        assert!(xs.iter().all(|x| self.width(*x) == w), "add of unequal widths");
        self.push(Op::Add(xs.to_vec()), w)
    }

    pub fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let w = self.width(a);
        assert_eq!(w, self.width(b), "mul of unequal widths");
        self.push(Op::Mul(a, b), w)
    }

    pub fn sum_blocks(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "sum over blocks");
        self.push(Op::SumBlocks { x, n }, w / n)
    }

    pub fn max_blocks(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "max over blocks");
        self.push(Op::MaxBlocks { x, n }, w / n)
    }

    pub fn fm(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "FM over blocks");
        self.push(Op::Fm { x, n }, w / n)
    }

    pub fn bias(&mut self, x: NodeId, b: usize) -> NodeId {
        let w = self.width(x);
        self.push(Op::Bias { x, b }, w)
    }

    pub fn row_sum(&mut self, x: NodeId) -> NodeId {
        self.push(Op::RowSum { x }, 1)
    }

    pub fn dot(&mut self, xs: &[NodeId], dim: usize, pairs: Vec<(usize, usize)>) -> NodeId {
        let total: usize = xs.iter().map(|x| self.width(*x)).sum();
        assert!(
            dim > 0 && xs.iter().all(|x| self.width(*x).is_multiple_of(dim)),
            "dot vectors"
        );
        let n = total / dim;
        assert!(pairs.iter().all(|&(i, j)| i < n && j < n), "dot pairs");
        let w = pairs.len();
        self.push(
            Op::Dot {
                xs: xs.to_vec(),
                dim,
                pairs,
            },
            w,
        )
    }

    pub fn cross(&mut self, x0: NodeId, xl: NodeId, w: usize, b: usize) -> NodeId {
        let d = self.width(x0);
        assert_eq!(d, self.width(xl), "cross widths");
        self.push(Op::Cross { x0, xl, w, b }, d)
    }

    pub fn softmax(&mut self, x: NodeId) -> NodeId {
        let w = self.width(x);
        self.push(Op::Softmax { x }, w)
    }

    pub fn weighted_sum(&mut self, gate: NodeId, xs: &[NodeId]) -> NodeId {
        assert_eq!(self.width(gate), xs.len(), "one gate column per value");
        let w = self.width(xs[0]);
        assert!(xs.iter().all(|x| self.width(*x) == w), "weighted sum of unequal widths");
        self.push(Op::WeightedSum { gate, xs: xs.to_vec() }, w)
    }

    pub fn zeros(&mut self, like: NodeId, width: usize) -> NodeId {
        self.push(Op::Zeros { like }, width)
    }

    /// Ones, `width` columns and as many rows as `like` (a constant mask).
    pub fn ones(&mut self, like: NodeId, width: usize) -> NodeId {
        let zeros = self.zeros(like, width);
        self.shift(zeros, 1.0)
    }

    pub fn sub(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let w = self.width(a);
        assert_eq!(w, self.width(b), "sub of unequal widths");
        self.push(Op::Sub(a, b), w)
    }

    pub fn tile(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        self.push(Op::Tile { x, n }, w)
    }

    pub fn unfold(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "unfold of width {w} into {n} blocks");
        self.push(Op::Unfold { x, n }, w / n)
    }

    pub fn fold(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        self.push(Op::Fold { x, n }, w * n)
    }

    pub fn masked_softmax(&mut self, x: NodeId, len: NodeId) -> NodeId {
        assert_eq!(self.width(len), 1, "a length column");
        let w = self.width(x);
        self.push(Op::MaskedSoftmax { x, len }, w)
    }

    pub fn attn_pool(&mut self, w: NodeId, x: NodeId) -> NodeId {
        let n = self.width(w);
        let total = self.width(x);
        assert!(
            n > 0 && total.is_multiple_of(n),
            "attention over {n} blocks of width {total}"
        );
        self.push(Op::AttnPool { w, x }, total / n)
    }

    /// `Op::Attention` of `heads` heads of each batch row's queries over its
    /// keys.
    pub fn attention(
        &mut self,
        (q, k, v): (NodeId, NodeId, NodeId),
        (heads, scale): (usize, f32),
        keys: Keys,
    ) -> NodeId {
        let (wq, wv) = (self.width(q), self.width(v));
        assert!(
            heads > 0 && wq == self.width(k) && wq.is_multiple_of(heads) && wv.is_multiple_of(heads),
            "attention of {heads} heads over queries {wq}, keys {}, values {wv} wide",
            self.width(k)
        );
        match keys {
            Keys::All => {}
            Keys::Live(l) => assert_eq!(self.width(l), 1, "a length column"),
            Keys::Mask(m) => assert_eq!(self.width(m), self.rows(k), "a mask column per key"),
        }
        self.push(
            Op::Attention {
                q,
                k,
                v,
                heads,
                scale,
                keys,
            },
            wv,
        )
    }

    /// `Op::PrefixMask` of `n` columns from the lengths `len`.
    pub fn prefix_mask(&mut self, len: NodeId, n: usize) -> NodeId {
        assert_eq!(self.width(len), 1, "a length column");
        self.push(Op::PrefixMask { len, n }, n)
    }

    /// `Op::Capsules`: the interest count of each row from its sequence
    /// length `len`.
    pub fn capsules(&mut self, len: NodeId, count: capsule::Count) -> NodeId {
        assert_eq!(self.width(len), 1, "a length column");
        self.push(Op::Capsules { len, count }, 1)
    }

    /// `Op::CapsuleRouting` of the positions `x` (`rows(x)` per batch row)
    /// into `r.max_k` capsules, `caps` of them live per row.
    pub fn capsule_routing(&mut self, (x, len, caps): (NodeId, NodeId, NodeId), r: Routing) -> NodeId {
        let n = self.rows(x);
        assert_eq!(r.init.len(), n * r.max_k, "initial logits per position and capsule");
        assert!(r.iters > 0, "routing runs at least once");
        let width = r.max_k * n;
        self.push(
            Op::CapsuleRouting {
                x,
                len,
                caps,
                routing: r,
            },
            width,
        )
    }

    /// `Op::InterestSimilarity` of the interests `x` (`caps` of them live
    /// per row, `max_k` side by side).
    pub fn interest_similarity(&mut self, x: NodeId, caps: NodeId, max_k: usize) -> NodeId {
        assert_eq!((self.width(caps), self.rows(caps)), (1, 1), "one count per row");
        assert!(self.width(x).is_multiple_of(max_k), "{max_k} interests side by side");
        self.push(Op::InterestSimilarity { x, caps, max_k }, 2)
    }

    /// `Op::Squash` of each row.
    pub fn squash(&mut self, x: NodeId, pow: f32, ratio: f32) -> NodeId {
        let w = self.width(x);
        self.push(Op::Squash { x, pow, ratio }, w)
    }

    pub fn l2_normalize(&mut self, x: NodeId) -> NodeId {
        let w = self.width(x);
        self.push(Op::L2Normalize { x }, w)
    }

    /// `x * factor * |w|`, `w` a parameter of one value when given.
    pub fn scale(&mut self, x: NodeId, factor: f32, w: Option<usize>) -> NodeId {
        let width = self.width(x);
        self.push(Op::Scale { x, factor, w }, width)
    }

    /// `Op::GroupedLinear` of `n` blocks with kernel `w` and bias `b`.
    pub fn grouped_linear(&mut self, x: NodeId, p: &ParamStore, w: usize, b: Option<usize>, n: usize) -> NodeId {
        let spec = &p.specs[w];
        assert!(
            n > 0 && spec.rows == self.width(x) && spec.rows.is_multiple_of(n),
            "kernel `{}` of {} rows for {n} blocks of a [_, {}] input",
            spec.name,
            spec.rows,
            self.width(x)
        );
        let width = n * spec.cols;
        assert!(
            b.is_none_or(|b| p.specs[b].len() == width),
            "one bias per output column"
        );
        self.push(Op::GroupedLinear { x, w, b, n }, width)
    }

    /// `Op::NaryEmbed` of `x` in `nary`'s bases, columns `cols` of `table`.
    pub fn nary_embed(
        &mut self,
        x: NodeId,
        p: &ParamStore,
        table: usize,
        nary: nary::Nary,
        cols: (usize, usize),
    ) -> NodeId {
        let (n, spec) = (self.width(x), &p.specs[table]);
        assert!(
            spec.rows == n * nary.vocab() && cols.0 + cols.1 <= spec.cols && cols.1 > 0,
            "table `{}` of {}x{} for {n} values of {} rows, columns {cols:?}",
            spec.name,
            spec.rows,
            spec.cols,
            nary.vocab()
        );
        let width = n * nary.carries.len() * cols.1;
        self.push(Op::NaryEmbed { x, table, nary, cols }, width)
    }

    /// `Op::SinCos` of `n` blocks.
    pub fn sin_cos(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "sines and cosines of {n} blocks");
        self.push(Op::SinCos { x, n }, 2 * w)
    }

    /// `Op::Transpose` of each row as `n` rows.
    pub fn transpose(&mut self, x: NodeId, n: usize) -> NodeId {
        let w = self.width(x);
        assert!(n > 0 && w.is_multiple_of(n), "transpose of width {w} as {n} rows");
        self.push(Op::Transpose { x, n }, w)
    }

    /// `Op::Outer` of `a` and `b`.
    pub fn outer(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let w = self.width(a) * self.width(b);
        self.push(Op::Outer { a, b }, w)
    }

    /// `x + by`.
    pub fn shift(&mut self, x: NodeId, by: f32) -> NodeId {
        let w = self.width(x);
        self.push(Op::Shift { x, by }, w)
    }

    /// Variational dropout of `x`'s columns, column `c` by entry `index[c]`
    /// of the dropout logits `p` (`Op::VariationalDropout`).
    pub fn variational_dropout(&mut self, x: NodeId, params: &ParamStore, p: usize, index: Vec<usize>) -> NodeId {
        let w = self.width(x);
        assert_eq!(index.len(), w, "one dropout entry per column");
        let n = params.specs[p].len();
        assert!(
            index.iter().all(|&j| j < n),
            "dropout entries within `{}`",
            params.specs[p].name
        );
        self.push(Op::VariationalDropout { x, p, index }, w)
    }

    /// The nodes `n` reads, directly or not, and `n` itself.
    fn ancestors(&self, n: NodeId) -> Vec<bool> {
        let mut seen = vec![false; self.nodes.len()];
        let mut todo = vec![n];
        while let Some(m) = todo.pop() {
            if !std::mem::replace(&mut seen[m.0], true) {
                todo.extend(self.nodes[m.0].op.operands());
            }
        }
        seen
    }

    /// Makes the batch norms that `of` reads and `not_of` does not count
    /// only the batch's examples: a match model's user tower, whose sampled
    /// rows are no users.
    pub fn norm_examples_only(&mut self, of: NodeId, not_of: NodeId) {
        let (a, b) = (self.ancestors(of), self.ancestors(not_of));
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if let Op::BatchNorm { examples_only, .. } = &mut node.op {
                *examples_only = a[i] && !b[i];
            }
        }
    }

    /// `Op::ProductLogit` of the one-column logits `a` and `b`.
    pub fn product_logit(&mut self, a: NodeId, b: NodeId) -> NodeId {
        assert!(
            self.width(a) == 1 && self.width(b) == 1,
            "a product of two one-column logits"
        );
        self.push(Op::ProductLogit { a, b }, 1)
    }

    /// Names `x` an output: a task's logits (one column), or a value
    /// exported beside them (a match model's tower embeddings).
    pub fn output(&mut self, name: &str, x: NodeId) {
        assert_eq!(self.rows(x), 1, "output `{name}` has a row per batch row");
        self.outputs.push((name.to_string(), x));
    }

    /// Adds `node` (`[batch, 1]`, `[batch, 2]` for `Reduce::ReluOfShare`)
    /// to the loss as `penalty` says.
    pub fn penalty(&mut self, name: &str, node: NodeId, reduce: Reduce, weight: f32) {
        let width = if matches!(reduce, Reduce::ReluOfShare { .. }) {
            2
        } else {
            1
        };
        assert_eq!(
            (self.width(node), self.rows(node)),
            (width, 1),
            "penalty `{name}` is {width} values per batch row"
        );
        // A later loss of a name replaces the earlier, as in EasyRec's loss
        // dict (a package's auxiliary loss called twice).
        self.penalties.retain(|p| p.name != name);
        self.penalties.push(Penalty {
            name: name.to_string(),
            node,
            reduce,
            weight,
        });
    }

    /// Reports `node` (`[batch, 2]` rows `(value, count)`) in evaluation
    /// as `name` (`Summary`).
    pub fn summary(&mut self, name: &str, node: NodeId) {
        assert_eq!(
            (self.width(node), self.rows(node)),
            (2, 1),
            "summary `{name}` is (value, count) per batch row"
        );
        self.summaries.push(Summary {
            name: name.to_string(),
            node,
        });
    }

    /// `Op::SeqAugment` of `x` (`[r, n * d]`) of lengths `len` with mask
    /// embedding `mask` (a `[1, d]` parameter of `p`).
    pub fn seq_augment(
        &mut self,
        x: NodeId,
        len: NodeId,
        (p, mask): (&ParamStore, usize),
        aug: augment::Augment,
    ) -> NodeId {
        let d = p.specs[mask].len();
        let w = self.width(x);
        assert!(
            d > 0 && w.is_multiple_of(d) && self.width(len) == 1,
            "a sequence of {d}-wide positions and its length"
        );
        self.push(
            Op::SeqAugment {
                x,
                len,
                mask,
                n: w / d,
                aug,
            },
            w + 1,
        )
    }

    /// `Op::Contrastive` of `a` and `b`, one row each per batch row.
    pub fn contrastive(&mut self, a: NodeId, b: NodeId, kind: Contrast) -> NodeId {
        assert!(
            self.width(a) == self.width(b) && self.rows(a) == 1 && self.rows(b) == 1,
            "a contrastive loss of equally wide rows"
        );
        self.push(Op::Contrastive { a, b, kind }, 1)
    }

    /// `x` with no gradient flowing back into it.
    pub fn stop_gradient(&mut self, x: NodeId) -> NodeId {
        let w = self.width(x);
        self.push(Op::StopGradient { x }, w)
    }

    /// The node of output `name`.
    pub fn output_node(&self, name: &str) -> Option<NodeId> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, x)| *x)
    }

    /// Per node: whether its gradient is needed, i.e. whether it depends on
    /// a parameter or on an input marked in `trained_inputs` (by group).
    pub fn needs_grad(&self, trained_inputs: &[bool]) -> Vec<bool> {
        let mut needs = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            needs[i] = match &n.op {
                Op::Input { group } => trained_inputs[*group],
                Op::Linear { .. }
                | Op::BatchNorm { .. }
                | Op::Cross { .. }
                | Op::LayerNorm { .. }
                | Op::GroupedLinear { .. }
                | Op::NaryEmbed { .. }
                | Op::Dice { .. }
                | Op::SeqAugment { .. }
                | Op::VariationalDropout { .. }
                | Op::Bias { .. }
                | Op::Scale { w: Some(_), .. } => true,
                Op::Zeros { .. }
                | Op::StopGradient { .. }
                | Op::PrefixMask { .. }
                | Op::Capsules { .. }
                | Op::CapsuleRouting { .. } => false,
                op => op.operands().iter().any(|x| needs[x.0]),
            };
        }
        needs
    }
}

/// Dice's batch-normalization epsilon (EasyRec's `dice`).
pub const DICE_EPS: f32 = 1e-9;

/// Keras' layer normalization epsilon (EasyRec's own layer keeps it).
pub const LN_EPS: f32 = 1e-3;

/// TensorFlow's batch normalization constants (momentum 0.99, epsilon 1e-3).
pub const BN_MOMENTUM: f32 = 0.99;
pub const BN_EPS: f32 = 1e-3;

/// One batch norm's statistics over a training batch, for its moving
/// averages.
#[derive(Debug, Clone, PartialEq)]
pub struct BnStats {
    /// Where the moving averages live in the buffer store.
    pub mean_buffer: usize,
    pub var_buffer: usize,
    pub mean: Vec<f32>,
    /// Biased (divided by the batch size).
    pub var: Vec<f32>,
}

/// Folds the batch statistics of a training step into the moving averages.
pub fn update_bn_buffers(buffers: &mut ParamStore, stats: Vec<BnStats>) {
    for s in stats {
        for (buf, batch) in [(s.mean_buffer, s.mean), (s.var_buffer, s.var)] {
            for (x, y) in buffers.slice_mut(buf).iter_mut().zip(batch) {
                *x = *x * BN_MOMENTUM + y * (1.0 - BN_MOMENTUM);
            }
        }
    }
}

/// How many of `n` positions a length `len` keeps live: position `k` is
/// live where `k < len` (a fractional length counts up, none below 0).
pub fn live(len: f32, n: usize) -> usize {
    (len.max(0.0).ceil() as usize).min(n)
}
