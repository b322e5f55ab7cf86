//! Command-line front ends of the binaries, with EasyRec's flag names.
//! `src/bin/*.rs` only call `main_with` with their run function.

pub mod commands;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::config::{overrides, Overrides};

/// An error the user can fix (bad flags, bad config, bad data): exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UserError(pub String);

/// An error of a step whose every failure is the user's to fix (setting
/// up a job from a checked config, loading what they named): exit code 1,
/// its message and its whole cause chain kept as they are.
#[derive(Debug)]
pub struct UserFault(pub anyhow::Error);

impl std::fmt::Display for UserFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl crate::error::Classified for UserError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

impl crate::error::Classified for UserFault {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

impl std::error::Error for UserFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// `--device`, shared by the binaries that run a model's graph.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArg {
    /// Where the model's dense part runs: cpu (the default) or gpu (a build with
    /// the cargo feature `gpu`: burn's wgpu runtime on Vulkan; under mpirun each
    /// rank of a host takes its own discrete GPU). Embedding tables stay on the host (train_eval's
    /// --device_table_rows keeps small ones on the GPU).
    #[arg(long = "device", default_value = "cpu", value_name = "cpu|gpu", value_parser = crate::model::ExecutorKind::parse)]
    pub kind: crate::model::ExecutorKind,
}

/// Flags shared by all binaries that read a pipeline config.
#[derive(Debug, Clone, clap::Args)]
#[command(rename_all = "snake_case")]
pub struct ConfigArgs {
    /// Path to the EasyRec pipeline config (text proto, or JSON for .json files).
    #[arg(long, value_name = "PATH")]
    pub pipeline_config_path: PathBuf,
    /// Overrides model_dir of the config.
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<String>,
    /// JSON object of config edits, e.g. '{"train_config.num_steps": 10}'.
    #[arg(long, value_name = "JSON")]
    pub edit_config_json: Option<String>,
}

#[derive(Debug, Parser)]
#[command(
    name = "train_eval",
    rename_all = "snake_case",
    about = "Train (and evaluate) a model described by an EasyRec pipeline config",
    after_help = "Config fields can also be set as --train_config.num_steps=10 or --train_config.num_steps 10 \
                  (prefixes: data_config, train_config, feature_config, model_config, export_config, eval_config)."
)]
pub struct TrainEvalArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Resume from the latest checkpoint in model_dir.
    #[arg(long)]
    pub continue_train: bool,
    /// Overrides the training input (several paths or globs allowed).
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub train_input_path: Vec<String>,
    /// Overrides the evaluation input.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub eval_input_path: Vec<String>,
    /// Checkpoint (or directory: its latest checkpoint) to initialise from.
    #[arg(long, value_name = "PATH")]
    pub fine_tune_checkpoint: Option<String>,
    /// Skip up to N batches whose loss or gradient is not finite (their update is
    /// dropped, with a warning naming the step) before stopping; 0 stops at the first.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub skip_nonfinite_batches: u64,
    /// Warn when the averaged loss grows past F times its first step's (floored
    /// at 1): the model is diverging though finite. 0 turns the check off.
    #[arg(long, default_value_t = crate::train::divergence::DEFAULT_FACTOR, value_name = "F")]
    pub divergence_factor: f64,
    /// Stop (exit 1, nothing saved at that step) where --divergence_factor warns.
    #[arg(long)]
    pub stop_on_divergence: bool,
    /// Asynchronous training under mpirun (sync_replicas: false, or PSStrategy):
    /// how many of the ranks are parameter servers (the first N); default one per
    /// four ranks, at least one. The others are workers.
    #[arg(long, value_name = "N")]
    pub num_ps: Option<usize>,
    /// Asynchronous training: a push that more than N other pushes overtook since
    /// its pull is dropped (counted and logged); default 4 per worker.
    #[arg(long, value_name = "N")]
    pub max_staleness: Option<u64>,
    /// Benches only: WORKER:MILLISECONDS slows that worker (its rank, or under
    /// asynchronous training its index among the workers) down by sleeping after
    /// each of its steps.
    #[arg(long, value_name = "WORKER:MS", hide = true, value_parser = parse_straggler)]
    pub straggler: Option<(usize, u64)>,
    /// Seeds initial weights, dropout, shuffling and sampled negatives (EasyRec's
    /// config has no field for it); also read from RUSTREC_SEED. Checkpoints
    /// record it and --continue_train goes on with the checkpoint's.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub device: DeviceArg,
    /// With --device gpu: embedding tables of at most N rows are kept and trained
    /// on the GPU beside the dense part (lookups, pooling and their sparse updates
    /// there), when held whole by every rank (not sharded, not ev_params) and not
    /// frozen; under several ranks not with embedding_regularization. 0 (the
    /// default) keeps every table on the host.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device_table_rows: usize,
    /// Print the effective config (after all overrides) as text proto and exit.
    #[arg(long)]
    pub print_config: bool,
}

