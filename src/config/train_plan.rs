//! `train_config`, typed: steps, distribution, checkpoint cadence,
//! optimizers with their learning-rate schedules, clipping, freezing and
//! fine-tuning.

use std::path::PathBuf;

use super::{proto, validate, ConfigError};

/// The train section of a pipeline config.
#[derive(Debug, Clone)]
pub struct TrainPlan {
    pub num_steps: Option<u32>,
    pub strategy: Strategy,
    /// With `Strategy::Single` (NoStrategy, PSStrategy: EasyRec's
    /// parameter-server training), the option that makes the workers
    /// asynchronous, if one does: `sync_replicas: false`, or PSStrategy
    /// (EasyRec turns sync_replicas off under any strategy but NoStrategy).
    /// Several ranks train synchronously without one (each global step one
    /// batch from every worker, their gradients averaged) and with one
    /// asynchronously on parameter-server ranks (`train::ps`); one process
    /// trains alike either way.
    pub asynchronous: Option<&'static str>,
    pub checkpoints: CheckpointCadence,
    pub keep_checkpoint_max: u32,
    /// `enable_oss_stop_signal`: training ends (as at num_steps) once the
    /// file `STOP_SIGNAL` appears in model_dir.
    pub stop_signal: bool,
    pub log_step_count_steps: u32,
    pub save_summary_steps: u32,
    pub gradient_clip_norm: Option<f32>,
    pub optimizers: Vec<OptimizerSpec>,
    /// `train_config.freeze_gradient`: regular expressions; a variable whose
    /// TensorFlow name (`deep/dnn_0/kernel:0`) one matches is not trained.
    pub freeze_gradient: Vec<String>,
    pub fine_tune: Option<FineTune>,
    /// `incr_save_config`: incremental updates written while training.
    pub incr_save: Option<IncrSave>,
    /// `dead_line`: training ends (as at num_steps, with a checkpoint) once
    /// the clock passes this Unix time.
    pub dead_line: Option<i64>,
    /// Seeds initial weights, dropout, shuffling and sampled negatives
    /// (`train_eval --seed`, or the `RUSTREC_SEED` environment variable;
    /// EasyRec's config has no field for it). Recorded in checkpoints.
    pub seed: u64,
}

/// The seed of a run that names none.
pub const DEFAULT_SEED: u64 = 20_260_101;

