//! What each binary does once its flags are parsed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use anyhow::Context;

use clap::Parser;

use super::{
    parse_with_extend_args, EvalArgs, ExportArgs, InspectArgs, PredictArgs, ServeArgs, TrainEvalArgs, UserError,
    UserFault,
};
use crate::checkpoint;
use crate::config::{load_pipeline, typed::TrainingPlan, LoadedConfig, Overrides};
use crate::dist::{self, Communicator};
use crate::model::ExecutorKind;
use crate::storage::mirror::Mirror;
use crate::train::Trainer;

pub fn train_eval(args: Vec<OsString>) -> anyhow::Result<()> {
    let (args, extend) = parse_with_extend_args::<TrainEvalArgs>(args)?;
    let overrides = Overrides {
        train_input_path: args.train_input_path.clone(),
        eval_input_path: args.eval_input_path.clone(),
        fine_tune_checkpoint: args.fine_tune_checkpoint.clone(),
        ..args.config.overrides(extend)
    };
    let loaded = load_pipeline(&args.config.pipeline_config_path, &overrides)?;
    if args.print_config {
        print!("{}", loaded.to_text());
        return Ok(());
    }
    let mut plan = TrainingPlan::from_config(&loaded.config)?;
    if let Some(seed) = seed_of(args.seed)? {
        plan.train.seed = seed;
    }
    let comm = dist::init()?;
    let options = TrainOptions {
        resume: args.continue_train,
        skip_nonfinite_batches: args.skip_nonfinite_batches,
        divergence: crate::train::divergence::DivergencePolicy {
            factor: args.divergence_factor,
            stop: args.stop_on_divergence,
        },
        ps: crate::train::ps::PsOptions {
            servers: args.num_ps,
            max_staleness: args.max_staleness,
        },
        straggler: args.straggler.map(|(w, ms)| (w, std::time::Duration::from_millis(ms))),
        device: args.device.kind,
        device_table_rows: args.device_table_rows,
    };
    if options.device_table_rows > 0 && options.device == ExecutorKind::Cpu {
        return Err(UserFault(anyhow::anyhow!(
            "--device_table_rows keeps tables on the GPU: it needs --device gpu (the CPU executor reads every table \
             in host memory)"
        ))
        .into());
    }
    abort_on_error(&*comm, train_on(comm.clone(), plan, &loaded, options))
}

/// `--seed`, else the `RUSTREC_SEED` environment variable (for launchers
/// that pass EasyRec's flags only), else none.
fn seed_of(flag: Option<u64>) -> anyhow::Result<Option<u64>> {
    if flag.is_some() {
        return Ok(flag);
    }
    match std::env::var("RUSTREC_SEED") {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| UserFault(anyhow::anyhow!("RUSTREC_SEED: `{v}` is not a non-negative integer")).into()),
        Err(_) => Ok(None),
    }
}

/// What train_eval's flags ask of a run besides the config.
struct TrainOptions {
    /// `--continue_train`.
    resume: bool,
    /// `--skip_nonfinite_batches`.
    skip_nonfinite_batches: u64,
    /// `--divergence_factor`, `--stop_on_divergence`.
    divergence: crate::train::divergence::DivergencePolicy,
    /// `--num_ps`, `--max_staleness`.
    ps: crate::train::ps::PsOptions,
    /// `--straggler` (benches only).
    straggler: Option<(usize, std::time::Duration)>,
    /// `--device`.
    device: ExecutorKind,
    /// `--device_table_rows`.
    device_table_rows: usize,
}

/// The executor `--device` names, its device opened for this rank.
fn open_executor(kind: ExecutorKind, comm: &dyn Communicator) -> anyhow::Result<Arc<dyn crate::model::Executor>> {
    Ok(kind.executor(local_rank(comm))?)
}

/// The process's index among the ranks of its host: what the launcher
/// says (Open MPI, MPICH, Slurm), else the rank (ranks on one host).
fn local_rank(comm: &dyn Communicator) -> usize {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or(comm.rank())
}

