//! `quiver-bench filter`: recall and latency of filtered searches against a running
//! Quiver over REST, at several filter selectivities.
//!
//! Every point gets an integer payload field `tag = row % 1000`; a filter keeping a
//! fraction `s` of the rows is `tag < s × 1000`. The exact answer of each filtered
//! query is computed here by brute force over the matching base rows, so recall is
//! measured against the filter's true top-k, not the unfiltered ground truth.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use quiver_client::{Client, CollectionConfig, Search};
use quiver_common::stats::percentile_or_zero;
use quiver_common::vecs::{Matrix, read_fvecs};
use rayon::prelude::*;
use serde::Serialize;

/// Distinct `tag` values; selectivities are multiples of 1/TAGS.
const TAGS: usize = 1000;

/// Options of `quiver-bench filter`.
pub struct FilterOptions {
    pub endpoint: String,
    pub api_key: Option<String>,
    pub collection: String,
    pub load: bool,
    pub base: PathBuf,
    pub metric: String,
    pub shards: u32,
    pub queries: PathBuf,
    pub k: usize,
    pub selectivity: Vec<f64>,
    pub concurrency: usize,
    pub max_queries: Option<usize>,
    pub json: PathBuf,
}

#[derive(Serialize)]
struct FilterPoint {
    selectivity: f64,
    filter: String,
    matching_rows: usize,
    recall: f64,
    qps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn normalized(vector: &[f32]) -> Vec<f32> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return vector.to_vec();
    }
    vector.iter().map(|x| x / norm).collect()
}

/// Larger is better for every metric (l2 is negated).
fn similarity(metric: &str, query: &[f32], row: &[f32]) -> f32 {
    match metric {
        "l2" => -query
            .iter()
            .zip(row)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>(),
        _ => query.iter().zip(row).map(|(a, b)| a * b).sum(),
    }
}

/// The exact top-k row ids among rows with `row % TAGS < threshold`.
fn exact_top_k(
    base: &Matrix<f32>,
    prepared: &[Vec<f32>],
    metric: &str,
    query: &[f32],
    threshold: usize,
    k: usize,
) -> Vec<u64> {
    let query = if metric == "cosine" {
        normalized(query)
    } else {
        query.to_vec()
    };
    let mut scored: Vec<(f32, u64)> = (0..base.rows())
        .filter(|row| row % TAGS < threshold)
        .map(|row| {
            let vector = if metric == "cosine" {
                &prepared[row][..]
            } else {
                base.row(row)
            };
            (similarity(metric, &query, vector), row as u64)
        })
        .collect();
    let k = k.min(scored.len());
    if k == 0 {
        return Vec::new();
    }
    scored.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
    scored.truncate(k);
    scored.into_iter().map(|(_, id)| id).collect()
}

async fn load(client: &Client, base: &Arc<Matrix<f32>>, options: &FilterOptions) -> Result<()> {
    let config = CollectionConfig {
        dimension: base.dim as u32,
        metric: options.metric.clone(),
        id_type: None,
        shards: Some(options.shards),
        replication: None,
        payload_schema: vec![serde_json::json!({"name": "tag", "type": "integer"})],
    };
    match client.create_collection(&options.collection, &config).await {
        Ok(_) => {}
        Err(error) if error.code() == Some(quiver_client::ErrorCode::AlreadyExists) => {
            bail!(
                "collection {} exists; drop it or pick another --collection",
                options.collection
            )
        }
        Err(error) => return Err(error.into()),
    }
    crate::load::upsert_rows(client, &options.collection, base, |row| {
        Some(serde_json::json!({"tag": row % TAGS}))
    })
    .await
}

