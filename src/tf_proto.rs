//! TensorFlow's protos this crate reads: the checkpoint index entries
//! (`checkpoint::tensorflow`), tf.Example records (`data::tfrecord`), and
//! TF Serving's gRPC API (`serving`, for `serve::grpc`).

#![allow(clippy::all, clippy::pedantic)]
include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));

/// TF Serving's gRPC messages and services (package `tensorflow.serving`).
pub mod serving {
    #![allow(clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/tensorflow.serving.rs"));
}
