//! Training: the trainer state (tables, dense model, optimizer slots, global
//! step), its checkpoints, evaluation, and the step loop.

pub mod dense;
pub mod device_dense;
pub mod device_tables;
pub mod divergence;
pub mod freeze;
pub mod incr;
pub mod ps;
pub mod run;
pub mod state;
pub mod step;
pub mod stream;

use std::rc::Rc;

use anyhow::Context;

use crate::config::data_plan::InputFormat;
use crate::config::train_plan::Strategy;
use crate::config::typed::TrainingPlan;
use crate::config::ConfigError;
use crate::data::sampler::NegativeSampler;
use crate::data::{expand_paths, Prefetch, StreamSpec};
use crate::dist::{Communicator, Single};
use crate::embedding::{Collection, Sharding, Table};
use crate::features::{Batch, Encoder};
use crate::metrics::EvalState;
use crate::model::Model;
use crate::optim::Assignment;

pub use step::StepStats;

/// Seed of every random choice (initialisation, shuffling, dropout), so two
/// runs of one config train identically.
pub const SEED: u64 = crate::config::train_plan::DEFAULT_SEED;

pub struct Trainer {
    pub plan: TrainingPlan,
    pub enc: Encoder,
    pub model: Model,
    /// The embedding tables and how they are placed on the ranks.
    pub embeddings: Collection,
    /// The dense parameters' optimizer state (the parameters are the model's).
    pub dense: dense::Dense,
    pub assign: Assignment,
    /// Global step: batches trained so far.
    pub step: u64,
    /// Batches with a non-finite loss or gradient that may be skipped (their
    /// update not applied) before training stops; 0 stops at the first.
    pub skip_nonfinite_batches: u64,
    /// Batches skipped so far in this run.
    pub skipped_batches: u64,
    /// `--divergence_factor` and `--stop_on_divergence`.
    pub divergence: divergence::DivergencePolicy,
    pub seed: u64,
    /// The other ranks of a distributed job (a single process alone).
    pub comm: Rc<dyn Communicator>,
    /// Draws the negatives appended to training and evaluation batches.
    pub sampler: Option<NegativeSampler>,
    /// `train_config.freeze_gradient`'s variables, which are not trained.
    pub frozen: freeze::Frozen,
    /// Under asynchronous training on several ranks, which ranks serve and
    /// which work.
    pub ps: Option<ps::Roles>,
    /// Tests and benches only: (worker, delay) slows that worker (a rank,
    /// or under asynchronous training an index among the workers) down by
    /// sleeping after each of its steps.
    pub straggler: Option<(usize, std::time::Duration)>,
    /// A remote model_dir's local copy (`plan.model_dir` is the copy):
    /// each checkpoint is published to it as it is saved.
    pub mirror: Option<std::sync::Arc<crate::storage::mirror::Mirror>>,
    /// `incr_save_config`'s updates, once the run has started them.
    pub incr: Option<incr::IncrUpdates>,
    /// This rank's place in a Kafka input: the next offset of each of its
    /// partitions after the batches it has trained.
    pub stream_position: Option<crate::data::kafka::Position>,
    /// The stream offsets of the checkpoint this run resumed from.
    pub resumed_stream: Option<crate::checkpoint::StreamOffsets>,
    /// Where trained rows are traced (see `stream::RowTrace`).
    trace: Option<stream::RowTrace>,
    /// Where each step's phases are timed (`set_profile`), when anywhere.
    profile: Option<std::sync::Arc<crate::profile::Profile>>,
    /// The dense parameters and their optimizer slots, while they are lent
    /// to the executor's device between steps (`lend_to_device`): the model's
    /// `params.values` and `dense.slots` are empty meanwhile, until
    /// `settle_device` reads them back.
    device_dense: Option<device_dense::DeviceDense>,
    /// The tables kept on that device meanwhile (`lend_to_device`), whose
    /// host rows are empty until `settle_device`.
    device_tables: Option<device_tables::DeviceTables>,
    /// `--device_table_rows`: tables of at most this many rows may be kept
    /// on the executor's device (0: none).
    pub device_table_rows: usize,
}

impl Trainer {
    /// A trainer in a single process.
    pub fn new(plan: TrainingPlan) -> anyhow::Result<Self> {
        Self::with_comm(plan, Rc::new(Single))
    }

