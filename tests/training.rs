//! Training internals checked numerically: every model's dense path against
//! finite differences, and deterministic resumption.

use std::path::Path;

mod common;

use rustrec::config::{load_pipeline, typed::TrainingPlan};
use rustrec::features::{Batch, Encoded};
use rustrec::model::exec::burn::Burn;
use rustrec::train::Trainer;
use rustrec::util::Rng;

const COMMON: &str = r#"
train_input_path: "DATA"
eval_input_path: "DATA"
model_dir: "MODEL_DIR"
train_config {
  optimizer_config { adagrad_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.1 } } } }
  optimizer_config { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } } }
  num_steps: 10
}
eval_config { metrics_set { auc {} } }
data_config {
  input_type: CSVInput
  batch_size: 16
  shuffle: false
  input_fields { input_name: "label" input_type: INT32 }
  input_fields { input_name: "d1" input_type: DOUBLE }
  input_fields { input_name: "d2" input_type: DOUBLE }
  input_fields { input_name: "c1" input_type: STRING }
  input_fields { input_name: "c2" input_type: STRING }
  input_fields { input_name: "c3" input_type: STRING }
  input_fields { input_name: "label2" input_type: INT32 }
  label_fields: ["label", "label2"]
}
feature_configs { input_names: "d1" feature_type: RawFeature }
feature_configs { input_names: "d2" feature_type: RawFeature }
feature_configs { input_names: "c1" feature_type: IdFeature hash_bucket_size: 50 embedding_dim: 4 }
feature_configs { input_names: "c2" feature_type: IdFeature num_buckets: 10 embedding_dim: 4 }
feature_configs { input_names: "c3" feature_type: TagFeature separator: "|" hash_bucket_size: 30 embedding_dim: 4 combiner: "mean" }
"#;

fn model_block(name: &str) -> &'static str {
    match name {
        "WideAndDeep" => {
            r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [8, 4] } } }"#
        }
        "DLRM" => {
            r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [8, 4] } top_dnn { hidden_units: [8] } arch_with_dense_feature: true } }"#
        }
        "DeepFM" => {
            r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } } }"#
        }
        "DeepFM over pooled sequences" => {
            r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 30 embedding_dim: 4
  sequence_combiner { text_cnn { filter_sizes: [1, 2] num_filters: [3, 1] pad_sequence_length: 3 activation: "tanh" } } }
feature_configs { input_names: "c3" feature_name: "att" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 20 embedding_dim: 4 max_seq_len: 2 sequence_combiner { attention {} } }
model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["title", "c1", "d1", "att", "c2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] activation: "tanh" } } }"#
        }
        "DeepFM with variational dropout" => {
            r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } }
  variational_dropout { regularization_lambda: 0.5 } }"#
        }
        "AutoInt" => {
            r#"model_config { model_class: "AutoInt"
  feature_groups { group_name: "all" feature_names: ["c1", "c2", "c3"] wide_deep: DEEP }
  autoint { multi_head_num: 2 multi_head_size: 3 interacting_layer_num: 2 } }"#
        }
        "DCN" => {
            r#"model_config { model_class: "DCN"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dcn { deep_tower { input: "all" dnn { hidden_units: [8] } }
        cross_tower { input: "all" cross_num: 2 }
        final_dnn { hidden_units: [4] } } }"#
        }
        "MultiTower" => {
            r#"model_config { model_class: "MultiTower"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                towers { input: "item" dnn { hidden_units: [4] use_bn: false activation: "tanh" } }
                final_dnn { hidden_units: [4] } } }"#
        }
        "MMoE" => {
            r#"model_config { model_class: "MMoE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  mmoe { expert_dnn { hidden_units: [8, 4] } num_expert: 3
         task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
         task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } weight: 0.5 } } }"#
        }
        "DSSM_SENet" => {
            r#"model_config { model_class: "DSSM_SENet"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  dssm_senet { user_tower { id: "c1" senet { reduction_ratio: 2 num_squeeze_group: 1 } dnn { hidden_units: [8, 4] } }
               item_tower { id: "c2" senet { reduction_ratio: 1 num_squeeze_group: 1 } dnn { hidden_units: [4] } }
               simi_func: INNER_PRODUCT } }"#
        }
        "PLE" => {
            r#"model_config { model_class: "PLE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  ple {
    extraction_networks { network_name: "layer1" expert_num_per_task: 2 share_num: 2
      task_expert_net { hidden_units: [8, 4] } share_expert_net { hidden_units: [6, 4] use_bn: false } }
    extraction_networks { network_name: "layer2" expert_num_per_task: 1
      task_expert_net { hidden_units: [3] activation: "tanh" } }
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" weight: 0.5 } } }"#
        }
        "SimpleMultiTask" => {
            r#"model_config { model_class: "SimpleMultiTask"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  simple_multi_task {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [8, 4] } }
    task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] use_bn: false } weight: 0.5 } } }"#
        }
        "ESMM" => {
            r#"model_config { model_class: "ESMM"
  feature_groups { group_name: "user" feature_names: ["d1", "c1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["d2", "c2"] }
  esmm { groups { input: "user" dnn { hidden_units: [8] } } groups { input: "item" dnn { hidden_units: [6] use_bn: false } }
         cvr_tower { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } weight: 0.7 }
         ctr_tower { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] use_bn: false } } } }"#
        }
        "DBMTL" => {
            r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [6] } relation_dnn { hidden_units: [4] } }
          task_towers { tower_name: "cvr" dnn { hidden_units: [6] } relation_tower_names: ["ctr"]
                        relation_dnn { hidden_units: [4] } weight: 2.0 } } }"#
        }
        "DBMTL with order calibration" => common::models::DBMTL_CALIBRATED,
        "FM" => {
            r#"model_config { model_class: "FM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3"] wide_deep: DEEP }
  fm { } }"#
        }
        "RankModel" => {
            r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c3", "c1", "c2"] }
  backbone {
    blocks { name: "wide" inputs { feature_group_name: "wide" } input_layer { wide_output_dim: 1 only_output_feature_list: true } }
    blocks { name: "sparse" inputs { feature_group_name: "sparse" } input_layer { output_2d_tensor_and_feature_list: true } }
    blocks { name: "bottom" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [8, 4] } } }
    blocks { name: "dot" inputs { block_name: "bottom" input_fn: "lambda x: [x]" }
             inputs { block_name: "sparse" input_slice: "[1]" } keras_layer { class_name: "DotInteraction" } }
    blocks { name: "fm" inputs { block_name: "sparse" input_slice: "[1]" } keras_layer { class_name: "FM" } }
    blocks { name: "cross" inputs { block_name: "sparse" input_slice: "[0]" input_fn: "lambda x: [x, x]" }
             recurrent { num_steps: 2 fixed_input_index: 0 keras_layer { class_name: "Cross" } } }
    blocks { name: "deep" inputs { block_name: "dot" } inputs { block_name: "cross" } inputs { block_name: "bottom" }
             keras_layer { class_name: "MLP" mlp { hidden_units: [6, 1] use_final_bn: false final_activation: "linear" } } }
    blocks { name: "logit" inputs { block_name: "wide" input_fn: "lambda x: tf.add_n(x)" }
             inputs { block_name: "fm" } inputs { block_name: "deep" } merge_inputs_into_list: true
             keras_layer { class_name: "Add" } }
    concat_blocks: "logit"
  }
  model_params { l2_regularization: 1e-4 } }"#
        }
        "MultiTaskModel" => {
            r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "mask_net" inputs { feature_group_name: "all" }
      keras_layer { class_name: "MaskNet" masknet {
        mask_blocks { aggregation_size: 8 output_size: 6 }
        mask_blocks { reduction_factor: 0.5 output_size: 6 projection_dim: 3 }
        mlp { hidden_units: [6] } } } }
  }
  model_params {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } relation_dnn { hidden_units: [3] } }
    task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } relation_tower_names: ["ctr"]
                  relation_dnn { hidden_units: [3] } weight: 0.5 }
    l2_regularization: 1e-4 } }"#
        }
        "MultiTaskModel with MMoE" => common::models::MMOE_LAYER,
        "RankModel with PPNet" => common::models::PPNET,
        "MultiTaskModel with AITM" => common::models::AITM,
        "RankModel with repeat and Gate" => common::models::REPEAT_AND_GATE,
        "RankModel with a TextCNN over an unpooled sequence" => common::models::TEXT_CNN,
        "RankModel with a DIN layer and Dice" => common::models::DIN_LAYER,
        "RankModel with a BST layer" => common::models::BST_LAYER,
        "CL4SRec with a BST package" => common::models::CL4SREC,
        "RankModel with contrastive item towers" => common::models::CONTRASTIVE,
        "CMBF" => common::models::CMBF,
        "Uniter" => common::models::UNITER,
        "DropoutNet" => common::models::DROPOUTNET,
        "MIND" => common::models::MIND,
        "RankModel with a ZILN loss" => {
            r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone { blocks { name: "deep" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [8, 4] } } } }
  model_params { l2_regularization: 1e-6 }
  num_class: 3
  losses { loss_type: ZILN_LOSS weight: 0.8 ziln_loss { mu_regularization: 0.02 max_sigma: 3.0 } } }"#
        }
        "DeepFM with two classes" => {
            r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { wide_output_dim: 2 dnn { hidden_units: [8, 4] } }
  num_class: 2 }"#
        }
        "DeepFM with knowledge distillation" => {
            r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } }
  kd { soft_label_name: "label2" pred_name: "logits" loss_type: BINARY_CROSS_ENTROPY_LOSS temperature: 2.0 }
  kd { soft_label_name: "label2" pred_name: "logits" loss_type: L2_LOSS loss_weight: 0.1 } }"#
        }
        "MultiTowerDIN" => {
            r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "MultiTowerDIN"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  seq_att_groups { group_name: "din" seq_att_map { key: "c2" hist_seq: "hist" } }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                towers { input: "item" dnn { hidden_units: [4] } }
                din_towers { input: "din" dnn { hidden_units: [5, 1] } }
                final_dnn { hidden_units: [4] } } }"#
        }
        "MultiTowerBST" => {
            r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "MultiTowerBST"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  seq_att_groups { group_name: "bst" seq_att_map { key: "c2" hist_seq: "hist" } }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                bst_towers { input: "bst" seq_len: 3 multi_head_size: 2 }
                final_dnn { hidden_units: [4] } } }"#
        }
        "DSSM" => {
            r#"model_config { model_class: "DSSM"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  dssm { user_tower { id: "c1" dnn { hidden_units: [8, 4] } }
         item_tower { id: "c2" dnn { hidden_units: [6, 4] } }
         l2_regularization: 1e-4 } }"#
        }
        "MatchModel" => common::models::MATCH_MODEL,
        "RankModel with numeric embeddings" => common::models::NUMERIC_EMBEDDINGS,
        "RankModel with FiBiNet" => common::models::FIBINET,
        "RankModel with CIN" => common::models::CIN,
        "DSSM in-batch softmax" => {
            r#"model_config { model_class: "DSSM"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2", "c1"] }
  dssm { user_tower { id: "c1" dnn { hidden_units: [8, 4] } }
         item_tower { id: "c2" dnn { hidden_units: [4] } }
         temperature: 0.2
         l2_regularization: 1e-4 }
  loss_type: SOFTMAX_CROSS_ENTROPY }"#
        }
        other => panic!("no block for {other}"),
    }
}

