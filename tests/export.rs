//! Export for serving: every model's ONNX graph, run by an independent
//! runtime (tract), scores like our own eval; `predict` gives the same
//! scores from an export and from the checkpoint; exporters keep what
//! export_config says; damaged exports are reported clearly.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustrec::config::{load_pipeline, typed::TrainingPlan};
use rustrec::export::runtime::ExportedModel;
use rustrec::export::{export_bundle, ExportRequest, EXTERNAL_MIN_BYTES};
use rustrec::inference::Bundle;
use rustrec::train::Trainer;

mod common;
use common::models::{bin, run_ok, setup, MODELS};

fn run_fails(mut c: Command) -> String {
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{c:?} should fail with exit 1");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn every_model_exports_an_onnx_graph_that_scores_like_eval() {
    for (model, _) in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let cfg = setup(dir.path(), model, "");
        let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
        let mut t = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap();
        t.run().unwrap();
        let root = dir.path().join("export");
        let exported = export_bundle(
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
        for f in [
            "model.onnx",
            "assets/pipeline.config",
            "assets/feature_spec.json",
            "assets/export_info.json",
        ] {
            assert!(exported.join(f).is_file(), "{model}: {f} missing");
        }
        assert!(
            exported.join("model.onnx.data").is_file(),
            "{model}: c1's table is external data"
        );
        let onnx = ExportedModel::load(&root).unwrap_or_else(|e| panic!("{model}: {e:#}"));
        let mut worst = 0.0f32;
        let mut rows = 0;
        for batch in t.stream(&t.plan.data.eval_paths.clone(), false, 0).unwrap() {
            let batch = batch.unwrap();
            let ours = t.score(&batch);
            let theirs = onnx.score(&batch).unwrap();
            // A two-tower model's embeddings are exported beside its scores.
            let inputs = t.group_inputs(&batch);
            let embeddings = t.model.embedding_values(&inputs, batch.size);
            let exported = onnx.embeddings(&batch).unwrap();
            assert_eq!(exported.len(), embeddings.len(), "{model}: embedding outputs");
            if *model == "MIND" {
                // The towers, the interests and their count.
                assert_eq!(embeddings.len(), 4, "{model}: embedding outputs");
            }
            assert_eq!(
                embeddings.is_empty(),
                !(model.starts_with("DSSM") || ["MatchModel", "DropoutNet", "DAT", "MIND"].contains(model)),
                "{model}: embedding outputs"
            );
            for (a, b) in embeddings.iter().zip(&exported) {
                assert_eq!(a.len(), b.len(), "{model}: embedding width");
                for (x, y) in a.iter().zip(b) {
                    worst = worst.max((x - y).abs());
                }
            }
            assert_eq!(ours.len(), t.plan.model.tasks.len(), "{model}: one score per task");
            assert_eq!(theirs.len(), ours.len(), "{model}: one export output pair per task");
            for (o, e) in ours.iter().zip(&theirs) {
                assert_eq!((e.scores.len(), e.logits.len()), (o.scores.len(), o.logits.len()));
                assert_eq!(e.values.is_some(), o.values.is_some(), "{model}: ZILN's y");
                let (ov, ev) = (o.values.as_deref().unwrap_or(&[]), e.values.as_deref().unwrap_or(&[]));
                assert_eq!(ov.len(), ev.len());
                // ZILN's expected values scale with exp(mu): compared relatively.
                for (a, b) in ov.iter().zip(ev) {
                    worst = worst.max((a - b).abs() / a.abs().max(1.0));
                }
                for (a, b) in o.scores.iter().zip(&e.scores).chain(o.logits.iter().zip(&e.logits)) {
                    worst = worst.max((a - b).abs());
                }
            }
            rows += batch.size;
        }
        assert_eq!(rows, 300);
        assert!(worst <= 1e-5, "{model}: ONNX probs differ from eval by {worst}");
        eprintln!("{model}: max |probs difference| {worst:e}");
    }
}

