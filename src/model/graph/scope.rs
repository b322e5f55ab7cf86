//! The helpers builders make layers with: dense layers, DNNs, batch,
//! layer and Dice normalizations, each adding its parameters (EasyRec's
//! names and initializers) to the stores and its ops to the graph.

use super::params::{Init, ParamStore};
use super::{Graph, NodeId, Op, LN_EPS};
use crate::config::model::backbone::Release;
use crate::config::model::{Activation, DnnSpec};
use crate::util::Rng;

/// How a dense layer's parameters are made: the kernel's initializer,
/// whether it takes part in l2_regularization, whether a bias follows.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub init: Init,
    pub l2: bool,
    pub bias: bool,
}

impl Kernel {
    /// EasyRec's `tf.layers.dense` with its kernel regularizer: glorot
    /// uniform, in l2_regularization, with a bias.
    pub const DENSE: Kernel = Kernel {
        init: Init::GlorotUniform,
        l2: true,
        bias: true,
    };

    /// Keras' `Dense` and `tf.layers.dense` without a kernel regularizer:
    /// glorot uniform, a bias, out of l2_regularization.
    pub const UNREGULARIZED: Kernel = Kernel {
        l2: false,
        ..Kernel::DENSE
    };
}

/// The parameter and buffer stores a builder adds to, with the generator
/// that initialises them.
pub struct Scope<'a> {
    pub params: &'a mut ParamStore,
    pub buffers: &'a mut ParamStore,
    pub rng: &'a mut Rng,
    /// Whose defaults a backbone's layers follow where EasyRec's releases
    /// differ (`Release`).
    pub release: Release,
}

