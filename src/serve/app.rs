//! What both protocols' front ends (`http`, `grpc`) share: the served
//! model's name, its versions, the scoring threads and the metrics; finding
//! the version a request names; scoring; KServe v2's inference, whose
//! request both carry as the same tensors.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;

use super::batcher::{Job, Scheduler, ScoreError};
use super::metrics::Metrics;
use super::request::{self, BadRequest};
use super::{Registry, Served, VersionState};
use crate::config::data_plan::ColumnType;
use crate::data::RawBatch;
use crate::model::{score_columns, TaskScores};

pub struct App {
    pub name: String,
    pub registry: Arc<Registry>,
    pub scheduler: Scheduler,
    pub metrics: Arc<Metrics>,
    /// The largest request body read (`--max_request_bytes`).
    pub max_request_bytes: usize,
    /// How many of the newest versions are served (`--num_versions`).
    pub num_versions: usize,
}

/// A refusal: its HTTP status code (mapped to a gRPC code by `grpc`) and
/// its message.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> Self {
        ApiError(StatusCode::BAD_REQUEST, e.0)
    }
}

/// The version a request asks for.
#[derive(Debug, Clone, Copy)]
pub enum Selector<'a> {
    /// None named: the newest served.
    Latest,
    Version(&'a str),
    /// A `--version_labels` name.
    Label(&'a str),
}

impl<'a> Selector<'a> {
    /// A version string as a v2 request or a REST path carries it; empty
    /// is none.
    pub fn of_version(v: Option<&'a str>) -> Self {
        match v {
            None | Some("") => Selector::Latest,
            Some(v) => Selector::Version(v),
        }
    }
}

/// A KServe v2 inference's answer: the outputs asked for (name and values,
/// one per row) in the order asked.
pub struct V2Answer {
    pub served: Arc<Served>,
    pub rows: usize,
    pub outputs: Vec<(String, Vec<f32>)>,
}

impl App {
    /// The version of model `name` a request asks for, if served.
    pub fn model(&self, name: &str, which: Selector) -> Result<Arc<Served>, ApiError> {
        if name != self.name {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("model `{name}` is not served here (this server serves `{}`)", self.name),
            ));
        }
        let reg = &self.registry;
        let served_list = || reg.versions().iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let version = match which {
            Selector::Latest => return Ok(reg.current()),
            Selector::Version(v) => v.parse::<u64>().ok(),
            Selector::Label(l) => match reg.label(l) {
                Some(v) => Some(v),
                None => {
                    let known: Vec<&str> = reg.labels().keys().map(String::as_str).collect();
                    return Err(ApiError(
                        StatusCode::NOT_FOUND,
                        format!(
                            "`{name}` has no version label `{l}` (labels: {})",
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
            },
        };
        version.and_then(|v| reg.get(v)).ok_or_else(|| {
            let asked = match which {
                Selector::Label(l) => format!("version {} (label `{l}`)", version.unwrap_or_default()),
                Selector::Version(v) => format!("version {v}"),
                Selector::Latest => unreachable!("answered above"),
            };
            ApiError(
                StatusCode::NOT_FOUND,
                format!("{asked} of `{name}` is not available: served are {}", served_list()),
            )
        })
    }

    pub async fn score(&self, model: Arc<Served>, raw: RawBatch) -> Result<Vec<TaskScores>, ApiError> {
        let (reply, rx) = oneshot::channel();
        self.scheduler.submit(Job { model, raw, reply });
        match rx.await {
            Ok(Ok(scores)) => Ok(scores),
            Ok(Err(ScoreError::Input(msg))) => Err(ApiError(StatusCode::BAD_REQUEST, msg)),
            Ok(Err(ScoreError::Internal(msg))) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, msg)),
            Err(_) => Err(ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the scoring thread dropped the request (a bug in rustrec)".into(),
            )),
        }
    }

    /// Scores a KServe v2 request held as JSON (`inputs` with their `data`;
    /// `outputs` naming the outputs wanted, all when absent).
    pub async fn infer_v2(&self, served: Arc<Served>, body: &Value) -> Result<V2Answer, ApiError> {
        let names = output_names(&served);
        let wanted: Vec<String> = match body.get("outputs") {
            None | Some(Value::Null) => names.clone(),
            Some(Value::Array(list)) if list.is_empty() => names.clone(),
            Some(Value::Array(list)) => list
                .iter()
                .map(|o| match o.get("name").and_then(Value::as_str) {
                    Some(n) => known_output(&names, n).map(str::to_string),
                    None => Err(BadRequest("each of `outputs` needs a `name` string".into())),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(BadRequest("`outputs` must be a list of {\"name\": ...} objects".into()).into()),
        };
        let raw = request::kserve_v2(body, &served.model)?;
        let rows = raw.num_rows;
        let scores = self.score(served.clone(), raw).await?;
        let cols = output_columns(&scores);
        let outputs = wanted
            .into_iter()
            .map(|w| {
                let i = names.iter().position(|n| *n == w).expect("checked above");
                (w, cols[i].clone())
            })
            .collect();
        Ok(V2Answer { served, rows, outputs })
    }
}

/// `name`, if it is one of `names`.
pub fn known_output<'a>(names: &[String], name: &'a str) -> Result<&'a str, BadRequest> {
    if names.iter().any(|n| n == name) {
        Ok(name)
    } else {
        Err(BadRequest(format!(
            "output `{name}` is not an output of this model ({})",
            names.join(", ")
        )))
    }
}

/// Output names in the graph's order: per task its logits, then its scores.
pub fn output_names(served: &Served) -> Vec<String> {
    served.model.plan.model.tasks.iter().flat_map(score_columns).collect()
}

pub fn output_columns(scores: &[TaskScores]) -> Vec<Vec<f32>> {
    scores.iter().flat_map(TaskScores::columns).collect()
}

// ---- what both protocols call an input's type and a version's state -----

/// TF Serving's type of an input column (`as_str_name` gives REST's).
pub fn tf_dtype(ty: ColumnType) -> crate::tf_proto::DataType {
    use crate::tf_proto::DataType;
    match ty {
        ColumnType::Int => DataType::DtInt64,
        ColumnType::Float => DataType::DtDouble,
        ColumnType::Str => DataType::DtString,
        ColumnType::Bool => DataType::DtBool,
    }
}

/// KServe v2's datatype of an input column.
pub fn v2_datatype(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Int => "INT64",
        ColumnType::Float => "FP64",
        ColumnType::Str => "BYTES",
        ColumnType::Bool => "BOOL",
    }
}

/// Triton's model-configuration type of an input column (`as_str_name`
/// gives REST's).
pub fn triton_type(ty: ColumnType) -> super::grpc::inference::DataType {
    use super::grpc::inference::DataType;
    match ty {
        ColumnType::Int => DataType::TypeInt64,
        ColumnType::Float => DataType::TypeFp64,
        ColumnType::Str => DataType::TypeString,
        ColumnType::Bool => DataType::TypeBool,
    }
}

/// TF Serving's load state of a version, and its error: a failed load
/// ends with one (reported as tensorflow.error.UNKNOWN, as TF Serving does).
pub fn tf_version_state(
    state: VersionState,
) -> (crate::tf_proto::serving::model_version_status::State, Option<String>) {
    use crate::tf_proto::serving::model_version_status::State;
    match state {
        VersionState::Loading => (State::Loading, None),
        VersionState::Available => (State::Available, None),
        VersionState::End(error) => (State::End, error),
    }
}
