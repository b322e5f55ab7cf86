//! Saving and restoring a trainer: weights and optimizer slots of the dense
//! model and of every table, under stable names.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::Trainer;
use crate::checkpoint::{self, Loaded, TensorRef};
use crate::embedding::Table;
use crate::optim::slot_names;

impl Trainer {
    /// Dense parameters (with their optimizer slots when `slots`) and buffers.
    fn dense_tensors(&self, slots: bool) -> Vec<TensorRef<'_>> {
        let names = if slots {
            slot_names(&self.plan.optimizers[self.assign.dense].kind)
        } else {
            &[]
        };
        let mut out = Vec::new();
        for s in &self.model.params.specs {
            out.push(TensorRef::new(
                format!("dense/{}", s.name),
                vec![s.rows, s.cols],
                &self.model.params.values[s.range()],
            ));
            for (slot, sname) in self.dense_state.slots.iter().zip(names) {
                out.push(TensorRef::new(
                    format!("dense/{}/{sname}", s.name),
                    vec![s.rows, s.cols],
                    &slot[s.range()],
                ));
            }
        }
        for s in &self.model.buffers.specs {
            out.push(TensorRef::new(
                format!("dense/{}", s.name),
                vec![s.rows, s.cols],
                &self.model.buffers.values[s.range()],
            ));
        }
        out
    }

    /// The whole of a table-shaped buffer (weights or a slot) of `t`: this
    /// rank's rows as they are, or, for a sharded table, every rank's rows
    /// gathered and put back in global order (a collective).
    fn whole<'a>(&self, t: &Table, local: &'a [f32]) -> Cow<'a, [f32]> {
        if t.shard.1 == 1 {
            return Cow::Borrowed(local);
        }
        let parts = self.comm.all_gather_f32(local);
        let (size, dim) = (t.shard.1, t.dim);
        let mut out = vec![0.0f32; t.rows * dim];
        for (rank, part) in parts.iter().enumerate() {
            for (l, row) in part.chunks(dim).enumerate() {
                let g = l * size + rank;
                out[g * dim..(g + 1) * dim].copy_from_slice(row);
            }
        }
        Cow::Owned(out)
    }

    /// Every table (with its optimizer slots when `slots`), whole.
    fn table_tensors(&self, slots: bool) -> Vec<TensorRef<'_>> {
        let mut out = Vec::new();
        for t in &self.tables {
            let shape = vec![t.rows, t.dim];
            let tensor = |name: String, data| TensorRef {
                name,
                shape: shape.clone(),
                data,
            };
            out.push(tensor(format!("embedding/{}", t.name), self.whole(t, &t.weights)));
            let names = if slots {
                slot_names(&self.plan.optimizers[t.optimizer].kind)
            } else {
                &[]
            };
            for (slot, sname) in t.state.slots.iter().zip(names) {
                out.push(tensor(format!("embedding/{}/{sname}", t.name), self.whole(t, slot)));
            }
        }
        out
    }

    /// Writes checkpoint `model.ckpt-<step>` into model_dir.
    /// On several ranks, sharded tables are gathered and rank 0 writes one
    /// checkpoint that any world size can restore; the others wait for it.
    pub fn save(&self) -> anyhow::Result<PathBuf> {
        let tables = self.table_tensors(true);
        let path = self.plan.model_dir.join(checkpoint::ckpt_name(self.step));
        let written = if self.comm.rank() == 0 {
            checkpoint::save(
                &self.plan.model_dir,
                self.step,
                &[
                    ("dense.safetensors", self.dense_tensors(true)),
                    ("embedding.safetensors", tables),
                ],
                self.plan.keep_checkpoint_max as usize,
            )
            .with_context(|| format!("saving checkpoint {} in {}", self.step, self.plan.model_dir.display()))
            .map(|_| ())
        } else {
            Ok(())
        };
        // Rank 0's failure aborts the job (the caller's error path); the
        // others only pass the barrier once the checkpoint is complete.
        written?;
        self.comm.barrier();
        Ok(path)
    }

    /// Restores weights, slots and the global step (resuming training).
    pub fn restore(&mut self, dir: &Path) -> anyhow::Result<()> {
        let (step, mut tensors) = checkpoint::load(dir)?;
        let mut values: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        for (name, shape) in self.variables(true) {
            let t = tensors
                .remove(&name)
                .with_context(|| format!("checkpoint {} has no tensor `{name}`", dir.display()))?;
            if t.shape != shape {
                bail!(
                    "checkpoint {}: tensor `{name}` has shape {:?}, the model needs {shape:?}",
                    dir.display(),
                    t.shape
                );
            }
            values.insert(name, t.data);
        }
        self.assign_values(values, true);
        self.step = step;
        Ok(())
    }

    /// Copies tensors into place by name; with `slots`, optimizer state too.
    fn assign_values(&mut self, mut values: BTreeMap<String, Vec<f32>>, slots: bool) {
        let dense_slots = slot_names(&self.plan.optimizers[self.assign.dense].kind);
        for s in self.model.params.specs.clone() {
            if let Some(v) = values.remove(&format!("dense/{}", s.name)) {
                self.model.params.values[s.range()].copy_from_slice(&v);
            }
            if slots {
                for (k, sname) in dense_slots.iter().enumerate() {
                    if let Some(v) = values.remove(&format!("dense/{}/{sname}", s.name)) {
                        self.dense_state.slots[k][s.range()].copy_from_slice(&v);
                    }
                }
            }
        }
        for s in self.model.buffers.specs.clone() {
            if let Some(v) = values.remove(&format!("dense/{}", s.name)) {
                self.model.buffers.values[s.range()].copy_from_slice(&v);
            }
        }
        for t in &mut self.tables {
            // A whole table, of which a sharded one keeps its own rows.
            let (rank, size) = t.shard;
            let mine = |v: Vec<f32>| -> Vec<f32> {
                if size == 1 {
                    return v;
                }
                v.chunks(t.dim).skip(rank).step_by(size).flatten().copied().collect()
            };
            if let Some(v) = values.remove(&format!("embedding/{}", t.name)) {
                t.weights = mine(v);
            }
            if slots {
                let names = slot_names(&self.plan.optimizers[t.optimizer].kind);
                for (k, sname) in names.iter().enumerate() {
                    if let Some(v) = values.remove(&format!("embedding/{}/{sname}", t.name)) {
                        t.state.slots[k] = mine(v);
                    }
                }
            }
        }
    }

    /// Initialises weights from another checkpoint (fine_tune_checkpoint):
    /// variables present under the same name (or as `var_map` renames them)
    /// are copied after a shape check; optimizer slots and the global step
    /// are not. Returns how many tensors were restored.
    pub fn fine_tune(&mut self, path: &Path, var_map: Option<&Path>) -> anyhow::Result<usize> {
        let dir = checkpoint::resolve(path)?;
        let (_, tensors) = checkpoint::load(&dir)?;
        let renames = match var_map {
            Some(p) => parse_var_map(p)?,
            None => Vec::new(),
        };
        let mut values = BTreeMap::new();
        for (name, shape) in self.variables(false) {
            let src = renames
                .iter()
                .find(|(model, _)| *model == name)
                .map_or(name.clone(), |(_, ckpt)| ckpt.clone());
            // One checkpoint tensor may feed several model variables.
            let Some(Loaded { shape: s, data }) = tensors.get(&src) else {
                continue;
            };
            if *s != shape {
                bail!(
                    "fine_tune_checkpoint {}: `{src}` has shape {s:?}, but model variable `{name}` needs {shape:?}",
                    dir.display()
                );
            }
            values.insert(name, data.clone());
        }
        let n = values.len();
        self.assign_values(values, false);
        Ok(n)
    }

    /// Names and shapes of the tensors a checkpoint of this model holds;
    /// without `slots`, only weights and buffers (what fine-tuning copies).
    pub fn variables(&self, slots: bool) -> Vec<(String, Vec<usize>)> {
        let mut out: Vec<(String, Vec<usize>)> = self
            .dense_tensors(slots)
            .into_iter()
            .map(|t| (t.name, t.shape))
            .collect();
        for t in &self.tables {
            out.push((format!("embedding/{}", t.name), vec![t.rows, t.dim]));
            if slots {
                for sname in slot_names(&self.plan.optimizers[t.optimizer].kind) {
                    out.push((format!("embedding/{}/{sname}", t.name), vec![t.rows, t.dim]));
                }
            }
        }
        out
    }
}

/// `fine_tune_ckpt_var_map`: one `model_name checkpoint_name` pair per line.
fn parse_var_map(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read fine_tune_ckpt_var_map {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut it = line.split_whitespace();
        match (it.next(), it.next(), it.next()) {
            (Some(a), Some(b), None) => out.push((a.to_string(), b.to_string())),
            _ => bail!(
                "{}:{}: expected `model_variable checkpoint_variable`",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(out)
}