/// Under mpirun a failing rank ends the whole job at once, naming itself;
/// otherwise the error goes back to `main_with` unchanged.
fn abort_on_error(comm: &dyn Communicator, result: anyhow::Result<()>) -> anyhow::Result<()> {
    if let Err(e) = &result {
        if comm.size() > 1 {
            crate::logging::write_line(&format!("{}error: {e:#}\n", crate::logging::rank_prefix()));
            comm.abort(1);
        }
    }
    result
}

/// A remote model_dir (`s3://`, `oss://`, `hdfs://`) is worked on through a
/// local copy holding what the job reads (the state file, the config, the
/// latest checkpoint); the plan's model_dir becomes the copy. None for a
/// local model_dir.
fn mirror_model_dir(plan: &mut TrainingPlan) -> anyhow::Result<Option<Arc<Mirror>>> {
    if !crate::storage::is_remote(&plan.model_dir) {
        return Ok(None);
    }
    let m = Mirror::open(&plan.model_dir)?;
    let n = m.pull_latest()?;
    log::info!(
        "model_dir {}: working on a local copy, {n} files downloaded",
        plan.model_dir.display()
    );
    plan.remote_model_dir = Some(std::mem::replace(&mut plan.model_dir, m.local().to_path_buf()));
    Ok(Some(Arc::new(m)))
}

fn train_on(
    comm: Rc<dyn Communicator>,
    mut plan: TrainingPlan,
    loaded: &LoadedConfig,
    opts: TrainOptions,
) -> anyhow::Result<()> {
    let resume = opts.resume;
    let remote_dir = plan.model_dir.clone();
    // Rank 0 holds a remote model_dir's lease for the whole job (taken
    // before anything is read from it).
    let _lease = if comm.rank() == 0 && crate::storage::is_remote(&remote_dir) {
        Some(crate::storage::mirror::Lease::take(&remote_dir)?)
    } else {
        None
    };
    comm.barrier();
    let mirror = mirror_model_dir(&mut plan)?;
    if let Some(m) = mirror.as_ref().filter(|_| comm.rank() == 0) {
        m.prune_checkpoints_beyond(plan.train.keep_checkpoint_max as usize);
    }
    let shown_dir = &remote_dir;
    let model_dir = &plan.model_dir.clone();
    agree_on_config(&*comm, loaded)?;
    // Built (and its export options checked) before anyone trains; rank 0 exports.
    let mut exporter =
        crate::export::exporter::TrainExporter::new(&plan, loaded.to_text())?.filter(|_| comm.rank() == 0);
    let mut trainer = Trainer::with_roles(plan, comm.clone(), &opts.ps).map_err(UserFault)?;
    trainer.model.exec = open_executor(opts.device, &*comm)?;
    trainer.device_table_rows = opts.device_table_rows;
    trainer.skip_nonfinite_batches = opts.skip_nonfinite_batches;
    trainer.divergence = opts.divergence;
    trainer.straggler = opts.straggler;
    trainer.mirror = mirror.clone();
    // The first rank publishes what it wrote besides checkpoints (exports,
    // eval results, summaries) after each evaluation and at the end.
    let publisher = mirror.filter(|_| comm.rank() == 0);
    // Rank 0 holds the model_dir's lock for the whole job; under the lock,
    // whatever a dead job left half written can go.
    let _lock = if comm.rank() == 0 {
        let lock = checkpoint::lock_model_dir(model_dir)?;
        checkpoint::remove_stale_temporaries(model_dir)?;
        checkpoint::remove_stale_temporaries(&model_dir.join(crate::export::exporter::BEST_CKPT_DIR))?;
        Some(lock)
    } else {
        None
    };
    // Rank 0 may be writing the first checkpoint already when a slow rank
    // gets here, so only a fresh start looks, before anyone trains.
    if model_dir.join("checkpoint").exists() && !resume {
        return Err(UserError(format!(
            "{} already holds checkpoints; pass --continue_train to resume or choose another --model_dir",
            shown_dir.display()
        ))
        .into());
    }
    comm.barrier();
    if comm.rank() == 0 {
        write_effective_config(loaded, model_dir)?;
    }
    if resume {
        // Ours, else an EasyRec (TensorFlow) checkpoint the model_dir's state
        // file names: training goes on from its weights, slots and step.
        if let Some(ckpt) = checkpoint::latest(model_dir)?.or_else(|| checkpoint::tensorflow::find(model_dir)) {
            trainer
                .restore(&ckpt)
                .map_err(|e| with_intact_predecessor(e, model_dir, &ckpt))?;
            log::info!("resumed from {} at global step {}", ckpt.display(), trainer.step);
        }
    }
    if trainer.step == 0 {
        if let Some(ft) = trainer.plan.train.fine_tune.clone() {
            // A remote fine_tune_checkpoint is read from a local copy.
            let fetched = if crate::storage::is_remote(&ft.checkpoint) {
                Some(crate::storage::mirror::fetch_checkpoint(&ft.checkpoint)?)
            } else {
                None
            };
            let path = fetched.as_ref().map_or(ft.checkpoint.clone(), |(_, p)| p.clone());
            let n = trainer.fine_tune(&path, ft.var_map.as_deref())?;
            log::info!("fine-tuning: {n} variables restored from {}", ft.checkpoint.display());
        }
    }
    let summary = trainer.run_with(&mut |ckpt, metrics, last| {
        if let Some(dir) = exporter
            .as_mut()
            .map(|e| e.after_eval(ckpt, metrics, last))
            .transpose()?
            .flatten()
        {
            log::info!("exported {}", dir.display());
        }
        if let Some(m) = &publisher {
            m.push().with_context(|| format!("publishing to {}", m.url()))?;
        }
        Ok(())
    })?;
    if let Some(m) = &publisher {
        let n = m.push().with_context(|| format!("publishing to {}", m.url()))?;
        log::info!("model_dir {}: published ({n} files at the end)", m.url());
    }
    log::info!(
        "trained {} steps to global step {}, {:.0} samples/s (the whole job)",
        summary.steps,
        trainer.step,
        summary.samples_per_sec
    );
    if trainer.skipped_batches > 0 {
        log::warn!(
            "{} of those batches were skipped: their loss or gradient was not finite",
            trainer.skipped_batches
        );
    }
    Ok(())
}

