//! Training from Kafka against a real broker (`make test` starts one):
//! every produced row is trained, across a SIGKILL and a resume on another
//! world size, and none twice except those trained after the checkpoint
//! the job resumed from (the documented at-least-once window);
//! `offset_info` and `offset_time` start where they say.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustrec::checkpoint::StreamOffsets;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The longest one job or producer of these tests may take (each takes
/// seconds): a job left waiting on a quiet topic fails its test.
const LIMIT: Duration = Duration::from_secs(300);

/// A topic name no other test or run uses.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test_{what}_{}_{nanos}", std::process::id())
}

/// MovieLens-100k's training CSV (with a header) in `dir`.
fn movielens(dir: &Path) -> std::path::PathBuf {
    let src = common::shared_dir().join("data/real/ml-100k");
    rustrec::datagen::prepare_movielens(&src, dir, 0.2, 1).unwrap();
    dir.join("train.csv")
}

fn produce(topic: &str, partitions: usize, input: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kafka_produce"));
    c.args(["--server", &common::kafka_server(), "--topic", topic])
        .args(["--partitions", &partitions.to_string(), "--with_header"])
        .arg("--input")
        .arg(input)
        .args(extra);
    c
}

/// The ODL sample reading `topic` (evaluated on the same topic), with
/// `edits` merged into --edit_config_json.
fn train_args(topic: &str, model_dir: &Path, edits: serde_json::Value) -> Vec<String> {
    let mut json = serde_json::json!({
        "kafka_train_input.server": common::kafka_server(),
        "kafka_train_input.topic": topic,
        "kafka_eval_input.server": common::kafka_server(),
        "kafka_eval_input.topic": topic,
        "eval_config.num_examples": 512,
    });
    json.as_object_mut().unwrap().extend(edits.as_object().unwrap().clone());
    vec![
        "--pipeline_config_path".into(),
        "samples/odl_ml100k.config".into(),
        "--model_dir".into(),
        model_dir.to_str().unwrap().into(),
        "--edit_config_json".into(),
        json.to_string(),
    ]
}

