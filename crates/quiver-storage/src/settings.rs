//! Connection settings: S3 endpoint, region and credentials, timeouts, retries.

use std::time::Duration;

/// How to reach an S3-compatible server. Filled from the usual AWS variables
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, `AWS_CA_BUNDLE`) or from configuration. Without keys, the
/// store finds credentials the usual AWS way: web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`
/// and `AWS_ROLE_ARN`: EKS IRSA), container credentials, then the instance profile.
/// `Debug` never prints secrets.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Settings {
    /// Endpoint URL of an S3-compatible server; `None` for AWS itself.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token for temporary credentials.
    pub session_token: Option<String>,
    /// Use virtual-hosted-style requests (`bucket.host`); the default is path
    /// style, which every S3-compatible server accepts.
    pub virtual_hosted_style: bool,
    /// A PEM file of CA certificates trusted besides the system's, for an S3 (or
    /// STS) endpoint whose certificate a private CA signed.
    pub ca_bundle: Option<String>,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |value: &Option<String>| value.as_ref().map(|_| "<redacted>");
        formatter
            .debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &redacted(&self.secret_access_key))
            .field("session_token", &redacted(&self.session_token))
            .field("virtual_hosted_style", &self.virtual_hosted_style)
            .field("ca_bundle", &self.ca_bundle)
            .finish()
    }
}

impl S3Settings {
    /// Returns these settings with every unset field taken from `fallback` (config
    /// file values first, then the environment, say).
    pub fn or(self, fallback: S3Settings) -> S3Settings {
        S3Settings {
            endpoint: self.endpoint.or(fallback.endpoint),
            region: self.region.or(fallback.region),
            access_key_id: self.access_key_id.or(fallback.access_key_id),
            secret_access_key: self.secret_access_key.or(fallback.secret_access_key),
            session_token: self.session_token.or(fallback.session_token),
            virtual_hosted_style: self.virtual_hosted_style || fallback.virtual_hosted_style,
            ca_bundle: self.ca_bundle.or(fallback.ca_bundle),
        }
    }

    /// Returns settings from the process environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        S3Settings {
            endpoint: var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL")),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
            session_token: var("AWS_SESSION_TOKEN"),
            virtual_hosted_style: var("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
                .is_some_and(|v| v == "true"),
            ca_bundle: var("AWS_CA_BUNDLE"),
        }
    }

    /// Returns the region, defaulting to `us-east-1`.
    pub fn region_or_default(&self) -> &str {
        self.region.as_deref().unwrap_or("us-east-1")
    }
}

/// Timeouts, retries and upload sizes of a [`crate::Storage`].
///
/// How they map onto object_store's S3 client (the defaults, and why):
///
/// - `request_timeout` (30 s) is reqwest's whole-request timeout, body included, per
///   attempt: a stalled server or a body that stops flowing fails the attempt. It
///   bounds one 16 MiB cache region or upload part to a floor of ~0.5 MiB/s.
/// - `connect_timeout` (5 s): an unreachable endpoint fails fast and is retried.
/// - `max_retries` (5) with exponential backoff from `initial_backoff` (100 ms,
///   doubling, capped at 15 s, with jitter): object_store retries 5xx answers, 429
///   and 408, connection errors and resets, and timeouts of idempotent requests —
///   every request Quiver makes is idempotent (GET, HEAD, PUT of a new key,
///   DELETE). A GET whose body breaks off midway is resumed from where it stopped
///   (same ETag), so a truncated body is retried, not returned.
/// - `operation_timeout` (120 s) bounds one operation, retries included (it is also
///   object_store's `retry_timeout`, which its docs ask to keep under 5 minutes so
///   signed requests do not expire).
///   A multipart upload gets it once per started GiB, and when it fails after
///   its parts went up, the object is looked up before the failure is believed
///   (an answer to `CompleteMultipartUpload` lost after the server acted).
///
/// A short body that still looks complete is caught above this layer: ranged reads
/// check their length, WAL objects and deletion bitmaps carry a CRC-32C, segments a
/// CRC-32C per 1 MiB chunk.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageOptions {
    /// Bound on one operation, retries included.
    pub operation_timeout: Duration,
    /// Bound on one HTTP request.
    pub request_timeout: Duration,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Retries of a failed request (exponential backoff with jitter).
    pub max_retries: usize,
    /// First retry delay.
    pub initial_backoff: Duration,
    /// Objects larger than this are uploaded in parts.
    pub multipart_threshold_bytes: usize,
    /// Size of one uploaded part.
    pub part_size_bytes: usize,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            operation_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 5,
            initial_backoff: Duration::from_millis(100),
            multipart_threshold_bytes: 64 << 20,
            part_size_bytes: 16 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_config_with_unknown_keys_rejected() {
        let parsed: S3Settings =
            serde_json::from_str(r#"{"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1"}"#)
                .unwrap();
        assert_eq!(parsed.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        let merged = parsed.or(S3Settings {
            region: Some("us-east-1".into()),
            access_key_id: Some("k".into()),
            ..Default::default()
        });
        assert_eq!(merged.region.as_deref(), Some("eu-west-1"));
        assert_eq!(merged.access_key_id.as_deref(), Some("k"));
        let error = serde_json::from_str::<S3Settings>(r#"{"endpont": "x"}"#).unwrap_err();
        assert!(error.to_string().contains("endpont"), "{error}");
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let settings = S3Settings {
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some("s3cr3t-value".into()),
            session_token: Some("t0ken-value".into()),
            ..Default::default()
        };
        let shown = format!("{settings:?}");
        assert!(
            shown.contains("AKIDEXAMPLE") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert!(
            !shown.contains("s3cr3t-value") && !shown.contains("t0ken-value"),
            "{shown}"
        );
    }
}