fn parse_straggler(s: &str) -> Result<(usize, u64), String> {
    let (w, ms) = s.split_once(':').ok_or("expected WORKER:MILLISECONDS")?;
    Ok((
        w.parse().map_err(|e| format!("worker {w:?}: {e}"))?,
        ms.parse().map_err(|e| format!("milliseconds {ms:?}: {e}"))?,
    ))
}

#[derive(Debug, Parser)]
#[command(
    name = "eval",
    rename_all = "snake_case",
    about = "Evaluate a checkpoint of an EasyRec pipeline config"
)]
pub struct EvalArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Checkpoint to evaluate (ours, or EasyRec's `.../model.ckpt-N`); default:
    /// the latest in model_dir.
    #[arg(long, value_name = "PATH")]
    pub checkpoint_path: Option<String>,
    #[command(flatten)]
    pub device: DeviceArg,
    /// Overrides the evaluation input.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub eval_input_path: Vec<String>,
    /// File name (inside model_dir) for the metrics JSON.
    #[arg(long, default_value = "eval_result.txt", value_name = "FILE")]
    pub eval_result_path: String,
}

#[derive(Debug, Parser)]
#[command(
    name = "export",
    rename_all = "snake_case",
    about = "Export a trained model for serving (ONNX)"
)]
pub struct ExportArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Directory that receives <timestamp>/ with the exported model.
    #[arg(long, value_name = "DIR")]
    pub export_dir: PathBuf,
    /// Checkpoint to export (ours, or EasyRec's `.../model.ckpt-N`); default:
    /// the latest in model_dir.
    #[arg(long, value_name = "PATH")]
    pub checkpoint_path: Option<String>,
    /// Extra files copied into the export's assets.
    #[arg(long, value_delimiter = ',', value_name = "FILES")]
    pub asset_files: Vec<String>,
}

#[derive(Debug, Parser)]
#[command(
    name = "predict",
    rename_all = "snake_case",
    about = "Score Parquet or CSV rows with a checkpoint or an export directory"
)]
pub struct PredictArgs {
    /// An export directory (or a directory of <timestamp>/ exports: the newest).
    #[arg(long, value_name = "DIR")]
    pub saved_model_dir: Option<PathBuf>,
    /// Score with a checkpoint of this pipeline config instead.
    #[arg(long, value_name = "PATH")]
    pub pipeline_config_path: Option<PathBuf>,
    /// Overrides model_dir of the config.
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<String>,
    /// JSON object of config edits.
    #[arg(long, value_name = "JSON")]
    pub edit_config_json: Option<String>,
    /// Checkpoint to score with (ours, or EasyRec's `.../model.ckpt-N`); default:
    /// the latest in model_dir.
    #[arg(long, value_name = "PATH")]
    pub checkpoint_path: Option<String>,
    #[command(flatten)]
    pub device: DeviceArg,
    /// Input files (Parquet or CSV as data_config says; globs allowed).
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub input_path: Vec<String>,
    /// Output file: Parquet when it ends in .parquet, CSV otherwise.
    #[arg(long, value_name = "PATH")]
    pub output_path: PathBuf,
    /// Input columns copied to the output (ALL_COLUMNS for every input field).
    #[arg(long, value_delimiter = ',', value_name = "COLS")]
    pub reserved_cols: Vec<String>,
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = parse_positive)]
    pub batch_size: usize,
}

