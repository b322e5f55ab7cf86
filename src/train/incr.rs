//! Incremental updates (`train_config.incr_save_config` with `fs`), written
//! as EasyRec writes them so that a consumer of EasyRec's updates reads
//! ours: every `sparse_save_*` the rows trained since the last sparse
//! update, every `dense_save_*` the dense parameters, each a file named by
//! the global step with a `.done` flag beside it once it is whole.
//!
//! Format (little-endian), EasyRec's `_send_dense` / `_send_sparse`:
//! - `dense_update_<step>`: int32 header `[0, n, step, (id, size) x n]`,
//!   then each variable's `size` float32 values in header order. `id` is the
//!   variable's in `DENSE_UPDATE_VARIABLES` (model_dir, JSON name -> id).
//! - `sparse_update_<step>`: int32 header `[1, n, step, (id, count) x n]`,
//!   then per table its `count` int64 ids (the row of an array table, the
//!   key of a key-value table) and `count x dim` float32 values. `id` is the
//!   table's in `SPARSE_UPDATE_VARIABLES` (model_dir, JSON name -> id).
//!
//! Each file is written under a temporary name and renamed, then its
//! `.done` flag (holding the file's name) the same way: a reader that waits
//! for the flag never sees half an update. Dense updates also carry the
//! batch-norm moving averages (EasyRec's carry trainable variables only),
//! so a served model follows them.
//!
//! EasyRec's format has no deletions; the keys a key-value table evicted
//! since the last sparse update go, beside it, into `sparse_evict_<step>`
//! (our extension, same layout as a sparse update without values: int32
//! header `[2, n, step, (table id, count) x n]`, then per table its int64
//! keys), written before the sparse update of that step. A consumer
//! applies a step's dense update, then its evictions, then its sparse
//! update (a key evicted and admitted again within the stretch is in both).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use super::Trainer;
use crate::checkpoint::write_atomic;
use crate::config::train_plan::IncrSave;
use crate::embedding::{pack, unpack, RowGrads};

/// Where updates go: a folder, a topic, or both (`debug_save_update`).
struct Sink {
    dir: Option<PathBuf>,
    kafka: Option<crate::data::kafka::Topic>,
}

/// The largest message of an update sent to Kafka: a bigger update goes in
/// parts (brokers refuse batches over 1 MiB by default).
pub const KAFKA_PART_BYTES: usize = 512 << 10;

/// The header that numbers an update's parts in Kafka: `<index>/<count>`.
pub const KAFKA_PART_HEADER: &str = "rustrec-update-part";

/// The header holding an update's description (what its `.done` flag holds
/// in a folder): JSON `{update, format, global_step, bytes, stream}`.
pub const KAFKA_INFO_HEADER: &str = "rustrec-update-info";

/// The version of that description; the update's bytes are EasyRec's layout.
pub const INFO_FORMAT: &str = "rustrec-incremental-update/1";

/// The update variable maps, sent to the topic before the first update
/// (a consumer on another machine needs them), keyed by these names.
pub const KAFKA_MAP_KEYS: [&str; 2] = ["DENSE_UPDATE_VARIABLES", "SPARSE_UPDATE_VARIABLES"];

/// The trainer's incremental-update state.
pub struct IncrUpdates {
    config: IncrSave,
    /// Where rank 0's updates go.
    dir: Option<PathBuf>,
    /// Rank 0's writer thread.
    writer: Option<Writer>,
    /// The stream offsets (checkpoint manifest form) the updates being
    /// written cover: the next offset of every partition after the rows
    /// they hold.
    stream: Option<serde_json::Value>,
    /// Per table, this rank's rows trained since the last sparse update.
    touched: Vec<Touched>,
    last_sparse: (u64, Instant),
    last_dense: (u64, Instant),
}

impl IncrUpdates {
    fn new(config: IncrSave, model_dir: &Path, tables: usize, step: u64) -> Self {
        let dir = config.dir.as_ref().map(|d| d.resolve(model_dir));
        IncrUpdates {
            config,
            dir,
            writer: None,
            stream: None,
            touched: (0..tables).map(|_| Touched::default()).collect(),
            last_sparse: (step, Instant::now()),
            last_dense: (step, Instant::now()),
        }
    }

