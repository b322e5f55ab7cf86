//! `model_config.backbone` typed: EasyRec's block DAG (`RankModel`), each
//! block reading feature groups or other blocks through EasyRec's input
//! expressions, and running an input layer, Keras layers or a recurrence.
//! What is not here is refused by name: an input-layer option or a Python
//! expression this trainer cannot run. A block's Keras layer is kept as
//! written with its path; `model::builders::backbone::keras` types it
//! (refusing a class or `st_params` key by name) next to where it builds it.

use std::collections::HashMap;

use crate::config::model::layers::{mlp, Mlp};
use crate::config::{proto, ConfigError};

/// The backbone: blocks in an order where each follows what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Backbone {
    pub blocks: Vec<Block>,
    /// `packages`, in the order written.
    pub packages: Vec<Package>,
    /// `concat_blocks` (merged as one tensor) or `output_blocks` (a list).
    pub output: Vec<String>,
    pub output_as_list: bool,
    pub top_mlp: Option<Mlp>,
    /// The wide groups' embedding width (`input_layer.wide_output_dim`).
    pub wide_output_dim: Option<usize>,
    /// Whose variable names and defaults the backbone follows: later
    /// EasyRec's unless a checkpoint of EasyRec 0.7.1 is to be read
    /// (`Release::detect`).
    pub release: Release,
}

/// The EasyRec release a backbone's variables are named after. EasyRec
/// 0.7.1 (the release on PyPI) builds the backbone under the variable
/// scope `backbone` (`backbone/input_layer/...`, `backbone/<block>/...`),
/// names an MLP's layers `<block>/dnn_<i>` with a bias unless `use_bias`
/// is false, and DIN's scoring DNN with `dnn.DNN`, whose Dice keeps its
/// `alpha_<layer>/act` and a `batch_normalization[_k]` of its own; later
/// EasyRec names them `<block>/layer_<i>/dense` without a bias by default,
/// and Dice `<layer>/bn/dice/...`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Release {
    #[default]
    Current,
    V071,
}

impl Release {
    /// The release whose backbone wrote a checkpoint holding `names`:
    /// 0.7.1 where they are under the scope `backbone/`.
    pub fn detect<'a>(mut names: impl Iterator<Item = &'a str>) -> Release {
        if names.any(|n| n.starts_with("backbone/")) {
            Release::V071
        } else {
            Release::Current
        }
    }
}

/// Keras layers whose variables EasyRec 0.7.1 names after Keras'
/// automatic layer name rather than the block's: that release's
/// constructors of these classes hand their `name` to Keras' `trainable`
/// argument, so a FiBiNet's SENet is `se_net_1/W1` or a MaskNet's blocks
/// `mask_block[_k]/...`, numbered in the order the whole graph made them,
/// beside unnamed `dense[_k]` and `LayerNorm[_k]` layers.
const UNNAMED_IN_071: &[&str] = &[
    "SENet",
    "BiLinear",
    "FiBiNet",
    "MaskBlock",
    "MaskNet",
    "PeriodicEmbedding",
    "AutoDisEmbedding",
];

impl Backbone {
    /// Every block: the backbone's, then its packages'.
    pub fn all_blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().chain(self.packages.iter().flat_map(|p| &p.blocks))
    }

    /// The first Keras layer (its config path and class) whose variables
    /// EasyRec 0.7.1 names by Keras' automatic names (`UNNAMED_IN_071`).
    pub fn named_automatically_in_071(&self) -> Option<(String, String)> {
        self.all_blocks().flat_map(|b| &b.layers).find_map(|layer| {
            let k = match layer {
                Layer::Keras(k) | Layer::Recurrent { layer: k, .. } | Layer::Repeat { layer: k, .. } => k,
                Layer::Input(_) | Layer::Lambda(_) => return None,
            };
            let class = k.proto.class_name.as_str();
            UNNAMED_IN_071
                .contains(&class)
                .then(|| (k.path.clone(), class.to_string()))
        })
    }
}

/// A block package (`packages`, EasyRec's `Package`): blocks run as one
/// wherever an input names it (`package_name`), on the value its
/// `package_input` names; every run shares its layers' variables
/// (TensorFlow's `AUTO_REUSE`) and draws its own dropout and augmentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Package {
    pub name: String,
    /// In the order they run.
    pub blocks: Vec<Block>,
    pub output: Vec<String>,
    pub output_as_list: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub name: String,
    pub inputs: Vec<BlockInput>,
    /// `input_concat_axis`: -1 (features) or 1 (fields of 3-D inputs).
    pub concat_axis: i32,
    /// `merge_inputs_into_list`.
    pub into_list: bool,
    pub extra_input_fn: Option<Expr>,
    /// Run in turn on the merged inputs; none passes them through.
    pub layers: Vec<Layer>,
}