impl Scope<'_> {
    /// A dense layer `act(x · W + b)` named `name/kernel`, `name/bias`.
    pub fn dense(&mut self, g: &mut Graph, x: NodeId, name: &str, units: usize, act: Activation) -> NodeId {
        self.layer(g, x, name, units, Kernel::DENSE, act)
    }

    /// `act(x · W (+ b))` with `units` columns, its kernel `name/kernel` made
    /// as `k` says and its bias `name/bias` (zeros) when `k.bias`.
    pub fn layer(&mut self, g: &mut Graph, x: NodeId, name: &str, units: usize, k: Kernel, act: Activation) -> NodeId {
        if act == Activation::Dice {
            let y = self.layer(g, x, name, units, k, Activation::Linear);
            return self.dice(g, y, name);
        }
        let w = self
            .params
            .add(&format!("{name}/kernel"), g.width(x), units, k.init, k.l2, self.rng);
        let b = k.bias.then(|| {
            self.params
                .add(&format!("{name}/bias"), 1, units, Init::Zeros, false, self.rng)
        });
        g.linear(x, self.params, w, b, act)
    }

    /// `layer` of `units` whose bias starts at `bias` everywhere (Keras'
    /// `Constant` bias initializer) rather than at zeros.
    pub fn layer_biased(
        &mut self,
        g: &mut Graph,
        x: NodeId,
        name: &str,
        (units, bias): (usize, f32),
        k: Kernel,
        act: Activation,
    ) -> NodeId {
        assert!(k.bias, "`{name}` has a bias to start");
        let y = self.layer(g, x, name, units, k, act);
        let b = self.params.by_name(&format!("{name}/bias")).expect("the layer's bias");
        self.params.slice_mut(b).fill(bias);
        y
    }

    /// The one-logit output layer `name` whose kernel EasyRec leaves out
    /// of l2_regularization (MultiTower's and DCN's `output`).
    pub fn unregularized_output(&mut self, g: &mut Graph, x: NodeId, name: &str, units: usize) -> NodeId {
        self.layer(g, x, name, units, Kernel::UNREGULARIZED, Activation::Linear)
    }

    /// EasyRec's DNN: per hidden layer dense -> batch norm -> activation ->
    /// dropout, layers named `name/dnn_i` (`name/dnn_i/bn`), as EasyRec
    /// names its variables. No layers pass `x` through.
    pub fn dnn(&mut self, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> NodeId {
        self.dnn_layers(g, x, name, spec).last().copied().unwrap_or(x)
    }

    /// `dnn`'s hidden layers' outputs, in order (EasyRec's
    /// `hidden_layer_feature_output`).
    pub fn dnn_layers(&mut self, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> Vec<NodeId> {
        self.dnn_layers_in(g, x, name, spec, true)
    }

    /// EasyRec's DNN built with `is_training=False` (EasyRec's MMoE layer
    /// builds its experts so, in training too): batch norms on their
    /// moving averages, which training leaves as they are, and no dropout.
    pub fn dnn_inference(&mut self, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> NodeId {
        self.dnn_layers_in(g, x, name, spec, false).last().copied().unwrap_or(x)
    }

    fn dnn_layers_in(&mut self, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec, training: bool) -> Vec<NodeId> {
        let mut x = x;
        let mut layers = Vec::with_capacity(spec.hidden_units.len());
        for (i, &units) in spec.hidden_units.iter().enumerate() {
            let lname = format!("{name}/dnn_{i}");
            x = if spec.use_bn {
                let z = self.layer(g, x, &lname, units, Kernel::DENSE, Activation::Linear);
                self.batch_norm_in(g, z, &format!("{lname}/bn"), spec.activation, training)
            } else {
                self.layer(g, x, &lname, units, Kernel::DENSE, spec.activation)
            };
            if training {
                x = g.dropout(x, spec.dropout.get(i).copied().unwrap_or(0.0));
            }
            layers.push(x);
        }
        layers
    }

    /// EasyRec's DNN whose last layer is a plain dense layer (no batch
    /// norm, no activation, no dropout): the hidden layers as `dnn`, the
    /// last one `name/dnn_<last>`. A tower's embedding, an attention's
    /// score.
    pub fn dnn_linear_last(&mut self, g: &mut Graph, x: NodeId, name: &str, spec: &DnnSpec) -> NodeId {
        let last = spec.hidden_units.len() - 1;
        let hidden = DnnSpec {
            hidden_units: spec.hidden_units[..last].to_vec(),
            dropout: spec.dropout.iter().take(last).copied().collect(),
            ..spec.clone()
        };
        let x = self.dnn(g, x, name, &hidden);
        let units = spec.hidden_units[last];
        self.dense(g, x, &format!("{name}/dnn_{last}"), units, Activation::Linear)
    }

    /// Dice after layer `name`: its `name/dice/alpha` (zeros) and the
    /// moving averages `name/dice/moving_mean`, `name/dice/moving_variance`.
    pub fn dice(&mut self, g: &mut Graph, x: NodeId, name: &str) -> NodeId {
        let d = g.width(x);
        let alpha = self
            .params
            .add(&format!("{name}/dice/alpha"), 1, d, Init::Zeros, false, self.rng);
        let buffers = &mut *self.buffers;
        let mean = buffers.add(&format!("{name}/dice/moving_mean"), 1, d, Init::Zeros, false, self.rng);
        let var = buffers.add(
            &format!("{name}/dice/moving_variance"),
            1,
            d,
            Init::Ones,
            false,
            self.rng,
        );
        g.push(Op::Dice { x, alpha, mean, var }, d)
    }

    /// A normalization's scale and offset, `name/gamma` (ones) and
    /// `name/beta` (zeros), `d` values each.
    fn scale_shift(&mut self, name: &str, d: usize) -> (usize, usize) {
        let p = &mut *self.params;
        let gamma = p.add(&format!("{name}/gamma"), 1, d, Init::Ones, false, self.rng);
        let beta = p.add(&format!("{name}/beta"), 1, d, Init::Zeros, false, self.rng);
        (gamma, beta)
    }

    /// Keras' layer normalization named `name/gamma`, `name/beta`.
    pub fn layer_norm(&mut self, g: &mut Graph, x: NodeId, name: &str) -> NodeId {
        let d = g.width(x);
        let (gamma, beta) = self.scale_shift(name, d);
        g.push(
            Op::LayerNorm {
                x,
                gamma,
                beta,
                eps: LN_EPS,
            },
            d,
        )
    }

    /// Layer normalization with epsilon `eps`, its scale and offset named
    /// `gamma` (ones) and `beta` (zeros).
    pub fn layer_norm_named(&mut self, g: &mut Graph, x: NodeId, (gamma, beta): (&str, &str), eps: f32) -> NodeId {
        let d = g.width(x);
        let p = &mut *self.params;
        let gamma = p.add(gamma, 1, d, Init::Ones, false, self.rng);
        let beta = p.add(beta, 1, d, Init::Zeros, false, self.rng);
        g.push(Op::LayerNorm { x, gamma, beta, eps }, d)
    }

    /// Batch norm named `name/gamma`, `name/beta`, `name/moving_mean`,
    /// `name/moving_variance`, then `act`.
    pub fn batch_norm(&mut self, g: &mut Graph, x: NodeId, name: &str, act: Activation) -> NodeId {
        self.batch_norm_in(g, x, name, act, true)
    }

    /// `batch_norm`; unless `training`, it normalises by its moving
    /// averages in training too and never updates them (TensorFlow's
    /// `batch_normalization(training=False)`).
    fn batch_norm_in(&mut self, g: &mut Graph, x: NodeId, name: &str, act: Activation, training: bool) -> NodeId {
        if act == Activation::Dice {
            let y = self.batch_norm_in(g, x, name, Activation::Linear, training);
            return self.dice(g, y, name);
        }
        let d = g.width(x);
        let (gamma, beta) = self.scale_shift(name, d);
        let buffers = &mut *self.buffers;
        let mean = buffers.add(&format!("{name}/moving_mean"), 1, d, Init::Zeros, false, self.rng);
        let var = buffers.add(&format!("{name}/moving_variance"), 1, d, Init::Ones, false, self.rng);
        g.push(
            Op::BatchNorm {
                x,
                gamma,
                beta,
                mean,
                var,
                act,
                examples_only: false,
                fixed: !training,
            },
            d,
        )
    }
}
