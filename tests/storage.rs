//! Inputs, model_dirs and exports on remote storage, against real servers
//! (`make test` starts them: scripts/storage-servers): an S3-compatible
//! store and HDFS (Hadoop's MiniDFSCluster). Training reads CSV and Parquet
//! from them, checkpoints into a remote model_dir, survives kill -9 and
//! resumes, exports and scores from there, and two MPI ranks share one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use common::models::{bin, run_ok, setup};

/// The S3 server's endpoint and the HDFS namenode, as `make test` names them.
fn server(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the tests with `make test`, which starts the storage servers \
             (scripts/storage-servers start DIR; DIR/env names them)"
        )
    })
}

/// The S3 client's settings, for this process (uploads, listings) and the
/// binaries it runs.
fn s3_env() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", server("RUSTREC_S3_ENDPOINT")),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
    ]
}

fn init() {
    static ONCE: Once = Once::new();
    // Set before any test of this file reads the environment or starts a
    // process (every test calls this first).
    ONCE.call_once(|| {
        for (k, v) in s3_env() {
            std::env::set_var(k, v);
        }
    });
}

/// A fresh prefix on backend `kind` ("s3" or "hdfs").
fn base(kind: &str, what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("{what}-{}-{nanos}", std::process::id());
    match kind {
        "s3" => format!("s3://rustrec-test/{name}"),
        _ => format!("{}/{name}", server("RUSTREC_HDFS")),
    }
}

fn put(url: &str, from: &Path) {
    rustrec::storage::object(Path::new(url)).unwrap().upload(from).unwrap();
}

fn listing(url: &str) -> Vec<String> {
    rustrec::storage::object(Path::new(url))
        .unwrap()
        .list()
        .unwrap()
        .into_iter()
        .map(|l| l.relative)
        .collect()
}

fn read(url: &str) -> String {
    String::from_utf8(rustrec::storage::read(Path::new(url), 1 << 20).unwrap()).unwrap()
}

fn predictions(path: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "probs").unwrap_or(0);
    lines.map(|l| l.split(',').nth(col).unwrap().parse().unwrap()).collect()
}

