//! [`Storage`]: one object store (from a URL) with timeouts, retries, multipart
//! uploads and metrics on every operation.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::error::{StorageError, StorageResult};
use crate::location::StoreUrl;
use crate::metrics::METRICS;
use crate::settings::{S3Settings, StorageOptions};

/// What `head` and `list` report about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Key relative to the store's prefix.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Entity tag or version, when the store has one; changes when the object does.
    pub version: Option<String>,
    /// When the object was last written (the store's clock), ms since the Unix epoch.
    pub last_modified_ms: u64,
}

/// An object store with the operations Quiver needs. Cheap to clone.
#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    description: String,
    options: StorageOptions,
    /// The directory store, when this is a `file://` store: its objects are plain
    /// files that readers may map instead of fetching.
    local: Option<Arc<object_store::local::LocalFileSystem>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Storage")
            .field("store", &self.description)
            .finish()
    }
}

/// The S3 client for `bucket`: credentials from the environment first (web identity
/// / IRSA, container or instance credentials are found the usual way), the explicit
/// settings override; timeouts and retries from `options`; the CA bundle's
/// certificates trusted besides the system's (for S3 and STS).
pub(crate) fn s3_store(
    settings: &S3Settings,
    bucket: &str,
    options: &StorageOptions,
) -> StorageResult<object_store::aws::AmazonS3> {
    let config_error =
        |error: object_store::Error| StorageError::Config(format!("s3://{bucket}: {error}"));
    let retry = object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: options.initial_backoff,
            ..Default::default()
        },
        max_retries: options.max_retries,
        retry_timeout: options.operation_timeout,
    };
    let mut client = object_store::ClientOptions::new()
        .with_timeout(options.request_timeout)
        .with_connect_timeout(options.connect_timeout)
        .with_allow_http(
            settings
                .endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
        );
    if let Some(pem) = ca_bundle_pem(settings)? {
        for certificate in object_store::Certificate::from_pem_bundle(&pem)
            .map_err(|error| ca_bundle_error(settings, &error.to_string()))?
        {
            client = client.with_root_certificate(certificate);
        }
    }
    let mut builder = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_region(settings.region_or_default())
        .with_virtual_hosted_style_request(settings.virtual_hosted_style)
        .with_retry(retry)
        .with_client_options(client);
    if let Some(endpoint) = &settings.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let (Some(id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
        builder = builder
            .with_access_key_id(id)
            .with_secret_access_key(secret);
    }
    if let Some(token) = &settings.session_token {
        builder = builder.with_token(token);
    }
    builder.build().map_err(config_error)
}

/// The CA bundle's PEM text, when one is configured; an unreadable or empty file
/// is an error naming it.
pub(crate) fn ca_bundle_pem(settings: &S3Settings) -> StorageResult<Option<Vec<u8>>> {
    let Some(path) = &settings.ca_bundle else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|error| ca_bundle_error(settings, &error.to_string()))?;
    if !pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|window| window == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(ca_bundle_error(
            settings,
            "holds no `BEGIN CERTIFICATE` block",
        ));
    }
    Ok(Some(pem))
}

pub(crate) fn ca_bundle_error(settings: &S3Settings, reason: &str) -> StorageError {
    StorageError::Config(format!(
        "CA bundle {} (AWS_CA_BUNDLE or [storage] ca_bundle): {reason}",
        settings.ca_bundle.as_deref().unwrap_or_default()
    ))
}

/// The largest single write of an object into a local store (see
/// [`Storage::put`]).
const LOCAL_WRITE_BYTES: usize = 1 << 20;

