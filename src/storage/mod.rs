//! Where files live: local paths, and remote ones named by URL —
//! `s3://bucket/key`, `oss://bucket/key` (Alibaba OSS through its
//! S3-compatible interface) and `hdfs://namenode:port/path` — behind one
//! object-store interface (the `object_store` crate; HDFS through its
//! native client). A remote path travels through the program as a
//! `PathBuf` holding the URL unchanged, so every message names it; the
//! functions here tell the two apart by the scheme.
//!
//! Reads stream with read-ahead ([`open`]), or fetch byte ranges
//! ([`Object::range`], Parquet's row groups and columns); writes put whole
//! objects, which appear at once or not at all. A model_dir on remote
//! storage is worked on through a local mirror ([`mirror::Mirror`]).

pub mod credentials;
pub mod glob;
pub mod mirror;
mod read;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

pub use read::RemoteRead;

/// Files up to this size are uploaded in one request, larger ones in
/// parts of this size (at most two in flight).
pub const PART_BYTES: usize = 16 << 20;
/// The most parts of one upload (S3's limit is 10,000).
const MAX_PARTS: u64 = 9_000;

/// The URL schemes read as remote storage.
pub const SCHEMES: [&str; 3] = ["s3", "oss", "hdfs"];

/// Whether `path` names remote storage (`s3://`, `oss://`, `hdfs://`).
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| scheme_of(s).is_some())
}

fn scheme_of(s: &str) -> Option<&'static str> {
    let (scheme, _) = s.split_once("://")?;
    SCHEMES.iter().copied().find(|k| k.eq_ignore_ascii_case(scheme))
}

/// A remote error: what was asked, of which URL and endpoint.
#[derive(Debug)]
pub struct StorageError {
    pub url: String,
    pub endpoint: String,
    pub message: String,
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (endpoint {}): {}", self.url, self.endpoint, self.message)
    }
}

impl std::error::Error for StorageError {}

impl crate::error::Classified for StorageError {
    fn fault(&self) -> crate::error::Fault {
        // An unreachable server, a refused credential or a missing object
        // is the user's environment, not a bug.
        crate::error::Fault::User
    }
}

impl From<StorageError> for io::Error {
    fn from(e: StorageError) -> Self {
        io::Error::other(e)
    }
}

/// One remote store: a bucket, or an HDFS namenode.
#[derive(Clone)]
struct Store {
    inner: Arc<dyn ObjectStore>,
    /// `scheme://authority`, the URL prefix of every key.
    root: String,
    endpoint: String,
}

/// The object (or prefix) a remote path names.
#[derive(Clone)]
pub struct Object {
    store: Store,
    key: Key,
}

/// Remote I/O runs on one small runtime shared by the process, and stores
/// are built once per bucket or namenode: their HTTP connection pools and
/// HDFS sessions are kept across the many small reads of a job. (Process
/// state of the I/O layer only; nothing of a model lives here.)
struct Shared {
    runtime: tokio::runtime::Runtime,
    stores: Mutex<HashMap<String, Store>>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        // reqwest's TLS takes the process's rustls provider (ring: see Cargo.toml).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("storage-io")
            .enable_all()
            .build()
            .expect("the storage runtime starts");
        Shared {
            runtime,
            stores: Mutex::new(HashMap::new()),
        }
    })
}

/// Runs `f` on the storage runtime and waits for it, from any thread
/// (also from inside another runtime, such as `serve`'s).
fn block<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    start(f).recv().expect("a storage task ends with a result")
}

/// Starts `f` on the storage runtime; its result is awaited later.
fn start<F>(f: F) -> std::sync::mpsc::Receiver<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    shared().runtime.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx
}

/// The object remote path `path` names; an error for a local path or a
/// URL without bucket or namenode.
pub fn object(path: &Path) -> Result<Object, StorageError> {
    let url = path.to_string_lossy().into_owned();
    let bad = |message: &str| StorageError {
        url: url.clone(),
        endpoint: "-".into(),
        message: message.into(),
    };
    let scheme = scheme_of(&url).ok_or_else(|| bad("not a remote URL (s3://, oss:// or hdfs://)"))?;
    let rest = &url[scheme.len() + 3..];
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(bad(if scheme == "hdfs" {
            "names no namenode (hdfs://host:port/path)"
        } else {
            "names no bucket"
        }));
    }
    let key = Key::parse(key.trim_end_matches('/')).map_err(|e| bad(&format!("is not a valid object key: {e}")))?;
    let root = format!("{scheme}://{authority}");
    let store = {
        let mut stores = shared().stores.lock().unwrap_or_else(|p| p.into_inner());
        match stores.get(&root) {
            Some(s) => s.clone(),
            None => {
                let s = build_store(scheme, authority, &root).map_err(|message| StorageError {
                    url: url.clone(),
                    endpoint: "-".into(),
                    message,
                })?;
                stores.insert(root.clone(), s.clone());
                s
            }
        }
    };
    Ok(Object { store, key })
}

