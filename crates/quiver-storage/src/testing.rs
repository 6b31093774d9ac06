//! Test support: [`FaultProxy`], an HTTP/1.1 proxy to put between a Quiver process
//! and an S3-compatible server that breaks a chosen fraction of requests the way
//! networks and servers do — 5xx answers, stalls, connection resets, slow bodies,
//! truncated bodies, flipped bytes.
//!
//! Point the S3 endpoint at [`FaultProxy::endpoint`]. Every request is read whole
//! from the client and forwarded on a fresh upstream connection; the answer is
//! read whole and sent back, damaged or not. Faults are chosen by a seeded
//! generator ([`quiver_common::hash::splitmix64`] draws), so a failing run can be
//! repeated. HTTP/1.1 on both sides is hyper's.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{
    CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, EXPECT, HeaderValue, TRANSFER_ENCODING,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use quiver_common::hash::splitmix64;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One way of breaking a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Answer `503 SlowDown` without forwarding.
    ServerError,
    /// Read the request, never answer (until [`FaultConfig::stall`] has passed,
    /// then close the connection).
    Stall,
    /// Read the request and reset the connection without answering.
    Reset,
    /// Forward, then send the answer's body in small pieces with pauses.
    SlowBody,
    /// Forward, then send the answer's headers (with the real length) and only
    /// half of its body, and close the connection.
    TruncateBody,
    /// Forward, then flip one byte in the middle of the answer's body (the length
    /// stays right: only a checksum can tell).
    CorruptBody,
    /// Forward (the server does the work), then reset the connection instead of
    /// answering: a timeout or a broken connection after the server acted, as
    /// when a long `CompleteMultipartUpload` outlives the client's timeout.
    LostAnswer,
}

impl Fault {
    /// Returns the fault's name (for counters and messages).
    pub fn name(self) -> &'static str {
        match self {
            Fault::ServerError => "server_error",
            Fault::Stall => "stall",
            Fault::Reset => "reset",
            Fault::SlowBody => "slow_body",
            Fault::TruncateBody => "truncate_body",
            Fault::CorruptBody => "corrupt_body",
            Fault::LostAnswer => "lost_answer",
        }
    }

    fn needs_body(self) -> bool {
        matches!(
            self,
            Fault::SlowBody | Fault::TruncateBody | Fault::CorruptBody
        )
    }
}

/// What a [`FaultProxy`] breaks.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Share of eligible requests that get a fault, 0.0..=1.0.
    pub fraction: f64,
    /// Faults to choose from (uniformly).
    pub faults: Vec<Fault>,
    /// Only requests with these methods are eligible (`GET`, `PUT`, …); empty: all.
    pub methods: Vec<String>,
    /// Only requests whose query string contains this are eligible (e.g.
    /// `uploadId=`: the parts, completion and abort of multipart uploads).
    pub query_contains: Option<String>,
    /// How long a stalled request hangs before the proxy closes it.
    pub stall: Duration,
    /// Pause between the pieces of a slow body.
    pub slow_body_pause: Duration,
    /// Seed of the fault generator.
    pub seed: u64,
    /// Added to every forwarded request before it goes upstream: an object
    /// store far away (with [`FaultProxy::dependent_round_trips`], shows how
    /// many round trips a client waits for one after another).
    pub latency: Duration,
}

impl FaultConfig {
    /// Returns a config that breaks `fraction` of all requests with `faults`.
    pub fn new(fraction: f64, faults: &[Fault]) -> Self {
        FaultConfig {
            fraction,
            faults: faults.to_vec(),
            methods: Vec::new(),
            query_contains: None,
            stall: Duration::from_secs(30),
            slow_body_pause: Duration::from_millis(20),
            seed: 0x5eed,
            latency: Duration::ZERO,
        }
    }

    /// Returns a config that breaks nothing.
    pub fn none() -> Self {
        FaultConfig::new(0.0, &[])
    }

    /// Adds `latency` to every forwarded request.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Restricts the faults to requests with `methods`.
    pub fn only_methods(mut self, methods: &[&str]) -> Self {
        self.methods = methods.iter().map(|method| method.to_string()).collect();
        self
    }

