//! Key-value tables (EasyRec's `ev_params`): trained, checkpointed with
//! their keys, counts and steps, resumed exactly, exported with a key
//! lookup that an independent ONNX runtime runs like our eval; bad
//! `ev_params` refused naming the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustrec::checkpoint::{load, Loaded};
use rustrec::config::{load_pipeline, typed::TrainingPlan};
use rustrec::export::runtime::ExportedModel;
use rustrec::export::{export_bundle, ExportRequest, EXTERNAL_MIN_BYTES};
use rustrec::inference::Bundle;
use rustrec::train::Trainer;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The key-value sample config, reading the bundled sample by absolute
/// path, training into `dir/model`, with `ev_params` replaced by `ev`.
fn config(dir: &Path, ev: &str) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join("samples/wide_and_deep_criteo_sample_ev.config"))
        .unwrap()
        .replace("data/criteo_sample.csv", &format!("{ROOT}/data/criteo_sample.csv"))
        .replace(
            "experiments/wide_and_deep_criteo_sample_ev",
            dir.join("model").to_str().unwrap(),
        )
        .replace(
            "ev_params { filter_freq: 2 steps_to_live: 150 max_capacity: 100000 }",
            &format!("ev_params {{ {ev} }}"),
        );
    assert!(text.contains(ev));
    let path = dir.join("pipeline.config");
    std::fs::write(&path, text).unwrap();
    path
}

