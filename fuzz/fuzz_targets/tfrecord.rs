//! A TFRecord file of tf.Examples (and, by the first byte, of
//! BatchTFRecordInput's SequenceExamples of 2 rows), read into columns.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rustrec::config::data_plan::{ColumnType, Compression};
use rustrec::data::tfrecord::TfRecordChunks;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let path = scratch().join("x.tfrecord");
    std::fs::write(&path, bytes).expect("scratch write");
    let projection = projection(&[
        ("label", ColumnType::Int, true),
        ("user", ColumnType::Str, false),
        ("price", ColumnType::Float, false),
    ]);
    let rows = (mode & 1 == 1).then_some(2);
    let compression = match mode >> 1 & 3 {
        1 => Compression::Gzip,
        2 => Compression::Zlib,
        _ => Compression::None,
    };
    if let Ok(chunks) = TfRecordChunks::open(&path, (compression, rows), &projection, 64) {
        for chunk in chunks {
            if chunk.is_err() {
                break;
            }
        }
    }
});
