//! An export kept current by its training job's incremental updates
//! (`train::incr`, EasyRec's format): the export's ONNX model is held as
//! its protobuf, each update patches the initializers it names (dense
//! parameters, table rows; a key-value table's new keys get rows and a new
//! key layout), and the patched model is prepared for tract again. An
//! update is checked whole against the model before anything is patched:
//! a damaged or foreign update changes nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};
use tract_onnx::pb;
use tract_onnx::prelude::*;

use crate::model::exec::onnx::KeyLayout;

/// Where an export's job writes its updates, from `export_info.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateSource {
    pub location: UpdateLocation,
    pub dense_variables: PathBuf,
    pub sparse_variables: PathBuf,
    /// The export's own global step: updates after it apply.
    pub export_step: u64,
}

impl UpdateSource {
    /// The update source an export records, if its job writes updates.
    pub fn of_export(export_dir: &Path) -> anyhow::Result<Option<Self>> {
        match super::read_info(export_dir)? {
            Some(info) => Self::of_info(export_dir, &info),
            None => Ok(None),
        }
    }

    /// The update source `info` (the `export_info.json` of the export in
    /// `export_dir`) records, if any.
    pub fn of_info(export_dir: &Path, info: &serde_json::Value) -> anyhow::Result<Option<Self>> {
        let path = export_dir.join("assets/export_info.json");
        let u = &info["incremental_updates"];
        if u.is_null() {
            return Ok(None);
        }
        let field = |k: &str| {
            u[k].as_str()
                .map(PathBuf::from)
                .with_context(|| format!("{}: incremental_updates lacks `{k}`", path.display()))
        };
        let location = match u.get("kafka") {
            Some(k) => {
                let text = |key: &str| {
                    k[key]
                        .as_str()
                        .map(String::from)
                        .with_context(|| format!("{}: incremental_updates.kafka lacks `{key}`", path.display()))
                };
                let servers = text("servers")?;
                UpdateLocation::Kafka(crate::config::train_plan::IncrKafka {
                    servers: crate::config::kafka_plan::brokers("incremental_updates.kafka.servers", &servers)?,
                    topic: text("topic")?,
                    consumer_offset: k["offset"].as_i64().unwrap_or(0).max(0),
                    consumer_props: k["properties"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|p| p.as_str().map(String::from)).collect())
                        .unwrap_or_default(),
                })
            }
            None => UpdateLocation::Dir(field("dir")?),
        };
        Ok(Some(UpdateSource {
            location,
            dense_variables: field("dense_variables")?,
            sparse_variables: field("sparse_variables")?,
            export_step: info["global_step"].as_u64().unwrap_or(0),
        }))
    }

    /// The folder of the updates, when they are written to one.
    pub fn dir(&self) -> Option<&Path> {
        match &self.location {
            UpdateLocation::Dir(d) => Some(d),
            UpdateLocation::Kafka(_) => None,
        }
    }

    /// Where the updates are, for the log.
    pub fn describe(&self) -> String {
        match &self.location {
            UpdateLocation::Dir(d) => d.display().to_string(),
            UpdateLocation::Kafka(k) => format!("Kafka topic `{}` at {}", k.topic, k.servers.join(",")),
        }
    }

    /// Complete updates in the folder (their `.done` flag written) after
    /// global step `after`, in the order they apply: by step, the
    /// dense one first. None when the updates go to Kafka.
    pub fn pending(&self, after: u64) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        let Some(dir) = self.dir() else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = if crate::storage::is_remote(dir) {
            // One listing of the folder (not of what is below it).
            crate::storage::object(dir)?
                .list_top()?
                .into_iter()
                .map(|l| l.relative)
                .collect()
        } else {
            match std::fs::read_dir(dir) {
                Ok(rd) => rd
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
            }
        };
        let mut out = Vec::new();
        for name in names {
            let Some(base) = name.strip_suffix(".done") else {
                continue;
            };
            // A step's dense update, then its evictions, then its rows.
            let (kind, step) = match base.rsplit_once('_') {
                Some(("dense_update", s)) => (0, s),
                Some(("sparse_evict", s)) => (1, s),
                Some(("sparse_update", s)) => (2, s),
                _ => continue,
            };
            let Ok(step) = step.parse::<u64>() else { continue };
            if step > after {
                out.push((step, kind, crate::storage::join(dir, base)));
            }
        }
        out.sort();
        Ok(out.into_iter().map(|(s, _, p)| (s, p)).collect())
    }
}

