"""Scores rows through `serve` with the ecosystem's own clients, unchanged.

    official_clients.py triton HTTP_ADDR GRPC_ADDR DATA.csv FIELDS
    official_clients.py tfserving GRPC_ADDR DATA.csv FIELDS

`triton` uses tritonclient (HTTP and gRPC, tensors set with
set_data_from_numpy, so binary tensor data on HTTP and raw_input_contents
on gRPC); `tfserving` uses grpcio with TF Serving's own protos
(tensorflow-serving-api, tensors from tf.make_tensor_proto). Each reads the
model's inputs and their types from the server's metadata, checks the
other calls a client makes (readiness, configuration, statistics,
repository index; model status, a refused signature), scores DATA.csv (no
header; FIELDS names its columns, comma-separated) in requests of 100 rows
and prints {"<client>": {"<output>": [scores...]}} as JSON on stdout. Any
failed check raises (exit status 1).
"""

import csv
import json
import os
import sys

BATCH = 100


def read_rows(path, fields):
    with open(path, newline="") as f:
        return [dict(zip(fields, r)) for r in csv.reader(f)]


def typed(values, datatype):
    """The CSV cells as the metadata's type says the input is sent."""
    import numpy as np

    if datatype in ("BYTES", "DT_STRING"):
        return np.array([v.encode() for v in values], dtype=np.object_)
    if datatype in ("INT64", "DT_INT64"):
        return np.array([int(v) for v in values], dtype=np.int64)
    if datatype in ("FP64", "DT_DOUBLE"):
        return np.array([float(v) for v in values], dtype=np.float64)
    if datatype in ("BOOL", "DT_BOOL"):
        return np.array([v.lower() in ("1", "true") for v in values], dtype=np.bool_)
    raise AssertionError(f"unexpected input type {datatype}")


def batches(rows):
    for at in range(0, len(rows), BATCH):
        yield rows[at:at + BATCH]


def triton(http_addr, grpc_addr, rows):
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    scores = {}
    for proto, mod, addr in (("triton_grpc", tgrpc, grpc_addr), ("triton_http", thttp, http_addr)):
        client = mod.InferenceServerClient(addr)
        assert client.is_server_live() and client.is_server_ready(), proto
        assert client.is_model_ready("model"), proto
        assert not client.is_model_ready("model", "1"), f"{proto}: version 1 is not served"
        # The gRPC client answers messages; as_json gives the HTTP form.
        as_json = {"as_json": True} if proto == "triton_grpc" else {}
        meta = client.get_model_metadata("model", **as_json)
        config = client.get_model_config("model", **as_json)
        config = config.get("config", config)
        assert [i["name"] for i in config["input"]] == [i["name"] for i in meta["inputs"]], (config, meta)
        index = client.get_model_repository_index(**as_json)
        if isinstance(index, dict):
            index = index["models"]
        assert any(m["name"] == "model" and m.get("state") == "READY" for m in index), index
        outputs = [o["name"] for o in meta["outputs"]]
        got = {o: [] for o in outputs}
        for part in batches(rows):
            tensors = []
            for i in meta["inputs"]:
                t = mod.InferInput(i["name"], [len(part)], i["datatype"])
                t.set_data_from_numpy(typed([r[i["name"]] for r in part], i["datatype"]))
                tensors.append(t)
            result = client.infer("model", tensors)
            for o in outputs:
                got[o].extend(float(x) for x in result.as_numpy(o))
        stats = client.get_inference_statistics("model", **as_json)
        success = stats["model_stats"][0]["inference_stats"]["success"]
        assert int(success["count"]) >= (len(rows) + BATCH - 1) // BATCH, stats
        scores[proto] = got
    return scores


def tfserving(grpc_addr, rows):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import grpc
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc)

    channel = grpc.insecure_channel(grpc_addr)
    predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    models = model_service_pb2_grpc.ModelServiceStub(channel)

    status_req = get_model_status_pb2.GetModelStatusRequest()
    status_req.model_spec.name = "model"
    status = models.GetModelStatus(status_req, timeout=30)
    available = [s.version for s in status.model_version_status
                 if s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE]
    assert available, status

    meta_req = get_model_metadata_pb2.GetModelMetadataRequest()
    meta_req.model_spec.name = "model"
    meta_req.metadata_field.append("signature_def")
    meta = predictions.GetModelMetadata(meta_req, timeout=30)
    assert meta.model_spec.version.value in available, (meta.model_spec, available)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(signatures)
    signature = signatures.signature_def["serving_default"]
    assert signature.method_name == "tensorflow/serving/predict", signature

    outputs = list(signature.outputs.keys())
    got = {o: [] for o in outputs}
    for part in batches(rows):
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "model"
        req.model_spec.signature_name = "serving_default"
        for name, info in signature.inputs.items():
            dtype = tf.dtypes.as_dtype(info.dtype)
            values = typed([r[name] for r in part], types_pb2.DataType.Name(info.dtype))
            req.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=dtype))
        answer = predictions.Predict(req, timeout=30)
        for o in outputs:
            got[o].extend(float(x) for x in tf.make_ndarray(answer.outputs[o]))

    req.model_spec.signature_name = "no_such_signature"
    try:
        predictions.Predict(req, timeout=30)
        raise AssertionError("an unknown signature_name was answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    return {"tfserving_grpc": got}


def main():
    mode = sys.argv[1]
    if mode == "triton":
        http_addr, grpc_addr, data, fields = sys.argv[2:6]
        scores = triton(http_addr, grpc_addr, read_rows(data, fields.split(",")))
    elif mode == "tfserving":
        grpc_addr, data, fields = sys.argv[2:5]
        scores = tfserving(grpc_addr, read_rows(data, fields.split(",")))
    else:
        raise SystemExit(f"unknown mode {mode}")
    json.dump(scores, sys.stdout)


if __name__ == "__main__":
    main()
