//! Distributed training under a real `mpirun` (2 and 4 ranks, oversubscribed
//! on small machines): each rank trains on its slice of the global batch,
//! and the result must match one process training on the whole batches.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rustrec::checkpoint::{load, Loaded};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Global batch; each of n ranks reads GLOBAL_BATCH / n rows of it.
const GLOBAL_BATCH: usize = 32;

fn mpirun() -> Command {
    common::mpirun()
}

/// The sample config for `model`, with the table optimizer as asked and
/// batch norm off (its statistics are per rank, as in TensorFlow).
fn config(dir: &Path, model: &str, table_opt: &str) -> PathBuf {
    let sample = match model {
        "DLRM" => "samples/dlrm_criteo_sample.config",
        _ => "samples/wide_and_deep_criteo_sample.config",
    };
    let mut text = std::fs::read_to_string(Path::new(ROOT).join(sample)).unwrap();
    if table_opt == "key_value" {
        text = text.replace(
            "  model_class: \"WideAndDeep\"",
            "  model_class: \"WideAndDeep\"\n  ev_params { filter_freq: 2 steps_to_live: 8 }",
        );
        assert!(text.contains("ev_params"));
    }
    if table_opt == "sgd" {
        text = text.replace(
            "adagrad_optimizer {",
            "momentum_optimizer { momentum_optimizer_value: 0",
        );
    }
    text = text.replace("data/criteo_sample.csv", &format!("{ROOT}/data/criteo_sample.csv"));
    let path = dir.join(format!("{model}_{table_opt}.config"));
    std::fs::write(&path, text).unwrap();
    path
}

fn no_bn(model: &str) -> Vec<String> {
    match model {
        "DLRM" => vec![
            "--model_config.dlrm.bot_dnn.use_bn=false".into(),
            "--model_config.dlrm.top_dnn.use_bn=false".into(),
        ],
        _ => vec!["--model_config.wide_and_deep.dnn.use_bn=false".into()],
    }
}

/// Arguments of one training run to `steps` on `ranks` ranks.
fn train_args(config: &Path, model: &str, model_dir: &Path, steps: u32, ranks: usize, strategy: &str) -> Vec<String> {
    let mut a = vec![
        "--pipeline_config_path".to_string(),
        config.to_str().unwrap().to_string(),
        "--model_dir".into(),
        model_dir.to_str().unwrap().to_string(),
        format!("--train_config.num_steps={steps}"),
        format!("--data_config.batch_size={}", GLOBAL_BATCH / ranks),
        format!("--train_config.train_distribute={strategy}"),
        "--train_config.save_checkpoints_steps=10".into(),
    ];
    a.extend(no_bn(model));
    a
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn single(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .current_dir(ROOT)
        .args(args)
        .output()
        .unwrap()
}

fn parallel(ranks: usize, bin: &str, args: &[String]) -> Output {
    mpirun()
        .arg("-np")
        .arg(ranks.to_string())
        .arg(bin)
        .args(args)
        .output()
        .unwrap()
}

/// Every line: `YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL [rank r/N] message`, one
/// line per record (two ranks' lines never spliced into one).
fn assert_whole_timestamped_lines(stderr: &str) {
    assert!(!stderr.is_empty());
    for line in stderr.lines() {
        let (ts, rest) = line.split_at_checked(24).unwrap_or((line, ""));
        let shape_ok = ts.len() == 24
            && ts.char_indices().all(|(i, c)| match i {
                4 | 7 => c == '-',
                10 => c == 'T',
                13 | 16 => c == ':',
                19 => c == '.',
                23 => c == 'Z',
                _ => c.is_ascii_digit(),
            });
        assert!(shape_ok, "line without a timestamp: {line:?}");
        let rest = rest.trim_start();
        assert!(
            ["INFO", "WARN", "ERROR", "DEBUG"].iter().any(|l| rest.starts_with(l)),
            "line without a level: {line:?}"
        );
        assert_eq!(line.matches("[rank ").count(), 1, "a spliced or unnamed line: {line:?}");
        assert_eq!(
            line.matches("Z INFO").count() + line.matches("Z WARN").count(),
            1,
            "{line:?}"
        );
    }
}

fn tensors(model_dir: &Path, step: u32) -> BTreeMap<String, Loaded> {
    load(&model_dir.join(format!("model.ckpt-{step}"))).unwrap().1
}

/// Every tensor (weights, embedding rows, optimizer slots) within fp32
/// tolerance of the reference.
fn assert_close(reference: &BTreeMap<String, Loaded>, got: &BTreeMap<String, Loaded>, what: &str) {
    assert_eq!(
        reference.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (name, r) in reference {
        let g = &got[name];
        assert_eq!(r.shape, g.shape, "{what}: {name}");
        for (i, (a, b)) in r.data.iter().zip(&g.data).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * a.abs(),
                "{what}: {name}[{i}] is {b}, one process gives {a}"
            );
        }
    }
}

