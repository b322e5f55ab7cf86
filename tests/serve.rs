//! `serve` on a loopback port: raw rows in TF Serving's row and column forms
//! and KServe's v2 form get the scores `predict` writes for the same rows,
//! for a single-task and a multi-task export; a new version is swapped in
//! while requests run and a broken one is refused; malformed bodies get
//! 4xx answers and the server keeps answering.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::models::{bin, run_ok, setup};

/// Trains `model` under `dir` and exports it; returns the export root.
fn trained(dir: &Path, model: &str) -> (PathBuf, PathBuf) {
    let cfg = setup(dir, model, "");
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&cfg);
    run_ok(t);
    let root = dir.join("export");
    export(&cfg, &root, None);
    (cfg, root)
}

fn export(cfg: &Path, root: &Path, checkpoint: Option<&str>) {
    let mut e = bin("export");
    e.arg("--pipeline_config_path").arg(cfg).arg("--export_dir").arg(root);
    if let Some(c) = checkpoint {
        e.arg("--checkpoint_path").arg(c);
    }
    run_ok(e);
}

/// The input columns of the generated rows (see `common::models`).
const FIELDS: [&str; 8] = ["label", "d1", "d2", "c1", "c2", "c3", "c4", "label2"];

fn rows_of(data: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(data)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// `predict`'s scores of the export: column name to values.
fn predicted(root: &Path, data: &Path, out: &Path) -> Vec<(String, Vec<f64>)> {
    let mut p = bin("predict");
    p.arg("--saved_model_dir")
        .arg(root)
        .arg("--input_path")
        .arg(data)
        .arg("--output_path")
        .arg(out);
    run_ok(p);
    let text = std::fs::read_to_string(out).unwrap();
    let mut lines = text.lines();
    let names: Vec<String> = lines.next().unwrap().split(',').map(str::to_string).collect();
    let mut cols: Vec<(String, Vec<f64>)> = names.into_iter().map(|n| (n, Vec::new())).collect();
    for l in lines {
        for (c, v) in cols.iter_mut().zip(l.split(',')) {
            c.1.push(v.parse().unwrap());
        }
    }
    cols
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    base: String,
    /// The gRPC address, when started with `--grpc_port`.
    grpc: Option<String>,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(root: &Path, extra: &[&str]) -> Server {
        let log = root.with_extension("serve.log");
        let mut c = bin("serve");
        c.arg("--model_dir")
            .arg(root)
            .args(["--port", "0", "--host", "127.0.0.1"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = c.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addr = |prefix: &str| {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("serve printed {line:?}: {}", std::fs::read_to_string(&log).unwrap()))
                .to_string()
        };
        let http = addr("listening on ");
        let grpc = extra.contains(&"--grpc_port").then(|| addr("grpc listening on "));
        Server {
            child,
            base: format!("http://{http}"),
            grpc,
            log,
        }
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into()
    }

    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let mut r = Self::agent()
            .post(&format!("{}{path}", self.base))
            .content_type("application/json")
            .send(body)
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let code = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path} answered {code} {text:?}: {e}"));
        (code, v)
    }

    fn get(&self, path: &str) -> (u16, String) {
        let mut r = Self::agent()
            .get(&format!("{}{path}", self.base))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }
}

/// The request rows `range` as objects of input values (labels left out,
/// as a client has none).
fn instances(rows: &[Vec<String>], range: std::ops::Range<usize>) -> Value {
    let list: Vec<Value> = rows[range]
        .iter()
        .map(|r| {
            let obj: serde_json::Map<String, Value> = FIELDS
                .iter()
                .zip(r)
                .filter(|(f, _)| !f.starts_with("label"))
                .map(|(f, v)| (f.to_string(), json!(v)))
                .collect();
            Value::Object(obj)
        })
        .collect();
    json!({ "instances": list })
}

fn columns(rows: &[Vec<String>], range: std::ops::Range<usize>) -> Vec<(&'static str, Vec<Value>)> {
    FIELDS
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.starts_with("label"))
        .map(|(i, f)| (*f, rows[range.clone()].iter().map(|r| json!(r[i])).collect()))
        .collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6, "{what} row {r}: served {g}, predict {w}");
    }
}

