//! Training throughput on the Criteo Kaggle shape: DLRM (emb 16, bottom
//! 13-512-256-64-16, dot interaction, top 512-256-1), WideAndDeep (dnn
//! 1024-512-256), and with the layer sizes of EasyRec's sample configs
//! DeepFM (dnn 256-128-64, final_dnn 256-128-64), DCN (deep 256-128-96-64,
//! 5 cross layers, final 128-96-64-32-16) and MMoE (4 experts
//! 256-192-128-64, two towers 256-192-128-64 on the one label), over 26
//! tables capped at 1M rows, batch 2048, Adagrad for tables and Adam for
//! dense layers, on a fixed number of threads. The DNNs are plain
//! Linear+ReLU stacks (use_bn: false), as in the PyTorch baseline and the
//! DLRM reference.
//!
//! Next to each model it times the input pipeline alone (Parquet reading and
//! feature encoding, already overlapped with training by a background thread)
//! so the ratio shows how much of a step the model itself costs.
//!
//! `--profile` gives each model's step phase by phase (every matrix
//! product's time and GFLOP/s, every other phase's time and GB/s, their
//! shares of the step) beside the machine's measured fp32 GEMM peak, and
//! how far the step is from its matrix work done at that peak.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use std::rc::Rc;

use rustrec::config::train_plan::Strategy;
use rustrec::config::typed::TrainingPlan;
use rustrec::config::{load_pipeline, Overrides};
use rustrec::datagen::{generate, GenSpec};
use rustrec::dist::Communicator;
use rustrec::model::exec::cpu::blas::kernels;
use rustrec::model::ExecutorKind;
use rustrec::profile::{cpu_isa, cpu_model, report, step_phase, timed, Profile};
use rustrec::train::Trainer;
use std::sync::Arc;

#[derive(Debug, Clone, Parser)]
#[command(name = "bench", rename_all = "snake_case", about = "Training throughput benchmark")]
struct Args {
    /// Rows of generated Criteo-shaped data (written once, then reused).
    #[arg(long, default_value_t = 262_144)]
    rows: usize,
    /// Timed steps per model (after 3 warm-up steps).
    #[arg(long, default_value_t = 40)]
    steps: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 2048)]
    batch_size: usize,
    /// Cap on every table's rows.
    #[arg(long, default_value_t = 1_000_000)]
    cap: u64,
    #[arg(long, default_value = "data/bench")]
    data_dir: PathBuf,
    /// Run as one rank of `mpirun -np N bench --distributed`: the global
    /// batch is split across ranks and tables are sharded
    /// (EmbeddingParallelStrategy). Rank 0 prints the global throughput and
    /// the bytes each sample costs in collectives.
    #[arg(long)]
    distributed: bool,
    /// Models to time, in order (all of them by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_values = MODELS,
        value_parser = clap::builder::PossibleValuesParser::new(MODELS)
    )]
    models: Vec<String>,
    /// One JSON line per model (samples/s, peak memory) instead of a table;
    /// `bench/compare.py` runs one model per process this way.
    #[arg(long)]
    json: bool,
    /// Key-value tables against arrays: each model trained both ways
    /// (every table with `ev_params { max_capacity: cap }`), then one
    /// key-value table driven to `growth_keys` keys under `growth_capacity`.
    #[arg(long)]
    key_value: bool,
    /// Time training with incremental updates (incr_save_config, an update
    /// every `update_steps` steps) against training without them.
    #[arg(long)]
    incremental: bool,
    #[arg(long, default_value_t = 10)]
    update_steps: u32,
    #[arg(long, default_value_t = 10_000_000)]
    growth_keys: u64,
    #[arg(long, default_value_t = 2_000_000)]
    growth_capacity: u64,
    /// Where each model's step goes, phase by phase, against the machine's
    /// measured GEMM peak.
    #[arg(long)]
    profile: bool,
    /// Reading the Parquet data from remote storage (a URL prefix, such as
    /// `s3://bucket/bench`) against the same file on local disk: the data
    /// is uploaded there, then each model's input pipeline alone and its
    /// training are timed from both.
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
    /// `gpu`: each model on the GPU executor against the CPU executor in the
    /// same run: first 20 steps of each checked equal (1e-4 relative) at a
    /// small batch, then both timed. With --json, the GPU's samples/s.
    #[arg(long, default_value = "cpu", value_name = "cpu|gpu", value_parser = ExecutorKind::parse)]
    device: ExecutorKind,
}