/// A count that must be at least 1 (a batch of no rows scores nothing).
fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "serve",
    rename_all = "snake_case",
    about = "Answer scoring requests over HTTP (TF Serving REST, KServe v2) with the newest export"
)]
pub struct ServeArgs {
    /// A directory of <version>/ exports (export_dir; the newest is served and
    /// newer ones are swapped in as they appear), or one export directory.
    #[arg(long, alias = "model_base_path", value_name = "DIR")]
    pub model_dir: PathBuf,
    /// The name in request paths (/v1/models/NAME:predict).
    #[arg(long, default_value = "model", value_name = "NAME")]
    pub model_name: String,
    /// The HTTP port (0: any free port, printed when listening).
    #[arg(long, alias = "rest_api_port", default_value_t = 8501, value_name = "PORT")]
    pub port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0", value_name = "IP")]
    pub host: std::net::IpAddr,
    /// Merge concurrent requests into one model run.
    #[arg(long)]
    pub enable_batching: bool,
    /// With batching: the most rows merged into one run.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_batch_size: usize,
    /// With batching: how long the first request of a batch waits for others.
    #[arg(long, default_value_t = 1000, value_name = "US")]
    pub batch_timeout_micros: u64,
    /// Threads that run the model (default: the number of cores).
    #[arg(long, value_name = "N")]
    pub num_batch_threads: Option<usize>,
    /// Seconds between checks for a new version (0: never reload).
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub file_system_poll_wait_seconds: f64,
    /// Request bodies larger than this are refused (413).
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    pub max_request_bytes: usize,
    /// The gRPC port (TF Serving's PredictionService and ModelService,
    /// KServe v2's GRPCInferenceService; 0: any free port, printed when
    /// listening). No gRPC unless given; TF Serving's convention is 8500.
    #[arg(long, value_name = "PORT")]
    pub grpc_port: Option<u16>,
    /// How many of the newest loadable versions are served at once (TF
    /// Serving's `latest { num_versions }` version policy).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub num_versions: usize,
    /// Names for versions, as TF Serving's `version_labels`:
    /// `stable=1700000000,canary=1700000500`; asked for with
    /// /v1/models/NAME/labels/LABEL or a gRPC `version_label`.
    #[arg(long, value_name = "LABEL=VERSION,...")]
    pub version_labels: Option<String>,
}

#[derive(Debug, Parser)]
#[command(
    name = "inspect_checkpoint",
    rename_all = "snake_case",
    about = "List a checkpoint's variables and shapes"
)]
pub struct InspectArgs {
    /// A model.ckpt-N directory, or a model_dir (its latest checkpoint); or
    /// a TensorFlow (EasyRec) checkpoint prefix `.../model.ckpt-N`.
    #[arg(long, value_name = "PATH")]
    pub checkpoint_path: String,
    /// Also list optimizer slots (accumulators, moments).
    #[arg(long)]
    pub all_tensors: bool,
}

/// Parses a command line whose extend args (`--train_config.x=1`) are split
/// out first, as EasyRec does with argparse's `parse_known_args`.
pub fn parse_with_extend_args<T: Parser>(args: Vec<OsString>) -> Result<(T, overrides::EditPairs), anyhow::Error> {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| UserError(format!("argument is not valid UTF-8: {a:?}")))
        })
        .collect::<Result<_, _>>()?;
    let (pairs, rest) = overrides::split_extend_args(&args)?;
    let parsed = T::try_parse_from(rest)?;
    Ok((parsed, pairs))
}

impl ConfigArgs {
    pub fn overrides(&self, extend_args: overrides::EditPairs) -> Overrides {
        Overrides {
            model_dir: self.model_dir.clone(),
            edit_config_json: self.edit_config_json.clone(),
            extend_args,
            ..Overrides::default()
        }
    }
}

