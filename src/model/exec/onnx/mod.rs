//! The trained model as an ONNX graph. Inputs are what `features` produces
//! for a batch: per embedded feature `<name>/ids` (int64, every row's ids
//! back to back) and `<name>/lens` (int64, ids per row), plus
//! `<name>/weights` for weighted tags; per raw feature `<name>` (float,
//! `[batch, dim]`, already normalized). The graph looks rows up with Gather,
//! pools them per row (sum or mean, as the combiner says) by adding each
//! looked-up row into its row's slot (ScatterND with `add`), so the work is
//! linear in the number of ids whatever the batch size, lays the groups
//! out like `model::GroupLayout`, and emits the model graph's ops in
//! inference mode (batch norm with its moving averages, no dropout).
//! Outputs per task: `logits` and `probs` (`y` for regression), both
//! `[batch]`; multi-task models suffix them with the tower's name
//! (`logits_ctr`, `probs_ctr`), as EasyRec does.

mod key_lookup;
pub mod proto;

use std::collections::HashMap;

pub use key_lookup::{GraphTable, KeyLayout};

use crate::config::feature_plan::FeatureSpec;
use crate::config::model::tasks::{LossKind, Task, ZilnPrediction};
use crate::config::model::Activation;
use crate::model::exec::cpu::kernels;
use crate::model::graph::nary::Nary;
use crate::model::graph::{Keys, BN_EPS, DICE_EPS, MASK_ADDER};
use crate::model::heads::losses;
use crate::model::{Model, Op, ParamStore, SeqPartKind};
use proto::{Attr, Dim, Elem, Graph};