    /// Where the updates go, for the log.
    fn describe(&self) -> String {
        let mut to: Vec<String> = self.dir.iter().map(|d| d.display().to_string()).collect();
        if let Some(k) = &self.config.kafka {
            to.push(format!("Kafka topic `{}` at {}", k.topic, k.servers.join(",")));
        }
        to.join(" and ")
    }

    /// Hands update `name` to the writer thread (rank 0); fails if an
    /// earlier one could not be written.
    fn publish(&self, name: String, step: u64, bytes: Vec<u8>) -> anyhow::Result<()> {
        let info = serde_json::json!({
            "update": name,
            "format": INFO_FORMAT,
            "global_step": step,
            "bytes": bytes.len(),
            "stream": self.stream,
        })
        .to_string();
        match &self.writer {
            Some(w) => w.publish(name, bytes, info),
            None => Ok(()),
        }
    }

    /// Waits until every update handed over is written; fails with the
    /// first that could not be.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        match self.writer.take() {
            Some(mut w) => w.finish(),
            None => Ok(()),
        }
    }

    /// Records the rows a step updated.
    pub fn touch(&mut self, grads: &[RowGrads]) {
        for (set, g) in self.touched.iter_mut().zip(grads) {
            set.mark(&g.rows);
        }
    }

    /// Records the rows `rows` of table `table` a step updated on a device.
    pub fn touch_table(&mut self, table: usize, rows: &[u64]) {
        if let Some(set) = self.touched.get_mut(table) {
            set.mark(rows);
        }
    }
}

/// The rows of one table trained since the last sparse update: a bit per
/// row while ids are small (an array's rows), a hash set once one is not (a
/// key-value table's keys). A set of every id was a tenth of the step time.
enum Touched {
    Bits(Vec<u64>),
    Keys(std::collections::HashSet<u64>),
}

impl Default for Touched {
    fn default() -> Self {
        Touched::Bits(Vec::new())
    }
}

/// Ids below this are kept as bits (8 MiB for 64M rows).
const BIT_IDS: u64 = 1 << 26;

impl Touched {
    fn mark(&mut self, rows: &[u64]) {
        if let Touched::Bits(bits) = self {
            if rows.iter().any(|&r| r >= BIT_IDS) {
                let keys = Self::ids_of(bits);
                *self = Touched::Keys(keys.into_iter().collect());
            }
        }
        match self {
            Touched::Bits(bits) => {
                for &r in rows {
                    let w = (r / 64) as usize;
                    if w >= bits.len() {
                        bits.resize(w + 1, 0);
                    }
                    bits[w] |= 1 << (r % 64);
                }
            }
            Touched::Keys(keys) => keys.extend(rows.iter().copied()),
        }
    }

    fn ids_of(bits: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, &word) in bits.iter().enumerate() {
            let mut x = word;
            while x != 0 {
                out.push(w as u64 * 64 + u64::from(x.trailing_zeros()));
                x &= x - 1;
            }
        }
        out
    }

    /// The ids marked, ascending; the set is left empty.
    fn take_sorted(&mut self) -> Vec<u64> {
        match self {
            Touched::Bits(bits) => {
                let out = Self::ids_of(bits);
                bits.iter_mut().for_each(|w| *w = 0);
                out
            }
            Touched::Keys(keys) => {
                let mut out: Vec<u64> = keys.drain().collect();
                out.sort_unstable();
                out
            }
        }
    }
}

/// `name -> id` as EasyRec writes its update variables.
fn ids_json(names: &[String]) -> Vec<u8> {
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), serde_json::json!(i)))
        .collect();
    serde_json::to_vec_pretty(&serde_json::Value::Object(map)).expect("JSON of names")
}

impl Trainer {
    /// The dense variables of updates, in id order: parameters, then
    /// batch-norm statistics.
    fn dense_update_variables(&self) -> Vec<String> {
        let m = &self.model;
        m.params
            .specs
            .iter()
            .chain(&m.buffers.specs)
            .map(|s| s.name.clone())
            .collect()
    }

