//! The connections a role's tonic server takes: plain TCP, or — with TLS
//! between roles — connections whose mutual TLS handshake succeeded. One
//! stream and one connection type for both, so each role's server is written
//! once.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::{AcceptSettings, ClusterTls, TlsAccept};

/// One accepted connection of a role's gRPC port.
pub enum ServerIo {
    /// Plaintext (no TLS between roles).
    Plain(TcpStream),
    /// After a successful mutual TLS handshake.
    Tls(Box<TlsStream<TcpStream>>),
}

/// The connections of a role's gRPC port, for tonic's
/// `serve_with_incoming_shutdown`. Dropping it closes the listening socket.
pub struct Incoming {
    inner: IncomingInner,
}

enum IncomingInner {
    Plain(TcpListener),
    Tls(TlsAccept),
}

/// Returns the connections of `listener`: plain TCP, or with `tls` only those
/// that completed a mutual TLS handshake (the others are logged at warn level
/// with the reason and dropped). Every connection has `TCP_NODELAY`: answers
/// are small and must not wait for the peer's delayed ACK.
pub fn incoming(listener: TcpListener, tls: Option<&ClusterTls>) -> std::io::Result<Incoming> {
    match tls {
        None => Ok(Incoming::plain(listener)),
        Some(tls) => Incoming::tls(
            listener,
            tls.server_config(),
            AcceptSettings {
                port: "cluster grpc",
                plaintext_answer: None,
                warn_on_refusal: true,
            },
        ),
    }
}

impl Incoming {
    /// Returns every connection of `listener`, plaintext.
    pub fn plain(listener: TcpListener) -> Incoming {
        Incoming {
            inner: IncomingInner::Plain(listener),
        }
    }

    /// Returns the connections of `listener` that complete a TLS handshake with
    /// `config` (give it the `h2` ALPN protocol); the others are refused as
    /// `settings` says.
    pub fn tls(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        settings: AcceptSettings,
    ) -> std::io::Result<Incoming> {
        Ok(Incoming {
            inner: IncomingInner::Tls(TlsAccept::start(listener, config, settings)?),
        })
    }
}

impl Stream for Incoming {
    type Item = std::io::Result<ServerIo>;

    fn poll_next(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match &mut self.get_mut().inner {
            IncomingInner::Plain(listener) => match listener.poll_accept(context) {
                Poll::Ready(Ok((stream, _peer))) => {
                    let _ = stream.set_nodelay(true);
                    Poll::Ready(Some(Ok(ServerIo::Plain(stream))))
                }
                Poll::Ready(Err(error)) => Poll::Ready(Some(Err(error))),
                Poll::Pending => Poll::Pending,
            },
            IncomingInner::Tls(accept) => accept.poll_accept(context).map(|connection| {
                connection.map(|(stream, _peer)| Ok(ServerIo::Tls(Box::new(stream))))
            }),
        }
    }
}

impl Connected for ServerIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            ServerIo::Plain(stream) => stream.connect_info(),
            ServerIo::Tls(stream) => stream.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(stream) => Pin::new(stream).poll_read(context, buffer),
            ServerIo::Tls(stream) => Pin::new(stream.as_mut()).poll_read(context, buffer),
        }
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerIo::Plain(stream) => Pin::new(stream).poll_write(context, buffer),
            ServerIo::Tls(stream) => Pin::new(stream.as_mut()).poll_write(context, buffer),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerIo::Plain(stream) => Pin::new(stream).poll_write_vectored(context, buffers),
            ServerIo::Tls(stream) => {
                Pin::new(stream.as_mut()).poll_write_vectored(context, buffers)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServerIo::Plain(stream) => stream.is_write_vectored(),
            ServerIo::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(stream) => Pin::new(stream).poll_flush(context),
            ServerIo::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(context),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerIo::Plain(stream) => Pin::new(stream).poll_shutdown(context),
            ServerIo::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(context),
        }
    }
}
