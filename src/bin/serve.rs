use std::process::ExitCode;

fn main() -> ExitCode {
    rustrec::cli::main_with(rustrec::cli::commands::serve)
}