/// How one feature enters the graph.
#[derive(Debug, Clone, PartialEq)]
pub enum InputKind {
    /// `<name>/ids`, `<name>/lens` (and `<name>/weights` when weighted;
    /// `<name>/positions` and `<name>/seq_lens` when positioned: each id's
    /// sequence position and each row's count of positions).
    Ids { weighted: bool, positioned: bool },
    /// `<name>`: `[batch, dim]` floats.
    Dense { dim: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct FeatureInput {
    /// Index into the feature plan.
    pub feature: usize,
    pub name: String,
    pub kind: InputKind,
}

/// The features the model reads, in config order.
pub fn feature_inputs(features: &[FeatureSpec], model: &Model) -> Vec<FeatureInput> {
    let mut used: Vec<(usize, Option<usize>)> = Vec::new();
    for g in &model.groups {
        let plain = g.parts.iter().map(|p| (p.feature, p.table.is_none().then_some(p.dim)));
        // Sequence parts all read ids.
        let seq = g.seq_parts.iter().map(|p| (p.feature, None));
        for (f, dense) in plain.chain(seq) {
            if !used.iter().any(|(u, _)| *u == f) {
                used.push((f, dense));
            }
        }
    }
    used.sort_by_key(|(f, _)| *f);
    used.into_iter()
        .map(|(f, dense)| {
            let spec = &features[f];
            let kind = match dense {
                Some(dim) => InputKind::Dense { dim },
                None => InputKind::Ids {
                    weighted: spec.weighted_ids(),
                    positioned: spec.positioned_ids(),
                },
            };
            FeatureInput {
                feature: f,
                name: spec.name.clone(),
                kind,
            }
        })
        .collect()
}

/// Builds the graph of `model` (over `features`, with an output per task
/// of `tasks`) with whole tables `tables` (indexed like `Model::tables`).
pub fn build(
    (features, tasks): (&[FeatureSpec], &[Task]),
    model: &Model,
    tables: &[GraphTable<'_>],
    batch: Dim,
) -> (Graph, Vec<FeatureInput>) {
    let inputs = feature_inputs(features, model);
    let mut b = Builder {
        g: Graph::default(),
        params: &model.params,
        buffers: &model.buffers,
        named: HashMap::new(),
        named_buffers: HashMap::new(),
    };
    // Per feature: the graph value of its dense input, or its id segments.
    let mut dense: HashMap<usize, String> = HashMap::new();
    let mut segments: HashMap<usize, Segments> = HashMap::new();
    for (k, fi) in inputs.iter().enumerate() {
        match fi.kind {
            InputKind::Dense { dim } => {
                let x = b.g.input(&fi.name, Elem::F32, &[batch.clone(), Dim::Fixed(dim)]);
                dense.insert(fi.feature, x);
            }
            InputKind::Ids { weighted, positioned } => {
                // Symbols stay plain identifiers whatever the feature names are.
                let n = Dim::Named(format!("num_ids_{k}"));
                let ids =
                    b.g.input(&format!("{}/ids", fi.name), Elem::I64, std::slice::from_ref(&n));
                let lens =
                    b.g.input(&format!("{}/lens", fi.name), Elem::I64, std::slice::from_ref(&batch));
                let weights = weighted.then(|| {
                    b.g.input(&format!("{}/weights", fi.name), Elem::F32, std::slice::from_ref(&n))
                });
                let mut m = b.segments(&ids, &lens, weights.as_deref());
                if positioned {
                    let pos = b.g.input(&format!("{}/positions", fi.name), Elem::I64, &[n]);
                    let seq_lens = b.g.input(
                        &format!("{}/seq_lens", fi.name),
                        Elem::I64,
                        std::slice::from_ref(&batch),
                    );
                    m.positions = Some((pos, seq_lens));
                }
                segments.insert(fi.feature, m);
            }
        }
    }
    let mut table_nodes: HashMap<usize, TableNodes> = HashMap::new();
    // A feature's ids as rows of a key-value table, by (feature, table).
    let mut keyed: HashMap<(usize, usize), Segments> = HashMap::new();
    let variables = &model.table_variables;
    let mut group_inputs = Vec::new();
    for g in &model.groups {
        let mut cols = Vec::new();
        // Table `t`'s rows, and feature `f`'s segments with ids as its rows.
        let mut table_of = |b: &mut Builder, t: usize, f: usize| -> (String, Segments) {
            let nodes = table_nodes
                .entry(t)
                .or_insert_with(|| b.table(&variables[t], model.tables[t].dim, &tables[t]));
            let m = match &nodes.lookup {
                None => segments[&f].clone(),
                Some(l) => keyed
                    .entry((f, t))
                    .or_insert_with(|| {
                        let mut m = segments[&f].clone();
                        m.ids = b.key_rows(&m.ids, l);
                        m
                    })
                    .clone(),
            };
            (nodes.values.clone(), m)
        };
        for p in &g.parts {
            match p.table {
                None => cols.push(dense[&p.feature].clone()),
                Some(t) => {
                    let (table, m) = table_of(&mut b, t, p.feature);
                    cols.push(b.pool(&m, &table, model.tables[t].dim, p.mean));
                }
            }
        }
        for p in &g.seq_parts {
            let m = &segments[&p.feature];
            cols.push(match p.kind {
                SeqPartKind::Pooled { table, dim, mean } => {
                    let (table, m) = table_of(&mut b, table, p.feature);
                    b.pool(&m, &table, dim, mean)
                }
                SeqPartKind::Positions { table, dim, len } => {
                    let (table, m) = table_of(&mut b, table, p.feature);
                    b.positions(&m, &table, dim, len)
                }
                SeqPartKind::Length { len } => {
                    let cap = b.scalar_f32(len as f32);
                    let n = match &m.positions {
                        None => m.sums.clone(),
                        Some((_, seq_lens)) => {
                            let f = b.cast_f32(seq_lens);
                            let ax1 = b.axes(&[1]);
                            b.g.op("Unsqueeze", &[&f, &ax1])
                        }
                    };
                    b.g.op("Min", &[&n, &cap])
                }
            });
        }
        group_inputs.push(b.concat(&cols, 1));
    }
    let values = b.emit(&model.graph, &group_inputs);
    // Per task: `logits<suffix>` and `probs<suffix>` (`y<suffix>` for
    // regression), both `[batch]`, or `[batch, classes]` for a multi-class
    // task (its probabilities the softmax); a ZILN task's `[batch, 3]`
    // logits, the probability of a positive label and the expected value
    // `y<suffix>`.
    let shape_of = |width: usize| match width {
        1 => vec![batch.clone()],
        w => vec![batch.clone(), Dim::Fixed(w)],
    };
    for t in tasks {
        let name = t.output();
        let out = model.graph.output_node(&name).expect("every task has an output");
        let flat = match t.logit_width() {
            1 => b.reshape(&values[out.0], &[-1]),
            _ => values[out.0].clone(),
        };
        b.g.node("Identity", &[&flat], Vec::new(), Some(&name));
        b.g.output(&name, Elem::F32, &shape_of(t.logit_width()));
        // The outputs after the logits (`Task::export_outputs`): the
        // scores, and ZILN's expected value.
        let named = t.export_outputs();
        let softmax = vec![("axis", Attr::Int(1))];
        let after: Vec<String> = match t.loss {
            LossKind::BinaryClassification | LossKind::InBatchSoftmax { .. } => {
                vec![b.g.node("Sigmoid", &[&name], Vec::new(), Some(&named[1]))]
            }
            LossKind::Regression => vec![b.g.node("Identity", &[&name], Vec::new(), Some(&named[1]))],
            LossKind::MultiClass { .. } => vec![b.g.node("Softmax", &[&name], softmax, Some(&named[1]))],
            LossKind::Jrc => {
                let p = b.g.node("Softmax", &[&name], softmax, None);
                let second = b.slice(&p, 1, 1, 1);
                vec![b.reshape(&second, &[-1])]
            }
            LossKind::Ziln(z) => b.ziln(&name, z).to_vec(),
        };
        assert_eq!(
            after.len(),
            named.len() - 1,
            "a value per export output of `{}`",
            t.output()
        );
        let score_shape = shape_of(t.classes());
        for (value, out) in after.iter().zip(&named[1..]) {
            if value != out {
                b.g.node("Identity", &[value], Vec::new(), Some(out));
            }
            b.g.output(out, Elem::F32, &score_shape);
        }
    }
    for (name, out) in model.embedding_outputs() {
        b.g.node("Identity", &[&values[out.0]], Vec::new(), Some(name));
        let dim = Dim::Fixed(model.graph.width(out));
        b.g.output(name, Elem::F32, &[batch.clone(), dim]);
    }
    (b.g, inputs)
}

/// A table's rows in the graph and, for a key-value table, its key layout.
struct TableNodes {
    values: String,
    lookup: Option<KeyLookupNodes>,
}

/// The initializers of a key-value table's layout (`KeyLayout`).
struct KeyLookupNodes {
    slot_keys: String,
    slot_rows: String,
    /// Scalar int64: the number of slots.
    slots: String,
    /// Scalar int64: the default row.
    default: String,
}

/// A feature's ids, the row each id belongs to (`[num_ids, 1]`, for
/// ScatterND), its weights as a column (`[num_ids, 1]`) when weighted, and
/// each row's weight sum (`[batch, 1]`: its id count when unweighted).
#[derive(Clone)]
struct Segments {
    ids: String,
    /// Ids per row, `[batch]` int64.
    lens: String,
    rows: String,
    weights: Option<String>,
    sums: String,
    /// Zeros `[batch, 1]`.
    zero_col: String,
    /// A multi-valued sequence's `<name>/positions` and `<name>/seq_lens`.
    positions: Option<(String, String)>,
}

struct Builder<'a> {
    g: Graph,
    params: &'a ParamStore,
    buffers: &'a ParamStore,
    named: HashMap<usize, String>,
    named_buffers: HashMap<usize, String>,
}

const CAST_TO_FLOAT: i64 = 1;
const CAST_TO_INT64: i64 = 7;
const CAST_TO_DOUBLE: i64 = 11;

impl Builder<'_> {
    fn param(&mut self, i: usize) -> String {
        if let Some(n) = self.named.get(&i) {
            return n.clone();
        }
        let s = &self.params.specs[i];
        let n = self.g.f32s(Some(&s.name), &[s.rows, s.cols], self.params.slice(i));
        self.named.insert(i, n.clone());
        n
    }

    /// Table `var`'s initializers: its rows and, for a key-value table,
    /// the layout of its keys (`<var>/slot_keys`, `<var>/slot_rows`).
    fn table(&mut self, var: &str, dim: usize, t: &GraphTable<'_>) -> TableNodes {
        let values = self.g.f32s(Some(var), &[t.rows, dim], &t.values);
        let lookup = t.keys.as_ref().map(|l| {
            let m = l.slot_keys.len();
            KeyLookupNodes {
                slot_keys: self.g.named_i64s(&format!("{var}/slot_keys"), &[m], &l.slot_keys),
                slot_rows: self.g.named_i64s(&format!("{var}/slot_rows"), &[m], &l.slot_rows),
                slots: self.g.named_i64s(&format!("{var}/slot_count"), &[], &[m as i64]),
                default: self
                    .g
                    .named_i64s(&format!("{var}/default_row"), &[], &[t.rows as i64 - 1]),
            }
        });
        TableNodes { values, lookup }
    }

    /// The rows of keys `ids` in a key-value table (`KeyLayout`): slot
    /// `k mod M` or `(k div M) mod M` holds the key, else the default row.
    fn key_rows(&mut self, ids: &str, l: &KeyLookupNodes) -> String {
        let first = self.g.op("Mod", &[ids, &l.slots]);
        let quotient = self.g.op("Div", &[ids, &l.slots]);
        let second = self.g.op("Mod", &[&quotient, &l.slots]);
        let mut rows = l.default.clone();
        for slot in [second, first] {
            let key = self
                .g
                .node("Gather", &[&l.slot_keys, &slot], vec![("axis", Attr::Int(0))], None);
            let row = self
                .g
                .node("Gather", &[&l.slot_rows, &slot], vec![("axis", Attr::Int(0))], None);
            let here = self.g.op("Equal", &[&key, ids]);
            rows = self.g.op("Where", &[&here, &row, &rows]);
        }
        rows
    }

    fn scalar_f32(&mut self, v: f32) -> String {
        self.g.f32s(None, &[], &[v])
    }

    fn axes(&mut self, axes: &[i64]) -> String {
        self.g.i64s(&[axes.len()], axes)
    }

    fn segments(&mut self, ids: &str, lens: &str, weights: Option<&str>) -> Segments {
        let zero = self.g.i64s(&[], &[0]);
        let one = self.g.i64s(&[], &[1]);
        let ax1 = self.axes(&[1]);
        // One mark per row at the position where it ends (0..=num_ids); the
        // running count of marks at an id's position is its row's index,
        // empty rows included.
        let ends = self.g.op("CumSum", &[lens, &zero]);
        let zeros = self.g.op("Mul", &[ids, &zero]);
        let tail = self.g.i64s(&[1], &[0]);
        let marks = self
            .g
            .node("Concat", &[&zeros, &tail], vec![("axis", Attr::Int(0))], None);
        let lens_zero = self.g.op("Mul", &[lens, &zero]);
        let ones = self.g.op("Add", &[&lens_zero, &one]);
        let marks = self.g.node(
            "ScatterElements",
            &[&marks, &ends, &ones],
            vec![("axis", Attr::Int(0)), ("reduction", Attr::Str("add".into()))],
            None,
        );
        let counts = self.g.op("CumSum", &[&marks, &zero]);
        let rows = self.slice_to(&counts, 0, -1);
        let rows = self.g.op("Unsqueeze", &[&rows, &ax1]);
        let lens_f = self.cast_f32(lens);
        let lens_col = self.g.op("Unsqueeze", &[&lens_f, &ax1]);
        let zero_f = self.scalar_f32(0.0);
        let zero_col = self.g.op("Mul", &[&lens_col, &zero_f]);
        let weights = weights.map(|w| self.g.op("Unsqueeze", &[w, &ax1]));
        let sums = match &weights {
            None => lens_col,
            Some(w) => self.scatter_add(&zero_col, &rows, w),
        };
        Segments {
            ids: ids.to_string(),
            lens: lens.to_string(),
            rows,
            weights,
            sums,
            zero_col,
            positions: None,
        }
    }

    /// `data` with each row of `updates` added into the row `rows` names.
    fn scatter_add(&mut self, data: &str, rows: &str, updates: &str) -> String {
        self.g.node(
            "ScatterND",
            &[data, rows, updates],
            vec![("reduction", Attr::Str("add".into()))],
            None,
        )
    }

    /// `[batch, dim]`: each row's rows of `table`, summed (or their weighted
    /// mean, which leaves out ids of weight <= 0 as `embedding::pool_rows`
    /// does: their weight becomes 0).
    fn pool(&mut self, m: &Segments, table: &str, dim: usize, mean: bool) -> String {
        let (weights, sums) = match (&m.weights, mean) {
            (Some(w), true) => {
                let kept = self.g.op("Relu", &[w]);
                let sums = self.scatter_add(&m.zero_col, &m.rows, &kept);
                (Some(kept), sums)
            }
            _ => (m.weights.clone(), m.sums.clone()),
        };
        let mut looked_up = self
            .g
            .node("Gather", &[table, &m.ids], vec![("axis", Attr::Int(0))], None);
        if let Some(w) = &weights {
            looked_up = self.g.op("Mul", &[&looked_up, w]);
        }
        // Zeros `[batch, dim]`, shaped by the batch without a shape op.
        let row = self.g.f32s(None, &[1, dim], &vec![0.0; dim]);
        let zeros = self.g.op("Add", &[&m.zero_col, &row]);
        let pooled = self.scatter_add(&zeros, &m.rows, &looked_up);
        if !mean {
            return pooled;
        }
        let zero = self.scalar_f32(0.0);
        let positive = self.g.op("Greater", &[&sums, &zero]);
        let divided = self.g.op("Div", &[&pooled, &sums]);
        self.g.op("Where", &[&positive, &divided, &pooled])
    }

    /// `[batch, len * dim]`: the rows of `table` for each row's ids side by
    /// side in order, zeros past its ids. Rows hold at most `len` ids (the
    /// encoder keeps a sequence's first `max_len` values). With given
    /// positions, each id's row (weighted, when weighted) is added into
    /// its position's slot.
    fn positions(&mut self, m: &Segments, table: &str, dim: usize, len: usize) -> String {
        let mut looked_up = self
            .g
            .node("Gather", &[table, &m.ids], vec![("axis", Attr::Int(0))], None);
        if let Some(w) = &m.weights {
            looked_up = self.g.op("Mul", &[&looked_up, w]);
        }
        let ax1 = self.axes(&[1]);
        let pos = match &m.positions {
            // Given: several ids share a position, their rows added up.
            Some((p, _)) => self.g.op("Unsqueeze", &[p, &ax1]),
            None => {
                // An id's position in its row: its index less its row's first index.
                let zero = self.g.i64s(&[], &[0]);
                let one = self.g.i64s(&[], &[1]);
                let ones = self.g.op("Mul", &[&m.ids, &zero]);
                let ones = self.g.op("Add", &[&ones, &one]);
                let index = self
                    .g
                    .node("CumSum", &[&ones, &zero], vec![("exclusive", Attr::Int(1))], None);
                let index = self.g.op("Unsqueeze", &[&index, &ax1]);
                let starts = self
                    .g
                    .node("CumSum", &[&m.lens, &zero], vec![("exclusive", Attr::Int(1))], None);
                let start = self
                    .g
                    .node("Gather", &[&starts, &m.rows], vec![("axis", Attr::Int(0))], None);
                self.g.op("Sub", &[&index, &start])
            }
        };
        let l = self.g.i64s(&[], &[len as i64]);
        let slot = self.g.op("Mul", &[&m.rows, &l]);
        let slot = self.g.op("Add", &[&slot, &pos]);
        // Zeros `[batch * len, dim]`, then each id's row into its slot.
        let row = self.g.f32s(None, &[1, len * dim], &vec![0.0; len * dim]);
        let zeros = self.g.op("Add", &[&m.zero_col, &row]);
        let zeros = self.reshape(&zeros, &[-1, dim as i64]);
        let placed = self.scatter_add(&zeros, &slot, &looked_up);
        self.reshape(&placed, &[-1, (len * dim) as i64])
    }

    fn concat(&mut self, xs: &[String], axis: i64) -> String {
        if xs.len() == 1 {
            return xs[0].clone();
        }
        let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
        self.g.node("Concat", &refs, vec![("axis", Attr::Int(axis))], None)
    }

    /// `x[..end]` along `axis` (`end` counts from the back when negative).
    fn slice_to(&mut self, x: &str, axis: i64, end: i64) -> String {
        let starts = self.g.i64s(&[1], &[0]);
        let ends = self.g.i64s(&[1], &[end]);
        let axes = self.axes(&[axis]);
        self.g.op("Slice", &[x, &starts, &ends, &axes])
    }

    /// `log(1 + exp(x))`, stable: `relu(x) + log(1 + exp(-|x|))`.
    fn softplus(&mut self, x: &str) -> String {
        let pos = self.g.op("Relu", &[x]);
        let abs = self.g.op("Abs", &[x]);
        let neg = self.g.op("Neg", &[&abs]);
        let e = self.g.op("Exp", &[&neg]);
        let one = self.scalar_f32(1.0);
        let sum = self.g.op("Add", &[&e, &one]);
        let log = self.g.op("Log", &[&sum]);
        self.g.op("Add", &[&pos, &log])
    }

    /// `x` clipped to `[lo, hi]`.
    fn clip(&mut self, x: &str, lo: f32, hi: f32) -> String {
        let (lo, hi) = (self.scalar_f32(lo), self.scalar_f32(hi));
        let up = self.g.op("Max", &[x, &lo]);
        self.g.op("Min", &[&up, &hi])
    }

    /// A ZILN task's `[batch]` probability of a positive label and its
    /// expected value (`losses::ziln_prediction`) from its `[batch, 3]`
    /// logits.
    fn ziln(&mut self, logits: &str, p: ZilnPrediction) -> [String; 2] {
        let col = |b: &mut Self, k: usize| {
            let c = b.slice(logits, 1, k, 1);
            b.reshape(&c, &[-1])
        };
        let (z0, mu, z2) = (col(self, 0), col(self, 1), col(self, 2));
        let probs = self.g.op("Sigmoid", &[&z0]);
        let sp = self.softplus(&z2);
        let sigma = self.clip(&sp, losses::ZILN_MIN_SIGMA as f32, p.max_sigma);
        let neg = self.g.op("Neg", &[&z0]);
        let sp_neg = self.softplus(&neg);
        let sq = self.g.op("Mul", &[&sigma, &sigma]);
        let half = self.scalar_f32(0.5);
        let half_sq = self.g.op("Mul", &[&sq, &half]);
        let sum = self.g.op("Add", &[&mu, &half_sq]);
        let log_y = self.g.op("Sub", &[&sum, &sp_neg]);
        let y = if p.return_log {
            log_y
        } else {
            let clipped = self.clip(&log_y, -100.0, p.max_log_clip);
            self.g.op("Exp", &[&clipped])
        };
        [probs, y]
    }

    /// `[batch, n]` booleans, column `k` live where `k < len` (`[batch, 1]`,
    /// a count).
    fn live(&mut self, len: &str, n: usize) -> String {
        let ks: Vec<f32> = (0..n).map(|k| k as f32).collect();
        let ks = self.g.f32s(None, &[1, n], &ks);
        self.g.op("Less", &[&ks, len])
    }

    /// `Op::NaryEmbed` of `x`'s `n` values, columns `c0 .. c0 + w` of
    /// parameter `table`. The arithmetic is in doubles, which hold every
    /// 32-bit value and quotient exactly (tract 0.23 got int64 comparisons
    /// and quotients with constants past 32 bits, and casts to int64 of
    /// values past them, wrong in our tests): the value truncated and
    /// saturated to 32 bits, read unsigned; per base the quotients `q_j =
    /// floor(u / c^j)`, digits `q_j - c * floor(q_j / c)` and their rows,
    /// gathered, weighted by whether the value reaches position `j` (`q_j >
    /// 0`; position 0 always) and pooled.
    fn nary_embed(&mut self, x: &str, n: usize, (table, c0, w): (usize, usize, usize), nary: &Nary) -> String {
        let f64s = |b: &mut Self, dims: &[usize], data: &[f64]| b.g.f64s(dims, data);
        let d = self.g.node("Cast", &[x], vec![("to", Attr::Int(CAST_TO_DOUBLE))], None);
        let zero = f64s(self, &[], &[0.0]);
        let negative = self.g.op("Less", &[&d, &zero]);
        let up = self.g.op("Ceil", &[&d]);
        let down = self.g.op("Floor", &[&d]);
        let t = self.g.op("Where", &[&negative, &up, &down]);
        let lo = f64s(self, &[], &[f64::from(i32::MIN)]);
        let hi = f64s(self, &[], &[f64::from(i32::MAX)]);
        let t = self.g.op("Max", &[&t, &lo]);
        let t = self.g.op("Min", &[&t, &hi]);
        // NaN is 0, as Rust's saturating cast has it.
        let number = self.g.op("Equal", &[&t, &t]);
        let t = self.g.op("Where", &[&number, &t, &zero]);
        let negative = self.g.op("Less", &[&t, &zero]);
        let wrap = f64s(self, &[], &[4294967296.0]);
        let wrapped = self.g.op("Add", &[&t, &wrap]);
        let u = self.g.op("Where", &[&negative, &wrapped, &t]);
        let u = self.reshape(&u, &[-1, n as i64, 1]);
        let table = self.param(table);
        let table = self.slice(&table, 1, c0, w);
        let mut pooled = Vec::with_capacity(nary.carries.len());
        for (k, &c) in nary.carries.iter().enumerate() {
            let positions = Nary::positions(c);
            let c = f64::from(c);
            let powers: Vec<f64> = (0..positions as i32).map(|j| c.powi(j)).collect();
            let pow = f64s(self, &[1, 1, positions], &powers);
            let q = self.g.op("Div", &[&u, &pow]);
            let q = self.g.op("Floor", &[&q]);
            let cc = f64s(self, &[], &[c]);
            let next = self.g.op("Div", &[&q, &cc]);
            let next = self.g.op("Floor", &[&next]);
            let carried = self.g.op("Mul", &[&next, &cc]);
            let digit = self.g.op("Sub", &[&q, &carried]);
            // Row of digit 0 at each position of each feature.
            let mut first = Vec::with_capacity(n * positions);
            for f in 0..n {
                let r0 = nary.first_row(f, k) as f64;
                first.extend((0..positions).map(|j| r0 + j as f64 * c));
            }
            let first = f64s(self, &[1, n, positions], &first);
            let rows = self.g.op("Add", &[&digit, &first]);
            let rows = self
                .g
                .node("Cast", &[&rows], vec![("to", Attr::Int(CAST_TO_INT64))], None);
            let mut below = vec![0.0; positions];
            below[0] = -1.0;
            let below = f64s(self, &[1, 1, positions], &below);
            let live = self.g.op("Less", &[&below, &q]);
            let mut weight = self.cast_f32(&live);
            if nary.mean {
                let digits = self.reduce_sum(&weight, 2, true);
                weight = self.g.op("Div", &[&weight, &digits]);
            }
            let weight = self.reshape(&weight, &[-1, n as i64, positions as i64, 1]);
            let gathered = self
                .g
                .node("Gather", &[&table, &rows], vec![("axis", Attr::Int(0))], None);
            let weighted = self.g.op("Mul", &[&gathered, &weight]);
            pooled.push(self.reduce_sum(&weighted, 2, false));
        }
        let all = self.concat(&pooled, 2);
        self.reshape(&all, &[-1, (n * nary.carries.len() * w) as i64])
    }

    fn cast_f32(&mut self, x: &str) -> String {
        self.g.node("Cast", &[x], vec![("to", Attr::Int(CAST_TO_FLOAT))], None)
    }

    /// The softmax over the last axis of `logits` where `live` (booleans
    /// broadcast to it) holds: the other logits sink far below the rest and
    /// are zeroed after the softmax, so a row with none live is zeros.
    fn live_softmax(&mut self, logits: &str, live: &str) -> String {
        let mask = self.cast_f32(live);
        let low = self.scalar_f32(-1e9);
        let sunk = self.g.op("Where", &[live, logits, &low]);
        let y = self.g.node("Softmax", &[&sunk], vec![("axis", Attr::Int(-1))], None);
        self.g.op("Mul", &[&y, &mask])
    }

    /// Each row divided by its L2 norm over `axis` (TensorFlow's
    /// `l2_normalize`).
    fn l2_normalized(&mut self, x: &str, axis: i64) -> String {
        let sq = self.g.op("Mul", &[x, x]);
        let sq = self.reduce_sum(&sq, axis, true);
        let eps = self.scalar_f32(crate::model::graph::L2_EPS);
        let sq = self.g.op("Max", &[&sq, &eps]);
        let norm = self.g.op("Sqrt", &[&sq]);
        self.g.op("Div", &[x, &norm])
    }

    /// `Op::CapsuleRouting` in inference: from the constant logits `init`
    /// (`[n, max_k]`), `iters` rounds over the positions `x` (`[batch * n,
    /// e]`) as `[batch, n, e]`; the weights `[batch, max_k * n]`.
    fn routing(
        &mut self,
        (x, len, caps): (&str, &str, &str),
        (n, e): (usize, usize),
        (k, iters, scale): (usize, usize, f32),
        init: &[f32],
    ) -> String {
        let (ni, ki) = (n as i64, k as i64);
        let xs = self.reshape(x, &[-1, ni, e as i64]);
        let xn = if scale > 0.0 {
            self.l2_normalized(&xs, 2)
        } else {
            xs.clone()
        };
        let positions = self.live(len, n);
        let positions = self.cast_f32(&positions);
        let positions = self.reshape(&positions, &[-1, ni, 1]);
        let live_caps = self.live(caps, k);
        let live_caps = self.reshape(&live_caps, &[-1, 1, ki]);
        let mut logits = self.g.f32s(None, &[1, n, k], init);
        let by = self.scalar_f32(if scale > 0.0 { scale } else { 1.0 });
        let swap = |b: &mut Self, t: &str| {
            b.g.node("Transpose", &[t], vec![("perm", Attr::Ints(vec![0, 2, 1]))], None)
        };
        let mut w = String::new();
        for it in 0..iters {
            let p = self.live_softmax(&logits, &live_caps);
            w = self.g.op("Mul", &[&p, &positions]);
            if it + 1 == iters {
                break;
            }
            let wt = swap(self, &w);
            let high = self.g.op("MatMul", &[&wt, &xs]);
            let high = self.l2_normalized(&high, 2);
            let ht = swap(self, &high);
            let l = self.g.op("MatMul", &[&xn, &ht]);
            logits = self.g.op("Mul", &[&l, &by]);
        }
        let wt = swap(self, &w);
        self.reshape(&wt, &[-1, ki * ni])
    }

    fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let s = self.g.i64s(&[shape.len()], shape);
        self.g.op("Reshape", &[x, &s])
    }

