//! Prometheus metrics of the gateway.

use std::sync::LazyLock;

use prometheus::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, register_histogram, register_histogram_vec,
    register_int_counter, register_int_counter_vec,
};

pub(crate) struct GatewayMetrics {
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub search_hits: Histogram,
    pub strong_read_rounds: IntCounter,
    pub strong_read_rounds_shared: IntCounter,
    pub searcher_calls: IntCounterVec,
    pub searchers_unreachable: IntCounter,
    pub searches_joined: IntCounter,
    pub joined_batches: IntCounter,
}

pub(crate) static METRICS: LazyLock<GatewayMetrics> = LazyLock::new(|| {
    GatewayMetrics {
    requests: register_int_counter_vec!(
        "quiver_gateway_requests_total",
        "Client API requests by route and outcome code (OK or an error code).",
        &["route", "code"]
    )
    .expect("metric registers once"),
    duration: register_histogram_vec!(
        "quiver_gateway_request_duration_seconds",
        "Client API request latency by route.",
        &["route"],
        vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
        ]
    )
    .expect("metric registers once"),
    search_hits: register_histogram!(
        "quiver_gateway_search_hits",
        "Hits returned per search.",
        vec![0.0, 1.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0]
    )
    .expect("metric registers once"),
    strong_read_rounds: register_int_counter!(
        "quiver_gateway_strong_read_rounds_total",
        "Linearizable routing reads from meta (a read-index round, or none on a one-node meta) started for strong reads."
    )
    .expect("metric registers once"),
    strong_read_rounds_shared: register_int_counter!(
        "quiver_gateway_strong_read_rounds_shared_total",
        "Strong reads answered by a round another request had already started gathering."
    )
    .expect("metric registers once"),
    searcher_calls: register_int_counter_vec!(
        "quiver_gateway_searcher_calls_total",
        "Calls to searchers by path: `local` (a searcher in this process, called directly) or `remote` (gRPC).",
        &["path"]
    )
    .expect("metric registers once"),
    searchers_unreachable: register_int_counter!(
        "quiver_gateway_searcher_unreachable_total",
        "Calls to a searcher that failed because it could not be reached (connection refused or reset, no route)."
    )
    .expect("metric registers once"),
    searches_joined: register_int_counter!(
        "quiver_gateway_searches_joined_total",
        "Single searches sent to a searcher in one batch with others, because the calls in flight to that searcher had reached its search slots."
    )
    .expect("metric registers once"),
    joined_batches: register_int_counter!(
        "quiver_gateway_joined_batches_total",
        "Batches of joined single searches sent to searchers."
    )
    .expect("metric registers once"),
}
});