fn build_store(scheme: &str, authority: &str, root: &str) -> Result<Store, String> {
    let retry = object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 5,
        retry_timeout: Duration::from_secs(120),
    };
    let options = object_store::ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(120));
    let (inner, endpoint): (Arc<dyn ObjectStore>, String) = match scheme {
        "s3" | "oss" => {
            let c = if scheme == "s3" {
                credentials::s3(authority)?
            } else {
                credentials::oss(authority)?
            };
            let endpoint = c.endpoint.clone().unwrap_or_else(|| "AWS S3".into());
            let mut b = object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(authority)
                .with_region(&c.region)
                .with_retry(retry)
                .with_client_options(options)
                .with_virtual_hosted_style_request(c.virtual_hosted);
            if let Some(e) = &c.endpoint {
                b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
            }
            if let Some((id, secret)) = &c.keys {
                b = b.with_access_key_id(id).with_secret_access_key(secret);
            }
            if let Some(t) = &c.token {
                b = b.with_token(t);
            }
            let s = b
                .build()
                .map_err(|e| format!("cannot set up the {scheme} client: {e}"))?;
            (Arc::new(s), endpoint)
        }
        "hdfs" => {
            let s = hdfs_native_object_store::HdfsObjectStoreBuilder::new()
                .with_url(root)
                .with_io_runtime(shared().runtime.handle().clone())
                .build()
                .map_err(|e| format!("cannot set up the HDFS client: {e}"))?;
            (Arc::new(s), root.to_string())
        }
        other => return Err(format!("unsupported scheme {other}")),
    };
    Ok(Store {
        inner,
        root: root.to_string(),
        endpoint,
    })
}

/// A file's name and size under a listed prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// The full URL.
    pub path: PathBuf,
    /// The key below the listed prefix (`a/b.csv`).
    pub relative: String,
    pub size: u64,
    /// The store's entity tag (S3: `"<md5>"`, or `"<md5>-<parts>"` for an
    /// object uploaded in parts), where it gives one.
    pub e_tag: Option<String>,
}

