//! Update rules shared by dense parameters and embedding rows, with
//! TensorFlow's formulas, and EasyRec's multi-optimizer assignment.

mod tensor;

use rayon::prelude::*;

use crate::config::model::ModelKind;
use crate::config::train_plan::{OptimizerKind, OptimizerSpec};

/// Which optimizer (index into `train_config.optimizer_config`) updates what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    pub wide_tables: usize,
    pub deep_tables: usize,
    pub dense: usize,
}

impl Assignment {
    /// EasyRec's rules: one optimizer updates everything; two split embeddings
    /// from dense (WideAndDeep: wide side vs the rest); three (WideAndDeep only)
    /// are wide / deep embeddings / dense.
    pub fn new(model: ModelKind, n: usize) -> Self {
        match (model, n) {
            (_, 1) => Assignment {
                wide_tables: 0,
                deep_tables: 0,
                dense: 0,
            },
            (ModelKind::WideAndDeep, 2) => Assignment {
                wide_tables: 0,
                deep_tables: 1,
                dense: 1,
            },
            (ModelKind::WideAndDeep, _) => Assignment {
                wide_tables: 0,
                deep_tables: 1,
                dense: 2,
            },
            _ => Assignment {
                wide_tables: 0,
                deep_tables: 0,
                dense: 1,
            },
        }
    }
}

/// Number of slot vectors a rule keeps per parameter, and their initial values.
pub fn slot_inits(kind: &OptimizerKind) -> Vec<f32> {
    match kind {
        OptimizerKind::Momentum { momentum } if *momentum == 0.0 => vec![],
        OptimizerKind::Momentum { .. } | OptimizerKind::MomentumW { .. } => vec![0.0],
        OptimizerKind::Adam { .. }
        | OptimizerKind::LazyAdam { .. }
        | OptimizerKind::AdamAsync { .. }
        | OptimizerKind::AdamW { .. } => {
            vec![0.0, 0.0]
        }
        OptimizerKind::Adagrad { initial_accumulator } => vec![*initial_accumulator],
        OptimizerKind::Ftrl {
            initial_accumulator, ..
        } => vec![*initial_accumulator, 0.0],
        OptimizerKind::RmsProp { momentum, .. } if *momentum == 0.0 => vec![1.0],
        OptimizerKind::RmsProp { .. } => vec![1.0, 0.0],
    }
}

pub fn slot_names(kind: &OptimizerKind) -> &'static [&'static str] {
    match kind {
        OptimizerKind::Momentum { momentum } if *momentum == 0.0 => &[],
        OptimizerKind::Momentum { .. } | OptimizerKind::MomentumW { .. } => &["momentum"],
        OptimizerKind::Adam { .. }
        | OptimizerKind::LazyAdam { .. }
        | OptimizerKind::AdamAsync { .. }
        | OptimizerKind::AdamW { .. } => &["m", "v"],
        OptimizerKind::Adagrad { .. } => &["accumulator"],
        OptimizerKind::Ftrl { .. } => &["accumulator", "linear"],
        OptimizerKind::RmsProp { momentum, .. } if *momentum == 0.0 => &["ms"],
        OptimizerKind::RmsProp { .. } => &["ms", "momentum"],
    }
}

/// TensorFlow's names of the same slots, in `slot_names` order, as its
/// optimizers save them (`<variable>/Adam`, `<variable>/Adam_1`, ...);
/// empty where TensorFlow's optimizer keeps other state.
pub fn tf_slot_names(kind: &OptimizerKind) -> &'static [&'static str] {
    match kind {
        OptimizerKind::Momentum { momentum } if *momentum == 0.0 => &[],
        OptimizerKind::Momentum { .. } | OptimizerKind::MomentumW { .. } => &["Momentum"],
        OptimizerKind::Adam { .. } | OptimizerKind::LazyAdam { .. } => &["Adam", "Adam_1"],
        OptimizerKind::AdamAsync { .. } => &["AdamAsync", "AdamAsync_1"],
        OptimizerKind::Adagrad { .. } => &["Adagrad"],
        OptimizerKind::Ftrl { .. } => &["Ftrl", "Ftrl_1"],
        OptimizerKind::RmsProp { momentum, .. } if *momentum == 0.0 => &["RMSProp"],
        OptimizerKind::RmsProp { .. } => &["RMSProp", "RMSProp_1"],
        OptimizerKind::AdamW { .. } => &[],
    }
}

