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
            warm_codes(context, segment);
        }
    }
}

/// Pulls a segment's codes into the cache: one read per region they span.
fn warm_codes(context: &ReadContext, segment: &Segment<CachedObject>) {
    let region_bytes = context.cache().region_bytes();
    for section in segment.sections() {
        if section.kind != SectionKind::Codes {
            continue;
        }
        let end = section.offset + section.length;
        let mut offset = section.offset;
        while offset < end {
            if let Err(error) = segment.source().read(offset, 1) {
                tracing::warn!(segment = segment.name(), %error, "warm-up read failed");
                return;
            }
            offset = (offset / region_bytes + 1) * region_bytes;
        }
    }
}
