//! How many round trips to the object store a query whose rows are not in the
//! cache waits for, one after another: the segment file is searched through a
//! source that records every `fetch_ahead` (a cache fetches the missing ranges
//! of one call together and the query waits once), treating each query as cold
//! (no row region resident when it starts). Prints, per query on average: the
//! rounds (calls that asked for at least one region not yet fetched by this
//! query), the 64 KiB row regions fetched, the rows rescored, and recall@10
//! against the ground truth. Over a store 20 ms away, a round is 20 ms of the
//! query's latency.
//!
//! ```text
//! cargo run --release -p quiver-bench --example cold_rounds -- \
//!     --segment DATA/objects/collections/1/shards/0/segments/X.qseg \
//!     --queries Q.fvecs --gt G.ivecs --ratio 0.74 --nprobe 266
//! ```

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Result;
use clap::Parser;
use nix::time::{ClockId, clock_gettime};
use quiver_common::vecs::{read_fvecs, read_ivecs};
use quiver_index::{
    AccessPattern, ByteSource, ChunkChecksums, DirectSession, IndexResult, MmapSource, PointId,
    SearchParams, SearchScratch, Segment,
};

#[derive(Parser)]
struct Options {
    /// The segment file.
    #[arg(long)]
    segment: PathBuf,
    /// Queries (fvecs).
    #[arg(long)]
    queries: PathBuf,
    /// Ground truth (ivecs), row numbers of the segment.
    #[arg(long)]
    gt: PathBuf,
    /// Lists probed per search (the most, with --ratio).
    #[arg(long)]
    nprobe: usize,
    /// Lists chosen by distance ratio, as a calibrated default probe does.
    #[arg(long)]
    ratio: Option<f32>,
    /// Row regions of the cache, bytes.
    #[arg(long, default_value_t = 64 << 10)]
    region_bytes: u64,
    #[arg(long, default_value_t = 1000)]
    max_queries: usize,
}

/// A mapped file that records what a cache would fetch.
struct Recording {
    inner: MmapSource,
    region_bytes: u64,
    state: Mutex<Rounds>,
}

#[derive(Default)]
struct Rounds {
    /// Regions fetched by the current query.
    fetched: HashSet<u64>,
    rounds: usize,
    regions: usize,
}

impl ByteSource for Recording {
    type Bytes<'a> = &'a [u8];
    type Session<'a> = DirectSession<'a>;

    fn session(&self) -> DirectSession<'_> {
        self.inner.session()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, length: usize) -> IndexResult<&[u8]> {
        self.inner.read_at(offset, length)
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn advise(&self, offset: u64, length: usize, pattern: AccessPattern) {
        self.inner.advise(offset, length, pattern)
    }

    fn verify_with(&self, checksums: &std::sync::Arc<ChunkChecksums>) -> bool {
        self.inner.verify_with(checksums)
    }

    fn fetch_ahead(&self, ranges: &[(u64, usize)]) {
        let mut state = self.state.lock().unwrap();
        let mut new = 0;
        for &(offset, length) in ranges {
            let first = offset / self.region_bytes;
            let last = (offset + length as u64 - 1) / self.region_bytes;
            for region in first..=last {
                if state.fetched.insert(region) {
                    new += 1;
                }
            }
        }
        if new > 0 {
            state.rounds += 1;
            state.regions += new;
        }
    }
}

/// This thread's CPU time, milliseconds.
fn thread_cpu_ms() -> Result<f64> {
    let time = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(time.tv_sec() as f64 * 1e3 + time.tv_nsec() as f64 / 1e6)
}

fn main() -> Result<()> {
    let options = Options::parse();
    let queries = read_fvecs(&options.queries, Some(options.max_queries))?;
    let truth = read_ivecs(&options.gt, Some(options.max_queries))?;
    let mut params = SearchParams::new(10);
    params.nprobe = Some(options.nprobe);
    params.probe_ratio = options.ratio;
    let segment = Segment::open(Recording {
        inner: MmapSource::open(&options.segment)?,
        region_bytes: options.region_bytes,
        state: Mutex::new(Rounds::default()),
    })?;
    let mut scratch = SearchScratch::new();
    let (mut rounds, mut regions, mut rescored, mut found) = (0, 0, 0, 0);
    let mut most_rounds = 0;
    let started = thread_cpu_ms()?;
    for index in 0..queries.rows() {
        segment.source().state.lock().unwrap().fetched.clear();
        let before = {
            let state = segment.source().state.lock().unwrap();
            (state.rounds, state.regions)
        };
        let hits = segment.search(queries.row(index), &params, None, &mut scratch)?;
        let state = segment.source().state.lock().unwrap();
        rounds += state.rounds - before.0;
        most_rounds = most_rounds.max(state.rounds - before.0);
        regions += state.regions - before.1;
        rescored += scratch.stats.rows_rescored;
        let wanted: HashSet<u64> = truth.row(index)[..10].iter().map(|&r| r as u64).collect();
        for hit in &hits {
            if let PointId::U64(id) = segment.id(hit.row)? {
                found += usize::from(wanted.contains(&id));
            }
        }
    }
    let n = queries.rows() as f64;
    let cpu = (thread_cpu_ms()? - started) / n;
    println!(
        "cpu {cpu:.4} ms/q queries {} rounds/query {:.2} (most {most_rounds}) \
         regions/query {:.1} rescored/query {:.1} recall@10 {:.4}",
        queries.rows(),
        rounds as f64 / n,
        regions as f64 / n,
        rescored as f64 / n,
        found as f64 / (n * 10.0),
    );
    Ok(())
}
