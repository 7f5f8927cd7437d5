//! The archive in an S3-compatible bucket, through the `object_store` crate.
//!
//! Files have the same relative paths in the bucket (under a prefix) as in a local archive.
//! A spill writes the file locally (staging, under the archive's local root), uploads it — the
//! upload returning is the file being durable — and removes the local copy. Reads download a
//! file once into the local root and read that copy (files are immutable: a rewrite of a
//! partition gets a new part number); copies the manifest no longer names are swept like any
//! leftover. The calls run on a runtime of their own, from a thread of their own, so the
//! store's blocking callers may sit on any thread, inside a tokio runtime or not.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;

use crate::{Error, Result};

/// An S3-compatible bucket for the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Archive {
    /// `s3://bucket` or `s3://bucket/prefix`.
    pub url: String,
    /// Endpoint of an S3-compatible service (`http://127.0.0.1:9000`); `None`: AWS, or the
    /// `AWS_ENDPOINT` variable.
    pub endpoint: Option<String>,
    /// Region; `None`: the `AWS_REGION` variable, else `us-east-1`.
    pub region: Option<String>,
    /// Access key and secret; `None`: the `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`
    /// variables (or the instance's credentials).
    pub credentials: Option<(String, String)>,
}

/// The bucket, opened.
pub(crate) struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, as configured: for messages.
    pub(crate) url: String,
    /// The service's endpoint (`None`: AWS), for messages.
    pub(crate) endpoint: Option<String>,
    prefix: String,
    /// `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    /// Set by [`Bucket::stop`]: requests in flight and later ones end with [`stopping`].
    stopping: tokio::sync::watch::Sender<bool>,
    /// Failed requests, and the probe after them ([`Bucket::quiet`]).
    health: Arc<Health>,
}

/// Whether the bucket answers, as its requests found.
#[derive(Debug, Default)]
struct Health {
    /// Requests that failed (after their retries), but for a missing object's.
    failures: AtomicU64,
    /// When the last of them failed; `None` again once a probe got an answer.
    last_failure: Mutex<Option<Instant>>,
    /// A probe is in flight.
    probing: AtomicBool,
}

impl Health {
    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_failure) = Some(Instant::now());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // A runtime dropped inside another's async context would panic; this does not block.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("store", &self.store.to_string()).field("prefix", &self.prefix).finish()
    }
}

/// How long after its first try a request to the bucket is retried (each try may take
/// object_store's request timeout, 30 s, more).
const RETRY_FOR: Duration = Duration::from_secs(30);

fn err(what: &str) -> impl FnOnce(object_store::Error) -> Error + '_ {
    move |e| Error::Archive(format!("object store: {what}: {e}"))
}

/// The error of a request [`Bucket::stop`] ended.
fn stopping() -> object_store::Error {
    object_store::Error::Generic { store: "archive", source: STOPPING.into() }
}

/// What an archive request that an ordered stop ended says ([`crate::Store::stop_archive_requests`];
/// [`crate::Error::is_stopping`] looks for it).
pub const STOPPING: &str = "the store is stopping: request abandoned";

/// Whether `e` is the service's `NoSuchBucket` (which `object_store` reports as `NotFound`,
/// like a missing object).
fn no_such_bucket(e: &object_store::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if s.to_string().contains("NoSuchBucket") {
            return true;
        }
        source = s.source();
    }
    false
}