/// `assert_close`, and a key-value table's keys, counts and steps equal.
fn assert_same_tables(reference: &BTreeMap<String, Loaded>, got: &BTreeMap<String, Loaded>, what: &str) {
    let (reference, got) = (common::by_key(reference.clone()), common::by_key(got.clone()));
    assert_close(&reference, &got, what);
    for (name, r) in &reference {
        assert_eq!(r.ints, got[name].ints, "{what}: {name}");
    }
}

fn eval_result(model_dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(model_dir.join("eval_result.txt")).unwrap()).unwrap()
}

fn assert_same_metrics(a: &serde_json::Value, b: &serde_json::Value, what: &str) {
    for k in ["auc", "logloss"] {
        let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
        assert!((x - y).abs() < 1e-5, "{what}: {k} {y} vs one process {x}");
    }
}

#[test]
fn sharded_and_data_parallel_steps_match_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["DLRM", "WideAndDeep"] {
        for table_opt in ["adagrad", "sgd"] {
            let cfg = config(tmp.path(), model, table_opt);
            let reference = tmp.path().join(format!("{model}_{table_opt}_ref"));
            check(
                &single(&train_args(&cfg, model, &reference, 20, 1, "NoStrategy")),
                "reference",
            );
            let (ref1, ref20) = {
                let one = tmp.path().join(format!("{model}_{table_opt}_ref1"));
                check(&single(&train_args(&cfg, model, &one, 1, 1, "NoStrategy")), "reference");
                (tensors(&one, 1), tensors(&reference, 20))
            };
            // NoStrategy is EasyRec's parameter-server training, synchronous
            // with sync_replicas (its default).
            for strategy in ["EmbeddingParallelStrategy", "MultiWorkerMirroredStrategy", "NoStrategy"] {
                for ranks in [2, 4] {
                    let what = format!("{model}/{table_opt}/{strategy}/np={ranks}");
                    for (steps, want) in [(1, &ref1), (20, &ref20)] {
                        let dir = tmp
                            .path()
                            .join(format!("{model}_{table_opt}_{strategy}_{ranks}_{steps}"));
                        let args = train_args(&cfg, model, &dir, steps, ranks, strategy);
                        check(&parallel(ranks, env!("CARGO_BIN_EXE_train_eval"), &args), &what);
                        assert_close(want, &tensors(&dir, steps), &format!("{what} after {steps} steps"));
                        if steps == 20 {
                            assert_same_metrics(&eval_result(&reference), &eval_result(&dir), &what);
                        }
                    }
                }
            }
        }
    }
}

