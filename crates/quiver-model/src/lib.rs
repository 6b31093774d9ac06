//! Quiver's data model, one definition for every role: plain serde types and the
//! deterministic rules over them, no I/O and no engine.
//!
//! - [`spec`]: what a collection is ([`CollectionSpec`], [`Metric`], [`IdType`],
//!   [`FieldKind`], [`VectorPrecision`], [`PayloadField`], [`IndexParams`],
//!   [`Collection`]).
//! - [`point`]: [`PointId`] and [`shard_of`], the routing of an id to its shard
//!   (part of the data format: stored points are where it says).
//! - [`shard`]: the names of a shard, [`ShardKey`] (numeric collection id, the
//!   catalog's) and [`ShardRef`] (textual, the object layout's).
//! - [`manifest`]: which objects make up a shard ([`Manifest`], [`SegmentEntry`],
//!   [`DeletesEntry`], [`WalEntry`], [`WalPosition`]), the atomic
//!   [`ManifestChange`], and the rules every catalog applies
//!   ([`Manifest::commit_wal`], [`apply_change`]): the metadata service and the
//!   write path's in-memory test catalog run the same code.
//!
//! The serde forms are what the metadata service keeps in its Raft log and
//! snapshots: fields may be added (with a default), never renamed.

pub mod manifest;
pub mod point;
pub mod shard;
pub mod spec;

pub use manifest::{
    ChangeOutcome, DeletesEntry, Manifest, ManifestChange, ManifestError, SegmentEntry,
    SegmentProbes, WalCommit, WalEntry, WalPosition, apply_change,
};
pub use point::{PointId, shard_of};
pub use shard::{ShardKey, ShardRef};
pub use spec::{
    Collection, CollectionSpec, FieldKind, IdType, IndexParams, Metric, ParseMetricError,
    PayloadField, VectorPrecision,
};
