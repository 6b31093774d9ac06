//! Shard leases: the one indexer allowed to write a shard, fenced by an epoch
//! that grows with every takeover.

use quiver_proto::ErrorCode;

use super::{ApplyResult, Catalog, shard_entry};
use crate::model::{Lease, NodeRole, Outcome, Rejection, ShardKey, ShardRecord};

impl Catalog {
    fn shard_mut(&mut self, shard: ShardKey) -> Result<&mut ShardRecord, Rejection> {
        shard_entry(&mut self.shards, shard)
    }

    pub(super) fn acquire_lease(
        &mut self,
        shard: ShardKey,
        node_id: &str,
        ttl_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        if ttl_ms == 0 {
            return Err(Rejection::new(
                ErrorCode::InvalidArgument,
                format!("lease ttl for shard {shard} must be positive"),
            ));
        }
        match self.nodes.get(node_id) {
            None => {
                return Err(Rejection::new(
                    ErrorCode::NotFound,
                    format!("node `{node_id}` is not registered"),
                ));
            }
            Some(node) if node.role != NodeRole::Indexer => {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!("node `{node_id}` is not an indexer and cannot lease shard {shard}"),
                ));
            }
            Some(_) => {}
        }
        let version = self.version + 1;
        let record = self.shard_mut(shard)?;
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        if let Some(lease) = &mut record.lease {
            if lease.holder == node_id {
                lease.expires_at_ms = lease.expires_at_ms.max(expires_at_ms);
                return Ok(Outcome::Lease(lease.clone()));
            }
            if lease.expires_at_ms > now_ms {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "shard {shard} is leased to `{}` at epoch {} until {} ms",
                        lease.holder, lease.epoch, lease.expires_at_ms
                    ),
                ));
            }
        }
        record.epoch += 1;
        let lease = Lease {
            holder: node_id.to_owned(),
            epoch: record.epoch,
            expires_at_ms,
        };
        record.lease = Some(lease.clone());
        record.changed_at_version = version;
        self.version = version;
        Ok(Outcome::Lease(lease))
    }

    pub(super) fn renew_lease(
        &mut self,
        shard: ShardKey,
        node_id: &str,
        epoch: u64,
        ttl_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        let record = self.shard_mut(shard)?;
        let Some(lease) = &mut record.lease else {
            return Err(Rejection::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "shard {shard} has no lease to renew (renewal by `{node_id}` at epoch {epoch}, current epoch {})",
                    record.epoch
                ),
            ));
        };
        if lease.holder != node_id || lease.epoch != epoch {
            return Err(Rejection::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "shard {shard} is leased to `{}` at epoch {}; renewal by `{node_id}` at epoch {epoch} refused",
                    lease.holder, lease.epoch
                ),
            ));
        }
        lease.expires_at_ms = lease.expires_at_ms.max(now_ms.saturating_add(ttl_ms));
        Ok(Outcome::Lease(lease.clone()))
    }
}

/// Rejects a write whose epoch is not the shard's current epoch.
pub(super) fn check_epoch(
    shard: ShardKey,
    record: &ShardRecord,
    epoch: u64,
) -> Result<(), Rejection> {
    if epoch < record.epoch {
        return Err(Rejection::new(
            ErrorCode::FailedPrecondition,
            format!(
                "stale epoch {epoch} for shard {shard}: current epoch is {}",
                record.epoch
            ),
        ));
    }
    if epoch > record.epoch {
        return Err(Rejection::new(
            ErrorCode::FailedPrecondition,
            format!(
                "epoch {epoch} for shard {shard} was never granted: current epoch is {}",
                record.epoch
            ),
        ));
    }
    Ok(())
}
