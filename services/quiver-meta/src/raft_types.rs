//! The openraft type configuration of the metadata service.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::model::{MetaRequest, MetaResponse};

/// Raft node id of a metadata node.
pub type MetaNodeId = u64;

/// What the Raft membership stores about a metadata node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaNode {
    /// Address of the node's gRPC port (Raft and the client API share it).
    pub address: String,
}

impl fmt::Display for MetaNode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.address)
    }
}

openraft::declare_raft_types!(
    /// The openraft type configuration of the metadata service.
    pub TypeConfig:
        D = MetaRequest,
        R = MetaResponse,
        NodeId = MetaNodeId,
        Node = MetaNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Short aliases of the openraft generics instantiated with [`TypeConfig`].
pub mod typ {
    use super::{MetaNode, MetaNodeId, TypeConfig};

    /// The Raft handle.
    pub type Raft = openraft::Raft<TypeConfig>;
    /// A log entry.
    pub type Entry = openraft::Entry<TypeConfig>;
    /// A log id.
    pub type LogId = openraft::LogId<MetaNodeId>;
    /// A vote.
    pub type Vote = openraft::Vote<MetaNodeId>;
    /// A storage error.
    pub type StorageError = openraft::StorageError<MetaNodeId>;
    /// A stored membership.
    pub type StoredMembership = openraft::StoredMembership<MetaNodeId, MetaNode>;
    /// Snapshot metadata.
    pub type SnapshotMeta = openraft::SnapshotMeta<MetaNodeId, MetaNode>;
    /// A snapshot.
    pub type Snapshot = openraft::Snapshot<TypeConfig>;
    /// Raft metrics.
    pub type RaftMetrics = openraft::RaftMetrics<MetaNodeId, MetaNode>;
    /// A Raft error with an API error `E`.
    pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<MetaNodeId, E>;
    /// An RPC error with a remote error `E`.
    pub type RpcError<E = openraft::error::Infallible> =
        openraft::error::RPCError<MetaNodeId, MetaNode, RaftError<E>>;
    /// A client write error.
    pub type ClientWriteError = openraft::error::ClientWriteError<MetaNodeId, MetaNode>;
    /// A leadership check error.
    pub type CheckIsLeaderError = openraft::error::CheckIsLeaderError<MetaNodeId, MetaNode>;
    /// A forward-to-leader error.
    pub type ForwardToLeader = openraft::error::ForwardToLeader<MetaNodeId, MetaNode>;
    /// A snapshot-install error.
    pub type InstallSnapshotError = openraft::error::InstallSnapshotError;
    /// An append-entries request.
    pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
    /// An append-entries response.
    pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<MetaNodeId>;
    /// A vote request.
    pub type VoteRequest = openraft::raft::VoteRequest<MetaNodeId>;
    /// A vote response.
    pub type VoteResponse = openraft::raft::VoteResponse<MetaNodeId>;
    /// A snapshot-chunk request.
    pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
    /// A snapshot-chunk response.
    pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<MetaNodeId>;
}
