//! A floor for the served search on this machine: an HTTP/1 server that answers
//! real searches of one segment file (mapped) and nothing else — no routing, no
//! strong read, no cost accounting — with one of three front doors:
//!
//! - `mt-pool`: two async workers hand each search to pool threads (one per core)
//!   and wait for the answer, as the searcher's search pool does;
//! - `mt-inline`: the async workers search inline;
//! - `tpc`: one single-thread runtime per core, each accepting its own
//!   connections (SO_REUSEPORT) and searching inline (thread per core).
//!
//! Each answer holds the hits' ids, scores and stored payloads. Measure it like a
//! server (experiments item 29 in `docs/bench/served-real100k/calibrated-300/`):
//!
//! ```text
//! curl -s http://127.0.0.1:7900/v1/collections/served > describe.json   # from a real server
//! cargo run --release -p quiver-bench --example inline_floor -- \
//!     --segment DATA/objects/.../X.qseg --describe describe.json --nprobe 216 --mode tpc &
//! quiver-bench cluster --endpoint http://127.0.0.1:7900 --collection served \
//!     --queries Q.fvecs --gt G.ivecs --include-payload --concurrency 1,16,64 \
//!     --server-pid $! --json floor.json
//! ```

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use clap::{Parser, ValueEnum};
use quiver_index::{MmapSource, PointId, SearchParams, SearchScratch, Segment};
use tokio::sync::oneshot;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    MtPool,
    MtInline,
    Tpc,
}

#[derive(Parser)]
struct Options {
    /// The segment file searched.
    #[arg(long)]
    segment: PathBuf,
    /// The answer to `GET /v1/collections/{name}`.
    #[arg(long)]
    describe: PathBuf,
    /// Lists probed per search (the served collection's calibrated nprobe).
    #[arg(long)]
    nprobe: usize,
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long, default_value = "127.0.0.1:7900")]
    listen: std::net::SocketAddr,
}

thread_local! {
    static SCRATCH: RefCell<SearchScratch> = RefCell::new(SearchScratch::new());
}

/// Decodes a search body, searches, and writes the answer's JSON.
fn answer(segment: &Segment<MmapSource>, body: &[u8], nprobe: usize) -> Result<Bytes> {
    let request: quiver_api::SearchRequest = serde_json::from_slice(body)?;
    let mut params = SearchParams::new(request.k);
    params.nprobe = Some(nprobe);
    let hits = SCRATCH.with(|scratch| {
        segment.search(&request.vector, &params, None, &mut scratch.borrow_mut())
    })?;
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(b"{\"hits\":[");
    for (index, hit) in hits.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        match segment.id(hit.row)? {
            PointId::U64(id) => write!(out, "{{\"id\":{id}")?,
            PointId::String(id) => write!(out, "{{\"id\":{}", serde_json::to_string(&id)?)?,
        }
        write!(out, ",\"score\":{}", hit.score)?;
        if let Some(payload) = segment.payload_bytes(hit.row)? {
            out.extend_from_slice(b",\"payload\":");
            out.extend_from_slice(&payload);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"took_ms\":0.0}");
    Ok(Bytes::from(out))
}

type Job = (Bytes, oneshot::Sender<Bytes>);

/// One pool thread per core answering jobs.
fn pool(segment: &Arc<Segment<MmapSource>>, nprobe: usize, cores: usize) -> mpsc::Sender<Job> {
    let (sender, receiver) = mpsc::channel::<Job>();
    let receiver = Arc::new(Mutex::new(receiver));
    for _ in 0..cores {
        let (receiver, segment) = (receiver.clone(), segment.clone());
        std::thread::spawn(move || {
            loop {
                let job = receiver.lock().expect("pool queue").recv();
                let Ok((body, reply)) = job else { return };
                let _ = reply.send(answer(&segment, &body, nprobe).expect("a search"));
            }
        });
    }
    sender
}

async fn serve(app: Router, listen: std::net::SocketAddr, reuse_port: bool) -> Result<()> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(reuse_port)?;
    socket.bind(listen)?;
    let listener = socket.listen(1024)?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

fn main() -> Result<()> {
    let options = Options::parse();
    let segment = Arc::new(Segment::open(MmapSource::open(&options.segment)?)?);
    let describe = Bytes::from(std::fs::read(&options.describe).context("--describe")?);
    let (nprobe, mode, listen) = (options.nprobe, options.mode, options.listen);
    let cores = std::thread::available_parallelism()?.get();
    let pool = (mode == Mode::MtPool).then(|| pool(&segment, nprobe, cores));
    let search = move |body: Bytes| {
        let (segment, pool) = (segment.clone(), pool.clone());
        async move {
            let out = match pool {
                Some(pool) => {
                    let (reply, answered) = oneshot::channel();
                    pool.send((body, reply)).expect("pool running");
                    answered.await.expect("pool answers")
                }
                None => answer(&segment, &body, nprobe).expect("a search"),
            };
            ([(header::CONTENT_TYPE, "application/json")], out)
        }
    };
    let app = Router::new()
        .route(
            "/v1/collections/{name}",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], describe) }),
        )
        .route("/v1/collections/{name}/search", post(search));
    if mode == Mode::Tpc {
        let threads: Vec<_> = (0..cores)
            .map(|_| {
                let app = app.clone();
                std::thread::spawn(move || -> Result<()> {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?
                        .block_on(serve(app, listen, true))
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("runtime thread")?;
        }
        Ok(())
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(serve(app, listen, false))
    }
}
