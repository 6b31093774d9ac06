//! The REST/JSON front end (paths and shapes of INTERFACES.md). Bodies are parsed
//! here, so a malformed request gets the same JSON error shape as any other.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use quiver_index::PointId;
use quiver_proto::meta as pb;
use quiver_proto::{ErrorCode, REQUEST_ID_HEADER};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::auth::{Access, ApiKeys, Denied};
use crate::core::{
    Consistency, Gateway, Hit, Limits, PointOut, SearchCost, SearchInput, UpsertPoint,
    check_search_options,
};
use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;
use crate::request_id;

/// What the REST handlers share.
pub struct RestState {
    pub gateway: Arc<Gateway>,
    pub keys: ApiKeys,
    /// Tells whether the process is ready to serve (`/readyz`).
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
}

type Shared = State<Arc<RestState>>;

/// Returns the REST router (client API, admin API, health).
pub fn router(state: Arc<RestState>) -> axum::Router {
    let max_request_bytes = state.gateway.limits().max_request_bytes;
    axum::Router::new()
        .route("/v1/collections", get(list_collections))
        .route(
            "/v1/collections/{name}",
            put(create_collection)
                .get(describe_collection)
                .delete(drop_collection),
        )
        .route("/v1/collections/{name}/points", post(upsert))
        .route("/v1/collections/{name}/points/delete", post(delete_points))
        .route("/v1/collections/{name}/points/get", post(get_points))
        .route("/v1/collections/{name}/search", post(search))
        .route("/v1/collections/{name}/search/batch", post(search_batch))
        .route("/admin/v1/cluster", get(cluster_status))
        .route(
            "/admin/v1/collections/{name}/shards",
            get(collection_shards),
        )
        .route("/admin/v1/collections/{name}/compact", post(compact))
        .route("/admin/v1/nodes/{id}/drain", post(drain_node))
        .route("/admin/v1/meta/members", post(meta_members))
        .route("/admin/v1/orphans", get(list_orphans))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            GatewayError::not_found("no such endpoint; see the API reference in INTERFACES.md")
        })
        .method_not_allowed_fallback(method_not_allowed)
        // Plus a little so an over-long body is told apart from a truncated one.
        .layer(DefaultBodyLimit::max(max_request_bytes.saturating_add(1)))
        .layer(axum::middleware::from_fn(front_door))
        .with_state(state)
}

async fn readyz(State(state): Shared) -> Response {
    if (state.ready)() {
        "ready".into_response()
    } else {
        GatewayError::unavailable("not ready").into_response()
    }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let body = json!({"error": {
        "code": ErrorCode::InvalidArgument.as_str(),
        "message": format!(
            "method {method} is not allowed on {}; see the API reference in INTERFACES.md",
            uri.path()
        ),
    }});
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

/// Tells whether a request's `Content-Type` may carry a JSON body: JSON itself,
/// or what `curl -d` sends by default.
fn json_content_type(value: &str) -> bool {
    let media_type = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    media_type == "application/json"
        || media_type == "application/x-www-form-urlencoded"
        || (media_type.starts_with("application/") && media_type.ends_with("+json"))
}

/// Runs before every route: fixes the request id (the client's if usable, else a
/// new one) and returns it on every answer, and refuses bodies that say they are
/// not JSON.
async fn front_door(mut request: Request, next: Next) -> Response {
    let request_id = request_id::accept_or_generate(
        request
            .headers()
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok()),
    );
    let header_value = HeaderValue::from_str(&request_id)
        .expect("request ids are visible ASCII (checked or generated)");
    request
        .headers_mut()
        .insert(REQUEST_ID_HEADER, header_value.clone());
    let refused_content_type = match request.headers().get(header::CONTENT_TYPE) {
        Some(value) if matches!(*request.method(), Method::POST | Method::PUT) => {
            match value.to_str() {
                Ok(text) if json_content_type(text) => None,
                Ok(text) => Some(text.to_string()),
                Err(_) => Some("(not ASCII)".to_string()),
            }
        }
        _ => None,
    };
    let mut response = match refused_content_type {
        Some(content_type) => {
            let body = json!({"error": {
                "code": ErrorCode::InvalidArgument.as_str(),
                "message": format!(
                    "content-type {content_type:?} is not supported; send JSON with content-type application/json"
                ),
            }});
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, Json(body)).into_response()
        }
        None => next.run(request).await,
    };
    response
        .headers_mut()
        .insert(REQUEST_ID_HEADER, header_value);
    response
}

