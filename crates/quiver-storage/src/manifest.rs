//! The manifest model: which objects make up a shard right now (live segments
//! with their deletion bitmaps, and the WAL tail), and the atomic changes the
//! write path makes to it. The metadata service stores it; indexers change it;
//! searchers read it.

use serde::{Deserialize, Serialize};

/// One shard of one collection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardRef {
    /// The collection's id (not its name: a dropped and re-created collection
    /// gets a new id, so its objects never mix with the old ones).
    pub collection_id: String,
    /// Shard number, `0..shards`.
    pub shard: u32,
}

impl std::fmt::Display for ShardRef {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}/{}", self.collection_id, self.shard)
    }
}

/// A position in a shard's write history: WAL batches are ordered by
/// `(epoch, sequence)`; the sequence restarts at 1 in every lease epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct WalPosition {
    /// Lease epoch of the writer.
    pub epoch: u64,
    /// Batch number within the epoch.
    pub sequence: u64,
}

/// A committed WAL object whose rows are not in a segment yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalEntry {
    /// Where the batch sits in the history.
    pub position: WalPosition,
    /// Object key.
    pub key: String,
    /// Records in the batch.
    pub rows: u32,
}

/// A segment's deletion bitmap at one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletesEntry {
    /// Object key of the bitmap.
    pub key: String,
    /// Version (increases with every new bitmap of the segment).
    pub version: u64,
    /// Rows deleted.
    pub deleted_rows: u32,
}

/// A live segment of a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Unique id within the shard.
    pub segment_id: String,
    /// Object key.
    pub key: String,
    /// Rows in the segment (deleted ones included).
    pub rows: u32,
    /// Object size.
    pub size_bytes: u64,
    /// The current deletion bitmap, if any row is deleted.
    pub deletes: Option<DeletesEntry>,
    /// Lists to probe when a query does not say: calibrated on the segment's own
    /// data when it was built (`None`: the index's size-based default).
    #[serde(default)]
    pub default_nprobe: Option<u32>,
}

impl SegmentEntry {
    /// Returns the rows not deleted.
    pub fn live_rows(&self) -> u32 {
        self.rows
            - self
                .deletes
                .as_ref()
                .map_or(0, |deletes| deletes.deleted_rows)
    }
}

/// A shard's manifest: what a searcher must read to answer from the shard.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Increases with every change.
    pub version: u64,
    /// Live segments.
    pub segments: Vec<SegmentEntry>,
    /// Committed WAL batches not in any segment yet, in history order.
    pub wal_tail: Vec<WalEntry>,
    /// The last WAL position ever committed (kept after the tail is trimmed).
    #[serde(default)]
    pub last_committed: Option<WalPosition>,
}

/// One atomic change of a manifest (a flush or a merge).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestChange {
    /// Segments added.
    pub add_segments: Vec<SegmentEntry>,
    /// Ids of segments removed.
    pub remove_segments: Vec<String>,
    /// New deletion bitmaps of existing segments: `(segment_id, bitmap)`.
    pub set_deletes: Vec<(String, DeletesEntry)>,
    /// Drop WAL tail entries up to and including this position.
    pub trim_wal_through: Option<WalPosition>,
    /// Objects no longer referenced once this change commits (to delete after
    /// a grace period).
    pub retire_keys: Vec<String>,
}

/// Applies `change` to `manifest` (the rules every catalog implements), or
/// says why it cannot apply.
pub fn apply_change(manifest: &mut Manifest, change: &ManifestChange) -> Result<(), String> {
    for removed in &change.remove_segments {
        if !manifest
            .segments
            .iter()
            .any(|segment| &segment.segment_id == removed)
        {
            return Err(format!("segment {removed} is not in the manifest"));
        }
    }
    for (segment_id, _) in &change.set_deletes {
        let known = manifest
            .segments
            .iter()
            .chain(&change.add_segments)
            .any(|segment| &segment.segment_id == segment_id);
        if !known || change.remove_segments.contains(segment_id) {
            return Err(format!(
                "deletes for segment {segment_id}, which is not live"
            ));
        }
    }
    for added in &change.add_segments {
        if manifest
            .segments
            .iter()
            .any(|segment| segment.segment_id == added.segment_id)
        {
            return Err(format!("segment {} is already live", added.segment_id));
        }
    }
    manifest
        .segments
        .retain(|segment| !change.remove_segments.contains(&segment.segment_id));
    manifest
        .segments
        .extend(change.add_segments.iter().cloned());
    for (segment_id, deletes) in &change.set_deletes {
        if let Some(segment) = manifest
            .segments
            .iter_mut()
            .find(|segment| &segment.segment_id == segment_id)
        {
            segment.deletes = Some(deletes.clone());
        }
    }
    if let Some(through) = change.trim_wal_through {
        manifest.wal_tail.retain(|entry| entry.position > through);
    }
    manifest.version += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(id: &str) -> SegmentEntry {
        SegmentEntry {
            segment_id: id.into(),
            key: format!("k/{id}"),
            rows: 10,
            size_bytes: 100,
            deletes: None,
            default_nprobe: None,
        }
    }

    fn wal(sequence: u64) -> WalEntry {
        WalEntry {
            position: WalPosition { epoch: 1, sequence },
            key: format!("w/{sequence}"),
            rows: 1,
        }
    }

    #[test]
    fn changes_apply_atomically_or_not_at_all() {
        let mut manifest = Manifest {
            version: 3,
            segments: vec![segment("a")],
            wal_tail: vec![wal(1), wal(2), wal(3)],
            last_committed: None,
        };
        let deletes = DeletesEntry {
            key: "d/a-1".into(),
            version: 1,
            deleted_rows: 2,
        };
        let change = ManifestChange {
            add_segments: vec![segment("b")],
            set_deletes: vec![("a".into(), deletes.clone())],
            trim_wal_through: Some(WalPosition {
                epoch: 1,
                sequence: 2,
            }),
            ..Default::default()
        };
        apply_change(&mut manifest, &change).unwrap();
        assert_eq!(manifest.version, 4);
        assert_eq!(manifest.segments.len(), 2);
        assert_eq!(manifest.segments[0].deletes, Some(deletes));
        assert_eq!(manifest.segments[0].live_rows(), 8);
        assert_eq!(manifest.wal_tail, vec![wal(3)]);

        let before = manifest.clone();
        for bad in [
            ManifestChange {
                remove_segments: vec!["zzz".into()],
                ..Default::default()
            },
            ManifestChange {
                add_segments: vec![segment("a")],
                ..Default::default()
            },
            ManifestChange {
                remove_segments: vec!["a".into()],
                set_deletes: vec![("a".into(), before.segments[0].deletes.clone().unwrap())],
                ..Default::default()
            },
        ] {
            assert!(apply_change(&mut manifest, &bad).is_err());
            assert_eq!(manifest, before, "a refused change changes nothing");
        }
    }
}
