//! Knobs of the write path.

use serde::{Deserialize, Serialize};

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
    /// Writes are refused (RESOURCE_EXHAUSTED) while this many rows wait.
    pub max_unflushed_rows: usize,
    /// Segments of one size tier merged at once.
    pub merge_factor: usize,
    /// Merges never produce segments with more rows than this.
    pub max_segment_rows: usize,
    /// Segments with fewer rows than this all count as the smallest tier.
    pub merge_floor_rows: usize,
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
            max_unflushed_rows: 200_000,
            merge_factor: 8,
            max_segment_rows: 2_000_000,
            merge_floor_rows: 10_000,
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
        if self.max_unflushed_rows < self.flush_rows {
            return Err(format!(
                "max_unflushed_rows ({}) must be at least flush_rows ({})",
                self.max_unflushed_rows, self.flush_rows
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