/// A path segment (collection name, node id); a malformed one (bad percent
/// encoding, not UTF-8) is an INVALID_ARGUMENT in the usual JSON shape.
struct Segment(String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(segment)) => Ok(Segment(segment)),
            Err(rejection) => Err(GatewayError::invalid(format!(
                "request path {}: {}",
                parts.uri.path(),
                rejection.body_text()
            ))),
        }
    }
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        return Some(value.strip_prefix("Bearer ").unwrap_or(value).trim());
    }
    headers.get("x-api-key").and_then(|v| v.to_str().ok())
}

/// Runs one request: auth, request id, metrics, error rendering.
async fn handle<F>(
    state: &RestState,
    headers: &HeaderMap,
    route: &'static str,
    access: Access,
    work: F,
) -> Response
where
    F: std::future::Future<Output = GatewayResult<Value>>,
{
    let started = Instant::now();
    // Set by `front_door`; the fallback only serves direct calls in tests.
    let request_id = request_id::accept_or_generate(
        headers
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok()),
    );
    let span = tracing::info_span!("request", request_id = %request_id, route);
    let outcome = request_id::scope(
        request_id,
        async {
            match state.keys.check(presented_key(headers), access) {
                Err(Denied::Unauthenticated) => Err(GatewayError::new(
                    ErrorCode::Unauthenticated,
                    "missing or unknown API key (send `Authorization: Bearer <key>`)",
                )),
                Err(Denied::PermissionDenied(needed)) => Err(GatewayError::new(
                    ErrorCode::PermissionDenied,
                    format!("this API key lacks {} access", needed.name()),
                )),
                Ok(()) => work.await,
            }
        }
        .instrument(span.clone()),
    )
    .await;
    let code = match &outcome {
        Ok(_) => "OK",
        Err(error) => error.code.as_str(),
    };
    METRICS.requests.with_label_values(&[route, code]).inc();
    let seconds = started.elapsed().as_secs_f64();
    METRICS
        .duration
        .with_label_values(&[route])
        .observe(seconds);
    span.in_scope(|| match &outcome {
        Err(error) if error.code == ErrorCode::Internal => {
            tracing::error!(message = %error.message, "request failed");
        }
        _ => tracing::debug!(code, elapsed_ms = seconds * 1e3, "request done"),
    });
    match outcome {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

type BodyResult = Result<Bytes, BytesRejection>;

/// Returns the body's bytes, or an error saying why it could not be read.
fn body_bytes<'a>(body: &'a BodyResult, limits: &Limits) -> GatewayResult<&'a [u8]> {
    match body {
        Ok(body) if body.len() > limits.max_request_bytes => Err(body_too_large(limits)),
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(body_too_large(limits))
        }
        Err(rejection) => Err(GatewayError::invalid(format!(
            "request body unreadable: {}",
            rejection.body_text()
        ))),
    }
}

fn body_too_large(limits: &Limits) -> GatewayError {
    // Not RESOURCE_EXHAUSTED: clients retry that, and this would fail again.
    GatewayError::invalid(format!(
        "request body is larger than {} bytes; send smaller batches",
        limits.max_request_bytes
    ))
}