impl Object {
    /// The URL.
    pub fn url(&self) -> String {
        if self.key.as_ref().is_empty() {
            self.store.root.clone()
        } else {
            format!("{}/{}", self.store.root, self.key)
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.store.endpoint
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> StorageError {
        StorageError {
            url: self.url(),
            endpoint: self.store.endpoint.clone(),
            message: format!("{what}: {e}"),
        }
    }

    /// The object `name` below this one (`name` may hold `/`).
    pub fn child(&self, name: &str) -> Object {
        let key = self.key.as_ref().trim_end_matches('/');
        let joined = if key.is_empty() {
            name.to_string()
        } else {
            format!("{key}/{name}")
        };
        Object {
            store: self.store.clone(),
            key: Key::from(joined.as_str()),
        }
    }

    /// Its size in bytes, or None when there is no such object.
    pub fn size(&self) -> Result<Option<u64>, StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        match block(async move { s.head(&k).await }) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("cannot look it up", e)),
        }
    }

    /// Bytes `range` of the object.
    pub fn range(&self, range: Range<u64>) -> Result<Bytes, StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let r = range.clone();
        block(async move { s.get_range(&k, r).await })
            .map_err(|e| self.error(&format!("cannot read bytes {}..{}", range.start, range.end), e))
    }

    /// Several byte ranges at once: the store merges near ones into one
    /// request and fetches the rest in parallel.
    pub fn ranges(&self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>, StorageError> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let n = ranges.len();
        block(async move { s.get_ranges(&k, &ranges).await })
            .map_err(|e| self.error(&format!("cannot read {n} byte ranges"), e))
    }

    fn start_range(&self, range: Range<u64>) -> std::sync::mpsc::Receiver<object_store::Result<Bytes>> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        start(async move { s.get_range(&k, range).await })
    }

    /// The whole object, refused past `limit` bytes.
    pub fn read(&self, limit: u64) -> Result<Vec<u8>, StorageError> {
        let size = self
            .size()?
            .ok_or_else(|| self.error("cannot read it", "no such object"))?;
        if size > limit {
            return Err(self.error(
                "cannot read it",
                format!("{size} bytes, over the {limit} bytes such a file may hold"),
            ));
        }
        Ok(self.range(0..size)?.to_vec())
    }

    /// Writes the object whole: readers see the old one or the new one,
    /// never a part.
    pub fn put(&self, bytes: Vec<u8>) -> Result<(), StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        block(async move { s.put(&k, PutPayload::from(bytes)).await })
            .map(|_| ())
            .map_err(|e| self.error("cannot write it", e))
    }

    /// Writes the object only if there is none; false when one exists.
    pub fn put_new(&self, bytes: Vec<u8>) -> Result<bool, StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match block(async move { s.put_opts(&k, PutPayload::from(bytes), opts).await }) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.error("cannot create it", e)),
        }
    }

    /// Uploads local file `from` as this object: a small file in one
    /// request, a larger one streamed in parts (S3's multipart upload;
    /// HDFS writes a temporary renamed at the end), so neither the 5 GB
    /// limit of one S3 request nor the file's size in memory applies.
    /// Either way the object appears whole or not at all.
    pub fn upload(&self, from: &Path) -> Result<(), StorageError> {
        self.upload_in_parts(from, PART_BYTES)
    }

    /// `upload` with parts of at least `part` bytes (S3 takes no part but
    /// the last under 5 MiB), for files larger than one part.
    pub fn upload_in_parts(&self, from: &Path, part: usize) -> Result<(), StorageError> {
        use std::io::Read;
        let local = |e: io::Error| self.error(&format!("cannot read {}", from.display()), e);
        let mut file = std::fs::File::open(from).map_err(local)?;
        let size = file.metadata().map_err(local)?.len();
        if size <= part as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).map_err(local)?;
            return self.put(bytes);
        }
        // At most MAX_PARTS parts: larger files take larger parts.
        let part = part.max(size.div_ceil(MAX_PARTS) as usize);
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let upload = block(async move { s.put_multipart(&k).await })
            .map_err(|e| self.error("cannot start a multipart upload", e))?;
        let mut writer = Some(object_store::WriteMultipart::new_with_chunk_size(upload, part));
        let mut sent = 0u64;
        let failed = loop {
            let mut chunk = Vec::with_capacity(part);
            match (&mut file).take(part as u64).read_to_end(&mut chunk) {
                Err(e) => break Some(local(e)),
                Ok(0) => break None,
                Ok(n) => sent += n as u64,
            }
            let mut w = writer.take().expect("the writer is held between parts");
            // Two parts in flight while the next is read.
            let (w, r) = block(async move {
                let r = w.wait_for_capacity(2).await;
                if r.is_ok() {
                    w.put(Bytes::from(chunk));
                }
                (w, r)
            });
            writer = Some(w);
            if let Err(e) = r {
                break Some(self.error(&format!("cannot upload the part at byte {sent}"), e));
            }
        };
        let w = writer.take().expect("the writer is held between parts");
        if let Some(e) = failed {
            let _ = block(async move { w.abort().await });
            return Err(e);
        }
        if sent != size {
            let _ = block(async move { w.abort().await });
            return Err(self.error(
                &format!("cannot upload {}", from.display()),
                format!("the file changed size while it was read ({size} bytes, then {sent})"),
            ));
        }
        block(async move { w.finish().await })
            .map(|_| ())
            .map_err(|e| self.error("cannot complete the multipart upload", e))
    }

    /// Downloads the object into local file `to`, streamed through a
    /// temporary beside it that is renamed into place (memory holds the
    /// read-ahead, not the file). Returns the bytes written.
    pub fn download(&self, to: &Path) -> Result<u64, StorageError> {
        let size = self
            .size()?
            .ok_or_else(|| self.error("cannot read it", "no such object"))?;
        let local = |e: io::Error| self.error(&format!("cannot write {}", to.display()), e);
        if std::fs::metadata(to).is_ok_and(|m| !m.is_file()) {
            return Err(local(io::Error::other("it exists and is not a regular file")));
        }
        let tmp = crate::output::Temp::beside(to);
        let mut file = std::fs::File::create(&tmp.path).map_err(local)?;
        let mut from = RemoteRead::new(self.clone(), 0, size);
        let mut n = 0u64;
        loop {
            let chunk = from.next_chunk().map_err(|e| match e.into_inner() {
                Some(inner) => match inner.downcast::<StorageError>() {
                    Ok(s) => *s,
                    Err(other) => self.error("cannot read it", other),
                },
                None => self.error("cannot read it", "the storage runtime stopped"),
            })?;
            if chunk.is_empty() {
                break;
            }
            io::Write::write_all(&mut file, &chunk).map_err(local)?;
            n += chunk.len() as u64;
        }
        file.sync_all().ok();
        tmp.commit(to).map_err(local)?;
        Ok(n)
    }

    /// Removes the object; one already gone is no error.
    pub fn delete(&self) -> Result<(), StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        match block(async move { s.delete(&k).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("cannot delete it", e)),
        }
    }

    /// Every object below this prefix (recursively), sorted by key.
    pub fn list(&self) -> Result<Vec<Listed>, StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let prefix = (!k.as_ref().is_empty()).then_some(k.clone());
        let metas = block(async move { s.list(prefix.as_ref()).try_collect::<Vec<_>>().await })
            .map_err(|e| self.error("cannot list it", e))?;
        Ok(self.listed(metas))
    }

    /// The objects directly below this prefix (not in its folders), sorted
    /// by key: one request where `list` pages through everything below.
    pub fn list_top(&self) -> Result<Vec<Listed>, StorageError> {
        Ok(self.list_level()?.0)
    }

    /// The names of the folders directly below this prefix, sorted.
    pub fn folders(&self) -> Result<Vec<String>, StorageError> {
        Ok(self.list_level()?.1)
    }

    /// The objects and the folder names directly below this prefix, both
    /// sorted: one request.
    pub fn list_level(&self) -> Result<(Vec<Listed>, Vec<String>), StorageError> {
        let (s, k) = (self.store.inner.clone(), self.key.clone());
        let prefix = (!k.as_ref().is_empty()).then_some(k.clone());
        let found = block(async move { s.list_with_delimiter(prefix.as_ref()).await })
            .map_err(|e| self.error("cannot list it", e))?;
        let mut folders: Vec<String> = found
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(String::from))
            .collect();
        folders.sort();
        Ok((self.listed(found.objects), folders))
    }

    fn listed(&self, metas: Vec<object_store::ObjectMeta>) -> Vec<Listed> {
        let base = self.key.as_ref().trim_end_matches('/').to_string();
        let mut out: Vec<Listed> = metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.as_ref().to_string();
                let relative = if base.is_empty() {
                    key.clone()
                } else {
                    key.strip_prefix(&base)?.strip_prefix('/')?.to_string()
                };
                Some(Listed {
                    path: PathBuf::from(format!("{}/{key}", self.store.root)),
                    relative,
                    size: m.size,
                    e_tag: m.e_tag,
                })
            })
            .collect();
        out.sort_by(|a, b| a.relative.cmp(&b.relative));
        out
    }
}

/// Opens `path` (local or remote) for reading from its start.
pub fn open(path: &Path) -> io::Result<Box<dyn io::Read + Send>> {
    if is_remote(path) {
        let o = object(path)?;
        let size = o
            .size()?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, o.error("cannot read it", "no such object")))?;
        Ok(Box::new(RemoteRead::new(o, 0, size)))
    } else {
        Ok(Box::new(std::fs::File::open(path)?))
    }
}

/// The bytes of `path` (local or remote), refused past `limit` bytes.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    if is_remote(path) {
        Ok(object(path)?.read(limit)?)
    } else {
        crate::bounded::read(path, limit)
    }
}

/// `read` as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    crate::bounded::utf8(read(path, limit)?)
}

/// Joins `name` onto `path` keeping a URL's `//`.
pub fn join(path: &Path, name: &str) -> PathBuf {
    if is_remote(path) {
        let s = path.to_string_lossy();
        PathBuf::from(format!("{}/{name}", s.trim_end_matches('/')))
    } else {
        path.join(name)
    }
}
