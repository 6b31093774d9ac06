//! The lifecycle every role implements, so one process can run one role or many.

use std::time::Duration;

/// A started role (meta, and later indexer, searcher, gateway).
///
/// Starting is each role's async constructor (e.g. `MetaRole::start(config)`), which
/// returns once the role serves; `quiver standalone` will start several roles in one
/// process, merge their HTTP routes and stop them in reverse order.
#[async_trait::async_trait]
pub trait Role: Send + Sync {
    /// Returns the role's name for logs.
    fn name(&self) -> &'static str;

    /// Tells whether the role can serve traffic now (`/readyz`).
    fn is_ready(&self) -> bool;

    /// Returns the role's HTTP routes (`/metrics`, …), merged into the process's HTTP port.
    fn http_router(&self) -> axum::Router;

    /// Stops the role, draining within `grace`.
    async fn stop(self: Box<Self>, grace: Duration) -> anyhow::Result<()>;
}

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for sigterm");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("received sigint"),
        () = terminate => tracing::info!("received sigterm"),
    }
}
