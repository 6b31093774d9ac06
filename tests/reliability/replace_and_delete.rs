//! Upserts of existing ids and deletes, in every place an older copy can sit
//! (a segment, the WAL tail, both) and after merges: exactly one version of an
//! id is live — the newest — and a deleted id is gone, through strong gets,
//! exact-vector searches, the live count and the flat scan of what is stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::Api;
use crate::checker::{assert_clean, quiet_check};
use crate::cluster::{Cluster, ClusterShape, eventually, s3_endpoint};
use crate::history::{History, WriteKind, vector};
use crate::{SERIAL, Summary, long_profile};

const COLLECTION: &str = "replace";
const DIMENSION: usize = 48;
const SHARDS: u64 = 2;

/// Writes `writes` in requests of 100 (each must be acknowledged) and records them.
async fn write(api: &Api, history: &History, writes: &[(u64, WriteKind)]) -> anyhow::Result<()> {
    for chunk in writes.chunks(100) {
        for kind in [WriteKind::Delete, WriteKind::Upsert { version: 0 }] {
            let part: Vec<(u64, WriteKind)> = chunk
                .iter()
                .copied()
                .filter(|(_, write)| std::mem::discriminant(write) == std::mem::discriminant(&kind))
                .collect();
            if part.is_empty() {
                continue;
            }
            let handles = history.invoke(&part, Instant::now());
            let answer = match kind {
                WriteKind::Delete => {
                    let ids: Vec<u64> = part.iter().map(|(id, _)| *id).collect();
                    api.delete(COLLECTION, &ids, Duration::from_secs(30)).await
                }
                WriteKind::Upsert { .. } => {
                    let points: Vec<(u64, Vec<f32>)> = part
                        .iter()
                        .map(|(id, write)| match write {
                            WriteKind::Upsert { version } => {
                                (*id, vector(*id, *version, DIMENSION))
                            }
                            WriteKind::Delete => unreachable!("filtered"),
                        })
                        .collect();
                    api.upsert(COLLECTION, &points, Duration::from_secs(30))
                        .await
                }
            };
            history.complete(&handles, answer.is_ok(), Instant::now());
            answer.map_err(|error| anyhow::anyhow!("write failed: {error}"))?;
        }
    }
    Ok(())
}

fn upserts(ids: impl Iterator<Item = u64>, version: u32) -> Vec<(u64, WriteKind)> {
    ids.map(|id| (id, WriteKind::Upsert { version })).collect()
}

fn deletes(ids: impl Iterator<Item = u64>) -> Vec<(u64, WriteKind)> {
    ids.map(|id| (id, WriteKind::Delete)).collect()
}

/// Waits until every committed write is in a segment (the WAL tail is empty).
async fn wait_flushed(api: &Api) -> anyhow::Result<()> {
    eventually("an empty WAL tail", Duration::from_secs(60), || async {
        let body = api
            .call("GET", &format!("/v1/collections/{COLLECTION}"), None)
            .await
            .ok()?;
        (body["wal_tail_rows"].as_u64() == Some(0)).then_some(())
    })
    .await
}

async fn segments(api: &Api) -> anyhow::Result<u64> {
    let body = api
        .call("GET", &format!("/v1/collections/{COLLECTION}"), None)
        .await?;
    body["segments"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no segment count in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upserts_keep_one_version_and_deletes_stay_deleted_through_merges() -> anyhow::Result<()> {
    let Some(endpoint) = s3_endpoint() else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut cluster = Cluster::start(
        &endpoint,
        ClusterShape {
            metas: 1,
            indexers: 1,
            searchers: 1,
            gateways: 1,
        },
    )
    .await?;
    cluster
        .create_collection(COLLECTION, DIMENSION, SHARDS as u32, 1)
        .await?;
    let api = cluster.api();
    let history = Arc::new(History::default());
    let ids: u64 = if long_profile() { 3_000 } else { 1_200 };
    let rounds = if long_profile() { 4 } else { 1 };
    let mut summary = Summary::new("replace_and_delete");
    let check = async |when: &str, summary: &mut Summary| -> anyhow::Result<()> {
        let checkpoint =
            quiet_check(&cluster, &api, &history, COLLECTION, DIMENSION, ids, true).await?;
        assert_clean(&checkpoint.report, &cluster, when);
        summary.checkpoints += 1;
        summary.searches += checkpoint.report.searches;
        summary.observations = checkpoint.report.observations;
        summary.writes = checkpoint.report.writes;
        summary.acknowledged = checkpoint.report.acknowledged;
        Ok(())
    };

    let mut version = 0;
    for round in 0..rounds {
        version += 1;
        // Everything in segments.
        write(&api, &history, &upserts(0..ids, version)).await?;
        wait_flushed(&api).await?;
        check(&format!("round {round}: all flushed"), &mut summary).await?;

        // Newer copies in the WAL tail over segment copies; deletes in the tail.
        version += 1;
        write(&api, &history, &upserts(0..ids / 2, version)).await?;
        write(&api, &history, &deletes(ids * 3 / 4..ids)).await?;
        check(
            &format!("round {round}: replaced in the WAL tail"),
            &mut summary,
        )
        .await?;

        // The same id several times in the tail; deleted then written again.
        version += 1;
        write(&api, &history, &upserts(0..ids / 10, version)).await?;
        version += 1;
        write(&api, &history, &upserts(0..ids / 20, version)).await?;
        write(&api, &history, &deletes(ids * 3 / 4..ids * 3 / 4 + 50)).await?;
        write(
            &api,
            &history,
            &upserts(ids * 3 / 4..ids * 3 / 4 + 25, version),
        )
        .await?;
        check(
            &format!("round {round}: replaced twice in the tail"),
            &mut summary,
        )
        .await?;

        // Flushed: the older copies are masked by deletion bitmaps.
        wait_flushed(&api).await?;
        check(
            &format!("round {round}: flushed with deletion bitmaps"),
            &mut summary,
        )
        .await?;

        // Merged: deleted and replaced rows are dropped.
        let before = segments(&api).await?;
        // A background merge in flight holds its segments; compact again
        // once it is done.
        let mut merges = 0;
        let mut after = before;
        for _ in 0..10 {
            merges += api.compact(COLLECTION).await?;
            after = segments(&api).await?;
            if after == SHARDS {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Compaction leaves one segment per shard. The background merger
        // (merge_factor 4) may have got there first; then there is nothing
        // left to merge, and the rows were dropped by its merges instead.
        anyhow::ensure!(
            after == SHARDS && (merges > 0 || before == SHARDS),
            "compaction did not leave one segment per shard ({merges} merges, \
             {before} → {after} segments, {SHARDS} shards)"
        );
        summary.extra.insert(
            format!("round_{round}_segments"),
            format!("{before} -> {after}").into(),
        );
        check(&format!("round {round}: after compaction"), &mut summary).await?;

        // Deletes and replacements after the merge, merged again.
        version += 1;
        write(&api, &history, &deletes(0..ids / 10)).await?;
        write(&api, &history, &upserts(ids / 10..ids / 5, version)).await?;
        wait_flushed(&api).await?;
        api.compact(COLLECTION).await?;
        check(
            &format!("round {round}: replaced and deleted after a merge"),
            &mut summary,
        )
        .await?;
        summary.iterations += 1;
    }
    summary.publish(started);
    cluster.mark_passed();
    Ok(())
}
