//! Following a shard's manifest: the shards this node serves ([`ServedShard`])
//! and bringing one's view to a newer manifest — the one the watch announced, or
//! at least a version a query asks for — incrementally from the current view,
//! one reload at a time per shard, warming what is new.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use quiver_index::SegmentSpec;
use quiver_proto::convert::manifest_from_proto;
use quiver_proto::meta as pb;
use quiver_proto::{ErrorCode, ServiceError, status_of};
use quiver_storage::manifest::{Manifest, ShardRef};
use tonic::Status;

use crate::error::SearcherError;
use crate::metrics::METRICS;
use crate::node::NodeState;
use crate::shard::{LoadStats, ShardView};
use crate::warm_up::{record_warm_up, warm_new_rows, warm_new_segments};

/// One shard this node serves: its current view and the manifest to load next.
pub(crate) struct ServedShard {
    spec: SegmentSpec,
    /// Shared with the background row warm-up, which stops on segments a newer
    /// view no longer has.
    view: Arc<RwLock<Option<Arc<ShardView>>>>,
    /// One manifest reload at a time per shard.
    reload: tokio::sync::Mutex<()>,
    /// The newest manifest the watch announced and no reload has taken yet
    /// (shared with a preparation, [`prepare_same_rows`], which stops warming
    /// rows once a manifest with new rows waits).
    wanted: Arc<Mutex<Option<Manifest>>>,
    /// `(view version, manifest version)`: the manifest meta has at that
    /// version holds exactly the rows of the view at that version (see
    /// [`ServedShard::view_with_rows_of`]).
    same_rows: Mutex<Option<(u64, u64)>>,
    /// The manifest version a view is being prepared for ([`prepare_same_rows`]),
    /// 0 for none: a background poll for that version leaves it to the reload
    /// that follows the preparation, rather than serve it with cold rows.
    preparing: AtomicU64,
}

impl ServedShard {
    pub(crate) fn new(spec: SegmentSpec) -> Self {
        ServedShard {
            spec,
            view: Arc::new(RwLock::new(None)),
            reload: tokio::sync::Mutex::new(()),
            wanted: Arc::new(Mutex::new(None)),
            same_rows: Mutex::new(None),
            preparing: AtomicU64::new(0),
        }
    }

    /// Returns the served view if it holds exactly the rows of manifest
    /// `version` or newer — what a strong read needs (every acknowledged
    /// write), not the newest layout. Rows enter a shard only through WAL
    /// commits, each of which moves the manifest's `last_committed`; flushes
    /// and merges (the many manifest versions right after a load) only move
    /// rows between the WAL tail and segments. So when a manifest at least as
    /// new as `version` has the view's `last_committed`, so has every version
    /// in between, and the view answers at once while the new layout loads in
    /// the background, its codes warmed first — instead of the query waiting
    /// for that warm-up (1.4 s for a merged 100k-row segment over S3).
    /// Known from an earlier check, or from the manifest the watch announced.
    pub(crate) fn view_with_rows_of(&self, version: u64) -> Option<Arc<ShardView>> {
        let view = self.view()?;
        let current = view.manifest().version;
        if current >= version {
            return Some(view);
        }
        let known = *self.same_rows.lock().unwrap_or_else(|p| p.into_inner());
        if known
            .is_some_and(|(view_version, through)| view_version == current && through >= version)
        {
            return Some(view);
        }
        let announced = {
            let wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
            wanted
                .as_ref()
                .filter(|manifest| {
                    manifest.version >= version
                        && manifest.last_committed == view.manifest().last_committed
                })
                .map(|manifest| manifest.version)
        };
        let through = announced?;
        self.note_same_rows(current, through);
        Some(view)
    }

    /// Records that the manifest at `through` holds the rows of the view at
    /// `view_version`.
    pub(crate) fn note_same_rows(&self, view_version: u64, through: u64) {
        let mut known = self.same_rows.lock().unwrap_or_else(|p| p.into_inner());
        if known.is_none_or(|(known_view, known_through)| {
            known_view < view_version || (known_view == view_version && known_through < through)
        }) {
            *known = Some((view_version, through));
        }
    }

    /// Records `manifest` as the one to load next; returns true when no reload
    /// task is waiting to pick it up (the caller starts one).
    pub(crate) fn want(&self, manifest: Manifest) -> bool {
        let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
        if wanted
            .as_ref()
            .is_some_and(|pending| pending.version >= manifest.version)
        {
            return false;
        }
        let task_pending = wanted.is_some();
        *wanted = Some(manifest);
        !task_pending
    }

