//! The gateway's REST API as the tests use it.

use std::time::Duration;

use serde_json::{Value, json};

/// Why a call failed: the gateway answered with an error, or no answer came.
#[derive(Debug)]
pub enum ApiError {
    /// An HTTP error status with the gateway's error code and message.
    Status {
        status: u16,
        code: String,
        message: String,
    },
    /// Connecting, sending or reading failed, or the call timed out.
    Transport(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Status {
                status,
                code,
                message,
            } => write!(formatter, "HTTP {status} {code}: {message}"),
            ApiError::Transport(reason) => write!(formatter, "transport: {reason}"),
        }
    }
}

impl std::error::Error for ApiError {}

/// A REST client of one gateway.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub fn new(http: reqwest::Client, base: String) -> Api {
        Api { http, base }
    }

    /// Sends `method path` with an optional JSON body; returns the JSON answer.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        self.call_with_timeout(method, path, body, Duration::from_secs(30))
            .await
    }

    /// Like [`Api::call`], with a timeout for the whole exchange.
    pub async fn call_with_timeout(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut request = match method {
            "GET" => self.http.get(url),
            "PUT" => self.http.put(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url),
        };
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .timeout(timeout)
            .send()
            .await
            .map_err(|error| ApiError::Transport(format!("{error:#}")))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|error| ApiError::Transport(format!("reading the answer: {error:#}")))?;
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
        if (200..300).contains(&status) {
            return Ok(body);
        }
        Err(ApiError::Status {
            status,
            code: body["error"]["code"]
                .as_str()
                .unwrap_or("UNKNOWN")
                .to_string(),
            message: body["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| body.to_string()),
        })
    }

    /// Upserts `(id, vector)` points.
    pub async fn upsert(
        &self,
        collection: &str,
        points: &[(u64, Vec<f32>)],
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let points: Vec<Value> = points
            .iter()
            .map(|(id, vector)| json!({"id": id, "vector": vector}))
            .collect();
        self.call_with_timeout(
            "POST",
            &format!("/v1/collections/{collection}/points"),
            Some(json!({"points": points})),
            timeout,
        )
        .await
    }

    /// Deletes `ids`.
    pub async fn delete(
        &self,
        collection: &str,
        ids: &[u64],
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        self.call_with_timeout(
            "POST",
            &format!("/v1/collections/{collection}/points/delete"),
            Some(json!({"ids": ids})),
            timeout,
        )
        .await
    }

    /// Reads `ids` with strong consistency; returns id → vector of the points found.
    pub async fn get(
        &self,
        collection: &str,
        ids: &[u64],
        timeout: Duration,
    ) -> Result<Vec<(u64, Vec<f32>)>, ApiError> {
        let body = self
            .call_with_timeout(
                "POST",
                &format!("/v1/collections/{collection}/points/get"),
                Some(json!({"ids": ids, "include_vector": true, "consistency": "strong"})),
                timeout,
            )
            .await?;
        let points = body["points"]
            .as_array()
            .ok_or_else(|| ApiError::Transport(format!("no points list in {body}")))?;
        points.iter().map(point_of).collect()
    }

    /// Runs strong exact-vector searches (every list probed) in one batch;
    /// returns per search the hits `(id, vector)`, best first.
    pub async fn search_batch(
        &self,
        collection: &str,
        vectors: &[Vec<f32>],
        k: usize,
        timeout: Duration,
    ) -> Result<Vec<Vec<(u64, Vec<f32>)>>, ApiError> {
        let searches: Vec<Value> = vectors
            .iter()
            .map(|vector| {
                json!({
                    "vector": vector, "k": k, "nprobe": 1_000_000, "rescore": 8,
                    "consistency": "strong", "include_payload": false, "include_vector": true
                })
            })
            .collect();
        let body = self
            .call_with_timeout(
                "POST",
                &format!("/v1/collections/{collection}/search/batch"),
                Some(json!({"searches": searches})),
                timeout,
            )
            .await?;
        let results = body["results"]
            .as_array()
            .ok_or_else(|| ApiError::Transport(format!("no results list in {body}")))?;
        results
            .iter()
            .map(|result| {
                result["hits"]
                    .as_array()
                    .ok_or_else(|| ApiError::Transport(format!("no hits in {result}")))?
                    .iter()
                    .map(point_of)
                    .collect()
            })
            .collect()
    }

    /// Returns the collection's live point count (`points` of describe).
    pub async fn count(&self, collection: &str) -> Result<u64, ApiError> {
        let body = self
            .call("GET", &format!("/v1/collections/{collection}"), None)
            .await?;
        body["points"]
            .as_u64()
            .ok_or_else(|| ApiError::Transport(format!("no points count in {body}")))
    }

    /// Asks every shard's indexer to merge what it can; returns the merges done.
    /// Compacts and waits until every shard is done (asking again while the
    /// gateway answers `"done": false`); returns the merges.
    pub async fn compact(&self, collection: &str) -> Result<u64, ApiError> {
        let mut merges = 0;
        loop {
            let body = self
                .call(
                    "POST",
                    &format!("/admin/v1/collections/{collection}/compact"),
                    None,
                )
                .await?;
            merges += body["merges"].as_u64().unwrap_or(0);
            if body["done"] != Value::Bool(false) {
                return Ok(merges);
            }
        }
    }
}

fn point_of(point: &Value) -> Result<(u64, Vec<f32>), ApiError> {
    let id = point["id"]
        .as_u64()
        .ok_or_else(|| ApiError::Transport(format!("point without a u64 id: {point}")))?;
    let vector = point["vector"]
        .as_array()
        .ok_or_else(|| ApiError::Transport(format!("point {id} without a vector")))?
        .iter()
        .map(|value| value.as_f64().unwrap_or(f64::NAN) as f32)
        .collect();
    Ok((id, vector))
}