/// Where the updates are: a folder, or a Kafka topic (partition 0).
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateLocation {
    Dir(PathBuf),
    Kafka(crate::config::train_plan::IncrKafka),
}

/// An update ready to apply: its step, its name (`dense_update_<step>`,
/// ...), where it came from (for messages) and its bytes.
#[derive(Debug, Clone)]
pub struct Pending {
    pub step: u64,
    pub name: String,
    pub origin: String,
    pub bytes: Vec<u8>,
}

/// The kind and step an update's name says: 0 dense, 1 evictions, 2 rows
/// (the order a step's updates apply in).
fn kind_and_step(name: &str) -> Option<(u8, u64)> {
    let (kind, step) = match name.rsplit_once('_')? {
        ("dense_update", s) => (0, s),
        ("sparse_evict", s) => (1, s),
        ("sparse_update", s) => (2, s),
        _ => return None,
    };
    Some((kind, step.parse().ok()?))
}

/// A consumer of the updates a job sends to Kafka: reads partition 0 from
/// `consumer.offset` on and joins each update's parts.
struct KafkaUpdates {
    topic: crate::data::kafka::Topic,
    name: String,
    next: i64,
    start: i64,
    /// Parts received so far of the updates not yet whole.
    parts: HashMap<String, Vec<Option<Vec<u8>>>>,
    /// Updates made whole and not yet taken.
    ready: Vec<Pending>,
    /// The variable maps the job sent (train::incr::KAFKA_MAP_KEYS), the
    /// last of each.
    maps: HashMap<String, Vec<u8>>,
}

impl KafkaUpdates {
    fn connect(k: &crate::config::train_plan::IncrKafka) -> anyhow::Result<Self> {
        let mut input = crate::train::incr::updates_topic(k)?;
        if !k
            .consumer_props
            .iter()
            .any(|p| p.trim_start().starts_with("fetch.wait.max.ms"))
        {
            input.client.fetch_wait_max_ms = 100; // serve polls; it need not wait long
        }
        Ok(KafkaUpdates {
            topic: crate::data::kafka::Topic::connect(&input)?,
            name: k.topic.clone(),
            next: k.consumer_offset,
            start: k.consumer_offset,
            parts: HashMap::new(),
            ready: Vec::new(),
            maps: HashMap::new(),
        })
    }

    /// Reads the topic to its end: updates made whole go to `ready` (in
    /// the order they were sent), variable maps to `maps`.
    fn poll(&mut self) -> anyhow::Result<()> {
        loop {
            let (messages, high) = self.topic.fetch(0, self.next)?;
            let got = !messages.is_empty();
            for m in messages {
                self.next = m.offset + 1;
                let origin = format!("Kafka topic `{}` offset {}", self.name, m.offset);
                let Some(name) = m.key.as_deref().and_then(|k| std::str::from_utf8(k).ok()) else {
                    log::warn!("{origin}: a message without a name; skipped");
                    continue;
                };
                let step = match kind_and_step(name) {
                    Some((_, step)) => Some(step),
                    None if crate::train::incr::KAFKA_MAP_KEYS.contains(&name) => None,
                    None => continue, // another tool's message
                };
                let part = m.headers.get(crate::train::incr::KAFKA_PART_HEADER);
                let (i, n) = match part
                    .and_then(|p| std::str::from_utf8(p).ok())
                    .and_then(|p| p.split_once('/'))
                    .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
                {
                    Some((i, n)) if i < n && n <= 1 << 16 => (i, n),
                    _ => {
                        log::warn!("{origin}: update {name} has no valid part header; skipped");
                        continue;
                    }
                };
                let slots = self.parts.entry(name.to_string()).or_default();
                if i == 0 || slots.len() != n {
                    *slots = vec![None; n]; // a new sending of the update
                }
                slots[i] = Some(m.value);
                if slots.iter().all(Option::is_some) {
                    let bytes: Vec<u8> = self
                        .parts
                        .remove(name)
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .flatten()
                        .collect();
                    match step {
                        Some(step) => self.ready.push(Pending {
                            step,
                            name: name.to_string(),
                            origin,
                            bytes,
                        }),
                        None => {
                            self.maps.insert(name.to_string(), bytes);
                        }
                    }
                }
            }
            if !got || self.next >= high {
                return Ok(());
            }
        }
    }
}