/// A latest checkpoint that cannot be restored: says which earlier one is
/// intact, so the user knows what resuming would lose.
fn with_intact_predecessor(err: anyhow::Error, model_dir: &Path, latest: &Path) -> anyhow::Error {
    let Some(step) = checkpoint::step_of(latest) else {
        return err;
    };
    let earlier = checkpoint::list(model_dir).unwrap_or_default();
    let intact = earlier
        .iter()
        .rev()
        .filter(|s| **s < step)
        .map(|s| model_dir.join(checkpoint::ckpt_name(*s)))
        .find(|p| checkpoint::load(p).is_ok());
    match intact {
        Some(p) => err.context(format!(
            "cannot resume from {}; the earlier checkpoint {} is intact: move the damaged one out of \
             model_dir to resume from it",
            latest.display(),
            p.display()
        )),
        None => err.context(format!(
            "cannot resume from {}, and no earlier checkpoint is intact",
            latest.display()
        )),
    }
}

/// Every rank must run the same effective config with the same binary:
/// table shapes and buffer sizes follow from them.
fn agree_on_config(comm: &dyn Communicator, loaded: &LoadedConfig) -> anyhow::Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let what = format!(
        "{} {} {}\n{}",
        env!("CARGO_PKG_NAME"),
        env!("CARGO_PKG_VERSION"),
        checkpoint::FORMAT,
        loaded.to_text()
    );
    let digest = crate::features::fingerprint::fingerprint64(what.as_bytes());
    dist::agree(comm, "the effective pipeline config (after flags and edits)", digest)?;
    Ok(())
}

