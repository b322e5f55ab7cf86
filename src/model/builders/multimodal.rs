//! EasyRec's multi-modal models on the model graph, over the feature groups
//! `image`, `general`, `text` (its sequences unpooled) and `other`, with
//! the blocks of EasyRec's `layers/multihead_cross_attention.py`.
//!
//! CMBF (`layers/cmbf.py`): an image tower (the `image` group's features as
//! positions, projected, through a transformer encoder when it has layers),
//! a text tower (the `general` group's features and each sequence of the
//! `text` group as positions, token-type and position embeddings on the
//! sequences, a transformer encoder whose attention skips padding), cross
//! attention between them, the image positions averaged and the text
//! sequences mean-pooled, the `other` group (through its DNN) beside them.
//! Uniter (`layers/uniter.py`): one transformer encoder over all of them
//! (`uniter`). As a model, either tower goes on through `final_dnn` and
//! `output`; DBMTL takes it as its shared bottom.
//!
//! Variables are named as EasyRec's scopes name them. The position tables
//! hold as many positions as the sequence keeps (`max_seq_len`) where
//! EasyRec's hold `max_position_embeddings` of which the model reads as
//! many: an EasyRec checkpoint's table is read from its first rows
//! (`names::leading_rows`).

use anyhow::bail;

use super::transformer::{self, LN_EPS};
use crate::config::model::encoder::{EncoderSpec, HiddenAct};
use crate::config::model::multimodal::{Cmbf, Tower, Uniter};
use crate::config::model::{Activation, DnnSpec};
use crate::model::graph::params::Init;
use crate::model::graph::{Graph, Kernel, Keys, NodeId, Scope};
use crate::model::layout::GroupLayout;

/// `initializer_range` of EasyRec's attention layers and embedding tables.
const INIT_RANGE: f32 = 0.02;

/// Positions `[batch * n, width]`, `n` per batch row.
#[derive(Clone, Copy)]
struct Rows {
    x: NodeId,
    n: usize,
}

/// The text tower's positions: the general features' first, then each
/// sequence's (`(length, positions)`), and the mask over them when there
/// are sequences (`[batch, n]`, 1 on the general features and below each
/// sequence's length).
struct Text {
    rows: Rows,
    general: usize,
    seqs: Vec<(NodeId, usize)>,
    mask: Option<NodeId>,
}