impl Block {
    /// The input layer's output, when this block is a group's input layer.
    pub fn input_layer(&self) -> Option<InputLayer> {
        match self.layers.first() {
            Some(Layer::Input(il)) => Some(*il),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BlockInput {
    pub source: Source,
    /// `ignore_input`: read (a package run all the same) but left out of
    /// the block's inputs; the block still runs after it.
    pub ignore: bool,
    /// `input_slice` then `input_fn`.
    pub slice: Option<Expr>,
    pub input_fn: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A feature group, through EasyRec's input layer.
    Group(String),
    Block(String),
    /// A block of the backbone, read from inside a package.
    Outer(String),
    /// Package `name` run on `input`: a block beside the reader, or
    /// another package run on nothing; with `reset`, its input layers
    /// follow that config from this run on (EasyRec's `reset_input`).
    Package {
        name: String,
        input: Option<String>,
        reset: Option<InputLayer>,
    },
    /// The value a package runs on (`use_package_input`).
    PackageInput,
}

/// A block's `keras_layer` as the config writes it, with its path: the
/// model's builder types and builds it (`model::builders::backbone::keras`),
/// refusing what it does not honour under this path.
#[derive(Debug, Clone, PartialEq)]
pub struct KerasLayer {
    pub proto: proto::KerasLayer,
    pub path: String,
}

fn keras(k: &proto::KerasLayer, path: &str) -> Result<KerasLayer, ConfigError> {
    Ok(KerasLayer {
        proto: k.clone(),
        path: path.to_string(),
    })
}

#[derive(Debug, Clone, PartialEq)]
pub enum Layer {
    /// A feature group's input layer.
    Input(InputLayer),
    Keras(KerasLayer),
    /// `recurrent`: the layer applied `steps` times to its own output; with
    /// `fixed`, the inputs are a list whose element `fixed` stays (DCN's x0).
    Recurrent {
        steps: usize,
        fixed: Option<usize>,
        layer: KerasLayer,
    },
    /// `repeat`: `n` copies of the layer (variables of their own,
    /// `<name>_<i>`) on the same input; their outputs as a list, or
    /// concatenated with `output_concat_axis`.
    Repeat {
        n: usize,
        concat: bool,
        layer: KerasLayer,
    },
    Lambda(Expr),
}

/// A feature group's input layer: what it outputs, and whether it batch
/// normalises its features first (`do_batch_norm`: the tensor by one batch
/// norm, the features of the list by another, as EasyRec's), then drops
/// out in training (`dropout_rate`: the tensor, and each listed feature
/// apart where a list is output).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InputLayer {
    pub mode: InputMode,
    pub batch_norm: bool,
    pub dropout: f32,
}

impl InputLayer {
    /// The plain concatenated features.
    pub const TENSOR: InputLayer = InputLayer {
        mode: InputMode::Tensor,
        batch_norm: false,
        dropout: 0.0,
    };
}

/// What an input layer outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputMode {
    /// The features concatenated: `[batch, width]`.
    Tensor,
    /// `only_output_feature_list`: one `[batch, dim]` per feature, in
    /// `feature_names` order.
    FeatureList,
    /// `only_output_3d_tensor`: `[batch, features, dim]`.
    Stacked,
    /// `output_2d_tensor_and_feature_list`: `(tensor, list)`.
    TensorAndList,
    /// `output_seq_and_normal_feature`: `(sequences, length, targets)`,
    /// the group's sequence features unpooled `[batch, len, Σ dim]` (side
    /// by side per position, `concat_seq_feature`), the first one's
    /// length, and its other features concatenated (none: a pair).
    SeqAndNormal,
}

/// The Python expressions of `input_slice`, `input_fn`, `extra_input_fn`
/// and `lambda` blocks that EasyRec's configs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expr {
    /// `[i]`, `lambda x: x[i]`: an element of a list.
    Index(usize),
    /// `lambda x: [x]`, `lambda x: [x, x]`: the value repeated in a list.
    Repeat(usize),
    /// `lambda x: tf.add_n(x)`.
    AddN,
    /// `lambda x: tf.reduce_sum(x, axis=1, keepdims=True)`.
    ReduceSum,
    /// `lambda x: tf.concat(x, axis=1)` (or -1).
    Concat,
    /// `lambda x: tf.stack(x, axis=1)`.
    Stack,
    /// `lambda x: tf.unstack(tf.reshape(x, [-1, n, d]), axis=1)`.
    Unstack { n: usize, d: usize },
}

const SUPPORTED_EXPRESSIONS: &str = "[i], lambda x: x[i], lambda x: [x, ...], tf.add_n(x), \
     tf.reduce_sum(x, axis=1, keepdims=True), tf.concat(x, axis=1), tf.stack(x, axis=1), \
     tf.unstack(tf.reshape(x, [-1, n, d]), axis=1)";

/// Parses an expression; `slice` for `input_slice`, which EasyRec reads as
/// the tail of `lambda x: x`.
pub fn expr(text: &str, path: &str, slice: bool) -> Result<Expr, ConfigError> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let body = if slice {
        Some(format!("x{compact}"))
    } else {
        compact.strip_prefix("lambdax:").map(str::to_string)
    };
    let parsed = body.as_deref().and_then(|b| {
        if let Some(i) = b.strip_prefix("x[").and_then(|r| r.strip_suffix(']')) {
            return i.parse().ok().map(Expr::Index);
        }
        if let Some(items) = b.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let n = items.split(',').count();
            return items.split(',').all(|i| i == "x").then_some(Expr::Repeat(n));
        }
        match b {
            "tf.add_n(x)" => return Some(Expr::AddN),
            "tf.reduce_sum(x,axis=1,keepdims=True)" => return Some(Expr::ReduceSum),
            "tf.concat(x,axis=1)" | "tf.concat(x,axis=-1)" | "tf.concat(x,1)" | "tf.concat(x,-1)" => {
                return Some(Expr::Concat)
            }
            "tf.stack(x,axis=1)" | "tf.stack(x,1)" => return Some(Expr::Stack),
            _ => {}
        }
        let shape = b
            .strip_prefix("tf.unstack(tf.reshape(x,[-1,")
            .and_then(|r| r.strip_suffix("]),axis=1)"))?;
        let (n, d) = shape.split_once(',')?;
        Some(Expr::Unstack {
            n: n.parse().ok()?,
            d: d.parse().ok()?,
        })
    });
    parsed.ok_or_else(|| ConfigError::Unsupported {
        path: path.to_string(),
        what: format!("the Python expression `{text}`"),
        hint: format!(" (supported forms: {SUPPORTED_EXPRESSIONS})"),
    })
}

