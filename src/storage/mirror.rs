//! A remote directory (a model_dir, an export root) worked on through a
//! local copy: what a job needs is downloaded first (the state file, the
//! config, the latest checkpoint), the job reads and writes the local copy
//! with the local atomicity rules, and [`Mirror::push`] publishes what
//! changed in the order readers rely on, as TensorFlow does on object
//! stores: every data file first, then each checkpoint's `manifest.json`
//! and each export's `assets/export_info.json` (a reader takes a
//! checkpoint or version only once that file is there), then the
//! `checkpoint` state files last. Files pruned locally (checkpoints,
//! exports, best_ckpt copies) are deleted remotely after that.
//!
//! Hidden names (staged checkpoints `.model.ckpt-N.tmp`, temporaries
//! `.tmp-*`, the local lock) are never published. The model_dir's remote
//! lock is a lease object ([`Lease`]): object stores have no rename, so
//! "create if absent" stands in for the local lock file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{object, Object, StorageError};
use crate::checkpoint::hostname;

/// Files whose presence completes what their directory holds.
const COMPLETES: [&str; 2] = ["manifest.json", "export_info.json"];
/// The state file naming the latest checkpoint.
const STATE_FILE: &str = "checkpoint";
/// The most files one publish uploads at once.
const PARALLEL_UPLOADS: usize = 8;

pub struct Mirror {
    remote: Object,
    local: PathBuf,
    /// (size, modified) of every file as last pushed or pulled.
    known: Mutex<HashMap<String, (u64, SystemTime)>>,
    /// Checkpoint directories an earlier job left remotely that the copy
    /// does not hold.
    remote_checkpoints: Mutex<Vec<String>>,
    /// `keep_checkpoint_max`, for a training job's copy.
    keep: Mutex<Option<usize>>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mirror({} at {})", self.remote.url(), self.local.display())
    }
}

fn stamp(p: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?))
}

fn local_error(remote: &Object, what: String, e: impl std::fmt::Display) -> StorageError {
    remote.error(&what, e)
}

impl Mirror {
    /// A fresh local copy of remote directory `url` (empty until pulled),
    /// under the system's temporary directory; removed when dropped.
    pub fn open(url: &Path) -> Result<Mirror, StorageError> {
        let remote = object(url)?;
        let name: String = remote
            .url()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let tail = &name[name.len().saturating_sub(80)..];
        let base = std::env::temp_dir().join(format!("rustrec-mirror-{}", std::process::id()));
        let mut local = base.join(tail);
        let mut n = 1;
        while local.exists() {
            local = base.join(format!("{tail}-{n}"));
            n += 1;
        }
        std::fs::create_dir_all(&local)
            .map_err(|e| local_error(&remote, format!("cannot create its local copy {}", local.display()), e))?;
        Ok(Mirror {
            remote,
            local,
            known: Mutex::new(HashMap::new()),
            remote_checkpoints: Mutex::new(Vec::new()),
            keep: Mutex::new(None),
        })
    }

    /// The local copy the job works on.
    pub fn local(&self) -> &Path {
        &self.local
    }

    pub fn url(&self) -> String {
        self.remote.url()
    }

    /// Downloads one file (relative name `rel`) into the copy.
    pub fn fetch(&self, rel: &str) -> Result<(), StorageError> {
        self.download(rel)
    }

