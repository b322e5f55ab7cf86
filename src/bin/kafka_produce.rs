//! Replays the rows of a CSV file into a Kafka topic, one message per row
//! (the value is the line; the key is the row's number), dealt round-robin
//! over the topic's partitions: the input of an online-training job
//! (`kafka_train_input`), for the tests, `make odl-demo` and the bench.

use std::ffi::OsString;
use std::io::BufRead;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rustrec::config::kafka_plan::{brokers, KafkaInput};
use rustrec::data::kafka::{Message, Topic};

#[derive(Debug, Parser)]
#[command(
    name = "kafka_produce",
    rename_all = "snake_case",
    about = "Replay a CSV file's rows into a Kafka topic"
)]
struct Args {
    /// Brokers, host:port separated by commas.
    #[arg(long)]
    server: String,
    #[arg(long)]
    topic: String,
    /// Partitions of the topic when it is created here.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// The rows, one per line (a header is skipped with --with_header).
    #[arg(long)]
    input: std::path::PathBuf,
    #[arg(long, default_value_t = false)]
    with_header: bool,
    /// The column (0-based, split on --separator) holding each row's Unix
    /// time in seconds, its message's timestamp; otherwise the time sent.
    #[arg(long)]
    time_column: Option<usize>,
    #[arg(long, default_value = ",")]
    separator: String,
    /// Without --time_column: row k's timestamp is this Unix time (seconds)
    /// plus k * --seconds_per_row, a clock replayed (0: the time sent).
    #[arg(long, default_value_t = 0)]
    time_from: i64,
    #[arg(long, default_value_t = 1.0)]
    seconds_per_row: f64,
    /// Rows per second (0: as fast as the broker takes them).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Skip this many rows of the file first.
    #[arg(long, default_value_t = 0)]
    skip: usize,
    /// Send at most this many rows (0: all).
    #[arg(long, default_value_t = 0)]
    rows: usize,
}

fn run(args: Vec<OsString>) -> anyhow::Result<()> {
    let a = Args::try_parse_from(args)?;
    let input = KafkaInput::of_topic("--server", brokers("--server", &a.server)?, &a.topic);
    let topic = Topic::connect(&input)?;
    let parts = topic.create(a.partitions.max(1))?;
    anyhow::ensure!(!parts.is_empty(), "topic `{}` has no partitions", a.topic);
    let file = std::fs::File::open(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    let mut lines = std::io::BufReader::new(file).lines();
    if a.with_header {
        lines.next().transpose()?;
    }
    let start = Instant::now();
    let (mut sent, mut pending): (usize, Vec<Vec<Message>>) = (0, vec![Vec::new(); parts.len()]);
    let flush = |pending: &mut Vec<Vec<_>>| -> anyhow::Result<()> {
        for (i, msgs) in pending.iter_mut().enumerate() {
            if !msgs.is_empty() {
                topic.produce(parts[i], std::mem::take(msgs))?;
            }
        }
        Ok(())
    };
    for (n, line) in lines.enumerate().skip(a.skip) {
        if a.rows > 0 && sent >= a.rows {
            break;
        }
        let line = line.with_context(|| format!("reading {}", a.input.display()))?;
        let ts = match a.time_column {
            Some(c) => {
                let v = line.split(a.separator.as_str()).nth(c).unwrap_or("");
                v.trim()
                    .parse::<i64>()
                    .with_context(|| format!("{}: row {n}: column {c} `{v}` is not Unix seconds", a.input.display()))?
                    * 1000
            }
            None if a.time_from > 0 => a.time_from * 1000 + (sent as f64 * a.seconds_per_row * 1000.0) as i64,
            None => chrono::Utc::now().timestamp_millis(),
        };
        pending[sent % parts.len()].push(Message {
            key: Some(n.to_string().into_bytes()),
            value: line.into_bytes(),
            timestamp_ms: ts,
            ..Message::default()
        });
        sent += 1;
        let batch = if a.rate > 0.0 {
            (a.rate / 10.0).ceil().max(1.0) as usize
        } else {
            1000
        };
        if sent.is_multiple_of(batch * parts.len()) || (a.rate > 0.0 && sent.is_multiple_of(batch)) {
            flush(&mut pending)?;
            if a.rate > 0.0 {
                let due = Duration::from_secs_f64(sent as f64 / a.rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    flush(&mut pending)?;
    println!(
        "sent {sent} rows to topic {} ({} partitions) in {:.1}s",
        a.topic,
        parts.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    rustrec::cli::main_with(run)
}