/// Networks for the CPU executor against burn's reference, each with a
/// different wiring of its head, interaction, activation, batch norm or
/// dropout; together they use every op the builders emit.
const EXECUTOR_VARIANTS: [(&str, &str); 58] = [
    (
        "Contrastive item towers: an input layer's dropout, reset_input, info_nce",
        common::models::CONTRASTIVE,
    ),
    (
        "CL4SRec: backbone packages, sequence augmentation and a contrastive loss",
        common::models::CL4SREC,
    ),
    (
        "PPNet, its gates reading its input cut from the gradient",
        common::models::PPNET,
    ),
    (
        "AITM over a transfer MLP, with order calibration adding nothing",
        common::models::AITM,
    ),
    (
        "DBMTL with order calibration over its relation tower",
        common::models::DBMTL_CALIBRATED,
    ),
    (
        "MIND: a time feature weighing the positions, three interests",
        common::models::MIND,
    ),
    (
        "MIND: concatenated sequences, the capsule count from the log of the length, inner products, batch norms",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
feature_configs { input_names: "c3" feature_name: "hist2" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 20 embedding_dim: 2 max_seq_len: 3 }
model_config { model_class: "MIND"
  feature_groups { group_name: "hist" feature_names: ["hist", "hist2"] }
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  mind { user_dnn { hidden_units: [4] use_bn: true } concat_dnn { hidden_units: [5, 3] use_bn: true }
         item_dnn { hidden_units: [3] } user_seq_combine: CONCAT simi_func: INNER_PRODUCT
         capsule_config { max_k: 2 max_seq_len: 2 high_dim: 3 num_iters: 2 routing_logits_scale: 0 }
         l2_regularization: 1e-4 } }"#,
    ),
    (
        "DBMTL: a JRC tower (two logits, sessions by c2) related to a tower of f1-reweighted and pairwise losses",
        r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dbmtl { bottom_dnn { hidden_units: [8] use_bn: false }
          task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [6] use_bn: false }
                        losses { loss_type: F1_REWEIGHTED_LOSS f1_reweighted_loss { f1_beta_square: 1.0 } }
                        relation_dnn { hidden_units: [4] use_bn: false } }
          task_towers { tower_name: "cvr" label_name: "label2" num_class: 2 dnn { hidden_units: [6] use_bn: false }
                        losses { loss_type: JRC_LOSS jrc_loss { session_name: "c2" alpha: 0.4 } }
                        relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] use_bn: false } weight: 2.0 } } }"#,
    ),
    (
        "RankModel: an MLP's three logits trained by EasyRec's zero-inflated lognormal loss",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone { blocks { name: "deep" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [8, 4] } } } }
  model_params { l2_regularization: 1e-6 }
  num_class: 3
  losses { loss_type: ZILN_LOSS weight: 0.8 ziln_loss { mu_regularization: 0.02 max_sigma: 3.0 } } }"#,
    ),
    (
        // Without batch norm: the biases under it have no gradient but
        // rounding, past any relative tolerance.
        "DAT: DSSM towers over their augmented vectors, in-batch softmax and the adaptive-mimic losses",
        r#"model_config { model_class: "DAT"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  feature_groups { group_name: "user_id_augment" feature_names: ["c1"] }
  feature_groups { group_name: "item_id_augment" feature_names: ["c2"] }
  dat { user_tower { id: "c1" dnn { hidden_units: [8, 4] use_bn: false } }
        item_tower { id: "c2" dnn { hidden_units: [6, 4] use_bn: false } }
        temperature: 0.2 amm_u_weight: 0.7 amm_i_weight: 0.3 }
  loss_type: SOFTMAX_CROSS_ENTROPY }"#,
    ),
    (
        // The booster's side of the hints is cut from the gradient, which
        // finite differences cannot see; burn's autodiff detaches it too.
        "RocketLaunching of two classes with feature-based distillation (hints cut from the gradient)",
        r#"model_config { model_class: "RocketLaunching"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  rocket_launching { share_dnn { hidden_units: [8] } booster_dnn { hidden_units: [6, 4, 3] use_bn: true }
                     light_dnn { hidden_units: [4, 3] } feature_based_distillation: true }
  num_class: 2 }"#,
    ),
    (
        "WideAndDeep of two classes without final_dnn (a wide side per class), softmax cross entropy",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [8, 4] use_bn: true } }
  num_class: 2 }"#,
    ),
    (
        "DeepFM distilled from label2 as soft logits (cross entropy at temperature 2)",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } }
  kd { soft_label_name: "label2" pred_name: "logits" loss_type: CROSS_ENTROPY_LOSS loss_weight: 0.7 temperature: 2.0 } }"#,
    ),
    (
        // The pairwise term sums thousands of pairs here, past f32 parity
        // with burn on gradients near zero (biases under batch norm); other
        // variants check it.
        "DropoutNet: content and row-dropped preference towers, cross entropy",
        r#"model_config { model_class: "DropoutNet"
  feature_groups { group_name: "user_content" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "user_preference" feature_names: ["c3"] }
  feature_groups { group_name: "item_content" feature_names: ["c2", "d2"] }
  feature_groups { group_name: "item_preference" feature_names: ["c1", "c2"] }
  losses { loss_type: CLASSIFICATION weight: 1.0 }
  dropoutnet {
    user_content { hidden_units: [5] activation: "tanh" } user_preference { hidden_units: [4] activation: "tanh" }
    item_content { hidden_units: [5] activation: "tanh" } item_preference { hidden_units: [4] activation: "tanh" }
    user_tower { hidden_units: [6, 3] use_bn: false } item_tower { hidden_units: [6, 3] use_bn: false }
    user_dropout_rate: 0.3 item_dropout_rate: 0.5 l2_regularization: 1e-4 } }"#,
    ),
    (
        "RankModel: a BST layer, EasyRec's transformer encoder with GELU, over the target and a padded sequence",
        common::models::BST_LAYER,
    ),
    (
        "RankModel: a DIN layer whose scoring MLP has Dice activations",
        common::models::DIN_LAYER,
    ),
    (
        "RankModel: a TextCNN and an MLP over an output_seq_and_normal_feature input layer",
        common::models::TEXT_CNN,
    ),
    (
        "RankModel: repeated mask blocks gated by a softmax MLP",
        common::models::REPEAT_AND_GATE,
    ),
    (
        "MultiTaskModel: MMoE layer over experts given as a list, the gates over the last",
        r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "e0" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [4] } } }
    blocks { name: "e1" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [4] use_bn: false } } }
    blocks { name: "mmoe" inputs { block_name: "e0" } inputs { block_name: "e1" } inputs { feature_group_name: "all" }
      merge_inputs_into_list: true
      keras_layer { class_name: "MMoE" mmoe { num_task: 2 num_expert: 2 } } }
  }
  model_params {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" weight: 0.5 } } }"#,
    ),
    (
        "RankModel: batch-normed input tensor and list, bilinear interactions per pair without plus, shared bilinear",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "fields" feature_names: ["c1", "d1", "c3"] }
  backbone {
    blocks { name: "both" inputs { feature_group_name: "fields" } input_layer { do_batch_norm: true output_2d_tensor_and_feature_list: true } }
    blocks { name: "pairs" inputs { block_name: "both" input_slice: "[1]" }
             keras_layer { class_name: "BiLinear" bilinear { type: "interaction" use_plus: false num_output_units: 3 } } }
    blocks { name: "deep" inputs { block_name: "both" input_slice: "[0]" } keras_layer { class_name: "MLP" mlp { hidden_units: [3] } } }
    concat_blocks: ["pairs", "deep"]
  }
  model_params { } }"#,
    ),
    (
        "RankModel: FiBiNet with one bilinear layer for all fields",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "fields" feature_names: ["c1", "c2", "c3"] }
  backbone {
    blocks { name: "field_list" inputs { feature_group_name: "fields" } input_layer { only_output_feature_list: true } }
    blocks { name: "fibinet" inputs { block_name: "field_list" }
             keras_layer { class_name: "FiBiNet" fibinet { senet { reduction_ratio: 1 num_squeeze_group: 1 } bilinear { type: "all" num_output_units: 2 } } } }
    concat_blocks: ["fibinet"]
  }
  model_params { } }"#,
    ),
    (
        "MultiTowerBST, the history padded, uneven heads",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "MultiTowerBST"
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  seq_att_groups { group_name: "bst" seq_att_map { key: "c1" hist_seq: "hist" } }
  multi_tower { towers { input: "item" dnn { hidden_units: [4] } }
                bst_towers { input: "bst" seq_len: 6 multi_head_size: 3 }
                final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "AutoInt, one layer of three heads over fields and a pooled tag",
        r#"model_config { model_class: "AutoInt"
  feature_groups { group_name: "all" feature_names: ["c3", "c1", "c2"] wide_deep: DEEP }
  autoint { multi_head_num: 3 multi_head_size: 2 } }"#,
    ),
    (
        "DSSM_SENet, in-batch softmax over inner products (raw values keep the user embedding off zero)",
        r#"model_config { model_class: "DSSM_SENet"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  dssm_senet { user_tower { id: "c1" senet { reduction_ratio: 2 num_squeeze_group: 1 } dnn { hidden_units: [8, 4] } }
               item_tower { id: "c2" senet { reduction_ratio: 1 num_squeeze_group: 1 } dnn { hidden_units: [4] } }
               simi_func: INNER_PRODUCT }
  loss_type: SOFTMAX_CROSS_ENTROPY }"#,
    ),
    (
        "DSSM_SENet, pointwise, two squeeze groups in the user tower",
        r#"model_config { model_class: "DSSM_SENet"
  feature_groups { group_name: "user" feature_names: ["c1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d1", "d2"] }
  dssm_senet { user_tower { id: "c1" senet { reduction_ratio: 2 num_squeeze_group: 2 } dnn { hidden_units: [8, 4] use_bn: false activation: "tanh" } }
               item_tower { id: "c2" senet { reduction_ratio: 1 num_squeeze_group: 1 } dnn { hidden_units: [4] } }
               simi_func: INNER_PRODUCT } }"#,
    ),
    (
        "RankModel: SENet over field embeddings, two squeeze groups with skip and layer norm, one group bare",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "ids" feature_names: ["c1", "c2", "c3"] }
  feature_groups { group_name: "mixed" feature_names: ["d1", "c1", "d2"] }
  backbone {
    blocks { name: "ids" inputs { feature_group_name: "ids" } input_layer { only_output_feature_list: true } }
    blocks { name: "se" inputs { block_name: "ids" } keras_layer { class_name: "SENet" senet { reduction_ratio: 3 } } }
    blocks { name: "mixed" inputs { feature_group_name: "mixed" } input_layer { only_output_feature_list: true } }
    blocks { name: "se1" inputs { block_name: "mixed" }
      keras_layer { class_name: "SENet" senet { reduction_ratio: 2 num_squeeze_group: 1 use_skip_connection: false use_output_layer_norm: false } } }
    concat_blocks: ["se", "se1"]
  }
  model_params { l2_regularization: 1e-4 } }"#,
    ),
    (
        "RankModel: Highway layers, one projected to emb_size with two layers and dropout, one by default",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  feature_groups { group_name: "ids" feature_names: ["c1", "c3"] }
  backbone {
    blocks { name: "hw" inputs { feature_group_name: "deep" }
      keras_layer { class_name: "Highway" highway { emb_size: 5 activation: "tanh" num_layers: 2 dropout_rate: 0.2 init_gate_bias: -1.0 } } }
    blocks { name: "plain" inputs { feature_group_name: "ids" } keras_layer { class_name: "Highway" } }
    concat_blocks: ["hw", "plain"]
  }
  model_params { l2_regularization: 1e-4 } }"#,
    ),
    (
        "MMoE whose ctr tower trains on a losses list (cross entropy and pairwise)",
        r#"model_config { model_class: "MMoE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  mmoe { expert_dnn { hidden_units: [6, 4] } num_expert: 2
         task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } weight: 0.7
           losses { loss_type: CLASSIFICATION weight: 0.4 } losses { loss_type: PAIR_WISE_LOSS } }
         task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "PLE: three levels, shared experts with dropout, a last level without shared experts",
        r#"model_config { model_class: "PLE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  ple {
    extraction_networks { network_name: "a" expert_num_per_task: 1 share_num: 2
      task_expert_net { hidden_units: [6, 4] } share_expert_net { hidden_units: [5, 4] dropout_ratio: [0.2, 0.1] } }
    extraction_networks { network_name: "b" expert_num_per_task: 2 share_num: 1
      task_expert_net { hidden_units: [3] use_bn: false } share_expert_net { hidden_units: [3] } }
    extraction_networks { network_name: "c" expert_num_per_task: 2
      task_expert_net { hidden_units: [4] activation: "tanh" } }
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" } } }"#,
    ),
    (
        "DeepFM over sequences pooled by a text CNN and by attention, FM over them, raw values between",
        r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 30 embedding_dim: 4
  sequence_combiner { text_cnn { filter_sizes: [1, 2] num_filters: [3, 1] pad_sequence_length: 3 activation: "tanh" } } }
feature_configs { input_names: "c3" feature_name: "att" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 20 embedding_dim: 4 max_seq_len: 2 sequence_combiner { attention {} } }
model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["title", "c1", "d1", "att", "c2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } } }"#,
    ),
    (
        "MultiTower with a text CNN of two sizes and a variational dropout rate per column",
        r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 30 embedding_dim: 3
  sequence_combiner { text_cnn { filter_sizes: [2, 3] num_filters: [4, 2] pad_sequence_length: 4 } } }