/// The rows (partition, offset) traced in the files `base.<rank>`, in
/// order; a line cut by a kill is left out.
fn traced(base: &Path) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    for rank in 0..4 {
        let mut path = base.as_os_str().to_owned();
        path.push(format!(".{rank}"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines() {
            let mut it = line.split(' ');
            if let (Some(Ok(p)), Some(Ok(o)), None) = (
                it.next().map(str::parse::<i32>),
                it.next().map(str::parse::<i64>),
                it.next(),
            ) {
                out.push((p, o));
            }
        }
    }
    out
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every (partition, offset) of `rows` rows dealt over `partitions`.
fn all_rows(partitions: usize, rows: usize) -> BTreeSet<(i32, i64)> {
    let per_partition = (rows / partitions) as i64;
    (0..partitions as i32)
        .flat_map(|p| (0..per_partition).map(move |o| (p, o)))
        .collect()
}

/// Runs one train_eval with `args` (its rows traced into `traces.1`),
/// calls `meanwhile`, waits until the traces together hold `all`, then ends
/// the job with the stop signal (its model_dir is `args`' --model_dir).
fn train_until_every_row_is_traced(
    args: &[String],
    traces: (&Path, &Path),
    all: &BTreeSet<(i32, i64)>,
    meanwhile: impl FnOnce(),
) {
    let job = Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .current_dir(ROOT)
        .args(args)
        .env("RUSTREC_TRACE_TRAINED_ROWS", traces.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    meanwhile();
    wait_for("every row to be trained", 120, || {
        let seen: BTreeSet<_> = traced(traces.0).into_iter().chain(traced(traces.1)).collect();
        seen.is_superset(all)
    });
    let at = args.iter().position(|a| a == "--model_dir").unwrap();
    std::fs::write(Path::new(&args[at + 1]).join("OSS_STOP_SIGNAL"), "").unwrap();
    let what = "the job going on from the checkpoint";
    ok(&common::wait_within(job, LIMIT, what), what);
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_row_is_trained_across_a_kill_and_a_resume_on_another_world_size() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = movielens(tmp.path());
    let topic = unique("resume");
    let (partitions, rows) = (4usize, 4000usize);
    // The stream arrives while the job trains: 800 rows a second.
    let mut producer = produce(
        &topic,
        partitions,
        &csv,
        &["--rows", &rows.to_string(), "--rate", "800"],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let dir = tmp.path().join("model");
    let (trace1, trace2) = (tmp.path().join("trace1"), tmp.path().join("trace2"));
    let edits = serde_json::json!({
        "train_config.save_checkpoints_steps": 5,
        "data_config.batch_size": 16,
    });
    // Two ranks, each with two partitions; rank 1 is killed once two
    // checkpoints exist.
    let job = common::mpirun()
        .args(["-np", "2", env!("CARGO_BIN_EXE_train_eval")])
        .args(train_args(&topic, &dir, edits.clone()))
        .env("RUSTREC_TRACE_TRAINED_ROWS", &trace1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("two checkpoints", 60, || {
        rustrec::checkpoint::list(&dir).unwrap().len() >= 2
    });
    let mut pid = None;
    wait_for("rank 1", 30, || {
        pid = common::rank_pid(&dir, 1);
        pid.is_some()
    });
    Command::new("kill")
        .args(["-9", &pid.unwrap().to_string()])
        .status()
        .unwrap();
    let out = common::wait_within(job, LIMIT, "the job with a killed rank");
    assert!(!out.status.success(), "the killed job succeeded");
    let ckpt = rustrec::checkpoint::latest(&dir).unwrap().unwrap();
    let resumed = StreamOffsets::of(&ckpt)
        .unwrap()
        .expect("the checkpoint records the offsets");
    assert_eq!(resumed.topic, topic);
    assert_eq!(resumed.offsets.len(), partitions, "{resumed:?}");
    let shown = Command::new(env!("CARGO_BIN_EXE_inspect_checkpoint"))
        .args(["--checkpoint_path", ckpt.to_str().unwrap()])
        .output()
        .unwrap();
    ok(&shown, "inspect_checkpoint");
    let listing = String::from_utf8_lossy(&shown.stdout);
    let expect: Vec<String> = resumed.offsets.iter().map(|(p, o)| format!("{p}:{o}")).collect();
    assert!(
        listing.contains(&format!(
            "kafka topic {topic} next offsets (partition:offset) {}",
            expect.join(" ")
        )),
        "{listing}"
    );

    // One process goes on from the checkpoint's offsets, until every row
    // was trained; then the stop signal ends it.
    let mut args = train_args(&topic, &dir, edits);
    args.push("--continue_train".into());
    let per_partition = (rows / partitions) as i64;
    let all = all_rows(partitions, rows);
    train_until_every_row_is_traced(&args, (&trace1, &trace2), &all, || {
        assert!(producer.wait().unwrap().success());
    });

    let (first, second) = (traced(&trace1), traced(&trace2));
    let mut count: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in first.iter().chain(&second) {
        *count.entry(*r).or_default() += 1;
    }
    assert_eq!(
        count.keys().copied().collect::<BTreeSet<_>>(),
        all,
        "rows outside the stream"
    );
    let before = |(p, o): &(i32, i64)| *o < resumed.offsets[p];
    // Rows before the checkpoint's offsets: trained once, before the kill.
    for r in all.iter().filter(|r| before(r)) {
        assert_eq!(
            count[r], 1,
            "row {r:?} before the checkpoint trained {} times",
            count[r]
        );
    }
    assert!(
        second.iter().all(|r| !before(r)),
        "the resumed job trained rows before its offsets"
    );
    // After them: once by the resumed job, and at most once more before
    // the kill (the window).
    let twice = all.iter().filter(|r| count[r] > 1).count();
    for r in all.iter().filter(|r| !before(r)) {
        assert!(count[r] <= 2, "row {r:?} trained {} times", count[r]);
    }
    assert!(!first.is_empty() && !second.is_empty());
    eprintln!(
        "{} rows before the kill, {} after, {twice} in the window trained twice",
        first.len(),
        second.len()
    );
    let last = rustrec::checkpoint::latest(&dir).unwrap().unwrap();
    let end = StreamOffsets::of(&last).unwrap().unwrap();
    assert!(end.offsets.values().all(|o| *o == per_partition), "{end:?}");
    // Each incremental update's flag names the stream offsets it covers.
    let flags: Vec<serde_json::Value> = std::fs::read_dir(dir.join("incr_save"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "done"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    assert!(!flags.is_empty());
    for f in &flags {
        assert_eq!(f["stream"]["kafka_topic"], topic.as_str(), "{f}");
        assert_eq!(
            f["stream"]["next_offsets"].as_object().unwrap().len(),
            partitions,
            "{f}"
        );
    }
}

#[test]
fn offset_info_and_offset_time_start_where_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = movielens(tmp.path());
    // 200 rows over two partitions: row k at offset k / 2 of partition
    // k % 2, stamped a minute after the one before from T0.
    let topic = unique("offsets");
    let t0 = 1_600_000_000i64;
    let out = common::output_within(
        &mut produce(
            &topic,
            2,
            &csv,
            &[
                "--rows",
                "200",
                "--time_from",
                &t0.to_string(),
                "--seconds_per_row",
                "60",
            ],
        ),
        LIMIT,
        "producing",
    );
    ok(&out, "producing");
    let run = |name: &str, offset: serde_json::Value, steps: u32| -> Vec<(i32, i64)> {
        let dir = tmp.path().join(name);
        let trace = tmp.path().join(format!("trace_{name}"));
        let mut edits = serde_json::json!({
            "data_config.batch_size": 10,
            "train_config.num_steps": steps,
        });
        edits
            .as_object_mut()
            .unwrap()
            .extend(offset.as_object().unwrap().clone());
        let out = common::output_within(
            Command::new(env!("CARGO_BIN_EXE_train_eval"))
                .current_dir(ROOT)
                .args(train_args(&topic, &dir, edits))
                .env("RUSTREC_TRACE_TRAINED_ROWS", &trace),
            LIMIT,
            name,
        );
        ok(&out, name);
        let mut rows = traced(&trace);
        rows.sort_unstable();
        rows
    };
    let expect = |from: [i64; 2]| -> Vec<(i32, i64)> {
        (0..2)
            .flat_map(|p| (from[p as usize]..100).map(move |o| (p, o)))
            .collect()
    };
    // offset_info: partition 0 from 10, partition 1 from 20; 170 rows.
    let rows = run(
        "info",
        serde_json::json!({"kafka_train_input.offset_info": r#"{"0": 10, "1": 20}"#}),
        17,
    );
    assert_eq!(rows, expect([10, 20]));
    // offset_time: rows 100.. are stamped at or after T0 + 100 minutes,
    // offset 50 of each partition; 100 rows.
    let rows = run(
        "time",
        serde_json::json!({"kafka_train_input.offset_time": (t0 + 6000).to_string()}),
        10,
    );
    assert_eq!(rows, expect([50, 50]));
}

/// Asynchronous training (one server, two workers) reads the topic too,
/// each worker its partitions; the offsets its last checkpoint records let
/// a synchronous job go on, and across the two every row is trained once
/// (read in order: no shuffle buffer, no kill).
#[test]
fn asynchronous_workers_read_their_partitions_and_a_synchronous_job_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = movielens(tmp.path());
    let topic = unique("async");
    let (partitions, rows) = (4usize, 2000usize);
    let out = common::output_within(
        &mut produce(&topic, partitions, &csv, &["--rows", &rows.to_string()]),
        LIMIT,
        "producing",
    );
    ok(&out, "producing");
    let dir = tmp.path().join("model");
    let (trace1, trace2) = (tmp.path().join("trace1"), tmp.path().join("trace2"));
    let edits = serde_json::json!({
        "train_config.save_checkpoints_steps": 20,
        "train_config.num_steps": 60,
        "data_config.batch_size": 16,
        // In order: with the shuffle buffer, rows past a checkpoint's
        // offsets may have trained before it (at least once, not exactly).
        "data_config.shuffle": false,
    });
    // The sample without its incremental updates (asynchronous training
    // does not write them).
    let text = std::fs::read_to_string(Path::new(ROOT).join("samples/odl_ml100k.config")).unwrap();
    let start = text.find("  incr_save_config {").unwrap();
    let end = start + text[start..].find("\n  }\n").unwrap() + 5;
    let cfg = tmp.path().join("no_updates.config");
    std::fs::write(&cfg, format!("{}{}", &text[..start], &text[end..])).unwrap();
    let mut args = train_args(&topic, &dir, edits);
    args[1] = cfg.to_str().unwrap().into();
    args.extend([
        "--train_config.sync_replicas=false".into(),
        "--num_ps".into(),
        "1".into(),
    ]);
    let out = common::output_within(
        common::mpirun()
            .args(["-np", "3", env!("CARGO_BIN_EXE_train_eval")])
            .args(&args)
            .env("RUSTREC_TRACE_TRAINED_ROWS", &trace1),
        LIMIT,
        "asynchronous training",
    );
    ok(&out, "asynchronous training");
    let ckpt = rustrec::checkpoint::latest(&dir).unwrap().unwrap();
    let saved = StreamOffsets::of(&ckpt).unwrap().expect("offsets");
    assert_eq!(saved.offsets.len(), partitions, "{saved:?}");
    let first = traced(&trace1);
    assert_eq!(first.len(), 60 * 16, "60 pushes of 16 rows");
    // Each worker read only its own partitions (worker 0: 0 and 2).
    let of_worker = |base: &Path, rank: usize| -> BTreeSet<i32> {
        let mut path = base.as_os_str().to_owned();
        path.push(format!(".{rank}"));
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    };
    for (rank, mine) in [(1, BTreeSet::from([0, 2])), (2, BTreeSet::from([1, 3]))] {
        let read = of_worker(&trace1, rank);
        assert!(
            !read.is_empty() && read.is_subset(&mine),
            "worker rank {rank} trained partitions {read:?}"
        );
    }

    let mut args = train_args(
        &topic,
        &dir,
        serde_json::json!({"train_config.num_steps": 0, "data_config.batch_size": 16, "data_config.shuffle": false}),
    );
    args[1] = cfg.to_str().unwrap().into();
    args.push("--continue_train".into());
    let all = all_rows(partitions, rows);
    train_until_every_row_is_traced(&args, (&trace1, &trace2), &all, || {});
    let mut count: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in first.iter().chain(&traced(&trace2)) {
        *count.entry(*r).or_default() += 1;
    }
    assert_eq!(count.keys().copied().collect::<BTreeSet<_>>(), all);
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows trained twice: {twice:?}");
}
