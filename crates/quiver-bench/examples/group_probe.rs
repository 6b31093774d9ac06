//! What a codebook's calibrated probe is worth once more rows share the
//! codebook: trains a codebook on the first `--first` rows of a base (as a
//! shard's first flush does) and calibrates it, then builds the first `N` rows
//! of the base with that codebook — one segment holding what a group of
//! flushes sharing it holds, searched as a shared search is — and calibrates
//! again. For each, held-out queries searched under both probes: recall@10
//! against the exact answer over the `N` rows, lists and rows scanned.
//! Experiments item 61 in `docs/bench/served-real100k/calibrated-300/`.
//!
//! ```text
//! cargo run --release -p quiver-bench --example group_probe -- \
//!     --base base.fvecs --queries queries.fvecs --first 17000 --rows 50000,100000,200000
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quiver_common::vecs::{Matrix, read_fvecs};
use quiver_index::{
    CalibratedProbe, Calibration, CalibrationOptions, Codebook, IdType, Metric, MmapSource,
    PointId, SearchParams, SearchScratch, Segment, SegmentSpec, SegmentWriter, calibrate_nprobe,
};

#[derive(Parser)]
struct Options {
    /// Base vectors (fvecs).
    #[arg(long)]
    base: PathBuf,
    /// Held-out queries (fvecs).
    #[arg(long)]
    queries: PathBuf,
    #[arg(long, default_value_t = 1000)]
    max_queries: usize,
    /// Rows the codebook is trained and first calibrated on.
    #[arg(long, default_value_t = 17_000)]
    first: usize,
    /// Rows sharing it, comma-separated.
    #[arg(long, value_delimiter = ',')]
    rows: Vec<usize>,
    /// l2 or cosine.
    #[arg(long, default_value = "l2")]
    metric: String,
}

fn build(
    base: &Matrix<f32>,
    rows: usize,
    metric: Metric,
    codebook: Option<Arc<Codebook>>,
) -> Result<(Segment<MmapSource>, tempfile::NamedTempFile)> {
    let mut spec = SegmentSpec::new(base.dim, metric, IdType::U64);
    spec.build.codebook = codebook;
    let mut writer = SegmentWriter::new(spec)?;
    for row in 0..rows {
        writer.add(PointId::U64(row as u64), base.row(row), None)?;
    }
    let file = tempfile::NamedTempFile::new()?;
    {
        let mut out = std::io::BufWriter::new(file.reopen()?);
        writer.finish(&mut out, &|_, _, _| {})?;
    }
    Ok((Segment::open(MmapSource::open(file.path())?)?, file))
}

fn calibrate(segment: &Segment<MmapSource>) -> Result<Calibration> {
    let started = Instant::now();
    let calibration = calibrate_nprobe(segment, &CalibrationOptions::default())?;
    println!(
        "  calibrated on its {} rows in {:.1} s: ratio {:?}, nprobe {}, sample recall {:.4} ({} passes)",
        segment.rows(),
        started.elapsed().as_secs_f64(),
        calibration.probe_ratio,
        calibration.nprobe,
        calibration.recall,
        calibration.passes
    );
    Ok(calibration)
}

/// Held-out recall@10, mean lists and rows under `probe`.
fn measure(
    segment: &Segment<MmapSource>,
    queries: &Matrix<f32>,
    truths: &[Vec<u32>],
    probe: CalibratedProbe,
) -> Result<(f64, f64, f64)> {
    let mut scratch = SearchScratch::new();
    let params = SearchParams {
        nprobe: Some(probe.nprobe),
        probe_ratio: probe.ratio,
        ..SearchParams::new(10)
    };
    let (mut found, mut lists, mut rows) = (0usize, 0usize, 0usize);
    for (query, truth) in truths.iter().enumerate() {
        let hits = segment.search(queries.row(query), &params, None, &mut scratch)?;
        lists += scratch.stats.lists_probed;
        rows += scratch.stats.rows_scanned;
        found += hits.iter().filter(|hit| truth.contains(&hit.row)).count();
    }
    let n = truths.len() as f64;
    Ok((found as f64 / (10.0 * n), lists as f64 / n, rows as f64 / n))
}

fn main() -> Result<()> {
    let options = Options::parse();
    let metric = match options.metric.as_str() {
        "cosine" => Metric::Cosine,
        _ => Metric::L2,
    };
    let largest = options.rows.iter().copied().max().unwrap_or(options.first);
    let base = read_fvecs(&options.base, Some(largest.max(options.first)))?;
    let queries = read_fvecs(&options.queries, Some(options.max_queries))?;
    println!("codebook trained on the first {} rows", options.first);
    let (first, _file) = build(&base, options.first, metric, None)?;
    let first_calibration = calibrate(&first)?;
    let codebook = Arc::new(Codebook::of_segment(&first)?.expect("a codebook"));
    println!("  {} lists", codebook.nlist());
    for &rows in &options.rows {
        println!("{rows} rows under it:");
        let (segment, _file) = build(&base, rows, metric, Some(codebook.clone()))?;
        let refs: Vec<&[f32]> = (0..queries.rows())
            .map(|query| queries.row(query))
            .collect();
        let truths: Vec<Vec<u32>> = segment
            .flat_search_many(&refs, 10, None, &mut SearchScratch::new())?
            .into_iter()
            .map(|hits| hits.into_iter().map(|hit| hit.row).collect())
            .collect();
        let calibration = calibrate(&segment)?;
        for (name, probe) in [
            ("first calibration", first_calibration.probe()),
            ("its own calibration", calibration.probe()),
        ] {
            let (recall, lists, scanned) = measure(&segment, &queries, &truths, probe)?;
            println!(
                "  {name:20}: held-out recall@10 {recall:.4}, {lists:.0} lists, {scanned:.0} rows"
            );
        }
    }
    Ok(())
}
