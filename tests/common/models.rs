//! Small models over every feature kind, on generated rows: shared by the
//! export and serving tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustrec::util::Rng;

/// Every feature kind the graph has to reproduce: raw values, bucketized
/// values, hashed and identity ids, mean-combined tags, weighted tags and a
/// combo. c1's wide and deep tables (70000 x 4 floats) exceed the external
/// data threshold.
pub const COMMON: &str = r#"
train_input_path: "DATA"
eval_input_path: "DATA"
model_dir: "MODEL_DIR"
train_config {
  optimizer_config { adagrad_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.1 } } } }
  optimizer_config { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } } }
  num_steps: 30
  save_checkpoints_steps: 10
}
eval_config { eval_interval_secs: 0 metrics_set { auc {} } }
data_config {
  input_type: CSVInput
  batch_size: 32
  input_fields { input_name: "label" input_type: INT32 }
  input_fields { input_name: "d1" input_type: DOUBLE }
  input_fields { input_name: "d2" input_type: DOUBLE }
  input_fields { input_name: "c1" input_type: STRING }
  input_fields { input_name: "c2" input_type: STRING }
  input_fields { input_name: "c3" input_type: STRING }
  input_fields { input_name: "c4" input_type: STRING }
  input_fields { input_name: "label2" input_type: INT32 }
  label_fields: ["label", "label2"]
}
feature_configs { input_names: "d1" feature_type: RawFeature min_val: -3 max_val: 3 }
feature_configs { input_names: "d2" feature_type: RawFeature boundaries: [0.25, 0.5, 0.75] embedding_dim: 4 }
feature_configs { input_names: "c1" feature_type: IdFeature hash_bucket_size: 70000 embedding_dim: 4 }
feature_configs { input_names: "c2" feature_type: IdFeature num_buckets: 10 embedding_dim: 4 }
feature_configs { input_names: "c3" feature_type: TagFeature separator: "|" hash_bucket_size: 30 embedding_dim: 4 combiner: "mean" }
feature_configs { input_names: "c4" feature_type: TagFeature separator: "|" kv_separator: ":" hash_bucket_size: 20 embedding_dim: 4 }
feature_configs { feature_name: "c1_x_c2" input_names: ["c1", "c2"] feature_type: ComboFeature hash_bucket_size: 50 embedding_dim: 4 }
"#;

/// A MatchModel whose backbone's two outputs are the towers.
pub const MATCH_MODEL: &str = r#"model_config { model_class: "MatchModel"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2", "c1"] }
  backbone {
    blocks { name: "user_fields" inputs { feature_group_name: "user" } input_layer { output_2d_tensor_and_feature_list: true } }
    blocks { name: "user_tower" inputs { block_name: "user_fields" input_slice: "[0]" } keras_layer { class_name: "MLP" mlp { hidden_units: [6, 4] use_bn: false final_activation: "linear" } } }
    blocks { name: "item_tower" inputs { feature_group_name: "item" }
             keras_layer { class_name: "MLP" mlp { hidden_units: [4] use_final_bn: false final_activation: "linear" } } }
    output_blocks: ["item_tower", "user_tower"]
  }
  model_params { l2_regularization: 1e-4 temperature: 0.3 scale_simi: true user_tower_idx_in_output: 1 item_tower_idx_in_output: 0 } }"#;

/// A RankModel over FiBiNet with a batch-normed input list.
pub const FIBINET: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "fields" feature_names: ["c1", "c2", "c3"] }
  backbone {
    blocks { name: "field_list" inputs { feature_group_name: "fields" } input_layer { do_batch_norm: true only_output_feature_list: true } }
    blocks { name: "fibinet" inputs { block_name: "field_list" }
             keras_layer { class_name: "FiBiNet" fibinet { senet { reduction_ratio: 2 } bilinear { type: "each" num_output_units: 5 } mlp { hidden_units: [4] } } } }
    concat_blocks: ["fibinet"]
  }
  model_params { } }"#;

/// A MultiTaskModel over the MMoE Keras layer.
pub const MMOE_LAYER: &str = r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "mmoe" inputs { feature_group_name: "all" }
      keras_layer { class_name: "MMoE" mmoe { num_task: 2 num_expert: 3 expert_mlp { hidden_units: [6, 4] } } } }
  }
  model_params {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [3] } weight: 0.5 }
    l2_regularization: 1e-4 } }"#;

/// A RankModel over EasyRec's PPNet: a lazy PPNet whose gates read the
/// `memorize` group beside its input, with batch norm in the gates.
pub const PPNET: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "memorize" feature_names: ["c1", "c2"] }
  feature_groups { group_name: "general" feature_names: ["d1", "c3", "c2"] }
  backbone {
    blocks { name: "ppnet" inputs { feature_group_name: "general" } inputs { feature_group_name: "memorize" }
             merge_inputs_into_list: true
             keras_layer { class_name: "PPNet" ppnet { mlp { hidden_units: [6, 4] } gate_params { hidden_dim: 3 use_bn: true }
                                                      mode: "lazy" full_gate_input: true } } }
    top_mlp { hidden_units: [4] }
  }
  model_params { l2_regularization: 1e-6 } }"#;

