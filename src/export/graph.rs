//! The trained model as an ONNX graph. Inputs are what `features` produces
//! for a batch: per embedded feature `<name>/ids` (int64, every row's ids
//! back to back) and `<name>/lens` (int64, ids per row), plus
//! `<name>/weights` for weighted tags; per raw feature `<name>` (float,
//! `[batch, dim]`, already normalized). The graph looks rows up with Gather,
//! pools them per row (sum or mean, as the combiner says), lays the groups
//! out like `model::GroupLayout`, and runs the same network as
//! `model::Net::forward` in inference mode. Outputs: `logits` and `probs`
//! (`y` instead of `probs` for regression), both `[batch]`.

use std::collections::HashMap;

use super::onnx::{Attr, Dim, Elem, Graph};
use crate::config::model_plan::{Activation, Interaction};
use crate::config::typed::{FeatureKind, LossKind, TrainingPlan};
use crate::model::arch::Wide;
use crate::model::layers::{BatchNorm, Dnn, Linear, BN_EPS};
use crate::model::{Model, Net, ParamStore};

/// How one feature enters the graph.
#[derive(Debug, Clone, PartialEq)]
pub enum InputKind {
    /// `<name>/ids`, `<name>/lens` (and `<name>/weights` when weighted).
    Ids { weighted: bool },
    /// `<name>`: `[batch, dim]` floats.
    Dense { dim: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct FeatureInput {
    /// Index into `TrainingPlan::features`.
    pub feature: usize,
    pub name: String,
    pub kind: InputKind,
}

/// The features the model reads, in config order.
pub fn feature_inputs(plan: &TrainingPlan, model: &Model) -> Vec<FeatureInput> {
    let mut used: Vec<(usize, Option<usize>)> = Vec::new();
    for g in &model.groups {
        for p in &g.parts {
            if !used.iter().any(|(f, _)| *f == p.feature) {
                used.push((p.feature, p.table.is_none().then_some(p.dim)));
            }
        }
    }
    used.sort_by_key(|(f, _)| *f);
    used.into_iter()
        .map(|(f, dense)| {
            let spec = &plan.features[f];
            let kind = match dense {
                Some(dim) => InputKind::Dense { dim },
                None => InputKind::Ids {
                    weighted: matches!(
                        spec.kind,
                        FeatureKind::Tag {
                            kv_separator: Some(_),
                            ..
                        }
                    ),
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

/// Builds the graph of `model` with whole tables `tables` (`[rows, dim]`
/// row-major, indexed like `Model::tables`).
pub fn build(plan: &TrainingPlan, model: &Model, tables: &[&[f32]], batch: Dim) -> (Graph, Vec<FeatureInput>) {
    let inputs = feature_inputs(plan, model);
    let mut b = Builder {
        g: Graph::default(),
        params: &model.params,
        buffers: &model.buffers,
        named: HashMap::new(),
    };
    // Per feature: the graph value of its dense input, or its pooling mask.
    let mut dense: HashMap<usize, String> = HashMap::new();
    let mut masks: HashMap<usize, Mask> = HashMap::new();
    for (k, fi) in inputs.iter().enumerate() {
        match fi.kind {
            InputKind::Dense { dim } => {
                let x = b.g.input(&fi.name, Elem::F32, &[batch.clone(), Dim::Fixed(dim)]);
                dense.insert(fi.feature, x);
            }
            InputKind::Ids { weighted } => {
                // Symbols stay plain identifiers whatever the feature names are.
                let n = Dim::Named(format!("num_ids_{k}"));
                let ids =
                    b.g.input(&format!("{}/ids", fi.name), Elem::I64, std::slice::from_ref(&n));
                let lens =
                    b.g.input(&format!("{}/lens", fi.name), Elem::I64, std::slice::from_ref(&batch));
                let weights = weighted.then(|| b.g.input(&format!("{}/weights", fi.name), Elem::F32, &[n]));
                let m = b.mask(&ids, &lens, weights.as_deref());
                masks.insert(fi.feature, m);
            }
        }
    }
    let mut table_names: HashMap<usize, String> = HashMap::new();
    let mut group_inputs = Vec::new();
    for g in &model.groups {
        let mut cols = Vec::new();
        for p in &g.parts {
            match p.table {
                None => cols.push(dense[&p.feature].clone()),
                Some(t) => {
                    let spec = &model.tables[t];
                    let table = table_names
                        .entry(t)
                        .or_insert_with(|| {
                            b.g.f32s(
                                Some(&format!("{}/embedding_weights", spec.name)),
                                &[spec.rows, spec.dim],
                                tables[t],
                            )
                        })
                        .clone();
                    let mean = plan.features[p.feature].mean_combiner;
                    cols.push(b.pool(&masks[&p.feature], &table, mean));
                }
            }
        }
        group_inputs.push(b.concat(&cols, 1));
    }
    let logits = b.net(&model.net, &group_inputs);
    let flat = b.reshape(&logits, &[-1]);
    b.g.node("Identity", &[&flat], Vec::new(), Some("logits"));
    b.g.output("logits", Elem::F32, std::slice::from_ref(&batch));
    match plan.loss {
        LossKind::BinaryClassification => {
            b.g.node("Sigmoid", &["logits"], Vec::new(), Some("probs"));
            b.g.output("probs", Elem::F32, &[batch]);
        }
        LossKind::Regression => {
            b.g.node("Identity", &["logits"], Vec::new(), Some("y"));
            b.g.output("y", Elem::F32, &[batch]);
        }
    }
    (b.g, inputs)
}

/// A feature's ids and its row-membership matrix `[batch, num_ids]`
/// (weights in place of ones when weighted), with the per-row weight sums.
struct Mask {
    ids: String,
    mask: String,
    sums: String,
}

struct Builder<'a> {
    g: Graph,
    params: &'a ParamStore,
    buffers: &'a ParamStore,
    named: HashMap<usize, String>,
}

const CAST_TO_FLOAT: i64 = 1;

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

    fn scalar_f32(&mut self, v: f32) -> String {
        self.g.f32s(None, &[], &[v])
    }

    fn axes(&mut self, axes: &[i64]) -> String {
        self.g.i64s(&[axes.len()], axes)
    }

    fn mask(&mut self, ids: &str, lens: &str, weights: Option<&str>) -> Mask {
        let zero = self.g.i64s(&[], &[0]);
        let one = self.g.i64s(&[], &[1]);
        let ends = self.g.op("CumSum", &[lens, &zero]);
        let starts = self.g.op("Sub", &[&ends, lens]);
        // Positions 0..num_ids without a shape op: an exclusive cumsum of ones.
        let zeros = self.g.op("Mul", &[ids, &zero]);
        let ones = self.g.op("Add", &[&zeros, &one]);
        let pos = self
            .g
            .node("CumSum", &[&ones, &zero], vec![("exclusive", Attr::Int(1))], None);
        let ax0 = self.axes(&[0]);
        let ax1 = self.axes(&[1]);
        let pos = self.g.op("Unsqueeze", &[&pos, &ax0]);
        let ends = self.g.op("Unsqueeze", &[&ends, &ax1]);
        let starts = self.g.op("Unsqueeze", &[&starts, &ax1]);
        let before_end = self.g.op("Less", &[&pos, &ends]);
        let before_start = self.g.op("Less", &[&pos, &starts]);
        let cast = |g: &mut Graph, x: &str| g.node("Cast", &[x], vec![("to", Attr::Int(CAST_TO_FLOAT))], None);
        let a = cast(&mut self.g, &before_end);
        let b = cast(&mut self.g, &before_start);
        let mut mask = self.g.op("Sub", &[&a, &b]);
        if let Some(w) = weights {
            let w = self.g.op("Unsqueeze", &[w, &ax0]);
            mask = self.g.op("Mul", &[&mask, &w]);
        }
        let sums = self.reduce_sum(&mask, 1, true);
        Mask {
            ids: ids.to_string(),
            mask,
            sums,
        }
    }

    /// `[batch, dim]`: each row's rows of `table`, summed (or their weighted mean).
    fn pool(&mut self, m: &Mask, table: &str, mean: bool) -> String {
        let rows = self
            .g
            .node("Gather", &[table, &m.ids], vec![("axis", Attr::Int(0))], None);
        let pooled = self.g.op("MatMul", &[&m.mask, &rows]);
        if !mean {
            return pooled;
        }
        let zero = self.scalar_f32(0.0);
        let positive = self.g.op("Greater", &[&m.sums, &zero]);
        let divided = self.g.op("Div", &[&pooled, &m.sums]);
        self.g.op("Where", &[&positive, &divided, &pooled])
    }

    fn concat(&mut self, xs: &[String], axis: i64) -> String {
        if xs.len() == 1 {
            return xs[0].clone();
        }
        let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
        self.g.node("Concat", &refs, vec![("axis", Attr::Int(axis))], None)
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

    fn add(&mut self, a: Option<String>, b: String) -> String {
        match a {
            Some(a) => self.g.op("Add", &[&a, &b]),
            None => b,
        }
    }

    /// Zeros `[batch, cols]` for a `[batch, width]` value `like`.
    fn zeros(&mut self, like: &str, width: usize, cols: usize) -> String {
        let z = self.g.f32s(None, &[width, cols], &vec![0.0; width * cols]);
        self.g.op("MatMul", &[like, &z])
    }

    fn linear(&mut self, l: &Linear, x: &str) -> String {
        let w = self.param(l.w);
        let y = self.g.op("MatMul", &[x, &w]);
        match l.b {
            Some(b) => {
                let b = self.param(b);
                self.g.op("Add", &[&y, &b])
            }
            None => y,
        }
    }

    fn batch_norm(&mut self, bn: &BatchNorm, x: &str) -> String {
        let mean = self.buffers.slice(bn.mean).to_vec();
        let inv: Vec<f32> = self
            .buffers
            .slice(bn.var)
            .iter()
            .map(|v| 1.0 / (v + BN_EPS).sqrt())
            .collect();
        let mean = self.g.f32s(None, &[1, mean.len()], &mean);
        let inv = self.g.f32s(None, &[1, inv.len()], &inv);
        let (gamma, beta) = (self.param(bn.gamma), self.param(bn.beta));
        let c = self.g.op("Sub", &[x, &mean]);
        let c = self.g.op("Mul", &[&c, &inv]);
        let c = self.g.op("Mul", &[&c, &gamma]);
        self.g.op("Add", &[&c, &beta])
    }

    fn dnn(&mut self, d: &Dnn, x: &str) -> String {
        let mut x = x.to_string();
        for l in &d.layers {
            x = self.linear(&l.linear, &x);
            if let Some(bn) = &l.bn {
                x = self.batch_norm(bn, &x);
            }
            x = match d.activation {
                Activation::Relu => self.g.op("Relu", &[&x]),
                Activation::Sigmoid => self.g.op("Sigmoid", &[&x]),
                Activation::Tanh => self.g.op("Tanh", &[&x]),
                Activation::Linear => x,
            };
        }
        x
    }

    fn wide(&mut self, w: &Wide, x: &[String]) -> Option<String> {
        let mut acc = None;
        for ((g, n, dw), raw) in w.groups.iter().zip(&w.raw) {
            if *n > 0 {
                let s = self.slice(&x[*g], 1, 0, n * w.dim);
                let s = self.reshape(&s, &[-1, *n as i64, w.dim as i64]);
                let s = self.reduce_sum(&s, 1, false);
                acc = Some(self.add(acc, s));
            }
            if let Some(k) = raw {
                let r = self.slice(&x[*g], 1, n * w.dim, *dw);
                let k = self.param(*k);
                let r = self.g.op("MatMul", &[&r, &k]);
                acc = Some(self.add(acc, r));
            }
        }
        acc
    }

    /// Logits `[batch, 1]` from the group inputs, as `Net::forward` computes them.
    fn net(&mut self, net: &Net, x: &[String]) -> String {
        match net {
            Net::WideAndDeep {
                wide,
                deep,
                dnn,
                final_dnn,
                out,
            } => {
                let w = self.wide(wide, x);
                let h = self.dnn(dnn, &x[*deep]);
                match final_dnn {
                    Some(f) => {
                        let w = w.unwrap_or_else(|| self.zeros(&h, dnn.d_out, wide.dim));
                        let c = self.concat(&[w, h], 1);
                        let h = self.dnn(f, &c);
                        self.linear(out, &h)
                    }
                    None => {
                        let o = self.linear(out, &h);
                        self.add(w, o)
                    }
                }
            }
            Net::Dlrm {
                dense,
                sparse,
                n_sparse,
                dim,
                bot,
                top,
                out,
                interaction,
                tri,
                with_dense,
            } => {
                let d = self.dnn(bot, &x[*dense]);
                let z = match interaction {
                    Interaction::Cat => self.concat(&[d, x[*sparse].clone()], 1),
                    Interaction::Dot => {
                        let n = (n_sparse + 1) as i64;
                        let all = self.concat(&[d.clone(), x[*sparse].clone()], 1);
                        let all = self.reshape(&all, &[-1, n, *dim as i64]);
                        let t = self
                            .g
                            .node("Transpose", &[&all], vec![("perm", Attr::Ints(vec![0, 2, 1]))], None);
                        let dots = self.g.op("MatMul", &[&all, &t]);
                        let dots = self.reshape(&dots, &[-1, n * n]);
                        let idx = self.g.i64s(&[tri.len()], tri);
                        let inter = self
                            .g
                            .node("Gather", &[&dots, &idx], vec![("axis", Attr::Int(1))], None);
                        if *with_dense {
                            self.concat(&[d, inter], 1)
                        } else {
                            inter
                        }
                    }
                };
                let h = self.dnn(top, &z);
                self.linear(out, &h)
            }
            Net::DeepFm {
                wide,
                deep,
                fm,
                dnn,
                final_dnn,
                out,
            } => {
                let w = self.wide(wide, x);
                let (n, d) = *fm;
                let v = self.slice(&x[*deep], 1, 0, n * d);
                let v = self.reshape(&v, &[-1, n as i64, d as i64]);
                let sum = self.reduce_sum(&v, 1, false);
                let vv = self.g.op("Mul", &[&v, &v]);
                let sq = self.reduce_sum(&vv, 1, false);
                let ss = self.g.op("Mul", &[&sum, &sum]);
                let diff = self.g.op("Sub", &[&ss, &sq]);
                let half = self.scalar_f32(0.5);
                let fm_out = self.g.op("Mul", &[&diff, &half]);
                let h = self.dnn(dnn, &x[*deep]);
                match final_dnn {
                    Some(f) => {
                        let w = w.unwrap_or_else(|| self.zeros(&h, dnn.d_out, wide.dim));
                        let c = self.concat(&[w, fm_out, h], 1);
                        let h = self.dnn(f, &c);
                        self.linear(out, &h)
                    }
                    None => {
                        let o = self.linear(out, &h);
                        let f = self.reduce_sum(&fm_out, 1, true);
                        let o = self.g.op("Add", &[&o, &f]);
                        self.add(w, o)
                    }
                }
            }
            Net::Dcn {
                deep_group,
                cross_group,
                deep,
                cross,
                final_dnn,
                out,
            } => {
                let h = self.dnn(deep, &x[*deep_group]);
                let x0 = x[*cross_group].clone();
                let mut xl = x0.clone();
                for (w, bias) in cross {
                    let w = self.param(*w);
                    let bias = self.param(*bias);
                    let s = self.g.op("MatMul", &[&xl, &w]);
                    let y = self.g.op("Mul", &[&x0, &s]);
                    let y = self.g.op("Add", &[&y, &bias]);
                    xl = self.g.op("Add", &[&y, &xl]);
                }
                let c = self.concat(&[h, xl], 1);
                let h = self.dnn(final_dnn, &c);
                self.linear(out, &h)
            }
            Net::MultiTower { towers, final_dnn, out } => {
                let hs: Vec<String> = towers.iter().map(|(g, dnn)| self.dnn(dnn, &x[*g])).collect();
                let c = self.concat(&hs, 1);
                let h = self.dnn(final_dnn, &c);
                self.linear(out, &h)
            }
        }
    }
}
