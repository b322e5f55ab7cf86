//! Incremental updates (`incr_save_config` with `fs`): written in
//! EasyRec's format while training; every row a stretch of training changed
//! is in its updates with the values the checkpoint holds, the dense update
//! equals the checkpoint's parameters; targets this trainer cannot write
//! are refused by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use rustrec::checkpoint::{load, Loaded};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn config(dir: &Path, sample: &str, incr: &str) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(ROOT).join(sample))
        .unwrap()
        .replace("data/criteo_sample.csv", &format!("{ROOT}/data/criteo_sample.csv"))
        .replace("  num_steps: 200\n", &format!("  num_steps: 20\n  {incr}\n"));
    assert!(text.contains(incr));
    let path = dir.join("pipeline.config");
    std::fs::write(&path, text).unwrap();
    path
}

fn train(cfg: &Path, model_dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_train_eval"))
        .current_dir(ROOT)
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--train_config.save_checkpoints_steps=10"])
        .args(extra)
        .output()
        .unwrap()
}

/// Exports checkpoint 10 of `model_dir` (trained by `cfg`) into `dir/exports`
/// and returns the export with the source of its job's updates.
fn export_of_step_10(cfg: &Path, model_dir: &Path, dir: &Path) -> (PathBuf, rustrec::export::updates::UpdateSource) {
    let exports = dir.join("exports");
    let out = Command::new(env!("CARGO_BIN_EXE_export"))
        .current_dir(ROOT)
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--checkpoint_path", model_dir.join("model.ckpt-10").to_str().unwrap()])
        .args(["--export_dir", exports.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let export = rustrec::export::runtime::resolve_export_dir(&exports).unwrap();
    let source = rustrec::export::updates::UpdateSource::of_export(&export)
        .unwrap()
        .expect("the export records its updates");
    (export, source)
}

/// The largest difference between the scores of `export` with `live`'s
/// graph and those of checkpoint `step` of `model_dir`, on the eval data.
fn worst_against_checkpoint(
    cfg: &Path,
    (export, live): (&Path, &rustrec::export::updates::LiveModel),
    model_dir: &Path,
    step: u32,
) -> f32 {
    use rustrec::config::{load_pipeline, typed::TrainingPlan};
    let followed = rustrec::export::runtime::ExportedModel::load(export)
        .unwrap()
        .with_runnable(live.runnable().unwrap());
    let plan = TrainingPlan::from_config(&load_pipeline(cfg, &Default::default()).unwrap().config).unwrap();
    let trainer = rustrec::train::Trainer::new(plan.clone()).unwrap();
    let at = rustrec::inference::Bundle::restore(plan, &model_dir.join(format!("model.ckpt-{step}"))).unwrap();
    let mut worst = 0.0f32;
    for batch in trainer.stream(&trainer.plan.data.eval_paths.clone(), false, 0).unwrap() {
        let batch = batch.unwrap();
        for (a, b) in at.score(&batch).iter().zip(&followed.score(&batch).unwrap()) {
            for (x, y) in a.scores.iter().zip(&b.scores) {
                worst = worst.max((x - y).abs());
            }
        }
    }
    worst
}

fn i32s(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
    b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()))
}

/// An update file: its kind (0 dense, 1 sparse), step and per variable
/// (id, keys, values).
type Update = (i32, i32, Vec<(usize, Vec<i64>, Vec<f32>)>);

fn read_update(path: &Path, dims: &BTreeMap<usize, usize>) -> Update {
    let b = std::fs::read(path).unwrap();
    let head: Vec<i32> = i32s(&b[..12]).collect();
    let (kind, n, step) = (head[0], head[1] as usize, head[2]);
    let pairs: Vec<i32> = i32s(&b[12..12 + 8 * n]).collect();
    let mut at = 12 + 8 * n;
    let mut out = Vec::new();
    for p in pairs.chunks(2) {
        let (id, count) = (p[0] as usize, p[1] as usize);
        let mut keys = Vec::new();
        let width = if kind == 1 {
            for c in b[at..at + 8 * count].chunks_exact(8) {
                keys.push(i64::from_le_bytes(c.try_into().unwrap()));
            }
            at += 8 * count;
            dims[&id]
        } else {
            1
        };
        let values: Vec<f32> = b[at..at + 4 * count * width]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        at += 4 * count * width;
        out.push((id, keys, values));
    }
    assert_eq!(at, b.len(), "{}: the header accounts for every byte", path.display());
    (kind, step, out)
}

fn names(path: &Path) -> BTreeMap<usize, String> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, id)| (id.as_u64().unwrap() as usize, k.clone()))
        .collect()
}

