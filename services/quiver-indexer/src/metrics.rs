//! Prometheus metrics of the write path.

use std::sync::LazyLock;

use prometheus::{
    Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, register_histogram,
    register_int_counter, register_int_counter_vec, register_int_gauge, register_int_gauge_vec,
};

pub(crate) struct IndexerMetrics {
    pub rows_written: IntCounter,
    pub wal_batches: IntCounter,
    pub wal_bytes: IntCounter,
    pub wal_put_seconds: Histogram,
    pub wal_commit_seconds: Histogram,
    pub backpressure_rejections: IntCounter,
    pub flushes: IntCounter,
    pub flush_seconds: Histogram,
    pub flush_failures: IntCounter,
    pub merges: IntCounter,
    pub merge_seconds: Histogram,
    pub merges_running: IntGauge,
    pub unflushed_rows: IntGaugeVec,
    pub segments: IntGaugeVec,
    pub gc_deleted: IntCounter,
    pub orphan_sweeps: IntCounterVec,
    pub orphans_found: IntCounter,
    pub orphans_deleted: IntCounter,
    pub orphans_pending: IntGauge,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const JOB_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// Registers every metric family of the write path (idempotent), so that an
/// indexer's first scrape lists them all, before its first write.
pub(crate) fn register() {
    LazyLock::force(&METRICS);
}

pub(crate) static METRICS: LazyLock<IndexerMetrics> = LazyLock::new(|| {
    IndexerMetrics {
    rows_written: register_int_counter!(
        "quiver_indexer_rows_written_total",
        "Upserts and deletes acknowledged (durable in the WAL)."
    )
    .expect("metric registers once"),
    wal_batches: register_int_counter!(
        "quiver_indexer_wal_batches_total",
        "WAL objects committed (one per group commit)."
    )
    .expect("metric registers once"),
    wal_bytes: register_int_counter!(
        "quiver_indexer_wal_bytes_total",
        "Bytes of WAL objects committed."
    )
    .expect("metric registers once"),
    wal_put_seconds: register_histogram!(
        "quiver_indexer_wal_put_duration_seconds",
        "Time to PUT one WAL object to object storage.",
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric registers once"),
    wal_commit_seconds: register_histogram!(
        "quiver_indexer_wal_commit_duration_seconds",
        "Time for the metadata service to commit one WAL object.",
        LATENCY_BUCKETS.to_vec()
    )
    .expect("metric registers once"),
    backpressure_rejections: register_int_counter!(
        "quiver_indexer_backpressure_rejections_total",
        "Writes refused because too many rows waited for a flush."
    )
    .expect("metric registers once"),
    flushes: register_int_counter!(
        "quiver_indexer_flushes_total",
        "Flushes committed (WAL rows moved into L0 segments)."
    )
    .expect("metric registers once"),
    flush_seconds: register_histogram!(
        "quiver_indexer_flush_duration_seconds",
        "Duration of a flush, build and upload included.",
        JOB_BUCKETS.to_vec()
    )
    .expect("metric registers once"),
    flush_failures: register_int_counter!(
        "quiver_indexer_flush_failures_total",
        "Flushes that failed and will be retried (the WAL tail stays unflushed meanwhile)."
    )
    .expect("metric registers once"),
    merges: register_int_counter!("quiver_indexer_merges_total", "Merges committed.")
        .expect("metric registers once"),
    merge_seconds: register_histogram!(
        "quiver_indexer_merge_duration_seconds",
        "Duration of a merge, downloads, build and upload included.",
        JOB_BUCKETS.to_vec()
    )
    .expect("metric registers once"),
    merges_running: register_int_gauge!(
        "quiver_indexer_merges_running",
        "Merges in progress now (0: the segments are settled until the next flush)."
    )
    .expect("metric registers once"),
    unflushed_rows: register_int_gauge_vec!(
        "quiver_indexer_unflushed_rows",
        "Committed ids waiting for a flush, per shard.",
        &["shard"]
    )
    .expect("metric registers once"),
    segments: register_int_gauge_vec!(
        "quiver_indexer_segments",
        "Live segments per shard.",
        &["shard"]
    )
    .expect("metric registers once"),
    gc_deleted: register_int_counter!(
        "quiver_indexer_gc_deleted_objects_total",
        "Objects deleted from object storage after their GC grace period."
    )
    .expect("metric registers once"),
    orphan_sweeps: register_int_counter_vec!(
        "quiver_indexer_orphan_sweeps_total",
        "Sweeps of the bucket for orphaned objects, by outcome (ok, error).",
        &["outcome"]
    )
    .expect("metric registers once"),
    orphans_found: register_int_counter!(
        "quiver_indexer_orphans_found_total",
        "Orphaned objects (no manifest or GC entry names them) reported for the first time."
    )
    .expect("metric registers once"),
    orphans_deleted: register_int_counter!(
        "quiver_indexer_orphans_deleted_total",
        "Orphaned objects deleted after being reported for the grace period."
    )
    .expect("metric registers once"),
    orphans_pending: register_int_gauge!(
        "quiver_indexer_orphans_pending",
        "Orphaned objects reported and waiting for their grace period (as of this indexer's last sweep)."
    )
    .expect("metric registers once"),
}
});
