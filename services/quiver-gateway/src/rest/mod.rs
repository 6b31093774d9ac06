//! The REST/JSON front end (the reference is `docs/api.md`). Bodies are decoded
//! here into the shared wire types of `quiver-api`, so a malformed request gets
//! the same JSON error shape as any other.
//!
//! - this file: the routes, the front door (request id, content type), the
//!   per-request wrapper (API key, metrics, logs, the answer);
//! - `decode`: reading bodies, and turning wire types into the engine's inputs;
//! - `response`: the one error answer of every [`ServiceError`];
//! - `collections`, `points`, `search`, `admin`: the handlers of each group.
//!
//! [`ServiceError`]: quiver_proto::ServiceError

mod admin;
mod collections;
mod decode;
mod openapi;
mod points;
mod response;
mod search;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use quiver_proto::{ErrorCode, REQUEST_ID_HEADER};
use tracing::Instrument;

// The fuzz tests drive the decoders directly.
#[cfg(test)]
pub use decode::{decode_batch, decode_create, decode_ids, decode_search, decode_upsert};
pub use openapi::openapi_json;
pub use response::error_response_with_status;

use crate::auth::{Access, ApiKeys, Denied};
use crate::core::Gateway;
use crate::error::{GatewayError, GatewayResult};
use crate::metrics::METRICS;
use crate::request_id;

/// Where users find what the API accepts; error messages point there.
const API_REFERENCE: &str = "docs/api.md";

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
        .route("/v1/collections", get(collections::list_collections))
        .route(
            "/v1/collections/{name}",
            put(collections::create_collection)
                .get(collections::describe_collection)
                .delete(collections::drop_collection),
        )
        .route("/v1/collections/{name}/points", post(points::upsert))
        .route(
            "/v1/collections/{name}/points/delete",
            post(points::delete_points),
        )
        .route(
            "/v1/collections/{name}/points/get",
            post(points::get_points),
        )
        .route("/v1/collections/{name}/search", post(search::search))
        .route(
            "/v1/collections/{name}/search/batch",
            post(search::search_batch),
        )
        .route("/admin/v1/cluster", get(admin::cluster_status))
        .route(
            "/admin/v1/collections/{name}/shards",
            get(admin::collection_shards),
        )
        .route("/admin/v1/collections/{name}/compact", post(admin::compact))
        .route("/admin/v1/nodes/{id}/drain", post(admin::drain_node))
        .route("/admin/v1/meta/members", post(admin::meta_members))
        .route("/admin/v1/orphans", get(admin::list_orphans))
        .route("/openapi.json", get(openapi_document))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            GatewayError::not_found(format!(
                "no such endpoint; see the API reference in {API_REFERENCE}"
            ))
        })
        .method_not_allowed_fallback(method_not_allowed)
        // Plus a little so an over-long body is told apart from a truncated one.
        .layer(DefaultBodyLimit::max(max_request_bytes.saturating_add(1)))
        .layer(axum::middleware::from_fn(front_door))
        .with_state(state)
}

/// The OpenAPI document (no API key needed: it describes, it reveals no data).
async fn openapi_document() -> Response {
    static DOCUMENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(openapi_json);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        DOCUMENT.as_str(),
    )
        .into_response()
}

async fn readyz(State(state): Shared) -> Response {
    if (state.ready)() {
        "ready".into_response()
    } else {
        GatewayError::unavailable("not ready").into_response()
    }
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let error = GatewayError::invalid(format!(
        "method {method} is not allowed on {}; see the API reference in {API_REFERENCE}",
        uri.path()
    ));
    error_response_with_status(StatusCode::METHOD_NOT_ALLOWED, &error)
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

/// Returns the header value of a request id; ids are visible ASCII (checked or
/// generated), and should one not be, a fresh id is used rather than failing.
fn request_id_header(request_id: &str) -> HeaderValue {
    HeaderValue::from_str(request_id).unwrap_or_else(|_| {
        HeaderValue::from_str(&request_id::accept_or_generate(None))
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
    })
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
    let header_value = request_id_header(&request_id);
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
            let error = GatewayError::invalid(format!(
                "content-type {content_type:?} is not supported; send JSON with content-type application/json"
            ));
            error_response_with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE, &error)
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

/// Runs one request: auth, request id, metrics, logs, and the answer (`work`'s
/// success as is, its error as [`error_response`]).
async fn handle<F, T>(
    state: &RestState,
    headers: &HeaderMap,
    route: &'static str,
    access: Access,
    work: F,
) -> Response
where
    F: std::future::Future<Output = GatewayResult<T>>,
    T: IntoResponse,
{
    let started = Instant::now();
    // On the heap: the layers below (request id scope, span) would each hold
    // it once more, and every move of the handler's future by axum and hyper
    // copied those kilobytes (~14 KB for a search: 2 % of the server's CPU).
    let work = Box::pin(work);
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
        Ok(answer) => answer.into_response(),
        Err(error) => error.into_response(),
    }
}