/// Key-value tables (ev_params: admission after two sightings, rows
/// unseen for eight steps evicted at each save) train alike on 1, 2 and 4
/// ranks under every synchronous mode, SokStrategy's included: the same
/// keys with the same counts, steps, rows and slots; and a run moved from 4
/// ranks to 2 continues it exactly.
#[test]
fn key_value_tables_train_alike_on_any_number_of_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let model = "WideAndDeep";
    let cfg = config(tmp.path(), model, "key_value");
    let reference = tmp.path().join("ref");
    check(
        &single(&train_args(&cfg, model, &reference, 20, 1, "NoStrategy")),
        "reference",
    );
    let want = tensors(&reference, 20);
    assert!(want.keys().any(|k| k.ends_with("-keys")), "key-value tables saved");
    for strategy in [
        "EmbeddingParallelStrategy",
        "MultiWorkerMirroredStrategy",
        "NoStrategy",
        "SokStrategy",
    ] {
        for ranks in [2, 4] {
            let what = format!("key-value/{strategy}/np={ranks}");
            let dir = tmp.path().join(format!("kv_{strategy}_{ranks}"));
            let args = train_args(&cfg, model, &dir, 20, ranks, strategy);
            check(&parallel(ranks, env!("CARGO_BIN_EXE_train_eval"), &args), &what);
            assert_same_tables(&want, &tensors(&dir, 20), &what);
            assert_same_metrics(&eval_result(&reference), &eval_result(&dir), &what);
        }
    }
    let dir = tmp.path().join("kv_resharded");
    let ep = "EmbeddingParallelStrategy";
    check(
        &parallel(
            4,
            env!("CARGO_BIN_EXE_train_eval"),
            &train_args(&cfg, model, &dir, 10, 4, ep),
        ),
        "key-value np=4 to step 10",
    );
    let mut args = train_args(&cfg, model, &dir, 20, 2, ep);
    args.push("--continue_train".into());
    check(
        &parallel(2, env!("CARGO_BIN_EXE_train_eval"), &args),
        "key-value np=2 from 10 to 20",
    );
    assert_same_tables(&want, &tensors(&dir, 20), "key-value 4 then 2 ranks");
    let mut args = train_args(&cfg, model, &dir, 30, 1, ep);
    args.push("--continue_train".into());
    check(&single(&args), "key-value one process from 20 to 30");
    let mut args = train_args(&cfg, model, &reference, 30, 1, "NoStrategy");
    args.push("--continue_train".into());
    check(&single(&args), "reference from 20 to 30");
    assert_same_tables(
        &tensors(&reference, 30),
        &tensors(&dir, 30),
        "key-value 4, 2, then 1 rank",
    );

    // Asynchronous parameter servers hold key-value tables too (a key is
    // counted when a push carrying it is applied); one process evaluates
    // their checkpoint.
    let ps = tmp.path().join("kv_async");
    let mut args = train_args(&cfg, model, &ps, 20, 2, "NoStrategy");
    args.extend([
        "--train_config.sync_replicas=false".into(),
        "--num_ps".into(),
        "1".into(),
    ]);
    check(
        &parallel(3, env!("CARGO_BIN_EXE_train_eval"), &args),
        "key-value asynchronous",
    );
    let saved = common::by_key(tensors(&ps, 20));
    let keys = &saved["input_layer_1/C1_embedding/embedding_weights-keys"].ints;
    assert!(!keys.is_empty());
    assert!(saved["input_layer_1/C1_embedding/embedding_weights-freqs"]
        .ints
        .iter()
        .all(|f| *f >= 2));
    std::fs::remove_file(ps.join("eval_result.txt")).unwrap();
    let mut eval = Command::new(env!("CARGO_BIN_EXE_eval"));
    eval.current_dir(ROOT)
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", ps.to_str().unwrap()])
        .args(no_bn(model));
    check(&eval.output().unwrap(), "eval of the asynchronous key-value run");
    assert!(eval_result(&ps)["auc"].as_f64().unwrap() > 0.6);
}

