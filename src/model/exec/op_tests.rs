//! Op-level parity: every op of the model graph on the CPU executor
//! against burn's reference executor (values and autodiff gradients), both
//! through the `Executor` contract, and against central finite
//! differences, in training mode.

use super::burn::Burn;
use super::cpu::Cpu;
use super::{Executor, Mode};
use crate::config::model::{Activation, DnnSpec};
use crate::model::graph::augment::Augment;
use crate::model::graph::capsule;
use crate::model::graph::nary::Nary;
use crate::model::graph::params::{Init, ParamStore};
use crate::model::graph::{Contrast, Graph, Keys, NodeId, Op, Routing, Scope};
use crate::util::Rng;

const B: usize = 19;
/// The leading rows that are examples; the rest stand for sampled items
/// (which batch norms over the examples leave out of their statistics).
const EXAMPLES: usize = 15;

/// A small graph ending in the op under test, over two inputs of width 6.
struct Case {
    name: &'static str,
    graph: Graph,
    params: ParamStore,
    buffers: ParamStore,
    /// Whether finite differences apply (no ReLU kinks to step over).
    smooth: bool,
}

fn case(name: &'static str, smooth: bool, build: impl FnOnce(&mut Graph, &mut Scope, [NodeId; 2]) -> NodeId) -> Case {
    let (mut params, mut buffers, mut rng) = (ParamStore::default(), ParamStore::default(), Rng::new(3));
    let mut g = Graph::default();
    let x = [g.input(0, 6), g.input(1, 6)];
    let mut s = Scope {
        params: &mut params,
        buffers: &mut buffers,
        rng: &mut rng,
        release: Default::default(),
    };
    let out = build(&mut g, &mut s, x);
    assert_eq!(out.0, g.nodes.len() - 1, "{name}: the op under test comes last");
    // Non-trivial biases, gammas and betas (they start at 0 or 1).
    let mut r = Rng::new(17);
    for i in 0..params.specs.len() {
        if !params.specs[i].l2 {
            params
                .slice_mut(i)
                .iter_mut()
                .for_each(|v| *v += (r.uniform() - 0.5) as f32);
        }
    }
    Case {
        name,
        graph: g,
        params,
        buffers,
        smooth,
    }
}

