//! The indexer role: registers with the metadata service, heartbeats, opens a
//! [`ShardWriter`] for every shard whose lease meta gives it (and renews those
//! leases), serves the data plane's write API, and deletes objects whose GC
//! grace period has passed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use quiver_index::{IdType, PointId};
use quiver_meta_client::{MetaClient, NodeIdentity, keep_registered};
use quiver_proto::convert::{collection_from_proto, point_id, shard_of};
use quiver_proto::data::indexer_server::{Indexer, IndexerServer};
use quiver_proto::data::{self, write_record};
use quiver_proto::tls::ClusterTls;
use quiver_proto::{ErrorCode, meta as pb};
use quiver_storage::{Storage, WalRecord};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::catalog::ShardRef;
use crate::config::IndexerConfig;
use crate::error::IndexerError;
use quiver_proto::convert::{shard_from_proto, shard_to_proto};

use crate::meta_catalog::MetaCatalog;
use crate::shard::ShardWriter;

/// Largest gRPC message accepted (a write batch).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How long a call for a shard this node does not write waits for the metadata
/// service to say why.
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of an indexer node.
#[derive(Clone, Debug)]
pub struct IndexerNodeConfig {
    /// Unique node id (the pod name in Kubernetes).
    pub node_id: String,
    /// Address other roles use to reach this node's gRPC port.
    pub advertise_address: String,
    /// How often the node tells meta it is alive.
    pub heartbeat_interval: Duration,
    /// How often the node looks for shards leased to it.
    pub routing_interval: Duration,
    /// Lease time asked for on every renewal.
    pub lease_ttl: Duration,
    /// How often objects past their GC grace period are deleted.
    pub gc_interval: Duration,
    /// Write-path knobs of every shard.
    pub indexer: IndexerConfig,
    /// Mutual TLS with the cluster CA on the gRPC port (none: plaintext).
    pub cluster_tls: Option<ClusterTls>,
}

impl IndexerNodeConfig {
    /// Returns the defaults for `node_id` reachable at `advertise_address`.
    pub fn new(node_id: impl Into<String>, advertise_address: impl Into<String>) -> Self {
        IndexerNodeConfig {
            node_id: node_id.into(),
            advertise_address: advertise_address.into(),
            heartbeat_interval: Duration::from_secs(1),
            routing_interval: Duration::from_millis(250),
            lease_ttl: Duration::from_secs(10),
            gc_interval: Duration::from_secs(10),
            indexer: IndexerConfig::default(),
            cluster_tls: None,
        }
    }
}

struct OpenShard {
    writer: Arc<ShardWriter>,
    /// What routes an id to this shard: `shard_of(id, shard_count)`, for ids of
    /// the collection's type.
    placement: Placement,
    last_renewal: Instant,
}

/// The collection facts a write's ids are checked against.
#[derive(Clone, Copy)]
struct Placement {
    shard: u32,
    shard_count: u32,
    id_type: IdType,
}

impl Placement {
    /// Refuses an id that hashes to another shard: written here, it would live
    /// in two shards once written again through the gateway.
    fn check(&self, index: usize, id: &PointId) -> Result<(), Status> {
        let of_this_type = matches!(
            (id, self.id_type),
            (PointId::U64(_), IdType::U64) | (PointId::String(_), IdType::String)
        );
        let owner = shard_of(id, self.shard_count);
        if of_this_type && owner != self.shard {
            return Err(Status::invalid_argument(format!(
                "records[{index}]: id {id} belongs to shard {owner} of the collection's {} shards, not to shard {} (hash of the id modulo the shard count)",
                self.shard_count, self.shard
            )));
        }
        Ok(())
    }
}

struct NodeState {
    config: IndexerNodeConfig,
    meta: MetaClient,
    storage: Storage,
    shards: RwLock<HashMap<ShardRef, OpenShard>>,
    registered: Arc<AtomicBool>,
}

