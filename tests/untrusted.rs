//! Files written elsewhere, crafted to break us (issue: bounded readers):
//! TensorFlow checkpoints with impossible shapes or a block listed many
//! times, TFRecord records claiming huge lengths, configs whose sizes
//! cannot fit, devices where files belong, outputs pointed at checkpoints
//! or pipes. Every binary runs under an address-space limit (`ulimit -v`),
//! so an unbounded allocation fails the test instead of the machine; each
//! case must end with exit 1, a message naming the file, field or record,
//! and nothing replaced.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use prost::Message;
use rustrec::tf_proto::{
    tensor_shape_proto::Dim, tensor_slice_proto::extent::HasLength, tensor_slice_proto::Extent, BundleEntryProto,
    BundleHeaderProto, TensorShapeProto, TensorSliceProto,
};

/// The address space each binary may use (KiB for `ulimit -v`): far below
/// what any crafted size asks for, far above what the cases need.
const LIMIT_KIB: u64 = 6 << 20;

/// Runs `bin args` under the address-space limit.
fn run(bin: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(bin)
        .args(args);
    cmd.output().unwrap()
}

/// Asserts exit 1 without a panic and that stderr mentions every needle.
fn user_error(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks `{n}`:\n{stderr}");
    }
    stderr
}

// ---- a TensorFlow tensor bundle, written as TensorFlow lays it out ----

fn masked(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A table block of `entries` (no shared key prefixes, one restart point).
fn block(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (k, v) in entries {
        varint(&mut b, 0);
        varint(&mut b, k.len() as u64);
        varint(&mut b, v.len() as u64);
        b.extend_from_slice(k);
        b.extend_from_slice(v);
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b
}

/// Appends `body` with its trailer (no compression, masked CRC); returns
/// its handle.
fn put_block(file: &mut Vec<u8>, body: &[u8]) -> (u64, u64) {
    let at = file.len() as u64;
    file.extend_from_slice(body);
    let mut typed = body.to_vec();
    typed.push(0);
    file.push(0);
    file.extend_from_slice(&masked(&typed).to_le_bytes());
    (at, body.len() as u64)
}

/// An index file whose one data block holds `entries` (sorted by the
/// caller), listed `listings` times by the index block.
fn index_file(entries: &[(Vec<u8>, Vec<u8>)], listings: usize) -> Vec<u8> {
    let mut file = Vec::new();
    let (off, size) = put_block(&mut file, &block(entries));
    let mut handle = Vec::new();
    varint(&mut handle, off);
    varint(&mut handle, size);
    let index: Vec<(Vec<u8>, Vec<u8>)> = (0..listings)
        .map(|i| (format!("~{i:08}").into_bytes(), handle.clone()))
        .collect();
    let (ioff, isize) = put_block(&mut file, &block(&index));
    let mut footer = Vec::new();
    varint(&mut footer, 0);
    varint(&mut footer, 0);
    varint(&mut footer, ioff);
    varint(&mut footer, isize);
    footer.resize(40, 0);
    footer.extend_from_slice(&0xdb47_7524_8b80_fb57u64.to_le_bytes());
    file.extend_from_slice(&footer);
    file
}

fn header() -> (Vec<u8>, Vec<u8>) {
    let h = BundleHeaderProto {
        num_shards: 1,
        ..Default::default()
    };
    (Vec::new(), h.encode_to_vec())
}

fn entry(name: &str, shape: &[i64], (offset, data): (i64, &[u8]), slices: Vec<TensorSliceProto>) -> (Vec<u8>, Vec<u8>) {
    let e = BundleEntryProto {
        dtype: 1,
        shape: Some(TensorShapeProto {
            dim: shape
                .iter()
                .map(|&size| Dim {
                    size,
                    name: String::new(),
                })
                .collect(),
            unknown_rank: false,
        }),
        shard_id: 0,
        offset,
        size: data.len() as i64,
        crc32c: masked(data),
        slices,
    };
    (name.as_bytes().to_vec(), e.encode_to_vec())
}

/// Writes checkpoint `prefix` of `entries` and `data` (its one data file).
fn write_checkpoint(prefix: &Path, entries: &[(Vec<u8>, Vec<u8>)], data: &[u8], listings: usize) {
    std::fs::write(format!("{}.index", prefix.display()), index_file(entries, listings)).unwrap();
    std::fs::write(format!("{}.data-00000-of-00001", prefix.display()), data).unwrap();
}

fn inspect(prefix: &Path) -> Output {
    run(
        env!("CARGO_BIN_EXE_inspect_checkpoint"),
        &["--checkpoint_path", prefix.to_str().unwrap()],
    )
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn a_sound_crafted_checkpoint_is_listed() {
    // The writer above is right: a checkpoint it writes is read back.
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("model.ckpt-1");
    let w = floats(&[1.0, 2.0, 3.0, 4.0]);
    write_checkpoint(&prefix, &[header(), entry("w", &[2, 2], (0, &w), vec![])], &w, 1);
    let out = inspect(&prefix);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("w\tfloat32\t[2, 2]"));
}

#[test]
fn checkpoint_shapes_past_memory_or_addressing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A shape whose product overflows 64 bits.
    let prefix = dir.path().join("overflow");
    let w = floats(&[1.0]);
    write_checkpoint(
        &prefix,
        &[header(), entry("w", &[1 << 40, 1 << 40], (0, &w), vec![])],
        &w,
        1,
    );
    user_error(&inspect(&prefix), &["overflow.index", "`w`", "shape"]);
    // A partitioned variable claiming 2^40 rows from one small slice.
    let prefix = dir.path().join("partitioned");
    let slice = TensorSliceProto {
        extent: vec![
            Extent {
                start: 0,
                has_length: Some(HasLength::Length(1)),
            },
            Extent {
                start: 0,
                has_length: None,
            },
        ],
    };
    write_checkpoint(
        &prefix,
        &[header(), entry("emb", &[1 << 40, 4], (0, &[]), vec![slice])],
        &[],
        1,
    );
    user_error(&inspect(&prefix), &["partitioned", "`emb`"]);
    // A negative dimension.
    let prefix = dir.path().join("negative");
    write_checkpoint(&prefix, &[header(), entry("w", &[-3, 2], (0, &w), vec![])], &w, 1);
    user_error(&inspect(&prefix), &["negative.index", "negative dimension"]);
}

#[test]
fn an_index_listing_one_block_many_times_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("model.ckpt-1");
    let w = floats(&[1.0, 2.0]);
    write_checkpoint(&prefix, &[header(), entry("w", &[2], (0, &w), vec![])], &w, 5000);
    let started = std::time::Instant::now();
    user_error(&inspect(&prefix), &["model.ckpt-1.index", "twice"]);
    assert!(started.elapsed().as_secs() < 30);
}

