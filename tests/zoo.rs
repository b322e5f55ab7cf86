//! EasyRec's configs as users wrote them (the shared samples and `zoo/`,
//! nearly every config of EasyRec's repository): each one, on generated rows
//! of its own schema, trains a few steps, evaluates and exports, and its
//! export scores like the checkpoint; or it is refused before anything runs
//! with a "not supported" message naming one option. The test prints the
//! counts and what refuses the rest, by option.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rustrec::config::data_plan::{BinaryPart, InputFormat};
use rustrec::config::feature_plan::{Bucketing, FeatureKind};
use rustrec::config::typed::TrainingPlan;
use rustrec::config::{load_pipeline, Overrides};
use rustrec::export::runtime::ExportedModel;
use rustrec::export::{export_bundle, ExportRequest, EXTERNAL_MIN_BYTES};
use rustrec::inference::Bundle;
use rustrec::train::Trainer;

/// Hashed tables are capped at this many rows: a few steps on 64 rows do
/// not need EasyRec's 1e8-row tables.
const TABLE_CAP: u64 = 10_000;

/// Inputs that are services, not files: refused by name, and outside the
/// share of file-input configs that must train.
const SERVICE_INPUTS: &[&str] = &[
    "OdpsInput",
    "OdpsInputV2",
    "OdpsInputV3",
    "OdpsRTPInput",
    "OdpsRTPInputV2",
    "DataHubInput",
    "HiveInput",
    "HiveRTPInput",
    "HiveParquetInput",
];

