//! The step loop: stop conditions, logging, progress bar, checkpoints and
//! the evaluation after training.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::{StepStats, Trainer};
use crate::checkpoint;
use crate::config::export_plan::EarlyStop;
use crate::embedding::{KeyValue, Storage};
use crate::summary::SummaryWriter;

/// How often the chief looks for the stop signal (EasyRec's hook: 10 s).
const STOP_SIGNAL_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The chief's watch for `enable_oss_stop_signal`'s file: looked for at
/// the first call and then every STOP_SIGNAL_EVERY, as EasyRec's hook does.
pub(super) struct StopSignal {
    /// The file, when the config enables the signal.
    path: Option<PathBuf>,
    checked: Option<Instant>,
    /// `train_config.dead_line` (Unix seconds).
    dead_line: Option<i64>,
}

impl StopSignal {
    /// The watch `train` asks for, over `model_dir`.
    pub(super) fn new(train: &crate::config::train_plan::TrainPlan, model_dir: &std::path::Path) -> Self {
        StopSignal {
            path: train
                .stop_signal
                .then(|| crate::storage::join(model_dir, crate::config::train_plan::STOP_SIGNAL)),
            checked: None,
            dead_line: train.dead_line,
        }
    }

    /// Whether the signal is there (looking if it is time to), logged with
    /// the global step `step` when found.
    pub(super) fn found(&mut self, step: u64) -> bool {
        if let Some(d) = self.dead_line.filter(|d| chrono::Utc::now().timestamp() > *d) {
            log::info!("train_config.dead_line (Unix time {d}) passed at step {step}: training ends here");
            self.dead_line = None;
            return true;
        }
        let Some(path) = &self.path else {
            return false;
        };
        if self.checked.is_some_and(|t| t.elapsed() < STOP_SIGNAL_EVERY) {
            return false;
        }
        self.checked = Some(Instant::now());
        // On a remote model_dir (OSS, EasyRec's case) the file is looked
        // for there; a failed lookup is no signal.
        let found = if crate::storage::is_remote(path) {
            match crate::storage::object(path).and_then(|o| o.size()) {
                Ok(size) => size.is_some(),
                Err(e) => {
                    log::warn!("cannot look for the stop signal: {e}");
                    false
                }
            }
        } else {
            path.exists()
        };
        if found {
            log::info!(
                "stop signal {} found at step {step}: training ends here",
                path.display()
            );
        }
        found
    }
}

/// See `Trainer::run_with`.
pub type AfterEval<'a> = dyn FnMut(&Path, &[(String, f64)], bool) -> anyhow::Result<()> + 'a;

/// How a training run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub steps: u64,
    pub last_loss: f32,
    /// Samples per second of the whole job (every rank's together).
    pub samples_per_sec: f64,
    pub metrics: Vec<(String, f64)>,
}

impl Trainer {
    /// Trains until num_steps (the global step to stop at) or the end of the
    /// data, saving checkpoints on the configured cadence and at the end.
    pub fn run(&mut self) -> anyhow::Result<RunSummary> {
        self.run_with(&mut |_, _, _| Ok(()))
    }

