//! Writes Criteo-shaped synthetic Parquet with a planted model and prints
//! the best reachable AUC.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rustrec::datagen::{generate, GenSpec};

#[derive(Debug, Parser)]
#[command(
    name = "gen_data",
    rename_all = "snake_case",
    about = "Generate Criteo-shaped Parquet with a planted model"
)]
struct Args {
    /// Output Parquet file.
    #[arg(long)]
    output: PathBuf,
    /// Number of rows.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Cap on every categorical cardinality (the Kaggle ones reach 10M).
    #[arg(long, default_value_t = 1_000_000)]
    cap: u64,
    /// Seed of the rows drawn (use different ones for train and eval files).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seed of the planted model (keep it equal for train and eval files).
    #[arg(long, default_value_t = 7)]
    model_seed: u64,
    #[arg(long, default_value_t = 65_536)]
    row_group_rows: usize,
}

fn main() -> ExitCode {
    let args: Args = match rustrec::cli::tool_args() {
        Ok(args) => args,
        Err(code) => return code,
    };
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: cannot create {}: {e}", dir.display());
            return ExitCode::from(1);
        }
    }
    let spec = GenSpec {
        rows: args.rows,
        cap: args.cap,
        seed: args.seed,
        model_seed: args.model_seed,
        row_group_rows: args.row_group_rows,
    };
    match generate(&args.output, &spec) {
        Ok(r) => {
            println!(
                "wrote {} rows to {}: positive rate {:.4}, planted-model AUC {:.4}",
                r.rows,
                args.output.display(),
                r.positive_rate,
                r.planted_auc
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
