//! `Rule::apply`'s formulas on burn tensors, for dense parameters kept on
//! a device (`train::device_dense`): the same update op by op, in the same
//! order of operations, so a device's step and the host's agree to
//! rounding.

use burn::tensor::Tensor;

use super::Rule;
use crate::config::train_plan::OptimizerKind;

impl Rule {
    /// `apply` to the flat parameters `w` with gradient `g` and the
    /// rule's `slots` (each as long as `w`): the updated parameters and
    /// slots.
    pub fn apply_tensors(&self, w: Tensor<1>, g: Tensor<1>, slots: Vec<Tensor<1>>) -> (Tensor<1>, Vec<Tensor<1>>) {
        let lr = self.lr;
        let mut slots = slots.into_iter();
        let mut slot = || slots.next().expect("the rule's slots (`slot_inits`)");
        match &self.kind {
            OptimizerKind::Momentum { momentum } if *momentum == 0.0 => (w - g.mul_scalar(lr), Vec::new()),
            OptimizerKind::Momentum { momentum } => {
                let a = slot().mul_scalar(*momentum) + g;
                (w - a.clone().mul_scalar(lr), vec![a])
            }
            OptimizerKind::MomentumW { momentum, weight_decay } => {
                let w = w.clone() - w.mul_scalar(*weight_decay);
                let a = slot().mul_scalar(*momentum) + g;
                (w - a.clone().mul_scalar(lr), vec![a])
            }
            OptimizerKind::Adam { beta1, beta2 }
            | OptimizerKind::LazyAdam { beta1, beta2 }
            | OptimizerKind::AdamAsync { beta1, beta2 }
            | OptimizerKind::AdamW { beta1, beta2, .. } => {
                let w = match &self.kind {
                    OptimizerKind::AdamW { weight_decay, .. } => w.clone() - w.mul_scalar(*weight_decay),
                    _ => w,
                };
                let lr_t = self.adam_lr(*beta1, *beta2);
                let m = slot().mul_scalar(*beta1) + g.clone().mul_scalar(1.0 - beta1);
                let v = slot().mul_scalar(*beta2) + g.clone().mul_scalar(1.0 - beta2) * g;
                let step = m.clone().mul_scalar(lr_t) / v.clone().sqrt().add_scalar(1e-8);
                (w - step, vec![m, v])
            }
            OptimizerKind::Adagrad { .. } => {
                let a = slot() + g.clone() * g.clone();
                (w - g.mul_scalar(lr) / a.clone().sqrt(), vec![a])
            }
            OptimizerKind::Ftrl {
                lr_power,
                l1,
                l2,
                l2_shrinkage,
                ..
            } => {
                let (acc, lin) = (slot(), slot());
                let gs = g.clone() + w.clone().mul_scalar(2.0 * l2_shrinkage);
                let new_acc = acc.clone() + g.clone() * g;
                let new_pow = new_acc.clone().powf_scalar(-lr_power);
                let sigma = (new_pow.clone() - acc.powf_scalar(-lr_power)).div_scalar(lr);
                let lin = lin + (gs - sigma * w);
                let quad = new_pow.div_scalar(lr).add_scalar(2.0 * l2);
                let shrunk = (lin.clone().sign().mul_scalar(*l1) - lin.clone()) / quad;
                let w = shrunk.mask_fill(lin.clone().abs().lower_equal_elem(*l1), 0.0);
                (w, vec![new_acc, lin])
            }
            OptimizerKind::RmsProp {
                momentum,
                decay,
                epsilon,
            } => {
                let ms = slot().mul_scalar(*decay) + g.clone().mul_scalar(1.0 - decay) * g.clone();
                let step = g.mul_scalar(lr) / ms.clone().add_scalar(*epsilon).sqrt();
                if *momentum == 0.0 {
                    (w - step, vec![ms])
                } else {
                    let mom = slot().mul_scalar(*momentum) + step;
                    (w - mom.clone(), vec![ms, mom])
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::model::graph::params::to_vec;
    use crate::optim::slot_inits;
    use crate::util::Rng;

    fn kinds() -> Vec<OptimizerKind> {
        vec![
            OptimizerKind::Momentum { momentum: 0.0 },
            OptimizerKind::Momentum { momentum: 0.9 },
            OptimizerKind::MomentumW {
                momentum: 0.9,
                weight_decay: 0.01,
            },
            OptimizerKind::Adam {
                beta1: 0.9,
                beta2: 0.999,
            },
            OptimizerKind::LazyAdam {
                beta1: 0.8,
                beta2: 0.99,
            },
            OptimizerKind::AdamAsync {
                beta1: 0.9,
                beta2: 0.999,
            },
            OptimizerKind::AdamW {
                beta1: 0.9,
                beta2: 0.999,
                weight_decay: 0.02,
            },
            OptimizerKind::Adagrad {
                initial_accumulator: 0.1,
            },
            OptimizerKind::Ftrl {
                lr_power: -0.5,
                initial_accumulator: 0.1,
                l1: 0.05,
                l2: 0.01,
                l2_shrinkage: 0.001,
            },
            OptimizerKind::RmsProp {
                momentum: 0.0,
                decay: 0.9,
                epsilon: 1e-6,
            },
            OptimizerKind::RmsProp {
                momentum: 0.5,
                decay: 0.9,
                epsilon: 1e-6,
            },
        ]
    }

    /// Three steps of every rule on tensors (burn's CPU backend) against
    /// the host's `apply`: parameters and slots within 1e-6 relative.
    #[test]
    fn every_rule_on_tensors_matches_the_host() {
        let device = Device::flex();
        let n = 257;
        let flat = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
        let mut rng = Rng::new(7);
        for kind in kinds() {
            let mut w: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let mut slots: Vec<Vec<f32>> = slot_inits(&kind).into_iter().map(|v| vec![v; n]).collect();
            let (mut wt, mut st) = (flat(&w), slots.iter().map(|s| flat(s)).collect::<Vec<_>>());
            for t in 1..=3 {
                let g: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                let rule = Rule {
                    kind: kind.clone(),
                    lr: 0.05,
                    t,
                };
                let mut views: Vec<&mut [f32]> = slots.iter_mut().map(|s| &mut s[..]).collect();
                rule.apply(&mut w, &g, &mut views);
                (wt, st) = rule.apply_tensors(wt, flat(&g), st);
            }
            let close = |a: &[f32], b: &[f32], what: &str| {
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() <= 1e-6 * (1.0 + x.abs()), "{kind:?} {what}: {x} vs {y}");
                }
            };
            close(&w, &to_vec(wt), "parameters");
            assert_eq!(st.len(), slots.len(), "{kind:?}");
            for (s, t) in slots.iter().zip(st) {
                close(s, &to_vec(t), "slot");
            }
        }
    }
}