/// The configs that train, evaluate and export today: a regression that
/// stops one of them fails here (add to it as the zoo's coverage grows).
const PASSING: &[&str] = &[
    "dcn_on_taobao.config",
    "deepfm_combo_on_avazu_embed_adagrad.config",
    "dlrm_on_criteo.config",
    "dlrm_on_criteo_parquet.config",
    "dlrm_on_criteo_parquet_ep_v2.config",
    "examples_dcn_on_movielens.config",
    "examples_deepfm_on_criteo.config",
    "examples_deepfm_on_movielens.config",
    "examples_dlrm_on_criteo.config",
    "examples_multi_tower_on_movielens.config",
    "examples_wide_and_deep_on_movielens.config",
    "mmoe_on_taobao.config",
    "multi_tower_on_taobao.config",
    "wide_and_deep_on_avazau_ctr.config",
    "wide_and_deep_two_opti.config",
    "zoo/autoint_on_sequence_feature_taobao.config",
    "zoo/bst_backbone_on_taobao.config",
    "zoo/bst_on_taobao.config",
    "zoo/cdn_on_taobao.config",
    "zoo/cl4srec_on_taobao.config",
    "zoo/cl4srec_on_taobao_with_custom_op.config",
    "zoo/cmbf_on_movielens.config",
    "zoo/cmbf_on_movielens_has_other_feature.config",
    "zoo/cmbf_on_movielens_only_image_feature.config",
    "zoo/cmbf_on_movielens_only_text_feature.config",
    "zoo/cmbf_with_multi_loss.config",
    "zoo/custom_early_stop_on_taobao.config",
    "zoo/deepfm_combo_avazu_kafka_chief_redundant.config",
    "zoo/deepfm_combo_avazu_kafka_time_offset.config",
    "zoo/deepfm_combo_avazu_kafka_time_offset2.config",
    "zoo/dat_on_taobao.config",
    "zoo/dbmtl_backbone_on_taobao.config",
    "zoo/dbmtl_mmoe_on_taobao.config",
    "zoo/dbmtl_on_multi_numeric_boundary_allow_key_transform.config",
    "zoo/dbmtl_on_multi_numeric_boundary_allow_key_transform_dnn.config",
    "zoo/dbmtl_on_multi_numeric_boundary_allow_key_transform_multi_seq.config",
    "zoo/dbmtl_on_multi_numeric_boundary_sequence_feature_taobao.config",
    "zoo/dbmtl_on_multi_numeric_hash_bucket_sequence_feature_taobao.config",
    "zoo/dbmtl_on_multi_numeric_num_buckets_sequence_feature_taobao.config",
    "zoo/dbmtl_on_multi_numeric_raw_sequence_feature_taobao.config",
    "zoo/dbmtl_on_multi_sequence_feature_taobao.config",
    "zoo/dbmtl_on_numeric_boundary_sequence_feature_aux_hist_seq_taobao.config",
    "zoo/dbmtl_on_numeric_boundary_sequence_feature_taobao.config",
    "zoo/dbmtl_on_numeric_hash_bucket_sequence_feature_taobao.config",
    "zoo/dbmtl_on_sequence_feature_taobao.config",
    "zoo/dbmtl_on_taobao_test_feature_config.config",
    "zoo/dbmtl_on_taobao_with_multi_loss.config",
    "zoo/dbmtl_uniter_on_movielens.config",
    "zoo/dbmtl_variational_dropout.config",
    "zoo/dbmtl_variational_dropout_feature_num.config",
    "zoo/dbmtl_variational_dropout_on_sequence_feature_taobao.config",
    "zoo/dcn_f1_on_taobao.config",
    "zoo/dcn_on_taobao.config",
    "zoo/deepfm_combo_on_avazu_adamw_ctr.config",
    "zoo/deepfm_combo_on_avazu_embed_adagrad.config",
    "zoo/deepfm_combo_on_avazu_emblr_ctr.config",
    "zoo/deepfm_combo_on_avazu_eval_online_ctr.config",
    "zoo/deepfm_combo_on_avazu_feature_name.config",
    "zoo/deepfm_combo_on_avazu_momentumw_ctr.config",
    "zoo/deepfm_combo_on_avazu_reg.config",
    "zoo/deepfm_combo_on_avazu_sigmoid_l2.config",
    "zoo/deepfm_combo_v2_on_avazu_ctr.config",
    "zoo/deepfm_combo_variational_dropout_on_avazu_ctr.config",
    "zoo/deepfm_distribute_eval_multi_cls_on_avazu_ctr.config",
    "zoo/deepfm_freeze_gradient.config",
    "zoo/deepfm_lookup.config",
    "zoo/deepfm_multi_cls_on_avazu_ctr.config",
    "zoo/deepfm_on_criteo_batch_tfrecord.config",
    "zoo/deepfm_on_criteo_tfrecord.config",
    "zoo/deepfm_vocab_list_on_avazu_ctr.config",
    "zoo/deepfm_vocab_list_on_taobao.config",
    "zoo/deepfm_with_embed.config",
    "zoo/deppfm_seq_attn_on_taobao.config",
    "zoo/din_backbone_on_taobao.config",
    "zoo/din_on_gzip_data.config",
    "zoo/din_on_sequence_feature_taobao.config",
    "zoo/din_on_taobao.config",
    "zoo/din_on_taobao_latest_export.config",
    "zoo/din_varitional_dropout_on_taobao.config",
    "zoo/dlrm_backbone_on_taobao.config",
    "zoo/dlrm_on_criteo.config",
    "zoo/dlrm_on_criteo_parquet.config",
    "zoo/dlrm_on_criteo_parquet_ep_v2.config",
    "zoo/dropoutnet_distribute_eval_on_taobao.config",
    "zoo/dropoutnet_on_taobao.config",
    "zoo/dssm_distribute_eval_listwise_hard_neg_sampler_on_taobao.config",
    "zoo/dssm_distribute_eval_reg_on_taobao.config",
    "zoo/dssm_hard_neg_sampler_on_taobao.config",
    "zoo/dssm_hard_neg_sampler_regular_on_taobao.config",
    "zoo/dssm_hard_neg_sampler_v2_on_taobao.config",
    "zoo/dssm_inner_prod_on_taobao.config",
    "zoo/dssm_kd_on_taobao.config",
    "zoo/dssm_neg_sampler_need_key_feature.config",
    "zoo/dssm_neg_sampler_on_taobao.config",
    "zoo/dssm_neg_sampler_sequence_feature.config",
    "zoo/dssm_neg_sampler_v2_on_taobao.config",
    "zoo/dssm_neg_sampler_with_sample_weight.config",
    "zoo/dssm_on_sequence_feature_taobao.config",
    "zoo/dssm_on_taobao.config",
    "zoo/dssm_senet_on_taobao.config",
    "zoo/dssm_with_sample_weight.config",
    "zoo/esmm_distribute_eval_on_taobao.config",
    "zoo/esmm_on_sequence_feature_taobao.config",
    "zoo/esmm_on_taobao.config",
    "zoo/examples_configs__autoint_on_movielens.config",
    "zoo/examples_configs__dcn_backbone_on_movielens.config",
    "zoo/examples_configs__deepfm_backbone_on_criteo.config",
    "zoo/examples_configs__deepfm_backbone_on_criteo_with_autodis.config",
    "zoo/examples_configs__deepfm_backbone_on_criteo_with_periodic.config",
    "zoo/examples_configs__deepfm_backbone_on_movielens.config",
    "zoo/examples_configs__deepfm_on_criteo.config",
    "zoo/examples_configs__deepfm_on_movielens.config",
    "zoo/examples_configs__dlrm_backbone_on_criteo.config",
    "zoo/examples_configs__dlrm_on_criteo.config",
    "zoo/examples_configs__dlrm_on_criteo_with_autodis.config",
    "zoo/examples_configs__dlrm_on_criteo_with_periodic.config",
    "zoo/examples_configs__dlrm_senet_on_criteo.config",
    "zoo/examples_configs__dssm_senet_on_taobao.config",
    "zoo/examples_configs__fibinet_on_movielens.config",
    "zoo/examples_configs__mind_on_books_negative_sample.config",
    "zoo/examples_configs__mlp_on_movielens.config",
    "zoo/examples_configs__multi_tower_on_movielens.config",
    "zoo/examples_configs__wide_and_deep_backbone_on_movielens.config",
    "zoo/examples_configs__wide_and_deep_on_movielens.config",
    "zoo/export_filter_input.config",
    "zoo/fibinet_on_taobao.config",
    "zoo/fm_on_taobao.config",
    "zoo/fm_variational_dropout_on_taobao.config",
    "zoo/highway_on_movielens.config",
    "zoo/kv_tag.config",
    "zoo/masknet_on_taobao.config",
    "zoo/mind_on_taobao.config",
    "zoo/mind_on_taobao_hard_neg_sam.config",
    "zoo/mind_on_taobao_with_time.config",
    "zoo/mlp_on_taobao_with_ziln_loss.config",
    "zoo/mmoe_backbone_on_taobao.config",
    "zoo/mmoe_on_taobao.config",
    "zoo/mmoe_on_taobao_deprecated.config",
    "zoo/mmoe_on_taobao_with_multi_loss.config",
    "zoo/multi_tower_backbone_on_taobao.config",
    "zoo/multi_tower_early_stop_on_taobao.config",
    "zoo/multi_tower_export.config",
    "zoo/multi_tower_mirrored_strategy_on_taobao.config",
    "zoo/multi_tower_multi_value_export_on_taobao.config",
    "zoo/multi_tower_on_taobao.config",
    "zoo/multi_tower_on_taobao_gauc.config",
    "zoo/multi_tower_on_taobao_session_auc.config",
    "zoo/multi_tower_on_taobao_sok.config",
    "zoo/multi_tower_on_taobao_unblanace.config",
    "zoo/multi_tower_ps_strategy_2gpu_on_taobao.config",
    "zoo/multi_tower_ps_strategy_on_taobao.config",
    "zoo/multi_tower_with_embed.config",
    "zoo/parallel_dssm_on_taobao_backbone.config",
    "zoo/ple_on_sequence_feature_taobao.config",
    "zoo/ple_on_taobao.config",
    "zoo/rocket_launching.config",
    "zoo/rocket_launching_feature_based.config",
    "zoo/rocket_launching_on_sequence_feature_taobao.config",
    "zoo/rocket_launching_with_rtp_input.config",
    "zoo/rtp.config",
    "zoo/share_not_used.config",
    "zoo/simple_multi_task_backbone_on_taobao.config",
    "zoo/simple_multi_task_on_sequence_feature_taobao.config",
    "zoo/simple_multi_task_on_taobao.config",
    "zoo/taobao_fg.config",
    "zoo/taobao_fg_incr_save.config",
    "zoo/taobao_fg_incr_save_ev.config",
    "zoo/taobao_fg_export.config",
    "zoo/taobao_fg_signal_stop.config",
    "zoo/taobao_fg_test_dtype.config",
    "zoo/text_cnn_on_movielens.config",
    "zoo/uniter_on_movielens.config",
    "zoo/uniter_on_movielens_only_image_feature.config",
    "zoo/wide_and_deep_backbone_on_avazau.config",
    "zoo/wide_and_deep_on_avazau_ctr.config",
    "zoo/wide_and_deep_on_sequence_feature_taobao.config",
    "zoo/wide_and_deep_two_opti.config",
    "zoo/xdeepfm_on_taobao_backbone.config",
    "zoo/fg_train_ev.config",
    "zoo/rtp_fg__fg_test_extensions.config",
    "zoo/rtp_fg__fg_test_extensions_final.config",
    "zoo/fg_ev_v2.config",
];