fn read_csv_scores(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().split(',').map(String::from).collect();
    (
        header,
        lines.map(|l| l.split(',').map(String::from).collect()).collect(),
    )
}

fn read_parquet_scores(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Int64Type};
    let f = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut header = Vec::new();
    let mut rows = Vec::new();
    for b in reader {
        let b = b.unwrap();
        header = b.schema().fields().iter().map(|f| f.name().clone()).collect();
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| match c.data_type() {
                        arrow_schema::DataType::Float32 => c.as_primitive::<Float32Type>().value(r).to_string(),
                        arrow_schema::DataType::Int64 => c.as_primitive::<Int64Type>().value(r).to_string(),
                        _ => c.as_string::<i32>().value(r).to_string(),
                    })
                    .collect(),
            );
        }
    }
    (header, rows)
}

#[test]
fn predict_from_an_export_and_from_the_checkpoint_give_the_same_scores() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DLRM", "");
    let model_dir = dir.path().join("model");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()]);
    let log = run_ok(c);
    // exporter_type defaults to final: one export after training.
    assert!(log.contains("exported"), "{log}");
    assert_eq!(
        rustrec::export::list_exports(&model_dir.join("export/final"))
            .unwrap()
            .len(),
        1
    );

    let export_dir = dir.path().join("served");
    let mut c = bin("export");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--export_dir", export_dir.to_str().unwrap()]);
    run_ok(c);
    let data = dir.path().join("data.csv");
    let (from_export, from_ckpt) = (dir.path().join("a.csv"), dir.path().join("b.parquet"));
    // An output path that is one of predict's own inputs is refused, and
    // the input is left as it was.
    let before = std::fs::read(&data).unwrap();
    let same_dir_spelling = dir.path().join(".").join("data.csv");
    for (flag, source, out) in [
        ("--saved_model_dir", &export_dir, &same_dir_spelling),
        ("--pipeline_config_path", &cfg, &data),
        ("--pipeline_config_path", &cfg, &cfg),
    ] {
        let mut c = bin("predict");
        c.args([flag, source.to_str().unwrap()])
            .args(["--input_path", data.to_str().unwrap()])
            .args(["--output_path", out.to_str().unwrap()]);
        let err = run_fails(c);
        assert!(err.contains("one of the files predict reads"), "{err}");
    }
    assert_eq!(std::fs::read(&data).unwrap(), before, "the input was changed");
    let mut c = bin("predict");
    c.args(["--saved_model_dir", export_dir.to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", from_export.to_str().unwrap()])
        .args(["--reserved_cols", "label,c1"]);
    run_ok(c);
    let mut c = bin("predict");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", from_ckpt.to_str().unwrap()])
        .args(["--reserved_cols", "label,c1"])
        .args(["--batch_size", "7"]);
    run_ok(c);
    let (h1, r1) = read_csv_scores(&from_export);
    let (h2, r2) = read_parquet_scores(&from_ckpt);
    assert_eq!(h1, ["label", "c1", "logits", "probs"]);
    assert_eq!(h1, h2);
    assert_eq!(r1.len(), 300);
    assert_eq!(r1.len(), r2.len());
    let inputs = std::fs::read_to_string(&data).unwrap();
    for ((a, b), line) in r1.iter().zip(&r2).zip(inputs.lines()) {
        let cols: Vec<&str> = line.split(',').collect();
        assert_eq!(a[..2], [cols[0], cols[3]], "reserved columns pass through");
        assert_eq!(a[..2], b[..2]);
        for k in 2..4 {
            let (x, y): (f32, f32) = (a[k].parse().unwrap(), b[k].parse().unwrap());
            assert!((x - y).abs() <= 1e-5, "{} differs: {x} vs {y}", h1[k]);
        }
    }
}

/// A multi-class model's predictions: per class its logit and
/// probability (EasyRec's `probs_1` the second class's), and the most
/// probable class `y`; the probabilities sum to one.
#[test]
fn predict_gives_a_multi_class_model_a_column_per_class() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM+2 classes", "");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()]);
    run_ok(c);
    let (data, out) = (dir.path().join("data.csv"), dir.path().join("scores.csv"));
    let export = rustrec::export::list_exports(&dir.path().join("model/export/final")).unwrap();
    let mut c = bin("predict");
    c.args(["--saved_model_dir", export[0].to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", out.to_str().unwrap()])
        .args(["--reserved_cols", "label"]);
    run_ok(c);
    let (header, rows) = read_csv_scores(&out);
    assert_eq!(header, ["label", "logits_0", "logits_1", "probs_0", "probs_1", "y"]);
    assert_eq!(rows.len(), 300);
    for r in &rows {
        let v: Vec<f32> = r[1..].iter().map(|x| x.parse().unwrap()).collect();
        assert!((v[2] + v[3] - 1.0).abs() < 1e-5, "{r:?}");
        let p1 = 1.0 / (1.0 + (v[0] - v[1]).exp());
        assert!((v[3] - p1).abs() < 1e-5, "{r:?}");
        assert_eq!(v[4], f32::from(u8::from(v[1] > v[0])), "{r:?}");
    }
}

#[test]
fn exporters_keep_what_export_config_says() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(
        dir.path(),
        "MultiTower",
        "\nexport_config { exporter_type: \"latest\" exports_to_keep: 2 }",
    );
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()]);
    run_ok(c);
    let model_dir = dir.path().join("model");
    // Evaluations at steps 10, 20 and the end (30): three exports, two kept.
    let latest = rustrec::export::list_exports(&model_dir.join("export/latest")).unwrap();
    assert_eq!(latest.len(), 2);
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(latest[1].join("assets/export_info.json")).unwrap()).unwrap();
    assert_eq!(info["global_step"], 30);
    assert!(info["metrics"]["auc"].as_f64().is_some(), "{info}");

    let best_dir = dir.path().join("best");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", best_dir.to_str().unwrap()])
        .args(["--export_config.exporter_type=best", "--train_config.num_steps=60"]);
    run_ok(c);
    let best = rustrec::export::list_exports(&best_dir.join("export/best")).unwrap();
    assert!(!best.is_empty() && best.len() <= 2, "{best:?}");
    let auc_of = |p: &Path| -> f64 {
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p.join("assets/export_info.json")).unwrap()).unwrap();
        info["metrics"]["auc"].as_f64().unwrap()
    };
    let aucs: Vec<f64> = best.iter().map(|p| auc_of(p)).collect();
    assert!(
        aucs.windows(2).all(|w| w[1] > w[0]),
        "each best export improves: {aucs:?}"
    );
    let kept: Vec<_> = std::fs::read_dir(best_dir.join("best_ckpt")).unwrap().collect();
    assert!(!kept.is_empty() && kept.len() <= 2);

    // An export option the exporter cannot honour stops train_eval before it
    // trains, naming the option; without an exporter the config trains.
    let packed = dir.path().join("packed");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", packed.to_str().unwrap()])
        .args(["--export_config.export_features=true"]);
    let err = run_fails(c);
    assert!(err.contains("export_config.export_features"), "{err}");
    assert!(!packed.join("checkpoint").exists());

    let none_dir = dir.path().join("none");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", none_dir.to_str().unwrap()])
        .args([
            "--export_config.exporter_type=none",
            "--export_config.export_features=true",
        ]);
    run_ok(c);
    assert!(!none_dir.join("export").exists());
}

