//! Channels to other roles: plain, or with TLS between roles a connector that
//! dials TCP and runs the mutual TLS handshake itself, so a failed handshake
//! reaches the caller as an error naming the TLS problem.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

use super::ClusterTls;
use super::diagnose::{Side, explain_handshake_failure};

/// Returns a lazily connecting channel for `endpoint`: plain, or with `tls` a
/// mutual TLS one (this role's certificate presented, the server's checked
/// against the cluster CA). The endpoint's connect timeout covers the TLS
/// handshake too. Give the endpoint an `http://` URL: the TLS is this
/// channel's, not tonic's. The channel has the HTTP/2 settings of [`crate::http2`].
pub fn connect_lazy(endpoint: Endpoint, tls: Option<&ClusterTls>) -> Channel {
    let endpoint = crate::http2::tune_endpoint(endpoint);
    match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(ClusterConnector {
            config: tls.client_config(),
        }),
    }
}

/// Dials the URI's host and port and runs the client side of the handshake.
#[derive(Clone)]
pub(super) struct ClusterConnector {
    pub(super) config: Arc<ClientConfig>,
}

type ConnectFuture =
    Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl Service<Uri> for ClusterConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = self.config.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(80);
            let address = format!("{host}:{port}");
            let stream = TcpStream::connect(&address).await.map_err(|error| {
                std::io::Error::new(error.kind(), format!("tcp connect to {address}: {error}"))
            })?;
            stream.set_nodelay(true)?;
            // The name is sent (SNI) but not checked: peers are verified against
            // the cluster CA only (see `ClusterTls`).
            let bare_host = host.trim_start_matches('[').trim_end_matches(']');
            let server_name = ServerName::try_from(bare_host.to_owned())
                .unwrap_or_else(|_| ServerName::try_from("quiver").expect("a valid DNS name"));
            let tls_stream = TlsConnector::from(config)
                .connect(server_name, stream)
                .await
                .map_err(|error| {
                    std::io::Error::new(
                        error.kind(),
                        format!(
                            "cluster TLS handshake with {address} failed: {}",
                            explain_handshake_failure(&error, Side::Client)
                        ),
                    )
                })?;
            Ok(TokioIo::new(tls_stream))
        })
    }
}
