//! Warm-up: a shard's new segments have their codes pulled into the cache before
//! the shard is reported ready, so the first queries after an assignment (or a
//! flush) do not wait on object storage for them. Their raw vectors and payloads
//! follow in the background once the new view serves ([`warm_new_rows`]), when
//! they fit the row tier comfortably: otherwise the first queries after a merge
//! would each fetch their rescoring rows from the store, one cold row at a time.
//!
//! A segment that is a local file mapped as it is (`quiver standalone`, a
//! `file://` store) has no row tier: the page cache keeps its rows. Those of
//! its new segments that fit a quarter of the memory together
//! ([`rows_memory_budget`]) are
//! held as huge pages — advised before the view serves, read in with the rows'
//! warm-up ([`hold_new_rows`]) — and the others are read at random, a 4 KiB
//! page per cold row.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::LazyLock;

use quiver_blobcache::{CachedObject, ReadCounts, held_row_bytes};
use quiver_index::{SectionKind, Segment};

use crate::context::ReadContext;
use crate::shard::ShardView;
use quiver_common::rows_memory_budget;

/// Warms the codes of the segments of `view` that `previous` did not have (all
/// of them on a first load); nothing when the cache reads through (there is
/// nowhere to keep them). Returns the bytes fetched from the store.
pub fn warm_new_segments(
    context: &ReadContext,
    view: &ShardView,
    previous: Option<&ShardView>,
) -> u64 {
    hold_new_rows(view, previous);
    if context.cache().is_read_through() {
        return 0;
    }
    let segments: Vec<&Segment<CachedObject>> = new_segments(view, previous).collect();
    if segments.len() <= 1 {
        return segments.into_iter().map(warm_codes).sum();
    }
    // Segments side by side (each with its own fills in flight): a cold shard's
    // codes arrive in the time of its largest segment's, not of all of them in turn.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let fetched = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..segments.len().min(SEGMENTS_WARMED_TOGETHER) {
            scope.spawn(|| {
                while let Some(segment) =
                    segments.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    fetched.fetch_add(warm_codes(segment), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    fetched.into_inner()
}

/// Segments whose codes are warmed at the same time (each keeps the cache's
/// own few fills in flight).
const SEGMENTS_WARMED_TOGETHER: usize = 4;

/// The segments of `view` that `previous` did not have (all of them without one).
fn new_segments<'a>(
    view: &'a ShardView,
    previous: Option<&ShardView>,
) -> impl Iterator<Item = &'a Segment<CachedObject>> {
    new_entries(view, previous).map(|(_, segment)| segment)
}

/// [`new_segments`] with their object keys.
fn new_entries<'a>(
    view: &'a ShardView,
    previous: Option<&ShardView>,
) -> impl Iterator<Item = (&'a str, &'a Segment<CachedObject>)> {
    let known: HashSet<String> = previous
        .map(|previous| {
            previous
                .manifest()
                .segments
                .iter()
                .map(|entry| entry.key.clone())
                .collect()
        })
        .unwrap_or_default();
    view.manifest()
        .segments
        .iter()
        .zip(view.segments())
        .filter(move |(entry, _)| !known.contains(&entry.key))
        .map(|(entry, segment)| (entry.key.as_str(), segment))
}

/// The ranges of a segment's object read a row at a time: raw vectors and
/// payloads.
fn row_sections(segment: &Segment<CachedObject>) -> impl Iterator<Item = Range<u64>> + '_ {
    segment
        .sections()
        .iter()
        .filter(|section| {
            matches!(
                section.kind,
                SectionKind::RawVectors | SectionKind::Payloads
            )
        })
        .map(|section| section.offset..section.offset + section.length)
}

/// Bytes of rows mapped segment files may hold as huge pages, all shards'
/// segments together ([`rows_memory_budget`]: a quarter of the memory).
static HELD_ROWS_BUDGET: LazyLock<u64> = LazyLock::new(rows_memory_budget);

/// Holds the rows of the new segments of `view` that are mapped local files
/// in memory as huge pages ([`CachedObject::hold_rows`]), a segment at a time
/// while the rows held by every open segment stay within
/// [`HELD_ROWS_BUDGET`]; before the view serves, so no query reads one of
/// their rows in as a small folio first. A segment that does not fit keeps
/// its rows read at random (data larger than memory). Their warm-up follows
/// in [`warm_new_rows`].
fn hold_new_rows(view: &ShardView, previous: Option<&ShardView>) {
    let budget = *HELD_ROWS_BUDGET;
    for (key, segment) in new_entries(view, previous) {
        let source = segment.source();
        if !source.is_mapped() {
            continue;
        }
        let bytes: u64 = row_sections(segment)
            .map(|range| range.end - range.start)
            .sum();
        if held_row_bytes() + bytes > budget {
            tracing::debug!(
                segment = key,
                rows_mib = bytes >> 20,
                held_mib = held_row_bytes() >> 20,
                budget_mib = budget >> 20,
                "rows read at random: holding them would pass a quarter of the memory"
            );
            continue;
        }
        for range in row_sections(segment) {
            source.hold_rows(range);
        }
    }
}

