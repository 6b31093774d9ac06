//! `quiver-bench ingest`: sustained write throughput of a running Quiver over REST —
//! rows per second, write-acknowledgement latency (a batch is acknowledged only once
//! its WAL object is in object storage and committed to the metadata service), and
//! the lag from acknowledgement until the rows sit in segments (flushed).
//!
//! For each shard count it creates a fresh collection, upserts the base vectors in
//! batches from several concurrent writers, samples the collection's stats while it
//! does, and waits until the WAL tail is empty.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use quiver_client::{Client, CollectionConfig, Point, PointId};
use quiver_common::stats::percentile_or_zero;
use quiver_common::vecs::read_fvecs;
use serde::Serialize;

use crate::progress::bar;

/// Options of `quiver-bench ingest`.
pub struct IngestOptions {
    pub endpoint: String,
    pub api_key: Option<String>,
    pub collection_prefix: String,
    pub base: PathBuf,
    pub metric: String,
    pub shards: Vec<u32>,
    pub batch: usize,
    pub concurrency: usize,
    pub max_rows: Option<usize>,
    pub json: PathBuf,
}

/// One shard count's result.
#[derive(Serialize)]
struct IngestPoint {
    shards: u32,
    rows: usize,
    batch: usize,
    concurrency: usize,
    /// Rows acknowledged per second (first request to last acknowledgement).
    rows_per_s: f64,
    /// Latency of one acknowledged upsert request (one batch).
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    ack_max_ms: f64,
    /// From a batch's acknowledgement until as many rows as had been acknowledged by
    /// then are in segments (sampled every `sample_ms`, so ± that much).
    ack_to_segment_p50_ms: f64,
    ack_to_segment_p99_ms: f64,
    /// From the last acknowledgement until the WAL tail is empty.
    drain_ms: f64,
    sample_ms: u64,
    errors: usize,
    /// (seconds since start, rows acknowledged, rows in segments)
    timeline: Vec<(f64, u64, u64)>,
}

const SAMPLE: Duration = Duration::from_millis(100);

/// Rows in segments: live points minus the rows still only in the WAL tail (every id is
/// written once here, so the two never overlap).
fn segment_rows(described: &quiver_client::DescribeCollectionResponse) -> u64 {
    let points = described.points;
    let tail = described.wal_tail_rows;
    points.saturating_sub(tail)
}