model_config { model_class: "MultiTower"
  feature_groups { group_name: "user" feature_names: ["c1", "title", "d2"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d1"] }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                towers { input: "item" dnn { hidden_units: [4] } }
                final_dnn { hidden_units: [3] } }
  variational_dropout { embedding_wise_variational_dropout: true } }"#,
    ),
    (
        "DBMTL with sequence_features and a variational dropout rate per embedding column",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d2", "c1", "d1", "c2"]
    sequence_features { group_name: "seq" seq_dnn { hidden_units: [4, 1] }
      seq_att_map { key: "c1" hist_seq: "hist" } } }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } }
  variational_dropout { embedding_wise_variational_dropout: true } }"#,
    ),
    (
        "FM with a variational dropout rate per feature of its wide and deep groups",
        r#"model_config { model_class: "FM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c3", "c1", "c2"] wide_deep: DEEP }
  fm { }
  variational_dropout { regularization_lambda: 0.1 } }"#,
    ),
    (
        "DSSM, in-batch softmax over cosines with a temperature and a learned scale, dropout",
        r#"model_config { model_class: "DSSM"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2", "c1"] }
  dssm { user_tower { id: "c1" dnn { hidden_units: [8, 5] dropout_ratio: [0.2, 0.1] } }
         item_tower { id: "c2" dnn { hidden_units: [6, 3, 5] use_bn: false activation: "tanh" } }
         temperature: 0.3 scale_simi: true }
  loss_type: SOFTMAX_CROSS_ENTROPY }"#,
    ),
    (
        "DSSM, pointwise inner product without scale",
        r#"model_config { model_class: "DSSM"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2", "c3"] }
  dssm { user_tower { id: "c1" dnn { hidden_units: [4] } }
         item_tower { id: "c2" dnn { hidden_units: [6, 4] } }
         simi_func: INNER_PRODUCT scale_simi: false } }"#,
    ),
    (
        "DBMTL with sequence_features: two histories and an aux, keys transformed by dense layers, keys padded",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
feature_configs { input_names: "c3" feature_name: "hist2" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 20 embedding_dim: 2 max_seq_len: 3 }
model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "c1", "c2"]
    sequence_features { group_name: "dense" allow_key_transform: true transform_dnn: true seq_dnn { hidden_units: [4, 1] }
      seq_att_map { key: "c1" key: "c2" hist_seq: "hist" hist_seq: "hist2" aux_hist_seq: "hist2" } }
    sequence_features { group_name: "pad" allow_key_transform: true need_key_feature: false
      seq_dnn { hidden_units: [3, 1] dropout_ratio: [0.2, 0.0] }
      seq_att_map { key: "c2" hist_seq: "hist" hist_seq: "hist2" } } }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } relation_dnn { hidden_units: [3] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "MultiTaskModel: serial MaskNet with layer norms, a block without output layer, towers without DNNs",
        r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "mask_net" inputs { feature_group_name: "all" }
      keras_layer { class_name: "MaskNet" masknet { use_parallel: false
        mask_blocks { aggregation_size: 5 output_size: 7 input_layer_norm: true }
        mask_blocks { aggregation_size: 4 } } } }
  }
  model_params {
    task_towers { tower_name: "ctr" label_name: "label" }
    task_towers { tower_name: "cvr" label_name: "label2" relation_tower_names: ["ctr"] relation_dnn { hidden_units: [3] } } } }"#,
    ),
    (
        "RankModel: stacked fields, Keras Dense and Dropout, Python lambdas, low-rank Cross, top MLP",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "ids" feature_names: ["c1", "c2", "c3"] }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "ids" inputs { feature_group_name: "ids" } input_layer { only_output_3d_tensor: true } }
    blocks { name: "fm" inputs { block_name: "ids" } keras_layer { class_name: "FM" fm { use_variant: true } } }
    blocks { name: "mlp" inputs { feature_group_name: "deep" }
      layers { keras_layer { class_name: "Dense" st_params {
        fields { key: "units" value { number_value: 6 } }
        fields { key: "activation" value { string_value: "tanh" } } } } }
      layers { keras_layer { class_name: "Dropout" st_params { fields { key: "rate" value { number_value: 0.3 } } } } }
      layers { lambda { expression: "lambda x: tf.unstack(tf.reshape(x, [-1, 3, 2]), axis=1)" } }
      layers { lambda { expression: "lambda x: tf.concat(x, axis=1)" } } }
    blocks { name: "cross" inputs { feature_group_name: "deep" }
      keras_layer { class_name: "Cross" st_params { fields { key: "projection_dim" value { number_value: 2 } } } } }
    concat_blocks: ["fm", "mlp", "cross"]
    top_mlp { hidden_units: [4, 3] use_bias: true use_bn_after_activation: true dropout_ratio: [0.1] }
  }
  model_params { l2_regularization: 1e-4 } }"#,
    ),
    (
        "WideAndDeep, raw value in the wide group",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [8, 4] use_bn: false } } }"#,
    ),
    (
        "WideAndDeep with final_dnn, tanh",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c3", "d2", "c1"] wide_deep: DEEP }
  wide_and_deep { wide_output_dim: 3 dnn { hidden_units: [8, 4] use_bn: false activation: "tanh" }
                  final_dnn { hidden_units: [5] use_bn: false activation: "tanh" } } }"#,
    ),
    (
        "WideAndDeep, deep group without embeddings",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [6] use_bn: false activation: "sigmoid" } } }"#,
    ),
    (
        "DLRM dot with dense",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [8, 4] use_bn: false } top_dnn { hidden_units: [8] use_bn: false }
         arch_with_dense_feature: true } }"#,
    ),
    (
        "DLRM dot with itself, without dense",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [4] use_bn: false } top_dnn { hidden_units: [8, 3] use_bn: false }
         arch_interaction_itself: true } }"#,
    ),
    (
        "DLRM cat",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [8, 5] use_bn: false } top_dnn { hidden_units: [8] use_bn: false }
         arch_interaction_op: "cat" } }"#,
    ),
    (
        "DLRM dot, empty top",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [4] use_bn: false activation: "sigmoid" } top_dnn { use_bn: false }
         arch_with_dense_feature: true } }"#,
    ),
    (
        "WideAndDeep with batch norm, dropout and final_dnn",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c3"] wide_deep: DEEP }
  wide_and_deep { wide_output_dim: 2 dnn { hidden_units: [8, 6] dropout_ratio: [0.3, 0.2] }
                  final_dnn { hidden_units: [5] dropout_ratio: [0.25] activation: "tanh" } } }"#,
    ),
    (
        "DLRM with batch norm and dropout",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [8, 4] activation: "sigmoid" } top_dnn { hidden_units: [8, 6] dropout_ratio: [0.5, 0.1] }
         arch_with_dense_feature: true } }"#,
    ),
    (
        "DeepFM with a raw value in the wide group",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d1", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } } }"#,
    ),
    (
        "DeepFM with final_dnn and dropout, no wide group",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "deep" feature_names: ["d2", "c1", "c3", "d1"] wide_deep: DEEP }
  deepfm { wide_output_dim: 3 dnn { hidden_units: [8, 4] dropout_ratio: [0.2, 0.1] use_bn: false }
           final_dnn { hidden_units: [5] activation: "tanh" } } }"#,
    ),
    (
        "FM with a raw value in the wide group",
        r#"model_config { model_class: "FM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c3", "c1", "c2"] wide_deep: DEEP }
  fm { } }"#,
    ),
    (
        "DCN with batch norm",
        r#"model_config { model_class: "DCN"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dcn { deep_tower { input: "all" dnn { hidden_units: [8] } }
        cross_tower { input: "all" cross_num: 3 }
        final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "DCN on two groups",
        r#"model_config { model_class: "DCN"
  feature_groups { group_name: "deep" feature_names: ["d1", "c1", "c3"] }
  feature_groups { group_name: "cross" feature_names: ["c2", "d2"] }
  dcn { deep_tower { input: "deep" dnn { hidden_units: [8] use_bn: false activation: "sigmoid" } }
        cross_tower { input: "cross" cross_num: 2 }
        final_dnn { hidden_units: [4] use_bn: false } } }"#,
    ),
    (
        "MultiTower",
        r#"model_config { model_class: "MultiTower"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] dropout_ratio: [0.3] } }
                towers { input: "item" dnn { hidden_units: [4] use_bn: false activation: "tanh" } }
                final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "MultiTower trained on F1-reweighted and pairwise losses",
        r#"model_config { model_class: "MultiTower"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  losses { loss_type: F1_REWEIGHTED_LOSS weight: 0.7 f1_reweighted_loss { f1_beta_square: 2.25 label_smoothing: 0.1 } }
  losses { loss_type: PAIR_WISE_LOSS weight: 1.3 pairwise_loss { margin: 0.2 temperature: 0.5 } }
  losses { loss_type: CLASSIFICATION weight: 0.5 }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] use_bn: false } }
                towers { input: "item" dnn { hidden_units: [4] use_bn: false } }
                final_dnn { hidden_units: [4] use_bn: false } } }"#,
    ),
    (
        "MMoE with dropout and experts of their own config",
        r#"model_config { model_class: "MMoE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  mmoe { experts { expert_name: "a" dnn { hidden_units: [8, 4] dropout_ratio: [0.2, 0.0] } }
         experts { expert_name: "b" dnn { hidden_units: [4] use_bn: false activation: "tanh" } }
         task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
         task_towers { tower_name: "cvr" label_name: "label2" weight: 0.3 } } }"#,
    ),
    (
        "DBMTL with MMoE experts",
        r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dbmtl { bottom_dnn { hidden_units: [8] } expert_dnn { hidden_units: [6] use_bn: false } num_expert: 2
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } relation_dnn { hidden_units: [3] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "DBMTL over a CMBF bottom: two image values as positions, cross attention over masked text",
        r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "DBMTL"
  feature_groups { group_name: "image" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "general" feature_names: ["c1", "c2"] }
  feature_groups { group_name: "text" feature_names: ["title"] }
  dbmtl { bottom_cmbf { multi_head_num: 2 text_multi_head_num: 2 text_head_size: 2 image_cross_head_size: 2
                        text_cross_head_size: 2 cross_modal_layer_num: 2 text_self_attention_layer_num: 1
                        max_position_embeddings: 3 text_seq_emb_dropout_prob: 0 }
          task_towers { tower_name: "ctr" dnn { hidden_units: [6] } relation_dnn { hidden_units: [4] } }
          task_towers { tower_name: "cvr" dnn { hidden_units: [6] } relation_tower_names: ["ctr"]
                        relation_dnn { hidden_units: [4] } weight: 2.0 } } }"#,
    ),
    (
        "ESMM over the all group",
        r#"model_config { model_class: "ESMM"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  esmm { cvr_tower { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [6, 4] use_bn: false } }
         ctr_tower { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] use_bn: false } weight: 2.0 } } }"#,
    ),
];

fn write_data(path: &Path, rows: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut s = String::new();
    for _ in 0..rows {
        let c1 = rng.below(20);
        let c2 = rng.below(10);
        let d1 = rng.normal();
        let label = (c1.is_multiple_of(3) as u8 as f64 * 0.6 + 0.2 + 0.1 * d1 > rng.uniform()) as u8;
        let tags = (0..=rng.below(3))
            .map(|_| format!("t{}", rng.below(8)))
            .collect::<Vec<_>>()
            .join("|");
        let label2 = (label == 1 && c2.is_multiple_of(2)) as u8;
        s.push_str(&format!(
            "{label},{d1:.4},{:.4},u{c1},{c2},{tags},{label2}\n",
            rng.uniform()
        ));
    }
    std::fs::write(path, s).unwrap();
}

fn trainer(dir: &Path, model: &str) -> Trainer {
    trainer_of(dir, model, model_block(model))
}

fn trainer_of(dir: &Path, model: &str, block: &str) -> Trainer {
    trainer_sized(dir, model, block, 64, 16)
}

/// `trainer_of` with `rows` rows of data read in batches of `batch`.
fn trainer_sized(dir: &Path, model: &str, block: &str, rows: usize, batch: usize) -> Trainer {
    let data = dir.join("data.csv");
    write_data(&data, rows, 5);
    // EasyRec evaluates a listwise match model by recall only.
    let metrics = if block.contains("SOFTMAX_CROSS_ENTROPY") {
        "metrics_set { recall_at_topk { topk: 3 } }"
    } else {
        "metrics_set { auc {} }"
    };
    let text = COMMON
        .replace("metrics_set { auc {} }", metrics)
        .replace("batch_size: 16", &format!("batch_size: {batch}"))
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL_DIR", dir.join("model").to_str().unwrap())
        + block;
    let cfg = dir.join(format!("{}.config", model.replace([' ', ','], "_")));
    std::fs::write(&cfg, text).unwrap();
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap()
}

/// The error reading the first training batch of `t`'s input.
fn first_batch_error(t: &Trainer) -> anyhow::Error {
    t.stream(&t.plan.data.train_paths.clone(), true, 0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err()
}

/// The first training batch of `t`'s input.
fn first_batch(t: &Trainer) -> Batch {
    t.stream(&t.plan.data.train_paths.clone(), true, 0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
}

/// Every model class, each with its `model_block`.
const MODELS: [&str; 40] = [
    "MultiTowerBST",
    "CL4SRec with a BST package",
    "AutoInt",
    "PLE",
    "ESMM",
    "SimpleMultiTask",
    "WideAndDeep",
    "DLRM",
    "DeepFM",
    "DeepFM over pooled sequences",
    "DeepFM with variational dropout",
    "FM",
    "DCN",
    "MultiTower",
    "MMoE",
    "DBMTL",
    "RankModel",
    "MultiTaskModel",
    "MultiTowerDIN",
    "DSSM",
    "DSSM in-batch softmax",
    "MatchModel",
    "RankModel with CIN",
    "RankModel with numeric embeddings",
    "RankModel with FiBiNet",
    "MultiTaskModel with MMoE",
    "RankModel with PPNet",
    "MultiTaskModel with AITM",
    "DBMTL with order calibration",
    "RankModel with repeat and Gate",
    "RankModel with a TextCNN over an unpooled sequence",
    "RankModel with a DIN layer and Dice",
    "RankModel with a BST layer",
    "DropoutNet",
    "DeepFM with knowledge distillation",
    "DeepFM with two classes",
    "RankModel with a ZILN loss",
    "CMBF",
    "Uniter",
    "MIND",
];

/// What MIND's capsule routing reads (the `hist` group's sequences,
/// `pre_capsule_dnn` and `capsule/S`): the routing runs on them cut from
/// the gradient, as EasyRec's, which central differences cannot see, so
/// they are checked against burn's autodiff only (`EXECUTOR_VARIANTS`);
/// likewise what PPNet's gates and AITM's transfer read cut from it.
fn routed(model: &str, name: &str) -> bool {
    model == "MIND" && (name == "hist" || name.starts_with("capsule/") || name.starts_with("pre_capsule_dnn"))
        // PPNet's gates read its input cut from the gradient too
        // (`full_gate_input`), which moving the input moves.
        || model == "RankModel with PPNet" && name == "general"
        // AITM reads the CTR tower cut from the gradient (`stop_gradient`):
        // what feeds that tower moves the CVR task through it as well.
        || model == "MultiTaskModel with AITM" && (name.starts_with("ctr_tower/") || name.starts_with("share_bottom/") || name == "all")
}

/// The loss of `batch` (with group inputs `inputs`) with dense parameter
/// `i` moved by `+eps` and by `-eps`, the parameter then restored.
fn losses_around(t: &mut Trainer, (batch, inputs): (&Batch, &[Vec<f32>]), i: usize, eps: f32) -> (f64, f64) {
    let w = t.model.params.values[i];
    t.model.params.values[i] = w + eps;
    let up = t.loss_and_grads(batch, inputs).loss as f64;
    t.model.params.values[i] = w - eps;
    let down = t.loss_and_grads(batch, inputs).loss as f64;
    t.model.params.values[i] = w;
    (up, down)
}

/// Central differences in f64 of an f32 loss; loose enough for f32 noise,
/// tight enough to catch a wrong or missing gradient term.
fn close(numeric: f64, analytic: f64) -> bool {
    (numeric - analytic).abs() <= 2e-3 + 3e-2 * analytic.abs()
}

#[test]
fn dense_gradients_of_every_model_match_finite_differences() {
    for model in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let mut t = trainer(dir.path(), model);
        let batch = first_batch(&t);
        let inputs = t.group_inputs(&batch);
        let g = t.loss_and_grads(&batch, &inputs);
        let eps = 2e-3f32;
        let mut rng = Rng::new(11);
        let n = t.model.params.values.len();
        let mut checked = 0;
        let mut kinks = 0;
        let mut draws = 0;
        while draws < 40 {
            let i = rng.below(n as u64) as usize;
            let name = &t
                .model
                .params
                .specs
                .iter()
                .find(|s| s.range().contains(&i))
                .unwrap()
                .name
                .clone();
            if routed(model, name) {
                continue;
            }
            draws += 1;
            let (up, down) = losses_around(&mut t, (&batch, &inputs), i, eps);
            let numeric = (up - down) / (2.0 * eps as f64);
            // A ReLU switching inside [w - eps, w + eps] makes the one-sided
            // slopes disagree; such coordinates say nothing about the gradient.
            let (fwd, bwd) = ((up - g.loss as f64) / eps as f64, (g.loss as f64 - down) / eps as f64);
            if (fwd - bwd).abs() > 2e-3 + 0.05 * numeric.abs() {
                kinks += 1;
                continue;
            }
            assert!(
                close(numeric, g.dense[i] as f64),
                "{model}: d loss / d {name}[{i}]: numeric {numeric}, analytic {}",
                g.dense[i]
            );
            checked += 1;
        }
        // Gradients w.r.t. the pooled embeddings (what the sparse update consumes).
        // BST layer-normalises sums of embeddings that start near 1e-3
        // (EasyRec's own layer norm, epsilon 1e-6), and FiBiNet's input
        // layer batch-normalises them: a step of `eps` there crosses most
        // of the curve, so their inputs take a smaller one. TextCNN max-pools
        // over positions whose filters see such embeddings, all within a
        // step of `eps` of each other: a step switches the maximum.
        let eps = if ["BST", "FiBiNet", "CMBF", "Uniter", "MIND", "TextCNN"]
            .iter()
            .any(|m| model.contains(m))
        {
            1e-4
        } else {
            eps
        };
        for (gi, grp) in t.model.groups.clone().iter().enumerate() {
            if !grp.embedded() || routed(model, &grp.name) {
                continue; // raw-only groups are constants, not trained
            }
            let mut smooth = 0;
            for k in 0..12 {
                let j = (k * 7 + 3) % inputs[gi].len();
                // Sequence lengths are counts, not trained values.
                let is_length = |p: &rustrec::model::SeqPart| {
                    matches!(p.kind, rustrec::model::SeqPartKind::Length { .. }) && p.col == j % grp.width
                };
                if grp.seq_parts.iter().any(is_length) {
                    continue;
                }
                let mut x = inputs.clone();
                x[gi][j] += eps;
                let up = t.loss_and_grads(&batch, &x).loss as f64;
                x[gi][j] -= 2.0 * eps;
                let down = t.loss_and_grads(&batch, &x).loss as f64;
                let numeric = (up - down) / (2.0 * eps as f64);
                // EasyRec's embeddings start small (stddev 0.01/sqrt(dim)),
                // so a step of eps can switch a ReLU downstream: skip those.
                let (fwd, bwd) = ((up - g.loss as f64) / eps as f64, (g.loss as f64 - down) / eps as f64);
                if (fwd - bwd).abs() > 2e-3 + 0.05 * numeric.abs() {
                    continue;
                }
                smooth += 1;
                assert!(
                    close(numeric, g.inputs[gi][j] as f64),
                    "{model}: d loss / d input {}[{j}]: numeric {numeric}, analytic {}",
                    grp.name,
                    g.inputs[gi][j]
                );
            }
            assert!(
                smooth >= 6,
                "{model}: only {smooth} smooth input coordinates of group {}",
                grp.name
            );
        }
        assert!(
            checked >= 30 && g.loss.is_finite(),
            "{model}: only {checked} smooth coordinates ({kinks} kinks)"
        );
    }
}

#[test]
fn cpu_executor_matches_burns_reference() {
    for (label, block) in EXECUTOR_VARIANTS {
        let dir = tempfile::tempdir().unwrap();
        // 83 rows: more than one parallel block of rows, and a last block
        // that fills only part of the interaction's lanes.
        let t = trainer_sized(dir.path(), label, block, 100, 83);
        let batch = first_batch(&t);
        let inputs = t.group_inputs(&batch);
        let fast = t.loss_and_grads(&batch, &inputs);
        let graph = t.loss_and_grads_with(&Burn::reference(), &batch, &inputs);
        let near = |a: f32, b: f32| (a - b).abs() <= 1e-6 + 1e-4 * b.abs();
        assert!(
            near(fast.loss, graph.loss),
            "{label}: loss {} vs {}",
            fast.loss,
            graph.loss
        );
        for s in &t.model.params.specs {
            for i in s.range() {
                assert!(
                    near(fast.dense[i], graph.dense[i]),
                    "{label}: d loss / d {}[{}]: cpu {} vs reference {}",
                    s.name,
                    i - s.offset,
                    fast.dense[i],
                    graph.dense[i]
                );
            }
        }
        for (g, (a, b)) in fast.inputs.iter().zip(&graph.inputs).enumerate() {
            assert_eq!(a.len(), b.len());
            // As in `matches_reference`: an entry that sums to near zero
            // keeps the rounding of its group's larger terms.
            let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (j, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6 + 1e-4 * (y.abs() + 0.05 * scale),
                    "{label}: d loss / d input {}[{j}]: cpu {x} vs reference {y}",
                    t.model.groups[g].name
                );
            }
        }
        assert!(fast.dense.iter().any(|g| *g != 0.0) && fast.inputs.iter().flatten().any(|g| *g != 0.0));
        assert_eq!(fast.bn_stats.len(), graph.bn_stats.len(), "{label}: batch norms");
        for (f, g) in fast.bn_stats.iter().zip(&graph.bn_stats) {
            assert_eq!((f.mean_buffer, f.var_buffer), (g.mean_buffer, g.var_buffer));
            for (x, y) in f.mean.iter().chain(&f.var).zip(g.mean.iter().chain(&g.var)) {
                assert!(near(*x, *y), "{label}: batch statistics {x} vs {y}");
            }
        }
    }
}