/// The slot names TensorFlow's optimizers save (the last part of
/// `<variable>/<slot>`).
pub const TF_SLOTS: [&str; 10] = [
    "Adam",
    "Adam_1",
    "Adagrad",
    "Momentum",
    "Ftrl",
    "Ftrl_1",
    "RMSProp",
    "RMSProp_1",
    "AdamAsync",
    "AdamAsync_1",
];

/// Whether a checkpoint variable name (`.../<slot>`) names an optimizer
/// slot: TensorFlow's name for it, or ours where TensorFlow has none.
pub fn is_slot_name(name: &str) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    ["momentum", "m", "v", "accumulator", "linear", "ms"].contains(&last) || TF_SLOTS.contains(&last)
}

/// A configured optimizer at one step: the rule and its learning rate.
#[derive(Debug, Clone)]
pub struct Rule {
    pub kind: OptimizerKind,
    pub lr: f32,
    /// 1-based count of updates, for Adam's bias correction.
    pub t: u64,
}

impl OptimizerKind {
    /// Whether a step moves an embedding table's rows that have no
    /// gradient in it: TensorFlow's `AdamOptimizer` decays every row's
    /// moments and applies them (see `embedding::apply_rows`), and so does
    /// EasyRec's `AdamWOptimizer`, which is that optimizer after a weight
    /// decay of the batch's rows.
    pub fn moves_untouched_rows(&self) -> bool {
        matches!(self, OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. })
    }

    /// The rule a row without a gradient takes where the rule moves such
    /// rows: AdamW's weight decay reaches only the batch's rows
    /// (TensorFlow's `_decay_weights_sparse_op` scatters it to the
    /// gradient's indices), so the others take Adam's step alone.
    pub fn untouched_rows_rule(&self) -> OptimizerKind {
        match *self {
            OptimizerKind::AdamW { beta1, beta2, .. } => OptimizerKind::Adam { beta1, beta2 },
            ref other => other.clone(),
        }
    }
}

impl Rule {
    /// Adam's learning rate with both bias corrections, at this rule's
    /// update count.
    fn adam_lr(&self, beta1: f32, beta2: f32) -> f32 {
        let t = self.t as i32;
        self.lr * (1.0 - beta2.powi(t)).sqrt() / (1.0 - beta1.powi(t))
    }

    pub fn at(spec: &OptimizerSpec, global_step: u64) -> Self {
        Rule {
            kind: spec.kind.clone(),
            lr: spec.lr.at(global_step),
            t: global_step + 1,
        }
    }