    /// `run`, calling `after_eval(checkpoint, metrics, last)` after
    /// each evaluation of a saved checkpoint and once at the end (`last`,
    /// with empty metrics when there is no evaluation data): the exporters.
    pub fn run_with(&mut self, after_eval: &mut AfterEval) -> anyhow::Result<RunSummary> {
        if self.ps.is_some() {
            return self.run_async(after_eval);
        }
        let start_step = self.step;
        let p = self.plan.clone();
        let target = p.train.num_steps.map(u64::from);
        self.log_banner(target);
        self.start_incr_updates()?;
        if target.is_some_and(|t| self.step >= t) {
            log::info!("global step {} already reached num_steps; nothing to train", self.step);
        }
        let lead = self.comm.rank() == 0;
        let bar = (lead && std::io::stderr().is_terminal()).then(|| progress_bar(target, self.step));
        crate::logging::set_bar(bar.clone());
        let mut stream = self.train_stream(self.step)?;
        // A batch read while another rank's topic was quiet, trained next.
        let mut held: Option<super::stream::Fed> = None;
        let t0 = Instant::now();
        let mut window = (Instant::now(), 0u64);
        let mut samples = 0u64;
        let mut last = StepStats {
            loss: f32::NAN,
            reg_loss: f32::NAN,
            grad_norm: f32::NAN,
            skipped: true,
        };
        let mut last_save = (Instant::now(), self.step);
        let mut evals = Evaluations::default();
        let mut summaries = if p.train.save_summary_steps > 0 && lead {
            Some(SummaryWriter::create(&p.model_dir)?)
        } else {
            None
        };
        let mut summary_window = (Instant::now(), self.step);
        // The stop signal: looked for by the chief after each step.
        let mut signal = StopSignal::new(&p.train, p.published_model_dir());
        let mut signalled = false;
        let mut guard = super::divergence::DivergenceGuard::new(self.divergence);
        loop {
            if target.is_some_and(|t| self.step >= t) {
                break;
            }
            // Ranks reading their own shares agree to stop when the first
            // runs out (or the chief saw the stop signal), so no rank waits
            // in a collective for the others.
            let next = match held.take() {
                Some(fed) => Some(Ok(fed)),
                None => stream.next(),
            };
            let quiet = matches!(&next, Some(Ok(f)) if f.batch.is_none());
            let mut stop = [
                f64::from(u8::from(next.is_none() || signalled)),
                f64::from(u8::from(quiet)),
            ];
            self.comm.all_reduce_sum(&mut stop);
            let Some(fed) = next.filter(|_| stop[0] == 0.0) else {
                break;
            };
            let fed = fed.context("reading training data")?;
            let Some(batch) = fed.batch.as_ref().filter(|_| stop[1] == 0.0) else {
                // A rank's topic is quiet: no rank steps (a rank with a
                // batch keeps it); the stop conditions are looked at.
                if fed.batch.is_some() {
                    held = Some(fed);
                }
                if lead && !signalled {
                    signalled = signal.found(self.step);
                }
                continue;
            };
            let lr = p.train.optimizers[self.assign.dense].lr.at(self.step);
            let step_stats = self.train_step(batch)?;
            self.fed(&fed)?;
            let save_due = p.train.checkpoints.due(self.step, last_save.0);
            if save_due && self.incr.is_some() {
                // The checkpoint's steps_to_live evictions go into this
                // step's incremental update, so both hold the same keys.
                self.embeddings
                    .evict_stale(self.step, &*self.comm, &self.model.table_variables);
            }
            self.incr_after_step()?;
            self.straggle(self.comm.rank());
            if lead && !signalled {
                signalled = signal.found(self.step);
            }
            samples += batch.size as u64;
            window.1 += batch.size as u64;
            // A skipped batch has no loss: logs and summaries show the last
            // trained one's.
            if !step_stats.skipped {
                last = step_stats;
                guard.observe(self.step, step_stats.loss)?;
            }
            let st = last;
            if let Some(b) = &bar {
                b.set_position(self.step);
                b.set_message(format!("loss {:.4}", st.loss));
            }
            if self.step.is_multiple_of(p.train.log_step_count_steps as u64) {
                // Every rank is at this step: the job's rate is one sum.
                let mut job = [window.1 as f64];
                self.comm.all_reduce_sum(&mut job);
                let rate = job[0] / window.0.elapsed().as_secs_f64().max(1e-9);
                let elapsed = t0.elapsed().as_secs_f64();
                let of = target.map(|t| format!("/{t}")).unwrap_or_default();
                let eta = target
                    .map(|t| {
                        let per_step = elapsed / (self.step - start_step).max(1) as f64;
                        format!(
                            " eta {}",
                            crate::logging::hms(per_step * t.saturating_sub(self.step) as f64)
                        )
                    })
                    .unwrap_or_default();
                log::info!(
                    "step {}{of} loss {:.5} (data {:.5} + regularization {:.5}) lr {:.6} samples/s {:.0} \
                     elapsed {}{eta}",
                    self.step,
                    st.loss,
                    st.loss - st.reg_loss,
                    st.reg_loss,
                    lr,
                    rate,
                    crate::logging::hms(elapsed),
                );
                window = (Instant::now(), 0);
            }
            if let Some(w) = summaries
                .as_mut()
                .filter(|_| !step_stats.skipped && self.step.is_multiple_of(p.train.save_summary_steps as u64))
            {
                let secs = summary_window.0.elapsed().as_secs_f64().max(1e-9);
                let steps_per_sec = (self.step - summary_window.1) as f64 / secs;
                w.scalars(
                    self.step,
                    &[
                        ("loss", st.loss as f64),
                        ("regularization_loss", st.reg_loss as f64),
                        ("learning_rate", lr as f64),
                        ("global_norm", st.grad_norm as f64),
                        ("global_step/sec", steps_per_sec),
                    ],
                )?;
                summary_window = (Instant::now(), self.step);
            }
            if save_due {
                last_save = (Instant::now(), self.step);
                if self.save_and_evaluate(&mut evals, after_eval)? {
                    break;
                }
            }
        }
        drop(summaries);
        crate::logging::set_bar(None);
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        self.finish(start_step, samples, (t0, last_save.1), last.loss, after_eval)
    }

