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
use crate::model::graph::params::read_all;
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
        sync(self.resident.device());
    }

    /// `finite_marker` of the parameters.
    pub fn finite_marker(&self) -> Tensor<1> {
        // (Never empty: a model without dense parameters is not lent.)
        finite_marker(&self.resident.params)
    }
}

/// Waits for `device`'s queued work (see `DeviceDense::sync`).
pub fn sync(device: &Device) {
    if let Err(e) = device.sync() {
        log::warn!("waiting for the device: {e:?}");
    }
}

/// `Σ t²`, a scalar on `t`'s device.
pub fn sum_of_squares<const D: usize>(t: &Tensor<D>) -> Tensor<1> {
    (t.clone() * t.clone()).sum()
}

/// A scalar on `w`'s device that is 0 when every value of `w` is finite
/// and NaN otherwise (`w - w` is NaN where `w` is infinite or NaN): a
/// finite check to read back with others.
pub fn finite_marker<const D: usize>(w: &Tensor<D>) -> Tensor<1> {
    (w.clone() - w.clone()).sum()
}

/// Scalars on a device (`[1]` each) read back in one transfer (on a GPU
/// each read is a round trip); a missing one reads 0.
pub fn read_scalars<const N: usize>(parts: [Option<Tensor<1>>; N]) -> [f64; N] {
    let read = read_all(parts.iter().flatten().cloned().collect());
    let mut values = read.into_iter();
    parts.map(|p| p.map_or(0.0, |_| f64::from(values.next().expect("one value a scalar"))))
}
