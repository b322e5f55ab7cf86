//! Writes the seed corpora of the fuzz targets (`make fuzz`) from the test
//! data and small files made here with the crate's own writers: one
//! directory per target under the directory given.
//!
//! `cargo run --example fuzz_seeds -- fuzz/corpus`

use std::path::{Path, PathBuf};

use prost::Message;
use rustrec::checkpoint::TensorRef;
use rustrec::data::tfrecord::{compress, write_record};
use rustrec::tf_proto::{feature::Kind, BytesList, Example, Feature, Features, FloatList, Int64List};

fn put(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("corpus directory");
    std::fs::write(dir.join(name), bytes).expect("seed written");
}

/// The two-file form the tf_checkpoint target reads: the index's length,
/// the index, the data file (cut at `keep` bytes).
fn two_files(index: &Path, data: &Path, keep: usize) -> Vec<u8> {
    let index = std::fs::read(index).expect("test checkpoint index");
    let data = std::fs::read(data).expect("test checkpoint data");
    let mut out = (index.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&index);
    out.extend_from_slice(&data[..data.len().min(keep)]);
    out
}

fn example(label: i64, user: &str, price: f32) -> Vec<u8> {
    let f = |k: Kind| Feature { kind: Some(k) };
    let feature = [
        (
            "label".to_string(),
            f(Kind::Int64List(Int64List { value: vec![label] })),
        ),
        (
            "user".to_string(),
            f(Kind::BytesList(BytesList {
                value: vec![user.as_bytes().to_vec()],
            })),
        ),
        (
            "price".to_string(),
            f(Kind::FloatList(FloatList { value: vec![price] })),
        ),
    ]
    .into();
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tests = root.join("tests/data");

    // TensorFlow checkpoints: a partitioned one whole, EasyRec's FM cut.
    let tf = out.join("tf_checkpoint");
    let files = |prefix: &str| {
        let p = tests.join(prefix);
        let with = |suffix: &str| PathBuf::from(format!("{}{suffix}", p.display()));
        (with(".index"), with(".data-00000-of-00001"))
    };
    let (index, data) = files("tf_partitioned/model.ckpt-7");
    put(&tf, "partitioned", &two_files(&index, &data, usize::MAX));
    let (index, data) = files("easyrec_fm/model/model.ckpt-100");
    put(&tf, "easyrec_fm", &two_files(&index, &data, 4096));

    // TFRecord: plain, gzip and zlib (the first byte picks the mode).
    let mut records = Vec::new();
    for (i, user) in ["u1", "u2", "u3"].iter().enumerate() {
        write_record(&mut records, &example(i as i64 % 2, user, 0.5 * i as f32)).expect("in memory");
    }
    let rec = out.join("tfrecord");
    for (mode, c) in [
        (0u8, rustrec::config::data_plan::Compression::None),
        (2, rustrec::config::data_plan::Compression::Gzip),
        (4, rustrec::config::data_plan::Compression::Zlib),
    ] {
        let mut seed = vec![mode];
        seed.extend(compress(&records, c));
        put(&rec, &format!("mode{mode}"), &seed);
    }

    // Safetensors: two small tensors.
    let st = out.join("safetensors");
    let tmp = std::env::temp_dir().join(format!("fuzz-seed-{}.safetensors", std::process::id()));
    let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [0.5f32; 3]);
    rustrec::checkpoint::write_file(
        &tmp,
        &[TensorRef::new("w", vec![2, 2], &a), TensorRef::new("b", vec![3], &b)],
    )
    .expect("safetensors written");
    put(&st, "two_tensors", &std::fs::read(&tmp).expect("read back"));
    let _ = std::fs::remove_file(&tmp);

    // Configs: every sample config.
    let cfg = out.join("config");
    for e in std::fs::read_dir(root.join("samples")).expect("samples").flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "config") {
            put(
                &cfg,
                &e.file_name().to_string_lossy(),
                &std::fs::read(&p).expect("sample config"),
            );
        }
    }

    // CSV rows of the csv target's columns.
    put(
        &out.join("csv"),
        "rows",
        b"label,user,price\n1,u1,0.5\n0,\"u,2\",1e3\n1,u3,\n",
    );

    // Parquet: the criteo sample's shape is not the target's; write one.
    let pq = out.join("parquet");
    let path = std::env::temp_dir().join(format!("fuzz-seed-{}.parquet", std::process::id()));
    {
        use arrow_array::{Int64Array, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("label", DataType::Int64, false),
            Field::new("user", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 0, 1])),
                Arc::new(StringArray::from(vec![Some("u1"), None, Some("u3")])),
            ],
        )
        .expect("batch");
        let f = std::fs::File::create(&path).expect("seed file");
        let mut w = parquet::arrow::ArrowWriter::try_new(f, schema, None).expect("writer");
        w.write(&batch).expect("written");
        w.close().expect("closed");
    }
    put(&pq, "three_rows", &std::fs::read(&path).expect("read back"));
    let _ = std::fs::remove_file(&path);

    // Requests: TF Serving's row and column forms, KServe v2.
    let req = out.join("serve_request");
    put(
        &req,
        "instances",
        br#"{"instances": [{"user": "u1", "price": 0.5}, {"user": "u2"}]}"#,
    );
    put(
        &req,
        "inputs",
        br#"{"signature_name": "serving_default", "inputs": {"user": ["u1", "u2"]}}"#,
    );
    put(
        &req,
        "v2",
        br#"{"inputs": [{"name": "user", "shape": [2], "datatype": "BYTES", "data": ["u1", "u2"]}]}"#,
    );
    println!("seeds written under {}", out.display());
}