    /// Applies one update to `w` with gradient `g`; `slots[k]` are aligned with `w`.
    /// (Zipped iterators rather than indices: no bounds checks, so the
    /// element-wise sweeps vectorise.)
    pub fn apply(&self, w: &mut [f32], g: &[f32], slots: &mut [&mut [f32]]) {
        // (The indexed loops this replaced checked these lengths by panicking.)
        debug_assert!(g.len() == w.len() && slots.iter().all(|s| s.len() == w.len()));
        let lr = self.lr;
        match &self.kind {
            OptimizerKind::Momentum { momentum } => {
                if *momentum == 0.0 {
                    for (w, g) in w.iter_mut().zip(g) {
                        *w -= lr * g;
                    }
                } else {
                    for ((w, a), g) in w.iter_mut().zip(slots[0].iter_mut()).zip(g) {
                        *a = *a * momentum + g;
                        *w -= lr * *a;
                    }
                }
            }
            OptimizerKind::MomentumW { momentum, weight_decay } => {
                for ((w, a), g) in w.iter_mut().zip(slots[0].iter_mut()).zip(g) {
                    *w -= weight_decay * *w;
                    *a = *a * momentum + g;
                    *w -= lr * *a;
                }
            }
            OptimizerKind::Adam { beta1, beta2 }
            | OptimizerKind::LazyAdam { beta1, beta2 }
            | OptimizerKind::AdamAsync { beta1, beta2 }
            | OptimizerKind::AdamW { beta1, beta2, .. } => {
                if let OptimizerKind::AdamW { weight_decay, .. } = &self.kind {
                    for x in w.iter_mut() {
                        *x -= weight_decay * *x;
                    }
                }
                let lr_t = self.adam_lr(*beta1, *beta2);
                let [m, v] = slots else {
                    unreachable!("adam keeps two slots")
                };
                for (((w, m), v), g) in w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *w -= lr_t * *m / (v.sqrt() + 1e-8);
                }
            }
            OptimizerKind::Adagrad { .. } => {
                for ((w, a), g) in w.iter_mut().zip(slots[0].iter_mut()).zip(g) {
                    *a += g * g;
                    *w -= lr * g / a.sqrt();
                }
            }
            OptimizerKind::Ftrl {
                lr_power,
                l1,
                l2,
                l2_shrinkage,
                ..
            } => {
                let [acc, lin] = slots else {
                    unreachable!("ftrl keeps two slots")
                };
                for i in 0..w.len() {
                    let gs = g[i] + 2.0 * l2_shrinkage * w[i];
                    let new_acc = acc[i] + g[i] * g[i];
                    let sigma = (new_acc.powf(-lr_power) - acc[i].powf(-lr_power)) / lr;
                    lin[i] += gs - sigma * w[i];
                    let quad = new_acc.powf(-lr_power) / lr + 2.0 * l2;
                    w[i] = if lin[i].abs() > *l1 {
                        (l1 * lin[i].signum() - lin[i]) / quad
                    } else {
                        0.0
                    };
                    acc[i] = new_acc;
                }
            }
            OptimizerKind::RmsProp {
                momentum,
                decay,
                epsilon,
            } => {
                if *momentum == 0.0 {
                    let ms = &mut *slots[0];
                    for i in 0..w.len() {
                        ms[i] = decay * ms[i] + (1.0 - decay) * g[i] * g[i];
                        w[i] -= lr * g[i] / (ms[i] + epsilon).sqrt();
                    }
                } else {
                    let [ms, mom] = slots else {
                        unreachable!("rmsprop with momentum keeps two slots")
                    };
                    for i in 0..w.len() {
                        ms[i] = decay * ms[i] + (1.0 - decay) * g[i] * g[i];
                        mom[i] = momentum * mom[i] + lr * g[i] / (ms[i] + epsilon).sqrt();
                        w[i] -= mom[i];
                    }
                }
            }
        }
    }
}

impl Rule {
    /// `apply` to `w` whose slots are `state`'s over `range`, without
    /// allocating (the per-row update of embedding tables).
    pub fn apply_at(&self, w: &mut [f32], g: &[f32], state: &mut SlotState, range: std::ops::Range<usize>) {
        match state.slots.as_mut_slice() {
            [] => self.apply(w, g, &mut []),
            [a] => self.apply(w, g, &mut [&mut a[range]]),
            [a, b] => self.apply(w, g, &mut [&mut a[range.clone()], &mut b[range]]),
            _ => unreachable!("rules keep at most two slots"),
        }
    }

    /// `apply` over a long buffer, in chunks spread over the thread pool;
    /// every rule is element-wise, so the result is the same.
    pub fn apply_parallel(&self, w: &mut [f32], g: &[f32], slots: Vec<&mut [f32]>) {
        const CHUNK: usize = 1 << 14;
        let mut slot_chunks: Vec<_> = slots.into_iter().map(|s| s.chunks_mut(CHUNK)).collect();
        let jobs: Vec<_> = w
            .chunks_mut(CHUNK)
            .zip(g.chunks(CHUNK))
            .map(|(w, g)| {
                let s = slot_chunks
                    .iter_mut()
                    .map(|c| c.next().expect("slots are as long as the weights"))
                    .collect::<Vec<&mut [f32]>>();
                (w, g, s)
            })
            .collect();
        jobs.into_par_iter().for_each(|(w, g, mut s)| self.apply(w, g, &mut s));
    }
}

