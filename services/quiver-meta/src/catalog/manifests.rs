//! Manifests: WAL commits and manifest changes, fenced by the shard's lease
//! epoch and then applied by the shared model's rules (`quiver_model::manifest`),
//! the same rules the write path's in-memory test catalog applies.

use quiver_model::manifest::{ChangeOutcome, WalCommit, apply_change};
use quiver_model::{WalEntry, WalPosition};

use super::leases::check_epoch;
use super::{ApplyResult, Catalog, shard_entry};
use crate::model::{Outcome, ShardKey, ShardManifestChange};

impl Catalog {
    pub(super) fn commit_wal(
        &mut self,
        shard: ShardKey,
        epoch: u64,
        seq: u64,
        object_key: &str,
        rows: u64,
    ) -> ApplyResult {
        let version = self.version + 1;
        let gc = &self.gc;
        let record = shard_entry(&mut self.shards, shard)?;
        check_epoch(shard, record, epoch)?;
        let entry = WalEntry {
            position: WalPosition {
                epoch,
                sequence: seq,
            },
            key: object_key.to_owned(),
            rows: u32::try_from(rows).unwrap_or(u32::MAX),
        };
        let commit = record
            .manifest
            .commit_wal(&shard, entry, |key| gc.contains_key(key))?;
        let manifest_version = record.manifest.version;
        if commit == WalCommit::Appended {
            record.changed_at_version = version;
            self.version = version;
        }
        Ok(Outcome::WalCommitted {
            manifest_version,
            duplicate: commit == WalCommit::Duplicate,
        })
    }

    pub(super) fn commit_manifest_change(
        &mut self,
        change: &ShardManifestChange,
        delete_after_ms: u64,
    ) -> ApplyResult {
        let shard = change.shard;
        let version = self.version + 1;
        let gc = &self.gc;
        let record = shard_entry(&mut self.shards, shard)?;
        check_epoch(shard, record, change.epoch)?;
        let outcome = apply_change(&mut record.manifest, &shard, &change.change, |key| {
            gc.contains_key(key)
        })?;
        let manifest_version = record.manifest.version;
        let ChangeOutcome::Applied { retired_keys } = outcome else {
            return Ok(Outcome::ManifestCommitted {
                manifest_version,
                duplicate: true,
            });
        };
        record.changed_at_version = version;
        self.version = version;
        for key in retired_keys {
            // The GC list owns it now (it has its own grace period).
            self.orphans.remove(&key);
            self.gc.insert(key, delete_after_ms);
        }
        Ok(Outcome::ManifestCommitted {
            manifest_version,
            duplicate: false,
        })
    }
}