/// Configs of EasyRec's repository that EasyRec itself cannot run, with
/// what our error must say about them.
const BROKEN_IN_EASYREC: &[(&str, &str)] = &[(
    // FM stacks the deep group's embeddings (tf.stack): raw features
    // embedded to 10 and ids to 16 dimensions cannot stack in EasyRec either.
    "zoo/examples_configs__fm_on_criteo.config",
    "FM: every embedded feature of group `deep` needs the same embedding_dim",
)];

/// What a config file is, read as written (before any override).
enum Kind {
    /// Reads a service (ODPS, Kafka, ...).
    Service,
    /// A fragment that other tools complete (HPO search spaces, RTP
    /// feature-generation model parts): no data_config, no features (nor a
    /// feature-generation file) or no model.
    Fragment,
    /// A whole pipeline config reading files.
    Files,
    /// A whole pipeline config reading Kafka: trained against the tests'
    /// broker, on a topic of generated rows.
    Kafka,
}

fn kind_of(path: &Path) -> Kind {
    let Ok(msg) = rustrec::config::loader::read_pipeline_file(path) else {
        return Kind::Files;
    };
    let text = rustrec::config::loader::render_text(&msg);
    let has = |section: &str| text.lines().any(|l| l.starts_with(section));
    let features = has("feature_config") || has("feature_configs") || has("fg_json_path");
    if !has("data_config") || !features || !has("model_config") {
        return Kind::Fragment;
    }
    let service = text.lines().any(|l| {
        l.trim()
            .strip_prefix("input_type: ")
            .is_some_and(|v| SERVICE_INPUTS.contains(&v))
    });
    if service {
        Kind::Service
    } else if text.lines().any(|l| l.trim() == "input_type: KafkaInput") {
        Kind::Kafka
    } else {
        Kind::Files
    }
}

