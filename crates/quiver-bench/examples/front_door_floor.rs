//! The front door's floor on this machine: what an HTTP/1 server costs per search
//! when it does no search at all. It answers `GET /v1/collections/{name}` and
//! `POST /v1/collections/{name}/search` with answers recorded from a real server
//! (files), optionally decoding each search body as the gateway does
//! (`quiver_api::SearchRequest`, `--decode`) and handing each search to a pool
//! thread and back (`--pool`, as searches go to the search pool), with the server's
//! allocator, two async workers and TCP_NODELAY. Measure it like a server:
//!
//! ```text
//! curl -s http://127.0.0.1:7900/v1/collections/served > describe.json   # from a real server
//! curl -s -d @query.json http://127.0.0.1:7900/v1/collections/served/search > answer.json
//! cargo run --release -p quiver-bench --example front_door_floor -- \
//!     --describe describe.json --answer answer.json --decode --pool &
//! quiver-bench cluster --endpoint http://127.0.0.1:7900 --collection served \
//!     --queries Q.fvecs --gt G.ivecs --include-payload --concurrency 1,16 \
//!     --server-pid $! --json floor.json
//! ```
//!
//! (recall is meaningless: every answer is the same.)

use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use clap::Parser;
use tokio::sync::oneshot;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
struct Options {
    /// The answer to `GET /v1/collections/{name}`.
    #[arg(long)]
    describe: String,
    /// The answer to every search.
    #[arg(long)]
    answer: String,
    /// Decode each search body as the gateway does.
    #[arg(long)]
    decode: bool,
    /// Hand each search to a pool thread and wait for it.
    #[arg(long)]
    pool: bool,
    #[arg(long, default_value = "127.0.0.1:7900")]
    listen: String,
}

type Job = (Bytes, oneshot::Sender<Bytes>);

/// Two threads that answer jobs, like a search pool on two cores.
fn pool() -> mpsc::Sender<Job> {
    let (sender, receiver) = mpsc::channel::<Job>();
    let receiver = Arc::new(Mutex::new(receiver));
    for _ in 0..2 {
        let receiver = receiver.clone();
        std::thread::spawn(move || {
            loop {
                let job = receiver.lock().expect("pool queue").recv();
                let Ok((answer, reply)) = job else { return };
                let _ = reply.send(answer);
            }
        });
    }
    sender
}

fn main() -> Result<()> {
    let options = Options::parse();
    let describe = Bytes::from(std::fs::read(&options.describe).context("--describe")?);
    let answer = Bytes::from(std::fs::read(&options.answer).context("--answer")?);
    let pool = options.pool.then(pool);
    let decode = options.decode;
    let search = move |body: Bytes| {
        let (answer, pool) = (answer.clone(), pool.clone());
        async move {
            if decode {
                let request: quiver_api::SearchRequest =
                    serde_json::from_slice(&body).expect("a search body");
                assert!(!request.vector.is_empty());
            }
            let body = match pool {
                Some(pool) => {
                    let (reply, answered) = oneshot::channel();
                    pool.send((answer, reply)).expect("pool running");
                    answered.await.expect("pool answers")
                }
                None => answer,
            };
            ([(header::CONTENT_TYPE, "application/json")], body)
        }
    };
    let app = Router::new()
        .route(
            "/v1/collections/{name}",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], describe) }),
        )
        .route("/v1/collections/{name}/search", post(search));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(&options.listen)
                .await?
                .tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
            axum::serve(listener, app).await?;
            Ok(())
        })
}
