//! What a search costs its thread on this machine when the thread does nothing
//! else (a tight loop, as the engine alone is measured), when it sleeps or spins
//! between searches (as a server's search thread waits for the next request),
//! and when something else touches 2 MiB between searches (as the load
//! generator and the HTTP work on the same core do). Each search is timed alone
//! (the thread's CPU clock around it); the 2 MiB touch alone is printed last,
//! and the segment's list layout first. Experiments items 29 and 32 in
//! `docs/bench/served-real100k/calibrated-300/`.
//!
//! ```text
//! cargo run --release -p quiver-bench --example search_thread_floor -- \
//!     --segment DATA/objects/.../X.qseg --queries Q.fvecs --nprobe 216
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use nix::time::{ClockId, clock_gettime};
use quiver_common::vecs::read_fvecs;
use quiver_index::{MmapSource, SearchParams, SearchScratch, Segment};

#[derive(Parser)]
struct Options {
    /// The segment file searched.
    #[arg(long)]
    segment: PathBuf,
    /// Queries (fvecs).
    #[arg(long)]
    queries: PathBuf,
    /// Lists probed per search.
    #[arg(long)]
    nprobe: usize,
    #[arg(long, default_value_t = 5000)]
    max_queries: usize,
}

/// This thread's CPU time, milliseconds.
fn thread_cpu_ms() -> Result<f64> {
    let time = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(time.tv_sec() as f64 * 1e3 + time.tv_nsec() as f64 / 1e6)
}

fn touch(junk: &mut [u8]) {
    for byte in junk.iter_mut().step_by(64) {
        *byte = byte.wrapping_add(1);
    }
}

fn main() -> Result<()> {
    let options = Options::parse();
    let segment = Segment::open(MmapSource::open(&options.segment)?)?;
    let queries = read_fvecs(&options.queries, Some(options.max_queries))?;
    let mut params = SearchParams::new(10);
    params.nprobe = Some(options.nprobe);
    let mut scratch = SearchScratch::new();
    let mut sizes = segment.list_sizes();
    sizes.sort_unstable();
    let rows: u64 = sizes.iter().map(|&size| size as u64).sum();
    let squares: f64 = sizes.iter().map(|&size| (size as f64).powi(2)).sum();
    for section in segment.sections() {
        println!(
            "section {:?}: bytes {}..{} ({:.1} MiB)",
            section.kind,
            section.offset,
            section.offset + section.length,
            section.length as f64 / (1 << 20) as f64
        );
    }
    println!(
        "{} rows in {} blocks of {} rows, {} lists: median {} rows, max {}, sum of squares / rows {:.0} (the rows a probe of a random row's list scans)",
        rows,
        segment.header().blocks,
        segment.header().block_rows,
        sizes.len(),
        sizes[sizes.len() / 2],
        sizes.last().copied().unwrap_or(0),
        squares / rows as f64
    );
    let mut junk = vec![0u8; 2 << 20];
    for mode in [
        "tight",
        "sleep 200us",
        "spin 200us",
        "sleep 20us",
        "touch 2MiB",
        "tight",
    ] {
        let mut spent = 0.0;
        let (mut rows, mut rescored) = (0, 0);
        for index in 0..queries.rows() {
            let started = thread_cpu_ms()?;
            let hits = segment.search(queries.row(index), &params, None, &mut scratch)?;
            spent += thread_cpu_ms()? - started;
            std::hint::black_box(hits);
            rows += scratch.stats.rows_scanned;
            rescored += scratch.stats.rows_rescored;
            match mode {
                "sleep 200us" => std::thread::sleep(Duration::from_micros(200)),
                "sleep 20us" => std::thread::sleep(Duration::from_micros(20)),
                "spin 200us" => {
                    let until = std::time::Instant::now() + Duration::from_micros(200);
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                }
                "touch 2MiB" => touch(&mut junk),
                _ => {}
            }
        }
        println!(
            "{mode:12} {:.4} ms of CPU per query, {:.0} rows scanned, {:.1} rescored",
            spent / queries.rows() as f64,
            rows as f64 / queries.rows() as f64,
            rescored as f64 / queries.rows() as f64
        );
    }
    let started = thread_cpu_ms()?;
    for _ in 0..queries.rows() {
        touch(&mut junk);
    }
    println!(
        "the 2 MiB touch alone: {:.4} ms",
        (thread_cpu_ms()? - started) / queries.rows() as f64
    );
    Ok(())
}
