//! What a failed TLS handshake between roles means: rustls's reason plus what
//! to check, so the log line or error points at the flag to fix.

use rustls::{AlertDescription, CertificateError};

/// Which end of the handshake this process was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// This process accepted the connection (the peer is a client).
    Server,
    /// This process dialled the connection (the peer is a server).
    Client,
}

/// Returns rustls's reason for a failed handshake with what it most likely
/// means between Quiver roles.
pub(crate) fn explain_handshake_failure(error: &std::io::Error, side: Side) -> String {
    let tls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    let Some(tls_error) = tls_error else {
        let closed = matches!(
            error.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        );
        if closed {
            return format!(
                "{error} (the peer closed the connection during the TLS handshake: does it have TLS between roles turned on?)"
            );
        }
        return error.to_string();
    };
    let hint = match (tls_error, side) {
        (rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer), Side::Server) => Some(
            "the client's certificate is not signed by this node's cluster CA (--cluster-tls-ca)",
        ),
        (rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer), Side::Client) => Some(
            "the server's certificate is not signed by this node's cluster CA (--cluster-tls-ca)",
        ),
        (rustls::Error::InvalidCertificate(_), Side::Server) => {
            Some("the client's certificate is not acceptable")
        }
        (rustls::Error::InvalidCertificate(_), Side::Client) => {
            Some("the server's certificate is not acceptable")
        }
        (rustls::Error::NoCertificatesPresented, Side::Server) => Some(
            "the client presented no certificate: it needs --cluster-tls-cert and --cluster-tls-key",
        ),
        (rustls::Error::AlertReceived(alert), _) if is_certificate_alert(*alert) => {
            Some(match side {
                Side::Server => {
                    "the client refused this node's certificate: is it signed by the client's cluster CA?"
                }
                Side::Client => {
                    "the server refused this node's certificate: is it signed by the server's cluster CA?"
                }
            })
        }
        (
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. },
            _,
        ) => Some("the peer does not speak TLS: does it have TLS between roles turned on?"),
        _ => None,
    };
    match hint {
        Some(hint) => format!("{tls_error} ({hint})"),
        None => tls_error.to_string(),
    }
}

fn is_certificate_alert(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateExpired
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::AccessDenied
            | AlertDescription::DecryptError
    )
}