/// EasyRec's `parse_time` (`dead_line`, Kafka's `offset_time`):
/// `%Y%m%d %H:%M:%S` in local time (17 characters) or Unix seconds (10
/// digits). `field` names the setting in errors.
pub(crate) fn easyrec_time(field: &str, text: &str) -> Result<i64, ConfigError> {
    use chrono::TimeZone;
    let bad = || {
        ConfigError::invalid(
            field,
            format!("`{text}` is neither `YYYYmmdd HH:MM:SS` (local time) nor 10 digits of Unix time"),
        )
    };
    match text.len() {
        17 => {
            let t = chrono::NaiveDateTime::parse_from_str(text, "%Y%m%d %H:%M:%S").map_err(|_| bad())?;
            chrono::Local
                .from_local_datetime(&t)
                .earliest()
                .map(|t| t.timestamp())
                .ok_or_else(bad)
        }
        10 if text.bytes().all(|b| b.is_ascii_digit()) => text.parse().map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// `incr_save_config` with an `fs` target: the rows trained since the last
/// update and the dense parameters, written into a folder as EasyRec
/// writes them (`train::incr`).
#[derive(Debug, Clone, PartialEq)]
pub struct IncrSave {
    pub sparse: UpdateCadence,
    pub dense: UpdateCadence,
    /// The folder (`fs`, or `debug_save_update` beside `kafka`), relative
    /// to model_dir unless `fs.relative: false`.
    pub dir: Option<IncrDir>,
    /// The topic (`kafka`).
    pub kafka: Option<IncrKafka>,
}

/// `incr_save_config.kafka`: updates sent to a topic, one partition, in
/// order; a consumer (`serve`) starts reading at `consumer.offset`.
#[derive(Debug, Clone, PartialEq)]
pub struct IncrKafka {
    pub servers: Vec<String>,
    pub topic: String,
    pub consumer_offset: i64,
    /// The consumer's properties (`consumer.config_global` /
    /// `config_topic`, `name=value` separated by commas).
    pub consumer_props: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum IncrDir {
    InModelDir(String),
    Absolute(PathBuf),
}

impl IncrDir {
    pub fn resolve(&self, model_dir: &std::path::Path) -> PathBuf {
        match self {
            IncrDir::InModelDir(d) => crate::storage::join(model_dir, d),
            IncrDir::Absolute(p) => p.clone(),
        }
    }
}

/// Every so many steps or seconds (TensorFlow's SecondOrStepTimer, as
/// EasyRec times its updates); neither set: never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateCadence {
    pub steps: u32,
    pub secs: u32,
}

impl UpdateCadence {
    /// Whether an update is due at `step`, the last written at step `last`
    /// and time `at`.
    pub fn due(self, step: u64, (last, at): (u64, std::time::Instant)) -> bool {
        (self.steps > 0 && step >= last + self.steps as u64)
            || (self.secs > 0 && at.elapsed().as_secs() >= self.secs as u64)
    }

    pub fn never(self) -> bool {
        self.steps == 0 && self.secs == 0
    }
}

impl IncrSave {
    fn from_proto(c: &proto::IncrementSaveConfig) -> Result<Self, ConfigError> {
        use proto::increment_save_config::IncrUpdate;
        let at = "train_config.incr_save_config";
        let mut kafka = None;
        let dir = match &c.incr_update {
            Some(IncrUpdate::Fs(fs)) => {
                if fs.mount_path.as_deref().is_some_and(|m| !m.is_empty()) {
                    log::warn!("{at}.fs.mount_path: a PAI mount, which a local folder does not need; ignored");
                }
                let d = fs.incr_save_dir().to_string();
                if d.is_empty() {
                    return Err(ConfigError::invalid(format!("{at}.fs.incr_save_dir"), "is empty"));
                }
                if c.debug_save_update() {
                    log::warn!("{at}.debug_save_update: the updates are written to the fs folder already; ignored");
                }
                Some(if fs.relative() {
                    IncrDir::InModelDir(d)
                } else {
                    IncrDir::Absolute(PathBuf::from(d))
                })
            }
            Some(IncrUpdate::Kafka(k)) => {
                let servers = super::kafka_plan::brokers(&format!("{at}.kafka.server"), &k.server)?;
                if k.topic.is_empty() {
                    return Err(ConfigError::invalid(format!("{at}.kafka.topic"), "is empty"));
                }
                let consumer_props: Vec<String> = [&k.consumer.config_global, &k.consumer.config_topic]
                    .into_iter()
                    .flatten()
                    .flat_map(|s| s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from))
                    .collect();
                // Checked here, honoured by the consumer.
                super::kafka_plan::ClientProps::default().read(&format!("{at}.kafka.consumer"), &consumer_props)?;
                kafka = Some(IncrKafka {
                    servers,
                    topic: k.topic.clone(),
                    consumer_offset: k.consumer.offset().max(0),
                    consumer_props,
                });
                // EasyRec: "if open, will save increment updates to model_dir/incr_save/".
                c.debug_save_update().then(|| IncrDir::InModelDir("incr_save".into()))
            }
            Some(IncrUpdate::Datahub(_)) => {
                return Err(ConfigError::unsupported(
                    format!("{at}.datahub"),
                    "incremental updates sent to DataHub",
                ))
            }
            None => {
                return Err(ConfigError::invalid(
                    at,
                    "names no target for the updates (fs, kafka or datahub), which EasyRec refuses too",
                ))
            }
        };
        let incr = IncrSave {
            sparse: UpdateCadence {
                steps: c.sparse_save_steps().max(0) as u32,
                secs: c.sparse_save_secs().max(0) as u32,
            },
            dense: UpdateCadence {
                steps: c.dense_save_steps().max(0) as u32,
                secs: c.dense_save_secs().max(0) as u32,
            },
            dir,
            kafka,
        };
        if incr.sparse.never() && incr.dense.never() {
            log::warn!("{at}: neither sparse nor dense updates are timed (all *_save_steps and *_save_secs are 0), so none is written, as in EasyRec");
        }
        Ok(incr)
    }
}

impl TrainPlan {
    pub fn from_proto(train: &proto::TrainConfig) -> Result<Self, ConfigError> {
        refuse_unhonoured(train)?;
        let (strategy, asynchronous) = strategy(train)?;
        let checkpoints = match train.save_checkpoints_secs {
            Some(s) => CheckpointCadence::Secs(s),
            None => CheckpointCadence::Steps(train.save_checkpoints_steps()),
        };
        if train.optimizer_config.is_empty() {
            return Err(ConfigError::invalid(
                "train_config.optimizer_config",
                "training needs at least one optimizer",
            ));
        }
        let optimizers = train
            .optimizer_config
            .iter()
            .enumerate()
            .map(|(i, o)| optimizer(o, &format!("train_config.optimizer_config[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let fine_tune = Some(train.fine_tune_checkpoint())
            .filter(|c| !c.is_empty())
            .map(|c| FineTune {
                checkpoint: PathBuf::from(c),
                var_map: Some(train.fine_tune_ckpt_var_map())
                    .filter(|m| !m.is_empty())
                    .map(PathBuf::from),
            });
        Ok(TrainPlan {
            num_steps: train.num_steps.filter(|n| *n > 0),
            strategy,
            asynchronous,
            checkpoints,
            keep_checkpoint_max: train.keep_checkpoint_max(),
            stop_signal: train.enable_oss_stop_signal(),
            log_step_count_steps: train.log_step_count_steps().max(1),
            save_summary_steps: train.save_summary_steps(),
            gradient_clip_norm: Some(train.gradient_clipping_by_norm()).filter(|c| *c > 0.0),
            optimizers,
            freeze_gradient: freeze_patterns(&train.freeze_gradient)?,
            fine_tune,
            incr_save: train.incr_save_config.as_ref().map(IncrSave::from_proto).transpose()?,
            dead_line: train
                .dead_line
                .as_deref()
                .filter(|d| !d.is_empty())
                .map(|t| easyrec_time("train_config.dead_line", t))
                .transpose()?,
            seed: DEFAULT_SEED,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// NoStrategy or PSStrategy: EasyRec's parameter-server training, one
    /// process alone or several ranks: synchronously as embedding-parallel,
    /// asynchronously on server and worker ranks (`TrainPlan::asynchronous`).
    Single,
    /// Tables sharded across ranks, dense part replicated (EmbeddingParallel, Sok).
    EmbeddingParallel,
    /// Every parameter replicated, gradients all-reduced.
    DataParallel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointCadence {
    Steps(u32),
    Secs(u32),
}

impl CheckpointCadence {
    /// Whether a checkpoint is due at global step `step`, the last one
    /// saved at `saved`.
    pub fn due(self, step: u64, saved: std::time::Instant) -> bool {
        match self {
            CheckpointCadence::Steps(n) => n > 0 && step.is_multiple_of(n as u64),
            CheckpointCadence::Secs(s) => saved.elapsed().as_secs() >= s as u64,
        }
    }
}

/// Learning rate as a function of the global step, EasyRec's formulas.
#[derive(Debug, Clone, PartialEq)]
pub enum LrSchedule {
    Constant(f32),
    ExponentialDecay {
        initial: f32,
        decay_steps: u32,
        factor: f32,
        staircase: bool,
        burnin_lr: f32,
        burnin_steps: u32,
        min_lr: f32,
    },
    ManualStep {
        initial: f32,
        schedule: Vec<(u32, f32)>,
        warmup: bool,
    },
    CosineDecay {
        base: f32,
        total_steps: u32,
        warmup_lr: f32,
        warmup_steps: u32,
        hold_steps: u32,
    },
    PolyDecay {
        base: f32,
        total_steps: i64,
        power: f32,
        end_lr: f32,
    },
    Transformer {
        base: f32,
        hidden_size: i32,
        warmup_steps: i32,
        step_scaling: f32,
    },
}

impl LrSchedule {
    pub fn at(&self, step: u64) -> f32 {
        let s = step as f64;
        let v = match *self {
            LrSchedule::Constant(lr) => lr as f64,
            LrSchedule::ExponentialDecay {
                initial,
                decay_steps,
                factor,
                staircase,
                burnin_lr,
                burnin_steps,
                min_lr,
            } => {
                let burnin = if burnin_lr == 0.0 { initial } else { burnin_lr } as f64;
                let lr = if step < burnin_steps as u64 {
                    burnin
                } else {
                    let mut p = (s - burnin_steps as f64) / decay_steps.max(1) as f64;
                    if staircase {
                        p = p.floor();
                    }
                    initial as f64 * (factor as f64).powf(p)
                };
                lr.max(min_lr as f64)
            }
            LrSchedule::ManualStep {
                initial,
                ref schedule,
                warmup,
            } => {
                let mut rates = vec![initial as f64];
                rates.extend(schedule.iter().map(|(_, r)| *r as f64));
                let first = schedule.first().map_or(0, |(b, _)| *b) as u64;
                if warmup && step < first && rates.len() > 1 {
                    rates[0] + (rates[1] - rates[0]) * s / first as f64
                } else {
                    rates[schedule.iter().filter(|(b, _)| step >= *b as u64).count()]
                }
            }
            LrSchedule::CosineDecay {
                base,
                total_steps,
                warmup_lr,
                warmup_steps,
                hold_steps,
            } => {
                let (base, total, warm, hold) =
                    (base as f64, total_steps as f64, warmup_steps as f64, hold_steps as f64);
                if s > total {
                    0.0
                } else if warmup_steps > 0 && s < warm {
                    (base - warmup_lr as f64) / warm * s + warmup_lr as f64
                } else if hold_steps > 0 && s <= warm + hold {
                    base
                } else {
                    0.5 * base * (1.0 + (std::f64::consts::PI * (s - warm - hold) / (total - warm - hold)).cos())
                }
            }
            LrSchedule::PolyDecay {
                base,
                total_steps,
                power,
                end_lr,
            } => {
                let t = total_steps.max(1) as f64;
                let p = s.min(t) / t;
                (base - end_lr) as f64 * (1.0 - p).powf(power as f64) + end_lr as f64
            }
            LrSchedule::Transformer {
                base,
                hidden_size,
                warmup_steps,
                step_scaling,
            } => {
                let n = s * step_scaling as f64 + 1.0;
                let decay = (hidden_size as f64).powf(-0.5) * (n * (warmup_steps as f64).powf(-1.5)).min(n.powf(-0.5));
                decay * base as f64
            }
        };
        v as f32
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerKind {
    /// Momentum SGD (momentum 0 is plain SGD).
    Momentum {
        momentum: f32,
    },
    /// Momentum with decoupled weight decay (TensorFlow's MomentumW): each
    /// updated value first shrinks by `weight_decay` times itself.
    MomentumW {
        momentum: f32,
        weight_decay: f32,
    },
    Adam {
        beta1: f32,
        beta2: f32,
    },
    /// Adam whose untouched embedding rows keep their moments.
    LazyAdam {
        beta1: f32,
        beta2: f32,
    },
    /// PAI-TensorFlow's AdamAsyncOptimizer: Adam whose beta powers are kept
    /// per variable (advanced by each of its updates, so `beta^t` in
    /// synchronous training) and whose sparse updates touch only the
    /// gathered rows, which is `LazyAdam`'s update; only its checkpoint
    /// slot names differ.
    AdamAsync {
        beta1: f32,
        beta2: f32,
    },
    AdamW {
        beta1: f32,
        beta2: f32,
        weight_decay: f32,
    },
    Adagrad {
        initial_accumulator: f32,
    },
    Ftrl {
        lr_power: f32,
        initial_accumulator: f32,
        l1: f32,
        l2: f32,
        l2_shrinkage: f32,
    },
    RmsProp {
        momentum: f32,
        decay: f32,
        epsilon: f32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerSpec {
    pub kind: OptimizerKind,
    pub lr: LrSchedule,
    pub embedding_lr_multiplier: Option<f32>,
}

/// The file in model_dir whose appearance ends training when
/// `enable_oss_stop_signal` is set (EasyRec's name).
pub const STOP_SIGNAL: &str = "OSS_STOP_SIGNAL";

/// `train_config.freeze_gradient`, each a valid regular expression.
fn freeze_patterns(patterns: &[String]) -> Result<Vec<String>, ConfigError> {
    for (i, p) in patterns.iter().enumerate() {
        if let Err(e) = regex::Regex::new(p) {
            return Err(ConfigError::invalid(
                format!("train_config.freeze_gradient[{i}]"),
                format!("`{p}` is not a regular expression: {e}"),
            ));
        }
    }
    Ok(patterns.to_vec())
}

/// `fine_tune_checkpoint` with its `fine_tune_ckpt_var_map` file.
#[derive(Debug, Clone, PartialEq)]
pub struct FineTune {
    pub checkpoint: PathBuf,
    pub var_map: Option<PathBuf>,
}

/// train_config options that change what EasyRec does and that this
/// trainer cannot do, refused by name when set. (TensorFlow's runtime
/// hints, such as thread counts, `protocol` or `write_graph`, change no
/// result and are accepted; the README lists them.)
fn refuse_unhonoured(train: &proto::TrainConfig) -> Result<(), ConfigError> {
    let set: [(&str, &str, bool); 3] = [
        ("is_profiling", "profiling", train.is_profiling()),
        (
            "force_restore_shape_compatible",
            "restoring tensors of another shape",
            train.force_restore_shape_compatible(),
        ),
        (
            "summary_model_vars",
            "summaries of every variable",
            train.summary_model_vars(),
        ),
    ];
    if let Some((field, what, _)) = set.iter().find(|(_, _, on)| *on) {
        return Err(ConfigError::unsupported(format!("train_config.{field}"), *what));
    }
    Ok(())
}

/// How `train_distribute` (with `sync_replicas` and `num_gpus_per_worker`)
/// spreads training over the ranks: the strategy, and the option that makes
/// parameter-server workers asynchronous (`TrainPlan::asynchronous`).
fn strategy(train: &proto::TrainConfig) -> Result<(Strategy, Option<&'static str>), ConfigError> {
    use proto::DistributionStrategy::*;
    let s = train.train_distribute();
    // EasyRec reads num_gpus_per_worker only for CollectiveAllReduce,
    // whose workers then run that many replicas each; here a rank is one
    // replica.
    if s == CollectiveAllReduceStrategy && train.num_gpus_per_worker() > 1 {
        return Err(ConfigError::Unsupported {
            path: "train_config.num_gpus_per_worker".into(),
            what: format!(
                "{} replicas per worker under CollectiveAllReduceStrategy",
                train.num_gpus_per_worker()
            ),
            hint: "; start one rank per replica instead".into(),
        });
    }
    let asynchronous = match s {
        // EasyRec turns sync_replicas off under any strategy but NoStrategy.
        PsStrategy => Some("train_config.train_distribute"),
        _ if !train.sync_replicas() => Some("train_config.sync_replicas"),
        _ => None,
    };
    let strategy = match s {
        NoStrategy | PsStrategy => Strategy::Single,
        EmbeddingParallelStrategy | SokStrategy => Strategy::EmbeddingParallel,
        MirroredStrategy | MultiWorkerMirroredStrategy | CollectiveAllReduceStrategy | HorovodStrategy => {
            Strategy::DataParallel
        }
        ExascaleStrategy => {
            return Err(ConfigError::Unsupported {
                path: "train_config.train_distribute".into(),
                what: format!("{} (PAI's collective training)", s.as_str_name()),
                hint: "; use EmbeddingParallelStrategy or MultiWorkerMirroredStrategy".into(),
            })
        }
    };
    Ok((strategy, asynchronous))
}

fn optimizer(o: &proto::Optimizer, path: &str) -> Result<OptimizerSpec, ConfigError> {
    use proto::optimizer::Optimizer as O;
    if o.use_moving_average() {
        return Err(ConfigError::unsupported(
            format!("{path}.use_moving_average"),
            "moving averages of weights",
        ));
    }
    let kind_msg = o.optimizer.as_ref().expect("checked by validate::structure");
    let (name, lr) = validate::optimizer_lr(kind_msg);
    let kind = match kind_msg {
        O::MomentumOptimizer(m) => OptimizerKind::Momentum {
            momentum: m.momentum_optimizer_value(),
        },
        O::AdamOptimizer(a) => OptimizerKind::Adam {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::LazyAdamOptimizer(a) => OptimizerKind::LazyAdam {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::AdamwOptimizer(a) => OptimizerKind::AdamW {
            beta1: a.beta1(),
            beta2: a.beta2(),
            weight_decay: a.weight_decay(),
        },
        O::AdagradOptimizer(a) => OptimizerKind::Adagrad {
            initial_accumulator: a.initial_accumulator_value(),
        },
        O::FtrlOptimizer(f) => OptimizerKind::Ftrl {
            lr_power: f.learning_rate_power(),
            initial_accumulator: f.initial_accumulator_value(),
            l1: f.l1_reg(),
            l2: f.l2_reg(),
            l2_shrinkage: f.l2_shrinkage_reg(),
        },
        O::RmsPropOptimizer(r) => OptimizerKind::RmsProp {
            momentum: r.momentum_optimizer_value(),
            decay: r.decay(),
            epsilon: r.epsilon(),
        },
        O::MomentumwOptimizer(m) => OptimizerKind::MomentumW {
            momentum: m.momentum_optimizer_value(),
            weight_decay: m.weight_decay(),
        },
        O::AdamAsyncOptimizer(a) => OptimizerKind::AdamAsync {
            beta1: a.beta1(),
            beta2: a.beta2(),
        },
        O::AdamAsyncwOptimizer(_) => {
            return Err(ConfigError::unsupported(
                format!("{path}.{name}"),
                format!("optimizer {name}"),
            ))
        }
    };
    let lr_path = format!("{path}.{name}.learning_rate");
    let lr = schedule(
        lr.and_then(|l| l.learning_rate.as_ref())
            .expect("checked by validate::structure"),
        &lr_path,
    )?;
    Ok(OptimizerSpec {
        kind,
        lr,
        embedding_lr_multiplier: o.embedding_learning_rate_multiplier,
    })
}

/// Every number of a learning-rate schedule must be finite, and every rate
/// non-negative (a negative rate climbs the loss; `nan` or `1e999` makes the
/// first step diverge).
fn check_rate_numbers(lr: &proto::LearningRate, path: &str) -> Result<(), ConfigError> {
    use prost_reflect::Value;
    let msg = super::reflect::dynamic(lr, "protos.LearningRate")?;
    super::reflect::visit(&msg, path, &mut |m, at| {
        for (fd, v) in m.fields() {
            let (x, shown) = match v {
                Value::F32(x) => (*x as f64, x.to_string()),
                Value::F64(x) => (*x, x.to_string()),
                _ => continue,
            };
            let name = fd.name();
            let field = super::reflect::join(at, name);
            if !x.is_finite() {
                return Err(ConfigError::invalid(field, format!("{shown} is not a finite number")));
            }
            if (name.contains("learning_rate") || name.ends_with("_lr")) && x < 0.0 {
                return Err(ConfigError::invalid(
                    field,
                    format!("a learning rate cannot be negative ({shown})"),
                ));
            }
        }
        Ok(())
    })
}

fn schedule(lr: &proto::learning_rate::LearningRate, path: &str) -> Result<LrSchedule, ConfigError> {
    use proto::learning_rate::LearningRate as L;
    check_rate_numbers(
        &proto::LearningRate {
            learning_rate: Some(lr.clone()),
        },
        path,
    )?;
    Ok(match lr {
        L::ConstantLearningRate(c) => LrSchedule::Constant(c.learning_rate()),
        L::ExponentialDecayLearningRate(e) => LrSchedule::ExponentialDecay {
            initial: e.initial_learning_rate(),
            decay_steps: e.decay_steps(),
            factor: e.decay_factor(),
            staircase: e.staircase(),
            burnin_lr: e.burnin_learning_rate(),
            burnin_steps: e.burnin_steps(),
            min_lr: e.min_learning_rate(),
        },
        L::ManualStepLearningRate(m) => {
            let schedule: Vec<(u32, f32)> = m.schedule.iter().map(|s| (s.step(), s.learning_rate())).collect();
            if schedule.windows(2).any(|w| w[1].0 <= w[0].0) || schedule.first().is_some_and(|s| s.0 == 0) {
                return Err(ConfigError::invalid(
                    format!("{path}.manual_step_learning_rate.schedule"),
                    "steps must be positive and strictly increasing",
                ));
            }
            LrSchedule::ManualStep {
                initial: m.initial_learning_rate(),
                schedule,
                warmup: m.warmup(),
            }
        }
        L::CosineDecayLearningRate(c) => {
            if c.total_steps() < c.warmup_steps() + c.hold_base_rate_steps() {
                return Err(ConfigError::invalid(
                    format!("{path}.cosine_decay_learning_rate.total_steps"),
                    "must be at least warmup_steps + hold_base_rate_steps",
                ));
            }
            LrSchedule::CosineDecay {
                base: c.learning_rate_base(),
                total_steps: c.total_steps(),
                warmup_lr: c.warmup_learning_rate(),
                warmup_steps: c.warmup_steps(),
                hold_steps: c.hold_base_rate_steps(),
            }
        }
        L::PolyDecayLearningRate(p) => LrSchedule::PolyDecay {
            base: p.learning_rate_base,
            total_steps: p.total_steps,
            power: p.power,
            end_lr: p.end_learning_rate(),
        },
        L::TransformerLearningRate(t) => LrSchedule::Transformer {
            base: t.learning_rate_base,
            hidden_size: t.hidden_size,
            warmup_steps: t.warmup_steps,
            step_scaling: t.step_scaling_rate(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_decay_matches_tf() {
        let s = LrSchedule::ExponentialDecay {
            initial: 0.1,
            decay_steps: 10,
            factor: 0.5,
            staircase: true,
            burnin_lr: 0.0,
            burnin_steps: 0,
            min_lr: 0.01,
        };
        assert_eq!(s.at(0), 0.1);
        assert_eq!(s.at(9), 0.1);
        assert!((s.at(10) - 0.05).abs() < 1e-7);
        assert!((s.at(100) - 0.01).abs() < 1e-7, "floored at min_lr");
    }

    #[test]
    fn manual_step_with_and_without_warmup() {
        let s = LrSchedule::ManualStep {
            initial: 0.0,
            schedule: vec![(10, 1.0), (20, 0.5)],
            warmup: false,
        };
        assert_eq!((s.at(0), s.at(9), s.at(10), s.at(25)), (0.0, 0.0, 1.0, 0.5));
        let w = LrSchedule::ManualStep {
            initial: 0.0,
            schedule: vec![(10, 1.0), (20, 0.5)],
            warmup: true,
        };
        assert!((w.at(5) - 0.5).abs() < 1e-7);
        assert_eq!(w.at(10), 1.0);
    }

    #[test]
    fn cosine_poly_and_transformer() {
        let c = LrSchedule::CosineDecay {
            base: 1.0,
            total_steps: 100,
            warmup_lr: 0.0,
            warmup_steps: 10,
            hold_steps: 0,
        };
        assert!((c.at(5) - 0.5).abs() < 1e-6);
        assert!((c.at(10) - 1.0).abs() < 1e-6);
        assert!((c.at(55) - 0.5).abs() < 1e-6);
        assert_eq!(c.at(101), 0.0);
        let p = LrSchedule::PolyDecay {
            base: 1.0,
            total_steps: 10,
            power: 1.0,
            end_lr: 0.0,
        };
        assert!((p.at(5) - 0.5).abs() < 1e-6);
        assert_eq!(p.at(50), 0.0);
        let t = LrSchedule::Transformer {
            base: 1.0,
            hidden_size: 4,
            warmup_steps: 4,
            step_scaling: 1.0,
        };
        // step 3: min(4 * 4^-1.5, 4^-0.5) = 0.5; * 4^-0.5 = 0.25
        assert!((t.at(3) - 0.25).abs() < 1e-6);
    }
}
