//! `kafka_train_input` / `kafka_eval_input` (EasyRec's `KafkaServer`),
//! typed: the brokers, the topic, where reading starts and the client
//! properties we honour.
//!
//! EasyRec hands `config_global` / `config_topic` to librdkafka verbatim.
//! Our client is not librdkafka, so each property is read here: those that
//! shape reading are honoured, those about the consumer group (which
//! neither EasyRec nor we join: partitions are assigned explicitly) are
//! warned about and ignored, any other is refused by name.

use std::collections::BTreeMap;

use super::{proto, ConfigError};

/// Where a worker starts reading each partition.
#[derive(Debug, Clone, PartialEq)]
pub enum KafkaStart {
    /// No `offset` oneof: every partition from offset 0, as EasyRec does.
    Beginning,
    /// `offset_info`: `{"0": 10, "1": 20}`; partitions it does not name start
    /// at 0.
    Offsets(BTreeMap<i32, i64>),
    /// `offset_time`: the first offset at or after this Unix time (seconds),
    /// found with the broker's offsets-for-times.
    Time(i64),
}

/// What to do with a start offset the broker no longer (or not yet) holds:
/// librdkafka's `auto.offset.reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    Earliest,
    Latest,
    Error,
}

/// The client properties we honour, librdkafka's names and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientProps {
    pub client_id: String,
    /// `fetch.max.bytes` (a fetch of one partition asks for at most
    /// min(this, max.partition.fetch.bytes)).
    pub fetch_max_bytes: i32,
    /// `max.partition.fetch.bytes`.
    pub max_partition_fetch_bytes: i32,
    /// `fetch.min.bytes`.
    pub fetch_min_bytes: i32,
    /// `fetch.wait.max.ms`: how long the broker holds a fetch that has
    /// fewer than fetch.min.bytes.
    pub fetch_wait_max_ms: i32,
    /// `message.max.bytes`: the largest response the client accepts.
    pub message_max_bytes: usize,
    /// `socket.timeout.ms`: how long connecting and each request may take
    /// before the job fails.
    pub socket_timeout_ms: u64,
    pub offset_reset: OffsetReset,
}

impl Default for ClientProps {
    fn default() -> Self {
        ClientProps {
            client_id: "rustrec".into(),
            fetch_max_bytes: 52_428_800,
            max_partition_fetch_bytes: 1_048_576,
            fetch_min_bytes: 1,
            fetch_wait_max_ms: 500,
            message_max_bytes: 100_000_000,
            socket_timeout_ms: 60_000,
            offset_reset: OffsetReset::Latest,
        }
    }
}

/// Properties about consumer groups, offsets committed to them and
/// diagnostics: they change nothing here.
const IGNORED: &[&str] = &[
    "group.id",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "debug",
    "statistics.interval.ms",
    "api.version.request",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "enable.partition.eof",
    "check.crcs",
];

