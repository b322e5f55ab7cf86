//! `serve --grpc_port`: TF Serving's gRPC API (`PredictionService.Predict`
//! and `GetModelMetadata`, `ModelService.GetModelStatus`) and KServe v2's
//! `GRPCInferenceService` with Triton's configuration, statistics and
//! repository-index calls, with tonic. Requests carry raw feature values as
//! tensors; they are read into the same JSON values the REST front end
//! reads (`request`), so both protocols decode, default and refuse inputs
//! alike, and are scored by the same threads.

pub mod kserve;
pub mod tf_serving;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use axum::http::StatusCode;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use super::app::{ApiError, App};

/// KServe v2's gRPC messages and service (package `inference`).
pub mod inference {
    #![allow(clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// Serves the three services on `listener` until `shutdown` completes.
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    use crate::tf_proto::serving::model_service_server::ModelServiceServer;
    use crate::tf_proto::serving::prediction_service_server::PredictionServiceServer;
    use inference::grpc_inference_service_server::GrpcInferenceServiceServer;
    let limit = app.max_request_bytes;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .add_service(
            PredictionServiceServer::new(tf_serving::Predictions(app.clone())).max_decoding_message_size(limit),
        )
        .add_service(ModelServiceServer::new(tf_serving::Models(app.clone())))
        .add_service(GrpcInferenceServiceServer::new(kserve::Inference(app)).max_decoding_message_size(limit))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .context("the gRPC server failed")
}

/// A refusal as a gRPC status: the code of the same meaning as its HTTP one.
fn status(e: ApiError) -> tonic::Status {
    let code = match e.0 {
        StatusCode::BAD_REQUEST => tonic::Code::InvalidArgument,
        StatusCode::NOT_FOUND => tonic::Code::NotFound,
        StatusCode::PAYLOAD_TOO_LARGE => tonic::Code::ResourceExhausted,
        StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
        c if c.is_server_error() => tonic::Code::Internal,
        _ => tonic::Code::Unknown,
    };
    if code == tonic::Code::Internal {
        log::error!("gRPC: {}", e.1);
    }
    tonic::Status::new(code, e.1)
}

/// Answers and counts one call under `endpoint` in the metrics.
fn finish<T>(
    app: &App,
    endpoint: &str,
    start: Instant,
    result: Result<T, ApiError>,
) -> Result<tonic::Response<T>, tonic::Status> {
    let code = match &result {
        Ok(_) => 200,
        Err(e) => e.0.as_u16(),
    };
    app.metrics.request(endpoint, code, start.elapsed());
    result.map(tonic::Response::new).map_err(status)
}

fn bad<T>(msg: impl Into<String>) -> Result<T, ApiError> {
    Err(ApiError(StatusCode::BAD_REQUEST, msg.into()))
}