#[test]
fn a_damaged_slot_tensor_fails_inspection() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("model.ckpt-1");
    let mut data = floats(&[1.0, 2.0]);
    let slot = floats(&[0.5, 0.5]);
    let (w, s) = (data.clone(), slot.clone());
    data.extend_from_slice(&slot);
    let entries = [
        header(),
        entry("w", &[2], (0, &w), vec![]),
        entry("w/Adam", &[2], (8, &s), vec![]),
    ];
    data[9] ^= 0x40; // the slot's bytes, after its checksum was taken
    write_checkpoint(&prefix, &entries, &data, 1);
    user_error(&inspect(&prefix), &["w/Adam", "checksum"]);
}

// ---- TFRecord input ----

const TF_CONFIG: &str = r#"
train_input_path: "DATA"
eval_input_path: "DATA"
model_dir: "MODEL"
train_config {
  optimizer_config { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } } }
  num_steps: 2
}
eval_config { metrics_set { auc {} } }
data_config {
  input_type: TFRecordInput
  batch_size: 2
  input_fields { input_name: "label" input_type: INT32 default_val: "0" }
  input_fields { input_name: "user" input_type: STRING }
  label_fields: "label"
}
feature_config {
  features { input_names: "user" feature_type: IdFeature embedding_dim: 4 hash_bucket_size: 100 }
}
model_config {
  model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: "user" wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: "user" wide_deep: DEEP }
  deepfm { dnn { hidden_units: [4] } final_dnn { hidden_units: [2] } }
}
"#;

fn tf_config(dir: &Path, data: &Path) -> PathBuf {
    let p = dir.join("tf.config");
    let text = TF_CONFIG
        .replace("DATA", data.to_str().unwrap())
        .replace("MODEL", dir.join("model").to_str().unwrap());
    std::fs::write(&p, text).unwrap();
    p
}

fn example(fields: &[(&str, &str)]) -> Vec<u8> {
    use rustrec::tf_proto::{feature::Kind, BytesList, Example, Feature, Features};
    let feature = fields
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                Feature {
                    kind: Some(Kind::BytesList(BytesList {
                        value: vec![v.as_bytes().to_vec()],
                    })),
                },
            )
        })
        .collect();
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}

