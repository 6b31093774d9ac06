//! One shard as a searcher serves it ([`ShardView`]): the manifest's segments
//! opened through the region cache, each with the rows it must not return
//! (deleted, or replaced by a newer copy in the WAL tail), plus the WAL tail's
//! points scored exactly. Searching it is `search.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_blobcache::CachedObject;
use quiver_index::{Filter, Metric, PointId, SectionKind, Segment, SegmentSpec};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_storage::manifest::{Manifest, SegmentEntry};
use roaring::RoaringBitmap;
use serde_json::Value;

use crate::context::ReadContext;
use crate::error::SearcherResult;
use crate::tail::Tail;

mod search;

/// One search against a shard.
#[derive(Clone, Debug)]
pub struct SearchRequest {
    /// The query vector.
    pub vector: Vec<f32>,
    /// Hits wanted.
    pub k: usize,
    /// Lists probed per codebook group of segments (`None`: the calibrated default).
    pub nprobe: Option<usize>,
    /// Rescoring guard multiplier (`None`: the default).
    pub rescore: Option<usize>,
    /// Rows must satisfy this filter.
    pub filter: Option<Filter>,
    /// Return each hit's payload.
    pub include_payload: bool,
    /// Return each hit's vector.
    pub include_vector: bool,
}

/// One hit of a shard.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardHit {
    /// Point id.
    pub id: PointId,
    /// Cosine similarity, inner product, or squared distance (by metric).
    pub score: f32,
    /// Payload as its stored JSON text, when asked for and present.
    pub payload: Option<Vec<u8>>,
    /// Vector, when asked for.
    pub vector: Option<Vec<f32>>,
}

/// What one shard search cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueryCost {
    /// Segments searched.
    pub segments: u64,
    /// Rows whose quantized codes were scored.
    pub rows_scanned: u64,
    /// Rows scored with their full vectors (rescoring, or exact filtered search).
    pub rows_rescored: u64,
    /// WAL-tail rows scored exactly.
    pub tail_rows_scored: u64,
    /// Cache regions the search found in the cache.
    pub cache_regions_hit: u64,
    /// Cache regions the search had to fetch from object storage.
    pub cache_regions_missed: u64,
    /// Bytes the search fetched from object storage.
    pub bytes_fetched: u64,
    /// Row-tier reads (raw vectors, payloads) served from the local cache file.
    pub row_reads_local: u64,
    /// Row-tier reads fetched from object storage.
    pub row_reads_remote: u64,
    /// Time the search waited for object storage, milliseconds.
    pub store_wait_ms: f64,
    /// Times the search waited for object storage (see `ReadCounts::store_waits`).
    pub store_waits: u64,
    /// Time spent, milliseconds.
    pub search_ms: f64,
}

/// A point read by id.
#[derive(Clone, Debug, PartialEq)]
pub struct PointRecord {
    /// Point id.
    pub id: PointId,
    /// Payload, if any.
    pub payload: Option<Value>,
    /// Vector, when asked for (unit length for cosine collections).
    pub vector: Option<Vec<f32>>,
}

struct SegmentView {
    entry: SegmentEntry,
    segment: Arc<Segment<CachedObject>>,
    /// Rows never returned: deleted, or replaced/deleted in the WAL tail.
    blocked: RoaringBitmap,
}

/// A shard at one manifest version, ready to answer.
pub struct ShardView {
    manifest: Manifest,
    metric: Metric,
    dimension: usize,
    segments: Vec<SegmentView>,
    /// Segments that share a codebook, searched together (indexes into
    /// `segments`); a segment without a codebook is a group of its own.
    groups: Vec<Vec<usize>>,
    tail: Tail,
}

/// What building a [`ShardView`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Segments opened (new to this shard's view).
    pub segments_opened: u64,
    /// Segments kept open from the previous view.
    pub segments_reused: u64,
    /// WAL-tail objects read into the view (only the new ones when the tail grew).
    pub wal_batches_applied: u64,
}

impl ShardView {
    /// Opens everything `manifest` lists (blocking: run off the async workers).
    pub fn load(
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
    ) -> SearcherResult<ShardView> {
        counted(Self::build(context, spec, manifest, None)).map(|(view, _)| view)
    }

    /// Returns the view of `manifest`, a newer manifest of the shard `previous`
    /// answers from, built incrementally: segments both list stay open (only new
    /// ones are opened), a tail that only grew gets just its new WAL objects
    /// applied, and rows are re-masked only where a deletion bitmap changed or the
    /// tail was trimmed. Blocking: run off the async workers.
    pub fn reload(
        previous: &ShardView,
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
    ) -> SearcherResult<(ShardView, LoadStats)> {
        counted(Self::build(context, spec, manifest, Some(previous)))
    }

