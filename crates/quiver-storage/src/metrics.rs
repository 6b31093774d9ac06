//! Prometheus metrics of object-store operations.

use std::sync::LazyLock;

use prometheus::{HistogramVec, IntCounterVec, register_histogram_vec, register_int_counter_vec};

pub(crate) struct StorageMetrics {
    /// Operations by kind and outcome (`ok`, `not_found`, `error`, `timeout`).
    pub requests: IntCounterVec,
    /// Bytes read (`get`) and written (`put`).
    pub bytes: IntCounterVec,
    /// Operation latency by kind.
    pub duration: HistogramVec,
}

pub(crate) static METRICS: LazyLock<StorageMetrics> = LazyLock::new(|| StorageMetrics {
    requests: register_int_counter_vec!(
        "quiver_storage_requests_total",
        "Object store operations by operation and outcome.",
        &["operation", "outcome"]
    )
    .expect("metric registers once"),
    bytes: register_int_counter_vec!(
        "quiver_storage_bytes_total",
        "Bytes transferred to and from the object store, by direction.",
        &["direction"]
    )
    .expect("metric registers once"),
    duration: register_histogram_vec!(
        "quiver_storage_request_duration_seconds",
        "Object store operation latency, retries included.",
        &["operation"],
        vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
        ]
    )
    .expect("metric registers once"),
});
