//! The S3-compatible test server (moto in CI) named by `QUIVER_TEST_S3_ENDPOINT`,
//! and fresh buckets on it.

use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

use crate::ci::skip_or_fail;

/// The environment variable naming the S3 test server's endpoint (`http://host:port`).
pub const S3_ENDPOINT_VARIABLE: &str = "QUIVER_TEST_S3_ENDPOINT";

/// The region and the access key pair the test server accepts (moto takes any).
const REGION: &str = "us-east-1";
const ACCESS_KEY_ID: &str = "testing";
const SECRET_ACCESS_KEY: &str = "testing";

/// The S3 test server of this run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3TestServer {
    endpoint: String,
}

impl S3TestServer {
    /// Returns the server named by `QUIVER_TEST_S3_ENDPOINT`. When it is unset,
    /// skips `what` (e.g. "this test", "the S3 store of this test") visibly and
    /// returns `None` — or, under CI, panics saying the S3 server is missing.
    #[track_caller]
    pub fn from_env(what: &str) -> Option<S3TestServer> {
        match std::env::var(S3_ENDPOINT_VARIABLE) {
            Ok(endpoint) if !endpoint.trim().is_empty() => Some(S3TestServer {
                endpoint: endpoint.trim().to_string(),
            }),
            _ => {
                skip_or_fail(
                    what,
                    &format!(
                        "{S3_ENDPOINT_VARIABLE} is not set, so there is no S3 test server \
                         (start one, e.g. `moto_server -p 5000`, and set \
                         {S3_ENDPOINT_VARIABLE}=http://127.0.0.1:5000)"
                    ),
                );
                None
            }
        }
    }

    /// Returns the server at `endpoint` (`http://host:port`), for code handed
    /// the endpoint of [`S3TestServer::from_env`].
    pub fn at(endpoint: &str) -> S3TestServer {
        S3TestServer {
            endpoint: endpoint.to_string(),
        }
    }

    /// Returns the server's endpoint (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Returns the settings that reach the server (path-style, test keys).
    pub fn settings(&self) -> S3Settings {
        S3TestServer::settings_via(&self.endpoint)
    }

    /// Returns the server's settings with `endpoint` in place of its own (a
    /// proxy in front of it).
    pub fn settings_via(endpoint: &str) -> S3Settings {
        S3Settings {
            endpoint: Some(endpoint.to_string()),
            region: Some(REGION.into()),
            access_key_id: Some(ACCESS_KEY_ID.into()),
            secret_access_key: Some(SECRET_ACCESS_KEY.into()),
            ..S3Settings::default()
        }
    }

    /// Returns the `AWS_*` environment a `quiver` process needs to reach the server.
    pub fn process_env(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_string()),
        ]
    }

    /// Creates a bucket no other test uses (see [`fresh_bucket_name`]) and
    /// returns its name; panics if the server refuses.
    pub async fn create_bucket(&self, prefix: &str) -> String {
        let bucket = fresh_bucket_name(prefix);
        if let Err(error) = quiver_storage::ensure_bucket(&self.settings(), &bucket).await {
            panic!(
                "cannot create bucket {bucket} on the S3 test server {}: {error}",
                self.endpoint
            );
        }
        bucket
    }

    /// Returns storage over `s3://bucket/key_prefix` on the server, with `options`.
    pub fn storage(&self, bucket: &str, key_prefix: &str, options: StorageOptions) -> Storage {
        self.storage_via(&self.endpoint, bucket, key_prefix, options)
    }

    /// Returns storage over `s3://bucket/key_prefix` reached through `endpoint`
    /// (a proxy in front of the server), with `options`.
    pub fn storage_via(
        &self,
        endpoint: &str,
        bucket: &str,
        key_prefix: &str,
        options: StorageOptions,
    ) -> Storage {
        let url: StoreUrl = format!("s3://{bucket}/{key_prefix}")
            .parse()
            .unwrap_or_else(|error| panic!("s3://{bucket}/{key_prefix}: {error}"));
        Storage::open(&url, &S3TestServer::settings_via(endpoint), options)
            .unwrap_or_else(|error| panic!("opening s3://{bucket}/{key_prefix}: {error}"))
    }

    /// Returns storage over a fresh bucket (named from `bucket_prefix`) under
    /// `key_prefix`, with the default options.
    pub async fn fresh_storage(&self, bucket_prefix: &str, key_prefix: &str) -> Storage {
        let bucket = self.create_bucket(bucket_prefix).await;
        self.storage(&bucket, key_prefix, StorageOptions::default())
    }
}

/// Returns a bucket name no other test of any process uses:
/// `{prefix}-{process id}-{random}`, lowercase and at most 63 characters.
pub fn fresh_bucket_name(prefix: &str) -> String {
    let suffix = format!("-{}-{:08x}", std::process::id(), rand::random::<u32>());
    let prefix: String = prefix
        .chars()
        .map(|character| match character.to_ascii_lowercase() {
            lower @ ('a'..='z' | '0'..='9' | '-') => lower,
            _ => '-',
        })
        .take(63 - suffix.len())
        .collect();
    format!("{prefix}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_are_fresh_and_valid() {
        let first = fresh_bucket_name("Quiver_Storage.Test");
        let second = fresh_bucket_name("Quiver_Storage.Test");
        assert_ne!(first, second);
        assert!(first.starts_with("quiver-storage-test-"), "{first}");
        let long = fresh_bucket_name(&"x".repeat(100));
        assert!(long.len() <= 63, "{long}");
    }

    #[test]
    fn settings_reach_the_endpoint_path_style() {
        let server = S3TestServer {
            endpoint: "http://127.0.0.1:5000".into(),
        };
        let settings = server.settings();
        assert_eq!(settings.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(!settings.virtual_hosted_style);
        assert_eq!(server.process_env()[0].1, "http://127.0.0.1:5000");
    }
}