fn tensors(model_dir: &Path, step: u32) -> BTreeMap<String, Loaded> {
    load(&model_dir.join(format!("model.ckpt-{step}"))).unwrap().1
}

/// Every row that differs between checkpoints 10 and 20 is in the sparse
/// updates after step 10, and the last update of each row holds its value
/// at step 20; the dense update at 20 is the checkpoint's dense part.
fn check_updates(model_dir: &Path, key_value: bool) {
    let incr = model_dir.join("incr_save");
    for f in [
        "dense_update_10",
        "dense_update_20",
        "sparse_update_5",
        "sparse_update_20",
    ] {
        assert!(incr.join(f).is_file(), "{f}");
        // The flag describes the update.
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(incr.join(format!("{f}.done"))).unwrap()).unwrap();
        assert_eq!(info["update"], f);
        assert_eq!(info["format"], "rustrec-incremental-update/1");
        let step: u64 = f.rsplit('_').next().unwrap().parse().unwrap();
        assert_eq!(info["global_step"], step);
        assert_eq!(info["bytes"], std::fs::metadata(incr.join(f)).unwrap().len());
    }
    let dense_names = names(&model_dir.join("DENSE_UPDATE_VARIABLES"));
    let table_names = names(&model_dir.join("SPARSE_UPDATE_VARIABLES"));
    let (c10, c20) = (tensors(model_dir, 10), tensors(model_dir, 20));
    let dims: BTreeMap<usize, usize> = table_names.iter().map(|(id, n)| (*id, c20[n].shape[1])).collect();

    let (kind, step, vars) = read_update(&incr.join("dense_update_20"), &dims);
    assert_eq!((kind, step), (0, 20));
    assert_eq!(vars.len(), dense_names.len());
    for (id, _, values) in &vars {
        assert_eq!(&c20[&dense_names[id]].data, values, "{}", dense_names[id]);
    }

    // The latest value of every row the updates after step 10 carry.
    let mut latest: BTreeMap<(usize, i64), Vec<f32>> = BTreeMap::new();
    for step in [15, 20] {
        let (kind, s, tables) = read_update(&incr.join(format!("sparse_update_{step}")), &dims);
        assert_eq!((kind, s), (1, step));
        for (id, keys, values) in tables {
            let dim = dims[&id];
            for (k, key) in keys.iter().enumerate() {
                latest.insert((id, *key), values[k * dim..(k + 1) * dim].to_vec());
            }
        }
    }
    let mut changed = 0;
    for (id, name) in &table_names {
        let dim = dims[id];
        let rows = |t: &BTreeMap<String, Loaded>| -> BTreeMap<i64, Vec<f32>> {
            let values = &t[name].data;
            let keys: Vec<i64> = if key_value {
                t[&format!("{name}-keys")].ints.iter().map(|k| *k as i64).collect()
            } else {
                (0..values.len() / dim).map(|r| r as i64).collect()
            };
            keys.iter()
                .enumerate()
                .map(|(i, k)| (*k, values[i * dim..(i + 1) * dim].to_vec()))
                .collect()
        };
        let (before, after) = (rows(&c10), rows(&c20));
        for (key, value) in &after {
            if before.get(key) != Some(value) {
                changed += 1;
                assert_eq!(
                    latest.get(&(*id, *key)),
                    Some(value),
                    "{name} row {key} changed but is not updated"
                );
            }
        }
        let updated: BTreeSet<i64> = latest.keys().filter(|(t, _)| t == id).map(|(_, k)| *k).collect();
        for key in updated {
            assert_eq!(
                latest.get(&(*id, key)),
                after.get(&key),
                "{name} row {key}: the update holds another value"
            );
        }
    }
    assert!(changed > 0);
}