    /// Starts incremental updates when the config asks for them: the
    /// folder and the variable maps (rank 0). `run` calls it; so does a
    /// caller that drives `train_step` itself (the bench).
    pub fn start_incr_updates(&mut self) -> anyhow::Result<()> {
        let Some(config) = self.plan.train.incr_save.clone() else {
            return Ok(());
        };
        let lead = self.comm.rank() == 0;
        // Rank 0 writes every update.
        let topic = match config.kafka.as_ref().filter(|_| lead) {
            Some(k) => {
                let t = crate::data::kafka::Topic::connect(&updates_topic(k)?)?;
                t.create(1)?;
                Some(t)
            }
            None => None,
        };
        let mut incr = IncrUpdates::new(
            config,
            self.plan.published_model_dir(),
            self.embeddings.tables.len(),
            self.step,
        );
        if lead {
            let sink = Sink {
                dir: incr.dir.clone(),
                kafka: topic,
            };
            if let Some(d) = sink.dir.as_ref().filter(|d| !crate::storage::is_remote(d)) {
                std::fs::create_dir_all(d).with_context(|| format!("cannot create incr_save_dir {}", d.display()))?;
            }
            let dir = &self.plan.model_dir;
            let maps = [
                ids_json(&self.dense_update_variables()),
                ids_json(&self.model.table_variables),
            ];
            for (name, bytes) in KAFKA_MAP_KEYS.iter().zip(&maps) {
                write_atomic(&dir.join(name), bytes)?;
                if let Some(m) = &self.mirror {
                    // A consumer of a remote model_dir's updates reads them
                    // before any checkpoint is published.
                    m.publish(name)?;
                }
                if let Some(t) = &sink.kafka {
                    send_update(t, name, bytes)?;
                }
            }
            log::info!("incremental updates go to {}", incr.describe());
            incr.writer = Some(Writer::spawn(sink)?);
        }
        for t in &mut self.embeddings.tables {
            t.track_evictions();
        }
        self.incr = Some(incr);
        Ok(())
    }

    /// After a step: writes the updates that are due. On several ranks a
    /// collective (every rank decides alike: rank 0's clock decides timed
    /// updates).
    pub fn incr_after_step(&mut self) -> anyhow::Result<()> {
        let Some(incr) = &self.incr else {
            return Ok(());
        };
        let step = self.step;
        let mut due = [
            incr.config.sparse.due(step, incr.last_sparse) as u8 as f64,
            incr.config.dense.due(step, incr.last_dense) as u8 as f64,
        ];
        let timed = incr.config.sparse.secs > 0 || incr.config.dense.secs > 0;
        if timed && self.comm.size() > 1 {
            if self.comm.rank() != 0 {
                due = [0.0, 0.0];
            }
            self.comm.all_reduce_sum(&mut due);
        }
        if due[0] > 0.0 || due[1] > 0.0 {
            // The stream offsets the updates cover (a collective).
            let stream = self.stream_offsets().map(|s| s.to_json());
            self.incr.as_mut().expect("started").stream = stream;
        }
        if due[0] > 0.0 {
            self.write_sparse_update(step)?;
        }
        if due[1] > 0.0 {
            self.write_dense_update(step)?;
        }
        Ok(())
    }

    fn write_dense_update(&mut self, step: u64) -> anyhow::Result<()> {
        self.settle_device();
        let incr = self.incr.as_mut().expect("incremental updates started");
        incr.last_dense = (step, Instant::now());
        if self.comm.rank() != 0 {
            return Ok(());
        }
        let m = &self.model;
        let vars: Vec<&[f32]> = (0..m.params.specs.len())
            .map(|i| m.params.slice(i))
            .chain((0..m.buffers.specs.len()).map(|i| m.buffers.slice(i)))
            .collect();
        let mut bytes = header(DENSE, step, vars.iter().map(|v| v.len()).enumerate());
        for v in &vars {
            bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        }
        incr.publish(format!("dense_update_{step}"), step, bytes)
    }