fn input_layer(l: &proto::InputLayer, path: &str) -> Result<InputLayer, ConfigError> {
    let refused: [(&str, bool); 3] = [
        ("do_layer_norm", l.do_layer_norm()),
        ("feature_dropout_rate", l.feature_dropout_rate() > 0.0),
        (
            "concat_seq_feature",
            l.output_seq_and_normal_feature() && !l.concat_seq_feature(),
        ),
    ];
    if let Some((field, _)) = refused.iter().find(|(_, on)| *on) {
        return Err(ConfigError::unsupported(
            format!("{path}.{field}"),
            "this input-layer option",
        ));
    }
    if l.output_seq_and_normal_feature() {
        if l.do_batch_norm() {
            // EasyRec returns the sequence inputs before any normalization.
            log::warn!("{path}.do_batch_norm: EasyRec does not normalize output_seq_and_normal_feature, nor does this");
        }
        return Ok(InputLayer {
            mode: InputMode::SeqAndNormal,
            batch_norm: false,
            dropout: 0.0,
        });
    }
    let mode = if l.only_output_feature_list() {
        InputMode::FeatureList
    } else if l.only_output_3d_tensor() {
        InputMode::Stacked
    } else if l.output_2d_tensor_and_feature_list() {
        InputMode::TensorAndList
    } else {
        InputMode::Tensor
    };
    // EasyRec drops out only at a rate strictly between 0 and 1.
    let rate = l.dropout_rate();
    Ok(InputLayer {
        mode,
        batch_norm: l.do_batch_norm(),
        dropout: if 0.0 < rate && rate < 1.0 { rate } else { 0.0 },
    })
}

/// The feature groups a backbone block reads through an input layer with
/// `output_seq_and_normal_feature`: their sequence features stay unpooled.
pub fn seq_input_groups(b: &proto::BackboneTower) -> Vec<String> {
    b.blocks
        .iter()
        .chain(b.packages.iter().flat_map(|p| &p.blocks))
        .filter(
            |blk| matches!(&blk.layer, Some(proto::block::Layer::InputLayer(l)) if l.output_seq_and_normal_feature()),
        )
        .filter_map(|blk| match &blk.inputs.first()?.name {
            Some(proto::input::Name::FeatureGroupName(g)) => Some(g.clone()),
            _ => None,
        })
        .collect()
}

fn layer(l: &proto::block::Layer, path: &str) -> Result<Layer, ConfigError> {
    use proto::block::Layer as L;
    Ok(match l {
        L::InputLayer(i) => Layer::Input(input_layer(i, &format!("{path}.input_layer"))?),
        L::KerasLayer(k) => Layer::Keras(keras(k, &format!("{path}.keras_layer"))?),
        L::Lambda(x) => Layer::Lambda(expr(&x.expression, &format!("{path}.lambda.expression"), false)?),
        L::Recurrent(r) => recurrent(r, &format!("{path}.recurrent"))?,
        L::Repeat(r) => repeat(r, &format!("{path}.repeat"))?,
        L::RawInput(_) => {
            return Err(ConfigError::unsupported(
                format!("{path}.raw_input"),
                "raw input layers",
            ))
        }
        L::EmbeddingLayer(_) => {
            return Err(ConfigError::unsupported(
                format!("{path}.embedding_layer"),
                "embedding layers over bucketized features",
            ))
        }
    })
}

fn recurrent(r: &proto::RecurrentLayer, path: &str) -> Result<Layer, ConfigError> {
    if r.num_steps == 0 {
        return Err(ConfigError::invalid(format!("{path}.num_steps"), "must be at least 1"));
    }
    Ok(Layer::Recurrent {
        steps: r.num_steps as usize,
        fixed: r.fixed_input_index.map(|i| i as usize),
        layer: keras(&r.keras_layer, &format!("{path}.keras_layer"))?,
    })
}

fn repeat(r: &proto::RepeatLayer, path: &str) -> Result<Layer, ConfigError> {
    if r.num_repeat == 0 {
        return Err(ConfigError::invalid(format!("{path}.num_repeat"), "must be at least 1"));
    }
    for (field, set) in [
        ("input_slice", r.input_slice.is_some()),
        ("input_fn", r.input_fn.is_some()),
    ] {
        if set {
            return Err(ConfigError::unsupported(
                format!("{path}.{field}"),
                "a repeat's per-copy input function",
            ));
        }
    }
    let concat = match r.output_concat_axis {
        None => false,
        Some(-1) => true,
        Some(a) => {
            return Err(ConfigError::unsupported(
                format!("{path}.output_concat_axis"),
                format!("concatenating a repeat's outputs on axis {a} (supported: -1)"),
            ))
        }
    };
    Ok(Layer::Repeat {
        n: r.num_repeat as usize,
        concat,
        layer: keras(&r.keras_layer, &format!("{path}.keras_layer"))?,
    })
}