    fn build(
        context: &ReadContext,
        spec: &SegmentSpec,
        manifest: Manifest,
        previous: Option<&ShardView>,
    ) -> SearcherResult<(ShardView, LoadStats)> {
        let mut stats = LoadStats::default();
        // The tail grew (same prefix) or was rebuilt (trimmed by a flush).
        let tail_grew = previous.is_some_and(|previous| {
            let old = &previous.manifest.wal_tail;
            manifest.wal_tail.len() >= old.len() && manifest.wal_tail[..old.len()] == old[..]
        });
        let (mut tail, first_new_entry) = match previous {
            Some(previous) if tail_grew => {
                (previous.tail.clone(), previous.manifest.wal_tail.len())
            }
            _ => (Tail::default(), 0),
        };
        let previous_segments: HashMap<&str, &SegmentView> = previous
            .map(|previous| {
                previous
                    .segments
                    .iter()
                    .map(|view| (view.entry.key.as_str(), view))
                    .collect()
            })
            .unwrap_or_default();
        let mut opened = fetch_together(
            context,
            &manifest,
            first_new_entry,
            &previous_segments,
            tail_grew,
        );
        let mut new_tail_ids: Vec<PointId> = Vec::new();
        for entry in &manifest.wal_tail[first_new_entry..] {
            let batch = context.wal_batch(&entry.key)?;
            stats.wal_batches_applied += 1;
            tail.apply(&entry.key, &batch.records, spec.metric, spec.dim)?;
            new_tail_ids.extend(batch.records.iter().map(|record| record.id().clone()));
        }
        let mut segments = Vec::with_capacity(manifest.segments.len());
        for entry in &manifest.segments {
            let view = match previous_segments.get(entry.key.as_str()) {
                Some(old) => {
                    stats.segments_reused += 1;
                    let same_deletes = old.entry.deletes.as_ref().map(|deletes| &deletes.key)
                        == entry.deletes.as_ref().map(|deletes| &deletes.key);
                    let blocked = if same_deletes && tail_grew {
                        let mut blocked = old.blocked.clone();
                        block_rows(&old.segment, &new_tail_ids, &mut blocked)?;
                        blocked
                    } else {
                        masked_rows(context, entry, &old.segment, tail.newest.keys())?
                    };
                    SegmentView {
                        entry: entry.clone(),
                        segment: old.segment.clone(),
                        blocked,
                    }
                }
                None => {
                    stats.segments_opened += 1;
                    let segment = match opened.remove(&entry.key) {
                        Some(segment) => segment?,
                        None => context.open_segment(entry)?,
                    };
                    let blocked = masked_rows(context, entry, &segment, tail.newest.keys())?;
                    SegmentView {
                        entry: entry.clone(),
                        segment,
                        blocked,
                    }
                }
            };
            segments.push(view);
        }
        let groups = codebook_groups(&segments);
        let view = ShardView {
            manifest,
            metric: spec.metric,
            dimension: spec.dim,
            segments,
            groups,
            tail,
        };
        Ok((view, stats))
    }

    /// Returns the opened segments.
    pub fn segments(&self) -> impl Iterator<Item = &Segment<CachedObject>> {
        self.segments.iter().map(|view| view.segment.as_ref())
    }

    /// Returns how many groups of segments a search ranks centroids for (one
    /// per codebook, plus one per segment without a codebook).
    pub fn codebook_groups(&self) -> usize {
        self.groups.len()
    }

    /// Returns the manifest this view answers from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Returns the live points (deletions and replacements applied).
    pub fn live_points(&self) -> u64 {
        let in_segments: u64 = self
            .segments
            .iter()
            .map(|view| view.segment.rows() - view.blocked.len())
            .sum();
        in_segments + self.tail.live_rows()
    }

    /// Returns the rows of the WAL tail (not yet in a segment).
    pub fn wal_tail_rows(&self) -> u64 {
        self.manifest
            .wal_tail
            .iter()
            .map(|entry| entry.rows as u64)
            .sum()
    }

    /// Returns the bytes of the live segments.
    pub fn segment_bytes(&self) -> u64 {
        self.segments.iter().map(|view| view.entry.size_bytes).sum()
    }

    /// Reads points by id; ids that do not exist are left out.
    pub fn get(&self, ids: &[PointId], include_vector: bool) -> SearcherResult<Vec<PointRecord>> {
        counted(self.get_counting(ids, include_vector))
    }

    fn get_counting(
        &self,
        ids: &[PointId],
        include_vector: bool,
    ) -> SearcherResult<Vec<PointRecord>> {
        let mut found = Vec::new();
        for id in ids {
            if let Some(newest) = self.tail.get(id) {
                if let Some((vector, payload)) = newest {
                    found.push(PointRecord {
                        id: id.clone(),
                        payload: payload.cloned(),
                        vector: include_vector.then(|| vector.to_vec()),
                    });
                }
                continue;
            }
            for view in &self.segments {
                let Some(row) = view.segment.row_of(id)? else {
                    continue;
                };
                if view.blocked.contains(row) {
                    continue;
                }
                found.push(PointRecord {
                    id: id.clone(),
                    payload: view.segment.payload(row)?,
                    vector: if include_vector {
                        Some(view.segment.vector(row)?)
                    } else {
                        None
                    },
                });
                break;
            }
        }
        Ok(found)
    }
}

