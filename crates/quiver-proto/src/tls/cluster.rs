//! Mutual TLS between roles: every role holds a certificate signed by the
//! cluster CA, serves it on its gRPC port and presents it when it calls
//! another role; both ends check the other's certificate against the cluster CA.
//!
//! Peers are verified against the CA only, not against a host name. Data
//! nodes are reached at the address they register (in Kubernetes the pod IP,
//! new at every restart), which no certificate issued ahead of time can name;
//! and a CA dedicated to one cluster makes every certificate it signed a member
//! of that cluster, so the name would tell nothing the signature does not. The
//! cluster CA must therefore sign nothing but this cluster's role certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};

use super::pem::{read_certificates, read_private_key};
use super::{TlsConfigError, crypto_provider};

/// The TLS settings of one role in a cluster with TLS between roles: the
/// server side of its gRPC port (client certificates required, signed by the
/// cluster CA) and the client side of its calls to other roles (its own
/// certificate presented, the server's checked against the cluster CA).
/// Cheap to clone.
#[derive(Clone)]
pub struct ClusterTls {
    server_config: Arc<ServerConfig>,
    client_config: Arc<ClientConfig>,
    ca_path: PathBuf,
    cert_path: PathBuf,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        formatter
            .debug_struct("ClusterTls")
            .field("ca", &self.ca_path)
            .field("cert", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl ClusterTls {
    /// Reads the cluster CA (one or more PEM certificates), the role's PEM
    /// certificate chain (leaf first) and its PEM private key; fails naming the
    /// file when one is unreadable or holds no such block, when the key is not
    /// the certificate's, or when the certificate would not pass its peers'
    /// checks (not signed by the cluster CA, expired, or an extended key usage
    /// without both `serverAuth` and `clientAuth`).
    pub fn from_pem_files(
        ca_path: &Path,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<ClusterTls, TlsConfigError> {
        let ca_certificates = read_certificates(ca_path, "cluster CA file")?;
        let chain = read_certificates(cert_path, "cluster TLS certificate file")?;
        let key = read_private_key(key_path, "cluster TLS key file")?;
        let mut roots = RootCertStore::empty();
        for certificate in ca_certificates {
            roots.add(certificate).map_err(|error| {
                TlsConfigError::new(format!(
                    "cluster CA file {} holds a certificate that cannot be a trust anchor: {error}",
                    ca_path.display()
                ))
            })?;
        }
        let roots = Arc::new(roots);
        let provider = crypto_provider();
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|error| {
                    TlsConfigError::new(format!("cluster CA file {}: {error}", ca_path.display()))
                })?;
        let server_verifier = Arc::new(CaOnlyServerVerifier {
            roots,
            algorithms: provider.signature_verification_algorithms,
        });
        let key_mismatch = |error: rustls::Error| {
            TlsConfigError::new(format!(
                "cluster TLS key file {} does not fit certificate file {}: {error}",
                key_path.display(),
                cert_path.display()
            ))
        };
        let versions_error =
            |error: rustls::Error| TlsConfigError::new(format!("TLS protocol versions: {error}"));
        let mut server_config = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(versions_error)?
            .with_client_cert_verifier(client_verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(key_mismatch)?;
        server_config.alpn_protocols = vec![b"h2".to_vec()];
        let mut client_config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(versions_error)?
            .dangerous()
            .with_custom_certificate_verifier(server_verifier.clone())
            .with_client_auth_cert(chain.clone(), key)
            .map_err(key_mismatch)?;
        client_config.alpn_protocols = vec![b"h2".to_vec()];

        // The role's own certificate must pass the checks its peers will make,
        // or every connection would fail later with a less obvious error.
        let (leaf, intermediates) = chain.split_first().expect("at least one certificate");
        let now = UnixTime::now();
        let refused = |usage: &str, error: rustls::Error| {
            TlsConfigError::new(format!(
                "cluster TLS certificate file {} is refused as a {usage} certificate by cluster CA file {}: {}",
                cert_path.display(),
                ca_path.display(),
                describe_own_certificate_error(&error)
            ))
        };
        client_verifier
            .verify_client_cert(leaf, intermediates, now)
            .map_err(|error| refused("client", error))?;
        let any_name = ServerName::try_from("quiver").expect("a valid DNS name");
        server_verifier
            .verify_server_cert(leaf, intermediates, &any_name, &[], now)
            .map_err(|error| refused("server", error))?;
        Ok(ClusterTls {
            server_config: Arc::new(server_config),
            client_config: Arc::new(client_config),
            ca_path: ca_path.to_path_buf(),
            cert_path: cert_path.to_path_buf(),
        })
    }

    /// Returns the server side: this role's certificate, client certificates
    /// required and checked against the cluster CA, HTTP/2 only.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server_config.clone()
    }

    /// Returns the client side: this role's certificate presented, the
    /// server's checked against the cluster CA, HTTP/2 only.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client_config.clone()
    }
}

fn describe_own_certificate_error(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "it is not signed by that CA (UnknownIssuer)".to_string()
        }
        rustls::Error::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
        ) => "its extended key usage must allow both serverAuth and clientAuth (or be absent)"
            .to_string(),
        rustls::Error::InvalidCertificate(certificate_error) => certificate_error.to_string(),
        other => other.to_string(),
    }
}

/// Checks a server's certificate chain against the cluster CA — signatures,
/// validity period, `serverAuth` usage when an extended key usage is present —
/// and not the name it was dialled by (see the module's comment).
#[derive(Debug)]
struct CaOnlyServerVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for CaOnlyServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let certificate = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &certificate,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, certificate, signature, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, certificate, signature, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
