//! The same segment file searched in a tight loop through each source a
//! search can read it from: the engine's `MmapSource`, the searcher's
//! `CachedObject` mapping a local file (`quiver standalone`), and the same
//! object copied into the region cache's regions (a searcher over S3); each by
//! `Segment::search` and by `SharedSearch` (what a searcher runs). Prints the
//! thread's CPU per query of each, twice. Experiments item 53 in
//! `docs/bench/served-real100k/calibrated-300/`: the source does not change
//! what a search costs, so a served search's extra cost is not in how it reads.
//!
//! ```text
//! cargo run --release -p quiver-bench --example source_floor -- \
//!     --root DATA/objects --key collections/1/shards/0/segments/X.qseg \
//!     --queries Q.fvecs --nprobe 202 --ratio 0.72
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use nix::time::{ClockId, clock_gettime};
use quiver_blobcache::{BlobCache, BlobCacheConfig};
use quiver_common::vecs::read_fvecs;
use quiver_index::{
    ByteSource, MmapSource, SearchParams, SearchScratch, Segment, SharedProbe, SharedSearch,
};
use quiver_storage::{S3Settings, Storage, StorageOptions, StoreUrl};

#[derive(Parser)]
struct Options {
    /// The object store's root directory (`file://`).
    #[arg(long)]
    root: PathBuf,
    /// The segment's key under the root.
    #[arg(long)]
    key: String,
    /// Queries (fvecs).
    #[arg(long)]
    queries: PathBuf,
    /// Lists probed per search (the most, with --ratio).
    #[arg(long)]
    nprobe: usize,
    /// Lists chosen by distance ratio, as a calibrated default probe does.
    #[arg(long)]
    ratio: Option<f32>,
    #[arg(long, default_value_t = 5000)]
    max_queries: usize,
}

/// This thread's CPU time, milliseconds.
fn thread_cpu_ms() -> Result<f64> {
    let time = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(time.tv_sec() as f64 * 1e3 + time.tv_nsec() as f64 / 1e6)
}

fn run<S: ByteSource>(
    name: &str,
    segment: &Segment<S>,
    queries: &quiver_common::vecs::Matrix<f32>,
    params: &SearchParams,
) -> Result<()> {
    let mut scratch = SearchScratch::new();
    for shared in [false, true, false, true] {
        let started = thread_cpu_ms()?;
        let mut rows = 0;
        for index in 0..queries.rows() {
            if shared {
                let probes = [SharedProbe {
                    segment,
                    filter: None,
                }];
                let search = SharedSearch::open(&probes)?;
                std::hint::black_box(search.search(queries.row(index), params, &mut scratch)?);
            } else {
                std::hint::black_box(segment.search(
                    queries.row(index),
                    params,
                    None,
                    &mut scratch,
                )?);
            }
            rows += scratch.stats.rows_scanned;
        }
        println!(
            "{name:8} {:6} {:.4} ms/q rows {:.0}",
            if shared { "shared" } else { "plain" },
            (thread_cpu_ms()? - started) / queries.rows() as f64,
            rows as f64 / queries.rows() as f64
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let options = Options::parse();
    let queries = read_fvecs(&options.queries, Some(options.max_queries))?;
    let mut params = SearchParams::new(10);
    params.nprobe = Some(options.nprobe);
    params.probe_ratio = options.ratio;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let url: StoreUrl = format!("file://{}", options.root.display()).parse()?;
    let storage = Storage::open(&url, &S3Settings::from_env(), StorageOptions::default())?;
    let cache_dir = tempfile::tempdir()?;
    let mut config = BlobCacheConfig::new(cache_dir.path(), 256 << 20);
    config.map_local_files = true;
    let cache = BlobCache::new(&config, storage, runtime.handle().clone())?;
    let cached = Segment::open(cache.open_blocking(&options.key)?)?;
    let regions_dir = tempfile::tempdir()?;
    let mut regions_config = BlobCacheConfig::new(regions_dir.path(), 1 << 30);
    regions_config.map_local_files = false;
    let storage = Storage::open(&url, &S3Settings::from_env(), StorageOptions::default())?;
    let regions_cache = BlobCache::new(&regions_config, storage, runtime.handle().clone())?;
    let regions = Segment::open(regions_cache.open_blocking(&options.key)?)?;
    let mapped = Segment::open(MmapSource::open(&options.root.join(&options.key))?)?;
    for _ in 0..2 {
        run("mmap", &mapped, &queries, &params)?;
        run("cached", &cached, &queries, &params)?;
        run("regions", &regions, &queries, &params)?;
    }
    Ok(())
}
