//! The manifest model (which objects make up a shard) lives in `quiver-model`,
//! with the one set of rules every catalog applies; re-exported here under its
//! old path.

pub use quiver_model::manifest::{
    ChangeOutcome, DeletesEntry, Manifest, ManifestChange, ManifestError, SegmentEntry,
    SegmentProbes, WalCommit, WalEntry, WalPosition, apply_change,
};
pub use quiver_model::shard::ShardRef;