pub fn eval(args: Vec<OsString>) -> anyhow::Result<()> {
    let (args, extend) = parse_with_extend_args::<EvalArgs>(args)?;
    let overrides = Overrides {
        eval_input_path: args.eval_input_path.clone(),
        ..args.config.overrides(extend)
    };
    let loaded = load_pipeline(&args.config.pipeline_config_path, &overrides)?;
    let mut plan = TrainingPlan::from_config(&loaded.config)?;
    if !plan.data.has_eval() {
        return Err(UserError("no evaluation data: set eval_input_path or pass --eval_input_path".into()).into());
    }
    let mirror = mirror_model_dir(&mut plan)?;
    let (ckpt, _fetched) = checkpoint_to_use(&plan.model_dir, args.checkpoint_path.as_deref(), "to evaluate")?;
    let model_dir = plan.model_dir.clone();
    let eval_paths = plan.data.eval_paths.clone();
    // Its help says "inside model_dir": checked before anything is read.
    let result_path = crate::output::inside(&model_dir, &args.eval_result_path, "--eval_result_path")?;
    let inputs = crate::data::expand_paths(&eval_paths).unwrap_or_default();
    crate::output::check(&result_path, &inputs)?;
    let comm = dist::init()?;
    let run = || -> anyhow::Result<()> {
        agree_on_config(&*comm, &loaded)?;
        let mut trainer = Trainer::with_comm(plan, comm.clone()).map_err(UserFault)?;
        trainer.model.exec = open_executor(args.device.kind, &*comm)?;
        trainer.restore(&ckpt)?;
        trainer.eval_and_report(&eval_paths, &result_path)?;
        if let Some(m) = mirror.as_ref().filter(|_| comm.rank() == 0) {
            m.push()
                .with_context(|| format!("publishing the eval result to {}", m.url()))?;
        }
        Ok(())
    };
    abort_on_error(&*comm, run())
}

pub fn export(args: Vec<OsString>) -> anyhow::Result<()> {
    let (args, extend) = parse_with_extend_args::<ExportArgs>(args)?;
    let loaded = load_pipeline(&args.config.pipeline_config_path, &args.config.overrides(extend))?;
    let mut plan = TrainingPlan::from_config(&loaded.config)?;
    plan.export.check()?;
    let _mirror = mirror_model_dir(&mut plan)?;
    let (ckpt, _fetched) = checkpoint_to_use(&plan.model_dir, args.checkpoint_path.as_deref(), "to export")?;
    // A remote export_dir: exported into a local copy, then published
    // (each version's files, its export_info.json last).
    let export_mirror = if crate::storage::is_remote(&args.export_dir) {
        let m = Mirror::open(&args.export_dir)?;
        m.mark_remote_versions()?;
        Some(m)
    } else {
        None
    };
    let export_root = export_mirror
        .as_ref()
        .map_or(args.export_dir.clone(), |m| m.local().to_path_buf());
    let mut assets = plan.export.asset_files.clone();
    assets.extend(args.asset_files.iter().cloned());
    let dir = crate::export::export_checkpoint(
        &plan,
        &ckpt,
        &export_root,
        &crate::export::ExportRequest {
            config_text: &loaded.to_text(),
            asset_files: &assets,
            metrics: &[],
            checkpoint: Some(&ckpt),
            external_min_bytes: crate::export::EXTERNAL_MIN_BYTES,
        },
    )?;
    let dir = match &export_mirror {
        Some(m) => {
            m.push()
                .with_context(|| format!("publishing the export to {}", m.url()))?;
            let version = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            crate::storage::join(&args.export_dir, &version)
        }
        None => dir,
    };
    println!("{}", dir.display());
    log::info!("exported {} to {}", ckpt.display(), dir.display());
    Ok(())
}

