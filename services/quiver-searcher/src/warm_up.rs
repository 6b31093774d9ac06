//! Warm-up: a shard's new segments have their codes pulled into the cache before
//! the shard is reported ready, so the first queries after an assignment (or a
//! flush) do not wait on object storage for them.

use std::collections::HashSet;

use quiver_blobcache::CachedObject;
use quiver_index::{SectionKind, Segment};

use crate::context::ReadContext;
use crate::shard::ShardView;

/// Warms the segments of `view` that `previous` did not have (all of them on a
/// first load); nothing when the cache reads through (there is nowhere to keep
/// them).
pub(crate) fn warm_new_segments(
    context: &ReadContext,
    view: &ShardView,
    previous: Option<&ShardView>,
) {
    if context.cache().is_read_through() {
        return;
    }
    let known: HashSet<&str> = previous
        .map(|previous| {
            previous
                .manifest()
                .segments
                .iter()
                .map(|entry| entry.key.as_str())
                .collect()
        })
        .unwrap_or_default();
    for (entry, segment) in view.manifest().segments.iter().zip(view.segments()) {
        if !known.contains(entry.key.as_str()) {
            warm_codes(segment);
        }
    }
}

/// Pulls a segment's codes into memory (the cache's regions, or the page cache
/// for a mapped file) before any query needs them.
fn warm_codes(segment: &Segment<CachedObject>) {
    for section in segment.sections() {
        if section.kind != SectionKind::Codes {
            continue;
        }
        let range = section.offset..section.offset + section.length;
        if let Err(error) = segment.source().warm(range) {
            tracing::warn!(segment = segment.name(), %error, "warm-up read failed");
            return;
        }
    }
}
