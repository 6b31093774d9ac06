//! Raft RPCs between metadata nodes over tonic (`quiver.v1.raft.RaftService`).
//!
//! openraft's requests and responses travel as JSON inside a `RaftPayload`; the
//! format is private to this crate (all meta nodes run the same version). Every
//! call has a timeout: openraft's per-RPC time to live, capped by the connect
//! timeout for establishing the channel.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openraft::AnyError;
use openraft::error::{NetworkError, RemoteError, Unreachable};
use openraft::network::Backoff;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use quiver_meta_client::lazy_channel;
use quiver_proto::raft::RaftPayload;
use quiver_proto::raft::raft_service_client::RaftServiceClient;
use quiver_proto::raft::raft_service_server::RaftService;
use quiver_proto::tls::ClusterTls;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::election::{Elections, PreVoteRequest};
use crate::raft_types::typ::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotError, InstallSnapshotRequest,
    InstallSnapshotResponse, Raft, RaftError, RpcError, VoteRequest, VoteResponse,
};
use crate::raft_types::{MetaNode, MetaNodeId, TypeConfig};

/// Creates connections to peers; an address in `address_overrides` wins over the
/// address stored in the Raft membership (a node may reach a peer by another route).
#[derive(Clone)]
pub(crate) struct NetworkFactory {
    pub(crate) address_overrides: Arc<BTreeMap<MetaNodeId, String>>,
    pub(crate) connect_timeout: Duration,
    /// Mutual TLS with the cluster CA on peer channels (none: plaintext).
    pub(crate) tls: Option<ClusterTls>,
    /// Set while this node, as leader, has stepped down (see
    /// [`crate::election`]): it then sends no appends and no snapshots.
    pub(crate) stepping_down: Arc<AtomicBool>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: MetaNodeId, node: &MetaNode) -> Self::Network {
        let address = self
            .address_overrides
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.address.clone());
        PeerConnection {
            target,
            address,
            connect_timeout: self.connect_timeout,
            tls: self.tls.clone(),
            client: None,
            stepping_down: self.stepping_down.clone(),
        }
    }
}

/// One peer's Raft RPC client; the channel is created on first use and reconnects
/// by itself.
pub(crate) struct PeerConnection {
    target: MetaNodeId,
    address: String,
    connect_timeout: Duration,
    tls: Option<ClusterTls>,
    client: Option<RaftServiceClient<Channel>>,
    stepping_down: Arc<AtomicBool>,
}

impl PeerConnection {
    /// The refusal to send leader traffic while this node steps down: its appends,
    /// even late ones, would keep the followers' leader lease alive and stop
    /// them from electing a leader that can reach a quorum.
    fn stepping_down(&self) -> Option<Unreachable> {
        self.stepping_down.load(Ordering::Acquire).then(|| {
            Unreachable::new(&AnyError::error(format!(
                "not sent to node {}: this leader is stepping down (no quorum acknowledged it)",
                self.target
            )))
        })
    }

    fn client(&mut self) -> Result<RaftServiceClient<Channel>, Unreachable> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = lazy_channel(&self.address, self.connect_timeout, self.tls.as_ref())
            .map_err(|error| Unreachable::new(&error))?;
        let client = RaftServiceClient::new(channel).max_decoding_message_size(256 * 1024 * 1024);
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn call<Request, Response, E>(
        &mut self,
        method: RaftMethod,
        request: &Request,
        blob: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Response, RpcError<E>>
    where
        Request: Serialize,
        Response: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let data = serde_json::to_vec(request)
            .map_err(|error| RpcError::Network(NetworkError::new(&error)))?;
        let mut client = self.client().map_err(RpcError::Unreachable)?;
        let timeout = option.hard_ttl();
        let mut grpc_request = tonic::Request::new(RaftPayload { data, blob });
        grpc_request.set_timeout(timeout);
        let call = async {
            match method {
                RaftMethod::AppendEntries => client.append_entries(grpc_request).await,
                RaftMethod::Vote => client.vote(grpc_request).await,
                RaftMethod::InstallSnapshot => client.install_snapshot(grpc_request).await,
            }
        };
        let response = match tokio::time::timeout(timeout, call).await {
            Err(_elapsed) => {
                return Err(RpcError::Network(NetworkError::new(&AnyError::error(
                    format!(
                        "raft rpc to node {} at {} timed out after {timeout:?}",
                        self.target, self.address
                    ),
                ))));
            }
            Ok(Err(status)) => {
                let error = AnyError::error(format!(
                    "raft rpc to node {} at {}: {}: {}",
                    self.target,
                    self.address,
                    status.code(),
                    status.message()
                ));
                if status.code() == tonic::Code::Unavailable {
                    return Err(RpcError::Unreachable(Unreachable::new(&error)));
                }
                return Err(RpcError::Network(NetworkError::new(&error)));
            }
            Ok(Ok(response)) => response.into_inner(),
        };
        let result: Result<Response, RaftError<E>> = serde_json::from_slice(&response.data)
            .map_err(|error| RpcError::Network(NetworkError::new(&error)))?;
        result.map_err(|remote| RpcError::RemoteError(RemoteError::new(self.target, remote)))
    }
}

#[derive(Clone, Copy)]
enum RaftMethod {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RpcError> {
        if let Some(refusal) = self.stepping_down() {
            return Err(RpcError::Unreachable(refusal));
        }
        self.call(RaftMethod::AppendEntries, &rpc, Vec::new(), &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse, RpcError<InstallSnapshotError>> {
        if let Some(refusal) = self.stepping_down() {
            return Err(RpcError::Unreachable(refusal));
        }
        let mut rpc = rpc;
        let chunk = std::mem::take(&mut rpc.data);
        self.call(RaftMethod::InstallSnapshot, &rpc, chunk, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RpcError> {
        self.call(RaftMethod::Vote, &rpc, Vec::new(), &option).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

/// Serves the peer-only Raft RPCs by handing them to the local Raft node; pre-votes
/// are answered by [`Elections`].
pub(crate) struct RaftGrpc {
    pub(crate) raft: Raft,
    pub(crate) elections: Arc<Elections>,
}

fn decode<T: DeserializeOwned>(payload: &RaftPayload) -> Result<T, tonic::Status> {
    serde_json::from_slice(&payload.data).map_err(|error| {
        tonic::Status::invalid_argument(format!("undecodable raft payload: {error}"))
    })
}

fn encode<T: Serialize>(value: &T) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
    serde_json::to_vec(value)
        .map(|data| {
            tonic::Response::new(RaftPayload {
                data,
                blob: Vec::new(),
            })
        })
        .map_err(|error| tonic::Status::internal(format!("unencodable raft payload: {error}")))
}

#[tonic::async_trait]
impl RaftService for RaftGrpc {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let rpc: AppendEntriesRequest = decode(request.get_ref())?;
        let result = self.raft.append_entries(rpc).await;
        encode(&result)
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let rpc: VoteRequest = decode(request.get_ref())?;
        let result = self.raft.vote(rpc).await;
        encode(&result)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let payload = request.into_inner();
        let mut rpc: InstallSnapshotRequest = decode(&payload)?;
        rpc.data = payload.blob;
        let result = self.raft.install_snapshot(rpc).await;
        encode(&result)
    }

    async fn pre_vote(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let pre_vote: PreVoteRequest = decode(request.get_ref())?;
        let answer = self.elections.answer(&pre_vote).await;
        encode(&answer)
    }
}
