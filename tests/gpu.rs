//! The GPU executor (`--device gpu`, cargo feature `gpu`) against the CPU
//! executor: 20 training steps of DLRM, DeepFM, MMoE and DIN give the same
//! weights and evaluation, a GPU-trained model exports and scores like its
//! checkpoint, and two ranks train on GPUs as one. Without a GPU the device
//! is Mesa's software Vulkan driver (lavapipe), which `make test` installs.
#![cfg(feature = "gpu")]

mod common;

use std::path::Path;

use common::models::{bin, run_ok, setup};

/// Trains `cfg` for 20 steps on `device` into `model_dir`.
fn train(cfg: &Path, model_dir: &Path, device: &str, extra: &[&str]) {
    let mut c = bin("train_eval");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--device", device])
        .args(["--train_config.num_steps", "20"])
        .args(extra);
    run_ok(c);
}

/// Batch norms' statistics are per rank: off where ranks are compared.
const NO_BN: [&str; 2] = [
    "--model_config.dlrm.bot_dnn.use_bn=false",
    "--model_config.dlrm.top_dnn.use_bn=false",
];

/// Every weight of the latest checkpoint of `model_dir`, by name.
fn weights(model_dir: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let ckpt = rustrec::checkpoint::latest(model_dir).unwrap().unwrap();
    let (step, tensors) = rustrec::checkpoint::load(&ckpt).unwrap();
    assert_eq!(step, 20, "{}", model_dir.display());
    tensors.into_iter().map(|(k, v)| (k, v.data)).collect()
}

/// `got` within `rel` of `want` (relative, with the same floor absolute).
fn assert_near(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= rel * (1.0 + b.abs()),
            "{what}[{i}]: gpu {a} vs cpu {b}"
        );
    }
}

/// Every weight, optimizer slot and moving statistic after 20 steps. The
/// DNNs go without batch norms here: a bias a batch norm follows has no
/// gradient but rounding noise, which Adam turns into whole steps of either
/// sign on any two executors; batch norms stay on MultiTower's inputs.
#[test]
fn twenty_steps_on_the_gpu_equal_the_cpu() {
    for model in ["DLRM", "DeepFM", "MMoE", "MultiTowerDIN"] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = setup(dir.path(), model, "");
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, text.replace("hidden_units: [", "use_bn: false hidden_units: [")).unwrap();
        let cpu = dir.path().join("cpu");
        train(&cfg, &cpu, "cpu", &[]);
        let want = weights(&cpu);
        // The tables on the host, then kept on the GPU.
        for (name, extra) in [("gpu", &[][..]), ("gpu tables", &[TABLES_ON_GPU][..])] {
            let gpu = dir.path().join(name);
            train(&cfg, &gpu, "gpu", extra);
            let got = weights(&gpu);
            assert_eq!(
                want.keys().collect::<Vec<_>>(),
                got.keys().collect::<Vec<_>>(),
                "{model}, {name}: the checkpoints' tensors"
            );
            for (var, w) in &want {
                assert_near(&got[var], w, 1e-4, &format!("{model}, {name}: {var}"));
            }
            let read = |d: &Path| std::fs::read_to_string(d.join("eval_result.txt")).unwrap();
            assert_eq!(
                read(&cpu).lines().count(),
                read(&gpu).lines().count(),
                "{model}, {name}: eval results"
            );
        }
    }
}

/// Keeps every table of these tests on the GPU.
const TABLES_ON_GPU: &str = "--device_table_rows=100000";

/// The scores of a CSV `predict` wrote, by row (the reserved label
/// first, then the model's outputs).
fn scores(path: &Path) -> Vec<Vec<f32>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').skip(1).map(|v| v.parse().unwrap()).collect())
        .collect()
}

#[test]
fn a_model_trained_on_the_gpu_exports_and_scores_like_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let model_dir = dir.path().join("model");
    train(&cfg, &model_dir, "gpu", &[]);
    let export = dir.path().join("export");
    let mut c = bin("export");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--export_dir", export.to_str().unwrap()]);
    run_ok(c);
    let version = std::fs::read_dir(&export).unwrap().next().unwrap().unwrap().path();
    let data = dir.path().join("data.csv");
    let (from_export, on_gpu) = (dir.path().join("export.csv"), dir.path().join("gpu.csv"));
    let mut c = bin("predict");
    c.args(["--saved_model_dir", version.to_str().unwrap()])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", from_export.to_str().unwrap()])
        .args(["--reserved_cols", "label"]);
    run_ok(c);
    let mut c = bin("predict");
    c.args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", model_dir.to_str().unwrap()])
        .args(["--device", "gpu"])
        .args(["--input_path", data.to_str().unwrap()])
        .args(["--output_path", on_gpu.to_str().unwrap()])
        .args(["--reserved_cols", "label"]);
    run_ok(c);
    let (a, b) = (scores(&from_export), scores(&on_gpu));
    assert_eq!(a.len(), 300);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_near(y, x, 1e-5, "export vs checkpoint on the gpu");
    }
}