#[test]
fn updates_carry_every_changed_row_and_the_dense_parameters_in_easyrecs_format() {
    let incr = "incr_save_config { sparse_save_steps: 5 dense_save_steps: 10 fs {} }";
    // The third: the tables under TensorFlow's Adam, which moves every row
    // with momentum each step, trained or not.
    for (sample, key_value, adam) in [
        ("samples/wide_and_deep_criteo_sample.config", false, false),
        ("samples/wide_and_deep_criteo_sample_ev.config", true, false),
        ("samples/wide_and_deep_criteo_sample.config", false, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), sample, incr);
        if adam {
            let text = std::fs::read_to_string(&cfg).unwrap();
            assert!(text.contains("adagrad_optimizer"));
            std::fs::write(&cfg, text.replace("adagrad_optimizer", "adam_optimizer")).unwrap();
        }
        let model_dir = dir.path().join("model");
        let out = train(&cfg, &model_dir, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        check_updates(&model_dir, key_value);
        // The final export says where the updates go.
        let export = std::fs::read_dir(model_dir.join("export/final"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(export.join("assets/export_info.json")).unwrap()).unwrap();
        assert_eq!(
            info["incremental_updates"]["dir"].as_str(),
            Some(model_dir.join("incr_save").to_str().unwrap())
        );
    }
}

#[test]
fn targets_other_than_a_folder_or_a_topic_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (incr, field) in [
        (
            r#"incr_save_config { sparse_save_steps: 5 datahub { akId: "a" akSecret: "s" region: "r" project: "p" topic: "t" consumer { } } }"#,
            "train_config.incr_save_config.datahub",
        ),
        (
            "incr_save_config { sparse_save_steps: 5 }",
            "train_config.incr_save_config",
        ),
    ] {
        let cfg = config(dir.path(), "samples/wide_and_deep_criteo_sample.config", incr);
        let out = train(&cfg, &dir.path().join("model"), &[]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{err}");
    }
}

/// Sharded tables on 2 ranks: rank 0 writes every owner's rows, and the
/// updates hold what one process's hold.
#[test]
fn sharded_updates_equal_one_process() {
    let incr = "incr_save_config { sparse_save_steps: 5 dense_save_steps: 10 fs {} }";
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "samples/wide_and_deep_criteo_sample_ev.config", incr);
    let one = dir.path().join("one");
    // Batch-norm statistics are per rank: off in both.
    let no_bn = "--model_config.wide_and_deep.dnn.use_bn=false";
    let out = train(&cfg, &one, &["--data_config.batch_size=32", no_bn]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let two = dir.path().join("two");
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "--bind-to", "none", "-np", "2"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(ROOT)
        .arg(env!("CARGO_BIN_EXE_train_eval"))
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", two.to_str().unwrap()])
        .args([
            "--train_config.save_checkpoints_steps=10",
            "--data_config.batch_size=16",
            "--train_config.train_distribute=EmbeddingParallelStrategy",
            no_bn,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_updates(&two, true);
    let table_names = names(&one.join("SPARSE_UPDATE_VARIABLES"));
    let c = tensors(&one, 20);
    let dims: BTreeMap<usize, usize> = table_names.iter().map(|(id, n)| (*id, c[n].shape[1])).collect();
    let rows = |model_dir: &Path| -> BTreeMap<(usize, i64), Vec<f32>> {
        let (_, _, tables) = read_update(&model_dir.join("incr_save/sparse_update_20"), &dims);
        let mut out = BTreeMap::new();
        for (id, keys, values) in tables {
            for (k, key) in keys.iter().enumerate() {
                out.insert((id, *key), values[k * dims[&id]..(k + 1) * dims[&id]].to_vec());
            }
        }
        out
    };
    let (a, b) = (rows(&one), rows(&two));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, x) in &a {
        for (p, q) in x.iter().zip(&b[k]) {
            assert!((p - q).abs() <= 1e-5 + 1e-4 * p.abs(), "{k:?}: {q} vs one process {p}");
        }
    }
}

/// An export of step 10 with the updates of steps 15 and 20 applied scores
/// as the checkpoint of step 20 does (array and key-value tables, new keys
/// included); a damaged or out-of-order update is refused and changes
/// nothing.
#[test]
fn an_export_following_the_updates_scores_like_the_checkpoint_of_their_step() {
    use rustrec::export::updates::{by_step, LiveModel};
    let incr = "incr_save_config { sparse_save_steps: 5 dense_save_steps: 5 fs {} }";
    for sample in [
        "samples/wide_and_deep_criteo_sample.config",
        "samples/wide_and_deep_criteo_sample_ev.config",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), sample, incr);
        let model_dir = dir.path().join("model");
        let out = train(&cfg, &model_dir, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (export, source) = export_of_step_10(&cfg, &model_dir, dir.path());
        assert_eq!(source.export_step, 10);
        let mut live = LiveModel::load(&export, source.clone()).unwrap();
        let pending = by_step(source.pending(10).unwrap());
        assert_eq!(pending.keys().copied().collect::<Vec<_>>(), vec![15, 20]);
        // A damaged update (cut short) changes nothing.
        let cut = dir.path().join("sparse_update_15");
        let whole = std::fs::read(source.dir().unwrap().join("sparse_update_15")).unwrap();
        std::fs::write(&cut, &whole[..whole.len() - 3]).unwrap();
        let err = live.apply(&cut).unwrap_err().to_string();
        assert!(
            err.contains("run past the end") || err.contains("after its last"),
            "{err}"
        );
        assert_eq!(live.step, 10);
        for paths in pending.values() {
            for p in paths {
                live.apply(p).unwrap();
            }
        }
        assert_eq!(live.step, 20);
        // An update older than what is applied is refused.
        let err = live
            .apply(&source.dir().unwrap().join("sparse_update_15"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("already applied"), "{err}");
        let worst = worst_against_checkpoint(&cfg, (&export, &live), &model_dir, 20);
        assert!(
            worst <= 1e-5,
            "{sample}: the followed export differs from step 20 by {worst}"
        );
    }
}

/// Key-value tables that evict (a small max_capacity, and steps_to_live at
/// each save): the keys they drop go into `sparse_evict_<step>`, and an
/// export following the updates drops them too, scoring as the checkpoint
/// of the updates' step.
#[test]
fn evicted_keys_reach_an_export_following_the_updates() {
    use rustrec::export::updates::{by_step, LiveModel};
    let incr = "incr_save_config { sparse_save_steps: 5 dense_save_steps: 5 fs {} }";
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "samples/wide_and_deep_criteo_sample_ev.config", incr);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "steps_to_live: 150 max_capacity: 100000",
        "steps_to_live: 4 max_capacity: 48",
    );
    assert!(text.contains("max_capacity: 48"));
    std::fs::write(&cfg, text).unwrap();
    let model_dir = dir.path().join("model");
    let out = train(&cfg, &model_dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let updates = model_dir.join("incr_save");
    assert!(
        std::fs::read_dir(&updates).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("sparse_evict_")),
        "no evictions were written"
    );
    let (export, source) = export_of_step_10(&cfg, &model_dir, dir.path());
    let mut live = LiveModel::load(&export, source.clone()).unwrap();
    for paths in by_step(source.pending(10).unwrap()).values() {
        for p in paths {
            live.apply(p).unwrap();
        }
    }
    assert_eq!(live.step, 20);
    let worst = worst_against_checkpoint(&cfg, (&export, &live), &model_dir, 20);
    assert!(worst <= 1e-5, "the followed export differs from step 20 by {worst}");
}

