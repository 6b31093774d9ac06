//! The shard's persisted side as the indexer sees it: live segments with their
//! deletion bitmaps, and the primary-key map (id → segment, row) over them.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use quiver_index::{
    BuildProgress, CalibrationOptions, MemorySource, MmapSource, PointId, Segment, SegmentSpec,
    SegmentWriter, calibrate_nprobe,
};
use quiver_storage::{DeletionBitmap, Storage};
use roaring::RoaringBitmap;

use crate::catalog::SegmentEntry;
use crate::error::{IndexerError, IndexerResult};

/// A live segment and the rows deleted from it.
#[derive(Clone, Debug)]
pub(crate) struct LiveSegment {
    pub entry: SegmentEntry,
    pub deleted: RoaringBitmap,
}

/// Where the persisted copy of an id lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RowRef {
    pub segment_id: Arc<str>,
    pub row: u32,
}

/// Live segments and the primary-key map over their live rows.
#[derive(Debug, Default)]
pub(crate) struct ShardIndex {
    pub segments: HashMap<Arc<str>, LiveSegment>,
    pub primary_keys: HashMap<PointId, RowRef>,
}

impl ShardIndex {
    /// Adds a segment whose row `row` holds `ids[row]`, skipping deleted rows.
    /// An id already mapped elsewhere keeps the segment given later (the newer).
    pub fn add_segment(&mut self, entry: SegmentEntry, deleted: RoaringBitmap, ids: Vec<PointId>) {
        let segment_id: Arc<str> = Arc::from(entry.segment_id.as_str());
        for (row, id) in ids.into_iter().enumerate() {
            if deleted.contains(row as u32) {
                continue;
            }
            self.primary_keys.insert(
                id,
                RowRef {
                    segment_id: segment_id.clone(),
                    row: row as u32,
                },
            );
        }
        self.segments
            .insert(segment_id, LiveSegment { entry, deleted });
    }

    /// Returns the live segment entries (for checks and merge planning).
    pub fn entries(&self) -> impl Iterator<Item = &LiveSegment> {
        self.segments.values()
    }
}

/// A segment built in memory.
pub(crate) struct BuiltSegment {
    pub bytes: Vec<u8>,
    /// Ids in row order.
    pub ids: Vec<PointId>,
    /// The calibrated default `nprobe`.
    pub default_nprobe: u32,
}

/// Builds one segment from `rows` (id, vector, payload JSON bytes) on the
/// calling thread, and calibrates its default `nprobe`.
pub(crate) fn build_segment<'r>(
    spec: &SegmentSpec,
    rows: impl Iterator<Item = (&'r PointId, &'r [f32], &'r [u8])>,
    progress: BuildProgress<'_>,
) -> IndexerResult<BuiltSegment> {
    let mut writer = SegmentWriter::new(spec.clone())?;
    for (id, vector, payload) in rows {
        let payload = parse_payload(payload)?;
        writer.add(id.clone(), vector, payload.as_ref())?;
    }
    let mut bytes = Vec::new();
    writer.finish(&mut bytes, progress)?;
    let segment = Segment::open(MemorySource::new("new segment", &bytes))?;
    let ids = segment.ids()?;
    let calibration = calibrate_nprobe(&segment, &CalibrationOptions::default())?;
    drop(segment);
    Ok(BuiltSegment {
        bytes,
        ids,
        default_nprobe: calibration.nprobe as u32,
    })
}

/// Parses stored payload bytes (empty = no payload).
pub(crate) fn parse_payload(payload: &[u8]) -> IndexerResult<Option<serde_json::Value>> {
    if payload.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(payload)
        .map(Some)
        .map_err(|error| IndexerError::InvalidArgument(format!("payload is not JSON: {error}")))
}

/// A segment downloaded to a local scratch file and opened from its mapping.
pub(crate) struct DownloadedSegment {
    pub segment: Segment<MmapSource>,
    _file: tempfile::NamedTempFile,
}

/// Downloads the segment object `key` (in ranged reads of 64 MiB) into a
/// scratch file under `directory` and opens it.
pub(crate) async fn download_segment(
    storage: &Storage,
    key: &str,
    directory: &Path,
) -> IndexerResult<DownloadedSegment> {
    use std::io::Write;
    const PART_BYTES: u64 = 64 << 20;
    let io_error = |source: std::io::Error| IndexerError::Io {
        path: directory.display().to_string(),
        source,
    };
    let size = storage.head(key).await?.size;
    let mut file = tempfile::Builder::new()
        .prefix("quiver-segment-")
        .tempfile_in(directory)
        .map_err(io_error)?;
    let mut offset = 0;
    while offset < size {
        let range: Range<u64> = offset..(offset + PART_BYTES).min(size);
        let part = storage.get_range(key, range.clone()).await?;
        file.write_all(&part).map_err(io_error)?;
        offset = range.end;
    }
    file.flush().map_err(io_error)?;
    let path = file.path().to_path_buf();
    let name = key.to_string();
    let segment = tokio::task::spawn_blocking(move || -> IndexerResult<_> {
        Ok(Segment::open(MmapSource::open(&path)?.with_name(name))?)
    })
    .await
    .map_err(|error| IndexerError::Internal(format!("segment open task: {error}")))??;
    Ok(DownloadedSegment {
        segment,
        _file: file,
    })
}

/// Reads a deletion bitmap object.
pub(crate) async fn load_deletes(storage: &Storage, key: &str) -> IndexerResult<RoaringBitmap> {
    let bytes = storage.get(key).await?;
    Ok(DeletionBitmap::decode(key, &bytes)?.deleted)
}

/// Encodes a deletion bitmap object.
pub(crate) fn encode_deletes(segment_rows: u32, deleted: &RoaringBitmap) -> Bytes {
    DeletionBitmap {
        segment_rows,
        deleted: deleted.clone(),
    }
    .encode()
}
