//! Trainer-ready view of a validated config: one plan per config section,
//! each built by its own `from_proto` with errors that name the field
//! (enums instead of strings and oneofs, defaults resolved, and a clear
//! "not supported" for every EasyRec option this trainer cannot honour),
//! and the checks that span sections. Each module takes only the sections
//! it reads.

use std::path::PathBuf;

use super::data_plan::DataPlan;
use super::eval_plan::EvalPlan;
use super::export_plan::ExportPlan;
use super::feature_plan::{FeatureKind, FeaturePlan};
use super::model::tasks::Task;
use super::model::{Arch, ModelKind, ModelPlan};
use super::train_plan::{OptimizerSpec, TrainPlan};
use super::{proto, validate, ConfigError};

/// Everything training, evaluation, export and prediction need, checked
/// for support.
#[derive(Debug, Clone)]
pub struct TrainingPlan {
    pub model_dir: PathBuf,
    /// A remote model_dir's URL, where `model_dir` is the job's local copy
    /// of it (`storage::mirror`): what outlives the job (incremental
    /// updates, the places an export records) is named by it.
    pub remote_model_dir: Option<PathBuf>,
    pub data: DataPlan,
    pub features: FeaturePlan,
    pub model: ModelPlan,
    pub train: TrainPlan,
    pub eval: EvalPlan,
    pub export: ExportPlan,
    /// What the config will allocate, checked against the machine before
    /// anything is.
    pub memory: super::sizes::Claims,
}

impl TrainingPlan {
    pub fn from_config(cfg: &proto::EasyRecConfig) -> Result<Self, ConfigError> {
        // EasyRec's SokStrategy ("key-value embedding and embedding
        // sharding"): every table is a key-value table, under
        // model_config.ev_params or its defaults, sharded as
        // EmbeddingParallel shards tables.
        let sok_cfg;
        let sok = cfg
            .train_config
            .as_ref()
            .is_some_and(|t| t.train_distribute() == proto::DistributionStrategy::SokStrategy);
        let cfg = if sok && cfg.model_config.ev_params.is_none() {
            let mut c = cfg.clone();
            c.model_config.ev_params = Some(proto::EvParams::default());
            sok_cfg = c;
            &sok_cfg
        } else {
            cfg
        };
        let data = DataPlan::from_proto(
            cfg.data_config.as_ref(),
            (cfg.train_path.as_ref(), cfg.eval_path.as_ref()),
        )?;
        let no_train_config = proto::TrainConfig::default();
        let train = TrainPlan::from_proto(cfg.train_config.as_ref().unwrap_or(&no_train_config))?;
        let eval = EvalPlan::from_proto(cfg.eval_config.as_ref())?;
        let features = FeaturePlan::from_proto(validate::features(cfg), &cfg.model_config)?;
        let model = ModelPlan::from_proto(&cfg.model_config, &features, &data, &eval.metrics)?;
        let mut export = ExportPlan::from_proto(cfg.export_config.as_ref())?;
        if model.tasks.len() > 1 {
            export.task_suffixes = model.tasks.iter().map(Task::suffix).collect();
        }
        let plan = TrainingPlan {
            memory: super::sizes::Claims::of(cfg, optimizer_slots(model.kind, &train.optimizers))?,
            export,
            model_dir: PathBuf::from(&cfg.model_dir),
            remote_model_dir: None,
            data,
            features,
            model,
            train,
            eval,
        };
        plan.multi_value_inputs()?;
        plan.check_sample_weight()?;
        if plan.data.negative_sampling.is_some() && !plan.model.tasks.iter().all(Task::in_batch) {
            return Err(ConfigError::invalid(
                "data_config.negative_sampler",
                "sampled negatives feed a match model's listwise loss (loss_type: SOFTMAX_CROSS_ENTROPY), which this model does not train",
            ));
        }
        Ok(plan)
    }

    /// The model_dir as it outlives the job: the remote one a local copy
    /// stands for, else `model_dir`.
    pub fn published_model_dir(&self) -> &std::path::Path {
        self.remote_model_dir.as_deref().unwrap_or(&self.model_dir)
    }

