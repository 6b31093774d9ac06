//! Loading a dataset into a running Quiver over REST, shared by the benchmarks
//! that load their own collection (`cluster --load`, `filter --load`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use quiver_client::{Client, Point, PointId};
use quiver_common::vecs::Matrix;
use serde_json::Value;

use crate::progress::bar;

/// Points per upsert request.
const BATCH: usize = 1000;
/// Upsert requests in flight.
const IN_FLIGHT: usize = 4;

/// Upserts every row of `base` into `collection` (ids = row numbers, payload
/// `payload(row)`), 1,000 points a request, 4 requests in flight, with a
/// progress bar; returns once a strong describe counts every point, so the
/// rows are searchable.
pub async fn upsert_rows(
    client: &Client,
    collection: &str,
    base: &Arc<Matrix<f32>>,
    payload: impl Fn(usize) -> Option<Value> + Clone + Send + Sync + 'static,
) -> Result<()> {
    let rows = base.rows();
    let progress = bar("load", rows as u64);
    let semaphore = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = Vec::new();
    for start in (0..rows).step_by(BATCH) {
        let permit = semaphore.clone().acquire_owned().await?;
        let (client, base, progress, payload) = (
            client.clone(),
            base.clone(),
            progress.clone(),
            payload.clone(),
        );
        let name = collection.to_string();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let end = (start + BATCH).min(base.rows());
            let points: Vec<Point> = (start..end)
                .map(|row| Point {
                    id: PointId::U64(row as u64),
                    vector: base.row(row).to_vec(),
                    payload: payload(row),
                })
                .collect();
            client.upsert(&name, &points).await?;
            progress.inc((end - start) as u64);
            Ok::<(), quiver_client::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    progress.finish();
    loop {
        let described = client.describe(collection).await?;
        if described.points == rows as u64 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
