//! TLS on the gateway's two ports (rustls with the aws-lc provider): a PEM
//! certificate chain and key checked at start-up (read by `quiver_proto::tls`,
//! which every TLS port of Quiver shares), a listener that completes handshakes
//! off the accept loop for REST, and the same for gRPC.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use quiver_proto::tls::{
    AcceptSettings, Incoming, TlsAccept, crypto_provider, read_certificates, read_private_key,
};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::error::{GatewayError, GatewayResult};

/// The certificate and key both ports serve, checked to belong together.
#[derive(Clone)]
pub struct ServerTls {
    rest_config: Arc<ServerConfig>,
    grpc_config: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        write!(formatter, "ServerTls(..)")
    }
}

impl ServerTls {
    /// Reads a PEM certificate chain (server certificate first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1); fails naming the file when one is
    /// unreadable or holds no such block, or when the key is not the
    /// certificate's.
    pub fn from_pem_files(cert_path: &Path, key_path: &Path) -> GatewayResult<ServerTls> {
        let invalid =
            |error: quiver_proto::tls::TlsConfigError| GatewayError::invalid(error.message);
        let certificates = read_certificates(cert_path, "TLS certificate file").map_err(invalid)?;
        let key = read_private_key(key_path, "TLS key file").map_err(invalid)?;
        let config = ServerConfig::builder_with_provider(crypto_provider())
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
        // REST is served over HTTP/1.1, gRPC over HTTP/2, each on its own port.
        let mut rest_config = config.clone();
        rest_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut grpc_config = config;
        grpc_config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls {
            rest_config: Arc::new(rest_config),
            grpc_config: Arc::new(grpc_config),
        })
    }

    /// Returns the gRPC port's connections that complete a TLS handshake.
    pub(crate) fn grpc_incoming(&self, listener: TcpListener) -> std::io::Result<Incoming> {
        Incoming::tls(
            listener,
            self.grpc_config.clone(),
            AcceptSettings {
                port: "grpc",
                plaintext_answer: None,
                warn_on_refusal: false,
            },
        )
    }
}

/// A REST listener speaking TLS (handshakes off the accept loop, see
/// [`TlsAccept`]); a plaintext HTTP request gets a one-line JSON error saying to
/// use https.
pub(crate) struct TlsListener {
    accept: TlsAccept,
}

impl TlsListener {
    /// Starts accepting TLS connections on `listener`.
    pub(crate) fn new(listener: TcpListener, tls: &ServerTls) -> std::io::Result<TlsListener> {
        let accept = TlsAccept::start(
            listener,
            tls.rest_config.clone(),
            AcceptSettings {
                port: "https",
                plaintext_answer: Some(plain_http_refusal()),
                warn_on_refusal: false,
            },
        )?;
        Ok(TlsListener { accept })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accept.accept().await {
            Some(connection) => connection,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.accept.local_addr())
    }
}

/// The answer to a plaintext HTTP request on the TLS REST port.
fn plain_http_refusal() -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "code": "INVALID_ARGUMENT",
        "message": "this port serves HTTPS; use an https:// URL",
    }})
    .to_string();
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
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