/// A MultiTaskModel as EasyRec's AITM sample: a shared bottom, a tower per
/// task, the CVR tower's AITM over itself and the CTR tower (through a
/// transfer MLP), and the CVR task's losses with ORDER_CALIBRATE_LOSS
/// (which adds nothing without relation towers, as in EasyRec).
pub const AITM: &str = r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  backbone {
    blocks { name: "share_bottom" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [8] } } }
    blocks { name: "ctr_tower" inputs { block_name: "share_bottom" } keras_layer { class_name: "MLP" mlp { hidden_units: 5 } } }
    blocks { name: "cvr_tower" inputs { block_name: "share_bottom" } keras_layer { class_name: "MLP" mlp { hidden_units: 5 } } }
    blocks { name: "cvr_aitm" inputs { block_name: "cvr_tower" } inputs { block_name: "ctr_tower" } merge_inputs_into_list: true
             keras_layer { class_name: "AITMTower" aitm { project_dim: 4 transfer_mlp { hidden_units: 5 } } } }
    output_blocks: ["ctr_tower", "cvr_aitm"]
  }
  model_params {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" losses { loss_type: CLASSIFICATION }
                  losses { loss_type: ORDER_CALIBRATE_LOSS } dnn { hidden_units: [3] } }
    l2_regularization: 1e-6 } }"#;

/// DBMTL whose CVR tower's losses hold ORDER_CALIBRATE_LOSS over its
/// relation tower, the CTR tower.
pub const DBMTL_CALIBRATED: &str = r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3"] }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [6] } relation_dnn { hidden_units: [4] } }
          task_towers { tower_name: "cvr" dnn { hidden_units: [6] } relation_tower_names: ["ctr"]
                        losses { loss_type: CLASSIFICATION } losses { loss_type: ORDER_CALIBRATE_LOSS weight: 3.0 }
                        relation_dnn { hidden_units: [4] } } } }"#;

/// A RankModel of repeated mask blocks gated by a softmax MLP (EasyRec's CDN).
pub const REPEAT_AND_GATE: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "memorize" feature_names: ["c1", "c2"] }
  feature_groups { group_name: "general" feature_names: ["d1", "c3", "c2"] }
  feature_groups { group_name: "frequency" feature_names: ["d2", "c1"] }
  backbone {
    blocks { name: "mem_expert" inputs { feature_group_name: "memorize" } keras_layer { class_name: "MLP" mlp { hidden_units: [4] use_final_bn: false } } }
    blocks { name: "gen_experts" inputs { feature_group_name: "general" input_fn: "lambda x: [x, x]" }
             repeat { num_repeat: 2 keras_layer { class_name: "MaskBlock" mask_block { output_size: 4 aggregation_size: 6 } } } }
    blocks { name: "gate_weight" inputs { feature_group_name: "frequency" }
             keras_layer { class_name: "MLP" mlp { hidden_units: 3 use_final_bn: false final_activation: "softmax" } } }
    blocks { name: "gate" inputs { block_name: "gate_weight" input_fn: "lambda x: [x]" }
             inputs { block_name: "mem_expert" input_fn: "lambda x: [x]" } inputs { block_name: "gen_experts" }
             keras_layer { class_name: "Gate" } }
    top_mlp { hidden_units: [4] }
  }
  model_params { l2_regularization: 1e-6 } }"#;

/// A RankModel over xDeepFM's CIN.
pub const CIN: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "fields" feature_names: ["c1", "c2", "c3"] }
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  backbone {
    blocks { name: "fields" inputs { feature_group_name: "fields" } input_layer { only_output_3d_tensor: true } }
    blocks { name: "cin" inputs { block_name: "fields" } keras_layer { class_name: "CIN" cin { hidden_feature_sizes: [4, 3] } } }
    blocks { name: "dense_mlp" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [3] } } }
    concat_blocks: ["cin", "dense_mlp"]
  }
  model_params { } }"#;

/// A RankModel whose backbone reads a group's sequence unpooled
/// (output_seq_and_normal_feature: the sequence, its length and the
/// group's other features) into a TextCNN with an MLP on top, the other
/// features (the triple's third) into an MLP of their own.
pub const TEXT_CNN: &str = r#"feature_configs { input_names: "c3" feature_name: "words" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "RankModel"
  feature_groups { group_name: "text" feature_names: ["words", "c2", "c1", "c3"] }
  feature_groups { group_name: "dense" feature_names: ["d1", "d2"] }
  backbone {
    blocks { name: "text" inputs { feature_group_name: "text" } input_layer { output_seq_and_normal_feature: true } }
    blocks { name: "cnn" inputs { block_name: "text" }
             keras_layer { class_name: "TextCNN" text_cnn { filter_sizes: [1, 2] num_filters: [3, 2] pad_sequence_length: 4
                                                            activation: "tanh" mlp { hidden_units: [4] activation: "tanh" } } } }
    blocks { name: "targets" inputs { block_name: "text" input_slice: "[2]" }
             keras_layer { class_name: "MLP" mlp { hidden_units: [3] activation: "tanh" } } }
    blocks { name: "dense_mlp" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [3] } } }
    concat_blocks: ["cnn", "targets", "dense_mlp"]
  }
  model_params { } }"#;

