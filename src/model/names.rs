//! EasyRec's names for a model's variables, and reading a model's weights
//! from a checkpoint EasyRec (TensorFlow) saved.
//!
//! Dense parameters already carry EasyRec's names (`deep_feature/dnn_0/kernel`,
//! `dnn/dnn_1/bn/moving_mean`, `cross_layer_0_w`, ...: the builders name
//! them so). Tables are named after the input-layer scope of the first
//! group that reads them and their feature column:
//! `input_layer_1/user_id_embedding/embedding_weights`. TensorFlow stores
//! vectors (biases, batch-norm parameters, cross weights) as `[n]` where
//! the parameter store keeps `[1, n]` or `[n, 1]`; the values are laid out
//! alike, so shapes are compared without their unit dimensions.

use std::collections::{BTreeMap, HashSet};

use super::{builders, GroupLayout, Model, ParamSpec, TableSpec};
use crate::checkpoint::tensorflow::TfCheckpoint;
use crate::checkpoint::{Loaded, Unusable};
use crate::config::feature_plan::FeatureSpec;
use crate::config::model::backbone::Release;
use crate::config::model::Arch;
use crate::config::train_plan::OptimizerKind;
use crate::optim::{slot_names, tf_slot_names};

/// The input-layer variable scope of the `k`-th call.
fn scope(k: usize) -> String {
    if k == 0 {
        "input_layer".into()
    } else {
        format!("input_layer_{k}")
    }
}

/// EasyRec's variable name of each of a model's `tables` (as indexed in
/// `Model::tables`), read by its `groups` of `features` into `arch`.
pub fn table_variables(
    (arch, features): (&Arch, &[FeatureSpec]),
    groups: &[GroupLayout],
    tables: &[TableSpec],
) -> Vec<String> {
    let order = builders::input_layer_order(arch, groups);
    let unpooled = builders::unpooled_groups(arch, groups);
    // EasyRec 0.7.1 makes a backbone's input layers under its scope.
    let within = match arch.backbone().map(|b| b.release) {
        Some(Release::V071) => "backbone/",
        _ => "",
    };
    // Each group's input-layer scope: one per call of TensorFlow's
    // input_layer, which a group read unpooled (`is_combine=False`) makes
    // only for its plain features.
    let mut scopes = Vec::with_capacity(order.len());
    let mut calls = 0;
    for &gi in &order {
        scopes.push(calls);
        if !unpooled.contains(&gi) || !groups[gi].parts.is_empty() {
            calls += 1;
        }
    }
    (0..tables.len())
        .map(|t| {
            let found = order.iter().zip(&scopes).find_map(|(&gi, &k)| {
                let g = &groups[gi];
                let plain = g
                    .parts
                    .iter()
                    .find(|p| p.table == Some(t))
                    .map(|p| (k, p.feature, false));
                let seq = || {
                    g.seq_parts
                        .iter()
                        .find(|p| p.kind.table() == Some(t))
                        .map(|p| (k, p.feature, unpooled.contains(&gi)))
                };
                plain.or_else(seq)
            });
            match found {
                Some((k, fi, unpooled)) => {
                    let f = &features[fi];
                    if unpooled {
                        // EasyRec's get_sequence_feature: the scope
                        // `input_layer/<categorical column>`, where a shared
                        // table is made too when this is its first reader.
                        format!("{within}{}/{}/embedding_weights", scope(0), f.name)
                    } else if f.table != f.name {
                        // A shared table (embedding_name) is a variable of its own name.
                        format!("{within}{}/{}/embedding_weights", scope(k), f.table)
                    } else {
                        format!("{within}{}/{}/embedding_weights", scope(k), f.easyrec_column())
                    }
                }
                None => format!("{}/embedding_weights", tables[t].name),
            }
        })
        .collect()
}

/// Names a backbone's variables after the EasyRec release that wrote the
/// TensorFlow checkpoint in `dir` (see `backbone::Release`), or that a
/// checkpoint of ours in `dir` (a model_dir's latest, or the checkpoint
/// itself) was trained under (a backbone fine-tuned from EasyRec 0.7.1
/// keeps that release's variables), when the model has a backbone;
/// otherwise leaves `arch` as it is.
pub fn follow_checkpoint_release(arch: &mut Arch, dir: &std::path::Path) -> anyhow::Result<()> {
    // Only a backbone looks: other models read no checkpoint here.
    if arch.backbone_mut().is_none() {
        return Ok(());
    }
    if let Some(prefix) = crate::checkpoint::tensorflow::find(dir) {
        return follow_release_of(arch, &TfCheckpoint::open(&prefix)?, &prefix);
    }
    let own = match dir.join("manifest.json").is_file() {
        true => Some(dir.to_path_buf()),
        false => crate::checkpoint::latest(dir)?,
    };
    match own {
        Some(own) => follow_release_of_own(arch, &crate::checkpoint::tensor_names(&own), &own),
        None => Ok(()),
    }
}

