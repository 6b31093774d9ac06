//! How long one segment build takes, stage by stage: the first `--rows` rows of
//! a base file written as one segment with the default build parameters (the
//! k-means a codebook refresh runs, the encoding, the writing), each stage's
//! seconds and each k-means iteration's printed as they end.
//!
//! With `--calibrate`, the segment is written to a temporary file and its
//! default probes calibrated as a flush or merge calibrates them, for ten hits
//! and for a hundred (the seconds and the searches of each sample printed).
//!
//! ```text
//! cargo run --release -p quiver-bench --example segment_build -- \
//!     --base syn1m768/base.fvecs --rows 200000 [--threads 1] [--calibrate] \
//!     [--scratch-dir DIR]
//! ```

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use quiver_common::vecs::read_fvecs;
use quiver_index::{
    BuildStage, CalibrationOptions, IdType, Metric, MmapSource, PointId, Segment, SegmentSpec,
    SegmentWriter, calibrate_nprobe,
};

#[derive(Parser)]
struct Options {
    /// Base vectors (fvecs).
    #[arg(long)]
    base: PathBuf,
    /// Rows of the base to build from.
    #[arg(long, default_value_t = 200_000)]
    rows: usize,
    /// Build threads (0 = every core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Builds in a row (the times of each are printed).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write the segment and calibrate its default probe.
    #[arg(long)]
    calibrate: bool,
    /// Keep the rows in scratch files in this directory until the build, as
    /// an indexer's builds do (default: in memory).
    #[arg(long)]
    scratch_dir: Option<PathBuf>,
}

fn main() -> Result<()> {
    let options = Options::parse();
    let base = read_fvecs(&options.base, Some(options.rows))?;
    println!("{} rows x {} dimensions", base.rows(), base.dim);
    for _ in 0..options.repeat {
        let mut spec = SegmentSpec::new(base.dim, Metric::L2, IdType::U64);
        spec.build.threads = options.threads;
        let adding = Instant::now();
        let mut writer = match &options.scratch_dir {
            Some(directory) => SegmentWriter::with_scratch_dir(spec, directory)?,
            None => SegmentWriter::new(spec)?,
        };
        for row in 0..base.rows() {
            writer.add(PointId::U64(row as u64), base.row(row), None)?;
        }
        println!("  adding the rows: {:.2} s", adding.elapsed().as_secs_f64());
        let started = Instant::now();
        let last = Mutex::new((None::<BuildStage>, started, started));
        let file = tempfile::NamedTempFile::new()?;
        let mut out: Box<dyn std::io::Write> = if options.calibrate {
            Box::new(std::io::BufWriter::new(file.reopen()?))
        } else {
            Box::new(std::io::sink())
        };
        let summary = writer.finish(&mut out, &|stage, done, total| {
            let mut last = last.lock().expect("progress lock");
            let now = Instant::now();
            if last.0 != Some(stage) {
                if let Some(previous) = last.0 {
                    println!(
                        "  {previous:?}: {:.2} s",
                        now.duration_since(last.1).as_secs_f64()
                    );
                }
                *last = (Some(stage), now, now);
            }
            if stage == BuildStage::Clustering && done > 0 {
                println!(
                    "    clustering step {done}/{total}: {:.2} s",
                    now.duration_since(last.2).as_secs_f64()
                );
                last.2 = now;
            }
        })?;
        let (stage, since, _) = *last.lock().expect("progress lock");
        if let Some(stage) = stage {
            println!("  {stage:?}: {:.2} s", since.elapsed().as_secs_f64());
        }
        println!(
            "build {:.2} s, {} bytes",
            started.elapsed().as_secs_f64(),
            summary.file_bytes
        );
        drop(out);
        if options.calibrate {
            let segment = Segment::open(MmapSource::open(file.path())?)?;
            for (name, calibration_options) in [
                ("calibration", CalibrationOptions::default()),
                ("wide calibration", CalibrationOptions::wide()),
            ] {
                let started = Instant::now();
                let calibration = calibrate_nprobe(&segment, &calibration_options)?;
                println!(
                    "{name} {:.2} s: {} samples, {} passes, ratio {:?}, nprobe {}, recall {:.4}",
                    started.elapsed().as_secs_f64(),
                    calibration.samples,
                    calibration.passes,
                    calibration.probe_ratio,
                    calibration.nprobe,
                    calibration.recall
                );
            }
        }
    }
    Ok(())
}