    /// The end of a run, on every rank: the last checkpoint (unless the
    /// last step was just saved), the evaluation and the exporters. Fails
    /// when nothing at all was read on a fresh start. `samples` were read
    /// here since `t0`.
    pub(super) fn finish(
        &mut self,
        start_step: u64,
        samples: u64,
        (t0, saved_step): (Instant, u64),
        last_loss: f32,
        after_eval: &mut AfterEval,
    ) -> anyhow::Result<RunSummary> {
        self.settle_device();
        let p = self.plan.clone();
        let target = p.train.num_steps.map(u64::from);
        // Every incremental update handed to the writer is out before the end.
        if let Some(incr) = &mut self.incr {
            incr.flush()?;
        }
        let mut read = [samples as f64];
        self.comm.all_reduce_sum(&mut read);
        if read[0] == 0.0 && start_step == 0 && target.is_none_or(|t| t > 0) {
            // Nothing was read on a fresh start: no checkpoint, export or
            // metrics of an untrained model.
            return Err(crate::data::DataError::Empty {
                purpose: "training",
                paths: vec![p.data.train_source()],
            }
            .into());
        }
        // With a remote model_dir only the first rank's copy holds the
        // checkpoints: every rank decides by the step it saved last.
        let latest = if self.mirror.is_some() {
            Some(p.model_dir.join(checkpoint::ckpt_name(saved_step)))
        } else {
            checkpoint::latest(&p.model_dir)?
        };
        let last_ckpt = match latest {
            Some(c) if saved_step == self.step => c,
            _ => {
                let path = self.save()?;
                log::info!("saved {}", path.display());
                path
            }
        };
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        let metrics = if !p.data.has_eval() {
            Vec::new()
        } else {
            self.eval_and_report(&p.data.eval_paths, &p.model_dir.join("eval_result.txt"))?
        };
        after_eval(&last_ckpt, &metrics, true)?;
        Ok(RunSummary {
            steps: self.step - start_step,
            last_loss,
            samples_per_sec: read[0] / secs,
            metrics,
        })
    }

    /// Saves a checkpoint at the current step and, unless evaluations are
    /// throttled (eval_interval_secs) or this is the last step, evaluates it
    /// and calls `after_eval`. Returns whether early stopping ends training
    /// here (every rank has the metrics, so all stop together).
    pub(super) fn save_and_evaluate(
        &mut self,
        evals: &mut Evaluations,
        after_eval: &mut AfterEval,
    ) -> anyhow::Result<bool> {
        let path = self.save()?;
        log::info!("saved {}", path.display());
        let p = &self.plan;
        let target = p.train.num_steps.map(u64::from);
        let throttled = evals.last.elapsed().as_secs() < p.eval.interval_secs as u64;
        if !p.data.has_eval() || throttled || target.is_some_and(|t| self.step >= t) {
            return Ok(false);
        }
        let metrics = self.eval_and_report(&p.data.eval_paths, &p.model_dir.join("eval_result.txt"))?;
        evals.last = Instant::now();
        after_eval(&path, &metrics, false)?;
        let p = &self.plan;
        if !p.export.stops_early(&mut evals.best, self.step, &metrics)? {
            return Ok(false);
        }
        match (&p.export.early_stop, evals.best) {
            (Some(EarlyStop::AboveThreshold { metric, threshold }), _) => {
                log::info!("early stopping at step {}: {metric} is above {threshold}", self.step)
            }
            (_, Some((v, at))) => log::info!(
                "early stopping at step {}: {} has not improved on {v} (step {at}) for {} steps",
                self.step,
                p.export.best_metric,
                self.step - at
            ),
            _ => unreachable!("a best evaluation is recorded before a stop without improvement"),
        }
        Ok(true)
    }

