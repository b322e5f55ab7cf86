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