/// A RankModel whose DIN layer attends over an unpooled sequence with the
/// group's other feature as its target, scoring positions with an MLP of
/// Dice activations.
pub const DIN_LAYER: &str = r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "RankModel"
  feature_groups { group_name: "seq" feature_names: ["hist", "c2"] }
  feature_groups { group_name: "dense" feature_names: ["d1", "d2", "c1"] }
  backbone {
    blocks { name: "seq" inputs { feature_group_name: "seq" } input_layer { output_seq_and_normal_feature: true } }
    blocks { name: "din" inputs { block_name: "seq" }
             keras_layer { class_name: "DIN" din { attention_dnn { hidden_units: [5, 1] activation: "dice" } } } }
    blocks { name: "dense_mlp" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [3] } } }
    concat_blocks: ["din", "dense_mlp"]
  }
  model_params { } }"#;

/// Two text sequences (of different lengths) over c3, for the multi-modal
/// models' `text` group.
macro_rules! text_sequences {
    () => {
        r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
feature_configs { input_names: "c3" feature_name: "genres" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 20 embedding_dim: 4 max_seq_len: 2 }
"#
    };
}

/// The multi-modal models' four groups, the sequences as `text`.
macro_rules! multimodal_groups {
    () => {
        r#"
  feature_groups { group_name: "image" feature_names: ["d1"] }
  feature_groups { group_name: "general" feature_names: ["c1", "c2"] }
  feature_groups { group_name: "text" feature_names: ["title", "genres"] }
  feature_groups { group_name: "other" feature_names: ["d2"] }
"#
    };
}

/// CMBF over all four groups: one image value mapped to three positions
/// through a self-attention layer, the general features and both sequences
/// through the text's (token types and positions), cross attention.
pub const CMBF: &str = concat!(
    text_sequences!(),
    r#"model_config { model_class: "CMBF""#,
    multimodal_groups!(),
    r#"  cmbf { config { multi_head_num: 2 image_multi_head_num: 1 image_head_size: 4 text_multi_head_num: 2 text_head_size: 3
                  image_feature_dim: 3 image_self_attention_layer_num: 1 text_self_attention_layer_num: 1
                  cross_modal_layer_num: 1 image_cross_head_size: 2 text_cross_head_size: 3
                  max_position_embeddings: 4 use_token_type: true hidden_dropout_prob: 0.1
                  other_feature_dnn { hidden_units: [3] } }
         final_dnn { hidden_units: [4] } } }"#
);

/// Uniter over all four groups.
pub const UNITER: &str = concat!(
    text_sequences!(),
    r#"model_config { model_class: "Uniter""#,
    multimodal_groups!(),
    r#"  uniter { config { hidden_size: 4 num_attention_heads: 2 num_hidden_layers: 1 intermediate_size: 6 hidden_act: "swish"
                    max_position_embeddings: 4 hidden_dropout_prob: 0.1 attention_probs_dropout_prob: 0
                    other_feature_dnn { hidden_units: [3] } }
           final_dnn { hidden_units: [4] } } }"#
);

/// MIND over a history of c3's tags and its time feature (one column),
/// the sequences through pre_capsule_dnn, every user three interests,
/// cosines (DNNs without batch norm: the executor variants have MIND's
/// batch norms with inner products).
pub const MIND: &str = r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
feature_configs { input_names: "c3" feature_name: "hist_time" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 10 embedding_dim: 1 max_seq_len: 3 }
model_config { model_class: "MIND"
  feature_groups { group_name: "hist" feature_names: ["hist", "hist_time"] }
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  mind { user_dnn { hidden_units: [4] use_bn: false } concat_dnn { hidden_units: [5, 4] use_bn: false }
         item_dnn { hidden_units: [6, 4] }
         pre_capsule_dnn { hidden_units: [3] use_bn: false }
         capsule_config { max_k: 3 max_seq_len: 4 high_dim: 4 const_caps_num: true squash_pow: 0.5 }
         time_id_fea: "hist_time" simi_pow: 5 max_interests_simi: 0.2 l2_regularization: 1e-4 } }"#;

