//! The HTTP routes: TF Serving's REST API (`/v1/models/...`), KServe's v2
//! protocol (`/v2/...`) and `/metrics`. Every answer is JSON; every refusal
//! is `{"error": "..."}` with a 4xx code (a 5xx one only for our own
//! failures), and no request body can stop the server.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, HttpBody};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::batcher::{Job, Scheduler, ScoreError};
use super::metrics::Metrics;
use super::request::{self, BadRequest, Form};
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
}

/// How far past `max_request_bytes` a refused body is still read (and
/// dropped), so that its client finishes sending and reads the 413 rather
/// than finding the connection reset; a longer one is cut off.
const DRAIN_FACTOR: usize = 16;

type Shared = State<Arc<App>>;

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/models/{*rest}", get(v1_get).post(v1_post))
        .route("/v2", get(v2_server))
        .route("/v2/health/live", get(health))
        .route("/v2/health/ready", get(health))
        .route("/v2/models/stats", get(v2_all_stats))
        .route("/v2/models/{*rest}", get(v2_get).post(v2_post))
        .route("/v2/repository/index", axum::routing::post(v2_index))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(app)
}

/// A refusal: its status code and message.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> Self {
        ApiError(StatusCode::BAD_REQUEST, e.0)
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

impl App {
    /// Answers and counts one request.
    fn finish(&self, endpoint: &str, start: Instant, result: Result<Value, ApiError>) -> Response {
        let (code, body) = match result {
            Ok(v) => (StatusCode::OK, v),
            Err(ApiError(code, msg)) => {
                if code.is_server_error() {
                    log::error!("{endpoint}: {msg}");
                }
                (code, json!({ "error": msg }))
            }
        };
        self.metrics.request(endpoint, code.as_u16(), start.elapsed());
        json_response(code, &body)
    }

    /// The served version, if it is the one asked for (any when `None`).
    fn model(&self, name: &str, version: Option<&str>) -> Result<Arc<Served>, ApiError> {
        if name != self.name {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("model `{name}` is not served here (this server serves `{}`)", self.name),
            ));
        }
        let served = self.registry.current();
        match version {
            Some(v) if v != served.version.to_string() => Err(ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "version {v} of `{name}` is not available: version {} is served",
                    served.version
                ),
            )),
            _ => Ok(served),
        }
    }

    async fn score(&self, model: Arc<Served>, raw: RawBatch) -> Result<Vec<TaskScores>, ApiError> {
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
}

/// The body as JSON, or the refusal: too large (413, the body read on to
/// `DRAIN_FACTOR` times the limit and dropped), unreadable, not JSON.
async fn parse_body(body: Body, max: usize) -> Result<Value, ApiError> {
    let data = read_body(body, max).await?;
    serde_json::from_slice(&data).map_err(|e| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
        )
    })
}

/// The body's bytes, or the refusal (see `parse_body`).
async fn read_body(mut body: Body, max: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds the length limit of {max} bytes (--max_request_bytes)"),
        )
    };
    if body.size_hint().lower() as usize > max.saturating_mul(DRAIN_FACTOR) {
        return Err(too_large());
    }
    let (mut data, mut seen) = (Vec::new(), 0usize);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("the request body could not be read: {e}"),
            )
        })?;
        if let Ok(chunk) = frame.into_data() {
            seen += chunk.len();
            if seen <= max {
                data.extend_from_slice(&chunk);
            } else if seen > max.saturating_mul(DRAIN_FACTOR) {
                break;
            }
        }
    }
    if seen > max {
        return Err(too_large());
    }
    Ok(data)
}

/// `name`, `name/versions/v` (with an optional suffix after it, such as
/// `metadata` or `ready`): the name, the version and the suffix.
fn model_path(rest: &str) -> Option<(&str, Option<&str>, Option<&str>)> {
    let parts: Vec<&str> = rest.split('/').collect();
    match parts[..] {
        [name] if !name.is_empty() => Some((name, None, None)),
        [name, "versions", v] => Some((name, Some(v), None)),
        [name, suffix] => Some((name, None, Some(suffix))),
        [name, "versions", v, suffix] => Some((name, Some(v), Some(suffix))),
        _ => None,
    }
}

fn unknown_path(path: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no such endpoint: {path}"))
}

/// Output names in the graph's order: per task its logits, then its scores.
fn output_names(served: &Served) -> Vec<String> {
    served.model.plan.model.tasks.iter().flat_map(score_columns).collect()
}

fn output_columns(scores: &[TaskScores]) -> Vec<Vec<f32>> {
    scores.iter().flat_map(TaskScores::columns).collect()
}

