#![allow(dead_code)]
pub mod models;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The shared folder beside the repository (sample configs, real data);
/// `RUSTREC_SHARED_DIR` overrides it.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("RUSTREC_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    assert!(
        dir.join("easyrec_configs").is_dir(),
        "shared folder not found at {} (set RUSTREC_SHARED_DIR)",
        dir.display()
    );
    dir
}

pub fn easyrec_configs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(shared_dir().join("easyrec_configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "config"))
        .collect();
    v.sort();
    assert!(v.len() >= 10, "expected the EasyRec sample configs, found {}", v.len());
    v
}

pub fn sample(name: &str) -> PathBuf {
    shared_dir().join("easyrec_configs").join(name)
}

/// `mpirun` as the tests run it: ranks may outnumber the cores, as root
/// too, from the repository root.
pub fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--bind-to", "none"]);
    // Containers often run tests as root, which OpenMPI refuses by default.
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// Runs `cmd` with its output captured, as `Command::output` does, but
/// for at most `limit`: see [`wait_within`].
pub fn output_within(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    wait_within(child, limit, what)
}

/// Waits for `child` (its stdout and stderr piped, or not captured) as
/// `wait_with_output` does, for at most `limit`. Past it the child gets
/// SIGTERM (mpirun passes it to its ranks), then SIGKILL, and the test
/// fails with what it printed: a job waiting for input that never comes
/// (a stream is endless) fails its test instead of hanging the suite.
pub fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    fn drain(r: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        if let Some(mut r) = r {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                let _ = tx.send(v);
            });
        } else {
            let _ = tx.send(Vec::new());
        }
        rx
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let wait_until = |child: &mut Child, deadline: Instant| loop {
        match child.try_wait().unwrap() {
            Some(status) => return Some(status),
            None if Instant::now() >= deadline => return None,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    if let Some(status) = wait_until(&mut child, Instant::now() + limit) {
        return Output {
            status,
            stdout: stdout.recv().unwrap_or_default(),
            stderr: stderr.recv().unwrap_or_default(),
        };
    }
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    if wait_until(&mut child, Instant::now() + Duration::from_secs(10)).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    // A rank that outlived mpirun may hold the pipes open: read what came.
    let grace = Duration::from_secs(5);
    let (out, err) = (
        stdout.recv_timeout(grace).unwrap_or_default(),
        stderr.recv_timeout(grace).unwrap_or_default(),
    );
    panic!(
        "{what} did not finish within {limit:?}; it printed:\n{}{}",
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&err)
    );
}

/// The pid of rank `rank` of the job training into `model_dir`.
pub fn rank_pid(model_dir: &Path, rank: usize) -> Option<u32> {
    let want_dir = model_dir.to_str().unwrap();
    let want_rank = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in std::fs::read_dir("/proc").ok()? {
        // Processes come and go while /proc is listed (other tests run
        // jobs beside this one): an entry that vanished is skipped.
        let Ok(entry) = entry else {
            continue;
        };
        let path = entry.path();
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        let environ = std::fs::read(path.join("environ")).unwrap_or_default();
        let has = |hay: &[u8], needle: &str| hay.split(|b| *b == 0).any(|s| s == needle.as_bytes());
        if has(&cmdline, want_dir) && has(&environ, &want_rank) && !has(&cmdline, "mpirun") {
            return Some(pid);
        }
    }
    None
}

/// The Kafka broker of the tests: `make test` starts one (KRaft, on
/// 127.0.0.1) and names it in RUSTREC_KAFKA.
pub fn kafka_server() -> String {
    std::env::var("RUSTREC_KAFKA").unwrap_or_else(|_| {
        panic!(
            "RUSTREC_KAFKA is not set: run the tests with `make test`, which starts a broker, or start one \
             (scripts/kafka-broker start DIR) and set RUSTREC_KAFKA=127.0.0.1:19092"
        )
    })
}

/// A checkpoint's tensors with every key-value table's rows (its keys,
/// counts, steps, values and slots) in ascending key order: on several
/// ranks each rank writes its own keys, joined end to end.
pub fn by_key(
    mut t: std::collections::BTreeMap<String, rustrec::checkpoint::Loaded>,
) -> std::collections::BTreeMap<String, rustrec::checkpoint::Loaded> {
    let keyed: Vec<(String, String)> = t
        .keys()
        .filter_map(|k| {
            let var = k.strip_suffix("-keys").or_else(|| k.strip_suffix("-keys_filtered"))?;
            Some((k.clone(), var.to_string()))
        })
        .collect();
    for (keys_name, var) in keyed {
        let keys = t[&keys_name].ints.clone();
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        let filtered = keys_name.ends_with("_filtered");
        let belongs = |name: &str| {
            if filtered {
                name == keys_name || name == format!("{var}-freqs_filtered")
            } else {
                (name == var || name.starts_with(&format!("{var}-")) || name.starts_with(&format!("{var}/")))
                    && !name.ends_with("_filtered")
            }
        };
        for (name, l) in t.iter_mut().filter(|(n, _)| belongs(n)) {
            assert_eq!(l.shape.first(), Some(&keys.len()), "{name}");
            let width = l.shape[1..].iter().product::<usize>().max(1);
            if !l.ints.is_empty() {
                l.ints = order.iter().map(|&i| l.ints[i]).collect();
            }
            if !l.data.is_empty() {
                l.data = order
                    .iter()
                    .flat_map(|&i| l.data[i * width..(i + 1) * width].to_vec())
                    .collect();
            }
        }
    }
    t
}
