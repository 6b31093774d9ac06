//! What every shard a searcher serves reads through: the region cache (segments),
//! object storage (bitmaps, WAL objects), and the decoded bitmaps, WAL batches
//! and filter matches, cached by key (objects are immutable).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use quiver_blobcache::{BlobCache, CachedObject};
use quiver_index::{FieldValues, Filter, IndexErrorKind, Segment};
use quiver_storage::manifest::SegmentEntry;
use quiver_storage::{DeletionBitmap, Storage, WalBatch, WalRecord};
use roaring::RoaringBitmap;
use tokio::runtime::Handle;

use crate::error::{SearcherError, SearcherResult};

/// Bytes of decoded deletion bitmaps kept (weighed by serialized size).
pub const BITMAP_CACHE_BYTES: u64 = 64 << 20;
/// Bytes of decoded WAL batches kept (the shards' unflushed tails; a tail
/// larger than this is read again from object storage as queries need it).
pub const WAL_BATCH_CACHE_BYTES: u64 = 256 << 20;
/// Bytes of filter matches (row bitmaps per segment and filter) kept.
pub const FILTER_CACHE_BYTES: u64 = 64 << 20;
/// Bytes of payload field values (per segment and field) kept for filters: a
/// field's decoded column, or its values read out of the payloads when the
/// payload schema does not declare it (one scan per segment and field).
pub const FIELD_VALUES_CACHE_BYTES: u64 = 128 << 20;

fn bitmap_weight(bitmap: &RoaringBitmap) -> u32 {
    u32::try_from(bitmap.serialized_size()).unwrap_or(u32::MAX)
}