    /// Restricts the faults to requests whose query string contains `needle`.
    pub fn only_queries_containing(mut self, needle: &str) -> Self {
        self.query_contains = Some(needle.to_string());
        self
    }
}

/// Counters of a [`FaultProxy`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests read from clients.
    pub requests: u64,
    /// Requests answered without a fault.
    pub forwarded: u64,
    /// Faults injected, by [`Fault::name`].
    pub injected: Vec<(&'static str, u64)>,
}

impl FaultStats {
    /// Returns how many faults were injected in all.
    pub fn total_injected(&self) -> u64 {
        self.injected.iter().map(|(_, count)| count).sum()
    }
}

/// One request the proxy forwarded: when it arrived and when its answer was
/// ready to go back.
#[derive(Clone, Debug)]
pub struct RequestSpan {
    /// `GET`, `HEAD`, `PUT`…
    pub method: String,
    /// Path and query (bucket and key).
    pub path: String,
    /// The `Range` header of a ranged GET.
    pub range: Option<String>,
    /// When the request was read from the client.
    pub start: Instant,
    /// When its answer was ready.
    pub end: Instant,
}

/// How many request spans a proxy keeps.
const MAX_SPANS: usize = 100_000;

struct ProxyShared {
    upstream: SocketAddr,
    /// The last [`MAX_SPANS`] requests (a long test does not grow it forever).
    spans: Mutex<std::collections::VecDeque<RequestSpan>>,
    config: Mutex<FaultConfig>,
    draws: AtomicU64,
    requests: AtomicU64,
    forwarded: AtomicU64,
    injected: Mutex<Vec<(&'static str, u64)>>,
}

impl ProxyShared {
    /// Decides the fault of one request: the `n`-th draw of a seeded generator.
    fn choose(&self, method: &str, query: &str) -> Option<Fault> {
        let config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        if config.faults.is_empty() || config.fraction <= 0.0 {
            return None;
        }
        if !config.methods.is_empty()
            && !config
                .methods
                .iter()
                .any(|wanted| wanted.eq_ignore_ascii_case(method))
        {
            return None;
        }
        if let Some(needle) = &config.query_contains
            && !query.contains(needle.as_str())
        {
            return None;
        }
        let draw = splitmix64(config.seed ^ self.draws.fetch_add(1, Ordering::Relaxed));
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64;
        if unit >= config.fraction {
            return None;
        }
        let pick = splitmix64(draw) as usize % config.faults.len();
        Some(config.faults[pick])
    }

    fn count(&self, fault: Fault) {
        let mut injected = self.injected.lock().unwrap_or_else(|p| p.into_inner());
        match injected.iter_mut().find(|(name, _)| *name == fault.name()) {
            Some((_, count)) => *count += 1,
            None => injected.push((fault.name(), 1)),
        }
    }
}

/// A fault-injecting HTTP/1.1 proxy on a loopback port. Stops when dropped.
pub struct FaultProxy {
    address: SocketAddr,
    shared: Arc<ProxyShared>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (an `http://host:port` endpoint).
    pub async fn start(upstream: &str, config: FaultConfig) -> std::io::Result<FaultProxy> {
        let authority = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/');
        let upstream = tokio::net::lookup_host(authority)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{authority} does not resolve")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(ProxyShared {
            upstream,
            spans: Mutex::new(std::collections::VecDeque::new()),
            config: Mutex::new(config),
            draws: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            injected: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept_shared.clone();
                tokio::spawn(serve_connection(client, shared));
            }
        });
        Ok(FaultProxy {
            address,
            shared,
            task,
        })
    }

    /// Returns the endpoint to give clients (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Replaces what the proxy breaks from now on.
    pub fn set_config(&self, config: FaultConfig) {
        *self.shared.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// Returns the requests forwarded that arrived within `window`.
    pub fn spans(&self, window: std::ops::Range<Instant>) -> Vec<RequestSpan> {
        self.shared
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|span| window.contains(&span.start))
            .cloned()
            .collect()
    }

    /// Returns the longest chain of requests that arrived within `window` each
    /// of which arrived after the one before it had been answered: the round
    /// trips a client waited for one after another. With a
    /// [`FaultConfig::latency`] well above the client's own pauses, requests sent
    /// together overlap and count once. With the chain, for the message of a
    /// failing test.
    pub fn dependent_round_trips(
        &self,
        window: std::ops::Range<Instant>,
    ) -> (usize, Vec<RequestSpan>) {
        let mut spans = self.spans(window);
        spans.sort_by_key(|span| span.start);
        // depth[i]: longest chain ending with span i; before[i]: its predecessor.
        let mut depth = vec![1usize; spans.len()];
        let mut before: Vec<Option<usize>> = vec![None; spans.len()];
        for i in 0..spans.len() {
            for j in 0..i {
                if spans[j].end <= spans[i].start && depth[j] + 1 > depth[i] {
                    depth[i] = depth[j] + 1;
                    before[i] = Some(j);
                }
            }
        }
        let Some(last) = (0..spans.len()).max_by_key(|&i| depth[i]) else {
            return (0, Vec::new());
        };
        let mut chain = vec![spans[last].clone()];
        let mut at = last;
        while let Some(previous) = before[at] {
            chain.push(spans[previous].clone());
            at = previous;
        }
        chain.reverse();
        (depth[last], chain)
    }

    /// Returns the proxy's counters.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            requests: self.shared.requests.load(Ordering::Relaxed),
            forwarded: self.shared.forwarded.load(Ordering::Relaxed),
            injected: self
                .shared
                .injected
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The body of an answer the proxy sends: whole, in slow pieces, or cut off.
type ProxyBody = UnsyncBoxBody<Bytes, io::Error>;