/// A running indexer node.
pub struct IndexerNode {
    state: Arc<NodeState>,
    local_address: SocketAddr,
    /// Cancelled once, by [`IndexerNode::shutdown`]: every background loop and
    /// the gRPC server end on it.
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl IndexerNode {
    /// Starts serving on `listener` and joins the cluster through `meta`.
    pub async fn start(
        config: IndexerNodeConfig,
        listener: TcpListener,
        meta: MetaClient,
        storage: Storage,
    ) -> Result<IndexerNode, IndexerError> {
        config
            .indexer
            .validate()
            .map_err(IndexerError::InvalidArgument)?;
        crate::failpoints::arm_from_env().map_err(IndexerError::InvalidArgument)?;
        crate::metrics::register();
        let local_address = listener
            .local_addr()
            .map_err(|error| IndexerError::Internal(format!("listener address: {error}")))?;
        let state = Arc::new(NodeState {
            config,
            meta,
            storage,
            shards: RwLock::new(HashMap::new()),
            registered: Arc::new(AtomicBool::new(false)),
        });
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let service = IndexerServer::new(IndexerGrpc {
            state: state.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        // Acknowledgements are small: every connection has TCP_NODELAY.
        let incoming = quiver_proto::tls::incoming(listener, state.config.cluster_tls.as_ref())
            .map_err(|error| IndexerError::Internal(format!("grpc listener: {error}")))?;
        let server_shutdown = shutdown.clone().cancelled_owned();
        tasks.push(tokio::spawn(async move {
            let result = quiver_proto::http2::grpc_server()
                .trace_fn(quiver_proto::request_span)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, server_shutdown)
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "indexer grpc server failed");
            }
        }));
        tasks.push(tokio::spawn(keep_registered(
            state.meta.clone(),
            NodeIdentity {
                node_id: state.config.node_id.clone(),
                role: pb::NodeRole::Indexer,
                address: state.config.advertise_address.clone(),
            },
            state.config.heartbeat_interval,
            state.registered.clone(),
            Vec::new,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(lease_loop(state.clone(), shutdown.clone())));
        tasks.push(tokio::spawn(gc_loop(state.clone(), shutdown.clone())));
        tasks.push(tokio::spawn(orphan_loop(state.clone(), shutdown.clone())));
        tracing::info!(node_id = %state.config.node_id, address = %local_address, cluster_tls = state.config.cluster_tls.is_some(), "indexer started");
        Ok(IndexerNode {
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

    /// Tells whether the node registered with meta.
    pub fn is_ready(&self) -> bool {
        self.state.registered.load(Ordering::Acquire)
    }

    /// Returns a readiness check that outlives borrows of the node (`/readyz`).
    pub fn ready_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let state = self.state.clone();
        move || state.registered.load(Ordering::Acquire)
    }

    /// Returns the shards this node writes now.
    pub fn shards(&self) -> Vec<(ShardRef, u64)> {
        let shards = self.state.shards.read().unwrap_or_else(|p| p.into_inner());
        shards
            .iter()
            .map(|(shard, open)| (shard.clone(), open.writer.epoch()))
            .collect()
    }

    /// Stops serving; writes in flight fail and nothing acknowledged is lost
    /// (it is all in the WAL tail or in segments).
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let writers: Vec<Arc<ShardWriter>> = {
            let mut shards = self.state.shards.write().unwrap_or_else(|p| p.into_inner());
            shards.drain().map(|(_, open)| open.writer).collect()
        };
        for writer in writers {
            if let Ok(writer) = Arc::try_unwrap(writer) {
                writer.close().await;
            }
        }
        tracing::info!(node_id = %self.state.config.node_id, "indexer stopped");
    }
}

impl Drop for IndexerNode {
    /// A node dropped without [`IndexerNode::shutdown`] stops its loops too.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Opens writers for shards leased to this node, renews their leases, and closes
/// writers whose lease moved elsewhere.
async fn lease_loop(state: Arc<NodeState>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(state.config.routing_interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
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
        let mut mine: HashMap<ShardRef, (u64, &pb::Collection)> = HashMap::new();
        for shard in &routing.shards {
            let (Some(reference), Some(lease)) = (&shard.shard, &shard.lease) else {
                continue;
            };
            if lease.holder != state.config.node_id {
                continue;
            }
            if let Some(collection) = collections.get(&reference.collection_id) {
                mine.insert(shard_from_proto(reference), (lease.epoch, collection));
            }
        }
        // Close writers of shards no longer ours (or ours at a newer epoch).
        let stale: Vec<Arc<ShardWriter>> = {
            let mut shards = state.shards.write().unwrap_or_else(|p| p.into_inner());
            let gone: Vec<ShardRef> = shards
                .iter()
                .filter(|(shard, open)| {
                    mine.get(*shard)
                        .is_none_or(|(epoch, _)| *epoch != open.writer.epoch())
                        || open.writer.stats().fenced
                })
                .map(|(shard, _)| shard.clone())
                .collect();
            gone.iter()
                .filter_map(|shard| shards.remove(shard).map(|open| open.writer))
                .collect()
        };
        for writer in stale {
            tracing::info!(shard = %writer.shard(), epoch = writer.epoch(), "closing shard writer: lease moved");
        }
        // Open writers of newly leased shards.
        for (shard, (epoch, collection)) in &mine {
            let open = state
                .shards
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(shard);
            if open {
                continue;
            }
            let spec = match collection_from_proto(collection)
                .map(|collection| quiver_index::SegmentSpec::for_collection(&collection))
            {
                Ok(spec) => spec,
                Err(error) => {
                    tracing::error!(%shard, %error, "collection spec unusable");
                    continue;
                }
            };
            let placement = Placement {
                shard: shard.shard,
                shard_count: collection
                    .spec
                    .as_ref()
                    .map_or(1, |spec| spec.shards.max(1)),
                id_type: spec.id_type,
            };
            let catalog = Arc::new(MetaCatalog::new(state.meta.clone()));
            let opening = ShardWriter::open(
                shard.clone(),
                *epoch,
                spec,
                state.config.indexer.clone(),
                state.storage.clone(),
                catalog,
            );
            match open_keeping_leases(&state, shard, *epoch, opening).await {
                Ok(writer) => {
                    tracing::info!(%shard, epoch, "shard writer opened");
                    state
                        .shards
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(
                            shard.clone(),
                            OpenShard {
                                writer: Arc::new(writer),
                                placement,
                                last_renewal: Instant::now() - state.config.lease_ttl,
                            },
                        );
                }
                Err(error) => tracing::warn!(%shard, epoch, %error, "cannot open shard writer yet"),
            }
        }
        renew_leases(&state).await;
    }
}

/// Runs `opening` (a shard writer being opened: reading its primary keys can take
/// tens of seconds for millions of rows) while renewing the lease it opens under,
/// and the leases of the writers already open, every third of the lease's time to
/// live. Without that, an open longer than the lease lost it before it finished:
/// meta granted the shard again at a newer epoch, the finished writer was refused
/// as stale, and the next open lost it again — a shard that never took writes.
/// Gives up (an error) when meta says the lease is no longer this node's.
async fn open_keeping_leases(
    state: &NodeState,
    shard: &ShardRef,
    epoch: u64,
    opening: impl std::future::Future<Output = crate::error::IndexerResult<ShardWriter>>,
) -> crate::error::IndexerResult<ShardWriter> {
    tokio::pin!(opening);
    let Ok(reference) = shard_to_proto(shard) else {
        return opening.await;
    };
    let period = state.config.lease_ttl / 3;
    // The first tick is at once: the lease may have been granted a while ago.
    let mut renewal = tokio::time::interval(period);
    renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            opened = &mut opening => return opened,
            _ = renewal.tick() => {
                match renew_lease(state, reference, epoch).await {
                    Ok(()) => {}
                    Err(error) if error.kind() == ErrorCode::FailedPrecondition => {
                        tracing::warn!(%shard, epoch, %error, "lease lost while the shard writer was opening");
                        return Err(IndexerError::Fenced { shard: shard.clone(), epoch });
                    }
                    Err(error) => tracing::warn!(%shard, epoch, %error, "lease renewal failed while opening"),
                }
                renew_leases(state).await;
            }
        }
    }
}

/// Renews this node's lease of the shard `reference` at `epoch`.
async fn renew_lease(
    state: &NodeState,
    reference: pb::ShardRef,
    epoch: u64,
) -> Result<(), quiver_meta_client::MetaClientError> {
    let request = pb::RenewLeaseRequest {
        shard: Some(reference),
        node_id: state.config.node_id.clone(),
        epoch,
        ttl_ms: state.config.lease_ttl.as_millis() as u64,
    };
    state.meta.renew_lease(request).await.map(|_| ())
}

async fn renew_leases(state: &NodeState) {
    let due: Vec<(ShardRef, u64)> = {
        let shards = state.shards.read().unwrap_or_else(|p| p.into_inner());
        shards
            .iter()
            .filter(|(_, open)| open.last_renewal.elapsed() >= state.config.lease_ttl / 3)
            .map(|(shard, open)| (shard.clone(), open.writer.epoch()))
            .collect()
    };
    for (shard, epoch) in due {
        let Ok(reference) = shard_to_proto(&shard) else {
            continue;
        };
        match renew_lease(state, reference, epoch).await {
            Ok(_) => {
                if let Some(open) = state
                    .shards
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(&shard)
                {
                    open.last_renewal = Instant::now();
                }
            }
            Err(error) if error.kind() == ErrorCode::FailedPrecondition => {
                tracing::warn!(%shard, epoch, %error, "lease lost; closing shard writer");
                state
                    .shards
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&shard);
            }
            Err(error) => tracing::warn!(%shard, epoch, %error, "lease renewal failed"),
        }
    }
}

/// Deletes objects whose grace period has passed, then tells meta.
async fn gc_loop(state: Arc<NodeState>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(state.config.gc_interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if !state.registered.load(Ordering::Acquire) {
            continue;
        }
        let list = MetaCatalog::new(state.meta.clone());
        if let Err(error) = crate::gc::collect_garbage(&list, &state.storage, 256).await {
            tracing::debug!(%error, "gc list unavailable");
        }
    }
}

/// Sweeps the bucket for orphaned objects now and then — on the one indexer
/// with the smallest id among the live ones.
async fn orphan_loop(state: Arc<NodeState>, shutdown: CancellationToken) {
    let settings = &state.config.indexer;
    if settings.orphan_sweep_interval_ms == 0 {
        return;
    }
    let mut ticker =
        tokio::time::interval(Duration::from_millis(settings.orphan_sweep_interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if !state.registered.load(Ordering::Acquire) {
            continue;
        }
        match state.meta.get_routing("", false).await {
            Ok(routing) if crate::orphans::is_sweeper(&routing, &state.config.node_id) => {}
            Ok(_) => continue,
            Err(error) => {
                tracing::debug!(%error, "routing unavailable; orphan sweep skipped");
                continue;
            }
        }
        let swept = tokio::select! {
            swept = crate::orphans::sweep(
                &state.meta,
                &state.storage,
                Duration::from_millis(settings.orphan_min_age_ms),
                Duration::from_millis(settings.orphan_grace_ms),
            ) => swept,
            _ = shutdown.cancelled() => return,
        };
        match swept {
            Ok(outcome) => {
                crate::metrics::METRICS
                    .orphan_sweeps
                    .with_label_values(&["ok"])
                    .inc();
                tracing::debug!(
                    listed = outcome.listed,
                    candidates = outcome.candidates,
                    orphans = outcome.orphans,
                    new_orphans = outcome.new_orphans,
                    deleted = outcome.deleted.len(),
                    "orphan sweep done"
                );
            }
            Err(error) => {
                crate::metrics::METRICS
                    .orphan_sweeps
                    .with_label_values(&["error"])
                    .inc();
                tracing::warn!(%error, "orphan sweep failed; next one retries");
            }
        }
    }
}

struct IndexerGrpc {
    state: Arc<NodeState>,
}

impl IndexerGrpc {
    async fn writer(&self, shard: Option<&pb::ShardRef>) -> Result<Arc<ShardWriter>, Status> {
        self.open_shard(shard).await.map(|(writer, _)| writer)
    }

    async fn open_shard(
        &self,
        shard: Option<&pb::ShardRef>,
    ) -> Result<(Arc<ShardWriter>, Placement), Status> {
        let shard = shard.ok_or_else(|| Status::invalid_argument("`shard` is required"))?;
        let open = {
            let shards = self.state.shards.read().unwrap_or_else(|p| p.into_inner());
            shards
                .get(&shard_from_proto(shard))
                .map(|open| (open.writer.clone(), open.placement))
        };
        match open {
            Some(open) => Ok(open),
            None => Err(self.why_not_open(shard).await),
        }
    }

    /// Says why this node has no writer for `shard`, from a fresh routing table:
    /// the collection or shard does not exist (NOT_FOUND), another indexer holds
    /// the lease (FAILED_PRECONDITION: the caller re-routes), or the lease is
    /// this node's or nobody's and the writer is not open yet (UNAVAILABLE: retry).
    async fn why_not_open(&self, shard: &pb::ShardRef) -> Status {
        let node_id = &self.state.config.node_id;
        let (collection_id, number) = (shard.collection_id, shard.shard);
        let routing = match tokio::time::timeout(
            EXPLAIN_TIMEOUT,
            self.state.meta.get_routing("", true),
        )
        .await
        {
            Ok(Ok(routing)) => routing,
            Ok(Err(error)) => {
                return Status::unavailable(format!(
                    "shard {number} of collection id {collection_id} is not open on indexer `{node_id}`, and the metadata service cannot say why: {error}"
                ));
            }
            Err(_) => {
                return Status::unavailable(format!(
                    "shard {number} of collection id {collection_id} is not open on indexer `{node_id}`, and the metadata service did not answer within {} ms",
                    EXPLAIN_TIMEOUT.as_millis()
                ));
            }
        };
        let Some(collection) = routing
            .collections
            .iter()
            .find(|collection| collection.collection_id == collection_id)
        else {
            return Status::not_found(format!(
                "collection id {collection_id} does not exist (never created, or dropped)"
            ));
        };
        let (name, shard_count) = collection
            .spec
            .as_ref()
            .map_or(("", 1), |spec| (spec.name.as_str(), spec.shards.max(1)));
        if number >= shard_count {
            return Status::not_found(format!(
                "shard {number} of collection `{name}` (id {collection_id}) does not exist: the collection has {shard_count} shard(s), numbered from 0"
            ));
        }
        let lease = routing
            .shards
            .iter()
            .find(|routed| routed.shard.as_ref() == Some(shard))
            .and_then(|routed| routed.lease.as_ref());
        match lease {
            Some(lease) if lease.holder != *node_id => Status::failed_precondition(format!(
                "shard {number} of collection `{name}` (id {collection_id}) is leased to indexer `{}` at epoch {}, not to `{node_id}`",
                lease.holder, lease.epoch
            )),
            Some(lease) => Status::unavailable(format!(
                "shard {number} of collection `{name}` (id {collection_id}) is leased to this indexer `{node_id}` at epoch {}, but its writer is not open yet; retry shortly",
                lease.epoch
            )),
            None => Status::unavailable(format!(
                "shard {number} of collection `{name}` (id {collection_id}) has no indexer lease right now; retry shortly"
            )),
        }
    }
}

#[tonic::async_trait]
impl Indexer for IndexerGrpc {
    async fn write(
        &self,
        request: Request<data::WriteRequest>,
    ) -> Result<Response<data::WriteResponse>, Status> {
        let request = request.into_inner();
        let (writer, placement) = self.open_shard(request.shard.as_ref()).await?;
        let mut records = Vec::with_capacity(request.records.len());
        for (index, record) in request.records.into_iter().enumerate() {
            let record = match record.op {
                Some(write_record::Op::Upsert(point)) => {
                    let id = point.id.as_ref().and_then(point_id).ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "records[{index}].upsert has no id (set `num` or `text`)"
                        ))
                    })?;
                    placement.check(index, &id)?;
                    WalRecord::Upsert {
                        id,
                        vector: point.vector,
                        payload: point.payload_json,
                    }
                }
                Some(write_record::Op::Delete(id)) => {
                    let id = point_id(&id).ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "records[{index}].delete has no id (set `num` or `text`)"
                        ))
                    })?;
                    placement.check(index, &id)?;
                    WalRecord::Delete { id }
                }
                None => {
                    return Err(Status::invalid_argument(format!(
                        "records[{index}] has neither `upsert` nor `delete`"
                    )));
                }
            };
            records.push(record);
        }
        let position = writer
            .write(records)
            .await
            .map_err(|error| quiver_proto::status_of(&error))?;
        Ok(Response::new(data::WriteResponse {
            epoch: position.epoch,
            seq: position.sequence,
        }))
    }

    async fn flush(
        &self,
        request: Request<data::ShardRequest>,
    ) -> Result<Response<data::FlushResponse>, Status> {
        let writer = self.writer(request.get_ref().shard.as_ref()).await?;
        let flushed = writer
            .flush()
            .await
            .map_err(|error| quiver_proto::status_of(&error))?;
        Ok(Response::new(data::FlushResponse { flushed }))
    }

    async fn compact(
        &self,
        request: Request<data::ShardRequest>,
    ) -> Result<Response<data::CompactResponse>, Status> {
        let writer = self.writer(request.get_ref().shard.as_ref()).await?;
        let wait = match request.get_ref().compact_wait_ms {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let merges = writer
            .compact_within(wait)
            .await
            .map_err(|error| quiver_proto::status_of(&error))?;
        Ok(Response::new(data::CompactResponse {
            merges: merges.unwrap_or(0) as u32,
            running: merges.is_none(),
        }))
    }
}