/// Asynchronous parameter-server training with one worker is plain
/// sequential training: with one server or two (tables and dense
/// parameters split between them) it must equal one process, checkpoints
/// (a pause of the worker at step 10) and evaluation included.
#[test]
fn asynchronous_training_with_one_worker_matches_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, table_opt) in [("DLRM", "adagrad"), ("WideAndDeep", "sgd")] {
        let cfg = config(tmp.path(), model, table_opt);
        let reference = tmp.path().join(format!("{model}_ref"));
        check(
            &single(&train_args(&cfg, model, &reference, 20, 1, "NoStrategy")),
            "reference",
        );
        // sync_replicas: false, and PSStrategy (which EasyRec runs without
        // sync_replicas), on one server and on two.
        for (strategy, extra, ranks, servers) in [
            ("NoStrategy", Some("--train_config.sync_replicas=false"), 2, 1),
            ("PSStrategy", None, 3, 2),
        ] {
            let what = format!("{model}/{strategy}/np={ranks} with {servers} server(s)");
            let dir = tmp.path().join(format!("{model}_{strategy}_{ranks}"));
            let mut args = train_args(&cfg, model, &dir, 20, 1, strategy);
            args.extend(extra.map(String::from));
            args.extend(["--num_ps".to_string(), servers.to_string()]);
            let out = parallel(ranks, env!("CARGO_BIN_EXE_train_eval"), &args);
            check(&out, &what);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("{servers} server rank(s), 1 worker rank(s)")),
                "{stderr}"
            );
            // The servers' rows, one checkpoint file each.
            for s in 0..servers {
                let f = format!("model.ckpt-10/embedding-{s:05}-of-{servers:05}.safetensors");
                assert!(dir.join(&f).is_file(), "{what}: no {f}");
            }
            for step in [10, 20] {
                assert_close(
                    &tensors(&reference, step),
                    &tensors(&dir, step),
                    &format!("{what} at step {step}"),
                );
            }
            assert_same_metrics(&eval_result(&reference), &eval_result(&dir), &what);
        }
        // The two servers' checkpoint resumes on one server to step 30, as
        // one process trains on.
        let longer = tmp.path().join(format!("{model}_ref30"));
        check(
            &single(&train_args(&cfg, model, &longer, 30, 1, "NoStrategy")),
            "reference",
        );
        let dir = tmp.path().join(format!("{model}_PSStrategy_3"));
        let mut args = train_args(&cfg, model, &dir, 30, 1, "PSStrategy");
        args.push("--continue_train".into());
        check(
            &parallel(2, env!("CARGO_BIN_EXE_train_eval"), &args),
            "resume on one server",
        );
        assert_close(&tensors(&longer, 30), &tensors(&dir, 30), "resumed on one server");
    }
}

/// Asynchronous training is not reproducible, so it is held to the
/// quality of the synchronous run over the same samples in as many updates
/// of as many rows: MovieLens-100k for two epochs, two synchronous workers
/// of 128 rows (one global step of 256) against two asynchronous workers of
/// 256 rows (each batch a step), on one server and on two: no more than
/// 0.005 AUC below it. Batch norm off: its statistics are per worker batch.
#[test]
fn asynchronous_training_reaches_the_synchronous_quality() {
    let data = tempfile::tempdir().unwrap();
    let src = common::shared_dir().join("data/real/ml-100k");
    rustrec::datagen::prepare_movielens(&src, data.path(), 0.2, 1).unwrap();
    let run = |ranks: usize, batch: usize, extra: &[&str]| -> f64 {
        let dir = data.path().join(format!("model_{ranks}_{}", extra.len()));
        let mut args: Vec<String> = vec![
            "--pipeline_config_path".into(),
            "samples/wide_and_deep_ml100k.config".into(),
            "--model_dir".into(),
            dir.to_str().unwrap().into(),
            "--train_input_path".into(),
            data.path().join("train.csv").to_str().unwrap().into(),
            "--eval_input_path".into(),
            data.path().join("eval.csv").to_str().unwrap().into(),
            format!("--data_config.batch_size={batch}"),
            "--data_config.num_epochs=2".into(),
            "--model_config.wide_and_deep.dnn.use_bn=false".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = parallel(ranks, env!("CARGO_BIN_EXE_train_eval"), &args);
        check(&out, &format!("np={ranks} {extra:?}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "np={ranks} {extra:?}: {}",
            stderr.lines().rfind(|l| l.contains("eval at")).unwrap_or("")
        );
        eval_result(&dir)["auc"].as_f64().unwrap()
    };
    let sync = run(2, 128, &[]);
    for (ranks, extra) in [
        (3, vec!["--train_config.sync_replicas=false"]),
        (4, vec!["--train_config.sync_replicas=false", "--num_ps", "2"]),
    ] {
        let auc = run(ranks, 256, &extra);
        // One-sided: racing workers may land above the synchronous run (a
        // previous CI run saw +0.0053); reaching its quality is the claim.
        assert!(
            auc >= sync - 0.005,
            "asynchronous np={ranks}: eval AUC {auc:.4}, synchronous {sync:.4}"
        );
    }
}

/// Three workers racing on two cores overtake each other's pulls; with
/// --max_staleness 0 every overtaken push is dropped, counted and reported,
/// and the global step still counts every batch.
#[test]
fn stale_pushes_beyond_the_bound_are_dropped_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let dir = tmp.path().join("stale");
    let mut args = train_args(&cfg, "DLRM", &dir, 60, 1, "NoStrategy");
    args.extend(["--train_config.sync_replicas=false", "--max_staleness", "0"].map(String::from));
    let out = parallel(4, env!("CARGO_BIN_EXE_train_eval"), &args);
    check(&out, "np=4 with max_staleness 0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("asynchronous updates:"))
        .unwrap_or_else(|| panic!("no account of the updates:\n{stderr}"));
    let counts: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches([',', ';']).parse().ok())
        .collect();
    let (applied, dropped) = (counts[0], counts[1]);
    assert_eq!(applied + dropped, 60, "{line}");
    assert!(dropped > 0, "no push was overtaken: {line}");
    assert!(line.contains("staler than 0 steps"), "{line}");
    assert!(dir.join("model.ckpt-60").is_dir());
}

/// enable_oss_stop_signal under asynchronous training: server 0 looks for
/// the file once a batch has trained (as the synchronous chief looks after
/// its first step) and then gives out no more steps; the job saves and ends.
#[test]
fn a_stop_signal_ends_asynchronous_training_after_its_first_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let dir = tmp.path().join("signalled");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("OSS_STOP_SIGNAL"), "").unwrap();
    let mut args = train_args(&cfg, "DLRM", &dir, 1000, 1, "NoStrategy");
    args.extend(
        [
            "--train_config.sync_replicas=false",
            "--train_config.enable_oss_stop_signal=true",
        ]
        .map(String::from),
    );
    let out = parallel(3, env!("CARGO_BIN_EXE_train_eval"), &args);
    check(&out, "np=3 with the stop signal present");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The first pull after a push looks: one or both workers' first batches
    // have come back by then.
    assert!(
        [
            "found at step 1: training ends here",
            "found at step 2: training ends here"
        ]
        .iter()
        .any(|m| stderr.contains(m)),
        "{stderr}"
    );
    let step = load(&rustrec::checkpoint::latest(&dir).unwrap().unwrap()).unwrap().0;
    assert!((1..=2).contains(&step), "saved at step {step}");
}

