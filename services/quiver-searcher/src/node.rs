//! The searcher role: registers with the metadata service, serves the shards
//! meta assigns to it (warming each before reporting it ready), keeps their
//! manifests current, and answers the data plane's search, get and stats calls.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use quiver_blobcache::CachedObject;
use quiver_index::{Filter, SearchScratch, SectionKind, Segment, SegmentSpec};
use quiver_meta::{MetaClient, NodeIdentity, keep_registered};
use quiver_proto::convert::{manifest_from_proto, point_id, segment_spec, wire_point_id};
use quiver_proto::data::searcher_server::{Searcher, SearcherServer};
use quiver_proto::data::{self};
use quiver_proto::{ErrorCode, meta as pb};
use quiver_storage::manifest::ShardRef;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

use crate::error::{SearcherError, SearcherErrorKind};
use crate::metrics::METRICS;
use crate::shard::{ReadContext, SearchRequest, ShardView};

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
    /// How often the node looks for new assignments and manifests.
    pub routing_interval: Duration,
}

impl SearcherNodeConfig {
    /// Returns the defaults for `node_id` reachable at `advertise_address`.
    pub fn new(node_id: impl Into<String>, advertise_address: impl Into<String>) -> Self {
        SearcherNodeConfig {
            node_id: node_id.into(),
            advertise_address: advertise_address.into(),
            heartbeat_interval: Duration::from_secs(1),
            routing_interval: Duration::from_millis(250),
        }
    }
}

struct ServedShard {
    spec: SegmentSpec,
    view: RwLock<Option<Arc<ShardView>>>,
    /// One manifest reload at a time per shard.
    reload: tokio::sync::Mutex<()>,
}

impl ServedShard {
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
    /// Set once a pass over the routing table found every assigned shard loaded.
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
            tokio::spawn(assignment_loop(state.clone(), shutdown_receiver)),
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

/// Follows the routing table: serves newly assigned shards, drops unassigned
/// ones, and reloads a shard when meta has a newer manifest.
async fn assignment_loop(state: Arc<NodeState>, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(state.config.routing_interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !state.registered.load(Ordering::Acquire) {
            continue;
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
        let mut assigned: HashMap<ShardRef, (u64, &pb::Collection)> = HashMap::new();
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
                    (shard.manifest_version, collection),
                );
            }
        }
        {
            let mut shards = state.shards.write().unwrap_or_else(|p| p.into_inner());
            shards.retain(|shard, _| assigned.contains_key(shard));
            for (shard, (_, collection)) in &assigned {
                if shards.contains_key(shard) {
                    continue;
                }
                match segment_spec(collection) {
                    Ok(spec) => {
                        shards.insert(
                            shard.clone(),
                            Arc::new(ServedShard {
                                spec,
                                view: RwLock::new(None),
                                reload: tokio::sync::Mutex::new(()),
                            }),
                        );
                    }
                    Err(error) => tracing::error!(%shard, %error, "collection spec unusable"),
                }
            }
        }
        let all_loaded = assigned.keys().all(|shard| {
            let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
            shards
                .get(shard)
                .is_some_and(|served| served.view().is_some())
        });
        if all_loaded {
            state.synced.store(true, Ordering::Release);
        }
        for (shard, (manifest_version, _)) in assigned {
            let served = {
                let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
                shards.get(&shard).cloned()
            };
            let Some(served) = served else { continue };
            if served
                .version()
                .is_some_and(|version| version >= manifest_version)
            {
                continue;
            }
            let state = state.clone();
            // Reload off the loop so one slow shard does not hold the others.
            tokio::spawn(async move {
                if let Err(error) = reload(&state, &shard, &served, manifest_version, false).await {
                    tracing::warn!(%shard, %error, "shard reload failed");
                }
            });
        }
    }
}

/// Makes `served`'s view at least `min_version` new.
async fn reload(
    state: &NodeState,
    shard: &ShardRef,
    served: &ServedShard,
    min_version: u64,
    linearizable: bool,
) -> Result<Arc<ShardView>, Status> {
    let _single_flight = served.reload.lock().await;
    if let Some(view) = served.view()
        && view.manifest().version >= min_version
    {
        return Ok(view);
    }
    let first_load = served.view().is_none();
    let started = Instant::now();
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
        .map_err(|error| Status::unavailable(format!("manifest of shard {shard}: {error}")))?;
    let manifest = manifest_from_proto(&manifest);
    let context = state.context.clone();
    let spec = served.spec.clone();
    let view = tokio::task::spawn_blocking(move || -> Result<ShardView, SearcherError> {
        let view = ShardView::load(&context, &spec, manifest)?;
        if first_load {
            for segment in view.segments() {
                warm_codes(&context, segment);
            }
        }
        Ok(view)
    })
    .await
    .map_err(|error| Status::internal(format!("shard load task: {error}")))?
    .map_err(|error| status_of(&error))?;
    let view = Arc::new(view);
    *served.view.write().unwrap_or_else(|p| p.into_inner()) = Some(view.clone());
    tracing::info!(
        %shard,
        manifest_version = view.manifest().version,
        segments = view.manifest().segments.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        first_load,
        "shard view loaded"
    );
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
        let spec = segment_spec(collection).map_err(Status::internal)?;
        let mut shards = self.state.shards.write().unwrap_or_else(|p| p.into_inner());
        Ok(shards
            .entry(reference.clone())
            .or_insert_with(|| {
                Arc::new(ServedShard {
                    spec,
                    view: RwLock::new(None),
                    reload: tokio::sync::Mutex::new(()),
                })
            })
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
                reload(&self.state, &reference, &served, min_version, true).await
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
        .map_err(|error| status_of(&error))?;
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
            .map_err(|error| status_of(&error))?;
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
