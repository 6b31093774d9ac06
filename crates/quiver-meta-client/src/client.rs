//! The client library of the metadata service.
//!
//! [`MetaClient`] takes the addresses of all metadata nodes. It sends each call to
//! the node it last saw as leader; a follower's refusal names the leader
//! (`x-quiver-leader`) and the call moves there at once; an unreachable node or a
//! cluster without a leader makes it try the next address after a full-jitter
//! backoff ([`RetryPolicy`]: nodes refused together do not come back together),
//! until the call's retry deadline. A refused call was never applied, so it is
//! always retried; a call whose outcome is unknown (timed out after it was sent) is
//! retried only if it is idempotent — every catalog write is, except dropping a
//! collection and a manifest change that adds no segment. Each attempt has a timeout.
//! (About 700 lines: one short method per metadata call, all on the one retry loop.)

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_common::RetryPolicy;
use quiver_proto::meta as pb;
use quiver_proto::meta::meta_service_client::MetaServiceClient;
use quiver_proto::tls::ClusterTls;
use quiver_proto::{LocalMeta, RpcChannel};
use tonic::transport::Channel;

use crate::channel::lazy_channel;
use crate::error::{MetaClientError, MetaClientResult};

/// Settings of a [`MetaClient`].
#[derive(Clone, Debug)]
pub struct MetaClientConfig {
    /// Addresses (`host:port`) of the metadata nodes.
    pub addresses: Vec<String>,
    /// Timeout of one attempt.
    pub attempt_timeout: Duration,
    /// Connect timeout of a channel.
    pub connect_timeout: Duration,
    /// Total time a call may spend retrying.
    pub retry_deadline: Duration,
    /// Bound of the first backoff between attempts; the bound doubles up to
    /// `max_backoff`, and each delay is drawn below it (full jitter).
    pub initial_backoff: Duration,
    /// Largest bound of a backoff between attempts.
    pub max_backoff: Duration,
    /// Mutual TLS with the cluster CA (none: plaintext).
    pub tls: Option<ClusterTls>,
}

impl MetaClientConfig {
    /// Returns settings for `addresses` with default timeouts.
    pub fn new(addresses: Vec<String>) -> Self {
        MetaClientConfig {
            addresses,
            // Longer than the server's default proposal timeout (5 s), so a slow
            // commit is reported by the server rather than cut short here.
            attempt_timeout: Duration::from_secs(6),
            connect_timeout: Duration::from_secs(1),
            retry_deadline: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            tls: None,
        }
    }

    /// Returns the retry policy of one call: backoffs from `initial_backoff` to
    /// `max_backoff`, as many attempts as fit in `retry_deadline`.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::new(usize::MAX, self.initial_backoff, self.max_backoff)
            .with_max_elapsed(self.retry_deadline)
    }
}

/// A metadata node to call: through its channel (the network, or its encoded
/// service in this process), or — when it runs in this process (`quiver
/// standalone`) — its handlers directly, with the messages as they are: no
/// protobuf encoding of the request and of the answer (a strong search's
/// routing round carries the collection's routing table), no tower stack.
pub(crate) struct MetaStub {
    client: MetaServiceClient<RpcChannel>,
    direct: Option<LocalMeta>,
}

/// The metadata calls, each over either path (`watch` streams always go
/// through the channel).
macro_rules! meta_methods {
    ($($method:ident($request:ty) -> $response:ty;)*) => {
        impl MetaStub {
            $(
                pub(crate) async fn $method(
                    &mut self,
                    request: impl tonic::IntoRequest<$request>,
                ) -> Result<tonic::Response<$response>, tonic::Status> {
                    match &self.direct {
                        Some(meta) => meta.$method(request.into_request()).await,
                        None => self.client.$method(request).await,
                    }
                }
            )*
        }
    };
}