#[test]
fn every_model_learns_and_a_restored_checkpoint_predicts_the_same() {
    for model in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let mut t = trainer(dir.path(), model);
        let paths = t.plan.data.train_paths.clone();
        let weighted = |st: &[rustrec::metrics::EvalState], t: &Trainer| -> f64 {
            st.iter()
                .zip(&t.plan.model.tasks)
                .map(|(s, k)| k.weight as f64 * s.loss_sum)
                .sum()
        };
        let before = weighted(&t.evaluate(&paths).unwrap(), &t);
        t.run().unwrap();
        assert_eq!(t.step, 10);
        let after = t.evaluate(&paths).unwrap();
        let after_loss = weighted(&after, &t);
        assert!(after_loss < before, "{model}: loss {before} -> {after_loss}");
        let mut fresh = trainer(dir.path(), model);
        fresh
            .restore(&rustrec::checkpoint::latest(&t.plan.model_dir).unwrap().unwrap())
            .unwrap();
        assert_eq!(fresh.step, 10);
        let again = fresh.evaluate(&paths).unwrap();
        // One state per task, then one per graph penalty (MIND's
        // reg_interest_simi) and per graph summary (its similarities).
        let graph = &t.model.graph;
        assert_eq!(
            again.len(),
            t.plan.model.tasks.len() + graph.penalties.len() + graph.summaries.len()
        );
        for (a, b) in again.iter().zip(&after) {
            assert_eq!(a.preds, b.preds, "{model}");
        }
    }
}

/// A multi-class DeepFM distilled from a soft label of five values per row
/// (`label_dim`, EasyRec's `deepfm_multi_cls_small`): the hard labels say
/// nothing, the teacher's probabilities put each `c1 % 5` first, and the
/// student learns the teacher's class, whether the soft label's digits are
/// split into single bytes (an empty `label_sep`) or by a separator, by
/// the softmaxes' log loss or their KL divergence.
#[test]
fn a_multi_class_task_learns_from_a_soft_label_of_several_values() {
    for (sep, loss) in [("", "KL_DIVERGENCE_LOSS"), (";", "CROSS_ENTROPY_LOSS")] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.csv");
        let mut rows = String::new();
        let mut teacher = Vec::new();
        for i in 0..320u64 {
            // Each id comes with every hard label once in each five rows
            // (a batch holds whole fives): alone, they leave its classes
            // even.
            let c1 = (i / 5) % 20;
            let class = (c1 % 5) as usize;
            let soft: Vec<&str> = (0..5)
                .map(|k| match (k == class, sep.is_empty()) {
                    (true, true) => "9",
                    (false, true) => "0",
                    (true, false) => "0.996",
                    (false, false) => "0.001",
                })
                .collect();
            rows.push_str(&format!("{},{c1},{}\n", i % 5, soft.join(sep)));
            teacher.push(class);
        }
        std::fs::write(&data, rows).unwrap();
        let text = format!(
            r#"train_input_path: "{data}"
eval_input_path: "{data}"
model_dir: "{model}"
train_config {{
  optimizer_config {{ lazy_adam_optimizer {{ learning_rate {{ constant_learning_rate {{ learning_rate: 0.05 }} }} }} }}
  num_steps: 150
}}
eval_config {{ metrics_set {{ accuracy {{}} }} metrics_set {{ recall_at_topk {{ topk: 2 }} }} }}
data_config {{
  input_type: CSVInput
  batch_size: 40
  num_epochs: 20
  shuffle: false
  input_fields {{ input_name: "label" input_type: INT64 }}
  input_fields {{ input_name: "c1" input_type: STRING }}
  input_fields {{ input_name: "kd_soft" input_type: STRING }}
  label_fields: ["label", "kd_soft"]
  label_dim: [1, 5]
  label_sep: ["", "{sep}"]
}}
feature_configs {{ input_names: "c1" feature_type: IdFeature num_buckets: 20 embedding_dim: 8 }}
model_config {{ model_class: "DeepFM"
  feature_groups {{ group_name: "wide" feature_names: ["c1"] wide_deep: WIDE }}
  feature_groups {{ group_name: "deep" feature_names: ["c1"] wide_deep: DEEP }}
  deepfm {{ wide_output_dim: 4 dnn {{ hidden_units: [16] }} final_dnn {{ hidden_units: [16] }} }}
  kd {{ soft_label_name: "kd_soft" pred_name: "logits" loss_type: {loss} loss_weight: 20.0 temperature: 2.0 }}
  num_class: 5 }}"#,
            data = data.display(),
            model = dir.path().join("model").display()
        );
        let cfg = dir.path().join("pipeline.config");
        std::fs::write(&cfg, text).unwrap();
        let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
        let mut t = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap();
        let batch = first_batch(&t);
        assert_eq!(batch.labels[1].len(), batch.size * 5, "{loss}: five soft values a row");
        let paths = t.plan.data.train_paths.clone();
        let agreeing = |t: &Trainer| {
            let st = t.evaluate(&paths).unwrap();
            let probs = &st[0].preds;
            assert_eq!(probs.len(), teacher.len() * 5);
            probs
                .chunks_exact(5)
                .zip(&teacher)
                .filter(|(p, &c)| (0..5).all(|k| k == c || p[k] < p[c]))
                .count() as f64
                / teacher.len() as f64
        };
        let before = agreeing(&t);
        t.run().unwrap();
        assert_eq!(t.step, 150);
        let after = agreeing(&t);
        assert!(
            after > 0.8 && after > before + 0.5,
            "{loss}: the teacher's class first on {before} -> {after} of rows"
        );
    }
}

/// CL4SRec's backbone packages: the encoder package runs three times (on
/// two augmented views, each from a run of the augment package, and on the
/// sequence itself) over one set of variables, and the nce loss between
/// the views joins the loss at its weight, training the mask embedding.
#[test]
fn package_runs_share_their_variables_and_the_auxiliary_loss_trains() {
    use rustrec::model::graph::Op;
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(dir.path(), "CL4SRec with a BST package");
    let names: Vec<&str> = t.model.params.specs.iter().map(|s| s.name.as_str()).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "a variable twice: {names:?}");
    assert!(
        names.contains(&"BST/position_embedding/BST") && names.contains(&"augment/mask"),
        "{names:?}"
    );
    let graph = &t.model.graph;
    let count = |f: fn(&Op) -> bool| graph.nodes.iter().filter(|n| f(&n.op)).count();
    assert_eq!(
        count(|op| matches!(op, Op::SeqAugment { .. })),
        2,
        "one augmentation per view"
    );
    assert_eq!(count(|op| matches!(op, Op::Attention { .. })), 3, "the encoder's runs");
    let p = graph.penalties.iter().find(|p| p.name == "contrastive_nce_loss");
    assert_eq!(p.map(|p| p.weight), Some(0.1), "{:?}", graph.penalties);
    // The mask embedding goes through the encoder's ReLU projection: one
    // that projection keeps alive (its first unit's weights' signs).
    let mut t = t;
    let spec = |t: &Trainer, name: &str| t.model.params.specs.iter().find(|s| s.name == name).unwrap().clone();
    let (mask, project) = (spec(&t, "augment/mask"), spec(&t, "BST/seq_project/kernel"));
    for i in 0..mask.len() {
        let w = t.model.params.values[project.offset + i * project.cols];
        t.model.params.values[mask.offset + i] = w.signum();
    }
    let batch = first_batch(&t);
    let inputs = t.group_inputs(&batch);
    let g = t.loss_and_grads(&batch, &inputs);
    assert!(
        g.dense[mask.range()].iter().any(|v| *v != 0.0),
        "the mask embedding trains"
    );
    // Without the auxiliary loss the loss falls by its weighted value.
    let mut plain = trainer(dir.path(), "CL4SRec with a BST package");
    plain.model.graph.penalties.clear();
    let without = plain.loss_and_grads(&batch, &inputs).loss;
    assert!(g.loss - without > 0.01, "{} vs {without}", g.loss);
}

/// EasyRec's contrastive-learning example: the item package's input layer
/// drops out in the two runs of the loss (which runs first, read by the
/// top block only to order it) and not in the top block's run, reset to no
/// dropout; the info_nce loss joins the loss at its weight.
#[test]
fn reset_input_changes_a_packages_input_layer_from_that_run_on() {
    use rustrec::model::graph::Op;
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(dir.path(), "RankModel with contrastive item towers");
    let graph = &t.model.graph;
    let dropouts: Vec<usize> = (0..graph.nodes.len())
        .filter(|i| matches!(graph.nodes[*i].op, Op::Dropout { rate, .. } if rate == 0.1))
        .collect();
    assert_eq!(
        dropouts.len(),
        2,
        "the loss's two runs drop out, the top block's does not"
    );
    let loss = graph
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::Contrastive { .. }))
        .unwrap();
    assert!(dropouts.iter().all(|d| *d < loss), "both runs feed the loss");
    let p = graph
        .penalties
        .iter()
        .find(|p| p.name == "contrastive_learning_info_nce_loss");
    assert_eq!(p.map(|p| p.weight), Some(0.05), "{:?}", graph.penalties);
    let names: Vec<&str> = t.model.params.specs.iter().map(|s| s.name.as_str()).collect();
    let encoders = names.iter().filter(|n| n.starts_with("item_encoder/")).count();
    assert!(
        encoders > 0 && encoders == names.iter().filter(|n| n.starts_with("user_tower/")).count(),
        "{names:?}"
    );
}