/// A RankModel whose BST layer runs EasyRec's transformer encoder (GELU)
/// over the target and an unpooled sequence padded to its positions.
pub const BST_LAYER: &str = r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 2 }
model_config { model_class: "RankModel"
  feature_groups { group_name: "seq" feature_names: ["hist", "c2"] }
  feature_groups { group_name: "dense" feature_names: ["d1", "d2", "c1"] }
  backbone {
    blocks { name: "seq" inputs { feature_group_name: "seq" } input_layer { output_seq_and_normal_feature: true } }
    blocks { name: "bst" inputs { block_name: "seq" }
             keras_layer { class_name: "BST" bst { hidden_size: 4 num_attention_heads: 2 num_hidden_layers: 2
                                                   intermediate_size: 6 hidden_act: "gelu" max_position_embeddings: 3
                                                   hidden_dropout_prob: 0.1 attention_probs_dropout_prob: 0 } } }
    blocks { name: "dense_mlp" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [3] } } }
    concat_blocks: ["bst", "dense_mlp"]
  }
  model_params { } }"#;

/// CL4SRec in small (EasyRec's zoo config): a BST package run on two
/// augmented views of the sequence (each from a run of the augment
/// package) for the nce auxiliary loss and on the sequence itself for the
/// main tower; every run shares the encoder's variables.
pub const CL4SREC: &str = r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 6 max_seq_len: 3 }
model_config { model_class: "RankModel"
  feature_groups { group_name: "user_seq" feature_names: ["hist"] }
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  backbone {
    blocks { name: "user_seq" inputs { feature_group_name: "user_seq" } input_layer { output_seq_and_normal_feature: true } }
    packages { name: "seq_augment"
      blocks { name: "augment" inputs { block_name: "user_seq" }
               keras_layer { class_name: "SeqAugment" seq_aug { mask_rate: 0.6 crop_rate: 0.5 reorder_rate: 0.6 } } } }
    packages { name: "seq_encoder"
      blocks { name: "BST" inputs { use_package_input: true }
               keras_layer { class_name: "BST" bst { hidden_size: 4 num_attention_heads: 2 num_hidden_layers: 1
                                                     intermediate_size: 6 hidden_act: "gelu" max_position_embeddings: 3
                                                     hidden_dropout_prob: 0.1 attention_probs_dropout_prob: 0
                                                     output_all_token_embeddings: false } } } }
    blocks { name: "contrastive"
      inputs { package_name: "seq_encoder" package_input: "seq_augment" }
      inputs { package_name: "seq_encoder" package_input: "seq_augment" }
      merge_inputs_into_list: true
      keras_layer { class_name: "AuxiliaryLoss" st_params {
        fields { key: "loss_type" value { string_value: "nce_loss" } }
        fields { key: "loss_weight" value { number_value: 0.1 } }
        fields { key: "temperature" value { number_value: 0.15 } } } } }
    blocks { name: "main" inputs { package_name: "seq_encoder" package_input: "user_seq" }
             inputs { feature_group_name: "user" } inputs { feature_group_name: "item" } }
    concat_blocks: "main"
    top_mlp { hidden_units: [4] }
  }
  model_params { } }"#;

/// EasyRec's contrastive-learning example in small: an item-tower package
/// (an input layer with dropout, then an MLP) run twice for an info_nce
/// auxiliary loss, and once more, its input layer reset to no dropout,
/// beside the user tower; the loss block is read only to run first
/// (`ignore_input`).
pub const CONTRASTIVE: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  backbone {
    blocks { name: "user_tower" inputs { feature_group_name: "user" } keras_layer { class_name: "MLP" mlp { hidden_units: [6, 4] } } }
    packages { name: "item_tower"
      blocks { name: "item" inputs { feature_group_name: "item" } input_layer { dropout_rate: 0.1 } }
      blocks { name: "item_encoder" inputs { block_name: "item" } keras_layer { class_name: "MLP" mlp { hidden_units: [6, 4] } } } }
    blocks { name: "contrastive_learning" inputs { package_name: "item_tower" } inputs { package_name: "item_tower" }
      merge_inputs_into_list: true
      keras_layer { class_name: "AuxiliaryLoss" st_params {
        fields { key: "loss_type" value { string_value: "info_nce" } }
        fields { key: "loss_weight" value { number_value: 0.05 } }
        fields { key: "temperature" value { number_value: 0.5 } } } } }
    blocks { name: "top_mlp" inputs { block_name: "contrastive_learning" ignore_input: true } inputs { block_name: "user_tower" }
      inputs { package_name: "item_tower" reset_input { } }
      keras_layer { class_name: "MLP" mlp { hidden_units: [4] } } }
    concat_blocks: "top_mlp"
  }
  model_params { l2_regularization: 1e-4 } }"#;