enum Outcome {
    /// Trained, evaluated, exported, and the export scores like eval.
    Passed,
    /// Refused before training with a "not supported" message.
    Refused(String),
    /// Anything else: a failure of ours.
    Failed(String),
}

fn configs() -> Vec<PathBuf> {
    let mut all = common::easyrec_configs();
    let zoo = common::shared_dir().join("easyrec_configs/zoo");
    let mut more: Vec<PathBuf> = std::fs::read_dir(&zoo)
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    more.retain(|p| p.extension().is_some_and(|e| e == "config"));
    more.sort();
    all.extend(more);
    all
}

/// The option a "not supported" message names (the text before its first
/// `: `), so refusals can be counted by option.
fn option_of(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or(msg);
    // A parse error (`file:line:col: `...` is an EasyRec option ...`) names
    // the option between backticks.
    if first.contains(".config:") || first.contains(".json:") {
        let named = first.split('`').nth(1).unwrap_or(first);
        let named: String = named
            .split('.')
            .map(|p| p.split('[').next().unwrap_or(p))
            .collect::<Vec<_>>()
            .join(".");
        return format!("{named}: not in this trainer's schema");
    }
    let (path, rest) = first.split_once(": ").unwrap_or((first, ""));
    let what = rest.split(" is not supported").next().unwrap_or(rest);
    // Indices and file positions would split one option into many.
    let path: String = path
        .split('.')
        .map(|p| p.split('[').next().unwrap_or(p))
        .collect::<Vec<_>>()
        .join(".");
    format!("{path}: {what}")
}

