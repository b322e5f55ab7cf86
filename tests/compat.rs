//! Parity with TensorFlow and EasyRec on facts computed by them (in the
//! shared `data/compat` folder).

mod common;

use rustrec::features::{hash_bucket_i64, hash_bucket_str};

/// `hash_bucket_size` ids land in the rows TensorFlow's
/// string_to_hash_bucket_fast puts them in: strings, and integers through
/// their decimal text.
#[test]
fn hashed_ids_match_tensorflow_buckets() {
    let path = common::shared_dir().join("data/compat/tf_hash_buckets.json");
    let facts: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = facts["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for c in cases {
        let n = c["num_buckets"].as_u64().unwrap();
        let want = c["bucket"].as_u64().unwrap();
        let (what, got) = match (c["input"].as_str(), c["input_int64"].as_i64()) {
            (Some(s), _) => (format!("{s:?}"), hash_bucket_str(s, n)),
            (None, Some(v)) => (format!("int64 {v}"), hash_bucket_i64(v, n)),
            _ => panic!("case without input: {c}"),
        };
        if got != want {
            wrong.push(format!("{what} mod {n}: {got}, TensorFlow {want}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// ComboFeature ids are TensorFlow's crossed-column hashes (vectors
/// computed with TensorFlow's SparseCrossHashed in tests/data).
#[test]
fn combo_crosses_match_tensorflow() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tf_cross_hashes.json");
    let facts: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = facts["cases"].as_array().unwrap();
    assert!(cases.len() >= 7);
    for c in cases {
        let parts: Vec<Vec<String>> = c["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect()
            })
            .collect();
        let n = c["num_buckets"].as_u64().unwrap();
        let mut got = Vec::new();
        rustrec::features::cross(&parts, n, "", &mut got);
        got.sort_unstable();
        let want: Vec<u64> = c["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "{parts:?} mod {n}");
        // The whole 64-bit hash, as TensorFlow reports it without buckets.
        let mut raw = Vec::new();
        rustrec::features::cross(&parts, u64::MAX, "", &mut raw);
        let mut raw: Vec<String> = raw.iter().map(|h| (h % (i64::MAX as u64)).to_string()).collect();
        raw.sort();
        let mut want: Vec<String> = c["hashes_mod_int64_max"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        want.sort();
        assert_eq!(raw, want, "{parts:?}");
    }
}

// ---- EasyRec's checkpoints (shared `data/compat/easyrec_ckpt`) ----

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURES: [&str; 9] = [
    "wide_and_deep",
    "deepfm",
    "fm",
    "dlrm",
    "dcn",
    "multi_tower",
    "mmoe",
    "dbmtl",
    "multi_loss",
];

/// Where fixture `name` lives: the shared set, or this repository's
/// `tests/data/easyrec_<name>` for those made here the same way.
fn fixture_dir(name: &str) -> PathBuf {
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/easyrec_{name}"));
    if own.is_dir() {
        own
    } else {
        common::shared_dir().join("data/compat/easyrec_ckpt").join(name)
    }
}

/// A writable copy of fixture `name` (its config names its files
/// relative to the folder it runs in).
fn fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = fixture_dir(name);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    copy_dir(&src, &dir);
    (tmp, dir)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
            let mut perm = std::fs::metadata(&dst).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&dst, perm).unwrap();
        }
    }
}

fn run(bin: &str, dir: &Path, args: &[&str]) -> Output {
    Command::new(bin).current_dir(dir).args(args).output().unwrap()
}

fn csv_rows(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().split(',').map(str::to_string).collect();
    (
        header,
        lines.map(|l| l.split(',').map(str::to_string).collect()).collect(),
    )
}

fn column(path: &Path, name: &str) -> Vec<f64> {
    let (h, rows) = csv_rows(path);
    let c = h
        .iter()
        .position(|x| x == name)
        .unwrap_or_else(|| panic!("{} has no column {name}", path.display()));
    rows.iter().map(|r| r[c].parse().unwrap()).collect()
}

/// Exact (rank) AUC, ties counted half.
fn rank_auc(labels: &[f64], scores: &[f64]) -> f64 {
    let (mut pos, mut neg) = (0.0, 0.0);
    let mut wins = 0.0;
    for (i, &li) in labels.iter().enumerate() {
        for (j, &lj) in labels.iter().enumerate() {
            if li > 0.5 && lj < 0.5 {
                wins += if scores[i] > scores[j] {
                    1.0
                } else if scores[i] == scores[j] {
                    0.5
                } else {
                    0.0
                };
            }
        }
        if li > 0.5 {
            pos += 1.0
        } else {
            neg += 1.0
        }
    }
    wins / (pos * neg)
}

/// The task suffixes of a fixture's predictions (`""`, or `_ctr`, `_like`).
fn tasks(predictions: &Path) -> Vec<String> {
    let (h, _) = csv_rows(predictions);
    h.iter()
        .filter_map(|c| c.strip_prefix("probs").map(str::to_string))
        .collect()
}

/// predict's arguments: score eval.csv into ours.csv with `ckpt`.
fn predict_args(ckpt: &str) -> [&str; 8] {
    [
        "--pipeline_config_path",
        "pipeline.config",
        "--checkpoint_path",
        ckpt,
        "--input_path",
        "eval.csv",
        "--output_path",
        "ours.csv",
    ]
}

/// `predict` on EasyRec's checkpoint gives EasyRec's own probabilities
/// for every eval row of every fixture model.
#[test]
fn predict_on_easyrec_checkpoints_reproduces_easyrec() {
    for name in FIXTURES {
        let (_tmp, dir) = fixture(name);
        assert_predicts_like_easyrec(name, &dir, "model/model.ckpt-100");
    }
}

/// Runs `predict` in fixture `dir` with checkpoint `ckpt` and asserts each
/// task's probabilities equal those of `easyrec_predictions.csv` (1e-5).
fn assert_predicts_like_easyrec(name: &str, dir: &Path, ckpt: &str) {
    let o = run(env!("CARGO_BIN_EXE_predict"), dir, &predict_args(ckpt));
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    let theirs = dir.join("easyrec_predictions.csv");
    for t in tasks(&theirs) {
        let want = column(&theirs, &format!("probs{t}"));
        let got = column(&dir.join("ours.csv"), &format!("probs{t}"));
        assert_eq!(got.len(), want.len(), "{name}{t}: rows");
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
        assert!(
            worst < 1e-5,
            "{name}{t}: probabilities differ from EasyRec's by up to {worst}"
        );
    }
}

/// A backbone fine-tuned from EasyRec 0.7.1's checkpoint trains under
/// that release's names and biases, and its own checkpoints are read so
/// again: by `eval`, `export`, `predict` and a resumed `train_eval`.
#[test]
fn a_backbone_fine_tuned_from_easyrec_071_keeps_its_names_in_our_checkpoints() {
    let (_tmp, dir) = fixture("backbone_din");
    let train = |steps: &str, more: &[&str]| {
        let edit = format!(r#"{{"train_config.num_steps": {steps}}}"#);
        let mut args = vec![
            "--pipeline_config_path",
            "pipeline.config",
            "--model_dir",
            "tuned",
            "--fine_tune_checkpoint",
            "model/model.ckpt-300",
            "--edit_config_json",
            &edit,
        ];
        args.extend(more);
        run(env!("CARGO_BIN_EXE_train_eval"), &dir, &args)
    };
    let o = train("2", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest = std::fs::read_to_string(dir.join("tuned/model.ckpt-2/manifest.json")).unwrap();
    assert!(
        manifest.contains("backbone/item_mlp/dnn_0/bias"),
        "0.7.1's names and biases"
    );
    for (bin, args) in [
        (env!("CARGO_BIN_EXE_eval"), vec!["--checkpoint_path", "tuned"]),
        (
            env!("CARGO_BIN_EXE_export"),
            vec!["--model_dir", "tuned", "--export_dir", "tuned_export"],
        ),
    ] {
        let mut all = vec!["--pipeline_config_path", "pipeline.config"];
        all.extend(args);
        let o = run(bin, &dir, &all);
        assert!(o.status.success(), "{bin}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = run(env!("CARGO_BIN_EXE_predict"), &dir, &predict_args("tuned"));
    assert!(o.status.success(), "predict: {}", String::from_utf8_lossy(&o.stderr));
    // Resumed from our step 2 (the fine-tune checkpoint is not read again).
    let o = train("4", &["--continue_train"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dir.join("tuned/model.ckpt-4/manifest.json").is_file());
}

/// A backbone holding a Keras layer whose variables EasyRec 0.7.1 names
/// by Keras' automatic layer names (SENet here) is refused by name on that
/// release's checkpoint, before anything is read or trained from it.
#[test]
fn easyrec_071_checkpoints_of_automatically_named_keras_layers_are_refused_by_name() {
    let (_tmp, dir) = fixture("backbone_din");
    let config = std::fs::read_to_string(dir.join("pipeline.config")).unwrap();
    let senet = r#"blocks { name: "se" inputs { block_name: "user_mlp" } inputs { block_name: "item_mlp" }
      merge_inputs_into_list: true keras_layer { class_name: "SENet" senet { reduction_ratio: 2 } } }
    top_mlp"#;
    assert!(config.contains("top_mlp"), "the fixture's backbone has a top MLP");
    std::fs::write(dir.join("senet.config"), config.replacen("top_mlp", senet, 1)).unwrap();
    let mut args = predict_args("model/model.ckpt-300");
    args[1] = "senet.config";
    for (bin, args) in [
        (env!("CARGO_BIN_EXE_predict"), args.to_vec()),
        (
            env!("CARGO_BIN_EXE_train_eval"),
            vec![
                "--pipeline_config_path",
                "senet.config",
                "--model_dir",
                "tuned",
                "--fine_tune_checkpoint",
                "model/model.ckpt-300",
            ],
        ),
    ] {
        let o = run(bin, &dir, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{bin}: {err}");
        assert!(
            err.contains("keras_layer is a SENet") && err.contains("automatic layer names"),
            "{bin}: {err}"
        );
    }
    assert!(!dir.join("tuned/checkpoint").exists(), "nothing trained");
}

/// Runs `eval` in fixture `dir` with checkpoint `ckpt`: its results and
/// the fixture's `easyrec_eval.json`.
fn eval_beside_easyrec(name: &str, dir: &Path, ckpt: &str) -> (serde_json::Value, serde_json::Value) {
    let o = run(
        env!("CARGO_BIN_EXE_eval"),
        dir,
        &["--pipeline_config_path", "pipeline.config", "--checkpoint_path", ckpt],
    );
    assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
    let read =
        |p: PathBuf| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    (
        read(dir.join("model/eval_result.txt")),
        read(dir.join("easyrec_eval.json")),
    )
}

/// `eval` on EasyRec's checkpoint gives the exact AUC of EasyRec's own
/// predictions, and the global step EasyRec saved.
#[test]
fn eval_on_easyrec_checkpoints_gives_easyrec_auc() {
    for name in FIXTURES {
        let (_tmp, dir) = fixture(name);
        let (result, easyrec) = eval_beside_easyrec(name, &dir, "model/model.ckpt-100");
        assert_eq!(result["global_step"], 100, "{name}");
        // EasyRec's eval loss: the mean of the 32-row batches' mean losses.
        let (got, want) = (
            result["loss"].as_f64().unwrap(),
            easyrec["metrics"]["loss"].as_f64().unwrap(),
        );
        assert!((got - want).abs() < 1e-5, "{name}: loss {got}, EasyRec's {want}");
        let theirs = dir.join("easyrec_predictions.csv");
        let (h, _) = csv_rows(&theirs);
        for t in tasks(&theirs) {
            let label = if t.is_empty() {
                h[1].clone()
            } else {
                h[1 + tasks(&theirs).iter().position(|x| *x == t).unwrap()].clone()
            };
            let want = rank_auc(&column(&theirs, &label), &column(&theirs, &format!("probs{t}")));
            let key = if t.is_empty() {
                "auc".to_string()
            } else {
                format!("auc{t}")
            };
            let got = result[&key]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}: no {key} in {result}"));
            assert!(
                (got - want).abs() < 1e-4,
                "{name}: {key} {got}, EasyRec's predictions give {want}"
            );
        }
    }
}

/// Fine-tuning from EasyRec's checkpoint starts where EasyRec stopped: one
/// more step leaves the AUC near EasyRec's, far above a fresh model's.
#[test]
fn fine_tune_from_easyrec_checkpoint_continues_from_it() {
    let (_tmp, dir) = fixture("dcn");
    let prefix = dir.join("model/model.ckpt-100");
    let o = run(
        env!("CARGO_BIN_EXE_train_eval"),
        &dir,
        &[
            "--pipeline_config_path",
            "pipeline.config",
            "--model_dir",
            "tuned",
            "--train_config.num_steps=1",
            &format!("--train_config.fine_tune_checkpoint={}", prefix.display()),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("variables restored from"), "{log}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tuned/eval_result.txt")).unwrap()).unwrap();
    let theirs = dir.join("easyrec_predictions.csv");
    let want = rank_auc(&column(&theirs, "clk"), &column(&theirs, "probs"));
    let got = result["auc"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 0.01,
        "after one step from EasyRec's weights: auc {got}, EasyRec's {want}"
    );
}

/// `--continue_train` in EasyRec's model_dir goes on from EasyRec's
/// checkpoint (its step and Adam slots), not from scratch.
#[test]
fn continue_train_resumes_from_easyrec_checkpoint() {
    let (_tmp, dir) = fixture("wide_and_deep");
    let o = run(
        env!("CARGO_BIN_EXE_train_eval"),
        &dir,
        &[
            "--pipeline_config_path",
            "pipeline.config",
            "--continue_train",
            "--train_config.num_steps=102",
        ],
    );
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("resumed from") && log.contains("at global step 100"),
        "{log}"
    );
    assert!(!log.contains("optimizer slot"), "every Adam slot is read: {log}");
    // Our checkpoint at step 102 beside EasyRec's untouched files.
    assert!(dir.join("model/model.ckpt-102/manifest.json").is_file());
    assert!(dir.join("model/model.ckpt-100.index").is_file());
}

/// A damaged TensorFlow checkpoint is the user's problem (exit 1), named.
#[test]
fn damaged_tensorflow_checkpoints_are_named() {
    let (_tmp, dir) = fixture("dlrm");
    let args = predict_args("model/model.ckpt-100");
    let data = dir.join("model/model.ckpt-100.data-00000-of-00001");
    let bytes = std::fs::read(&data).unwrap();
    std::fs::write(&data, &bytes[..bytes.len() / 2]).unwrap();
    let o = run(env!("CARGO_BIN_EXE_predict"), &dir, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.ckpt-100.data-00000-of-00001") && err.contains("truncated"),
        "{err}"
    );
    // A flipped byte inside a tensor fails its checksum.
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    std::fs::write(&data, &flipped).unwrap();
    let o = run(env!("CARGO_BIN_EXE_predict"), &dir, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("checksum"), "{err}");
    std::fs::write(&data, &bytes).unwrap();
    // Without its index the prefix is no checkpoint at all.
    std::fs::remove_file(dir.join("model/model.ckpt-100.index")).unwrap();
    let o = run(env!("CARGO_BIN_EXE_predict"), &dir, &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("model/model.ckpt-100"), "{err}");
}

/// Another model's EasyRec checkpoint is refused, naming what does not fit.
#[test]
fn another_models_tensorflow_checkpoint_is_refused() {
    let (_tmp, dir) = fixture("dcn");
    let other = common::shared_dir().join("data/compat/easyrec_ckpt/mmoe/model/model.ckpt-100");
    let o = run(
        env!("CARGO_BIN_EXE_predict"),
        &dir,
        &predict_args(other.to_str().unwrap()),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("lacks") && err.contains("cross_layer_0_w"), "{err}");
}

/// inspect_checkpoint lists an EasyRec checkpoint's variables as
/// TensorFlow's list_variables does (the fixture's variables.txt).
#[test]
fn inspect_lists_tensorflow_variables() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let o = Command::new(env!("CARGO_BIN_EXE_inspect_checkpoint"))
            .args(["--all_tensors", "--checkpoint_path"])
            .arg(dir.join("model/model.ckpt-100"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let got: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains('\t'))
            .map(str::to_string)
            .collect();
        let want: Vec<String> = std::fs::read_to_string(dir.join("variables.txt"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        assert_eq!(got, want, "{name}");
    }
}

/// A partitioned variable TensorFlow saved whole (its slices under binary
/// keys, made with TensorFlow itself) comes back whole and in place.
#[test]
fn partitioned_tensorflow_variables_are_put_together() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tf_partitioned");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let ckpt = rustrec::checkpoint::tensorflow::TfCheckpoint::open(&dir.join("model.ckpt-7")).unwrap();
    let got = ckpt.read_f32(want["variable"].as_str().unwrap()).unwrap();
    assert_eq!(got.shape, vec![200, 2]);
    assert_eq!(ckpt.global_step().unwrap(), Some(7));
    let values: Vec<f32> = want["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().parse::<f32>().unwrap())
        .collect();
    assert_eq!(got.data, values);
    let ones = ckpt.read_f32("dense/kernel").unwrap();
    assert_eq!((ones.shape, ones.data), (vec![4, 2], vec![1.0; 8]));
}

/// EasyRec checkpoints this project made in the held-out data layout (see
/// their READMEs): a header, digit ids typed STRING and INT64, missing
/// values with defaults, weighted tags, bucketized and scaled raw values,
/// and raw projections of negative values.
#[test]
fn easyrec_checkpoints_of_the_held_out_layout_predict_as_easyrec() {
    for (name, model) in [("heldout_wide_and_deep", "WideAndDeep"), ("heldout_deepfm", "DeepFM")] {
        let (_tmp, dir) = fixture(name);
        assert_predicts_like_easyrec(model, &dir, "model/model.ckpt-100");
    }
}

/// EasyRec checkpoints of sequence models this project made (see their
/// READMEs): CMBF's and the DIN backbone's `predict` equal EasyRec's
/// SavedModel on every row, empty histories included; MIND's `eval` gives
/// EasyRec's own eval figures on the same rows.
#[test]
fn easyrec_sequence_checkpoints_score_as_easyrec() {
    let (_tmp, dir) = fixture("seq_cmbf");
    assert_predicts_like_easyrec("CMBF", &dir, "model/model.ckpt-300");

    // EasyRec 0.7.1's backbone: its names, its MLPs' biases, its block order.
    let (_tmp, dir) = fixture("backbone_din");
    assert_predicts_like_easyrec("the DIN backbone", &dir, "model/model.ckpt-300");

    let (_tmp, dir) = fixture("seq_mind");
    let (ours, easyrec) = eval_beside_easyrec("MIND", &dir, "model/model.ckpt-300");
    for m in ["loss", "interest_similarity", "capsule_similarity"] {
        let (a, b) = (ours[m].as_f64().unwrap(), easyrec[m].as_f64().unwrap());
        assert!((a - b).abs() < 2e-6, "MIND {m}: ours {a}, EasyRec's {b}");
    }
}