/// DropoutNet: content and (row-dropped) preference groups per side, its
/// losses list of sigmoid cross entropy and the pairwise loss.
pub const DROPOUTNET: &str = r#"model_config { model_class: "DropoutNet"
  feature_groups { group_name: "user_content" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "user_preference" feature_names: ["c3"] }
  feature_groups { group_name: "item_content" feature_names: ["c2", "d2"] }
  feature_groups { group_name: "item_preference" feature_names: ["c1", "c2"] }
  losses { loss_type: CLASSIFICATION weight: 1.0 }
  losses { loss_type: PAIR_WISE_LOSS weight: 0.5 }
  dropoutnet {
    user_content { hidden_units: [5] activation: "tanh" } user_preference { hidden_units: [4] activation: "tanh" }
    item_content { hidden_units: [5] activation: "tanh" } item_preference { hidden_units: [4] activation: "tanh" }
    user_tower { hidden_units: [6, 3] use_bn: false activation: "tanh" }
    item_tower { hidden_units: [6, 3] use_bn: false activation: "tanh" }
    user_dropout_rate: 0.3 item_dropout_rate: 0.5 l2_regularization: 1e-4 } }"#;

/// A RankModel over PeriodicEmbedding, AutoDisEmbedding and (two replicas,
/// averaged digits) NaryDisEmbedding of raw values.
pub const NUMERIC_EMBEDDINGS: &str = r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "num" feature_names: ["d1", "d2"] }
  feature_groups { group_name: "ids" feature_names: ["c1", "c2"] }
  backbone {
    blocks { name: "periodic" inputs { feature_group_name: "num" }
             keras_layer { class_name: "PeriodicEmbedding" periodic_embedding { embedding_dim: 4 sigma: 0.5 output_tensor_list: true } } }
    blocks { name: "autodis" inputs { feature_group_name: "num" }
             keras_layer { class_name: "AutoDisEmbedding" auto_dis_embedding { embedding_dim: 4 num_bins: 3 temperature: 0.5 output_3d_tensor: true } } }
    blocks { name: "nary" inputs { feature_group_name: "num" }
             keras_layer { class_name: "NaryDisEmbedding" nary_dis_embedding { embedding_dim: 2 carries: [2, 5] multiplier: 100
                           intra_ary_pooling: "mean" num_replicas: 2 output_tensor_list: true } } }
    blocks { name: "id_list" inputs { feature_group_name: "ids" } input_layer { only_output_feature_list: true } }
    blocks { name: "fm" inputs { block_name: "id_list" } inputs { block_name: "periodic" input_slice: "[1]" }
             inputs { block_name: "nary" input_slice: "[3]" } keras_layer { class_name: "FM" } }
    blocks { name: "deep" inputs { block_name: "autodis" input_slice: "[0]" } inputs { block_name: "periodic" input_slice: "[0]" }
             inputs { block_name: "nary" input_slice: "[0]" } keras_layer { class_name: "MLP" mlp { hidden_units: [4] } } }
    concat_blocks: ["fm", "deep"]
  }
  model_params { } }"#;

/// DIN over a history whose positions hold two values each (c4's
/// `w3:1.20` entries split at `:`), their embeddings averaged per position.
pub const DIN_MULTI_VALUED: &str = r#"feature_configs { input_names: "c4" feature_name: "hist" feature_type: SequenceFeature
                  separator: "|" seq_multi_sep: ":" combiner: "mean" hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 3 }