fn sequential(l: &proto::Layer, path: &str) -> Result<Layer, ConfigError> {
    use proto::layer::Layer as L;
    match &l.layer {
        Some(L::Lambda(x)) => Ok(Layer::Lambda(expr(
            &x.expression,
            &format!("{path}.lambda.expression"),
            false,
        )?)),
        Some(L::KerasLayer(k)) => Ok(Layer::Keras(keras(k, &format!("{path}.keras_layer"))?)),
        Some(L::Recurrent(r)) => recurrent(r, &format!("{path}.recurrent")),
        Some(L::Repeat(r)) => repeat(r, &format!("{path}.repeat")),
        None => Err(ConfigError::invalid(
            path,
            "a layer needs one of lambda, keras_layer, recurrent, repeat",
        )),
    }
}

/// Types `backbone`, `groups` being the model's feature-group names.
pub fn backbone(b: &proto::BackboneTower, groups: &[String], path: &str) -> Result<Backbone, ConfigError> {
    let mut names: Vec<&str> = Vec::new();
    for (i, p) in b.packages.iter().enumerate() {
        if p.name == "backbone" || names.contains(&p.name.as_str()) {
            return Err(ConfigError::invalid(
                format!("{path}.packages[{i}].name"),
                format!("`{}` names the backbone or another package", p.name),
            ));
        }
        names.push(&p.name);
    }
    let packages: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut wide_output_dim: Option<usize> = None;
    let mut blocks = typed_blocks(&b.blocks, path, &mut wide_output_dim)?;
    if let Some(blk) = blocks.iter().find(|blk| packages.contains(&blk.name)) {
        return Err(ConfigError::invalid(
            format!("{path}.blocks"),
            format!("block `{}` has the name of a package", blk.name),
        ));
    }
    let mut dag = Dag::of(&blocks);
    let reach = Reach {
        groups,
        packages: &packages,
        outer: None,
    };
    resolve(&mut blocks, &reach, &mut dag, path)?;
    if blocks.iter().all(|b| b.input_layer().is_some()) {
        return Err(ConfigError::invalid(
            path,
            "there must be at least one block besides input layers",
        ));
    }
    let (output, output_as_list) = outputs(&b.concat_blocks, &b.output_blocks, &blocks, &dag);
    // Each package, then the edges from the backbone's blocks it reads to
    // it in the backbone's DAG (EasyRec adds them as it makes the package).
    let main_names: Vec<String> = blocks.iter().map(|b| b.name.clone()).collect();
    let mut typed = Vec::new();
    for (i, p) in b.packages.iter().enumerate() {
        let ppath = format!("{path}.packages[{i}]");
        let mut pblocks = typed_blocks(&p.blocks, &ppath, &mut wide_output_dim)?;
        if pblocks.is_empty() {
            return Err(ConfigError::invalid(
                &ppath,
                format!("package `{}` has no block", p.name),
            ));
        }
        let mut pdag = Dag::of(&pblocks);
        let reach = Reach {
            groups,
            packages: &packages,
            outer: Some(&main_names),
        };
        let read = resolve(&mut pblocks, &reach, &mut pdag, &ppath)?;
        for outer in read {
            dag.edge(&outer, &p.name);
        }
        let (output, output_as_list) = outputs(&p.concat_blocks, &p.output_blocks, &pblocks, &pdag);
        let pblocks = topological(pblocks, &pdag, &ppath)?;
        check_outputs(&output, &pblocks, &ppath)?;
        typed.push(Package {
            name: p.name.clone(),
            blocks: pblocks,
            output,
            output_as_list,
        });
    }
    package_cycles(&typed, path)?;
    let blocks = topological(blocks, &dag, path)?;
    check_outputs(&output, &blocks, path)?;
    Ok(Backbone {
        blocks,
        packages: typed,
        output,
        output_as_list,
        top_mlp: b
            .top_mlp
            .as_ref()
            .map(|m| mlp(m, &format!("{path}.top_mlp")))
            .transpose()?,
        wide_output_dim,
        release: Release::Current,
    })
}

/// The blocks as the config writes them, their inputs' names unresolved.
fn typed_blocks(
    protos: &[proto::Block],
    path: &str,
    wide_output_dim: &mut Option<usize>,
) -> Result<Vec<Block>, ConfigError> {
    let mut blocks: Vec<Block> = Vec::new();
    for (i, blk) in protos.iter().enumerate() {
        let bpath = format!("{path}.blocks[{i}]");
        if blk.inputs.is_empty() {
            return Err(ConfigError::invalid(
                &bpath,
                format!("block `{}` takes no input", blk.name),
            ));
        }
        if blocks.iter().any(|x| x.name == blk.name) {
            return Err(ConfigError::invalid(
                format!("{bpath}.name"),
                format!("a second block `{}`", blk.name),
            ));
        }
        let inputs = block_inputs(blk, &bpath)?;
        let mut layers = Vec::new();
        if let Some(l) = &blk.layer {
            if let proto::block::Layer::InputLayer(il) = l {
                if blk.inputs.len() != 1 || !matches!(inputs.first().map(|i| &i.source), Some(Source::Group(_))) {
                    return Err(ConfigError::invalid(
                        &bpath,
                        format!("input layer `{}` takes exactly one feature_group_name", blk.name),
                    ));
                }
                if let Some(d) = il.wide_output_dim {
                    if wide_output_dim.is_some_and(|w| w != d as usize) {
                        return Err(ConfigError::invalid(
                            format!("{bpath}.input_layer.wide_output_dim"),
                            "differs from another block's: wide_output_dim must be consistent",
                        ));
                    }
                    *wide_output_dim = Some(d as usize);
                }
            }
            if !blk.layers.is_empty() {
                return Err(ConfigError::invalid(
                    &bpath,
                    "a block has either `layers` or one layer, not both",
                ));
            }
            layers.push(layer(l, &bpath)?);
        }
        for (j, l) in blk.layers.iter().enumerate() {
            layers.push(sequential(l, &format!("{bpath}.layers[{j}]"))?);
        }
        blocks.push(Block {
            name: blk.name.clone(),
            inputs,
            concat_axis: blk.input_concat_axis(),
            into_list: blk.merge_inputs_into_list(),
            extra_input_fn: blk
                .extra_input_fn
                .as_deref()
                .map(|s| expr(s, &format!("{bpath}.extra_input_fn"), false))
                .transpose()?,
            layers,
        });
    }
    Ok(blocks)
}

