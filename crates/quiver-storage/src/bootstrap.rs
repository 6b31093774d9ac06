//! Creating the bucket of an `s3://` store when it does not exist (standalone
//! setups, tests, first deployments) — something object_store cannot do.

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

use crate::error::{StorageError, StorageResult};
use crate::settings::S3Settings;

/// Creates `bucket` unless it exists already.
pub async fn ensure_bucket(settings: &S3Settings, bucket: &str) -> StorageResult<()> {
    let fail = |reason: String| StorageError::Bootstrap {
        bucket: bucket.to_string(),
        reason,
    };
    let mut config = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region_or_default().to_string()))
        .force_path_style(!settings.virtual_hosted_style);
    if let Some(endpoint) = &settings.endpoint {
        config = config.endpoint_url(endpoint);
    }
    if let (Some(id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
        config = config.credentials_provider(Credentials::new(
            id,
            secret,
            settings.session_token.clone(),
            None,
            "quiver-settings",
        ));
    }
    let client = aws_sdk_s3::Client::from_conf(config.build());
    if client.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(());
    }
    match client.create_bucket().bucket(bucket).send().await {
        Ok(_) => {
            tracing::info!(bucket, "created bucket");
            Ok(())
        }
        Err(error) => {
            let service_error = error.as_service_error();
            if service_error
                .is_some_and(|e| e.is_bucket_already_owned_by_you() || e.is_bucket_already_exists())
            {
                return Ok(());
            }
            Err(fail(
                aws_sdk_s3::error::DisplayErrorContext(&error).to_string(),
            ))
        }
    }
}
