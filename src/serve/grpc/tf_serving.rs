//! TF Serving's gRPC API: `Predict` with one tensor of raw values per input
//! (`tf.make_tensor_proto(values)`: strings, integers, floats or booleans,
//! as typed lists or `tensor_content`), `GetModelMetadata` (the
//! `serving_default` signature) and `GetModelStatus`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tonic::{Request, Response, Status};

use super::{bad, finish};
use crate::serve::app::{
    known_output, output_columns, output_names, tf_dtype, tf_version_state, ApiError, App, Selector,
};
use crate::serve::request::{self, SIGNATURE};
use crate::serve::Served;
use crate::tf_proto::serving::model_service_server::ModelService;
use crate::tf_proto::serving::model_spec::VersionChoice;
use crate::tf_proto::serving::prediction_service_server::PredictionService;
use crate::tf_proto::serving::{
    GetModelMetadataRequest, GetModelMetadataResponse, GetModelStatusRequest, GetModelStatusResponse, ModelSpec,
    ModelVersionStatus, PredictRequest, PredictResponse, SignatureDefMap, StatusProto,
};
use crate::tf_proto::{tensor_shape_proto, DataType, SignatureDef, TensorInfo, TensorProto, TensorShapeProto};

pub struct Predictions(pub Arc<App>);
pub struct Models(pub Arc<App>);

/// The `method_name` of a prediction signature.
const PREDICT_METHOD: &str = "tensorflow/serving/predict";

#[tonic::async_trait]
impl PredictionService for Predictions {
    async fn predict(&self, req: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let start = Instant::now();
        let result = predict(&self.0, req.into_inner()).await;
        finish(&self.0, "predict", start, result)
    }

    async fn get_model_metadata(
        &self,
        req: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let start = Instant::now();
        let result = metadata(&self.0, req.into_inner());
        finish(&self.0, "metadata", start, result)
    }
}

#[tonic::async_trait]
impl ModelService for Models {
    async fn get_model_status(
        &self,
        req: Request<GetModelStatusRequest>,
    ) -> Result<Response<GetModelStatusResponse>, Status> {
        let start = Instant::now();
        let result = model_status(&self.0, req.into_inner());
        finish(&self.0, "status", start, result)
    }
}

/// The version a model spec names, its name, and a refusal of a signature
/// the export lacks (an export has one, `serving_default`, which an empty
/// name means).
fn served_of(app: &App, spec: Option<&ModelSpec>) -> Result<Arc<Served>, ApiError> {
    let Some(spec) = spec else {
        return bad("the request has no model_spec");
    };
    if !(spec.signature_name.is_empty() || spec.signature_name == SIGNATURE) {
        return bad(format!(
            "signature_name `{}` is not a signature of this model (it has `{SIGNATURE}`)",
            spec.signature_name
        ));
    }
    let version;
    let which = match &spec.version_choice {
        None => Selector::Latest,
        Some(VersionChoice::Version(v)) => {
            version = v.to_string();
            Selector::Version(&version)
        }
        Some(VersionChoice::VersionLabel(l)) => Selector::Label(l),
    };
    app.model(&spec.name, which)
}

fn spec_of(app: &App, served: &Served) -> ModelSpec {
    ModelSpec {
        name: app.name.clone(),
        version_choice: Some(VersionChoice::Version(served.version as i64)),
        signature_name: SIGNATURE.to_string(),
    }
}