#[test]
fn damaged_export_dirs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "WideAndDeep", "");
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()]);
    run_ok(c);
    let good = rustrec::export::list_exports(&dir.path().join("model/export/final"))
        .unwrap()
        .pop()
        .unwrap();
    let copy = |name: &str| -> PathBuf {
        let d = dir.path().join(name);
        std::fs::create_dir_all(d.join("assets")).unwrap();
        for f in [
            "model.onnx",
            "model.onnx.data",
            "assets/pipeline.config",
            "assets/feature_spec.json",
        ] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };
    let predict = |export: &Path| -> String {
        let mut c = bin("predict");
        c.args(["--saved_model_dir", export.to_str().unwrap()])
            .args(["--input_path", dir.path().join("data.csv").to_str().unwrap()])
            .args(["--output_path", dir.path().join("out.csv").to_str().unwrap()]);
        run_fails(c)
    };
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(predict(&empty).contains("is not an export"), "{}", predict(&empty));
    assert!(predict(&dir.path().join("absent")).contains("does not exist"));

    let truncated = copy("truncated");
    let bytes = std::fs::read(truncated.join("model.onnx")).unwrap();
    std::fs::write(truncated.join("model.onnx"), &bytes[..bytes.len() / 2]).unwrap();
    let err = predict(&truncated);
    assert!(
        err.contains("cannot load ONNX model") && err.contains("model.onnx"),
        "{err}"
    );

    // An export of the first feature-spec format hashed ids with FNV-1a:
    // its tables answer other ids than TensorFlow's hash gives now.
    let old_hash = copy("old_hash");
    let spec_path = old_hash.join("assets/feature_spec.json");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    assert!(spec.contains("\"id_hash\": \"farmhash_fingerprint64\""), "{spec}");
    std::fs::write(
        &spec_path,
        spec.replace("rustrec-feature-spec-3", "rustrec-feature-spec-1"),
    )
    .unwrap();
    let err = predict(&old_hash);
    assert!(err.contains("FNV-1a") && err.contains("train the model again"), "{err}");
    // One of the second format encoded features otherwise than EasyRec.
    std::fs::write(
        &spec_path,
        spec.replace("rustrec-feature-spec-3", "rustrec-feature-spec-2"),
    )
    .unwrap();
    let err = predict(&old_hash);
    assert!(
        err.contains("otherwise than EasyRec") && err.contains("train the model again"),
        "{err}"
    );

    let no_config = copy("no_config");
    std::fs::remove_file(no_config.join("assets/pipeline.config")).unwrap();
    let err = predict(&no_config);
    assert!(err.contains("assets/pipeline.config is missing"), "{err}");

    let no_data = copy("no_data");
    std::fs::remove_file(no_data.join("model.onnx.data")).unwrap();
    let err = predict(&no_data);
    assert!(err.contains("cannot load ONNX model"), "{err}");

    // export_info.json records each model file's size and CRC-32C: one
    // flipped byte of the tables' external data is caught before scoring.
    let flipped = copy("flipped");
    std::fs::copy(
        good.join("assets/export_info.json"),
        flipped.join("assets/export_info.json"),
    )
    .unwrap();
    let info = std::fs::read_to_string(flipped.join("assets/export_info.json")).unwrap();
    assert!(
        info.contains("\"model.onnx.data\"") && info.contains("crc32c"),
        "{info}"
    );
    let mut data = std::fs::read(flipped.join("model.onnx.data")).unwrap();
    let at = data.len() / 3;
    data[at] ^= 0x10;
    std::fs::write(flipped.join("model.onnx.data"), &data).unwrap();
    let err = predict(&flipped);
    assert!(
        err.contains("model.onnx.data is damaged") && err.contains("export the checkpoint again"),
        "{err}"
    );
    data[at] ^= 0x10;
    std::fs::write(flipped.join("model.onnx.data"), &data[..data.len() - 8]).unwrap();
    assert!(predict(&flipped).contains("model.onnx.data is damaged"));
    std::fs::write(flipped.join("model.onnx.data"), &data).unwrap();

    // The file is still whole after all those failures, and still scores.
    let mut c = bin("predict");
    c.args(["--saved_model_dir", good.to_str().unwrap()])
        .args(["--input_path", dir.path().join("data.csv").to_str().unwrap()])
        .args(["--output_path", dir.path().join("ok.csv").to_str().unwrap()]);
    run_ok(c);
}

