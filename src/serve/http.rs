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

pub use super::app::App;
use super::app::{
    output_columns, output_names, tf_dtype, tf_version_state, triton_type, v2_datatype, ApiError, Selector,
};
use super::request::{self, BadRequest, Form};
use super::{Served, VersionState};

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
}

/// The body as JSON, or the refusal: too large (413, the body read on to
/// `DRAIN_FACTOR` times the limit and dropped), unreadable, not JSON.
async fn parse_body(body: Body, max: usize) -> Result<Value, ApiError> {
    json_of(&read_body(body, max).await?)
}

fn json_of(data: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(data).map_err(|e| {
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

/// `name`, `name/versions/v` or `name/labels/l`, with an optional suffix
/// (`metadata`, `ready`, ...): the name, the version asked for and the
/// suffix.
fn model_path(rest: &str) -> Option<(&str, Selector<'_>, Option<&str>)> {
    let parts: Vec<&str> = rest.split('/').collect();
    match parts[..] {
        [""] | ["", ..] => None,
        [name] => Some((name, Selector::Latest, None)),
        [name, "versions", v] => Some((name, Selector::Version(v), None)),
        [name, "labels", l] => Some((name, Selector::Label(l), None)),
        [name, suffix] => Some((name, Selector::Latest, Some(suffix))),
        [name, "versions", v, suffix] => Some((name, Selector::Version(v), Some(suffix))),
        [name, "labels", l, suffix] => Some((name, Selector::Label(l), Some(suffix))),
        _ => None,
    }
}

fn unknown_path(path: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no such endpoint: {path}"))
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
        Some((name, which, None)) => (
            "status",
            app.model(name, which)
                .map(|s| tf_status(&app, &s, !matches!(which, Selector::Latest))),
        ),
        Some((name, which, Some("metadata"))) => ("metadata", app.model(name, which).map(|s| tf_metadata(&app, &s))),
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
        (Some((name, which, None)), "predict") => tf_predict(&app, name, which, body).await,
        (Some(_), "classify" | "regress") => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(":{method} takes tf.Example protos, which this server does not read: use :predict"),
        )),
        _ => Err(unknown_path(&format!("POST /v1/models/{rest}"))),
    };
    app.finish("predict", start, result)
}