model_config { model_class: "MultiTowerDIN"
  feature_groups { group_name: "user" feature_names: ["c1", "d1"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  seq_att_groups { group_name: "din" seq_att_map { key: "c2" hist_seq: "hist" } }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                towers { input: "item" dnn { hidden_units: [4] } }
                din_towers { input: "din" dnn { hidden_units: [5, 1] } }
                final_dnn { hidden_units: [4] } } }"#;

pub const MODELS: &[(&str, &str)] = &[
    ("CL4SRec", CL4SREC),
    ("Contrastive item towers", CONTRASTIVE),
    (
        "DSSM",
        r#"model_config { model_class: "DSSM"
  feature_groups { group_name: "user" feature_names: ["d1", "c1", "c3", "c1_x_c2"] }
  feature_groups { group_name: "item" feature_names: ["d2", "c2", "c4"] }
  dssm { user_tower { id: "c1" dnn { hidden_units: [8, 4] } }
         item_tower { id: "c2" dnn { hidden_units: [4] } }
         temperature: 0.5 } }"#,
    ),
    (
        "DSSM_SENet",
        r#"model_config { model_class: "DSSM_SENet"
  feature_groups { group_name: "user" feature_names: ["c1", "c3", "c4"] }
  feature_groups { group_name: "item" feature_names: ["d2", "c2"] }
  dssm_senet { user_tower { id: "c1" senet { reduction_ratio: 2 } dnn { hidden_units: [8, 4] } }
               item_tower { id: "c2" senet { reduction_ratio: 4 } dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "WideAndDeep",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3", "c4", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4", "c1_x_c2"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [8, 4] use_bn: true } } }"#,
    ),
    (
        "WideAndDeep+final_dnn",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "c1", "c3"] wide_deep: DEEP }
  wide_and_deep { wide_output_dim: 4 dnn { hidden_units: [8] } final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "DLRM",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1"] }
  feature_groups { group_name: "sparse" feature_names: ["d2", "c1", "c2", "c3", "c4", "c1_x_c2"] }
  dlrm { bot_dnn { hidden_units: [8, 4] } top_dnn { hidden_units: [8] } arch_with_dense_feature: true } }"#,
    ),
    (
        "WideAndDeep+elu,selu",
        r#"model_config { model_class: "WideAndDeep"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "c1", "c3"] wide_deep: DEEP }
  wide_and_deep { dnn { hidden_units: [8] activation: "tf.nn.elu" } final_dnn { hidden_units: [4] activation: "selu" } } }"#,
    ),
    (
        "DLRM+softplus",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [4] activation: "tf.nn.softplus" } top_dnn { hidden_units: [8] } } }"#,
    ),
    (
        "DLRM+cat",
        r#"model_config { model_class: "DLRM"
  feature_groups { group_name: "dense" feature_names: ["d1"] }
  feature_groups { group_name: "sparse" feature_names: ["c1", "c2", "c3"] }
  dlrm { bot_dnn { hidden_units: [4] } top_dnn { hidden_units: [8] } arch_interaction_op: "cat" } }"#,
    ),
    (
        "DeepFM",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "c3"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d1", "c1", "c2", "c3", "c4", "d2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8, 4] } } }"#,
    ),
    (
        "DeepFM+final_dnn",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3"] wide_deep: DEEP }
  deepfm { wide_output_dim: 2 dnn { hidden_units: [8] } final_dnn { hidden_units: [4] use_bn: true } } }"#,
    ),
    (
        "DeepFM+variational_dropout",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["d2", "c1", "c3", "c4", "d1"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8] } }
  variational_dropout { regularization_lambda: 0.2 embedding_wise_variational_dropout: true } }"#,
    ),
    (
        "DeepFM+sequence_combiners",
        r#"feature_configs { input_names: "c3" feature_name: "title" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 30 embedding_dim: 4
  sequence_combiner { text_cnn { filter_sizes: [1, 2] num_filters: [2, 2] pad_sequence_length: 3 } } }
feature_configs { input_names: "c3" feature_name: "att" feature_type: SequenceFeature separator: "|"
  hash_bucket_size: 20 embedding_dim: 4 max_seq_len: 2 sequence_combiner { attention {} } }