/// `export_config.multi_placeholder: false`: the export records one packed
/// string per row (the features' input fields joined by the separator, as
/// EasyRec's `features` placeholder), and scoring such rows gives the
/// scores of the same rows read from the data file.
/// The first evaluation batch of `t` (trained on `dir`'s `data.csv`) and the
/// same rows as packed serving rows: the data's columns are label, d1..c4,
/// label2, and a packed row drops the labels.
fn eval_batch_and_packed_rows(t: &Trainer, dir: &Path) -> (rustrec::features::Batch, Vec<String>) {
    let batch = t
        .stream(&t.plan.data.eval_paths.clone(), false, 0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let text = std::fs::read_to_string(dir.join("data.csv")).unwrap();
    let rows = text
        .lines()
        .take(batch.size)
        .map(|l| l.split(',').skip(1).take(6).collect::<Vec<_>>().join(","))
        .collect();
    (batch, rows)
}

#[test]
fn a_packed_serving_input_scores_like_the_rows_it_packs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "WideAndDeep", "export_config { multi_placeholder: false }");
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    let mut t = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap();
    t.run().unwrap();
    let export = |name: &str, t: &Trainer, text: &str| {
        let root = dir.path().join(name);
        export_bundle(
            &Bundle::of(t).unwrap(),
            &root,
            &ExportRequest {
                config_text: text,
                asset_files: &[],
                metrics: &[],
                checkpoint: None,
                external_min_bytes: EXTERNAL_MIN_BYTES,
            },
        )
        .unwrap();
        ExportedModel::load(&root).unwrap()
    };
    let packed = export("packed", &t, &loaded.to_text());
    let layout = packed.packed.clone().expect("a packed serving input");
    assert_eq!(layout.separator, ",");
    assert_eq!(layout.fields, ["d1", "d2", "c1", "c2", "c3", "c4"]);

    let (batch, rows) = eval_batch_and_packed_rows(&t, dir.path());
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let want = packed.score(&batch).unwrap();
    let got = packed.score_packed(&rows).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.scores, w.scores,
            "packed rows score otherwise than the same rows read from the file"
        );
    }
    // A row with a field missing is named; an export with one input per
    // feature takes no packed rows.
    let err = packed.score_packed(&["0.1,0.2,u1,3,a|b"]).unwrap_err().to_string();
    assert!(
        err.contains("5 fields, but the export's packed serving layout declares 6"),
        "{err}"
    );
    t.plan.export.packed_input = false;
    let plain_text = loaded
        .to_text()
        .replace("multi_placeholder: false", "multi_placeholder: true");
    let plain = export("plain", &t, &plain_text);
    assert!(plain.packed.is_none());
    let err = plain.score_packed(&rows).unwrap_err().to_string();
    assert!(err.contains("takes one input per feature"), "{err}");
}