/// What the inputs of one package's blocks may name: the model's feature
/// groups, the packages, and (inside a package) the backbone's blocks.
struct Reach<'a> {
    groups: &'a [String],
    packages: &'a [String],
    outer: Option<&'a [String]>,
}

/// Resolves the names the blocks' inputs read, as EasyRec's `Package`
/// does: a block of their own, else a feature group (through EasyRec's
/// implicit input-layer block of that name, appended), else (inside a
/// package) a block of the backbone; a package invoked on its
/// `package_input`, a block or a package. Adds the DAG's nodes and edges
/// in EasyRec's order and returns the backbone blocks read.
fn resolve(blocks: &mut Vec<Block>, reach: &Reach, dag: &mut Dag, path: &str) -> Result<Vec<String>, ConfigError> {
    let names: Vec<String> = blocks.iter().map(|b| b.name.clone()).collect();
    let mut implicit: Vec<Block> = Vec::new();
    let mut outer_read: Vec<String> = Vec::new();
    let bad = |blk: &str, what: String| ConfigError::invalid(format!("{path}.blocks"), format!("block `{blk}` {what}"));
    for blk in blocks.iter_mut() {
        let is_input_layer = blk.input_layer().is_some();
        for inp in &mut blk.inputs {
            let (is_group, name) = match &inp.source {
                Source::Group(n) => (true, n.clone()),
                Source::Block(n) => (false, n.clone()),
                Source::PackageInput => {
                    if reach.outer.is_none() {
                        return Err(bad(&blk.name, "reads use_package_input outside a package".into()));
                    }
                    continue;
                }
                Source::Package { name, input, .. } => {
                    if !reach.packages.contains(name) {
                        return Err(bad(
                            &blk.name,
                            format!("reads package `{name}`, which packages do not define"),
                        ));
                    }
                    dag.edge(name, &blk.name);
                    if let Some(x) = input {
                        if !names.contains(x) && !reach.packages.contains(x) {
                            return Err(bad(
                                &blk.name,
                                format!(
                                    "runs package `{name}` on `{x}`, which is neither a block beside it nor a package"
                                ),
                            ));
                        }
                        dag.edge(x, name);
                    }
                    continue;
                }
                Source::Outer(_) => unreachable!("resolved here"),
            };
            if is_group && is_input_layer {
                if !reach.groups.contains(&name) {
                    return Err(bad(
                        &blk.name,
                        format!("reads feature group `{name}`, which model_config does not define"),
                    ));
                }
                continue;
            }
            if names.contains(&name) {
                dag.edge(&name, &blk.name);
                inp.source = Source::Block(name);
            } else if is_group && reach.groups.contains(&name) {
                if !implicit.iter().any(|b| b.name == name) {
                    implicit.push(Block {
                        name: name.clone(),
                        inputs: vec![BlockInput {
                            source: Source::Group(name.clone()),
                            ignore: false,
                            slice: None,
                            input_fn: None,
                        }],
                        concat_axis: -1,
                        into_list: false,
                        extra_input_fn: None,
                        layers: vec![Layer::Input(InputLayer::TENSOR)],
                    });
                }
                dag.edge(&name, &blk.name);
                inp.source = Source::Block(name);
            } else if reach.outer.is_some_and(|o| o.contains(&name)) {
                if !outer_read.contains(&name) {
                    outer_read.push(name.clone());
                }
                inp.source = Source::Outer(name);
            } else {
                return Err(bad(
                    &blk.name,
                    format!("reads `{name}`, which is neither a feature group nor a block"),
                ));
            }
        }
    }
    // EasyRec's DAG holds the config's blocks, then the implicit ones in
    // the order they were first read.
    blocks.extend(implicit);
    Ok(outer_read)
}

/// `concat_blocks` (one tensor) or `output_blocks` (a list); without
/// either EasyRec concatenates the leaves, the DAG's nodes nothing reads,
/// in the order they joined it (`DAG.all_leaves`).
fn outputs(concat: &[String], list: &[String], blocks: &[Block], dag: &Dag) -> (Vec<String>, bool) {
    if !list.is_empty() {
        (list.to_vec(), true)
    } else if !concat.is_empty() {
        (concat.to_vec(), false)
    } else {
        let leaves = dag
            .nodes
            .iter()
            .filter(|n| !dag.edges.iter().any(|(from, _)| from == *n))
            .filter(|n| blocks.iter().any(|b| &b.name == *n))
            .cloned()
            .collect();
        (leaves, false)
    }
}

