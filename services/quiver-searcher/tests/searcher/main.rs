//! A shard written by the real write path and searched by the read path through
//! the region cache: exact vectors are found, deleted and replaced points are
//! not, filters hold, recall against brute force meets the bar.

use std::collections::HashMap;
use std::sync::Arc;

use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_index::{
    FieldKind, FieldSpec, Filter, IdType, Metric, PointId, SearchScratch, SegmentSpec,
};
use quiver_indexer::{Catalog, IndexerConfig, MemoryCatalog, ShardRef, ShardWriter};
use quiver_proto::{ErrorCode, ServiceError};
use quiver_searcher::{ReadContext, SearchRequest, ShardView};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl, WalRecord};
use quiver_test_support::S3TestServer;
use rand::{Rng, SeedableRng};

mod corruption;
mod disk_full;
mod faults;
mod pressure;
mod reload;

const DIM: usize = 32;

fn spec() -> SegmentSpec {
    let mut spec = SegmentSpec::new(DIM, Metric::Cosine, IdType::U64);
    spec.fields = vec![
        FieldSpec {
            name: "group".into(),
            kind: FieldKind::Integer,
        },
        FieldSpec {
            name: "tag".into(),
            kind: FieldKind::Keyword,
        },
    ];
    spec
}

/// Clustered vectors: 40 centres, points scattered around them.
fn vectors(count: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut centre_rng = rand::rngs::StdRng::seed_from_u64(7);
    let centres: Vec<Vec<f32>> = (0..40)
        .map(|_| {
            (0..DIM)
                .map(|_| centre_rng.random_range(-1.0..1.0))
                .collect()
        })
        .collect();
    (0..count)
        .map(|_| {
            let centre = &centres[rng.random_range(0..centres.len())];
            centre
                .iter()
                .map(|value| value + rng.random_range(-0.35..0.35))
                .collect()
        })
        .collect()
}