    /// A trainer that is one rank of `comm`; train_distribute decides how
    /// the ranks split the work.
    pub fn with_comm(plan: TrainingPlan, comm: Rc<dyn Communicator>) -> anyhow::Result<Self> {
        Self::with_roles(plan, comm, &ps::PsOptions::default())
    }

    /// `with_comm`, with the command line's choices for asynchronous
    /// training.
    pub fn with_roles(
        mut plan: TrainingPlan,
        comm: Rc<dyn Communicator>,
        ps_options: &ps::PsOptions,
    ) -> anyhow::Result<Self> {
        // The checkpoint the run resumes from (EasyRec's or ours), else the
        // one it fine-tunes from, decides whose names a backbone's
        // variables carry.
        let resumes = crate::checkpoint::latest(&plan.model_dir)?.is_some()
            || crate::checkpoint::tensorflow::find(&plan.model_dir).is_some();
        let from = match resumes {
            true => Some(plan.model_dir.clone()),
            false => plan
                .train
                .fine_tune
                .as_ref()
                .and_then(|f| crate::checkpoint::resolve(&f.checkpoint).ok()),
        };
        if let Some(dir) = from {
            crate::model::names::follow_checkpoint_release(&mut plan.model.arch, &dir)?;
        }
        let mut roles = None;
        let sharding = match (plan.train.strategy, comm.size()) {
            (_, 1) => Sharding::Replicated,
            (Strategy::EmbeddingParallel, size) => Sharding::row_wise(comm.rank(), size),
            (Strategy::DataParallel, _) => Sharding::Replicated,
            // EasyRec's NoStrategy on several workers is parameter-server
            // training; synchronous (sync_replicas), each global step
            // averages one batch's gradients from every worker, which is
            // what the embedding-parallel step computes, its tables
            // sharded across the ranks as a parameter server's are.
            (Strategy::Single, size) if plan.train.asynchronous.is_none() => {
                log::info!(
                    "NoStrategy on {size} workers with sync_replicas: synchronous training, \
                     each step one batch from every worker, tables sharded across the ranks"
                );
                Sharding::row_wise(comm.rank(), size)
            }
            // Asynchronous: server ranks hold the tables and the dense
            // parameters, worker ranks train (see `ps`).
            (Strategy::Single, size) => {
                let r = ps::Roles::new(ps_options, size)?;
                let owners = r.servers;
                roles = Some(r);
                Sharding::RowWise {
                    rank: comm.rank(),
                    size,
                    owners,
                }
            }
        };
        let ps_flags = ps_options.servers.is_some() || ps_options.max_staleness.is_some();
        if roles.is_none() && ps_flags && comm.rank() == 0 {
            log::warn!(
                "--num_ps and --max_staleness apply to asynchronous training on several ranks only \
                 (sync_replicas: false or PSStrategy under mpirun); this run has no parameter servers"
            );
        }
        if roles.is_some() && plan.train.incr_save.is_some() {
            return Err(ConfigError::unsupported(
                "train_config.incr_save_config",
                "incremental updates under asynchronous parameter servers",
            )
            .into());
        }
        if comm.size() > 1 && plan.model.tasks.iter().any(|t| t.summed) {
            return Err(ConfigError::unsupported(
                "model_config.esmm",
                "ESMM's losses summed over the batch on several ranks",
            )
            .into());
        }
        let shards = sharding.shard().map_or(1, |(_, count)| count);
        plan.memory.check_here(shards)?;
        let uid = plan.model.gauc_uid_fields().next();
        let enc = Encoder::new(&plan, uid).map_err(ConfigError::unbuildable)?;
        let seed = plan.train.seed;
        let sampled = plan.data.negative_sampling.is_some();
        let model = Model::new(&plan.model, &plan.features, sampled, &enc, seed).map_err(ConfigError::unbuildable)?;
        let model_kind = plan.model.kind;
        let assign = Assignment::new(model_kind, plan.train.optimizers.len());
        let tables = model
            .tables
            .iter()
            .map(|t| {
                let opt = if t.wide { assign.wide_tables } else { assign.deep_tables };
                let optimizer = (opt, &plan.train.optimizers[opt].kind);
                match t.key_value {
                    Some(kv) => Table::key_value((&t.name, t.dim), kv, (&t.init, seed), optimizer, sharding),
                    None => Table::new((&t.name, t.rows, t.dim), &t.init, seed, optimizer, sharding),
                }
            })
            .collect();
        let dense = dense::Dense::new(&plan.train.optimizers, assign.dense, model.params.values.len());
        let embeddings = Collection::new(tables, sharding);
        let sampler = plan
            .data
            .negative_sampling
            .as_ref()
            .map(|s| NegativeSampler::new(s, &enc.projection))
            .transpose()?;
        let frozen = freeze::Frozen::of(&plan.train.freeze_gradient, &model.params.specs, &model.table_variables);
        let trace = stream::RowTrace::from_env(comm.rank())?;
        Ok(Trainer {
            frozen,
            plan,
            enc,
            model,
            embeddings,
            dense,
            assign,
            step: 0,
            skip_nonfinite_batches: 0,
            divergence: divergence::DivergencePolicy::default(),
            skipped_batches: 0,
            seed,
            comm,
            sampler,
            ps: roles,
            straggler: None,
            mirror: None,
            incr: None,
            stream_position: None,
            resumed_stream: None,
            trace,
            profile: None,
            device_dense: None,
            device_tables: None,
            device_table_rows: 0,
        })
    }

