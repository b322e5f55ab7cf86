//! A Kafka topic as input, as EasyRec's KafkaInput reads one: each
//! message's value is a row of `data_config.separator`-joined fields in
//! `input_fields` order. Partitions are assigned explicitly (no consumer
//! group): worker `i` of `n` reads partition `p` when `p % n == i`, from the
//! offset its checkpoint, `offset_info`, `offset_time` or 0 gives.
//!
//! Every chunk of rows carries, per partition this reader owns, the next
//! offset after its rows: the trainer keeps the position of what it has
//! trained and saves it with each checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};

use super::csv::CsvChunks;
use super::{Projection, RawBatch};
use crate::config::kafka_plan::{ClientProps, KafkaInput, KafkaStart, OffsetReset};

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("Kafka at {servers}: {what}")]
    Client {
        servers: String,
        what: String,
        #[source]
        source: Box<rskafka::client::error::Error>,
    },
    #[error("Kafka at {servers}: {what} took longer than socket.timeout.ms ({ms} ms)")]
    Timeout { servers: String, what: String, ms: u64 },
    #[error("Kafka at {servers}: topic `{topic}` does not exist (topics there: {known})")]
    NoTopic {
        servers: String,
        topic: String,
        known: String,
    },
    #[error("Kafka topic `{topic}` partition {partition} offset {offset}: {message}")]
    Message {
        topic: String,
        partition: i32,
        offset: i64,
        message: String,
    },
    #[error(
        "Kafka topic `{topic}` partition {partition}: offset {offset} is outside what the broker holds \
         ({low}..{high}) and auto.offset.reset is `error`"
    )]
    OutOfRange {
        topic: String,
        partition: i32,
        offset: i64,
        low: i64,
        high: i64,
    },
    #[error("cannot start the Kafka client's runtime")]
    Runtime(#[source] std::io::Error),
}

/// An unreachable broker, a missing topic or a bad message: the user's.
impl crate::error::Classified for KafkaError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// A message to produce, or one fetched (with its offset).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// Unix milliseconds.
    pub timestamp_ms: i64,
    pub headers: BTreeMap<String, Vec<u8>>,
    /// Set on messages fetched.
    pub offset: i64,
}

/// The next offset to read in each partition.
pub type Position = BTreeMap<i32, i64>;

/// Rows read from the topic, with where they came from.
pub struct Chunk {
    pub raw: RawBatch,
    /// (partition, offset) of each row.
    pub rows: Vec<(i32, i64)>,
    /// The next offset of every partition this reader owns, after these rows.
    pub position: Position,
}

/// A connection to the brokers of one input, on its own small runtime (the
/// readers are plain threads).
pub struct Topic {
    rt: tokio::runtime::Runtime,
    client: Client,
    input: KafkaInput,
    /// Each partition's client, opened once (opening asks the brokers for
    /// metadata).
    partitions: std::sync::Mutex<std::collections::HashMap<i32, Arc<PartitionClient>>>,
}

