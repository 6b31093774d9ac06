//! The searcher role: registers with the metadata service, serves the shards
//! meta assigns to it (warming each before reporting it ready), keeps their
//! manifests current, and answers the data plane's search, get and stats calls.
//!
//! Assignments and manifests arrive on meta's watch stream: each event carries
//! the changed shards with their manifests, and a newer manifest is applied to
//! the shard's view incrementally (only new segments are opened). A broken stream
//! is reopened with backoff; a slow safety poll of the routing table catches
//! anything a stream might have missed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use quiver_blobcache::CachedObject;
use quiver_index::{Filter, SearchScratch, SectionKind, Segment, SegmentSpec};
use quiver_meta_client::{MetaClient, NodeIdentity, keep_registered};
use quiver_proto::convert::{collection_from_proto, manifest_from_proto, point_id, wire_point_id};
use quiver_proto::data::searcher_server::{Searcher, SearcherServer};
use quiver_proto::data::{self};
use quiver_proto::{ErrorCode, meta as pb};
use quiver_storage::manifest::{Manifest, ShardRef};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

use crate::error::{SearcherError, SearcherErrorKind};
use crate::metrics::METRICS;
use crate::shard::{LoadStats, ReadContext, SearchRequest, ShardView};

const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Settings of a searcher node.
#[derive(Clone, Debug)]
pub struct SearcherNodeConfig {
    /// Unique node id (the pod name in Kubernetes).
    pub node_id: String,
    /// Address other roles use to reach this node's gRPC port.
    pub advertise_address: String,
    /// How often the node tells meta it is alive (and which shards are ready).
    pub heartbeat_interval: Duration,
    /// How often the node also reads the whole routing table (a safety net: the
    /// watch stream normally delivers every change at once).
    pub safety_poll_interval: Duration,
    /// First pause before reopening a broken watch stream (doubles per failure).
    pub watch_initial_backoff: Duration,
    /// Longest pause before reopening a broken watch stream.
    pub watch_max_backoff: Duration,
}

impl SearcherNodeConfig {
    /// Returns the defaults for `node_id` reachable at `advertise_address`.
    pub fn new(node_id: impl Into<String>, advertise_address: impl Into<String>) -> Self {
        SearcherNodeConfig {
            node_id: node_id.into(),
            advertise_address: advertise_address.into(),
            heartbeat_interval: Duration::from_secs(1),
            safety_poll_interval: Duration::from_secs(15),
            watch_initial_backoff: Duration::from_millis(100),
            watch_max_backoff: Duration::from_secs(5),
        }
    }
}

struct ServedShard {
    spec: SegmentSpec,
    view: RwLock<Option<Arc<ShardView>>>,
    /// One manifest reload at a time per shard.
    reload: tokio::sync::Mutex<()>,
    /// The newest manifest the watch announced and no reload has taken yet.
    wanted: Mutex<Option<Manifest>>,
}

impl ServedShard {
    fn new(spec: SegmentSpec) -> Self {
        ServedShard {
            spec,
            view: RwLock::new(None),
            reload: tokio::sync::Mutex::new(()),
            wanted: Mutex::new(None),
        }
    }