    fn slice(&mut self, x: &str, axis: i64, start: usize, len: usize) -> String {
        let starts = self.g.i64s(&[1], &[start as i64]);
        let ends = self.g.i64s(&[1], &[(start + len) as i64]);
        let axes = self.axes(&[axis]);
        self.g.op("Slice", &[x, &starts, &ends, &axes])
    }

    fn reduce_sum(&mut self, x: &str, axis: i64, keep: bool) -> String {
        let axes = self.axes(&[axis]);
        self.g.node(
            "ReduceSum",
            &[x, &axes],
            vec![("keepdims", Attr::Int(keep as i64))],
            None,
        )
    }

    /// Zeros `[batch, cols]` for a `[batch, width]` value `like`.
    fn zeros(&mut self, like: &str, width: usize, cols: usize) -> String {
        let z = self.g.f32s(None, &[width, cols], &vec![0.0; width * cols]);
        self.g.op("MatMul", &[like, &z])
    }

    fn act(&mut self, act: Activation, x: String) -> String {
        match act {
            Activation::Relu => self.g.op("Relu", &[&x]),
            Activation::Sigmoid => self.g.op("Sigmoid", &[&x]),
            Activation::Tanh => self.g.op("Tanh", &[&x]),
            Activation::Linear => x,
            Activation::Dice => unreachable!("Scope builds Dice as an op of its own"),
            Activation::Elu => self.g.node("Elu", &[&x], vec![("alpha", Attr::Float(1.0))], None),
            Activation::Selu => self.g.node(
                "Selu",
                &[&x],
                vec![
                    ("alpha", Attr::Float(kernels::SELU_ALPHA)),
                    ("gamma", Attr::Float(kernels::SELU_SCALE)),
                ],
                None,
            ),
            Activation::Softplus => self.g.op("Softplus", &[&x]),
            Activation::LeakyRelu => self.g.node(
                "LeakyRelu",
                &[&x],
                vec![("alpha", Attr::Float(kernels::LEAKY_SLOPE))],
                None,
            ),
        }
    }

