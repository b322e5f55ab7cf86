//! Parity with TensorFlow and EasyRec on facts computed by them (in the
//! shared `data/compat` folder).

mod common;

use rustrec::features::{hash_bucket_i64, hash_bucket_str};

/// `hash_bucket_size` ids land in the rows TensorFlow's
/// string_to_hash_bucket_fast puts them in: strings, and integers through
/// their decimal text.
#[test]
fn hashed_ids_match_tensorflow_buckets() {
    let path = common::shared_dir().join("data/compat/tf_hash_buckets.json");
    let facts: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = facts["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut wrong = Vec::new();
    for c in cases {
        let n = c["num_buckets"].as_u64().unwrap();
        let want = c["bucket"].as_u64().unwrap();
        let (what, got) = match (c["input"].as_str(), c["input_int64"].as_i64()) {
            (Some(s), _) => (format!("{s:?}"), hash_bucket_str(s, n)),
            (None, Some(v)) => (format!("int64 {v}"), hash_bucket_i64(v, n)),
            _ => panic!("case without input: {c}"),
        };
        if got != want {
            wrong.push(format!("{what} mod {n}: {got}, TensorFlow {want}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}