/// `--checkpoint_path` (a checkpoint, or a directory: its latest), else the
/// latest in model_dir; `purpose` completes the error when there is none.
/// A remote `--checkpoint_path` is downloaded into a local copy of its
/// directory, returned beside it (the copy lives as long as it).
fn checkpoint_to_use(
    model_dir: &Path,
    path: Option<&str>,
    purpose: &str,
) -> anyhow::Result<(std::path::PathBuf, Option<Mirror>)> {
    match path {
        Some(p) if crate::storage::is_remote(Path::new(p)) => {
            let (m, local) = crate::storage::mirror::fetch_checkpoint(Path::new(p))?;
            Ok((checkpoint::resolve(&local)?, Some(m)))
        }
        Some(p) => Ok((checkpoint::resolve(Path::new(p))?, None)),
        None => checkpoint::latest(model_dir)?
            .map(|c| (c, None))
            .ok_or_else(|| UserError(format!("{} holds no checkpoint {purpose}", model_dir.display())).into()),
    }
}

/// `path` made absolute with its parent resolved, so two spellings of one
/// file compare equal (the file itself need not exist).
fn resolved(path: &Path) -> PathBuf {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match (parent.canonicalize(), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

/// Refuses an output path that would overwrite what predict reads: an
/// input file, the config, or a file of the export.
fn check_predict_output(args: &PredictArgs) -> anyhow::Result<()> {
    let out = resolved(&args.output_path);
    let inputs = crate::data::expand_paths(&args.input_path)?;
    let read: Vec<PathBuf> = inputs
        .iter()
        .map(|p| resolved(p))
        .chain(args.pipeline_config_path.iter().map(|p| resolved(p)))
        .collect();
    if read.contains(&out) {
        return Err(UserError(format!(
            "--output_path {} is one of the files predict reads; write the predictions elsewhere",
            args.output_path.display()
        ))
        .into());
    }
    if let Some(dir) = args.saved_model_dir.as_ref().and_then(|d| d.canonicalize().ok()) {
        if out.starts_with(&dir) {
            return Err(UserError(format!(
                "--output_path {} is inside the export {}; write the predictions elsewhere",
                args.output_path.display(),
                dir.display()
            ))
            .into());
        }
    }
    Ok(())
}

pub fn predict(args: Vec<OsString>) -> anyhow::Result<()> {
    use crate::predict::{PredictJob, Scorer};
    let (args, extend) = parse_with_extend_args::<PredictArgs>(args)?;
    check_predict_output(&args)?;
    let scorer = match (&args.saved_model_dir, &args.pipeline_config_path) {
        (Some(dir), None) => {
            if args.device.kind != ExecutorKind::Cpu {
                return Err(UserError(
                    "--device: an export (--saved_model_dir) is scored by its ONNX graph on the CPU; \
                     score a checkpoint (--pipeline_config_path) to use a GPU"
                        .into(),
                )
                .into());
            }
            if !extend.is_empty() || args.edit_config_json.is_some() || args.checkpoint_path.is_some() {
                return Err(UserError(
                    "--saved_model_dir scores with the export's own config; config edits and --checkpoint_path need --pipeline_config_path"
                        .into(),
                )
                .into());
            }
            let model = if crate::storage::is_remote(dir) {
                let m = Mirror::open(dir)?;
                m.pull("")?;
                crate::export::runtime::ExportedModel::load(m.local()).map_err(UserFault)?
            } else {
                crate::export::runtime::ExportedModel::load(dir).map_err(UserFault)?
            };
            Scorer::Export(Box::new(model))
        }
        (None, Some(config)) => {
            let overrides = Overrides {
                model_dir: args.model_dir.clone(),
                edit_config_json: args.edit_config_json.clone(),
                extend_args: extend,
                ..Overrides::default()
            };
            let loaded = load_pipeline(config, &overrides)?;
            let mut plan = TrainingPlan::from_config(&loaded.config)?;
            let _mirror = mirror_model_dir(&mut plan)?;
            let (ckpt, _fetched) =
                checkpoint_to_use(&plan.model_dir, args.checkpoint_path.as_deref(), "to score with")?;
            let mut bundle = crate::inference::Bundle::restore(plan, &ckpt).map_err(UserFault)?;
            bundle.model.exec = args.device.kind.executor(0)?;
            Scorer::Checkpoint(Box::new(bundle))
        }
        _ => return Err(UserError("pass exactly one of --saved_model_dir and --pipeline_config_path".into()).into()),
    };
    // A remote output is written locally (a folder of its own in the
    // temporary directory), then uploaded whole.
    let remote_out = crate::storage::is_remote(&args.output_path);
    let staging = std::env::temp_dir().join(format!("rustrec-predict-{}", std::process::id()));
    let output = if remote_out {
        std::fs::create_dir_all(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
        let name = args
            .output_path
            .file_name()
            .map_or("predictions".into(), |n| n.to_os_string());
        staging.join(name)
    } else {
        args.output_path.clone()
    };
    let job = PredictJob {
        inputs: args.input_path.clone(),
        output: output.clone(),
        reserved_cols: args.reserved_cols.clone(),
        batch_size: args.batch_size,
    };
    let predicted = crate::predict::predict(&scorer, &job);
    if remote_out {
        let uploaded = predicted
            .as_ref()
            .ok()
            .map(|_| crate::storage::object(&args.output_path).and_then(|o| o.upload(&output)));
        let _ = std::fs::remove_dir_all(&staging);
        if let Some(r) = uploaded {
            r?;
        }
    }
    let rows = predicted?;
    log::info!("wrote {rows} predictions to {}", args.output_path.display());
    Ok(())
}

pub fn serve(args: Vec<OsString>) -> anyhow::Result<()> {
    use crate::serve::{batcher::Batching, ServeOptions};
    let args = ServeArgs::try_parse_from(args)?;
    if !(args.file_system_poll_wait_seconds >= 0.0 && args.file_system_poll_wait_seconds.is_finite()) {
        return Err(UserError("--file_system_poll_wait_seconds must be a number of seconds, 0 or more".into()).into());
    }
    if args.enable_batching && args.max_batch_size == 0 {
        return Err(UserError("--max_batch_size must be at least 1 with --enable_batching".into()).into());
    }
    if args.num_versions == 0 {
        return Err(UserError("--num_versions must be at least 1".into()).into());
    }
    let labels = match &args.version_labels {
        Some(text) => parse_version_labels(text)?,
        None => Default::default(),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A remote model_dir: its complete versions are downloaded into a local
    // copy, which the server watches as it watches a local directory.
    let copy = if crate::storage::is_remote(&args.model_dir) {
        let m = Arc::new(Mirror::open(&args.model_dir)?);
        m.pull_versions()?;
        if !args.file_system_poll_wait_seconds.is_nan() && args.file_system_poll_wait_seconds > 0.0 {
            let (follower, poll) = (
                m.clone(),
                std::time::Duration::from_secs_f64(args.file_system_poll_wait_seconds),
            );
            std::thread::Builder::new()
                .name("remote-versions".into())
                .spawn(move || loop {
                    std::thread::sleep(poll);
                    match follower.pull_versions() {
                        Ok(v) if !v.is_empty() => {
                            log::info!("downloaded version(s) {} from {}", v.join(", "), follower.url())
                        }
                        Ok(_) => {}
                        Err(e) => log::warn!("cannot follow {}: {e}", follower.url()),
                    }
                })
                .context("cannot start the thread following the remote model_dir")?;
        }
        Some(m)
    } else {
        None
    };
    let opts = ServeOptions {
        model_dir: copy
            .as_ref()
            .map_or(args.model_dir.clone(), |m| m.local().to_path_buf()),
        model_name: args.model_name.clone(),
        addr: std::net::SocketAddr::new(args.host, args.port),
        batching: Batching {
            max_batch_size: if args.enable_batching { args.max_batch_size } else { 0 },
            timeout: std::time::Duration::from_micros(args.batch_timeout_micros),
            threads: args.num_batch_threads.unwrap_or(cores).max(1),
        },
        poll: std::time::Duration::from_secs_f64(args.file_system_poll_wait_seconds),
        max_request_bytes: args.max_request_bytes,
        num_versions: args.num_versions,
        labels,
        grpc_addr: args.grpc_port.map(|p| std::net::SocketAddr::new(args.host, p)),
    };
    crate::serve::run(opts, |protocol, addr| {
        use std::io::Write;
        // A line on stdout for scripts (and tests) that asked for port 0:
        // `listening on ADDR` (HTTP), then `grpc listening on ADDR`.
        let mut out = std::io::stdout().lock();
        let _ = match protocol {
            "http" => writeln!(out, "listening on {addr}"),
            other => writeln!(out, "{other} listening on {addr}"),
        };
        let _ = out.flush();
    })
}

/// `--version_labels`: `label=version` pairs separated by commas.
fn parse_version_labels(text: &str) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut labels = std::collections::BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = pair
            .split_once('=')
            .and_then(|(l, v)| Some((l.trim(), v.trim().parse::<u64>().ok()?)))
            .filter(|(l, _)| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)));
        let Some((label, version)) = parsed else {
            return Err(UserError(format!(
                "--version_labels: `{pair}` is not LABEL=VERSION (a name of letters, digits, `_`, `-` or `.`, and a version number)"
            ))
            .into());
        };
        if labels.insert(label.to_string(), version).is_some() {
            return Err(UserError(format!("--version_labels names `{label}` twice")).into());
        }
    }
    Ok(labels)
}