    /// Lends the dense parameters and their optimizer slots to the model's
    /// executor's device, where it keeps them between steps (a GPU's: see
    /// `Executor::resident_device`), unless they are there already. Not
    /// under asynchronous parameter servers, whose workers take the
    /// parameters from the servers each step, nor for a model without any.
    /// With `device_table_rows`, the tables it allows go there too
    /// (`device_tables`).
    fn lend_to_device(&mut self) {
        if self.device_dense.is_some() || self.ps.is_some() || self.model.params.is_empty() {
            return;
        }
        let Some(device) = self.model.exec.resident_device() else {
            return;
        };
        let resident = crate::model::Resident::upload(&device, &self.model.params, &self.dense.slots.slots);
        self.model.params.values = Vec::new();
        self.dense.slots.slots.iter_mut().for_each(|s| *s = Vec::new());
        let d = device_dense::DeviceDense::new(resident, &self.model, &self.plan.model, &self.frozen);
        self.device_dense = Some(d);
        let keep = self.tables_kept_on_device();
        self.device_tables = device_tables::DeviceTables::lend(&mut self.embeddings, &keep, &device);
    }

    /// Per table, whether `lend_to_device` keeps it on the device: within
    /// `device_table_rows`, not frozen, and (embedding_regularization's
    /// gradient is not weighted for a sum over ranks) on one rank or
    /// without that regularizer.
    fn tables_kept_on_device(&self) -> Vec<bool> {
        let over_ranks = self.comm.size() > 1 && self.plan.model.embedding_regularization > 0.0;
        (self.embeddings.tables.iter().enumerate())
            .map(|(i, t)| {
                self.device_table_rows > 0
                    && !over_ranks
                    && !self.frozen.tables.get(i).copied().unwrap_or(false)
                    && device_tables::keepable(t, self.device_table_rows)
            })
            .collect()
    }

    /// Reads the dense parameters and their slots back from the device they
    /// are lent to, if they are, and the tables kept there: before anything
    /// reads them on the host (a checkpoint, an evaluation, an export, an
    /// incremental update, a restore). The next step lends them again.
    pub fn settle_device(&mut self) {
        if let Some(d) = self.device_dense.take() {
            let (params, slots) = d.resident.download();
            self.model.params.values = params;
            self.dense.slots.slots = slots;
        }
        if let Some(t) = self.device_tables.take() {
            t.settle(&mut self.embeddings);
        }
    }

    /// Times each training step's phases into `profile` from now on, and
    /// the model's ops too when it runs on the CPU executor (another
    /// executor's ops are timed as one phase).
    pub fn set_profile(&mut self, profile: std::sync::Arc<crate::profile::Profile>) {
        if self.model.exec.name() == "cpu" {
            let exec = crate::model::exec::cpu::Cpu::profiled(profile.clone());
            self.model.exec = std::sync::Arc::new(exec);
        }
        self.profile = Some(profile);
    }

