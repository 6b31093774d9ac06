//! Test support: [`FaultProxy`], an HTTP/1.1 proxy to put between a Quiver process
//! and an S3-compatible server that breaks a chosen fraction of requests the way
//! networks and servers do — 5xx answers, stalls, connection resets, slow bodies,
//! truncated bodies, flipped bytes.
//!
//! Point the S3 endpoint at [`FaultProxy::endpoint`]. Every request is read whole
//! from the client and forwarded on a fresh upstream connection; the answer is
//! read whole and sent back, damaged or not. Faults are chosen by a seeded
//! generator, so a failing run can be repeated.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
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
    /// How long a stalled request hangs before the proxy closes it.
    pub stall: Duration,
    /// Pause between the pieces of a slow body.
    pub slow_body_pause: Duration,
    /// Seed of the fault generator.
    pub seed: u64,
}

impl FaultConfig {
    /// Returns a config that breaks `fraction` of all requests with `faults`.
    pub fn new(fraction: f64, faults: &[Fault]) -> Self {
        FaultConfig {
            fraction,
            faults: faults.to_vec(),
            methods: Vec::new(),
            stall: Duration::from_secs(30),
            slow_body_pause: Duration::from_millis(20),
            seed: 0x5eed,
        }
    }

    /// Returns a config that breaks nothing.
    pub fn none() -> Self {
        FaultConfig::new(0.0, &[])
    }

    /// Restricts the faults to requests with `methods`.
    pub fn only_methods(mut self, methods: &[&str]) -> Self {
        self.methods = methods.iter().map(|method| method.to_string()).collect();
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

struct ProxyShared {
    upstream: SocketAddr,
    config: Mutex<FaultConfig>,
    draws: AtomicU64,
    requests: AtomicU64,
    forwarded: AtomicU64,
    injected: Mutex<Vec<(&'static str, u64)>>,
}

impl ProxyShared {
    /// Decides the fault of one request: the `n`-th draw of a seeded generator.
    fn choose(&self, method: &str) -> Option<Fault> {
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

fn splitmix64(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut mixed = state;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^ (mixed >> 31)
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
                tokio::spawn(async move {
                    if let Err(error) = serve_connection(client, &shared).await {
                        tracing::debug!(%error, "fault proxy connection ended");
                    }
                });
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

/// An HTTP message head: the start line and the header lines.
struct Head {
    start_line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    fn content_length(&self) -> std::io::Result<Option<usize>> {
        self.header("content-length")
            .map(|value| {
                value
                    .trim()
                    .parse()
                    .map_err(|_| std::io::Error::other(format!("bad content-length {value:?}")))
            })
            .transpose()
    }

    fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|value| value.to_ascii_lowercase().contains("chunked"))
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
            || self.start_line.starts_with("HTTP/1.0")
    }

    /// Returns the head as bytes, with a plain `Content-Length` framing.
    fn encode_with_length(&self, length: usize) -> Vec<u8> {
        let mut text = format!("{}\r\n", self.start_line);
        for (name, value) in &self.headers {
            if name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
            {
                continue;
            }
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!("Content-Length: {length}\r\n\r\n"));
        text.into_bytes()
    }
}

/// Reads a message head; `None` at a clean end of stream before any byte.
async fn read_head<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> std::io::Result<Option<Head>> {
    use tokio::io::AsyncBufReadExt;
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let read = reader.read_line(&mut line).await?;
        if read == 0 {
            if lines.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::other("connection closed inside a head"));
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            if lines.is_empty() {
                continue;
            }
            break;
        }
        lines.push(line);
    }
    let start_line = lines.remove(0);
    let headers = lines
        .into_iter()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_string(), value.trim().to_string()))
        })
        .collect();
    Ok(Some(Head {
        start_line,
        headers,
    }))
}

/// Reads a message body by its framing (length, chunked, or until the end).
async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    head: &Head,
    until_end_allowed: bool,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncBufReadExt;
    if head.is_chunked() {
        let mut body = Vec::new();
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).await?;
            let size_text = size_line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size_text:?}")))?;
            if size == 0 {
                // Trailers, then the blank line.
                loop {
                    let mut trailer = String::new();
                    let read = reader.read_line(&mut trailer).await?;
                    if read == 0 || trailer.trim().is_empty() {
                        break;
                    }
                }
                return Ok(body);
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..]).await?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf).await?;
        }
    }
    match head.content_length()? {
        Some(length) => {
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).await?;
            Ok(body)
        }
        None if until_end_allowed => {
            let mut body = Vec::new();
            reader.read_to_end(&mut body).await?;
            Ok(body)
        }
        None => Ok(Vec::new()),
    }
}

