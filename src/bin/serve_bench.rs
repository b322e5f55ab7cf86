//! `make bench`'s serving part. Starts `serve` on an export and, beside it
//! in the same run, onnxruntime scoring the same graph behind a Python HTTP
//! server (`bench/serve_baseline.py`, given ids already encoded); sends each
//! requests of `--rows_per_request` rows from `--concurrency` clients for
//! `--seconds`, alternating the two, and prints requests/s, p50 and p99
//! latency and the ratios, for `serve` over each protocol: TF Serving's
//! REST (JSON columns), KServe v2 REST (JSON tensors), KServe v2 gRPC
//! (typed raw tensors, as tritonclient sends them) and TF Serving's gRPC
//! Predict (TensorProtos). Then times the graph alone per row at batch 64
//! and 2048, in tract and in onnxruntime (one thread each). Loopback only;
//! it stops by itself.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Map, Value};

use rustrec::data::csv::CsvChunks;
use rustrec::data::RawBatch;
use rustrec::export::runtime::ExportedModel;
use rustrec::serve::grpc::inference;
use rustrec::tf_proto::serving;
use tract_onnx::prelude::{DatumType, Tensor};

#[derive(Debug, Parser)]
#[command(rename_all = "snake_case")]
struct Args {
    /// The export (or a directory of versions: the newest).
    #[arg(long)]
    export: PathBuf,
    /// Rows to send: a CSV file with a header line, in the config's input_fields layout.
    #[arg(long)]
    data: PathBuf,
    /// The `serve` binary.
    #[arg(long)]
    serve: PathBuf,
    /// Python with onnxruntime and numpy.
    #[arg(long)]
    python: PathBuf,
    #[arg(long, default_value = "bench/serve_baseline.py")]
    baseline: PathBuf,
    #[arg(long, default_value_t = 100)]
    rows_per_request: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,64")]
    concurrency: Vec<usize>,
    /// The latency bound of the summary line: the most requests/s each
    /// server sustained with its p99 below it.
    #[arg(long, default_value_t = 20.0)]
    p99_bound_ms: f64,
    /// Seconds of load per server and concurrency.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Flags passed to `serve` (e.g. "--enable_batching --batch_timeout_micros 500").
    #[arg(long, default_value = "")]
    serve_flags: String,
}

/// A child process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a server that prints `listening on ADDR` (and, with `grpc`,
/// `grpc listening on ADDR` after it); returns it and the addresses.
fn start(mut cmd: Command, grpc: bool) -> anyhow::Result<(Proc, String, Option<String>)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let proc = Proc(child);
    let mut addr = |prefix: &str| -> anyhow::Result<String> {
        let mut line = String::new();
        out.read_line(&mut line)?;
        match line.trim().strip_prefix(prefix) {
            Some(addr) => Ok(addr.to_string()),
            None => bail!("{cmd:?} did not start: it printed {line:?}"),
        }
    };
    let http = addr("listening on ")?;
    let grpc = if grpc { Some(addr("grpc listening on ")?) } else { None };
    Ok((proc, http, grpc))
}

/// A load run at a concurrency.
type LoadAt<'a> = dyn Fn(usize) -> anyhow::Result<Load> + 'a;

struct Load {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `clients` threads post the bodies in turn to `url` for `seconds`.
fn load(url: &str, bodies: &[String], clients: usize, seconds: f64) -> anyhow::Result<Load> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, bodies) = (url.to_string(), bodies.to_vec());
            std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_secs(60)))
                    .build()
                    .into();
                let mut took = Vec::new();
                let mut i = c;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let mut r = agent
                        .post(&url)
                        .content_type("application/json")
                        .send(&bodies[i % bodies.len()])
                        .with_context(|| format!("POST {url}"))?;
                    r.body_mut().read_to_vec()?;
                    took.push(t.elapsed().as_secs_f64() * 1e3);
                    i += 1;
                }
                Ok(took)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().expect("a client thread panicked")?);
    }
    Ok(summary(all, start.elapsed().as_secs_f64()))
}

