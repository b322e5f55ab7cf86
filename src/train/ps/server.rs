//! A server rank: answers the workers' pulls with its rows and its slice of
//! the dense parameters, and applies their pushes with the configured
//! optimizers. Server 0 also keeps the global step (tickets), decides when
//! the workers pause for a checkpoint or end, and bounds staleness.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Instant;

use prost::Message;

use super::wire::{self, pull_reply::State, request::Kind};
use super::Roles;
use crate::embedding::{RowGrads, RowSource};
use crate::summary::SummaryWriter;
use crate::train::run::StopSignal;
use crate::train::Trainer;

pub(super) struct Server {
    rank: usize,
    workers: usize,
    max_staleness: u64,
    /// This server's dense parameters (flat indices).
    dense: Range<usize>,
    /// Workers whose input ran out, or that the end reached.
    done: BTreeSet<usize>,
    /// Server 0: tickets given out (the step of the next pulled batch).
    issued: u64,
    /// Server 0: pushes come back, applied or not: the global step.
    completed: u64,
    /// Server 0: `completed` when each outstanding ticket was given.
    pulled_at: BTreeMap<u64, u64>,
    target: Option<u64>,
    /// Server 0: what pulls are answered with once a checkpoint or the end
    /// is due.
    halt: Option<State>,
    last_save: Instant,
    /// The global step of the last checkpoint (or of the start).
    saved_at: u64,
    /// The global step this run started at.
    started: u64,
    /// Server 0 watches for the stop signal.
    signal: StopSignal,
    stats: Stats,
    summaries: Option<SummaryWriter>,
    /// Every server follows the applied pushes' losses alike, so all stop
    /// at the same step when the run diverges.
    guard: crate::train::divergence::DivergenceGuard,
}

/// Server 0's account of the pushes: the current logging window and the
/// whole run.
#[derive(Default)]
struct Stats {
    window_start: Option<Instant>,
    window_examples: u64,
    window_loss: f64,
    window_pushes: u64,
    window_staleness: u64,
    window_max_staleness: u64,
    summary_start: Option<(Instant, u64)>,
    applied: u64,
    dropped: u64,
    staleness_sum: u64,
    max_staleness: u64,
    last_loss: f32,
}

impl Server {
    pub(super) fn new(t: &Trainer, roles: &Roles) -> anyhow::Result<Self> {
        let rank = t.comm.rank();
        let p = &t.plan;
        // As the synchronous loop: the chief writes them, or fails.
        let summaries = (rank == 0 && p.train.save_summary_steps > 0)
            .then(|| SummaryWriter::create(&p.model_dir))
            .transpose()?;
        Ok(Server {
            rank,
            workers: roles.workers,
            max_staleness: roles.max_staleness,
            dense: roles.dense_range(rank, t.model.params.values.len()),
            done: BTreeSet::new(),
            issued: t.step,
            completed: t.step,
            pulled_at: BTreeMap::new(),
            target: p.train.num_steps.map(u64::from),
            halt: None,
            last_save: Instant::now(),
            saved_at: t.step,
            started: t.step,
            signal: StopSignal::new(&p.train, p.published_model_dir()),
            stats: Stats {
                last_loss: f32::NAN,
                ..Stats::default()
            },
            summaries,
            guard: crate::train::divergence::DivergenceGuard::new(t.divergence),
        })
    }

    /// Server 0's global step.
    pub(super) fn completed(&self) -> u64 {
        self.completed
    }

    /// Server 0: the loss of the last batch whose push was applied.
    pub(super) fn last_loss(&self) -> f32 {
        self.stats.last_loss
    }

    /// A checkpoint was saved: serving may resume.
    pub(super) fn saved(&mut self) {
        self.last_save = Instant::now();
        self.saved_at = self.completed;
        if self.halt == Some(State::Pause) {
            self.halt = None;
        }
    }