/// Reads in the rows [`hold_new_rows`] held for the new segments of `view`
/// (2 MiB at a fault), stopping at a segment `still_served` no longer has.
fn warm_held_rows(
    view: &ShardView,
    previous: Option<&ShardView>,
    still_served: &dyn Fn(&str) -> bool,
) {
    for (key, segment) in new_entries(view, previous) {
        let source = segment.source();
        if !source.holds_rows() {
            continue;
        }
        for range in row_sections(segment) {
            // A mapped file fetches nothing from the store.
            warm_in_chunks(key, range, still_served, |chunk| {
                let _ = source.warm(chunk);
            });
        }
    }
}

/// Warms `range` of segment `key` with `warm`, [`ROW_WARM_CHUNK`] bytes at a
/// time, stopping as soon as `still_served` says a newer view no longer has
/// the segment.
fn warm_in_chunks(
    key: &str,
    range: Range<u64>,
    still_served: &dyn Fn(&str) -> bool,
    warm: impl Fn(Range<u64>),
) {
    let mut start = range.start;
    while start < range.end {
        if !still_served(key) {
            tracing::debug!(
                segment = key,
                "row warm-up stopped: the segment was retired"
            );
            return;
        }
        let end = (start + ROW_WARM_CHUNK).min(range.end);
        warm(start..end);
        start = end;
    }
}

/// Share of the row tier one reload's new rows may take when warmed (more would
/// evict the rows other segments' queries are reading).
const ROW_WARM_SHARE: u64 = 4;

/// Brings the raw vectors and payloads of the segments of `view` that `previous`
/// did not have into the cache's row tier (codes first, then rows: this runs
/// after [`warm_new_segments`]), when they take at most a quarter of it. Returns
/// the bytes fetched from the store. Stops warming a segment as soon as
/// `still_served` says a newer view no longer has it (a merge retired it: its
/// object will be deleted, and its rows would only evict live ones); checked
/// every [`ROW_WARM_CHUNK`] bytes.
pub fn warm_new_rows(
    context: &ReadContext,
    view: &ShardView,
    previous: Option<&ShardView>,
    still_served: &dyn Fn(&str) -> bool,
) -> u64 {
    warm_held_rows(view, previous, still_served);
    let cache = context.cache();
    let budget = cache.row_tier_bytes() / ROW_WARM_SHARE;
    if budget == 0 || cache.is_read_through() {
        return 0;
    }
    let new_rows: Vec<(&str, &Segment<CachedObject>, Range<u64>)> = new_entries(view, previous)
        .filter(|(_, segment)| !segment.source().is_mapped())
        .flat_map(|(key, segment)| row_sections(segment).map(move |range| (key, segment, range)))
        .collect();
    let bytes: u64 = new_rows
        .iter()
        .map(|(_, _, range)| range.end - range.start)
        .sum();
    if bytes == 0 || bytes > budget {
        return 0;
    }
    let before = ReadCounts::of_this_thread();
    for (key, segment, range) in new_rows {
        warm_in_chunks(key, range, still_served, |chunk| {
            segment.source().warm_rows(chunk)
        });
    }
    ReadCounts::of_this_thread().since(before).bytes_fetched
}

/// Bytes of rows warmed between two checks that their segment is still served.
const ROW_WARM_CHUNK: u64 = 8 << 20;

/// Pulls a segment's codes into memory (the cache's regions, or the page cache
/// for a mapped file) before any query needs them; returns the bytes fetched.
fn warm_codes(segment: &Segment<CachedObject>) -> u64 {
    let mut fetched = 0;
    for section in segment.sections() {
        if section.kind != SectionKind::Codes {
            continue;
        }
        let range = section.offset..section.offset + section.length;
        match segment.source().warm(range) {
            Ok(bytes) => fetched += bytes,
            Err(error) => {
                tracing::warn!(segment = segment.name(), %error, "warm-up read failed");
                break;
            }
        }
    }
    fetched
}

/// Logs and counts one warm-up (`what`: codes or rows) of `bytes` fetched in
/// `elapsed`, with its throughput.
pub(crate) fn record_warm_up(shard: &str, what: &str, bytes: u64, elapsed: std::time::Duration) {
    if bytes == 0 {
        return;
    }
    let seconds = elapsed.as_secs_f64();
    crate::metrics::METRICS
        .warm_up_bytes
        .with_label_values(&[what])
        .inc_by(bytes);
    crate::metrics::METRICS
        .warm_up_seconds
        .with_label_values(&[what])
        .inc_by(seconds);
    tracing::info!(
        shard,
        what,
        mib = format!("{:.1}", bytes as f64 / (1 << 20) as f64),
        elapsed_ms = elapsed.as_millis() as u64,
        mib_per_s = format!("{:.0}", bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9)),
        "warm-up fetched"
    );
}