#[test]
fn parameter_servers_must_leave_a_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let mut args = train_args(&cfg, "DLRM", &tmp.path().join("m"), 5, 2, "PSStrategy");
    args.extend(["--num_ps".to_string(), "2".to_string()]);
    let out = parallel(2, env!("CARGO_BIN_EXE_train_eval"), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--num_ps") && stderr.contains("2 parameter server(s) among 2 ranks"),
        "{stderr}"
    );
}

#[test]
fn train_on_four_ranks_continue_on_two_evaluate_on_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let reference = tmp.path().join("ref");
    check(
        &single(&train_args(&cfg, "DLRM", &reference, 20, 1, "NoStrategy")),
        "reference",
    );

    let dir = tmp.path().join("resharded");
    let ep = "EmbeddingParallelStrategy";
    check(
        &parallel(
            4,
            env!("CARGO_BIN_EXE_train_eval"),
            &train_args(&cfg, "DLRM", &dir, 10, 4, ep),
        ),
        "np=4 to step 10",
    );
    // Each rank wrote its own rows of the tables; rank 0 the dense part.
    for r in 0..4 {
        assert!(dir
            .join(format!("model.ckpt-10/embedding-{r:05}-of-00004.safetensors"))
            .is_file());
    }
    assert!(!dir.join("model.ckpt-10/embedding.safetensors").exists());
    let mut args = train_args(&cfg, "DLRM", &dir, 20, 2, ep);
    args.push("--continue_train".into());
    let out = parallel(2, env!("CARGO_BIN_EXE_train_eval"), &args);
    check(&out, "np=2 from step 10 to 20");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[rank 0/2] resumed from"));
    assert!(dir.join("model.ckpt-20/embedding-00001-of-00002.safetensors").is_file());
    assert_close(&tensors(&reference, 20), &tensors(&dir, 20), "4 then 2 ranks");

    // The final export of the 2-rank run holds every rank's rows: through
    // the ONNX runtime it scores like the one-process reference's export.
    let scores = |model_dir: &Path| -> Vec<f32> {
        let out = model_dir.join("scores.csv");
        let mut predict = Command::new(env!("CARGO_BIN_EXE_predict"));
        predict
            .current_dir(ROOT)
            .args(["--saved_model_dir", model_dir.join("export/final").to_str().unwrap()])
            .args(["--input_path", &format!("{ROOT}/data/criteo_sample.csv")])
            .args(["--output_path", out.to_str().unwrap()]);
        check(&predict.output().unwrap(), "predict with an export");
        let text = std::fs::read_to_string(out).unwrap();
        text.lines()
            .skip(1)
            .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
            .collect()
    };
    let (a, b) = (scores(&reference), scores(&dir));
    assert_eq!(a.len(), b.len());
    assert!(!a.is_empty());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4, "export of the resharded run: {x} vs {y}");
    }

    std::fs::remove_file(dir.join("eval_result.txt")).unwrap();
    let mut eval = Command::new(env!("CARGO_BIN_EXE_eval"));
    eval.current_dir(ROOT)
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", dir.to_str().unwrap()])
        .args(no_bn("DLRM"));
    check(&eval.output().unwrap(), "eval on one process");
    assert_same_metrics(&eval_result(&reference), &eval_result(&dir), "eval at np=1");
}

