//! Checkpoints: `model_dir/model.ckpt-N/` holds safetensors files and a
//! manifest with each file's size and checksum; `model_dir/checkpoint` names
//! the latest, as TensorFlow's does. Everything is written under a temporary
//! name and renamed into place, so a crash never leaves a half checkpoint.

mod lock;
pub mod safetensors;
pub mod tensorflow;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};

use crate::embedding::Sharding;

pub use lock::{hostname, lock_model_dir, ModelDirLock};
pub use safetensors::{read_file, write_file, TensorRef};

pub const FORMAT: &str = "rustrec-checkpoint-3";
/// Checkpoints of the second format named variables otherwise and laid
/// out feature-group columns in config order, not in EasyRec's order.
const CONFIG_ORDER_FORMAT: &str = "rustrec-checkpoint-2";
/// Checkpoints of the first format were trained on ids hashed with FNV-1a;
/// ids are now hashed as TensorFlow hashes them, so their rows would answer
/// other ids.
const FNV_FORMAT: &str = "rustrec-checkpoint-1";
const STATE_FILE: &str = "checkpoint";

/// A checkpoint the user pointed at that cannot be used: missing, truncated
/// or otherwise damaged, of another format, or not of this model. The
/// user's files are at fault, not the program (exit 1).
#[derive(Debug)]
pub struct Unusable(pub String);

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unusable {}

impl crate::error::Classified for Unusable {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// One named tensor loaded from a checkpoint: f32 values in `data`, or a
/// key-value table's u64 keys, counts or steps in `ints`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Loaded {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub ints: Vec<u64>,
}

impl Loaded {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        Loaded {
            shape,
            data,
            ints: Vec::new(),
        }
    }

    fn of(shape: Vec<usize>, values: safetensors::Values<'static>) -> Self {
        match values {
            safetensors::Values::F32(v) => Loaded::f32(shape, v.into_owned()),
            safetensors::Values::U64(v) => Loaded {
                shape,
                data: Vec::new(),
                ints: v.into_owned(),
            },
        }
    }
}

/// Removes tensor `name` from the tensors of checkpoint `dir`, checking
/// that it has the `shape` the model needs.
pub fn take(
    tensors: &mut BTreeMap<String, Loaded>,
    name: &str,
    shape: &[usize],
    dir: &Path,
) -> anyhow::Result<Vec<f32>> {
    let t = tensors
        .remove(name)
        .ok_or_else(|| Unusable(format!("checkpoint {} has no tensor `{name}`", dir.display())))?;
    if t.shape != shape {
        return Err(Unusable(format!(
            "checkpoint {}: tensor `{name}` has shape {:?}, the model needs {shape:?}",
            dir.display(),
            t.shape
        ))
        .into());
    }
    Ok(t.data)
}

pub fn ckpt_name(step: u64) -> String {
    format!("model.ckpt-{step}")
}

/// Global step encoded in a checkpoint directory name.
pub fn step_of(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("model.ckpt-")?.parse().ok()
}

/// A file written into a staged checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub name: String,
    pub bytes: u64,
    pub checksum: u64,
    /// (rank, world size) when the file holds one rank's rows of every
    /// table (its rows as `embedding::Sharding::RowWise` places them).
    pub shard: Option<(usize, usize)>,
    /// Tensors of a shard whose parts join end to end in rank order (a
    /// key-value table's rows and keys) rather than row-wise.
    pub concat: Vec<String>,
}

/// Name of rank `rank`'s part of the tables in a checkpoint of `size` ranks.
pub fn shard_file(rank: usize, size: usize) -> String {
    format!("embedding-{rank:05}-of-{size:05}.safetensors")
}

/// Creates the directory a checkpoint is written into before it is renamed
/// into place (removing one a killed run left behind).
pub fn stage(model_dir: &Path, step: u64) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(model_dir).with_context(|| format!("cannot create {}", model_dir.display()))?;
    let tmp = model_dir.join(format!(".{}.tmp", ckpt_name(step)));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).ok();
    }
    fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    Ok(tmp)
}

/// Removes what a killed or failed job left half written in `model_dir`:
/// staged checkpoints and temporary files. Only the holder of the
/// model_dir's lock may call it. Returns how many were removed.
pub fn remove_stale_temporaries(model_dir: &Path) -> anyhow::Result<usize> {
    let Ok(rd) = fs::read_dir(model_dir) else {
        return Ok(0);
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let staged = name.starts_with(".model.ckpt-") && name.ends_with(".tmp");
        // (`.pipeline.config.tmp`: the name earlier versions staged the config under.)
        let temp_file = name.contains(".tmp-") || name == ".pipeline.config.tmp";
        if !(staged || temp_file) {
            continue;
        }
        let p = e.path();
        let r = if p.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        r.with_context(|| format!("cannot remove the stale temporary {}", p.display()))?;
        removed += 1;
    }
    Ok(removed)
}

