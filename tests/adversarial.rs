//! Inputs an adversarial user (or a bad day) brings: crafted checkpoints,
//! impossible sizes, empty data, a second writer in a model_dir, leftovers
//! of a dead job. Each must end with exit 1, a message naming the field,
//! file or row, and nothing damaged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CSV: &str = "label,user,item,price\n1,u1,i1,1.5\n0,u2,i2,0.5\n1,u1,i3,2.0\n0,u3,i1,0.1\n";

/// A small WideAndDeep config over `data`, writing into `model_dir`.
fn config(dir: &Path, data: &Path, extra_feature: &str) -> PathBuf {
    let text = format!(
        r#"
train_input_path: "{data}"
eval_input_path: "{data}"
model_dir: "{model_dir}"
train_config {{
  optimizer_config {{ adam_optimizer {{ learning_rate {{ constant_learning_rate {{ learning_rate: 0.01 }} }} }} }}
  num_steps: 6
  save_checkpoints_steps: 3
}}
eval_config {{ metrics_set {{ auc {{}} }} }}
data_config {{
  input_type: CSVInput
  with_header: true
  batch_size: 2
  input_fields {{ input_name: "label" input_type: INT32 }}
  input_fields {{ input_name: "user" input_type: STRING }}
  input_fields {{ input_name: "item" input_type: STRING }}
  input_fields {{ input_name: "price" input_type: DOUBLE }}
  label_fields: "label"
}}
feature_config {{
  features {{ input_names: "user" feature_type: IdFeature embedding_dim: 4 hash_bucket_size: 100 }}
  features {{ input_names: "item" feature_type: IdFeature embedding_dim: 4 hash_bucket_size: 100 }}
  features {{ input_names: "price" feature_type: RawFeature }}
  {extra_feature}
}}
model_config {{
  model_class: "WideAndDeep"
  feature_groups {{ group_name: "wide" feature_names: ["user", "item"] wide_deep: WIDE }}
  feature_groups {{ group_name: "deep" feature_names: ["user", "item", "price"] wide_deep: DEEP }}
  wide_and_deep {{ dnn {{ hidden_units: [8, 4] }} }}
}}
"#,
        data = data.display(),
        model_dir = dir.join("model").display(),
    );
    let path = dir.join("pipeline.config");
    std::fs::write(&path, text).unwrap();
    path
}

struct Case {
    dir: tempfile::TempDir,
    cfg: PathBuf,
}

impl Case {
    fn new() -> Self {
        Self::with_data(CSV)
    }

    fn with_data(csv: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.csv");
        std::fs::write(&data, csv).unwrap();
        let cfg = config(dir.path(), &data, "");
        Case { dir, cfg }
    }

    fn model_dir(&self) -> PathBuf {
        self.dir.path().join("model")
    }

    fn run(&self, bin: &str, extra: &[&str]) -> Output {
        Command::new(bin)
            .arg("--pipeline_config_path")
            .arg(&self.cfg)
            .args(extra)
            .output()
            .unwrap()
    }

    fn train(&self, extra: &[&str]) -> Output {
        self.run(env!("CARGO_BIN_EXE_train_eval"), extra)
    }
}