/// CSV data split over two remote files, a remote model_dir: train,
/// resume, export to a remote export_dir, score from the export and
/// from the checkpoint (equal), evaluate.
fn round_trip(kind: &str) {
    init();
    let dir = tempfile::tempdir().unwrap();
    let remote = base(kind, "round-trip");
    let cfg = setup(dir.path(), "DeepFM", "");
    // Two input files under a remote prefix, matched by a glob.
    let text = std::fs::read_to_string(dir.path().join("data.csv")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (a, b) = lines.split_at(lines.len() / 2);
    std::fs::write(dir.path().join("a.csv"), a.join("\n") + "\n").unwrap();
    std::fs::write(dir.path().join("b.csv"), b.join("\n") + "\n").unwrap();
    put(&format!("{remote}/data/part-0.csv"), &dir.path().join("a.csv"));
    put(&format!("{remote}/data/part-1.csv"), &dir.path().join("b.csv"));
    let model_dir = format!("{remote}/model");
    let train = |steps: u32, resume: bool| {
        let mut c = bin("train_eval");
        c.arg("--pipeline_config_path")
            .arg(&cfg)
            .args(["--model_dir", &model_dir])
            .args(["--train_input_path", &format!("{remote}/data/*.csv")])
            .args(["--eval_input_path", &format!("{remote}/data")])
            .arg(format!("--train_config.num_steps={steps}"));
        if resume {
            c.arg("--continue_train");
        }
        run_ok(c)
    };
    train(20, false);
    let files = listing(&model_dir);
    for want in [
        "checkpoint",
        "pipeline.config",
        "model.ckpt-20/manifest.json",
        "model.ckpt-20/dense.safetensors",
    ] {
        assert!(files.iter().any(|f| f == want), "{kind}: {want} missing from {files:?}");
    }
    assert!(
        !files.iter().any(|f| f.starts_with('.')),
        "{kind}: temporaries or the lease left: {files:?}"
    );
    assert!(read(&format!("{model_dir}/checkpoint")).contains("model.ckpt-20"));
    // A fresh run into it is refused; --continue_train goes on.
    let mut again = bin("train_eval");
    again
        .arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--model_dir", &model_dir]);
    let out = again.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds checkpoints"));
    let log = train(30, true);
    assert!(log.contains("resumed from"), "{log}");
    assert!(read(&format!("{model_dir}/checkpoint")).contains("model.ckpt-30"));

    // Export into a remote export_dir; the printed path is the remote version.
    let export_root = format!("{remote}/export");
    let mut e = bin("export");
    e.arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--model_dir", &model_dir, "--export_dir", &export_root]);
    let out = e.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(version.starts_with(&export_root), "{version}");
    assert!(listing(&export_root)
        .iter()
        .any(|f| f.ends_with("assets/export_info.json")));

    let from_export = dir.path().join("export.csv");
    let mut p = bin("predict");
    p.args([
        "--saved_model_dir",
        &version,
        "--input_path",
        &format!("{remote}/data/part-0.csv"),
    ])
    .arg("--output_path")
    .arg(&from_export);
    run_ok(p);
    // From the checkpoint, written to a remote output path.
    let from_ckpt = dir.path().join("ckpt.csv");
    let mut p = bin("predict");
    p.arg("--pipeline_config_path").arg(&cfg).args([
        "--model_dir",
        &model_dir,
        "--input_path",
        &format!("{remote}/data/part-0.csv"),
        "--output_path",
        &format!("{remote}/scores/ckpt.csv"),
    ]);
    run_ok(p);
    std::fs::write(&from_ckpt, read(&format!("{remote}/scores/ckpt.csv"))).unwrap();
    let (x, y) = (predictions(&from_export), predictions(&from_ckpt));
    assert_eq!(x.len(), a.len());
    for (u, v) in x.iter().zip(&y) {
        assert!((u - v).abs() < 1e-5, "{kind}: export {u} vs checkpoint {v}");
    }

    serve_follows(&export_root, &version, &cfg, &model_dir, a, &x);

    // eval writes its result into the remote model_dir.
    let mut ev = Command::new(env!("CARGO_BIN_EXE_eval"));
    ev.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--pipeline_config_path")
        .arg(&cfg)
        .args([
            "--model_dir",
            &model_dir,
            "--eval_input_path",
            &format!("{remote}/data/part-1.csv"),
        ]);
    run_ok(ev);
    assert!(listing(&model_dir).iter().any(|f| f == "eval_result.txt"));
}

/// A `serve` on `model_dir` (an export root), its address and a client.
struct Served {
    child: std::process::Child,
    addr: String,
    agent: ureq::Agent,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start(model_dir: &str) -> Served {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let mut child = bin("serve")
            .args(["--model_dir", model_dir, "--port", "0", "--host", "127.0.0.1"])
            .args(["--file_system_poll_wait_seconds", "0.2"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("serve printed {line:?}: {}", std::fs::read_to_string(&log).unwrap()))
            .to_string();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        Served {
            child,
            addr,
            agent,
            log,
            _dir: dir,
        }
    }

    /// The scores of the first five CSV `rows` (setup's columns).
    fn scores(&self, rows: &[&str]) -> Vec<f64> {
        let fields = ["label", "d1", "d2", "c1", "c2", "c3", "c4", "label2"];
        let instances: Vec<serde_json::Value> = rows[..5]
            .iter()
            .map(|r| {
                let obj: serde_json::Map<String, serde_json::Value> = fields
                    .iter()
                    .zip(r.split(','))
                    .filter(|(f, _)| !f.starts_with("label"))
                    .map(|(f, v)| (f.to_string(), serde_json::json!(v)))
                    .collect();
                serde_json::Value::Object(obj)
            })
            .collect();
        let body = serde_json::json!({ "instances": instances }).to_string();
        let text = self
            .agent
            .post(&format!("http://{}/v1/models/model:predict", self.addr))
            .content_type("application/json")
            .send(&body)
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let preds = v["predictions"].as_array().unwrap_or_else(|| panic!("{text}"));
        assert_eq!(preds.len(), 5, "{text}");
        preds
            .iter()
            .map(|p| {
                p["probs"]
                    .as_f64()
                    .or_else(|| p.as_f64())
                    .unwrap_or_else(|| panic!("{p}"))
            })
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Calls `check` every 200 ms until it passes; fails after 60 s with
    /// its last complaint and the server's log.
    fn wait_until(&self, mut check: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(why) = check() {
            assert!(Instant::now() < deadline, "{why}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` on the remote export root answers as predict did, then picks
/// up a version exported there after it started.
fn serve_follows(export_root: &str, version: &str, cfg: &Path, model_dir: &str, rows: &[&str], want: &[f64]) {
    let served = Served::start(export_root);
    for (got, w) in served.scores(rows).iter().zip(want) {
        assert!((got - w).abs() < 1e-5, "served {got}, predict {w}");
    }
    // A second export: a new version number, followed by the server.
    let mut e = bin("export");
    e.arg("--pipeline_config_path")
        .arg(cfg)
        .args(["--model_dir", model_dir, "--export_dir", export_root]);
    let out = e.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_ne!(second, version);
    let number = second.rsplit('/').next().unwrap().to_string();
    served.wait_until(|| {
        let status = served
            .agent
            .get(&format!("http://{}/v1/models/model", served.addr))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        if status.contains(&format!("\"{number}\"")) {
            Ok(())
        } else {
            Err(format!("version {number} not served: {status}"))
        }
    });
}

#[test]
fn s3_round_trip() {
    round_trip("s3");
}

#[test]
fn hdfs_round_trip() {
    round_trip("hdfs");
}

/// Parquet from each server (ranged reads of its row groups and columns,
/// the next row group fetched ahead) trains as the same files on local
/// disk do: the same checkpoint bytes.
#[test]
fn parquet_from_remote_trains_as_local() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("train.parquet");
    let out = Command::new(env!("CARGO_BIN_EXE_gen_data"))
        .arg("--output")
        .arg(&data)
        // Three row groups: the next one's fetch overlaps the reading.
        .args([
            "--rows",
            "3000",
            "--cap",
            "500",
            "--seed",
            "3",
            "--row_group_rows",
            "1000",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/wide_and_deep_synthetic.config");
    let train = |input: &str, model_dir: &str| {
        let mut c = bin("train_eval");
        c.arg("--pipeline_config_path")
            .arg(&config)
            .args([
                "--model_dir",
                model_dir,
                "--train_input_path",
                input,
                "--eval_input_path",
                input,
            ])
            .args(["--train_config.num_steps=12", "--data_config.batch_size=128"])
            .arg("--train_config.save_checkpoints_steps=12");
        run_ok(c);
    };
    let local_dir = dir.path().join("local");
    train(data.to_str().unwrap(), local_dir.to_str().unwrap());
    let local_manifest = std::fs::read_to_string(local_dir.join("model.ckpt-12/manifest.json")).unwrap();
    let files = |m: &str| serde_json::from_str::<serde_json::Value>(m).unwrap()["files"].clone();
    for kind in ["s3", "hdfs"] {
        let remote = base(kind, "parquet");
        put(&format!("{remote}/train.parquet"), &data);
        let model_dir = format!("{remote}/model");
        train(&format!("{remote}/train.parquet"), &model_dir);
        let manifest = read(&format!("{model_dir}/model.ckpt-12/manifest.json"));
        assert_eq!(files(&manifest), files(&local_manifest), "{kind}");
    }
}

/// kill -9 while training into a remote model_dir, then --continue_train:
/// the job resumes from the last published checkpoint (the dead job's
/// lease is taken over) and finishes.
fn kill_and_continue(kind: &str) {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let model_dir = format!("{}/model", base(kind, "kill"));
    let args = |resume: bool| {
        let mut a = vec![
            "--pipeline_config_path".to_string(),
            cfg.to_str().unwrap().to_string(),
            "--model_dir".into(),
            model_dir.clone(),
            "--train_config.num_steps=100".into(),
            "--train_config.save_checkpoints_steps=5".into(),
            "--data_config.num_epochs=0".into(),
        ];
        if resume {
            a.push("--continue_train".into());
        }
        a
    };
    let mut child = bin("train_eval")
        .args(args(false))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let state = format!("{model_dir}/checkpoint");
    while rustrec::storage::object(Path::new(&state))
        .unwrap()
        .size()
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no checkpoint published");
        assert!(
            child.try_wait().unwrap().is_none(),
            "training ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let log = run_ok({
        let mut c = bin("train_eval");
        c.args(args(true));
        c
    });
    assert!(log.contains("resumed from"), "{log}");
    assert!(log.contains("lapsed lease"), "{log}");
    assert!(read(&state).contains("model.ckpt-100"));
    let files = listing(&model_dir);
    assert!(!files.iter().any(|f| f.starts_with('.')), "{files:?}");
}

/// A live job's lease keeps a second job out (exit 1, naming the holder).
#[test]
fn s3_kill_and_continue() {
    kill_and_continue("s3");
}

#[test]
fn hdfs_kill_and_continue() {
    kill_and_continue("hdfs");
}

fn lease_keeps_a_second_job_out(kind: &str) {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let model_dir = format!("{}/model", base(kind, "lease"));
    let lease = rustrec::storage::mirror::Lease::take(Path::new(&model_dir)).unwrap();
    let mut c = bin("train_eval");
    c.arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--model_dir", &model_dir]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in use by another job"), "{stderr}");
    drop(lease);
    assert!(listing(&model_dir).is_empty());
}

#[test]
fn s3_lease_keeps_a_second_job_out() {
    lease_keeps_a_second_job_out("s3");
}

#[test]
fn hdfs_lease_keeps_a_second_job_out() {
    lease_keeps_a_second_job_out("hdfs");
}

#[test]
fn s3_two_ranks_share_a_model_dir() {
    two_ranks_share_a_model_dir("s3");
}

#[test]
fn hdfs_two_ranks_share_a_model_dir() {
    two_ranks_share_a_model_dir("hdfs");
}

/// Two MPI ranks with sharded tables share one remote model_dir: each
/// publishes its shard, the first rank the rest; the checkpoint equals
/// the one the same job writes to a local model_dir, and one rank
/// resumes from it.
fn two_ranks_share_a_model_dir(kind: &str) {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let run = |model_dir: &str| {
        let out = common::mpirun()
            .args(["-np", "2"])
            .arg(env!("CARGO_BIN_EXE_train_eval"))
            .arg("--pipeline_config_path")
            .arg(&cfg)
            .args(["--model_dir", model_dir])
            .arg("--train_config.train_distribute=EmbeddingParallelStrategy")
            .arg("--train_config.num_steps=20")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let local: PathBuf = dir.path().join("local");
    run(local.to_str().unwrap());
    let model_dir = format!("{}/model", base(kind, "ranks"));
    run(&model_dir);
    let files = listing(&model_dir);
    for shard in [
        "embedding-00000-of-00002.safetensors",
        "embedding-00001-of-00002.safetensors",
    ] {
        assert!(
            files.iter().any(|f| f == &format!("model.ckpt-20/{shard}")),
            "{files:?}"
        );
    }
    let manifest = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap()["files"].clone();
    let local_manifest = std::fs::read_to_string(local.join("model.ckpt-20/manifest.json")).unwrap();
    assert_eq!(
        manifest(&read(&format!("{model_dir}/model.ckpt-20/manifest.json"))),
        manifest(&local_manifest)
    );
    let mut c = bin("train_eval");
    c.arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--model_dir", &model_dir, "--continue_train"])
        .arg("--train_config.num_steps=25");
    let log = run_ok(c);
    assert!(log.contains("resumed from"), "{log}");
}

/// An unreachable endpoint: the requests are retried with backoff, then
/// the job stops with exit 1 naming the URL and the endpoint.
#[test]
fn unreachable_endpoint_names_url_and_endpoint() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let url = "s3://rustrec-test/nowhere/train.csv";
    let t = Instant::now();
    let out = bin("train_eval")
        .arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--train_input_path", url])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(url) && stderr.contains(&endpoint), "{stderr}");
    // Retried (with backoff) before giving up, within the retry budget.
    assert!(stderr.contains("retr"), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(150), "{:?}", t.elapsed());
}

/// A store that throttles: an HTTP server answering the first requests
/// with 503 SlowDown and then serving one object (HEAD and ranged GET).
/// Training reads the object through the retries; the server counts them.
#[test]
fn throttled_requests_are_retried() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let body = Arc::new(std::fs::read(dir.path().join("data.csv")).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let throttled = Arc::new(AtomicUsize::new(0));
    let (b, t) = (body.clone(), throttled.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (b, t) = (b.clone(), t.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut request = String::new();
                    if reader.read_line(&mut request).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut range = None;
                    loop {
                        let mut h = String::new();
                        reader.read_line(&mut h).unwrap();
                        if h.trim().is_empty() {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                            let (a, z) = v.trim().split_once('-').unwrap();
                            range = Some((a.parse::<usize>().unwrap(), z.parse::<usize>().unwrap()));
                        }
                    }
                    let common = "Last-Modified: Thu, 26 Nov 2026 10:00:00 GMT\r\nETag: \"e1\"\r\n";
                    if t.fetch_add(1, Ordering::SeqCst) < 3 {
                        let msg =
                            "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
                        let _ = write!(
                            out,
                            "HTTP/1.1 503 Slow Down\r\nContent-Length: {}\r\n\r\n{msg}",
                            msg.len()
                        );
                        continue;
                    }
                    let head = request.starts_with("HEAD");
                    let (status, part) = match range {
                        Some((a, z)) => {
                            let z = z.min(b.len() - 1);
                            let cr = format!("Content-Range: bytes {a}-{z}/{}\r\n", b.len());
                            ("206 Partial Content", (b[a..=z].to_vec(), cr))
                        }
                        None => ("200 OK", (b.to_vec(), String::new())),
                    };
                    let _ = write!(
                        out,
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{common}{}\r\n",
                        part.0.len(),
                        part.1
                    );
                    if !head {
                        let _ = out.write_all(&part.0);
                    }
                }
            });
        }
    });
    let url = "s3://throttled/train.csv";
    let out = bin("train_eval")
        .arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--train_input_path", url, "--model_dir"])
        .arg(dir.path().join("model"))
        .arg("--train_config.num_steps=5")
        .env("AWS_ENDPOINT_URL", &endpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(throttled.load(Ordering::SeqCst) > 3, "{stderr}");
}

/// Incremental updates into the folder of a remote model_dir go there as
/// they are written (each file whole, its `.done` flag after it), with the
/// variable maps; an export of an earlier checkpoint records them by their
/// remote place, and `serve` on the remote export follows them to the
/// scores of the checkpoint of their step.
fn incremental_updates_reach_a_served_export(kind: &str) {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "save_checkpoints_steps: 10",
        "save_checkpoints_steps: 10 incr_save_config { sparse_save_steps: 5 dense_save_steps: 5 fs { } }",
    );
    std::fs::write(&cfg, text).unwrap();
    let remote = base(kind, "incr");
    let model_dir = format!("{remote}/model");
    let mut c = bin("train_eval");
    c.arg("--pipeline_config_path")
        .arg(&cfg)
        .args(["--model_dir", &model_dir, "--train_config.num_steps=20"]);
    run_ok(c);
    let files = listing(&model_dir);
    for want in [
        "DENSE_UPDATE_VARIABLES",
        "SPARSE_UPDATE_VARIABLES",
        "incr_save/dense_update_5",
        "incr_save/dense_update_5.done",
        "incr_save/sparse_update_15.done",
        "incr_save/dense_update_20.done",
        "incr_save/sparse_update_20",
    ] {
        assert!(files.iter().any(|f| f == want), "{kind}: {want} missing from {files:?}");
    }
    assert!(
        !files.iter().any(|f| f.contains("/.") || f.starts_with('.')),
        "{files:?}"
    );
    // Export step 10 (remote to remote): it names the remote updates.
    let export_root = format!("{remote}/export");
    let mut e = bin("export");
    e.arg("--pipeline_config_path").arg(&cfg).args([
        "--model_dir",
        &model_dir,
        "--checkpoint_path",
        &format!("{model_dir}/model.ckpt-10"),
        "--export_dir",
        &export_root,
    ]);
    let out = e.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let info: serde_json::Value = serde_json::from_str(&read(&format!("{version}/assets/export_info.json"))).unwrap();
    assert_eq!(
        info["incremental_updates"]["dir"],
        format!("{model_dir}/incr_save"),
        "{info}"
    );
    assert_eq!(
        info["incremental_updates"]["dense_variables"],
        format!("{model_dir}/DENSE_UPDATE_VARIABLES")
    );
    // What step 20 scores, from its checkpoint.
    let scores = dir.path().join("step20.csv");
    let mut p = bin("predict");
    p.arg("--pipeline_config_path").arg(&cfg).args([
        "--model_dir",
        &model_dir,
        "--checkpoint_path",
        &format!("{model_dir}/model.ckpt-20"),
        "--input_path",
        dir.path().join("data.csv").to_str().unwrap(),
        "--output_path",
        scores.to_str().unwrap(),
    ]);
    run_ok(p);
    let want = predictions(&scores);
    let text = std::fs::read_to_string(dir.path().join("data.csv")).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    let served = Served::start(&export_root);
    served.wait_until(|| {
        let got = served.scores(&rows);
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        if worst < 1e-5 {
            Ok(())
        } else {
            Err(format!("{kind}: the served export stays {worst} from step 20's scores"))
        }
    });
    assert!(served.log().contains("serving step 20"), "{}", served.log());
}

#[test]
fn s3_incremental_updates_reach_a_served_export() {
    incremental_updates_reach_a_served_export("s3");
}

#[test]
fn hdfs_incremental_updates_reach_a_served_export() {
    incremental_updates_reach_a_served_export("hdfs");
}

/// A file larger than a part goes up in parts (S3's multipart upload,
/// HDFS's streamed write) and comes down whole, streamed to disk; a part
/// size below the file's replaces the object in place.
#[test]
fn large_files_go_up_in_parts_and_come_down_whole() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rustrec::util::Rng::new(7);
    let bytes: Vec<u8> = (0..(12 << 20) + 123).map(|_| rng.next_u64() as u8).collect();
    let from = dir.path().join("big.bin");
    std::fs::write(&from, &bytes).unwrap();
    for kind in ["s3", "hdfs"] {
        let url = format!("{}/big.bin", base(kind, "parts"));
        let o = rustrec::storage::object(Path::new(&url)).unwrap();
        o.put(b"old".to_vec()).unwrap();
        o.upload_in_parts(&from, 5 << 20).unwrap();
        assert_eq!(o.size().unwrap(), Some(bytes.len() as u64), "{kind}");
        let to = dir.path().join(format!("{kind}.bin"));
        assert_eq!(o.download(&to).unwrap(), bytes.len() as u64);
        assert!(std::fs::read(&to).unwrap() == bytes, "{kind}: the download differs");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{kind}: temporaries left {left:?}");
        let parent = url.rsplit_once('/').unwrap().0;
        assert_eq!(listing(parent), vec!["big.bin".to_string()], "{kind}");
        if kind == "s3" {
            // S3 tags an object uploaded in parts with their count.
            let listed = rustrec::storage::object(Path::new(parent)).unwrap().list().unwrap();
            let tag = listed[0].e_tag.clone().unwrap_or_default();
            assert!(tag.trim_matches('"').ends_with("-3"), "{tag}");
        }
    }
}