/// Writes one file of a staged checkpoint (any rank may write its own).
pub fn write_part(
    tmp: &Path,
    name: &str,
    tensors: &[TensorRef<'_>],
    shard: Option<(usize, usize)>,
) -> anyhow::Result<Written> {
    let path = tmp.join(name);
    let (bytes, checksum) = write_file(&path, tensors).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Written {
        name: name.to_string(),
        bytes,
        checksum,
        shard,
        concat: Vec::new(),
    })
}

/// Completes a staged checkpoint: writes the manifest (every file with its
/// size and checksum; `tensors` maps each variable to its file and whole
/// shape), renames it into place, updates the `checkpoint` state file and
/// prunes to `keep_max` checkpoints (0 = keep all).
pub fn commit(
    model_dir: &Path,
    Stamp { step, seed, stream }: &Stamp,
    tmp: &Path,
    parts: &[Written],
    tensors: &[(String, String, Vec<usize>)],
    keep_max: usize,
) -> anyhow::Result<PathBuf> {
    let (step, seed) = (*step, *seed);
    let final_dir = model_dir.join(ckpt_name(step));
    let mut manifest_files = serde_json::Map::new();
    for w in parts {
        let mut entry = json!({"bytes": w.bytes, "checksum": format!("{:016x}", w.checksum)});
        if let Some((rank, size)) = w.shard {
            entry["shard"] = json!([rank, size]);
        }
        if !w.concat.is_empty() {
            entry["concat"] = json!(w.concat);
        }
        manifest_files.insert(w.name.clone(), entry);
    }
    let mut tensor_map = serde_json::Map::new();
    for (name, file, shape) in tensors {
        tensor_map.insert(name.clone(), json!({"file": file, "shape": shape}));
    }
    let world = parts.iter().find_map(|w| w.shard).map_or(1, |s| s.1);
    let mut manifest = json!({
        "format": FORMAT,
        "global_step": step,
        "seed": seed,
        "world_size": world,
        "files": manifest_files,
        "tensors": tensor_map,
    });
    if let Some(s) = stream {
        manifest["stream"] = s.to_json();
    }
    write_synced(
        &tmp.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )?;
    if final_dir.exists() {
        remove(model_dir, step).with_context(|| format!("cannot replace {}", final_dir.display()))?;
    }
    fs::rename(tmp, &final_dir).with_context(|| format!("cannot rename {} into place", tmp.display()))?;
    let mut all = list(model_dir)?;
    if keep_max > 0 && all.len() > keep_max {
        for old in all.drain(..all.len() - keep_max) {
            remove(model_dir, old).ok();
        }
    }
    let mut state = format!("model_checkpoint_path: \"{}\"\n", ckpt_name(step));
    for s in &all {
        state.push_str(&format!("all_model_checkpoint_paths: \"{}\"\n", ckpt_name(*s)));
    }
    write_atomic(&model_dir.join(STATE_FILE), state.as_bytes())?;
    Ok(final_dir)
}

/// Removes checkpoint `step` of `model_dir` so that no reader ever lists
/// part of one: it is renamed out of the listing first (a temporary's name
/// the next job's `remove_stale_temporaries` clears if this one is killed),
/// then deleted. Deleting in place left a listed checkpoint with files
/// missing when a job was killed mid-way (re-saving its last step on a
/// stop signal, or pruning).
pub fn remove(model_dir: &Path, step: u64) -> std::io::Result<()> {
    let doomed = model_dir.join(format!(".{}.old.tmp", ckpt_name(step)));
    if doomed.exists() {
        fs::remove_dir_all(&doomed)?;
    }
    fs::rename(model_dir.join(ckpt_name(step)), &doomed)?;
    fs::remove_dir_all(&doomed)
}

