//! The shard's persisted side as the indexer sees it: live segments with their
//! deletion bitmaps, and the primary-key map (id → segment, row) over them.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use quiver_index::{
    BuildProgress, Calibration, CalibrationOptions, Codebook, MmapSource, PointId, Segment,
    SegmentSpec, SegmentWriter, calibrate_group, default_nprobe,
};
use quiver_storage::{DeletionBitmap, Storage};
use roaring::RoaringBitmap;

use crate::catalog::{SegmentEntry, SegmentProbes};
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

/// A build that rewrites every segment of the shard (a consolidation, a
/// codebook refresh, the tiered merge of the last few) retrains sooner: once it
/// has a third more rows than the codebook was trained on (rows × 3 > trained ×
/// 4). It reads every row anyway, and lists trained on all of the shard's rows
/// reach a recall scanning fewer of them: on real 100k × 384, a shard settled
/// under a codebook trained on its first half scanned 10–14 % more rows than one
/// trained on all 100k for the same recall (27.3k against 24.7k rows at 0.973).
pub(crate) const CODEBOOK_REWRITE_RETRAIN_GROWTH: (u64, u64) = (4, 3);

/// A shard's codebook and the `nprobe` calibrated when it was trained: every
/// segment built with it records that `nprobe`, since searchers probe the
/// codebook's lists across all those segments at once.
#[derive(Clone, Debug)]
pub(crate) struct ShardCodebook {
    pub codebook: Arc<Codebook>,
    pub nprobe: u32,
    /// The calibrated distance ratio, in thousandths (see
    /// `SegmentEntry::probe_ratio_milli`).
    pub probe_ratio_milli: Option<u32>,
    /// The same two calibrated for the hundred nearest rows (see
    /// `SegmentEntry::wide_nprobe`), if they were.
    pub wide_nprobe: Option<u32>,
    pub wide_probe_ratio_milli: Option<u32>,
    /// Rows of the codebook's group the probes were calibrated over (see
    /// `SegmentEntry::calibrated_rows`): first the rows that trained it, then
    /// the group's as flushes grow it (`crate::shard::recalibrate`).
    pub calibrated_rows: u64,
}

/// Both default probes of a codebook calibrated over `members` (the segment
/// that trained it, or its group; see [`quiver_index::calibrate_group`]), on
/// `threads` build threads: for ten hits, and for the hundred nearest (a
/// search for more hits, or for ten under a filter, probes between the two).
pub(crate) fn calibrate_probes<S: quiver_index::ByteSource>(
    members: &[&Segment<S>],
    threads: usize,
) -> Result<(Calibration, Calibration), quiver_index::IndexError> {
    let narrow = calibrate_group(
        members,
        &CalibrationOptions {
            threads,
            ..CalibrationOptions::default()
        },
    )?;
    let wide = calibrate_group(
        members,
        &CalibrationOptions {
            threads,
            ..CalibrationOptions::wide()
        },
    )?;
    Ok((narrow, wide))
}

/// A calibrated ratio in thousandths: up, never below the ratio that reached
/// the target.
fn ratio_milli(ratio: Option<f32>) -> Option<u32> {
    ratio.map(|ratio| ((ratio * 1000.0).ceil() as u32).max(1))
}

impl ShardCodebook {
    /// Takes the probes `narrow` (ten hits) and `wide` (a hundred) calibrated
    /// over `rows` rows of its group.
    pub fn set_calibrations(&mut self, narrow: &Calibration, wide: &Calibration, rows: u64) {
        self.nprobe = narrow.nprobe as u32;
        self.probe_ratio_milli = ratio_milli(narrow.probe_ratio);
        self.wide_nprobe = Some(wide.nprobe as u32);
        self.wide_probe_ratio_milli = ratio_milli(wide.probe_ratio);
        self.calibrated_rows = rows;
    }

