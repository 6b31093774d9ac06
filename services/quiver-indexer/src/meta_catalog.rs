//! The [`Catalog`] of a cluster: the metadata service through its client, which
//! follows the Raft leader and retries idempotent calls.

use async_trait::async_trait;
use quiver_meta_client::{MetaClient, MetaClientError as MetaError};
use quiver_proto::ErrorCode;
use quiver_proto::meta as pb;

use quiver_proto::convert::{manifest_from_proto, segment_to_proto};

use crate::catalog::{Catalog, CatalogError, GcList, Manifest, ManifestChange, ShardRef, WalEntry};

fn shard_to_proto(shard: &ShardRef) -> Result<pb::ShardRef, CatalogError> {
    quiver_proto::convert::shard_to_proto(shard).map_err(CatalogError::Rejected)
}

/// The metadata service as the write path's catalog.
#[derive(Clone)]
pub struct MetaCatalog {
    client: MetaClient,
}

impl MetaCatalog {
    /// Wraps a metadata client.
    pub fn new(client: MetaClient) -> Self {
        MetaCatalog { client }
    }
}

/// Maps a metadata-service error into the write path's vocabulary.
pub fn catalog_error(shard: &ShardRef, epoch: u64, error: MetaError) -> CatalogError {
    match error.kind() {
        ErrorCode::FailedPrecondition
            if {
                let message = error.to_string();
                message.contains("stale epoch") || message.contains("was never granted")
            } =>
        {
            CatalogError::Fenced {
                shard: shard.clone(),
                epoch,
                current: 0,
            }
        }
        ErrorCode::NotFound => CatalogError::NotFound(shard.clone()),
        // A full metadata disk refuses writes for a while, like a lost leader.
        ErrorCode::Unavailable
        | ErrorCode::DeadlineExceeded
        | ErrorCode::Cancelled
        | ErrorCode::ResourceExhausted => CatalogError::Unavailable(error.to_string()),
        _ => CatalogError::Rejected(error.to_string()),
    }
}

#[async_trait]
impl Catalog for MetaCatalog {
    async fn manifest(&self, shard: &ShardRef) -> Result<Manifest, CatalogError> {
        let manifest = self
            .client
            .get_manifest(shard_to_proto(shard)?, true)
            .await
            .map_err(|error| catalog_error(shard, 0, error))?;
        Ok(manifest_from_proto(&manifest))
    }

    async fn commit_wal(
        &self,
        shard: &ShardRef,
        epoch: u64,
        entry: WalEntry,
    ) -> Result<u64, CatalogError> {
        let request = pb::CommitWalRequest {
            shard: Some(shard_to_proto(shard)?),
            epoch,
            seq: entry.position.sequence,
            object_key: entry.key,
            rows: entry.rows as u64,
        };
        debug_assert_eq!(entry.position.epoch, epoch);
        let response = self
            .client
            .commit_wal(request)
            .await
            .map_err(|error| catalog_error(shard, epoch, error))?;
        Ok(response.manifest_version)
    }

    async fn commit_manifest_change(
        &self,
        shard: &ShardRef,
        epoch: u64,
        change: ManifestChange,
    ) -> Result<Manifest, CatalogError> {
        let request = pb::CommitManifestChangeRequest {
            shard: Some(shard_to_proto(shard)?),
            epoch,
            add_segments: change.add_segments.iter().map(segment_to_proto).collect(),
            remove_segment_ids: change.remove_segments.clone(),
            set_deletes: change
                .set_deletes
                .iter()
                .map(|(segment_id, deletes)| pb::DeletesUpdate {
                    segment_id: segment_id.clone(),
                    deletes_key: deletes.key.clone(),
                    deletes_version: deletes.version,
                    deleted_rows: deletes.deleted_rows as u64,
                })
                .collect(),
            trim_wal_through: change.trim_wal_through.map(|position| pb::WalPosition {
                epoch: position.epoch,
                seq: position.sequence,
            }),
            gc_keys: change.retire_keys.clone(),
            set_probes: change
                .set_probes
                .iter()
                .map(|(segment_id, probes)| {
                    quiver_proto::convert::probes_to_proto(segment_id, probes)
                })
                .collect(),
        };
        self.client
            .commit_manifest_change(request)
            .await
            .map_err(|error| catalog_error(shard, epoch, error))?;
        self.manifest(shard).await
    }
}

#[async_trait]
impl GcList for MetaCatalog {
    async fn take_due(&self, limit: u32) -> Result<Vec<String>, CatalogError> {
        let entries = self
            .client
            .take_gc(limit)
            .await
            .map_err(|error| CatalogError::Unavailable(error.to_string()))?;
        Ok(entries.into_iter().map(|entry| entry.object_key).collect())
    }

    async fn acknowledge(&self, object_keys: Vec<String>) -> Result<(), CatalogError> {
        self.client
            .ack_gc(object_keys)
            .await
            .map_err(|error| CatalogError::Unavailable(error.to_string()))?;
        Ok(())
    }
}