model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["att", "c1", "title", "c2"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [8] } } }"#,
    ),
    (
        "FM",
        r#"model_config { model_class: "FM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3"] wide_deep: DEEP }
  fm { } }"#,
    ),
    (
        "AutoInt",
        r#"model_config { model_class: "AutoInt"
  feature_groups { group_name: "all" feature_names: ["c1", "d2", "c3", "c4", "c1_x_c2"] wide_deep: DEEP }
  autoint { multi_head_num: 2 multi_head_size: 3 interacting_layer_num: 2 } }"#,
    ),
    (
        "DeepFM+2 classes",
        r#"model_config { model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["c1", "c2", "c3", "d2"] wide_deep: DEEP }
  deepfm { wide_output_dim: 2 dnn { hidden_units: [8, 4] } }
  num_class: 2 }"#,
    ),
    (
        "RankModel+ZILN",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4"] }
  backbone { blocks { name: "deep" inputs { feature_group_name: "all" } keras_layer { class_name: "MLP" mlp { hidden_units: [8, 4] } } } }
  model_params { l2_regularization: 1e-6 }
  num_class: 3
  losses { loss_type: ZILN_LOSS weight: 0.8 ziln_loss { mu_regularization: 0.02 max_sigma: 3.0 } } }"#,
    ),
    (
        "DAT",
        r#"model_config { model_class: "DAT"
  feature_groups { group_name: "user" feature_names: ["d1", "c1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["d2", "c2", "c4"] }
  feature_groups { group_name: "user_id_augment" feature_names: ["c1"] }
  feature_groups { group_name: "item_id_augment" feature_names: ["c2"] }
  dat { user_tower { id: "c1" dnn { hidden_units: [8, 4] } }
        item_tower { id: "c2" dnn { hidden_units: [4] } }
        temperature: 0.5 }
  loss_type: SOFTMAX_CROSS_ENTROPY }"#,
    ),
    (
        "RocketLaunching",
        r#"model_config { model_class: "RocketLaunching"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c3", "c4", "c1_x_c2"] }
  rocket_launching { share_dnn { hidden_units: [8] } booster_dnn { hidden_units: [8, 4] }
                     light_dnn { hidden_units: [4] } l2_regularization: 1e-5 } }"#,
    ),
    (
        "DCN",
        r#"model_config { model_class: "DCN"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4"] }
  dcn { deep_tower { input: "all" dnn { hidden_units: [8] } }
        cross_tower { input: "all" cross_num: 2 }
        final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "MultiTower",
        r#"model_config { model_class: "MultiTower"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c4"] }
  feature_groups { group_name: "item" feature_names: ["c2", "c3", "d2"] }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] use_bn: true } }
                towers { input: "item" dnn { hidden_units: [4] activation: "tanh" } }
                final_dnn { hidden_units: [4] } } }"#,
    ),
    (
        "PLE",
        r#"model_config { model_class: "PLE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c3", "c4", "c1_x_c2"] }
  ple {
    extraction_networks { network_name: "l1" expert_num_per_task: 1 share_num: 2
      task_expert_net { hidden_units: [8, 4] } share_expert_net { hidden_units: [4] } }
    extraction_networks { network_name: "l2" expert_num_per_task: 2 share_num: 1
      task_expert_net { hidden_units: [4] } share_expert_net { hidden_units: [4] } }
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "SimpleMultiTask",
        r#"model_config { model_class: "SimpleMultiTask"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c3", "c4"] }
  simple_multi_task {
    task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [8] } }
    task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "MMoE",
        r#"model_config { model_class: "MMoE"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4", "c1_x_c2"] }
  mmoe { expert_dnn { hidden_units: [8, 4] } num_expert: 3
         task_towers { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } }
         task_towers { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "ESMM",
        r#"model_config { model_class: "ESMM"
  feature_groups { group_name: "user" feature_names: ["d1", "c1", "c3"] }
  feature_groups { group_name: "item" feature_names: ["d2", "c2", "c4"] }
  esmm { groups { input: "user" dnn { hidden_units: [8] } } groups { input: "item" dnn { hidden_units: [6] } }
         cvr_tower { tower_name: "cvr" label_name: "label2" dnn { hidden_units: [4] } }
         ctr_tower { tower_name: "ctr" label_name: "label" dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "DBMTL",
        r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4"] }
  dbmtl { bottom_dnn { hidden_units: [8] } expert_dnn { hidden_units: [6] } num_expert: 2
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } relation_dnn { hidden_units: [3] } }
          task_towers { tower_name: "cvr" relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "DBMTL with order calibration",
        r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4"] }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } relation_dnn { hidden_units: [3] } }
          task_towers { tower_name: "cvr" losses { loss_type: CLASSIFICATION } losses { loss_type: ORDER_CALIBRATE_LOSS weight: 2.0 }
                        relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "DBMTL+JRC",
        r#"model_config { model_class: "DBMTL"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4"] }
  dbmtl { bottom_dnn { hidden_units: [8] }
          task_towers { tower_name: "ctr" dnn { hidden_units: [5] } relation_dnn { hidden_units: [3] } }
          task_towers { tower_name: "cvr" num_class: 2 losses { loss_type: JRC_LOSS jrc_loss { session_name: "c1" } }
                        relation_tower_names: ["ctr"] relation_dnn { hidden_units: [4] } } } }"#,
    ),
    (
        "RankModel",
        r#"model_config { model_class: "RankModel"
  feature_groups { group_name: "wide" feature_names: ["c1", "c2", "d1"] wide_deep: WIDE }
  feature_groups { group_name: "dense" feature_names: ["d1"] }
  feature_groups { group_name: "sparse" feature_names: ["c3", "c1", "c2", "d2", "c4"] }
  backbone {
    blocks { name: "wide" inputs { feature_group_name: "wide" } input_layer { wide_output_dim: 1 } }
    blocks { name: "sparse" inputs { feature_group_name: "sparse" } input_layer { output_2d_tensor_and_feature_list: true } }
    blocks { name: "bottom" inputs { feature_group_name: "dense" } keras_layer { class_name: "MLP" mlp { hidden_units: [8, 4] } } }
    blocks { name: "dot" inputs { block_name: "bottom" input_fn: "lambda x: [x]" }
             inputs { block_name: "sparse" input_slice: "[1]" } keras_layer { class_name: "DotInteraction" } }
    blocks { name: "fm" inputs { block_name: "sparse" input_slice: "[1]" } keras_layer { class_name: "FM" } }
    blocks { name: "cross" inputs { block_name: "sparse" input_slice: "[0]" input_fn: "lambda x: [x, x]" }
             recurrent { num_steps: 2 fixed_input_index: 0 keras_layer { class_name: "Cross" } } }
    blocks { name: "deep" inputs { block_name: "dot" } inputs { block_name: "cross" } inputs { block_name: "bottom" }
             keras_layer { class_name: "MLP" mlp { hidden_units: [6, 1] use_final_bn: false final_activation: "linear" } } }
    blocks { name: "logit" inputs { block_name: "wide" input_fn: "lambda x: tf.reduce_sum(x, axis=1, keepdims=True)" }
             inputs { block_name: "fm" } inputs { block_name: "deep" } merge_inputs_into_list: true
             keras_layer { class_name: "Add" } }
    concat_blocks: "logit"
  }
  model_params { l2_regularization: 1e-4 } }"#,
    ),
    (
        "MultiTaskModel",
        r#"model_config { model_class: "MultiTaskModel"
  feature_groups { group_name: "all" feature_names: ["d1", "d2", "c1", "c2", "c3", "c4", "c1_x_c2"] }
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
    l2_regularization: 1e-4 } }"#,
    ),
    (
        "MultiTowerDIN",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 2 }
