//! In-process calls: a role's gRPC service called directly by clients in the
//! same process — `quiver standalone` runs every role in one — instead of over
//! a loopback socket. The same messages, handlers and limits; no socket, no
//! HTTP/2 framing, no hand-off between connection tasks.
//!
//! Like gRPC's in-process transports (grpc-java's `InProcessServerBuilder`,
//! grpc-go's `bufconn`), a server registers its service under the address its
//! peers know it by ([`serve_in_process`]); a client that builds an
//! [`RpcChannel`] for that address gets the service, any other address gets a
//! network channel. The registration lasts as long as its guard.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::{Service, StdError, http};
use tonic::transport::Channel;

use crate::http2::EndAwareBody;

/// A gRPC service to call in this process: an encoded gRPC request in, its
/// encoded answer out (errors are answers too, with a `grpc-status`).
pub type LocalService = Arc<
    dyn Fn(http::Request<Body>) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send>>
        + Send
        + Sync,
>;

/// Wraps a generated tonic server (`FooServer::new(handler)`, or tonic
/// `Routes` of several) as a [`LocalService`].
pub fn local_service<S>(service: S) -> LocalService
where
    S: Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    Arc::new(move |request| {
        let mut service = service.clone();
        Box::pin(async move {
            match service.call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    })
}

static SERVICES: LazyLock<RwLock<HashMap<String, LocalService>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// A searcher's handlers, called in this process with their messages as they
/// are: no protobuf encoding and decoding of the query vector, the hits and
/// their payloads, no HTTP/2 framing, no tower stack — `quiver standalone`'s
/// gateway → searcher call, on every query (see [`serve_searcher_in_process`]).
pub type LocalSearcher = Arc<dyn crate::data::searcher_server::Searcher>;

static SEARCHERS: LazyLock<RwLock<HashMap<String, LocalSearcher>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The stream of catalog changes a [`LocalMeta`]'s `watch` answers with.
pub type MetaWatchStream = Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<crate::meta::WatchEvent, tonic::Status>>
            + Send
            + 'static,
    >,
>;

/// A metadata node's handlers, called in this process with their messages as
/// they are: no protobuf encoding of the request and of the routing table it
/// answers with, no tower stack — `quiver standalone`'s every call to meta,
/// among them each strong read's routing round (see [`serve_meta_in_process`]).
pub type LocalMeta =
    Arc<dyn crate::meta::meta_service_server::MetaService<WatchStream = MetaWatchStream>>;

static METAS: LazyLock<RwLock<HashMap<String, LocalMeta>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// What an [`InProcessRegistration`] registered.
enum Registered {
    Service,
    Searcher,
    Meta,
}

/// Keeps a service registered under its address; dropping it unregisters.
#[must_use = "the service is unregistered when the guard is dropped"]
pub struct InProcessRegistration {
    address: String,
    registered: Registered,
}

impl Drop for InProcessRegistration {
    fn drop(&mut self) {
        match self.registered {
            Registered::Service => {
                SERVICES
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.address);
            }
            Registered::Searcher => {
                SEARCHERS
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.address);
            }
            Registered::Meta => {
                METAS
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&self.address);
            }
        }
    }
}

/// Makes `searcher` what a client in this process that asks for
/// [`local_searcher`] at `address` calls directly (a client may still reach a
/// [`LocalService`] registered for the same address through an [`RpcChannel`]).
pub fn serve_searcher_in_process(
    address: impl Into<String>,
    searcher: LocalSearcher,
) -> InProcessRegistration {
    let address = address.into();
    SEARCHERS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(address.clone(), searcher);
    InProcessRegistration {
        address,
        registered: Registered::Searcher,
    }
}

/// Returns the searcher registered in this process for `address`, if any.
pub fn local_searcher(address: &str) -> Option<LocalSearcher> {
    SEARCHERS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(address)
        .cloned()
}

