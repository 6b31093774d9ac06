//! TLS for `https://` endpoints (the system's CA certificates plus any given),
//! and telling TLS failures apart from other connection failures.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Returns a rustls client configuration trusting the system's CA certificates
/// and `extra_ca_pem`.
pub(crate) fn tls_config(
    extra_ca_pem: Option<&[u8]>,
) -> std::result::Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped; a given CA may be all we need.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(pem) = extra_ca_pem {
        let certificates = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|error| format!("the CA certificate is not valid PEM: {error}"))?;
        if certificates.is_empty() {
            return Err("the CA certificate file holds no `BEGIN CERTIFICATE` block".into());
        }
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|error| format!("the CA certificate is not usable: {error}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS protocol versions: {error}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Returns an error's message with the messages of its causes (reqwest's own
/// message leaves out why a connection failed).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Tells whether a failed request failed in TLS (a rustls error among its
/// causes, possibly wrapped in I/O errors, whose `source` skips the wrapped error).
pub(crate) fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if cause.is::<rustls::Error>() {
            return true;
        }
        if let Some(inner) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && is_tls_failure(inner)
        {
            return true;
        }
        source = cause.source();
    }
    false
}