async fn predict(app: &App, req: PredictRequest) -> Result<PredictResponse, ApiError> {
    let served = served_of(app, req.model_spec.as_ref())?;
    if req.inputs.is_empty() {
        return bad("the request has no inputs");
    }
    // Each tensor as a KServe v2 one, so that one reader checks shapes
    // (`[rows]`, `[rows, 1]`, a multi-value input's `[rows, values]`) and
    // values for both protocols; a scalar is one row.
    let tensors: Vec<Value> = req
        .inputs
        .iter()
        .map(|(name, t)| {
            let data = tensor_values(name, t)?;
            let dims: Vec<i64> = t
                .tensor_shape
                .as_ref()
                .map_or_else(Vec::new, |s| s.dim.iter().map(|d| d.size).collect());
            let shape = if dims.is_empty() { vec![1] } else { dims };
            Ok(json!({ "name": name, "datatype": v2_name(t.dtype), "shape": shape, "data": data }))
        })
        .collect::<Result<_, ApiError>>()?;
    let raw = request::kserve_v2(&json!({ "inputs": tensors }), &served.model)?;
    let rows = raw.num_rows;
    let names = output_names(&served);
    for f in &req.output_filter {
        known_output(&names, f)?;
    }
    let scores = app.score(served.clone(), raw).await?;
    let outputs: HashMap<String, TensorProto> = names
        .into_iter()
        .zip(output_columns(&scores))
        .filter(|(n, _)| req.output_filter.is_empty() || req.output_filter.contains(n))
        .map(|(n, values)| {
            let t = TensorProto {
                dtype: DataType::DtFloat as i32,
                tensor_shape: Some(shape(&[rows as i64])),
                float_val: values,
                ..TensorProto::default()
            };
            (n, t)
        })
        .collect();
    Ok(PredictResponse {
        model_spec: Some(spec_of(app, &served)),
        outputs,
    })
}

fn shape(dims: &[i64]) -> TensorShapeProto {
    TensorShapeProto {
        dim: dims
            .iter()
            .map(|&size| tensor_shape_proto::Dim {
                size,
                name: String::new(),
            })
            .collect(),
        unknown_rank: false,
    }
}

/// The KServe v2 datatype of a TensorProto's type that `tensor_values`
/// reads (integers of any width read as INT64 values).
fn v2_name(dtype: i32) -> &'static str {
    match DataType::try_from(dtype) {
        Ok(DataType::DtString) => "BYTES",
        Ok(DataType::DtFloat) => "FP32",
        Ok(DataType::DtDouble) => "FP64",
        Ok(DataType::DtBool) => "BOOL",
        _ => "INT64",
    }
}

/// A tensor's values in row-major order, from its typed list or its
/// `tensor_content`.
fn tensor_values(name: &str, t: &TensorProto) -> Result<Vec<Value>, ApiError> {
    let dtype = DataType::try_from(t.dtype).ok();
    let content = &t.tensor_content;
    macro_rules! from_content {
        ($ty:ty, $width:expr) => {{
            if !content.len().is_multiple_of($width) {
                return bad(format!(
                    "input `{name}`: tensor_content of {} bytes is not a whole number of {}-byte values",
                    content.len(),
                    $width
                ));
            }
            content
                .chunks_exact($width)
                .map(|c| Value::from(<$ty>::from_le_bytes(c.try_into().expect("width"))))
                .collect()
        }};
    }
    Ok(match dtype {
        Some(DataType::DtString) => t
            .string_val
            .iter()
            .map(|b| match std::str::from_utf8(b) {
                Ok(s) => Ok(Value::String(s.to_string())),
                Err(_) => bad(format!("input `{name}`: a string value is not UTF-8 text")),
            })
            .collect::<Result<_, _>>()?,
        Some(DataType::DtInt64) if !content.is_empty() => from_content!(i64, 8),
        Some(DataType::DtInt64) => t.int64_val.iter().map(|&x| Value::from(x)).collect(),
        Some(DataType::DtInt32) if !content.is_empty() => from_content!(i32, 4),
        Some(DataType::DtInt16) if !content.is_empty() => from_content!(i16, 2),
        Some(DataType::DtInt8) if !content.is_empty() => from_content!(i8, 1),
        Some(DataType::DtUint8) if !content.is_empty() => from_content!(u8, 1),
        Some(DataType::DtUint16) if !content.is_empty() => from_content!(u16, 2),
        Some(DataType::DtInt32 | DataType::DtInt16 | DataType::DtInt8 | DataType::DtUint8 | DataType::DtUint16) => {
            t.int_val.iter().map(|&x| Value::from(x)).collect()
        }
        Some(DataType::DtUint32) if !content.is_empty() => from_content!(u32, 4),
        Some(DataType::DtUint32) => t.uint32_val.iter().map(|&x| Value::from(x)).collect(),
        Some(DataType::DtUint64) if !content.is_empty() => from_content!(u64, 8),
        Some(DataType::DtUint64) => t.uint64_val.iter().map(|&x| Value::from(x)).collect(),
        Some(DataType::DtFloat) if !content.is_empty() => from_content!(f32, 4),
        Some(DataType::DtFloat) => t.float_val.iter().map(|&x| Value::from(x)).collect(),
        Some(DataType::DtDouble) if !content.is_empty() => from_content!(f64, 8),
        Some(DataType::DtDouble) => t.double_val.iter().map(|&x| Value::from(x)).collect(),
        Some(DataType::DtBool) if !content.is_empty() => content.iter().map(|&b| Value::Bool(b != 0)).collect(),
        Some(DataType::DtBool) => t.bool_val.iter().map(|&b| Value::Bool(b)).collect(),
        other => {
            let named = other.map_or_else(|| format!("dtype {}", t.dtype), |d| d.as_str_name().to_string());
            return bad(format!(
                "input `{name}`: {named} is not read here: send strings, integers, floats or booleans"
            ));
        }
    })
}