impl ClientProps {
    /// Reads `key=value` properties of `field` (`...config_global`).
    pub fn read(&mut self, field: &str, props: &[String]) -> Result<(), ConfigError> {
        for p in props {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                ConfigError::invalid(field, format!("`{p}` is not a librdkafka property `name=value`"))
            })?;
            let (k, v) = (k.trim(), v.trim());
            let int = |lo: i64, hi: i64| -> Result<i64, ConfigError> {
                v.parse::<i64>()
                    .ok()
                    .filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| ConfigError::invalid(field, format!("`{k}={v}`: a whole number in {lo}..={hi}")))
            };
            match k {
                "client.id" => self.client_id = v.to_string(),
                "fetch.max.bytes" => self.fetch_max_bytes = int(0, 2_147_483_135)? as i32,
                "max.partition.fetch.bytes" => self.max_partition_fetch_bytes = int(1, 1_000_000_000)? as i32,
                "fetch.min.bytes" => self.fetch_min_bytes = int(1, 100_000_000)? as i32,
                "fetch.wait.max.ms" => self.fetch_wait_max_ms = int(0, 300_000)? as i32,
                "message.max.bytes" | "receive.message.max.bytes" => {
                    self.message_max_bytes = int(1000, 2_147_483_647)? as usize
                }
                "socket.timeout.ms" => self.socket_timeout_ms = int(10, 300_000)? as u64,
                "auto.offset.reset" => {
                    self.offset_reset = match v {
                        "smallest" | "earliest" | "beginning" => OffsetReset::Earliest,
                        "largest" | "latest" | "end" => OffsetReset::Latest,
                        "error" => OffsetReset::Error,
                        _ => {
                            return Err(ConfigError::invalid(
                                field,
                                format!("`{k}={v}`: one of smallest, earliest, beginning, largest, latest, end, error"),
                            ))
                        }
                    }
                }
                "bootstrap.servers" | "metadata.broker.list" => {
                    return Err(ConfigError::invalid(
                        field,
                        format!("`{k}`: the brokers are the `server` field's"),
                    ))
                }
                _ if IGNORED.contains(&k) => {
                    log::warn!("{field}: `{k}` concerns consumer groups or diagnostics; partitions are assigned explicitly, as in EasyRec, so it is ignored")
                }
                _ => {
                    return Err(ConfigError::unsupported(
                        format!("{field}: `{k}`"),
                        "this librdkafka property (honoured: client.id, fetch.max.bytes, max.partition.fetch.bytes, \
                         fetch.min.bytes, fetch.wait.max.ms, message.max.bytes, socket.timeout.ms, auto.offset.reset)",
                    ))
                }
            }
        }
        Ok(())
    }
}

/// A topic read as input.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaInput {
    /// The config field, for messages: `kafka_train_input`.
    pub field: &'static str,
    /// `server`: brokers separated by commas, `host:port` each.
    pub servers: Vec<String>,
    pub topic: String,
    pub group: String,
    pub start: KafkaStart,
    pub client: ClientProps,
}

impl KafkaInput {
    /// Topic `topic` at `servers`, read from the beginning with the default
    /// client properties (tools, tests, the updates' topic); `field` names
    /// it in messages.
    pub fn of_topic(field: &'static str, servers: Vec<String>, topic: &str) -> Self {
        KafkaInput {
            field,
            servers,
            topic: topic.to_string(),
            group: String::new(),
            start: KafkaStart::Beginning,
            client: ClientProps::default(),
        }
    }

    pub fn from_proto(k: &proto::KafkaServer, field: &'static str) -> Result<Self, ConfigError> {
        let servers = brokers(&format!("{field}.server"), &k.server)?;
        if k.topic.is_empty() {
            return Err(ConfigError::invalid(format!("{field}.topic"), "is empty"));
        }
        use proto::kafka_server::Offset;
        let start = match &k.offset {
            None => KafkaStart::Beginning,
            Some(Offset::OffsetTime(t)) => {
                KafkaStart::Time(super::train_plan::easyrec_time(&format!("{field}.offset_time"), t)?)
            }
            Some(Offset::OffsetInfo(j)) => KafkaStart::Offsets(offset_info(&format!("{field}.offset_info"), j)?),
        };
        let mut client = ClientProps::default();
        client.read(&format!("{field}.config_global"), &k.config_global)?;
        client.read(&format!("{field}.config_topic"), &k.config_topic)?;
        Ok(KafkaInput {
            field,
            servers,
            topic: k.topic.clone(),
            group: k.group.clone(),
            start,
            client,
        })
    }
}

/// `host:port[,host:port...]`.
pub fn brokers(field: &str, server: &str) -> Result<Vec<String>, ConfigError> {
    let servers: Vec<String> = server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if servers.is_empty() {
        return Err(ConfigError::invalid(
            field,
            "names no broker (host:port, separated by commas)",
        ));
    }
    for s in &servers {
        let port = s.rsplit_once(':').map(|(_, p)| p);
        if port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err(ConfigError::invalid(field, format!("`{s}` is not host:port")));
        }
    }
    Ok(servers)
}