/// Decodes a JSON body into `T`, naming the problem and where it is
/// (`points[2].vector[0]: invalid type …`).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> GatewayResult<T> {
    match body.iter().find(|byte| !byte.is_ascii_whitespace()) {
        None => {
            return Err(GatewayError::invalid(
                "the request body is empty; a JSON object is expected",
            ));
        }
        // serde would take a JSON array as the fields in order; refuse it.
        Some(first) if *first != b'{' => {
            return Err(GatewayError::invalid(
                "the request body must be a JSON object ({\"field\": value, …})",
            ));
        }
        Some(_) => {}
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let decoded = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            let place = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("`{path}`: ")
            };
            let mentions = |word: &[u8]| body.windows(word.len()).any(|window| window == word);
            let hint = if inner.is_syntax() && (mentions(b"NaN") || mentions(b"Infinity")) {
                " (vector values must be finite numbers: JSON has no NaN or Infinity)"
            } else {
                ""
            };
            GatewayError::invalid(format!("request body: {place}{inner}{hint}"))
        })
        .and_then(|decoded| {
            deserializer
                .end()
                .map(|()| decoded)
                .map_err(|error| GatewayError::invalid(format!("request body: {error}")))
        })?;
    Ok(decoded)
}

/// Reads and decodes a JSON body.
fn parse<T: DeserializeOwned>(body: &BodyResult, limits: &Limits) -> GatewayResult<T> {
    decode(body_bytes(body, limits)?)
}

fn id_from_json(value: &Value, what: &str) -> GatewayResult<PointId> {
    match value {
        Value::Number(number) => number.as_u64().map(PointId::U64).ok_or_else(|| {
            GatewayError::invalid(format!(
                "{what}: id {number} is not an unsigned 64-bit integer"
            ))
        }),
        Value::String(text) => Ok(PointId::String(text.clone())),
        other => Err(GatewayError::invalid(format!(
            "{what}: id must be a number or a string, got {other}"
        ))),
    }
}

fn id_to_json(id: &PointId) -> Value {
    match id {
        PointId::U64(number) => json!(number),
        PointId::String(text) => json!(text),
    }
}

fn metric_name(metric: i32) -> &'static str {
    match pb::Metric::try_from(metric) {
        Ok(pb::Metric::Dot) => "dot",
        Ok(pb::Metric::L2) => "l2",
        _ => "cosine",
    }
}

fn field_kind_name(kind: i32) -> &'static str {
    match pb::FieldKind::try_from(kind) {
        Ok(pb::FieldKind::Integer) => "integer",
        Ok(pb::FieldKind::Float) => "float",
        Ok(pb::FieldKind::Bool) => "bool",
        _ => "keyword",
    }
}

