//! The SDK's error: the server's answer decoded from its JSON error body (its
//! code typed as [`ErrorCode`], its retry hint), or a failure to reach it.

use std::time::Duration;

use quiver_api::ErrorCode;
use quiver_common::Retryable;

/// Everything that can go wrong calling the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error.
    #[error("{code_name}: {message}")]
    Api {
        /// The error code, when the body carried one this SDK knows.
        code: Option<ErrorCode>,
        /// The code as sent (`"NOT_FOUND"`, a code newer than this SDK), or
        /// `HTTP <status>` when the body was not a Quiver error body.
        code_name: String,
        /// What was wrong.
        message: String,
        /// The HTTP status.
        status: u16,
        /// How long the server asked to wait before retrying (`retry-after-ms`,
        /// else `Retry-After`).
        retry_after: Option<Duration>,
    },
    /// The server could not be reached or the connection failed.
    #[error("cannot reach {endpoint}: {reason}")]
    Transport { endpoint: String, reason: String },
    /// TLS failed: the server's certificate is not trusted or does not name the
    /// host, or one side does not speak TLS. Not retried: it fails until fixed.
    #[error("TLS with {endpoint} failed: {reason}")]
    Tls { endpoint: String, reason: String },
    /// The answer was not what the API promises.
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
}

impl Error {
    /// Returns the error code: the server's (from the JSON error body; `None`
    /// for a code this SDK does not know, or a body that was not Quiver's),
    /// `UNAVAILABLE` when the server could not be reached, `INTERNAL` when its
    /// answer could not be read.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Api { code, .. } => *code,
            Error::Transport { .. } | Error::Tls { .. } => Some(ErrorCode::Unavailable),
            Error::Decode(_) => Some(ErrorCode::Internal),
        }
    }

    /// Returns how long the server asked to wait before retrying, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Returns the HTTP status of an answered request.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Unavailable (a leader or lease moving) and resource exhausted (writes waiting
/// for a flush) pass; so do connection failures and a proxy's 5xx page. TLS
/// failures, refusals and unknown codes do not.
impl Retryable for Error {
    fn is_retryable(&self) -> bool {
        match self {
            Error::Api {
                code: Some(code), ..
            } => matches!(code, ErrorCode::Unavailable | ErrorCode::ResourceExhausted),
            Error::Api {
                code: None,
                code_name,
                status,
                ..
            } => *status >= 500 && code_name.starts_with("HTTP "),
            Error::Transport { .. } => true,
            Error::Tls { .. } | Error::Decode(_) => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        Error::retry_after(self)
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