/// A score as JSON, written with the digits that identify the f32 (0.4455813
/// rather than 0.44558125734329224); null if not finite.
fn f32_value(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn f32_list(xs: &[f32]) -> Value {
    Value::Array(xs.iter().map(|&x| f32_value(x)).collect())
}

// ---- TF Serving REST -----------------------------------------------------

async fn v1_get(State(app): Shared, Path(rest): Path<String>) -> Response {
    let start = Instant::now();
    let (endpoint, result) = match model_path(&rest) {
        Some((name, version, None)) => ("status", app.model(name, version).map(|s| tf_status(&app, &s, version))),
        Some((name, version, Some("metadata"))) => {
            ("metadata", app.model(name, version).map(|s| tf_metadata(&app, &s)))
        }
        _ => ("other", Err(unknown_path(&format!("GET /v1/models/{rest}")))),
    };
    app.finish(endpoint, start, result)
}

async fn v1_post(State(app): Shared, Path(rest): Path<String>, body: Body) -> Response {
    let start = Instant::now();
    let Some((target, method)) = rest.rsplit_once(':') else {
        return app.finish("other", start, Err(unknown_path(&format!("POST /v1/models/{rest}"))));
    };
    let result = match (model_path(target), method) {
        (Some((name, version, None)), "predict") => tf_predict(&app, name, version, body).await,
        (Some(_), "classify" | "regress") => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(":{method} takes tf.Example protos, which this server does not read: use :predict"),
        )),
        _ => Err(unknown_path(&format!("POST /v1/models/{rest}"))),
    };
    app.finish("predict", start, result)
}

async fn tf_predict(app: &App, name: &str, version: Option<&str>, body: Body) -> Result<Value, ApiError> {
    let served = app.model(name, version)?;
    let body = parse_body(body, app.max_request_bytes).await?;
    let (raw, form) = request::tf_serving(&body, &served.model)?;
    let rows = raw.num_rows;
    let scores = app.score(served.clone(), raw).await?;
    let names = output_names(&served);
    let cols = output_columns(&scores);
    Ok(match form {
        Form::Rows => {
            let predictions: Vec<Value> = (0..rows)
                .map(|r| {
                    Value::Object(
                        names
                            .iter()
                            .zip(&cols)
                            .map(|(n, c)| (n.clone(), f32_value(c[r])))
                            .collect(),
                    )
                })
                .collect();
            json!({ "predictions": predictions })
        }
        Form::Columns => {
            let outputs: Map<String, Value> = names.iter().zip(&cols).map(|(n, c)| (n.clone(), f32_list(c))).collect();
            json!({ "outputs": outputs })
        }
    })
}

/// TF Serving's status: the version asked for, or every version seen
/// (newest first) with its load state and, for a failed load, its error.
fn tf_status(app: &App, served: &Served, asked: Option<&str>) -> Value {
    let list: Vec<Value> = app
        .registry
        .states()
        .into_iter()
        .filter(|(v, _)| asked.is_none() || *v == served.version)
        .map(|(v, st)| {
            let (state, code, message) = match st {
                VersionState::Loading => ("LOADING", "OK", String::new()),
                VersionState::Available => ("AVAILABLE", "OK", String::new()),
                VersionState::End(None) => ("END", "OK", String::new()),
                VersionState::End(Some(e)) => ("END", "UNKNOWN", e),
            };
            json!({
                "version": v.to_string(),
                "state": state,
                "status": { "error_code": code, "error_message": message }
            })
        })
        .collect();
    json!({ "model_version_status": list })
}

fn tf_dtype(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Int => "DT_INT64",
        ColumnType::Float => "DT_DOUBLE",
        ColumnType::Str => "DT_STRING",
        ColumnType::Bool => "DT_BOOL",
    }
}

fn tf_tensor(name: &str, dtype: &str) -> Value {
    json!({
        "dtype": dtype,
        "tensor_shape": { "dim": [{ "size": "-1", "name": "" }], "unknown_rank": false },
        "name": format!("{name}:0")
    })
}

fn tf_metadata(app: &App, served: &Served) -> Value {
    let inputs: Map<String, Value> = request::request_inputs(&served.model)
        .into_iter()
        .map(|(n, ty)| {
            let t = tf_tensor(&n, tf_dtype(ty));
            (n, t)
        })
        .collect();
    let outputs: Map<String, Value> = output_names(served)
        .into_iter()
        .map(|n| {
            let t = tf_tensor(&n, "DT_FLOAT");
            (n, t)
        })
        .collect();
    json!({
        "model_spec": { "name": app.name, "signature_name": "", "version": served.version.to_string() },
        "global_step": served.step,
        "metadata": { "signature_def": { "signature_def": { "serving_default": {
            "inputs": inputs,
            "outputs": outputs,
            "method_name": "tensorflow/serving/predict"
        }}}}
    })
}