/// A package whose runs would need variables of another shape (an MLP
/// package run on inputs of two widths) is refused naming the variable,
/// as EasyRec's reused variable cannot take the second shape either.
#[test]
fn a_package_run_on_inputs_of_another_width_is_refused() {
    let block = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  backbone {
    packages { name: "tower"
      blocks { name: "mlp" inputs { use_package_input: true } keras_layer { class_name: "MLP" mlp { hidden_units: [4] } } } }
    blocks { name: "u" inputs { feature_group_name: "user" } }
    blocks { name: "i" inputs { feature_group_name: "item" } }
    blocks { name: "both" inputs { package_name: "tower" package_input: "u" } inputs { package_name: "tower" package_input: "i" } }
    concat_blocks: "both"
  }
  model_params { } }"#;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.csv");
    write_data(&data, 16, 5);
    let text = COMMON
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL_DIR", dir.path().join("model").to_str().unwrap())
        + block;
    let cfg = dir.path().join("p.config");
    std::fs::write(&cfg, text).unwrap();
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    let e = Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap())
        .err()
        .expect("refused");
    let msg = format!("{e:#}");
    assert!(
        msg.contains(
            "package `tower` runs on an input of another shape than before: its variable `mlp/layer_0/dense/kernel`"
        ),
        "{msg}"
    );
}

/// `--skip_nonfinite_batches`: a batch whose gradient is not finite (an
/// infinite raw value, which the readers refuse but a bad batch can hold)
/// leaves every parameter as it was and moves the step on, while the
/// allowance lasts; the next one stops training naming the allowance.
#[test]
fn batches_with_non_finite_gradients_are_skipped_while_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(dir.path(), "WideAndDeep");
    let batches: Vec<Batch> = t
        .stream(&t.plan.data.train_paths.clone(), true, 0)
        .unwrap()
        .take(3)
        .map(Result::unwrap)
        .collect();
    let poison = |b: &Batch| {
        let mut b = b.clone();
        let dense = b.features.iter_mut().find_map(|f| match f {
            Encoded::Dense { values, .. } => Some(values),
            _ => None,
        });
        dense.expect("a raw feature")[0] = f32::INFINITY;
        b
    };
    // Allowed none (the default), the first bad batch stops training.
    let err = t.train_step(&poison(&batches[0])).unwrap_err();
    assert!(err.is::<rustrec::train::step::Diverged>(), "{err:#}");
    assert_eq!(t.step, 0);

    t.skip_nonfinite_batches = 1;
    t.train_step(&batches[0]).unwrap();
    let params = t.model.params.values.clone();
    let st = t.train_step(&poison(&batches[1])).unwrap();
    assert!(st.skipped && st.loss.is_nan());
    assert_eq!((t.step, t.skipped_batches), (2, 1));
    assert_eq!(t.model.params.values, params, "a skipped batch changed the weights");
    let st = t.train_step(&batches[2]).unwrap();
    assert!(!st.skipped && st.loss.is_finite());
    assert_ne!(t.model.params.values, params);
    let err = t.train_step(&poison(&batches[0])).unwrap_err().to_string();
    assert!(
        err.contains("at step 3")
            && err.contains("1 batches skipped already, as many as --skip_nonfinite_batches allows"),
        "{err}"
    );
}

/// Variational dropout learns a dropout logit per feature of each group,
/// named as EasyRec names them, and its penalty on keeping features,
/// `lambda / batch * Σ (1 - sigmoid(logit))`, is part of the step's
/// regularization loss, with its gradient.
#[test]
fn variational_dropout_penalizes_kept_features_in_the_regularization_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(dir.path(), "DeepFM with variational dropout");
    let logits: Vec<(String, usize)> = t
        .model
        .dropout_logits
        .iter()
        .map(|&i| (t.model.params.specs[i].name.clone(), t.model.params.specs[i].len()))
        .collect();
    // One rate per feature: wide c1, c2, c3; deep c1, c2, c3, d1, d2.
    assert_eq!(
        logits,
        [("logit_p_wide".to_string(), 3), ("logit_p_deep".to_string(), 5)]
    );
    let sigmoid = |x: f32| 1.0 / (1.0 + (-x as f64).exp());
    let keep_sum: f64 = t
        .model
        .dropout_logits
        .iter()
        .flat_map(|&i| t.model.params.slice(i).to_vec())
        .map(|l| 1.0 - sigmoid(l))
        .sum();
    let l2: f64 = t
        .model
        .params
        .specs
        .iter()
        .filter(|s| s.l2)
        .map(|s| {
            t.model.params.values[s.range()]
                .iter()
                .map(|w| (*w as f64).powi(2))
                .sum::<f64>()
        })
        .sum::<f64>()
        * 0.5
        * t.plan.model.l2_regularization as f64;
    let batch = first_batch(&t);
    let st = t.train_step(&batch).unwrap();
    let want = l2 + 0.5 / batch.size as f64 * keep_sum;
    assert!(
        (st.reg_loss as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
        "regularization loss {} vs {want}",
        st.reg_loss
    );
    // The penalty's gradient against central differences.
    let i = t.model.dropout_logits[1];
    let at = t.model.params.specs[i].offset + 2;
    let mut grad = vec![0.0f32; t.model.params.values.len()];
    t.model.dropout_penalty(0.5, 16.0, &mut grad);
    let eps = 1e-3f32;
    let mut g = vec![0.0f32; grad.len()];
    t.model.params.values[at] += eps;
    let up = t.model.dropout_penalty(0.5, 16.0, &mut g);
    t.model.params.values[at] -= 2.0 * eps;
    let down = t.model.dropout_penalty(0.5, 16.0, &mut g);
    let numeric = (up - down) / (2.0 * eps as f64);
    assert!(
        (numeric - grad[at] as f64).abs() <= 1e-5,
        "d penalty: numeric {numeric} vs {}",
        grad[at]
    );
}

/// A sequence of RawFeature values with boundaries is a sequence of
/// bucket ids, and DIN attends over it like over ids.
#[test]
fn raw_value_sequences_are_bucketized_by_their_boundaries() {
    let block = r#"feature_configs { input_names: "d1" feature_name: "rs" feature_type: SequenceFeature separator: "|"
                  sub_feature_type: RawFeature boundaries: [-0.5, 0.0, 0.5] embedding_dim: 4 max_seq_len: 2 }
model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "c1", "c2"]
    sequence_features { group_name: "seq" seq_att_map { key: "c2" hist_seq: "rs" } } }
  dbmtl { task_towers { tower_name: "ctr" dnn { hidden_units: [4] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] } } }"#;
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer_of(dir.path(), "raw sequence", block);
    let index = |name: &str| t.plan.features.iter().position(|f| f.name == name).unwrap();
    let (rs, d1) = (index("rs"), index("d1"));
    let batch = first_batch(&t);
    let (Encoded::Sparse(ids), Encoded::Dense { values, .. }) = (&batch.features[rs], &batch.features[d1]) else {
        panic!("rs is a sequence of ids, d1 a raw value");
    };
    let want: Vec<u64> = values
        .iter()
        .map(|&v| [-0.5f32, 0.0, 0.5].iter().filter(|b| **b <= v).count() as u64)
        .collect();
    assert_eq!(ids.ids, want);
    assert!(want.contains(&0) && want.contains(&3), "{want:?}");
    let st = t.train_step(&batch).unwrap();
    assert!(st.loss.is_finite());
}

/// `seq_multi_sep`: each position of a sequence holds the values split by
/// it, their embeddings combined by the feature's combiner (mean: weights
/// 1/n), empty positions keeping their place; a RawFeature sequence with
/// num_buckets and min_val < max_val is
/// bucketed as EasyRec does, scaled to [0, 1] then cut at k / num_buckets;
/// one with neither (but embedding_dim) has `sequence_length` positions,
/// each positive value weighting the row of its position (0 from
/// raw_input_dim on), as EasyRec projects it.
#[test]
fn multi_valued_sequences_keep_each_values_position() {
    let block = r#"feature_configs { input_names: "c3" feature_name: "ms" feature_type: SequenceFeature separator: "|"
                  seq_multi_sep: ";" combiner: "mean" hash_bucket_size: 50 embedding_dim: 4 max_seq_len: 2 }
feature_configs { input_names: "c3" feature_name: "sc" feature_type: SequenceFeature separator: "|"
                  seq_multi_sep: ";" sub_feature_type: RawFeature num_buckets: 4 min_val: 0 max_val: 8
                  embedding_dim: 4 max_seq_len: 2 }
feature_configs { input_names: "c3" feature_name: "rp" feature_type: SequenceFeature separator: "|"
                  seq_multi_sep: ";" sub_feature_type: RawFeature raw_input_dim: 3 sequence_length: 3 embedding_dim: 4 }
model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "c1", "c2"]
    sequence_features { group_name: "seq" allow_key_transform: true seq_att_map { key: "c2" hist_seq: ["ms", "sc"] } }
    sequence_features { group_name: "seq2" allow_key_transform: true seq_att_map { key: "c2" hist_seq: "rp" } } }
  dbmtl { task_towers { tower_name: "ctr" dnn { hidden_units: [4] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] } } }"#;
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer_of(dir.path(), "multi-valued sequence", block);
    let text: String = ["0;2|7", "4", "", "8;1;3|5|6", "|9;|"]
        .iter()
        .map(|s| format!("1,0.5,0.5,u1,3,{s},0\n"))
        .collect();
    std::fs::write(dir.path().join("data.csv"), text.repeat(4)).unwrap();
    let index = |name: &str| t.plan.features.iter().position(|f| f.name == name).unwrap();
    let batch = first_batch(&t);
    let (Encoded::Sparse(ms), Encoded::Sparse(sc)) = (&batch.features[index("ms")], &batch.features[index("sc")])
    else {
        panic!("sequences are ids");
    };
    let h = |v: &str| rustrec::features::hash_bucket_str(v, 50);
    assert_eq!(
        &ms.ids[..8],
        &[h("0"), h("2"), h("7"), h("4"), h("8"), h("1"), h("3"), h("5")]
    );
    assert_eq!(&ms.offsets[..6], &[0, 3, 4, 4, 8, 9]);
    let third = 1.0f32 / 3.0;
    assert_eq!(
        &ms.weights.as_ref().unwrap()[..8],
        &[0.5, 0.5, 1.0, 1.0, third, third, third, 1.0]
    );
    let p = ms.positions.as_ref().unwrap();
    assert_eq!(&p.of_id[..9], &[0, 0, 1, 0, 0, 0, 0, 1, 1]);
    // An empty position keeps its place (`|9;|`: 9 at position 1), as in
    // TensorFlow's sparse sequence; the length ends at the last value.
    assert_eq!(&p.lens[..5], &[2, 1, 0, 2, 2]);
    // x / 8 against [0, 0.25, 0.5, 0.75]; the sum combiner weighs nothing.
    assert_eq!(&sc.ids[..8], &[1, 2, 4, 3, 4, 1, 2, 3]);
    assert!(sc.weights.is_none());
    assert_eq!(sc.positions.as_ref().unwrap().of_id[..8], p.of_id[..8]);
    let Encoded::Sparse(rp) = &batch.features[index("rp")] else {
        panic!("projected raw sequences are weighted ids");
    };
    assert_eq!(&rp.ids[..8], &[0, 1, 0, 0, 0, 0, 1, 2]);
    assert_eq!(
        &rp.weights.as_ref().unwrap()[..8],
        &[2.0, 7.0, 4.0, 8.0, 1.0, 3.0, 5.0, 6.0]
    );
    assert_eq!(&rp.offsets[..5], &[0, 2, 3, 3, 8]);
    let q = rp.positions.as_ref().unwrap();
    assert_eq!(&q.of_id[..8], &[0, 1, 0, 0, 0, 0, 1, 2]);
    assert_eq!(&q.lens[..4], &[3, 3, 3, 3]);
    let st = t.train_step(&batch).unwrap();
    assert!(st.loss.is_finite());
    // More positions than sequence_length: EasyRec's dense layout fails too.
    std::fs::write(dir.path().join("data.csv"), "1,0.5,0.5,u1,3,1|2|3|4,0\n").unwrap();
    let err = first_batch_error(&t);
    assert!(
        format!("{err:#}").contains("more than sequence_length (3) positions"),
        "{err:#}"
    );
    // num_buckets without min_val < max_val: EasyRec reads integer ids
    // then, which is refused by name rather than scaled by zero.
    let unscaled = block.replace("min_val: 0 max_val: 8", "min_val: 8 max_val: 8");
    let cfg = dir.path().join("unscaled.config");
    std::fs::write(&cfg, COMMON.to_string() + &unscaled).unwrap();
    let err = TrainingPlan::from_config(&load_pipeline(&cfg, &Default::default()).unwrap().config).unwrap_err();
    assert!(err.to_string().contains("num_buckets"), "{err}");
}

/// A group whose sequences a backbone reads unpooled cannot also be read
/// as a plain tensor: the error names the group instead of handing the
/// other input layer the unpooled columns.
#[test]
fn an_unpooled_sequence_group_is_read_only_as_sequences() {
    let block = common::models::TEXT_CNN.replace(
        r#"concat_blocks: ["cnn", "targets", "dense_mlp"]"#,
        r#"blocks { name: "flat" inputs { feature_group_name: "text" } input_layer { do_batch_norm: true } }
    concat_blocks: ["cnn", "targets", "dense_mlp", "flat"]"#,
    );
    assert_ne!(block, common::models::TEXT_CNN);
    let dir = tempfile::tempdir().unwrap();
    write_data(&dir.path().join("data.csv"), 16, 5);
    let text = COMMON
        .replace("DATA", dir.path().join("data.csv").to_str().unwrap())
        .replace("MODEL_DIR", dir.path().join("model").to_str().unwrap())
        + &block;
    let cfg = dir.path().join("twice.config");
    std::fs::write(&cfg, text).unwrap();
    let plan = TrainingPlan::from_config(&load_pipeline(&cfg, &Default::default()).unwrap().config).unwrap();
    let err = Trainer::new(plan).err().expect("the plain read of `text` is refused");
    assert!(format!("{err:#}").contains("group `text`"), "{err:#}");
}