/// `follow_checkpoint_release` for a checkpoint of ours at `dir` holding
/// tensors `names`.
pub fn follow_release_of_own(arch: &mut Arch, names: &[String], dir: &std::path::Path) -> anyhow::Result<()> {
    follow_release_named(
        arch,
        names.iter().map(String::as_str),
        dir,
        "a backbone trained from EasyRec 0.7.1's checkpoint, under that release's names",
    )
}

/// Sets a backbone's release from a checkpoint's tensor `names`, logging
/// `what` for 0.7.1's; refuses 0.7.1's names for a Keras layer that
/// release names by Keras' automatic names (which are not reproduced).
fn follow_release_named<'a>(
    arch: &mut Arch,
    names: impl Iterator<Item = &'a str>,
    at: &std::path::Path,
    what: &str,
) -> anyhow::Result<()> {
    let Some(b) = arch.backbone_mut() else {
        return Ok(());
    };
    b.release = Release::detect(names);
    if b.release != Release::V071 {
        return Ok(());
    }
    if let Some((path, class)) = b.named_automatically_in_071() {
        anyhow::bail!(
            "{}: {what}, but {path} is a {class}: EasyRec 0.7.1 names that layer's variables after Keras' \
             automatic layer names (`se_net_1/...`, `mask_block/...`, unnamed `dense_<k>`), which are not \
             supported; a checkpoint written by later EasyRec (variables under the block's name) is read",
            at.display()
        );
    }
    log::info!("{}: {what}", at.display());
    Ok(())
}

/// `follow_checkpoint_release` with the TensorFlow checkpoint (at
/// `prefix`) already open.
pub fn follow_release_of(arch: &mut Arch, ckpt: &TfCheckpoint, prefix: &std::path::Path) -> anyhow::Result<()> {
    follow_release_named(
        arch,
        ckpt.entries.keys().map(String::as_str),
        prefix,
        "a backbone written by EasyRec 0.7.1, read by that release's names",
    )
}

/// The shape TensorFlow gives a dense parameter: kernels are matrices,
/// other parameters of one row or column (biases, batch-norm parameters
/// and statistics, cross weights) are vectors.
pub fn variable_shape(spec: &ParamSpec) -> Vec<usize> {
    if spec.name.ends_with("kernel") || (spec.rows > 1 && spec.cols > 1) {
        vec![spec.rows, spec.cols]
    } else {
        vec![spec.rows * spec.cols]
    }
}

/// The checkpoint name of optimizer slot `k` of variable `var`: TensorFlow's
/// (`<var>/Adam`, `<var>/Adam_1`, `<var>/Adagrad`, ...) where its optimizer
/// has the same state, else `<var>/<slot>`.
pub fn slot_variable(var: &str, kind: &OptimizerKind, k: usize) -> String {
    let name = tf_slot_names(kind)
        .get(k)
        .or(slot_names(kind).get(k))
        .copied()
        .unwrap_or("slot");
    format!("{var}/{name}")
}

/// Whether a TensorFlow variable is optimizer or training state rather
/// than a weight of the model: Adam's and Adagrad's slots, the beta powers,
/// the global step, moving averages of the weights.
pub fn is_training_state(name: &str) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    crate::optim::TF_SLOTS.contains(&last)
        || matches!(name, "global_step" | "beta1_power" | "beta2_power")
        || name.contains("ExponentialMovingAverage")
}

fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// Variable `name`, or its partitions `name/part_0`, `name/part_1`, ...
/// joined along the first dimension. `None` when there is neither.
fn read_variable(ckpt: &TfCheckpoint, name: &str, used: &mut HashSet<String>) -> Result<Option<Loaded>, Unusable> {
    if ckpt.entries.contains_key(name) {
        used.insert(name.to_string());
        return ckpt.read_f32(name).map(Some);
    }
    let mut parts = Vec::new();
    while let Some(p) = Some(format!("{name}/part_{}", parts.len())).filter(|p| ckpt.entries.contains_key(p)) {
        parts.push(ckpt.read_f32(&p)?);
        used.insert(p);
    }
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let tail = first.shape.get(1..).unwrap_or_default().to_vec();
    if parts.iter().any(|p| p.shape.is_empty() || p.shape[1..] != tail[..]) {
        return Err(Unusable(format!(
            "TensorFlow checkpoint {}: the partitions of `{name}` do not fit together",
            ckpt.prefix().display()
        )));
    }
    let rows = parts.iter().map(|p| p.shape[0]).sum();
    let mut shape = vec![rows];
    shape.extend(tail);
    Ok(Some(Loaded::f32(
        shape,
        parts.into_iter().flat_map(|p| p.data).collect(),
    )))
}

