//! The client-facing gRPC API (`quiver.v1.meta.MetaService`): one handler per
//! call, each a conversion, a proposal or a catalog read (through
//! [`MetaContext`]), and a conversion back; plus the watch stream. (758 lines:
//! the service has 26 calls, each short.)
//!
//! Writes are proposed to Raft on this node; a follower refuses them with
//! `UNAVAILABLE` and the leader's address in `x-quiver-leader` (see
//! [`MetaError::into_status`]). Reads are served from this node's applied catalog,
//! or, with `linearizable`, after a read-index round that only the leader can do.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::Stream;
use openraft::ChangeMembers;
use openraft::error::{ClientWriteError, RaftError};
use quiver_model::ManifestChange;
use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;
use quiver_proto::meta::meta_service_server::MetaService;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::catalog::Catalog;
use crate::context::{MetaContext, forward_error};
use crate::convert;
use crate::error::{MetaError, MetaResult};
use crate::model::{Command, NodeRole, Outcome, ShardKey, ShardManifestChange};
use crate::raft_types::{MetaNode, MetaNodeId};

/// The gRPC handler of `MetaService`.
pub(crate) struct MetaGrpc {
    pub(crate) context: Arc<MetaContext>,
    /// Set when the node stops: open watch streams end, so their connections close.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
}

type GrpcResult<T> = Result<Response<T>, Status>;

fn unexpected(outcome: &Outcome) -> MetaError {
    MetaError::Raft(format!("unexpected outcome {outcome:?}"))
}

impl MetaGrpc {
    /// Runs a handler, recording its latency and result code.
    async fn observed<T>(
        &self,
        method: &'static str,
        handler: impl std::future::Future<Output = MetaResult<T>>,
    ) -> GrpcResult<T> {
        let started = Instant::now();
        let result = handler.await;
        let code = match &result {
            Ok(_) => "OK",
            Err(error) => error.kind().as_str(),
        };
        self.context
            .metrics
            .rpc_duration_seconds
            .with_label_values(&[method, code])
            .observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result
            && error.kind() == ErrorCode::Internal
        {
            tracing::warn!(method, %error, "metadata request failed");
        }
        result.map(Response::new).map_err(MetaError::into_status)
    }

    async fn read_catalog<T>(
        &self,
        linearizable: bool,
        read: impl FnOnce(&Catalog) -> MetaResult<T>,
    ) -> MetaResult<T> {
        if linearizable {
            self.context.linearize().await?;
        }
        self.context.catalog.read(|state| read(&state.catalog))
    }

    async fn membership_change(
        &self,
        change: ChangeMembers<MetaNodeId, MetaNode>,
    ) -> MetaResult<pb::MembershipResponse> {
        let timeout = self.context.config.proposal_timeout() * 4;
        self.context.begin_membership_change();
        let result =
            tokio::time::timeout(timeout, self.context.raft.change_membership(change, false)).await;
        membership_result(result, timeout)?;
        Ok(pb::MembershipResponse {
            members: self.context.members(),
        })
    }

    /// Places a new collection's shards now (an indexer lease, searchers) with
    /// the control loop's rules, rather than within its next interval: a
    /// describe or search right after the create then finds a searcher. A
    /// failure only leaves the placement to the control loop.
    async fn place_new_shards(&self) {
        let config = &self.context.config;
        let command = Command::Reconcile {
            node_timeout_ms: config.node_timeout_ms,
            lease_ttl_ms: config.lease_ttl_ms,
        };
        if let Err(error) = self.context.propose(command).await {
            tracing::debug!(%error, "placing a new collection's shards is left to the control loop");
        }
    }

    /// Refuses a membership change on `quiver standalone`'s metadata node
    /// (see [`crate::MetaConfig::fixed_membership`]); nothing is proposed.
    fn refuse_if_fixed_membership(&self, action: &str) -> MetaResult<()> {
        if !self.context.config.fixed_membership {
            return Ok(());
        }
        Err(MetaError::Rejected {
            code: ErrorCode::FailedPrecondition,
            message: format!(
                "cannot {action}: this is `quiver standalone`, which runs one metadata node in \
                 process with the other roles, so its metadata membership cannot change; run \
                 `quiver meta` nodes for a replicated metadata service"
            ),
        })
    }

