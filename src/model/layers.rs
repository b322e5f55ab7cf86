//! Building blocks on burn tensors: dense layers, batch norm and EasyRec's DNN.

use burn::tensor::activation::{relu, sigmoid, tanh};
use burn::tensor::{Device, Tensor, TensorData};

use super::params::{to_vec, Init, ParamStore};
use crate::config::model_plan::{Activation, DnnSpec};
use crate::util::Rng;

/// Per-step state of a forward pass.
pub struct Ctx<'a> {
    /// Trainable parameters, indexed like `ParamStore::specs`.
    pub p: &'a [Tensor<2>],
    /// Batch-norm moving statistics (not trained).
    pub buffers: &'a ParamStore,
    pub training: bool,
    pub device: &'a Device,
    /// Dropout masks come from here (seeded by step, so runs are repeatable).
    pub rng: Rng,
    /// Batch statistics seen in training.
    pub bn_stats: Vec<BnStats>,
}

impl Ctx<'_> {
    pub fn constant(&self, values: Vec<f32>, rows: usize, cols: usize) -> Tensor<2> {
        Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), self.device)
    }
}

#[derive(Debug, Clone)]
pub struct Linear {
    pub w: usize,
    pub b: Option<usize>,
    pub d_in: usize,
    pub d_out: usize,
}

impl Linear {
    pub fn new(p: &mut ParamStore, name: &str, d_in: usize, d_out: usize, bias: bool, rng: &mut Rng) -> Self {
        let w = p.add(&format!("{name}/kernel"), d_in, d_out, Init::GlorotUniform, true, rng);
        let b = bias.then(|| p.add(&format!("{name}/bias"), 1, d_out, Init::Zeros, false, rng));
        Linear { w, b, d_in, d_out }
    }

    /// `[batch, d_in] -> [batch, d_out]`
    pub fn forward(&self, ctx: &Ctx, x: Tensor<2>) -> Tensor<2> {
        let y = x.matmul(ctx.p[self.w].clone());
        match self.b {
            Some(b) => y + ctx.p[b].clone(),
            None => y,
        }
    }
}

/// TensorFlow's batch normalization (momentum 0.99, epsilon 1e-3).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    pub(crate) gamma: usize,
    pub(crate) beta: usize,
    pub(crate) mean: usize,
    pub(crate) var: usize,
}

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

impl BatchNorm {
    pub fn new(p: &mut ParamStore, buffers: &mut ParamStore, name: &str, d: usize, rng: &mut Rng) -> Self {
        BatchNorm {
            gamma: p.add(&format!("{name}/gamma"), 1, d, Init::Ones, false, rng),
            beta: p.add(&format!("{name}/beta"), 1, d, Init::Zeros, false, rng),
            mean: buffers.add(&format!("{name}/moving_mean"), 1, d, Init::Zeros, false, rng),
            var: buffers.add(&format!("{name}/moving_variance"), 1, d, Init::Ones, false, rng),
        }
    }

    pub fn forward(&self, ctx: &mut Ctx, x: Tensor<2>) -> Tensor<2> {
        let d = x.dims()[1];
        let (mean, var) = if ctx.training {
            let mean = x.clone().mean_dim(0);
            let centered = x.clone() - mean.clone();
            let var = (centered.clone() * centered).mean_dim(0);
            ctx.bn_stats.push(BnStats {
                mean_buffer: self.mean,
                var_buffer: self.var,
                mean: to_vec(mean.clone()),
                var: to_vec(var.clone()),
            });
            (mean, var)
        } else {
            (
                ctx.constant(ctx.buffers.slice(self.mean).to_vec(), 1, d),
                ctx.constant(ctx.buffers.slice(self.var).to_vec(), 1, d),
            )
        };
        let inv = var.add_scalar(BN_EPS).sqrt().recip();
        (x - mean) * inv * ctx.p[self.gamma].clone() + ctx.p[self.beta].clone()
    }
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

pub fn activate(a: Activation, x: Tensor<2>) -> Tensor<2> {
    match a {
        Activation::Relu => relu(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::Tanh => tanh(x),
        Activation::Linear => x,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct DnnLayer {
    pub(crate) linear: Linear,
    pub(crate) bn: Option<BatchNorm>,
    pub(crate) dropout: f32,
}

/// EasyRec's DNN: per hidden layer dense -> batch norm -> activation -> dropout.
#[derive(Debug, Clone)]
pub struct Dnn {
    pub(crate) layers: Vec<DnnLayer>,
    pub(crate) activation: Activation,
    pub d_out: usize,
}

impl Dnn {
    pub fn new(
        p: &mut ParamStore,
        buffers: &mut ParamStore,
        name: &str,
        spec: &DnnSpec,
        d_in: usize,
        rng: &mut Rng,
    ) -> Self {
        let mut layers = Vec::new();
        let mut d = d_in;
        for (i, &u) in spec.hidden_units.iter().enumerate() {
            let lname = format!("{name}/dnn_{i}");
            layers.push(DnnLayer {
                linear: Linear::new(p, &lname, d, u, true, rng),
                bn: spec
                    .use_bn
                    .then(|| BatchNorm::new(p, buffers, &format!("{lname}/batch_norm"), u, rng)),
                dropout: spec.dropout.get(i).copied().unwrap_or(0.0),
            });
            d = u;
        }
        Dnn {
            layers,
            activation: spec.activation,
            d_out: d,
        }
    }

    pub fn forward(&self, ctx: &mut Ctx, mut x: Tensor<2>) -> Tensor<2> {
        for l in &self.layers {
            x = l.linear.forward(ctx, x);
            if let Some(bn) = &l.bn {
                x = bn.forward(ctx, x);
            }
            x = activate(self.activation, x);
            if ctx.training && l.dropout > 0.0 {
                let [b, d] = x.dims();
                let keep = 1.0 - l.dropout;
                let mask: Vec<f32> = (0..b * d)
                    .map(|_| {
                        if ctx.rng.uniform() < keep as f64 {
                            1.0 / keep
                        } else {
                            0.0
                        }
                    })
                    .collect();
                x = x * ctx.constant(mask, b, d);
            }
        }
        x
    }
}