fn cases() -> Vec<Case> {
    let tanh = Activation::Tanh;
    vec![
        case("linear+relu", false, |g, s, x| {
            s.dense(g, x[0], "l", 5, Activation::Relu)
        }),
        case("linear+sigmoid", true, |g, s, x| {
            s.dense(g, x[0], "l", 5, Activation::Sigmoid)
        }),
        case("linear no bias", true, |g, s, x| {
            let w = s.params.add("k", 6, 3, Init::GlorotUniform, true, s.rng);
            g.linear(x[1], s.params, w, None, Activation::Linear)
        }),
        // Past kernels::NARROW columns: gemm instead of the narrow sweeps.
        case("wide linear+sigmoid", true, |g, s, x| {
            s.dense(g, x[0], "l", 12, Activation::Sigmoid)
        }),
        // Wide and narrow layers adding into one input's gradient.
        case("linears sharing an input", true, |g, s, x| {
            let a = s.dense(g, x[0], "a", 12, tanh);
            let c = s.dense(g, x[0], "c", 4, Activation::Sigmoid);
            let d = s.dense(g, x[0], "d", 11, Activation::Linear);
            g.concat(&[a, c, d])
        }),
        // Readers of one input apart in the graph (one feeding another
        // layer before the input's gradient is whole), one of them unread.
        case("linears sharing an input, apart and unread", true, |g, s, x| {
            let a = s.dense(g, x[1], "a", 12, tanh);
            let _unread = s.dense(g, x[1], "u", 7, Activation::Relu);
            let a2 = s.dense(g, a, "a2", 5, tanh);
            let w = s.params.add("k", 6, 9, Init::GlorotUniform, true, s.rng);
            let c = g.linear(x[1], s.params, w, None, Activation::Sigmoid);
            g.concat(&[a2, c])
        }),
        case("batch norm+tanh", true, |g, s, x| s.batch_norm(g, x[0], "bn", tanh)),
        case("product logit", true, |g, _, x| {
            let (a, b) = (g.slice(x[0], 1, 1), g.slice(x[1], 4, 1));
            g.product_logit(a, b)
        }),
        case("batch norm over the examples", true, |g, s, x| {
            let y = s.batch_norm(g, x[0], "bn", tanh);
            if let Op::BatchNorm { examples_only, .. } = &mut g.nodes[y.0].op {
                *examples_only = true;
            }
            y
        }),
        case("batch norm on its moving averages", true, |g, s, x| {
            // The dropout rate is not applied: EasyRec's is_training=False.
            let spec = DnnSpec {
                hidden_units: vec![5],
                activation: tanh,
                use_bn: true,
                dropout: vec![0.5],
            };
            s.dnn_inference(g, x[0], "frozen", &spec)
        }),
        case("act", true, |g, _, x| g.act(x[0], tanh)),
        case("dice", true, |g, s, x| s.dice(g, x[0], "d")),
        case("linear then dice", true, |g, s, x| {
            s.dense(g, x[1], "l", 4, Activation::Dice)
        }),
        case("dropout", true, |g, _, x| g.dropout(x[0], 0.4)),
        case("max over tied blocks", false, |g, _, x| {
            // Every column's maximum twice: the gradient splits between them.
            let twice = g.concat(&[x[0], x[0]]);
            g.max_blocks(twice, 2)
        }),
        case("max over blocks", true, |g, _, x| {
            let both = g.concat(&[x[0], x[1]]);
            g.max_blocks(both, 4)
        }),
        case("variational dropout by feature", true, |g, s, x| {
            let p = s.params.add("logit_p", 1, 3, Init::GlorotUniformVector, false, s.rng);
            g.variational_dropout(x[0], s.params, p, vec![0, 0, 1, 1, 1, 2])
        }),
        case("variational dropout by column", true, |g, s, x| {
            let p = s.params.add("logit_p", 1, 6, Init::GlorotUniformVector, false, s.rng);
            g.variational_dropout(x[1], s.params, p, (0..6).collect())
        }),
        case("dnn with batch norm and dropout", false, |g, s, x| {
            let spec = DnnSpec {
                hidden_units: vec![7, 4],
                dropout: vec![0.3, 0.1],
                activation: Activation::Relu,
                use_bn: true,
            };
            s.dnn(g, x[0], "dnn", &spec)
        }),
        case("concat", true, |g, _, x| g.concat(&[x[1], x[0], x[1]])),
        case("slice", true, |g, _, x| g.slice(x[0], 2, 3)),
        case("add", true, |g, _, x| g.add(&[x[0], x[1], x[0]])),
        case("mul", true, |g, _, x| g.mul(x[0], x[1])),
        case("sum over blocks", true, |g, _, x| g.sum_blocks(x[0], 3)),
        case("fm", true, |g, _, x| g.fm(x[1], 3)),
        case("row sum", true, |g, _, x| g.row_sum(x[0])),
        case("bias", true, |g, s, x| {
            let b = s.params.add("b", 1, 6, Init::GlorotUniform, false, s.rng);
            let t = g.act(x[0], tanh);
            g.bias(t, b)
        }),
        case("dot", true, |g, _, x| {
            g.dot(&[x[0], x[1]], 2, vec![(0, 1), (0, 0), (2, 5), (3, 4), (1, 5)])
        }),
        // A vector in five pairs (its dot products run four side by side,
        // then one), of an odd width.
        case("dot, four pairs sharing a vector", true, |g, _, x| {
            g.dot(&[x[0], x[1]], 3, vec![(3, 0), (3, 1), (3, 2), (3, 3), (3, 1), (1, 0)])
        }),
        // Width 6: each gradient's elements four side by side, then two.
        case("dot, width 6", true, |g, _, x| {
            g.dot(&[x[0], x[1]], 6, vec![(0, 0), (1, 0), (1, 1)])
        }),
        case("cross", true, |g, s, x| {
            let w = s.params.add("w", 6, 1, Init::GlorotUniform, true, s.rng);
            let b = s.params.add("b", 1, 6, Init::Zeros, false, s.rng);
            let t = g.act(x[1], tanh);
            g.cross(x[0], t, w, b)
        }),
        // DCN's stack: the first layer's xl is x0, the next adds into x0's
        // gradient.
        case("cross layers over one input", true, |g, s, x| {
            let w1 = s.params.add("w1", 6, 1, Init::GlorotUniform, true, s.rng);
            let b1 = s.params.add("b1", 1, 6, Init::Zeros, false, s.rng);
            let w2 = s.params.add("w2", 6, 1, Init::GlorotUniform, true, s.rng);
            let b2 = s.params.add("b2", 1, 6, Init::Zeros, false, s.rng);
            let c1 = g.cross(x[0], x[0], w1, b1);
            g.cross(x[0], c1, w2, b2)
        }),
        case("softmax", true, |g, _, x| g.softmax(x[0])),
        case("layer norm", true, |g, s, x| {
            let t = s.layer_norm(g, x[0], "ln");
            // Off its initial gamma and beta, so their gradients are checked too.
            let t = g.act(t, tanh);
            s.layer_norm(g, t, "ln2")
        }),
        case("weighted sum of a gate", true, |g, s, x| {
            let gate = s.dense(g, x[0], "gate", 3, Activation::Linear);
            let gate = g.softmax(gate);
            let e1 = g.slice(x[1], 0, 2);
            let e2 = g.slice(x[0], 4, 2);
            let e3 = g.slice(x[1], 3, 2);
            g.weighted_sum(gate, &[e1, e2, e3])
        }),
        // A learned constant (UNITER's `cls_emb`, CMBF's `img_map_matrix`):
        // its parameter is trained though nothing below it is.
        case("bias over zeros", true, |g, s, x| {
            let b = s.params.add("b", 1, 6, Init::GlorotUniform, false, s.rng);
            let z = g.zeros(x[0], 6);
            let c = g.bias(z, b);
            g.mul(c, x[1])
        }),
        case("scale by a parameter of a constant", true, |g, s, x| {
            let w = s.params.add("w", 1, 1, Init::Ones, false, s.rng);
            let c = g.ones(x[0], 6);
            let c = g.scale(c, 0.5, Some(w));
            g.mul(c, x[1])
        }),
        case("zeros", true, |g, _, x| {
            let z = g.zeros(x[0], 6);
            g.add(&[z, x[1]])
        }),
        case("sub", true, |g, _, x| g.sub(x[0], x[1])),
        case("tile, unfold and fold", true, |g, _, x| {
            let k = g.slice(x[0], 1, 2);
            let k = g.tile(k, 3);
            let h = g.unfold(x[1], 3);
            let p = g.mul(k, h);
            let p = g.act(p, tanh);
            g.fold(p, 3)
        }),
        case("l2 normalisation", true, |g, _, x| {
            let t = g.act(x[0], tanh);
            g.l2_normalize(t)
        }),
        case("scale by a constant and a parameter's magnitude", true, |g, s, x| {
            // Ones, then moved by up to ±0.5 like every unregularised parameter.
            let w = s.params.add("sim_w", 1, 1, Init::Ones, false, s.rng);
            let y = g.scale(x[1], 0.5, Some(w));
            g.scale(y, -2.0, None)
        }),
        case("leaky relu", false, |g, _, x| g.act(x[1], Activation::LeakyRelu)),
        case("linear+elu", true, |g, s, x| s.dense(g, x[0], "l", 5, Activation::Elu)),
        // SELU's slope jumps at 0 (SCALE above, SCALE * ALPHA just below).
        case("linear+selu", false, |g, s, x| {
            s.dense(g, x[0], "l", 5, Activation::Selu)
        }),
        case("softplus", true, |g, _, x| g.act(x[1], Activation::Softplus)),
        case("grouped linear layers, sines and cosines", true, |g, s, x| {
            // 3 blocks of 2 columns, each its own [2, 2] layer with bias,
            // then per block [sin, cos], then 3 layers of [4, 1].
            let w = s.params.add("w", 6, 2, Init::Normal(0.7), true, s.rng);
            let b = s.params.add("b", 1, 6, Init::Zeros, false, s.rng);
            let y = g.grouped_linear(x[0], s.params, w, Some(b), 3);
            let y = g.sin_cos(y, 3);
            let w2 = s.params.add("w2", 12, 1, Init::Uniform(0.8), true, s.rng);
            let y = g.grouped_linear(y, s.params, w2, None, 3);
            g.shift(y, 0.3)
        }),
        // Not smooth: the values are cast to integers (nothing flows back
        // to them). Times 37, the inputs hold negative values (read as
        // 32-bit two's complement: every position) and small ones.
        case("N-ary embeddings, summed and averaged", false, |g, s, x| {
            let y = g.scale(x[0], 37.0, None);
            let sum = Nary::new(vec![2, 3], false);
            let rows = 6 * sum.vocab();
            let t = s
                .params
                .add("nary/embed_table", rows, 5, Init::GlorotUniform, false, s.rng);
            let a = g.nary_embed(y, s.params, t, sum, (0, 2));
            let b = g.nary_embed(y, s.params, t, Nary::new(vec![2, 3], true), (2, 3));
            let both = g.concat(&[a, b]);
            g.act(both, tanh)
        }),
        case("transpose and outer product", true, |g, _, x| {
            let t = g.transpose(x[0], 2);
            let h = g.slice(x[1], 1, 3);
            g.outer(t, h)
        }),
        case("multi-head self-attention", true, |g, s, x| {
            // 3 positions of width 4 per batch row, 2 heads of 3 query and
            // 2 value columns each.
            let both = g.concat(&[x[0], x[1]]);
            let t = g.unfold(both, 3);
            let mut proj = |name: &str, w: usize| {
                let k = s.params.add(name, 4, w, Init::GlorotUniform, true, s.rng);
                g.linear(t, s.params, k, None, Activation::Linear)
            };
            let (q, k, v) = (proj("q", 6), proj("k", 6), proj("v", 4));
            let a = g.attention((q, k, v), (2, 1.7), Keys::All);
            g.fold(a, 3)
        }),
        case("masked single-head attention, a constant shift", true, |g, s, x| {
            // 4 positions of width 3; keys live below len (the sigmoid's
            // sum over x[0]'s columns, less 2.5: a few rows mask every key).
            let sig = g.act(x[0], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let len = g.shift(len, -2.5);
            let both = g.concat(&[x[0], x[1]]);
            let t = g.unfold(both, 4);
            let mut proj = |name: &str| s.dense(g, t, name, 3, Activation::Linear);
            let (q, k, v) = (proj("q"), proj("k"), proj("v"));
            let a = g.attention((q, k, v), (1, 1.0), Keys::Live(len));
            g.fold(a, 4)
        }),
        case("cross attention over keys masked as EasyRec's BERT", true, |g, s, x| {
            // 2 queries of width 3 (x[0]) over 4 keys of width
            // 3 (x[0] and x[1]): the first key always live, the other three
            // below len (a few rows have none of them), masked keys' scores
            // lowered by 10000.
            let sig = g.act(x[0], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let len = g.shift(len, -2.5);
            let one = g.ones(len, 1);
            let prefix = g.prefix_mask(len, 3);
            let mask = g.concat(&[one, prefix]);
            let from = g.unfold(x[0], 2);
            let both = g.concat(&[x[0], x[1]]);
            let to = g.unfold(both, 4);
            let q = s.dense(g, from, "q", 4, Activation::Linear);
            let k = s.dense(g, to, "k", 4, Activation::Linear);
            let v = s.dense(g, to, "v", 2, Activation::Linear);
            let a = g.attention((q, k, v), (2, 0.5), Keys::Mask(mask));
            g.fold(a, 2)
        }),
        case("l2 normalisation of rows that are zero", false, |g, s, x| {
            // Half the rows are 0 (a ReLU of one column): their norm is
            // floored and their gradient the incoming one over its root.
            let c = g.slice(x[0], 0, 1);
            let r = g.act(c, Activation::Relu);
            let wide = s.dense(g, x[1], "w", 3, Activation::Linear);
            let zeroed = g.outer(r, wide);
            g.l2_normalize(zeroed)
        }),
        case("squash", true, |g, _, x| {
            let t = g.unfold(x[0], 2);
            let y = g.squash(t, 0.5, 1.3);
            g.fold(y, 2)
        }),
        case("capsule routing, pooling and squash", false, |g, s, x| {
            // 8 positions of width 3 projected to 4, routed into at most 3
            // capsules: a length from x[0] (-2..10, so some rows have none,
            // some every position) gives 1 or 2 of them. The routing is a
            // constant, so finite differences do not apply.
            let all = g.concat(&[x[0], x[1], x[1], x[0]]);
            let t = g.unfold(all, 8);
            let w = s.params.add("capsule/S", 3, 4, Init::GlorotUniform, false, s.rng);
            let hi = g.linear(t, s.params, w, None, Activation::Linear);
            let sig = g.act(x[0], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let len = g.scale(len, 2.0, None);
            let len = g.shift(len, -2.0);
            let count = capsule::Count {
                max_k: 3,
                positions: 8,
                constant: false,
            };
            let caps = g.capsules(len, count);
            let init = capsule::eval_logits(8, 3, 1.0);
            let routing = Routing {
                max_k: 3,
                iters: 3,
                scale: 20.0,
                stddev: 1.0,
                init,
            };
            let r = g.capsule_routing((hi, len, caps), routing);
            let seq = g.fold(hi, 8);
            let pooled: Vec<NodeId> = (0..3)
                .map(|c| {
                    let wc = g.slice(r, c * 8, 8);
                    g.attn_pool(wc, seq)
                })
                .collect();
            let all = g.concat(&pooled);
            let rows = g.unfold(all, 3);
            let sq = g.squash(rows, 1.0, 1.0);
            g.fold(sq, 3)
        }),
        case("interest similarity of live interests", true, |g, s, x| {
            // 3 interests of width 4 from both inputs, 1 to 3 of them live
            // (a count from x[0]), normalised and masked as MIND's.
            let all = g.concat(&[x[0], x[1]]);
            let rows = g.unfold(all, 3);
            let rows = s.dense(g, rows, "w", 4, Activation::Tanh);
            let n = g.l2_normalize(rows);
            let sig = g.act(x[0], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let upto = g.prefix_mask(len, 3);
            let caps = g.row_sum(upto);
            let live = g.prefix_mask(caps, 3);
            let live = g.unfold(live, 3);
            let n = g.outer(live, n);
            let n = g.fold(n, 3);
            g.interest_similarity(n, caps, 3)
        }),
        case("target attention over a masked sequence", true, |g, s, x| {
            // A sequence of 6 positions of width 1 (x[1]), its length from
            // x[0] (fractional: position k is live where k < len), the key
            // x[0]'s first column.
            let sig = g.act(x[0], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let key = g.slice(x[0], 0, 1);
            let k = g.tile(key, 6);
            let h = g.unfold(x[1], 6);
            let (d, m) = (g.sub(k, h), g.mul(k, h));
            let din = g.concat(&[k, h, d, m]);
            let z = s.dense(g, din, "att/dnn_0", 3, Activation::Sigmoid);
            let z = s.dense(g, z, "att/dnn_1", 1, Activation::Linear);
            let scores = g.fold(z, 6);
            let w = g.masked_softmax(scores, len);
            g.attn_pool(w, x[1])
        }),
        case("sequence augmentation", true, |g, s, x| {
            // x[0] as 3 positions of width 2, 0 to 3 of them live (a
            // whole count from x[1]); every method drawn among the rows.
            let sig = g.act(x[1], Activation::Sigmoid);
            let len = g.row_sum(sig);
            let upto = g.prefix_mask(len, 3);
            let len = g.row_sum(upto);
            let mask = s.params.add("aug/mask", 1, 2, Init::GlorotUniform, false, s.rng);
            let t = g.act(x[0], tanh);
            let aug = Augment {
                crop: 0.5,
                mask: 0.5,
                reorder: 0.7,
            };
            g.seq_augment(t, len, (&*s.params, mask), aug)
        }),
        case("nce loss", true, |g, s, x| {
            let a = s.dense(g, x[0], "a", 4, tanh);
            let b = s.dense(g, x[1], "b", 4, tanh);
            g.contrastive(a, b, Contrast::Nce { t: 0.5 })
        }),
        case("info nce loss", true, |g, s, x| {
            let a = s.dense(g, x[0], "a", 4, tanh);
            let b = g.act(x[1], tanh);
            let b = g.slice(b, 1, 4);
            g.contrastive(a, b, Contrast::InfoNce { t: 0.3 })
        }),
    ]
}

fn inputs(seed: u64) -> Vec<Vec<f32>> {
    let mut r = Rng::new(seed);
    (0..2)
        .map(|_| (0..B * 6).map(|_| r.normal() as f32).collect())
        .collect()
}

/// `Σ r · y` of the last node on the CPU executor, in training mode with
/// a fixed dropout generator.
fn objective(c: &Case, params: &ParamStore, x: &[Vec<f32>], r: &[f32]) -> f64 {
    let out = NodeId(c.graph.nodes.len() - 1);
    train_pass(c, &Cpu::default(), params, x, |t, _| {
        t.value(out).iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum()
    })
}

/// `then` on the tape of a training-mode pass of `c` on `exec` with
/// `params` (the same dropout draws on every executor) and its batch
/// norms' statistics.
fn train_pass<T>(
    c: &Case,
    exec: &dyn Executor,
    params: &ParamStore,
    x: &[Vec<f32>],
    then: impl FnOnce(&dyn super::Tape, Vec<crate::model::graph::BnStats>) -> T,
) -> T {
    let mut rng = Rng::new(5);
    let mut stats = Vec::new();
    let mode = Mode::Train {
        rng: &mut rng,
        stats: &mut stats,
        examples: EXAMPLES,
    };
    let tape = exec.forward(&c.graph, (params, &c.buffers), x, B, mode);
    then(&*tape, stats)
}

fn near(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol + tol * 10.0 * b.abs()
}

/// What one executor gives for a case: the output, the parameters' and
/// the inputs' gradients, and the batch norms' statistics.
type Run = (Vec<f32>, Vec<f32>, Vec<Vec<f32>>, Vec<crate::model::graph::BnStats>);

/// A case through the contract on `exec`, in training mode with the same
/// dropout draws on every executor, backward from `r`.
fn run_case(c: &Case, exec: &dyn Executor, x: &[Vec<f32>], r: &[f32]) -> Run {
    let out = NodeId(c.graph.nodes.len() - 1);
    let needs = c.graph.needs_grad(&[true, true]);
    train_pass(c, exec, &c.params, x, |tape, stats| {
        let mut dense = vec![0.0f32; c.params.values.len()];
        let dx = tape.backward(&c.params, vec![(out, r.to_vec())], &needs, &mut dense);
        (tape.value(out).to_vec(), dense, dx, stats)
    })
}

/// The seeds of a case's output.
fn seeds(c: &Case) -> Vec<f32> {
    let width = c.graph.width(NodeId(c.graph.nodes.len() - 1));
    let mut rr = Rng::new(21);
    (0..B * width).map(|_| rr.normal() as f32).collect()
}

/// `got` against `want` (the reference) value by value: outputs, every
/// parameter's gradient, every input's.
fn assert_runs_near(c: &Case, (y, dense, dx, stats): &Run, (yr, dense_r, dx_r, stats_r): &Run, tol: f32, who: &str) {
    assert_eq!(stats_r.len(), stats.len(), "{}: batch norms", c.name);
    for (s, sr) in stats.iter().zip(stats_r) {
        assert_eq!(
            (s.mean_buffer, s.var_buffer),
            (sr.mean_buffer, sr.var_buffer),
            "{}: buffers",
            c.name
        );
        for (a, b) in s.mean.iter().chain(&s.var).zip(sr.mean.iter().chain(&sr.var)) {
            assert!(
                near(*a, *b, tol),
                "{}: batch statistic {who} {a} vs reference {b}",
                c.name
            );
        }
    }
    for (a, b) in y.iter().zip(yr) {
        assert!(near(*a, *b, tol), "{}: value {who} {a} vs reference {b}", c.name);
    }
    for spec in &c.params.specs {
        for (k, (a, b)) in dense[spec.range()].iter().zip(&dense_r[spec.range()]).enumerate() {
            assert!(
                near(*a, *b, tol),
                "{}: d/d {}[{k}] {who} {a} vs reference {b}",
                c.name,
                spec.name
            );
        }
    }
    for (gi, want) in dx_r.iter().enumerate() {
        for (k, (a, b)) in dx[gi].iter().zip(want).enumerate() {
            assert!(
                near(*a, *b, tol),
                "{}: d/d input {gi}[{k}] {who} {a} vs reference {b}",
                c.name
            );
        }
    }
}

/// Every op on the GPU executor (lavapipe where there is no GPU) against
/// the CPU executor.
#[cfg(feature = "gpu")]
#[test]
fn every_op_matches_on_the_gpu() {
    let gpu = super::burn::Burn::gpu(0).expect("a Vulkan adapter (lavapipe: mesa-vulkan-drivers)");
    for c in cases() {
        let x = inputs(9);
        let r = seeds(&c);
        let cpu = run_case(&c, &Cpu::default(), &x, &r);
        let on_gpu = run_case(&c, &gpu, &x, &r);
        assert_runs_near(&c, &on_gpu, &cpu, 1e-5, "gpu");
    }
}

#[test]
fn every_op_matches_burn_and_finite_differences() {
    for c in cases() {
        let x = inputs(9);
        let r = seeds(&c);

        // Both executors through the contract, with the same dropout draws.
        let run = |exec: &dyn Executor| run_case(&c, exec, &x, &r);
        let (y, dense, dx, stats) = run(&Cpu::default());
        let (yr, dense_r, dx_r, stats_r) = run(&Burn::reference());
        // Timing its ops changes nothing the executor computes, and every
        // matrix product is counted at 2·m·k·n FLOPs.
        let profile = std::sync::Arc::new(crate::profile::Profile::default());
        let (yp, dense_p, dx_p, _) = run(&Cpu::profiled(profile.clone()));
        assert!(yp == y && dense_p == dense && dx_p == dx, "{}: profiled", c.name);
        let timed = profile.entries();
        assert!(!timed.is_empty(), "{}: nothing timed", c.name);
        if c.name == "linear no bias" {
            // x[1] (width 6) to 3 columns, and backward its dW.
            let fwd: f64 = timed
                .iter()
                .filter(|e| e.name.starts_with("fwd x·W"))
                .map(|e| e.flops)
                .sum();
            assert_eq!(fwd, 2.0 * (B * 6 * 3) as f64, "{}: {timed:?}", c.name);
            let dw: f64 = timed
                .iter()
                .filter(|e| e.name.starts_with("bwd dW"))
                .map(|e| e.flops)
                .sum();
            assert_eq!(dw, fwd, "{}: {timed:?}", c.name);
        }
        let fast = (y, dense, dx, stats);
        assert_runs_near(&c, &fast, &(yr, dense_r, dx_r, stats_r), 1e-5, "cpu");
        let (_, dense, dx, _) = fast;
        assert!(
            dense.iter().chain(dx.iter().flatten()).any(|g| *g != 0.0),
            "{}: some gradient flows",
            c.name
        );

        // Central differences on inputs and parameters.
        if !c.smooth {
            continue;
        }
        let eps = 1e-2f32;
        let check = |numeric: f64, analytic: f32, what: String| {
            assert!(
                (numeric - analytic as f64).abs() <= 2e-3 + 2e-2 * (analytic as f64).abs(),
                "{}: {what}: numeric {numeric} vs analytic {analytic}",
                c.name
            );
        };
        for gi in 0..2 {
            for k in (0..B * 6).step_by(7) {
                let mut xp = x.clone();
                xp[gi][k] += eps;
                let up = objective(&c, &c.params, &xp, &r);
                xp[gi][k] -= 2.0 * eps;
                let down = objective(&c, &c.params, &xp, &r);
                check((up - down) / (2.0 * eps as f64), dx[gi][k], format!("input {gi}[{k}]"));
            }
        }
        for i in (0..c.params.values.len()).step_by(3) {
            let mut pp = c.params.clone();
            pp.values[i] += eps;
            let up = objective(&c, &pp, &x, &r);
            pp.values[i] -= 2.0 * eps;
            let down = objective(&c, &pp, &x, &r);
            check((up - down) / (2.0 * eps as f64), dense[i], format!("parameter {i}"));
        }
    }
}