/// EasyRec's `offset_info`: a JSON object from partition (a string of
/// digits) to the offset to start at.
fn offset_info(field: &str, json: &str) -> Result<BTreeMap<i32, i64>, ConfigError> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        ConfigError::invalid(
            field,
            format!("not JSON ({e}); EasyRec's form is {{\"0\": 10, \"1\": 20}}"),
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| ConfigError::invalid(field, "must be a JSON object of partition: offset"))?;
    obj.iter()
        .map(|(p, o)| {
            let part = p
                .parse::<i32>()
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| ConfigError::invalid(field, format!("`{p}` is not a partition number")))?;
            let off = o
                .as_i64()
                .filter(|o| *o >= 0)
                .ok_or_else(|| ConfigError::invalid(field, format!("partition {p}: `{o}` is not an offset")))?;
            Ok((part, off))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(extra: impl FnOnce(&mut proto::KafkaServer)) -> Result<KafkaInput, ConfigError> {
        let mut k = proto::KafkaServer {
            server: "127.0.0.1:9092, 127.0.0.2:9093".into(),
            topic: "t".into(),
            group: "g".into(),
            ..Default::default()
        };
        extra(&mut k);
        KafkaInput::from_proto(&k, "kafka_train_input")
    }

    #[test]
    fn offsets_and_times_read_as_easyrec_writes_them() {
        use proto::kafka_server::Offset;
        let k = server(|_| {}).unwrap();
        assert_eq!(k.servers, ["127.0.0.1:9092", "127.0.0.2:9093"]);
        assert_eq!(k.start, KafkaStart::Beginning);
        let k = server(|k| k.offset = Some(Offset::OffsetInfo(r#"{"0": 5, "1": 10}"#.into()))).unwrap();
        assert_eq!(k.start, KafkaStart::Offsets([(0, 5), (1, 10)].into()));
        let k = server(|k| k.offset = Some(Offset::OffsetTime("1650765731".into()))).unwrap();
        assert_eq!(k.start, KafkaStart::Time(1_650_765_731));
        let k = server(|k| k.offset = Some(Offset::OffsetTime("20220517 20:00:00".into()))).unwrap();
        let KafkaStart::Time(t) = k.start else { panic!() };
        // Local time: within a day of UTC's reading.
        assert!((t - 1_652_817_600).abs() <= 14 * 3600, "{t}");
        let bad = server(|k| k.offset = Some(Offset::OffsetInfo(r#"{"x": 5}"#.into()))).unwrap_err();
        assert!(bad.to_string().contains("kafka_train_input.offset_info"), "{bad}");
        let bad = server(|k| k.offset = Some(Offset::OffsetTime("2022-05-17".into()))).unwrap_err();
        assert!(bad.to_string().contains("offset_time"), "{bad}");
        let bad = server(|k| k.server = "localhost".into()).unwrap_err();
        assert!(bad.to_string().contains("host:port"), "{bad}");
    }

    #[test]
    fn properties_are_honoured_ignored_or_refused_by_name() {
        let k = server(|k| {
            k.config_global = vec!["fetch.max.bytes=1024".into(), "enable.auto.commit=false".into()];
            k.config_topic = vec!["auto.offset.reset = earliest".into()];
        })
        .unwrap();
        assert_eq!(k.client.fetch_max_bytes, 1024);
        assert_eq!(k.client.offset_reset, OffsetReset::Earliest);
        let bad = server(|k| k.config_global = vec!["security.protocol=ssl".into()]).unwrap_err();
        assert!(bad.to_string().contains("security.protocol"), "{bad}");
        let bad = server(|k| k.config_topic = vec!["fetch.max.bytes".into()]).unwrap_err();
        assert!(bad.to_string().contains("config_topic"), "{bad}");
    }
}