fn train_eval(cfg: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .current_dir(ROOT)
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn tensors(model_dir: &Path, step: u32) -> BTreeMap<String, Loaded> {
    load(&model_dir.join(format!("model.ckpt-{step}"))).unwrap().1
}

const C1: &str = "input_layer_1/C1_embedding/embedding_weights";

#[test]
fn rows_exist_only_for_admitted_keys_and_checkpoints_hold_keys_counts_and_steps() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "filter_freq: 3");
    // 8 steps of 32 rows: some of the 200 rows' values are seen three
    // times, others less.
    train_eval(&cfg, &["--train_config.num_steps=8"]);
    let t = tensors(&dir.path().join("model"), 8);
    let keys = &t[&format!("{C1}-keys")];
    let n = keys.ints.len();
    assert!(n > 0, "some keys admitted");
    assert_eq!(t[C1].shape, vec![n, 16]);
    assert!(keys.ints.windows(2).all(|w| w[0] < w[1]), "ascending distinct keys");
    // Hashes modulo 2^63-1, as EasyRec's embedding variables take them.
    assert!(keys.ints.iter().all(|k| *k < i64::MAX as u64));
    assert!(
        keys.ints.iter().any(|k| *k >= 1 << 40),
        "keys are not hashed into buckets"
    );
    let freqs = &t[&format!("{C1}-freqs")].ints;
    assert!(
        freqs.iter().all(|f| *f >= 3),
        "a row only after three sightings: {freqs:?}"
    );
    let versions = &t[&format!("{C1}-versions")].ints;
    assert!(versions.iter().all(|v| *v < 8));
    let pending = &t[&format!("{C1}-freqs_filtered")].ints;
    assert!(!pending.is_empty() && pending.iter().all(|f| *f < 3), "{pending:?}");
    // Adagrad's accumulator, one row per key.
    let slot = t
        .iter()
        .find(|(k, _)| k.starts_with(C1) && k.ends_with("Adagrad"))
        .map(|(_, v)| v)
        .expect("the accumulator of C1's rows");
    assert_eq!(slot.shape, vec![n, 16]);

    // inspect_checkpoint lists them.
    let out = Command::new(env!("CARGO_BIN_EXE_inspect_checkpoint"))
        .args([
            "--checkpoint_path",
            dir.path().join("model/model.ckpt-8").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(listing.contains(&format!("{C1}-keys [{n}]")), "{listing}");
}

#[test]
fn a_resumed_run_equals_an_uninterrupted_one_and_stale_rows_are_evicted_at_saves() {
    let dir = tempfile::tempdir().unwrap();
    let ev = "filter_freq: 2 steps_to_live: 5";
    let whole = tempfile::tempdir().unwrap();
    let cfg_whole = config(whole.path(), ev);
    // Both save (and so evict) at the same steps.
    let every_10 = "--train_config.save_checkpoints_steps=10";
    let log = train_eval(&cfg_whole, &["--train_config.num_steps=40", every_10]);
    assert!(log.contains("steps_to_live:"), "{log}");
    let cfg = config(dir.path(), ev);
    train_eval(&cfg, &["--train_config.num_steps=20", every_10]);
    train_eval(&cfg, &["--train_config.num_steps=40", every_10, "--continue_train"]);
    let (a, b) = (
        tensors(&whole.path().join("model"), 40),
        tensors(&dir.path().join("model"), 40),
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, x) in &a {
        assert_eq!(x, &b[name], "{name} differs after a resume");
    }
    // Rows not seen for more than five steps are gone from the checkpoint.
    let versions = &a[&format!("{C1}-versions")].ints;
    assert!(!versions.is_empty());
    assert!(versions.iter().all(|v| 40 - v <= 5), "{versions:?}");
}

#[test]
fn the_export_looks_keys_up_like_eval_and_predict_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "filter_freq: 2 max_capacity: 64");
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    let mut t = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap();
    t.run().unwrap();
    let root = dir.path().join("export");
    export_bundle(
        &Bundle::of(&t).unwrap(),
        &root,
        &ExportRequest {
            config_text: &loaded.to_text(),
            asset_files: &[],
            metrics: &[],
            checkpoint: None,
            external_min_bytes: EXTERNAL_MIN_BYTES,
        },
    )
    .unwrap();
    let onnx = ExportedModel::load(&root).unwrap();
    let mut worst = 0.0f32;
    let mut rows = 0;
    for batch in t.stream(&t.plan.data.eval_paths.clone(), false, 0).unwrap() {
        let batch = batch.unwrap();
        let ours = t.score(&batch);
        let theirs = onnx.score(&batch).unwrap();
        for (o, e) in ours.iter().zip(&theirs) {
            for (a, b) in o.scores.iter().zip(&e.scores) {
                worst = worst.max((a - b).abs());
            }
        }
        rows += batch.size;
    }
    assert_eq!(rows, 200);
    assert!(worst <= 1e-5, "the export's lookups differ from eval by {worst}");

    // predict from the checkpoint and from the export agree.
    let model_dir = dir.path().join("model");
    let predict = |args: &[&str], out: &Path| -> Vec<String> {
        let o = Command::new(env!("CARGO_BIN_EXE_predict"))
            .current_dir(ROOT)
            .args(args)
            .args(["--input_path", &format!("{ROOT}/data/criteo_sample.csv")])
            .args(["--output_path", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let from_export = predict(
        &["--saved_model_dir", root.to_str().unwrap()],
        &dir.path().join("a.csv"),
    );
    let from_ckpt = predict(
        &["--pipeline_config_path", cfg.to_str().unwrap()],
        &dir.path().join("b.csv"),
    );
    assert_eq!(from_export.len(), 201);
    for (x, y) in from_export.iter().zip(&from_ckpt).skip(1) {
        let p = |l: &str| l.rsplit(',').next().unwrap().parse::<f32>().unwrap();
        assert!((p(x) - p(y)).abs() <= 1e-5, "{x} vs {y}");
    }
    // max_capacity: never more rows than it allows.
    let t = tensors(&model_dir, 200);
    assert!(t[&format!("{C1}-keys")].ints.len() <= 64);
}

#[test]
fn bad_ev_params_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "max_capacity: 0");
    let out = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model_config.ev_params.max_capacity"), "{err}");
    let cfg = config(dir.path(), "init_capacity: 10 max_capacity: 5");
    let out = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("init_capacity"));
}