// ---- KServe v2 -----------------------------------------------------------

async fn health(State(app): Shared) -> Response {
    app.finish("health", Instant::now(), Ok(json!({})))
}

async fn v2_server(State(app): Shared) -> Response {
    let body = json!({
        "name": "rustrec",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
    });
    app.finish("metadata", Instant::now(), Ok(body))
}

/// Triton's repository index: the model, its served version, READY.
async fn v2_index(State(app): Shared) -> Response {
    let served = app.registry.current();
    let body = json!([{ "name": app.name, "version": served.version.to_string(), "state": "READY", "reason": "" }]);
    app.finish("metadata", Instant::now(), Ok(body))
}

/// Triton's statistics of every model (this server's one).
async fn v2_all_stats(State(app): Shared) -> Response {
    let served = app.registry.current();
    app.finish("metadata", Instant::now(), Ok(v2_stats(&app, &served)))
}

/// Triton's statistics: requests answered and refused with their total
/// time, rows scored, model runs.
fn v2_stats(app: &App, served: &Served) -> Value {
    let s = app.metrics.inference_stats();
    let pair = |(count, ns): (u64, u64)| json!({ "count": count, "ns": ns });
    json!({ "model_stats": [{
        "name": app.name,
        "version": served.version.to_string(),
        "last_inference": s.last_ms,
        "inference_count": s.rows,
        "execution_count": s.executions,
        "inference_stats": {
            "success": pair(s.success),
            "fail": pair(s.fail),
            "queue": pair((0, 0)),
            "compute_input": pair((0, 0)),
            "compute_infer": pair((s.executions, s.success.1)),
            "compute_output": pair((0, 0)),
            "cache_hit": pair((0, 0)),
            "cache_miss": pair((0, 0))
        },
        "batch_stats": []
    }]})
}

/// Triton's model configuration of the served export: its inputs as raw
/// values (strings, integers or floats by `input_fields`), its outputs.
fn v2_config(app: &App, served: &Served) -> Value {
    let triton_type = |ty: ColumnType| match ty {
        ColumnType::Int => "TYPE_INT64",
        ColumnType::Float => "TYPE_FP64",
        ColumnType::Str => "TYPE_STRING",
        ColumnType::Bool => "TYPE_BOOL",
    };
    let inputs: Vec<Value> = request::request_inputs(&served.model)
        .into_iter()
        .map(|(n, ty)| json!({ "name": n, "data_type": triton_type(ty), "dims": [-1] }))
        .collect();
    let outputs: Vec<Value> = output_names(served)
        .into_iter()
        .map(|n| json!({ "name": n, "data_type": "TYPE_FP32", "dims": [-1] }))
        .collect();
    json!({
        "name": app.name,
        "platform": "onnxruntime_onnx",
        "backend": "rustrec",
        "version_policy": { "latest": { "num_versions": 1 } },
        "max_batch_size": 0,
        "input": inputs,
        "output": outputs,
        "parameters": { "global_step": { "string_value": served.step.to_string() } }
    })
}

async fn v2_get(State(app): Shared, Path(rest): Path<String>) -> Response {
    let start = Instant::now();
    let (endpoint, result) = match model_path(&rest) {
        Some((name, version, None)) => ("metadata", app.model(name, version).map(|s| v2_metadata(&app, &s))),
        Some((name, version, Some("ready"))) => ("health", app.model(name, version).map(|_| json!({}))),
        Some((name, version, Some("config"))) => ("metadata", app.model(name, version).map(|s| v2_config(&app, &s))),
        Some((name, version, Some("stats"))) => ("metadata", app.model(name, version).map(|s| v2_stats(&app, &s))),
        _ => ("other", Err(unknown_path(&format!("GET /v2/models/{rest}")))),
    };
    app.finish(endpoint, start, result)
}

async fn v2_post(State(app): Shared, Path(rest): Path<String>, headers: axum::http::HeaderMap, body: Body) -> Response {
    let start = Instant::now();
    let result = match model_path(&rest) {
        Some((name, version, Some("infer"))) => v2_infer(&app, (name, version), &headers, body).await,
        _ => Err(unknown_path(&format!("POST /v2/models/{rest}"))),
    };
    app.metrics.inference(result.is_ok(), start.elapsed());
    match result {
        // Binary outputs: the JSON header, then their data.
        Ok((answer, binary)) if !binary.is_empty() => {
            let mut bytes = answer.to_string().into_bytes();
            let json_len = bytes.len();
            bytes.extend(binary);
            app.metrics.request("infer", 200, start.elapsed());
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (
                        header::HeaderName::from_static(super::binary::HEADER),
                        json_len.to_string(),
                    ),
                ],
                bytes,
            )
                .into_response()
        }
        result => app.finish("infer", start, result.map(|(answer, _)| answer)),
    }
}