/// A client connection that closes with a reset (RST) instead of a FIN once
/// asked to: hyper owns the stream, so the fault handler raises the flag and the
/// stream resets itself when hyper drops (or shuts down) the connection.
struct ResettableStream {
    stream: TcpStream,
    reset: Arc<AtomicBool>,
}

impl ResettableStream {
    fn reset_requested(&self) -> bool {
        self.reset.load(Ordering::SeqCst)
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(context, buffer)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.reset_requested() {
            // No FIN first: the close that follows is the reset.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_shutdown(context)
    }
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.reset_requested() {
            // Linger 0: closing sends a RST instead of a FIN.
            let _ = self.stream.set_zero_linger();
        }
    }
}

async fn serve_connection(client: TcpStream, shared: Arc<ProxyShared>) {
    let _ = client.set_nodelay(true);
    let reset = Arc::new(AtomicBool::new(false));
    let stream = ResettableStream {
        stream: client,
        reset: reset.clone(),
    };
    let service = hyper::service::service_fn(move |request| {
        let shared = shared.clone();
        let reset = reset.clone();
        async move { answer(request, &shared, &reset).await }
    });
    if let Err(error) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%error, "fault proxy connection ended");
    }
}

/// Answers one client request: with a fault, or with the upstream's answer
/// (damaged or not). An error closes the client connection without an answer.
async fn answer(
    request: Request<Incoming>,
    shared: &ProxyShared,
    reset: &AtomicBool,
) -> io::Result<Response<ProxyBody>> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let fault = shared.choose(parts.method.as_str(), parts.uri.query().unwrap_or(""));
    match fault {
        Some(Fault::ServerError) => {
            shared.count(Fault::ServerError);
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>\
                        <Message>injected by the fault proxy</Message></Error>";
            let mut response = Response::new(whole(Bytes::from_static(body.as_bytes())));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/xml"));
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
            return Ok(response);
        }
        Some(Fault::Stall) => {
            shared.count(Fault::Stall);
            let stall = shared
                .config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .stall;
            tokio::time::sleep(stall).await;
            return Err(io::Error::other(
                "stalled request closed by the fault proxy",
            ));
        }
        Some(Fault::Reset) => {
            shared.count(Fault::Reset);
            reset.store(true, Ordering::SeqCst);
            return Err(io::Error::other("connection reset by the fault proxy"));
        }
        _ => {}
    }
    let method = parts.method.clone();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |path| path.to_string());
    let range = parts
        .headers
        .get(hyper::header::RANGE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let latency = shared
        .config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let upstream = forward(shared.upstream, Request::from_parts(parts, body)).await?;
    let (mut head, upstream_body) = upstream.into_parts();
    let mut body = upstream_body
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    let mut spans = shared.spans.lock().unwrap_or_else(|p| p.into_inner());
    if spans.len() >= MAX_SPANS {
        spans.pop_front();
    }
    spans.push_back(RequestSpan {
        method: method.to_string(),
        path,
        range,
        start: started,
        end: Instant::now(),
    });
    drop(spans);
    if fault == Some(Fault::LostAnswer) {
        shared.count(Fault::LostAnswer);
        reset.store(true, Ordering::SeqCst);
        return Err(io::Error::other(
            "answer dropped and connection reset by the fault proxy",
        ));
    }
    let bodiless = method == Method::HEAD
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    // A body fault needs a body to break; without one the request goes through.
    let fault = fault.filter(|fault| !fault.needs_body() || (!bodiless && body.len() >= 2));
    // The body goes back with plain Content-Length framing (a bodiless answer
    // keeps the upstream's length, e.g. of the object a HEAD describes).
    head.headers.remove(TRANSFER_ENCODING);
    if !bodiless {
        head.headers
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let body = match fault {
        Some(Fault::TruncateBody) => {
            shared.count(Fault::TruncateBody);
            reset.store(true, Ordering::SeqCst);
            truncated(body)
        }
        Some(Fault::SlowBody) => {
            shared.count(Fault::SlowBody);
            let pause = shared
                .config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .slow_body_pause;
            slow(body, pause)
        }
        Some(Fault::CorruptBody) => {
            shared.count(Fault::CorruptBody);
            let mut damaged = body.to_vec();
            let middle = damaged.len() / 2;
            damaged[middle] ^= 0x5a;
            whole(Bytes::from(damaged))
        }
        _ => {
            shared.forwarded.fetch_add(1, Ordering::Relaxed);
            whole(std::mem::take(&mut body))
        }
    };
    Ok(Response::from_parts(head, body))
}

/// Sends `request` (its body whole) to `upstream` on a fresh connection.
async fn forward(upstream: SocketAddr, request: Request<Bytes>) -> io::Result<Response<Incoming>> {
    let stream = TcpStream::connect(upstream).await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "fault proxy upstream connection ended");
        }
    });
    let (mut parts, body) = request.into_parts();
    // The body is here whole: send it with its length, and wait for no
    // `100 Continue` (the client got its own from this proxy's server side).
    parts.headers.remove(TRANSFER_ENCODING);
    parts.headers.remove(EXPECT);
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    sender
        .send_request(Request::from_parts(parts, Full::new(body)))
        .await
        .map_err(io::Error::other)
}

