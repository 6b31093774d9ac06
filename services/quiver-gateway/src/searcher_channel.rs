//! How the gateway reaches a searcher: a gRPC channel over the network, or —
//! when the searcher runs in this process (`quiver standalone`) — its gRPC
//! service called directly: the same messages and handlers, no socket, no HTTP/2
//! framing, no hop between runtimes' threads.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::{Service, StdError, http};
use tonic::transport::Channel;

use crate::metrics::METRICS;

/// A searcher's gRPC service in this process.
pub type LocalSearcher = quiver_proto::LocalService;

/// The way to one searcher; a `tower` service, so a generated
/// `SearcherClient` works over either.
#[derive(Clone)]
pub enum SearcherChannel {
    /// Over the network.
    Remote(Channel),
    /// In this process; calls give up after the timeout, as a channel's do.
    Local(LocalSearcher, Duration),
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, StdError>> + Send>>;

impl Service<http::Request<Body>> for SearcherChannel {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        match self {
            SearcherChannel::Remote(channel) => channel.poll_ready(context).map_err(Into::into),
            SearcherChannel::Local(..) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
        match self {
            SearcherChannel::Remote(channel) => {
                METRICS.searcher_calls.with_label_values(&["remote"]).inc();
                let call = channel.call(request);
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            SearcherChannel::Local(service, timeout) => {
                METRICS.searcher_calls.with_label_values(&["local"]).inc();
                // The span a server would open for the request (request id, path).
                let span = {
                    let mut head = http::Request::new(());
                    *head.uri_mut() = request.uri().clone();
                    *head.headers_mut() = request.headers().clone();
                    quiver_proto::request_span(&head)
                };
                let call = tracing::Instrument::instrument(service(request), span);
                let timeout = *timeout;
                Box::pin(async move {
                    tokio::time::timeout(timeout, call).await.map_err(|_| {
                        Box::new(tonic::Status::deadline_exceeded(format!(
                            "the searcher did not answer within {timeout:?}"
                        ))) as StdError
                    })
                })
            }
        }
    }
}