/// A resumed job on a remote model_dir keeps keep_checkpoint_max
/// checkpoints there, counting those an earlier job left (which its copy
/// never downloaded); and `enable_oss_stop_signal` looks for the signal in
/// the remote model_dir while the job runs.
#[test]
fn remote_checkpoints_are_pruned_and_the_stop_signal_is_seen() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DeepFM", "");
    let model_dir = format!("{}/model", base("s3", "prune"));
    let train = |extra: &[&str]| {
        let mut c = bin("train_eval");
        c.arg("--pipeline_config_path")
            .arg(&cfg)
            .args(["--model_dir", &model_dir, "--train_config.keep_checkpoint_max=2"])
            .args(extra);
        c
    };
    run_ok(train(&["--train_config.num_steps=30"]));
    let ckpts = |files: &[String]| {
        let mut c: Vec<String> = files
            .iter()
            .filter_map(|f| f.strip_suffix("/manifest.json"))
            .map(String::from)
            .collect();
        c.sort();
        c
    };
    assert_eq!(ckpts(&listing(&model_dir)), ["model.ckpt-20", "model.ckpt-30"]);
    run_ok(train(&["--train_config.num_steps=50", "--continue_train"]));
    let files = listing(&model_dir);
    assert_eq!(ckpts(&files), ["model.ckpt-40", "model.ckpt-50"]);
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with("model.ckpt-20/") || f.starts_with("model.ckpt-30/")),
        "{files:?}"
    );
    // The signal, put while the job runs, ends it with a checkpoint.
    let mut c = train(&[
        "--train_config.num_steps=1000000",
        "--train_config.enable_oss_stop_signal=true",
        "--continue_train",
    ]);
    let mut child = c.stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ckpts(&listing(&model_dir))
        .iter()
        .any(|c| c != "model.ckpt-40" && c != "model.ckpt-50")
    {
        assert!(Instant::now() < deadline, "no checkpoint after step 50");
        assert!(child.try_wait().unwrap().is_none(), "the job ended early");
        std::thread::sleep(Duration::from_millis(300));
    }
    rustrec::storage::object(Path::new(&format!("{model_dir}/OSS_STOP_SIGNAL")))
        .unwrap()
        .put(Vec::new())
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "the stop signal was not seen");
        std::thread::sleep(Duration::from_millis(300));
    }
    let state = read(&format!("{model_dir}/checkpoint"));
    let last: u64 = state
        .lines()
        .find_map(|l| l.strip_prefix("model_checkpoint_path: \"model.ckpt-"))
        .and_then(|v| v.trim_end_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("{state}"));
    assert!(last > 50 && last < 1_000_000, "{state}");
    assert_eq!(ckpts(&listing(&model_dir)).len(), 2);
}