fn whole(body: Bytes) -> ProxyBody {
    Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Returns `body` in eight pieces, `pause` apart.
fn slow(body: Bytes, pause: Duration) -> ProxyBody {
    let piece = body.len().div_ceil(8).max(1);
    let pieces: Vec<Bytes> = (0..body.len())
        .step_by(piece)
        .map(|start| body.slice(start..(start + piece).min(body.len())))
        .collect();
    let frames = futures_util::stream::iter(pieces.into_iter().enumerate()).then(
        move |(index, piece)| async move {
            if index > 0 {
                tokio::time::sleep(pause).await;
            }
            Ok(Frame::data(piece))
        },
    );
    StreamBody::new(frames).boxed_unsync()
}

/// Returns the first half of `body`, then (once that half is on its way) an
/// error, which makes hyper drop the connection short of the declared length.
fn truncated(body: Bytes) -> ProxyBody {
    let half = body.slice(..body.len() / 2);
    let frames = futures_util::stream::iter([true, false]).then(move |first| {
        let half = half.clone();
        async move {
            if first {
                return Ok(Frame::data(half));
            }
            // Pending for a moment lets hyper flush the half before the error.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Err(io::Error::other("body truncated by the fault proxy"))
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny upstream that answers every request with a fixed body (HEAD: its
    /// length only).
    async fn upstream(body: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service =
                    hyper::service::service_fn(move |request: Request<Incoming>| async move {
                        let _ = request.into_body().collect().await;
                        Ok::<_, io::Error>(Response::new(Full::new(Bytes::from_static(body))))
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        address
    }

    /// Sends `method /bucket/key` to `endpoint`; returns the status, the body
    /// and the declared length.
    async fn fetch_with(
        endpoint: &str,
        method: Method,
    ) -> Result<(StatusCode, Bytes, Option<String>), Box<dyn std::error::Error + Send + Sync>> {
        let address = endpoint.strip_prefix("http://").unwrap();
        let stream = TcpStream::connect(address).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri("/bucket/key")
            .header("host", "x")
            .body(Full::new(Bytes::new()))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let length = response
            .headers()
            .get(CONTENT_LENGTH)
            .map(|value| value.to_str().unwrap_or_default().to_string());
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body, length))
    }

    async fn fetch(
        endpoint: &str,
    ) -> Result<(StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>> {
        let (status, body, _) = fetch_with(endpoint, Method::GET).await?;
        Ok((status, body))
    }

    #[tokio::test]
    async fn every_fault_breaks_the_answer_its_own_way() {
        let body = b"0123456789abcdef";
        let upstream = upstream(body).await;
        let proxy = FaultProxy::start(&format!("http://{upstream}"), FaultConfig::none())
            .await
            .unwrap();
        let (status, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got.as_ref(), body);

        proxy.set_config(FaultConfig::new(1.0, &[Fault::ServerError]));
        let (status, _) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

        proxy.set_config(FaultConfig::new(1.0, &[Fault::TruncateBody]));
        assert!(fetch(&proxy.endpoint()).await.is_err(), "a truncated body");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::Reset]));
        assert!(fetch(&proxy.endpoint()).await.is_err(), "a reset");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::CorruptBody]));
        let (_, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(got.len(), body.len());
        assert_ne!(got.as_ref(), body, "one byte flipped");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::SlowBody]));
        let (_, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(got.as_ref(), body, "slow, but whole");

        let mut stall = FaultConfig::new(1.0, &[Fault::Stall]);
        stall.stall = Duration::from_millis(200);
        proxy.set_config(stall);
        let outcome = tokio::time::timeout(Duration::from_secs(5), fetch(&proxy.endpoint()))
            .await
            .expect("the stall ends with a close");
        assert!(outcome.is_err(), "a stalled request gets no answer");

        // Method filter: a GET is not eligible for PUT-only faults.
        proxy.set_config(FaultConfig::new(1.0, &[Fault::ServerError]).only_methods(&["PUT"]));
        let (status, _) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(status, StatusCode::OK);

        // A body fault leaves a bodiless answer alone, and a HEAD keeps the
        // length of what it describes.
        proxy.set_config(FaultConfig::new(1.0, &[Fault::TruncateBody]));
        let (status, got, length) = fetch_with(&proxy.endpoint(), Method::HEAD).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(got.is_empty());
        assert_eq!(length.as_deref(), Some("16"));

        let stats = proxy.stats();
        assert_eq!(stats.requests, 9);
        assert_eq!(stats.total_injected(), 6);
        assert_eq!(stats.forwarded, 3);
    }

    #[test]
    fn the_fraction_is_respected_roughly_and_reproducibly() {
        let shared = |seed| ProxyShared {
            upstream: "127.0.0.1:1".parse().unwrap(),
            spans: Mutex::new(std::collections::VecDeque::new()),
            config: Mutex::new(FaultConfig {
                seed,
                ..FaultConfig::new(0.25, &[Fault::Reset, Fault::Stall])
            }),
            draws: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            injected: Mutex::new(Vec::new()),
        };
        let first = shared(7);
        let draws: Vec<Option<Fault>> = (0..4000).map(|_| first.choose("GET", "")).collect();
        let faulted = draws.iter().filter(|fault| fault.is_some()).count();
        assert!((800..1200).contains(&faulted), "{faulted} of 4000");
        let again = shared(7);
        let repeated: Vec<Option<Fault>> = (0..4000).map(|_| again.choose("GET", "")).collect();
        assert_eq!(draws, repeated);
    }
}