    fn write_sparse_update(&mut self, step: u64) -> anyhow::Result<()> {
        self.settle_device();
        let incr = self.incr.as_mut().expect("incremental updates started");
        incr.last_sparse = (step, Instant::now());
        let mut touched: Vec<Vec<u64>> = incr.touched.iter_mut().map(Touched::take_sorted).collect();
        // Under TensorFlow's Adam every row with momentum moves each step,
        // trained in this interval or not (a frozen table does not move).
        let frozen = &self.frozen.tables;
        for (i, (set, t)) in touched.iter_mut().zip(&self.embeddings.tables).enumerate() {
            let moving = self.plan.train.optimizers[t.optimizer].kind.moves_untouched_rows();
            if moving && !frozen.get(i).copied().unwrap_or(false) {
                set.extend(crate::embedding::moving_rows(t));
                set.sort_unstable();
                set.dedup();
            }
        }
        let mut evicted: Vec<Vec<u64>> = self.embeddings.tables.iter_mut().map(|t| t.take_evicted()).collect();
        if self.embeddings.sharding.is_sharded() {
            let mut merged = vec![Vec::new(); evicted.len()];
            for msg in self.comm.all_gather_u64(&pack(&evicted)) {
                for (m, keys) in merged.iter_mut().zip(unpack(&msg, evicted.len())) {
                    m.extend_from_slice(keys);
                }
            }
            evicted = merged;
        }
        // Per table, this rank's rows that still have one, with their values.
        let mut ids: Vec<Vec<u64>> = Vec::new();
        let mut values: Vec<Vec<f32>> = Vec::new();
        for (t, set) in self.embeddings.tables.iter().zip(&touched) {
            let held: Vec<u64> = set.iter().copied().filter(|&g| t.slot(g).is_some()).collect();
            let mut v = Vec::with_capacity(held.len() * t.dim);
            for &g in &held {
                v.extend_from_slice(crate::embedding::RowSource::row(t, g));
            }
            ids.push(held);
            values.push(v);
        }
        if self.embeddings.sharding.is_sharded() {
            // Rank 0 writes every owner's rows.
            let all_ids = self.comm.all_gather_u64(&pack(&ids));
            let all_values = self.comm.all_gather_f32(&values.concat());
            let nt = ids.len();
            let (mut merged_ids, mut merged_values) = (vec![Vec::new(); nt], vec![Vec::new(); nt]);
            for (msg, vals) in all_ids.iter().zip(&all_values) {
                let mut at = 0;
                for (ti, (part, t)) in unpack(msg, nt).into_iter().zip(&self.embeddings.tables).enumerate() {
                    merged_ids[ti].extend_from_slice(part);
                    merged_values[ti].extend_from_slice(&vals[at..at + part.len() * t.dim]);
                    at += part.len() * t.dim;
                }
            }
            ids = merged_ids;
            values = merged_values;
        }
        if self.comm.rank() != 0 {
            return Ok(());
        }
        let incr = self.incr.as_ref().expect("started");
        let gone: Vec<usize> = (0..evicted.len()).filter(|&t| !evicted[t].is_empty()).collect();
        if !gone.is_empty() {
            let mut bytes = header(EVICTED, step, gone.iter().map(|&t| (t, evicted[t].len())));
            for &t in &gone {
                bytes.extend(evicted[t].iter().flat_map(|k| (*k as i64).to_le_bytes()));
            }
            incr.publish(format!("sparse_evict_{step}"), step, bytes)?;
        }
        let present: Vec<usize> = (0..ids.len()).filter(|&t| !ids[t].is_empty()).collect();
        if present.is_empty() {
            log::warn!("step {step}: no rows were trained since the last sparse update; none written (as EasyRec)");
            return Ok(());
        }
        let mut bytes = header(SPARSE, step, present.iter().map(|&t| (t, ids[t].len())));
        for &t in &present {
            bytes.extend(ids[t].iter().flat_map(|k| (*k as i64).to_le_bytes()));
            bytes.extend(values[t].iter().flat_map(|x| x.to_le_bytes()));
        }
        incr.publish(format!("sparse_update_{step}"), step, bytes)
    }
}

/// An update's kind, the first value of its header.
const DENSE: i32 = 0;
const SPARSE: i32 = 1;
const EVICTED: i32 = 2;

