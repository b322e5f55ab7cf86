//! Scoring threads. Each request's rows arrive as a job; with batching on,
//! a thread merges the jobs that wait (for the same model version) up to
//! `max_batch_size` rows or until `batch_timeout` has passed since the first,
//! scores them in one run and hands each job its rows' scores. Requests
//! keep the version they were decoded for, so a reload never mixes versions.
//! A run of many rows while other scoring threads are idle is split among
//! them (`split`): one client's request then uses the cores a busy server
//! would give to other requests, and its latency drops by as much.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::metrics::Metrics;
use super::Served;
use crate::data::RawBatch;
use crate::model::TaskScores;

/// Why a job got no scores.
#[derive(Debug, Clone, PartialEq)]
pub enum ScoreError {
    /// The rows' values cannot be encoded (HTTP 400).
    Input(String),
    /// The model failed to run (HTTP 500).
    Internal(String),
}

pub struct Job {
    pub model: Arc<Served>,
    pub raw: RawBatch,
    pub reply: oneshot::Sender<Result<Vec<TaskScores>, ScoreError>>,
}

#[derive(Debug, Clone)]
pub struct Batching {
    /// Rows merged into one run at most; 0 scores each request alone.
    pub max_batch_size: usize,
    pub timeout: Duration,
    pub threads: usize,
}

pub struct Scheduler {
    tx: Sender<Job>,
}

impl Scheduler {
    pub fn start(batching: Batching, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let busy = Arc::new(AtomicUsize::new(0));
        for i in 0..batching.threads.max(1) {
            let (rx, b, m, busy) = (rx.clone(), batching.clone(), metrics.clone(), busy.clone());
            std::thread::Builder::new()
                .name(format!("score-{i}"))
                .spawn(move || worker(&rx, &b, &m, &busy))
                .expect("cannot start a scoring thread");
        }
        Scheduler { tx }
    }

    /// Queues a job; its reply comes on the job's channel.
    pub fn submit(&self, job: Job) {
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            let _ = job
                .reply
                .send(Err(ScoreError::Internal("the scoring threads have stopped".into())));
        }
    }
}

/// A scoring thread. The receiver's lock is held while waiting for a first
/// job and while gathering the rest of its batch, never by a thread that
/// already holds a job it cannot run yet: a job carried over from the last
/// batch (another version's, or too many rows) gathers more only when the
/// lock is free, and is otherwise run alone.
fn worker(rx: &Mutex<Receiver<Job>>, b: &Batching, metrics: &Metrics, busy: &AtomicUsize) {
    let mut carry: Option<Job> = None;
    loop {
        let jobs = match carry.take() {
            Some(first) => match rx.try_lock() {
                Ok(guard) => gather(&guard, first, b, &mut carry),
                Err(TryLockError::Poisoned(p)) => gather(&p.into_inner(), first, b, &mut carry),
                Err(TryLockError::WouldBlock) => vec![first],
            },
            None => {
                let guard = rx.lock().unwrap_or_else(|e| e.into_inner());
                match guard.recv() {
                    Ok(first) => gather(&guard, first, b, &mut carry),
                    Err(_) => return,
                }
            }
        };
        metrics.batch(jobs.iter().map(|j| j.raw.num_rows).sum());
        let now_busy = busy.fetch_add(1, Ordering::SeqCst) + 1;
        // The threads idle now, and so the parts a run may be split into.
        let parts = b.threads.max(1).saturating_sub(now_busy) + 1;
        run(jobs, parts);
        busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `first` and the jobs that arrive for the same version within the batch
/// timeout, up to `max_batch_size` rows; the first job that does not fit is
/// left in `carry`.
fn gather(rx: &Receiver<Job>, first: Job, b: &Batching, carry: &mut Option<Job>) -> Vec<Job> {
    let mut rows = first.raw.num_rows;
    let mut jobs = vec![first];
    let deadline = Instant::now() + b.timeout;
    while b.max_batch_size > 0 && rows < b.max_batch_size {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(j) if Arc::ptr_eq(&j.model, &jobs[0].model) && rows + j.raw.num_rows <= b.max_batch_size => {
                rows += j.raw.num_rows;
                jobs.push(j);
            }
            Ok(j) => {
                *carry = Some(j);
                break;
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    jobs
}

/// Scores the jobs in one run and answers each; when the merged rows fail to
/// encode, each job is scored alone so the error reaches only its sender.
fn run(jobs: Vec<Job>, parts: usize) {
    if jobs.len() == 1 {
        let job = jobs.into_iter().next().expect("one job");
        let scores = split(&job.model, &job.raw, parts);
        let _ = job.reply.send(scores);
        return;
    }
    let mut merged = jobs[0].raw.empty_like();
    for j in &jobs {
        let all: Vec<usize> = (0..j.raw.num_rows).collect();
        merged.extend_from(&j.raw, &all);
    }
    match split(&jobs[0].model, &merged, parts) {
        Ok(scores) => {
            let mut start = 0;
            for j in jobs {
                let end = start + j.raw.num_rows;
                let part = scores.iter().map(|t| t.rows_in(start, end)).collect();
                let _ = j.reply.send(Ok(part));
                start = end;
            }
        }
        Err(_) => {
            for j in jobs {
                let scores = score(&j.model, &j.raw);
                let _ = j.reply.send(scores);
            }
        }
    }
}

/// Rows per part below which a run is not split: a part's fixed cost
/// (feature encoding's and the graph's set-up) would outweigh the gain.
const MIN_PART_ROWS: usize = 32;

/// Scores `raw` in up to `parts` runs of consecutive rows side by side on
/// their own threads (scoped: they end before this returns), answering as
/// one run would (each row is scored alone by the graph).
fn split(served: &Served, raw: &RawBatch, parts: usize) -> Result<Vec<TaskScores>, ScoreError> {
    let parts = parts.min(raw.num_rows / MIN_PART_ROWS).max(1);
    if parts == 1 {
        return score(served, raw);
    }
    let per = raw.num_rows.div_ceil(parts);
    let pieces: Vec<RawBatch> = (0..raw.num_rows)
        .step_by(per)
        .map(|start| {
            let rows: Vec<usize> = (start..(start + per).min(raw.num_rows)).collect();
            let mut piece = raw.empty_like();
            piece.extend_from(raw, &rows);
            piece
        })
        .collect();
    let results: Vec<Result<Vec<TaskScores>, ScoreError>> = std::thread::scope(|s| {
        let handles: Vec<_> = pieces[1..].iter().map(|p| s.spawn(|| score(served, p))).collect();
        let first = score(served, &pieces[0]);
        std::iter::once(first)
            .chain(handles.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ScoreError::Internal(
                        "a scoring thread panicked (a bug in rustrec)".into(),
                    ))
                })
            }))
            .collect()
    });
    let mut all: Option<Vec<TaskScores>> = None;
    for r in results {
        let part = r?;
        match all.as_mut() {
            None => all = Some(part),
            Some(acc) => acc.iter_mut().zip(part).for_each(|(a, p)| a.append(p)),
        }
    }
    Ok(all.unwrap_or_default())
}

/// One model run; a panic in it is reported as an internal error and the
/// thread goes on serving.
fn score(served: &Served, raw: &RawBatch) -> Result<Vec<TaskScores>, ScoreError> {
    let model = &served.model;
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let batch = model.enc.encode(raw).map_err(|e| ScoreError::Input(format!("{e:#}")))?;
        model.score(&batch).map_err(|e| ScoreError::Internal(format!("{e:#}")))
    }));
    run.unwrap_or_else(|_| Err(ScoreError::Internal("the model run panicked (a bug in rustrec)".into())))
}