fn upsert(id: u64, vector: &[f32]) -> WalRecord {
    let tag = if id.is_multiple_of(2) { "even" } else { "odd" };
    WalRecord::Upsert {
        id: PointId::U64(id),
        vector: vector.to_vec(),
        payload: format!(r#"{{"group": {}, "tag": "{tag}"}}"#, id % 100).into_bytes(),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

struct Fixture {
    live: HashMap<u64, Vec<f32>>,
    deleted: Vec<(u64, Vec<f32>)>,
    replaced: Vec<(u64, Vec<f32>)>,
    view: Arc<ShardView>,
    context: Arc<ReadContext>,
    _cache_dir: tempfile::TempDir,
}

/// A shard writer over `storage` that flushes and merges only when told to.
async fn manual_writer(shard: &ShardRef, storage: &Storage) -> (ShardWriter, Arc<MemoryCatalog>) {
    let catalog = Arc::new(MemoryCatalog::default());
    catalog.set_epoch(shard, 1);
    let config = IndexerConfig {
        flush_interval_ms: 3_600_000,
        flush_rows: 1_000_000,
        max_unflushed_rows: 1_000_000,
        merge_factor: 1000,
        codebook_refresh: false,
        ..IndexerConfig::default()
    };
    let writer = ShardWriter::open(
        shard.clone(),
        1,
        spec(),
        config,
        storage.clone(),
        catalog.clone(),
    )
    .await
    .unwrap();
    (writer, catalog)
}

/// A read context over a fresh one-tier cache of `capacity_bytes` in regions of
/// `region_bytes` (kept in the returned directory).
fn read_context(
    storage: Storage,
    capacity_bytes: u64,
    region_bytes: u64,
) -> (Arc<ReadContext>, tempfile::TempDir) {
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = BlobCache::new(
        &BlobCacheConfig {
            directory: cache_dir.path().to_path_buf(),
            capacity_bytes,
            region_bytes,
            map_local_files: true,
            row_region_bytes: 0,
        },
        storage.clone(),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    let context = Arc::new(ReadContext::new(
        Arc::new(cache),
        storage,
        tokio::runtime::Handle::current(),
    ));
    (context, cache_dir)
}

async fn fixture(storage: Storage) -> Fixture {
    fixture_with_cache(storage, 64 << 20, 1 << 20).await
}

/// The shard of [`fixture`], read through a cache of `capacity_bytes` in
/// regions of `region_bytes`.
async fn fixture_with_cache(storage: Storage, capacity_bytes: u64, region_bytes: u64) -> Fixture {
    let shard = ShardRef {
        collection_id: "c-search".into(),
        shard: 0,
    };
    let (writer, catalog) = manual_writer(&shard, &storage).await;
    let all = vectors(6000, 1);
    let mut live: HashMap<u64, Vec<f32>> = HashMap::new();
    // Two flushed segments, then a tail with replacements, deletes and new points.
    for chunk in 0..2u64 {
        let records: Vec<WalRecord> = (chunk * 2500..(chunk + 1) * 2500)
            .map(|id| upsert(id, &all[id as usize]))
            .collect();
        writer.write(records).await.unwrap();
        writer.flush().await.unwrap();
    }
    for id in 0..5000u64 {
        live.insert(id, all[id as usize].clone());
    }
    let fresh = vectors(200, 2);
    let replaced: Vec<(u64, Vec<f32>)> = (0..50u64)
        .map(|i| (i * 97, live[&(i * 97)].clone()))
        .collect();
    let deleted: Vec<(u64, Vec<f32>)> = (0..50u64)
        .map(|i| (i * 89 + 1, live[&(i * 89 + 1)].clone()))
        .collect();
    let mut records = Vec::new();
    for (index, (id, _)) in replaced.iter().enumerate() {
        records.push(upsert(*id, &fresh[index]));
        live.insert(*id, fresh[index].clone());
    }
    for (id, _) in &deleted {
        records.push(WalRecord::Delete {
            id: PointId::U64(*id),
        });
        live.remove(id);
    }
    for id in 5000..6000u64 {
        records.push(upsert(id, &all[id as usize]));
        live.insert(id, all[id as usize].clone());
    }
    writer.write(records).await.unwrap();
    let manifest = catalog.manifest(&shard).await.unwrap();
    assert_eq!(manifest.segments.len(), 2);
    assert_eq!(manifest.wal_tail.len(), 1);

    let (context, cache_dir) = read_context(storage, capacity_bytes, region_bytes);
    let loader = context.clone();
    let view = tokio::task::spawn_blocking(move || ShardView::load(&loader, &spec(), manifest))
        .await
        .unwrap()
        .unwrap();
    Fixture {
        live,
        deleted,
        replaced,
        view: Arc::new(view),
        context,
        _cache_dir: cache_dir,
    }
}

fn request(vector: &[f32], k: usize, filter: Option<&str>) -> SearchRequest {
    SearchRequest {
        vector: vector.to_vec(),
        k,
        nprobe: None,
        rescore: None,
        filter: filter.map(|text| Filter::parse(text).unwrap()),
        include_payload: true,
        include_vector: false,
    }
}

fn brute_force(
    live: &HashMap<u64, Vec<f32>>,
    query: &[f32],
    k: usize,
    keep: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let mut scored: Vec<(f32, u64)> = live
        .iter()
        .filter(|(id, _)| keep(**id))
        .map(|(id, vector)| (cosine(query, vector), *id))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(k).map(|(_, id)| id).collect()
}

async fn check(fixture: Fixture) {
    let Fixture {
        live,
        deleted,
        replaced,
        view,
        context,
        ..
    } = fixture;
    assert_eq!(view.live_points(), live.len() as u64);
    assert_eq!(
        view.codebook_groups(),
        1,
        "the second flush joins the codebook the first trained: one group"
    );
    tokio::task::spawn_blocking(move || {
        let mut scratch = SearchScratch::new();
        // Sampled live points are their own best hit, tail points included. With
        // default (calibrated, approximate) parameters a rare miss is allowed; with
        // every list probed, none is: a miss there would be a masking bug.
        let mut default_misses = Vec::new();
        let sampled: Vec<u64> = (0..6000u64)
            .step_by(37)
            .filter(|id| live.contains_key(id))
            .collect();
        for &id in &sampled {
            let hits = view
                .search(&context, &request(&live[&id], 1, None), &mut scratch)
                .unwrap();
            if hits[0].id != PointId::U64(id) {
                default_misses.push((id, hits[0].id.clone(), hits[0].score));
                let mut exhaustive = request(&live[&id], 1, None);
                exhaustive.nprobe = Some(100_000);
                exhaustive.rescore = Some(100);
                let hits = view.search(&context, &exhaustive, &mut scratch).unwrap();
                assert_eq!(
                    hits[0].id,
                    PointId::U64(id),
                    "exact vector of {id}, every list probed"
                );
                continue;
            }
            assert!((hits[0].score - 1.0).abs() < 1e-3, "{}", hits[0].score);
            let payload: serde_json::Value =
                serde_json::from_slice(hits[0].payload.as_ref().unwrap()).unwrap();
            assert_eq!(payload["group"], id % 100);
        }
        assert!(
            default_misses.len() * 50 <= sampled.len(),
            "more than 2% of exact vectors missed with default parameters: {default_misses:?}"
        );
        // Replaced and deleted points' old vectors do not bring them back.
        for (id, old) in replaced.iter().chain(&deleted) {
            let hits = view
                .search(&context, &request(old, 3, None), &mut scratch)
                .unwrap();
            for hit in &hits {
                if hit.id == PointId::U64(*id) {
                    let current = &live[id];
                    assert!(
                        (hit.score - cosine(old, current)).abs() < 1e-3,
                        "stale copy of {id} served"
                    );
                }
            }
        }
        // Recall against brute force, default parameters; filtered at 50%, 1%.
        let queries = vectors(100, 3);
        for (filter, keep) in [
            (None, Box::new(|_: u64| true) as Box<dyn Fn(u64) -> bool>),
            (
                Some(r#"tag = "even""#),
                Box::new(|id: u64| id.is_multiple_of(2)),
            ),
            (Some("group = 42"), Box::new(|id: u64| id % 100 == 42)),
            (
                Some("group >= 10 and group < 20 and tag != \"odd\""),
                Box::new(|id: u64| (10..20).contains(&(id % 100)) && id.is_multiple_of(2)),
            ),
        ] {
            let mut found = 0;
            let mut wanted = 0;
            for query in &queries {
                let truth = brute_force(&live, query, 10, &keep);
                let hits = view
                    .search(&context, &request(query, 10, filter), &mut scratch)
                    .unwrap();
                for hit in &hits {
                    let PointId::U64(id) = hit.id else { panic!() };
                    assert!(keep(id), "{filter:?} let {id} through");
                }
                found += hits
                    .iter()
                    .filter(|hit| matches!(hit.id, PointId::U64(id) if truth.contains(&id)))
                    .count();
                wanted += truth.len();
            }
            let recall = found as f64 / wanted as f64;
            assert!(recall >= 0.95, "recall {recall:.3} with filter {filter:?}");
        }
        // A batch answers exactly what its searches answer one by one, in
        // order, each with its own cost (filters, k and nprobe mixed).
        let filters = [None, Some(r#"tag = "even""#), Some("group = 42")];
        let batch: Vec<SearchRequest> = queries
            .iter()
            .take(24)
            .enumerate()
            .map(|(index, query)| {
                let mut search = request(query, 1 + index % 12, filters[index % filters.len()]);
                search.nprobe = (index % 4 == 3).then_some(7);
                search.include_vector = index % 5 == 0;
                search
            })
            .collect();
        let answers = view.search_batch(&context, &batch, &mut scratch).unwrap();
        assert_eq!(answers.len(), batch.len());
        for (index, (search, (hits, cost))) in batch.iter().zip(&answers).enumerate() {
            let (single, single_cost) = view
                .search_with_cost(&context, search, &mut scratch)
                .unwrap();
            assert_eq!(
                hits, &single,
                "searches[{index}] answered differently in a batch"
            );
            assert_eq!(
                cost.rows_scanned, single_cost.rows_scanned,
                "searches[{index}]"
            );
            assert_eq!(
                cost.rows_rescored, single_cost.rows_rescored,
                "searches[{index}]"
            );
            assert_eq!(
                cost.tail_rows_scored, single_cost.tail_rows_scored,
                "searches[{index}]"
            );
            assert_eq!(cost.segments, 2, "searches[{index}]");
            assert!(cost.search_ms > 0.0, "searches[{index}]");
        }
        assert!(
            view.search_batch(&context, &[], &mut scratch)
                .unwrap()
                .is_empty()
        );
        // One bad search refuses the batch and is named.
        let mut bad_batch = batch[..3].to_vec();
        bad_batch[2].vector.push(1.0);
        let error = view
            .search_batch(&context, &bad_batch, &mut scratch)
            .unwrap_err();
        assert_eq!(error.error_code(), ErrorCode::InvalidArgument);
        assert!(
            error
                .to_string()
                .contains("searches[2]: query vector has dimension 33"),
            "{error}"
        );
        // Reads by id: tail, segments, deleted (absent), unknown (absent).
        let ids = [
            PointId::U64(97),
            PointId::U64(1234),
            PointId::U64(deleted[3].0),
            PointId::U64(99_999),
            PointId::U64(5500),
        ];
        let points = view.get(&ids, true).unwrap();
        let got: Vec<&PointId> = points.iter().map(|point| &point.id).collect();
        assert_eq!(got, vec![&ids[0], &ids[1], &ids[4]]);
        assert!(cosine(points[0].vector.as_ref().unwrap(), &live[&97]) > 0.999);
        // Bad queries name the problem.
        for (bad, message, kind) in [
            (
                request(&[1.0; DIM + 1], 10, None),
                "dimension 33",
                ErrorCode::InvalidArgument,
            ),
            (
                request(&[f32::NAN; DIM], 10, None),
                "non-finite",
                ErrorCode::InvalidArgument,
            ),
            (
                request(&live[&2], 0, None),
                "k must be",
                ErrorCode::InvalidArgument,
            ),
        ] {
            let error = view.search(&context, &bad, &mut scratch).unwrap_err();
            assert_eq!(error.error_code(), kind);
            assert!(error.to_string().contains(message), "{error}");
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_through_the_cache_sees_every_acknowledged_write() {
    let storage = Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap();
    check(fixture(storage).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_through_the_cache_from_the_s3_server() {
    let Some(server) = S3TestServer::from_env("this test") else {
        return;
    };
    let storage = server
        .fresh_storage("quiver-searcher-test", "searcher")
        .await;
    check(fixture(storage).await).await;
}

/// Small tight clusters: the calibrated probe is the query's own list (its ten
/// nearest rows are its cluster), but a filter's nearest kept rows, and a
/// hundred nearest rows, lie in the clusters around it. 1,500 clusters of 20
/// rows; `group < 10` keeps 10 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_or_a_large_k_finds_its_nearest_rows_around_a_tight_cluster() {
    let storage = Storage::open(
        &StoreUrl::Memory,
        &S3Settings::default(),
        StorageOptions::default(),
    )
    .unwrap();
    let shard = ShardRef {
        collection_id: "c-tight".into(),
        shard: 0,
    };
    let (writer, catalog) = manual_writer(&shard, &storage).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let centres: Vec<Vec<f32>> = (0..1500)
        .map(|_| (0..DIM).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    let near = |rng: &mut rand::rngs::StdRng, centre: &[f32]| -> Vec<f32> {
        centre
            .iter()
            .map(|value| value + rng.random_range(-0.03..0.03))
            .collect()
    };
    let mut live: HashMap<u64, Vec<f32>> = HashMap::new();
    let records: Vec<WalRecord> = (0..30_000u64)
        .map(|id| {
            let vector = near(&mut rng, &centres[(id / 20) as usize]);
            live.insert(id, vector.clone());
            upsert(id, &vector)
        })
        .collect();
    writer.write(records).await.unwrap();
    writer.flush().await.unwrap();
    let manifest = catalog.manifest(&shard).await.unwrap();
    assert_eq!(manifest.segments.len(), 1);
    // Calibrated for ten hits and for a hundred.
    let entry = &manifest.segments[0];
    assert!(
        entry.default_nprobe.is_some() && entry.wide_nprobe >= entry.default_nprobe,
        "{entry:?}"
    );
    let queries: Vec<Vec<f32>> = (0..100)
        .map(|_| {
            let centre = &centres[rng.random_range(0..centres.len())];
            near(&mut rng, centre)
        })
        .collect();
    let (context, _cache_dir) = read_context(storage, 64 << 20, 1 << 20);
    tokio::task::spawn_blocking(move || {
        let view = ShardView::load(&context, &spec(), manifest).unwrap();
        let mut scratch = SearchScratch::new();
        let keep = |id: u64| id % 100 < 10;
        let (mut found, mut wanted, mut own_found, mut own_wanted) = (0, 0, 0, 0);
        let (mut wide_found, mut wide_wanted) = (0, 0);
        for query in &queries {
            for (filter, k, keep, found, wanted) in [
                (
                    None,
                    10,
                    &(|_: u64| true) as &dyn Fn(u64) -> bool,
                    &mut own_found,
                    &mut own_wanted,
                ),
                (
                    Some("group < 10"),
                    10,
                    &keep as &dyn Fn(u64) -> bool,
                    &mut found,
                    &mut wanted,
                ),
                (
                    None,
                    100,
                    &(|_: u64| true) as &dyn Fn(u64) -> bool,
                    &mut wide_found,
                    &mut wide_wanted,
                ),
            ] {
                let truth = brute_force(&live, query, k, keep);
                let hits = view
                    .search(&context, &request(query, k, filter), &mut scratch)
                    .unwrap();
                assert_eq!(hits.len(), k);
                *found += hits
                    .iter()
                    .filter(|hit| matches!(hit.id, PointId::U64(id) if truth.contains(&id)))
                    .count();
                *wanted += truth.len();
            }
        }
        let own = own_found as f64 / own_wanted as f64;
        let filtered = found as f64 / wanted as f64;
        let wide = wide_found as f64 / wide_wanted as f64;
        eprintln!("recall@10 {own:.3}, under the filter {filtered:.3}; recall@100 {wide:.3}");
        assert!(own >= 0.95, "unfiltered recall {own:.3}");
        assert!(filtered >= 0.95, "filtered recall {filtered:.3}");
        assert!(wide >= 0.95, "recall@100 {wide:.3}");
    })
    .await
    .unwrap();
}