impl Storage {
    /// Opens the store at `url` (creating the directory of a `file://` store).
    pub fn open(
        url: &StoreUrl,
        settings: &S3Settings,
        options: StorageOptions,
    ) -> StorageResult<Self> {
        let mut local_store = None;
        let store: Arc<dyn ObjectStore> = match url {
            StoreUrl::Memory => Arc::new(object_store::memory::InMemory::new()),
            StoreUrl::File { root } => {
                std::fs::create_dir_all(root).map_err(|error| {
                    StorageError::Config(format!("creating {}: {error}", root.display()))
                })?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(root).map_err(
                    |error| StorageError::Config(format!("{}: {error}", root.display())),
                )?;
                // Durable when a put returns, as an S3 PUT is: the file and its
                // directory entry synced (an acknowledged write's WAL object must
                // survive a power loss, not only a killed process).
                let local = Arc::new(local.with_automatic_cleanup(true).with_fsync(true));
                local_store = Some(local.clone());
                local
            }
            StoreUrl::S3 { bucket, prefix } => {
                let s3 = s3_store(settings, bucket, &options)?;
                if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(s3, prefix.as_str()))
                }
            }
        };
        Ok(Storage {
            store,
            description: url.to_string(),
            options,
            local: local_store,
        })
    }

    /// Wraps an existing store (tests use it to inject faults).
    pub fn from_store(
        store: Arc<dyn ObjectStore>,
        description: impl Into<String>,
        options: StorageOptions,
    ) -> Self {
        Storage {
            store,
            description: description.into(),
            options,
            local: None,
        }
    }

    /// Returns the same store with other timeouts, retries or upload sizes.
    pub fn from_store_with_options(other: &Storage, options: StorageOptions) -> Self {
        Storage {
            store: other.store.clone(),
            description: other.description.clone(),
            options,
            local: other.local.clone(),
        }
    }

    /// Returns the file that holds object `key` when this is a `file://` store
    /// (whose objects are plain files, written whole and renamed into place, so a
    /// file under a key never changes), `None` for any other store.
    pub fn local_path(&self, key: &str) -> Option<std::path::PathBuf> {
        let local = self.local.as_ref()?;
        local.path_to_filesystem(&Path::from(key)).ok()
    }

    /// Tells whether this is a `file://` store (see [`Storage::local_path`]).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Returns the store's URL (no secrets).
    pub fn description(&self) -> &str {
        &self.description
    }

    async fn run<T>(
        &self,
        operation: &'static str,
        key: &str,
        future: impl Future<Output = Result<T, object_store::Error>>,
    ) -> StorageResult<T> {
        self.run_with_timeout(operation, key, self.options.operation_timeout, future)
            .await
    }

    async fn run_with_timeout<T>(
        &self,
        operation: &'static str,
        key: &str,
        timeout: Duration,
        future: impl Future<Output = Result<T, object_store::Error>>,
    ) -> StorageResult<T> {
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, future).await;
        METRICS
            .duration
            .with_label_values(&[operation])
            .observe(started.elapsed().as_secs_f64());
        let (outcome, result) = match result {
            Ok(Ok(value)) => ("ok", Ok(value)),
            Ok(Err(error)) => {
                let error = StorageError::from_store(operation, key, error);
                let outcome = if matches!(error, StorageError::NotFound { .. }) {
                    "not_found"
                } else {
                    "error"
                };
                (outcome, Err(error))
            }
            Err(_) => (
                "timeout",
                Err(StorageError::Timeout {
                    operation,
                    key: key.to_string(),
                    timeout_ms: timeout.as_millis() as u64,
                }),
            ),
        };
        METRICS
            .requests
            .with_label_values(&[operation, outcome])
            .inc();
        if let Err(error) = &result {
            tracing::debug!(store = %self.description, %key, operation, %error, "object store operation failed");
        }
        result
    }

    /// Writes `bytes` as object `key` (in parts above the multipart threshold).
    ///
    /// A multipart upload is bounded by `operation_timeout` per started GiB, not
    /// one `operation_timeout` for any size (a merged segment of several GiB
    /// must not fail for its size alone). When it fails after its parts were
    /// sent — the answer to `CompleteMultipartUpload` lost to a timeout or a
    /// broken connection while the server assembled the object, which for a
    /// large object can take minutes; a retry then finds the upload gone —
    /// the object is looked up: present with exactly `bytes.len()` bytes, it is
    /// this upload's (Quiver writes each key once), and the put succeeded.
    pub async fn put(&self, key: &str, bytes: Bytes) -> StorageResult<()> {
        let path = Path::from(key);
        let size = bytes.len();
        if size > self.options.multipart_threshold_bytes {
            let part_size = self.options.part_size_bytes;
            let gibibytes = size.div_ceil(1 << 30).max(1) as u32;
            let timeout = self.options.operation_timeout * gibibytes;
            let uploaded = self
                .run_with_timeout("put_multipart", key, timeout, async {
                    let upload = self.store.put_multipart(&path).await?;
                    let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
                    writer.put(bytes);
                    writer.finish().await.map(|_| ())
                })
                .await;
            if let Err(error) = uploaded {
                match self.head(key).await {
                    Ok(info) if info.size == size as u64 => {
                        tracing::warn!(
                            store = %self.description, %key, size, %error,
                            "multipart upload reported an error, but the object is whole: its completion's answer was lost"
                        );
                    }
                    _ => return Err(error),
                }
            }
        } else {
            let mapped = matches!(
                crate::keys::parse_key(key),
                Some(crate::keys::ObjectKind::Segment { .. })
            );
            let payload = if self.local.is_some() && !mapped {
                // A local store writes each piece with its own `write`, and a
                // page-cache folio is as large as the write that made it: one
                // write of several MiB makes 2 MiB folios, which on a virtual
                // machine cost the CPU several seconds per GB to fill (see
                // `quiver_index::DirectFileWriter`); 1 MiB pieces do not. A
                // segment keeps its whole write: searchers map it, and 2 MiB
                // folios are mapped with 2 MiB pages.
                (0..size)
                    .step_by(LOCAL_WRITE_BYTES)
                    .map(|start| bytes.slice(start..(start + LOCAL_WRITE_BYTES).min(size)))
                    .collect()
            } else {
                PutPayload::from_bytes(bytes)
            };
            self.run("put", key, self.store.put(&path, payload)).await?;
        }
        METRICS
            .bytes
            .with_label_values(&["write"])
            .inc_by(size as u64);
        Ok(())
    }

    /// Writes object `key` from `file`, finished, whose contents `bytes` are
    /// (a mapping of it). A `file://` store takes the file itself: it is linked
    /// into place under the key — an unnamed temporary file (`O_TMPFILE`) gets
    /// its name there — so a segment of gigabytes is not copied on the disk,
    /// and the object shares the file's page cache (its huge folios too). Any
    /// other store, or a file the store cannot link (on another filesystem, or
    /// one that had a name and lost it), gets `bytes` as from [`Storage::put`].
    pub async fn put_file(
        &self,
        key: &str,
        file: &std::fs::File,
        bytes: Bytes,
    ) -> StorageResult<()> {
        if let Some(path) = self.local_path(key) {
            let started = Instant::now();
            // Syncs (a file written through the page cache may have gigabytes
            // to write back): off the async workers.
            let linked = match file.try_clone() {
                Ok(file) => tokio::task::spawn_blocking(move || link_into_place(&file, &path))
                    .await
                    .unwrap_or_else(|error| Err(std::io::Error::other(error))),
                Err(error) => Err(error),
            };
            match linked {
                Ok(()) => {
                    METRICS
                        .duration
                        .with_label_values(&["link"])
                        .observe(started.elapsed().as_secs_f64());
                    METRICS.requests.with_label_values(&["link", "ok"]).inc();
                    return Ok(());
                }
                Err(error) => tracing::debug!(
                    store = %self.description, %key, %error,
                    "cannot link the file into the local store; writing a copy"
                ),
            }
        }
        self.put(key, bytes).await
    }

    /// Reads the whole object `key`.
    pub async fn get(&self, key: &str) -> StorageResult<Bytes> {
        let path = Path::from(key);
        let bytes = self
            .run("get", key, async {
                self.store.get(&path).await?.bytes().await
            })
            .await?;
        METRICS
            .bytes
            .with_label_values(&["read"])
            .inc_by(bytes.len() as u64);
        Ok(bytes)
    }

    /// Reads `range` of object `key`; fewer bytes than asked is an error.
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> StorageResult<Bytes> {
        let path = Path::from(key);
        let expected = range.end - range.start;
        let bytes = self
            .run("get_range", key, self.store.get_range(&path, range))
            .await?;
        METRICS
            .bytes
            .with_label_values(&["read"])
            .inc_by(bytes.len() as u64);
        if bytes.len() as u64 != expected {
            return Err(StorageError::ShortRead {
                operation: "get_range",
                key: key.to_string(),
                expected,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Returns the size and version of object `key`.
    pub async fn head(&self, key: &str) -> StorageResult<ObjectInfo> {
        let path = Path::from(key);
        let meta = self.run("head", key, self.store.head(&path)).await?;
        Ok(ObjectInfo {
            key: key.to_string(),
            size: meta.size,
            last_modified_ms: u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
            version: meta.e_tag.or(meta.version),
        })
    }

    /// Deletes object `key` (deleting a missing object succeeds).
    pub async fn delete(&self, key: &str) -> StorageResult<()> {
        let path = Path::from(key);
        match self.run("delete", key, self.store.delete(&path)).await {
            Err(StorageError::NotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// Lists every object whose key starts with `prefix` (a directory-like prefix).
    pub async fn list(&self, prefix: &str) -> StorageResult<Vec<ObjectInfo>> {
        use futures_util::TryStreamExt;
        let path = Path::from(prefix);
        let listed: Vec<object_store::ObjectMeta> = self
            .run("list", prefix, self.store.list(Some(&path)).try_collect())
            .await?;
        Ok(listed
            .into_iter()
            .map(|meta| ObjectInfo {
                key: meta.location.to_string(),
                size: meta.size,
                last_modified_ms: u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0),
                version: meta.e_tag.or(meta.version),
            })
            .collect())
    }
}

/// Gives the open `file` the name `path` (its directories created): a hard
/// link through `/proc/self/fd`, which is also how an `O_TMPFILE` file is
/// named. Fails across filesystems, when `path` exists, and for a file that
/// had a name and lost it.
fn link_into_place(file: &std::fs::File, path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // Durable when it returns, as a put is: the file's data and size first, then
    // its new name and any directory made for it.
    file.sync_all()?;
    let mut made = Vec::new();
    if let Some(parent) = path.parent() {
        let mut missing = Some(parent);
        while let Some(directory) = missing.filter(|directory| !directory.exists()) {
            made.push(directory);
            missing = directory.parent();
        }
        std::fs::create_dir_all(parent)?;
    }
    let open_file = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        open_file.as_str(),
        rustix::fs::CWD,
        path,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    )?;
    // The directory holding the new name, and each directory made on the way
    // in the one holding it.
    let parent = path.parent();
    for directory in parent
        .into_iter()
        .chain(made.iter().filter_map(|made| made.parent()))
    {
        std::fs::File::open(directory)?.sync_all()?;
    }
    Ok(())
}
