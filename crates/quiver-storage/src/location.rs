//! Object store URLs: `s3://bucket/prefix`, `file:///abs/path`, `memory://`.

use std::path::PathBuf;

use crate::error::{StorageError, StorageResult};

/// Where objects live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// An S3 (or S3-compatible) bucket, with an optional key prefix.
    S3 { bucket: String, prefix: String },
    /// A directory on local disk.
    File { root: PathBuf },
    /// Process memory (tests and experiments; lost on exit).
    Memory,
}

impl std::str::FromStr for StoreUrl {
    type Err = StorageError;

    fn from_str(text: &str) -> StorageResult<Self> {
        let invalid = |reason: &str| StorageError::InvalidUrl {
            url: text.to_string(),
            reason: reason.to_string(),
        };
        let parsed = url::Url::parse(text).map_err(|error| invalid(&error.to_string()))?;
        match parsed.scheme() {
            "s3" => {
                let bucket = parsed
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| invalid("no bucket name"))?;
                let prefix = parsed.path().trim_matches('/').to_string();
                Ok(StoreUrl::S3 {
                    bucket: bucket.to_string(),
                    prefix,
                })
            }
            "file" => {
                let root = parsed
                    .to_file_path()
                    .map_err(|_| invalid("a file URL needs an absolute path"))?;
                Ok(StoreUrl::File { root })
            }
            "memory" => Ok(StoreUrl::Memory),
            other => Err(invalid(&format!(
                "unsupported scheme {other:?}: expected s3, file or memory"
            ))),
        }
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::S3 { bucket, prefix } if prefix.is_empty() => {
                write!(formatter, "s3://{bucket}")
            }
            StoreUrl::S3 { bucket, prefix } => write!(formatter, "s3://{bucket}/{prefix}"),
            StoreUrl::File { root } => write!(formatter, "file://{}", root.display()),
            StoreUrl::Memory => write!(formatter, "memory://"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme_and_rejects_the_rest() {
        assert_eq!(
            "s3://bucket/a/b/".parse::<StoreUrl>().unwrap(),
            StoreUrl::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(
            "s3://bucket".parse::<StoreUrl>().unwrap(),
            StoreUrl::S3 {
                bucket: "bucket".into(),
                prefix: "".into()
            }
        );
        assert_eq!(
            "file:///tmp/x".parse::<StoreUrl>().unwrap(),
            StoreUrl::File {
                root: "/tmp/x".into()
            }
        );
        assert_eq!("memory://".parse::<StoreUrl>().unwrap(), StoreUrl::Memory);
        for bad in ["gs://bucket", "s3://", "not a url", "file://otherhost/x"] {
            let error = bad.parse::<StoreUrl>().unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
        assert_eq!(
            "s3://b/p".parse::<StoreUrl>().unwrap().to_string(),
            "s3://b/p"
        );
    }
}