fn summary(mut took_ms: Vec<f64>, elapsed: f64) -> Load {
    took_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| took_ms[((took_ms.len() as f64 * p) as usize).min(took_ms.len() - 1)];
    Load {
        rps: took_ms.len() as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    }
}

/// One gRPC request body of each kind.
#[derive(Clone)]
enum GrpcBody {
    Kserve(inference::ModelInferRequest),
    TfServing(serving::PredictRequest),
}

/// `clients` tasks, each over its own connection, send the requests in
/// turn to the gRPC server at `addr` for `seconds`.
fn load_grpc(addr: &str, bodies: &[GrpcBody], clients: usize, seconds: f64) -> anyhow::Result<Load> {
    use inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use serving::prediction_service_client::PredictionServiceClient;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let url = format!("http://{addr}");
    runtime.block_on(async move {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let channel = tonic::transport::Endpoint::from_shared(url.clone())?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("cannot connect to {url}"))?;
            let bodies = bodies.to_vec();
            tasks.push(tokio::spawn(async move {
                let mut kserve = GrpcInferenceServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20);
                let mut tf = PredictionServiceClient::new(channel).max_decoding_message_size(64 << 20);
                let mut took = Vec::new();
                let mut i = c;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match &bodies[i % bodies.len()] {
                        GrpcBody::Kserve(r) => drop(kserve.model_infer(r.clone()).await?),
                        GrpcBody::TfServing(r) => drop(tf.predict(r.clone()).await?),
                    }
                    took.push(t.elapsed().as_secs_f64() * 1e3);
                    i += 1;
                }
                anyhow::Ok(took)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.context("a client task panicked")??);
        }
        Ok(summary(all, start.elapsed().as_secs_f64()))
    })
}