fn check_outputs(output: &[String], blocks: &[Block], path: &str) -> Result<(), ConfigError> {
    match output.iter().find(|o| !blocks.iter().any(|b| &b.name == *o)) {
        Some(o) => Err(ConfigError::invalid(
            format!("{path}.concat_blocks"),
            format!("no block `{o}` to output"),
        )),
        None => Ok(()),
    }
}

/// Refuses packages that run themselves, directly or through others.
fn package_cycles(packages: &[Package], path: &str) -> Result<(), ConfigError> {
    fn calls(p: &Package) -> Vec<&str> {
        p.blocks
            .iter()
            .flat_map(|b| &b.inputs)
            .flat_map(|i| match &i.source {
                Source::Package { name, input, .. } => {
                    let mut v = vec![name.as_str()];
                    v.extend(input.as_deref());
                    v
                }
                _ => Vec::new(),
            })
            .collect()
    }
    for p in packages {
        let mut seen: Vec<&str> = Vec::new();
        let mut todo: Vec<&str> = calls(p);
        while let Some(n) = todo.pop() {
            if n == p.name {
                return Err(ConfigError::invalid(
                    format!("{path}.packages"),
                    format!("package `{}` runs itself", p.name),
                ));
            }
            if !seen.contains(&n) {
                seen.push(n);
                if let Some(q) = packages.iter().find(|q| q.name == n) {
                    todo.extend(calls(q));
                }
            }
        }
    }
    Ok(())
}

/// EasyRec's DAG of one package: its nodes (blocks, and the packages and
/// package inputs its blocks name) in the order they joined, its edges in
/// the order they were added.
#[derive(Debug, Default)]
struct Dag {
    nodes: Vec<String>,
    edges: Vec<(String, String)>,
}

impl Dag {
    /// The DAG of `blocks` before their inputs are resolved: one node each.
    fn of(blocks: &[Block]) -> Dag {
        Dag {
            nodes: blocks.iter().map(|b| b.name.clone()).collect(),
            edges: Vec::new(),
        }
    }

    fn node(&mut self, n: &str) {
        if !self.nodes.iter().any(|x| x == n) {
            self.nodes.push(n.to_string());
        }
    }

    fn edge(&mut self, from: &str, to: &str) {
        self.node(from);
        self.node(to);
        if !self.edges.iter().any(|(a, b)| a == from && b == to) {
            self.edges.push((from.to_string(), to.to_string()));
        }
    }
}

/// The blocks in the order EasyRec runs them (`DAG.topological_sort`):
/// nodes nothing feeds are stacked in order, and the last stacked runs
/// first; a node is stacked once the last node it reads has run (packages
/// and package inputs are nodes too, which run nothing). The order
/// decides which input layer is `input_layer`, `input_layer_1`, ... (and
/// so the tables' variable names). EasyRec keeps a node's readers in a
/// Python set, whose order varies between processes; where a node feeds
/// several, they are taken here in the order their edges were added.
fn topological(blocks: Vec<Block>, dag: &Dag, path: &str) -> Result<Vec<Block>, ConfigError> {
    let index: HashMap<&str, usize> = dag.nodes.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); dag.nodes.len()];
    let mut waiting = vec![0usize; dag.nodes.len()];
    for (from, to) in &dag.edges {
        let (d, i) = (index[from.as_str()], index[to.as_str()]);
        readers[d].push(i);
        waiting[i] += 1;
    }
    let mut ready: Vec<usize> = (0..dag.nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(dag.nodes.len());
    while let Some(u) = ready.pop() {
        order.push(u);
        for &v in &readers[u] {
            waiting[v] -= 1;
            if waiting[v] == 0 {
                ready.push(v);
            }
        }
    }
    if order.len() < dag.nodes.len() {
        let stuck: Vec<&str> = (0..dag.nodes.len())
            .filter(|i| !order.contains(i))
            .map(|i| dag.nodes[i].as_str())
            .collect();
        return Err(ConfigError::invalid(
            format!("{path}.blocks"),
            format!("blocks read each other in a cycle: {}", stuck.join(", ")),
        ));
    }
    let mut slots: HashMap<String, Block> = blocks.into_iter().map(|b| (b.name.clone(), b)).collect();
    Ok(order.into_iter().filter_map(|i| slots.remove(&dag.nodes[i])).collect())
}

