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

/// CRC-32C (Castagnoli), as TFRecord framing uses.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
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
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        let res = (|| {
            self.out.write_all(&len)?;
            self.out.write_all(&masked_crc(&len).to_le_bytes())?;
            self.out.write_all(&data)?;
            self.out.write_all(&masked_crc(&data).to_le_bytes())
        })();
        res.with_context(|| format!("cannot write {}", self.path.display()))
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
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rec = |n: usize| {
            bytes
                .get(at..at + n)
                .with_context(|| format!("{}: truncated record at byte {at}", path.display()))
        };
        let len_bytes = rec(8)?;
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let len_crc = u32::from_le_bytes(rec(12)?[8..12].try_into().expect("4 bytes"));
        anyhow::ensure!(
            masked_crc(len_bytes) == len_crc,
            "{}: bad length checksum at byte {at}",
            path.display()
        );
        let whole = rec(12 + len + 4)?;
        let data = &whole[12..12 + len];
        let crc = u32::from_le_bytes(whole[12 + len..].try_into().expect("4 bytes"));
        anyhow::ensure!(
            masked_crc(data) == crc,
            "{}: bad data checksum at byte {at}",
            path.display()
        );
        out.push(Event::decode(data).with_context(|| format!("{}: bad event at byte {at}", path.display()))?);
        at += 16 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

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