    /// Records `manifest` as the one to load next; returns true when no reload
    /// task is waiting to pick it up (the caller starts one).
    fn want(&self, manifest: Manifest) -> bool {
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

    fn view(&self) -> Option<Arc<ShardView>> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn version(&self) -> Option<u64> {
        self.view().map(|view| view.manifest().version)
    }
}

struct NodeState {
    config: SearcherNodeConfig,
    meta: MetaClient,
    context: Arc<ReadContext>,
    shards: RwLock<HashMap<ShardRef, Arc<ServedShard>>>,
    registered: Arc<AtomicBool>,
    /// Set once the assignments were read (from the watch or a poll).
    synced: AtomicBool,
}

/// A running searcher node.
pub struct SearcherNode {
    state: Arc<NodeState>,
    local_address: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl SearcherNode {
    /// Starts serving on `listener`, reading through `context`, and joins the
    /// cluster through `meta`.
    pub async fn start(
        config: SearcherNodeConfig,
        listener: TcpListener,
        meta: MetaClient,
        context: Arc<ReadContext>,
    ) -> Result<SearcherNode, SearcherError> {
        let local_address = listener
            .local_addr()
            .map_err(|error| SearcherError::Internal(format!("listener address: {error}")))?;
        let state = Arc::new(NodeState {
            config,
            meta,
            context,
            shards: RwLock::new(HashMap::new()),
            registered: Arc::new(AtomicBool::new(false)),
            synced: AtomicBool::new(false),
        });
        let (shutdown, shutdown_receiver) = watch::channel(false);
        let service = SearcherServer::new(SearcherGrpc {
            state: state.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut server_shutdown = shutdown_receiver.clone();
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .trace_fn(quiver_proto::request_span)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = server_shutdown.wait_for(|stopping| *stopping).await;
                })
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "searcher grpc server failed");
            }
        });
        let tasks = vec![
            server,
            tokio::spawn(keep_registered(
                state.meta.clone(),
                NodeIdentity {
                    node_id: state.config.node_id.clone(),
                    role: pb::NodeRole::Searcher,
                    address: state.config.advertise_address.clone(),
                },
                state.config.heartbeat_interval,
                state.registered.clone(),
                {
                    let state = state.clone();
                    move || {
                        let ready = ready_shards(&state);
                        METRICS.shards_ready.set(ready.len() as i64);
                        ready
                    }
                },
                shutdown_receiver.clone(),
            )),
            tokio::spawn(watch_loop(state.clone(), shutdown_receiver.clone())),
            tokio::spawn(safety_poll_loop(state.clone(), shutdown_receiver)),
        ];
        tracing::info!(node_id = %state.config.node_id, address = %local_address, "searcher started");
        Ok(SearcherNode {
            state,
            local_address,
            shutdown,
            tasks,
        })
    }

    /// Returns the bound gRPC address.
    pub fn local_address(&self) -> SocketAddr {
        self.local_address
    }

    /// Tells whether every assigned shard is warmed and loaded.
    pub fn is_ready(&self) -> bool {
        state_ready(&self.state)
    }

    /// Returns a readiness check that outlives borrows of the node (`/readyz`).
    pub fn ready_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let state = self.state.clone();
        move || state_ready(&state)
    }

    /// Stops serving.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        tracing::info!(node_id = %self.state.config.node_id, "searcher stopped");
    }
}

fn state_ready(state: &NodeState) -> bool {
    if !state.registered.load(Ordering::Acquire) || !state.synced.load(Ordering::Acquire) {
        return false;
    }
    let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
    shards.values().all(|shard| shard.view().is_some())
}

fn ready_shards(state: &NodeState) -> Vec<pb::ShardRef> {
    let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
    shards
        .iter()
        .filter(|(_, served)| served.view().is_some())
        .filter_map(|(shard, _)| {
            Some(pb::ShardRef {
                collection_id: shard.collection_id.parse().ok()?,
                shard: shard.shard,
            })
        })
        .collect()
}

/// One shard this node should serve, as a pass over the routing learned it.
struct Assignment {
    collection: pb::Collection,
    manifest_version: u64,
    /// The manifest itself, when the watch delivered it.
    manifest: Option<Manifest>,
}

/// What a reload must reach.
enum ReloadTarget {
    /// The newest manifest the watch announced (taken from `ServedShard::wanted`).
    Announced,
    /// At least this version, read from meta (linearizable for strong reads).
    AtLeast { version: u64, linearizable: bool },
}

