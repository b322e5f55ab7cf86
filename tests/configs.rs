//! Every EasyRec sample config loads, and printing then re-loading it gives
//! an identical config.

mod common;

use rustrec::config::{load_pipeline, loader, Overrides};

#[test]
fn every_sample_config_loads_and_round_trips() {
    for path in common::easyrec_configs() {
        let loaded = load_pipeline(&path, &Overrides::default())
            .unwrap_or_else(|e| panic!("{} failed to load: {e}", path.display()));
        let text = loaded.to_text();
        let dir = tempfile::tempdir().unwrap();
        let printed = dir.path().join("pipeline.config");
        std::fs::write(&printed, &text).unwrap();
        let again = load_pipeline(&printed, &Overrides::default()).unwrap();
        use prost::Message;
        assert!(
            again.message.encode_to_vec() == loaded.message.encode_to_vec(),
            "{}: encoded round trip differs",
            path.display()
        );
        assert_eq!(
            again.config,
            loaded.config,
            "{}: typed round trip differs",
            path.display()
        );
        assert_eq!(again.to_text(), text, "{}: text round trip differs", path.display());
    }
}

#[test]
fn sample_values_are_read_with_easyrec_semantics() {
    let c = load_pipeline(
        &common::sample("dlrm_on_criteo_parquet_ep_v2.config"),
        &Overrides::default(),
    )
    .unwrap()
    .config;
    let train = c.train_config.as_ref().unwrap();
    // `sync_replicas: False` (capitalised) and an enum by name
    assert!(!train.sync_replicas());
    assert_eq!(
        train.train_distribute(),
        rustrec::config::proto::DistributionStrategy::EmbeddingParallelStrategy
    );
    // single-quoted strings
    assert_eq!(c.data_config.as_ref().unwrap().input_fields[0].input_name, "is_click");
    // proto2 defaults where unset
    assert_eq!(train.keep_checkpoint_max(), 10);
    assert_eq!(c.data_config.as_ref().unwrap().eval_batch_size(), 4096);

    let w = load_pipeline(&common::sample("wide_and_deep_two_opti.config"), &Overrides::default())
        .unwrap()
        .config;
    let Some(rustrec::config::proto::easy_rec_model::Model::WideAndDeep(wd)) = &w.model_config.model else {
        panic!("wide_and_deep block expected")
    };
    assert_eq!(wd.dnn.hidden_units, vec![128, 64, 32]);
    assert_eq!(w.feature_configs[0].boundaries.len(), 23);
    assert_eq!(w.train_config.as_ref().unwrap().optimizer_config.len(), 2);
}

#[test]
fn json_configs_load_like_text() {
    let text_path = common::sample("wide_and_deep_two_opti.config");
    let loaded = load_pipeline(&text_path, &Overrides::default()).unwrap();
    let json = serde_json::to_string(&loaded.message).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("p.json");
    std::fs::write(&json_path, json).unwrap();
    let from_json = load_pipeline(&json_path, &Overrides::default()).unwrap();
    assert_eq!(from_json.config, loaded.config);

    std::fs::write(
        &json_path,
        "{\"model_dir\": \"x\",\n \"trainConfig\": {\"numStepz\": 3}}",
    )
    .unwrap();
    let err = loader::read_pipeline_file(&json_path).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:2:", json_path.display())), "{err}");
    assert!(err.contains("numStepz"), "{err}");
}

#[test]
fn auto_expand_input_fields() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.config");
    std::fs::write(
        &p,
        r#"model_dir: "m"
data_config { auto_expand_input_fields: true input_type: CSVInput
  input_fields { input_name: "label" input_type: INT32 }
  input_fields { input_name: "c[1-3]" input_type: STRING } label_fields: "label" }
feature_configs { input_names: "c2" hash_bucket_size: 10 embedding_dim: 4 }
model_config { model_class: "X" }"#,
    )
    .unwrap();
    let c = load_pipeline(&p, &Overrides::default()).unwrap().config;
    let names: Vec<_> = c
        .data_config
        .unwrap()
        .input_fields
        .iter()
        .map(|f| f.input_name.clone())
        .collect();
    assert_eq!(names, ["label", "c1", "c2", "c3"]);
}

/// Every shared sample config whose features we support trains a few steps
/// on generated rows of its own schema and evaluates; the rest are refused
/// with an error naming what is unsupported.
#[test]
fn supported_sample_configs_train_on_generated_data_of_their_schema() {
    use rustrec::config::typed::TrainingPlan;
    let mut trained = Vec::new();
    let mut refused = Vec::new();
    for path in common::easyrec_configs() {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        let ext = if name.contains("parquet") { "parquet" } else { "csv" };
        let (train, eval) = (
            dir.path().join(format!("train.{ext}")),
            dir.path().join(format!("eval.{ext}")),
        );
        let overrides = Overrides {
            model_dir: Some(dir.path().join("model").to_str().unwrap().to_string()),
            train_input_path: vec![train.to_str().unwrap().to_string()],
            eval_input_path: vec![eval.to_str().unwrap().to_string()],
            extend_args: vec![
                ("train_config.num_steps".into(), "3".into()),
                ("data_config.batch_size".into(), "16".into()),
                ("data_config.eval_batch_size".into(), "16".into()),
            ],
            ..Overrides::default()
        };
        let loaded = load_pipeline(&path, &overrides).unwrap();
        let mut plan = match TrainingPlan::from_config(&loaded.config) {
            Ok(plan) => plan,
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.contains("not supported"), "{name}: {msg}");
                refused.push((name, msg));
                continue;
            }
        };
        // Some samples ask for 1e8-row tables (12.8 GB each); a few steps on
        // 64 rows do not need them, so hashing is capped at 10k buckets.
        for f in &mut plan.features {
            use rustrec::config::typed::{Bucketing, FeatureKind};
            match &mut f.kind {
                FeatureKind::Id {
                    buckets: Bucketing::Hash(n),
                }
                | FeatureKind::Tag {
                    buckets: Bucketing::Hash(n),
                    ..
                }
                | FeatureKind::Combo { buckets: n, .. } => *n = (*n).min(10_000),
                _ => {}
            }
        }
        rustrec::datagen::generate_for_plan(&plan, 64, 1, &train).unwrap();
        rustrec::datagen::generate_for_plan(&plan, 48, 2, &eval).unwrap();
        let mut trainer = rustrec::train::Trainer::new(plan).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let summary = trainer.run().unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(trainer.step, 3, "{name}");
        assert!(summary.last_loss.is_finite(), "{name}");
        assert!(!summary.metrics.is_empty(), "{name}: no eval metrics");
        trained.push(name);
    }
    eprintln!("trained: {trained:?}\nrefused: {refused:#?}");
    // These use only supported features; a regression that refuses them fails here.
    for name in [
        "dcn_on_taobao.config",
        "deepfm_combo_on_avazu_embed_adagrad.config",
        "dlrm_on_criteo_parquet.config",
        "dlrm_on_criteo_parquet_ep_v2.config",
        "examples_deepfm_on_criteo.config",
        "examples_dlrm_on_criteo.config",
        "mmoe_on_taobao.config",
        "wide_and_deep_on_avazau_ctr.config",
        "wide_and_deep_two_opti.config",
    ] {
        assert!(
            trained.iter().any(|t| t == name),
            "{name} did not train; refused: {refused:#?}"
        );
    }
}