fn cap_tables(plan: &mut TrainingPlan) {
    for f in &mut plan.features.specs {
        match &mut f.kind {
            FeatureKind::Id {
                buckets: Bucketing::Hash(n),
            }
            | FeatureKind::Tag {
                buckets: Bucketing::Hash(n),
                ..
            }
            | FeatureKind::Sequence {
                buckets: Bucketing::Hash(n),
                ..
            }
            | FeatureKind::Combo { buckets: n, .. } => *n = (*n).min(TABLE_CAP),
            _ => {}
        }
    }
}

/// Generated rows of `plan`'s schema in a new topic of two partitions on
/// the tests' broker, dealt round-robin; returns the topic.
fn kafka_topic(plan: &TrainingPlan, dir: &Path, rows: usize) -> anyhow::Result<String> {
    let csv = dir.join("stream.csv");
    rustrec::datagen::generate_for_plan(plan, rows, 1, &csv)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let topic = format!("zoo_{}_{nanos}", std::process::id());
    let input = rustrec::config::kafka_plan::KafkaInput::of_topic("zoo", vec![common::kafka_server()], &topic);
    let t = rustrec::data::kafka::Topic::connect(&input)?;
    let parts = t.create(2)?;
    let now = chrono::Utc::now().timestamp_millis();
    let mut by_part = vec![Vec::new(); parts.len()];
    for (i, line) in std::fs::read_to_string(&csv)?.lines().enumerate() {
        by_part[i % parts.len()].push(rustrec::data::kafka::Message {
            value: line.as_bytes().to_vec(),
            timestamp_ms: now,
            ..Default::default()
        });
    }
    for (p, msgs) in parts.iter().zip(by_part) {
        t.produce(*p, msgs)?;
    }
    Ok(topic)
}