/// Finds the pid of rank `rank` of the job training into `model_dir`.
fn rank_pid(model_dir: &Path, rank: usize) -> Option<u32> {
    common::rank_pid(model_dir, rank)
}

#[test]
fn a_killed_rank_ends_the_job_quickly_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    kill_and_resume(tmp.path(), "EmbeddingParallelStrategy", &[], 2, 1);
}

/// Asynchronous training on four ranks (two servers, two workers): a killed
/// worker (rank 3), then a killed server (rank 1), ends the job, and each
/// time the run resumes from the last checkpoint.
#[test]
fn a_killed_worker_or_server_ends_an_asynchronous_job_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = ["--train_config.sync_replicas=false", "--num_ps", "2"];
    kill_and_resume(tmp.path(), "NoStrategy", &extra, 4, 3);
    kill_and_resume(tmp.path(), "NoStrategy", &extra, 4, 1);
}

/// Trains on `ranks` ranks, kills rank `victim` with SIGKILL once a
/// checkpoint exists, checks the job ends within seconds naming the rank,
/// then resumes 20 steps past the last checkpoint.
fn kill_and_resume(tmp: &Path, strategy: &str, extra: &[&str], ranks: usize, victim: usize) {
    let cfg = config(tmp, "DLRM", "adagrad");
    let dir = tmp.join(format!("killed_{strategy}_{victim}"));
    let mut args = train_args(&cfg, "DLRM", &dir, 100_000, 2, strategy);
    args.extend(extra.iter().map(|s| s.to_string()));
    let child = mpirun()
        .arg("-np")
        .arg(ranks.to_string())
        .arg(env!("CARGO_BIN_EXE_train_eval"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !dir.join("checkpoint").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut pid = rank_pid(&dir, victim);
    while pid.is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        pid = rank_pid(&dir, victim);
    }
    let pid = pid.expect("the rank is running");
    let killed_at = std::time::Instant::now();
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    let took = killed_at.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(took.as_secs() < 20, "the job took {took:?} to end after a rank died");
    assert!(
        text.contains(&format!("rank {victim}")),
        "the message does not name the rank:\n{text}"
    );

    // The last complete checkpoint resumes and the run finishes.
    let step = load(&rustrec::checkpoint::latest(&dir).unwrap().unwrap()).unwrap().0;
    let target = (step + 20) as u32;
    args = train_args(&cfg, "DLRM", &dir, target, 2, strategy);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--continue_train".into());
    check(
        &parallel(ranks, env!("CARGO_BIN_EXE_train_eval"), &args),
        "resume after the kill",
    );
    assert!(dir.join(format!("model.ckpt-{target}")).exists());
}

#[test]
fn ranks_read_their_own_files_and_stop_together_on_an_uneven_split() {
    // Three files of 64 rows for two ranks: rank 0 reads files 0 and 2
    // (8 batches of 16), rank 1 reads file 1 (4 batches). Both stop after 4.
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(ROOT).join("data/criteo_sample.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let rows: Vec<&str> = lines.collect();
    let mut files = Vec::new();
    for (i, chunk) in rows.chunks(64).take(3).enumerate() {
        let path = tmp.path().join(format!("part-{i}.csv"));
        std::fs::write(&path, format!("{header}\n{}\n", chunk.join("\n"))).unwrap();
        files.push(path);
    }
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let dir = tmp.path().join("own_share");
    let mut args = train_args(&cfg, "DLRM", &dir, 1000, 2, "EmbeddingParallelStrategy");
    args.push("--data_config.num_epochs=1".into());
    args.push("--train_input_path".into());
    args.push(tmp.path().join("part-*.csv").to_str().unwrap().to_string());
    let out = parallel(2, env!("CARGO_BIN_EXE_train_eval"), &args);
    check(&out, "np=2 on three files");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("3 input splits over 2 ranks: each rank reads its own share"),
        "{stderr}"
    );
    // Rank 0 speaks for the job (the job's samples/s); rank 1 stays quiet.
    assert!(
        stderr.contains("[rank 0/2] trained 4 steps to global step 4") && stderr.contains("(the whole job)"),
        "{stderr}"
    );
    assert!(!stderr.contains("[rank 1/2]"), "{stderr}");
    assert_whole_timestamped_lines(&stderr);
    assert!(dir.join("model.ckpt-4").is_dir());
}

#[test]
fn ranks_started_with_different_configs_refuse_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let dir = tmp.path().join("mismatch");
    let ep = "EmbeddingParallelStrategy";
    let same = train_args(&cfg, "DLRM", &dir, 10, 2, ep);
    let mut other = same.clone();
    other.push("--model_config.dlrm.top_dnn.hidden_units=[64,7,1]".into());
    // One launch, two programs (MPMD): rank 0 and rank 1 disagree on a layer.
    let out = mpirun()
        .args(["-np", "1", env!("CARGO_BIN_EXE_train_eval")])
        .args(&same)
        .args([":", "-np", "1", env!("CARGO_BIN_EXE_train_eval")])
        .args(&other)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ranks disagree on the effective pipeline config"),
        "{stderr}"
    );
    assert!(stderr.contains("[1]"), "{stderr}");
    assert!(!stderr.contains("free()") && !stderr.contains("panicked"), "{stderr}");
    // Nothing was written: no checkpoint, not even the config.
    assert!(!dir.join("checkpoint").exists());
    assert!(!dir.join("pipeline.config").exists());
}