/// Writes `files` (file name -> tensors) as checkpoint `step` from one
/// process: stage, write every file, commit.
pub fn save(
    model_dir: &Path,
    step: u64,
    files: &[(&str, Vec<TensorRef<'_>>)],
    keep_max: usize,
) -> anyhow::Result<PathBuf> {
    let tmp = stage(model_dir, step)?;
    let mut parts = Vec::new();
    let mut tensors = Vec::new();
    for (name, ts) in files {
        parts.push(write_part(&tmp, name, ts, None)?);
        tensors.extend(ts.iter().map(|t| (t.name.clone(), name.to_string(), t.shape.clone())));
    }
    let seed = crate::config::train_plan::DEFAULT_SEED;
    let stamp = Stamp {
        step,
        seed,
        stream: None,
    };
    commit(model_dir, &stamp, &tmp, &parts, &tensors, keep_max)
}

/// The seed checkpoint `dir` was trained with, when its manifest records one.
/// The largest manifest read: a name, file and shape per tensor.
const MANIFEST_MAX_BYTES: u64 = 256 << 20;

/// What a checkpoint records besides its tensors: the global step, the
/// run's seed and, when training read a stream, how far.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    pub step: u64,
    pub seed: u64,
    pub stream: Option<StreamOffsets>,
}

/// The next offset to train on in each partition of a Kafka topic.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOffsets {
    pub topic: String,
    pub offsets: std::collections::BTreeMap<i32, i64>,
}

impl StreamOffsets {
    /// The form checkpoints and incremental updates record.
    pub fn to_json(&self) -> Value {
        let offsets: serde_json::Map<String, Value> =
            self.offsets.iter().map(|(p, o)| (p.to_string(), json!(o))).collect();
        json!({"kafka_topic": self.topic, "next_offsets": offsets})
    }

    /// The offsets checkpoint `dir` records, if it read a stream; a
    /// malformed record is an error naming the file.
    pub fn of(dir: &Path) -> anyhow::Result<Option<StreamOffsets>> {
        let path = dir.join("manifest.json");
        let text = crate::bounded::read_text(&path, MANIFEST_MAX_BYTES)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
        let Some(s) = v.get("stream") else {
            return Ok(None);
        };
        let bad = || anyhow::anyhow!("{}: `stream` is not {{kafka_topic, next_offsets}}", path.display());
        let topic = s["kafka_topic"].as_str().ok_or_else(bad)?.to_string();
        let offsets = s["next_offsets"]
            .as_object()
            .ok_or_else(bad)?
            .iter()
            .map(|(p, o)| Some((p.parse::<i32>().ok()?, o.as_i64()?)))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        Ok(Some(StreamOffsets { topic, offsets }))
    }
}

