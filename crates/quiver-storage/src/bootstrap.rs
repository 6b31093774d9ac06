//! Creating the bucket of an `s3://` store when it does not exist (standalone
//! setups, tests, first deployments) — something object_store cannot do. The two
//! requests (HEAD and PUT on the bucket) are presigned by object_store's signer, so
//! they use the store's own credentials chain, and sent with reqwest (already in the
//! tree under object_store).

use std::time::Duration;

use object_store::path::Path;
use object_store::signer::Signer;
use reqwest::{Method, StatusCode};

use crate::error::{StorageError, StorageResult};
use crate::settings::{S3Settings, StorageOptions};
use crate::storage::{ca_bundle_error, ca_bundle_pem, s3_store};

/// How long the presigned bucket requests stay valid.
const SIGNATURE_VALIDITY: Duration = Duration::from_secs(300);

/// Creates `bucket` unless it exists already.
pub async fn ensure_bucket(settings: &S3Settings, bucket: &str) -> StorageResult<()> {
    let fail = |reason: String| StorageError::Bootstrap {
        bucket: bucket.to_string(),
        reason,
    };
    let options = StorageOptions::default();
    let store = s3_store(settings, bucket, &options)?;
    let mut http = reqwest::Client::builder()
        .timeout(options.request_timeout)
        .connect_timeout(options.connect_timeout);
    if let Some(pem) = ca_bundle_pem(settings)? {
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|error| ca_bundle_error(settings, &error_chain(&error)))?;
        http = http.tls_certs_merge(certificates);
    }
    let http = http.build().map_err(|error| fail(error_chain(&error)))?;
    // The bucket itself: an empty key is the bucket's URL (`…/bucket/`).
    let bucket_path = Path::from("");
    let send = |method: Method, body: Option<String>| {
        let store = &store;
        let http = &http;
        let bucket_path = &bucket_path;
        async move {
            let url = store
                .signed_url(method.clone(), bucket_path, SIGNATURE_VALIDITY)
                .await
                .map_err(|error| fail(format!("signing {method}: {error}")))?;
            // An empty body still says so (`Content-Length: 0`): servers refuse a
            // PUT without a length.
            let body = body.unwrap_or_default();
            let response = http
                .request(method.clone(), url)
                .header(reqwest::header::CONTENT_LENGTH, body.len())
                .body(body)
                .send()
                .await
                .map_err(|error| fail(format!("{method}: {}", error_chain(&error))))?;
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            Ok::<_, StorageError>((status, text))
        }
    };
    let (status, _) = send(Method::HEAD, None).await?;
    if status.is_success() {
        return Ok(());
    }
    // Outside us-east-1, S3 wants the region named in the request body.
    let region = settings.region_or_default();
    let body = (region != "us-east-1").then(|| {
        format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        )
    });
    let (status, text) = send(Method::PUT, body).await?;
    if status.is_success() {
        tracing::info!(bucket, "created bucket");
        return Ok(());
    }
    // Created meanwhile by another process starting at the same time.
    if status == StatusCode::CONFLICT
        && (text.contains("BucketAlreadyOwnedByYou") || text.contains("BucketAlreadyExists"))
    {
        return Ok(());
    }
    Err(fail(format!("PUT answered {status}: {}", text.trim())))
}

/// An error's message followed by its causes' (reqwest's own message alone says
/// little: "error sending request").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