    /// Refuses to promote learner `id` unless this node leads, `id` is a learner
    /// and it has caught up with this leader's log. Promoting a learner that is
    /// down or far behind would put the cluster in a joint configuration that
    /// needs it for every commit: no write, read-index round or further
    /// membership change could complete until it came back. A fresh entry is
    /// appended first (a `Reconcile`, what the control loop proposes anyway), so
    /// that a learner that caught up once and then went away does not look
    /// caught up on an idle cluster; the learner gets a bounded wait to
    /// replicate it.
    async fn refuse_unless_caught_up(&self, id: MetaNodeId) -> MetaResult<()> {
        let config = &self.context.config;
        let metrics = self.context.raft.metrics();
        let address = {
            let current = metrics.borrow();
            if current.current_leader != Some(self.context.node_id) {
                return Err(forward_error(
                    current.current_leader,
                    current.current_leader.and_then(|leader| {
                        current
                            .membership_config
                            .membership()
                            .get_node(&leader)
                            .cloned()
                    }),
                ));
            }
            let membership = current.membership_config.membership();
            if membership.get_joint_config().len() > 1 {
                return Err(MetaError::Rejected {
                    code: ErrorCode::FailedPrecondition,
                    message: format!(
                        "cannot promote metadata node {id}: a membership change (log {}) is \
                         still in progress",
                        current
                            .membership_config
                            .log_id()
                            .map_or_else(|| "none".to_owned(), |log_id| log_id.to_string())
                    ),
                });
            }
            let Some(node) = membership.get_node(&id) else {
                return Err(MetaError::Rejected {
                    code: ErrorCode::NotFound,
                    message: format!(
                        "metadata node {id} is not a member; add it as a learner first"
                    ),
                });
            };
            if membership.voter_ids().any(|voter| voter == id) {
                return Ok(());
            }
            node.address.clone()
        };
        self.context
            .propose(Command::Reconcile {
                node_timeout_ms: config.node_timeout_ms,
                lease_ttl_ms: config.lease_ttl_ms,
            })
            .await?;
        let target_index = metrics.borrow().last_log_index.unwrap_or(0);
        let matched_index = |metrics: &crate::raft_types::typ::RaftMetrics| {
            metrics
                .replication
                .as_ref()
                .and_then(|replication| replication.get(&id).cloned().flatten())
                .map(|log_id| log_id.index)
        };
        let wait = config.proposal_timeout() / 2;
        let caught_up = self
            .context
            .raft
            .wait(Some(wait))
            .metrics(
                |metrics| matched_index(metrics).is_some_and(|index| index >= target_index),
                "learner caught up with the leader's log",
            )
            .await
            .is_ok();
        if caught_up {
            return Ok(());
        }
        let (replicated, leader_last) = {
            let current = metrics.borrow();
            (matched_index(&current), current.last_log_index.unwrap_or(0))
        };
        let progress = match replicated {
            None => format!("it has replicated none of the leader's {leader_last} log entries"),
            Some(index) => format!(
                "it has replicated up to log index {index} of the leader's {leader_last} ({} \
                 entries behind)",
                leader_last.saturating_sub(index)
            ),
        };
        Err(MetaError::Rejected {
            code: ErrorCode::FailedPrecondition,
            message: format!(
                "cannot promote metadata node {id} at `{address}`: it has not caught up with \
                 the leader's log within {} ms ({progress}); is it running and reachable from \
                 the leader? nothing was changed",
                wait.as_millis()
            ),
        })
    }
}

type MembershipWrite<T> = Result<T, RaftError<MetaNodeId, ClientWriteError<MetaNodeId, MetaNode>>>;

fn membership_result<T>(
    result: Result<MembershipWrite<T>, tokio::time::error::Elapsed>,
    timeout: std::time::Duration,
) -> MetaResult<T> {
    match result {
        Err(_elapsed) => Err(MetaError::Unavailable(format!(
            "membership change proposed but not committed within {} ms: it takes effect if a \
             quorum of the new configuration acknowledges it; check `cluster status` before \
             trying again",
            timeout.as_millis()
        ))),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
            Err(forward_error(forward.leader_id, forward.leader_node))
        }
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error)))) => {
            Err(MetaError::Rejected {
                code: ErrorCode::FailedPrecondition,
                message: error.to_string(),
            })
        }
        Ok(Err(RaftError::Fatal(fatal))) => {
            Err(MetaError::Unavailable(format!("raft stopped: {fatal}")))
        }
    }
}

