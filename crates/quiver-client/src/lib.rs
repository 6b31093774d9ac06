//! Rust SDK of Quiver's REST API: collections, writes, reads, search and the
//! admin API, with the server's error codes as [`Error::Api`] and retries (with
//! backoff) of calls that are safe to repeat when the server is briefly
//! unavailable. Upserts and deletes are idempotent by id, so they are retried too.
//! `https://` endpoints are verified against the system's CA certificates plus
//! any given in [`ClientOptions::ca_certificate_pem`].

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use serde::Serialize;
use serde_json::{Value, json};

/// Everything that can go wrong calling the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error.
    #[error("{code}: {message}")]
    Api {
        /// The error code (`INVALID_ARGUMENT`, `NOT_FOUND`, …).
        code: String,
        /// What was wrong.
        message: String,
        /// The HTTP status.
        status: u16,
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
    /// Returns the error code (`UNAVAILABLE` for transport failures).
    pub fn code(&self) -> &str {
        match self {
            Error::Api { code, .. } => code,
            Error::Transport { .. } | Error::Tls { .. } => "UNAVAILABLE",
            Error::Decode(_) => "INTERNAL",
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// A point id: an unsigned integer or a string, as the collection declares.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum PointId {
    U64(u64),
    String(String),
}

/// A point to upsert.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub id: PointId,
    pub vector: Vec<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

/// A collection to create.
#[derive(Clone, Debug, Serialize)]
pub struct CollectionConfig {
    pub dimension: u32,
    /// `cosine`, `dot` or `l2`.
    pub metric: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<u32>,
    /// `[{"name": …, "type": "keyword"|"integer"|"float"|"bool"}]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub payload_schema: Vec<Value>,
}

/// One search.
#[derive(Clone, Debug, Serialize)]
pub struct Search {
    pub vector: Vec<f32>,
    pub k: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nprobe: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescore: Option<u32>,
    /// `strong` (default) or `eventual`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    pub include_payload: bool,
    pub include_vector: bool,
}

impl Search {
    /// Returns a top-`k` search for `vector` with the server's defaults.
    pub fn new(vector: Vec<f32>, k: usize) -> Self {
        Search {
            vector,
            k,
            filter: None,
            nprobe: None,
            rescore: None,
            consistency: None,
            include_payload: true,
            include_vector: false,
        }
    }
}

/// One hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub id: Value,
    pub score: f32,
    pub payload: Option<Value>,
}

/// The answer to a search.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchResult {
    pub hits: Vec<Hit>,
    pub took_ms: f64,
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

/// Returns a rustls client configuration trusting the system's CA certificates
/// and `extra_ca_pem`.
fn tls_config(extra_ca_pem: Option<&[u8]>) -> std::result::Result<rustls::ClientConfig, String> {
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
fn error_chain(error: &dyn std::error::Error) -> String {
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
fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
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

/// A client of one Quiver endpoint (a gateway or `quiver standalone`).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    retry_deadline: Duration,
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

    async fn call_once(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value> {
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
        let text = response
            .text()
            .await
            .map_err(|error| self.transport_error(&error))?;
        let value: Value = serde_json::from_str(&text).map_err(|_| {
            if status >= 400 {
                Error::Api {
                    code: if status >= 500 {
                        "UNAVAILABLE"
                    } else {
                        "INVALID_ARGUMENT"
                    }
                    .into(),
                    message: text.chars().take(200).collect(),
                    status,
                }
            } else {
                Error::Decode(format!(
                    "not JSON: {}",
                    text.chars().take(200).collect::<String>()
                ))
            }
        })?;
        if status >= 400 {
            return Err(Error::Api {
                code: value["error"]["code"]
                    .as_str()
                    .unwrap_or("INTERNAL")
                    .to_string(),
                message: value["error"]["message"]
                    .as_str()
                    .unwrap_or(&text)
                    .to_string(),
                status,
            });
        }
        Ok(value)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        retry: bool,
    ) -> Result<Value> {
        let deadline = std::time::Instant::now() + self.retry_deadline;
        let mut delay = Duration::from_millis(100);
        loop {
            match self.call_once(method.clone(), path, body.as_ref()).await {
                // Unavailable (a leader or lease moving) and resource exhausted
                // (writes waiting for a flush) pass: keep trying for a while.
                Err(error)
                    if retry
                        && std::time::Instant::now() + delay < deadline
                        && !matches!(error, Error::Tls { .. })
                        && matches!(error.code(), "UNAVAILABLE" | "RESOURCE_EXHAUSTED") =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                outcome => return outcome,
            }
        }
    }

    fn collection_path(name: &str, rest: &str) -> String {
        format!("/v1/collections/{name}{rest}")
    }

    /// Creates a collection; returns its description.
    pub async fn create_collection(&self, name: &str, config: &CollectionConfig) -> Result<Value> {
        let body =
            serde_json::to_value(config).map_err(|error| Error::Decode(error.to_string()))?;
        self.call(
            reqwest::Method::PUT,
            &Self::collection_path(name, ""),
            Some(body),
            false,
        )
        .await
    }

    /// Lists the collections.
    pub async fn list_collections(&self) -> Result<Vec<Value>> {
        let answer = self
            .call(reqwest::Method::GET, "/v1/collections", None, true)
            .await?;
        answer["collections"]
            .as_array()
            .cloned()
            .ok_or_else(|| Error::Decode("no `collections` list".into()))
    }

    /// Describes a collection, with `points` (live, deletions applied).
    pub async fn describe(&self, name: &str) -> Result<Value> {
        self.call(
            reqwest::Method::GET,
            &Self::collection_path(name, ""),
            None,
            true,
        )
        .await
    }

    /// Drops a collection.
    pub async fn drop_collection(&self, name: &str) -> Result<()> {
        self.call(
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
        let answer = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points"),
                Some(json!({ "points": points })),
                true,
            )
            .await?;
        answer["sequence"]
            .as_u64()
            .ok_or_else(|| Error::Decode("no `sequence`".into()))
    }

    /// Deletes points; returns the write's sequence.
    pub async fn delete(&self, name: &str, ids: &[PointId]) -> Result<u64> {
        let answer = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points/delete"),
                Some(json!({ "ids": ids })),
                true,
            )
            .await?;
        answer["sequence"]
            .as_u64()
            .ok_or_else(|| Error::Decode("no `sequence`".into()))
    }

    /// Reads points by id (missing ids are left out).
    pub async fn get(
        &self,
        name: &str,
        ids: &[PointId],
        include_vector: bool,
    ) -> Result<Vec<Value>> {
        let answer = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/points/get"),
                Some(json!({ "ids": ids, "include_vector": include_vector })),
                true,
            )
            .await?;
        answer["points"]
            .as_array()
            .cloned()
            .ok_or_else(|| Error::Decode("no `points` list".into()))
    }

    /// Searches a collection.
    pub async fn search(&self, name: &str, search: &Search) -> Result<SearchResult> {
        let body =
            serde_json::to_value(search).map_err(|error| Error::Decode(error.to_string()))?;
        let answer = self
            .call(
                reqwest::Method::POST,
                &Self::collection_path(name, "/search"),
                Some(body),
                true,
            )
            .await?;
        let hits = answer["hits"]
            .as_array()
            .ok_or_else(|| Error::Decode("no `hits` list".into()))?
            .iter()
            .map(|hit| Hit {
                id: hit["id"].clone(),
                score: hit["score"].as_f64().unwrap_or(f64::NAN) as f32,
                payload: hit.get("payload").cloned(),
            })
            .collect();
        Ok(SearchResult {
            hits,
            took_ms: answer["took_ms"].as_f64().unwrap_or(0.0),
        })
    }

    /// Returns the cluster status (admin).
    pub async fn cluster_status(&self) -> Result<Value> {
        self.call(reqwest::Method::GET, "/admin/v1/cluster", None, true)
            .await
    }

    /// Returns a collection's shards (admin).
    pub async fn shards(&self, name: &str) -> Result<Value> {
        self.call(
            reqwest::Method::GET,
            &format!("/admin/v1/collections/{name}/shards"),
            None,
            true,
        )
        .await
    }

    /// Merges a collection's segments and waits until every shard is done
    /// (admin); the answer's `merges` counts them all. A large shard compacts
    /// for longer than one request may wait: the gateway then answers `202`
    /// with `"done": false`, the compaction goes on, and this asks again.
    pub async fn compact(&self, name: &str) -> Result<Value> {
        let mut merges = 0;
        loop {
            let mut answer = self.compact_once(name).await?;
            merges += answer["merges"].as_u64().unwrap_or(0);
            if answer["done"] != Value::Bool(false) {
                answer["merges"] = merges.into();
                return Ok(answer);
            }
        }
    }

    /// One compaction request (admin): `{"done": true, "merges": n}`, or
    /// `{"done": false, "running_shards": [...]}` when some shards were still
    /// compacting when the gateway stopped waiting (ask again to join them).
    pub async fn compact_once(&self, name: &str) -> Result<Value> {
        self.call(
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
    pub async fn orphans(&self) -> Result<Value> {
        self.call(reqwest::Method::GET, "/admin/v1/orphans", None, true)
            .await
    }

    /// Drains a node (admin).
    pub async fn drain(&self, node: &str) -> Result<Value> {
        self.call(
            reqwest::Method::POST,
            &format!("/admin/v1/nodes/{node}/drain"),
            None,
            true,
        )
        .await
    }

    /// Adds (`add`, with an address), promotes or removes a metadata node (admin).
    pub async fn meta_members(
        &self,
        action: &str,
        id: u64,
        address: Option<&str>,
    ) -> Result<Value> {
        let mut body = json!({"action": action, "id": id});
        if let Some(address) = address {
            body["address"] = json!(address);
        }
        self.call(
            reqwest::Method::POST,
            "/admin/v1/meta/members",
            Some(body),
            false,
        )
        .await
    }
}