    /// A stream of this rank's encoded batches over `paths`; batch_size is
    /// per rank, as in EasyRec. For training, when there are at least as many
    /// splits (CSV files, Parquet row groups) as ranks, each rank reads its
    /// own share of them, dealt round-robin, and the ranks stop together when
    /// the first runs out (see `run`). Otherwise, and for evaluation, every
    /// rank reads the same global batches of `batch_size * ranks` rows and
    /// keeps its contiguous slice: the batches one process would see.
    pub fn stream(&self, paths: &[String], train: bool, skip_batches: u64) -> anyhow::Result<Prefetch<Batch>> {
        let files = expand_paths(paths)?;
        if files.is_empty() {
            anyhow::bail!("no input files given");
        }
        let p = &self.plan;
        let epochs = if !train {
            Some(1)
        } else if p.data.num_epochs > 0 {
            Some(p.data.num_epochs)
        } else if matches!(
            p.data.format,
            InputFormat::Csv { .. } | InputFormat::Rtp { .. } | InputFormat::CriteoBinary { .. }
        ) && p.train.num_steps.is_some()
        {
            None
        } else {
            Some(1)
        };
        let mut spec = StreamSpec {
            files,
            format: p.data.format.clone(),
            fields: p.data.fields.clone(),
            projection: self.enc.projection.clone(),
            batch_size: p.data.batch_size.max(1) as usize * self.readers(train).1,
            epochs,
            shuffle: train && p.data.shuffle,
            shuffle_buffer: p.data.shuffle_buffer_size,
            seed: self.seed,
            shard: (0, 1),
            skip_batches,
            max_rows: if train { 0 } else { p.eval.num_examples },
        };
        let (rank, size) = self.readers(train);
        let mut slice = (rank, size);
        if train && size > 1 {
            let splits = spec.splits()?.len();
            if splits >= size {
                spec.batch_size = p.data.batch_size.max(1) as usize;
                spec.shard = (rank, size);
                slice = (0, 1);
            }
            if rank == 0 {
                log::info!(
                    "{splits} input splits over {size} {}: {}",
                    if self.ps.is_some() { "workers" } else { "ranks" },
                    if slice == (0, 1) {
                        "each rank reads its own share"
                    } else {
                        "each rank takes its slice of every global batch"
                    }
                );
            }
        }
        Ok(Prefetch::start(
            spec,
            p.data.prefetch_size.min(8),
            self.encoder(train, rank, skip_batches, slice),
        ))
    }

