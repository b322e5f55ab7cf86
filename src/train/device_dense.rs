//! The dense side of a training step on parameters kept on the executor's
//! device (`model::Resident`, `--device gpu`): the regularizers, frozen
//! variables, the gradient's norm, clipping, the optimizer's update and
//! the finite check run there, as `dense::Dense` runs them on the host;
//! a step reads back two scalars (the norm with the regularizers' loss,
//! and the finite check), not the parameters or their gradient.

use std::ops::Range;

use burn::tensor::{Bool, Device, Tensor, TensorData};

use super::freeze::Frozen;
use crate::config::model::ModelPlan;
use crate::model::graph::params::{read_all, to_vec};
use crate::model::{Model, Resident};
use crate::optim::Rule;

/// The resident parameters with what their update reads besides the
/// gradient: where each regularizer and the frozen variables are.
pub struct DeviceDense {
    pub resident: Resident,
    /// 1 on the weights l2_regularization takes, 0 elsewhere (with its
    /// coefficient; none when it is 0).
    l2: Option<(f32, Tensor<1>)>,
    /// 1 on the variational dropouts' logits, 0 elsewhere (with lambda).
    dropout: Option<(f32, Tensor<1>)>,
    /// Where the values are trained, when some are frozen: as a mask for
    /// the update, and as 1/0 to clear the frozen ones' gradient.
    trained: Option<(Tensor<1, Bool>, Tensor<1>)>,
}

/// 1 over `ranges` of `0..len`, 0 elsewhere, on `device`.
fn indicator(ranges: impl IntoIterator<Item = Range<usize>>, len: usize, device: &Device) -> Tensor<1> {
    let mut v = vec![0.0f32; len];
    for r in ranges {
        v[r].fill(1.0);
    }
    Tensor::<1>::from_data(TensorData::new(v, [len]), device)
}

impl DeviceDense {
    /// Around `resident` (the model's parameters, `plan` its config and
    /// `frozen` the variables it does not train).
    pub fn new(resident: Resident, model: &Model, plan: &ModelPlan, frozen: &Frozen) -> Self {
        let (len, device) = (resident.len(), resident.device().clone());
        let specs = &model.params.specs;
        let l2 = (plan.l2_regularization > 0.0).then(|| {
            let ranges = specs.iter().filter(|s| s.l2).map(|s| s.range());
            (plan.l2_regularization, indicator(ranges, len, &device))
        });
        let dropout = plan
            .variational_dropout
            .filter(|_| !model.dropout_logits.is_empty())
            .map(|vd| {
                let ranges = model.dropout_logits.iter().map(|&i| specs[i].range());
                (vd.lambda, indicator(ranges, len, &device))
            });
        let trained = frozen.any().then(|| {
            let keep = indicator(frozen.trained_ranges(specs), len, &device);
            (keep.clone().greater_elem(0.5), keep)
        });
        DeviceDense {
            resident,
            l2,
            dropout,
            trained,
        }
    }

    /// Adds the dense regularizers to `g` (as `Dense::regularize`, over
    /// `rows` examples); their loss stays on the device until `norm`.
    pub fn regularize(&self, g: Tensor<1>, rows: f64) -> (Tensor<1>, Option<Tensor<1>>) {
        let w = &self.resident.params;
        let mut g = g;
        let mut losses = Vec::new();
        if let Some((l2, mask)) = &self.l2 {
            let kept = w.clone() * mask.clone();
            g = g + kept.clone().mul_scalar(*l2);
            losses.push((kept.clone() * kept).sum().mul_scalar(0.5 * l2));
        }
        if let Some((lambda, mask)) = &self.dropout {
            // EasyRec's `lambda / rows * Σ (1 - sigmoid(logit))`.
            let per_row = (f64::from(*lambda) / rows.max(1.0)) as f32;
            let rate = burn::tensor::activation::sigmoid(w.clone());
            let keep = rate.clone().neg().add_scalar(1.0);
            g = g - (rate * keep.clone() * mask.clone()).mul_scalar(per_row);
            losses.push((keep * mask.clone()).sum().mul_scalar(per_row));
        }
        (g, losses.into_iter().reduce(|a, b| a + b))
    }

    /// `g` with the frozen variables' values 0.
    pub fn clear_frozen(&self, g: Tensor<1>) -> Tensor<1> {
        match &self.trained {
            Some((_, keep)) => g * keep.clone(),
            None => g,
        }
    }

    /// The squared norm of `g` and the regularizers' loss (`regularize`'s),
    /// read back in one transfer.
    pub fn norm(&self, g: &Tensor<1>, reg: Option<Tensor<1>>) -> (f64, f64) {
        let sq = (g.clone() * g.clone()).sum();
        let read = read_all(std::iter::once(sq).chain(reg).collect());
        (f64::from(read[0]), read.get(1).map_or(0.0, |r| f64::from(*r)))
    }

    /// The update of `rule` from the gradient `g` (clipped already); the
    /// frozen values and their slots stay as they are.
    pub fn apply(&mut self, g: Tensor<1>, rule: &Rule) {
        let r = &mut self.resident;
        let slots = std::mem::take(&mut r.slots);
        let (w, new_slots) = rule.apply_tensors(r.params.clone(), g, slots.clone());
        match &self.trained {
            None => (r.params, r.slots) = (w, new_slots),
            Some((trained, _)) => {
                r.params = r.params.clone().mask_where(trained.clone(), w);
                r.slots = slots
                    .into_iter()
                    .zip(new_slots)
                    .map(|(old, new)| old.mask_where(trained.clone(), new))
                    .collect();
            }
        }
    }

    /// Waits for the device's queued work: a profile's phases time their
    /// own kernels this way, not the queueing of them.
    pub fn sync(&self) {
        if let Err(e) = self.resident.device().sync() {
            log::warn!("waiting for the device: {e:?}");
        }
    }

    /// Whether every parameter is finite (one value read back).
    pub fn finite(&self) -> bool {
        let w = &self.resident.params;
        // (Never empty: a model without dense parameters is not lent.)
        // 0 where finite, NaN where infinite or NaN: the sum says which.
        to_vec((w.clone() - w.clone()).sum())[0] == 0.0
    }
}
