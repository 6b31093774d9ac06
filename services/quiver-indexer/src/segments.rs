//! The shard's persisted side as the indexer sees it: live segments with their
//! deletion bitmaps, and the primary-key map (id → segment, row) over them.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use quiver_index::{
    BuildProgress, CalibrationOptions, Codebook, MmapSource, PointId, Segment, SegmentSpec,
    SegmentWriter, calibrate_nprobe, default_nprobe,
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
    /// Id of the codebook it was built with (`None`: written before codebooks).
    pub codebook_id: Option<u64>,
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
    /// The codebook new segments are built with (the one trained on the most
    /// rows so far); `None` until the first segment is built.
    pub codebook: Option<ShardCodebook>,
}

/// A build retrains the codebook once it has this many times the rows the
/// current codebook was trained on: the lists are then sized for the shard
/// as it has grown, and later segments share the new codebook.
pub(crate) const CODEBOOK_RETRAIN_GROWTH: u64 = 2;

/// A shard's codebook and the `nprobe` calibrated when it was trained: every
/// segment built with it records that `nprobe`, since searchers probe the
/// codebook's lists across all those segments at once.
#[derive(Clone, Debug)]
pub(crate) struct ShardCodebook {
    pub codebook: Arc<Codebook>,
    pub nprobe: u32,
}

impl ShardCodebook {
    /// Returns the codebook `segment` was built with, and the `nprobe` its
    /// manifest entry records (the default for its lists when it records none).
    pub fn of_segment<S: quiver_index::ByteSource>(
        segment: &Segment<S>,
        entry: &SegmentEntry,
    ) -> Option<ShardCodebook> {
        let codebook = Codebook::of_segment(segment)?;
        let nprobe = entry
            .default_nprobe
            .unwrap_or_else(|| default_nprobe(codebook.nlist()) as u32);
        Some(ShardCodebook {
            codebook: Arc::new(codebook),
            nprobe,
        })
    }

    /// Returns the codebook a build of `rows` rows should use: this one,
    /// unless the build has outgrown it (then a new one is trained).
    pub fn for_build(current: Option<&ShardCodebook>, rows: usize) -> Option<ShardCodebook> {
        current
            .filter(|current| {
                rows as u64 <= current.codebook.trained_rows() * CODEBOOK_RETRAIN_GROWTH
            })
            .cloned()
    }
}

impl ShardIndex {
    /// Adds a segment built with codebook `codebook_id` whose row `row` holds
    /// `ids[row]`, skipping deleted rows. An id already mapped elsewhere keeps the
    /// segment given later (the newer).
    pub fn add_segment(
        &mut self,
        entry: SegmentEntry,
        deleted: RoaringBitmap,
        ids: Vec<PointId>,
        codebook_id: Option<u64>,
    ) {
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
        self.segments.insert(
            segment_id,
            LiveSegment {
                entry,
                deleted,
                codebook_id,
            },
        );
    }

    /// Makes `candidate` the shard's codebook when it was trained on more rows
    /// than the current one (or there is none).
    pub fn offer_codebook(&mut self, candidate: ShardCodebook) {
        let better = self.codebook.as_ref().is_none_or(|current| {
            candidate.codebook.trained_rows() > current.codebook.trained_rows()
        });
        if better {
            self.codebook = Some(candidate);
        }
    }

    /// Returns the live segment entries (for checks and merge planning).
    pub fn entries(&self) -> impl Iterator<Item = &LiveSegment> {
        self.segments.values()
    }
}

/// A segment built into an unnamed scratch file: `bytes` is the file's
/// mapping (page cache, not heap), so uploading a segment of gigabytes holds
/// no copy of it in memory; the file goes away with the last clone of `bytes`.
pub(crate) struct BuiltSegment {
    pub bytes: Bytes,
    /// Ids in row order.
    pub ids: Vec<PointId>,
    /// The default `nprobe` of its codebook's lists.
    pub default_nprobe: u32,
    /// The codebook it was built with.
    pub codebook: ShardCodebook,
}