/// `filter_inputs: false`: a packed serving row holds every input field but
/// the labels, the columns no feature reads included (EasyRec's
/// placeholders then cover them all), and scores as the file's rows do.
#[test]
fn packed_rows_hold_every_field_without_filter_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "export_config { multi_placeholder: false filter_inputs: false }";
    let cfg = setup(dir.path(), "WideAndDeep+final_dnn", extra);
    // No feature reads c4.
    let text: String = std::fs::read_to_string(&cfg)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("feature_configs { input_names: \"c4\""))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&cfg, text).unwrap();
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    let mut t = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap();
    t.run().unwrap();
    let root = dir.path().join("packed");
    let request = ExportRequest {
        config_text: &loaded.to_text(),
        asset_files: &[],
        metrics: &[],
        checkpoint: None,
        external_min_bytes: EXTERNAL_MIN_BYTES,
    };
    export_bundle(&Bundle::of(&t).unwrap(), &root, &request).unwrap();
    let packed = ExportedModel::load(&root).unwrap();
    // No feature reads c4; it comes along.
    let layout = packed.packed.clone().expect("a packed serving input");
    assert_eq!(layout.fields, ["d1", "d2", "c1", "c2", "c3", "c4"]);
    let (batch, rows) = eval_batch_and_packed_rows(&t, dir.path());
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let (got, want) = (packed.score_packed(&rows).unwrap(), packed.score(&batch).unwrap());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.scores, w.scores);
    }

    // Filtered (the default), the row holds the fields features read
    // (EasyRec's effective fields: every configured feature's inputs).
    t.plan.export.filter_inputs = true;
    let root = dir.path().join("filtered");
    let text = loaded.to_text().replace("filter_inputs: false", "");
    let request = ExportRequest {
        config_text: &text,
        ..request
    };
    export_bundle(&Bundle::of(&t).unwrap(), &root, &request).unwrap();
    let filtered = ExportedModel::load(&root).unwrap().packed.unwrap();
    assert_eq!(filtered.fields, ["d1", "d2", "c1", "c2", "c3"]);
}