/// Renders a collection's definition.
pub fn collection_json(collection: &pb::Collection) -> Value {
    let spec = collection.spec.clone().unwrap_or_default();
    let raw_precision = match spec
        .index
        .as_ref()
        .map(|index| pb::VectorPrecision::try_from(index.raw_precision))
    {
        Some(Ok(pb::VectorPrecision::Bf16)) => "bf16",
        _ => "f32",
    };
    json!({
        "name": spec.name,
        "collection_id": collection.collection_id,
        "dimension": spec.dimension,
        "metric": metric_name(spec.metric),
        "id_type": if spec.id_type == pb::IdType::String as i32 { "string" } else { "u64" },
        "shards": spec.shards,
        "replication": spec.replication,
        "index": {"raw_precision": raw_precision},
        "payload_schema": spec.payload_schema.iter().map(|field| json!({
            "name": field.name, "type": field_kind_name(field.kind)
        })).collect::<Vec<_>>(),
        "created_at_ms": collection.created_at_ms,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    dimension: u32,
    metric: String,
    #[serde(default)]
    id_type: Option<String>,
    #[serde(default)]
    shards: Option<u32>,
    #[serde(default)]
    replication: Option<u32>,
    #[serde(default)]
    index: Option<IndexBody>,
    #[serde(default)]
    payload_schema: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexBody {
    #[serde(default)]
    raw_precision: Option<String>,
}

fn parse_field_kind(name: &str, kind: &Value) -> GatewayResult<i32> {
    Ok(match kind.as_str() {
        Some("keyword") => pb::FieldKind::Keyword,
        Some("integer") => pb::FieldKind::Integer,
        Some("float") => pb::FieldKind::Float,
        Some("bool") => pb::FieldKind::Bool,
        _ => {
            return Err(GatewayError::invalid(format!(
                "payload_schema: field {name:?} has type {kind}; expected \"keyword\", \"integer\", \"float\" or \"bool\""
            )));
        }
    } as i32)
}

fn parse_schema(schema: Option<Value>) -> GatewayResult<Vec<pb::PayloadField>> {
    let field = |name: &str, kind: &Value| -> GatewayResult<pb::PayloadField> {
        Ok(pb::PayloadField {
            name: name.to_string(),
            kind: parse_field_kind(name, kind)?,
        })
    };
    match schema {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map.iter().map(|(name, kind)| field(name, kind)).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
                    GatewayError::invalid(format!(
                        "payload_schema[{index}] needs a \"name\" string, got {item}"
                    ))
                })?;
                if let Some(unknown) = item
                    .as_object()
                    .and_then(|entry| entry.keys().find(|key| *key != "name" && *key != "type"))
                {
                    return Err(GatewayError::invalid(format!(
                        "payload_schema[{index}]: unknown key {unknown:?}; entries are {{\"name\", \"type\"}}"
                    )));
                }
                field(name, item.get("type").unwrap_or(&Value::Null))
            })
            .collect(),
        Some(other) => Err(GatewayError::invalid(format!(
            "payload_schema must be a list of {{name, type}} or an object, got {other}"
        ))),
    }
}

/// Decodes a create body into the collection's spec.
pub fn decode_create(name: String, body: &[u8]) -> GatewayResult<pb::CollectionSpec> {
    let body: CreateBody = decode(body)?;
    let metric = match body.metric.as_str() {
        "cosine" => pb::Metric::Cosine,
        "dot" => pb::Metric::Dot,
        "l2" => pb::Metric::L2,
        other => {
            return Err(GatewayError::invalid(format!(
                "metric must be \"cosine\", \"dot\" or \"l2\", got {other:?}"
            )));
        }
    };
    let id_type = match body.id_type.as_deref() {
        None | Some("u64") => pb::IdType::U64,
        Some("string") => pb::IdType::String,
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "id_type must be \"u64\" or \"string\", got {other:?}"
            )));
        }
    };
    let raw_precision = match body
        .index
        .as_ref()
        .and_then(|index| index.raw_precision.as_deref())
    {
        None | Some("f32") => pb::VectorPrecision::F32,
        Some("bf16") => pb::VectorPrecision::Bf16,
        Some(other) => {
            return Err(GatewayError::invalid(format!(
                "index.raw_precision must be \"f32\" or \"bf16\", got {other:?}"
            )));
        }
    };
    if body.shards == Some(0) || body.replication == Some(0) {
        return Err(GatewayError::invalid(
            "shards and replication must be at least 1",
        ));
    }
    Ok(pb::CollectionSpec {
        name,
        dimension: body.dimension,
        metric: metric as i32,
        id_type: id_type as i32,
        shards: body.shards.unwrap_or(1),
        replication: body.replication.unwrap_or(1),
        index: Some(pb::IndexParams {
            raw_precision: raw_precision as i32,
            ..Default::default()
        }),
        payload_schema: parse_schema(body.payload_schema)?,
    })
}

async fn create_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "create_collection",
        Access::Admin,
        async move {
            let spec = decode_create(name, body_bytes(&body, gateway.limits())?)?;
            let collection = gateway.create_collection(spec).await?;
            Ok(collection_json(&collection))
        },
    )
    .await
}