/// LookupFeature: the row's key (c1) looked up in its map (c3 as
/// `key:value` entries): the values of the matching entries hashed as
/// TensorFlow does; more matches than lookup_max_sel_elem_num, or an entry
/// without its separator, is an error naming the row.
#[test]
fn lookup_features_hash_the_values_their_key_finds() {
    let block = r#"feature_configs { input_names: ["c1", "c3"] feature_name: "lk" feature_type: LookupFeature
                  separator: "|" kv_separator: ":" hash_bucket_size: 50 embedding_dim: 4 lookup_max_sel_elem_num: 2 }
model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "lk"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "lk", "d1"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [4] } } }"#;
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer_of(dir.path(), "lookup", block);
    let rows = [
        ("u3", "u3:red|u5:blue|u3:green"),
        ("u5", "u3:red|u5:blue"),
        ("u7", "u3:red"),
        ("u1", ""),
    ];
    let write = |rows: &[(&str, &str)]| {
        let text: String = rows.iter().map(|(k, m)| format!("1,0.5,0.5,{k},3,{m},0\n")).collect();
        std::fs::write(dir.path().join("data.csv"), text.repeat(4)).unwrap();
    };
    write(&rows);
    let lk = t.plan.features.iter().position(|f| f.name == "lk").unwrap();
    let batch = first_batch(&t);
    let Encoded::Sparse(j) = &batch.features[lk] else {
        panic!("a lookup feature is ids");
    };
    let h = |v: &str| rustrec::features::hash_bucket_str(v, 50);
    assert_eq!(&j.offsets[..5], &[0, 2, 3, 3, 3]);
    assert_eq!(&j.ids[..3], &[h("red"), h("green"), h("blue")]);
    assert!(t.train_step(&batch).unwrap().loss.is_finite());

    for (bad, want) in [
        (
            ("u3", "u3:a|u3:b|u3:c"),
            "matches 3 map entries, more than lookup_max_sel_elem_num (2)",
        ),
        (("u3", "u3:a|oops"), "map entry `oops` has no `:`"),
    ] {
        write(&[bad]);
        let err = first_batch_error(&t);
        assert!(format!("{err:#}").contains(want), "{err:#}");
    }
}

/// RTPInput: the same rows as RTP lines (the labels in columns of their
/// own, every other field in one column split on `separator`) train the
/// same model as the CSV rows; a line with a feature too few is refused
/// naming its line.
#[test]
fn rtp_input_trains_like_the_same_rows_as_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv_dir = dir.path().join("csv");
    std::fs::create_dir_all(&csv_dir).unwrap();
    let mut csv = trainer(&csv_dir, "WideAndDeep");
    csv.run().unwrap();

    let rows = std::fs::read_to_string(csv_dir.join("data.csv")).unwrap();
    let rtp_line = |line: &str| {
        let f: Vec<&str> = line.split(',').collect();
        // label, filler, label2, then d1..c3 in one column.
        format!("{};x;{};{}", f[0], f[6], f[1..6].join("\u{2}"))
    };
    let rtp_rows: Vec<String> = rows.lines().map(rtp_line).collect();
    let rtp_data = dir.path().join("rtp.txt");
    std::fs::write(&rtp_data, rtp_rows.join("\n") + "\n").unwrap();
    let text = COMMON
        .replace("DATA", rtp_data.to_str().unwrap())
        .replace("MODEL_DIR", dir.path().join("rtp_model").to_str().unwrap())
        .replace(
            "input_type: CSVInput",
            "input_type: RTPInput selected_cols: \"0,2,3\" rtp_separator: \";\" separator: \"\\002\"",
        )
        .replace(
            "  input_fields { input_name: \"label2\" input_type: INT32 }\n",
            "",
        )
        .replace(
            "  input_fields { input_name: \"label\" input_type: INT32 }\n",
            "  input_fields { input_name: \"label\" input_type: INT32 }\n  input_fields { input_name: \"label2\" input_type: INT32 }\n",
        )
        + model_block("WideAndDeep");
    let cfg = dir.path().join("rtp.config");
    std::fs::write(&cfg, text).unwrap();
    let plan = |cfg: &Path| TrainingPlan::from_config(&load_pipeline(cfg, &Default::default()).unwrap().config);
    let mut rtp = Trainer::new(plan(&cfg).unwrap()).unwrap();
    rtp.run().unwrap();
    assert_eq!(rtp.model.params.values, csv.model.params.values);
    let paths = rtp.plan.data.train_paths.clone();
    let (a, b) = (
        rtp.evaluate(&paths).unwrap(),
        csv.evaluate(&csv.plan.data.train_paths.clone()).unwrap(),
    );
    assert_eq!(a[0].preds, b[0].preds);

    // A line whose feature column lacks a value.
    let mut bad = rtp_rows.clone();
    bad[4] = bad[4].rsplit_once('\u{2}').unwrap().0.to_string();
    std::fs::write(&rtp_data, bad.join("\n") + "\n").unwrap();
    let err = format!("{:#}", rtp.evaluate(&paths).unwrap_err());
    assert!(
        err.contains("line 5") && err.contains("4 feature values in column 3"),
        "{err}"
    );
    // Labels that are not the first input fields.
    let swapped = std::fs::read_to_string(&cfg).unwrap().replace(
        "label_fields: [\"label\", \"label2\"]",
        "label_fields: [\"label\", \"d1\"]",
    );
    std::fs::write(&cfg, swapped).unwrap();
    let err = plan(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("input_fields[1]") && err.contains("not a label field"),
        "{err}"
    );
}

/// `enable_oss_stop_signal`: once model_dir holds `OSS_STOP_SIGNAL`, the
/// chief ends training after the step it sees it at (the first step is
/// always looked at), and saves its checkpoint as at num_steps.
#[test]
fn a_stop_signal_in_model_dir_ends_training() {
    let dir = tempfile::tempdir().unwrap();
    let block = model_block("WideAndDeep");
    let mut t = trainer_of(dir.path(), "WideAndDeep", block);
    assert!(!t.plan.train.stop_signal);
    let cfg = dir.path().join("WideAndDeep.config");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("num_steps: 10", "num_steps: 10 enable_oss_stop_signal: true");
    std::fs::write(&cfg, text).unwrap();
    t = Trainer::new(TrainingPlan::from_config(&load_pipeline(&cfg, &Default::default()).unwrap().config).unwrap())
        .unwrap();
    std::fs::create_dir_all(&t.plan.model_dir).unwrap();
    std::fs::write(t.plan.model_dir.join("OSS_STOP_SIGNAL"), "").unwrap();
    t.run().unwrap();
    assert_eq!(t.step, 1);
    let latest = rustrec::checkpoint::latest(&t.plan.model_dir).unwrap().unwrap();
    assert!(
        latest.to_string_lossy().contains("model.ckpt-1"),
        "{}",
        latest.display()
    );
}

/// `dead_line`, in both of EasyRec's forms: once the clock passes it the
/// chief ends training after that step and saves a checkpoint as at
/// num_steps; a deadline ahead changes nothing; other forms are refused.
#[test]
fn a_dead_line_in_the_past_ends_training_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let block = model_block("WideAndDeep");
    let _ = trainer_of(dir.path(), "WideAndDeep", block);
    let cfg = dir.path().join("WideAndDeep.config");
    let base = std::fs::read_to_string(&cfg).unwrap();
    let run = |dead_line: &str| -> anyhow::Result<Trainer> {
        let text = base.replace("num_steps: 10", &format!("num_steps: 10 dead_line: \"{dead_line}\""));
        std::fs::write(&cfg, text).unwrap();
        let plan = TrainingPlan::from_config(&load_pipeline(&cfg, &Default::default())?.config)?;
        let _ = std::fs::remove_dir_all(&plan.model_dir);
        let mut t = Trainer::new(plan)?;
        t.run()?;
        Ok(t)
    };
    for past in ["20200101 00:00:00", "1577836800"] {
        let t = run(past).unwrap();
        assert_eq!(t.step, 1, "{past}");
        let latest = rustrec::checkpoint::latest(&t.plan.model_dir).unwrap().unwrap();
        assert!(
            latest.to_string_lossy().ends_with("model.ckpt-1"),
            "{}",
            latest.display()
        );
    }
    assert_eq!(run("20990101 00:00:00").unwrap().step, 10);
    let err = run("2099-01-01").err().unwrap().to_string();
    assert!(err.contains("train_config.dead_line"), "{err}");
}

