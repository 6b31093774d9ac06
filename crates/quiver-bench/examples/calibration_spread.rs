//! How steady and how faithful the calibrated default probe is: calibrates one
//! segment with several sample seeds and sample sizes and measures, for each
//! outcome, the recall@10 of held-out queries under the probe it chose (against
//! their exact ground truth) and the lists and rows it cost, beside the
//! held-out recall curve of counted lists and of given distance ratios.
//! Experiments items 40 and 41 in `docs/bench/served-real100k/calibrated-300/`.
//!
//! ```text
//! cargo run --release -p quiver-bench --example calibration_spread -- \
//!     --segment X.qseg --queries Q.fvecs --gt GT.ivecs --samples 300,1000 --seeds 6
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;
use quiver_common::vecs::{read_fvecs, read_ivecs};
use quiver_index::{
    CalibrationOptions, MmapSource, PointId, SearchParams, SearchScratch, Segment, calibrate_nprobe,
};

#[derive(Parser)]
struct Options {
    /// The segment file calibrated (rows' ids are the base's row numbers).
    #[arg(long)]
    segment: PathBuf,
    /// Held-out queries (fvecs).
    #[arg(long)]
    queries: PathBuf,
    /// Their exact neighbours in the base (ivecs).
    #[arg(long)]
    gt: PathBuf,
    #[arg(long, default_value_t = 2000)]
    max_queries: usize,
    /// Sample sizes tried, comma-separated.
    #[arg(long, default_value = "300", value_delimiter = ',')]
    samples: Vec<usize>,
    /// Seeds per sample size.
    #[arg(long, default_value_t = 6)]
    seeds: u64,
    #[arg(long, default_value_t = 0.97)]
    target: f64,
    /// Fixed nprobe values of the held-out curve, comma-separated.
    #[arg(
        long,
        default_value = "96,128,160,192,208,224,256,304,352,400",
        value_delimiter = ','
    )]
    curve: Vec<usize>,
    /// Distance ratios measured on the held-out queries, comma-separated.
    #[arg(long, value_delimiter = ',')]
    ratios: Vec<f32>,
}

fn main() -> Result<()> {
    let options = Options::parse();
    let segment = Segment::open(MmapSource::open(&options.segment)?)?;
    let queries = read_fvecs(&options.queries, Some(options.max_queries))?;
    let gt = read_ivecs(&options.gt, Some(options.max_queries))?;
    if gt.rows() < queries.rows() {
        bail!("fewer ground-truth rows than queries");
    }
    let ids: Vec<u64> = segment
        .ids()?
        .into_iter()
        .map(|id| match id {
            PointId::U64(id) => Ok(id),
            PointId::String(id) => bail!("string id {id}"),
        })
        .collect::<Result<_>>()?;
    let mut scratch = SearchScratch::new();
    // Held-out recall@10, mean lists probed and rows scanned under `params`.
    let measure = |params: &SearchParams, scratch: &mut SearchScratch| -> Result<(f64, f64, f64)> {
        let (mut found, mut lists, mut rows) = (0usize, 0usize, 0usize);
        for query in 0..queries.rows() {
            let hits = segment.search(queries.row(query), params, None, scratch)?;
            lists += scratch.stats.lists_probed;
            rows += scratch.stats.rows_scanned;
            let truth = &gt.row(query)[..10];
            found += hits
                .iter()
                .filter(|hit| truth.contains(&(ids[hit.row as usize] as i32)))
                .count();
        }
        let n = queries.rows() as f64;
        Ok((found as f64 / (10.0 * n), lists as f64 / n, rows as f64 / n))
    };
    let mut held_out: HashMap<usize, f64> = HashMap::new();
    let mut recall_at = |nprobe: usize, scratch: &mut SearchScratch| -> Result<f64> {
        if let Some(&recall) = held_out.get(&nprobe) {
            return Ok(recall);
        }
        let mut params = SearchParams::new(10);
        params.nprobe = Some(nprobe);
        let recall = measure(&params, scratch)?.0;
        held_out.insert(nprobe, recall);
        Ok(recall)
    };
    println!(
        "held-out recall@10 ({} queries), lists counted:",
        queries.rows()
    );
    for nprobe in options.curve.iter().copied() {
        println!(
            "  nprobe {nprobe:4}  {:.4}",
            recall_at(nprobe, &mut scratch)?
        );
    }
    for &samples in &options.samples {
        for seed in 0..options.seeds {
            let started = Instant::now();
            let calibration = calibrate_nprobe(
                &segment,
                &CalibrationOptions {
                    sample_queries: samples,
                    seed: 0x5155_4956 + seed,
                    target_recall: options.target,
                    ..CalibrationOptions::default()
                },
            )?;
            let seconds = started.elapsed().as_secs_f64();
            let params = SearchParams {
                nprobe: Some(calibration.nprobe),
                probe_ratio: calibration.probe_ratio,
                ..SearchParams::new(10)
            };
            let (recall, lists, rows) = measure(&params, &mut scratch)?;
            println!(
                "samples {samples:5} seed {seed}: ratio {:?} nprobe {:4} sample recall {:.4} held-out {recall:.4} ({lists:.0} lists, {rows:.0} rows; {seconds:.1} s, {} passes)",
                calibration.probe_ratio, calibration.nprobe, calibration.recall, calibration.passes,
            );
        }
    }
    for &ratio in &options.ratios {
        let params = SearchParams {
            probe_ratio: Some(ratio),
            ..SearchParams::new(10)
        };
        let (recall, lists, rows) = measure(&params, &mut scratch)?;
        println!("  ratio {ratio:.3}  held-out {recall:.4} ({lists:.0} lists, {rows:.0} rows)");
    }
    Ok(())
}