/// A block's inputs, in order (those marked ignore_input too).
fn block_inputs(blk: &proto::Block, bpath: &str) -> Result<Vec<BlockInput>, ConfigError> {
    let mut inputs = Vec::new();
    for (j, inp) in blk.inputs.iter().enumerate() {
        use proto::input::Name;
        let ipath = format!("{bpath}.inputs[{j}]");
        let source = match &inp.name {
            Some(Name::FeatureGroupName(g)) => Source::Group(g.clone()),
            Some(Name::BlockName(n)) => Source::Block(n.clone()),
            Some(Name::PackageName(p)) => Source::Package {
                name: p.clone(),
                input: inp.package_input.clone(),
                reset: inp
                    .reset_input
                    .as_ref()
                    .map(|r| input_layer(r, &format!("{ipath}.reset_input")))
                    .transpose()?,
            },
            Some(Name::UsePackageInput(true)) => Source::PackageInput,
            Some(Name::UsePackageInput(false)) => {
                return Err(ConfigError::invalid(
                    format!("{ipath}.use_package_input"),
                    "can not be false (EasyRec's check)",
                ))
            }
            None => {
                return Err(ConfigError::invalid(
                    ipath,
                    "an input needs feature_group_name or block_name",
                ))
            }
        };
        let is_package = matches!(inp.name, Some(Name::PackageName(_)));
        if inp.package_input.is_some() && !is_package {
            log::warn!("{ipath}.package_input: read only with package_name; ignored, as EasyRec ignores it");
        }
        if inp.package_input_fn.is_some() && is_package {
            return Err(ConfigError::unsupported(
                format!("{ipath}.package_input_fn"),
                "a Python function over a package's input",
            ));
        }
        if inp.reset_input.is_some() && !is_package {
            log::warn!("{ipath}.reset_input: read only with package_name; ignored, as EasyRec ignores it");
        }
        inputs.push(BlockInput {
            source,
            ignore: inp.ignore_input(),
            slice: inp
                .input_slice
                .as_deref()
                .map(|s| expr(s, &format!("{ipath}.input_slice"), true))
                .transpose()?,
            input_fn: inp
                .input_fn
                .as_deref()
                .map(|s| expr(s, &format!("{ipath}.input_fn"), false))
                .transpose()?,
        });
    }
    Ok(inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(name: &str, reads: &[&str]) -> Block {
        Block {
            name: name.into(),
            inputs: reads
                .iter()
                .map(|r| BlockInput {
                    source: Source::Block(r.to_string()),
                    ignore: false,
                    slice: None,
                    input_fn: None,
                })
                .collect(),
            concat_axis: -1,
            into_list: false,
            extra_input_fn: None,
            layers: Vec::new(),
        }
    }

    /// The DAG of blocks reading only blocks.
    fn dag_of(blocks: &[Block]) -> Dag {
        let mut dag = Dag::of(blocks);
        for b in blocks {
            for i in &b.inputs {
                if let Source::Block(n) = &i.source {
                    dag.edge(n, &b.name);
                }
            }
        }
        dag
    }

    #[test]
    fn blocks_run_in_the_order_of_easyrecs_dag() {
        // The DIN backbone sample: config blocks, then the implicit input
        // blocks in the order first read. EasyRec stacks the blocks no
        // other feeds (seq, user, item) and runs the last stacked first.
        let blocks = vec![
            block("user_mlp", &["user"]),
            block("item_mlp", &["item"]),
            block("seq", &[]),
            block("din", &["seq"]),
            block("user", &[]),
            block("item", &[]),
        ];
        let order: Vec<String> = topological(blocks.clone(), &dag_of(&blocks), "p")
            .unwrap()
            .into_iter()
            .map(|b| b.name)
            .collect();
        assert_eq!(order, ["item", "item_mlp", "user", "user_mlp", "seq", "din"]);
        let cycle = vec![block("a", &["b"]), block("b", &["a"]), block("c", &[])];
        let e = topological(cycle.clone(), &dag_of(&cycle), "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a cycle: a, b"), "{e}");
    }

    #[test]
    fn a_checkpoint_under_the_backbone_scope_is_easyrec_071s() {
        let names = ["backbone/user_mlp/dnn_0/kernel", "output/kernel"];
        assert_eq!(Release::detect(names.into_iter()), Release::V071);
        let names = ["user_mlp/layer_0/dense/kernel", "output/kernel"];
        assert_eq!(Release::detect(names.into_iter()), Release::Current);
    }

    #[test]
    fn expressions_of_easyrec_configs() {
        let p = "p";
        assert_eq!(expr("[1]", p, true).unwrap(), Expr::Index(1));
        assert_eq!(expr("lambda x: x[0]", p, false).unwrap(), Expr::Index(0));
        assert_eq!(expr("lambda x: [x]", p, false).unwrap(), Expr::Repeat(1));
        assert_eq!(expr("lambda x: [x, x]", p, false).unwrap(), Expr::Repeat(2));
        assert_eq!(expr("lambda x: tf.add_n(x)", p, false).unwrap(), Expr::AddN);
        assert_eq!(
            expr("lambda x: tf.reduce_sum(x, axis=1, keepdims=True)", p, false).unwrap(),
            Expr::ReduceSum
        );
        assert_eq!(expr("lambda x: tf.concat(x, axis=1)", p, false).unwrap(), Expr::Concat);
        assert_eq!(expr("lambda x: tf.stack(x, axis=1)", p, false).unwrap(), Expr::Stack);
        assert_eq!(
            expr("lambda x: tf.unstack(tf.reshape(x, [-1, 26, 16]), axis=1)", p, false).unwrap(),
            Expr::Unstack { n: 26, d: 16 }
        );
        let e = expr("lambda x: tf.nn.softmax(x)", "blocks[2].inputs[0].input_fn", false).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "blocks[2].inputs[0].input_fn: the Python expression `lambda x: tf.nn.softmax(x)` is not supported"
            ),
            "{msg}"
        );
        assert!(expr("lambda x: [x, y]", p, false).is_err());
    }

    fn input(name: &str, group: bool) -> proto::Input {
        use proto::input::Name;
        proto::Input {
            name: Some(if group {
                Name::FeatureGroupName(name.into())
            } else {
                Name::BlockName(name.into())
            }),
            ..Default::default()
        }
    }

    fn keras_block(name: &str, inputs: Vec<proto::Input>, class: &str) -> proto::Block {
        proto::Block {
            name: name.into(),
            inputs,
            layer: Some(proto::block::Layer::KerasLayer(proto::KerasLayer {
                class_name: class.into(),
                params: None,
            })),
            ..Default::default()
        }
    }

    fn tower(blocks: Vec<proto::Block>) -> proto::BackboneTower {
        proto::BackboneTower {
            blocks,
            ..Default::default()
        }
    }

    fn run(package: &str, on: Option<&str>) -> proto::Input {
        proto::Input {
            name: Some(proto::input::Name::PackageName(package.into())),
            package_input: on.map(str::to_string),
            ..Default::default()
        }
    }

    fn package(name: &str, blocks: Vec<proto::Block>) -> proto::BlockPackage {
        proto::BlockPackage {
            name: name.into(),
            blocks,
            ..Default::default()
        }
    }

    /// CL4SRec's layout: the backbone runs the encoder package on two runs
    /// of the augment package (which reads a backbone block) and on a block.
    fn cl4srec() -> proto::BackboneTower {
        let own = proto::Input {
            name: Some(proto::input::Name::UsePackageInput(true)),
            ..Default::default()
        };
        let mut b = tower(vec![
            keras_block("user_seq", vec![input("seq", true)], "Add"),
            keras_block(
                "contrastive",
                vec![run("enc", Some("aug")), run("enc", Some("aug"))],
                "Add",
            ),
            keras_block(
                "main",
                vec![run("enc", Some("user_seq")), input("user", true), input("item", true)],
                "Add",
            ),
        ]);
        b.packages = vec![
            package(
                "aug",
                vec![keras_block("augment", vec![input("user_seq", false)], "Add")],
            ),
            package("enc", vec![keras_block("BST", vec![own], "Add")]),
        ];
        b.concat_blocks = vec!["main".into()];
        b
    }

    #[test]
    fn packages_run_where_easyrec_runs_them_and_bad_runs_are_named() {
        let groups: Vec<String> = ["seq", "user", "item"].iter().map(|g| g.to_string()).collect();
        let bb = backbone(&cl4srec(), &groups, "backbone").unwrap();
        let order: Vec<&str> = bb.blocks.iter().map(|b| b.name.as_str()).collect();
        // EasyRec's DAG: the packages are nodes (the encoder after the
        // augment package and `user_seq`), so `main` runs before
        // `contrastive`, both after every input.
        assert_eq!(order, ["item", "user", "seq", "user_seq", "main", "contrastive"]);
        let read = |p: usize| bb.packages[p].blocks[0].inputs[0].source.clone();
        assert_eq!(read(0), Source::Outer("user_seq".into()));
        assert_eq!(read(1), Source::PackageInput);
        assert_eq!(bb.packages[1].output, ["BST"], "a package's leaves are its output");
        let refused = |b: proto::BackboneTower, want: &str| {
            let e = backbone(&b, &groups, "backbone").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        let mut b = cl4srec();
        b.blocks[2].inputs[0] = run("nope", None);
        refused(b, "reads package `nope`, which packages do not define");
        let mut b = cl4srec();
        b.blocks[2].inputs[0] = run("enc", Some("nope"));
        refused(
            b,
            "runs package `enc` on `nope`, which is neither a block beside it nor a package",
        );
        let mut b = cl4srec();
        b.blocks[2].inputs[0] = b.packages[1].blocks[0].inputs[0].clone();
        refused(b, "reads use_package_input outside a package");
        let mut b = cl4srec();
        b.packages[1].blocks[0].inputs.push(run("enc", None));
        refused(b, "package `enc` runs itself");
        let mut b = cl4srec();
        b.blocks[2].inputs[0].package_input_fn = Some("lambda x: x".into());
        refused(
            b,
            "backbone.blocks[2].inputs[0].package_input_fn: a Python function over a package's input is not supported",
        );
    }

    #[test]
    fn blocks_run_after_what_they_read_and_groups_get_input_layers() {
        let b = tower(vec![
            keras_block("top", vec![input("mid", false)], "FM"),
            keras_block("mid", vec![input("all", true), input("all", true)], "Add"),
        ]);
        let bb = backbone(&b, &["all".to_string()], "backbone").unwrap();
        let order: Vec<&str> = bb.blocks.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(order, ["all", "mid", "top"]);
        assert_eq!(bb.blocks[0].layers, vec![Layer::Input(InputLayer::TENSOR)]);
        // No concat_blocks: EasyRec concatenates the leaves.
        assert_eq!(bb.output, ["top"]);
    }

    #[test]
    fn cycles_unknown_inputs_and_layers_are_named() {
        let groups = ["all".to_string()];
        let cyc = tower(vec![
            keras_block("a", vec![input("b", false)], "Add"),
            keras_block("b", vec![input("a", false), input("all", true)], "Add"),
        ]);
        let e = backbone(&cyc, &groups, "backbone").unwrap_err().to_string();
        assert!(e.contains("cycle: a, b"), "{e}");
        let unknown = tower(vec![keras_block("a", vec![input("nope", false)], "Add")]);
        let e = backbone(&unknown, &groups, "backbone").unwrap_err().to_string();
        assert!(
            e.contains("`nope`, which is neither a feature group nor a block"),
            "{e}"
        );
        // A Keras class is kept as written with its path; the model's
        // builder types it (`model::builders::backbone::keras`).
        let layer = tower(vec![keras_block("a", vec![input("all", true)], "Transformer")]);
        let bb = backbone(&layer, &groups, "backbone").unwrap();
        assert!(
            matches!(&bb.blocks[1].layers[0], Layer::Keras(k) if k.path == "backbone.blocks[0].keras_layer"),
            "{bb:?}"
        );
    }
}