    fn batch_norm(&mut self, x: &str, (gamma, beta): (usize, usize), stats: (usize, usize)) -> String {
        let c = self.normalized(x, stats, BN_EPS);
        let (gamma, beta) = (self.param(gamma), self.param(beta));
        let c = self.g.op("Mul", &[&c, &gamma]);
        self.g.op("Add", &[&c, &beta])
    }

    /// `(x - mean) / sqrt(var + eps)` with the moving averages in buffers
    /// `mean` and `var`, as inference normalizes.
    /// The moving averages are initializers under their variables' names,
    /// so an incremental update of them reaches the graph.
    fn normalized(&mut self, x: &str, (mean, var): (usize, usize), eps: f32) -> String {
        let m = self.buffer(mean);
        let v = self.buffer(var);
        let eps = self.scalar_f32(eps);
        let v = self.g.op("Add", &[&v, &eps]);
        let sd = self.g.op("Sqrt", &[&v]);
        let c = self.g.op("Sub", &[x, &m]);
        self.g.op("Div", &[&c, &sd])
    }

    /// Buffer `i` (`[1, n]`) as an initializer under its name.
    fn buffer(&mut self, i: usize) -> String {
        if let Some(n) = self.named_buffers.get(&i) {
            return n.clone();
        }
        let s = &self.buffers.specs[i];
        let values = self.buffers.slice(i);
        let n = self.g.f32s(Some(&s.name), &[1, values.len()], values);
        self.named_buffers.insert(i, n.clone());
        n
    }