pub fn inspect_checkpoint(args: Vec<OsString>) -> anyhow::Result<()> {
    let args = InspectArgs::try_parse_from(args)?;
    let dir = checkpoint::resolve(Path::new(&args.checkpoint_path))?;
    if let Some(prefix) = checkpoint::tensorflow::find(&dir) {
        return inspect_tensorflow(&prefix, args.all_tensors);
    }
    let (step, tensors) = checkpoint::load(&dir)?;
    println!("checkpoint {} (global step {step})", dir.display());
    if let Some(s) = checkpoint::StreamOffsets::of(&dir)? {
        let offsets: Vec<String> = s.offsets.iter().map(|(p, o)| format!("{p}:{o}")).collect();
        println!(
            "kafka topic {} next offsets (partition:offset) {}",
            s.topic,
            offsets.join(" ")
        );
    }
    let mut values = 0usize;
    let mut shown = 0usize;
    for (name, t) in &tensors {
        if !args.all_tensors && crate::optim::is_slot_name(name) {
            continue;
        }
        println!("{name} {:?}", t.shape);
        values += t.data.len() + t.ints.len();
        shown += 1;
    }
    println!("{shown} variables, {values} values");
    Ok(())
}

/// Lists an EasyRec (TensorFlow) checkpoint as TensorFlow's
/// `list_variables` does, `name<TAB>dtype<TAB>shape`, after reading every
/// listed tensor against its checksum.
fn inspect_tensorflow(prefix: &Path, all: bool) -> anyhow::Result<()> {
    let ckpt = checkpoint::tensorflow::TfCheckpoint::open(prefix)?;
    // Every tensor is read against its checksum, the ones not listed too.
    ckpt.verify_all()?;
    let step = ckpt.global_step()?;
    println!(
        "TensorFlow checkpoint {} (global step {})",
        prefix.display(),
        step.map_or("unknown".into(), |s| s.to_string())
    );
    let mut values = 0usize;
    let mut shown = 0usize;
    for (name, e) in &ckpt.entries {
        if !all && crate::model::names::is_training_state(name) {
            continue;
        }
        if e.dtype_name() != "string" {
            values += ckpt.read_f32(name)?.data.len();
        }
        let dims: Vec<String> = e.shape.iter().map(usize::to_string).collect();
        println!("{name}\t{}\t[{}]", e.dtype_name(), dims.join(", "));
        shown += 1;
    }
    println!("{shown} variables, {values} values");
    Ok(())
}

/// Writes model_dir/pipeline.config atomically (temp file, then rename).
pub fn write_effective_config(loaded: &LoadedConfig, model_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(model_dir).with_context(|| format!("cannot create model_dir {}", model_dir.display()))?;
    checkpoint::write_atomic(&model_dir.join("pipeline.config"), loaded.to_text().as_bytes())
}
