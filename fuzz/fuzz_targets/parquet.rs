//! A Parquet input file: its metadata, then every row group read into the
//! projected columns.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rustrec::config::data_plan::ColumnType;
use rustrec::data::parquet::{row_groups, ParquetChunks};

include!("common.rs");

/// The parquet crate panics on some malformed pages; our reader catches
/// that (`ParquetChunks::next`) and returns an error. libFuzzer's hook
/// aborts at any panic, caught or not: it is replaced by one that only
/// prints, and a panic that escapes our reader still ends the run (the
/// fuzz target's own catch aborts on it).
fn catch_inside_the_reader() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::panic::set_hook(Box::new(|info| eprintln!("caught inside the reader: {info}"))));
}

fuzz_target!(|data: &[u8]| {
    catch_inside_the_reader();
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
