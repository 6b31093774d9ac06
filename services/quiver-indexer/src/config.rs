//! Knobs of the write path.

use serde::{Deserialize, Deserializer, Serialize};

/// Reads a size written as a number of bytes or as `64KiB`, `8MiB` (the form
/// every other size of the config file takes).
fn size_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let size = bytesize::ByteSize::deserialize(deserializer)?;
    usize::try_from(size.as_u64()).map_err(|_| {
        serde::de::Error::custom(format!("{} bytes do not fit this machine", size.as_u64()))
    })
}

/// How an indexer batches, flushes and merges. Every field has a default that
/// suits real workloads; the config file may override any of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IndexerConfig {
    /// Writes arriving within this window become one WAL object.
    pub commit_window_ms: u64,
    /// A WAL batch is cut early once it holds this many bytes.
    pub commit_max_bytes: usize,
    /// Committed rows are flushed into an L0 segment at least this often.
    pub flush_interval_ms: u64,
    /// ... or as soon as this many rows wait.
    pub flush_rows: usize,
    /// A point whose payload (JSON text) is larger than this is refused
    /// (INVALID_ARGUMENT); keep it equal to the gateway's `max_payload_bytes`.
    #[serde(deserialize_with = "size_bytes")]
    pub max_payload_bytes: usize,
    /// Writes are refused (RESOURCE_EXHAUSTED) while this many rows wait.
    pub max_unflushed_rows: usize,
    /// ... or while the rows waiting take this much memory (vectors and
    /// payloads); a flush starts once a quarter of it waits.
    #[serde(deserialize_with = "size_bytes")]
    pub max_unflushed_bytes: usize,
    /// Segments of one size tier merged at once.
    pub merge_factor: usize,
    /// Merges never produce segments with more rows than this.
    pub max_segment_rows: usize,
    /// Segments with fewer rows than this all count as the smallest tier.
    pub merge_floor_rows: usize,
    /// Once a shard holds more than twice the rows its codebook was trained
    /// on, merge every segment into one (up to `max_segment_rows`), whose build
    /// trains a codebook sized for the shard (see `merge.rs`).
    pub codebook_refresh: bool,
    /// Once a shard has taken no write and no flush for this long, its segments
    /// are merged into one when the others hold at least an eighth of the
    /// largest's rows — a sixty-fourth while the largest has at most 250,000
    /// rows — (up to `max_segment_rows`; 0 = never): a settled shard is
    /// searched as one segment (see `merge.rs`).
    pub consolidate_quiet_ms: u64,
    /// Threads a merge's index build may use (kept low so merges do not starve
    /// ingest).
    pub merge_threads: usize,
    /// Directory for segments downloaded for merges and takeovers (the system
    /// temporary directory when empty).
    pub scratch_dir: String,
    /// How often one indexer sweeps the bucket for orphaned objects — objects no
    /// manifest and no GC entry names, e.g. from a crash between a PUT and its
    /// commit (0 = never).
    pub orphan_sweep_interval_ms: u64,
    /// Objects younger than this are never orphans: a write may still be between
    /// its PUT and its commit.
    pub orphan_min_age_ms: u64,
    /// How long an orphan is listed (`GET /admin/v1/orphans`) before it is deleted.
    pub orphan_grace_ms: u64,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        IndexerConfig {
            commit_window_ms: 10,
            commit_max_bytes: 8 << 20,
            flush_interval_ms: 5_000,
            flush_rows: 20_000,
            max_payload_bytes: 64 << 10,
            max_unflushed_rows: 200_000,
            max_unflushed_bytes: 256 << 20,
            merge_factor: 8,
            max_segment_rows: 2_000_000,
            merge_floor_rows: 10_000,
            codebook_refresh: true,
            consolidate_quiet_ms: 10_000,
            merge_threads: 1,
            scratch_dir: String::new(),
            orphan_sweep_interval_ms: 3_600_000,
            orphan_min_age_ms: 3_600_000,
            orphan_grace_ms: 86_400_000,
        }
    }
}

impl IndexerConfig {
    /// Checks that the values make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.commit_max_bytes == 0 || self.flush_rows == 0 {
            return Err("commit_max_bytes and flush_rows must be positive".into());
        }
        if self.max_payload_bytes == 0 {
            return Err("max_payload_bytes must be at least 1, got 0".into());
        }
        if self.max_unflushed_rows < self.flush_rows {
            return Err(format!(
                "max_unflushed_rows ({}) must be at least flush_rows ({})",
                self.max_unflushed_rows, self.flush_rows
            ));
        }
        if self.max_unflushed_bytes < self.commit_max_bytes {
            return Err(format!(
                "max_unflushed_bytes ({}) must be at least commit_max_bytes ({})",
                self.max_unflushed_bytes, self.commit_max_bytes
            ));
        }
        if self.merge_factor < 2 {
            return Err(format!(
                "merge_factor must be at least 2, got {}",
                self.merge_factor
            ));
        }
        if self.max_segment_rows < self.merge_floor_rows {
            return Err("max_segment_rows must be at least merge_floor_rows".into());
        }
        if self.orphan_sweep_interval_ms > 0 && self.orphan_min_age_ms < 1_000 {
            return Err(format!(
                "orphan_min_age_ms must be at least 1000 (objects of writes still in flight are never orphans), got {}",
                self.orphan_min_age_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_payload_bytes_takes_a_number_or_a_size_and_refuses_zero() {
        let config: IndexerConfig =
            serde_json::from_value(serde_json::json!({"max_payload_bytes": "1KiB"})).unwrap();
        assert_eq!(config.max_payload_bytes, 1024);
        let config: IndexerConfig =
            serde_json::from_value(serde_json::json!({"max_payload_bytes": 2048})).unwrap();
        assert_eq!(config.max_payload_bytes, 2048);
        assert_eq!(IndexerConfig::default().max_payload_bytes, 64 << 10);
        let error = serde_json::from_value::<IndexerConfig>(
            serde_json::json!({"max_payload_bytes": "lots"}),
        )
        .unwrap_err();
        assert!(error.to_string().contains("lots"), "{error}");
        let zero = IndexerConfig {
            max_payload_bytes: 0,
            ..IndexerConfig::default()
        };
        let error = zero.validate().unwrap_err();
        assert!(error.contains("max_payload_bytes"), "{error}");
    }
}
