//! A key-value table in checkpoints, under DeepRec's EmbeddingVariable
//! names beside the variable's: `<var>` its rows `[n, dim]` ascending by key,
//! `<var>-keys`, `<var>-freqs` (sightings) and `<var>-versions` (the step
//! each was last seen) `[n]`, the optimizer slots under their usual names
//! `[n, dim]`, and the keys still below filter_freq with their counts in
//! `<var>-keys_filtered` / `<var>-freqs_filtered`. On several ranks each
//! rank writes its own keys and the parts join end to end; a restore on
//! any number of ranks keeps the keys each rank owns.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Storage, Table};
use crate::checkpoint::{Loaded, TensorRef, Unusable};
use crate::config::train_plan::OptimizerKind;
use crate::embedding::KeyState;
use crate::model::names;

const KEYS: &str = "-keys";
const FREQS: &str = "-freqs";
const VERSIONS: &str = "-versions";
const KEYS_FILTERED: &str = "-keys_filtered";
const FREQS_FILTERED: &str = "-freqs_filtered";

impl Table {
    /// Whether the table is stored as a key-value table.
    pub fn is_key_value(&self) -> bool {
        matches!(self.storage, Storage::KeyValue(_))
    }

    /// This rank's tensors of the table under variable `var` (with the
    /// optimizer slots of `kind` when `slots`), as a checkpoint holds them:
    /// an array's rows `[rows, dim]` as they are, a key-value table's keys
    /// with their rows (`key_value_tensors`).
    pub fn tensors(&self, var: &str, kind: &OptimizerKind, slots: bool) -> Vec<TensorRef<'_>> {
        if self.is_key_value() {
            return self.key_value_tensors(var, kind, slots);
        }
        let shape = vec![self.weights.len() / self.dim.max(1), self.dim];
        let mut out = vec![TensorRef::new(var, shape.clone(), &self.weights)];
        if slots {
            for (k, slot) in self.state.slots.iter().enumerate() {
                out.push(TensorRef::new(names::slot_variable(var, kind, k), shape.clone(), slot));
            }
        }
        out
    }

    /// This rank's key-value tensors under variable `var` (with the
    /// optimizer slots of `kind` when `slots`); nothing for an array.
    fn key_value_tensors(&self, var: &str, kind: &OptimizerKind, slots: bool) -> Vec<TensorRef<'static>> {
        let Storage::KeyValue(kv) = &self.storage else {
            return Vec::new();
        };
        let dim = self.dim;
        let (rows, pending) = kv.state();
        let n = rows.len();
        let gather = |src: &[f32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(n * dim);
            for (_, slot) in &rows {
                out.extend_from_slice(&src[slot * dim..(slot + 1) * dim]);
            }
            out
        };
        let mut out = vec![
            TensorRef::owned(var, vec![n, dim], gather(&self.weights)),
            TensorRef::u64(
                format!("{var}{KEYS}"),
                vec![n],
                rows.iter().map(|(s, _)| s.key).collect(),
            ),
            TensorRef::u64(
                format!("{var}{FREQS}"),
                vec![n],
                rows.iter().map(|(s, _)| s.count).collect(),
            ),
            TensorRef::u64(
                format!("{var}{VERSIONS}"),
                vec![n],
                rows.iter().map(|(s, _)| s.seen).collect(),
            ),
            TensorRef::u64(
                format!("{var}{KEYS_FILTERED}"),
                vec![pending.len()],
                pending.iter().map(|s| s.key).collect(),
            ),
            TensorRef::u64(
                format!("{var}{FREQS_FILTERED}"),
                vec![pending.len()],
                pending.iter().map(|s| s.count).collect(),
            ),
        ];
        if slots {
            for (k, slot) in self.state.slots.iter().enumerate() {
                out.push(TensorRef::owned(
                    names::slot_variable(var, kind, k),
                    vec![n, dim],
                    gather(slot),
                ));
            }
        }
        out
    }

    /// Restores a key-value table from a checkpoint's (whole) tensors under
    /// `var`, keeping the keys this rank owns; with `slots`, the optimizer
    /// slots too (otherwise they start afresh). An array is left alone.
    pub fn restore_key_value(
        &mut self,
        var: &str,
        kind: &OptimizerKind,
        tensors: &mut BTreeMap<String, Loaded>,
        (slots, dir): (bool, &Path),
    ) -> anyhow::Result<()> {
        let sharding = self.sharding;
        let dim = self.dim;
        let Storage::KeyValue(kv) = &mut self.storage else {
            return Ok(());
        };
        let bad = |what: String| Unusable(format!("checkpoint {}: key-value table `{var}`: {what}", dir.display()));
        let mut take = |suffix: &str| {
            tensors.remove(&format!("{var}{suffix}")).ok_or_else(|| {
                bad(format!(
                    "no tensor `{var}{suffix}` (a checkpoint of a table stored otherwise?)"
                ))
            })
        };
        let values = take("")?;
        let (keys, freqs, versions) = (take(KEYS)?.ints, take(FREQS)?.ints, take(VERSIONS)?.ints);
        let (pending, pending_freqs) = (take(KEYS_FILTERED)?.ints, take(FREQS_FILTERED)?.ints);
        let n = keys.len();
        if values.shape != [n, dim] || freqs.len() != n || versions.len() != n || pending.len() != pending_freqs.len() {
            return Err(bad(format!(
                "rows of shape {:?}, {n} keys, {} counts and {} steps do not fit a table of dim {dim}",
                values.shape,
                freqs.len(),
                versions.len()
            ))
            .into());
        }
        let mut slot_values = Vec::new();
        for k in 0..self.state.slots.len() {
            let name = names::slot_variable(var, kind, k);
            match tensors.remove(&name) {
                Some(l) if slots && l.shape == [n, dim] => slot_values.push(Some(l.data)),
                Some(l) if slots => {
                    return Err(bad(format!("slot `{name}` has shape {:?}, its rows [{n}, {dim}]", l.shape)).into())
                }
                _ => slot_values.push(None),
            }
        }
        kv.clear();
        self.weights.clear();
        for s in &mut self.state.slots {
            s.clear();
        }
        let mine = |key: u64| !sharding.is_sharded() || sharding.shard().is_some_and(|(r, _)| sharding.owner(key) == r);
        for i in (0..n).filter(|&i| mine(keys[i])) {
            kv.restore_row(KeyState {
                key: keys[i],
                count: freqs[i],
                seen: versions[i],
            });
            self.weights.extend_from_slice(&values.data[i * dim..(i + 1) * dim]);
            for ((s, v), init) in self.state.slots.iter_mut().zip(&slot_values).zip(&kv.init.slots) {
                match v {
                    Some(v) => s.extend_from_slice(&v[i * dim..(i + 1) * dim]),
                    None => s.extend(std::iter::repeat_n(*init, dim)),
                }
            }
        }
        for (key, count) in pending.into_iter().zip(pending_freqs).filter(|(k, _)| mine(*k)) {
            kv.restore_pending(KeyState { key, count, seen: 0 });
        }
        Ok(())
    }

    /// The names of the key-value tensors `key_value_tensors` writes.
    pub fn key_value_names(var: &str, kind: &OptimizerKind, slots: usize) -> Vec<String> {
        let mut out: Vec<String> = ["", KEYS, FREQS, VERSIONS, KEYS_FILTERED, FREQS_FILTERED]
            .iter()
            .map(|s| format!("{var}{s}"))
            .collect();
        out.extend((0..slots).map(|k| names::slot_variable(var, kind, k)));
        out
    }
}