/// `enable_early_stop`: training stops at the first evaluation that comes
/// `max_check_steps` or more after the best one (here nothing learns at a
/// learning rate of 0, so the first evaluation stays the best), then saves,
/// evaluates and exports as at num_steps. EasyRec's own threshold
/// function stops at the first evaluation above its threshold; any other
/// Python `early_stop_func` is refused by name.
#[test]
fn early_stopping_ends_training_when_the_metric_stops_improving() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("early.config");
    let data = dir.path().join("data.csv");
    write_data(&data, 64, 5);
    let text = COMMON
        .replace("learning_rate: 0.1", "learning_rate: 0.0")
        .replace("learning_rate: 0.01", "learning_rate: 0.0")
        .replace("num_steps: 10", "num_steps: 40 save_checkpoints_steps: 2")
        .replace("batch_size: 16", "batch_size: 4")
        .replace("eval_config {", "eval_config { eval_interval_secs: 0")
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL_DIR", dir.path().join("model").to_str().unwrap())
        + model_block("WideAndDeep")
        + "\nexport_config { exporter_type: \"none\" enable_early_stop: true max_check_steps: 4 }";
    std::fs::write(&cfg, &text).unwrap();
    let plan = |cfg: &Path| TrainingPlan::from_config(&load_pipeline(cfg, &Default::default()).unwrap().config);
    let mut t = Trainer::new(plan(&cfg).unwrap()).unwrap();
    t.run().unwrap();
    // Evaluations at steps 2 (the best), 4 and 6: 6 - 2 >= 4.
    assert_eq!(t.step, 6);

    let custom = text.replace(
        "max_check_steps: 4",
        "max_check_steps: 4 early_stop_func: \"my.module.stop\"",
    );
    std::fs::write(&cfg, custom).unwrap();
    let err = load_pipeline(&cfg, &Default::default()).unwrap_err().to_string();
    assert!(
        err.contains("early_stop_func") && err.contains("my.module.stop"),
        "{err}"
    );
    let threshold = |params: &str| {
        text.replace(
            "max_check_steps: 4",
            &format!(
                "early_stop_func: \"easy_rec.python.test.custom_early_stop_func.custom_early_stop_func\" early_stop_params: '{params}'"
            ),
        )
    };
    std::fs::write(&cfg, threshold(r#"{"metric_name": "auc", "thre": -1}"#)).unwrap();
    let mut t = Trainer::new(plan(&cfg).unwrap()).unwrap();
    t.run().unwrap();
    assert_eq!(t.step, 2, "any AUC is above -1: the first evaluation stops");
    std::fs::write(&cfg, threshold(r#"{"metric_name": "auc", "thre": 2}"#)).unwrap();
    let mut t = Trainer::new(plan(&cfg).unwrap()).unwrap();
    t.run().unwrap();
    assert_eq!(t.step, 40, "no AUC is above 2");
    std::fs::write(&cfg, threshold(r#"{"thre": 2}"#)).unwrap();
    let err = load_pipeline(&cfg, &Default::default()).unwrap_err().to_string();
    assert!(
        err.contains("early_stop_params") && err.contains("metric_name"),
        "{err}"
    );
}

/// `session_auc` is GAUC grouped by `session_id_field`: over the same field
/// both report the same value; grouping two metrics by two fields is
/// refused by name.
#[test]
fn session_auc_is_the_gauc_of_its_session_field() {
    let dir = tempfile::tempdir().unwrap();
    let block = model_block("WideAndDeep");
    // Writes the data and the config.
    let _ = trainer_of(dir.path(), "WideAndDeep", block);
    let cfg = dir.path().join("WideAndDeep.config");
    let both = std::fs::read_to_string(&cfg).unwrap().replace(
        "eval_config { metrics_set { auc {} } }",
        "eval_config { metrics_set { gauc { uid_field: \"c2\" } } metrics_set { session_auc { session_id_field: \"c2\" } } }",
    );
    std::fs::write(&cfg, &both).unwrap();
    let plan = |cfg: &Path| TrainingPlan::from_config(&load_pipeline(cfg, &Default::default()).unwrap().config);
    let summary = Trainer::new(plan(&cfg).unwrap()).unwrap().run().unwrap();
    let get = |k: &str| summary.metrics.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    let (g, s) = (get("gauc").unwrap(), get("session_auc").unwrap());
    assert!(g.is_finite() && g == s, "gauc {g} vs session_auc {s}");

    std::fs::write(
        &cfg,
        both.replace("session_id_field: \"c2\"", "session_id_field: \"c1\""),
    )
    .unwrap();
    let err = plan(&cfg).unwrap_err().to_string();
    assert!(err.contains("grouped by two fields (`c2` and `c1`)"), "{err}");
}

/// Highway's gates start at `init_gate_bias` (-3 unless set), and its
/// layers carry Keras' names.
#[test]
fn highway_gates_start_at_their_bias() {
    let dir = tempfile::tempdir().unwrap();
    let (_, block) = EXECUTOR_VARIANTS
        .iter()
        .find(|(label, _)| label.starts_with("RankModel: Highway"))
        .expect("a Highway variant");
    let t = trainer_of(dir.path(), "highway", block);
    let p = &t.model.params;
    let values = |name: &str| {
        let s = p
            .specs
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}"));
        p.values[s.range()].to_vec()
    };
    assert_eq!(values("hw/gate_0/bias"), vec![-1.0; 5]);
    assert_eq!(values("hw/gate_1/bias"), vec![-1.0; 5]);
    assert_eq!(values("hw/input_projection/bias").len(), 5);
    assert_eq!(values("hw/dense_1/bias"), vec![0.0; 5]);
    assert_eq!(values("plain/gate_0/bias"), vec![-3.0; 8]);
}

/// DSSM_SENet's gradients against central differences. Its SENets scale
/// the (small, freshly initialised) embeddings down further, so the loss
/// bends within the step `MODELS` take: a smaller step here, and inner
/// products (the cosine of towers this close to zero bends at any step;
/// the CPU executor is held to burn's autodiff there instead).
#[test]
fn dssm_senet_gradients_match_finite_differences() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(dir.path(), "DSSM_SENet");
    let batch = first_batch(&t);
    let inputs = t.group_inputs(&batch);
    let g = t.loss_and_grads(&batch, &inputs);
    let eps = 5e-4f32;
    let central = |t: &Trainer, x: &[Vec<f32>]| t.loss_and_grads(&batch, x).loss as f64;
    let mut rng = Rng::new(13);
    let n = t.model.params.values.len();
    for _ in 0..30 {
        let i = rng.below(n as u64) as usize;
        let (up, down) = losses_around(&mut t, (&batch, &inputs), i, eps);
        let numeric = (up - down) / (2.0 * eps as f64);
        assert!(
            close(numeric, g.dense[i] as f64),
            "parameter {i}: numeric {numeric}, analytic {}",
            g.dense[i]
        );
    }
    for (gi, grp) in t.model.groups.iter().enumerate() {
        for j in (0..inputs[gi].len()).step_by(7).take(12) {
            let mut x = inputs.clone();
            x[gi][j] += eps;
            let up = central(&t, &x);
            x[gi][j] -= 2.0 * eps;
            let down = central(&t, &x);
            let numeric = (up - down) / (2.0 * eps as f64);
            assert!(
                close(numeric, g.inputs[gi][j] as f64),
                "input {}[{j}]: numeric {numeric}, analytic {}",
                grp.name,
                g.inputs[gi][j]
            );
        }
    }
}

/// A DSSM whose batches carry sampled negative items and whose examples
/// weigh their `d2`: the sampled rows follow the examples without labels,
/// the CPU executor matches burn's autodiff and central differences, and
/// the weights change the loss.
#[test]
fn sampled_negatives_and_sample_weights_train_a_listwise_dssm() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = sampled_dssm(
        dir.path(),
        r#"sample_weight: "d2"
  negative_sampler { input_path: "ITEMS" num_sample: 5 num_eval_sample: 7
    attr_fields: ["c2", "d2", "c1"] item_id_field: "c2" }"#,
    );
    let (batch, inputs, fast) = matches_reference(&t);
    assert_eq!((batch.size, batch.sampled, batch.labels[0].len()), (21, 5, 16));
    assert_eq!(batch.weights.as_ref().map(Vec::len), Some(16));
    // The sampled rows' user tower gets no gradient; their item tower does.
    let user = t.model.groups.iter().position(|g| g.name == "user").unwrap();
    let width = t.model.groups[user].width;
    assert!(fast.inputs[user][16 * width..].iter().all(|g| *g == 0.0));
    let item = t.model.groups.iter().position(|g| g.name == "item").unwrap();
    let width = t.model.groups[item].width;
    assert!(fast.inputs[item][16 * width..].iter().any(|g| *g != 0.0));
    let eps = 5e-4f32;
    let mut rng = Rng::new(17);
    let n = t.model.params.values.len();
    for _ in 0..20 {
        let i = rng.below(n as u64) as usize;
        let (up, down) = losses_around(&mut t, (&batch, &inputs), i, eps);
        let numeric = (up - down) / (2.0 * eps as f64);
        assert!(
            close(numeric, fast.dense[i] as f64),
            "parameter {i}: numeric {numeric}, analytic {}",
            fast.dense[i]
        );
    }
    let mut unweighted = batch.clone();
    unweighted.weights = None;
    let plain = t.loss_and_grads(&unweighted, &inputs).loss;
    assert!((plain - fast.loss).abs() > 1e-4, "weights change the loss ({plain})");
    // Evaluation draws num_eval_sample items and reports EasyRec's recalls.
    let summary = t.run().unwrap();
    let names: Vec<&str> = summary.metrics.iter().map(|(n, _)| n.as_str()).collect();
    for m in ["recall@3", "recall_in_batch@3", "recall_neg_sam@3"] {
        assert!(names.contains(&m), "{names:?}");
    }
    let eval = t
        .stream(&t.plan.data.eval_paths.clone(), false, 0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(eval.sampled, 7);
}

/// The CPU executor's loss and gradients of `t`'s first batch against
/// burn's autodiff; returns them with the batch and its group inputs.
fn matches_reference(t: &Trainer) -> (Batch, Vec<Vec<f32>>, rustrec::train::step::Grads) {
    let batch = first_batch(t);
    let inputs = t.group_inputs(&batch);
    let fast = t.loss_and_grads(&batch, &inputs);
    let graph = t.loss_and_grads_with(&Burn::reference(), &batch, &inputs);
    let near = |a: f32, b: f32| (a - b).abs() <= 1e-6 + 1e-4 * b.abs();
    assert!(near(fast.loss, graph.loss), "loss {} vs {}", fast.loss, graph.loss);
    for (i, (a, b)) in fast.dense.iter().zip(&graph.dense).enumerate() {
        assert!(near(*a, *b), "dense {i}: cpu {a} vs reference {b}");
    }
    // An entry that sums to near zero keeps the rounding of its larger
    // terms: held to its group's gradient scale as well as its own.
    for (a, b) in fast.inputs.iter().zip(&graph.inputs) {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-6 + 1e-4 * (y.abs() + 0.05 * scale),
                "input gradient: cpu {x} vs reference {y} (scale {scale})"
            );
        }
    }
    (batch, inputs, fast)
}

/// Hard negatives: each example's user's items from the edge table follow
/// the drawn ones, and only that user scores them.
#[test]
fn hard_negatives_join_their_users_softmax() {
    let dir = tempfile::tempdir().unwrap();
    let t = sampled_dssm(
        dir.path(),
        r#"hard_negative_sampler { user_input_path: "USERS" item_input_path: "ITEMS"
    hard_neg_edge_input_path: "EDGES" num_sample: 4 num_hard_sample: 2
    attr_fields: ["c2", "d2", "c1"] item_id_field: "c2" user_id_field: "c1" }"#,
    );
    let (batch, _, fast) = matches_reference(&t);
    assert!(!batch.hard_negatives.is_empty());
    assert_eq!(batch.sampled, 4 + batch.hard_negatives.len());
    let mut per_user = std::collections::HashMap::new();
    for &(i, r) in &batch.hard_negatives {
        assert!(i < 16 && r >= 20 && r < batch.size);
        *per_user.entry(i).or_insert(0) += 1;
    }
    assert!(per_user.values().all(|&n| n <= 2), "{per_user:?}");
    assert!(fast.loss.is_finite());
    // v2: the drawn items avoid each user's positive edges.
    let dir = tempfile::tempdir().unwrap();
    let t = sampled_dssm(
        dir.path(),
        r#"negative_sampler_v2 { user_input_path: "USERS" item_input_path: "ITEMS"
    pos_edge_input_path: "EDGES" num_sample: 4
    attr_fields: ["c2", "d2", "c1"] item_id_field: "c2" user_id_field: "c1" }"#,
    );
    let (batch, _, _) = matches_reference(&t);
    assert_eq!((batch.sampled, batch.hard_negatives.len()), (4, 0));
}

/// MIND trained by the listwise softmax against its drawn and hard
/// negatives alone (`ignore_in_batch_neg_sam`, with EasyRec's `item_id`
/// beside it, which that makes moot): the CPU executor matches burn's
/// autodiff, leaving the batch's other items out changes the loss, and
/// evaluation reports EasyRec's recalls.
#[test]
fn mind_trains_on_sampled_and_hard_negatives_alone() {
    let sampler = r#"hard_negative_sampler { user_input_path: "USERS" item_input_path: "ITEMS"
    hard_neg_edge_input_path: "EDGES" num_sample: 4 num_hard_sample: 2
    attr_fields: ["c2", "d2", "c1"] item_id_field: "c2" user_id_field: "c1" }"#;
    let listwise = |ignore: bool| {
        common::models::MIND.replace(
            "l2_regularization: 1e-4 } }",
            &format!("l2_regularization: 1e-4 item_id: \"c2\" ignore_in_batch_neg_sam: {ignore} }}\n  loss_type: SOFTMAX_CROSS_ENTROPY }}"),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let mut t = sampled_match(dir.path(), sampler, &listwise(true));
    let (batch, inputs, fast) = matches_reference(&t);
    assert!(!batch.hard_negatives.is_empty() && fast.loss.is_finite());
    let other = tempfile::tempdir().unwrap();
    let with_batch = sampled_match(other.path(), sampler, &listwise(false).replace("item_id: \"c2\" ", ""));
    let all = with_batch.loss_and_grads(&batch, &inputs).loss;
    assert!(
        (all - fast.loss).abs() > 1e-3,
        "the batch's items change the loss ({all} vs {})",
        fast.loss
    );
    let summary = t.run().unwrap();
    let names: Vec<&str> = summary.metrics.iter().map(|(n, _)| n.as_str()).collect();
    // EasyRec's listwise MIND metrics, those by interest among them.
    for m in [
        "recall@3",
        "recall_in_batch@3",
        "recall_neg_sam@3",
        "interests_recall@3",
        "interests_neg_sam_recall@3",
        "hard_neg_acc",
    ] {
        let v = summary.metrics.iter().find(|(n, _)| n == m).map(|(_, v)| *v);
        assert!(v.is_some_and(|v| (0.0..=1.0).contains(&v)), "{m}: {v:?} in {names:?}");
    }
    // max_interests_simi's penalty is trained and reported, and so are
    // EasyRec's similarities of the interests and of the capsules.
    let simi = summary.metrics.iter().find(|(n, _)| n.contains("reg_interest_simi"));
    assert!(simi.is_some_and(|(_, v)| v.is_finite()), "{names:?}");
    for m in ["interest_similarity", "capsule_similarity"] {
        let v = summary.metrics.iter().find(|(n, _)| n == m).map(|(_, v)| *v);
        assert!(v.is_some_and(|v| (0.0..=1.0).contains(&v)), "{m}: {v:?} in {names:?}");
    }
}

/// EasyRec's `item_id` on a listwise DSSM: a user's softmax leaves out
/// the batch's other examples of its own item (`c2` takes ten values, so
/// a batch of 16 repeats some): the CPU executor matches burn's autodiff
/// and the loss differs from the one over every batch item.
#[test]
fn item_id_leaves_the_batch_examples_of_a_users_item_out_of_its_negatives() {
    let block = model_block("DSSM in-batch softmax");
    let masked = block.replace("temperature: 0.2", "temperature: 0.2 item_id: \"c2\"");
    assert_ne!(masked, block);
    let dir = tempfile::tempdir().unwrap();
    let t = trainer_of(dir.path(), "DSSM with item_id", &masked);
    let (batch, inputs, fast) = matches_reference(&t);
    let keys = batch.item_keys.clone().expect("the batch carries its items");
    assert!(
        keys.iter().enumerate().any(|(i, k)| keys[..i].contains(k)),
        "some item repeats"
    );
    let mut unmasked = batch.clone();
    unmasked.item_keys = None;
    let all = t.loss_and_grads(&unmasked, &inputs).loss;
    assert!((all - fast.loss).abs() > 1e-4, "{all} vs {}", fast.loss);
}

/// A DSSM trainer on the training data with `sampler` (its `ITEMS`,
/// `USERS` and `EDGES` paths filled in) in data_config.
fn sampled_dssm(dir: &Path, sampler: &str) -> Trainer {
    sampled_match(dir, sampler, model_block("DSSM in-batch softmax"))
}

/// `sampled_dssm` of the match model `block`.
fn sampled_match(dir: &Path, sampler: &str, block: &str) -> Trainer {
    let data = dir.join("data.csv");
    write_data(&data, 64, 5);
    let items = dir.join("items.txt");
    let mut table = String::from("id:int64\tweight:float\tfeature:string\n");
    for i in 0..40 {
        table.push_str(&format!(
            "{i}\t{}\t{}:{:.3}:u{}\n",
            1 + i % 3,
            i % 10,
            i as f64 / 40.0,
            i % 20
        ));
    }
    std::fs::write(&items, table).unwrap();
    // Users u0..u19 (`c1`); even ones have hard negatives, items 0..3.
    let users: String = (0..20).map(|i| format!("u{i}\t1\n")).collect();
    std::fs::write(dir.join("users.txt"), format!("id:int64\tweight:float\n{users}")).unwrap();
    let edges: String = (0..20)
        .step_by(2)
        .flat_map(|i| (0..=i % 4).map(move |k| format!("u{i}\t{k}\t1\n")))
        .collect();
    std::fs::write(
        dir.join("edges.txt"),
        format!("userid:int64\titemid:int64\tweight:float\n{edges}"),
    )
    .unwrap();
    let text = COMMON
        .replace("metrics_set { auc {} }", "metrics_set { recall_at_topk { topk: 3 } }")
        .replace(
            "label_fields: [",
            &format!(
                "{}\n  label_fields: [",
                sampler.replace("ITEMS", items.to_str().unwrap())
            ),
        )
        .replace("USERS", dir.join("users.txt").to_str().unwrap())
        .replace("EDGES", dir.join("edges.txt").to_str().unwrap())
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL_DIR", dir.join("model").to_str().unwrap())
        + block;
    let cfg = dir.join("sampled.config");
    std::fs::write(&cfg, text).unwrap();
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    Trainer::new(TrainingPlan::from_config(&loaded.config).unwrap()).unwrap()
}

/// `freeze_gradient`: the variables a pattern matches (by TensorFlow name)
/// keep their values through training while the others move.
#[test]
fn frozen_variables_keep_their_values() {
    let dir = tempfile::tempdir().unwrap();
    let block = model_block("DeepFM").replace(
        "model_config {",
        r#"train_config { freeze_gradient: ["c1_embedding/embedding_weights", "dnn_0/kernel:0$"] }
model_config {"#,
    );
    let mut t = trainer_of(dir.path(), "DeepFM frozen", &block);
    // Under Adam, tables move by their momentum without a gradient: a
    // frozen one must not, as its slots are not updated either.
    t.plan.train.optimizers.iter_mut().for_each(|o| {
        o.kind = rustrec::config::train_plan::OptimizerKind::Adam {
            beta1: 0.9,
            beta2: 0.999,
        }
    });
    for table in &mut t.embeddings.tables {
        table.state.slots.resize(2, Vec::new());
        for s in &mut table.state.slots {
            *s = vec![0.1; table.weights.len()];
        }
    }
    let names = &t.model.table_variables;
    assert_eq!(
        t.frozen.tables,
        names.iter().map(|n| n.contains("c1_embedding")).collect::<Vec<_>>()
    );
    assert!(t.frozen.tables.contains(&true) && t.frozen.dense.contains(&true));
    let (tables0, dense0) = (
        t.embeddings
            .tables
            .iter()
            .map(|x| x.weights.clone())
            .collect::<Vec<_>>(),
        t.model.params.values.clone(),
    );
    t.run().unwrap();
    for ((table, before), frozen) in t.embeddings.tables.iter().zip(&tables0).zip(&t.frozen.tables) {
        assert_eq!(table.weights == *before, *frozen, "{}", table.name);
    }
    for (s, frozen) in t.model.params.specs.iter().zip(&t.frozen.dense) {
        let (now, then) = (&t.model.params.values[s.range()], &dense0[s.range()]);
        assert_eq!(now == then, *frozen, "{}", s.name);
    }
}

/// Dense parameters lent to the executor's device between steps (a
/// GPU's under `--device gpu`; burn's CPU backend offers the same, which
/// this test runs) train as the CPU executor trains them in host memory:
/// under every dense optimizer, with l2 regularization, variational
/// dropout, a frozen kernel and gradient clipping, over checkpoints that
/// read them back in the middle of the run (and lend them again).
#[test]
fn dense_parameters_lent_to_a_device_train_as_in_host_memory() {
    lent_trains_as_in_host_memory(|| std::sync::Arc::new(Burn::reference()));
}

/// The same on the GPU executor's device (lavapipe where there is no GPU):
/// the update rules' kernels there.
#[cfg(feature = "gpu")]
#[test]
fn dense_parameters_lent_to_the_gpu_train_as_in_host_memory() {
    lent_trains_as_in_host_memory(|| rustrec::model::ExecutorKind::Gpu.executor(0).unwrap());
}

/// Every update rule, each once, with settings that exercise its slots.
fn every_optimizer() -> Vec<rustrec::config::train_plan::OptimizerKind> {
    use rustrec::config::train_plan::OptimizerKind;
    let (beta1, beta2) = (0.9, 0.999);
    vec![
        OptimizerKind::Adam { beta1, beta2 },
        OptimizerKind::AdamW {
            beta1,
            beta2,
            weight_decay: 0.01,
        },
        OptimizerKind::LazyAdam { beta1, beta2 },
        OptimizerKind::Adagrad {
            initial_accumulator: 0.1,
        },
        OptimizerKind::Ftrl {
            lr_power: -0.5,
            initial_accumulator: 0.1,
            l1: 0.001,
            l2: 0.01,
            l2_shrinkage: 0.0,
        },
        OptimizerKind::Momentum { momentum: 0.9 },
        OptimizerKind::MomentumW {
            momentum: 0.9,
            weight_decay: 0.01,
        },
        OptimizerKind::RmsProp {
            momentum: 0.5,
            decay: 0.9,
            epsilon: 1e-6,
        },
    ]
}

/// Trains a DeepFM under each dense optimizer on the CPU executor and on
/// `exec`, which keeps the dense parameters on its device: the same
/// parameters and slots.
fn lent_trains_as_in_host_memory(exec: impl Fn() -> std::sync::Arc<dyn rustrec::model::Executor>) {
    let optimizers = every_optimizer();
    // Without batch norms: a bias a batch norm follows has no gradient but
    // rounding noise, which Adam turns into whole steps on any two executors.
    let block = model_block("DeepFM with variational dropout")
        .replace(
            "model_config {",
            r#"train_config { freeze_gradient: ["dnn_0/kernel:0$"] save_checkpoints_steps: 4 gradient_clipping_by_norm: 0.5 }
model_config {"#,
        )
        .replace("hidden_units: [", "use_bn: false hidden_units: [");
    for kind in optimizers {
        let dir = tempfile::tempdir().unwrap();
        let trained = |name: &str, lent: bool| {
            let sub = dir.path().join(name);
            std::fs::create_dir_all(&sub).unwrap();
            let mut t = trainer_of(&sub, "DeepFM lent", &block);
            t.plan.train.optimizers[t.dense.optimizer].kind = kind.clone();
            t.dense =
                rustrec::train::dense::Dense::new(&t.plan.train.optimizers, t.dense.optimizer, t.model.params.len());
            t.plan.model.l2_regularization = 1e-2;
            if lent {
                t.model.exec = exec();
                assert!(t.model.exec.resident_device().is_some());
            }
            t.run().unwrap();
            let ckpts = std::fs::read_dir(&t.plan.model_dir)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with("model.ckpt-")
                })
                .count();
            assert!(ckpts >= 3, "{kind:?}: checkpoints at 4, 8 and 10");
            t
        };
        let (host, lent) = (trained("host", false), trained("lent", true));
        assert!(host.frozen.dense.contains(&true) && !host.model.dropout_logits.is_empty());
        let near = |a: &[f32], b: &[f32], what: &str| {
            assert_eq!(a.len(), b.len(), "{kind:?} {what}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "{kind:?} {what}[{i}]: lent {x} vs host {y}"
                );
            }
        };
        near(&lent.model.params.values, &host.model.params.values, "parameters");
        assert_eq!(lent.dense.slots.slots.len(), host.dense.slots.slots.len());
        for (k, (a, b)) in lent.dense.slots.slots.iter().zip(&host.dense.slots.slots).enumerate() {
            near(a, b, &format!("slot {k}"));
        }
        // The frozen kernel kept its initial values; the others moved.
        let fresh_dir = dir.path().join("fresh");
        std::fs::create_dir_all(&fresh_dir).unwrap();
        let fresh = trainer_of(&fresh_dir, "DeepFM lent", &block);
        assert_ne!(lent.model.params.values, fresh.model.params.values, "{kind:?}");
        for (s, _) in host
            .model
            .params
            .specs
            .iter()
            .zip(&host.frozen.dense)
            .filter(|(_, f)| **f)
        {
            let (now, then) = (
                &lent.model.params.values[s.range()],
                &fresh.model.params.values[s.range()],
            );
            assert_eq!(now, then, "{kind:?}: {}", s.name);
        }
    }
}

