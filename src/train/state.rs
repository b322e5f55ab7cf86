//! Saving and restoring a trainer: weights and optimizer slots of the dense
//! model and of every table, under stable names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::Trainer;
use crate::checkpoint::tensorflow::TfCheckpoint;
use crate::checkpoint::{self, Loaded, TensorRef};
use crate::model::names;
use crate::optim::slot_names;

impl Trainer {
    /// Dense parameters (with their optimizer slots when `slots`) and
    /// buffers, under EasyRec's names and TensorFlow's shapes.
    fn dense_tensors(&self, slots: bool) -> Vec<TensorRef<'_>> {
        let kind = &self.plan.train.optimizers[self.assign.dense].kind;
        let mut out = Vec::new();
        for s in &self.model.params.specs {
            let shape = names::variable_shape(s);
            out.push(TensorRef::new(
                s.name.clone(),
                shape.clone(),
                &self.model.params.values[s.range()],
            ));
            if slots {
                for (k, slot) in self.dense.slots.slots.iter().enumerate() {
                    out.push(TensorRef::new(
                        names::slot_variable(&s.name, kind, k),
                        shape.clone(),
                        &slot[s.range()],
                    ));
                }
            }
        }
        for s in &self.model.buffers.specs {
            out.push(TensorRef::new(
                s.name.clone(),
                names::variable_shape(s),
                &self.model.buffers.values[s.range()],
            ));
        }
        out
    }

    /// This rank's rows of every table (with their optimizer slots when
    /// `slots`): the whole tables unless they are sharded.
    fn table_tensors(&self, slots: bool) -> Vec<TensorRef<'_>> {
        let mut out = Vec::new();
        for (t, var) in self.embeddings.tables.iter().zip(&self.model.table_variables) {
            let kind = &self.plan.train.optimizers[t.optimizer].kind;
            out.extend(t.tensors(var, kind, slots));
        }
        out
    }

    /// Writes checkpoint `model.ckpt-<step>` into model_dir.
    /// On several ranks, sharded tables are gathered and rank 0 writes one
    /// checkpoint that any world size can restore; the others wait for it.
    pub fn save(&mut self) -> anyhow::Result<PathBuf> {
        self.settle_device();
        // steps_to_live: key-value rows gone stale are not saved.
        self.embeddings
            .evict_stale(self.step, &*self.comm, &self.model.table_variables);
        let dir = &self.plan.model_dir;
        let rank = self.comm.rank();
        let context = || format!("saving checkpoint {} in {}", self.step, dir.display());
        // Rank 0 stages the directory; any error aborts the job (the caller's
        // error path), so the others never wait on a barrier alone.
        // With a remote model_dir every rank has its own local copy to stage in.
        let tmp = if rank == 0 || self.mirror.is_some() {
            checkpoint::stage(dir, self.step).with_context(context)?
        } else {
            dir.join(format!(".{}.tmp", checkpoint::ckpt_name(self.step)))
        };
        self.comm.barrier();
        // Every rank's stream position, joined (a collective: all ranks).
        let stream = self.stream_offsets();
        let mut parts = Vec::new();
        let table_file = if self.embeddings.sharding.is_sharded() {
            // Every rank holding rows writes them (under asynchronous
            // training the servers do, the workers hold none); rank 0 learns
            // their checksums.
            let mine = match self.embeddings.sharding.shard() {
                Some((index, count)) => {
                    let name = checkpoint::shard_file(index, count);
                    let tables = self.table_tensors(true);
                    let mut w =
                        checkpoint::write_part(&tmp, &name, &tables, Some((index, count))).with_context(context)?;
                    w.concat = self.key_value_names();
                    if let Some(m) = self.mirror.as_ref().filter(|_| rank != 0) {
                        // The first rank publishes the checkpoint after the
                        // gather below: this rank's part is there by then.
                        let rel = format!("{}/{name}", checkpoint::ckpt_name(self.step));
                        m.upload(&tmp.join(&name), &rel).with_context(context)?;
                    }
                    vec![w.bytes, w.checksum, index as u64, count as u64]
                }
                None => Vec::new(),
            };
            for s in self.comm.all_gather_u64(&mine).iter().filter(|s| s.len() == 4) {
                let (index, count) = (s[2] as usize, s[3] as usize);
                parts.push(checkpoint::Written {
                    name: checkpoint::shard_file(index, count),
                    bytes: s[0],
                    checksum: s[1],
                    shard: Some((index, count)),
                    concat: self.key_value_names(),
                });
            }
            "embedding-*.safetensors".to_string()
        } else {
            "embedding.safetensors".to_string()
        };
        let shard_names: Vec<String> = parts
            .iter()
            .filter(|w| w.shard.is_some())
            .map(|w| w.name.clone())
            .collect();
        if rank == 0 {
            // A failed write (a full disk) leaves no half checkpoint behind.
            let written = self.write_rank0_parts(&tmp, parts, (&table_file, stream.as_ref()));
            if let Err(e) = written {
                std::fs::remove_dir_all(&tmp).ok();
                return Err(e.context(context()));
            }
            if let Some(m) = &self.mirror {
                // The other ranks' shards, published by them before the
                // gather, complete this copy (an export reads it whole).
                let own = self
                    .embeddings
                    .sharding
                    .shard()
                    .map(|(i, n)| checkpoint::shard_file(i, n));
                let ckpt = checkpoint::ckpt_name(self.step);
                for name in shard_names.iter().filter(|n| Some(*n) != own.as_ref()) {
                    m.fetch(&format!("{ckpt}/{name}")).with_context(context)?;
                }
                m.push()
                    .with_context(|| format!("publishing checkpoint {} to {}", self.step, m.url()))?;
            }
        } else if self.mirror.is_some() {
            std::fs::remove_dir_all(&tmp).ok();
        }
        // The others only go on once the checkpoint is complete.
        self.comm.barrier();
        Ok(dir.join(checkpoint::ckpt_name(self.step)))
    }

    /// Rank 0's part of `save`: the dense file, whole tables when they are
    /// not sharded, and the commit.
    fn write_rank0_parts(
        &self,
        tmp: &Path,
        mut parts: Vec<checkpoint::Written>,
        (table_file, stream): (&str, Option<&checkpoint::StreamOffsets>),
    ) -> anyhow::Result<()> {
        let dense = self.dense_tensors(true);
        parts.push(checkpoint::write_part(tmp, "dense.safetensors", &dense, None)?);
        let mut names: Vec<(String, String, Vec<usize>)> = dense
            .iter()
            .map(|t| (t.name.clone(), "dense.safetensors".to_string(), t.shape.clone()))
            .collect();
        if self.embeddings.sharding.is_sharded() {
            // Key-value tables' parts have each rank's own length.
            names.extend(
                self.table_variable_shapes(true)
                    .into_iter()
                    .map(|(n, shape)| (n, table_file.to_string(), shape)),
            );
        } else {
            let tables = self.table_tensors(true);
            parts.push(checkpoint::write_part(tmp, table_file, &tables, None)?);
            names.extend(
                tables
                    .iter()
                    .map(|t| (t.name.clone(), table_file.to_string(), t.shape.clone())),
            );
        }
        let keep = self.plan.train.keep_checkpoint_max as usize;
        let stamp = checkpoint::Stamp {
            step: self.step,
            seed: self.seed,
            stream: stream.cloned(),
        };
        checkpoint::commit(&self.plan.model_dir, &stamp, tmp, &parts, &names, keep)?;
        Ok(())
    }

    /// Restores weights, slots and the global step (resuming training),
    /// from this trainer's checkpoint or from EasyRec's (TensorFlow's).
    pub fn restore(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.settle_device();
        if let Some(prefix) = checkpoint::tensorflow::find(dir) {
            return self.restore_tensorflow(&prefix);
        }
        let (step, mut tensors) = checkpoint::load(dir)?;
        if let Some(seed) = checkpoint::seed_of(dir).filter(|s| *s != self.seed) {
            // Dropout and the order of the input go on as they began.
            log::warn!(
                "{} was trained with seed {seed}; the run goes on with it, not with {}",
                dir.display(),
                self.seed
            );
            self.seed = seed;
            self.plan.train.seed = seed;
        }
        self.restore_key_value(&mut tensors, true, dir)?;
        let mut values: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        for (name, shape) in self.variables(true) {
            let data = checkpoint::take(&mut tensors, &name, &shape, dir)?;
            values.insert(name, data);
        }
        self.assign_values(values, true);
        self.step = step;
        self.resumed_stream = checkpoint::StreamOffsets::of(dir)?;
        Ok(())
    }

    /// Restores an EasyRec checkpoint: every weight, the optimizer slots
    /// TensorFlow saved under its names for this trainer's optimizers
    /// (others start afresh), and the global step.
    fn restore_tensorflow(&mut self, prefix: &Path) -> anyhow::Result<()> {
        self.refuse_key_value_from_tensorflow(prefix)?;
        let ckpt = TfCheckpoint::open(prefix)?;
        let (weights, unused) = names::from_tensorflow(&ckpt, &self.model, false, &[])?;
        names::refuse_unused(&ckpt, &unused)?;
        let mut values: BTreeMap<String, Vec<f32>> = weights.into_iter().map(|(k, l)| (k, l.data)).collect();
        // Slots carry TensorFlow's names where its optimizer keeps the same
        // state, so they are read by the names this trainer saves them under.
        let mut missing = 0;
        for (name, shape) in self.variables(true) {
            if values.contains_key(&name) {
                continue;
            }
            if !ckpt.entries.contains_key(&name) {
                missing += 1;
                continue;
            }
            let mut l = ckpt.read_f32(&name)?;
            if let Some(n) = names::leading_rows(&name, &l.shape, &shape) {
                l.data.truncate(n);
            }
            if l.data.len() != shape.iter().product::<usize>() {
                bail!(checkpoint::Unusable(format!(
                    "TensorFlow checkpoint {}: optimizer slot `{name}` has shape {:?}, which does not fit its variable",
                    prefix.display(),
                    l.shape
                )));
            }
            values.insert(name, l.data);
        }
        if missing > 0 {
            log::warn!(
                "{}: {missing} optimizer slot(s) of this trainer's optimizers are not in the checkpoint; they start from zero",
                prefix.display()
            );
        }
        self.assign_values(values, true);
        self.step = ckpt.global_step()?.unwrap_or(0);
        Ok(())
    }

    /// Copies tensors into place by name; with `slots`, optimizer state too.
    fn assign_values(&mut self, mut values: BTreeMap<String, Vec<f32>>, slots: bool) {
        let dense_kind = self.plan.train.optimizers[self.assign.dense].kind.clone();
        for s in self.model.params.specs.clone() {
            if let Some(v) = values.remove(&s.name) {
                self.model.params.values[s.range()].copy_from_slice(&v);
            }
            if slots {
                for k in 0..self.dense.slots.slots.len() {
                    if let Some(v) = values.remove(&names::slot_variable(&s.name, &dense_kind, k)) {
                        self.dense.slots.slots[k][s.range()].copy_from_slice(&v);
                    }
                }
            }
        }
        for s in self.model.buffers.specs.clone() {
            if let Some(v) = values.remove(&s.name) {
                self.model.buffers.values[s.range()].copy_from_slice(&v);
            }
        }
        for (t, var) in self.embeddings.tables.iter_mut().zip(&self.model.table_variables) {
            if t.is_key_value() {
                continue; // restore_key_value
            }
            // A whole table, of which a sharded one keeps its own rows.
            let (sharding, dim) = (t.sharding, t.dim);
            // Into the table's own buffers where the sizes agree (they
            // keep their huge pages, `util::table_buffer`).
            let put = |into: &mut Vec<f32>, v: Vec<f32>| {
                let v = sharding.own_rows(&v, dim);
                if into.len() == v.len() {
                    into.copy_from_slice(&v);
                } else {
                    *into = v;
                }
            };
            if let Some(v) = values.remove(var) {
                put(&mut t.weights, v);
            }
            if slots {
                let kind = &self.plan.train.optimizers[t.optimizer].kind;
                for k in 0..t.state.slots.len() {
                    if let Some(v) = values.remove(&names::slot_variable(var, kind, k)) {
                        put(&mut t.state.slots[k], v);
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
        let renames = match var_map {
            Some(p) => parse_var_map(p)?,
            None => Vec::new(),
        };
        if let Some(prefix) = checkpoint::tensorflow::find(&dir) {
            self.refuse_key_value_from_tensorflow(&prefix)?;
            // EasyRec's checkpoint: variables (and the var map) by EasyRec's names.
            let ckpt = TfCheckpoint::open(&prefix)?;
            let (weights, unused) = names::from_tensorflow(&ckpt, &self.model, true, &renames)?;
            if !unused.is_empty() {
                log::warn!(
                    "fine_tune_checkpoint {}: {} weight(s) have no place in this model and are not used: {}",
                    prefix.display(),
                    unused.len(),
                    unused.join(", ")
                );
            }
            let n = weights.len();
            self.assign_values(weights.into_iter().map(|(k, l)| (k, l.data)).collect(), false);
            return Ok(n);
        }
        let (_, mut tensors) = checkpoint::load(&dir)?;
        let key_value = self.restore_key_value(&mut tensors, false, &dir)?;
        let mut values = BTreeMap::new();
        for (name, shape) in self.variables(false) {
            let src = renames
                .iter()
                .find(|(model, _)| *model == name)
                .map_or(name.clone(), |(_, ckpt)| ckpt.clone());
            // One checkpoint tensor may feed several model variables.
            let Some(Loaded { shape: s, data, .. }) = tensors.get(&src) else {
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
        let n = values.len() + key_value;
        self.assign_values(values, false);
        Ok(n)
    }

    /// Restores every key-value table from a checkpoint's tensors (removing
    /// them; with `slots`, their optimizer slots too); returns how many.
    fn restore_key_value(
        &mut self,
        tensors: &mut BTreeMap<String, Loaded>,
        slots: bool,
        dir: &Path,
    ) -> anyhow::Result<usize> {
        let mut n = 0;
        for (t, var) in self.embeddings.tables.iter_mut().zip(&self.model.table_variables) {
            // Fine-tuning (no slots) copies what the checkpoint has.
            if t.is_key_value() && (slots || tensors.contains_key(&format!("{var}-keys"))) {
                let kind = &self.plan.train.optimizers[t.optimizer].kind;
                t.restore_key_value(var, kind, tensors, (slots, dir))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// EasyRec's embedding variables are saved by DeepRec in its own
    /// layout, which is not read here: refused naming the table.
    fn refuse_key_value_from_tensorflow(&self, prefix: &Path) -> anyhow::Result<()> {
        if let Some((_, var)) = self
            .embeddings
            .tables
            .iter()
            .zip(&self.model.table_variables)
            .find(|(t, _)| t.is_key_value())
        {
            bail!(checkpoint::Unusable(format!(
                "TensorFlow checkpoint {}: table `{var}` is a key-value table (ev_params), and restoring DeepRec's \
                 embedding variables from a TensorFlow checkpoint is not supported",
                prefix.display()
            )));
        }
        Ok(())
    }

    /// The tensors of key-value tables, which a sharded checkpoint joins end
    /// to end.
    fn key_value_names(&self) -> Vec<String> {
        self.embeddings
            .tables
            .iter()
            .zip(&self.model.table_variables)
            .filter(|(t, _)| t.is_key_value())
            .flat_map(|(t, var)| {
                let kind = &self.plan.train.optimizers[t.optimizer].kind;
                crate::embedding::Table::key_value_names(var, kind, t.state.slots.len())
            })
            .collect()
    }

    /// Names and shapes of the tensors a checkpoint of this model holds;
    /// without `slots`, only weights and buffers (what fine-tuning copies).
    pub fn variables(&self, slots: bool) -> Vec<(String, Vec<usize>)> {
        let mut out: Vec<(String, Vec<usize>)> = self
            .dense_tensors(slots)
            .into_iter()
            .map(|t| (t.name, t.shape))
            .collect();
        out.extend(self.table_variable_shapes(slots));
        out
    }

    /// Names and whole shapes of the tables (and their slots when `slots`).
    fn table_variable_shapes(&self, slots: bool) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        for (t, var) in self.embeddings.tables.iter().zip(&self.model.table_variables) {
            if t.is_key_value() {
                continue; // its tensors' shapes are its keys'
            }
            out.push((var.clone(), vec![t.rows, t.dim]));
            if slots {
                let kind = &self.plan.train.optimizers[t.optimizer].kind;
                for k in 0..slot_names(kind).len() {
                    out.push((names::slot_variable(var, kind, k), vec![t.rows, t.dim]));
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
