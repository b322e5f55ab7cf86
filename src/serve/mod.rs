//! `serve`: answers scoring requests over HTTP with the newest export under
//! a model directory (the `<unix seconds>/` folders `export` writes), in
//! TF Serving's REST API and KServe's v2 protocol, with Prometheus metrics.
//! Raw feature values are decoded into input columns (`request`) and
//! encoded by the encoder that trained the model; the exported ONNX graph
//! scores them on scoring threads (`batcher`). A watcher loads new versions
//! in the background and swaps them in; a version that fails to load is
//! logged and the old one keeps serving.

pub mod app;
pub mod batcher;
pub mod binary;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod request;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::export::updates::{LiveModel, UpdateSource};
use std::time::Duration;

use anyhow::Context;

use crate::export::runtime::ExportedModel;

/// What stops the server before it serves: the user's to fix (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot load a model from {dir}: {message}")]
    Load { dir: PathBuf, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

impl crate::error::Classified for ServeError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

/// One loaded version.
pub struct Served {
    pub version: u64,
    pub model: ExportedModel,
    /// The global step of the weights served: the export's, or that of
    /// the last incremental update applied to it.
    pub step: u64,
    /// Where the export's training job writes its incremental updates.
    pub updates: Option<UpdateSource>,
}

impl Served {
    /// Loads the export at `dir`; its version is its folder's name (an
    /// export folder named otherwise is version 1).
    pub fn load(dir: &Path) -> anyhow::Result<Served> {
        let model = ExportedModel::load(dir)?;
        let version = version_of(&model.dir).unwrap_or(1);
        let info = crate::export::read_info(&model.dir)?;
        let step = info.as_ref().and_then(|i| i["global_step"].as_u64()).unwrap_or(0);
        let updates = match &info {
            Some(i) => UpdateSource::of_info(&model.dir, i)?,
            None => None,
        };
        Ok(Served {
            version,
            model,
            step,
            updates,
        })
    }
}

fn version_of(dir: &Path) -> Option<u64> {
    dir.file_name()?.to_str()?.parse().ok()
}

/// TF Serving's load states of a version, as its status endpoint reports
/// them: being loaded, served, or ended (unloaded, or failed with its error).
#[derive(Debug, Clone, PartialEq)]
pub enum VersionState {
    Loading,
    Available,
    End(Option<String>),
}

/// The versions being served, each swapped whole when it is replaced
/// (requests hold the `Arc` they started with until they are answered),
/// the load state of every version seen, and the version labels. Never
/// empty: the newest served version answers requests that name none.
pub struct Registry {
    served: RwLock<BTreeMap<u64, Arc<Served>>>,
    states: RwLock<BTreeMap<u64, VersionState>>,
    labels: BTreeMap<String, u64>,
}

impl Registry {
    pub fn new(first: Served, labels: BTreeMap<String, u64>) -> Self {
        let states = BTreeMap::from([(first.version, VersionState::Available)]);
        Registry {
            served: RwLock::new(BTreeMap::from([(first.version, Arc::new(first))])),
            states: RwLock::new(states),
            labels,
        }
    }

    fn set_state(&self, version: u64, state: VersionState) {
        self.states
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(version, state);
    }

    /// Every version seen with its state, newest first.
    pub fn states(&self) -> Vec<(u64, VersionState)> {
        let s = self.states.read().unwrap_or_else(|e| e.into_inner());
        s.iter().rev().map(|(v, st)| (*v, st.clone())).collect()
    }

    /// The newest version served.
    pub fn current(&self) -> Arc<Served> {
        let served = self.served.read().unwrap_or_else(|e| e.into_inner());
        served.values().next_back().expect("a registry is never empty").clone()
    }

    /// Version `version`, if it is served.
    pub fn get(&self, version: u64) -> Option<Arc<Served>> {
        self.served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&version)
            .cloned()
    }

    /// The versions served, newest first.
    pub fn versions(&self) -> Vec<u64> {
        let served = self.served.read().unwrap_or_else(|e| e.into_inner());
        served.keys().rev().copied().collect()
    }

    /// The version a label (`--version_labels`) names.
    pub fn label(&self, label: &str) -> Option<u64> {
        self.labels.get(label).copied()
    }

    pub fn labels(&self) -> &BTreeMap<String, u64> {
        &self.labels
    }

    /// Serves `next` (in place of the same version, if served).
    fn insert(&self, next: Served) {
        let version = next.version;
        self.served
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(version, Arc::new(next));
        self.set_state(version, VersionState::Available);
    }

    /// Replaces a served version by its updated self; nothing if it was
    /// unloaded meanwhile.
    fn replace(&self, next: Served) {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = served.get_mut(&next.version) {
            *slot = Arc::new(next);
        }
    }

    /// Stops serving `version`, unless it is the last one served.
    fn unload(&self, version: u64) {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        if served.len() > 1 && served.remove(&version).is_some() {
            drop(served);
            self.set_state(version, VersionState::End(None));
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A directory of `<version>/` exports, or one export directory.
    pub model_dir: PathBuf,
    pub model_name: String,
    pub addr: SocketAddr,
    pub batching: batcher::Batching,
    /// How often the model directory is checked for a new version; zero
    /// turns reloading off.
    pub poll: Duration,
    pub max_request_bytes: usize,
    /// How many of the newest loadable versions are served at once (TF
    /// Serving's `latest { num_versions }` policy); at least 1.
    pub num_versions: usize,
    /// Names for versions (`/labels/NAME`, `version_label`).
    pub labels: BTreeMap<String, u64>,
    /// Where gRPC is served, if anywhere.
    pub grpc_addr: Option<SocketAddr>,
}

/// Loads the newest loadable version, starts the watcher and the scoring
/// threads and serves until SIGINT or SIGTERM. `bound` is told the HTTP
/// address, then the gRPC one (if served).
pub fn run(opts: ServeOptions, bound: impl Fn(&str, SocketAddr)) -> anyhow::Result<()> {
    let first = load_first(&opts.model_dir)?;
    log::info!(
        "loaded `{}` version {} from {}",
        opts.model_name,
        first.version,
        first.model.dir.display()
    );
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.serving(first.version, first.step);
    let versioned = first.model.dir != opts.model_dir;
    let follows = first.updates.is_some();
    if let Some(u) = &first.updates {
        log::info!("following the training job's incremental updates in {}", u.describe());
    }
    let registry = Arc::new(Registry::new(first, opts.labels.clone()));
    if (versioned || follows) && !opts.poll.is_zero() {
        let watcher = Watcher {
            root: opts.model_dir.clone(),
            versioned,
            keep: opts.num_versions.max(1),
            registry: registry.clone(),
            metrics: metrics.clone(),
        };
        let poll = opts.poll;
        std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || watcher.run(poll))
            .context("cannot start the reload thread")?;
    }
    let scheduler = batcher::Scheduler::start(opts.batching.clone(), metrics.clone());
    let app = Arc::new(app::App {
        name: opts.model_name.clone(),
        registry,
        scheduler,
        metrics,
        max_request_bytes: opts.max_request_bytes,
        num_versions: opts.num_versions.max(1),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listen = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen { addr, source })
        };
        let listener = listen(opts.addr).await?;
        let local = listener.local_addr()?;
        log::info!("serving `{}` on http://{local}", opts.model_name);
        bound("http", local);
        let grpc = match opts.grpc_addr {
            Some(addr) => {
                let listener = listen(addr).await?;
                let local = listener.local_addr()?;
                log::info!("serving `{}` over gRPC on {local}", opts.model_name);
                bound("grpc", local);
                Some(tokio::spawn(grpc::serve(app.clone(), listener, shutdown())))
            }
            None => None,
        };
        axum::serve(listener, http::router(app))
            .with_graceful_shutdown(shutdown())
            .await
            .context("the HTTP server failed")?;
        if let Some(grpc) = grpc {
            grpc.await.context("the gRPC server stopped")??;
        }
        Ok(())
    })
}