/// Updates sent to Kafka (`incr_save_config.kafka`, with
/// `debug_save_update` keeping a copy in the folder): an export of step 10
/// following the topic scores as the checkpoint of step 20, and the topic
/// holds what the folder holds.
#[test]
fn updates_sent_to_kafka_keep_an_export_current() {
    use rustrec::export::updates::LiveModel;
    let server = std::env::var("RUSTREC_KAFKA").expect("RUSTREC_KAFKA: run under make test, which starts a broker");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("test_updates_{}_{nanos}", std::process::id());
    let incr = format!(
        r#"incr_save_config {{ sparse_save_steps: 5 dense_save_steps: 5 debug_save_update: true kafka {{ server: "{server}" topic: "{topic}" consumer {{ offset: 0 }} }} }}"#
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "samples/wide_and_deep_criteo_sample_ev.config", &incr);
    let model_dir = dir.path().join("model");
    let out = train(&cfg, &model_dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (export, source) = export_of_step_10(&cfg, &model_dir, dir.path());
    assert!(source.dir().is_none(), "the export follows the topic: {source:?}");
    // A consumer on another machine has the export and the topic, not
    // model_dir: the variable maps come from the topic.
    for map in ["DENSE_UPDATE_VARIABLES", "SPARSE_UPDATE_VARIABLES"] {
        std::fs::rename(model_dir.join(map), dir.path().join(map)).unwrap();
    }
    let mut live = LiveModel::load(&export, source).unwrap();
    let pending = live.pending().unwrap();
    let names: Vec<&str> = pending.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"dense_update_15") && names.contains(&"sparse_update_20"),
        "{names:?}"
    );
    for p in &pending {
        // The copy in the folder (debug_save_update) is the same update.
        let copy = std::fs::read(model_dir.join("incr_save").join(&p.name)).unwrap();
        assert_eq!(copy, p.bytes, "{}", p.name);
        live.apply_pending(p).unwrap();
    }
    assert_eq!(live.step, 20);
    assert!(live.pending().unwrap().is_empty());
    let worst = worst_against_checkpoint(&cfg, (&export, &live), &model_dir, 20);
    assert!(
        worst <= 1e-5,
        "the export following Kafka differs from step 20 by {worst}"
    );
}
