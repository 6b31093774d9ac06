//! A TLS listener: handshakes run in their own tasks (bounded by
//! [`HANDSHAKE_TIMEOUT`]), so a slow or silent client never holds up the others;
//! a client that speaks plaintext is answered (optionally) and dropped; every
//! refused connection is logged with its reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::HANDSHAKE_TIMEOUT;
use super::diagnose::{Side, explain_handshake_failure};

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a [`TlsAccept`] treats the connections it refuses.
#[derive(Clone, Debug)]
pub struct AcceptSettings {
    /// Names the port in log lines (`https`, `cluster grpc`).
    pub port: &'static str,
    /// Written to a client whose first byte is not a TLS handshake record,
    /// before the connection is closed (the gateway answers plain HTTP with an
    /// error saying to use https).
    pub plaintext_answer: Option<Vec<u8>>,
    /// Logs refused connections at warn level — ports between roles, where a
    /// refusal is a misconfiguration to fix — rather than debug level
    /// (client-facing ports, where scanners and broken clients are common).
    pub warn_on_refusal: bool,
}

/// A listener handing out connections whose TLS handshake succeeded.
pub struct TlsAccept {
    local_address: SocketAddr,
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept_task: JoinHandle<()>,
}

impl TlsAccept {
    /// Starts accepting TLS connections on `listener` with `config`.
    pub fn start(
        listener: TcpListener,
        config: Arc<ServerConfig>,
        settings: AcceptSettings,
    ) -> std::io::Result<TlsAccept> {
        let local_address = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let settings = Arc::new(settings);
        let (sender, handshaken) = mpsc::channel(64);
        let accept_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!(port = settings.port, %error, "tls accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Small answers must not wait for the client's delayed ACK (Nagle).
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                let settings = settings.clone();
                tokio::spawn(async move {
                    let handshake = handshake(stream, peer, &acceptor, &settings);
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Some(tls_stream)) => {
                            let _ = sender.send((tls_stream, peer)).await;
                        }
                        Ok(None) => {}
                        Err(_) => refused(
                            &settings,
                            peer,
                            &format!(
                                "tls handshake not done within {} s",
                                HANDSHAKE_TIMEOUT.as_secs()
                            ),
                        ),
                    }
                });
            }
        });
        Ok(TlsAccept {
            local_address,
            handshaken,
            accept_task,
        })
    }

    /// Returns the address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_address
    }

    /// Polls for the next connection that completed its handshake (`None`
    /// never comes while the listener lives).
    pub fn poll_accept(
        &mut self,
        context: &mut Context<'_>,
    ) -> Poll<Option<(TlsStream<TcpStream>, SocketAddr)>> {
        self.handshaken.poll_recv(context)
    }

    /// Waits for the next connection that completed its handshake.
    pub async fn accept(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.handshaken.recv().await
    }
}

impl Drop for TlsAccept {
    fn drop(&mut self) {
        // Closes the listening socket with the task that owns it.
        self.accept_task.abort();
    }
}

async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: &TlsAcceptor,
    settings: &AcceptSettings,
) -> Option<TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        // Closed (or reset) before sending anything: nothing to say.
        Ok(0) | Err(_) => return None,
        Ok(_) if first[0] == TLS_HANDSHAKE_RECORD => {}
        Ok(_) => {
            refused(
                settings,
                peer,
                "plaintext connection refused: this port requires TLS",
            );
            refuse_plaintext(stream, settings.plaintext_answer.as_deref()).await;
            return None;
        }
    }
    match acceptor.accept(stream).await {
        Ok(tls_stream) => Some(tls_stream),
        Err(error) => {
            let reason = format!(
                "tls handshake failed: {}",
                explain_handshake_failure(&error, Side::Server)
            );
            refused(settings, peer, &reason);
            None
        }
    }
}

fn refused(settings: &AcceptSettings, peer: SocketAddr, reason: &str) {
    if settings.warn_on_refusal {
        tracing::warn!(port = settings.port, %peer, reason, "connection refused");
    } else {
        tracing::debug!(port = settings.port, %peer, reason, "connection refused");
    }
}

async fn refuse_plaintext(mut stream: TcpStream, answer: Option<&[u8]>) {
    if let Some(answer) = answer {
        let _ = stream.write_all(answer).await;
    }
    let _ = stream.shutdown().await;
}