/// A tool binary's flags (`bench`, `gen_data`, `prep_movielens`), or the
/// exit code its command line ends with (`clap_exit`, as in `main_with`).
pub fn tool_args<T: Parser>() -> Result<T, ExitCode> {
    T::try_parse().map_err(|e| clap_exit(&e))
}

/// Prints clap's message (a refused flag, `--help`, `--version`) and gives
/// the exit code it ends with: 1 for a refused flag or value (the user's
/// error; clap's own exit code 2 is this project's internal error), 0 for
/// help and version.
fn clap_exit(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `main_with` for a binary whose main thread does the computing (training,
/// evaluation, export, prediction): that thread joins rayon's pool first
/// (`util::compute_on_this_thread`).
pub fn main_computing(run: impl FnOnce(Vec<OsString>) -> anyhow::Result<()>) -> ExitCode {
    // Nothing ran on the pool yet, so it cannot have been set up; were it,
    // the binary would work as before, handing work to it.
    let _ = crate::util::compute_on_this_thread(None);
    main_with(run)
}

/// Runs a binary: prints the whole error chain and maps errors to exit codes
/// (0 ok, 1 user error, 2 internal error). Help and version go to stdout.
/// A panic is a bug: its message is printed and the exit code is 2.
pub fn main_with(run: impl FnOnce(Vec<OsString>) -> anyhow::Result<()>) -> ExitCode {
    crate::util::keep_freed_memory();
    crate::logging::init();
    let args = std::env::args_os().collect();
    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(args))) {
        Ok(result) => result,
        Err(_) => {
            crate::logging::write_line(&format!(
                "{}error: internal error (a bug in rustrec); please report it with the message above\n",
                crate::logging::rank_prefix()
            ));
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(clap_err) = err.downcast_ref::<clap::Error>() {
                return clap_exit(clap_err);
            }
            crate::logging::write_line(&format!("{}error: {err:#}\n", crate::logging::rank_prefix()));
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The exit code of an error, from the kinds in its chain: the user's
/// config, flags, data or checkpoint, a model that diverged, or the file
/// system refusing (a missing file, no permission, a full disk) is exit 1;
/// anything else is an internal error, exit 2.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    fault_of(err).exit_code()
}

/// Asks `e` for its fault if its type is one of the layers' error types.
/// Each layer has one error type (or one per kind of failure it reports
/// apart); a new layer's type is added here once.
fn classify(e: &(dyn std::error::Error + 'static)) -> Option<crate::error::Fault> {
    macro_rules! layers {
        ($($t:ty),* $(,)?) => {
            $(if let Some(x) = e.downcast_ref::<$t>() {
                return Some(crate::error::Classified::fault(x));
            })*
        };
    }
    layers!(
        crate::cli::UserError,
        crate::cli::UserFault,
        crate::config::ConfigError,
        crate::data::DataError,
        crate::features::EncodeError,
        crate::checkpoint::Unusable,
        crate::train::step::Diverged,
        crate::dist::Disagreement,
        crate::serve::ServeError,
        crate::output::OutputError,
        crate::predict::PredictError,
        crate::model::exec::DeviceError,
        std::io::Error,
    );
    None
}

/// The fault of the outermost classified error of `err`'s cause chain:
/// a layer that wraps a cause decides for it.
pub fn fault_of(err: &anyhow::Error) -> crate::error::Fault {
    err.chain().find_map(classify).unwrap_or(crate::error::Fault::Internal)
}

#[cfg(test)]
mod fault_tests {
    use super::*;
    use crate::error::Fault;
    use anyhow::Context;

    #[test]
    fn the_outermost_classified_cause_decides_and_unclassified_is_internal() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let wrapped = Err::<(), _>(io).context("reading x").context("loading y").unwrap_err();
        assert_eq!(fault_of(&wrapped), Fault::User);
        assert_eq!(fault_of(&anyhow::anyhow!("index out of range")), Fault::Internal);
        let data = anyhow::Error::from(crate::data::DataError::NoFiles("*.csv".into())).context("train input");
        assert_eq!(fault_of(&data).exit_code(), 1);
    }
}