/// Serves the shards of `assigned`, drops the others, and starts reloads of
/// shards whose view is older than what was announced.
fn apply_assignments(
    state: &Arc<NodeState>,
    assigned: HashMap<ShardRef, Assignment>,
    trigger: &'static str,
) {
    {
        let mut shards = state.shards.write().unwrap_or_else(|p| p.into_inner());
        shards.retain(|shard, _| assigned.contains_key(shard));
        for (shard, assignment) in &assigned {
            if shards.contains_key(shard) {
                continue;
            }
            match collection_from_proto(&assignment.collection)
                .map(|collection| SegmentSpec::for_collection(&collection))
            {
                Ok(spec) => {
                    shards.insert(shard.clone(), Arc::new(ServedShard::new(spec)));
                }
                Err(error) => tracing::error!(%shard, %error, "collection spec unusable"),
            }
        }
    }
    state.synced.store(true, Ordering::Release);
    for (shard, assignment) in assigned {
        let served = {
            let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
            shards.get(&shard).cloned()
        };
        let Some(served) = served else { continue };
        if served
            .version()
            .is_some_and(|version| version >= assignment.manifest_version)
        {
            continue;
        }
        let target = match assignment.manifest {
            Some(manifest) => {
                if !served.want(manifest) {
                    continue;
                }
                ReloadTarget::Announced
            }
            None => ReloadTarget::AtLeast {
                version: assignment.manifest_version,
                linearizable: false,
            },
        };
        let state = state.clone();
        // Reload off the loop so one slow shard does not hold the others.
        tokio::spawn(async move {
            if let Err(error) = reload(&state, &shard, &served, target, trigger).await {
                tracing::warn!(%shard, %error, "shard reload failed");
            }
        });
    }
}

/// The part of the catalog the watch stream has told this node about.
#[derive(Default)]
struct WatchedCatalog {
    collections: HashMap<u64, pb::Collection>,
    shards: HashMap<(u64, u32), pb::ShardUpdate>,
}

impl WatchedCatalog {
    fn apply(&mut self, event: pb::WatchEvent) {
        // An event lists every collection whenever any was created or dropped.
        if !event.collections.is_empty() {
            self.collections = event
                .collections
                .into_iter()
                .map(|collection| (collection.collection_id, collection))
                .collect();
        }
        for dropped in event.dropped_collection_ids {
            self.collections.remove(&dropped);
            self.shards
                .retain(|(collection_id, _), _| *collection_id != dropped);
        }
        for update in event.shards {
            let Some(reference) = update.routing.as_ref().and_then(|routing| routing.shard) else {
                continue;
            };
            self.shards
                .insert((reference.collection_id, reference.shard), update);
        }
    }

    fn assigned_to(&self, node_id: &str) -> HashMap<ShardRef, Assignment> {
        let mut assigned = HashMap::new();
        for ((collection_id, shard), update) in &self.shards {
            let Some(routing) = &update.routing else {
                continue;
            };
            if !routing
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == node_id)
            {
                continue;
            }
            let Some(collection) = self.collections.get(collection_id) else {
                continue;
            };
            assigned.insert(
                ShardRef {
                    collection_id: collection_id.to_string(),
                    shard: *shard,
                },
                Assignment {
                    collection: collection.clone(),
                    manifest_version: routing.manifest_version,
                    manifest: update.manifest.as_ref().map(manifest_from_proto),
                },
            );
        }
        assigned
    }
}

