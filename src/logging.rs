//! Log lines for operators, through the `log` crate: each line is written
//! whole, in one write, with a UTC timestamp and its level, so lines of
//! several ranks never splice together. Under an MPI launcher every line
//! names its rank, and only rank 0 speaks at info level: the other ranks
//! warn or fail. `RUST_LOG=debug` (or warn, error) changes the level.
//!
//! The `log` crate's logger is process-wide by design; this module's one
//! piece of shared state, the progress bar, lives beside it so that a log
//! line clears the bar, prints and redraws it (no stale bar lines).

use std::io::Write;
use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};

static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

struct Logger {
    prefix: String,
    level: LevelFilter,
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        // Dependencies speak only when they warn.
        m.level() <= self.level && (m.level() <= Level::Warn || m.target().starts_with("rustrec"))
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let ts = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        write_line(&format!("{ts} {:<5} {}{}\n", r.level(), self.prefix, r.args()));
    }

    fn flush(&self) {}
}

/// `[rank r/N] ` under an MPI launcher, else empty.
pub fn rank_prefix() -> String {
    match crate::dist::launch_layout() {
        (_, 1) => String::new(),
        (rank, size) => format!("[rank {rank}/{size}] "),
    }
}

/// Installs the logger (once per process; later calls do nothing).
pub fn init() {
    let (rank, _) = crate::dist::launch_layout();
    init_at(if rank == 0 {
        LevelFilter::Info
    } else {
        LevelFilter::Warn
    });
}

/// Installs the logger showing `default` and above unless `RUST_LOG`
/// says otherwise (once per process; later calls do nothing): tools whose
/// output is their report show warnings only.
pub fn init_at(default: LevelFilter) {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<LevelFilter>().ok())
        .unwrap_or(default);
    let logger = Logger {
        prefix: rank_prefix(),
        level,
    };
    // `set_logger` (not the boxed form) keeps `log` built without its
    // std feature, as every other crate here uses it.
    if log::set_logger(Box::leak(Box::new(logger))).is_ok() {
        log::set_max_level(level);
    }
}

/// The progress bar log lines must step around (None: no bar).
pub fn set_bar(bar: Option<indicatif::ProgressBar>) {
    *BAR.lock().unwrap_or_else(|e| e.into_inner()) = bar;
}

/// Writes one whole line to stderr, around the progress bar if one shows.
pub fn write_line(line: &str) {
    let bar = BAR.lock().unwrap_or_else(|e| e.into_inner());
    let write = || {
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    };
    match bar.as_ref() {
        Some(b) => b.suspend(write),
        None => write(),
    }
}

/// A duration as h:mm:ss.
pub fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_hours_minutes_seconds() {
        assert_eq!(hms(0.4), "0:00:00");
        assert_eq!(hms(3725.0), "1:02:05");
    }
}