    fn download(&self, rel: &str) -> Result<(), StorageError> {
        let to = self.local.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| local_error(&self.remote, format!("cannot create {}", parent.display()), e))?;
        }
        self.remote.child(rel).download(&to)?;
        if let Some(s) = stamp(&to) {
            self.lock_known().insert(rel.to_string(), s);
        }
        Ok(())
    }

    fn lock_known(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, SystemTime)>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Downloads what a job on this model_dir reads: the files at its top
    /// (the state file, `pipeline.config`, eval results; not other
    /// checkpoints' TensorFlow files nor event files) and the checkpoint
    /// the state file names. Returns how many files came down.
    pub fn pull_latest(&self) -> Result<usize, StorageError> {
        // The top's files and folders (one listing of one level), then
        // the latest checkpoint's folder: never all the exports below.
        let (files, folders) = self.remote.list_level()?;
        let top: Vec<String> = files.into_iter().map(|l| l.relative).collect();
        let mut checkpoints: Vec<String> = folders.into_iter().filter(|d| d.starts_with("model.ckpt-")).collect();
        let mut n = 0;
        if top.iter().any(|rel| rel == STATE_FILE) {
            self.download(STATE_FILE)?;
            n += 1;
        }
        let latest = std::fs::read_to_string(self.local.join(STATE_FILE))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.trim().strip_prefix("model_checkpoint_path:").map(str::to_string))
            })
            .map(|v| {
                let v = v.trim().trim_matches('"').to_string();
                v.rsplit('/').next().unwrap_or(&v).to_string()
            });
        let latest_folder = latest.as_ref().filter(|c| checkpoints.contains(c)).cloned();
        // The checkpoints that stay remote only (all but the latest).
        checkpoints.retain(|c| latest.as_ref() != Some(c));
        *self.remote_checkpoints.lock().unwrap_or_else(|p| p.into_inner()) = checkpoints;
        for rel in &top {
            let name_is_ckpt = rel.starts_with("model.ckpt-");
            let wanted = match &latest {
                // EasyRec's TensorFlow checkpoint: `<prefix>.index`, `.data-*`.
                Some(ckpt) if rel.starts_with(&format!("{ckpt}.")) => true,
                _ => !name_is_ckpt && !rel.starts_with("events.") && !rel.starts_with('.') && rel != STATE_FILE,
            };
            if wanted {
                self.download(rel)?;
                n += 1;
            }
        }
        if let Some(ckpt) = latest_folder {
            for l in self.remote.child(&ckpt).list()? {
                self.download(&format!("{ckpt}/{}", l.relative))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Downloads every file below `rel` (a checkpoint directory, an
    /// export version) or, for a TensorFlow checkpoint prefix, the files
    /// named `<rel>.*`; everything for `""`. Returns how many.
    pub fn pull(&self, rel: &str) -> Result<usize, StorageError> {
        let rel = rel.trim_matches('/');
        let wanted: Vec<String> = if rel.is_empty() {
            self.remote.list()?.into_iter().map(|l| l.relative).collect()
        } else {
            // What is below `rel`, and its siblings named `<rel>.*`: two
            // listings of those prefixes, not of the whole copy.
            let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            let join = |r: &str| {
                if parent.is_empty() {
                    r.to_string()
                } else {
                    format!("{parent}/{r}")
                }
            };
            let mut w: Vec<String> = self
                .remote
                .child(rel)
                .list()?
                .into_iter()
                .map(|l| format!("{rel}/{}", l.relative))
                .collect();
            let siblings = if parent.is_empty() {
                self.remote.list_top()?
            } else {
                self.remote.child(parent).list_top()?
            };
            w.extend(
                siblings
                    .into_iter()
                    .filter(|l| l.relative.starts_with(&format!("{name}.")))
                    .map(|l| join(&l.relative)),
            );
            w
        };
        for r in &wanted {
            self.download(r)?;
        }
        Ok(wanted.len())
    }

    /// An export root's complete versions (numbered directories whose
    /// `assets/export_info.json`, published last, is there) that the copy
    /// lacks, each downloaded beside and renamed into place whole, so a
    /// server watching the copy never sees part of one. An export that is
    /// not versioned (its files at the top) comes down once. Returns the
    /// versions that came down.
    pub fn pull_versions(&self) -> Result<Vec<String>, StorageError> {
        // One listing of the top; what is below is listed only for a
        // version the copy lacks, once its marker is there.
        let marker = "assets/export_info.json";
        let mut fresh = Vec::new();
        let folders = self.remote.folders()?;
        if folders.iter().any(|f| f == "assets") && self.remote.child(marker).size()?.is_some() {
            if !self.local.join(marker).exists() {
                self.pull("")?;
                fresh.push(String::new());
            }
            return Ok(fresh);
        }
        let versions = folders
            .iter()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        for v in versions {
            let dest = self.local.join(v);
            if dest.exists() || self.remote.child(&format!("{v}/{marker}")).size()?.is_none() {
                continue;
            }
            let staged = format!(".{v}.download");
            let _ = std::fs::remove_dir_all(self.local.join(&staged));
            for l in self.remote.child(v).list()? {
                let to = self.local.join(&staged).join(&l.relative);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| local_error(&self.remote, format!("cannot create {}", parent.display()), e))?;
                }
                self.remote.child(&format!("{v}/{}", l.relative)).download(&to)?;
            }
            std::fs::rename(self.local.join(&staged), &dest)
                .map_err(|e| local_error(&self.remote, format!("cannot rename into {}", dest.display()), e))?;
            fresh.push(v.to_string());
        }
        Ok(fresh)
    }

    /// Makes an empty local folder for each numbered folder at the remote
    /// top (an export root's versions), so that a new version written
    /// into the copy takes a number no remote one has.
    pub fn mark_remote_versions(&self) -> Result<usize, StorageError> {
        let mut n = 0;
        for v in self.remote.folders()? {
            let d = self.local.join(&v);
            if v.bytes().all(|b| b.is_ascii_digit()) && !d.exists() {
                std::fs::create_dir_all(&d)
                    .map_err(|e| local_error(&self.remote, format!("cannot create {}", d.display()), e))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Uploads one local file of the copy (relative name `rel`) now: a
    /// rank's own part of a checkpoint the first rank completes.
    pub fn upload(&self, local_file: &Path, rel: &str) -> Result<(), StorageError> {
        self.remote.child(rel).upload(local_file)
    }

    /// Publishes file `rel` of the copy now, ahead of the next `push` (which
    /// then leaves it alone until it changes).
    pub fn publish(&self, rel: &str) -> Result<(), StorageError> {
        let from = self.local.join(rel);
        self.remote.child(rel).upload(&from)?;
        if let Some(s) = stamp(&from) {
            self.lock_known().insert(rel.to_string(), s);
        }
        Ok(())
    }

    /// Publishes what changed in the local copy since the last push or
    /// pull (see the module's order), then deletes the remote checkpoints
    /// pruned locally. Returns how many files went up.
    pub fn push(&self) -> Result<usize, StorageError> {
        let mut files = Vec::new();
        collect(&self.local, "", &mut files);
        let changed: Vec<(String, (u64, SystemTime))> = {
            let known = self.lock_known();
            files
                .into_iter()
                .filter_map(|rel| {
                    let s = stamp(&self.local.join(&rel))?;
                    (known.get(&rel) != Some(&s)).then_some((rel, s))
                })
                .collect()
        };
        let rank = |rel: &str| {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if name == STATE_FILE {
                2
            } else if COMPLETES.contains(&name) {
                1
            } else {
                0
            }
        };
        let mut ordered = changed;
        ordered.sort_by_key(|(rel, _)| rank(rel));
        // Each stage's files go up together (an HDFS file costs a round of
        // the namenode's completion, ~0.5 s, whatever its size); the next
        // stage starts once the whole stage is published.
        for stage in ordered.chunk_by(|a, b| rank(&a.0) == rank(&b.0)) {
            self.upload_together(stage)?;
        }
        // What was published or downloaded and is gone from the copy now
        // (checkpoints pruned by keep_checkpoint_max, exports beyond
        // exports_to_keep, best_ckpt copies) goes remotely too, now that
        // the state file no longer names it: completing files first, so a
        // reader never takes a checkpoint or version half deleted.
        let mut gone: Vec<String> = self
            .lock_known()
            .keys()
            .filter(|rel| !self.local.join(rel).exists())
            .cloned()
            .collect();
        gone.sort_by_key(|rel| std::cmp::Reverse(rank(rel)));
        for rel in &gone {
            self.remote.child(rel).delete()?;
            self.lock_known().remove(rel);
        }
        self.prune_unlisted()?;
        Ok(ordered.len())
    }

    /// Uploads `files` of the copy on up to PARALLEL_UPLOADS threads;
    /// fails with the first failure once all are done.
    fn upload_together(&self, files: &[(String, (u64, SystemTime))]) -> Result<(), StorageError> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed: Mutex<Option<StorageError>> = Mutex::new(None);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((rel, stamp)) = files.get(i) else { break };
            match self.remote.child(rel).upload(&self.local.join(rel)) {
                Ok(()) => {
                    self.lock_known().insert(rel.clone(), *stamp);
                }
                Err(e) => {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
            }
        };
        let threads = files.len().min(PARALLEL_UPLOADS);
        if threads <= 1 {
            work();
        } else {
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(work);
                }
            });
        }
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes a training job's `push` also prune the checkpoints an earlier
    /// job left that the copy does not hold (only the latest came down):
    /// of those and the copy's, the newest `keep` stay, as one job on a
    /// local model_dir keeps them.
    pub fn prune_checkpoints_beyond(&self, keep: usize) {
        *self.keep.lock().unwrap_or_else(|p| p.into_inner()) = Some(keep);
    }

    fn prune_unlisted(&self) -> Result<(), StorageError> {
        // 0 keeps every checkpoint (TensorFlow's rule, as locally).
        let Some(keep) = (*self.keep.lock().unwrap_or_else(|p| p.into_inner())).filter(|&k| k > 0) else {
            return Ok(());
        };
        let step = |name: &str| name.strip_prefix("model.ckpt-").and_then(|s| s.parse::<u64>().ok());
        let mut unlisted = self.remote_checkpoints.lock().unwrap_or_else(|p| p.into_inner());
        if unlisted.is_empty() {
            return Ok(());
        }
        let mut all: Vec<u64> = std::fs::read_dir(&self.local)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("manifest.json").is_file())
                    .filter_map(|e| step(&e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default();
        all.extend(unlisted.iter().filter_map(|d| step(d)));
        all.sort_unstable();
        all.dedup();
        let kept = &all[all.len().saturating_sub(keep)..];
        let doomed: Vec<String> = unlisted
            .iter()
            .filter(|d| step(d).is_some_and(|s| !kept.contains(&s)))
            .cloned()
            .collect();
        for d in &doomed {
            let mut files: Vec<String> = self.remote.child(d).list()?.into_iter().map(|l| l.relative).collect();
            files.sort_by_key(|f| std::cmp::Reverse(COMPLETES.contains(&f.as_str())));
            for f in files {
                self.remote.child(&format!("{d}/{f}")).delete()?;
            }
            log::info!("removed {}/{d}, beyond keep_checkpoint_max", self.remote.url());
        }
        unlisted.retain(|d| !doomed.contains(d));
        Ok(())
    }
}

/// A checkpoint named by a remote URL, downloaded: our checkpoint folder
/// (its files), a model_dir (the checkpoint its state file names), or a
/// TensorFlow checkpoint prefix (`model.ckpt-N`: its `.index` and data
/// files). Returns the local path to read and the copy holding it.
pub fn fetch_checkpoint(url: &Path) -> Result<(Mirror, PathBuf), StorageError> {
    let text = url.to_string_lossy();
    let text = text.trim_end_matches('/');
    let whole = object(Path::new(text))?;
    if whole.child("manifest.json").size()?.is_none() && whole.child(STATE_FILE).size()?.is_some() {
        let m = Mirror::open(Path::new(text))?;
        m.pull_latest()?;
        let local = m.local.clone();
        return Ok((m, local));
    }
    let (parent, name) = text.rsplit_once('/').unwrap_or((text, ""));
    let m = Mirror::open(Path::new(parent))?;
    if m.pull(name)? == 0 {
        return Err(whole.error("cannot read the checkpoint", "no such object or prefix"));
    }
    let local = m.local.join(name);
    Ok((m, local))
}

/// The non-hidden files below `dir`, as relative names.
fn collect(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        match e.file_type() {
            Ok(t) if t.is_dir() => collect(&e.path(), &rel, out),
            Ok(t) if t.is_file() => out.push(rel),
            _ => {}
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.local);
        if let Some(parent) = self.local.parent() {
            // The process's mirror folder, once its last copy is gone.
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// How long a lease holds without renewal, and how often it is renewed.
const LEASE: Duration = Duration::from_secs(60);
const RENEW: Duration = Duration::from_secs(15);
/// The lease object's name in the model_dir.
pub const LEASE_NAME: &str = ".rustrec-lease";

/// One job's hold on a remote model_dir: an object created only if absent,
/// naming its holder and when the hold lapses, renewed while the job runs
/// and deleted when it ends. A lease that lapsed, or whose holder is a
/// process of this host that no longer runs (a job killed with -9), is
/// taken over.
pub struct Lease {
    object: Object,
    stop: Arc<AtomicBool>,
    renewer: Option<std::thread::JoinHandle<()>>,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn lease_text() -> String {
    format!(
        "{{\"host\": \"{}\", \"pid\": {}, \"expires\": {}}}",
        hostname(),
        std::process::id(),
        now_secs() + LEASE.as_secs()
    )
}

/// Whether lease text `text` no longer holds: lapsed, or its holder is a
/// dead process of this host.
fn lapsed(text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return true;
    };
    let expires = v["expires"].as_u64().unwrap_or(0);
    if expires < now_secs() {
        return true;
    }
    let same_host = v["host"].as_str() == Some(hostname().as_str());
    let pid = v["pid"].as_u64().unwrap_or(0);
    same_host && pid > 0 && !Path::new(&format!("/proc/{pid}")).exists()
}

impl Lease {
    pub fn take(model_dir: &Path) -> anyhow::Result<Lease> {
        let object = object(model_dir)?.child(LEASE_NAME);
        for _ in 0..2 {
            if object.put_new(lease_text().into_bytes())? {
                remove_stale_temporaries(model_dir)?;
                let stop = Arc::new(AtomicBool::new(false));
                let (o, s) = (object.clone(), stop.clone());
                let renewer = std::thread::Builder::new()
                    .name("lease".into())
                    .spawn(move || {
                        let mut waited = Duration::ZERO;
                        while !s.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(200));
                            waited += Duration::from_millis(200);
                            if waited >= RENEW {
                                waited = Duration::ZERO;
                                if let Err(e) = o.put(lease_text().into_bytes()) {
                                    log::warn!("cannot renew the model_dir's lease: {e}");
                                }
                            }
                        }
                    })
                    .ok();
                return Ok(Lease { object, stop, renewer });
            }
            let held = String::from_utf8_lossy(&object.read(1 << 16)?).into_owned();
            if !lapsed(&held) {
                return Err(crate::cli::UserError(format!(
                    "{} is in use by another job ({held}); one job per model_dir",
                    model_dir.display()
                ))
                .into());
            }
            log::warn!("taking over the lapsed lease of {}: {held}", model_dir.display());
            object.delete()?;
        }
        Err(crate::cli::UserError(format!(
            "{}: another job took the model_dir's lease first",
            model_dir.display()
        ))
        .into())
    }
}

/// Removes the temporaries a killed job left in remote model_dir: HDFS
/// writes an object as `.<name>.tmp.<n>` and renames it into place, so a
/// job killed mid-write leaves one. Only the lease holder calls this.
fn remove_stale_temporaries(model_dir: &Path) -> Result<usize, StorageError> {
    let root = object(model_dir)?;
    let mut removed = 0;
    for l in root.list()? {
        let name = l.relative.rsplit('/').next().unwrap_or(&l.relative);
        let temporary = name.starts_with('.') && (name.contains(".tmp.") || name.contains(".tmp-"));
        if temporary && name != LEASE_NAME {
            log::warn!("removing {}, left half written by a stopped job", l.path.display());
            root.child(&l.relative).delete()?;
            removed += 1;
        }
    }
    Ok(removed)
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.renewer.take() {
            let _ = h.join();
        }
        if let Err(e) = self.object.delete() {
            log::warn!("cannot release the model_dir's lease: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_lapse_by_time_or_dead_holder() {
        let live = lease_text();
        assert!(!lapsed(&live));
        let old = format!("{{\"host\": \"h\", \"pid\": 1, \"expires\": {}}}", now_secs() - 1);
        assert!(lapsed(&old));
        let dead = format!(
            "{{\"host\": \"{}\", \"pid\": 4000000000, \"expires\": {}}}",
            hostname(),
            now_secs() + 60
        );
        assert!(lapsed(&dead));
        assert!(lapsed("not json"));
    }
}
