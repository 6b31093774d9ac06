//! The client: one method per REST endpoint, each sending and returning the wire
//! types of `quiver-api`, retrying what is safe to repeat.

use std::time::Duration;

use quiver_api::{
    BatchSearchRequest, BatchSearchResponse, ClusterStatus, Collection, CollectionShards,
    CompactResponse, CreateCollectionRequest, DescribeCollectionResponse, ErrorBody,
    GetPointsResponse, ListCollectionsResponse, MetaMembersRequest, MetaMembersResponse, Node,
    OrphansResponse, Point, PointId, PointIdsRequest, PointRecord, SearchRequest, SearchResponse,
    UpsertRequest, WriteResponse,
};
use quiver_common::{RETRY_AFTER_MS_HEADER, RetryPolicy};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tls::{error_chain, is_tls_failure, tls_config};

/// How calls that are safe to repeat are retried (full jitter, so clients that
/// failed together do not come back together), bounded in time by
/// [`Client`]'s retry deadline; a server's retry hint is waited at least, plus up
/// to a quarter of it more at random.
const RETRY: RetryPolicy = RetryPolicy::new(
    usize::MAX,
    Duration::from_millis(100),
    Duration::from_secs(2),
);

/// A collection to create (a convenience over [`CreateCollectionRequest`], which
/// [`Client::create_collection_with`] takes as is).
#[derive(Clone, Debug, Default)]
pub struct CollectionConfig {
    /// Vector dimension.
    pub dimension: u32,
    /// `cosine`, `dot` or `l2`.
    pub metric: String,
    /// `u64` (default) or `string`.
    pub id_type: Option<String>,
    /// Number of shards (default 1).
    pub shards: Option<u32>,
    /// Searchers per shard (default 1).
    pub replication: Option<u32>,
    /// `[{"name": …, "type": "keyword"|"integer"|"float"|"bool"}]`.
    pub payload_schema: Vec<Value>,
}

impl From<&CollectionConfig> for CreateCollectionRequest {
    fn from(config: &CollectionConfig) -> Self {
        CreateCollectionRequest {
            dimension: config.dimension,
            metric: config.metric.clone(),
            id_type: config.id_type.clone(),
            shards: config.shards,
            replication: config.replication,
            index: None,
            payload_schema: (!config.payload_schema.is_empty())
                .then(|| Value::Array(config.payload_schema.clone())),
        }
    }
}

/// How to reach a server, besides its address.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// API key, sent as a bearer token.
    pub api_key: Option<String>,
    /// PEM CA certificates trusted for `https://` endpoints besides the system's
    /// (for a private CA or a self-signed gateway certificate).
    pub ca_certificate_pem: Option<Vec<u8>>,
}

/// A client of one Quiver endpoint (a gateway or `quiver standalone`).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    retry_deadline: Duration,
}

/// Returns the retry hint of an answer: `retry-after-ms`, else `Retry-After`
/// (seconds; an HTTP date is not worth parsing for a hint).
fn retry_hint(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    header(RETRY_AFTER_MS_HEADER)
        .map(Duration::from_millis)
        .or_else(|| header(reqwest::header::RETRY_AFTER.as_str()).map(Duration::from_secs))
}

/// Returns the error of a refused request: the JSON error body's code and message,
/// or, when the body is not one (a proxy's page), the status and the body's start.
fn api_error(status: u16, text: &str, retry_after: Option<Duration>) -> Error {
    match serde_json::from_str::<ErrorBody>(text) {
        Ok(body) => Error::Api {
            code: body.error.error_code(),
            code_name: body.error.code,
            message: body.error.message,
            status,
            retry_after,
        },
        Err(_) => Error::Api {
            code: None,
            code_name: format!("HTTP {status}"),
            message: text.chars().take(200).collect(),
            status,
            retry_after,
        },
    }
}