meta_methods! {
    create_collection(pb::CreateCollectionRequest) -> pb::CreateCollectionResponse;
    get_collection(pb::GetCollectionRequest) -> pb::GetCollectionResponse;
    list_collections(pb::ListCollectionsRequest) -> pb::ListCollectionsResponse;
    drop_collection(pb::DropCollectionRequest) -> pb::DropCollectionResponse;
    register_node(pb::RegisterNodeRequest) -> pb::RegisterNodeResponse;
    heartbeat(pb::HeartbeatRequest) -> pb::HeartbeatResponse;
    drain_node(pb::DrainNodeRequest) -> pb::DrainNodeResponse;
    acquire_lease(pb::AcquireLeaseRequest) -> pb::AcquireLeaseResponse;
    renew_lease(pb::RenewLeaseRequest) -> pb::RenewLeaseResponse;
    commit_wal(pb::CommitWalRequest) -> pb::CommitWalResponse;
    commit_manifest_change(pb::CommitManifestChangeRequest) -> pb::CommitManifestChangeResponse;
    get_manifest(pb::GetManifestRequest) -> pb::GetManifestResponse;
    get_routing(pb::GetRoutingRequest) -> pb::GetRoutingResponse;
    take_gc(pb::TakeGcRequest) -> pb::TakeGcResponse;
    ack_gc(pb::AckGcRequest) -> pb::AckGcResponse;
    find_unreferenced(pb::FindUnreferencedRequest) -> pb::FindUnreferencedResponse;
    report_orphans(pb::ReportOrphansRequest) -> pb::ReportOrphansResponse;
    list_orphans(pb::ListOrphansRequest) -> pb::ListOrphansResponse;
    ack_orphans(pb::AckOrphansRequest) -> pb::AckOrphansResponse;
    add_learner(pb::AddLearnerRequest) -> pb::MembershipResponse;
    promote_voter(pb::PromoteVoterRequest) -> pb::MembershipResponse;
    remove_member(pb::RemoveMemberRequest) -> pb::MembershipResponse;
    cluster_status(pb::ClusterStatusRequest) -> pb::ClusterStatusResponse;
}

impl MetaStub {
    pub(crate) async fn watch(
        &mut self,
        request: impl tonic::IntoRequest<pb::WatchRequest>,
    ) -> Result<tonic::Response<tonic::Streaming<pb::WatchEvent>>, tonic::Status> {
        self.client.watch(request).await
    }
}

/// A client of the metadata service that follows the leader; cheap to clone.
#[derive(Clone)]
pub struct MetaClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    config: MetaClientConfig,
    channels: Mutex<HashMap<String, Channel>>,
    /// The address that answered last (usually the leader).
    preferred: Mutex<Option<String>>,
}

/// Whether a failed attempt may be repeated.
enum Retry {
    /// The request was not applied (refused, or never sent): always safe.
    Refused { leader_address: Option<String> },
    /// The request may or may not have been applied.
    Ambiguous,
    /// The answer is final.
    No,
}

