//! Turns MovieLens-100k into train/eval CSVs for a CTR task (rating >= 4 is a
//! click), joined with user and item attributes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rustrec::datagen::prepare_movielens;

#[derive(Debug, Parser)]
#[command(
    name = "prep_movielens",
    rename_all = "snake_case",
    about = "Build a CTR data set from MovieLens-100k"
)]
struct Args {
    /// Directory holding ml-100k.inter, ml-100k.user and ml-100k.item.
    #[arg(long)]
    input: PathBuf,
    /// Output directory; train.csv and eval.csv are written there.
    #[arg(long)]
    output: PathBuf,
    /// Share of the ratings that go to eval.csv.
    #[arg(long, default_value_t = 0.2)]
    eval_fraction: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Split by time instead of at random: eval.csv holds the last
    /// --eval_fraction of the ratings in time, and both files are in time
    /// order (a stream to replay).
    #[arg(long)]
    by_time: bool,
}

fn main() -> ExitCode {
    let args: Args = match rustrec::cli::tool_args() {
        Ok(args) => args,
        Err(code) => return code,
    };
    let prepared = if args.by_time {
        rustrec::datagen::prepare_movielens_by_time(&args.input, &args.output, args.eval_fraction)
    } else {
        prepare_movielens(&args.input, &args.output, args.eval_fraction, args.seed)
    };
    match prepared {
        Ok(r) => {
            println!(
                "wrote {} train and {} eval rows to {}: positive rate {:.4}",
                r.train_rows,
                r.eval_rows,
                args.output.display(),
                r.positive_rate
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
