//! TLS on the gateway's two ports (rustls with the aws-lc provider): a PEM
//! certificate chain and key checked at start-up, a listener that completes
//! handshakes off the accept loop for REST, and tonic's own TLS for gRPC.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::{GatewayError, GatewayResult};

/// A handshake that has not finished by then is dropped, so idle connections
/// cannot pile up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate and key both ports serve, checked to belong together.
#[derive(Clone)]
pub struct ServerTls {
    rest_config: Arc<ServerConfig>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        write!(formatter, "ServerTls(..)")
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Makes aws-lc the process's rustls provider (tonic's TLS builds its config with
/// the process default). Harmless when one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn read_file(path: &Path, what: &str) -> GatewayResult<Vec<u8>> {
    std::fs::read(path).map_err(|error| {
        GatewayError::invalid(format!("cannot read {what} {}: {error}", path.display()))
    })
}

impl ServerTls {
    /// Reads a PEM certificate chain (server certificate first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1); fails naming the file when one is
    /// unreadable or holds no such block, or when the key is not the
    /// certificate's.
    pub fn from_pem_files(cert_path: &Path, key_path: &Path) -> GatewayResult<ServerTls> {
        let cert_pem = read_file(cert_path, "TLS certificate file")?;
        let key_pem = read_file(key_path, "TLS key file")?;
        let certificates = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| {
                GatewayError::invalid(format!(
                    "TLS certificate file {} is not valid PEM: {error}",
                    cert_path.display()
                ))
            })?;
        if certificates.is_empty() {
            return Err(GatewayError::invalid(format!(
                "TLS certificate file {} holds no `BEGIN CERTIFICATE` block",
                cert_path.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| {
            let reason = match error {
                pem::Error::NoItemsFound => "holds no `BEGIN PRIVATE KEY` block".to_string(),
                other => format!("is not a valid PEM private key: {other}"),
            };
            GatewayError::invalid(format!("TLS key file {} {reason}", key_path.display()))
        })?;
        let mut rest_config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| GatewayError::invalid(format!("TLS protocol versions: {error}")))?
            .with_no_client_auth()
            .with_single_cert(certificates, key)
            .map_err(|error| {
                GatewayError::invalid(format!(
                    "TLS key file {} does not fit certificate file {}: {error}",
                    key_path.display(),
                    cert_path.display()
                ))
            })?;
        // REST is served over HTTP/1.1; gRPC (HTTP/2) has its own listener.
        rest_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            rest_config: Arc::new(rest_config),
            cert_pem,
            key_pem,
        })
    }

    /// Returns tonic's TLS settings for the gRPC port (same certificate and key).
    pub(crate) fn grpc_config(&self) -> tonic::transport::ServerTlsConfig {
        install_crypto_provider();
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// A REST listener speaking TLS. Handshakes run in their own tasks (bounded by
/// [`HANDSHAKE_TIMEOUT`]), so a slow or silent client never holds up the others;
/// a plaintext HTTP request gets a one-line JSON error saying to use https.
pub(crate) struct TlsListener {
    local_address: SocketAddr,
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept_task: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting TLS connections on `listener`.
    pub(crate) fn new(listener: TcpListener, tls: &ServerTls) -> std::io::Result<TlsListener> {
        let local_address = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(tls.rest_config.clone());
        let (sender, handshaken) = mpsc::channel(64);
        let accept_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!(%error, "https accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Small answers must not wait for the client's delayed ACK (Nagle).
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    let handshake = async {
                        if speaks_plain_http(&stream).await {
                            refuse_plain_http(stream).await;
                            return None;
                        }
                        match acceptor.accept(stream).await {
                            Ok(tls_stream) => Some(tls_stream),
                            Err(error) => {
                                tracing::debug!(%peer, %error, "tls handshake failed");
                                None
                            }
                        }
                    };
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Some(tls_stream)) => {
                            let _ = sender.send((tls_stream, peer)).await;
                        }
                        Ok(None) => {}
                        Err(_) => tracing::debug!(%peer, "tls handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local_address,
            handshaken,
            accept_task,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_address)
    }
}

/// Tells whether the client opened with a plaintext HTTP request line (a TLS
/// client's first byte is 0x16, a handshake record).
async fn speaks_plain_http(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1) if first[0].is_ascii_uppercase())
}

async fn refuse_plain_http(mut stream: TcpStream) {
    let body = serde_json::json!({"error": {
        "code": "INVALID_ARGUMENT",
        "message": "this port serves HTTPS; use an https:// URL",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(directory: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = directory.join(name);
        std::fs::write(&path, text).expect("write test file");
        path
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let directory = tempfile::tempdir().expect("tempdir");
        let first = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        let second = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        let cert = write(directory.path(), "cert.pem", &first.cert.pem());
        let key = write(
            directory.path(),
            "key.pem",
            &first.signing_key.serialize_pem(),
        );
        let other_key = write(
            directory.path(),
            "other.pem",
            &second.signing_key.serialize_pem(),
        );
        let garbage = write(directory.path(), "garbage.pem", "not pem at all\n");
        let missing = directory.path().join("missing.pem");

        ServerTls::from_pem_files(&cert, &key).expect("a matching pair loads");
        let message = |cert: &Path, key: &Path| {
            ServerTls::from_pem_files(cert, key)
                .expect_err("bad pair")
                .message
        };
        let text = message(&missing, &key);
        assert!(
            text.contains("cannot read TLS certificate file") && text.contains("missing.pem"),
            "{text}"
        );
        let text = message(&cert, &missing);
        assert!(text.contains("cannot read TLS key file"), "{text}");
        let text = message(&garbage, &key);
        assert!(
            text.contains("garbage.pem") && text.contains("no `BEGIN CERTIFICATE`"),
            "{text}"
        );
        let text = message(&cert, &garbage);
        assert!(text.contains("no `BEGIN PRIVATE KEY`"), "{text}");
        let text = message(&key, &cert);
        assert!(text.contains("no `BEGIN CERTIFICATE`"), "{text}");
        let text = message(&cert, &other_key);
        assert!(
            text.contains("does not fit certificate") && text.contains("other.pem"),
            "{text}"
        );
    }
}
