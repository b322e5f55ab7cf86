//! Asynchronous parameter-server training: EasyRec's NoStrategy with
//! `sync_replicas: false`, and PSStrategy, on several ranks.
//!
//! Ranks `0..servers` are servers and hold the embedding rows (row `g` on
//! server `g % servers`, the sharding's rule) and a contiguous slice each of
//! the dense parameters, with their optimizer slots; the other ranks are
//! workers. A worker reads its share of the input, pulls the rows its batch
//! uses and the dense parameters, computes the gradients and pushes them
//! back, without waiting for any other worker. Servers apply pushes in the
//! order they come, with the configured optimizers. Dedicated server ranks
//! rather than a server thread on every rank: MPI runs single-threaded
//! here, and a server that only answers messages leaves the cores to the
//! workers (its receive sleeps between polls).
//!
//! Server 0 keeps the global step: it gives each pulled batch a ticket (its
//! step) and counts a step when the batch's push comes back. A push is
//! applied unless more than `max_staleness` other pushes completed between
//! its pull and its push; a staler one is dropped (counted and reported),
//! so staleness is bounded without making fast workers wait for a slow one.
//!
//! Checkpoints are a consistent cut: when one is due server 0 answers pulls
//! with PAUSE, each worker leaves after its last push, and once every
//! worker has left all ranks meet: the servers' parameters are gathered,
//! and the checkpoint, the evaluation and the exporters run as in the
//! synchronous strategies (every shard at the same global step, restorable
//! at any world size). Then serving resumes.

mod server;
mod worker;

use std::time::Instant;

use super::run::AfterEval;
use super::run::{Evaluations, RunSummary};
use super::Trainer;
use crate::config::ConfigError;

/// The messages workers and servers exchange (protos/rustrec/ps.proto).
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/rustrec.ps.rs"));
}

/// The command line's choices for asynchronous training.
#[derive(Debug, Clone, Default)]
pub struct PsOptions {
    /// Server ranks; by default one per four ranks (at least one).
    pub servers: Option<usize>,
    /// Most pushes that may complete between a batch's pull and its push
    /// before the push is dropped; by default four per worker.
    pub max_staleness: Option<u64>,
}

/// Which ranks serve and which work.
#[derive(Debug, Clone)]
pub struct Roles {
    pub servers: usize,
    pub workers: usize,
    pub max_staleness: u64,
}

impl Roles {
    /// The roles of a job of `size` ranks.
    pub fn new(opts: &PsOptions, size: usize) -> Result<Self, ConfigError> {
        let servers = opts.servers.unwrap_or((size / 4).max(1));
        if servers == 0 || servers >= size {
            return Err(ConfigError::unsupported(
                "--num_ps",
                format!(
                    "{servers} parameter server(s) among {size} ranks; asynchronous training needs at least one \
                     server and one worker"
                ),
            ));
        }
        let workers = size - servers;
        Ok(Roles {
            servers,
            workers,
            max_staleness: opts.max_staleness.unwrap_or(4 * workers as u64),
        })
    }

    pub fn is_server(&self, rank: usize) -> bool {
        rank < self.servers
    }

    /// A worker rank's index among the workers.
    pub fn worker_index(&self, rank: usize) -> Option<usize> {
        rank.checked_sub(self.servers)
    }

    /// The dense parameters (flat indices of `n`) server `s` holds.
    pub fn dense_range(&self, s: usize, n: usize) -> std::ops::Range<usize> {
        let per = n.div_ceil(self.servers);
        (s * per).min(n)..((s + 1) * per).min(n)
    }
}

/// What every rank learns when they meet.
struct Meeting {
    /// Every worker is done: training is over.
    finished: bool,
    /// The loss of the last applied batch (NaN before any).
    last_loss: f32,
}