    /// Returns the current view, once the shard is loaded.
    pub(crate) fn view(&self) -> Option<Arc<ShardView>> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Returns the manifest version of the current view.
    pub(crate) fn version(&self) -> Option<u64> {
        self.view().map(|view| view.manifest().version)
    }
}

/// What a reload must reach.
pub(crate) enum ReloadTarget {
    /// The newest manifest the watch announced (taken from `ServedShard::wanted`).
    Announced,
    /// At least this version, read from meta (linearizable for strong reads).
    AtLeast { version: u64, linearizable: bool },
    /// This manifest, just read from meta (linearizable) for a strong read.
    Fetched(Manifest),
}

/// Logs a damaged object met on the read path (the shard view counts it).
pub(crate) fn note_read_error(shard: &ShardRef, error: &SearcherError) {
    if error.error_code() == ErrorCode::DataLoss {
        tracing::error!(%shard, %error, "damaged object in the shard: no answer served from it");
    }
}

/// Brings `served`'s view to `target`, incrementally from the current view.
pub(crate) async fn reload(
    state: &NodeState,
    shard: &ShardRef,
    served: &ServedShard,
    target: ReloadTarget,
    trigger: &'static str,
) -> Result<Arc<ShardView>, Status> {
    let prepared = match target {
        ReloadTarget::Announced => prepare_same_rows(state, shard, served).await,
        _ => None,
    };
    let _single_flight = served.reload.lock().await;
    if matches!(target, ReloadTarget::Announced) {
        // This reload serves what was prepared; polls reload as before again.
        served.preparing.store(0, Ordering::Release);
    }
    let current = served.view();
    let current_version = current.as_ref().map(|view| view.manifest().version);
    let manifest = match target {
        ReloadTarget::Announced => {
            let announced = served
                .wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            match (announced, &current) {
                (Some(manifest), _)
                    if current_version.is_none_or(|version| manifest.version > version) =>
                {
                    manifest
                }
                (_, Some(view)) => return Ok(view.clone()),
                (_, None) => {
                    return Err(Status::unavailable(format!(
                        "shard {shard} is not loaded yet"
                    )));
                }
            }
        }
        ReloadTarget::AtLeast {
            version,
            linearizable,
        } => {
            if let Some(view) = &current
                && view.manifest().version >= version
            {
                return Ok(view.clone());
            }
            // A background poll (no query waits on it) for a version a view is
            // being prepared for: the announced reload after it serves that.
            if let Some(view) = &current
                && !linearizable
                && served.preparing.load(Ordering::Acquire) >= version
            {
                return Ok(view.clone());
            }
            let reference = pb::ShardRef {
                collection_id: shard
                    .collection_id
                    .parse()
                    .map_err(|_| Status::internal("collection id is not a number"))?,
                shard: shard.shard,
            };
            let manifest = state
                .meta
                .get_manifest(reference, linearizable)
                .await
                .map_err(|error| {
                    Status::unavailable(format!("manifest of shard {shard}: {error}"))
                })?;
            manifest_from_proto(&manifest)
        }
        ReloadTarget::Fetched(manifest) => {
            if let Some(view) = &current
                && view.manifest().version >= manifest.version
            {
                return Ok(view.clone());
            }
            manifest
        }
    };
    let started = Instant::now();
    let first_load = current.is_none();
    let context = state.context.clone();
    let spec = served.spec.clone();
    let previous = current.clone();
    // A view prepared (and warmed) from the view still served is the base: its
    // segments are open already.
    let prepared = prepared.filter(|prepared| current_version == Some(prepared.base_version));
    let from_prepared = prepared.is_some();
    let base = prepared
        .map(|prepared| prepared.view)
        .or_else(|| current.clone());
    let shard_name = shard.to_string();
    let built =
        tokio::task::spawn_blocking(move || -> Result<(ShardView, LoadStats), SearcherError> {
            let (view, stats) = match &base {
                Some(base) => ShardView::reload(base, &context, &spec, manifest)?,
                None => {
                    let view = ShardView::load(&context, &spec, manifest)?;
                    let stats = LoadStats {
                        segments_opened: view.manifest().segments.len() as u64,
                        ..LoadStats::default()
                    };
                    (view, stats)
                }
            };
            let warming = Instant::now();
            let bytes = warm_new_segments(&context, &view, current.as_deref());
            record_warm_up(&shard_name, "codes", bytes, warming.elapsed());
            Ok((view, stats))
        })
        .await
        .map_err(|error| Status::internal(format!("shard load task: {error}")))?;
    let (view, stats) = built.map_err(|error| {
        note_read_error(shard, &error);
        status_of(&error)
    })?;
    let view = Arc::new(view);
    *served.view.write().unwrap_or_else(|p| p.into_inner()) = Some(view.clone());
    METRICS.manifest_reloads.with_label_values(&[trigger]).inc();
    // The new segments' rows follow their codes, in the background: the view
    // serves already (a prepared view's are in the cache already, where they fit).
    if stats.segments_opened > 0 || from_prepared {
        let context = state.context.clone();
        let warmed_view = view.clone();
        let shard_name = shard.to_string();
        let served_view = served.view.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let still_served = |key: &str| {
                served_view
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|current| {
                        current
                            .manifest()
                            .segments
                            .iter()
                            .any(|entry| entry.key == key)
                    })
            };
            let bytes = warm_new_rows(&context, &warmed_view, previous.as_deref(), &still_served);
            record_warm_up(&shard_name, "rows", bytes, started.elapsed());
        });
    }
    tracing::debug!(
        %shard,
        manifest_version = view.manifest().version,
        segments = view.manifest().segments.len(),
        segments_opened = stats.segments_opened,
        segments_reused = stats.segments_reused,
        wal_batches_applied = stats.wal_batches_applied,
        elapsed_ms = started.elapsed().as_millis() as u64,
        first_load,
        trigger,
        "shard view loaded"
    );
    if first_load {
        tracing::info!(%shard, manifest_version = view.manifest().version, segments = view.manifest().segments.len(), elapsed_ms = started.elapsed().as_millis() as u64, "shard loaded");
    }
    Ok(view)
}

