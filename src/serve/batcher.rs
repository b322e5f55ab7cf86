//! Scoring threads. Each request's rows arrive as a job; with batching on,
//! a thread merges the jobs that wait (for the same model version) up to
//! `max_batch_size` rows or until `batch_timeout` has passed since the first,
//! scores them in one run and hands each job its rows' scores. Requests
//! keep the version they were decoded for, so a reload never mixes versions.

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
        for i in 0..batching.threads.max(1) {
            let (rx, b, m) = (rx.clone(), batching.clone(), metrics.clone());
            std::thread::Builder::new()
                .name(format!("score-{i}"))
                .spawn(move || worker(&rx, &b, &m))
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
fn worker(rx: &Mutex<Receiver<Job>>, b: &Batching, metrics: &Metrics) {
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
        run(jobs);
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
fn run(jobs: Vec<Job>) {
    if jobs.len() == 1 {
        let job = jobs.into_iter().next().expect("one job");
        let scores = score(&job.model, &job.raw);
        let _ = job.reply.send(scores);
        return;
    }
    let mut merged = jobs[0].raw.empty_like();
    for j in &jobs {
        let all: Vec<usize> = (0..j.raw.num_rows).collect();
        merged.extend_from(&j.raw, &all);
    }
    match score(&jobs[0].model, &merged) {
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
