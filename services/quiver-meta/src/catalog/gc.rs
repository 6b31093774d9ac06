//! What may be deleted from object storage: the references of every manifest,
//! and the orphan list (objects a sweep found that nothing references).

use std::collections::{BTreeMap, BTreeSet};

use quiver_proto::ErrorCode;

use super::{ApplyResult, Catalog};
use crate::model::{OrphanCandidate, OrphanRecord, Outcome, Rejection, ShardKey};

impl Catalog {
    /// Returns the keys of `keys` that no manifest references and the GC list
    /// does not hold (candidates for the orphan list).
    pub fn unreferenced<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<&'k str> {
        let referenced = self.referenced_keys();
        keys.into_iter()
            .filter(|key| !referenced.contains(key) && !self.gc.contains_key(*key))
            .collect()
    }

    /// Returns every object key some manifest references.
    pub(super) fn referenced_keys(&self) -> BTreeSet<&str> {
        self.shards
            .values()
            .flat_map(|record| record.manifest.referenced_keys())
            .collect()
    }

    pub(super) fn report_orphans(
        &mut self,
        candidates: &[OrphanCandidate],
        grace_ms: u64,
        now_ms: u64,
    ) -> ApplyResult {
        let unreferenced: BTreeSet<&str> = self
            .unreferenced(
                candidates
                    .iter()
                    .map(|candidate| candidate.object_key.as_str()),
            )
            .into_iter()
            .collect();
        let mut orphans = BTreeMap::new();
        let mut new_orphans = 0u32;
        for candidate in candidates {
            if !unreferenced.contains(candidate.object_key.as_str()) {
                continue;
            }
            let record = match self.orphans.get(&candidate.object_key) {
                Some(known) => OrphanRecord {
                    size_bytes: candidate.size_bytes,
                    last_modified_ms: candidate.last_modified_ms,
                    ..known.clone()
                },
                None => {
                    new_orphans += 1;
                    OrphanRecord {
                        size_bytes: candidate.size_bytes,
                        last_modified_ms: candidate.last_modified_ms,
                        first_seen_ms: now_ms,
                        delete_after_ms: now_ms.saturating_add(grace_ms),
                    }
                }
            };
            orphans.insert(candidate.object_key.clone(), record);
        }
        self.orphans = orphans;
        let due = self
            .orphans
            .iter()
            .filter(|(_, record)| record.delete_after_ms <= now_ms)
            .map(|(key, _)| key.clone())
            .collect();
        Ok(Outcome::OrphansReported { new_orphans, due })
    }

    /// Rejects a commit that would bring back an object reported as an orphan
    /// (it may be deleted any moment).
    pub(super) fn check_not_orphaned<'k>(
        &self,
        shard: ShardKey,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(), Rejection> {
        for key in keys {
            if self.orphans.contains_key(key) {
                return Err(Rejection::new(
                    ErrorCode::FailedPrecondition,
                    format!(
                        "object `{key}` committed to shard {shard} was reported as an orphan and may be deleted; write it again under a new key"
                    ),
                ));
            }
        }
        Ok(())
    }
}