/// A view built ahead of its reload from the view served at `base_version`.
struct Prepared {
    base_version: u64,
    view: Arc<ShardView>,
}

/// Builds the view of an announced manifest that adds no rows — a flush or a
/// merge: rows only move between the WAL tail and segments — and pulls its new
/// segments into the cache, codes and then rows where they fit the row tier
/// ([`warm_new_rows`]), before its reload takes the shard's reload lock; the
/// reload then serves this view (or builds on it). Without this the view served
/// at once and its rows were warmed behind it, so the first queries after a
/// merge under load read rows from the store one by one (cluster, right after a
/// load, c = 64: p99 191 ms against a p50 of 20 while a merge landed). No strong
/// read waits for such a manifest (the served view has its rows,
/// [`ServedShard::view_with_rows_of`]), and one that needs new rows does not
/// wait for this warm-up: its reload takes the lock, which this does not hold.
/// The rows' warm-up stops as soon as a manifest with new rows is announced, so
/// eventual reads do not wait long for them either. Only for segments read through the cache: a mapped local file has no row
/// tier (its rows are held in memory by the reload, [`warm_new_segments`]).
async fn prepare_same_rows(
    state: &NodeState,
    shard: &ShardRef,
    served: &ServedShard,
) -> Option<Prepared> {
    let current = served.view()?;
    let manifest = served
        .wanted
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .filter(|manifest| {
            manifest.version > current.manifest().version
                && manifest.last_committed == current.manifest().last_committed
        })?
        .clone();
    let cache = state.context.cache();
    if cache.maps_local_files() || cache.is_read_through() {
        return None;
    }
    let context = state.context.clone();
    let spec = served.spec.clone();
    let served_view = served.view.clone();
    let wanted = served.wanted.clone();
    let shard_name = shard.to_string();
    // Cleared by the reload that follows, once it holds the lock.
    served.preparing.store(manifest.version, Ordering::Release);
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let (view, stats) = match ShardView::reload(&current, &context, &spec, manifest) {
            Ok(built) => built,
            Err(error) => {
                // The reload that follows builds the view again and reports it.
                tracing::debug!(shard = %shard_name, %error, "view not prepared");
                return None;
            }
        };
        if stats.segments_opened > 0 {
            let bytes = warm_new_segments(&context, &view, Some(&current));
            record_warm_up(&shard_name, "codes", bytes, started.elapsed());
            let rows_started = Instant::now();
            let version = view.manifest().version;
            let rows = view.manifest().last_committed;
            // Stops once a manifest with new rows waits (eventual reads would
            // see them only after this), and on a segment a newer served view
            // no longer has; the reload's background warm-up does the rest.
            let still_wanted = |key: &str| {
                let new_rows_wait = wanted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|waiting| waiting.last_committed != rows);
                !new_rows_wait
                    && served_view
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_ref()
                        .is_none_or(|served| {
                            served.manifest().version <= version
                                || served
                                    .manifest()
                                    .segments
                                    .iter()
                                    .any(|entry| entry.key == key)
                        })
            };
            let bytes = warm_new_rows(&context, &view, Some(&current), &still_wanted);
            record_warm_up(&shard_name, "rows", bytes, rows_started.elapsed());
        }
        Some(Prepared {
            base_version: current.manifest().version,
            view: Arc::new(view),
        })
    })
    .await
    .ok()
    .flatten()
}