    /// `data_config.sample_weight` against what the model's losses can
    /// weigh per sample.
    fn check_sample_weight(&self) -> Result<(), ConfigError> {
        if self.data.sample_weight.is_none() {
            return Ok(());
        }
        if matches!(self.model.arch, Arch::Dssm { amm: Some(_), .. }) {
            // EasyRec multiplies DAT's [batch, dim] mimic losses by the
            // [batch] weights, which only broadcast as a scalar.
            return Err(ConfigError::unsupported(
                "data_config.sample_weight",
                "per-sample weights of DAT's adaptive-mimic losses",
            ));
        }
        match self.model.tasks.as_slice() {
            [t] if t.terms.is_empty() => Ok(()),
            [_] => Err(ConfigError::unsupported(
                "data_config.sample_weight",
                "per-sample weights of a model_config.losses list",
            )),
            _ => Err(ConfigError::unsupported(
                "data_config.sample_weight",
                "per-sample weights of a multi-task model's losses",
            )),
        }
    }

    /// The inputs a served request may give as a list of values per row
    /// (`export_config.multi_value_fields` or `auto_multi_value`), each
    /// with the separator its feature splits a value by, which joins the
    /// list back into the text that feature reads.
    pub fn multi_value_inputs(&self) -> Result<Vec<(String, String)>, ConfigError> {
        use super::export_plan::MultiValue;
        // The separator of a feature reading input field `name` as a list.
        let separator = |name: &str| {
            self.features.iter().find_map(|f| match &f.kind {
                FeatureKind::Tag { separator, .. } if f.inputs.iter().take(2).any(|i| i == name) => {
                    Some(separator.clone())
                }
                FeatureKind::Sequence { separator, .. } if f.inputs[0] == name => Some(separator.clone()),
                FeatureKind::Raw { dim, separator, .. } if *dim > 1 && f.inputs[0] == name => Some(separator.clone()),
                _ => None,
            })
        };
        match &self.export.multi_value {
            MultiValue::None => Ok(Vec::new()),
            MultiValue::Auto => {
                let mut out: Vec<(String, String)> = Vec::new();
                for f in &self.data.fields {
                    if let Some(sep) = separator(&f.name) {
                        out.push((f.name.clone(), sep));
                    }
                }
                Ok(out)
            }
            MultiValue::Fields(names) => names
                .iter()
                .map(|n| {
                    separator(n).map(|sep| (n.clone(), sep)).ok_or_else(|| {
                        ConfigError::invalid(
                            "export_config.multi_value_fields.input_name",
                            format!("`{n}` is no input of a tag, sequence or multi-dimensional raw feature, so it takes one value per row"),
                        )
                    })
                })
                .collect(),
        }
    }
}

