//! A worker rank: reads its share of the input and, batch by batch, pulls
//! what the batch needs from the servers, computes the loss and gradients
//! on the CPU executor and pushes them back, without waiting for the other
//! workers.

use anyhow::Context;
use prost::Message;

use super::wire::{self, pull_reply::State, request::Kind};
use super::Roles;
use crate::embedding::{FetchedRows, RowGrads};
use crate::features::Batch;
use crate::model::graph::update_bn_buffers;
use crate::train::dense::Exchange;
use crate::train::stream::{Fed, TrainStream};
use crate::train::Trainer;

pub(super) struct Worker {
    pub(super) index: usize,
    roles: Roles,
    stream: TrainStream,
    /// A batch read before a pause, trained after it.
    pending: Option<Fed>,
    /// The rows of the batch being trained, from its pull.
    fetched: Vec<FetchedRows>,
    done: bool,
    pub(super) samples: u64,
}

/// A batch's gradients, clipped, ready to go to the servers.
struct Computed {
    loss: f32,
    dense: Vec<f32>,
    rows: Vec<RowGrads>,
    /// Why the batch has no gradients: its loss or gradient is not finite.
    nonfinite: Option<String>,
}

fn request(kind: Kind) -> Vec<u8> {
    wire::Request { kind: Some(kind) }.encode_to_vec()
}

impl Worker {
    pub(super) fn new(t: &Trainer, roles: &Roles, index: usize) -> anyhow::Result<Self> {
        // A resumed job's global step counts every worker's batches.
        let skip = t.step / roles.workers as u64;
        Ok(Worker {
            index,
            roles: roles.clone(),
            stream: t.train_stream(skip)?,
            pending: None,
            fetched: Vec::new(),
            done: false,
            samples: 0,
        })
    }

    /// Trains batches until server 0 pauses or ends training, or the input
    /// runs out; returns whether this worker is done for good.
    pub(super) fn work(&mut self, t: &mut Trainer) -> anyhow::Result<bool> {
        while !self.done {
            let fed = match self.pending.take() {
                Some(f) => f,
                None => match self.stream.next() {
                    Some(f) => f.context("reading training data")?,
                    None => {
                        self.leave(t, true);
                        break;
                    }
                },
            };
            // A batch asks the servers for its rows; a quiet topic (no
            // batch) asks server 0 only whether to go on waiting.
            let state = match fed.batch.as_ref() {
                None => self.idle(t)?,
                Some(b) if b.examples() == 0 => continue,
                Some(b) => self.pull(t, b)?,
            };
            match state {
                State::Go => {}
                State::Pause => {
                    if fed.batch.is_some() {
                        self.pending = Some(fed);
                    }
                    self.leave(t, false);
                    return Ok(false);
                }
                State::End => {
                    self.leave(t, true);
                    break;
                }
            }
            let Some(batch) = fed.batch.as_ref() else {
                continue;
            };
            let computed = self.compute(t, batch);
            self.push(t, computed, batch.examples() as u64)?;
            self.samples += batch.size as u64;
            t.fed(&fed)?;
            t.straggle(self.index);
        }
        Ok(true)
    }

    /// Tells server 0 this worker's topic is quiet; its answer says
    /// whether to go on waiting, pause or end.
    fn idle(&mut self, t: &mut Trainer) -> anyhow::Result<State> {
        t.comm.send_bytes(0, &request(Kind::Idle(wire::Idle {})));
        let (_, bytes) = t.comm.receive_bytes(Some(0));
        let reply = wire::PullReply::decode(bytes.as_slice()).context("a malformed reply from server 0")?;
        Ok(reply.state())
    }

    fn leave(&mut self, t: &Trainer, done: bool) {
        let msg = request(Kind::Leave(wire::Leave { done }));
        for s in 0..self.roles.servers {
            t.comm.send_bytes(s, &msg);
        }
        self.done = done;
    }