/// Builds the watch event for changes after `after_version`, or `None` if there are none.
pub(crate) fn watch_event(
    catalog: &Catalog,
    after_version: u64,
    collection_filter: u64,
) -> Option<pb::WatchEvent> {
    if catalog.version() <= after_version {
        return None;
    }
    let wanted = |collection_id: u64| collection_filter == 0 || collection_filter == collection_id;
    let shards = catalog
        .shards()
        .filter(|(key, record)| {
            record.changed_at_version > after_version && wanted(key.collection_id)
        })
        .map(|(key, record)| pb::ShardUpdate {
            routing: Some(convert::routing_to_proto(*key, record)),
            manifest: Some(convert::manifest_to_proto(*key, &record.manifest)),
        })
        .collect();
    let collections = if catalog.collections_changed_at_version() > after_version {
        catalog
            .collections()
            .filter(|collection| wanted(collection.collection_id))
            .map(convert::collection_to_proto)
            .collect()
    } else {
        Vec::new()
    };
    let dropped_collection_ids = catalog
        .dropped_since(after_version)
        .into_iter()
        .filter(|collection_id| wanted(*collection_id))
        .collect();
    let nodes = catalog
        .nodes()
        .filter(|node| node.changed_at_version > after_version)
        .map(convert::node_to_proto)
        .collect();
    Some(pb::WatchEvent {
        catalog_version: catalog.version(),
        shards,
        collections,
        dropped_collection_ids,
        nodes,
    })
}