/// The rows' cells as KServe v2 gRPC and TF Serving gRPC requests, typed
/// by the input's column type: strings, INT64, FP64 (an empty cell NaN,
/// which `serve` reads as missing) or BOOL.
fn grpc_bodies(model: &ExportedModel, cols: &[(String, Vec<&str>)]) -> anyhow::Result<(GrpcBody, GrpcBody)> {
    use rustrec::config::data_plan::ColumnType;
    use rustrec::tf_proto::{tensor_shape_proto, DataType, TensorProto, TensorShapeProto};
    let types: std::collections::HashMap<&str, ColumnType> = model
        .enc
        .projection
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.ty))
        .collect();
    let mut v2 = inference::ModelInferRequest {
        model_name: "model".into(),
        ..Default::default()
    };
    let mut tf = serving::PredictRequest {
        model_spec: Some(serving::ModelSpec {
            name: "model".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (name, cells) in cols {
        let rows = cells.len();
        let float = |c: &&str| c.parse::<f64>().unwrap_or(f64::NAN);
        let int = |c: &&str| c.parse::<i64>().unwrap_or(0);
        let mut t = TensorProto {
            tensor_shape: Some(TensorShapeProto {
                dim: vec![tensor_shape_proto::Dim {
                    size: rows as i64,
                    name: String::new(),
                }],
                unknown_rank: false,
            }),
            ..Default::default()
        };
        let (datatype, raw): (&str, Vec<u8>) = match types.get(name.as_str()).context("not an input")? {
            ColumnType::Str => {
                t.dtype = DataType::DtString as i32;
                t.string_val = cells.iter().map(|c| c.as_bytes().to_vec()).collect();
                let raw = cells
                    .iter()
                    .flat_map(|c| (c.len() as u32).to_le_bytes().into_iter().chain(c.bytes()))
                    .collect();
                ("BYTES", raw)
            }
            ColumnType::Int => {
                t.dtype = DataType::DtInt64 as i32;
                t.int64_val = cells.iter().map(int).collect();
                ("INT64", cells.iter().flat_map(|c| int(c).to_le_bytes()).collect())
            }
            ColumnType::Float => {
                t.dtype = DataType::DtDouble as i32;
                t.double_val = cells.iter().map(float).collect();
                ("FP64", cells.iter().flat_map(|c| float(c).to_le_bytes()).collect())
            }
            ColumnType::Bool => {
                t.dtype = DataType::DtBool as i32;
                t.bool_val = cells
                    .iter()
                    .map(|c| *c == "1" || c.eq_ignore_ascii_case("true"))
                    .collect();
                ("BOOL", t.bool_val.iter().map(|&b| b as u8).collect())
            }
        };
        tf.inputs.insert(name.clone(), t);
        v2.inputs.push(inference::model_infer_request::InferInputTensor {
            name: name.clone(),
            datatype: datatype.into(),
            shape: vec![rows as i64],
            ..Default::default()
        });
        v2.raw_input_contents.push(raw);
    }
    Ok((GrpcBody::Kserve(v2), GrpcBody::TfServing(tf)))
}

/// The graph's inputs for `raw` as the baseline takes them.
fn encoded_inputs(model: &ExportedModel, raw: &RawBatch) -> anyhow::Result<Value> {
    let batch = model.enc.encode(raw)?;
    let mut inputs = Map::new();
    for (name, t) in model.input_names().iter().zip(model.graph_inputs(&batch)?) {
        inputs.insert(name.clone(), tensor_json(&t)?);
    }
    Ok(Value::Object(inputs))
}

fn tensor_json(t: &Tensor) -> anyhow::Result<Value> {
    let data = match t.datum_type() {
        DatumType::I64 => json!(t.to_plain_array_view::<i64>()?.iter().collect::<Vec<_>>()),
        DatumType::F32 => json!(t.to_plain_array_view::<f32>()?.iter().collect::<Vec<_>>()),
        other => bail!("unexpected graph input type {other:?}"),
    };
    Ok(json!({ "shape": t.shape(), "data": data }))
}

/// `n` rows of the data file (repeated as needed) as input columns.
fn raw_rows(model: &ExportedModel, lines: &[&str], n: usize) -> anyhow::Result<RawBatch> {
    let text: String = (0..n).map(|i| format!("{}\n", lines[i % lines.len()])).collect();
    let fields: Vec<String> = model.plan.data.fields.iter().map(|f| f.name.clone()).collect();
    let mut chunks = CsvChunks::from_text("bench rows", text, ",", &fields, &model.enc.projection, n)?;
    Ok(chunks.next().context("no rows")??)
}

/// Microseconds per row of tract scoring `raw` (one thread), over about a second.
fn tract_us_per_row(model: &ExportedModel, raw: &RawBatch) -> anyhow::Result<f64> {
    let batch = model.enc.encode(raw)?;
    model.score(&batch)?;
    let (mut runs, start) = (0u32, Instant::now());
    while runs < 3 || start.elapsed().as_secs_f64() < 1.0 {
        model.score(&batch)?;
        runs += 1;
    }
    Ok(start.elapsed().as_secs_f64() / runs as f64 / raw.num_rows as f64 * 1e6)
}

fn run(a: &Args) -> anyhow::Result<()> {
    let model = ExportedModel::load(&a.export)?;
    let text = std::fs::read_to_string(&a.data).with_context(|| format!("cannot read {}", a.data.display()))?;
    let mut lines = text.lines().filter(|l| !l.is_empty());
    let header: Vec<&str> = lines.next().context("the data file is empty")?.split(',').collect();
    let lines: Vec<&str> = lines.collect();
    let inputs: Vec<String> = model.enc.projection.columns.iter().map(|c| c.name.clone()).collect();
    let col_of = |name: &str| header.iter().position(|h| *h == name);
    let n = a.rows_per_request;
    let mut ours = Vec::new();
    let mut ours_v2 = Vec::new();
    let mut ours_grpc = Vec::new();
    let mut ours_tf_grpc = Vec::new();
    let mut theirs = Vec::new();
    for k in 0..8 {
        // Each body its own window of the rows, the same for both servers.
        let window: Vec<&str> = (0..n).map(|i| lines[(k * 37 + i) % lines.len()]).collect();
        let rows: Vec<Vec<&str>> = window.iter().map(|l| l.split(',').collect()).collect();
        let mut cols = Map::new();
        let mut cells = Vec::new();
        let mut tensors = Vec::new();
        for name in &inputs {
            let c = col_of(name).with_context(|| format!("the data file has no column `{name}`"))?;
            let column: Vec<&str> = rows.iter().map(|r| r[c]).collect();
            cols.insert(name.clone(), json!(column));
            tensors.push(json!({ "name": name, "datatype": "BYTES", "shape": [n], "data": column }));
            cells.push((name.clone(), column));
        }
        ours.push(json!({ "inputs": cols }).to_string());
        ours_v2.push(json!({ "inputs": tensors }).to_string());
        let (v2, tf) = grpc_bodies(&model, &cells)?;
        ours_grpc.push(v2);
        ours_tf_grpc.push(tf);
        let raw = raw_rows(&model, &window, n)?;
        theirs.push(json!({ "inputs": encoded_inputs(&model, &raw)? }).to_string());
    }

    let mut serve = Command::new(&a.serve);
    serve
        .arg("--model_dir")
        .arg(&a.export)
        .args(["--port", "0", "--grpc_port", "0", "--host", "127.0.0.1"])
        .args(a.serve_flags.split_whitespace());
    let (_ours_proc, ours_addr, grpc_addr) = start(serve, true)?;
    let grpc_addr = grpc_addr.expect("asked for");
    let mut py = Command::new(&a.python);
    py.arg(&a.baseline)
        .arg("serve")
        .arg("--model")
        .arg(model.dir.join("model.onnx"));
    let (_py_proc, py_addr, _) = start(py, false)?;
    let ours_url = format!("http://{ours_addr}/v1/models/model:predict");
    let v2_url = format!("http://{ours_addr}/v2/models/model/infer");
    let py_url = format!("http://{py_addr}/predict");
    // One request of each form first: they must be answered.
    load(&ours_url, &ours, 1, 0.3)?;
    load(&v2_url, &ours_v2, 1, 0.3)?;
    load_grpc(&grpc_addr, &ours_grpc, 1, 0.3)?;
    load_grpc(&grpc_addr, &ours_tf_grpc, 1, 0.3)?;
    load(&py_url, &theirs, 1, 0.3)?;
    let protocols: [(&str, &LoadAt); 4] = [
        ("TF REST", &|c| load(&ours_url, &ours, c, a.seconds)),
        ("v2 REST", &|c| load(&v2_url, &ours_v2, c, a.seconds)),
        ("v2 gRPC", &|c| load_grpc(&grpc_addr, &ours_grpc, c, a.seconds)),
        ("TF gRPC", &|c| load_grpc(&grpc_addr, &ours_tf_grpc, c, a.seconds)),
    ];

    println!(
        "== serving {n} rows per request for {}s per level: `serve {}` vs onnxruntime in Python (sent encoded ids)",
        a.seconds, a.serve_flags
    );
    println!(
        "{:>11} {:>8} | {:>9} {:>8} {:>8} | {:>9} {:>8} {:>8} | {:>9}",
        "concurrency", "protocol", "serve r/s", "p50 ms", "p99 ms", "ort r/s", "p50 ms", "p99 ms", "r/s ratio"
    );
    let mut results = Vec::new();
    // (requests/s, concurrency) of each server's best level within the p99
    // bound; serve's over any protocol.
    let mut best_ours: Option<(f64, usize)> = None;
    let mut best_theirs: Option<(f64, usize)> = None;
    let better = |best: &mut Option<(f64, usize)>, l: &Load, c: usize, bound: f64| {
        if l.p99_ms < bound && best.is_none_or(|(r, _)| l.rps > r) {
            *best = Some((l.rps, c));
        }
    };
    for &c in &a.concurrency {
        let t = load(&py_url, &theirs, c, a.seconds)?;
        better(&mut best_theirs, &t, c, a.p99_bound_ms);
        let mut per_protocol = Map::new();
        for (protocol, run) in &protocols {
            let o = run(c)?;
            println!(
                "{c:>11} {protocol:>8} | {:>9.1} {:>8.2} {:>8.2} | {:>9.1} {:>8.2} {:>8.2} | {:>8.2}x",
                o.rps,
                o.p50_ms,
                o.p99_ms,
                t.rps,
                t.p50_ms,
                t.p99_ms,
                o.rps / t.rps
            );
            better(&mut best_ours, &o, c, a.p99_bound_ms);
            per_protocol.insert(
                protocol.to_string(),
                json!({ "rps": o.rps, "p50_ms": o.p50_ms, "p99_ms": o.p99_ms }),
            );
        }
        results.push(json!({
            "concurrency": c,
            "serve": per_protocol,
            "onnxruntime": { "rps": t.rps, "p50_ms": t.p50_ms, "p99_ms": t.p99_ms },
        }));
    }

    let best = |b: Option<(f64, usize)>| {
        b.map_or("none of the levels".to_string(), |(r, c)| {
            format!("{r:.1} r/s (concurrency {c})")
        })
    };
    println!(
        "most requests/s with p99 below {} ms: serve {}, onnxruntime {}{}",
        a.p99_bound_ms,
        best(best_ours),
        best(best_theirs),
        match (best_ours, best_theirs) {
            (Some((o, _)), Some((t, _))) => format!(": {:.2}x", o / t),
            _ => String::new(),
        }
    );

    // The graph alone: time per row at batch 64 and 2048.
    let dir = tempfile_dir()?;
    let mut files = Vec::new();
    let mut tract = Vec::new();
    for rows in [64, 2048] {
        let raw = raw_rows(&model, &lines, rows)?;
        tract.push(tract_us_per_row(&model, &raw)?);
        let path = dir.join(format!("inputs_{rows}.json"));
        std::fs::write(
            &path,
            json!({ "rows": rows, "inputs": encoded_inputs(&model, &raw)? }).to_string(),
        )?;
        files.push(path);
    }
    let out = Command::new(&a.python)
        .arg(&a.baseline)
        .arg("time")
        .arg("--model")
        .arg(model.dir.join("model.onnx"))
        .arg("--inputs")
        .args(&files)
        .output()?;
    if !out.status.success() {
        bail!("timing onnxruntime failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let ort: Value = serde_json::from_slice(&out.stdout)?;
    let ort_us: Vec<f64> = ort["onnxruntime"]
        .as_array()
        .context("no onnxruntime timings")?
        .iter()
        .filter_map(|r| r["us_per_row"].as_f64())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    println!("== the exported graph alone, one thread: microseconds per row");
    println!(
        "{:>11} | {:>9} {:>9} | {:>15}",
        "runtime", "batch 64", "batch 2048", "2048 / 64"
    );
    println!(
        "{:>11} | {:>9.2} {:>9.2} | {:>14.2}x",
        "tract",
        tract[0],
        tract[1],
        tract[1] / tract[0]
    );
    println!(
        "{:>11} | {:>9.2} {:>9.2} | {:>14.2}x",
        "onnxruntime",
        ort_us[0],
        ort_us[1],
        ort_us[1] / ort_us[0]
    );
    println!(
        "{}",
        json!({ "load": results, "graph_us_per_row": { "tract": tract, "onnxruntime": ort_us } })
    );
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn main() -> ExitCode {
    rustrec::cli::main_with(|args| run(&Args::try_parse_from(args)?))
}