async fn list_collections(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "list_collections",
        Access::Read,
        async move {
            let collections = gateway.list_collections().await?;
            Ok(json!({"collections": collections.iter().map(collection_json).collect::<Vec<_>>()}))
        },
    )
    .await
}

async fn describe_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "describe_collection",
        Access::Read,
        async move {
            let (collection, stats) = gateway.describe(&name).await?;
            let mut body = collection_json(&collection);
            body["points"] = json!(stats.points);
            body["segments"] = json!(stats.segments);
            body["wal_tail_rows"] = json!(stats.wal_tail_rows);
            body["bytes"] = json!(stats.bytes);
            body["stats"] = json!({
                "points": stats.points,
                "segments": stats.segments,
                "wal_tail_rows": stats.wal_tail_rows,
                "bytes": stats.bytes,
            });
            Ok(body)
        },
    )
    .await
}

async fn drop_collection(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "drop_collection",
        Access::Admin,
        async move {
            gateway.drop_collection(&name).await?;
            Ok(json!({"name": name, "dropped": true}))
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PointBody {
    id: Value,
    vector: Vec<f32>,
    #[serde(default)]
    payload: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpsertBody {
    points: Vec<PointBody>,
}

/// Decodes an upsert body into its points.
pub fn decode_upsert(body: &[u8]) -> GatewayResult<Vec<UpsertPoint>> {
    let body: UpsertBody = decode(body)?;
    body.points
        .into_iter()
        .enumerate()
        .map(|(index, point)| {
            Ok(UpsertPoint {
                id: id_from_json(&point.id, &format!("points[{index}]"))?,
                vector: point.vector,
                payload: point.payload.filter(|payload| !payload.is_null()),
            })
        })
        .collect()
}

async fn upsert(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "upsert", Access::Write, async move {
        let points = decode_upsert(body_bytes(&body, gateway.limits())?)?;
        let sequence = gateway.upsert(&name, points).await?;
        Ok(json!({"sequence": sequence}))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdsBody {
    ids: Vec<Value>,
    #[serde(default)]
    include_vector: bool,
    #[serde(default)]
    consistency: Option<String>,
}

fn parse_ids(ids: &[Value]) -> GatewayResult<Vec<PointId>> {
    ids.iter()
        .enumerate()
        .map(|(index, id)| id_from_json(id, &format!("ids[{index}]")))
        .collect()
}

/// Decodes a delete or get body: the ids, `include_vector` and the consistency.
pub fn decode_ids(body: &[u8]) -> GatewayResult<(Vec<PointId>, bool, Consistency)> {
    let body: IdsBody = decode(body)?;
    let consistency = match &body.consistency {
        Some(text) => Consistency::parse(text)?,
        None => Consistency::Strong,
    };
    Ok((parse_ids(&body.ids)?, body.include_vector, consistency))
}

async fn delete_points(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "delete", Access::Write, async move {
        let (ids, _, _) = decode_ids(body_bytes(&body, gateway.limits())?)?;
        let sequence = gateway.delete(&name, ids).await?;
        Ok(json!({"sequence": sequence}))
    })
    .await
}

fn point_json(point: &PointOut) -> Value {
    let mut body = json!({"id": id_to_json(&point.id)});
    if let Some(payload) = &point.payload {
        body["payload"] = payload.clone();
    }
    if let Some(vector) = &point.vector {
        body["vector"] = json!(vector);
    }
    body
}

async fn get_points(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "get", Access::Read, async move {
        let (ids, include_vector, consistency) = decode_ids(body_bytes(&body, gateway.limits())?)?;
        let points = gateway.get(&name, ids, include_vector, consistency).await?;
        Ok(json!({"points": points.iter().map(point_json).collect::<Vec<_>>()}))
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchBody {
    vector: Vec<f32>,
    #[serde(default = "default_k")]
    k: usize,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    nprobe: Option<u32>,
    #[serde(default)]
    rescore: Option<u32>,
    #[serde(default)]
    consistency: Option<String>,
    #[serde(default = "default_true")]
    include_payload: bool,
    #[serde(default)]
    include_vector: bool,
}

fn default_k() -> usize {
    10
}

fn default_true() -> bool {
    true
}

impl SearchBody {
    fn into_input(self) -> GatewayResult<SearchInput> {
        Ok(SearchInput {
            vector: self.vector,
            k: self.k,
            filter: self.filter,
            nprobe: self.nprobe,
            rescore: self.rescore,
            consistency: match &self.consistency {
                Some(text) => Consistency::parse(text)?,
                None => Consistency::Strong,
            },
            include_payload: self.include_payload,
            include_vector: self.include_vector,
        })
    }
}

fn cost_json(cost: &SearchCost) -> Value {
    json!({
        "shards": cost.shards,
        "segments": cost.segments,
        "rows_scanned": cost.rows_scanned,
        "rows_rescored": cost.rows_rescored,
        "tail_rows_scored": cost.tail_rows_scored,
        "cache_regions_hit": cost.cache_regions_hit,
        "cache_regions_missed": cost.cache_regions_missed,
        "bytes_fetched": cost.bytes_fetched,
        "search_ms": cost.search_ms,
    })
}

fn hits_json(hits: &[Hit], took_ms: f64) -> Value {
    let hits: Vec<Value> = hits
        .iter()
        .map(|hit| {
            let mut body = json!({"id": id_to_json(&hit.id), "score": hit.score});
            if let Some(payload) = &hit.payload {
                body["payload"] = payload.clone();
            }
            if let Some(vector) = &hit.vector {
                body["vector"] = json!(vector);
            }
            body
        })
        .collect();
    json!({"hits": hits, "took_ms": took_ms})
}

/// Decodes a search body and checks its options.
pub fn decode_search(body: &[u8], limits: &Limits) -> GatewayResult<SearchInput> {
    let input = decode::<SearchBody>(body)?.into_input()?;
    check_search_options(limits, &input)?;
    Ok(input)
}

/// Decodes a batch search body and checks every search's options.
pub fn decode_batch(body: &[u8], limits: &Limits) -> GatewayResult<Vec<SearchInput>> {
    let body: BatchBody = decode(body)?;
    if body.searches.len() > limits.max_batch_searches {
        return Err(GatewayError::invalid(format!(
            "{} searches in one batch; the limit is {}",
            body.searches.len(),
            limits.max_batch_searches
        )));
    }
    body.searches
        .into_iter()
        .enumerate()
        .map(|(index, search)| {
            search
                .into_input()
                .and_then(|input| check_search_options(limits, &input).map(|()| input))
                .map_err(|mut error| {
                    error.message = format!("searches[{index}]: {}", error.message);
                    error
                })
        })
        .collect()
}

async fn search(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "search", Access::Read, async move {
        let input = decode_search(body_bytes(&body, gateway.limits())?, gateway.limits())?;
        let (hits, took_ms, cost) = gateway.search_with_cost(&name, input).await?;
        let mut answer = hits_json(&hits, took_ms);
        answer["cost"] = cost_json(&cost);
        Ok(answer)
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    searches: Vec<SearchBody>,
}

async fn search_batch(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
    body: BodyResult,
) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "search_batch", Access::Read, async move {
        let inputs = decode_batch(body_bytes(&body, gateway.limits())?, gateway.limits())?;
        let searches = inputs.into_iter().map(|input| gateway.search(&name, input));
        let mut results = Vec::new();
        for (index, outcome) in futures_util::future::join_all(searches)
            .await
            .into_iter()
            .enumerate()
        {
            let (hits, took_ms) = outcome.map_err(|mut error| {
                error.message = format!("searches[{index}]: {}", error.message);
                error
            })?;
            results.push(hits_json(&hits, took_ms));
        }
        Ok(json!({"results": results}))
    })
    .await
}

fn role_name(role: i32) -> &'static str {
    match pb::NodeRole::try_from(role) {
        Ok(pb::NodeRole::Indexer) => "indexer",
        Ok(pb::NodeRole::Searcher) => "searcher",
        Ok(pb::NodeRole::Gateway) => "gateway",
        _ => "unknown",
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::NodeState::try_from(state) {
        Ok(pb::NodeState::Alive) => "alive",
        Ok(pb::NodeState::Dead) => "dead",
        Ok(pb::NodeState::Draining) => "draining",
        _ => "unknown",
    }
}

fn node_json(node: &pb::NodeInfo) -> Value {
    json!({
        "id": node.node_id,
        "role": role_name(node.role),
        "address": node.address,
        "state": state_name(node.state),
        "last_heartbeat_ms": node.last_heartbeat_ms,
    })
}

fn members_json(members: &[pb::MetaMember]) -> Vec<Value> {
    members
        .iter()
        .map(|member| {
            json!({
                "id": member.id,
                "address": member.address,
                "role": if member.role == pb::MemberRole::Learner as i32 { "learner" } else { "voter" },
            })
        })
        .collect()
}

async fn cluster_status(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "cluster_status",
        Access::Admin,
        async move {
            let meta = gateway.router().meta();
            let status = meta.cluster_status().await?;
            let routing = meta.get_routing("", false).await?;
            let shards: Vec<Value> = routing
                .shards
                .iter()
                .map(|shard| {
                    let reference = shard.shard.unwrap_or_default();
                    json!({
                        "collection_id": reference.collection_id,
                        "shard": reference.shard,
                        "indexer": shard.lease.as_ref().map(|lease| lease.holder.clone()),
                        "epoch": shard.epoch,
                        "searchers": shard.searchers.iter().map(|searcher| json!({
                            "id": searcher.node_id, "ready": searcher.ready
                        })).collect::<Vec<_>>(),
                        "manifest_version": shard.manifest_version,
                    })
                })
                .collect();
            Ok(json!({
                "meta": {
                    "leader": status.leader_id,
                    "leader_address": status.leader_address,
                    "term": status.term,
                    "commit_index": status.commit_index,
                    "applied_index": status.applied_index,
                    "members": members_json(&status.members),
                },
                "nodes": status.nodes.iter().map(node_json).collect::<Vec<_>>(),
                "collections": status.collections,
                "shards": shards,
            }))
        },
    )
    .await
}

async fn collection_shards(
    State(state): Shared,
    Segment(name): Segment,
    headers: HeaderMap,
) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "collection_shards",
        Access::Admin,
        async move {
            crate::core::validate_name(&name)?;
            let meta = gateway.router().meta();
            let routing = meta.get_routing(&name, true).await?;
            let collection = routing
                .collections
                .iter()
                .find(|collection| {
                    collection
                        .spec
                        .as_ref()
                        .is_some_and(|spec| spec.name == name)
                })
                .ok_or_else(|| {
                    GatewayError::not_found(format!("collection `{name}` does not exist"))
                })?;
            let mut shards = Vec::new();
            for shard in &routing.shards {
                let Some(reference) = shard.shard else {
                    continue;
                };
                if reference.collection_id != collection.collection_id {
                    continue;
                }
                let manifest = meta.get_manifest(reference, false).await?;
                shards.push(json!({
                "shard": reference.shard,
                "indexer": shard.lease.as_ref().map(|lease| json!({
                    "id": lease.holder, "epoch": lease.epoch, "expires_at_ms": lease.expires_at_ms
                })),
                "epoch": shard.epoch,
                "searchers": shard.searchers.iter().map(|searcher| json!({
                    "id": searcher.node_id, "ready": searcher.ready
                })).collect::<Vec<_>>(),
                "manifest_version": manifest.version,
                "segments": manifest.segments.iter().map(|segment| json!({
                    "segment_id": segment.segment_id,
                    "rows": segment.rows,
                    "deleted_rows": segment.deleted_rows,
                    "size_bytes": segment.size_bytes,
                })).collect::<Vec<_>>(),
                "wal_tail": manifest.wal_tail.len(),
                "wal_tail_rows": manifest.wal_tail.iter().map(|entry| entry.rows).sum::<u64>(),
            }));
            }
            shards.sort_by_key(|shard| shard["shard"].as_u64());
            Ok(json!({"collection": name, "shards": shards}))
        },
    )
    .await
}

/// `200 {"done": true, "merges": n}` once every shard is compacted, or `202
/// {"done": false, "running_shards": [...]}` when some are still compacting
/// after the wait: the compaction goes on, and POSTing again waits for it.
async fn compact(State(state): Shared, Segment(name): Segment, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    let still_running = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = still_running.clone();
    let mut response = handle(&state, &headers, "compact", Access::Admin, async move {
        let compaction = gateway.compact(&name).await?;
        let done = compaction.running_shards.is_empty();
        flag.store(!done, std::sync::atomic::Ordering::Relaxed);
        let mut body = json!({
            "collection": name,
            "merges": compaction.merges,
            "done": done,
        });
        if !done {
            body["running_shards"] = json!(compaction.running_shards);
            body["message"] =
                json!("compaction still running on the indexers; POST again to wait for it");
        }
        Ok(body)
    })
    .await;
    if still_running.load(std::sync::atomic::Ordering::Relaxed) {
        *response.status_mut() = StatusCode::ACCEPTED;
    }
    response
}

async fn drain_node(State(state): Shared, Segment(id): Segment, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(&state, &headers, "drain_node", Access::Admin, async move {
        let node = gateway.router().meta().drain_node(&id).await?;
        Ok(node_json(&node))
    })
    .await
}

/// Objects in the bucket that nothing references, as the indexers' sweep
/// reported them (deleted once `delete_after_ms` has passed).
async fn list_orphans(State(state): Shared, headers: HeaderMap) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "list_orphans",
        Access::Admin,
        async move {
            let orphans = gateway.router().meta().list_orphans(true).await?;
            let total_bytes: u64 = orphans.iter().map(|orphan| orphan.size_bytes).sum();
            Ok(json!({
                "orphans": orphans.iter().map(|orphan| json!({
                    "key": orphan.object_key,
                    "size_bytes": orphan.size_bytes,
                    "last_modified_ms": orphan.last_modified_ms,
                    "first_seen_ms": orphan.first_seen_ms,
                    "delete_after_ms": orphan.delete_after_ms,
                })).collect::<Vec<_>>(),
                "count": orphans.len(),
                "total_bytes": total_bytes,
            }))
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MembersBody {
    action: String,
    id: u64,
    #[serde(default)]
    address: Option<String>,
}

async fn meta_members(State(state): Shared, headers: HeaderMap, body: BodyResult) -> Response {
    let gateway = state.gateway.clone();
    handle(
        &state,
        &headers,
        "meta_members",
        Access::Admin,
        async move {
            let body: MembersBody = parse(&body, gateway.limits())?;
            let meta = gateway.router().meta();
            let members = match body.action.as_str() {
                "add" => {
                    let address = body.address.ok_or_else(|| {
                        GatewayError::invalid("adding a metadata node needs its \"address\"")
                    })?;
                    meta.add_learner(body.id, &address).await?
                }
                "promote" => meta.promote_voter(body.id).await?,
                "remove" => meta.remove_member(body.id).await?,
                other => {
                    return Err(GatewayError::invalid(format!(
                        "action must be \"add\", \"promote\" or \"remove\", got {other:?}"
                    )));
                }
            };
            Ok(json!({"members": members_json(&members)}))
        },
    )
    .await
}