/// Weights keyed by their names in the model, in the model's shapes, and
/// the names of the checkpoint's weights left unused.
pub type Imported = (BTreeMap<String, Loaded>, Vec<String>);

/// The weights of `model` from EasyRec checkpoint `ckpt`, keyed by their
/// names in the model (which checkpoints of this trainer use too).
/// With `partial` (fine-tuning), variables the checkpoint lacks are left
/// out; otherwise they are an error. Returns the values and the names of
/// the checkpoint's weights the model has no place for.
///
/// `renames` (fine_tune_ckpt_var_map) reads a model variable, by its EasyRec
/// name, from another checkpoint variable.
pub fn from_tensorflow(
    ckpt: &TfCheckpoint,
    model: &Model,
    partial: bool,
    renames: &[(String, String)],
) -> Result<Imported, Unusable> {
    let mut wanted: Vec<(String, Vec<usize>)> = Vec::new();
    for s in model.params.specs.iter().chain(&model.buffers.specs) {
        wanted.push((s.name.clone(), variable_shape(s)));
    }
    for (t, var) in model.tables.iter().zip(&model.table_variables) {
        wanted.push((var.clone(), vec![t.rows, t.dim]));
    }
    let mut used = HashSet::new();
    let mut missing = Vec::new();
    let mut out = BTreeMap::new();
    for (name, shape) in wanted {
        let var = renames.iter().find(|(m, _)| *m == name).map_or(&name, |(_, c)| c);
        let Some(mut l) = read_variable(ckpt, var, &mut used)? else {
            missing.push(format!("{var} {shape:?}"));
            continue;
        };
        if let Some(n) = leading_rows(var, &l.shape, &shape) {
            l.data.truncate(n);
        } else if squeezed(&l.shape) != squeezed(&shape) {
            return Err(Unusable(format!(
                "TensorFlow checkpoint {}: `{var}` has shape {:?}, the model needs {shape:?}",
                ckpt.prefix().display(),
                l.shape
            )));
        }
        out.insert(name, Loaded::f32(shape, l.data));
    }
    if !missing.is_empty() && !partial {
        return Err(Unusable(format!(
            "TensorFlow checkpoint {} lacks {} variable(s) of this model: {}",
            ckpt.prefix().display(),
            missing.len(),
            missing.join(", ")
        )));
    }
    let unused = ckpt
        .entries
        .keys()
        .filter(|n| !used.contains(n.as_str()) && !is_training_state(n))
        .cloned()
        .collect();
    Ok((out, unused))
}

/// A position table (`.../position_embedding/...`) holds
/// `max_position_embeddings` rows in EasyRec, of which its
/// `embedding_postprocessor` reads the first as many as the sequence has
/// positions; the model holds only those. When `have` is such a table with
/// at least `want`'s rows of `want`'s width, the number of values to take
/// from its start.
pub fn leading_rows(name: &str, have: &[usize], want: &[usize]) -> Option<usize> {
    let position_table = name.starts_with("position_embedding/") || name.contains("/position_embedding/");
    match (have, want) {
        ([hr, hw], [wr, ww]) if position_table && hw == ww && hr > wr => Some(wr * ww),
        _ => None,
    }
}

/// Refuses a checkpoint with weights the model has no place for: it is
/// another model's, and using part of it would be silently wrong.
pub fn refuse_unused(ckpt: &TfCheckpoint, unused: &[String]) -> Result<(), Unusable> {
    if unused.is_empty() {
        return Ok(());
    }
    Err(Unusable(format!(
        "TensorFlow checkpoint {} holds {} weight(s) this model has no place for (is it another model's?): {}",
        ckpt.prefix().display(),
        unused.len(),
        unused.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::leading_rows;

    #[test]
    fn only_a_longer_position_table_of_the_same_width_is_read_from_its_start() {
        let name = "cmbf/position_embedding/position_embeddings_0";
        assert_eq!(leading_rows(name, &[20, 8], &[6, 8]), Some(48));
        assert_eq!(
            leading_rows("position_embedding/img_position_embeddings", &[5, 4], &[3, 4]),
            Some(12)
        );
        assert_eq!(leading_rows(name, &[20, 8], &[6, 4]), None, "another width");
        assert_eq!(leading_rows(name, &[4, 8], &[6, 8]), None, "fewer rows");
        assert_eq!(
            leading_rows(name, &[6, 8], &[6, 8]),
            None,
            "the same shape needs no cut"
        );
        assert_eq!(
            leading_rows("dnn/dense/kernel", &[20, 8], &[6, 8]),
            None,
            "not a position table"
        );
    }
}