/// A batch's vectors, payloads and ids, about what it holds in memory.
fn wal_batch_weight(batch: &WalBatch) -> u32 {
    let bytes: usize = batch
        .records
        .iter()
        .map(|record| match record {
            WalRecord::Upsert {
                vector, payload, ..
            } => 48 + vector.len() * 4 + payload.len(),
            WalRecord::Delete { .. } => 48,
        })
        .sum();
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// The region cache, object storage, and decoded bitmaps and WAL batches shared
/// by every shard a searcher serves (objects are immutable, so cached by key).
/// Segments are owned by the shard views that use them: a new manifest reuses
/// the previous view's open segments.
pub struct ReadContext {
    cache: Arc<BlobCache>,
    storage: Storage,
    runtime: Handle,
    segment_opens: AtomicU64,
    bitmaps: moka::sync::Cache<String, Arc<RoaringBitmap>>,
    wal_batches: moka::sync::Cache<String, Arc<WalBatch>>,
    filter_rows: moka::sync::Cache<(String, String), Arc<RoaringBitmap>>,
    field_values: moka::sync::Cache<(String, String), Arc<FieldValues>>,
}

impl ReadContext {
    /// Returns a context reading through `cache` (segments) and `storage`
    /// (bitmaps, WAL objects); `runtime` runs their fetches.
    pub fn new(cache: Arc<BlobCache>, storage: Storage, runtime: Handle) -> Self {
        ReadContext {
            cache,
            storage,
            runtime,
            segment_opens: AtomicU64::new(0),
            bitmaps: moka::sync::Cache::builder()
                .max_capacity(BITMAP_CACHE_BYTES)
                .weigher(|_, bitmap: &Arc<RoaringBitmap>| bitmap_weight(bitmap))
                .build(),
            wal_batches: moka::sync::Cache::builder()
                .max_capacity(WAL_BATCH_CACHE_BYTES)
                .weigher(|_, batch: &Arc<WalBatch>| wal_batch_weight(batch))
                .build(),
            filter_rows: moka::sync::Cache::builder()
                .max_capacity(FILTER_CACHE_BYTES)
                .weigher(|_, rows: &Arc<RoaringBitmap>| bitmap_weight(rows))
                .build(),
            field_values: moka::sync::Cache::builder()
                .max_capacity(FIELD_VALUES_CACHE_BYTES)
                .weigher(|_, values: &Arc<FieldValues>| {
                    u32::try_from(values.weight()).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }

    /// Returns the region cache.
    pub fn cache(&self) -> &Arc<BlobCache> {
        &self.cache
    }

    /// Returns how many segments were opened through this context so far.
    pub fn segment_opens(&self) -> u64 {
        self.segment_opens.load(Ordering::Relaxed)
    }

    pub(crate) fn open_segment(
        &self,
        entry: &SegmentEntry,
    ) -> SearcherResult<Arc<Segment<CachedObject>>> {
        self.segment_opens.fetch_add(1, Ordering::Relaxed);
        crate::metrics::METRICS.segment_opens.inc();
        // The manifest knows the size: no HEAD before the first read. Opening
        // reads the trailer, footer and checksum table at the end of the object
        // and the header, centroids and list directory at its start; the start is
        // fetched while the end is read, so a cold open waits for one round trip.
        let object = if entry.size_bytes > 0 {
            self.cache.open_sized(&entry.key, entry.size_bytes)
        } else {
            self.cache.open_blocking(&entry.key)?
        };
        object.prefetch(std::slice::from_ref(&(0..1)));
        match Segment::open(object) {
            Ok(segment) => Ok(Arc::new(segment)),
            // A sized open trusts the manifest: before a failed read passes for
            // a passing fault, the object's real size is checked (only on this
            // error path: a HEAD).
            Err(error) if entry.size_bytes > 0 && error.kind() != IndexErrorKind::Corrupted => {
                match self.runtime.block_on(self.storage.head(&entry.key)) {
                    Ok(info) if info.size != entry.size_bytes => Err(SearcherError::ObjectSize {
                        key: entry.key.clone(),
                        actual: info.size,
                        listed: entry.size_bytes,
                    }),
                    _ => Err(error.into()),
                }
            }
            Err(error) => Err(error.into()),
        }
    }

    pub(crate) fn bitmap(&self, key: &str) -> SearcherResult<Arc<RoaringBitmap>> {
        if let Some(bitmap) = self.bitmaps.get(key) {
            return Ok(bitmap);
        }
        let bytes = self.runtime.block_on(self.storage.get(key))?;
        let bitmap = Arc::new(DeletionBitmap::decode(key, &bytes)?.deleted);
        self.bitmaps.insert(key.to_string(), bitmap.clone());
        Ok(bitmap)
    }

    pub(crate) fn wal_batch(&self, key: &str) -> SearcherResult<Arc<WalBatch>> {
        if let Some(batch) = self.wal_batches.get(key) {
            return Ok(batch);
        }
        let bytes = self.runtime.block_on(self.storage.get(key))?;
        let batch = Arc::new(WalBatch::decode(key, &bytes)?);
        self.wal_batches.insert(key.to_string(), batch.clone());
        Ok(batch)
    }

    /// Returns the rows of `segment` that `filter` keeps, cached per segment and
    /// `filter_key`: the filter's [`Filter::to_wire`], which no two filters share
    /// (its string form alone is the same for some, `{"and": []}` and `{"or": []}`).
    pub(crate) fn filter_rows(
        &self,
        segment_key: &str,
        segment: &Segment<CachedObject>,
        filter: &Filter,
        filter_key: &str,
    ) -> SearcherResult<Arc<RoaringBitmap>> {
        let cache_key = (segment_key.to_string(), filter_key.to_string());
        if let Some(rows) = self.filter_rows.get(&cache_key) {
            return Ok(rows);
        }
        let rows = Arc::new(filter.rows_with(segment.rows() as u32, |field| {
            self.field_values(segment_key, segment, field)
        })?);
        self.filter_rows.insert(cache_key, rows.clone());
        Ok(rows)
    }

    /// Returns field `field`'s values over `segment`'s rows, read once per
    /// segment and field: concurrent first filters on it wait for one read (a
    /// scan of the payloads when the field has no column can take a while).
    fn field_values(
        &self,
        segment_key: &str,
        segment: &Segment<CachedObject>,
        field: &str,
    ) -> SearcherResult<Arc<FieldValues>> {
        let mut failure = None;
        let read =
            self.field_values
                .try_get_with(
                    (segment_key.to_string(), field.to_string()),
                    || match segment.field_values(field) {
                        Ok(values) => {
                            if values.scanned() {
                                crate::metrics::METRICS.filter_field_scans.inc();
                            }
                            Ok(Arc::new(values))
                        }
                        Err(error) => {
                            failure = Some(error);
                            Err(())
                        }
                    },
                );
        match read {
            Ok(values) => Ok(values),
            // This thread's read failed: its error. Another's: read again here.
            Err(_) => match failure {
                Some(error) => Err(error.into()),
                None => Ok(Arc::new(segment.field_values(field)?)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_index::PointId;

    #[test]
    fn decoded_caches_weigh_bytes_not_entries() {
        let batch = WalBatch {
            shard: 0,
            epoch: 1,
            sequence: 1,
            dimension: 768,
            records: (0..1000u64)
                .map(|id| WalRecord::Upsert {
                    id: PointId::U64(id),
                    vector: vec![0.5; 768],
                    payload: b"{\"row\":1}".to_vec(),
                })
                .chain([WalRecord::Delete {
                    id: PointId::U64(7),
                }])
                .collect(),
        };
        // 1000 × (48 + 3072 + 9) + 48.
        assert_eq!(wal_batch_weight(&batch), 3_129_048);
        let bitmap: RoaringBitmap = (0..100_000).collect();
        assert_eq!(bitmap_weight(&bitmap) as usize, bitmap.serialized_size());
    }
}
