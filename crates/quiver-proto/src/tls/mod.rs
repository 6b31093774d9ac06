//! TLS for every Quiver port that speaks it (rustls with the aws-lc provider):
//! the gateway's client-facing ports and the gRPC ports between roles.
//!
//! - `pem`: reading certificate chains, CA bundles and private keys
//!   ([`read_certificates`], [`read_private_key`]), errors naming the file.
//! - `cluster`: [`ClusterTls`], mutual TLS between roles — one cluster CA, one
//!   certificate per role presented both as server and as client. Peers are
//!   verified against the cluster CA only, not against a host name (see the type).
//! - `accept`: [`TlsAccept`], a listener completing handshakes off the accept
//!   loop, refusing plaintext, logging failed handshakes with their reason.
//! - `serve`: [`incoming`], the connections a role's tonic server takes (plain
//!   or cluster TLS) as one [`ServerIo`] type.
//! - `connect`: [`connect_lazy`], a tonic channel that speaks cluster TLS.
//! - `diagnose`: what a failed handshake means, in words an operator can act on.

mod accept;
mod cluster;
mod connect;
mod diagnose;
mod pem;
mod serve;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

pub use accept::{AcceptSettings, TlsAccept};
pub use cluster::ClusterTls;
pub use connect::connect_lazy;
pub use pem::{read_certificates, read_private_key};
pub use serve::{Incoming, ServerIo, incoming};

/// A handshake that has not finished by then is dropped, so idle connections
/// cannot pile up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS file or setting that cannot be used; the message names the file and
/// what is wrong with it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct TlsConfigError {
    /// What was wrong, naming the file.
    pub message: String,
}

impl TlsConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        TlsConfigError {
            message: message.into(),
        }
    }
}

impl quiver_common::ServiceError for TlsConfigError {
    fn error_code(&self) -> quiver_common::ErrorCode {
        quiver_common::ErrorCode::InvalidArgument
    }
}

/// Returns the crypto provider every Quiver TLS configuration is built with.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Makes aws-lc the process's rustls provider (tonic's TLS and the S3 clients
/// build their configurations with the process default). Harmless when one is
/// installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}