/// An update's int32 header: `[kind, n, step, (id, count) x n]`.
fn header(kind: i32, step: u64, entries: impl ExactSizeIterator<Item = (usize, usize)>) -> Vec<u8> {
    let mut h: Vec<i32> = vec![kind, entries.len() as i32, step as i32];
    for (id, count) in entries {
        h.extend([id as i32, count as i32]);
    }
    h.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes updates in the order handed over, on its own thread, so that
/// the files' writes and syncs and the sends to Kafka overlap training (at
/// most two updates wait: their bytes are held).
struct Writer {
    tx: Option<std::sync::mpsc::SyncSender<(String, Vec<u8>, String)>>,
    handle: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    failed: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Writer {
    fn spawn(sink: Sink) -> anyhow::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Vec<u8>, String)>(2);
        let failed = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = failed.clone();
        let handle = std::thread::Builder::new()
            .name("incr-writer".into())
            .spawn(move || {
                for (name, bytes, info) in rx {
                    if let Err(e) = sink.publish(&name, &bytes, &info) {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{e:#}"));
                        return Err(e);
                    }
                }
                Ok(())
            })
            .context("cannot start the incremental-update writer")?;
        Ok(Writer {
            tx: Some(tx),
            handle: Some(handle),
            failed,
        })
    }

    fn publish(&self, name: String, bytes: Vec<u8>, info: String) -> anyhow::Result<()> {
        let failure = || self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(e) = failure() {
            anyhow::bail!("an incremental update could not be written: {e}");
        }
        let tx = self.tx.as_ref().expect("a writer not finished");
        if tx.send((name, bytes, info)).is_err() {
            // The thread ended on an error: its message says which.
            anyhow::bail!(
                "an incremental update could not be written: {}",
                failure().unwrap_or_default()
            );
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        drop(self.tx.take());
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => anyhow::bail!("the incremental-update writer failed (an internal error)"),
            None => Ok(()),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::error!("{e:#}");
        }
    }
}

impl Sink {
    /// Writes update `name` into the folder (then its `.done` flag holding
    /// `info`, each atomically) and sends it to the topic.
    fn publish(&self, name: &str, bytes: &[u8], info: &str) -> anyhow::Result<()> {
        if let Some(dir) = &self.dir {
            let path = crate::storage::join(dir, name);
            let flag = crate::storage::join(dir, &format!("{name}.done"));
            if crate::storage::is_remote(dir) {
                // An object appears whole (HDFS: written aside, renamed).
                crate::storage::object(&path)?.put(bytes.to_vec())?;
                crate::storage::object(&flag)?.put(info.as_bytes().to_vec())?;
            } else {
                write_atomic(&path, bytes).with_context(|| format!("writing incremental update {}", path.display()))?;
                write_atomic(&flag, info.as_bytes())
                    .with_context(|| format!("writing the flag of incremental update {}", path.display()))?;
            }
            log::info!("incremental update {} ({} bytes)", path.display(), bytes.len());
        }
        if let Some(t) = &self.kafka {
            send_parts(t, name, bytes, Some(info))?;
            log::info!("incremental update {name} ({} bytes) sent to Kafka", bytes.len());
        }
        Ok(())
    }
}

/// Sends `bytes` as messages keyed `name` to partition 0 of `topic`, in
/// parts of at most KAFKA_PART_BYTES numbered by KAFKA_PART_HEADER; a
/// consumer takes an update once it has all its parts.
pub fn send_update(topic: &crate::data::kafka::Topic, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    send_parts(topic, name, bytes, None)
}

/// `send_update`, each part also carrying `info` in KAFKA_INFO_HEADER.
fn send_parts(topic: &crate::data::kafka::Topic, name: &str, bytes: &[u8], info: Option<&str>) -> anyhow::Result<()> {
    let parts: Vec<&[u8]> = if bytes.is_empty() {
        vec![bytes]
    } else {
        bytes.chunks(KAFKA_PART_BYTES).collect()
    };
    let now = chrono::Utc::now().timestamp_millis();
    for (i, part) in parts.iter().enumerate() {
        let msg = crate::data::kafka::Message {
            key: Some(name.as_bytes().to_vec()),
            value: part.to_vec(),
            timestamp_ms: now,
            headers: [(
                KAFKA_PART_HEADER.to_string(),
                format!("{i}/{}", parts.len()).into_bytes(),
            )]
            .into_iter()
            .chain(info.map(|j| (KAFKA_INFO_HEADER.to_string(), j.as_bytes().to_vec())))
            .collect(),
            offset: 0,
        };
        topic
            .produce(0, vec![msg])
            .with_context(|| format!("sending incremental update {name} to Kafka"))?;
    }
    Ok(())
}

/// The topic of `incr_save_config.kafka` as a client connects to it.
pub fn updates_topic(
    k: &crate::config::train_plan::IncrKafka,
) -> Result<crate::config::kafka_plan::KafkaInput, crate::config::ConfigError> {
    let field = "train_config.incr_save_config.kafka";
    let mut input = crate::config::kafka_plan::KafkaInput::of_topic(field, k.servers.clone(), &k.topic);
    input.start = crate::config::kafka_plan::KafkaStart::Offsets([(0, k.consumer_offset)].into());
    input
        .client
        .read("train_config.incr_save_config.kafka.consumer", &k.consumer_props)?;
    Ok(input)
}