fn classify(status: &tonic::Status) -> Retry {
    match MetaClientError::from_status(status) {
        MetaClientError::NotLeader { leader_address, .. } => Retry::Refused { leader_address },
        _ => match status.code() {
            tonic::Code::Unavailable => {
                let message = status.message();
                if message.contains("not committed within")
                    || message.contains("not confirmed within")
                {
                    Retry::Ambiguous
                } else {
                    // No leader known yet, or the connection could not be made.
                    Retry::Refused {
                        leader_address: None,
                    }
                }
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unknown => {
                Retry::Ambiguous
            }
            _ => Retry::No,
        },
    }
}

impl MetaClient {
    /// Creates a client; no connection is made until the first call.
    pub fn new(config: MetaClientConfig) -> MetaClientResult<MetaClient> {
        if config.addresses.is_empty() {
            return Err(MetaClientError::Config(
                "the metadata client needs at least one address".into(),
            ));
        }
        Ok(MetaClient {
            inner: Arc::new(ClientInner {
                config,
                channels: Mutex::new(HashMap::new()),
                preferred: Mutex::new(None),
            }),
        })
    }

    /// Creates a client for `addresses` with default settings.
    pub fn connect(
        addresses: impl IntoIterator<Item = impl Into<String>>,
    ) -> MetaClientResult<MetaClient> {
        MetaClient::new(MetaClientConfig::new(
            addresses.into_iter().map(Into::into).collect(),
        ))
    }

    /// Returns the way to the node at `address`: its service if it runs in this
    /// process (`quiver standalone`), else a network channel.
    fn rpc_channel(&self, address: &str) -> MetaClientResult<RpcChannel> {
        RpcChannel::to(address, self.inner.config.attempt_timeout, || {
            self.channel(address)
        })
    }

    fn channel(&self, address: &str) -> MetaClientResult<Channel> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let config = &self.inner.config;
        let channel = lazy_channel(address, config.connect_timeout, config.tls.as_ref()).map_err(
            |error| MetaClientError::Config(format!("bad metadata address `{address}`: {error}")),
        )?;
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    fn set_preferred(&self, address: Option<String>) {
        *self
            .inner
            .preferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = address;
    }

    fn preferred(&self) -> Option<String> {
        self.inner
            .preferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs one call with leader following, retries and timeouts.
    async fn call<T, F, Fut>(
        &self,
        method: &'static str,
        idempotent: bool,
        call: F,
    ) -> MetaClientResult<T>
    where
        F: Fn(MetaStub) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let config = &self.inner.config;
        let deadline = Instant::now() + config.retry_deadline;
        let mut backoff = config.retry_policy().backoff();
        let mut rotation = 0usize;
        let mut last_error: Option<MetaClientError> = None;
        let mut next_address: Option<String> = self.preferred();
        let spent = |last_error: Option<MetaClientError>| {
            let reason = last_error.map_or_else(
                || "no attempt finished".to_owned(),
                |error| error.to_string(),
            );
            MetaClientError::Unavailable(format!(
                "{method} failed on every metadata node within {} ms: {reason}",
                config.retry_deadline.as_millis()
            ))
        };
        loop {
            let address = next_address.take().unwrap_or_else(|| {
                let address = config.addresses[rotation % config.addresses.len()].clone();
                rotation += 1;
                address
            });
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(spent(last_error));
            }
            let attempt_timeout = config.attempt_timeout.min(remaining);
            let client = MetaStub {
                client: MetaServiceClient::new(self.rpc_channel(&address)?),
                direct: quiver_proto::local_meta(&address),
            };
            let mut redirected = false;
            match tokio::time::timeout(attempt_timeout, call(client)).await {
                Ok(Ok(response)) => {
                    self.set_preferred(Some(address));
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => match classify(&status) {
                    Retry::No => {
                        self.set_preferred(Some(address));
                        return Err(MetaClientError::from_status(&status));
                    }
                    Retry::Refused { leader_address } => {
                        tracing::debug!(method, %address, leader = ?leader_address, code = %status.code(), "metadata call refused, retrying");
                        if let Some(leader) = leader_address
                            && leader != address
                        {
                            next_address = Some(leader);
                            redirected = true;
                        }
                        self.set_preferred(None);
                        last_error = Some(MetaClientError::from_status(&status));
                    }
                    Retry::Ambiguous => {
                        if !idempotent {
                            return Err(MetaClientError::from_status(&status));
                        }
                        tracing::debug!(method, %address, code = %status.code(), "metadata call outcome unknown, retrying");
                        self.set_preferred(None);
                        last_error = Some(MetaClientError::from_status(&status));
                    }
                },
                Err(_elapsed) => {
                    if !idempotent {
                        return Err(MetaClientError::Unavailable(format!(
                            "{method} to `{address}` timed out after {} ms; outcome unknown",
                            attempt_timeout.as_millis()
                        )));
                    }
                    self.set_preferred(None);
                    last_error = Some(MetaClientError::Unavailable(format!(
                        "{method} to `{address}` timed out"
                    )));
                }
            }
            // A redirect to the named leader goes out at once; anything else
            // waits a jittered backoff (bounded by the call's deadline).
            if !redirected {
                let Some(delay) = backoff.next_delay() else {
                    return Err(spent(last_error));
                };
                tokio::time::sleep(delay).await;
            }
        }
    }

    /// Creates a collection (an identical existing one is returned with `created = false`).
    pub async fn create_collection(
        &self,
        spec: pb::CollectionSpec,
    ) -> MetaClientResult<pb::CreateCollectionResponse> {
        self.call("create_collection", true, |mut client| {
            let request = pb::CreateCollectionRequest {
                spec: Some(spec.clone()),
            };
            async move { client.create_collection(request).await }
        })
        .await
    }

    /// Returns a collection by name.
    pub async fn get_collection(
        &self,
        name: &str,
        linearizable: bool,
    ) -> MetaClientResult<pb::Collection> {
        let response = self
            .call("get_collection", true, |mut client| {
                let request = pb::GetCollectionRequest {
                    name: name.to_owned(),
                    linearizable,
                };
                async move { client.get_collection(request).await }
            })
            .await?;
        response.collection.ok_or_else(|| {
            MetaClientError::Protocol(format!("collection `{name}` answered without a body"))
        })
    }

    /// Lists collections.
    pub async fn list_collections(
        &self,
        linearizable: bool,
    ) -> MetaClientResult<Vec<pb::Collection>> {
        let response = self
            .call("list_collections", true, |mut client| async move {
                client
                    .list_collections(pb::ListCollectionsRequest { linearizable })
                    .await
            })
            .await?;
        Ok(response.collections)
    }

    /// Drops a collection. Not retried when the outcome is unknown.
    pub async fn drop_collection(
        &self,
        name: &str,
    ) -> MetaClientResult<pb::DropCollectionResponse> {
        self.call("drop_collection", false, |mut client| {
            let request = pb::DropCollectionRequest {
                name: name.to_owned(),
            };
            async move { client.drop_collection(request).await }
        })
        .await
    }

    /// Registers a data node.
    pub async fn register_node(
        &self,
        request: pb::RegisterNodeRequest,
    ) -> MetaClientResult<pb::NodeInfo> {
        let response = self
            .call("register_node", true, |mut client| {
                let request = request.clone();
                async move { client.register_node(request).await }
            })
            .await?;
        response.node.ok_or_else(|| {
            MetaClientError::Protocol("register_node answered without a node".into())
        })
    }

    /// Sends a heartbeat (with a searcher's ready shards).
    pub async fn heartbeat(&self, request: pb::HeartbeatRequest) -> MetaClientResult<pb::NodeInfo> {
        let response = self
            .call("heartbeat", true, |mut client| {
                let request = request.clone();
                async move { client.heartbeat(request).await }
            })
            .await?;
        response
            .node
            .ok_or_else(|| MetaClientError::Protocol("heartbeat answered without a node".into()))
    }

    /// Marks a node draining.
    pub async fn drain_node(&self, node_id: &str) -> MetaClientResult<pb::NodeInfo> {
        let response = self
            .call("drain_node", true, |mut client| {
                let request = pb::DrainNodeRequest {
                    node_id: node_id.to_owned(),
                };
                async move { client.drain_node(request).await }
            })
            .await?;
        response
            .node
            .ok_or_else(|| MetaClientError::Protocol("drain_node answered without a node".into()))
    }

    /// Acquires a shard's lease (the holder acquiring again keeps its epoch).
    pub async fn acquire_lease(
        &self,
        request: pb::AcquireLeaseRequest,
    ) -> MetaClientResult<pb::Lease> {
        let response = self
            .call("acquire_lease", true, |mut client| {
                let request = request.clone();
                async move { client.acquire_lease(request).await }
            })
            .await?;
        response.lease.ok_or_else(|| {
            MetaClientError::Protocol("acquire_lease answered without a lease".into())
        })
    }

    /// Renews a lease held at `epoch`.
    pub async fn renew_lease(&self, request: pb::RenewLeaseRequest) -> MetaClientResult<pb::Lease> {
        let response = self
            .call("renew_lease", true, |mut client| {
                let request = request.clone();
                async move { client.renew_lease(request).await }
            })
            .await?;
        response
            .lease
            .ok_or_else(|| MetaClientError::Protocol("renew_lease answered without a lease".into()))
    }

    /// Commits a WAL object (idempotent per `(epoch, seq)`).
    pub async fn commit_wal(
        &self,
        request: pb::CommitWalRequest,
    ) -> MetaClientResult<pb::CommitWalResponse> {
        self.call("commit_wal", true, |mut client| {
            let request = request.clone();
            async move { client.commit_wal(request).await }
        })
        .await
    }

    /// Commits a manifest change atomically; retried on an unknown outcome only when
    /// it adds segments (then a repeat is recognised).
    pub async fn commit_manifest_change(
        &self,
        request: pb::CommitManifestChangeRequest,
    ) -> MetaClientResult<pb::CommitManifestChangeResponse> {
        let idempotent = !request.add_segments.is_empty();
        self.call("commit_manifest_change", idempotent, |mut client| {
            let request = request.clone();
            async move { client.commit_manifest_change(request).await }
        })
        .await
    }

    /// Returns a shard's manifest; `linearizable` confirms it with the leader first.
    pub async fn get_manifest(
        &self,
        shard: pb::ShardRef,
        linearizable: bool,
    ) -> MetaClientResult<pb::Manifest> {
        let response = self
            .call("get_manifest", true, |mut client| {
                let request = pb::GetManifestRequest {
                    shard: Some(shard),
                    linearizable,
                };
                async move { client.get_manifest(request).await }
            })
            .await?;
        response.manifest.ok_or_else(|| {
            MetaClientError::Protocol("get_manifest answered without a manifest".into())
        })
    }

    /// Returns the routing table (all collections for an empty name).
    pub async fn get_routing(
        &self,
        collection: &str,
        linearizable: bool,
    ) -> MetaClientResult<pb::GetRoutingResponse> {
        self.call("get_routing", true, |mut client| {
            let request = pb::GetRoutingRequest {
                collection: collection.to_owned(),
                linearizable,
            };
            async move { client.get_routing(request).await }
        })
        .await
    }

    /// Opens a watch stream of catalog changes on any reachable node.
    pub async fn watch(
        &self,
        request: pb::WatchRequest,
    ) -> MetaClientResult<tonic::Streaming<pb::WatchEvent>> {
        self.call("watch", true, |mut client| async move {
            client.watch(request).await
        })
        .await
    }

    /// Returns the GC entries that are due.
    pub async fn take_gc(&self, limit: u32) -> MetaClientResult<Vec<pb::GcEntry>> {
        let response = self
            .call("take_gc", true, |mut client| async move {
                client.take_gc(pb::TakeGcRequest { limit }).await
            })
            .await?;
        Ok(response.entries)
    }

    /// Removes deleted objects from the GC list.
    pub async fn ack_gc(&self, object_keys: Vec<String>) -> MetaClientResult<u32> {
        let response = self
            .call("ack_gc", true, |mut client| {
                let request = pb::AckGcRequest {
                    object_keys: object_keys.clone(),
                };
                async move { client.ack_gc(request).await }
            })
            .await?;
        Ok(response.removed)
    }

    /// Returns the keys of `object_keys` that no manifest references and the GC
    /// list does not hold.
    pub async fn find_unreferenced(
        &self,
        object_keys: Vec<String>,
    ) -> MetaClientResult<Vec<String>> {
        let response = self
            .call("find_unreferenced", true, |mut client| {
                let request = pb::FindUnreferencedRequest {
                    object_keys: object_keys.clone(),
                };
                async move { client.find_unreferenced(request).await }
            })
            .await?;
        Ok(response.object_keys)
    }

    /// Replaces the orphan list with a sweep's findings; returns the orphans now
    /// due for deletion.
    pub async fn report_orphans(
        &self,
        orphans: Vec<pb::OrphanObject>,
        grace_ms: u64,
    ) -> MetaClientResult<pb::ReportOrphansResponse> {
        self.call("report_orphans", true, |mut client| {
            let request = pb::ReportOrphansRequest {
                orphans: orphans.clone(),
                grace_ms,
            };
            async move { client.report_orphans(request).await }
        })
        .await
    }

    /// Returns the reported orphans.
    pub async fn list_orphans(
        &self,
        linearizable: bool,
    ) -> MetaClientResult<Vec<pb::OrphanObject>> {
        let response = self
            .call("list_orphans", true, |mut client| async move {
                client
                    .list_orphans(pb::ListOrphansRequest { linearizable })
                    .await
            })
            .await?;
        Ok(response.orphans)
    }

    /// Removes deleted orphans from the orphan list.
    pub async fn ack_orphans(&self, object_keys: Vec<String>) -> MetaClientResult<u32> {
        let response = self
            .call("ack_orphans", true, |mut client| {
                let request = pb::AckOrphansRequest {
                    object_keys: object_keys.clone(),
                };
                async move { client.ack_orphans(request).await }
            })
            .await?;
        Ok(response.removed)
    }

    /// Adds a metadata node as a learner and waits until it has caught up.
    pub async fn add_learner(
        &self,
        id: u64,
        address: &str,
    ) -> MetaClientResult<Vec<pb::MetaMember>> {
        let response = self
            .call("add_learner", true, |mut client| {
                let request = pb::AddLearnerRequest {
                    id,
                    address: address.to_owned(),
                };
                async move { client.add_learner(request).await }
            })
            .await?;
        Ok(response.members)
    }

    /// Promotes a learner to voter. Not retried when its outcome is unknown: a
    /// promotion is two membership entries (joint, then final), and a retry
    /// after the first was appended is refused as "already undergoing a
    /// configuration change" although the change goes on.
    pub async fn promote_voter(&self, id: u64) -> MetaClientResult<Vec<pb::MetaMember>> {
        let response = self
            .call("promote_voter", false, |mut client| async move {
                client.promote_voter(pb::PromoteVoterRequest { id }).await
            })
            .await?;
        Ok(response.members)
    }

    /// Removes a metadata node from the membership.
    pub async fn remove_member(&self, id: u64) -> MetaClientResult<Vec<pb::MetaMember>> {
        let response = self
            .call("remove_member", false, |mut client| async move {
                client.remove_member(pb::RemoveMemberRequest { id }).await
            })
            .await?;
        Ok(response.members)
    }

    /// Returns the cluster status as seen by the node that answers.
    pub async fn cluster_status(&self) -> MetaClientResult<pb::ClusterStatusResponse> {
        self.call("cluster_status", true, |mut client| async move {
            client.cluster_status(pb::ClusterStatusRequest {}).await
        })
        .await
    }

    /// Returns the cluster status as seen by the node at `address` (no redirection).
    pub async fn cluster_status_of(
        &self,
        address: &str,
    ) -> MetaClientResult<pb::ClusterStatusResponse> {
        let mut client = MetaServiceClient::new(self.rpc_channel(address)?);
        let attempt = client.cluster_status(pb::ClusterStatusRequest {});
        match tokio::time::timeout(self.inner.config.attempt_timeout, attempt).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(MetaClientError::from_status(&status)),
            Err(_elapsed) => Err(MetaClientError::Unavailable(format!(
                "cluster_status to `{address}` timed out"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower's refusal as the metadata server sends it.
    fn not_leader(leader: Option<(&str, u64)>) -> tonic::Status {
        let mut status = tonic::Status::unavailable(format!(
            "not the metadata leader (leader: {})",
            leader.map_or("unknown", |(address, _)| address)
        ));
        if let Some((address, id)) = leader {
            let metadata = status.metadata_mut();
            metadata.insert(
                quiver_proto::LEADER_ADDRESS_HEADER,
                address.parse().unwrap(),
            );
            metadata.insert(
                quiver_proto::LEADER_ID_HEADER,
                id.to_string().parse().unwrap(),
            );
        }
        status
    }

    #[test]
    fn refusals_are_retried_and_unknown_outcomes_only_when_idempotent() {
        assert!(matches!(
            classify(&not_leader(Some(("127.0.0.1:7102", 2)))),
            Retry::Refused { leader_address: Some(ref address) } if address == "127.0.0.1:7102"
        ));
        assert!(matches!(
            classify(&not_leader(None)),
            Retry::Refused {
                leader_address: None
            }
        ));
        let timed_out =
            tonic::Status::unavailable("commit_wal was not committed within 5000 ms (no quorum?)");
        assert!(matches!(classify(&timed_out), Retry::Ambiguous));
        assert!(matches!(
            classify(&tonic::Status::deadline_exceeded("late")),
            Retry::Ambiguous
        ));
        assert!(matches!(
            classify(&tonic::Status::failed_precondition("stale epoch")),
            Retry::No
        ));
        assert!(matches!(
            classify(&tonic::Status::not_found("no such collection")),
            Retry::No
        ));
    }

    #[test]
    fn a_client_needs_an_address() {
        assert!(MetaClient::new(MetaClientConfig::new(Vec::new())).is_err());
        assert!(MetaClient::connect(["127.0.0.1:1"]).is_ok());
    }

    #[tokio::test]
    async fn calls_to_unreachable_nodes_end_at_the_retry_deadline() {
        let mut config = MetaClientConfig::new(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]);
        config.retry_deadline = Duration::from_millis(300);
        config.connect_timeout = Duration::from_millis(100);
        let client = MetaClient::new(config).expect("client");
        let started = Instant::now();
        let error = client.list_collections(false).await.unwrap_err();
        assert_eq!(error.kind(), quiver_proto::ErrorCode::Unavailable);
        assert!(error.to_string().contains("list_collections"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