/// Slot vectors the optimizers keep per table row and per dense weight.
fn optimizer_slots(kind: ModelKind, optimizers: &[OptimizerSpec]) -> super::sizes::Slots {
    let assign = crate::optim::Assignment::new(kind, optimizers.len());
    let slots = |i: usize| optimizers.get(i).map_or(0, |o| crate::optim::slot_inits(&o.kind).len());
    super::sizes::Slots {
        tables: slots(assign.wide_tables).max(slots(assign.deep_tables)),
        dense: slots(assign.dense),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipeline config from its text (no overrides, no validation).
    fn config(text: &str) -> proto::EasyRecConfig {
        let msg = super::super::text_format::parse_text(&super::super::pipeline_descriptor(), text).unwrap();
        msg.transcode_to().unwrap()
    }

    const PIPELINE: &str = r#"
train_input_path: "train.csv"
eval_input_path: "eval.csv"
model_dir: "m"
data_config {
  input_type: CSVInput batch_size: 64 num_epochs: 2 label_fields: ["clk", "buy"]
  input_fields { input_name: "clk" input_type: INT32 }
  input_fields { input_name: "buy" input_type: INT32 }
  input_fields { input_name: "user" input_type: STRING }
  input_fields { input_name: "price" input_type: DOUBLE }
}
feature_configs { input_names: "user" feature_type: IdFeature hash_bucket_size: 100 embedding_dim: 8 }
feature_configs { input_names: "price" feature_type: RawFeature }
train_config {
  num_steps: 30 save_checkpoints_steps: 10 keep_checkpoint_max: 3
  optimizer_config { adagrad_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.1 } } } }
  optimizer_config { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.001 } } } }
}
eval_config { num_examples: 500 metrics_set { auc {} } }
export_config { exporter_type: "best" exports_to_keep: 2 }
model_config {
  model_class: "MMoE"
  feature_groups { group_name: "all" feature_names: ["user", "price"] }
  mmoe {
    expert_dnn { hidden_units: [8] } num_expert: 2
    task_towers { tower_name: "ctr" label_name: "clk" dnn { hidden_units: [4] } }
    task_towers { tower_name: "cvr" label_name: "buy" dnn { hidden_units: [4] } metrics_set { max_f1 {} } }
  }
}
"#;

    /// A multi-task model's best exporter may name a metric every task
    /// reports under its own suffix: the tasks' mean is compared.
    #[test]
    fn a_best_metric_reported_per_task_compares_their_mean() {
        let plan = TrainingPlan::from_config(&config(&PIPELINE.replace("metrics_set { max_f1 {} }", ""))).unwrap();
        assert_eq!(plan.export.task_suffixes, ["_ctr", "_cvr"]);
        let m = |v: &[(&str, f64)]| v.iter().map(|(k, x)| (k.to_string(), *x)).collect::<Vec<_>>();
        let e = &plan.export;
        assert!((e.best_value(&m(&[("auc_ctr", 0.7), ("auc_cvr", 0.6)])).unwrap() - 0.65).abs() < 1e-12);
        assert_eq!(
            e.best_value(&m(&[("auc", 0.5), ("auc_ctr", 0.7), ("auc_cvr", 0.6)]))
                .unwrap(),
            0.5
        );
        let err = e.best_value(&m(&[("auc_ctr", 0.7)])).unwrap_err().to_string();
        assert!(
            err.contains("best_exporter_metric `auc` is not among the evaluated metrics"),
            "{err}"
        );
    }

    /// ORDER_CALIBRATE_LOSS pairs a tower with each relation tower, weighted
    /// by its own weight, between binary classification towers only.
    #[test]
    fn order_calibration_pairs_binary_towers() {
        let head = PIPELINE.split("model_config {").next().unwrap();
        let dbmtl = |ctr_loss: &str| {
            format!(
                r#"{head}model_config {{
  model_class: "DBMTL"
  feature_groups {{ group_name: "all" feature_names: ["user", "price"] }}
  dbmtl {{
    bottom_dnn {{ hidden_units: [8] }}
    task_towers {{ tower_name: "ctr" label_name: "clk" {ctr_loss} dnn {{ hidden_units: [4] }} }}
    task_towers {{ tower_name: "cvr" label_name: "buy" relation_tower_names: ["ctr"]
                  losses {{ loss_type: CLASSIFICATION }} losses {{ loss_type: ORDER_CALIBRATE_LOSS weight: 2.5 }} }}
  }}
}}
"#
            )
        };
        let plan = TrainingPlan::from_config(&config(&dbmtl(""))).unwrap();
        assert_eq!(plan.model.tasks[1].calibrate, [(0, 2.5)]);
        assert!(plan.model.tasks[0].calibrate.is_empty());
        let regression = "loss_type: L2_LOSS metrics_set { mean_squared_error {} }";
        let err = TrainingPlan::from_config(&config(&dbmtl(regression))).unwrap_err();
        assert!(err.to_string().contains("ORDER_CALIBRATE_LOSS between towers"), "{err}");
    }

    /// EasyRec's MultiTower ignores `din_towers`, `bst_towers` and
    /// `seq_att_groups` (its DIN and BST subclasses read them): a config
    /// that carries them plans as the one without.
    #[test]
    fn multi_tower_plans_without_the_towers_of_its_subclasses() {
        let base = PIPELINE.replace(r#"model_class: "MMoE""#, r#"model_class: "MultiTower""#);
        let head = base.split("  mmoe {").next().unwrap();
        let plain = format!(
            "{head}  multi_tower {{ towers {{ input: \"all\" dnn {{ hidden_units: [4] }} }} final_dnn {{ hidden_units: [2] }} }}\n}}\n"
        );
        let with_din = plain
            .replace(
                "  multi_tower {",
                "  seq_att_groups { group_name: \"din\" seq_att_map { key: \"user\" hist_seq: \"user\" } }\n  multi_tower {",
            )
            .replace(
                "final_dnn {",
                "din_towers { input: \"din\" dnn { hidden_units: [2, 1] } } bst_towers { input: \"din\" } final_dnn {",
            );
        assert!(with_din.contains("din_towers") && with_din.contains("seq_att_groups"));
        let plan = |text: &str| TrainingPlan::from_config(&config(text)).unwrap();
        let (a, b) = (plan(&plain), plan(&with_din));
        assert_eq!(a.model.arch, b.model.arch);
        assert_eq!(a.model.groups, b.model.groups);
    }

    /// A list-wise DSSM with `simi_func: COSINE` normalises its towers'
    /// outputs only when the config sets `temperature` (later EasyRec);
    /// without it, as EasyRec 0.7.1, it compares their raw outputs. A
    /// point-wise one normalises either way.
    #[test]
    fn dssm_normalises_for_the_cosine_as_the_config_s_easyrec_does() {
        use crate::config::model::Arch;
        let dssm = |extra: &str, loss: &str| {
            let model = format!(
                r#"model_config {{
  model_class: "DSSM"
  feature_groups {{ group_name: "user" feature_names: ["user"] }}
  feature_groups {{ group_name: "item" feature_names: ["price"] }}
  dssm {{ user_tower {{ id: "user" dnn {{ hidden_units: [8, 4] }} }}
          item_tower {{ id: "price" dnn {{ hidden_units: [4] }} }}
          simi_func: COSINE {extra} }}
  loss_type: {loss}
}}"#
            );
            let metric = if loss == "CLASSIFICATION" {
                "auc {}"
            } else {
                "recall_at_topk { topk: 5 }"
            };
            let text = PIPELINE
                .replace("label_fields: [\"clk\", \"buy\"]", "label_fields: [\"clk\"]")
                .replace("metrics_set { auc {} }", &format!("metrics_set {{ {metric} }}"));
            let at = text.find("model_config {").unwrap();
            let plan = TrainingPlan::from_config(&config(&format!("{}{model}", &text[..at]))).unwrap();
            match plan.model.arch {
                Arch::Dssm { sim, .. } => (sim.cosine, sim.temperature),
                other => panic!("not a DSSM: {other:?}"),
            }
        };
        assert_eq!(dssm("", "SOFTMAX_CROSS_ENTROPY"), (false, 1.0));
        assert_eq!(dssm("temperature: 0.5", "SOFTMAX_CROSS_ENTROPY"), (true, 0.5));
        assert_eq!(dssm("", "CLASSIFICATION"), (true, 1.0));
    }

    fn path_of(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid { path, .. } | ConfigError::Unsupported { path, .. } => path,
            other => panic!("no field path: {other}"),
        }
    }

    #[test]
    fn each_section_is_planned_from_its_own_message() {
        let cfg = config(PIPELINE);
        let plan = TrainingPlan::from_config(&cfg).unwrap();

        let data = DataPlan::from_proto(
            cfg.data_config.as_ref(),
            (cfg.train_path.as_ref(), cfg.eval_path.as_ref()),
        )
        .unwrap();
        assert_eq!((data.batch_size, data.num_epochs), (64, 2));
        assert_eq!(data.train_paths, ["train.csv"]);
        assert_eq!(data.label_fields, ["clk", "buy"]);
        assert_eq!(data.fields.len(), 4);
        assert_eq!(data.fields, plan.data.fields);

        let train = TrainPlan::from_proto(cfg.train_config.as_ref().unwrap()).unwrap();
        assert_eq!(train.num_steps, Some(30));
        assert_eq!(train.keep_checkpoint_max, 3);
        assert_eq!(train.optimizers, plan.train.optimizers);
        assert_eq!(train.optimizers.len(), 2);

        let eval = EvalPlan::from_proto(cfg.eval_config.as_ref()).unwrap();
        assert_eq!(eval, plan.eval);
        assert_eq!(eval.num_examples, 500);

        let features = FeaturePlan::from_proto(validate::features(&cfg), &cfg.model_config).unwrap();
        assert_eq!(features.specs, plan.features.specs);
        assert_eq!(features.paths, ["feature_configs[0]", "feature_configs[1]"]);

        let model = ModelPlan::from_proto(&cfg.model_config, &features, &data, &eval.metrics).unwrap();
        assert_eq!(model.kind, ModelKind::Mmoe);
        assert_eq!(model.tasks, plan.model.tasks);
        // Each task on its own label; a tower without metrics takes eval_config's.
        let labels: Vec<usize> = model.tasks.iter().map(|t| t.label).collect();
        assert_eq!(labels, [0, 1]);
        assert_eq!(model.tasks[0].metrics, eval.metrics);
        assert_ne!(model.tasks[1].metrics, eval.metrics);

        let export = ExportPlan::from_proto(cfg.export_config.as_ref()).unwrap();
        assert_eq!(export.exports_to_keep, 2);
        assert_eq!(export.exporter, plan.export.exporter);
    }

    #[test]
    fn each_section_names_the_field_it_refuses() {
        let cfg = config(PIPELINE);
        let edited = |from: &str, to: &str| {
            assert!(PIPELINE.contains(from), "{from}");
            config(&PIPELINE.replace(from, to))
        };

        let c = edited("input_type: CSVInput", "input_type: KafkaInput");
        let e = DataPlan::from_proto(c.data_config.as_ref(), (c.train_path.as_ref(), c.eval_path.as_ref()));
        assert_eq!(path_of(e.unwrap_err()), "data_config.input_type");
        let e = DataPlan::from_proto(None, (cfg.train_path.as_ref(), None));
        assert_eq!(path_of(e.unwrap_err()), "data_config");

        let c = edited(
            "keep_checkpoint_max: 3",
            "keep_checkpoint_max: 3 freeze_gradient: \"(\"",
        );
        let e = TrainPlan::from_proto(c.train_config.as_ref().unwrap());
        assert_eq!(path_of(e.unwrap_err()), "train_config.freeze_gradient[0]");

        let c = edited(
            "metrics_set { auc {} }",
            "metrics_set { auc {} } metrics_set { recall_at_topk { topk: 0 } }",
        );
        let e = EvalPlan::from_proto(c.eval_config.as_ref());
        assert_eq!(
            path_of(e.unwrap_err()),
            "eval_config.metrics_set[1].recall_at_topk.topk"
        );

        let c = edited("hash_bucket_size: 100 ", "");
        let e = FeaturePlan::from_proto(validate::features(&c), &c.model_config);
        assert_eq!(path_of(e.unwrap_err()), "feature_configs[0]");

        let c = edited("model_class: \"MMoE\"", "model_class: \"NoSuchModel\"");
        let features = FeaturePlan::from_proto(validate::features(&c), &c.model_config).unwrap();
        let data = DataPlan::from_proto(c.data_config.as_ref(), (c.train_path.as_ref(), None)).unwrap();
        let e = ModelPlan::from_proto(&c.model_config, &features, &data, &[]);
        assert_eq!(path_of(e.unwrap_err()), "model_config.model_class");

        let c = edited("exports_to_keep: 2", "exports_to_keep: 0");
        let e = ExportPlan::from_proto(c.export_config.as_ref());
        assert_eq!(path_of(e.unwrap_err()), "export_config.exports_to_keep");
    }
}