/// Peak resident memory of this process in MiB (Linux), 0 when unknown.
fn peak_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn features(cap: u64) -> String {
    let mut s = String::new();
    for i in 1..=13 {
        s +=
            &format!("feature_configs {{ input_names: \"I{i}\" feature_type: RawFeature min_val: 0 max_val: 1000 }}\n");
    }
    for (i, card) in rustrec::datagen::KAGGLE_CARDINALITIES.iter().enumerate() {
        s += &format!(
            "feature_configs {{ input_names: \"C{}\" feature_type: IdFeature hash_bucket_size: {} embedding_dim: 16 }}\n",
            i + 1,
            (*card).min(cap)
        );
    }
    s
}

fn names(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("\"{prefix}{i}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `config` with every table a key-value table of at most `cap` rows.
fn key_value_config(model: &str, data: &Path, batch: usize, cap: u64) -> String {
    config(model, data, batch, cap).replacen(
        "model_config { ",
        &format!("model_config {{ ev_params {{ max_capacity: {cap} }} "),
        1,
    )
}

/// The models the bench times (`--models`).
const MODELS: [&str; 5] = ["DLRM", "WideAndDeep", "DeepFM", "DCN", "MMoE"];

fn config(model: &str, data: &Path, batch: usize, cap: u64) -> String {
    let model_block = match model {
        "DLRM" => format!(
            "model_config {{ model_class: \"DLRM\"
  feature_groups {{ group_name: \"dense\" feature_names: [{}] }}
  feature_groups {{ group_name: \"sparse\" feature_names: [{}] }}
  dlrm {{ bot_dnn {{ hidden_units: [512, 256, 64, 16] use_bn: false }} top_dnn {{ hidden_units: [512, 256] use_bn: false }} arch_with_dense_feature: true }} }}",
            names("I", 13),
            names("C", 26)
        ),
        "DeepFM" => format!(
            "model_config {{ model_class: \"DeepFM\"
  feature_groups {{ group_name: \"wide\" feature_names: [{c}] wide_deep: WIDE }}
  feature_groups {{ group_name: \"deep\" feature_names: [{c}, {}] wide_deep: DEEP }}
  deepfm {{ dnn {{ hidden_units: [256, 128, 64] use_bn: false }} final_dnn {{ hidden_units: [256, 128, 64] use_bn: false }} }} }}",
            names("I", 13),
            c = names("C", 26)
        ),
        "DCN" => format!(
            "model_config {{ model_class: \"DCN\"
  feature_groups {{ group_name: \"all\" feature_names: [{}, {}] }}
  dcn {{ deep_tower {{ input: \"all\" dnn {{ hidden_units: [256, 128, 96, 64] use_bn: false }} }}
        cross_tower {{ input: \"all\" cross_num: 5 }}
        final_dnn {{ hidden_units: [128, 96, 64, 32, 16] use_bn: false }} }} }}",
            names("I", 13),
            names("C", 26)
        ),
        "MMoE" => format!(
            "model_config {{ model_class: \"MMoE\"
  feature_groups {{ group_name: \"all\" feature_names: [{}, {}] }}
  mmoe {{ expert_dnn {{ hidden_units: [256, 192, 128, 64] use_bn: false }} num_expert: 4
         task_towers {{ tower_name: \"ctr\" label_name: \"label\" dnn {{ hidden_units: [256, 192, 128, 64] use_bn: false }} }}
         task_towers {{ tower_name: \"cvr\" label_name: \"label\" dnn {{ hidden_units: [256, 192, 128, 64] use_bn: false }} }} }} }}",
            names("I", 13),
            names("C", 26)
        ),
        "WideAndDeep" => format!(
            "model_config {{ model_class: \"WideAndDeep\"
  feature_groups {{ group_name: \"wide\" feature_names: [{c}] wide_deep: WIDE }}
  feature_groups {{ group_name: \"deep\" feature_names: [{}, {c}] wide_deep: DEEP }}
  wide_and_deep {{ dnn {{ hidden_units: [1024, 512, 256] use_bn: false }} }} }}",
            names("I", 13),
            c = names("C", 26)
        ),
        other => unreachable!("--models takes only the bench's models (MODELS), not {other}"),
    };
    // WideAndDeep's three-optimizer rule: wide tables, deep tables, dense.
    let table_opts = if model == "WideAndDeep" { 2 } else { 1 };
    let adagrad =
        "optimizer_config { adagrad_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.05 } } } }\n";
    format!(
        "parquet_train_input: \"{data}\"\nmodel_dir: \"unused\"\ntrain_config {{\n{tables}  optimizer_config {{ adam_optimizer {{ learning_rate {{ constant_learning_rate {{ learning_rate: 0.001 }} }} }} }}\n}}
data_config {{ input_type: ParquetInputV2 batch_size: {batch} num_epochs: 100 auto_expand_input_fields: true
  input_fields {{ input_name: \"label\" input_type: INT32 }}
  input_fields {{ input_name: \"I[1-13]\" input_type: INT64 }}
  input_fields {{ input_name: \"C[1-26]\" input_type: STRING }}
  label_fields: \"label\" }}
{features}{model_block}\n",
        data = data.display(),
        tables = adagrad.repeat(table_opts),
        features = features(cap)
    )
}

struct Measured {
    train: f64,
    /// Seconds a timed step took.
    step_secs: f64,
    input: f64,
    table_rows: usize,
    /// Bytes per row held after the timed steps (values, optimizer slots
    /// and, for key-value tables, their index).
    bytes_per_row: f64,
}

fn measure(model: &str, data: &Path, args: &Args) -> anyhow::Result<Measured> {
    measure_config(model, &config(model, data, args.batch_size, args.cap), args, None)
}

/// A trainer on `kind` of config `text`, written to `path` first (as a
/// user's config is read).
fn trainer_of(path: &Path, text: &str, kind: ExecutorKind) -> anyhow::Result<Trainer> {
    std::fs::write(path, text)?;
    let loaded = load_pipeline(path, &Overrides::default())?;
    let mut trainer = Trainer::new(TrainingPlan::from_config(&loaded.config)?)?;
    trainer.model.exec = kind.executor(0)?;
    Ok(trainer)
}

/// Trains `model` from config `text`, its timed steps recorded in
/// `profile` when given (the input's wait included).
fn measure_config(model: &str, text: &str, args: &Args, profile: Option<&Arc<Profile>>) -> anyhow::Result<Measured> {
    let mut trainer = trainer_of(&args.data_dir.join(format!("{model}.config")), text, args.device)?;
    trainer.start_incr_updates()?;
    if let Some(p) = profile {
        trainer.set_profile(p.clone());
    }
    let table_rows = trainer.embeddings.tables.iter().map(|t| t.rows).sum();
    let paths = trainer.plan.data.train_paths.clone();

    // The input pipeline alone.
    let mut stream = trainer.stream(&paths, true, 0)?;
    for _ in 0..3 {
        stream.next().context("data ran out")??;
    }
    let t = Instant::now();
    let mut n = 0usize;
    for _ in 0..args.steps {
        n += stream.next().context("data ran out")??.size;
    }
    let input = n as f64 / t.elapsed().as_secs_f64();
    drop(stream);

    // Whole training steps, reading overlapped by the prefetch thread.
    let mut stream = trainer.stream(&paths, true, 0)?;
    for _ in 0..3 {
        let b = stream.next().context("data ran out")??;
        trainer.train_step(&b)?;
    }
    if let Some(p) = profile {
        p.clear();
    }
    let t = Instant::now();
    let mut n = 0usize;
    for _ in 0..args.steps {
        let b = timed(
            profile.map(|p| &**p),
            step_phase("input (waiting for the prefetched batch)"),
            |_| None,
            || stream.next(),
        )
        .context("data ran out")??;
        trainer.train_step(&b)?;
        trainer.incr_after_step()?;
        n += b.size;
    }
    let secs = t.elapsed().as_secs_f64();
    let train = n as f64 / secs;
    let (rows, bytes) = trainer
        .embeddings
        .tables
        .iter()
        .map(|t| t.held())
        .fold((0, 0), |(r, b), (tr, tb)| (r + tr, b + tb));
    Ok(Measured {
        train,
        step_secs: secs / args.steps.max(1) as f64,
        input,
        table_rows,
        bytes_per_row: bytes as f64 / rows.max(1) as f64,
    })
}

/// Each model read and trained from a remote copy of the data against the
/// local file, side by side in one run.
fn remote_versus_local(data: &Path, url: &str, args: &Args) -> anyhow::Result<()> {
    let name = data.file_name().context("data file has no name")?.to_string_lossy();
    let remote = PathBuf::from(format!("{}/{name}", url.trim_end_matches('/')));
    let object = rustrec::storage::object(&remote)?;
    let t = Instant::now();
    object.upload(data)?;
    let size = std::fs::metadata(data)?.len();
    println!(
        "{} ({}): {} uploaded to {} (endpoint {}) in {:.1} s; threads {}, batch {}, {} timed steps",
        cpu_model(),
        cpu_isa(),
        data.display(),
        remote.display(),
        object.endpoint(),
        t.elapsed().as_secs_f64(),
        args.threads,
        args.batch_size,
        args.steps
    );
    println!(
        "{:<12} {:>16} {:>16} {:>8} {:>16} {:>16} {:>8}",
        "model", "input local/s", "input remote/s", "ratio", "train local/s", "train remote/s", "ratio"
    );
    for model in &args.models {
        let local = measure(model, data, args)?;
        let far = measure(model, &remote, args)?;
        println!(
            "{model:<12} {:>16.0} {:>16.0} {:>8.3} {:>16.0} {:>16.0} {:>8.3}",
            local.input,
            far.input,
            far.input / local.input,
            local.train,
            far.train,
            far.train / local.train
        );
    }
    println!(
        "(a {:.0} MiB file; ratio = remote / local)",
        size as f64 / (1 << 20) as f64
    );
    object.delete()?;
    Ok(())
}

/// The first `steps` losses of `model` (batch `batch`) on `kind`, and its
/// dense parameters after them.
fn first_steps(
    model: &str,
    data: &Path,
    args: &Args,
    kind: ExecutorKind,
    batch: usize,
) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    let steps = 20;
    let path = args.data_dir.join(format!("{model}_check.config"));
    let mut trainer = trainer_of(&path, &config(model, data, batch, args.cap), kind)?;
    let paths = trainer.plan.data.train_paths.clone();
    let mut stream = trainer.stream(&paths, true, 0)?;
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let b = stream.next().context("data ran out")??;
        losses.push(trainer.train_step(&b)?.loss);
    }
    trainer.settle_device();
    Ok((losses, trainer.model.params.values.clone()))
}

/// The largest of |a - b| / (1 + |b|) over two equally long slices.
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

/// Each model on `args.device` against the CPU executor, in one run: 20
/// steps checked equal (losses and the dense parameters after them), then
/// both timed on the bench's batches.
fn device_versus_cpu(data: &Path, args: &Args) -> anyhow::Result<()> {
    let cpu = Args {
        device: ExecutorKind::Cpu,
        ..args.clone()
    };
    println!(
        "{:?} executor against the CPU executor ({}, {}, {} threads): batch {}, {} timed steps, tables capped at {} rows",
        args.device,
        cpu_model(),
        cpu_isa(),
        args.threads,
        args.batch_size,
        args.steps,
        args.cap
    );
    println!(
        "{:<12} {:>12} {:>12} {:>14} {:>14} {:>8}",
        "model", "loss diff", "param diff", "cpu samp/s", "device samp/s", "ratio"
    );
    let mut failed = Vec::new();
    for model in &args.models {
        let (want_loss, want_params) = first_steps(model, data, args, ExecutorKind::Cpu, 256)?;
        let (got_loss, got_params) = first_steps(model, data, args, args.device, 256)?;
        let (dl, dp) = (max_rel(&got_loss, &want_loss), max_rel(&got_params, &want_params));
        if dl > 1e-4 || dp > 1e-4 {
            failed.push(model.clone());
        }
        let on_cpu = measure(model, data, &cpu)?;
        let on_device = measure(model, data, args)?;
        println!(
            "{model:<12} {dl:>12.2e} {dp:>12.2e} {:>14.0} {:>14.0} {:>7.2}x",
            on_cpu.train,
            on_device.train,
            on_device.train / on_cpu.train
        );
    }
    println!("(diffs: the largest |device - cpu| / (1 + |cpu|) over 20 steps' losses and the dense parameters after them, batch 256)");
    anyhow::ensure!(
        failed.is_empty(),
        "not within 1e-4 of the CPU executor: {}",
        failed.join(", ")
    );
    Ok(())
}

/// Each model trained with and without incremental updates, side by side:
/// what writing them costs the training.
fn incremental_versus_none(data: &Path, args: &Args) -> anyhow::Result<()> {
    println!(
        "incremental updates (fs, sparse and dense every {} steps) against none: threads {}, batch {}, {} timed steps",
        args.update_steps, args.threads, args.batch_size, args.steps
    );
    println!(
        "{:<12} {:>14} {:>14} {:>8}",
        "model", "none samp/s", "incr samp/s", "incr/none"
    );
    for model in &args.models {
        let none = measure(model, data, args)?;
        let dir = args.data_dir.join(format!("incr_{model}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let text = config(model, data, args.batch_size, args.cap)
            .replace("model_dir: \"unused\"", &format!("model_dir: \"{}\"", dir.display()))
            .replacen(
                "train_config {\n",
                &format!(
                    "train_config {{\n  incr_save_config {{ sparse_save_steps: {n} dense_save_steps: {n} fs {{}} }}\n",
                    n = args.update_steps
                ),
                1,
            );
        let incr = measure_config(model, &text, args, None)?;
        let written = std::fs::read_dir(dir.join("incr_save"))?.count() / 2;
        println!(
            "{model:<12} {:>14.0} {:>14.0} {:>8.3}   ({written} updates written)",
            none.train,
            incr.train,
            incr.train / none.train
        );
    }
    Ok(())
}

/// Each model trained with arrays and with key-value tables, side by side.
fn key_value_versus_arrays(data: &Path, args: &Args) -> anyhow::Result<()> {
    println!(
        "key-value tables against arrays: threads {}, batch {}, {} timed steps, at most {} rows a table",
        args.threads, args.batch_size, args.steps, args.cap
    );
    println!(
        "{:<12} {:>14} {:>14} {:>8} {:>12} {:>12}",
        "model", "array samp/s", "kv samp/s", "kv/array", "array B/row", "kv B/row"
    );
    for model in &args.models {
        let array = measure(model, data, args)?;
        let kv = measure_config(
            model,
            &key_value_config(model, data, args.batch_size, args.cap),
            args,
            None,
        )?;
        println!(
            "{model:<12} {:>14.0} {:>14.0} {:>8.3} {:>12.0} {:>12.0}",
            array.train,
            kv.train,
            kv.train / array.train,
            array.bytes_per_row,
            kv.bytes_per_row
        );
    }
    Ok(())
}

/// One key-value table (dim 16, Adagrad) fed batches of 26 x batch_size
/// keys from an id space that keeps growing (three in four keys never seen
/// before, the rest recent), until `growth_keys` distinct keys have come,
/// with `growth_capacity` bounding its rows: lookups+updates per second,
/// rows held, evictions and the process's peak memory.
fn key_value_growth(args: &Args) -> anyhow::Result<()> {
    use rustrec::config::feature_plan::{EmbeddingInit, KeyValueSpec};
    use rustrec::config::train_plan::OptimizerKind;
    use rustrec::embedding::{apply_rows, RowGrads, Sharding, Storage, Table};
    let kind = OptimizerKind::Adagrad {
        initial_accumulator: 0.1,
    };
    let spec = KeyValueSpec {
        filter_freq: 0,
        steps_to_live: 0,
        max_capacity: args.growth_capacity,
    };
    let dim = 16;
    let mut table = Table::key_value(
        ("growth", dim),
        spec,
        (&EmbeddingInit::Default, 1),
        (0, &kind),
        Sharding::Replicated,
    );
    let rule = rustrec::optim::Rule {
        kind: kind.clone(),
        lr: 0.05,
        t: 1,
    };
    let per_step = 26 * args.batch_size as u64;
    let mut next_new = 0u64;
    let mut rng = rustrec::util::Rng::new(3);
    let (mut lookups, mut step) = (0u64, 0u64);
    let grad = vec![0.01f32; dim];
    let t = Instant::now();
    while next_new < args.growth_keys {
        let mut keys: Vec<u64> = (0..per_step)
            .map(|i| {
                if i % 4 != 0 || next_new == 0 {
                    next_new += 1;
                    rustrec::util::mix64(next_new)
                } else {
                    // a recent key
                    rustrec::util::mix64(next_new - rng.below(next_new.min(per_step * 8)))
                }
            })
            .collect();
        lookups += keys.len() as u64;
        keys.sort_unstable();
        keys.dedup();
        table.admit(&keys, step);
        let mut grads = RowGrads::default();
        for k in &keys {
            grads.add(*k, &grad);
        }
        apply_rows(&mut table, &grads, &rule, 1.0);
        step += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let Storage::KeyValue(kv) = &table.storage else {
        unreachable!("a key-value table")
    };
    println!(
        "key-value growth: {} keys over {step} steps into at most {} rows: {:.2}M lookups+updates/s, {} rows held, \
         {} evicted by capacity, {:.0} bytes/row, peak {:.0} MiB",
        next_new,
        args.growth_capacity,
        lookups as f64 / secs / 1e6,
        kv.len(),
        kv.evicted.capacity,
        table.held().1 as f64 / kv.len().max(1) as f64,
        peak_mb()
    );
    Ok(())
}

/// The side of the square products `gemm_peak` times.
const PEAK_N: usize = 1024;

/// The machine's fp32 matrix-product peak in GFLOP/s on the compute
/// pool's threads: the best of several square products through the
/// executor's own kernel (gemm, which picks its kernels by CPU feature).
fn gemm_peak() -> f64 {
    use rustrec::model::exec::cpu::kernels::matmul;
    let n = PEAK_N;
    let mut rng = rustrec::util::Rng::new(5);
    let a: Vec<f32> = (0..n * n).map(|_| rng.uniform() as f32).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rng.uniform() as f32).collect();
    let mut c = vec![0.0f32; n * n];
    matmul(&mut c, &a, false, &b, false, (n, n, n), false);
    let best = (0..10)
        .map(|_| {
            let t = Instant::now();
            matmul(&mut c, &a, false, &b, false, (n, n, n), false);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    2.0 * (n * n * n) as f64 / best / 1e9
}

/// Each model's step, phase by phase, against the machine's GEMM peak.
/// The peak is measured before and after the models (the best of both:
/// a machine's noise only ever lowers it), so the reports follow them.
fn profile_models(data: &Path, args: &Args) -> anyhow::Result<()> {
    let before = gemm_peak();
    let mut measured = Vec::new();
    for model in &args.models {
        let profile = Arc::new(Profile::default());
        let text = config(model, data, args.batch_size, args.cap);
        let m = measure_config(model, &text, args, Some(&profile))?;
        measured.push((model, m, profile.entries()));
    }
    let after = gemm_peak();
    let peak = before.max(after);
    println!(
        "per-phase account: {} ({}), {} threads, batch {}, {} timed steps; matrix products by {}; fp32 GEMM peak \
         {peak:.1} GFLOP/s (the best {n}x{n} product on all threads through them; {before:.1} before the models, \
         {after:.1} after)",
        cpu_model(),
        cpu_isa(),
        args.threads,
        args.batch_size,
        args.steps,
        kernels().describe(),
        n = PEAK_N
    );
    for (model, m, entries) in measured {
        println!(
            "\n{model}: {:.1} ms a step, {:.0} samples/s",
            m.step_secs * 1e3,
            m.train
        );
        print!("{}", report(&entries, args.steps as u64, m.step_secs, peak));
        // The prefetch thread's work overlaps the step but shares its cores.
        let input_secs = args.batch_size as f64 / m.input;
        println!(
            "  input pipeline alone (reading, encoding): {:.1} ms a batch on its own thread, overlapped with the \
             step: {:.0}% of one of the {} cores while it trains",
            input_secs * 1e3,
            100.0 * input_secs / m.step_secs,
            args.threads
        );
    }
    Ok(())
}

/// Global samples/s and bytes sent per sample (summed over ranks) of
/// sharded training on every rank of `comm`.
fn measure_distributed(
    model: &str,
    data: &Path,
    args: &Args,
    comm: Rc<dyn Communicator>,
) -> anyhow::Result<(f64, f64)> {
    let path = args.data_dir.join(format!("{model}.dist.config"));
    if comm.rank() == 0 {
        std::fs::write(&path, config(model, data, args.batch_size / comm.size(), args.cap))?;
    }
    comm.barrier();
    let loaded = load_pipeline(&path, &Overrides::default())?;
    let mut plan = TrainingPlan::from_config(&loaded.config)?;
    plan.train.strategy = Strategy::EmbeddingParallel;
    let mut trainer = Trainer::with_comm(plan, comm.clone())?;
    let paths = trainer.plan.data.train_paths.clone();
    let mut stream = trainer.stream(&paths, true, 0)?;
    for _ in 0..3 {
        let b = stream.next().context("data ran out")??;
        trainer.train_step(&b)?;
    }
    comm.barrier();
    let (t, sent0) = (Instant::now(), comm.bytes_sent());
    for _ in 0..args.steps {
        let b = stream.next().context("data ran out")??;
        trainer.train_step(&b)?;
    }
    comm.barrier();
    let secs = t.elapsed().as_secs_f64();
    let mut bytes = [(comm.bytes_sent() - sent0) as f64];
    comm.all_reduce_sum(&mut bytes);
    let samples = (args.steps * (args.batch_size / comm.size()) * comm.size()) as f64;
    Ok((samples / secs, bytes[0] / samples))
}

fn run(args: &Args) -> anyhow::Result<()> {
    rustrec::util::compute_on_this_thread(Some(args.threads)).context("cannot size the thread pool")?;
    std::fs::create_dir_all(&args.data_dir)?;
    let data = args.data_dir.join(format!("criteo_{}_{}.parquet", args.rows, args.cap));
    if args.distributed {
        let comm = rustrec::dist::init()?;
        anyhow::ensure!(
            data.exists(),
            "{} is missing: run bench without --distributed first",
            data.display()
        );
        for model in args.models.iter().map(String::as_str) {
            let (rate, bytes) = measure_distributed(model, &data, args, comm.clone())?;
            if comm.rank() == 0 {
                println!(
                    "{model:<12} np={} sharded, {} thread(s) each: {rate:.0} samples/s, {bytes:.0} bytes exchanged per sample",
                    comm.size(),
                    args.threads
                );
            }
        }
        return Ok(());
    }
    if !data.exists() {
        let tmp = data.with_extension("tmp");
        let spec = GenSpec {
            rows: args.rows,
            cap: args.cap,
            seed: 1,
            model_seed: 7,
            row_group_rows: 65_536,
        };
        generate(&tmp, &spec)?;
        std::fs::rename(&tmp, &data)?;
    }
    if args.incremental {
        return incremental_versus_none(&data, args);
    }
    if let Some(url) = &args.remote {
        return remote_versus_local(&data, url, args);
    }
    if args.profile {
        return profile_models(&data, args);
    }
    if args.key_value {
        key_value_versus_arrays(&data, args)?;
        return key_value_growth(args);
    }
    if args.device != ExecutorKind::Cpu && !args.json {
        return device_versus_cpu(&data, args);
    }
    if args.json {
        for model in &args.models {
            let m = measure(model, &data, args)?;
            println!(
                "{}",
                serde_json::json!({
                    "stack": "rustrec",
                    "model": model,
                    "samples_per_sec": m.train,
                    "input_samples_per_sec": m.input,
                    "table_rows": m.table_rows,
                    "peak_mb": peak_mb(),
                    "isa": cpu_isa(),
                    "kernels": kernels().describe(),
                    "device": format!("{:?}", args.device).to_lowercase(),
                })
            );
        }
        return Ok(());
    }
    println!(
        "{} ({}; matrix products by {}): threads {}, batch {}, {} timed steps, tables capped at {} rows",
        cpu_model(),
        cpu_isa(),
        kernels().describe(),
        args.threads,
        args.batch_size,
        args.steps,
        args.cap
    );
    println!(
        "{:<12} {:>12} {:>14} {:>16} {:>12}",
        "model", "table rows", "train samp/s", "input samp/s", "train/input"
    );
    for model in &args.models {
        let m = measure(model, &data, args)?;
        println!(
            "{model:<12} {:>12} {:>14.0} {:>16.0} {:>12.3}",
            m.table_rows,
            m.train,
            m.input,
            m.train / m.input
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    rustrec::util::keep_freed_memory();
    // Warnings (an unknown RUSTREC_MATMUL, say) beside the report.
    rustrec::logging::init_at(log::LevelFilter::Warn);
    let args: Args = match rustrec::cli::tool_args() {
        Ok(args) => args,
        Err(code) => return code,
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
