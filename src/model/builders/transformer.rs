//! EasyRec's BERT-style transformer (`layers/multihead_cross_attention.py`)
//! on the model graph: the embedding post-processor (learned position
//! embeddings, layer norm, dropout) and the encoder (per layer: multi-head
//! self-attention with query, key and value layers, an output layer, add
//! and norm; an intermediate layer, an output layer, add and norm). A
//! sequence is `[batch * n, width]`, one row per position
//! (`Graph::unfold`).

use crate::config::model::encoder::{EncoderSpec, HiddenAct};
use crate::config::model::Activation;
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, Kernel, Keys, NodeId, Scope};

/// `tf.contrib.layers.layer_norm`'s epsilon, which EasyRec's transformer uses.
pub(super) const LN_EPS: f32 = 1e-12;

/// `layer_norm(x)` as `tf.contrib.layers.layer_norm` in scope `name`.
pub(super) fn layer_norm(g: &mut Graph, s: &mut Scope, x: NodeId, name: &str) -> NodeId {
    let (gamma, beta) = (format!("{name}/LayerNorm/gamma"), format!("{name}/LayerNorm/beta"));
    s.layer_norm_named(g, x, (&gamma, &beta), LN_EPS)
}

/// The encoder's activation: BERT's tanh-approximated GELU
/// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, ReLU, tanh or
/// swish `x sigmoid(x)`, from the graph's element-wise ops.
pub fn hidden_act(g: &mut Graph, x: NodeId, act: HiddenAct) -> NodeId {
    match act {
        HiddenAct::Relu => g.act(x, Activation::Relu),
        HiddenAct::Tanh => g.act(x, Activation::Tanh),
        HiddenAct::Swish => {
            let gate = g.act(x, Activation::Sigmoid);
            g.mul(x, gate)
        }
        HiddenAct::Gelu => {
            let x2 = g.mul(x, x);
            let x3 = g.mul(x2, x);
            let cubic = g.scale(x3, 0.044715, None);
            let inner = g.add(&[x, cubic]);
            let inner = g.scale(inner, (2.0 / std::f32::consts::PI).sqrt(), None);
            let t = g.act(inner, Activation::Tanh);
            let t = g.shift(t, 1.0);
            let half = g.scale(t, 0.5, None);
            g.mul(x, half)
        }
    }
}

/// `embedding_postprocessor` without token types, in variable scope
/// `scope`, over `x` (`[batch, n * width]`, positions side by side): the
/// position table `<scope>/position_embedding/<table>` (`[n, width]`, as
/// many positions as the sequence has) added, then layer norm and dropout.
/// Returns the rows, `[batch * n, width]`.
pub fn embedding_postprocessor(
    g: &mut Graph,
    s: &mut Scope,
    (x, n): (NodeId, usize),
    (scope, table): (&str, &str),
    (init_range, dropout): (f32, f32),
) -> NodeId {
    let name = format!("{scope}/position_embedding/{table}");
    let x = add_positions(g, s, (x, n), &name, init_range);
    let rows = g.unfold(x, n);
    let y = layer_norm(g, s, rows, scope);
    g.dropout(y, dropout)
}

/// `x` (`[batch, n * width]`, positions side by side) plus the position
/// table `name` (`[n, width]`, truncated normal of `init_range`): one row
/// of the table per position.
pub(super) fn add_positions(
    g: &mut Graph,
    s: &mut Scope,
    (x, n): (NodeId, usize),
    name: &str,
    init_range: f32,
) -> NodeId {
    let width = g.width(x) / n;
    let table = s
        .params
        .add(name, n, width, Init::TruncatedNormal(init_range), false, s.rng);
    g.bias(x, table)
}

/// `transformer_encoder` over `x` (`[batch * n, hidden]` rows), each row's
/// attention on the positions `keys` leaves it, layers named
/// `<name>_layer_<i>/...` as EasyRec's variable scopes are.
pub fn encoder(g: &mut Graph, s: &mut Scope, x: NodeId, keys: Keys, spec: &EncoderSpec, name: &str) -> NodeId {
    let k = Kernel {
        init: Init::TruncatedNormal(spec.init_range),
        ..Kernel::UNREGULARIZED
    };
    let lin = Activation::Linear;
    let head_size = spec.hidden / spec.heads;
    let scale = 1.0 / (head_size as f32).sqrt();
    let mut prev = x;
    for i in 0..spec.layers {
        let at = format!("{name}_layer_{i}");
        let q = s.layer(g, prev, &format!("{at}/attention/self/query"), spec.hidden, k, lin);
        let kk = s.layer(g, prev, &format!("{at}/attention/self/key"), spec.hidden, k, lin);
        let v = s.layer(g, prev, &format!("{at}/attention/self/value"), spec.hidden, k, lin);
        let ctx = g.attention((q, kk, v), (spec.heads, scale), keys);
        let out = s.layer(g, ctx, &format!("{at}/attention/output/dense"), spec.hidden, k, lin);
        let out = g.dropout(out, spec.hidden_dropout);
        let sum = g.add(&[out, prev]);
        let attended = layer_norm(g, s, sum, &format!("{at}/attention/output"));
        let mid = s.layer(
            g,
            attended,
            &format!("{at}/intermediate/dense"),
            spec.intermediate,
            k,
            lin,
        );
        let mid = hidden_act(g, mid, spec.act);
        let out = s.layer(g, mid, &format!("{at}/output/dense"), spec.hidden, k, lin);
        let out = g.dropout(out, spec.hidden_dropout);
        let sum = g.add(&[out, attended]);
        prev = layer_norm(g, s, sum, &format!("{at}/output"));
    }
    prev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::exec::{cpu::Cpu, Executor, Mode};
    use crate::model::graph::params::ParamStore;

    #[test]
    fn gelu_is_berts_tanh_approximation() {
        let mut g = Graph::default();
        let x = g.input(0, 5);
        let y = hidden_act(&mut g, x, HiddenAct::Gelu);
        let xs = vec![-3.0f32, -0.5, 0.0, 0.7, 2.5];
        let (p, b) = (ParamStore::default(), ParamStore::default());
        let inputs = [xs.clone()];
        let tape = Cpu::default().forward(&g, (&p, &b), &inputs, 1, Mode::Infer);
        for (got, x) in tape.value(y).iter().zip(&xs) {
            let x = *x as f64;
            let want = 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            assert!((*got as f64 - want).abs() < 1e-6, "gelu({x}) = {got}, want {want}");
        }
    }
}
