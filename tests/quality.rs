//! Model quality on real and generated data: MovieLens-100k as a CTR task
//! (rating >= 4 is a click; rating 5 the second task of multi-task models)
//! and Criteo-shaped data with a planted model.

mod common;

use std::path::Path;
use std::process::Command;

/// Trains `config` with the given input files and returns eval_result.txt.
fn train(config: &str, train: &Path, eval: &Path, model_dir: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--pipeline_config_path", config])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--train_input_path", train.to_str().unwrap()])
        .args(["--eval_input_path", eval.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{config}: {stderr}");
    eprintln!(
        "{config}: {}",
        stderr.lines().filter(|l| l.starts_with("eval at")).collect::<String>()
    );
    serde_json::from_str(&std::fs::read_to_string(model_dir.join("eval_result.txt")).unwrap()).unwrap()
}

#[test]
fn movielens_100k_wide_and_deep_and_dlrm_reach_auc_075() {
    let data = tempfile::tempdir().unwrap();
    let src = common::shared_dir().join("data/real/ml-100k");
    let report = rustrec::datagen::prepare_movielens(&src, data.path(), 0.2, 1).unwrap();
    assert_eq!((report.train_rows, report.eval_rows), (80_000, 20_000));
    let (train_csv, eval_csv) = (data.path().join("train.csv"), data.path().join("eval.csv"));
    for config in ["samples/wide_and_deep_ml100k.config", "samples/dlrm_ml100k.config"] {
        let dir = tempfile::tempdir().unwrap();
        let result = train(config, &train_csv, &eval_csv, dir.path(), &[]);
        let auc = result["auc"].as_f64().unwrap();
        assert!(auc >= 0.75, "{config}: eval AUC {auc:.4} < 0.75");
        assert!(result["gauc"].as_f64().unwrap() > 0.6, "{config}: {result}");
    }
}

/// MMoE and DBMTL learn both MovieLens tasks, `like` (rating >= 4) and
/// `love` (rating 5), report metrics per task under EasyRec's names, and
/// export a graph with both tasks' outputs.
#[test]
fn movielens_100k_multi_task_models_learn_both_tasks() {
    let data = tempfile::tempdir().unwrap();
    let src = common::shared_dir().join("data/real/ml-100k");
    rustrec::datagen::prepare_movielens(&src, data.path(), 0.2, 1).unwrap();
    let (train_csv, eval_csv) = (data.path().join("train.csv"), data.path().join("eval.csv"));
    for config in ["samples/dbmtl_ml100k.config", "samples/mmoe_ml100k.config"] {
        let dir = tempfile::tempdir().unwrap();
        let result = train(config, &train_csv, &eval_csv, dir.path(), &[]);
        let like = result["auc_like"].as_f64().unwrap();
        let love = result["auc_love"].as_f64().unwrap();
        assert!(
            like >= 0.75 && love >= 0.75,
            "{config}: eval AUC like {like:.4}, love {love:.4}: {result}"
        );
        for key in ["loss", "loss_like", "loss_love", "logloss_like", "logloss_love"] {
            assert!(
                result[key].as_f64().is_some_and(f64::is_finite),
                "{config}: {key} in {result}"
            );
        }
        let spec = std::fs::read_dir(dir.path().join("export/final"))
            .unwrap()
            .map(|e| e.unwrap().path().join("assets/feature_spec.json"))
            .next()
            .unwrap();
        let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(spec).unwrap()).unwrap();
        assert_eq!(
            spec["outputs"],
            serde_json::json!(["logits_like", "probs_like", "logits_love", "probs_love"]),
            "{config}"
        );
    }
}

#[test]
fn criteo_shaped_data_dlrm_and_wide_and_deep_approach_the_planted_auc() {
    let data = tempfile::tempdir().unwrap();
    let (train_pq, eval_pq) = (data.path().join("train.parquet"), data.path().join("eval.parquet"));
    let spec = |rows, seed| rustrec::datagen::GenSpec {
        rows,
        cap: 10_000,
        seed,
        model_seed: 7,
        row_group_rows: 65_536,
    };
    rustrec::datagen::generate(&train_pq, &spec(512_000, 1)).unwrap();
    let planted = rustrec::datagen::generate(&eval_pq, &spec(100_000, 2))
        .unwrap()
        .planted_auc;
    // Both land within 0.01 of the planted model after one epoch.
    for config in [
        "samples/dlrm_synthetic.config",
        "samples/wide_and_deep_synthetic.config",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let result = train(config, &train_pq, &eval_pq, dir.path(), &[]);
        let auc = result["auc"].as_f64().unwrap();
        assert!(
            auc >= planted - 0.01,
            "{config}: eval AUC {auc:.4}, planted model {planted:.4}"
        );
    }
}