fn train(cfg: &Path) -> Output {
    run(
        env!("CARGO_BIN_EXE_train_eval"),
        &["--pipeline_config_path", cfg.to_str().unwrap()],
    )
}

#[test]
fn tfrecord_lengths_past_the_file_are_refused_naming_it() {
    for len in [1u64 << 62, u64::MAX, 1 << 29] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("crafted.tfrecord");
        let mut bytes = Vec::new();
        rustrec::data::tfrecord::write_record(&mut bytes, &example(&[("label", "1"), ("user", "u")])).unwrap();
        let head = len.to_le_bytes();
        bytes.extend_from_slice(&head);
        bytes.extend_from_slice(&masked(&head).to_le_bytes());
        bytes.extend_from_slice(b"short");
        std::fs::write(&data, &bytes).unwrap();
        let cfg = tf_config(dir.path(), &data);
        user_error(&train(&cfg), &["crafted.tfrecord", "record 1"]);
    }
}

#[test]
fn a_record_without_its_label_is_refused_not_read_as_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("nolabel.tfrecord");
    let mut bytes = Vec::new();
    rustrec::data::tfrecord::write_record(&mut bytes, &example(&[("label", "1"), ("user", "u")])).unwrap();
    rustrec::data::tfrecord::write_record(&mut bytes, &example(&[("user", "v")])).unwrap();
    std::fs::write(&data, &bytes).unwrap();
    let cfg = tf_config(dir.path(), &data);
    user_error(&train(&cfg), &["nolabel.tfrecord", "record 1", "`label`"]);
}

// ---- sizes from a config, files where they do not belong ----

const CSV_CONFIG: &str = r#"
train_input_path: "DATA"
eval_input_path: "DATA"
model_dir: "MODEL"
train_config {
  optimizer_config { adam_optimizer { learning_rate { constant_learning_rate { learning_rate: 0.01 } } } }
  num_steps: 2
  save_checkpoints_steps: 2
}
eval_config { metrics_set { auc {} } }
data_config {
  input_type: CSVInput
  with_header: true
  batch_size: 2
  input_fields { input_name: "label" input_type: INT32 }
  input_fields { input_name: "user" input_type: STRING }
  input_fields { input_name: "hist" input_type: STRING }
  label_fields: "label"
}
feature_config {
  features { input_names: "user" feature_type: IdFeature embedding_dim: 4 hash_bucket_size: 100 }
  features { input_names: "hist" feature_type: SequenceFeature separator: "|" embedding_dim: 4 hash_bucket_size: 100 sequence_combiner { attention {} } }
}
model_config {
  model_class: "DeepFM"
  feature_groups { group_name: "wide" feature_names: "user" wide_deep: WIDE }
  feature_groups { group_name: "deep" feature_names: ["user", "hist"] wide_deep: DEEP }
  deepfm { dnn { hidden_units: [4] } final_dnn { hidden_units: [2] } }
}
"#;

struct Job {
    dir: tempfile::TempDir,
    cfg: PathBuf,
    data: PathBuf,
}

impl Job {
    fn new() -> Self {
        Self::with(("", ""))
    }

    /// A job whose config has `from` replaced by `to`.
    fn with((from, to): (&str, &str)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.csv");
        std::fs::write(&data, "label,user,hist\n1,u1,a|b\n0,u2,c\n1,u1,a\n0,u3,\n").unwrap();
        let cfg = dir.path().join("p.config");
        let text = CSV_CONFIG
            .replace("DATA", data.to_str().unwrap())
            .replace("MODEL", dir.path().join("model").to_str().unwrap());
        let text = if from.is_empty() { text } else { text.replace(from, to) };
        std::fs::write(&cfg, text).unwrap();
        Job { dir, cfg, data }
    }