/// Follows meta's watch stream: every event updates the assignments and
/// announces new manifests. A broken stream is reopened (from scratch, so
/// nothing is missed) after a backoff that doubles up to `watch_max_backoff`.
async fn watch_loop(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = state.config.watch_initial_backoff;
    loop {
        while !state.registered.load(Ordering::Acquire) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = shutdown.changed() => return,
            }
        }
        let request = pb::WatchRequest {
            collection_id: 0,
            from_version: 0,
        };
        let opened = tokio::select! {
            opened = state.meta.watch(request) => opened,
            _ = shutdown.changed() => return,
        };
        match opened {
            Ok(mut stream) => {
                let mut catalog = WatchedCatalog::default();
                loop {
                    let message = tokio::select! {
                        message = stream.message() => message,
                        _ = shutdown.changed() => return,
                    };
                    match message {
                        Ok(Some(event)) => {
                            backoff = state.config.watch_initial_backoff;
                            catalog.apply(event);
                            let assigned = catalog.assigned_to(&state.config.node_id);
                            apply_assignments(&state, assigned, "watch");
                        }
                        Ok(None) => {
                            tracing::warn!("watch stream from meta ended; reopening");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(%status, "watch stream from meta failed; reopening");
                            break;
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot open the watch stream from meta"),
        }
        METRICS.watch_reconnects.inc();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(state.config.watch_max_backoff);
    }
}

/// Reads the whole routing table now and then, in case the watch stream missed
/// something (the first pass runs at once, so a node starts even without it).
async fn safety_poll_loop(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(state.config.safety_poll_interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        while !state.registered.load(Ordering::Acquire) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = shutdown.changed() => return,
            }
        }
        let routing = match state.meta.get_routing("", false).await {
            Ok(routing) => routing,
            Err(error) => {
                tracing::warn!(%error, "routing unavailable");
                continue;
            }
        };
        let collections: HashMap<u64, &pb::Collection> = routing
            .collections
            .iter()
            .map(|collection| (collection.collection_id, collection))
            .collect();
        let mut assigned = HashMap::new();
        for shard in &routing.shards {
            let Some(reference) = &shard.shard else {
                continue;
            };
            let mine = shard
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == state.config.node_id);
            if !mine {
                continue;
            }
            if let Some(collection) = collections.get(&reference.collection_id) {
                assigned.insert(
                    ShardRef {
                        collection_id: reference.collection_id.to_string(),
                        shard: reference.shard,
                    },
                    Assignment {
                        collection: (*collection).clone(),
                        manifest_version: shard.manifest_version,
                        manifest: None,
                    },
                );
            }
        }
        apply_assignments(&state, assigned, "poll");
    }
}

/// Logs a damaged object met on the read path (the shard view counts it).
fn note_read_error(shard: &ShardRef, error: &SearcherError) {
    if error.kind() == SearcherErrorKind::DataLoss {
        tracing::error!(%shard, %error, "damaged object in the shard: no answer served from it");
    }
}