#[tonic::async_trait]
impl MetaService for MetaGrpc {
    async fn create_collection(
        &self,
        request: Request<pb::CreateCollectionRequest>,
    ) -> GrpcResult<pb::CreateCollectionResponse> {
        self.observed("create_collection", async {
            let spec = convert::collection_spec(request.into_inner().spec)?;
            match self
                .context
                .propose(Command::CreateCollection { spec })
                .await?
            {
                Outcome::Collection {
                    collection,
                    created,
                } => {
                    if created {
                        self.place_new_shards().await;
                    }
                    Ok(pb::CreateCollectionResponse {
                        collection: Some(convert::collection_to_proto(&collection)),
                        created,
                    })
                }
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn get_collection(
        &self,
        request: Request<pb::GetCollectionRequest>,
    ) -> GrpcResult<pb::GetCollectionResponse> {
        self.observed("get_collection", async {
            let request = request.into_inner();
            self.read_catalog(request.linearizable, |catalog| {
                let collection =
                    catalog
                        .collection(&request.name)
                        .ok_or_else(|| MetaError::Rejected {
                            code: ErrorCode::NotFound,
                            message: format!("collection `{}` does not exist", request.name),
                        })?;
                Ok(pb::GetCollectionResponse {
                    collection: Some(convert::collection_to_proto(collection)),
                })
            })
            .await
        })
        .await
    }

    async fn list_collections(
        &self,
        request: Request<pb::ListCollectionsRequest>,
    ) -> GrpcResult<pb::ListCollectionsResponse> {
        self.observed("list_collections", async {
            self.read_catalog(request.into_inner().linearizable, |catalog| {
                Ok(pb::ListCollectionsResponse {
                    collections: catalog
                        .collections()
                        .map(convert::collection_to_proto)
                        .collect(),
                })
            })
            .await
        })
        .await
    }

    async fn drop_collection(
        &self,
        request: Request<pb::DropCollectionRequest>,
    ) -> GrpcResult<pb::DropCollectionResponse> {
        self.observed("drop_collection", async {
            let command = Command::DropCollection {
                name: request.into_inner().name,
                gc_grace_ms: self.context.config.gc_grace_ms,
            };
            match self.context.propose(command).await? {
                Outcome::Dropped { collection_id } => {
                    Ok(pb::DropCollectionResponse { collection_id })
                }
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn register_node(
        &self,
        request: Request<pb::RegisterNodeRequest>,
    ) -> GrpcResult<pb::RegisterNodeResponse> {
        self.observed("register_node", async {
            let request = request.into_inner();
            let role: NodeRole = convert::node_role_from_proto(request.role, &request.node_id)?;
            let command = Command::RegisterNode {
                node_id: request.node_id,
                role,
                address: request.address,
            };
            match self.context.propose(command).await? {
                Outcome::Node(node) => Ok(pb::RegisterNodeResponse {
                    node: Some(convert::node_to_proto(&node)),
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> GrpcResult<pb::HeartbeatResponse> {
        self.observed("heartbeat", async {
            let request = request.into_inner();
            let ready_shards = request
                .ready_shards
                .iter()
                .map(|shard| ShardKey {
                    collection_id: shard.collection_id,
                    shard: shard.shard,
                })
                .collect();
            let command = Command::Heartbeat {
                node_id: request.node_id,
                ready_shards,
            };
            match self.context.propose(command).await? {
                Outcome::Node(node) => Ok(pb::HeartbeatResponse {
                    node: Some(convert::node_to_proto(&node)),
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn drain_node(
        &self,
        request: Request<pb::DrainNodeRequest>,
    ) -> GrpcResult<pb::DrainNodeResponse> {
        self.observed("drain_node", async {
            let command = Command::DrainNode {
                node_id: request.into_inner().node_id,
            };
            match self.context.propose(command).await? {
                Outcome::Node(node) => Ok(pb::DrainNodeResponse {
                    node: Some(convert::node_to_proto(&node)),
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn acquire_lease(
        &self,
        request: Request<pb::AcquireLeaseRequest>,
    ) -> GrpcResult<pb::AcquireLeaseResponse> {
        self.observed("acquire_lease", async {
            let request = request.into_inner();
            let ttl_ms = if request.ttl_ms == 0 {
                self.context.config.lease_ttl_ms
            } else {
                request.ttl_ms
            };
            let command = Command::AcquireLease {
                shard: convert::shard_key(request.shard.as_ref(), "shard")?,
                node_id: request.node_id,
                ttl_ms,
            };
            match self.context.propose(command).await? {
                Outcome::Lease(lease) => Ok(pb::AcquireLeaseResponse {
                    lease: Some(convert::lease_to_proto(&lease)),
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> GrpcResult<pb::RenewLeaseResponse> {
        self.observed("renew_lease", async {
            let request = request.into_inner();
            let ttl_ms = if request.ttl_ms == 0 {
                self.context.config.lease_ttl_ms
            } else {
                request.ttl_ms
            };
            let command = Command::RenewLease {
                shard: convert::shard_key(request.shard.as_ref(), "shard")?,
                node_id: request.node_id,
                epoch: request.epoch,
                ttl_ms,
            };
            match self.context.propose(command).await? {
                Outcome::Lease(lease) => Ok(pb::RenewLeaseResponse {
                    lease: Some(convert::lease_to_proto(&lease)),
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn commit_wal(
        &self,
        request: Request<pb::CommitWalRequest>,
    ) -> GrpcResult<pb::CommitWalResponse> {
        self.observed("commit_wal", async {
            let request = request.into_inner();
            let command = Command::CommitWal {
                shard: convert::shard_key(request.shard.as_ref(), "shard")?,
                epoch: request.epoch,
                seq: request.seq,
                object_key: request.object_key,
                rows: request.rows,
            };
            match self.context.propose(command).await? {
                Outcome::WalCommitted {
                    manifest_version,
                    duplicate,
                } => Ok(pb::CommitWalResponse {
                    manifest_version,
                    duplicate,
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn commit_manifest_change(
        &self,
        request: Request<pb::CommitManifestChangeRequest>,
    ) -> GrpcResult<pb::CommitManifestChangeResponse> {
        self.observed("commit_manifest_change", async {
            let request = request.into_inner();
            let change = ShardManifestChange {
                shard: convert::shard_key(request.shard.as_ref(), "shard")?,
                epoch: request.epoch,
                change: ManifestChange {
                    add_segments: request
                        .add_segments
                        .iter()
                        .map(convert::segment_from_proto)
                        .collect(),
                    remove_segments: request.remove_segment_ids,
                    set_deletes: request
                        .set_deletes
                        .iter()
                        .map(convert::deletes_from_proto)
                        .collect(),
                    trim_wal_through: request
                        .trim_wal_through
                        .as_ref()
                        .map(convert::wal_position_from_proto),
                    retire_keys: request.gc_keys,
                    set_probes: request
                        .set_probes
                        .iter()
                        .map(convert::probes_from_proto)
                        .collect(),
                },
            };
            let command = Command::CommitManifestChange {
                change,
                gc_grace_ms: self.context.config.gc_grace_ms,
            };
            match self.context.propose(command).await? {
                Outcome::ManifestCommitted {
                    manifest_version,
                    duplicate,
                } => Ok(pb::CommitManifestChangeResponse {
                    manifest_version,
                    duplicate,
                }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn get_manifest(
        &self,
        request: Request<pb::GetManifestRequest>,
    ) -> GrpcResult<pb::GetManifestResponse> {
        self.observed("get_manifest", async {
            let request = request.into_inner();
            let shard = convert::shard_key(request.shard.as_ref(), "shard")?;
            self.read_catalog(request.linearizable, |catalog| {
                let record = catalog.shard(shard).ok_or_else(|| MetaError::Rejected {
                    code: ErrorCode::NotFound,
                    message: format!("shard {shard} not found"),
                })?;
                Ok(pb::GetManifestResponse {
                    manifest: Some(convert::manifest_to_proto(shard, &record.manifest)),
                })
            })
            .await
        })
        .await
    }

    async fn get_routing(
        &self,
        request: Request<pb::GetRoutingRequest>,
    ) -> GrpcResult<pb::GetRoutingResponse> {
        self.observed("get_routing", async {
            let request = request.into_inner();
            let node_timeout_ms = self.context.config.node_timeout_ms;
            let control_interval_ms = self.context.config.control_interval_ms;
            self.read_catalog(request.linearizable, |catalog| {
                let collection_id = if request.collection.is_empty() {
                    None
                } else {
                    let collection = catalog.collection(&request.collection).ok_or_else(|| {
                        MetaError::Rejected {
                            code: ErrorCode::NotFound,
                            message: format!("collection `{}` does not exist", request.collection),
                        }
                    })?;
                    Some(collection.collection_id)
                };
                let wanted = |id: u64| collection_id.is_none_or(|wanted_id| wanted_id == id);
                Ok(pb::GetRoutingResponse {
                    catalog_version: catalog.version(),
                    collections: catalog
                        .collections()
                        .filter(|collection| wanted(collection.collection_id))
                        .map(convert::collection_to_proto)
                        .collect(),
                    shards: catalog
                        .shards()
                        .filter(|(key, _)| wanted(key.collection_id))
                        .map(|(key, record)| convert::routing_to_proto(*key, record))
                        .collect(),
                    nodes: catalog.nodes().map(convert::node_to_proto).collect(),
                    node_timeout_ms,
                    control_interval_ms,
                })
            })
            .await
        })
        .await
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send + 'static>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> GrpcResult<Self::WatchStream> {
        let request = request.into_inner();
        let catalog = self.context.catalog.clone();
        let mut version_receiver = catalog.subscribe();
        let shutdown = self.shutdown.clone();
        let (sender, receiver) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut sent_version = request.from_version;
            loop {
                let event = catalog
                    .read(|state| watch_event(&state.catalog, sent_version, request.collection_id));
                if let Some(event) = event {
                    sent_version = event.catalog_version;
                    if sender.send(Ok(event)).await.is_err() {
                        break;
                    }
                }
                tokio::select! {
                    changed = version_receiver.changed() => {
                        if changed.is_err() {
                            break;
                        }
                    }
                    () = sender.closed() => break,
                    () = shutdown.cancelled() => break,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn take_gc(&self, request: Request<pb::TakeGcRequest>) -> GrpcResult<pb::TakeGcResponse> {
        self.observed("take_gc", async {
            let limit = match request.into_inner().limit {
                0 => 1_000,
                limit => limit as usize,
            };
            // The leader's clock decides what is due, as it would in a command (read
            // before the read-index round: a little early is the safe side).
            let leader_now_ms = self.context.leader_now_ms();
            self.read_catalog(true, |catalog| {
                let now_ms = leader_now_ms.max(catalog.clock_ms());
                Ok(pb::TakeGcResponse {
                    entries: catalog
                        .gc_due(now_ms, limit)
                        .into_iter()
                        .map(|(object_key, delete_after_ms)| pb::GcEntry {
                            object_key,
                            delete_after_ms,
                        })
                        .collect(),
                })
            })
            .await
        })
        .await
    }

    async fn find_unreferenced(
        &self,
        request: Request<pb::FindUnreferencedRequest>,
    ) -> GrpcResult<pb::FindUnreferencedResponse> {
        self.observed("find_unreferenced", async {
            let keys = request.into_inner().object_keys;
            self.read_catalog(true, |catalog| {
                Ok(pb::FindUnreferencedResponse {
                    object_keys: catalog
                        .unreferenced(keys.iter().map(String::as_str))
                        .into_iter()
                        .map(str::to_owned)
                        .collect(),
                })
            })
            .await
        })
        .await
    }

    async fn report_orphans(
        &self,
        request: Request<pb::ReportOrphansRequest>,
    ) -> GrpcResult<pb::ReportOrphansResponse> {
        self.observed("report_orphans", async {
            let request = request.into_inner();
            let command = Command::ReportOrphans {
                orphans: request
                    .orphans
                    .into_iter()
                    .map(|orphan| crate::model::OrphanCandidate {
                        object_key: orphan.object_key,
                        size_bytes: orphan.size_bytes,
                        last_modified_ms: orphan.last_modified_ms,
                    })
                    .collect(),
                grace_ms: request.grace_ms,
            };
            match self.context.propose(command).await? {
                Outcome::OrphansReported { new_orphans, due } => {
                    Ok(pb::ReportOrphansResponse { new_orphans, due })
                }
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn list_orphans(
        &self,
        request: Request<pb::ListOrphansRequest>,
    ) -> GrpcResult<pb::ListOrphansResponse> {
        self.observed("list_orphans", async {
            let linearizable = request.into_inner().linearizable;
            self.read_catalog(linearizable, |catalog| {
                Ok(pb::ListOrphansResponse {
                    orphans: catalog
                        .orphans()
                        .map(|(key, record)| pb::OrphanObject {
                            object_key: key.clone(),
                            size_bytes: record.size_bytes,
                            last_modified_ms: record.last_modified_ms,
                            first_seen_ms: record.first_seen_ms,
                            delete_after_ms: record.delete_after_ms,
                        })
                        .collect(),
                })
            })
            .await
        })
        .await
    }

    async fn ack_orphans(
        &self,
        request: Request<pb::AckOrphansRequest>,
    ) -> GrpcResult<pb::AckOrphansResponse> {
        self.observed("ack_orphans", async {
            let command = Command::AckOrphans {
                object_keys: request.into_inner().object_keys,
            };
            match self.context.propose(command).await? {
                Outcome::OrphansAcked { removed } => Ok(pb::AckOrphansResponse { removed }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn ack_gc(&self, request: Request<pb::AckGcRequest>) -> GrpcResult<pb::AckGcResponse> {
        self.observed("ack_gc", async {
            let command = Command::AckGc {
                object_keys: request.into_inner().object_keys,
            };
            match self.context.propose(command).await? {
                Outcome::GcAcked { removed } => Ok(pb::AckGcResponse { removed }),
                other => Err(unexpected(&other)),
            }
        })
        .await
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> GrpcResult<pb::MembershipResponse> {
        self.observed("add_learner", async {
            let request = request.into_inner();
            self.refuse_if_fixed_membership("add a metadata node")?;
            if request.id == 0 || request.address.is_empty() {
                return Err(MetaError::Rejected {
                    code: ErrorCode::InvalidArgument,
                    message: format!(
                        "learner needs an id ≥ 1 and an address (got {} `{}`)",
                        request.id, request.address
                    ),
                });
            }
            let node = MetaNode {
                address: request.address,
            };
            let timeout = self.context.config.proposal_timeout() * 4;
            self.context.begin_membership_change();
            let result = tokio::time::timeout(
                timeout,
                self.context.raft.add_learner(request.id, node, true),
            )
            .await;
            membership_result(result, timeout)?;
            Ok(pb::MembershipResponse {
                members: self.context.members(),
            })
        })
        .await
    }

    async fn promote_voter(
        &self,
        request: Request<pb::PromoteVoterRequest>,
    ) -> GrpcResult<pb::MembershipResponse> {
        self.observed("promote_voter", async {
            let id = request.into_inner().id;
            self.refuse_if_fixed_membership("promote a metadata node")?;
            self.refuse_unless_caught_up(id).await?;
            self.membership_change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                .await
        })
        .await
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> GrpcResult<pb::MembershipResponse> {
        self.observed("remove_member", async {
            let id = request.into_inner().id;
            self.refuse_if_fixed_membership("remove a metadata node")?;
            let (is_voter, is_member) = {
                let metrics = self.context.raft.metrics();
                let metrics = metrics.borrow();
                let membership = metrics.membership_config.membership();
                (
                    membership.voter_ids().any(|voter| voter == id),
                    membership.get_node(&id).is_some(),
                )
            };
            if !is_member {
                return Err(MetaError::Rejected {
                    code: ErrorCode::NotFound,
                    message: format!("metadata node {id} is not a member"),
                });
            }
            let change = if is_voter {
                ChangeMembers::RemoveVoters(BTreeSet::from([id]))
            } else {
                ChangeMembers::RemoveNodes(BTreeSet::from([id]))
            };
            self.membership_change(change).await
        })
        .await
    }

    async fn cluster_status(
        &self,
        _request: Request<pb::ClusterStatusRequest>,
    ) -> GrpcResult<pb::ClusterStatusResponse> {
        self.observed("cluster_status", async {
            Ok(self.context.cluster_status())
        })
        .await
    }
}