impl Topic {
    pub fn connect(input: &KafkaInput) -> Result<Self, KafkaError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(KafkaError::Runtime)?;
        let c = &input.client;
        let backoff = rskafka::BackoffConfig {
            deadline: Some(Duration::from_millis(c.socket_timeout_ms)),
            ..Default::default()
        };
        let build = ClientBuilder::new(input.servers.clone())
            .client_id(c.client_id.clone())
            .max_message_size(c.message_max_bytes)
            .backoff_config(backoff)
            .build();
        let servers = input.servers.join(",");
        let client = rt
            .block_on(async { tokio::time::timeout(Duration::from_millis(c.socket_timeout_ms), build).await })
            .map_err(|_| KafkaError::Timeout {
                servers: servers.clone(),
                what: "connecting".into(),
                ms: c.socket_timeout_ms,
            })?
            .map_err(|source| KafkaError::Client {
                servers,
                what: "cannot connect".into(),
                source: Box::new(source),
            })?;
        Ok(Topic {
            partitions: Default::default(),
            rt,
            client,
            input: input.clone(),
        })
    }

    fn servers(&self) -> String {
        self.input.servers.join(",")
    }

    /// Runs a request with the input's socket timeout.
    fn call<T>(
        &self,
        what: impl Fn() -> String,
        fut: impl std::future::Future<Output = Result<T, rskafka::client::error::Error>>,
    ) -> Result<T, KafkaError> {
        let ms = self.input.client.socket_timeout_ms;
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_millis(ms), fut).await })
            .map_err(|_| KafkaError::Timeout {
                servers: self.servers(),
                what: what(),
                ms,
            })?
            .map_err(|source| KafkaError::Client {
                servers: self.servers(),
                what: what(),
                source: Box::new(source),
            })
    }

    /// The topic's partitions, in order.
    pub fn partitions(&self) -> Result<Vec<i32>, KafkaError> {
        let topics = self.call(|| "listing topics".into(), self.client.list_topics())?;
        match topics.iter().find(|t| t.name == self.input.topic) {
            Some(t) => Ok(t.partitions.iter().copied().collect()),
            None => Err(KafkaError::NoTopic {
                servers: self.servers(),
                topic: self.input.topic.clone(),
                known: topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn partition(&self, p: i32) -> Result<Arc<PartitionClient>, KafkaError> {
        let opened = self
            .partitions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p)
            .cloned();
        if let Some(pc) = opened {
            return Ok(pc);
        }
        let pc = Arc::new(
            self.call(
                || format!("opening partition {p} of `{}`", self.input.topic),
                self.client
                    .partition_client(self.input.topic.clone(), p, UnknownTopicHandling::Error),
            )?,
        );
        self.partitions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p, pc.clone());
        Ok(pc)
    }

    /// The bytes a fetch of one partition asks for: fetch.min.bytes up to
    /// min(max.partition.fetch.bytes, fetch.max.bytes).
    fn fetch_bytes(&self) -> std::ops::Range<i32> {
        let c = &self.input.client;
        let max_bytes = c.max_partition_fetch_bytes.min(c.fetch_max_bytes.max(1)).max(2);
        c.fetch_min_bytes.min(max_bytes - 1)..max_bytes
    }

    fn offset(&self, pc: &PartitionClient, at: OffsetAt) -> Result<i64, KafkaError> {
        self.call(
            || {
                format!(
                    "asking partition {} of `{}` for offset {at:?}",
                    pc.partition(),
                    self.input.topic
                )
            },
            pc.get_offset(at),
        )
    }

    /// Where each of `partitions` starts by the config: `offset_info`
    /// (0 for partitions it does not name), the first offset at or after
    /// `offset_time` (the end when none is), or 0.
    pub fn starts(&self, partitions: &[i32]) -> Result<Position, KafkaError> {
        let mut out = Position::new();
        for &p in partitions {
            let at = match &self.input.start {
                KafkaStart::Beginning => 0,
                KafkaStart::Offsets(m) => m.get(&p).copied().unwrap_or(0),
                KafkaStart::Time(secs) => {
                    let pc = self.partition(p)?;
                    let ts = chrono::DateTime::from_timestamp(*secs, 0).unwrap_or_default();
                    match self.offset(&pc, OffsetAt::Timestamp(ts))? {
                        o if o >= 0 => o,
                        _ => self.offset(&pc, OffsetAt::Latest)?,
                    }
                }
            };
            out.insert(p, at);
        }
        Ok(out)
    }

    /// The end (high watermark) of each partition now.
    pub fn ends(&self, partitions: &[i32]) -> Result<Position, KafkaError> {
        partitions
            .iter()
            .map(|&p| Ok((p, self.offset(&*self.partition(p)?, OffsetAt::Latest)?)))
            .collect()
    }

    /// Reads the partitions of `from` from their offsets, calling `emit`
    /// with chunks of at most `opts.rows` rows until it returns false, the
    /// partitions reach `opts.until` (when given) or `opts.max_rows` rows
    /// were read. A chunk is emitted when it is full, or, with fewer rows,
    /// when a round of fetches found no more; a round that finds nothing at
    /// all emits an empty chunk, so the caller can look at its stop
    /// conditions while the topic is quiet.
    pub fn read(&self, from: Position, opts: &ReadOpts, mut emit: impl FnMut(Chunk) -> bool) -> Result<(), KafkaError> {
        let clients: Vec<(i32, Arc<PartitionClient>)> = from
            .keys()
            .map(|&p| Ok((p, self.partition(p)?)))
            .collect::<Result<_, KafkaError>>()?;
        let mut position = from;
        let mut rows_out = 0u64;
        // Rows read but not yet emitted: (partition, offset, value).
        let mut pending: std::collections::VecDeque<(i32, i64, Vec<u8>)> = Default::default();
        let mut rng = opts.shuffle.map(|(_, seed)| crate::util::Rng::new(seed));
        let c = &self.input.client;
        let bytes = self.fetch_bytes();
        let at_end = |p: &i32, o: i64| {
            opts.until
                .as_ref()
                .is_some_and(|u| u.get(p).is_none_or(|end| o >= *end))
        };
        loop {
            let finished = position.iter().all(|(p, o)| at_end(p, *o));
            // One round: every partition not at its end, fetched together.
            let mut fetched_any = false;
            if !finished {
                let mut round = tokio::task::JoinSet::new();
                for (p, pc) in clients.iter().filter(|(p, _)| !at_end(p, position[p])) {
                    let (p, pc, at, wait, bytes) = (*p, pc.clone(), position[p], c.fetch_wait_max_ms, bytes.clone());
                    round.spawn_on(
                        async move { (p, at, pc.fetch_records(at, bytes, wait).await) },
                        self.rt.handle(),
                    );
                }
                let ms = c.socket_timeout_ms + c.fetch_wait_max_ms as u64;
                let results = self
                    .rt
                    .block_on(async { tokio::time::timeout(Duration::from_millis(ms), round.join_all()).await })
                    .map_err(|_| KafkaError::Timeout {
                        servers: self.servers(),
                        what: format!("fetching from `{}`", self.input.topic),
                        ms,
                    })?;
                let mut results = results;
                results.sort_by_key(|r| r.0);
                for (p, at, res) in results {
                    let records = match res {
                        Ok((records, _high)) => records,
                        Err(rskafka::client::error::Error::ServerError {
                            protocol_error: rskafka::client::error::ProtocolError::OffsetOutOfRange,
                            ..
                        }) => {
                            let pc = &clients.iter().find(|(q, _)| *q == p).expect("a client per partition").1;
                            position.insert(p, self.reset(pc, at)?);
                            continue;
                        }
                        Err(source) => {
                            return Err(KafkaError::Client {
                                servers: self.servers(),
                                what: format!("fetching partition {p} of `{}` at offset {at}", self.input.topic),
                                source: Box::new(source),
                            })
                        }
                    };
                    for r in records {
                        if r.offset < at {
                            continue; // a compressed batch starts before the offset asked for
                        }
                        if at_end(&p, r.offset) {
                            break;
                        }
                        fetched_any = true;
                        position.insert(p, r.offset + 1);
                        pending.push_back((p, r.offset, r.record.value.unwrap_or_default()));
                    }
                }
            }
            let finished = position.iter().all(|(p, o)| at_end(p, *o));
            // Full chunks; what is left once the topic is quiet or read to
            // its end; an empty chunk when a round found nothing at all.
            loop {
                let mut take = pending.len().min(opts.rows);
                if opts.max_rows > 0 {
                    take = take.min((opts.max_rows - rows_out) as usize);
                }
                let full = take == opts.rows || (opts.max_rows > 0 && rows_out + take as u64 >= opts.max_rows);
                let flush = !fetched_any || finished;
                if take == 0 || !(full || flush) {
                    break;
                }
                let rows: Vec<_> = match (&mut rng, opts.shuffle) {
                    // TensorFlow's shuffle buffer, as EasyRec's KafkaInput
                    // shuffles: each row drawn from the next `buffer`.
                    (Some(rng), Some((buffer, _))) => (0..take)
                        .map(|_| {
                            let j = rng.below(buffer.max(1).min(pending.len()) as u64) as usize;
                            pending.remove(j).expect("a pending row")
                        })
                        .collect(),
                    _ => pending.drain(..take).collect(),
                };
                // The position after these rows: each partition's lowest
                // offset still pending, or where reading is.
                let mut after = position.clone();
                for (p, o, _) in &pending {
                    let at = after.entry(*p).or_insert(*o);
                    *at = (*at).min(*o);
                }
                rows_out += rows.len() as u64;
                if !emit(self.parse(&rows, opts, after)?) || (opts.max_rows > 0 && rows_out >= opts.max_rows) {
                    return Ok(());
                }
            }
            if finished && pending.is_empty() {
                return Ok(());
            }
            if !fetched_any && pending.is_empty() {
                let idle = Chunk {
                    raw: RawBatch {
                        num_rows: 0,
                        columns: opts.projection.empty_columns(0),
                    },
                    rows: Vec::new(),
                    position: position.clone(),
                };
                if !emit(idle) {
                    return Ok(());
                }
            }
        }
    }

    /// Where reading partition `pc` goes on when offset `at` is not held:
    /// librdkafka's `auto.offset.reset`.
    fn reset(&self, pc: &PartitionClient, at: i64) -> Result<i64, KafkaError> {
        let p = pc.partition();
        let (low, high) = (self.offset(pc, OffsetAt::Earliest)?, self.offset(pc, OffsetAt::Latest)?);
        let to = match self.input.client.offset_reset {
            OffsetReset::Earliest => low,
            OffsetReset::Latest => high,
            OffsetReset::Error => {
                return Err(KafkaError::OutOfRange {
                    topic: self.input.topic.clone(),
                    partition: p,
                    offset: at,
                    low,
                    high,
                })
            }
        };
        log::warn!(
            "Kafka topic `{}` partition {p}: offset {at} is not held (the broker holds {low}..{high}); \
             auto.offset.reset moves to {to}",
            self.input.topic
        );
        Ok(to)
    }

    /// Creates the topic with `partitions` partitions (replication 1)
    /// unless it exists; returns its partitions.
    pub fn create(&self, partitions: i32) -> Result<Vec<i32>, KafkaError> {
        if let Ok(p) = self.partitions() {
            return Ok(p);
        }
        let controller = self.client.controller_client().map_err(|source| KafkaError::Client {
            servers: self.servers(),
            what: "finding the controller".into(),
            source: Box::new(source),
        })?;
        self.call(
            || format!("creating topic `{}`", self.input.topic),
            controller.create_topic(self.input.topic.clone(), partitions, 1, 10_000),
        )?;
        // The new topic's metadata reaches the broker's cache shortly after.
        for _ in 0..100 {
            if let Some(p) = self.partitions().ok().filter(|p| !p.is_empty()) {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.partitions()
    }

    /// Appends messages (key, value, timestamp in ms) to `partition`;
    /// returns their offsets.
    pub fn produce(&self, partition: i32, messages: Vec<Message>) -> Result<Vec<i64>, KafkaError> {
        let pc = self.partition(partition)?;
        let records = messages
            .into_iter()
            .map(|m| rskafka::record::Record {
                key: m.key,
                value: Some(m.value),
                headers: m.headers,
                timestamp: chrono::DateTime::from_timestamp_millis(m.timestamp_ms).unwrap_or_default(),
            })
            .collect();
        self.call(
            || format!("producing to partition {partition} of `{}`", self.input.topic),
            pc.produce(records, rskafka::client::partition::Compression::NoCompression),
        )
    }

    /// The messages of `partition` from offset `from` (as many as one fetch
    /// returns, waiting at most fetch.wait.max.ms for one) and the
    /// partition's end.
    pub fn fetch(&self, partition: i32, from: i64) -> Result<(Vec<Message>, i64), KafkaError> {
        let pc = self.partition(partition)?;
        let (records, high) = self.call(
            || {
                format!(
                    "fetching partition {partition} of `{}` at offset {from}",
                    self.input.topic
                )
            },
            pc.fetch_records(from, self.fetch_bytes(), self.input.client.fetch_wait_max_ms),
        )?;
        let messages = records
            .into_iter()
            .filter(|r| r.offset >= from)
            .map(|r| Message {
                key: r.record.key,
                value: r.record.value.unwrap_or_default(),
                timestamp_ms: r.record.timestamp.timestamp_millis(),
                headers: r.record.headers,
                offset: r.offset,
            })
            .collect();
        Ok((messages, high))
    }

    /// Rows of message values as one raw batch; a row that does not parse
    /// is named by its partition and offset.
    fn parse(&self, rows: &[(i32, i64, Vec<u8>)], opts: &ReadOpts, position: Position) -> Result<Chunk, KafkaError> {
        let bad = |p: i32, o: i64, message: String| KafkaError::Message {
            topic: self.input.topic.clone(),
            partition: p,
            offset: o,
            message,
        };
        let mut text = String::new();
        for (p, o, v) in rows {
            let line = std::str::from_utf8(v).map_err(|_| bad(*p, *o, "the value is not UTF-8 text".into()))?;
            let line = line.strip_suffix('\n').unwrap_or(line);
            if line.contains('\n') {
                return Err(bad(*p, *o, "the value holds a line break; a message is one row".into()));
            }
            text.push_str(line);
            text.push('\n');
        }
        let parse = |text: String| -> Result<RawBatch, super::DataError> {
            let name = format!("kafka:{}", self.input.topic);
            let mut chunks = CsvChunks::from_text(
                &name,
                text,
                &opts.separator,
                &opts.field_names,
                &opts.projection,
                rows.len().max(1),
            )?;
            Ok(chunks.next().transpose()?.unwrap_or_else(|| RawBatch {
                num_rows: 0,
                columns: opts.projection.empty_columns(0),
            }))
        };
        match parse(text) {
            Ok(raw) => Ok(Chunk {
                raw,
                rows: rows.iter().map(|(p, o, _)| (*p, *o)).collect(),
                position,
            }),
            Err(e) => {
                // Find the row at fault, to name it.
                for (p, o, v) in rows {
                    if let Err(e) = parse(format!("{}\n", String::from_utf8_lossy(v).trim_end_matches('\n'))) {
                        return Err(bad(*p, *o, format!("{:#}", anyhow::Error::from(e))));
                    }
                }
                Err(bad(rows[0].0, rows[0].1, format!("{:#}", anyhow::Error::from(e))))
            }
        }
    }
}

/// How `Topic::read` reads.
pub struct ReadOpts {
    /// Rows per chunk.
    pub rows: usize,
    /// Stop at these offsets (evaluation: the ends when it began).
    pub until: Option<Position>,
    /// Stop after this many rows (0: no limit).
    pub max_rows: u64,
    /// `data_config.shuffle` for training: each row drawn at random from
    /// the next `shuffle_buffer_size` read (TensorFlow's shuffle buffer, as
    /// EasyRec's KafkaInput shuffles), with this seed.
    pub shuffle: Option<(usize, u64)>,
    pub separator: String,
    pub field_names: Vec<String>,
    pub projection: Projection,
}

/// The partitions worker `index` of `count` reads: EasyRec's
/// `part % count == index`.
pub fn assigned(partitions: &[i32], (index, count): (usize, usize)) -> Vec<i32> {
    partitions
        .iter()
        .copied()
        .filter(|p| (*p as usize) % count.max(1) == index)
        .collect()
}

/// The client properties in force, for the log.
pub fn describe(c: &ClientProps) -> String {
    format!(
        "fetch.max.bytes {} max.partition.fetch.bytes {} fetch.wait.max.ms {}",
        c.fetch_max_bytes, c.max_partition_fetch_bytes, c.fetch_wait_max_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_dealt_as_easyrec_deals_them() {
        let parts = [0, 1, 2, 3, 4];
        assert_eq!(assigned(&parts, (0, 2)), [0, 2, 4]);
        assert_eq!(assigned(&parts, (1, 2)), [1, 3]);
        assert_eq!(assigned(&parts, (0, 1)), parts);
        assert!(assigned(&[0], (1, 2)).is_empty());
    }
}