/// A mean-combined weighted tag whose weights include zero and negative
/// ones (TensorFlow's safe embedding lookup prunes weights <= 0 under a
/// mean, and a row left with none pools to zeros): the exported graph
/// scores as the checkpoint does.
#[test]
fn a_mean_of_weighted_tags_leaves_out_weights_not_above_zero_in_the_export_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let c4 = r#"kv_separator: ":" hash_bucket_size: 20 embedding_dim: 4 }"#;
    assert!(text.contains(c4));
    std::fs::write(&cfg, text.replace(c4, &c4.replace(" }", " combiner: \"mean\" }"))).unwrap();
    // Weights in [-1, 1) with exact zeros; every fifth row only <= 0.
    let data = dir.path().join("data.csv");
    let mut rng = rustrec::util::Rng::new(11);
    let rows: Vec<String> = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let mut cols: Vec<String> = line.split(',').map(String::from).collect();
            let n = 1 + rng.below(3);
            cols[6] = (0..n)
                .map(|k| {
                    let w = if i % 5 == 0 || k == 1 {
                        -(rng.uniform() as f32) * (k % 2) as f32
                    } else {
                        rng.uniform() as f32 * 2.0 - 1.0
                    };
                    format!("w{}:{w:.2}", rng.below(6))
                })
                .collect::<Vec<_>>()
                .join("|");
            cols.join(",")
        })
        .collect();
    assert!(rows.iter().any(|r| r.contains(":0.00") || r.contains(":-0.00")));
    std::fs::write(&data, rows.join("\n") + "\n").unwrap();
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()]);
    run_ok(c);
    let export_dir = dir.path().join("served");
    let mut c = bin("export");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--export_dir", export_dir.to_str().unwrap()]);
    run_ok(c);
    let (from_export, from_ckpt) = (dir.path().join("a.csv"), dir.path().join("b.parquet"));
    let mut c = bin("predict");
    c.args(["--saved_model_dir", export_dir.to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", from_export.to_str().unwrap()]);
    run_ok(c);
    let mut c = bin("predict");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", from_ckpt.to_str().unwrap()]);
    run_ok(c);
    let (h1, r1) = read_csv_scores(&from_export);
    let (h2, r2) = read_parquet_scores(&from_ckpt);
    assert_eq!(h1, h2);
    assert_eq!(r1.len(), 300);
    let col = h1.iter().position(|h| h == "probs").unwrap();
    for (a, b) in r1.iter().zip(&r2) {
        let (x, y): (f32, f32) = (a[col].parse().unwrap(), b[col].parse().unwrap());
        assert!((x - y).abs() <= 1e-5, "export {x} vs checkpoint {y}");
    }
}
