//! Reading PEM files: certificate chains, CA bundles and private keys, each
//! failure naming the file and what was expected in it.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsConfigError;

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, TlsConfigError> {
    std::fs::read(path).map_err(|error| {
        TlsConfigError::new(format!("cannot read {what} {}: {error}", path.display()))
    })
}

/// Returns the certificates of the PEM file at `path` (a chain, leaf first, or
/// a CA bundle), at least one; `what` names the file in errors
/// (`TLS certificate file`).
pub fn read_certificates(
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let text = read_file(path, what)?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| {
            TlsConfigError::new(format!(
                "{what} {} is not valid PEM: {error}",
                path.display()
            ))
        })?;
    if certificates.is_empty() {
        return Err(TlsConfigError::new(format!(
            "{what} {} holds no `BEGIN CERTIFICATE` block",
            path.display()
        )));
    }
    Ok(certificates)
}

/// Returns the PEM private key (PKCS#8, PKCS#1 or SEC1) in the file at `path`;
/// `what` names the file in errors (`TLS key file`).
pub fn read_private_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
    let text = read_file(path, what)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|error| {
        let reason = match error {
            pem::Error::NoItemsFound => "holds no `BEGIN PRIVATE KEY` block".to_string(),
            other => format!("is not a valid PEM private key: {other}"),
        };
        TlsConfigError::new(format!("{what} {} {reason}", path.display()))
    })
}