    /// Answers the workers until every one of them has left (paused or
    /// done).
    pub(super) fn serve(&mut self, t: &mut Trainer) -> anyhow::Result<()> {
        let mut paused = BTreeSet::new();
        while self.done.len() + paused.len() < self.workers {
            let (from, bytes) = t.comm.receive_bytes(None);
            let request = wire::Request::decode(bytes.as_slice())
                .map_err(|e| anyhow::anyhow!("server {}: a malformed message from rank {from}: {e}", self.rank))?;
            match request.kind {
                Some(Kind::Pull(pull)) => {
                    let reply = self.pull(t, &pull);
                    t.comm.send_bytes(from, &reply.encode_to_vec());
                }
                Some(Kind::Push(push)) => self.push(t, from, push)?,
                Some(Kind::Idle(_)) => {
                    let mut reply = wire::PullReply::default();
                    reply.set_state(self.halting(t).unwrap_or(State::Go));
                    t.comm.send_bytes(from, &reply.encode_to_vec());
                }
                Some(Kind::Leave(leave)) => {
                    if leave.done {
                        self.done.insert(from);
                    } else {
                        paused.insert(from);
                    }
                }
                None => anyhow::bail!("server {}: an empty message from rank {from}", self.rank),
            }
        }
        Ok(())
    }

    /// Server 0: whether the workers are to pause or end now. After the
    /// ticket reaching a checkpoint's step (or time), the workers pause; no
    /// new ticket past num_steps or, once a batch has trained (as the
    /// synchronous loop looks after its first step), the stop signal.
    fn halting(&mut self, t: &Trainer) -> Option<State> {
        if self.halt.is_none() {
            let trained = self.completed > self.started;
            if self.target.is_some_and(|target| self.issued >= target) || trained && self.signal.found(self.completed) {
                self.halt = Some(State::End);
            } else if self.issued > self.saved_at && t.plan.train.checkpoints.due(self.issued, self.last_save) {
                self.halt = Some(State::Pause);
            }
        }
        self.halt
    }

    fn pull(&mut self, t: &Trainer, pull: &wire::Pull) -> wire::PullReply {
        let mut reply = wire::PullReply::default();
        if self.rank == 0 {
            if let Some(state) = self.halting(t) {
                reply.set_state(state);
                return reply;
            }
            reply.ticket = self.issued;
            self.pulled_at.insert(self.issued, self.completed);
            self.issued += 1;
        }
        reply.dense = t.model.params.values[self.dense.clone()].to_vec();
        reply.rows = t
            .embeddings
            .tables
            .iter()
            .zip(&pull.tables)
            .map(|(table, ids)| wire::Rows {
                values: ids.ids.iter().flat_map(|g| table.row(*g).iter().copied()).collect(),
            })
            .collect();
        reply
    }

    fn push(&mut self, t: &mut Trainer, from: usize, push: wire::Push) -> anyhow::Result<()> {
        if self.rank != 0 {
            return self.apply(t, &push, push.step);
        }
        let pulled_at = self
            .pulled_at
            .remove(&push.ticket)
            .ok_or_else(|| anyhow::anyhow!("server 0: rank {from} pushed step {} it never pulled", push.ticket))?;
        let staleness = self.completed - pulled_at;
        let step = self.completed;
        let applied = if !push.nonfinite.is_empty() {
            t.skip_nonfinite(&format!("{} (worker rank {from})", push.nonfinite), step)?;
            false
        } else {
            staleness <= self.max_staleness
        };
        let reply = wire::PushReply { applied, step };
        t.comm.send_bytes(from, &reply.encode_to_vec());
        self.completed += 1;
        if applied {
            self.apply(t, &push, step)?;
            self.stats.applied += 1;
            self.stats.last_loss = push.loss;
            self.guard.observe(step, push.loss)?;
            self.stats.staleness_sum += staleness;
            self.stats.max_staleness = self.stats.max_staleness.max(staleness);
        } else if push.nonfinite.is_empty() {
            self.stats.dropped += 1;
        }
        self.account(t, &push, staleness)
    }