    /// Layer normalization from opset-16 ops (LayerNormalization is 17).
    fn layer_norm(&mut self, x: &str, (gamma, beta): (usize, usize), eps: f32) -> String {
        let mean = |s: &mut Self, t: &str| {
            s.g.node(
                "ReduceMean",
                &[t],
                vec![("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(1))],
                None,
            )
        };
        let m = mean(self, x);
        let c = self.g.op("Sub", &[x, &m]);
        let sq = self.g.op("Mul", &[&c, &c]);
        let var = mean(self, &sq);
        let eps = self.scalar_f32(eps);
        let var = self.g.op("Add", &[&var, &eps]);
        let sd = self.g.op("Sqrt", &[&var]);
        let c = self.g.op("Div", &[&c, &sd]);
        let (gamma, beta) = (self.param(gamma), self.param(beta));
        let c = self.g.op("Mul", &[&c, &gamma]);
        self.g.op("Add", &[&c, &beta])
    }

    /// Every node of the model graph as ONNX nodes, in inference mode; the
    /// graph value of each node, from the group inputs' values `x`.
    fn emit(&mut self, graph: &crate::model::Graph, x: &[String]) -> Vec<String> {
        let mut v: Vec<String> = Vec::with_capacity(graph.nodes.len());
        for node in &graph.nodes {
            let width = node.width;
            let y = match &node.op {
                Op::Input { group } => x[*group].clone(),
                Op::Linear { x, w, b, act } => {
                    let w = self.param(*w);
                    let mut y = self.g.op("MatMul", &[&v[x.0], &w]);
                    if let Some(b) = b {
                        let b = self.param(*b);
                        y = self.g.op("Add", &[&y, &b]);
                    }
                    self.act(*act, y)
                }
                Op::BatchNorm {
                    x,
                    gamma,
                    beta,
                    mean,
                    var,
                    act,
                    ..
                } => {
                    let y = self.batch_norm(&v[x.0], (*gamma, *beta), (*mean, *var));
                    self.act(*act, y)
                }
                Op::Act { x, act } => self.act(*act, v[x.0].clone()),
                Op::Dice { x, alpha, mean, var } => {
                    let c = self.normalized(&v[x.0], (*mean, *var), DICE_EPS);
                    let gate = self.g.op("Sigmoid", &[&c]);
                    // x (p + a (1 - p)) = x (a + (1 - a) p)
                    let a = self.param(*alpha);
                    let one = self.scalar_f32(1.0);
                    let rest = self.g.op("Sub", &[&one, &a]);
                    let scaled = self.g.op("Mul", &[&rest, &gate]);
                    let factor = self.g.op("Add", &[&a, &scaled]);
                    self.g.op("Mul", &[&v[x.0], &factor])
                }
                Op::Dropout { x, .. } => v[x.0].clone(),
                Op::Concat(xs) => {
                    let xs: Vec<String> = xs.iter().map(|x| v[x.0].clone()).collect();
                    self.concat(&xs, 1)
                }
                Op::Slice { x, start } => self.slice(&v[x.0], 1, *start, width),
                Op::Add(xs) => {
                    let mut acc = v[xs[0].0].clone();
                    for x in &xs[1..] {
                        acc = self.g.op("Add", &[&acc, &v[x.0]]);
                    }
                    acc
                }
                Op::Mul(a, c) => self.g.op("Mul", &[&v[a.0], &v[c.0]]),
                Op::SumBlocks { x, n } => {
                    let s = self.reshape(&v[x.0], &[-1, *n as i64, width as i64]);
                    self.reduce_sum(&s, 1, false)
                }
                Op::Fm { x, n } => {
                    let blocks = self.reshape(&v[x.0], &[-1, *n as i64, width as i64]);
                    let sum = self.reduce_sum(&blocks, 1, false);
                    let sq = self.g.op("Mul", &[&blocks, &blocks]);
                    let sq = self.reduce_sum(&sq, 1, false);
                    let ss = self.g.op("Mul", &[&sum, &sum]);
                    let diff = self.g.op("Sub", &[&ss, &sq]);
                    let half = self.scalar_f32(0.5);
                    self.g.op("Mul", &[&diff, &half])
                }
                Op::RowSum { x } => self.reduce_sum(&v[x.0], 1, true),
                Op::Dot { xs, dim, pairs } => {
                    let xs: Vec<String> = xs.iter().map(|x| v[x.0].clone()).collect();
                    let all = self.concat(&xs, 1);
                    let total: usize = node_widths(graph, &node.op);
                    let n = (total / dim) as i64;
                    let all = self.reshape(&all, &[-1, n, *dim as i64]);
                    let t = self
                        .g
                        .node("Transpose", &[&all], vec![("perm", Attr::Ints(vec![0, 2, 1]))], None);
                    let dots = self.g.op("MatMul", &[&all, &t]);
                    let dots = self.reshape(&dots, &[-1, n * n]);
                    let flat: Vec<i64> = pairs.iter().map(|&(i, j)| i as i64 * n + j as i64).collect();
                    let idx = self.g.i64s(&[flat.len()], &flat);
                    self.g
                        .node("Gather", &[&dots, &idx], vec![("axis", Attr::Int(1))], None)
                }
                Op::Cross { x0, xl, w, b } => {
                    let (w, b) = (self.param(*w), self.param(*b));
                    let s = self.g.op("MatMul", &[&v[xl.0], &w]);
                    let y = self.g.op("Mul", &[&v[x0.0], &s]);
                    let y = self.g.op("Add", &[&y, &b]);
                    self.g.op("Add", &[&y, &v[xl.0]])
                }
                Op::Softmax { x } => self.g.node("Softmax", &[&v[x.0]], vec![("axis", Attr::Int(1))], None),
                Op::WeightedSum { gate, xs } => {
                    let mut acc: Option<String> = None;
                    for (e, x) in xs.iter().enumerate() {
                        let ge = self.slice(&v[gate.0], 1, e, 1);
                        let t = self.g.op("Mul", &[&v[x.0], &ge]);
                        acc = Some(match acc {
                            Some(a) => self.g.op("Add", &[&a, &t]),
                            None => t,
                        });
                    }
                    acc.expect("a weighted sum has operands")
                }
                Op::Zeros { like } => {
                    let lw = graph.width(*like);
                    self.zeros(&v[like.0], lw, width)
                }
                Op::Bias { x, b } => {
                    // One row of `width` values, however the parameter is
                    // shaped (a position table is `[positions, width]`).
                    let b = self.param(*b);
                    let b = self.reshape(&b, &[1, width as i64]);
                    self.g.op("Add", &[&v[x.0], &b])
                }
                Op::LayerNorm { x, gamma, beta, eps } => self.layer_norm(&v[x.0], (*gamma, *beta), *eps),
                Op::Sub(a, c) => self.g.op("Sub", &[&v[a.0], &v[c.0]]),
                Op::StopGradient { x } => self.g.op("Identity", &[&v[x.0]]),
                Op::ProductLogit { a, b: c } => {
                    // −(m + log Σ exp(z − m)) over z = (−a, −c, −a−c).
                    let (x, y) = (self.g.op("Neg", &[&v[a.0]]), self.g.op("Neg", &[&v[c.0]]));
                    let xy = self.g.op("Add", &[&x, &y]);
                    let z = self
                        .g
                        .node("Concat", &[&x, &y, &xy], vec![("axis", Attr::Int(1))], None);
                    let m = self.g.node(
                        "ReduceMax",
                        &[&z],
                        vec![("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(1))],
                        None,
                    );
                    let e = self.g.op("Sub", &[&z, &m]);
                    let e = self.g.op("Exp", &[&e]);
                    let s = self.reduce_sum(&e, 1, true);
                    let l = self.g.op("Log", &[&s]);
                    let l = self.g.op("Add", &[&l, &m]);
                    self.g.op("Neg", &[&l])
                }
                Op::Tile { x, n } => {
                    let reps = self.g.i64s(&[2], &[1, *n as i64]);
                    let t = self.g.op("Tile", &[&v[x.0], &reps]);
                    self.reshape(&t, &[-1, width as i64])
                }
                Op::Unfold { x, .. } | Op::Fold { x, .. } => self.reshape(&v[x.0], &[-1, width as i64]),
                Op::PrefixMask { len, n } => {
                    let live = self.live(&v[len.0], *n);
                    self.cast_f32(&live)
                }
                Op::MaskedSoftmax { x, len } => {
                    let live = self.live(&v[len.0], width);
                    self.live_softmax(&v[x.0], &live)
                }
                Op::Capsules { len, count } => {
                    let k = self.scalar_f32(count.max_k as f32);
                    if count.constant {
                        let zero = self.scalar_f32(0.0);
                        let z = self.g.op("Mul", &[&v[len.0], &zero]);
                        self.g.op("Add", &[&z, &k])
                    } else {
                        // max(1, min(max_k, ⌊ln live⌋)): ln 0 is −∞, lifted to 1.
                        let (zero, n, one) = (
                            self.scalar_f32(0.0),
                            self.scalar_f32(count.positions as f32),
                            self.scalar_f32(1.0),
                        );
                        let live = self.g.op("Ceil", &[&v[len.0]]);
                        let live = self.g.op("Max", &[&live, &zero]);
                        let live = self.g.op("Min", &[&live, &n]);
                        let ln = self.g.op("Log", &[&live]);
                        let c = self.g.op("Floor", &[&ln]);
                        let c = self.g.op("Min", &[&c, &k]);
                        self.g.op("Max", &[&c, &one])
                    }
                }
                Op::CapsuleRouting { x, len, caps, routing } => self.routing(
                    (&v[x.0], &v[len.0], &v[caps.0]),
                    (graph.rows(*x), graph.width(*x)),
                    (routing.max_k, routing.iters, routing.scale),
                    &routing.init,
                ),
                Op::InterestSimilarity { x, caps, max_k } => {
                    // ((|S|² − Σ|x_k|²) / max(c (c − 1), 1) + 1) / 2 · m, m = (c > 1).
                    let wx = graph.width(*x);
                    let x3 = self.reshape(&v[x.0], &[-1, *max_k as i64, (wx / max_k) as i64]);
                    let sum = self.reduce_sum(&x3, 1, false);
                    let whole = self.g.op("Mul", &[&sum, &sum]);
                    let whole = self.reduce_sum(&whole, 1, true);
                    let sq = self.g.op("Mul", &[&v[x.0], &v[x.0]]);
                    let parts = self.reduce_sum(&sq, 1, true);
                    let diff = self.g.op("Sub", &[&whole, &parts]);
                    let one = self.scalar_f32(1.0);
                    let less = self.g.op("Sub", &[&v[caps.0], &one]);
                    let pairs = self.g.op("Mul", &[&v[caps.0], &less]);
                    let den = self.g.op("Max", &[&pairs, &one]);
                    let s = self.g.op("Div", &[&diff, &den]);
                    let s = self.g.op("Add", &[&s, &one]);
                    let half = self.scalar_f32(0.5);
                    let s = self.g.op("Mul", &[&s, &half]);
                    let multi = self.g.op("Greater", &[&v[caps.0], &one]);
                    let m = self.cast_f32(&multi);
                    let s = self.g.op("Mul", &[&s, &m]);
                    self.concat(&[s, m], 1)
                }
                Op::Squash { x, pow, ratio } => {
                    let sq = self.g.op("Mul", &[&v[x.0], &v[x.0]]);
                    let sq = self.reduce_sum(&sq, 1, true);
                    let eps = self.scalar_f32(crate::model::graph::SQUASH_EPS);
                    let n = self.g.op("Max", &[&sq, &eps]);
                    let one = self.scalar_f32(1.0);
                    let n1 = self.g.op("Add", &[&n, &one]);
                    let q = self.g.op("Div", &[&n, &n1]);
                    let p = self.scalar_f32(*pow);
                    let q = self.g.op("Pow", &[&q, &p]);
                    let r = self.scalar_f32(*ratio);
                    let q = self.g.op("Mul", &[&q, &r]);
                    let root = self.g.op("Sqrt", &[&n]);
                    let f = self.g.op("Div", &[&q, &root]);
                    self.g.op("Mul", &[&v[x.0], &f])
                }
                Op::L2Normalize { x } => self.l2_normalized(&v[x.0], 1),
                Op::GroupedLinear { x, w, b: bias, n } => {
                    let (n, din) = (*n as i64, (graph.width(*x) / n) as i64);
                    let dout = width as i64 / n;
                    let x3 = self.reshape(&v[x.0], &[-1, n, din]);
                    let x3 = self
                        .g
                        .node("Transpose", &[&x3], vec![("perm", Attr::Ints(vec![1, 0, 2]))], None);
                    let w = self.param(*w);
                    let w3 = self.reshape(&w, &[n, din, dout]);
                    let y = self.g.op("MatMul", &[&x3, &w3]);
                    let y = self
                        .g
                        .node("Transpose", &[&y], vec![("perm", Attr::Ints(vec![1, 0, 2]))], None);
                    let y = self.reshape(&y, &[-1, width as i64]);
                    match bias {
                        Some(bi) => {
                            let b = self.param(*bi);
                            self.g.op("Add", &[&y, &b])
                        }
                        None => y,
                    }
                }
                Op::NaryEmbed {
                    x,
                    table,
                    nary,
                    cols: (c0, w),
                } => self.nary_embed(&v[x.0], graph.width(*x), (*table, *c0, *w), nary),
                Op::SinCos { x, n } => {
                    let e = (width / (2 * n)) as i64;
                    let x3 = self.reshape(&v[x.0], &[-1, *n as i64, e]);
                    let s = self.g.op("Sin", &[&x3]);
                    let c = self.g.op("Cos", &[&x3]);
                    let y = self.g.node("Concat", &[&s, &c], vec![("axis", Attr::Int(2))], None);
                    self.reshape(&y, &[-1, width as i64])
                }
                Op::Transpose { x, n } => {
                    let x3 = self.reshape(&v[x.0], &[-1, *n as i64, (width / n) as i64]);
                    let t = self
                        .g
                        .node("Transpose", &[&x3], vec![("perm", Attr::Ints(vec![0, 2, 1]))], None);
                    self.reshape(&t, &[-1, width as i64])
                }
                Op::Outer { a, b: c } => {
                    let a3 = self.reshape(&v[a.0], &[-1, graph.width(*a) as i64, 1]);
                    let c3 = self.reshape(&v[c.0], &[-1, 1, graph.width(*c) as i64]);
                    let y = self.g.op("MatMul", &[&a3, &c3]);
                    self.reshape(&y, &[-1, width as i64])
                }
                Op::Shift { x, by } => {
                    let c = self.scalar_f32(*by);
                    self.g.op("Add", &[&v[x.0], &c])
                }
                Op::Scale { x, factor, w } => {
                    let f = self.scalar_f32(*factor);
                    let y = self.g.op("Mul", &[&v[x.0], &f]);
                    match w {
                        Some(w) => {
                            let w = self.param(*w);
                            let a = self.g.op("Abs", &[&w]);
                            self.g.op("Mul", &[&y, &a])
                        }
                        None => y,
                    }
                }
                // Inference leaves a sequence as it is, its length beside.
                Op::SeqAugment { x, len, .. } => self.concat(&[v[x.0].clone(), v[len.0].clone()], 1),
                // A loss, never an output of the export: zeros in its place.
                Op::Contrastive { a, .. } => {
                    let aw = graph.width(*a);
                    self.zeros(&v[a.0], aw, width)
                }
                Op::VariationalDropout { x, p, index } => {
                    // Inference keeps `1 - rate` of each column: a constant
                    // of the trained logits.
                    let (keep, _) = kernels::concrete_keep(self.params.slice(*p), 1, None);
                    let k: Vec<f32> = index.iter().map(|&j| keep[j]).collect();
                    let k = self.g.f32s(None, &[1, width], &k);
                    self.g.op("Mul", &[&v[x.0], &k])
                }
                Op::MaxBlocks { x, n } => {
                    let x3 = self.reshape(&v[x.0], &[-1, *n as i64, width as i64]);
                    self.g.node(
                        "ReduceMax",
                        &[&x3],
                        vec![("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(0))],
                        None,
                    )
                }
                Op::Attention {
                    q,
                    k,
                    v: val,
                    heads,
                    scale,
                    keys,
                } => {
                    // [batch, n, heads, d] -> [batch, heads, n, d] (keys
                    // [batch, heads, d, n]), a softmax over the last axis.
                    let (f, n, h) = (graph.rows(*q) as i64, graph.rows(*k) as i64, *heads as i64);
                    let mut split = |x: &str, rows: i64, w: usize, perm: Vec<i64>| {
                        let x4 = self.reshape(x, &[-1, rows, h, w as i64 / h]);
                        self.g.node("Transpose", &[&x4], vec![("perm", Attr::Ints(perm))], None)
                    };
                    let wq = graph.width(*q);
                    let q4 = split(&v[q.0], f, wq, vec![0, 2, 1, 3]);
                    let kt = split(&v[k.0], n, wq, vec![0, 2, 3, 1]);
                    let v4 = split(&v[val.0], n, width, vec![0, 2, 1, 3]);
                    let s = self.g.op("MatMul", &[&q4, &kt]);
                    let c = self.scalar_f32(*scale);
                    let s = self.g.op("Mul", &[&s, &c]);
                    let p = match keys {
                        Keys::All => self.g.node("Softmax", &[&s], vec![("axis", Attr::Int(-1))], None),
                        Keys::Mask(m) => {
                            // s + (1 - m) * MASK_ADDER, the mask `[batch, 1, 1, n]`.
                            let one = self.scalar_f32(1.0);
                            let off = self.g.op("Sub", &[&one, &v[m.0]]);
                            let adder = self.scalar_f32(MASK_ADDER);
                            let off = self.g.op("Mul", &[&off, &adder]);
                            let off = self.reshape(&off, &[-1, 1, 1, n]);
                            let s = self.g.op("Add", &[&s, &off]);
                            self.g.node("Softmax", &[&s], vec![("axis", Attr::Int(-1))], None)
                        }
                        Keys::Live(len) => {
                            // As MaskedSoftmax, the mask `[batch, 1, 1, n]`.
                            let live = self.live(&v[len.0], n as usize);
                            let live = self.reshape(&live, &[-1, 1, 1, n]);
                            self.live_softmax(&s, &live)
                        }
                    };
                    let o = self.g.op("MatMul", &[&p, &v4]);
                    let o = self
                        .g
                        .node("Transpose", &[&o], vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))], None);
                    self.reshape(&o, &[-1, width as i64])
                }
                Op::AttnPool { w, x } => {
                    let n = graph.width(*w) as i64;
                    let ax1 = self.axes(&[1]);
                    let w3 = self.g.op("Unsqueeze", &[&v[w.0], &ax1]);
                    let x3 = self.reshape(&v[x.0], &[-1, n, width as i64]);
                    let y = self.g.op("MatMul", &[&w3, &x3]);
                    self.reshape(&y, &[-1, width as i64])
                }
            };
            v.push(y);
        }
        v
    }
}

/// The summed widths of a dot op's operands.
fn node_widths(graph: &crate::model::Graph, op: &Op) -> usize {
    op.operands().iter().map(|x| graph.width(*x)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::{cpu::Cpu, Executor, Mode};
    use crate::model::graph::params::Init;
    use crate::util::Rng;
    use tract_onnx::prelude::{tract_ndarray, tvec, Framework, InferenceModelExt, IntoRunnable, Tensor};

    /// `Op::NaryEmbed`'s lowering, run by tract, against the CPU executor:
    /// positive, negative, fractional, zero and out-of-range values, both
    /// poolings, a column range of the table.
    #[test]
    fn nary_embeddings_lower_to_onnx_as_the_cpu_computes_them() {
        let values: Vec<f32> = vec![
            0.0, 1.0, 57.0, 1957.0, -1.0, -57.6, 3.9, 1e12, 8.0, 6560.0, 6561.0, 4294.5, -3e9, 0.4, 2.0, 511.0,
        ];
        let (b, n) = (values.len() / 2, 2);
        for (mean, carries) in [
            (false, vec![9]),
            (false, vec![2, 2]),
            (false, vec![2, 9, 3]),
            (true, vec![2, 9, 3]),
        ] {
            let nary = Nary::new(carries.clone(), mean);
            let mut params = ParamStore::default();
            let mut rng = Rng::new(5);
            let t = params.add(
                "nary/embed_table",
                n * nary.vocab(),
                5,
                Init::GlorotUniform,
                false,
                &mut rng,
            );
            // Row r, column c holds 1000 c + r: a sum names its rows.
            params
                .slice_mut(t)
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = (i / 5) as f32 + (i % 5) as f32 * 1000.0);
            let mut g = crate::model::Graph::default();
            let x = g.input(0, n);
            let y = g.nary_embed(x, &params, t, nary.clone(), (1, 3));
            let cpu = Cpu::default();
            let (buffers, xs) = (ParamStore::default(), [values.clone()]);
            let tape = cpu.forward(&g, (&params, &buffers), &xs, b, Mode::Infer);
            let want = tape.value(y).to_vec();

            let mut bld = Builder {
                g: proto::Graph::default(),
                params: &params,
                buffers: &buffers,
                named: HashMap::new(),
                named_buffers: HashMap::new(),
            };
            let xin = bld
                .g
                .input("x", Elem::F32, &[Dim::Named("batch".into()), Dim::Fixed(n)]);
            let out = bld.nary_embed(&xin, n, (t, 1, 3), &nary);
            let width = n * carries.len() * 3;
            let out = bld.g.node("Identity", &[&out], vec![], Some("y"));
            bld.g
                .output(&out, Elem::F32, &[Dim::Named("batch".into()), Dim::Fixed(width)]);
            let dir = tempfile::tempdir().unwrap();
            bld.g.write(dir.path(), "model.onnx.data", usize::MAX).unwrap();
            let model = tract_onnx::onnx()
                .model_for_path(dir.path().join("model.onnx"))
                .unwrap()
                .into_optimized()
                .unwrap()
                .into_runnable()
                .unwrap();
            let input = tract_ndarray::Array2::from_shape_vec((b, n), values.clone()).unwrap();
            let got = model.run(tvec!(Tensor::from(input).into())).unwrap();
            let got: Vec<f32> = got[0].to_plain_array_view::<f32>().unwrap().iter().copied().collect();
            assert_eq!(got.len(), want.len());
            for (i, (a, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{carries:?}, mean {mean}: value {i} (row {}): onnx {a} vs cpu {w}",
                    i / width
                );
            }
        }
    }
}