/// The tensor names checkpoint `dir`'s manifest lists (none where it has
/// no readable manifest).
pub fn tensor_names(dir: &Path) -> Vec<String> {
    let Ok(text) = fs::read_to_string(dir.join("manifest.json")) else {
        return Vec::new();
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(m) => m["tensors"]
            .as_object()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

pub fn seed_of(dir: &Path) -> Option<u64> {
    let text = fs::read_to_string(dir.join("manifest.json")).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["seed"].as_u64()
}

/// Steps of the complete checkpoints in `model_dir`, ascending.
pub fn list(model_dir: &Path) -> anyhow::Result<Vec<u64>> {
    let mut steps = Vec::new();
    let Ok(rd) = fs::read_dir(model_dir) else {
        return Ok(steps);
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() && p.join("manifest.json").is_file() {
            if let Some(s) = step_of(&p) {
                steps.push(s);
            }
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The latest checkpoint of `model_dir`: the one the state file names, else
/// the newest complete directory.
pub fn latest(model_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if let Ok(text) = fs::read_to_string(model_dir.join(STATE_FILE)) {
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("model_checkpoint_path:") {
                let name = rest.trim().trim_matches('"');
                let p = model_dir.join(name);
                if p.join("manifest.json").is_file() {
                    return Ok(Some(p));
                }
            }
        }
    }
    Ok(list(model_dir)?.last().map(|s| model_dir.join(ckpt_name(*s))))
}

/// A checkpoint path as a user gives it: a checkpoint dir, or a model_dir
/// (meaning its latest checkpoint); or a TensorFlow (EasyRec) checkpoint:
/// its prefix `.../model.ckpt-N`, or the model_dir whose `checkpoint` file
/// names it (see `tensorflow::find`).
pub fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    if path.join("manifest.json").is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        if let Some(p) = latest(path)?.or_else(|| tensorflow::find(path)) {
            return Ok(p);
        }
        return Err(Unusable(format!("{} holds no checkpoint", path.display())).into());
    }
    if let Some(p) = tensorflow::find(path) {
        return Ok(p);
    }
    Err(Unusable(format!("checkpoint {} does not exist", path.display())).into())
}

/// Reads and verifies a checkpoint: every file the manifest lists must have
/// its recorded size and checksum.
pub fn load(dir: &Path) -> anyhow::Result<(u64, BTreeMap<String, Loaded>)> {
    let mpath = dir.join("manifest.json");
    let text = fs::read_to_string(&mpath).map_err(|e| Unusable(format!("cannot read {}: {e}", mpath.display())))?;
    let m: Value =
        serde_json::from_str(&text).map_err(|e| Unusable(format!("{} is not valid JSON: {e}", mpath.display())))?;
    if m["format"] == FNV_FORMAT {
        return Err(Unusable(format!(
            "{}: this checkpoint was trained on ids hashed with the FNV-1a hash of earlier versions; ids are \
             now hashed as TensorFlow and EasyRec hash them (FarmHash Fingerprint64), so its embedding rows \
             do not match them: train the model again",
            mpath.display()
        ))
        .into());
    }
    if m["format"] == CONFIG_ORDER_FORMAT {
        return Err(Unusable(format!(
            "{}: this checkpoint was written by an earlier version, which named variables otherwise and \
             ordered a feature group's columns as the config lists them; models now compute as EasyRec does \
             (its variable names, EasyRec's order of columns), so these weights do not fit them: train the model again",
            mpath.display()
        ))
        .into());
    }
    if m["format"] != FORMAT {
        return Err(Unusable(format!(
            "{}: unknown checkpoint format {}",
            mpath.display(),
            m["format"]
        ))
        .into());
    }
    let step = m["global_step"]
        .as_u64()
        .ok_or_else(|| Unusable(format!("{}: no global_step", mpath.display())))?;
    let mut out = BTreeMap::new();
    let mut shards: BTreeMap<String, Vec<(usize, usize, bool, Loaded)>> = BTreeMap::new();
    let files = m["files"]
        .as_object()
        .ok_or_else(|| Unusable(format!("{}: no file list", mpath.display())))?;
    for (name, info) in files {
        let path = dir.join(name);
        let bytes =
            fs::read(&path).map_err(|e| Unusable(format!("checkpoint file {} is missing: {e}", path.display())))?;
        let want = info["bytes"].as_u64().unwrap_or(u64::MAX);
        if bytes.len() as u64 != want {
            return Err(Unusable(format!(
                "checkpoint file {} is truncated or damaged: {} bytes, the manifest says {want}",
                path.display(),
                bytes.len()
            ))
            .into());
        }
        let sum = format!("{:016x}", safetensors::checksum(&bytes));
        if info["checksum"].as_str() != Some(sum.as_str()) {
            return Err(Unusable(format!(
                "checkpoint file {} is damaged: its checksum does not match the manifest",
                path.display()
            ))
            .into());
        }
        let shard = info["shard"]
            .as_array()
            .and_then(|a| Some((a.first()?.as_u64()? as usize, a.get(1)?.as_u64()? as usize)));
        let concat: Vec<&str> = info["concat"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let parsed = read_file(&bytes).map_err(|e| Unusable(format!("cannot parse {}: {e:#}", path.display())))?;
        for (tname, shape, data) in parsed {
            let loaded = Loaded::of(shape, data);
            match shard {
                None => {
                    out.insert(tname, loaded);
                }
                Some((rank, size)) => {
                    let end_to_end = concat.contains(&tname.as_str());
                    shards.entry(tname).or_default().push((rank, size, end_to_end, loaded))
                }
            }
        }
    }
    // Tables written as one part per rank: put the rows back in global
    // order, or end to end (key-value tables).
    for (name, parts) in shards {
        let whole = if parts.iter().all(|p| p.2) {
            join_end_to_end(parts)
        } else if parts.iter().any(|p| p.2) {
            None
        } else {
            let parts: Vec<_> = parts.into_iter().map(|(r, n, _, l)| (r, n, l)).collect();
            join_row_shards(&parts)
        };
        let whole =
            whole.ok_or_else(|| Unusable(format!("{}: the parts of `{name}` do not fit together", dir.display())))?;
        out.insert(name, whole);
    }
    Ok((step, out))
}

/// Joins one tensor's parts (rank, world size, _, part) end to end in rank
/// order along their first dimension; `None` when they are not one
/// tensor's parts.
fn join_end_to_end(mut parts: Vec<(usize, usize, bool, Loaded)>) -> Option<Loaded> {
    parts.sort_by_key(|p| p.0);
    let n = parts.len();
    let tail = parts.first()?.3.shape.get(1..)?.to_vec();
    let mut rows = 0usize;
    let mut out = Loaded::default();
    for (k, (rank, size, _, part)) in parts.into_iter().enumerate() {
        if rank != k || size != n || part.shape.get(1..)? != tail.as_slice() {
            return None;
        }
        rows = rows.checked_add(*part.shape.first()?)?;
        out.data.extend(part.data);
        out.ints.extend(part.ints);
    }
    out.shape = std::iter::once(rows).chain(tail).collect();
    Some(out)
}

/// Puts the row-wise parts of one table (rank, world size, rows) back in
/// global row order; `None` when they are not one table's parts.
fn join_row_shards(parts: &[(usize, usize, Loaded)]) -> Option<Loaded> {
    let dim = parts.first()?.2.shape.get(1).copied().unwrap_or(1);
    let mut rows = 0usize;
    let mut seen = vec![false; parts.len()];
    for (rank, size, part) in parts {
        let (&r, tail) = part.shape.split_first()?;
        if *size != parts.len() || tail.first().copied().unwrap_or(1) != dim || tail.len() > 1 {
            return None;
        }
        if std::mem::replace(seen.get_mut(*rank)?, true) {
            return None;
        }
        rows = rows.checked_add(r)?;
    }
    let mut data = vec![0.0f32; rows.checked_mul(dim)?];
    for (rank, size, part) in parts {
        let sharding = Sharding::row_wise(*rank, *size);
        if part.shape[0] != sharding.local_rows(rows) {
            return None;
        }
        for (l, row) in part.data.chunks(dim.max(1)).enumerate() {
            let g = usize::try_from(sharding.global(l)).ok()?;
            data.get_mut(g * dim..(g + 1) * dim)?.copy_from_slice(row);
        }
    }
    Some(Loaded::f32(vec![rows, dim], data))
}

fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.sync_all().ok();
    Ok(())
}

/// Writes `path` through a temporary file and a rename.
/// The target must be a regular file or absent (`output::check`'s first
/// rule); a failed write leaves no temporary behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(crate::output::OutputError::NotRegular {
            path: path.to_path_buf(),
        }
        .into());
    }
    let tmp = crate::output::Temp::beside(path);
    write_synced(&tmp.path, bytes)?;
    let shown = tmp.path.display().to_string();
    tmp.commit(path)
        .with_context(|| format!("cannot rename {shown} into place"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_prune_and_detect_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let a = vec![1.0f32, 2.0, 3.0, 4.0];
        for step in [10, 20, 30] {
            let ts = vec![TensorRef::new("w", vec![2, 2], &a)];
            save(dir.path(), step, &[("dense.safetensors", ts)], 2).unwrap();
        }
        assert_eq!(list(dir.path()).unwrap(), vec![20, 30]);
        let latest = latest(dir.path()).unwrap().unwrap();
        assert_eq!(step_of(&latest), Some(30));
        let (step, t) = load(&latest).unwrap();
        assert_eq!(step, 30);
        assert_eq!(t["w"].data, a);
        assert_eq!(t["w"].shape, vec![2, 2]);
        let f = latest.join("dense.safetensors");
        let len = fs::metadata(&f).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let err = format!("{:#}", load(&latest).unwrap_err());
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn a_step_saved_again_is_replaced_and_what_a_killed_replacement_left_is_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (vec![1.0f32, 2.0], vec![5.0f32, 6.0]);
        for v in [&a, &b] {
            save(
                dir.path(),
                10,
                &[("dense.safetensors", vec![TensorRef::new("w", vec![2], v)])],
                0,
            )
            .unwrap();
        }
        let (_, t) = load(&dir.path().join(ckpt_name(10))).unwrap();
        assert_eq!(t["w"].data, b);
        let names = |d: &Path| -> Vec<String> {
            let mut v: Vec<String> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(dir.path()), ["checkpoint", "model.ckpt-10"]);
        // A job killed while deleting the replaced copy leaves it outside
        // the listing, under a name the next job clears.
        let doomed = dir.path().join(".model.ckpt-10.old.tmp");
        fs::create_dir(&doomed).unwrap();
        fs::write(doomed.join("manifest.json"), "{}").unwrap();
        assert_eq!(list(dir.path()).unwrap(), vec![10]);
        assert_eq!(remove_stale_temporaries(dir.path()).unwrap(), 1);
        assert_eq!(names(dir.path()), ["checkpoint", "model.ckpt-10"]);
    }
}