/// Asserts exit 1 and that stderr mentions every one of `needles`.
fn user_error(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks `{n}`:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn ok(out: &Output) {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Rewrites one file of a checkpoint and its manifest entry, so that the
/// checksum matches: only the parser stands between the bytes and us.
fn replace_checkpoint_file(ckpt: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(ckpt.join(name), bytes).unwrap();
    let mpath = ckpt.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&mpath).unwrap()).unwrap();
    m["files"][name]["bytes"] = serde_json::json!(bytes.len());
    m["files"][name]["checksum"] =
        serde_json::json!(format!("{:016x}", rustrec::checkpoint::safetensors::checksum(bytes)));
    std::fs::write(&mpath, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn crafted_checkpoints_are_refused_without_a_panic() {
    let case = Case::new();
    ok(&case.train(&[]));
    let ckpt = case.model_dir().join("model.ckpt-6");
    let header = |h: &str| {
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(h.as_bytes());
        b
    };
    let mut huge_len = u64::MAX.to_le_bytes().to_vec();
    huge_len.extend_from_slice(b"{}");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("header length u64::MAX", huge_len),
        (
            "huge shape",
            header(r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#),
        ),
        (
            "offsets past the end",
            header(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}"#),
        ),
        ("not JSON", header("{{{{")),
        ("three bytes", vec![1, 2, 3]),
    ];
    for (what, bytes) in cases {
        replace_checkpoint_file(&ckpt, "dense.safetensors", &bytes);
        let inspect = Command::new(env!("CARGO_BIN_EXE_inspect_checkpoint"))
            .args(["--checkpoint_path", ckpt.to_str().unwrap()])
            .output()
            .unwrap();
        let msg = user_error(&inspect, &["dense.safetensors"]);
        assert!(!msg.is_empty(), "{what}");
        user_error(
            &case.train(&["--continue_train", "--train_config.num_steps=9"]),
            &["dense.safetensors", "model.ckpt-3", "is intact"],
        );
    }
}

#[test]
fn checkpoints_that_do_not_fit_are_user_errors() {
    let case = Case::new();
    // Nothing to evaluate yet: the missing checkpoint is named.
    let missing = case.dir.path().join("nowhere");
    user_error(
        &case.run(
            env!("CARGO_BIN_EXE_eval"),
            &["--checkpoint_path", missing.to_str().unwrap()],
        ),
        &["nowhere", "does not exist"],
    );
    ok(&case.train(&[]));
    // The same model_dir read with wider embeddings: the tensor is named.
    let out = case.run(
        env!("CARGO_BIN_EXE_eval"),
        &[
            "--edit_config_json",
            r#"{"feature_config.features[0].embedding_dim": 8}"#,
        ],
    );
    user_error(&out, &["has shape", "the model needs"]);
    // A TensorFlow checkpoint prefix as fine_tune_checkpoint.
    let tf = case.dir.path().join("tf/model.ckpt-100");
    std::fs::create_dir_all(tf.parent().unwrap()).unwrap();
    std::fs::write(tf.with_extension("ckpt-100.index"), b"").unwrap();
    let fresh = case.dir.path().join("fresh");
    user_error(
        &case.train(&[
            "--model_dir",
            fresh.to_str().unwrap(),
            "--fine_tune_checkpoint",
            tf.to_str().unwrap(),
        ]),
        &["TensorFlow checkpoint"],
    );
}

#[test]
fn an_unwritable_model_dir_is_a_user_error() {
    let case = Case::new();
    let file = case.dir.path().join("a_file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("model");
    user_error(
        &case.train(&["--model_dir", under_file.to_str().unwrap()]),
        &["a_file/model"],
    );
}

#[test]
fn impossible_sizes_name_their_field() {
    let case = Case::new();
    for (edit, field) in [
        (
            r#"{"feature_config.features[0].hash_bucket_size": 4000000000000}"#,
            "feature_config.features[0].hash_bucket_size",
        ),
        (
            r#"{"model_config.wide_and_deep.dnn.hidden_units": [8, 4000000000]}"#,
            "model_config.wide_and_deep.dnn.hidden_units[1]",
        ),
        (r#"{"data_config.batch_size": 4294967295}"#, "data_config.batch_size"),
    ] {
        let flag = edit;
        let out = case.train(&["--edit_config_json", edit]);
        user_error(&out, &[field, "of memory"]);
        assert!(!case.model_dir().join("pipeline.config").exists(), "{flag}");
    }
}

#[test]
fn empty_input_trains_nothing_and_writes_nothing() {
    let case = Case::with_data("label,user,item,price\n");
    user_error(&case.train(&[]), &["training input", "holds no rows"]);
    assert!(!case.model_dir().join("checkpoint").exists());
    assert!(std::fs::read_dir(case.model_dir()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("model.ckpt")));
}

#[test]
fn one_job_per_model_dir() {
    let case = Case::new();
    // Another process's lock (this test's) keeps a training job out.
    let held = rustrec::checkpoint::lock_model_dir(&case.model_dir()).unwrap();
    let out = case.train(&[]);
    user_error(
        &out,
        &["in use by another training job", &format!("pid {}", std::process::id())],
    );
    assert!(!case.model_dir().join("pipeline.config").exists());
    drop(held);
    ok(&case.train(&[]));

    // A real second writer beside a running job: refused, and the running
    // job's checkpoints stay whole.
    let mut first = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .arg("--pipeline_config_path")
        .arg(&case.cfg)
        .args([
            "--continue_train",
            "--train_config.num_steps=100000000",
            "--train_config.save_checkpoints_steps=50",
            "--data_config.num_epochs=0",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = std::time::Instant::now();
    while rustrec::checkpoint::list(&case.model_dir()).unwrap().last() <= Some(&6) {
        assert!(wait_for.elapsed().as_secs() < 120, "the first job wrote no checkpoint");
        assert!(first.try_wait().unwrap().is_none(), "the first job ended early");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = case.train(&["--continue_train", "--train_config.num_steps=100000000"]);
    let still_running = first.try_wait().unwrap().is_none();
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(still_running, "the first job ended before the second started");
    user_error(&second, &["in use by another training job"]);
    let latest = rustrec::checkpoint::latest(&case.model_dir()).unwrap().unwrap();
    rustrec::checkpoint::load(&latest).unwrap();
}

#[test]
fn leftovers_of_a_dead_job_are_removed_at_start() {
    let case = Case::new();
    ok(&case.train(&[]));
    // What a job killed (or out of disk) mid-save leaves behind.
    let staged = case.model_dir().join(".model.ckpt-9.tmp");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("dense.safetensors"), b"half").unwrap();
    std::fs::write(case.model_dir().join("checkpoint.tmp-12345"), b"half").unwrap();
    ok(&case.train(&["--continue_train", "--train_config.num_steps=9"]));
    assert!(!staged.exists());
    assert!(!case.model_dir().join("checkpoint.tmp-12345").exists());
    assert!(case.model_dir().join("model.ckpt-9/manifest.json").is_file());
}

#[test]
fn a_byte_order_mark_is_read_and_a_short_row_is_named() {
    let case = Case::new();
    let text = std::fs::read_to_string(&case.cfg).unwrap();
    std::fs::write(&case.cfg, format!("\u{feff}{text}")).unwrap();
    ok(&case.train(&["--print_config"]));
    let short = Case::with_data("label,user,item,price\n1,u1,i1,1.5\n0,u2\n");
    let msg = user_error(
        &short.train(&[]),
        &["data.csv: line 3: 2 fields, but the header line declares 4"],
    );
    assert!(!msg.contains("column ``"), "{msg}");
}

#[test]
fn non_finite_values_are_refused_alike_by_training_and_both_scoring_paths() {
    let case = Case::new();
    ok(&case.train(&[]));
    let export_dir = case.dir.path().join("export");
    ok(&case.run(
        env!("CARGO_BIN_EXE_export"),
        &["--export_dir", export_dir.to_str().unwrap()],
    ));
    for bad in ["nan", "inf", "-inf"] {
        let data = case.dir.path().join(format!("{bad}.csv"));
        std::fs::write(&data, format!("label,user,item,price\n1,u1,i1,1.5\n0,u2,i2,{bad}\n")).unwrap();
        let fresh = case.dir.path().join(format!("model_{bad}"));
        user_error(
            &case.train(&[
                "--model_dir",
                fresh.to_str().unwrap(),
                "--train_input_path",
                data.to_str().unwrap(),
            ]),
            &["price", "not a finite number"],
        );
        assert!(!fresh.join("checkpoint").exists());
        let out = case.dir.path().join("scores.csv");
        let predict = |source: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_predict"))
                .args(source)
                .args([
                    "--input_path",
                    data.to_str().unwrap(),
                    "--output_path",
                    out.to_str().unwrap(),
                ])
                .output()
                .unwrap()
        };
        user_error(
            &predict(&["--pipeline_config_path", case.cfg.to_str().unwrap()]),
            &["price", "not a finite number"],
        );
        user_error(
            &predict(&["--saved_model_dir", export_dir.to_str().unwrap()]),
            &["price", "not a finite number"],
        );
        assert!(!out.exists());
    }
}