/// Groups segments by the codebook they were built with, in manifest order.
fn codebook_groups(segments: &[SegmentView]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_codebook: HashMap<u64, usize> = HashMap::new();
    for (index, view) in segments.iter().enumerate() {
        match view.segment.header().codebook {
            Some(codebook) => match by_codebook.get(&codebook.id) {
                Some(&group) => groups[group].push(index),
                None => {
                    by_codebook.insert(codebook.id, groups.len());
                    groups.push(vec![index]);
                }
            },
            None => groups.push(vec![index]),
        }
    }
    groups
}

/// Counts a damaged object (segment, bitmap, WAL object) met by a read: the
/// error names it, and no answer is served from it.
/// Most object-store reads one view build has in flight.
const BUILD_FETCHES: usize = 16;

/// Reads what building the view of `manifest` needs from object storage, all
/// at once rather than one after another: the new WAL-tail objects and the
/// deletion bitmaps (into the context's caches, where the build then finds
/// them; a failure is left for the build to meet and report) and the segments
/// `previous_segments` does not have open (returned by key). A cold shard of
/// many segments is then loaded after about one round trip, not one per object.
fn fetch_together(
    context: &ReadContext,
    manifest: &Manifest,
    first_new_entry: usize,
    previous_segments: &HashMap<&str, &SegmentView>,
    tail_grew: bool,
) -> HashMap<String, SearcherResult<Arc<Segment<CachedObject>>>> {
    enum Fetch<'a> {
        Wal(&'a str),
        Bitmap(&'a str),
        Segment(&'a SegmentEntry),
    }
    let mut fetches: Vec<Fetch<'_>> = manifest.wal_tail[first_new_entry..]
        .iter()
        .map(|entry| Fetch::Wal(entry.key.as_str()))
        .collect();
    for entry in &manifest.segments {
        let old = previous_segments.get(entry.key.as_str());
        if old.is_none() {
            fetches.push(Fetch::Segment(entry));
        }
        // As `build` decides: a kept segment re-reads its bitmap only when it
        // changed or the tail was rebuilt.
        let reads_bitmap = old.is_none_or(|old| {
            !tail_grew
                || old.entry.deletes.as_ref().map(|deletes| &deletes.key)
                    != entry.deletes.as_ref().map(|deletes| &deletes.key)
        });
        if reads_bitmap && let Some(deletes) = &entry.deletes {
            fetches.push(Fetch::Bitmap(deletes.key.as_str()));
        }
    }
    let masks_tail_ids = !manifest.wal_tail.is_empty();
    // One object alone gains nothing from another thread.
    if fetches.len() <= 1 {
        return HashMap::new();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let opened = std::sync::Mutex::new(HashMap::new());
    std::thread::scope(|scope| {
        for _ in 0..fetches.len().min(BUILD_FETCHES) {
            scope.spawn(|| {
                while let Some(fetch) =
                    fetches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    match fetch {
                        Fetch::Wal(key) => drop(context.wal_batch(key)),
                        Fetch::Bitmap(key) => drop(context.bitmap(key)),
                        Fetch::Segment(entry) => {
                            let segment = context.open_segment(entry);
                            // The build looks up the tail's ids in the segment.
                            if masks_tail_ids && let Ok(segment) = &segment {
                                warm_section(segment, SectionKind::IdLookup);
                            }
                            opened
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .insert(entry.key.clone(), segment);
                        }
                    }
                }
            });
        }
    });
    opened.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Brings section `kind` of `segment` into the cache (a failed read is left
/// for the reader that needs it to meet).
fn warm_section(segment: &Segment<CachedObject>, kind: SectionKind) {
    for section in segment
        .sections()
        .iter()
        .filter(|section| section.kind == kind)
    {
        let _ = segment
            .source()
            .warm(section.offset..section.offset + section.length);
    }
}

fn counted<T>(result: SearcherResult<T>) -> SearcherResult<T> {
    if let Err(error) = &result
        && error.error_code() == ErrorCode::DataLoss
    {
        crate::metrics::METRICS.corrupted_objects.inc();
    }
    result
}

/// Rows of `segment` never to return: its deletion bitmap, plus the rows of ids
/// the WAL tail holds a newer copy (or a delete) of.
fn masked_rows<'i>(
    context: &ReadContext,
    entry: &SegmentEntry,
    segment: &Segment<CachedObject>,
    tail_ids: impl Iterator<Item = &'i PointId>,
) -> SearcherResult<RoaringBitmap> {
    let mut blocked = match &entry.deletes {
        Some(deletes) => (*context.bitmap(&deletes.key)?).clone(),
        None => RoaringBitmap::new(),
    };
    for id in tail_ids {
        if let Some(row) = segment.row_of(id)? {
            blocked.insert(row);
        }
    }
    Ok(blocked)
}

/// Adds the rows of `ids` in `segment` to `blocked`.
fn block_rows(
    segment: &Segment<CachedObject>,
    ids: &[PointId],
    blocked: &mut RoaringBitmap,
) -> SearcherResult<()> {
    for id in ids {
        if let Some(row) = segment.row_of(id)? {
            blocked.insert(row);
        }
    }
    Ok(())
}