/// A config on remote storage finds the `fg_json_path` file named beside
/// it (EasyRec reads both through its file system layer).
#[test]
fn a_remote_config_reads_its_feature_generation_file_beside_it() {
    init();
    let dir = tempfile::tempdir().unwrap();
    let remote = base("s3", "fg");
    let fg = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rtp_fg/fg.json");
    put(&format!("{remote}/conf/fg_here.json"), &fg);
    let cfg = dir.path().join("pipeline.config");
    std::fs::write(
        &cfg,
        "fg_json_path: \"fg_here.json\"\ndata_config { input_type: RTPInput label_fields: \"clk\" }\n",
    )
    .unwrap();
    put(&format!("{remote}/conf/pipeline.config"), &cfg);
    let message =
        rustrec::config::loader::read_pipeline_file(Path::new(&format!("{remote}/conf/pipeline.config"))).unwrap();
    let config: rustrec::config::proto::EasyRecConfig = message.transcode_to().unwrap();
    let fields: Vec<String> = config
        .data_config
        .unwrap()
        .input_fields
        .into_iter()
        .map(|f| f.input_name)
        .collect();
    assert_eq!(fields.len(), 19, "{fields:?}");
    assert_eq!(fields[..2], ["clk", "user_id"]);
    assert_eq!(config.fg_json_path.as_deref(), Some("!fg_here.json"));
}