/// `name -> id` maps of the update variables, by id.
fn variable_names(path: &Path) -> anyhow::Result<HashMap<usize, String>> {
    let text = crate::storage::read_text(path, crate::bounded::CONFIG_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?;
    parse_names(&text, &path.display().to_string())
}

/// A `name -> id` map's text, read from `origin`.
fn parse_names(text: &str, origin: &str) -> anyhow::Result<HashMap<usize, String>> {
    let v: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{origin} is not valid JSON"))?;
    let map = v
        .as_object()
        .with_context(|| format!("{origin} is not a JSON object"))?;
    map.iter()
        .map(|(k, id)| {
            let id = id
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .with_context(|| format!("{origin}: `{k}` has no integer id"))?;
            Ok((id, k.clone()))
        })
        .collect()
}

/// The variable map `key` at `path` or, where that file is not (a
/// consumer on another machine than the job), the last one the job sent
/// to its topic.
fn names_of(path: &Path, key: &str, kafka: Option<&mut KafkaUpdates>) -> anyhow::Result<HashMap<usize, String>> {
    let Some(k) = kafka.filter(|_| !path.exists()) else {
        return variable_names(path);
    };
    if !k.maps.contains_key(key) {
        k.poll()?;
    }
    let bytes = k.maps.get(key).with_context(|| {
        format!(
            "{} does not exist, and Kafka topic `{}` holds no {key} from offset {} on",
            path.display(),
            k.name,
            k.start
        )
    })?;
    let text = std::str::from_utf8(bytes).with_context(|| format!("{key} in Kafka topic `{}` is not text", k.name))?;
    parse_names(text, &format!("{key} in Kafka topic `{}`", k.name))
}

/// One parsed update: its step, its kind (0 dense, 1 sparse rows, 2
/// evicted keys) and, per variable, (name, ids, values).
struct Update {
    step: u64,
    kind: i32,
    vars: Vec<(String, Vec<i64>, Vec<f32>)>,
}

fn parse_update(
    path: &Path,
    bytes: &[u8],
    names: &HashMap<usize, String>,
    dims: &dyn Fn(&str) -> Option<usize>,
) -> anyhow::Result<Update> {
    let bad = |what: String| anyhow::anyhow!("incremental update {}: {what}", path.display());
    let i32_at = |at: usize| -> anyhow::Result<i32> {
        let b = bytes
            .get(at..at + 4)
            .ok_or_else(|| bad(format!("ends inside its header at byte {at}")))?;
        Ok(i32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let (kind, n, step) = (i32_at(0)?, i32_at(4)?, i32_at(8)?);
    ensure!(
        (0..=2).contains(&kind),
        bad(format!(
            "kind {kind} is neither dense (0), sparse (1) nor evictions (2)"
        ))
    );
    let n = usize::try_from(n).map_err(|_| bad(format!("{n} variables")))?;
    ensure!(
        n <= bytes.len() / 8,
        bad(format!("{n} variables in {} bytes", bytes.len()))
    );
    let mut at = 12 + 8 * n;
    let mut vars = Vec::with_capacity(n);
    for v in 0..n {
        let (id, count) = (i32_at(12 + 8 * v)?, i32_at(16 + 8 * v)?);
        let name = usize::try_from(id)
            .ok()
            .and_then(|i| names.get(&i))
            .ok_or_else(|| bad(format!("variable id {id} is not in the job's variable map")))?
            .clone();
        let count = usize::try_from(count).map_err(|_| bad(format!("`{name}`: {count} values")))?;
        let mut ids = Vec::new();
        let width = if kind >= 1 {
            let end = count
                .checked_mul(8)
                .and_then(|b| b.checked_add(at))
                .filter(|&e| e <= bytes.len());
            let end = end.ok_or_else(|| bad(format!("`{name}`: {count} ids run past the end")))?;
            ids = bytes[at..end]
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            at = end;
            let dim = dims(&name).ok_or_else(|| bad(format!("`{name}` is not a table of this export")))?;
            if kind == 2 {
                0 // evicted keys carry no values
            } else {
                dim
            }
        } else {
            1
        };
        let len = count.checked_mul(width).and_then(|c| c.checked_mul(4));
        let end = len.and_then(|l| l.checked_add(at)).filter(|&e| e <= bytes.len());
        let end = end.ok_or_else(|| bad(format!("`{name}`: its values run past the end")))?;
        let values = bytes[at..end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        at = end;
        vars.push((name, ids, values));
    }
    ensure!(
        at == bytes.len(),
        bad(format!("{} bytes after its last variable", bytes.len() - at))
    );
    Ok(Update {
        step: step as u64,
        kind,
        vars,
    })
}

/// The export's ONNX model as protobuf, patched by updates.
pub struct LiveModel {
    dir: PathBuf,
    proto: pb::ModelProto,
    source: UpdateSource,
    dense_names: HashMap<usize, String>,
    sparse_names: HashMap<usize, String>,
    /// The step of the last update applied (the export's at first).
    pub step: u64,
    /// The updates of that step already applied (a step has up to three).
    applied: Vec<String>,
    /// The Kafka consumer, when the updates go to a topic.
    kafka: Option<KafkaUpdates>,
}

/// An initializer's new value: (name, dims, raw little-endian bytes).
type Patch = (String, Vec<i64>, Vec<u8>);

const FLOAT: i32 = 1;
const INT64: i32 = 7;

impl LiveModel {
    pub fn load(export_dir: &Path, source: UpdateSource) -> anyhow::Result<Self> {
        let path = export_dir.join(super::MODEL_FILE);
        // The checks every loader of an export makes (a bounded read, each
        // initializer's bytes and external data range inside the export),
        // on which `raw` relies.
        super::onnx_bounds::check(export_dir, &path)?;
        let bytes = crate::bounded::read(&path, crate::bounded::table_bytes())?;
        let proto = tract_onnx::onnx()
            .proto_model_for_read(&mut bytes.as_slice())
            .with_context(|| format!("cannot parse {}", path.display()))?;
        let mut kafka = match &source.location {
            UpdateLocation::Kafka(k) => Some(KafkaUpdates::connect(k)?),
            UpdateLocation::Dir(_) => None,
        };
        let [dense_key, sparse_key] = crate::train::incr::KAFKA_MAP_KEYS;
        Ok(LiveModel {
            dir: export_dir.to_path_buf(),
            dense_names: names_of(&source.dense_variables, dense_key, kafka.as_mut())?,
            sparse_names: names_of(&source.sparse_variables, sparse_key, kafka.as_mut())?,
            step: source.export_step,
            applied: Vec::new(),
            kafka,
            proto,
            source,
        })
    }

    pub fn source(&self) -> &UpdateSource {
        &self.source
    }

    fn graph(&self) -> anyhow::Result<&pb::GraphProto> {
        self.proto.graph.as_ref().context("the export's model has no graph")
    }

    fn init(&self, name: &str) -> Option<&pb::TensorProto> {
        self.proto.graph.as_ref()?.initializer.iter().find(|t| t.name == name)
    }

    /// An initializer's float values, wherever they are stored.
    fn floats(&self, t: &pb::TensorProto) -> anyhow::Result<Vec<f32>> {
        ensure!(t.data_type == FLOAT, "initializer `{}` is not float32", t.name);
        if !t.float_data.is_empty() {
            return Ok(t.float_data.clone());
        }
        let raw = self.raw(t)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }

    fn int64s(&self, t: &pb::TensorProto) -> anyhow::Result<Vec<i64>> {
        ensure!(t.data_type == INT64, "initializer `{}` is not int64", t.name);
        if !t.int64_data.is_empty() {
            return Ok(t.int64_data.clone());
        }
        let raw = self.raw(t)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    fn raw(&self, t: &pb::TensorProto) -> anyhow::Result<Vec<u8>> {
        if t.external_data.is_empty() {
            return Ok(t.raw_data.clone());
        }
        // `load` checked the location (inside the export) and the range
        // (inside its file) as `onnx_bounds` reads them.
        let get = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
        let file = get("location").context("external data without a location")?;
        let offset: u64 = get("offset").map_or(Ok(0), str::parse)?;
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(self.dir.join(file))?;
        f.seek(SeekFrom::Start(offset))?;
        let mut out = Vec::new();
        match get("length") {
            Some(length) => {
                let length: u64 = length.parse()?;
                f.take(length).read_to_end(&mut out)?;
                ensure!(out.len() as u64 == length, "external data of `{}` is cut short", t.name);
            }
            None => {
                f.read_to_end(&mut out)?;
            }
        }
        Ok(out)
    }

    fn set(&mut self, name: &str, dims: Vec<i64>, raw: Vec<u8>) -> anyhow::Result<()> {
        let graph = self.proto.graph.as_mut().context("the export's model has no graph")?;
        let t = graph
            .initializer
            .iter_mut()
            .find(|t| t.name == name)
            .with_context(|| format!("the export has no initializer `{name}`"))?;
        t.dims = dims;
        t.raw_data = raw;
        t.float_data.clear();
        t.int64_data.clear();
        t.external_data.clear();
        t.data_location = None;
        Ok(())
    }

    /// The width of table `name` (its initializer's second dimension).
    fn table_dim(&self, name: &str) -> Option<usize> {
        self.init(name)
            .and_then(|t| t.dims.get(1))
            .and_then(|d| usize::try_from(*d).ok())
    }

    /// The updates not applied yet, in the order they apply: of the
    /// folder, or those the topic made whole since the last call.
    pub fn pending(&mut self) -> anyhow::Result<Vec<Pending>> {
        let mut all = match &mut self.kafka {
            Some(k) => {
                k.poll()?;
                std::mem::take(&mut k.ready)
            }
            None => {
                let mut out = Vec::new();
                // The step applied last may have more updates to come (the
                // same values as the export's, at the export's step).
                for (step, path) in self.source.pending(self.step.saturating_sub(1))? {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let bytes = crate::storage::read(&path, crate::bounded::table_bytes())
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    out.push(Pending {
                        step,
                        name,
                        origin: path.display().to_string(),
                        bytes,
                    });
                }
                out
            }
        };
        all.retain(|p| p.step > self.step || (p.step == self.step && !self.applied.contains(&p.name)));
        all.sort_by_key(|p| kind_and_step(&p.name).map(|(k, s)| (s, k)));
        Ok(all)
    }

    /// Applies the update at `path`, or changes nothing and says why.
    pub fn apply(&mut self, path: &Path) -> anyhow::Result<u64> {
        let bytes = crate::storage::read(path, crate::bounded::table_bytes())
            .with_context(|| format!("cannot read {}", path.display()))?;
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.apply_bytes(&file, &path.display().to_string(), &bytes)
    }

    /// Applies `update`, or changes nothing and says why.
    pub fn apply_pending(&mut self, update: &Pending) -> anyhow::Result<u64> {
        self.apply_bytes(&update.name, &update.origin, &update.bytes)
    }

    /// Applies update `file` (its name) read from `origin`.
    fn apply_bytes(&mut self, file: &str, origin: &str, bytes: &[u8]) -> anyhow::Result<u64> {
        let path = Path::new(origin);
        let kind = if file.starts_with("dense_update_") {
            0
        } else if file.starts_with("sparse_evict_") {
            2
        } else {
            1
        };
        let dense = kind == 0;
        let names = if dense { &self.dense_names } else { &self.sparse_names };
        let update = parse_update(path, bytes, names, &|n| self.table_dim(n))?;
        ensure!(
            update.kind == kind,
            "incremental update {}: its header says otherwise than its name",
            path.display()
        );
        ensure!(
            update.step >= self.step,
            "incremental update {} (step {}) comes after step {} already applied",
            path.display(),
            update.step,
            self.step
        );
        // Everything is computed first, then set: a bad variable leaves the model as it was.
        let mut patches: Vec<Patch> = Vec::new();
        for (name, ids, values) in &update.vars {
            let t = self
                .init(name)
                .with_context(|| format!("{}: the export has no variable `{name}`", path.display()))?;
            if dense {
                let want: i64 = t.dims.iter().product();
                ensure!(
                    want as usize == values.len(),
                    "{}: `{name}` has {} values, the export {want}",
                    path.display(),
                    values.len()
                );
                patches.push((name.clone(), t.dims.clone(), f32_bytes(values)));
            } else {
                patches.extend(
                    self.table_patches(name, ids, values, kind == 2)
                        .with_context(|| format!("{}: table `{name}`", path.display()))?,
                );
            }
        }
        for (name, dims, raw) in patches {
            self.set(&name, dims, raw)?;
        }
        if update.step > self.step {
            self.applied.clear();
        }
        self.applied.push(file.to_string());
        self.step = update.step;
        Ok(update.step)
    }

    /// The new initializers of table `name` with rows `ids` set to `values`.
    fn table_patches(&self, name: &str, ids: &[i64], values: &[f32], evict: bool) -> anyhow::Result<Vec<Patch>> {
        let t = self.init(name).context("no such table")?;
        let (rows, dim) = match t.dims[..] {
            [r, d] if r >= 0 && d > 0 => (r as usize, d as usize),
            _ => bail!("its initializer has dims {:?}", t.dims),
        };
        let mut table = self.floats(t)?;
        let keyed = self.init(&format!("{name}/slot_keys"));
        let Some(slot_keys) = keyed else {
            ensure!(!evict, "an array table evicts no rows");
            for (k, &id) in ids.iter().enumerate() {
                let r = usize::try_from(id)
                    .ok()
                    .filter(|&r| r < rows)
                    .with_context(|| format!("row {id} of {rows}"))?;
                table[r * dim..(r + 1) * dim].copy_from_slice(&values[k * dim..(k + 1) * dim]);
            }
            return Ok(vec![(name.to_string(), t.dims.clone(), f32_bytes(&table))]);
        };
        // A key-value table: rows by key, the default row last.
        let slot_keys = self.int64s(slot_keys)?;
        let slot_rows = self.int64s(self.init(&format!("{name}/slot_rows")).context("no slot_rows")?)?;
        let n = rows - 1;
        let mut keys = vec![0u64; n];
        for (k, r) in slot_keys.iter().zip(&slot_rows) {
            if *k >= 0 {
                let r = usize::try_from(*r)
                    .ok()
                    .filter(|&r| r < n)
                    .context("a slot row outside the table")?;
                keys[r] = *k as u64;
            }
        }
        let default = table.split_off(n * dim);
        if evict {
            // The evicted keys' rows go; the rest keep their order.
            let gone: std::collections::HashSet<u64> = ids.iter().map(|&k| k as u64).collect();
            let kept: Vec<usize> = (0..n).filter(|&r| !gone.contains(&keys[r])).collect();
            let mut rows = Vec::with_capacity(kept.len() * dim + dim);
            for &r in &kept {
                rows.extend_from_slice(&table[r * dim..(r + 1) * dim]);
            }
            keys = kept.iter().map(|&r| keys[r]).collect();
            table = rows;
        }
        let mut row_of: HashMap<u64, usize> = keys.iter().enumerate().map(|(r, k)| (*k, r)).collect();
        for (k, &id) in ids.iter().enumerate().filter(|_| !evict) {
            let key = u64::try_from(id).context("a negative key")?;
            let v = &values[k * dim..(k + 1) * dim];
            match row_of.get(&key) {
                Some(&r) => table[r * dim..(r + 1) * dim].copy_from_slice(v),
                None => {
                    row_of.insert(key, keys.len());
                    keys.push(key);
                    table.extend_from_slice(v);
                }
            }
        }
        table.extend(default);
        let layout = KeyLayout::build(&keys);
        let m = layout.slot_keys.len() as i64;
        let n = keys.len() as i64;
        Ok(vec![
            (name.to_string(), vec![n + 1, dim as i64], f32_bytes(&table)),
            (format!("{name}/slot_keys"), vec![m], i64_bytes(&layout.slot_keys)),
            (format!("{name}/slot_rows"), vec![m], i64_bytes(&layout.slot_rows)),
            (format!("{name}/slot_count"), vec![], i64_bytes(&[m])),
            (format!("{name}/default_row"), vec![], i64_bytes(&[n])),
        ])
    }

    /// The patched model, prepared for tract.
    pub fn runnable(&self) -> anyhow::Result<Arc<TypedRunnableModel>> {
        let dir = self.dir.to_str().context("an export path that is not UTF-8")?;
        let parsed = tract_onnx::onnx().parse(&self.proto, Some(dir))?;
        ensure!(
            parsed.unresolved_inputs.is_empty(),
            "the patched model has unresolved inputs"
        );
        let _ = self.graph()?;
        parsed.model.into_optimized()?.into_runnable()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Per step, the updates that apply, grouped: (step, paths).
pub fn by_step(pending: Vec<(u64, PathBuf)>) -> BTreeMap<u64, Vec<PathBuf>> {
    let mut out: BTreeMap<u64, Vec<PathBuf>> = BTreeMap::new();
    for (s, p) in pending {
        out.entry(s).or_default().push(p);
    }
    out
}