fn check_like_predict(model: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (_, root) = trained(dir.path(), model);
    let data = dir.path().join("data.csv");
    let want = predicted(&root, &data, &dir.path().join("scores.csv"));
    let names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    let rows = rows_of(&data);
    let server = Server::start(&root, extra);

    // Row form: one object per prediction, every output in it.
    let (code, v) = server.post("/v1/models/model:predict", &instances(&rows, 0..60).to_string());
    assert_eq!(code, 200, "{model}: {v}");
    let preds = v["predictions"].as_array().unwrap();
    for (name, col) in &want {
        let got: Vec<f64> = preds.iter().map(|p| p[name].as_f64().unwrap()).collect();
        assert_close(&format!("{model} rows {name}"), &got, &col[0..60]);
    }
    // Column form, on a versioned path.
    let version = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.parse::<u64>().is_ok())
        .unwrap();
    let inputs: serde_json::Map<String, Value> = columns(&rows, 60..150)
        .into_iter()
        .map(|(f, v)| (f.to_string(), Value::Array(v)))
        .collect();
    let (code, v) = server.post(
        &format!("/v1/models/model/versions/{version}:predict"),
        &json!({ "inputs": inputs }).to_string(),
    );
    assert_eq!(code, 200, "{model}: {v}");
    for (name, col) in &want {
        let got: Vec<f64> = v["outputs"][name]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_close(&format!("{model} columns {name}"), &got, &col[60..150]);
    }
    // KServe v2, strings as BYTES.
    let tensors: Vec<Value> = columns(&rows, 150..300)
        .into_iter()
        .map(|(f, v)| json!({ "name": f, "shape": [v.len()], "datatype": "BYTES", "data": v }))
        .collect();
    let (code, v) = server.post(
        "/v2/models/model/infer",
        &json!({ "id": "r1", "inputs": tensors }).to_string(),
    );
    assert_eq!(code, 200, "{model}: {v}");
    assert_eq!(v["id"], "r1");
    assert_eq!(v["model_version"], version.as_str());
    let outputs = v["outputs"].as_array().unwrap();
    let got_names: Vec<&str> = outputs.iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(got_names, names, "{model}: v2 outputs are predict's columns");
    for (o, (name, col)) in outputs.iter().zip(&want) {
        let got: Vec<f64> = o["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_close(&format!("{model} v2 {name}"), &got, &col[150..300]);
    }
    // Status, metadata, readiness and metrics.
    let (code, status) = server.get("/v1/models/model");
    assert_eq!(code, 200);
    assert!(status.contains("AVAILABLE") && status.contains(&version), "{status}");
    let (code, meta) = server.get("/v1/models/model/metadata");
    assert_eq!(code, 200);
    let meta: Value = serde_json::from_str(&meta).unwrap();
    let sig = &meta["metadata"]["signature_def"]["signature_def"]["serving_default"];
    assert_eq!(sig["inputs"]["c1"]["dtype"], "DT_STRING", "{meta}");
    assert_eq!(sig["inputs"]["d1"]["dtype"], "DT_DOUBLE", "{meta}");
    for n in &names {
        assert_eq!(sig["outputs"][n]["dtype"], "DT_FLOAT", "{meta}");
    }
    assert_eq!(server.get("/v2/health/ready").0, 200);
    assert_eq!(server.get("/v2/models/model/ready").0, 200);
    let (code, meta) = server.get("/v2/models/model");
    assert_eq!(code, 200);
    assert!(meta.contains("\"BYTES\"") && meta.contains(&version), "{meta}");
    let (code, text) = server.get("/metrics");
    assert_eq!(code, 200);
    assert!(
        text.contains("rustrec_serve_requests_total{endpoint=\"predict\",code=\"200\"} 2"),
        "{text}"
    );
    assert!(text.contains("rustrec_serve_rows_scored_total 300"), "{text}");
    assert!(
        text.contains(&format!("rustrec_serve_model_version {version}")),
        "{text}"
    );
    // Classic text unless OpenMetrics is asked for, as Prometheus does.
    assert!(
        text.contains("# TYPE rustrec_serve_requests_total counter") && !text.contains("# EOF"),
        "{text}"
    );
    let mut r = Server::agent()
        .get(&format!("{}/metrics", server.base))
        .header(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .call()
        .unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let open = r.body_mut().read_to_string().unwrap();
    assert!(
        open.contains("# TYPE rustrec_serve_requests counter") && open.ends_with("# EOF\n"),
        "{open}"
    );
}

#[test]
fn a_single_task_export_answers_like_predict_in_every_form() {
    check_like_predict("DLRM", &[]);
}

#[test]
fn a_multi_task_export_answers_like_predict_with_batching() {
    check_like_predict(
        "MMoE",
        &[
            "--enable_batching",
            "--max_batch_size",
            "64",
            "--batch_timeout_micros",
            "2000",
        ],
    );
}

/// A multi-class export answers predict's columns: per class its logit
/// and probability, and the most probable class.
#[test]
fn a_multi_class_export_answers_like_predict() {
    check_like_predict("DeepFM+2 classes", &[]);
}

/// A ZILN export answers its three logits, `probs` and the expected `y`.
#[test]
fn a_ziln_export_answers_like_predict() {
    check_like_predict("RankModel+ZILN", &[]);
}

/// v2 infer of rows 0..20, returning the version that answered and probs.
fn infer(agent: &ureq::Agent, base: &str, body: &str) -> Result<(String, Vec<f64>), String> {
    let mut r = agent
        .post(&format!("{base}/v2/models/model/infer"))
        .content_type("application/json")
        .send(body)
        .map_err(|e| e.to_string())?;
    let code = r.status().as_u16();
    let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    if code != 200 {
        return Err(format!("{code} {text}"));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let probs = v["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["name"] == "probs"))
        .and_then(|o| o["data"].as_array())
        .map(|d| d.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    Ok((v["model_version"].as_str().unwrap_or("").to_string(), probs))
}

#[test]
fn a_new_version_is_swapped_in_while_requests_run_and_a_broken_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path(), "DLRM", "");
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&cfg);
    run_ok(t);
    let root = dir.path().join("export");
    let early = dir.path().join("model/model.ckpt-10");
    export(&cfg, &root, Some(early.to_str().unwrap()));
    let server = Server::start(&root, &["--file_system_poll_wait_seconds", "0.1", "--enable_batching"]);
    let rows = rows_of(&dir.path().join("data.csv"));
    let tensors: Vec<Value> = columns(&rows, 0..20)
        .into_iter()
        .map(|(f, v)| json!({ "name": f, "shape": [20], "datatype": "BYTES", "data": v }))
        .collect();
    let body = json!({ "inputs": tensors }).to_string();
    let agent = Server::agent();
    let (v1, p1) = infer(&agent, &server.base, &body).unwrap();

    // Clients keep asking while the next version is exported.
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (stop, base, body) = (stop.clone(), server.base.clone(), body.clone());
            std::thread::spawn(move || {
                let agent = Server::agent();
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.push(infer(&agent, &base, &body));
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    export(&cfg, &root, None);
    let v2 = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().unwrap().parse::<u64>().ok())
        .max()
        .unwrap()
        .to_string();
    assert_ne!(v1, v2);
    let deadline = Instant::now() + Duration::from_secs(30);
    let p2 = loop {
        let (v, p) = infer(&agent, &server.base, &body).unwrap();
        if v == v2 {
            break p;
        }
        assert!(Instant::now() < deadline, "version {v2} was not swapped in");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for c in clients {
        for r in c.join().unwrap() {
            let (v, p) = r.unwrap_or_else(|e| panic!("a request failed during the swap: {e}"));
            assert!(v == v1 || v == v2, "answered by version {v}");
            assert_eq!(&p, if v == v1 { &p1 } else { &p2 }, "version {v}'s scores");
            answered += 1;
        }
    }
    assert!(answered > 3, "the clients sent {answered} requests");
    assert_ne!(p1, p2, "the two checkpoints score differently");

    // A newer version whose graph is damaged is refused; v2 keeps serving.
    let broken = root.join((v2.parse::<u64>().unwrap() + 100).to_string());
    copy_dir(&root.join(&v2), &broken);
    std::fs::write(broken.join("model.onnx"), b"not an onnx graph").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&server.log).unwrap().contains("failed to load") {
        assert!(Instant::now() < deadline, "the broken version was not reported");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (v, p) = infer(&agent, &server.base, &body).unwrap();
    assert_eq!((v.as_str(), &p), (v2.as_str(), &p2));
    let (_, text) = server.get("/metrics");
    assert!(text.contains("rustrec_serve_model_load_failures_total 1"), "{text}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn malformed_requests_get_4xx_and_the_server_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (_, root) = trained(dir.path(), "DLRM");
    let server = Server::start(&root, &["--max_request_bytes", "100000", "--enable_batching"]);
    let rows = rows_of(&dir.path().join("data.csv"));
    let good = instances(&rows, 0..2);
    let row = good["instances"][0].clone();
    let with = |k: &str, v: Value| {
        let mut r = row.clone();
        r[k] = v;
        json!({ "instances": [r] }).to_string()
    };
    let mut missing = row.clone();
    missing.as_object_mut().unwrap().remove("c2");
    let cases: Vec<(&str, String, &str)> = vec![
        ("predict", String::new(), "not valid JSON"),
        ("predict", "{".into(), "not valid JSON"),
        ("predict", "null".into(), "JSON object"),
        ("predict", "[]".into(), "JSON object"),
        ("predict", "42".into(), "JSON object"),
        ("predict", "\"rows\"".into(), "JSON object"),
        ("predict", "{}".into(), "neither"),
        ("predict", json!({"instances": 1}).to_string(), "list of rows"),
        ("predict", json!({"instances": []}).to_string(), "empty"),
        ("predict", json!({"instances": [1]}).to_string(), "row 0"),
        ("predict", json!({"instances": [[1, 2]]}).to_string(), "row 0"),
        ("predict", json!({"instances": [null]}).to_string(), "row 0"),
        ("predict", with("d1", json!("abc")), "`d1`: `abc` is not a valid number"),
        ("predict", with("d1", json!([1.0])), "`d1`: a list"),
        ("predict", with("c1", json!({"a": 1})), "`c1`: an object"),
        ("predict", with("c1", json!(0.5)), "`c1`: the number 0.5"),
        ("predict", with("c2", json!(true)), "`c2`: a boolean"),
        ("predict", json!({"instances": [row.clone()], "inputs": {}}).to_string(), "both"),
        (
            "predict",
            json!({"signature_name": "classify", "instances": [row.clone()]}).to_string(),
            "`signature_name` \"classify\" is not a signature of this model",
        ),
        ("predict", json!({"inputs": 3}).to_string(), "not an object"),
        ("predict", json!({"inputs": {}}).to_string(), "no rows"),
        ("predict", json!({"inputs": {"d1": [1.0], "d2": [1.0, 2.0]}}).to_string(), "every input needs one per row"),
        ("predict", json!({"inputs": {"d1": 1.0}}).to_string(), "not a list"),
        ("predict", "x".repeat(200_000), "length limit"),
        ("infer", "{}".into(), "list of tensors"),
        ("infer", json!({"inputs": [{}]}).to_string(), "`name`"),
        ("infer", json!({"inputs": [{"name": "d1"}]}).to_string(), "`datatype`"),
        ("infer", json!({"inputs": [{"name": "d1", "datatype": "STRING"}]}).to_string(), "KServe v2"),
        ("infer", json!({"inputs": [{"name": "d1", "datatype": "FP32"}]}).to_string(), "`shape`"),
        ("infer", json!({"inputs": [{"name": "d1", "datatype": "FP32", "shape": [2, 3], "data": [1,2,3,4,5,6]}]}).to_string(), "one value per row"),
        ("infer", json!({"inputs": [{"name": "d1", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}).to_string(), "shape says 3"),
        ("infer", json!({"inputs": [{"name": "d1", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": [{"name": "nope"}]}).to_string(), "`nope` is not an output"),
        ("infer", json!({"inputs": [], "outputs": 5}).to_string(), "`outputs` must be a list"),
    ];
    assert!(cases.len() >= 30);
    for (endpoint, body, expect) in &cases {
        let path = if *endpoint == "predict" {
            "/v1/models/model:predict"
        } else {
            "/v2/models/model/infer"
        };
        let (code, v) = server.post(path, body);
        assert!((400..500).contains(&code), "{body:.80}: answered {code} {v}");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{body:.80}: no error message in {v}"));
        assert!(
            msg.contains(expect),
            "{body:.80}: error {msg:?} does not say {expect:?}"
        );
    }
    for (method, path, code) in [
        ("POST", "/v1/models/other:predict", 404),
        ("POST", "/v1/models/model/versions/1:predict", 404),
        ("POST", "/v1/models/model:classify", 400),
        ("POST", "/v1/models/model", 404),
        ("GET", "/v1/models/model/versions/7", 404),
        ("GET", "/v3/anything", 404),
        ("POST", "/v2/models/model/explain", 404),
    ] {
        let got = if method == "GET" {
            server.get(path).0
        } else {
            server.post(path, &good.to_string()).0
        };
        assert_eq!(got, code, "{method} {path}");
    }
    // An absent input is its default_val, as null is (EasyRec fills both),
    // in rows and in columns.
    let nulled = with("c2", Value::Null);
    let (code, a) = server.post("/v1/models/model:predict", &json!({"instances": [missing]}).to_string());
    let (_, b) = server.post("/v1/models/model:predict", &nulled);
    assert_eq!((code, &a), (200, &b), "an absent input scores as null");
    let (code, v) = server.post("/v1/models/model:predict", &json!({"instances": [{}]}).to_string());
    assert_eq!(code, 200, "{v}");
    // TF Serving's binary strings: `{"b64": ...}` is the text it encodes.
    let text = row["c1"].as_str().expect("c1 is a string input").to_string();
    let encoded = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
    };
    let (code, a) = server.post("/v1/models/model:predict", &with("c1", json!({ "b64": encoded })));
    let (_, b) = server.post(
        "/v1/models/model:predict",
        &json!({"instances": [row.clone()]}).to_string(),
    );
    assert_eq!((code, &a), (200, &b), "a b64 string scores as its text");
    let (code, v) = server.post("/v1/models/model:predict", &with("c1", json!({"b64": "%%"})));
    assert!(
        code == 400 && v["error"].as_str().unwrap().contains("`c1`: `b64`"),
        "{v}"
    );
    let named = json!({"signature_name": "serving_default", "instances": [row.clone()]});
    assert_eq!(server.post("/v1/models/model:predict", &named.to_string()).0, 200);
    let (code, v) = server.post(
        "/v1/models/model:predict",
        &json!({"inputs": {"d1": [1.0, 2.0]}}).to_string(),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["outputs"]["probs"].as_array().map(Vec::len), Some(2), "{v}");
    // Still answering.
    let (code, v) = server.post("/v1/models/model:predict", &good.to_string());
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["predictions"].as_array().unwrap().len(), 2);
}

/// `export_config.multi_value_fields`: a served request may give a listed
/// input as a list of values per row, in every form, and it scores as the
/// same values joined by the feature's separator; a scalar input listed
/// there is refused when the config loads.
#[test]
fn multi_value_inputs_take_a_list_per_row() {
    use rustrec::export::runtime::ExportedModel;
    use rustrec::serve::request::{kserve_v2, tf_serving};
    let dir = tempfile::tempdir().unwrap();
    let extra = "export_config { multi_value_fields { input_name: [\"c3\"] } placeholder_named_by_input: true }";
    let cfg = setup(dir.path(), "DeepFM", extra);
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&cfg);
    run_ok(t);
    let root = dir.path().join("export");
    export(&cfg, &root, None);
    let model = ExportedModel::load(&root).unwrap();
    assert_eq!(model.multi_value.get("c3").map(String::as_str), Some("|"));
    let score = |raw: rustrec::data::RawBatch| model.score(&model.enc.encode(&raw).unwrap()).unwrap()[0].scores.clone();
    let row = |c3: Value| json!({"d1": 0.5, "d2": 0.25, "c1": "u3", "c2": "4", "c3": c3, "c4": "w1:0.5"});
    let joined = score(
        tf_serving(&json!({"instances": [row(json!("t1|t5")), row(json!("t2"))]}), &model)
            .unwrap()
            .0,
    );
    let listed = tf_serving(
        &json!({"instances": [row(json!(["t1", "t5"])), row(json!(["t2"]))]}),
        &model,
    )
    .unwrap();
    assert_eq!(score(listed.0), joined);
    let cols = json!({"inputs": {"d1": [0.5, 0.5], "d2": [0.25, 0.25], "c1": ["u3", "u3"], "c2": ["4", "4"],
                                 "c3": [["t1", "t5"], ["t2"]], "c4": ["w1:0.5", "w1:0.5"]}});
    assert_eq!(score(tf_serving(&cols, &model).unwrap().0), joined);
    // KServe v2: [rows, values] for the multi-value input.
    let tensor = |name: &str, dt: &str, shape: Value, data: Value| json!({"name": name, "datatype": dt, "shape": shape, "data": data});
    let v2 = json!({"inputs": [
        tensor("d1", "FP32", json!([2]), json!([0.5, 0.5])),
        tensor("d2", "FP32", json!([2]), json!([0.25, 0.25])),
        tensor("c1", "BYTES", json!([2]), json!(["u3", "u3"])),
        tensor("c2", "BYTES", json!([2]), json!(["4", "4"])),
        tensor("c3", "BYTES", json!([2, 2]), json!([["t1", "t5"], ["t2", "t2"]])),
        tensor("c4", "BYTES", json!([2]), json!(["w1:0.5", "w1:0.5"])),
    ]});
    let both = score(
        tf_serving(
            &json!({"instances": [row(json!("t1|t5")), row(json!("t2|t2"))]}),
            &model,
        )
        .unwrap()
        .0,
    );
    assert_eq!(score(kserve_v2(&v2, &model).unwrap()), both);
    // A [rows, values] shape whose product overflows is refused, not a panic.
    let huge = json!({"inputs": [tensor("c3", "BYTES", json!([1u64 << 40, 1u64 << 40]), json!(["t1"]))]});
    let err = kserve_v2(&huge, &model).unwrap_err();
    assert!(err.0.contains("more values than any request"), "{}", err.0);
    // A list for an input that takes one value is still refused.
    let err = tf_serving(
        &json!({"instances": [{"d1": 0.5, "d2": 0.25, "c1": ["u3"], "c2": "4", "c3": "t1", "c4": "w1:0.5"}]}),
        &model,
    )
    .unwrap_err();
    assert!(err.0.contains("input `c1`"), "{}", err.0);
    // A scalar input cannot be listed.
    std::fs::create_dir_all(dir.path().join("bad")).unwrap();
    let bad = setup(
        &dir.path().join("bad"),
        "DeepFM",
        "export_config { multi_value_fields { input_name: [\"c1\"] } }",
    );
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&bad);
    let out = t.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("multi_value_fields"));
}

/// An export whose training job writes incremental updates: `serve` applies
/// them as they arrive while clients keep asking, reports the step it
/// serves, and after the updates of each step with a checkpoint (20, 30)
/// answers as `predict` does with that checkpoint (1e-6); a damaged update
/// is refused and the last good state keeps serving.
#[test]
fn serve_follows_the_training_jobs_incremental_updates() {
    follow_updates(false);
}

/// As above, the updates sent to a Kafka topic (`incr_save_config.kafka`).
#[test]
fn serve_follows_incremental_updates_sent_to_kafka() {
    follow_updates(true);
}

/// The updates are written to a folder by the job; the export of step 10
/// says they go to the folder or (`kafka`) to a new topic, and the test
/// delivers them there one by one as a running job would.
fn follow_updates(kafka: bool) {
    let dir = tempfile::tempdir().unwrap();
    let incr = "train_config { incr_save_config { sparse_save_steps: 5 dense_save_steps: 5 fs {} } }";
    let cfg = setup(dir.path(), "DLRM", "");
    // The updates' section merges into train_config as an extend arg would.
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "  num_steps: 30\n",
        "  num_steps: 30\n  incr_save_config { sparse_save_steps: 5 dense_save_steps: 5 fs {} }\n",
    );
    assert!(text.contains("incr_save_config"), "{incr}");
    std::fs::write(&cfg, text).unwrap();
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&cfg);
    run_ok(t);
    let model_dir = dir.path().join("model");
    let updates = model_dir.join("incr_save");
    // Hold the updates back, serve the export of step 10, then let them
    // arrive one by one as a running job would write them.
    let held = dir.path().join("held");
    std::fs::rename(&updates, &held).unwrap();
    std::fs::create_dir(&updates).unwrap();
    let root = dir.path().join("export");
    let topic = kafka.then(|| {
        let server = std::env::var("RUSTREC_KAFKA").expect("RUSTREC_KAFKA: run under make test, which starts a broker");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("test_serve_updates_{}_{nanos}", std::process::id());
        let input = rustrec::config::kafka_plan::KafkaInput::of_topic("test", vec![server.clone()], &name);
        let t = rustrec::data::kafka::Topic::connect(&input).unwrap();
        t.create(1).unwrap();
        (t, server, name)
    });
    let export_cfg = match &topic {
        Some((_, server, name)) => {
            let text = std::fs::read_to_string(&cfg).unwrap().replace(
                "fs {}",
                &format!(r#"kafka {{ server: "{server}" topic: "{name}" consumer {{ }} }}"#),
            );
            let path = dir.path().join("kafka.config");
            std::fs::write(&path, text).unwrap();
            path
        }
        None => cfg.clone(),
    };
    export(
        &export_cfg,
        &root,
        Some(model_dir.join("model.ckpt-10").to_str().unwrap()),
    );
    let deliver = |name: &str, bytes: &[u8]| match &topic {
        Some((t, _, _)) => rustrec::train::incr::send_update(t, name, bytes).unwrap(),
        None => {
            std::fs::write(updates.join(name), bytes).unwrap();
            std::fs::write(updates.join(format!("{name}.done")), name).unwrap();
        }
    };
    let server = Server::start(&root, &["--file_system_poll_wait_seconds", "0.05"]);
    let rows = rows_of(&dir.path().join("data.csv"));
    let tensors: Vec<Value> = columns(&rows, 0..20)
        .into_iter()
        .map(|(f, v)| json!({ "name": f, "shape": [20], "datatype": "BYTES", "data": v }))
        .collect();
    let body = json!({ "inputs": tensors }).to_string();
    let step = |s: &Server| -> u64 {
        let (_, text) = s.get("/v1/models/model/metadata");
        serde_json::from_str::<Value>(&text).unwrap()["global_step"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(step(&server), 10);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, base, body) = (stop.clone(), server.base.clone(), body.clone());
            std::thread::spawn(move || {
                let agent = Server::agent();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    infer(&agent, &base, &body).unwrap_or_else(|e| panic!("a request failed during the updates: {e}"));
                    n += 1;
                }
                n
            })
        })
        .collect();
    // A damaged update first: refused, logged, counted.
    deliver("sparse_update_11", b"\x01\x00\x00\x00garbage");
    // predict's scores with the checkpoint of `step`.
    let predict_at = |step: u64| -> Vec<f64> {
        let out = dir.path().join(format!("ckpt{step}.csv"));
        let mut p = bin("predict");
        p.arg("--pipeline_config_path")
            .arg(&cfg)
            .arg("--checkpoint_path")
            .arg(model_dir.join(format!("model.ckpt-{step}")))
            .arg("--input_path")
            .arg(dir.path().join("data.csv"))
            .arg("--output_path")
            .arg(&out);
        run_ok(p);
        std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .skip(1)
            .take(20)
            .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
            .collect()
    };
    for s in [15u64, 20, 25, 30] {
        for kind in ["dense", "sparse"] {
            let name = format!("{kind}_update_{s}");
            deliver(&name, &std::fs::read(held.join(&name)).unwrap());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while step(&server) != s {
            assert!(
                Instant::now() < deadline,
                "serve did not reach step {s}: {}",
                std::fs::read_to_string(&server.log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Once a step's updates (dense and sparse: serve may take them in
        // two polls) are applied, serve answers as predict does with the
        // checkpoint of that step.
        if model_dir.join(format!("model.ckpt-{s}")).exists() {
            let want = predict_at(s);
            let close = |got: &[f64]| got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-6);
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut got = infer(&Server::agent(), &server.base, &body).unwrap().1;
            while !close(&got) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                got = infer(&Server::agent(), &server.base, &body).unwrap().1;
            }
            assert_close(&format!("after the updates of step {s}"), &got, &want);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(answered > 2, "the clients sent {answered} requests");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("incremental update not applied"), "{log}");
    let (_, metrics) = server.get("/metrics");
    assert!(metrics.contains("rustrec_serve_model_global_step 30"), "{metrics}");

    assert!(model_dir.join("model.ckpt-20").exists() && model_dir.join("model.ckpt-30").exists());
}

/// DLRM trained under `dir` and exported from its step-10 checkpoint;
/// returns the config and the export root.
fn trained_with_step_10_export(dir: &Path) -> (PathBuf, PathBuf) {
    let cfg = setup(dir, "DLRM", "");
    let mut t = bin("train_eval");
    t.arg("--pipeline_config_path").arg(&cfg);
    run_ok(t);
    let root = dir.join("export");
    export(&cfg, &root, Some(dir.join("model/model.ckpt-10").to_str().unwrap()));
    (cfg, root)
}

/// TF Serving's version policy: a version copied in file by file (as `cp
/// -r` or rsync write it) is served once complete, a broken one is
/// reported in the status with its error and served once fixed in place,
/// and requests keep being answered throughout.
#[test]
fn a_version_copied_in_file_by_file_or_fixed_in_place_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, root) = trained_with_step_10_export(dir.path());
    let staging = dir.path().join("staging");
    export(&cfg, &staging, None);
    let fresh = std::fs::read_dir(&staging).unwrap().next().unwrap().unwrap().path();
    let first: u64 = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().unwrap().parse().ok())
        .max()
        .unwrap();
    let server = Server::start(&root, &["--file_system_poll_wait_seconds", "0.05"]);
    let rows = rows_of(&dir.path().join("data.csv"));
    let tensors: Vec<Value> = columns(&rows, 0..10)
        .into_iter()
        .map(|(f, v)| json!({ "name": f, "shape": [10], "datatype": "BYTES", "data": v }))
        .collect();
    let body = json!({ "inputs": tensors }).to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let (stop, base, body) = (stop.clone(), server.base.clone(), body.clone());
        std::thread::spawn(move || {
            let agent = Server::agent();
            while !stop.load(Ordering::Relaxed) {
                infer(&agent, &base, &body).unwrap_or_else(|e| panic!("a request failed: {e}"));
            }
        })
    };
    let served = |want: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (v, _) = infer(&Server::agent(), &server.base, &body).unwrap();
            if v == want.to_string() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "version {want} was not served (serving {v}): {}",
                std::fs::read_to_string(&server.log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Copied in file by file, the folder first, pausing between files.
    let second = root.join((first + 10).to_string());
    std::fs::create_dir_all(second.join("assets")).unwrap();
    let mut files: Vec<PathBuf> = Vec::new();
    for d in [fresh.clone(), fresh.join("assets")] {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p.strip_prefix(&fresh).unwrap().to_path_buf());
            }
        }
    }
    for f in &files {
        std::fs::copy(fresh.join(f), second.join(f)).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    served(first + 10);
    // A broken version is reported and fixed in place.
    let third = root.join((first + 20).to_string());
    copy_dir(&fresh, &third);
    let good = std::fs::read(third.join("model.onnx")).unwrap();
    std::fs::write(third.join("model.onnx"), b"not an onnx graph").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = server.get("/v1/models/model");
        let status: Value = serde_json::from_str(&status).unwrap();
        let versions = status["model_version_status"].as_array().unwrap().clone();
        let broken = versions
            .iter()
            .find(|v| v["version"].as_str() == Some((first + 20).to_string().as_str()));
        if let Some(b) = broken.filter(|b| b["state"] == "END") {
            assert_eq!(b["status"]["error_code"], "UNKNOWN", "{status}");
            assert!(!b["status"]["error_message"].as_str().unwrap().is_empty());
            let ok = versions
                .iter()
                .find(|v| v["version"].as_str() == Some((first + 10).to_string().as_str()))
                .unwrap();
            assert_eq!(ok["state"], "AVAILABLE", "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the broken version was not reported: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(third.join("model.onnx"), good).unwrap();
    served(first + 20);
    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();
}

/// Triton's binary tensor data (tritonclient's default): inputs sent as raw
/// bytes after a JSON header, outputs asked for as binary come back that
/// way, with the scores of the JSON form; and the model configuration,
/// repository index and statistics endpoints perf_analyzer reads.
#[test]
fn binary_tensor_data_and_tritons_model_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (_, root) = trained(dir.path(), "DLRM");
    let server = Server::start(&root, &["--file_system_poll_wait_seconds", "0"]);
    let rows = rows_of(&dir.path().join("data.csv"));
    let n = 12;
    // The JSON form's answer.
    let tensors: Vec<Value> = columns(&rows, 0..n)
        .into_iter()
        .map(|(f, v)| json!({ "name": f, "shape": [n], "datatype": "BYTES", "data": v }))
        .collect();
    let (code, plain) = server.post("/v2/models/model/infer", &json!({ "inputs": tensors }).to_string());
    assert_eq!(code, 200, "{plain}");
    let want: Vec<f64> = plain["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "probs")
        .unwrap()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    // The same rows as binary data: numbers as FP64, text as BYTES.
    let mut header_inputs = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for (f, values) in columns(&rows, 0..n) {
        let before = data.len();
        let datatype = if f.starts_with('d') {
            for v in &values {
                data.extend(v.as_str().unwrap().parse::<f64>().unwrap().to_le_bytes());
            }
            "FP64"
        } else {
            for v in &values {
                let s = v.as_str().unwrap().as_bytes();
                data.extend((s.len() as u32).to_le_bytes());
                data.extend(s);
            }
            "BYTES"
        };
        header_inputs.push(json!({
            "name": f, "shape": [n], "datatype": datatype,
            "parameters": { "binary_data_size": data.len() - before }
        }));
    }
    let header = json!({
        "inputs": header_inputs,
        "outputs": [{ "name": "probs", "parameters": { "binary_data": true } }]
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(&data);
    let mut r = Server::agent()
        .post(&format!("{}/v2/models/model/infer", server.base))
        .header("Inference-Header-Content-Length", &header.len().to_string())
        .content_type("application/octet-stream")
        .send(&body[..])
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let json_len: usize = r
        .headers()
        .get("inference-header-content-length")
        .expect("a binary answer says its JSON header's length")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let answer = r.body_mut().read_to_vec().unwrap();
    let head: Value = serde_json::from_slice(&answer[..json_len]).unwrap();
    let probs = &head["outputs"][0];
    assert_eq!(probs["name"], "probs");
    assert_eq!(probs["parameters"]["binary_data_size"], json!(4 * n));
    let got: Vec<f64> = answer[json_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect();
    assert_close("binary tensors", &got, &want);
    // A binary size past the body is a 400.
    let lying = json!({ "inputs": [{ "name": "d1", "shape": [1], "datatype": "FP64",
                                      "parameters": { "binary_data_size": 800 } }] })
    .to_string();
    let r = Server::agent()
        .post(&format!("{}/v2/models/model/infer", server.base))
        .header("Inference-Header-Content-Length", &lying.len().to_string())
        .send(lying.as_bytes())
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    // Triton's endpoints.
    let (_, meta) = server.get("/v2");
    assert!(
        meta.contains("binary_tensor_data") && meta.contains("statistics"),
        "{meta}"
    );
    let (code, config) = server.get("/v2/models/model/config");
    assert_eq!(code, 200);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["name"], "model");
    assert!(config["input"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "c1" && i["data_type"] == "TYPE_STRING"));
    assert!(config["output"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["name"] == "probs"));
    let (code, stats) = server.get("/v2/models/model/stats");
    assert_eq!(code, 200);
    let stats: Value = serde_json::from_str(&stats).unwrap();
    let s = &stats["model_stats"][0];
    assert_eq!(s["inference_stats"]["success"]["count"], json!(2));
    assert_eq!(s["inference_stats"]["fail"]["count"], json!(1));
    assert_eq!(s["inference_count"], json!(2 * n));
    let (code, index) = server.post("/v2/repository/index", "{}");
    assert_eq!(code, 200);
    assert_eq!(index[0]["name"], "model");
    assert_eq!(index[0]["state"], "READY");
}

/// The ecosystem's own clients, unchanged, against `serve`: tritonclient
/// over HTTP (binary tensors) and gRPC (raw_input_contents), and grpcio
/// with TF Serving's protos (tensorflow-serving-api), each in the virtual
/// environment `make test` prepares (`RUSTREC_TRITON_PYTHON`,
/// `RUSTREC_TFSERVING_PYTHON`). Their scores equal `predict`'s, for a
/// single-task and a multi-task export.
fn official_clients_score_like_predict(model: &str) {
    let need = |var: &str| {
        std::env::var(var).unwrap_or_else(|e| panic!("{var}: run under make test, which prepares the clients: {e}"))
    };
    let (triton, tfserving) = (need("RUSTREC_TRITON_PYTHON"), need("RUSTREC_TFSERVING_PYTHON"));
    let dir = tempfile::tempdir().unwrap();
    let (_, root) = trained(dir.path(), model);
    let data = dir.path().join("data.csv");
    let want = predicted(&root, &data, &dir.path().join("scores.csv"));
    let server = Server::start(&root, &["--grpc_port", "0"]);
    let grpc = server.grpc.clone().unwrap();
    let http = server.base.trim_start_matches("http://").to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/official_clients.py");
    let fields = FIELDS.join(",");
    let run = |python: &str, args: &[&str]| -> Value {
        let out = std::process::Command::new(python)
            .arg(&script)
            .args(args)
            .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        assert!(
            out.status.success(),
            "{model}: {} {args:?} failed: {}\nserve's log: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&server.log).unwrap()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let data = data.to_str().unwrap();
    let mut answers = run(&triton, &["triton", &http, &grpc, data, &fields]);
    let tf = run(&tfserving, &["tfserving", &grpc, data, &fields]);
    answers["tfserving_grpc"] = tf["tfserving_grpc"].clone();
    for client in ["triton_grpc", "triton_http", "tfserving_grpc"] {
        for (name, col) in &want {
            let got: Vec<f64> = answers[client][name]
                .as_array()
                .unwrap_or_else(|| panic!("{model}: {client} has no output {name}: {answers}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(got.len(), col.len(), "{model} {client} {name}");
            assert_close(&format!("{model} {client} {name}"), &got, col);
        }
    }
}

#[test]
fn official_clients_score_a_single_task_export_like_predict() {
    official_clients_score_like_predict("DLRM");
}

#[test]
fn official_clients_score_a_multi_task_export_like_predict() {
    official_clients_score_like_predict("MMoE");
}

/// TF Serving's latest-N policy and version labels: with `--num_versions 2`
/// both exports answer on their versioned paths and by label; a third one
/// appearing is served and the oldest unloaded (404, END in the status).
#[test]
fn the_newest_versions_are_served_side_by_side_and_by_label() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, root) = trained_with_step_10_export(dir.path());
    export(&cfg, &root, None);
    let versions: Vec<u64> = {
        let mut v: Vec<u64> = std::fs::read_dir(&root)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().into_string().unwrap().parse().ok())
            .collect();
        v.sort();
        v
    };
    assert_eq!(versions.len(), 2, "{versions:?}");
    let (old, new) = (versions[0], versions[1]);
    let labels = format!("stable={old},canary={new}");
    let server = Server::start(
        &root,
        &[
            "--num_versions",
            "2",
            "--version_labels",
            &labels,
            "--file_system_poll_wait_seconds",
            "0.05",
        ],
    );
    let rows = rows_of(&dir.path().join("data.csv"));
    let body = instances(&rows, 0..20).to_string();
    let probs = |path: &str| -> Result<Vec<f64>, (u16, Value)> {
        let (code, v) = server.post(&format!("/v1/models/model{path}:predict"), &body);
        if code != 200 {
            return Err((code, v));
        }
        Ok(v["predictions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["probs"].as_f64().unwrap())
            .collect())
    };
    // The older version is loaded beside the newest within a poll or two.
    let deadline = Instant::now() + Duration::from_secs(30);
    let old_scores = loop {
        match probs(&format!("/versions/{old}")) {
            Ok(p) => break p,
            Err(e) => assert!(Instant::now() < deadline, "version {old} was not loaded: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let new_scores = probs(&format!("/versions/{new}")).unwrap();
    assert_ne!(old_scores, new_scores, "steps 10 and 30 score alike");
    assert_eq!(probs("").unwrap(), new_scores, "no version named: the newest");
    assert_eq!(probs("/labels/stable").unwrap(), old_scores);
    assert_eq!(probs("/labels/canary").unwrap(), new_scores);
    let (code, v) = probs("/labels/beta").unwrap_err();
    assert_eq!(code, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("canary, stable"), "{v}");
    let (code, meta) = server.get("/v2/models/model");
    assert_eq!(code, 200);
    assert!(
        meta.contains(&old.to_string()) && meta.contains(&new.to_string()),
        "{meta}"
    );

    // A third version: it and the second are served, the first unloaded.
    let third = new + 100;
    copy_dir(&root.join(new.to_string()), &root.join(third.to_string()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while probs(&format!("/versions/{third}")).is_err() {
        assert!(
            Instant::now() < deadline,
            "version {third} was not served: {}",
            std::fs::read_to_string(&server.log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, v) = probs(&format!("/versions/{old}")).unwrap_err();
    assert_eq!(code, 404, "{v}");
    let (code, v) = probs("/labels/stable").unwrap_err();
    assert_eq!(code, 404, "a label of an unloaded version: {v}");
    assert_eq!(probs(&format!("/versions/{new}")).unwrap(), new_scores);
    let (_, status) = server.get("/v1/models/model");
    let status: Value = serde_json::from_str(&status).unwrap();
    let state = |v: u64| {
        status["model_version_status"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["version"].as_str() == Some(v.to_string().as_str()))
            .map(|s| s["state"].as_str().unwrap().to_string())
    };
    assert_eq!(state(old).as_deref(), Some("END"), "{status}");
    assert_eq!(state(new).as_deref(), Some("AVAILABLE"), "{status}");
    assert_eq!(state(third).as_deref(), Some("AVAILABLE"), "{status}");
}