/// The groups a multi-modal tower reads, each with its input.
struct Groups<'a> {
    image: Option<(&'a GroupLayout, NodeId)>,
    general: Option<(&'a GroupLayout, NodeId)>,
    text: Option<(&'a GroupLayout, NodeId)>,
    other: Option<NodeId>,
}

/// The tower's output over the groups `groups` (read as `xs`).
pub fn tower(
    t: &Tower,
    (groups, xs): (&[GroupLayout], &[NodeId]),
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<NodeId> {
    let find = |name: &str| crate::model::layout::named_group(groups, name).map(|i| (&groups[i], xs[i]));
    let gs = Groups {
        image: find("image"),
        general: find("general"),
        text: find("text"),
        other: find("other").map(|o| o.1),
    };
    if gs.image.is_none() && gs.general.is_none() && gs.text.is_none() && gs.other.is_none() {
        bail!("a multi-modal tower needs one of the feature groups image, text, general and other");
    }
    if let Some((l, _)) = gs.text {
        if l.seq.is_empty() {
            bail!("the multi-modal tower's `text` group has no sequence features");
        }
        let dims: Vec<usize> = l.seq.iter().map(|sl| sl.hist[0].1).collect();
        if dims.iter().any(|&d| d != dims[0]) {
            bail!("the multi-modal tower requires that all `text` feature dimensions be consistent; they are {dims:?}");
        }
    }
    match t {
        Tower::Cmbf(c) => cmbf(c, &gs, g, s),
        Tower::Uniter(u) => uniter(u, &gs, g, s),
    }
}

/// The `other` group, through `other_dnn` when given.
fn other_features(gs: &Groups, dnn: Option<&DnnSpec>, g: &mut Graph, s: &mut Scope) -> Option<NodeId> {
    gs.other.map(|o| match dnn {
        Some(d) => s.dnn(g, o, "other_dnn", d),
        None => o,
    })
}

fn cmbf(c: &Cmbf, gs: &Groups, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let img = gs.image.map(|i| image_tower(c, i, g, s)).transpose()?;
    let txt = text_tower(c, gs.general, gs.text, g, s)?;
    let mut all = Vec::new();
    match (img, &txt) {
        (Some(img), Some(txt)) => {
            let (left, right) = cross_tower(c, img, txt, g, s);
            all.push(mean_rows(g, left));
            all.push(merge_text(g, right, txt));
        }
        (Some(img), None) => all.push(mean_rows(g, img)),
        (None, Some(txt)) => all.push(merge_text(g, txt.rows, txt)),
        (None, None) => {}
    }
    all.extend(other_features(gs, c.other_dnn.as_ref(), g, s));
    Ok(g.concat(&all))
}

/// Uniter (`layers/uniter.py`): the `[CLS]` embedding `cls_emb`, the
/// image's features, the general features and each text sequence as
/// positions (each kind through an embedding post-processor: token types
/// when there is more than one kind or feature, position embeddings on the
/// image and the sequences), one transformer encoder `uniter` over them
/// skipping the sequences' padding; the `[CLS]` position's output, then
/// the `other` group's features.
fn uniter(u: &Uniter, gs: &Groups, g: &mut Graph, s: &mut Scope) -> anyhow::Result<NodeId> {
    let other = other_features(gs, u.other_dnn.as_ref(), g, s);
    let like = [gs.image, gs.general, gs.text]
        .into_iter()
        .flatten()
        .next()
        .map(|p| p.1);
    let Some(like) = like else {
        return Ok(other.expect("a tower has a group"));
    };
    let hidden = u.encoder.hidden;
    let dropout = u.encoder.hidden_dropout;
    let image = gs
        .image
        .map(|(l, x)| positions_of(l, x, g).map(|(n, _)| (x, n)))
        .transpose()?;
    let n_text = gs.text.map_or(0, |(l, _)| l.seq.len());
    let n_image = image.map_or(0, |i| i.1);
    let kinds = [gs.image.is_some(), gs.general.is_some(), gs.text.is_some()];
    let token_types = kinds.iter().filter(|k| **k).count() > 1 || n_text > 1 || n_image > 1;
    let vocab = n_text + usize::from(gs.image.is_some()) + usize::from(gs.general.is_some());
    let mut post = PostProcessor::new(token_types.then_some(vocab), (u.max_positions, &u.path), hidden, s);
    // Positions and their masks, `[CLS]` first.
    let zeros = g.zeros(like, hidden);
    let cls = s.params.add("cls_emb", 1, hidden, Init::GlorotUniform, false, s.rng);
    let mut blocks = vec![g.bias(zeros, cls)];
    let mut masks = vec![g.ones(like, 1)];
    let mut n = 1;
    if let Some((x, m)) = image {
        let rows = g.unfold(x, m);
        let rows = project(g, s, rows, "img_projection", hidden);
        let rows = post.apply(
            g,
            s,
            Rows { x: rows, n: m },
            (0, Some("img_position_embeddings")),
            dropout,
        )?;
        blocks.push(g.fold(rows, m));
        masks.push(g.ones(like, m));
        n += m;
    }
    let mut token = usize::from(image.is_some());
    if let Some((l, x)) = gs.general {
        let (m, _) = positions_of(l, x, g)?;
        let rows = g.unfold(x, m);
        let rows = project(g, s, rows, "txt_projection", hidden);
        let rows = post.apply(g, s, Rows { x: rows, n: m }, (token, None), dropout)?;
        blocks.push(g.fold(rows, m));
        masks.push(g.ones(like, m));
        n += m;
        token += 1;
    }
    if let Some((l, x)) = gs.text {
        for i in 0..l.seq.len() {
            let at = (token + i, "txt_position_embeddings");
            let (flat, len, m) = post.text_sequence((g, s), (l, x), i, at, (hidden, dropout))?;
            blocks.push(flat);
            masks.push(g.prefix_mask(len, m));
            n += m;
        }
    }
    let all = g.concat(&blocks);
    let rows = g.unfold(all, n);
    let mask = g.concat(&masks);
    let out = transformer::encoder(g, s, rows, Keys::Mask(mask), &u.encoder, "uniter");
    let flat = g.fold(out, n);
    let cls = g.slice(flat, 0, hidden);
    Ok(match other {
        Some(o) => g.concat(&[cls, o]),
        None => cls,
    })
}

/// A group's features as positions: `(count, width)` of its features, which
/// the multi-modal towers require to be equally wide.
fn positions_of(l: &GroupLayout, x: NodeId, g: &Graph) -> anyhow::Result<(usize, usize)> {
    let cols = l.feature_columns();
    let d = cols.first().map_or(0, |c| c.1);
    if d == 0 || cols.iter().any(|c| c.1 != d) || g.width(x) != cols.len() * d {
        let widths: Vec<usize> = cols.iter().map(|c| c.1).collect();
        bail!(
            "the multi-modal tower requires that all `{}` feature dimensions be consistent; they are {widths:?}",
            l.name
        );
    }
    Ok((cols.len(), d))
}

/// A transformer encoder of EasyRec's CMBF: `multi_head_num` heads, an
/// intermediate layer four times as wide, GELU.
fn encoder_spec(c: &Cmbf, hidden: usize, layers: usize, tower: &str) -> anyhow::Result<EncoderSpec> {
    if hidden == 0 || !hidden.is_multiple_of(c.heads) {
        bail!(
            "{}.{tower}_head_size: the {tower} tower is {hidden} wide (head size times its heads), \
             not a positive multiple of multi_head_num ({})",
            c.path,
            c.heads
        );
    }
    Ok(EncoderSpec {
        hidden,
        layers,
        heads: c.heads,
        intermediate: 4 * hidden,
        act: HiddenAct::Gelu,
        hidden_dropout: c.hidden_dropout,
        init_range: INIT_RANGE,
    })
}

/// `rows` through the dense layer `name` to `hidden` columns unless already
/// as wide (`tf.layers.dense` without a regularizer).
fn project(g: &mut Graph, s: &mut Scope, rows: NodeId, name: &str, hidden: usize) -> NodeId {
    if g.width(rows) == hidden {
        return rows;
    }
    s.layer(g, rows, name, hidden, Kernel::UNREGULARIZED, Activation::Linear)
}

/// `image_self_attention_tower`.
fn image_tower(c: &Cmbf, (l, x): (&GroupLayout, NodeId), g: &mut Graph, s: &mut Scope) -> anyhow::Result<Rows> {
    let (n, d) = positions_of(l, x, g)?;
    let im = c.image;
    if im.layers == 0 {
        let hidden = c.heads * c.cross_head_sizes.0;
        let rows = g.unfold(x, n);
        let x = project(g, s, rows, "img_projection", hidden);
        return Ok(Rows { x, n });
    }
    let spec = encoder_spec(c, im.hidden, im.layers, "image")?;
    let rows = if n > 1 {
        // Video frames or regions: a position each.
        let rows = g.unfold(x, n);
        Rows {
            x: project(g, s, rows, "img_projection", im.hidden),
            n,
        }
    } else if im.patches > 1 {
        if !d.is_multiple_of(im.patches) {
            bail!(
                "{}.image_feature_patch_num: the image feature's {d} values do not split into {} patches",
                c.path,
                im.patches
            );
        }
        let rows = g.unfold(x, im.patches);
        Rows {
            x: project(g, s, rows, "img_projection", im.hidden),
            n: im.patches,
        }
    } else {
        // Each of the (projected) image's `f` values times a vector of its
        // own, `img_map_matrix` `[1, f, hidden]`.
        let f = im.feature_dim;
        if f == 0 {
            bail!(
                "{}.image_feature_dim: a single image feature without patches needs it above 0",
                c.path
            );
        }
        let y = project(g, s, x, "img_projection", f);
        let m = s
            .params
            .add("img_map_matrix", f, im.hidden, Init::GlorotUniform, false, s.rng);
        let ones = g.ones(y, im.hidden);
        let each = g.outer(y, ones);
        let zeros = g.zeros(y, f * im.hidden);
        let map = g.bias(zeros, m);
        let mapped = g.mul(each, map);
        Rows {
            x: g.unfold(mapped, f),
            n: f,
        }
    };
    let x = transformer::encoder(g, s, rows.x, Keys::All, &spec, "image_self_attention");
    Ok(Rows { x, n: rows.n })
}

/// `text_self_attention_tower`: `None` without general features and text.
fn text_tower(
    c: &Cmbf,
    general: Option<(&GroupLayout, NodeId)>,
    text: Option<(&GroupLayout, NodeId)>,
    g: &mut Graph,
    s: &mut Scope,
) -> anyhow::Result<Option<Text>> {
    if general.is_none() && text.is_none() {
        return Ok(None);
    }
    let hidden = c.text_hidden;
    let spec = encoder_spec(c, hidden, c.text_layers, "text")?;
    let mut blocks = Vec::new();
    let mut n_general = 0;
    if let Some((l, x)) = general {
        let (n, _) = positions_of(l, x, g)?;
        let rows = g.unfold(x, n);
        let rows = project(g, s, rows, "txt_projection", hidden);
        blocks.push(g.fold(rows, n));
        n_general = n;
    }
    let mut seqs = Vec::new();
    if let Some((l, x)) = text {
        let mut post = PostProcessor::new(
            c.token_type.then_some(l.seq.len()),
            (c.max_positions, &c.path),
            hidden,
            s,
        );
        for i in 0..l.seq.len() {
            let at = (i, "position_embeddings");
            let (flat, len, n) = post.text_sequence((g, s), (l, x), i, at, (hidden, c.text_emb_dropout))?;
            blocks.push(flat);
            seqs.push((len, n));
        }
    }
    let n = n_general + seqs.iter().map(|q| q.1).sum::<usize>();
    let all = g.concat(&blocks);
    let rows = g.unfold(all, n);
    let mask = (!seqs.is_empty()).then(|| {
        let like = seqs[0].0;
        let mut parts = Vec::new();
        if n_general > 0 {
            parts.push(g.ones(like, n_general));
        }
        for &(len, m) in &seqs {
            parts.push(g.prefix_mask(len, m));
        }
        g.concat(&parts)
    });
    let keys = mask.map_or(Keys::All, Keys::Mask);
    let x = transformer::encoder(g, s, rows, keys, &spec, "text_self_attention");
    Ok(Some(Text {
        rows: Rows { x, n },
        general: n_general,
        seqs,
        mask,
    }))
}

/// EasyRec's `embedding_postprocessor` calls of one model: the token-type
/// table (shared by the calls, `vocab` rows) when the model uses token
/// types, position tables when it uses positions, and the count of layer
/// norms made so far (each call's opens a scope of its own, `LayerNorm`,
/// `LayerNorm_1`, ...).
struct PostProcessor {
    token_types: Option<(usize, usize)>,
    max_positions: Option<usize>,
    /// The tower config's path, for the message on too many positions.
    path: String,
    norms: usize,
}

impl PostProcessor {
    fn new(vocab: Option<usize>, (max_positions, path): (Option<usize>, &str), hidden: usize, s: &mut Scope) -> Self {
        let token_types = vocab.map(|vocab| {
            let init = Init::TruncatedNormal(INIT_RANGE);
            let t = s
                .params
                .add("token_type/token_type_embeddings", vocab, hidden, init, false, s.rng);
            (t, vocab)
        });
        PostProcessor {
            token_types,
            max_positions,
            path: path.to_string(),
            norms: 0,
        }
    }

    /// Sequence `i` of the `text` group `(l, x)`: its positions projected to
    /// `hidden` columns (`txt_seq_projection_<i>`), then `apply` with token
    /// type `token` and the position table `<table>_<i>`. Returns them
    /// flattened (`[batch, n * hidden]`), the sequence's length column and
    /// its positions `n`.
    fn text_sequence(
        &mut self,
        (g, s): (&mut Graph, &mut Scope),
        (l, x): (&GroupLayout, NodeId),
        i: usize,
        (token, table): (usize, &str),
        (hidden, dropout): (usize, f32),
    ) -> anyhow::Result<(NodeId, NodeId, usize)> {
        let sl = &l.seq[i];
        let ((col, dim), n) = (sl.hist[0], sl.len);
        let h = g.slice(x, col, n * dim);
        let rows = g.unfold(h, n);
        let rows = project(g, s, rows, &format!("txt_seq_projection_{i}"), hidden);
        let at = format!("{table}_{i}");
        let rows = self.apply(g, s, Rows { x: rows, n }, (token, Some(&at)), dropout)?;
        Ok((g.fold(rows, n), g.slice(x, sl.len_col, 1), n))
    }

    /// One call over `rows`: token type `token`'s row added (with token
    /// types), the position table `position_embedding/<position>` added
    /// (with positions, when the call asks for them), layer norm, dropout.
    fn apply(
        &mut self,
        g: &mut Graph,
        s: &mut Scope,
        rows: Rows,
        (token, position): (usize, Option<&str>),
        dropout: f32,
    ) -> anyhow::Result<NodeId> {
        let (mut x, n) = (rows.x, rows.n);
        if let Some((table, vocab)) = self.token_types {
            x = add_token_type(g, s, x, (table, token, vocab));
        }
        if let (Some(max), Some(name)) = (self.max_positions, position) {
            if n > max {
                bail!(
                    "{}.max_position_embeddings ({max}) must be at least the sequences' lengths ({n} positions)",
                    self.path
                );
            }
            let flat = g.fold(x, n);
            let name = format!("position_embedding/{name}");
            let flat = transformer::add_positions(g, s, (flat, n), &name, INIT_RANGE);
            x = g.unfold(flat, n);
        }
        let scope = match self.norms {
            0 => "LayerNorm".to_string(),
            k => format!("LayerNorm_{k}"),
        };
        self.norms += 1;
        let (gamma, beta) = (format!("{scope}/gamma"), format!("{scope}/beta"));
        let x = s.layer_norm_named(g, x, (&gamma, &beta), LN_EPS);
        Ok(g.dropout(x, dropout))
    }
}

/// `rows + table[i]`, row `i` of the token-type table (`vocab` rows) on
/// every position: a one-hot constant times the table.
fn add_token_type(g: &mut Graph, s: &mut Scope, rows: NodeId, (table, i, vocab): (usize, usize, usize)) -> NodeId {
    let mut cols = Vec::new();
    if i > 0 {
        cols.push(g.zeros(rows, i));
    }
    cols.push(g.ones(rows, 1));
    if i + 1 < vocab {
        cols.push(g.zeros(rows, vocab - i - 1));
    }
    let one_hot = g.concat(&cols);
    let emb = g.linear(one_hot, s.params, table, None, Activation::Linear);
    g.add(&[rows, emb])
}

/// `cross_attention_tower`: per layer, the image positions attend to the
/// text's (skipping its padding) and the text's to the image's.
fn cross_tower(c: &Cmbf, img: Rows, txt: &Text, g: &mut Graph, s: &mut Scope) -> (Rows, Rows) {
    let text_keys = txt.mask.map_or(Keys::All, Keys::Mask);
    let (ls, rs) = c.cross_head_sizes;
    let (mut left, mut right) = (img.x, txt.rows.x);
    for i in 0..c.cross_layers {
        let l = cross_block(
            c,
            (left, right),
            (text_keys, Keys::All),
            ls,
            &format!("left_to_right_cross_layer_{i}"),
            (g, s),
        );
        let r = cross_block(
            c,
            (right, left),
            (Keys::All, text_keys),
            rs,
            &format!("right_to_left_cross_layer_{i}"),
            (g, s),
        );
        (left, right) = (l, r);
    }
    (
        Rows { x: left, n: img.n },
        Rows {
            x: right,
            n: txt.rows.n,
        },
    )
}

/// `cross_attention_block` in scope `name`: attention of `from` over `to`
/// (`cross_keys`), self-attention over its result (`self_keys`), add and
/// norm; a ReLU intermediate layer four times as wide, an output layer,
/// add and norm. `multi_head_num` heads of `size` columns.
fn cross_block(
    c: &Cmbf,
    (from, to): (NodeId, NodeId),
    (cross_keys, self_keys): (Keys, Keys),
    size: usize,
    name: &str,
    (g, s): (&mut Graph, &mut Scope),
) -> NodeId {
    let k = Kernel {
        init: Init::TruncatedNormal(INIT_RANGE),
        ..Kernel::UNREGULARIZED
    };
    let (lin, w, scale) = (Activation::Linear, c.heads * size, 1.0 / (size as f32).sqrt());
    let mut attend = |g: &mut Graph, (from, to): (NodeId, NodeId), keys: Keys, at: &str| {
        let q = s.layer(g, from, &format!("{at}/query"), w, k, lin);
        let kk = s.layer(g, to, &format!("{at}/key"), w, k, lin);
        let v = s.layer(g, to, &format!("{at}/value"), w, k, lin);
        g.attention((q, kk, v), (c.heads, scale), keys)
    };
    let cross = attend(g, (from, to), cross_keys, &format!("{name}/attention/cross"));
    let own = attend(g, (cross, cross), self_keys, &format!("{name}/attention/self"));
    let own = g.dropout(own, c.hidden_dropout);
    let sum = g.add(&[own, cross]);
    let attended = transformer::layer_norm(g, s, sum, &format!("{name}/attention/output"));
    let mid = s.layer(
        g,
        attended,
        &format!("{name}/intermediate/dense"),
        4 * w,
        k,
        Activation::Relu,
    );
    let out = s.layer(g, mid, &format!("{name}/output/dense"), w, k, lin);
    let out = g.dropout(out, c.hidden_dropout);
    let sum = g.add(&[out, attended]);
    transformer::layer_norm(g, s, sum, &format!("{name}/output"))
}

/// The mean over each batch row's positions, `[batch, width]`.
fn mean_rows(g: &mut Graph, r: Rows) -> NodeId {
    let flat = g.fold(r.x, r.n);
    let sum = g.sum_blocks(flat, r.n);
    g.scale(sum, 1.0 / r.n as f32, None)
}

/// `merge_text_embedding`: the general features' positions as they are,
/// each sequence's mean over the positions below its length (zeros for
/// an empty one, where EasyRec divides by zero), side by side.
fn merge_text(g: &mut Graph, r: Rows, t: &Text) -> NodeId {
    let flat = g.fold(r.x, r.n);
    if t.seqs.is_empty() {
        return flat;
    }
    let w = g.width(r.x);
    let mut out = Vec::new();
    if t.general > 0 {
        out.push(g.slice(flat, 0, t.general * w));
    }
    let mut at = t.general;
    for &(len, n) in &t.seqs {
        let h = g.slice(flat, at * w, n * w);
        let zeros = g.zeros(len, n);
        let weights = g.masked_softmax(zeros, len);
        out.push(g.attn_pool(weights, h));
        at += n;
    }
    g.concat(&out)
}
