//! TensorBoard event files: scalar summaries in TensorFlow's `tfevents`
//! record format (length, masked CRC-32C, `Event` protobuf, masked CRC-32C),
//! which TensorBoard reads without TensorFlow.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use prost::Message;

/// `tensorflow.Event` (only the fields we write).
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a `simple_value`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// Appends scalar summaries to `dir/events.out.tfevents.<secs>.<host>`.
pub struct SummaryWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl SummaryWriter {
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
        // Seconds as TensorFlow names them, plus a suffix so that two writers
        // started within one second never share a file.
        let t = now();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.{}",
            t as u64,
            std::process::id(),
            (t.fract() * 1e9) as u64
        ));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = SummaryWriter {
            out: BufWriter::new(file),
            path,
        };
        w.write_event(&Event {
            wall_time: now(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, e: &Event) -> anyhow::Result<()> {
        crate::data::tfrecord::write_record(&mut self.out, &e.encode_to_vec())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Writes one event holding `scalars` at `step` and flushes it.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f64)]) -> anyhow::Result<()> {
        let value = scalars
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.write_event(&Event {
            wall_time: now(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })?;
        self.out
            .flush()
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Reads every event of a `tfevents` file, verifying both checksums of each
/// record.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut records = crate::data::tfrecord::RecordReader::new(&bytes[..]);
    let mut out = Vec::new();
    while let Some(r) = records.next_record() {
        let data = r.map_err(|m| anyhow::anyhow!("{}: {m}", path.display()))?;
        out.push(Event::decode(&data[..]).with_context(|| format!("{}: bad event {}", path.display(), out.len()))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SummaryWriter::create(dir.path()).unwrap();
        w.scalars(10, &[("loss", 0.5), ("lr", 0.01)]).unwrap();
        let events = read_events(w.path()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let s = events[1].summary.as_ref().unwrap();
        assert_eq!(events[1].step, 10);
        assert_eq!(s.value[0].tag, "loss");
        assert_eq!(s.value[1].simple_value, Some(0.01));
    }
}