fn try_config(path: &Path, dir: &Path) -> Outcome {
    let ext = if path.to_string_lossy().contains("parquet") {
        "parquet"
    } else {
        "csv"
    };
    let (train, eval) = (dir.join(format!("train.{ext}")), dir.join(format!("eval.{ext}")));
    let overrides = Overrides {
        model_dir: Some(dir.join("model").to_str().unwrap().to_string()),
        train_input_path: vec![train.to_str().unwrap().to_string()],
        eval_input_path: vec![eval.to_str().unwrap().to_string()],
        extend_args: vec![
            ("train_config.num_steps".into(), "3".into()),
            ("data_config.batch_size".into(), "16".into()),
            ("data_config.eval_batch_size".into(), "16".into()),
        ],
        ..Overrides::default()
    };
    let refused_or_failed = |e: anyhow::Error| {
        let msg = format!("{e:#}");
        if msg.contains("not supported") {
            Outcome::Refused(msg)
        } else {
            Outcome::Failed(msg)
        }
    };
    // Binary Criteo parts are named by binary_*_input, not the input paths:
    // generated parts replace the config's in the plan.
    let binary = std::fs::read_to_string(path).is_ok_and(|t| t.contains("binary_train_input"));
    let kafka = matches!(kind_of(path), Kind::Kafka);
    let overrides = if binary || kafka {
        Overrides {
            train_input_path: Vec::new(),
            eval_input_path: Vec::new(),
            ..overrides
        }
    } else {
        overrides
    };
    let mut loaded = match load_pipeline(path, &overrides) {
        Ok(l) => l,
        Err(e) => return refused_or_failed(e.into()),
    };
    // Hashed tables capped before the plan sizes the model.
    let c = &mut loaded.config;
    let features = c
        .feature_configs
        .iter_mut()
        .chain(c.feature_config.iter_mut().flat_map(|f| f.features.iter_mut()));
    for f in features {
        if let Some(n) = &mut f.hash_bucket_size {
            *n = (*n).min(TABLE_CAP as _);
        }
    }
    let mut plan = match TrainingPlan::from_config(&loaded.config) {
        Ok(p) => p,
        Err(e) => return refused_or_failed(e.into()),
    };
    if kafka {
        // The broker and topic are the tests', as a user overrides them
        // (`--edit_config_json '{"kafka_train_input.server": ...}'`).
        let topic = match kafka_topic(&plan, dir, 160) {
            Ok(t) => t,
            Err(e) => return Outcome::Failed(format!("{e:#}")),
        };
        for k in [&mut plan.data.train_kafka, &mut plan.data.eval_kafka]
            .into_iter()
            .flatten()
        {
            k.servers = vec![common::kafka_server()];
            k.topic = topic.clone();
        }
    }
    // Updates sent to Kafka go to the tests' broker, to a topic of their own.
    if let Some(k) = plan.train.incr_save.as_mut().and_then(|i| i.kafka.as_mut()) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        k.servers = vec![common::kafka_server()];
        k.topic = format!("zoo_updates_{}_{nanos}", std::process::id());
    }
    if let InputFormat::CriteoBinary { parts } = &mut plan.data.format {
        let at = |p: &Path, ext: &str| p.with_extension(ext).to_str().unwrap().to_string();
        *parts = [&train, &eval]
            .map(|p| BinaryPart {
                label: at(p, "label.bin"),
                dense: at(p, "dense.bin"),
                category: at(p, "category.bin"),
            })
            .to_vec();
        plan.data.train_paths = vec![parts[0].label.clone()];
        plan.data.eval_paths = vec![parts[1].label.clone()];
    }
    let (train, eval) = match &plan.data.format {
        InputFormat::CriteoBinary { parts } => (PathBuf::from(&parts[0].label), PathBuf::from(&parts[1].label)),
        InputFormat::Csv { .. }
        | InputFormat::Parquet { .. }
        | InputFormat::Rtp { .. }
        | InputFormat::TfRecord { .. } => (train, eval),
    };
    cap_tables(&mut plan);
    // A negative sampler's tables are data too: generated in `dir`.
    if let Some(s) = &mut plan.data.negative_sampling {
        let at = |name: &str| dir.join(name).to_str().unwrap().to_string();
        s.items_path = at("items.txt");
        if let Some(u) = &mut s.users {
            u.users_path = at("users.txt");
            u.positive_edges = u.positive_edges.as_ref().map(|_| at("positive_edges.txt"));
            u.hard_edges = u.hard_edges.as_ref().map(|_| at("hard_edges.txt"));
        }
    }
    let run = || -> anyhow::Result<()> {
        if !kafka {
            rustrec::datagen::generate_for_plan(&plan, 64, 1, &train)?;
            rustrec::datagen::generate_for_plan(&plan, 48, 2, &eval)?;
        }
        if let Some(s) = &plan.data.negative_sampling {
            let rows = (s.num_sample.max(s.num_eval_sample) as usize + 16).max(64);
            rustrec::datagen::generate_sampler_tables(&plan, rows, 3)?;
        }
        let mut trainer = Trainer::new(plan.clone())?;
        let summary = trainer.run()?;
        // A dead_line already past ends training after its first step, as
        // EasyRec's hook checks it after each step.
        let past = plan.train.dead_line.is_some_and(|d| d < chrono::Utc::now().timestamp());
        let steps = if past { 1 } else { 3 };
        anyhow::ensure!(trainer.step == steps, "trained to step {}, not {steps}", trainer.step);
        anyhow::ensure!(summary.last_loss.is_finite(), "loss {}", summary.last_loss);
        anyhow::ensure!(!summary.metrics.is_empty(), "no eval metrics");
        let root = dir.join("export");
        export_bundle(
            &Bundle::of(&trainer)?,
            &root,
            &ExportRequest {
                config_text: &loaded.to_text(),
                asset_files: &[],
                metrics: &summary.metrics,
                checkpoint: None,
                external_min_bytes: EXTERNAL_MIN_BYTES,
            },
        )?;
        let exported = ExportedModel::load(&root)?;
        let batch = trainer.eval_stream(&plan.data.eval_paths)?.next().expect("eval rows")?;
        let ours = trainer.score(&batch);
        let theirs = exported.score(&batch)?;
        for (o, e) in ours.iter().zip(&theirs) {
            for (a, b) in o.scores.iter().zip(&e.scores) {
                anyhow::ensure!((a - b).abs() <= 1e-4, "export scores {b}, eval {a}");
            }
        }
        Ok(())
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(e)) => refused_or_failed(e),
        Err(p) => Outcome::Failed(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

#[test]
fn easyrec_configs_train_evaluate_and_export_or_are_refused_by_name() {
    let mut passed = Vec::new();
    let mut refused: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failed = Vec::new();
    let (mut services, mut fragments, mut files, mut broken, mut kafka) = (0, Vec::new(), 0, 0, 0);
    let mut kafka_passed = 0;
    // `ZOO_FILTER=autoint cargo test --test zoo` tries only the configs
    // whose name holds it (while working on them).
    let filter = std::env::var("ZOO_FILTER").unwrap_or_default();
    let name_of = |path: &Path| {
        path.strip_prefix(common::shared_dir().join("easyrec_configs"))
            .unwrap()
            .display()
            .to_string()
    };
    let all: Vec<PathBuf> = configs().into_iter().filter(|p| name_of(p).contains(&filter)).collect();
    // Classified in order, tried on as many threads as there are cores
    // (each config in its own model_dir), then counted in that order.
    let mut todo = Vec::new();
    for path in &all {
        let name = name_of(path);
        let kind = kind_of(path);
        match kind {
            Kind::Fragment => {
                fragments.push(name);
                continue;
            }
            Kind::Service => services += 1,
            Kind::Files => files += 1,
            Kind::Kafka => kafka += 1,
        }
        todo.push((name, path, matches!(kind, Kind::Kafka)));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes = std::sync::Mutex::new((0..todo.len()).map(|_| None).collect::<Vec<Option<Outcome>>>());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((_, path, _)) = todo.get(i) else {
                    break;
                };
                let dir = tempfile::tempdir().unwrap();
                let outcome = try_config(path, dir.path());
                outcomes.lock().unwrap()[i] = Some(outcome);
            });
        }
    });
    for ((name, _, reads_kafka), outcome) in todo.into_iter().zip(outcomes.into_inner().unwrap()) {
        match outcome.expect("every config tried") {
            Outcome::Passed => {
                kafka_passed += usize::from(reads_kafka);
                passed.push(name)
            }
            Outcome::Refused(msg) => refused.entry(option_of(&msg)).or_default().push(name),
            Outcome::Failed(msg) => match BROKEN_IN_EASYREC.iter().find(|(n, _)| *n == name) {
                Some((_, want)) => {
                    assert!(msg.contains(want), "{name}: {msg}");
                    broken += 1;
                }
                None => failed.push((name, msg)),
            },
        }
    }
    let mut by_count: Vec<(&String, &Vec<String>)> = refused.iter().collect();
    by_count.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
    eprintln!(
        "{} configs ({} fragments of configs skipped: {fragments:?}); of {files} reading files, {} ({:.0}%) train, \
         evaluate and export; of {kafka} reading Kafka, {kafka_passed} train against the local broker; \
         {services} read other services; {} refused by name; {broken} fail in EasyRec too; {} fail",
        all.len(),
        fragments.len(),
        passed.len() - kafka_passed,
        100.0 * (passed.len() - kafka_passed) as f64 / files.max(1) as f64,
        refused.values().map(Vec::len).sum::<usize>(),
        failed.len()
    );
    for (option, names) in &by_count {
        eprintln!("  refused {:3}: {option} (e.g. {})", names.len(), names[0]);
    }
    for (name, msg) in &failed {
        eprintln!("  FAILED {name}: {}", msg.lines().next().unwrap_or(""));
    }
    eprintln!("passed: {passed:?}");
    assert!(
        failed.is_empty(),
        "{} configs neither train, evaluate and export nor are refused by name (see above)",
        failed.len()
    );
    let lost: Vec<&&str> = PASSING
        .iter()
        .filter(|p| p.contains(&filter) && !passed.iter().any(|n| n == *p))
        .collect();
    assert!(lost.is_empty(), "these configs passed before and do not now: {lost:?}");
}