impl Client {
    /// Returns a client for `endpoint` (e.g. `http://127.0.0.1:7700`).
    pub fn new(endpoint: &str, api_key: Option<String>) -> Result<Client> {
        Client::with_options(
            endpoint,
            ClientOptions {
                api_key,
                ..ClientOptions::default()
            },
        )
    }

    /// Returns a client for `endpoint` with `options` (API key, CA certificates).
    pub fn with_options(endpoint: &str, options: ClientOptions) -> Result<Client> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(Error::Transport {
                endpoint,
                reason: "the endpoint must start with http:// or https://".into(),
            });
        }
        // Always our own TLS settings, also for http:// (reqwest would otherwise
        // look for a process-wide rustls provider).
        let config =
            tls_config(options.ca_certificate_pem.as_deref()).map_err(|reason| Error::Tls {
                endpoint: endpoint.clone(),
                reason,
            })?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(5))
            .use_preconfigured_tls(config)
            .build()
            .map_err(|error| Error::Transport {
                endpoint: endpoint.clone(),
                reason: error_chain(&error),
            })?;
        Ok(Client {
            http,
            endpoint,
            api_key: options.api_key,
            retry_deadline: Duration::from_secs(60),
        })
    }

    fn transport_error(&self, error: &reqwest::Error) -> Error {
        if is_tls_failure(error) {
            Error::Tls {
                endpoint: self.endpoint.clone(),
                reason: format!(
                    "{}; if the server's certificate comes from a private CA, trust it (quiverctl --ca-cert or QUIVER_CA_CERT)",
                    error_chain(error)
                ),
            }
        } else {
            Error::Transport {
                endpoint: self.endpoint.clone(),
                reason: error_chain(error),
            }
        }
    }

    /// Returns the endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one request; decodes the answer as `T` or the error body.
    async fn call_once<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.endpoint))
            .header("x-request-id", uuid::Uuid::new_v4().to_string());
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|error| self.transport_error(&error))?;
        let status = response.status().as_u16();
        let retry_after = retry_hint(response.headers());
        // The body's bytes are decoded as they are: serde_json checks the UTF-8
        // of what it reads, and a lossy copy of a search answer with payloads
        // (reqwest's `text`) cost the caller more CPU than decoding it.
        let body = response
            .bytes()
            .await
            .map_err(|error| self.transport_error(&error))?;
        if status >= 400 {
            return Err(api_error(
                status,
                &String::from_utf8_lossy(&body),
                retry_after,
            ));
        }
        serde_json::from_slice(&body).map_err(|error| {
            Error::Decode(format!(
                "{error}: {}",
                String::from_utf8_lossy(&body[..body.len().min(800)])
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))
        })
    }

    /// Sends a request, retrying (when `retry`) while the server is briefly
    /// unavailable or overloaded, up to the retry deadline.
    async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        retry: bool,
    ) -> Result<T> {
        let policy = if retry {
            RETRY.with_max_elapsed(self.retry_deadline)
        } else {
            RetryPolicy::new(1, Duration::ZERO, Duration::ZERO)
        };
        policy
            .retry(|_attempt| self.call_once(method.clone(), path, body))
            .await
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call::<(), T>(reqwest::Method::GET, path, None, true)
            .await
    }

    fn collection_path(name: &str, rest: &str) -> String {
        format!("/v1/collections/{name}{rest}")
    }

    /// Creates a collection; returns its definition.
    pub async fn create_collection(
        &self,
        name: &str,
        config: &CollectionConfig,
    ) -> Result<Collection> {
        self.create_collection_with(name, &CreateCollectionRequest::from(config))
            .await
    }

    /// Creates a collection from the full request (index options, a schema
    /// object); returns its definition.
    pub async fn create_collection_with(
        &self,
        name: &str,
        request: &CreateCollectionRequest,
    ) -> Result<Collection> {
        self.call(
            reqwest::Method::PUT,
            &Self::collection_path(name, ""),
            Some(request),
            false,
        )
        .await
    }

    /// Lists the collections.
    pub async fn list_collections(&self) -> Result<Vec<Collection>> {
        let answer: ListCollectionsResponse = self.get_json("/v1/collections").await?;
        Ok(answer.collections)
    }

    /// Describes a collection, with `points` (live, deletions applied).
    pub async fn describe(&self, name: &str) -> Result<DescribeCollectionResponse> {
        self.get_json(&Self::collection_path(name, "")).await
    }

    /// Drops a collection.
    pub async fn drop_collection(&self, name: &str) -> Result<()> {
        self.call::<(), Value>(
            reqwest::Method::DELETE,
            &Self::collection_path(name, ""),
            None,
            false,
        )
        .await
        .map(|_| ())
    }

    /// Upserts points; returns the write's sequence.
    pub async fn upsert(&self, name: &str, points: &[Point]) -> Result<u64> {
        let request = UpsertRequest {
            points: points.to_vec(),
        };
        let answer: WriteResponse = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points"),
                Some(&request),
                true,
            )
            .await?;
        Ok(answer.sequence)
    }

    /// Deletes points; returns the write's sequence.
    pub async fn delete(&self, name: &str, ids: &[PointId]) -> Result<u64> {
        let request = PointIdsRequest {
            ids: ids.to_vec(),
            ..PointIdsRequest::default()
        };
        let answer: WriteResponse = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points/delete"),
                Some(&request),
                true,
            )
            .await?;
        Ok(answer.sequence)
    }

    /// Reads points by id (missing ids are left out).
    pub async fn get(
        &self,
        name: &str,
        ids: &[PointId],
        include_vector: bool,
    ) -> Result<Vec<PointRecord>> {
        let request = PointIdsRequest {
            ids: ids.to_vec(),
            include_vector,
            consistency: None,
        };
        let answer: GetPointsResponse = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points/get"),
                Some(&request),
                true,
            )
            .await?;
        Ok(answer.points)
    }

    /// Searches a collection.
    pub async fn search(&self, name: &str, search: &SearchRequest) -> Result<SearchResponse> {
        self.call(
            reqwest::Method::POST,
            &Self::collection_path(name, "/search"),
            Some(search),
            true,
        )
        .await
    }

    /// Runs several searches in one request; returns their answers in order.
    pub async fn search_batch(
        &self,
        name: &str,
        searches: &[SearchRequest],
    ) -> Result<Vec<SearchResponse>> {
        let request = BatchSearchRequest {
            searches: searches.to_vec(),
        };
        let answer: BatchSearchResponse = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/search/batch"),
                Some(&request),
                true,
            )
            .await?;
        Ok(answer.results)
    }

    /// Returns the cluster status (admin).
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        self.get_json("/admin/v1/cluster").await
    }

    /// Returns a collection's shards (admin).
    pub async fn shards(&self, name: &str) -> Result<CollectionShards> {
        self.get_json(&format!("/admin/v1/collections/{name}/shards"))
            .await
    }

    /// Merges a collection's segments and waits until every shard is done
    /// (admin); the answer's `merges` counts them all. A large shard compacts
    /// for longer than one request may wait: the gateway then answers `202`
    /// with `"done": false`, the compaction goes on, and this asks again.
    pub async fn compact(&self, name: &str) -> Result<CompactResponse> {
        let mut merges = 0;
        loop {
            let mut answer = self.compact_once(name).await?;
            merges += answer.merges;
            if answer.done {
                answer.merges = merges;
                return Ok(answer);
            }
        }
    }

    /// One compaction request (admin): `done: true` with its `merges`, or
    /// `done: false` with the `running_shards` still compacting when the gateway
    /// stopped waiting (ask again to join them).
    pub async fn compact_once(&self, name: &str) -> Result<CompactResponse> {
        self.call::<(), CompactResponse>(
            reqwest::Method::POST,
            &format!("/admin/v1/collections/{name}/compact"),
            None,
            true,
        )
        .await
    }

    /// Lists orphaned objects: objects in the bucket that no manifest and no GC
    /// entry knows (left by a crash between an upload and its commit), with when
    /// the indexers' sweep will delete them (admin).
    pub async fn orphans(&self) -> Result<OrphansResponse> {
        self.get_json("/admin/v1/orphans").await
    }

    /// Drains a node (admin); returns the node as it is now.
    pub async fn drain(&self, node: &str) -> Result<Node> {
        self.call::<(), Node>(
            reqwest::Method::POST,
            &format!("/admin/v1/nodes/{node}/drain"),
            None,
            true,
        )
        .await
    }

    /// Adds (`add`, with an address), promotes or removes a metadata node (admin);
    /// returns the members after the change.
    pub async fn meta_members(
        &self,
        action: &str,
        id: u64,
        address: Option<&str>,
    ) -> Result<MetaMembersResponse> {
        let request = MetaMembersRequest {
            action: action.to_string(),
            id,
            address: address.map(str::to_string),
        };
        self.call(
            reqwest::Method::POST,
            "/admin/v1/meta/members",
            Some(&request),
            false,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use quiver_common::Retryable;

    use super::*;

    #[test]
    fn an_error_body_gives_a_typed_code_and_the_retry_hint() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(RETRY_AFTER_MS_HEADER, "750".parse().unwrap());
        headers.insert(reqwest::header::RETRY_AFTER, "1".parse().unwrap());
        let hint = retry_hint(&headers);
        assert_eq!(hint, Some(Duration::from_millis(750)));
        let error = api_error(
            429,
            r#"{"error": {"code": "RESOURCE_EXHAUSTED", "message": "shard 0 is behind"}}"#,
            hint,
        );
        assert_eq!(error.code(), Some(quiver_api::ErrorCode::ResourceExhausted));
        assert_eq!(error.retry_after(), Some(Duration::from_millis(750)));
        assert!(error.is_retryable());
        assert_eq!(error.to_string(), "RESOURCE_EXHAUSTED: shard 0 is behind");
    }

    #[test]
    fn codes_come_from_the_body_never_from_the_message() {
        let refused = api_error(
            400,
            r#"{"error": {"code": "INVALID_ARGUMENT", "message": "UNAVAILABLE is not a metric"}}"#,
            None,
        );
        assert_eq!(refused.code(), Some(quiver_api::ErrorCode::InvalidArgument));
        assert!(!refused.is_retryable());
        let data_loss = api_error(
            500,
            r#"{"error": {"code": "DATA_LOSS", "message": "segment s1: checksum mismatch"}}"#,
            None,
        );
        assert_eq!(data_loss.code(), Some(quiver_api::ErrorCode::DataLoss));
        assert!(!data_loss.is_retryable());
        let newer = api_error(
            409,
            r#"{"error": {"code": "ABORTED", "message": "m"}}"#,
            None,
        );
        assert_eq!(newer.code(), None);
        assert!(newer.to_string().starts_with("ABORTED"));
        let proxy = api_error(502, "<html>bad gateway</html>", None);
        assert_eq!(proxy.code(), None);
        assert!(proxy.is_retryable(), "a proxy's 5xx page is retried");
        let seconds = {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
            retry_hint(&headers)
        };
        assert_eq!(seconds, Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_config_becomes_a_create_request() {
        let config = CollectionConfig {
            dimension: 4,
            metric: "cosine".into(),
            shards: Some(2),
            payload_schema: vec![serde_json::json!({"name": "lang", "type": "keyword"})],
            ..CollectionConfig::default()
        };
        assert_eq!(
            serde_json::to_value(CreateCollectionRequest::from(&config)).unwrap(),
            serde_json::json!({"dimension": 4, "metric": "cosine", "shards": 2,
                               "payload_schema": [{"name": "lang", "type": "keyword"}]})
        );
    }
}