async fn tf_predict(app: &App, name: &str, which: Selector<'_>, body: Body) -> Result<Value, ApiError> {
    let served = app.model(name, which)?;
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
fn tf_status(app: &App, served: &Served, asked: bool) -> Value {
    let list: Vec<Value> = app
        .registry
        .states()
        .into_iter()
        .filter(|(v, _)| !asked || *v == served.version)
        .map(|(v, st)| {
            let (state, error) = tf_version_state(st);
            let code = if error.is_some() { "UNKNOWN" } else { "OK" };
            json!({
                "version": v.to_string(),
                "state": state.as_str_name(),
                "status": { "error_code": code, "error_message": error.unwrap_or_default() }
            })
        })
        .collect();
    json!({ "model_version_status": list })
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
            let t = tf_tensor(&n, tf_dtype(ty).as_str_name());
            (n, t)
        })
        .collect();
    let outputs: Map<String, Value> = output_names(served)
        .into_iter()
        .map(|n| {
            let t = tf_tensor(&n, crate::tf_proto::DataType::DtFloat.as_str_name());
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

/// The KServe v2 / Triton extensions this server answers.
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
];

async fn v2_server(State(app): Shared) -> Response {
    let body = json!({
        "name": "rustrec",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS
    });
    app.finish("metadata", Instant::now(), Ok(body))
}

/// Triton's repository index: every version seen with its state (READY
/// when served), or only the served ones when the body asks `ready`.
async fn v2_index(State(app): Shared, body: Body) -> Response {
    let start = Instant::now();
    let result = parse_body_or_empty(body, app.max_request_bytes).await.map(|req| {
        let ready_only = req.get("ready").and_then(Value::as_bool).unwrap_or(false);
        let list: Vec<Value> = repository_index(&app, ready_only)
            .into_iter()
            .map(|(version, state, reason)| json!({ "name": app.name, "version": version, "state": state, "reason": reason }))
            .collect();
        Value::Array(list)
    });
    app.finish("metadata", start, result)
}

/// The repository index's entries: version, state, reason.
pub fn repository_index(app: &App, ready_only: bool) -> Vec<(String, &'static str, String)> {
    app.registry
        .states()
        .into_iter()
        .map(|(v, st)| match st {
            VersionState::Available => (v, "READY", String::new()),
            VersionState::Loading => (v, "LOADING", String::new()),
            VersionState::End(None) => (v, "UNAVAILABLE", "unloaded".to_string()),
            VersionState::End(Some(e)) => (v, "UNAVAILABLE", e),
        })
        .filter(|(_, state, _)| !ready_only || *state == "READY")
        .map(|(v, state, reason)| (v.to_string(), state, reason))
        .collect()
}

/// A body that may be empty (an empty object then).
async fn parse_body_or_empty(body: Body, max: usize) -> Result<Value, ApiError> {
    let data = read_body(body, max).await?;
    if data.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    json_of(&data)
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
    let inputs: Vec<Value> = request::request_inputs(&served.model)
        .into_iter()
        .map(|(n, ty)| json!({ "name": n, "data_type": triton_type(ty).as_str_name(), "dims": [-1] }))
        .collect();
    let outputs: Vec<Value> = output_names(served)
        .into_iter()
        .map(|n| json!({ "name": n, "data_type": "TYPE_FP32", "dims": [-1] }))
        .collect();
    json!({
        "name": app.name,
        "platform": "onnxruntime_onnx",
        "backend": "rustrec",
        "version_policy": { "latest": { "num_versions": app.num_versions } },
        "max_batch_size": 0,
        "input": inputs,
        "output": outputs,
        "parameters": { "global_step": { "string_value": served.step.to_string() } }
    })
}

async fn v2_get(State(app): Shared, Path(rest): Path<String>) -> Response {
    let start = Instant::now();
    let (endpoint, result) = match model_path(&rest) {
        Some((name, which, None)) => ("metadata", app.model(name, which).map(|s| v2_metadata(&app, &s))),
        Some((name, which, Some("ready"))) => ("health", app.model(name, which).map(|_| json!({}))),
        Some((name, which, Some("config"))) => ("metadata", app.model(name, which).map(|s| v2_config(&app, &s))),
        Some((name, which, Some("stats"))) => ("metadata", app.model(name, which).map(|s| v2_stats(&app, &s))),
        _ => ("other", Err(unknown_path(&format!("GET /v2/models/{rest}")))),
    };
    app.finish(endpoint, start, result)
}

async fn v2_post(State(app): Shared, Path(rest): Path<String>, headers: axum::http::HeaderMap, body: Body) -> Response {
    let start = Instant::now();
    let result = match model_path(&rest) {
        Some((name, which, Some("infer"))) => v2_infer(&app, (name, which), &headers, body).await,
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
    (name, which): (&str, Selector<'_>),
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<(Value, Vec<u8>), ApiError> {
    let served = app.model(name, which)?;
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
    let answer = app.infer_v2(served, &body).await?;
    let mut binary = Vec::new();
    let outputs: Vec<Value> = answer
        .outputs
        .iter()
        .map(|(name, values)| {
            let rows = answer.rows;
            if super::binary::wants_binary(&body, name) {
                let before = binary.len();
                binary.extend(values.iter().flat_map(|x| x.to_le_bytes()));
                let size = binary.len() - before;
                json!({ "name": name, "datatype": "FP32", "shape": [rows], "parameters": { "binary_data_size": size } })
            } else {
                json!({ "name": name, "datatype": "FP32", "shape": [rows], "data": f32_list(values) })
            }
        })
        .collect();
    let served = answer.served;
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
        "versions": app.registry.versions().iter().map(u64::to_string).collect::<Vec<_>>(),
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
