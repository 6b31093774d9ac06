//! Quiver's metadata service: the cluster catalog (data nodes, collections, shards
//! with leases and searcher assignments, per-shard manifests, the GC list),
//! replicated with openraft.
//!
//! - The Raft log and vote live in redb on local disk; the catalog is rebuilt from
//!   the newest snapshot file plus the log on start; snapshots are taken every
//!   `snapshot_logs` entries and the log is compacted behind them.
//! - Every change is a [`Command`] applied deterministically by [`Catalog::apply`]
//!   with the proposing leader's clock carried in the log entry.
//! - [`MetaServer`] serves the client API (`quiver.v1.meta.MetaService`) and the
//!   peer-only Raft RPCs on one gRPC port; followers refuse writes with
//!   `UNAVAILABLE` plus the leader's address (`x-quiver-leader`), and [`MetaClient`]
//!   retries on the leader.
//! - A control loop on the leader marks silent nodes dead, moves their leases to
//!   live indexers and keeps each shard's searchers assigned by rendezvous hashing.

mod catalog;
mod clock;
mod config;
mod context;
mod control;
mod convert;
mod disk;
mod election;
mod error;
mod log_store;
mod metrics;
mod model;
mod network;
mod raft_types;
mod server;
mod service;
mod state_machine;

pub use catalog::Catalog;
pub use config::MetaConfig;
pub use error::{MetaError, MetaResult};
pub use log_store::LogStore;
pub use metrics::MetaMetrics;
// The client lives in `quiver-meta-client` (no Raft, no redb); re-exported for
// the callers that link the server anyway.
pub use model::{
    Command, Lease, MetaRequest, MetaResponse, NodeRecord, NodeRole, NodeState, OrphanCandidate,
    OrphanRecord, Outcome, Rejection, ShardManifestChange, ShardRecord,
};
pub use quiver_meta_client::{
    MetaClient, MetaClientConfig, MetaClientError, NodeIdentity, keep_registered,
};
// The collection and manifest types are the shared model's.
pub use quiver_model::{
    Collection, CollectionSpec, DeletesEntry, FieldKind, IdType, IndexParams, Manifest,
    ManifestChange, Metric, PayloadField, SegmentEntry, ShardKey, VectorPrecision, WalEntry,
    WalPosition,
};
pub use raft_types::{MetaNode, MetaNodeId, TypeConfig, typ};
pub use server::{MetaServer, run_single_node, run_single_node_with};
pub use state_machine::StateMachineStore;

#[cfg(test)]
#[allow(clippy::result_large_err)]
mod storage_suite {
    use openraft::testing::{StoreBuilder, Suite};

    use crate::log_store::LogStore;
    use crate::raft_types::TypeConfig;
    use crate::raft_types::typ::StorageError;
    use crate::state_machine::StateMachineStore;

    struct RedbStoreBuilder;

    fn setup_error(error: impl std::fmt::Display) -> StorageError {
        openraft::StorageIOError::new(
            openraft::ErrorSubject::Store,
            openraft::ErrorVerb::Write,
            openraft::AnyError::error(error),
        )
        .into()
    }

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RedbStoreBuilder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
            let directory = tempfile::tempdir().map_err(setup_error)?;
            let log_store =
                LogStore::open(&directory.path().join("raft-log.redb")).map_err(setup_error)?;
            let state_machine = StateMachineStore::open(&directory.path().join("snapshots"), None)
                .map_err(setup_error)?;
            Ok((directory, log_store, state_machine))
        }
    }

    /// openraft's own conformance suite against the redb log store and our state machine.
    #[test]
    fn openraft_storage_suite_passes() -> Result<(), StorageError> {
        Suite::test_all(RedbStoreBuilder)
    }
}