    /// The default probes a segment built with it records.
    pub fn segment_probes(&self) -> SegmentProbes {
        SegmentProbes {
            default_nprobe: Some(self.nprobe),
            probe_ratio_milli: self.probe_ratio_milli,
            wide_nprobe: self.wide_nprobe,
            wide_probe_ratio_milli: self.wide_probe_ratio_milli,
            calibrated_rows: Some(self.calibrated_rows),
        }
    }

    /// Returns the codebook `segment` was built with, and the `nprobe` its
    /// manifest entry records (the default for its lists when it records none).
    pub fn of_segment<S: quiver_index::ByteSource>(
        segment: &Segment<S>,
        entry: &SegmentEntry,
    ) -> Result<Option<ShardCodebook>, quiver_index::IndexError> {
        let Some(codebook) = Codebook::of_segment(segment)? else {
            return Ok(None);
        };
        let nprobe = entry
            .default_nprobe
            .unwrap_or_else(|| default_nprobe(codebook.nlist()) as u32);
        let calibrated_rows = entry
            .calibrated_rows
            .unwrap_or_else(|| codebook.trained_rows());
        Ok(Some(ShardCodebook {
            codebook: Arc::new(codebook),
            nprobe,
            probe_ratio_milli: entry.probe_ratio_milli,
            wide_nprobe: entry.wide_nprobe,
            wide_probe_ratio_milli: entry.wide_probe_ratio_milli,
            calibrated_rows,
        }))
    }