    /// Asks every server for its rows of the batch and its dense slice;
    /// on GO, puts them in place (the trainer's dense parameters, its step
    /// the batch's ticket) and returns GO with the rows kept for `compute`.
    fn pull(&mut self, t: &mut Trainer, batch: &Batch) -> anyhow::Result<State> {
        // wanted[server][table]: the ids that server holds.
        let wanted = t.embeddings.ids_by_owner(&t.model.groups, batch, self.roles.servers);
        for (s, tables) in wanted.iter().enumerate() {
            let pull = wire::Pull {
                tables: tables.iter().map(|ids| wire::Ids { ids: ids.clone() }).collect(),
            };
            t.comm.send_bytes(s, &request(Kind::Pull(pull)));
        }
        let mut state = State::Go;
        let n = t.model.params.values.len();
        let mut fetched: Vec<FetchedRows> = t
            .embeddings
            .tables
            .iter()
            .map(|table| FetchedRows::of_dim(table.dim))
            .collect();
        for (s, tables) in wanted.iter().enumerate() {
            let (_, bytes) = t.comm.receive_bytes(Some(s));
            let reply = wire::PullReply::decode(bytes.as_slice())
                .with_context(|| format!("a malformed reply from server {s}"))?;
            if s == 0 {
                state = reply.state();
                if state != State::Go {
                    continue; // the other servers' replies are read and left
                }
                t.step = reply.ticket;
            }
            if state != State::Go {
                continue;
            }
            let range = self.roles.dense_range(s, n);
            anyhow::ensure!(
                reply.dense.len() == range.len() && reply.rows.len() == tables.len(),
                "server {s} answered with the wrong sizes"
            );
            t.model.params.values[range].copy_from_slice(&reply.dense);
            for ((f, ids), rows) in fetched.iter_mut().zip(tables).zip(&reply.rows) {
                f.extend(ids, &rows.values);
            }
        }
        self.fetched = fetched;
        Ok(state)
    }

    /// The batch's loss and its gradients, regularized and clipped as the
    /// synchronous step does (`Trainer::gradients`), over this worker's
    /// batch alone; its batch-norm statistics go into this worker's moving
    /// averages.
    fn compute(&mut self, t: &mut Trainer, batch: &Batch) -> Computed {
        let inputs = t.embeddings.forward_from(&t.model.groups, batch, Some(&self.fetched));
        match t.gradients(batch, &inputs, Exchange::Local) {
            Ok(mut g) => {
                if g.scale != 1.0 {
                    g.rows
                        .iter_mut()
                        .for_each(|r| r.grads.iter_mut().for_each(|x| *x *= g.scale));
                }
                update_bn_buffers(&mut t.model.buffers, g.bn_stats);
                Computed {
                    loss: g.loss + g.reg as f32,
                    dense: g.dense.into_host(),
                    rows: g.rows,
                    nonfinite: None,
                }
            }
            Err(what) => Computed {
                loss: f32::NAN,
                dense: Vec::new(),
                rows: Vec::new(),
                nonfinite: Some(what),
            },
        }
    }

    /// Sends server 0 its part and, if it applies the push, the other
    /// servers theirs, at the step it was applied at.
    fn push(&mut self, t: &Trainer, c: Computed, examples: u64) -> anyhow::Result<()> {
        let n = t.model.params.values.len();
        let (ids, grads) = t.embeddings.grads_by_owner(&c.rows, self.roles.servers);
        let mut parts = ids
            .into_iter()
            .zip(grads)
            .enumerate()
            .map(|(s, (ids, grads))| wire::Push {
                ticket: t.step,
                loss: c.loss,
                examples,
                nonfinite: c.nonfinite.clone().unwrap_or_default(),
                dense: if c.nonfinite.is_some() {
                    Vec::new()
                } else {
                    c.dense[self.roles.dense_range(s, n)].to_vec()
                },
                ids: ids.into_iter().map(|ids| wire::Ids { ids }).collect(),
                grads: grads.into_iter().map(|values| wire::Rows { values }).collect(),
                ..Default::default()
            });
        let first = parts.next().expect("at least one server");
        t.comm.send_bytes(0, &request(Kind::Push(first)));
        let (_, bytes) = t.comm.receive_bytes(Some(0));
        let reply = wire::PushReply::decode(bytes.as_slice()).context("a malformed reply from server 0")?;
        if reply.applied {
            for (s, mut part) in parts.enumerate() {
                part.step = reply.step;
                t.comm.send_bytes(s + 1, &request(Kind::Push(part)));
            }
        }
        Ok(())
    }
}
