//! The override examples of EasyRec's `--edit_config_json` and extend args.

mod common;

use rustrec::config::proto::{self, feature_config::FeatureType};
use rustrec::config::{load_pipeline, ConfigError, Overrides};

fn base() -> std::path::PathBuf {
    common::sample("wide_and_deep_two_opti.config")
}

fn with_json(json: &str) -> Result<proto::EasyRecConfig, ConfigError> {
    let o = Overrides {
        edit_config_json: Some(json.to_string()),
        ..Overrides::default()
    };
    load_pipeline(&base(), &o).map(|l| l.config)
}

fn ok(json: &str) -> proto::EasyRecConfig {
    with_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn dims(c: &proto::EasyRecConfig) -> Vec<u32> {
    c.feature_configs.iter().map(|f| f.embedding_dim()).collect()
}

fn wd(c: &proto::EasyRecConfig) -> &proto::WideAndDeep {
    match &c.model_config.model {
        Some(proto::easy_rec_model::Model::WideAndDeep(w)) => w,
        _ => panic!("wide_and_deep expected"),
    }
}

#[test]
fn scalar_paths() {
    let c =
        ok(r#"{"train_config.num_steps": 10, "data_config.batch_size": "64", "train_config.sync_replicas": false}"#);
    let t = c.train_config.as_ref().unwrap();
    assert_eq!(t.num_steps(), 10);
    assert!(!t.sync_replicas());
    assert_eq!(c.data_config.unwrap().batch_size(), 64);
    // bools as strings, both spellings EasyRec accepts
    assert!(ok(r#"{"train_config.sync_replicas": "True"}"#)
        .train_config
        .unwrap()
        .sync_replicas());
    assert!(!ok(r#"{"train_config.sync_replicas": "false"}"#)
        .train_config
        .unwrap()
        .sync_replicas());
    // floats
    assert_eq!(
        ok(r#"{"model_config.embedding_regularization": 1e-5}"#)
            .model_config
            .embedding_regularization(),
        1e-5
    );
}

#[test]
fn list_values_as_json_or_text() {
    assert_eq!(
        wd(&ok(r#"{"model_config.wide_and_deep.dnn.hidden_units": [48, 24]}"#))
            .dnn
            .hidden_units,
        [48, 24]
    );
    assert_eq!(
        wd(&ok(r#"{"model_config.wide_and_deep.dnn.hidden_units": "[48, 24]"}"#))
            .dnn
            .hidden_units,
        [48, 24]
    );
    let c = ok(r#"{"data_config.label_fields": ["label"]}"#);
    assert_eq!(c.data_config.unwrap().label_fields, ["label"]);
}

#[test]
fn index_and_slice_selectors() {
    let before = dims(&ok("{}"));
    let n = before.len();
    assert_eq!(n, 22);
    let all = dims(&ok(r#"{"feature_configs[:].embedding_dim": 7}"#));
    assert!(all.iter().all(|d| *d == 7));
    let one = dims(&ok(r#"{"feature_configs[5].embedding_dim": 7}"#));
    assert_eq!(one.iter().filter(|d| **d == 7).count(), 1);
    assert_eq!(one[5], 7);
    let tail = dims(&ok(r#"{"feature_configs[5:].embedding_dim": 7}"#));
    assert_eq!(tail[..5], before[..5]);
    assert!(tail[5..].iter().all(|d| *d == 7));
    let mid = dims(&ok(r#"{"feature_configs[10:-2].embedding_dim": 7}"#));
    assert_eq!(mid[..10], before[..10]);
    assert!(mid[10..n - 2].iter().all(|d| *d == 7));
    assert_eq!(mid[n - 2..], before[n - 2..]);
    let last = dims(&ok(r#"{"feature_configs[-1].embedding_dim": 7}"#));
    assert_eq!(last[n - 1], 7);
    assert_eq!(last[..n - 1], before[..n - 1]);
}

#[test]
fn condition_selectors() {
    let c = ok(r#"{"feature_configs[input_names[0]=site_id].hash_bucket_size": 77}"#);
    let site = c
        .feature_configs
        .iter()
        .find(|f| f.input_names[0] == "site_id")
        .unwrap();
    assert_eq!(site.hash_bucket_size(), 77);
    assert_eq!(
        c.feature_configs.iter().filter(|f| f.hash_bucket_size() == 77).count(),
        1
    );

    let c = ok(r#"{"feature_configs[feature_type=RawFeature].embedding_dim": 3}"#);
    for f in &c.feature_configs {
        assert_eq!(
            f.embedding_dim() == 3,
            f.feature_type() == FeatureType::RawFeature,
            "{:?}",
            f.input_names
        );
    }
    let before = dims(&ok("{}"));
    type Case = (&'static str, u32, fn(u32) -> bool);
    let cases: [Case; 5] = [
        (">=", 32, |d| d >= 32),
        ("<=", 16, |d| d <= 16),
        (">", 32, |d| d > 32),
        ("<", 20, |d| d < 20),
        ("=", 20, |d| d == 20),
    ];
    for (op, bound, pred) in cases {
        let c = ok(&format!(
            r#"{{"feature_configs[embedding_dim{op}{bound}].embedding_dim": 1}}"#
        ));
        for (b, a) in before.iter().zip(dims(&c)) {
            assert_eq!(a, if pred(*b) { 1 } else { *b }, "op {op}");
        }
    }
}

#[test]
fn enums_by_name_and_message_values() {
    let c = ok(
        r#"{"feature_configs[3].feature_type": "TagFeature", "train_config.train_distribute": "MultiWorkerMirroredStrategy"}"#,
    );
    assert_eq!(c.feature_configs[3].feature_type(), FeatureType::TagFeature);
    // validation runs after edits: a RawFeature turned IdFeature needs a bucketing
    let err = with_json(r#"{"feature_configs[0].feature_type": "IdFeature"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("feature_configs[0]: IdFeature (`hour`) needs one of"),
        "{err}"
    );
    assert_eq!(
        c.train_config.unwrap().train_distribute(),
        proto::DistributionStrategy::MultiWorkerMirroredStrategy
    );

    let c = ok(r#"{"model_config.wide_and_deep.dnn": "{hidden_units: [8, 4] use_bn: false}"}"#);
    let dnn = wd(&c).dnn.clone();
    assert_eq!(dnn.hidden_units, [8, 4]);
    assert!(!dnn.use_bn());
    let c = ok(
        r#"{"train_config.optimizer_config[1]": "adagrad_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.5 } } }"}"#,
    );
    assert!(matches!(
        c.train_config.unwrap().optimizer_config[1].optimizer,
        Some(proto::optimizer::Optimizer::AdagradOptimizer(_))
    ));
}

#[test]
fn several_keys_in_one_entry() {
    let c = ok(r#"{"train_config.num_steps;data_config.batch_size": "5;6"}"#);
    assert_eq!(c.train_config.unwrap().num_steps(), 5);
    assert_eq!(c.data_config.unwrap().batch_size(), 6);
}

#[test]
fn extend_args_override_json_and_cli_flags_apply() {
    let o = Overrides {
        model_dir: Some("/tmp/elsewhere".into()),
        train_input_path: vec!["a.csv".into(), "b.csv".into()],
        fine_tune_checkpoint: Some("old/model.ckpt-5".into()),
        edit_config_json: Some(r#"{"train_config.num_steps": 10, "data_config.batch_size": 8}"#.into()),
        extend_args: vec![("train_config.num_steps".into(), "20".into())],
        ..Overrides::default()
    };
    let c = load_pipeline(&base(), &o).unwrap().config;
    assert_eq!(c.model_dir, "/tmp/elsewhere");
    assert_eq!(
        c.train_path,
        Some(proto::easy_rec_config::TrainPath::TrainInputPath("a.csv,b.csv".into()))
    );
    let t = c.train_config.unwrap();
    assert_eq!(t.num_steps(), 20);
    assert_eq!(t.fine_tune_checkpoint(), "old/model.ckpt-5");
    assert_eq!(c.data_config.unwrap().batch_size(), 8);
}

#[test]
fn bad_paths_name_the_path() {
    let cases = [
        (
            r#"{"train_config.num_stepz": 1}"#,
            "no field `num_stepz` in `train_config`; did you mean `num_steps`?",
        ),
        (
            r#"{"feature_configs[99].embedding_dim": 1}"#,
            "index [99] is out of range: `feature_configs` has 22 elements",
        ),
        (
            r#"{"feature_configs.embedding_dim": 1}"#,
            "`feature_configs` is repeated: select elements",
        ),
        (
            r#"{"train_config.num_steps[0]": 1}"#,
            "`train_config.num_steps` is not repeated",
        ),
        (
            r#"{"feature_configs[input_names[0]=nope].embedding_dim": 1}"#,
            "the path selects no element",
        ),
        (
            r#"{"train_config.num_steps": "ten"}"#,
            "`num_steps` takes a non-negative 32-bit integer, found `ten`",
        ),
        (
            r#"{"train_config.sync_replicas": "yes"}"#,
            "`sync_replicas` takes true or false, found `yes`",
        ),
        (
            r#"{"train_config.train_distribute": "Mirrored"}"#,
            "did you mean `MirroredStrategy`?",
        ),
        (r#"{"a;b": "1"}"#, "2 keys but 1 values"),
        (r#"[1]"#, "expected a JSON object"),
    ];
    for (json, want) in cases {
        let err = with_json(json).unwrap_err().to_string();
        assert!(err.contains(want), "{json}: got `{err}`, want `{want}`");
    }
}