    /// Applies this server's part of a push at global step `step`.
    fn apply(&mut self, t: &mut Trainer, push: &wire::Push, step: u64) -> anyhow::Result<()> {
        let optimizers = &t.plan.train.optimizers;
        t.dense.apply(
            &mut t.model.params,
            (&push.dense, self.dense.clone()),
            optimizers,
            (step, &t.frozen),
        );
        let row_grads: Vec<RowGrads> = t
            .embeddings
            .tables
            .iter()
            .zip(push.ids.iter().zip(&push.grads))
            .map(|(table, (ids, grads))| {
                let mut rg = RowGrads::default();
                for (id, g) in ids.ids.iter().zip(grads.values.chunks_exact(table.dim.max(1))) {
                    rg.add(*id, g);
                }
                rg
            })
            .collect();
        // Key-value tables count a push's keys as seen at its step (a key's
        // first pull, before its row exists, looks up the default).
        for (table, rg) in t.embeddings.tables.iter_mut().zip(&row_grads) {
            let mut keys = rg.rows.clone();
            keys.sort_unstable();
            table.admit(&keys, step);
        }
        let table = t
            .embeddings
            .apply(&row_grads, &t.plan.train.optimizers, (step, &t.frozen.tables), 1.0);
        Ok(t.check_updated(table, step)?)
    }

    /// Server 0's log lines and summaries, every log_step_count_steps and
    /// save_summary_steps global steps.
    fn account(&mut self, t: &Trainer, push: &wire::Push, staleness: u64) -> anyhow::Result<()> {
        let s = &mut self.stats;
        let now = Instant::now();
        let start = *s.window_start.get_or_insert(now);
        s.window_examples += push.examples;
        s.window_pushes += 1;
        s.window_loss += push.loss as f64;
        s.window_staleness += staleness;
        s.window_max_staleness = s.window_max_staleness.max(staleness);
        let p = &t.plan;
        let step = self.completed;
        let lr = p.train.optimizers[t.assign.dense].lr.at(step);
        let loss = s.window_loss / s.window_pushes.max(1) as f64;
        if step.is_multiple_of(p.train.log_step_count_steps.max(1) as u64) {
            let secs = now.duration_since(start).as_secs_f64().max(1e-9);
            let of = self.target.map(|t| format!("/{t}")).unwrap_or_default();
            log::info!(
                "step {step}{of} loss {loss:.5} lr {lr:.6} samples/s {:.0} staleness mean {:.1} max {} \
                 dropped {} (asynchronous)",
                s.window_examples as f64 / secs,
                s.window_staleness as f64 / s.window_pushes.max(1) as f64,
                s.window_max_staleness,
                s.dropped,
            );
            s.window_start = Some(now);
            s.window_examples = 0;
            s.window_loss = 0.0;
            s.window_pushes = 0;
            s.window_staleness = 0;
            s.window_max_staleness = 0;
        }
        if let Some(w) = self
            .summaries
            .as_mut()
            .filter(|_| step.is_multiple_of(p.train.save_summary_steps.max(1) as u64))
        {
            let (since, from) = *s.summary_start.get_or_insert((now, step.saturating_sub(1)));
            let steps_per_sec = (step - from) as f64 / now.duration_since(since).as_secs_f64().max(1e-9);
            w.scalars(
                step,
                &[
                    ("loss", push.loss as f64),
                    ("learning_rate", lr as f64),
                    ("global_step/sec", steps_per_sec),
                    ("staleness", staleness as f64),
                ],
            )?;
            s.summary_start = Some((now, step));
        }
        Ok(())
    }

    /// Server 0's account of the whole run, at its end.
    pub(super) fn report(&self) {
        if self.rank != 0 {
            return;
        }
        let s = &self.stats;
        log::info!(
            "asynchronous updates: {} applied, {} dropped as staler than {} steps; staleness mean {:.2} max {}",
            s.applied,
            s.dropped,
            self.max_staleness,
            s.staleness_sum as f64 / s.applied.max(1) as f64,
            s.max_staleness
        );
    }
}