/// The export to serve first: `dir` itself if it is one, else its newest
/// version that loads (a newer one that does not is logged and tried again
/// by the watcher).
fn load_first(dir: &Path) -> Result<Served, ServeError> {
    let failed = |message: String| ServeError::Load {
        dir: dir.to_path_buf(),
        message,
    };
    let versions = crate::export::list_exports(dir).map_err(|e| failed(format!("{e:#}")))?;
    if versions.is_empty() {
        return Served::load(dir).map_err(|e| failed(format!("{e:#}")));
    }
    let mut errors = Vec::new();
    for v in versions.iter().rev() {
        match Served::load(v) {
            Ok(s) => {
                for e in &errors {
                    log::error!("{e}");
                }
                return Ok(s);
            }
            Err(e) => errors.push(format!("version {} failed to load: {e:#}", v.display())),
        }
    }
    Err(failed(errors.join("; ")))
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    log::info!("shutting down: answering the requests in flight");
}

/// How long a version folder must stay unchanged before it is loaded: an
/// export copied in file by file (`cp -r`, rsync) is not read half-written.
const QUIET: Duration = Duration::from_millis(500);
/// The first wait before a failed version is tried again; it doubles up
/// to `RETRY_MAX`, and a version whose files change is tried again at once.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// A version that failed to load: when to try it again, and its files'
/// state then (a change means it was fixed or completed).
struct Failure {
    next: std::time::Instant,
    wait: Duration,
    files: Option<std::time::SystemTime>,
}

