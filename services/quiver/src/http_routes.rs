//! The HTTP routes every role serves besides its own: `/metrics` (the process's
//! Prometheus registry plus any extra registries), `/healthz` and `/readyz`.

use std::sync::Arc;

/// The process's Prometheus registry as text, plus any extra registries.
pub fn metrics_router(extra: Vec<Arc<dyn Fn() -> String + Send + Sync>>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let extra = extra.clone();
            async move {
                let mut text = prometheus::TextEncoder::new()
                    .encode_to_string(&prometheus::gather())
                    .unwrap_or_default();
                for render in &extra {
                    text.push_str(&render());
                }
                text
            }
        }),
    )
}

pub(crate) fn health_router(ready: Arc<dyn Fn() -> bool + Send + Sync>) -> axum::Router {
    metrics_router(Vec::new())
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let ready = ready.clone();
                async move {
                    if ready() {
                        (axum::http::StatusCode::OK, "ready")
                    } else {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
}