/// Runs the benchmark.
pub async fn run(options: &FilterOptions) -> Result<()> {
    if options.k == 0 || options.concurrency == 0 || options.selectivity.is_empty() {
        bail!("--k, --concurrency and --selectivity must be positive / non-empty");
    }
    for &s in &options.selectivity {
        if !(s > 0.0 && s <= 1.0) || (s * TAGS as f64).round() < 1.0 {
            bail!(
                "--selectivity {s}: must be in (0, 1] and at least {}",
                1.0 / TAGS as f64
            );
        }
    }
    let client = Client::new(&options.endpoint, options.api_key.clone())?;
    let base = Arc::new(read_fvecs(&options.base, None)?);
    if options.load {
        load(&client, &base, options).await?;
    }
    let queries = read_fvecs(&options.queries, options.max_queries)?;
    if queries.dim != base.dim {
        bail!(
            "queries have dimension {}, base vectors {}",
            queries.dim,
            base.dim
        );
    }
    let described = client.describe(&options.collection).await?;
    if described.points != base.rows() as u64 {
        bail!(
            "collection {} holds {} points, --base has {} rows (load it with --load)",
            options.collection,
            described.points,
            base.rows()
        );
    }
    let prepared: Vec<Vec<f32>> = if options.metric == "cosine" {
        (0..base.rows())
            .into_par_iter()
            .map(|row| normalized(base.row(row)))
            .collect()
    } else {
        Vec::new()
    };
    println!(
        "{:>11} {:>16} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6}",
        "selectivity", "filter", "matching", "recall", "qps", "p50_ms", "p99_ms", "errors"
    );
    let mut points = Vec::new();
    for &selectivity in &options.selectivity {
        let threshold = (selectivity * TAGS as f64).round() as usize;
        let filter = format!("tag < {threshold}");
        let truth: Vec<Vec<u64>> = (0..queries.rows())
            .into_par_iter()
            .map(|row| {
                exact_top_k(
                    &base,
                    &prepared,
                    &options.metric,
                    queries.row(row),
                    threshold,
                    options.k,
                )
            })
            .collect();
        let matching = (0..base.rows())
            .filter(|row| row % TAGS < threshold)
            .count();
        let queries_shared = Arc::new(queries.data.clone());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..options.concurrency {
            let (client, data, next) = (client.clone(), queries_shared.clone(), next.clone());
            let (name, k, filter, dim, rows) = (
                options.collection.clone(),
                options.k,
                filter.clone(),
                queries.dim,
                queries.rows(),
            );
            workers.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut errors = 0usize;
                loop {
                    let row = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if row >= rows {
                        break;
                    }
                    let mut search = Search::new(data[row * dim..(row + 1) * dim].to_vec(), k);
                    search.filter = Some(serde_json::Value::String(filter.clone()));
                    search.include_payload = false;
                    let begun = Instant::now();
                    match client.search(&name, &search).await {
                        Ok(result) => {
                            answers.push((row, result, begun.elapsed().as_secs_f64() * 1e3))
                        }
                        Err(error) => {
                            if errors == 0 {
                                eprintln!("search failed: {error}");
                            }
                            errors += 1
                        }
                    }
                }
                (answers, errors)
            }));
        }
        let (mut found, mut wanted, mut errors) = (0usize, 0usize, 0usize);
        let mut latencies = Vec::new();
        for worker in workers {
            let (answers, worker_errors) = worker.await?;
            errors += worker_errors;
            for (row, result, latency) in answers {
                let expected = &truth[row];
                found += result
                    .hits
                    .iter()
                    .filter(|hit| hit.id.as_u64().is_some_and(|id| expected.contains(&id)))
                    .count();
                wanted += expected.len();
                latencies.push(latency);
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        latencies.sort_by(f64::total_cmp);
        let point = FilterPoint {
            selectivity,
            filter: filter.clone(),
            matching_rows: matching,
            recall: if wanted == 0 {
                0.0
            } else {
                found as f64 / wanted as f64
            },
            qps: latencies.len() as f64 / elapsed,
            p50_ms: percentile_or_zero(&latencies, 0.5),
            p99_ms: percentile_or_zero(&latencies, 0.99),
            errors,
        };
        println!(
            "{:>11} {:>16} {:>9} {:>8.4} {:>8.0} {:>8.2} {:>8.2} {:>6}",
            point.selectivity,
            point.filter,
            point.matching_rows,
            point.recall,
            point.qps,
            point.p50_ms,
            point.p99_ms,
            point.errors
        );
        points.push(point);
    }
    let report = serde_json::json!({
        "dataset": {
            "collection": options.collection,
            "base": options.base.display().to_string(),
            "queries": options.queries.display().to_string(),
            "points": base.rows(),
            "k": options.k,
            "endpoint": options.endpoint,
            "concurrency": options.concurrency,
        },
        "points": points,
    });
    std::fs::write(&options.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", options.json.display()))?;
    let png = options.json.with_extension("png");
    plot(&png, &options.collection, &points)?;
    println!("wrote {} and {}", options.json.display(), png.display());
    Ok(())
}

/// Recall (left) and p50 latency (right) against selectivity (log scale).
fn plot(path: &std::path::Path, title: &str, points: &[FilterPoint]) -> Result<()> {
    crate::plot::ensure_font();
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let (left, right) = root.split_horizontally(450);
    let min_s = points.iter().map(|p| p.selectivity).fold(1.0f64, f64::min) * 0.7;
    for (area, label, pick, top) in [
        (
            &left,
            "recall@k",
            (|p: &FilterPoint| p.recall) as fn(&FilterPoint) -> f64,
            1.0,
        ),
        (
            &right,
            "p50 latency (ms)",
            |p: &FilterPoint| p.p50_ms,
            points.iter().map(|p| p.p50_ms).fold(0.1f64, f64::max) * 1.2,
        ),
    ] {
        let bottom = if label == "recall@k" {
            points
                .iter()
                .map(|p| p.recall)
                .fold(1.0f64, f64::min)
                .min(0.9)
                - 0.02
        } else {
            0.0
        };
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}: {label}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d((min_s..1.4).log_scale(), bottom..top.max(bottom + 0.01))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        chart
            .configure_mesh()
            .x_desc("fraction of rows the filter keeps")
            .y_desc(label)
            .draw()
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        let series: Vec<(f64, f64)> = points.iter().map(|p| (p.selectivity, pick(p))).collect();
        chart
            .draw_series(LineSeries::new(series.clone(), BLUE.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|(x, y)| Circle::new((x, y), 3, BLUE.filled())),
            )
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}
