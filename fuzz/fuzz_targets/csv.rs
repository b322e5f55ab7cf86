//! A CSV input file (with a header) read into the projected columns.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rustrec::config::data_plan::ColumnType;
use rustrec::data::csv::CsvChunks;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let path = scratch().join("x.csv");
    std::fs::write(&path, data).expect("scratch write");
    let projection = projection(&[
        ("label", ColumnType::Int, true),
        ("user", ColumnType::Str, false),
        ("price", ColumnType::Float, false),
    ]);
    let names: Vec<String> = ["label", "user", "price"].map(String::from).to_vec();
    if let Ok(chunks) = CsvChunks::open(&path, ",", true, &names, &projection, 64) {
        for chunk in chunks {
            if chunk.is_err() {
                break;
            }
        }
    }
});