/// Makes `meta` what a metadata client in this process that asks for
/// [`local_meta`] at `address` calls directly (its `watch` streams still go
/// through the [`LocalService`] registered for the same address).
pub fn serve_meta_in_process(address: impl Into<String>, meta: LocalMeta) -> InProcessRegistration {
    let address = address.into();
    METAS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(address.clone(), meta);
    InProcessRegistration {
        address,
        registered: Registered::Meta,
    }
}

/// Returns the metadata node registered in this process for `address`, if any.
pub fn local_meta(address: &str) -> Option<LocalMeta> {
    METAS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(address)
        .cloned()
}

/// Runs the direct call `call` of a [`LocalSearcher`]'s method `path` (e.g.
/// `/quiver.v1.data.Searcher/Search`) as a server runs a call: in the span of
/// the request id in its `metadata`, and given up after `timeout` as a channel's call is.
pub async fn call_local<U>(
    path: &'static str,
    metadata: tonic::metadata::MetadataMap,
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<U>, tonic::Status>>,
) -> Result<tonic::Response<U>, tonic::Status> {
    let span = {
        let mut head = http::Request::new(());
        *head.uri_mut() = http::Uri::from_static(path);
        *head.headers_mut() = metadata.into_headers();
        crate::request_span(&head)
    };
    tokio::time::timeout(timeout, tracing::Instrument::instrument(call, span))
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "the in-process call did not answer within {timeout:?}"
            )))
        })
}

/// Makes `service` what [`RpcChannel`]s to `address` in this process call.
pub fn serve_in_process(
    address: impl Into<String>,
    service: LocalService,
) -> InProcessRegistration {
    let address = address.into();
    SERVICES
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(address.clone(), service);
    InProcessRegistration {
        address,
        registered: Registered::Service,
    }
}

fn in_process(address: &str) -> Option<LocalService> {
    SERVICES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(address)
        .cloned()
}

/// The way to a gRPC server: over the network, or in this process. A `tower`
/// service, so every generated client works over it.
#[derive(Clone)]
pub enum RpcChannel {
    /// Over the network.
    Remote(Channel),
    /// In this process; a call gives up after the timeout, as a channel's does.
    Local(LocalService, Duration),
}

impl RpcChannel {
    /// Returns the service registered in this process for `address`, else the
    /// network channel `remote` makes. In-process calls time out after `timeout`.
    pub fn to<E>(
        address: &str,
        timeout: Duration,
        remote: impl FnOnce() -> Result<Channel, E>,
    ) -> Result<RpcChannel, E> {
        match in_process(address) {
            Some(service) => Ok(RpcChannel::Local(service, timeout)),
            None => remote().map(RpcChannel::Remote),
        }
    }

    /// Tells whether calls stay in this process.
    pub fn is_local(&self) -> bool {
        matches!(self, RpcChannel::Local(..))
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, StdError>> + Send>>;

impl Service<http::Request<Body>> for RpcChannel {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        match self {
            RpcChannel::Remote(channel) => channel.poll_ready(context).map_err(Into::into),
            RpcChannel::Local(..) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
        match self {
            RpcChannel::Remote(channel) => {
                let call = channel.call(request.map(|body| Body::new(EndAwareBody::new(body))));
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            RpcChannel::Local(service, timeout) => {
                // The span a server opens for each call (request id, path).
                let span = {
                    let mut head = http::Request::new(());
                    *head.uri_mut() = request.uri().clone();
                    *head.headers_mut() = request.headers().clone();
                    crate::request_span(&head)
                };
                let call = tracing::Instrument::instrument(service(request), span);
                let timeout = *timeout;
                Box::pin(async move {
                    tokio::time::timeout(timeout, call).await.map_err(|_| {
                        Box::new(tonic::Status::deadline_exceeded(format!(
                            "the in-process call did not answer within {timeout:?}"
                        ))) as StdError
                    })
                })
            }
        }
    }
}