    /// Returns the codebook a build of `rows` rows should use: this one,
    /// unless the build has outgrown it (then a new one is trained). A build
    /// that `rewrites_shard` (takes every segment of it) outgrows it sooner
    /// (see [`CODEBOOK_REWRITE_RETRAIN_GROWTH`]).
    pub fn for_build(
        current: Option<&ShardCodebook>,
        rows: usize,
        rewrites_shard: bool,
    ) -> Option<ShardCodebook> {
        let rows = rows as u64;
        current
            .filter(|current| {
                let trained = current.codebook.trained_rows();
                if rewrites_shard {
                    let (numerator, denominator) = CODEBOOK_REWRITE_RETRAIN_GROWTH;
                    rows * denominator <= trained * numerator
                } else {
                    rows <= trained * CODEBOOK_RETRAIN_GROWTH
                }
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
    /// than the current one (or there is none), or is the current one with
    /// probes calibrated over more rows (a writer reopening the shard meets
    /// its codebook in every member, the later flushes' calibrations too).
    pub fn offer_codebook(&mut self, candidate: ShardCodebook) {
        let better = self.codebook.as_ref().is_none_or(|current| {
            let (trained, current_trained) = (
                candidate.codebook.trained_rows(),
                current.codebook.trained_rows(),
            );
            trained > current_trained
                || (candidate.codebook.id() == current.codebook.id()
                    && candidate.calibrated_rows > current.calibrated_rows)
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
    /// The scratch file `bytes` maps: a `file://` store takes it as the object
    /// (see `Storage::put_file`).
    pub file: std::fs::File,
    /// Ids in row order.
    pub ids: Vec<PointId>,
    /// The codebook it was built with, whose probes it records.
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
    /// Threads a codebook trained by this build is calibrated on (the
    /// build's: a merge's `merge_threads`).
    calibration_threads: usize,
}

impl SegmentBuild {
    pub fn new(
        spec: &SegmentSpec,
        codebook: Option<ShardCodebook>,
        scratch_dir: &Path,
    ) -> IndexerResult<Self> {
        let mut spec = spec.clone();
        spec.build.codebook = codebook.as_ref().map(|shared| shared.codebook.clone());
        let threads = spec.build.threads;
        Ok(SegmentBuild {
            writer: SegmentWriter::with_scratch_dir(spec, scratch_dir)?,
            codebook,
            scratch_dir: scratch_dir.to_path_buf(),
            calibration_threads: threads,
        })
    }

    /// Adds one row (payload as stored JSON bytes, empty for none).
    pub fn add(&mut self, id: &PointId, vector: &[f32], payload: &[u8]) -> IndexerResult<()> {
        let payload = parse_payload(payload)?;
        Ok(self.writer.add(id.clone(), vector, payload.as_ref())?)
    }

    /// Writes the segment to a scratch file and opens it from its mapping.
    pub fn finish(self, progress: BuildProgress<'_>) -> IndexerResult<BuiltSegment> {
        let scratch = self.scratch_dir.display().to_string();
        let io_error = |source: std::io::Error| IndexerError::Io {
            path: scratch.clone(),
            source,
        };
        let file = tempfile::tempfile_in(&self.scratch_dir).map_err(io_error)?;
        // Written around the page cache where the file system allows it
        // (`quiver_index::DirectFileWriter`): on a virtual machine a CPU write
        // into a fresh 2 MiB page-cache folio is dear (a 1M x 768 merge spent
        // half its time there), the device's is not.
        let mut out = quiver_index::DirectFileWriter::new(file).map_err(io_error)?;
        self.writer.finish(&mut out, progress)?;
        let file = out.finish().map_err(io_error)?;
        let source = MmapSource::map_file(&file, "new segment")?;
        // A second mapping of the same pages, owned by the upload's bytes,
        // read back into the page cache in 2 MiB folios before the segment is
        // opened (`quiver_index::map_read_back`). A local object store
        // (`quiver standalone`) takes this file as the object
        // (`Storage::put_file`): the served file is these pages, mapped with
        // 2 MiB pages. Where the store copies instead (another filesystem),
        // the copy does not fault on its source.
        let map = quiver_index::map_read_back(&file).map_err(io_error)?;
        let bytes = Bytes::from_owner(map);
        let segment = Segment::open(source)?;
        let ids = segment.ids()?;
        let codebook = match self.codebook {
            Some(shared) => shared,
            None => {
                let started = std::time::Instant::now();
                let (calibration, wide) = calibrate_probes(&[&segment], self.calibration_threads)?;
                tracing::info!(
                    rows = segment.rows(),
                    nprobe = calibration.nprobe,
                    sample_recall = calibration.recall,
                    samples = calibration.samples,
                    passes = calibration.passes,
                    probe_ratio = calibration.probe_ratio,
                    wide_nprobe = wide.nprobe,
                    wide_sample_recall = wide.recall,
                    wide_passes = wide.passes,
                    wide_probe_ratio = wide.probe_ratio,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "calibrated the shard's default probes on its new codebook"
                );
                let mut codebook = ShardCodebook {
                    codebook: Arc::new(Codebook::of_segment(&segment)?.ok_or_else(|| {
                        IndexerError::Internal("a new segment carries no codebook".into())
                    })?),
                    nprobe: 0,
                    probe_ratio_milli: None,
                    wide_nprobe: None,
                    wide_probe_ratio_milli: None,
                    calibrated_rows: 0,
                };
                codebook.set_calibrations(&calibration, &wide, segment.rows());
                codebook
            }
        };
        Ok(BuiltSegment {
            bytes,
            file,
            ids,
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
        let codebook = ShardCodebook::of_segment(&segment, &entry)?;
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

/// A segment downloaded to a local scratch file and opened from its mapping
/// (or, in a `file://` store, opened from the object's own file).
pub(crate) struct DownloadedSegment {
    pub segment: Segment<MmapSource>,
    _file: Option<tempfile::NamedTempFile>,
}

/// Downloads the segment object `key` (in ranged reads of 64 MiB) into a
/// scratch file under `directory` and opens it. An object of a `file://` store
/// (`quiver standalone`) is a file written whole and never changed: it is
/// mapped where it is, not copied — a merge of 1M × 768 rows otherwise wrote
/// 3.2 GB of copies to the scratch disk before building, and held them while
/// it wrote as much again (experiments item 46). A garbage collection that
/// deletes the file after it is mapped leaves the mapping whole.
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
    let (path, file) = match storage.local_path(key) {
        Some(path) => (path, None),
        None => {
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
            (file.path().to_path_buf(), Some(file))
        }
    };
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use quiver_index::{IdType, Metric, PointId, SegmentSpec};
    use quiver_storage::{S3Settings, StorageOptions, StoreUrl};

    use super::*;

    const HUGE: u64 = quiver_index::HUGE_PAGE_BYTES as u64;

    #[test]
    fn a_build_that_rewrites_the_shard_retrains_once_it_has_a_third_more_rows() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (dim, rows) = (8, 600);
        let mut build = SegmentBuild::new(
            &SegmentSpec::new(dim, Metric::L2, IdType::U64),
            None,
            directory.path(),
        )
        .expect("build");
        for row in 0..rows {
            let vector: Vec<f32> = (0..dim).map(|i| ((row * 7 + i * 13) % 31) as f32).collect();
            build
                .add(&PointId::U64(row as u64), &vector, b"")
                .expect("add");
        }
        let built = build.finish(&|_, _, _| {}).expect("finish");
        let trained = built.codebook.codebook.trained_rows() as usize;
        assert_eq!(trained, rows, "a first build trains on all of its rows");
        let current = Some(&built.codebook);
        let kept = |rows: usize, rewrites_shard: bool| {
            ShardCodebook::for_build(current, rows, rewrites_shard).is_some()
        };
        // A flush or a merge of some segments keeps it up to twice its rows.
        assert!(kept(2 * trained, false));
        assert!(!kept(2 * trained + 1, false));
        // A build of the whole shard retrains past a third more.
        assert!(kept(trained * 4 / 3, true));
        assert!(!kept(trained * 4 / 3 + 1, true));
        assert!(!kept(2 * trained, true));
        // No codebook yet: every build trains one.
        assert!(ShardCodebook::for_build(None, 10, true).is_none());
    }

    /// Bytes of `path` this process maps with 2 MiB pages, after touching every
    /// page of a fresh mapping of it.
    fn huge_mapped_bytes(path: &Path) -> u64 {
        let file = std::fs::File::open(path).expect("open");
        // SAFETY: the test's own file; nothing writes to it while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
        let touched: u64 = map.iter().step_by(4096).map(|&byte| byte as u64).sum();
        std::hint::black_box(touched);
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let name = path.to_str().expect("utf-8 path");
        let mut in_file = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if line
                .split_whitespace()
                .next()
                .is_some_and(|first| first.contains('-'))
                && line.contains(' ')
                && !line.ends_with(" kB")
            {
                in_file = line.ends_with(name);
            } else if in_file && let Some(value) = line.strip_prefix("FilePmdMapped:") {
                kib += value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .expect("kB");
            }
        }
        drop(map);
        kib * 1024
    }

    /// Builds a segment of `rows` rows of `dim` values (`value(row, d)`) with
    /// scratch files under `scratch`.
    async fn build_segment(
        scratch: &Path,
        dim: usize,
        rows: u64,
        mut value: impl FnMut(u64, usize) -> f32 + Send + 'static,
    ) -> BuiltSegment {
        let spec = SegmentSpec::new(dim, Metric::L2, IdType::U64);
        let scratch = scratch.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut build = SegmentBuild::new(&spec, None, &scratch).expect("build");
            for row in 0..rows {
                let vector: Vec<f32> = (0..dim).map(|d| value(row, d)).collect();
                build
                    .add(&PointId::U64(row), &vector, b"")
                    .expect("add row");
            }
            build.finish(&|_, _, _| {}).expect("finish")
        })
        .await
        .expect("joined")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_segment_put_in_a_local_store_is_mapped_with_huge_pages() {
        // On disk beside the test binary (a tmpfs `/tmp` may not do huge pages).
        let base = std::env::current_exe().expect("exe");
        let directory = tempfile::tempdir_in(base.parent().expect("dir")).expect("tempdir");

        // This machine's file system and kernel make 2 MiB folios from aligned
        // 2 MiB writes, or the test cannot say anything: say so, loudly.
        let probe = directory.path().join("probe");
        std::fs::write(&probe, vec![7u8; 4 * HUGE as usize]).expect("probe");
        assert!(
            huge_mapped_bytes(&probe) >= HUGE,
            "this kernel or file system ({}) does not map files with huge pages; \
             the test needs large folios (ext4 or xfs on Linux 6.x)",
            directory.path().display()
        );

        let scratch = directory.path().join("scratch");
        std::fs::create_dir_all(&scratch).expect("scratch");
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let built = build_segment(&scratch, 256, 20_000, move |_, _| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .await;
        let size = built.bytes.len() as u64;
        assert!(
            size > 8 * HUGE,
            "a segment of {size} bytes is too small to tell"
        );

        let root = directory.path().join("store");
        let url: StoreUrl = format!("file://{}", root.display()).parse().expect("url");
        let storage =
            Storage::open(&url, &S3Settings::default(), StorageOptions::default()).expect("store");
        // One put, and a multipart upload (what a merge's large segment takes).
        let multipart = Storage::from_store_with_options(
            &storage,
            StorageOptions {
                multipart_threshold_bytes: 4 << 20,
                part_size_bytes: 8 << 20,
                ..StorageOptions::default()
            },
        );
        // Under segment keys, as the indexer writes them.
        let key = |name: &str| quiver_storage::keys::segment_key("c1", 0, name);
        let keys = [key("copied"), key("in-parts"), key("linked")];
        storage
            .put(&keys[0], built.bytes.clone())
            .await
            .expect("put");
        multipart
            .put(&keys[1], built.bytes.clone())
            .await
            .expect("multipart put");
        // What `quiver standalone` serves: the build's own file, linked.
        storage
            .put_file(&keys[2], &built.file, built.bytes)
            .await
            .expect("put file");

        // Every whole 2 MiB page of the object is mapped as one: the build
        // read its file back in 2 MiB folios (it wrote it around the page
        // cache), and the uploads copied from that mapping, which no longer
        // faults, in whole writes. (Copying from a fresh mapping, the kernel
        // splits the copy and only the first page was huge.)
        let whole_pages = size / HUGE * HUGE;
        for key in &keys {
            let path = storage.local_path(key).expect("a local store");
            let huge = huge_mapped_bytes(&path);
            assert!(
                huge * 10 >= whole_pages * 9,
                "{key}: {huge} of {whole_pages} bytes mapped with huge pages"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_merge_source_in_a_local_store_is_mapped_where_it_is() {
        let directory = tempfile::tempdir().expect("tempdir");
        let scratch = directory.path().join("scratch");
        std::fs::create_dir_all(&scratch).expect("scratch");
        let rows = 300;
        let built = build_segment(&scratch, 16, rows, |row, d| {
            ((row as usize * 7 + d) % 13) as f32
        })
        .await;
        let local = |root: &str| -> Storage {
            let url: StoreUrl = format!("file://{}", directory.path().join(root).display())
                .parse()
                .expect("url");
            Storage::open(&url, &S3Settings::default(), StorageOptions::default()).expect("store")
        };
        let storage = local("store");
        storage
            .put("segment", built.bytes.clone())
            .await
            .expect("put");
        let source = download_segment(&storage, "segment", &scratch)
            .await
            .expect("source");
        assert_eq!(source.segment.rows(), rows);
        assert_eq!(
            std::fs::read_dir(&scratch).expect("scratch").count(),
            0,
            "a local object was copied into the scratch directory"
        );
        // Deleting the object (a garbage collection) leaves the mapping whole.
        std::fs::remove_file(storage.local_path("segment").expect("local")).expect("delete");
        assert_eq!(source.segment.ids().expect("ids").len(), rows as usize);
        // A missing object is an error, as a download's would be.
        assert!(
            download_segment(&storage, "segment", &scratch)
                .await
                .is_err()
        );
    }
}
