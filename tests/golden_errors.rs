//! Golden tests: each tests/data/bad/NAME.config must make train_eval exit
//! with code 1 and print exactly NAME.stderr. Files named train_* run a
//! training start (support checks); the others `--print_config`.
//! Set RUSTREC_BLESS=1 to rewrite the .stderr files after a deliberate change.

use std::path::Path;
use std::process::Command;

#[test]
fn malformed_configs_give_their_golden_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "config"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 10,
        "expected at least 10 malformed configs, found {}",
        cases.len()
    );
    let bless = std::env::var_os("RUSTREC_BLESS").is_some();
    let mut failures = Vec::new();
    for case in cases {
        let name = case.file_name().unwrap().to_str().unwrap().to_string();
        let stem = name.trim_end_matches(".config");
        let model_dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_train_eval"));
        cmd.current_dir(&dir).args(["--pipeline_config_path", &name]);
        if !stem.starts_with("train_") {
            cmd.arg("--print_config");
        } else {
            cmd.args(["--model_dir", model_dir.path().to_str().unwrap()]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        let golden = dir.join(format!("{stem}.stderr"));
        if bless {
            std::fs::write(&golden, &stderr).unwrap();
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        if out.status.code() != Some(1) || stderr != want || !out.stdout.is_empty() {
            failures.push(format!(
                "{name}: exit {:?}\n got: {stderr}want: {want}",
                out.status.code()
            ));
        }
        if stem.starts_with("train_") {
            assert!(
                !model_dir.path().join("pipeline.config").exists(),
                "{name}: a rejected config must not write pipeline.config"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