/// Brings `served`'s view to `target`, incrementally from the current view.
async fn reload(
    state: &NodeState,
    shard: &ShardRef,
    served: &ServedShard,
    target: ReloadTarget,
    trigger: &'static str,
) -> Result<Arc<ShardView>, Status> {
    let _single_flight = served.reload.lock().await;
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
    };
    let started = Instant::now();
    let first_load = current.is_none();
    let context = state.context.clone();
    let spec = served.spec.clone();
    let built =
        tokio::task::spawn_blocking(move || -> Result<(ShardView, LoadStats), SearcherError> {
            let (view, stats) = match &current {
                Some(previous) => ShardView::reload(previous, &context, &spec, manifest)?,
                None => {
                    let view = ShardView::load(&context, &spec, manifest)?;
                    let stats = LoadStats {
                        segments_opened: view.manifest().segments.len() as u64,
                        ..LoadStats::default()
                    };
                    (view, stats)
                }
            };
            // Warm what is new: every segment on a first load, new segments after.
            let known: std::collections::HashSet<&str> = current
                .as_ref()
                .map(|previous| {
                    previous
                        .manifest()
                        .segments
                        .iter()
                        .map(|entry| entry.key.as_str())
                        .collect()
                })
                .unwrap_or_default();
            for (entry, segment) in view.manifest().segments.iter().zip(view.segments()) {
                if !known.contains(entry.key.as_str()) && !context.cache().is_read_through() {
                    warm_codes(&context, segment);
                }
            }
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

/// Pulls a segment's codes into the cache, so the first queries after a shard is
/// assigned do not wait on object storage for them.
fn warm_codes(context: &ReadContext, segment: &Segment<CachedObject>) {
    let region_bytes = context.cache().region_bytes();
    for section in segment.sections() {
        if section.kind != SectionKind::Codes {
            continue;
        }
        let end = section.offset + section.length;
        let mut offset = section.offset;
        while offset < end {
            if let Err(error) = segment.source().read(offset, 1) {
                tracing::warn!(segment = segment.name(), %error, "warm-up read failed");
                return;
            }
            offset = (offset / region_bytes + 1) * region_bytes;
        }
    }
}

/// Maps a read-path error to a gRPC status with the shared error codes.
pub fn status_of(error: &SearcherError) -> Status {
    let code = match error.kind() {
        SearcherErrorKind::InvalidArgument => ErrorCode::InvalidArgument,
        SearcherErrorKind::NotFound => ErrorCode::NotFound,
        SearcherErrorKind::Unavailable => ErrorCode::Unavailable,
        SearcherErrorKind::DataLoss | SearcherErrorKind::Internal => ErrorCode::Internal,
    };
    Status::new(code.grpc_code(), error.to_string())
}

fn shard_ref(shard: &pb::ShardRef) -> ShardRef {
    ShardRef {
        collection_id: shard.collection_id.to_string(),
        shard: shard.shard,
    }
}

thread_local! {
    static SCRATCH: RefCell<SearchScratch> = RefCell::new(SearchScratch::new());
}

struct SearcherGrpc {
    state: Arc<NodeState>,
}

impl SearcherGrpc {
    /// Serves a shard meta assigned to this node that the assignment loop has
    /// not picked up yet (a request raced it, e.g. just after a restart).
    async fn adopt(&self, reference: &ShardRef) -> Result<Arc<ServedShard>, Status> {
        let routing = self
            .state
            .meta
            .get_routing("", false)
            .await
            .map_err(|error| Status::unavailable(format!("routing unavailable: {error}")))?;
        let assigned = routing.shards.iter().any(|shard| {
            shard.shard.is_some_and(|candidate| {
                candidate.collection_id.to_string() == reference.collection_id
                    && candidate.shard == reference.shard
            }) && shard
                .searchers
                .iter()
                .any(|searcher| searcher.node_id == self.state.config.node_id)
        });
        let collection = routing
            .collections
            .iter()
            .find(|collection| collection.collection_id.to_string() == reference.collection_id);
        let (true, Some(collection)) = (assigned, collection) else {
            return Err(Status::unavailable(format!(
                "shard {reference} is not served by searcher `{}`",
                self.state.config.node_id
            )));
        };
        let spec = collection_from_proto(collection)
            .map(|collection| SegmentSpec::for_collection(&collection))
            .map_err(Status::internal)?;
        let mut shards = self.state.shards.write().unwrap_or_else(|p| p.into_inner());
        Ok(shards
            .entry(reference.clone())
            .or_insert_with(|| Arc::new(ServedShard::new(spec)))
            .clone())
    }

    /// Returns the shard's view, at least `min_version` new.
    async fn view(
        &self,
        shard: Option<&pb::ShardRef>,
        min_version: u64,
    ) -> Result<Arc<ShardView>, Status> {
        let shard = shard.ok_or_else(|| Status::invalid_argument("`shard` is required"))?;
        let reference = ShardRef {
            collection_id: shard.collection_id.to_string(),
            shard: shard.shard,
        };
        let served = {
            let shards = self.state.shards.read().unwrap_or_else(|p| p.into_inner());
            shards.get(&reference).cloned()
        };
        let served = match served {
            Some(served) => served,
            None => self.adopt(&reference).await?,
        };
        match served.view() {
            Some(view) if view.manifest().version >= min_version => Ok(view),
            _ => {
                METRICS.manifest_waits.inc();
                let target = ReloadTarget::AtLeast {
                    version: min_version,
                    linearizable: true,
                };
                reload(&self.state, &reference, &served, target, "query").await
            }
        }
    }
}

#[tonic::async_trait]
impl Searcher for SearcherGrpc {
    async fn search(
        &self,
        request: Request<data::SearchRequest>,
    ) -> Result<Response<data::SearchResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        let filter = if request.filter.is_empty() {
            None
        } else {
            Some(
                Filter::parse(&request.filter)
                    .map_err(|error| Status::invalid_argument(error.to_string()))?,
            )
        };
        let search = SearchRequest {
            vector: request.vector,
            k: request.k as usize,
            nprobe: (request.nprobe > 0).then_some(request.nprobe as usize),
            rescore: (request.rescore > 0).then_some(request.rescore as usize),
            filter,
            include_payload: request.include_payload,
            include_vector: request.include_vector,
        };
        let context = self.state.context.clone();
        let searched_view = view.clone();
        let (hits, cost) = tokio::task::spawn_blocking(move || {
            SCRATCH.with(|scratch| {
                searched_view.search_with_cost(&context, &search, &mut scratch.borrow_mut())
            })
        })
        .await
        .map_err(|error| Status::internal(format!("search task: {error}")))?
        .map_err(|error| {
            if let Some(shard) = &request.shard {
                note_read_error(&shard_ref(shard), &error);
            }
            status_of(&error)
        })?;
        METRICS.queries.inc();
        METRICS
            .query_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(data::SearchResponse {
            hits: hits
                .into_iter()
                .map(|hit| data::Hit {
                    id: Some(wire_point_id(&hit.id)),
                    score: hit.score,
                    payload_json: hit
                        .payload
                        .map(|payload| serde_json::to_vec(&payload).unwrap_or_default())
                        .unwrap_or_default(),
                    vector: hit.vector.unwrap_or_default(),
                })
                .collect(),
            manifest_version: view.manifest().version,
            cost: Some(data::SearchCost {
                segments: cost.segments,
                rows_scanned: cost.rows_scanned,
                rows_rescored: cost.rows_rescored,
                tail_rows_scored: cost.tail_rows_scored,
                search_ms: cost.search_ms,
                cache_regions_hit: cost.cache_regions_hit,
                cache_regions_missed: cost.cache_regions_missed,
                bytes_fetched: cost.bytes_fetched,
            }),
        }))
    }

    async fn get(
        &self,
        request: Request<data::GetRequest>,
    ) -> Result<Response<data::GetResponse>, Status> {
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        let ids = request
            .ids
            .iter()
            .map(|id| point_id(id).ok_or_else(|| Status::invalid_argument("an id is empty")))
            .collect::<Result<Vec<_>, _>>()?;
        let include_vector = request.include_vector;
        let read_view = view.clone();
        let points = tokio::task::spawn_blocking(move || read_view.get(&ids, include_vector))
            .await
            .map_err(|error| Status::internal(format!("get task: {error}")))?
            .map_err(|error| {
                if let Some(shard) = &request.shard {
                    note_read_error(&shard_ref(shard), &error);
                }
                status_of(&error)
            })?;
        Ok(Response::new(data::GetResponse {
            points: points
                .into_iter()
                .map(|point| data::Point {
                    id: Some(wire_point_id(&point.id)),
                    vector: point.vector.unwrap_or_default(),
                    payload_json: point
                        .payload
                        .map(|payload| serde_json::to_vec(&payload).unwrap_or_default())
                        .unwrap_or_default(),
                })
                .collect(),
            manifest_version: view.manifest().version,
        }))
    }

    async fn shard_stats(
        &self,
        request: Request<data::ShardStatsRequest>,
    ) -> Result<Response<data::ShardStatsResponse>, Status> {
        let request = request.into_inner();
        let view = self
            .view(request.shard.as_ref(), request.min_manifest_version)
            .await?;
        Ok(Response::new(data::ShardStatsResponse {
            live_points: view.live_points(),
            segments: view.manifest().segments.len() as u64,
            wal_tail_rows: view.wal_tail_rows(),
            segment_bytes: view.segment_bytes(),
            manifest_version: view.manifest().version,
        }))
    }
}