/// An inference request, JSON or with binary tensor data
/// (`Inference-Header-Content-Length`); the answer's JSON and the binary
/// data of the outputs asked for that way.
async fn v2_infer(
    app: &App,
    (name, version): (&str, Option<&str>),
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<(Value, Vec<u8>), ApiError> {
    let served = app.model(name, version)?;
    let binary_header = headers
        .get(super::binary::HEADER)
        .map(|h| {
            h.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| BadRequest("Inference-Header-Content-Length must be a byte count".into()))
        })
        .transpose()?;
    let body = match binary_header {
        Some(n) => super::binary::parse(&read_body(body, app.max_request_bytes).await?, n)?,
        None => parse_body(body, app.max_request_bytes).await?,
    };
    if !body.is_object() {
        return Err(BadRequest("the request body must be a JSON object".into()).into());
    }
    let names = output_names(&served);
    // The outputs asked for, by name; all when the request names none.
    let wanted: Vec<String> = match body.get("outputs") {
        None | Some(Value::Null) => names.clone(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|o| match o.get("name").and_then(Value::as_str) {
                Some(n) if names.iter().any(|m| m == n) => Ok(n.to_string()),
                Some(n) => Err(BadRequest(format!(
                    "output `{n}` is not an output of this model ({})",
                    names.join(", ")
                ))),
                None => Err(BadRequest("each of `outputs` needs a `name` string".into())),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(BadRequest("`outputs` must be a list of {\"name\": ...} objects".into()).into()),
    };
    let raw = request::kserve_v2(&body, &served.model)?;
    let rows = raw.num_rows;
    let scores = app.score(served.clone(), raw).await?;
    let cols = output_columns(&scores);
    let mut binary = Vec::new();
    let outputs: Vec<Value> = wanted
        .iter()
        .map(|w| {
            let i = names.iter().position(|n| n == w).expect("checked above");
            if super::binary::wants_binary(&body, w) {
                let before = binary.len();
                binary.extend(cols[i].iter().flat_map(|x| x.to_le_bytes()));
                let size = binary.len() - before;
                json!({ "name": w, "datatype": "FP32", "shape": [rows], "parameters": { "binary_data_size": size } })
            } else {
                json!({ "name": w, "datatype": "FP32", "shape": [rows], "data": f32_list(&cols[i]) })
            }
        })
        .collect();
    let mut answer = json!({
        "model_name": app.name,
        "model_version": served.version.to_string(),
        "outputs": outputs
    });
    if let Some(id) = body.get("id") {
        answer["id"] = id.clone();
    }
    Ok((answer, binary))
}

fn v2_datatype(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Int => "INT64",
        ColumnType::Float => "FP64",
        ColumnType::Str => "BYTES",
        ColumnType::Bool => "BOOL",
    }
}

fn v2_metadata(app: &App, served: &Served) -> Value {
    let inputs: Vec<Value> = request::request_inputs(&served.model)
        .into_iter()
        .map(|(n, ty)| json!({ "name": n, "datatype": v2_datatype(ty), "shape": [-1] }))
        .collect();
    let outputs: Vec<Value> = output_names(served)
        .into_iter()
        .map(|n| json!({ "name": n, "datatype": "FP32", "shape": [-1] }))
        .collect();
    json!({
        "name": app.name,
        "versions": [served.version.to_string()],
        "platform": "onnx",
        "parameters": { "global_step": served.step },
        "inputs": inputs,
        "outputs": outputs
    })
}

// ---- the rest ------------------------------------------------------------

/// `/metrics` in OpenMetrics for a scraper that asks for it (Prometheus
/// does), else in Prometheus' classic text format, which other parsers read.
async fn metrics(State(app): Shared, headers: axum::http::HeaderMap) -> Response {
    let open = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|a| a.contains("application/openmetrics-text"));
    let text = app.metrics.text();
    app.metrics.request("metrics", 200, std::time::Duration::ZERO);
    let (body, content_type) = if open {
        (text, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    } else {
        (
            super::metrics::classic(&text),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn not_found(State(app): Shared, uri: axum::http::Uri) -> Response {
    app.finish("other", Instant::now(), Err(unknown_path(uri.path())))
}