#[test]
fn a_second_job_in_a_running_jobs_model_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "DLRM", "adagrad");
    let dir = tmp.path().join("shared_dir");
    let ep = "EmbeddingParallelStrategy";
    let mut args = train_args(&cfg, "DLRM", &dir, 100_000_000, 2, ep);
    args.push("--data_config.num_epochs=0".into());
    let mut first = mpirun()
        .args(["-np", "2", env!("CARGO_BIN_EXE_train_eval")])
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while rustrec::checkpoint::latest(&dir).ok().flatten().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first job wrote no checkpoint"
        );
        assert!(first.try_wait().unwrap().is_none(), "the first job ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let config_before = std::fs::read(dir.join("pipeline.config")).unwrap();

    // The same job again, resuming, and a fresh one with another layer: both
    // are kept out while the first holds the model_dir.
    let mut resume = args.clone();
    resume.push("--continue_train".into());
    let mut other = resume.clone();
    other.push("--model_config.dlrm.top_dnn.hidden_units=[64,7,1]".into());
    for second in [&resume, &other] {
        let out = parallel(2, env!("CARGO_BIN_EXE_train_eval"), second);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("in use by another training job"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let still_running = first.try_wait().unwrap().is_none();
    // mpirun passes SIGTERM on to its ranks.
    Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status()
        .unwrap();
    first.wait().unwrap();
    assert!(still_running, "the first job ended before the others tried");

    // The first job's config and every checkpoint it left are whole.
    assert_eq!(std::fs::read(dir.join("pipeline.config")).unwrap(), config_before);
    let steps = rustrec::checkpoint::list(&dir).unwrap();
    assert!(!steps.is_empty());
    for step in steps {
        load(&dir.join(format!("model.ckpt-{step}"))).unwrap_or_else(|e| panic!("model.ckpt-{step}: {e:#}"));
    }
}
