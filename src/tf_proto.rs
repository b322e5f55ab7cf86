//! TensorFlow's protos this crate reads: the checkpoint index entries
//! (`checkpoint::tensorflow`) and tf.Example records (`data::tfrecord`).

#![allow(clippy::all, clippy::pedantic)]
include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));
