//! A Parquet input file: its metadata, then every row group read into the
//! projected columns.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rustrec::config::data_plan::ColumnType;
use rustrec::data::parquet::{row_groups, ParquetChunks};

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let path = scratch().join("x.parquet");
    std::fs::write(&path, data).expect("scratch write");
    let Ok(groups) = row_groups(&path) else {
        return;
    };
    let projection = projection(&[("label", ColumnType::Int, true), ("user", ColumnType::Str, false)]);
    for g in 0..groups.min(16) {
        if let Ok(chunks) = ParquetChunks::open(&path, g, &projection, 64) {
            for chunk in chunks {
                if chunk.is_err() {
                    break;
                }
            }
        }
    }
});