/// Parameters of one flat buffer with their optimizer slots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotState {
    pub slots: Vec<Vec<f32>>,
}

impl SlotState {
    pub fn new(kind: &OptimizerKind, len: usize) -> Self {
        SlotState {
            slots: slot_inits(kind)
                .into_iter()
                .map(|v| crate::util::table_buffer(v, len))
                .collect(),
        }
    }

    /// Mutable views of every slot over `range`.
    pub fn view(&mut self, range: std::ops::Range<usize>) -> Vec<&mut [f32]> {
        self.slots.iter_mut().map(|s| &mut s[range.clone()]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(kind: OptimizerKind, lr: f32, t: u64) -> Rule {
        Rule { kind, lr, t }
    }

    #[test]
    fn adagrad_step_by_hand() {
        let r = rule(
            OptimizerKind::Adagrad {
                initial_accumulator: 0.1,
            },
            0.5,
            1,
        );
        let mut w = [1.0f32];
        let mut a = [0.1f32];
        r.apply(&mut w, &[2.0], &mut [&mut a]);
        assert!((a[0] - 4.1).abs() < 1e-6);
        assert!((w[0] - (1.0 - 0.5 * 2.0 / 4.1f32.sqrt())).abs() < 1e-6);
    }

    /// MomentumW: the value decays by `wd * w` first, then momentum SGD
    /// (`a = m * a + g; w -= lr * a`), two steps by hand.
    #[test]
    fn momentumw_decays_then_steps() {
        let r = rule(
            OptimizerKind::MomentumW {
                momentum: 0.5,
                weight_decay: 0.1,
            },
            0.2,
            1,
        );
        let (mut w, mut a) = ([2.0f32], [0.0f32]);
        r.apply(&mut w, &[1.0], &mut [&mut a]);
        // 2 - 0.2 = 1.8; a = 1; w = 1.8 - 0.2 = 1.6.
        assert!((a[0] - 1.0).abs() < 1e-6 && (w[0] - 1.6).abs() < 1e-6, "{w:?} {a:?}");
        r.apply(&mut w, &[1.0], &mut [&mut a]);
        // 1.6 - 0.16 = 1.44; a = 1.5; w = 1.44 - 0.3 = 1.14.
        assert!((a[0] - 1.5).abs() < 1e-6 && (w[0] - 1.14).abs() < 1e-6, "{w:?} {a:?}");
    }

    #[test]
    fn adam_first_step_moves_by_lr() {
        let r = rule(
            OptimizerKind::Adam {
                beta1: 0.9,
                beta2: 0.999,
            },
            0.01,
            1,
        );
        let mut w = [0.0f32, 0.0];
        let (mut m, mut v) = ([0.0f32; 2], [0.0f32; 2]);
        r.apply(&mut w, &[3.0, -0.5], &mut [&mut m, &mut v]);
        assert!((w[0] + 0.01).abs() < 1e-5 && (w[1] - 0.01).abs() < 1e-5, "{w:?}");
    }

    #[test]
    fn ftrl_matches_closed_form() {
        let r = rule(
            OptimizerKind::Ftrl {
                lr_power: -0.5,
                initial_accumulator: 0.1,
                l1: 0.0,
                l2: 0.0,
                l2_shrinkage: 0.0,
            },
            1.0,
            1,
        );
        let mut w = [0.0f32];
        let (mut acc, mut lin) = ([0.1f32], [0.0f32]);
        r.apply(&mut w, &[1.0], &mut [&mut acc, &mut lin]);
        // linear = 1, quadratic = sqrt(1.1) -> w = -1 / sqrt(1.1)
        assert!((w[0] + 1.0 / 1.1f32.sqrt()).abs() < 1e-6);
    }
}