    /// What turns a raw batch into an encoded one on the reader thread:
    /// this rank's `slice` of it, with the negatives the sampler draws (each
    /// rank its own for its slice, seeded by the batch's place in the
    /// stream from `first_index` on, so a resumed run draws as one that
    /// never stopped).
    fn encoder(
        &self,
        train: bool,
        rank: usize,
        first_index: u64,
        slice: (usize, usize),
    ) -> impl FnMut(crate::data::RawBatch) -> anyhow::Result<Batch> + Send + 'static {
        let enc = self.enc.clone();
        let p = &self.plan;
        let sampling = self
            .sampler
            .clone()
            .zip(p.data.negative_sampling.as_ref())
            .map(|(s, spec)| {
                let n = if train { spec.num_sample } else { spec.num_eval_sample };
                (s, n as usize)
            });
        let seed = self.seed ^ crate::util::mix64((rank as u64) << 1 | u64::from(train));
        let mut index = first_index;
        move |raw| {
            let mut raw = raw.part(slice.0, slice.1);
            let appended = match &sampling {
                Some((s, n)) => {
                    let mut rng = crate::util::Rng::new(seed ^ crate::util::mix64(index));
                    index += 1;
                    s.append(&mut raw, &enc.projection, *n, &mut rng)?
                }
                None => Default::default(),
            };
            let mut batch = enc.encode(&raw)?;
            batch.mark_sampled(appended.rows);
            batch.hard_negatives = appended.hard;
            Ok(batch)
        }
    }

    /// This rank's evaluation batches: of `paths`, or, when none are given,
    /// of the config's `kafka_eval_input`.
    pub fn eval_stream(&self, paths: &[String]) -> anyhow::Result<Box<dyn Iterator<Item = anyhow::Result<Batch>>>> {
        Ok(match &self.plan.data.eval_kafka {
            Some(k) if paths.is_empty() => Box::new(self.topic_stream(k, false)?.filter_map(|fed| match fed {
                Ok(f) => f.batch.map(Ok),
                Err(e) => Some(Err(e)),
            })),
            _ => Box::new(self.stream(paths, false, 0)?),
        })
    }

    /// The straggler's sleep after a step of worker `worker`.
    fn straggle(&self, worker: usize) {
        if let Some((_, delay)) = self.straggler.filter(|(w, _)| *w == worker) {
            std::thread::sleep(delay);
        }
    }

    /// (index, count) of this rank among the ranks that read `train`ing
    /// (or evaluation) input: every rank, except that under asynchronous
    /// training only the workers read training data.
    fn readers(&self, train: bool) -> (usize, usize) {
        match &self.ps {
            Some(roles) if train => {
                let w = roles
                    .worker_index(self.comm.rank())
                    .expect("only workers read training input");
                (w, roles.workers)
            }
            _ => (self.comm.rank(), self.comm.size()),
        }
    }

    /// Predictions, labels and loss of each task (in `plan.model.tasks` order)
    /// over a whole input.
    pub fn evaluate(&self, paths: &[String]) -> anyhow::Result<Vec<EvalState>> {
        let tasks = &self.plan.model.tasks;
        // The tasks' states, then one per graph penalty (its batch losses)
        // and one per graph summary (its batch values).
        let graph = &self.model.graph;
        let mut st = vec![EvalState::default(); tasks.len() + graph.penalties.len() + graph.summaries.len()];
        for batch in self.eval_stream(paths)? {
            let batch = batch.context("reading evaluation data")?;
            let inputs = self.group_inputs(&batch);
            let (evals, penalties) = self
                .model
                .evaluate_batch(&inputs, crate::model::Targets::of(&batch), tasks);
            for ((e, t), ev) in st.iter_mut().zip(tasks).zip(evals) {
                // A masked task counts the rows its mask label marks.
                let mask = t.masked_by.map(|m| batch.labels[m].as_slice());
                e.merge(EvalState {
                    preds: kept(&ev.scores.scores, mask),
                    labels: kept(&batch.labels[t.label], mask),
                    uids: kept(batch.uids.as_deref().unwrap_or_default(), mask),
                    ranks: ev.ranks,
                    interests: ev.interests,
                    loss_sum: ev.loss * batch.examples() as f64,
                    batch_losses: vec![ev.loss],
                });
            }
            for (e, l) in st[tasks.len()..].iter_mut().zip(penalties) {
                e.merge(EvalState {
                    loss_sum: l * batch.examples() as f64,
                    batch_losses: vec![l],
                    ..Default::default()
                });
            }
        }
        if self.comm.size() > 1 {
            // Every rank ends with all ranks' predictions, for exact metrics.
            for e in &mut st {
                let mut loss = [e.loss_sum];
                self.comm.all_reduce_sum(&mut loss);
                let bits: Vec<u64> = e.batch_losses.iter().map(|x| x.to_bits()).collect();
                let ranks = |r: &[[u32; 3]]| -> Vec<[u32; 3]> {
                    self.comm
                        .all_gather_u64(&r.iter().flatten().map(|&r| u64::from(r)).collect::<Vec<_>>())
                        .concat()
                        .chunks_exact(3)
                        .map(|r| [r[0] as u32, r[1] as u32, r[2] as u32])
                        .collect()
                };
                let hits: Vec<u64> = e.interests.hard_hits.iter().map(|h| u64::from(*h)).collect();
                *e = EvalState {
                    preds: self.comm.all_gather_f32(&e.preds).concat(),
                    labels: self.comm.all_gather_f32(&e.labels).concat(),
                    uids: self.comm.all_gather_u64(&e.uids).concat(),
                    ranks: ranks(&e.ranks),
                    interests: crate::model::Interests {
                        ranks: ranks(&e.interests.ranks),
                        hard_hits: self
                            .comm
                            .all_gather_u64(&hits)
                            .concat()
                            .into_iter()
                            .map(|h| h == 1)
                            .collect(),
                    },
                    loss_sum: loss[0],
                    batch_losses: self
                        .comm
                        .all_gather_u64(&bits)
                        .concat()
                        .into_iter()
                        .map(f64::from_bits)
                        .collect(),
                };
            }
        }
        if st.first().is_some_and(|e| e.preds.is_empty()) {
            return Err(crate::data::DataError::Empty {
                purpose: "evaluation",
                paths: match &self.plan.data.eval_kafka {
                    Some(k) if paths.is_empty() => vec![format!(
                        "Kafka topic `{}` at {}, from its start offsets to its end",
                        k.topic,
                        k.servers.join(",")
                    )],
                    _ => paths.to_vec(),
                },
            }
            .into());
        }
        Ok(st)
    }
}

/// The values of `v` whose row `mask` marks (> 0), all without a mask.
fn kept<T: Copy>(v: &[T], mask: Option<&[f32]>) -> Vec<T> {
    match mask {
        Some(m) => v.iter().zip(m).filter(|(_, y)| **y > 0.0).map(|(x, _)| *x).collect(),
        None => v.to_vec(),
    }
}