    fn run(&self, bin: &str, extra: &[&str]) -> Output {
        let mut args = vec!["--pipeline_config_path", self.cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        run(bin, &args)
    }
}

#[test]
fn sizes_a_config_derives_are_in_the_memory_account() {
    // Many classes are evaluated by accuracy.
    let job = Job::with(("auc {}", "accuracy {}"));
    for (edit, field) in [
        (r#"{"model_config.num_class": 2147483647}"#, "model_config.num_class"),
        (
            r#"{"feature_config.features[1].max_seq_len": 100000000}"#,
            "feature_config.features[1].max_seq_len",
        ),
    ] {
        let out = job.run(env!("CARGO_BIN_EXE_train_eval"), &["--edit_config_json", edit]);
        user_error(&out, &[field, "memory"]);
    }
}

#[test]
fn a_device_as_vocabulary_is_refused_naming_it() {
    let job = Job::new();
    let edit =
        r#"{"feature_config.features[0].vocab_file": "/dev/zero", "feature_config.features[0].hash_bucket_size": 0}"#;
    let out = job.run(env!("CARGO_BIN_EXE_train_eval"), &["--edit_config_json", edit]);
    user_error(&out, &["/dev/zero"]);
}

#[test]
fn outputs_never_replace_checkpoints_pipes_or_leave_model_dir() {
    let job = Job::new();
    let trained = job.run(env!("CARGO_BIN_EXE_train_eval"), &[]);
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    let ckpt = job.dir.path().join("model/model.ckpt-2");
    let manifest = std::fs::read(ckpt.join("manifest.json")).unwrap();
    let eval = |path: &str| job.run(env!("CARGO_BIN_EXE_eval"), &["--eval_result_path", path]);
    user_error(&eval("model.ckpt-2/manifest.json"), &["model.ckpt-2", "checkpoint"]);
    assert_eq!(std::fs::read(ckpt.join("manifest.json")).unwrap(), manifest);
    user_error(&eval("../outside.txt"), &["--eval_result_path", "inside"]);
    user_error(&eval("/tmp/outside.txt"), &["--eval_result_path", "inside"]);
    assert!(!job.dir.path().join("outside.txt").exists());
    // An export into a checkpoint is refused too, the checkpoint untouched.
    let export_into = ckpt.join("exports");
    let out = job.run(
        env!("CARGO_BIN_EXE_export"),
        &["--export_dir", export_into.to_str().unwrap()],
    );
    user_error(&out, &["model.ckpt-2", "checkpoint"]);
    assert!(!export_into.exists());
    // A FIFO where predictions go stays a FIFO.
    let fifo = job.dir.path().join("scores.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let out = job.run(
        env!("CARGO_BIN_EXE_predict"),
        &[
            "--input_path",
            job.data.to_str().unwrap(),
            "--output_path",
            fifo.to_str().unwrap(),
        ],
    );
    user_error(&out, &["scores.fifo", "not a regular file"]);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // No temporaries left beside it.
    let left: Vec<_> = std::fs::read_dir(job.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_empty_input_directory_is_named() {
    let job = Job::new();
    let empty = job.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = job.run(
        env!("CARGO_BIN_EXE_train_eval"),
        &["--train_input_path", empty.to_str().unwrap()],
    );
    user_error(&out, &["empty"]);
}

#[test]
fn a_diverging_but_finite_run_warns_and_can_stop() {
    let job = Job::with(("learning_rate: 0.01 }", "learning_rate: 10000000000.0 }"));
    let steps = ["--edit_config_json", r#"{"train_config.num_steps": 80}"#];
    let out = job.run(env!("CARGO_BIN_EXE_train_eval"), &steps);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // Diverged so far that a value stopped being finite: exit 1 too.
        user_error(&out, &["at step"]);
        return;
    }
    assert!(stderr.contains("diverging"), "{stderr}");
    let mut args = steps.to_vec();
    args.push("--stop_on_divergence");
    let again = Job::with(("learning_rate: 0.01 }", "learning_rate: 10000000000.0 }"));
    user_error(
        &again.run(env!("CARGO_BIN_EXE_train_eval"), &args),
        &["diverging", "at step"],
    );
    assert!(!again.dir.path().join("model/model.ckpt-80").exists());
}

#[test]
fn predict_flags_that_cannot_work_are_user_errors() {
    let job = Job::new();
    let trained = job.run(env!("CARGO_BIN_EXE_train_eval"), &[]);
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    let out_csv = job.dir.path().join("out.csv");
    let predict = |extra: &[&str]| {
        let mut args = vec![
            "--input_path",
            job.data.to_str().unwrap(),
            "--output_path",
            out_csv.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        job.run(env!("CARGO_BIN_EXE_predict"), &args)
    };
    user_error(&predict(&["--reserved_cols", "nope"]), &["--reserved_cols", "`nope`"]);
    user_error(&predict(&["--batch_size", "0"]), &["--batch_size", "at least 1"]);
    assert!(!out_csv.exists());
}
