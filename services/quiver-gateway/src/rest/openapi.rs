//! The OpenAPI 3.1 document of the REST API, generated from the handlers'
//! `#[utoipa::path]` annotations and the wire types of `quiver-api` (their
//! `ToSchema` derives), served at `GET /openapi.json` and committed as
//! `docs/openapi.json` (a test keeps the two equal; `docs/api.md` is the prose
//! reference).

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The document's root: every path, the shared schemas, the bearer API key.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Quiver REST API",
        description = "Vector search over object storage: collections, points, search, and the admin API. \
            Errors are `{\"error\": {\"code\", \"message\"}}` with the code's HTTP status. \
            Prose reference: docs/api.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::collections::create_collection,
        super::collections::list_collections,
        super::collections::describe_collection,
        super::collections::drop_collection,
        super::points::upsert,
        super::points::delete_points,
        super::points::get_points,
        super::search::search,
        super::search::search_batch,
        super::admin::cluster_status,
        super::admin::collection_shards,
        super::admin::compact,
        super::admin::drain_node,
        super::admin::meta_members,
        super::admin::list_orphans,
    ),
    // Referenced by `ErrorResponses`, which does not collect schemas itself.
    components(schemas(quiver_api::ErrorBody)),
    modifiers(&ApiKey),
    security((), ("api_key" = [])),
    tags(
        (name = "collections", description = "Create, list, describe and drop collections"),
        (name = "points", description = "Upsert, delete and read points"),
        (name = "search", description = "Nearest-neighbour search, one query or a batch"),
        (name = "admin", description = "Cluster status, shards, compaction, draining, metadata members, orphans"),
    )
)]
pub struct ApiDoc;

/// The error answers every operation may give (`{"error": {"code", "message"}}`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // a description for the document, never built
pub(super) enum ErrorResponses {
    /// Refused: the message names the field and the value; nothing of the request was written
    #[response(status = "4XX")]
    Refused(quiver_api::ErrorBody),
    /// Unavailable or internal; UNAVAILABLE and RESOURCE_EXHAUSTED are retryable (`Retry-After`)
    #[response(status = "5XX")]
    Unavailable(quiver_api::ErrorBody),
}

/// The `{name}` path parameter of the collection routes.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // a description for the document, never built
pub(super) struct CollectionName {
    /// Collection name
    name: String,
}

/// `Authorization: Bearer <key>` when the gateway has API keys (optional
/// otherwise, hence the empty alternative in `security`).
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The document as pretty-printed JSON (what `docs/openapi.json` holds).
pub fn openapi_json() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is the generated document; regenerate it with
    /// `QUIVER_UPDATE_OPENAPI=1 cargo test -p quiver-gateway openapi`.
    #[test]
    fn the_committed_openapi_document_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let generated = openapi_json();
        if std::env::var_os("QUIVER_UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json is out of date: run QUIVER_UPDATE_OPENAPI=1 cargo test -p quiver-gateway openapi"
        );
    }

    #[test]
    fn every_route_is_documented() {
        let document: serde_json::Value = serde_json::from_str(&openapi_json()).unwrap();
        let paths = document["paths"].as_object().unwrap();
        for (path, method) in [
            ("/v1/collections", "get"),
            ("/v1/collections/{name}", "put"),
            ("/v1/collections/{name}", "get"),
            ("/v1/collections/{name}", "delete"),
            ("/v1/collections/{name}/points", "post"),
            ("/v1/collections/{name}/points/delete", "post"),
            ("/v1/collections/{name}/points/get", "post"),
            ("/v1/collections/{name}/search", "post"),
            ("/v1/collections/{name}/search/batch", "post"),
            ("/admin/v1/cluster", "get"),
            ("/admin/v1/collections/{name}/shards", "get"),
            ("/admin/v1/collections/{name}/compact", "post"),
            ("/admin/v1/nodes/{id}/drain", "post"),
            ("/admin/v1/meta/members", "post"),
            ("/admin/v1/orphans", "get"),
        ] {
            assert!(
                paths.get(path).and_then(|item| item.get(method)).is_some(),
                "{method} {path} is not in the document"
            );
        }
        assert_eq!(document["openapi"], "3.1.0");
    }
}