    /// Evaluates, prints the metrics, writes them as JSON to `out` and as
    /// summaries to `eval_val/` beside it (where TensorBoard expects them).
    pub fn eval_and_report(&self, paths: &[String], out: &Path) -> anyhow::Result<Vec<(String, f64)>> {
        crate::output::check(out, &[])?;
        let states = self.evaluate(paths)?;
        let graph = &self.model.graph;
        let penalties: Vec<String> = graph.penalties.iter().map(|p| p.name.clone()).collect();
        let summaries: Vec<String> = graph.summaries.iter().map(|m| m.name.clone()).collect();
        let metrics = crate::metrics::report_tasks(&self.plan.model.tasks, &states, (&penalties, &summaries));
        let examples = states.first().map_or(0, |s| s.labels.len());
        let mut obj = serde_json::Map::new();
        for (k, v) in &metrics {
            obj.insert(k.clone(), json!(v));
        }
        obj.insert("global_step".into(), json!(self.step));
        obj.insert("num_examples".into(), json!(examples));
        let line = metrics
            .iter()
            .map(|(k, v)| format!("{k} = {v:.6}"))
            .collect::<Vec<_>>()
            .join(", ");
        log::info!("eval at step {} on {} examples: {line}", self.step, examples);
        if self.comm.rank() != 0 {
            return Ok(metrics); // every rank has the metrics; rank 0 writes them
        }
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        checkpoint::write_atomic(
            out,
            serde_json::to_string_pretty(&serde_json::Value::Object(obj))?.as_bytes(),
        )?;
        let dir = out.parent().unwrap_or(Path::new(".")).join("eval_val");
        let scalars: Vec<(&str, f64)> = metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        SummaryWriter::create(&dir)?.scalars(self.step, &scalars)?;
        Ok(metrics)
    }
}

/// When the last evaluation during training ran, and early stopping's best
/// one so far (value, step).
pub(super) struct Evaluations {
    last: Instant,
    best: Option<(f64, u64)>,
}

impl Default for Evaluations {
    fn default() -> Self {
        Evaluations {
            last: Instant::now(),
            best: None,
        }
    }
}

/// A bar to num_steps with elapsed time and ETA, or, when training by
/// epochs, a spinner with the step count and elapsed time.
fn progress_bar(target: Option<u64>, step: u64) -> indicatif::ProgressBar {
    let (b, template) = match target {
        Some(t) => (
            indicatif::ProgressBar::new(t),
            "{bar:40} {pos}/{len} steps {elapsed_precise} eta {eta_precise} {msg}",
        ),
        None => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} {pos} steps {elapsed_precise} {msg}",
        ),
    };
    b.set_style(indicatif::ProgressStyle::with_template(template).expect("static template"));
    b.set_position(step);
    b
}

impl Trainer {
    /// What is about to happen: inputs, features, tables and how long.
    pub(super) fn log_banner(&self, target: Option<u64>) {
        let p = &self.plan;
        let (rank_count, sharding) = (self.comm.size(), &self.embeddings.sharding);
        log::info!(
            "{:?} with {} task(s), {} process(es), tables {}",
            p.model.kind,
            p.model.tasks.len(),
            rank_count,
            if sharding.is_sharded() {
                "sharded row-wise"
            } else {
                "replicated"
            }
        );
        log::info!("train input: {}", p.data.train_source());
        if let Some(k) = &p.data.eval_kafka {
            log::info!("eval input: Kafka topic `{}` at {}", k.topic, k.servers.join(","));
        } else if !p.data.eval_paths.is_empty() {
            log::info!("eval input: {}", p.data.eval_paths.join(", "));
        }
        let tables = &self.embeddings.tables;
        let mib = |bytes: usize| bytes as f64 / (1u64 << 20) as f64;
        let held: usize = tables.iter().map(|t| t.held().1).sum();
        let mut listed: Vec<String> = tables
            .iter()
            .take(6)
            .map(|t| match &t.storage {
                Storage::Array => format!("{} {}x{}", t.name, t.rows, t.dim),
                Storage::KeyValue(kv) => format!(
                    "{} key-value x{} ({} rows now, at most {} here: {:.1} MiB)",
                    t.name,
                    t.dim,
                    kv.len(),
                    kv.spec.max_capacity,
                    mib(kv.spec.max_capacity as usize * KeyValue::bytes_per_row(t.dim, t.state.slots.len()))
                ),
            })
            .collect();
        if tables.len() > listed.len() {
            listed.push(format!("... {} more", tables.len() - listed.len()));
        }
        log::info!(
            "{} features, {} dense parameters, {} tables of {:.1} MiB (weights and optimizer state) on this rank: {}",
            p.features.len(),
            self.model.params.len(),
            tables.len(),
            mib(held),
            listed.join(", ")
        );
        match target {
            Some(t) => log::info!(
                "Will train {} steps (global step {} to {t}), batch_size {} per process",
                t.saturating_sub(self.step),
                self.step,
                p.data.batch_size
            ),
            None if p.data.train_kafka.is_some() => log::info!(
                "Will train on the stream until stopped (the stop signal, dead_line or num_steps), batch_size {} per process",
                p.data.batch_size
            ),
            None => log::info!(
                "Will train until the input runs out ({}), batch_size {} per process",
                match p.data.num_epochs {
                    0 => "repeating it".to_string(),
                    n => format!("{n} epoch(s)"),
                },
                p.data.batch_size
            ),
        }
    }
}