/// Two ranks on GPUs under every synchronous mode (sharded tables,
/// synchronous parameter servers, replicas) equal one rank on the CPU.
#[test]
fn two_ranks_on_gpus_train_as_one_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DLRM", "");
    let one = dir.path().join("one");
    train(&cfg, &one, "cpu", &NO_BN);
    let want = weights(&one);
    for (strategy, tables) in [
        ("EmbeddingParallelStrategy", None),
        ("NoStrategy", None),
        ("MultiWorkerMirroredStrategy", None),
        // Replicated tables kept on each rank's GPU, their gradients
        // summed over the ranks.
        ("MultiWorkerMirroredStrategy", Some(TABLES_ON_GPU)),
    ] {
        let two = dir
            .path()
            .join(format!("{strategy}{}", if tables.is_some() { "-tables" } else { "" }));
        // Each rank half of the same global batch of 32.
        let mut c = common::mpirun();
        c.args(["-np", "2", env!("CARGO_BIN_EXE_train_eval")])
            .args(["--pipeline_config_path", cfg.to_str().unwrap()])
            .args(["--model_dir", two.to_str().unwrap()])
            .args(["--device", "gpu"])
            .args(["--train_config.num_steps=20", "--data_config.batch_size=16"])
            .arg(format!("--train_config.train_distribute={strategy}"))
            .args(NO_BN)
            .args(tables);
        run_ok(c);
        let got = weights(&two);
        for (name, w) in &want {
            assert_near(&got[name], w, 1e-4, &format!("2 ranks, {strategy} {tables:?}: {name}"));
        }
    }
}

/// The other distributed modes with GPU workers: SokStrategy (every table
/// key-value, sharded among the ranks) on two GPU ranks equals one CPU rank
/// under it, keys and counts included; asynchronous parameter servers (one
/// server, two GPU workers) train to the last step with every weight
/// finite and evaluate.
#[test]
fn sok_and_asynchronous_parameter_servers_train_on_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DLRM", "");
    let sok = "--train_config.train_distribute=SokStrategy";
    let one = dir.path().join("sok_one");
    let mut args = NO_BN.to_vec();
    args.push(sok);
    train(&cfg, &one, "cpu", &args);
    let two = dir.path().join("sok_two");
    let mut c = common::mpirun();
    c.args(["-np", "2", env!("CARGO_BIN_EXE_train_eval")])
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", two.to_str().unwrap()])
        .args(["--device", "gpu", sok])
        .args(["--train_config.num_steps=20", "--data_config.batch_size=16"])
        .args(NO_BN);
    run_ok(c);
    // Rows by key: each rank writes its own keys, joined end to end.
    let load = |d: &Path| {
        let ckpt = rustrec::checkpoint::latest(d).unwrap().unwrap();
        common::by_key(rustrec::checkpoint::load(&ckpt).unwrap().1)
    };
    let (want, got) = (load(&one), load(&two));
    assert!(want.keys().any(|k| k.ends_with("-keys")), "key-value tables saved");
    assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
    for (name, w) in &want {
        assert_eq!(got[name].ints, w.ints, "SokStrategy on 2 gpu ranks: {name}");
        assert_near(
            &got[name].data,
            &w.data,
            1e-4,
            &format!("SokStrategy on 2 gpu ranks: {name}"),
        );
    }

    let ps = dir.path().join("async");
    let mut c = common::mpirun();
    c.args(["-np", "3", env!("CARGO_BIN_EXE_train_eval")])
        .args(["--pipeline_config_path", cfg.to_str().unwrap()])
        .args(["--model_dir", ps.to_str().unwrap()])
        .args(["--device", "gpu", "--num_ps", "1"])
        .args(["--train_config.num_steps=20", "--train_config.sync_replicas=false"]);
    run_ok(c);
    let saved = weights(&ps);
    assert!(saved.values().flatten().all(|x| x.is_finite()));
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ps.join("eval_result.txt")).unwrap()).unwrap();
    assert!(result["auc"].as_f64().is_some_and(|a| a > 0.0), "{result}");
}