async fn run_one(
    client: &Client,
    base: &Arc<quiver_common::vecs::Matrix<f32>>,
    rows: usize,
    shards: u32,
    options: &IngestOptions,
) -> Result<IngestPoint> {
    let name = format!("{}-{shards}s", options.collection_prefix);
    let config = CollectionConfig {
        dimension: base.dim as u32,
        metric: options.metric.clone(),
        id_type: None,
        shards: Some(shards),
        replication: None,
        payload_schema: Vec::new(),
    };
    match client.create_collection(&name, &config).await {
        Ok(_) => {}
        Err(error) if error.code() == Some(quiver_client::ErrorCode::AlreadyExists) => {
            bail!("collection {name} exists; drop it or pick another --collection-prefix")
        }
        Err(error) => return Err(error.into()),
    }
    let progress = bar(&format!("ingest {shards} shard(s)"), rows as u64);
    let started = Instant::now();
    // (ack time since start, rows acknowledged after this ack)
    let acks: Arc<Mutex<Vec<(f64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let acked_rows = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Sampler: rows in segments over time.
    let sampler = {
        let (client, name, done, acked_rows) = (
            client.clone(),
            name.clone(),
            done.clone(),
            acked_rows.clone(),
        );
        tokio::spawn(async move {
            let mut timeline: Vec<(f64, u64, u64)> = Vec::new();
            let mut drained_at = None;
            loop {
                let tick = Instant::now();
                if let Ok(described) = client.describe(&name).await {
                    let flushed = segment_rows(&described);
                    let acked = acked_rows.load(std::sync::atomic::Ordering::SeqCst);
                    timeline.push((started.elapsed().as_secs_f64(), acked, flushed));
                    if done.load(std::sync::atomic::Ordering::SeqCst)
                        && described.wal_tail_rows == 0
                        && flushed >= acked
                    {
                        drained_at = Some(started.elapsed().as_secs_f64());
                        break;
                    }
                }
                if started.elapsed() > Duration::from_secs(3600) {
                    break;
                }
                tokio::time::sleep(SAMPLE.saturating_sub(tick.elapsed())).await;
            }
            (timeline, drained_at)
        })
    };

    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..options.concurrency.max(1) {
        let (client, base, next, progress) =
            (client.clone(), base.clone(), next.clone(), progress.clone());
        let (acks, latencies, acked_rows) = (acks.clone(), latencies.clone(), acked_rows.clone());
        let (name, batch) = (name.clone(), options.batch);
        writers.push(tokio::spawn(async move {
            let mut errors = 0usize;
            loop {
                let start = next.fetch_add(batch, std::sync::atomic::Ordering::Relaxed);
                if start >= rows {
                    break;
                }
                let end = (start + batch).min(rows);
                let points: Vec<Point> = (start..end)
                    .map(|row| Point {
                        id: PointId::U64(row as u64),
                        vector: base.row(row).to_vec(),
                        payload: None,
                    })
                    .collect();
                let begun = Instant::now();
                match client.upsert(&name, &points).await {
                    Ok(_) => {
                        let now = started.elapsed().as_secs_f64();
                        latencies
                            .lock()
                            .expect("latencies")
                            .push(begun.elapsed().as_secs_f64() * 1e3);
                        let total = acked_rows
                            .fetch_add((end - start) as u64, std::sync::atomic::Ordering::SeqCst)
                            + (end - start) as u64;
                        acks.lock().expect("acks").push((now, total));
                    }
                    Err(error) => {
                        errors += 1;
                        eprintln!("upsert of rows {start}..{end} failed: {error}");
                    }
                }
                progress.inc((end - start) as u64);
            }
            errors
        }));
    }
    let mut errors = 0;
    for writer in writers {
        errors += writer.await?;
    }
    let last_ack = started.elapsed().as_secs_f64();
    progress.finish();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (timeline, drained_at) = sampler.await?;
    let drained_at = drained_at.context("the WAL tail did not drain within an hour")?;

    let mut latencies = latencies.lock().expect("latencies").clone();
    latencies.sort_by(f64::total_cmp);
    let acks = acks.lock().expect("acks").clone();
    // Ack → segment: first sample at or after the ack whose segment rows cover the rows
    // acknowledged by then.
    let mut lags: Vec<f64> = acks
        .iter()
        .filter_map(|&(at, total)| {
            timeline
                .iter()
                .find(|&&(time, _, flushed)| time >= at && flushed >= total)
                .map(|&(time, _, _)| (time - at) * 1e3)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    let acked = acks.last().map(|&(_, total)| total).unwrap_or(0);
    Ok(IngestPoint {
        shards,
        rows: acked as usize,
        batch: options.batch,
        concurrency: options.concurrency,
        rows_per_s: acked as f64 / last_ack.max(1e-9),
        ack_p50_ms: percentile_or_zero(&latencies, 0.5),
        ack_p99_ms: percentile_or_zero(&latencies, 0.99),
        ack_max_ms: latencies.last().copied().unwrap_or(0.0),
        ack_to_segment_p50_ms: percentile_or_zero(&lags, 0.5),
        ack_to_segment_p99_ms: percentile_or_zero(&lags, 0.99),
        drain_ms: (drained_at - last_ack).max(0.0) * 1e3,
        sample_ms: SAMPLE.as_millis() as u64,
        errors,
        timeline,
    })
}

/// Runs the benchmark.
pub async fn run(options: &IngestOptions) -> Result<()> {
    if options.batch == 0 || options.concurrency == 0 || options.shards.contains(&0) {
        bail!("--batch, --concurrency and --shards must be positive");
    }
    let client = Client::new(&options.endpoint, options.api_key.clone())?;
    let base = Arc::new(read_fvecs(&options.base, options.max_rows)?);
    let rows = base.rows();
    println!(
        "ingest {rows} × {} from {} in batches of {} by {} writers",
        base.dim,
        options.base.display(),
        options.batch,
        options.concurrency
    );
    let mut points = Vec::new();
    for &shards in &options.shards {
        let point = run_one(&client, &base, rows, shards, options).await?;
        points.push(point);
    }
    println!(
        "{:>6} {:>9} {:>10} {:>9} {:>9} {:>14} {:>14} {:>9} {:>6}",
        "shards",
        "rows",
        "rows/s",
        "ack_p50",
        "ack_p99",
        "ack→seg_p50",
        "ack→seg_p99",
        "drain_ms",
        "errors"
    );
    for point in &points {
        println!(
            "{:>6} {:>9} {:>10.0} {:>9.1} {:>9.1} {:>14.0} {:>14.0} {:>9.0} {:>6}",
            point.shards,
            point.rows,
            point.rows_per_s,
            point.ack_p50_ms,
            point.ack_p99_ms,
            point.ack_to_segment_p50_ms,
            point.ack_to_segment_p99_ms,
            point.drain_ms,
            point.errors
        );
    }
    let report = serde_json::json!({
        "dataset": {
            "base": options.base.display().to_string(),
            "rows": rows,
            "dim": base.dim,
            "endpoint": options.endpoint,
        },
        "points": points,
    });
    std::fs::write(&options.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", options.json.display()))?;
    let png = options.json.with_extension("png");
    plot_timeline(&png, &points)?;
    println!("wrote {} and {}", options.json.display(), png.display());
    Ok(())
}

/// Rows acknowledged and rows in segments over time, one pair of lines per shard count.
fn plot_timeline(path: &std::path::Path, points: &[IngestPoint]) -> Result<()> {
    crate::plot::ensure_font();
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let max_time = points
        .iter()
        .flat_map(|p| p.timeline.iter().map(|t| t.0))
        .fold(1.0f64, f64::max);
    let max_rows = points
        .iter()
        .flat_map(|p| p.timeline.iter().map(|t| t.1.max(t.2)))
        .max()
        .unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ingest: rows acknowledged (solid) and in segments (dashed)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_time * 1.02, 0.0..max_rows * 1.05)
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("rows")
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let palette = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (index, point) in points.iter().enumerate() {
        let color = palette[index % palette.len()];
        let acked: Vec<(f64, f64)> = point
            .timeline
            .iter()
            .map(|&(t, a, _)| (t, a as f64))
            .collect();
        let flushed: Vec<(f64, f64)> = point
            .timeline
            .iter()
            .map(|&(t, _, f)| (t, f as f64))
            .collect();
        chart
            .draw_series(LineSeries::new(acked, color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?
            .label(format!("{} shard(s)", point.shards))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(DashedLineSeries::new(flushed, 6, 4, color.stroke_width(1)))
            .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}
