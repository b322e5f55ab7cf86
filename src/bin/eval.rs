use std::process::ExitCode;

fn main() -> ExitCode {
    rustrec::cli::main_computing(rustrec::cli::commands::eval)
}
