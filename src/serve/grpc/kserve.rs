//! KServe v2's gRPC inference protocol with Triton's extensions: health,
//! metadata, `ModelInfer` (tensors in `contents` or, as tritonclient sends
//! them, in `raw_input_contents`; outputs answered in
//! `raw_output_contents`, as Triton does), the model configuration,
//! statistics and the repository index.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tonic::{Request, Response, Status};

use super::inference::grpc_inference_service_server::GrpcInferenceService;
use super::inference::model_infer_request::InferInputTensor;
use super::inference::model_infer_response::InferOutputTensor;
use super::inference::model_metadata_response::TensorMetadata;
use super::inference::{
    model_version_policy, repository_index_response, DataType, InferStatistics, ModelConfig, ModelConfigRequest,
    ModelConfigResponse, ModelInferRequest, ModelInferResponse, ModelInput, ModelMetadataRequest,
    ModelMetadataResponse, ModelOutput, ModelParameter, ModelReadyRequest, ModelReadyResponse, ModelStatistics,
    ModelStatisticsRequest, ModelStatisticsResponse, ModelVersionPolicy, RepositoryIndexRequest,
    RepositoryIndexResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest, ServerMetadataResponse,
    ServerReadyRequest, ServerReadyResponse, StatisticDuration,
};
use super::{bad, finish};
use crate::serve::app::{output_names, triton_type, v2_datatype, ApiError, App, Selector};
use crate::serve::{binary, http, request, Served};

pub struct Inference(pub Arc<App>);

impl Inference {
    fn model(&self, name: &str, version: &str) -> Result<Arc<Served>, ApiError> {
        self.0.model(name, Selector::of_version(Some(version)))
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Inference {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        finish(&self.0, "health", Instant::now(), Ok(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        finish(
            &self.0,
            "health",
            Instant::now(),
            Ok(ServerReadyResponse { ready: true }),
        )
    }

    /// Not ready (rather than an error) for a model or version not served,
    /// as Triton answers.
    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let req = req.into_inner();
        let ready = self.model(&req.name, &req.version).is_ok();
        finish(&self.0, "health", Instant::now(), Ok(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        let answer = ServerMetadataResponse {
            name: "rustrec".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: http::EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        };
        finish(&self.0, "metadata", Instant::now(), Ok(answer))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let start = Instant::now();
        let req = req.into_inner();
        let result = self.model(&req.name, &req.version).map(|served| {
            let tensor = |name: String, datatype: &str| TensorMetadata {
                name,
                datatype: datatype.into(),
                shape: vec![-1],
            };
            ModelMetadataResponse {
                name: self.0.name.clone(),
                versions: self.0.registry.versions().iter().map(u64::to_string).collect(),
                platform: "onnx".into(),
                inputs: request::request_inputs(&served.model)
                    .into_iter()
                    .map(|(n, ty)| tensor(n, v2_datatype(ty)))
                    .collect(),
                outputs: output_names(&served).into_iter().map(|n| tensor(n, "FP32")).collect(),
            }
        });
        finish(&self.0, "metadata", start, result)
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let start = Instant::now();
        let result = infer(&self.0, req.into_inner()).await;
        self.0.metrics.inference(result.is_ok(), start.elapsed());
        finish(&self.0, "infer", start, result)
    }

    async fn model_config(&self, req: Request<ModelConfigRequest>) -> Result<Response<ModelConfigResponse>, Status> {
        let req = req.into_inner();
        let result = self.model(&req.name, &req.version).map(|served| ModelConfigResponse {
            config: Some(config(&self.0, &served)),
        });
        finish(&self.0, "metadata", Instant::now(), result)
    }

    /// The statistics of the model (all models when no name is given:
    /// this server's one).
    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let req = req.into_inner();
        let served = if req.name.is_empty() {
            Ok(self.0.registry.current())
        } else {
            self.model(&req.name, &req.version)
        };
        let result = served.map(|served| ModelStatisticsResponse {
            model_stats: vec![statistics(&self.0, &served)],
        });
        finish(&self.0, "metadata", Instant::now(), result)
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let req = req.into_inner();
        let models = http::repository_index(&self.0, req.ready)
            .into_iter()
            .map(|(version, state, reason)| repository_index_response::ModelIndex {
                name: self.0.name.clone(),
                version,
                state: state.into(),
                reason,
            })
            .collect();
        finish(
            &self.0,
            "metadata",
            Instant::now(),
            Ok(RepositoryIndexResponse { models }),
        )
    }
}

/// Reads the request's tensors into the JSON form of a v2 request and
/// scores it; the outputs come back as little-endian FP32 in
/// `raw_output_contents`.
async fn infer(app: &App, req: ModelInferRequest) -> Result<ModelInferResponse, ApiError> {
    let served = app.model(&req.model_name, Selector::of_version(Some(&req.model_version)))?;
    let raw = &req.raw_input_contents;
    if !raw.is_empty() && raw.len() != req.inputs.len() {
        return bad(format!(
            "raw_input_contents holds {} tensors for {} inputs: send every input's data there, or none",
            raw.len(),
            req.inputs.len()
        ));
    }
    let inputs: Vec<Value> = req
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let data = match raw.get(i) {
                Some(bytes) => binary::decode(&t.name, &t.datatype, bytes)?,
                None => contents(t)?,
            };
            Ok(json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape, "data": data }))
        })
        .collect::<Result<_, ApiError>>()?;
    let outputs: Vec<Value> = req.outputs.iter().map(|o| json!({ "name": o.name })).collect();
    let body = json!({ "inputs": inputs, "outputs": outputs });
    let answer = app.infer_v2(served, &body).await?;
    let rows = answer.rows as i64;
    Ok(ModelInferResponse {
        model_name: app.name.clone(),
        model_version: answer.served.version.to_string(),
        id: req.id,
        parameters: HashMap::new(),
        outputs: answer
            .outputs
            .iter()
            .map(|(name, _)| InferOutputTensor {
                name: name.clone(),
                datatype: "FP32".into(),
                shape: vec![rows],
                parameters: HashMap::new(),
                contents: None,
            })
            .collect(),
        raw_output_contents: answer
            .outputs
            .iter()
            .map(|(_, values)| values.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect(),
    })
}