impl Bucket {
    pub(crate) fn open(cfg: &S3Archive) -> Result<Bucket> {
        let rest = cfg
            .url
            .strip_prefix("s3://")
            .ok_or_else(|| Error::Archive(format!("`{}` is not an s3://bucket[/prefix] URL", cfg.url)))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::Archive(format!("`{}` names no bucket", cfg.url)));
        }
        // A request is retried for at most `RETRY_FOR` (object_store's default is 3 minutes): an
        // endpoint that stalls fails the spill run, retried at the next interval, instead of
        // holding the run, and a stop or a checkpoint waiting on it, for minutes an operation.
        let retry = object_store::RetryConfig { retry_timeout: RETRY_FOR, ..object_store::RetryConfig::default() };
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(retry);
        if let Some(endpoint) = &cfg.endpoint {
            b = b.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
        }
        if let Some(region) = &cfg.region {
            b = b.with_region(region);
        }
        if let Some((key, secret)) = &cfg.credentials {
            b = b.with_access_key_id(key).with_secret_access_key(secret);
        }
        let store = b.build().map_err(err("configure"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("archive-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::Archive(format!("object store runtime: {e}")))?;
        Ok(Bucket {
            store: Arc::new(store),
            url: cfg.url.trim_end_matches('/').to_string(),
            endpoint: cfg.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT").ok()),
            prefix: prefix.trim_matches('/').to_string(),
            rt: Some(rt),
            stopping: tokio::sync::watch::Sender::new(false),
            health: Arc::default(),
        })
    }

    /// The object of the file at `rel` (a relative path of the archive layout).
    fn object(&self, rel: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rel)
        } else {
            ObjectPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// Runs the request `f` to its end on the bucket's runtime, from a fresh thread, or until
    /// [`Bucket::stop`] (then [`stopping`]'s error).
    fn run<T: Send>(
        &self,
        f: impl std::future::Future<Output = object_store::Result<T>> + Send,
    ) -> object_store::Result<T> {
        // `rt` is `None` only inside `drop`.
        let rt = self.rt.as_ref().unwrap_or_else(|| unreachable!("the bucket's runtime is gone"));
        let mut stop = self.stopping.subscribe();
        let request = async move {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stopping| *stopping) => Err(stopping()),
                done = f => done,
            }
        };
        let done = std::thread::scope(|s| {
            s.spawn(|| rt.block_on(request)).join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        if let Err(e) = &done {
            if !matches!(e, object_store::Error::NotFound { .. } | object_store::Error::AlreadyExists { .. })
                || no_such_bucket(e)
            {
                self.health.failed();
            }
        }
        done
    }

    /// Requests that failed (after their retries), but for a missing object's (a missing
    /// bucket's count).
    pub(crate) fn failures(&self) -> u64 {
        self.health.failures.load(Ordering::Relaxed)
    }

    /// Whether the bucket is to be left alone by work that can wait (roll-up passes reading
    /// archived hours): a request failed and no probe has had an answer since. For `window`
    /// after the last failure nothing asks; then a probe (a `HEAD` of the owner object, in the
    /// background: against a bucket that does not answer it waits out its retries, 30 s and
    /// more) asks, and the bucket is left alone until it answers, for another `window` if it
    /// fails too. The caller never waits on the probe.
    pub(crate) fn quiet(&self, window: Duration) -> bool {
        let Some(at) = *lock(&self.health.last_failure) else {
            return false;
        };
        if at.elapsed() >= window && !self.health.probing.swap(true, Ordering::SeqCst) {
            self.probe();
        }
        true
    }

    /// Asks the bucket for the owner object's metadata in the background; an answer (the
    /// object missing included, but not the bucket) ends [`Bucket::quiet`] unless a request
    /// failed since the probe began; a failure counts as any request's.
    fn probe(&self) {
        let (store, health, object) =
            (Arc::clone(&self.store), Arc::clone(&self.health), self.object(super::OWNER_FILE));
        let mut stop = self.stopping.subscribe();
        let began = Instant::now();
        let probe = async move {
            let answer = tokio::select! {
                biased;
                _ = stop.wait_for(|stopping| *stopping) => None,
                answer = store.head(&object) => Some(answer),
            };
            match answer {
                // Stopping: nothing learnt.
                None => {}
                Some(Err(e)) if !matches!(e, object_store::Error::NotFound { .. }) || no_such_bucket(&e) => {
                    tracing::debug!(error = %e, "the archive's bucket still does not answer");
                    health.failed();
                }
                Some(_) => {
                    let mut last = lock(&health.last_failure);
                    if last.is_some_and(|at| at <= began) {
                        *last = None;
                        tracing::info!("the archive's bucket answers again: roll-up passes read archived hours again");
                    }
                }
            }
            health.probing.store(false, Ordering::SeqCst);
        };
        // `rt` is `None` only inside `drop`.
        let rt = self.rt.as_ref().unwrap_or_else(|| unreachable!("the bucket's runtime is gone"));
        rt.spawn(probe);
    }

    /// `err`'s error for a request that failed at `what`, or one saying that the bucket does
    /// not exist (the service's `NoSuchBucket`, which `object_store` reports as a missing
    /// object: taken for a missing owner object, it was answered as a claim; for a missing part
    /// file, as a checkpoint restored).
    fn fail<'a>(&'a self, what: &'a str) -> impl FnOnce(object_store::Error) -> Error + 'a {
        move |e| {
            if no_such_bucket(&e) {
                let bucket = self.url.strip_prefix("s3://").unwrap_or(&self.url);
                let bucket = bucket.split('/').next().unwrap_or(bucket);
                Error::Archive(format!(
                    "object store: {what}: the bucket {bucket} does not exist at {}: are storage.archive_url and \
                     storage.archive_s3_endpoint this store's? (A service without persistence that restarted has \
                     lost the bucket, and with it the partitions archived there)",
                    self.endpoint.as_deref().unwrap_or("AWS")
                ))
            } else {
                err(what)(e)
            }
        }
    }

    /// Ends the requests in flight and refuses later ones (an ordered stop: a bucket that does
    /// not answer would hold a roll-up pass or a spill for each request's retries, 30 s and more).
    pub(crate) fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Uploads the local file `from` as `rel`; returns once the bucket has it.
    pub(crate) fn upload(&self, from: &Path, rel: &str) -> Result<()> {
        let bytes = std::fs::read(from).map_err(|e| Error::Archive(format!("read {}: {e}", from.display())))?;
        let object = self.object(rel);
        self.run(self.store.put(&object, bytes.into())).map_err(self.fail("upload"))?;
        Ok(())
    }

    /// The bytes of the small object `rel`; `None` when there is none.
    pub(crate) fn get_small(&self, rel: &str) -> Result<Option<Vec<u8>>> {
        let object = self.object(rel);
        match self.run(async { self.store.get(&object).await?.bytes().await }) {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(e @ object_store::Error::NotFound { .. }) if !no_such_bucket(&e) => Ok(None),
            Err(e) => Err(self.fail("read")(e)),
        }
    }

    /// Writes the small object `rel` unless the bucket has one (`false`, the object left as it
    /// is: a conditional put, `If-None-Match: *`, so of two stores claiming a prefix at once
    /// one wins); returns once the bucket has it. A service that refuses conditional puts gets
    /// a plain one (as one that ignores the condition does).
    pub(crate) fn create_small(&self, rel: &str, bytes: Vec<u8>) -> Result<bool> {
        let object = self.object(rel);
        let create = object_store::PutOptions { mode: object_store::PutMode::Create, ..Default::default() };
        match self.run(self.store.put_opts(&object, bytes.clone().into(), create)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => {
                tracing::debug!(object = %object, error = %e, "a conditional put was refused; putting plainly");
                self.run(self.store.put(&object, bytes.into())).map_err(self.fail("write"))?;
                Ok(true)
            }
        }
    }

    /// Writes the small object `rel`, whatever the bucket had there; returns once it has it.
    pub(crate) fn put_small(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        let object = self.object(rel);
        self.run(self.store.put(&object, bytes.into())).map_err(self.fail("write"))?;
        Ok(())
    }

    /// Downloads `rel` to the local file `to` (written under a temporary name, then renamed).
    pub(crate) fn download(&self, rel: &str, to: &Path) -> Result<()> {
        let object = self.object(rel);
        let bytes = match self.run(async { self.store.get(&object).await?.bytes().await }) {
            Ok(bytes) => bytes,
            // Said plainly: the object store's error carries the service's XML body.
            Err(e @ object_store::Error::NotFound { .. }) if !no_such_bucket(&e) => {
                return Err(Error::Archive(format!(
                    "the bucket has no {}/{rel}, which this store's manifest names: was this store restored from a \
                     checkpoint taken before the partition's file was rewritten or deleted, or did the bucket lose \
                     its objects (emptied, or an S3 service without persistence restarted)? Without the bucket's \
                     object versions for as long as the checkpoints are kept (README, Backups), its readings are lost",
                    self.url
                )))
            }
            Err(e) => return Err(self.fail("download")(e)),
        };
        // A name of this download's own: readers that find the file missing at once each
        // download it (one name was truncated under another's rename: a reader saw a partial
        // file, another's rename failed).
        let tmp = to.with_extension(format!("{:016x}.parquet.download", rand::random::<u64>()));
        let write = || -> std::io::Result<()> {
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, to)
        };
        // A spill run's sweep removes a partition's directory it finds empty, as one made here
        // is until the file is written in it: made again then.
        match write() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write(),
            done => done,
        }
        .map_err(|e| Error::Archive(format!("cache {}: {e}", to.display())))
    }

    /// Whether the object `rel` was last written after `since`; `false` when the bucket has
    /// none.
    pub(crate) fn written_after(&self, rel: &str, since: std::time::SystemTime) -> Result<bool> {
        let object = self.object(rel);
        match self.run(self.store.head(&object)) {
            Ok(meta) => Ok(std::time::SystemTime::from(meta.last_modified) > since),
            Err(e @ object_store::Error::NotFound { .. }) if !no_such_bucket(&e) => Ok(false),
            Err(e) => Err(self.fail("head")(e)),
        }
    }

    /// Deletes `rel` (absent is fine).
    pub(crate) fn delete(&self, rel: &str) -> Result<()> {
        let object = self.object(rel);
        match self.run(self.store.delete(&object)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail("delete")(e)),
        }
    }

    /// Every object under the prefix.
    pub(crate) fn list(&self) -> Result<Vec<ObjectPath>> {
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let metas: Vec<object_store::ObjectMeta> =
            self.run(self.store.list(prefix.as_ref()).try_collect()).map_err(self.fail("list"))?;
        Ok(metas.into_iter().map(|m| m.location).collect())
    }

    /// The part objects of the archive layout right under the prefix,
    /// `{prefix}/table=…/partition=…/part-N.parquet`. The listing goes through every depth:
    /// objects deeper down (another store's prefix nested in this one, an operator's copies
    /// under a folder of their own) are not this store's.
    pub(crate) fn list_parts(&self) -> Result<Vec<ObjectPath>> {
        let inside = |o: &ObjectPath| match self.prefix.as_str() {
            "" => Some(o.as_ref().to_string()),
            prefix => o.as_ref().strip_prefix(prefix)?.strip_prefix('/').map(str::to_string),
        };
        Ok(self.list()?.into_iter().filter(|o| inside(o).is_some_and(|rel| is_layout_part(&rel))).collect())
    }

    /// The object of `rel`, to compare with [`Bucket::list`]'s.
    pub(crate) fn object_of(&self, rel: &str) -> ObjectPath {
        self.object(rel)
    }

    /// Deletes an object [`Bucket::list`] gave.
    pub(crate) fn delete_object(&self, object: &ObjectPath) -> Result<()> {
        match self.run(self.store.delete(object)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail("delete")(e)),
        }
    }
}

/// Whether `rel` is a part file's path in the archive layout: `table=…/partition=…/part-….parquet`.
pub(crate) fn is_layout_part(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    matches!(parts.as_slice(), [table, partition, file]
        if table.starts_with("table=") && partition.starts_with("partition=")
            && file.starts_with("part-") && file.ends_with(".parquet"))
}