fn metadata(app: &App, req: GetModelMetadataRequest) -> Result<GetModelMetadataResponse, ApiError> {
    let served = served_of(app, req.model_spec.as_ref())?;
    if req.metadata_field.is_empty() {
        return bad("GetModelMetadataRequest must name at least one metadata_field (`signature_def`)");
    }
    if let Some(f) = req.metadata_field.iter().find(|f| *f != "signature_def") {
        return bad(format!("metadata field `{f}` is not served: only `signature_def` is"));
    }
    let info = |name: &str, dtype: DataType| TensorInfo {
        encoding: Some(crate::tf_proto::tensor_info::Encoding::Name(format!("{name}:0"))),
        dtype: dtype as i32,
        tensor_shape: Some(shape(&[-1])),
    };
    let inputs = request::request_inputs(&served.model)
        .into_iter()
        .map(|(n, ty)| {
            let t = info(&n, tf_dtype(ty));
            (n, t)
        })
        .collect();
    let outputs = output_names(&served)
        .into_iter()
        .map(|n| {
            let t = info(&n, DataType::DtFloat);
            (n, t)
        })
        .collect();
    let map = SignatureDefMap {
        signature_def: HashMap::from([(
            SIGNATURE.to_string(),
            SignatureDef {
                inputs,
                outputs,
                method_name: PREDICT_METHOD.to_string(),
            },
        )]),
    };
    let any = prost_types::Any {
        type_url: "type.googleapis.com/tensorflow.serving.SignatureDefMap".to_string(),
        value: prost::Message::encode_to_vec(&map),
    };
    Ok(GetModelMetadataResponse {
        model_spec: Some(spec_of(app, &served)),
        metadata: HashMap::from([("signature_def".to_string(), any)]),
    })
}

/// Every version seen with its state, or the one asked for (by version or
/// label, served or not).
fn model_status(app: &App, req: GetModelStatusRequest) -> Result<GetModelStatusResponse, ApiError> {
    let Some(spec) = req.model_spec.as_ref() else {
        return bad("the request has no model_spec");
    };
    app.model(&spec.name, Selector::Latest)?;
    let asked = match &spec.version_choice {
        None => None,
        Some(VersionChoice::Version(v)) => Some(*v),
        Some(VersionChoice::VersionLabel(l)) => Some(app.model(&spec.name, Selector::Label(l))?.version as i64),
    };
    let list: Vec<ModelVersionStatus> = app
        .registry
        .states()
        .into_iter()
        .filter(|(v, _)| asked.is_none_or(|a| a == *v as i64))
        .map(|(v, st)| {
            let (state, error) = tf_version_state(st);
            ModelVersionStatus {
                version: v as i64,
                state: state as i32,
                status: Some(StatusProto {
                    // tensorflow.error.Code: OK, or UNKNOWN for a failed load.
                    error_code: if error.is_some() { 2 } else { 0 },
                    error_message: error.unwrap_or_default(),
                }),
            }
        })
        .collect();
    if list.is_empty() {
        return Err(ApiError(
            axum::http::StatusCode::NOT_FOUND,
            format!(
                "version {} of `{}` was never seen",
                asked.unwrap_or_default(),
                spec.name
            ),
        ));
    }
    Ok(GetModelStatusResponse {
        model_version_status: list,
    })
}