/// A tensor's values from its typed `contents`, by its datatype.
fn contents(t: &InferInputTensor) -> Result<Vec<Value>, ApiError> {
    let Some(c) = &t.contents else {
        return Ok(Vec::new());
    };
    fn all<T: Copy>(xs: &[T]) -> Vec<Value>
    where
        Value: From<T>,
    {
        xs.iter().map(|&x| Value::from(x)).collect()
    }
    Ok(match t.datatype.as_str() {
        "BOOL" => all(&c.bool_contents),
        "INT8" | "INT16" | "INT32" => all(&c.int_contents),
        "INT64" => all(&c.int64_contents),
        "UINT8" | "UINT16" | "UINT32" => all(&c.uint_contents),
        "UINT64" => all(&c.uint64_contents),
        "FP32" => all(&c.fp32_contents),
        "FP64" => all(&c.fp64_contents),
        "BYTES" => c
            .bytes_contents
            .iter()
            .map(|b| match std::str::from_utf8(b) {
                Ok(s) => Ok(Value::String(s.to_string())),
                Err(_) => bad(format!("input `{}`: a BYTES element is not UTF-8 text", t.name)),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return bad(format!(
                "input `{}`: datatype `{other}` is not read here: send BYTES, integers, FP32, FP64 or BOOL",
                t.name
            ))
        }
    })
}

/// Triton's model configuration of an export (as the REST `config` says).
fn config(app: &App, served: &Served) -> ModelConfig {
    ModelConfig {
        name: app.name.clone(),
        platform: "onnxruntime_onnx".into(),
        backend: "rustrec".into(),
        version_policy: Some(ModelVersionPolicy {
            policy_choice: Some(model_version_policy::PolicyChoice::Latest(
                model_version_policy::Latest {
                    num_versions: app.num_versions as u32,
                },
            )),
        }),
        max_batch_size: 0,
        input: request::request_inputs(&served.model)
            .into_iter()
            .map(|(name, ty)| ModelInput {
                name,
                data_type: triton_type(ty) as i32,
                dims: vec![-1],
            })
            .collect(),
        output: output_names(served)
            .into_iter()
            .map(|name| ModelOutput {
                name,
                data_type: DataType::TypeFp32 as i32,
                dims: vec![-1],
            })
            .collect(),
        parameters: HashMap::from([(
            "global_step".to_string(),
            ModelParameter {
                string_value: served.step.to_string(),
            },
        )]),
    }
}

fn statistics(app: &App, served: &Served) -> ModelStatistics {
    let s = app.metrics.inference_stats();
    let pair = |(count, ns): (u64, u64)| Some(StatisticDuration { count, ns });
    ModelStatistics {
        name: app.name.clone(),
        version: served.version.to_string(),
        last_inference: s.last_ms,
        inference_count: s.rows,
        execution_count: s.executions,
        inference_stats: Some(InferStatistics {
            success: pair(s.success),
            fail: pair(s.fail),
            queue: pair((0, 0)),
            compute_input: pair((0, 0)),
            compute_infer: pair((s.executions, s.success.1)),
            compute_output: pair((0, 0)),
            cache_hit: pair((0, 0)),
            cache_miss: pair((0, 0)),
        }),
    }
}