model_config { model_class: "MultiTowerDIN"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c4"] }
  feature_groups { group_name: "item" feature_names: ["c2", "d2"] }
  seq_att_groups { group_name: "din" seq_att_map { key: "c2" hist_seq: "hist" } }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                towers { input: "item" dnn { hidden_units: [4] } }
                din_towers { input: "din" dnn { hidden_units: [5, 1] } }
                final_dnn { hidden_units: [4] } } }"#,
    ),
    ("MultiTowerDIN over multi-valued positions", DIN_MULTI_VALUED),
    ("RankModel with PPNet", PPNET),
    ("MultiTaskModel with AITM", AITM),
    ("MatchModel", MATCH_MODEL),
    ("RankModel with numeric embeddings", NUMERIC_EMBEDDINGS),
    ("RankModel with FiBiNet", FIBINET),
    ("MultiTaskModel with MMoE", MMOE_LAYER),
    ("RankModel with repeat and Gate", REPEAT_AND_GATE),
    ("RankModel with CIN", CIN),
    ("RankModel with a TextCNN over an unpooled sequence", TEXT_CNN),
    ("RankModel with a DIN layer and Dice", DIN_LAYER),
    ("RankModel with a BST layer", BST_LAYER),
    ("CMBF", CMBF),
    ("Uniter", UNITER),
    ("MIND", MIND),
    ("DropoutNet", DROPOUTNET),
    (
        "MultiTowerBST",
        r#"feature_configs { input_names: "c3" feature_name: "hist" feature_type: SequenceFeature separator: "|"
                  hash_bucket_size: 30 embedding_dim: 4 max_seq_len: 2 }
model_config { model_class: "MultiTowerBST"
  feature_groups { group_name: "user" feature_names: ["c1", "d1", "c4"] }
  seq_att_groups { group_name: "bst" seq_att_map { key: "c2" hist_seq: "hist" } }
  multi_tower { towers { input: "user" dnn { hidden_units: [4] } }
                bst_towers { input: "bst" seq_len: 4 multi_head_size: 2 }
                final_dnn { hidden_units: [4] } } }"#,
    ),
];

pub fn write_data(path: &Path, rows: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut s = String::new();
    for _ in 0..rows {
        let c1 = rng.below(40);
        let c2 = rng.below(10);
        let d1 = rng.normal();
        let label = (c1.is_multiple_of(3) as u8 as f64 * 0.6 + 0.2 + 0.1 * d1 > rng.uniform()) as u8;
        let tags = (0..rng.below(3))
            .map(|_| format!("t{}", rng.below(8)))
            .collect::<Vec<_>>()
            .join("|");
        let weighted = (0..=rng.below(3))
            .map(|_| format!("w{}:{:.2}", rng.below(6), rng.uniform() * 2.0))
            .collect::<Vec<_>>()
            .join("|");
        let label2 = (label == 1 && c2 < 5) as u8;
        s.push_str(&format!(
            "{label},{d1:.4},{:.4},u{c1},{c2},{tags},{weighted},{label2}\n",
            rng.uniform()
        ));
    }
    std::fs::write(path, s).unwrap();
}

/// Writes data and a config for `model` under `dir`; returns the config path.
pub fn setup(dir: &Path, model: &str, extra: &str) -> PathBuf {
    let data = dir.join("data.csv");
    write_data(&data, 300, 5);
    let block = MODELS.iter().find(|(m, _)| *m == model).unwrap().1;
    // A listwise match model evaluates recall_at_topk, as EasyRec's.
    let metrics = if block.contains("SOFTMAX_CROSS_ENTROPY") {
        "metrics_set { recall_at_topk { topk: 3 } }"
    } else {
        "metrics_set { auc {} }"
    };
    let text = COMMON
        .replace("metrics_set { auc {} }", metrics)
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL_DIR", dir.join("model").to_str().unwrap())
        + block
        + extra;
    let cfg = dir.join("pipeline.config");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// One of the package's binaries, run from the repository root.
pub fn bin(name: &str) -> Command {
    let exe = match name {
        "train_eval" => env!("CARGO_BIN_EXE_train_eval"),
        "export" => env!("CARGO_BIN_EXE_export"),
        "predict" => env!("CARGO_BIN_EXE_predict"),
        "serve" => env!("CARGO_BIN_EXE_serve"),
        other => panic!("no binary {other}"),
    };
    let mut c = Command::new(exe);
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// Runs `c`, which must succeed; returns its stderr.
pub fn run_ok(mut c: Command) -> String {
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{c:?}: {stderr}");
    stderr
}
