//! Compiles protos/ with the pure-Rust `protox` compiler (no protoc needed),
//! generates prost structs from the descriptors and keeps the encoded
//! descriptor set so the config loader can reflect over the same schema.
//! The ONNX schema is compiled the same way, for the exporter, and the
//! entries of TensorFlow's checkpoint index, for reading EasyRec's checkpoints,
//! the parameter-server messages of asynchronous training, and the gRPC
//! services of `serve` (TF Serving's and KServe v2's, with tonic).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=protos");
    let proto_dir = PathBuf::from("protos");
    let files: Vec<PathBuf> = std::fs::read_dir(proto_dir.join("easy_rec"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "proto"))
        .collect();
    let fds = protox::compile(&files, [&proto_dir])?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let bytes = prost::Message::encode_to_vec(&fds);
    std::fs::write(out_dir.join("easyrec_descriptor.bin"), bytes)?;

    prost_build::Config::new().out_dir(&out_dir).compile_fds(fds)?;

    // The ONNX model format, for `export` (vendored from the ONNX project, MIT).
    let onnx = protox::compile([proto_dir.join("onnx/onnx.proto")], [&proto_dir])?;
    prost_build::Config::new().out_dir(&out_dir).compile_fds(onnx)?;

    // TensorFlow's checkpoint index entries, to read EasyRec's checkpoints,
    // tf.Example, to read TFRecord input, and TF Serving's gRPC API with the
    // tensors it carries, for `serve` (one package, one module, compiled
    // together so that neither half overwrites the other's module).
    let tensorflow = protox::compile(
        [
            proto_dir.join("tensorflow/tensor_bundle.proto"),
            proto_dir.join("tensorflow/example.proto"),
            proto_dir.join("tensorflow/tensor.proto"),
            proto_dir.join("tensorflow/meta_graph.proto"),
            proto_dir.join("tensorflow_serving/apis.proto"),
        ],
        [&proto_dir],
    )?;
    tonic_prost_build::configure()
        .out_dir(&out_dir)
        .emit_rerun_if_changed(false)
        .compile_fds(tensorflow)?;

    // KServe's v2 gRPC protocol with Triton's extensions, for `serve`.
    let kserve = protox::compile([proto_dir.join("inference/grpc_service.proto")], [&proto_dir])?;
    tonic_prost_build::configure()
        .out_dir(&out_dir)
        .emit_rerun_if_changed(false)
        .compile_fds(kserve)?;

    // The messages between workers and servers of asynchronous training.
    let ps = protox::compile([proto_dir.join("rustrec/ps.proto")], [&proto_dir])?;
    prost_build::Config::new().out_dir(&out_dir).compile_fds(ps)?;
    Ok(())
}