impl Trainer {
    /// `run_with` under asynchronous training: serving periods between
    /// meetings of all ranks, where checkpoints, evaluations and exports
    /// run as in the synchronous strategies.
    pub(super) fn run_async(&mut self, after_eval: &mut AfterEval) -> anyhow::Result<RunSummary> {
        let roles = self.ps.clone().expect("asynchronous training has roles");
        let start_step = self.step;
        let target = self.plan.train.num_steps.map(u64::from);
        self.log_banner(target);
        let rank = self.comm.rank();
        if rank == 0 {
            log::info!(
                "asynchronous training: {} server rank(s), {} worker rank(s), pushes staler than {} steps dropped",
                roles.servers,
                roles.workers,
                roles.max_staleness
            );
        }
        let t0 = Instant::now();
        let mut server = roles
            .is_server(rank)
            .then(|| server::Server::new(self, &roles))
            .transpose()?;
        let mut worker = match roles.worker_index(rank) {
            Some(index) => Some(worker::Worker::new(self, &roles, index)?),
            None => None,
        };
        let mut last_save = self.step;
        let mut evals = Evaluations::default();
        let last_loss = loop {
            let done_here = match (&mut server, &mut worker) {
                (Some(s), _) => {
                    s.serve(self)?;
                    false
                }
                (_, Some(w)) => w.work(self)?,
                (None, None) => unreachable!("every rank serves or works"),
            };
            let meeting = self.meet(&roles, server.as_ref(), done_here);
            if meeting.finished {
                break meeting.last_loss;
            }
            // Server 0 pauses the workers for a checkpoint alone.
            last_save = self.step;
            let stop = self.save_and_evaluate(&mut evals, after_eval)?;
            if let Some(s) = &mut server {
                s.saved();
            }
            if stop {
                break meeting.last_loss;
            }
        };
        let samples = worker.as_ref().map_or(0, |w| w.samples);
        // Each worker's pace, on rank 0 (a straggler shows here).
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        let rates = self.comm.all_gather_f32(&[(samples as f64 / secs) as f32]);
        if rank == 0 {
            let rates: Vec<String> = rates[roles.servers..]
                .iter()
                .enumerate()
                .map(|(w, r)| format!("worker {w} {:.0}", r[0]))
                .collect();
            log::info!("samples/s by worker: {}", rates.join(", "));
        }
        if let Some(s) = &server {
            s.report();
        }
        self.finish(start_step, samples, (t0, last_save), last_loss, after_eval)
    }

    /// All ranks meet after a serving period: the global step, every
    /// server's dense slice (and its optimizer slots) and the workers'
    /// averaged batch-norm statistics reach every rank, so the collective
    /// checkpoint and evaluation see one model.
    fn meet(&mut self, roles: &Roles, server: Option<&server::Server>, done_here: bool) -> Meeting {
        let comm = self.comm.clone();
        let rank = comm.rank();
        let (step, skipped, loss) = server.filter(|_| rank == 0).map_or((0.0, 0.0, 0.0), |s| {
            (s.completed() as f64, self.skipped_batches as f64, s.last_loss() as f64)
        });
        let mut flags = [f64::from(u8::from(done_here)), step, skipped, loss];
        comm.all_reduce_sum(&mut flags);
        self.step = flags[1] as u64;
        self.skipped_batches = flags[2] as u64;
        let n = self.model.params.values.len();
        let own = if roles.is_server(rank) {
            roles.dense_range(rank, n)
        } else {
            0..0
        };
        self.model.params.values = comm.all_gather_f32(&self.model.params.values[own.clone()]).concat();
        for k in 0..self.dense.slots.slots.len() {
            self.dense.slots.slots[k] = comm.all_gather_f32(&self.dense.slots.slots[k][own.clone()]).concat();
        }
        if !self.model.buffers.values.is_empty() {
            // Each worker's moving averages saw its own batches: average them.
            if roles.is_server(rank) {
                self.model.buffers.values.fill(0.0);
            }
            comm.all_reduce_sum_f32(&mut self.model.buffers.values);
            let w = roles.workers as f32;
            self.model.buffers.values.iter_mut().for_each(|v| *v /= w);
        }
        Meeting {
            finished: flags[0] as usize == roles.workers,
            last_loss: flags[3] as f32,
        }
    }
}