/// EasyRec's ExprFeature (its `multi_tower_on_taobao_for_expr` kind of
/// expressions) in a deep group: each row's value is what EasyRec's
/// TensorFlow expression computes, and the model trains, evaluates and
/// exports with it.
#[test]
fn expression_features_compute_easyrecs_values_and_train() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::shared_dir().join("data/real/ml-100k");
    rustrec::datagen::prepare_movielens(&src, tmp.path(), 0.2, 1).unwrap();
    let sample =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/wide_and_deep_ml100k.config"))
            .unwrap();
    let text = sample
        .replace(
            "\nmodel_config {",
            "feature_configs { input_names: \"age\" input_names: \"year\" feature_type: ExprFeature \
             feature_name: \"old_fan\" expression: \"(age>=30) & (year<(1990-5))\" }\n\
             feature_configs { input_names: \"age\" feature_type: ExprFeature feature_name: \"age_tens\" \
             expression: \"age/10-1\" }\n\nmodel_config {",
        )
        .replace(
            "\"year\", \"genres\"] wide_deep: DEEP",
            "\"year\", \"genres\", \"old_fan\", \"age_tens\"] wide_deep: DEEP",
        );
    assert!(text.contains("ExprFeature") && text.contains("\"age_tens\"] wide_deep: DEEP"));
    let cfg = tmp.path().join("expr.config");
    std::fs::write(&cfg, text).unwrap();

    // The values, row by row.
    let loaded = load_pipeline(&cfg, &Default::default()).unwrap();
    let plan = TrainingPlan::from_config(&loaded.config).unwrap();
    let enc = rustrec::features::Encoder::for_inference(&plan).unwrap();
    let fields: Vec<String> = plan.data.fields.iter().map(|f| f.name.clone()).collect();
    let rows = "0,1,2,35,M,x,1,1980,Drama,0,\n0,1,2,35,M,x,1,1987,Drama,0,\n0,1,2,20,M,x,1,1970,Drama,0,\n0,1,2,,M,x,1,,Drama,0,\n";
    let raw = rustrec::data::csv::CsvChunks::from_text("rows", rows.into(), ",", &fields, &enc.projection, 16)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let batch = enc.encode(&raw).unwrap();
    let names = plan.features.names();
    let values = |name: &str| match &batch.features[names.iter().position(|n| n == name).unwrap()] {
        Encoded::Dense { dim: 1, values } => values.clone(),
        other => panic!("{name}: {other:?}"),
    };
    // Empty cells are the fields' default_val (age 30, year 1990).
    assert_eq!(values("old_fan"), [1.0, 0.0, 0.0, 0.0]);
    assert_eq!(values("age_tens"), [2.5, 2.5, 1.0, 2.0]);

    let model_dir = tmp.path().join("model");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--train_input_path", tmp.path().join("train.csv").to_str().unwrap()])
        .args(["--eval_input_path", tmp.path().join("eval.csv").to_str().unwrap()])
        .args(["--train_config.num_steps=30"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec = std::fs::read_dir(model_dir.join("export/final"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("assets/feature_spec.json");
    let spec = std::fs::read_to_string(spec).unwrap();
    assert!(spec.contains("(age>=30) & (year<(1990-5))"), "{spec}");
}

/// Small tables kept on a device (`device_table_rows`, here burn's CPU
/// device) train as in host memory: their lookups pooled there (sums,
/// means, a sequence by position, a table two parts read), their
/// gradients, embedding_regularization, clipping and every sparse
/// optimizer's touched-row semantics there, over checkpoints that read
/// them back in the middle of the run.
#[test]
fn tables_kept_on_a_device_train_as_in_host_memory() {
    tables_on_device_train_as_in_host_memory(|| std::sync::Arc::new(Burn::reference()));
}

/// The same on the GPU executor's device (lavapipe where there is no GPU).
#[cfg(feature = "gpu")]
#[test]
fn tables_kept_on_the_gpu_train_as_in_host_memory() {
    tables_on_device_train_as_in_host_memory(|| rustrec::model::ExecutorKind::Gpu.executor(0).unwrap());
}

/// Trains a MultiTowerDIN under each table optimizer on the CPU executor
/// with every table in host memory, and on `exec` with every table kept
/// on its device: the same parameters, rows and slots.
fn tables_on_device_train_as_in_host_memory(exec: impl Fn() -> std::sync::Arc<dyn rustrec::model::Executor>) {
    use rustrec::optim::SlotState;
    let kinds = every_optimizer();
    // MultiTowerDIN with a mean tag feature among the user's; without
    // batch norms: a bias a batch norm follows has no gradient but rounding
    // noise, which Adam turns into whole steps.
    let block = format!(
        "train_config {{ save_checkpoints_steps: 4 gradient_clipping_by_norm: 0.5 }}\n{}",
        model_block("MultiTowerDIN")
            .replace(r#"["c1", "d1"]"#, r#"["c1", "d1", "c3"]"#)
            .replace("hidden_units: [", "use_bn: false hidden_units: [")
    );
    assert!(block.contains(r#"["c1", "d1", "c3"]"#));
    for kind in kinds {
        let dir = tempfile::tempdir().unwrap();
        let trainer = |name: &str, lent: bool| {
            let sub = dir.path().join(name);
            std::fs::create_dir_all(&sub).unwrap();
            let mut t = trainer_of(&sub, "DIN with tables on a device", &block);
            let opt = t.embeddings.tables[0].optimizer;
            t.plan.train.optimizers[opt].kind = kind.clone();
            for table in &mut t.embeddings.tables {
                assert_eq!(table.optimizer, opt);
                table.state = SlotState::new(&kind, table.weights.len());
            }
            if t.dense.optimizer == opt {
                t.dense = rustrec::train::dense::Dense::new(&t.plan.train.optimizers, opt, t.model.params.len());
            }
            t.plan.model.embedding_regularization = 1e-3;
            if lent {
                t.model.exec = exec();
                t.device_table_rows = 1000;
            }
            t
        };
        // One step keeps every table on the device, its host rows empty
        // meanwhile; settled, they are back.
        let mut probe = trainer("probe", true);
        let rows: Vec<usize> = probe.embeddings.tables.iter().map(|t| t.weights.len()).collect();
        probe.train_step(&first_batch(&probe)).unwrap();
        assert_eq!(probe.embeddings.on_device, vec![true; rows.len()], "{kind:?}");
        assert!(probe.embeddings.tables.iter().all(|t| t.weights.is_empty()));
        probe.settle_device();
        assert!(probe.embeddings.on_device.is_empty());
        let back: Vec<usize> = probe.embeddings.tables.iter().map(|t| t.weights.len()).collect();
        assert_eq!(back, rows);

        let (mut host, mut lent) = (trainer("host", false), trainer("lent", true));
        host.run().unwrap();
        lent.run().unwrap();
        let kind = &kind;
        let within = |tol: f32| {
            move |a: &[f32], b: &[f32], what: &str| {
                assert_eq!(a.len(), b.len(), "{kind:?} {what}");
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= tol * (1.0 + y.abs()),
                        "{kind:?} {what}[{i}]: on the device {x} vs host {y}"
                    );
                }
            }
        };
        let near = within(1e-4);
        // DIN's attention logits go through a softmax, whose shift leaves
        // their last bias a gradient of rounding noise only, which the
        // dense Adam turns into steps of 1e-4: 1e-3 there.
        within(1e-3)(&lent.model.params.values, &host.model.params.values, "dense parameters");
        assert!(host.embeddings.tables.len() >= 4);
        for (k, (a, b)) in lent.embeddings.tables.iter().zip(&host.embeddings.tables).enumerate() {
            near(&a.weights, &b.weights, &format!("table {k}"));
            for (s, (x, y)) in a.state.slots.iter().zip(&b.state.slots).enumerate() {
                near(x, y, &format!("table {k} slot {s}"));
            }
        }
        let fresh = trainer("fresh", false);
        assert_ne!(lent.embeddings.tables[0].weights, fresh.embeddings.tables[0].weights);
    }
}
