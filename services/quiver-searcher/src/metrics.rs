//! Prometheus metrics of the read path.

use std::sync::LazyLock;

use prometheus::{
    CounterVec, Histogram, IntCounter, IntCounterVec, IntGauge, register_counter_vec,
    register_histogram, register_int_counter, register_int_counter_vec, register_int_gauge,
};

pub(crate) struct SearcherMetrics {
    pub queries: IntCounter,
    pub query_seconds: Histogram,
    pub shards_ready: IntGauge,
    pub manifest_waits: IntCounter,
    pub manifest_same_rows: IntCounter,
    pub segment_opens: IntCounter,
    pub filter_field_scans: IntCounter,
    pub corrupted_objects: IntCounter,
    pub manifest_reloads: IntCounterVec,
    pub watch_reconnects: IntCounter,
    pub search_pool_threads: IntGauge,
    pub search_pool_calls: IntGauge,
    pub search_pool_queued: IntGauge,
    pub search_pool_busy: IntGauge,
    pub search_pool_wait_seconds: Histogram,
    pub search_pool_rejected: IntCounter,
    pub search_pool_abandoned: IntCounter,
    pub warm_up_bytes: IntCounterVec,
    pub warm_up_seconds: CounterVec,
}

pub(crate) static METRICS: LazyLock<SearcherMetrics> = LazyLock::new(|| {
    SearcherMetrics {
    queries: register_int_counter!("quiver_searcher_queries_total", "Shard searches answered.")
        .expect("metric registers once"),
    query_seconds: register_histogram!(
        "quiver_searcher_query_duration_seconds",
        "Time to answer one shard search, manifest wait included.",
        vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5
        ]
    )
    .expect("metric registers once"),
    shards_ready: register_int_gauge!(
        "quiver_searcher_shards_ready",
        "Shards this searcher has loaded and warmed."
    )
    .expect("metric registers once"),
    manifest_waits: register_int_counter!(
        "quiver_searcher_manifest_waits_total",
        "Requests that had to load a newer manifest first (strong reads)."
    )
    .expect("metric registers once"),
    manifest_same_rows: register_int_counter!(
        "quiver_searcher_manifest_same_rows_total",
        "Strong reads answered by the served view while a newer manifest with the same rows (only flushes and merges since) loads in the background."
    )
    .expect("metric registers once"),
    segment_opens: register_int_counter!(
        "quiver_searcher_segment_opens_total",
        "Segments opened (a manifest change opens only its new segments)."
    )
    .expect("metric registers once"),
    filter_field_scans: register_int_counter!(
        "quiver_searcher_filter_field_scans_total",
        "Payload fields a filter read out of a segment's stored payloads (the field is not in the payload schema); kept per segment and field once read."
    )
    .expect("metric registers once"),
    corrupted_objects: register_int_counter!(
        "quiver_searcher_corrupted_objects_total",
        "Reads that found a segment, WAL object or deletion bitmap damaged (checksum or format); no answer is served from it."
    )
    .expect("metric registers once"),
    manifest_reloads: register_int_counter_vec!(
        "quiver_searcher_manifest_reloads_total",
        "Shard views rebuilt for a newer manifest, by what announced it: watch, poll, or query (a strong read).",
        &["trigger"]
    )
    .expect("metric registers once"),
    watch_reconnects: register_int_counter!(
        "quiver_searcher_watch_reconnects_total",
        "Times the watch stream from meta broke and was reopened."
    )
    .expect("metric registers once"),
    search_pool_threads: register_int_gauge!(
        "quiver_searcher_search_pool_threads",
        "CPU slots of the search pool (searches and point reads compute there; a job waiting for the object store gives its slot back)."
    )
    .expect("metric registers once"),
    search_pool_calls: register_int_gauge!(
        "quiver_searcher_search_pool_calls",
        "Jobs that keep the search pool's CPU slots busy now: its slots, more while searches wait for the object store (a batch is cut into this many jobs; gateways keep this many calls in flight)."
    )
    .expect("metric registers once"),
    search_pool_queued: register_int_gauge!(
        "quiver_searcher_search_pool_queue_depth",
        "Searches and point reads waiting for a search thread."
    )
    .expect("metric registers once"),
    search_pool_busy: register_int_gauge!(
        "quiver_searcher_search_pool_busy_threads",
        "Searches and point reads computing right now (holding a CPU slot; waits for the object store not counted)."
    )
    .expect("metric registers once"),
    search_pool_wait_seconds: register_histogram!(
        "quiver_searcher_search_pool_wait_seconds",
        "Time a search or point read waited in the queue for a search thread.",
        vec![
            0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25
        ]
    )
    .expect("metric registers once"),
    search_pool_rejected: register_int_counter!(
        "quiver_searcher_search_pool_rejected_total",
        "Requests refused with RESOURCE_EXHAUSTED because the search queue was full."
    )
    .expect("metric registers once"),
    search_pool_abandoned: register_int_counter!(
        "quiver_searcher_search_pool_abandoned_total",
        "Queued jobs skipped because their request was cancelled before they started."
    )
    .expect("metric registers once"),
    warm_up_bytes: register_int_counter_vec!(
        "quiver_searcher_warm_up_bytes_total",
        "Bytes new segments' warm-ups fetched from the object store, by what: codes (before the shard serves them) or rows (raw vectors and payloads, after).",
        &["what"]
    )
    .expect("metric registers once"),
    warm_up_seconds: register_counter_vec!(
        "quiver_searcher_warm_up_seconds_total",
        "Time spent in those warm-ups, by what; bytes / seconds is the warm-up throughput.",
        &["what"]
    )
    .expect("metric registers once"),
}
});
