//! Lists the variables of a checkpoint with their shapes, after verifying
//! every file against the manifest (like TensorFlow's inspect_checkpoint).
fn main() -> std::process::ExitCode {
    rustrec::cli::main_with(rustrec::cli::commands::inspect_checkpoint)
}
