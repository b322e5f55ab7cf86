//! Training from a Kafka topic: each rank reads its partitions, keeps the
//! position of what it has trained, and checkpoints save every rank's
//! position joined; a resumed job (at any world size) starts each
//! partition there.
//!
//! Delivery: at least once. Rows trained after the last checkpoint are
//! trained again when a killed job resumes from it; none is skipped.

use std::io::Write;

use anyhow::Context;

use super::Trainer;
use crate::checkpoint::StreamOffsets;
use crate::config::data_plan::InputFormat;
use crate::config::kafka_plan::KafkaInput;
use crate::data::kafka::{self, Position, ReadOpts, Topic};
use crate::data::Prefetch;
use crate::features::Batch;

/// A batch read from the input, or none: the topic is quiet (the loop
/// looks at its stop conditions and asks again).
pub struct Fed {
    pub batch: Option<Batch>,
    /// (partition, offset) of each row, from a topic.
    pub rows: Vec<(i32, i64)>,
    /// This rank's position after the batch, from a topic.
    pub position: Option<Position>,
}

/// The training input: files or a topic.
pub enum TrainStream {
    Files(Prefetch<Batch>),
    Topic(Prefetch<Fed>),
}

impl Iterator for TrainStream {
    type Item = anyhow::Result<Fed>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            TrainStream::Files(s) => s.next().map(|b| {
                b.map(|batch| Fed {
                    batch: Some(batch),
                    rows: Vec::new(),
                    position: None,
                })
            }),
            TrainStream::Topic(s) => s.next(),
        }
    }
}

/// Each trained row's `partition offset`, one per line, when
/// RUSTREC_TRACE_TRAINED_ROWS names a file (`.<rank>` appended): how the
/// tests count that every row was trained and which twice.
pub struct RowTrace(std::fs::File);