/// The newest modification time of the files in `dir` (one level of
/// folders below it too: `assets/`).
fn newest_change(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
    let mut dirs = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = dirs.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if let Ok(t) = m.modified() {
                newest = newest.max(Some(t));
            }
            if m.is_dir() && depth < 1 {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    newest
}

/// What the reload thread watches and where it puts what it loads.
struct Watcher {
    root: PathBuf,
    versioned: bool,
    /// How many of the newest loadable versions are served.
    keep: usize,
    registry: Arc<Registry>,
    metrics: Arc<metrics::Metrics>,
}

impl Watcher {
    /// Every `poll`: applies the newest served export's incremental updates
    /// (`follow`) and, as TF Serving's latest-N version policy does, serves
    /// the `keep` newest versions that load. A folder still being written
    /// (changed within `QUIET`) waits; a version that fails to load is
    /// logged, marked in the status endpoint and tried again with a growing
    /// wait, or at once when its files change; a version beyond the newest
    /// `keep` served ones, or whose folder is gone, is unloaded (the last
    /// one served never is).
    fn run(self, poll: Duration) {
        let mut failed: HashMap<PathBuf, Failure> = HashMap::new();
        let mut live: Option<(u64, LiveModel)> = None;
        let mut bad_updates: Vec<String> = Vec::new();
        loop {
            std::thread::sleep(poll);
            follow(&self.registry, &self.metrics, &mut live, &mut bad_updates);
            if !self.versioned {
                continue;
            }
            match crate::export::list_exports(&self.root) {
                Ok(all) => self.reconcile(&all, &mut failed),
                Err(e) => log::warn!("cannot list versions under {}: {e:#}", self.root.display()),
            }
        }
    }

    fn reconcile(&self, all: &[PathBuf], failed: &mut HashMap<PathBuf, Failure>) {
        let served = self.registry.versions();
        let mut keep: Vec<u64> = Vec::new();
        for dir in all.iter().rev() {
            if keep.len() == self.keep {
                break;
            }
            let Some(version) = version_of(dir) else { continue };
            if served.contains(&version) {
                keep.push(version);
                continue;
            }
            let changed = newest_change(dir);
            if changed.is_some_and(|t| t.elapsed().unwrap_or_default() < QUIET) {
                continue; // still being written
            }
            if let Some(f) = failed.get(dir) {
                if f.files == changed && std::time::Instant::now() < f.next {
                    continue;
                }
            }
            self.registry.set_state(version, VersionState::Loading);
            match Served::load(dir) {
                Ok(next) => {
                    log::info!("serving version {version} from {}", dir.display());
                    self.registry.insert(next);
                    failed.remove(dir);
                    keep.push(version);
                }
                Err(e) => {
                    let wait = failed.get(dir).map_or(RETRY_FIRST, |f| (f.wait * 2).min(RETRY_MAX));
                    log::error!(
                        "version {version} ({}) failed to load and is not served (tried again in {}s, or when its \
                         files change): {e:#}",
                        dir.display(),
                        wait.as_secs()
                    );
                    self.metrics.load_failed();
                    self.registry
                        .set_state(version, VersionState::End(Some(format!("{e:#}"))));
                    failed.insert(
                        dir.clone(),
                        Failure {
                            next: std::time::Instant::now() + wait,
                            wait,
                            files: changed,
                        },
                    );
                }
            }
        }
        if keep.is_empty() {
            return; // nothing loadable: what is served stays
        }
        for v in self.registry.versions() {
            if !keep.contains(&v) {
                log::info!("version {v} is no longer served");
                self.registry.unload(v);
            }
        }
        let newest = self.registry.current();
        self.metrics.serving(newest.version, newest.step);
    }
}

/// Applies the served export's pending incremental updates in order and
/// swaps the updated model in. An update that cannot be applied (damaged,
/// foreign, out of order) is logged, counted and skipped; the model keeps
/// its last good state.
fn follow(registry: &Registry, metrics: &metrics::Metrics, live: &mut Option<(u64, LiveModel)>, bad: &mut Vec<String>) {
    let current = registry.current();
    let Some(source) = current.updates.clone() else {
        return;
    };
    if live.as_ref().is_none_or(|(v, _)| *v != current.version) {
        match LiveModel::load(&current.model.dir, source.clone()) {
            Ok(m) => *live = Some((current.version, m)),
            Err(e) => {
                log::error!("cannot follow the updates of {}: {e:#}", current.model.dir.display());
                return;
            }
        }
    }
    let Some((_, model)) = live.as_mut() else { return };
    let pending = match model.pending() {
        Ok(p) => p,
        Err(e) => {
            log::warn!("cannot read incremental updates: {e:#}");
            return;
        }
    };
    let mut applied = 0;
    let pending: Vec<_> = pending.into_iter().filter(|u| !bad.contains(&u.origin)).collect();
    for update in &pending {
        match model.apply_pending(update) {
            Ok(_) => applied += 1,
            Err(e) => {
                log::error!(
                    "incremental update not applied; the model stays at step {}: {e:#}",
                    model.step
                );
                metrics.load_failed();
                bad.push(update.origin.clone());
            }
        }
    }
    if applied == 0 {
        return;
    }
    match model.runnable() {
        Ok(runnable) => {
            let next = Served {
                version: current.version,
                model: current.model.with_runnable(runnable),
                step: model.step,
                updates: current.updates.clone(),
            };
            log::info!("applied {applied} incremental update(s): serving step {}", model.step);
            metrics.serving(next.version, next.step);
            registry.replace(next);
        }
        Err(e) => {
            log::error!(
                "the updated model cannot be prepared; step {} stays: {e:#}",
                current.step
            );
            metrics.load_failed();
            *live = None;
        }
    }
}
