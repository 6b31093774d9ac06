//! The data roles' sections of the config file (`[storage]`, `[indexer]`,
//! `[searcher]`), checked before anything starts, and the size syntax of flags.

use std::time::Duration;

use anyhow::bail;
use quiver_indexer::IndexerConfig;
use quiver_searcher::SearcherNodeConfig;
use quiver_storage::{S3Settings, StorageOptions};
use serde::Deserialize;

/// Parses sizes like `16MiB`, `10GiB`, `1000000`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|error| format!("`{text}` is not a size like 512MiB or 10GiB: {error}"))
}

/// How big a searcher's region cache is: a size (`10GiB`) or a share of the free
/// space of the disk holding the cache directory (`80%`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSize {
    /// Exactly this many bytes (rounded down to whole regions).
    Bytes(u64),
    /// This percentage of the cache disk's free space, measured at start.
    ShareOfFreeSpace(u8),
}

/// Parses a cache size: `512MiB`, `10GiB`, or `80%` of the cache disk's free space.
pub fn parse_cache_size(text: &str) -> Result<CacheSize, String> {
    let text = text.trim();
    if let Some(percent) = text.strip_suffix('%') {
        return match percent.trim().parse::<u8>() {
            Ok(percent @ 1..=100) => Ok(CacheSize::ShareOfFreeSpace(percent)),
            _ => Err(format!(
                "`{text}` is not a share of the free disk space between 1% and 100%"
            )),
        };
    }
    parse_size(text).map(CacheSize::Bytes)
}

/// Options of the data roles' config file sections.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFileConfig {
    /// `[storage]`: S3 settings (the AWS_* variables override), timeouts and retries.
    #[serde(default)]
    pub storage: Option<StorageFileConfig>,
    /// `[indexer]`: write-path knobs.
    #[serde(default)]
    pub indexer: Option<IndexerConfig>,
    /// `[searcher]`: read-path knobs.
    #[serde(default)]
    pub searcher: Option<SearcherFileConfig>,
}

/// The `[storage]` section of the config file: how to reach S3 (the `AWS_*`
/// variables override these keys) and how long to wait for it. Unset timeouts
/// keep the defaults of [`StorageOptions`].
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageFileConfig {
    /// Endpoint URL of an S3-compatible server.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
    /// Virtual-hosted-style requests instead of path style.
    #[serde(default)]
    pub virtual_hosted_style: bool,
    /// PEM file of CA certificates trusted besides the system's (`AWS_CA_BUNDLE`).
    pub ca_bundle: Option<String>,
    /// Bound on one HTTP request, body included (ms; default 30000).
    pub request_timeout_ms: Option<u64>,
    /// Bound on connecting (ms; default 5000).
    pub connect_timeout_ms: Option<u64>,
    /// Bound on one operation, retries included (ms; default 120000).
    pub operation_timeout_ms: Option<u64>,
    /// Retries of a failed request (default 5).
    pub max_retries: Option<usize>,
    /// First retry delay, doubling after each retry (ms; default 100).
    pub initial_backoff_ms: Option<u64>,
}

impl std::fmt::Debug for StorageFileConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StorageFileConfig")
            .field("settings", &self.settings())
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("operation_timeout_ms", &self.operation_timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("initial_backoff_ms", &self.initial_backoff_ms)
            .finish()
    }
}

impl StorageFileConfig {
    /// Returns the S3 connection settings of the section.
    pub fn settings(&self) -> S3Settings {
        S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            session_token: self.session_token.clone(),
            virtual_hosted_style: self.virtual_hosted_style,
            ca_bundle: self.ca_bundle.clone(),
        }
    }

    /// Returns the timeouts and retries of the section over the defaults;
    /// refuses zero timeouts and a request timeout beyond the operation timeout.
    pub fn options(&self) -> anyhow::Result<StorageOptions> {
        let mut options = StorageOptions::default();
        for (key, value, field) in [
            (
                "request_timeout_ms",
                self.request_timeout_ms,
                &mut options.request_timeout,
            ),
            (
                "connect_timeout_ms",
                self.connect_timeout_ms,
                &mut options.connect_timeout,
            ),
            (
                "operation_timeout_ms",
                self.operation_timeout_ms,
                &mut options.operation_timeout,
            ),
            (
                "initial_backoff_ms",
                self.initial_backoff_ms,
                &mut options.initial_backoff,
            ),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    bail!("[storage] {key} must be positive");
                }
                *field = Duration::from_millis(ms);
            }
        }
        if let Some(retries) = self.max_retries {
            options.max_retries = retries;
        }
        if options.request_timeout > options.operation_timeout {
            bail!(
                "[storage] request_timeout_ms ({} ms) exceeds operation_timeout_ms ({} ms)",
                options.request_timeout.as_millis(),
                options.operation_timeout.as_millis()
            );
        }
        Ok(options)
    }
}

/// The `[searcher]` section of the config file (flags win over the cache keys).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearcherFileConfig {
    /// How often the searcher heartbeats to meta (ms; default 1000).
    pub heartbeat_interval_ms: Option<u64>,
    /// How often it also reads the whole routing table besides the watch stream (ms; default 15000).
    pub safety_poll_interval_ms: Option<u64>,
    /// First pause before reopening a broken watch stream (ms; default 100).
    pub watch_initial_backoff_ms: Option<u64>,
    /// Longest pause before reopening a broken watch stream (ms; default 5000).
    pub watch_max_backoff_ms: Option<u64>,
}

impl SearcherFileConfig {
    /// Checks the section without a node (at start, before anything is created).
    pub fn validate(&self) -> anyhow::Result<()> {
        self.apply(&mut SearcherNodeConfig::new("check", "check"))
    }

    /// Applies the section to `config`; refuses zero periods.
    pub(crate) fn apply(&self, config: &mut SearcherNodeConfig) -> anyhow::Result<()> {
        for (key, value, field) in [
            (
                "heartbeat_interval_ms",
                self.heartbeat_interval_ms,
                &mut config.heartbeat_interval,
            ),
            (
                "safety_poll_interval_ms",
                self.safety_poll_interval_ms,
                &mut config.safety_poll_interval,
            ),
            (
                "watch_initial_backoff_ms",
                self.watch_initial_backoff_ms,
                &mut config.watch_initial_backoff,
            ),
            (
                "watch_max_backoff_ms",
                self.watch_max_backoff_ms,
                &mut config.watch_max_backoff,
            ),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    bail!("[searcher] {key} must be positive");
                }
                *field = Duration::from_millis(ms);
            }
        }
        if config.watch_initial_backoff > config.watch_max_backoff {
            bail!("[searcher] watch_initial_backoff_ms exceeds watch_max_backoff_ms");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_are_sizes_or_shares_of_the_free_space() {
        assert_eq!(parse_cache_size("10GiB"), Ok(CacheSize::Bytes(10 << 30)));
        assert_eq!(
            parse_cache_size(" 80% "),
            Ok(CacheSize::ShareOfFreeSpace(80))
        );
        assert_eq!(
            parse_cache_size("100%"),
            Ok(CacheSize::ShareOfFreeSpace(100))
        );
        for bad in ["0%", "101%", "-5%", "half%"] {
            let error = parse_cache_size(bad).unwrap_err();
            assert!(error.contains("between 1% and 100%"), "{bad}: {error}");
        }
        assert!(parse_cache_size("lots").unwrap_err().contains("not a size"));
    }
}