impl RowTrace {
    pub fn from_env(rank: usize) -> anyhow::Result<Option<Self>> {
        let Some(path) = std::env::var_os("RUSTREC_TRACE_TRAINED_ROWS") else {
            return Ok(None);
        };
        let mut path = std::path::PathBuf::from(path).into_os_string();
        path.push(format!(".{rank}"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open the row trace {}", path.to_string_lossy()))?;
        Ok(Some(RowTrace(f)))
    }

    fn write(&mut self, rows: &[(i32, i64)]) -> anyhow::Result<()> {
        let text: String = rows.iter().map(|(p, o)| format!("{p} {o}\n")).collect();
        self.0.write_all(text.as_bytes()).context("writing the row trace")
    }
}

impl Trainer {
    /// The training input from global step `step` on: the config's topic,
    /// or its files (skipping the batches already trained).
    pub fn train_stream(&self, skip_batches: u64) -> anyhow::Result<TrainStream> {
        match &self.plan.data.train_kafka {
            Some(k) => Ok(TrainStream::Topic(self.topic_stream(k, true)?)),
            None => Ok(TrainStream::Files(self.stream(
                &self.plan.data.train_paths,
                true,
                skip_batches,
            )?)),
        }
    }

    /// This rank's partitions of `input`, from where the checkpoint (for
    /// training) or the config says. Training reads on without end;
    /// evaluation reads to the partitions' ends when it starts, at most
    /// eval_config.num_examples rows in all.
    pub(super) fn topic_stream(&self, input: &KafkaInput, train: bool) -> anyhow::Result<Prefetch<Fed>> {
        let (mut index, mut count) = self.readers(train);
        if train && self.plan.data.chief_redundant && count > 1 {
            // EasyRec: the chief reads what the first other worker reads.
            (index, count) = (index.saturating_sub(1), count - 1);
        }
        let topic = Topic::connect(input)?;
        let parts = topic.partitions()?;
        let mine = kafka::assigned(&parts, (index, count));
        if mine.is_empty() && train {
            anyhow::bail!(
                "{}: topic `{}` has {} partition(s), none for worker {index} of {count}: \
                 run at most as many workers as partitions",
                input.field,
                input.topic,
                parts.len()
            );
        }
        let mut from = topic.starts(&mine)?;
        if train {
            if let Some(saved) = &self.resumed_stream {
                if saved.topic != input.topic {
                    log::warn!(
                        "the checkpoint read topic `{}`; this job reads `{}` from the config's offsets",
                        saved.topic,
                        input.topic
                    );
                } else {
                    for (p, o) in from.iter_mut() {
                        if let Some(s) = saved.offsets.get(p) {
                            *o = *s;
                        }
                    }
                }
            }
        }
        let until = if train { None } else { Some(topic.ends(&mine)?) };
        let p = &self.plan;
        let InputFormat::Csv { separator, .. } = &p.data.format else {
            anyhow::bail!("data_config.input_type: KafkaInput reads rows of separated fields");
        };
        let max_rows = if train {
            0
        } else {
            p.eval.num_examples.div_ceil(count.max(1) as u64)
        };
        log::info!(
            "{} {}: topic `{}` partitions {} from {:?} ({})",
            if train { "worker" } else { "evaluator" },
            index,
            input.topic,
            mine.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","),
            from,
            kafka::describe(&input.client)
        );
        let opts = ReadOpts {
            rows: p.data.batch_size.max(1) as usize,
            until,
            max_rows,
            shuffle: (train && p.data.shuffle).then(|| {
                (
                    p.data.shuffle_buffer_size,
                    self.seed ^ crate::util::mix64(index as u64 + 1),
                )
            }),
            separator: separator.clone(),
            field_names: p.data.fields.iter().map(|f| f.name.clone()).collect(),
            projection: self.enc.projection.clone(),
        };
        let mut encode = self.encoder(train, index, 0, (0, 1));
        Ok(Prefetch::spawn(p.data.prefetch_size.min(8), move |send| {
            if mine.is_empty() {
                return Ok(()); // an evaluator without partitions reads nothing
            }
            topic.read(from, &opts, |chunk| {
                let batch = if chunk.raw.num_rows == 0 {
                    Ok(None)
                } else {
                    encode(chunk.raw).map(Some)
                };
                send(batch.map(|batch| Fed {
                    batch,
                    rows: chunk.rows,
                    position: Some(chunk.position),
                }))
            })?;
            Ok(())
        }))
    }

    /// Takes note of a trained batch's place in the stream.
    pub(super) fn fed(&mut self, fed: &Fed) -> anyhow::Result<()> {
        if let Some(pos) = &fed.position {
            let mine = self.stream_position.get_or_insert_with(Position::new);
            mine.extend(pos.iter().map(|(p, o)| (*p, *o)));
        }
        if let Some(t) = &mut self.trace {
            t.write(&fed.rows)?;
        }
        Ok(())
    }

    /// Every rank's position joined (a collective), for a checkpoint: where
    /// a rank has not read yet, the position the job resumed from.
    pub(super) fn stream_offsets(&self) -> Option<StreamOffsets> {
        let input = self.plan.data.train_kafka.as_ref()?;
        let mine: Vec<u64> = self
            .stream_position
            .iter()
            .flatten()
            .flat_map(|(p, o)| [*p as u64, *o as u64])
            .collect();
        let mut offsets = match &self.resumed_stream {
            Some(s) if s.topic == input.topic => s.offsets.clone(),
            _ => Position::new(),
        };
        // Two ranks read one partition only under chief_redundant: the
        // lower position keeps every row.
        let mut read = Position::new();
        for rank in self.comm.all_gather_u64(&mine) {
            for pair in rank.chunks_exact(2) {
                let o = read.entry(pair[0] as i32).or_insert(pair[1] as i64);
                *o = (*o).min(pair[1] as i64);
            }
        }
        offsets.extend(read);
        Some(StreamOffsets {
            topic: input.topic.clone(),
            offsets,
        })
    }
}