/// One segment being built on the calling (blocking) thread. With the shard's
/// `codebook` (see [`ShardCodebook::for_build`]) the rows join its lists and
/// the segment records its `nprobe`; without, a codebook is trained from the
/// rows and its `nprobe` calibrated on them. The rows added wait in scratch
/// files under the scratch directory, so a build's memory does not grow with
/// the rows' vectors and payloads.
pub(crate) struct SegmentBuild {
    writer: SegmentWriter,
    codebook: Option<ShardCodebook>,
    scratch_dir: PathBuf,
}

impl SegmentBuild {
    pub fn new(
        spec: &SegmentSpec,
        codebook: Option<ShardCodebook>,
        scratch_dir: &Path,
    ) -> IndexerResult<Self> {
        let mut spec = spec.clone();
        spec.build.codebook = codebook.as_ref().map(|shared| shared.codebook.clone());
        Ok(SegmentBuild {
            writer: SegmentWriter::with_scratch_dir(spec, scratch_dir)?,
            codebook,
            scratch_dir: scratch_dir.to_path_buf(),
        })
    }

    /// Adds one row (payload as stored JSON bytes, empty for none).
    pub fn add(&mut self, id: &PointId, vector: &[f32], payload: &[u8]) -> IndexerResult<()> {
        let payload = parse_payload(payload)?;
        Ok(self.writer.add(id.clone(), vector, payload.as_ref())?)
    }

    /// Writes the segment to a scratch file and opens it from its mapping.
    pub fn finish(self, progress: BuildProgress<'_>) -> IndexerResult<BuiltSegment> {
        use std::io::Write;
        let scratch = self.scratch_dir.display().to_string();
        let io_error = |source: std::io::Error| IndexerError::Io {
            path: scratch.clone(),
            source,
        };
        let file = tempfile::tempfile_in(&self.scratch_dir).map_err(io_error)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        self.writer.finish(&mut out, progress)?;
        out.flush().map_err(io_error)?;
        let file = out
            .into_inner()
            .map_err(|error| io_error(error.into_error()))?;
        let source = MmapSource::map_file(&file, "new segment")?;
        // A second mapping of the same pages, owned by the upload's bytes.
        // SAFETY: the file is unnamed and finished; nothing writes to it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?;
        let bytes = Bytes::from_owner(map);
        let segment = Segment::open(source)?;
        let ids = segment.ids()?;
        let codebook = match self.codebook {
            Some(shared) => shared,
            None => {
                let calibration = calibrate_nprobe(&segment, &CalibrationOptions::default())?;
                ShardCodebook {
                    codebook: Arc::new(Codebook::of_segment(&segment).ok_or_else(|| {
                        IndexerError::Internal("a new segment carries no codebook".into())
                    })?),
                    nprobe: calibration.nprobe as u32,
                }
            }
        };
        Ok(BuiltSegment {
            bytes,
            ids,
            default_nprobe: codebook.nprobe,
            codebook,
        })
    }
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

/// Reads what a shard writer keeps of the segment `entry` when it opens — its
/// row ids and its codebook — with ranged reads of the object
/// ([`crate::ranged::RangedSource`]), not a download of the whole segment.
pub(crate) async fn read_ids_and_codebook(
    storage: &Storage,
    entry: &SegmentEntry,
) -> IndexerResult<(Vec<PointId>, Option<ShardCodebook>)> {
    let size = if entry.size_bytes > 0 {
        entry.size_bytes
    } else {
        storage.head(&entry.key).await?.size
    };
    let (storage, entry, runtime) = (
        storage.clone(),
        entry.clone(),
        tokio::runtime::Handle::current(),
    );
    tokio::task::spawn_blocking(move || -> IndexerResult<_> {
        let source = crate::ranged::RangedSource::new(storage, &entry.key, size, runtime);
        let segment = Segment::open(source)?;
        let ids = segment.ids()?;
        let codebook = ShardCodebook::of_segment(&segment, &entry);
        tracing::debug!(
            segment = %entry.key,
            rows = ids.len(),
            fetched = segment.source().bytes_fetched(),
            size,
            "segment keys read"
        );
        Ok((ids, codebook))
    })
    .await
    .map_err(|error| IndexerError::Internal(format!("segment key read task: {error}")))?
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