fn reset(stream: TcpStream) {
    // Linger 0: closing sends a RST instead of a FIN.
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve_connection(client: TcpStream, shared: &ProxyShared) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut client = BufReader::new(client);
    loop {
        let Some(request_head) = read_head(&mut client).await? else {
            return Ok(());
        };
        let request_body = read_body(&mut client, &request_head, false).await?;
        shared.requests.fetch_add(1, Ordering::Relaxed);
        let method = request_head
            .start_line
            .split(' ')
            .next()
            .unwrap_or("")
            .to_string();
        let fault = shared.choose(&method);
        match fault {
            Some(Fault::ServerError) => {
                shared.count(Fault::ServerError);
                let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>\
                            <Message>injected by the fault proxy</Message></Error>";
                let answer = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                client.get_mut().write_all(answer.as_bytes()).await?;
                client.get_mut().flush().await?;
                return Ok(());
            }
            Some(Fault::Stall) => {
                shared.count(Fault::Stall);
                let stall = shared
                    .config
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .stall;
                tokio::time::sleep(stall).await;
                return Ok(());
            }
            Some(Fault::Reset) => {
                shared.count(Fault::Reset);
                reset(client.into_inner());
                return Ok(());
            }
            _ => {}
        }
        // Forward on a fresh upstream connection.
        let mut upstream = BufReader::new(TcpStream::connect(shared.upstream).await?);
        let mut forwarded = request_head.encode_with_length(request_body.len());
        forwarded.extend_from_slice(&request_body);
        upstream.get_mut().write_all(&forwarded).await?;
        upstream.get_mut().flush().await?;
        let response_head = read_head(&mut upstream)
            .await?
            .ok_or_else(|| std::io::Error::other("upstream closed without answering"))?;
        let bodiless = method.eq_ignore_ascii_case("HEAD")
            || ["204", "304"]
                .iter()
                .any(|status| response_head.start_line.split(' ').nth(1) == Some(status));
        let mut response_body = if bodiless {
            Vec::new()
        } else {
            read_body(&mut upstream, &response_head, true).await?
        };
        // A body fault needs a body to break; without one the request goes through.
        let fault = fault.filter(|fault| !fault.needs_body() || response_body.len() >= 2);
        let declared_length = if bodiless {
            response_head.content_length()?.unwrap_or(0)
        } else {
            response_body.len()
        };
        let head_bytes = response_head.encode_with_length(declared_length);
        let writer = client.get_mut();
        match fault {
            Some(Fault::TruncateBody) => {
                shared.count(Fault::TruncateBody);
                writer.write_all(&head_bytes).await?;
                writer
                    .write_all(&response_body[..response_body.len() / 2])
                    .await?;
                writer.flush().await?;
                reset(client.into_inner());
                return Ok(());
            }
            Some(Fault::SlowBody) => {
                shared.count(Fault::SlowBody);
                let pause = shared
                    .config
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .slow_body_pause;
                writer.write_all(&head_bytes).await?;
                let piece = response_body.len().div_ceil(8).max(1);
                for part in response_body.chunks(piece) {
                    writer.write_all(part).await?;
                    writer.flush().await?;
                    tokio::time::sleep(pause).await;
                }
            }
            Some(Fault::CorruptBody) => {
                shared.count(Fault::CorruptBody);
                let middle = response_body.len() / 2;
                response_body[middle] ^= 0x5a;
                writer.write_all(&head_bytes).await?;
                writer.write_all(&response_body).await?;
            }
            _ => {
                shared.forwarded.fetch_add(1, Ordering::Relaxed);
                writer.write_all(&head_bytes).await?;
                writer.write_all(&response_body).await?;
            }
        }
        writer.flush().await?;
        if request_head.closes() || response_head.closes() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny upstream that answers every request with a fixed body.
    async fn upstream(body: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let Ok(Some(head)) = read_head(&mut stream).await else {
                        return;
                    };
                    let _ = read_body(&mut stream, &head, false).await;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let stream = stream.get_mut();
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.write_all(body).await;
                });
            }
        });
        address
    }

    async fn fetch(endpoint: &str) -> std::io::Result<(String, Vec<u8>)> {
        let address = endpoint.strip_prefix("http://").unwrap();
        let mut stream = BufReader::new(TcpStream::connect(address).await?);
        stream
            .get_mut()
            .write_all(b"GET /bucket/key HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .await?;
        let head = read_head(&mut stream)
            .await?
            .ok_or_else(|| std::io::Error::other("no answer"))?;
        let body = read_body(&mut stream, &head, false).await?;
        Ok((head.start_line, body))
    }

    #[tokio::test]
    async fn every_fault_breaks_the_answer_its_own_way() {
        let body = b"0123456789abcdef";
        let upstream = upstream(body).await;
        let proxy = FaultProxy::start(&format!("http://{upstream}"), FaultConfig::none())
            .await
            .unwrap();
        let (status, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert!(status.contains("200"), "{status}");
        assert_eq!(got, body);

        proxy.set_config(FaultConfig::new(1.0, &[Fault::ServerError]));
        let (status, _) = fetch(&proxy.endpoint()).await.unwrap();
        assert!(status.contains("503"), "{status}");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::TruncateBody]));
        assert!(fetch(&proxy.endpoint()).await.is_err(), "a truncated body");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::Reset]));
        assert!(fetch(&proxy.endpoint()).await.is_err(), "a reset");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::CorruptBody]));
        let (_, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(got.len(), body.len());
        assert_ne!(got, body, "one byte flipped");

        proxy.set_config(FaultConfig::new(1.0, &[Fault::SlowBody]));
        let (_, got) = fetch(&proxy.endpoint()).await.unwrap();
        assert_eq!(got, body, "slow, but whole");

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
        assert!(status.contains("200"), "{status}");

        let stats = proxy.stats();
        assert_eq!(stats.requests, 8);
        assert_eq!(stats.total_injected(), 6);
        assert_eq!(stats.forwarded, 2);
    }

    #[test]
    fn the_fraction_is_respected_roughly_and_reproducibly() {
        let shared = |seed| ProxyShared {
            upstream: "127.0.0.1:1".parse().unwrap(),
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
        let draws: Vec<Option<Fault>> = (0..4000).map(|_| first.choose("GET")).collect();
        let faulted = draws.iter().filter(|fault| fault.is_some()).count();
        assert!((800..1200).contains(&faulted), "{faulted} of 4000");
        let again = shared(7);
        let repeated: Vec<Option<Fault>> = (0..4000).map(|_| again.choose("GET")).collect();
        assert_eq!(draws, repeated);
    }
}
